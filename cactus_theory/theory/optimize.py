"""cvxpy cross-checks of the theory: the constrained target problem (Theorem 2), the maximal-coupling
LP (Theorem 1) and a multi-start search for Theorem 3's ``Gamma(delta)``.

Notation: ``p`` draft, ``q`` verifier, ``n`` drafted token, ``h`` target, ``gamma = h_n``, ``delta``
the divergence budget. Everything here is float64 numpy and meant for small vocabularies.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import cvxpy as cp
import numpy as np
from scipy.optimize import minimize
from scipy.special import softmax

from ..core.divergences import F_DIVERGENCES
from ..core.divergences import kl as _kl
from ..core.exact import induced_distribution
from ..core.rules import Cactus, Rule
from ..core.validate import (
    check_nonneg,
    check_positive_int,
    check_probs,
    check_same_shape,
    check_token,
)

__all__ = ["TargetResult", "CouplingResult", "GammaSearchResult", "solve_target", "max_acceptance",
           "MultiCouplingResult", "MultiBoundResult", "MultiTargetResult", "multi_draft_acceptance",
           "max_acceptance_multi", "solve_target_multi", "MULTI_CELLS",
           "gamma_search", "SOLVER_OPTS", "CVX_DIVERGENCES", "CertificateResult", "min_divergence_ordered",
           "level_set_reference", "coverage_reference"]

# Clarabel, tight: the exponential cone stalls near 1e-10, so ask for 1e-11. An "optimal_inaccurate"
# answer is kept only if our own check finds it feasible (Clarabel sometimes stops at an infeasible,
# over-optimistic point, e.g. JS with delta = 1e-4); otherwise, or if Clarabel gives up (tiny masses),
# retry with shorter interior-point steps, without equilibration, then looser.
SOLVER_OPTS = dict(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11,
                   tol_ktratio=1e-9, max_iter=400)
FALLBACK_OPTS = (dict(SOLVER_OPTS, max_step_fraction=0.9),
                 dict(SOLVER_OPTS, equilibrate_enable=False),
                 dict(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10, max_iter=400),
                 dict(solver=cp.CLARABEL))
FEAS_TOL = 1e-9  # accepted constraint violation of an "optimal_inaccurate" answer


@dataclass
class TargetResult:
    """Optimum of ``max h_n`` (or ``max min(h_n / p_n, 1)``) s.t. ``D(h || q) <= delta``."""

    h: np.ndarray
    gamma: float  # h_n
    status: str
    objective: float


@dataclass
class CouplingResult:
    """Optimum of the coupling LP: ``value = max sum_i pi_ii`` over couplings of ``(p, h)``."""

    value: float
    plan: np.ndarray  # pi, (V, V): rows sum to p, columns to h
    status: str


@dataclass
class GammaSearchResult:
    """Largest ``D(h_alg || q)`` found by ``gamma_search`` and where (``p``, ``q``) it was found."""

    value: float
    p: np.ndarray
    q: np.ndarray
    delta: float
    divergence: str
    rule: Rule
    values: list = field(default_factory=list)  # best value of each start (after polishing)


def _solve(prob: cp.Problem, violation: Callable[[], float]) -> str:
    """Solve with the tightest settings that give an "optimal" answer, or an "optimal_inaccurate"
    one whose ``violation()`` is at most ``FEAS_TOL``; else keep the least violating answer.
    Returns the status, with the fallback used appended."""
    best = None  # (violation, status, variable values)
    for i, opts in enumerate((SOLVER_OPTS, *FALLBACK_OPTS)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            try:
                prob.solve(**opts)
            except cp.error.SolverError:
                continue
        if prob.status not in ("optimal", "optimal_inaccurate"):
            continue
        status = prob.status if i == 0 else f"{prob.status} (fallback {i})"
        v = violation()
        if prob.status == "optimal" or v <= FEAS_TOL:
            return status
        if best is None or v < best[0]:
            best = (v, status, [x.value.copy() for x in prob.variables()])
    if best is None:
        raise RuntimeError(f"cvxpy failed: status {prob.status!r}")
    for x, val in zip(prob.variables(), best[2], strict=True):
        x.value = val
    return f"{best[1]} (violation {best[0]:.1e})"


# DCP forms of ``D(h || q) <= delta`` over the support ``sup`` of q (``qs = q[sup]``), per f-divergence
_CVX_FORMS = {
    "kl": lambda h, q, qs, sup, delta: cp.sum(cp.rel_entr(h[sup], qs)) <= delta,  # sum h log(h / q)
    "reverse_kl": lambda h, q, qs, sup, delta: cp.sum(cp.rel_entr(qs, h[sup])) <= delta,  # sum q log(q / h)
    # sum (h - q)^2 / q
    "chi2": lambda h, q, qs, sup, delta: cp.norm2(cp.multiply(1 / np.sqrt(qs), h[sup] - qs)) <= np.sqrt(delta),
    "tv": lambda h, q, qs, sup, delta: cp.norm1(h - q) / 2 <= delta,  # sum |h - q| / 2
    # 1 - sum sqrt(h q) <= delta, sqrt concave
    "hellinger": lambda h, q, qs, sup, delta: 1 - cp.sum(cp.multiply(np.sqrt(qs), cp.sqrt(h[sup]))) <= delta,
    # KL(h || m)/2 + KL(q || m)/2, m = (h + q)/2: rel_entr is jointly convex
    "js": lambda h, q, qs, sup, delta: (cp.sum(cp.rel_entr(h, (h + q) / 2)) / 2
                                        + cp.sum(cp.rel_entr(qs, ((h + q) / 2)[sup])) / 2 <= delta),
}
CVX_UNSUPPORTED: dict[str, str] = {}
"""f-divergences of ``divergences.F_DIVERGENCES`` without a DCP form here, each with the reason (none today)."""
CVX_DIVERGENCES = tuple(d for d in F_DIVERGENCES if d not in CVX_UNSUPPORTED)
"""The divergences the cvxpy programs take: ``divergences.F_DIVERGENCES`` less ``CVX_UNSUPPORTED``."""
if set(CVX_DIVERGENCES) - set(_CVX_FORMS) or set(_CVX_FORMS) - set(F_DIVERGENCES):
    raise RuntimeError(f"optimize: DCP forms {sorted(_CVX_FORMS)} do not match the supported divergences "
                       f"{list(CVX_DIVERGENCES)} (add a form or declare the divergence in CVX_UNSUPPORTED)")


def _constraint(h: cp.Variable, q: np.ndarray, delta: float, name: str) -> list:
    """``D(h || q) <= delta`` as DCP constraints (plus ``h_i = 0`` where the divergence would be
    infinite, i.e. ``q_i = 0`` for KL and chi-square)."""
    sup = q > 0
    out = []
    if name in ("kl", "chi2") and not sup.all():
        out.append(h[~sup] == 0)
    out.append(_CVX_FORMS[name](h, q, q[sup], sup, delta))
    return out


def solve_target(q, n: int, delta: float, divergence: str = "kl", p=None) -> TargetResult:
    """Theorem 2's problem by convex programming: over the simplex,

        maximise ``h_n``  (or ``min(h_n / p_n, 1)`` when ``p`` is given)  s.t.  ``D(h || q) <= delta``.

    The two objectives share their optima for ``p_n > 0`` (the second is capped at 1, so its maximiser
    is not unique once ``h_n >= p_n`` is reachable); with ``p_n = 0`` the acceptance is 0 and ``h_n`` is
    maximised. ``delta = 0`` admits only ``h = q`` and is answered without the solver. Clarabel at
    tight tolerances gives ``gamma`` to about 1e-9 when every positive ``q_i >= 1e-6``; smaller masses
    strain the exponential cone (KL errors up to 1e-3 seen with ``q_i ~ 1e-9``).
    """
    q = np.asarray(q, dtype=np.float64)
    check_probs(q, "q")
    if q.ndim != 1:
        raise ValueError(f"q must be one distribution (shape (V,)), got shape {q.shape}")
    check_token(np.asarray(n), q.size, (), "n")
    delta = check_nonneg(delta, "delta")
    if not isinstance(divergence, str) or divergence not in CVX_DIVERGENCES:
        raise ValueError(f"divergence must be one of {sorted(CVX_DIVERGENCES)}, got {divergence!r}")
    if p is not None:
        p = np.asarray(p, dtype=np.float64)
        check_same_shape(p, q, "p", "q")
        check_probs(p, "p")
    n = int(n)
    if delta == 0:
        return TargetResult(h=q.copy(), gamma=float(q[n]), status="trivial (delta = 0: h = q)",
                            objective=float(q[n] if p is None else (min(q[n] / p[n], 1) if p[n] > 0 else 0)))
    h = cp.Variable(q.size, nonneg=True)
    cons = [cp.sum(h) == 1, *_constraint(h, q, float(delta), divergence)]
    if p is not None and p[n] > 0:
        obj = cp.minimum(h[n] / p[n], 1)
    else:
        obj = h[n]
    prob = cp.Problem(cp.Maximize(obj), cons)
    D = F_DIVERGENCES[divergence]
    status = _solve(prob, lambda: max(float(D(_simplex(h.value), q)) - delta, 0.0))
    hv = _simplex(h.value)
    if p is None:
        value = float(hv[n])
    else:
        value = min(float(hv[n]) / p[n], 1.0) if p[n] > 0 else 0.0
    return TargetResult(h=hv, gamma=float(hv[n]), status=status, objective=value)


def _simplex(x) -> np.ndarray:
    """A solver's answer projected back on the simplex (clip rounding negatives, renormalise)."""
    x = np.clip(np.asarray(x, dtype=np.float64), 0, None)
    return x / x.sum()


