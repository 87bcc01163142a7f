"""Batched speculative decoding with a (draft, verifier) pair, and the plain autoregressive baseline.

Each step, for every unfinished row: the draft samples ``n_1..n_k`` from ``p(. | prefix, n_<j)``;
the verifier scores the pending token and the ``k`` drafts in ONE forward, giving
``q(. | prefix, n_<j)`` for ``j = 1..k+1``; both laws go through the same sampling transforms;
``sampler.verify`` (the rule's own code) accepts ``a`` drafts and emits one recovered or bonus
token. Rows stop independently at EOS or after ``max_new_tokens``.

KV caches: every model keeps one cache and one attention mask per batch. A block is appended for
all rows at once; slots holding rejected drafts are then masked out (``mask = 0``) instead of
being cut, so rows that accepted different numbers of drafts stay in one rectangular cache.
Positions count only unmasked slots, so each row sees exactly the sequence it would see alone.
Finished rows are dropped from the batch (``batch_select_indices``).

Statistics (``DecodeStats``): ``al`` = accepted drafts per verification step (bonus not counted),
``al_bonus`` = emitted tokens per step (``al + 1`` before EOS / budget cuts), acceptance rate,
verifier forward passes, tokens/s (decode time, metric time excluded), the exact per-step
``KL(h_alg || q)`` of the rule at every verified position (``exact.step_divergence``) and the
verifier's own (untransformed) NLL of the generated tokens.
"""

from __future__ import annotations

import inspect
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..exact import step_divergence
from ..registry import make_rule
from ..rules import Rule, ScalingRule, TopK
from ..sampler import verify
from .pair import ModelPair, context_length
from .transforms import check_sampling, sampling_probs

__all__ = ["DecodeStats", "DecodeResult", "speculative_generate", "autoregressive_generate", "prepare_prompts",
           "step_kl"]

KL_MAX_SUPPORT = 4096  # generic (non two-block) rules: exact KL only when the support is this small


