"""Tree verification shared by the runtime and the theory: tree shapes, the candidate schemes'
helpers and the batched sampler ``verify_tree`` (any rule; schemes ``SCHEMES``, modes ``MODES``).

The schemes, modes and their losslessness are described in ``cactus_theory.theory.tree`` (which
holds the exact laws and re-exports everything here, as does the public path ``cactus_theory.tree``).
The shapes (the ``Tree`` protocol, ``StaticTree``, ``DynamicTree``, ``BudgetTree``, ``as_tree``, the parents
helpers), schemes and modes live in the torch-free ``core.tree_shapes`` and are re-exported here.
Tensor layout (``verify_tree``): ``tokens`` / ``parents`` (B, N) int64, ``draft_probs`` (B, N, V),
``verifier_probs`` (B, N + 1, V) float; row 0 of ``verifier_probs`` is the root's law.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .draws import check_generator, uniforms
from .rules import Rule, ScalingRule, SpS
from .sampler import check_common, sample_rows
from .tree_shapes import (
    BUDGET_DEPTH,
    BUDGET_TOPK,
    MODES,
    RERANK_SCHEMES,
    SCHEMES,
    BudgetTree,
    DynamicTree,
    Grow,
    StaticTree,
    Tree,
    as_tree,
    branching_parents,
    chain_parents,
    check_parents,
    check_scheme,
    check_tree_scheme,
    node_depths,
)
from .validate import check_int, check_probs, check_same_shape, check_token

__all__ = ["SCHEMES", "MODES", "RuleSpec", "set_target", "chain_parents", "branching_parents", "children_lists",
           "top_candidates", "TreeVerifyResult", "verify_tree", "check_scheme", "check_rules", "check_mode",
           "round_rule", "check_parents", "node_depths", "drop_token", "without", "DynamicTree", "BudgetTree", "RERANK_SCHEMES", "BUDGET_DEPTH",
           "BUDGET_TOPK", "Tree", "StaticTree", "Grow", "as_tree",
           "check_tree_scheme", "rerank", "node_parts", "tree_step_law",
           "node_law_rows"]

RuleSpec = Rule | Sequence[Rule]


# -- tree shapes and small helpers ----------------------------------------------------------------

def check_rules(rule: RuleSpec) -> tuple[Rule, ...]:
    """A Rule or a non-empty sequence of Rules (one per round) -> tuple of Rules; a stateful rule
    (``SequenceBudget``) decides every round of a node itself, so it comes alone."""
    if isinstance(rule, Rule):
        return (rule,)
    if isinstance(rule, (list, tuple)) and rule and all(isinstance(r, Rule) for r in rule):
        if len(rule) > 1 and any(r.stateful for r in rule):
            raise ValueError(f"rule: a stateful rule (SequenceBudget) sets every round of a node itself; pass it "
                             f"alone, not in a sequence of per-round rules, got {rule!r}")
        return tuple(rule)
    raise ValueError(f"rule must be a cactus_theory Rule or a non-empty sequence of Rules (one per round), "
                     f"got {rule!r}")


def round_rule(rules: tuple[Rule, ...], i: int) -> Rule:
    return rules[min(i, len(rules) - 1)]


def check_mode(mode: str, rules: tuple[Rule, ...]) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    two_block = len(rules) == 1 and (isinstance(rules[0], ScalingRule) or getattr(rules[0], "two_block_steps", False))
    if mode == "joint" and not two_block:
        raise ValueError(f"rule: mode='joint' needs one two-block rule (SpS, Cactus: a gamma(q_n)), got {rules!r}")


def set_target(rule: ScalingRule, q, S):
    """Theorem 2 on a candidate set: the two-block target with block ``S`` (numpy or torch).

    ``q`` (..., V), ``S`` (..., V) boolean mask of the node's candidate tokens. With
    ``q_S = sum_{i in S} q_i`` and ``gamma = rule.gamma(q_S)``:
    ``h_i = q_i gamma / q_S`` on ``S``, ``h_i = q_i (1 - gamma) / (1 - q_S)`` off ``S``. By Jensen (as in
    Theorem 2, with the event ``y in S`` in place of ``y = n``) this is the law of largest ``h(S)``
    within ``D_f(h || q) <= delta`` for every f-divergence. Conventions: ``q_S = 0`` gives ``h = q``
    (a set the verifier gives no mass is not boosted); ``q_S = 1`` gives ``h = q``.
    """
    if isinstance(q, torch.Tensor):
        S = S.to(torch.bool)
        qS = torch.where(S, q, torch.zeros_like(q)).sum(-1, keepdim=True).clamp(0.0, 1.0)
        g = rule.gamma(qS)
        inside = torch.where(qS > 0, g / torch.where(qS > 0, qS, torch.ones_like(qS)), torch.ones_like(qS))
        h = torch.where(S, q * inside, q * rule.scale(qS, g))
        return torch.where(qS > 0, h, q)
    q = np.asarray(q, dtype=np.float64)
    S = np.asarray(S, dtype=bool)
    qS = np.clip(np.where(S, q, 0.0).sum(-1, keepdims=True), 0.0, 1.0)
    g = rule.gamma(qS)
    with np.errstate(invalid="ignore", divide="ignore"):
        inside = np.where(qS > 0, g / np.where(qS > 0, qS, 1.0), 1.0)
    h = np.where(S, q * inside, q * rule.scale(qS, g))
    return np.where(qS > 0, h, q)


def _check_rerank(logpath, parents, keep) -> int:
    """``rerank``'s argument checks (see there); returns ``keep`` as an ``int``."""
    torch_in = isinstance(logpath, torch.Tensor), isinstance(parents, torch.Tensor)
    if torch_in[0] != torch_in[1]:
        raise ValueError(f"rerank: logpath and parents must both be torch tensors or both numpy arrays, got "
                         f"{type(logpath).__name__} and {type(parents).__name__}")
    if not torch_in[0]:
        logpath, parents = np.asarray(logpath), np.asarray(parents)
    lshape, pshape = tuple(logpath.shape), tuple(parents.shape)
    if lshape != pshape or not lshape or lshape[-1] < 1:
        raise ValueError(f"rerank: logpath and parents must have one shape (..., N) with N >= 1, got {lshape} "
                         f"and {pshape}")
    N = lshape[-1]
    integer = (not parents.dtype.is_floating_point and not parents.is_complex() and parents.dtype != torch.bool
               if torch_in[0] else np.issubdtype(parents.dtype, np.integer))
    if not integer:
        raise ValueError(f"rerank: parents must hold integers, got dtype {parents.dtype}")
    if parents.numel() if torch_in[0] else parents.size:
        lo, hi = (int(parents.min()), int(parents.max()))
        if lo < -1 or hi >= N:
            raise ValueError(f"rerank: parents must be node indices in [-1, N = {N}), got values from {lo} to {hi}")
    nan = bool(torch.isnan(logpath).any()) if torch_in[0] else bool(np.isnan(np.asarray(logpath, np.float64)).any())
    if nan:
        raise ValueError("rerank: logpath has NaN (a path log-probability must be a number or -inf)")
    k = check_int(keep, "keep", low=0)
    if k > N:
        raise ValueError(f"keep must be an integer in [0, N = {N}] (the nodes to keep of the N grown), got {keep!r}")
    return k


