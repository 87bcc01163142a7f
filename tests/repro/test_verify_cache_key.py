"""The verify step's cache key names the checks it runs: the committed result is served while the list is
unchanged, and a claim added to ``claims.report.CLAIMS`` is a cache miss (the step recomputes), not the old
list served again."""

from __future__ import annotations

from pathlib import Path

import pytest

from cactus_theory.claims import report
from paper_repro.common import Ctx, NotCached
from paper_repro.main import verify_step

RESULTS = Path(__file__).resolve().parents[2] / "paper_repro" / "results"


def test_a_claim_added_to_the_checks_misses_the_cache(monkeypatch, tmp_path):
    ctx = Ctx(results=RESULTS, figures=tmp_path, cache_only=True)  # cache_only: reads, never writes
    rows = verify_step(ctx, 100, selected=False)  # the committed run: full mode, 100 cases
    assert [r.claim for r in rows] and len(rows) == len(report.CLAIMS)

    def throwaway(rng, cases):  # pragma: no cover - never run: the cache lookup must miss first
        raise AssertionError("computed")

    monkeypatch.setattr(report, "CLAIMS", [*report.CLAIMS, throwaway])
    with pytest.raises(NotCached):
        verify_step(ctx, 100, selected=False)
