"""Claim 10 on the first eval design (issue 39 item 6): the committed question-clustered intervals
(``paper_repro/results/eval/eval_first_design_clustered.json``) re-derived from ``eval.json`` by a direct loop, the
verdict re-derived from the printed rule, and the report / README reading them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paper_repro.common import RESULTS, ROOT

EVAL = RESULTS / "eval" / "eval.json"
CLUSTERED = RESULTS / "eval" / "eval_first_design_clustered.json"


def _quantile(sorted_values: list[float], q: float) -> float:
    """The q-quantile of sorted values by linear interpolation between order statistics (position q (n - 1))."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


def _direct(res: dict, n_boot: int, seed: int) -> dict:
    """Every part re-derived by hand: questions by their text (re-made with ``tasks.make_problems``), each
    resample drawing question numbers one at a time, the mean difference summed over the runs of the drawn
    questions in a plain loop."""
    from cactus_theory.lm.experiments import tasks

    c = res["config"]
    recs = res["records"]
    problems = tasks.make_problems(c["task"], c["problems"], c["seed"])
    ids = [p.id for p in problems]
    assert all([r["id"] for r in recs[lab]] == ids for lab in recs)
    assert all(r["answer"] == p.answer for r, p in zip(recs["verifier alone"], problems, strict=True))
    questions: list[str] = []
    runs_of: dict[str, list[int]] = {}
    for i, p in enumerate(problems):
        if p.question not in runs_of:
            questions.append(p.question)
            runs_of[p.question] = []
        runs_of[p.question].append(i)
    lossless = ["verifier alone", "SpS", "SpS, EAGLE-2 tree 8/4/2"]
    correct = {lab: [1.0 if r["correct"] else 0.0 for r in recs[lab]] for lab in recs}
    pooled = [sum(correct[lab][i] for lab in lossless) / len(lossless) for i in range(len(ids))]
    rng = np.random.default_rng(seed)
    draws = [[int(rng.integers(0, len(questions))) for _ in questions] for _ in range(n_boot)]
    out = {}
    for m in ("Cactus delta=0.75", "Cactus delta=1"):
        for name, ref in (("verifier alone", correct["verifier alone"]), ("pooled lossless", pooled)):
            diff = [correct[m][i] - ref[i] for i in range(len(ids))]
            stats = []
            for draw in draws:
                total, count = 0.0, 0
                for qi in draw:
                    for i in runs_of[questions[qi]]:
                        total += diff[i]
                        count += 1
                stats.append(total / count)
            stats.sort()
            out[(m, name)] = {"estimate": sum(diff) / len(diff), "low": _quantile(stats, 0.025),
                              "high": _quantile(stats, 0.975), "questions": len(questions), "runs": len(ids),
                              "reference_accuracy": sum(ref) / len(ref), "method_accuracy": sum(correct[m]) / len(ids)}
    return out


@pytest.fixture(scope="module")
def committed():
    return json.loads(EVAL.read_text()), json.loads(CLUSTERED.read_text())


def test_committed_clustered_intervals_match_a_direct_loop(committed):
    res, cl = committed
    assert cl["n_boot"] == 4000 and cl["seed"] == 39 and cl["level"] == 0.95 and cl["metric"] == "lenient"
    assert cl["questions"] == 97 and cl["runs"] == 300  # 300 problem-runs of 97 distinct questions
    ref = _direct(res, cl["n_boot"], cl["seed"])
    assert {(p["method"], p["reference"]) for p in cl["parts"]} == set(ref)
    for p in cl["parts"]:
        r = ref[(p["method"], p["reference"])]
        for k, v in r.items():
            assert p[k] == pytest.approx(v, abs=1e-12), (p["method"], p["reference"], k)
    # the issue's own re-derivation (another bootstrap stream): Cactus delta=1 minus the verifier alone -5.7
    # [-12.5, +0.9], minus the pooled lossless runs -1.7 [-6.6, +3.1] points; within Monte Carlo error of ours
    d1 = {p["reference"]: p for p in cl["parts"] if p["method"] == "Cactus delta=1"}
    for name, (e, lo, hi) in {"verifier alone": (-5.7, -12.5, 0.9), "pooled lossless": (-1.7, -6.6, 3.1)}.items():
        assert round(100 * d1[name]["estimate"], 1) == e
        assert abs(100 * d1[name]["low"] - lo) < 0.5 and abs(100 * d1[name]["high"] - hi) < 0.5


