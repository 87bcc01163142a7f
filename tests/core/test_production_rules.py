"""The lossy rules production servers ship (rules.SGLangThreshold, RelaxedAcceptance, MedusaTypical,
FLy): each rule's law against an independent port of the server's decision written from its source
(plain Python / numpy loops, not the rule's code), their relation to TAS / SpS, FLy's window against a
simulation of vLLM's deferral pre-pass, and the batched sampler against the exact law.

Upstream code each port was written from (file @ version read):
  SGLang   sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh (TreeSpeculativeSamplingTargetOnly)
           @ sglang 0.5.23
  relaxed  MAX max/nn/sampling/rejection_sampler.py (_relaxed_thinking_verdict) @ max 26.7.0;
           TensorRT-LLM cpp/tensorrt_llm/kernels/speculativeDecoding/mtpKernels.cu
           (mtpRelaxedAcceptanceKernel) and tensorrt_llm/_torch/speculative/mtp.py (topk_kernel), main 2026
  Medusa   FasterDecoding/Medusa medusa/model/utils.py (evaluate_posterior fast=True, generate_candidates)
           and medusa/model/medusa_model.py (medusa_generate, fast=True) @ e2a5d20
  FLy      vllm/v1/spec_decode/fly.py (apply_fly_random_acceptance_kernel) @ vLLM 0.33.0

Statistical tests: level ALPHA = 1e-4, fixed seeds, sample sizes from ``stats.samples_needed`` for
power >= 0.999 against any law at TV >= EPS = 0.01 from the exact one.
"""

import math

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory import registry
from cactus_theory.sampler import verify, verify_flat
from cactus_theory.stats import goodness_of_fit, samples_needed
from cactus_theory.toy import one_step_test, random_pair, sequence_law, sequence_test

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
    """TreeSpeculativeSamplingTargetOnly (sglang 0.5.23), one chain step: accept iff q_n > 0
    (has_target_mass) and (coin < q_n / t_acc or q_n >= t_single); else draft_probs[n] = q_n and
    sample relu(q - draft_probs) with draft_probs zero elsewhere (target-only)."""
    A, G = np.zeros(V), np.zeros((V, V))
    for n in range(V):
        if q[n] > 0:
            A[n] = 1.0 if q[n] >= t_single else min(1.0, q[n] / max(t_acc, 1e-9))
        d = np.zeros(V)
        d[n] = q[n]
        r = np.maximum(q - d, 0)
        G[n] = r / r.sum()
    return A, G


def top_k_ids(q, k):
    """The ``k`` ids a top_k call returns, in our documented tie order: value descending, then id
    ascending (plain Python sort on an explicit key, not the rule's stable-sort code)."""
    return sorted(range(len(q)), key=lambda i: (-float(q[i]), i))[:k]


def relaxed_reference(q, topk, delta):
    """TensorRT-LLM mtpRelaxedAcceptanceKernel on top_k(q, topk) (the same verdict as MAX's
    _relaxed_thinking_verdict): walk the top-k ids from the first; stop at the first (after the top-1)
    whose value is below top1 - delta; accept iff the draft id is met before. Recovery: the top-1 id."""
    ids = top_k_ids(q, topk)
    threshold = q[ids[0]] - delta
    A = np.zeros(len(q))
    for n in range(len(q)):
        for jj, i in enumerate(ids):
            if jj > 0 and threshold > q[i]:
                break
            if i == n:
                A[n] = 1.0
                break
    G = np.tile(np.eye(len(q))[ids[0]], (len(q), 1))
    return A, G


def first_argmax(q):
    """The first index of the maximum (torch.argmax's documented choice), by a plain loop."""
    best = 0
    for i in range(len(q)):
        if q[i] > q[best]:
            best = i
    return best


def medusa_reference(q, eps, alpha):
    """Medusa evaluate_posterior (typical, fast=True): accept iff q_n > min(eps, alpha exp(-H)),
    H = -sum q log(q + 1e-5); the next token (after a rejection, and the bonus) is generate_candidates'
    argmax of the verifier's logits at that position (fast=True)."""
    H = -np.sum(q * np.log(q + 1e-5))
    tau = min(eps, np.exp(-H) * alpha)
    A = (q > tau).astype(float)
    return A, np.tile(np.eye(len(q))[first_argmax(q)], (len(q), 1))


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


