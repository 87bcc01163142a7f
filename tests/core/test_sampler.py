"""sampler.verify: its one-step law matches induced_distribution for every rule, determinism,
dtypes, validation, and edge cases.

Statistical tests: per-test level ALPHA = 1e-4 with fixed seeds, so the suite is deterministic;
were the seeds redrawn, each true-null test would fail with probability ~1e-4 (8 such tests
here: ~1e-3 for the file). Sample sizes come from ``stats.samples_needed`` so that any law at TV
distance >= 0.01 from the exact one is rejected with probability >= 1 - BETA = 0.999.
"""

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.sampler import sample_rows, verify
from cactus_theory.stats import samples_needed
from cactus_theory.toy import one_step_test

ALPHA, BETA, EPS = 1e-4, 1e-3, 0.01
V = 8

RULES = [
    ct.SpS(),
    ct.Cactus(0.1),
    ct.Cactus(0.02, divergence="hellinger", solver="exact"),
    ct.TAS(epsilon=0.09, alpha=0.3),
    ct.TopK(3),
    ct.Interpolation(0.4),
    ct.EARS(0.3),
]


def random_rows(k: int, V: int, seed: int, concentration: float = 0.7):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, concentration), size=k), rng.dirichlet(np.full(V, concentration), size=k + 1)


def adversarial_rows(k: int, V: int, seed: int):
    """Draft zeros where the verifier has mass and the reverse (disjoint parts of the support)."""
    p, q = random_rows(k, V, seed)
    p[:, :2] = 0
    q[:, 2:4] = 0
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)


N_ONE_STEP = samples_needed(EPS, categories=V, alpha=ALPHA, beta=BETA)


