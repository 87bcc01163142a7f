"""The sequence-level certificate on toy pairs, by exact law: ``toy.budget_law`` / ``tree.tree_budget_law`` (the
whole decode's law with the budget spent in the programme's state) give ``KL(P_T || Q_T) <= E[sum of charged
costs] <= max over paths <= B`` for every budget of a grid, every allocation and every pair tried (the chain
rule and data processing, docs/sequence-budget.md); the samplers follow those laws (goodness of fit); a
chain's tree law is its chain law; and two planted controllers (one that plans a block's positions from the
budget at the block start, i.e. charges positions 2..k only after sampling; one that charges only accepted
positions, ignoring the rejected one) break the certificate, by exact law.

Statistical tests: chi-square at ALPHA = 1e-3 with fixed seeds (each true-null check fails with probability
1e-3 were the seeds redrawn); power asserted per test from its own pooled cell count (``stats.power``): the
chain tests (N = 20000) detect TV 0.06 with probability >= 0.99, the tree tests (N = 4000) TV 0.12."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory import toy
from cactus_theory.core.budget import ALLOCATIONS, BudgetPlan, BudgetState, support_rows
from cactus_theory.divergences import kl
from cactus_theory.stats import goodness_of_fit, power
from cactus_theory.tree import (
    branching_parents,
    chain_parents,
    tree_budget_law,
    tree_speculative_decode,
)

ALPHA, POWER = 1e-3, 0.99
PAIRS = [(0, 0.9), (1, 0.5), (2, 0.9)]  # (seed, draft noise weight) of toy.random_pair(3, order 2)
BUDGETS = [0.0, 0.02, 0.3, 1.5]
T = 3


def pair(seed: int, weight: float):
    return toy.random_pair(3, order=2, concentration=0.5, weight=weight, seed=seed)


def kl_to_verifier(law: np.ndarray, verifier) -> float:
    return float(kl(law.ravel(), toy.autoregressive_law(verifier, T).ravel()))


@pytest.mark.parametrize("allocation", ALLOCATIONS)
def test_the_certificate_holds_for_every_budget_and_pair(allocation):
    """``KL(P_T || Q_T) <= E[charged] <= max charged <= B`` (and the costs recomputed on the full rows by
    ``exact.step_divergence``, path by path, <= B) for every budget on the grid and every pair, k = 2; B = 0
    is SpS: the verifier's law exactly."""
    for seed, w in PAIRS:
        d, v = pair(seed, w)
        for B in BUDGETS:
            res = toy.budget_law(d, v, ct.SequenceBudget(B, allocation=allocation, delta_max=20.0), 2, T)
            K = kl_to_verifier(res.law, v)
            assert res.law.sum() == pytest.approx(1.0, abs=1e-12)
            assert K <= res.expected_spent + 1e-12 and res.expected_spent <= res.max_spent + 1e-15
            assert res.max_spent <= B and res.max_exact <= B, (seed, w, B, res.max_spent, res.max_exact)
            assert sum(res.spent.values()) == pytest.approx(1.0, abs=1e-12)
            if B == 0:
                assert K == pytest.approx(0.0, abs=1e-14)


def test_spend_down_attains_the_bound():
    """The bound cannot be improved in general: spending the budget on the first token (a budget below that
    position's cost at delta_max) makes ``KL(P_T || Q_T) >= KL(P_1 || Q_1) = c_1``, within the bisection's
    precision of ``B``; so ``KL`` equals ``B`` to 2%."""
    for seed, w in PAIRS[:2]:
        d, v = pair(seed, w)
        res = toy.budget_law(d, v, ct.SequenceBudget(0.02, delta_max=100.0), 1, 2)
        v = toy.Cached(v, "verifier")
        assert 0.98 * 0.02 <= float(kl(res.law.ravel(), toy.autoregressive_law(v, 2).ravel())) <= 0.02
        res = toy.budget_law(d, v, ct.SequenceBudget(0.02, delta_max=100.0), 2, T)
        assert 0.98 * 0.02 <= kl_to_verifier(res.law, v) <= 0.02


def test_the_verifier_first_token_and_k_1():
    """The loop's order (the first token from the verifier, the state starting after it) and one draft per
    block: the law is a law and the certificate holds."""
    d, v = pair(0, 0.9)
    for k, first in ((1, False), (2, True)):
        res = toy.budget_law(d, v, ct.SequenceBudget(0.1, allocation="even", delta_max=20.0), k, T,
                             verifier_first=first)
        assert res.law.sum() == pytest.approx(1.0, abs=1e-12) and res.max_exact <= 0.1
        assert kl_to_verifier(res.law, v) <= res.expected_spent + 1e-12


@pytest.mark.parametrize("allocation", ["spend_down", pytest.param("lagrangian", marks=pytest.mark.slow)])
def test_the_chain_sampler_follows_the_budget_law(allocation):
    """``toy.speculative_decode`` (``sampler.verify`` with one state per sequence) against ``budget_law``: the first
    3 tokens fit it; no sequence is charged more than B; the mean charge is the law's ``E[charged]``
    (within 5 standard errors)."""
    d, v = pair(0, 0.9)
    rule = ct.SequenceBudget(0.1, allocation=allocation, delta_max=20.0)
    N = 20000
    res = toy.speculative_decode(d, v, rule, 2, T, num_sequences=N, generator=torch.Generator().manual_seed(4))
    law = toy.budget_law(d, v, rule, 2, T)
    g = goodness_of_fit(res.tokens, law.law, alpha=ALPHA, kind="samples")
    assert power(N, 0.06, categories=g.bins, alpha=ALPHA) >= POWER
    assert not g.reject, g
    assert res.spent.max() <= 0.1
    vals, probs = np.array(list(law.spent)), np.array(list(law.spent.values()))
    sd = np.sqrt(probs @ (vals - law.expected_spent) ** 2)
    assert abs(res.spent.mean() - law.expected_spent) <= 5 * sd / np.sqrt(N) + 1e-12


