"""Every decision boundary of the verdict layer (``claims/ledger.py``, ``claims/report.py``) on both
sides, with constructed inputs and hand-computed expectations.

A boundary here is a comparison that turns one verdict into another: an interval end against the
claim's threshold (``>`` vs ``>=``), the number of units against the minimum (``n < min`` vs ``<=``),
a band's ends (included), Holm's running maximum and its cap at 1, the weakest part of a conjunction
(empty families included), a primary check against an independent one, and the report's own
thresholds (Corollary 5's slope, the "about one nat" band, "N of M checks pass"). Each is tested at
the boundary itself and one float step (``nextafter``) or one unit to either side, so a port that moves
the boundary by the smallest amount turns a test red. Tolerance checks of computed errors (``worst <=
1e-12``) are not tested at equality: an error exactly equal to its tolerance cannot be constructed from
a computation, and which side it falls is immaterial there.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from cactus_theory.claims import report
from cactus_theory.claims.ledger import (
    MIN_POINTS,
    VERDICTS,
    Claim,
    Interval,
    all_of,
    band_verdict,
    bootstrap_interval,
    exact_verdict,
    holm,
    interval_verdict,
    mcnemar_mdd,
    resolve,
    t_interval,
)

up = lambda x: float(np.nextafter(x, math.inf))  # noqa: E731  the next float above x
down = lambda x: float(np.nextafter(x, -math.inf))  # noqa: E731  the next float below x


def iv(lo, hi, n=MIN_POINTS):
    return Interval((lo + hi) / 2 if math.isfinite(lo + hi) else 0.0, lo, hi, n)


def claim(**kw) -> Claim:
    base = dict(key="k", claim="c", ref="Theorem 1", kind="paper", how="h", ours="o", verdict="holds", paper="p")
    return Claim(**(base | kw))


# -- interval_verdict: "the quantity exceeds `above`" --------------------------------------------------

@pytest.mark.parametrize("above", [0.0, 1.0, -0.05])
def test_interval_verdict_at_its_threshold(above):
    """"holds" needs the whole interval strictly above: a low end equal to ``above`` does not exclude
    ``above`` (an all-zero interval is not evidence of a positive effect); one float above it does.
    "differs" needs it strictly below, symmetrically."""
    assert interval_verdict(iv(above, above), above=above) == "inconclusive"  # the all-zero interval at 0
    assert interval_verdict(iv(above, above + 1), above=above) == "inconclusive"
    assert interval_verdict(iv(up(above), above + 1), above=above) == "holds"
    assert interval_verdict(iv(up(above), above + 1), above=above, scope="SmolLM2") == "consistent"
    assert interval_verdict(iv(above - 1, above), above=above) == "inconclusive"
    assert interval_verdict(iv(above - 1, down(above)), above=above) == "differs"
    assert interval_verdict(iv(above - 1, down(above)), above=above, scope="SmolLM2") == "differs"
    assert interval_verdict(iv(down(above), up(above)), above=above) == "inconclusive"


def test_interval_verdict_at_the_minimum_of_units():
    """Exactly ``min_points`` units decide; one fewer is "out of reach", whatever the interval says."""
    clear_yes, clear_no = (0.1, 0.5), (-0.5, -0.1)
    for m in (1, 2, MIN_POINTS, 12):
        assert interval_verdict(iv(*clear_yes, n=m), min_points=m) == "holds"
        assert interval_verdict(iv(*clear_no, n=m), min_points=m) == "differs"
        assert interval_verdict(iv(*clear_yes, n=m - 1), min_points=m) == "out of reach"
        assert interval_verdict(iv(*clear_no, n=m - 1), min_points=m) == "out of reach"
    assert MIN_POINTS == 5  # the module docstring's "fewer than MIN_POINTS comparable points"
    assert interval_verdict(iv(*clear_yes, n=5)) == "holds" and interval_verdict(iv(*clear_yes, n=4)) == "out of reach"
    with pytest.raises(ValueError, match="min_points must be an integer >= 1"):
        interval_verdict(iv(*clear_yes), min_points=0)


def test_interval_verdict_never_reads_nan_or_an_unbounded_interval_as_evidence():
    """A NaN end excludes nothing: before, (0.1, NaN) read "holds" and (NaN, -0.1) "differs"."""
    for lo, hi in ((math.nan, 1.0), (0.1, math.nan), (math.nan, -0.1), (-1.0, math.nan), (math.nan, math.nan),
                   (-math.inf, math.inf)):
        assert interval_verdict(iv(lo, hi)) == "inconclusive", (lo, hi)
        assert band_verdict(iv(lo, hi), 0.75, 1.25) == "inconclusive", (lo, hi)
        assert band_verdict(iv(lo, hi), -2.0, -1.5) == "inconclusive", (lo, hi)
    assert interval_verdict(iv(0.1, math.inf)) == "holds" and interval_verdict(iv(-math.inf, -0.1)) == "differs"


# -- band_verdict: "the quantity lies in [low, high]" (ends included) -----------------------------------

def test_band_verdict_at_each_end():
    lo, hi = 0.75, 1.25
    assert band_verdict(iv(lo, hi), lo, hi) == "holds"  # touching both ends: inside
    assert band_verdict(iv(lo, lo), lo, hi) == "holds" and band_verdict(iv(hi, hi), lo, hi) == "holds"
    assert band_verdict(iv(down(lo), hi), lo, hi) == "inconclusive"
    assert band_verdict(iv(lo, up(hi)), lo, hi) == "inconclusive"
    assert band_verdict(iv(0.0, lo), lo, hi) == "inconclusive"  # touches the band from below
    assert band_verdict(iv(0.0, down(lo)), lo, hi) == "differs"
    assert band_verdict(iv(hi, 2.0), lo, hi) == "inconclusive"  # touches it from above
    assert band_verdict(iv(up(hi), 2.0), lo, hi) == "differs"
    assert band_verdict(iv(0.0, 2.0), lo, hi) == "inconclusive"  # straddles the whole band
    assert band_verdict(iv(lo, hi, n=MIN_POINTS - 1), lo, hi) == "out of reach"
    assert band_verdict(iv(0.0, 0.1, n=MIN_POINTS - 1), lo, hi) == "out of reach"
    with pytest.raises(ValueError, match="low <= high"):
        band_verdict(iv(lo, hi), hi, lo)


@pytest.mark.parametrize("lo, hi, want", [(0.75, 1.25, "holds"), (down(0.75), 1.0, "inconclusive"),
                                          (1.0, up(1.25), "inconclusive"), (0.1, down(0.75), "differs"),
                                          (up(1.25), 2.0, "differs")])
def test_the_report_reads_about_one_nat_through_the_band(monkeypatch, lo, hi, want):
    """``far_above_delta_claim``: the mean's interval inside ``ABOUT_ONE_NAT`` = [0.75, 1.25], ends included."""
    assert report.ABOUT_ONE_NAT == (0.75, 1.25)
    monkeypatch.setattr(report, "bootstrap_interval", lambda values: Interval((lo + hi) / 2, lo, hi, len(values)))
    assert report.far_above_delta_claim(np.ones(10), V=1000, delta=0.05).verdict == want
    assert report.far_above_delta_claim(np.ones(4), V=1000, delta=0.05).verdict == "out of reach"


