"""Guards against wrong ports that the rest of the suite let through (issue 17; ``tests/mutants.py``
plants them, ``make mutants`` prints which test catches each).

Every check here compares the library with an independent reference written below in plain numpy
loops from the formulas and the documented contracts (not the library's code path):
  * exact laws of SpS / Cactus / TopK / FLy / SGLang / Medusa's test, with ties, zeros in ``q``,
    ``q_n = 1`` with float noise, ``t_single < t_acc`` and a vocabulary of 4,000-5,000 tokens;
  * token for token, the documented uniform layout of ``sampler.verify`` (one ``[B, k + 1]`` draw)
    and ``sampler.verify_flat``'s per-request generators (``n_b + 1`` uniforms each: acceptance,
    then the recovery draw), on ragged batches whose rejected rows have fewer drafts than the batch
    maximum, padded (-1) drafts, and the vLLM / transformers integrations built on them;
  * RelaxedAcceptance's top_k ids at a 4,000-token vocabulary with exact ties (the documented stable
    order, value descending then lower id, against a plain Python sort), in numpy and torch;
  * the eval cache: a batch written under an earlier revision of a rule's law (the old folder and
    record layout, written by hand) is recomputed, a batch of the current revision reused;
  * the sampled law of a padded draft and of SGLang at ``t_single < t_acc`` against the exact law
    (``stats.goodness_of_fit``, level ALPHA, fixed seeds; the sample size from ``samples_needed`` for
    the TV distance the wrong port causes, which is computed and asserted).
Some checks also prove that a port is harmless (the table of ``make mutants`` names them).
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.optimize import multi_draft_acceptance
from cactus_theory.sampler import PLACEHOLDER_TOKEN_ID, verify, verify_flat
from cactus_theory.stats import goodness_of_fit, samples_needed

ALPHA, BETA = 1e-4, 1e-3

# -- independent references ------------------------------------------------------------------------


def ref_sps(p, q, n):
    """(phi_n, g_n) of speculative sampling: min(1, q_n / p_n) (0 if p_n = 0), (q - p)_+ normalised."""
    phi = min(1.0, q[n] / p[n]) if p[n] > 0 else 0.0
    r = np.maximum(q - p, 0.0)
    return phi, (r / r.sum() if r.sum() > 0 else q.copy())


def ref_cactus(delta):
    """(phi_n, g_n) of Cactus with Corollary 5's gamma, written out term by term."""

    def f(p, q, n):
        qn = min(max(q[n], 0.0), 1.0)
        gamma = min(max(qn + math.sqrt(2.0 * delta * qn * (1.0 - qn)), qn), 1.0)
        h = np.array([q[i] * (1.0 - gamma) / (1.0 - qn) if qn < 1 else 0.0 for i in range(q.size)])
        h[n] = gamma
        phi = min(1.0, gamma / p[n]) if p[n] > 0 else 0.0
        r = np.array([max(h[i] - p[i], 0.0) for i in range(q.size)])
        return phi, (r / r.sum() if r.sum() > 0 else h)

    return f


def ref_topk_authors(k):
    """TopK(k, recovery="topk"): accept iff q_n >= k-th largest; recover from (1[q >= q_(k)] - p)_+."""

    def f(p, q, n):
        kth = sorted(q, reverse=True)[k - 1]
        top = (q >= kth).astype(float)
        phi = float(q[n] >= kth) if p[n] > 0 else 0.0
        r = np.maximum(top - p, 0.0)
        return phi, (r / r.sum() if r.sum() > 0 else top / top.sum())

    return f


def ref_law(ref, p, q):
    """sum_n p_n [phi_n e_n + (1 - phi_n) g_n], one candidate at a time."""
    out = np.zeros(p.size)
    for n in range(p.size):
        if p[n] == 0:
            continue
        phi, g = ref(p, q, n)
        out[n] += p[n] * phi
        out += p[n] * (1 - phi) * g
    return out


def ref_draw(w, u):
    """Inverse CDF as documented by sampler.sample_rows: the first y with cdf[y] > u * total, capped
    at the last token with positive mass."""
    c = np.cumsum(np.maximum(np.asarray(w, dtype=np.float64), 0.0))
    y = next((i for i in range(c.size) if c[i] > u * c[-1]), c.size)
    last = next(i for i in range(c.size) if c[i] >= c[-1])
    return min(y, last)


