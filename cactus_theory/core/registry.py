"""One source of truth for every rule and divergence: constructor parameters, display names,
colours, markers, command-line flags and sweep values.

Adding a rule touches this file (one ``RuleSpec``), the class in ``rules.py`` and its tests; the
CLI, the figures, the benchmarks and the reproduction read everything else from here.

    >>> from cactus_theory import registry
    >>> registry.label(registry.make("cactus", delta=1.0))
    'Cactus delta=1'
    >>> registry.colour("cactus")
    'tab:blue'
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from . import budget as BG
from . import divergences as D
from . import rules as R
from .sampling import SAMPLING as _SAMPLING

__all__ = ["Param", "RuleSpec", "flag", "DivergenceSpec", "RULES", "DIVERGENCES", "VERIFICATION", "spec", "make", "make_rule",
           "label", "colour", "marker", "sweep", "verification", "add_rule_arguments", "rule_from_args", "rule_classes", "SAMPLING",
           "add_sampling_arguments"]


@dataclass(frozen=True)
class Param:
    """One constructor parameter of a rule and its command-line flag.

    ``flag`` is unique across all rules (the three meanings of "k" and the two of "alpha" in this
    project get distinct flags: ``-k/--num-drafts`` drafts per step, ``--top-k`` sampling, and
    ``--topk-rule-k`` the TopK rule's threshold rank; ``--tas-alpha`` vs ``--interp-alpha``).
    """

    name: str  # keyword of the rule's constructor (its default is the constructor's own)
    flag: str  # command-line flag
    type: type
    help: str
    choices: tuple | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class RuleSpec:
    """Metadata of one rule family: how to build it, name it, draw it and sweep it."""

    key: str  # the name used by ``rules.make_rule`` and ``--rule``
    cls: type
    label: str  # display name of the family
    colour: str  # matplotlib colour, the same in every figure
    marker: str
    params: tuple[Param, ...]
    sweep: tuple[str, tuple]  # (parameter, values) for trade-off figures
    verification: str = ""  # "truncation" or "collaborative" (VERIFICATION, the lossy-verification taxonomy)
    why: str = ""  # one line: why the rule is in its class
    lossless: bool = False  # True when the step's output law equals q (SpS)
    summary: str = ""
    sweep_params: Callable[[Any], dict] | None = None  # value -> constructor keywords (default {name: value})

    def make(self, **params) -> R.Rule:
        return self.cls(**params)

    def default(self, name: str) -> Any:
        """The constructor's default value of parameter ``name``."""
        return {f.name: f.default for f in fields(self.cls)}[name]

    def describe(self, rule: R.Rule) -> str:
        """Display name of one configured rule, e.g. ``Cactus delta=1`` (non-default extras only)."""
        if not isinstance(rule, self.cls):
            raise ValueError(f"rule {rule!r} is not a {self.cls.__name__}")
        parts = []
        for p in self.params:
            v = getattr(rule, p.name)
            if p.name == self.sweep[0] or v != self.default(p.name):
                parts.append(f"{p.name}={_fmt(v)}")
        return " ".join([self.label, *parts])

    def sweep_rules(self) -> list[tuple[Any, R.Rule]]:
        """``[(value, rule)]`` along the family's sweep parameter (others at their defaults)."""
        name, values = self.sweep
        if not name:
            return [(None, self.make())]
        kw = self.sweep_params or (lambda v: {name: v})
        return [(v, self.make(**kw(v))) for v in values]

    @property
    def reads_head(self) -> bool:
        """The rule needs the verifier's final hidden state and LM head, not only ``q`` (DropMatch)."""
        return bool(self.cls.reads_head)

    @property
    def stateful(self) -> bool:
        """The rule keeps a state per sequence (SequenceBudget): no one-step law, so the one-step analyses
        (exact laws, trade-off figures, law tests) leave it out and only the decode loops run it."""
        return bool(self.cls.stateful)

    @property
    def sweep_label(self) -> str:
        """``Cactus (delta)``: the family and its swept parameter."""
        return f"{self.label} ({self.sweep[0]})" if self.sweep[0] else self.label


def flag(value) -> bool:
    """A yes / no rule option (``Eta``'s ``soft``): ``1`` / ``0``, ``true`` / ``false`` (any case) or a bool, read as
    the bool the rule keeps; the type of its ``Param`` (the command line, the vLLM spec string ``soft=True``).
    Anything else raises ``ValueError``."""
    text = str(value).strip().lower()  # numpy's bools write True / False too
    if text in ("1", "true"):
        return True
    if text in ("0", "false"):
        return False
    raise ValueError(f"a yes / no option is 1 / 0 or true / false, got {value!r}")


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


VERIFICATION = {
    "truncation": "accepts the drafted token iff it lies in a set cut from the verifier's distribution q (top-k, "
                  "typical set, threshold); the draft's probabilities are never read",
    "collaborative": "weighs the draft's probability p_n against the verifier's q_n (a ratio test, possibly relaxed "
                     "or towards a moved target), so the draft's law shapes the decision",
}
"""The taxonomy of lossy verification ("Revisiting Lossy Verification in Speculative Decoding", 2026: its two
classes, in our one-line reading of each). Every registry entry declares its class and why;
``tests/core/test_registry.py`` checks the declaration against the rule's behaviour (a truncation rule's
acceptance does not change with ``p``)."""

_DELTA = Param("delta", "--delta", float, "Cactus budget delta (nats for KL)")
_DIVERGENCE = Param("divergence", "--divergence", str, "Cactus divergence",
                    choices=tuple(D.F_DIVERGENCES))
_SOLVER = Param("solver", "--solver", str,
                "Cactus solver: taylor (Corollary 5, KL only) or exact (Theorem 2's root)", choices=("taylor", "exact"))


def _convention(key: str, flag: str) -> Param:
    """The ``convention`` option of a rule the authors' reference code implements (``rules.CONVENTIONS``)."""
    return Param("convention", flag, str, f"{key}: ours, or authors (MANGA-UOFA/Cactus's conventions: a p_n = 0 "
                 "draft judged by the test; the recovery's degenerate cases as that code)", choices=R.CONVENTIONS)


RULES: dict[str, RuleSpec] = {s.key: s for s in (
    RuleSpec("sps", R.SpS, "SpS", "black", "s",
             (Param("rand_bits", "--sps-rand-bits", int,
                    "SpS with the test r <= q_n / p_n, r uniform on a 2^-b grid (transformers <= 5.24 on the CPU: 24; "
                    "a q_n = 0 draft is then accepted with probability 2^-b); unset: the exact SpS law"),),
             ("", ()), lossless=True, verification="collaborative",
             why="min(1, q_n / p_n): the draft's probability is half of the test (the lossless member of the class)",
             summary="standard speculative sampling: output law exactly q"),
    RuleSpec("cactus", R.Cactus, "Cactus", "tab:blue", "o", (_DELTA, _DIVERGENCE, _SOLVER,
                                                              _convention("Cactus", "--cactus-convention")),
             ("delta", (0.0, 0.0003, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0,
                        4.0)),
             verification="collaborative", why="min(1, gamma*(q_n) / p_n): SpS's ratio test towards a target moved within the budget",
             summary="maximise acceptance s.t. D_f(h || q) <= delta (Theorem 2; Corollary 5's closed form)"),
    RuleSpec("tas", R.TAS, "TAS", "tab:red", "s",
             (Param("epsilon", "--tas-epsilon", float, "TAS epsilon (vLLM's posterior_threshold)"),
              Param("alpha", "--tas-alpha", float, "TAS alpha (vLLM's posterior_alpha)"),
              Param("entropy_eps", "--tas-entropy-eps", float,
                    "TAS entropy -sum q log(q + eps): 0 exact, 1e-5 as vLLM computes it"),
              _convention("TAS", "--tas-convention")),
             ("epsilon", (0.01, 0.03, 0.09, 0.2, 0.4)),
             verification="truncation", why="q_n must clear an entropy-dependent threshold of q (the typical set); p is never read",
             summary="typical acceptance (Medusa / vLLM): accept iff q_n > min(epsilon, alpha exp(-H(q)))",
             sweep_params=lambda v: {"epsilon": v, "alpha": math.sqrt(v)}),  # vLLM ties alpha = sqrt(epsilon)
    RuleSpec("topk", R.TopK, "top-k", "tab:purple", "D",
             (Param("k", "--topk-rule-k", int, "TopK rule: accept iff q_n is among the k largest"),
              Param("recovery", "--topk-recovery", str,
                    "TopK recovery on rejection: q, or topk (the authors': (1[q >= q_(k)] - p)_+)",
                    choices=R.TOPK_RECOVERIES),
              _convention("TopK", "--topk-convention")),
             ("k", (1, 2, 3, 5, 10, 20)), verification="truncation", why="n must be in q's top-k set; p is never read",
             summary="accept iff q_n >= the k-th largest q"),
    RuleSpec("interpolation", R.Interpolation, "interpolation", "tab:green", "^",
             (Param("alpha", "--interp-alpha", float, "interpolation weight of p: h = alpha p + (1 - alpha) q"),
              _convention("interpolation", "--interp-convention")),
             ("alpha", (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95)), verification="collaborative",
             why="SpS's ratio test towards h = alpha p + (1 - alpha) q, a target that mixes in the draft's law",
             summary="target h = alpha p + (1 - alpha) q"),
    RuleSpec("ensemble", R.Ensemble, "ensemble (transformers)", "goldenrod", "<",
             (Param("weight", "--ensemble-weight", float,
                    "transformers' assistant_ensemble_weight w: accept with 1 - w + w q_n / p_n, target w q + (1 - w) p"),),
             ("weight", (1.0, 0.8, 0.6, 0.4, 0.2, 0.1, 0.05)), verification="collaborative",
             why="SpS's ratio test towards h = w q + (1 - w) p, transformers' parameterisation of interpolation",
             summary="transformers' static ensemble verification (DIVERSE): accept with 1 - w + w q_n / p_n, recover "
                     "(q - p)_+ (q if that sums to <= float32's tiny)"),
    RuleSpec("ears", R.EARS, "EARS", "tab:orange", "v",
             (Param("beta", "--ears-beta", float, "EARS beta: accept iff u < q_n / p_n + beta (1 - max q)"),),
             ("beta", (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)), verification="collaborative",
             why="q_n / p_n plus an uncertainty slack beta (1 - max q): a relaxed ratio test",
             summary="accept iff u < q_n/p_n + beta (1 - max q)"),
    # lossy rules that production servers ship
    RuleSpec("sglang", R.SGLangThreshold, "SGLang threshold", "tab:brown", "P",
             (Param("threshold_single", "--sglang-threshold-single", float,
                    "SGLang speculative_accept_threshold_single: accept iff q_n >= it"),
              Param("threshold_acc", "--sglang-threshold-acc", float,
                    "SGLang speculative_accept_threshold_acc: accept with min(1, q_n / it)")),
             ("threshold_acc", (1.0, 0.8, 0.6, 0.4, 0.2, 0.1, 0.05)), verification="truncation",
             why="target-only: min(1, q_n / t_acc), or 1 above t_single; the draft's law is never read",
             summary="SGLang target-only verification: accept w.p. min(1, q_n / t_acc) (1 if q_n >= t_single), "
                     "never if q_n = 0; recover from q without n"),
    RuleSpec("relaxed", R.RelaxedAcceptance, "relaxed (MAX / TRT-LLM)", "tab:pink", "X",
             (Param("topk", "--relaxed-topk", int, "relaxed acceptance: q_n among the relaxed_topk largest"),
              Param("delta", "--relaxed-delta", float, "relaxed acceptance: and q_n >= max q - relaxed_delta")),
             ("delta", (0.0, 0.05, 0.1, 0.2, 0.4, 0.6, 1.0)), verification="truncation",
             why="n must be one of the k ids top_k(q) returns and within delta of max q; p is never read",
             summary="accept iff n is one of top_k(q)'s k ids (ties: lower id first) and q_n >= max q - delta; "
                     "recover argmax q"),
    RuleSpec("medusa", R.MedusaTypical, "Medusa typical", "tab:gray", "*",
             (Param("epsilon", "--medusa-epsilon", float, "Medusa posterior_threshold"),
              Param("alpha", "--medusa-alpha", float, "Medusa posterior_alpha"),
              Param("entropy_eps", "--medusa-entropy-eps", float, "Medusa's eps in -sum q log(q + eps)")),
             ("epsilon", (0.01, 0.03, 0.09, 0.2, 0.4)),
             verification="truncation", why="TAS's typical-set test on q, recovering argmax q; p is never read",
             summary="Medusa (fast=True): accept iff q_n > min(epsilon, alpha exp(-H(q))); recovery and bonus argmax q",
             sweep_params=lambda v: {"epsilon": v, "alpha": math.sqrt(v)}),
    RuleSpec("fly", R.FLy, "FLy (vLLM)", "tab:olive", "h",
             (Param("entropy_threshold", "--fly-entropy-threshold", float,
                    "FLy fly_entropy_threshold on the top-k entropy of q"),
              Param("entropy_top_k", "--fly-entropy-top-k", int, "FLy fly_entropy_top_k"),
              Param("window_accept", "--fly-window-accept", float,
                    "FLy: probability that the next fly_window_size drafts are natively accepted")),
             ("entropy_threshold", (1.2, 0.8, 0.6, 0.3, 0.1, 0.0)), verification="collaborative",
             why="SpS's ratio test; a rejection is deferred where q's top-k entropy is high",
             summary="vLLM FLy: SpS, plus deferral of a rejection where the top-k entropy of q is high"),
    RuleSpec("entropy_verify", R.EntropyVerify, "entropy verify (vLLM-Ascend)", "teal", "d",
             (Param("threshold", "--ascend-threshold", float,
                    "vLLM-Ascend posterior_threshold: the uniform's scale is min(threshold, exp(-alpha H(q)))"),
              Param("alpha", "--ascend-alpha", float, "vLLM-Ascend posterior_alpha (entropy weight)"),
              Param("entropy_eps", "--ascend-entropy-eps", float, "vLLM-Ascend's eps in -sum q log(q + eps)")),
             ("alpha", (0.0, 0.2, 0.4, 0.8, 1.6, 3.2)), verification="collaborative",
             why="SpS's ratio test q_n / p_n against a uniform scaled down by an entropy factor of q",
             summary="vLLM-Ascend enable_entropy_verify: accept iff q_n / p_n >= min(threshold, exp(-alpha H(q))) u; "
                     "recover (q - p)_+"),
    # the rules "Revisiting Lossy Verification in Speculative Decoding" compares (Fast-HSD), and FSD
    RuleSpec("lenience", R.Lenience, "lenience (Fast-HSD)", "crimson", "8",
             (Param("lenience", "--lenience", float, "lenience l in (0, 1]: accept with min(1, q_n / (l p_n))"),),
             ("lenience", (1.0, 0.8, 0.6, 0.4, 0.2)), verification="collaborative",
             why="SpS's ratio test with the draft's probability scaled by the lenience",
             summary="lenience-based relaxation: accept with min(1, q_n / (l p_n)), recover (q - p)_+"),
    RuleSpec("min_p", R.MinP, "min-p (SpecCascades)", "darkviolet", "1",
             (Param("min_p", "--min-p-rule", float, "min-p rule: accept iff q_n >= min_p max q"),),
             ("min_p", (0.9, 0.7, 0.5, 0.3, 0.1)), verification="truncation",
             why="n must be in q's min-p set; p is never read",
             summary="SpecCascades' min-p truncation: accept iff q_n >= min_p max q; recover q without n"),
    RuleSpec("eta", R.Eta, "eta (Fast-HSD)", "sienna", "2",
             (Param("epsilon", "--eta-epsilon", float, "eta rule: tau = min(epsilon, delta exp(-H(q)))"),
              Param("delta", "--eta-delta", float, "eta rule: the entropy term's weight delta"),
              Param("soft", "--eta-soft", flag, "eta rule: 1 / true accepts with min(1, q_n / tau) (Fast-HSD's EAGLE "
                    "path), 0 / false iff q_n >= tau", choices=(False, True))),
             ("epsilon", (0.05, 0.1, 0.15, 0.2, 0.25)), verification="truncation",
             why="q_n must clear the eta-sampling threshold of q; p is never read",
             summary="eta truncation: accept iff q_n >= min(epsilon, delta exp(-H(q))) (soft: with min(1, q_n / tau)); "
                     "recover q without n"),
    RuleSpec("fsd", R.FSD, "FSD", "navy", "3",
             (Param("threshold", "--fsd-threshold", float, "FSD: accept every draft iff D(p, q) <= threshold"),
              Param("divergence", "--fsd-divergence", str, "FSD's divergence, as its code computes it",
                    choices=R.FSD_DIVERGENCES)),
             ("threshold", (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)), verification="collaborative",
             why="the whole draft row p against q: accepted iff their divergence is below the threshold",
             summary="Fuzzy Speculative Decoding: accept iff D(p, q) <= threshold; recover a sample of q"),
    # issue 42: relaxed-spec-dec-repro's rules (an overlay on vLLM 0.20.1) and Modular MAX's verdicts
    RuleSpec("cascade_opt", R.CascadeDefer, "SpecCascades OPT (relaxed-spec-dec-repro)", "mediumseagreen", "H",
             (Param("alpha", "--cascade-alpha", float,
                    "SpecCascades OPT: target q iff max p < max q - alpha TV(p, q), else the draft's p"),),
             ("alpha", (-0.1, 0.0, 0.05)), verification="collaborative",
             why="SpS's ratio test towards a whole row, q or the draft's p, chosen from both rows' maxima and TV",
             summary="SpecCascades [OPT] deferral: h = q if max p < max q - alpha TV(p, q), else h = p; SpS towards h"),
    RuleSpec("tok3", R.Tok3, "SpecCascades Tok3 (relaxed-spec-dec-repro)", "darkkhaki", "d",
             (Param("alpha", "--tok3-alpha", float,
                    "SpecCascades Tok3: top set {q_i >= (1 - alpha) max q}; h = p on it plus eta q"),),
             ("alpha", (0.0, 0.35, 0.8)), verification="collaborative",
             why="SpS's ratio test towards h = p on q's top set plus eta q, a target that keeps the draft's law there",
             summary="SpecCascades [Tok3]: h_i = p_i 1[q_i >= (1 - alpha) max q] + eta q_i, eta the draft's mass off "
                     "that set; SpS towards h"),
    RuleSpec("mentored", R.Mentored, "mentored (relaxed-spec-dec-repro)", "orchid", "P",
             (Param("alpha", "--mentored-alpha", float,
                    "mentored decoding: accept with min(1, q_n / ((1 - alpha) p_n)), alpha in [0, 1)"),),
             ("alpha", (0.95, 0.7, 0.3)), verification="collaborative",
             why="SpS's ratio test with the draft's probability scaled by 1 - alpha (lenience 1 - alpha)",
             summary="mentored decoding (lossy SD, beta = 1): accept with min(1, q_n / ((1 - alpha) p_n)), recover "
                     "(q - p)_+"),
    RuleSpec("scd", R.SCD, "SCD (relaxed-spec-dec-repro)", "slateblue", "X",
             (Param("beta", "--scd-beta", float, "SCD contrast beta: h propto q^(1 + beta) / p^beta on the gate"),
              Param("alpha", "--scd-alpha", float, "SCD plausibility gate: q_i >= alpha max q (0: q's support)")),
             ("beta", (0.1, 0.5, 1.0)), verification="collaborative",
             why="SpS's ratio test towards the contrastive law q^(1 + beta) / p^beta on q's plausible set",
             summary="speculative contrastive decoding: h propto 1[q_i >= alpha max q] q_i^(1 + beta) / p_i^beta; "
                     "SpS towards h"),
    RuleSpec("rfuzzy", R.RFuzzy, "r-fuzzy (relaxed-spec-dec-repro)", "indianred", "s",
             (Param("threshold", "--rfuzzy-threshold", float, "r-fuzzy: h = p iff JS(p, q) <= threshold, else q"),),
             ("threshold", (0.05, 0.2, 0.3)), verification="collaborative",
             why="SpS's ratio test towards the draft's own row where JS(p, q) is below the threshold, else q",
             summary="r-fuzzy SD: h = p if JS(p, q) <= threshold else q; SpS towards h"),
    RuleSpec("max_eps", R.MaxEps, "eps (MAX)", "palevioletred", "^",
             (Param("eps", "--max-eps", float, "MAX RejectionSampler: reject iff log p_n > log q_n + eps"),
              Param("recovery", "--max-eps-recovery", str,
                    "MAX RejectionSampler's recovery and bonus: argmax (top_k = 1, its default) or q (a sample)",
                    choices=R.MAX_EPS_RECOVERIES)),
             ("eps", (0.0, 0.1, 0.5, 1.0, 2.0)), verification="collaborative",
             why="p_n against q_n: accepted iff the draft's log-probability exceeds the verifier's by at most eps",
             summary="MAX RejectionSampler: accept iff log p_n <= log q_n + eps; recover and bonus argmax q (or q)"),
    RuleSpec("max_sampled", R.MaxSampled, "SpS (MAX sampled verdict)", "lightslategray", "o", (), ("", ()),
             lossless=True, verification="collaborative",
             why="min(1, q_n / p_n), with a drafted token outside p's support read as the one-hot draft e_n",
             summary="MAX _sampled_draft_verdict: SpS; p_n = 0 read as p = e_n (accept with q_n, recover q without n)"),
    RuleSpec("sample_match", R.SampleMatch, "sample-and-match (MAX / llama.cpp)", "darkgoldenrod", "v", (), ("", ()),
             lossless=True, verification="truncation",
             why="accepted iff the verifier's own sample equals n (probability q_n); p is never read",
             summary="draw y ~ q, accept iff y = n, else emit y: lossless, acceptance sum_n p_n q_n"),
    # other systems the paper and its peers compare
    RuleSpec("dropmatch", R.DropMatch, "DropMatch", "tab:cyan", "p",
             (Param("rate", "--dropmatch-rate", float, "DropMatch dropout probability on the LM head's input"),
              Param("num_paths", "--dropmatch-paths", int, "DropMatch: dropout decoding paths per position"),
              Param("base", "--dropmatch-base", str,
                    "DropMatch base test: sps (ratio test, recover (q - p)_+) or match (the verifier's own sample)",
                    choices=R.DROPMATCH_BASES)),
             ("num_paths", (0, 1, 2, 4, 8, 16)), verification="collaborative",
             why="SpS's ratio test (base 'sps'), plus a match against dropout paths of the verifier's head; with "
                 "base 'match' it reads q only",
             summary="accept if SpS accepts or n matches one of M Monte Carlo dropout paths of the verifier's LM head"),
    # rules beyond the published ones
    RuleSpec("sequence_budget", BG.SequenceBudget, "sequence budget", "darkred", "8",
             (Param("budget", "--budget", float, "sequence budget: KL(answer's law || verifier's) <= budget nats"),
              Param("base", "--budget-base", str, "sequence budget: the per-position rule whose delta it sets",
                    choices=BG.BUDGET_BASES),
              Param("allocation", "--budget-allocation", str,
                    "sequence budget: spend_down (delta_max while it lasts), even (budget left / tokens left per "
                    "position) or lagrangian (max acceptance - lambda KL)", choices=BG.ALLOCATIONS),
              Param("delta_max", "--budget-delta-max", float, "sequence budget: the largest Cactus delta per position"),
              Param("horizon", "--budget-horizon", int,
                    "sequence budget: tokens the spreading allocations spread it over (0: --max-new-tokens)")),
             ("budget", (0.5, 1.0, 2.0, 4.0)), verification="collaborative",
             why="Cactus's ratio test at a delta chosen per position from the exact step KL, within one budget for "
                 "the whole answer",
             summary="a certificate for the whole answer: KL(sequence law || verifier's) <= budget, Cactus's delta "
                     "per position chosen before sampling from the exact step KL and the budget left"),
)}


@dataclass(frozen=True)
class DivergenceSpec:
    key: str
    label: str
    generator: str  # f(t), or the formula for non-f-divergences
    f_divergence: bool = True


DIVERGENCES: dict[str, DivergenceSpec] = {s.key: s for s in (
    DivergenceSpec("kl", "KL", "t log t"),
    DivergenceSpec("reverse_kl", "reverse KL", "-log t"),
    DivergenceSpec("chi2", "chi-square", "(t - 1)^2"),
    DivergenceSpec("tv", "TV", "|t - 1| / 2"),
    DivergenceSpec("hellinger", "squared Hellinger", "(sqrt t - 1)^2 / 2"),
    DivergenceSpec("js", "Jensen-Shannon", "JS generator"),
    DivergenceSpec("cross_entropy", "cross-entropy", "-sum h log q", f_divergence=False),
)}


def rule_classes() -> dict[str, type]:
    """``{key: rule class}``, e.g. ``{"sps": SpS, "cactus": Cactus, ...}``."""
    return {k: s.cls for k, s in RULES.items()}


def spec(rule_or_key) -> RuleSpec:
    """The ``RuleSpec`` of a rule key (``"cactus"``), a rule class or a rule instance."""
    if isinstance(rule_or_key, str):
        if rule_or_key not in RULES:
            raise ValueError(f"rule must be one of {sorted(RULES)}, got {rule_or_key!r}")
        return RULES[rule_or_key]
    cls = rule_or_key if isinstance(rule_or_key, type) else type(rule_or_key)
    for s in RULES.values():  # exact class first, then the nearest registered base class
        if cls is s.cls:
            return s
    for base in cls.__mro__[1:]:
        for s in RULES.values():
            if base is s.cls:
                return s
    raise ValueError(f"no registered rule for {rule_or_key!r}; known: {sorted(RULES)}")


def make(key: str, **params) -> R.Rule:
    """Build a rule from its key and constructor parameters (``make("cactus", delta=1.0)``)."""
    if not isinstance(key, str):
        raise ValueError(f"rule name must be a string, one of {sorted(RULES)}, got {key!r}")
    return spec(key).make(**params)


make_rule = make


def label(rule: R.Rule) -> str:
    """Display name of a configured rule, e.g. ``Cactus delta=1``, ``TAS epsilon=0.09``."""
    return spec(rule).describe(rule)


def colour(rule_or_key) -> str:
    return spec(rule_or_key).colour


def marker(rule_or_key) -> str:
    return spec(rule_or_key).marker


def sweep(key: str) -> list[tuple[Any, R.Rule]]:
    return spec(key).sweep_rules()


def verification(rule_or_key) -> str:
    """The rule's class in the lossy-verification taxonomy: ``"truncation"`` or ``"collaborative"`` (``VERIFICATION``)."""
    return spec(rule_or_key).verification


def add_rule_arguments(parser: argparse.ArgumentParser, default: str = "cactus") -> None:
    """``--rule`` (with ``choices``) and every rule parameter's flag, defaults shown in ``--help``.

    A parameter flag left out takes the constructor's default; a flag of another rule than
    ``--rule``'s (``--rule tas --delta 0.5``) is refused by ``rule_from_args`` instead of ignored.
    """
    g = parser.add_argument_group("rule")
    g.add_argument("--rule", default=default, choices=list(RULES), help=f"acceptance rule (default {default})")
    seen: set[str] = set()
    for s in RULES.values():
        for p in s.params:
            if p.flag in seen:
                continue
            seen.add(p.flag)
            d = s.default(p.name)
            g.add_argument(p.flag, dest=p.dest, type=p.type, default=argparse.SUPPRESS, choices=p.choices,
                           help=f"{p.help} (default {d})")


def rule_from_args(args: argparse.Namespace) -> R.Rule:
    """The rule named by ``args.rule`` with its parameters from the flags of ``add_rule_arguments``.

    Raises ``ValueError`` naming the flag: for a bad value (``--delta: delta must be finite and
    >= 0, got -1.0``) or for a flag that belongs to another rule.
    """
    s = spec(args.rule)
    own = {p.dest for p in s.params}
    stray = [p.flag for o in RULES.values() for p in o.params if p.dest not in own and hasattr(args, p.dest)]
    if stray:
        owners = {p.flag: o.key for o in RULES.values() for p in o.params}
        raise ValueError(f"{stray[0]} is a parameter of --rule {owners[stray[0]]}, not of --rule {s.key}")
    kw = {p.name: getattr(args, p.dest) for p in s.params if hasattr(args, p.dest)}
    try:
        return s.make(**kw)
    except ValueError as e:
        msg = str(e)
        flag = next((p.flag for p in s.params if msg.startswith(f"{p.name} ")), f"--rule {s.key}")
        raise ValueError(f"{flag}: {msg}") from None


# -- sampling: one default for the command line and the decoding functions ---------------------------

SAMPLING = _SAMPLING
"""The paper's sampling (``core.sampling.SAMPLING``: temperature 0.6, top-k 20, top-p 0.95), applied to ``p``
and ``q`` alike."""


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    """``--temperature``, ``--top-k`` (the sampling cut; not the TopK rule's ``--topk-rule-k`` nor the
    drafts per step ``-k``) and ``--top-p``, defaults ``SAMPLING``, each checked by argparse."""
    from ..util.args import nonneg_float, nonneg_int, top_p_float

    g = parser.add_argument_group("sampling (applied to the draft's p and the verifier's q alike)")
    g.add_argument("--temperature", type=nonneg_float, default=SAMPLING.temperature,
                   help=f"0 = greedy (default {SAMPLING.temperature}, the paper's)")
    g.add_argument("--top-k", type=nonneg_int, default=SAMPLING.top_k,
                   help=f"keep the k most likely tokens, 0 = off (default {SAMPLING.top_k}, the paper's)")
    g.add_argument("--top-p", type=top_p_float, default=SAMPLING.top_p,
                   help=f"nucleus mass in (0, 1], 1 = off (default {SAMPLING.top_p}, the paper's)")


def _check_registry() -> None:
    """Each entry lists every constructor parameter of its class, flags are unambiguous, and every
    divergence the code computes has an entry (checked at import, so a missing entry fails loudly)."""
    flags: dict[str, Param] = {}
    for key, s in RULES.items():
        names = {f.name for f in fields(s.cls)}
        have = {p.name for p in s.params}
        if names != have:
            raise RuntimeError(f"registry entry {key!r}: parameters {sorted(have)} != constructor {sorted(names)}")
        for p in s.params:
            if flags.setdefault(p.flag, p) != p:
                raise RuntimeError(f"flag {p.flag} means two different parameters")
        if s.verification not in VERIFICATION or not s.why:
            raise RuntimeError(f"registry entry {key!r}: verification must be one of {sorted(VERIFICATION)} with a "
                               f"one-line reason, got {s.verification!r}")
    if set(DIVERGENCES) != set(D.DIVERGENCES) or {k for k, v in DIVERGENCES.items() if v.f_divergence} != set(
            D.F_DIVERGENCES):
        raise RuntimeError("registry.DIVERGENCES and divergences.DIVERGENCES list different divergences")


_check_registry()
