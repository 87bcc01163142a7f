"""Lossy rules shipped or published since the last port (issue 27, items 4 and 6), one position each.

* ``EntropyVerify``: vLLM-Ascend's ``enable_entropy_verify`` (accept iff ``q_n / p_n >= min(threshold, exp(-alpha
  H(q))) u``; recovery ``(q - p)_+``), pinned against a port of vLLM-Ascend's decision (exponential-race recovery).
* ``Lenience``, ``MinP``, ``Eta``: the rules "Revisiting Lossy Verification in Speculative Decoding" compares
  (ZhouYuxuanYX/Fast-HSD); ``Lenience``'s law against the paper's own closed form (Eq. 7, ``lenience_yield_distribution``
  re-derived here), CoS against ``Ensemble`` (the convex mixture).
* ``FSD``: Fuzzy Speculative Decoding (maxholsman/fsd), a test on the pair of rows (``reads_draft_row``), checked in
  ``verify`` and ``verify_flat`` (one-hot drafts included).

Each rule against ``theory/reference.py`` (plain loops from the upstream formulas), by hypothesis over every case kind;
closed forms by hand. Statistical tests: each ``check_sampler`` call is a family at level ALPHA = 1e-3 (Holm over its
parts), seeded, sized to detect a pooled TV of 0.05 with power 0.9 (``check_sampler``'s sizing); an alternative asserted
rejected has its TV from the rule's law asserted above 0.05 first.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import entropy as kl_scipy

import cactus_theory as ct
from cactus_theory.rules import fsd_divergence
from cactus_theory.sampler import verify, verify_flat
from cactus_theory.theory.check import block_law, check_sampler
from tests.core.test_verify_flat import flat_sampler
from tests.helpers import assert_step_matches_reference, cases

ALPHA, TV = 1e-3, 0.05
RULES = [ct.EntropyVerify(), ct.EntropyVerify(0.5, 2.0), ct.EntropyVerify(1.0, 0.0), ct.Lenience(0.3),
         ct.Lenience(1.0), ct.MinP(0.4), ct.MinP(0.0), ct.MinP(1.0), ct.Eta(0.2), ct.Eta(0.2, 0.45, True),
         ct.FSD(0.3), ct.FSD(0.5, "kl_div"), ct.FSD(0.2, "tv_div"), ct.FSD(0.0)]


def _rows(seed, k=2, V=8, conc=0.7):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, conc), size=k), rng.dirichlet(np.full(V, conc), size=k + 1)


def running(rule):
    """``verify`` that always runs ``rule``, whatever law ``check_sampler`` judges it against."""
    def sampler(draft_tokens, draft_probs, verifier_probs, judged_against=None, generator=None):
        return verify(draft_tokens, draft_probs, verifier_probs, rule, generator=generator)

    return sampler


@pytest.mark.parametrize("rule", RULES, ids=repr)
@given(case=cases(max_V=10))
def test_rules_match_the_independent_reference(rule, case):
    """phi_n, g_n (numpy and torch) and the one-step law (generic and default paths) equal reference.py's."""
    p, q, n = case
    assert_step_matches_reference(rule, p, q, n)


# -- vLLM-Ascend entropy verification ---------------------------------------------------------------------------

@given(case=cases(max_V=10), thr=st.sampled_from([0.3, 0.95, 1.0]), alpha=st.sampled_from([0.0, 0.4, 3.0]))
def test_entropy_verify_law_in_closed_form(case, thr, alpha):
    """``h_alg = p min(1, q / (c p)) + R (q - p)_+ / TV(p, q)``, ``c = min(thr, exp(-alpha H))``, ``H = -sum q log(q +
    1e-10)``, ``R`` the rejected mass; ``alpha = 0`` is ``Lenience(thr)``; ``thr = 1, alpha = 0`` is SpS (law q)."""
    p, q, _ = case
    rule = ct.EntropyVerify(thr, alpha)
    H = -sum(x * math.log(x + 1e-10) for x in q if x > 0)
    c = min(thr, math.exp(-alpha * H))
    phi = np.where(p > 0, np.minimum(1.0, q / (c * np.where(p > 0, p, 1.0))), 0.0)
    R = float(np.sum(p * (1 - phi)))
    r = np.maximum(q - p, 0.0)
    law = p * phi + (R * r / r.sum() if r.sum() > 0 else 0.0)
    np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law, rtol=0, atol=1e-12)
    assert float(ct.acceptance_rate(rule, p, q)) >= float(ct.acceptance_rate(ct.SpS(), p, q)) - 1e-12
    if alpha == 0:
        np.testing.assert_allclose(ct.induced_distribution(rule, p, q), ct.induced_distribution(ct.Lenience(thr), p, q),
                                   rtol=0, atol=1e-12)
    if alpha == 0 and thr == 1:
        np.testing.assert_allclose(ct.induced_distribution(rule, p, q), q, rtol=0, atol=1e-12)


