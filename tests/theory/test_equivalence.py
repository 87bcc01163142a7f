"""Equivalence mode (issue 41, item 2): upper confidence bounds on the next-token TV (``theory/equivalence.py``)
and ``check_generation(..., equivalence=eps)``.

The bound's coverage is simulated against TVs computed directly from the toy laws (not from the code under
test): 1,000 seeds for ``tv_upper_bound`` at confidence 0.9 and 200 seeds for the whole family of
``check_generation`` at ``alpha`` = 0.2 (joint confidence 0.8). Monte-Carlo tolerance: the coverage may fall
below its level by 3.1 standard errors (a binomial lower tail of ~0.001): 0.029 at 1,000 seeds and 0.9, 0.088 at
200 seeds and 0.8. The bounds are conservative (finite-sample, union bounds): every seed covered (1000 of 1000
on each pair, 200 of 200 for the family). The test still fails a wrong port that returns the plug-in alone
(497 of 1000 on the pair at TV 0.8, same seeds); it would pass one that drops the Clopper-Pearson box and
quarters Weissman's margin (970 of 1000), the price of conservative bounds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cactus_theory.cli import check_engine as ce
from cactus_theory.theory.check_generation import check_generation
from cactus_theory.theory.equivalence import l1_deviation, score_upper_bound, tv_upper_bound

pytestmark = pytest.mark.usefixtures("one_thread")


def _counts(x: np.ndarray) -> dict:
    vals, cnt = np.unique(x, return_counts=True)
    return dict(zip(vals.tolist(), cnt.tolist(), strict=True))


def _bound(xa: np.ndarray, xb: np.ndarray, delta: float) -> float:
    return tv_upper_bound(_counts(xa[::2]), _counts(xb[::2]), _counts(xa[1::2]), _counts(xb[1::2]), delta)[0]


def test_l1_deviation_is_weissman_et_al():
    """``(2^K - 2) exp(-m e^2 / 2) = delta`` solved for ``e``, written out."""
    for m, K, d in [(100, 2, 0.05), (1000, 8, 0.01), (50, 30, 0.1)]:
        e = l1_deviation(m, K, d)
        assert (2 ** K - 2) * math.exp(-m * e * e / 2) == pytest.approx(d, rel=1e-9)
    assert l1_deviation(0, 3, 0.1) == math.inf


def test_the_tv_bound_covers_over_1000_seeds():
    """Laws on 6 tokens at TV 0.12, 0 and 0.8 (the last two tokens swapped, where the plug-in alone is unbiased),
    150 draws a side, confidence 0.9."""
    rng = np.random.default_rng(0)
    pa = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    pb = np.array([0.28, 0.25, 0.15, 0.1, 0.06, 0.16])
    far_a, far_b = np.array([0.9, 0.1, 0, 0, 0, 0]), np.array([0.1, 0.9, 0, 0, 0, 0])
    for qa, qb in ((pa, pb), (pa, pa), (far_a, far_b)):
        tv = 0.5 * np.abs(qa - qb).sum()
        hits = sum(_bound(rng.choice(6, 150, p=qa), rng.choice(6, 150, p=qb), 0.1) >= tv for _ in range(1000))
        assert hits >= (0.9 - 0.029) * 1000, (tv, hits)


def test_the_tv_bound_clears_a_margin_when_the_laws_agree():
    """Not vacuous: identical laws on 4 tokens, 4,000 draws a side, delta 0.01: the bound is below 0.15 (Weissman's
    margin alone is ``sqrt(2 (ln 14 + ln 400) / 2000) = 0.093`` on 4 cells at most)."""
    rng = np.random.default_rng(1)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    u = _bound(rng.choice(4, 4000, p=p), rng.choice(4, 4000, p=p), 0.01)
    assert u < 0.15, u


def test_a_deterministic_prefix_is_bounded_by_the_clopper_pearson_box():
    """One token on both sides, 150 fit draws each, delta 0.05: ``S`` = that token, ``R`` empty; the box gives
    ``2U = (1 - lo) + hi_a(R) + hi_b(R)`` with ``lo = (d/2)^(1/150)``, ``hi(R) = 1 - (d/2)^(1/150)``,
    ``d = 0.025 / 4`` (written out here), far below Weissman's ``sqrt(2 (ln 2 + ln 80) / 150) = 0.26``."""
    u, plug, _ = tv_upper_bound({1: 150}, {1: 150}, {1: 150}, {1: 150}, 0.05)
    d = 0.025 / 4
    edge = 1 - (d / 2) ** (1 / 150)
    assert plug == 0.0 and u == pytest.approx(0.5 * 3 * edge, rel=1e-9) and u < 0.1


def test_the_score_bound_is_hoeffding():
    a, b = np.array([1.0, 0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0, 0.0])
    u, d, t = score_upper_bound(a, b, 0.1)
    assert d == 0.5 and t == pytest.approx(math.sqrt(math.log(20) / 4)) and u == min(1.0, d + t)


