"""One checked claim: the row type shared by ``cactus-theory verify`` and the reproduction report.

A ``Claim`` is one check of one statement. Several checks of the same statement (a figure step and
the randomised ``verify`` checks, say) share its ``key``; a report shows them as one claim and
counts each statement once (``group``, ``combined_verdict``).

``role`` says what a check weighs (``ROLES``). Each statement has exactly one ``"primary"`` check: the
most powerful one on the setting closest to the paper's; its verdict is the statement's. Every other
check is secondary and labelled: ``"underpowered"`` (too few units to decide), ``"same runs"`` (another
view or metric of the primary's runs: not independent evidence), ``"other protocol"`` (another setting,
e.g. batch 1 instead of batch 32: read as its own setting, never against the primary) or
``"independent"`` (a second check of similar power on a comparable setting). A secondary check never
vetoes the primary; only an ``"independent"`` one that points the other way (one supports the
statement, the other's interval excludes it) turns the verdict into "inconclusive (checks disagree)"
(``resolve``).

``kind`` says whose statement it is:
  ``"paper"``    a claim the paper makes (a theorem, a number in a table or figure);
  ``"derived"``  a result the project derived or observed (PAPER.md's notes), not the paper's text;
  ``"code"``     a check of our own code (fast path = generic path, conventions, samplers).

``verdict`` (``VERDICTS``):
  ``"holds"``         exact checks pass, or an empirical 95% interval excludes the opposite direction,
                      on the paper's own setting (a paper claim never with a ``scope``); a result we derived
                      or a check of our code measured on toy or random models names them in ``scope``
                      ("holds (on toy pairs)"): there is no paper setting to hold on, but the reader must
                      see that the evidence is toy-only;
  ``"consistent"``    as "holds", but measured on another model or scale (``scope`` says which,
                      e.g. "SmolLM2-135M, k = 4"): evidence of the direction, not of the paper's numbers;
  ``"inconclusive"``  the 95% interval contains no effect (it straddles the comparison point);
  ``"differs"``       an exact check fails, or the interval excludes the paper's direction;
  ``"out of reach"``  not measurable here, or fewer than ``MIN_POINTS`` comparable points.
Every verdict measured on another model, task or scale names it in ``scope``, whatever the verdict
("consistent" must; "inconclusive" and "differs" should); a paper claim's "holds" never has one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ..core.validate import check_int, check_number, check_positive_int

__all__ = ["Claim", "Interval", "Resolution", "KINDS", "VERDICTS", "ROLES", "MIN_POINTS", "exact_verdict",
           "interval_verdict", "band_verdict", "bootstrap_interval", "t_interval", "holm", "mcnemar_mdd", "combined_verdict",
           "resolve", "all_of", "group", "plural", "NonInferiority", "noninferiority", "noninferiority_verdict",
           "noninferiority_power", "noninferiority_sample_size", "t_mdd", "jackknife_t_interval"]

KINDS = ("paper", "derived", "code")
VERDICTS = ("holds", "consistent", "inconclusive", "differs", "out of reach")
ROLES = ("primary", "underpowered", "same runs", "other protocol", "independent")
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
    role: str = "primary"  # one of ROLES: the statement's primary check, or why this one is secondary
    units: str = ""  # what the interval is over, with n: "300 problems", "10 batches", "9 prompts"
    decision: str = ""  # the printed rule the verdict follows from ("holds if the lower end > -5 points")
    family: str = ""  # the multiplicity family of its test(s), and the adjustment, if any

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.kind != "paper" and self.paper:
            raise ValueError(f"only a claim of kind 'paper' has a paper column, got kind {self.kind!r} "
                             f"with paper={self.paper!r}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if (self.verdict == "consistent" and not self.scope) or (self.verdict == "holds" and self.scope
                                                                  and self.kind == "paper"):
            raise ValueError("a 'consistent' verdict needs a scope (the model / scale measured), and a paper claim's "
                             f"'holds' none (it is the paper's own setting): got verdict {self.verdict!r}, scope "
                             f"{self.scope!r}")

    @property
    def passed(self) -> bool:
        """The check supports the statement ("holds" or "consistent")."""
        return self.verdict in ("holds", "consistent")

    @property
    def label(self) -> str:
        """The verdict as printed: ``"consistent: SmolLM2-135M, k = 4"``, ``"inconclusive (on SmolLM2-135M)"``
        (any other verdict measured elsewhere names where) or the verdict itself."""
        if self.verdict == "consistent":
            return f"consistent: {self.scope}"
        return f"{self.verdict} (on {self.scope})" if self.scope else self.verdict

    @property
    def role_label(self) -> str:
        """``"primary"`` or ``"secondary: same runs"``."""
        return "primary" if self.role == "primary" else f"secondary: {self.role}"


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


def _check_level(level) -> float:
    return check_number(level, "level", low=0.0, high=1.0, low_open=True, high_open=True, what="in (0, 1)")


def _finite_units(units, name: str = "units") -> np.ndarray:
    """``units`` as a float64 array with a unit axis, every value finite (``ValueError`` naming the first
    bad units): a NaN or infinite unit has no place in an interval, and dropping it would decide a
    verdict on the others without saying so."""
    try:
        x = np.asarray(units, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numbers, got {type(units).__name__}") from None
    if x.ndim == 0:
        raise ValueError(f"{name} must have a unit axis (shape (n,) or (n, m)), got a scalar {x!r}")
    bad = ~np.isfinite(x).reshape(x.shape[0], -1).all(axis=1) if x.size else np.zeros(0, bool)
    if bad.any():
        raise ValueError(f"{name} must be finite: unit(s) {np.flatnonzero(bad)[:5].tolist()} of {x.shape[0]} hold NaN "
                         f"or inf")
    return x


def bootstrap_interval(units, statistic: Callable[[np.ndarray], float] = np.mean, *, level: float = 0.95,
                       n_boot: int = 10_000, seed: int = 0) -> Interval:
    """Percentile bootstrap over units: ``units`` (n,) or (n, m) (one row per unit, e.g. per prompt),
    ``statistic(rows) -> float`` (default: the mean of a 1-D sample). Resamples rows with
    replacement ``n_boot`` times (seeded) and returns the statistic on all rows with the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of its resampled values.

    Every unit must be finite (``ValueError`` otherwise: a NaN unit is never dropped silently). A
    resample on which ``statistic`` itself is not finite (a ratio whose denominator resampled to 0) is
    left out of the quantiles; fewer than 2 units, or no finite resample, give the interval
    ``(-inf, inf)`` (which decides nothing)."""
    x = _finite_units(units)
    level = _check_level(level)
    n_boot = check_positive_int(n_boot, "n_boot")
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
    with fewer than ``min_points`` units (``iv.n < min_points``; exactly ``min_points`` is enough);
    "holds" (or "consistent" when ``scope`` names another model or scale) if the whole interval lies
    strictly above (``iv.lo > above``: an interval touching ``above`` does not exclude it); "differs" if
    it lies strictly below (``iv.hi < above``); else "inconclusive", and so with a NaN end (which
    excludes nothing, whatever the other end says)."""
    min_points = check_int(min_points, "min_points", low=1)
    if iv.n < min_points:
        return "out of reach"
    if math.isnan(iv.lo) or math.isnan(iv.hi):  # one undefined end: no side is excluded
        return "inconclusive"
    if iv.lo > above:
        return "consistent" if scope else "holds"
    if iv.hi < above:
        return "differs"
    return "inconclusive"


