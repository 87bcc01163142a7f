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

from ..core.exact import acceptance_rate, step_divergence
from ..core.rules import Cactus, Rule

__all__ = ["MatchedResult", "matched_cactus", "mean_cost"]


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
