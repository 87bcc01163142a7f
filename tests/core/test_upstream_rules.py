"""Rules shipped upstream since the last port, and the authors' own code (issue 27, items 1, 2 and 7).

* ``Ensemble(w)``, transformers' ``assistant_ensemble_weight`` (DIVERSE): its exact law is its target
  ``h = w q + (1 - w) p`` (Theorem 1) and ``Interpolation(1 - w)``'s law; its recovery falls back to ``q`` where the
  residual sums to at most float32's tiny (transformers' own fallback; pinned against transformers' code in
  tests/integrations/test_transformers.py).
* ``SpS(rand_bits=b)``: transformers <= 5.24's ``r <= q_n / p_n`` with ``r`` on the grid ``m 2^-b``; a ``q_n = 0``
  draft is accepted with probability ``2^-b`` (pinned against transformers' code in tests/theory/test_check.py).
* ``convention="authors"`` on Cactus, TopK, Interpolation and TAS: MANGA-UOFA/Cactus @ 3b01b81 (a ``p_n = 0`` draft
  judged by the rule's own test; token 0 for an all-zero recovery row in ``cactus.py`` / ``topk.py`` / the Triton
  kernel; recovery weights floored at float32's tiny in ``interp.py``, vLLM 0.7.3's convention).

Each against ``theory/reference.py`` (plain numpy loops written from the upstream formulas, no shared code), by
hypothesis over every case kind; the degenerate cases by hand-built rows. Statistical tests: each
``check_sampler`` call is a family at level ALPHA = 1e-3 (Holm over its parts), seeded, designed to detect a pooled
TV of 0.05 with power 0.9 (``check_sampler``'s sizing); where an alternative is asserted rejected, its TV from the
rule's law is first asserted above 0.05.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import cactus_theory as ct
from cactus_theory.rules import FLOAT32_TINY
from cactus_theory.sampler import verify
from cactus_theory.theory.check import block_law, check_sampler
from tests.core.test_verify_flat import flat_sampler
from tests.helpers import assert_step_matches_reference, cases, fitted

ALPHA, TV = 1e-3, 0.05
AUTHORS = [ct.Cactus(0.3, convention="authors"), ct.TopK(2, "topk", "authors"), ct.TopK(2, convention="authors"),
           ct.Interpolation(0.4, convention="authors"), ct.TAS(convention="authors"),
           ct.TAS(entropy_eps=1e-5, convention="authors")]
NEW_RULES = [ct.Ensemble(0.3), ct.Ensemble(0.0), ct.Ensemble(1.0), ct.SpS(rand_bits=1), ct.SpS(rand_bits=2),
             ct.SpS(rand_bits=24), *AUTHORS]


def running(rule):
    """``verify`` that always runs ``rule``, whatever law ``check_sampler`` judges it against."""
    def sampler(draft_tokens, draft_probs, verifier_probs, judged_against=None, generator=None):
        return verify(draft_tokens, draft_probs, verifier_probs, rule, generator=generator)

    return sampler


def ours(rule):
    """The same rule with this library's conventions."""
    import dataclasses

    return dataclasses.replace(rule, convention="ours")


@pytest.mark.parametrize("rule", NEW_RULES, ids=repr)
@given(case=cases(max_V=10))
def test_new_rules_match_the_independent_reference(rule, case):
    """phi_n, g_n (numpy and torch) and the one-step law (generic and default paths) equal reference.py's."""
    p, q, n = case
    rule = fitted(rule, p.size)
    assert_step_matches_reference(rule, p, q, n)


