"""Dropout passes of a model's LM head, the primitive of DropMatch's inputs: ``dropout_logits`` (the
logits of ``S`` masked passes) and ``path_hits`` (one step's indicator of the tokens of sampled dropout
paths). No rule here: ``rules.DropMatch`` binds its step's ``hit`` with ``path_hits``, and
``dropmatch`` builds the path laws and step laws on ``dropout_logits``."""

from __future__ import annotations

import torch

from .draws import RowGenerators
from .transforms import check_sampling, sampling_probs
from .validate import check_positive_int

__all__ = ["check_rate", "check_head", "dropout_logits", "path_hits"]


def check_rate(rate) -> None:
    if isinstance(rate, bool) or not (isinstance(rate, (int, float)) and 0 <= rate < 1):
        raise ValueError(f"rate must be a dropout probability in [0, 1), got {rate!r}")


def check_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if weight.ndim != 2:
        raise ValueError(f"weight must be the head's (V, d) matrix, got shape {tuple(weight.shape)}")
    if hidden.ndim < 1 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden must be (..., d) with d = {weight.shape[1]} (the head's input size), got shape "
                         f"{tuple(hidden.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")


def dropout_logits(hidden: torch.Tensor, weight: torch.Tensor, rate: float, num_masks: int,
                   bias: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Logits of ``num_masks`` dropout passes of the head: ``W (m * x) / (1 - rate) + bias``.

    Args:
        hidden: ``[..., d]`` float. The head's input ``x`` (the verifier's final, normed hidden state).
        weight: ``[V, d]`` float. The head's weight ``W``.
        rate: dropout probability; each of the ``d`` inputs is zeroed independently with it.
        num_masks: ``S``, independent masks per position.
        bias: ``[V]`` or None.
        generator: draws the masks (on its device).
    Returns:
        ``[S, ..., V]`` float32 logits (computed in the head's dtype, then float32).
    """
    check_head(hidden, weight, bias)
    check_rate(rate)
    check_positive_int(num_masks, "num_masks")
    dev = generator.device if generator is not None else hidden.device
    keep = torch.rand((num_masks, *hidden.shape), generator=generator, device=dev).to(hidden.device) >= rate
    x = hidden.unsqueeze(0) * keep.to(hidden.dtype) / (1 - rate)
    out = torch.nn.functional.linear(x.to(weight.dtype), weight, bias)
    return out.float()


def path_hits(hidden: torch.Tensor, weight: torch.Tensor, rate: float, num_paths: int, *,
              sampling: tuple = (1.0, 0, 1.0), bias: torch.Tensor | None = None,
              generator: torch.Generator | None = None) -> torch.Tensor:
    """``hit`` (..., V) of one step: 1 at the tokens of ``num_paths`` sampled dropout paths of the head
    (each its own mask, then a token from the transformed logits), 0 elsewhere, in float32.
    ``generator``: a ``torch.Generator`` (or None), or a ``core.draws.RowGenerators`` with one generator per
    row of ``hidden``'s first axis (each row's paths then drawn from its own)."""
    check_sampling(*sampling)
    if isinstance(generator, RowGenerators):
        if hidden.ndim < 2 or hidden.shape[0] != len(generator):
            raise ValueError(f"generator: RowGenerators has {len(generator)} rows for hidden of shape "
                             f"{tuple(hidden.shape)} (one per row of its first axis)")
        return torch.cat([path_hits(hidden[b:b + 1], weight, rate, num_paths, sampling=sampling, bias=bias,
                                    generator=g) for b, g in enumerate(generator)])
    V = weight.shape[0]
    hit = torch.zeros((*hidden.shape[:-1], V), dtype=torch.float32, device=hidden.device)
    M = num_paths
    if M == 0:
        return hit
    with torch.inference_mode():
        pr = sampling_probs(dropout_logits(hidden, weight, rate, M, bias, generator), *sampling)  # (M, ..., V)
        flat = pr.reshape(-1, V)
        dev = generator.device if generator is not None else flat.device
        y = torch.multinomial(flat.to(dev), 1, generator=generator).to(flat.device).reshape(M, *hidden.shape[:-1])
        hit.scatter_(-1, y.movedim(0, -1), 1.0)
    return hit