def ascend_sampler(threshold=0.95, alpha=0.4):
    """vLLM-Ascend's standard rejection path with ``ENTROPY_VERIFY`` (``rejection_random_sample_pytorch`` @ 182b75e),
    re-written here from its reading: float32 rows, ``threshold_i = min(exp(-alpha H_i), posterior_threshold)`` with
    ``H_i = -sum q log(q + 1e-10)``, accept iff ``p_n > 0 and q_n / p_n >= threshold_i u_i``, stop at the first
    rejection, which emits ``argmax((q - p)_+ / E)`` with ``E`` i.i.d. unit exponentials (vLLM's race); the bonus
    is a sample of the last row."""
    def sampler(draft_tokens, draft_probs, verifier_probs, rule=None, generator=None):
        B, k = draft_tokens.shape
        P, Q = draft_probs.float(), verifier_probs.float()
        n = draft_tokens.long()
        p_n = P.gather(-1, n[..., None])[..., 0]
        q_n = Q[:, :k].gather(-1, n[..., None])[..., 0]
        H = -(Q[:, :k] * torch.log(Q[:, :k] + 1e-10)).sum(-1)
        thr = torch.minimum(torch.exp(-H * alpha), torch.tensor(threshold, dtype=torch.float32))
        u = torch.rand((B, k), generator=generator, dtype=torch.float64).float()
        ok = (p_n > 0) & (q_n / p_n >= thr * u)
        a = ok.long().cumprod(-1).sum(-1)
        out = torch.full((B, k + 1), -1, dtype=torch.long)
        E = torch.empty((B, Q.shape[-1])).exponential_(generator=generator)
        for b in range(B):
            j = int(a[b])
            out[b, :j] = n[b, :j]
            if j < k:
                out[b, j] = int(torch.argmax((Q[b, j] - P[b, j]).clamp_min(0) / E[b]))
            else:
                out[b, j] = int(torch.multinomial(Q[b, k], 1, generator=generator))
        return out, a

    return sampler


def test_entropy_verify_is_vllm_ascends_rule_by_sampling():
    """A port of vLLM-Ascend's decision emits ``EntropyVerify(0.95, 0.4)``'s exact block law (not rejected); SpS's
    law, at first-token TV > 0.05 from it (asserted), is rejected."""
    P, Q = _rows(11, conc=2.0)
    rule = ct.EntropyVerify(0.95, 0.4)
    assert 0.5 * np.abs(block_law(rule, P, Q).first() - block_law(ct.SpS(), P, Q).first()).sum() > TV
    port = ascend_sampler(0.95, 0.4)
    assert not check_sampler(port, P, Q, rule=rule, tv=TV, alpha=ALPHA, seed=2, parts=("first", "block")).reject
    assert check_sampler(port, P, Q, rule=ct.SpS(), tv=TV, alpha=ALPHA, seed=2, parts=("first", "block")).reject


@pytest.mark.parametrize("rule", [ct.EntropyVerify(0.95, 0.4), ct.Lenience(0.4), ct.MinP(0.3), ct.Eta(0.15, 0.4, True),
                                  ct.FSD(0.1)], ids=repr)
def test_sampled_law_in_verify_and_verify_flat(rule):
    """``verify`` and ``verify_flat`` emit the rule's exact block law (not rejected); SpS's law, at first-token TV >
    0.05 from it (asserted), is rejected."""
    P, Q = _rows(11, conc=2.0)
    assert 0.5 * np.abs(block_law(rule, P, Q).first() - block_law(ct.SpS(), P, Q).first()).sum() > TV
    for sampler in (verify, flat_sampler):
        res = check_sampler(sampler, P, Q, rule=rule, tv=TV, alpha=ALPHA, seed=3, parts=("first", "block"))
        assert not res.reject, res.table()
    assert check_sampler(running(rule), P, Q, rule=ct.SpS(), tv=TV, alpha=ALPHA, seed=3, parts=("first", "block")).reject