def test_repr_and_identity_hide_only_the_default_options():
    """An option at its default leaves the repr (and every cache key built on it) as before the option existed."""
    assert repr(ct.SpS()) == "SpS()" and repr(ct.TAS()) == "TAS(epsilon=0.09, alpha=0.3, entropy_eps=0.0)"
    assert repr(ct.Cactus(1.0)) == "Cactus(delta=1.0, divergence='kl', solver='taylor')"
    assert repr(ct.TopK(3, "topk")) == "TopK(k=3, recovery='topk')" and repr(ct.Interpolation(0.5)) == \
        "Interpolation(alpha=0.5)"
    assert repr(ct.SpS(rand_bits=24)) == "SpS(rand_bits=24)" and ct.SpS(rand_bits=24) != ct.SpS()
    assert repr(ct.Cactus(1.0, convention="authors")).endswith("convention='authors')")
    assert ct.Cactus(1.0, convention="authors").identity != ct.Cactus(1.0).identity
    assert ct.registry.label(ct.TopK(2, convention="authors")) == "top-k k=2 convention=authors"


# -- Ensemble: transformers' assistant_ensemble_weight -----------------------------------------------------------

@given(case=cases(max_V=10), w=st.sampled_from([0.0, 0.05, 0.3, 0.7, 1.0]))
def test_ensemble_law_is_its_target_and_interpolations(case, w):
    """Theorem 1: ``h_alg = h = w q + (1 - w) p``; the same law and acceptance as ``Interpolation(1 - w)``."""
    p, q, _ = case
    rule = ct.Ensemble(w)
    h = ct.induced_distribution(rule, p, q)
    np.testing.assert_allclose(h, w * q + (1 - w) * p, rtol=0, atol=1e-12)
    interp = ct.Interpolation(1 - w)
    np.testing.assert_allclose(h, ct.induced_distribution(interp, p, q), rtol=0, atol=1e-12)
    np.testing.assert_allclose(rule.accept_prob_all(p, q), interp.accept_prob_all(p, q), rtol=0, atol=1e-12)
    assert float(ct.acceptance_rate(rule, p, q)) == pytest.approx(1 - w * ct.tv(p, q), abs=1e-12)


def test_ensemble_falls_back_to_q_where_the_residual_is_numerically_zero():
    """``Z = sum (q - p)_+`` in ``(0, FLOAT32_TINY]``: Ensemble recovers from ``q`` (transformers' fallback),
    Interpolation(1 - w) from the normalised residual; above it both normalise. Rows ``q = (.5, .5, a, 0)``,
    ``p = (.5, .5, 0, a)``: ``Z = a``, and draft 3 (drafted with probability ``a``) is rejected with probability w."""
    for a, fallback in ((1e-40, True), (FLOAT32_TINY, True), (1e-30, False), (1e-3, False)):
        q, p = np.array([0.5, 0.5, a, 0.0]), np.array([0.5, 0.5, 0.0, a])
        q, p = q / q.sum(), p / p.sum()
        assert float(ct.Ensemble(0.6).accept_prob(p, q, np.asarray(3))) == pytest.approx(0.4, abs=1e-12)
        g = ct.Ensemble(0.6).residual(p, q, np.asarray(3))
        np.testing.assert_array_equal(g, q if fallback else np.eye(4)[2])
        np.testing.assert_array_equal(ct.Interpolation(0.4).residual(p, q, np.asarray(3)), np.eye(4)[2])
        # the fallback has weight p_3 (1 - phi_3) = w a: the laws differ by at most w a <= w t in TV
        diff = np.abs(ct.induced_distribution(ct.Ensemble(0.6), p, q) - ct.induced_distribution(ct.Interpolation(0.4),
                                                                                                  p, q)).sum() / 2
        assert diff <= 0.6 * a * (1 + 1e-9) if fallback else diff <= 1e-15
    q = np.array([0.5, 0.5, 0.0, 0.0])  # Z = 0 (p = q): every draft accepted, the recovery row is q
    np.testing.assert_array_equal(ct.Ensemble(0.6).residual(q, q, np.asarray(0)), q)


