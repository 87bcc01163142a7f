"""Statistical tests of a sampler's output against an exact law, scipy.stats style.

Test your own sampler in three lines::

    from cactus_theory.stats import goodness_of_fit, samples_needed
    N = samples_needed(0.01, categories=V, alpha=1e-4, beta=1e-3)   # detects TV >= 0.01
    res = goodness_of_fit(my_sampler(N), exact_probs, alpha=1e-4)   # res.pvalue, res.reject

Functions
    ``goodness_of_fit``  observed draws vs expected probabilities: Pearson chi-square or G-test
                         (asymptotic, with pooling of small expected counts), or an exact /
                         Monte Carlo p-value for small samples.
    ``homogeneity``      two samples from the same law? (chi-square test of a 2 x K table)
    ``tv_estimate``, ``kl_estimate``  plug-in TV(P_hat, q), KL(P_hat || q) with bootstrap CIs.
    ``samples_needed``, ``power``      sample size for detecting TV distance ``eps``.

Results behave like scipy.stats' test results: ``stat, p = goodness_of_fit(...)`` (and
``homogeneity``) unpack to the statistic and the p-value, ``est, low, high = tv_estimate(...)`` to
the estimate and its interval; every field is also an attribute (``res.reject``, ``res.dof``...).

Not scipy's ``goodness_of_fit``: ``scipy.stats.goodness_of_fit(dist, data, ...)`` fits a continuous
distribution family to real-valued data by Monte Carlo (Anderson-Darling and friends). Ours tests
draws over a finite set of categories against fully specified probabilities, like
``scipy.stats.chisquare`` / ``power_divergence`` plus pooling of small expected counts, exact and
Monte Carlo p-values for small samples, and samples or counts as input.

Inputs are either samples (integer category ids of an integer dtype, shape (N,), or (N, d) for a law
over d-tuples given as a d-dimensional probability array) or counts (same shape as the probabilities;
integers, or floats holding whole numbers); ``kind="auto"`` decides by shape and refuses ambiguous
input. Samples of a float dtype are refused (``TypeError``), even when every value is a whole number:
such an array is as likely a table of counts, and guessing either way gives a wrong answer silently.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from ..core.divergences import kl, tv
from ..core.validate import (
    InputTypeError,
    check_int,
    check_nonneg,
    check_number,
    check_positive_int,
)

__all__ = [
    "GoodnessOfFitResult", "HomogeneityResult", "EstimateResult", "to_counts", "pool_bins",
    "goodness_of_fit", "homogeneity", "tv_estimate", "kl_estimate", "samples_needed", "power",
    "detectable_tv", "proportion_interval", "PairedResult", "paired_difference", "holm",
    "TestResult",
]

_LAMBDAS = {"chi2": "pearson", "gtest": "log-likelihood"}
EXACT_MAX_OUTCOMES = 200_000  # largest multinomial support enumerated by method="exact"


class _TestResult:
    """Unpacks like scipy's test results: ``statistic, pvalue = result``."""

    def __iter__(self):
        return iter((self.statistic, self.pvalue))

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i):
        return (self.statistic, self.pvalue)[i]

    @property
    def reject(self) -> bool:
        """``pvalue < alpha``."""
        return bool(self.pvalue < self.alpha)


TestResult = _TestResult  # the public name of the base (theory.check's results unpack the same way)


@dataclass(frozen=True)
class GoodnessOfFitResult(_TestResult):
    """``statistic``, ``pvalue``, ``dof`` (asymptotic methods), ``method``, ``n`` samples,
    ``bins`` after pooling, ``alpha`` and ``reject = pvalue < alpha``; unpacks to
    ``(statistic, pvalue)``."""

    statistic: float
    pvalue: float
    dof: int
    method: str
    n: int
    bins: int
    alpha: float


@dataclass(frozen=True)
class HomogeneityResult(_TestResult):
    """Two-sample test: ``statistic``, ``pvalue``, ``dof``, ``bins``, ``alpha``, ``reject``;
    unpacks to ``(statistic, pvalue)``."""

    statistic: float
    pvalue: float
    dof: int
    bins: int
    alpha: float


@dataclass(frozen=True)
class EstimateResult:
    """Point estimate with a ``confidence`` interval ``[low, high]`` and how it was computed;
    unpacks to ``(estimate, low, high)``."""

    estimate: float
    low: float
    high: float
    confidence: float
    method: str

    def __iter__(self):
        return iter((self.estimate, self.low, self.high))

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i):
        return (self.estimate, self.low, self.high)[i]


