"""The compact Llama (``lm.llama``) computes the Hugging Face function, with its cache."""

from __future__ import annotations

import pytest
import torch

from cactus_theory.lm.llama import Llama
from tests.lm.common import V, tiny

pytestmark = pytest.mark.usefixtures("one_thread")


def test_compact_llama_computes_the_hf_function():
    ver = tiny(9, layers=3, scale=2.0)
    m = Llama.from_hf(ver)
    ids = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = ver(input_ids=ids, output_hidden_states=True)
        cache = m.new_cache(3, 32)
        logits, aux = m(ids, torch.zeros(3, dtype=torch.long), cache, aux_layers=(0, 2))
        assert torch.allclose(logits, out.logits, atol=1e-5)
        assert all(torch.allclose(a, out.hidden_states[i], atol=1e-5) for a, i in zip(aux, (0, 2), strict=True))
        # rows at different offsets, a stale speculative block overwritten in place
        cache = m.new_cache(3, 32)
        m(ids[:, :6], torch.zeros(3, dtype=torch.long), cache)
        m(torch.randint(0, V, (3, 4)), torch.full((3,), 6), cache)  # rejected drafts
        step, _ = m(ids[:, 6:10], torch.full((3,), 6), cache)
        assert torch.allclose(step, out.logits[:, 6:10], atol=1e-5)
        last, _ = m(ids[:, 6:10], torch.full((3,), 6), cache, logits_at=torch.tensor([0, 3, 1]))
        assert torch.allclose(last[:, 0], out.logits[[0, 1, 2], [6, 9, 7]], atol=1e-5)
