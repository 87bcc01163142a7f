"""Figure c draws the same bytes whatever order its result's families arrive in: a fresh computation (the
sweep's order) and its cached JSON (keys sorted) must give one figure, or a rerun from the cache rewrites a
committed figure that nothing changed."""

from __future__ import annotations

import json
from pathlib import Path

from paper_repro import fig_c_tradeoff as fc
from paper_repro.common import Ctx

ROOT = Path(__file__).resolve().parents[2]


def _draw(d: dict, tmp: Path) -> bytes:
    fc.plot(d, Ctx(results=tmp / "r", figures=tmp / "f", fast=True))
    return (tmp / "f" / "fig_c_tradeoff.svg").read_bytes()


def test_the_figure_does_not_depend_on_the_order_of_the_families(tmp_path):
    d = json.loads((ROOT / "paper_repro" / "results" / "fig_c_tradeoff.json").read_text())["data"]
    d = {"random": d["random"]}  # one panel: the order question is the same on both
    reordered = {"random": dict(reversed(list(d["random"].items())))}
    assert list(reordered["random"]) != list(d["random"])
    a, b = _draw(d, tmp_path / "a"), _draw(reordered, tmp_path / "b")
    assert a == b
