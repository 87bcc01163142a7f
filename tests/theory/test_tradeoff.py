"""tradeoff.matched_cactus: the matched budgets reproduce the rule's acceptance / cost, and the edge
cases (below SpS, above everything Cactus can cost) are reported as such."""

import math

import numpy as np
import pytest

import cactus_theory as ct
from cactus_theory.tradeoff import matched_cactus, mean_cost


def pairs(seed=0, R=6, V=16):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(R, V)) * 2
    q = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    p = np.exp(z + rng.normal(size=(R, V))) / np.exp(z + rng.normal(size=(R, V))).sum(-1, keepdims=True)
    p = p / p.sum(-1, keepdims=True)
    return p, q


def test_matched_budgets_reproduce_acceptance_and_cost():
    p, q = pairs()
    m = matched_cactus(ct.FLy(0.3, 3, 0.5), p, q)
    assert 0 < m.delta_at_accept < math.inf and 0 < m.delta_at_cost < math.inf
    assert float(np.mean(ct.acceptance_rate(ct.Cactus(m.delta_at_accept), p, q))) == pytest.approx(m.accept, abs=1e-6)
    assert mean_cost(ct.Cactus(m.delta_at_cost), p, q) == pytest.approx(m.cost, rel=1e-6)
    assert m.cactus_cost == pytest.approx(mean_cost(ct.Cactus(m.delta_at_accept), p, q))
    # (no ordering is asserted: Cactus's per-token optimum does not bound the step law's KL, and a
    # rule such as this FLy can cost less than Cactus at equal acceptance on some rows)


def test_edges():
    p, q = pairs(1)
    below = matched_cactus(ct.SGLangThreshold(1.0, 0.9), p, q)  # accepts less than SpS does
    assert math.isnan(below.delta_at_accept) and math.isnan(below.cactus_cost)
    lossless = matched_cactus(ct.SpS(), p, q)
    assert lossless.delta_at_accept == 0.0 and lossless.cost == pytest.approx(0, abs=1e-12)
    costly = matched_cactus(ct.RelaxedAcceptance(1, 0.0), p, q)  # point masses: costs more than KL(p || q)
    assert costly.delta_at_cost == math.inf and costly.cactus_accept == pytest.approx(1.0, abs=1e-9)
    everything = matched_cactus(ct.FLy(0.0, 3, 1.0), p, q)  # keeps every draft
    assert everything.delta_at_accept == math.inf