# -- exact checks, conjunctions, resolution --------------------------------------------------------------

def test_exact_verdict():
    assert exact_verdict(True) == "holds" and exact_verdict(False) == "differs"


RANK = {"differs": 0, "inconclusive": 1, "out of reach": 2, "consistent": 3, "holds": 4}  # weakest first


def test_all_of_is_its_weakest_part_over_every_family_up_to_three():
    """The documented order, applied to every multiset of up to three verdicts (hand rule: the part of
    lowest rank); the empty family is "out of reach", never "holds"."""
    assert set(RANK) == set(VERDICTS)
    assert all_of([]) == "out of reach"
    for k in (1, 2, 3):
        for parts in itertools.product(VERDICTS, repeat=k):
            assert all_of(parts) == min(parts, key=RANK.__getitem__), parts
            assert all_of(iter(parts)) == all_of(list(parts))  # a generator is read once, alike


def test_resolve_over_every_primary_and_secondary_verdict():
    """The primary decides; only an "independent" check pointing the other way (passes where the primary
    differs, differs where it passes) makes it "inconclusive (checks disagree)"; other roles never do."""
    scoped = lambda v: dict(verdict=v, scope="s" if v == "consistent" else "")  # noqa: E731
    passes = ("holds", "consistent")
    for pv, sv in itertools.product(VERDICTS, VERDICTS):
        for role in ("underpowered", "same runs", "other protocol", "independent"):
            r = resolve([claim(**scoped(pv)), claim(**scoped(sv), role=role)])
            disagree = role == "independent" and ((pv in passes and sv == "differs") or (pv == "differs" and sv in passes))
            want = ("inconclusive", "checks disagree") if disagree else (pv, "")
            assert (r.verdict, r.reason) == want, (pv, sv, role)
    assert resolve([claim(role="independent")]).verdict == "out of reach"  # no primary: never a secondary's
    assert resolve([]).verdict == "out of reach"