def max_acceptance(p, h) -> CouplingResult:
    """Theorem 1's LP: ``max sum_i pi_ii`` over couplings ``pi >= 0`` with row sums ``p`` and column
    sums ``h``. Its value is ``sum_i min(p_i, h_i) = 1 - TV(p, h)``, the best acceptance rate of any
    scheme whose output law is ``h``."""
    p = np.asarray(p, dtype=np.float64)
    h = np.asarray(h, dtype=np.float64)
    check_same_shape(p, h, "p", "h")
    check_probs(p, "p")
    check_probs(h, "h")
    if p.ndim != 1:
        raise ValueError(f"p must be one distribution (shape (V,)), got shape {p.shape}")
    pi = cp.Variable((p.size, p.size), nonneg=True)
    prob = cp.Problem(cp.Maximize(cp.trace(pi)), [cp.sum(pi, axis=1) == p, cp.sum(pi, axis=0) == h])
    status = _solve(prob, lambda: float(np.abs(pi.value.sum(1) - p).max() + np.abs(pi.value.sum(0) - h).max()))
    plan = np.asarray(pi.value)
    return CouplingResult(value=float(np.trace(plan)), plan=plan, status=status)


def _adversarial_starts(V: int, rng: np.random.Generator, k: int) -> list[np.ndarray]:
    """Logit pairs (p, q) at the hard corners: peaked q with p on q's tail, p = q, near-disjoint."""
    starts = []
    for i in range(k):
        a, b = rng.normal(0, 0.5, V), rng.normal(0, 0.5, V)
        j, t = i % V, (i + 1) % V
        kind = i % 3
        if kind == 0:  # q peaked on j, p peaked on another token t
            b[j] += 6
            a[t] += 6
        elif kind == 1:  # p close to q, q mildly peaked
            b[j] += 2
            a = b + rng.normal(0, 0.3, V)
        else:  # q spread, p one-hot-ish on a token of small q
            b[t] -= 4
            a[t] += 8
        starts.append(np.concatenate([a, b]))
    return starts


