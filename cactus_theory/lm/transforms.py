"""Sampling transforms (temperature, top-k, top-p), applied identically to the draft's ``p`` and the
verifier's ``q`` before any rule sees them, exactly as a plain sampler applies them to ``q``.

Order (the usual one): divide logits by the temperature, keep the ``top_k`` largest (ties kept),
then keep the smallest set of most likely tokens whose mass reaches ``top_p`` (the token that
crosses ``top_p`` is kept), renormalise. ``temperature = 0`` means greedy (one-hot at the argmax).
Tokens with logit ``-inf`` (outside a draft's shortlist) get probability 0.
"""

from __future__ import annotations

import math

import torch

__all__ = ["check_sampling", "sampling_probs"]


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raise ``ValueError`` naming the first bad sampling parameter."""
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or not (0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")


def sampling_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0) -> torch.Tensor:
    """Logits (..., V) -> sampling probabilities (..., V) in float32 (see module docstring)."""
    x = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).float()
    x = x / temperature
    V = x.shape[-1]
    if 0 < top_k < V:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, -math.inf)
    if top_p < 1:
        srt, idx = x.sort(dim=-1, descending=True)
        pr = srt.softmax(-1)
        before = pr.cumsum(-1) - pr  # mass of strictly more likely tokens (in sorted order)
        drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, idx, before >= top_p)
        x = x.masked_fill(drop, -math.inf)
    return x.softmax(-1)