def test_sglang_zero_target_mass_is_never_accepted():
    """sampling.cuh @ sglang 0.5.23 (PR #35798, has_target_mass): q_n = 0 is rejected even at
    threshold_single = 0, where the old port accepted every draft (its law was then p itself)."""
    q = np.array([0.4, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0])
    p = np.full(V, 1.0 / V)
    for ts, ta in [(0.0, 1.0), (0.0, 0.3), (0.5, 1e-3), (1.0, 1.0)]:
        rule = ct.SGLangThreshold(ts, ta)
        A, G = sglang_reference(p, q, ts, ta)
        np.testing.assert_array_equal(rule.accept_prob_all(p, q), A)
        assert (rule.accept_prob_all(p, q)[4:] == 0).all()
        h = ct.induced_distribution(rule, p, q)
        np.testing.assert_allclose(h, law_from(A, G, p), atol=1e-14)
        assert h[4:].sum() == 0  # a token the verifier gives no mass is never emitted
    # threshold_single = 0 still accepts every draft with q_n > 0
    np.testing.assert_array_equal(ct.SGLangThreshold(0.0, 1.0).accept_prob_all(p, q), (q > 0).astype(float))
    # in the sampler (torch): drafts of zero target mass are always rejected and recovered inside supp q
    B = 2000
    n = torch.from_numpy(np.random.default_rng(0).integers(0, V, size=(B, 1)))
    P = torch.full((B, 1, V), 1.0 / V, dtype=torch.float64)
    Q = torch.from_numpy(np.tile(q, (B, 2, 1)))
    tokens, acc = verify(n, P, Q, ct.SGLangThreshold(0.0, 1.0), generator=torch.Generator().manual_seed(1))
    zero = n[:, 0] >= 4
    assert 0 < int(zero.sum()) < B
    assert bool((acc[zero] == 0).all()) and bool((acc[~zero] == 1).all())
    assert bool((tokens[:, 0] < 4).all())


TIES = [  # (q, topk): exact ties at the rank-topk value; the last row has fewer than topk nonzero entries
    (np.array([0.1, 0.25, 0.1, 0.2, 0.1, 0.1, 0.15, 0.0]), 4),  # ranks 1, 3, 6, then 0 of the four 0.1s
    (np.array([0.1, 0.25, 0.1, 0.2, 0.1, 0.1, 0.15, 0.0]), 5),
    (np.array([0.2, 0.2, 0.2, 0.2, 0.2, 0.0, 0.0, 0.0]), 2),
    (np.array([0.6, 0.0, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0]), 3),  # as after top-p truncation: ids 0, 2, then 1
]


@pytest.mark.parametrize("q,topk", TIES)
def test_relaxed_accepts_exactly_the_topk_ids_at_ties(q, topk):
    """mtpKernels.cu / mtp.py (TensorRT-LLM) and rejection_sampler.py @ max 26.7.0 accept only the topk
    ids top_k returns: an exact tie at rank topk does not widen the set (the old port accepted every
    q_n >= q_(topk)). Tie order: lower id first, identical in numpy, torch float64 and torch float32."""
    p = np.full(V, 1.0 / V)
    rule = ct.RelaxedAcceptance(topk, 1.0)  # delta = 1: the rank test alone
    A, G = relaxed_reference(q, topk, 1.0)
    assert A.sum() == topk
    old = (q >= np.sort(q)[::-1][topk - 1]).astype(float)
    assert old.sum() > topk  # the case is a tie at rank topk
    np.testing.assert_array_equal(rule.accept_prob_all(p, q), A)
    for dt in (torch.float64, torch.float32):
        P, Qt = torch.tensor(p, dtype=dt), torch.tensor(q, dtype=dt)
        np.testing.assert_array_equal(rule.accept_prob_all(P, Qt).double().numpy(), A)
        ids = torch.arange(V)
        np.testing.assert_array_equal(rule.accept_prob(P.expand(V, V), Qt.expand(V, V), ids).double().numpy(), A)
    np.testing.assert_array_equal([float(rule.accept_prob(p, q, np.asarray(n))) for n in range(V)], A)
    np.testing.assert_array_equal(ct.rules.descending_rank(q), ct.rules.descending_rank(torch.tensor(q)).numpy())
    np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law_from(A, G, p), atol=1e-14)
    # the sampler: each drafted id is kept iff it is one of the topk ids, else argmax q is emitted
    n = torch.arange(V).repeat(50).unsqueeze(-1)
    Q = torch.tensor(np.tile(q, (n.shape[0], 2, 1)))
    P = torch.full((n.shape[0], 1, V), 1.0 / V, dtype=torch.float64)
    tokens, acc = verify(n, P, Q, rule, generator=torch.Generator().manual_seed(2))
    np.testing.assert_array_equal(acc.numpy(), A[n[:, 0].numpy()])
    rejected = acc == 0
    assert bool((tokens[rejected, 0] == first_argmax(q)).all())


