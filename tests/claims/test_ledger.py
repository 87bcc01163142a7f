"""The claims ledger: the shared Claim type, interval verdicts, the report's grouping, and
``cactus-theory verify`` rows that turn red on planted wrong ports."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

import cactus_theory as ct
from cactus_theory.claims import report
from cactus_theory.claims.ledger import (
    Claim,
    Interval,
    all_of,
    bootstrap_interval,
    combined_verdict,
    holm,
    interval_verdict,
    jackknife_t_interval,
    mcnemar_mdd,
    noninferiority,
    noninferiority_power,
    noninferiority_sample_size,
    noninferiority_verdict,
    plural,
    resolve,
    t_interval,
    t_mdd,
)


def claim(**kw) -> Claim:
    base = dict(key="k", claim="c", ref="Theorem 1", kind="paper", how="h", ours="o", verdict="holds", paper="p")
    return Claim(**(base | kw))


# -- the Claim type ------------------------------------------------------------------------------
def test_claim_refuses_what_would_flatter():
    with pytest.raises(ValueError, match="^verdict must be one of"):
        claim(verdict="maybe")
    with pytest.raises(ValueError, match="^kind must be one of"):
        claim(kind="theorem")
    with pytest.raises(ValueError, match="only a claim of kind 'paper' has a paper column"):
        claim(kind="code", paper="exact (a theorem)")  # our own checks never speak for the paper
    with pytest.raises(ValueError, match="needs a scope"):
        claim(verdict="consistent")  # evidence from another model must say which
    with pytest.raises(ValueError, match="needs a scope"):
        claim(verdict="holds", scope="SmolLM2")
    c = claim(verdict="consistent", scope="SmolLM2-135M, k = 4")
    assert c.label == "consistent: SmolLM2-135M, k = 4" and c.passed
    assert not claim(verdict="inconclusive").passed


def test_interval_verdicts():
    assert interval_verdict(Interval(0.3, 0.1, 0.5, n=9)) == "holds"
    assert interval_verdict(Interval(0.3, 0.1, 0.5, n=9), scope="SmolLM2") == "consistent"
    assert interval_verdict(Interval(0.3, -0.1, 0.5, n=9)) == "inconclusive"
    assert interval_verdict(Interval(-0.3, -0.5, -0.1, n=9), scope="SmolLM2") == "differs"
    assert interval_verdict(Interval(0.3, 0.1, 0.5, n=4)) == "out of reach"  # fewer than 5 points
    assert interval_verdict(Interval(1.2, 1.1, 1.3, n=9), above=1.0) == "holds"


def test_bootstrap_interval_has_the_normal_width():
    """n = 400 draws of N(1, 2^2): the 95% interval of the mean is about 1 +- 1.96 * 2 / 20 = +-0.196,
    and contains the true mean (fixed seeds: deterministic)."""
    x = np.random.default_rng(0).normal(1.0, 2.0, 400)
    iv = bootstrap_interval(x, seed=1)
    assert iv.lo < 1.0 < iv.hi
    assert (iv.hi - iv.lo) / 2 == pytest.approx(1.96 * 2 / 20, rel=0.15)
    est, lo, hi = iv  # unpacks like scipy's results
    assert (est, lo, hi) == (iv.estimate, iv.lo, iv.hi) and iv.n == 400
    rows = np.stack([x, np.ones_like(x)], 1)  # (n, m) units: a ratio of sums per resample
    r = bootstrap_interval(rows, lambda u: u[:, 0].sum() / u[:, 1].sum(), n_boot=2000)
    assert r.estimate == pytest.approx(x.mean()) and r.lo < 1.0 < r.hi


def test_combining_checks():
    """The statement's verdict is its primary check's; secondary checks never veto it."""
    weak = dict(role="underpowered", source="fig_e_lm")
    # a weak check (underpowered, same runs, other protocol) cannot veto a strong one: it was worst-of before
    for role in ("underpowered", "same runs", "other protocol"):
        for v in ("inconclusive", "differs", "out of reach"):
            assert combined_verdict([claim(), claim(verdict=v, role=role)]) == "holds", (role, v)
    assert combined_verdict([claim(verdict="consistent", scope="s"), claim(verdict="inconclusive", **weak)]) == "consistent"
    # and cannot rescue a failing primary either
    assert combined_verdict([claim(verdict="inconclusive"), claim(**weak)]) == "inconclusive"
    assert combined_verdict([claim(verdict="out of reach")]) == "out of reach"
    # an independent check of similar power pointing the other way: the checks disagree
    r = resolve([claim(), claim(verdict="differs", role="independent")])
    assert (r.verdict, r.reason) == ("inconclusive", "checks disagree")
    r = resolve([claim(verdict="differs"), claim(verdict="consistent", scope="s", role="independent")])
    assert (r.verdict, r.reason) == ("inconclusive", "checks disagree")
    # same-sign independent evidence keeps the primary's verdict
    assert resolve([claim(), claim(role="independent")]).verdict == "holds"
    # exactly one primary
    with pytest.raises(ValueError, match="exactly one primary"):
        resolve([claim(), claim()])
    # no primary (its step did not run): a secondary never stands in for it
    r = resolve([claim(role="independent"), claim(role="underpowered")])
    assert (r.verdict, r.reason, r.primary) == ("out of reach", "primary check not run", None)
    with pytest.raises(ValueError, match="role must be one of"):
        claim(role="weak")
    assert all_of(["consistent", "holds"]) == "consistent"
    assert all_of(["consistent", "inconclusive", "holds"]) == "inconclusive"
    assert all_of(["holds", "out of reach"]) == "out of reach"


def test_scope_is_named_for_every_verdict_measured_elsewhere():
    assert claim(verdict="inconclusive", scope="SmolLM2").label == "inconclusive (on SmolLM2)"
    assert claim(verdict="differs", scope="SmolLM2").label == "differs (on SmolLM2)"
    assert claim(verdict="differs").label == "differs"


def test_holm_adjustment():
    """Holm's step-down values: sorted p times (m - rank), made monotone, capped at 1; order kept."""
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    # the case: TAS's raw p = 0.0088 is the smallest but one of 16 comparisons -> not significant
    ps = [0.0088] + [1e-30] * 2 + [0.5] * 13
    assert holm(ps)[0] == pytest.approx(0.0088 * 14) and holm(ps)[0] > 0.05
    assert holm([0.2]) == [0.2] and holm([0.9, 0.9]) == [1.0, 1.0] and holm([0.3, 0.01]) == pytest.approx([0.3, 0.02])


