"""The law of ``check_sampler`` itself (issue 41, item 7): under H0 (a correct sampler) each part rejects at
about its level and the family at most at its level, and the parts' Holm-adjusted p-values and the family's
verdict are Holm's method applied to the parts' raw p-values (re-derived here by a step-down written out in
the test, not the project's ``holm``).

Design: ``verify`` (SpS, lossless) on fixed rows, k = 2, V = 4, N = 300 rows, alpha = 0.05, seeds 0..999.
Each part's raw rejection count is compared with Binomial(1000, 0.05) by an exact two-sided binomial test at
level 0.001; the family's (Holm over the parts: at most alpha) by a one-sided exact test at level 0.001.
Power of the two-sided test against a part that rejects at 0.09: 0.96, and at 0.097 (a wrong port issue 41
measured): 0.993, computed in ``test_the_binomial_test_has_power``; it accepts counts 29..74 of 1000. Observed at
these seeds: first 45, bonus 42, block 44 raw rejections; family 39 (Holm is conservative).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from cactus_theory.sampler import verify
from cactus_theory.theory.check import check_sampler
from tests.helpers import holm_written_out

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA, SEEDS, LEVEL = 0.05, 1000, 1e-3
_rng = np.random.default_rng(5)
P = _rng.dirichlet(np.full(4, 2.0), size=2)
Q = _rng.dirichlet(np.full(4, 2.0), size=3)


def _two_sided_region(n: int, p: float, level: float) -> tuple[int, int]:
    """Counts ``c`` outside ``[lo, hi]`` have ``binomtest(c, n, p).pvalue < level``."""
    inside = [c for c in range(n + 1) if sps.binomtest(c, n, p).pvalue >= level]
    return min(inside), max(inside)


def test_the_binomial_test_has_power():
    """Against a part rejecting at 0.09 over 1000 seeds, the two-sided test at 0.001 rejects with probability
    >= 0.95 (computed from the binomial law); against 0.097, >= 0.99."""
    lo, hi = _two_sided_region(SEEDS, ALPHA, LEVEL)
    assert (lo, hi) == (29, 74)
    for rate, floor in ((0.09, 0.95), (0.097, 0.99)):
        power = sps.binom.sf(hi, SEEDS, rate) + sps.binom.cdf(lo - 1, SEEDS, rate)
        assert power >= floor, (rate, power)


def test_check_sampler_holds_its_size_and_its_holm_family():
    raw = {"first": 0, "bonus": 0, "block": 0}
    family = 0
    for seed in range(SEEDS):
        res = check_sampler(verify, P, Q, num_samples=300, alpha=ALPHA, seed=seed)
        assert set(res.parts) == set(raw) and not res.not_testable
        names = list(res.parts)
        adj = holm_written_out([res.parts[k].pvalue for k in names])[0]
        for k, a in zip(names, adj, strict=True):
            assert res.parts[k].holm == pytest.approx(a, abs=1e-12)
            raw[k] += res.parts[k].pvalue < ALPHA
        assert res.pvalue == pytest.approx(min(adj), abs=1e-12)
        assert res.reject == any(a < ALPHA for a in adj) == any(p.reject for p in res.parts.values())
        family += res.reject
    for k, count in raw.items():
        assert sps.binomtest(count, SEEDS, ALPHA).pvalue >= LEVEL, (k, count)
    assert sps.binomtest(family, SEEDS, ALPHA, alternative="greater").pvalue >= LEVEL, family
