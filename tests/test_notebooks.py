"""The notebooks: committed executed (with figures) and equal to their percent-script sources, and
every one runs top to bottom in fast mode (CACTUS_FAST=1). Each notebook asserts its own results
(a failing ``assert`` fails the cell, and the test)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = ["01_closed_form_vs_cvxpy", "02_exact_laws_and_gamma", "03_statistical_tests", "04_decoding_with_real_lms",
         "05_multi_draft_cactus"]


def _builder():
    spec = importlib.util.spec_from_file_location("nb_build", NB_DIR / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


build = _builder()


def test_every_source_has_its_committed_executed_notebook():
    assert [s.stem for s in build.SOURCES] == NAMES
    assert build.check() == []  # same cells as the source, every code cell executed, no error


def test_figures_are_committed():
    import nbformat

    for name in NAMES:
        nb = nbformat.read(NB_DIR / f"{name}.ipynb", as_version=4)
        shows = sum("plt.show()" in c.source for c in nb.cells if c.cell_type == "code")
        pngs = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        assert pngs == shows, (name, shows, pngs)


def test_check_notices_a_stale_notebook(tmp_path, monkeypatch):
    import nbformat

    nb = nbformat.read(NB_DIR / f"{NAMES[0]}.ipynb", as_version=4)
    nb.cells[-1].source += "\n# edited"
    (tmp_path / f"{NAMES[0]}.ipynb").write_text(nbformat.writes(nb))
    (tmp_path / f"{NAMES[0]}.py").write_text((NB_DIR / f"{NAMES[0]}.py").read_text())
    monkeypatch.setattr(build, "HERE", tmp_path)
    monkeypatch.setattr(build, "SOURCES", [tmp_path / f"{NAMES[0]}.py"])
    assert build.check() and "cells differ" in build.check()[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_fast_mode(name):
    nb = build.execute(build.notebook_from_source(NB_DIR / f"{name}.py"), fast=True)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code)
    assert not [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    printed = "".join(o.get("text", "") for c in code for o in c.get("outputs", []) if o.get("name") == "stdout")
    assert printed.strip(), f"{name} printed nothing"
    if name == NAMES[2]:  # byte-stable: the scrubbed rendering of a second run is identical
        again = build.execute(build.notebook_from_source(NB_DIR / f"{name}.py"), fast=True)
        assert build.render(build.scrub(again)) == build.render(build.scrub(nb))
