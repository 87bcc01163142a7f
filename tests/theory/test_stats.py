"""cactus_theory.stats: calibration, power, exact p-values, pooling, estimates, validation.

Calibration checks replicate a test over fixed seeds and compare the rejection count with
binomial bounds chosen so that a correctly calibrated test lands outside them with probability
< 1e-6; the seeds are fixed, so the outcome is deterministic.
"""

import math

import numpy as np
import pytest
from scipy import stats as sps

from cactus_theory.stats import (
    goodness_of_fit,
    homogeneity,
    kl_estimate,
    pool_bins,
    power,
    samples_needed,
    to_counts,
    tv_estimate,
)

P4 = np.array([0.5, 0.3, 0.15, 0.05])


def _binom_bounds(reps: int, rate: float, tail: float = 1e-6) -> tuple[int, int]:
    return int(sps.binom.ppf(tail / 2, reps, rate)), int(sps.binom.isf(tail / 2, reps, rate))


@pytest.mark.parametrize("statistic", ["chi2", "gtest"])
def test_asymptotic_test_is_calibrated(statistic):
    reps, alpha = 400, 0.05
    rng = np.random.default_rng(0)
    rej = sum(goodness_of_fit(rng.choice(4, 400, p=P4), P4, alpha=alpha, statistic=statistic).reject
              for _ in range(reps))
    lo, hi = _binom_bounds(reps, alpha)
    assert lo <= rej <= hi, rej


def test_montecarlo_small_sample_is_valid():
    """Monte Carlo p-values are valid at any N: rejection rate <= alpha (up to binomial noise)."""
    reps, alpha = 300, 0.1
    rng = np.random.default_rng(1)
    rej = sum(goodness_of_fit(rng.choice(4, 12, p=P4), P4, alpha=alpha, method="montecarlo", n_sim=999, seed=s).reject
              for s in range(reps))
    assert rej <= _binom_bounds(reps, alpha)[1], rej


def test_exact_pvalue_matches_binomial_two_sided():
    """K = 2: Pearson's statistic orders outcomes by |x - N p|, so the exact p-value is
    P(|X - N p| >= |x - N p|) for X ~ Binomial(N, p)."""
    N, p = 30, 0.3
    xs = np.arange(N + 1)
    for x in (2, 9, 14, 20):
        want = sps.binom.pmf(xs, N, p)[np.abs(xs - N * p) >= abs(x - N * p) - 1e-9].sum()
        got = goodness_of_fit(np.array([x, N - x]), [p, 1 - p], method="exact", kind="counts").pvalue
        assert got == pytest.approx(want, rel=1e-9)


def test_exact_and_montecarlo_agree():
    rng = np.random.default_rng(2)
    x = rng.choice(4, 25, p=[0.4, 0.3, 0.2, 0.1])
    ex = goodness_of_fit(x, P4, method="exact").pvalue
    mc = goodness_of_fit(x, P4, method="montecarlo", n_sim=40_000, seed=3).pvalue
    assert abs(ex - mc) < 6 * math.sqrt(ex * (1 - ex) / 40_000) + 1e-4


def test_auto_method_choice():
    rng = np.random.default_rng(3)
    assert goodness_of_fit(rng.choice(4, 500, p=P4), P4).method == "asymptotic-chi2"
    assert goodness_of_fit(rng.choice(4, 20, p=P4), P4).method == "exact-chi2"
    assert goodness_of_fit(rng.choice(40, 30), np.full(40, 1 / 40)).method == "montecarlo-chi2"


def test_detects_a_shifted_law():
    rng = np.random.default_rng(4)
    x = rng.choice(4, 2000, p=[0.45, 0.3, 0.2, 0.05])
    assert goodness_of_fit(x, P4, alpha=1e-4).reject


def test_impossible_category_rejects():
    res = goodness_of_fit(np.array([0, 1, 2, 3, 3]), [0.5, 0.3, 0.2, 0.0])
    assert res.pvalue == 0 and res.reject and res.statistic == math.inf


def test_pooling():
    labels = pool_bins(np.array([0.5, 20.0, 1.0, 10.0, 2.0]), 5.0)
    # 0.5 + 1 + 2 = 3.5 < 5, so the next smallest (10) joins the pool; 20 stays alone
    assert labels[[0, 2, 3, 4]].tolist() == [0, 0, 0, 0] and labels[1] == 1
    assert pool_bins(np.array([6.0, 7.0]), 5.0).tolist() == [0, 1]
    res = goodness_of_fit(np.r_[np.zeros(95, int), np.ones(3, int), np.full(2, 2)], [0.95, 0.03, 0.02])
    assert res.bins == 2 and res.dof == 1


def test_multidimensional_samples_and_counts():
    law = np.full((2, 3), 1 / 6)
    x = np.array([[0, 0], [1, 2], [1, 2], [0, 1]])
    c = to_counts(x, law.shape)
    assert c.shape == (2, 3) and c[1, 2] == 2 and c.sum() == 4
    assert np.array_equal(to_counts(c, law.shape), c)
    with pytest.raises(ValueError, match="ambiguous"):
        to_counts(np.array([0, 1, 2]), (3,))
    with pytest.raises(ValueError, match="out of range"):
        to_counts(np.array([[0, 3]]), (2, 3))


