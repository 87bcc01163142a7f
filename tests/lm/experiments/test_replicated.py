"""The replicated eval (``cactus-theory eval``, result format 2) on a tiny random pair with ragged prompts and
an end token (no download): a pilot end to end (distinct questions, R replicates, the protocol's hash, the A/A
null, non-inferiority p-values, the wall clock with its length regression), row seeds that make a row's tokens
independent of its batch, the protocol guard, and each statistic against an independent recomputation (scipy's
t-test, a hand-written Holm, an exact timing model, the variance law and a simulation of the power).

Statistical checks: the A/A calibration test draws exchangeable runs with a fixed seed and accepts an exclusion
share in [0.02, 0.09] around the nominal 0.05 (1,000 splits of 300 questions: the splits share their runs, so the
share varies more than a binomial's 0.007; the fixed seed makes the check deterministic). The simulated power of
the non-inferiority test (4,000 simulated trials, fixed seed) must lie within 0.03 of the computed 0.8 (binomial
standard error 0.0063: a 4.7 sigma band).

The pilot (``test_pilot_end_to_end``) takes a few seconds (7 s under a load of 9 on 2 cores): it decodes 2 tasks x
24 rows x 7 methods, analyses and draws the figure, then resumes from its cache; it is the eval's one end-to-end run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import shutil

import numpy as np
import pytest
from scipy import stats

from cactus_theory.claims.ledger import (
    noninferiority,
    noninferiority_power,
    noninferiority_sample_size,
)
from cactus_theory.cli import COMMANDS
from cactus_theory.core.tree import BudgetTree
from cactus_theory.lm import ModelPair
from cactus_theory.lm.experiments import replicated as rp
from cactus_theory.lm.experiments import tasks
from cactus_theory.lm.experiments.eval import methods
from cactus_theory.lm.experiments.protocol import PROTOCOLS, ProtocolChanged, load_protocol
from tests.helpers import holm_written_out
from tests.lm.experiments.test_eval import ALPHABET, PAIR, CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
EOS = ALPHABET.index("A")


class RaggedTokenizer(CharTokenizer):
    """Prompts of 4 to 14 characters (their length set by the text), so rows of one batch are padded differently."""

    eos_token_id = EOS

    def __call__(self, text: str) -> dict:
        t = text[-(4 + sum(map(ord, text)) % 11):]
        return {"input_ids": [ALPHABET.index(c) if c in ALPHABET else ALPHABET.index(" ") for c in t]}


RAGGED = ModelPair(PAIR.draft, PAIR.verifier, RaggedTokenizer(), name="tiny-ragged", eos_token_id=EOS)
V2 = PROTOCOLS / "eval_v2.json"  # the grid design (every registry rule); eval_v3: test_eval_v3.py
PROTO = load_protocol(V2)
PILOT = dict(questions=6, replicates=4, max_new_tokens=8, batch_size=8, k=2, trees=[[4, 3, 2]])
ONLY = ["Cactus delta=0.75", "Cactus delta=1", "tas"]


# -- items and seeds --------------------------------------------------------------------------------

def test_distinct_problems_are_distinct_prefix_stable_and_correct():
    a = tasks.distinct_problems("add_wide", 1000, seed=0)
    assert len({p.question for p in a}) == 1000
    assert len({tuple(int(x) for x in p.question.split("?")[0].split() if x.isdigit()) for p in a}) == 1000
    assert tasks.distinct_problems("add_wide", 40, seed=0) == a[:40]
    for p in a[:200]:  # the answer recomputed from the question's own numbers
        x, y = (int(t) for t in p.question.split("?")[0].split() if t.isdigit())
        assert p.answer == x + y and 2 <= x <= 40 and 2 <= y <= 40
    # the i-th problem is make_problems' i-th draw, so ids keep the draw index; repeats are skipped, not redrawn
    made = {p.id: p for p in tasks.make_problems("add_wide", 1600, seed=0)}
    assert all(made[p.id] == p for p in a)
    assert len(tasks.distinct_problems("lookup", 1000)) == 1000
    with pytest.raises(ValueError, match="only 100 distinct questions"):
        tasks.distinct_problems("arith", 1000)
    with pytest.raises(ValueError, match="n must"):
        tasks.distinct_problems("lookup", 0)


def test_row_seeds_key_question_replicate_and_method_only():
    q = "Anna has 3 apples."
    seeds = {(r, m): rp.row_seed(0, "add_wide", q, r, m) for r in range(4) for m in ("None", "SpS()", "Cactus(1.0)")}
    assert len(set(seeds.values())) == len(seeds)  # no common random numbers across methods or replicates
    assert all(0 <= s < 2 ** 63 for s in seeds.values())
    assert rp.row_seed(0, "add_wide", q, 1, "SpS()") == seeds[(1, "SpS()")]  # a function of its key alone
    assert rp.row_seed(1, "add_wide", q, 1, "SpS()") != seeds[(1, "SpS()")]
    rows = rp.batch_rows(5, 3, 4)
    assert [r for b in rows for r in b] == [(q, r) for r in range(3) for q in range(5)]  # replicate-major
    assert sorted(rp.method_order(["a", "b", "c", "d"], 0, "t", 3)) == ["a", "b", "c", "d"]
    assert rp.method_order(["a", "b", "c", "d"], 0, "t", 3) == rp.method_order(["a", "b", "c", "d"], 0, "t", 3)
    assert len({tuple(rp.method_order(list("abcdef"), 0, "t", b)) for b in range(20)}) > 10


def test_a_row_s_tokens_do_not_depend_on_its_batch():
    """Row (question, replicate) of a method emits the same tokens whatever rows share its batch, in whatever
    order, with ragged prompts and an end token (float32, as the eval runs); another replicate differs."""
    cfg, _ = rp.RunConfig.from_protocol(PROTO, "tiny", questions=8, replicates=2, max_new_tokens=10, k=2)
    probs = tasks.distinct_problems("lookup", 8)
    ml = [m for m in methods(grid=PROTO.design["grid"], only=["Cactus delta=1", "dropmatch"],
                             trees=[BudgetTree(4, 3, 2)]) if m.key in (None, "sps", "cactus", "dropmatch")]
    rows = [(q, r) for r in range(2) for q in range(8)]
    for m in ml:
        whole = {(x["q"], x["r"]): x["tokens"] for x in rp._decode(RAGGED, probs, rows, m, cfg, "lookup")["records"]}
        assert len({len(t) for t in whole.values()}) > 1  # the end token cuts rows at different lengths
        perm = rows[:]
        random.Random(3).shuffle(perm)
        got = {}
        for s in range(0, len(perm), 3):  # other batches, other orders
            for x in rp._decode(RAGGED, probs, perm[s:s + 3], m, cfg, "lookup")["records"]:
                got[(x["q"], x["r"])] = x["tokens"]
        assert got == whole, m.label
        for row in perm[:3]:  # alone
            x = rp._decode(RAGGED, probs, [row], m, cfg, "lookup")["records"][0]
            assert x["tokens"] == whole[row], m.label
        assert sum(whole[(q, 0)] != whole[(q, 1)] for q in range(8)) > 0


# -- the pilot, end to end ----------------------------------------------------------------------------

def test_pilot_end_to_end(tmp_path, monkeypatch):
    cfg, dev = rp.RunConfig.from_protocol(PROTO, "tiny-ragged", **PILOT)
    logged = []
    res = rp.evaluate(RAGGED, PROTO, cfg, tmp_path, deviations=dev, only=ONLY, progress=False, lawtests=False,
                      log=logged.append)
    saved = json.loads((tmp_path / "eval.json").read_text())
    md = (tmp_path / "eval.md").read_text()
    # the protocol: its hash, the deviations of a pilot, printed loudly
    assert saved["format"] == 2
    assert saved["protocol"]["sha256"] == hashlib.sha256(V2.read_bytes()).hexdigest()
    assert saved["protocol"]["sha256"][:16] in md and md.count("**Deviation from the protocol**") == len(dev) >= 4
    assert "problem-runs" in logged[0] and "projected" in logged[0]  # the estimate, before the rest is decoded
    assert saved["estimate"]["problem_runs"] == 2 * 6 * 4 * len(saved["methods"])
    # items and replicates
    S = saved["summary"]
    assert S["lossless"] == ["verifier alone", "SpS", "SpS, EAGLE-2 tree 4/3/2"]
    margin = PROTO.margin
    fam = []
    for t in ("add_wide", "lookup"):
        task = S["tasks"][t]
        assert task["distinct_question_texts"] == task["distinct_contents"] == 6 and task["replicates"] == 4
        rows = saved["rows"][t]["per_question"]
        arr = {lab: rp.rows_arrays(saved, t, lab) for lab in rows}
        assert all(a["correct"].shape == (6, 4) for a in arr.values())  # 6 questions x R = 4 replicates
        outcome = {lab: a["correct"].astype(float) for lab, a in arr.items()}
        recs = res["raw"]["tasks"][t]["records"]["SpS"]  # the decoded rows, against what eval.json keeps of them
        assert arr["SpS"]["new_tokens"].sum() == sum(r["new_tokens"] for r in recs)
        assert sorted({(r["q"], r["r"]) for r in recs}) == [(q, r) for q in range(6) for r in range(4)]
        ref = np.concatenate([outcome[lab] for lab in S["lossless"]], axis=1).mean(1)
        mt = task["metrics"]["lenient"]
        assert mt["reference"][0] == pytest.approx(ref.mean())
        for lab, e in mt["methods"].items():
            acc = outcome[lab].mean(1)
            lo, hi = stats.t.interval(0.95, 5, loc=acc.mean(), scale=stats.sem(acc)) if acc.std() > 0 else (acc[0],) * 2
            assert e["accuracy"] == pytest.approx([acc.mean(), lo, hi])
            if lab in S["lossless"]:
                assert "vs_lossless" not in e and "aa_vs_other_lossless" in e
                continue
            d = acc - ref  # the non-inferiority test, recomputed with scipy's one-sample t-test
            v = e["vs_lossless"]
            assert v["estimate"] == pytest.approx(d.mean())
            if d.std() > 0:
                assert v["p_noninferior"] == pytest.approx(stats.ttest_1samp(d + margin, 0, alternative="greater").pvalue)
                assert v["p_inferior"] == pytest.approx(stats.ttest_1samp(d + margin, 0, alternative="less").pvalue)
            fam.append((t, lab, v))
        # the lossless null: replicate sets of the verifier alone and of SpS, and the calibration
        aa = mt["aa"]
        assert set(aa["fixed"]) == {"verifier alone: even vs odd replicates", "SpS: even vs odd replicates",
                                    "verifier alone vs SpS"}
        v0 = outcome["verifier alone"]
        assert aa["fixed"]["verifier alone: even vs odd replicates"][0] == pytest.approx(
            (v0[:, 0::2].mean(1) - v0[:, 1::2].mean(1)).mean())
        assert aa["calibration"]["splits"] == PROTO.analysis["aa_splits"] and aa["calibration"]["runs_per_question"] == 12
        # the wall clock: 24 rows = 3 full batches of 8, every method; length regression present
        w = task["wall_clock"]
        assert w["batches"] == 3 and w["dropped"] == 0 and "length_slope" in w
        for lab, row in w["methods"].items():
            if lab != "verifier alone":
                assert {"time_per_problem", "tokens_per_s_ratio", "length_adjusted"} <= set(row)
                sec = np.array([b["seconds"] for b in saved["rows"][t]["timing"][lab]])
                sec0 = np.array([b["seconds"] for b in saved["rows"][t]["timing"]["verifier alone"]])
                assert row["time_per_problem"][0] == pytest.approx(math.exp(np.mean(np.log(sec0 / sec))))
        # each method decoded every batch, in a per-batch order that differs between batches
        pos = [[b["position"] for b in saved["rows"][t]["timing"][lab]] for lab in rows]
        assert len({tuple(p) for p in zip(*pos, strict=True)}) > 1
    assert [v["holm"] for _, _, v in fam] == pytest.approx(holm_written_out([v["p_noninferior"] for _, _, v in fam])[0])
    assert S["family"]["size"] == len(fam) == 2 * 4
    # printed as stored (one computation): the Cactus row's accuracy and difference cells come from the JSON
    e = S["tasks"]["add_wide"]["metrics"]["lenient"]["methods"]["Cactus delta=1"]
    acc = e["accuracy"]
    assert f"| Cactus delta=1 | {100 * acc[0]:.1f} [{100 * acc[1]:.1f}, {100 * acc[2]:.1f}] |" in md
    assert "non-inferiority p (margin 3)" in md and "McNemar" not in md and "Calibration of the interval" in md
    assert set(saved["claims"]) == {"main-scores-cactus", "tas-arith"}
    assert (tmp_path / "fig_eval_accuracy_al.png").stat().st_size > 0
    # resuming: nothing is decoded again, the same result
    monkeypatch.setattr(rp, "_decode", lambda *a, **k: pytest.fail("decoded again"))
    again = rp.evaluate(RAGGED, PROTO, cfg, tmp_path, deviations=dev, only=ONLY, progress=False, lawtests=False,
                        figure=False, log=lambda s: None)
    assert again["summary"] == res["summary"]


def test_protocol_guard_refuses_an_edited_protocol_unless_amended(tmp_path):
    path = tmp_path / "protocol.json"
    shutil.copy(V2, path)
    proto = load_protocol(path)
    cfg, dev = rp.RunConfig.from_protocol(proto, "tiny", tasks=["lookup"], questions=3, replicates=2,
                                          max_new_tokens=4, batch_size=6, k=2, trees=[])
    out = tmp_path / "out"
    kw = dict(deviations=dev, only=["sps"], progress=False, lawtests=False, figure=False, log=lambda s: None)
    rp.evaluate(PAIR, proto, cfg, out, **kw)
    content = json.loads(path.read_text())
    content["analysis"]["margin_points"] = 4.0  # a looser margin, chosen after seeing results
    path.write_text(json.dumps(content))
    edited = load_protocol(path)
    with pytest.raises(ProtocolChanged, match="changed after results exist"):
        rp.evaluate(PAIR, edited, cfg, out, **kw)
    res = rp.evaluate(PAIR, edited, cfg, out, amendment="test: the margin widened", **kw)
    am = res["protocol"]["amendments"]
    assert {a["from"] for a in am} == {proto.sha256} and all(a["to"] == edited.sha256 for a in am)
    assert "PROTOCOL AMENDED after results existed" in (out / "eval.md").read_text()
    with pytest.raises(ValueError, match="margin_points"):
        bad = dict(content)
        bad["analysis"] = {k: v for k, v in content["analysis"].items() if k != "margin_points"}
        path.write_text(json.dumps(bad))
        load_protocol(path)
    with pytest.raises(ValueError, match="no such file"):
        load_protocol(tmp_path / "none.json")


# -- the statistics against independent references ----------------------------------------------------

def test_wall_clock_recovers_an_exact_timing_model():
    """seconds = load_b * effect_m * tokens^gamma exactly: the regression returns 1 / effect_m at equal length and
    gamma; the time-per-problem ratio is the batches' geometric mean; the partial last batch is dropped."""
    rng = np.random.default_rng(0)
    labels, effect, gamma = ["verifier alone", "A", "B"], {"verifier alone": 1.0, "A": 0.5, "B": 1.3}, 0.8
    load = np.exp(rng.normal(0, 0.3, 7))
    timing = {}
    for lab in labels:
        tok = rng.integers(100, 400, 7)
        timing[lab] = [{"rows": 8 if b < 6 else 3, "tokens": int(tok[b]),
                        "seconds": float(load[b] * effect[lab] * tok[b] ** gamma)} for b in range(7)]
    w = rp.wall_clock(timing, "verifier alone", labels, 8)
    assert w["batches"] == 6 and w["dropped"] == 1
    assert w["length_slope"][0] == pytest.approx(gamma)
    for lab in ("A", "B"):
        assert w["methods"][lab]["length_adjusted"][0] == pytest.approx(1 / effect[lab])
        ratio = [timing["verifier alone"][b]["seconds"] / timing[lab][b]["seconds"] for b in range(6)]
        assert w["methods"][lab]["time_per_problem"][0] == pytest.approx(math.exp(np.mean(np.log(ratio))))