def rerank(logpath, parents, keep: int):
    """The ``keep`` nodes of highest path log-probability ``logpath`` (..., N) float64 (ties to the
    lower node index), as sorted node indices (..., keep) int64 (numpy or torch alike), and the kept
    tree's parents (..., keep) int64 renumbered to the kept nodes (-1: the root). ``parents``
    (..., N) int64. The kept set is ancestor-closed when a child's path log-probability is at most
    its parent's (as it is for probabilities <= 1): checked. ``ValueError`` unless ``logpath`` and
    ``parents`` are arrays of one kind and one shape (..., N) with N >= 1, ``logpath`` has no NaN,
    ``parents`` holds integers in [-1, N) and ``keep`` is an integer in [0, N]."""
    keep = _check_rerank(logpath, parents, keep)
    if isinstance(logpath, torch.Tensor):
        order = torch.sort(-logpath, dim=-1, stable=True).indices[..., :keep].sort(-1).values
        par = parents.gather(-1, order)
        new = torch.full_like(parents, -1)
        new.scatter_(-1, order, torch.arange(keep, device=order.device).expand_as(order))
        kept_par = torch.where(par >= 0, new.gather(-1, par.clamp_min(0)), par)
        if bool(((par >= 0) & (kept_par < 0)).any()):
            raise ValueError("rerank: a kept node's parent was dropped (a path probability above its parent's)")
        return order, kept_par
    logpath, parents = np.asarray(logpath, dtype=np.float64), np.asarray(parents, dtype=np.int64)
    order = np.sort(np.argsort(-logpath, axis=-1, kind="stable")[..., :keep], axis=-1)
    par = np.take_along_axis(parents, order, -1)
    new = np.full(parents.shape, -1, dtype=np.int64)
    np.put_along_axis(new, order, np.broadcast_to(np.arange(keep), order.shape), -1)
    kept_par = np.where(par >= 0, np.take_along_axis(new, np.maximum(par, 0), -1), par)
    if ((par >= 0) & (kept_par < 0)).any():
        raise ValueError("rerank: a kept node's parent was dropped (a path probability above its parent's)")
    return order, kept_par


