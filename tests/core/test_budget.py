"""``SequenceBudget`` (core/budget.py): its exact step costs against the independent O(V log V) path, the plans
it hands to ``verify`` / ``verify_tree`` (never over the budget left, along every path a block can take), the
samplers' charging, token-for-token identities with Cactus and SpS at the budget's ends, the batched one-node
law, and the refusals of every entry point that cannot carry its state. The whole-decode laws: tests/theory/
test_budget.py; the decode loops: tests/lm/test_budget_loop.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import cactus_theory as ct
from cactus_theory.core.budget import ALLOCATIONS, SLACK, BudgetState, CactusRows, support_rows
from cactus_theory.core.sampler import sample_rows, verify, verify_flat
from cactus_theory.core.tree import node_law_rows, node_parts
from cactus_theory.tree import branching_parents, chain_parents, verify_tree
from tests.helpers import cases

budgets = st.sampled_from([0.0, 1e-4, 0.01, 0.1, 0.5, 2.0, 50.0])


def _block(seed: int, B: int = 6, k: int = 3, V: int = 7, zeros: bool = True):
    """A batch of drafted blocks (torch float64): Dirichlet(0.5) rows, some entries zeroed (top-k-like)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, 0.5), size=(B, k))
    q = rng.dirichlet(np.full(V, 0.5), size=(B, k + 1))
    if zeros:
        for x in (p, q):
            x[rng.uniform(size=x.shape) < 0.3] = 0.0
            x[..., 0] += 1e-3  # never an empty row
            x /= x.sum(-1, keepdims=True)
    p, q = torch.from_numpy(p), torch.from_numpy(q)
    g = torch.Generator().manual_seed(seed)
    n = torch.stack([sample_rows(p[:, j], torch.rand(B, generator=g, dtype=torch.float64)) for j in range(k)], 1)
    return n, p, q


@given(cases(max_V=10), st.lists(st.sampled_from([0.0, 1e-3, 0.05, 0.3, 1.0, 4.0]), min_size=1, max_size=4))
def test_step_costs_are_the_exact_step_kl(case, deltas):
    """The controller's costs (``induced_rows`` on the rows cut to their support, one delta per row) equal
    ``exact.step_divergence`` / ``acceptance_rate`` of ``Cactus(delta)`` on the full rows (the O(V log V) sort
    path, written apart), on every kind of case (zeros either side, one-hot q, q_n = 1, disjoint supports)."""
    p, q, _ = case
    rule = ct.SequenceBudget(1.0)
    R = len(deltas)
    P, Q = support_rows(np.tile(p, (R, 1)), np.tile(q, (R, 1)))
    acc, cost = rule.step_costs(P, Q, np.array(deltas))
    for i, d in enumerate(deltas):
        want = 0.0 if d == 0 else float(ct.step_divergence(ct.Cactus(d), p, q))
        assert cost[i] == pytest.approx(want, rel=1e-9, abs=1e-13), (d, cost[i], want)
        assert acc[i] == pytest.approx(float(ct.acceptance_rate(ct.Cactus(d), p, q)), abs=1e-12)


def test_support_rows_agree_on_numpy_and_torch():
    """The same columns, in the same order (so the same float sums) from numpy and torch rows of any dtype."""
    _, p, q = _block(3)
    a = support_rows(p.numpy(), q[:, :3].numpy(), return_index=True)
    b = support_rows(p, q[:, :3], return_index=True)
    c = support_rows(p.float(), q[:, :3].float(), return_index=True)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert np.array_equal(a[2], c[2]) and np.allclose(a[0], c[0], atol=1e-6)
    assert np.allclose(a[0].sum(-1), 1) and ((a[0] > 0) | (a[1] > 0)).sum(-1).max() == a[0].shape[-1]


@given(st.integers(0, 2**16), budgets, st.sampled_from(ALLOCATIONS), st.integers(1, 4),
       st.sampled_from([0.3, 1.0, 20.0]))
