"""The project's draft for a Llama verifier (by default the embedded SmolLM2): a feature-level head in
the style of EAGLE-3 (Li et al., 2025), in the layout vLLM's ``Eagle3LlamaForCausalLM`` loads. The
head is built from the verifier's own parts (``llama.py``): its ``LlamaArgs`` (``HeadArgs`` extends
them), its attention projections, rotary embedding and masked attention (``llama.attend``, also used
by the training-time unrolling), its RMSNorm, SwiGLU MLP and KV cache.

The head reads, at position ``j``, the verifier's residual stream entering three of its layers
(low, middle, high: ``aux_layers``, by default ``eagle3_aux_layers`` of the verifier's depth), fused
by ``fc`` to one vector ``a_j``, and the embedding of the token at ``j + 1``; one decoder layer
(attention over the head's own KV cache, then an MLP) gives a vector ``g_j`` whose normalised image
through a head over a token shortlist ``S`` is the draft law
``p`` of the token at ``j + 2``. For the next draft step ``g_j`` replaces the verifier feature, so a
whole block of ``k`` drafts costs ``k`` small forwards and no verifier call. Outside ``S`` the draft
has ``p_i = 0``, which every rule handles exactly.

    a_j = fc([x^(l1)_j, x^(l2)_j, x^(l3)_j])                       (verifier features, fused)
    g_j = a_j + Attn([norm_e(E[x_{j+1}]), norm_h(a_j)])            (one step of the head)
    g_j = g_j + MLP(norm_m(g_j))
    p(x_{j+2} | x_<=j+1) = softmax(W_S norm(g_j))                   (shortlist S, -inf elsewhere)

Training (``draft_build.py``) distils the verifier's next-token laws, including the head's own
predicted features for later steps ("training-time test"), on the verifier's own answers to seeded
requests and on Wikipedia summaries; ``cactus-theory build-draft`` builds it, seeded, cached and
written atomically. The cache file is keyed by the verifier (``draft_path``).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from ..util.atomic import atomic_path
from .draft_config import (  # torch-free; re-exported here
    BUILD_TIME,
    DEFAULT_VERIFIER,
    DEFAULT_VERIFIER_LAYERS,
    FORMAT_VERSION,
    DraftConfig,
    MissingDraftError,
    cache_dir,
    draft_path,
    eagle3_aux_layers,
    verifier_tag,
)
from .llama import (
    MLP,
    Attention,
    Block,
    KVCache,
    LlamaArgs,
    RMSNorm,
    attend,
    block_inputs,
    hf_args,
    rope_tables,
    tree_block_inputs,
    tree_node_inputs,
)

__all__ = ["DraftConfig", "FeatureDraft", "HeadArgs", "cache_dir", "draft_path", "load_draft", "save_draft", "spread",
           "MissingDraftError", "FORMAT_VERSION", "export_eagle3", "eagle3_aux_layers", "verifier_tag", "head_args",
           "DEFAULT_VERIFIER", "DEFAULT_VERIFIER_LAYERS", "BUILD_TIME"]


def spread(x: torch.Tensor, ids: torch.Tensor, V: int, fill: float = 0.0,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (..., S) given on the distinct tokens ``ids`` (S,) int64 (a shortlist) written into a vocabulary
    of ``V``: (..., V), ``fill`` at every other token; or written into ``out`` (..., V), which must already
    hold ``fill`` outside ``ids`` (a buffer reused from step to step: its columns outside ``ids`` are never
    written). (``scatter_`` rather than ``index_copy_``: the same result, about 2.5x faster on CPU for a
    (16, 8192) block into 49,152 tokens.)"""
    shape = (*x.shape[:-1], V)
    if out is None:
        out = x.new_full(shape, fill)
    elif out.shape != shape or out.dtype != x.dtype:
        raise ValueError(f"out must be {tuple(shape)} {x.dtype}, got {tuple(out.shape)} {out.dtype}")
    return out.scatter_(-1, ids.expand(*x.shape[:-1], ids.shape[0]), x)


