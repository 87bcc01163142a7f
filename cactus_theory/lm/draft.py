"""The embedded draft for SmolLM2: an early exit from the verifier's own first layers.

Draft = the verifier's first ``L`` decoder layers (shared, frozen) + a trained exit head
``logits_S = W norm(x + A(x))`` over a shortlist ``S`` of the ``|S|`` tokens the verifier predicts
most (``A`` a small zero-initialised MLP, ``W`` initialised from the tied embedding rows of ``S``).
Outside ``S`` the draft has ``p_i = 0``, which every rule handles exactly; the shortlist head
skips most of the 49,152 x 576 LM head, the largest single cost of a forward on a CPU.

Training (distillation) text: the verifier's own chat answers to seeded templated requests
(``data.training_prompts``: prose, code, arithmetic word problems; sampled at temperature 0.7,
top-k 20, top-p 0.95) plus some standard-library source. One teacher pass gives the verifier's
next-token law ``q`` at every position (top ``TOPK`` tokens kept); the draft's copies of the first
``L`` layers and its exit head minimise ``-sum_{i in S} q_i log p_i``. Held-out transcripts (requests
not trained on) give the reported acceptance. Seeded, reproducible, cached in ``cache_dir()``,
written atomically.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch
from torch import nn
from tqdm.auto import tqdm

from ..atomic import atomic_path

__all__ = ["DraftConfig", "ShortlistDraft", "cache_dir", "draft_path", "build_draft", "load_draft",
           "collect_teacher", "train_draft", "heldout_acceptance", "configure", "run"]

FORMAT_VERSION = 3
TOPK = 32  # teacher tokens kept per position


@dataclass(frozen=True)
class DraftConfig:
    num_layers: int = 2
    shortlist: int = 4096
    adapter: int = 1024
    train_tokens: int = 4_096  # standard-library source
    chat_prompts: int = 96  # templated requests answered by the verifier (on-policy transcripts)
    chat_heldout: int = 12  # of which the last ones are held out for the acceptance report
    chat_tokens: int = 96  # new tokens per transcript
    gen_batch: int = 32
    seq_len: int = 128
    batch: int = 8
    epochs: int = 4
    lr: float = 2e-3
    train_layers: bool = True
    seed: int = 0

    def __post_init__(self):
        for name in ("num_layers", "shortlist", "train_tokens", "chat_prompts", "chat_heldout", "chat_tokens",
                     "gen_batch", "seq_len", "batch", "epochs"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.chat_heldout >= self.chat_prompts:
            raise ValueError(f"chat_heldout must be < chat_prompts, got {self.chat_heldout} >= {self.chat_prompts}")
        if self.adapter < 0:
            raise ValueError(f"adapter must be >= 0, got {self.adapter!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be > 0, got {self.lr!r}")


def cache_dir() -> str:
    """``$CACTUS_THEORY_CACHE``, else ``$XDG_CACHE_HOME/cactus-theory``, else ``~/.cache/cactus-theory``."""
    if os.environ.get("CACTUS_THEORY_CACHE"):
        return os.environ["CACTUS_THEORY_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cactus-theory")


def draft_path(cfg: DraftConfig) -> str:
    key = hashlib.sha1(json.dumps(asdict(cfg), sort_keys=True).encode()).hexdigest()[:10]
    return os.path.join(cache_dir(), f"smollm2-draft-v{FORMAT_VERSION}-L{cfg.num_layers}-S{cfg.shortlist}-{key}.pt")


def _truncated(inner: nn.Module, num_layers: int, copy_layers: bool) -> nn.Module:
    """The verifier's inner decoder cut to its first ``num_layers`` layers (shared, or copied when
    ``copy_layers`` so that they can be trained), without the final norm (the exit head has its own);
    the token embedding is always shared."""
    cfg = copy.deepcopy(inner.config)
    cfg.num_hidden_layers = num_layers
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = cfg.layer_types[:num_layers]
    with torch.device("meta"):
        base = type(inner)(cfg)
    base.embed_tokens = inner.embed_tokens
    layers = list(inner.layers[:num_layers])
    base.layers = nn.ModuleList([copy.deepcopy(m) for m in layers] if copy_layers else layers)
    base.rotary_emb = inner.rotary_emb
    base.norm = nn.Identity()
    left = [n for n, t in list(base.named_parameters()) + list(base.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"cannot build an early-exit draft from {type(inner).__name__}: {left[:3]} not shared")
    return base


class ShortlistDraft(nn.Module):
    """Early-exit draft: shared first ``L`` verifier layers + exit head over a token shortlist.

    Called like a Hugging Face causal LM (``input_ids, attention_mask, position_ids, cache``); returns
    ``.logits`` over the full vocabulary with ``-inf`` outside the shortlist, and ``.past_key_values``.
    """

    def __init__(self, verifier: nn.Module, num_layers: int, shortlist: torch.Tensor, adapter: int = 1024,
                 own_layers: bool = False):
        super().__init__()
        inner = verifier.model
        if not 1 <= num_layers < len(inner.layers):
            raise ValueError(f"num_layers must be in [1, {len(inner.layers) - 1}], got {num_layers}")
        d = inner.config.hidden_size
        self.base = _truncated(inner, num_layers, own_layers)
        self.own_layers = own_layers
        self.adapter_in = nn.Linear(d, adapter) if adapter else None
        self.adapter_out = nn.Linear(adapter, d) if adapter else None
        if adapter:
            nn.init.zeros_(self.adapter_out.weight)
            nn.init.zeros_(self.adapter_out.bias)
        self.norm = copy.deepcopy(inner.norm)
        self.register_buffer("shortlist", shortlist.long().clone())
        self.head = nn.Linear(d, shortlist.numel(), bias=False)
        with torch.no_grad():
            self.head.weight.copy_(verifier.get_output_embeddings().weight[self.shortlist])
        self.config = copy.deepcopy(verifier.config)
        self.num_layers = num_layers

    def exit(self, x: torch.Tensor) -> torch.Tensor:
        """Layer-``L`` features (..., d) -> shortlist logits (..., |S|)."""
        if self.adapter_in is not None:
            x = x + self.adapter_out(nn.functional.silu(self.adapter_in(x)))
        return self.head(self.norm(x))

    def trained_state(self) -> dict:
        """Everything but the shared verifier modules (embedding; layers too unless own)."""
        return {k: v for k, v in self.state_dict().items()
                if not k.startswith("base.") or (self.own_layers and k.startswith("base.layers."))}

    def trainable(self) -> list[nn.Parameter]:
        return [p for n, p in self.named_parameters()
                if not n.startswith("base.") or (self.own_layers and n.startswith("base.layers."))]

    def features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Layer-``L`` features of whole sequences (N, T) -> (N, T, d), no cache."""
        return self.base(input_ids=input_ids, use_cache=False).last_hidden_state

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, past_key_values=None,
                use_cache=True, **_):
        out = self.base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        **{_cache_kw(self.base): cache if cache is not None else past_key_values},
                        use_cache=use_cache)
        s = self.exit(out.last_hidden_state)
        logits = s.new_full((*s.shape[:-1], self.config.vocab_size), -math.inf)
        logits.scatter_(-1, self.shortlist.expand(*s.shape[:-1], -1), s)
        return SimpleNamespace(logits=logits, past_key_values=_out_cache(out))