def ref_block(ref, ns, ps, qs, us, bonus):
    """One request: accept draft j while us[j] < phi; recover with us[len(ns)]; else the bonus.
    A padded draft (-1) is always rejected and recovered from q."""
    m = len(ns)
    for j, n in enumerate(ns):
        if n < 0:
            return [*ns[:j], ref_draw(qs[j], us[m])]
        phi, g = ref(ps[j], qs[j], n)
        if not us[j] < phi:
            return [*ns[:j], ref_draw(g, us[m])]
    return [*ns, bonus]


def ref_verify_flat(ref, ids, counts, P, Q, bonus, gens):
    """verify_flat's contract with a generator for every request that has drafts: request b draws
    n_b + 1 uniforms from its own generator (acceptance, then recovery); P None means one-hot drafts."""
    out, s = [], 0
    K = max(counts)
    for b, c in enumerate(counts):
        ns = [int(x) for x in ids[s:s + c]]
        if c == 0:
            toks = [int(bonus[b])]
        else:
            us = torch.rand(c + 1, generator=gens[b], dtype=torch.float64).numpy()
            ps = [np.eye(Q.shape[1])[max(n, 0)] if P is None else P[s + j] for j, n in enumerate(ns)]
            toks = ref_block(ref, ns, ps, Q[s:s + c], us, int(bonus[b]))
        out.append(toks + [PLACEHOLDER_TOKEN_ID] * (K + 1 - len(toks)))
        s += c
    return np.array(out)


def dirichlet(rng, V, c=0.7, size=None):
    return rng.dirichlet(np.full(V, c), size=size)


# -- exact laws ------------------------------------------------------------------------------------


def _pairs(V=7, count=30, seed=0):
    """Random pairs plus the edge cases: p = q, one-hot p, zeros in q, ties in q, q_n = 1."""
    rng = np.random.default_rng(seed)
    out = [(dirichlet(rng, V), dirichlet(rng, V)) for _ in range(count)]
    q = dirichlet(rng, V)
    out.append((q.copy(), q.copy()))
    out.append((np.eye(V)[2], q))
    qz = q.copy()
    qz[[0, 3]] = 0
    out.append((dirichlet(rng, V), qz / qz.sum()))
    out.append((dirichlet(rng, V), np.array([0.25, 0.25, 0.25, 0.125, 0.125, 0.0, 0.0])[:V]))
    out.append((dirichlet(rng, V), np.eye(V)[4]))
    return out


def test_zero_residual_fallback_carries_no_weight():
    """(h - p)_+ = 0 happens only where h = p, and then every draft is accepted: the fallback row of
    TargetRule.residual is never weighted, so replacing it (by p, by anything) leaves the law alone."""
    for rule, ref in [(ct.SpS(), ref_sps), (ct.Cactus(0.3), ref_cactus(0.3)), (ct.Cactus(2.0), ref_cactus(2.0))]:
        for p, q in _pairs():
            np.testing.assert_allclose(ct.induced_distribution(rule, p, q), ref_law(ref, p, q), atol=1e-12)
            phi = rule.accept_prob_all(p, q)
            for n in np.flatnonzero(p * (1 - phi) > 0):
                h = rule.target(p, q, np.asarray(n))
                assert np.maximum(h - p, 0).sum() > 0
    # Interpolation(1) is h = p: every draft accepted, the step's law is p
    p, q = _pairs()[0]
    np.testing.assert_allclose(ct.induced_distribution(ct.Interpolation(1.0), p, q), p, atol=1e-15)


def test_qn_one_with_float_noise():
    """q_n = 1 exactly while other entries carry float noise (as a float32 softmax gives): gamma = 1, so
    phi_n = 1 and the recovery row (the 0/0 scale's convention) has weight 0; the law is the reference's."""
    V = 6
    q = np.array([1.0, 3e-8, 0.0, 2e-8, 0.0, 0.0])
    rng = np.random.default_rng(1)
    for rule, ref in [(ct.SpS(), ref_sps), (ct.Cactus(0.5), ref_cactus(0.5))]:
        for _ in range(5):
            p = dirichlet(rng, V)
            np.testing.assert_allclose(ct.induced_distribution(rule, p, q, method="generic"), ref_law(ref, p, q),
                                       atol=1e-12)
            assert float(rule.accept_prob(p, q, np.asarray(0))) == 1.0


