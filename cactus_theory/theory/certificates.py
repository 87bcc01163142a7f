"""Exact KL certificates of deterministic acceptance ("When Is a Draft Accepted? A Theory of Acceptance in
Speculative Decoding", A. Sharma, arXiv 2606.30265), in this project's notation.

Setting. ``q`` is the verifier's (target's) law at one position, ``p`` the draft's; the draft proposes its greedy
token ``argmax p``. A deterministic acceptance criterion accepts the tokens of an upper level set of ``q`` and
rejects a lower level set ``L(q)`` (the paper's observation: the rejection regions of the criteria below are lower
level sets of the target). The draft is rejected iff its greedy token lies in ``L(q)``; a tie in ``p`` counts as a
rejection if any tied token is rejected, so the rejection region is the closed set

    ``R(q) = {p : p_y >= p_z for every z, for some y in L(q)}``   (a union of convex sets, one per ``y``).

The certificate is the exact minimum divergence from ``q`` needed to reach it,

    ``D*(q) = min_{p in R(q)} D(p, q)``,  ``D = "kl"``: ``KL(p || q)``;  ``D = "reverse_kl"``: ``KL(q || p)``,

so every draft with ``D(p, q) < D*(q)`` is accepted. The paper's direction could not be recovered (only its
abstract was readable here), so both are given. The greedy-tree certificate is the same question for coverage:
``g = argmax q`` must stay among the draft's top-``m`` candidates; it fails iff ``m`` tokens ``z != g`` have
``p_z >= p_g`` (``coverage_certificate``).

Closed forms (our derivation, checked against cvxpy in ``certificate_reference`` and the tests). The minimiser
equalises a set ``B`` of tokens and leaves the rest in proportion to ``q``:

* ``kl``:  ``D = -log(1 - sum_B q + |B| G_B)``, ``G_B`` the geometric mean of ``q`` over ``B`` (an I-projection:
  ``p`` is ``q`` tilted, ``p_z = G_B / Z`` on ``B``, ``q_z / Z`` elsewhere);
* ``reverse_kl``:  ``D = sum_B q_z log(q_z / mean_B q)`` (an M-projection: ``p = mean_B q`` on ``B``, ``q``
  elsewhere).

For a level-set criterion, ``B`` is the best rejected token ``y`` (largest ``q_y`` in ``L``: an exchange argument)
with the tokens whose ``q`` exceeds the common level (water-filling from the top); for coverage, ``B`` is ``g``
with the smallest of the ``m`` largest other tokens whose ``q`` lies below the level (water-filling from the
bottom). For strict greedy with ``q_(1) > q_(2)`` this is ``-log(1 - (sqrt q_(1) - sqrt q_(2))^2)`` (``kl``) and
``(q_(1) + q_(2)) kl_2((q_(1) - q_(2)) / (q_(1) + q_(2)))`` (``reverse_kl``), ``kl_2(x) = KL(Bern((1 + x)/2) ||
Bern(1/2))``.

Margin-only bounds (``margin_bounds``, ``coverage_margin_bounds``; our derivation), with ``Delta`` the gap between
``q``'s top and the best rejected token (coverage: ``q_g - q_(m+1)``) and ``k`` the number of tokens above the best
rejected one (coverage: ``m``):

* ``kl``:  ``-log(1 - Delta^2) / 2 <= D* <= -log(1 - k Delta)``;
* ``reverse_kl``:  ``kl_2(Delta) <= D* <= Delta log 2`` (upper bound for ``k = 1`` only; ``inf`` otherwise).

The lower bounds are attained by a ``q`` on two tokens, the upper ones approached as the rest of ``q`` spreads
thin; for ``k = 1`` (strict greedy) both are sharp.

Everything is float64 numpy on one row ``q`` of shape ``(V,)``.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.validate import (
    InputTypeError,
    check_int,
    check_nonneg,
    check_number,
    check_positive_int,
    check_prob_param,
    check_probs,
)

__all__ = ["DIRECTIONS", "CRITERIA", "rejected_tokens", "level_set_certificate", "level_set_minimiser",
           "greedy_certificate", "additive_certificate", "multiplicative_certificate", "top_m_certificate",
           "entropy_certificate", "coverage_certificate", "coverage_minimiser", "margin_bounds",
           "coverage_margin_bounds", "pair_certificate", "kl2", "entropy", "criterion_rule", "certificate_cases",
           "PARAMS", "TOL_REL", "TOL_REL_INACCURATE", "agreement", "reference_side"]

DIRECTIONS = ("kl", "reverse_kl")
CRITERIA = ("greedy", "additive", "multiplicative", "top_m", "entropy")


# -- inputs -----------------------------------------------------------------------------------------

def _row(q, name: str = "q") -> np.ndarray:
    if not isinstance(q, np.ndarray):
        raise InputTypeError(f"{name} must be a numpy array, got {type(q).__name__}")
    if q.ndim != 1:
        raise ValueError(f"{name} must be one probability row of shape (V,), got shape {q.shape}")
    check_probs(q, name)
    return np.clip(q.astype(np.float64), 0.0, None)


def _direction(divergence) -> str:
    if not isinstance(divergence, str) or divergence not in DIRECTIONS:
        raise ValueError(f"divergence must be one of {DIRECTIONS}, got {divergence!r}")
    return divergence


def _mask(rejected, V: int) -> np.ndarray:
    if not isinstance(rejected, np.ndarray) or rejected.dtype != bool:
        raise InputTypeError(f"rejected must be a boolean numpy array, got {type(rejected).__name__}"
                             + (f" of dtype {rejected.dtype}" if isinstance(rejected, np.ndarray) else ""))
    if rejected.shape != (V,):
        raise ValueError(f"rejected must have shape ({V},) like q, got {rejected.shape}")
    return rejected


# -- the criteria's rejected sets (lower level sets of q) -------------------------------------------

def entropy(q: np.ndarray, entropy_eps: float = 0.0) -> float:
    """``H(q) = -sum q_i log(q_i + entropy_eps)`` (``TAS``'s entropy; 0 is Shannon's)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(q > 0, q * np.log(q + entropy_eps), 0.0)
    return float(-t.sum())


