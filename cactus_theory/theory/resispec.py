"""ResiSpec (Chen, Tao, Mao, Zhan, Ye, arXiv 2608.24411v1), reconstructed, and its exact output law.

ResiSpec ("Enhancing Multi-Candidate Speculative Sampling via Residual Distribution Shaping") verifies ``K``
candidates drawn i.i.d. from the draft one after the other, as recursive rejection sampling (SpecInfer / SpecTr)
does, but after a rejection it updates the current target through a *proxy* built from the rejected candidate,
so that the next target resembles the draft. Its paper claims the output is exactly the verifier's law.

Sources. The paper's text and its authors' code were not available to this project. The algorithm is
reconstructed from a secondary source that inspected v1 (a book manuscript, chapter 37 "Decoding", with its
references page "References -- Decoding", read December 2026): its account of Algorithm 1 and ``GetProxy``, its
guarded reconstruction of the proxy branch (its Procedure 37.5a), the marginal condition (its Eq. 37.15) and its
counterexample to the paper's Appendix A.1 condition (its Eq. 37.16). Written here in our own words and letters.

Notation: the paper's of this project, ``p`` the draft law, ``q`` the verifier's law, ``R`` the current target of
the rounds (the residual), ``x`` a candidate. ResiSpec's text and the secondary source use the opposite letters
(their ``p`` is the target, ``q`` the draft): their ``GetProxy(R, q, x)`` is ``get_proxy(R, p, x)`` here.

Algorithm 1 (as reconstructed)::

    R <- q
    for j = 1 .. K:
        x_j ~ p                                   (i.i.d., the original draft law every round)
        accept x_j with probability min(1, R_x / p_x): emit x_j, stop
        otherwise k <- get_proxy(R, p, x_j);  R <- (R - k)_+ / sum (R - k)_+
    all K rejected: emit y ~ R

``get_proxy`` (the guarded reconstruction; a rejection needs ``p_x > R_x``)::

    Z <- p_x - R_x                               (the slack, put on x; budget="local")
    r_x <- 0,  r_i <- min(Z p_i, R_i)  (i != x)   (a residual shaped like the draft, capped by R)
    D <- Z - sum r                                (the deficit)
    for i in the fill order (x skipped):          r_i += min(max(D, 0), R_i - r_i);  D -= that
    s <- Z e_x,  k <- R - r + s

Invariants (checked; ``ProxyConstructionError`` when one fails): ``r_x = 0``, ``0 <= r <= R``, ``sum r = Z``,
``r`` and ``s`` disjoint, ``k >= 0``, ``sum k = 1`` and local alignment ``k_x = p_x``. Then ``(R - k)_+ = r``, so
the next target is ``r / Z``. In exact arithmetic the fill always closes the deficit: the capacity left off
``x`` is ``1 - R_x - sum r >= Z - sum r`` because ``Z = p_x - R_x <= 1 - R_x``.

Reconstruction choices, parameters here (the paper leaves them open, as far as its readers report):
  ``order``   the order the deficit is filled in, which the source leaves unspecified: ``"index"`` (token ids
              ascending), ``"draft"`` (largest ``p_i`` first, ties to the lower id: the draft's high-confidence
              region first), ``"capacity"`` (largest ``R_i - r_i`` first, ties to the lower id), or an explicit
              permutation of ``range(V)``.
  ``budget``  ``"local"`` only: the slack is the local discrepancy ``p_x - R_x``, as Algorithm 1 initialises it.
              The paper's prose (its Eq. 13) takes ``max(Z*, |p_x - R_x|)`` instead; with a larger budget the
              extra slack cannot go on ``x`` without breaking ``k_x = p_x``, and neither ``Z*`` nor where the
              extra slack goes is stated in any text available here, so that variant is refused (ValueError).

Exact laws: ``ResiSpec(order)`` is a ``Rule`` whose acceptance is SpS's ``min(1, R_x / p_x)`` and whose
residual is the proxy update above, so the project's multi-draft exact law runs it unchanged:
``resispec_law(p, q, K)`` is ``tree.tree_step_law(ResiSpec(order), p, q, K, "iid")`` (``V^K`` candidate
histories, exact in float64). ``proxy_law(p, q, proxies)`` is one candidate (``K = 1``) with any family of
proxies ``{x: k_x}``, by the marginal condition: the output is

    P(y = v) = min(p_v, q_v) + sum_x (p_x - q_x)_+ (q - k_x)_+(v) / sum (q - k_x)_+,

which equals ``q_v`` for every ``v`` only if the rejection mixture puts back exactly ``(q - p)_+``.

What the exact laws show (benchmarks/resispec_exactness.py, docs/multi-draft.md): the guarded reconstruction is
not exact. Already at ``K = 1`` its rejection mass ``r^(x)`` sits on every token ``i != x`` with ``p_i > 0`` and
``q_i > 0`` (at least ``min(Z p_i, q_i)``), also where ``q_i <= p_i`` and the verifier needs no mass back.
On the critique's pair ``p = (.6, .3, .1)``, ``q = (.4, .3, .3)`` one candidate gives ``(.4, .48, .12)``
(``"index"`` / ``"draft"``) or ``(.4, .36, .24)`` (``"capacity"``); the smallest case, ``V = 3``, ``K = 1``,
``p = (0, .5, .5)``, ``q = (.5, 0, .5)``, is off by TV >= .25 under every fill order (``k1_tv_lower_bound``).
With ``V = 2`` every proxy is exact, for every ``K``.

    >>> import numpy as np
    >>> from cactus_theory.theory.resispec import resispec_law
    >>> law, acc = resispec_law(np.array([.6, .3, .1]), np.array([.4, .3, .3]), 1)
    >>> np.round(law, 12).tolist(), round(acc, 12)
    ([0.4, 0.48, 0.12], 0.8)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from ..core._array import errstate, is_torch_array, xp_of
from ..core.rules import Rule
from ..core.tree import tree_step_law
from ..core.validate import check_int, check_pqn, check_probs, check_same_shape

__all__ = ["ORDERS", "BUDGETS", "ProxyConstructionError", "Proxy", "get_proxy", "check_local", "proxy_law",
           "ResiSpec", "resispec_law", "k1_tv_lower_bound"]

ORDERS = ("index", "draft", "capacity")  # named fill orders; an explicit permutation of range(V) also works
BUDGETS = ("local",)  # Algorithm 1's slack; Eq. 13's max(Z*, |p_x - R_x|) cannot be reconstructed (docstring)
TOL = 1e-12  # the invariants' tolerance (per token and on sums), float64


class ProxyConstructionError(ValueError):
    """``get_proxy`` built a proxy that breaks one of its invariants (the message names it): never in exact
    arithmetic; in floating point only when the inputs are off the simplex by more than the tolerance."""


class Proxy(NamedTuple):
    """``get_proxy``'s output, float64 (V,): ``k = R - r + s`` the proxy, ``r`` the residual part (the next
    target is ``r / Z``), ``s = Z e_x`` the slack, ``Z`` their common mass."""

    k: np.ndarray
    r: np.ndarray
    s: np.ndarray
    Z: float


def _check_order(order, V: int | None = None):
    """``order`` as given (a name of ``ORDERS``) or as a tuple of ints (a permutation of ``range(V)`` when
    ``V`` is known)."""
    if isinstance(order, str):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS} or a permutation of range(V), got {order!r}")
        return order
    if not isinstance(order, Sequence) or isinstance(order, (bytes, bytearray)):
        raise ValueError(f"order must be one of {ORDERS} or a permutation of range(V), got {order!r}")
    ids = tuple(check_int(i, "order[...]", low=0) for i in order)
    if len(set(ids)) != len(ids) or (V is not None and sorted(ids) != list(range(V))):
        raise ValueError(f"order must be a permutation of range(V){'' if V is None else f' = range({V})'} "
                         f"(each token id once), got {order!r}")
    return ids


def _check_budget(budget) -> str:
    if budget not in BUDGETS:
        raise ValueError(
            f"budget must be one of {BUDGETS}, got {budget!r}: the prose's max(Z*, |p_x - R_x|) (ResiSpec's Eq. 13) "
            "is not reconstructed, since neither Z* nor where the slack beyond p_x - R_x goes is stated in the "
            "text available (putting it on x would break the proxy's local alignment k_x = p_x)")
    return budget


def _fill_order(order, p: np.ndarray, cap: np.ndarray, x: int) -> list[int]:
    V = p.size
    if order == "index":
        seq = range(V)
    elif order == "draft":
        seq = sorted(range(V), key=lambda i: (-p[i], i))
    elif order == "capacity":
        seq = sorted(range(V), key=lambda i: (-cap[i], i))
    else:
        seq = order
    return [int(i) for i in seq if i != x]


def _proxy(R: np.ndarray, p: np.ndarray, x: int, order, tol: float) -> Proxy:
    """The guarded construction on checked float64 rows (``get_proxy`` without the input checks)."""
    V = p.size
    Z = float(p[x] - R[x])
    r = np.minimum(Z * p, R)
    r[x] = 0.0
    deficit = Z - float(r.sum())
    for i in _fill_order(order, p, R - r, x):
        eta = min(max(deficit, 0.0), float(R[i] - r[i]))
        if eta > 0:
            r[i] += eta
            deficit -= eta
    s = np.zeros(V)
    s[x] = Z
    k = R - r + s
    problems = []
    if abs(deficit) > tol:
        problems.append(f"the deficit {deficit:.3g} is left after the fill (no capacity left off x)")
    if r[x] != 0.0:
        problems.append("r_x != 0")
    if np.any(r < -tol) or np.any(r > R + tol):
        problems.append("0 <= r <= R fails")
    if abs(float(r.sum()) - Z) > tol:
        problems.append(f"sum r = {float(r.sum()):.17g} != Z = {Z:.17g}")
    if np.any((r > 0) & (s > 0)):
        problems.append("r and s share a token")
    if np.any(k < -tol) or abs(float(k.sum()) - 1.0) > tol:
        problems.append("k is not a distribution")
    if abs(float(k[x] - p[x])) > tol:
        problems.append(f"k_x = {float(k[x]):.17g} != p_x = {float(p[x]):.17g} (local alignment)")
    if problems:
        raise ProxyConstructionError(f"get_proxy(x={x}): PROXY_CONSTRUCTION_FAILURE: " + "; ".join(problems))
    return Proxy(k, r, s, Z)


def get_proxy(R, p, x: int, *, order="index", budget: str = "local", tol: float = TOL) -> Proxy:
    """ResiSpec's ``GetProxy(R, p, x)`` by the guarded reconstruction (module docstring): the proxy ``k`` for
    the rejected candidate ``x`` given the current target ``R`` and the draft ``p`` (float64 (V,) each).

    ``ValueError`` (before any work) unless ``R`` and ``p`` are probability vectors of one shape (V,), ``x`` is a
    token id in ``[0, V)`` that a round can reject (``p_x > R_x``), ``order`` is a name of ``ORDERS`` or a
    permutation of ``range(V)``, ``budget`` is ``"local"`` and ``tol`` is a number in ``(0, 1e-6]``.
    ``ProxyConstructionError`` (a ``ValueError``) when an invariant fails beyond ``tol``.
    """
    R = np.asarray(R)
    p = np.asarray(p)
    check_probs(R, "R")
    check_probs(p, "p")
    check_same_shape(R, p, "R", "p")
    if R.ndim != 1:
        raise ValueError(f"R must be one distribution (shape (V,)), got shape {R.shape}")
    V = R.size
    xi = check_int(x, "x", low=0)
    if xi >= V:
        raise ValueError(f"x must be a token id in [0, V = {V}), got {x!r}")
    if not p[xi] > R[xi]:
        raise ValueError(f"x = {xi} is not a rejectable candidate: a round rejects only where p_x > R_x "
                         f"(p_x = {float(p[xi]):.6g}, R_x = {float(R[xi]):.6g})")
    ordr = _check_order(order, V)
    _check_budget(budget)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol <= 1e-6:
        raise ValueError(f"tol must be a number in (0, 1e-6], got {tol!r}")
    return _proxy(R.astype(np.float64), p.astype(np.float64), xi, ordr, float(tol))


def check_local(k, R, p, x: int, *, tol: float = TOL) -> tuple[np.ndarray, np.ndarray, float]:
    """The paper's local conditions on a proxy ``k`` for the rejected ``x`` (as the secondary source reports
    them): ``k = R - r + s`` with ``0 <= r <= R``, ``r`` and ``s`` of disjoint supports and equal mass ``Z``, and
    ``k_x = p_x``. For a given ``k`` they read ``r = (R - k)_+``, ``s = (k - R)_+`` (disjoint by construction) and
    hold iff ``k`` is a distribution with ``k_x = p_x`` (``sum k = 1`` makes the masses equal). Returns
    ``(r, s, Z)``; ``ValueError`` naming the condition that fails."""
    k, R, p = (np.asarray(a, dtype=np.float64) for a in (k, R, p))
    check_same_shape(k, R, "k", "R")
    check_same_shape(R, p, "R", "p")
    xi = check_int(x, "x", low=0)
    if k.ndim != 1 or xi >= k.size:
        raise ValueError(f"k, R, p must be vectors (V,) and x a token id in [0, V), got shape {k.shape}, x = {x!r}")
    if not np.all(np.isfinite(k)) or np.any(k < -tol) or abs(float(k.sum()) - 1.0) > tol:
        raise ValueError(f"the proxy k must be a distribution (k >= 0, sum k = 1), got {k.tolist()}")
    if abs(float(k[xi] - p[xi])) > tol:
        raise ValueError(f"the proxy k breaks local alignment: k_x = {float(k[xi]):.6g} != p_x = {float(p[xi]):.6g}")
    r, s = np.maximum(R - k, 0.0), np.maximum(k - R, 0.0)
    return r, s, float(r.sum())


def proxy_law(p, q, proxies: Mapping[int, object], *, tol: float = TOL) -> np.ndarray:
    """Exact output law (V,) of one candidate ``x ~ p`` verified against ``q`` (accepted with ``min(1, q_x /
    p_x)``) whose rejection falls back to ``(q - k_x)_+`` renormalised, for a given proxy ``k_x`` per rejectable
    ``x`` (the marginal condition, module docstring). ``proxies`` maps every ``x`` with ``p_x > q_x`` to its
    proxy (V,); each is checked by ``check_local`` against ``R = q``. ``ValueError`` unless ``p``, ``q`` are
    probability vectors of one shape, every rejectable ``x`` has a proxy (and no other token one) and each proxy
    meets the local conditions."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    check_pqn(p, q)
    if p.ndim != 1:
        raise ValueError(f"p must be one distribution (shape (V,)), got shape {p.shape}")
    if not isinstance(proxies, Mapping):
        raise ValueError(f"proxies must map each rejectable candidate x (p_x > q_x) to its proxy, got {proxies!r}")
    need = {int(i) for i in np.flatnonzero(p > q)}
    got = {check_int(x, "proxies key", low=0) for x in proxies}
    if got != need:
        raise ValueError(f"proxies must have exactly the rejectable candidates {sorted(need)} (p_x > q_x) as keys, "
                         f"got {sorted(got)}")
    law = np.minimum(p, q)
    for x, k in proxies.items():
        r, _, Z = check_local(k, q, p, int(x), tol=tol)
        if Z <= 0:
            raise ValueError(f"the proxy for x = {x} leaves no residual mass ((q - k)_+ = 0)")
        law = law + (p[int(x)] - q[int(x)]) * r / Z
    return law


