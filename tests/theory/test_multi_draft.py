"""Multi-draft optimal acceptance (``optimize.max_acceptance_multi``, ``multi_draft_acceptance``) and
Cactus with several drafts (``optimize.solve_target_multi``), against independent references: an LP
solved by scipy's HiGHS (not cvxpy), brute force over every token set, Theorem 1 at ``K = 1``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

import cactus_theory as ct
from cactus_theory import registry
from cactus_theory.optimize import (
    max_acceptance,
    max_acceptance_multi,
    multi_draft_acceptance,
    solve_target_multi,
)


def highs_multi(p: np.ndarray, h: np.ndarray, K: int) -> float:
    """The coupling LP written out cell by cell and solved by scipy's HiGHS (independent of cvxpy)."""
    V = p.size
    cells = list(itertools.product(range(V), repeat=K))
    n = len(cells) * V
    c = np.zeros(n)
    A, b = [], []
    for i, x in enumerate(cells):
        for y in range(V):
            c[i * V + y] = -1.0 if y in x else 0.0
        row = np.zeros(n)
        row[i * V:(i + 1) * V] = 1
        A.append(row)
        b.append(np.prod(p[list(x)]))
    for y in range(V):
        row = np.zeros(n)
        row[y::V] = 1
        A.append(row)
        b.append(h[y])
    res = linprog(c, A_eq=np.array(A), b_eq=np.array(b), bounds=(0, None), method="highs")
    assert res.status == 0
    return -res.fun


def brute(p: np.ndarray, h: np.ndarray, K: int) -> float:
    """``min_S h(S) + 1 - p(S)^K`` over all ``2^V`` token sets."""
    best = 1.0
    for m in range(2 ** p.size):
        S = np.array([(m >> i) & 1 for i in range(p.size)], dtype=bool)
        best = min(best, h[S].sum() + 1 - p[S].sum() ** K)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_lp_equals_highs_brute_force_and_theorem1(seed):
    rng = np.random.default_rng(seed)
    V = 4
    p, h = rng.dirichlet(np.full(V, 0.6)), rng.dirichlet(np.full(V, 0.6))
    for K in (1, 2, 3):
        lp = max_acceptance_multi(p, h, K)
        ref = highs_multi(p, h, K)
        assert lp.value == pytest.approx(ref, abs=1e-7)
        assert multi_draft_acceptance(p, h, K).value == pytest.approx(brute(p, h, K), abs=1e-12)
        assert multi_draft_acceptance(p, h, K).value == pytest.approx(ref, abs=1e-7)
        # the plan couples p^K and h and its acceptance is the value
        plan = lp.plan
        assert plan.shape == (V,) * (K + 1)
        assert np.allclose(plan.sum(axis=tuple(range(K))), h, atol=1e-7)
        tup = plan.sum(-1)
        law = np.einsum(",".join("abc"[:K]) + "->" + "abc"[:K], *[p] * K)  # p^K
        assert np.allclose(tup, law, atol=1e-7)
    # K = 1 is Theorem 1's 1 - TV(p, h); more drafts never accept less
    assert max_acceptance_multi(p, h, 1).value == pytest.approx(max_acceptance(p, h).value, abs=1e-8)
    assert max_acceptance_multi(p, h, 1).value == pytest.approx(1 - 0.5 * np.abs(p - h).sum(), abs=1e-8)
    vals = [multi_draft_acceptance(p, h, K).value for K in range(1, 6)]
    assert np.all(np.diff(vals) >= -1e-12)


