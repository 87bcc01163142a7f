"""The reproduction's step contract: ``paper_repro.steps.STEPS`` is the one list of steps, and the run
order, the ``--only`` / ``--no-lm`` help, REPORT.md's figures and sections, README.md's findings hooks and
the script table of ``paper_repro/README.md`` all derive from it; a step registered with one line appears
in every one of them; every step module runs alone through ``common.standalone``."""

from __future__ import annotations

import argparse
import ast
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from paper_repro import main, report, steps  # noqa: E402
from paper_repro.common import Claim, Ctx, StepResult, cached_step  # noqa: E402


def _help(parser: argparse.ArgumentParser, dest: str) -> str:
    return next(a.help for a in parser._actions if a.dest == dest)


def test_main_runs_the_registered_steps_in_order():
    assert list(main.STEPS) == [s.id for s in steps.STEPS]
    assert list(main.STEPS.values()) == [s.module for s in steps.STEPS]
    assert main.LM_STEPS == tuple(s.id for s in steps.STEPS if s.lm)
    assert list(main.STEPS)[:4] == ["a", "b", "d", "e"] and set(main.LM_STEPS) == {"e", "f", "h", "j", "l", "m", "n", "o"}


def test_only_and_no_lm_help_list_exactly_the_registered_steps():
    p = argparse.ArgumentParser()
    main.configure(p)
    listed = _help(p, "only").split("among ", 1)[1].split(";", 1)[0].split(",")
    assert sorted(listed) == sorted([*steps.ids(), "verify"])
    no_lm = _help(p, "no_lm")
    assert all(f" {i}" in no_lm for i in steps.lm_ids())
    assert not [s.id for s in steps.STEPS if not s.lm and f" {s.id}," in no_lm + ","]


def test_report_captions_are_the_registry_s():
    assert report.FIGURE_TEXT == {s.figure: (s.title, s.caption) for s in steps.STEPS if s.figure}
    assert {"fig_h_eval", "fig_i_multi_draft"} <= set(report.FIGURE_TEXT)


def test_the_committed_readme_table_is_the_generated_one():
    text = steps.README.read_text()
    block = text.split(steps.TABLE_BEGIN, 1)[1].split(steps.TABLE_END, 1)[0].strip("\n")
    assert block == steps.readme_table()
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    scripts = [r.split("`", 2)[1] for r in rows]
    assert [f"{s.module}.py" for s in sorted(steps.STEPS, key=lambda s: s.id)] == [
        x for x in scripts if x[:-3] in steps.by_module()]
    assert scripts.index("lm_runs.py") == scripts.index("fig_e_lm.py") - 1  # before the first LM step


def test_every_step_module_is_registered_and_runs_alone_through_standalone():
    on_disk = {p.stem for p in (ROOT / "paper_repro").glob("*.py") if p.stem[:4] in ("fig_", "tabl")}
    assert on_disk == set(steps.by_module())
    for s in steps.STEPS:
        tree = ast.parse((ROOT / "paper_repro" / f"{s.module}.py").read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body), s.module
        mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert len(mains) == 1 and ast.unparse(mains[0].body[0]).strip() == "standalone(run)", s.module


def test_readme_images_are_registered_figures():
    text = (ROOT / "README.md").read_text()
    shown = {(alt, stem) for alt, stem in
             __import__("re").findall(r"!\[([^\]]*)\]\(figures/([\w]+)\.png\)", text)}
    assert shown == {(s.readme_image, s.figure) for s in steps.STEPS if s.readme_image}


@pytest.mark.parametrize("bad", [dict(id="ab"), dict(id="A"), dict(figure="x"), dict(readme_image="x")])
def test_a_malformed_step_is_refused(bad):
    kw = dict(id="z", module="fig_z", makes="-") | bad
    with pytest.raises(ValueError):
        steps.Step(**kw)


# -- a planted step appears everywhere ----------------------------------------------------------------

PLANTED = steps.Step("z", "fig_z_planted", "`figures/fig_z_planted`: a planted figure", "nothing", "< 1 s",
                     figure="fig_z_planted", title="z. The planted figure", caption="a planted caption.",
                     section=True, findings=True)


def _planted_module() -> types.ModuleType:
    mod = types.ModuleType("paper_repro.fig_z_planted")

    def run(ctx: Ctx) -> StepResult:
        def plot(d, c):
            return [c.figures / "fig_z_planted.png", c.figures / "fig_z_planted.svg"]

        def claims(d):
            return [Claim(key="planted", claim="planted claim", ref="-", how="-", ours=str(d["x"]), kind="code",
                          verdict="holds")]

        return cached_step(ctx, "fig_z_planted", {"x": 1}, lambda: {"x": 41 + 1}, plot, claims)

    mod.run = run
    mod.section = lambda d: f"## z. Planted section\n\nx = {d['x']}"
    mod.findings = lambda results, claims: [f"* planted finding ({len(claims)} rows)"]
    return mod


@pytest.fixture
def planted(monkeypatch):
    monkeypatch.setattr(steps, "STEPS", [*steps.STEPS, PLANTED])
    monkeypatch.setitem(sys.modules, "paper_repro.fig_z_planted", _planted_module())
    return PLANTED


def test_a_planted_step_appears_in_main_help_report_findings_and_readme_table(planted, tmp_path):
    from paper_repro import findings

    p = argparse.ArgumentParser()
    main.configure(p)
    assert ",z," in _help(p, "only") + "," or "z,verify" in _help(p, "only")
    args = p.parse_args(["--only", "z", "--results", str(tmp_path / "r")])
    assert main._check(args) == ["z"]
    assert "fig_z_planted.py" in steps.readme_table() and "a planted figure" in steps.readme_table()
    ctx = Ctx(results=tmp_path / "r", figures=tmp_path / "f", fast=True)
    out = main.repro(ctx, ["z"], lm=False, report=tmp_path / "REPORT.md")
    assert [s.name for s in out["steps"]] == ["fig_z_planted"]
    text = out["report"]
    assert "### z. The planted figure" in text and "a planted caption." in text
    assert "## z. Planted section\n\nx = 42" in text
    assert "| fig_z_planted |" in text  # its recorded compute time
    assert "* planted finding (1 rows)" in findings.findings(ctx.results)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{steps.TABLE_BEGIN}\nold\n{steps.TABLE_END}\nend\n")
    assert steps.update_readme(readme) and "`fig_z_planted.py`" in readme.read_text()
    assert not steps.update_readme(readme)


def test_without_the_planted_step_none_of_it_appears(tmp_path):
    p = argparse.ArgumentParser()
    main.configure(p)
    assert "z" not in _help(p, "only").split("among ", 1)[1].split(";")[0].split(",")
    with pytest.raises(ValueError, match="--only"):
        main._check(p.parse_args(["--only", "z"]))
    assert "fig_z_planted" not in steps.readme_table()
