"""Step n on a tiny random pair (fast mode): both comparisons run through check_generation, are not rejected
and carry their answer-level detectable difference; a lossy rule in place of SpS is rejected."""

from __future__ import annotations

from pathlib import Path

import pytest

from paper_repro import table_n_lossless_law as n
from paper_repro.common import Ctx
from tests.lm.common import EOS, pair

pytestmark = pytest.mark.usefixtures("one_thread")


def test_step_n_runs_and_does_not_reject(tmp_path):
    res = n.run(Ctx(fast=True, results=tmp_path, figures=tmp_path, lm={"pair": pair(EOS)}))
    assert len(res.claims) == 2 and all(c.verdict in ("holds", "inconclusive") for c in res.claims)
    for c in res.data["comparisons"]:
        assert not c["check"]["reject"] and c["answer_mdd"] > 0
        assert len(c["check"]["tests"]) >= 3  # positions and the answer test
    assert "| SpS, chain k = 4 vs verifier alone |" in (tmp_path / "table_n_lossless_law.md").read_text()


def test_step_n_rejects_a_lossy_rule(tmp_path, monkeypatch):
    import cactus_theory as ct

    monkeypatch.setattr(n, "RULE", ct.Cactus(50.0))  # accepts nearly every draft: the law moves towards p
    res = n.run(Ctx(fast=True, results=tmp_path, figures=tmp_path, lm={"pair": pair(EOS)}))
    assert [c.verdict for c in res.claims] == ["differs", "differs"]


def test_the_eval_gap_reads_the_committed_eval(tmp_path):
    """Cochran's Q of the committed eval's three lossless runs, against a direct computation on the same records;
    the permutation p-value is near the chi-square one (300 problems); a missing file gives None."""
    import json

    import numpy as np
    from scipy import stats

    path = Path(__file__).resolve().parents[2] / "paper_repro" / "results" / "eval" / "eval.json"
    g = n.eval_gap(path, permutations=4000)
    rec = json.loads(path.read_text())["records"]
    x = np.array([[r["correct"] for r in rec[m]] for m in n.EVAL_LOSSLESS], float)  # (3, problems)
    t, rows = x.sum(1), x.sum(0)
    q = 2 * (3 * (t ** 2).sum() - t.sum() ** 2) / (3 * t.sum() - (rows ** 2).sum())
    assert g["cochran_q"] == pytest.approx(q) and g["p_chi2"] == pytest.approx(stats.chi2.sf(q, 2))
    assert g["accuracy"] == pytest.approx(x.mean(1).tolist())
    assert abs(g["p_permutation"] - g["p_chi2"]) < 0.006  # 4000 shuffles: sd of the estimate ~0.0016
    assert n.eval_gap(tmp_path / "missing.json") is None
