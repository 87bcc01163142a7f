"""``lm.train.draft_build``: head training raises the held-out acceptance; the truncated law it distils
is the sampling law."""

from __future__ import annotations

import pytest
import torch

from cactus_theory.lm import sampling_probs
from cactus_theory.lm.draft import DraftConfig
from cactus_theory.lm.llama import Llama
from tests.lm.common import V, tiny, tiny_head

pytestmark = pytest.mark.usefixtures("one_thread")


def test_head_training_raises_held_out_acceptance():
    """Distillation with the training-time test raises the acceptance at every draft depth."""
    from cactus_theory.lm.train.draft_build import collect_forced, depth_acceptance, train_head

    ver = tiny(13, layers=3, scale=2.0)
    m = Llama.from_hf(ver)
    g = torch.Generator().manual_seed(0)
    seqs = [(torch.randint(0, V, (20,), generator=g).tolist(), 2) for _ in range(48)]
    corpus = collect_forced(m, seqs, 8, (0, 1, 2), progress=False)
    held = collect_forced(m, seqs[:0] + [(torch.randint(0, V, (20,), generator=g).tolist(), 2) for _ in range(12)],
                          8, (0, 1, 2), progress=False)
    head = tiny_head(ver, shortlist=tuple(range(V)))
    cfg = DraftConfig(shortlist=V, epochs=12, batch_tokens=256, lr=1e-2, ttt_steps=2, top_k=0, top_p=1.0,
                      temperature=1.0)
    before = depth_acceptance(head, held, cfg, depths=2)
    losses = train_head(head, corpus, cfg, progress=False)
    after = depth_acceptance(head, held, cfg, depths=2)
    assert losses[-1] < losses[0]
    assert after[0] > before[0] + 0.05 and after[1] > before[1] + 0.05


@pytest.mark.parametrize("top_k,top_p", [(20, 0.95), (5, 1.0), (0, 0.9), (0, 1.0)])
def test_truncated_law_is_the_sampling_law(top_k, top_p):
    from cactus_theory.lm.train.draft_build import truncated_law

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    cfg = DraftConfig(temperature=0.6, top_k=top_k, top_p=top_p)
    vals, rows = truncated_law(logits, cfg)
    full = torch.zeros(6, 50).scatter(-1, rows, vals)
    assert torch.allclose(full, sampling_probs(logits, 0.6, top_k, top_p), atol=1e-6)
