"""Toy autoregressive models with exact conditionals, the speculative decoding loop over them, and
the exact law of the loop's first ``T`` emitted tokens.

A model is any ``cond(prefix: tuple[int, ...]) -> (V,) probabilities`` (the law of the next token
given everything before it, prompt included), so the same code serves the n-gram tables here and
tiny transformers elsewhere.

The loop (``speculative_decode``): from the current prefix the draft samples ``n_1..n_k`` one after
another from ``p(. | prefix, n_<j)``; ``sampler.verify`` checks them against
``q(. | prefix, n_<j)`` (rows ``0..k-1``) and ``q(. | prefix, n_1..n_k)`` (row ``k``, the bonus);
the accepted drafts and the one recovered or bonus token are appended; repeat.

Its exact law (``sequence_law``) is a dynamic programme over block boundaries: a block starting at
prefix ``s`` accepts drafts ``d_1..d_a`` with probability ``prod_j p(d_j) phi(d_j)`` and then emits
``y`` with probability ``sum_n p_n (1 - phi_n) g_n(y)`` (a rejection, ``a < k``) or ``b(y)`` (the
bonus, ``a = k``), with ``phi`` and ``g`` taken from the rule's own ``accept_prob_all`` and
``residual`` and ``b = exact.bonus_distribution(rule, q)`` (``q`` itself unless the rule draws its own
bonus, as Medusa's ``argmax q``). With a lossy rule the bonus follows ``b`` while other tokens come
from the rule's mixture, so the law depends on where boundaries fall (on ``k``); SpS gives ``q``'s own law.

Adaptive draft length (``draft_stop``, a ``core.draft_stop.DraftStop``): a block that has drafted
``j < k`` positions drafts position ``j + 1`` only if the draft's signal (its next law's top
probability, or its path probability) clears the threshold; the programme branches on that decision
(``_drafts_next``), and a block that stops after its ``j`` drafts, all accepted, emits the bonus
from the verifier's law after them. SpS still gives ``q``'s law (the argument is in
``core/draft_stop.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..core.draft_stop import DraftStop, check_draft_stop
from ..core.exact import bonus_distribution, step_divergence
from ..core.rules import Rule
from ..core.sampler import sample_rows, verify
from ..core.validate import check_positive_int, check_probs

__all__ = [
    "Cond", "NGram", "random_ngram", "perturbed", "random_pair", "step_parts",
    "speculative_decode", "DecodeResult", "sequence_law", "autoregressive_law", "one_step_test",
    "sequence_test", "Cached", "memoised", "autoregressive_decode", "toy_generate", "BudgetLaw", "budget_law",
]

Cond = Callable[[tuple], np.ndarray]


@dataclass(frozen=True)
class NGram:
    """n-gram model: the next token's law depends on the last ``order - 1`` tokens.

    ``table`` has shape ``(V + 1,) * (order - 1) + (V,)``; index ``V`` stands for "before the
    start", so short prefixes are padded on the left. ``order = 2`` is a Markov chain with an
    initial law ``table[V]``; ``order = 1`` is i.i.d.
    """

    table: np.ndarray

    def __post_init__(self):
        t = np.asarray(self.table, dtype=np.float64)
        V = t.shape[-1]
        if any(d != V + 1 for d in t.shape[:-1]):
            raise ValueError(f"table must have shape (V + 1,) * (order - 1) + (V,), got {t.shape}")
        check_probs(t, "table")
        object.__setattr__(self, "table", t)

    @property
    def V(self) -> int:
        return int(self.table.shape[-1])

    @property
    def order(self) -> int:
        return self.table.ndim

    def __call__(self, prefix: tuple) -> np.ndarray:
        c = self.order - 1
        if c == 0:
            return self.table
        tail = tuple(prefix[-c:]) if len(prefix) >= c else (self.V,) * (c - len(prefix)) + tuple(prefix)
        return self.table[tail]


def random_ngram(V: int, order: int = 2, concentration: float = 1.0, seed: int = 0) -> NGram:
    """n-gram with every row drawn from ``Dirichlet(concentration)`` (seeded)."""
    if not (isinstance(V, (int, np.integer)) and V >= 2):
        raise ValueError(f"V must be an integer >= 2, got {V!r}")
    check_positive_int(order, "order")
    if not concentration > 0:
        raise ValueError(f"concentration must be > 0, got {concentration!r}")
    rng = np.random.default_rng(seed)
    t = rng.dirichlet(np.full(V, float(concentration)), size=(V + 1,) * (order - 1))
    return NGram(t.reshape((V + 1,) * (order - 1) + (V,)))


def perturbed(model: NGram, weight: float, concentration: float = 1.0, seed: int = 1) -> NGram:
    """``(1 - weight) * model + weight * random_ngram``: a draft that resembles the verifier."""
    if not 0 <= weight <= 1:
        raise ValueError(f"weight must be in [0, 1], got {weight!r}")
    other = random_ngram(model.V, model.order, concentration, seed)
    return NGram((1 - weight) * model.table + weight * other.table)


def random_pair(V: int, order: int = 2, concentration: float = 1.0, weight: float = 0.5,
                seed: int = 0) -> tuple[NGram, NGram]:
    """``(draft, verifier)``: a random verifier and a draft that mixes it with ``weight`` noise."""
    verifier = random_ngram(V, order, concentration, seed)
    return perturbed(verifier, weight, concentration, seed + 1), verifier


class Cached:
    """Memoised conditional; each new row is validated once."""

    def __init__(self, cond: Cond, name: str):
        if not callable(cond):
            raise ValueError(f"{name} must be a callable prefix -> (V,) probabilities, got {cond!r}")
        self.cond, self.name, self.rows = cond, name, {}

    def __call__(self, prefix: tuple) -> np.ndarray:
        r = self.rows.get(prefix)
        if r is None:
            r = np.asarray(self.cond(prefix), dtype=np.float64)
            check_probs(r, f"{self.name}{prefix}")
            self.rows[prefix] = r
        return r


def memoised(cond, name: str) -> Cached:
    """``cond`` memoised (``Cached``), or ``cond`` itself when it already is."""
    return cond if isinstance(cond, Cached) else Cached(cond, name)


def _block_inputs(draft, verifier, draft_in_block, prompt) -> tuple[Cached, Cached | None, tuple, int]:
    """``sequence_law`` / ``budget_law``'s laws: the memoised verifier and draft (``None`` with
    ``draft_in_block``; exactly one of the two), the prompt as a tuple of ints and the vocabulary size."""
    if (draft is None) == (draft_in_block is None):
        raise ValueError("give exactly one of draft and draft_in_block")
    Q = Cached(verifier, "verifier")
    P = Cached(draft, "draft") if draft is not None else None
    prompt = tuple(int(t) for t in prompt)
    return Q, P, prompt, Q(prompt).size



class _Trie:
    """Prefix ids: node 0 is the prompt; ``step`` appends one token to many nodes at once."""

    def __init__(self, prompt: tuple, V: int):
        self.V, self.prefix, self.child = V, [prompt], {}

    def step(self, nodes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        keys, inv = np.unique(nodes * self.V + tokens, return_inverse=True)
        ids = np.empty(keys.size, dtype=np.int64)
        for i, key in enumerate(keys.tolist()):
            c = self.child.get(key)
            if c is None:
                c = self.child[key] = len(self.prefix)
                self.prefix.append(self.prefix[key // self.V] + (key % self.V,))
            ids[i] = c
        return ids[np.ravel(inv)]

    def rows(self, cond: Cached, nodes: np.ndarray) -> np.ndarray:
        """``cond`` at every node's prefix: (A,) -> (A, V), one evaluation per distinct node."""
        uniq, inv = np.unique(nodes, return_inverse=True)
        return np.stack([cond(self.prefix[i]) for i in uniq.tolist()])[np.ravel(inv)]