def band_verdict(iv: Interval, low: float, high: float, *, min_points: int = MIN_POINTS) -> str:
    """Verdict of the claim "the quantity lies in ``[low, high]``" from its interval ``iv``: "out of
    reach" with fewer than ``min_points`` units; "holds" if the whole interval lies inside the band
    (``low <= iv.lo`` and ``iv.hi <= high``, ends included); "differs" if it lies wholly outside
    (``iv.hi < low`` or ``iv.lo > high``); else "inconclusive", and so with a NaN end."""
    min_points = check_int(min_points, "min_points", low=1)
    if not low <= high:
        raise ValueError(f"band_verdict: low <= high needed, got [{low}, {high}]")
    if iv.n < min_points:
        return "out of reach"
    if math.isnan(iv.lo) or math.isnan(iv.hi):  # one undefined end: no side is excluded
        return "inconclusive"
    if low <= iv.lo and iv.hi <= high:
        return "holds"
    if iv.hi < low or iv.lo > high:
        return "differs"
    return "inconclusive"


def t_interval(x, *, level: float = 0.95) -> Interval:
    """Student-t interval of the mean of ``x`` (n - 1 degrees of freedom): the interval for a handful of
    units (10 batches, 9 prompts), where a percentile bootstrap is too narrow (it cannot see beyond the
    n observed values, and its coverage at n = 10 falls well short of the nominal level)."""
    from scipy import stats

    x = _finite_units(x, "x").ravel()
    level = _check_level(level)
    n = x.size
    est = float(x.mean()) if n else float("nan")
    if n < 2:
        return Interval(est, -np.inf, np.inf, n, level)
    half = float(stats.t.ppf((1 + level) / 2, n - 1) * x.std(ddof=1) / np.sqrt(n))
    return Interval(est, est - half, est + half, n, level)


