"""``lm.rounds``: interleaved timing rounds and the speedup's interval over rounds, against scipy's own
t-interval and geometric mean; and ``experiment.gates`` on constructed timing data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from cactus_theory.lm.experiments.experiment import DRIFT_BOUND, gates
from cactus_theory.lm.rounds import drift, interleaved_rounds, pooled_stats, ratio_over_rounds


def test_ratio_over_rounds_is_scipys_t_interval_of_the_log_ratio():
    num = [41.0, 39.5, 44.2, 40.1, 38.7]  # a method's tokens/s in 5 rounds
    den = [33.0, 34.1, 35.9, 32.2, 33.3]  # the verifier alone's in the same rounds
    got = ratio_over_rounds(num, den)
    r = np.array(num) / np.array(den)
    assert got["rounds"] == pytest.approx(list(r), rel=1e-12)
    assert got["ratio"] == pytest.approx(stats.gmean(r), rel=1e-12)
    ci = stats.ttest_1samp(np.log(r), 0.0).confidence_interval(0.95)
    assert got["ci"] == pytest.approx([math.exp(ci.low), math.exp(ci.high)], rel=1e-12)
    back = ratio_over_rounds(den, num)  # the log makes b / a's interval the reciprocal of a / b's
    assert back["ci"] == pytest.approx([1 / got["ci"][1], 1 / got["ci"][0]], rel=1e-12)
    one = ratio_over_rounds([2.0], [1.0])
    assert one["ratio"] == 2.0 and all(math.isnan(x) for x in one["ci"])
    with pytest.raises(ValueError, match="one length"):
        ratio_over_rounds([1.0, 2.0], [1.0])
    assert math.isnan(ratio_over_rounds([1.0, 0.0], [1.0, 1.0])["ratio"])


def test_interleaved_rounds_runs_every_job_once_a_round_in_a_seeded_random_order():
    log = []

    def job(name):
        def call():
            log.append(name)
            return f"{name}{sum(1 for x in log if x == name)}"  # the round's result, numbered
        return call

    names = ["base", "sps", "cactus", "tas"]
    out, orders = interleaved_rounds({n: job(n) for n in names}, rounds=6, seed=3)
    assert len(orders) == 6 and all(sorted(o) == sorted(names) for o in orders)
    assert log == [n for o in orders for n in o]  # run in exactly the recorded orders
    assert out == {n: [f"{n}{i}" for i in range(1, 7)] for n in names}  # results in round order
    assert len({tuple(o) for o in orders}) > 1  # the order changes between rounds
    rng = np.random.default_rng(3)  # the orders are numpy's permutations from the seed
    assert orders == [[names[i] for i in rng.permutation(4)] for _ in range(6)]
    assert interleaved_rounds({n: job(n) for n in names}, rounds=6, seed=3)[1] == orders
    with pytest.raises(ValueError, match="rounds"):
        interleaved_rounds({"a": job("a")}, rounds=0)


def test_drift_and_pooled_stats():
    from cactus_theory.lm.metrics import DecodeStats

    assert drift([30.0, 33.0, 31.5]) == pytest.approx(1.1) and math.isnan(drift([1.0, 0.0]))
    a = DecodeStats("speculative", new_tokens=100, steps=40, accepted=60, seconds=2.0, verifier_seconds=1.0)
    b = DecodeStats("speculative", new_tokens=100, steps=40, accepted=60, seconds=3.0, verifier_seconds=2.0)
    p = pooled_stats([a, b])
    assert (p.new_tokens, p.steps, p.accepted) == (100, 40, 60)  # counters: the first round's
    assert p.seconds == 2.5 and p.verifier_seconds == 1.5 and p.tokens_per_s == 40.0  # timings: the mean


def _phase(row, rule, phase, ms, roof_ms, batch=1, width=1):
    return {"row": row, "rule": rule, "phase": phase, "ms": ms, "roofline_ms": roof_ms, "ratio": ms / roof_ms,
            "batch_size": batch, "width": width}


def _res(rates, phases):
    return {"baselines": {"1": {"tokens_per_s_rounds": rates, "drift": max(rates) / min(rates)}},
            "roofline": {"phases": phases}}


GOOD = [_phase("verifier alone B=1", None, "verifier", 16.3, 7.2),
        _phase("SpS k=4 B=1", "SpS", "verifier", 19.4, 7.4, width=5),
        _phase("SpS k=4 B=1", "SpS", "draft", 5.7, 1.9, width=5)]


def test_gates_pass_a_trustworthy_run_and_name_each_failure():
    assert gates(_res([40.0, 41.0, 39.5, 40.2, 40.8], GOOD)) == []
    assert gates(_res([40.0, 44.0], GOOD)) == []  # max / min exactly the bound (1.10) passes
    assert DRIFT_BOUND == 1.10
    drifted = gates(_res([40.0, 44.4], GOOD))
    assert len(drifted) == 1 and drifted[0].startswith("baseline drift") and "1.110 > 1.1" in drifted[0]
    assert gates(_res([40.0, 44.4], GOOD), drift_bound=1.2) == []
    # (a) the committed lean run's numbers: the 5-position forward 31.1 ms, the one-token forward 31.9 ms
    fast = [_phase("verifier alone B=1", None, "verifier", 31.9, 7.2),
            _phase("SpS k=4 B=1", "SpS", "verifier", 31.1, 7.4, width=5)]
    got = gates(_res([40.0, 40.5], fast))
    assert got == ["W = 5 forward faster than W = 1: SpS k=4 B=1's verifier forward 31.10 ms < the verifier alone's "
                   "one-token forward 31.90 ms (batch 1)"]
    other_batch = [fast[0], {**fast[1], "batch_size": 8}]  # compared at the same batch size only
    assert gates(_res([40.0, 40.5], other_batch)) == []
    # (c) a phase under its roof
    under = [*GOOD, _phase("SpS k=4 B=1", "SpS", "verify", 0.5, 0.8, width=5)]
    got = gates(_res([40.0, 40.5], under))
    assert len(got) == 1 and got[0].startswith("below its roofline: SpS k=4 B=1 verify") and "ratio 0.62 < 1" in got[0]
    # all three at once, and no roofline at all (the drift gate alone)
    assert len(gates(_res([40.0, 50.0], [*fast, under[-1]]))) == 3
    assert gates({"baselines": {"1": {"tokens_per_s_rounds": [1.0, 1.0], "drift": 1.0}}}) == []
    with pytest.raises(ValueError, match="drift_bound"):
        gates(_res([1.0, 1.0], GOOD), drift_bound=0.9)


def test_gates_refuse_the_committed_lean_run():
    """The committed lean run (benchmarks/results/lm/lean_bf16.json, the former design: one baseline before the
    rules and one after) has chain forwards over 5 positions measured faster than the one-token forward at
    batch 1; the gates name exactly those (its baselines drifted 1.054 and 1.003: under the bound)."""
    import json
    from pathlib import Path

    res = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/lm/lean_bf16.json").read_text())
    one = next(p["ms"] for p in res["roofline"]["phases"] if p["row"] == "verifier alone B=1" and p["phase"] == "verifier")
    wider = [p for p in res["roofline"]["phases"] if p["phase"] == "verifier" and p["rule"] and p["batch_size"] == 1
             and p["ms"] < one]
    assert [p["row"] for p in wider] == ["SpS k=4 B=1", "Cactus delta=1 k=4 B=1"]  # read independently of gates
    got = gates(res)
    assert len(got) == 2 and all(g.startswith("W = >1 forward faster than W = 1") for g in got)
    assert [g.split(": ")[1].split("'s ")[0] for g in got] == [p["row"] for p in wider]
    assert gates(res, drift_bound=1.05)[0].startswith("baseline drift: the verifier alone at batch 1 ran at 31.16, 29.57")