def gamma_search(delta: float, V: int, divergence: str = "kl", rule: Rule | None = None,
                 starts: int = 12, seed: int = 0, logit_bound: float = 12.0,
                 maxiter: int = 60, polish: int = 2, polish_evals: int = 3000) -> GammaSearchResult:
    """Theorem 3's ``Gamma(delta)`` from below: ``max_{p, q} D(h_alg || q)`` over ``V``-token pairs.

    ``h_alg = sum_n p_n [phi_n e_n + (1 - phi_n) g_n]`` comes from ``exact.induced_distribution``.
    ``p = softmax(a)``, ``q = softmax(b)`` with logits boxed to ``[-logit_bound, logit_bound]`` (keeps
    every divergence finite); L-BFGS-B (``maxiter``) from ``starts`` starts, half random, half
    adversarial (see ``_adversarial_starts``), then Nelder-Mead (``polish_evals`` evaluations) from
    the ``polish`` best. The value is a lower bound on ``Gamma``. Default rule:
    ``Cactus(delta, divergence, solver="exact")``.
    """
    check_nonneg(delta, "delta")
    if not (isinstance(V, (int, np.integer)) and V >= 2):
        raise ValueError(f"V must be an integer >= 2, got {V!r}")
    if divergence not in F_DIVERGENCES:
        raise ValueError(f"divergence must be one of {sorted(F_DIVERGENCES)}, got {divergence!r}")
    check_positive_int(starts, "starts")
    rule = Cactus(delta, divergence, solver="exact") if rule is None else rule
    D = F_DIVERGENCES[divergence]
    rng = np.random.default_rng(seed)

    def neg(x: np.ndarray) -> float:
        p, q = softmax(x[:V]), softmax(x[V:])
        val = float(D(induced_distribution(rule, p, q, check=False), q))
        return -val if np.isfinite(val) else 0.0

    n_adv = starts // 2
    x0s = [rng.normal(0, s, 2 * V) for s in np.linspace(0.5, 3.0, starts - n_adv)]
    x0s += _adversarial_starts(V, rng, n_adv)
    bounds = [(-logit_bound, logit_bound)] * (2 * V)
    found = []
    for x0 in x0s:
        x0 = np.clip(x0, -logit_bound, logit_bound)
        res = minimize(neg, x0, method="L-BFGS-B", bounds=bounds, options=dict(maxiter=maxiter))
        found.append((res.x, -res.fun) if -res.fun >= -neg(x0) else (x0, -neg(x0)))
    values = [float(v) for _, v in found]
    # h_alg is only piecewise smooth (min(1, .), (.)_+), so gradient steps stall at kinks:
    # polish the best starts with Nelder-Mead, which does not use gradients
    for i in np.argsort(values)[::-1][:polish]:
        res = minimize(neg, found[i][0], method="Nelder-Mead", bounds=bounds,
                       options=dict(maxfev=polish_evals, xatol=1e-10, fatol=1e-13))
        if -res.fun > values[i]:
            found[i], values[i] = (res.x, -res.fun), float(-res.fun)
    best_x, best = found[int(np.argmax(values))]
    return GammaSearchResult(value=best, p=softmax(best_x[:V]), q=softmax(best_x[V:]), delta=float(delta),
                             divergence=divergence, rule=rule, values=values)


