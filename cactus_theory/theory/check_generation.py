"""``check_generation``: do two whole-decode generators emit the same law? One call::

    import cactus_theory as ct
    res = ct.check_generation(generate_spec, generate_plain, prompts, n=2000)
    stat, pvalue = res; res.reject; print(res)        # a per-test table

A generator is ``generate(prompts, n, seed) -> list of token-id lists``: ``n`` decodes of each prompt, in
prompt order (``out[i * n + j]`` is decode ``j`` of ``prompts[i]``), each the generated tokens only (EOS
included if the engine emits it). ``generate_a`` gets seed ``2 * seed``, ``generate_b`` ``2 * seed + 1``,
so the two samples are independent even when the two callables are one engine.

**Per-position conditional tests along the observed prefix tree.** Two laws over sequences are equal iff
at every prefix of positive probability the next-token laws are equal. At position ``t`` (0: the first
generated token), every prefix ``s`` (the prompt and ``t`` generated tokens) observed at least
``min_count`` times in *both* samples is a stratum; its next token (or "end": the decode stopped after
``t`` tokens) is compared between the samples by ``stats.homogeneity`` (chi-square of the 2 x K table,
categories pooled on the combined counts to an expected count >= ``min_expected`` in the smaller row).
The position's statistic is the sum over its strata, with the summed degrees of freedom: given the prefix
counts, the strata are independent under H0, so the sum is chi-square. Choosing strata and bins from the
counts is valid: under H0 the next tokens are exchangeable between the samples given the prefix counts and
the combined next-token counts. A stratum with two categories or more that pooling leaves with one bin (a
near-deterministic prefix where one side emits a rare token) is tested exactly: Fisher's exact test of
(most frequent token, any other) x (a, b); a position's such strata form one member "position t exact" of
the family with p-value ``min(1, s min_j p_j)`` (Bonferroni over its ``s`` strata). A stratum where both
sides emitted one and the same token has nothing to compare (``strata[t]["same_token"]``).

**Nothing tested is not a verdict**: ``n < min_count`` is refused before generating; a run with no stratum
at any position has ``verdict == "untested"`` and a NaN p-value.

**Equivalence mode** (``equivalence=eps``): an upper confidence bound on the next-token TV at every stratum
(``equivalence.tv_upper_bound``: Weissman et al.'s L1 deviation inequality, or a box of Clopper-Pearson
intervals where it is sharper, on a value-blind split of each side's draws) and, with a scorer, on the difference of mean scores (Hoeffding); ``alpha`` is split by a
union bound, ``alpha / T`` per position (``T`` positions, plus the answer), equally over its strata.

**An answer-level test** when ``scorer(prompt, tokens) -> float`` is given (e.g. 1 for a correct answer):
the difference of mean scores, stratified by prompt (each prompt's ``n`` decodes per side), z-test with
the pooled per-prompt variances under H0; the detectable difference is stated.

**The family** (every testable position, the answer test) is corrected by Holm's method at ``alpha``; the
result's ``pvalue`` is the smallest adjusted p-value. Each position states its detectable TV: the TV that,
moved into *every* tested prefix's next-token law (on the pooled bins), is detected with probability
``power`` at Holm's first-step level ``alpha / m`` (``stats.detectable_tv`` with ``n = sum_s n_a n_b /
(n_a + n_b)`` and the summed dof); ``detectable_tv_one``: the same for a deviation at the most observed
prefix alone. Deep positions test only frequent prefixes: a deviation on rare prefixes is invisible.

``n`` (decodes per prompt per side), when not given, is sized so that position 0 (one stratum per prompt)
detects a TV of ``tv`` at power ``power`` and level ``alpha / positions`` with ``bins`` categories.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.validate import check_int, check_number
from .equivalence import scale_needed, score_upper_bound, tv_upper_bound
from .stats import TestResult, detectable_tv, holm, homogeneity, samples_needed

__all__ = ["check_generation", "GenerationCheckResult", "GenerationTest", "EquivalenceBound", "read_decodes", "END",
           "verdict_words"]

END = -1  # the next-token category "the decode ended after this prefix"


@dataclass(frozen=True)
class GenerationTest(TestResult):
    """One test of the family: ``name`` ("position t" or "answer"), ``position`` (None for the answer test),
    ``strata`` prefixes tested, ``n_a`` / ``n_b`` decodes in them, ``statistic``, ``dof``, ``pvalue``,
    ``holm`` (adjusted), ``alpha`` (the family's; ``reject = holm < alpha``), ``tv_observed`` (the plug-in TV
    between the two next-token laws, averaged over strata by ``n_a n_b / (n_a + n_b)``: biased upwards by
    noise) or, for the answer test, the difference of mean scores with ``low`` / ``high`` its 95% interval;
    ``detectable`` the detectable TV (or, for the answer test, the detectable score difference) and
    ``detectable_one`` the detectable TV at the most observed prefix alone. For an exact member ("position t
    exact": the position's one-bin strata), ``statistic`` is the smallest Fisher p-value, ``dof`` the number of
    strata, ``pvalue`` ``min(1, strata * statistic)``, and both detectable TVs are the chi-square approximation at
    its largest stratum and level ``alpha / (m strata)``."""

    name: str
    position: int | None
    strata: int
    n_a: int
    n_b: int
    statistic: float
    dof: int
    pvalue: float
    holm: float
    alpha: float
    tv_observed: float
    detectable: float
    detectable_one: float = math.nan
    low: float = math.nan
    high: float = math.nan

    @property
    def reject(self) -> bool:
        return bool(self.holm < self.alpha)


@dataclass(frozen=True)
class EquivalenceBound:
    """One row of the equivalence mode: ``name`` ("position t" or "answer"), ``position``, ``strata`` prefixes
    bounded (answer: prompts), ``bound`` the largest upper confidence bound on the next-token TV over them
    (answer: on ``|mean_a - mean_b|``), ``plug_in`` the plug-in part of that bound, ``delta`` the error share of
    each bound (union bound over the family: the shares sum to ``alpha``), ``eps`` the margin, ``needed`` decodes
    per prompt per side that would bring every failing bound of the row under ``eps`` if the observed frequencies
    stay (``n`` itself when it holds; ``inf`` when a plug-in part already reaches ``eps``)."""

    name: str
    position: int | None
    strata: int
    bound: float
    plug_in: float
    delta: float
    eps: float
    needed: float

    @property
    def holds(self) -> bool:
        return bool(self.bound <= self.eps)


@dataclass(frozen=True)
class GenerationCheckResult(TestResult):
    """What ``check_generation`` found. Unpacks to ``(statistic, pvalue)``: the statistic of the test with the
    smallest Holm-adjusted p-value and that p-value; ``reject = pvalue < alpha``. ``tests`` the family
    (``GenerationTest`` rows), ``not_tested`` positions without a stratum (and why), ``n`` decodes per prompt
    per side, ``prompts`` how many, ``seeds`` (of a, of b), ``names`` of the two generators, ``seconds``
    spent generating (a, b), ``strata`` {position: {"pooled", "exact", "same_token": prefixes}} (every prefix seen
    ``min_count`` times on both sides, by how it was tested), ``equivalence`` the ``EquivalenceBound`` rows (None
    without equivalence mode). A check that tested nothing has ``tested`` False, ``verdict`` "untested" and
    ``pvalue`` NaN (never 1)."""

    statistic: float
    pvalue: float
    alpha: float
    tests: list
    not_tested: list
    n: int
    prompts: int
    seeds: tuple
    names: tuple
    tv: float
    power: float
    min_count: int
    seconds: tuple = (0.0, 0.0)
    notes: list = field(default_factory=list)
    strata: dict = field(default_factory=dict)
    equivalence: list | None = None

    @property
    def tested(self) -> bool:
        return bool(self.tests)

    @property
    def equivalent(self) -> bool | None:
        """Every equivalence bound clears its ``eps`` (None without equivalence mode; False when nothing was
        bounded)."""
        if self.equivalence is None:
            return None
        return bool(self.equivalence) and all(r.holds for r in self.equivalence)

    @property
    def verdict(self) -> str:
        """"untested", "reject" or "no difference detected"."""
        return "untested" if not self.tested else ("reject" if self.reject else "no difference detected")

    def _verdict_lines(self) -> list[str]:
        if not self.tested:
            return ["verdict: UNTESTED: no position had a prefix seen often enough to compare (nothing was tested; "
                    "this is not evidence of equality)"]
        return [f"verdict: {'REJECT equality in law' if self.reject else 'no evidence of a difference'} "
                f"(p = {self.pvalue:.3g}, alpha = {self.alpha:g}); observed / detectable: TV of next-token laws "
                f"(answer: difference of mean scores, a - b)"]

    def _equivalence_lines(self) -> list[str]:
        if self.equivalence is None:
            return []
        eps = self.equivalence[0].eps if self.equivalence else math.nan
        lines = [f"equivalence: upper bounds on the next-token TV (answer: on |mean_a - mean_b|), jointly at "
                 f"confidence {1 - self.alpha:g} (union bound: the deltas sum to alpha)",
                 f"  {'row':12} {'strata':>6} {'bound':>8} {'plug-in':>8} {'delta':>9} {'needed n':>9}"]
        for r in self.equivalence:
            lines.append(f"  {r.name:12} {r.strata:6d} {r.bound:8.4f} {r.plug_in:8.4f} {r.delta:9.2g} "
                         f"{r.needed:9.0f}")
        if self.equivalent:
            lines.append(f"equivalence verdict: TV <= {eps:g} at every tested prefix (and answer) at confidence "
                         f"{1 - self.alpha:g}")
        elif not self.equivalence:
            lines.append("equivalence verdict: NOT SHOWN: no prefix was bounded")
        else:
            need = max(r.needed for r in self.equivalence)
            lines.append(f"equivalence verdict: NOT SHOWN at eps {eps:g}: " + (
                f"about {need:.0f} decodes per prompt per side would be needed (observed frequencies kept)"
                if math.isfinite(need) else "a plug-in part already reaches eps: no n would show it"))
        return lines

    def table(self) -> str:
        a, b = self.names
        lines = [f"check_generation: {a} vs {b}, {self.prompts} prompts x {self.n} decodes each side (seeds "
                 f"{self.seeds[0]}, {self.seeds[1]}), prefixes seen >= {self.min_count} times on both sides, "
                 f"Holm over {len(self.tests)} tests at alpha = {self.alpha:g}, power {self.power:g}",
                 f"{'test':12} {'strata':>6} {'n_a':>7} {'n_b':>7} {'statistic':>10} {'dof':>5} {'p-value':>9} "
                 f"{'Holm':>9} {'observed':>9} {'detectable':>10} {'one prefix':>10}"]
        for t in self.tests:
            obs = (f"{t.tv_observed:+.4f}" if t.position is None else f"{t.tv_observed:.4f}")
            lines.append(f"{t.name:12} {t.strata:6d} {t.n_a:7d} {t.n_b:7d} {t.statistic:10.4g} {t.dof:5d} "
                         f"{t.pvalue:9.3g} {t.holm:9.3g} {obs:>9} {t.detectable:10.4f} "
                         f"{'' if math.isnan(t.detectable_one) else f'{t.detectable_one:.4f}':>10}")
        for note in self.not_tested:
            lines.append(f"not tested: {note}")
        lines += list(self.notes)
        lines += self._verdict_lines() + self._equivalence_lines()
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def as_dict(self) -> dict:
        tests = [{f: getattr(t, f) for f in t.__dataclass_fields__} | {"reject": t.reject} for t in self.tests]
        for t in tests:
            for key, v in list(t.items()):
                if isinstance(v, float) and not math.isfinite(v):
                    t[key] = None
        return {"names": list(self.names), "n": self.n, "prompts": self.prompts, "seeds": list(self.seeds),
                "alpha": self.alpha, "tv": self.tv, "power": self.power, "min_count": self.min_count,
                "statistic": _finite(self.statistic), "pvalue": _finite(self.pvalue), "reject": self.reject, "tests": tests,
                "not_tested": list(self.not_tested), "notes": list(self.notes), "seconds": list(self.seconds),
                "verdict": self.verdict, "strata": {str(k): v for k, v in self.strata.items()},
                "equivalence": None if self.equivalence is None else {
                    "equivalent": self.equivalent,
                    "rows": [{f: (None if isinstance(getattr(r, f), float) and not math.isfinite(getattr(r, f))
                                  else getattr(r, f)) for f in r.__dataclass_fields__} | {"holds": r.holds}
                             for r in self.equivalence]}}


def verdict_words(result, first: int = 0, units: str = "prompts") -> str:
    """The verdict in words a reviewer can sign. A rejection: "differs (smallest Holm-adjusted p ...; scope)"; a
    non-rejection never reads "holds": "no difference detected; a next-token TV >= x at every tested prefix of
    position ``first`` (the first position speculation can change) would be detected with probability ``power``
    (scope)", ``x`` the detectable TV of the pooled test at ``first`` (the TV that, moved into every tested prefix's
    next-token law there, is detected with that probability at Holm's first-step level); the scope: prompts (called
    ``units``), positions tested of those asked, decodes per prompt per side. ``result``: a ``GenerationCheckResult``
    or its ``as_dict()`` (a committed JSON)."""
    d = result.as_dict() if isinstance(result, GenerationCheckResult) else result
    tests = d["tests"]
    if not tests:
        return f"untested: no position had a prefix seen often enough ({d['prompts']} {units}, n = {d['n']})"
    tested = sorted({t["position"] for t in tests if t["position"] is not None})
    asked = tested + [int(m.split()[1].rstrip(":")) for m in d["not_tested"] if m.startswith("position ")]
    one = units[:-1] if units.endswith("s") else units
    scope = (f"{d['prompts']} {units}, {len(tested)} of positions {min(asked)}-{max(asked)} tested, n = {d['n']} "
             f"decodes per {one} per side")
    if d["reject"]:
        return f"differs (smallest Holm-adjusted p {min(t['holm'] for t in tests):.2g}; {scope})"
    t = next((t for t in tests if t["name"] == f"position {first}"), None)
    if t is None:
        return (f"no difference detected, but position {first} (the first position speculation can change) was not "
                f"tested ({scope})")
    return (f"no difference detected; a next-token TV >= {t['detectable']:.3f} at every tested prefix of position "
            f"{first} (the first position speculation can change) would be detected with probability "
            f"{d['power']:g} ({scope})")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def read_decodes(out, count: int, name: str) -> list[tuple[int, ...]]:
    """A generator's output as tuples of ints, checked: a list of ``count`` token-id sequences (lists, tuples,
    1-d integer numpy arrays or torch tensors) of non-negative ids. Raises ``TypeError`` / ``ValueError``
    naming ``name`` and what was expected."""
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
        raise TypeError(f"{name} must return a list of token-id lists (n decodes per prompt, in prompt order), got "
                        f"{type(out).__name__}")
    if len(out) != count:
        raise ValueError(f"{name} returned {len(out)} decodes; expected len(prompts) * n = {count} (n decodes per "
                         f"prompt, in prompt order)")
    res = []
    for i, d in enumerate(out):
        if hasattr(d, "tolist") and hasattr(d, "dtype"):  # numpy / torch
            kind = str(d.dtype)
            if "int" not in kind or "bool" in kind:
                raise TypeError(f"{name} output[{i}] must hold integer token ids, got dtype {d.dtype}")
            if getattr(d, "ndim", 1) != 1:
                raise ValueError(f"{name} output[{i}] must be one token-id sequence (1-d), got shape {tuple(d.shape)}")
            d = d.tolist()
        if not isinstance(d, (list, tuple)):
            raise TypeError(f"{name} output[{i}] must be a list of token ids, got {type(d).__name__}")
        for t in d:
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
                raise TypeError(f"{name} output[{i}] must hold integer token ids, got {t!r} ({type(t).__name__})")
            if t < 0:
                raise ValueError(f"{name} output[{i}] has a negative token id {int(t)} (no padding: give each decode's "
                                 f"tokens only)")
        res.append(tuple(int(t) for t in d))
    return res


class _Tree:
    """The observed prefix tree of both samples: ``node`` ids per (parent, token), ``depth`` of each node, and
    the next-token counts of each side at each node."""

    def __init__(self):
        self.child: dict[tuple[int, int], int] = {}
        self.depth: list[int] = []
        self.counts: list[list[dict]] = [[], []]  # side -> node -> {next token: count}
        self.even: list[list[dict]] = [[], []]  # the same, decodes of even index only (equivalence's selection half)

    def _node(self, t: int) -> int:
        self.depth.append(t)
        for side in (0, 1):
            self.counts[side].append({})
            self.even[side].append({})
        return len(self.depth) - 1

    def halves(self, side: int, node: int) -> tuple[dict, dict]:
        """(even-index, odd-index) next-token counts of ``side`` at ``node``."""
        c, e = self.counts[side][node], self.even[side][node]
        return e, {k: v - e.get(k, 0) for k, v in c.items() if v - e.get(k, 0) > 0}

    def add(self, side: int, roots: list[int], decodes: list[tuple], n: int, max_depth: int) -> None:
        for idx, d in enumerate(decodes):
            node = roots[idx // n]
            for t in range(min(len(d), max_depth - 1) + 1):
                nxt = d[t] if t < len(d) else END
                for c in (self.counts[side][node],) + ((self.even[side][node],) if idx % 2 == 0 else ()):
                    c[nxt] = c.get(nxt, 0) + 1
                if t == len(d) or t + 1 >= max_depth:
                    break
                key = (node, nxt)
                node = self.child.get(key)
                if node is None:
                    node = self.child[key] = self._node(t + 1)


@dataclass
class _Position:
    """What one position's strata gave: the pooled chi-square sum (``stat``, ``dof``, ``strata``, ``n_a``,
    ``n_b``, ``eff`` = sum of ``n_a n_b / (n_a + n_b)``, ``eff_max``, ``tv_w`` = the ``eff``-weighted plug-in TV
    sum), the one-bin strata tested exactly (``exact``: (Fisher p-value, n_a, n_b, eff, plug-in TV) each) and
    ``same`` strata where both sides emitted one and the same token (nothing to compare)."""

    stat: float = 0.0
    dof: int = 0
    strata: int = 0
    n_a: int = 0
    n_b: int = 0
    eff: float = 0.0
    eff_max: float = 0.0
    tv_w: float = 0.0
    exact: list = field(default_factory=list)
    same: int = 0


def _fisher_top(xa: np.ndarray, xb: np.ndarray) -> float:
    """Fisher's exact test (two-sided) of the 2 x 2 table (the most frequent category of both sides, any other) x
    (side a, side b). The category is chosen from the combined counts, which Fisher's test conditions on, so the
    test is exact under H0 (the next tokens exchangeable between the sides given the prefix counts)."""
    from scipy import stats as sps

    top = int(np.argmax(xa + xb))
    table = [[int(xa[top]), int(xa.sum() - xa[top])], [int(xb[top]), int(xb.sum() - xb[top])]]
    return float(sps.fisher_exact(table, alternative="two-sided").pvalue)


def _position_test(tree: _Tree, nodes: list[int], min_expected: float) -> _Position:
    """Every stratum of one position: ``homogeneity`` (pooled chi-square) where pooling leaves two bins or more,
    Fisher's exact test (``_fisher_top``) where the stratum has two categories or more but pooling leaves one bin,
    and a count of strata where both sides emitted one and the same token."""
    out = _Position()
    for node in nodes:
        ca, cb = tree.counts[0][node], tree.counts[1][node]
        cats = sorted(set(ca) | set(cb))
        xa = np.array([ca.get(c, 0) for c in cats], dtype=np.int64)
        xb = np.array([cb.get(c, 0) for c in cats], dtype=np.int64)
        na, nb = int(xa.sum()), int(xb.sum())
        e = na * nb / (na + nb)
        tv = 0.5 * float(np.abs(xa / na - xb / nb).sum())
        if len(cats) < 2:
            out.same += 1
            continue
        try:
            r = homogeneity(xa, xb, len(cats), kind="counts", min_expected=min_expected)
        except ValueError:  # one bin after pooling: tested exactly instead
            out.exact.append((_fisher_top(xa, xb), na, nb, e, tv))
            continue
        out.stat += r.statistic
        out.dof += r.dof
        out.strata += 1
        out.n_a, out.n_b = out.n_a + na, out.n_b + nb
        out.eff += e
        out.eff_max = max(out.eff_max, e)
        out.tv_w += e * tv
    return out


def _answer_test(scores_a: np.ndarray, scores_b: np.ndarray):
    """Stratified difference of mean scores, ``scores_*`` (prompts, n): (difference, z, p, se under H0,
    95% interval)."""
    from scipy import stats as sps

    P, n = scores_a.shape
    d = float((scores_a.mean(1) - scores_b.mean(1)).mean())
    both = np.concatenate([scores_a, scores_b], 1)
    var0 = both.var(1, ddof=1) if 2 * n > 1 else np.zeros(P)
    se0 = math.sqrt(float((var0 * 2 / n).sum())) / P
    va = scores_a.var(1, ddof=1) if n > 1 else np.zeros(P)
    vb = scores_b.var(1, ddof=1) if n > 1 else np.zeros(P)
    se = math.sqrt(float(((va + vb) / n).sum())) / P
    if se0 == 0:
        z, p = (0.0, 1.0) if d == 0 else (math.inf, 0.0)
    else:
        z = d / se0
        p = float(2 * sps.norm.sf(abs(z)))
    zq = float(sps.norm.isf(0.025))
    return d, z, p, se0, (d - zq * se, d + zq * se)


def check_generation(generate_a: Callable, generate_b: Callable, prompts, *, n: int | None = None,
                     positions: int | Sequence[int] | None = 16, tv: float = 0.1, alpha: float = 1e-3,
                     power: float = 0.9, seed: int = 0, scorer: Callable | None = None, min_count: int = 20,
                     min_expected: float = 5.0, bins: int = 16, names: tuple[str, str] = ("a", "b"),
                     equivalence: float | None = None) -> GenerationCheckResult:
    """Judge whether ``generate_a`` and ``generate_b`` emit the same law of whole decodes (module docstring).

    Args:
        generate_a, generate_b: ``generate(prompts, n, seed) -> list`` of ``len(prompts) * n`` token-id lists
            (prompt order; the generated tokens only).
        prompts: a non-empty list, passed to the generators as given (strings or token-id lists).
        n: decodes per prompt per side (default: sized from ``tv``, ``power``, ``alpha`` and ``bins``).
        positions: test positions ``0..positions - 1`` (an int), the listed positions, or None: every position
            the decodes reach.
        tv, power: the design (sizes ``n`` when it is not given; the detectable TVs are reported either way).
        alpha: family-wise level (Holm over the positions and the answer test).
        seed: ``generate_a`` gets ``2 * seed``, ``generate_b`` ``2 * seed + 1``.
        scorer: ``scorer(prompt, tokens) -> float`` (bool allowed): adds the answer-level test.
        min_count: a prefix is a stratum when each sample has it at least this often.
        min_expected: pooling of each stratum's categories.
        bins: categories assumed at position 0 when sizing ``n``.
        names: labels of the two generators in the table.
        equivalence: a TV margin ``eps`` in (0, 1): also bound the next-token TV at every tested prefix (and, with a
            scorer, whose scores must then be in [0, 1], the difference of mean scores) from above at joint confidence
            ``1 - alpha`` (``EquivalenceBound`` rows; module docstring). Needs ``positions`` given.

    Returns: ``GenerationCheckResult`` (unpacks to ``(statistic, pvalue)``; ``.reject``; ``print`` shows the table).
    """
    for nm, g in (("generate_a", generate_a), ("generate_b", generate_b)):
        if not callable(g):
            raise TypeError(f"{nm} must be callable as generate(prompts, n, seed), got {type(g).__name__}")
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty list (of strings or token-id lists), got {prompts!r:.80}")
    if scorer is not None and not callable(scorer):
        raise TypeError(f"scorer must be callable as scorer(prompt, tokens) -> float, got {type(scorer).__name__}")
    tv = check_number(tv, "tv", low=0.0, high=1.0, low_open=True, what="in (0, 1]")
    alpha = check_number(alpha, "alpha", low=0.0, high=1.0, low_open=True, high_open=True, what="in (0, 1)")
    power = check_number(power, "power", low=0.0, high=1.0, low_open=True, high_open=True, what="in (0, 1)")
    seed = check_int(seed, "seed", low=0)
    min_count = check_int(min_count, "min_count", low=2)
    bins = check_int(bins, "bins", low=2)
    min_expected = check_number(min_expected, "min_expected", low=0.0, low_open=True, what="> 0")
    if positions is None:
        wanted = None
    elif isinstance(positions, (int, np.integer)) and not isinstance(positions, bool):
        wanted = list(range(check_int(positions, "positions", low=1)))
    else:
        try:
            wanted = sorted({check_int(t, "positions[i]", low=0) for t in positions})
        except TypeError:
            raise TypeError(f"positions must be an int, a list of ints or None, got {positions!r}") from None
        if not wanted:
            raise ValueError("positions must name at least one position")
    if not (isinstance(names, (tuple, list)) and len(names) == 2):
        raise ValueError(f"names must be two labels, got {names!r}")
    if equivalence is not None:
        equivalence = check_number(equivalence, "equivalence", low=0.0, high=1.0, low_open=True, high_open=True,
                                   what="a TV margin in (0, 1)")
        if wanted is None:
            raise ValueError("equivalence needs positions given (an int or a list): the bound's confidence is split "
                             "over the positions before any decode is seen, got positions=None")
    m_plan = (len(wanted) if wanted is not None else 16) + (scorer is not None)
    if n is None:
        need = samples_needed(tv, categories=bins, alpha=alpha / m_plan, beta=1 - power)
        n = max(2 * min_count, math.ceil(2 * need / len(prompts)))
    else:
        n = check_int(n, "n", low=1)
    if n < min_count:
        raise ValueError(f"n = {n} decodes per prompt is below min_count = {min_count}: no prefix can be seen "
                         f"min_count times on both sides, so nothing would be tested (give n >= min_count)")

    seeds = (2 * seed, 2 * seed + 1)
    decodes, seconds = [], []
    for side, (g, nm) in enumerate(((generate_a, names[0]), (generate_b, names[1]))):
        t0 = time.perf_counter()
        out = g(prompts, n, seeds[side])
        seconds.append(time.perf_counter() - t0)
        decodes.append(read_decodes(out, len(prompts) * n, f"generate_{'ab'[side]} ({nm})"))

    depth = (max(wanted) + 1) if wanted is not None else max(len(d) for side in decodes for d in side) + 1
    tree = _Tree()
    roots = [tree._node(0) for _ in prompts]
    for side in (0, 1):
        tree.add(side, roots, decodes[side], n, depth)
    by_depth = _strata(tree, min_count)
    positions_all = wanted if wanted is not None else list(range(depth))
    scores = _scores(scorer, prompts, decodes, n, equivalence is not None) if scorer is not None else None

    raw, not_tested, notes, strata_count = [], [], [], {}
    for t in positions_all:
        nodes = by_depth.get(t, [])
        if not nodes:
            not_tested.append(f"position {t}: no prefix seen >= {min_count} times on both sides")
            continue
        pos = _position_test(tree, nodes, min_expected)
        strata_count[t] = {"pooled": pos.strata, "exact": len(pos.exact), "same_token": pos.same}
        if pos.strata:
            raw.append(("position", t, pos))
        if pos.exact:
            raw.append(("exact", t, pos))
        if pos.same and (pos.strata or pos.exact):
            notes.append(f"position {t}: {pos.same} prefix(es) where both sides emitted one and the same token "
                         f"(nothing to compare)")
        if not pos.strata and not pos.exact:
            not_tested.append(f"position {t}: {len(nodes)} prefixes seen often enough, each with one and the same "
                              f"next token on both sides")
    answer = _answer_test(*scores) if scores is not None else None
    equiv = (_equivalence(tree, by_depth, positions_all, scores, equivalence, alpha, n)
             if equivalence is not None else None)
    tests = _family(raw, answer, alpha, power, len(prompts), n)
    if not tests:
        return GenerationCheckResult(math.nan, math.nan, alpha, [], not_tested, n, len(prompts), seeds, tuple(names),
                                     tv, power, min_count, tuple(seconds), notes, strata_count, equiv)
    best = min(tests, key=lambda x: x.holm)
    return GenerationCheckResult(best.statistic, best.holm, alpha, tests, not_tested, n, len(prompts), seeds,
                                 tuple(names), tv, power, min_count, tuple(seconds), notes, strata_count, equiv)


def _strata(tree: _Tree, min_count: int) -> dict[int, list[int]]:
    """Nodes seen at least ``min_count`` times on both sides, by depth."""
    by_depth: dict[int, list[int]] = {}
    for node, t in enumerate(tree.depth):
        na, nb = sum(tree.counts[0][node].values()), sum(tree.counts[1][node].values())
        if na >= min_count and nb >= min_count:
            by_depth.setdefault(t, []).append(node)
    return by_depth


def _scores(scorer: Callable, prompts, decodes, n: int, unit: bool) -> tuple[np.ndarray, np.ndarray]:
    """``scorer`` on every decode, (prompts, n) per side; ``TypeError`` / ``ValueError`` naming the scorer and what
    it returned (a real number; in [0, 1] when ``unit``, for the equivalence bound)."""
    name = getattr(scorer, "__name__", type(scorer).__name__)
    sc = []
    for side in (0, 1):
        vals = []
        for i, d in enumerate(decodes[side]):
            v = scorer(prompts[i // n], list(d))
            if isinstance(v, np.ndarray) and v.ndim == 0:
                v = v[()]
            if not isinstance(v, (int, float, np.integer, np.floating, np.bool_)):
                raise TypeError(f"scorer {name} must return a real number (bool allowed), got {v!r:.60} "
                                f"({type(v).__name__}) for decode {i % n} of prompt {i // n} of generate_{'ab'[side]}")
            v = float(v)
            if not math.isfinite(v) or (unit and not 0 <= v <= 1):
                raise ValueError(f"scorer {name} returned {v!r} for decode {i % n} of prompt {i // n} of "
                                 f"generate_{'ab'[side]}: " + ("a score must be in [0, 1] for the equivalence bound"
                                                               if math.isfinite(v) else "a score must be finite"))
            vals.append(v)
        sc.append(np.array(vals).reshape(len(prompts), n))
    return sc[0], sc[1]


def _family(raw: list, answer, alpha: float, power: float, prompts: int, n: int) -> list[GenerationTest]:
    """The Holm family: one pooled chi-square member per position (its multi-bin strata summed), one exact member
    per position with one-bin strata (``min(1, s min_j p_j)`` over its ``s`` Fisher p-values: Bonferroni inside the
    member), and the answer test."""
    from scipy import stats as sps

    m = len(raw) + (answer is not None)
    if m == 0:
        return []
    pvals = [float(sps.chi2.sf(pos.stat, pos.dof)) if kind == "position" else
             min(1.0, len(pos.exact) * min(e[0] for e in pos.exact)) for kind, _, pos in raw]
    pvals += [answer[2]] if answer is not None else []
    adj = holm(pvals)
    tests = []
    for (kind, t, pos), p, h in zip(raw, pvals, adj, strict=False):
        if kind == "position":
            det = detectable_tv(max(pos.eff, 1.0), categories=pos.dof + 1, alpha=alpha / m, beta=1 - power)
            det1 = detectable_tv(max(pos.eff_max, 1.0), categories=pos.dof + 1, alpha=alpha / m, beta=1 - power)
            tests.append(GenerationTest(f"position {t}", t, pos.strata, pos.n_a, pos.n_b, float(pos.stat),
                                        int(pos.dof), p, h, alpha, pos.tv_w / pos.eff, det, det1))
            continue
        ex = pos.exact
        eff = sum(e[3] for e in ex)
        level = alpha / m / len(ex)
        det1 = detectable_tv(max(max(e[3] for e in ex), 1.0), categories=2, alpha=level, beta=1 - power)
        tests.append(GenerationTest(f"position {t} exact", t, len(ex), sum(e[1] for e in ex), sum(e[2] for e in ex),
                                    float(min(e[0] for e in ex)), len(ex), p, h, alpha,
                                    sum(e[3] * e[4] for e in ex) / eff, det1, det1))
    if answer is not None:
        d, z, p, se0, (lo, hi) = answer
        mdd = (float(sps.norm.isf(alpha / m / 2)) + float(sps.norm.ppf(power))) * se0
        tests.append(GenerationTest("answer", None, prompts, prompts * n, prompts * n, float(z), 1, p, adj[-1], alpha,
                                    d, mdd, math.nan, lo, hi))
    return tests


def _equivalence(tree: _Tree, by_depth: dict, positions: list[int], scores, eps: float, alpha: float, n: int
                 ) -> list[EquivalenceBound]:
    """Upper confidence bounds (``equivalence.tv_upper_bound``) on the next-token TV at every stratum, ``alpha``
    split by a union bound: ``alpha / T`` per position (``T`` = positions + the answer), that share split equally
    over the position's strata (their number is fixed by the decodes' earlier tokens, before the next tokens are
    seen); the answer's bound (``score_upper_bound``) at ``alpha / T``. ``needed``: decodes per prompt per side that
    would bring the worst failing bound under ``eps`` if the observed frequencies stay (``scale_needed``)."""
    T = len(positions) + (scores is not None)
    rows = []
    for t in positions:
        nodes = by_depth.get(t, [])
        if not nodes:
            continue
        delta = alpha / T / len(nodes)
        got = [tv_upper_bound(*tree.halves(0, node), *tree.halves(1, node), delta) for node in nodes]
        worst = max(got, key=lambda g: g[0])
        scale = max(scale_needed(plug, marg, eps) for u, plug, marg in got if u > eps) if worst[0] > eps else 1.0
        rows.append(EquivalenceBound(f"position {t}", t, len(nodes), worst[0], worst[1], delta, eps,
                                     _decodes(n, scale)))
    if scores is not None:
        u, d, margin = score_upper_bound(scores[0], scores[1], alpha / T)
        scale = scale_needed(d, margin, eps) if u > eps else 1.0
        rows.append(EquivalenceBound("answer", None, scores[0].shape[0], u, d, alpha / T, eps, _decodes(n, scale)))
    return rows


def _decodes(n: int, scale: float) -> float:
    return float(math.ceil(n * scale)) if math.isfinite(scale) else math.inf
