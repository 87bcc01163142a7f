"""The first eval design (``lm.experiments.eval``, result format 1; ``cactus-theory eval`` now runs the replicated
design, tests/lm/experiments/test_replicated.py) on a tiny random pair with a character tokenizer (no download): the harness's
numbers against independent recomputations, resuming from the per-batch cache, the interval
statistics against scipy / enumeration, the task generators and scorer, and the distribution tests.

Statistical tests: the law tests run at ``lawtests.ALPHA = 1e-4`` each with fixed seeds (deterministic);
were the seeds redrawn, the 2 true-null checks below would fail with probability <= 2e-4 together. Their
power (``detectable_tv``) is asserted, and the control must reject a wrong law whose TV from the true one
exceeds it.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from scipy import stats as sps
from transformers import LlamaForCausalLM

from cactus_theory.lm import ModelPair
from cactus_theory.lm.experiments import eval as ev
from cactus_theory.lm.experiments.lawtests import (
    ALPHA,
    format_lawtests,
    run_lawtests,
    verify_step_test,
)
from cactus_theory.lm.experiments.tasks import (
    TASKS,
    extract_answer,
    make_problems,
    score,
    strict_answer,
)
from cactus_theory.rules import Cactus, DropMatch, Interpolation, SpS
from cactus_theory.stats import detectable_tv, paired_difference, power, proportion_interval
from tests.helpers import tiny_llama

ALPHABET = "0123456789 Answer:"  # 18 symbols: the tiny models' whole vocabulary
V = len(ALPHABET)


class CharTokenizer:
    """One id per character of ``ALPHABET``; other characters map to the space. No chat template."""

    chat_template = None
    eos_token_id = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": [ALPHABET.index(c) if c in ALPHABET else ALPHABET.index(" ") for c in text[-12:]]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(ALPHABET[i] for i in ids)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(seed: int) -> LlamaForCausalLM:
    return tiny_llama(seed, V, layers=1, ctx=128, scale=3.0)


PAIR = ModelPair(tiny(1), tiny(2), CharTokenizer(), name="tiny")


# -- statistics -----------------------------------------------------------------------------------

def test_wilson_interval_matches_scipy():
    for k, n in [(0, 10), (3, 10), (47, 80), (80, 80), (150, 300)]:
        ref = sps.binomtest(k, n).proportion_ci(0.95, method="wilson")
        got = proportion_interval(k, n)
        assert got.estimate == k / n
        assert got.low == pytest.approx(ref.low, abs=1e-12) and got.high == pytest.approx(ref.high, abs=1e-12)
    with pytest.raises(ValueError, match="successes"):
        proportion_interval(11, 10)


def test_paired_difference_mcnemar_by_enumeration_and_bootstrap_width():
    rng = np.random.default_rng(0)
    x, y = rng.random(300) < 0.6, rng.random(300) < 0.5
    r = paired_difference(x, y)
    b, c = int((x & ~y).sum()), int((~x & y).sum())
    tail = sum(math.comb(b + c, i) for i in range(min(b, c) + 1)) / 2 ** (b + c)
    assert (r.x_only, r.y_only) == (b, c)
    assert r.pvalue == pytest.approx(min(1.0, 2 * tail), rel=1e-9)
    assert r.estimate == pytest.approx(x.mean() - y.mean())
    sd = np.std(x.astype(float) - y, ddof=1) / math.sqrt(300)  # normal approximation of the paired mean
    assert r.low == pytest.approx(r.estimate - 1.96 * sd, abs=0.01) and r.high == pytest.approx(r.estimate + 1.96 * sd, abs=0.01)
    with pytest.raises(ValueError, match="0/1"):
        paired_difference([0, 2], [0, 1])


def test_detectable_tv_inverts_power():
    eps = detectable_tv(20_000, categories=20, alpha=1e-4, beta=0.1)
    assert power(20_000, eps, categories=20, alpha=1e-4) == pytest.approx(0.9, abs=1e-3)
    assert 0.01 < eps < 0.05


# -- tasks ----------------------------------------------------------------------------------------

def _reference_answer(task: str, question: str) -> int:
    """The answer recomputed from the question's own numbers (independent of the generator)."""
    q = question.split("?")[0]
    nums = [int(t) for t in re.findall(r"\d+", q)]
    if task == "count":
        return len(q.split(":")[1].split(","))
    if task == "arith":
        return nums[0] + nums[1] if "+" in q else nums[0] - nums[1]
    if task == "lookup":
        names = re.findall(r"([A-Z][a-z]+) has (\d+)", q)
        return int(dict(names)[q.split("does ")[1].split(" have")[0]])
    return {"add": nums[0] + nums[1] if len(nums) > 1 else None, "add_wide": nums[0] + nums[1], "add1": nums[0] + nums[1] if len(nums) > 1 else None, "sub": nums[0] - nums[1] if len(nums) > 1 else None,
            "add_sub": nums[0] + nums[1] - nums[2] if len(nums) > 2 else None, "sum3": sum(nums),
            "compare": max(nums)}[task]