def test_ensemble_sampled_law_in_verify_and_verify_flat():
    """``verify`` and ``verify_flat`` emit Ensemble(0.3)'s exact block law (not rejected); SpS's law, at first-token
    TV > 0.05 from it (asserted), is rejected."""
    P, Q = _rows(2)
    rule = ct.Ensemble(0.3)
    assert 0.5 * np.abs(block_law(rule, P, Q).first() - block_law(ct.SpS(), P, Q).first()).sum() > TV
    for sampler in (verify, flat_sampler):
        res = check_sampler(sampler, P, Q, rule=rule, tv=TV, alpha=ALPHA, seed=3, parts=("first", "block"))
        assert not res.reject, res.table()
    assert check_sampler(running(rule), P, Q, rule=ct.SpS(), tv=TV, alpha=ALPHA, seed=3, parts=("first", "block")).reject


def _rows(seed, k=2, V=8):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, 0.7), size=k), rng.dirichlet(np.full(V, 0.7), size=k + 1)


# -- SpS(rand_bits): transformers <= 5.24's r <= q_n / p_n --------------------------------------------------------

def _q0_rows():
    P, Q = _rows(7)
    Q[:, 0] = 0
    Q /= Q.sum(1, keepdims=True)
    P[:, 0] = 0.3
    P /= P.sum(1, keepdims=True)
    return P, Q


@given(case=cases(max_V=10), bits=st.sampled_from([1, 2, 3, 10]))
def test_sps_rand_bits_exact_law(case, bits):
    """``phi_n = #{m : m 2^-b <= q_n / p_n} / 2^b`` (counted), the recovery SpS's ``(q - p)_+``: the law
    ``sum_n p_n phi_n e_n + R (q - p)_+ / TV(p, q)``, ``R = sum_n p_n (1 - phi_n)``; it puts exactly
    ``2^-b sum_{q_n = 0} p_n`` outside q's support, and accepts at most ``2^-b`` more than SpS."""
    p, q, _ = case
    rule = ct.SpS(rand_bits=bits)
    grid = np.arange(2**bits) / 2.0**bits
    phi = np.array([np.count_nonzero(grid <= q[n] / p[n]) / 2.0**bits if p[n] > 0 else 0.0 for n in range(p.size)])
    np.testing.assert_allclose(rule.accept_prob_all(p, q), phi, rtol=0, atol=1e-15)
    r = np.maximum(q - p, 0)
    R = float(np.sum(p * (1 - phi)))
    law = p * phi + (R * r / r.sum() if r.sum() > 0 else 0.0)
    h = ct.induced_distribution(rule, p, q)
    np.testing.assert_allclose(h, law, rtol=0, atol=1e-12)
    assert float(h[q == 0].sum()) == pytest.approx(2.0**-bits * p[q == 0].sum(), abs=1e-15)
    extra = float(ct.acceptance_rate(rule, p, q) - ct.acceptance_rate(ct.SpS(), p, q))
    assert -1e-15 <= extra <= 2.0**-bits + 1e-15


def test_sps_rand_bits_sampled_law_in_verify_and_verify_flat():
    """A 2-bit grid (a q = 0 draft accepted with probability 1/4): ``verify`` and ``verify_flat`` emit
    SpS(rand_bits=2)'s law; SpS's law (first-token TV > 0.05 from it, asserted) is rejected."""
    P, Q = _q0_rows()
    rule = ct.SpS(rand_bits=2)
    assert 0.5 * np.abs(block_law(rule, P, Q).first() - block_law(ct.SpS(), P, Q).first()).sum() > TV
    for sampler in (verify, flat_sampler):
        res = check_sampler(sampler, P, Q, rule=rule, tv=TV, alpha=ALPHA, seed=4, parts=("first", "block"))
        assert not res.reject, res.table()
    assert check_sampler(running(rule), P, Q, rule=ct.SpS(), tv=TV, alpha=ALPHA, seed=4, parts=("first", "block")).reject


def test_sps_rand_bits_validation():
    for bad in (0, 54, -1, 1.5, True, "24"):
        with pytest.raises(ValueError, match="^rand_bits must be"):
            ct.SpS(rand_bits=bad)
    assert ct.SpS(rand_bits=np.int64(24)).rand_bits == 24 and type(ct.SpS(rand_bits=np.int64(24)).rand_bits) is int