def test_t_interval_is_wider_than_a_percentile_bootstrap_with_ten_units():
    """With 10 units, the t-interval (9 degrees of freedom) is the right width; a percentile bootstrap is narrower."""
    x = np.random.default_rng(3).normal(0.1, 0.1, 10)
    t = t_interval(x)
    assert t.n == 10 and t.lo < x.mean() < t.hi
    half = 2.262 * x.std(ddof=1) / np.sqrt(10)  # t_{0.975, 9}
    assert (t.hi - t.lo) / 2 == pytest.approx(half, rel=1e-3)
    b = bootstrap_interval(x)
    assert (b.hi - b.lo) < (t.hi - t.lo)


def test_mcnemar_mdd():
    # (1.96 + 0.84) sqrt(0.267 / 300) = 0.0835: 8.4 points on 300 problems at a 27% discordance rate
    assert mcnemar_mdd(0.267, 300) == pytest.approx(0.0835, abs=5e-4)
    assert mcnemar_mdd(0.267, 1200) == pytest.approx(mcnemar_mdd(0.267, 300) / 2)


def test_plural():
    assert plural(1, "holds", "hold") == "1 holds" and plural(2, "holds", "hold") == "2 hold"
    assert plural(1, "claim") == "1 claim" and plural(0, "claim") == "0 claims"


