"""Exact one-step laws: fast path vs generic path vs a per-token loop; batching; acceptance rate."""

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import cactus_theory as ct
from cactus_theory.exact import induced_generic, induced_scaling, step_divergence
from cactus_theory.rules import EARS, TAS, Cactus, Interpolation, SpS, TopK
from cactus_theory.theory.cases import CASE_KINDS, make_pair
from tests.helpers import cases

SCALING = [SpS(), Cactus(0.05), Cactus(0.5), Cactus(3.0), *(Cactus(0.3, d, "exact") for d in
           ("kl", "reverse_kl", "chi2", "tv", "hellinger", "js"))]
OTHERS = [TAS(), TopK(2), Interpolation(0.3), EARS(0.4)]


def _loop_law(rule, p, q):
    """Reference: h_alg = sum_n p_n [phi_n e_n + (1 - phi_n) g_n], one drafted token at a time."""
    out = np.zeros_like(p)
    for n in range(p.size):
        if p[n] == 0:
            continue
        phi = float(rule.accept_prob(p, q, np.asarray(n)))
        out[n] += p[n] * phi
        if phi < 1:
            out += p[n] * (1 - phi) * rule.residual(p, q, np.asarray(n))
    return out


@given(case=cases(max_V=12), rule=st.sampled_from(SCALING + OTHERS))
def test_generic_equals_per_token_loop(case, rule):
    p, q, _ = case
    np.testing.assert_allclose(induced_generic(rule, p, q), _loop_law(rule, p, q), rtol=0, atol=1e-14)


@given(case=cases(max_V=40), rule=st.sampled_from(SCALING))
def test_fast_equals_generic(case, rule):
    p, q, _ = case
    fast, gen = induced_scaling(rule, p, q), induced_generic(rule, p, q)
    assert np.abs(fast - gen).max() <= 1e-12


@pytest.mark.parametrize("kind", CASE_KINDS)
@pytest.mark.parametrize("V", [150, 400])
def test_fast_equals_generic_large_vocab(kind, V):
    rng = np.random.default_rng(V)
    p, q, _ = make_pair(kind, V, rng)
    for rule in (SpS(), Cactus(0.2), Cactus(1.0, "hellinger", "exact")):
        assert np.abs(induced_scaling(rule, p, q) - induced_generic(rule, p, q)).max() <= 1e-12


@given(case=cases(max_V=20), rule=st.sampled_from(SCALING + OTHERS))
def test_law_is_a_distribution_and_mass_accounting(case, rule):
    p, q, _ = case
    h = ct.induced_distribution(rule, p, q)
    assert h.min() >= 0 and h.sum() == pytest.approx(1.0, abs=1e-12)
    # accepted mass alone never exceeds the law: h_alg(y) >= p_y phi_y
    assert np.all(h >= p * rule.accept_prob_all(p, q) - 1e-15)
    assert float(ct.acceptance_rate(rule, p, q)) == pytest.approx(float(np.sum(p * rule.accept_prob_all(p, q))))


def test_chunking_does_not_change_the_law():
    rng = np.random.default_rng(2)
    p, q = rng.dirichlet(np.ones(50)), rng.dirichlet(np.full(50, 0.3))
    for rule in (Cactus(0.4), TAS(), EARS(0.2)):
        np.testing.assert_allclose(induced_generic(rule, p, q, chunk_elements=7), induced_generic(rule, p, q),
                                   rtol=0, atol=1e-15)


@pytest.mark.parametrize("rule", SCALING[:3] + OTHERS, ids=repr)
def test_batched_law_equals_rows(rule):
    rng = np.random.default_rng(4)
    p, q = rng.dirichlet(np.ones(8), size=(2, 3)), rng.dirichlet(np.full(8, 0.4), size=(2, 3))
    h = ct.induced_distribution(rule, p, q)
    assert h.shape == (2, 3, 8)
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(h[i, j], ct.induced_distribution(rule, p[i, j], q[i, j]), atol=1e-15)
    np.testing.assert_allclose(ct.acceptance_rate(rule, p, q), np.sum(p * rule.accept_prob_all(p, q), -1))


@given(case=cases(max_V=20))
def test_target_rules_output_their_target(case):
    """SpS outputs q and Interpolation outputs alpha p + (1 - alpha) q exactly (targets free of n)."""
    p, q, _ = case
    np.testing.assert_allclose(ct.induced_distribution(SpS(), p, q), q, atol=1e-14)
    np.testing.assert_allclose(ct.induced_distribution(Interpolation(0.35), p, q), 0.35 * p + 0.65 * q, atol=1e-14)


def test_step_divergence_and_methods():
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.ones(30)), rng.dirichlet(np.ones(30))
    rule = Cactus(0.5)
    h = ct.induced_distribution(rule, p, q, method="generic")
    assert float(step_divergence(rule, p, q, "hellinger")) == pytest.approx(float(ct.hellinger(h, q)), abs=1e-14)
    assert float(step_divergence(SpS(), p, q)) == pytest.approx(0.0, abs=1e-14)
    with pytest.raises(ValueError, match="method"):
        ct.induced_distribution(rule, p, q, method="slow")
    with pytest.raises(ValueError, match="two-block"):
        induced_scaling(TAS(), p, q)


def test_fast_path_at_qwen_vocab():
    V = 151_936
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.full(V, 0.05)), rng.dirichlet(np.full(V, 0.05))
    h = ct.induced_distribution(Cactus(0.5), p, q)
    assert h.shape == (V,) and h.min() >= 0 and h.sum() == pytest.approx(1.0, abs=1e-10)
    # the Theorem 3 bound at full vocabulary size
    assert float(ct.kl(h, q)) <= float(ct.kl(p, q))


def test_auto_method_sums_an_overridden_residual():
    """A two-block rule whose recovery is overridden (the known wrong port: accept with h, recover
    with (q - p)_+) must not take the fast path, which would silently return the correct law."""
    @dataclass(frozen=True)
    class WrongRecovery(Cactus):
        def residual(self, p, q, n, *, check=True):
            return SpS().residual(p, q, n, check=check)

    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(12)), rng.dirichlet(np.ones(12))
    wrong = WrongRecovery(0.02)
    h_auto = ct.induced_distribution(wrong, p, q)
    np.testing.assert_allclose(h_auto, induced_generic(wrong, p, q), atol=1e-15)
    assert np.abs(h_auto - induced_scaling(Cactus(0.02), p, q)).max() > 1e-3