NEEDS = {"additive": ("delta",), "multiplicative": ("alpha",), "top_m": ("m",), "entropy": ("epsilon", "alpha")}


def rejected_tokens(q, criterion: str, **params) -> np.ndarray:
    """The lower level set ``L(q)`` of tokens the criterion rejects, a boolean ``(V,)`` mask.

    ``"greedy"``          strict greedy: accept ``n`` iff ``q_n > q_z`` for every ``z != n`` (a tie rejects);
    ``"additive"``        ``delta >= 0``: accept iff ``q_n >= max q - delta`` (``RelaxedAcceptance(topk >= V, delta)``);
    ``"multiplicative"``  ``alpha`` in [0, 1]: accept iff ``q_n >= alpha max q`` (``MinP(alpha)``);
    ``"top_m"``           ``m >= 1``: accept iff ``q_n >= q_(m)``, the m-th largest (``TopK(m)``, ties accepted);
    ``"entropy"``         ``epsilon`` in (0, 1], ``alpha > 0``, ``entropy_eps >= 0``: accept iff
                          ``q_n > min(epsilon, alpha exp(-H(q)))`` (``TAS(epsilon, alpha, entropy_eps)``).
    """
    q = _row(q)
    V = q.size
    if criterion == "greedy":
        if params:
            raise ValueError(f"the greedy criterion takes no parameters, got {sorted(params)}")
        top = q.max()
        strict = int(np.sum(q == top)) == 1
        return q < top if strict else np.ones(V, dtype=bool)
    if criterion in NEEDS:
        missing = [k for k in NEEDS[criterion] if k not in params]
        if missing:
            raise ValueError(f"criterion {criterion!r} needs the parameter {missing[0]} (its parameters: "
                             f"{', '.join(NEEDS[criterion])}), got {sorted(params) or 'none'}")
    if criterion == "additive":
        delta = check_nonneg(params.pop("delta"), "delta")
        out = q < q.max() - delta
    elif criterion == "multiplicative":
        alpha = check_prob_param(params.pop("alpha"), "alpha")
        out = q < alpha * q.max()
    elif criterion == "top_m":
        m = check_positive_int(params.pop("m"), "m")
        if m > V:
            raise ValueError(f"m must be <= the vocabulary size V = {V}, got {m}")
        out = q < np.sort(q)[V - m]
    elif criterion == "entropy":
        epsilon = check_prob_param(params.pop("epsilon"), "epsilon", low_open=True)
        alpha = check_nonneg(params.pop("alpha"), "alpha")
        if alpha == 0:
            raise ValueError(f"alpha must be > 0, got {alpha!r}")
        eps = check_nonneg(params.pop("entropy_eps", 0.0), "entropy_eps")
        out = q <= min(epsilon, alpha * math.exp(-entropy(q, eps)))
    else:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    if params:
        raise ValueError(f"unknown parameters for criterion {criterion!r}: {sorted(params)}")
    return out