# -- Fast-HSD: lenience, CoS, the truncation configs ------------------------------------------------------------

@given(case=cases(max_V=10), ell=st.sampled_from([0.2, 0.4, 0.8, 1.0]))
def test_lenience_law_is_the_papers_eq7(case, ell):
    """Fast-HSD's closed form (``lenience_yield_distribution``, their letters swapped to ours): ``q_y / l`` where ``p_y
    >= q_y / l``; ``p_y`` where ``q_y < p_y < q_y / l``; ``D q_y + (1 - D) p_y`` where ``p_y <= q_y``, with ``D =
    (TV(p, q / l) + 1/2 - 1 / (2 l)) / TV(p, q)`` (``TV`` of the unnormalised ``q / l`` as they compute it)."""
    p, q, _ = case
    tv_pq = 0.5 * np.abs(p - q).sum()
    if tv_pq == 0:
        want = q
    else:
        D = (0.5 * np.abs(p - q / ell).sum() + 0.5 - 0.5 / ell) / tv_pq
        want = np.where(p <= q, D * q + (1 - D) * p, np.where(p >= q / ell, q / ell, p))
    np.testing.assert_allclose(ct.induced_distribution(ct.Lenience(ell), p, q), want, rtol=0, atol=1e-12)


@given(case=cases(max_V=10), lam=st.sampled_from([0.0, 0.2, 0.6, 1.0]))
def test_cos_is_ensemble(case, lam):
    """CoS (Fast-HSD's ``cos_accept_prob``: ``(lam p + (1 - lam) q) / q`` clipped at 1 in their letters; yield the convex
    mixture ``lam p + (1 - lam) q``) is ``Ensemble(lam)``: the same acceptance of every token and the same law."""
    p, q, _ = case
    rule = ct.Ensemble(lam)
    with np.errstate(divide="ignore", invalid="ignore"):
        acc = np.where(p > 0, np.minimum(1.0, (lam * q + (1 - lam) * p) / np.where(p > 0, p, 1.0)), 0.0)
    np.testing.assert_allclose(rule.accept_prob_all(p, q), acc, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ct.induced_distribution(rule, p, q), lam * q + (1 - lam) * p, rtol=0, atol=1e-12)


@given(case=cases(max_V=10), m=st.sampled_from([0.0, 0.3, 0.7, 1.0]), eps=st.sampled_from([0.05, 0.25, 1.0]))
def test_truncation_laws_in_closed_form(case, m, eps):
    """``MinP`` and ``Eta`` (deterministic): ``h_alg = sum_{n in A} p_n e_n + sum_{n not in A} p_n (q - q_n e_n) / (1 -
    q_n)`` with ``A = {q_n >= m max q}`` / ``{q_n >= min(eps, exp(-H(q)))}``; neither reads p (truncation)."""
    p, q, _ = case
    H = float(kl_scipy(q))
    for rule, A in ((ct.MinP(m), q >= m * q.max()), (ct.Eta(eps), q >= min(eps, math.exp(-H)))):
        law = np.zeros_like(q)
        for n in np.flatnonzero(p > 0):
            if A[n]:
                law[n] += p[n]
            else:
                rest = q.copy()
                rest[n] = 0
                law += p[n] * (rest / rest.sum() if rest.sum() > 0 else q)
        np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(rule.accept_prob_all(np.full_like(p, 1 / p.size), q), A.astype(float))


# -- FSD: the pair of rows ----------------------------------------------------------------------------------------

@given(case=cases(max_V=10), T=st.sampled_from([0.0, 0.1, 0.4, 2.0]))
def test_fsd_law_is_p_or_q(case, T):
    """The step's law is ``p`` where ``D(p, q) <= T`` and ``q`` elsewhere; ``D`` as FSD's code computes it (torch's
    ``kl_div(log a, b) = KL(b || a)``): KL(p || q), (KL(m || p) + KL(m || q)) / 2, TV (scipy's ``entropy`` here)."""
    p, q, _ = case
    m = (p + q) / 2
    ds = {"kl_div": kl_scipy(p, q), "js_div": 0.5 * kl_scipy(m, p) + 0.5 * kl_scipy(m, q),
          "tv_div": 0.5 * np.abs(p - q).sum()}
    for name, d in ds.items():
        assert float(fsd_divergence(p, q, name)) == pytest.approx(d, rel=1e-9, abs=1e-12) or (
            math.isinf(d) and math.isinf(float(fsd_divergence(p, q, name))))
        rule = ct.FSD(T, name)
        np.testing.assert_allclose(ct.induced_distribution(rule, p, q), p if d <= T else q, rtol=0, atol=1e-12)