def test_topk_recovery_fallback_carries_no_weight():
    """A rejected draft n has p_n > 0 and q_n < q_(k): it lies outside the top set, so
    (1[q >= q_(k)] - p)_+ has mass and the normalisation's fallback is never used (ties in q included)."""
    for k in (1, 2, 3):
        rule = ct.TopK(k, recovery="topk")
        for p, q in _pairs():
            np.testing.assert_allclose(ct.induced_distribution(rule, p, q), ref_law(ref_topk_authors(k), p, q),
                                       atol=1e-12)
            phi = rule.accept_prob_all(p, q)
            kth = np.sort(q)[::-1][k - 1]
            for n in np.flatnonzero(p * (1 - phi) > 0):
                assert q[n] < kth and np.maximum((q >= kth) - p, 0).sum() > 0


def test_fast_path_with_tied_ratios_large_vocab():
    """V = 4,000 with p / q taking three values only (massive ties in the fast path's sort): the
    O(V log V) law equals the reference loop (numpy, chunked) and SpS's law is q itself."""
    V = 4000
    rng = np.random.default_rng(5)
    q = dirichlet(rng, V, 0.5)
    block = rng.integers(0, 3, V)
    p = q * np.array([0.5, 1.0, 2.0])[block]
    p /= p.sum()
    np.testing.assert_allclose(ct.induced_distribution(ct.SpS(), p, q), q, atol=1e-14)
    rule, delta = ct.Cactus(0.2), 0.2
    # reference, vectorised over candidates only: h for candidate n is s_n q off n and gamma_n at n
    gamma = np.clip(q + np.sqrt(2 * delta * q * (1 - q)), q, 1.0)
    s = (1 - gamma) / (1 - q)
    phi = np.minimum(1, gamma / p)
    law = p * phi
    for lo in range(0, V, 500):
        n = np.arange(lo, min(lo + 500, V))
        H = s[n, None] * q[None, :]
        H[np.arange(n.size), n] = gamma[n]
        R = np.maximum(H - p[None, :], 0)
        law += ((p[n] * (1 - phi[n]))[:, None] * R / R.sum(1, keepdims=True)).sum(0)
    assert len(np.unique(np.round(p / q, 12))) == 3
    np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law, atol=1e-12)


def test_fly_never_defers_a_token_the_verifier_excludes():
    """FLy with an open gate and q_n = 0 where p_n > 0: native SpS rejects such a token and FLy must not
    defer it (vLLM's ``q_n > 0`` condition): accept probability 0 there, law against a loop reference."""
    q = np.array([0.3, 0.25, 0.0, 0.25, 0.2, 0.0])
    p = np.array([0.1, 0.1, 0.3, 0.1, 0.2, 0.2])  # 0.5 of the draft's mass on tokens with q = 0
    rule = ct.FLy(0.3, 3, 0.7)
    assert rule.top_entropy(q) >= 0.3  # the gate is open

    def ref(p, q, n, gate_zero=False):
        a = min(1.0, q[n] / p[n])
        phi = a + (1 - a) * 0.7 * (q[n] > 0 or gate_zero)
        r = np.maximum(q - p, 0.0)
        return phi, r / r.sum()

    np.testing.assert_array_equal(rule.accept_prob_all(p, q)[[2, 5]], 0.0)
    law = ct.induced_distribution(rule, p, q)
    np.testing.assert_allclose(law, ref_law(ref, p, q), atol=1e-14)
    assert law[2] == law[5] == 0.0  # a token the verifier excludes is never emitted
    # deferring there too (the wrong port) would emit them with probability 0.7 * 0.5
    assert ct.tv(law, ref_law(lambda p, q, n: ref(p, q, n, True), p, q)) == pytest.approx(0.35)


