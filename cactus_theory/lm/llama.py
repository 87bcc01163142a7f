"""A compact Llama for decoding (in the spirit of gpt-fast's ``model.py``): fused projections and a
static KV cache written at per-row offsets, so rows of a batch that accepted different numbers of
drafts stay in one tensor with no masked-out slots piling up.

``Llama.from_hf(model)`` copies the weights of a Hugging Face ``LlamaForCausalLM`` (default RoPE, no
biases; e.g. SmolLM2) and computes the same function (tested against transformers to float
tolerance). Decoding calls ``forward(ids, start, cache)``: block ``ids`` (B, W) is written at cache
slots ``start[b] .. start[b] + W - 1`` of row ``b`` (its positions too) and attends to every slot
before its own. Slots at or past a row's length hold stale entries (rejected drafts, padding);
they are never attended, because a query only sees slots up to its own, and they are overwritten
by the next block written there. The caller keeps each row's length.

Trees: ``forward_tree(ids, parents, start, cache, lo)`` scores nodes ``lo .. lo + W - 1`` of a tree
drafted after each row's ``start[b]`` final tokens: node ``j`` is written at slot ``start[b] + j``, sits
at position ``start[b] + depth(j)`` (``depth = 0`` for a node whose parent is ``-1``) and attends to
the final slots and to its own ancestors (itself included) only, so siblings never see each other.
``KVCache.keep_path(start, nodes)`` then moves the kept nodes' keys and values into consecutive
slots after ``start`` (their positions are already those of consecutive tokens), so the next block
is written after them as after any kept chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["LlamaArgs", "Llama", "KVCache", "RMSNorm", "Attention", "MLP", "Block", "rope_tables", "rotate",
           "attend", "supports_hf", "hf_args", "HFParts", "hf_parts", "tree_ancestry", "node_ancestors", "tree_block_inputs",
           "tree_node_inputs"]


@dataclass(frozen=True)
class LlamaArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int  # MLP intermediate size
    vocab: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_positions: int = 8192
    tie_embeddings: bool = True


def supports_hf(model: nn.Module) -> str | None:
    """``None`` if ``model`` is a Hugging Face Llama this module reproduces, else the reason it is not."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "llama":
        return f"not a Llama model (model_type {getattr(cfg, 'model_type', None)!r})"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"RoPE type {rope.get('rope_type')!r} is not implemented here"
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "attention / MLP biases are not implemented here"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r} is not implemented here"
    return None


def hf_args(cfg) -> LlamaArgs:
    """The ``LlamaArgs`` of a Hugging Face Llama config."""
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    return LlamaArgs(dim=cfg.hidden_size, n_layers=cfg.num_hidden_layers, n_heads=cfg.num_attention_heads,
                     n_kv_heads=cfg.num_key_value_heads,
                     head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
                     hidden=cfg.intermediate_size, vocab=cfg.vocab_size, norm_eps=cfg.rms_norm_eps,
                     rope_theta=float(theta), max_positions=cfg.max_position_embeddings,
                     tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)))


@dataclass(frozen=True)
class HFParts:
    """What a draft built for a Hugging Face Llama reads of it (``hf_parts``): its depth, its input
    embedding (shared with the draft), and the tensors the draft's output map starts from."""

    n_layers: int  # decoder layers
    embed: nn.Embedding  # the input embedding module
    norm: torch.Tensor  # the final RMSNorm's weight (dim,)
    output: torch.Tensor  # the output embedding (LM head) weight (vocab, dim); the input embedding's if tied


