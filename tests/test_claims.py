"""Each claim of the paper (PAPER.md) as its own test, on random and adversarial cases."""

import math

import numpy as np
import pytest
from conftest import cases, deltas
from hypothesis import given, settings
from hypothesis import strategies as st

import cactus_theory as ct
from cactus_theory.divergences import F_DIVERGENCES
from cactus_theory.exact import induced_generic
from cactus_theory.optimize import max_acceptance, solve_target
from cactus_theory.report import SHAPE_TOL, taylor_rate
from cactus_theory.rules import TAS, Cactus, SpS, taylor_gamma, two_block_divergence, two_block_root

THM2_DIVS = ("kl", "reverse_kl", "chi2", "tv", "hellinger", "js")


# -- Theorem 1 -----------------------------------------------------------------------------------
@given(case=cases(max_V=30))
def test_theorem1_generalised_sps_outputs_h(case):
    """Accept n w.p. min(1, h_n/p_n), recover from (h - p)_+: the output law is exactly h (SpS with h
    in the verifier's place), and the acceptance is sum_i min(p_i, h_i) = 1 - TV(p, h)."""
    p, h, _ = case
    np.testing.assert_allclose(induced_generic(SpS(), p, h), h, rtol=0, atol=1e-14)
    assert float(ct.acceptance_rate(SpS(), p, h)) == pytest.approx(1 - float(ct.tv(p, h)), abs=1e-14)


@settings(max_examples=25)
@given(case=cases(max_V=12))
def test_theorem1_acceptance_is_the_coupling_optimum(case):
    p, h, _ = case
    assert max_acceptance(p, h).value == pytest.approx(float(ct.acceptance_rate(SpS(), p, h)), abs=1e-7)


# -- Theorem 2 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("div", THM2_DIVS)
@settings(max_examples=25)
@given(case=cases(max_V=50), delta=deltas)
def test_theorem2_cvxpy_optimum_is_the_two_block_root(div, case, delta):
    p, q, n = case
    res = solve_target(q, n, delta, div)
    gamma = float(two_block_root(np.asarray(q[n]), delta, div))
    assert abs(res.gamma - gamma) <= 1e-6
    h = Cactus(delta, div, "exact").target(p, q, np.asarray(n))
    assert float(ct.divergence(h, q, div)) <= delta + 1e-9  # the two-block h is feasible ...
    if div == "tv" or (q[n] == 0 and div in ("kl", "chi2")):
        return  # ... and optimal; the optimum is not unique here (TV; or h_n forced to 0)
    assert np.abs(res.h - h).max() <= SHAPE_TOL  # ... and the unique optimum (strictly convex f)


# -- Corollary 5 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("q_n", [0.01, 0.1, 0.3, 0.45, 0.7, 0.9])
def test_corollary5_taylor_error_is_first_order(q_n):
    """Expanding the Bernoulli KL to third order, x^2/(2v) - (1-2q) x^3/(6 v^2) = delta with
    v = q(1-q), gives gamma_exact - gamma_taylor = (1 - 2 q_n) delta / 3 + O(delta^1.5): the Taylor
    root converges at rate delta (relative to the O(sqrt delta) boost: sqrt delta)."""
    slope, ratio = taylor_rate(q_n, np.logspace(-7, -4, 7))
    assert slope == pytest.approx(1.0, abs=0.01)
    assert ratio[0] == pytest.approx((1 - 2 * q_n) / 3, rel=0.01)


def test_corollary5_error_at_half_is_higher_order():
    """At q_n = 1/2 the cubic term vanishes and the error falls like delta^1.5."""
    slope, _ = taylor_rate(0.5, np.logspace(-7, -4, 7))
    assert slope == pytest.approx(1.5, abs=0.02)


# -- Corollary 6 and the log(1 + 2 delta) bound --------------------------------------------------
@given(case=cases(max_V=20), delta=st.floats(1e-5, 5.0))
def test_corollary6_small_gamma_keeps_kl_within_delta(case, delta):
    p, q, n = case
    if float(taylor_gamma(np.asarray(q[n]), delta)) > 0.5:  # move to a token where gamma <= 0.5
        cand = np.flatnonzero(taylor_gamma(q, delta) <= 0.5)
        if cand.size == 0:
            return
        n = int(cand[0])
    h = Cactus(delta).target(p, q, np.asarray(n))
    assert float(ct.kl(h, q)) <= delta + 1e-12


def test_corollary6_needs_small_gamma():
    """Beyond gamma = 0.5 the Taylor h can exceed the budget (towards 2 delta), so the condition matters."""
    q_n = np.linspace(0.3, 0.95, 200)
    ratio = two_block_divergence(taylor_gamma(q_n, 0.5), q_n, "kl") / 0.5
    assert ratio.max() > 1.3