# -- pooling --------------------------------------------------------------------------------------

def kl2(x) -> float:
    """``kl_2(x) = KL(Bern((1 + x)/2) || Bern(1/2))`` for ``x`` in [0, 1]: ``((1+x) log(1+x) + (1-x) log(1-x)) / 2``
    (``ValueError`` naming ``x`` outside [0, 1] or not finite)."""
    x = float(check_number(x, "x", low=0.0, high=1.0))
    return 0.5 * ((1 + x) * math.log1p(x) + ((1 - x) * math.log1p(-x) if x < 1 else 0.0))


def _level(vals: np.ndarray, divergence: str) -> np.ndarray:
    """Running level of the pooled set ``vals[:j+1]`` for every ``j``: geometric (``kl``) or arithmetic mean."""
    j = np.arange(1, vals.size + 1)
    if divergence == "kl":
        with np.errstate(divide="ignore"):
            return np.exp(np.cumsum(np.log(vals)) / j)
    return np.cumsum(vals) / j


def _pool_cost(B: np.ndarray, divergence: str) -> float:
    """The divergence of ``q``'s projection that equalises the tokens with values ``B``."""
    if divergence == "kl":
        with np.errstate(divide="ignore"):
            G = float(np.exp(np.mean(np.log(B))))
        Z = 1.0 - float(B.sum()) + B.size * G
        return math.inf if Z <= 0 else max(0.0, -math.log(Z))
    mean = float(B.mean())
    if mean == 0:
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(B > 0, B * np.log(B / mean), 0.0)
    return max(0.0, float(t.sum()))


def _pool_from_top(b: float, others_desc: np.ndarray, divergence: str) -> np.ndarray:
    """Values pooled when a token of value ``b`` must reach the top: ``b`` and the largest others above the level."""
    vals = np.concatenate([[b], others_desc])
    lev = _level(vals, divergence)  # lev[j]: level of b with the j largest others
    nxt = np.concatenate([others_desc, [-np.inf]])  # nxt[j]: the (j+1)-th largest other
    j = int(np.argmax(nxt <= lev))  # first j where the next other does not exceed the level
    return vals[:j + 1]


def _pool_from_bottom(c: float, S_desc: np.ndarray, divergence: str) -> np.ndarray:
    """Values pooled when a token of value ``c`` must fall to the smallest of ``S``: ``c`` and the smallest members
    of ``S`` below the level."""
    vals = np.concatenate([[c], S_desc[::-1]])  # c, then S ascending
    lev = _level(vals, divergence)
    nxt = np.concatenate([S_desc[::-1], [np.inf]])
    j = int(np.argmax(nxt >= lev))
    return vals[:j + 1]


def pair_certificate(a: float, b: float, divergence: str = "kl") -> float:
    """Strict greedy with two tokens of values ``a >= b`` pooled: ``-log(1 - (sqrt a - sqrt b)^2)`` (``kl``) or
    ``(a + b) kl_2((a - b) / (a + b))`` (``reverse_kl``). ``a``, ``b``: probabilities of two tokens of one row,
    so ``0 <= b <= a`` and ``a + b <= 1`` (``ValueError`` naming the argument otherwise)."""
    a = check_number(a, "a", low=0.0, high=1.0)
    b = check_number(b, "b", low=0.0, high=1.0)
    if b > a:
        raise ValueError(f"b must be <= a (the pooled pair's smaller value), got a = {a!r}, b = {b!r}")
    if a + b > 1 + 1e-9:
        raise ValueError(f"a + b must be <= 1 (two tokens of one probability row), got a = {a!r}, b = {b!r}")
    divergence = _direction(divergence)
    if divergence == "kl":
        v = (math.sqrt(a) - math.sqrt(b)) ** 2
        return math.inf if v >= 1 else -math.log1p(-v)
    return 0.0 if a + b == 0 else (a + b) * kl2((a - b) / (a + b))


# -- the certificates -------------------------------------------------------------------------------

def _best_rejected(q: np.ndarray, rejected: np.ndarray) -> int | None:
    if not rejected.any():
        return None
    cand = np.flatnonzero(rejected)
    return int(cand[np.argmax(q[cand])])


