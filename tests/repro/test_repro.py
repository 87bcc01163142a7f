"""Smoke and behaviour tests of paper_repro in fast mode: caching (atomic, resumable, cache-only),
the figure steps' numbers, and the whole ``repro`` job end to end on a tiny random LM pair."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from transformers import LlamaForCausalLM

import cactus_theory as ct
from cactus_theory.lm import ModelPair
from paper_repro import fig_a_worked_example, fig_b_gamma, fig_c_tradeoff, lm_runs
from paper_repro.common import Claim, Ctx, NotCached, Parts, cached
from paper_repro.main import configure, repro
from paper_repro.main import run as main_run
from paper_repro.steps import ids as steps_ids
from tests.helpers import tiny_llama


def ctx(tmp_path: Path, **kw) -> Ctx:
    return Ctx(results=tmp_path / "results", figures=tmp_path / "figures", fast=True, **kw)


# -- caching -------------------------------------------------------------------------------------

def test_cached_computes_once_per_config_and_leaves_no_temporaries(tmp_path):
    calls = []
    c = ctx(tmp_path)
    f = lambda: calls.append(1) or {"x": np.float64(1.5), "a": np.arange(3)}  # noqa: E731
    assert cached(c, "s", {"k": 1}, f) == {"x": 1.5, "a": [0, 1, 2]}
    assert cached(c, "s", {"k": 1}, f) == {"x": 1.5, "a": [0, 1, 2]}
    assert len(calls) == 1
    cached(c, "s", {"k": 2}, f)  # new config -> recomputed
    assert len(calls) == 2
    (c.results / "s.json").write_text("{not json")  # a damaged cache is recomputed, not fatal
    cached(c, "s", {"k": 2}, f)
    assert len(calls) == 3
    assert json.loads((c.results / "s.json").read_text())["config"] == {"k": 2}
    assert not [p for p in c.results.iterdir() if "tmp" in p.name]


def test_cache_only_never_computes(tmp_path):
    c = ctx(tmp_path, cache_only=True)
    with pytest.raises(NotCached):
        cached(c, "s", {"k": 1}, lambda: {"x": 1})
    with pytest.raises(NotCached):
        Parts(c, "p", {"k": 1})


def test_parts_resume_and_reset_on_new_config(tmp_path):
    c = ctx(tmp_path)
    calls = []
    parts = Parts(c, "p", {"k": 1})
    parts.get("a", lambda: calls.append("a") or 1)
    parts = Parts(c, "p", {"k": 1})  # an interrupted run restarted: finished pieces are kept
    assert parts.get("a", lambda: calls.append("a2") or 2) == 1
    assert parts.get("b", lambda: calls.append("b") or 3) == 3
    assert calls == ["a", "b"]
    parts = Parts(c, "p", {"k": 2})  # another configuration: old pieces are dropped
    assert parts.get("a", lambda: calls.append("a3") or 4) == 4
    assert calls[-1] == "a3"


def test_claim_is_the_librarys_and_rejects_unknown_verdict():
    from cactus_theory.claims.ledger import Claim as LibraryClaim

    assert Claim is LibraryClaim  # one claim type for verify and the report
    with pytest.raises(ValueError, match="verdict"):
        Claim("k", "c", "ref", "paper", "how", "ours", "maybe")


# -- figure steps -------------------------------------------------------------------------------

def test_fig_a_matches_paper_and_writes_png_and_svg(tmp_path):
    res = fig_a_worked_example.run(ctx(tmp_path))
    d = res.data
    assert d["sps"]["accept_n"] == pytest.approx(0.4375, abs=1e-12)
    assert np.allclose(d["cactus"]["h"], [0.16, 0.66, 0.18], atol=5e-3)
    assert d["cactus_exact"]["kl_h"] == pytest.approx(fig_a_worked_example.DELTA, abs=1e-9)  # exact root spends delta
    assert d["cactus_star"]["accept_n"] == pytest.approx(0.825, abs=1e-12)  # the budget giving the paper's .825
    assert res.claims == []  # the worked example is one claim, verify's; this step draws it
    assert sorted(p.suffix for p in res.figures) == [".png", ".svg"]
    assert all(p.stat().st_size > 1000 for p in res.figures)


def test_fig_b_cvxpy_matches_roots_and_corollary6(tmp_path):
    res = fig_b_gamma.run(ctx(tmp_path))
    d = res.data
    assert max(abs(pt["cvx"] - pt["root"]) for pt in d["points"]) < 1e-6
    assert d["cor6_max_ratio_in_region"] <= 1 + 1e-9
    assert 1.5 < d["max_ratio"] <= 2.0  # the Taylor rule does overspend outside Cor. 6's region
    assert {c.verdict for c in res.claims} == {"holds"}


def test_fig_c_sweep_end_points():
    rng = np.random.default_rng(0)
    P, Q = fig_c_tradeoff.random_pairs(rng, 6, 30)
    s = fig_c_tradeoff.sweep(P, Q)
    sps = float(np.mean(ct.acceptance_rate(ct.SpS(), P, Q)))
    cac = {pt["param"]: pt for pt in s["Cactus (delta)"]}
    # the baselines are the references' variants (vLLM's TAS entropy, the authors' top-k recovery)
    assert all("entropy_eps=1e-05" in pt["rule"] for pt in s["TAS (epsilon)"])
    assert all("recovery='topk'" in pt["rule"] for pt in s["top-k (k)"])
    assert all("recovery='q'" in pt["rule"] for pt in s[fig_c_tradeoff.OURS_TOPK])
    # per-row values are kept for the intervals, and their means are the points
    assert np.mean(cac[0.1]["rows"]["accept"]) == pytest.approx(cac[0.1]["accept"], rel=1e-5)
    # delta = 0 is SpS: its law is q exactly
    assert cac[0.0]["accept"] == pytest.approx(sps, abs=1e-12) and cac[0.0]["kl"] == pytest.approx(0, abs=1e-12)
    # a huge budget accepts everything, so the law is p and KL(h_alg || q) = KL(p || q)
    assert cac[4.0]["accept"] > 0.999 and cac[4.0]["kl"] <= s["_kl_pq"] + 1e-12
    interp = [pt["kl"] for pt in s["interpolation (alpha)"]]
    assert np.all(np.diff(interp) > 0)  # more weight on p, further from q
    # DropMatch needs a head: left out without one; on synthetic heads 0 paths is SpS and paths add acceptance
    assert "DropMatch (num_paths)" not in s
    s = fig_c_tradeoff.sweep(P, Q, heads=True)
    dm = {pt["param"]: pt for pt in s["DropMatch (num_paths)"]}
    assert dm[0]["accept"] == pytest.approx(sps, abs=1e-12) and dm[0]["kl"] == pytest.approx(0, abs=1e-12)
    assert all(dm[a]["accept"] < dm[b]["accept"] for a, b in zip(list(dm)[:-1], list(dm)[1:], strict=True))


# -- the whole job ------------------------------------------------------------------------------

def tiny(seed: int, V: int = 10) -> LlamaForCausalLM:
    return tiny_llama(seed, V)


@pytest.fixture(scope="module")
def tiny_pair():
    return ModelPair(tiny(1), tiny(2), None)


@pytest.mark.slow
def test_repro_end_to_end_then_resumes_from_cache(tmp_path, tiny_pair):
    c = ctx(tmp_path, lm={"pair": tiny_pair})
    out = repro(c, [*steps_ids(), "verify"], cases=4, report=tmp_path / "REPORT.md")
    assert out["skipped"] == {}
    text = (tmp_path / "REPORT.md").read_text()
    for ref in ("Theorem 1", "Theorem 2", "Theorem 3", "Proposition 4", "Corollary 5", "Corollary 6",
                "overview figure", "main table"):
        assert ref in text
    assert "out of reach" in text and "## f. Main-table analogue" in text
    assert "## h. Task accuracy with intervals" in text and "Distribution tests on the real LM" in text
    # three sections; the headline counts each statement of the paper once; the worked example is one row
    paper = text.split("## Claims of the paper")[1].split("## Results we derived")[0]
    assert "## Checks of our own code" in text and paper.count("overview figure") == 1
    n_rows = sum(1 for line in paper.splitlines() if line.startswith("| ") and not line.startswith("| #"))
    assert n_rows == 13  # 8 theory statements (Theorem 3 split in its two bounds) and 5 experiments
    assert "**Theory: " in text and "/8 hold" in text and "experiments: of 5 claims of the paper's tables" in text
    assert "exact (a theorem)" not in text
    # fast mode has 3 prompts: the LM rows are out of reach, never a bare "holds"
    for key in ("main table (AL, Rej)", "wall-clock experiment"):
        row = next(line for line in paper.splitlines() if key in line)
        assert "out of reach" in row, row
    figs = sorted(p.name for p in c.figures.iterdir())
    assert figs == sorted(f"{s}.{e}" for s in ("fig_a_worked_example", "fig_b_gamma", "fig_c_tradeoff",
                                               "fig_d_gamma_delta", "fig_e_lm", "fig_h_eval", "fig_i_multi_draft")
                          for e in ("png", "svg"))
    # our results (multi-draft Cactus, DropMatch on the LM) sit in the derived section, never among the paper's
    derived = text.split("## Results we derived")[1].split("## Checks of our own code")[0]
    assert "### i. Cactus with several drafts" in derived and "### j. DropMatch on the real LM" in derived
    assert "multi-draft" not in paper and "DropMatch" not in paper
    assert (c.results / "table_j_dropmatch.md").exists()
    pairs = np.load(c.results / "lm_pairs.npz")
    assert pairs["p"].shape == pairs["q"].shape and pairs["p"].shape[0] > 0
    assert np.allclose(pairs["p"].sum(-1), 1) and np.allclose(pairs["q"].sum(-1), 1)
    # every decoding run agrees with the pooled counters it feeds
    runs = lm_runs.run_all(c)
    t = lm_runs.pooled(runs, "SpS")
    assert t["steps"] == sum(runs["SpS"][s]["stats"]["steps"] for s in lm_runs.STYLES) > 0
    assert 1 <= t["al"] <= 5  # tokens per verifier call with k = 4 drafts, bonus included
    # per-prompt counters (the intervals' units) sum to the pooled ones, and pair up across methods
    per = lm_runs.per_prompt(runs, "SpS")
    assert len(per) == len(lm_runs.per_prompt(runs, "TAS")) == 3
    assert sum(p["accepted"] for p in per) == t["accepted"] and sum(p["steps"] for p in per) == t["steps"]
    tm = json.loads((c.results / "timings.json").read_text())
    assert tm["mode"] == "fast mode" and tm["total_compute_seconds"] == pytest.approx(sum(tm["compute_seconds"].values()), abs=0.2)
    # a rerun computes nothing: every cached file keeps its modification time
    stamps = {p: p.stat().st_mtime_ns for p in c.results.rglob("*.json")}
    out2 = repro(c, [*steps_ids(), "verify"], cases=4, report=tmp_path / "REPORT2.md")
    assert {p: p.stat().st_mtime_ns for p in c.results.rglob("*.json")} == stamps
    assert [cl.verdict for s in out2["steps"] for cl in s.claims] == [cl.verdict for s in out["steps"] for cl in s.claims]
    # --only a: the other steps come from their caches
    out3 = repro(c, ["a"], cases=4, report=tmp_path / "REPORT3.md")
    assert out3["skipped"] == {} and any("from cache" in k for k in out3["timings"])


def test_only_without_cache_reports_skipped_steps(tmp_path):
    out = repro(ctx(tmp_path), ["a"], lm=False, report=tmp_path / "R.md")
    assert "b (fig_b_gamma)" in out["skipped"] and "verify" in out["skipped"]
    assert "e (fig_e_lm)" in out["skipped"] and "--no-lm" in out["skipped"]["e (fig_e_lm)"]
    assert "Not run in this invocation" in (tmp_path / "R.md").read_text()


@pytest.mark.parametrize("argv, match", [(["--only", "a,z"], "--only"), (["--per-style", "0"], "--per-style"),
                                          (["--max-new-tokens", "0"], "--max-new-tokens")])
def test_bad_arguments_name_the_option(argv, match, tmp_path):
    p = argparse.ArgumentParser()
    configure(p)
    args = p.parse_args([*argv, "--results", str(tmp_path)])
    with pytest.raises(ValueError, match=match):
        main_run(args)


# -- every number traces to a committed file -------------------------------------------------------

def test_readme_findings_are_generated_from_the_committed_results():
    """README.md's findings block is exactly what paper_repro.findings builds from paper_repro/results/*.json
    (python -m paper_repro.findings regenerates it), so each number it quotes is in a committed file."""
    from paper_repro.findings import block, findings

    assert block() == findings()


def test_readme_engine_paragraph_is_generated_from_the_committed_engine_runs():
    """README.md's engines block is paper_repro.findings.engines_paragraph(): benchmarks/check_engine_table.py's
    wording of the committed check-engine files (python -m paper_repro.findings renders it)."""
    from paper_repro.findings import engines_block, engines_paragraph

    assert engines_block() == engines_paragraph()


def test_the_engines_block_takes_the_place_of_the_hand_written_paragraph(tmp_path):
    """A README from before the engines block: the render puts the block where the paragraph starting with
    ENGINES_HEAD stood (up to its blank line), keeps everything else, and a second render changes nothing."""
    from paper_repro import findings as fi
    from paper_repro.common import RESULTS

    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{fi.BEGIN}\nold\n{fi.END}\n\n{fi.ENGINES_HEAD} (old words,\nold numbers 0.134)."
                      f"\n\n![fig](x.png)\n")
    assert fi.update_readme(RESULTS, readme)
    text = readme.read_text()
    assert f"{fi.ENGINES_BEGIN}\n{fi.engines_paragraph()}\n{fi.ENGINES_END}\n\n![fig](x.png)\n" in text
    assert "old numbers" not in text and text.startswith("intro\n") and text.count(fi.ENGINES_HEAD) == 1
    assert not fi.update_readme(RESULTS, readme)


def test_committed_report_matches_the_committed_claims():
    from paper_repro.common import REPORT, RESULTS
    from paper_repro.findings import load_claims
    from paper_repro.report import headline

    claims = load_claims(RESULTS)
    assert claims, "paper_repro/results/claims.json is missing"
    assert headline(claims) in REPORT.read_text()
