"""Independent re-implementations of each rule's one-step law, for checking ``rules`` and ``sampler``.

Written from the formulas (PAPER.md, the authors' reference code, vLLM's and transformers' samplers) with plain numpy
and scipy loops over the drafted token ``n``, sharing no code with ``rules.py``, ``exact.py`` or
``divergences.py``: a wrong port in those modules (a recovery from ``q`` instead of ``h``, a ``>=``
where the reference has ``>``, a missing factor 2) makes the two disagree.

``reference_law(rule, p, q)`` is ``h_alg(y) = sum_n p_n [phi_n 1(y = n) + (1 - phi_n) g_n(y)]`` for one
row ``p``, ``q`` (float64, shape (V,)). ``reference_gamma(q_n, delta, divergence)`` is Theorem 2's
root by Brent's method on the two-point divergence. Slow (O(V^2)); for small vocabularies.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import rel_entr
from scipy.stats import entropy as scipy_entropy

__all__ = ["reference_law", "reference_step", "reference_gamma", "bernoulli_divergence", "COVERED"]

COVERED = ("SpS", "Cactus", "TAS", "TopK", "Interpolation", "EARS", "DropMatch", "Ensemble", "EntropyVerify",
           "Lenience", "MinP", "Eta", "FSD")
TINY32 = float(np.finfo(np.float32).tiny)  # float32's smallest normal number (vLLM 0.7.3's floor, transformers' "zero")


def bernoulli_divergence(g: float, q: float, divergence: str) -> float:
    """``D((g, 1 - g) || (q, 1 - q))`` from each f-divergence's textbook formula (scipy ``rel_entr``)."""
    a, b = np.array([g, 1 - g]), np.array([q, 1 - q])
    if divergence == "kl":
        return float(np.sum(rel_entr(a, b)))
    if divergence == "reverse_kl":
        return float(np.sum(rel_entr(b, a)))
    if divergence == "chi2":
        if np.any((b == 0) & (a > 0)):
            return math.inf
        return float(sum((x - y) ** 2 / y for x, y in zip(a, b, strict=True) if y > 0))
    if divergence == "tv":
        return float(np.abs(a - b).sum() / 2)
    if divergence == "hellinger":
        return float(1 - np.sum(np.sqrt(a * b)))
    if divergence == "js":
        m = (a + b) / 2
        return float(np.sum(rel_entr(a, m)) / 2 + np.sum(rel_entr(b, m)) / 2)
    raise ValueError(f"divergence must be one of kl, reverse_kl, chi2, tv, hellinger, js, got {divergence!r}")


def reference_gamma(q_n: float, delta: float, divergence: str = "kl") -> float:
    """Theorem 2: the largest ``gamma`` in ``[q_n, 1]`` with ``D((gamma, 1 - gamma) || (q_n, 1 - q_n)) <= delta``,
    by ``scipy.optimize.brentq`` (``xtol`` 1e-15); 1 when the budget allows 1, ``q_n`` when ``delta = 0``."""
    q_n = float(q_n)
    if delta == 0 or q_n >= 1:
        return q_n
    d = lambda g: bernoulli_divergence(g, q_n, divergence) - delta  # noqa: E731
    if d(1.0) <= 0:
        return 1.0
    if q_n == 0 and not math.isfinite(d(1e-300)):
        return 0.0  # KL / chi-square: any mass where q_n = 0 costs infinity
    return brentq(d, q_n, 1.0, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)


def _normalised_pos(r: np.ndarray, fallback: np.ndarray, authors: str = "") -> np.ndarray:
    """``(r)_+`` normalised, ``fallback`` if it is all zero. ``authors``: the reference code's degenerate cases,
    ``"floor"`` (vLLM 0.7.3: ``clamp(r, min=tiny)`` then normalise) or ``"token0"`` (an all-zero row sampled by
    vLLM 0.7.3's exponential race, ``argmax(0 / E)``: token 0)."""
    r = np.maximum(r, TINY32 if authors == "floor" else 0.0)
    z = r.sum()
    if z > 0:
        return r / z
    return np.eye(r.size)[0] if authors == "token0" else fallback


def _authors(rule, how: str) -> str:
    return how if getattr(rule, "convention", "ours") == "authors" else ""


def _target_step(h: np.ndarray, p: np.ndarray, n: int, authors: str = "") -> tuple[float, np.ndarray]:
    """Theorem 1 towards target ``h``: accept w.p. ``min(1, h_n / p_n)``, recover from ``(h - p)_+``."""
    return min(1.0, h[n] / p[n]), _normalised_pos(h - p, h, authors)


def _grid_accept(ratio: float, bits: int) -> float:
    """``P(r <= ratio)`` for ``r`` uniform on ``{m 2^-bits : m = 0 .. 2^bits - 1}``: counted for small ``bits``, from
    the exact rational ``floor(ratio 2^bits) + 1`` otherwise."""
    if bits <= 16:
        grid = np.arange(2**bits, dtype=np.float64) / 2.0**bits
        return float(np.count_nonzero(grid <= ratio)) / 2.0**bits
    from fractions import Fraction

    return float(min(Fraction(1), Fraction(math.floor(Fraction(min(ratio, 1.0)) * 2**bits) + 1, 2**bits)))


def _two_block(q: np.ndarray, n: int, gamma: float) -> np.ndarray:
    """``h_n = gamma``, ``h_i = q_i (1 - gamma) / (1 - q_n)`` (``h = q`` when ``q_n = 1``)."""
    if q[n] >= 1:
        return q.copy()
    h = q * (1 - gamma) / (1 - q[n])
    h[n] = gamma
    return h