def test_a_plan_never_spends_more_than_is_left_on_any_path(seed, B, allocation, k, delta_max):
    """Every row's plan, for every number ``m`` of positions a block may judge: ``sum_{j < m} cost_j <= B -
    spent - SLACK * B``; each cost is the exact step KL of ``Cactus(delta_j)`` (recomputed on the full rows);
    ``delta = 0`` costs 0; a position past the tokens the row may still emit gets ``delta = 0``;
    ``"even"`` keeps each cost within its share ``R / L``."""
    n, p, q = _block(seed, k=k)
    rule = ct.SequenceBudget(B, allocation=allocation, delta_max=delta_max)
    rng = np.random.default_rng(seed)
    left = rng.integers(0, 6, size=6)
    state = rule.start(6, max_tokens=left)
    state.spent = rng.uniform(0, 1.2, size=6) * B  # some rows already (over-)spent: nothing left for them
    plan = rule.plan(state, p, q)
    assert plan.delta.shape == plan.cost.shape == (6, k)
    cum = np.cumsum(plan.cost, 1)
    assert np.all(cum <= np.maximum(state.remaining - SLACK * B, 0)[:, None] + 1e-15)
    assert np.all(plan.delta <= delta_max) and np.all(plan.delta >= 0)
    for b in range(6):
        R = state.remaining[b]
        for j in range(k):
            d = plan.delta[b, j]
            exact = 0.0 if d == 0 else float(ct.step_divergence(ct.Cactus(d), p[b, j].numpy(), q[b, j].numpy()))
            assert plan.cost[b, j] == pytest.approx(exact, rel=1e-9, abs=1e-13)
            if j >= left[b]:
                assert d == 0.0
            if allocation == "even":
                assert plan.cost[b, j] <= R / max(state.spread[b] - j, 1) + 1e-15
            R -= plan.cost[b, j]


def test_spend_down_takes_delta_max_while_it_fits_then_the_largest_fit():
    """With a budget that covers ``delta_max`` at every position the plan is ``delta_max`` throughout; with a
    budget below the first position's cost at ``delta_max``, that position spends it to within the bisection's
    precision (1e-2 in delta: the cost is within 2% of the budget here) and the later positions get the crumbs."""
    n, p, q = _block(11, zeros=False)
    rule = ct.SequenceBudget(1e6, delta_max=0.7)
    plan = rule.plan(rule.start(6), p, q)
    assert np.all(plan.delta == np.float32(0.7))
    small = ct.SequenceBudget(0.05, delta_max=50.0)
    plan = small.plan(small.start(6), p, q)
    assert np.all(plan.cost[:, 0] <= 0.05) and np.all(plan.cost[:, 0] >= 0.98 * 0.05)
    assert np.all(plan.cost.sum(1) <= 0.05)


def test_lagrangian_maximises_its_objective_over_its_candidates():
    """The Lagrangian's choice scores at least every grid delta that fits: ``accept - lambda cost``, ``lambda =
    1 / (2 sqrt(R / L))`` (checked on the first position, recomputed with ``exact``)."""
    n, p, q = _block(5, zeros=False)
    B, L = 0.4, 10
    rule = ct.SequenceBudget(B, allocation="lagrangian", delta_max=2.0)
    plan = rule.plan(rule.start(6, max_tokens=L), p, q)
    lam = 1 / (2 * np.sqrt(B / L))
    for b in range(6):
        pb, qb = p[b, 0].numpy(), q[b, 0].numpy()

        def score(d, pb=pb, qb=qb):
            c = 0.0 if d == 0 else float(ct.step_divergence(ct.Cactus(d), pb, qb))
            return float(ct.acceptance_rate(ct.Cactus(d), pb, qb)) - lam * c, c
        best, c_best = score(plan.delta[b, 0])
        assert c_best <= B
        for d in [0.0, *(2.0 * 2.0 ** -np.arange(16))]:
            s, c = score(float(np.float32(d)))
            if c <= B * (1 - SLACK):
                assert best >= s - 1e-9, (b, d)


@pytest.mark.parametrize("seed", [0, 1])
def test_verify_at_the_budgets_ends_is_cactus_and_sps_token_for_token(seed):
    """A budget that never binds judges every position with ``Cactus(delta_max)``; a zero budget with SpS: the
    same uniforms give the same tokens. ``verify_tree`` on a chain (``"iid"``) emits the same tokens and charges
    the same nats as ``verify`` at every budget (its costs from ``node_parts``, ``verify``'s from
    ``induced_rows``)."""
    n, p, q = _block(seed, B=64, zeros=False)
    par = torch.tensor(chain_parents(3)).expand(64, 3)
    for rule, ref in [(ct.SequenceBudget(1e6, delta_max=0.7), ct.Cactus(np.float32(0.7).item())),
                      (ct.SequenceBudget(0.0), ct.SpS()), (ct.SequenceBudget(0.5), None)]:
        st1, st2 = rule.start(64), rule.start(64)
        t1, a1 = verify(n, p, q, rule, generator=torch.Generator().manual_seed(3), state=st1)
        res = verify_tree(n, par, p, q, rule, "iid", generator=torch.Generator().manual_seed(3), state=st2)
        assert torch.equal(res.tokens, t1) and np.allclose(st1.spent, st2.spent, atol=1e-12)
        if ref is not None:
            t2, _ = verify(n, p, q, ref, generator=torch.Generator().manual_seed(3))
            assert torch.equal(t1, t2)
        assert np.all(st1.spent <= rule.budget)


