"""Engine-level bugs planted into our loop from outside (``tests/planted.py``; ``lm/loop.py`` and ``lm/cache.py``
are not edited) on the tiny random Llama pair of ``tests/lm/common.py``: each is caught by ``check_generation``
(the loop against the verifier alone), while a one-step kernel test (``toy.one_step_test``) on the kernel the
loop calls misses every one, and ``check_sampler`` catches the one that can live in a kernel (the bonus drawn
at another temperature) and passes the three that live outside it.

Setting (every test here): SpS, k = 1, 6 new tokens, temperature 0.7, top-k 5, two ragged prompts in one
batch, N = 3000 decodes per prompt per side, ALPHA = 1e-3 (Holm over the 6 positions), seed 0. Power: the
detection rate of each bug over 20 seeds at exactly this setting is measured by
``benchmarks/check_calibration.py --only planted`` (``benchmarks/results/check_calibration.json``, read back
below: every bug >= 0.9 there, its Clopper-Pearson interval stated in docs/statistical-tests.md). The correct loop
passes at this setting (a true null at ALPHA: false positive with probability <= 1e-3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cactus_theory as ct
from cactus_theory.integrations.engines import EngineOptions, loop_engine
from cactus_theory.lm.loop import first_step_laws
from cactus_theory.theory.check import check_sampler
from cactus_theory.theory.check_generation import check_generation
from cactus_theory.toy import one_step_test
from tests.lm.common import pair
from tests.planted import PLANTED

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA, N = 1e-3, 3000
PROMPTS = [[3, 5, 7], [1]]  # ragged: the second row is right-padded
SETTING = EngineOptions(rule=ct.SpS(), k=1, max_new_tokens=6, temperature=0.7, top_k=5, top_p=1.0, batch_size=2 * N)
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "check_calibration.json"


def planted_run(bug: str | None, seed: int = 0):
    eng = loop_engine(SETTING, pair=pair())
    plant = PLANTED[bug][1] if bug is not None else None

    def generate(prompts, n, s):
        if plant is None:
            return eng.generate_a(prompts, n, s)
        with plant():
            return eng.generate_a(prompts, n, s)

    return check_generation(generate, eng.generate_b, PROMPTS, n=N, positions=6, alpha=ALPHA, seed=seed)


def test_the_correct_loop_passes():
    res = planted_run(None)
    assert not res.reject, res.table()


@pytest.mark.parametrize("bug", list(PLANTED))
def test_check_generation_catches_the_planted_bug(bug):
    res = planted_run(bug)
    assert res.reject, res.table()
    assert res.tests[0].position == 0 and not res.tests[0].reject  # the prompt pass emits the first token: untouched


def kernel_rows():
    """(P, Q) for k = 1 from the tiny pair's laws after the sampling transforms (a kernel test's inputs)."""
    p, q = first_step_laws(pair(), [3, 5, 7, 1, 2], 2, 4, temperature=0.7, top_k=5, top_p=1.0)
    return p[:1], q[:2]


@pytest.mark.parametrize("bug", list(PLANTED))
def test_kernel_level_tests_see_only_the_bug_a_kernel_can_hold(bug):
    P, Q = kernel_rows()
    kernel = PLANTED[bug][2]
    assert not one_step_test(ct.SpS(), P, Q, num_samples=20_000, sampler=kernel, alpha=ALPHA).reject
    res = check_sampler(kernel, P, Q, tv=0.05, alpha=ALPHA, seed=0)
    assert res.reject == (bug == "bonus temperature"), res.table()
    if bug == "bonus temperature":
        assert res.parts["bonus"].reject and not res.parts["first"].reject


def test_the_committed_detection_rates_state_the_power():
    """The benchmark's measured detection rates at this file's setting (20 seeds each) are >= 0.9."""
    data = json.loads(RESULTS.read_text())["planted"]
    assert data["setting"]["n"] == N and data["setting"]["k"] == SETTING.k and data["setting"]["alpha"] == ALPHA
    for bug in PLANTED:
        row = data["bugs"][bug]
        assert row["check_generation"]["rate"] >= 0.9 and row["check_generation"]["seeds"] >= 20, (bug, row)
