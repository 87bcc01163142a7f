"""``SequenceBudget``: a divergence certificate for the whole answer (proof: docs/sequence-budget.md).

Notation (the paper's): ``p`` draft law, ``q`` verifier law, ``n`` drafted token, ``h_t`` the law of the
token emitted at a judged position ``t`` (the rule's induced law ``h_alg``), ``delta`` Cactus's budget,
``B`` the budget of the whole answer, in nats.

The certificate. Let a decode judge positions ``t`` with Cactus at ``delta_t``, emitting each token from
``h_t = induced(Cactus(delta_t); p_t, q_t)`` given the history, and every bonus token from ``q_t``. By the
chain rule and data processing (docs/sequence-budget.md)

    KL(P_tokens || Q_tokens) <= E[ sum over judged t of KL(h_t || q_t) ],

``Q`` the verifier's own sequence law. The controller here chooses ``delta_t`` **before anything is sampled
at t**, from the exact cost ``c_t(delta) = KL(h_alg || q_t)`` of ``core.exact`` (``induced_rows`` on the
rows cut to their support, at most ``2 top_k`` tokens under the paper's sampling), so that ``c_t`` fits the
budget left. Inside a block of ``k`` drafts, position ``j`` is judged only when ``1..j-1`` were accepted, so
it is charged at decision time from what is left after charging ``1..j-1``; in a tree, a node is charged
from what is left after its ancestors (the nodes judged whenever it is). Hence the realised sum of costs
along every path is at most ``B``, and ``KL(P_tokens || Q_tokens) <= B`` for every prompt.

Allocations (``ALLOCATIONS``), with ``R`` the budget left at the position and ``L`` the tokens left to the
horizon (this one included):
  ``"spend_down"``  the largest ``delta <= delta_max`` with ``c_t(delta) <= R`` (per-token Cactus at
                    ``delta_max`` while the budget lasts, then less, then SpS);
  ``"even"``        the largest ``delta <= delta_max`` with ``c_t(delta) <= R / L``;
  ``"lagrangian"``  ``max_delta accept_t(delta) - lambda c_t(delta)`` over ``delta`` in ``{0,
                    delta_max 2^-i (i < GRID)}`` and spend_down's point, subject to ``c_t(delta) <= R``,
                    with ``lambda = 1 / (2 sqrt(R / L))``: the price at which a position whose acceptance
                    grows as ``sqrt(cost)`` (Cactus near ``delta = 0``) spends exactly its share ``R / L``.
Every choice keeps ``c_t <= R - SLACK * B``, so float rounding of an independent recomputation of the
costs (the loops' ``kl_sum``) cannot cross ``B``. Positions past the tokens a row may still emit (its
``max_tokens``) are judged at ``delta = 0``: their tokens are cut.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from array_api_compat import is_torch_array

from .divergences import divergence
from .exact import ROWS_MAX_V, acceptance_rate, induced_rows, step_divergence
from .rules import Cactus, Rule, ScalingRule, taylor_gamma
from .validate import check_int, check_nonneg, check_number

__all__ = ["SequenceBudget", "BudgetState", "BudgetPlan", "CactusRows", "ALLOCATIONS", "BUDGET_BASES", "SLACK",
           "support_rows", "NODE_STATES_MAX"]

ALLOCATIONS = ("spend_down", "even", "lagrangian")
BUDGET_BASES = ("cactus",)  # the per-position rule whose delta the controller sets (Corollary 5's Cactus)
SLACK = 1e-9  # every position's cost stays below (budget left) - SLACK * budget
BISECT_ITERS = 24  # at most; geometric bisection on delta stops at relative precision BISECT_RTOL
BISECT_RTOL = 1e-2  # what a position leaves unspent by it stays in the budget for the next ones
GRID = 16  # the Lagrangian's candidates: delta_max 2^-i, i < GRID, and 0
DELTA_MAX_MAX = 1e30  # delta is applied in the probabilities' dtype (float32 at least)
NODE_STATES_MAX = 20_000  # a tree node with random candidates: its exact law sums |supp p|^K candidate tuples


def _f32_floor(x: np.ndarray) -> np.ndarray:
    """The largest float32 values <= ``x`` (float64 out): the deltas ``verify`` applies in float32 are exactly
    the ones whose costs were computed."""
    x = np.asarray(x, dtype=np.float64)
    y = x.astype(np.float32)
    y = np.where(y.astype(np.float64) > x, np.nextafter(y, np.float32(-np.inf)), y)
    return np.maximum(y.astype(np.float64), 0.0)


@dataclass(frozen=True, eq=False)
class CactusRows(ScalingRule):
    """Cactus (Corollary 5's closed form) with one ``delta`` per row: ``gamma = min{q_n + sqrt(2 delta
    q_n (1 - q_n)), 1}`` with ``delta`` (...) matching the leading axes of ``q_n`` (trailing axes are
    broadcast). What ``SequenceBudget`` judges a batch with, one position (or tree node) per row; at one
    row it is ``Cactus(delta)``. Its law is exact only row by row, so it does not declare ``two_block``
    (the fast exact path reads one row at a time)."""

    delta: Any = None
    two_block: ClassVar[bool] = False

    def _delta_like(self, q_n):
        d = self.delta
        if is_torch_array(q_n):
            import torch

            d = torch.as_tensor(d, dtype=q_n.dtype, device=q_n.device)
        else:
            d = np.asarray(d, dtype=np.float64)
        if tuple(q_n.shape[:d.ndim]) != tuple(d.shape):
            raise ValueError(f"CactusRows: delta of shape {tuple(d.shape)} does not match the rows of q_n, shape "
                             f"{tuple(q_n.shape)} (one delta per row, leading axes)")
        return d.reshape(tuple(d.shape) + (1,) * (len(q_n.shape) - d.ndim))

    def gamma(self, q_n):
        return taylor_gamma(q_n, self._delta_like(q_n))

    def __repr__(self) -> str:
        return f"CactusRows(delta of shape {tuple(np.shape(self.delta))})"


def support_rows(p, q, keep=None, return_index: bool = False):
    """``(p, q)`` (..., V) (numpy or torch, any dtype and device) cut to each row's union support
    ``{p > 0} | {q > 0}`` (tokens outside it carry no mass in ``h_alg``), plus the tokens ``keep`` marks
    ((..., V) bool, e.g. a tree node's candidates), in token order, padded with zeros to the largest such set
    of the batch and renormalised in float64, as ``lm.metrics.step_kl`` reads a row: (..., S). With
    ``return_index`` also the token id of each column (..., S) (int64 numpy; -1 in the padding). Both backends
    give the same arrays (one ``nonzero`` pass, no sort over the vocabulary)."""
    shape, V = tuple(p.shape[:-1]), p.shape[-1]
    if is_torch_array(p):
        import torch

        mask = (p > 0) | (q > 0)
        if keep is not None:
            mask = mask | torch.as_tensor(keep, device=mask.device)
        r, c = torch.nonzero(mask.reshape(-1, V), as_tuple=True)  # row-major: each row's tokens in order
        r, c = r.cpu().numpy(), c.cpu().numpy()
        rows_p, rows_q = p.reshape(-1, V), q.reshape(-1, V)
        vals_p = rows_p[torch.as_tensor(r, device=p.device), torch.as_tensor(c, device=p.device)]
        vals_q = rows_q[torch.as_tensor(r, device=q.device), torch.as_tensor(c, device=q.device)]
        vals_p, vals_q = vals_p.detach().double().cpu().numpy(), vals_q.detach().double().cpu().numpy()
    else:
        P0, Q0 = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
        mask = (P0 > 0) | (Q0 > 0)
        if keep is not None:
            mask = mask | np.asarray(keep, dtype=bool)
        r, c = np.nonzero(mask.reshape(-1, V))
        vals_p, vals_q = P0.reshape(-1, V)[r, c], Q0.reshape(-1, V)[r, c]
    R = int(np.prod(shape, dtype=np.int64))
    counts = np.bincount(r, minlength=R)
    S = max(1, int(counts.max())) if R else 1
    pos = np.arange(r.size) - (np.cumsum(counts) - counts)[r]
    P, Q = np.zeros((R, S)), np.zeros((R, S))
    idx = np.full((R, S), -1, dtype=np.int64)
    P[r, pos], Q[r, pos], idx[r, pos] = vals_p, vals_q, c
    zp, zq = P.sum(-1, keepdims=True), Q.sum(-1, keepdims=True)
    P = np.where(zp > 0, P / np.where(zp > 0, zp, 1.0), P).reshape(shape + (S,))
    Q = np.where(zq > 0, Q / np.where(zq > 0, zq, 1.0), Q).reshape(shape + (S,))
    return (P, Q, idx.reshape(shape + (S,))) if return_index else (P, Q)


@dataclass
class BudgetPlan:
    """One verification call's decisions, taken before any draw: ``delta`` and ``cost`` (B, W), per chain
    position (W = k) or per tree slot (W = N + 1: slot 0 the root, slot ``j + 1`` node ``j``); ``cost[b, w]
    = KL(h || q)`` of that position's (node's) exact law at ``delta[b, w]``, charged if it is judged."""

    delta: np.ndarray
    cost: np.ndarray

    def rows(self, b, w) -> CactusRows:
        """The rule judging rows ``b`` at positions (slots) ``w`` (index arrays of one shape, numpy or torch)."""
        b = b.cpu().numpy() if is_torch_array(b) else np.asarray(b)
        w = w.cpu().numpy() if is_torch_array(w) else np.asarray(w)
        return CactusRows(self.delta[b, w])

    def at(self, b: int, w: int) -> Cactus:
        """The plain ``Cactus(delta)`` judging row ``b`` at position (slot) ``w``: the same law, one row."""
        return Cactus(float(self.delta[b, w]))


class BudgetState:
    """Per-sequence state of a ``SequenceBudget`` decode, one entry per row: ``spent`` (nats charged so
    far), ``left`` (tokens the row may still emit; inf if unbounded) and ``spread`` (tokens to the horizon
    the allocation spreads the budget over). ``last`` is the latest call's ``BudgetPlan`` and ``judged``
    its (B, W) mask of the positions (slots) that were judged and charged.

    Mutated in place by the verification call it is handed to; ``select(idx)`` keeps rows (the decode
    loops' finished rows leave the batch), ``subset`` / ``update`` hand part of the batch to a call."""

    def __init__(self, rule: SequenceBudget, batch: int, max_tokens=None):
        self.rule = rule
        self.spent = np.zeros(batch)
        left = np.inf if max_tokens is None else np.asarray(max_tokens, dtype=np.float64)
        self.left = np.broadcast_to(left, (batch,)).astype(np.float64)
        self.spread = (np.full(batch, float(rule.horizon)) if rule.horizon else self.left.copy())
        self.last: BudgetPlan | None = None
        self.judged: np.ndarray | None = None

    @property
    def batch(self) -> int:
        return int(self.spent.shape[0])

    @property
    def remaining(self) -> np.ndarray:
        """``B - spent`` per row (never negative)."""
        return np.maximum(self.rule.budget - self.spent, 0.0)

    def charge(self, plan: BudgetPlan, judged: np.ndarray, emitted: np.ndarray) -> None:
        """Charge each row the costs of its judged positions (``judged`` (B, W) bool) and count its
        ``emitted`` tokens."""
        judged = np.asarray(judged, dtype=bool)
        self.spent = self.spent + np.where(judged, plan.cost, 0.0).sum(-1)
        emitted = np.asarray(emitted, dtype=np.float64)
        self.left = np.maximum(self.left - emitted, 0.0)
        self.spread = self.spread - emitted
        self.last, self.judged = plan, judged

    def select(self, idx) -> None:
        """Keep rows ``idx`` (numpy or torch indices), in that order."""
        idx = idx.cpu().numpy() if is_torch_array(idx) else np.asarray(idx)
        self.spent, self.left, self.spread = self.spent[idx], self.left[idx], self.spread[idx]
        self.last = self.judged = None

    def subset(self, idx) -> BudgetState:
        """A new state of rows ``idx`` (copied); ``update(idx, sub)`` writes it back."""
        sub = type(self).__new__(type(self))
        sub.rule = self.rule
        sub.spent, sub.left, sub.spread = self.spent[idx].copy(), self.left[idx].copy(), self.spread[idx].copy()
        sub.last = sub.judged = None
        return sub

    def update(self, idx, sub: BudgetState) -> None:
        self.spent[idx], self.left[idx], self.spread[idx] = sub.spent, sub.left, sub.spread
        self.last, self.judged = sub.last, sub.judged

    def __repr__(self) -> str:
        return f"BudgetState({self.rule!r}, spent={np.round(self.spent, 6).tolist()})"


Costs = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]  # (rows, deltas) -> (accept, cost)


