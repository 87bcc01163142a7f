"""``theory.stats`` is calibrated: under the null every path's p-values are uniform, the reject boundary
sits exactly at alpha, pooling follows its documented rule, and the power at stated alternatives is
the computed power. Users trust these tests with their samplers; these tests check the tests.

Uniformity: ``R = 500`` replicates (one multinomial draw each, from one seeded generator; the Monte
Carlo path also seeds its simulation by the replicate's index) per path: asymptotic chi-square and
G-test with and without pooling, exact chi-square and G-test, Monte Carlo chi-square and G-test, and
the two-sample test. The statistic is Kolmogorov-Smirnov's ``D = max_v |F_R(v) - v|`` over the
observed p-values ``v`` (``F_R`` their empirical CDF), against the exact KS critical value at level
``KS_ALPHA = 1e-3`` (``scipy.stats.kstwo``; about 0.087 at R = 500). For a discrete test that is
exact at its attainable levels (``P(p <= v) = v``, as the exact path's), ``D`` over the observed values
is at most the KS statistic of a uniform sample (the randomised p-values, which agree with ``F_R`` at
those levels), so the check keeps its level; the asymptotic and Monte Carlo paths are uniform up to
their approximation, far below 0.087 at these sizes (measured D 0.02 to 0.05). Power of the check:
a p-value law whose CDF is off by 0.15 anywhere is caught with probability >= 0.99 (computed in
``test_the_ks_check_has_the_stated_power``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from cactus_theory import stats
from cactus_theory.stats import goodness_of_fit, homogeneity, pool_bins, power, samples_needed

R = 500
KS_ALPHA = 1e-3
KS_CRIT = float(sps.kstwo.isf(KS_ALPHA, R))
P4 = np.array([0.5, 0.3, 0.15, 0.05])
P6 = np.array([0.4, 0.3, 0.2, 0.06, 0.03, 0.01])  # at N = 100 the last three (6, 3, 1 expected) pool
P3 = np.array([0.5, 0.3, 0.2])


def ks_distance(pvalues) -> float:
    """``max_v |F_R(v) - v|`` over the observed p-values ``v``."""
    p = np.sort(np.asarray(pvalues, dtype=np.float64))
    v = np.unique(p)
    return float(np.max(np.abs(np.searchsorted(p, v, side="right") / p.size - v)))


def test_the_ks_check_has_the_stated_power():
    """At the worst point (v = 1/2, largest binomial variance) a CDF off by 0.15 puts ``F_R(v) - v`` above
    the critical value with probability >= 0.99; and the level is the stated one."""
    assert 0.08 < KS_CRIT < 0.09
    miss = sps.binom.cdf(math.floor(R * (0.5 + KS_CRIT)), R, 0.5 + 0.15)
    assert 1 - miss >= 0.99
    u = np.random.default_rng(1).uniform(size=(200, R))  # uniform samples pass at about the level
    assert sum(ks_distance(x) > KS_CRIT for x in u) <= 2


PATHS = {  # name: (law, draws N, goodness_of_fit keywords, bins after pooling)
    "asymptotic-chi2": (P4, 400, dict(method="asymptotic"), 4),
    "asymptotic-gtest": (P4, 400, dict(method="asymptotic", statistic="gtest"), 4),
    "asymptotic-chi2-pooled": (P6, 100, dict(method="asymptotic"), 4),
    "asymptotic-gtest-pooled": (P6, 100, dict(method="asymptotic", statistic="gtest"), 4),
    "exact-chi2": (P3, 12, dict(method="exact"), 3),
    "exact-gtest": (P3, 12, dict(method="exact", statistic="gtest"), 3),
    "montecarlo-chi2": (P4, 60, dict(method="montecarlo", n_sim=999), 4),
    "montecarlo-gtest": (P4, 60, dict(method="montecarlo", n_sim=999, statistic="gtest"), 4),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_pvalues_are_uniform_under_the_null(path):
    """See the module docstring: D <= the KS critical value at level 1e-3 over R = 500 replicates; the
    path taken (method, bins after pooling) is the one named."""
    law, N, kw, bins = PATHS[path]
    counts = np.random.default_rng(0).multinomial(N, law, size=R)
    res = [goodness_of_fit(c, law, kind="counts", seed=i, **kw) for i, c in enumerate(counts)]
    assert {r.method.replace("-pooled", "") for r in res} == {path.replace("-pooled", "")}
    assert {r.bins for r in res} == {bins}
    d = ks_distance([r.pvalue for r in res])
    assert d <= KS_CRIT, (path, d, KS_CRIT)


def test_two_sample_pvalues_are_uniform_under_the_null():
    rng = np.random.default_rng(1)
    a, b = rng.multinomial(300, P6, size=R), rng.multinomial(200, P6, size=R)
    res = [homogeneity(x, y, 6, kind="counts") for x, y in zip(a, b, strict=True)]
    assert ks_distance([r.pvalue for r in res]) <= KS_CRIT


def test_a_wrong_degree_of_freedom_is_caught_by_the_same_check():
    """The check's power on a real wrong port: chi-square p-values read with ``bins`` degrees of freedom
    (not ``bins - 1``) fail it."""
    counts = np.random.default_rng(0).multinomial(400, P4, size=R)
    stat = [goodness_of_fit(c, P4, kind="counts", method="asymptotic").statistic for c in counts]
    assert ks_distance(sps.chi2.sf(stat, 4)) > KS_CRIT
    assert ks_distance(sps.chi2.sf(stat, 3)) <= KS_CRIT


# -- the reject boundary sits exactly at alpha -------------------------------------------------------

@pytest.mark.parametrize("path", list(PATHS))
def test_reject_iff_the_pvalue_is_below_alpha(path):
    """``reject = pvalue < alpha``: at alpha equal to the p-value it does not reject; one float above, it does."""
    law, N, kw, _ = PATHS[path]
    c = np.random.default_rng(3).multinomial(N, law)
    p = goodness_of_fit(c, law, kind="counts", **kw).pvalue
    assert 0 < p < 1
    assert not goodness_of_fit(c, law, kind="counts", alpha=p, **kw).reject
    assert goodness_of_fit(c, law, kind="counts", alpha=float(np.nextafter(p, 1.0)), **kw).reject


@pytest.mark.parametrize("statistic", ["chi2", "gtest"])
def test_the_exact_test_has_size_alpha_at_every_attainable_level(statistic):
    """Every outcome of N = 8 draws over 3 categories enumerated with its multinomial probability: at
    each attainable p-value v, the probability of a p-value <= v is exactly v (rejection at any alpha
    in (v, next level] has size v), and of a p-value < v is the next lower level."""
    N, law = 8, P3
    outcomes = [np.array([i, j, N - i - j]) for i in range(N + 1) for j in range(N + 1 - i)]
    pmf = np.array([sps.multinomial.pmf(x, N, law) for x in outcomes])
    pv = np.array([goodness_of_fit(x, law, kind="counts", method="exact", statistic=statistic).pvalue
                   for x in outcomes])
    levels = np.unique(pv)
    assert levels[-1] == pytest.approx(1.0, abs=1e-12) and len(levels) > 10
    for k, v in enumerate(levels):
        assert pmf[pv <= v].sum() == pytest.approx(v, abs=1e-12)
        assert pmf[pv < v].sum() == pytest.approx(levels[k - 1] if k else 0.0, abs=1e-12)


# -- pooling follows its documented rule ---------------------------------------------------------------

@pytest.mark.parametrize("expected, labels", [
    ([6.0, 7.0, 20.0], [0, 1, 2]),  # nothing below 5: no pooling
    ([5.0, 7.0, 20.0], [0, 1, 2]),  # exactly min_expected is not small
    ([float(np.nextafter(5.0, 0)), 7.0, 20.0], [0, 0, 1]),  # just below: pooled, then takes 7 to reach 5
    ([2.0, 3.0, 10.0, 20.0], [0, 0, 1, 2]),  # the small ones reach exactly 5: the pool stops there
    ([2.0, 2.9, 10.0, 20.0], [0, 0, 0, 1]),  # 4.9 < 5: the next smallest (10) joins
    ([1.0, 1.0, 1.0, 6.0, 6.0, 20.0], [0, 0, 0, 0, 1, 2]),  # ties: the lower index joins first
    ([20.0, 1.0, 6.0, 1.0, 6.0, 1.0], [2, 0, 0, 0, 1, 0]),  # the same in another order
    ([1.0, 1.0, 1.0], [0, 0, 0]),  # everything pooled: one bin
])
def test_pool_bins_by_hand(expected, labels):
    assert pool_bins(np.array(expected), 5.0).tolist() == labels


def test_pooled_statistics_equal_scipy_on_hand_merged_counts():
    """goodness_of_fit's asymptotic path on P6 at N = 100 merges the categories of expected 6, 3 and 1
    (pool_bins) and tests the merged table: scipy's chisquare / power_divergence on the counts merged by
    hand give the same statistic and p-value, with 3 degrees of freedom."""
    counts = np.array([38, 33, 17, 7, 4, 1])
    merged = np.array([38, 33, 17, 12])
    e = np.array([40.0, 30.0, 20.0, 10.0])
    for statistic, lam in (("chi2", "pearson"), ("gtest", "log-likelihood")):
        r = goodness_of_fit(counts, P6, kind="counts", method="asymptotic", statistic=statistic)
        ref = sps.power_divergence(merged, e, lambda_=lam)
        assert (r.statistic, r.pvalue) == pytest.approx((ref.statistic, ref.pvalue), rel=1e-12)
        assert (r.bins, r.dof) == (4, 3)
    r0 = goodness_of_fit(counts, P6, kind="counts", method="asymptotic", min_expected=0.0)  # no pooling
    assert (r0.bins, r0.dof) == (6, 5)
    assert r0.statistic == pytest.approx(sps.chisquare(counts, 100 * P6).statistic, rel=1e-12)


def test_a_zero_probability_category_is_left_out_of_pooling_and_a_draw_there_rejects():
    law = np.array([0.5, 0.3, 0.2, 0.0])
    r = goodness_of_fit(np.array([48, 30, 22, 0]), law, kind="counts", method="asymptotic")
    assert r.bins == 3 and r.dof == 2
    hit = goodness_of_fit(np.array([48, 30, 21, 1]), law, kind="counts")
    assert (hit.pvalue, hit.statistic, hit.reject) == (0.0, math.inf, True)


def test_auto_chooses_by_the_documented_boundaries(monkeypatch):
    """``auto``: asymptotic iff N >= 50 and >= 2 bins remain after pooling; else exact iff the support
    C(N + K - 1, K - 1) is at most EXACT_MAX_OUTCOMES; else Monte Carlo. Each boundary on both sides."""
    c50 = np.array([25, 15, 10])
    c49 = np.array([25, 15, 9])
    assert goodness_of_fit(c50, P3, kind="counts").method == "asymptotic-chi2"
    assert goodness_of_fit(c49, P3, kind="counts").method == "exact-chi2"
    one_bin = np.full(50, 1 / 50)  # N = 50 draws over 50 cells of expected 1: everything pools into one bin
    assert pool_bins(50 * one_bin).max() == 0
    assert goodness_of_fit(np.ones(50, dtype=int), one_bin, kind="counts", n_sim=99).method == "montecarlo-chi2"
    size = math.comb(49 + 2, 2)  # N = 49, K = 3
    monkeypatch.setattr(stats, "EXACT_MAX_OUTCOMES", size)
    assert goodness_of_fit(c49, P3, kind="counts").method == "exact-chi2"
    monkeypatch.setattr(stats, "EXACT_MAX_OUTCOMES", size - 1)
    assert goodness_of_fit(c49, P3, kind="counts", n_sim=99).method == "montecarlo-chi2"


# -- power: simulated rejection rates against the computed power ------------------------------------------

POWER_REPS = 2000


@pytest.mark.parametrize("eps, alpha, n", [(0.05, 0.05, None), (0.1, 1e-3, None), (0.05, 0.01, 600)])
def test_simulated_power_at_the_least_favourable_alternative_is_the_computed_power(eps, alpha, n):
    """K = 4, q uniform, P = q + (eps / 2)(1, 1, -1, -1): TV(P, q) = eps and P / q takes two values, where
    ``power``'s Cauchy-Schwarz bound is an equality, so the Pearson test's rejection rate over
    ``POWER_REPS`` = 2000 replicates must match ``power(n, eps)`` (n from ``samples_needed`` at beta = 0.2,
    or a lower-power n): inside the two-sided binomial interval at level 1e-4 around it (half-width
    about 0.035 at power 0.8, 0.04 at 0.28; the asymptotic approximation itself is off by about 0.01
    here). A computed power off by 0.06 lies outside with probability > 0.99."""
    K, q = 4, np.full(4, 0.25)
    P = q + np.array([1, 1, -1, -1]) * eps / 2
    assert 0.5 * np.abs(P - q).sum() == pytest.approx(eps) and ((P - q) ** 2 / q).sum() == pytest.approx(4 * eps**2)
    n = samples_needed(eps, categories=K, alpha=alpha, beta=0.2) if n is None else n
    pw = power(n, eps, categories=K, alpha=alpha)
    counts = np.random.default_rng(11).multinomial(n, P, size=POWER_REPS)
    rej = sum(goodness_of_fit(c, q, kind="counts", alpha=alpha, method="asymptotic").reject for c in counts)
    lo, hi = sps.binom.ppf(5e-5, POWER_REPS, pw), sps.binom.isf(5e-5, POWER_REPS, pw)
    assert lo <= rej <= hi, (n, pw, rej / POWER_REPS)
    assert sps.binom.cdf(hi, POWER_REPS, pw - 0.06) > 0.99 and sps.binom.sf(lo - 1, POWER_REPS, pw + 0.06) > 0.99


def test_power_is_a_lower_bound_away_from_the_least_favourable_alternative():
    """A three-valued P / q at the same TV has chi2(P || q) > 4 eps^2: its rejection rate is above
    ``power(n, eps)`` (the bound) and matches the noncentral chi-square at its own chi2 (binomial interval
    at level 1e-4, 1000 replicates)."""
    K, q, eps, alpha, reps = 4, np.full(4, 0.25), 0.05, 0.05, 1000
    P = q + np.array([2, -1, -1, 0]) * eps / 2
    chi2 = float(((P - q) ** 2 / q).sum())
    assert 0.5 * np.abs(P - q).sum() == pytest.approx(eps) and chi2 > 4 * eps**2
    n = samples_needed(eps, categories=K, alpha=alpha, beta=0.2)
    own = float(sps.ncx2.sf(sps.chi2.isf(alpha, K - 1), K - 1, n * chi2))
    counts = np.random.default_rng(12).multinomial(n, P, size=reps)
    rej = sum(goodness_of_fit(c, q, kind="counts", alpha=alpha, method="asymptotic").reject for c in counts)
    assert rej > sps.binom.isf(5e-5, reps, power(n, eps, categories=K, alpha=alpha))
    assert sps.binom.ppf(5e-5, reps, own) <= rej <= sps.binom.isf(5e-5, reps, own)
