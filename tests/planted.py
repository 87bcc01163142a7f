"""Planted engine-level bugs of the speculative loop, the kind one-step kernel tests miss: each is a context
manager that patches ``cactus_theory.lm.loop`` (or the drafter's draw in ``lm.cache``) from outside while it
is active, without editing either file, plus the kernel-level version where the bug can live in a kernel.
Used by ``tests/lm/test_planted_bugs.py`` and ``benchmarks/check_calibration.py``.

  ``reused_draft_noise``   the target's recovery draw at the rejected position reuses the uniform that drew the
                           draft there (vLLM #54282: the draft's Gumbel noise reused by the target's resampling);
                           the kernel alone, handed independent drafts, is verify itself.
  ``q_before_transforms``  the verifier's block ``q`` is the raw softmax while the drafts are drawn after the
                           sampling transforms (transformers #47932): the kernel gets (p, q) as the loop computes
                           them and is right.
  ``padded_rows_not_rolled_back``  in a ragged batch, the verifier's cache of every right-padded row (a prompt
                           shorter than the batch's longest) is not rolled back past the rejected draft: after a
                           rejection it keeps ``a + 2`` positions of the block instead of ``a + 1``, so the
                           rejected draft stays in its context.
  ``bonus_at_temperature``  the bonus token (all ``k`` drafts accepted) is drawn from the verifier's last row at
                           another temperature; ``bonus_tempered`` is the same bug inside a kernel.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

from cactus_theory.core.sampler import sample_rows, verify
from cactus_theory.core.transforms import sampling_probs

__all__ = ["PLANTED", "WEAKER", "reused_draft_noise", "q_before_transforms", "padded_rows_not_rolled_back",
           "bonus_at_temperature", "bonus_tempered", "first_row_kernel"]


@contextlib.contextmanager
def reused_draft_noise():
    """Drafts drawn by inverse CDF from logged uniforms; the target's recovery token at the first rejected
    position ``a`` drawn by inverse CDF from the residual with the *same* uniform ``u_a``."""
    from cactus_theory.lm import cache, loop

    assert hasattr(cache, "_sample") and hasattr(loop, "verify"), "the loop's draw / verify names moved"
    log: list[torch.Tensor] = []
    real_verify = loop.verify

    def sample(logits, sampling, gen):
        p = sampling_probs(logits, *sampling)
        u = torch.rand(p.shape[0], generator=gen, dtype=torch.float64, device=p.device)
        log.append(u)
        return sample_rows(p, u), p

    def shared_noise_verify(drafts, p, q, rule, generator=None, check=True):
        tokens, a = real_verify(drafts, p, q, rule, generator=generator, check=check)
        B, k = drafts.shape
        u = torch.stack(log[-k:], 1) if len(log) >= k else None  # this step's draft uniforms
        log.clear()
        rows = torch.nonzero(a < k)[:, 0]
        if u is not None and rows.numel():
            j = a[rows]
            g = rule.residual(p[rows, j], q[rows, j], drafts[rows, j], check=False)
            tokens[rows, j] = sample_rows(g, u[rows, j])
        return tokens, a

    with mock.patch.object(cache, "_sample", sample), mock.patch.object(loop, "verify", shared_noise_verify):
        yield


@contextlib.contextmanager
def q_before_transforms():
    """The verifier's (n, k + 1, V) block of logits goes through a plain softmax (temperature 1, no top-k /
    top-p); every other call (drafts, the prompt pass, the verifier alone) keeps the transforms."""
    from cactus_theory.lm import loop

    real = loop.sampling_probs

    def probs(logits, temperature=1.0, top_k=0, top_p=1.0):
        return real(logits) if logits.ndim == 3 else real(logits, temperature, top_k, top_p)

    with mock.patch.object(loop, "sampling_probs", probs):
        yield


@contextlib.contextmanager
def padded_rows_not_rolled_back():
    """The verifier's cache (``lm.cache.Target``, as the loop builds it) of each right-padded row keeps the slot
    of the rejected draft after a rejection (``a + 2`` positions: the pending token, the ``a`` accepted drafts and
    the rejected one)."""
    from cactus_theory.lm import loop

    class NotRolledBack(loop.Target):
        def prefill(self, ids, lens):
            self.padded = lens < lens.max()
            return super().prefill(ids, lens)

        def score(self, drafts):
            self.read = 1 + (0 if drafts is None else drafts.shape[1])
            return super().score(drafts)

        def advance(self, a, last):  # a padded row that rejected keeps the rejected draft's slot too
            super().advance(torch.where(self.padded & (a < self.read - 1), a + 1, a), last)

        def select(self, idx):
            super().select(idx)
            self.padded = self.padded[idx]

    with mock.patch.object(loop, "Target", NotRolledBack):
        yield


@contextlib.contextmanager
def bonus_at_temperature(temperature: float):
    """The verifier's last row of each block (the bonus position) transformed at ``temperature`` instead of
    the loop's; the other rows as the loop computes them."""
    from cactus_theory.lm import loop

    real = loop.sampling_probs

    def probs(logits, t=1.0, top_k=0, top_p=1.0):
        out = real(logits, t, top_k, top_p)
        if logits.ndim == 3:
            out = out.clone()
            out[:, -1] = real(logits[:, -1], temperature, top_k, top_p)
        return out

    with mock.patch.object(loop, "sampling_probs", probs):
        yield


def bonus_tempered(tau: float):
    """The kernel version of ``bonus_at_temperature``: verify, with the bonus row ``q_k`` replaced by
    ``q_k^(1 / tau)`` renormalised."""
    def kernel(drafts, p, q, rule, generator=None, check=True):
        q2 = q.clone()
        b = q[:, -1].double().pow(1 / tau)
        q2[:, -1] = (b / b.sum(-1, keepdim=True)).to(q.dtype)
        return verify(drafts, p, q2, rule, generator=generator, check=check)

    return kernel


def first_row_kernel(drafts, p, q, rule, generator=None, check=True):
    """The kernel the loop hands its (p, q) to under the loop-level plants: ``verify`` itself."""
    return verify(drafts, p, q, rule, generator=generator, check=check)


# bug id -> (description, context manager factory, the kernel a one-step test sees)
PLANTED = {
    "reused noise": ("the draft's noise reused for the target's recovery draw", reused_draft_noise, first_row_kernel),
    "q before transforms": ("q taken before the sampling transforms, drafts drawn after them", q_before_transforms,
                            first_row_kernel),
    "cache not rolled back": ("a padded row's KV cache not rolled back after a rejection (ragged batch)",
                              padded_rows_not_rolled_back, first_row_kernel),
    "bonus temperature": ("the bonus token drawn at another temperature (2.1 for the loop's 0.7)",
                          lambda: bonus_at_temperature(2.1), bonus_tempered(3.0)),
}
# a weaker variant, measured by the benchmark only (its power at the tests' setting is below 0.9)
WEAKER = {"bonus temperature 1.4": ("the bonus token drawn at temperature 1.4 for the loop's 0.7",
                                    lambda: bonus_at_temperature(1.4), bonus_tempered(2.0))}