# -- Holm's adjustment --------------------------------------------------------------------------------

@pytest.mark.parametrize("ps, want", [
    ([], []),
    ([0.3], [0.3]),
    ([0.0, 1.0], [0.0, 1.0]),
    ([0.01, 0.011], [0.02, 0.02]),  # running maximum: 1 x 0.011 < 2 x 0.01, raised to 0.02
    ([0.011, 0.01], [0.02, 0.02]),  # order kept
    ([0.01, 0.02, 0.03], [0.03, 0.04, 0.04]),  # factors 3, 2, 1; 0.03 raised to 0.04
    ([0.02, 0.02, 0.5], [0.06, 0.06, 0.5]),  # ties: 3 x 0.02, then max(0.06, 2 x 0.02)
    ([0.6, 0.7], [1.0, 1.0]),  # capped at 1, and the cap carried by the running maximum
    ([0.4, 0.001, 0.3], [0.6, 0.003, 0.6]),  # 3 x .001; 2 x .3 = .6; max(.6, 1 x .4) = .6
])
def test_holm_by_hand(ps, want):
    assert holm(ps) == pytest.approx(want, abs=1e-15)


def test_holm_equals_the_step_down_procedure_at_every_level():
    """Independent characterisation: H_i is rejected by Holm's step-down procedure at level alpha (sorted
    p-values, reject while ``p_(j) <= alpha / (m - j + 1)``) iff its adjusted p-value is ``<= alpha``;
    checked on random families at many levels, and on dyadic p-values where the levels hit the
    boundaries exactly (``p_(j) = alpha / (m - j + 1)`` in floating point)."""
    rng = np.random.default_rng(0)
    families = [rng.uniform(0, 0.2, m) for m in (1, 2, 3, 5, 8) for _ in range(20)]
    families += [np.array([0.25, 0.5]), np.array([0.125, 0.25, 0.25, 0.5]), np.array([0.0625] * 4)]
    for ps in families:
        adj = np.array(holm(ps))
        order, m = np.argsort(ps, kind="stable"), len(ps)
        for alpha in [*rng.uniform(0, 0.3, 10), 0.125, 0.25, 0.5]:
            rejected = np.zeros(m, bool)
            for j, i in enumerate(order):
                if ps[i] > alpha / (m - j):
                    break
                rejected[i] = True
            assert np.array_equal(rejected, adj <= alpha), (ps, alpha, adj)


# -- intervals and McNemar's detectable difference -------------------------------------------------------

def test_interval_constructors_at_their_unit_counts():
    """Fewer than 2 units give the interval (-inf, inf), which decides nothing; 2 give a finite one."""
    for f in (bootstrap_interval, t_interval):
        one = f([0.3])
        assert (one.lo, one.hi, one.n) == (-math.inf, math.inf, 1) and interval_verdict(one, min_points=1) == "inconclusive"
    t = t_interval([0.0, 2.0])  # mean 1, sd sqrt 2, half width t_{0.975, 1} sqrt(2) / sqrt(2)
    assert (t.lo, t.hi) == pytest.approx((1 - 12.706204736174694, 1 + 12.706204736174694), rel=1e-12)
    x = [0.1, 0.2, 0.3, 0.4, 0.5]  # mean 0.3, sd 0.158114, t_{0.975, 4} = 2.776445
    t = t_interval(x)
    half = 2.7764451051977934 * np.std(x, ddof=1) / math.sqrt(5)
    assert (t.estimate, t.lo, t.hi, t.n) == pytest.approx((0.3, 0.3 - half, 0.3 + half, 5), rel=1e-12)
    b = bootstrap_interval([1.0, 3.0], n_boot=4000, seed=0)  # resample means lie in {1, 2, 3}
    assert (b.lo, b.hi) == (1.0, 3.0) and b.estimate == 2.0