def test_homogeneity_calibrated_and_powerful():
    reps, alpha = 300, 0.05
    rng = np.random.default_rng(5)
    rej = sum(homogeneity(rng.choice(4, 300, p=P4), rng.choice(4, 200, p=P4), 4, alpha=alpha).reject
              for _ in range(reps))
    lo, hi = _binom_bounds(reps, alpha)
    assert lo <= rej <= hi, rej
    far = homogeneity(rng.choice(4, 3000, p=P4), rng.choice(4, 3000, p=[0.4, 0.3, 0.2, 0.1]), 4, alpha=1e-4)
    assert far.reject and far.dof == 3


@pytest.mark.parametrize("fn, true", [(tv_estimate, "tv"), (kl_estimate, "kl")])
def test_bootstrap_intervals_cover(fn, true):
    """95% percentile intervals for a law at moderate distance: coverage over 100 seeds is within
    binomial bounds of 0.95 widened for the bootstrap's O(1/sqrt N) coverage error (>= 0.85)."""
    from cactus_theory import kl, tv

    P = np.array([0.4, 0.3, 0.2, 0.1])
    d = float({"tv": tv, "kl": kl}[true](P, P4))
    rng = np.random.default_rng(6)
    cover = 0
    for s in range(100):
        r = fn(rng.choice(4, 3000, p=P), P4, n_boot=500, seed=s)
        assert r.low <= r.estimate <= r.high
        cover += r.low <= d <= r.high
    assert cover >= 85, cover


def test_power_helper_is_minimal_and_achieved():
    eps, K, alpha, beta = 0.05, 4, 0.05, 0.2
    n = samples_needed(eps, categories=K, alpha=alpha, beta=beta)
    assert power(n, eps, categories=K, alpha=alpha) >= 1 - beta > power(n - 1, eps, categories=K, alpha=alpha)
    # least favourable alternative at TV eps: shift mass eps between two halves of equal q mass
    q = np.full(K, 1 / K)
    P = q + np.array([eps, eps, -eps, -eps]) / 2
    reps = 300
    rng = np.random.default_rng(7)
    rej = sum(goodness_of_fit(rng.choice(K, n, p=P), q, alpha=alpha).reject for _ in range(reps))
    assert rej >= _binom_bounds(reps, 1 - beta)[0], rej
    assert samples_needed(0.01, categories=8, alpha=1e-4, beta=1e-3) > samples_needed(0.02, categories=8, alpha=1e-4, beta=1e-3)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: goodness_of_fit([0, 1], [0.5, 0.6]), "expected_probs must sum to 1"),
        (lambda: goodness_of_fit([0, 1, 1], [0.5, 0.5], alpha=1.5), "alpha must be in"),
        (lambda: goodness_of_fit([0, 1, 1], [0.5, 0.5], method="bogus"), "method must be"),
        (lambda: goodness_of_fit([0, 1, 1], [0.5, 0.5], statistic="bogus"), "statistic must be"),
        (lambda: goodness_of_fit(np.zeros(2, int), [0.5, 0.5], kind="counts"), "no samples"),
        (lambda: goodness_of_fit([0.5, 1], [0.5, 0.5], kind="samples"), "must hold integers"),
        (lambda: homogeneity([0], [1], 2), "too small"),
        (lambda: power(10, 0.0, categories=3), "eps must be"),
        (lambda: samples_needed(0.1, categories=1), "categories must be"),
        (lambda: tv_estimate([0, 1], [0.5, 0.5], confidence=1.0), "confidence"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_results_unpack_like_scipy():
    """``stat, p = goodness_of_fit(...)`` as with scipy.stats.chisquare; numbers checked against
    scipy's own Pearson test on the same counts (no pooling needed: every expected count >= 5)."""
    counts = np.array([230, 140, 90, 40])
    stat, p = goodness_of_fit(counts, P4, kind="counts", method="asymptotic")
    ref = sps.chisquare(counts, counts.sum() * P4)
    assert (stat, p) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-12)
    stat2, p2 = homogeneity(counts, counts[::-1], 4, kind="counts")
    ref2 = sps.chi2_contingency(np.stack([counts, counts[::-1]]), correction=False)
    assert (stat2, p2) == pytest.approx((ref2.statistic, ref2.pvalue), rel=1e-12)
    est, low, high = tv_estimate(counts, P4, kind="counts", n_boot=200)
    assert low < high and est == pytest.approx(0.5 * np.abs(counts / 500 - P4).sum(), rel=1e-12)


@pytest.mark.parametrize("fn", [lambda x, e: goodness_of_fit(x, e), lambda x, e: goodness_of_fit(x, e, kind="samples"),
                                lambda x, e: homogeneity(x, x, 3), lambda x, e: tv_estimate(x, e)])
def test_float_category_ids_are_refused(fn):
    """Samples are integer ids: a float array of whole numbers is as likely counts, so it is refused (a TypeError,
    also a ValueError), never guessed; the same values as integers are accepted, and float counts too."""
    e = np.array([0.5, 0.3, 0.2])
    x = np.tile(np.array([0, 1, 2, 1, 0, 0, 2, 1], dtype=np.float64), 10)
    with pytest.raises(TypeError, match="samples must hold integers.*kind='counts'"):
        fn(x, e)
    fn(x.astype(np.int64), e)
    assert goodness_of_fit(np.array([40.0, 35.0, 25.0]), e, kind="counts").n == 100


def test_holm_lives_in_stats_and_the_ledger_reads_it():
    from cactus_theory.claims.ledger import holm as ledger_holm
    from cactus_theory.stats import holm

    ps = [0.01, 0.04, 0.03, 0.5]
    assert holm(ps) == pytest.approx([0.04, 0.09, 0.09, 0.5]) and ledger_holm(ps) == holm(ps)
