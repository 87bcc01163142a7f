"""What Cactus costs at another rule's acceptance, and what it accepts at that rule's cost.

For a rule ``r`` and rows ``(p, q)`` (..., V), with means over the rows as in figure c:

    a_r = mean_rows sum_n p_n phi_n            (acceptance, ``exact.acceptance_rate``)
    c_r = mean_rows D(h_alg || q)              (cost, ``exact.step_divergence``)

``matched_cactus`` finds the Cactus budget whose acceptance equals ``a_r`` (and reports Cactus's cost
there) and the budget whose cost equals ``c_r`` (and reports Cactus's acceptance there). Both are
monotone in ``delta`` for Cactus (``gamma*`` grows with ``delta``), so each is one bisection on
``log delta``; the ends are ``delta = 0`` (SpS) and a budget large enough that every draft is
accepted (then ``h_alg = p``), beyond which Cactus neither gains nor costs more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.budget import CactusRows
from ..core.divergences import kl
from ..core.exact import acceptance_rate, induced_rows, step_divergence
from ..core.rules import Cactus, Rule
from ..core.validate import check_pqn

__all__ = ["MatchedResult", "matched_cactus", "mean_cost", "EqualKL", "cactus_at_kl", "cactus_rows_law", "delta_grid",
           "DELTA_MAX", "cactus_at_mean_kl", "grid_kl"]


@dataclass(frozen=True)
class MatchedResult:
    """``accept``, ``cost``: the rule's mean acceptance and mean ``D(h_alg || q)``;
    ``delta_at_accept``, ``cactus_cost``: the Cactus budget with the same acceptance and its cost
    (``nan`` if even SpS accepts more, ``inf`` if only accepting every draft matches it); ``delta_at_cost``, ``cactus_accept``: the budget with the
    same cost and its acceptance (``inf`` budget where the rule costs more than Cactus ever does)."""

    accept: float
    cost: float
    delta_at_accept: float
    cactus_cost: float
    delta_at_cost: float
    cactus_accept: float
    divergence: str


def mean_cost(rule: Rule, p, q, divergence: str = "kl") -> float:
    """Mean over rows of ``D(h_alg || q)``; ``inf`` if any row's cost is infinite."""
    return float(np.mean(step_divergence(rule, p, q, divergence)))


def _bisect(f, target: float, lo: float, hi: float, iters: int = 60) -> float:
    """``delta`` in ``[lo, hi]`` with ``f(delta) ~ target`` for increasing ``f``, bisecting ``log delta``."""
    a, b = math.log(lo), math.log(hi)
    for _ in range(iters):
        m = (a + b) / 2
        if f(math.exp(m)) < target:
            a = m
        else:
            b = m
    return math.exp((a + b) / 2)


def matched_cactus(rule: Rule, p, q, divergence: str = "kl", *, delta_lo: float = 1e-8,
                   delta_hi: float = 1e4) -> MatchedResult:
    """Cactus (KL budget, Corollary 5) matched to ``rule`` on rows ``(p, q)``; see the module doc.

    ``divergence`` is the cost's divergence (``kl``, ``tv``, ...); Cactus's own budget is always KL.
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    accept = float(np.mean(acceptance_rate(rule, p, q)))
    cost = mean_cost(rule, p, q, divergence)

    def acc(d):
        return float(np.mean(acceptance_rate(Cactus(d), p, q, check=False)))

    def cst(d):
        return mean_cost(Cactus(d), p, q, divergence)

    # acceptance matched
    if accept <= acc(0.0) + 1e-12:
        d_a = 0.0 if abs(accept - acc(0.0)) <= 1e-12 else math.nan
    elif accept >= acc(delta_hi) - 1e-12:
        d_a = math.inf  # Cactus reaches this acceptance only as delta -> inf (every draft kept)
    else:
        d_a = _bisect(acc, accept, delta_lo, delta_hi)
    c_a = cst(min(d_a, delta_hi)) if not math.isnan(d_a) else math.nan
    # cost matched
    top = cst(delta_hi)
    if cost <= 0:
        d_c = 0.0
    elif cost >= top:
        d_c = math.inf  # the rule costs at least what accepting every draft costs Cactus
    else:
        d_c = _bisect(cst, cost, delta_lo, delta_hi)
    a_c = acc(min(d_c, delta_hi))
    return MatchedResult(accept, cost, d_a, c_a, d_c, a_c, divergence)


# -- Cactus at equal KL, pair by pair ----------------------------------------------------------------------------

DELTA_MAX = 1e300
"""The top of the budget grid: Corollary 5's ``gamma* = 1`` (every draft with ``q_n > 0`` accepted) for
``delta >= (1 - q_n) / (2 q_n)``, which ``DELTA_MAX`` reaches for every ``q_n >= 5e-301``."""


def delta_grid(per_decade: int = 4, lo_decade: int = -10, hi_decade: int = 300) -> np.ndarray:
    """``{0}`` and ``10^(j / per_decade)``, ``j = lo_decade per_decade ... hi_decade per_decade``: the budgets
    ``cactus_at_kl`` scans (the default ends at ``DELTA_MAX``)."""
    if isinstance(per_decade, bool) or not isinstance(per_decade, (int, np.integer)) or per_decade < 1:
        raise ValueError(f"per_decade must be a positive integer, got {per_decade!r}")
    if not (isinstance(lo_decade, (int, np.integer)) and isinstance(hi_decade, (int, np.integer))
            and lo_decade < hi_decade <= 300):
        raise ValueError(f"lo_decade < hi_decade <= 300 (integers) required, got {lo_decade!r}, {hi_decade!r}")
    j = np.arange(lo_decade * per_decade, hi_decade * per_decade + 1)
    return np.concatenate([[0.0], 10.0 ** (j / per_decade)])


@dataclass(frozen=True)
class EqualKL:
    """Cactus's comparison points: ``delta`` the largest budget on the scanned path whose step KL is within
    tolerance of the target, ``kl`` and ``accept`` Cactus's ``KL(h_alg || q)`` and acceptance there (the target's
    shape); ``monotone`` (R,) whether each row's KL was non-decreasing along the grid (up to round-off)."""

    delta: np.ndarray
    kl: np.ndarray
    accept: np.ndarray
    monotone: np.ndarray