@dataclass(frozen=True)
class HeadArgs(LlamaArgs):
    """The head's architecture: the verifier's ``LlamaArgs`` (``dim``, heads, ``head_dim``, ``vocab`` =
    the verifier's V, norm eps, RoPE) with the head's own ``n_layers`` (decoder layers of the head) and
    ``hidden`` (its MLP width), plus the shortlist size |S|, the verifier layers it reads and free-form
    ``extra`` metadata. The head's output map is its own (``tie_embeddings`` False)."""

    shortlist: int = 0  # |S|
    aux_layers: tuple[int, ...] = ()
    tie_embeddings: bool = False
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.shortlist < 1 or not self.aux_layers:
            raise ValueError(f"HeadArgs needs shortlist >= 1 and aux_layers, got {self.shortlist!r}, "
                             f"{self.aux_layers!r}")
        object.__setattr__(self, "aux_layers", tuple(self.aux_layers))


class FeatureDraft(nn.Module):
    """EAGLE-3-style head (see the module docstring). The token embedding ``embed`` is the verifier's
    (shared, frozen, not saved with the head); ``d2t`` (|S|,) maps shortlist rows to token ids.
    ``args.n_layers > 1`` adds plain pre-norm decoder blocks after the first layer (vLLM's EAGLE-3
    layers 1.. read only the residual stream)."""

    needs_features = True  # reads the verifier's features (make_drafter: FeatureDrafter)

    def __init__(self, a: HeadArgs, embed: nn.Embedding):
        super().__init__()
        self.args = a
        d = a.dim
        self.embed = embed
        self.fc = nn.Linear(len(a.aux_layers) * d, d, bias=False)
        self.embed_norm = RMSNorm(d, a.norm_eps)
        self.feat_norm = RMSNorm(d, a.norm_eps)
        self.attn = Attention(2 * d, d, a.n_heads, a.n_kv_heads, a.head_dim)
        self.mlp_norm = RMSNorm(d, a.norm_eps)
        self.mlp = MLP(d, a.hidden)
        self.blocks = nn.ModuleList([Block(a) for _ in range(a.n_layers - 1)])
        self.norm = RMSNorm(d, a.norm_eps)
        self.head = nn.Linear(d, a.shortlist, bias=False)
        self.register_buffer("d2t", torch.zeros(a.shortlist, dtype=torch.long))
        cos, sin = rope_tables(a.head_dim, a.rope_theta, a.max_positions)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def cast(self, dtype: torch.dtype) -> FeatureDraft:
        """The head's own weights in ``dtype``, in place (the RoPE tables stay float32, cast where used); the
        embedding it shares with the verifier keeps the verifier's dtype (``.to(dtype)`` would cast the
        verifier's embedding too). Returns the head."""
        for name, child in self.named_children():
            if name != "embed":
                child.to(dtype)
        return self

    def own_state(self) -> dict:
        """The head's weights without the shared embedding and the RoPE tables."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("embed.")}

    def fuse(self, aux: list[torch.Tensor]) -> torch.Tensor:
        """Verifier features: list of (B, W, dim) -> ``a`` (B, W, dim)."""
        return self.fc(torch.cat(aux, -1).to(self.dtype))

    def step(self, feat: torch.Tensor, tokens: torch.Tensor, cache: KVCache, slots: torch.Tensor,
             used: int) -> torch.Tensor:
        """One head step for a block: ``feat`` (B, W, dim) fused verifier features or the head's own
        previous outputs, ``tokens`` (B, W) the next tokens, written at ``cache`` slots ``slots``
        (B, W) of every layer; returns ``g`` (B, W, dim)."""
        cos, sin, mask = block_inputs(slots, self.cos, self.sin, used)
        return self._layers(feat, tokens, cache, slots, cos, sin, mask)

    def tree_step(self, feat: torch.Tensor, tokens: torch.Tensor, cache: KVCache, start: torch.Tensor,
                  parents: torch.Tensor, lo: int, nodes: torch.Tensor | None = None) -> torch.Tensor:
        """``step`` for nodes ``lo .. lo + W - 1`` of a tree (``llama.tree_block_inputs``), or for the nodes
        ``nodes`` (B, W) int64 of each row (``llama.tree_node_inputs``): ``feat`` (B, W, dim) each node's parent
        output (or the root's), ``tokens`` (B, W) the nodes' tokens, ``parents`` (B, M) int64 (every node
        up to the last read); node ``j`` is written at slot ``start + j``, placed at ``start + depth(j)``
        and attends to the slots before ``start`` and to its ancestors. Returns ``g`` (B, W, dim)."""
        if nodes is None:
            M = lo + tokens.shape[1]
            slots, cos, sin, mask = tree_block_inputs(parents[:, :M].long(), start, lo, self.cos, self.sin,
                                                      cache.capacity)
        else:
            slots, cos, sin, mask = tree_node_inputs(parents.long(), start, nodes, self.cos, self.sin, cache.capacity)
        return self._layers(feat, tokens, cache, slots, cos, sin, mask)

    def _layers(self, feat, tokens, cache, slots, cos, sin, mask) -> torch.Tensor:
        """The head on a block: ``feat`` (B, W, dim), ``tokens`` (B, W) written at ``slots`` (B, W),
        rotated by ``cos`` / ``sin`` (B, 1, W, hd) float32, attending per ``mask`` (B, 1, W, used) bool;
        returns ``g`` (B, W, dim)."""
        cos, sin = cos.to(self.dtype), sin.to(self.dtype)
        x = torch.cat([self.embed_norm(self.embed(tokens).to(self.dtype)), self.feat_norm(feat)], -1)
        g = feat + self.attn(x, cos, sin, cache.k[0], cache.v[0], slots, mask)
        g = g + self.mlp(self.mlp_norm(g))
        for i, blk in enumerate(self.blocks, start=1):
            g = blk(g, cos, sin, cache.k[i], cache.v[i], slots, mask)
        return g

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """Shortlist logits (..., |S|) in float32."""
        return self.head(self.norm(g)).float()

    def full_logits(self, g: torch.Tensor) -> torch.Tensor:
        """Logits over the whole vocabulary (..., V), ``-inf`` outside the shortlist."""
        return spread(self.logits(g), self.d2t, self.args.vocab, -math.inf)

    def new_cache(self, batch: int, capacity: int, device=None) -> KVCache:
        a = self.args
        return KVCache(a.n_layers, batch, a.n_kv_heads, capacity, a.head_dim, self.dtype,
                       device or self.fc.weight.device)

    # -- training-time test: k draft steps over whole sequences at once ---------------------------
    def unrolled(self, a: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Outputs ``g`` of draft steps 1..``steps`` at every entry of whole sequences, exactly as the
        decode loop computes them (so training sees the head's own features, EAGLE-3's "training-time
        test").

        ``a`` (N, T, dim): fused verifier features of entries j = 0..T-1; ``tokens`` (N, T): token
        ``x_{j+1}`` of entry ``j``. Step 1 at entry ``j`` reads ``a_j`` and attends to step-1 entries
        ``<= j``; step ``s`` at entry ``j`` reads step ``s-1``'s output at entry ``j-1`` and attends to
        step-1 entries ``<= j-s+1`` plus the step-``r`` entry at ``j-s+r`` for ``r = 2..s`` (the
        drafts of its own block), in every layer. Entries with ``j < s - 1`` have no such chain; their
        outputs are defined but meaningless (mask them in the loss). Returns a list of (N, T, dim).
        """
        T = a.shape[1]
        cos = self.cos[:T].to(a.dtype)[None, None]
        sin = self.sin[:T].to(a.dtype)[None, None]
        e = self.embed_norm(self.embed(tokens).to(a.dtype))
        kv: list[list] = [[] for _ in range(self.args.n_layers)]  # per layer: (k, v) of steps 1..s
        outs = []
        feat = a
        for s in range(1, steps + 1):
            mask = ttt_mask(T, s, a.device)
            x = torch.cat([e, self.feat_norm(feat)], -1)
            g = feat + _ttt_attention(self.attn, x, kv[0], s, cos, sin, mask)
            g = g + self.mlp(self.mlp_norm(g))
            for i, blk in enumerate(self.blocks, start=1):
                g = g + _ttt_attention(blk.attn, blk.attn_norm(g), kv[i], s, cos, sin, mask)
                g = g + blk.mlp(blk.mlp_norm(g))
            outs.append(g)
            feat = _shift(g, 1, dim=1)
        return outs


def ttt_mask(T: int, s: int, device=None) -> torch.Tensor:
    """Which keys query ``j`` of draft step ``s`` reads in ``FeatureDraft.unrolled``: (1, 1, T, s T)
    bool over the keys ``[step 1 entries 0..T-1, step 2 shifted by s - 2, ..., step s shifted by 0]``:
    step-1 entries ``i <= j - (s - 1)`` and, of each later step's block, only entry ``j`` (the shifted
    key of the same draft chain)."""
    i = torch.arange(T, device=device)
    causal = i[None, :] <= i[:, None] - (s - 1)
    diag = (i[None, :] == i[:, None]).repeat(1, s - 1)
    return torch.cat([causal, diag], 1)[None, None]


def _ttt_attention(attn: Attention, x: torch.Tensor, kv: list, s: int, cos, sin, mask) -> torch.Tensor:
    """Attention of draft step ``s`` at every entry (see ``unrolled``): ``x`` (N, T, in_dim) through
    ``attn``'s projections and rotary embedding, this step's (k, v) (each (N, Hk, T, hd)) appended to
    ``kv``, then ``llama.attend`` over the step-1 keys and the later steps' keys shifted to their
    chain's entry, under ``mask`` (``ttt_mask``). Returns (N, T, dim)."""
    q, k, v = attn.project(x, cos, sin)
    kv.append((k, v))
    keys = torch.cat([kv[0][0]] + [_shift(kv[r - 1][0], s - r) for r in range(2, s + 1)], 2)
    values = torch.cat([kv[0][1]] + [_shift(kv[r - 1][1], s - r) for r in range(2, s + 1)], 2)
    return attn.output(attend(q, keys, values, mask))


def _shift(x: torch.Tensor, m: int, dim: int = 2) -> torch.Tensor:
    """``y[j] = x[j - m]`` along ``dim`` (zeros for ``j < m``)."""
    if m == 0:
        return x
    pad = torch.zeros_like(x.narrow(dim, 0, m))
    return torch.cat([pad, x.narrow(dim, 0, x.shape[dim] - m)], dim)


def head_args(verifier_config, cfg: DraftConfig) -> HeadArgs:
    """The head's ``HeadArgs`` for a verifier with Hugging Face Llama config ``verifier_config``: its
    ``LlamaArgs`` with the head's depth, MLP width, shortlist and ``aux_layers`` (resolved from the
    verifier's depth when ``cfg.aux_layers`` is None)."""
    v = hf_args(verifier_config)
    cfg = cfg.resolved(v.n_layers)
    return HeadArgs(**{**asdict(v), "n_layers": cfg.head_layers, "hidden": cfg.mlp_hidden, "tie_embeddings": False},
                    shortlist=cfg.shortlist, aux_layers=cfg.aux_layers)


def _depth(verifier: nn.Module) -> int:
    """The decoder layers of a Hugging Face model or a compact ``Llama``."""
    cfg = getattr(verifier, "config", None)
    n = getattr(cfg, "num_hidden_layers", None)
    return int(n) if n is not None else int(verifier.args.n_layers)


def load_draft(verifier: nn.Module, cfg: DraftConfig | None = None, path: str | None = None,
               spec: str = DEFAULT_VERIFIER) -> FeatureDraft:
    """The cached draft for ``verifier`` (the loaded model of model argument ``spec``, by default the
    embedded SmolLM2), from ``path`` or ``draft_path(cfg, spec, verifier's depth)``; never builds it: a
    missing file raises ``MissingDraftError`` telling to run ``cactus-theory build-draft``."""
    cfg = DraftConfig() if cfg is None else cfg
    path = path or draft_path(cfg, spec, None if spec == DEFAULT_VERIFIER else _depth(verifier))
    if not os.path.exists(path):
        raise MissingDraftError.not_built(path, spec)
    blob = torch.load(path, map_location="cpu", weights_only=False)
    if blob.get("format") != FORMAT_VERSION:
        raise MissingDraftError(f"{path} has format {blob.get('format')}, expected {FORMAT_VERSION}: rebuild it "
                                f"with `cactus-theory build-draft --force`")
    embed = verifier.get_input_embeddings() if hasattr(verifier, "get_input_embeddings") else verifier.embed
    args = HeadArgs(**blob["args"])
    if (args.vocab, args.dim) != tuple(embed.weight.shape) or max(args.aux_layers) >= _depth(verifier):
        raise ValueError(f"{path} is a draft for a verifier with vocabulary {args.vocab}, width {args.dim} and "
                         f"layers {args.aux_layers}, not for this one ({tuple(embed.weight.shape)}, "
                         f"{_depth(verifier)} layers)")
    draft = FeatureDraft(args, embed)
    missing, unexpected = draft.load_state_dict(blob["state"], strict=False)
    bad = [k for k in missing if not k.startswith("embed.")] + list(unexpected)
    if bad:
        raise ValueError(f"{path} does not match the draft architecture: {bad[:5]}")
    draft.to(embed.weight.device)
    draft.info = blob.get("info", {})
    draft.config = cfg
    return draft.eval()


def save_draft(draft: FeatureDraft, path: str, info: dict | None = None) -> str:
    """Write ``draft`` to ``path`` (atomically) in the format ``load_draft`` reads: ``FORMAT_VERSION``, the
    head's ``HeadArgs``, its own weights (``own_state``: not the verifier's shared embedding) and the build's
    ``info``; returns ``path``."""
    with atomic_path(path) as tmp:
        torch.save({"format": FORMAT_VERSION, "args": asdict(draft.args), "state": draft.own_state(),
                    "info": {} if info is None else info}, tmp)
    return path


def eagle3_state(draft: FeatureDraft) -> dict[str, torch.Tensor]:
    """The head's weights under the names of the EAGLE-3 checkpoints vLLM's ``Eagle3LlamaForCausalLM``
    loads (``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t`` as offsets: target id = row + d2t[row])."""
    a = draft.args
    q, k, v = draft.attn.wqkv.weight.split([a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim,
                                            a.n_kv_heads * a.head_dim])
    gate, up = draft.mlp.w13.weight.chunk(2, dim=0)
    out = {"fc.weight": draft.fc.weight, "midlayer.input_layernorm.weight": draft.embed_norm.weight,
           "midlayer.hidden_norm.weight": draft.feat_norm.weight, "midlayer.self_attn.q_proj.weight": q,
           "midlayer.self_attn.k_proj.weight": k, "midlayer.self_attn.v_proj.weight": v,
           "midlayer.self_attn.o_proj.weight": draft.attn.wo.weight,
           "midlayer.post_attention_layernorm.weight": draft.mlp_norm.weight,
           "midlayer.mlp.gate_proj.weight": gate, "midlayer.mlp.up_proj.weight": up,
           "midlayer.mlp.down_proj.weight": draft.mlp.w2.weight, "norm.weight": draft.norm.weight,
           "lm_head.weight": draft.head.weight, "d2t": draft.d2t - torch.arange(a.shortlist, device=draft.d2t.device)}
    for i, blk in enumerate(draft.blocks, start=1):  # vLLM: layers 1.. are plain Llama decoder layers
        q, k, v = blk.attn.wqkv.weight.split([a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim,
                                              a.n_kv_heads * a.head_dim])
        gate, up = blk.mlp.w13.weight.chunk(2, dim=0)
        out.update({f"layers.{i}.input_layernorm.weight": blk.attn_norm.weight,
                    f"layers.{i}.self_attn.q_proj.weight": q, f"layers.{i}.self_attn.k_proj.weight": k,
                    f"layers.{i}.self_attn.v_proj.weight": v, f"layers.{i}.self_attn.o_proj.weight": blk.attn.wo.weight,
                    f"layers.{i}.post_attention_layernorm.weight": blk.mlp_norm.weight,
                    f"layers.{i}.mlp.gate_proj.weight": gate, f"layers.{i}.mlp.up_proj.weight": up,
                    f"layers.{i}.mlp.down_proj.weight": blk.mlp.w2.weight})
    t2d = torch.zeros(a.vocab, dtype=torch.bool)
    t2d[draft.d2t.cpu()] = True
    out["t2d"] = t2d
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}


