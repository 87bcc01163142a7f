"""Model / KV-cache adapters of the decoding loop: one object per model and batch that remembers
what the model has read, so the loop only says what to feed next.

``Target`` (the verifier) has one pending token per row (emitted, not yet read). ``score(drafts)``
reads ``[pending, drafts]`` in one forward and returns the verifier's logits at each of those
positions (and its features there, for feature-level drafts); ``advance(a, last)`` keeps the pending
token and the ``a`` accepted drafts and makes ``last`` the new pending token.

Drafters propose ``k`` tokens with their laws: ``propose(k, sampling, gen, stop)``, each row fewer when
an adaptive draft length ``stop`` (``core.draft_stop.DraftStop``) ends its block early; ``advance(a,
tokens, feats)`` tells them what the verifier kept. ``TokenDrafter`` wraps a causal LM (its own cache);
``FeatureDrafter`` wraps the EAGLE-3-style head, which reads the verifier's features.

Both adapters talk to a model through one stream interface (``open_stream``): ``length`` (B,) the
tokens of each row that are final, ``forward(ids, n, logits_at)`` reads a block after them (row
``b``'s first ``n[b]`` tokens are real), ``keep(n)`` makes the first ``n[b]`` tokens of the block
just read final, ``rewind(n)`` forgets the last ``n[b]`` final tokens, ``select(idx)`` keeps rows.
Two implementations: the compact Llama (``llama.py``; static cache written at per-row offsets,
stale slots overwritten) for Llama-family models, and any Hugging Face causal LM (a growing cache
whose rejected slots are masked out; positions count only unmasked slots, so each row sees exactly
the sequence it would see alone).

Trees: ``forward_tree(ids, parents, lo)`` reads nodes ``lo..`` of a tree drafted
after the final tokens (tree attention, ``Llama.forward_tree``); ``keep_path(nodes, n)`` makes the first
``n[b]`` nodes of ``nodes[b]`` (a root-to-node path) final, moving their cache entries into consecutive
slots. ``Target.score_tree`` / ``advance_tree`` and ``TokenDrafter.propose_tree`` / ``advance_tree`` are
the tree versions of the chain methods.
"""

from __future__ import annotations

import inspect

import torch

from ..core.draft_stop import DraftStop
from ..core.draws import RowGenerators, uniforms
from ..core.sampler import draw, sample_rows
from ..core.transforms import sampling_probs
from ..core.tree import SCHEMES, Grow, as_tree, rerank, without
from .draft import FeatureDraft, spread
from .llama import Llama, tree_ancestry

__all__ = ["Target", "TokenDrafter", "FeatureDrafter", "make_drafter", "right_pad", "open_stream",
           "grow_tree", "tree_sizes", "ranked_tokens"]