@dataclass(frozen=True)
class ResiSpec(Rule):
    """One round of ResiSpec, as a rule: acceptance ``min(1, R_x / p_x)`` (SpS's, with ``R`` the round's target
    in the place of ``q``) and, on rejection, the next target ``r / Z`` from ``get_proxy(R, p, x, order=...)``.
    Run with i.i.d. candidates by the multi-draft exact law (``resispec_law``) or ``tree.verify_tree`` with
    ``scheme="iid"``. Not a registry rule: its claim is lossless and its law is not (module docstring), and the
    registry's ``lossless`` flag states a proven property. ``budget``: ``"local"`` only (see ``BUDGETS``)."""

    order: str | tuple = "index"
    budget: str = "local"
    needs_row_stats: ClassVar[bool] = False  # phi reads p_n and q_n only
    bonus_from_q: ClassVar[bool] = True

    def __post_init__(self):
        o = _check_order(self.order)
        object.__setattr__(self, "order", o)
        _check_budget(self.budget)

    def phi(self, p_n, q_n, *stats):
        """``min(1, q_n / p_n)`` (clipped by ``accept_from``; ``p_n = 0`` never accepted)."""
        xp = xp_of(p_n, q_n)
        with errstate():
            return xp.where(p_n > 0, q_n / xp.where(p_n > 0, p_n, xp.ones_like(p_n)), xp.zeros_like(p_n))

    def residual(self, p, q, n, *, check: bool = True):
        """The next target ``r / Z`` (..., V) after rejecting ``n``; ``q`` itself where ``n`` cannot be rejected
        (``p_n <= q_n``: the round then accepts with probability 1)."""
        if check:
            check_pqn(p, q, n)
        torch_in = is_torch_array(q)
        P, Q = ((a.detach().cpu().double().numpy() if torch_in else np.asarray(a, np.float64)) for a in (p, q))
        N = n.detach().cpu().numpy() if is_torch_array(n) else np.asarray(n)
        if self.order not in ORDERS and len(self.order) != P.shape[-1]:
            _check_order(self.order, P.shape[-1])
        shape = Q.shape
        P2, Q2, N1 = P.reshape(-1, shape[-1]), Q.reshape(-1, shape[-1]), N.reshape(-1)
        out = Q2.copy()
        for j in range(N1.size):
            x = int(N1[j])
            if P2[j, x] > Q2[j, x]:
                pr = _proxy(Q2[j], P2[j], x, self.order, TOL)
                out[j] = pr.r / pr.r.sum()
        out = out.reshape(shape)
        if torch_in:
            import torch

            return torch.from_numpy(out).to(dtype=q.dtype, device=q.device)
        return out


