"""``check_sampler``: does a verification sampler emit its rule's exact law? Judged on the user's own rows,
at real vocabulary sizes, in one call::

    import cactus_theory as ct
    res = ct.check_sampler(my_verify, P, Q)      # P (k, V) draft rows, Q (k + 1, V) verifier rows
    stat, pvalue = res                            # unpacks like scipy.stats' results
    res.reject, res.parts["bonus"].pvalue, print(res)

The sampler has ``sampler.verify``'s signature ``(draft_tokens, draft_probs, verifier_probs, rule,
generator=...) -> (tokens, num_accepted)`` and is called in chunks of ``B`` rows: drafts ``n_j ~ P[j]``
(independent, seeded), ``draft_probs = P`` and ``verifier_probs = Q`` repeated on every row (expanded
views: no copy). Samplers with other conventions (logits in, batch 1, torch's global RNG, numpy out) go
through ``as_sampler``; transformers' ``_speculative_sampling`` through ``transformers_sampler``.

**What is tested** (three parts, Holm's correction over them, family level ``alpha``):
  ``first``  the first emitted token ``tokens[:, 0]`` against ``h_alg`` of row 0 (``induced_distribution``);
  ``bonus``  the bonus token ``tokens[:, k]`` of the rows that accepted all ``k`` drafts, against the rule's
             bonus law of row ``k`` (``bonus_distribution``: ``Q[k]`` itself unless the rule draws its own);
  ``block``  the whole emitted block ``(a, n_1..n_a, y)``: ``a`` accepted drafts, then the recovered or bonus
             token ``y``.
A bonus from the wrong row, a wrong acceptance at position 2, or a recovery from the wrong position are
invisible to the first token and visible here.

**The exact law of a block.** With fixed rows, drafts are independent, ``n_j ~ p_j``; draft ``j`` is
accepted with ``phi_j(n) = rule.accept_prob(p_j, q_j, n)``, and the first rejection, at ``a < k``, emits
``y ~ g_{a, n_a}``. The rejected draft and the drafts after it are not emitted, so summing over them::

    P(a, n_1..n_a, y) = prod_{j < a} p_j(n_j) phi_j(n_j)  *  r_a(y)      (a < k)
                      = prod_{j < k} p_j(n_j) phi_j(n_j)  *  b(y)        (a = k)
    r_a(y) = sum_n p_a(n) (1 - phi_a(n)) g_{a, n}(y) = h_alg_a(y) - p_a(y) phi_a(y)

(``h_alg(y) = sum_n p_n [phi_n 1(y = n) + (1 - phi_n) g_n(y)]``, the paper's mixture; ``b`` the bonus
law). ``block_law`` holds these ``(k, V)`` factors (``acc``, ``rej``) and ``b``; the law of ``a`` follows:
``P(a) = prod_{j < a} A_j (1 - A_a)`` with ``A_j = sum_n p_j(n) phi_j(n)``. It is tested against an
enumeration over drafts in the tests.

**Choosing bins before sampling** (``pooling``): a chi-square test needs bins with enough expected
draws, and every choice is made from the exact law alone, before any draw. For a token part with ``n``
expected draws: the most probable tokens, largest first, each with ``n * e >= min_expected``, at most
``max_bins - 1`` of them, get a bin each; every other token of positive probability goes into one
"rest" bin (dropping kept tokens into it, smallest first, until it too reaches ``min_expected``).
Blocks: the ``max_bins`` most probable blocks are enumerated exactly (best-first over the factors;
a block in the top ``m`` has its prefix in the top ``m`` prefixes of its length), and the remainder of
each length ``a`` is a candidate bin of its own; the same rule then keeps the heaviest candidates and
pools the rest. Outputs of exact probability 0 (a token or block the rule never emits) form an
"impossible" cell: a single one gives p-value 0. The detectable TV is therefore on the pooled law: a
deviation that moves mass only inside a pooled bin is invisible (``detectable_tv`` says how large a
pooled deviation is seen).

**Sizing.** Each part is sized to detect a pooled TV of ``tv`` with probability ``power`` at level
``alpha / m`` (``m`` testable parts: Holm's first step), by ``stats.samples_needed`` for its bin count
at that size (bins grow with the draws: the two are iterated to a fixed point, which exists because
both are monotone). The bonus part needs ``(n_bonus + 3 sqrt(n_bonus)) / P(a = k)`` rows (its count is
binomial: the margin keeps it at ``n_bonus`` or more with probability ~0.999). ``N`` is the largest need, capped
by ``max_samples``; a part the cap starves reports its detectable TV (above ``tv``), one whose draws
cannot fill two bins is tested for impossible outputs only, and the bonus is "not testable" when
``P(a = k) = 0`` or the cap leaves fewer than ``2 * min_expected`` expected bonus rows.

**Memory and time**: O(B V) for the sampler's chunk and O(V + bins) for the counts, never O(N V):
the chunk is ``B = 2**22 // V`` rows by default (27 at V = 150,000). ``docs/statistical-tests.md`` gives
the measured peak memory and time at V = 150,000.

**Exact mode** (``mode="exact"`` or ``"both"``): a sampler that exposes its acceptance and recovery,
``accept_prob(p, q, n)`` and ``residual(p, q, n)`` (the names of ``Rule``'s methods; optionally
``step_parts(p, q) -> (acc, rej)`` and ``bonus_law(q)``), is compared with the rule's law without
sampling (``ExactResult``): per-entry differences, the exact TV of the first token and of ``a``, and
the mass the sampler puts on blocks the rule never emits. Effects far below sampling reach are seen:
transformers 5.24's ``r <= ratio`` accepts a draft with ``q_n = 0`` when ``torch.rand`` returns 0
(probability ``2**-24``; the law of ``SpS(rand_bits=24)``); 5.25's ``r < ratio`` does not (``TransformersSampler``
probes which it has).
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..core.exact import bonus_distribution, induced_distribution
from ..core.rules import Rule, SpS, check_rule
from ..core.validate import check_int, check_number, check_probs
from .stats import EstimateResult, TestResult, detectable_tv, goodness_of_fit, holm, samples_needed

__all__ = ["check_sampler", "SamplerCheckResult", "PartResult", "ExactResult", "BlockLaw", "block_law",
           "exposed_block_law", "top_blocks", "tv_interval", "read_output", "as_sampler", "transformers_sampler", "TransformersSampler", "PARTS"]

PARTS = ("first", "bonus", "block")
CHUNK_ELEMENTS = 1 << 22  # rows per sampler call: this many vocabulary entries (B = CHUNK_ELEMENTS // V)
TORCH_RAND_BITS = 24  # torch.rand in float32 returns m * 2**-24, m uniform on [0, 2**24)


# -- the exact law of one block --------------------------------------------------------------------

@dataclass(frozen=True)
class BlockLaw:
    """The factors of the exact law of one emitted block (module docstring), float64:
    ``acc`` (k, V) ``acc[j, n] = p_j(n) phi_j(n)`` (draft ``n`` at position ``j`` drawn and accepted);
    ``rej`` (k, V) ``rej[j, y] = h_alg_j(y) - p_j(y) phi_j(y)`` (a rejection at ``j``, then ``y``);
    ``bonus`` (V,) the bonus token's law after ``k`` accepted drafts."""

    acc: np.ndarray
    rej: np.ndarray
    bonus: np.ndarray

    @property
    def k(self) -> int:
        return int(self.acc.shape[0])

    @property
    def V(self) -> int:
        return int(self.acc.shape[1])

    def end(self, a: int) -> np.ndarray:
        """The law (sub-probability) of the last token of a block with ``a`` accepted drafts: ``rej[a]``
        for ``a < k``, ``bonus`` for ``a = k``, (V,)."""
        return self.rej[a] if a < self.k else self.bonus

    def length_probs(self) -> np.ndarray:
        """``P(a)`` for ``a = 0..k``, (k + 1,): ``prod_{j < a} A_j * sum rej[a]`` (``A_j = sum acc[j]``),
        and ``prod_{j < k} A_j`` for ``a = k``."""
        reach = np.concatenate([[1.0], np.cumprod(self.acc.sum(1))])
        return np.concatenate([reach[:-1] * self.rej.sum(1), reach[-1:]])

    def first(self) -> np.ndarray:
        """The first emitted token's law, (V,): ``acc[0] + rej[0] = h_alg`` of row 0."""
        return self.acc[0] + self.rej[0]

    def prob(self, tokens: np.ndarray, a: np.ndarray) -> np.ndarray:
        """Exact probability of each observed block: ``tokens`` (R, k + 1) int (accepted drafts, then the
        last token), ``a`` (R,) accepted counts -> (R,) float64."""
        R, k = tokens.shape[0], self.k
        out = np.ones(R)
        for j in range(k):
            live = a > j
            out[live] *= self.acc[j, tokens[live, j]]
        last = tokens[np.arange(R), a]
        for j in range(k + 1):
            sel = a == j
            out[sel] *= self.end(j)[last[sel]]
        return out


