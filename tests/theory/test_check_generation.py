"""``check_generation`` (theory/check_generation.py) on toy n-gram models with exact laws: a correct pair (the
speculative loop under SpS against plain sampling) passes, a lossy one is caught at the position its exact law
differs, a deviation deep in the prefix tree is found at its position only, ends of decodes count as a
category, the answer-level test sees a score difference, and malformed generator output is refused by name.

Statistical tests: each call is a family at ALPHA = 1e-3 (Holm) with fixed seeds (deterministic). True nulls
here: 4 calls, each false-positive with probability <= 1e-3 were the seeds redrawn. Each asserted detection is
of an effect whose size is first shown to exceed the stated detectable TV (power >= 0.9 by design). The
calibration over >= 200 seeds is ``benchmarks/check_calibration.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import cactus_theory as ct
from cactus_theory.theory.check_generation import END, check_generation
from cactus_theory.toy import random_pair, toy_generate

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA = 1e-3
DRAFT, VERIFIER = random_pair(5, order=2, concentration=0.7, weight=0.5, seed=3)
PROMPTS = [(1,), (2, 4)]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_speculative_loop_under_sps_is_its_verifier_in_law(seed):
    spec = toy_generate(VERIFIER, 5, draft=DRAFT, rule=ct.SpS(), k=2)
    plain = toy_generate(VERIFIER, 5)
    res = check_generation(spec, plain, PROMPTS, n=1500, positions=5, alpha=ALPHA, seed=seed, names=("SpS", "plain"))
    stat, p = res
    assert (stat, p) == (res.statistic, res.pvalue) and not res.reject, res.table()
    assert [t.position for t in res.tests if "exact" not in t.name] == [0, 1, 2, 3, 4] and res.n == 1500
    assert all(t.n_a <= 3000 and t.strata >= 1 and 0 < t.detectable < 1 for t in res.tests)
    assert res.tests[0].strata == len(PROMPTS) and res.tests[0].n_a == res.tests[0].n_b == 3000
    d = res.as_dict()
    assert d["reject"] is False and len(d["tests"]) == len(res.tests) and d["verdict"] == "no difference detected"


def test_a_lossy_rule_is_caught_at_the_first_token():
    """toy.speculative_decode draws the first token through a block (no verifier-first pass), so Cactus's first
    token follows h_alg of the prompt's rows, at a TV from the verifier's law above the stated detectable TV."""
    rule = ct.Cactus(0.5)
    spec = toy_generate(VERIFIER, 3, draft=DRAFT, rule=rule, k=2)
    plain = toy_generate(VERIFIER, 3)
    res = check_generation(spec, plain, PROMPTS, n=1500, positions=3, alpha=ALPHA, seed=0)
    dist = min(ct.tv(ct.induced_distribution(rule, DRAFT(pr), VERIFIER(pr)), VERIFIER(pr)) for pr in PROMPTS)
    first = res.tests[0]
    assert dist > first.detectable and first.reject and res.reject


def iid(law_at):
    """A generator of 3-token decodes: token t drawn from ``law_at(t, prefix)``."""
    def generate(prompts, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for _ in prompts:
            for _ in range(n):
                d = []
                for t in range(3):
                    law = law_at(t, tuple(d))
                    d.append(int(rng.choice(law.size, p=law)))
                out.append(d)
        return out
    return generate


E = np.array([0.4, 0.3, 0.2, 0.1])


def test_a_deviation_deep_in_the_prefix_tree_is_found_at_its_position_only():
    moved = np.array([0.1, 0.3, 0.2, 0.4])  # TV 0.3 from E, only after the prefix (0, 0)
    a = iid(lambda t, s: E)
    b = iid(lambda t, s: moved if s == (0, 0) else E)
    res = check_generation(a, b, [()], n=3000, positions=3, alpha=ALPHA, seed=0)
    by = {t.position: t for t in res.tests}
    assert by[2].reject and not by[0].reject and not by[1].reject
    # the prefix (0, 0) is seen ~0.16 * 3000 = 480 times a side: the deviation there is above its detectable TV
    assert 0.5 * np.abs(moved - E).sum() > by[2].detectable_one


def test_the_end_of_a_decode_is_a_category():
    def stops(p_stop):
        def generate(prompts, n, seed):
            rng = np.random.default_rng(seed)
            return [[1] if rng.random() < p_stop else [1, 2] for _ in prompts for _ in range(n)]
        return generate

    same = check_generation(stops(0.3), stops(0.3), [()], n=2000, positions=None, alpha=ALPHA, seed=0)
    assert not same.reject and {t.position for t in same.tests} == {1}  # position 0 is deterministic: no test
    assert any("position 0" in s for s in same.not_tested)
    other = check_generation(stops(0.3), stops(0.45), [()], n=2000, positions=None, alpha=ALPHA, seed=0)
    assert other.reject and other.tests[0].position == 1
    assert END == -1


def test_the_answer_level_test_sees_a_score_difference():
    a = iid(lambda t, s: E)
    b = iid(lambda t, s: np.array([0.3, 0.3, 0.2, 0.2]) if t == 2 else E)
    res = check_generation(a, b, [(), ()], n=2000, positions=[0, 1], alpha=ALPHA, seed=0,
                           scorer=lambda prompt, tokens: tokens[-1] == 0)
    ans = res.tests[-1]
    assert ans.name == "answer" and ans.position is None
    assert ans.tv_observed == pytest.approx(0.1, abs=0.03) and ans.low < 0.1 < ans.high
    assert 0.1 > ans.detectable and ans.reject and res.reject
    assert not any(t.reject for t in res.tests[:-1])


BAD_OUT = [
    (lambda out: out[:-1], ValueError, "expected len(prompts) * n"),
    (lambda out: "abc", TypeError, "must return a list of token-id lists"),
    (lambda out: [np.array(d, dtype=np.float32) for d in out], TypeError, "integer token ids, got dtype float32"),
    (lambda out: [[-1] + d for d in out], ValueError, "negative token id"),
    (lambda out: [np.array([d]) for d in out], ValueError, "1-d"),
    (lambda out: [[1.0] for _ in out], TypeError, "integer token ids"),
    (lambda out: [None for _ in out], TypeError, "must be a list of token ids"),
]


@pytest.mark.parametrize("mangle,err,needle", BAD_OUT, ids=[b[2][:24] for b in BAD_OUT])
def test_malformed_generator_output_is_refused_by_name(mangle, err, needle):
    good = iid(lambda t, s: E)
    with pytest.raises(err) as e:
        check_generation(good, lambda p, n, s: mangle(good(p, n, s)), [()], n=30, positions=2)
    assert needle in str(e.value) and "generate_b" in str(e.value)


@pytest.mark.parametrize("kwargs,err,needle", [
    (dict(prompts=[]), ValueError, "prompts"), (dict(prompts="abc"), ValueError, "prompts"),
    (dict(n=0), ValueError, "n must be"), (dict(positions=0), ValueError, "positions"),
    (dict(positions=[]), ValueError, "positions"), (dict(alpha=0), ValueError, "alpha"),
    (dict(scorer=3), TypeError, "scorer"), (dict(generate_a=None), TypeError, "generate_a"),
])
def test_bad_arguments_are_refused_by_name(kwargs, err, needle):
    good = iid(lambda t, s: E)
    args = dict(generate_a=good, generate_b=good, prompts=[()], n=30) | kwargs
    with pytest.raises(err) as e:
        check_generation(args.pop("generate_a"), args.pop("generate_b"), args.pop("prompts"), **args)
    assert needle in str(e.value)


def test_a_non_rejection_is_worded_with_its_detectable_tv_never_as_holds():
    """verdict_words (issue 41 item 4) on a result written out by hand: the detectable TV quoted is the pooled
    test's at the first speculative position, the scope counts the positions tested of those asked."""
    from cactus_theory.theory.check_generation import verdict_words

    def t(pos, det, holm=1.0, exact=False):
        return {"name": f"position {pos}" + (" exact" if exact else ""), "position": pos, "detectable": det, "holm": holm}

    d = {"tests": [t(0, 0.2), t(1, 0.31), t(1, 0.5, exact=True), t(3, 0.4)], "reject": False, "prompts": 3, "n": 50,
         "power": 0.9, "not_tested": ["position 2: no prefix seen >= 20 times on both sides"]}
    assert verdict_words(d, 1) == ("no difference detected; a next-token TV >= 0.310 at every tested prefix of position 1 "
                                   "(the first position speculation can change) would be detected with probability "
                                   "0.9 (3 prompts, 3 of positions 0-3 tested, n = 50 decodes per prompt per side)")
    assert "TV >= 0.200 at every tested prefix of position 0" in verdict_words(d, 0)
    assert "position 2 (the first position speculation can change) was not tested" in verdict_words(d, 2)
    d |= {"reject": True, "tests": d["tests"][:3] + [t(3, 0.4, holm=2e-7)]}
    assert verdict_words(d, 1).startswith("differs (smallest Holm-adjusted p 2e-07; 3 prompts")
    assert "holds" not in verdict_words(d, 1) + verdict_words(d | {"reject": False}, 1)
    assert verdict_words(d | {"tests": []}, 1).startswith("untested")