def test_sglang_threshold_single_below_threshold_acc_ties():
    """t_single < t_acc with q_n exactly at t_single: SGLang's kernel accepts (q_n >= t_single). Only
    there do >= and > differ (with t_single >= t_acc, q_n = t_single already gives q_n / t_acc >= 1)."""
    V = 4
    q = np.array([0.25, 0.5, 0.125, 0.125])
    rng = np.random.default_rng(2)
    for ts, ta in [(0.25, 0.5), (0.125, 0.5), (0.125, 0.25), (0.5, 0.75)]:
        rule = ct.SGLangThreshold(ts, ta)
        p = dirichlet(rng, V)

        def ref(p, q, n, ts=ts, ta=ta):
            phi = 1.0 if q[n] >= ts else min(1.0, q[n] / ta)
            r = q.copy()
            r[n] = 0
            return phi, r / r.sum()

        A = np.array([ref(p, q, n)[0] for n in range(V)])
        np.testing.assert_array_equal(rule.accept_prob_all(p, q), A)
        np.testing.assert_allclose(ct.induced_distribution(rule, p, q), ref_law(ref, p, q), atol=1e-14)
        assert any(q[n] == ts and q[n] / ta < 1 for n in range(V))  # a tie the strict test would reject


def test_sglang_sampled_law_at_a_tie():
    """verify's tokens for SGLang(t_single = 0.25 < t_acc = 0.5) at a tie follow the exact law; the strict
    port's law is computed, its distance asserted, and the sample size gives power >= 1 - BETA against it."""
    V = 4
    q = np.array([0.25, 0.5, 0.125, 0.125])
    p = np.array([0.7, 0.1, 0.1, 0.1])
    rule = ct.SGLangThreshold(0.25, 0.5)
    law = ct.induced_distribution(rule, p, q)

    def strict(p, q, n):  # the wrong port: q_n > t_single
        phi = 1.0 if q[n] > 0.25 else min(1.0, q[n] / 0.5)
        r = q.copy()
        r[n] = 0
        return phi, r / r.sum()

    far = ct.tv(law, ref_law(strict, p, q))
    assert far >= 0.1
    N = samples_needed(far, categories=V, alpha=ALPHA, beta=BETA)
    g = torch.Generator().manual_seed(3)
    n = torch.multinomial(torch.from_numpy(p).expand(N, V), 1, generator=g)
    P = torch.from_numpy(p).expand(N, 1, V)
    Q = torch.from_numpy(q).expand(N, 2, V)
    tokens, _ = verify(n, P, Q, rule, generator=g)
    res = goodness_of_fit(tokens[:, 0].numpy(), law, alpha=ALPHA, kind="samples")
    assert not res.reject, res


def test_medusa_entropy_epsilon_matters_at_large_vocab():
    """Medusa's entropy is -sum q log(q + 1e-5): at V = 5,000 that moves tau(q) enough to flip tokens.
    Acceptance against a numpy reference on a draft that puts half its mass on the flipped tokens."""
    V = 5000
    rng = np.random.default_rng(0)
    q = dirichlet(rng, V, 1.0)
    H = -np.sum(q * np.log(q + 1e-5))
    H0 = -np.sum(q * np.log(q))
    tau, tau0 = min(0.09, 0.3 * math.exp(-H)), min(0.09, 0.3 * math.exp(-H0))
    flipped = (q > tau0) & (q <= tau)
    assert flipped.sum() >= 10
    p = 0.5 * dirichlet(rng, V, 1.0) + 0.5 * flipped / flipped.sum()
    A = (q > tau).astype(float) * (p > 0)
    got = ct.MedusaTypical(0.09, 0.3).accept_prob_all(p, q)
    np.testing.assert_array_equal(got, A)
    assert np.sum(p * np.abs(A - (q > tau0))) >= 0.5  # what dropping the 1e-5 would change


def test_medusa_is_strict_at_a_tie():
    """q_n exactly at tau = epsilon is rejected (Medusa: q_n > tau)."""
    q = np.array([0.82, 0.09, 0.09])
    p = np.full(3, 1 / 3)
    rule = ct.MedusaTypical(0.09, 0.3)
    assert 0.3 * math.exp(np.sum(q * np.log(q + 1e-5))) > 0.09  # so tau = epsilon = 0.09 exactly
    np.testing.assert_array_equal(rule.accept_prob_all(p, q), [1.0, 0.0, 0.0])


def ref_descending_rank(q):
    """rank_n = #{i: q_i > q_n} + #{i < n: q_i = q_n}, by a plain Python sort on the key (-q_i, i)."""
    rank = np.empty(len(q), dtype=np.int64)
    for r, i in enumerate(sorted(range(len(q)), key=lambda i: (-float(q[i]), i))):
        rank[i] = r
    return rank