def _check_alpha(alpha: float, name: str = "alpha") -> float:
    return check_number(alpha, name, low=0.0, high=1.0, low_open=True, high_open=True, what="in (0, 1)")


def _check_expected(expected) -> np.ndarray:
    e = np.asarray(expected, dtype=np.float64)
    if e.size < 1 or not np.all(np.isfinite(e)) or e.min() < -1e-9:
        raise ValueError("expected_probs must be finite, non-negative probabilities")
    if abs(e.sum() - 1) > 1e-6:
        raise ValueError(f"expected_probs must sum to 1 (tolerance 1e-6), got sum {e.sum():.9g}")
    return np.clip(e, 0, None)


def to_counts(x, shape: tuple, *, kind: str = "auto", name: str = "x") -> np.ndarray:
    """Counts array of ``shape`` from samples or counts.

    Samples: integer ids (N,) for a 1-D law, or (N, d) rows of ids for a d-dimensional law, of an
    integer dtype (a float array is refused: ``InputTypeError``, a ``TypeError`` and ``ValueError``).
    Counts: non-negative whole numbers (integer or float dtype) of exactly ``shape``. ``kind="auto"`` treats ``x`` as counts iff
    its shape is ``shape`` and refuses the ambiguous case of a 1-D law with N = V samples.
    """
    if kind not in ("auto", "samples", "counts"):
        raise ValueError(f"kind must be 'auto', 'samples' or 'counts', got {kind!r}")
    a = np.asarray(x)
    if a.dtype == object or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise ValueError(f"{name} must be an integer array of samples or counts, got dtype {a.dtype}")
    if kind == "auto":
        if a.shape == tuple(shape) and len(shape) == 1:
            raise ValueError(
                f"{name} has shape {a.shape}: as many samples as categories, so samples and counts "
                f"are ambiguous; pass kind='samples' or kind='counts'"
            )
        kind = "counts" if a.shape == tuple(shape) else "samples"
    if kind == "samples" and not np.issubdtype(a.dtype, np.integer):
        # category ids are integers: a float array of whole numbers is as likely a table of counts
        raise InputTypeError(
            f"{name}: samples must hold integers (category ids of an integer dtype), got dtype {a.dtype}; "
            f"counts may be float, pass them with kind='counts' and shape {tuple(shape)}")
    if np.issubdtype(a.dtype, np.floating):
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ValueError(f"{name} must hold integers, got non-integer values")
        a = a.astype(np.int64)
    if kind == "counts":
        if a.shape != tuple(shape):
            raise ValueError(f"{name} counts must have shape {tuple(shape)}, got {a.shape}")
        if a.size and a.min() < 0:
            raise ValueError(f"{name} counts must be >= 0, got {a.min()}")
        return a.astype(np.int64)
    d = len(shape)
    if d == 1 and a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[1] != d:
        raise ValueError(f"{name} samples must have shape (N,) or (N, {d}) for a law of shape {tuple(shape)}, got {a.shape}")
    bad = (a < 0) | (a >= np.asarray(shape))
    if bad.any():
        raise ValueError(f"{name} has category ids out of range for shape {tuple(shape)}: {a[bad.any(1)][:3].tolist()}")
    flat = np.ravel_multi_index(tuple(a.T), shape) if a.shape[0] else np.zeros(0, np.int64)
    return np.bincount(flat, minlength=int(np.prod(shape))).reshape(shape)


def pool_bins(expected_counts: np.ndarray, min_expected: float = 5.0) -> np.ndarray:
    """Bin label per category: every category with expected count ``< min_expected`` goes into
    one pooled bin, which takes further categories (smallest first) until it reaches
    ``min_expected`` itself. Returns labels (K,) in ``[0, bins)``."""
    e = np.asarray(expected_counts, dtype=np.float64)
    K = e.size
    order = np.argsort(e, kind="stable")
    small = e[order] < min_expected
    m = int(small.sum())
    if m == 0:
        return np.arange(K)
    while m < K and e[order[:m]].sum() < min_expected:
        m += 1
    labels = np.empty(K, dtype=np.int64)
    labels[order[:m]] = 0
    labels[order[m:]] = np.arange(1, K - m + 1)
    return labels


