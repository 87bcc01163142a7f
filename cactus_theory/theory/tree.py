"""Tree drafts: batched verification for any rule, their exact laws, and block verification of chains.

The tree shapes, the schemes' helpers and the batched sampler ``verify_tree`` live in ``core/tree.py``
(the LM runtime uses them too) and are re-exported here; the exact laws and the toy loop live here.

Notation (the paper's): ``p`` draft law, ``q`` verifier law, ``x`` a drafted candidate, ``r`` the
current target of a node's verification rounds, ``phi`` acceptance, ``g`` recovery law.

**One node.** A node (the root is the last committed token) has ``K`` ordered children
``x_1..x_K``. Round ``i`` verifies ``x_i`` against the target left by the previous rounds, with the
rule's own code and the round's draft law ``p_i``:

    r_0 = q,   accept x_i w.p. phi_i = rule.accept_prob(p_i, r_{i-1}, x_i),
    on rejection r_i = rule.residual(p_i, r_{i-1}, x_i);   all K rejected: emit y ~ r_K.

An accepted child is entered (its verifier row becomes the new ``q``); a node without children emits
the bonus token from its ``q`` (by the first round's rule's bonus law: ``q`` itself unless the rule
declares ``bonus_from_q = False``, as Medusa's ``argmax q``). How the candidates were drawn fixes ``p_i`` (``scheme``):

  ``"iid"``                  siblings i.i.d. from ``p`` (SpecTr / recursive rejection sampling):
                             ``p_i = p``.
  ``"without_replacement"``  sibling ``i`` drawn from ``p`` with ``x_1..x_{i-1}`` removed and the rest
                             renormalised (sequential draws, = Gumbel-top-k): ``p_i = p 1[. not in
                             {x_<i}] / (1 - p({x_<i}))``.
  ``"deterministic"``        siblings are a function of the context (e.g. the draft's top-k): the
                             round's draft law is the point mass ``p_i = e_{x_i}``. With SpS this is
                             ``phi_i = r_{i-1}(x_i)`` and ``r_i = r_{i-1}`` without ``x_i``,
                             renormalised: sampling ``y ~ q`` and reading the candidates in order.
  ``"eagle"``                deterministic siblings verified with EAGLE's multi-round rule read with
                             the draft's probability: ``phi_i = rule.accept_prob(p, r_{i-1}, x_i)`` with
                             ``p`` the draft's own law (SpS: ``min(1, r(x_i) / p(x_i))``) and, on
                             rejection, ``r_i = r_{i-1}`` with ``r(x_i) = 0``, renormalised, whatever
                             the rule. Its exact law (``tree_step_law``) is NOT ``q`` in general: a
                             deterministic candidate is not drawn from ``p``, so ``min(1, q/p)`` over-
                             accepts it (``p = (.5, .3, .2)``, ``q = (.3, .3, .4)``, two children:
                             law ``(.6, .4, 0)``, ``KL = 0.531``). With SpS, passing one-hot
                             ``draft_probs`` (each candidate's draft probability taken as 1) makes it
                             ``"deterministic"``, which is lossless; copies of EAGLE's public
                             ``evaluate_posterior`` do exactly that (``qx = 1.0``, then zero the
                             rejected token and renormalise), so EAGLE-2/3 as released is lossless.

For SpS, ``"iid"``, ``"without_replacement"`` and ``"deterministic"`` are exactly lossless: each
round is Theorem 1 with the conditional law of its candidate given the earlier rounds, so the node
emits ``r_{i-1}`` given that round ``i`` is reached, hence ``q``; a child's subtree is drawn given
its token only, so the walk is lossless at every depth (tests: exact laws to 1e-12). A candidate the
scheme gives probability ``p_i(x_i) = 0`` is skipped (never accepted, ``r`` unchanged): e.g. a sibling
drawn after ``p``'s support is exhausted without replacement.

``rule`` may be one Rule or a sequence of rules, one per round (round ``i`` uses
``rules[min(i, len - 1)]``): e.g. ``(Cactus(delta), SpS())`` relaxes only the first round.

**Two lossy constructions** (``mode``):
  ``"rounds"``  (default) the rule verifies each round against the previous round's residual, as
                above. The relaxations compound: with deterministic siblings the node's law can sit
                well beyond the per-token budget (1.05x to 1.93x ``delta`` in the tests).
  ``"joint"``   Theorem 2 applied to the event "the output is one of the candidates": with ``S``
                the node's candidate set, ``r_0 = set_target(rule, q, S)`` puts the largest mass
                ``gamma(q(S))`` on ``S`` that the budget allows, scaling inside and outside ``S``
                proportionally (optimal for every f-divergence by the same Jensen argument), then
                lossless SpS rounds verify the candidates towards ``r_0``. With deterministic
                siblings the node's law is exactly ``r_0``: ``D(law || q) <= delta``, the per-token
                budget for the whole node. With random siblings ``r_0`` depends on the draws, so no
                such identity holds (the tests record a case at 1.8x ``delta``). Against the
                multi-draft optimum at the same step KL (``optimize.solve_target_multi``), it takes a
                larger share of the optimal acceptance gain than ``"rounds"`` on the toy pairs tested
                (0.67 / 0.70 / 0.76 against 0.35 / 0.59 / 0.42 for ``Cactus(0.1)``, two i.i.d. drafts).

**EAGLE-2's budget tree** (``BudgetTree(nodes, depth, topk)``): grown by path probability and re-ranked
to its ``nodes`` most probable nodes. The tree is a function of the draft's laws, so with
``"deterministic"`` candidates it stays lossless (each candidate is a point mass whatever the set);
re-ranking random candidates by their own probability would change the law they are drawn from, so
``"iid"`` / ``"without_replacement"`` are refused. ``budget_tree`` grows it from exact laws (the
reference the runtime's tree is tested against); ``tree_block_law`` / ``tree_sequence_law`` take it in
place of ``parents`` and grow it per context.

**Exact laws** (float64 numpy): ``node_parts`` / ``tree_step_law`` for one node; ``tree_block_law``
(the law of the whole emitted block of a static tree on toy models) and ``tree_sequence_law`` (the
first ``T`` tokens of the whole tree-decoding loop, comparable with ``toy.autoregressive_law``).
``tree_speculative_decode`` runs that loop with ``verify_tree``.

**Block verification** (Sun et al., "Block verification accelerates speculative decoding", ICLR
2025; vLLM's ``rejection_sample_method="block"``): lossless verification of a chain of ``k`` drafts
that decides the whole block jointly (``verify_block``, ``block_verification_law``,
``block_sequence_law``); written here from the algorithm's description, checked by exact law.

Example::

    import torch
    from cactus_theory import Cactus, toy
    from cactus_theory.tree import branching_parents, draft_tree, tree_block_law, tree_step_law, verify_tree

    draft, verifier = toy.random_pair(4, order=2, seed=0)
    parents = branching_parents((2, 2))  # (-1, -1, 0, 0, 1, 1): 2 children, 2 grandchildren each
    law, acc = tree_step_law(Cactus(0.5), draft(()), verifier(()), 2, "iid")  # one node, exactly
    tokens, p, q = draft_tree(draft, verifier, [()] * 8, parents, "iid")    # 8 drafted trees
    res = verify_tree(torch.from_numpy(tokens), torch.tensor([parents] * 8), torch.from_numpy(p),
                      torch.from_numpy(q), Cactus(0.5), "iid", mode="joint")
    res.tokens, res.num_accepted, res.accepted_nodes  # path + 1 token, path length, node ids
    block = tree_block_law(draft, verifier, Cactus(0.5), parents, "iid", mode="joint")  # exact block law
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..core.exact import bonus_distribution
from ..core.rules import Cactus, Rule, SpS
from ..core.sampler import check_common, sample_rows
from ..core.tree import (  # the shapes, schemes and the batched sampler live in core (the runtime uses them)
    MODES,
    RERANK_SCHEMES,
    SCHEMES,
    BudgetTree,
    Grow,
    RuleSpec,
    TreeVerifyResult,
    as_tree,
    branching_parents,
    chain_parents,
    check_mode,
    check_parents,
    check_rules,
    check_scheme,
    check_tree_scheme,
    children_lists,
    node_parts,
    set_target,
    top_candidates,
    tree_step_law,
    verify_tree,
    without,
)
from ..core.validate import check_positive_int, check_probs, check_token
from .toy import BudgetLaw, DecodeResult, memoised

__all__ = [
    "SCHEMES", "MODES", "set_target", "chain_parents", "branching_parents", "children_lists", "top_candidates",
    "node_parts", "tree_step_law", "TreeVerifyResult", "verify_tree",
    "tree_block_law", "tree_sequence_law", "expected_length", "draft_tree", "tree_speculative_decode",
    "verify_block", "block_verification_law", "block_sequence_law", "BudgetTree", "budget_tree", "tree_budget_law",
    "verify_block_ascend", "ascend_block_law", "ascend_block_sequence_law", "last_legal_law",
]

Cond = Callable[[tuple], np.ndarray]


# -- exact block and sequence laws on toy models ------------------------------------------------

def tree_block_law(draft: Cond, verifier: Cond, rule: RuleSpec, parents: Sequence[int], scheme: str = "iid",
                   *, prompt: tuple = (), mode: str = "rounds") -> dict[tuple, float]:
    """Exact law of the block one tree-verification call emits after ``prompt``: ``{block: prob}``,
    a block being the accepted path's tokens plus the one emitted token. ``parents``: a static tree,
    or a ``BudgetTree`` (EAGLE-2's re-ranked tree, grown after ``prompt`` by ``budget_tree``).

    The static tree ``parents`` (N,) is drafted from ``draft`` (candidates per ``scheme``) and walked
    as ``verify_tree`` does. Recursion over nodes: at node ``c`` with context ``s`` and ``K`` children,
    ``node_parts(rule, p(.|s), q(.|s), K, scheme)`` gives ``acc[i, x]`` (enter child ``i`` with token
    ``x``, context ``s + (x,)``) and ``rej[y]`` (emit ``y``, stop); a leaf emits its bonus token ``y`` from
    the rule's bonus law of ``q(.|s)`` (``q`` itself but for a rule that draws its own). Exact
    because a child's subtree is drawn given its token only, independent of the rounds at ``c``.
    """
    rules = check_rules(rule)
    check_scheme(scheme)
    check_mode(mode, rules)
    P, Q = memoised(draft, "draft"), memoised(verifier, "verifier")
    prompt = tuple(int(t) for t in prompt)
    kids = children_lists(_tree_at(P, parents, prompt, scheme))
    out: dict[tuple, float] = {}

    def add(b, w):
        out[b] = out.get(b, 0.0) + w

    stack = [(0, (), 1.0)]
    while stack:
        slot, em, w = stack.pop()
        ctx = prompt + em
        q = Q(ctx)
        ks = kids[slot]
        if not ks:  # a leaf: the bonus token, by the first round's rule's bonus law
            b = bonus_distribution(rules[0], q, check=False)
            for y in np.flatnonzero(b > 0):
                add(em + (int(y),), w * b[y])
            continue
        p = P(ctx)
        if p.size != q.size:
            raise ValueError(f"draft and verifier must share one vocabulary, got sizes {p.size} and {q.size}")
        if scheme in ("deterministic", "eagle") and len(ks) > p.size:
            raise ValueError(f"a node has {len(ks)} deterministic children but V = {p.size}")
        acc, rej = node_parts(rules, p, q, len(ks), scheme, mode=mode)
        for y in np.flatnonzero(rej > 0):
            add(em + (int(y),), w * rej[y])
        for i, j in enumerate(ks):
            for x in np.flatnonzero(acc[i] > 0):
                stack.append((j + 1, em + (int(x),), w * acc[i, x]))
    return out


def budget_tree(draft: Cond, tree, prompt: tuple = ()) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(parents, tokens)`` of the tree ``tree`` (a ``core.tree.Tree``: EAGLE-2's ``BudgetTree``, a
    ``DynamicTree``, a static tree) grown after ``prompt`` with deterministic candidates, from the draft's
    exact laws: the reference for the runtime's ``grow_tree`` (written apart from it, plain Python
    sorting).

    Grown level by level as ``tree.levels()`` say: a node's candidate of rank ``r`` (its place among its
    siblings) is ``p``'s ``r``-th most likely token at its parent (ties to the lower id); a level of fixed
    parents takes them as they are; a ``Grow(width, children)`` level grows ``children`` candidates at
    each of the ``width`` nodes of highest path probability ``prod p(x | path)`` of the previous level
    (ties to the lower node), in node order. A tree that ``reranks`` then keeps its ``tree.nodes``
    grown nodes of highest path probability (ties to the lower node), in grown order, renumbered.
    Deterministic candidates only: the tree is a function of the context."""
    tree = as_tree(tree)
    P = memoised(draft, "draft")
    prompt = tuple(int(t) for t in prompt)
    ctx: list[tuple] = []  # context after each grown node
    par: list[int] = []
    logp: list[float] = []
    ranked: dict[int, list[int]] = {}  # each parent's tokens, most likely first

    def add(parent: int, rank: int) -> None:
        c = prompt if parent < 0 else ctx[parent]
        p = P(c)
        if rank >= p.size:  # as the runtime (lm.cache.grow_tree): never fewer candidates than the shape says
            raise ValueError(f"a node has more than V = {p.size} deterministic children ({tree!r})")
        if parent not in ranked:
            ranked[parent] = sorted(range(p.size), key=lambda t: (-p[t], t))
        x = ranked[parent][rank]
        par.append(parent)
        ctx.append(c + (x,))
        logp.append((0.0 if parent < 0 else logp[parent]) + (np.log(p[x]) if p[x] > 0 else -np.inf))

    level: list[int] = []
    for spec in tree.levels():
        start = len(par)
        if isinstance(spec, Grow):  # the previous level's most probable paths grow
            for j in sorted(sorted(level, key=lambda j: (-logp[j], j))[:spec.width]):
                for r in range(spec.children):
                    add(j, r)
        else:  # fixed parents: a node's rank is its place among its siblings
            seen: dict[int, int] = {}
            for a in spec:
                seen[a] = seen.get(a, 0) + 1
                add(a, seen[a] - 1)
        level = list(range(start, len(par)))
    keep = range(len(par))
    if tree.reranks:
        keep = sorted(sorted(keep, key=lambda j: (-logp[j], j))[:tree.nodes])
    new = {j: i for i, j in enumerate(keep)}
    if any(par[j] >= 0 and par[j] not in new for j in keep):
        raise ValueError("budget tree: a kept node's parent was dropped")
    return tuple(-1 if par[j] < 0 else new[par[j]] for j in keep), tuple(ctx[j][-1] for j in keep)


def _tree_at(draft: Cond, parents, prompt: tuple, scheme: str) -> tuple[int, ...]:
    """The parents of the tree drafted after ``prompt``: a static one's own (a bare ``parents``
    sequence in any topological order, or a ``Tree`` whose ``parents`` are fixed); a tree grown from
    the draft's laws (``BudgetTree``, ``DynamicTree``: ``parents`` None) grown by ``budget_tree``."""
    fixed, tree = _check_tree(parents, scheme)
    return fixed if fixed is not None else budget_tree(draft, tree, prompt)[0]


def _check_tree(parents, scheme: str):
    """The exact laws' tree argument -> ``(fixed parents or None, tree or None)``: a topological ``parents``
    sequence (in any order: the exact laws need no level-by-level listing) or a ``Tree``; one grown from the
    draft's laws needs deterministic candidates (its shape is then a function of the context), and one
    that re-ranks is checked against ``scheme`` (``check_tree_scheme``)."""
    if isinstance(parents, (list, tuple)):  # a bare sequence: topological, not necessarily level by level
        return check_parents(parents), None
    tree = as_tree(parents, "parents")
    check_tree_scheme(tree, scheme)
    if tree.parents is None and scheme not in RERANK_SCHEMES:
        raise ValueError(f"scheme {scheme!r} with {tree!r}: a tree grown from random draws has no exact law here; "
                         f"its shape is a function of the context with deterministic candidates only "
                         f"({', '.join(RERANK_SCHEMES)})")
    return tree.parents, tree


def expected_length(block_law: dict[tuple, float]) -> float:
    """Expected tokens emitted per verifier call (AL, bonus included): ``sum_b len(b) P(b)``."""
    return float(sum(len(b) * w for b, w in block_law.items()))


def _tree_inputs(draft, verifier, parents, scheme: str, prompt) -> tuple:
    """``tree_sequence_law`` / ``tree_budget_law``'s tree checked (``_check_tree``), the memoised draft and
    verifier, the prompt as a tuple of ints and the vocabulary size."""
    _check_tree(parents, scheme)
    P, Q = memoised(draft, "draft"), memoised(verifier, "verifier")
    prompt = tuple(int(t) for t in prompt)
    return P, Q, prompt, Q(prompt).size


def _sequence_from_blocks(block_at: Callable[[tuple], dict], V: int, T: int, prompt: tuple) -> np.ndarray:
    """Law (V,) * T of the first ``T`` tokens of a loop that emits blocks ``block_at(context)``.
    Dynamic programme over block boundaries (as ``toy.sequence_law``)."""
    law = np.zeros((V,) * T)
    frontier: list[dict[tuple, float]] = [{} for _ in range(T)]
    frontier[0][()] = 1.0
    for length in range(T):
        for s, w in frontier[length].items():
            for b, wb in block_at(prompt + s).items():
                t = s + b
                if len(t) >= T:
                    law[t[:T]] += w * wb
                else:
                    frontier[len(t)][t] = frontier[len(t)].get(t, 0.0) + w * wb
    return law


def tree_sequence_law(draft: Cond, verifier: Cond, rule: RuleSpec, parents: Sequence[int], scheme: str,
                      T: int, *, prompt: tuple = (), mode: str = "rounds") -> np.ndarray:
    """Exact law ``(V,) * T`` of the first ``T`` tokens emitted by ``tree_speculative_decode``: blocks
    from ``tree_block_law`` chained by a dynamic programme over block boundaries. SpS with a lossless
    scheme gives ``toy.autoregressive_law(verifier, T)``; a chain (``chain_parents(k)``, ``"iid"``)
    gives ``toy.sequence_law(draft, verifier, rule, k, T)`` for every rule."""
    check_positive_int(T, "T")
    rules = check_rules(rule)
    check_scheme(scheme)
    P, Q, prompt, V = _tree_inputs(draft, verifier, parents, scheme, prompt)
    check_mode(mode, rules)
    if rules[0].stateful:
        return tree_budget_law(P, Q, rules[0], parents, scheme, T, prompt=prompt, mode=mode).law
    return _sequence_from_blocks(lambda c: tree_block_law(P, Q, rules, parents, scheme, prompt=c, mode=mode),
                                 V, T, prompt)


def tree_budget_law(draft: Cond, verifier: Cond, rule, parents, scheme: str, T: int, *, prompt: tuple = (),
                    mode: str = "rounds") -> BudgetLaw:
    """Exact law of the first ``T`` tokens of ``tree_speculative_decode`` with a stateful ``rule``
    (``SequenceBudget``) and what it spent (``toy.BudgetLaw``): ``tree_sequence_law``'s programme over block
    boundaries with the budget spent in the state, and inside a block ``tree_block_law``'s recursion over
    nodes where node ``c`` at depth ``d`` is judged by ``Cactus(delta_c)``, ``(delta_c, cost_c) =
    rule.node_choice(p, q, K, scheme, candidates, mode, B - spent - (its ancestors' costs), left - d,
    spread - d)`` (what ``rule.plan_tree`` decides in the sampler), its law from ``node_parts``; a leaf emits
    from its ``q`` at cost 0. ``max_exact`` recomputes each node's cost as ``KL(tree_step_law || q)`` on the
    full rows."""
    from ..core.divergences import divergence

    check_positive_int(T, "T")
    if not getattr(rule, "stateful", False):
        raise ValueError(f"tree_budget_law needs a stateful rule (SequenceBudget), got {rule!r}")
    check_scheme(scheme)
    check_mode(mode, (rule,))
    P, Q, prompt, V = _tree_inputs(draft, verifier, parents, scheme, prompt)
    det = scheme in ("deterministic", "eagle")
    horizon = rule.horizon or T
    law = np.zeros((V,) * T)
    spent_law: dict[float, float] = {}
    tot = {"mean": 0.0, "max": 0.0, "exact": 0.0}
    frontier: list[dict[tuple, float]] = [{} for _ in range(T)]
    frontier[0][((), 0.0, 0.0)] = 1.0

    def emit(t: tuple, spent: float, exact: float, w: float) -> None:
        if len(t) >= T:
            law[t[:T]] += w
            spent_law[spent] = spent_law.get(spent, 0.0) + w
            tot["mean"] += w * spent
            tot["max"], tot["exact"] = max(tot["max"], spent), max(tot["exact"], exact)
        else:
            key = (t, spent, exact)
            frontier[len(t)][key] = frontier[len(t)].get(key, 0.0) + w

    for length in range(T):
        for (s, spent, exact), w in frontier[length].items():
            kids = children_lists(_tree_at(P, parents, prompt + s, scheme))
            stack = [(0, (), w, 0.0, 0.0)]  # slot, path tokens, weight, ancestors' costs (charged, recomputed)
            while stack:
                slot, em, wd, cum, cum_x = stack.pop()
                if len(s) + len(em) >= T:
                    emit(s + em, spent + cum, exact + cum_x, wd)
                    continue
                ctx = prompt + s + em
                q = Q(ctx)
                ks = kids[slot]
                if not ks:  # a leaf: the bonus token, from q (cost 0)
                    for y in np.flatnonzero(q > 0):
                        emit(s + em + (int(y),), spent + cum, exact + cum_x, wd * q[y])
                    continue
                p = P(ctx)
                if p.size != V:
                    raise ValueError(f"draft and verifier must share one vocabulary, got sizes {p.size} and {V}")
                cands = top_candidates(p, len(ks)) if det else None
                done = len(s) + len(em)
                delta, cost = rule.node_choice(p, q, len(ks), scheme, cands, mode, rule.budget - spent - cum,
                                               T - done, horizon - done)
                judge = Cactus(delta)
                acc, rej = node_parts(judge, p, q, len(ks), scheme, cands, mode)
                cost_x = float(divergence(acc.sum(0) + rej, q, "kl", check=False)) if delta > 0 else 0.0
                for y in np.flatnonzero(rej > 0):
                    emit(s + em + (int(y),), spent + cum + cost, exact + cum_x + cost_x, wd * rej[y])
                for i, j in enumerate(ks):
                    for x in np.flatnonzero(acc[i] > 0):
                        stack.append((j + 1, em + (int(x),), wd * acc[i, x], cum + cost, cum_x + cost_x))
    return BudgetLaw(law, spent_law, tot["mean"], tot["max"], tot["exact"])


def draft_tree(draft: Cond, verifier: Cond, contexts: Sequence[tuple], parents: Sequence[int], scheme: str = "iid",
               generator: torch.Generator | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw the static tree ``parents`` (N,) once after each of the ``B`` ``contexts`` from ``draft``:
    returns ``verify_tree``'s inputs as numpy, ``tokens`` (B, N) int64, ``draft_probs`` (B, N, V)
    (``p`` at each node's parent) and ``verifier_probs`` (B, N + 1, V).

    Candidates per ``scheme``: i.i.d. inverse-CDF draws from ``p`` (``"iid"``); draws from ``p``
    without the earlier siblings, renormalised (``"without_replacement"``; once ``p``'s support is
    exhausted a placeholder ``x ~ p`` is stored, which ``verify_tree`` skips as it has ``p_i(x) = 0``);
    the ``rank``-th most likely token of ``p`` for the ``rank``-th sibling (``"deterministic"``,
    ``"eagle"``, ties to the lower id). One ``[B]`` uniform draw per random node from ``generator``.
    """
    check_scheme(scheme)
    parents = check_parents(parents)
    P, Q = memoised(draft, "draft"), memoised(verifier, "verifier")
    ctxs = [tuple(int(t) for t in c) for c in contexts]
    if not ctxs:
        raise ValueError("contexts must hold at least one context")
    B, N = len(ctxs), len(parents)
    kids = children_lists(parents)
    V = Q(ctxs[0]).size
    tokens = np.full((B, N), -1, dtype=np.int64)
    dp = np.zeros((B, N, V))
    vp = np.zeros((B, N + 1, V))
    node_ctx: list[list[tuple]] = [ctxs] + [None] * N  # per slot
    vp[:, 0] = np.stack([Q(c) for c in ctxs])
    dev = generator.device if generator is not None else torch.device("cpu")
    for slot in range(N + 1):
        ks = kids[slot]
        if not ks:
            continue
        here = node_ctx[slot]
        p = np.stack([P(c) for c in here])
        if p.shape[-1] != V:
            raise ValueError(f"draft and verifier must share one vocabulary, got sizes {p.shape[-1]} and {V}")
        removed = np.zeros((B, V), dtype=bool)
        order = np.argsort(-p, axis=-1, kind="stable") if scheme in ("deterministic", "eagle") else None
        for rank, j in enumerate(ks):
            if order is not None:
                if rank >= V:
                    raise ValueError(f"a node has {len(ks)} deterministic children but V = {V}")
                x = order[:, rank]
            else:
                u = torch.rand(B, generator=generator, dtype=torch.float64, device=dev).cpu()
                src = p if scheme == "iid" else without(p, removed)
                empty = src.sum(-1) <= 0  # support exhausted: a placeholder the verifier skips
                src = np.where(empty[:, None], p, src)
                x = sample_rows(torch.from_numpy(src), u).numpy()
            tokens[:, j] = x
            dp[:, j] = p
            removed[np.arange(B), x] = True
            node_ctx[j + 1] = [c + (int(t),) for c, t in zip(here, x, strict=True)]
            vp[:, j + 1] = np.stack([Q(c) for c in node_ctx[j + 1]])
    return tokens, dp, vp


def tree_speculative_decode(draft: Cond, verifier: Cond, rule: RuleSpec, parents: Sequence[int], scheme: str,
                            T: int, *, num_sequences: int = 1, prompt: tuple = (),
                            generator: torch.Generator | None = None, mode: str = "rounds") -> DecodeResult:
    """The tree-decoding loop on toy models until each of ``num_sequences`` sequences has ``T`` tokens:
    draft the static tree ``parents`` (candidates per ``scheme``, inverse-CDF draws from ``generator``),
    call ``verify_tree`` once for the batch, append the path and the emitted token; repeat.
    Returns ``toy.DecodeResult`` (``tokens`` (B, T), ``blocks`` verifier calls, ``accepted`` drafts)."""
    rules = check_rules(rule)
    check_scheme(scheme)
    par = check_parents(parents)
    check_positive_int(T, "T")
    check_positive_int(num_sequences, "num_sequences")
    P, Q = memoised(draft, "draft"), memoised(verifier, "verifier")
    prompt = tuple(int(t) for t in prompt)
    B, N = int(num_sequences), len(par)
    seqs: list[tuple] = [()] * B
    blocks = np.zeros(B, dtype=np.int64)
    accepted = np.zeros(B, dtype=np.int64)
    par_t = torch.tensor(par, dtype=torch.long)
    state = rules[0].start(B, max_tokens=T) if rules[0].stateful else None
    while True:
        act = [b for b in range(B) if len(seqs[b]) < T]
        if not act:
            break
        tokens, dp, vp = draft_tree(P, Q, [prompt + seqs[b] for b in act], par, scheme, generator)
        sub = None if state is None else state.subset(np.array(act))
        res = verify_tree(torch.from_numpy(tokens), par_t.expand(len(act), N), torch.from_numpy(dp),
                          torch.from_numpy(vp), rules, scheme, generator=generator, mode=mode, state=sub)
        if state is not None:
            state.update(np.array(act), sub)
        out, na = res.tokens.numpy(), res.num_accepted.numpy()
        for i, b in enumerate(act):
            seqs[b] = seqs[b] + tuple(int(t) for t in out[i, :na[i] + 1])
            blocks[b] += 1
            accepted[b] += na[i]
    return DecodeResult(np.array([s[:T] for s in seqs], dtype=np.int64), blocks, accepted,
                        None if state is None else state.spent.copy())


# -- block verification of chains (Sun et al., ICLR 2025) -------------------------------------------

def _validate_block(draft_tokens, draft_probs, verifier_probs, rule, generator):
    check_common(SpS(), draft_tokens=draft_tokens, draft_probs=draft_probs, verifier_probs=verifier_probs)
    if rule is not None and type(rule) is not SpS:
        raise ValueError(f"rule: block verification is lossless speculative sampling of the whole block; "
                         f"pass None or SpS(), got {rule!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {generator!r}")
    if draft_tokens.ndim != 2 or draft_tokens.shape[1] < 1:
        raise ValueError(f"draft_tokens must have shape (B, k) with k >= 1, got {tuple(draft_tokens.shape)}")
    B, k = draft_tokens.shape
    if draft_probs.ndim != 3 or tuple(draft_probs.shape[:2]) != (B, k):
        raise ValueError(f"draft_probs must have shape (B, k, V) = ({B}, {k}, V), got {tuple(draft_probs.shape)}")
    V = draft_probs.shape[-1]
    if tuple(verifier_probs.shape) != (B, k + 1, V):
        raise ValueError(f"verifier_probs must have shape (B, k + 1, V) = ({B}, {k + 1}, {V}), got "
                         f"{tuple(verifier_probs.shape)}")
    check_token(draft_tokens, V, (B, k), "draft_tokens")
    check_probs(draft_probs, "draft_probs")
    check_probs(verifier_probs, "verifier_probs")


def _block_rows(draft_tokens, draft_probs, verifier_probs):
    """Both block verifiers' inputs in their compute dtype (float32 for half types): the drafted tokens ``n``
    [B, k] int64, the draft's and the verifier's rows ``p_rows``, ``q_rows`` [B, k, V] and their values at
    ``n``, ``p_n``, ``q_n`` [B, k]; on the draft's device."""
    k = draft_tokens.shape[1]
    dt = torch.promote_types(draft_probs.dtype, verifier_probs.dtype)
    dt = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
    n = draft_tokens.to(draft_probs.device).long()
    p_rows, q_rows = draft_probs.to(dt), verifier_probs[:, :k].to(dt)
    p_n = p_rows.gather(-1, n.unsqueeze(-1)).squeeze(-1)
    q_n = q_rows.gather(-1, n.unsqueeze(-1)).squeeze(-1)
    return n, p_rows, q_rows, p_n, q_n


def _block_quantities(p_n, q_n, p_rows, q_rows):
    """Block verification's weights, numpy or torch (batch axes first):

        w_0 = 1,  w_i = min(1, w_{i-1} q_i(X_i) / p_i(X_i))   (0 where p_i(X_i) = 0),
        rho_{i+1} = (w_i q_{i+1} - p_{i+1})_+  (i = 0..k-1),
        h_i = |rho_{i+1}| / (|rho_{i+1}| + 1 - w_i)  (i = 1..k-1; 0 where |rho_{i+1}| = 0),  h_k = w_k.

    ``p_n``, ``q_n`` (..., k); ``p_rows``, ``q_rows`` (..., k, V) (positions 1..k). Returns
    ``w`` (..., k + 1), ``rho`` (..., k, V), ``h`` (..., k + 1) with ``h_0 = 1``."""
    is_t = isinstance(p_n, torch.Tensor)
    k = p_n.shape[-1]
    ws = [p_n[..., 0] * 0 + 1]
    for i in range(k):
        pos = p_n[..., i] > 0
        ratio = q_n[..., i] / (torch.where(pos, p_n[..., i], torch.ones_like(p_n[..., i])) if is_t
                               else np.where(pos, p_n[..., i], 1.0))
        wi = ws[-1] * ratio
        wi = (torch.where(pos, wi.clamp(max=1.0), torch.zeros_like(wi)) if is_t
              else np.where(pos, np.minimum(wi, 1.0), 0.0))
        ws.append(wi)
    w = torch.stack(ws, -1) if is_t else np.stack(ws, -1)
    rho = w[..., :k, None] * q_rows - p_rows
    rho = rho.clamp_min(0) if is_t else np.maximum(rho, 0.0)
    num = rho.sum(-1)  # (..., k): |rho_{i+1}|, i = 0..k-1
    den = num + 1 - w[..., :k]
    if is_t:
        h_mid = torch.where(num > 0, num / torch.where(num > 0, den, torch.ones_like(den)), torch.zeros_like(num))
        h = torch.cat([torch.ones_like(num[..., :1]), h_mid[..., 1:], w[..., k:]], -1)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            h_mid = np.where(num > 0, num / np.where(num > 0, den, 1.0), 0.0)
        h = np.concatenate([np.ones_like(num[..., :1]), h_mid[..., 1:], w[..., k:]], -1)
    return w, rho, h


def verify_block(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    verifier_probs: torch.Tensor,
    rule: Rule | None = None,
    generator: torch.Generator | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification of ``k`` chained drafts per sequence (lossless); ``sampler.verify``'s layout.

    Args:
        draft_tokens: ``[B, k]`` int64. Drafts ``X_1..X_k``.
        draft_probs: ``[B, k, V]`` float. ``p_i = p(. | X_<i)``, the law ``X_i`` was drawn from.
        verifier_probs: ``[B, k + 1, V]`` float. ``q_i = q(. | X_<i)``; row ``k`` is the bonus law.
        rule: ``None`` or ``SpS()`` (accepted so the function plugs into ``toy.speculative_decode``
            as its ``sampler``); block verification has no lossy variant here.
        generator: ``torch.Generator``; uniforms ``u [B, k + 1]``: ``u[:, i - 1]`` is ``eta_i``,
            ``u[:, k]`` draws the emitted token.

    Returns:
        tokens ``[B, k + 1]`` int64 (``X_1..X_tau``, then ``Y``, then -1) and ``num_accepted = tau`` ``[B]``.

    Algorithm (with ``w``, ``rho``, ``h`` of ``_block_quantities``): ``tau`` is the LAST ``i`` in
    ``1..k`` with ``eta_i < h_i`` (0 if none), so a late success rescues earlier "rejections";
    ``Y ~ q_{k+1}`` if ``tau = k``, else ``Y ~ rho_{tau+1} / |rho_{tau+1}|``. ``w_i`` is the mass of
    ``q``'s law of ``X^i`` not yet spent, relative to ``p``'s; ``h_i`` the chance that the block stops at
    ``i`` given it does not stop later. Lossless by exact sequence law (tests), and its expected
    block length is never below SpS's (Sun et al. prove it optimal among on-path verifiers).
    """
    if check:
        _validate_block(draft_tokens, draft_probs, verifier_probs, rule, generator)
    B, k = draft_tokens.shape
    dev = draft_probs.device
    n, p_rows, q_rows, p_n, q_n = _block_rows(draft_tokens, draft_probs, verifier_probs)
    w, rho, h = _block_quantities(p_n, q_n, p_rows, q_rows)
    gdev = generator.device if generator is not None else dev
    u = torch.rand((B, k + 1), generator=generator, device=gdev, dtype=torch.float64).to(dev)
    fire = u[:, :k] < h[:, 1:].double()  # [B, k]: eta_i < h_i
    idx = torch.arange(1, k + 1, device=dev)
    tau = (fire.long() * idx).max(-1).values  # [B] last success, 0 if none
    rows = torch.arange(B, device=dev)
    res = rho[rows, tau.clamp_max(k - 1)]  # [B, V]
    res = torch.where(res.sum(-1, keepdim=True) > 0, res, q_rows[rows, tau.clamp_max(k - 1)])  # a 0-prob event
    dist = torch.where((tau == k).unsqueeze(-1), verifier_probs[:, k].to(p_rows.dtype), res)
    y = sample_rows(dist, u[:, k])
    pos = torch.arange(k + 1, device=dev)
    n_pad = torch.cat([n, n.new_full((B, 1), -1)], 1)
    out = torch.where(pos < tau.unsqueeze(-1), n_pad, torch.full_like(n_pad, -1))
    out.scatter_(1, tau.unsqueeze(-1), y.unsqueeze(-1))
    return out, tau


def block_verification_law(draft: Cond, verifier: Cond, k: int, *, prompt: tuple = ()) -> dict[tuple, float]:
    """Exact law ``{block: prob}`` of one ``verify_block`` call after ``prompt`` on toy models, by
    enumerating all ``V^k`` draft blocks ``X^k ~ p``: given ``X^k``,
    ``P(tau = i) = h_i prod_{j > i} (1 - h_j)`` (``h_0 = 1``), and the block is ``X^i`` then
    ``y ~ rho_{i+1}`` normalised (``i < k``) or ``y ~ q(. | X^k)`` (``i = k``)."""
    check_positive_int(k, "k")
    P, Q = memoised(draft, "draft"), memoised(verifier, "verifier")
    prompt = tuple(int(t) for t in prompt)
    out: dict[tuple, float] = {}
    ar = np.arange(k)
    for xs, px, p_rows, q_rows in _draft_blocks(P, Q, k, prompt):
        x = np.array(xs)
        w, rho, h = _block_quantities(p_rows[ar, x], q_rows[ar, x], p_rows, q_rows)
        surv = 1.0  # prod_{j > i} (1 - h_j)
        for i in range(k, -1, -1):
            pt = px * h[i] * surv
            surv *= 1 - h[i]
            if pt > 0:
                _emit(out, xs[:i], pt, Q(prompt + xs) if i == k else rho[i] / rho[i].sum())
    return out


def _draft_blocks(P: Cond, Q: Cond, k: int, prompt: tuple):
    """Every draft block ``X^k ~ p`` after ``prompt`` with positive probability: yields ``(xs, P(X^k = xs),
    p_rows, q_rows)``, the rows ``(k, V)`` read at ``prompt + xs[:i]`` for ``i < k``."""
    stack = [((), 1.0)]
    while stack:
        xs, px = stack.pop()
        if len(xs) < k:
            p = P(prompt + xs)
            stack.extend((xs + (int(x),), px * p[x]) for x in np.flatnonzero(p > 0))
            continue
        ctxs = [prompt + xs[:i] for i in range(k)]
        yield xs, px, np.stack([P(c) for c in ctxs]), np.stack([Q(c) for c in ctxs])


def _emit(out: dict, head: tuple, pt: float, law: np.ndarray) -> None:
    """Add the blocks ``head + (y,)``, ``y ~ law``, with total weight ``pt`` to ``out``."""
    for y in np.flatnonzero(law > 0):
        b = head + (int(y),)
        out[b] = out.get(b, 0.0) + pt * law[y]


def block_sequence_law(draft: Cond, verifier: Cond, k: int, T: int, *, prompt: tuple = ()) -> np.ndarray:
    """Exact law ``(V,) * T`` of the first ``T`` tokens of the chain loop verified by ``verify_block``
    (``toy.speculative_decode(..., sampler=verify_block)``)."""
    check_positive_int(T, "T")
    P, Q = memoised(draft, "draft"), memoised(verifier, "verifier")
    prompt = tuple(int(t) for t in prompt)
    V = Q(prompt).size
    return _sequence_from_blocks(lambda c: block_verification_law(P, Q, k, prompt=c), V, T, prompt)


# -- vLLM-Ascend's block verification (``enable_block_verify``) -------------------------------------------------

def _ascend_scales(rule: Rule | None, q_rows):
    """The uniforms' scale ``c_i`` per position: 1 (SpS, ``None``), or ``EntropyVerify.scale`` of each row."""
    if rule is None or type(rule) is SpS:
        return None
    if type(rule).__name__ != "EntropyVerify":
        raise ValueError(f"rule: vLLM-Ascend's block verification runs SpS's test or entropy verification; pass None, "
                         f"SpS() or EntropyVerify(...), got {rule!r}")
    return rule.scale(q_rows)


def verify_block_ascend(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    verifier_probs: torch.Tensor,
    rule: Rule | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM-Ascend's block verification of ``k`` chained drafts (its Triton kernel's decision), ``verify_block``'s layout.

    With ``w_i = min(1, w_{i-1} q_i(X_i) / p_i(X_i))`` (``w_0 = 1``, Sun et al.'s weights, ``_block_quantities``),
    uniforms ``u_1..u_k`` and their running products ``U_i = u_1 ... u_i``, position ``i`` is *legal* iff
    ``p_i(X_i) > 0`` and ``w_i >= c_i U_i``; ``tau`` is the LAST legal position (0 if none). The block is
    ``X_1..X_tau`` then, if ``tau < k``, a token of ``(q_{tau+1} - p_{tau+1})_+`` (vLLM's recovery at that position;
    token 0 where it is all zero), else the bonus ``~ q_{k+1}``. ``c_i = 1`` for ``rule`` None / ``SpS()``;
    ``EntropyVerify``'s ``c(q_i)`` with both options on (``enable_block_verify`` and ``enable_entropy_verify``).

    It is not Sun et al.'s block verification (``verify_block``): the stop events are read from products of
    uniforms and the recovery ignores ``w_tau``, so the emitted law differs from ``q``'s even with ``c = 1``
    (``ascend_block_law``; tests). Upstream: vllm-project/vllm-ascend ``vllm_ascend/ops/triton/reject_sample.py``
    (``rejection_random_sample_block_verify_kernel``) and ``vllm_ascend/sample/rejection_sampler.py``
    (``rejection_sample``: block verification with ``max_spec_len >= 3``; recovered tokens from
    ``sample_recovered_tokens`` without its block option) @ main 182b75e. Its PyTorch fallback
    (``rejection_random_sample_block_verify_pytorch``) takes ``prod_j min(1, q_j / p_j)`` instead of ``w_i``: a
    third law, not modelled.

    Returns ``tokens [B, k + 1]`` int64 (``-1`` padded) and ``num_accepted = tau [B]``.
    """
    _validate_block(draft_tokens, draft_probs, verifier_probs, None, generator)
    scale_rule = _ascend_scales(rule, verifier_probs[:1, :1])  # validates the rule
    del scale_rule
    B, k = draft_tokens.shape
    dev = draft_probs.device
    n, p_rows, q_rows, p_n, q_n = _block_rows(draft_tokens, draft_probs, verifier_probs)
    w, _, _ = _block_quantities(p_n, q_n, p_rows, q_rows)
    c = _ascend_scales(rule, q_rows)
    c = torch.ones_like(p_n) if c is None else c
    gdev = generator.device if generator is not None else dev
    u = torch.rand((B, k + 1), generator=generator, device=gdev, dtype=torch.float64).to(dev)
    legal = (p_n > 0) & (w[:, 1:].double() >= c.double() * u[:, :k].cumprod(-1))
    idx = torch.arange(1, k + 1, device=dev)
    tau = (legal.long() * idx).max(-1).values  # last legal position, 0 if none
    rows = torch.arange(B, device=dev)
    j = tau.clamp_max(k - 1)
    res = (q_rows[rows, j] - p_rows[rows, j]).clamp_min(0)
    res = torch.where(res.sum(-1, keepdim=True) > 0, res, torch.nn.functional.one_hot(torch.zeros_like(j), res.shape[-1])
                      .to(res.dtype))  # an all-zero residual: token 0 (vLLM's race over zeros)
    dist = torch.where((tau == k).unsqueeze(-1), verifier_probs[:, k].to(p_rows.dtype), res)
    y = sample_rows(dist, u[:, k])
    pos = torch.arange(k + 1, device=dev)
    n_pad = torch.cat([n, n.new_full((B, 1), -1)], 1)
    out = torch.where(pos < tau.unsqueeze(-1), n_pad, torch.full_like(n_pad, -1))
    out.scatter_(1, tau.unsqueeze(-1), y.unsqueeze(-1))
    return out, tau


def _exp_poly_integral(poly: np.polynomial.Polynomial, lo: float, hi: float) -> float:
    """``int_lo^hi e^{-s} P(s) ds = [-e^{-s} (P + P' + P'' + ...)]_lo^hi`` (``hi`` may be ``inf``)."""
    tot = np.polynomial.Polynomial([0.0])
    d = poly
    for _ in range(poly.degree() + 1):
        tot = tot + d
        d = d.deriv()
    upper = 0.0 if np.isinf(hi) else math.exp(-hi) * tot(hi)
    return float(math.exp(-lo) * tot(lo) - upper)


def last_legal_law(a) -> np.ndarray:
    """``P(tau = i)``, ``i = 0..k``, for ``tau = max{i : U_i <= a_i}`` (0 if none), ``U_i = u_1 ... u_i`` with
    ``u_j`` i.i.d. uniform on (0, 1) and thresholds ``a_i >= 0`` (..., k): exact, by integration.

    With ``S_i = -log U_i`` (a sum of ``i`` unit exponentials) the events are ``S_i >= b_i = -log a_i``. The density
    of ``S_j`` restricted to the events so far is ``e^{-s} g_j(s)`` with ``g_j`` piecewise polynomial on the
    breakpoints ``b``; one more exponential step integrates ``g``, ``g_{j+1}(t) = int_0^t g_j``, and an event
    multiplies ``g`` by its indicator. ``P(tau = i) = P(S_i >= b_i, S_j < b_j for j > i)``."""
    a = np.asarray(a, dtype=np.float64)
    k = a.shape[-1]
    if a.ndim > 1:
        flat = a.reshape(-1, k)
        return np.stack([last_legal_law(r) for r in flat]).reshape(*a.shape[:-1], k + 1)
    with np.errstate(divide="ignore"):
        b = np.where(a > 0, -np.log(np.where(a > 0, a, 1.0)), np.inf)
    cuts = np.unique(np.concatenate([[0.0], b[(b > 0) & np.isfinite(b)], [np.inf]]))
    mids = [(lo + hi) / 2 if np.isfinite(hi) else lo + 1.0 for lo, hi in zip(cuts[:-1], cuts[1:], strict=True)]
    P = np.polynomial.Polynomial

    def mask(g, keep):  # keep(s): the event holds on the piece around s (pieces never straddle a breakpoint)
        return [poly if keep(m) else P([0.0]) for poly, m in zip(g, mids, strict=True)]

    def integrate(g):
        out, acc = [], 0.0
        for poly, lo, hi in zip(g, cuts[:-1], cuts[1:], strict=True):
            anti = poly.integ()
            out.append(anti + (acc - anti(lo)))
            if np.isfinite(hi):
                acc += anti(hi) - anti(lo)
        return out

    def total(g):
        return sum(_exp_poly_integral(poly, lo, hi) for poly, lo, hi in zip(g, cuts[:-1], cuts[1:], strict=True))

    law = np.zeros(k + 1)
    for i in range(k + 1):
        if i == 0:
            g = mask([P([1.0])] * len(mids), lambda s: s < b[0])  # S_1: density e^{-s}
            start = 1
        else:
            g = [P([0.0] * (i - 1) + [1.0 / math.factorial(i - 1)])] * len(mids)  # S_i ~ Gamma(i, 1)
            g = mask(g, lambda s, i=i: s >= b[i - 1])
            start = i
        for j in range(start, k):  # positions j + 1 = start + 1 .. k must not be legal
            g = mask(integrate(g), lambda s, j=j: s < b[j])
        law[i] = total(g)
    return np.clip(law, 0.0, 1.0)


def ascend_block_law(draft: Cond, verifier: Cond, k: int, rule: Rule | None = None, *,
                     prompt: tuple = ()) -> dict[tuple, float]:
    """Exact law ``{block: prob}`` of one ``verify_block_ascend`` call after ``prompt`` on toy models: every draft
    block ``X^k ~ p`` enumerated, ``P(tau = i | X^k)`` from ``last_legal_law`` with ``a_i = w_i / c_i`` (0 where
    ``p_i(X_i) = 0``), then ``X^i`` and a token of ``(q_{i+1} - p_{i+1})_+`` (token 0 where that is all zero) for
    ``i < k``, or of ``q(. | X^k)`` for ``i = k``."""
    check_positive_int(k, "k")
    P, Q = memoised(draft, "draft"), memoised(verifier, "verifier")
    prompt = tuple(int(t) for t in prompt)
    out: dict[tuple, float] = {}
    ar = np.arange(k)
    for xs, px, p_rows, q_rows in _draft_blocks(P, Q, k, prompt):
        x = np.array(xs)
        p_n = p_rows[ar, x]
        w, _, _ = _block_quantities(p_n, q_rows[ar, x], p_rows, q_rows)
        c = _ascend_scales(rule, q_rows)
        c = np.ones(k) if c is None else np.asarray(c, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(p_n > 0, np.where(c > 0, w[1:] / np.where(c > 0, c, 1.0), np.inf), 0.0)
        taus = last_legal_law(a)
        for i in range(k + 1):
            pt = px * taus[i]
            if pt <= 0:
                continue
            if i == k:
                law = Q(prompt + xs)
            else:
                r = np.maximum(q_rows[i] - p_rows[i], 0.0)
                law = r / r.sum() if r.sum() > 0 else np.eye(r.size)[0]
            _emit(out, xs[:i], pt, law)
    return out


def ascend_block_sequence_law(draft: Cond, verifier: Cond, k: int, T: int, rule: Rule | None = None, *,
                              prompt: tuple = ()) -> np.ndarray:
    """Exact law ``(V,) * T`` of the first ``T`` tokens of the chain loop verified by ``verify_block_ascend``."""
    check_positive_int(T, "T")
    P, Q = memoised(draft, "draft"), memoised(verifier, "verifier")
    prompt = tuple(int(t) for t in prompt)
    V = Q(prompt).size
    return _sequence_from_blocks(lambda c: ascend_block_law(P, Q, k, rule, prompt=c), V, T, prompt)