def test_closed_form_edge_cases():
    p = np.array([0.5, 0.5, 0.0])
    assert multi_draft_acceptance(p, p, 3).value == pytest.approx(1.0)  # h = p: every draft can be kept
    assert multi_draft_acceptance(p, np.array([0.0, 0.0, 1.0]), 4).value == 0.0  # h on a token p never drafts
    h = np.array([0.2, 0.3, 0.5])
    r = multi_draft_acceptance(p, h, 2)
    assert r.value == pytest.approx(brute(p, h, 2), abs=1e-12)
    assert r.value == pytest.approx(h[r.subset].sum() + 1 - p[r.subset].sum() ** 2, abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_joint_optimum_coupling_equals_dual_and_respects_the_budget(seed):
    rng = np.random.default_rng(10 + seed)
    V = 5
    z = rng.normal(size=V) * 2
    q = np.exp(z) / np.exp(z).sum()
    e = np.exp(z + rng.normal(size=V))
    p = e / e.sum()
    for K in (1, 2):
        prev = multi_draft_acceptance(p, q, K).value
        assert solve_target_multi(p, q, 0.0, K).value == pytest.approx(prev, abs=1e-7)  # delta = 0: lossless
        for delta in (0.01, 0.1):
            a = solve_target_multi(p, q, delta, K, method="coupling")
            b = solve_target_multi(p, q, delta, K, method="dual")
            assert a.value == pytest.approx(b.value, abs=1e-6)
            assert float(ct.kl(a.h, q)) <= delta + 1e-7 and float(ct.kl(b.h, q)) <= delta + 1e-7
            assert a.value >= prev - 1e-7  # a larger budget never accepts less
            assert a.value == pytest.approx(multi_draft_acceptance(p, a.h, K).value, abs=1e-9)
            prev = a.value


def test_one_draft_optimum_bounds_every_rule_at_its_own_step_kl():
    """Theorem 1: a rule whose step law is h_alg accepts at most 1 - TV(p, h_alg), which is at most the
    best acceptance over all h with KL(h || q) <= KL(h_alg || q)."""
    rng = np.random.default_rng(3)
    V = 12
    z = rng.normal(size=V) * 2
    q = np.exp(z) / np.exp(z).sum()
    e = np.exp(z + rng.normal(size=V))
    p = e / e.sum()
    checked = 0
    for s in registry.RULES.values():
        if s.lossless or s.reads_head or s.stateful:  # a stateful rule has no one-step law
            continue
        for _, rule in s.sweep_rules()[::2]:
            a = float(ct.acceptance_rate(rule, p, q))
            k = float(ct.step_divergence(rule, p, q, "kl"))
            if np.isfinite(k) and k > 0:
                assert a <= solve_target_multi(p, q, k, 1, method="dual").value + 1e-6, rule
                checked += 1
    assert checked >= 20


def test_one_draft_optimum_is_clip_of_p():
    rng = np.random.default_rng(4)
    V = 10
    z = rng.normal(size=V) * 2
    q = np.exp(z) / np.exp(z).sum()
    e = np.exp(z + 1.5 * rng.normal(size=V))
    p = e / e.sum()
    r = solve_target_multi(p, q, 0.05, 1, method="dual")
    assert r.value < 1
    t = r.h / q
    assert np.allclose(r.h, np.clip(p, t.min() * q, t.max() * q), atol=1e-5)


def test_bad_input_names_the_argument():
    p = np.array([0.5, 0.5])
    with pytest.raises(ValueError, match="num_drafts"):
        max_acceptance_multi(p, p, 0)
    with pytest.raises(ValueError, match="num_drafts"):
        multi_draft_acceptance(p, p, True)
    with pytest.raises(ValueError, match="same shape"):
        multi_draft_acceptance(p, np.array([0.2, 0.3, 0.5]), 2)
    with pytest.raises(ValueError, match="max_cells"):
        max_acceptance_multi(np.full(10, 0.1), np.full(10, 0.1), 6)
    with pytest.raises(ValueError, match="delta"):
        solve_target_multi(p, p, -1.0, 2)
    with pytest.raises(ValueError, match="method"):
        solve_target_multi(p, p, 0.1, 2, method="bogus")
    with pytest.raises(ValueError, match="divergence"):
        solve_target_multi(p, p, 0.1, 2, divergence="bogus")
    with pytest.raises(ValueError, match="normalised"):
        multi_draft_acceptance(np.array([0.5, 0.6]), p, 2)
