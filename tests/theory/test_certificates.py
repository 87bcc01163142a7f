"""theory.certificates: the exact KL certificates of deterministic acceptance (arXiv 2606.30265, issue 27 item 8)
against convex programs (optimize.level_set_reference / coverage_reference), their margin bounds, the registry
rules that decide as each criterion, and planted wrong variants that the reference must catch."""

import math

import numpy as np
import pytest

from cactus_theory import kl
from cactus_theory.theory import certificates as C
from cactus_theory.theory.optimize import coverage_reference, level_set_reference

TOL = C.TOL_REL  # relative (to max(1, |reference|)), the step's pre-registered tolerance
CASES = C.certificate_cases(seed=27, n=8, sizes=(3, 4, 5))


def _diff(a: float, r: float) -> float:
    if math.isinf(a) or math.isinf(r):
        return 0.0 if a == r else math.inf
    return abs(a - r) / max(1.0, abs(r))


def _divergence(p, q, direction):
    return float(kl(p, q) if direction == "kl" else kl(q, p))


@pytest.mark.parametrize("direction", C.DIRECTIONS)
@pytest.mark.parametrize("criterion", C.CRITERIA)
def test_closed_form_matches_cvxpy(criterion, direction):
    for i, q in enumerate(CASES):
        params = C.PARAMS[criterion][i % len(C.PARAMS[criterion])]
        if params.get("m", 1) > q.size:
            continue
        rejected = C.rejected_tokens(q, criterion, **params)
        ref = level_set_reference(q, rejected, direction)
        diff, ok = C.agreement(C.level_set_certificate(q, rejected, direction), ref.value, ref.status,
                               C.reference_side(direction))
        assert ok, (q, params, diff, ref.status)


@pytest.mark.parametrize("direction", C.DIRECTIONS)
def test_coverage_matches_cvxpy(direction):
    for i, q in enumerate(CASES):
        m = 1 + i % 3
        if m < q.size:
            ref = coverage_reference(q, m, direction)
            diff, ok = C.agreement(C.coverage_certificate(q, m, direction), ref.value, ref.status,
                               C.reference_side(direction))
            assert ok, (q, m, diff, ref.status)


def test_greedy_closed_form_and_special_cases():
    q = np.array([0.5, 0.3, 0.2])
    assert C.greedy_certificate(q) == pytest.approx(-math.log(1 - (math.sqrt(0.5) - math.sqrt(0.3)) ** 2), rel=1e-14)
    rev = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)
    assert C.greedy_certificate(q, "reverse_kl") == pytest.approx(rev, rel=1e-14)
    for d in C.DIRECTIONS:  # the relaxed criteria at their strictest are strict greedy (unique top)
        g = C.greedy_certificate(q, d)
        assert C.additive_certificate(q, 0.0, d) == g == C.multiplicative_certificate(q, 1.0, d) == C.top_m_certificate(q, 1, d)
        assert C.coverage_certificate(q, 1, d) == pytest.approx(g, rel=1e-14)
    tie = np.array([0.4, 0.4, 0.2])
    assert C.greedy_certificate(tie) == 0.0 and C.coverage_certificate(tie, 1) == 0.0
    assert C.additive_certificate(q, 1.0) == math.inf and C.coverage_certificate(q, 3) == math.inf
    # the kl direction keeps p on q's support: a rejected token with q = 0 cannot become the draft's top
    z = np.array([0.7, 0.3, 0.0])
    assert C.level_set_certificate(z, np.array([False, False, True])) == math.inf
    assert C.level_set_certificate(z, np.array([False, False, True]), "reverse_kl") < math.inf


def test_margin_bounds_bracket_and_are_sharp():
    for q in C.certificate_cases(seed=5, n=60, sizes=(2, 3, 5, 8, 20)):
        for d in C.DIRECTIONS:
            for crit in C.CRITERIA:
                for params in C.PARAMS[crit]:
                    if params.get("m", 1) > q.size:
                        continue
                    rej = C.rejected_tokens(q, crit, **params)
                    lo, hi = C.margin_bounds(q, rej, d)
                    v = C.level_set_certificate(q, rej, d)
                    assert lo <= v * (1 + 1e-12) + 1e-15 and v <= hi * (1 + 1e-12) + 1e-15, (q, crit, params, d)
            for m in range(1, q.size):
                lo, hi = C.coverage_margin_bounds(q, m, d)
                v = C.coverage_certificate(q, m, d)
                assert lo <= v * (1 + 1e-12) + 1e-15 and v <= hi * (1 + 1e-12) + 1e-15, (q, m, d)
    delta = 0.3
    two = np.array([(1 + delta) / 2, (1 - delta) / 2])  # attains the lower bounds
    for d in C.DIRECTIONS:
        assert C.greedy_certificate(two, d) == pytest.approx(C.margin_bounds(two, C.rejected_tokens(two, "greedy"), d)[0],
                                                             rel=1e-12)
    # q_(2) -> 0 with the rest spread below it approaches the upper bounds
    spread = np.concatenate([[delta + 1e-6, 1e-6], np.full(10 ** 6, (1 - delta - 2e-6) / 10 ** 6)])
    for d in C.DIRECTIONS:
        lo, hi = C.margin_bounds(spread, C.rejected_tokens(spread, "greedy"), d)
        assert hi * (1 - 1e-2) < C.greedy_certificate(spread, d) <= hi