@pytest.mark.parametrize("rows", ["random", "adversarial"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: repr(r))
def test_one_step_law_matches_induced_distribution(rule, rows):
    p, q = random_rows(2, V, 11) if rows == "random" else adversarial_rows(2, V, 12)
    # both paths (acceptance and recovery) carry real mass, so the test exercises both
    assert 0.05 < ct.acceptance_rate(rule, p[0], q[0]) < 0.95
    res = one_step_test(rule, p, q, num_samples=N_ONE_STEP, seed=5, alpha=ALPHA)
    assert res.n == N_ONE_STEP and res.method == "asymptotic-chi2"
    assert not res.reject, res


def test_one_step_law_v2_k1():
    p, q = np.array([[0.8, 0.2]]), np.array([[0.3, 0.7], [0.5, 0.5]])
    N = samples_needed(EPS, categories=2, alpha=ALPHA, beta=BETA)
    for rule in (ct.SpS(), ct.Cactus(0.2)):
        assert not one_step_test(rule, p, q, num_samples=N, seed=1, alpha=ALPHA).reject


def test_acceptance_rate_matches_exact():
    """Mean accepted count at k = 1 estimates acceptance_rate; 5 standard errors is ~6e-7 two-sided."""
    p, q = random_rows(1, V, 3)
    B = 200_000
    P = torch.from_numpy(p).expand(B, 1, V)
    Q = torch.from_numpy(q).expand(B, 2, V)
    g = torch.Generator().manual_seed(0)
    n = sample_rows(P[:, 0], torch.rand(B, generator=g, dtype=torch.float64))[:, None]
    for rule in RULES:
        _, na = verify(n, P, Q, rule, generator=g)
        a = float(ct.acceptance_rate(rule, p[0], q[0]))
        assert abs(na.double().mean().item() - a) <= 5 * np.sqrt(a * (1 - a) / B) + 1e-12, rule


def _batch(B, k, V, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(2 * torch.randn(B, k, V, generator=g, dtype=torch.float64), -1)
    Q = torch.softmax(2 * torch.randn(B, k + 1, V, generator=g, dtype=torch.float64), -1)
    n = torch.multinomial(P.reshape(-1, V), 1, generator=g).reshape(B, k)
    return n, P.to(dtype), Q.to(dtype)


def test_output_layout():
    n, P, Q = _batch(64, 4, 50, 0)
    tokens, na = verify(n, P, Q, ct.Cactus(0.3), generator=torch.Generator().manual_seed(1))
    assert tokens.shape == (64, 5) and tokens.dtype == torch.int64 and na.dtype == torch.int64
    assert 0 < na.sum() < 64 * 4  # both outcomes occur in this batch
    for b in range(64):
        a = int(na[b])
        assert torch.equal(tokens[b, :a], n[b, :a])
        assert 0 <= tokens[b, a] < 50
        assert (tokens[b, a + 1:] == -1).all()


def test_seeded_determinism():
    n, P, Q = _batch(32, 4, 100, 1)
    for rule in RULES:
        a = verify(n, P, Q, rule, generator=torch.Generator().manual_seed(7))
        b = verify(n, P, Q, rule, generator=torch.Generator().manual_seed(7))
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c = verify(n, P, Q, ct.SpS(), generator=torch.Generator().manual_seed(8))
    d = verify(n, P, Q, ct.SpS(), generator=torch.Generator().manual_seed(7))
    assert not torch.equal(c[0], d[0])


def test_check_false_gives_same_result():
    n, P, Q = _batch(16, 3, 30, 2)
    a = verify(n, P, Q, ct.TAS(), generator=torch.Generator().manual_seed(3))
    b = verify(n, P, Q, ct.TAS(), generator=torch.Generator().manual_seed(3), check=False)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_computed_in_float32(dtype):
    n, P, Q = _batch(64, 4, 200, 3, dtype=dtype)
    for rule in (ct.Cactus(0.5), ct.TAS(), ct.EARS(0.2)):
        a = verify(n, P, Q, rule, generator=torch.Generator().manual_seed(4))
        # the upcast rows carry float16 rounding (> the float32 tolerance): skip validation there
        b = verify(n, P.float(), Q.float(), rule, generator=torch.Generator().manual_seed(4), check=False)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_b1_k1_v2():
    n = torch.tensor([[1]])
    P = torch.tensor([[[0.4, 0.6]]])
    Q = torch.tensor([[[0.9, 0.1], [0.5, 0.5]]])
    seen = set()
    for s in range(200):
        tokens, na = verify(n, P, Q, ct.SpS(), generator=torch.Generator().manual_seed(s))
        assert tokens.shape == (1, 2) and na.shape == (1,)
        seen.add((int(na), *tokens[0].tolist()))
    # accepted (prob 1/6) -> bonus 0 or 1; rejected -> recovery (q - p)_+ = e_0, then padding
    assert seen == {(1, 1, 0), (1, 1, 1), (0, 0, -1)}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: repr(r))
def test_draft_token_with_zero_draft_probability_is_never_accepted(rule):
    B, k, V = 500, 3, 5
    P = torch.full((B, k, V), 0.25, dtype=torch.float64)
    P[..., 0] = 0
    Q = torch.zeros((B, k + 1, V), dtype=torch.float64)
    Q[..., 0] = 1  # the verifier wants exactly the token the draft cannot produce
    n = torch.zeros((B, k), dtype=torch.int64)
    tokens, na = verify(n, P, Q, rule, generator=torch.Generator().manual_seed(0))
    assert (na == 0).all()
    assert ((tokens[:, 0] >= 0) & (tokens[:, 0] < V)).all()


@pytest.mark.parametrize("rule", [ct.SpS(), ct.Cactus(0.5), ct.Cactus(0.1, "hellinger", "exact")], ids=repr)
def test_verifier_certain_of_draft_token_always_accepts(rule):
    """q_n = 1: gamma = 1 >= p_n, so every draft is accepted and the bonus comes from row k."""
    B, k, V = 300, 3, 6
    g = torch.Generator().manual_seed(1)
    P = torch.softmax(torch.randn(B, k, V, generator=g), -1)
    n = torch.multinomial(P.reshape(-1, V), 1, generator=g).reshape(B, k)
    Q = torch.zeros(B, k + 1, V)
    Q[:, :k].scatter_(-1, n.unsqueeze(-1), 1.0)
    Q[:, k, 4] = 1.0
    tokens, na = verify(n, P, Q, rule, generator=g)
    assert (na == k).all()
    assert torch.equal(tokens[:, :k], n) and (tokens[:, k] == 4).all()


@pytest.mark.parametrize("rule", RULES, ids=lambda r: repr(r))
def test_one_hot_rows_emit_only_possible_tokens(rule):
    """One-hot p at 2 and one-hot q at 5 (k = 1): the output lies in the exact law's support, is
    deterministic where that law is, and is q's token for SpS, Cactus-KL, TAS and EARS (which
    never accept where q_n = 0; TopK(3) ties at 0, Interpolation and Cactus-Hellinger may keep 2)."""
    B, V = 400, 7
    P = torch.zeros(B, 1, V, dtype=torch.float64)
    P[..., 2] = 1
    Q = torch.zeros(B, 2, V, dtype=torch.float64)
    Q[:, 0, 5] = 1
    Q[:, 1, 3] = 1
    n = torch.full((B, 1), 2)
    tokens, na = verify(n, P, Q, rule, generator=torch.Generator().manual_seed(2))
    law = ct.induced_distribution(rule, P[0, 0].numpy(), Q[0, 0].numpy())
    assert (law[tokens[:, 0].numpy()] > 0).all()
    assert set(tokens[na == 1, 1].tolist()) <= {3}
    if law.max() == 1:
        assert (tokens[:, 0] == int(law.argmax())).all()
    else:
        assert set(tokens[:, 0].tolist()) == {2, 5}
    if isinstance(rule, (ct.SpS, ct.TAS, ct.EARS)) or getattr(rule, "divergence", None) == "kl":
        assert (tokens[:, 0] == 5).all() and (na == 0).all()


def test_sample_rows_never_returns_zero_mass():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 4 + [[0.0, 0.0, 0.0, 0.0, 1.0]])
    u = torch.tensor([0.0, 0.4999999, 0.5, 1 - 1e-16, 0.3], dtype=torch.float64)
    assert sample_rows(probs, u).tolist() == [1, 1, 3, 3, 4]


