"""Conformance, rule layer: every registry rule's own code (``accept_prob_all`` on numpy and on torch,
``residual``, the exact
one-step law ``core.exact.induced_distribution``, the bonus law and ``theory.check.block_law``) against
the independent re-implementation ``theory.reference``, exactly, on generated rows (every family of
``harness.FAMILIES``: zeros on either side, exact ties, ties to the rule's own parameters, one-hot,
near-degenerate and ``q_n = 1`` rows with float noise; V from 2 to 4,096). The samplers' tests replay
their tokens against the same reference, so this file is what ties the replays to the exact laws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory.core import registry
from cactus_theory.exact import bonus_distribution, induced_distribution
from cactus_theory.theory.check import block_law
from cactus_theory.theory.reference import reference_bonus, reference_law, reference_step
from tests.conformance.harness import (
    FAMILIES,
    RULE_KEYS,
    STATEFUL_KEYS,
    configurations,
    covered_by_reference,
    float_params,
    min_vocab,
    pair,
    profile,
    row_rule,
    rule_for_rows,
)

ATOL = 1e-12


def test_every_registry_rule_has_a_reference():
    """A rule added to the registry is judged by the harness only once ``theory.reference`` writes its law
    out: refused here until then, never skipped."""
    for key in RULE_KEYS:
        for rule in configurations(key)[:3]:
            assert covered_by_reference(rule), f"registry rule {key!r} has no reference in theory/reference.py"


def test_stateful_rules_are_refused_without_their_state():
    """A stateful registry rule is outside the one-step harness: each one-step entry point refuses it without its
    per-sequence state (a ``ValueError`` naming the state), so none can silently apply it as a one-step rule."""
    from cactus_theory.core.sampler import verify, verify_flat
    from cactus_theory.core.tree import verify_tree

    assert STATEFUL_KEYS, "the registry declares a stateful rule (SequenceBudget)"
    p = torch.full((1, 1, 4), 0.25, dtype=torch.float64)
    q = torch.full((1, 2, 4), 0.25, dtype=torch.float64)
    for key in STATEFUL_KEYS:
        rule = registry.spec(key).make()
        with pytest.raises(ValueError, match="state"):
            verify(torch.tensor([[1]]), p, q, rule)
        with pytest.raises(ValueError, match="state"):
            verify_tree(torch.tensor([[1]]), torch.tensor([[-1]]), p, q, rule, "iid")
        with pytest.raises(ValueError, match="stateful"):
            verify_flat(torch.tensor([1]), torch.tensor([0, 1]), p[0], q[0, :1], torch.tensor([[2]]), rule)


def _check_rows(rule, P, Q, rng, law=True):
    """phi for every token, the recovery law of every token it weighs, the one-step law, the
    bonus law and the block law's factors, each against the reference."""
    R, V = P.shape
    bound = rule_for_rows(rule, P, Q, rng)
    hits = getattr(bound, "hit", None)
    phi = bound.accept_prob_all(P, Q)
    phi_t = rule_for_rows(rule, P, Q, rng, hit=hits).accept_prob_all(torch.from_numpy(P), torch.from_numpy(Q)).numpy()
    for r in range(R):
        one = row_rule(rule, None if hits is None else hits[r])
        # every token; at large V a two-block rule (phi_n a function of (p_n, q_n) alone, as it declares) is
        # checked at 256 tokens, the drafted-likely ones and the rest at random
        ns = np.arange(V)
        if V > 64 and rule.two_block:
            ns = np.unique(np.concatenate([np.argsort(-P[r])[:64], rng.choice(V, 192, replace=False)]))
        ref = {int(n): reference_step(one, P[r], Q[r], int(n)) for n in ns}
        want = [ref[int(n)][0] for n in ns]
        np.testing.assert_allclose(phi[r, ns], want, rtol=0, atol=ATOL, err_msg=f"phi, row {r}")
        np.testing.assert_allclose(phi_t[r, ns], want, rtol=0, atol=ATOL, err_msg=f"phi (torch), row {r}")
        # the recovery law of every token it carries weight for (p_n (1 - phi_n) > 0; elsewhere it is never read)
        live = [int(n) for n in ns if P[r, n] * (1 - ref[int(n)][0]) > 1e-9][:8 if V > 64 else V]
        for n in live:
            g = one.residual(P[r], Q[r], np.asarray(n))
            np.testing.assert_allclose(g, ref[n][1], rtol=0, atol=ATOL, err_msg=f"residual, row {r}, n = {n}")
        if law:
            np.testing.assert_allclose(induced_distribution(one, P[r], Q[r]), reference_law(one, P[r], Q[r]),
                                       rtol=0, atol=ATOL, err_msg=f"one-step law, row {r}")
        np.testing.assert_allclose(bonus_distribution(one, Q[r]), reference_bonus(one, Q[r]), rtol=0, atol=ATOL)
    if law and R >= 2 and hits is None:  # the block law of a chain of the rows (k = R - 1 drafts)
        bl = block_law(rule, P[:-1], Q)
        acc = np.array([[P[j, n] * reference_step(rule, P[j], Q[j], n)[0] for n in range(V)] for j in range(R - 1)])
        np.testing.assert_allclose(bl.acc, acc, rtol=0, atol=ATOL)
        rej = np.array([reference_law(rule, P[j], Q[j]) for j in range(R - 1)]) - acc
        np.testing.assert_allclose(bl.rej, np.clip(rej, 0, None), rtol=0, atol=1e-11)
        np.testing.assert_allclose(bl.bonus, reference_bonus(rule, Q[-1]), rtol=0, atol=ATOL)


