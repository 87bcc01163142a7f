"""``lm.metrics``: the step KL on the support equals the full-vocabulary divergence; ``al_of`` is the one AL."""

from __future__ import annotations

import numpy as np
import pytest

import cactus_theory as ct
from cactus_theory.exact import step_divergence
from cactus_theory.lm.metrics import step_kl

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("rule", [ct.SpS(), ct.Cactus(0.7), ct.TAS(), ct.TopK(7), ct.Interpolation(0.4),
                                  ct.EARS(0.3)], ids=repr)
def test_step_kl_on_the_support_equals_the_full_vocabulary(rule):
    rng = np.random.default_rng(0)
    for _ in range(5):
        p, q = rng.dirichlet(np.full(40, 0.5), size=2).astype(np.float32)
        p[rng.random(40) < 0.6] = 0
        q[rng.random(40) < 0.6] = 0
        q[0] = max(q[0], 0.05)
        p[0] = max(p[0], 0.05)
        p, q = p.astype(np.float64), q.astype(np.float64)
        p, q = p / p.sum(), q / q.sum()
        full = float(step_divergence(rule, p, q))
        assert step_kl(rule, p, q) == pytest.approx(full, rel=1e-6, abs=1e-9)


def test_al_of_is_the_one_al_formula():
    """AL = (accepted drafts + verifier calls) / verifier calls, bonus included: ``al_of`` serves the run's and a
    sequence's counters, the eval's pooled records and the repro's derived figures alike."""
    import math

    from cactus_theory.lm.experiments import eval as ev
    from cactus_theory.lm.metrics import DecodeStats, SequenceCounters, al_of

    assert al_of(6, 4) == 2.5 and math.isnan(al_of(0, 0))
    assert DecodeStats("x", steps=4, accepted=6).al == SequenceCounters(steps=4, accepted=6).al == 2.5
    assert ev._al([{"accepted": 2, "steps": 1}, {"accepted": 4, "steps": 3}]) == 2.5
    assert math.isnan(DecodeStats("x").al) and math.isnan(ev._al([]))