def test_relaxed_matches_max_verdict():
    p, q = rows(2)
    for topk, delta in [(1, 0.0), (3, 0.05), (3, 1.0), (10, 0.6), (8, 0.2), (20, 1.0)]:
        rule = ct.RelaxedAcceptance(topk, delta)
        A, G = relaxed_reference(q, topk, delta)
        np.testing.assert_array_equal(rule.accept_prob_all(p, q), A * (p > 0))
        np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law_from(A, G, p), atol=1e-14)
    # topk = 1, delta = 0: accept the argmax only, otherwise emit it: the step is a point mass
    h = ct.induced_distribution(ct.RelaxedAcceptance(1, 0.0), p, q)
    assert h[np.argmax(q)] == pytest.approx(1.0)


def test_medusa_matches_medusa_and_shares_tas_step():
    """Medusa utils.py @ e2a5d20, fast=True: recovery is argmax q (the old port recovered from the
    truncated q, which only the crashing fast=False path would do); one step equals TAS's with the same
    entropy constant (vLLM 0.9.2's typical_acceptance_sampler.py also emits argmax q)."""
    truncated_differs = False
    for seed in range(4):
        p, q = rows(seed + 10, concentration=0.3)
        for eps in (0.03, 0.09, 0.3):
            alpha = math.sqrt(eps)
            rule = ct.MedusaTypical(eps, alpha)
            A, G = medusa_reference(q, eps, alpha)
            np.testing.assert_array_equal(rule.accept_prob_all(p, q), A * (p > 0))
            np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law_from(A, G, p), atol=1e-14)
            np.testing.assert_allclose(ct.induced_distribution(rule, p, q),
                                       ct.induced_distribution(ct.TAS(eps, alpha, entropy_eps=1e-5), p, q), atol=1e-14)
            # the old recovery (q truncated at tau) gives another law on these rows
            tau = min(eps, np.exp(np.sum(q * np.log(q + 1e-5))) * alpha)
            kept = np.where(q < tau, 0.0, q)
            old = law_from(A, np.tile(kept / kept.sum(), (V, 1)), p)
            truncated_differs |= ct.tv(old, ct.induced_distribution(rule, p, q)) > 0.01
    assert truncated_differs


def test_tas_matches_vllm_typical_acceptance_sampler():
    """vllm/model_executor/layers/typical_acceptance_sampler.py @ vLLM 0.9.2 (the last release with it):
    accept iff q_n > min(posterior_threshold, posterior_alpha exp(-H)), H = -sum q log(q + 1e-5);
    _get_recovered_token_ids = argmax q; the bonus comes from the target's sampler (q)."""
    for seed in range(4):
        p, q = rows(seed + 30, concentration=0.3)
        for eps in (0.03, 0.09, 0.3):
            alpha = math.sqrt(eps)
            H = -sum(float(x) * math.log(float(x) + 1e-5) for x in q)
            A = np.array([float(x > min(eps, alpha * math.exp(-H))) for x in q])
            G = np.tile(np.eye(V)[first_argmax(q)], (V, 1))
            rule = ct.TAS(eps, alpha, entropy_eps=1e-5)
            np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law_from(A, G, p), atol=1e-14)
            assert rule.bonus_from_q and ct.exact.bonus_distribution(rule, q) == pytest.approx(q, abs=0)


def test_medusa_argmax_ties_take_the_first_id():
    """torch.argmax (Medusa's generate_candidates) returns the first maximum: recovery and bonus pick
    the lowest tied id, in numpy and torch."""
    q = np.array([0.1, 0.35, 0.05, 0.35, 0.15, 0.0, 0.0, 0.0])
    rule = ct.MedusaTypical()
    for qq in (q, torch.tensor(q), torch.tensor(q, dtype=torch.float32)):
        np.testing.assert_array_equal(np.asarray(rule.bonus(qq), dtype=float), np.eye(V)[1])
        np.testing.assert_array_equal(np.asarray(rule.residual(qq * 0 + 1 / V, qq, qq.argmax() * 0 + 2), dtype=float),
                                      np.eye(V)[1])