def test_problems_are_seeded_prefix_stable_and_correct():
    a, b = make_problems("add", 20, seed=3), make_problems("add", 40, seed=3)
    assert a == b[:20] and a != make_problems("add", 20, seed=4)
    for task in TASKS:
        for p in make_problems(task, 30, seed=1):
            assert p.answer == _reference_answer(task, p.question), p
    with pytest.raises(ValueError, match="task"):
        make_problems("gsm8k", 3)
    with pytest.raises(ValueError, match="n must"):
        make_problems("add", 0)


@pytest.mark.parametrize("text, want, strict", [
    ("3 + 4 = 7.\nAnswer: 7", 7, 7), ("so 12 apples.\nThe answer is 12.", 12, 12),
    ("The final answer is $1,250", 1250, 1250), ("He has 5, then 9 more: 14", 14, None),
    ("5 + 4 = 9.\n\nThis is the sum of 5 and 4.", 9, None), ("Answer: N", None, None), ("no number", None, None),
    ("answer: -3 and 8", -3, -3), ("Answer: 5 (wrong), so the answer is 6", 6, 6),
])
def test_extract_answer(text, want, strict):
    assert extract_answer(text) == want
    assert strict_answer(text) == strict


# -- the harness on the tiny pair -----------------------------------------------------------------

def small_methods():
    ml = ev.methods(grid={"sps": [{}], "cactus": [{"delta": 1.0}], "interpolation": [{"alpha": 0.9}]},
                    only=["cactus", "interpolation"])
    return [m for m in ml if m.key in (None, "sps", "cactus", "interpolation")]


CFG = dict(task="add", problems=6, k=2, max_new_tokens=6, batch_size=4)