def reference_step(rule, p: np.ndarray, q: np.ndarray, n: int) -> tuple[float, np.ndarray]:
    """``(phi_n, g_n)`` of ``rule`` for drafted token ``n`` (needs ``p_n > 0``), from the formulas.

    The rule's parameters are read from its attributes; its methods are never called."""
    kind = next((c.__name__ for c in type(rule).__mro__ if c.__name__ in COVERED), None)
    if kind == "SpS":
        bits = getattr(rule, "rand_bits", None)
        if bits is None:
            return _target_step(q, p, n)
        return _grid_accept(q[n] / p[n], bits), _normalised_pos(q - p, q)  # transformers <= 5.24: r <= q_n / p_n
    if kind == "Ensemble":  # transformers: 1 - w + w q_n / p_n; (q - p)_+, or q where it sums to <= float32's tiny
        w = rule.weight
        r = np.maximum(q - p, 0.0)
        return min(1.0, 1 - w + w * q[n] / p[n]), (r / r.sum() if r.sum() > TINY32 else q.copy())
    if kind == "Cactus":
        if rule.solver == "taylor":  # Corollary 5
            gamma = min(q[n] + math.sqrt(2 * q[n] * (1 - q[n]) * rule.delta), 1.0)  # q(1 - q) first: no inf * 0
        else:
            gamma = reference_gamma(q[n], rule.delta, rule.divergence)
        return _target_step(_two_block(q, n, gamma), p, n, _authors(rule, "token0"))
    if kind == "Interpolation":
        return _target_step(rule.alpha * p + (1 - rule.alpha) * q, p, n, _authors(rule, "floor"))
    if kind == "TAS":  # vLLM: accept iff q_n > min(eps, alpha exp(-H)), H = -sum q log(q + entropy_eps)
        eps = getattr(rule, "entropy_eps", 0.0)
        H = float(scipy_entropy(q)) if eps == 0 else float(-np.sum(np.where(q > 0, q * np.log(q + eps), 0.0)))
        accept = q[n] > min(rule.epsilon, rule.alpha * math.exp(-H))
        return float(accept), np.eye(q.size)[int(np.argmax(q))]
    if kind == "TopK":
        kth = np.sort(q)[::-1][rule.k - 1]
        accept = float(q[n] >= kth)
        if getattr(rule, "recovery", "q") == "q":
            return accept, q.copy()
        top = (q >= kth).astype(float)  # the authors': (1[q >= q_(k)] - p)_+, normalised
        return accept, _normalised_pos(top - p, top / top.sum(), _authors(rule, "token0"))
    if kind == "EARS":  # accept iff u < min(1, q_n / p_n + beta (1 - max q)); recover from (q - p)_+
        return min(1.0, q[n] / p[n] + rule.beta * (1 - q.max())), _normalised_pos(q - p, q)
    if kind == "DropMatch":  # bound to one row's hit (V,): accept if the base test passes or n is on a dropout path
        hit = float(np.asarray(rule.hit)[n])
        if rule.base == "match":  # the verifier's own sample y0 ~ q is one more path; recover y0 given y0 != n
            base = q[n]
            rest = q.copy()
            rest[n] = 0.0
            g = rest / rest.sum() if rest.sum() > 0 else q.copy()
        else:  # SpS's test, recovery from (q - p)_+
            base = min(1.0, q[n] / p[n])
            g = _normalised_pos(q - p, q)
        return base + (1 - base) * hit, g
    if kind in ("EntropyVerify", "Lenience"):  # vLLM-Ascend / Fast-HSD: accept iff q_n / p_n >= c u; recover (q - p)_+
        if kind == "Lenience":
            c = rule.lenience
        else:  # c = min(posterior_threshold, exp(-posterior_alpha * H)), H = -sum q log(q + eps)
            H = -sum(float(x) * math.log(float(x) + rule.entropy_eps) for x in q if x > 0)
            c = min(rule.threshold, math.exp(-rule.alpha * H))
        phi = 1.0 if c == 0 else min(1.0, q[n] / p[n] / c)
        return phi, _normalised_pos(q - p, q)
    if kind in ("MinP", "Eta"):  # target-only tests; a rejected n is zeroed in q, which is renormalised
        if kind == "MinP":
            accept = float(q[n] >= rule.min_p * q.max())
        else:
            tau = min(rule.epsilon, rule.delta * math.exp(-float(scipy_entropy(q))))
            accept = min(1.0, q[n] / tau) if rule.soft else float(q[n] >= tau)
        rest = q.copy()
        rest[n] = 0.0
        return accept, (rest / rest.sum() if rest.sum() > 0 else q.copy())
    if kind == "FSD":  # the whole rows: accept iff D(p, q) <= T (D as torch's kl_div(log a, b) = KL(b || a)); recover q
        kl = lambda a, b: float(np.sum(rel_entr(a, b)))  # noqa: E731  KL(a || b), inf where b = 0 < a
        if rule.divergence == "tv_div":
            d = 0.5 * float(np.abs(p - q).sum())
        elif rule.divergence == "kl_div":
            d = kl(p, q)
        else:
            m = (p + q) / 2
            d = 0.5 * kl(m, p) + 0.5 * kl(m, q)
        return float(d <= rule.threshold), q.copy()
    raise NotImplementedError(f"no reference implementation for {rule!r} (covered: {', '.join(COVERED)})")


def reference_law(rule, p, q) -> np.ndarray:
    """``h_alg = sum_n p_n [phi_n e_n + (1 - phi_n) g_n]`` for one row, from ``reference_step``."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    out = np.zeros(q.size)
    for n in np.flatnonzero(p > 0):
        phi, g = reference_step(rule, p, q, int(n))
        out[n] += p[n] * phi
        out += p[n] * (1 - phi) * g
    return out
