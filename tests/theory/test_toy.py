"""Toy models, the speculative decoding loop, and the exact law of its first T tokens.

Statistical tests: level ALPHA = 1e-4 each with fixed seeds (deterministic suite; under redrawn
seeds each would fail with probability ~1e-4). Sample sizes from ``stats.samples_needed`` detect
any law at TV >= 0.01 from the exact one with probability >= 0.999 over the V^T cells.
"""

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.stats import samples_needed
from cactus_theory.toy import (
    NGram,
    autoregressive_law,
    random_ngram,
    random_pair,
    sequence_law,
    sequence_test,
    speculative_decode,
    step_parts,
)

ALPHA, BETA, EPS = 1e-4, 1e-3, 0.01
V, T = 3, 3
N_SEQ = samples_needed(EPS, categories=V**T, alpha=ALPHA, beta=BETA)
LOSSY = [ct.Cactus(0.5), ct.TAS(), ct.TopK(2), ct.Interpolation(0.3), ct.EARS(0.4)]


@pytest.fixture(scope="module")
def pair():
    return random_pair(V, order=2, concentration=1.0, weight=0.6, seed=0)


def test_ngram_context_padding():
    m = random_ngram(4, order=3, seed=1)
    assert m.table.shape == (5, 5, 4)
    np.testing.assert_array_equal(m(()), m.table[4, 4])
    np.testing.assert_array_equal(m((2,)), m.table[4, 2])
    np.testing.assert_array_equal(m((0, 1, 3)), m.table[1, 3])
    assert np.allclose(m.table.sum(-1), 1)


def test_ngram_validation():
    with pytest.raises(ValueError, match="table is not normalised"):
        NGram(np.ones((3, 2)))
    with pytest.raises(ValueError, match="table must have shape"):
        NGram(np.full((4, 2), 0.5))
    with pytest.raises(ValueError, match="V must be"):
        random_ngram(1)