A0 = np.array([0.5, 0.3, 0.2])  # side a's first token
B0 = np.array([0.4, 0.3, 0.3])  # side b's: TV 0.1
A1 = np.array([0.6, 0.3, 0.1])  # the second token, independent of the first: TV 0.05 at every prefix
B1 = np.array([0.55, 0.3, 0.15])


def _two_tokens(first: np.ndarray, second: np.ndarray):
    def generate(prompts, n, seed):
        rng = np.random.default_rng(seed)
        size = len(prompts) * n
        return np.stack([rng.choice(3, size, p=first), rng.choice(3, size, p=second)], 1).tolist()
    return generate


def _first_is_zero(prompt, tokens):
    return float(tokens[0] == 0)


def test_the_family_of_bounds_covers_over_200_seeds():
    """Positions 0 and 1 and the answer (score: the first token is 0) at alpha 0.2: every row's bound is at least
    its true value (0.1, 0.05, |0.5 - 0.4|) in >= 0.8 - 0.088 of 200 seeds."""
    truth = {"position 0": 0.5 * np.abs(A0 - B0).sum(), "position 1": 0.5 * np.abs(A1 - B1).sum(),
             "answer": abs(A0[0] - B0[0])}
    covered = 0
    for seed in range(200):
        res = check_generation(_two_tokens(A0, A1), _two_tokens(B0, B1), ["p"], n=200, positions=2, alpha=0.2,
                               seed=seed, scorer=_first_is_zero, equivalence=0.3)
        rows = {r.name: r for r in res.equivalence}
        assert set(rows) == set(truth) and sum(r.delta * (r.strata if r.position is not None else 1)
                                               for r in res.equivalence) == pytest.approx(0.2)
        covered += all(rows[k].bound >= v for k, v in truth.items())
    assert covered >= (0.8 - 0.088) * 200, covered


def test_the_verdict_reads_tv_below_eps_or_the_decodes_needed():
    same = _two_tokens(A1, A1)
    res = check_generation(same, same, ["p"], n=3000, positions=1, alpha=0.05, equivalence=0.15)
    assert res.equivalent and "TV <= 0.15 at every tested prefix" in res.table() and ce.exit_status(res) == 0
    small = check_generation(same, same, ["p"], n=200, positions=1, alpha=0.05, equivalence=0.1)
    row = small.equivalence[0]
    assert small.equivalent is False and ce.exit_status(small) == ce.EXIT_NOT_EQUIVALENT
    assert 200 < row.needed < math.inf and f"about {row.needed:.0f} decodes per prompt" in small.table()
    again = check_generation(same, same, ["p"], n=int(row.needed), positions=1, alpha=0.05, equivalence=0.1)
    assert again.equivalent, again.table()  # the stated n is enough when the frequencies stay


@pytest.mark.parametrize("kwargs, needle", [
    ({"equivalence": 0.0, "positions": 1}, r"equivalence must be a TV margin in \(0, 1\), got 0.0"),
    ({"equivalence": 1.5, "positions": 1}, r"equivalence must be .*1.5"),
    ({"equivalence": math.nan, "positions": 1}, r"equivalence must be .*nan"),
    ({"equivalence": 0.1, "positions": None}, r"equivalence needs positions given"),
])
def test_bad_equivalence_arguments_are_refused_by_name(kwargs, needle):
    def never(prompts, n, seed):
        raise AssertionError("generated before the arguments were checked")

    with pytest.raises(ValueError, match=needle):
        check_generation(never, never, ["p"], n=50, **kwargs)


def test_check_engine_equivalence_reaches_the_verdict_and_the_exit_status(tmp_path, monkeypatch, capsys):
    """``--equivalence`` plumbed through ``check-engine`` on a stand-in engine (two toy generators of one law, no
    model): the bounds are in the JSON, and the exit status is 0 when they clear EPS and 4 when they do not."""
    import argparse
    import json

    from cactus_theory.integrations import engines

    same = _two_tokens(A1, A1)
    monkeypatch.setitem(engines.ENGINES, "loop", lambda opts, **models: engines.EngineRun(same, same, "a", "b"))
    for eps, n, want in ((0.5, 3000, 0), (0.05, 100, ce.EXIT_NOT_EQUIVALENT)):
        parser = argparse.ArgumentParser()
        ce.configure(parser)
        out = tmp_path / f"eq{eps}.json"
        args = parser.parse_args(["--prompt", "x", "--n", str(n), "--max-new-tokens", "2", "--equivalence", str(eps),
                                  "--alpha", "0.05", "--json", str(out)])
        assert ce.run(args, models={}) == want
        data = json.loads(out.read_text())
        assert data["equivalence"]["equivalent"] is (want == 0) and len(data["equivalence"]["rows"]) == 2
    assert "equivalence verdict" in capsys.readouterr().out