def test_verify_charges_exactly_the_judged_positions():
    """After ``verify`` each row has been charged the exact step KL (recomputed from its plan's deltas on the full
    rows) of its accepted drafts and its first rejected one, never of a position after a rejection; the tokens
    left drop by the tokens emitted; a second call starts from what is left."""
    n, p, q = _block(7, B=32, zeros=False)
    rule = ct.SequenceBudget(0.6, delta_max=3.0)
    state = rule.start(32, max_tokens=50)
    spent = np.zeros(32)
    for call in range(2):
        g = torch.Generator().manual_seed(call)
        tokens, a = verify(n, p, q, rule, generator=g, state=state)
        plan = state.last
        for b in range(32):
            m = min(int(a[b]) + 1, 3)
            spent[b] += sum(float(ct.step_divergence(plan.at(b, j), p[b, j].numpy(), q[b, j].numpy()))
                            for j in range(m) if plan.delta[b, j] > 0)
            assert state.judged[b].tolist() == [j < m for j in range(3)]
        assert np.allclose(state.spent, spent, rtol=1e-9, atol=1e-13) and np.all(state.spent <= 0.6)
    assert np.all(state.left >= 50 - 2 * 4)


def test_verify_tree_charges_the_accepted_path():
    """A budgeted tree: each row is charged its root and its accepted nodes, each at the exact KL of the node's law
    (``node_parts`` of ``Cactus(delta)`` on the full rows); a node's plan fits what its ancestors left."""
    rng = np.random.default_rng(2)
    B, V = 16, 6
    par = branching_parents((2, 2))
    N = len(par)
    p = torch.from_numpy(rng.dirichlet(np.ones(V), size=(B, N)))
    q = torch.from_numpy(rng.dirichlet(np.ones(V), size=(B, N + 1)))
    for j, a in enumerate(par):  # siblings share their parent's draft row; deterministic: the top-2 of it
        p[:, j] = p[:, [i for i, x in enumerate(par) if x == a][0]]
    tok = torch.full((B, N), -1, dtype=torch.long)
    for a in sorted(set(par)):
        kids = [j for j, x in enumerate(par) if x == a]
        top = torch.argsort(-p[:, kids[0]], dim=-1, stable=True)
        for r, j in enumerate(kids):
            tok[:, j] = top[:, r]
    rule = ct.SequenceBudget(0.2, delta_max=4.0)
    for mode in ("rounds", "joint"):
        state = rule.start(B)
        res = verify_tree(tok, torch.tensor(par).expand(B, N), p, q, rule, "deterministic", mode=mode,
                          generator=torch.Generator().manual_seed(1), state=state)
        plan = state.last
        for b in range(B):
            path = [0] + [int(x) + 1 for x in res.accepted_nodes[b] if x >= 0]
            want = 0.0
            for s in path:
                kids = [j for j, x in enumerate(par) if x == s - 1]
                if not kids or plan.delta[b, s] == 0:
                    continue
                acc, rej = node_parts(plan.at(b, s), p[b, kids[0]].numpy(), q[b, s].numpy(), len(kids),
                                      "deterministic", tok[b, kids].numpy(), mode)
                want += float(ct.kl(acc.sum(0) + rej, q[b, s].numpy()))
            assert state.spent[b] == pytest.approx(want, rel=1e-9, abs=1e-13)
            assert state.spent[b] <= 0.2
            for s in range(1, N + 1):  # a node's budget: what the root and its ancestors left
                chain, x = [], s
                while x > 0:
                    x = par[x - 1] + 1
                    chain.append(x)
                assert plan.cost[b, s] + sum(plan.cost[b, a] for a in chain) <= 0.2


