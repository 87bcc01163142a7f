"""``lm.data``: training prompts are seeded and disjoint from the evaluation prompts."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


def test_training_prompts_are_seeded_and_disjoint_from_the_evaluation_set():
    from cactus_theory.lm.data import prompt_set, training_prompts

    a = training_prompts(30, seed=0)
    assert a == training_prompts(30, seed=0) and a != training_prompts(30, seed=1)
    assert len(a) == 30 and not set(a) & set(prompt_set())
    with pytest.raises(ValueError, match="per_style"):
        prompt_set(0)