def level_set_certificate(q, rejected, divergence: str = "kl") -> float:
    """``D* = min D(p, q)`` over drafts ``p`` whose greedy token may be a token of ``rejected`` (a tie counts):
    ``0`` if ``q``'s own top is rejected, ``inf`` if nothing is rejected (or, for ``kl``, only tokens with
    ``q = 0``: ``KL(p || q)`` keeps ``p`` on ``q``'s support). Closed form: module docstring."""
    q = _row(q)
    rejected = _mask(rejected, q.size)
    divergence = _direction(divergence)
    y = _best_rejected(q, rejected)
    if y is None:
        return math.inf
    b = q[y]
    if divergence == "kl" and b == 0:
        return math.inf
    others = np.sort(np.delete(q, y))[::-1]
    if others.size == 0 or b >= others[0]:
        return 0.0
    return _pool_cost(_pool_from_top(b, others, divergence), divergence)


def level_set_minimiser(q, rejected, divergence: str = "kl") -> tuple[np.ndarray, int]:
    """The minimiser ``p*`` of ``level_set_certificate`` and its rejected greedy token ``y`` (tied at the top of
    ``p*``): ``D(p*, q) = D*``. Raises ``ValueError`` where ``D*`` is infinite."""
    q = _row(q)
    rejected = _mask(rejected, q.size)
    divergence = _direction(divergence)
    if not math.isfinite(level_set_certificate(q, rejected, divergence)):
        raise ValueError("the certificate is infinite: no draft is rejected at a finite divergence")
    y = _best_rejected(q, rejected)
    others_idx = np.delete(np.arange(q.size), y)
    order = others_idx[np.argsort(-q[others_idx], kind="stable")]
    B = _pool_from_top(q[y], q[order], divergence)
    idx = np.concatenate([[y], order[:B.size - 1]])
    return _project(q, idx, B, divergence), y


def _project(q: np.ndarray, idx: np.ndarray, B: np.ndarray, divergence: str) -> np.ndarray:
    p = q.copy()
    if divergence == "kl":
        with np.errstate(divide="ignore"):
            G = float(np.exp(np.mean(np.log(B))))
        p[idx] = G
    else:
        p[idx] = B.mean()
    return p / p.sum()


def greedy_certificate(q, divergence: str = "kl") -> float:
    """Strict greedy: ``-log(1 - (sqrt q_(1) - sqrt q_(2))^2)`` (``kl``), ``(q_(1) + q_(2)) kl_2(...)``
    (``reverse_kl``); 0 when ``q``'s maximum is tied."""
    return level_set_certificate(q, rejected_tokens(q, "greedy"), divergence)


def additive_certificate(q, delta: float, divergence: str = "kl") -> float:
    """Additive relaxed acceptance (``q_n >= max q - delta``): the best rejected token is the largest ``q_y <
    max q - delta``, pooled with the tokens above the level (module docstring)."""
    return level_set_certificate(q, rejected_tokens(q, "additive", delta=delta), divergence)


def multiplicative_certificate(q, alpha: float, divergence: str = "kl") -> float:
    """Multiplicative relaxed acceptance (``q_n >= alpha max q``); ``alpha = 1`` accepts ``q``'s maxima only."""
    return level_set_certificate(q, rejected_tokens(q, "multiplicative", alpha=alpha), divergence)


def top_m_certificate(q, m: int, divergence: str = "kl") -> float:
    """Top-m relaxed acceptance (``q_n >= q_(m)``): the best rejected token must overtake every one of the
    accepted ones, pooled from the top."""
    return level_set_certificate(q, rejected_tokens(q, "top_m", m=m), divergence)


def entropy_certificate(q, epsilon: float, alpha: float, divergence: str = "kl", entropy_eps: float = 0.0) -> float:
    """Entropy-thresholded (typical) acceptance ``q_n > tau = min(epsilon, alpha exp(-H(q)))``: ``q`` is fixed, so
    ``tau`` is a number and the rejected set ``{q_y <= tau}`` a lower level set; then as ``level_set_certificate``."""
    return level_set_certificate(q, rejected_tokens(q, "entropy", epsilon=epsilon, alpha=alpha,
                                                    entropy_eps=entropy_eps), divergence)


def _coverage_parts(q, m):
    q = _row(q)
    m = check_positive_int(m, "m")
    g = int(np.argmax(q))
    others_idx = np.delete(np.arange(q.size), g)
    order = others_idx[np.argsort(-q[others_idx], kind="stable")]
    return q, m, g, order


