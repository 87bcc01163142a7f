"""Table q (issue 42 item 2): the equal-KL solver against a brute-force search over an independent Cactus law, the
grid's per-setting exact points against each rule's law written out by hand, and the committed table against its
committed JSON and protocol."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon

from cactus_theory.theory.tradeoff import DELTA_MAX, cactus_at_kl, cactus_at_mean_kl, delta_grid
from paper_repro import table_q_graphcore_grid as T
from paper_repro.common import RESULTS

# -- an independent Cactus law: the paper's mixture, token by token ---------------------------------------------


def _kl(h, q):
    if np.any((h > 0) & (q == 0)):
        return math.inf
    m = h > 0
    return float(np.sum(h[m] * np.log(h[m] / q[m])))


def _mixture(p, accept, residual):
    """``sum_n p_n [phi_n e_n + (1 - phi_n) g_n]`` with ``phi_n = accept(n)`` and ``g_n = residual(n)``."""
    out = np.zeros_like(p)
    for n in np.flatnonzero(p > 0):
        phi = accept(n)
        out[n] += p[n] * phi
        if phi < 1:
            out += p[n] * (1 - phi) * residual(n)
    return out


def _cactus(p, q, delta):
    """(KL(h_alg || q), acceptance) of Cactus (Corollary 5) written from the paper: the target raises q_n to
    gamma = min(q_n + sqrt(2 delta q_n (1 - q_n)), 1) and scales the rest by (1 - gamma) / (1 - q_n)."""
    def target(n):
        g = min(q[n] + math.sqrt(2 * delta * q[n] * (1 - q[n])), 1.0)
        h = q * ((1 - g) / (1 - q[n])) if q[n] < 1 else q.copy()
        h[n] = g
        return h

    def accept(n):
        return min(1.0, target(n)[n] / p[n])

    def residual(n):
        r = np.maximum(target(n) - p, 0)
        return r / r.sum()

    return _kl(_mixture(p, accept, residual), q), float(sum(p[n] * accept(n) for n in np.flatnonzero(p > 0)))


PAIRS = [(np.array([0.5, 0.3, 0.2, 0.0]), np.array([0.1, 0.2, 0.3, 0.4])),
         (np.array([0.25, 0.25, 0.25, 0.25]), np.array([0.7, 0.1, 0.1, 0.1])),
         (np.array([0.6, 0.0, 0.4, 0.0]), np.array([0.2, 0.5, 0.0, 0.3]))]  # p puts mass where q = 0


def test_equal_kl_solver_against_a_brute_force_search_on_an_independent_law():
    grid = np.concatenate([[0.0], np.logspace(-4, 3, 600)])  # brute force: the largest grid budget within the target
    P, Q = np.stack([p for p, _ in PAIRS]), np.stack([q for _, q in PAIRS])
    targets = np.array([[0.05, 0.3], [0.02, 0.2], [0.01, 0.1]])
    got = cactus_at_kl(P, Q, targets, grid=delta_grid(2, -6, 12))
    for i, (p, q) in enumerate(PAIRS):
        curve = [_cactus(p, q, d) for d in grid]
        for s, k in enumerate(targets[i]):
            j = max(t for t, (kd, _) in enumerate(curve) if kd <= k)
            below, above = curve[j][1], curve[min(j + 1, grid.size - 1)][1]
            assert below - 1e-9 <= got.accept[i, s] <= above + 1e-9
            kd, ad = _cactus(p, q, got.delta[i, s])  # the solver's own point, by the independent law
            assert kd <= k * (1 + 2e-9) + 2e-12 and abs(kd - k) <= 1e-6 * k and ad == pytest.approx(got.accept[i, s])


def test_infinite_kl_target_gives_cactus_top_and_its_closed_form():
    P, Q = np.stack([p for p, _ in PAIRS]), np.stack([q for _, q in PAIRS])
    got = cactus_at_kl(P, Q, np.full(3, np.inf), grid=delta_grid(1, -2, 300))
    assert np.all(got.delta == DELTA_MAX)
    # at the top every draft with q_n > 0 is accepted (gamma* = 1), none with q_n = 0
    assert got.accept == pytest.approx([p[q > 0].sum() for p, q in PAIRS], abs=1e-12)


def test_one_budget_at_the_mean_kl():
    P, Q = np.stack([p for p, _ in PAIRS]), np.stack([q for _, q in PAIRS])
    got = cactus_at_mean_kl(P, Q, np.array([0.05, 0.15]), grid=delta_grid(2, -6, 12))
    for s, k in enumerate((0.05, 0.15)):
        d = float(got.delta[s])
        at = [_cactus(p, q, d) for p, q in PAIRS]
        past = [_cactus(p, q, d * 1.001) for p, q in PAIRS]
        assert np.mean([x for x, _ in at]) == pytest.approx(k, rel=1e-6)
        assert np.mean([x for x, _ in past]) > k and float(got.accept[s]) == pytest.approx(np.mean([a for _, a in at]))


@pytest.mark.parametrize("bad, match", [(dict(target=np.array([-1.0, 0, 0])), "target"),
                                        (dict(target=np.zeros((2,))), "target"),
                                        (dict(grid=np.array([1.0, 2.0])), "grid"),
                                        (dict(bisections=-1), "bisections")])
def test_bad_input_names_the_argument(bad, match):
    P, Q = np.stack([p for p, _ in PAIRS]), np.stack([q for _, q in PAIRS])
    kw = dict(target=np.zeros(3)) | bad
    with pytest.raises(ValueError, match=match):
        cactus_at_kl(P, Q, **kw)


# -- the grid's settings: the exact points used in table q against each rule's law written out ------------------


def _h_by_hand(key: str, value, fixed: dict, p, q):
    """The step's output law by each rule's own formula (upstream's letters swapped: p the draft); ``None`` for a
    rule whose law is a mixture rather than a target."""
    if key == "cascade_opt":
        tv = np.maximum(q - p, 0).sum()
        return q.copy() if p.max() < q.max() - value * tv else p.copy()
    if key == "tok3":
        top = np.zeros(q.size, bool)
        if value == 0:
            top[int(np.argmax(q))] = True
        else:
            top = (q > 0) & (q >= (1 - value) * q.max())
        return np.where(top, p, 0) + p[~top].sum() * q
    if key == "scd":
        assert fixed == {"alpha": 0.0}
        gate = q > 0
        hole = gate & (p == 0)
        w = np.where(hole, q ** (1 + value), 0) if hole.any() else np.where(
            gate, q ** (1 + value) / np.where(gate, p, 1) ** value, 0)
        return w / w.sum()
    if key == "rfuzzy":
        return p.copy() if jensenshannon(p, q) ** 2 <= value else q.copy()
    if key == "ensemble":
        return value * q + (1 - value) * p
    if key == "sps":
        return q.copy()
    return None


def _mixture_by_hand(key: str, value, p, q):
    if key == "mentored":
        def accept(n):
            return min(1.0, q[n] / ((1 - value) * p[n]))

        def residual(n):
            r = np.maximum(q - p, 0)
            return r / r.sum() if r.sum() > 0 else q

        h = _mixture(p, accept, residual)
        return _kl(h, q), float(sum(p[n] * accept(n) for n in np.flatnonzero(p > 0)))
    assert key == "cactus"
    return _cactus(p, q, value)


_PROTOCOL, _ = T.load_protocol()
_SETTINGS = T.settings(_PROTOCOL)


@st.composite
def _pairs(draw):
    V = draw(st.integers(2, 6))
    w = st.lists(st.integers(0, 3), min_size=V, max_size=V).filter(lambda x: sum(x) > 0)
    p, q = np.array(draw(w), float), np.array(draw(w), float)  # zeros and ties in both rows
    return p / p.sum(), q / q.sum()


@settings(max_examples=15, deadline=None, derandomize=True)
@given(_pairs())
def test_each_grid_setting_s_exact_point_is_its_rule_s_law_by_hand(pq):
    p, q = pq
    js = jensenshannon(p, q) ** 2
    assume(all(abs(js - v) > 1e-9 for v in (0.05, 0.2, 0.3)))  # not on an r-fuzzy threshold (float rounding)
    k, a = (np.asarray(x) for x in zip(*(T.step_point(s["rule"], p[None], q[None]) for s in _SETTINGS), strict=True))
    for s, kk, aa in zip(_SETTINGS, k[:, 0], a[:, 0], strict=True):
        fixed = next(g["fixed"] for g in _PROTOCOL["grid"] if g["method"] == s["method"])
        h = _h_by_hand(s["key"], s["value"], fixed, p, q)
        if h is not None:  # Theorem 1: the step's law is h, its acceptance sum_n min(p_n, h_n)
            want_k, want_a = _kl(h, q), float(np.minimum(p, h).sum())
        else:
            want_k, want_a = _mixture_by_hand(s["key"], s["value"], p, q)
        assert aa == pytest.approx(want_a, abs=1e-12), s["method"]
        if math.isinf(want_k):
            assert math.isinf(kk), s["method"]
        else:
            assert kk == pytest.approx(want_k, rel=1e-9, abs=1e-12), s["method"]


# -- the committed result: made under the committed protocol, rendered as committed ---------------------------


def _committed():
    return json.loads((RESULTS / f"{T.NAME}.json").read_text())


def test_committed_result_was_made_under_the_committed_protocol():
    stored = _committed()
    proto, sha = T.load_protocol()
    assert stored["data"]["protocol"]["sha256"] == sha and stored["config"]["protocol"].endswith(sha)
    assert not stored["data"]["fast"] and stored["data"]["grid"]["bisections"] == 100
    assert stored["data"]["random"]["N"] == proto["pair_sets"]["random"]["N"]
    assert stored["data"]["lm"]["N"] == proto["pair_sets"]["lm"]["N"]
    # the verdicts follow from the stored per-pair outcomes by the protocol's rule
    assert T.analyse(stored["data"], proto) == stored["data"]["analysis"]


def test_committed_table_is_what_the_generator_renders_from_the_committed_json():
    assert (RESULTS / f"{T.NAME}.md").read_text() == T.render(_committed()["data"])


def test_the_docs_quote_the_committed_verdict_table():
    from paper_repro.common import ROOT

    doc = (ROOT / "docs" / "production-rules.md").read_text()
    page = (RESULTS / f"{T.NAME}.md").read_text().splitlines()
    start = next(i for i, line in enumerate(page) if line.startswith("| rule | pair set |"))
    end = next(i for i in range(start, len(page)) if not page[i].startswith("|"))
    rows = page[start:end]
    assert len(rows) == 2 + 14 and all(line in doc for line in rows)
