"""Finite-sample upper confidence bounds for equivalence: "TV <= eps at confidence 1 - alpha".

**Next-token TV between two samples** (``tv_upper_bound``). Side ``a`` has draws from ``p_a``, side ``b`` from
``p_b``, over any (possibly huge or unknown) alphabet. Each side's draws are split in two halves independent of
their values (by decode index: the draws are i.i.d. given the prefix, so any value-blind split is). The
*selection* half picks a set ``S`` of categories (the most frequent of both sides, ``|S| <= max_bins - 1``);
``R`` is every other category. For every ``S``::

    2 TV(p_a, p_b) = sum_i |p_a(i) - p_b(i)|  <=  L(p_a, p_b) := sum_{i in S} |p_a(i) - p_b(i)| + p_a(R) + p_b(R)

and ``L`` is 1-Lipschitz in each argument for the L1 norm of the pooled law ``pi(p)`` on the ``K = |S| + 1``
cells (``S`` one by one, ``R`` as one cell), by the triangle inequality. On the *fit* half (``m_a``, ``m_b``
draws, independent of ``S``), the L1 deviation inequality of Weissman, Ordentlich, Seroussi, Verdu and
Weinberger (2003, HP Labs HPL-2003-97, Theorem 2.1)::

    P(||pi(p_hat) - pi(p)||_1 >= e) <= (2^K - 2) exp(-m e^2 / 2),   so   e(m, K, d) = sqrt(2 (ln(2^K - 2) + ln(1/d)) / m)

holds with probability ``>= 1 - d`` for ``m`` draws. With ``d = delta / 4`` per side, with probability
``>= 1 - delta / 2``::

    TV(p_a, p_b) <= U_W := L(p_hat_a, p_hat_b) / 2 + (e(m_a, K, delta/4) + e(m_b, K, delta/4)) / 2

A second bound, sharper where cells are rare (a near-deterministic prefix): Clopper-Pearson intervals
``[lo, hi]`` for each of the ``2K`` pooled cells, each at error ``delta / (4K)``, hold together with probability
``>= 1 - delta / 2``, and then ``L(p_a, p_b) <= sum_{i in S} max(hi_a(i) - lo_b(i), hi_b(i) - lo_a(i)) + hi_a(R) +
hi_b(R) =: 2 U_CP``. By the union bound over the two, ``TV <= U := min(1, U_W, U_CP)`` with probability
``>= 1 - delta``. ``S`` is chosen on the selection half as the prefix of the frequency order minimising the
Weissman expression there (with the fit halves' sizes): a choice blind to the fit half, so the bound stays valid.

**Answer-level difference** (``score_upper_bound``): scores in ``[0, 1]``, ``N`` per side (any mix of prompts,
the same prompts on both sides). ``d_hat = mean_a - mean_b`` is a mean of ``2N`` independent terms, each in a
range of ``1/N``; Hoeffding's inequality gives ``P(|d_hat - d| >= t) <= 2 exp(-N t^2)``, so
``|d| <= |d_hat| + sqrt(ln(2/delta) / N)`` with probability ``>= 1 - delta``. For a 0/1 score, ``|d|`` is the TV
between the two laws of "the answer is correct".
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["l1_deviation", "tv_upper_bound", "score_upper_bound", "scale_needed"]


def l1_deviation(m: float, K: int, delta: float) -> float:
    """``e = sqrt(2 (ln(2^K - 2) + ln(1/delta)) / m)``: ``P(||p_hat - p||_1 >= e) <= delta`` for ``m`` draws over
    ``K >= 2`` cells (Weissman et al. 2003); ``inf`` for ``m = 0``."""
    if m <= 0:
        return math.inf
    log_cells = K * math.log(2) + math.log1p(-2.0 ** (1 - K))  # ln(2^K - 2) without overflow
    return math.sqrt(2 * (log_cells - math.log(delta)) / m)


def _plug_in(fa: np.ndarray, fb: np.ndarray, j: int) -> float:
    """``L / 2`` on frequencies ``fa``, ``fb`` (ordered) with ``S`` the first ``j`` categories."""
    return 0.5 * (float(np.abs(fa[:j] - fb[:j]).sum()) + float(fa[j:].sum()) + float(fb[j:].sum()))


def _freq(counts: dict, cats: list) -> np.ndarray:
    x = np.array([counts.get(c, 0) for c in cats], dtype=np.float64)
    return x / x.sum() if x.sum() > 0 else x


def tv_upper_bound(sel_a: dict, sel_b: dict, fit_a: dict, fit_b: dict, delta: float, max_bins: int = 16
                   ) -> tuple[float, float, float]:
    """``U`` (module docstring) from category counts ``{category: count}`` of the selection and fit halves of
    each side: ``(U, plug-in L / 2 on the fit half, U - plug-in)``; the last two let ``scale_needed`` say how many
    draws would bring ``U`` under a target. ``(1, 1, inf)`` when a fit half is empty."""
    m_a, m_b = sum(fit_a.values()), sum(fit_b.values())
    if m_a == 0 or m_b == 0:
        return 1.0, 1.0, math.inf
    cats = sorted(set(sel_a) | set(sel_b) | set(fit_a) | set(fit_b))
    sa, sb = _freq(sel_a, cats), _freq(sel_b, cats)
    order = sorted(range(len(cats)), key=lambda i: (-(sa[i] + sb[i]), cats[i]))
    cats = [cats[i] for i in order]
    sa, sb = sa[order], sb[order]

    def margin(j: int) -> float:  # Weissman's, at error delta / 2 (the other half: the Clopper-Pearson box)
        return 0.5 * (l1_deviation(m_a, j + 1, delta / 4) + l1_deviation(m_b, j + 1, delta / 4))

    top = max(1, min(len(cats), max_bins - 1))
    j = min(range(1, top + 1), key=lambda j: _plug_in(sa, sb, j) + margin(j))
    fa, fb = _freq(fit_a, cats), _freq(fit_b, cats)
    plug = _plug_in(fa, fb, j)
    ka = np.array([fit_a.get(c, 0) for c in cats], dtype=np.int64)
    kb = np.array([fit_b.get(c, 0) for c in cats], dtype=np.int64)
    u = min(1.0, plug + margin(j), _box_bound(ka, kb, j, delta / 2))
    return u, plug, max(u - plug, 0.0)


def _clopper_pearson(k: np.ndarray, m: int, d: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact (Clopper-Pearson) intervals for cell probabilities from counts ``k`` of ``m`` draws, each at error
    ``d``: ``[Beta(d/2; k, m - k + 1), Beta(1 - d/2; k + 1, m - k)]``, 0 / 1 at ``k = 0`` / ``k = m``."""
    from scipy import stats as sps

    lo = sps.beta.ppf(d / 2, np.maximum(k, 1), m - k + 1)
    hi = sps.beta.ppf(1 - d / 2, k + 1, np.maximum(m - k, 1))
    return np.where(k > 0, lo, 0.0), np.where(k < m, hi, 1.0)