# -- the report: one row per statement, three sections, an honest headline ----------------------
def test_report_merges_checks_and_counts_distinct_paper_claims():
    from paper_repro.report import claims_tables, counts, headline

    rows = [
        claim(key="thm2", source="fig_b_gamma"), claim(key="thm2", source="verify", ours="o2", role="independent"),
        claim(key="main-acceptance", verdict="consistent", scope="SmolLM2, k = 4", source="table_h_eval",
              units="300 problems"),
        claim(key="main-acceptance", verdict="inconclusive", source="fig_e_lm", role="underpowered", units="9 prompts"),
        claim(key="main-scores-tas-gpqa", verdict="out of reach"),
        claim(key="taylor-chi2", kind="derived", paper="", ref="PAPER.md note"),
        claim(key="fast-path", kind="code", paper="", ref="exact.py"),
    ]
    c = counts(rows)
    assert sum(c.values()) == 3  # thm2 (two checks), main-acceptance (two checks), main-scores-tas-gpqa
    # the underpowered check does not veto the 300-problem one
    assert c == {"holds": 1, "consistent": 1, "inconclusive": 0, "differs": 0, "out of reach": 1}
    h = headline(rows)
    assert h.startswith("**Theory: 1/1 holds; experiments: of 2 claims of the paper's tables, 1 is consistent on "
                        "another model or task and 1 is out of reach"), h
    assert "1 result we derived (1 holds)" in h and "1 check of our own code (1 pass)" in h
    t = claims_tables(rows)
    assert t["paper"].count("\n") == 4  # header, rule, three statements
    assert "*fig_b_gamma* (primary): o (holds)<br>*verify* (secondary: independent): o2 (holds)" in t["paper"]
    assert "*fig_e_lm* (secondary: underpowered, 9 prompts)" in t["paper"]
    assert "| paper |" not in t["derived"].splitlines()[0] and "| paper |" not in t["code"].splitlines()[0]


def test_headline_plurals_and_theory_split():
    from paper_repro.report import headline

    rows = [claim(key=k) for k in ("thm1", "thm2")] + [claim(key="thm3-gamma", verdict="out of reach")]
    rows += [claim(key=f"x{i}", verdict="differs") for i in range(2)] + [claim(key="y", verdict="inconclusive")]
    h = headline(rows)
    assert "Theory: 2/3 hold (Theorem 3's first bound, Gamma(delta): out of reach)" in h
    assert "of 3 claims of the paper's tables, 1 is inconclusive and 2 differ" in h
    assert "1 differ " not in h and "1 are " not in h and "0 results" in h


# -- verify: rows that test something ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class WrongRecoveryCactus(ct.Cactus):
    """Cactus acceptance with SpS's recovery (q - p)_+: the classic wrong port."""

    def residual(self, p, q, n, *, check=True):
        return ct.SpS().residual(p, q, n, check=check)


def test_sampler_row_turns_red_on_a_wrong_recovery(monkeypatch):
    """The sampling row compares sampler.verify with reference.reference_law (not the rule's own code),
    so a sampler that recovers from (q - p)_+ while accepting with Cactus's h is caught."""
    from cactus_theory import sampler

    assert report._sampler_law(np.random.default_rng(2), 10).verdict == "holds"
    real = sampler.verify

    def wrong(n, P, Q, rule, generator=None, check=True):
        if isinstance(rule, ct.Cactus):
            rule = WrongRecoveryCactus(rule.delta, rule.divergence, rule.solver)
        return real(n, P, Q, rule, generator=generator, check=check)

    monkeypatch.setattr(sampler, "verify", wrong)
    row = report._sampler_law(np.random.default_rng(2), 10)
    assert row.verdict == "differs" and "Cactus" in row.detail, row


def test_reference_row_turns_red_on_planted_ports(monkeypatch):
    """TAS accepting at an exact tie (>= for >), and top-k recovering from q when asked for the
    authors' recovery: both slip past self-consistency checks, not past the reference row."""
    from cactus_theory import rules

    assert report._reference_laws(np.random.default_rng(5), 30).verdict == "holds"
    with monkeypatch.context() as m:
        m.setattr(rules.TAS, "phi", lambda self, p_n, q_n, e: ((q_n >= np.minimum(self.alpha * e, self.epsilon))
                                                                .astype(q_n.dtype)))
        row = report._reference_laws(np.random.default_rng(5), 30)
        assert row.verdict == "differs" and "TAS" in row.detail, row
    with monkeypatch.context() as m:
        m.setattr(rules.TopK, "residual", lambda self, p, q, n, check=True: q + 0 * p)
        row = report._reference_laws(np.random.default_rng(5), 30)
        assert row.verdict == "differs" and "recovery='topk'" in row.detail, row