def test_relaxed_ties_at_large_vocab():
    """RelaxedAcceptance's top_k ids at V = 4,000 with exact ties everywhere (q takes 4 values) and the
    cut inside a tie group: its rank is the documented stable order (value descending, then lower id),
    in numpy and torch, row by row. A vocabulary this large is where an unstable sort (numpy's
    introsort, torch's default sort) reorders tied ids; at V = 8 both happen to keep them in order."""
    V = 4000
    rng = np.random.default_rng(5)
    q = rng.integers(1, 5, size=(3, V)).astype(np.float64)
    q /= q.sum(-1, keepdims=True)
    p = dirichlet(rng, V, 1.0, size=3)
    ranks = np.stack([ref_descending_rank(row) for row in q])
    np.testing.assert_array_equal(ct.rules.descending_rank(q), ranks)
    np.testing.assert_array_equal(ct.rules.descending_rank(torch.from_numpy(q)).numpy(), ranks)
    for topk in (700, 1500):
        kth = np.sort(q, axis=-1)[:, ::-1][:, topk - 1]
        assert ((q == kth[:, None]).sum(-1) > 100).all()  # the cut falls inside a large tie group
        want = (ranks < topk).astype(float)  # delta = 1: the rank test alone
        rule = ct.RelaxedAcceptance(topk, 1.0)
        np.testing.assert_array_equal(rule.accept_prob_all(p, q), want)
        np.testing.assert_array_equal(rule.accept_prob_all(torch.from_numpy(p), torch.from_numpy(q)).numpy(), want)
        assert (want.sum(-1) == topk).all()


def test_eval_cache_never_reuses_a_row_of_an_earlier_revision(tmp_path):
    """A batch cached by a run under the rule's earlier law (revision 1: folder named after
    sha256(repr), record keyed by repr, as the eval cache was written before revisions) is recomputed,
    never returned as the current rule's; a batch of the current revision is reused. The old layout is
    written out by hand here, not through the library's Method / _Cache."""
    import hashlib
    import json

    from cactus_theory.lm.experiments import eval as ev

    cfg = ev.EvalConfig(problems=2, batch_size=1)
    cache = ev._Cache(tmp_path, cfg)
    for label, rule in [("Medusa typical", ct.MedusaTypical()), ("relaxed", ct.RelaxedAcceptance()),
                        ("SGLang", ct.SGLangThreshold(0.0, 0.5))]:
        assert rule.revision >= 2
        method = ev.Method(label, ct.registry.spec(rule).key, {}, rule)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
        old_dir = tmp_path / cfg.key() / f"{safe[:48]}-{hashlib.sha256(repr(rule).encode()).hexdigest()[:8]}"
        old_dir.mkdir(parents=True)
        (old_dir / "b0000.json").write_text(json.dumps({"rule": repr(rule), "seconds": 1.0, "records": ["r1"]}))
        calls = []

        def compute(rule=rule, calls=calls):
            calls.append(1)
            return {"rule": f"{rule!r}@r{rule.revision}", "seconds": 2.0, "records": ["now"]}

        got, hit = cache.get(method, 0, compute)
        assert not hit and calls == [1] and got["records"] == ["now"], label  # the r1 row is not reused
        got, hit = cache.get(method, 0, compute)
        assert hit and calls == [1] and got["records"] == ["now"], label  # the current row is


def test_multi_draft_with_zeros_in_p_against_brute_force():
    """Tokens the draft never proposes (p_i = 0) against every token set, K = 1..3."""
    rng = np.random.default_rng(4)
    for _ in range(6):
        V = 6
        p, h = dirichlet(rng, V), dirichlet(rng, V)
        p[rng.choice(V, 2, replace=False)] = 0
        p /= p.sum()
        for K in (1, 2, 3):
            best = min(h[list(S)].sum() + 1 - p[list(S)].sum() ** K
                       for m in range(V + 1) for S in itertools.combinations(range(V), m))
            assert multi_draft_acceptance(p, h, K).value == pytest.approx(best, abs=1e-12)


# -- sampler.verify and verify_flat, token for token -----------------------------------------------------


