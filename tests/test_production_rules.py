"""The lossy rules production servers ship (rules.SGLangThreshold, RelaxedAcceptance, MedusaTypical,
FLy): each rule's law against an independent port of the server's decision written from its source
(plain numpy loops, not the rule's code), their relation to TAS / SpS, FLy's window against a
simulation of vLLM's deferral pre-pass, and the batched sampler against the exact law.

Statistical tests: level ALPHA = 1e-4, fixed seeds, sample sizes from ``stats.samples_needed`` for
power >= 0.999 against any law at TV >= EPS = 0.01 from the exact one.
"""

import math

import numpy as np
import pytest

import cactus_theory as ct
from cactus_theory import registry
from cactus_theory.stats import goodness_of_fit, samples_needed
from cactus_theory.toy import one_step_test

ALPHA, BETA, EPS = 1e-4, 1e-3, 0.01
V = 8
PRODUCTION = [ct.SGLangThreshold(0.6, 0.3), ct.RelaxedAcceptance(3, 0.3), ct.MedusaTypical(), ct.FLy(0.3, 3, 0.5)]


def rows(seed, size=None, concentration=0.7):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, concentration), size=size), rng.dirichlet(np.full(V, concentration), size=size)


def law_from(accept, recover, p):
    """``sum_n p_n [A_n e_n + (1 - A_n) G_n]`` for a reference's accept probs A (V,) and recoveries G (V, V)."""
    return p * accept + (p * (1 - accept)) @ recover


def sglang_reference(p, q, t_single, t_acc):
    """sgl-kernel TreeSpeculativeSamplingTargetOnly, one chain step: accept iff
    coin <= q_n / t_acc or q_n >= t_single; else draft_probs[n] = q_n and sample relu(q - draft_probs)
    with draft_probs zero elsewhere (target-only)."""
    A, G = np.zeros(V), np.zeros((V, V))
    for n in range(V):
        A[n] = 1.0 if q[n] >= t_single else min(1.0, q[n] / max(t_acc, 1e-9))
        d = np.zeros(V)
        d[n] = q[n]
        r = np.maximum(q - d, 0)
        G[n] = r / r.sum()
    return A, G


def relaxed_reference(q, topk, delta):
    """MAX _relaxed_thinking_verdict: top-N of the target probs, valid = top_probs >= top1 - delta,
    accepted iff the draft id is a valid top-N id; recovery: the top-1 id."""
    order = np.argsort(-q, kind="stable")[:topk]
    valid = q[order] >= q[order[0]] - delta
    A = np.array([float(any((order == n) & valid)) for n in range(V)])
    G = np.tile(np.eye(V)[order[0]], (V, 1))
    return A, G


def medusa_reference(q, eps, alpha):
    """Medusa evaluate_posterior ('typical') and get_typical_one_token."""
    H = -np.sum(q * np.log(q + 1e-5))
    tau = min(eps, np.exp(-H) * alpha)
    A = (q > tau).astype(float)
    kept = np.where(q < tau, 0.0, q)
    return A, np.tile(kept / kept.sum(), (V, 1))


def test_sglang_matches_its_kernel_and_is_lossless_at_one():
    p, q = rows(1)
    for ts, ta in [(1.0, 1.0), (0.6, 0.3), (0.2, 0.05), (1.0, 0.5)]:
        rule = ct.SGLangThreshold(ts, ta)
        np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law_from(*sglang_reference(p, q, ts, ta), p),
                                   atol=1e-14)
    # both thresholds 1: the output law is q whatever the draft (target-only verification is exact)
    for seed in range(5):
        p, q = rows(seed)
        np.testing.assert_allclose(ct.induced_distribution(ct.SGLangThreshold(), p, q), q, atol=1e-14)
        assert ct.acceptance_rate(ct.SGLangThreshold(), p, q) == pytest.approx(np.dot(p, q), abs=1e-14)
    assert ct.tv(ct.induced_distribution(ct.SGLangThreshold(0.6, 0.3), p, q), q) > 0.01  # lossy below 1


def test_relaxed_matches_max_verdict():
    p, q = rows(2)
    for topk, delta in [(1, 0.0), (3, 0.05), (3, 1.0), (10, 0.6), (8, 0.2)]:
        rule = ct.RelaxedAcceptance(topk, delta)
        A, G = relaxed_reference(q, topk, delta)
        np.testing.assert_array_equal(rule.accept_prob_all(p, q), A * (p > 0))
        np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law_from(A, G, p), atol=1e-14)
    # topk = 1, delta = 0: accept the argmax only, otherwise emit it: the step is a point mass
    h = ct.induced_distribution(ct.RelaxedAcceptance(1, 0.0), p, q)
    assert h[np.argmax(q)] == pytest.approx(1.0)


