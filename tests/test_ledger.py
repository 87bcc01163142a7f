"""The claims ledger: the shared Claim type, interval verdicts, the report's grouping, and
``cactus-theory verify`` rows that turn red on planted wrong ports."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import cactus_theory as ct
from cactus_theory import report
from cactus_theory.claims import (
    Claim,
    Interval,
    all_of,
    bootstrap_interval,
    combined_verdict,
    interval_verdict,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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
    assert combined_verdict([claim(), claim(verdict="differs")]) == "differs"
    assert combined_verdict([claim(), claim(verdict="out of reach")]) == "holds"
    assert combined_verdict([claim(verdict="consistent", scope="s"), claim(verdict="out of reach")]) == "consistent"
    assert combined_verdict([claim(verdict="out of reach")]) == "out of reach"
    assert all_of(["consistent", "holds"]) == "consistent"
    assert all_of(["consistent", "inconclusive", "holds"]) == "inconclusive"
    assert all_of(["holds", "out of reach"]) == "out of reach"


# -- the report: one row per statement, three sections, an honest headline ----------------------
def test_report_merges_checks_and_counts_distinct_paper_claims():
    from paper_repro.report import claims_tables, counts, headline

    rows = [
        claim(key="thm2", source="fig_b_gamma"), claim(key="thm2", source="verify", ours="o2"),
        claim(key="main-acceptance", verdict="consistent", scope="SmolLM2, k = 4", source="fig_e_lm"),
        claim(key="main-acceptance", verdict="inconclusive", source="table_f_main"),
        claim(key="main-scores", verdict="out of reach"),
        claim(key="taylor-chi2", kind="derived", paper="", ref="PAPER.md note"),
        claim(key="fast-path", kind="code", paper="", ref="exact.py"),
    ]
    c = counts(rows)
    assert sum(c.values()) == 3  # thm2 (two checks), main-acceptance (two checks), main-scores
    assert c == {"holds": 1, "consistent": 0, "inconclusive": 1, "differs": 0, "out of reach": 1}
    h = headline(rows)
    assert "Of the paper's 3 distinct claims" in h and "1 results we derived" in h and "1 checks of our own code" in h
    t = claims_tables(rows)
    assert t["paper"].count("\n") == 4  # header, rule, three statements
    assert "*fig_b_gamma*: o<br>*verify*: o2" in t["paper"]
    assert "| paper |" not in t["derived"].splitlines()[0] and "| paper |" not in t["code"].splitlines()[0]


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