@pytest.mark.parametrize("key", RULE_KEYS)
def test_rule_law_against_the_reference(key):
    """Small vocabularies (2..16), five rows of mixed families, three configurations of the rule per example."""
    configs = configurations(key)

    @profile(8)
    @given(seed=st.integers(0, 2**32 - 1), picks=st.lists(st.integers(0, len(configs) - 1), min_size=3, max_size=3))
    def run(seed, picks):
        rng = np.random.default_rng(seed)
        for i in picks:
            rule = configs[i]
            V = int(rng.choice([v for v in (2, 3, 4, 5, 8, 16) if v >= min_vocab(rule)] or [min_vocab(rule)]))
            rows = [pair(rng, V, str(rng.choice(FAMILIES)), float_params(rule)) for _ in range(5)]
            P, Q = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
            _check_rows(rule, P, Q, rng)

    run()


def _at_a_boundary(rule) -> bool:
    """A configuration with a numeric parameter at 0 (``entropy_eps = 0``, ``delta = 0``, ``beta = 0``, ...), where
    a formula's guards (``0 log 0``, ``x / 0``) decide the law."""
    s = registry.spec(rule)
    return any(p.type in (float, int) and getattr(rule, p.name) == 0 for p in s.params)


@pytest.mark.parametrize("key", RULE_KEYS)
def test_rule_law_at_parameter_boundaries(key):
    """Every configuration with a parameter at 0, not a sample of them: rows with zeros in ``q`` and in ``p``,
    disjoint supports, exact ties and one-hot rows (V = 5, one fixed seed per family), against the reference."""
    edge = [r for r in configurations(key) if _at_a_boundary(r) and min_vocab(r) <= 5]
    rng = np.random.default_rng(2026)
    fams = ("zeros_in_q", "zeros_in_p", "disjoint", "ties", "onehot_q", "random")
    rows = [pair(rng, 5, f) for f in fams]
    P, Q = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
    for rule in edge:
        _check_rows(rule, P, Q, np.random.default_rng(0))


@pytest.mark.parametrize("key", RULE_KEYS)
def test_rule_law_at_large_vocabularies(key):
    """V = 1,000 and 4,096: phi at every token and a few recovery laws against the reference (massive exact
    ties, near-degenerate rows, zeros on either side); the whole one-step law at V = 1,000, and at 4,096
    for the two-block rules (their O(V log V) path against the reference's sum)."""
    configs = configurations(key)

    @profile(1)
    @given(seed=st.integers(0, 2**32 - 1), i=st.integers(0, len(configs) - 1))
    def run(seed, i):
        rng = np.random.default_rng(seed)
        rule = configs[i]
        for V, fam in ((1000, "random"), (4096, "ties"), (4096, str(rng.choice(["near_degenerate", "zeros_in_q",
                                                                                  "zeros_in_p"])))):
            if fam == "random":
                fam = str(rng.choice(["random", "ties", "zeros_in_q"]))
            p, q = pair(rng, V, fam)
            _check_rows(rule, p[None], q[None], rng, law=V <= 1000 or rule.two_block)

    run()