@pytest.mark.parametrize("rule", [ct.SpS(), *LOSSY, ct.TopK(2, recovery="topk"), ct.TAS(entropy_eps=1e-5)], ids=repr)
def test_step_parts_are_the_one_step_law(rule):
    """Against reference.py (the formulas re-implemented with scipy / plain numpy, no shared code):
    the accept part is p_n phi_n, the reject part sum_n p_n (1 - phi_n) g_n, per candidate n."""
    from cactus_theory.theory.reference import reference_law, reference_step

    rng = np.random.default_rng(4)
    for _ in range(3):
        p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.full(6, 0.5))
        acc, rej = step_parts(rule, p, q)
        steps = [reference_step(rule, p, q, n) for n in range(6)]
        np.testing.assert_allclose(acc, [p[n] * phi for n, (phi, _) in enumerate(steps)], rtol=0, atol=1e-12)
        np.testing.assert_allclose(rej, sum(p[n] * (1 - phi) * g for n, (phi, g) in enumerate(steps)), rtol=0,
                                   atol=1e-12)
        np.testing.assert_allclose(acc + rej, reference_law(rule, p, q), rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_sps_sequence_law_is_the_verifier_law(pair, k):
    d, v = pair
    for prompt in ((), (2,)):
        law = sequence_law(d, v, ct.SpS(), k, T, prompt=prompt)
        np.testing.assert_allclose(law, autoregressive_law(v, T, prompt=prompt), atol=1e-14)


@pytest.mark.parametrize("rule", [ct.SpS(), *LOSSY], ids=repr)
@pytest.mark.parametrize("k", [1, 2, 4])
def test_sequence_law_is_a_distribution_and_T1_is_one_step(pair, rule, k):
    d, v = pair
    law = sequence_law(d, v, rule, k, T)
    assert law.shape == (V,) * T and law.min() >= 0 and law.sum() == pytest.approx(1, abs=1e-12)
    np.testing.assert_allclose(sequence_law(d, v, rule, k, 1), ct.induced_distribution(rule, d(()), v(())), atol=1e-12)
    # marginalising the last token gives the law of T - 1 tokens
    np.testing.assert_allclose(law.sum(-1), sequence_law(d, v, rule, k, T - 1), atol=1e-12)


def test_two_token_law_by_hand(pair):
    """k = 1, T = 2: P(x1, x2) = acc(x1) q(x2 | x1) + rej(x1) h_alg(x2 | x1)."""
    d, v = pair
    rule = ct.Cactus(0.7)
    acc, rej = step_parts(rule, d(()), v(()))
    want = np.array([[acc[a] * v((a,))[b] + rej[a] * ct.induced_distribution(rule, d((a,)), v((a,)))[b]
                      for b in range(V)] for a in range(V)])
    np.testing.assert_allclose(sequence_law(d, v, rule, 1, 2), want, atol=1e-14)


def test_lossy_law_depends_on_block_boundaries(pair):
    d, v = pair
    rule = ct.Cactus(0.5)
    laws = [sequence_law(d, v, rule, k, T).ravel() for k in (1, 2, 3)]
    assert ct.tv(laws[0], laws[1]) > 0.01 and ct.tv(laws[1], laws[2]) > 0.01
    # and the lossy law is not the verifier's own law
    assert ct.tv(laws[1], autoregressive_law(v, T).ravel()) > 0.01


@pytest.mark.parametrize("rule", [ct.SpS(), ct.Cactus(0.5)], ids=repr)
def test_loop_matches_exact_sequence_law_k2(pair, rule):
    d, v = pair
    res = sequence_test(d, v, rule, 2, T, num_sequences=N_SEQ, seed=0, alpha=ALPHA)
    assert res.n == N_SEQ and res.method == "asymptotic-chi2"
    assert not res.reject, res


def test_loop_matches_exact_law_trigram_with_prompt():
    d, v = random_pair(3, order=3, concentration=0.8, weight=0.5, seed=3)
    res = sequence_test(d, v, ct.Cactus(1.0), 3, T, num_sequences=N_SEQ, seed=1, alpha=ALPHA, prompt=(2, 0))
    assert not res.reject, res


def test_sps_loop_matches_verifier_law_by_gtest(pair):
    d, v = pair
    res = sequence_test(d, v, ct.SpS(), 2, T, num_sequences=N_SEQ, seed=2, alpha=ALPHA, statistic="gtest")
    assert not res.reject, res
    np.testing.assert_allclose(sequence_law(d, v, ct.SpS(), 2, T), autoregressive_law(v, T), atol=1e-14)


def test_loop_bookkeeping_and_determinism(pair):
    d, v = pair
    k = 2
    def run(s):
        return speculative_decode(d, v, ct.Cactus(0.5), k, 5, num_sequences=500,
                                           generator=torch.Generator().manual_seed(s))
    a, b, c = run(0), run(0), run(1)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.blocks, b.blocks)
    assert not np.array_equal(a.tokens, c.tokens)
    assert a.tokens.shape == (500, 5) and a.tokens.min() >= 0 and a.tokens.max() < V
    assert (a.blocks >= -(-5 // (k + 1))).all() and (a.blocks <= 5).all()
    assert (a.accepted <= k * a.blocks).all() and (a.accepted + a.blocks >= 5).all()
    # every block but the last is complete: emitted = accepted + blocks, the last block may overshoot
    assert (a.accepted + a.blocks - 5 <= k).all()


def test_loop_with_b1_k1():
    d, v = random_pair(2, seed=5)
    r = speculative_decode(d, v, ct.SpS(), 1, 4, generator=torch.Generator().manual_seed(0))
    assert r.tokens.shape == (1, 4) and set(r.tokens.ravel().tolist()) <= {0, 1}


def test_loop_validation(pair):
    d, v = pair
    with pytest.raises(ValueError, match="k must be"):
        speculative_decode(d, v, ct.SpS(), 0, 3)
    with pytest.raises(ValueError, match="T must be"):
        sequence_law(d, v, ct.SpS(), 2, 0)
    def bad(prefix):
        return np.array([0.5, 0.6, 0.1])
    with pytest.raises(ValueError, match=r"verifier\(\) is not normalised"):
        sequence_law(d, bad, ct.SpS(), 2, 2)
    other = random_ngram(4, seed=9)
    with pytest.raises(ValueError, match="share one vocabulary"):
        speculative_decode(d, other, ct.SpS(), 2, 3, num_sequences=4)