def _rows64(x) -> np.ndarray:
    """float64 numpy copy of probability rows; rows given below float64 are renormalised there (as
    ``exact.induced_distribution`` reads them)."""
    low = str(x.dtype).replace("torch.", "") != "float64"
    a = x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)
    if low:
        a = a / a.sum(-1, keepdims=True)
    return a


def block_law(rule: Rule, P, Q) -> BlockLaw:
    """The exact block law of ``rule`` on draft rows ``P`` (k, V) and verifier rows ``Q`` (k + 1, V)
    (numpy or torch): ``acc = p phi`` from ``rule.accept_prob_all``, ``rej = induced_distribution - acc``
    (clipped at 0 against rounding), ``bonus = bonus_distribution(rule, Q[k])``."""
    check_rule(rule)
    p, q = _rows64(P), _rows64(Q)
    k = p.shape[0]
    acc = p * rule.accept_prob_all(p, q[:k])
    h = induced_distribution(rule, p, q[:k], check=False)
    return BlockLaw(acc, np.clip(h - acc, 0.0, None), bonus_distribution(rule, q[k], check=False))


def exposed_block_law(sampler, P, Q, *, chunk_elements: int = CHUNK_ELEMENTS) -> BlockLaw:
    """The block law of a sampler that exposes its acceptance and recovery (module docstring, exact mode):
    ``sampler.step_parts(p, q) -> (acc, rej)`` per position when it has one, else ``accept_prob(p, q, n)``
    for every ``n`` and ``rej = sum_n p_n (1 - phi_n) residual(p, q, n)`` over the draft's support (chunks of
    ``chunk_elements`` entries: O(support * V) time); the bonus from ``sampler.bonus_law(q)`` or ``q``."""
    if not (hasattr(sampler, "step_parts") or (hasattr(sampler, "accept_prob") and hasattr(sampler, "residual"))):
        raise TypeError(f"exact mode needs a sampler that exposes its law: accept_prob(p, q, n) and residual(p, q, n) "
                        f"(or step_parts(p, q)); {_name(sampler)} has neither")
    p, q = _rows64(P), _rows64(Q)
    k, V = p.shape
    acc, rej = np.zeros((k, V)), np.zeros((k, V))
    for j in range(k):
        if hasattr(sampler, "step_parts"):
            a_j, r_j = sampler.step_parts(p[j], q[j])
            acc[j], rej[j] = np.asarray(a_j, np.float64), np.asarray(r_j, np.float64)
            continue
        step = max(1, chunk_elements // V)
        phi = np.empty(V)
        for s in range(0, V, step):
            n = np.arange(s, min(V, s + step))
            phi[n] = np.asarray(sampler.accept_prob(np.broadcast_to(p[j], (n.size, V)),
                                                    np.broadcast_to(q[j], (n.size, V)), n), np.float64)
        acc[j] = p[j] * phi
        w = p[j] * (1 - phi)
        live = np.flatnonzero(w > 0)
        for s in range(0, live.size, step):
            n = live[s:s + step]
            g = np.asarray(sampler.residual(np.broadcast_to(p[j], (n.size, V)), np.broadcast_to(q[j], (n.size, V)), n),
                           np.float64)
            rej[j] += w[n] @ g
    bonus = np.asarray(sampler.bonus_law(q[k]), np.float64) if hasattr(sampler, "bonus_law") else q[k].copy()
    return BlockLaw(acc, rej, bonus)


def _top(x: np.ndarray, m: int) -> np.ndarray:
    """Indices of the ``m`` largest positive entries of ``x``, largest first (ties: lower index first)."""
    pos = np.flatnonzero(x > 0)
    if pos.size > m:
        pos = pos[np.argpartition(-x[pos], m - 1)[:m]]
    return pos[np.lexsort((pos, -x[pos]))]


def top_blocks(law: BlockLaw, m: int) -> list[tuple[float, tuple]]:
    """The ``m`` most probable blocks, ``[(probability, (a, n_1, .., n_a, y)), ...]`` largest first, by
    best-first enumeration: a block among the top ``m`` has its accepted prefix among the ``m`` most probable
    prefixes of its length, and its factors among each factor's ``m`` largest entries. Cost O(k m^2)."""
    out: list[tuple[float, tuple]] = []
    prefixes: list[tuple[float, tuple]] = [(1.0, ())]
    for a in range(law.k + 1):
        end = law.end(a)
        ys = _top(end, m).tolist()
        out += [(w * float(end[y]), (a, *s, y)) for w, s in prefixes for y in ys]
        if a < law.k:
            ns = _top(law.acc[a], m).tolist()
            ext = [(w * float(law.acc[a, n]), (*s, n)) for w, s in prefixes for n in ns]
            ext.sort(key=lambda t: -t[0])
            prefixes = [e for e in ext[:m] if e[0] > 0]
    out = [o for o in out if o[0] > 0]
    out.sort(key=lambda t: -t[0])
    return out[:m]


# -- pooling: bins chosen from the exact law before sampling -----------------------------------------

def _keep(masses: np.ndarray, rest: float, n: float, max_bins: int, min_expected: float) -> tuple[int, float]:
    """How many of ``masses`` (sorted largest first) keep a bin of their own at ``n`` expected draws, and the
    mass of the pooled rest (``rest`` plus the masses not kept): the module docstring's rule."""
    t = int(np.sum(n * masses >= min_expected))
    if t == masses.size and rest <= 0 and t <= max_bins:
        return t, 0.0  # every category fits a bin of its own: no rest bin
    t = min(t, max_bins - 1)
    left = rest + float(masses[t:].sum())
    while t > 0 and 0 < n * left < min_expected:
        t -= 1
        left += float(masses[t])
    return t, left


def _bin_count(t: int, left: float) -> int:
    return t + (1 if left > 0 else 0)


@dataclass(frozen=True)
class _TokenPool:
    """Bins of a token part: ``bin_of`` (V,) int64 (-1: probability 0, impossible), ``probs`` (K,) exact."""

    bin_of: np.ndarray
    probs: np.ndarray
    names: tuple[str, ...]


def _token_pool(e: np.ndarray, n: float, max_bins: int, min_expected: float) -> _TokenPool:
    order = np.flatnonzero(e > 0)
    order = order[np.lexsort((order, -e[order]))]
    t, left = _keep(e[order], 0.0, n, max_bins, min_expected)
    bin_of = np.full(e.size, -1, dtype=np.int64)
    bin_of[order[:t]] = np.arange(t)
    names = [f"token {int(i)}" for i in order[:t]]
    probs = list(e[order[:t]])
    if left > 0:
        bin_of[order[t:]] = t
        names.append(f"rest ({order.size - t} tokens)")
        probs.append(left)
    pr = np.asarray(probs, dtype=np.float64)
    return _TokenPool(bin_of, pr / pr.sum(), tuple(names))


@dataclass(frozen=True)
class _BlockPool:
    """Bins of the block part: ``key_bin`` {block key: bin} for enumerated blocks, ``length_bin`` (k + 1,)
    the bin of a non-enumerated block of each length, ``probs`` (K,) exact, ``names``."""

    key_bin: dict
    length_bin: np.ndarray
    probs: np.ndarray
    names: tuple[str, ...]


def _block_name(key: tuple) -> str:
    a, drafts, y = key[0], key[1:-1], key[-1]
    return f"a={a} drafts={list(drafts)} then {y}"


def _block_candidates(law: BlockLaw, max_bins: int):
    """Candidate bins of the block part, heaviest first: (mass, kind, key) with kind "block" (key: the
    block) or "length" (key: a; the blocks of that length not enumerated)."""
    blocks = top_blocks(law, max_bins)
    L = law.length_probs()
    left = L.copy()
    for w, key in blocks:
        left[key[0]] -= w
    cands = [(w, "block", key) for w, key in blocks]
    enumerated = [0] * (law.k + 1)
    for _, key in blocks:
        enumerated[key[0]] += 1
    nnz_acc = [int(np.count_nonzero(law.acc[j])) for j in range(law.k)]
    for a in range(law.k + 1):
        possible = math.prod(nnz_acc[:a]) * int(np.count_nonzero(law.end(a)))  # blocks of length a, exactly
        if possible > enumerated[a]:  # some are not enumerated: their remainder is a candidate (tiny floor:
            cands.append((max(float(left[a]), 1e-300), "length", a))  # rounding must not leave them binless)
    cands.sort(key=lambda c: -c[0])
    return cands


def _block_pool(law: BlockLaw, cands, n: float, max_bins: int, min_expected: float) -> _BlockPool:
    masses = np.array([c[0] for c in cands])
    t, left = _keep(masses, 0.0, n, max_bins, min_expected)
    other = t if left > 0 else -1
    key_bin, length_bin, names = {}, np.full(law.k + 1, other, dtype=np.int64), []
    for i, (_, kind, key) in enumerate(cands):
        b = i if i < t else other
        if kind == "block":
            key_bin[key] = b
        else:
            length_bin[key] = b
        if i < t:
            names.append(_block_name(key) if kind == "block" else f"a={key}, other blocks")
    probs = list(masses[:t])
    if left > 0:
        names.append(f"other ({len(cands) - t} candidates pooled)")
        probs.append(left)
    pr = np.asarray(probs, dtype=np.float64)
    return _BlockPool(key_bin, length_bin, pr / pr.sum(), tuple(names))


def _noncentrality_interval(stat: float, df: int, confidence: float, lower_tail: float | None = None
                            ) -> tuple[float, float]:
    """Confidence interval for the noncentrality ``lambda`` of a chi-square statistic with ``df`` dof: the
    ``lambda`` at which the observed ``stat`` is the upper / lower ``(1 - confidence) / 2`` quantile (the upper
    end from ``max(stat, df)``, so that a statistic below its null mean does not shrink it to 0); the lower end
    at error ``lower_tail`` instead when given."""
    from scipy import optimize
    from scipy import stats as sps

    tail = (1 - confidence) / 2

    def solve(x: float, q: float) -> float:
        if sps.chi2.cdf(x, df) <= q:  # even lambda = 0 puts x below this quantile
            return 0.0
        hi = max(1.0, 2 * x)
        while sps.ncx2.cdf(x, df, hi) > q:
            hi *= 2
        return float(optimize.brentq(lambda lam: sps.ncx2.cdf(x, df, lam) - q, 0.0, hi, xtol=1e-10))

    # the upper end from max(stat, df): a statistic below its null mean must not shrink it to 0
    return solve(stat, 1 - (tail if lower_tail is None else lower_tail)), solve(max(stat, float(df)), tail)


def tv_interval(observed: np.ndarray, probs: np.ndarray, impossible: int = 0, *,
                confidence: float = 0.95) -> EstimateResult:
    """TV between the law ``P`` behind pooled counts ``observed`` (K,) and the exact pooled law ``e = probs`` (K,),
    with ``impossible`` further draws where the exact law is 0: the plug-in ``sum |O / n - e| / 2`` and an interval.

    Pearson's statistic on the ``m`` possible draws is about noncentral chi-square with noncentrality
    ``lambda = m chi2(P || e)``; ``[l, u]`` is its interval (``_noncentrality_interval``). **Upper end**:
    ``chi2 >= 4 TV^2`` (Cauchy-Schwarz), so ``TV <= sqrt(u / m) / 2``. **Lower end**: the larger of two bounds.
    (i) ``chi2 <= 4 TV^2 / e_min`` (``sum d^2 / e <= (sum |d|)^2 / e_min``): ``TV >= sqrt(e_min l / m) / 2``.
    (ii) Weissman et al.'s L1 deviation inequality (``equivalence.l1_deviation``, finite-sample):
    ``TV >= TV_hat - e(m, K, tail) / 2``. Bound (i) is *weak by necessity* when a bin is rare: a large statistic is
    also what a small TV moved onto the rarest bin gives (``chi2`` up to ``TV^2 / e_min + TV``), so alone it read
    "0.2811" beside a plug-in of 0.8428. The sharper ``chi2 <= TV^2 / e_min + TV`` is not used: it is tight exactly
    where the noncentral approximation is poor (a large deviation on a rare bin inflates the statistic's variance),
    and with it the lower end covered 0.68 of 300 draws at TV 0.3 with ``e_min = 0.005`` (n = 4000); (i)'s factor
    of 2 absorbs that error. (ii) does not depend on ``e_min`` and lifts the lower end when TV is large (0.77 for a
    plug-in of 0.81 on 3,546 draws over 4 bins). The lower end's error ``(1 - confidence) / 2`` is split evenly
    between ``l`` and (ii) (union bound). Draws on impossible outputs add their observed share to both ends (taken
    as known: such a part rejects anyway, with p = 0). The coverage is simulated in ``tests/theory/test_check.py``
    and ``tests/theory/test_fail_closed.py``."""
    obs = np.asarray(observed, dtype=np.float64)
    e = np.asarray(probs, dtype=np.float64)
    n = float(obs.sum()) + impossible
    share = impossible / n
    est = 0.5 * (np.abs(obs / n - e * (1 - share)).sum() + share) if n else 0.0
    # the possible outputs' law, renormalised, against e
    m = float(obs.sum())
    if e.size < 2 or m == 0:
        return EstimateResult(float(est), share, min(1.0, share + (1 - share) * (1.0 if m == 0 else 0.0)),
                              confidence, "impossible outputs only (one bin)")
    stat = float(((obs - m * e) ** 2 / (m * e)).sum())
    tail = (1 - confidence) / 2  # each end's error; the lower end's is split between l and the L1 bound
    lo, hi = _noncentrality_interval(stat, e.size - 1, confidence, lower_tail=tail / 2)
    low_i = 0.5 * math.sqrt(float(e.min()) * lo / m)
    from .equivalence import l1_deviation

    low_ii = 0.5 * float(np.abs(obs / m - e).sum()) - 0.5 * l1_deviation(m, e.size, tail / 2)
    low = share + (1 - share) * max(low_i, low_ii, 0.0)
    high = min(1.0, share + (1 - share) * 0.5 * math.sqrt(hi / m))
    return EstimateResult(float(est), float(low), float(max(low, high)), confidence,
                          "plug-in; interval from Pearson's noncentral chi-square and an L1 deviation bound")


# -- results ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PartResult(TestResult):
    """One part of ``check_sampler``: chi-square of the pooled counts against the exact law.

    ``statistic`` / ``pvalue`` (``stats.goodness_of_fit``; 0 when an output of probability 0 was seen),
    ``holm`` the adjusted p-value over the parts, ``alpha`` the family level (``reject = holm < alpha``),
    ``n`` draws, ``bins`` names of the pooled bins, ``observed`` (K,) counts and ``expected`` (K,) expected
    counts on them, ``impossible`` draws of probability 0, ``tv`` plug-in TV of the pooled law with a 95%
    confidence interval (``tv_interval``: Pearson's noncentral chi-square and an L1 deviation bound; no bootstrap),
    ``detectable_tv`` the pooled TV detected with probability ``power`` at level
    ``alpha / m``, ``note`` what limits the part (empty when none)."""

    name: str
    statistic: float
    pvalue: float
    holm: float
    alpha: float
    n: int
    bins: tuple[str, ...]
    observed: np.ndarray
    expected: np.ndarray
    impossible: int
    tv: EstimateResult | None
    detectable_tv: float
    note: str = ""

    @property
    def reject(self) -> bool:
        return bool(self.holm < self.alpha)


@dataclass(frozen=True)
class ExactResult:
    """Exact mode: the exposed law of a sampler against the rule's, no sampling.

    ``max_abs_diff`` the largest difference of one entry of the block factors (``acc``, ``rej``, bonus) and
    ``where`` it is; ``first_tv`` / ``length_tv`` / ``bonus_tv`` exact TV of the first token's law, of the
    number of accepted drafts and of the bonus law; ``impossible_mass`` the probability of a block the rule
    never emits; ``block_tv_low`` <= TV(block laws) <= ``block_tv_high`` (a lower bound from the marginals
    and the impossible mass; an upper bound from a step-by-step coupling:
    ``sum_j c_j TV_j``, ``c_{j+1} = c_j sum_n min(acc_j, acc'_j)``); ``reject``: any impossible mass, or a
    difference above ``atol``."""

    max_abs_diff: float
    where: str
    first_tv: float
    length_tv: float
    bonus_tv: float
    impossible_mass: float
    block_tv_low: float
    block_tv_high: float
    atol: float

    @property
    def reject(self) -> bool:
        return bool(self.impossible_mass > 0 or self.max_abs_diff > self.atol)


def compare_laws(sampler_law: BlockLaw, rule_law: BlockLaw, atol: float) -> ExactResult:
    """``ExactResult`` of a sampler's exposed block law against the rule's."""
    s, r = sampler_law, rule_law
    k = r.k
    diffs = [("acc", j, np.abs(s.acc[j] - r.acc[j])) for j in range(k)]
    diffs += [("rej", j, np.abs(s.rej[j] - r.rej[j])) for j in range(k)] + [("bonus", k, np.abs(s.bonus - r.bonus))]
    kind, j, d = max(diffs, key=lambda t: float(t[2].max()))
    y = int(np.argmax(d))
    where = {"acc": f"accepting draft {y} at position {j}", "rej": f"rejecting at position {j}, then {y}",
             "bonus": f"bonus token {y}"}[kind]
    # the sampler's mass on blocks with a factor the rule gives 0, summed by the first such factor (no
    # subtraction: exactly 0 when the sampler never leaves the rule's support)
    allowed = [float(s.acc[j][r.acc[j] > 0].sum()) for j in range(k)]
    forbidden = [float(s.acc[j][r.acc[j] == 0].sum()) for j in range(k)]
    total = [float(s.acc[j].sum()) for j in range(k)]
    impossible = 0.0
    for a in range(k + 1):
        end_total, end_bad = float(s.end(a).sum()), float(s.end(a)[r.end(a) == 0].sum())
        for i in range(a):  # first forbidden factor: draft i
            impossible += math.prod(allowed[:i]) * forbidden[i] * math.prod(total[i + 1:a]) * end_total
        impossible += math.prod(allowed[:a]) * end_bad
    steps = [0.5 * (np.abs(s.acc[j] - r.acc[j]).sum() + np.abs(s.rej[j] - r.rej[j]).sum()) for j in range(k)]
    steps.append(0.5 * np.abs(s.bonus - r.bonus).sum())
    c, hi = 1.0, 0.0
    for j in range(k + 1):
        hi += c * steps[j]
        if j < k:
            c *= float(np.minimum(s.acc[j], r.acc[j]).sum())
    first = 0.5 * float(np.abs(s.first() - r.first()).sum())
    length = 0.5 * float(np.abs(s.length_probs() - r.length_probs()).sum())
    bonus = 0.5 * float(np.abs(s.bonus - r.bonus).sum())
    low = max(first, length, impossible)
    return ExactResult(float(d.max()), where, first, length, bonus, impossible, low, max(low, min(1.0, float(hi))), atol)


@dataclass(frozen=True)
class SamplerCheckResult(TestResult):
    """What ``check_sampler`` found. Unpacks to ``(statistic, pvalue)``: the statistic of the part with the
    smallest Holm-adjusted p-value and that p-value (0 when exact mode found a difference, 1 when it found
    none and nothing was sampled); ``reject = pvalue < alpha``.

    ``parts`` {name: ``PartResult``} of the parts tested; ``not_testable`` {name: why}; ``n`` rows drawn
    (``N``), ``k``, ``V``, ``chunk`` rows per sampler call; ``rule``; ``tv`` and ``power`` the design;
    ``tv_estimate`` and ``detectable_tv`` of the block part (the whole emitted block's pooled law);
    ``exact`` the ``ExactResult`` (exact mode) or None; ``seconds`` the sampling time."""

    statistic: float
    pvalue: float
    alpha: float
    parts: dict
    not_testable: dict
    n: int
    k: int
    V: int
    chunk: int
    rule: Rule
    tv: float
    power: float
    exact: ExactResult | None = None
    seconds: float = 0.0
    mode: str = "sample"
    sampler: str = ""
    sized: bool = True

    @property
    def tv_estimate(self) -> EstimateResult | None:
        part = self.parts.get("block")
        return None if part is None else part.tv

    @property
    def detectable_tv(self) -> float | None:
        part = self.parts.get("block")
        return None if part is None else part.detectable_tv

    def table(self) -> str:
        """The parts as a text table (one line each), then what was not testable and the exact verdict."""
        head = f"check_sampler: {self.sampler} against {self.rule!r}, k = {self.k}, V = {self.V}, "
        head += ("exact mode (no sampling)" if self.mode == "exact" else
                 f"N = {self.n} rows (chunks of {self.chunk}; " + (
                     f"sized for TV {self.tv:g} at power {self.power:g}" if self.sized else "set by num_samples, not by "
                     "the design") + f"), alpha = {self.alpha:g}" + self._detectable_phrase())
        lines = [head]
        if self.parts:
            lines.append(f"{'part':6} {'n':>9} {'bins':>5} {'impossible':>10} {'statistic':>11} {'p-value':>9} "
                         f"{'Holm':>9} {'TV [95% CI]':>24} {'detectable TV':>13}")
        for part in self.parts.values():
            tv = (f"{part.tv.estimate:.4f} [{part.tv.low:.4f}, {part.tv.high:.4f}]" if part.tv is not None else "-")
            lines.append(f"{part.name:6} {part.n:9d} {len(part.bins):5d} {part.impossible:10d} {part.statistic:11.4g} "
                         f"{part.pvalue:9.3g} {part.holm:9.3g} {tv:>24} {part.detectable_tv:13.4f}"
                         + (f"  ({part.note})" if part.note else ""))
        for name, why in self.not_testable.items():
            lines.append(f"{name:6} not testable: {why}")
        if self.exact is not None:
            e = self.exact
            lines.append(f"exact: max |difference| {e.max_abs_diff:.3g} ({e.where}), first-token TV {e.first_tv:.3g}, "
                         f"impossible mass {e.impossible_mass:.3g}, block TV in [{e.block_tv_low:.3g}, "
                         f"{e.block_tv_high:.3g}]: {'DIFFERS' if e.reject else 'equal'} (atol {e.atol:g})")
        lines.append(f"verdict: {'REJECT' if self.reject else 'no evidence against'} the rule's law "
                     f"(p = {self.pvalue:.3g}, alpha = {self.alpha:g})")
        return "\n".join(lines)

    def _detectable_phrase(self) -> str:
        """The design actually run: the largest pooled TV the tested parts detect at ``power`` at this ``N``."""
        if not self.parts:
            return ""
        det = max(p.detectable_tv for p in self.parts.values())
        return f"; at this N each part detects a pooled TV of {det:.4g} with probability {self.power:g}"

    def __str__(self) -> str:
        return self.table()

    def as_dict(self) -> dict:
        """JSON-ready summary (counts as lists)."""
        def part(p: PartResult) -> dict:
            return {"statistic": p.statistic, "pvalue": p.pvalue, "holm": p.holm, "n": p.n, "bins": list(p.bins),
                    "observed": p.observed.tolist(), "expected": p.expected.tolist(), "impossible": p.impossible,
                    "tv": None if p.tv is None else list(p.tv), "detectable_tv": p.detectable_tv, "note": p.note,
                    "reject": p.reject}
        out = {"sampler": self.sampler, "rule": repr(self.rule), "k": self.k, "V": self.V, "n": self.n,
               "chunk": self.chunk, "alpha": self.alpha, "tv": self.tv, "power": self.power, "mode": self.mode,
               "sized": self.sized,
               "statistic": self.statistic, "pvalue": self.pvalue, "reject": self.reject, "seconds": self.seconds,
               "parts": {k: part(v) for k, v in self.parts.items()}, "not_testable": dict(self.not_testable)}
        if self.exact is not None:
            out["exact"] = {f: getattr(self.exact, f) for f in self.exact.__dataclass_fields__} | {
                "reject": self.exact.reject}
        return out


# -- the sampler's output -----------------------------------------------------------------------------

def _name(sampler) -> str:
    return getattr(sampler, "__qualname__", None) or getattr(sampler, "__name__", None) or type(sampler).__name__


def _check_signature(sampler) -> None:
    """The sampler takes verify's arguments: four positional ones and ``generator=`` (before anything runs)."""
    if not callable(sampler):
        raise TypeError(f"sampler must be a callable with verify's signature (draft_tokens, draft_probs, "
                        f"verifier_probs, rule, generator=...), got {type(sampler).__name__}")
    try:
        sig = inspect.signature(sampler)
    except (TypeError, ValueError):  # a builtin without a signature: judged by its output
        return
    params = list(sig.parameters.values())
    if not any(p.name == "generator" or p.kind is p.VAR_KEYWORD for p in params):
        raise TypeError(f"sampler {_name(sampler)}{sig} takes no generator= keyword: check_sampler seeds every draw "
                        f"through it (verify's signature: draft_tokens, draft_probs, verifier_probs, rule, "
                        f"generator=...); wrap a sampler that draws from torch's global RNG with "
                        f"as_sampler(fn, rng='global')")
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "generator"]
    if len(positional) < 4 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise TypeError(f"sampler {_name(sampler)}{sig} takes {len(positional)} positional arguments; verify's "
                        f"signature has 4 (draft_tokens, draft_probs, verifier_probs, rule) and generator=; wrap one "
                        f"without a rule argument with as_sampler(fn, takes_rule=False)")