@pytest.mark.parametrize("rule,ref", [(ct.SpS(), ref_sps), (ct.Cactus(0.4), ref_cactus(0.4))], ids=["sps", "cactus"])
def test_verify_token_for_token(rule, ref):
    """verify draws one [B, k + 1] block of uniforms: column j accepts position j, column k draws the
    recovered or bonus token. The reference loop with those uniforms emits the same tokens."""
    B, k, V = 300, 3, 6
    rng = np.random.default_rng(7)
    P, Q = dirichlet(rng, V, size=(B, k)), dirichlet(rng, V, size=(B, k + 1))
    n = np.array([[rng.choice(V, p=P[b, j]) for j in range(k)] for b in range(B)])
    tokens, acc = verify(torch.from_numpy(n), torch.from_numpy(P), torch.from_numpy(Q), rule,
                         generator=torch.Generator().manual_seed(9))
    u = torch.rand((B, k + 1), generator=torch.Generator().manual_seed(9), dtype=torch.float64).numpy()
    for b in range(B):
        toks = ref_block(ref, list(n[b]), P[b], Q[b], u[b], ref_draw(Q[b, k], u[b, k]))
        assert tokens[b].tolist() == toks + [-1] * (k + 1 - len(toks)), b
    assert 0 < int((acc == k).sum()) < B and int((acc == 0).sum()) > 0


def _ragged_batch(seed, V=6, one_hot=False):
    """Counts with empty requests and rejected rows shorter than the batch maximum; padded drafts; q_0 > 0."""
    rng = np.random.default_rng(seed)
    counts = [4, 1, 0, 2, 3, 1, 0, 2, 4, 1] * 6
    T = sum(counts)
    Qf = dirichlet(rng, V, size=T)
    Pf = None if one_hot else dirichlet(rng, V, size=T)
    ids = np.array([rng.choice(V, p=(Qf[t] if one_hot else Pf[t])) for t in range(T)])
    ids[rng.random(T) < 0.1] = -1  # padded drafts
    bonus = rng.integers(0, V, len(counts))
    return counts, ids, Pf, Qf, bonus


def _flat(counts, ids, Pf, Qf, bonus, rule, gens, **kw):
    return verify_flat(torch.from_numpy(ids), torch.tensor(np.cumsum(counts)), None if Pf is None else torch.from_numpy(Pf),
                       torch.from_numpy(Qf), torch.from_numpy(bonus).reshape(-1, 1), rule, gens, **kw)


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("rule,ref", [(ct.SpS(), ref_sps), (ct.Cactus(0.4), ref_cactus(0.4))], ids=["sps", "cactus"])
def test_verify_flat_token_for_token(rule, ref, one_hot):
    """Every request seeded: verify_flat's tokens are the reference's, and each generator has advanced by
    exactly n_b + 1 draws (the next step of a request does not depend on this step's batch)."""
    counts, ids, Pf, Qf, bonus = _ragged_batch(1, one_hot=one_hot)
    seeds = {b: 100 + b for b, c in enumerate(counts)}
    gens = {b: torch.Generator().manual_seed(s) for b, s in seeds.items()}
    out = _flat(counts, ids, Pf, Qf, bonus, rule, gens).numpy()
    ref_gens = {b: torch.Generator().manual_seed(s) for b, s in seeds.items()}
    expect = ref_verify_flat(ref, ids, counts, Pf, Qf, bonus, ref_gens)
    np.testing.assert_array_equal(out, expect)
    for b in seeds:  # the generators are left where the reference left them
        assert torch.equal(torch.rand(2, generator=gens[b]), torch.rand(2, generator=ref_gens[b])), b
    K = max(counts)
    emitted = (out != PLACEHOLDER_TOKEN_ID).sum(1)
    short_rejected = [b for b, c in enumerate(counts) if 0 < c < K and emitted[b] <= c]
    assert len(short_rejected) >= 5  # rejected rows with fewer drafts than the batch maximum
    assert any(ids[sum(counts[:b]) + emitted[b] - 1] == -1 for b in short_rejected)  # padded rejections too