def test_committed_verdict_follows_the_printed_rule(committed):
    """consistent if every lower end > -margin; differs if some upper end < -margin; else inconclusive; out of
    reach unless every reference accuracy exceeds twice the margin."""
    _, cl = committed
    m = cl["margin"]
    assert m == 0.05 and cl["reach_factor"] == 2.0
    parts = cl["parts"]
    if not all(p["reference_accuracy"] > 2 * m for p in parts):
        expect = "out of reach"
    elif any(p["high"] < -m for p in parts):
        expect = "differs"
    elif all(p["low"] > -m for p in parts):
        expect = "consistent"
    else:
        expect = "inconclusive"
    assert cl["verdict"] == expect == "inconclusive"
    from paper_repro.table_h_eval import first_design_clustered

    assert first_design_clustered(json.loads(EVAL.read_text())) == cl  # the committed file is the code's output


def test_claim_10_reads_the_clustered_numbers_in_claims_report_and_readme(committed):
    _, cl = committed
    from paper_repro.findings import block, load_claims

    rows = [c for c in load_claims(RESULTS) if c.key == "main-scores-cactus"]
    prim = next(c for c in rows if c.role == "primary")
    assert prim.verdict == cl["verdict"] and prim.label.startswith("inconclusive (on the first eval design")
    for p in cl["parts"]:
        cell = (f"{p['method']} minus {p['reference']} {100 * p['estimate']:+.1f} [{100 * p['low']:+.1f}, "
                f"{100 * p['high']:+.1f}] points")
        assert cell in prim.ours
    assert "eval_v3" in prim.ours and prim.units == "97 distinct questions (300 problem-runs)"
    strict = next(c for c in rows if c.role == "same runs")
    assert strict.verdict == "out of reach" and "5.3%" in strict.ours  # SpS's strict-match rate: unreachable
    report = (ROOT / "paper_repro" / "REPORT.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert prim.label in report and prim.label in block()
    line = next(x for x in block().splitlines() if x.startswith("* **Cactus matches SpS on task score**"))
    assert line.startswith(f"* **Cactus matches SpS on task score** (main table (scores)): {prim.label}. ")
    glance = readme.split("## Results at a glance", 1)[1].split("| method |", 1)[0]
    assert "97 distinct questions" in glance and "understates its noise" in glance and "consistent" not in glance
    assert "eval_v3.json" in glance and "inconclusive" in glance


def test_rule_edges_and_reachability():
    from paper_repro.table_h_eval import clustered_verdict

    def part(low, high, ref=0.5):
        return {"estimate": (low + high) / 2, "low": low, "high": high, "questions": 97, "reference_accuracy": ref}

    assert clustered_verdict([part(-0.049, 0.02), part(-0.01, 0.03)], 0.05, "s") == "consistent"
    assert clustered_verdict([part(-0.05, 0.02)], 0.05, "s") == "inconclusive"  # touching -margin excludes nothing
    assert clustered_verdict([part(-0.2, -0.051), part(-0.01, 0.03)], 0.05, "s") == "differs"
    assert clustered_verdict([part(-0.049, 0.02, ref=0.10)], 0.05, "s") == "out of reach"  # not above 2 x margin
    assert clustered_verdict([part(-0.049, 0.02, ref=0.1001)], 0.05, "s") == "consistent"
    assert clustered_verdict([], 0.05, "s") == "out of reach"


def test_question_keys_fail_closed():
    from paper_repro.table_h_eval import question_keys

    keys = question_keys([{"id": "arith/0/0", "answer": 11}, {"id": "arith/0/1"}])
    assert len(keys) == 2 and all(k.startswith("arith:") for k in keys)
    with pytest.raises(ValueError, match="not 'task/seed/index'"):
        question_keys([{"id": "p0"}])
    with pytest.raises(ValueError, match="answer"):
        question_keys([{"id": "arith/0/0", "answer": 12}])