@dataclass(frozen=True)
class DecodeResult:
    """``tokens`` (B, T) the first T emitted tokens; ``blocks`` (B,) verification steps used;
    ``accepted`` (B,) accepted drafts in those steps (bonus tokens not counted); ``spent`` (B,) the nats a
    stateful rule (``SequenceBudget``) charged each sequence (None for other rules)."""

    tokens: np.ndarray
    blocks: np.ndarray
    accepted: np.ndarray
    spent: np.ndarray | None = None


def speculative_decode(
    draft: Cond, verifier: Cond, rule: Rule, k: int, T: int, *, num_sequences: int = 1,
    prompt: tuple = (), generator: torch.Generator | None = None, sampler: Callable = verify,
    draft_stop: DraftStop | float | None = None,
) -> DecodeResult:
    """Run the speculative decoding loop on ``num_sequences`` independent sequences until each has
    emitted ``T`` tokens (the last block may emit more; they are dropped).

    All sequences advance together: each step drafts ``k`` tokens per sequence (inverse-CDF draws
    from ``generator``) and calls ``sampler(draft_tokens, p, q, rule, generator=generator)``
    (default ``sampler.verify``) once for the whole batch. Conditionals are evaluated once per
    distinct prefix. A stateful ``rule`` (``SequenceBudget``) gets one state per sequence
    (``rule.start(num_sequences, max_tokens=T)``), handed to the sampler as ``state=``.

    ``draft_stop`` (``core.draft_stop.DraftStop``, or a threshold of the top signal): each sequence stops
    drafting its block once the draft's signal falls below the threshold (its later positions are padding:
    laws and draws at the context where it stopped), and the sampler gets ``lengths=`` (drafts per sequence).
    """
    stop = check_draft_stop(draft_stop)
    check_positive_int(k, "k")
    check_positive_int(T, "T")
    check_positive_int(num_sequences, "num_sequences")
    P, Q = Cached(draft, "draft"), Cached(verifier, "verifier")
    prompt = tuple(int(t) for t in prompt)
    B = int(num_sequences)
    V = P(prompt).size
    trie = _Trie(prompt, V)
    out = np.full((B, T + k + 1), -1, dtype=np.int64)
    nodes = np.zeros(B, dtype=np.int64)  # prefix id of each sequence
    lens = np.zeros(B, dtype=np.int64)  # tokens emitted so far
    blocks = np.zeros(B, dtype=np.int64)
    accepted = np.zeros(B, dtype=np.int64)
    dev = generator.device if generator is not None else torch.device("cpu")
    state = rule.start(B, max_tokens=T) if rule.stateful else None
    while True:
        act = np.flatnonzero(lens < T)
        if act.size == 0:
            break
        c = nodes[act]
        ps, qs, ns = [], [], []
        going = np.ones(act.size, dtype=bool)  # rows still drafting this block (draft_stop)
        size = np.zeros(act.size, dtype=np.int64)
        path = np.ones(act.size)
        for j in range(k):
            p, q = trie.rows(P, c), trie.rows(Q, c)
            if p.shape[-1] != V or q.shape[-1] != V:
                raise ValueError(f"draft and verifier must share one vocabulary of size {V}, got {p.shape[-1]} and {q.shape[-1]}")
            if stop is not None and j > 0:
                going &= np.asarray(stop.continues(p, path))
                if not going.any():
                    break
            u = torch.rand(act.size, generator=generator, dtype=torch.float64, device=dev).cpu()
            n = sample_rows(torch.from_numpy(p), u).numpy()
            path = path * p[np.arange(act.size), n]
            size += going
            ps.append(p), qs.append(q), ns.append(n)
            c = np.where(going, trie.step(c, n), c)  # a stopped row stays: its later rows are padding, and its
        qs.append(trie.rows(Q, c))  # row lengths[b] the verifier's law after its last draft (the bonus row)
        p_t, q_t = torch.from_numpy(np.stack(ps, 1)), torch.from_numpy(np.stack(qs, 1))
        kw = {} if state is None else {"state": state.subset(act)}
        if stop is not None:
            kw["lengths"] = torch.from_numpy(size)
        tokens, na = sampler(torch.from_numpy(np.stack(ns, 1)), p_t, q_t, rule, generator=generator, **kw)
        if state is not None:
            state.update(act, kw["state"])
        tokens, m = tokens.cpu().numpy(), na.cpu().numpy() + 1
        c = nodes[act]
        for j in range(tokens.shape[1]):
            sel = np.flatnonzero(j < m)
            out[act[sel], lens[act[sel]] + j] = tokens[sel, j]
            c[sel] = trie.step(c[sel], tokens[sel, j])
        nodes[act] = c
        lens[act] += m
        blocks[act] += 1
        accepted[act] += m - 1
    return DecodeResult(out[:, :T].copy(), blocks, accepted, None if state is None else state.spent.copy())


