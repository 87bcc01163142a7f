"""``lm.experiments.experiment``: the benchmark on the tiny pair, its numbers against recomputations."""

from __future__ import annotations

import pytest

import cactus_theory as ct
from tests.lm.common import pair

pytestmark = pytest.mark.usefixtures("one_thread")


def test_run_benchmark_on_the_tiny_pair():
    """Every job (the verifier alone at each batch size, each rule at each k and batch size) once per round in a
    random order; each speedup recomputed from the rounds' own runs (the ratio within each round, their geometric
    mean and scipy's t-interval of the log ratio); statistics from the first round, which every round repeats."""
    import numpy as np
    from scipy import stats

    from cactus_theory.lm.experiments.experiment import format_table, run_benchmark, targets

    rules = [("SpS", ct.SpS()), ("Cactus d=1.0", ct.Cactus(1.0))]
    res = run_benchmark(pair(), [[1, 2], [3], [4, 5]], rules=rules, ks=(3,), batch_sizes=(1, 2),
                        max_new_tokens=6, progress=False, rounds=3)
    rows = res["rows"]
    assert [(r["rule"], r["k"], r["batch_size"]) for r in rows] == [
        (n, k, b) for b in (1, 2) for k in (3,) for n in ("SpS", "Cactus d=1.0")]
    jobs = {f"verifier alone B={b}" for b in (1, 2)} | {f"{r['rule']} {r['k']} B={r['batch_size']}" for r in rows}
    assert len(res["orders"]) == 3 and all(sorted(o) == sorted(jobs) for o in res["orders"])
    assert res["settings"]["rounds"] == 3
    for base in res["baselines"].values():
        rates = [x["tokens_per_s"] for x in base["runs"]]
        assert len(rates) == 3 and base["tokens_per_s_rounds"] == rates and base["same_decodes"]
        assert base["drift"] == pytest.approx(max(rates) / min(rates))
    for r in rows:
        base = res["baselines"][str(r["batch_size"])]
        ratios = np.array(r["tokens_per_s_rounds"]) / np.array(base["tokens_per_s_rounds"])
        assert r["speedup_rounds"] == pytest.approx(list(ratios))
        assert r["speedup"] == pytest.approx(stats.gmean(ratios))
        ci = stats.ttest_1samp(np.log(ratios), 0.0).confidence_interval(0.95)
        assert r["speedup_ci"] == pytest.approx([np.exp(ci.low), np.exp(ci.high)])
        per_prompt = [x["seconds"] / x["sequences"] for x in base["runs"]]
        assert r["prompt_speedup_rounds"][0] == pytest.approx(
            per_prompt[0] / (r["new_tokens"] / r["tokens_per_s_rounds"][0] / r["sequences"]))
        assert r["same_decodes"] and r["new_tokens"] == 18 and 1 <= r["al"] <= r["k"] + 1
        lo, hi = r["al_ci"]
        assert lo <= r["al"] <= hi
        assert sum(c["new_tokens"] for c in r["per_sequence"]) == 18
        assert r["seconds"] == pytest.approx(np.mean([r["new_tokens"] / x for x in r["tokens_per_s_rounds"]]))
    assert all(r["al_vs_sps"] == 1 for r in rows if r["rule"] == "SpS")

    def pooled_al(seq):  # tokens per verifier call from the per-prompt counters, bonus included
        steps = sum(c["steps"] for c in seq)
        return (sum(c["accepted"] for c in seq) + steps) / steps

    for r in rows:
        if r["rule"] != "SpS":
            sps = next(x for x in rows if x["rule"] == "SpS" and (x["k"], x["batch_size"]) == (r["k"], r["batch_size"]))
            assert r["al_vs_sps"] == pytest.approx(pooled_al(r["per_sequence"]) / pooled_al(sps["per_sequence"]))
            lo, hi = r["al_vs_sps_ci"]
            assert lo <= r["al_vs_sps"] <= hi
    assert "Cactus d=1.0" in format_table(res)
    assert all(len(t) == 5 for t in targets(res, k=3))
    names = [t[0] for t in targets(res, k=3)]
    assert "SpS AL" in names and "Cactus d=1 AL / SpS AL" in names


def test_run_benchmark_runs_trees():
    from cactus_theory.core.tree import DynamicTree, branching_parents
    from cactus_theory.lm.experiments.experiment import format_table, run_benchmark

    rules = [("SpS", ct.SpS()), ("Cactus d=1.0", ct.Cactus(1.0))]
    trees = [("tree 2,2", branching_parents((2, 2))), ("dyn 3,2,2", DynamicTree(3, 2, 2))]
    res = run_benchmark(pair(), [[1, 2], [3], [4, 5]], rules=rules, ks=(2,), batch_sizes=(2,), max_new_tokens=6,
                        progress=False, trees=trees, tree_scheme="deterministic", rounds=1)
    rows = res["rows"]
    assert [(r["rule"], r["k"]) for r in rows] == [(n, k) for k in (2, "tree 2,2", "dyn 3,2,2")
                                                   for n in ("SpS", "Cactus d=1.0")]
    for r in rows:
        assert r["new_tokens"] == 18 and 1 <= r["al"] and (r["method"] == "tree") == isinstance(r["k"], str)
    assert all(r["al_vs_sps"] == 1 for r in rows if r["rule"] == "SpS")
    assert "dyn 3,2,2" in format_table(res)


