"""Exact (not sampled) one-step output laws of any rule, in float64 numpy.

One verification step drafts ``n ~ p``, accepts it with probability ``phi_n`` and otherwise emits a
token from ``g_n``; its output law is

    h_alg(y) = sum_n p_n [phi_n 1(y = n) + (1 - phi_n) g_n(y)]            (the paper's mixture)

``induced_distribution`` evaluates this for any rule (generic path: all ``V`` recovery rows,
chunked) or, for the two-block family (SpS, Cactus with any divergence), in O(V log V) by sorting.
``bonus_distribution`` is the law of the bonus token a block emits when all its drafts pass: ``q``
itself, or the rule's own (``rule.bonus``, e.g. Medusa's ``argmax q``); ``toy.sequence_law`` chains
both into the exact law of whole blocks.
"""

from __future__ import annotations

import numpy as np
from array_api_compat import is_torch_array

from .rules import Rule, ScalingRule, check_rule
from .validate import check_pqn, check_probs

__all__ = ["induced_distribution", "acceptance_rate", "induced_generic", "induced_scaling", "step_divergence",
           "bonus_distribution", "relaxed_bonus_distribution", "induced_rows", "ROWS_MAX_V"]

CHUNK_ELEMENTS = 1 << 22  # residual rows held at once by the generic path: ~32 MiB of float64
ROWS_MAX_V = 512  # induced_rows holds every recovery row of every row: (..., V, V)


def _as_f64(p, q, check: bool = True):
    """float64 numpy copies of ``p`` and ``q``, validated (with ``check``) in their own dtype.

    Arrays and tensors are checked as given (``check_pqn``: a float16 row may stray from 1 by its dtype's
    tolerance, 1e-2), then read in float64 (a torch tensor of any dtype, bfloat16 included, detached, from
    any device); rows given in a precision below float64 are renormalised there, so the exact laws sum to
    1 in float64. Other array-likes (lists, integer rows) are read as float64 first and checked as float64."""
    arrays = all(x.is_floating_point() if is_torch_array(x) else isinstance(x, np.ndarray)
                 and np.issubdtype(x.dtype, np.floating) for x in (p, q)) and is_torch_array(p) == is_torch_array(q)
    if check and arrays:
        check_pqn(p, q)
    out = []
    for x in (p, q):
        low = arrays and str(x.dtype).replace("torch.", "") != "float64"
        x = x.detach().cpu().double().numpy() if is_torch_array(x) else np.asarray(x, dtype=np.float64)
        if low and x.size and bool(np.all(np.isfinite(x))):
            z = x.sum(-1, keepdims=True)
            x = np.where(z > 0, x / np.where(z > 0, z, 1.0), x)
        out.append(x)
    if check and not arrays:
        check_pqn(*out)
    return tuple(out)


def acceptance_rate(rule: Rule, p, q, *, check: bool = True) -> np.ndarray:
    """Probability that the drafted token is accepted: ``sum_n p_n phi_n``; (..., V) -> (...)."""
    check_rule(rule)
    p, q = _as_f64(p, q, check)
    return np.sum(p * rule.accept_prob_all(p, q), axis=-1)


def bonus_distribution(rule: Rule, q, *, check: bool = True) -> np.ndarray:
    """Law of the bonus token, (..., V) -> (..., V), from the verifier's law ``q`` at the position after
    the last draft: ``q`` if ``rule.bonus_from_q``, else ``rule.bonus(q)`` (float64)."""
    check_rule(rule)
    q = np.asarray(q, dtype=np.float64)
    if check:
        check_probs(q, "q")
    return q.copy() if rule.bonus_from_q else np.asarray(rule.bonus(q), dtype=np.float64)