def jackknife_t_interval(units, statistic: Callable[[np.ndarray], float], *, level: float = 0.95) -> Interval:
    """Student-t interval of a smooth statistic of few units (a ratio of sums over 9 prompts, a difference of two
    such ratios): the statistic on all rows of ``units`` (n, ...) +- ``t_{(1+level)/2, n-1}`` times the jackknife
    standard error ``sqrt((n - 1) / n * sum_i (theta_(i) - mean theta_(.))^2)`` (``theta_(i)``: the statistic without
    unit ``i``). For the mean of a 1-D sample it is exactly ``t_interval``. The interval for units <= 12, where a
    percentile bootstrap is too narrow (it cannot reach beyond the n observed values)."""
    from scipy import stats

    x = np.asarray(units, dtype=np.float64)
    n = x.shape[0]
    est = float(statistic(x))
    if n < 2:
        return Interval(est, -np.inf, np.inf, n, level)
    loo = np.array([statistic(np.delete(x, i, axis=0)) for i in range(n)], dtype=np.float64)
    if not np.all(np.isfinite(loo)):
        return Interval(est, -np.inf, np.inf, n, level)
    se = float(np.sqrt((n - 1) / n * ((loo - loo.mean()) ** 2).sum()))
    half = float(stats.t.ppf((1 + level) / 2, n - 1) * se)
    return Interval(est, est - half, est + half, n, level)


def holm(pvalues) -> list[float]:
    """Holm's step-down adjusted p-values (same order as ``pvalues``): ``theory.stats.holm`` (imported
    on call, so the ledger loads without scipy); a p-value outside [0, 1] or NaN is a ``ValueError``."""
    from ..theory.stats import holm as _holm

    return _holm(pvalues)