def test_medusa_matches_medusa_and_shares_tas_acceptance():
    for seed in range(4):
        p, q = rows(seed + 10, concentration=0.3)
        for eps in (0.03, 0.09, 0.3):
            alpha = math.sqrt(eps)
            rule = ct.MedusaTypical(eps, alpha)
            A, G = medusa_reference(q, eps, alpha)
            np.testing.assert_array_equal(rule.accept_prob_all(p, q), A * (p > 0))
            np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law_from(A, G, p), atol=1e-14)
            # TAS is the same test with the exact entropy; Medusa recovers from the truncated q, TAS
            # emits argmax q
            exact_h = ct.MedusaTypical(eps, alpha, entropy_eps=0.0)
            np.testing.assert_array_equal(exact_h.accept_prob_all(p, q), ct.TAS(eps, alpha).accept_prob_all(p, q))
    assert ct.tv(ct.induced_distribution(exact_h, p, q), ct.induced_distribution(ct.TAS(eps, alpha), p, q)) > 0


def test_fly_limits():
    p, q = rows(3)
    np.testing.assert_allclose(ct.induced_distribution(ct.FLy(window_accept=0.0), p, q),
                               ct.induced_distribution(ct.SpS(), p, q), atol=1e-14)
    np.testing.assert_allclose(ct.induced_distribution(ct.FLy(entropy_threshold=5.0), p, q), q, atol=1e-14)
    # f = 1 and an open gate: every draft with q_n > 0 is kept
    h = ct.induced_distribution(ct.FLy(0.0, 3, 1.0), p, q)
    np.testing.assert_allclose(h, p, atol=1e-14)
    top = np.sort(q)[::-1][:3]
    assert ct.FLy().top_entropy(q) == pytest.approx(-np.sum(top * np.log(top)))


def test_fly_window_simulation_matches_one_step_law():
    """A numpy port of vLLM's FLy pre-pass (apply_fly_random_acceptance_kernel, then the native
    kernel) on a block of K = W + 1 drafts from identical independent rows: position 0 may defer
    iff the next W drafts are natively accepted, which happens with probability
    f = (sum_n p_n min(1, q_n / p_n))^W whatever the first draft is; its first emitted token must
    then follow FLy(window_accept=f)'s exact one-step law."""
    W, theta = 2, 0.3
    p, q = rows(4)
    rule = ct.FLy(theta, 3, 1.0)
    assert rule.top_entropy(q) >= theta  # the gate is open, so the window matters
    N = samples_needed(EPS, categories=V, alpha=ALPHA, beta=BETA)
    rng = np.random.default_rng(0)
    K = W + 1
    n = np.stack([rng.choice(V, size=N, p=p) for _ in range(K)], 1)  # [N, K]
    u = rng.random((N, K))
    native = q[n] / p[n] >= u
    defer = (~native[:, 0]) & (q[n[:, 0]] > 0) & native[:, 1:].all(1)  # 0 + W < K
    accepted0 = native[:, 0] | defer
    r = np.maximum(q - p, 0)
    recovered = rng.choice(V, size=N, p=r / r.sum())  # the native recovery, drawn for every row
    first = np.where(accepted0, n[:, 0], recovered)
    f = float(np.dot(p, np.minimum(1, q / p))) ** W
    law = ct.induced_distribution(ct.FLy(theta, 3, f), p, q)
    assert ct.tv(law, ct.induced_distribution(ct.SpS(), p, q)) > 2 * EPS  # FLy differs from SpS here
    res = goodness_of_fit(first, law, alpha=ALPHA, kind="samples")
    assert not res.reject, res


@pytest.mark.parametrize("rule", PRODUCTION, ids=repr)
def test_sampler_law_matches_exact(rule):
    rng = np.random.default_rng(11)
    p, q = rng.dirichlet(np.full(V, 0.7), size=2), rng.dirichlet(np.full(V, 0.7), size=3)
    assert 0.02 < float(ct.acceptance_rate(rule, p[0], q[0])) < 0.98  # both branches carry mass
    N = samples_needed(EPS, categories=V, alpha=ALPHA, beta=BETA)
    res = one_step_test(rule, p, q, num_samples=N, seed=5, alpha=ALPHA)
    assert not res.reject, res


def test_registered_and_validated():
    for key, cls in [("sglang", ct.SGLangThreshold), ("relaxed", ct.RelaxedAcceptance), ("medusa", ct.MedusaTypical),
                     ("fly", ct.FLy)]:
        s = registry.spec(key)
        assert s.cls is cls and len(s.sweep_rules()) >= 5 and not s.lossless
        assert registry.label(cls()).startswith(s.label)
    for bad in [lambda: ct.SGLangThreshold(1.5), lambda: ct.SGLangThreshold(1.0, 0.0), lambda: ct.RelaxedAcceptance(0),
                lambda: ct.RelaxedAcceptance(3, -0.1), lambda: ct.MedusaTypical(0.0), lambda: ct.FLy(window_accept=2.0),
                lambda: ct.FLy(entropy_top_k=0)]:
        with pytest.raises(ValueError):
            bad()
