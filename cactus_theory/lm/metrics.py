"""What a decoding run measures: counters per run and per sequence, the exact step divergence of a
rule at each verified position, and the verifier's NLL of the emitted tokens.

Units (``../shared/DESIGN.md``): ``al`` is the paper's AL as vLLM reports it, tokens emitted per
verifier call with the bonus token included (with ``k`` drafts it lies in [1, k + 1]);
``acceptance_rate`` is per-token acceptance, accepted drafts / drafted tokens (every step drafts
``k``); ``position_acceptance`` is accepted drafts / drafts the verifier reached (a rejection ends a
step, so the drafts after it are never judged), the mean acceptance probability of a judged draft.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..core.exact import step_divergence
from ..core.rules import Rule

if TYPE_CHECKING:  # torch only annotates ``nll_of``: the eval reads ``COUNTERS`` and ``al_of`` without it
    import torch

__all__ = ["DecodeStats", "DecodeResult", "SequenceCounters", "step_kl", "KL_MAX_SUPPORT", "al_of", "COUNTERS"]

KL_MAX_SUPPORT = 4096  # rules without a fast exact law: step KL only when the support is this small
# the additive counters of a sequence that an eval record keeps (``SequenceCounters`` has ``judged`` too)
COUNTERS = ("new_tokens", "steps", "accepted", "drafted", "kl_sum", "kl_count", "nll_sum", "nll_count")


def al_of(accepted, steps) -> float:
    """The paper's AL from pooled counters: tokens emitted per verifier call, bonus included,
    (accepted drafts + verifier calls) / verifier calls; nan without a call."""
    return (accepted + steps) / steps if steps else math.nan


@dataclass
class SequenceCounters:
    """Counters of one sequence (one prompt) of a run: the unit of paired statistics and bootstraps."""

    new_tokens: int = 0
    steps: int = 0  # verifier calls that advanced this sequence (prefill not counted)
    accepted: int = 0  # accepted drafts (bonus not counted)
    drafted: int = 0  # k per step
    judged: int = 0  # drafts the verifier reached: accepted + one per step with a rejection
    kl_sum: float = 0.0
    kl_count: int = 0
    nll_sum: float = 0.0
    nll_count: int = 0
    seconds: float = 0.0  # decode time of its batch, shared equally by the batch's sequences

    @property
    def al(self) -> float:
        """Tokens emitted per verifier call, bonus included (the paper's AL, ``al_of``)."""
        return al_of(self.accepted, self.steps)


@dataclass
class DecodeStats:
    """Counters of one decoding run and the figures derived from them (see the module docstring)."""

    method: str
    rule: str = "-"
    k: int = 0
    sequences: int = 0
    new_tokens: int = 0
    steps: int = 0  # verification steps, summed over rows
    accepted: int = 0
    drafted: int = 0
    judged: int = 0
    verifier_calls: int = 0  # batched verifier forwards while decoding (prefill not counted)
    draft_calls: int = 0
    prefill_calls: int = 0
    seconds: float = 0.0  # decode wall time, metric computation excluded
    draft_seconds: float = 0.0  # profile: draft forwards and sampling
    verifier_seconds: float = 0.0  # verifier forwards and the sampling transforms of q
    verify_seconds: float = 0.0  # sampler.verify
    prefill_seconds: float = 0.0  # the prompts' prefill and each row's first token (part of ``seconds``)
    metric_seconds: float = 0.0  # step KL and NLL (excluded from ``seconds``)
    kl_sum: float = 0.0
    kl_count: int = 0
    kl_skipped: int = 0
    nll_sum: float = 0.0
    nll_count: int = 0

    @property
    def al(self) -> float:
        """AL: tokens emitted per verifier call, bonus included (``al_of``)."""
        return al_of(self.accepted, self.steps)

    @property
    def accepted_per_step(self) -> float:
        return self.accepted / self.steps if self.steps else math.nan

    @property
    def acceptance_rate(self) -> float:
        """Per-token acceptance: accepted drafts / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else math.nan

    @property
    def position_acceptance(self) -> float:
        """Accepted drafts / drafts the verifier judged (the mean acceptance of a judged draft)."""
        return self.accepted / self.judged if self.judged else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else math.nan

    @property
    def bookkeeping_seconds(self) -> float:
        """What a step spends outside its phases (advancing caches, emitting, dropping finished rows): ``seconds``
        less draft, verifier forward, verify and the prefill."""
        return max(0.0, self.seconds - self.draft_seconds - self.verifier_seconds - self.verify_seconds
                   - self.prefill_seconds)

    @property
    def mean_step_kl(self) -> float:
        return self.kl_sum / self.kl_count if self.kl_count else math.nan

    @property
    def nll(self) -> float:
        return self.nll_sum / self.nll_count if self.nll_count else math.nan

    def profile(self) -> str:
        """Per verifier call: milliseconds in draft / verifier forward / verify / bookkeeping / the prefill."""
        n = max(1, self.verifier_calls)
        parts = (("draft", self.draft_seconds), ("verifier", self.verifier_seconds), ("verify", self.verify_seconds),
                 ("bookkeeping", self.bookkeeping_seconds), ("prefill", self.prefill_seconds))
        return ", ".join(f"{name} {1000 * s / n:.1f} ms" for name, s in parts) + " per step"

    def as_dict(self) -> dict:
        d = asdict(self)
        for name in ("al", "accepted_per_step", "acceptance_rate", "position_acceptance", "tokens_per_s",
                     "bookkeeping_seconds", "mean_step_kl", "nll"):
            d[name] = getattr(self, name)
        return d


@dataclass
class DecodeResult:
    """Tokens and texts per prompt, the run's statistics and each sequence's counters."""

    tokens: list[list[int]]
    texts: list[str] | None
    stats: DecodeStats
    prompts: list[list[int]] = field(default_factory=list)
    per_sequence: list[SequenceCounters] = field(default_factory=list)


def step_kl(rule: Rule, p: np.ndarray, q: np.ndarray) -> float | None:
    """Exact ``KL(h_alg || q)`` of one step, computed on the union support of ``p`` and ``q`` (tokens
    outside it carry no mass in ``h_alg``) plus zero-mass padding so row statistics (top-k rank)
    are unchanged (at least ``rule.rank_depth()`` entries). None when a rule without a fast exact law meets a support above ``KL_MAX_SUPPORT``,
    and for a rule that reads the verifier's head (DropMatch: its law needs the dropout path law, which
    one decoding step does not estimate; ``dropmatch.step_law`` computes it on teacher-forced rows)."""
    if rule.reads_head:
        return None
    sup = np.flatnonzero((p > 0) | (q > 0))
    if not getattr(rule, "two_block", False) and sup.size > KL_MAX_SUPPORT:
        return None
    need = max(1, rule.rank_depth() - sup.size)
    rest = np.flatnonzero((p <= 0) & (q <= 0))[:need]
    idx = np.concatenate([sup, rest])
    pc, qc = p[idx].astype(np.float64), q[idx].astype(np.float64)
    pc, qc = pc / pc.sum(), qc / qc.sum()
    v = float(step_divergence(rule, pc, qc, check=False))
    return 0.0 if abs(v) < 1e-12 else v  # float rounding of a lossless step prints as 0, not -1e-17


def nll_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Verifier NLL (untransformed, temperature 1) of ``tokens`` (B, W) under ``logits`` (B, W, V): (B, W)."""
    lp = logits.float().log_softmax(-1)
    return -lp.gather(-1, tokens.clamp_min(0).unsqueeze(-1)).squeeze(-1)