def cactus_rows_law(p: np.ndarray, q: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(KL(h_alg || q), acceptance)`` (R,) of Cactus (Corollary 5, KL budget) with one ``delta`` per row of
    ``(p, q)`` (R, V): ``exact.induced_rows`` of ``budget.CactusRows`` on each row cut to its union support
    (tokens with ``p_i = q_i = 0`` carry nothing in the law, the KL or the acceptance), rows of one support size
    together; no input checks."""
    delta = np.broadcast_to(np.asarray(delta, dtype=np.float64), p.shape[:1])
    live = (p > 0) | (q > 0)
    width = live.sum(axis=1)
    k, a = np.empty(p.shape[0]), np.empty(p.shape[0])
    for w in np.unique(width):
        rows = np.flatnonzero(width == w)
        pc, qc = p[rows][live[rows]].reshape(rows.size, w), q[rows][live[rows]].reshape(rows.size, w)
        rule = CactusRows(delta=np.ascontiguousarray(delta[rows]))
        k[rows] = kl(induced_rows(rule, pc, qc, check=False), qc)
        a[rows] = np.sum(pc * rule.accept_prob_all(pc, qc), axis=-1)
    return k, a


def grid_kl(p: np.ndarray, q: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Cactus's ``KL(h_alg || q)`` (R, G) of each row of ``(p, q)`` (R, V) at every budget of ``grid`` (G,). Past
    ``4 max_n (1 - q_n) / (2 q_n)`` over ``q_n > 0`` every ``gamma*`` is exactly 1 (the boost is at least twice
    ``1 - q_n``; ``q_n = 0`` stays 0), so a row's law no longer moves: it is computed up to the first such budget
    and repeated after it."""
    out = np.empty((p.shape[0], grid.size))
    for i in range(p.shape[0]):
        pos = q[i][q[i] > 0]
        with np.errstate(divide="ignore"):
            sat = 4 * float(np.max((1 - pos) / (2 * pos))) if pos.size else 0.0
        stop = min(int(np.searchsorted(grid, sat, side="left")), grid.size - 1) + 1
        k, _ = cactus_rows_law(np.broadcast_to(p[i], (stop, p.shape[1])), np.broadcast_to(q[i], (stop, q.shape[1])),
                               grid[:stop])
        out[i, :stop], out[i, stop:] = k, k[-1]
    return out


def _checked(p, q, grid, bisections) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.ndim != 2 or p.shape != q.shape:
        raise ValueError(f"p and q must be (R, V) arrays of one shape, got {p.shape} and {q.shape}")
    check_pqn(p, q)
    grid = delta_grid() if grid is None else np.asarray(grid, dtype=np.float64)
    if grid.ndim != 1 or grid.size < 2 or grid[0] != 0 or np.any(np.diff(grid) <= 0) or not np.isfinite(grid[-1]):
        raise ValueError("grid must be increasing finite budgets starting at 0")
    if isinstance(bisections, bool) or not isinstance(bisections, (int, np.integer)) or bisections < 0:
        raise ValueError(f"bisections must be an integer >= 0, got {bisections!r}")
    return p, q, grid


def _bisect_cells(lo: np.ndarray, hi: np.ndarray, within, bisections: int) -> np.ndarray:
    """Halve each cell ``[lo, hi]`` ``bisections`` times (``log delta``; ``delta`` itself where ``lo = 0``), keeping
    ``lo`` within tolerance (``within(mid, index) -> bool array``); halvings that no longer move a float end stop."""
    lo, hi = lo.copy(), hi.copy()
    for _ in range(bisections):
        with np.errstate(divide="ignore"):
            mid = np.where(lo > 0, np.exp((np.log(lo) + np.log(hi)) / 2), (lo + hi) / 2)
        m = np.flatnonzero((mid > lo) & (mid < hi))  # a closed cell (lo = hi: the grid's end) never moves
        if not m.size:
            break
        good = within(mid[m], m)
        lo[m] = np.where(good, mid[m], lo[m])
        hi[m] = np.where(good, hi[m], mid[m])
    return lo


def cactus_at_kl(p, q, target, *, grid: np.ndarray | None = None, rtol: float = 1e-9, atol: float = 1e-12,
                 bisections: int = 100) -> EqualKL:
    """Cactus at the KL of other rules, pair by pair.

    For each row ``i`` of ``(p, q)`` (R, V) and each target ``k = target[i, s]`` ((R,) or (R, S); ``inf``
    allowed): ``delta*`` = the largest budget with ``KL(h_alg^Cactus(delta) || q) <= k (1 + rtol) + atol``,
    found on ``grid`` (default ``delta_grid()``, from 0 to ``DELTA_MAX``) and refined by ``bisections`` halvings
    of ``log delta`` (of ``delta`` in a first cell starting at 0) between the last grid budget within tolerance
    and the next one. Cactus's acceptance is non-decreasing in ``delta`` (``gamma*`` grows with it), so ``accept``
    is the most Cactus accepts at no more KL than ``k`` along that path; a KL that dips inside one grid cell is
    not seen (``monotone`` (R,) flags rows whose KL decreases anywhere along the grid, beyond 1e-12 + 1e-9 of its
    value).
    """
    p, q, grid = _checked(p, q, grid, bisections)
    target = np.asarray(target, dtype=np.float64)
    t2 = target[:, None] if target.ndim == 1 else target
    if t2.ndim != 2 or t2.shape[0] != p.shape[0] or np.any(np.isnan(t2)) or np.any(t2 < 0):
        raise ValueError(f"target must be (R,) or (R, S) with R = {p.shape[0]}: KL values >= 0 (inf allowed), got "
                         f"shape {target.shape}")
    R, S, G = p.shape[0], t2.shape[1], grid.size
    K = grid_kl(p, q, grid)  # (R, G)
    monotone = np.all(np.diff(K, axis=1) >= -(1e-12 + 1e-9 * np.abs(K[:, :-1])), axis=1)
    thr = (t2 * (1 + rtol) + atol).ravel()  # (R S,), row-major: row i's targets together
    # one search per distinct (row, target): settings that share a pair's KL (a rule that is SpS there) share it
    row = np.repeat(np.arange(R), S)
    (row_u, thr_u), back = np.unique(np.stack([row.astype(np.float64), thr]), axis=1, return_inverse=True)
    row_u, back = row_u.astype(np.int64), back.reshape(-1)
    within = K[row_u] <= thr_u[:, None]  # (U, G); delta = 0 (SpS, KL 0) always is
    last = G - 1 - np.argmax(within[:, ::-1], axis=1)
    P, Q = p[row_u], q[row_u]
    lo = _bisect_cells(grid[last], grid[np.minimum(last + 1, G - 1)],
                       lambda mid, m: cactus_rows_law(P[m], Q[m], mid)[0] <= thr_u[m], bisections)
    k, a = cactus_rows_law(P, Q, lo)
    return EqualKL(*(x[back].reshape(target.shape) for x in (lo, k, a)), monotone)


def cactus_at_mean_kl(p, q, target, *, grid: np.ndarray | None = None, rtol: float = 1e-9, atol: float = 1e-12,
                      bisections: int = 100) -> EqualKL:
    """One budget for every row: for each target ``k`` (a scalar or (S,), ``inf`` allowed) the largest ``delta``
    whose mean over rows of ``KL(h_alg^Cactus(delta) || q)`` is within ``k (1 + rtol) + atol``, by the search of
    ``cactus_at_kl`` on the mean; ``kl`` and ``accept`` are the means over rows there (the target's shape)."""
    p, q, grid = _checked(p, q, grid, bisections)
    target = np.asarray(target, dtype=np.float64)
    t1 = target.reshape(-1)
    if target.ndim > 1 or np.any(np.isnan(t1)) or np.any(t1 < 0):
        raise ValueError(f"target must be a KL value >= 0 or a 1-d array of them (inf allowed), got {target!r}")
    K = grid_kl(p, q, grid)
    mean = K.mean(axis=0)
    thr = t1 * (1 + rtol) + atol
    G, R = grid.size, p.shape[0]
    last = G - 1 - np.argmax((mean[None, :] <= thr[:, None])[:, ::-1], axis=1)  # delta = 0 always within

    def means(d):  # (S,) budgets -> mean KL and mean acceptance over rows at each
        k, a = cactus_rows_law(np.tile(p, (d.size, 1)), np.tile(q, (d.size, 1)), np.repeat(d, R))
        return k.reshape(d.size, R).mean(axis=1), a.reshape(d.size, R).mean(axis=1)

    lo = _bisect_cells(grid[last], grid[np.minimum(last + 1, G - 1)], lambda mid, m: means(mid)[0] <= thr[m],
                       bisections)
    k, a = means(lo)
    monotone = np.all(np.diff(K, axis=1) >= -(1e-12 + 1e-9 * np.abs(K[:, :-1])), axis=1)
    return EqualKL(lo.reshape(target.shape), k.reshape(target.shape), a.reshape(target.shape), monotone)