# -- convention="authors": MANGA-UOFA/Cactus -----------------------------------------------------------------------

def _zero_draft_row():
    """p with p_2 = 0 where q_2 > 0, and p_3 = q_3 = 0."""
    p = np.array([0.5, 0.3, 0.0, 0.0, 0.2])
    q = np.array([0.2, 0.2, 0.4, 0.0, 0.2])
    return p, q


@pytest.mark.parametrize("rule", AUTHORS, ids=repr)
def test_authors_convention_judges_a_zero_draft_by_the_test(rule):
    """A drafted token with ``p_n = 0``: the authors' code accepts it iff its test passes (``h_n / 0 = inf``: iff
    ``h_n > 0``; TAS and top-k never read p), ours never; ``verify`` follows each (phi is 0 or 1: deterministic)."""
    p, q = _zero_draft_row()
    # token 2: q_2 = 0.4 is q's largest (top-2; above TAS's threshold 0.09; h_2 >= (1 - alpha) q_2 > 0): accepted;
    # token 3: q_3 = 0 (not in the top set: q_(2) = 0.2; below the threshold; h_3 = 0, 0 / 0 is NaN): rejected
    for n, want in ((2, 1.0), (3, 0.0)):
        assert float(rule.accept_prob(p, q, np.asarray(n))) == want, (n, want)
        assert float(ours(rule).accept_prob(p, q, np.asarray(n))) == 0.0
        B = 64
        P = torch.from_numpy(np.tile(p, (B, 1, 1)))
        Q = torch.from_numpy(np.tile(q, (B, 2, 1)))
        for r, accepted in ((rule, want), (ours(rule), 0.0)):
            _, a = verify(torch.full((B, 1), n), P, Q, r, generator=torch.Generator().manual_seed(0))
            assert (a == int(accepted)).all(), (r, n)
    assert any(float(r.accept_prob(p, q, np.asarray(2))) == 1.0 for r in AUTHORS)  # some convention accepts one


@pytest.mark.parametrize("rule", AUTHORS, ids=repr)
@given(case=cases(max_V=10))
def test_authors_convention_keeps_the_one_step_law(rule, case):
    """Drafts from p never have p_n = 0, and a rejection of a p_n > 0 draft never meets an empty residual: the
    authors' conventions leave ``h_alg`` and the acceptance rate exactly ours (Interpolation's floor: within
    ``V * FLOAT32_TINY``, below float64's resolution of these sums)."""
    p, q, _ = case
    rule = fitted(rule, p.size)
    np.testing.assert_allclose(ct.induced_distribution(rule, p, q), ct.induced_distribution(ours(rule), p, q),
                               rtol=0, atol=1e-12)
    assert float(ct.acceptance_rate(rule, p, q)) == pytest.approx(float(ct.acceptance_rate(ours(rule), p, q)),
                                                                  abs=1e-12)


def test_authors_empty_residual_emits_token_0():
    """A rejected draft whose residual is all zero: the authors' code samples an all-zero row, which vLLM 0.7.3's
    exponential race (and the Triton kernel's reservoir) turns into token 0; ours draws from the target (Cactus: h;
    TopK: uniform on the top set). Cactus: p = q but for the drafted token m, p_m = q_m = 0 (so h = q = p elsewhere);
    TopK(1): p one-hot on q's argmax, the drafted m outside the top set with p_m = 0."""
    B = 200
    q = np.array([0.1, 0.3, 0.0, 0.6])
    cases_ = [(ct.Cactus(0.3, convention="authors"), q.copy(), q, 2, q),
              (ct.TopK(1, "topk", "authors"), np.eye(4)[3], q, 2, np.eye(4)[3])]
    for rule, p, qq, m, our_law in cases_:
        np.testing.assert_array_equal(rule.residual(p, qq, np.asarray(m)), np.eye(4)[0])
        np.testing.assert_allclose(ours(rule).residual(p, qq, np.asarray(m)), our_law, atol=1e-15)
        P, Q = torch.from_numpy(np.tile(p, (B, 1, 1))), torch.from_numpy(np.tile(qq, (B, 2, 1)))
        for r, law in ((rule, np.eye(4)[0]), (ours(rule), our_law)):
            tokens, a = verify(torch.full((B, 1), m), P, Q, r, generator=torch.Generator().manual_seed(1))
            assert (a == 0).all()
            counts = np.bincount(tokens[:, 0].numpy(), minlength=4)
            assert (counts[law == 0] == 0).all() and (counts[law > 0] > 0).all(), (r, counts)