@pytest.mark.parametrize("scheme,mode", [("iid", "rounds"), ("deterministic", "joint")])
def test_the_tree_sampler_follows_the_tree_budget_law(scheme, mode):
    """``tree_speculative_decode`` (``verify_tree`` with one state per sequence) against ``tree_budget_law``."""
    d, v = pair(1, 0.5)
    rule = ct.SequenceBudget(0.1, delta_max=20.0)
    par = branching_parents((2, 1))
    N = 4000
    res = tree_speculative_decode(d, v, rule, par, scheme, T, num_sequences=N, mode=mode,
                                  generator=torch.Generator().manual_seed(5))
    law = tree_budget_law(d, v, rule, par, scheme, T, mode=mode)
    g = goodness_of_fit(res.tokens, law.law, alpha=ALPHA, kind="samples")
    assert power(N, 0.12, categories=g.bins, alpha=ALPHA) >= POWER
    assert not g.reject, g
    assert res.spent.max() <= 0.1 and law.max_exact <= 0.1


def test_a_chains_tree_law_is_its_chain_law():
    """The tree programme (``node_parts``'s costs, ``node_choice``) on a chain with i.i.d. candidates gives the
    chain programme's law and charges (``induced_rows``'s costs, ``plan``), every allocation."""
    d, v = pair(2, 0.9)
    for allocation in ALLOCATIONS:
        rule = ct.SequenceBudget(0.2, allocation=allocation, delta_max=20.0)
        a = toy.budget_law(d, v, rule, 2, T)
        b = tree_budget_law(d, v, rule, chain_parents(2), "iid", T)
        assert np.abs(a.law - b.law).max() <= 1e-12
        assert a.expected_spent == pytest.approx(b.expected_spent, abs=1e-12)


@pytest.mark.parametrize("scheme,mode", [("iid", "rounds"), ("without_replacement", "rounds"),
                                         ("deterministic", "rounds"), ("iid", "joint"), ("deterministic", "joint")])
def test_the_certificate_holds_on_trees(scheme, mode):
    """Trees (two children at the root, one below), every lossless scheme and both modes: ``KL(P_T || Q_T) <=
    E[charged] <= B``, the node costs recomputed on the full rows (``tree_step_law``) <= B on every path."""
    d, v = pair(0, 0.9)
    for B in (0.05, 0.5):
        res = tree_budget_law(d, v, ct.SequenceBudget(B, delta_max=20.0), branching_parents((2, 1)), scheme, T,
                              mode=mode)
        assert kl_to_verifier(res.law, v) <= res.expected_spent + 1e-12
        assert res.max_spent <= B and res.max_exact <= B


# -- planted controllers: both break the certificate --------------------------------------------------

@dataclass(frozen=True)
class NoWithinBlock(ct.SequenceBudget):
    """Plans every position of a block from the budget left at the block start: positions 2..k are paid for
    only when the block is charged, after it was sampled."""

    def plan(self, state, p, q):
        B, k = p.shape[0], p.shape[1]
        P, Q = support_rows(p, q[:, :k])
        delta, cost = np.zeros((B, k)), np.zeros((B, k))
        for j in range(k):
            def f(rows, dl, j=j):
                return self.step_costs(P[rows, j], Q[rows, j], dl)
            delta[:, j], cost[:, j] = self.choose(f, state.remaining, state.left - j, state.spread - j)
        return BudgetPlan(delta, cost)


class _AcceptedOnly(BudgetState):
    def charge(self, plan, judged, emitted):
        accepted = np.asarray(judged) & (np.arange(plan.cost.shape[1])[None] < (np.asarray(emitted) - 1)[:, None])
        super().charge(plan, accepted, emitted)


@dataclass(frozen=True)
class ChargeAccepted(ct.SequenceBudget):
    """Charges a row only for its accepted drafts: the rejected position's cost is ignored."""

    def start(self, batch, max_tokens=None):
        state = super().start(batch, max_tokens)
        state.__class__ = _AcceptedOnly
        return state


@pytest.mark.parametrize("planted", [NoWithinBlock, ChargeAccepted])
def test_planted_controllers_break_the_certificate(planted):
    """Same pair, same budget, same exact programme: the controller keeps ``KL <= B``; each planted one spends
    more than ``B`` on some path (recomputed costs) and its law sits more than ``B`` from the verifier's."""
    d, v = pair(0, 0.9)
    B = 0.1
    ok = toy.budget_law(d, v, ct.SequenceBudget(B, delta_max=100.0), 2, T)
    bad = toy.budget_law(d, v, planted(B, delta_max=100.0), 2, T)
    assert kl_to_verifier(ok.law, v) <= B and ok.max_exact <= B
    assert bad.max_exact > 1.3 * B
    assert kl_to_verifier(bad.law, v) > 1.3 * B
