"""Acceptance rules: conventions, roots, delta = 0, batching and numpy / torch parity."""

import numpy as np
import pytest
import torch
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
from cactus_theory.theory.reference import COVERED as REFERENCE_COVERED
from tests.helpers import cases, deltas, fitted

ROOT_DIVS = ("kl", "reverse_kl", "chi2", "tv", "hellinger", "js")
ALL_RULES = [
    SpS(), Cactus(0.3), Cactus(1.0), *(Cactus(0.2, d, "exact") for d in ROOT_DIVS),
    TAS(), TAS(0.2, 0.5), TAS(entropy_eps=1e-5), TopK(1), TopK(3), TopK(2, recovery="topk"), Interpolation(0.4),
    EARS(0.3),
    ct.SGLangThreshold(0.6, 0.3), ct.RelaxedAcceptance(3, 0.2), ct.MedusaTypical(), ct.FLy(0.3, 3, 0.5),
]
rules = st.sampled_from(ALL_RULES)


@given(case=cases(max_V=15), rule=rules)
def test_outputs_are_probabilities(case, rule):
    p, q, n = case
    rule = fitted(rule, p.size)
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
    rule = fitted(rule, p.size)
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
    assert set(ct.RULE_CLASSES) == {"sps", "cactus", "tas", "topk", "interpolation", "ears", "sglang", "relaxed", "medusa",
                             "fly", "dropmatch", "sequence_budget"}
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


# -- the references, by name ---------------------------------------------------------------------
@pytest.mark.parametrize("rule", [r for r in ALL_RULES if type(r).__name__ in REFERENCE_COVERED], ids=repr)  # the paper's
@given(case=cases(max_V=12))
def test_rules_match_the_independent_reference(rule, case):
    """phi_n, g_n and the one-step law equal reference.py's re-implementation from the formulas
    (scipy root and entropy, plain numpy), on every case kind including TAS and top-k near-ties."""
    from cactus_theory.theory.reference import reference_law, reference_step

    p, q, n = case
    rule = fitted(rule, p.size)
    phi_ref, g_ref = reference_step(rule, p, q, n)
    assert float(rule.accept_prob(p, q, np.asarray(n))) == pytest.approx(phi_ref, abs=1e-12)
    np.testing.assert_allclose(rule.residual(p, q, np.asarray(n)), g_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ct.induced_distribution(rule, p, q), reference_law(rule, p, q), rtol=0, atol=1e-12)


def test_topk_authors_recovery_emits_argmax_at_k1():
    """The authors' top-k recovers from (1[q >= q_(k)] - p)_+: with k = 1 every step emits argmax q.
    Numbers worked by hand: p = (.2, .5, .3), q = (.5, .1, .4): token 0 is accepted w.p. .2 (q_0 is the
    largest), tokens 1 and 2 are rejected and recover to e_0; recovering from q instead gives
    .2 e_0 + .8 q = (.6, .08, .32)."""
    p, q = np.array([0.2, 0.5, 0.3]), np.array([0.5, 0.1, 0.4])
    np.testing.assert_allclose(ct.induced_distribution(TopK(1, recovery="topk"), p, q), [1, 0, 0], atol=1e-15)
    np.testing.assert_allclose(ct.induced_distribution(TopK(1), p, q), [0.6, 0.08, 0.32], atol=1e-15)
    # the recovery mass goes to top-k tokens the draft under-weights: k = 2 keeps {0, 2}, (1 - p)_+ = (.8, 0, .7)
    np.testing.assert_allclose(TopK(2, recovery="topk").residual(p, q, np.asarray(1)), [0.8 / 1.5, 0, 0.7 / 1.5])
    with pytest.raises(ValueError, match="^recovery must be one of"):
        TopK(2, recovery="argmax")


def test_tas_entropy_eps_is_vllms_formula():
    """vLLM: H = -sum q log(q + 1e-5). On a spread-out row it is smaller than the exact entropy, so the
    threshold alpha exp(-H) is larger and a token accepted under the exact entropy can be rejected."""
    V = 5000
    q = np.full(V, 1.0 / V)
    exact, vllm = TAS(epsilon=0.9, alpha=1.0), TAS(epsilon=0.9, alpha=1.0, entropy_eps=1e-5)
    H_vllm = -np.sum(q * np.log(q + 1e-5))  # written out: 5000 * (1/5000) * -log(2e-4 + 1e-5)
    assert float(vllm.entropy(q)) == pytest.approx(-np.log(1.0 / V + 1e-5), rel=1e-12)
    assert float(vllm.entropy(q)) == pytest.approx(H_vllm, rel=1e-12)
    assert float(exact.entropy(q)) == pytest.approx(np.log(V), rel=1e-12)
    # q_n = 1/V sits between the two thresholds exp(-log V) = 1/V (exact) and 1/V + 1e-5 (vLLM)
    q2 = q.copy()
    q2[0] += 5e-6
    q2[1:] -= 5e-6 / (V - 1)
    p = np.full(V, 1.0 / V)
    assert float(exact.accept_prob(p, q2, np.asarray(0))) == 1.0
    assert float(vllm.accept_prob(p, q2, np.asarray(0))) == 0.0
    assert TAS(entropy_eps=0.0) == TAS()  # the default is the exact entropy