def children_lists(parents: Sequence[int]) -> list[list[int]]:
    """Children of each slot, in node order (the order of their rounds): slot 0 is the root, slot
    ``j + 1`` is node ``j``."""
    par = check_parents(parents)
    kids: list[list[int]] = [[] for _ in range(len(par) + 1)]
    for j, a in enumerate(par):
        kids[a + 1].append(j)
    return kids


def top_candidates(p, K: int) -> np.ndarray:
    """The ``K`` most likely tokens of ``p`` (..., V), most likely first, ties to the lower id: (..., K)."""
    p = np.asarray(p, dtype=np.float64)
    if not (isinstance(K, (int, np.integer)) and 0 <= K <= p.shape[-1]):
        raise ValueError(f"num_children must be an integer in [0, V = {p.shape[-1]}] for deterministic "
                         f"candidates, got {K!r}")
    return np.argsort(-p, axis=-1, kind="stable")[..., :K]


def drop_token(r, x):
    """``r`` with ``r(x) = 0``, renormalised (EAGLE's recovery); ``r`` itself if nothing is left. numpy or torch."""
    if isinstance(r, torch.Tensor):
        z = r.scatter(-1, x.long().unsqueeze(-1), 0.0)
        s = z.sum(-1, keepdim=True)
        return torch.where(s > 0, z / torch.where(s > 0, s, torch.ones_like(s)), r)
    z = r.copy()
    z[np.arange(len(x)), x] = 0.0
    s = z.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s > 0, z / np.where(s > 0, s, 1.0), r)


def without(p, removed):
    """``p`` without the ``removed`` tokens, renormalised; an all-zero row where nothing is left."""
    if isinstance(p, torch.Tensor):
        z = torch.where(removed, torch.zeros_like(p), p)
        s = z.sum(-1, keepdim=True)
        return torch.where(s > 0, z / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(z))
    z = np.where(removed, 0.0, p)
    s = z.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(s > 0, z / np.where(s > 0, s, 1.0), 0.0)



# -- one node: exact law ------------------------------------------------------------------------

