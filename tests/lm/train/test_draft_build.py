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


@pytest.mark.parametrize("top_k,top_p", [(20, 0.95), (5, 1.0), (0, 0.9)])
def test_step_loss_and_its_gradient_equal_the_plain_autograd_formula(top_k, top_p):
    """``step_loss`` ("acc+kl1") reads the shortlist logits through ``_TopLSE`` (one-pass backward):
    its value and its gradient equal the formula written with plain torch ops and autograd (float64
    logits, 1e-10), including shortlist columns repeated in ``qidx`` (rows outside the shortlist, -1)."""
    from cactus_theory.lm.train.draft_build import step_loss

    g = torch.Generator().manual_seed(1)
    n, S, K = 7, 40, 8
    z = (torch.randn(n, S, generator=g, dtype=torch.float64) * 2).requires_grad_()
    top_lp = torch.randn(n, K, generator=g, dtype=torch.float64).log_softmax(-1).sort(-1, descending=True).values
    qidx = torch.randint(-1, S, (n, K), generator=g)
    qidx[0, :3] = -1  # teacher tokens outside the shortlist
    cfg = DraftConfig(temperature=0.6, top_k=top_k, top_p=top_p, loss="acc+kl1")

    def reference(z):
        inside = qidx >= 0
        at = qidx.clamp_min(0)
        q = sampling_probs(top_lp, 0.6, top_k, top_p).to(z.dtype)  # the teacher's q' on its top tokens
        q = torch.where(inside, q, torch.zeros_like(q))
        p = sampling_probs(z, 0.6, top_k, top_p).to(z.dtype)  # the draft's p' over the whole shortlist
        x = z / 0.6
        kk = top_k if 0 < top_k < S else S
        v, i = x.topk(kk, dim=-1)
        if top_p < 1:
            from cactus_theory.core.transforms import nucleus
            v = nucleus(v, top_p)
        p = torch.full_like(x, -torch.inf).scatter(-1, i, v).softmax(-1)  # differentiable in z
        tv = 1 - torch.minimum(torch.where(inside, p.gather(-1, at), torch.zeros_like(q)), q).sum(-1)
        q1 = torch.where(inside, top_lp.softmax(-1), torch.zeros_like(q))
        lp1 = z.log_softmax(-1).gather(-1, at)
        kl1 = (torch.special.xlogy(q1, q1) - q1 * lp1).sum(-1)
        return tv.mean() + 0.1 * kl1.mean()

    ours = step_loss(z, top_lp, qidx, cfg)
    (g_ours,) = torch.autograd.grad(ours, z)
    ref = reference(z)
    (g_ref,) = torch.autograd.grad(ref, z)
    assert abs(float(ours) - float(ref)) < 1e-10
    assert float((g_ours - g_ref).abs().max()) < 1e-10
    assert float(g_ref.abs().max()) > 1e-3  # the gradient is not trivially zero
