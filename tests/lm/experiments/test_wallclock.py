"""The eval's wall-clock benchmark (``lm.experiments.wallclock``; eval_v3 ``analysis.wall_clock``): its rows are the
eval's own first rows with the eval's seeds (same tokens as the eval's batched decode), its round orders are
``interleaved_rounds``' orders, a stopped run resumes, and its ratios and verdict follow the formulas written out here
from a record of known seconds."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from cactus_theory.lm.experiments import replicated as rp
from cactus_theory.lm.experiments import tasks
from cactus_theory.lm.experiments import wallclock as wc
from cactus_theory.lm.rounds import interleaved_rounds
from tests.lm.experiments.test_eval_v3 import _protocol
from tests.lm.experiments.test_replicated import RAGGED

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_protocol_states_the_constants_the_code_uses():
    from cactus_theory.lm.experiments.protocol import load_protocol

    text = load_protocol().analysis["wall_clock"]
    assert f"first {wc.QUESTIONS} questions of each task" in text and "batch size 1" in text
    assert "one thread" in text and f"at least {wc.ROUNDS} rounds" in text


def test_round_orders_are_interleaved_rounds_orders_and_a_prefix_is_stable():
    labels = ["verifier alone", "SpS", "Cactus delta=1", "TAS"]
    _, orders = interleaved_rounds({n: (lambda: None) for n in labels}, 6, seed=3)
    assert wc.plan_orders(labels, 6, 3) == orders
    assert wc.plan_orders(labels, 2, 3) == orders[:2]  # a resumed run keeps the first rounds' orders


def test_the_benchmark_decodes_the_evals_rows_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(wc, "QUESTIONS", 2)
    proto = _protocol(tmp_path)
    cfg, _ = rp.RunConfig.from_protocol(proto, "tiny-ragged")
    methods = [m for m in rp.protocol_methods(proto) if m.label in ("verifier alone", "SpS", "Cactus delta=1")]
    path = tmp_path / "wall_clock.json"
    first = wc.run_wall_clock(RAGGED, proto, cfg, methods, path, rp._decode, rounds=1, progress=False)
    assert len(first["rounds"]) == 1
    rec = wc.run_wall_clock(RAGGED, proto, cfg, methods, path, rp._decode, rounds=2, progress=False)
    assert rec["rounds"][0] == json.loads(json.dumps(first["rounds"][0]))  # round 1 kept, round 2 appended
    assert len(rec["rounds"]) == 2 and [r["order"] for r in rec["rounds"]] == wc.plan_orders(
        [m.label for m in methods], 2, cfg.seed)
    # the eval's batched decode of rows (q, 0), q < 2, KL tracked: the same token counts, row by row
    for t in cfg.tasks:
        probs = tasks.distinct_problems(t, cfg.questions, cfg.seed)
        for m in methods:
            got = rp._decode(RAGGED, probs, [(0, 0), (1, 0), (2, 1)], m, cfg, t)["records"][:2]
            for r in rec["rounds"]:
                assert r["jobs"][m.label][t]["tokens"] == [len(x["tokens"]) for x in got]
                assert r["jobs"][m.label][t]["verifier_calls"] == [x["steps"] for x in got]
    res = wc.analyse_wall_clock(rec)
    assert res["same_decodes"] and res["rounds"] == 2
    other = _protocol(tmp_path / "other", max_new_tokens=9)
    cfg2, _ = rp.RunConfig.from_protocol(other, "tiny-ragged")
    with pytest.raises(ValueError, match="made under other settings"):
        wc.run_wall_clock(RAGGED, other, cfg2, methods, path, rp._decode, rounds=3, progress=False)


def _record(secs: dict[str, list[float]], tokens: dict[str, int]) -> dict:
    """A record of known seconds: one task, 2 questions; a method's round-r seconds split evenly over the rows."""
    R = len(secs["verifier alone"])
    labels = list(secs)
    return {"meta": {"decode": {"tasks": ["add_wide"]}, "methods": labels, "questions": 2, "cpu": "test"},
            "rounds": [{"order": labels, "load_before": 0.1,
                        "jobs": {m: {"add_wide": {"seconds": [secs[m][r] / 2] * 2, "tokens": [tokens[m] // 2] * 2,
                                                  "verifier_calls": [5, 5]}} for m in labels}} for r in range(R)]}


@pytest.mark.parametrize("scale, verdict", [(0.5, "consistent"), (2.0, "differs"), (1.0, "inconclusive")])
def test_ratios_and_verdict_follow_the_formulas(scale, verdict):
    rng = np.random.default_rng(7)
    base = list(10 + rng.random(6))
    cac = [b * scale * (1 + 0.01 * e) for b, e in zip(base, rng.standard_normal(6), strict=True)]
    if scale == 1.0:
        cac = [b * (1 + 0.2 * e) for b, e in zip(base, rng.standard_normal(6), strict=True)]
    res = wc.analyse_wall_clock(_record({"verifier alone": base, "Cactus delta=1": cac},
                                        {"verifier alone": 100, "Cactus delta=1": 100}))
    logs = np.log(np.array(base) / np.array(cac))
    half = stats.t.ppf(0.975, 5) * logs.std(ddof=1) / math.sqrt(6)
    tp = res["scopes"]["pooled"]["methods"]["Cactus delta=1"]["time_per_problem"]
    assert tp["ratio"] == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    assert tp["ci"] == pytest.approx([math.exp(logs.mean() - half), math.exp(logs.mean() + half)], rel=1e-12)
    lo, hi = tp["ci"]
    assert res["claim"]["verdict"] == verdict == ("consistent" if lo > 1 else "differs" if hi < 1 else "inconclusive")
    # equal tokens: the tokens/s ratio is the time ratio; tokens per problem and AL from the counts
    tps = res["scopes"]["pooled"]["methods"]["Cactus delta=1"]["tokens_per_s_ratio"]
    assert tps["ratio"] == pytest.approx(tp["ratio"], rel=1e-12)
    row = res["scopes"]["add_wide"]["methods"]["verifier alone"]
    assert row["tokens_per_problem"] == 50 and row["al"] == 10 and row["seconds_per_problem"] == pytest.approx(
        np.mean(base) / 2)
    assert "| pooled | Cactus delta=1 |" in wc.format_wall_clock(res)