@pytest.mark.parametrize("direction", C.DIRECTIONS)
@pytest.mark.parametrize("criterion", C.CRITERIA)
def test_rules_accept_inside_the_radius_and_reject_at_its_edge(criterion, direction):
    """Drafts on the segment from q to the minimiser p* (divergence < D* by convexity) are accepted by the
    registry rule of the criterion (exact acceptance probability 1); p* sits on the boundary at divergence D*, and
    a nudge past it makes a rejected token the draft's strict top (acceptance 0)."""
    checked = 0
    for i, q in enumerate(C.certificate_cases(seed=11, n=24, sizes=(3, 5, 8))):
        params = C.PARAMS[criterion][i % len(C.PARAMS[criterion])]
        if params.get("m", 1) > q.size:
            continue
        rej = C.rejected_tokens(q, criterion, **params)
        D = C.level_set_certificate(q, rej, direction)
        if not (0 < D < math.inf):
            continue
        rule = C.criterion_rule(criterion, q.size, **params)
        pstar, y = C.level_set_minimiser(q, rej, direction)
        assert _divergence(pstar, q, direction) == pytest.approx(D, rel=1e-9)
        assert pstar[y] >= pstar.max() * (1 - 1e-12)
        for t in (0.0, 0.5, 0.9, 0.999):
            p = (1 - t) * q + t * pstar
            assert _divergence(p, q, direction) < D
            n = np.asarray(int(np.argmax(p)))
            assert float(rule.accept_prob(p, q, n)) == 1.0
        nudged = pstar.copy()
        nudged[y] += 1e-9
        nudged /= nudged.sum()
        assert float(rule.accept_prob(nudged, q, np.asarray(int(np.argmax(nudged))))) == 0.0
        checked += 1
    assert checked >= 4


@pytest.mark.parametrize("direction", C.DIRECTIONS)
def test_coverage_inside_the_radius_and_at_its_edge(direction):
    checked = 0
    for i, q in enumerate(C.certificate_cases(seed=13, n=16, sizes=(4, 6))):
        m = 1 + i % 3
        D = C.coverage_certificate(q, m, direction)
        if not (0 < D < math.inf):
            continue
        pstar, g = C.coverage_minimiser(q, m, direction)
        assert _divergence(pstar, q, direction) == pytest.approx(D, rel=1e-9)
        assert np.sum(pstar >= pstar[g] * (1 - 1e-12)) >= m + 1  # m others tie or beat g: not covered (ties count)
        for t in (0.5, 0.999):
            p = (1 - t) * q + t * pstar
            assert int(np.sum(np.delete(p, g) >= p[g])) < m  # g is strictly among the draft's top m
        checked += 1
    assert checked >= 4


# -- planted wrong variants: each must fail against the reference on the same generated cases -------------

def _planted_worst(variant, reference):
    return max(_diff(variant(q), reference(q)) for q in CASES if q.size > 3)


def test_planted_wrong_direction_fails():
    rej = lambda q: C.rejected_tokens(q, "greedy")  # noqa: E731
    worst = _planted_worst(lambda q: C.level_set_certificate(q, rej(q), "reverse_kl"),
                           lambda q: level_set_reference(q, rej(q), "kl").value)
    assert worst > 100 * TOL


def test_planted_top_m_off_by_one_fails():
    worst = _planted_worst(lambda q: C.top_m_certificate(q, 3),  # the m + 1 set, where the reference has m = 2
                           lambda q: level_set_reference(q, C.rejected_tokens(q, "top_m", m=2), "kl").value)
    assert worst > 100 * TOL


def test_planted_coverage_off_by_one_fails():
    worst = _planted_worst(lambda q: C.coverage_certificate(q, 1, "reverse_kl"),
                           lambda q: coverage_reference(q, 2, "reverse_kl").value)
    assert worst > 100 * TOL


def test_planted_single_pair_pooling_fails():
    """Pooling the rejected token with the top one only (ignoring the other tokens above the level) is a
    relaxation, not the exact minimum: on top-m cases it comes out below the reference."""
    worst = 0.0
    for q in CASES:
        if q.size < 4:
            continue
        rej = C.rejected_tokens(q, "top_m", m=2)
        y = int(np.flatnonzero(rej)[np.argmax(q[rej])])
        worst = max(worst, _diff(C.pair_certificate(q.max(), q[y]), level_set_reference(q, rej, "kl").value))
    assert worst > 100 * TOL


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input_names_the_argument():
    q = np.array([0.6, 0.4])
    with pytest.raises(ValueError, match="divergence"):
        C.greedy_certificate(q, "tv")
    with pytest.raises(ValueError, match="delta"):
        C.additive_certificate(q, -0.1)
    with pytest.raises(ValueError, match="alpha"):
        C.multiplicative_certificate(q, 1.5)
    with pytest.raises(TypeError, match="m"):
        C.top_m_certificate(q, 1.0)
    with pytest.raises(ValueError, match="m must be <="):
        C.top_m_certificate(q, 3)
    with pytest.raises(ValueError, match="epsilon"):
        C.entropy_certificate(q, 0.0, 0.3)
    with pytest.raises(ValueError, match="alpha"):
        C.entropy_certificate(q, 0.1, 0.0)
    with pytest.raises(ValueError, match="q"):
        C.greedy_certificate(np.array([0.6, 0.6]))
    with pytest.raises(ValueError, match="q"):
        C.greedy_certificate(np.array([[0.6, 0.4]]))
    with pytest.raises(TypeError, match="q"):
        C.greedy_certificate([0.6, 0.4])
    with pytest.raises(TypeError, match="rejected"):
        C.level_set_certificate(q, np.array([0, 1]))
    with pytest.raises(ValueError, match="rejected"):
        C.level_set_certificate(q, np.array([False, True, False]))
    with pytest.raises(ValueError, match="criterion"):
        C.rejected_tokens(q, "nucleus")
    with pytest.raises(TypeError, match="m"):
        C.coverage_certificate(q, True)