@dataclass
class DecodeStats:
    """Counters of one decoding run; derived figures are properties (see module docstring)."""

    method: str
    rule: str = "-"
    k: int = 0
    sequences: int = 0
    new_tokens: int = 0
    steps: int = 0  # verification steps, summed over rows
    accepted: int = 0  # accepted drafts (bonus not counted)
    drafted: int = 0  # drafts verified: k per row-step
    verifier_calls: int = 0  # batched verifier forwards while decoding (prefill not counted)
    draft_calls: int = 0
    prefill_calls: int = 0
    seconds: float = 0.0  # decode wall time, metric computation excluded
    metric_seconds: float = 0.0
    kl_sum: float = 0.0
    kl_count: int = 0
    kl_skipped: int = 0
    nll_sum: float = 0.0
    nll_count: int = 0

    @property
    def al(self) -> float:
        return self.accepted / self.steps if self.steps else math.nan

    @property
    def al_bonus(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else math.nan

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else math.nan

    @property
    def mean_step_kl(self) -> float:
        return self.kl_sum / self.kl_count if self.kl_count else math.nan

    @property
    def nll(self) -> float:
        return self.nll_sum / self.nll_count if self.nll_count else math.nan

    def as_dict(self) -> dict:
        d = asdict(self)
        for name in ("al", "al_bonus", "acceptance_rate", "tokens_per_s", "mean_step_kl", "nll"):
            d[name] = getattr(self, name)
        return d


@dataclass
class DecodeResult:
    tokens: list[list[int]]
    texts: list[str] | None
    stats: DecodeStats
    prompts: list[list[int]] = field(default_factory=list)


# -- model plumbing ---------------------------------------------------------------------------------

def _cache_kw(model) -> str:
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class _Stream:
    """One model's KV cache and attention mask for a batch of rows (see module docstring)."""

    def __init__(self, model, batch: int, device):
        self.model, self.kw = model, _cache_kw(model)
        self.cache = None
        self.mask = torch.zeros((batch, 0), dtype=torch.long, device=device)

    def feed(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Append a block ``ids`` (B, W) whose slots are real where ``valid``; return logits (B, W, V)."""
        valid = valid.long()
        pos = (self.mask.sum(-1, keepdim=True) + valid.cumsum(-1) - 1).clamp_min(0)
        self.mask = torch.cat([self.mask, valid], dim=1)
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos, use_cache=True,
                         **{self.kw: self.cache})
        c = getattr(out, "past_key_values", None)
        self.cache = c if c is not None else getattr(out, "cache", None)
        return out.logits

    def keep_tail(self, keep: torch.Tensor) -> None:
        """Mask out the last ``keep.shape[1]`` slots where ``keep`` is False (rejected drafts)."""
        w = keep.shape[1]
        if w:
            self.mask[:, -w:] *= keep.long()

    def select(self, idx: torch.Tensor) -> None:
        """Keep only rows ``idx`` (finished rows leave the batch)."""
        self.mask = self.mask[idx]
        if self.cache is not None:
            self.cache.batch_select_indices(idx)


# -- inputs -----------------------------------------------------------------------------------------

def prepare_prompts(pair: ModelPair, prompts, max_new_tokens: int, chat: bool = True) -> list[list[int]]:
    """Validate prompts (strings need the pair's tokenizer; or lists of token ids) -> token ids."""
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty list of strings or token-id lists, got {prompts!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if all(isinstance(p, str) for p in prompts):
        if pair.tokenizer is None:
            raise ValueError("text prompts need a tokenizer; this pair has none (pass token-id lists)")
        from .data import encode_prompts

        ids = encode_prompts(pair.tokenizer, list(prompts), chat=chat)
    else:
        ids = []
        for i, p in enumerate(prompts):
            if isinstance(p, torch.Tensor):
                p = p.tolist()
            if not isinstance(p, (list, tuple)) or not all(isinstance(t, (int, np.integer)) for t in p):
                raise ValueError(f"prompts[{i}] must be a string or a list of token ids, got {p!r}")
            ids.append([int(t) for t in p])
    V, ctx = pair.vocab_size, context_length(pair.verifier)
    for i, p in enumerate(ids):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty: a prompt needs at least one token")
        if min(p) < 0 or max(p) >= V:
            raise ValueError(f"prompts[{i}] has token ids outside [0, {V}): {[t for t in p if not 0 <= t < V][:5]}")
        if ctx is not None and len(p) + max_new_tokens > ctx:
            raise ValueError(f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} it exceeds "
                             f"the verifier's context of {ctx} positions")
    return ids


def _check_args(k: int, batch_size: int, temperature: float, top_k: int, top_p: float) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (drafts per step), got {k!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    check_sampling(temperature, top_k, top_p)


def _as_rule(rule) -> Rule:
    if isinstance(rule, str):
        return make_rule(rule)
    if not isinstance(rule, Rule):
        raise ValueError(f"rule must be a Rule (SpS(), Cactus(delta), ...) or a rule name, got {rule!r}")
    return rule


def _left_pad(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    L = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), L), dtype=torch.long)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(p)
        mask[i, L - len(p):] = 1
    return ids.to(device), mask.to(device)


def _device(model) -> torch.device:
    return next(model.parameters()).device


# -- metrics ----------------------------------------------------------------------------------------

def step_kl(rule: Rule, p: np.ndarray, q: np.ndarray) -> float | None:
    """Exact ``KL(h_alg || q)`` of one step, computed on the union support of ``p`` and ``q`` (tokens
    outside it carry no mass in ``h_alg``) plus zero-mass padding so row statistics are unchanged.
    None when a generic rule meets a support above ``KL_MAX_SUPPORT``."""
    sup = np.flatnonzero((p > 0) | (q > 0))
    if not isinstance(rule, ScalingRule) and sup.size > KL_MAX_SUPPORT:
        return None
    need = max(1, (rule.k if isinstance(rule, TopK) else 0) - sup.size)
    rest = np.flatnonzero((p <= 0) & (q <= 0))[:need]
    idx = np.concatenate([sup, rest])
    pc, qc = p[idx].astype(np.float64), q[idx].astype(np.float64)
    pc, qc = pc / pc.sum(), qc / qc.sum()
    return float(step_divergence(rule, pc, qc, check=False))


def _emit(out: list[list[int]], rows: list[int], toks: torch.Tensor, counts: torch.Tensor, eos: int | None,
          max_new: int) -> tuple[list[int], torch.Tensor]:
    """Append each row's emitted tokens (cut after EOS and at the budget); return how many each row
    kept and a mask of rows still running."""
    kept, alive = [], []
    for i, b in enumerate(rows):
        em = toks[i, :int(counts[i])].tolist()
        stop = False
        if eos is not None and eos in em:
            em, stop = em[:em.index(eos) + 1], True
        em = em[:max_new - len(out[b])]
        out[b] += em
        kept.append(len(em))
        alive.append(not stop and len(out[b]) < max_new)
    return kept, torch.tensor(alive, dtype=torch.bool)


def _nll(stats: DecodeStats, logits: torch.Tensor, toks: torch.Tensor, kept: list[int]) -> None:
    """Verifier NLL (untransformed, temperature 1) of the kept tokens; logits (B, W, V), toks (B, W)."""
    lp = logits.float().log_softmax(-1).gather(-1, toks.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    for i, m in enumerate(kept):
        stats.nll_sum += -float(lp[i, :m].sum())
        stats.nll_count += m


# -- decoding loops ---------------------------------------------------------------------------------

@torch.inference_mode()
def _spec_batch(pair, prompts, rule, k, max_new, sampling, gen, stats, track_kl) -> list[list[int]]:
    dev = _device(pair.verifier)
    B = len(prompts)
    ids, mask = _left_pad(prompts, dev)
    ver, dra = _Stream(pair.verifier, B, dev), _Stream(pair.draft, B, dev)
    if ids.shape[1] > 1:
        ver.feed(ids[:, :-1], mask[:, :-1])
        dra.feed(ids[:, :-1], mask[:, :-1])
        stats.prefill_calls += 1
    v_pend = ids[:, -1]
    d_pend = torch.stack([ids[:, -1], ids[:, -1]], dim=1)
    d_valid = torch.tensor([[0, 1]], device=dev).expand(B, 2)
    out: list[list[int]] = [[] for _ in range(B)]
    rows = list(range(B))
    ar = torch.arange(k + 1, device=dev)
    while rows:
        n = len(rows)
        x, xv, P, D = d_pend, d_valid, [], []
        for _ in range(k):
            p = sampling_probs(dra.feed(x, xv)[:, -1], *sampling)
            d = torch.multinomial(p, 1, generator=gen)
            P.append(p)
            D.append(d[:, 0])
            x, xv = d, torch.ones((n, 1), dtype=torch.long, device=dev)
        stats.draft_calls += k
        D_t, P_t = torch.stack(D, 1), torch.stack(P, 1)
        v_logits = ver.feed(torch.cat([v_pend[:, None], D_t], 1), torch.ones((n, k + 1), dtype=torch.long, device=dev))
        stats.verifier_calls += 1
        Q = sampling_probs(v_logits, *sampling)
        toks, a = verify(D_t, P_t, Q, rule, generator=gen, check=False)
        ver.keep_tail(ar[None, :] <= a[:, None])
        dra.keep_tail(ar[None, 1:k] <= a[:, None])
        t = toks.gather(1, a[:, None])[:, 0]
        v_pend = t
        d_pend = torch.stack([D_t[:, -1], t], 1)
        d_valid = torch.stack([(a == k).long(), torch.ones_like(a)], 1)
        kept, alive = _emit(out, rows, toks, a + 1, pair.eos_token_id, max_new)
        stats.steps += n
        stats.accepted += int(a.sum())
        stats.drafted += n * k
        t0 = time.perf_counter()
        _nll(stats, v_logits, toks, kept)
        if track_kl:
            Pn, Qn, an = P_t.cpu().numpy(), Q.cpu().numpy(), a.tolist()
            for i in range(n):
                for j in range(min(an[i] + 1, k, kept[i])):
                    v = step_kl(rule, Pn[i, j], Qn[i, j])
                    if v is None:
                        stats.kl_skipped += 1
                    else:
                        stats.kl_sum += v
                        stats.kl_count += 1
        stats.metric_seconds += time.perf_counter() - t0
        if not bool(alive.all()):
            idx = torch.nonzero(alive.to(dev))[:, 0]
            rows = [r for r, keep in zip(rows, alive.tolist(), strict=True) if keep]
            if rows:
                ver.select(idx)
                dra.select(idx)
                v_pend, d_pend, d_valid = v_pend[idx], d_pend[idx], d_valid[idx]
    return out


@torch.inference_mode()
def _ar_batch(pair, prompts, max_new, sampling, gen, stats) -> list[list[int]]:
    dev = _device(pair.verifier)
    B = len(prompts)
    ids, mask = _left_pad(prompts, dev)
    ver = _Stream(pair.verifier, B, dev)
    if ids.shape[1] > 1:
        ver.feed(ids[:, :-1], mask[:, :-1])
        stats.prefill_calls += 1
    pend = ids[:, -1]
    out: list[list[int]] = [[] for _ in range(B)]
    rows = list(range(B))
    while rows:
        n = len(rows)
        logits = ver.feed(pend[:, None], torch.ones((n, 1), dtype=torch.long, device=dev))
        stats.verifier_calls += 1
        t = torch.multinomial(sampling_probs(logits[:, -1], *sampling), 1, generator=gen)
        kept, alive = _emit(out, rows, t, torch.ones(n, dtype=torch.long), pair.eos_token_id, max_new)
        t0 = time.perf_counter()
        _nll(stats, logits, t, kept)
        stats.metric_seconds += time.perf_counter() - t0
        pend = t[:, 0]
        if not bool(alive.all()):
            idx = torch.nonzero(alive.to(dev))[:, 0]
            rows = [r for r, keep in zip(rows, alive.tolist(), strict=True) if keep]
            if rows:
                ver.select(idx)
                pend = pend[idx]
    return out


def _run(pair, prompts, max_new_tokens, batch_size, seed, chat, stats, body) -> DecodeResult:
    ids = prepare_prompts(pair, prompts, max_new_tokens, chat)
    gen = torch.Generator(_device(pair.verifier)).manual_seed(int(seed))
    tokens: list[list[int]] = []
    t0 = time.perf_counter()
    for s in range(0, len(ids), batch_size):
        tokens += body(ids[s:s + batch_size], gen)
    stats.seconds = time.perf_counter() - t0 - stats.metric_seconds
    stats.sequences = len(ids)
    stats.new_tokens = sum(len(t) for t in tokens)
    texts = None
    if pair.tokenizer is not None:
        texts = [pair.tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
    return DecodeResult(tokens, texts, stats, ids)


def speculative_generate(pair: ModelPair, prompts, rule: Rule | str, k: int = 4, max_new_tokens: int = 64,
                         temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, batch_size: int = 8,
                         seed: int = 0, chat: bool = True, track_kl: bool = True) -> DecodeResult:
    """Speculative decoding of ``prompts`` (strings, chat-wrapped if ``chat``, or token-id lists) with
    ``rule`` deciding every drafted token through ``sampler.verify``; see the module docstring."""
    rule = _as_rule(rule)
    _check_args(k, batch_size, temperature, top_k, top_p)
    stats = DecodeStats("speculative", rule=repr(rule), k=k)
    sampling = (temperature, top_k, top_p)
    return _run(pair, prompts, max_new_tokens, batch_size, seed, chat, stats,
                lambda b, gen: _spec_batch(pair, b, rule, k, max_new_tokens, sampling, gen, stats, track_kl))


def autoregressive_generate(pair: ModelPair, prompts, max_new_tokens: int = 64, temperature: float = 1.0,
                            top_k: int = 0, top_p: float = 1.0, batch_size: int = 8, seed: int = 0,
                            chat: bool = True) -> DecodeResult:
    """The baseline: the verifier alone, one forward per token, the same sampling transforms."""
    _check_args(1, batch_size, temperature, top_k, top_p)
    stats = DecodeStats("autoregressive")
    sampling = (temperature, top_k, top_p)
    return _run(pair, prompts, max_new_tokens, batch_size, seed, chat, stats,
                lambda b, gen: _ar_batch(pair, b, max_new_tokens, sampling, gen, stats))
