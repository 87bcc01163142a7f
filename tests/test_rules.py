"""Acceptance rules: conventions, roots, delta = 0, batching and numpy / torch parity."""

import numpy as np
import pytest
import torch
from conftest import cases, deltas
from hypothesis import given
from hypothesis import strategies as st

import cactus_theory as ct
from cactus_theory.divergences import F_DIVERGENCES
from cactus_theory.rules import (
    EARS,
    TAS,
    Cactus,
    Interpolation,
    ScalingRule,
    SpS,
    TargetRule,
    TopK,
    taylor_gamma,
    two_block_divergence,
    two_block_root,
)

ROOT_DIVS = ("kl", "reverse_kl", "chi2", "tv", "hellinger", "js")
ALL_RULES = [
    SpS(), Cactus(0.3), Cactus(1.0), *(Cactus(0.2, d, "exact") for d in ROOT_DIVS),
    TAS(), TAS(0.2, 0.5), TopK(1), TopK(3), Interpolation(0.4), EARS(0.3),
    ct.SGLangThreshold(0.6, 0.3), ct.RelaxedAcceptance(3, 0.2), ct.MedusaTypical(), ct.FLy(0.3, 3, 0.5),
]
rules = st.sampled_from(ALL_RULES)


@given(case=cases(max_V=15), rule=rules)
def test_outputs_are_probabilities(case, rule):
    p, q, n = case
    n = np.asarray(n)
    phi = float(rule.accept_prob(p, q, n))
    assert 0.0 <= phi <= 1.0
    g = rule.residual(p, q, n)
    assert g.min() >= 0 and g.sum() == pytest.approx(1.0, abs=1e-12)
    assert rule.accept_prob_all(p, q)[n] == phi
    if isinstance(rule, TargetRule):
        h = rule.target(p, q, n)
        assert h.min() >= 0 and h.sum() == pytest.approx(1.0, abs=1e-12)
        assert phi == pytest.approx(min(1.0, h[n] / p[n]), rel=1e-12)  # p_n > 0 by construction


@given(case=cases(max_V=15), rule=rules)
def test_zero_draft_mass_never_accepts(case, rule):
    p, q, n = case
    p = p.copy()
    p[n] = 0.0
    if p.sum() == 0:
        p[(n + 1) % p.size] = 1.0
    p /= p.sum()
    assert float(rule.accept_prob(p, q, np.asarray(n))) == 0.0
    assert rule.accept_prob_all(p, q)[n] == 0.0


@pytest.mark.parametrize("rule", [r for r in ALL_RULES if isinstance(r, ScalingRule)], ids=repr)
@given(V=st.integers(2, 10), n=st.integers(0, 9), seed=st.integers(0, 999))
def test_qn_one_gives_h_equal_q(rule, V, n, seed):
    n = n % V
    q = np.eye(V)[n]
    p = np.random.default_rng(seed).dirichlet(np.ones(V))
    h = rule.target(p, q, np.asarray(n))
    np.testing.assert_array_equal(h, q)
    assert np.all(np.isfinite(rule.residual(p, q, np.asarray(n))))


@pytest.mark.parametrize("div", ROOT_DIVS)
@given(delta=deltas)
def test_gamma_clipped_to_qn_one(div, delta):
    q = np.concatenate([np.linspace(0, 1, 101), [1e-300, 1e-12, 1 - 1e-12]])
    for rule in [Cactus(delta, div, "exact")] + ([Cactus(delta)] if div == "kl" else []):
        g = rule.gamma(q)
        assert np.all(g >= q) and np.all(g <= 1)


def test_taylor_is_safe_for_strays_in_low_precision():
    q = torch.tensor([-1e-3, 0.0, 0.5, 1.0, 1.0 + 1e-3], dtype=torch.float16)
    g = taylor_gamma(q, 0.5)
    assert torch.isfinite(g).all() and (g >= 0).all() and (g <= 1).all()


