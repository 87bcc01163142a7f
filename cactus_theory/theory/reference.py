"""Independent re-implementations of each rule's one-step law, for checking ``rules`` and ``sampler``.

Written from the formulas (PAPER.md, the authors' reference code, vLLM's and transformers' samplers) with plain numpy
and scipy loops over the drafted token ``n``, sharing no code with ``rules.py``, ``exact.py`` or
``divergences.py``: a wrong port in those modules (a recovery from ``q`` instead of ``h``, a ``>=``
where the reference has ``>``, a missing factor 2) makes the two disagree.

``reference_law(rule, p, q)`` is ``h_alg(y) = sum_n p_n [phi_n 1(y = n) + (1 - phi_n) g_n(y)]`` for one
row ``p``, ``q`` (float64, shape (V,)). ``reference_gamma(q_n, delta, divergence)`` is Theorem 2's
root by Brent's method on the two-point divergence; ``reference_rule_gamma(rule, q_n)`` a two-block
rule's ``gamma``; ``reference_bonus(rule, q)`` the law of the bonus token. Slow (O(V^2)); for small
vocabularies. Every registry rule is covered (``COVERED``; the conformance harness in
``tests/conformance`` refuses a registry rule without a reference here).

The production rules (SGLang's threshold, relaxed acceptance, Medusa's typical acceptance, vLLM's FLy)
are written from their upstream kernels' conditions as ``rules.py``'s docstrings quote them: plain
Python sorts for ranks, ``math.log`` loops for entropies. So are issue 27's (vLLM-Ascend's entropy verification,
Fast-HSD's lenience, min-p and eta, FSD's test on the pair of rows, its divergences from scipy's ``rel_entr``), and
issue 42's (relaxed-spec-dec-repro's SpecCascades OPT and Tok3, mentored decoding, SCD and r-fuzzy as Theorem 1
towards a target built token by token in a loop; MAX's eps rule, its sampled verdict and sample-and-match).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.optimize import brentq
from scipy.special import rel_entr
from scipy.stats import entropy as scipy_entropy

__all__ = ["reference_law", "reference_step", "reference_gamma", "reference_rule_gamma", "reference_bonus",
           "bernoulli_divergence", "COVERED"]

COVERED = ("SpS", "Cactus", "TAS", "TopK", "Interpolation", "EARS", "DropMatch", "Ensemble", "SGLangThreshold",
           "RelaxedAcceptance", "MedusaTypical", "FLy", "EntropyVerify", "Lenience", "MinP", "Eta", "FSD",
           "CascadeDefer", "Tok3", "Mentored", "SCD", "RFuzzy", "MaxEps", "MaxSampled", "SampleMatch")
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


@lru_cache(maxsize=1 << 16)
def reference_gamma(q_n: float, delta: float, divergence: str = "kl") -> float:
    """Theorem 2: the largest ``gamma`` in ``[q_n, 1]`` with ``D((gamma, 1 - gamma) || (q_n, 1 - q_n)) <= delta``,
    by ``scipy.optimize.brentq`` (relative precision 4 eps); 1 when the budget allows 1, ``q_n`` when ``delta = 0``."""
    q_n = float(q_n)
    if delta == 0 or q_n >= 1:
        return q_n
    d = lambda g: bernoulli_divergence(g, q_n, divergence) - delta  # noqa: E731
    if d(1.0) <= 0:
        return 1.0
    if q_n == 0 and not math.isfinite(d(1e-300)):
        return 0.0  # KL / chi-square: any mass where q_n = 0 costs infinity
    return brentq(d, q_n, 1.0, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)  # relative precision: tiny q_n too


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
    """Theorem 1 towards target ``h``: accept w.p. ``min(1, h_n / p_n)``, recover from ``(h - p)_+``. Where
    ``p_n = 0`` the ratio is ``h_n / 0``: infinite (accepted) if ``h_n > 0`` in the authors' code (``authors`` set),
    never accepted in ours."""
    if p[n] <= 0:
        return (1.0 if authors and h[n] > 0 else 0.0), _normalised_pos(h - p, h, authors)
    return min(1.0, h[n] / p[n]), _normalised_pos(h - p, h, authors)


def _grid_accept(ratio: float, bits: int) -> float:
    """``P(r <= ratio)`` for ``r`` uniform on ``{m 2^-bits : m = 0 .. 2^bits - 1}``: counted for small ``bits``, from
    the exact rational ``floor(ratio 2^bits) + 1`` otherwise."""
    if bits <= 16:
        grid = np.arange(2**bits, dtype=np.float64) / 2.0**bits
        return float(np.count_nonzero(grid <= ratio)) / 2.0**bits
    from fractions import Fraction

    return float(min(Fraction(1), Fraction(math.floor(Fraction(min(ratio, 1.0)) * 2**bits) + 1, 2**bits)))


_STATS: dict = {}  # per-row statistics of q, keyed by (name, parameters, q's bytes): one computation per row


def _row_stat(name: str, q: np.ndarray, params: tuple, fn):
    """``fn(q)`` memoised on the row's bytes (a rule's statistic is the same for every drafted ``n``)."""
    key = (name, params, q.tobytes())
    if key not in _STATS:
        if len(_STATS) > 4096:
            _STATS.clear()
        _STATS[key] = fn(q)
    return _STATS[key]


def _one_hot(V: int, i: int) -> np.ndarray:
    e = np.zeros(V)
    e[i] = 1.0
    return e


def _first_argmax(q: np.ndarray) -> int:
    """The lowest id among the largest entries of ``q`` (a plain loop over the row)."""
    def scan(q):
        best = 0
        for i, x in enumerate(q.tolist()):
            if x > q[best]:
                best = i
        return best

    return _row_stat("argmax", q, (), scan)


def _without(q: np.ndarray, n: int) -> np.ndarray:
    """``q`` with token ``n`` removed, renormalised; ``q`` itself when nothing else is left."""
    rest = q.copy()
    rest[n] = 0.0
    return rest / rest.sum() if rest.sum() > 0 else q.copy()


def _medusa_entropy(q: np.ndarray, eps: float) -> float:
    """``-sum_{q_i > 0} q_i log(q_i + eps)``, term by term."""
    return -math.fsum(float(x) * math.log(float(x) + eps) for x in q if x > 0)


def _two_block(q: np.ndarray, n: int, gamma: float) -> np.ndarray:
    """``h_n = gamma``, ``h_i = q_i (1 - gamma) / (1 - q_n)`` (``h = q`` when ``q_n = 1``)."""
    if q[n] >= 1:
        return q.copy()
    h = q * (1 - gamma) / (1 - q[n])
    h[n] = gamma
    return h


def _row_target(rule, kind: str, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The target ``h`` of issue 42's whole-row rules, token by token (their upstream's letters swapped back)."""
    V = q.size
    if kind == "CascadeDefer":  # defer to q iff max p < max q - alpha TV(p, q)
        tv = 0.5 * math.fsum(abs(float(a) - float(b)) for a, b in zip(p, q, strict=True))
        return q.copy() if float(p.max()) < float(q.max()) - rule.alpha * tv else p.copy()
    if kind == "RFuzzy":  # keep the draft's row iff JS(p, q) <= threshold
        m = (p + q) / 2
        js = 0.5 * float(np.sum(rel_entr(p, m))) + 0.5 * float(np.sum(rel_entr(q, m)))
        return p.copy() if js <= rule.threshold else q.copy()
    top = float(q.max())
    if kind == "Tok3":  # h_i = p_i 1[i in T] + eta q_i
        if rule.alpha == 0:
            inside = {_first_argmax(q)}
        else:
            inside = {i for i in range(V) if q[i] > 0 and q[i] >= (1 - rule.alpha) * top}
        eta = math.fsum(float(p[i]) for i in range(V) if i not in inside)
        return np.array([(float(p[i]) if i in inside else 0.0) + eta * float(q[i]) for i in range(V)])
    # SCD: h_i propto q_i^(1 + beta) p_i^(-beta) on the gate; p_i = 0 there: the limit, q^(1 + beta) on those tokens
    gate = [i for i in range(V) if q[i] > 0 and q[i] >= rule.alpha * top]
    if rule.beta == 0:
        w = {i: float(q[i]) for i in gate}
    else:
        holes = [i for i in gate if p[i] <= 0]
        logw = {i: (1 + rule.beta) * math.log(q[i]) for i in holes} if holes else {
            i: (1 + rule.beta) * math.log(q[i]) - rule.beta * math.log(p[i]) for i in gate}
        big = max(logw.values())
        w = {i: math.exp(v - big) for i, v in logw.items()}
    z = math.fsum(w.values())
    return np.array([w.get(i, 0.0) / z for i in range(V)])