def _poke(x, value, balance=None):
    """Copy of ``x`` with entry [-1, -1, 0] set to ``value`` (and [-1, -1, 1] raised by ``balance``)."""
    x = x.clone()
    if balance is not None:
        x[-1, -1, 1] += x[-1, -1, 0] + balance
    x[-1, -1, 0] = value
    return x


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda n, P, Q: (n[:, :2], P, Q), "draft_probs must have shape"),
        (lambda n, P, Q: (n, P, Q[:, :3]), "verifier_probs must have shape"),
        (lambda n, P, Q: (n + 100, P, Q), "draft_tokens has token ids out of range"),
        (lambda n, P, Q: (n.float(), P, Q), "draft_tokens must hold integer"),
        (lambda n, P, Q: (n, P * 1.01, Q), "draft_probs is not normalised"),
        (lambda n, P, Q: (n, P, torch.where(Q > 0.05, Q, torch.nan)), "verifier_probs contains NaN"),
        (lambda n, P, Q: (n, P, _poke(Q, torch.inf)), "verifier_probs contains NaN or infinite"),
        (lambda n, P, Q: (n, _poke(P, -torch.inf), Q), "draft_probs contains NaN or infinite"),
        # a negative entry balanced by a positive one: every row still sums to 1
        (lambda n, P, Q: (n, _poke(P, -0.01, 0.01), Q), "draft_probs has a negative probability"),
        (lambda n, P, Q: (n, P.half(), (Q * 1.05).half()), "verifier_probs is not normalised.*tolerance 0.01"),
        (lambda n, P, Q: (n[0], P, Q), "draft_tokens must have shape"),
        (lambda n, P, Q: (n[:, :0], P[:, :0], Q[:, :1]), "k >= 1"),
        (lambda n, P, Q: (n, P.numpy(), Q), "draft_probs must be a torch.Tensor"),
    ],
)
def test_bad_input_raises_value_error(mutate, match):
    """Every bad input that README.md lists for verify raises, whatever the screen in check_probs."""
    n, P, Q = _batch(4, 3, 10, 5)
    with pytest.raises(ValueError, match=match):
        verify(*mutate(n, P, Q), ct.SpS())


def test_bad_rule_raises():
    n, P, Q = _batch(2, 2, 5, 6)
    with pytest.raises(ValueError, match="rule must be"):
        verify(n, P, Q, "sps")


def test_float32_tolerance_is_the_stated_one():
    n, P, Q = _batch(2, 2, 5, 7)
    verify(n, P * (1 + 5e-5), Q, ct.SpS())  # within 1e-4: accepted
    with pytest.raises(ValueError, match="tolerance 0.0001"):
        verify(n, P * (1 + 5e-4), Q, ct.SpS())


def test_row_generators_make_each_row_its_own_stream():
    """``verify`` / ``verify_tree`` with ``RowGenerators``: row b's tokens are those of row b verified
    alone with a generator of its own seed (its uniforms come from that generator only), whatever the
    other rows are; the uniforms are that generator's stream."""
    from cactus_theory.core.draws import RowGenerators, uniforms
    from cactus_theory.core.tree import verify_tree

    torch.manual_seed(0)
    B, k, V = 6, 3, 7
    p = torch.softmax(torch.randn(B, k, V, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(B, k + 1, V, dtype=torch.float64), -1)
    n = torch.randint(0, V, (B, k))
    seeds = [5, 9, 5, 1, 2**33, 0]
    rule = ct.Cactus(0.3)
    tok, a = verify(n, p, q, rule, generator=RowGenerators.from_seeds(seeds))
    for b in range(B):
        t1, a1 = verify(n[b:b + 1], p[b:b + 1], q[b:b + 1], rule, generator=torch.Generator().manual_seed(seeds[b]))
        assert tok[b].tolist() == t1[0].tolist() and int(a[b]) == int(a1[0])
    u = uniforms(RowGenerators.from_seeds(seeds), B, 4, "cpu")
    assert torch.equal(u[1], torch.rand(4, generator=torch.Generator().manual_seed(9), dtype=torch.float64))
    assert torch.equal(u[0], u[2])  # equal seeds, equal streams
    par = torch.tensor([[-1, -1, 0]] * B)
    ptree = p[:, [0, 0, 1]]
    res = verify_tree(n, par, ptree, q, rule, "iid", generator=RowGenerators.from_seeds(seeds))
    for b in (0, 3):
        r1 = verify_tree(n[b:b + 1], par[b:b + 1], ptree[b:b + 1], q[b:b + 1], rule, "iid",
                         generator=torch.Generator().manual_seed(seeds[b]))
        assert res.tokens[b].tolist() == r1.tokens[0].tolist()
    with pytest.raises(ValueError, match="RowGenerators has 5 generators"):
        verify(n, p, q, rule, generator=RowGenerators.from_seeds(seeds[:5]))
    with pytest.raises(ValueError, match="seeds\\[1\\]"):
        RowGenerators.from_seeds([1, -2])