@given(q_n=st.one_of(st.floats(0, 1), st.sampled_from([0.0, 1.0, 0.5, 1e-12, 1 - 1e-12])),
       delta=st.floats(1e-6, 10.0))
def test_taylor_kl_below_log_one_plus_two_delta(q_n, delta):
    g = taylor_gamma(np.asarray(q_n), delta)
    assert float(two_block_divergence(g, np.asarray(q_n), "kl")) <= math.log1p(2 * delta) + 1e-12


@given(case=cases(max_V=20), delta=st.floats(1e-5, 2.0))
def test_unclipped_taylor_has_chi2_two_delta(case, delta):
    p, q, n = case
    q_n = q[n]
    if not (0 < q_n < 1) or q_n + math.sqrt(2 * delta * q_n * (1 - q_n)) > 1:
        assert float(ct.chi2(Cactus(delta).target(p, q, np.asarray(n)), q)) <= 2 * delta + 1e-12
        return
    h = Cactus(delta).target(p, q, np.asarray(n))
    assert float(ct.chi2(h, q)) == pytest.approx(2 * delta, rel=1e-9)


# -- Theorem 3 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("div", sorted(F_DIVERGENCES))
@given(case=cases(max_V=40), delta=deltas)
def test_theorem3_law_no_farther_than_draft(div, case, delta):
    p, q, _ = case
    rules = [Cactus(delta, div, "exact")] + ([Cactus(delta)] if div == "kl" else [])
    bound = float(F_DIVERGENCES[div](p, q))
    for rule in rules:
        d = float(F_DIVERGENCES[div](ct.induced_distribution(rule, p, q), q))
        assert d <= bound + 1e-10


def test_theorem3_remark_kl_far_above_delta():
    """PAPER.md: V = 1000, Dirichlet(0.3), delta = 0.05 gives KL(h_alg || q) about 1.0 nats."""
    rng = np.random.default_rng(0)
    for _ in range(3):
        p, q = rng.dirichlet(np.full(1000, 0.3)), rng.dirichlet(np.full(1000, 0.3))
        d = float(ct.kl(ct.induced_distribution(Cactus(0.05), p, q), q))
        assert 0.7 < d < 1.4 and d > 10 * 0.05
        assert d <= float(ct.kl(p, q))


# -- Proposition 4 -------------------------------------------------------------------------------
@given(case=cases(max_V=30), eps=st.floats(0.01, 0.6), alpha=st.floats(0.05, 1.0))
def test_proposition4_tas_region_is_a_cross_entropy_threshold(case, eps, alpha):
    p, q, _ = case
    rule = TAS(eps, alpha)
    accept = rule.accept_prob_all(np.full_like(q, 1 / q.size), q) == 1
    with np.errstate(divide="ignore"):
        ce = ct.cross_entropy(np.eye(q.size), np.broadcast_to(q, (q.size, q.size)))  # H(e_n, q)
    np.testing.assert_array_equal(accept, ce < rule.cross_entropy_threshold(q))
    thr = max(-math.log(eps), float(ct.entropy(q)) - math.log(alpha))
    assert float(rule.cross_entropy_threshold(q)) == pytest.approx(thr, rel=1e-12)


# -- the worked example --------------------------------------------------------------------------
def test_worked_example():
    p, q, n = np.array([0.05, 0.80, 0.15]), np.array([0.30, 0.35, 0.35]), np.asarray(1)
    assert float(SpS().accept_prob(p, q, n)) == pytest.approx(0.4375, abs=1e-15)
    rule = Cactus(0.21)
    h = rule.target(p, q, n)
    np.testing.assert_allclose(h, [0.16, 0.66, 0.18], atol=0.005)  # the paper's rounding
    assert float(rule.accept_prob(p, q, n)) == pytest.approx(0.825, abs=0.0015)
    assert float(ct.kl(h, q)) == pytest.approx(0.198, abs=0.0015)
    # delta chosen so the acceptance is exactly .825: gamma = .66, delta = .31^2 / (2 .35 .65)
    d = 0.31**2 / (2 * 0.35 * 0.65)
    assert float(Cactus(d).accept_prob(p, q, n)) == pytest.approx(0.825, abs=1e-12)
    assert d == pytest.approx(0.21, abs=0.002)


@pytest.mark.parametrize("div", THM2_DIVS)
@pytest.mark.parametrize("kind", ["random", "tiny_qn", "zeros_in_q"])
def test_theorem2_at_fifty_tokens(div, kind):
    from cactus_theory.report import make_pair

    rng = np.random.default_rng(50)
    for delta in (0.01, 0.3):
        p, q, n = make_pair(kind, 50, rng)
        res = solve_target(q, n, delta, div)
        assert abs(res.gamma - float(two_block_root(np.asarray(q[n]), delta, div))) <= 1e-6