def node_parts(rule: RuleSpec, p, q, num_children: int, scheme: str = "iid",
               candidates=None, mode: str = "rounds") -> tuple[np.ndarray, np.ndarray]:
    """One node's verification split by outcome, exactly (float64): ``acc`` (K, V) and ``rej`` (V,).

    ``acc[i, x]`` = P(round ``i`` accepts and its candidate is ``x``), ``rej[y]`` = P(all ``K``
    candidates rejected and ``y`` emitted); together they sum to 1. With ``L(r, i)`` the law emitted
    from round ``i`` on, given target ``r``:

        L(r, K) = r,   L(r, i) = sum_x P_i(x) [phi_i(x) e_x + (1 - phi_i(x)) L(g_i(x), i + 1)]

    where ``P_i`` is the law of candidate ``i`` given the earlier ones (``p``; ``p`` without the earlier
    candidates, renormalised; or a point mass at the deterministic ``candidates[i]``), ``phi_i`` and
    ``g_i`` are the round's rule on the round's draft law ``p_i`` (see the module docstring; ``"eagle"``
    recovers by zeroing ``x``). Expanded breadth-first: ``V^K`` states for random candidates.

    ``candidates`` (K,) int: the deterministic schemes' tokens, default ``top_candidates(p, K)``.

    ``mode="joint"``: the node first sets ``r_0 = set_target(rule, q, S)`` with ``S`` the set of its
    candidate tokens, then runs SpS rounds (the scheme's draft laws; EAGLE's recovery for ``"eagle"``)
    towards ``r_0``. As ``r_0`` depends on all candidates, the law is summed over whole candidate
    tuples (``V^K`` for random candidates; without replacement a tuple ends when ``p``'s support is
    exhausted): ``L = sum_t P(t) L_SpS(r_0(S(t)) | t)``.
    """
    rules = check_rules(rule)
    check_scheme(scheme)
    check_mode(mode, rules)
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    check_probs(p, "p")
    check_probs(q, "q")
    check_same_shape(p, q, "p", "q")
    if p.ndim != 1:
        raise ValueError(f"p must be one distribution (shape (V,)), got shape {p.shape}")
    if isinstance(num_children, (bool, np.bool_)) or not (isinstance(num_children, (int, np.integer))
                                                         and num_children >= 0):
        raise ValueError(f"num_children must be an integer >= 0, got {num_children!r}")
    V, K = p.size, int(num_children)
    det = scheme in ("deterministic", "eagle")
    if det:
        if candidates is None:
            cands = top_candidates(p, K)
        else:
            cands = np.asarray(candidates)
            if not np.issubdtype(cands.dtype, np.integer):
                raise ValueError(f"candidates must hold integer token ids, got dtype {cands.dtype}")
            check_token(cands, V, (K,), "candidates")
    elif candidates is not None:
        raise ValueError(f"candidates are only read by the deterministic schemes, not by scheme={scheme!r}")
    if mode == "joint":
        return _joint_parts(rules[0], p, q, K, scheme, cands if det else None)
    acc = np.zeros((K, V))
    W = np.ones(1)  # weights of the live states
    R = q[None].copy()  # their targets r
    Rm = np.zeros((1, V), dtype=bool)  # their removed candidates (without replacement)
    for i in range(K):
        rl = round_rule(rules, i)
        M = W.size
        if det:
            mi = np.arange(M)
            x = np.full(M, int(cands[i]))
            w = W.copy()
            Pi = np.broadcast_to(np.arange(V) == cands[i], (M, V)).astype(np.float64) if scheme == "deterministic" \
                else np.broadcast_to(p, (M, V))
            idle = np.zeros(M, dtype=bool)
        else:
            Pi = np.broadcast_to(p, (M, V)) if scheme == "iid" else without(np.broadcast_to(p, (M, V)), Rm)
            mi, x = np.nonzero(Pi > 0)
            w = W[mi] * Pi[mi, x]
            idle = Pi.sum(-1) <= 0  # nothing left to draw: the round does not happen
        Pp, Rr = np.ascontiguousarray(Pi[mi]), R[mi]
        phi = rl.accept_prob(Pp, Rr, x, check=False) if mi.size else np.zeros(0)
        np.add.at(acc[i], x, w * phi)
        if mi.size:
            G = drop_token(Rr, x) if scheme == "eagle" else rl.residual(Pp, Rr, x, check=False)
            skip = Pp[np.arange(mi.size), x] <= 0  # impossible candidate: r unchanged
            G = np.where(skip[:, None], Rr, G)
        else:
            G = np.zeros((0, V))
        Rm_new = Rm[mi].copy()
        Rm_new[np.arange(mi.size), x] = True
        W = np.concatenate([w * (1 - phi), W[idle]])
        R = np.concatenate([G, R[idle]])
        Rm = np.concatenate([Rm_new, Rm[idle]])
        live = W > 0
        W, R, Rm = W[live], R[live], Rm[live]
    rej = W @ R if W.size else np.zeros(V)
    return acc, rej


def _candidate_tuples(p: np.ndarray, K: int, scheme: str, cands) -> list[tuple[tuple[int, ...], float]]:
    """Every candidate tuple with its probability: ``p^K`` (i.i.d.), sequential draws without
    replacement (a tuple stops early once ``p``'s support is exhausted), or the one deterministic tuple."""
    if cands is not None:
        return [(tuple(int(c) for c in cands), 1.0)]
    support = [int(x) for x in np.flatnonzero(p > 0)]
    out: list[tuple[tuple[int, ...], float]] = []
    stack: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    while stack:
        t, w = stack.pop()
        if len(t) == K:
            out.append((t, w))
            continue
        if scheme == "iid":
            stack.extend((t + (x,), w * p[x]) for x in support)
            continue
        left = [x for x in support if x not in t]
        mass = float(p[left].sum()) if left else 0.0
        if mass <= 0:
            out.append((t, w))
        else:
            stack.extend((t + (x,), w * p[x] / mass) for x in left)
    return out


