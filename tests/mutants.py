"""Planted wrong ports: each must turn a test red, unless it provably leaves the law and the
reproducibility contract unchanged (then a named test proves that, and the port is listed as harmless).

    python tests/mutants.py                   # every port (make mutants)
    python tests/mutants.py --ports a,b       # some ports (make mutants PORTS=a,b)
    python tests/mutants.py --check           # only check that every anchor is found exactly once
    python tests/mutants.py --list            # the ports and their tests

A port is anchored by its file, the qualified name of the function (or class) it plants into (``at``:
``Class.method``, ``function``) and the code it replaces there (``old``: an expression or statements, or a
tuple of them for several edits), matched by syntax tree, not text (``tests/port_anchor.py``): whitespace,
line breaks, comments, parentheses, docstrings and local names may change without staling it. For each port
the repository's ``cactus_theory/``, ``tests/``, ``benchmarks/`` and ``pyproject.toml`` are copied to a
temporary directory, the one match of ``old`` in ``at`` is replaced by ``new`` (no match, or more than one, and
the run stops: a stale anchor is never reported as caught), and the port's own tests run there with pytest
(``-x``, ``PYTHONPATH`` pointing at the copy). Prints the table
``port | caught by | harmless because`` and exits 1 if a law-changing port survives, if a port said to be
harmless turns its proof red, or if an anchor is stale. Not part of ``make test``.

The production rules (``SGLangThreshold``, ``RelaxedAcceptance``, ``MedusaTypical``) are anchored to their
upstream-exact laws (Medusa's argmax recovery and bonus through ``Rule.bonus``, SGLang's ``q_n = 0`` rejection,
relaxed acceptance of exactly the ``topk`` ids of ``rules.descending_rank``); the ports of the input validation
and of ``Rule.identity`` / the eval cache (a row measured under an earlier revision of a law must not be reused)
follow them. After a rewrite of any planted code, ``--check`` names the stale ports (port, file, function,
anchor; exit 1) to move.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import port_anchor  # noqa: E402  (tests/ is not a package path when run as a script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPY = ("cactus_theory", "tests", "benchmarks", "pyproject.toml")
G = "tests/test_port_guards.py"  # the guards added for ports the rest of the suite missed
TIMEOUT_S = 300  # per pytest run (--timeout: a busy machine needs more)


@dataclass(frozen=True)
class Port:
    id: str
    what: str
    file: str
    at: str  # the function or class planted into, by qualified name ("Class.method", "function")
    old: str | tuple[str, ...]  # the code replaced there: an expression or statements, matched by syntax tree
    new: str | tuple[str, ...]  # its replacement (one per old; "" deletes statements)
    tests: tuple[str, ...]
    harmless: str = ""  # why the law and the reproducibility contract are unchanged ("" = law-changing)

    def edits(self) -> Iterator[tuple[str, str]]:
        olds = self.old if isinstance(self.old, tuple) else (self.old,)
        news = self.new if isinstance(self.new, tuple) else (self.new,)
        if len(olds) != len(news):
            raise port_anchor.StaleAnchor(f"{len(olds)} anchors but {len(news)} replacements")
        return zip(olds, news, strict=True)


R = "cactus_theory/core/rules.py"
S = "cactus_theory/core/sampler.py"
E = "cactus_theory/core/exact.py"
T = "cactus_theory/theory/toy.py"
O = "cactus_theory/theory/optimize.py"
VL = "cactus_theory/integrations/vllm.py"
TF = "cactus_theory/integrations/transformers.py"
PR = "tests/core/test_production_rules.py"
EV = "cactus_theory/lm/experiments/eval.py"
UP = "tests/core/test_upstream_rules.py"
CT = "cactus_theory/core/tree.py"
BT = "cactus_theory/theory/tree.py"
CF = "tests/conformance/"  # the conformance harness (issue 26)
HARNESS = (CF + "test_rule_laws.py::test_rule_law_against_the_reference", CF + "test_rule_laws.py::test_rule_law_at_parameter_boundaries")

PORTS: list[Port] = [
    # -- rules.py: shared machinery, SpS, Cactus -------------------------------------------------------
    Port("target-residual-q", "TargetRule recovers from (q - p)_+ instead of (h - p)_+ (the classic wrong port)", R,
         "TargetRule.residual",
         "self._recover(_pos(h - p), h)",
         "self._recover(_pos(q - p), h)",
         ("tests/core/test_rules.py::test_residual_uses_h_not_q", "tests/core/test_exact.py::test_target_rules_output_their_target")),
    Port("target-residual-fallback-p", "TargetRule's zero-mass fallback of (h - p)_+ is p instead of h", R,
         "TargetRule.residual",
         "self._recover(_pos(h - p), h)",
         "self._recover(_pos(h - p), p)",
         (CF + "test_rule_laws.py::test_rule_law_against_the_reference", "tests/core/test_exact.py::test_generic_equals_per_token_loop"),
         harmless="(h - p)_+ = 0 only if h = p (exact arithmetic), where phi_n = 1 for every draft: the fallback has weight 0"),
    Port("target-phi-pn0-one", "TargetRule.phi returns 1 (not 0) where p_n = 0", R,
         "TargetRule.phi",
         "xp.where(p_n > 0, self.h_n(p_n, q_n) / xp.where(p_n > 0, p_n, xp.ones_like(p_n)), xp.zeros_like(p_n))",
         "xp.where(p_n > 0, self.h_n(p_n, q_n) / xp.where(p_n > 0, p_n, xp.ones_like(p_n)), xp.ones_like(p_n))",
         ("tests/core/test_rules.py::test_zero_draft_mass_never_accepts",
          "tests/core/test_sampler.py::test_draft_token_with_zero_draft_probability_is_never_accepted"),
         harmless="accept_from applies the p_n = 0 convention after phi (where0(p_n > 0, .)), for every rule"),
    Port("sps-tiny-budget", "SpS is Cactus with delta = 1e-6 (nearly lossless)", R,
         "SpS.gamma",
         "return q_n",
         "return taylor_gamma(q_n, 1e-6)",
         ("tests/theory/test_toy.py::test_sps_sequence_law_is_the_verifier_law", "tests/core/test_exact.py::test_target_rules_output_their_target")),
    Port("scaling-scale-qn1-one", "ScalingRule's scale at q_n = 1 is 1 instead of 0", R,
         "ScalingRule.scale",
         "where0(room > 0, (1 - gamma) / xp.where(room > 0, room, xp.ones_like(room)))",
         "xp.where(room > 0, (1 - gamma) / xp.where(room > 0, room, xp.ones_like(room)), xp.ones_like(room))",
         (CF + "test_rule_laws.py::test_rule_law_against_the_reference", "tests/core/test_rules.py::test_qn_one_gives_h_equal_q"),
         harmless="at q_n = 1, gamma = 1 >= p_n so phi_n = 1: the recovery row, the only reader of the scale there, has weight 0"),
    Port("taylor-delta-not-doubled", "Corollary 5 with sqrt(delta q(1-q)) instead of sqrt(2 delta q(1-q))", R,
         "taylor_gamma",
         "_boost(qc, 2.0 * delta)",
         "_boost(qc, delta)",
         ("tests/core/test_rules.py::test_taylor_closed_form",)),
    Port("taylor-not-clipped-to-1", "Corollary 5 without the min{., 1}", R,
         "taylor_gamma",
         "xp.clip(qc + _boost(qc, 2.0 * delta), qc, xp.ones_like(qc))",
         "qc + _boost(qc, 2.0 * delta)",
         ("tests/core/test_rules.py::test_gamma_clipped_to_qn_one",)),
    Port("taylor-boost-no-guard", "_boost multiplies sqrt(c) by sqrt(q(1-q)) without the q(1-q) = 0 guard", R,
         "_boost",
         "where0(v > 0, sc * xp.sqrt(xp.where(v > 0, v, xp.ones_like(v))))",
         "sc * xp.sqrt(v)",
         ("tests/core/test_rules.py::test_huge_budgets_stay_finite_in_every_dtype",)),
    Port("chi2-root-doubled", "the chi2 closed-form root uses 2 delta", R,
         "_closed_form_root",
         "_boost(q_n, delta)",
         "_boost(q_n, 2 * delta)",
         ("tests/core/test_rules.py::test_closed_form_roots_equal_bisection",)),
    Port("cactus-exact-always-kl", "Cactus(solver='exact') solves the KL root whatever the divergence", R,
         "Cactus.gamma",
         "two_block_root(q_n, self.delta, self.divergence)",
         "two_block_root(q_n, self.delta)",
         ("tests/core/test_rules.py::test_rules_match_the_independent_reference",)),
    # -- other paper rules -----------------------------------------------------------------------------
    Port("interp-target-swapped", "Interpolation's target rows weigh p by 1 - alpha (h_n unchanged)", R,
         "Interpolation.target_rows",
         "self.alpha * p + (1 - self.alpha) * q",
         "(1 - self.alpha) * p + self.alpha * q",
         ("tests/core/test_rules.py::test_outputs_are_probabilities", "tests/core/test_exact.py::test_target_rules_output_their_target")),
    Port("tas-entropy-eps-dropped", "TAS ignores entropy_eps (exact Shannon entropy always)", R,
         "TAS.entropy",
         "xlogy(q, q + self.entropy_eps)",
         "xlogy(q, q)",
         ("tests/core/test_rules.py::test_tas_entropy_eps_is_vllms_formula",)),
    Port("tas-ge", "TAS accepts q_n >= threshold (not strictly above)", R,
         "TAS.phi",
         "xp.astype(q_n > thr, q_n.dtype)",
         "xp.astype(q_n >= thr, q_n.dtype)",
         ("tests/core/test_rules.py::test_tas_is_strict_and_topk_inclusive_at_exact_ties", "tests/core/test_rules.py::test_rules_match_the_independent_reference")),
    Port("tas-threshold-max", "TAS threshold max(epsilon, alpha e^-H) instead of min", R,
         "TAS.phi",
         "xp.clip(self.alpha * exp_neg_h, None, self.epsilon)",
         "xp.clip(self.alpha * exp_neg_h, self.epsilon, None)",
         ("tests/core/test_rules.py::test_rules_match_the_independent_reference",)),
    Port("topk-strict", "TopK accepts q_n > q_(k) (ties at the k-th value rejected)", R,
         "TopK.phi",
         "xp.where(q_n >= kth, xp.ones_like(q_n), xp.zeros_like(q_n))",
         "xp.where(q_n > kth, xp.ones_like(q_n), xp.zeros_like(q_n))",
         ("tests/core/test_rules.py::test_topk_and_interpolation_and_ears", "tests/core/test_rules.py::test_tas_is_strict_and_topk_inclusive_at_exact_ties")),
    Port("topk-numpy-kth-off-by-one", "TopK's numpy k-th largest reads the (k+1)-th", R,
         "TopK.row_stats",
         "np.partition(q, V - k, axis=-1)[..., V - k: V - k + 1]",
         "np.partition(q, max(V - k - 1, 0), axis=-1)[..., max(V - k - 1, 0): max(V - k, 1)]",
         ("tests/core/test_rules.py::test_topk_and_interpolation_and_ears", "tests/core/test_rules.py::test_numpy_and_torch_agree")),
    Port("topk-q-recovery-residual", "TopK(recovery='q') recovers from (q - p)_+ instead of q", R,
         "TopK.residual",
         "q + 0 * p",
         "_normalise(_pos(q - p), q + 0 * p)",
         ("tests/core/test_rules.py::test_rules_match_the_independent_reference", "tests/core/test_rules.py::test_topk_and_interpolation_and_ears")),
    Port("topk-recovery-without-p", "TopK(recovery='topk') recovers uniformly on the top set, ignoring p", R,
         "TopK.residual",
         "self._recover(_pos(top - p), top / xp.sum(top, axis=-1, keepdims=True))",
         "top / xp.sum(top, axis=-1, keepdims=True) + 0 * p",
         ("tests/core/test_rules.py::test_rules_match_the_independent_reference", "tests/theory/test_toy.py::test_step_parts_are_the_one_step_law")),
    Port("topk-recovery-fallback-q", "TopK(recovery='topk')'s zero-mass fallback is q instead of the top set", R,
         "TopK.residual",
         "top / xp.sum(top, axis=-1, keepdims=True)",
         "q + 0 * p",
         (CF + "test_rule_laws.py::test_rule_law_against_the_reference", "tests/core/test_rules.py::test_rules_match_the_independent_reference"),
         harmless="a rejected n has p_n > 0 and q_n < q_(k), so n is outside the top set and (1[q >= q_(k)] - p)_+ > 0: the fallback has weight 0"),
    Port("ears-slack-min", "EARS slack beta (1 - min q) instead of beta (1 - max q)", R,
         "EARS.row_stats",
         "xp.max(q, axis=-1, keepdims=True)",
         "xp.min(q, axis=-1, keepdims=True)",
         ("tests/core/test_rules.py::test_topk_and_interpolation_and_ears",)),
    Port("ears-residual-h", "EARS recovers from q (not (q - p)_+)", R,
         "EARS.residual",
         "_normalise(_pos(q - p), q + 0 * p)",
         "q + 0 * p",
         ("tests/core/test_rules.py::test_rules_match_the_independent_reference",)),
    # -- FLy, DropMatch ---------------------------------------------------------------------------------
    Port("fly-defer-at-q0", "FLy defers a native rejection where q_n = 0 (issue 17)", R,
         "FLy.phi",
         "gate * xp.astype(q_n > 0, q_n.dtype) * self.window_accept",
         "gate * self.window_accept",
         (CF + "test_rule_laws.py::test_rule_law_against_the_reference", "tests/core/test_production_rules.py")),
    Port("fly-recovery-q", "FLy recovers from q instead of the native (q - p)_+", R,
         "FLy.residual",
         "_normalise(_pos(q - p), q + 0 * p)",
         "q + 0 * p",
         ("tests/core/test_production_rules.py::test_fly_limits",)),
    Port("fly-entropy-renormalised", "FLy's top-k entropy on the renormalised top-k", R,
         "FLy.top_entropy",
         "top = -np.sort(-q, axis=-1)[..., :k]",
         "top = -np.sort(-q, axis=-1)[..., :k]\n"
         "top = top / top.sum(-1, keepdims=True)",
         ("tests/core/test_production_rules.py::test_fly_limits",)),
    Port("dropmatch-hit-exponent", "DropMatch's hit 1 - (1 - r)^(M - 1)", R,
         "DropMatch.hit_from_law",
         "1 - xp.clip(1 - r, 0.0, 1.0) ** self.num_paths",
         "1 - xp.clip(1 - r, 0.0, 1.0) ** max(self.num_paths - 1, 1)",
         ("tests/core/test_dropmatch.py::test_sample_hits_average_to_one_minus_miss_probability",)),
    Port("dropmatch-match-residual", "DropMatch(base='match') recovers from (q - p)_+", R,
         "DropMatch.residual",
         "_without_n(q + 0 * p, n)",
         "_normalise(_pos(q - p), q + 0 * p)",
         ("tests/core/test_dropmatch.py::test_law_equals_the_reference",)),
    # -- sampler.verify --------------------------------------------------------------------------------
    Port("verify-bonus-from-residual", "verify draws the bonus from the rule's recovery row", S,
         "verify",
         "torch.where(full, bonus, g, out=g if own else None)",
         "g",
         (CF + "test_chain_samplers.py::test_verify", "tests/theory/test_toy.py::test_loop_matches_exact_sequence_law_k2")),
    Port("verify-recovery-reuses-u0", "verify's recovery draw reuses the first acceptance uniform", S,
         "verify",
         "sample_rows(dist, u[:, last_col] if isinstance(last_col, int) else u[rows, last_col])",
         "sample_rows(dist, u[:, 0])",
         (CF + "test_chain_samplers.py::test_verify", "tests/core/test_sampler.py::test_one_step_law_matches_induced_distribution")),
    Port("verify-stats-shifted-row", "verify reads TAS/TopK/EARS row statistics one row late", S,
         "verify",
         "judge.stats_at(q_all[:, :k].to(dt), n)",
         "judge.stats_at(q_all[:, 1:].to(dt), n)",
         ("tests/core/test_sampler.py::test_one_step_law_matches_induced_distribution",)),
    Port("verify-no-buffer-reuse", "verify allocates a new row buffer instead of overwriting g", S,
         "verify",
         "torch.where(full, bonus, g, out=g if own else None)",
         "torch.where(full, bonus, g)",
         (CF + "test_chain_samplers.py::test_verify", "tests/core/test_sampler.py::test_seeded_determinism", "tests/core/test_sampler.py::test_one_step_law_matches_induced_distribution"),
         harmless="out= only chooses the buffer torch.where writes into; the values, and so every token, are the same"),
    # -- sampler.verify_flat ---------------------------------------------------------------------------
    Port("flat-padded-recovers-residual", "verify_flat recovers a padded (-1) draft from the rule's residual, not q (issue 17)", S,
         "verify_flat",
         "g = torch.where(padded[t].unsqueeze(-1), q_r, g)",
         "",
         (CF + "test_chain_samplers.py::test_verify_flat", "tests/core/test_verify_flat.py")),
    Port("flat-padded-may-accept", "verify_flat may accept a padded (-1) draft (as token 0)", S,
         "verify_flat",
         "rule.accept_from(p_n, q_n, *stats).masked_fill(padded, 0.0)",
         "rule.accept_from(p_n, q_n, *stats)",
         (CF + "test_chain_samplers.py::test_verify_flat", "tests/core/test_verify_flat.py")),
    Port("flat-generators-ignored", "verify_flat ignores the per-request generator dict (issue 17)", S,
         "verify_flat",
         "isinstance(generator, dict)",
         "False",
         (CF + "test_chain_samplers.py::test_verify_flat", CF + "test_multi_step.py", "tests/core/test_verify_flat.py")),
    Port("flat-seeded-recovery-column", "a seeded request's recovery reads column K, not its own n_b (issue 17)", S,
         "verify_flat",
         "last_col[b] = nb",
         "",
         (CF + "test_chain_samplers.py::test_verify_flat", CF + "test_multi_step.py", "tests/core/test_verify_flat.py")),
    Port("flat-seeded-draws-K", "a seeded request draws K + 1 uniforms (the batch maximum), not n_b + 1", S,
         "verify_flat",
         "u[b, :nb + 1] = torch.rand(nb + 1, generator=g, device=g.device, dtype=torch.float64).to(dev)",
         "u[b, :] = torch.rand(K + 1, generator=g, device=g.device, dtype=torch.float64).to(dev)\n"
         "nb = K",
         (CF + "test_chain_samplers.py::test_verify_flat", CF + "test_multi_step.py", "tests/core/test_verify_flat.py")),
    Port("flat-num-accepted-unclipped", "verify_flat drops the .minimum(counts) on the accepted count", S,
         "verify_flat",
         "acc.long().cumprod(-1).sum(-1).minimum(counts)",
         "acc.long().cumprod(-1).sum(-1)",
         (CF + "test_chain_samplers.py::test_verify_flat", "tests/core/test_verify_flat.py"),
         harmless="acc[b, j] stays False for j >= n_b, so the cumulative product already stops at n_b"),
    Port("flat-recovery-row-previous", "verify_flat recovers at the last accepted position instead of the first rejection", S,
         "verify_flat",
         "starts[rows] + num_accepted[rows]",
         "starts[rows] + (num_accepted[rows] - 1).clamp_min(0)",
         ("tests/core/test_verify_flat.py::test_same_tokens_as_verify",)),
    Port("flat-one-hot-draft-q", "verify_flat with draft_probs=None takes p = q (not e_n) for the recovery", S,
         "verify_flat",
         "torch.nn.functional.one_hot(n_r, V).to(dt) if draft_probs is None else draft_probs[t].to(dt)",
         "q_r if draft_probs is None else draft_probs[t].to(dt)",
         ("tests/core/test_verify_flat.py::test_one_hot_drafts_ragged_batch_law",)),
    # -- exact laws ------------------------------------------------------------------------------------
    Port("exact-fast-no-self-term", "the O(V log V) path keeps the y = n terms", E,
         "_induced_scaling_row",
         "np.maximum(add - self_term, 0.0)",
         "np.maximum(add, 0.0)",
         (CF + "test_rule_laws.py::test_rule_law_at_large_vocabularies", "tests/core/test_exact.py::test_fast_equals_generic", "tests/core/test_exact.py::test_fast_equals_generic_large_vocab"),
         harmless="a rejected n has s_n q_n <= q_n <= gamma_n < p_n, so it never receives its own recovery mass: self_term is identically 0"),
    Port("exact-generic-unweighted", "the generic path weighs recoveries by (1 - phi_n), not p_n (1 - phi_n)", E,
         "induced_generic",
         "p2 * (1 - phi)",
         "(p2 > 0) * (1 - phi)",
         ("tests/core/test_exact.py::test_generic_equals_per_token_loop",)),
    Port("exact-fast-quicksort", "the fast path sorts p/q ratios with an unstable sort", E,
         "_induced_scaling_row",
         "order = np.argsort(r, kind=\"stable\")\n"
         "cq = np.concatenate([[0.0], np.cumsum(q[order])])",
         "order = np.argsort(-r, kind=\"quicksort\")[::-1]\n"
         "cq = np.concatenate([[0.0], np.cumsum(q[order])])",
         (CF + "test_rule_laws.py::test_rule_law_at_large_vocabularies", "tests/core/test_exact.py::test_fast_equals_generic", "tests/core/test_exact.py::test_fast_equals_generic_large_vocab"),
         harmless="Z_n reads prefix sums at 'count of r_i < s_n', and tied ratios are all in or all out, so the order among ties is irrelevant"),
    Port("exact-generic-chunk", "the generic path holds a third of the rows per chunk", E,
         "induced_generic",
         "max(1, chunk_elements // V)",
         "max(1, chunk_elements // (3 * V))",
         ("tests/core/test_exact.py::test_chunking_does_not_change_the_law", "tests/core/test_exact.py::test_generic_equals_per_token_loop"),
         harmless="chunking only groups the sum over n; every row's weight and residual are the same"),
    # -- toy.py: the exact sequence law and the decoding loop --------------------------------------------
    Port("seqlaw-bonus-from-draft", "sequence_law draws the bonus from the draft", T,
         "sequence_law",
         "bonus_distribution(rule, Q(c), check=False)",
         "bonus_distribution(rule, P(c), check=False)",
         ("tests/theory/test_toy.py::test_sps_sequence_law_is_the_verifier_law",)),
    Port("steppart-unweighted", "step_parts forgets p_n in the rejection weights", T,
         "step_parts",
         "p * (1 - phi)",
         "(p > 0) * (1 - phi)",
         ("tests/theory/test_toy.py::test_step_parts_are_the_one_step_law",)),
    Port("decode-drops-last-token", "speculative_decode forgets the recovered/bonus token", T,
         "speculative_decode",
         "na.cpu().numpy() + 1",
         "np.maximum(na.cpu().numpy(), 1)",
         ("tests/theory/test_toy.py::test_loop_matches_exact_sequence_law_k2",)),
    # -- multi-draft -----------------------------------------------------------------------------------
    Port("multi-pk-linear", "multi_draft_acceptance with 1 - K p(S) instead of 1 - p(S)^K", O,
         "multi_draft_acceptance",
         "hs + 1.0 - ps ** K",
         "hs + 1.0 - np.minimum(K * ps, 1.0)",
         ("tests/theory/test_multi_draft.py::test_lp_equals_highs_brute_force_and_theorem1",)),
    Port("multi-zero-p-first", "multi_draft_acceptance sorts tokens with p = 0 first", O,
         "multi_draft_acceptance",
         "np.where(p > 0, h / np.where(p > 0, p, 1.0), np.inf)",
         "np.where(p > 0, h / np.where(p > 0, p, 1.0), -1.0)",
         ("tests/theory/test_multi_draft.py::test_closed_form_edge_cases", G + "::test_multi_draft_with_zeros_in_p_against_brute_force")),
    Port("multi-dual-cut-k-minus-1", "solve_target_multi's cuts use p(S)^(K - 1)", O,
         "solve_target_multi",
         "min(p[s].sum(), 1.0) ** K",
         "min(p[s].sum(), 1.0) ** (K - 1)",
         ("tests/theory/test_multi_draft.py::test_joint_optimum_coupling_equals_dual_and_respects_the_budget",)),
    Port("multi-coupling-hits-first-draft", "the coupling LP counts a hit only on the first draft", O,
         "_hits",
         "cells[:, :, None] == np.arange(V)[None, None, :]",
         "cells[:, :1, None] == np.arange(V)[None, None, :]",
         ("tests/theory/test_multi_draft.py::test_lp_equals_highs_brute_force_and_theorem1",)),
    # -- integrations ----------------------------------------------------------------------------------
    Port("vllm-spec-strings-kept", "rule_from_spec passes parameter strings unconverted", VL,
         "rule_from_spec",
         "kw[name] = types[name](v)",
         "kw[name] = v",
         (CF + "test_vllm_hooks.py::test_vllm_v2_hook",)),
    Port("vllm-expand-replace-swapped", "expand_batch_to_tokens replaces replace_to by replace_from", VL,
         "expand_batch_to_tokens",
         "torch.where(x == replace_from, torch.full_like(x, replace_to), x)",
         "torch.where(x == replace_to, torch.full_like(x, replace_from), x)",
         (G + "::test_vllm_expand_batch_to_tokens_against_a_loop",)),
    Port("vllm-greedy-uses-rule", "rejection_sample verifies greedy requests with the lossy rule", VL,
         "rejection_sample",
         "SpS() if is_greedy else rule",
         "rule",
         (CF + "test_vllm_hooks.py::test_vllm_v1_hook",)),
    Port("vllm-generators-not-reindexed", "rejection_sample keys the sub-batch's generators by the batch index", VL,
         "rejection_sample",
         "{i: gens[int(b)] for i, b in enumerate(reqs.tolist()) if int(b) in gens}",
         "{int(b): gens[int(b)] for i, b in enumerate(reqs.tolist()) if int(b) in gens and int(b) < len(reqs)}",
         (CF + "test_vllm_hooks.py::test_vllm_v1_hook",)),
    Port("vllm-unnormalised-target", "rejection_sample reads exp(logits) as q (no normalisation)", VL,
         "rejection_sample",
         "target_logits.softmax(dim=-1, dtype=torch.float32)",
         "(target_logits.float() - target_logits.float().amax(-1, keepdim=True)).exp()",
         (CF + "test_vllm_hooks.py::test_vllm_v1_hook",)),
    Port("hf-candidates-shifted", "transformers: the drafts are read one position early", TF,
         "speculative_sampling",
         "candidate_input_ids[:, -k:]",
         "candidate_input_ids[:, -k - 1:-1]",
         (CF + "test_chain_samplers.py::test_transformers_hook",)),
    Port("hf-draft-law-is-target", "transformers: p is read from the target's logits", TF,
         "speculative_sampling",
         "candidate_logits.detach().to(q.device).float().softmax(-1)",
         "q[:, :k]",
         (CF + "test_chain_samplers.py::test_transformers_hook",)),
    # -- production rules (upstream-exact since the 'rules' merge) -----------------------------------------
    Port("sglang-strict", "SGLang accepts q_n > threshold_single (not >=) (issue 17)", R,
         "SGLangThreshold.phi",
         "q_n >= self.threshold_single",
         "q_n > self.threshold_single",
         (CF + "test_rule_laws.py::test_rule_law_against_the_reference", "tests/core/test_production_rules.py")),
    Port("sglang-residual-keeps-n", "SGLang recovers from q (the drafted token not removed)", R,
         "SGLangThreshold.residual",
         "_without_n(q + 0 * p, n)",
         "q + 0 * p",
         ("tests/core/test_production_rules.py::test_sglang_matches_its_kernel_and_is_lossless_at_one",)),
    Port("relaxed-floor-max-times", "RelaxedAcceptance's floor max q (1 - delta) instead of max q - delta", R,
         "RelaxedAcceptance.stats_all",
         "xp.max(q, axis=-1, keepdims=True) - self.delta",
         "xp.max(q, axis=-1, keepdims=True) * (1 - self.delta)",
         ("tests/core/test_production_rules.py::test_relaxed_matches_max_verdict",)),
    Port("relaxed-no-rank-test", "RelaxedAcceptance drops the top-k rank test", R,
         "RelaxedAcceptance.phi",
         "(in_top > 0) & (q_n >= floor)",
         "q_n >= floor",
         ("tests/core/test_production_rules.py::test_relaxed_matches_max_verdict",)),
    Port("medusa-no-entropy-eps", "Medusa's entropy without its 1e-5 (issue 17)", R,
         "MedusaTypical.threshold",
         "q * xp.log(q + self.entropy_eps)",
         "q * xp.log(q)",
         (CF + "test_rule_laws.py::test_rule_law_at_large_vocabularies", "tests/core/test_production_rules.py")),
    Port("medusa-accept-ge", "Medusa accepts q_n >= tau (not strictly above)", R,
         "MedusaTypical.phi",
         "xp_of(q_n).astype(q_n > tau, q_n.dtype)",
         "xp_of(q_n).astype(q_n >= tau, q_n.dtype)",
         (CF + "test_rule_laws.py::test_rule_law_against_the_reference", "tests/core/test_production_rules.py")),
    # -- revised production laws (Medusa argmax recovery and bonus, SGLang q_n = 0, relaxed top_k ids) -----
    Port("medusa-recovery-truncated-q", "Medusa recovers from q truncated at tau (the old port) instead of argmax q", R,
         "MedusaTypical.residual",
         "return self.bonus(q + 0 * p)",
         "xp = xp_of(q)\n"
         "kept = xp.where(q >= self.threshold(q)[..., None], q, xp.zeros_like(q))\n"
         "return _normalise(kept + 0 * p, q + 0 * p)",
         (PR + "::test_medusa_matches_medusa_and_shares_tas_step", PR + "::test_medusa_argmax_ties_take_the_first_id")),
    Port("medusa-bonus-from-q", "MedusaTypical declares bonus_from_q = True (its bonus drawn from q, not argmax q)", R,
         "MedusaTypical",
         "bonus_from_q: ClassVar[bool] = False",
         "bonus_from_q: ClassVar[bool] = True",
         (PR + "::test_medusa_bonus_is_argmax_in_the_samplers", PR + "::test_medusa_chain_law_includes_the_argmax_bonus")),
    Port("verify-bonus-ignores-rule", "verify draws the bonus from q whatever rule.bonus says", S,
         "verify",
         "q_bonus if rule.bonus_from_q else rule.bonus(q_bonus)",
         "q_bonus",
         (PR + "::test_medusa_bonus_is_argmax_in_the_samplers", PR + "::test_medusa_loop_matches_exact_chain_law")),
    Port("flat-bonus-ignores-rule", "verify_flat draws the bonus from bonus_probs itself, not rule.bonus(bonus_probs)", S,
         "verify_flat",
         "rule.bonus(bonus_probs[full].to(dev, dt))",
         "bonus_probs[full].to(dev, dt)",
         (PR + "::test_medusa_bonus_is_argmax_in_the_samplers",)),
    Port("exact-bonus-ignores-rule", "exact.bonus_distribution returns q whatever rule.bonus says", E,
         "bonus_distribution",
         "q.copy() if rule.bonus_from_q else np.asarray(rule.bonus(q), dtype=np.float64)",
         "q.copy()",
         (PR + "::test_medusa_chain_law_includes_the_argmax_bonus", PR + "::test_medusa_loop_matches_exact_chain_law")),
    Port("seqlaw-bonus-ignores-rule", "sequence_law chains a bonus from q, not the rule's bonus law", T,
         "sequence_law",
         "bonus_distribution(rule, Q(c), check=False)",
         "Q(c)",
         (PR + "::test_medusa_chain_law_includes_the_argmax_bonus", PR + "::test_medusa_loop_matches_exact_chain_law")),
    Port("sglang-accepts-zero-mass", "SGLang accepts a draft with q_n = 0 at threshold_single = 0 (before PR #35798)", R,
         "SGLangThreshold.phi",
         "where0(q_n > 0, phi)",
         "phi",
         (PR + "::test_sglang_zero_target_mass_is_never_accepted",)),
    Port("relaxed-ties-higher-id-first", "descending_rank breaks ties by higher id first (numpy and torch)", R,
         "descending_rank",
         ("torch.sort(-q, dim=-1, stable=True).indices", "np.argsort(-q, axis=-1, kind=\"stable\")"),
         ("q.shape[-1] - 1 - torch.sort(-q.flip(-1), dim=-1, stable=True).indices", "q.shape[-1] - 1 - np.argsort(-q[..., ::-1], axis=-1, kind=\"stable\")"),
         (PR + "::test_relaxed_accepts_exactly_the_topk_ids_at_ties",)),
    Port("relaxed-unstable-sort", "descending_rank sorts with an unstable sort (numpy quicksort, torch stable=False)", R,
         "descending_rank",
         ("torch.sort(-q, dim=-1, stable=True)", "np.argsort(-q, axis=-1, kind=\"stable\")"),
         ("torch.sort(-q, dim=-1, stable=False)", "np.argsort(-q, axis=-1, kind=\"quicksort\")"),
         (CF + "test_rule_laws.py::test_rule_law_at_large_vocabularies", PR + "::test_relaxed_accepts_exactly_the_topk_ids_at_ties")),
    Port("relaxed-rank-le", "RelaxedAcceptance's rank test rank_n <= topk (one id too many)", R,
         "RelaxedAcceptance.stats_all",
         "descending_rank(q) < self.topk",
         "descending_rank(q) <= self.topk",
         (PR + "::test_relaxed_accepts_exactly_the_topk_ids_at_ties", PR + "::test_relaxed_matches_max_verdict")),
    Port("descending-rank-off-by-one", "descending_rank counts from 1 (numpy and torch)", R,
         "descending_rank",
         ("torch.arange(q.shape[-1], device=q.device)", "np.arange(q.shape[-1])"),
         ("torch.arange(1, q.shape[-1] + 1, device=q.device)", "np.arange(1, q.shape[-1] + 1)"),
         (PR + "::test_relaxed_accepts_exactly_the_topk_ids_at_ties", PR + "::test_relaxed_matches_max_verdict")),
    # -- input validation: a bad value silently accepted ----------------------------------------------------
    Port("flat-generator-negative-key", "verify_flat accepts generator key -1 (silently the last request)", S,
         "_check_generators",
         "0 <= i < B",
         "-B <= i < B",
         ("tests/test_bad_input.py::test_verify_flat_generator_keys",)),
    Port("dropmatch-hit-reshaped", "DropMatch.at(hit) reshapes a hit of another shape with q's element count", R,
         "DropMatchAt._hit_like",
         "if k <= len(q.shape) and tuple(q.shape[len(q.shape) - k:]) == tuple(hit.shape):\n"
         "    hit = hit + 0 * q  # one row's hit, broadcast over leading axes (e.g. repeated samples)\n"
         "else:  # never reshaped: a hit of another shape belongs to other rows\n"
         "    raise ValueError(f\"hit must have q's shape {tuple(q.shape)}, got {tuple(hit.shape)}\")",
         "if k <= len(q.shape) and tuple(q.shape[len(q.shape) - k:]) == tuple(hit.shape):\n"
         "    hit = hit + 0 * q  # one row's hit, broadcast over leading axes (e.g. repeated samples)\n"
         "elif math.prod(hit.shape) == math.prod(q.shape):\n"
         "    hit = hit.reshape(q.shape)\n"
         "else:  # never reshaped: a hit of another shape belongs to other rows\n"
         "    raise ValueError(f\"hit must have q's shape {tuple(q.shape)}, got {tuple(hit.shape)}\")",
         ("tests/test_bad_input.py::test_dropmatch_hit_of_another_shape_is_never_reshaped",)),
    Port("hf-generate-without-assistant", "assisted_generate without an assistant silently samples plainly", TF,
         "assisted_generate",
         "assistant_model is None",
         "assistant_model is None and False",
         ("tests/test_bad_input.py::test_assisted_generate_without_assistant_is_refused",)),
    # -- the revision of a rule's law in its identity (what eval caches key on) -----------------------------
    Port("identity-ignores-revision", "Rule.identity is the repr alone (a row measured under r1 reused as r2)", R,
         "Rule.identity",
         "repr(self) if self.revision == 1 else f\"{self!r}@r{self.revision}\"",
         "repr(self)",
         ("tests/claims/test_verdicts.py::test_rows_measured_with_an_earlier_rule_definition_are_marked",)),
    Port("sglang-revision-constant", "SGLang's revision stays 1 at threshold_single = 0 (its law moved there)", R,
         "SGLangThreshold.revision",
         "2 if self.threshold_single == 0 else 1",
         "1",
         ("tests/claims/test_verdicts.py::test_rows_measured_with_an_earlier_rule_definition_are_marked",)),
    Port("eval-rule-id-is-repr", "eval keys cached batches on repr(rule) (an r1 row reused for the r2 rule)", EV,
         "Method.rule_id",
         "self.rule.identity",
         "repr(self.rule)",
         (G + "::test_eval_cache_never_reuses_a_row_of_an_earlier_revision",
          "tests/claims/test_verdicts.py::test_rows_measured_with_an_earlier_rule_definition_are_marked")),
    Port("eval-cache-check-repr", "the cache accepts a record whose rule matches repr(rule) up to its revision", EV,
         "_Cache.get",
         "got.get(\"rule\") == method.rule_id",
         "got.get(\"rule\", \"\").split(\"@r\")[0] == repr(method.rule)",
         (G + "::test_eval_cache_never_reuses_a_row_of_an_earlier_revision",),
         harmless="the folder (Method.slug) hashes the identity, so a record of another revision is never read "
                  "from the current rule's folder; a record there was written under the current identity"),
    Port("eval-slug-repr", "the cache folder is named after repr(rule), not its identity", EV,
         "Method.slug",
         "f\"{s[:48]}-{hashlib.sha256(self.rule_id.encode()).hexdigest()[:8]}\"",
         "f\"{s[:48]}-{hashlib.sha256(repr(self.rule).encode()).hexdigest()[:8]}\"",
         (G + "::test_eval_cache_never_reuses_a_row_of_an_earlier_revision",),
         harmless="a record found in a shared folder is still checked against the identity (got['rule'] == "
                  "rule_id) and recomputed if it differs: only a cache miss, never a stale row"),
    # issue 19: EAGLE-2's re-ranked tree and the draft build's one-pass backward
    Port("budget-rerank-random", "a BudgetTree accepts random candidates (re-ranking them breaks losslessness)",
         "cactus_theory/core/tree_shapes.py",
         "check_tree_scheme",
         "as_tree(tree).reranks and scheme not in RERANK_SCHEMES",
         "as_tree(tree).reranks and scheme not in RERANK_SCHEMES + (\"iid\", \"without_replacement\")",
         ("tests/lm/test_tree_loop.py::test_bad_tree_arguments_raise_value_errors",
          "tests/theory/test_tree.py::test_budget_tree_sps_is_lossless_only_with_deterministic_candidates")),
    Port("rerank-ties-to-higher-node", "re-ranking breaks ties towards the higher node index (a child before its "
         "parent: the kept set may drop an ancestor)", "cactus_theory/core/tree.py",
         "rerank",
         "torch.sort(-logpath, dim=-1, stable=True)",
         "torch.sort(-logpath - 1e-9 * torch.arange(logpath.shape[-1]), dim=-1, stable=True)",
         ("tests/theory/test_tree.py::test_rerank_keeps_the_most_probable_ancestor_closed_nodes",)),
    Port("toplse-backward-drops-softmax", "the one-pass backward of the draft loss forgets logsumexp's softmax term",
         "cactus_theory/lm/train/draft_build.py",
         "_TopLSE.backward",
         "grad = torch.exp(z - lse[:, None])\n"
         "grad.mul_(g_lse[:, None])",
         "grad = torch.zeros_like(z)",
         ("tests/lm/train/test_draft_build.py::test_step_loss_and_its_gradient_equal_the_plain_autograd_formula",)),
    # issue 26: fresh wrong ports, each caught by the conformance harness (tests/conformance), none by a test
    # written for it. The first five are the issue's; the rest were planted after the harness was written.
    Port("tree-eagle-skip-strict", "verify_tree does not skip a candidate its scheme gives p_i(x) = 0 (eagle: "
         "a top-k candidate outside the draft's support removes x from r)", CT,
         "verify_tree",
         "p_i.gather(-1, x.unsqueeze(-1)).squeeze(-1) <= 0",
         "p_i.gather(-1, x.unsqueeze(-1)).squeeze(-1) < 0",
         (CF + "test_tree_sampler.py",)),
    Port("v2-temperature-first-rows", "the V2 hook reads temperature[:R] instead of temperature[idx_mapping]", VL,
         "_verify_v2",
         "temperature.to(dev, torch.float32)[state]",
         "temperature.to(dev, torch.float32)[:R]",
         (CF + "test_vllm_hooks.py::test_vllm_v2_hook",)),
    Port("flat-own-bonus-zero-draft", "verify_flat gives a zero-draft request the caller's bonus id, not the rule's "
         "own bonus (Medusa: argmax q)", S,
         "verify_flat",
         "torch.nonzero(~rejected)",
         "torch.nonzero(~rejected & (counts > 0))",
         (CF + "test_chain_samplers.py::test_verify_flat",)),
    Port("medusa-entropy-no-mask", "Medusa's entropy without its q > 0 mask (0 log 0 = NaN at entropy_eps = 0)", R,
         "MedusaTypical.threshold",
         "xp.where(q > 0, q * xp.log(q + self.entropy_eps), xp.zeros_like(q))",
         "q * xp.log(q + self.entropy_eps)",
         (CF + "test_rule_laws.py::test_rule_law_at_parameter_boundaries", CF + "test_rule_laws.py::test_rule_law_against_the_reference")),
    Port("sample-rows-float32-cdf", "sample_rows accumulates its CDF in float32", S,
         "sample_rows",
         "probs.clamp_min(0).cumsum(-1, dtype=torch.float64)",
         "probs.clamp_min(0).float().cumsum(-1).double()",
         (CF + "test_chain_samplers.py::test_emission_at_controlled_uniforms",)),
    Port("flat-generator-shared", "verify_flat draws every seeded request's uniforms from the first request's "
         "generator", S,
         "verify_flat",
         "generator.items()",
         "zip(generator, [next(iter(generator.values()))] * len(generator), strict=True)",
         (CF + "test_chain_samplers.py::test_verify_flat",)),
    Port("flat-drafted-shifted", "verify_flat writes the accepted drafts from the neighbouring flat position", S,
         "verify_flat",
         "drafted[req, pos] = n",
         "drafted[req, pos] = n.roll(1)",
         (CF + "test_chain_samplers.py::test_verify_flat",)),
    Port("verify-recovery-q-next-row", "verify recovers from the verifier's row after the rejected position", S,
         "verify",
         "p_all[rows, j].to(dt), q_all[rows, j].to(dt), n[rows, j]",
         "p_all[rows, j].to(dt), q_all[rows, j + 1].to(dt), n[rows, j]",
         (CF + "test_chain_samplers.py::test_verify",)),
    Port("tree-child-q-parent-row", "verify_tree enters an accepted child with its parent's verifier row", CT,
         "verify_tree",
         "verifier_probs[a, ca + 1]",
         "verifier_probs[a, ca]",
         (CF + "test_tree_sampler.py",)),
    Port("tree-wr-removed-kept", "verify_tree keeps the parent's removed candidates after entering a child "
         "(without replacement)", CT,
         "verify_tree",
         "removed[a] = False",
         "",
         (CF + "test_tree_sampler.py",)),
    Port("tree-eagle-drop-unnormalised", "EAGLE's recovery (drop_token, torch) is not renormalised", CT,
         "drop_token",
         "z / torch.where(s > 0, s, torch.ones_like(s))",
         "z",
         (CF + "test_tree_sampler.py",)),
    Port("tree-joint-child-plain-q", "joint mode: an entered child verifies against its q, not its set target", CT,
         "verify_tree",
         "joint and a.numel()",
         "False and a.numel()",
         (CF + "test_tree_sampler.py",)),
    Port("block-bonus-wrong-row", "verify_block draws the bonus from the last draft's row, not row k", BT,
         "verify_block",
         "verifier_probs[:, k].to(p_rows.dtype)",
         "verifier_probs[:, k - 1].to(p_rows.dtype)",
         (CF + "test_chain_samplers.py::test_block_verification",)),
    Port("v1-bonus-wrong-request", "the V1 hook hands a sub-batch the first bonus ids of the batch, not its own", VL,
         "rejection_sample",
         "verify_flat(draft_token_ids[tok], sub_cu, p,\n"
         "            q, bonus_token_ids[reqs], SpS() if is_greedy else rule, sub_gens or None,\n"
         "            max_spec_len=max_spec_len, check=False)",
         "verify_flat(draft_token_ids[tok], sub_cu, p,\n"
         "            q, bonus_token_ids[:reqs.numel()], SpS() if is_greedy else rule, sub_gens or None,\n"
         "            max_spec_len=max_spec_len, check=False)",
         (CF + "test_vllm_hooks.py::test_vllm_v1_hook",)),
    Port("v1-greedy-never", "the V1 hook never recognises a greedy request (temperature < 0)", VL,
         "rejection_sample",
         "sampling_metadata.temperature == 0",
         "sampling_metadata.temperature < 0",
         (CF + "test_vllm_hooks.py::test_vllm_v1_hook",)),
    Port("v2-drafts-one-row-early", "the V2 hook reads each draft from its own logits row, not the next one", VL,
         "_verify_v2",
         "draft_sampled.to(dev, torch.long)[draft_rows + 1]",
         "draft_sampled.to(dev, torch.long)[draft_rows]",
         (CF + "test_vllm_hooks.py::test_vllm_v2_hook",)),
    Port("v2-draft-law-no-temperature", "the V2 hook's draft law is softmax(draft_logits), without the temperature",
         VL,
         "_verify_v2",
         "d.float() / temp[req[r]].unsqueeze(-1)",
         "d.float()",
         (CF + "test_vllm_hooks.py::test_vllm_v2_hook",)),
    Port("v2-greedy-bonus-row-before", "the V2 hook's greedy bonus is the argmax of the row before the bonus row", VL,
         "_verify_v2",
         "torch.where(greedy, logits[bonus_rows].argmax(-1), sample_rows(q[bonus_rows], u))",
         "torch.where(greedy, logits[(bonus_rows - 1).clamp_min(0)].argmax(-1), sample_rows(q[bonus_rows], u))",
         (CF + "test_vllm_hooks.py::test_vllm_v2_hook",)),
    Port("hf-generator-ignored", "the transformers hook verifies with torch's global generator, not use_rule's", TF,
         "speculative_sampling",
         "verify(drafts, p, q, rule, generator=generator)",
         "verify(drafts, p, q, rule, generator=None)",
         (CF + "test_chain_samplers.py::test_transformers_hook",)),
    Port("topk-torch-kth-is-max", "TopK's torch path compares with the largest q, not the k-th", R,
         "TopK.row_stats",
         "q.topk(k, dim=-1).values[..., -1:]",
         "q.topk(k, dim=-1).values[..., :1]",
         (CF + "test_chain_samplers.py::test_verify",)),
    Port("fly-torch-topk-plus-one", "FLy's torch path sums the top-(k + 1) entropy", R,
         "FLy.top_entropy",
         "q.topk(k, dim=-1)",
         "q.topk(min(k + 1, q.shape[-1]), dim=-1)",
         (CF + "test_rule_laws.py::test_rule_law_against_the_reference", CF + "test_chain_samplers.py::test_verify")),
    Port("dropout-no-inverse-scaling", "the dropout paths' head input is not rescaled by 1 / (1 - rate)",
         "cactus_theory/core/dropout.py",
         "dropout_logits",
         "hidden.unsqueeze(0) * keep.to(hidden.dtype) / (1 - rate)",
         "hidden.unsqueeze(0) * keep.to(hidden.dtype)",
         (CF + "test_dropmatch_tap.py",)),
    # issue 26: the verdict layer's boundaries (fresh ports the suite had never seen)
    Port("interval-holds-at-threshold", "interval_verdict reads an interval whose low end equals the threshold as "
         "above it (lo >= above: an all-zero interval 'holds')", "cactus_theory/claims/ledger.py",
         "interval_verdict",
         "iv.lo > above",
         "iv.lo >= above",
         ("tests/claims/test_decision_boundaries.py::test_interval_verdict_at_its_threshold",)),
    Port("interval-min-points-inclusive", "interval_verdict needs more than min_points units (n <= min: exactly "
         "min_points is 'out of reach')", "cactus_theory/claims/ledger.py",
         "interval_verdict",
         "iv.n < min_points",
         "iv.n <= min_points",
         ("tests/claims/test_decision_boundaries.py::test_interval_verdict_at_the_minimum_of_units",)),
    # issue 27: the draft's noise and the target's on Model Runner V2 (vLLM #54282, 0.33's _DRAFT_NOISE_SALT)
    Port("vllm-v2-recovery-shares-draft-noise", "the plugin's V2 path resamples a rejected draft's recovery with V2's "
         "seeded Gumbel noise at its row's (seed, position), the noise vLLM 0.28's drafter drew the draft with", VL,
         "_verify_v2",
         "sampled[reqs] = out.long()",
         "sampled[reqs] = out.long()\n"
         "if not is_greedy:\n"
         "    gumbel = importlib.import_module(\"vllm.v1.worker.gpu.sample.gumbel\")\n"
         "    sub_starts = torch.cumsum(counts[reqs], 0) - counts[reqs]\n"
         "    for i, b in enumerate(reqs.tolist()):\n"
         "        a_i = int((sampled[b] >= 0).sum()) - 1\n"
         "        if a_i < int(counts[b]):\n"
         "            j = int(sub_starts[i]) + a_i\n"
         "            n_j = ids[tok][j:j + 1]\n"
         "            p_j = torch.nn.functional.one_hot(n_j, V).to(q.dtype) if p_sub is None else p_sub[j:j + 1]\n"
         "            g = rule.residual(p_j, q_sub[j:j + 1], n_j, check=False)\n"
         "            sampled[b, a_i] = gumbel.gumbel_sample(torch.log(g), state[b:b + 1], temperature, seed,\n"
         "                                                   pos[r[j:j + 1]], apply_temperature=False,\n"
         "                                                   is_drafting=False)[0]",
         ("tests/integrations/test_vllm_v2.py::test_v2_plugin_draws_are_independent_of_the_draft_noise",)),
    # issue 27: transformers' ensemble verification, transformers <= 5.24's r <= ratio, the authors' conventions
    Port("ensemble-weight-swapped", "Ensemble accepts with w + (1 - w) q_n / p_n (the weights of p and q swapped)", R,
         "Ensemble.phi",
         "(1 - self.weight) + self.weight * ratio",
         "self.weight + (1 - self.weight) * ratio",
         (UP + "::test_new_rules_match_the_independent_reference",
          "tests/integrations/test_transformers.py::test_assistant_ensemble_weight_is_ensemble")),
    Port("ensemble-fallback-target", "Ensemble's numerically-zero residual falls back to its target h, not q", R,
         "Ensemble.residual",
         "q + 0 * p",
         "self.weight * q + (1 - self.weight) * p",
         (UP + "::test_ensemble_falls_back_to_q_where_the_residual_is_numerically_zero",
          "tests/integrations/test_transformers.py::test_ensemble_fallback_is_transformers_own")),
    Port("ensemble-fallback-exact-zero", "Ensemble falls back to q only where the residual is exactly 0 (not <= tiny)", R,
         "Ensemble.residual",
         "ok = z > FLOAT32_TINY",
         "ok = z > 0",
         (UP + "::test_ensemble_falls_back_to_q_where_the_residual_is_numerically_zero",
          "tests/integrations/test_transformers.py::test_ensemble_fallback_is_transformers_own")),
    Port("sps-rand-bits-strict", "SpS(rand_bits) takes r < q_n / p_n (transformers 5.25's test), not r <= (5.24's)", R,
         "SpS.phi",
         "(xp.floor(r64 * grid) + 1) / grid",
         "xp.ceil(r64 * grid) / grid",
         (UP + "::test_sps_rand_bits_exact_law", UP + "::test_new_rules_match_the_independent_reference",
          "tests/theory/test_check.py::test_sps_rand_bits_is_transformers_524_law_by_sampling")),
    Port("authors-zero-draft-never", "convention='authors' still never accepts a p_n = 0 draft (ours)", R,
         "Rule.accept_from",
         "self.accepts_zero_draft()",
         "False",
         (UP + "::test_authors_convention_judges_a_zero_draft_by_the_test",)),
    Port("authors-zero-draft-always", "convention='authors' accepts every p_n = 0 draft of a ratio test, also h_n = 0 "
         "(0 / 0 read as accepted)", R,
         "TargetRule.zero_draft_phi",
         "self.h_n(p_n, q_n) > 0",
         "self.h_n(p_n, q_n) >= 0",
         (UP + "::test_authors_convention_judges_a_zero_draft_by_the_test",)),
    Port("authors-empty-residual-target", "convention='authors' recovers an empty residual from the target, not token 0",
         R,
         "Rule._recover",
         "_token0_like(r)",
         "fallback",
         (UP + "::test_authors_empty_residual_emits_token_0",)),
    Port("authors-floor-dropped", "Interpolation(convention='authors') normalises (h - p)_+ without vLLM 0.7.3's floor",
         R,
         "Rule._recover",
         "xp.maximum(r, xp.full_like(r, FLOAT32_TINY))",
         "r",
         (UP + "::test_authors_interpolation_floors_its_recovery",)),
    Port("hf-ensemble-weight-ignored", "transformers: use_rule() verifies a step with a weight by SpS (the weight dropped)",
         TF,
         "_step_rule",
         "if weight is None:\n"
         "    return SpS() if rule is None else rule",
         "if True:\n"
         "    return SpS() if rule is None else rule",
         ("tests/integrations/test_transformers.py::test_use_rule_verifies_a_weighted_step_with_ensemble",
          "tests/integrations/test_transformers.py::test_generate_with_an_ensemble_weight_verifies_with_ensemble")),
    Port("check-transformers-always-le", "transformers_sampler's exact law takes 5.24's r <= ratio whatever the probe "
         "finds (5.25 compares with <)", "cactus_theory/theory/check.py",
         "TransformersSampler._phi",
         "np.floor(m) + 1 if self.accepts_at_equality else np.ceil(m)",
         "np.floor(m) + 1",
         ("tests/theory/test_check.py::test_transformers_524_law_is_sps_rand_bits_24",
          "tests/theory/test_check.py::test_transformers_speculative_sampling_in_one_line_and_the_exact_mode")),
    # issue 28: the sequence budget's certificate needs every judged position charged, at decision time
    Port("budget-charge-accepted-only", "verify charges a budgeted row only for its accepted drafts (the rejected "
         "position's cost is ignored)", S,
         "verify",
         "np.minimum(a + 1, k)",
         "np.minimum(a, k)",
         ("tests/core/test_budget.py::test_verify_charges_exactly_the_judged_positions",
          "tests/lm/test_budget_loop.py::test_the_chain_loop_never_spends_more_than_the_budget")),
    Port("budget-plan-charges-after-sampling", "the budget plans every position of a block from the budget left at "
         "the block start (positions 2..k paid for only after the block is sampled)", "cactus_theory/core/budget.py",
         "SequenceBudget.plan",
         "remaining = remaining - cost[:, j]",
         "",
         ("tests/core/test_budget.py::test_a_plan_never_spends_more_than_is_left_on_any_path",
          "tests/theory/test_budget.py::test_the_certificate_holds_for_every_budget_and_pair")),
    Port("budget-tree-ancestors-free", "a tree node's budget ignores its ancestors' costs", "cactus_theory/core/budget.py",
         "SequenceBudget.plan_tree",
         "rem[b, s_] - cost[b, s_]",
         "rem[b, s_]",
         ("tests/core/test_budget.py::test_verify_tree_charges_the_accepted_path",
          "tests/theory/test_budget.py::test_the_certificate_holds_on_trees")),
    # issue 27 items 4-6: the rules merged after the harness, caught by it (no test names them)
    Port("entropy-verify-scale-max", "EntropyVerify's factor max(threshold, exp(-alpha H)) instead of the min", R,
         "EntropyVerify.scale",
         "xp.clip(xp.exp(-self.alpha * h), None, self.threshold)",
         "xp.clip(xp.exp(-self.alpha * h), self.threshold, None)",
         HARNESS),
    Port("entropy-verify-bits", "EntropyVerify's entropy in bits (log2), not nats", R,
         "EntropyVerify.scale",
         "-xp.sum(xlogy(q, q + self.entropy_eps), axis=-1)",
         "-xp.sum(xlogy(q, q + self.entropy_eps), axis=-1) / math.log(2.0)",
         HARNESS),
    Port("lenience-scales-the-target", "Lenience scales the target's probability (their letters read as ours): "
         "min(1, l q_n / p_n)", R,
         "Lenience.phi",
         "_ratio_over(p_n, q_n, self.lenience)",
         "_ratio_over(p_n, q_n, 1 / self.lenience)",
         HARNESS),
    Port("min-p-strict", "MinP accepts q_n > min_p max q (strict: q's maxima rejected at min_p = 1)", R,
         "MinP.phi",
         "xp.astype(q_n >= floor, q_n.dtype)",
         "xp.astype(q_n > floor, q_n.dtype)",
         HARNESS),
    Port("eta-entropy-sign", "Eta's threshold delta exp(+H(q)) instead of exp(-H(q))", R,
         "Eta.threshold",
         "xp.sum(xlogy(q, q), axis=-1)",
         "-xp.sum(xlogy(q, q), axis=-1)",
         HARNESS),
    Port("fsd-forward-js", "FSD's js_div as Jensen-Shannon's own (KL(p || m) + KL(q || m)) / 2, not its code's reverse", R,
         "fsd_divergence",
         "xp.sum(xlogy(m, m) - xlogy(m, p), axis=-1) + xp.sum(xlogy(m, m) - xlogy(m, q), axis=-1)",
         "xp.sum(xlogy(p, p) - xlogy(p, m), axis=-1) + xp.sum(xlogy(q, q) - xlogy(q, m), axis=-1)",
         HARNESS),
    Port("fsd-residual-without-n", "FSD recovers from q without the drafted token (SpS-style), not from q itself", R,
         "FSD.residual",
         "q + 0 * p",
         "_without_n(q + 0 * p, n)",
         HARNESS),
]


def planted(port: Port, text: str) -> str:
    """``text`` (the source of ``port.file``) with the port planted; ``port_anchor.StaleAnchor`` (naming the
    port, its file and function) if an anchor is not found exactly once in its function."""
    try:
        for old, new in port.edits():
            text = port_anchor.apply(text, port.at, old, new, path=port.file)
    except port_anchor.StaleAnchor as e:
        raise port_anchor.StaleAnchor(f"port {port.id}: {e}") from None
    return text


def _apply(tmp: str, port: Port) -> None:
    path = os.path.join(tmp, port.file)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = planted(port, text)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def enclosing(port: Port) -> str:
    """The class or function (``Class.method`` / ``function``) the port plants into."""
    return port.at


def check_anchors(ports: list[Port], root: str = ROOT) -> list[str]:
    """One line per stale port (its anchor found zero or several times in its function, the function missing,
    or a replacement that no longer fits): ``port <id>: <file>, function <at>: ...``; ``[]`` if none."""
    bad = []
    for port in ports:
        with open(os.path.join(root, port.file), encoding="utf-8") as f:
            text = f.read()
        try:
            planted(port, text)
        except port_anchor.StaleAnchor as e:
            bad.append(str(e))
    return bad


_FAIL = re.compile(r"^(FAILED|ERROR) (\S+)")


def _copy(tmp: str) -> None:
    for name in COPY:
        src = os.path.join(ROOT, name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(tmp, name), ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(src, tmp)


def _pytest(tmp: str, tests) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": tmp, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rfE", *tests]
    try:
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        return proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired:
        return -1, ""


def baseline(ports: list[Port]) -> None:
    """Every selected test passes on an unmodified copy, so a red test below is the port's doing."""
    tests = sorted({t for p in ports for t in p.tests})
    if not tests:
        return
    with tempfile.TemporaryDirectory(prefix="mutant-baseline-") as tmp:
        _copy(tmp)
        rc, out = _pytest(tmp, tests)
    if rc == -1:
        raise RuntimeError(f"the selected tests did not finish within {TIMEOUT_S} s on an unmodified copy "
                           f"(a busy machine? pass --timeout)")
    if rc != 0:
        raise RuntimeError("the selected tests fail on an unmodified copy:\n" + out[-3000:])