def test_seeded_request_does_not_depend_on_the_batch():
    """A seeded request with fewer drafts than the batch maximum, rejected: its tokens are the same alone,
    in a batch of longer requests, and with max_spec_len larger than any draft."""
    V = 5
    q = np.array([[0.1, 0.2, 0.3, 0.2, 0.2], [0.3, 0.3, 0.2, 0.1, 0.1]])
    p = np.array([[0.6, 0.1, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1, 0.6]])
    rng = np.random.default_rng(0)
    other_q, other_p = dirichlet(rng, V, size=4), dirichlet(rng, V, size=4)
    runs = []
    for seed in range(40):
        outs = []
        for layout in ("alone", "first", "last", "wide"):
            if layout in ("alone", "wide"):
                counts, Qf, Pf, ids = [2], q, p, np.array([0, 4])
            elif layout == "first":
                counts, Qf, Pf, ids = [2, 4], np.concatenate([q, other_q]), np.concatenate([p, other_p]), np.array([0, 4, 1, 2, 3, 4])
            else:
                counts, Qf, Pf, ids = [4, 2], np.concatenate([other_q, q]), np.concatenate([other_p, p]), np.array([1, 2, 3, 4, 0, 4])
            me = 0 if layout != "last" else 1
            with torch.random.fork_rng():
                torch.manual_seed(1000 + seed + len(outs))  # the unseeded request draws from the default generator
                out = _flat(counts, ids, Pf, Qf, np.zeros(len(counts), dtype=np.int64), ct.Cactus(0.3),
                            {me: torch.Generator().manual_seed(seed)}, max_spec_len=7 if layout == "wide" else None)
            outs.append(out[me, :3].tolist())
        assert all(o == outs[0] for o in outs), (seed, outs)
        runs.append(outs[0])
    assert sum(r[0] != 0 or r[1] != 4 for r in runs) >= 10  # most runs reject one of the two drafts


def test_padded_draft_recovers_from_q_law():
    """A padded (-1) draft with q_0 > 0 and one-hot drafts: the recovered token follows q. The port that
    recovers from SpS's residual (q - e_0)_+ instead is at TV 0.4 from q; N gives power >= 1 - BETA."""
    q = np.array([0.4, 0.3, 0.2, 0.1])
    wrong = np.maximum(q - np.eye(4)[0], 0)
    far = ct.tv(q, wrong / wrong.sum())
    assert far == pytest.approx(0.4)
    N = samples_needed(far, categories=4, alpha=ALPHA, beta=BETA)
    for rule in (ct.SpS(), ct.Cactus(0.2)):
        out = verify_flat(torch.full((N,), -1, dtype=torch.int32), torch.arange(1, N + 1), None,
                          torch.from_numpy(q).expand(N, 4).contiguous(), torch.zeros((N, 1), dtype=torch.long), rule,
                          generator=torch.Generator().manual_seed(2))
        assert (out[:, 1] == PLACEHOLDER_TOKEN_ID).all()
        res = goodness_of_fit(out[:, 0].numpy(), q, alpha=ALPHA, kind="samples")
        assert not res.reject, (rule, res)


# -- integrations ----------------------------------------------------------------------------------------


def test_vllm_rule_from_spec_converts_values():
    from cactus_theory.integrations.vllm import rule_from_spec

    assert rule_from_spec("cactus:delta=0.5") == ct.Cactus(0.5)
    assert rule_from_spec('{"rule": "tas", "epsilon": "0.2", "alpha": 0.4}') == ct.TAS(0.2, 0.4)
    assert rule_from_spec({"rule": "topk", "k": "3"}) == ct.TopK(3)
    with pytest.raises(ValueError, match="no parameter"):
        rule_from_spec("sps:delta=1")


def test_vllm_expand_batch_to_tokens_against_a_loop():
    from cactus_theory.integrations.vllm import expand_batch_to_tokens

    x = torch.tensor([0.5, -1.0, 2.0, -1.0])
    counts = [2, 0, 3, 1]
    cu = torch.tensor(np.cumsum(counts))
    got = expand_batch_to_tokens(x, cu, sum(counts), replace_from=-1.0, replace_to=7.0)
    expect = [7.0 if v == -1.0 else v for v, c in zip(x.tolist(), counts, strict=True) for _ in range(c)]
    assert got.tolist() == expect
    assert expand_batch_to_tokens(x, cu, sum(counts)).tolist() == [0.5, 0.5, 2.0, 2.0, 2.0, -1.0]