def test_aa_null_is_calibrated_on_exchangeable_runs_and_sees_a_shift():
    rng = np.random.default_rng(1)
    n, L = 300, 12
    p = rng.beta(2, 3, n)
    pool = rng.random((n, L)) < p[:, None]
    out = rp.aa_null(pool, {"halves": (pool[:, :6], pool[:, 6:])}, splits=1000, seed=0)
    assert 0.02 <= out["calibration"]["exclude_zero"] <= 0.09
    assert out["fixed"]["halves"][0] == pytest.approx(pool[:, :6].mean() - pool[:, 6:].mean())
    shifted = rng.random((n, 6)) < np.clip(p + 0.2, 0, 1)[:, None]  # not A/A: 20 points better
    lo = rp.aa_null(pool, {"shift": (shifted, pool[:, 6:])}, splits=100, seed=0)["fixed"]["shift"][1]
    assert lo > 0.1


def test_power_table_follows_the_variance_law_and_a_simulation():
    rng = np.random.default_rng(2)
    n, R, L = 2000, 4, 12
    p = rng.beta(2, 5, n)
    pool = rng.random((n, L)) < p[:, None]
    pt = rp.power_table(pool, n, R, 0.03, 0.025, 0.8)
    w = np.mean(p * (1 - p))
    assert pt["within_question_variance"] == pytest.approx(w, rel=0.05)
    assert pt["sd_d"] == pytest.approx(math.sqrt(pt["within_question_variance"] * (1 / R + 1 / L)))
    lossy = rng.random((n, R)) < p[:, None]  # a method with the verifier's accuracy on every question
    assert np.std(lossy.mean(1) - pool.mean(1), ddof=1) == pytest.approx(pt["sd_d"], rel=0.05)
    q = pt["questions_needed_3_points"]
    assert noninferiority_power(pt["sd_d"], q, 0.03) >= 0.8 > noninferiority_power(pt["sd_d"], q - 1, 0.03)
    assert pt["runs_per_method_needed_3_points"] == q * R
    # the power by simulation: normal differences with that sd on q questions, the t-test at one-sided 0.025
    sims = rng.normal(0, pt["sd_d"], (4000, q))
    tstat = (sims.mean(1) + 0.03) / (sims.std(1, ddof=1) / math.sqrt(q))
    assert np.mean(tstat > stats.t.isf(0.025, q - 1)) == pytest.approx(0.8, abs=0.03)
    assert noninferiority(sims[0], 0.03).p_noninferior == pytest.approx(stats.t.sf(tstat[0], q - 1))
    # one run against one reference run (the earlier design): sd sqrt(2 w)
    assert pt["runs_per_method_needed_3_points_one_run_vs_one_run"] == noninferiority_sample_size(
        math.sqrt(2 * pt["within_question_variance"]), 0.03)