def run_port(port: Port) -> dict:
    t0 = time.time()
    if not port.tests:
        return {"port": port, "caught": None, "seconds": 0.0}
    with tempfile.TemporaryDirectory(prefix=f"mutant-{port.id}-") as tmp:
        _copy(tmp)
        _apply(tmp, port)
        rc, out = _pytest(tmp, port.tests)
    first = next((m.group(2) for line in out.splitlines() if (m := _FAIL.match(line))), None)
    if rc == -1:
        first = f"timeout after {TIMEOUT_S} s"
    elif rc != 0 and first is None:
        first = f"pytest exit {rc}: " + (out.strip().splitlines() or ["(no output)"])[-1][:80]
    return {"port": port, "caught": first if rc != 0 else None, "seconds": time.time() - t0}


def _sanity() -> None:
    """The copy, not an installed package, is what pytest imports."""
    with tempfile.TemporaryDirectory(prefix="mutant-sanity-") as tmp:
        shutil.copytree(os.path.join(ROOT, "cactus_theory"), os.path.join(tmp, "cactus_theory"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        env = {**os.environ, "PYTHONPATH": tmp}
        out = subprocess.run([sys.executable, "-c", "import cactus_theory; print(cactus_theory.__file__)"],
                             cwd=tmp, env=env, capture_output=True, text=True, check=True).stdout.strip()
        if not out.startswith(tmp):
            raise RuntimeError(f"pytest would import {out}, not the mutated copy in {tmp}")


def main(argv=None) -> int:
    global TIMEOUT_S
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ports", default="", help="comma-separated port ids (default: all)")
    ap.add_argument("--workers", type=int, default=2, help="parallel ports (at most 2)")
    ap.add_argument("--check", action="store_true", help="only check the anchors")
    ap.add_argument("--list", action="store_true", help="list the ports")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run on an unmodified copy")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per pytest run (default %(default)s)")
    ap.add_argument("--without-guards", action="store_true",
                    help=f"leave {G} out of every selection (what the suite caught before the guards)")
    args = ap.parse_args(argv)
    TIMEOUT_S = args.timeout
    ids = [s.strip() for s in args.ports.split(",") if s.strip()]
    known = {p.id for p in PORTS}
    if len(known) != len(PORTS):
        print("duplicate port ids", file=sys.stderr)
        return 2
    unknown = [i for i in ids if i not in known]
    if unknown:
        print(f"unknown ports: {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    ports = [p for p in PORTS if not ids or p.id in ids]
    if args.without_guards:
        ports = [replace(p, tests=tuple(t for t in p.tests if not t.startswith(G))) for p in ports]
    if args.list:
        for p in ports:
            print(f"{p.id:32s} {'harmless' if p.harmless else 'law'}  {p.what}\n{'':33s}in {p.file}: {enclosing(p)}"
                  f"\n{'':33s}tests: {' '.join(p.tests)}")
        return 0
    bad = check_anchors(ports)
    if bad:
        print(f"STALE PORTS: {len(bad)} of {len(ports)} (re-anchor these in tests/mutants.py):\n  "
              + "\n  ".join(bad), file=sys.stderr)
        return 1
    if args.check:
        print(f"{len(ports)} ports anchored: every anchor found exactly once in its function")
        return 0
    _sanity()
    t0 = time.time()
    if not args.no_baseline:
        baseline(ports)
        print(f"baseline: the {len({t for p in ports for t in p.tests})} selected tests pass unmodified "
              f"({time.time() - t0:.0f} s)", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, min(2, args.workers))) as ex:
        results = list(ex.map(run_port, ports))
    w = max(len(p.id) for p in ports)
    print(f"\n{'port':{w}s} | caught by | harmless because")
    print(f"{'-' * w}-|-----------|-----------------")
    failures = []
    for r in results:
        p, caught = r["port"], r["caught"]
        if p.harmless:
            if caught:
                failures.append(f"{p.id}: said to be harmless, but its proof turned red ({caught})")
                print(f"{p.id:{w}s} | {caught} | CLAIMED HARMLESS BUT RED")
            else:
                print(f"{p.id:{w}s} | - | {p.harmless} (proof: {', '.join(p.tests)})")
        elif caught:
            print(f"{p.id:{w}s} | {caught} | -")
        else:
            failures.append(f"{p.id}: law-changing port SURVIVED {', '.join(p.tests)}")
            print(f"{p.id:{w}s} | SURVIVED{'' if p.tests else ' (no test selected)'} | -")
    law = sum(1 for r in results if not r["port"].harmless)
    print(f"\n{len(results)} ports ({law} law-changing, {len(results) - law} harmless) in {time.time() - t0:.0f} s")
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