def test_taylor_closed_form():
    q = np.linspace(0, 1, 41)
    for delta in (0.01, 0.5, 2.0):
        want = np.minimum(q + np.sqrt(2 * delta * q * (1 - q)), 1)
        np.testing.assert_allclose(Cactus(delta).gamma(q), want, rtol=0, atol=1e-15)


@given(case=cases(max_V=10))
def test_tas_recovers_argmax_and_is_deterministic(case):
    p, q, n = case
    rule = TAS()
    g = rule.residual(p, q, np.asarray(n))
    np.testing.assert_array_equal(g, np.eye(q.size)[np.argmax(q)])
    assert set(np.unique(rule.accept_prob_all(p, q))) <= {0.0, 1.0}


@given(case=cases(max_V=12))
def test_topk_and_interpolation_and_ears(case):
    p, q, n = case
    kth = np.sort(q)[-min(2, q.size)]
    assert float(TopK(2).accept_prob(p, q, np.asarray(n))) == float(q[n] >= kth)
    a = 0.3
    assert float(Interpolation(a).accept_prob(p, q, np.asarray(n))) == pytest.approx(
        min(1.0, a + (1 - a) * q[n] / p[n]), rel=1e-12)
    np.testing.assert_allclose(Interpolation(a).target(p, q, np.asarray(n)), a * p + (1 - a) * q, atol=1e-15)
    assert float(EARS(0.0).accept_prob(p, q, np.asarray(n))) == float(SpS().accept_prob(p, q, np.asarray(n)))
    b = 0.4
    assert float(EARS(b).accept_prob(p, q, np.asarray(n))) == pytest.approx(
        min(1.0, q[n] / p[n] + b * (1 - q.max())), rel=1e-12)


def test_residual_uses_h_not_q():
    # the worked example: recovering from (q - p)_+ instead of (h - p)_+ is a known wrong port
    p, q, n = np.array([0.05, 0.80, 0.15]), np.array([0.30, 0.35, 0.35]), np.asarray(1)
    rule = Cactus(0.21)
    h = rule.target(p, q, n)
    want = np.maximum(h - p, 0) / np.maximum(h - p, 0).sum()
    np.testing.assert_allclose(rule.residual(p, q, n), want, atol=1e-15)
    assert np.abs(want - np.maximum(q - p, 0) / np.maximum(q - p, 0).sum()).max() > 0.05


@pytest.mark.parametrize("div", ["chi2", "tv", "hellinger"])
def test_closed_form_roots_equal_bisection(div):
    q = np.concatenate([np.random.default_rng(0).uniform(0, 1, 500), [0.0, 1.0, 1e-12, 0.5, 1 - 1e-12]])
    for delta in (1e-6, 1e-3, 0.05, 0.5, 0.99, 1.0, 3.0):
        a = two_block_root(q, delta, div)
        b = two_block_root(q, delta, div, method="bisect")
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)


@pytest.mark.parametrize("div", ROOT_DIVS)
@given(q_n=st.floats(1e-6, 1 - 1e-6), delta=deltas)
def test_exact_root_is_tight(div, q_n, delta):
    """gamma* satisfies the two-block constraint, with equality unless clipped to 1."""
    g = float(two_block_root(np.asarray(q_n), delta, div))
    d = float(two_block_divergence(np.asarray(g), np.asarray(q_n), div))
    assert d <= delta + 1e-12
    if g < 1:
        assert float(two_block_divergence(np.asarray(min(g + 1e-9, 1.0)), np.asarray(q_n), div)) > delta
    else:
        assert float(two_block_divergence(np.asarray(1.0), np.asarray(q_n), div)) <= delta


@pytest.mark.parametrize("div", ROOT_DIVS)
def test_gamma_monotone_in_delta(div):
    q = np.linspace(0.01, 0.99, 25)
    gs = np.stack([Cactus(d, div, "exact").gamma(q) for d in (0.0, 1e-3, 0.01, 0.1, 0.5, 2.0)])
    assert np.all(np.diff(gs, axis=0) >= 0)
    assert np.all(np.diff(gs, axis=0).sum(axis=0) > 0)