def test_vllm_rejection_sample_against_the_contract():
    """Mixed greedy and seeded random requests (rejected rows shorter than the batch maximum): greedy ones
    accept while the draft is the target's argmax, then emit it (whatever the rule); random ones are the
    verify_flat reference on softmax(logits) with their own generators."""
    from cactus_theory.integrations.vllm import rejection_sample

    V = 6
    rng = np.random.default_rng(8)
    counts = [3, 1, 2, 3, 0, 2, 1, 3, 2] * 8
    B, T = len(counts), sum(counts)
    greedy = np.array([b % 2 == 0 for b in range(B)])
    logits = torch.from_numpy(rng.normal(size=(T, V)) * 1.5).float()
    probs = logits.softmax(-1, dtype=torch.float32).double().numpy()
    ids = np.array([rng.choice(V, p=probs[t] / probs[t].sum()) if rng.random() < 0.8 else int(np.argmax(probs[t])) for t in range(T)])
    bonus = rng.integers(0, V, B)
    # on a one-hot (greedy) target Interpolation(0.5) would accept a non-argmax draft half the time; on
    # the random rows its acceptance 0.5 + 0.5 q_n reads q_n's scale (so q must be normalised)
    rule = ct.Interpolation(0.5)

    def ref(p, q, n):
        r = np.maximum(q - p, 0.0)
        return min(1.0, 0.5 + 0.5 * q[n] / p[n]), (r / r.sum() if r.sum() > 0 else q)

    meta = SimpleNamespace(all_greedy=False, all_random=False,
                           temperature=torch.tensor([0.0 if g else 0.8 for g in greedy]),
                           generators={b: torch.Generator().manual_seed(50 + b) for b in range(B) if not greedy[b]})
    out = rejection_sample(torch.from_numpy(ids).int(), counts, max(counts), torch.tensor(np.cumsum(counts)).int(),
                           None, logits, torch.from_numpy(bonus).reshape(-1, 1), meta, rule=rule).numpy()
    gens = {b: torch.Generator().manual_seed(50 + b) for b in range(B)}
    expect = ref_verify_flat(ref, ids, counts, None, probs, bonus, gens)
    s = off_argmax = 0
    for b, c in enumerate(counts):
        if greedy[b]:
            toks = []
            for j in range(c):
                top = int(np.argmax(probs[s + j]))
                toks.append(top)
                if ids[s + j] != top:
                    break
            else:
                toks.append(int(bonus[b]))
            expect[b] = toks + [PLACEHOLDER_TOKEN_ID] * (max(counts) + 1 - len(toks))
            off_argmax += c > 0 and ids[s] != toks[0]
        s += c
    np.testing.assert_array_equal(out, expect)
    assert ((out != PLACEHOLDER_TOKEN_ID).sum(1) <= np.array(counts))[~greedy].sum() >= 5  # random rejections
    assert off_argmax >= 8  # greedy rows whose first draft Interpolation(0.5) would accept with probability 1/2


def test_transformers_speculative_sampling_against_the_reference():
    """transformers' hook: p = softmax(candidate_logits), q = softmax(new_logits), the k candidates are
    the last k ids; tokens against the reference loop with verify's uniform layout."""
    from cactus_theory.integrations.transformers import speculative_sampling

    V, k, L = 6, 3, 4
    rng = np.random.default_rng(9)
    rule, ref = ct.Cactus(0.3), ref_cactus(0.3)
    rejected = 0
    for seed in range(150):
        cand = torch.from_numpy(rng.normal(size=(1, k, V))).float()
        new = torch.from_numpy(rng.normal(size=(1, k + 1, V))).float()
        p = cand.softmax(-1).double().numpy()[0]
        q = new.softmax(-1).double().numpy()[0]
        drafts = [int(rng.choice(V, p=p[j] / p[j].sum())) for j in range(k)]
        ids = torch.tensor([[int(x) for x in rng.integers(0, V, L)] + drafts])
        toks, a = speculative_sampling(rule, ids, cand, k, new, generator=torch.Generator().manual_seed(seed))
        u = torch.rand((1, k + 1), generator=torch.Generator().manual_seed(seed), dtype=torch.float64).numpy()[0]
        expect = ref_block(ref, drafts, p, q, u, ref_draw(q[k], u[k]))
        assert toks[0].tolist() == expect and int(a) == len(expect) - 1, seed
        rejected += int(a) < k
    assert rejected >= 30