def right_pad(prompts: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, L) right-padded with ``pad`` and the lengths (B,)."""
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p)
    return ids.to(device), torch.tensor([len(p) for p in prompts], device=device)


class _LlamaStream:
    """A compact Llama's static cache for a batch: slots ``0 .. length[b] - 1`` of row ``b`` are final;
    a block is written at slots ``length[b] ..`` and stays there only as far as ``keep`` moves the
    length (the rest is overwritten by the next block)."""

    def __init__(self, model: Llama, batch: int, capacity: int, aux_layers=()):
        self.model, self.aux_layers = model, tuple(aux_layers)
        self.cache = model.new_cache(batch, capacity)
        self.length = torch.zeros(batch, dtype=torch.long, device=model.device)

    def forward(self, ids: torch.Tensor, n: torch.Tensor | None = None, logits_at: torch.Tensor | None = None):
        """Read block ``ids`` (B, W) after each row's final tokens (row ``b``'s tokens past ``n[b]`` are
        padding, never attended by real ones); returns logits (B, W, V) float32 (or (B, 1, V) at column
        ``logits_at[b]``) and the features (list of (B, W, dim), one per ``aux_layers``)."""
        return self.model(ids, self.length, self.cache, self.aux_layers, logits_at=logits_at)

    def keep(self, n: torch.Tensor) -> None:
        """The first ``n[b]`` (B,) tokens of the block just read become final."""
        self.length = self.length + n

    def rewind(self, n: torch.Tensor) -> None:
        """Forget the last ``n[b]`` (B,) final tokens of each row."""
        self.length = self.length - n

    def forward_tree(self, ids: torch.Tensor, parents: torch.Tensor, lo: int = 0,
                     logits_at: torch.Tensor | None = None):
        """Read nodes ``lo .. lo + W - 1`` (``ids`` (B, W)) of the tree ``parents`` (B, M) drafted after
        each row's final tokens (``Llama.forward_tree``); returns logits (B, W, V) float32 and features."""
        return self.model.forward_tree(ids, parents, self.length, self.cache, lo, self.aux_layers, logits_at)

    def keep_path(self, nodes: torch.Tensor, n: torch.Tensor) -> None:
        """Nodes ``nodes[b, :n[b]]`` (B, M) int64 of the tree just read, a root-to-node path, become final."""
        M = nodes.shape[1]
        keep = torch.arange(M, device=nodes.device)[None] < n[:, None]
        self.cache.keep_path(self.length, torch.where(keep, nodes, torch.full_like(nodes, -1)))
        self.length = self.length + n

    def select(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx``."""
        self.cache.select(idx)
        self.length = self.length[idx]


class _HFStream:
    """A Hugging Face model's cache for a batch: blocks are appended; slots of padding and of tokens
    not kept are masked out (``mask = 0``) rather than cut, so rows that kept different numbers of
    tokens stay in one rectangular cache; a token's position counts the unmasked slots before it."""

    def __init__(self, model, batch: int, device, aux_layers=()):
        self.model, self.aux_layers = model, tuple(aux_layers)
        self.kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.cache = None
        self.mask = torch.zeros((batch, 0), dtype=torch.long, device=device)
        self._w = 0  # width of the block just read

    @property
    def length(self) -> torch.Tensor:
        """(B,) final tokens per row (unmasked slots)."""
        return self.mask.sum(-1)

    def forward_tree(self, ids: torch.Tensor, parents: torch.Tensor, lo: int = 0,
                     logits_at: torch.Tensor | None = None):
        """As ``_LlamaStream.forward_tree``, through the model's own forward with a 4D additive mask
        (B, 1, W, slots): a node sees the unmasked slots before the tree and its ancestors and itself;
        positions ``length + depth``. The tree's slots are appended masked (not final) until ``keep_path``."""
        B, W = ids.shape
        M = lo + W
        dev = ids.device
        if lo == 0:
            self._tree_base = self.mask.shape[1]
        base = self._tree_base
        anc, depth = tree_ancestry(parents[:, :M].to(dev).long())
        seen = torch.cat([self.mask[:, :base].bool()[:, None, :].expand(B, W, base), anc[:, lo:, :M]], -1)
        dtype = next(self.model.parameters()).dtype
        mask4 = torch.zeros(seen.shape, dtype=dtype, device=dev).masked_fill_(~seen, torch.finfo(dtype).min)
        pos = self.mask[:, :base].sum(-1, keepdim=True) + depth[:, lo:]
        self.mask = torch.cat([self.mask, torch.zeros_like(ids)], 1)
        self._w = 0
        return self._call(ids, mask4[:, None], pos, logits_at)

    def keep_path(self, nodes: torch.Tensor, n: torch.Tensor) -> None:
        """Nodes ``nodes[b, :n[b]]`` of the tree just read become final (their slots unmasked)."""
        M = nodes.shape[1]
        keep = torch.arange(M, device=nodes.device)[None] < n[:, None]
        b, i = torch.nonzero(keep, as_tuple=True)
        self.mask[b, self._tree_base + nodes[b, i]] = 1

    def forward(self, ids: torch.Tensor, n: torch.Tensor | None = None, logits_at: torch.Tensor | None = None):
        """As ``_LlamaStream.forward``; the block's real tokens are unmasked until ``keep``."""
        valid = (torch.ones_like(ids) if n is None else
                 (torch.arange(ids.shape[1], device=ids.device)[None] < n[:, None]).long())
        pos = (self.mask.sum(-1, keepdim=True) + valid.cumsum(-1) - 1).clamp_min(0)
        self.mask = torch.cat([self.mask, valid], dim=1)
        self._w = ids.shape[1]
        return self._call(ids, self.mask, pos, logits_at)

    def _call(self, ids, mask, pos, logits_at):
        """The model's forward over ``ids`` with ``mask`` and positions ``pos``, its cache kept; returns
        float32 logits (B, W, V), or (B, 1, V) at ``logits_at`` (B,), and the features of ``aux_layers``."""
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         output_hidden_states=bool(self.aux_layers), **{self.kw: self.cache})
        c = getattr(out, "past_key_values", None)
        self.cache = c if c is not None else getattr(out, "cache", None)
        aux = [out.hidden_states[i] for i in self.aux_layers] if self.aux_layers else []
        logits = out.logits
        if logits_at is not None:
            logits = logits[torch.arange(ids.shape[0], device=ids.device), logits_at].unsqueeze(1)
        return logits.float(), aux

    def keep(self, n: torch.Tensor) -> None:
        """The first ``n[b]`` tokens of the block just read stay; its other slots are masked out."""
        w = self._w
        if w:
            keep = torch.arange(w, device=n.device)[None, :] < n[:, None]
            self.mask[:, -w:] *= keep.long()

    def rewind(self, n: torch.Tensor) -> None:
        """Mask out the last ``n[b]`` unmasked slots of each row."""
        from_end = self.mask.flip(-1).cumsum(-1).flip(-1)  # unmasked slots at or after each slot
        self.mask = self.mask * (from_end > n[:, None]).long()

    def select(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx``."""
        self.mask = self.mask[idx]
        if self.cache is not None:
            self.cache.batch_select_indices(idx)


def open_stream(model, batch: int, capacity: int, device, aux_layers=()):
    """The stream (see the module docstring) of ``model`` for ``batch`` rows of up to ``capacity``
    tokens, returning the features entering ``aux_layers``: the static-cache stream for a compact
    ``Llama``, the masked growing cache for a Hugging Face causal LM."""
    if isinstance(model, Llama):
        return _LlamaStream(model, batch, capacity, aux_layers)
    return _HFStream(model, batch, device, aux_layers)


class Target:
    """The verifier's side of the loop (see the module docstring)."""

    def __init__(self, model, batch: int, capacity: int, device, aux_layers=()):
        self.s = open_stream(model, batch, capacity, device, aux_layers)
        self.pending = None  # (B,) the emitted token not yet read

    def prefill(self, ids: torch.Tensor, lens: torch.Tensor):
        """Read the prompts (right-padded ``ids`` (B, L), lengths ``lens``); returns the logits of the
        first new token (B, V) and the features at every prompt position (list of (B, L, dim))."""
        logits, aux = self.s.forward(ids, lens, logits_at=lens - 1)
        self.s.keep(lens)
        return logits[:, 0], aux

    def score(self, drafts: torch.Tensor | None):
        """Read ``[pending, drafts]`` (B, 1 + k); returns logits (B, 1 + k, V) float32 and features."""
        block = self.pending[:, None] if drafts is None else torch.cat([self.pending[:, None], drafts], 1)
        return self.s.forward(block)

    def advance(self, a: torch.Tensor, last: torch.Tensor) -> None:
        """Keep the pending token and ``a`` (B,) accepted drafts; ``last`` (B,) is the new pending token."""
        self.s.keep(a + 1)
        self.pending = last

    def score_tree(self, tokens: torch.Tensor, parents: torch.Tensor):
        """Read ``pending`` and a drafted tree in one forward: ``tokens`` (B, N) int64 (``-1``: absent
        node), ``parents`` (B, N) int64 (``-1``: a child of the pending token). Returns logits
        (B, N + 1, V) float32 (column 0 at the pending token, column ``j + 1`` after node ``j``) and
        the features at those positions."""
        B = tokens.shape[0]
        block = torch.cat([self.pending[:, None], tokens.clamp_min(0)], 1)
        par = torch.where((parents >= 0) & (tokens >= 0), parents + 1, torch.zeros_like(parents))
        par = torch.cat([torch.full((B, 1), -1, dtype=par.dtype, device=par.device), par], 1)
        return self.s.forward_tree(block, par.long())

    def advance_tree(self, path: torch.Tensor, a: torch.Tensor, last: torch.Tensor) -> None:
        """Keep the pending token and the accepted path ``path[b, :a[b]]`` (B, N) node ids (``verify_tree``'s
        ``accepted_nodes``); ``last`` (B,) is the new pending token."""
        B = path.shape[0]
        nodes = torch.cat([torch.zeros((B, 1), dtype=torch.long, device=path.device),
                           torch.where(path >= 0, path + 1, path)], 1)
        self.s.keep_path(nodes, a + 1)
        self.pending = last

    def select(self, idx):
        self.s.select(idx)
        self.pending = self.pending[idx]


def _sample(logits: torch.Tensor, sampling, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from the transformed law; returns (token (B,), law (B, V))."""
    p = sampling_probs(logits, *sampling)
    return draw(p, gen), p


class _Stopping:
    """One block's adaptive draft length in a drafter's ``propose`` (``core.draft_stop.DraftStop``): the rows
    still drafting, each row's drafts and the draft's probability of them. Without a policy every row drafts
    all ``k`` positions and the draws are plain ``draw(p, gen)``.

    ``draw(p, gen)`` draws position ``j``'s drafts (a row that stopped draws nothing from its own generator:
    its token is 0, padding); then ``drawn()`` applies the path signal (before the drafter reads the drafts)
    and ``next_law(p)`` the top signal (once it has the law of position ``j + 1``); each returns whether any
    row still drafts."""

    def __init__(self, stop: DraftStop | None, B: int, device):
        self.stop = stop
        if stop is not None:
            self.going = torch.ones(B, dtype=torch.bool, device=device)
            self.size = torch.zeros(B, dtype=torch.long, device=device)
            self.path = torch.ones(B, dtype=torch.float64, device=device)

    @property
    def lengths(self) -> torch.Tensor | None:
        """(B,) int64 drafts per row, or None without a policy (every row ``k``)."""
        return None if self.stop is None else self.size

    def draw(self, p: torch.Tensor, gen) -> torch.Tensor:
        if self.stop is None:
            return draw(p, gen)
        if isinstance(gen, RowGenerators) and not bool(self.going.all()):  # stopped rows keep their streams
            idx = torch.nonzero(self.going)[:, 0]
            t = torch.zeros(p.shape[0], dtype=torch.long, device=p.device)
            t[idx] = draw(p[idx], RowGenerators([gen[i] for i in idx.tolist()]))
        else:
            t = draw(p, gen)
        self.size += self.going.long()
        self.path = self.path * p.gather(1, t[:, None])[:, 0].double()
        return t

    def drawn(self) -> bool:
        if self.stop is None:
            return True
        if self.stop.signal == "path":
            self.going &= self.stop.continues(None, self.path)
        return bool(self.going.any())

    def next_law(self, p: torch.Tensor) -> bool:
        if self.stop is None:
            return True
        if self.stop.signal == "top":
            self.going &= self.stop.continues(p, self.path)
        return bool(self.going.any())


def tree_sizes(tree) -> tuple[int, ...]:
    """Nodes per grown level of ``tree`` (a ``core.tree.Tree``, or a parents tuple listed level by level:
    depth never decreases along the node order)."""
    return as_tree(tree, "parents").level_sizes()


def ranked_tokens(p: torch.Tensor, m: int) -> torch.Tensor:
    """The ``m`` most likely tokens of each law ``p`` (..., V) (entries >= 0), most likely first, ties to the
    lower id: exactly the first ``m`` indices of a stable descending sort of each row, found without sorting
    the vocabulary. When the ``m + 1`` largest values of every row are distinct, ``topk``'s order is the only
    one. Otherwise a law in float32 or narrower is read in float32 (exact), whose bits, as integers, order
    non-negative values as the floats do: the key ``bits * 2^32 - id`` is distinct per token, larger for the
    likelier token and, among equal ones, for the lower id, so one ``topk`` over the keys gives the order;
    float64 laws (and rows of 2^31 tokens or more) are sorted instead. Returns (..., m) int64."""
    V = p.shape[-1]
    if not 1 <= m <= V:
        raise ValueError(f"m must be in [1, V = {V}], got {m}")
    flat = p.reshape(-1, V)
    vals, idx = flat.topk(min(m + 1, V), dim=-1)  # largest first
    if bool((vals[:, 1:] < vals[:, :-1]).all()):  # no tie among them: the top m and their order are unique
        return idx[:, :m].reshape(*p.shape[:-1], m)
    if flat.dtype == torch.float64 or V >= 2 ** 31:
        return torch.sort(-flat, dim=-1, stable=True).indices[:, :m].reshape(*p.shape[:-1], m)
    bits = (flat.float() + 0.0).view(torch.int32).long()  # (R, V); + 0.0 turns -0.0 into +0.0
    key = (bits << 32) - torch.arange(V, device=p.device)  # a token's key: its value, then its id reversed
    return key.topk(m, dim=-1).indices.reshape(*p.shape[:-1], m)


def _best_paths(logpath: torch.Tensor, lo: int, hi: int, width: int) -> torch.Tensor:
    """The ``width`` nodes of ``lo .. hi - 1`` (one level) of highest path log-probability (``logpath``
    (B, N + 1), slot ``j + 1`` for node ``j``; ties to the lower node), in node order: (B, width) int64. A
    ``Grow`` level's parents, and the nodes a sparse read of the level before it reads."""
    order = torch.sort(-logpath[:, lo + 1:hi + 1], dim=-1, stable=True).indices
    return order[:, :width].sort(-1).values + lo


def _level_shape(d: int, level, sizes, lo: int, parents: torch.Tensor, logpath: torch.Tensor):
    """Parents of level ``d``'s nodes (written into ``parents[:, lo:hi]``), each node's rank among its
    siblings and its sibling group (the nodes of one group share a parent in every row)."""
    size = sizes[d]
    hi = lo + size
    if isinstance(level, Grow):  # the previous level's best paths grow ``children`` each, kept in node order
        if d == 0 or level.width * level.children != size:
            raise ValueError(f"tree: level {d} grows {level} but holds {size} nodes")
        best = _best_paths(logpath, lo - sizes[d - 1], lo, level.width)
        parents[:, lo:hi] = best.repeat_interleave(level.children, dim=1)
        return [j % level.children for j in range(size)], [j // level.children for j in range(size)]
    first = lo - sizes[d - 1] if d else -1  # a level's parents are the previous level's nodes (the root's)
    if len(level) != size or any(not first <= a < max(lo, 0) for a in level):
        raise ValueError(f"tree: level {d}'s parents {level} must be {size} nodes of the previous level")
    parents[:, lo:hi] = torch.tensor(level, dtype=torch.long, device=parents.device)
    seen: dict[int, int] = {}
    ranks = []
    for a in level:  # fixed parents, the same every row: a node's rank is its place among its siblings
        ranks.append(seen.get(a, 0))
        seen[a] = ranks[-1] + 1
    return ranks, list(level)


def _ranked_level(laws: torch.Tensor, slot: torch.Tensor, ranks: list[int], groups: list[int],
                  support) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic candidates of one level: node ``i`` is the ``ranks[i]``-th most likely token of its
    parent's law ``laws[:, slot[:, i]]`` (``laws`` (B, N + 1, S), ``slot`` (B, W)), ranked over the whole
    vocabulary; the nodes of one group share that law, read and ranked once. ``support = (ids, V)`` when
    the laws are over the ascending tokens ``ids`` only (``_ranked_on_support``). Returns the tokens (B, W)
    int64 and their probabilities (B, W)."""
    reps = list(dict.fromkeys(groups))  # the groups in order of first appearance
    first = [groups.index(g) for g in reps]
    rows = torch.arange(laws.shape[0], device=laws.device)[:, None]
    law = laws[rows, slot[:, first]]  # (B, G, S) one law per group
    m = max(ranks) + 1
    if m > (law.shape[-1] if support is None else support[1]):
        raise ValueError(f"a node has more than V = {law.shape[-1] if support is None else support[1]} "
                         f"deterministic children")
    if support is None:
        ranked = ranked_tokens(law, m)  # (B, G, m)
        probs = law.gather(2, ranked)
    else:
        ranked, probs = _ranked_on_support(law.reshape(-1, law.shape[-1]), m, *support)
        ranked, probs = ranked.view(*law.shape[:2], m), probs.view(*law.shape[:2], m)
    col = torch.tensor([reps.index(g) for g in groups], device=laws.device)
    rank = torch.tensor(ranks, device=laws.device)
    return ranked[:, col, rank], probs[:, col, rank]  # (B, W) tokens, their probabilities


def _ranked_on_support(flat: torch.Tensor, m: int, ids: torch.Tensor, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``ranked_tokens`` of laws given on the ascending tokens ``ids`` (S,) only (0 elsewhere in the vocabulary
    of ``V``), without writing them into the vocabulary: ``flat`` (R, S). A law's ``c`` tokens of positive
    probability come first, in the order of a stable sort on ``ids`` (ascending ids keep ties in id order);
    when ``c < m`` the rest are the lowest vocabulary ids of probability 0, which lie among ids
    ``0 .. 2m - 1`` (at most ``c < m`` of those are positive). Returns the tokens (R, m) int64 and their
    probabilities (R, m)."""
    R, S = flat.shape
    k = min(m, S)
    top = ranked_tokens(flat, k)  # (R, k): the positives first, in rank order
    if k == m:
        probs = flat.gather(1, top)
        if bool((probs[:, -1] > 0).all()):  # every row has m positive tokens: no zero is ranked
            return ids[top], probs
    c = (flat > 0).sum(-1, keepdim=True)  # (R, 1)
    if k < m:
        top = torch.cat([top, top.new_zeros((R, m - k))], 1)
    window = torch.arange(min(2 * m, V), device=flat.device)
    at = torch.searchsorted(ids, window).clamp(max=S - 1)
    inside = ids[at] == window  # the window's ids that are in the support
    pw = torch.where(inside, flat[:, at], flat.new_zeros(()))  # (R, |window|) their probabilities
    zeros = torch.where(pw == 0, window, V).sort(-1).values[:, :m]  # the lowest ids of probability 0
    j = torch.arange(m, device=flat.device)
    ranked = torch.where(j < c, ids[top], zeros.gather(1, (j - c).clamp(min=0)))
    probs = torch.where(j < c, flat.gather(1, top), flat.new_zeros(()))
    return ranked, probs


def _drawn_level(P, slot, removed, gen) -> torch.Tensor:
    """Random candidates of one level, node by node in node order (one float64 uniform per row and node
    from ``gen``): i.i.d. from the parent's law ``P[:, i]`` (B, W, V), or without the earlier siblings
    (``removed`` (B, N + 1, V) per parent slot ``slot`` (B, W))."""
    B, W, _ = P.shape
    rows = torch.arange(B, device=P.device)
    out = []
    for i in range(W):
        p = P[:, i]
        src = p if removed is None else without(p, removed[rows, slot[:, i]])
        src = torch.where(src.sum(-1, keepdim=True) > 0, src, p)  # support exhausted: placeholder
        x = sample_rows(src, uniforms(gen, B, 1, P.device)[:, 0])
        if removed is not None:
            removed[rows, slot[:, i], x] = True
        out.append(x)
    return torch.stack(out, 1)


def grow_tree(p0: torch.Tensor, read_level, tree, scheme: str, gen, support: tuple | None = None,
              sparse: bool = False, out: torch.Tensor | None = None):
    """Draw a draft tree after each row (both drafters' ``propose_tree``).

    ``p0`` (B, V) the draft law at the root; ``read_level(tokens, parents, lo)`` reads nodes
    ``lo .. lo + W - 1`` (``tokens`` (B, W), ``parents`` (B, lo + W)) and returns the draft law after each
    (B, W, V); ``tree`` a ``core.tree.Tree`` (or a static parents tuple, listed level by level), grown
    level by level as its ``levels()`` say: a level's fixed parents, or a ``Grow(width, children)`` (the
    ``width`` nodes of highest path probability of the previous level grow ``children`` each, ties to
    the lower node index). A node's children are drawn from the law ``p`` at the node per ``scheme``:
    ``"iid"`` i.i.d. from ``p``; ``"without_replacement"`` from ``p`` without the earlier siblings,
    renormalised (once ``p``'s support is exhausted a placeholder ``x ~ p`` is stored, which
    ``verify_tree`` skips); ``"deterministic"`` / ``"eagle"`` the ``rank``-th most likely token (ties to the
    lower id; ``ranked_tokens``, once per parent and level, batched). Each random node takes one float64
    uniform per row from ``gen`` (inverse CDF, ``sampler.sample_rows``), in node order. Every level but the
    last is read (one call per level).

    A tree that ``reranks`` (``core.tree.BudgetTree``) is then cut (``core.tree.rerank``): its ``nodes``
    nodes of highest path probability remain, renumbered in grown order.

    Returns ``tokens`` (B, N) int64, ``parents`` (B, N) int64, ``draft_probs`` (B, N, V) (``p`` at each
    node's parent, as ``verify_tree`` reads them), ``read`` (B, N) bool (the nodes read) and ``nodes``
    (B, N) int64 (each node's index in the grown tree: where a drafter's tree forward wrote it); N the
    nodes verified.

    ``support = (ids, V)``: the laws ``p0`` and ``read_level``'s are over the tokens ``ids`` (S,) int64,
    ascending, only (0 elsewhere in the vocabulary of ``V``; the feature draft's shortlist); the tree is
    grown in that space and only what ranking and ``draft_probs`` need is written over the vocabulary:
    the same tree and laws, less memory traffic. Deterministic schemes only. ``out`` (B, N, V), 0 outside
    ``ids``: ``draft_probs`` are written into it (``draft.spread``) and it is returned, instead of a fresh
    (B, N, V) tensor whose first touch, a few MB each step, costs page faults.

    ``sparse``: a level followed by a ``Grow`` level is read only at the nodes that level expands (its
    ``width`` best paths): ``read_level(tokens, parents, lo, nodes)`` gets those nodes' tokens (B, w) and their
    indices ``nodes`` (B, w) int64 in the grown tree, and returns the laws after them (B, w, S). Nothing else
    reads the other nodes' laws, and a read node attends to its ancestors only, so the tree and its laws are
    those of a full read."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    tree = as_tree(tree)
    levels = tree.levels()
    sizes = tree.level_sizes()
    N = sum(sizes)
    (B, S), dev = p0.shape, p0.device
    if support is None:
        V = S
        if out is not None:
            raise ValueError("out: a buffer for laws on a shortlist (support), got support None")

        def full(law):
            return law
    else:
        if scheme not in ("deterministic", "eagle"):
            raise ValueError(f"support: a law on a subset of the vocabulary grows deterministic trees only, got "
                             f"scheme {scheme!r}")
        ids, V = support

        def full(law):  # (..., S) -> (..., V), 0 outside ``ids``
            return spread(law, ids, V, out=out)
    rows = torch.arange(B, device=dev)[:, None]
    laws = p0.new_empty((B, N + 1, S))  # slot 0: the root, slot j + 1: after node j (slots of read nodes only)
    laws[:, 0] = p0
    tokens = torch.full((B, N), -1, dtype=torch.long, device=dev)
    parents = torch.full((B, N), -1, dtype=torch.long, device=dev)
    logpath = torch.zeros((B, N + 1), dtype=torch.float64, device=dev)
    removed = torch.zeros((B, N + 1, V), dtype=torch.bool, device=dev) if scheme == "without_replacement" else None
    read = torch.zeros((B, N), dtype=torch.bool, device=dev)
    lo = 0
    for d, level in enumerate(levels):
        hi = lo + sizes[d]
        ranks, groups = _level_shape(d, level, sizes, lo, parents, logpath)
        slot = parents[:, lo:hi] + 1  # (B, W) each node's parent slot
        if scheme in ("deterministic", "eagle"):
            x, px = _ranked_level(laws, slot, ranks, groups, support)
        else:
            P = laws[rows, slot]  # (B, W, S) each node's parent law (whole rows copied, no per-entry index)
            x = _drawn_level(P, slot, removed, gen)
            px = P.gather(2, x[:, :, None])[:, :, 0]
        tokens[:, lo:hi] = x
        logpath[:, lo + 1:hi + 1] = logpath.gather(1, slot) + px.double().log()
        if d + 1 < len(sizes):  # speculative read: nothing becomes final
            nxt = levels[d + 1]
            if sparse and isinstance(nxt, Grow):  # only the nodes the next level expands (``_level_shape``'s choice)
                which = _best_paths(logpath, lo, hi, nxt.width)  # (B, w)
                laws[rows, which + 1] = read_level(tokens.gather(1, which), parents[:, :hi], lo, which)
                read[rows, which] = True
            else:
                laws[:, lo + 1:hi + 1] = read_level(tokens[:, lo:hi], parents[:, :hi], lo)
                read[:, lo:hi] = True
        lo = hi
    nodes = torch.arange(N, device=dev).expand(B, N)
    slots = parents + 1  # each grown node's parent slot, before any renumbering
    if tree.reranks and tree.nodes < N:  # EAGLE-2's re-ranking: the most probable paths
        nodes, parents = rerank(logpath[:, 1:], parents, tree.nodes)
        tokens, read, slots = tokens.gather(1, nodes), read.gather(1, nodes), slots.gather(1, nodes)
    probs = full(laws[rows, slots])  # (B, N, V) p at each kept node's parent
    return tokens, parents, probs, read, nodes


class TokenDrafter:
    """A causal LM as the draft: it reads tokens only. Pending tokens are those emitted but not yet
    read (one or two per row: the last accepted draft is never read when all ``k`` are kept)."""

    needs_features = False  # reads tokens only
    feature_layers: tuple[int, ...] = ()

    def __init__(self, model, batch: int, capacity: int, device):
        self.s = open_stream(model, batch, capacity, device)
        self.ids = None  # (B, W) pending block
        self.n = None  # (B,) pending count per row

    def start(self, ids, lens, first, feats=None):
        self.ids = torch.cat([ids, ids[:, :1]], 1)  # room for the first token after each prompt
        self.ids[torch.arange(ids.shape[0], device=ids.device), lens] = first
        self.n = lens + 1

    def _read(self, block: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """Read a ragged block (row ``b`` has ``n[b]`` real tokens); returns each row's last logits (B, V)."""
        logits, _ = self.s.forward(block, n, logits_at=n - 1)
        self.s.keep(n)
        return logits[:, 0]

    def propose(self, k: int, sampling, gen, stop: DraftStop | None = None):
        """Draft up to ``k`` tokens per row: returns drafts (B, J) int64, their laws (B, J, V) and each row's
        drafts (B,) int64 (None without ``stop``: every row ``J = k``). ``stop`` (``core.draft_stop``) ends a
        row's block early; the block ends when every row has stopped (``J`` the longest row; a row's
        positions past its length are padding). ``forwards``: the draft forwards it took."""
        toks, laws = [], []
        block = _Stopping(stop, self.n.shape[0], self.n.device)
        logits, p = self._read(self.ids, self.n), None
        self.forwards, self._reads = 1, 0
        for j in range(k):
            if stop is None:
                t, p = _sample(logits, sampling, gen)
            else:
                p = sampling_probs(logits, *sampling) if p is None else p
                t = block.draw(p, gen)
            toks.append(t)
            laws.append(p)
            if j == k - 1 or not block.drawn():
                break
            # speculative reads: not final until the verifier keeps them
            logits, p = self._read(t[:, None], torch.ones_like(self.n)), None
            self.forwards, self._reads = self.forwards + 1, self._reads + 1
            if stop is not None and stop.signal == "top":
                p = sampling_probs(logits, *sampling)
                if not block.next_law(p):
                    break
        return torch.stack(toks, 1), torch.stack(laws, 1), block.lengths

    def propose_tree(self, tree, scheme: str, sampling, gen):
        """Draft ``tree`` (see ``grow_tree``) after each row: one forward reads the pending tokens, then
        one tree forward (``Llama.forward_tree``) per level that has a next level. Returns ``tokens``
        (B, N) int64, ``parents`` (B, N) int64 and ``draft_probs`` (B, N, V) float32."""
        p0 = sampling_probs(self._read(self.ids, self.n), *sampling)  # p at the root

        def read_level(tok, par, lo):
            return sampling_probs(self.s.forward_tree(tok, par, lo)[0], *sampling)

        tokens, parents, probs, self._read_nodes, self._grown = grow_tree(p0, read_level, tree, scheme, gen)
        return tokens, parents, probs

    def advance_tree(self, a: torch.Tensor, path: torch.Tensor, tokens: torch.Tensor, feats=None) -> None:
        """``a`` (B,) nodes kept along ``path`` (B, N) (``verify_tree``'s ``accepted_nodes``); ``tokens``
        (B, N + 1) from ``verify_tree``: the path's tokens then the new token. The path's nodes the
        draft read stay in its cache; an accepted node it never read (on the last level) is pending
        with the new token."""
        B = a.shape[0]
        rows = torch.arange(B, device=a.device)
        lastnode = path[rows, (a - 1).clamp_min(0)].clamp_min(0)
        unread = (a > 0) & ~self._read_nodes[rows, lastnode]
        self.s.keep_path(self._grown.gather(1, path.clamp_min(0)), a - unread.long())  # slots of the grown tree
        self.ids = torch.stack([torch.where(unread, tokens[rows, (a - 1).clamp_min(0)], tokens[rows, a]),
                                tokens[rows, a]], 1)
        self.n = 1 + unread.long()

    def advance(self, a: torch.Tensor, tokens: torch.Tensor, feats=None) -> None:
        """``a`` (B,) drafts kept; ``tokens`` (B, J + 1) from ``verify``: kept drafts then the new token."""
        R = self._reads  # drafts 1..R were read speculatively (R = k - 1 with a fixed k); those kept stay
        read = torch.clamp(a, max=R)
        self.s.rewind(R - read)  # the R drafts read one by one: forget those the verifier rejected
        B = tokens.shape[0]
        rows = torch.arange(B, device=tokens.device)
        unread = a > R
        # pending: [d_a, t] when the last kept draft was never read (all k kept), else [t]
        self.ids = torch.stack([torch.where(unread, tokens[rows, (a - 1).clamp_min(0)], tokens[rows, a]),
                                tokens[rows, a]], 1)
        self.n = 1 + unread.long()

    def select(self, idx):
        self.s.select(idx)
        self.ids, self.n = self.ids[idx], self.n[idx]
        if getattr(self, "_read_nodes", None) is not None:
            self._read_nodes, self._grown = self._read_nodes[idx], self._grown[idx]


class FeatureDrafter:
    """The EAGLE-3-style head as the draft: each entry reads a verifier feature and the next token.
    Pending entries (fused features and their next tokens) are those whose features the verifier
    produced since the last proposal."""

    needs_features = True  # reads the verifier's features at ``feature_layers``

    def __init__(self, head: FeatureDraft, batch: int, capacity: int, device):
        self.head = head
        self.feature_layers = tuple(head.args.aux_layers)
        self.cache = head.new_cache(batch, capacity, device)
        self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self.feat = self.ids = self.n = None
        self._tree_laws = None  # (B, N, V) float32 draft laws of a deterministic tree, 0 off the shortlist

    def start(self, ids, lens, first, feats):
        self.advance_block(self.head.fuse(feats), torch.cat([ids[:, 1:], ids[:, :1]], 1), lens, first)

    def advance_block(self, feat, next_ids, n, last):
        rows = torch.arange(feat.shape[0], device=feat.device)
        next_ids = next_ids.clone()
        next_ids[rows, n - 1] = last  # the entry at the last fed position reads the new token
        self.feat, self.ids, self.n = feat, next_ids, n

    def _step(self, feat, ids, start):
        W = ids.shape[1]
        slots = start[:, None] + torch.arange(W, device=ids.device)[None]
        used = min(int(slots.max()) + 1, self.cache.capacity)
        return self.head.step(feat, ids, self.cache, slots, used)

    def propose(self, k: int, sampling, gen, stop: DraftStop | None = None):
        """As ``TokenDrafter.propose``: drafts (B, J), their laws (B, J, V) over the full vocabulary, each
        row's drafts (B,) or None without ``stop``."""
        rows = torch.arange(self.ids.shape[0], device=self.ids.device)
        g = self._step(self.feat, self.ids, self.length)[rows, self.n - 1][:, None]  # (B, 1, dim)
        self.length = self.length + self.n
        self.forwards = 1
        toks, laws = [], []
        d2t, V = self.head.d2t, self.head.args.vocab
        block = _Stopping(stop, rows.shape[0], rows.device)
        # each law on the shortlist (``_short_law``), written into the full vocabulary for verify
        p_s = self._short_law(g[:, 0], sampling)
        for j in range(k):
            t = d2t[block.draw(p_s, gen)]
            toks.append(t)
            laws.append(spread(p_s, d2t, V))
            if j == k - 1 or not block.drawn():
                break
            g = self._step(g, t[:, None], self.length + j)
            self.forwards += 1
            p_s = self._short_law(g[:, 0], sampling)
            if not block.next_law(p_s):
                break
        return torch.stack(toks, 1), torch.stack(laws, 1), block.lengths

    def _short_law(self, g: torch.Tensor, sampling) -> torch.Tensor:
        """The head's transformed law on its shortlist (..., S) from its outputs ``g`` (..., dim): the transforms
        on the shortlist equal those on the full row (-inf outside it)."""
        return sampling_probs(self.head.logits(g), *sampling)

    def _law(self, g: torch.Tensor, sampling) -> torch.Tensor:
        """``_short_law`` written into the vocabulary (..., V), 0 outside the shortlist."""
        return spread(self._short_law(g, sampling), self.head.d2t, self.head.args.vocab)

    def propose_tree(self, tree, scheme: str, sampling, gen):
        """Draft ``tree`` (see ``grow_tree``) with the head: the pending entries are read (and stay),
        then each level's nodes read their parent's output and their own token in one tree step
        (``FeatureDraft.tree_step``), written after the final entries (scratch: the next pending entries
        come from the verifier's features). Returns ``tokens`` (B, N) int64, ``parents`` (B, N) int64,
        ``draft_probs`` (B, N, V) float32. A deterministic tree's ``draft_probs`` live in the drafter's own
        buffer, overwritten by its next ``propose_tree``: copy them to keep them past the step."""
        rows = torch.arange(self.ids.shape[0], device=self.ids.device)
        g0 = self._step(self.feat, self.ids, self.length)[rows, self.n - 1]  # (B, dim)
        self.length = self.length + self.n
        N = sum(tree_sizes(tree))
        G = g0.new_zeros((g0.shape[0], N + 1, g0.shape[-1]))  # the head's output at the root and each node
        G[:, 0] = g0

        def read_level(tok, par, lo, nodes=None):  # nodes (B, w): a sparse read (grow_tree's ``sparse``)
            W = tok.shape[1]
            up = par[:, lo:] if nodes is None else par.gather(1, nodes)  # (B, W) each read node's parent
            feat = G.gather(1, (up + 1)[:, :, None].expand(-1, -1, G.shape[-1]))
            g = self.head.tree_step(feat, tok, self.cache, self.length, par, lo, nodes)
            if nodes is None:
                G[:, lo + 1:lo + W + 1] = g
            else:
                G[rows[:, None], nodes + 1] = g
            return law(g)

        if scheme in ("deterministic", "eagle"):  # grown over the shortlist, written into the vocabulary at the end
            def law(g):
                return self._short_law(g, sampling)

            support = (self.head.d2t, self.head.args.vocab)
            out = self._laws_buffer(g0.shape[0], as_tree(tree).nodes)
        else:
            def law(g):
                return self._law(g, sampling)

            support = out = None
        tokens, parents, probs, _, _ = grow_tree(law(g0), read_level, tree, scheme, gen, support, sparse=True,
                                                 out=out)
        return tokens, parents, probs

    def _laws_buffer(self, B: int, N: int) -> torch.Tensor:
        """The (B, N, V) float32 buffer a deterministic tree's laws are written into, 0 off the shortlist
        (only shortlist columns are ever written), allocated once per tree size; the first ``B`` rows of it
        once rows have finished."""
        buf, V = self._tree_laws, self.head.args.vocab
        if buf is None or buf.shape[0] < B or buf.shape[1] != N:
            buf = self._tree_laws = torch.zeros((B, N, V), dtype=torch.float32, device=self.length.device)
        return buf[:B]

    def advance_tree(self, a: torch.Tensor, path: torch.Tensor, tokens: torch.Tensor, feats) -> None:
        """As ``advance`` along the accepted path: the verifier's features (list of (B, N + 1, dim) from
        ``Target.score_tree``) at the pending token and at the ``a`` accepted nodes ``path[b, :a[b]]``."""
        B = tokens.shape[0]
        rows = torch.arange(B, device=tokens.device)
        f = self.head.fuse(feats)  # (B, N + 1, dim)
        cols = torch.cat([torch.zeros((B, 1), dtype=torch.long, device=path.device),
                          torch.where(path >= 0, path + 1, 0)], 1)
        f = f.gather(1, cols[:, :, None].expand(-1, -1, f.shape[-1]))
        self.advance_block(f, tokens.clamp_min(0), a + 1, tokens[rows, a])

    def advance(self, a: torch.Tensor, tokens: torch.Tensor, feats) -> None:
        """The verifier's features at its scored positions (list of (B, k + 1, dim)) become the next
        pending entries: features at the pending token and the ``a`` kept drafts, each paired with
        the token after it (the kept drafts, then the new token)."""
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        self.advance_block(self.head.fuse(feats), tokens.clamp_min(0), a + 1, tokens[rows, a])

    def select(self, idx):
        self.cache.select(idx)
        self.length = self.length[idx]
        self.feat, self.ids, self.n = self.feat[idx], self.ids[idx], self.n[idx]


def make_drafter(model, batch: int, capacity: int, device):
    """The drafter adapter a draft model asks for: ``FeatureDrafter`` for a model that declares
    ``needs_features`` (the EAGLE-3-style head), ``TokenDrafter`` for a causal LM."""
    if getattr(model, "needs_features", False):
        return FeatureDrafter(model, batch, capacity, device)
    return TokenDrafter(model, batch, capacity, device)