def _kind(rule) -> str | None:
    return next((c.__name__ for c in type(rule).__mro__ if c.__name__ in COVERED), None)


def reference_rule_gamma(rule, q_n: float) -> float:
    """``gamma(q_n)`` of a two-block rule (SpS: ``q_n``; Cactus: Corollary 5 or Theorem 2's root), ``q_n``
    first clipped to [0, 1]."""
    q_n = min(max(float(q_n), 0.0), 1.0)
    kind = _kind(rule)
    if kind == "SpS":
        return q_n
    if kind == "Cactus":
        if rule.solver == "taylor":  # Corollary 5
            return min(q_n + math.sqrt(2 * q_n * (1 - q_n) * rule.delta), 1.0)  # q(1 - q) first: no inf * 0
        return reference_gamma(q_n, rule.delta, rule.divergence)
    raise NotImplementedError(f"no reference gamma for {rule!r} (two-block rules: SpS, Cactus)")


def reference_bonus(rule, q) -> np.ndarray:
    """Law of the bonus token after every draft of a block is accepted: ``q``, except Medusa's
    ``e_{argmax q}`` (its next candidate is the verifier's argmax, first maximum on ties)."""
    q = np.asarray(q, dtype=np.float64)
    if _kind(rule) == "MedusaTypical" or (_kind(rule) == "MaxEps" and rule.recovery == "argmax"):
        return _one_hot(q.size, _first_argmax(q))
    if _kind(rule) is None:
        raise NotImplementedError(f"no reference implementation for {rule!r} (covered: {', '.join(COVERED)})")
    return q.copy()