# -- several drafts: the multi-draft optimal transport (Hu et al., "Towards Optimal Multi-draft
#    Speculative Decoding", ICLR 2025) and its constrained-target extension (ours) -----------------------

MULTI_CELLS = 200_000  # largest V^K * V coupling LP built by default (cvxpy variables)


@dataclass
class MultiCouplingResult:
    """Optimum of the K-draft coupling LP: ``value = max P(y in {x_1..x_K})`` over couplings of
    ``(x_1..x_K) ~ p^K`` (i.i.d. drafts) and ``y ~ h``. ``plan[x_1, ..., x_K, y]`` (shape ``(V,) * (K + 1)``)."""

    value: float
    plan: np.ndarray
    status: str


@dataclass
class MultiBoundResult:
    """The LP's value from its dual (see ``multi_draft_acceptance``): ``value = h(S) + 1 - p(S)^K`` at
    the minimising token set ``S`` (a boolean mask over the vocabulary)."""

    value: float
    subset: np.ndarray


@dataclass
class MultiTargetResult:
    """Optimum of ``max_h A_K(p, h)`` s.t. ``D(h || q) <= delta`` (``solve_target_multi``)."""

    value: float  # A_K(p, h*): the best K-draft acceptance with an output law within budget
    h: np.ndarray  # the optimal target h*
    plan: np.ndarray | None  # the coupling (method "coupling"), None for method "dual"
    status: str
    method: str
    cuts: int = 0  # subsets used by the "dual" method's cutting planes