def _as_int_array(x, what: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            nan = " (it holds NaN)" if x.is_floating_point() and bool(torch.isnan(x).any()) else ""
            raise TypeError(f"sampler output {what} must hold integer token ids, got dtype {x.dtype}{nan}")
        return x.detach().cpu().numpy().astype(np.int64, copy=False)
    if isinstance(x, np.ndarray):
        if not np.issubdtype(x.dtype, np.integer):
            nan = " (it holds NaN)" if np.issubdtype(x.dtype, np.floating) and bool(np.isnan(x).any()) else ""
            raise TypeError(f"sampler output {what} must hold integer token ids, got dtype {x.dtype}{nan}")
        return x.astype(np.int64, copy=False)
    raise TypeError(f"sampler output {what} must be a torch.Tensor or a numpy array, got {type(x).__name__}")


def read_output(out, drafts: np.ndarray, V: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, num_accepted)`` returned by a sampler for ``drafts`` (B, k), checked against verify's contract:
    tokens (B, k + 1) integer, the ``a`` accepted drafts (equal to the drafts), one token in ``[0, V)``, then -1;
    num_accepted (B,) integer in ``[0, k]``. Returns int64 numpy copies; raises ``TypeError`` / ``ValueError``
    naming the output and what was expected."""
    B, k = drafts.shape
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = f"a {type(out).__name__} of length {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
        raise TypeError(f"sampler must return (tokens, num_accepted) as verify does, got {got}")
    tokens, a = _as_int_array(out[0], "tokens"), _as_int_array(out[1], "num_accepted")
    if tokens.shape != (B, k + 1):
        raise ValueError(f"sampler output tokens must have shape (B, k + 1) = ({B}, {k + 1}), got {tokens.shape}")
    if a.shape != (B,):
        raise ValueError(f"sampler output num_accepted must have shape (B,) = ({B},), got {a.shape}")
    if a.size and (a.min() < 0 or a.max() > k):
        bad = a[(a < 0) | (a > k)]
        raise ValueError(f"sampler output num_accepted must be in [0, k] = [0, {k}], got {bad[:5].tolist()}")
    pos = np.arange(k + 1)
    acc = pos[None, :k] < a[:, None]
    wrong = np.flatnonzero((acc & (tokens[:, :k] != drafts)).any(1))
    if wrong.size:
        b = int(wrong[0])
        raise ValueError(f"sampler output tokens[b, :num_accepted[b]] must be the accepted drafts: row {b} accepted "
                         f"{int(a[b])} but emitted {tokens[b, :a[b]].tolist()} for drafts {drafts[b, :a[b]].tolist()}")
    last = tokens[np.arange(B), a]
    if last.size and (last.min() < 0 or last.max() >= V):
        b = int(np.flatnonzero((last < 0) | (last >= V))[0])
        raise ValueError(f"sampler output tokens[b, num_accepted[b]] (the recovered or bonus token) must be in "
                         f"[0, V) = [0, {V}): row {b} has {int(last[b])}")
    pad = pos[None, :] > a[:, None]
    badpad = np.flatnonzero((pad & (tokens != -1)).any(1))
    if badpad.size:
        b = int(badpad[0])
        raise ValueError(f"sampler output tokens after the last emitted token must be -1 padding: row {b} "
                         f"(num_accepted {int(a[b])}) is {tokens[b].tolist()}")
    return tokens, a


# -- check_sampler ----------------------------------------------------------------------------------

def _check_rows(P, Q) -> tuple[int, int]:
    for name, x in (("P", P), ("Q", Q)):
        if not isinstance(x, (np.ndarray, torch.Tensor)):
            raise TypeError(f"{name} must be a numpy array or a torch tensor of probability rows, got {type(x).__name__}")
        if x.ndim != 2:
            raise ValueError(f"{name} must be 2-d ({'(k, V)' if name == 'P' else '(k + 1, V)'}), got shape {tuple(x.shape)}")
        check_probs(x, name)
    k, V = P.shape
    if k < 1 or V < 2:
        raise ValueError(f"P must have shape (k, V) with k >= 1 and V >= 2, got {tuple(P.shape)}")
    if tuple(Q.shape) != (k + 1, V):
        raise ValueError(f"Q must have shape (k + 1, V) = ({k + 1}, {V}) for P of shape {tuple(P.shape)}, got "
                         f"{tuple(Q.shape)}")
    if isinstance(P, torch.Tensor) != isinstance(Q, torch.Tensor):
        raise TypeError("P and Q must both be numpy arrays or both torch tensors")
    if isinstance(P, torch.Tensor) and P.device != Q.device:
        raise ValueError(f"P and Q must be on one device, got {P.device} and {Q.device}")
    return k, V


def _size(bins_at: Callable[[float], int], tv: float, alpha_part: float, power: float, max_bins: int) -> tuple[int, int]:
    """(expected draws, bins) at the fixed point of ``n = samples_needed(tv, bins)`` and ``bins = bins_at(n)``."""
    K = max_bins
    while True:
        n = samples_needed(tv, categories=max(K, 2), alpha=alpha_part, beta=1 - power)
        K2 = bins_at(n)
        if K2 >= K or K2 < 2:
            return n, K2
        K = K2


def _support_only_tv(n: int, power: float) -> float:
    """Smallest mass on outputs of probability 0 seen at least once with probability ``power`` in ``n`` draws."""
    return 1 - (1 - power) ** (1 / max(n, 1))


def check_sampler(sampler, P, Q, *, rule: Rule | None = None, tv: float = 0.02, alpha: float = 1e-3,
                  power: float = 0.9, seed: int = 0, num_samples: int | None = None, max_samples: int = 1_000_000,
                  chunk: int | None = None, max_bins: int = 32, min_expected: float = 5.0, parts=PARTS,
                  mode: str = "sample", atol: float = 1e-6) -> SamplerCheckResult:
    """Judge ``sampler`` against ``rule``'s exact law on rows ``P`` (k, V) and ``Q`` (k + 1, V) (module docstring).

    Args:
        sampler: verify's signature ``(draft_tokens (B, k) int64, draft_probs (B, k, V), verifier_probs
            (B, k + 1, V), rule, generator=torch.Generator) -> (tokens (B, k + 1) int, num_accepted (B,) int)``,
            numpy or torch out (``as_sampler`` / ``transformers_sampler`` adapt other conventions).
        P, Q: float probability rows, numpy or torch (any device: drafts, the generator and the sampler's
            inputs live there); the sampler gets them in their own dtype, the exact law reads them in float64.
        rule: the law to judge against (default ``SpS()``: lossless).
        tv, power: the design: each part detects a pooled TV of ``tv`` with probability ``power``.
        alpha: family-wise level over the parts (Holm).
        seed: seeds the drafts and the sampler's generator.
        num_samples: rows to draw (default: sized from ``tv`` and ``power``), at most ``max_samples``.
        chunk: rows per sampler call (default ``2**22 // V``, at least 1, at most 4096).
        max_bins, min_expected: pooling (module docstring).
        parts: the parts to test, a subset of ``("first", "bonus", "block")``.
        mode: ``"sample"``; ``"exact"`` (the exposed law only, no sampling); ``"both"``.
        atol: exact mode's tolerance on one entry of the law (float32 rounding is ~1e-7).

    Returns: ``SamplerCheckResult`` (unpacks to ``(statistic, pvalue)``; ``.reject``; ``.parts``; ``print``
    shows the table).
    """
    if mode not in ("sample", "exact", "both"):
        raise ValueError(f"mode must be 'sample', 'exact' or 'both', got {mode!r}")
    if mode != "exact":
        _check_signature(sampler)
    k, V = _check_rows(P, Q)
    rule = SpS() if rule is None else rule
    check_rule(rule)
    if rule.reads_head and getattr(rule, "hit", None) is None:  # bound to its hits (rule.at(hit)), its law is fixed
        raise ValueError(f"rule {rule!r} reads the verifier's LM head (reads_head): its law is not fixed by (P, Q); "
                         "pass it bound to the hits of the rows P, rule.at(hit) with hit of shape (k, V)")
    tv = check_number(tv, "tv", low=0.0, high=1.0, low_open=True, what="in (0, 1]")
    alpha = check_number(alpha, "alpha", low=0.0, high=1.0, low_open=True, high_open=True, what="in (0, 1)")
    power = check_number(power, "power", low=0.0, high=1.0, low_open=True, high_open=True, what="in (0, 1)")
    seed = check_int(seed, "seed", low=0)
    max_samples = check_int(max_samples, "max_samples", low=1)
    max_bins = check_int(max_bins, "max_bins", low=2)
    min_expected = check_number(min_expected, "min_expected", low=0.0, low_open=True, what="> 0")
    atol = check_number(atol, "atol", low=0.0, what="a finite number >= 0 (exact mode's tolerance)")
    if num_samples is not None:
        num_samples = check_int(num_samples, "num_samples", low=1)
    if chunk is not None:
        chunk = check_int(chunk, "chunk", low=1)
    if isinstance(parts, str) or not set(parts) <= set(PARTS) or not parts:
        raise ValueError(f"parts must be a non-empty subset of {PARTS}, got {parts!r}")
    parts = tuple(p for p in PARTS if p in parts)

    law = block_law(rule, P, Q)
    exact = None
    if mode in ("exact", "both"):
        exact = compare_laws(exposed_block_law(sampler, P, Q), law, atol)
    if mode == "exact":
        return SamplerCheckResult(exact.block_tv_high, 0.0 if exact.reject else 1.0, alpha, {}, {}, 0, k, V, 0, rule,
                                  tv, power, exact, 0.0, mode, _name(sampler))

    # -- the plan: which parts, their bins, N -------------------------------------------------------
    reach = float(law.length_probs()[k])
    not_testable = {}
    if "bonus" in parts and (reach <= 0 or max_samples * reach < 2 * min_expected):
        not_testable["bonus"] = ("the rule accepts all k drafts with probability 0 on these rows" if reach <= 0 else
                                 f"all k drafts are accepted with probability {reach:.3g}: {max_samples} rows (max_samples) "
                                 f"would reach the bonus {max_samples * reach:.3g} times")
    tested = [p for p in parts if p not in not_testable]
    m = len(tested)
    if m == 0:
        return SamplerCheckResult(0.0, 1.0, alpha, {}, not_testable, 0, k, V, 0, rule, tv, power, None, 0.0, mode,
                                  _name(sampler))
    alpha_part = alpha / m
    first_e, bonus_e = law.first(), law.bonus
    cands = _block_candidates(law, max_bins)
    cand_masses = np.array([c[0] for c in cands])
    sorted_first = np.sort(first_e[first_e > 0])[::-1]
    sorted_bonus = np.sort(bonus_e[bonus_e > 0])[::-1]

    def token_bins(sorted_e):
        return lambda n: _bin_count(*_keep(sorted_e, 0.0, n, max_bins, min_expected))

    bins_at = {"first": token_bins(sorted_first), "bonus": token_bins(sorted_bonus),
               "block": lambda n: _bin_count(*_keep(cand_masses, 0.0, n, max_bins, min_expected))}
    frac = {"first": 1.0, "bonus": reach, "block": 1.0}
    masses = {"first": sorted_first, "bonus": sorted_bonus, "block": cand_masses}
    need = {}
    for p in (tested if num_samples is None else ()):  # the design sizes N only when num_samples does not
        n_p, K = _size(bins_at[p], tv, alpha_part, power, max_bins)
        if K < 2:  # concentrated: the draws that fill two bins if the cap allows, else the impossible outputs only
            second = 1.0 - float(masses[p][0]) if masses[p].size > 1 else 0.0
            fill = min_expected / second if second > 0 else math.inf
            n_p = fill if fill * (1 / frac[p]) <= max_samples else math.log(1 - power) / math.log(1 - tv) if tv < 1 else 1
        if p == "bonus":  # the bonus count is random: three standard deviations of margin keep it >= n_p
            n_p += 3 * math.sqrt(n_p)
        need[p] = math.ceil(n_p / frac[p])
    N = num_samples if num_samples is not None else min(max_samples, max(need.values()))
    B = chunk if chunk is not None else int(min(4096, max(1, CHUNK_ELEMENTS // V)))
    B = min(B, N)
    pools = {}
    if "first" in tested:
        pools["first"] = _token_pool(first_e, N, max_bins, min_expected)
    if "bonus" in tested:
        pools["bonus"] = _token_pool(bonus_e, N * reach, max_bins, min_expected)
    if "block" in tested:
        pools["block"] = _block_pool(law, cands, N, max_bins, min_expected)

    # -- streaming: B rows a call; counts only --------------------------------------------------------
    is_torch = isinstance(P, torch.Tensor)
    Pt = P if is_torch else torch.from_numpy(np.ascontiguousarray(P))
    Qt = Q if is_torch else torch.from_numpy(np.ascontiguousarray(Q))
    dev = Pt.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    draw_rows = Pt.detach().double()
    counts = {p: np.zeros(len(pools[p].probs), dtype=np.int64) for p in pools}
    impossible = dict.fromkeys(pools, 0)
    n_bonus = 0
    t0 = time.perf_counter()
    for start in range(0, N, B):
        b = min(B, N - start)
        drafts = torch.stack([torch.multinomial(draw_rows[j], b, replacement=True, generator=gen) for j in range(k)], 1)
        out = sampler(drafts, Pt.unsqueeze(0).expand(b, k, V), Qt.unsqueeze(0).expand(b, k + 1, V), rule,
                      generator=gen)
        tokens, a = read_output(out, drafts.cpu().numpy(), V)
        if "first" in pools:
            ids = pools["first"].bin_of[tokens[:, 0]]
            impossible["first"] += int((ids < 0).sum())
            counts["first"] += np.bincount(ids[ids >= 0], minlength=counts["first"].size)
        full = a == k
        n_bonus += int(full.sum())
        if "bonus" in pools and full.any():
            ids = pools["bonus"].bin_of[tokens[full, k]]
            impossible["bonus"] += int((ids < 0).sum())
            counts["bonus"] += np.bincount(ids[ids >= 0], minlength=counts["bonus"].size)
        if "block" in pools:
            pool = pools["block"]
            zero = law.prob(tokens, a) <= 0
            impossible["block"] += int(zero.sum())
            rows = tokens.tolist()
            ids = np.array([pool.key_bin.get((ai, *row[:ai + 1]), pool.length_bin[ai])
                            for ai, row in zip(a.tolist(), rows, strict=True)], dtype=np.int64)
            ids = ids[~zero]
            assert ids.size == 0 or ids.min() >= 0, "a block of positive probability has no bin"  # _block_candidates
            counts["block"] += np.bincount(ids, minlength=counts["block"].size)
    seconds = time.perf_counter() - t0

    # -- the tests -----------------------------------------------------------------------------------
    raw = {}
    for p in pools:
        obs, pr = counts[p], pools[p].probs
        n_p = int(obs.sum()) + impossible[p]
        note = ""
        if n_p == 0:
            raw[p] = (0.0, 1.0, n_p, None, "no draws reached this part")
            continue
        if impossible[p]:
            stat, pv = math.inf, 0.0
        elif pr.size < 2:
            stat, pv = 0.0, 1.0
            note = "one bin: only outputs of probability 0 are tested"
        else:
            res = goodness_of_fit(obs, pr, alpha=alpha, kind="counts")
            stat, pv = res.statistic, res.pvalue
        raw[p] = (stat, pv, n_p, tv_interval(obs, pr, impossible[p]), note)
    adj = dict(zip(raw, holm([raw[p][1] for p in raw]), strict=True))
    results = {}
    for p, (stat, pv, n_p, est, note) in raw.items():
        pr = pools[p].probs
        det = (_support_only_tv(n_p, power) if pr.size < 2 else
               detectable_tv(max(n_p, 1), categories=pr.size, alpha=alpha_part, beta=1 - power))
        if not note and need.get(p, 0) > N and num_samples is None:
            note = f"capped: {need[p]} rows needed for TV {tv:g}, max_samples {max_samples}"
        results[p] = PartResult(p, float(stat), float(pv), float(adj[p]), alpha, n_p, pools[p].names, counts[p],
                                n_p * pr if n_p else np.zeros_like(pr), impossible[p], est, float(det), note)
    if "bonus" in parts and "bonus" not in not_testable and n_bonus == 0:
        not_testable["bonus"] = f"no row of {N} accepted all {k} drafts"
    best = min(results.values(), key=lambda r: r.holm)
    pvalue = best.holm
    if exact is not None and exact.reject:
        pvalue = 0.0
    return SamplerCheckResult(best.statistic, pvalue, alpha, results, not_testable, N, k, V, B, rule, tv, power, exact,
                              seconds, mode, _name(sampler), num_samples is None)


# -- adapters: other samplers' conventions to verify's -------------------------------------------------

def _same_row(x: torch.Tensor) -> bool:
    """``x`` repeats one row along its batch axis (an expanded view, stride 0): convert it once, not per row."""
    return x.shape[0] == 1 or x.stride(0) == 0


class _Adapted:
    """A callable with verify's signature around ``fn`` (see ``as_sampler``)."""

    def __init__(self, fn, inputs: str, batch: int | None, rng: str, takes_rule: bool):
        self.fn, self.inputs, self.batch, self.rng, self.takes_rule = fn, inputs, batch, rng, takes_rule
        self.__qualname__ = f"as_sampler({_name(fn)})"

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x) if self.inputs == "logits" else x

    def _call(self, d, p, q, rule, gen):
        args = (d, p, q, rule) if self.takes_rule else (d, p, q)
        return self.fn(*args) if self.rng == "global" else self.fn(*args, generator=gen)

    def __call__(self, draft_tokens, draft_probs, verifier_probs, rule=None, generator=None):
        if self.rng == "global" and generator is not None:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
            devices = [generator.device] if generator.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                return self._run(draft_tokens, draft_probs, verifier_probs, rule, generator)
        return self._run(draft_tokens, draft_probs, verifier_probs, rule, generator)

    def _run(self, d, p, q, rule, gen):
        if self.batch is None:
            return self._call(d, self._convert(p), self._convert(q), rule, gen)
        B, k = d.shape
        tokens = np.full((B, k + 1), -1, dtype=np.int64)
        num = np.zeros(B, dtype=np.int64)
        shared = _same_row(p) and _same_row(q)
        p1, q1 = (self._convert(p[:1]), self._convert(q[:1])) if shared else (None, None)
        for b in range(B):
            pb, qb = (p1, q1) if shared else (self._convert(p[b:b + 1]), self._convert(q[b:b + 1]))
            tokens[b], num[b] = _one_row(self._call(d[b:b + 1], pb, qb, rule, gen), k, b)
        return tokens, num


