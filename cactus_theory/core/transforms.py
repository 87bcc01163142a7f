"""Sampling transforms (temperature, top-k, top-p), applied identically to the draft's ``p`` and the
verifier's ``q`` before any rule sees them, exactly as a plain sampler applies them to ``q``.

Order (the usual one): divide logits by the temperature, keep the ``top_k`` largest (ties at the
k-th value broken by ``torch.topk``), then keep the smallest set of most likely tokens whose mass
reaches ``top_p`` (the token that crosses ``top_p`` is kept), renormalise. With ``top_k`` set, the
top-p cut sorts only the ``top_k`` survivors, not the whole vocabulary. ``temperature = 0`` means greedy (one-hot at the argmax).
Tokens with logit ``-inf`` (outside a draft's shortlist) get probability 0. The settings as one value, and
the paper's default, are ``core.sampling.Sampling`` and ``SAMPLING``.
"""

from __future__ import annotations

import math

import torch

from .sampling import SAMPLING, Sampling, check_sampling

__all__ = ["check_sampling", "sampling_probs", "nucleus", "Sampling", "SAMPLING"]


def sampling_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0) -> torch.Tensor:
    """Logits (..., V) -> sampling probabilities (..., V) in float32 (see module docstring)."""
    x = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).float()
    x = x / temperature
    V = x.shape[-1]
    if 0 < top_k < V:
        vals, idx = x.topk(top_k, dim=-1)  # sorted, largest first
        if top_p < 1:
            vals = nucleus(vals, top_p)
        return torch.full_like(x, -math.inf).scatter(-1, idx, vals).softmax(-1)
    if top_p < 1:
        srt, idx = x.sort(dim=-1, descending=True)
        x = torch.full_like(x, -math.inf).scatter(-1, idx, nucleus(srt, top_p))
    return x.softmax(-1)


def nucleus(srt: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits sorted largest first -> the same with tokens past the top-p mass set to ``-inf``."""
    pr = srt.softmax(-1)
    before = pr.cumsum(-1) - pr  # mass of strictly more likely tokens
    return srt.masked_fill(before >= top_p, -math.inf)
