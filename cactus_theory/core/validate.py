"""Input validation: every public entry point checks its arguments and names the bad one.

Tolerances (stated once, used everywhere): a probability row must be finite, non-negative
(entries down to ``-PROB_ATOL`` are treated as rounding and accepted) and sum to 1 within
``PROB_ATOL``: 1e-6 for float64, 1e-4 for float32, 1e-2 for float16 / bfloat16.
"""

from __future__ import annotations

import math

import numpy as np
from array_api_compat import is_torch_array

from ._array import Array

__all__ = ["prob_atol", "check_probs", "check_same_shape", "check_token", "check_pqn", "check_nonneg",
           "check_positive_int", "check_array_kind", "check_number", "check_int", "check_prob_param",
           "InputTypeError", "FLOAT16_MAX", "FLOAT16_TINY", "FLOAT32_MAX"]

FLOAT16_MAX = 65504.0  # the largest finite float16
FLOAT16_TINY = 2.0 ** -24  # the smallest positive float16 (a subnormal, about 5.96e-08)
FLOAT32_MAX = float(np.finfo(np.float32).max)  # about 3.4e38


class InputTypeError(TypeError, ValueError):
    """An argument of the wrong type (a bool, a string, an array where a number goes). A ``TypeError``,
    and a ``ValueError`` too, so callers that catch either (the CLI's one-line errors catch
    ``ValueError``) see it."""


def prob_atol(x: Array) -> float:
    """Tolerance on the row sums of ``x``, by dtype (see module docstring)."""
    name = str(x.dtype).replace("torch.", "")
    if name == "float64":
        return 1e-6
    if name == "float32":
        return 1e-4
    return 1e-2


def _describe(bad) -> str:
    return np.array2string(np.asarray(bad)[:5], precision=6, separator=", ")


def _rows_ok(x: Array, atol: float) -> bool:
    """Fast screen: one row-sum reduction and one global minimum, no copy of ``x``.

    A NaN propagates into both reductions and an infinity into its row's sum, so finiteness needs
    no pass of its own; only a ``bool`` comes back to the host. Row sums accumulate in the input's
    precision (float32 for float16 / bfloat16), far inside the tolerances of ``prob_atol``.
    """
    if is_torch_array(x):
        import torch  # already loaded: x is a tensor

        half = x.dtype in (torch.float16, torch.bfloat16)
        sums = x.sum(-1, dtype=torch.float32) if half else x.sum(-1)
        # the minimum row by row first: a full x.min() of an expanded (stride-0) view is ~25x slower
        return bool((x.amin(-1).min() >= -atol) & ((sums - 1).abs() <= atol).all())
    with np.errstate(invalid="ignore"):
        return bool(x.min() >= -atol) and bool(np.all(np.abs(x.sum(-1) - 1) <= atol))


def _raise_first_problem(x: Array, name: str, atol: float) -> None:
    """The slow, exact diagnosis (float64) behind a failed screen: raise naming the first problem."""
    if is_torch_array(x):
        xf = x.detach().double()  # reductions stay on x's device
        finite, mn = bool(xf.isfinite().all()), float(xf.min())
        sums = xf.sum(-1).flatten().cpu().numpy()
    else:
        finite, mn = bool(np.all(np.isfinite(x))), float(x.min())
        sums = np.ravel(x.astype(np.float64).sum(-1))
    if not finite:
        raise ValueError(f"{name} contains NaN or infinite entries")
    if mn < -atol:
        raise ValueError(f"{name} has a negative probability {mn:.3g} (tolerance {atol:g})")
    dev = np.abs(sums - 1)
    if dev.size and dev.max() > atol:
        raise ValueError(
            f"{name} is not normalised: row sums {_describe(sums[dev > atol])} differ from 1 by "
            f"up to {dev.max():.3g} (tolerance {atol:g})"
        )


def check_probs(x: Array, name: str) -> None:
    """Raise ``ValueError`` unless ``x`` (..., V) holds probability rows over its last axis.

    Cost: two reductions over ``x`` in its own dtype and device (row sums, global minimum) and
    no copy; the float64 diagnosis that names the problem runs only when that screen fails.
    Reusable by any entry point that takes probability rows (``sampler.verify`` calls it on its
    ``(B, k, V)`` inputs as they are).
    """
    if is_torch_array(x):
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    else:
        x = np.asarray(x)
        if not np.issubdtype(x.dtype, np.floating):
            raise ValueError(f"{name} must hold floating-point probabilities, got dtype {x.dtype}")
    if x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(f"{name} must have a vocabulary axis last, got shape {tuple(x.shape)}")
    if math.prod(x.shape) == 0:
        return
    atol = prob_atol(x)
    if not _rows_ok(x, atol):
        _raise_first_problem(x, name, atol)


def check_same_shape(a: Array, b: Array, name_a: str = "p", name_b: str = "q") -> None:
    """Raise ``ValueError`` unless ``a`` and ``b`` have identical shapes."""
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"{name_a} and {name_b} must have the same shape (same vocabulary), got "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_token(n: Array, V: int, batch_shape: tuple, name: str = "n") -> None:
    """Raise ``ValueError`` unless ``n`` is an integer array of shape ``batch_shape`` in [0, V)."""
    if is_torch_array(n):
        if n.is_floating_point() or str(n.dtype) == "torch.bool":
            raise ValueError(f"{name} must hold integer token ids, got dtype {n.dtype}")
        arr = n.detach().cpu().numpy()
    else:
        arr = np.asarray(n)
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    if tuple(arr.shape) != tuple(batch_shape):
        raise ValueError(
            f"{name} must have shape {tuple(batch_shape)} (the leading axes of p and q), "
            f"got {tuple(arr.shape)}"
        )
    if arr.size and (arr.min() < 0 or arr.max() >= V):
        bad = arr[(arr < 0) | (arr >= V)]
        raise ValueError(f"{name} has token ids out of range [0, {V}): {_describe(bad)}")


