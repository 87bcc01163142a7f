"""``SequenceBudget`` in the decode loops on the tiny random Llama pair (tests/lm/common.py): every sequence's
realised KL (the loop's ``kl_sum``: the exact step KL of the Cactus each judged, kept position was judged with,
recomputed from the rows by ``metrics.step_kl``) is at most its budget, for the chain and tree loops, every
allocation, ragged batches with EOS; the chain and tree loops follow the exact whole-decode law
(``toy.budget_law`` / ``tree.tree_budget_law``); the ``decode`` command runs it. Statistical tests as in
tests/lm/common.py (chi-square at ALPHA = 1e-3, N = 20000, power asserted in ``assert_fits``)."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

import cactus_theory as ct
from cactus_theory.core.budget import ALLOCATIONS
from cactus_theory.core.tree import BudgetTree, branching_parents
from cactus_theory.lm import speculative_generate
from cactus_theory.lm.loop import tree_generate
from cactus_theory.lm.metrics import step_kl
from cactus_theory.toy import budget_law
from tests.lm.common import DRAFT, EOS, RAW, VERIFIER, N, assert_fits, cond, pair
from tests.lm.test_tree_loop import _CharTokenizer, memo, verifier_first_law

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 2, 3], [5, 6], [7], [0, 9, 8, 2], [4, 4]] * 3  # ragged, EOS reachable (EOS = 4)


@pytest.mark.parametrize("allocation,B", [(a, 0.3) for a in ALLOCATIONS] + [("spend_down", 2.0)])
def test_the_chain_loop_never_spends_more_than_the_budget(allocation, B):
    """Per sequence ``kl_sum <= B`` (the loop's own step KLs, recomputed from (p, q) with ``step_kl`` of each
    position's ``Cactus(delta)``); some sequence spends (the check is not vacuous); the paper's sampling."""
    rule = ct.SequenceBudget(B, allocation=allocation, delta_max=2.0)
    res = speculative_generate(pair(EOS), PROMPTS, rule, k=3, max_new_tokens=16, batch_size=4, seed=1)
    kls = [c.kl_sum for c in res.per_sequence]
    assert max(kls) <= B, kls
    assert max(kls) > 0.05 * B and all(c.kl_count > 0 for c in res.per_sequence if c.steps)
    assert any(len(t) < 16 for t in res.tokens)  # EOS: rows left the batch (the state left with them)


@pytest.mark.parametrize("tree,scheme,mode", [(BudgetTree(5, 3, 2), "deterministic", "rounds"),
                                              (branching_parents((2, 1)), "deterministic", "joint")])
def test_the_tree_loop_never_spends_more_than_the_budget(tree, scheme, mode):
    """The tree loop's ``kl_sum`` (its nodes' exact costs along each accepted path, as charged: the node costs
    themselves are checked against ``node_parts`` in tests/core/test_budget.py) is at most the budget for every
    sequence. Random candidates (whose exact node law sums |supp p|^K candidate tuples, slow at the paper's
    top-k) are checked on toy pairs, tests/theory/test_budget.py."""
    for allocation in ("spend_down", "lagrangian"):
        rule = ct.SequenceBudget(0.5, allocation=allocation, delta_max=2.0)
        res = tree_generate(pair(EOS), PROMPTS[:6], rule, tree, scheme, mode=mode, max_new_tokens=16, batch_size=3,
                            seed=2)
        kls = [c.kl_sum for c in res.per_sequence]
        assert max(kls) <= 0.5 and max(kls) > 0.01, kls


def test_the_loops_kl_is_recomputed_not_copied():
    """``kl_sum`` is the sum of ``step_kl`` of each judged, kept position's Cactus, recomputed from the rows the
    loop handed to ``verify``: a position judged at ``delta`` costs ``KL(h_alg(Cactus(delta)) || q)`` there."""
    rule = ct.SequenceBudget(1.0, delta_max=2.0)
    seen = []

    class Watch:
        def batch(self, *a):
            pass

        def first(self, *a):
            pass

        def chain(self, rows, drafts, p, q, tokens, a):
            seen.append((p.double().numpy().copy(), q.double().numpy().copy(), a.numpy().copy()))

    res = speculative_generate(pair(), [[1, 2, 3]], rule, k=2, max_new_tokens=12, batch_size=1, seed=3,
                               observer=Watch())
    assert res.per_sequence[0].kl_sum <= 1.0
    # replay the state: each step's plan from the same rows gives the deltas whose step KLs add up to kl_sum
    state, total, left = rule.start(1, [11]), 0.0, 11
    for p, q, a in seen:
        plan = rule.plan(state, p, q)
        m = min(int(a[0]) + 1, 2, left)
        total += sum(step_kl(plan.at(0, j), p[0, j], q[0, j]) for j in range(m))
        state.charge(plan, (np.arange(2) < min(int(a[0]) + 1, 2))[None], a + 1)
        left -= int(a[0]) + 1
    assert total == pytest.approx(res.per_sequence[0].kl_sum, rel=1e-9, abs=1e-12)


def test_the_chain_loop_follows_the_budget_law():
    """20000 decodes of 3 tokens (the first from the verifier, then blocks of 2 drafts under a budget of 0.2
    nats) fit the exact law of ``toy.budget_law`` (verifier first, the state starting after the first token).
    About 3x the cost of the loop's other exact-law tests (the plan's bisections): the one check that the loop
    hands the state to ``verify`` and drops it with its finished rows as the law needs."""
    prompt = [1, 8]
    rule = ct.SequenceBudget(0.2, delta_max=3.0)
    res = speculative_generate(pair(), [prompt] * N, rule, k=2, max_new_tokens=3, batch_size=N, seed=2,
                               track_kl=False, **RAW)
    law = budget_law(memo(cond(DRAFT)), memo(cond(VERIFIER)), rule, 2, 3, prompt=tuple(prompt), verifier_first=True)
    assert law.max_exact <= 0.2
    assert_fits(res.tokens, law.law, 3)


@pytest.mark.slow
def test_the_tree_loop_follows_the_tree_budget_law():
    prompt = [1, 8]
    rule = ct.SequenceBudget(0.2, delta_max=3.0)
    tree = branching_parents((2, 1))
    res = tree_generate(pair(), [prompt] * N, rule, tree, "deterministic", mode="joint", max_new_tokens=3,
                        batch_size=N, seed=2, **RAW)
    law = verifier_first_law(memo(cond(DRAFT)), memo(cond(VERIFIER)), rule, tree, "deterministic", 3, prompt,
                             mode="joint")
    assert_fits(res.tokens, law, 3)


@pytest.mark.parametrize("tree", [[], ["--tree", "5", "--tree-depth", "3", "--tree-topk", "2"]])
def test_decode_command_runs_the_sequence_budget(monkeypatch, tmp_path, capsys, tree):
    from cactus_theory import cli
    from cactus_theory.cli import lm as cli_lm
    monkeypatch.setattr(cli_lm, "_load", lambda args: ct.lm.ModelPair(DRAFT, VERIFIER, _CharTokenizer(), name="tiny"))
    out = tmp_path / "stats.json"
    rc = cli.main(["decode", "--draft", "smollm2", "--rule", "sequence_budget", "--budget", "0.4",
                   "--budget-allocation", "lagrangian", *tree, "--prompt", "abc", "--prompt", "hello",
                   "--max-new-tokens", "10", "--no-warmup", "--json", str(out)])
    assert rc == 0
    cap = capsys.readouterr()
    assert "sequence budget 0.4 nats per answer" in cap.out and "Traceback" not in cap.err
    blob = json.loads(out.read_text())
    assert len(blob["kl_per_answer"]) == 2 and max(blob["kl_per_answer"]) <= 0.4
    assert blob["rule"].startswith("SequenceBudget(budget=0.4")


def test_bad_uses_are_refused_before_decoding():
    from cactus_theory import cli

    for args, msg in [(["--rule", "sequence_budget", "--budget", "-1"], "--budget"),
                      (["--rule", "sequence_budget", "--budget-allocation", "all"], "--budget-allocation"),
                      (["--rule", "cactus", "--budget", "1"], "--budget is a parameter of --rule sequence_budget"),
                      (["--rule", "sequence_budget", "--tree", "5", "--tree-scheme", "eagle"], "eagle")]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                rc = cli.main(["decode", "--prompt", "x", *args])
            except SystemExit as e:
                rc = e.code
        assert rc == 2 and msg in err.getvalue(), (args, err.getvalue())
    with pytest.raises(ValueError, match="alone"):
        tree_generate(pair(), [[1]], [ct.SequenceBudget(1.0), ct.SpS()], branching_parents((2,)), "iid")