def _cache_kw(model: nn.Module) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _out_cache(out):
    c = getattr(out, "past_key_values", None)
    return c if c is not None else getattr(out, "cache", None)


# -- training ----------------------------------------------------------------------------------

def _chunks(stream: list[int], seq_len: int) -> torch.Tensor:
    n = len(stream) // seq_len
    return torch.tensor(stream[:n * seq_len], dtype=torch.long).view(n, seq_len)


def _chat_streams(verifier, tokenizer, cfg: DraftConfig, progress: bool):
    """The verifier's answers to ``data.training_prompts``, as token streams of whole transcripts
    (chat-templated prompt + answer): training, held-out (the last ``chat_heldout`` requests), and a
    held-out 0/1 stream marking the positions whose NEXT token is part of an answer."""
    from .data import training_prompts
    from .generate import autoregressive_generate
    from .pair import ModelPair

    prompts = training_prompts(cfg.chat_prompts, cfg.seed)
    alone = ModelPair(verifier, verifier, tokenizer, name="verifier")
    streams: list[list[int]] = []
    plens: list[int] = []
    for i in tqdm(range(0, len(prompts), cfg.gen_batch), desc="verifier transcripts", disable=not progress):
        res = autoregressive_generate(alone, prompts[i:i + cfg.gen_batch], max_new_tokens=cfg.chat_tokens,
                                      temperature=0.7, top_k=20, top_p=0.95, batch_size=cfg.gen_batch,
                                      seed=cfg.seed + i)
        streams += [p + t for p, t in zip(res.prompts, res.tokens, strict=True)]
        plens += [len(p) for p in res.prompts]
    cut = len(streams) - cfg.chat_heldout
    held_mask = [m for s, n in zip(streams[cut:], plens[cut:], strict=True) for m in
                 [int(n - 1 <= i < len(s) - 1) for i in range(len(s))]]
    return [t for s in streams[:cut] for t in s], [t for s in streams[cut:] for t in s], held_mask