def resispec_law(p, q, K: int, *, order="index", budget: str = "local") -> tuple[np.ndarray, float]:
    """Exact law (V,) of the token ResiSpec emits with ``K`` i.i.d. candidates from ``p`` against the verifier
    ``q``, and its acceptance ``P(some candidate accepted)``: the multi-draft exact law
    ``tree_step_law(ResiSpec(order, budget), p, q, K, "iid")`` (``V^K`` histories). ``K = 0`` is ``q``.
    ``ValueError`` unless ``p``, ``q`` are probability vectors of one shape (V,), ``K`` is an integer >= 0 and
    ``order`` / ``budget`` are valid."""
    rule = ResiSpec(order, budget)
    p, q = np.asarray(p), np.asarray(q)
    if isinstance(rule.order, tuple):
        _check_order(rule.order, p.shape[-1] if p.ndim else None)
    return tree_step_law(rule, p, q, K, "iid")


def k1_tv_lower_bound(p, q) -> float:
    """A lower bound on ``TV(law, q)`` for the guarded reconstruction with one candidate (``K = 1``), whatever the
    fill order: with ``A = {x : p_x > q_x}`` and ``Z_x = p_x - q_x``,

        TV >= LB = sum_{i : p_i >= q_i} sum_{x in A, x != i} min(Z_x p_i, q_i).

    Why: at a token with ``p_i >= q_i`` the accepted mass already is ``min(p_i, q_i) = q_i``, so every bit of
    rejection mass there is excess, and each rejected ``x != i`` leaves at least ``min(Z_x p_i, q_i)`` there
    before the fill. ``LB > 0`` (inexact) as soon as some other token has ``p_i >= q_i > 0``; ``LB = 0`` is
    necessary for exactness, not sufficient (the fill must also return exactly ``(q - p)_+``). ``ValueError``
    unless ``p``, ``q`` are probability vectors of one shape (V,)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    check_pqn(p, q)
    if p.ndim != 1:
        raise ValueError(f"p must be one distribution (shape (V,)), got shape {p.shape}")
    A = np.flatnonzero(p > q)
    lb = 0.0
    for i in np.flatnonzero(p >= q):
        lb += sum(min(float(p[x] - q[x]) * float(p[i]), float(q[i])) for x in A if x != i)
    return lb