# -- the command ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, msg", [
    (["--questions", "0"], "questions must be an integer >= 1"),
    (["--replicates", "0"], "replicates must be an integer >= 1"),
    (["--tasks", "gsm8k"], "tasks must be"),
    (["--tasks", "arith"], "only 100 distinct questions"),
    (["--protocol", "/no/such.json"], "--protocol '/no/such.json': no such file"),
    (["--rules", "nonsense"], "--rules: unknown"),
    (["--draft-path", "/no/such/file.pt"], "draft-path"),
    (["--seed", "-4"], "--seed must be an integer >= 0"),
    (["--sweep", "--protocol", str(PROTOCOLS / "eval_v2.json")], "--sweep: the protocol .* has no design.sweep"),
])
def test_eval_command_checks_arguments_before_models(argv, msg, tmp_path, monkeypatch):
    from cactus_theory.lm.experiments import eval as legacy

    assert COMMANDS["eval"][0] == "cactus_theory.cli.eval"
    monkeypatch.setattr(legacy, "load_eval_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    p = argparse.ArgumentParser()
    rp.configure(p)
    with pytest.raises(ValueError, match=msg):
        rp.run(p.parse_args(argv + ["--out", str(tmp_path)]))


@pytest.mark.parametrize("protocol, n, out", [("eval_v2.json", 1000, "results/eval"),
                                              ("eval_v3.json", 1120, "results/eval_v3")])
def test_a_run_that_deviates_from_the_protocol_never_writes_the_committed_results(monkeypatch, tmp_path, protocol, n,
                                                                                 out):
    from cactus_theory.lm.experiments import eval as legacy

    monkeypatch.setattr(legacy, "load_eval_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.chdir(tmp_path)  # the protocol and its results are found from the package, not the working folder
    p = argparse.ArgumentParser()
    rp.configure(p)
    with pytest.raises(ValueError, match=f"deviates from the protocol .*questions: {n} in the protocol, 50.*{out}"):
        rp.run(p.parse_args(["--protocol", str(PROTOCOLS / protocol), "--questions", "50"]))
    if protocol == "eval_v3.json":  # elsewhere it runs, but never with the committed shards
        args = p.parse_args(["--protocol", str(PROTOCOLS / protocol), "--questions", "50", "--out", str(tmp_path / "x")])
        rp._plan(args)
        assert args.use_shards is False
        args = p.parse_args(["--protocol", str(PROTOCOLS / protocol), "--out", str(tmp_path / "x")])
        rp._plan(args)
        assert args.use_shards is True