def _check_multi(p, h, num_drafts, name_h="h"):
    p = np.asarray(p, dtype=np.float64)
    h = np.asarray(h, dtype=np.float64)
    check_probs(p, "p")
    check_probs(h, name_h)
    check_same_shape(p, h, "p", name_h)
    if p.ndim != 1:
        raise ValueError(f"p must be one distribution (shape (V,)), got shape {p.shape}")
    return p, h, check_positive_int(num_drafts, "num_drafts")


def multi_draft_acceptance(p, h, num_drafts: int) -> MultiBoundResult:
    """The best acceptance of ``K = num_drafts`` i.i.d. drafts ``x_1..x_K ~ p`` for output law ``h``,
    in closed form from the coupling LP's dual (float64 numpy, no solver):

        A_K(p, h) = min over token sets S of  h(S) + 1 - p(S)^K .

    Why: the LP is a flow from draft tuples (supply ``p^K(x)``) to tokens (demand ``h(y)``) along the
    edges ``y in x``; by max-flow min-cut its value is the smallest cut, and the cut that keeps the
    tokens ``S`` on the sink side costs ``h(S)`` plus the mass of the tuples that meet ``V \\ S``,
    ``1 - p(S)^K`` (the multi-draft paper reduces the LP to this subset selection). ``K = 1`` gives
    ``1 - max_S (p(S) - h(S)) = 1 - TV(p, h)`` (Theorem 1). The minimum is attained at a prefix of the
    tokens sorted by ``h_i / p_i`` (ascending; ``p_i = 0`` last): for a fixed mass ``t = p(S)`` the
    cheapest ``h(S)`` is the fractional-knapsack prefix, piecewise linear in ``t``, and
    ``h(S(t)) - t^K`` is concave on each piece, so its minimum sits at a piece's end, a whole prefix.
    Hence O(V log V).
    """
    p, h, K = _check_multi(p, h, num_drafts)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(p > 0, h / np.where(p > 0, p, 1.0), np.inf)
    order = np.argsort(ratio, kind="stable")
    hs = np.concatenate([[0.0], np.cumsum(h[order])])
    ps = np.clip(np.concatenate([[0.0], np.cumsum(p[order])]), 0.0, 1.0)
    vals = hs + 1.0 - ps ** K
    j = int(np.argmin(vals))
    subset = np.zeros(p.size, dtype=bool)
    subset[order[:j]] = True
    return MultiBoundResult(value=float(np.clip(vals[j], 0.0, 1.0)), subset=subset)


def _tuple_law(p: np.ndarray, K: int) -> np.ndarray:
    """``p^K`` flattened over ``V^K`` cells, C order (``x_1`` slowest)."""
    law = np.ones(1)
    for _ in range(K):
        law = np.outer(law, p).ravel()
    return law


def _hits(V: int, K: int) -> np.ndarray:
    """``A[c, y] = 1[y in tuple c]`` over ``V^K`` cells (C order) and ``V`` tokens."""
    cells = np.stack(np.unravel_index(np.arange(V ** K), (V,) * K), axis=1)  # (V^K, K)
    return (cells[:, :, None] == np.arange(V)[None, None, :]).any(1).astype(np.float64)