def export_eagle3(draft: FeatureDraft, folder: str, dtype: torch.dtype = torch.bfloat16) -> str:
    """Write the head as an EAGLE-3 draft folder (``config.json`` + ``model.safetensors``) in the layout
    vLLM's ``Eagle3LlamaForCausalLM`` loads (``--speculative-config '{"method": "eagle3", "model":
    folder, ...}'``); the token embedding is the verifier's (vLLM shares it when the folder has none)."""
    from safetensors.torch import save_file

    from ..util.atomic import atomic_path, atomic_write_json

    a = draft.args
    os.makedirs(folder, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": a.dim,
           "intermediate_size": a.hidden, "num_attention_heads": a.n_heads, "num_key_value_heads": a.n_kv_heads,
           "head_dim": a.head_dim, "num_hidden_layers": a.n_layers, "rms_norm_eps": a.norm_eps, "rope_theta": a.rope_theta,
           "max_position_embeddings": a.max_positions, "vocab_size": a.vocab, "draft_vocab_size": a.shortlist,
           "target_hidden_size": a.dim, "hidden_act": "silu", "tie_word_embeddings": False,
           "torch_dtype": str(dtype).replace("torch.", ""),
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(a.aux_layers), "use_aux_hidden_state": True}}
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in eagle3_state(draft).items()}
    with atomic_path(os.path.join(folder, "model.safetensors")) as tmp:
        save_file(state, str(tmp))
    atomic_write_json(os.path.join(folder, "config.json"), cfg)
    return folder