def _compositions(N: int, K: int) -> np.ndarray:
    """All count vectors of N draws over K cells, (C(N+K-1, K-1), K)."""
    rows = [np.bincount(c, minlength=K) for c in itertools.combinations_with_replacement(range(K), N)]
    return np.array(rows, dtype=np.int64).reshape(-1, K)


def goodness_of_fit(
    x,
    expected_probs,
    *,
    alpha: float = 0.05,
    method: str = "auto",
    statistic: str = "chi2",
    min_expected: float = 5.0,
    kind: str = "auto",
    n_sim: int = 20_000,
    seed: int = 0,
) -> GoodnessOfFitResult:
    """Test H0: the draws ``x`` come from ``expected_probs`` (any shape; samples or counts).

    Returns a ``GoodnessOfFitResult``; ``stat, p = goodness_of_fit(x, probs)`` unpacks it. Unlike
    ``scipy.stats.goodness_of_fit`` (a continuous family fitted to real data), this tests category
    draws against fixed probabilities (see the module docstring).

    ``statistic``: ``"chi2"`` (Pearson, sum (O - E)^2 / E) or ``"gtest"`` (2 sum O log(O / E)).
    ``method``:
      ``"asymptotic"``  pool categories with expected count < ``min_expected`` (``pool_bins``),
                        p-value from chi-square with bins - 1 dof (scipy ``power_divergence``);
      ``"exact"``       exact multinomial p-value P(T >= t_obs) by enumerating every outcome
                        (at most ``EXACT_MAX_OUTCOMES``), no pooling;
      ``"montecarlo"``  (1 + #{T_sim >= t_obs}) / (n_sim + 1) from ``n_sim`` multinomial draws
                        (seeded by ``seed``), no pooling: valid at any sample size;
      ``"auto"``        asymptotic if N >= 50 and >= 2 bins remain after pooling, else exact if
                        the support is small enough, else Monte Carlo.
    A draw in a category of expected probability 0 is impossible under H0: p-value 0.
    """
    _check_alpha(alpha)
    check_nonneg(min_expected, "min_expected")
    check_positive_int(n_sim, "n_sim")
    if not isinstance(method, str) or method not in ("auto", "asymptotic", "exact", "montecarlo"):
        raise ValueError(f"method must be 'auto', 'asymptotic', 'exact' or 'montecarlo', got {method!r}")
    if not isinstance(statistic, str) or statistic not in _LAMBDAS:
        raise ValueError(f"statistic must be 'chi2' or 'gtest', got {statistic!r}")
    e = _check_expected(expected_probs)
    counts = to_counts(x, e.shape, kind=kind).ravel()
    e = e.ravel()
    N = int(counts.sum())
    if N == 0:
        raise ValueError("x holds no samples")
    if np.any(counts[e == 0] > 0):
        return GoodnessOfFitResult(math.inf, 0.0, 0, "impossible-category", N, int(e.size), alpha)
    obs, pr = counts[e > 0], e[e > 0] / e[e > 0].sum()
    lam = _LAMBDAS[statistic]
    labels = pool_bins(N * pr, min_expected)
    bins = int(labels.max()) + 1
    if method == "auto":
        if N >= 50 and bins >= 2:
            method = "asymptotic"
        elif math.comb(N + pr.size - 1, pr.size - 1) <= EXACT_MAX_OUTCOMES:
            method = "exact"
        else:
            method = "montecarlo"
    if method == "asymptotic":
        if bins < 2:
            raise ValueError(f"only one bin left after pooling (N = {N} too small); use method='exact' or 'montecarlo'")
        o = np.bincount(labels, weights=obs, minlength=bins)
        f = np.bincount(labels, weights=N * pr, minlength=bins)
        r = sps.power_divergence(o, f, lambda_=lam)
        return GoodnessOfFitResult(float(r.statistic), float(r.pvalue), bins - 1, f"asymptotic-{statistic}", N, bins, alpha)
    if pr.size == 1:
        return GoodnessOfFitResult(0.0, 1.0, 0, f"{method}-{statistic}", N, 1, alpha)
    t_obs = sps.power_divergence(obs, N * pr, lambda_=lam).statistic
    tol = 1e-9 * max(1.0, abs(t_obs))  # ties up to rounding count as "at least as extreme"
    if method == "exact":
        size = math.comb(N + pr.size - 1, pr.size - 1)
        if size > EXACT_MAX_OUTCOMES:
            raise ValueError(f"exact test would enumerate {size} outcomes (> {EXACT_MAX_OUTCOMES}); use method='montecarlo'")
        X = _compositions(N, pr.size)
        t = sps.power_divergence(X, N * pr, lambda_=lam, axis=1).statistic
        pv = float(sps.multinomial.pmf(X, N, pr)[t >= t_obs - tol].sum())
        return GoodnessOfFitResult(float(t_obs), min(1.0, pv), 0, f"exact-{statistic}", N, int(pr.size), alpha)
    rng = np.random.default_rng(seed)
    hits = 0
    for s in range(0, n_sim, 2000):
        X = rng.multinomial(N, pr, size=min(2000, n_sim - s))
        hits += int((sps.power_divergence(X, N * pr, lambda_=lam, axis=1).statistic >= t_obs - tol).sum())
    pv = (1 + hits) / (n_sim + 1)
    return GoodnessOfFitResult(float(t_obs), pv, 0, f"montecarlo-{statistic}", N, int(pr.size), alpha)


