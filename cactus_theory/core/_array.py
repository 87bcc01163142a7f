"""Tiny array-API helpers so every formula runs unchanged on numpy and torch arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_torch_array

Array = Any  # numpy.ndarray or torch.Tensor

__all__ = ["Array", "xp_of", "gather", "scatter", "one_hot_like", "where0", "xlogy", "errstate"]


def xp_of(*xs: Array):
    """The array namespace (array-API wrapped torch if any argument is a tensor, else numpy)."""
    for x in xs:
        if is_torch_array(x):
            return array_namespace(x)
    return _NP


_NP = array_namespace(np.zeros(1))


def gather(x: Array, n: Array) -> Array:
    """``x[..., n]`` elementwise: ``x`` (..., V), ``n`` (...) integer -> (...)."""
    if is_torch_array(x):
        return x.gather(-1, n.long().unsqueeze(-1)).squeeze(-1)
    return np.take_along_axis(np.asarray(x), np.asarray(n)[..., None].astype(np.intp), axis=-1)[..., 0]


def one_hot_like(x: Array, n: Array) -> Array:
    """Boolean mask (..., V) that is True at position ``n`` of the last axis."""
    xp = xp_of(x)
    V = x.shape[-1]
    if is_torch_array(x):
        ar = xp.arange(V, device=x.device)
        return ar == n.long().unsqueeze(-1)
    return np.arange(V) == np.asarray(n)[..., None]


def scatter(x: Array, n: Array, value: Array) -> Array:
    """Copy of ``x`` (..., V) with ``x[..., n] = value`` (value broadcast to (...))."""
    xp = xp_of(x)
    return xp.where(one_hot_like(x, n), value[..., None] if hasattr(value, "shape") else value, x)


def where0(cond: Array, value: Array) -> Array:
    """``value`` where ``cond`` holds, else 0 (NaN/inf in the untaken branch are discarded)."""
    xp = xp_of(value)
    return xp.where(cond, value, xp.zeros_like(value))


def xlogy(x: Array, y: Array) -> Array:
    """``x * log(y)`` with the convention ``0 * log(anything) = 0`` (so ``0 log 0 = 0``)."""
    xp = xp_of(x, y)
    pos = x > 0
    y_safe = xp.where(pos, y, xp.ones_like(y))
    return where0(pos, x * xp.log(y_safe))


class errstate:
    """Silence numpy's divide/invalid warnings for log(0) = -inf, which our conventions use."""

    def __enter__(self):
        self._old = np.seterr(divide="ignore", invalid="ignore")

    def __exit__(self, *exc):
        np.seterr(**self._old)
