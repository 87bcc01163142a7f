"""Step o re-read from its committed JSON (issue 41 item 9): Holm over the AL family checked against a direct
step-down implementation, the KL match re-derived from the rows, the accuracy MDD at Holm's first step re-derived
with the standard library's normal quantiles, and the committed table / claims reading them."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from paper_repro import table_o_sequence_budget as o
from paper_repro.common import RESULTS
from tests.helpers import holm_written_out

Z = NormalDist().inv_cdf


@pytest.fixture(scope="module")
def d():
    return json.loads((RESULTS / f"{o.NAME}.json").read_text())["data"]


def _p_from_interval(est, lo, hi):
    """Two-sided normal p-value with SE = width / (2 z_0.975), by erfc."""
    se = (hi - lo) / (2 * Z(0.975))
    return math.erfc(abs(est) / se / math.sqrt(2))


def test_holm_over_the_al_family_matches_a_direct_step_down(d):
    rr = o.reread(d)
    comps = d["comparisons"]
    p = [_p_from_interval(*c["al_diff"]) for c in comps]
    assert [r["al_p"] for r in rr] == pytest.approx(p, rel=1e-9)
    adj, rejected = holm_written_out(p)
    assert [r["al_holm"] for r in rr] == pytest.approx(adj, rel=1e-9)
    assert {i for i, r in enumerate(rr) if r["al_holm"] < 0.05} == rejected
    # Holm alone: 0 higher, 3 lower (B = 0.5, 1, 2 spend_down), 5 inconclusive; B = 4 spend_down (raw p 0.015) is no
    # longer below its step's level 0.05 / 5
    assert {comps[i]["method"] for i in rejected} == {f"budget {b} (spend_down)" for b in ("0.5", "1", "2")}
    assert all(comps[i]["al_diff"][0] < 0 for i in rejected)
    b4 = next(i for i, c in enumerate(comps) if c["method"] == "budget 4 (spend_down)")
    assert p[b4] < 0.05 < rr[b4]["al_holm"] and sorted(p).index(p[b4]) == 3 and p[b4] > 0.05 / 5


def test_holm_direct_agrees_with_the_library_on_random_families():
    from cactus_theory.claims.ledger import holm

    rng = np.random.default_rng(41)
    for _ in range(200):
        m = int(rng.integers(1, 12))
        p = list(rng.uniform(0, 1, m) ** rng.uniform(0.3, 4))
        adj, rejected = holm_written_out(p)
        assert holm(p) == pytest.approx(adj, rel=1e-12, abs=1e-15)
        assert {i for i, a in enumerate(holm(p)) if a <= 0.05} == rejected


def test_the_match_is_read_from_the_rows(d):
    rows = {r["label"]: r for r in d["rows"]}
    clamped = {t["method"] for t in d["calibration"]["targets"] if t["outside_ladder"]}
    assert clamped == {"budget 1 (lagrangian)"}
    gaps = {}
    for c, r in zip(d["comparisons"], o.reread(d), strict=True):
        b, k = rows[c["method"]]["kl_mean"], rows[c["cactus"]]["kl_mean"]
        gaps[c["method"]] = 100 * (k[0] / b[0] - 1)
        assert r["kl_gap_pct"] == pytest.approx(gaps[c["method"]])
        assert r["matched"] == (c["method"] not in clamped and b[1] <= k[0] <= b[2])
        if not r["matched"]:
            assert r["al_reading"] == "not matched"
    # the matched Cactus spent 19, 13, 10 and 2% more mean KL per answer than the spend_down budgets
    assert [round(gaps[f"budget {b} (spend_down)"]) for b in ("0.5", "1", "2", "4")] == [19, 13, 10, 2]
    # B = 1 lagrangian: delta at the ladder's end, Cactus 0.016 against the budget's 0.035 nats
    lag = next(c for c in d["comparisons"] if c["method"] == "budget 1 (lagrangian)")
    assert lag["delta"] == min(d["calibration"]["ladder"])
    assert f"{rows[lag['cactus']]['kl_mean'][0]:.3f}" == "0.016" and f"{rows[lag['method']]['kl_mean'][0]:.3f}" == "0.035"
    assert {r["method"] for r in o.reread(d) if not r["matched"]} == {
        "budget 0.5 (spend_down)", "budget 1 (spend_down)", "budget 2 (spend_down)", "budget 1 (lagrangian)"}


def test_mdd_at_holms_first_step(d):
    n, m = d["config"]["problems"], len(d["comparisons"])
    out = []
    for c, r in zip(d["comparisons"], o.reread(d), strict=True):
        disc = n * (c["mdd"] / (Z(0.975) + Z(0.8))) ** 2  # the discordance the stored MDD was computed at
        direct = (Z(1 - 0.05 / (2 * m)) + Z(0.8)) * math.sqrt(disc / n)
        assert r["mdd_holm"] == pytest.approx(direct, rel=1e-9) and r["mdd_holm"] > c["mdd"]
        out.append(direct)
    unadjusted = [c["mdd"] for c in d["comparisons"]]
    assert (f"{100 * min(unadjusted):.1f}", f"{100 * max(unadjusted):.1f}") == ("4.2", "7.1")
    assert (f"{100 * min(out):.1f}", f"{100 * max(out):.1f}") == ("5.3", "9.0")


def test_committed_table_and_claims_read_the_reread(d):
    from paper_repro.findings import load_claims

    assert (RESULTS / f"{o.NAME}.md").read_text() == o.render(d)
    text = o.render(d)
    assert "Holm over its 8 comparisons" in text and "alpha 0.05 / 8" in text
    assert "0 higher, 3 lower, 5 no difference detected" in text
    committed = {c.key: c for c in load_claims(RESULTS) if c.key.startswith("sequence-budget-vs-cactus-")}
    assert len(committed) == 8
    for c, r in zip(d["comparisons"], o.reread(d), strict=True):
        row = committed[f"sequence-budget-vs-cactus-{c['budget']:g}-{c['allocation']}"]
        expect = {"not matched": "out of reach", "higher": "holds", "lower": "differs"}.get(r["al_reading"],
                                                                                            "inconclusive")
        assert row.verdict == expect and "Holm over the 8 budgets x allocations comparisons of AL" in row.family
        assert f"detectable {100 * r['mdd_holm']:.1f} points at alpha 0.05 / 8" in row.ours
