"""Step o on a tiny random pair (fast mode): the calibration matches each budget with a Cactus delta, every
budget method keeps every answer's realised KL within its budget (the certificate), the table and the claims
are written, a rerun computes nothing, and the matching interpolates the calibration curve as documented."""

from __future__ import annotations

import numpy as np
import pytest

from paper_repro import table_o_sequence_budget as o
from paper_repro.common import Ctx
from tests.lm.common import EOS, pair

pytestmark = pytest.mark.usefixtures("one_thread")


def test_step_o_runs_on_the_tiny_pair_and_keeps_every_budget(tmp_path):
    ctx = Ctx(fast=True, results=tmp_path, figures=tmp_path, lm={"pair": pair(EOS)})
    res = o.run(ctx)
    d = res.data
    n = len(o.BUDGETS) * len(o.ALLOCATIONS)
    assert len(d["comparisons"]) == n and len(res.claims) == 2 * n
    for c in d["comparisons"]:
        assert c["certificate_max"] <= c["budget"] and o._certificate(c) == "holds"
        rows = {r["label"]: r for r in d["rows"]}
        assert c["delta"] > 0 and c["cactus"] in rows
        assert rows[c["method"]]["kl_max"] == c["certificate_max"]
    assert all(cl.verdict == "holds" for cl in res.claims if cl.key.startswith("sequence-budget-certificate-"))
    text = (tmp_path / "table_o_sequence_budget.md").read_text()
    assert "| budget 0.5 (spend_down) |" in text and "Calibration (first batch)" in text
    assert o.section(d).startswith("### o. ")
    lines = o.findings(tmp_path, res.claims)  # README's bullet and its table, read from the stored result
    assert lines[0].startswith("* **A KL budget") and f"{n}/{n}" in lines[0]
    table = [ln for ln in lines if ln.startswith("| ") and "allocation" not in ln]
    assert len(table) == n
    for c, ln in zip(d["comparisons"], table, strict=True):
        cells = [x.strip() for x in ln.strip("|").split("|")]
        assert cells[:3] == [f"{c['budget']:g}", c["allocation"], o.fmt(c["certificate_max"])]
        assert cells[3].startswith(c["cactus"])
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.json")}
    o.run(ctx)  # from the cache: nothing recomputed
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.json")} == stamps


def test_match_delta_interpolates_the_monotone_calibration_curve():
    ladder, kls = [0.01, 0.1, 1.0], [0.2, 2.0, 20.0]  # KL proportional to delta: the log-log line is exact
    assert o.match_delta(ladder, kls, 0.632) == (pytest.approx(0.0316, rel=1e-3), False)
    assert o.match_delta(ladder, kls, 100.0) == (1.0, True)  # beyond the ladder: clamped, flagged
    d, out = o.match_delta(ladder, [0.2, 0.1, 20.0], 0.3)  # a dip is read as its running maximum (0.2, 0.2, 20)
    assert 0.1 < d < 1.0 and not out
    assert np.isfinite(o.match_delta(ladder, [0.0, 0.0, 1.0], 0.5)[0])