def reference_step(rule, p: np.ndarray, q: np.ndarray, n: int) -> tuple[float, np.ndarray]:
    """``(phi_n, g_n)`` of ``rule`` for drafted token ``n``, from the formulas (``phi_n = 0`` where
    ``p_n = 0``: the draft could not have drawn ``n``; under ``convention="authors"`` the rule's own test there,
    as the authors' code judges it).

    The rule's parameters are read from its attributes; its methods are never called."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    phi, g = _reference_step(rule, p, q, int(n))
    zero_draft_tested = getattr(rule, "convention", "ours") == "authors" or _kind(rule) == "MaxSampled"
    return (0.0 if p[n] <= 0 and not zero_draft_tested else float(min(max(phi, 0.0), 1.0))), g


def _reference_step(rule, p: np.ndarray, q: np.ndarray, n: int) -> tuple[float, np.ndarray]:
    kind = _kind(rule)
    if kind == "SpS" and getattr(rule, "rand_bits", None) is not None:  # transformers <= 5.24: r <= q_n / p_n
        return (_grid_accept(q[n] / p[n], rule.rand_bits) if p[n] > 0 else 0.0), _normalised_pos(q - p, q)
    if kind == "Ensemble":  # transformers: 1 - w + w q_n / p_n; (q - p)_+, or q where it sums to <= float32's tiny
        w = rule.weight
        r = np.maximum(q - p, 0.0)
        phi = min(1.0, 1 - w + w * q[n] / p[n]) if p[n] > 0 else 0.0
        return phi, (r / r.sum() if r.sum() > TINY32 else q.copy())
    if kind in ("SpS", "Cactus"):
        return _target_step(_two_block(q, n, reference_rule_gamma(rule, q[n])), p, n, _authors(rule, "token0"))
    if kind == "Interpolation":
        return _target_step(rule.alpha * p + (1 - rule.alpha) * q, p, n, _authors(rule, "floor"))
    if kind == "TAS":  # vLLM: accept iff q_n > min(eps, alpha exp(-H)), H = -sum q log(q + entropy_eps)
        eps = getattr(rule, "entropy_eps", 0.0)
        H = _row_stat("tas-entropy", q, (eps,), lambda q: float(scipy_entropy(q)) if eps == 0 else float(
            -np.sum(np.where(q > 0, q * np.log(q + eps), 0.0))))
        accept = q[n] > min(rule.epsilon, rule.alpha * math.exp(-H))
        return float(accept), _one_hot(q.size, int(np.argmax(q)))
    if kind == "TopK":
        kth = _row_stat("kth", q, (rule.k,), lambda q: np.sort(q)[::-1][rule.k - 1])
        accept = float(q[n] >= kth)
        if getattr(rule, "recovery", "q") == "q":
            return accept, q.copy()
        top = (q >= kth).astype(float)  # the authors': (1[q >= q_(k)] - p)_+, normalised
        return accept, _normalised_pos(top - p, top / top.sum(), _authors(rule, "token0"))
    if kind == "EARS":  # accept iff u < min(1, q_n / p_n + beta (1 - max q)); recover from (q - p)_+
        if p[n] <= 0:
            return 0.0, _normalised_pos(q - p, q)
        return min(1.0, q[n] / p[n] + rule.beta * (1 - q.max())), _normalised_pos(q - p, q)
    if kind == "DropMatch":  # bound to one row's hit (V,): accept if the base test passes or n is on a dropout path
        hit = float(np.asarray(rule.hit)[n])
        if rule.base == "match":  # the verifier's own sample y0 ~ q is one more path; recover y0 given y0 != n
            base = q[n]
            rest = q.copy()
            rest[n] = 0.0
            g = rest / rest.sum() if rest.sum() > 0 else q.copy()
        else:  # SpS's test, recovery from (q - p)_+
            base = min(1.0, q[n] / p[n]) if p[n] > 0 else 0.0
            g = _normalised_pos(q - p, q)
        return base + (1 - base) * hit, g
    if kind == "SGLangThreshold":  # the kernel: accept iff q_n > 0 and (q_n >= t_single or u < q_n / t_acc)
        if q[n] <= 0:
            phi = 0.0
        elif q[n] >= rule.threshold_single:
            phi = 1.0
        else:
            phi = min(1.0, q[n] / rule.threshold_acc)
        return phi, _without(q, n)  # relu(q - p') with p' = q_n e_n
    if kind == "RelaxedAcceptance":  # top_k ids (value descending, lower id first) and q_n >= max q - delta
        top = _row_stat("top-ids", q, (int(rule.topk),), lambda q: set(
            sorted(range(q.size), key=lambda i: (-float(q[i]), i))[:int(rule.topk)]))
        accept = n in top and q[n] >= float(np.max(q)) - rule.delta
        return float(accept), _one_hot(q.size, _first_argmax(q))
    if kind == "MedusaTypical":  # accept iff q_n > min(epsilon, alpha exp(-H_eps(q))); emit argmax q
        H = _row_stat("medusa-entropy", q, (rule.entropy_eps,), lambda q: _medusa_entropy(q, rule.entropy_eps))
        tau = min(rule.epsilon, rule.alpha * math.exp(-H))
        return float(q[n] > tau), _one_hot(q.size, _first_argmax(q))
    if kind == "FLy":  # native ratio test; a rejection deferred w.p. f where the top-k entropy is high and q_n > 0
        h_k = _row_stat("fly-entropy", q, (int(rule.entropy_top_k),), lambda q: -math.fsum(
            x * math.log(x) for x in sorted(q.tolist(), reverse=True)[:int(rule.entropy_top_k)] if x > 0))
        a = min(1.0, q[n] / p[n]) if p[n] > 0 else 0.0
        defer = rule.window_accept if (h_k >= rule.entropy_threshold and q[n] > 0) else 0.0
        return a + (1 - a) * defer, _normalised_pos(q - p, q)
    if kind in ("EntropyVerify", "Lenience"):  # vLLM-Ascend / Fast-HSD: accept iff q_n / p_n >= c u; recover (q - p)_+
        if kind == "Lenience":
            c = rule.lenience
        else:  # c = min(posterior_threshold, exp(-posterior_alpha * H)), H = -sum q log(q + eps)
            H = _row_stat("ascend-entropy", q, (rule.entropy_eps,), lambda q: -math.fsum(
                float(x) * math.log(float(x) + rule.entropy_eps) for x in q if x > 0))
            c = min(rule.threshold, math.exp(-rule.alpha * H))
        if p[n] <= 0:  # the draft could not have drawn n (reference_step: phi = 0)
            return 0.0, _normalised_pos(q - p, q)
        phi = 1.0 if c == 0 else min(1.0, q[n] / p[n] / c)
        return phi, _normalised_pos(q - p, q)
    if kind in ("MinP", "Eta"):  # target-only tests; a rejected n is zeroed in q, which is renormalised
        if kind == "MinP":
            accept = float(q[n] >= rule.min_p * q.max())
        else:
            H = _row_stat("eta-entropy", q, (), lambda q: -math.fsum(  # the row as given (scipy's entropy would
                float(x) * math.log(float(x)) for x in q if x > 0))  # renormalise it first)
            tau = min(rule.epsilon, rule.delta * math.exp(-H))
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
    if kind in ("CascadeDefer", "Tok3", "SCD", "RFuzzy"):  # Theorem 1 towards a target read from both rows
        params = (repr(rule), p.tobytes())  # the same target for every drafted n: computed once per pair of rows
        return _target_step(_row_stat("row-target", q, params, lambda q: _row_target(rule, kind, p, q)), p, n)
    if kind == "Mentored":  # accept iff q_n / ((1 - alpha) p_n) >= u; recover (q - p)_+
        phi = min(1.0, q[n] / ((1 - rule.alpha) * p[n])) if p[n] > 0 else 0.0
        return phi, _normalised_pos(q - p, q)
    if kind == "MaxEps":  # MAX: rejected iff log p_n > log q_n + eps; the verifier's argmax (or a sample of q) emitted
        accept = q[n] > 0 and p[n] > 0 and math.log(p[n]) <= math.log(q[n]) + rule.eps
        g = _one_hot(q.size, _first_argmax(q)) if rule.recovery == "argmax" else q.copy()
        return float(accept), g
    if kind == "MaxSampled":  # MAX: u q_eff >= q_n rejects, q_eff = p_n or 1; residual q minus p, or minus e_n
        if p[n] > 0:
            return min(1.0, q[n] / p[n]), _normalised_pos(q - p, q)
        return q[n], _normalised_pos(q - _one_hot(q.size, n), q)
    if kind == "SampleMatch":  # y ~ q; accept iff y = n, else emit y (y given y != n)
        return q[n], _without(q, n)
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