def test_medusa_bonus_is_argmax_in_the_samplers():
    """All drafts accepted: verify emits argmax of row k, verify_flat argmax of bonus_probs (and refuses
    to guess without them); a bonus drawn from q would differ in most of these rows."""
    rng = np.random.default_rng(21)
    B, k = 500, 2
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.4), size=(B, k + 1)))
    n = Q[:, :k].argmax(-1)  # the argmax passes Medusa's test (q_n > min(eps, ...) as q_max >= 1 / V > eps)
    P = torch.full((B, k, V), 1.0 / V, dtype=torch.float64)
    rule = ct.MedusaTypical(0.09, 0.3)
    tokens, acc = verify(n, P, Q, rule, generator=torch.Generator().manual_seed(0))
    assert bool((acc == k).all())
    want = torch.tensor([first_argmax(row) for row in Q[:, k].numpy()])
    assert torch.equal(tokens[:, k], want)
    tas_tokens, _ = verify(n, P, Q, ct.TAS(0.09, 0.3, 1e-5), generator=torch.Generator().manual_seed(0))
    assert float((tas_tokens[:, k] != want).double().mean()) > 0.2  # TAS samples its bonus from q
    cu = torch.arange(1, B + 1) * k
    flat_args = (n.reshape(-1), cu, P.reshape(-1, V), Q[:, :k].reshape(-1, V), torch.zeros(B, 1, dtype=torch.long),
                 rule)
    out = verify_flat(*flat_args, generator=torch.Generator().manual_seed(0), bonus_probs=Q[:, k])
    assert torch.equal(out[:, k].long(), want)
    with pytest.raises(ValueError, match="bonus_probs"):
        verify_flat(*flat_args, generator=torch.Generator().manual_seed(0))


def test_medusa_chain_law_includes_the_argmax_bonus():
    """k = 1, T = 2 by hand from medusa_reference: P(x1, x2) = acc(x1) [argmax q(. | x1) = x2]
    + rej(x1) h(x2 | x1); toy.sequence_law must include the argmax bonus (a q bonus gives another law)."""
    d, v = random_pair(4, order=2, concentration=0.6, weight=0.6, seed=5)
    rule = ct.MedusaTypical(0.2, math.sqrt(0.2))
    W = 4

    def step(c):
        p, q = d(c), v(c)
        A, G = medusa_reference(q, 0.2, math.sqrt(0.2))
        return p * A, (p * (1 - A)) @ G

    acc, rej = step(())
    want = np.zeros((W, W))
    for a in range(W):
        want[a, first_argmax(v((a,)))] += acc[a]
        acc2, rej2 = step((a,))
        want[a] += rej[a] * (acc2 + rej2)
    law = sequence_law(d, v, rule, 1, 2)
    np.testing.assert_allclose(law, want, atol=1e-14)
    argmax_part = acc[:, None] * np.stack([np.eye(W)[first_argmax(v((a,)))] for a in range(W)])
    with_q_bonus = want - argmax_part + acc[:, None] * np.stack([v((a,)) for a in range(W)])
    assert ct.tv(law.ravel(), with_q_bonus.ravel()) > 0.01


def test_medusa_loop_matches_exact_chain_law():
    """speculative_decode (sampler.verify, bonus included) against toy.sequence_law, k = 2, T = 3:
    goodness of fit at ALPHA with power >= 1 - BETA against TV >= EPS."""
    W, T = 3, 3
    d, v = random_pair(W, order=2, concentration=0.8, weight=0.6, seed=7)
    rule = ct.MedusaTypical(0.3, math.sqrt(0.3))
    law = sequence_law(d, v, rule, 2, T)
    tas_law = sequence_law(d, v, ct.TAS(0.3, math.sqrt(0.3), 1e-5), 2, T)
    assert ct.tv(law.ravel(), tas_law.ravel()) > 2 * EPS  # the bonus matters on this pair
    N = samples_needed(EPS, categories=W**T, alpha=ALPHA, beta=BETA)
    res = sequence_test(d, v, rule, 2, T, num_sequences=N, seed=3, alpha=ALPHA)
    assert not res.reject, res


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