def test_run_benchmark_runs_adaptive_draft_lengths_beside_fixed_k():
    """``draft_stops``: each rule at each k with each policy, in the same run as its fixed k; the row's k names
    the policy, AL/SpS compares with SpS under the same policy, AL/chain (paired) with the fixed k."""
    from cactus_theory.core.draft_stop import DraftStop
    from cactus_theory.lm.experiments.experiment import format_table, run_benchmark

    rules = [("SpS", ct.SpS()), ("Cactus d=1.0", ct.Cactus(1.0))]
    stops = [DraftStop(0.5), DraftStop(0.3, "path")]
    res = run_benchmark(pair(), [[1, 2], [3], [4, 5]], rules=rules, ks=(3,), batch_sizes=(2,), max_new_tokens=6,
                        progress=False, draft_stops=stops, rounds=1)
    rows = res["rows"]
    assert [(r["rule"], r["k"]) for r in rows] == [(n, k) for k in (3, "3 top>=0.5", "3 path>=0.3")
                                                   for n in ("SpS", "Cactus d=1.0")]
    for r in rows:
        assert r["new_tokens"] == 18 and r["method"] == "speculative" and r["steps"] <= r["drafted"] <= 3 * r["steps"]
        if isinstance(r["k"], str):
            fixed = next(x for x in rows if x["rule"] == r["rule"] and x["k"] == 3)
            assert r["al_vs_chain"] == pytest.approx(r["al"] / fixed["al"])
    assert all(r["al_vs_sps"] == 1 for r in rows if r["rule"] == "SpS")
    assert "3 top>=0.5" in format_table(res)


def test_run_benchmark_budget_trees_joint_twins_and_tree_targets():
    """EAGLE-2 budget trees with their scheme and mode in the tree entry: a joint twin runs Cactus only
    (SpS's joint law is its rounds law) and is compared with SpS on its rounds twin; ``tree_targets``
    reads both, compares each tree with the chain at the largest k (paired interval) and calls a target
    met only when the whole interval clears it."""
    from cactus_theory.core.tree import BudgetTree
    from cactus_theory.lm.experiments.experiment import run_benchmark, tree_targets

    rules = [("SpS", ct.SpS()), ("Cactus d=1.0", ct.Cactus(1.0))]
    tree = BudgetTree(4, 3, 2)
    trees = [("eagle2 4,3,2", tree, "deterministic", "rounds"), ("eagle2 4,3,2 joint", tree, "deterministic", "joint")]
    res = run_benchmark(pair(), [[1, 2], [3], [4, 5]], rules=rules, ks=(2,), batch_sizes=(1,), max_new_tokens=6,
                        progress=False, trees=trees, rounds=1)
    rows = res["rows"]
    assert [(r["rule"], r["k"]) for r in rows] == [("SpS", 2), ("Cactus d=1.0", 2), ("SpS", "eagle2 4,3,2"),
                                                   ("Cactus d=1.0", "eagle2 4,3,2"), ("Cactus d=1.0", "eagle2 4,3,2 joint")]
    sps_tree = rows[2]
    joint = rows[4]
    assert joint["al_vs_sps"] == pytest.approx(joint["al"] / sps_tree["al"])
    assert sps_tree["al_vs_chain"] == pytest.approx(sps_tree["al"] / rows[0]["al"])
    lo, hi = sps_tree["al_vs_chain_ci"]
    assert lo <= sps_tree["al_vs_chain"] <= hi and sps_tree["verifier_vs_one"] > 0
    t = {x[0]: x for x in tree_targets(res, "eagle2 4,3,2")}
    assert set(t) == {"eagle2 4,3,2: SpS AL", "eagle2 4,3,2: SpS AL / chain SpS AL", "eagle2 4,3,2: SpS speedup",
                      "eagle2 4,3,2: verifier forward / one-token forward", "eagle2 4,3,2: Cactus d=1 AL / SpS AL",
                      "eagle2 4,3,2: Cactus d=1 speedup"}
    what, measured, ci, target, met = t["eagle2 4,3,2: SpS AL"]
    assert measured == sps_tree["al"] and met == (ci[0] >= 2.6)
    tj = tree_targets(res, "eagle2 4,3,2 joint")
    assert [x[0] for x in tj] == ["eagle2 4,3,2 joint: Cactus d=1 AL / SpS AL", "eagle2 4,3,2 joint: Cactus d=1 speedup"]
