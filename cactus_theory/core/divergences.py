"""f-divergences ``D_f(h || q) = sum_i q_i f(h_i / q_i)`` and cross-entropy, batched over leading axes.

All functions take ``(h, q)`` of shape (..., V) (numpy or torch) and return shape (...).
Conventions: ``0 log 0 = 0``; a term with ``q_i = 0 < h_i`` contributes ``h_i * lim_{t->inf} f(t)/t``
(``+inf`` for KL and chi-square, ``1/2`` for TV and Hellinger, ``0`` for reverse KL, ``log 2 / 2`` for JS).

=============  ===========================  =========================================
name           generator ``f(t)``           formula
=============  ===========================  =========================================
``kl``         ``t log t``                  ``sum h log(h / q)``
``reverse_kl`` ``-log t``                   ``sum q log(q / h)`` = KL(q || h)
``chi2``       ``(t - 1)^2``                ``sum (h - q)^2 / q``
``tv``         ``|t - 1| / 2``              ``sum |h - q| / 2``
``hellinger``  ``(sqrt t - 1)^2 / 2``       ``sum (sqrt h - sqrt q)^2 / 2`` (squared, in [0, 1])
``js``         see ``js``                   ``KL(h || m)/2 + KL(q || m)/2``, ``m = (h + q)/2``
=============  ===========================  =========================================
"""

from __future__ import annotations

from ._array import Array, errstate, where0, xlogy, xp_of
from .validate import check_array_kind, check_probs, check_same_shape

__all__ = [
    "kl", "reverse_kl", "chi2", "tv", "hellinger", "js", "cross_entropy", "entropy",
    "divergence", "DIVERGENCES", "F_DIVERGENCES",
]


def kl(h: Array, q: Array) -> Array:
    """``KL(h || q) = sum_i h_i log(h_i / q_i)`` (nats); ``+inf`` if ``h_i > 0 = q_i``. Rounding
    can make the sum a few ulps negative when ``h = q``; it is clipped at 0 (KL is never negative)."""
    xp = xp_of(h, q)
    with errstate():
        d = xp.sum(xlogy(h, h) - xlogy(h, q), axis=-1)
        return xp.maximum(d, xp.zeros_like(d))


def reverse_kl(h: Array, q: Array) -> Array:
    """Reverse KL ``sum_i q_i log(q_i / h_i) = KL(q || h)``; ``+inf`` if ``q_i > 0 = h_i``."""
    return kl(q, h)


def chi2(h: Array, q: Array) -> Array:
    """Pearson chi-square ``sum_i (h_i - q_i)^2 / q_i``; ``+inf`` if ``h_i > 0 = q_i``."""
    xp = xp_of(h, q)
    with errstate():
        d2 = (h - q) ** 2
        return xp.sum(where0(d2 > 0, d2 / q), axis=-1)


def tv(h: Array, q: Array) -> Array:
    """Total variation ``sum_i |h_i - q_i| / 2``, in [0, 1]."""
    xp = xp_of(h, q)
    return xp.sum(xp.abs(h - q), axis=-1) / 2


def hellinger(h: Array, q: Array) -> Array:
    """Squared Hellinger ``sum_i (sqrt h_i - sqrt q_i)^2 / 2``, in [0, 1]."""
    xp = xp_of(h, q)
    z = xp.zeros_like(h)
    return xp.sum((xp.sqrt(xp.maximum(h, z)) - xp.sqrt(xp.maximum(q, z))) ** 2, axis=-1) / 2


def js(h: Array, q: Array) -> Array:
    """Jensen-Shannon ``KL(h || m)/2 + KL(q || m)/2`` with ``m = (h + q)/2``, in [0, log 2]."""
    m = (h + q) / 2
    return kl(h, m) / 2 + kl(q, m) / 2


def cross_entropy(h: Array, q: Array) -> Array:
    """Cross-entropy ``H(h, q) = -sum_i h_i log q_i = KL(h || q) + H(h)``; for one-hot ``h = e_n``
    it is ``-log q_n``."""
    xp = xp_of(h, q)
    with errstate():
        return -xp.sum(xlogy(h, q), axis=-1)


def entropy(q: Array) -> Array:
    """Shannon entropy ``H(q) = -sum_i q_i log q_i`` (nats)."""
    return cross_entropy(q, q)


F_DIVERGENCES = {"kl": kl, "reverse_kl": reverse_kl, "chi2": chi2, "tv": tv, "hellinger": hellinger, "js": js}
DIVERGENCES = {**F_DIVERGENCES, "cross_entropy": cross_entropy}


def divergence(h: Array, q: Array, name: str = "kl", *, check: bool = True) -> Array:
    """``D(h || q)`` for ``name`` in ``DIVERGENCES``; shapes (..., V) -> (...).

    With ``check`` (default) both arguments are validated as probability rows of equal shape.
    """
    if not isinstance(name, str) or name not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {sorted(DIVERGENCES)}, got {name!r}")
    if check:
        check_array_kind(h, q, names=("h", "q"))
        check_same_shape(h, q, "h", "q")
        check_probs(h, "h")
        check_probs(q, "q")
    return DIVERGENCES[name](h, q)
