"""Acceptance rules for one verification step, written once for numpy (exact analysis) and torch.

Notation (the paper's): ``p`` draft distribution, ``q`` verifier distribution, both (..., V);
``n`` (...) the drafted token; ``h`` the target law of the step; ``gamma = h_n``.

Every rule exposes
    ``accept_prob(p, q, n)``  phi_n in [0, 1], shape (...)
    ``residual(p, q, n)``     recovery law g_n on rejection, shape (..., V), sums to 1
    ``target(p, q, n)``       h, for rules defined by a target distribution (SpS, Cactus, Interpolation)
and the one-step output law is ``sum_n p_n [phi_n e_n + (1 - phi_n) g_n]`` (see ``exact``).

Conventions shared by all rules (tested): a drafted token with ``p_n = 0`` is never accepted
(the draft could not have sampled it); acceptance only reads ``p_n``, ``q_n`` and, for TAS, TopK
and EARS, one statistic of the row ``q`` (entropy, k-th largest, max).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from array_api_compat import is_torch_array

from ._array import Array, errstate, gather, one_hot_like, scatter, where0, xp_of
from .divergences import F_DIVERGENCES, entropy
from .validate import check_nonneg, check_positive_int, check_probs, check_same_shape, check_token

__all__ = [
    "Rule", "TargetRule", "ScalingRule", "SpS", "Cactus", "TAS", "TopK", "Interpolation", "EARS",
    "two_block_divergence", "two_block_root", "taylor_gamma",
]


def _check_inputs(p: Array, q: Array, n: Array | None) -> None:
    check_same_shape(p, q, "p", "q")
    check_probs(p, "p")
    check_probs(q, "q")
    if n is not None:
        check_token(n, p.shape[-1], tuple(p.shape[:-1]), "n")


def _normalise(r: Array, fallback: Array) -> Array:
    """``r / sum(r)`` over the last axis; rows with zero mass are replaced by ``fallback``."""
    xp = xp_of(r)
    z = xp.sum(r, axis=-1, keepdims=True)
    ok = z > 0
    return xp.where(ok, r / xp.where(ok, z, xp.ones_like(z)), fallback)


def _pos(x: Array) -> Array:
    xp = xp_of(x)
    return xp.maximum(x, xp.zeros_like(x))


@dataclass(frozen=True)
class Rule:
    """Base class: a rule is ``phi(p_n, q_n, stats(q))`` plus a recovery law ``g_n``."""

    name: ClassVar[str] = "rule"

    # -- the two pieces each rule defines ------------------------------------------------
    def row_stats(self, q: Array) -> tuple:
        """Per-row statistics of ``q`` the acceptance test needs, each of shape (..., 1)."""
        return ()

    def phi(self, p_n: Array, q_n: Array, *stats: Array) -> Array:
        """Acceptance probability before the ``p_n = 0`` convention (elementwise)."""
        raise NotImplementedError

    def residual(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        """Recovery distribution ``g_n`` (..., V) used when the drafted token is rejected."""
        raise NotImplementedError

    # -- shared machinery -------------------------------------------------------------------
    def accept_from(self, p_n: Array, q_n: Array, *stats: Array) -> Array:
        """``phi_n`` clipped to [0, 1], with ``phi_n = 0`` where ``p_n = 0``."""
        xp = xp_of(p_n, q_n)
        phi = xp.clip(self.phi(p_n, q_n, *stats), 0.0, 1.0)
        return where0(p_n > 0, phi)

    def accept_prob(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        """``phi_n``: probability of accepting drafted token ``n``; (..., V) x2, (...) -> (...)."""
        if check:
            _check_inputs(p, q, n)
        stats = [s[..., 0] for s in self.row_stats(q)]
        return self.accept_from(gather(p, n), gather(q, n), *stats)

    def accept_prob_all(self, p: Array, q: Array) -> Array:
        """``phi_n`` for every candidate ``n`` at once: (..., V) -> (..., V)."""
        return self.accept_from(p, q, *self.row_stats(q))

    def target(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        raise TypeError(f"{type(self).__name__} is not defined by a target distribution h")


@dataclass(frozen=True)
class TargetRule(Rule):
    """Generalised speculative sampling towards a target ``h`` (Theorem 1).

    ``phi_n = min(1, h_n / p_n)``, ``g_n = (h - p)_+ / sum (h - p)_+``; the output is exactly ``h``
    when ``h`` does not depend on ``n``. If ``(h - p)_+ = 0`` (then every draft is accepted) ``g_n = h``.
    """

    def h_n(self, p_n: Array, q_n: Array) -> Array:
        """The target's mass on the drafted token, elementwise."""
        raise NotImplementedError

    def target_rows(self, p: Array, q: Array, n: Array) -> Array:
        raise NotImplementedError

    def phi(self, p_n, q_n, *stats):
        xp = xp_of(p_n, q_n)
        with errstate():
            return xp.where(p_n > 0, self.h_n(p_n, q_n) / xp.where(p_n > 0, p_n, xp.ones_like(p_n)), xp.zeros_like(p_n))

    def target(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        """The target distribution ``h`` (..., V) for drafted token ``n`` (...)."""
        if check:
            _check_inputs(p, q, n)
        return self.target_rows(p, q, n)

    def residual(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        """``g_n = (h - p)_+ / sum_i (h_i - p_i)_+`` (..., V)."""
        if check:
            _check_inputs(p, q, n)
        h = self.target_rows(p, q, n)
        return _normalise(_pos(h - p), h)


@dataclass(frozen=True)
class ScalingRule(TargetRule):
    """Two-block targets (Theorem 2's shape): ``h_n = gamma(q_n)``, ``h_i = q_i (1 - gamma)/(1 - q_n)``.

    Convention: ``q_n = 1`` gives ``h = q`` (the 0/0 scale is taken as 0, as ``q_i = 0`` for ``i != n``).
    """

    def gamma(self, q_n: Array) -> Array:
        raise NotImplementedError

    def h_n(self, p_n, q_n):
        return self.gamma(q_n)

    def scale(self, q_n: Array, gamma: Array) -> Array:
        """``s = (1 - gamma) / (1 - q_n)``, with ``s = 0`` where ``q_n = 1``."""
        xp = xp_of(q_n)
        room = 1 - q_n
        return where0(room > 0, (1 - gamma) / xp.where(room > 0, room, xp.ones_like(room)))

    def target_rows(self, p, q, n):
        q_n = gather(q, n)
        g = self.gamma(q_n)
        return scatter(q * self.scale(q_n, g)[..., None], n, g)


@dataclass(frozen=True)
class SpS(ScalingRule):
    """Standard speculative sampling: ``h = q``, ``phi_n = min(1, q_n / p_n)``, ``g_n = (q - p)_+``."""

    name: ClassVar[str] = "sps"

    def gamma(self, q_n):
        return q_n


def taylor_gamma(q_n: Array, delta: float) -> Array:
    """Corollary 5: ``gamma* = min{q_n + sqrt(2 delta q_n (1 - q_n)), 1}``, with ``q_n`` first clipped
    to [0, 1] (low-precision rows can stray outside), so the square root never sees a negative."""
    xp = xp_of(q_n)
    qc = xp.clip(q_n, 0.0, 1.0)
    return xp.clip(qc + xp.sqrt(xp.clip(2 * delta * qc * (1 - qc), 0.0, None)), qc, xp.ones_like(qc))


def two_block_divergence(gamma: Array, q_n: Array, divergence: str = "kl") -> Array:
    """Theorem 2's constraint: ``q_n f(gamma/q_n) + (1 - q_n) f((1 - gamma)/(1 - q_n))``,
    i.e. ``D((gamma, 1 - gamma) || (q_n, 1 - q_n))``, evaluated by the divergence's own code."""
    xp = xp_of(gamma, q_n)
    h2 = xp.stack([gamma, 1 - gamma], axis=-1)
    q2 = xp.stack([q_n, 1 - q_n], axis=-1)
    return F_DIVERGENCES[divergence](h2, q2)


def _closed_form_root(q_n: Array, delta: float, divergence: str) -> Array | None:
    """Closed-form roots of Theorem 2's equation where they exist (before clipping to [q_n, 1])."""
    xp = xp_of(q_n)
    if divergence == "chi2":  # (gamma - q)^2 / (q (1 - q)) = delta
        return q_n + xp.sqrt(delta * q_n * (1 - q_n))
    if divergence == "tv":  # gamma - q = delta
        return q_n + delta
    if divergence == "hellinger":  # 1 - cos(b - a) = delta, q = sin^2 a, gamma = sin^2 b
        if delta >= 1:
            return xp.ones_like(q_n)
        a = xp.asin(xp.sqrt(q_n))
        b = xp.clip(a + math.acos(1 - delta), None, math.pi / 2 + 0 * a)
        return xp.sin(b) ** 2
    return None


def two_block_root(q_n: Array, delta: float, divergence: str = "kl", iters: int = 100,
                   method: str = "auto") -> Array:
    """Theorem 2's ``gamma*``: the largest ``gamma`` in ``[q_n, 1]`` with
    ``q_n f(gamma/q_n) + (1 - q_n) f((1 - gamma)/(1 - q_n)) <= delta`` (1 if the budget allows 1).

    ``method="auto"`` uses a closed form for chi2, TV and Hellinger and a bracketing solve otherwise
    (``"bisect"`` forces the bracketing solve). The bracket ``[lo, hi]`` keeps ``D(lo) <= delta < D(hi)``
    and shrinks by Illinois regula falsi steps (bisection where the secant is unusable, e.g. an
    infinite ``D(hi)``) until it is below float64 resolution (``hi - lo <= 2^-52 hi + 1e-18``) or
    ``iters`` steps; the feasible end ``lo`` is returned, so the constraint always holds.
    """
    xp = xp_of(q_n)
    q = xp.clip(q_n, 0.0, 1.0)
    one = xp.ones_like(q)
    if delta == 0:  # only h = q is feasible; a bracket would stop ~1e-8 above q_n (D ~ (gamma - q_n)^2)
        return q
    if method == "auto":
        g = _closed_form_root(q, delta, divergence)
        if g is not None:
            return xp.clip(g, q, one)
    with errstate():
        f_hi = two_block_divergence(one, q, divergence) - delta
        done = f_hi <= 0
        lo, hi, f_lo = q, one, xp.zeros_like(q) - delta  # D(q_n) = 0
        last_ok = xp.zeros_like(q)  # +1: lo moved last step, -1: hi moved, 0: neither yet
        for _ in range(iters):
            width = hi - lo
            if bool(xp.all(done | (width <= 2.0**-52 * hi + 1e-18))):
                break
            sec = lo - f_lo * width / (f_hi - f_lo)
            use = xp.isfinite(sec) & (sec > lo) & (sec < hi)
            x = xp.where(use, sec, (lo + hi) / 2)
            f_x = two_block_divergence(x, q, divergence) - delta
            ok = f_x <= 0
            lo, f_lo = xp.where(ok, x, lo), xp.where(ok, f_x, f_lo)
            hi, f_hi = xp.where(ok, hi, x), xp.where(ok, f_hi, f_x)
            # Illinois: an end kept twice in a row has its value halved, so both ends converge
            f_hi = xp.where(ok & (last_ok > 0), f_hi / 2, f_hi)
            f_lo = xp.where(~ok & (last_ok < 0), f_lo / 2, f_lo)
            last_ok = xp.where(ok, one, -one)
    return xp.where(done, one, lo)


@dataclass(frozen=True)
class Cactus(ScalingRule):
    """Cactus: the optimum of ``max h_n`` s.t. ``D_f(h || q) <= delta`` (Theorem 2), two-block shape.

    ``solver="taylor"``: Corollary 5's closed form ``gamma* = min{q_n + sqrt(2 delta q_n (1-q_n)), 1}``
    (KL only). ``solver="exact"``: the root of Theorem 2's two-block equation for ``divergence`` in
    ``kl``, ``reverse_kl``, ``chi2``, ``tv``, ``hellinger``, ``js``. ``gamma`` is clipped to
    ``[q_n, 1]``; ``delta = 0`` is SpS; ``q_n = 1`` gives ``h = q``.
    """

    delta: float = 1.0
    divergence: str = "kl"
    solver: str = "taylor"
    name: ClassVar[str] = "cactus"

    def __post_init__(self):
        check_nonneg(self.delta, "delta")
        if self.divergence not in F_DIVERGENCES:
            raise ValueError(f"divergence must be one of {sorted(F_DIVERGENCES)}, got {self.divergence!r}")
        if self.solver not in ("taylor", "exact"):
            raise ValueError(f"solver must be 'taylor' or 'exact', got {self.solver!r}")
        if self.solver == "taylor" and self.divergence != "kl":
            raise ValueError(
                f"solver='taylor' (Corollary 5) is defined for divergence='kl' only, got "
                f"divergence={self.divergence!r}; use solver='exact'"
            )

    def gamma(self, q_n):
        if self.solver == "taylor":
            return taylor_gamma(q_n, self.delta)
        return two_block_root(q_n, self.delta, self.divergence)


@dataclass(frozen=True)
class Interpolation(TargetRule):
    """Target ``h = alpha p + (1 - alpha) q``: ``phi_n = min(1, alpha + (1 - alpha) q_n / p_n)``,
    recovery ``(h - p)_+ = (1 - alpha)(q - p)_+``; the output law is exactly ``h``."""

    alpha: float = 0.5
    name: ClassVar[str] = "interpolation"

    def __post_init__(self):
        if not (isinstance(self.alpha, (int, float)) and 0 <= self.alpha <= 1):
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha!r}")

    def h_n(self, p_n, q_n):
        return self.alpha * p_n + (1 - self.alpha) * q_n

    def target_rows(self, p, q, n):
        return self.alpha * p + (1 - self.alpha) * q


@dataclass(frozen=True)
class TAS(Rule):
    """Typical acceptance sampling (Medusa / vLLM): accept ``n`` deterministically iff
    ``q_n > min(epsilon, alpha exp(-H(q)))``; on rejection emit ``argmax q`` (as vLLM does).

    Proposition 4: equivalently ``H(e_n, q) = -log q_n < max(-log epsilon, H(q) - log alpha)``
    (see ``cross_entropy_threshold``).
    """

    epsilon: float = 0.09
    alpha: float = 0.3
    name: ClassVar[str] = "tas"

    def __post_init__(self):
        for k in ("epsilon", "alpha"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ValueError(f"{k} must be a positive number, got {v!r}")

    def row_stats(self, q):
        xp = xp_of(q)
        return (xp.exp(-entropy(q))[..., None],)

    def threshold(self, q: Array) -> Array:
        """``min(epsilon, alpha exp(-H(q)))`` per row: (..., V) -> (...)."""
        xp = xp_of(q)
        return xp.clip(self.alpha * xp.exp(-entropy(q)), None, self.epsilon)

    def cross_entropy_threshold(self, q: Array) -> Array:
        """Proposition 4's threshold ``max(-log epsilon, H(q) - log alpha)`` on ``-log q_n``."""
        xp = xp_of(q)
        return xp.clip(entropy(q) - math.log(self.alpha), -math.log(self.epsilon), None)

    def phi(self, p_n, q_n, exp_neg_h):
        xp = xp_of(q_n)
        thr = xp.clip(self.alpha * exp_neg_h, None, self.epsilon)
        return xp.astype(q_n > thr, q_n.dtype)

    def residual(self, p, q, n, *, check=True):
        """``g_n = e_{argmax q}`` for every ``n``."""
        if check:
            _check_inputs(p, q, n)
        xp = xp_of(q)
        return xp.astype(one_hot_like(q, xp.argmax(q, axis=-1)), q.dtype)


@dataclass(frozen=True)
class TopK(Rule):
    """Top-k acceptance: accept ``n`` iff ``q_n >= `` the k-th largest ``q`` (ties accepted);
    on rejection sample from ``q``."""

    k: int = 1
    name: ClassVar[str] = "topk"

    def __post_init__(self):
        check_positive_int(self.k, "k")

    def row_stats(self, q):
        k = min(int(self.k), q.shape[-1])
        if is_torch_array(q):
            return (q.topk(k, dim=-1).values[..., -1:],)
        V = q.shape[-1]
        return (np.partition(q, V - k, axis=-1)[..., V - k: V - k + 1],)

    def phi(self, p_n, q_n, kth):
        xp = xp_of(q_n)
        return xp.where(q_n >= kth, xp.ones_like(q_n), xp.zeros_like(q_n))

    def residual(self, p, q, n, *, check=True):
        """``g_n = q``."""
        if check:
            _check_inputs(p, q, n)
        return q + 0 * p


@dataclass(frozen=True)
class EARS(Rule):
    """EARS (arXiv 2512.13194): accept iff ``u < min(1, q_n / p_n + beta (1 - max q))``;
    on rejection sample from ``(q - p)_+`` normalised (``q`` if that is zero). ``beta = 0`` is SpS."""

    beta: float = 0.5
    name: ClassVar[str] = "ears"

    def __post_init__(self):
        check_nonneg(self.beta, "beta")

    def row_stats(self, q):
        xp = xp_of(q)
        return (xp.max(q, axis=-1, keepdims=True),)

    def phi(self, p_n, q_n, qmax):
        xp = xp_of(p_n, q_n)
        with errstate():
            ratio = q_n / xp.where(p_n > 0, p_n, xp.ones_like(p_n))
        return ratio + self.beta * (1 - qmax)

    def residual(self, p, q, n, *, check=True):
        """``g_n = (q - p)_+ / sum (q - p)_+``."""
        if check:
            _check_inputs(p, q, n)
        return _normalise(_pos(q - p), q + 0 * p)