def _joint_parts(rule: ScalingRule, p: np.ndarray, q: np.ndarray, K: int, scheme: str, cands):
    """``node_parts`` for ``mode="joint"`` (see there)."""
    V = p.size
    acc, rej = np.zeros((K, V)), np.zeros(V)
    sps = SpS()
    eye = np.eye(V)
    for t, w in _candidate_tuples(p, K, scheme, cands):
        if w <= 0:
            continue
        S = np.zeros(V, dtype=bool)
        S[list(t)] = True
        r = set_target(rule, q, S)
        m = w
        for i, x in enumerate(t):
            if scheme in ("iid", "eagle"):
                pi = p
            elif scheme == "without_replacement":
                pi = without(p, np.isin(np.arange(V), t[:i]))
            else:
                pi = eye[x]
            if pi[x] <= 0:  # impossible candidate: skipped
                continue
            phi = float(sps.accept_prob(pi[None], r[None], np.array([x]), check=False)[0])
            acc[i, x] += m * phi
            r = drop_token(r[None], np.array([x]))[0] if scheme == "eagle" else \
                sps.residual(pi[None], r[None], np.array([x]), check=False)[0]
            m *= 1 - phi
        rej += m * r
    return acc, rej


def node_law_rows(rule: Rule, p, q, candidates, mode: str = "rounds") -> tuple[np.ndarray, np.ndarray]:
    """One node's exact law for R nodes at once with deterministic candidates (scheme ``"deterministic"``):
    ``p``, ``q`` (R, V) float64, ``candidates`` (R, K) distinct token ids, tried in order -> (law (R, V),
    acceptance (R,) = P(some candidate accepted)). The recursion of ``node_parts`` with the point-mass draft
    law ``p_i = e_{x_i}`` (one state per node), batched so that ``rule`` may differ per row
    (``budget.CactusRows``): ``"rounds"``: ``r_0 = q``, round ``i`` accepts ``x_i`` w.p.
    ``rule.accept_prob(e_{x_i}, r_{i-1}, x_i)``, else ``r_i = rule.residual(...)``; ``"joint"``: the node emits
    ``r_0 = set_target(rule, q, S)`` exactly (lossless SpS rounds over point masses), accepting w.p. ``r_0(S)``."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    cands = np.asarray(candidates, dtype=np.int64)
    R, V = q.shape
    rows = np.arange(R)
    if mode == "joint":
        S = np.zeros((R, V), dtype=bool)
        S[rows[:, None], cands] = True
        r0 = set_target(rule, q, S)
        return r0, np.where(S, r0, 0.0).sum(-1)
    r, w, law = q.copy(), np.ones(R), np.zeros((R, V))
    for i in range(cands.shape[1]):
        x = cands[:, i]
        e = np.zeros((R, V))
        e[rows, x] = 1.0
        phi = rule.accept_prob(e, r, x, check=False)
        law[rows, x] += w * phi
        r = rule.residual(e, r, x, check=False)
        w = w * (1 - phi)
    return law + w[:, None] * r, 1 - w


def tree_step_law(rule: RuleSpec, p, q, num_children: int, scheme: str = "iid",
                  candidates=None, mode: str = "rounds") -> tuple[np.ndarray, float]:
    """Exact law ``L(q, 0)`` (V,) of the first token a node with ``num_children`` candidates emits
    (recursion in ``node_parts``), and its acceptance ``P(some candidate accepted) = sum acc``.

    ``num_children = 1`` with ``"iid"`` is ``exact.induced_distribution``; ``num_children = 0`` is ``q``.
    """
    acc, rej = node_parts(rule, p, q, num_children, scheme, candidates, mode)
    return acc.sum(0) + rej, float(acc.sum())


# -- batched sampler ------------------------------------------------------------------------------

class TreeVerifyResult(NamedTuple):
    """``verify_tree``'s output.

    tokens: ``[B, N + 1]`` int64. The accepted path's tokens (root to leaf), then the one emitted
        (recovered or bonus) token, then ``-1`` padding.
    num_accepted: ``[B]`` int64. Accepted drafts (the path's length; the last token not counted).
    accepted_nodes: ``[B, N]`` int64. Node indices of the accepted path in order, then ``-1``
        (to compact the KV cache to the accepted branch).
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor
    accepted_nodes: torch.Tensor


def _validate_tree(tokens, parents, draft_probs, verifier_probs, generator):
    check_common(SpS(), tokens=tokens, parents=parents, draft_probs=draft_probs, verifier_probs=verifier_probs)
    for name, t in (("tokens", tokens), ("parents", parents)):
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
            raise ValueError(f"{name} must hold integers, got dtype {t.dtype}")
        if t.ndim != 2:
            raise ValueError(f"{name} must have shape (B, N), got {tuple(t.shape)}")
    B, N = tokens.shape
    check_generator(generator, B)
    if tuple(parents.shape) != (B, N):
        raise ValueError(f"parents must have tokens' shape (B, N) = ({B}, {N}), got {tuple(parents.shape)}")
    if draft_probs.ndim != 3 or tuple(draft_probs.shape[:2]) != (B, N):
        raise ValueError(f"draft_probs must have shape (B, N, V) = ({B}, {N}, V), got {tuple(draft_probs.shape)}")
    V = draft_probs.shape[-1]
    if V < 1:
        raise ValueError("draft_probs must have a vocabulary axis of size >= 1")
    if tuple(verifier_probs.shape) != (B, N + 1, V):
        raise ValueError(f"verifier_probs must have shape (B, N + 1, V) = ({B}, {N + 1}, {V}), got "
                         f"{tuple(verifier_probs.shape)}")
    if not draft_probs.is_floating_point():
        raise ValueError(f"draft_probs must be a floating-point tensor, got dtype {draft_probs.dtype}")
    tk, pa = tokens.detach().cpu().long(), parents.detach().cpu().long()
    if tk.numel() and (int(tk.min()) < -1 or int(tk.max()) >= V):
        bad = tk[(tk < -1) | (tk >= V)]
        raise ValueError(f"tokens has ids out of range [-1, {V}) (-1: no node): {bad[:8].tolist()}")
    present = tk >= 0
    j = torch.arange(N).expand(B, N)
    bad = present & ((pa < -1) | (pa >= j))
    if bad.any():
        b, i = (int(v) for v in torch.nonzero(bad)[0])
        raise ValueError(f"parents must be topological (-1 <= parents[b, j] < j) for every node: "
                         f"parents[{b}, {i}] = {int(pa[b, i])}")
    par_present = torch.where(pa >= 0, present.gather(1, pa.clamp_min(0)), torch.ones_like(present))
    if (present & ~par_present).any():
        b, i = (int(v) for v in torch.nonzero(present & ~par_present)[0])
        raise ValueError(f"parents: node {i} of row {b} hangs under an absent node (tokens = -1) {int(pa[b, i])}")
    dev_present = present.to(draft_probs.device)
    check_probs(draft_probs[dev_present], "draft_probs (rows of present nodes)")
    rows = torch.cat([torch.ones((B, 1), dtype=torch.bool, device=dev_present.device), dev_present], 1)
    check_probs(verifier_probs[rows], "verifier_probs (root and present nodes)")


def _children_table(tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """``[B, N + 1, Kmax]`` node index of each slot's children in node order (slot 0 = root), -1 padded."""
    B, N = tokens.shape
    dev = tokens.device
    present = tokens >= 0
    slot = torch.where(present, parents.long() + 1, torch.full_like(parents.long(), -1))  # [B, N]
    earlier = torch.ones(N, N, dtype=torch.bool, device=dev).tril(-1)  # [j, i]: i < j
    same = (slot.unsqueeze(2) == slot.unsqueeze(1)) & present.unsqueeze(1) & earlier  # [B, j, i]
    rank = same.sum(-1)  # [B, N] rank among siblings
    kmax = int(rank[present].max()) + 1 if present.any() else 1
    table = torch.full((B, N + 1, kmax), -1, dtype=torch.long, device=dev)
    b, j = torch.nonzero(present, as_tuple=True)
    table[b, slot[b, j], rank[b, j]] = j
    return table


def _joint_target(rule: ScalingRule, q: torch.Tensor, tok: torch.Tensor, table: torch.Tensor, rows: torch.Tensor,
                  cur: torch.Tensor, V: int) -> torch.Tensor:
    """``set_target`` at each row's current node: ``S`` = the tokens of its children (``table``)."""
    if tok.shape[1] == 0:  # no nodes: nothing to boost
        return q
    kids = table[rows, cur]  # [R, Kmax]
    has = kids >= 0
    ids = torch.where(has, tok[rows.unsqueeze(-1), kids.clamp_min(0)], torch.zeros_like(kids))
    counts = torch.zeros((kids.shape[0], V), dtype=torch.long, device=q.device)
    S = counts.scatter_add_(1, ids, has.long()) > 0  # [R, V] candidate set (padding adds 0)
    return set_target(rule, q, S)


def verify_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor,
    verifier_probs: torch.Tensor,
    rule: RuleSpec,
    scheme: str = "iid",
    generator: torch.Generator | None = None,
    check: bool = True,
    mode: str = "rounds",
    state=None,
) -> TreeVerifyResult:
    """Verify a batch of drafted trees with ``rule``; walk from the root, emit one accepted path + 1 token.

    Args:
        tokens: ``[B, N]`` int64. Drafted token of each node; ``-1`` marks an absent node, so rows
            may hold trees of different shapes (ragged batches).
        parents: ``[B, N]`` int64. Parent node of each node, ``-1`` for children of the root (the
            last committed token). Topological: ``parents[b, j] < j``; siblings are verified in
            node order. Ignored where ``tokens = -1``.
        draft_probs: ``[B, N, V]`` float. For node ``j``: the draft law ``p`` at its parent's
            position, from which ``j`` was drawn (siblings share one row; per node, so a ragged batch
            needs no second index). Before any removal: the sampler applies the scheme (removal of
            earlier siblings, point masses). Rows of absent nodes are not read.
        verifier_probs: ``[B, N + 1, V]`` float. Row 0: ``q`` at the root; row ``j + 1``: ``q`` after
            node ``j`` (the next token's law if ``j`` is accepted; the bonus law at a leaf).
        rule: a Rule, or a sequence of Rules, round ``i`` of every node using ``rules[min(i, len - 1)]``.
        scheme: how siblings were drawn, one of ``SCHEMES`` (module docstring).
        generator: ``torch.Generator`` for all draws, or a ``RowGenerators`` (row ``b`` draws from its own).
            Uniforms ``u [B, N + 1]`` float64 are drawn at
            once: ``u[:, j]`` decides node ``j`` (``u < phi``), ``u[:, N]`` draws the emitted token by
            inverse CDF (``sampler.sample_rows``). A chain with ``"iid"`` consumes them as
            ``sampler.verify`` does and emits the same tokens.
        check: validate inputs (shapes, ids, topological parents, probability rows of present nodes).
        mode: ``"rounds"`` (each round applies ``rule`` to the previous round's residual) or
            ``"joint"`` (at each node ``r_0 = set_target(rule, q, S)``, ``S`` the node's candidate
            tokens, then SpS rounds towards ``r_0``; ``rule`` one two-block rule such as ``Cactus``).
        state: the per-sequence state of a stateful rule (``SequenceBudget``: ``rule.start(B, max_tokens)``),
            updated in place: before any draw the rule plans every node (``rule.plan_tree``: Cactus's
            ``delta`` at a node from the budget left after charging its ancestors), then each row is charged
            the nodes of its accepted path (the root and every accepted node). ``None`` for other rules.

    Returns:
        ``TreeVerifyResult(tokens [B, N + 1], num_accepted [B], accepted_nodes [B, N])``.

    At each node, round ``i`` accepts child ``x_i`` w.p. ``phi_i = rule.accept_prob(p_i, r_{i-1}, x_i)``
    (``r_0 = q`` of the node), else ``r_i = rule.residual(p_i, r_{i-1}, x_i)``; an accepted child
    becomes the node; all children rejected: emit from ``r_K``; no children: emit the bonus token from the
    node's ``q``, by the first round's rule's bonus law (``q`` itself unless the rule declares
    ``bonus_from_q = False``: Medusa's ``argmax q``), as ``sampler.verify`` draws a chain's bonus token.
    A child its scheme could not have drawn (``p_i(x_i) = 0``: a repeated candidate without replacement, a
    zero-mass candidate) is skipped: never accepted, ``r`` unchanged, whatever the rule's ``convention``
    (the authors' convention judges a zero-mass draft of a chain, which has no scheme to say it is impossible).
    float16 / bfloat16 are computed in float32.
    """
    rules = check_rules(rule)
    check_scheme(scheme)
    check_mode(mode, rules)
    if check:
        _validate_tree(tokens, parents, draft_probs, verifier_probs, generator)
    B, N = tokens.shape
    V = draft_probs.shape[-1]
    dev = draft_probs.device
    dt = torch.promote_types(draft_probs.dtype, verifier_probs.dtype)
    dt = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
    tok = tokens.to(dev).long()
    table = _children_table(tok, parents.to(dev))
    kmax = table.shape[-1]
    plan = None
    if rules[0].stateful:  # every node's rule is decided now, before any draw
        state = rules[0].check_state(state, B)
        plan = rules[0].plan_tree(state, tok, parents, draft_probs, verifier_probs, scheme, mode)
    elif state is not None:
        raise ValueError(f"state is read only by a stateful rule (rule.stateful); {rules[0]!r} has none: pass "
                         "state=None")

    def node_rule(rows, slots, rl):  # the rule at each row's current node: its own delta under a budget
        return rl if plan is None else plan.rows(rows, slots)

    u = uniforms(generator, B, N + 1, dev)  # [B, N + 1] float64

    rows_all = torch.arange(B, device=dev)
    cur = torch.zeros(B, dtype=torch.long, device=dev)  # slot: 0 root, j + 1 node j
    rnd = torch.zeros(B, dtype=torch.long, device=dev)  # round at the current node
    r = verifier_probs[:, 0].to(dt).clone()  # [B, V] current target
    bonus_rule = rules[0]  # a node without children emits its bonus token by this rule's bonus law

    def emit(e: torch.Tensor) -> torch.Tensor:
        """The emitted token of rows ``e``: from ``r`` after rejected children, the bonus law at a childless node."""
        law = r[e]
        if not bonus_rule.bonus_from_q:
            law = torch.where((rnd[e] == 0).unsqueeze(-1), bonus_rule.bonus(law).to(law.dtype), law)
        return sample_rows(law, u[e, N])

    joint = mode == "joint"
    if joint:  # the rule sets each node's target from its candidate set; rounds are SpS
        set_rule, rules = rules[0], (SpS(),)
        r = _joint_target(node_rule(rows_all, cur, set_rule), r, tok, table, rows_all, cur, V)
    removed = torch.zeros((B, V), dtype=torch.bool, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    depth = torch.zeros(B, dtype=torch.long, device=dev)
    path = torch.full((B, max(N, 1)), -1, dtype=torch.long, device=dev)
    last = torch.zeros(B, dtype=torch.long, device=dev)
    for _ in range(N + 1):  # each row tries one node (each node at most once) or ends, per pass
        child = torch.where(rnd < kmax, table[rows_all, cur, rnd.clamp_max(kmax - 1)], torch.full_like(rnd, -1))
        ending = ~done & (child < 0)
        if ending.any():
            e = torch.nonzero(ending).squeeze(-1)
            last[e] = emit(e)
            done |= ending
        trying = torch.nonzero(~done & (child >= 0)).squeeze(-1)
        if trying.numel() == 0:
            if bool(done.all()):
                break
            continue
        rnd_now = rnd[trying]  # groups by round fixed before any row moves in this pass
        for i in torch.unique(rnd_now).tolist() if len(rules) > 1 else [None]:
            idx = trying if i is None else trying[rnd_now == i]
            rl = rules[0] if i is None else round_rule(rules, int(i))
            if not joint:
                rl = node_rule(idx, cur[idx], rl)
            c = child[idx]
            x = tok[idx, c]
            p_row = draft_probs[idx, c].to(dt)
            if scheme == "iid" or scheme == "eagle":
                p_i = p_row
            elif scheme == "without_replacement":
                p_i = without(p_row, removed[idx])
            else:
                p_i = torch.nn.functional.one_hot(x, V).to(dt)
            r_i = r[idx]
            phi = rl.accept_prob(p_i, r_i, x, check=False)
            skip = p_i.gather(-1, x.unsqueeze(-1)).squeeze(-1) <= 0  # impossible candidate: skipped
            acc = (u[idx, c] < phi.double()) & ~skip
            g = drop_token(r_i, x) if scheme == "eagle" else rl.residual(p_i, r_i, x, check=False)
            g = torch.where(skip.unsqueeze(-1), r_i, g.to(dt))
            a, ca = idx[acc], c[acc]
            path[a, depth[a]] = ca
            depth[a] += 1
            cur[a] = ca + 1
            rnd[a] = 0
            r[a] = verifier_probs[a, ca + 1].to(dt)
            if joint and a.numel():
                r[a] = _joint_target(node_rule(a, cur[a], set_rule), r[a], tok[a], table[a],
                                     torch.arange(a.numel(), device=dev), cur[a], V)
            removed[a] = False
            rj, xj = idx[~acc], x[~acc]
            r[rj] = g[~acc]
            rnd[rj] += 1
            removed[rj, xj] = True
    ending = ~done  # a row may end exactly on the last pass
    if ending.any():
        e = torch.nonzero(ending).squeeze(-1)
        last[e] = emit(e)
    path = path[:, :N]
    out = torch.full((B, N + 1), -1, dtype=torch.long, device=dev)
    if N:
        out[:, :N] = torch.where(path >= 0, tok.gather(1, path.clamp_min(0)), torch.full_like(path, -1))
    out.scatter_(1, depth.unsqueeze(-1), last.unsqueeze(-1))
    if plan is not None:  # charge the nodes of each accepted path: the root, then every accepted node
        pa = path.cpu().numpy()
        judged = np.zeros((B, N + 1), dtype=bool)
        judged[:, 0] = True
        b, i = np.nonzero(pa >= 0)
        judged[b, pa[b, i] + 1] = True
        state.charge(plan, judged, depth.cpu().numpy() + 1)
    return TreeVerifyResult(out, depth, path)