def _token_batches(tokenizer, cfg: DraftConfig, n_tokens: int, seed: int):
    """Fixed-length token sequences cut from standard-library source, ``n_tokens`` in all."""
    from .data import stdlib_texts

    seqs, buf = [], []
    need = n_tokens // cfg.seq_len
    for text in stdlib_texts(seed=seed):
        buf += tokenizer(text)["input_ids"]
        while len(buf) >= cfg.seq_len and len(seqs) < need:
            seqs.append(buf[:cfg.seq_len])
            buf = buf[cfg.seq_len:]
        if len(seqs) >= need:
            break
    return torch.tensor(seqs, dtype=torch.long)


@torch.no_grad()
def collect_teacher(verifier: nn.Module, seqs: torch.Tensor, batch: int, progress: bool = True) -> dict:
    """One verifier pass over ``seqs`` (N, T): the teacher's top-``TOPK`` log-probabilities and ids at
    every position, (N, T, TOPK), and the summed next-token probabilities per token id (V,)."""
    top_lp, top_id = [], []
    mass = torch.zeros(verifier.config.vocab_size, dtype=torch.float64)
    for i in tqdm(range(0, len(seqs), batch), desc="teacher pass", disable=not progress):
        lp = verifier(input_ids=seqs[i:i + batch], use_cache=False).logits.float().log_softmax(-1)
        mass += lp.exp().sum((0, 1)).double()
        v, ix = lp.topk(min(TOPK, lp.shape[-1]), dim=-1)
        top_lp.append(v)
        top_id.append(ix)
    return {"top_lp": torch.cat(top_lp), "top_id": torch.cat(top_id), "mass": mass}


def _targets(top_lp: torch.Tensor, top_id: torch.Tensor, shortlist: torch.Tensor, V: int):
    """Teacher weights on shortlist positions: indices into S (0 where absent) and weights q_i."""
    where = torch.full((V,), -1, dtype=torch.long)
    where[shortlist] = torch.arange(shortlist.numel())
    idx = where[top_id]
    w = torch.where(idx >= 0, top_lp.exp(), torch.zeros_like(top_lp))
    return idx.clamp_min(0), w


def train_draft(draft: ShortlistDraft, seqs: torch.Tensor, top_lp: torch.Tensor, top_id: torch.Tensor,
                cfg: DraftConfig, progress: bool = True) -> list[float]:
    """Adam on ``-sum_{i in S} q_i log p_i`` (teacher's top tokens) over every position of ``seqs``;
    trains the exit head, and the copied layers when the draft owns them; returns epoch losses."""
    g = torch.Generator().manual_seed(cfg.seed)
    idx, w = _targets(top_lp, top_id, draft.shortlist, draft.config.vocab_size)
    opt = torch.optim.Adam(draft.trainable(), lr=cfg.lr)
    N, bs = seqs.shape[0], cfg.batch
    steps = cfg.epochs * math.ceil(N / bs)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=steps, pct_start=0.1)
    losses = []
    bar = tqdm(total=steps, desc="train draft", disable=not progress)
    for _ in range(cfg.epochs):
        perm = torch.randperm(N, generator=g)
        tot = 0.0
        for s in range(0, N, bs):
            b = perm[s:s + bs]
            with torch.enable_grad():
                with torch.set_grad_enabled(draft.own_layers):
                    x = draft.features(seqs[b])
                logp = draft.exit(x).log_softmax(-1)
                loss = -(w[b] * logp.gather(-1, idx[b])).sum(-1).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            sched.step()
            tot += float(loss.detach()) * len(b)
            bar.update()
        losses.append(tot / N)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    return losses


@torch.no_grad()
def heldout_acceptance(draft: ShortlistDraft, seqs: torch.Tensor, top_lp: torch.Tensor, top_id: torch.Tensor,
                       temperature: float = 0.6, top_k: int = 20, top_p: float = 0.95,
                       mask: torch.Tensor | None = None) -> float:
    """Mean SpS acceptance ``sum_i min(p_i, q_i)`` over the positions of ``seqs`` (those where ``mask``
    holds, if given: the build reports answer positions only), both laws after the sampling
    transforms (exact when ``top_k <= TOPK``: the teacher's top logits determine ``q``)."""
    from .transforms import sampling_probs

    if not 0 < top_k <= top_lp.shape[-1]:
        raise ValueError(f"top_k must be in [1, {top_lp.shape[-1]}] here, got {top_k}")
    q_small = sampling_probs(top_lp, temperature, top_k, top_p)  # over top_id
    acc = []
    for i in range(0, len(seqs), 8):
        p = sampling_probs(draft(seqs[i:i + 8], use_cache=False).logits, temperature, top_k, top_p)
        acc.append(torch.minimum(p.gather(-1, top_id[i:i + 8]), q_small[i:i + 8]).sum(-1).flatten())
    acc = torch.cat(acc)
    return float(acc[mask.flatten()].mean() if mask is not None else acc.mean())