def homogeneity(
    x, y, shape: tuple | int, *, alpha: float = 0.05, statistic: str = "chi2",
    min_expected: float = 5.0, kind: str = "auto",
) -> HomogeneityResult:
    """Test H0: samples ``x`` and ``y`` come from the same law over categories of ``shape``.

    Chi-square (or G) test of the 2 x K table of counts (scipy ``chi2_contingency``, no continuity
    correction); categories are pooled by ``pool_bins`` on the smaller row's expected counts so
    every cell's expected count is at least ``min_expected``; dof = bins - 1.
    """
    _check_alpha(alpha)
    if not isinstance(statistic, str) or statistic not in _LAMBDAS:
        raise ValueError(f"statistic must be 'chi2' or 'gtest', got {statistic!r}")
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    a = to_counts(x, shape, kind=kind, name="x").ravel()
    b = to_counts(y, shape, kind=kind, name="y").ravel()
    na, nb = int(a.sum()), int(b.sum())
    if na == 0 or nb == 0:
        raise ValueError(f"both samples must be non-empty, got sizes {na} and {nb}")
    tot = a + b
    keep = tot > 0
    a, b, tot = a[keep], b[keep], tot[keep]
    labels = pool_bins(tot * min(na, nb) / (na + nb), min_expected)
    bins = int(labels.max()) + 1 if labels.size else 0
    if bins < 2:
        raise ValueError("fewer than 2 bins with enough expected counts: the samples are too small")
    table = np.stack([np.bincount(labels, weights=a, minlength=bins), np.bincount(labels, weights=b, minlength=bins)])
    r = sps.chi2_contingency(table, correction=False, lambda_=_LAMBDAS[statistic])
    return HomogeneityResult(float(r.statistic), float(r.pvalue), int(r.dof), bins, alpha)


def _bootstrap(x, q, fn, *, confidence: float, n_boot: int, seed: int, kind: str, name: str) -> EstimateResult:
    _check_alpha(1 - confidence, "1 - confidence")
    n_boot = check_positive_int(n_boot, "n_boot")
    q = _check_expected(q)
    c = to_counts(x, q.shape, kind=kind).ravel()
    N = int(c.sum())
    if N == 0:
        raise ValueError("x holds no samples")
    ph, qf = c / N, q.ravel()
    if name == "KL" and np.any(c[qf == 0] > 0):
        # a draw where q = 0 proves P puts mass there: KL(P || q) = inf for certain, not an estimate
        return EstimateResult(math.inf, math.inf, math.inf, confidence,
                              "KL(P || q) = inf: a draw fell where q = 0 (certain, no resampling)")
    est = float(fn(ph, qf))
    rng = np.random.default_rng(seed)
    boot = fn(rng.multinomial(N, ph, size=n_boot) / N, qf)
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    return EstimateResult(est, float(lo), float(hi), confidence, f"plug-in {name}, percentile bootstrap ({n_boot} resamples)")