@pytest.mark.parametrize("div", ROOT_DIVS)
@given(case=cases(max_V=12))
def test_delta_zero_is_sps(div, case):
    p, q, n = case
    n = np.asarray(n)
    for rule in [Cactus(0.0, div, "exact")] + ([Cactus(0.0)] if div == "kl" else []):
        np.testing.assert_array_equal(rule.target(p, q, n), SpS().target(p, q, n))
        assert float(rule.accept_prob(p, q, n)) == float(SpS().accept_prob(p, q, n))
        np.testing.assert_array_equal(rule.residual(p, q, n), SpS().residual(p, q, n))


@pytest.mark.parametrize("rule", ALL_RULES, ids=repr)
def test_numpy_and_torch_agree(rule):
    rng = np.random.default_rng(7)
    V = 9
    p = rng.dirichlet(np.full(V, 0.5), size=(4, 3))
    q = rng.dirichlet(np.full(V, 0.5), size=(4, 3))
    q[0, 0] = np.eye(V)[2]  # q_n = 1 row
    p[1, 1, 4] = 0.0  # p_n = 0
    p[1, 1] /= p[1, 1].sum()
    n = rng.integers(0, V, size=(4, 3))
    n[0, 0], n[1, 1] = 2, 4
    P, Q, N = torch.from_numpy(p), torch.from_numpy(q), torch.from_numpy(n)
    pairs = [(rule.accept_prob(p, q, n), rule.accept_prob(P, Q, N)),
             (rule.accept_prob_all(p, q), rule.accept_prob_all(P, Q)),
             (rule.residual(p, q, n), rule.residual(P, Q, N))]
    if isinstance(rule, TargetRule):
        pairs.append((rule.target(p, q, n), rule.target(P, Q, N)))
    for a, b in pairs:
        assert isinstance(b, torch.Tensor) and b.dtype == torch.float64 and tuple(b.shape) == a.shape
        np.testing.assert_allclose(b.numpy(), a, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("rule", ALL_RULES, ids=repr)
def test_batched_equals_rowwise(rule):
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(6), size=(2, 5)), rng.dirichlet(np.full(6, 0.3), size=(2, 5))
    n = rng.integers(0, 6, size=(2, 5))
    phi, g = rule.accept_prob(p, q, n), rule.residual(p, q, n)
    for i in range(2):
        for j in range(5):
            assert phi[i, j] == rule.accept_prob(p[i, j], q[i, j], np.asarray(n[i, j]))
            np.testing.assert_array_equal(g[i, j], rule.residual(p[i, j], q[i, j], np.asarray(n[i, j])))


def test_make_rule():
    assert ct.make_rule("cactus", delta=0.5, divergence="chi2", solver="exact") == Cactus(0.5, "chi2", "exact")
    assert ct.make_rule("sps") == SpS()
    assert set(ct.RULES) == {"sps", "cactus", "tas", "topk", "interpolation", "ears", "sglang", "relaxed", "medusa",
                             "fly"}
    assert set(ROOT_DIVS) == set(F_DIVERGENCES)


@pytest.mark.parametrize("div", ["kl", "reverse_kl", "js"])
def test_bracketing_root_at_the_edges(div):
    """The bracketing solve (no closed form) stays feasible and tight at q_n in {0, tiny, ~1}."""
    q = np.array([0.0, 5e-324, 1e-300, 1e-12, 0.25, 1 - 1e-12, 1.0])
    for delta in (1e-6, 0.1, 2.0):
        g = two_block_root(q, delta, div)
        d = two_block_divergence(g, q, div)
        assert np.all(d <= delta + 1e-12) and np.all((g >= q) & (g <= 1))
        up = np.minimum(g + 1e-9, 1.0)
        loose = (g < 1) & (two_block_divergence(up, q, div) <= delta)
        assert not loose.any(), (q[loose], g[loose])
    g32 = two_block_root(torch.tensor([0.0, 0.3, 1.0], dtype=torch.float32), 0.3, div)
    assert torch.isfinite(g32).all() and g32[2] == 1