def hf_parts(model: nn.Module) -> HFParts:
    """The parts of a Hugging Face Llama (``LlamaForCausalLM`` layout) that ``lm.train.draft_build`` reads,
    the model's own tensors (not copies, in its own dtype); a model this module does not reproduce
    (``supports_hf``) is refused with a ``ValueError`` naming the reason."""
    why = supports_hf(model)
    if why:
        raise ValueError(f"{type(model).__name__} is not a Hugging Face Llama the project's draft can be built for: "
                         f"{why}")
    return HFParts(n_layers=int(model.config.num_hidden_layers), embed=model.get_input_embeddings(),
                   norm=model.model.norm.weight, output=model.get_output_embeddings().weight)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * w``, computed in float32 (as transformers does)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(head_dim: int, theta: float, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables (n, head_dim) in float32 for positions 0..n-1 (the rotate-half layout)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    f = torch.arange(n, dtype=torch.float32)[:, None] * inv[None]
    emb = torch.cat([f, f], -1)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate-half layout) on ``x`` (B, H, W, hd) with ``cos`` / ``sin`` broadcastable to it
    ((B, 1, W, hd) at per-row positions, or (1, 1, W, hd))."""
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked softmax attention with scale ``1 / sqrt(hd)``: ``q`` (B, H, W, hd) against keys ``k`` and
    values ``v`` (B, Hk, T, hd), ``H`` a multiple of ``Hk`` (query head ``h`` reads key / value head
    ``h // (H // Hk)``); ``mask`` (B or 1, 1, W, T) bool, True where query ``i`` may read key ``t``
    (every query must see at least one key). Returns (B, H, W, hd).

    On CPU, bfloat16 inputs are attended in float32 and the result cast back: there the float32 kernel
    is the faster (timings: docs/decoding.md) and the more accurate of the two."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu":
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                              enable_gqa=q.shape[1] != k.shape[1]).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


class KVCache:
    """Keys and values of every layer: (B, n_kv_heads, capacity, head_dim) each, preallocated."""

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device):
        shape = (batch, n_kv_heads, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.capacity = capacity

    def keep_path(self, start: torch.Tensor, nodes: torch.Tensor) -> None:
        """Move the entries of tree nodes ``nodes`` (B, M) int64 (slots ``start[b] + nodes[b, i]``; ``-1``
        pads a row's tail) to slots ``start[b] + i``: a tree's kept path becomes consecutive. All
        entries are read before any is written."""
        B, M = nodes.shape
        if M == 0:
            return
        dst = start[:, None] + torch.arange(M, device=nodes.device)[None]
        src = torch.where(nodes >= 0, start[:, None] + nodes, dst)
        H, hd = self.k[0].shape[1], self.k[0].shape[3]
        si = src[:, None, :, None].expand(B, H, M, hd)
        di = dst[:, None, :, None].expand(B, H, M, hd)
        for t in self.k + self.v:
            t.scatter_(2, di, t.gather(2, si))

    def select(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx`` (finished rows leave the batch)."""
        self.k = [t.index_select(0, idx) for t in self.k]
        self.v = [t.index_select(0, idx) for t in self.v]


class Attention(nn.Module):
    """Grouped-query attention with fused ``wqkv``; ``in_dim`` may differ from ``n_heads * head_dim``
    (the EAGLE-3 draft layer reads a concatenation of two vectors)."""

    def __init__(self, in_dim: int, dim: int, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.wqkv = nn.Linear(in_dim, (n_heads + 2 * n_kv_heads) * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x (B, W, in_dim) -> rotated queries (B, H, W, hd), rotated keys and values (B, Hk, W, hd)."""
        B, W, _ = x.shape
        hd, H, Hk = self.head_dim, self.n_heads, self.n_kv_heads
        q, k, v = self.wqkv(x).split([H * hd, Hk * hd, Hk * hd], dim=-1)
        q = rotate(q.view(B, W, H, hd).transpose(1, 2), cos, sin)
        k = rotate(k.view(B, W, Hk, hd).transpose(1, 2), cos, sin)
        return q, k, v.view(B, W, Hk, hd).transpose(1, 2)

    def output(self, y: torch.Tensor) -> torch.Tensor:
        """Attention result (B, H, W, hd) -> (B, W, dim)."""
        B, H, W, hd = y.shape
        return self.wo(y.transpose(1, 2).reshape(B, W, H * hd))

    def forward(self, x, cos, sin, k_cache, v_cache, slots, mask):
        """x (B, W, in_dim); cos / sin (B, 1, W, hd); caches (B, Hkv, T, hd) written at ``slots`` (B, W);
        ``mask`` (B, 1, W, T') True where a query may attend (T' <= T: only the slots in use)."""
        q, k, v = self.project(x, cos, sin)
        B, Hk, W, hd = k.shape
        idx = slots[:, None, :, None].expand(B, Hk, W, hd)
        k_cache.scatter_(2, idx, k.to(k_cache.dtype))
        v_cache.scatter_(2, idx, v.to(v_cache.dtype))
        T = mask.shape[-1]
        return self.output(attend(q, k_cache[:, :, :T], v_cache[:, :, :T], mask))


class MLP(nn.Module):
    """SwiGLU with fused gate / up projection: ``w2(silu(x W1) * x W3)``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        a, b = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(a) * b)


class Block(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.attn_norm = RMSNorm(a.dim, a.norm_eps)
        self.attn = Attention(a.dim, a.dim, a.n_heads, a.n_kv_heads, a.head_dim)
        self.mlp_norm = RMSNorm(a.dim, a.norm_eps)
        self.mlp = MLP(a.dim, a.hidden)

    def forward(self, x, cos, sin, k_cache, v_cache, slots, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, k_cache, v_cache, slots, mask)
        return x + self.mlp(self.mlp_norm(x))


def block_inputs(slots: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor, used: int):
    """cos / sin (B, 1, W, hd) at positions ``slots`` (B, W) and the attention mask (B, 1, W, used):
    query ``i`` of row ``b`` sees cache slots ``<= slots[b, i]``."""
    cos, sin = cos_t[slots].unsqueeze(1), sin_t[slots].unsqueeze(1)
    keys = torch.arange(used, device=slots.device)
    mask = (keys[None, None, :] <= slots[:, :, None]).unsqueeze(1)
    return cos, sin, mask


def tree_ancestry(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``parents`` (B, M) int64, topological (``-1 <= parents[b, j] < j``) -> ``anc`` (B, M, M) bool,
    ``anc[b, j, i]`` True iff node ``i`` is node ``j`` or one of its ancestors, and ``depth`` (B, M)
    int64 (0 for a node whose parent is -1)."""
    B, M = parents.shape
    dev = parents.device
    j = torch.arange(M, device=dev)
    if bool(((parents < -1) | (parents >= j[None])).any()):
        raise ValueError(f"parents must be topological (-1 <= parents[b, j] < j), got {parents.tolist()}")
    # reachability by squaring: anc holds paths of up to 2^s steps after s squarings (M - 1 steps suffice)
    has = parents >= 0
    anc = torch.eye(M, dtype=torch.float32, device=dev).repeat(B, 1, 1)
    anc[torch.arange(B, device=dev)[:, None].expand(B, M)[has], j.expand(B, M)[has], parents[has]] = 1.0
    for _ in range(max(0, M - 2).bit_length()):
        anc = torch.bmm(anc, anc).clamp_max_(1.0)  # 0 / 1 entries: the product counts paths, exactly
    anc = anc > 0
    depth = anc.sum(-1) - 1  # a node's ancestors, itself excluded
    return anc, depth


def node_ancestors(parents: torch.Tensor, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``tree_ancestry`` of some nodes only: ``parents`` (B, M) int64, topological, and ``nodes`` (B, W) int64
    -> ``own`` (B, W, M) bool (``own[b, w] = anc[b, nodes[b, w]]``: the node and its ancestors) and ``depth``
    (B, W) int64, found by walking up from the nodes, one ``gather`` per level (a tree's depth, not its size)."""
    B, M = parents.shape
    j = torch.arange(M, device=parents.device)
    if bool(((parents < -1) | (parents >= j[None])).any()):
        raise ValueError(f"parents must be topological (-1 <= parents[b, j] < j), got {parents.tolist()}")
    path = [nodes]  # the nodes, then their parents, grandparents, ... (-1 past the root)
    while True:
        up = path[-1]
        nxt = torch.where(up >= 0, parents.gather(1, up.clamp_min(0)), -1)
        if not bool((nxt >= 0).any()):
            break
        path.append(nxt)
    path = torch.stack(path, -1)  # (B, W, D + 1)
    own = (path[..., None] == j).any(-2)  # (B, W, M)
    return own, (path >= 0).sum(-1) - 1


def tree_block_inputs(parents: torch.Tensor, start: torch.Tensor, lo: int, cos_t: torch.Tensor, sin_t: torch.Tensor,
                      capacity: int):
    """Inputs of a tree block, nodes ``lo .. M - 1`` of the tree ``parents`` (B, M): their ``slots``
    (B, W) = ``start + j``, cos / sin (B, 1, W, hd) at positions ``start + depth(j)`` and the mask
    (B, 1, W, used): the final slots ``< start`` and the node's ancestors and itself (``tree_node_inputs``
    of those nodes)."""
    B, M = parents.shape
    nodes = torch.arange(lo, M, device=parents.device).expand(B, M - lo)
    return tree_node_inputs(parents, start, nodes, cos_t, sin_t, capacity)


def tree_node_inputs(parents: torch.Tensor, start: torch.Tensor, nodes: torch.Tensor, cos_t: torch.Tensor,
                     sin_t: torch.Tensor, capacity: int):
    """Inputs of any nodes of the tree ``parents`` (B, M): ``nodes`` (B, W) int64, each row its own (a drafter
    reads only the nodes a level will expand). Their ``slots`` (B, W) = ``start + nodes``, cos / sin
    (B, 1, W, hd) at positions ``start + depth(node)`` and the mask (B, 1, W, used): the final slots
    ``< start`` and the node's ancestors and itself."""
    B, M = parents.shape
    W = nodes.shape[1]
    dev = parents.device
    own, depth = node_ancestors(parents, nodes)  # (B, W, M) each node's ancestors and itself, (B, W)
    slots = start[:, None] + nodes
    pos = start[:, None] + depth
    used = min(int(slots.max()) + 1, capacity)
    if int(pos.max()) >= cos_t.shape[0]:
        raise ValueError(f"tree positions reach {int(pos.max())}, past the model's {cos_t.shape[0]} positions")
    cos, sin = cos_t[pos].unsqueeze(1), sin_t[pos].unsqueeze(1)
    rel = torch.arange(used, device=dev)[None] - start[:, None]  # (B, used): key slot - start
    inside = (rel >= 0) & (rel < M)
    seen = own.gather(2, rel.clamp(0, M - 1)[:, None, :].expand(B, W, used))  # (B, W, used)
    mask = ((rel < 0)[:, None, :] | (seen & inside[:, None, :])).unsqueeze(1)
    return slots, cos, sin, mask


class Llama(nn.Module):
    """Decoder-only Llama: ``forward(ids, start, cache)`` -> logits (B, W, V) (and the residual stream
    entering the layers in ``aux_layers``, for feature-level drafts)."""

    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.args = a
        self.embed = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleList([Block(a) for _ in range(a.n_layers)])
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.head = nn.Linear(a.dim, a.vocab, bias=False)
        if a.tie_embeddings:
            self.head.weight = self.embed.weight
        cos, sin = rope_tables(a.head_dim, a.rope_theta, a.max_positions)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        if capacity > self.args.max_positions:
            raise ValueError(f"capacity {capacity} exceeds the model's {self.args.max_positions} positions")
        a = self.args
        return KVCache(a.n_layers, batch, a.n_kv_heads, capacity, a.head_dim, self.dtype, self.device)

    def forward(self, ids: torch.Tensor, start: torch.Tensor, cache: KVCache, aux_layers: tuple[int, ...] = (),
                logits_at: torch.Tensor | None = None):
        """ids (B, W) int64 written at slots ``start[b] + 0..W-1``; returns logits (B, W, V) float32
        (or (B, 1, V) at column ``logits_at[b]`` of each row, skipping the LM head elsewhere) and a
        list of (B, W, dim) residual-stream tensors, one per ``aux_layers`` index (the input of that
        layer, as vLLM's EAGLE-3 reads it)."""
        B, W = ids.shape
        slots = start[:, None] + torch.arange(W, device=ids.device)[None]
        used = min(int(slots.max()) + 1, cache.capacity)
        cos, sin, mask = block_inputs(slots, self.cos, self.sin, used)
        return self._layers(ids, slots, cos, sin, mask, cache, aux_layers, logits_at)

    def forward_tree(self, ids: torch.Tensor, parents: torch.Tensor, start: torch.Tensor, cache: KVCache,
                     lo: int = 0, aux_layers: tuple[int, ...] = (), logits_at: torch.Tensor | None = None):
        """Score nodes ``lo .. lo + W - 1`` of a tree in one forward (see the module docstring).

        ``ids`` (B, W) int64 the nodes' tokens; ``parents`` (B, M) int64 with ``M >= lo + W``, each
        node's parent node (``-1``: a child of the final prefix), topological; ``start`` (B,) int64 the
        final tokens per row. Node ``j`` is written at slot ``start[b] + j`` and placed at position
        ``start[b] + depth(j)``; it attends to slots ``< start[b]`` and to the slots of its ancestors and
        itself (nodes ``< lo`` must have been written by an earlier call at the same ``start``).
        Returns logits (B, W, V) float32 (or (B, 1, V) at column ``logits_at[b]``) and the features, as
        ``forward``. Nothing becomes final: the caller keeps a path with ``KVCache.keep_path``."""
        B, W = ids.shape
        M = lo + W
        if parents.ndim != 2 or parents.shape[0] != B or parents.shape[1] < M:
            raise ValueError(f"parents must have shape (B, >= lo + W) = ({B}, >= {M}), got {tuple(parents.shape)}")
        slots, cos, sin, mask = tree_block_inputs(parents[:, :M].to(ids.device).long(), start, lo, self.cos, self.sin,
                                                  cache.capacity)
        return self._layers(ids, slots, cos, sin, mask, cache, aux_layers, logits_at)

    def _layers(self, ids, slots, cos, sin, mask, cache, aux_layers, logits_at):
        """The network on block ``ids`` (B, W) written at ``slots`` (B, W), rotated by ``cos`` / ``sin``
        (B, 1, W, hd) float32, attending per ``mask`` (B, 1, W, used) bool."""
        B = ids.shape[0]
        cos, sin = cos.to(self.dtype), sin.to(self.dtype)
        x = self.embed(ids)
        feats = {}
        for i, layer in enumerate(self.layers):
            if i in aux_layers:
                feats[i] = x
            x = layer(x, cos, sin, cache.k[i], cache.v[i], slots, mask)
        if logits_at is not None:
            x = x[torch.arange(B, device=x.device), logits_at].unsqueeze(1)
        # one per aux_layers entry, in its order (a layer listed twice, as (2, 3, 3) for 6 layers, twice)
        return self.head(self.norm(x)).float(), [feats[i] for i in aux_layers]

    @classmethod
    def from_hf(cls, model: nn.Module, dtype: torch.dtype | None = None) -> Llama:
        """The same network as a transformers ``LlamaForCausalLM`` (weights copied, then fused), in
        ``dtype`` (default: the model's own)."""
        why = supports_hf(model)
        if why:
            raise ValueError(f"cannot build a compact Llama from {type(model).__name__}: {why}")
        a = hf_args(model.config)
        sd = model.state_dict()
        dev = next(model.parameters()).device
        with torch.device("meta"):
            m = cls(a)
        m = m.to_empty(device=dev)
        with torch.no_grad():
            m.embed.weight.copy_(sd["model.embed_tokens.weight"])
            if not a.tie_embeddings:
                m.head.weight.copy_(sd["lm_head.weight"])
            m.norm.weight.copy_(sd["model.norm.weight"])
            for i, blk in enumerate(m.layers):
                p = f"model.layers.{i}."
                blk.attn_norm.weight.copy_(sd[p + "input_layernorm.weight"])
                blk.mlp_norm.weight.copy_(sd[p + "post_attention_layernorm.weight"])
                blk.attn.wqkv.weight.copy_(torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]))
                blk.attn.wo.weight.copy_(sd[p + "self_attn.o_proj.weight"])
                blk.mlp.w13.weight.copy_(torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]))
                blk.mlp.w2.weight.copy_(sd[p + "mlp.down_proj.weight"])
            cos, sin = rope_tables(a.head_dim, a.rope_theta, a.max_positions)
            m.cos, m.sin = cos.to(dev), sin.to(dev)
        if a.tie_embeddings:
            m.head.weight = m.embed.weight
        m.config = model.config
        m = m.to(dtype or next(model.parameters()).dtype)
        m.cos, m.sin = m.cos.float(), m.sin.float()
        return m.eval()