def test_bootstrap_leaves_out_only_resamples_where_the_statistic_is_not_finite():
    """Finite units whose statistic is undefined on some resamples (a ratio whose denominator resampled to
    0): those resamples are left out, as documented; when every resample is, the interval is unbounded."""
    rows = np.array([[1.0, 0.0], [3.0, 1.0]])  # ratio of sums: inf when only row 0 is drawn
    with np.errstate(divide="ignore", invalid="ignore"):
        b = bootstrap_interval(rows, lambda u: u[:, 0].sum() / u[:, 1].sum(), n_boot=2000)
        assert math.isfinite(b.lo) and math.isfinite(b.hi) and b.lo >= 3.0  # 3 / 1, 4 / 1, 6 / 2 ... finite ones
        none = bootstrap_interval(np.zeros((3, 2)), lambda u: u[:, 0].sum() / u[:, 1].sum(), n_boot=50)
    assert (none.lo, none.hi) == (-math.inf, math.inf) and interval_verdict(none, min_points=1) == "inconclusive"


def test_mcnemar_mdd_by_hand_and_at_its_edges():
    """(z_{1 - alpha/2} + z_power) sqrt(d / n) with z_{0.975} = 1.959963984540054, z_{0.8} = 0.841621233572914."""
    assert mcnemar_mdd(0.25, 100) == pytest.approx((1.959963984540054 + 0.841621233572914) * 0.05, rel=1e-12)
    assert mcnemar_mdd(0.0, 100) == 0.0 and mcnemar_mdd(1.0, 1) == pytest.approx(2.801585218112968, rel=1e-12)
    assert mcnemar_mdd(0.25, 100, alpha=0.05 / 4) > mcnemar_mdd(0.25, 100)  # Holm's first step: stricter
    for bad in (dict(discordance=down(0.0)), dict(discordance=up(1.0)), dict(n=0)):
        with pytest.raises(ValueError):
            mcnemar_mdd(**(dict(discordance=0.25, n=100) | bad))


# -- the report's own thresholds -------------------------------------------------------------------------

@pytest.mark.parametrize("slopes, want", [([report.COR5_MIN_SLOPE, 1.0, 1.5], "holds"),
                                          ([down(report.COR5_MIN_SLOPE), 1.0, 1.5], "differs"),
                                          ([0.5, 1.0], "differs")])
def test_corollary5_slope_threshold(monkeypatch, slopes, want):
    """Corollary 5 holds iff every log-log slope is ``>= COR5_MIN_SLOPE`` (0.9): exactly 0.9 holds."""
    assert report.COR5_MIN_SLOPE == 0.9
    monkeypatch.setattr(report, "taylor_convergence", lambda q: {"q_n": list(range(len(slopes))), "slope": slopes})
    c = report._corollary5(np.random.default_rng(0), 1)
    assert c.verdict == want and (c.detail == "") == (want == "holds")


def test_format_table_counts_exactly_the_checks_that_pass():
    rows = [claim(key=v, verdict=v, scope="s" if v == "consistent" else "", detail=f"why {v}") for v in VERDICTS]
    text = report.format_table(rows)
    assert text.endswith("2 of 5 checks pass.")  # holds and consistent
    for v in ("inconclusive", "differs", "out of reach"):
        assert f"Counterexample for 'c': why {v}" in text and f"**{v}**" in text
    assert "why holds" not in text and "why consistent" not in text and "**holds**" not in text
    assert report.format_table([claim()]).endswith("1 of 1 checks pass.")
    assert report.format_table([]).endswith("0 of 0 checks pass.")
