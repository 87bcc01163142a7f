"""The sampling transforms (``core.transforms``: temperature, top-k, top-p) and their argument checks."""

from __future__ import annotations

import math

import pytest
import torch

from cactus_theory.core.transforms import check_sampling, sampling_probs

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sampling_probs_temperature_topk_topp():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    full = sampling_probs(logits, 1.0)
    assert torch.allclose(full, logits.softmax(-1))
    hot = sampling_probs(logits, 0.5)
    assert torch.allclose(hot, (logits / 0.5).softmax(-1))
    top2 = sampling_probs(logits, 1.0, top_k=2)
    assert torch.allclose(top2[0, :2], logits[0, :2].softmax(-1)) and float(top2[0, 2:].sum()) == 0
    # top-p keeps the smallest prefix whose mass reaches top_p (the crossing token included)
    pr = logits.softmax(-1)[0]
    nucleus = sampling_probs(logits, 1.0, top_p=float(pr[0] + 1e-3))
    assert torch.allclose(nucleus[0, :2], pr[:2] / pr[:2].sum()) and float(nucleus[0, 2:].sum()) == 0
    assert torch.equal(sampling_probs(logits, 1.0, top_p=float(pr[0]) * 0.5)[0], torch.tensor([1.0, 0, 0, 0, 0]))
    greedy = sampling_probs(logits, 0.0)
    assert torch.equal(greedy[0], torch.tensor([1.0, 0, 0, 0, 0]))
    inf = torch.tensor([[0.0, -math.inf, 1.0]])
    assert float(sampling_probs(inf, 0.7, top_k=2)[0, 1]) == 0


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(temperature=float("nan"))])
def test_sampling_args_rejected(bad):
    kw = dict(temperature=1.0, top_k=0, top_p=1.0) | bad
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        check_sampling(**kw)