def tv_estimate(x, q, *, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0, kind: str = "auto") -> EstimateResult:
    """Plug-in ``TV(P_hat, q) = sum |P_hat - q| / 2`` with a percentile-bootstrap CI (multinomial
    resampling of the counts, seeded). The plug-in is biased upwards by about
    ``sum sqrt(q (1 - q) / (2 pi N))`` when ``P = q``, so the CI covers the expected plug-in value
    rather than 0 in that case; compare the estimate with that bias for small N."""
    return _bootstrap(x, q, tv, confidence=confidence, n_boot=n_boot, seed=seed, kind=kind, name="TV")


def kl_estimate(x, q, *, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0, kind: str = "auto") -> EstimateResult:
    """Plug-in ``KL(P_hat || q) = sum P_hat log(P_hat / q)`` (nats) with a percentile-bootstrap CI
    (as ``tv_estimate``). Biased upwards by about ``(K - 1) / (2 N)`` for K categories when
    ``P = q``. A draw where ``q = 0`` shows that ``P`` puts mass where ``q`` has none, so ``KL(P || q)
    = inf`` whatever else was drawn: the estimate and both ends of the interval are then ``+inf``
    (the interval ``[inf, inf]`` has coverage 1, not ``confidence``; ``method`` says so)."""
    return _bootstrap(x, q, kl, confidence=confidence, n_boot=n_boot, seed=seed, kind=kind, name="KL")


def power(n: int, eps: float, *, categories: int, alpha: float = 0.05) -> float:
    """Asymptotic power of the Pearson test (``categories - 1`` dof, level ``alpha``) with ``n``
    samples against the least favourable law at TV distance ``eps`` from H0.

    Under an alternative ``P``, Pearson's statistic is approximately noncentral chi-square with
    noncentrality ``n chi2(P || q)``, and Cauchy-Schwarz gives ``chi2(P || q) >= (2 TV)^2 = 4 eps^2``
    (equality when ``P / q`` takes two values), so the power is at least
    ``P(ncx2(K - 1, 4 n eps^2) > chi2_{1 - alpha}(K - 1))`` for every ``P`` with ``TV >= eps``."""
    _check_alpha(alpha)
    n = check_number(n, "n", low=0.0, what="a finite number >= 0 (draws; an effective size may be fractional)")
    eps = check_number(eps, "eps", low=0.0, high=1.0, low_open=True, what="in (0, 1]")
    categories = check_int(categories, "categories", low=2)
    df = categories - 1
    crit = sps.chi2.isf(alpha, df)
    return float(sps.ncx2.sf(crit, df, 4 * n * eps * eps))


def samples_needed(eps: float, *, categories: int, alpha: float = 0.05, beta: float = 0.2) -> int:
    """Smallest ``n`` with ``power(n, eps, categories, alpha) >= 1 - beta`` (see ``power``): enough
    draws for the asymptotic Pearson test at level ``alpha`` to detect any law at TV distance
    ``>= eps`` from H0 with probability ``>= 1 - beta`` (before pooling; pooling merges at most
    the small-expected bins)."""
    _check_alpha(beta, "beta")
    power(1, eps, categories=categories, alpha=alpha)  # checks eps, categories and alpha before the search
    lo, hi = 1, 2
    while power(hi, eps, categories=categories, alpha=alpha) < 1 - beta:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if power(mid, eps, categories=categories, alpha=alpha) < 1 - beta else (lo, mid)
    return hi


def detectable_tv(n: int, *, categories: int, alpha: float = 0.05, beta: float = 0.1) -> float:
    """Smallest TV distance ``eps`` that the Pearson test with ``n`` draws over ``categories`` cells
    at level ``alpha`` detects with probability ``>= 1 - beta`` (the inverse of ``power`` in ``eps``;
    bisection to 1e-6). For the two-sample ``homogeneity`` test of samples of sizes ``n1, n2`` pass
    ``n = n1 n2 / (n1 + n2)``: its noncentrality is ``n chi2`` against the pooled law, and the same
    Cauchy-Schwarz bound ``chi2 >= (2 TV)^2`` holds."""
    _check_alpha(beta, "beta")
    check_number(n, "n", low=1.0, what="a finite number >= 1")
    power(int(n), 1.0, categories=categories, alpha=alpha)  # checks categories and alpha
    return _detectable(int(n), int(categories), float(alpha), float(beta))