def coverage_certificate(q, m: int, divergence: str = "kl") -> float:
    """Greedy-tree coverage: ``min D(p, q)`` over drafts whose top-``m`` candidates may miss ``g = argmax q``
    (``m`` tokens ``z != g`` with ``p_z >= p_g``; a tie counts). ``0`` if ``q``'s maximum is shared by ``m + 1``
    tokens, ``inf`` if ``m >= V``. Closed form: ``g`` pooled with the smallest of ``q``'s ``m`` largest other
    tokens below the level (module docstring)."""
    q, m, g, order = _coverage_parts(q, m)
    divergence = _direction(divergence)
    if m > order.size:
        return math.inf
    S = q[order[:m]]
    if q[g] <= S[-1]:
        return 0.0
    return _pool_cost(_pool_from_bottom(q[g], S, divergence), divergence)


def coverage_minimiser(q, m: int, divergence: str = "kl") -> tuple[np.ndarray, int]:
    """The minimiser ``p*`` of ``coverage_certificate`` and ``g = argmax q`` (tied at the m-th place of ``p*``)."""
    q, m, g, order = _coverage_parts(q, m)
    divergence = _direction(divergence)
    if m > order.size:
        raise ValueError(f"m = {m} >= V = {q.size}: g is always covered")
    S = q[order[:m]]
    B = _pool_from_bottom(q[g], S, divergence)
    idx = np.concatenate([[g], order[:m][::-1][:B.size - 1]])
    return _project(q, idx, B, divergence), g


# -- margin-only bounds ---------------------------------------------------------------------------

def _margin_pair(delta: float, k: int, divergence: str) -> tuple[float, float]:
    if divergence == "kl":
        lo = math.inf if delta >= 1 else -0.5 * math.log1p(-delta * delta)
        hi = math.inf if k * delta >= 1 else -math.log1p(-k * delta)
    else:
        lo = kl2(min(delta, 1.0))
        hi = delta * math.log(2) if k == 1 else math.inf
    return lo, hi


def margin_bounds(q, rejected, divergence: str = "kl") -> tuple[float, float]:
    """Margin-only bounds ``(lo, hi)`` on ``level_set_certificate``: ``Delta = max q - q_y`` for the best rejected
    token ``y`` and ``k = #{z: q_z > q_y}`` (module docstring). ``(0, 0)`` if ``Delta = 0``; ``(inf, inf)`` if
    nothing is rejected."""
    q = _row(q)
    rejected = _mask(rejected, q.size)
    divergence = _direction(divergence)
    y = _best_rejected(q, rejected)
    if y is None:
        return math.inf, math.inf
    delta = float(q.max() - q[y])
    if delta <= 0:
        return 0.0, 0.0
    return _margin_pair(delta, int(np.sum(q > q[y])), divergence)


def coverage_margin_bounds(q, m: int, divergence: str = "kl") -> tuple[float, float]:
    """Margin-only bounds ``(lo, hi)`` on ``coverage_certificate`` from ``Delta = q_g - q_(m+1)`` (``q_(m+1)``:
    the m-th largest other token) and ``m``."""
    q, m, g, order = _coverage_parts(q, m)
    divergence = _direction(divergence)
    if m > order.size:
        return math.inf, math.inf
    delta = float(q[g] - q[order[m - 1]])
    if delta <= 0:
        return 0.0, 0.0
    return _margin_pair(delta, m, divergence)


# -- the registry's rules that decide as each criterion, and the generated cases of the checks ---------------------

def criterion_rule(criterion: str, V: int, **params):
    """The registry rule whose deterministic decision is the criterion's (``accept_prob`` is 1 on accepted tokens
    and 0 on rejected ones): ``TopK(1)`` for strict greedy (it also accepts a tie at the top, which strict greedy
    rejects: the certificate is then 0), ``RelaxedAcceptance(V, delta)``, ``MinP(alpha)``, ``TopK(m)`` and
    ``TAS(epsilon, alpha, entropy_eps)``."""
    from ..core import rules

    if criterion == "greedy":
        return rules.TopK(1)
    if criterion == "additive":
        return rules.RelaxedAcceptance(topk=V, delta=params["delta"])
    if criterion == "multiplicative":
        return rules.MinP(params["alpha"])
    if criterion == "top_m":
        return rules.TopK(params["m"])
    if criterion == "entropy":
        return rules.TAS(epsilon=params["epsilon"], alpha=params["alpha"], entropy_eps=params.get("entropy_eps", 0.0))
    raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")