def check_pqn(p: Array, q: Array, n: Array | None = None) -> None:
    """The inputs of a rule or an exact law: ``p`` and ``q`` (..., V) probability rows of one shape
    and, if given, drafted tokens ``n`` (...) in ``[0, V)``; both numpy or both torch (see ``check_array_kind``)."""
    check_array_kind(p, q, n)
    check_same_shape(p, q, "p", "q")
    check_probs(p, "p")
    check_probs(q, "q")
    if n is not None:
        check_token(n, p.shape[-1], tuple(p.shape[:-1]), "n")


def _scalar(value, name: str, integer: bool, what: str):
    """``value`` as a Python ``int`` / ``float``: Python and numpy numbers (and 0-d numpy arrays) are
    accepted alike; bools, strings, arrays and everything else are refused (``InputTypeError``)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (bool, np.bool_)):
        raise InputTypeError(f"{name} must be {what}, got {value!r} (a bool)")
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating) and not integer:
        return float(value)
    if isinstance(value, int) or (isinstance(value, float) and not integer):
        return value
    raise InputTypeError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")


def _interval(low, high, low_open: bool, high_open: bool) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low:g}"
    lo = "-inf" if low is None else f"{low:g}"
    return f"in {'(' if low_open or low is None else '['}{lo}, {high:g}{')' if high_open else ']'}"


def check_number(value, name: str, *, low: float | None = None, high: float | None = None, low_open: bool = False,
                 high_open: bool = False, what: str | None = None, why_high: str = "") -> int | float:
    """The one validator of a real parameter: return ``value`` as a Python number or raise naming ``name``
    and the value. Python and numpy numbers are accepted alike (a numpy scalar comes back as ``int`` /
    ``float``; a Python ``int`` stays an ``int``, so reprs do not change); a bool or a non-number raises
    ``InputTypeError``; NaN, an infinity, or a value outside ``[low, high]`` (``(`` / ``)`` where open)
    raises ``ValueError``. ``what`` describes the domain in the message (default from the bounds);
    ``why_high`` explains an upper bound that is a limit of the arithmetic, not of the definition
    (a parameter that must stay representable in the dtype it is applied in)."""
    what = what or (f"a finite number {_interval(low, high, low_open, high_open)}" if low is not None or high is not None
                     else "a finite number")
    v = _scalar(value, name, False, what)
    try:
        finite = math.isfinite(v)
    except OverflowError:  # a Python int beyond float64's range
        finite = False
    if not finite:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if low is not None and (v <= low if low_open else v < low):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if high is not None and (v >= high if high_open else v > high):
        why = f" ({why_high})" if why_high else ""
        raise ValueError(f"{name} must be {what}{why}, got {value!r}")
    return v


def check_int(value, name: str, *, low: int | None = None) -> int:
    """An integer parameter (Python or numpy integer, not a bool, not a float) ``>= low``: returned as a
    Python ``int``."""
    what = "an integer" if low is None else f"an integer >= {low}"
    v = _scalar(value, name, True, what)
    if low is not None and v < low:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return v


def check_nonneg(value, name: str, *, high: float | None = None, why_high: str = "") -> int | float:
    """A finite number >= 0 (``check_number``); returns it as a Python number."""
    what = "finite and >= 0" if high is None else f"a finite number in [0, {high:g}]"
    return check_number(value, name, low=0.0, high=high, what=what, why_high=why_high)


def check_positive_int(value, name: str) -> int:
    """An integer (Python or numpy, not a bool) >= 1; returns it as a Python ``int``."""
    return check_int(value, name, low=1)


def check_prob_param(value, name: str, *, low_open: bool = False, high_open: bool = False) -> float:
    """A probability-valued parameter in [0, 1] (``(0`` with ``low_open``, ``1)`` with ``high_open``)."""
    return check_number(value, name, low=0.0, high=1.0, low_open=low_open, high_open=high_open,
                        what=f"a number {_interval(0.0, 1.0, low_open, high_open)}")


def _kind(x) -> str | None:
    if is_torch_array(x):
        return "torch"
    if isinstance(x, (np.ndarray, np.generic)):  # a numpy scalar is a 0-d array (refused for its shape)
        return "numpy"
    return None


def check_array_kind(p, q, n=None, *, names: tuple[str, str] = ("p", "q")) -> None:
    """Raise ``ValueError`` unless ``p`` and ``q`` are both numpy arrays or both torch tensors (a
    Python list is refused, not guessed), and a torch ``n`` goes with torch ``p`` / ``q``."""
    a, b = names
    for name, x in ((a, p), (b, q)):
        if _kind(x) is None:
            raise ValueError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")
    if _kind(p) != _kind(q):
        raise ValueError(f"{a} and {b} must both be numpy arrays or both torch tensors, got a {_kind(p)} {a} "
                         f"and a {_kind(q)} {b}")
    if n is not None and _kind(p) == "torch" and _kind(n) != "torch":
        raise ValueError(f"n must be a torch tensor when p and q are, got {type(n).__name__}")