def test_tas_is_strict_and_topk_inclusive_at_exact_ties():
    """vLLM accepts iff q_n > threshold (a tie is rejected); top-k accepts q_n >= q_(k) (a tie is kept)."""
    q = np.array([0.09, 0.91])  # H(q) small: alpha exp(-H) = 0.3 * 0.74 > 0.09, so the threshold is 0.09
    p = np.array([0.5, 0.5])
    assert float(TAS().accept_prob(p, q, np.asarray(0))) == 0.0
    assert float(TAS().accept_prob(p, np.array([0.09 + 1e-12, 0.91 - 1e-12]), np.asarray(0))) == 1.0
    q = np.array([0.3, 0.3, 0.3, 0.1])
    assert ct.TopK(1).accept_prob_all(np.full(4, 0.25), q).tolist() == [1, 1, 1, 0]
    tq = torch.tensor(q)
    assert ct.TopK(1).accept_prob_all(torch.full((4,), 0.25, dtype=torch.float64), tq).tolist() == [1, 1, 1, 0]


def test_topk_k_larger_than_vocabulary_is_refused():
    with pytest.raises(ValueError, match=r"^k must be <= the vocabulary size V = 3, got k = 1000000"):
        TopK(10**6).accept_prob(np.full(3, 1 / 3), np.full(3, 1 / 3), np.asarray(0))
    with pytest.raises(ValueError, match="^k must be an integer >= 1, got True"):
        TopK(True)


# -- no NaN, no invalid token, at the extremes of every dtype -----------------------------------
HUGE = [1e308, 3.4e38, 1.7e38, 7e4, 1e5]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("big", HUGE)
def test_huge_budgets_stay_finite_in_every_dtype(dtype, big):
    """delta (or beta) beyond the dtype's range: 2 delta q (1 - q) used to overflow to inf and meet
    q = 0 (inf * 0 = NaN). Now gamma = 1 wherever 0 < q_n, and q_n where q_n is 0 or 1."""
    q = torch.tensor([0.0, 1e-3, 0.25, 0.7, 1.0], dtype=dtype)
    for rule in [Cactus(big), *(Cactus(big, d, "exact") for d in ROOT_DIVS)]:
        g = rule.gamma(q)
        assert torch.isfinite(g).all(), (rule, g)
        want = torch.tensor([0.0, 1, 1, 1, 1], dtype=dtype)
        if rule.divergence in ("kl", "chi2"):  # gamma can't leave q_n = 0 under KL / chi-square
            assert torch.equal(g, want), (rule, g)
        else:  # reverse KL never reaches gamma = 1 (KL(q || e_n) = inf), the others do
            assert torch.all(g[1:] >= 1 - max(1e-6, torch.finfo(dtype).eps)) and torch.all(g >= q), (rule, g)
    rows = torch.tensor([[0.0, 0.2, 0.8], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], dtype=dtype)
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.3, 0.3, 0.4]], dtype=dtype)
    n = torch.tensor([0, 2, 1])  # q_n = 0 in every row
    for rule in (Cactus(big), Cactus(big, "chi2", "exact"), EARS(big)):
        phi = rule.accept_prob(p, rows, n)
        g = rule.residual(p, rows, n)
        assert torch.isfinite(phi).all() and ((phi >= 0) & (phi <= 1)).all(), (rule, phi)
        assert torch.isfinite(g).all() and torch.allclose(g.double().sum(-1), torch.ones(3, dtype=torch.float64),
                                                          atol=1e-2), (rule, g)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_verify_never_returns_an_invalid_token_at_huge_delta(dtype):
    """The reported failure: Cactus(1e308) on a row with q_n = 0 returned token id V."""
    from cactus_theory.sampler import verify

    V = 4
    draft = torch.tensor([[0, 1], [2, 3]])
    P = torch.full((2, 2, V), 1 / V, dtype=dtype)
    Q = torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 3, dtype=dtype).expand(2, 3, V).clone()
    for big in (1e308, 3.4e38):
        tokens, acc = verify(draft, P, Q, Cactus(big), generator=torch.Generator().manual_seed(0))
        emitted = tokens[tokens >= 0]
        assert emitted.max() < V and emitted.min() >= 0
        # every drafted token with q_n = 0 is rejected and the recovery emits a token with q > 0
        last = tokens.gather(1, acc.unsqueeze(1)).squeeze(1)
        assert bool((Q[0, 0, last] > 0).all()), tokens


def test_numpy_extremes_match_the_reference():
    """float64 numpy at huge budgets: the law equals the reference (gamma = 1 wherever q_n > 0)."""
    from cactus_theory.theory.reference import reference_law

    p, q = np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.0, 0.6, 0.4, 0.0])
    for rule in (Cactus(1e308), Cactus(1e308, "chi2", "exact"), Cactus(1e308, "js", "exact"), EARS(1e308)):
        law = ct.induced_distribution(rule, p, q)
        assert np.all(np.isfinite(law)) and law.sum() == pytest.approx(1, abs=1e-12)
        np.testing.assert_allclose(law, reference_law(rule, p, q), atol=1e-12)