def _one_row(out, k: int, b: int) -> tuple[np.ndarray, int]:
    """One batch-1 call's output, ``(tokens (1, m + 1) or (m + 1,) or padded to k + 1, num_accepted scalar / 0-d /
    (1,))``, as a padded (k + 1,) row and ``m``."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = f"a {type(out).__name__} of length {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
        raise TypeError(f"sampler (batch 1, row {b}) must return (tokens, num_accepted), got {got}")
    t = _as_int_array(out[0] if isinstance(out[0], (np.ndarray, torch.Tensor)) else np.asarray(out[0]), "tokens")
    nm = out[1]
    nm = _as_int_array(nm if isinstance(nm, (np.ndarray, torch.Tensor)) else np.asarray(nm), "num_accepted")
    if nm.size != 1:
        raise ValueError(f"sampler output num_accepted (batch 1, row {b}) must be one number, got shape {nm.shape}")
    m = int(nm.reshape(()))
    t = t.reshape(-1) if t.ndim == 2 and t.shape[0] == 1 else t
    if t.ndim != 1 or not 1 <= t.size <= k + 1:
        raise ValueError(f"sampler output tokens (batch 1, row {b}) must have shape (1, m + 1) or (m + 1,) with "
                         f"m <= k = {k}, got {tuple(t.shape)}")
    if not 0 <= m <= k:
        raise ValueError(f"sampler output num_accepted (batch 1, row {b}) must be in [0, k] = [0, {k}], got {m}")
    if t.size < m + 1:
        raise ValueError(f"sampler output tokens (batch 1, row {b}) has {t.size} tokens for num_accepted {m} "
                         f"(expected m + 1 = {m + 1})")
    row = np.full(k + 1, -1, dtype=np.int64)
    row[:t.size] = t
    return row, m


def as_sampler(fn, *, inputs: str = "probs", batch: int | None = None, rng: str = "generator",
               takes_rule: bool = True):
    """``fn`` with verify's signature, for ``check_sampler``.

    ``inputs="logits"``: ``fn`` takes logits: it gets ``log(draft_probs)``, ``log(verifier_probs)`` (``-inf``
    where a probability is 0; ``softmax`` gives the rows back). ``batch=1``: ``fn`` handles one row: it is
    called row by row and its outputs, ``(1, m + 1)`` or ``(m + 1,)`` tokens and a scalar count, are padded
    into ``(B, k + 1)`` with -1 (a repeated row is converted once per chunk). ``rng="global"``: ``fn`` draws
    from torch's global RNG and takes no ``generator``: the adapter seeds the global RNG from the generator on
    each call and restores the caller's RNG state afterwards (``torch.random.fork_rng``). ``takes_rule=False``:
    ``fn`` has no ``rule`` argument (its law is what it is; ``check_sampler``'s ``rule`` is the law it is
    judged against). numpy or torch outputs are both read."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if inputs not in ("probs", "logits"):
        raise ValueError(f"inputs must be 'probs' or 'logits', got {inputs!r}")
    if batch not in (None, 1):
        raise ValueError(f"batch must be None (any batch) or 1, got {batch!r}")
    if rng not in ("generator", "global"):
        raise ValueError(f"rng must be 'generator' or 'global', got {rng!r}")
    return _Adapted(fn, inputs, batch, rng, bool(takes_rule))