def relaxed_bonus_distribution(rule: Rule, p, q, *, check: bool = True) -> np.ndarray:
    """Law of the bonus token under relaxed-spec-dec-repro's ``relaxed_T_qp`` policy (``rules.GRAPHCORE_PIN``,
    ``RejectionSampler.apply_relaxed_bonus``): the draft runs one more step at the bonus position, giving its row
    ``p``, and the bonus token is one step of the rule there against the verifier's row ``q``: the rule's one-step law
    ``induced_distribution(rule, p, q)``. For a whole-row target (SpecCascades OPT, r-fuzzy: the draft's or the
    verifier's own bonus sample picked by the gate; Tok3, SCD: a sample of the target row) that is the target ``h``
    itself; for mentored decoding (and Cactus) one accept / residual step on the draft's bonus sample. The registry's
    rules keep upstream's default policy, ``target_p`` (``bonus_distribution``: the verifier's row), because the
    engines here run no draft step at the bonus position."""
    return induced_distribution(rule, p, q, check=check)


def induced_generic(rule: Rule, p, q, *, check: bool = True, chunk_elements: int = CHUNK_ELEMENTS) -> np.ndarray:
    """``h_alg`` for any rule by summing ``p_n (1 - phi_n) g_n`` over ``n``; memory O(chunk) not O(V^2)."""
    check_rule(rule)
    p, q = _as_f64(p, q, check)
    batch, V = p.shape[:-1], p.shape[-1]
    p2, q2 = p.reshape(-1, V), q.reshape(-1, V)
    phi = rule.accept_prob_all(p, q).reshape(-1, V)  # on the caller's shape: a per-token statistic bound to
    out = p2 * phi                                    # these rows (DropMatch's hit) is matched, never reshaped
    w = p2 * (1 - phi)  # (R, V): weight of each candidate's recovery row
    step = max(1, chunk_elements // V)
    for r in range(p2.shape[0]):
        live = np.flatnonzero(w[r] > 0)
        for s in range(0, live.size, step):
            n = live[s:s + step]
            P = np.broadcast_to(p2[r], (n.size, V))
            Q = np.broadcast_to(q2[r], (n.size, V))
            g = rule.residual(P, Q, n, check=False)
            out[r] += w[r, n] @ g
    return out.reshape(*batch, V)


def induced_rows(rule: Rule, p, q, *, check: bool = True) -> np.ndarray:
    """``h_alg`` of many small rows at once (float64): the same mixture as ``induced_generic``,
    ``sum_n p_n [phi_n e_n + (1 - phi_n) g_n]``, with every candidate's recovery row ``g_n`` built in one
    call of the rule's own ``residual`` on (..., V, V) arrays (memory O(V^2) per row, so ``V <=
    ROWS_MAX_V``). For rows cut to their support (at most ``2 top_k`` tokens under the paper's sampling)
    and for a rule whose parameters differ per row (``budget.CactusRows``: one ``delta`` per row)."""
    check_rule(rule)
    p, q = _as_f64(p, q, check)
    V = p.shape[-1]
    if V > ROWS_MAX_V:
        raise ValueError(f"induced_rows holds V x V recovery rows per row: V must be <= {ROWS_MAX_V}, got {V} "
                         "(use induced_distribution)")
    phi = rule.accept_prob_all(p, q)
    w = p * (1 - phi)  # weight of each candidate's recovery row
    shape = p.shape[:-1] + (V, V)
    n = np.broadcast_to(np.arange(V), p.shape)
    g = rule.residual(np.broadcast_to(p[..., None, :], shape), np.broadcast_to(q[..., None, :], shape), n, check=False)
    g = np.where((w > 0)[..., None], g, 0.0)  # a row of weight 0 carries nothing (and may be 0/0)
    return p * phi + np.einsum("...n,...nv->...v", w, g)


def _induced_scaling_row(rule: ScalingRule, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """O(V log V) ``h_alg`` for a two-block rule, one row.

    For candidate ``n`` with ``gamma_n < p_n`` (so rejection is possible) and scale
    ``s_n = (1 - gamma_n)/(1 - q_n)``, the recovery mass at ``y != n`` is ``(s_n q_y - p_y)_+ / Z_n``,
    positive iff ``r_y = p_y / q_y < s_n``. Sorting ``r`` gives every ``Z_n`` by a prefix sum; sorting
    ``s`` gives every output ``y`` by a suffix sum; the ``y = n`` terms are then removed.
    """
    V = p.size
    phi = rule.accept_from(p, q)
    out = p * phi
    rej = (p > 0) & (phi < 1)
    if not rej.any():
        return out
    idx = np.flatnonzero(rej)
    qi, pi = q[idx], p[idx]
    si = rule.scale(qi, rule.gamma(qi))  # gamma is only needed where rejection is possible
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)
    # Z_n = sum_{i != n} (s_n q_i - p_i)_+  (the n term itself is (gamma_n - p_n)_+ = 0 when rejecting)
    order = np.argsort(r, kind="stable")
    cq = np.concatenate([[0.0], np.cumsum(q[order])])
    cp = np.concatenate([[0.0], np.cumsum(p[order])])
    k = np.searchsorted(r[order], si, side="left")  # count of r_i < s_n
    Z = si * cq[k] - cp[k]
    Z -= np.where(r[idx] < si, si * qi - pi, 0.0)
    w = pi * (1 - phi[idx]) / Z
    # out[y] += sum_{n: s_n > r_y, n != y} w_n (s_n q_y - p_y)
    so = np.argsort(si, kind="stable")
    s_sorted = si[so]
    ws = np.concatenate([np.cumsum((w * si)[so][::-1])[::-1], [0.0]])
    w1 = np.concatenate([np.cumsum(w[so][::-1])[::-1], [0.0]])
    j = np.searchsorted(s_sorted, r, side="right")  # first n with s_n > r_y
    add = q * ws[j] - p * w1[j]
    add = np.where(np.isfinite(r), add, 0.0)  # q_y = 0 receives nothing
    self_term = np.zeros(V)
    self_term[idx] = np.where(si > r[idx], w * (si * qi - pi), 0.0)
    out += np.maximum(add - self_term, 0.0)
    return out


def induced_scaling(rule: ScalingRule, p, q, *, check: bool = True) -> np.ndarray:
    """Fast path of ``induced_distribution`` for SpS / Cactus (any divergence, any solver)."""
    if not isinstance(rule, ScalingRule):
        raise ValueError(f"the fast path needs a two-block rule (SpS, Cactus), got {rule!r}")
    p, q = _as_f64(p, q, check)
    V = p.shape[-1]
    p2, q2 = p.reshape(-1, V), q.reshape(-1, V)
    out = np.stack([_induced_scaling_row(rule, a, b) for a, b in zip(p2, q2, strict=True)])
    return out.reshape(p.shape)


def induced_distribution(rule: Rule, p, q, *, method: str = "auto", check: bool = True) -> np.ndarray:
    """Exact output law ``h_alg`` (..., V) of one verification step of ``rule`` with draft ``p``.

    ``method``: ``"auto"`` (fast path for SpS / Cactus, generic otherwise), ``"fast"`` or ``"generic"``.
    The fast path derives ``phi_n`` and ``g_n`` from ``gamma`` alone, so ``"auto"`` takes it only for
    rules that declare ``two_block`` (``rules.Rule``): a subclass overriding ``phi``, ``residual`` or
    another method that property vouches for, such as a deliberately wrong port, loses the declaration
    and is summed row by row from its own code.
    """
    check_rule(rule)
    if method not in ("auto", "fast", "generic"):
        raise ValueError(f"method must be 'auto', 'fast' or 'generic', got {method!r}")
    if method == "fast" or (method == "auto" and rule.two_block):
        return induced_scaling(rule, p, q, check=check)
    return induced_generic(rule, p, q, check=check)


def step_divergence(rule: Rule, p, q, name: str = "kl", *, check: bool = True) -> np.ndarray:
    """``D(h_alg || q)`` of one step (Theorem 3's left-hand side); (..., V) -> (...)."""
    from .divergences import divergence

    h = induced_distribution(rule, p, q, check=check)
    q64 = _as_f64(q, q, check=False)[1]  # read as induced_distribution reads it (bfloat16 tensors upcast)
    return divergence(h, q64, name, check=False)