def test_fsd_js_div_is_not_jensen_shannon():
    """FSD's "js_div" is ``(KL(m || p) + KL(m || q)) / 2``, not Jensen-Shannon ``(KL(p || m) + KL(q || m)) / 2``: the
    two differ, and FSD's is infinite where one row has a zero the other does not."""
    p, q = np.array([0.7, 0.3, 0.0]), np.array([0.2, 0.3, 0.5])
    assert math.isinf(float(fsd_divergence(p, q, "js_div"))) and float(ct.js(p, q)) < math.log(2)
    p2 = np.array([0.6, 0.3, 0.1])
    assert abs(float(fsd_divergence(p2, q, "js_div")) - float(ct.js(p2, q))) > 1e-3


def test_fsd_reads_the_draft_row_in_verify_flat_with_one_hot_drafts():
    """``verify_flat`` with ``draft_probs=None`` (one-hot drafts) judges FSD on the rows ``e_n``: with TV, ``TV(e_n, q) =
    1 - q_n <= T`` iff ``q_n >= 1 - T``; deterministic, so every request's count is checked."""
    q = torch.tensor([[0.7, 0.2, 0.1], [0.05, 0.9, 0.05], [0.3, 0.3, 0.4]], dtype=torch.float64)
    rule = ct.FSD(0.25, "tv_div")
    ids = torch.tensor([0, 0, 2], dtype=torch.int32)  # q_n = 0.7 (rejected: 0.3 > 0.25), 0.05 (rejected), 0.4 (rejected)
    ids2 = torch.tensor([0, 1, 2], dtype=torch.int32)  # 0.7 rejected, 0.9 accepted, 0.4 rejected
    cu = torch.tensor([1, 2, 3], dtype=torch.int32)
    bonus = torch.zeros((3, 1), dtype=torch.int32)
    for d, want in ((ids, [0, 0, 0]), (ids2, [0, 1, 0])):
        out = verify_flat(d, cu, None, q, bonus, rule, generator=torch.Generator().manual_seed(0))
        got = [int(out[b, 0] == d[b]) and int(out[b, 1] == 0) for b in range(3)]  # accepted: draft then the bonus 0
        assert got == want, (out, want)
        one_hot = torch.nn.functional.one_hot(d.long(), 3).double()
        np.testing.assert_array_equal(rule.accept_prob(one_hot, q, d.long()).numpy(), np.array(want, dtype=float))


def test_new_rules_validate_their_parameters():
    bad = [(ct.EntropyVerify, {"threshold": 0.0}, "threshold"), (ct.EntropyVerify, {"threshold": 1.5}, "threshold"),
           (ct.EntropyVerify, {"alpha": -1.0}, "alpha"), (ct.EntropyVerify, {"entropy_eps": float("nan")}, "entropy_eps"),
           (ct.Lenience, {"lenience": 0.0}, "lenience"), (ct.Lenience, {"lenience": 1.1}, "lenience"),
           (ct.MinP, {"min_p": -0.1}, "min_p"), (ct.Eta, {"epsilon": 0.0}, "epsilon"), (ct.Eta, {"delta": 0.0}, "delta"),
           (ct.Eta, {"soft": "yes"}, "soft"), (ct.FSD, {"threshold": -1.0}, "threshold"),
           (ct.FSD, {"divergence": "js"}, "divergence")]
    for cls, kw, name in bad:
        with pytest.raises((ValueError, TypeError), match=f"^{name}"):
            cls(**kw)
    assert ct.Eta(soft=1).soft is True and repr(ct.Eta(soft=np.bool_(False))) == "Eta(epsilon=0.1, delta=1.0, soft=False)"
    with pytest.raises(ValueError, match="reads the draft's whole row"):
        ct.FSD().stats_at(np.full((2, 3), 1 / 3), np.array([0, 1]))