def test_eval_numbers_match_independent_recomputation(tmp_path, monkeypatch):
    monkeypatch.setattr(ev, "DELTA_MAX", 16.0)  # a short ladder for the tiny pair
    cfg = ev.EvalConfig(**CFG)
    ml = small_methods()
    res = ev.run_eval(PAIR, cfg, ml, tmp_path / "cache", progress=False)
    probs = make_problems("add", 6)
    sps_label = next(m.label for m in ml if m.key == "sps")
    for m in ml:
        R, S = res["records"][m.label], res["summary"][m.label]
        assert [r["id"] for r in R] == [p.id for p in probs]
        assert [r["correct"] for r in R] == [score(r["text"], p) for r, p in zip(R, probs, strict=True)]
        assert S["accuracy"][0] == pytest.approx(np.mean([r["correct"] for r in R]))
        assert all(r["new_tokens"] == len(r["text"]) for r in R)  # one character per token
        assert S["nll"][0] == pytest.approx(sum(r["nll_sum"] for r in R) / sum(r["nll_count"] for r in R))
        if m.rule is not None:
            al = sum(r["accepted"] + r["steps"] for r in R) / sum(r["steps"] for r in R)  # DecodeStats.al
            assert S["al"][0] == pytest.approx(al) and 1 <= al <= cfg.k + 1
            # every emitted token is the prompt pass's first, an accepted draft or a step's last
            assert all(r["new_tokens"] <= r["accepted"] + r["steps"] + 1 for r in R)
            assert S["al"][1] <= al <= S["al"][2]
            acc = sum(r["accepted"] for r in R) / sum(r["drafted"] for r in R)
            assert S["acceptance"][0] == pytest.approx(acc)
            assert all(r["drafted"] == cfg.k * r["steps"] for r in R)
            assert S["speedup"][0] > 0
    assert res["summary"][sps_label]["diff_vs_sps"]["estimate"] == 0
    ab = res["ablation"]
    assert ab["status"] in ("matched", "unreachable") and len(ab["records"]) == 6
    assert ab["delta"] <= 16.0 and list(ab["probes_first_batch"])
    md = ev.format_table(res)
    table, notes = md.split("\n\n")
    # header, rule, one row per method, the ablation row, the pooled lossless row (verifier alone + SpS)
    assert table.count("\n") == len(ml) + 3 and table.splitlines()[-1].startswith("| pooled lossless (verifier alone + SpS")
    assert "Holm" in table and "Family of the p-values" in notes and "Minimum detectable difference" in notes


def test_eval_tree_rows_decode_trees_and_key_their_own_cache(tmp_path):
    """``--tree NODES``: SpS and Cactus delta = 1 rows on EAGLE-2's budget tree, decoded by
    ``tree_generate`` (each step drafts the tree's nodes; AL past the chain's bound is possible),
    cached apart from the chain rows of the same rule, and left out of the one-step law tests."""
    from cactus_theory.core.tree import BudgetTree

    tree = BudgetTree(4, 3, 2)
    ml = ev.methods(grid={"sps": [{}], "cactus": [{"delta": 1.0}]}, only=["cactus"], trees=[tree])
    ml = [m for m in ml if m.key in (None, "sps", "cactus")]
    trees = [m for m in ml if m.tree is not None]
    assert [m.label for m in trees] == ["SpS, EAGLE-2 tree 4/3/2", "Cactus delta=1, EAGLE-2 tree 4/3/2"]
    chain_sps = next(m for m in ml if m.key == "sps" and m.tree is None)
    assert trees[0].rule_id != chain_sps.rule_id and trees[0].slug != chain_sps.slug
    cfg = ev.EvalConfig(**CFG)
    res = ev.run_eval(PAIR, cfg, ml, tmp_path, ablation=False, progress=False)
    for m in trees:
        R = res["records"][m.label]
        assert all(r["drafted"] == tree.kept * r["steps"] for r in R)
        assert res["summary"][m.label]["al"][0] >= 1
        assert "rej_vs_sps" not in res["summary"][m.label]  # a tree's unvisited nodes are not rejections
    assert ev.stale_methods(res) == {}  # a tree row's id names its tree: not an "earlier definition"
    assert "(earlier definition)" not in ev.format_table(res)
    sps_label = next(m.label for m in ml if m.key == "sps")
    assert res["summary"][sps_label]["diff_vs_sps"]["estimate"] == 0  # the chain SpS stays the reference
    lt = run_lawtests(PAIR, ml, make_problems("add", 1), draws=2000, loop_draws=200, k=2, progress=False)
    assert {r["method"] for r in lt["step"]}.isdisjoint(m.label for m in trees)