def test_theorem3_row_has_finite_strict_cases():
    row = report._theorem3(np.random.default_rng(0), 10)
    strict, total = (int(x) for x in row.ours.split("strict (D(h_alg||q) < D(p||q)) in ")[1].split(",")[0].split(" of "))
    assert row.verdict == "holds" and total == 70 and strict >= total // 2
    assert "all with finite D(p || q)" in row.how


def test_verify_draws_a_fresh_seed_prints_it_and_replays(monkeypatch, capsys):
    monkeypatch.setattr(report, "CLAIMS", [report._corollary6, report.worked_example_claim, report._reference_laws])
    p = argparse.ArgumentParser()
    report.configure(p)
    assert report.run(p.parse_args(["--cases", "5"])) == 0
    first = capsys.readouterr().out
    seed = int(first.split("seed ")[1].split(" ")[0])
    assert f"replay with --seed {seed}" in first
    report.run(p.parse_args(["--cases", "5"]))
    assert f"seed {seed} " not in capsys.readouterr().out  # another run, another seed
    report.run(p.parse_args(["--cases", "5", "--seed", str(seed)]))
    again = capsys.readouterr().out
    strip = lambda s: s.split("# cactus-theory verify")[1].split("\n(")[0]  # noqa: E731  (drop the timing)
    assert strip(again) == strip(first)
    assert "## Claims of the paper" in again and "## Checks of our own code" in again


def test_make_pair_generates_ties():
    """The case kinds include exact and near ties at TAS's and top-k's thresholds."""
    from scipy.stats import entropy

    rng = np.random.default_rng(0)
    exact = near = 0
    for _ in range(200):
        p, q, n = report.make_pair("tas_tie", int(rng.integers(2, 12)), rng)
        thr = min(0.09, 0.3 * np.exp(-entropy(q)))
        rel = abs(q[n] - thr) / thr
        assert rel <= 2e-6 and abs(q.sum() - 1) < 1e-12
        exact += rel == 0
        near += 0 < rel
    assert exact >= 10 and near >= 50
    ties = 0
    for _ in range(100):
        p, q, n = report.make_pair("topk_tie", int(rng.integers(2, 12)), rng)
        ties += int(np.sum(np.abs(q - q[n]) <= 2e-12 * q[n])) >= 2
    assert ties == 100


# -- non-inferiority (the replicated eval's accuracy claims) ----------------------------------------------
def test_noninferiority_is_scipy_s_one_sided_t_test_and_its_interval():
    from scipy import stats

    rng = np.random.default_rng(0)
    d = rng.normal(-0.01, 0.2, 500)
    r = noninferiority(d, 0.03)
    assert r.p_noninferior == pytest.approx(stats.ttest_1samp(d + 0.03, 0, alternative="greater").pvalue)
    assert r.p_inferior == pytest.approx(stats.ttest_1samp(d + 0.03, 0, alternative="less").pvalue)
    lo, hi = stats.t.interval(0.95, 499, loc=d.mean(), scale=stats.sem(d))
    assert (r.estimate, r.lo, r.hi) == pytest.approx((d.mean(), lo, hi))
    # the lower end sits at -margin exactly when the non-inferiority p-value is 0.025 (one rule, two readings)
    at = noninferiority(d - 0.03 - r.lo, 0.03)
    assert at.lo == pytest.approx(-0.03) and at.p_noninferior == pytest.approx(0.025)
    assert noninferiority(np.zeros(5), 0.03).p_noninferior == 0.0  # no spread: decided, never NaN
    assert noninferiority(np.full(5, -0.1), 0.03).p_inferior == 0.0
    with pytest.raises(ValueError, match="margin"):
        noninferiority(d, 0.0)
    with pytest.raises(ValueError, match="at least 2"):
        noninferiority([0.1], 0.03)