def _check_cells(V: int, K: int, max_cells: int) -> None:
    max_cells = check_positive_int(max_cells, "max_cells")
    if V ** (K + 1) > max_cells:
        raise ValueError(f"the coupling of K = {K} drafts over V = {V} tokens has V^(K + 1) = {V ** (K + 1)} cells, "
                         f"above max_cells = {max_cells}; use a smaller vocabulary or num_drafts, raise max_cells, "
                         f"or use multi_draft_acceptance / method='dual'")


def max_acceptance_multi(p, h, num_drafts: int, *, max_cells: int = MULTI_CELLS) -> MultiCouplingResult:
    """The multi-draft optimal transport LP (Hu et al. 2025) with cvxpy: over couplings ``pi >= 0`` of
    ``K = num_drafts`` i.i.d. drafts ``(x_1..x_K) ~ p^K`` and the output ``y ~ h``,

        maximise  sum pi(x, y) 1[y in {x_1..x_K}]   s.t.  sum_y pi(x, y) = p^K(x),  sum_x pi(x, y) = h(y).

    Its value is the best acceptance any K-draft verification with output law ``h`` can have;
    ``K = 1`` is ``max_acceptance`` (``1 - TV(p, h)``). Exact on toy vocabularies: ``V^K * V`` variables
    (refused above ``max_cells``); ``multi_draft_acceptance`` gives the value from the dual in O(V log V).
    """
    p, h, K = _check_multi(p, h, num_drafts)
    V = p.size
    _check_cells(V, K, max_cells)
    law, A = _tuple_law(p, K), _hits(V, K)
    pi = cp.Variable((V ** K, V), nonneg=True)
    prob = cp.Problem(cp.Maximize(cp.sum(cp.multiply(A, pi))), [cp.sum(pi, axis=1) == law, cp.sum(pi, axis=0) == h])
    status = _solve(prob, lambda: float(np.abs(pi.value.sum(1) - law).max() + np.abs(pi.value.sum(0) - h).max()))
    plan = np.clip(np.asarray(pi.value), 0.0, None)
    return MultiCouplingResult(value=float(np.sum(A * plan)), plan=plan.reshape((V,) * (K + 1)), status=status)