@functools.lru_cache(maxsize=4096)
def _detectable(n: int, categories: int, alpha: float, beta: float) -> float:
    """``detectable_tv`` on checked arguments (a pure function of four scalars: cached, since a checker asks
    for the same design many times)."""
    df = categories - 1
    crit = sps.chi2.isf(alpha, df)  # power()'s critical value, computed once for the bisection

    def pw(eps: float) -> float:  # power(n, eps, categories=categories, alpha=alpha), term for term
        return float(sps.ncx2.sf(crit, df, 4 * n * eps * eps))

    lo, hi = 0.0, 1.0
    if pw(hi) < 1 - beta:
        return math.inf
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid == 0 or pw(mid) < 1 - beta else (lo, mid)
    return hi


def proportion_interval(successes: int, n: int, *, confidence: float = 0.95) -> EstimateResult:
    """Wilson score interval for a binomial proportion ``successes / n`` (covers well even near 0 or 1
    and for small ``n``, unlike the normal-approximation interval)."""
    _check_alpha(1 - confidence, "1 - confidence")
    n = check_int(n, "n", low=1)  # a bool is not a count: InputTypeError (TypeError and ValueError)
    successes = check_int(successes, "successes", low=0)
    if successes > n:
        raise ValueError(f"successes must be an integer in [0, n={n}], got {successes!r}")
    z = float(sps.norm.isf((1 - confidence) / 2))
    ph = successes / n
    centre = (ph + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return EstimateResult(ph, max(0.0, centre - half), min(1.0, centre + half), confidence, "Wilson score interval")


@dataclass(frozen=True)
class PairedResult:
    """Paired difference of two 0/1 outcomes on the same items: ``estimate = mean(x) - mean(y)``,
    a percentile-bootstrap ``[low, high]`` at ``confidence``, McNemar's exact two-sided ``pvalue``
    (binomial test on the discordant pairs), ``n`` items, ``x_only`` / ``y_only`` discordant counts."""

    estimate: float
    low: float
    high: float
    pvalue: float
    n: int
    x_only: int
    y_only: int
    confidence: float


def paired_difference(x, y, *, confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0) -> PairedResult:
    """Paired comparison of two 0/1 outcome vectors ``x, y`` (shape (N,), e.g. correct answers of two
    decoding rules on the same N problems): the mean difference, a paired bootstrap interval
    (resampling items, so the problems' difficulty cancels) and McNemar's exact test of
    ``P(x=1, y=0) = P(x=0, y=1)``."""
    _check_alpha(1 - confidence, "1 - confidence")
    n_boot = check_positive_int(n_boot, "n_boot")
    a, b = np.asarray(x), np.asarray(y)
    if a.ndim != 1 or a.shape != b.shape or a.size < 1:
        raise ValueError(f"x and y must be 1-d with the same non-zero length, got shapes {a.shape} and {b.shape}")
    if not (np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all()):
        raise ValueError("x and y must hold 0/1 (or boolean) outcomes")
    d = a.astype(np.float64) - b.astype(np.float64)
    rng = np.random.default_rng(seed)
    boot = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    lo, hi = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    xo, yo = int((d > 0).sum()), int((d < 0).sum())
    pv = float(sps.binomtest(xo, xo + yo, 0.5).pvalue) if xo + yo else 1.0
    return PairedResult(float(d.mean()), float(lo), float(hi), pv, int(d.size), xo, yo, confidence)


def holm(pvalues) -> list[float]:
    """Holm's step-down adjusted p-values (same order as ``pvalues``): with the p-values sorted,
    ``p_(i) -> max_{j <= i} min(1, (m - j + 1) p_(j))``. Rejecting every hypothesis whose adjusted
    p-value is below alpha keeps the family-wise error rate at most alpha, whatever the dependence
    between the tests. ``ValueError`` for a p-value outside [0, 1] or NaN (never read as 1); an empty
    family gives ``[]``."""
    try:
        p = np.asarray(list(pvalues), dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"pvalues must be numbers in [0, 1], got {pvalues!r}") from None
    if p.ndim != 1:
        raise ValueError(f"pvalues must be a flat sequence of numbers, got shape {p.shape}")
    bad = ~((p >= 0) & (p <= 1))  # NaN included
    if bad.any():
        raise ValueError(f"pvalues must be numbers in [0, 1] (NaN is not a p-value), got {p[bad][:4].tolist()} "
                         f"at positions {np.flatnonzero(bad)[:4].tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    adj = np.empty(m)
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        adj[j] = running
    return [float(a) for a in adj]