def test_noninferiority_verdict_reaches_each_verdict():
    def part(est, half, n=1000, m=0.03):
        return noninferiority(np.array([est - half, est + half] * (n // 2)) if half else np.full(n, est), m)

    ok, mid, bad = part(0.0, 0.2), part(-0.03, 0.2), part(-0.15, 0.2)
    assert ok.lo > -0.03 and mid.lo < -0.03 < mid.hi and bad.hi < -0.03
    assert noninferiority_verdict([ok, ok], scope="SmolLM2") == "consistent"
    assert noninferiority_verdict([ok, ok]) == "holds"
    assert noninferiority_verdict([ok, mid], scope="SmolLM2") == "inconclusive"
    assert noninferiority_verdict([ok, mid, bad], scope="SmolLM2") == "differs"  # the weakest part decides
    # a reference at or below min_reference: the rule could not fall the margin below it: no verdict
    assert noninferiority_verdict([ok, ok], references=[0.4, 0.05], min_reference=0.06) == "out of reach"
    assert noninferiority_verdict([ok, ok], references=[0.4, 0.3], min_reference=0.06) == "holds"
    assert noninferiority_verdict([]) == "out of reach"


def test_noninferiority_sample_size_power_and_mdd():
    from scipy import stats

    sd = 0.3
    n = noninferiority_sample_size(sd, 0.03)
    assert noninferiority_power(sd, n, 0.03) >= 0.8 > noninferiority_power(sd, n - 1, 0.03)
    normal = ((stats.norm.isf(0.025) + stats.norm.ppf(0.8)) * sd / 0.03) ** 2
    assert abs(n - normal) < 5  # the normal approximation, to a few units at n ~ 800
    assert noninferiority_power(sd, n, 0.03, true_difference=-0.03) == pytest.approx(0.025, abs=1e-3)  # at the margin
    m = t_mdd(sd, n)
    assert m == pytest.approx((stats.t.isf(0.025, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / np.sqrt(n))
    assert m == pytest.approx(mcnemar_mdd(sd ** 2, n), rel=0.01)  # McNemar's normal MDD at the same variance per unit


def test_jackknife_t_interval_is_the_t_interval_for_a_mean_and_covers_a_ratio_at_nine_units():
    """For a mean the jackknife standard error is s / sqrt(n) exactly; for a ratio of sums over 9 units (step e's
    AL) it is close to the delta method's, and the interval's coverage over 2,000 simulated samples (fixed seed) lies
    within [0.92, 0.97] (nominal 0.95; the binomial error of 2,000 trials is 0.005)."""
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 0.3, 9)
    a, b = jackknife_t_interval(x, np.mean), t_interval(x)
    assert (a.estimate, a.lo, a.hi) == pytest.approx((b.estimate, b.lo, b.hi))
    ratio = lambda u: u[:, 0].sum() / u[:, 1].sum()  # noqa: E731
    u = np.column_stack([rng.gamma(4, 1, 9) * 2.0, rng.gamma(4, 1, 9)])
    r = ratio(u)
    delta = np.sqrt(((u[:, 0] - r * u[:, 1]) ** 2).sum() / (9 * 8)) / u[:, 1].mean()  # linearised standard error
    iv = jackknife_t_interval(u, ratio)
    from scipy import stats

    assert (iv.hi - iv.lo) / 2 == pytest.approx(stats.t.ppf(0.975, 8) * delta, rel=0.15)
    hits = 0
    for _ in range(2000):
        den = rng.gamma(4, 1, 9)
        num = 2.0 * den + rng.normal(0, 1.0, 9)  # E[num] / E[den] = 2
        iv = jackknife_t_interval(np.column_stack([num, den]), ratio)
        hits += iv.lo <= 2.0 <= iv.hi
    assert 0.92 <= hits / 2000 <= 0.97