def build_draft(cfg: DraftConfig = DraftConfig(), verifier=None, tokenizer=None, path: str | None = None,
                progress: bool = True) -> str:
    """Build the embedded draft (teacher pass, shortlist, training) and cache it; returns the path."""
    from .pair import load_model

    t0 = time.time()
    torch.manual_seed(cfg.seed)
    if verifier is None or tokenizer is None:
        verifier, tokenizer = load_model("smollm2")
    chat_train, chat_held, held_answer = _chat_streams(verifier, tokenizer, cfg, progress)
    code = _token_batches(tokenizer, cfg, cfg.train_tokens, cfg.seed)
    seqs = torch.cat([_chunks(chat_train, cfg.seq_len), code])
    held_seqs = _chunks(chat_held, cfg.seq_len)
    held_mask = _chunks(held_answer, cfg.seq_len).bool()
    data = collect_teacher(verifier, seqs, cfg.batch, progress)
    held = collect_teacher(verifier, held_seqs, cfg.batch, progress)
    shortlist = data["mass"].topk(cfg.shortlist).indices.sort().values
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in set(shortlist.tolist()):
        shortlist[data["mass"][shortlist].argmin()] = tokenizer.eos_token_id
        shortlist = shortlist.sort().values
    draft = ShortlistDraft(verifier, cfg.num_layers, shortlist, cfg.adapter, own_layers=cfg.train_layers)
    before = heldout_acceptance(draft, held_seqs, held["top_lp"], held["top_id"], mask=held_mask)
    losses = train_draft(draft, seqs, data["top_lp"], data["top_id"], cfg, progress)
    after = heldout_acceptance(draft, held_seqs, held["top_lp"], held["top_id"], mask=held_mask)
    after_all = heldout_acceptance(draft, held_seqs, held["top_lp"], held["top_id"])
    info = {"config": asdict(cfg), "losses": losses, "train_tokens": seqs.numel(), "heldout_tokens": held_seqs.numel(), "heldout_acceptance_untrained": before,
            "heldout_acceptance": after,
            "heldout_acceptance_all_positions": after_all, "seconds": time.time() - t0, "format": FORMAT_VERSION}
    path = path or draft_path(cfg)
    with atomic_path(path) as tmp:
        torch.save({"info": info, "shortlist": shortlist, "state": draft.trained_state()}, tmp)
    if progress:
        print(f"draft saved to {path}: held-out SpS acceptance on answer tokens {before:.3f} -> {after:.3f} "
              f"({after_all:.3f} on all positions; T=0.6, top-k 20, top-p 0.95) in {info['seconds']:.0f} s")
    return path


def load_draft(verifier: nn.Module, cfg: DraftConfig = DraftConfig(), build: bool = True,
               tokenizer=None, progress: bool = True) -> ShortlistDraft:
    """The cached draft for ``verifier`` (built first if missing and ``build``)."""
    path = draft_path(cfg)
    if not os.path.exists(path):
        if not build:
            raise ValueError(f"no cached draft at {path}: run `cactus-theory build-draft`")
        if tokenizer is None:
            from .pair import load_model

            tokenizer = load_model("smollm2")[1]
        build_draft(cfg, verifier, tokenizer, path, progress)
    blob = torch.load(path, map_location="cpu", weights_only=False)
    draft = ShortlistDraft(verifier, cfg.num_layers, blob["shortlist"], cfg.adapter, own_layers=cfg.train_layers)
    draft.load_state_dict({**draft.state_dict(), **blob["state"]})
    draft.eval()
    draft.info = blob["info"]
    return draft


# -- command -------------------------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    d = DraftConfig()
    parser.add_argument("--layers", type=int, default=d.num_layers, help="verifier layers kept by the draft")
    parser.add_argument("--shortlist", type=int, default=d.shortlist, help="draft vocabulary size")
    parser.add_argument("--train-tokens", type=int, default=d.train_tokens)
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is faster on a busy machine)")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")


def args_config(args) -> DraftConfig:
    return DraftConfig(num_layers=args.layers, shortlist=args.shortlist, train_tokens=args.train_tokens,
                       epochs=args.epochs, seed=args.seed)


def run(args) -> int:
    cfg = args_config(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    path = draft_path(cfg)
    if os.path.exists(path) and not args.force:
        info = torch.load(path, map_location="cpu", weights_only=False)["info"]
        print(f"draft already built: {path} (held-out SpS acceptance {info['heldout_acceptance']:.3f})")
        return 0
    build_draft(cfg, path=path)
    return 0