def _box_bound(ka: np.ndarray, kb: np.ndarray, j: int, d: float) -> float:
    """``max L / 2`` over the box of Clopper-Pearson intervals of the ``K = j + 1`` pooled cells of each side
    (``S`` the first ``j`` categories, ``R`` the rest), each at error ``d / (2K)``: with probability ``>= 1 - d``
    every interval holds, and then ``|p_a(i) - p_b(i)| <= max(hi_a - lo_b, hi_b - lo_a)`` and ``p(R) <= hi(R)``."""
    K = j + 1
    cells_a, cells_b = np.append(ka[:j], ka[j:].sum()), np.append(kb[:j], kb[j:].sum())
    lo_a, hi_a = _clopper_pearson(cells_a, int(ka.sum()), d / (2 * K))
    lo_b, hi_b = _clopper_pearson(cells_b, int(kb.sum()), d / (2 * K))
    spread = np.maximum(np.maximum(hi_a[:j] - lo_b[:j], hi_b[:j] - lo_a[:j]), 0.0)
    return min(1.0, 0.5 * (float(spread.sum()) + float(hi_a[j]) + float(hi_b[j])))


def score_upper_bound(scores_a: np.ndarray, scores_b: np.ndarray, delta: float) -> tuple[float, float, float]:
    """``(U, |d_hat|, t)`` with ``U = min(1, |d_hat| + t)``, ``t = sqrt(ln(2 / delta) / N)`` (module docstring);
    scores in [0, 1], ``N`` per side."""
    N = scores_a.size
    d = abs(float(scores_a.mean() - scores_b.mean()))
    t = math.sqrt(math.log(2 / delta) / N)
    return min(1.0, d + t), d, t


def scale_needed(plug: float, margin: float, eps: float) -> float:
    """Factor on the draws that brings ``plug + margin`` under ``eps`` if the observed frequencies stay, the margin
    taken to shrink as ``1 / sqrt(draws)`` (Weissman's rate; on rare cells the Clopper-Pearson box shrinks faster,
    so the factor errs high): ``(margin / (eps - plug))^2``; ``inf`` when ``plug >= eps``."""
    if plug >= eps or not math.isfinite(margin):
        return math.inf
    return (margin / (eps - plug)) ** 2
