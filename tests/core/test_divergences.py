"""Divergences: values against independent formulas, zero conventions, batching, torch parity."""

import numpy as np
import pytest
import torch
from hypothesis import given
from scipy.spatial.distance import jensenshannon
from scipy.special import rel_entr

import cactus_theory as ct
from cactus_theory.divergences import DIVERGENCES, F_DIVERGENCES
from tests.helpers import cases

# generators f with D_f(h || q) = sum_{q_i > 0} q_i f(h_i / q_i) + (mass of h where q = 0) * f'(inf)
GENERATORS = {
    "kl": (lambda t: np.where(t > 0, t * np.log(np.where(t > 0, t, 1)), 0.0), np.inf),
    "reverse_kl": (lambda t: -np.log(t), 0.0),
    "chi2": (lambda t: (t - 1) ** 2, np.inf),
    "tv": (lambda t: np.abs(t - 1) / 2, 0.5),
    "hellinger": (lambda t: (np.sqrt(t) - 1) ** 2 / 2, 0.5),
    "js": (lambda t: (t * np.log(np.where(t > 0, 2 * t / (1 + t), 1)) + np.log(2 / (1 + t))) / 2,
           np.log(2) / 2),
}


def _f_divergence(name, h, q):
    f, slope = GENERATORS[name]
    pos = q > 0
    with np.errstate(divide="ignore"):
        body = np.sum(q[pos] * f(h[pos] / q[pos]))
    extra = h[~pos].sum()
    return body + (extra * slope if extra > 0 else 0.0)


@pytest.mark.parametrize("name", sorted(F_DIVERGENCES))
@given(case=cases(max_V=20))
def test_generator_form(name, case):
    p, q, _ = case
    want = _f_divergence(name, p, q)
    got = float(ct.divergence(p, q, name))
    if np.isinf(want):
        assert np.isinf(got) and got > 0
    else:
        assert got == pytest.approx(want, rel=1e-10, abs=1e-12)


@given(case=cases(max_V=30))
def test_against_scipy(case):
    p, q, _ = case
    assert float(ct.kl(p, q)) == pytest.approx(float(np.sum(rel_entr(p, q))), rel=1e-12, abs=1e-14)
    assert float(ct.reverse_kl(p, q)) == pytest.approx(float(np.sum(rel_entr(q, p))), rel=1e-12, abs=1e-14)
    assert float(ct.js(p, q)) == pytest.approx(jensenshannon(p, q) ** 2, rel=1e-9, abs=1e-12)
    assert float(ct.tv(p, q)) == pytest.approx(0.5 * np.abs(p - q).sum(), abs=1e-15)


@pytest.mark.parametrize("name", sorted(F_DIVERGENCES))
@given(case=cases(max_V=20))
def test_nonnegative_and_zero_iff_equal(name, case):
    p, q, _ = case
    assert float(ct.divergence(q, q, name)) == pytest.approx(0.0, abs=1e-15)
    d = float(ct.divergence(p, q, name))
    assert d >= -1e-15
    if np.abs(p - q).max() > 1e-3:
        assert d > 0


def test_zero_conventions():
    h = np.array([0.5, 0.5, 0.0])
    q = np.array([0.5, 0.0, 0.5])
    assert ct.kl(h, h) == 0.0  # 0 log 0 = 0
    assert np.isinf(ct.kl(h, q)) and np.isinf(ct.chi2(h, q))
    assert np.isinf(ct.reverse_kl(h, q))  # q_3 > 0 = h_3
    assert ct.reverse_kl(np.array([0.5, 0.5, 0.0]), np.array([1.0, 0.0, 0.0])) == pytest.approx(np.log(2))
    assert ct.tv(h, q) == pytest.approx(0.5)
    assert ct.hellinger(h, q) == pytest.approx(0.5)
    assert ct.js(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(np.log(2))
    assert ct.cross_entropy(np.array([0.0, 1.0]), np.array([0.0, 1.0])) == 0.0
    assert np.isinf(ct.cross_entropy(np.array([1.0, 0.0]), np.array([0.0, 1.0])))


@given(case=cases(max_V=20))
def test_cross_entropy_identities(case):
    p, q, n = case
    ce = float(ct.cross_entropy(p, q))
    kl = float(ct.kl(p, q))
    if np.isfinite(kl):
        assert ce == pytest.approx(kl + float(ct.entropy(p)), rel=1e-10, abs=1e-12)
    e = np.eye(q.size)[n]
    with np.errstate(divide="ignore"):
        assert float(ct.cross_entropy(e, q)) == pytest.approx(-np.log(q[n]))


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_batching_matches_rows(name):
    rng = np.random.default_rng(0)
    h = rng.dirichlet(np.ones(7), size=(3, 4))
    q = rng.dirichlet(np.full(7, 0.5), size=(3, 4))
    out = ct.divergence(h, q, name)
    assert out.shape == (3, 4)
    rows = np.array([[float(ct.divergence(h[i, j], q[i, j], name)) for j in range(4)] for i in range(3)])
    np.testing.assert_allclose(out, rows, rtol=1e-13, atol=0)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
@given(case=cases(max_V=15))
def test_torch_matches_numpy(name, case):
    p, q, _ = case
    a = ct.divergence(p, q, name)
    b = ct.divergence(torch.from_numpy(p), torch.from_numpy(q), name).numpy()
    np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15)


def test_ranges():
    rng = np.random.default_rng(1)
    h, q = rng.dirichlet(np.full(9, 0.2), size=50), rng.dirichlet(np.full(9, 0.2), size=50)
    assert np.all(ct.tv(h, q) <= 1) and np.all(ct.hellinger(h, q) <= 1 + 1e-15)
    assert np.all(ct.js(h, q) <= np.log(2) + 1e-15)
    # Pinsker TV^2 <= KL/2; squared Hellinger <= TV
    assert np.all(ct.tv(h, q) ** 2 <= ct.kl(h, q) / 2 + 1e-15)
    assert np.all(ct.hellinger(h, q) <= ct.tv(h, q) + 1e-15)


def test_kl_is_never_negative_after_rounding():
    """SpS's exact step law equals q up to rounding; the raw sum h log(h / q) then comes out a few ulps
    negative in about half the rows (it printed as -1.1e-17 in the main table). KL is clipped at 0."""
    from cactus_theory.core._array import xlogy

    rng = np.random.default_rng(0)
    P, Q = rng.dirichlet(np.ones(50), size=400), rng.dirichlet(np.ones(50), size=400)
    H = ct.induced_distribution(ct.SpS(), P, Q)
    raw = np.sum(xlogy(H, H) - xlogy(H, Q), -1)
    assert (raw < 0).sum() > 50  # the rounding this guards against does happen
    k = ct.kl(H, Q)
    assert np.all(k >= 0) and k.max() < 1e-13
    assert float(ct.step_divergence(ct.SpS(), P[0], Q[0])) >= 0