@dataclass(frozen=True)
class SequenceBudget(Rule):
    """Cactus with one KL budget for the whole answer: ``KL(P_tokens || Q_tokens) <= budget`` (nats) for
    every prompt, ``Q`` the verifier's own sequence law (module docstring; docs/sequence-budget.md).

    ``budget`` ``B >= 0`` nats per sequence; ``base`` the per-position rule (``"cactus"``: Corollary 5's
    closed form at ``delta_t``); ``allocation`` one of ``ALLOCATIONS``; ``delta_max`` the largest
    ``delta_t`` tried; ``horizon`` the tokens the spreading allocations spread the budget over (0: the
    decode's ``max_new_tokens``).

    Stateful per sequence (``stateful = True``): start a state per batch with ``start(B, max_tokens)``
    and hand it to ``sampler.verify(..., state=)`` / ``tree.verify_tree(..., state=)``; the decode loops
    and ``toy.sequence_law`` do this themselves. The one-step entry points (``exact``, ``verify_flat``,
    the integrations) refuse it.
    """

    budget: float = 1.0
    base: str = "cactus"
    allocation: str = "spend_down"
    delta_max: float = 1.0
    horizon: int = 0
    stateful: ClassVar[bool] = True
    two_block_steps: ClassVar[bool] = True  # each position (node) is judged by a two-block rule (tree mode "joint")

    def __post_init__(self):
        checked = {"budget": check_nonneg(self.budget, "budget"),
                   "delta_max": check_number(self.delta_max, "delta_max", low=0.0, high=DELTA_MAX_MAX,
                                             what="a number in [0, 1e30]"),
                   "horizon": check_int(self.horizon, "horizon", low=0)}
        for name, value in checked.items():  # Python numbers, as every rule stores them
            object.__setattr__(self, name, value)
        for name, choices in (("base", BUDGET_BASES), ("allocation", ALLOCATIONS)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in choices:
                raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")

    # -- the per-sequence state ------------------------------------------------------------------
    def start(self, batch: int, max_tokens=None) -> BudgetState:
        """A fresh state for ``batch`` sequences that may each emit ``max_tokens`` more tokens (an integer,
        one per row, or None: unbounded). The spreading allocations need a horizon: ``horizon`` or
        ``max_tokens``."""
        batch = check_int(batch, "batch", low=0)
        if max_tokens is not None:
            m = np.asarray(max_tokens)
            if m.ndim > 1 or (m.ndim == 1 and m.shape[0] != batch) or not np.all(m >= 0):
                raise ValueError(f"max_tokens must be None, an integer >= 0 or one per row ({batch}), got {max_tokens!r}")
        if self.allocation != "spend_down" and not self.horizon and max_tokens is None:
            raise ValueError(f"allocation {self.allocation!r} spreads the budget over the answer: give the rule a "
                             "horizon (tokens) or start(batch, max_tokens=...)")
        return BudgetState(self, batch, max_tokens)

    def check_state(self, state, batch: int) -> BudgetState:
        """``state`` must be this rule's ``BudgetState`` for ``batch`` rows."""
        if not isinstance(state, BudgetState):
            raise ValueError(f"{self!r} is stateful per sequence: pass state=rule.start({batch}, max_tokens) "
                             f"(a BudgetState), got {state!r}")
        if state.rule != self:
            raise ValueError(f"state belongs to {state.rule!r}, not to {self!r}")
        if state.batch != batch:
            raise ValueError(f"state holds {state.batch} rows, the call {batch}")
        return state

    # -- costs -----------------------------------------------------------------------------------
    def step_costs(self, p: np.ndarray, q: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Acceptance ``sum_n p_n phi_n`` and exact ``KL(h_alg || q)`` (R,) of Cactus at ``delta`` (R,) on
        rows ``p``, ``q`` (R, S) (cut to their support, ``support_rows``). ``delta = 0`` costs exactly 0
        (Theorem 1: the law is ``q``)."""
        delta = np.asarray(delta, dtype=np.float64)
        if p.shape[-1] <= ROWS_MAX_V:
            rule = CactusRows(delta)
            h = induced_rows(rule, p, q, check=False)
            acc = np.sum(p * rule.accept_prob_all(p, q), -1)
            cost = divergence(h, q, "kl", check=False)
        else:  # no truncation: each row by the O(V log V) exact path
            acc, cost = np.empty(len(delta)), np.empty(len(delta))
            for i, d in enumerate(delta):
                c = Cactus(float(d))
                acc[i] = acceptance_rate(c, p[i], q[i], check=False)
                cost[i] = step_divergence(c, p[i], q[i], check=False)
        return acc, np.where(delta > 0, np.maximum(cost, 0.0), 0.0)

    def node_cost_fn(self, p: np.ndarray, q: np.ndarray, num_children: int, scheme: str, candidates,
                     mode: str) -> Costs:
        """``f(rows, deltas) -> (acceptance, cost)`` for R tree nodes with ``num_children`` candidates each:
        ``p``, ``q`` (R, S) their rows cut to their support (``support_rows``), ``candidates`` (R, K) the columns
        of their deterministic candidates (None for random schemes); acceptance ``P(some child accepted)`` and
        cost ``KL(node law || q)``, the node law from ``core.tree.node_law_rows`` (deterministic candidates, all
        rows at once), ``step_costs`` (one random candidate: ``node_parts`` is then the step's ``h_alg`` in either
        mode) or ``core.tree.node_parts`` (random candidates, row by row, results shared by equal rows)."""
        from .tree import node_law_rows, node_parts

        K = int(num_children)
        if candidates is None and K == 1:  # one random candidate, either mode: the node's law is the step's h_alg
            return lambda rows, d: self.step_costs(p[rows], q[rows], d)
        if candidates is not None:
            def f(rows, d):
                law, acc = node_law_rows(CactusRows(d), p[rows], q[rows], candidates[rows], mode)
                cost = divergence(law, q[rows], "kl", check=False)
                return acc, np.where(d > 0, np.maximum(cost, 0.0), 0.0)
            return f
        for r in range(p.shape[0]):
            m = int(np.count_nonzero(p[r]))
            if m ** K > NODE_STATES_MAX:
                raise ValueError(f"a tree node with {K} random ({scheme}) candidates on a draft support of {m} tokens: "
                                 f"its exact law sums {m}^{K} candidate tuples (> {NODE_STATES_MAX}); use "
                                 "deterministic candidates, or a smaller top-k or tree")
        memo: dict = {}

        def g(rows, d):
            acc, cost = np.empty(len(rows)), np.empty(len(rows))
            for i, (r, dl) in enumerate(zip(rows, np.asarray(d, dtype=np.float64), strict=True)):
                key = (p[r].tobytes(), q[r].tobytes(), float(dl))
                if key not in memo:
                    a, rej = node_parts(Cactus(float(dl)), p[r], q[r], K, scheme, None, mode)
                    c = float(divergence(a.sum(0) + rej, q[r], "kl", check=False)) if dl > 0 else 0.0
                    memo[key] = (float(a.sum()), max(c, 0.0))
                acc[i], cost[i] = memo[key]
            return acc, cost
        return g

    # -- the controller ----------------------------------------------------------------------------
    def choose(self, costs: Costs, remaining: np.ndarray, left: np.ndarray, spread: np.ndarray):
        """``(delta, cost)`` (R,) of R positions judged now, from ``costs(rows, deltas)`` (acceptance and exact
        cost of rows ``rows`` at ``deltas``), the budget ``remaining`` at each, the tokens ``left`` the row may
        still emit from it (this one included; < 1: its token is cut, delta = 0) and the tokens ``spread`` to
        the horizon. Never ``cost > remaining - SLACK * budget``."""
        R = remaining.shape[0]
        delta, cost = np.zeros(R), np.zeros(R)
        cap = remaining - SLACK * self.budget
        L = np.maximum(spread, 1.0)
        if self.allocation == "even":
            cap = np.minimum(cap, remaining / L)
        live = np.flatnonzero((left >= 1) & (cap > 0))
        if live.size == 0 or self.delta_max <= 0:
            return delta, cost
        d, c, a = self._bisect(costs, live, cap[live])
        if self.allocation == "lagrangian":
            d, c = self._lagrangian(costs, live, cap[live], remaining[live] / L[live], d, c, a)
        delta[live], cost[live] = d, c
        return delta, cost

    def choose_unique(self, rows_of: tuple, build: Callable[..., Costs], remaining: np.ndarray, left: np.ndarray,
                      spread: np.ndarray):
        """``choose`` once per distinct position: ``rows_of`` (arrays with one leading entry per position: the
        rows a position's costs read) and its budget, tokens left and spread; ``build(*rows)`` the costs of the
        distinct positions. A batch decoding one prompt many times decides each distinct position once; the
        decisions are those of ``choose`` on every position."""
        R = remaining.shape[0]
        X = np.concatenate([np.asarray(a, dtype=np.float64).reshape(R, -1) for a in rows_of]
                           + [remaining[:, None], left[:, None], spread[:, None]], 1)
        _, first, inv = np.unique(X, axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        d, c = self.choose(build(*(np.asarray(a)[first] for a in rows_of)), remaining[first], left[first],
                           spread[first])
        return d[inv], c[inv]

    def _bisect(self, costs: Costs, rows: np.ndarray, cap: np.ndarray):
        """The largest float32 ``delta <= delta_max`` found with ``cost <= cap``: ``delta_max`` if it fits,
        else geometric bisection (shrink by 4 until a feasible delta is found, then halve the ratio), the
        feasible end kept, so the result always fits (whether or not the cost is monotone in delta)."""
        top = float(_f32_floor(self.delta_max))
        lo, hi = np.zeros(rows.size), np.full(rows.size, top)
        a_lo, c_lo = np.zeros(rows.size), np.zeros(rows.size)
        a_top, c_top = costs(rows, hi)
        ok = c_top <= cap
        lo[ok], a_lo[ok], c_lo[ok] = top, a_top[ok], c_top[ok]
        todo = ~ok
        first = np.flatnonzero(todo)
        if first.size:  # acceptance at delta = 0 (SpS), for rows that may end there
            a_lo[first] = costs(rows[first], np.zeros(first.size))[0]
        for _ in range(BISECT_ITERS):
            i = np.flatnonzero(todo)
            if i.size == 0:
                break
            mid = np.where(lo[i] > 0, np.sqrt(lo[i] * hi[i]), hi[i] / 4)
            mid = _f32_floor(mid)
            moved = (mid > lo[i]) & (mid < hi[i])
            todo[i[~moved]] = False
            i, mid = i[moved], mid[moved]
            if i.size == 0:
                break
            a, c = costs(rows[i], mid)
            fit = c <= cap[i]
            lo[i] = np.where(fit, mid, lo[i])
            a_lo[i] = np.where(fit, a, a_lo[i])
            c_lo[i] = np.where(fit, c, c_lo[i])
            hi[i] = np.where(fit, hi[i], mid)
            todo[i] &= ~((lo[i] > 0) & (hi[i] <= lo[i] * (1 + BISECT_RTOL)))
        return lo, c_lo, a_lo

    def _lagrangian(self, costs: Costs, rows: np.ndarray, cap: np.ndarray, share: np.ndarray, d_sd, c_sd, a_sd):
        """``argmax accept - lambda cost`` over ``{0, delta_max 2^-i}`` and spend_down's point ``d_sd``, among
        the deltas whose cost fits ``cap``; ``lambda = 1 / (2 sqrt(share))``."""
        grid = _f32_floor(self.delta_max * 2.0 ** -np.arange(GRID - 1, -1, -1))  # ascending
        G = grid.size
        rr = np.repeat(rows, G)
        a_g, c_g = costs(rr, np.tile(grid, rows.size))
        a0 = costs(rows, np.zeros(rows.size))[0]
        D = np.column_stack([np.zeros(rows.size), np.tile(grid, (rows.size, 1)), d_sd])
        A = np.column_stack([a0, a_g.reshape(rows.size, G), a_sd])
        C = np.column_stack([np.zeros(rows.size), c_g.reshape(rows.size, G), c_sd])
        lam = 1.0 / (2.0 * np.sqrt(np.maximum(share, 1e-300)))
        obj = np.where(C <= cap[:, None], A - lam[:, None] * C, -np.inf)
        best = np.argmax(obj, axis=1)  # the first maximum: the smallest delta on ties
        r = np.arange(rows.size)
        return D[r, best], C[r, best]

    # -- plans for the samplers ----------------------------------------------------------------------
    def plan(self, state: BudgetState, p, q) -> BudgetPlan:
        """Decisions for a chain of ``k`` drafts per row: ``p`` (B, k, V), ``q`` (B, >= k, V) (numpy or
        torch); position ``j``'s cost fits what is left after charging positions ``1..j-1``."""
        B, k = p.shape[0], p.shape[1]
        P, Q = support_rows(p, q[:, :k])
        remaining = state.remaining.copy()
        delta, cost = np.zeros((B, k)), np.zeros((B, k))
        def build(Pj, Qj):
            return lambda rows, d: self.step_costs(Pj[rows], Qj[rows], d)
        for j in range(k):
            delta[:, j], cost[:, j] = self.choose_unique((P[:, j], Q[:, j]), build, remaining, state.left - j,
                                                         state.spread - j)
            remaining = remaining - cost[:, j]
        return BudgetPlan(delta, cost)

    def plan_tree(self, state: BudgetState, tokens, parents, p, q, scheme: str, mode: str) -> BudgetPlan:
        """Decisions for a batch of drafted trees (``tree.verify_tree``'s layout), level by level: a node's cost
        fits what is left after charging its ancestors (the nodes judged whenever it is); a node without children
        emits from its ``q`` (bonus) and costs 0. The nodes of one level (all rows) are decided together."""
        if scheme == "eagle":
            raise ValueError("scheme 'eagle' is not lossless at delta = 0 (it reads deterministic candidates with the "
                             "draft's probability), so no budget can be kept with it: use 'deterministic'")
        tok = tokens.detach().cpu().numpy() if is_torch_array(tokens) else np.asarray(tokens)
        par = parents.detach().cpu().numpy() if is_torch_array(parents) else np.asarray(parents)
        B, N = tok.shape
        present = np.concatenate([np.ones((B, 1), dtype=bool), tok >= 0], 1)  # per slot: 0 the root, j + 1 node j
        num = np.zeros((B, N + 1), dtype=np.int64)
        kids = np.full((B, N + 1, max(N, 1)), -1, dtype=np.int64)  # children's node indices in node order
        depth = np.zeros((B, N + 1), dtype=np.int64)
        for j in range(N):
            b = np.flatnonzero(tok[:, j] >= 0)
            s_ = par[b, j] + 1
            kids[b, s_, num[b, s_]] = j
            num[b, s_] += 1
            depth[b, j + 1] = depth[b, s_] + 1
        delta, cost = np.zeros((B, N + 1)), np.zeros((B, N + 1))
        rem = np.zeros((B, N + 1))
        rem[:, 0] = state.remaining
        det = scheme == "deterministic"
        for level in range(int(depth[present].max()) + 1):
            b, s_ = np.nonzero(present & (depth == level) & (num > 0))
            for K in np.unique(num[b, s_]):
                g = num[b, s_] == K
                bb, ss = b[g], s_[g]
                first = kids[bb, ss, 0]
                if is_torch_array(p):
                    import torch

                    tb = torch.as_tensor(bb, device=p.device)
                    pr, qr = p[tb, torch.as_tensor(first, device=p.device)], q[tb, torch.as_tensor(ss, device=q.device)]
                else:
                    pr, qr = np.asarray(p)[bb, first], np.asarray(q)[bb, ss]
                cands = tok[bb[:, None], kids[bb, ss, :K]] if det else None
                keep = None
                if det:
                    keep = np.zeros(tuple(qr.shape), dtype=bool)
                    keep[np.arange(len(bb))[:, None], cands] = True
                P, Q, idx = support_rows(pr, qr, keep, return_index=True)
                local = None
                if det:
                    inv = np.full(tuple(qr.shape), -1, dtype=np.int64)
                    rr, cc = np.nonzero(idx >= 0)  # the padding (-1) maps nothing
                    inv[rr, idx[rr, cc]] = cc
                    local = inv[np.arange(len(bb))[:, None], cands]
                rows_of = (P, Q) if local is None else (P, Q, local)

                def build(P_, Q_, C_=None, K=int(K)):
                    return self.node_cost_fn(P_, Q_, K, scheme, None if C_ is None else C_.astype(np.int64), mode)
                delta[bb, ss], cost[bb, ss] = self.choose_unique(rows_of, build, rem[bb, ss], state.left[bb] - level,
                                                                 state.spread[bb] - level)
            for j in range(N):  # the next level's budget: its parent's, less the parent's cost
                b = np.flatnonzero((tok[:, j] >= 0) & (depth[:, j + 1] == level + 1))
                s_ = par[b, j] + 1
                rem[b, j + 1] = rem[b, s_] - cost[b, s_]
        return BudgetPlan(delta, cost)

    def position_choice(self, p, q, remaining: float, left: float, spread: float) -> tuple[float, float]:
        """``(delta, cost)`` of one chain position with rows ``p``, ``q`` (V,) (``choose``; what ``plan`` decides
        for a row, for the exact sequence laws)."""
        P, Q = support_rows(np.asarray(p, dtype=np.float64)[None], np.asarray(q, dtype=np.float64)[None])
        d, c = self.choose(lambda rows, dl: self.step_costs(P[rows], Q[rows], dl), np.array([float(remaining)]),
                           np.array([float(left)]), np.array([float(spread)]))
        return float(d[0]), float(c[0])

    def node_choice(self, p, q, num_children: int, scheme: str, candidates, mode: str, remaining: float,
                    left: float, spread: float) -> tuple[float, float]:
        """``(delta, cost)`` of one tree node with ``num_children`` candidates (``candidates``: their token ids for
        the deterministic scheme, None for random ones), rows ``p``, ``q`` (V,): what ``plan_tree`` decides for
        the node, for the exact sequence laws."""
        if scheme == "eagle":
            raise ValueError("scheme 'eagle' is not lossless at delta = 0: no budget can be kept with it")
        pr, qr = np.asarray(p, dtype=np.float64)[None], np.asarray(q, dtype=np.float64)[None]
        keep = local = None
        if candidates is not None:
            keep = np.zeros(pr.shape, dtype=bool)
            keep[0, np.asarray(candidates)] = True
        P, Q, idx = support_rows(pr, qr, keep, return_index=True)
        if candidates is not None:
            local = np.searchsorted(idx[0], np.asarray(candidates))[None]  # idx's kept tokens are in token order
        f = self.node_cost_fn(P, Q, num_children, scheme, local, mode)
        d, c = self.choose(f, np.array([float(remaining)]), np.array([float(left)]), np.array([float(spread)]))
        return float(d[0]), float(c[0])

    # -- the one-step interface: refused (the law is a whole decode's) ---------------------------------
    def _stateful(self, *args, **kwargs):
        raise ValueError(f"{self!r} is stateful per sequence (rule.stateful): it has no one-step law of its own; judge "
                         "with sampler.verify / tree.verify_tree and state=rule.start(B, max_tokens), or decode with "
                         "lm.speculative_generate / lm.tree_generate / toy.speculative_decode")

    row_stats = stats_all = stats_at = phi = residual = target = _stateful