def solve_target_multi(p, q, delta: float, num_drafts: int, divergence: str = "kl", *, method: str = "auto",
                       max_cells: int = MULTI_CELLS, tol: float = 1e-9, max_cuts: int = 500) -> MultiTargetResult:
    """Cactus with several drafts (our extension, no published system): the best acceptance of
    ``K = num_drafts`` i.i.d. drafts from ``p`` when the step's output law ``h`` may move within
    ``D(h || q) <= delta`` of the verifier,

        maximise over h and pi   sum pi(x, y) 1[y in x]   s.t.  pi couples p^K and h,  D(h || q) <= delta,

    a linear objective under linear and one convex constraint: exact with cvxpy. ``delta = 0`` is the
    lossless optimum ``A_K(p, q)`` (Hu et al.); ``K = 1`` is ``max_h 1 - TV(p, h)`` within the budget, an upper
    bound on the acceptance of every single-draft rule whose step law is that close to ``q``. Unlike
    Cactus's per-token budget, ``delta`` here bounds the divergence of the whole step's law.

    ``method``: ``"coupling"`` solves the LP above (``V^(K+1)`` variables, returns the plan);
    ``"dual"`` maximises ``t`` s.t. ``t <= h(S) + 1 - p(S)^K`` for every token set ``S``
    (``multi_draft_acceptance``), adding the most violated set, found exactly by its prefix rule, until
    none is violated by more than ``tol`` (cutting planes; exact at convergence, any ``V``);
    ``"auto"``: coupling when the plan has at most ``max_cells`` cells, else dual.
    """
    p, q, K = _check_multi(p, q, num_drafts, "q")
    delta = check_nonneg(delta, "delta")
    if not isinstance(divergence, str) or divergence not in CVX_DIVERGENCES:
        raise ValueError(f"divergence must be one of {sorted(CVX_DIVERGENCES)}, got {divergence!r}")
    tol = check_nonneg(tol, "tol")
    max_cuts = check_positive_int(max_cuts, "max_cuts")
    check_positive_int(max_cells, "max_cells")
    if not isinstance(method, str) or method not in ("auto", "coupling", "dual"):
        raise ValueError(f"method must be 'auto', 'coupling' or 'dual', got {method!r}")
    V = p.size
    if method == "auto":
        method = "coupling" if V ** (K + 1) <= max_cells else "dual"
    if delta == 0 and method == "dual":  # only h = q is feasible
        return MultiTargetResult(value=multi_draft_acceptance(p, q, K).value, h=q.copy(), plan=None,
                                 status="trivial (delta = 0: h = q)", method="dual")
    D = F_DIVERGENCES[divergence]
    h = cp.Variable(V, nonneg=True)
    budget = [cp.sum(h) == 1, *_constraint(h, q, float(delta), divergence)] if delta > 0 else [h == q]

    def over_budget() -> float:
        return max(float(D(_simplex(h.value), q)) - delta, 0.0) if delta > 0 else float(np.abs(h.value - q).max())

    if method == "coupling":
        _check_cells(V, K, max_cells)
        law, A = _tuple_law(p, K), _hits(V, K)
        pi = cp.Variable((V ** K, V), nonneg=True)
        prob = cp.Problem(cp.Maximize(cp.sum(cp.multiply(A, pi))),
                          [cp.sum(pi, axis=1) == law, cp.sum(pi, axis=0) == h, *budget])
        status = _solve(prob, lambda: over_budget() + float(np.abs(pi.value.sum(1) - law).max()))
        hv = _simplex(h.value)
        plan = np.clip(np.asarray(pi.value), 0.0, None).reshape((V,) * (K + 1))
        return MultiTargetResult(value=multi_draft_acceptance(p, hv, K).value, h=hv, plan=plan, status=status,
                                 method="coupling")
    # dual: cutting planes over token sets, each found by the exact prefix rule
    t = cp.Variable()
    sets = [np.zeros(V, dtype=bool)]  # S = {} gives t <= 1
    status = "max_cuts reached"
    for _ in range(max_cuts):
        S = np.array(sets, dtype=np.float64)  # (m, V)
        pk = np.array([min(p[s].sum(), 1.0) ** K for s in sets])  # p(S)^K of each set
        cons = [t <= S @ h + 1 - pk, *budget]
        prob = cp.Problem(cp.Maximize(t), cons)
        status = _solve(prob, over_budget)
        hv = _simplex(h.value)
        worst = multi_draft_acceptance(p, hv, K)
        if float(t.value) - worst.value <= tol or any(np.array_equal(worst.subset, s) for s in sets):
            break
        sets.append(worst.subset)
    return MultiTargetResult(value=worst.value, h=hv, plan=None, status=status, method="dual", cuts=len(sets))


# -- exact KL certificates (theory.certificates): the same minima as convex programs --------------------

@dataclass
class CertificateResult:
    """``value = min D(p, q)`` over a union of convex sets, the minimiser ``p`` and the set it lies in (``where``:
    the rejected greedy token ``y``, or the ``m`` tokens that overtake ``g``)."""

    value: float
    p: np.ndarray | None
    where: object
    status: str


