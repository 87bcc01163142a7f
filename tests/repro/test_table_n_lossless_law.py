"""Step n on a tiny random pair (fast mode): both comparisons run through check_generation, are not rejected
and carry their answer-level detectable difference; a lossy rule in place of SpS is rejected."""

from __future__ import annotations

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