@given(st.integers(0, 2**16), st.sampled_from(["rounds", "joint"]), st.integers(1, 3))
def test_node_law_rows_is_node_parts(seed, mode, K):
    """The batched one-node law (deterministic candidates, one delta per row) equals ``node_parts`` row by row."""
    rng = np.random.default_rng(seed)
    R, V = 4, 6
    p, q = rng.dirichlet(np.full(V, 0.6), size=R), rng.dirichlet(np.full(V, 0.6), size=R)
    q[0] = np.eye(V)[2]  # a one-hot verifier row
    cands = np.stack([rng.permutation(V)[:K] for _ in range(R)])
    d = np.array([0.0, 0.02, 0.5, 3.0])
    law, acc = node_law_rows(CactusRows(d), p, q, cands, mode)
    for r in range(R):
        a, rej = node_parts(ct.Cactus(d[r]), p[r], q[r], K, "deterministic", cands[r], mode)
        assert np.allclose(a.sum(0) + rej, law[r], atol=1e-13) and acc[r] == pytest.approx(a.sum(), abs=1e-13)


def test_entry_points_without_a_state_refuse_it_by_its_flag():
    """Every entry point that cannot carry a per-sequence state refuses a stateful rule, naming the flag; the ones
    that can refuse a missing, foreign or mis-sized state, and a state handed to a stateless rule."""
    rule = ct.SequenceBudget(1.0)
    assert rule.stateful and not ct.Cactus(1.0).stateful and ct.registry.spec("sequence_budget").stateful
    p, q = np.full(4, 0.25), np.array([0.1, 0.2, 0.3, 0.4])
    for f in (ct.induced_distribution, ct.acceptance_rate, ct.step_divergence):
        with pytest.raises(ValueError, match="stateful"):
            f(rule, p, q)
    with pytest.raises(ValueError, match="stateful"):
        rule.accept_prob(p, q, np.array(1))
    n, P, Q = _block(0)
    with pytest.raises(ValueError, match="state=rule.start"):
        verify(n, P, Q, rule)
    with pytest.raises(ValueError, match="state=rule.start"):
        verify(n, P, Q, rule, check=False)
    with pytest.raises(ValueError, match="state belongs"):
        verify(n, P, Q, rule, state=ct.SequenceBudget(2.0).start(6))
    with pytest.raises(ValueError, match="holds 5 rows"):
        verify(n, P, Q, rule, state=rule.start(5))
    with pytest.raises(ValueError, match="stateful rule"):
        verify(n, P, Q, ct.SpS(), state=rule.start(6))
    for check in (True, False):
        with pytest.raises(ValueError, match="stateful"):
            verify_flat(n.reshape(-1), torch.tensor([3, 6, 9, 12, 15, 18]), P.reshape(-1, 7), Q[:, :3].reshape(-1, 7),
                        torch.zeros((6, 1), dtype=torch.long), rule, check=check)
    par = torch.tensor(chain_parents(3)).expand(6, 3)
    with pytest.raises(ValueError, match="alone"):
        verify_tree(n, par, P, Q, [rule, ct.SpS()], "iid")
    with pytest.raises(ValueError, match="state=rule.start"):
        verify_tree(n, par, P, Q, rule, "iid")
    with pytest.raises(ValueError, match="eagle"):
        verify_tree(n, par, P, Q, rule, "eagle", state=rule.start(6))
    from cactus_theory.theory.check import check_sampler
    with pytest.raises(ValueError, match="stateful"):
        check_sampler(lambda *a, **k: None, P[0, :1].numpy(), Q[0, :2].numpy(), rule=rule)


def test_bad_parameters_are_named():
    for kw, name in [({"budget": -1.0}, "budget"), ({"budget": float("nan")}, "budget"),
                     ({"allocation": "greedy"}, "allocation"), ({"base": "tas"}, "base"),
                     ({"delta_max": -0.1}, "delta_max"), ({"delta_max": 1e31}, "delta_max"),
                     ({"horizon": -1}, "horizon"), ({"horizon": 2.5}, "horizon")]:
        with pytest.raises((ValueError, TypeError), match=name):
            ct.SequenceBudget(**kw)
    with pytest.raises(ValueError, match="horizon"):
        ct.SequenceBudget(1.0, allocation="even").start(3)  # a spreading allocation needs a horizon
    ct.SequenceBudget(1.0, allocation="even", horizon=64).start(3)
    with pytest.raises(ValueError, match="max_tokens"):
        ct.SequenceBudget(1.0).start(3, max_tokens=[1, 2])
    with pytest.raises(ValueError, match="CactusRows"):
        CactusRows(np.zeros(3)).accept_prob_all(np.full((4, 5), 0.2), np.full((4, 5), 0.2))
    assert isinstance(ct.SequenceBudget(1.0).start(2), BudgetState)
    assert ct.registry.make("sequence_budget", budget=2.0) == ct.SequenceBudget(2.0)