def test_tree_rows_of_every_kind_keep_the_budget_trees_keys_and_round_trip(tmp_path):
    """A tree row reads its tree through ``core.tree_shapes`` (``tree_name``, ``tree_record``, ``tree_from_record``),
    never its class: a ``BudgetTree`` row keeps the label, the ``rule_id`` (cache key) and the recorded dict that
    results and caches were written under (pinned literally here); a ``DynamicTree`` or ``StaticTree`` row gets its
    own label and id, and every kind round-trips through its record (JSON) to the same tree and the same id, so
    ``stale_methods`` finds none stale."""
    from cactus_theory.core.tree_shapes import (
        BudgetTree,
        DynamicTree,
        StaticTree,
        branching_parents,
        tree_from_record,
        tree_record,
    )

    trees = [BudgetTree(4, 3, 2), DynamicTree(3, 2, 2), StaticTree(branching_parents((2, 2)))]
    ml = [m for m in ev.methods(grid={"sps": [{}], "cactus": [{"delta": 1.0}]}, only=["cactus"], trees=trees)
          if m.tree is not None]
    assert len(ml) == 6
    sps_budget, cactus_budget = ml[0], ml[1]
    assert sps_budget.label == "SpS, EAGLE-2 tree 4/3/2"
    assert sps_budget.rule_id == "SpS()|BudgetTree(nodes=4, depth=3, topk=2)|deterministic"
    assert sps_budget.slug == "SpS__EAGLE-2_tree_4_3_2-83ae1081"
    assert json.dumps(ev.method_info(sps_budget)) == (
        '{"label": "SpS, EAGLE-2 tree 4/3/2", "key": "sps", "params": {}, "rule": "SpS()|BudgetTree(nodes=4, '
        'depth=3, topk=2)|deterministic", "colour": "black", "tree": {"nodes": 4, "depth": 3, "topk": 2, '
        '"scheme": "deterministic"}}')
    assert cactus_budget.label == "Cactus delta=1, EAGLE-2 tree 4/3/2"
    assert cactus_budget.rule_id == ("Cactus(delta=1.0, divergence='kl', solver='taylor')|BudgetTree(nodes=4, "
                                     "depth=3, topk=2)|deterministic")
    assert [m.label for m in ml[2:]] == ["SpS, dynamic tree 3/2/2", "Cactus delta=1, dynamic tree 3/2/2",
                                         "SpS, static tree -1,-1,0,0,1,1", "Cactus delta=1, static tree -1,-1,0,0,1,1"]
    assert ml[2].rule_id == "SpS()|DynamicTree(depth=3, width=2, children=2)|deterministic"
    assert len({m.label for m in ml}) == len({m.rule_id for m in ml}) == len({m.slug for m in ml}) == 6
    infos = json.loads(json.dumps([ev.method_info(m) for m in ml]))  # as a result file holds them
    assert infos[2]["tree"] == {"kind": "dynamic", "depth": 3, "width": 2, "children": 2, "scheme": "deterministic"}
    assert infos[4]["tree"] == {"kind": "static", "parents": [-1, -1, 0, 0, 1, 1], "scheme": "deterministic"}
    for m, info in zip(ml, infos, strict=True):
        assert tree_from_record(info["tree"]) == m.tree and info["rule"] == m.rule_id
    assert ev.stale_methods({"methods": infos}) == {}
    bumped = [dict(i, rule=i["rule"].replace("depth=3", "depth=2")) for i in infos[:3]]
    assert set(ev.stale_methods({"methods": bumped})) == {m.label for m in ml[:3]}  # the tree is part of the id
    for tree in trees:
        assert tree_from_record(json.loads(json.dumps(tree_record(tree)))) == tree
    chain = [m for m in small_methods() if m.key in (None, "sps")]
    res = ev.run_eval(PAIR, ev.EvalConfig(**{**CFG, "problems": 4}), chain + [ml[2]], tmp_path, ablation=False,
                      progress=False)  # a DynamicTree row decodes (tree_generate) and records itself
    assert all(r["drafted"] == trees[1].nodes * r["steps"] for r in res["records"][ml[2].label])
    assert res["methods"][-1]["tree"]["kind"] == "dynamic" and ev.stale_methods(res) == {}

    class Unrecorded:  # a Tree of another kind: it decodes (tests/lm/test_tree_loop.py) but results cannot record it
        depth, grown, nodes, reranks, parents = 1, 2, 2, False, (-1, -1)

    with pytest.raises(ValueError, match="recorded tree"):
        tree_record(Unrecorded())
    with pytest.raises(ValueError, match="kind"):
        tree_from_record({"kind": "beam", "depth": 2})
    with pytest.raises(ValueError, match="lacks"):
        tree_from_record({"nodes": 4, "depth": 3})


