"""One-bin strata of ``check_generation`` (issue 41, item 6): a prefix whose next-token categories pool into one
bin is tested exactly (Fisher's exact test, most frequent token against any other, side a against side b), in
the same Holm family, instead of being pooled away; every prefix seen ``min_count`` times on both sides is
accounted for (pooled chi-square, exact, or one and the same token on both sides), checked against a direct
count of prefixes.

Statistical tests (fixed seeds): the planted rare token is detected at ALPHA = 0.01 with power >= 0.999,
computed exactly in the test from the binomial law of the rare count and Fisher's p-value; the size of the
exact member under H0 is checked over 400 seeds at alpha 0.05 by an exact binomial test at level 0.001.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy import stats as sps

from cactus_theory.theory.check_generation import check_generation
from cactus_theory.toy import random_pair, toy_generate

pytestmark = pytest.mark.usefixtures("one_thread")

X, Y = 3, 7  # the usual token and the rare one


def _rare(rate: float):
    """Decodes of one token: ``Y`` with probability ``rate``, else ``X`` (a near-deterministic prefix)."""
    def generate(prompts, n, seed):
        rng = np.random.default_rng(seed)
        return [[Y] if rng.random() < rate else [X] for _ in prompts for _ in range(n)]
    return generate


def _exact_power(n: int, rate: float, level: float) -> float:
    """P(Fisher's two-sided p < level) when side a has ``k ~ Binomial(n, rate)`` rare tokens and side b none."""
    ks = np.arange(1, n + 1)
    reject = np.array([sps.fisher_exact([[n - k, k], [n, 0]]).pvalue < level for k in ks])
    return float(sps.binom.pmf(ks, n, rate)[reject].sum())


def test_a_rare_extra_token_at_a_near_deterministic_prefix_is_detected():
    """Side a emits the rare token with probability 0.1, side b never; n = 200 decodes per side; min_expected 50
    pools the two tokens into one bin (expected rare count ~10 per row), so the old rule skipped the prefix. The
    family has one member (position 0, exact), so it rejects when Fisher's p < 0.01: power 0.9995 (computed here)."""
    n, rate, alpha = 200, 0.1, 0.01
    power = _exact_power(n, rate, alpha)
    assert power >= 0.999, power
    res = check_generation(_rare(rate), _rare(0.0), ["p"], n=n, positions=1, alpha=alpha, min_expected=50.0)
    assert [t.name for t in res.tests] == ["position 0 exact"] and res.reject, res.table()
    assert res.strata[0] == {"pooled": 0, "exact": 1, "same_token": 0}
    k = sum(1 for d in _rare(rate)(["p"], n, 0) if d == [Y])  # side a's seed is 2 * 0
    assert res.tests[0].pvalue == pytest.approx(sps.fisher_exact([[n - k, k], [n, 0]]).pvalue)


def test_the_exact_member_holds_its_size_under_h0():
    """Both sides emit the rare token with probability 0.03 (n = 100): the exact member rejects at alpha 0.05 in
    at most its share of 400 seeds; an exact binomial test at level 0.001 refuses a rate above 0.05 (Fisher's
    test is conservative: 7 of 400 at seeds 0-399)."""
    rejections = sum(check_generation(_rare(0.03), _rare(0.03), ["p"], n=100, positions=1, alpha=0.05, seed=s,
                                      min_expected=50.0).reject for s in range(400))
    assert sps.binomtest(rejections, 400, 0.05, alternative="greater").pvalue > 1e-3, rejections


def _direct_strata(dec_a, dec_b, n: int, t: int, min_count: int) -> tuple[int, int]:
    """(prefixes seen >= min_count times on both sides, those with one next category on both sides together),
    counted straight from the decodes: a prefix is (prompt, first t tokens)."""
    def prefixes(decs):
        return Counter((i // n, tuple(d[:t])) for i, d in enumerate(decs) if len(d) >= t)

    ca, cb = prefixes(dec_a), prefixes(dec_b)
    both = [s for s in ca if ca[s] >= min_count and cb.get(s, 0) >= min_count]
    nexts: dict = {}
    for decs in (dec_a, dec_b):
        for i, d in enumerate(decs):
            key = (i // n, tuple(d[:t]))
            if len(d) >= t and key in set(both):
                nexts.setdefault(key, set()).add(d[t] if len(d) > t else -1)
    return len(both), sum(1 for s in both if len(nexts[s]) == 1)


def test_the_stratum_rule_accounts_for_every_prefix_a_direct_count_finds():
    draft, verifier = random_pair(5, order=2, concentration=0.3, weight=0.5, seed=3)
    gen_a, gen_b = toy_generate(verifier, 4), toy_generate(verifier, 4)
    prompts, n, min_count = [(1,), (2, 4)], 300, 20
    res = check_generation(gen_a, gen_b, prompts, n=n, positions=4, alpha=0.05, seed=2, min_count=min_count)
    dec_a, dec_b = gen_a(prompts, n, 4), gen_b(prompts, n, 5)
    for t in range(4):
        total, same = _direct_strata(dec_a, dec_b, n, t, min_count)
        got = res.strata.get(t, {"pooled": 0, "exact": 0, "same_token": 0})
        assert sum(got.values()) == total and got["same_token"] == same, (t, got, total, same)
        rows = {r.name: r.strata for r in res.tests if r.position == t}
        assert rows.get(f"position {t}", 0) == got["pooled"] and rows.get(f"position {t} exact", 0) == got["exact"]
    assert sum(v["exact"] for v in res.strata.values()) >= 1  # the case this test is about occurs here