def certificate_cases(seed: int, n: int, sizes=(3, 4, 5, 6)) -> list[np.ndarray]:
    """``n`` verifier rows ``q`` for the checks, from ``seed``: Dirichlet rows of the given sizes (concentrations
    0.3 to 3), one in four with an exact tie at the top or among the others, one in four with exact zeros, one
    in eight nearly one-hot. ``seed`` >= 0, ``n`` >= 0, ``sizes`` a non-empty list of ints >= 2 (``ValueError``
    naming the argument otherwise)."""
    seed = check_int(seed, "seed", low=0)
    n = check_int(n, "n", low=0)
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__len__") or len(sizes) == 0:
        raise ValueError(f"sizes must be a non-empty list of row sizes >= 2, got {sizes!r}")
    sizes = [check_int(v, "sizes[i]", low=2) for v in sizes]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        V = int(sizes[i % len(sizes)])
        q = rng.dirichlet(np.full(V, float(rng.choice([0.3, 1.0, 3.0]))))
        kind = i % 8
        if kind in (1, 5):  # a tie: the top (kind 1) or two others (kind 5)
            order = np.argsort(-q)
            a, b = (order[0], order[1]) if kind == 1 else (order[1], order[2 % V])
            q[b] = q[a]
        elif kind in (2, 6):  # exact zeros, never the top
            zero = rng.choice(np.argsort(-q)[1:], size=max(1, (V - 1) // 2), replace=False)
            q[zero] = 0.0
        elif kind == 3:  # nearly one-hot, with near-zeros
            q = np.full(V, 1e-7)
            q[rng.integers(V)] = 1.0
        out.append(q / q.sum())
    return out


PARAMS = {"greedy": [{}], "additive": [{"delta": 0.0}, {"delta": 0.05}, {"delta": 0.3}],
          "multiplicative": [{"alpha": 0.2}, {"alpha": 0.6}, {"alpha": 1.0}],
          "top_m": [{"m": 1}, {"m": 2}, {"m": 3}],
          "entropy": [{"epsilon": 0.09, "alpha": 0.3}, {"epsilon": 0.3, "alpha": 0.5}, {"epsilon": 1.0, "alpha": 0.9}]}
"""Each criterion's parameter settings in the checks (``top_m`` and coverage: ``m`` < V is required where used)."""


TOL_REL = 1e-6
"""Agreement of a closed form with its convex program: ``|closed - reference| <= TOL_REL max(1, |reference|)``."""
TOL_REL_INACCURATE = 1e-4
"""The same where the solver reports only ``optimal_inaccurate``; there the closed form must also lie on the right
side of the reference, within ``1e-7`` relative: not above a primal reference (the divergence of a point feasible
within 1e-9: ``reverse_kl``), not below a dual one (a lower bound on the minimum: ``kl``)."""


def agreement(closed: float, reference: float, status: str, reference_is: str = "upper") -> tuple[float, bool]:
    """``(relative difference, within tolerance)`` of a closed-form certificate and its convex program's value
    (``TOL_REL``, or ``TOL_REL_INACCURATE`` where ``status`` says the solver was inaccurate); two infinities agree.
    ``reference_is``: ``"upper"`` (a primal value, ``optimize.min_divergence_ordered``'s ``reverse_kl``) or
    ``"lower"`` (a dual value, its ``kl``)."""
    if reference_is not in ("upper", "lower"):
        raise ValueError(f"reference_is must be 'upper' or 'lower', got {reference_is!r}")
    if math.isinf(closed) or math.isinf(reference):
        return (0.0, True) if closed == reference else (math.inf, False)
    scale = max(1.0, abs(reference))
    diff = abs(closed - reference) / scale
    if "inaccurate" in status:
        side = closed <= reference + 1e-7 * scale if reference_is == "upper" else closed >= reference - 1e-7 * scale
        return diff, diff <= TOL_REL_INACCURATE and side
    return diff, diff <= TOL_REL


def reference_side(direction: str) -> str:
    """Which side of the minimum ``optimize.min_divergence_ordered``'s value lies on: ``"lower"`` for ``kl`` (its
    dual), ``"upper"`` for ``reverse_kl`` (its primal)."""
    return "lower" if _direction(direction) == "kl" else "upper"
