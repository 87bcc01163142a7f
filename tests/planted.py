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

The engines' negative controls (issue 41, ``benchmarks/engine_controls.py``): the same bug planted into an engine
we do not own, from outside, so that ``check-engine``'s verdict on that engine has a known-positive beside it.

  ``tempered_target``      the rejection step verifies the drafts against the verifier's rows at temperature
                           ``T / c`` (its logits, already divided by ``T`` and top-k / top-p masked, times ``c``);
                           the bonus row and every step without drafts stay right. On the drafted positions the
                           emitted law is then ``q_c = softmax(c log q)`` on ``q``'s support (SpS is exact for the
                           ``q`` it is given), at next-token TV ``TV(q, q_c)`` from the verifier's. Planted into
                           transformers' ``_speculative_sampling`` (``transformers_tempered_target``) and into vLLM
                           V1's ``rejection_sample`` (``plant_vllm_tempered_target``, in every vLLM process).
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

from cactus_theory.core.sampler import sample_rows, verify
from cactus_theory.core.transforms import sampling_probs

__all__ = ["PLANTED", "WEAKER", "reused_draft_noise", "q_before_transforms", "padded_rows_not_rolled_back",
           "bonus_at_temperature", "bonus_tempered", "first_row_kernel", "tempered_target", "tempered_law",
           "transformers_tempered_target", "plant_vllm_tempered_target"]


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


def tempered_target(logits: torch.Tensor, c: float) -> torch.Tensor:
    """The planted bug's target logits: ``logits * c`` (``-inf`` stays ``-inf``: the support is kept)."""
    if not c > 0:
        raise ValueError(f"c must be > 0, got {c!r}")
    return logits * c


def tempered_law(q: torch.Tensor, c: float) -> torch.Tensor:
    """``q_c = softmax(c log q)`` on ``q``'s support: the law the planted rejection step emits where ``q`` is the
    verifier's row after the sampling transforms (rows of ``q`` sum to 1)."""
    logq = torch.where(q > 0, q.log(), torch.full_like(q, -torch.inf))
    return torch.softmax(tempered_target(logq, c), dim=-1)


@contextlib.contextmanager
def transformers_tempered_target(c: float):
    """transformers' ``_speculative_sampling`` handed ``new_logits`` whose drafted rows (``:candidate_length``,
    already through the logits processors) are multiplied by ``c``; the bonus row stays right."""
    from transformers.generation import utils as gu

    real = gu._speculative_sampling

    def planted(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kwargs):
        new_logits = new_logits.clone()
        new_logits[:, :candidate_length] = tempered_target(new_logits[:, :candidate_length], c)
        return real(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kwargs)

    with mock.patch.object(gu, "_speculative_sampling", planted):
        yield


def plant_vllm_tempered_target(c: float, marker: str | None = None) -> None:
    """vLLM V1's module function ``rejection_sample`` (what ``RejectionSampler.forward`` calls, and what the project's
    plugin calls when no rule is set) handed ``target_logits * c``; ``bonus_token_ids``, sampled before it, stay
    right. For the process it runs in, for good (vLLM's CPU build spawns its engine processes: the caller runs this
    in each of them, see benchmarks/engine_controls.py). ``marker``: a file this process appends its pid to at its
    first call with drafts, so that the caller can confirm the bug reached the process that verifies."""
    import os

    from vllm.v1.sample import rejection_sampler as rs

    tempered_target(torch.zeros(1), c)  # refuses a bad c here, not inside the engine
    real = rs.rejection_sample
    seen: list = []

    def planted(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
                *args, **kwargs):
        if marker and not seen and sum(num_draft_tokens):
            seen.append(True)
            with open(marker, "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()}\n")
        return real(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                    tempered_target(target_logits, c), *args, **kwargs)

    rs.rejection_sample = planted