def autoregressive_decode(cond: Cond, T: int, *, num_sequences: int = 1, prompt: tuple = (),
                          generator: torch.Generator | None = None) -> np.ndarray:
    """``num_sequences`` plain samples of ``T`` tokens from ``cond`` (the reference of a speculative loop):
    token ``t`` by an inverse-CDF draw from ``cond(prompt + x_<t)``, uniforms from ``generator``; (B, T) int64."""
    check_positive_int(T, "T")
    check_positive_int(num_sequences, "num_sequences")
    C = Cached(cond, "cond")
    prompt = tuple(int(t) for t in prompt)
    trie = _Trie(prompt, C(prompt).size)
    nodes = np.zeros(num_sequences, dtype=np.int64)
    out = np.empty((num_sequences, T), dtype=np.int64)
    dev = generator.device if generator is not None else torch.device("cpu")
    for t in range(T):
        u = torch.rand(num_sequences, generator=generator, dtype=torch.float64, device=dev).cpu()
        out[:, t] = sample_rows(torch.from_numpy(trie.rows(C, nodes)), u).numpy()
        nodes = trie.step(nodes, out[:, t])
    return out


def toy_generate(verifier: Cond, T: int, *, draft: Cond | None = None, rule: Rule | None = None, k: int = 2,
                 sampler: Callable = verify) -> Callable:
    """A whole-decode generator over toy models for ``check_generation``: ``generate(prompts, n, seed)`` returns
    ``n`` decodes of ``T`` tokens per prompt (prompts: tuples of token ids), in prompt order, from
    ``speculative_decode(draft, verifier, rule, k, ...)`` when a ``rule`` is given (``sampler`` verifies), else
    from ``autoregressive_decode(verifier, ...)``. One generator seeded by ``seed`` serves all prompts."""
    if rule is not None and draft is None:
        raise ValueError("a speculative toy generator needs a draft model")

    def generate(prompts, n, seed):
        g = torch.Generator().manual_seed(int(seed))
        out = []
        for pr in prompts:
            if rule is None:
                rows = autoregressive_decode(verifier, T, num_sequences=n, prompt=tuple(pr), generator=g)
            else:
                rows = speculative_decode(draft, verifier, rule, k, T, num_sequences=n, prompt=tuple(pr),
                                          generator=g, sampler=sampler).tokens
            out += rows.tolist()
        return out

    return generate


