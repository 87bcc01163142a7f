"""The distributional tests must CATCH wrong samplers, not only pass right ones.

Three known wrong ports, built here as small wrappers around the real code:
  * ``WrongRecoveryCactus``: accepts with Cactus's ``h`` but recovers with SpS's ``(q - p)_+``
    (PAPER.md, "known pitfalls");
  * ``off_by_one``: draft position ``j`` is verified against verifier row ``j + 1``;
  * ``bonus_from_wrong_row``: the bonus token is drawn from verifier row ``k - 1`` instead of ``k``.
Each is run through exactly the harness the correct sampler passes in test_sampler.py /
test_toy.py (same sizes, level ALPHA = 1e-4, fixed seeds) and must be rejected. Where the wrong
law is computable we also assert it is at TV >= 0.01 from the right one, so rejection is what
the test's power (>= 0.999 at that distance) predicts, not luck.

The wider catalogue of wrong ports (every rule, ``verify_flat``, the exact laws, the multi-draft
functions, the vLLM and transformers hooks) is planted into a copy of the source by
``tests/mutants.py`` (``make mutants``, not part of ``make test``); the guards for the ports the rest
of the suite missed are in ``tests/test_port_guards.py``. ``test_planted_ports_are_anchored_and_cover``
below keeps that catalogue runnable: every anchor still found exactly once, every named test present.
"""

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.sampler import verify
from cactus_theory.stats import samples_needed
from cactus_theory.toy import one_step_test, random_pair, sequence_law, sequence_test

ALPHA, BETA, EPS = 1e-4, 1e-3, 0.01


@dataclass(frozen=True)
class WrongRecoveryCactus(ct.Cactus):
    """Cactus acceptance with the SpS recovery law: the classic wrong port."""

    def residual(self, p, q, n, *, check=True):
        return ct.SpS().residual(p, q, n, check=check)


def off_by_one(n, P, Q, rule, generator=None, check=True):
    return verify(n, P, torch.cat([Q[:, 1:], Q[:, -1:]], 1), rule, generator=generator, check=check)


def bonus_from_wrong_row(n, P, Q, rule, generator=None, check=True):
    Q2 = Q.clone()
    Q2[:, -1] = Q[:, -2]
    return verify(n, P, Q2, rule, generator=generator, check=check)


def rows(seed, k=2, V=8):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, 0.7), size=k), rng.dirichlet(np.full(V, 0.7), size=k + 1)


N1 = samples_needed(EPS, categories=8, alpha=ALPHA, beta=BETA)
NSEQ = samples_needed(EPS, categories=27, alpha=ALPHA, beta=BETA)


@pytest.fixture(scope="module")
def pair():
    return random_pair(3, order=2, concentration=1.0, weight=0.6, seed=0)


def test_wrong_recovery_is_far_and_caught_one_step():
    p, q = rows(11)
    rule, wrong = ct.Cactus(0.1), WrongRecoveryCactus(0.1)
    far = ct.tv(ct.induced_distribution(wrong, p[0], q[0], method="generic"), ct.induced_distribution(rule, p[0], q[0]))
    assert far >= EPS
    # the wrong sampler's tokens tested against the law the right Cactus must produce
    res = one_step_test(rule, p, q, num_samples=N1, seed=5, alpha=ALPHA,
                        sampler=lambda n, P, Q, r, generator: verify(n, P, Q, wrong, generator=generator))
    assert res.reject and res.pvalue < 1e-12, res
    assert not one_step_test(rule, p, q, num_samples=N1, seed=5, alpha=ALPHA).reject


def test_off_by_one_caught_one_step():
    p, q = rows(11)
    for rule in (ct.SpS(), ct.Cactus(0.1)):
        res = one_step_test(rule, p, q, num_samples=N1, seed=5, alpha=ALPHA, sampler=off_by_one)
        assert res.reject and res.pvalue < 1e-12, (rule, res)


def test_wrong_recovery_caught_by_sequence_test():
    """V = 4 (with V = 3 the two recovery laws often coincide: one token left with positive mass)."""
    d, v = random_pair(4, order=2, concentration=0.5, weight=1.0, seed=0)
    rule, wrong = ct.Cactus(0.1), WrongRecoveryCactus(0.1)
    far = ct.tv(sequence_law(d, v, wrong, 2, 3).ravel(), sequence_law(d, v, rule, 2, 3).ravel())
    assert far >= EPS
    n = samples_needed(EPS, categories=4**3, alpha=ALPHA, beta=BETA)
    res = sequence_test(d, v, rule, 2, 3, num_sequences=n, seed=0, alpha=ALPHA,
                        sampler=lambda n, P, Q, r, generator: verify(n, P, Q, wrong, generator=generator))
    assert res.reject, res
    assert not sequence_test(d, v, rule, 2, 3, num_sequences=n, seed=0, alpha=ALPHA).reject


@pytest.mark.parametrize("rule", [ct.SpS(), ct.Cactus(0.5)], ids=repr)
@pytest.mark.parametrize("sampler", [off_by_one, bonus_from_wrong_row], ids=lambda f: f.__name__)
def test_misaligned_rows_caught_by_sequence_test(pair, rule, sampler):
    d, v = pair
    res = sequence_test(d, v, rule, 2, 3, num_sequences=NSEQ, seed=0, alpha=ALPHA, sampler=sampler)
    assert res.reject and res.pvalue < 1e-12, res


def test_bonus_from_wrong_row_is_invisible_to_the_one_step_test():
    """Why the sequence test is needed: the first token's law does not involve the bonus row."""
    p, q = rows(11)
    res = one_step_test(ct.Cactus(0.1), p, q, num_samples=N1, seed=5, alpha=ALPHA, sampler=bonus_from_wrong_row)
    assert not res.reject


REQUIRED_COVERAGE = {  # every rule and entry point has at least one planted port (tests/mutants.py)
    "SpS", "ScalingRule", "TargetRule", "Cactus", "taylor_gamma", "TAS", "TopK", "Interpolation", "EARS",
    "SGLangThreshold", "RelaxedAcceptance", "MedusaTypical", "FLy", "DropMatch", "verify", "verify_flat",
    "induced_generic", "_induced_scaling_row", "sequence_law", "step_parts", "speculative_decode",
    "multi_draft_acceptance", "solve_target_multi", "rule_from_spec", "expand_batch_to_tokens", "rejection_sample",
    "speculative_sampling", "descending_rank", "bonus_distribution", "_check_generators", "DropMatchAt",
    "assisted_generate", "Rule", "Method", "_Cache", "SequenceBudget",
}


def test_planted_ports_are_anchored_and_cover_every_rule_and_entry_point():
    """A stale anchor would make ``make mutants`` stop; here it is caught by ``make test`` already (re-anchor
    the port in tests/mutants.py after a rewrite of the code it plants into)."""
    import os

    import mutants

    ports = mutants.PORTS
    assert len(ports) >= 25 and len({p.id for p in ports}) == len(ports)
    assert mutants.check_anchors(ports) == []
    covered = {mutants.enclosing(p).split(".")[0] for p in ports}
    assert REQUIRED_COVERAGE <= covered, REQUIRED_COVERAGE - covered
    assert sum(bool(p.harmless) for p in ports) >= 1
    for p in ports:
        assert p.tests, p.id
        for t in p.tests:
            path, _, func = t.partition("::")
            with open(os.path.join(mutants.ROOT, path), encoding="utf-8") as f:
                src = f.read()
            assert not func or f"def {func.split('[')[0]}(" in src, (p.id, t)
