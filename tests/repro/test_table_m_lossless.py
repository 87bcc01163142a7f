"""Step m on a tiny random pair (fast mode): the four audits run, their table and claims hold; a planted
cache bug turns the float32 chain's claim to 'differs'."""

from __future__ import annotations

import pytest

from cactus_theory.lm import cache
from paper_repro import table_m_lossless as m
from paper_repro.common import Ctx
from tests.lm.common import EOS, pair

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(tmp_path):
    return m.run(Ctx(fast=True, results=tmp_path, figures=tmp_path, lm={"pair": pair(EOS)}))


def test_step_m_runs_and_holds(tmp_path):
    res = _run(tmp_path)
    assert [c.verdict for c in res.claims] == ["holds"] * 4
    text = (tmp_path / "table_m_lossless.md").read_text()
    assert text.count("| holds |") == 4 and "bfloat16" in text
    assert all(r["setting"]["dtype"] == d for r, (d, _) in zip(res.data["audit"], m.CONFIGS, strict=True))


def test_step_m_fails_on_a_cache_bug(tmp_path, monkeypatch):
    real = cache.Target.advance
    planted = []

    def advance(self, a, last):
        keep = a.clone()
        if not planted and int(a[0]) < 4:
            keep[0] += 1
            planted.append(True)
        real(self, keep, last)

    monkeypatch.setattr(cache.Target, "advance", advance)
    monkeypatch.setattr(m, "CONFIGS", [("float32", "chain")])
    res = _run(tmp_path)
    assert planted and res.claims[0].verdict == "differs"