def mcnemar_mdd(discordance: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest paired difference of two proportions that McNemar's test (two-sided, level ``alpha``)
    detects with probability ``power`` on ``n`` items with discordance rate ``discordance`` (share of items
    where the two outcomes differ): ``(z_{1 - alpha/2} + z_power) sqrt(discordance / n)``, the normal
    approximation when the difference is small beside the discordance. ``ValueError`` unless
    ``discordance`` is in [0, 1], ``n`` an integer >= 1 and ``alpha``, ``power`` in (0, 1)."""
    from scipy import stats

    discordance = check_number(discordance, "discordance", low=0.0, high=1.0)
    n = check_int(n, "n", low=1)
    alpha = check_number(alpha, "alpha", low=0.0, high=1.0, low_open=True, high_open=True, what="in (0, 1)")
    power = check_number(power, "power", low=0.0, high=1.0, low_open=True, high_open=True, what="in (0, 1)")

    return float((stats.norm.isf(alpha / 2) + stats.norm.ppf(power)) * np.sqrt(discordance / n))


@dataclass(frozen=True)
class NonInferiority:
    """A non-inferiority test of a mean difference ``delta = mean(d)`` (new minus reference, per unit) at
    margin ``m > 0``: the estimate, its two-sided ``level`` Student-t interval over ``n`` units, and two
    one-sided p-values. ``p_noninferior`` tests H0: delta <= -m against delta > -m (small: non-inferior);
    ``p_inferior`` tests H0: delta >= -m against delta < -m (small: worse than the margin). No superiority
    p-value (a test against 0) belongs beside them."""

    estimate: float
    lo: float
    hi: float
    n: int
    margin: float
    p_noninferior: float
    p_inferior: float
    level: float = 0.95

    @property
    def interval(self) -> Interval:
        return Interval(self.estimate, self.lo, self.hi, self.n, self.level)


def noninferiority(d, margin: float, *, level: float = 0.95) -> NonInferiority:
    """Non-inferiority at margin ``m`` of the per-unit differences ``d`` (n units: questions), the one-sample
    t-test: ``T = (mean(d) + m) / (s / sqrt(n))`` with ``n - 1`` degrees of freedom, ``p_noninferior = P(T_{n-1}
    >= T)``, ``p_inferior = P(T_{n-1} <= T)``; the interval is ``mean(d) -/+ t_{(1+level)/2, n-1} s / sqrt(n)``, so
    its lower end lies above ``-m`` exactly when ``p_noninferior < (1 - level) / 2`` (and its upper end below ``-m``
    when ``p_inferior`` is). ``ValueError`` for ``margin <= 0`` or fewer than 2 units; ``s = 0`` gives p-values
    0 or 1 (never NaN)."""
    from scipy import stats

    d = np.asarray(d, dtype=np.float64).ravel()
    if not (isinstance(margin, (int, float)) and np.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a positive number, got {margin!r}")
    if d.size < 2 or not np.all(np.isfinite(d)):
        raise ValueError(f"d must hold at least 2 finite differences, got {d.size} values")
    n, est = d.size, float(d.mean())
    se = float(d.std(ddof=1) / np.sqrt(n))
    if se == 0:
        above = est > -margin
        return NonInferiority(est, est, est, n, float(margin), 0.0 if above else 1.0, 1.0 if above else 0.0, level)
    t = (est + margin) / se
    half = float(stats.t.ppf((1 + level) / 2, n - 1) * se)
    return NonInferiority(est, est - half, est + half, n, float(margin), float(stats.t.sf(t, n - 1)),
                          float(stats.t.cdf(t, n - 1)), level)


def noninferiority_verdict(parts, *, scope: str = "", references=(), min_reference: float | None = None,
                           min_points: int = MIN_POINTS) -> str:
    """The non-inferiority rule of a claim made of several parts (rules x tasks), each a ``NonInferiority``:
    "consistent" (or "holds" without ``scope``) if every part's interval lies above its ``-margin`` (each
    part's ``p_noninferior < (1 - level) / 2``: an intersection-union test, no adjustment); "differs" if some
    part's interval lies below ``-margin``; else "inconclusive"; "out of reach" with no part, a part on fewer
    than ``min_points`` units, or a reference accuracy (``references``, one per part) not above
    ``min_reference`` (then no loss could reach "differs": the rule could not fall ``margin`` below it)."""
    parts = list(parts)
    refs = list(references)
    if not parts or (min_reference is not None and (len(refs) != len(parts) or any(r <= min_reference for r in refs))):
        return "out of reach"
    return all_of(interval_verdict(p.interval, above=-p.margin, scope=scope, min_points=min_points) for p in parts)


def noninferiority_power(sd: float, n: int, margin: float, *, alpha: float = 0.025, true_difference: float = 0.0) -> float:
    """Power of ``noninferiority`` (one-sided level ``alpha``) on ``n`` units whose differences have standard
    deviation ``sd`` and mean ``true_difference``: ``P(T > t_{1-alpha, n-1})`` with ``T`` noncentral t, noncentrality
    ``(true_difference + margin) sqrt(n) / sd``."""
    from scipy import stats

    if n < 2 or sd <= 0:
        raise ValueError(f"need n >= 2 and sd > 0, got n = {n!r}, sd = {sd!r}")
    crit = stats.t.isf(alpha, n - 1)
    return float(stats.nct.sf(crit, n - 1, (true_difference + margin) * np.sqrt(n) / sd))


def noninferiority_sample_size(sd: float, margin: float, *, alpha: float = 0.025, power: float = 0.8,
                               true_difference: float = 0.0) -> int:
    """Smallest ``n`` at which ``noninferiority_power`` reaches ``power`` (starting from the normal
    approximation ``((z_{1-alpha} + z_power) sd / (margin + true_difference))^2``)."""
    from scipy import stats

    if margin + true_difference <= 0:
        raise ValueError(f"margin + true_difference must be > 0, got {margin + true_difference!r}")
    n = max(2, int(np.floor(((stats.norm.isf(alpha) + stats.norm.ppf(power)) * sd / (margin + true_difference)) ** 2)))
    while n > 2 and noninferiority_power(sd, n - 1, margin, alpha=alpha, true_difference=true_difference) >= power:
        n -= 1
    while noninferiority_power(sd, n, margin, alpha=alpha, true_difference=true_difference) < power:
        n += 1
    return n


def t_mdd(sd: float, n: int, *, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable difference of a two-sided one-sample t-test at level ``alpha`` with probability
    ``power`` on ``n`` units of standard deviation ``sd``: ``(t_{1-alpha/2, n-1} + t_{power, n-1}) sd / sqrt(n)``
    (the usual approximation to the noncentral-t power)."""
    from scipy import stats

    if n < 2 or sd < 0:
        raise ValueError(f"need n >= 2 and sd >= 0, got n = {n!r}, sd = {sd!r}")
    return float((stats.t.isf(alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * sd / np.sqrt(n))


@dataclass(frozen=True)
class Resolution:
    """A statement's verdict from its checks (``resolve``): the verdict, why (``"checks disagree"`` or
    ""), and the primary check it comes from (None when there is none)."""

    verdict: str
    reason: str
    primary: Claim | None


def resolve(checks: Iterable[Claim]) -> Resolution:
    """One verdict for the checks of one statement: the primary check's. Secondary checks never veto;
    an ``"independent"`` secondary pointing the other way (it passes where the primary differs, or differs
    where the primary passes) gives "inconclusive" with reason "checks disagree". Without a primary (its
    step did not run) the statement is "out of reach" (reason "primary check not run"): a secondary check
    never stands in for it. ``ValueError`` with more than one primary."""
    cs = list(checks)
    prim = [c for c in cs if c.role == "primary"]
    if len(prim) > 1:
        raise ValueError(f"a statement needs exactly one primary check, got {len(prim)} for key "
                         f"{cs[0].key if cs else '?'!r} ({[c.source for c in prim]})")
    if not prim:  # its primary step did not run (e.g. --only): the secondaries cannot stand in for it
        return Resolution("out of reach", "primary check not run", None)
    p = prim[0]
    ind = [c for c in cs if c.role == "independent"]
    if (p.passed and any(c.verdict == "differs" for c in ind)) or (p.verdict == "differs" and any(c.passed for c in ind)):
        return Resolution("inconclusive", "checks disagree", p)
    return Resolution(p.verdict, "", p)


def combined_verdict(checks: Iterable[Claim]) -> str:
    """The statement's verdict (``resolve(checks).verdict``)."""
    return resolve(checks).verdict


def all_of(verdicts: Iterable[str]) -> str:
    """Verdict of a conjunction ("each of these exceeds SpS"): the weakest part decides, in the order
    differs, inconclusive, out of reach, consistent, holds. A conjunction of no parts has no evidence:
    "out of reach" (never "holds"). A string that is not one of ``VERDICTS`` is a ``ValueError``."""
    vs = list(verdicts)
    bad = [v for v in vs if v not in VERDICTS]
    if bad:
        raise ValueError(f"all_of: verdicts must be among {VERDICTS}, got {bad[:4]!r}")
    if not vs:
        return "out of reach"
    for v in ("differs", "inconclusive", "out of reach", "consistent"):
        if v in vs:
            return v
    return "holds"


def plural(n: int, one: str, many: str | None = None) -> str:
    """``"1 holds"`` / ``"2 hold"``: ``n`` with the word that agrees with it (``many`` defaults to ``one + "s"``)."""
    return f"{n} {one if n == 1 else (many if many is not None else one + 's')}"


def group(claims: Iterable[Claim]) -> dict[str, list[Claim]]:
    """Checks grouped by statement ``key``, in order of first appearance."""
    out: dict[str, list[Claim]] = {}
    for c in claims:
        out.setdefault(c.key, []).append(c)
    return out