def test_authors_interpolation_floors_its_recovery():
    """interp.py (vLLM 0.7.3's recovery): ``g = max(h - p, t) / sum max(h - p, t)``, ``t = FLOAT32_TINY``: a token
    that neither p nor q can emit receives about ``R t`` of the law, so ``KL(h_alg || q)`` is infinite, while the
    law stays within ``V t`` of ours in TV."""
    p = np.array([0.6, 0.3, 0.1, 0.0])
    q = np.array([0.2, 0.3, 0.5, 0.0])
    rule, plain = ct.Interpolation(0.4, convention="authors"), ct.Interpolation(0.4)
    h = 0.4 * p + 0.6 * q
    w = np.maximum(h - p, FLOAT32_TINY)
    np.testing.assert_array_equal(rule.residual(p, q, np.asarray(0)), w / w.sum())
    law = ct.induced_distribution(rule, p, q)
    R = float(np.sum(np.maximum(p - h, 0)))  # the rejection mass: sum (p - h)_+
    assert law[3] == pytest.approx(R * FLOAT32_TINY / w.sum(), rel=1e-12) and law[3] > 0
    assert ct.induced_distribution(plain, p, q)[3] == 0
    assert math.isinf(float(ct.kl(law, q))) and math.isfinite(float(ct.kl(ct.induced_distribution(plain, p, q), q)))
    assert 0.5 * np.abs(law - ct.induced_distribution(plain, p, q)).sum() <= 4 * FLOAT32_TINY


@pytest.mark.parametrize("rule", [ct.Cactus(0.3, convention="authors"), ct.TopK(2, "topk", "authors"),
                                  ct.Interpolation(0.4, convention="authors"), ct.TAS(convention="authors")], ids=repr)
def test_authors_convention_sampled_law_in_verify_and_verify_flat(rule):
    """``verify`` and ``verify_flat`` emit the convention's exact block law (not rejected). Its differences from
    ours have weight 0 (or 1e-38) in that law, below any sampling: they are pinned by the tests above."""
    P, Q = _rows(5)
    for sampler in (verify, flat_sampler):
        res = check_sampler(sampler, P, Q, rule=rule, tv=TV, alpha=ALPHA, seed=5, parts=("first", "block"))
        assert not res.reject, res.table()


def test_convention_validation_and_registry():
    for cls in (ct.Cactus, ct.TopK, ct.Interpolation, ct.TAS):
        with pytest.raises(ValueError, match="^convention must be one of"):
            cls(convention="vllm")
        assert ct.registry.make(ct.registry.spec(cls).key, convention="authors").convention == "authors"
    import argparse

    ap = argparse.ArgumentParser()
    ct.registry.add_rule_arguments(ap)
    got = ct.registry.rule_from_args(ap.parse_args(["--rule", "cactus", "--cactus-convention", "authors"]))
    assert got == ct.Cactus(1.0, convention="authors")
    assert ct.registry.rule_from_args(ap.parse_args(["--rule", "ensemble", "--ensemble-weight", "0.3"])) == \
        ct.Ensemble(0.3)
    assert ct.registry.rule_from_args(ap.parse_args(["--rule", "sps", "--sps-rand-bits", "24"])) == ct.SpS(rand_bits=24)