def step_parts(rule: Rule, p: np.ndarray, q: np.ndarray,
               judged: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One verification step split by outcome, from the rule's own code, both (V,):
    ``accept[n] = p_n phi_n`` (draft ``n`` accepted) and ``reject[y] = sum_n p_n (1 - phi_n) g_n(y)``
    (a rejection followed by recovery token ``y``); they sum to 1 together. ``judged`` (V,) bool: only the
    candidates ``n`` it marks are judged (the others' mass ``p_n`` is left out of both)."""
    V = p.size
    phi = rule.accept_prob_all(p, q)
    if judged is not None:
        p = np.where(judged, p, 0.0)
    w = p * (1 - phi)
    live = np.flatnonzero(w > 0)
    reject = np.zeros(V)
    if live.size:
        g = rule.residual(np.broadcast_to(p, (live.size, V)), np.broadcast_to(q, (live.size, V)), live, check=False)
        reject = w[live] @ g
    return p * phi, reject


def _drafts_next(stop: DraftStop | None, p: np.ndarray, q: np.ndarray, path: float, j: int):
    """Whether a block that has drafted ``j`` positions, all accepted, drafts and judges position ``j + 1``:
    always at ``j = 0``, else ``stop.continues(p, path)`` (``p`` the draft's law at ``j + 1``, ``path`` its
    probability of the ``j`` drafts); True without a policy. The verifier's law ``q`` there is handed over
    for the policies tests plant, never read by ``DraftStop``. ``sequence_law`` also takes a (V,) bool array
    back, a decision per candidate ``x_{j+1}`` (judged where True, withheld for the bonus where False): no
    ``DraftStop`` reads the candidate; tests plant such a policy to show that it is not lossless."""
    return True if stop is None or j == 0 else bool(stop.continues(p, path))


def sequence_law(draft: Cond | None, verifier: Cond, rule: Rule, k: int, T: int, *, prompt: tuple = (),
                 verifier_first: bool = False,
                 draft_in_block: Callable[[tuple, tuple], np.ndarray] | None = None,
                 draft_stop: DraftStop | float | None = None) -> np.ndarray:
    """Exact law of the first ``T`` tokens emitted by ``speculative_decode``: array ``(V,) * T``.

    Dynamic programme over block boundaries: ``frontier[s]`` is the probability that a block
    starts right after emitted prefix ``s`` (``len(s) < T``); each block from ``s`` is enumerated
    over its accepted drafts (see ``step_parts``) until it ends or reaches ``T`` tokens. Cost:
    O(number of prefixes of length <= T) rule evaluations of size V.

    ``verifier_first``: the first token is drawn from the verifier's own law (as when the prompt
    pass of the verifier emits it, vLLM's and ``lm.speculative_generate``'s order), blocks follow.
    ``draft_in_block(context, drafts)``: a draft whose law depends on where its block started (a
    feature-level draft reads the verifier's features up to the block start and its own after):
    the law of the next draft given the context at the block start and the drafts so far; it
    replaces ``draft``.
    ``draft_stop``: the adaptive draft length of ``speculative_decode(..., draft_stop=)``: after ``j`` drafts,
    all accepted, the block drafts position ``j + 1`` only as ``_drafts_next`` decides, else emits the bonus
    (from the rule's bonus law of the verifier's row after the ``j`` drafts).

    A stateful ``rule`` (``SequenceBudget``): ``budget_law(...).law``, the programme with the budget spent
    along each path in its state.
    """
    check_positive_int(k, "k")
    check_positive_int(T, "T")
    stop = check_draft_stop(draft_stop)
    if rule.stateful:
        return budget_law(draft, verifier, rule, k, T, prompt=prompt, verifier_first=verifier_first,
                          draft_in_block=draft_in_block, draft_stop=stop).law
    Q, P, prompt, V = _block_inputs(draft, verifier, draft_in_block, prompt)
    parts: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    rows: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    law = np.zeros((V,) * T)
    frontier: list[dict[tuple, float]] = [{} for _ in range(T)]
    if verifier_first:
        q0 = Q(prompt)
        for y in np.flatnonzero(q0 > 0):
            if T == 1:
                law[int(y)] += q0[y]
            else:
                frontier[1][(int(y),)] = float(q0[y])
    else:
        frontier[0][()] = 1.0

    def emit(t: tuple, w: float) -> None:
        if len(t) >= T:
            law[t[:T]] += w
        else:
            frontier[len(t)][t] = frontier[len(t)].get(t, 0.0) + w

    def bonus(d: tuple, c: tuple, wd: float) -> None:  # the block ends after d, all accepted: the bonus token
        b = bonus_distribution(rule, Q(c), check=False)
        for y in np.flatnonzero(b > 0):
            emit(s + d + (int(y),), wd * b[y])

    for length in range(T):
        for s, w in frontier[length].items():
            stack = [((), w, 1.0)]  # accepted drafts, weight, the draft's probability of them (its path)
            while stack:
                d, wd, path = stack.pop()
                if len(s) + len(d) >= T:
                    emit(s + d, wd)
                    continue
                c = prompt + s + d
                if len(d) == k:  # all k drafts accepted: the bonus token, from the rule's bonus law
                    bonus(d, c, wd)
                    continue
                key = c if P is not None else (prompt + s, d)
                if key not in rows:
                    q = Q(c)
                    p = P(c) if P is not None else np.asarray(draft_in_block(prompt + s, d), dtype=np.float64)
                    if p.size != q.size:
                        raise ValueError(f"draft and verifier must share one vocabulary, got sizes {p.size} and {q.size}")
                    rows[key] = (p, q)
                p, q = rows[key]
                judged = _drafts_next(stop, p, q, path, len(d))
                if judged is False:  # the draft stops here
                    bonus(d, c, wd)
                    continue
                if judged is True:
                    if key not in parts:
                        parts[key] = step_parts(rule, p, q)
                    acc, rej = parts[key]
                else:  # a decision per candidate (planted policies): withheld candidates end with the bonus
                    mask = np.asarray(judged, dtype=bool)
                    acc, rej = step_parts(rule, p, q, judged=mask)
                    rej = rej + p[~mask].sum() * bonus_distribution(rule, q, check=False)
                for y in np.flatnonzero(rej > 0):
                    emit(s + d + (int(y),), wd * rej[y])
                for n in np.flatnonzero(acc > 0):
                    stack.append((d + (int(n),), wd * acc[n], path * p[n]))
    return law


@dataclass(frozen=True)
class BudgetLaw:
    """The exact law of a ``SequenceBudget`` decode's first ``T`` tokens (``budget_law``) and what it spent.

    ``law`` (V,) * T; ``spent`` ``{nats charged along a path: probability}`` over the decode's paths (block
    boundaries, accepts and rejections, not only tokens); ``expected_spent`` ``E[sum of charged costs]``, the
    chain rule's upper bound on ``KL(law || verifier's law)``; ``max_spent`` the largest charged sum of any path
    and ``max_exact`` the largest sum along a path of the same positions' costs recomputed independently
    (``exact.step_divergence`` of ``Cactus(delta_t)`` on the full rows, the O(V log V) path)."""

    law: np.ndarray
    spent: dict
    expected_spent: float
    max_spent: float
    max_exact: float


def budget_law(draft: Cond | None, verifier: Cond, rule: Rule, k: int, T: int, *, prompt: tuple = (),
               verifier_first: bool = False,
               draft_in_block: Callable[[tuple, tuple], np.ndarray] | None = None,
               draft_stop: DraftStop | float | None = None) -> BudgetLaw:
    """Exact law of the first ``T`` tokens of ``speculative_decode`` with a stateful ``rule`` (``SequenceBudget``),
    and what it spent (``BudgetLaw``).

    ``sequence_law``'s programme over block boundaries with the rule's state in it: ``frontier[len(s)]`` maps
    ``(s, state)`` to the probability that a block starts after prefix ``s`` with the state ``state`` (the budget
    spent so far, the tokens left). The rule is driven only through what the sampler calls, so the programme
    follows any controller: at drafted position ``j`` of a block (drafts ``d_1..d_{j-1}`` accepted) the decision is
    ``rule.plan(state, p_1..p_j, q_1..q_j)`` at ``j`` (a plan decides position ``j`` from rows ``1..j`` only), the
    position is judged by ``plan.at(0, j)`` (``step_parts`` of it gives the accept / reject split), and where the
    block ends the state is charged as ``verify`` charges it (``state.charge``: the judged positions, the emitted
    tokens). ``verifier_first``: the first token from ``q`` (as ``lm.speculative_generate``), the state starting
    after it with ``T - 1`` tokens to emit. ``draft_stop``: as ``sequence_law``'s (a block that stops after its
    ``j`` drafts, all accepted, is charged for them and emits the bonus from ``q``)."""
    check_positive_int(k, "k")
    check_positive_int(T, "T")
    stop = check_draft_stop(draft_stop)
    if not rule.stateful:
        raise ValueError(f"budget_law needs a stateful rule (SequenceBudget), got {rule!r}: use sequence_law")
    Q, P, prompt, V = _block_inputs(draft, verifier, draft_in_block, prompt)
    law = np.zeros((V,) * T)
    spent_law: dict[float, float] = {}
    tot = {"mean": 0.0, "max": 0.0, "exact": 0.0}
    states: dict[tuple, object] = {}  # key -> the state object it stands for
    frontier: list[dict[tuple, float]] = [{} for _ in range(T)]
    first = rule.start(1, max_tokens=T - 1 if verifier_first else T)

    def key_of(state, exact: float) -> tuple:
        key = (float(state.spent[0]), float(state.left[0]), float(state.spread[0]), exact)
        states.setdefault(key, state)
        return key

    def emit(t: tuple, key: tuple, w: float) -> None:
        if len(t) >= T:
            law[t[:T]] += w
            spent = key[0]
            spent_law[spent] = spent_law.get(spent, 0.0) + w
            tot["mean"] += w * spent
            tot["max"], tot["exact"] = max(tot["max"], spent), max(tot["exact"], key[3])
        else:
            frontier[len(t)][(t, key)] = frontier[len(t)].get((t, key), 0.0) + w

    if verifier_first:
        q0 = Q(prompt)
        for y in np.flatnonzero(q0 > 0):
            emit((int(y),), key_of(first, 0.0), float(q0[y]))
    else:
        frontier[0][((), key_of(first, 0.0))] = 1.0

    def after(state, plan, j: int, emitted: int):
        """A copy of ``state`` charged for a block that judged positions ``0..j`` and emitted ``emitted`` tokens."""
        st = state.subset(np.arange(1))
        st.charge(plan, (np.arange(plan.delta.shape[1]) <= j)[None], np.array([emitted]))
        return st

    rows: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for length in range(T):
        for (s, key), w in frontier[length].items():
            state, exact = states[key], key[3]
            # accepted drafts, weight, their rows p, q, recomputed costs, plan, the draft's path probability
            stack = [((), w, [], [], 0.0, None, 1.0)]
            while stack:
                d, wd, ps, qs, cum_x, last, path = stack.pop()
                if len(s) + len(d) >= T:  # the first T tokens are out (what follows is cut): charge what was judged
                    emit(s + d, key_of(state if not d else after(state, last, len(d) - 1, len(d)), exact + cum_x), wd)
                    continue
                c = prompt + s + d
                rk = c if P is not None else (prompt + s, d)
                if len(d) < k and rk not in rows:
                    p = P(c) if P is not None else np.asarray(draft_in_block(prompt + s, d), dtype=np.float64)
                    if p.size != V:
                        raise ValueError(f"draft and verifier must share one vocabulary, got sizes {p.size} and {V}")
                    rows[rk] = (p, Q(c))
                if len(d) == k or not _drafts_next(stop, *rows[rk], path, len(d)):
                    # all k (or the block's) drafts accepted: the bonus token, from q (cost 0); the plan of the
                    # last drafted position covers 1..len(d)
                    st = after(state, last, len(d) - 1, len(d) + 1)
                    b = Q(c)
                    for y in np.flatnonzero(b > 0):
                        emit(s + d + (int(y),), key_of(st, exact + cum_x), wd * b[y])
                    continue
                p, q = rows[rk]
                j = len(d)
                plan = rule.plan(state.subset(np.arange(1)), np.stack(ps + [p])[None], np.stack(qs + [q])[None])
                judge = plan.at(0, j)
                cost_x = float(step_divergence(judge, p, q, check=False)) if judge.delta > 0 else 0.0
                a, rej = step_parts(judge, p, q)
                if (rej > 0).any():
                    st = after(state, plan, j, j + 1)
                    for y in np.flatnonzero(rej > 0):
                        emit(s + d + (int(y),), key_of(st, exact + cum_x + cost_x), wd * rej[y])
                for n in np.flatnonzero(a > 0):
                    stack.append((d + (int(n),), wd * a[n], ps + [p], qs + [q], cum_x + cost_x, plan, path * p[n]))
    return BudgetLaw(law, spent_law, tot["mean"], tot["max"], tot["exact"])


def autoregressive_law(cond: Cond, T: int, *, prompt: tuple = ()) -> np.ndarray:
    """Law of ``T`` tokens sampled plainly from ``cond``: ``prod_t cond(x_<t)[x_t]``, (V,) * T."""
    C = Cached(cond, "cond")
    prompt = tuple(int(t) for t in prompt)
    V = C(prompt).size
    law = np.zeros((V,) * T)
    stack = [((), 1.0)]
    while stack:
        s, w = stack.pop()
        if len(s) == T:
            law[s] += w
            continue
        r = C(prompt + s)
        stack.extend((s + (int(y),), w * r[y]) for y in np.flatnonzero(r > 0))
    return law


# -- harness: the statistical checks the test-suite (and users) run on a sampler ----------------

def one_step_test(rule: Rule, draft_rows: np.ndarray, verifier_rows: np.ndarray, *, num_samples: int,
                  sampler: Callable = verify, seed: int = 0, alpha: float = 1e-4,
                  statistic: str = "chi2"):
    """Goodness of fit of the first emitted token of ``sampler`` to ``induced_distribution``.

    ``draft_rows`` (k, V), ``verifier_rows`` (k + 1, V) are shared by ``num_samples`` sequences;
    drafts are drawn from them (seeded), ``sampler`` is called once on the whole batch, and
    ``tokens[:, 0]`` must follow ``h_alg`` of ``(draft_rows[0], verifier_rows[0])``.
    """
    from ..core.exact import induced_distribution
    from .stats import goodness_of_fit

    p = np.asarray(draft_rows, dtype=np.float64)
    q = np.asarray(verifier_rows, dtype=np.float64)
    k, V = p.shape
    if q.shape != (k + 1, V):
        raise ValueError(f"verifier_rows must have shape (k + 1, V) = ({k + 1}, {V}), got {q.shape}")
    g = torch.Generator().manual_seed(seed)
    P = torch.from_numpy(p).expand(num_samples, k, V)
    Q = torch.from_numpy(q).expand(num_samples, k + 1, V)
    u = torch.rand((num_samples, k), generator=g, dtype=torch.float64)
    n = torch.stack([sample_rows(P[:, j], u[:, j]) for j in range(k)], 1)
    tokens, _ = sampler(n, P, Q, rule, generator=g)
    return goodness_of_fit(tokens[:, 0].numpy(), induced_distribution(rule, p[0], q[0]),
                           alpha=alpha, statistic=statistic, kind="samples")


def sequence_test(draft: Cond, verifier: Cond, rule: Rule, k: int, T: int, *, num_sequences: int,
                  sampler: Callable = verify, seed: int = 0, alpha: float = 1e-4, prompt: tuple = (),
                  statistic: str = "chi2", draft_stop: DraftStop | float | None = None):
    """Goodness of fit of ``speculative_decode``'s first ``T`` tokens to ``sequence_law`` (both with
    ``draft_stop``, the adaptive draft length, when given)."""
    from .stats import goodness_of_fit

    res = speculative_decode(draft, verifier, rule, k, T, num_sequences=num_sequences, prompt=prompt,
                             generator=torch.Generator().manual_seed(seed), sampler=sampler, draft_stop=draft_stop)
    law = sequence_law(draft, verifier, rule, k, T, prompt=prompt, draft_stop=draft_stop)
    return goodness_of_fit(res.tokens, law, alpha=alpha, statistic=statistic, kind="samples")