def min_divergence_ordered(q, pairs, divergence: str = "kl") -> tuple[float, np.ndarray | None, str]:
    """``min D(p, q)`` over distributions ``p`` with ``p_a >= p_b`` for every ``(a, b)`` in ``pairs``: one convex
    program. ``"reverse_kl"`` (``KL(q || p)``): the primal, ``sum rel_entr(q, p)``. ``"kl"`` (``KL(p || q)``, ``p``
    kept on ``q``'s support): its Lagrange dual, ``max_{lambda >= 0} -log sum_z q_z exp(c_z)`` with ``c = sum_k
    lambda_k (e_a - e_b)`` (a log-sum-exp program on log scale; strong duality: the constraints are linear); the
    minimiser is the tilt ``p ~ q exp(c)``. The primal of ``kl`` stalls on near-one-hot rows (Clarabel stops at
    ``optimal_inaccurate`` up to 1e-3 above the minimum), its dual does not. ``(inf, None, status)`` when no such ``p``
    has a finite divergence."""
    q = np.asarray(q, dtype=np.float64)
    check_probs(q, "q")
    if divergence not in ("kl", "reverse_kl"):
        raise ValueError(f"divergence must be 'kl' or 'reverse_kl', got {divergence!r}")
    V = q.size
    sup = q > 0
    if divergence == "kl":
        if not pairs:
            return 0.0, q.copy(), "optimal"
        A = np.zeros((len(pairs), V))
        for k, (a, b) in enumerate(pairs):
            A[k, a] += 1.0
            A[k, b] -= 1.0
        lam = cp.Variable(len(pairs), nonneg=True)
        c = A[:, sup].T @ lam
        prob = cp.Problem(cp.Minimize(cp.log_sum_exp(np.log(q[sup]) + c)))
        status = _solve(prob, lambda: float(max(0.0, -lam.value.min())) if lam.value is not None else np.inf)
        if prob.status in ("unbounded", "unbounded_inaccurate") or not np.isfinite(prob.value):
            return np.inf, None, prob.status
        x = np.zeros(V)
        w = np.log(q[sup]) + A[:, sup].T @ np.clip(lam.value, 0, None)
        x[sup] = np.exp(w - w.max())
        return max(0.0, -float(prob.value)), x / x.sum(), status
    p = cp.Variable(V, nonneg=True)
    cons = [cp.sum(p) == 1] + [p[a] >= p[b] for a, b in pairs]
    prob = cp.Problem(cp.Minimize(cp.sum(cp.rel_entr(q[sup], p[sup]))), cons)

    def violation() -> float:
        x = p.value
        if x is None:
            return np.inf
        v = [abs(x.sum() - 1), max(0.0, -x.min())] + [max(0.0, x[b] - x[a]) for a, b in pairs]
        return float(max(v))

    status = _solve(prob, violation)
    x = _simplex(p.value)
    return float(_kl(q, x)), x, status


def level_set_reference(q, rejected, divergence: str = "kl") -> CertificateResult:
    """``min D(p, q)`` over drafts whose greedy token may be a rejected token: the minimum over every rejected
    ``y`` of the convex program ``p_y >= p_z`` for all ``z`` (``min_divergence_ordered``). The reference of
    ``certificates.level_set_certificate``."""
    q = np.asarray(q, dtype=np.float64)
    V = q.size
    best = CertificateResult(np.inf, None, None, "nothing rejected")
    for y in np.flatnonzero(rejected):
        if divergence == "kl" and q[y] == 0:
            continue  # p_y = 0 cannot be the top of a distribution
        value, x, status = min_divergence_ordered(q, [(int(y), z) for z in range(V) if z != y], divergence)
        if value < best.value:
            best = CertificateResult(value, x, int(y), status)
    return best


def coverage_reference(q, m: int, divergence: str = "kl") -> CertificateResult:
    """``min D(p, q)`` over drafts whose top-``m`` candidates may miss ``g = argmax q``: the minimum over every set
    ``S`` of ``m`` tokens other than ``g`` of the convex program ``p_z >= p_g`` for ``z`` in ``S``. The reference
    of ``certificates.coverage_certificate``."""
    from itertools import combinations

    q = np.asarray(q, dtype=np.float64)
    m = check_positive_int(m, "m")
    g = int(np.argmax(q))
    others = [z for z in range(q.size) if z != g]
    best = CertificateResult(np.inf, None, None, "m >= V" if m > len(others) else "")
    for S in combinations(others, m):
        value, x, status = min_divergence_ordered(q, [(z, g) for z in S], divergence)
        if value < best.value:
            best = CertificateResult(value, x, S, status)
    return best