class TransformersSampler:
    """transformers' ``_speculative_sampling`` (``transformers/generation/utils.py``) with verify's
    signature, and its exact law for ``check_sampler(..., mode="exact")``.

    The call: per row (it handles batch 1), ``candidate_input_ids = draft_tokens[b:b + 1]``,
    ``candidate_logits = log(draft_probs[b:b + 1])``, ``candidate_length = k``, ``new_logits =
    log(verifier_probs[b:b + 1])`` (float32, as ``generate`` passes them), ``assistant_ensemble_weight``;
    torch's global RNG seeded from the generator (and restored). Its output ``(1, m + 1)`` tokens and a 0-d
    count are padded. transformers' notation is the reverse of ours: its ``p`` is our ``q``.

    Its law, read from that code (our notation): ratio ``rho_n = q_n / p_n`` (with a weight ``w``:
    ``1 - w + w rho_n``) in float32 from the softmaxed rows; ``r = torch.rand_like`` in float32 is uniform
    on ``{m 2**-24 : 0 <= m < 2**24}``. transformers 5.24 accepts iff ``r <= rho_n``, so ``phi_n = min(1,
    (floor(rho_n 2**24) + 1) / 2**24)``: SpS's ``min(1, q_n / p_n)`` rounded up to the grid, and ``2**-24``
    (not 0) when ``q_n = 0``; 5.25 accepts iff ``r < rho_n``, so ``phi_n = min(1, ceil(rho_n 2**24) / 2**24)``,
    0 when ``q_n = 0``. Which comparison ``fn`` makes is not read from a version number but probed once
    (``accepts_at_equality``: ``fn`` called on a ``q_n = 0`` draft with ``torch.rand_like`` returning 0).
    Recovery from ``clamp(q - p, 0)`` normalised, whichever draft was rejected (with a weight and a residual
    that sums to ``<= tiny``: ``q`` itself); bonus from ``q`` of row ``k``. Judged against ``SpS()`` without a
    weight, against ``Ensemble(w)`` with one (``h = w q + (1 - w) p``); a 5.24 function without a weight against
    ``SpS(rand_bits=24)``, the law of its ``r <= rho``."""

    def __init__(self, fn=None, assistant_ensemble_weight: float | None = None):
        if fn is None:
            from transformers.generation.utils import _speculative_sampling as fn
        if not callable(fn):
            raise TypeError(f"fn must be transformers' _speculative_sampling (callable), got {type(fn).__name__}")
        if assistant_ensemble_weight is not None:
            check_number(assistant_ensemble_weight, "assistant_ensemble_weight", low=0.0, high=1.0, low_open=True,
                         high_open=True, what="in (0, 1)")
        self.fn, self.weight = fn, assistant_ensemble_weight
        self._at_equality = None
        self.__qualname__ = f"transformers_sampler({_name(fn)}, assistant_ensemble_weight={assistant_ensemble_weight})"

    def __call__(self, draft_tokens, draft_probs, verifier_probs, rule=None, generator=None):
        B, k = draft_tokens.shape
        tokens = np.full((B, k + 1), -1, dtype=np.int64)
        num = np.zeros(B, dtype=np.int64)
        ctx = torch.random.fork_rng(devices=[generator.device] if generator is not None and generator.device.type == "cuda"
                                    else [])
        with ctx:
            if generator is not None:
                torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)))
            shared = _same_row(draft_probs) and _same_row(verifier_probs)
            lp = torch.log(draft_probs[:1]).float() if shared else None
            lq = torch.log(verifier_probs[:1]).float() if shared else None
            for b in range(B):
                if not shared:
                    lp, lq = torch.log(draft_probs[b:b + 1]).float(), torch.log(verifier_probs[b:b + 1]).float()
                out = self.fn(draft_tokens[b:b + 1], lp, k, lq, assistant_ensemble_weight=self.weight)
                tokens[b], num[b] = _one_row(out, k, b)
        return tokens, num

    @property
    def accepts_at_equality(self) -> bool:
        """Whether ``fn`` accepts a draft when the uniform equals the ratio (``r <= rho``, transformers 5.24)
        or not (``r < rho``, 5.25), found by calling ``fn`` once: a draft with ``q_n = 0`` (ratio 0) and
        ``torch.rand_like`` patched to return 0 (``torch``'s attribute, restored afterwards; not thread-safe)."""
        if self._at_equality is None:
            from unittest import mock

            draft = torch.tensor([[[0.5, 0.5]]]).log()
            verifier = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]]).log()  # token 0 impossible for the verifier
            with mock.patch.object(torch, "rand_like", lambda x, **kw: torch.zeros_like(x)), torch.random.fork_rng(devices=[]):
                out = self.fn(torch.tensor([[0]]), draft, 1, verifier, assistant_ensemble_weight=None)
            self._at_equality = int(_one_row(out, 1, 0)[1]) == 1
        return self._at_equality

    # -- the exposed law (exact mode), our notation: p draft, q verifier, float64 numpy rows ------------
    @staticmethod
    def _rows32(x: np.ndarray) -> np.ndarray:
        """A row as transformers sees it: ``softmax(log x)`` in float32."""
        return torch.log(torch.from_numpy(np.asarray(x, np.float64))).float().softmax(-1).numpy()

    def _phi(self, p32: np.ndarray, q32: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = (q32 / p32).astype(np.float32)
            if self.weight is not None:
                ratio = (np.float32(1.0 - self.weight) + np.float32(self.weight) * ratio).astype(np.float32)
        grid = 2.0 ** TORCH_RAND_BITS
        m = np.minimum(ratio.astype(np.float64), 1.0) * grid  # exact: a float32 times a power of two
        hits = np.floor(m) + 1 if self.accepts_at_equality else np.ceil(m)  # grid points r with r <= / < rho
        return np.where(np.isnan(ratio), 0.0, np.minimum(1.0, hits / grid))  # a comparison with NaN is False

    def _recovery(self, p32: np.ndarray, q32: np.ndarray) -> np.ndarray:
        r = np.clip(q32 - p32, 0, None)
        s = r.sum(-1, keepdims=True, dtype=np.float32)
        if self.weight is not None:
            r = np.where(s <= np.finfo(np.float32).tiny, q32, r / np.where(s > 0, s, 1))
        else:
            r = r / s
        return r.astype(np.float64)

    def accept_prob(self, p, q, n):
        p32, q32 = self._rows32(p), self._rows32(q)
        rows = np.arange(p32.shape[0])
        return self._phi(p32[rows, n], q32[rows, n])

    def residual(self, p, q, n):
        return self._recovery(self._rows32(p), self._rows32(q))

    def step_parts(self, p, q):
        """(acc, rej) of one position (V,) each: the recovery law does not depend on the rejected draft."""
        p32, q32 = self._rows32(p), self._rows32(q)
        phi = self._phi(p32, q32)
        acc = p * phi
        return acc, (1 - acc.sum()) * self._recovery(p32, q32)

    def bonus_law(self, q):
        return self._rows32(q).astype(np.float64)


def transformers_sampler(fn=None, *, assistant_ensemble_weight: float | None = None) -> TransformersSampler:
    """transformers' ``_speculative_sampling`` as a sampler for ``check_sampler``, in one line::

        from transformers.generation.utils import _speculative_sampling
        ct.check_sampler(transformers_sampler(_speculative_sampling), P, Q)            # against SpS
        ct.check_sampler(transformers_sampler(_speculative_sampling), P, Q, mode="exact")
        ct.check_sampler(transformers_sampler(assistant_ensemble_weight=0.7), P, Q, rule=ct.Ensemble(0.7))

    ``fn`` defaults to the installed transformers' function (see ``TransformersSampler``)."""
    return TransformersSampler(fn, assistant_ensemble_weight)
