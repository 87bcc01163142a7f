"""Declared properties of rules (``needs_row_stats``, ``two_block``) and their safe inheritance.

The engines trust these declarations instead of comparing methods by identity, so a subclass that
overrides what a property vouches for must lose the declaration unless it re-declares it.
"""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

import cactus_theory as ct
from cactus_theory import registry
from cactus_theory.exact import induced_generic, induced_scaling
from cactus_theory.sampler import verify


def test_builtin_declarations():
    for cls in (ct.SpS, ct.Cactus):
        assert cls.two_block and not cls.needs_row_stats
    for cls in (ct.TAS, ct.TopK, ct.EARS):  # each reads a statistic of q (entropy, k-th largest, max)
        assert cls.needs_row_stats and not cls.two_block
    assert not ct.Interpolation.needs_row_stats and not ct.Interpolation.two_block
    for s in registry.RULES.values():  # a rule without row statistics must not read any
        if not s.cls.needs_row_stats:
            assert s.cls.row_stats is ct.Rule.row_stats, s.key


def test_override_clears_two_block_and_redeclaring_keeps_it():
    @dataclass(frozen=True)
    class OwnPhi(ct.Cactus):
        def phi(self, p_n, q_n, *stats):  # accepts a little less than Cactus
            return 0.9 * super().phi(p_n, q_n, *stats)

    @dataclass(frozen=True)
    class OwnGamma(ct.Cactus):  # a new gamma keeps the two-block law: the property is inherited
        def gamma(self, q_n):
            return ct.Cactus(2 * self.delta).gamma(q_n)

    @dataclass(frozen=True)
    class Vouched(OwnPhi):
        two_block: ClassVar[bool] = True  # re-declared: the author vouches for it

    assert not OwnPhi.two_block and OwnGamma.two_block and Vouched.two_block
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(9)), rng.dirichlet(np.ones(9))
    own = OwnPhi(0.1)
    np.testing.assert_allclose(ct.induced_distribution(own, p, q), induced_generic(own, p, q), atol=1e-15)
    assert np.abs(ct.induced_distribution(own, p, q) - induced_scaling(ct.Cactus(0.1), p, q)).max() > 1e-3
    g = OwnGamma(0.1)
    np.testing.assert_allclose(ct.induced_distribution(g, p, q), induced_generic(g, p, q), atol=1e-12)


def test_override_of_row_stats_sets_needs_row_stats():
    @dataclass(frozen=True)
    class MaxGated(ct.SpS):
        """SpS that also accepts when q_n is the row maximum (reads max q)."""

        def row_stats(self, q):
            return (q.max(-1, keepdims=True) if isinstance(q, np.ndarray) else q.amax(-1, keepdim=True),)

        def phi(self, p_n, q_n, qmax):
            return super().phi(p_n, q_n) + (q_n >= qmax)

    assert MaxGated.needs_row_stats and not MaxGated.two_block
    rng = np.random.default_rng(2)
    P = torch.tensor(rng.dirichlet(np.ones(5), size=(3, 2)))
    Q = torch.tensor(rng.dirichlet(np.ones(5), size=(3, 3)))
    n = torch.tensor(rng.integers(0, 5, size=(3, 2)))
    # the sampler must pass the statistic (a missing one would raise a TypeError in phi)
    tokens, acc = verify(n, P, Q, MaxGated(), generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 3) and acc.shape == (3,)