def test_eval_resumes_from_cache_and_recomputes_only_what_is_missing(tmp_path, monkeypatch):
    cfg = ev.EvalConfig(**CFG)
    ml = small_methods()[:2]
    first = ev.run_eval(PAIR, cfg, ml, tmp_path, ablation=False, progress=False)
    calls = []
    real = ev._batch_record
    monkeypatch.setattr(ev, "_batch_record", lambda *a, **k: calls.append(a[2].label) or real(*a, **k))
    again = ev.run_eval(PAIR, cfg, ml, tmp_path, ablation=False, progress=False)
    assert calls == [] and again["records"] == first["records"]
    victim = next((tmp_path / cfg.key()).glob("*/b0001.json"))
    victim.write_text("{half a file")  # a damaged piece is recomputed, the rest reused
    third = ev.run_eval(PAIR, cfg, ml, tmp_path, ablation=False, progress=False)
    assert len(calls) == 1 and third["records"] == first["records"]  # same seed per batch: same draws


def test_evaluate_writes_json_table_and_figure(tmp_path):
    cfg = ev.EvalConfig(**{**CFG, "problems": 4})
    res = ev.evaluate(PAIR, cfg, tmp_path, only=["cactus"], ablation=False,
                      lawtests={"prompts": 2, "draws": 2000, "loop_draws": 200}, progress=False)
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert "text" not in saved["records"]["verifier alone"][0]
    assert saved["summary"].keys() == res["summary"].keys()
    assert (tmp_path / "eval.md").read_text().startswith("| method |")
    assert (tmp_path / "fig_eval_accuracy_al.png").stat().st_size > 0
    assert len(saved["lawtests"]["step"]) == 2 * (len(res["methods"]) - 1)
    # the saved JSON's keys are sorted; the table keeps the methods' order (verifier alone, SpS, ...)
    table = ev.format_table(saved).split("\n\n")[0]
    rows = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines()[2:]]
    assert rows[:-1] == [m["label"] for m in saved["methods"]] and rows[-1].startswith("pooled lossless")


# -- distribution tests ---------------------------------------------------------------------------

def test_lawtests_accept_true_laws_and_reject_a_wrong_one():
    ml = [ev.Method("verifier alone", None), ev.Method("SpS", "sps", {}, SpS()),
          ev.Method("Cactus", "cactus", {"delta": 1.0}, Cactus(1.0)),
          ev.Method("DropMatch", "dropmatch", {}, DropMatch(0.01, 4))]
    lt = run_lawtests(PAIR, ml, make_problems("add", 1), draws=20_000, loop_draws=400, k=2, progress=False)
    assert lt["alpha"] == ALPHA
    assert [r["method"] for r in lt["step"]] == ["SpS", "Cactus"]  # DropMatch's law needs its dropout paths
    assert list(lt["untested"]) == ["DropMatch"] and "DropMatch: not tested here" in format_lawtests(lt)
    assert len({r["position"] for r in lt["step"]}) == 1  # every rule judged at the prompt's one chosen position
    assert [r["reject"] for r in lt["step"]] == [False, False]
    for r in lt["step"]:
        assert r["detectable_tv"] < 0.05
    c = lt["control"][0]
    assert c["tv_between_laws"] > c["detectable_tv"] and c["reject"]
    assert not lt["loop"]["sps_vs_verifier_3_tokens"]["reject"]
    assert not lt["loop"]["cactus_second_token"]["reject"]
    # the step test has power against a real difference: interpolation's draws vs SpS's law
    p = np.full(V, 1 / V)
    q = np.zeros(V)
    q[:3] = [0.6, 0.3, 0.1]
    r = verify_step_test(Interpolation(0.9), p, q, 20_000, seed=0, law_rule=SpS())
    assert r["reject"]
