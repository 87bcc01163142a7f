"""Interleaved timing rounds: the one way the project times a method against the verifier alone
(``benchmarks/bench_lm.py`` through ``lm.experiments.experiment.run_benchmark``, and ``cactus-theory decode
--baseline --rounds R``).

A CPU's speed drifts (frequency, other processes, the page cache, thermal state) over the minutes a
benchmark takes. Timing the verifier alone once before every method and once after lets that drift land
in every ratio. Here every job (the verifier alone and each method) runs once per round, in an order
drawn afresh each round (``numpy.random.default_rng(seed)``, so a run's orders are reproducible), and
each method's speed is compared with the verifier alone's **of the same round**: drift slower than a
round cancels in the round's ratio, and what is left varies from round to round, which the interval
over rounds then shows.

``ratio_over_rounds(num, den)``: the per-round ratios ``num_r / den_r``, their geometric mean (the
point) and a 95% Student-t interval over rounds of the log ratio, ``exp(mean +- t_{0.975, R-1} *
sd / sqrt(R))`` (R >= 2; with one round the interval is NaN). The log makes the interval of ``a / b``
the reciprocal of the interval of ``b / a``. The rounds are R repeated measurements of one ratio;
treating them as independent is the assumption (a drift slower than a round is cancelled by the
pairing, a faster one widens the interval).

``pooled_stats``: one ``DecodeStats`` for R rounds of the same decode: the counters of the first round
(every round decodes the same prompts with the same seed, so they are the same; ``same_decodes`` checks)
and each timing field's mean over rounds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["interleaved_rounds", "ratio_over_rounds", "drift", "pooled_stats", "same_decodes", "TIMING_FIELDS",
           "LEVEL"]

LEVEL = 0.95
TIMING_FIELDS = ("seconds", "draft_seconds", "verifier_seconds", "verify_seconds", "prefill_seconds",
                 "metric_seconds")


def interleaved_rounds(jobs: dict[str, Callable[[], object]], rounds: int, seed: int = 0,
                       on_done: Callable[[int, str, object], None] | None = None
                       ) -> tuple[dict[str, list], list[list[str]]]:
    """Run every job of ``jobs`` (name -> a call with no arguments) once per round, ``rounds`` rounds, each
    round in its own random order (``numpy.random.default_rng(seed)``'s permutations, one per round).
    Returns ``({name: [result of round 1, ..., round R]}, [order of round 1, ...])``. ``on_done(round,
    name, result)`` is called after each job (a progress bar)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    if not jobs:
        raise ValueError("jobs must name at least one job")
    names = list(jobs)
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {n: [] for n in names}
    orders = []
    for r in range(rounds):
        order = [names[i] for i in rng.permutation(len(names))]
        orders.append(order)
        for n in order:
            out[n].append(jobs[n]())
            if on_done is not None:
                on_done(r, n, out[n][-1])
    return out, orders


def ratio_over_rounds(num: Sequence[float], den: Sequence[float], level: float = LEVEL) -> dict:
    """``{"ratio", "ci", "rounds"}``: the per-round ratios ``num[r] / den[r]`` (``rounds``), their geometric
    mean (``ratio``) and the ``level`` Student-t interval over rounds of the log ratio (``ci``, [lo, hi];
    NaN with fewer than 2 rounds or a non-finite ratio)."""
    from scipy.stats import t

    if len(num) != len(den) or not num:
        raise ValueError(f"num and den must be non-empty and of one length, got {len(num)} and {len(den)}")
    ratios = [a / b if b > 0 and a > 0 else math.nan for a, b in zip(num, den, strict=True)]
    logs = np.log(ratios)
    point = float(np.exp(logs.mean())) if np.all(np.isfinite(logs)) else math.nan
    ci = [math.nan, math.nan]
    if len(logs) >= 2 and np.all(np.isfinite(logs)):
        half = float(t.ppf((1 + level) / 2, len(logs) - 1)) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
        ci = [float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))]
    return {"ratio": point, "ci": ci, "rounds": [float(x) for x in ratios]}


def drift(rates: Sequence[float]) -> float:
    """max / min of a job's per-round speeds (1 = no drift; NaN when a rate is not positive)."""
    if not rates or min(rates) <= 0:
        return math.nan
    return max(rates) / min(rates)


def pooled_stats(stats: Sequence):
    """One ``DecodeStats`` for the rounds ``stats`` of one decode: the first round's counters, each of
    ``TIMING_FIELDS`` the mean over rounds (so ``tokens_per_s`` is tokens over the mean decode time)."""
    if not stats:
        raise ValueError("stats must hold at least one round")
    return dataclasses.replace(stats[0], **{f: float(np.mean([getattr(s, f) for s in stats])) for f in TIMING_FIELDS})


def same_decodes(results: Sequence) -> bool:
    """Whether every round of one decode (``DecodeResult``s) emitted the same tokens with the same per-prompt
    counters (steps, accepted, drafted, KL, NLL; the timings aside) as the first."""
    def key(res):
        seqs = [{k: v for k, v in vars(c).items() if k != "seconds"} for c in res.per_sequence]
        return res.tokens, seqs

    first = key(results[0])
    return all(key(r) == first for r in results[1:])
