"""One checked claim: the row type shared by ``cactus-theory verify`` and the reproduction report.

A ``Claim`` is one check of one statement. Several checks of the same statement (a figure step and
the randomised ``verify`` checks, say) share its ``key``; a report shows them as one claim and
counts each statement once (``group``, ``combined_verdict``).

``kind`` says whose statement it is:
  ``"paper"``    a claim the paper makes (a theorem, a number in a table or figure);
  ``"derived"``  a result the project derived or observed (PAPER.md's notes), not the paper's text;
  ``"code"``     a check of our own code (fast path = generic path, conventions, samplers).

``verdict`` (``VERDICTS``):
  ``"holds"``         exact checks pass, or an empirical 95% interval excludes the opposite direction,
                      on the paper's own setting;
  ``"consistent"``    as "holds", but measured on another model or scale (``scope`` says which,
                      e.g. "SmolLM2-135M, k = 4"): evidence of the direction, not of the paper's numbers;
  ``"inconclusive"``  the 95% interval contains no effect (it straddles the comparison point);
  ``"differs"``       an exact check fails, or the interval excludes the paper's direction;
  ``"out of reach"``  not measurable here, or fewer than ``MIN_POINTS`` comparable points.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

__all__ = ["Claim", "Interval", "KINDS", "VERDICTS", "MIN_POINTS", "exact_verdict", "interval_verdict",
           "bootstrap_interval", "combined_verdict", "all_of", "group"]

KINDS = ("paper", "derived", "code")
VERDICTS = ("holds", "consistent", "inconclusive", "differs", "out of reach")
MIN_POINTS = 5  # fewer comparable points than this: "out of reach"


@dataclass
class Claim:
    """One check of one statement (see the module docstring for ``kind`` and ``verdict``)."""

    key: str  # the statement's id; checks with one key are checks of one statement
    claim: str  # the statement, in words
    ref: str  # where it is stated: "Theorem 1", "PAPER.md note", "exact.py"
    kind: str  # one of KINDS
    how: str  # how we checked it
    ours: str  # what we measured, with the numbers
    verdict: str  # one of VERDICTS
    paper: str = ""  # the paper's statement or number (kind "paper" only)
    scope: str = ""  # for "consistent": the model / scale the evidence comes from
    detail: str = ""  # the counterexample, or a note on the threshold
    source: str = ""  # which step produced the check ("verify", "fig_b_gamma", ...)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.kind != "paper" and self.paper:
            raise ValueError(f"only a claim of kind 'paper' has a paper column, got kind {self.kind!r} "
                             f"with paper={self.paper!r}")
        if (self.verdict == "consistent") != bool(self.scope):
            raise ValueError("a 'consistent' verdict needs a scope (the model / scale measured), and only it: "
                             f"got verdict {self.verdict!r}, scope {self.scope!r}")

    @property
    def passed(self) -> bool:
        """The check supports the statement ("holds" or "consistent")."""
        return self.verdict in ("holds", "consistent")

    @property
    def label(self) -> str:
        """The verdict as printed: ``"consistent: SmolLM2-135M, k = 4"`` or the verdict itself."""
        return f"consistent: {self.scope}" if self.verdict == "consistent" else self.verdict


def exact_verdict(ok: bool) -> str:
    """Verdict of an exact (deterministic, or to float / solver precision) check."""
    return "holds" if ok else "differs"


@dataclass
class Interval:
    """An estimate with its two-sided interval over ``n`` units (prompts, draws); unpacks as a tuple."""

    estimate: float
    lo: float
    hi: float
    n: int
    level: float = 0.95

    def __iter__(self):
        return iter((self.estimate, self.lo, self.hi))

    def __str__(self) -> str:
        return f"{self.estimate:.3g} [{self.lo:.3g}, {self.hi:.3g}]"


def bootstrap_interval(units, statistic: Callable[[np.ndarray], float] = np.mean, *, level: float = 0.95,
                       n_boot: int = 10_000, seed: int = 0) -> Interval:
    """Percentile bootstrap over units: ``units`` (n,) or (n, m) (one row per unit, e.g. per prompt),
    ``statistic(rows) -> float`` (default: the mean of a 1-D sample). Resamples rows with
    replacement ``n_boot`` times (seeded) and returns the statistic on all rows with the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of its resampled values."""
    x = np.asarray(units, dtype=np.float64)
    n = x.shape[0]
    est = float(statistic(x))
    if n < 2:
        return Interval(est, -np.inf, np.inf, n, level)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    vals = np.array([statistic(x[i]) for i in idx], dtype=np.float64)
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        return Interval(est, -np.inf, np.inf, n, level)
    lo, hi = np.quantile(vals, [(1 - level) / 2, (1 + level) / 2])
    return Interval(est, float(lo), float(hi), n, level)


def interval_verdict(iv: Interval, *, above: float = 0.0, scope: str = "", min_points: int = MIN_POINTS) -> str:
    """Verdict of the claim "the quantity exceeds ``above``" from its interval ``iv``: "out of reach"
    with fewer than ``min_points`` units; "holds" (or "consistent" when ``scope`` names another model
    or scale) if the whole interval lies above; "differs" if it lies below; else "inconclusive"."""
    if iv.n < min_points:
        return "out of reach"
    if iv.lo > above:
        return "consistent" if scope else "holds"
    if iv.hi < above:
        return "differs"
    return "inconclusive"


def combined_verdict(checks: Iterable[Claim]) -> str:
    """One verdict for several checks of one statement: "differs" if any check differs, else
    "inconclusive" if any is, else "holds" if any holds, else "consistent" if any is, else out of reach."""
    vs = {c.verdict for c in checks}
    for v in ("differs", "inconclusive", "holds", "consistent"):
        if v in vs:
            return v
    return "out of reach"


def all_of(verdicts: Iterable[str]) -> str:
    """Verdict of a conjunction ("each of these exceeds SpS"): the weakest part decides, in the order
    differs, inconclusive, out of reach, consistent, holds."""
    vs = set(verdicts)
    for v in ("differs", "inconclusive", "out of reach", "consistent"):
        if v in vs:
            return v
    return "holds"


def group(claims: Iterable[Claim]) -> dict[str, list[Claim]]:
    """Checks grouped by statement ``key``, in order of first appearance."""
    out: dict[str, list[Claim]] = {}
    for c in claims:
        out.setdefault(c.key, []).append(c)
    return out
