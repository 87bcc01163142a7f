"""ResiSpec reconstructed (``theory.resispec``): the proxy against hand computations and its invariants, the
multi-draft exact law against an independent recursion and the marginal condition, the secondary source's
counterexample, the smallest counterexample of the guarded reconstruction, and bad input.

Hand computations use our letters (``p`` draft, ``q`` verifier); the secondary source writes them the other way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.exact import induced_distribution
from cactus_theory.theory.resispec import (
    ORDERS,
    ProxyConstructionError,
    ResiSpec,
    check_local,
    get_proxy,
    k1_tv_lower_bound,
    proxy_law,
    resispec_law,
)
from cactus_theory.tree import tree_step_law

ROOT = Path(__file__).resolve().parents[2]
P = np.array([0.6, 0.3, 0.1])  # the critique's pair: draft
Q = np.array([0.4, 0.3, 0.3])  # verifier


def tv(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).sum() / 2)


def cases(n: int, seed: int = 0):
    """Seeded pairs V = 3..6 with zeros (Dirichlet(0.3) masses below 0.05 dropped), ties inside the draft and
    equal entries p_i = q_i."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(n):
        V = 3 + j % 4
        p, q = rng.dirichlet(np.full(V, 0.3)), rng.dirichlet(np.full(V, 0.3))
        p, q = np.where(p < 0.05, 0, p), np.where(q < 0.05, 0, q)
        p, q = p / p.sum(), q / q.sum()
        if j % 3 == 1:  # a tie inside the draft
            p[0] = p[1] = (p[0] + p[1]) / 2
        if j % 3 == 2 and p[0] < 1:  # q equal to p on token 0, the rest rescaled
            q = np.concatenate([[p[0]], q[1:] * (1 - p[0]) / q[1:].sum()]) if q[1:].sum() > 0 else q
        out.append((p, q))
    return out


CASES = cases(12)


# -- the secondary source's counterexample (its Eq. 37.16), by hand -----------------------------------------

def test_critique_counterexample_meets_the_local_conditions_and_misses_q():
    k = np.array([0.6, 0.2, 0.2])  # a proxy for the only rejectable candidate x = 0 (p_0 = .6 > q_0 = .4)
    r, s, Z = check_local(k, Q, P, 0)
    # by hand: r = (q - k)_+ = (0, .1, .1), s = (k - q)_+ = (.2, 0, 0), both of mass .2, disjoint; k_0 = .6 = p_0
    np.testing.assert_allclose(r, [0, 0.1, 0.1], atol=1e-15)
    np.testing.assert_allclose(s, [0.2, 0, 0], atol=1e-15)
    assert Z == pytest.approx(0.2, abs=1e-15)
    # accepted min(p, q) = (.4, .3, .1); rejected with p_0 - q_0 = .2, then (0, .5, .5): (.4, .4, .2), TV .1
    law = proxy_law(P, Q, {0: k})
    np.testing.assert_allclose(law, [0.4, 0.4, 0.2], atol=1e-15)
    assert tv(law, Q) == pytest.approx(0.1, abs=1e-15)
    # the standard residual (proxy k = p, fallback (q - p)_+ = (0, 0, .2) -> e_2) restores q
    np.testing.assert_allclose(proxy_law(P, Q, {0: P}), Q, atol=1e-15)


# -- the guarded reconstruction, by hand ---------------------------------------------------------------------

def test_guarded_proxy_matches_a_hand_computation():
    # x = 0: Z = .6 - .4 = .2; before the fill r = (0, min(.2 * .3, .3), min(.2 * .1, .3)) = (0, .06, .02),
    # deficit .2 - .08 = .12. "index" / "draft" fill token 1 (capacity .3 - .06 = .24): r = (0, .18, .02).
    # "capacity" fills the larger capacity first, token 2 (.28 against .24): r = (0, .06, .14). k = q - r + .2 e_0.
    for order, r in (("index", [0, 0.18, 0.02]), ("draft", [0, 0.18, 0.02]), ("capacity", [0, 0.06, 0.14]),
                     ((2, 1, 0), [0, 0.06, 0.14])):
        pr = get_proxy(Q, P, 0, order=order)
        np.testing.assert_allclose(pr.r, r, atol=1e-15)
        np.testing.assert_allclose(pr.k, Q - np.array(r) + [0.2, 0, 0], atol=1e-15)
        np.testing.assert_allclose(pr.s, [0.2, 0, 0], atol=1e-15)


def test_guarded_law_on_the_critique_pair_by_hand():
    # K = 1: (.4, .3, .1) + r = (.4, .48, .12) ("index") and (.4, .36, .24) ("capacity"); acceptance .8.
    # K = 2, "index": after rejecting 0 the target is R = (0, .9, .1). Round 2: x = 1 or 2 accepted surely
    # (R_x >= p_x); x = 0 (prob .6) rejected: Z = .6, r = (0, .18, .06) + .36 on token 1 = (0, .54, .06), R stays
    # (0, .9, .1). Law = (.4, .3, .1) + .2 [.6 (0, .9, .1) + (0, .3, .1)] = (.4, .468, .132); acceptance .88.
    for K, order, want, acc in ((1, "index", [0.4, 0.48, 0.12], 0.8), (1, "capacity", [0.4, 0.36, 0.24], 0.8),
                                (2, "index", [0.4, 0.468, 0.132], 0.88)):
        law, a = resispec_law(P, Q, K, order=order)
        np.testing.assert_allclose(law, want, atol=1e-14)
        assert a == pytest.approx(acc, abs=1e-14)


def test_smallest_counterexample_v3_k1_inexact_under_every_fill_order():
    # p = (0, .5, .5), q = (.5, 0, .5): only x = 1 is rejectable (Z = .5). Token 2 has p_2 = q_2 = .5, so at
    # least min(.5 * .5, .5) = .25 of rejection mass lands where q needs none: TV >= .25 for every fill order.
    # Order with 0 before 2: r = (.25, 0, .25), law (.25, 0, .75), TV .25; with 2 before 0: r = (0, 0, .5), law
    # (0, 0, 1), TV .5.
    p, q = np.array([0.0, 0.5, 0.5]), np.array([0.5, 0.0, 0.5])
    assert k1_tv_lower_bound(p, q) == pytest.approx(0.25, abs=1e-15)
    for order, want in (((0, 1, 2), [0.25, 0, 0.75]), ((1, 0, 2), [0.25, 0, 0.75]), ((2, 0, 1), [0, 0, 1]),
                        ((2, 1, 0), [0, 0, 1]), ((0, 2, 1), [0.25, 0, 0.75]), ((1, 2, 0), [0, 0, 1])):
        np.testing.assert_allclose(resispec_law(p, q, 1, order=order)[0], want, atol=1e-15)
    # V = 2 is exact for every K (after one rejection the target is the other token's point mass)
    for K in (1, 2, 3):
        np.testing.assert_allclose(resispec_law(np.array([0.7, 0.3]), np.array([0.2, 0.8]), K)[0], [0.2, 0.8],
                                   atol=1e-15)


# -- the exact law against independent routes ----------------------------------------------------------------

def _reference_law(p, q, K, proxy):
    """Recursion over candidate histories, written out (scalar, depth-first), with the next target given by
    ``proxy(R, x)`` after a rejection: ``L(R, K) = R``, ``L(R, j) = sum_x p_x [a e_x + (1 - a) L(R', j + 1)]``."""
    V = p.size

    def L(R, j):
        if j == K:
            return R
        out = np.zeros(V)
        for x in range(V):
            if p[x] == 0:
                continue
            a = min(1.0, R[x] / p[x])
            out[x] += p[x] * a
            if a < 1:
                out += p[x] * (1 - a) * L(proxy(R, x), j + 1)
        return out

    return L(q, 0)


def test_reference_recursion_with_the_standard_residual_is_lossless():
    def standard(R, x, p):  # SpecInfer's update (R - p)_+ normalised
        r = np.maximum(R - p, 0)
        return r / r.sum()

    for p, q in CASES[:6]:
        np.testing.assert_allclose(_reference_law(p, q, 3, lambda R, x, p=p: standard(R, x, p)), q, atol=1e-12)


@pytest.mark.parametrize("order", ORDERS)
def test_multi_draft_law_equals_the_reference_recursion_and_k1_marginal_formula(order):
    for j, (p, q) in enumerate(CASES[:6]):
        def shaped(R, x, p=p):
            pr = get_proxy(R, p, x, order=order)
            return pr.r / pr.Z
        K = 3 if j % 4 == 0 else 2  # V = 3 with three candidates, V = 4..6 with two
        law, acc = resispec_law(p, q, K, order=order)
        np.testing.assert_allclose(law, _reference_law(p, q, K, shaped), atol=1e-12)
        assert law.sum() == pytest.approx(1.0, abs=1e-12)
        # K = 1: the marginal condition's formula min(p, q) + sum_x (p_x - q_x)_+ r^(x) / Z_x
        one = np.minimum(p, q) + sum(get_proxy(q, p, int(x), order=order).r for x in np.flatnonzero(p > q))
        np.testing.assert_allclose(resispec_law(p, q, 1, order=order)[0], one, atol=1e-12)
        np.testing.assert_allclose(induced_distribution(ResiSpec(order), p, q), one, atol=1e-12)
        np.testing.assert_allclose(proxy_law(p, q, {int(x): get_proxy(q, p, int(x), order=order).k
                                                    for x in np.flatnonzero(p > q)}), one, atol=1e-12)
        # the order-free lower bound never exceeds the K = 1 TV
        assert k1_tv_lower_bound(p, q) <= tv(one, q) + 1e-13
        # the first round is SpS's: the same acceptance at K = 1 as the lossless control
        assert resispec_law(p, q, 1, order=order)[1] == pytest.approx(tree_step_law(ct.SpS(), p, q, 1)[1], abs=1e-12)


def test_torch_rows_give_the_numpy_residual():
    p, q = CASES[3]
    x = np.flatnonzero(p > q)
    rows_p, rows_q = np.tile(p, (x.size, 1)), np.tile(q, (x.size, 1))
    want = ResiSpec("capacity").residual(rows_p, rows_q, x)
    got = ResiSpec("capacity").residual(torch.from_numpy(rows_p), torch.from_numpy(rows_q), torch.from_numpy(x))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), want, atol=1e-15)


# -- GetProxy's invariants ------------------------------------------------------------------------------------

def test_get_proxy_invariants_over_generated_targets():
    rng = np.random.default_rng(1)
    for p, q in CASES[:8]:
        for R in (q, rng.dirichlet(np.full(p.size, 0.5))):
            for x in np.flatnonzero(p > R):
                for order in (*ORDERS, tuple(rng.permutation(p.size).tolist())):
                    pr = get_proxy(R, p, x, order=order)
                    Z = p[x] - R[x]
                    assert pr.Z == pytest.approx(Z, abs=1e-15)
                    assert pr.r[x] == 0 and np.all(pr.r >= 0) and np.all(pr.r <= R + 1e-15)
                    assert pr.r.sum() == pytest.approx(Z, abs=1e-12)
                    assert not np.any((pr.r > 0) & (pr.s > 0))
                    assert np.all(pr.k >= -1e-15) and pr.k.sum() == pytest.approx(1, abs=1e-12)
                    assert pr.k[x] == pytest.approx(p[x], abs=1e-12)  # local alignment
                    np.testing.assert_allclose(np.maximum(R - pr.k, 0), pr.r, atol=1e-15)  # (R - k)_+ = r
                    floor = np.minimum(Z * p, R)
                    floor[x] = 0
                    assert np.all(pr.r >= floor - 1e-15)  # the fill only adds
                    # the fill goes in order: once a token is left below capacity, none after it gets any
                    raised = pr.r > floor + 1e-15
                    full = pr.r >= R - 1e-15
                    seq = {"index": list(range(p.size)), "draft": sorted(range(p.size), key=lambda i: (-p[i], i)),
                           "capacity": sorted(range(p.size), key=lambda i: (-(R - floor)[i], i))}.get(order, order)
                    seq = [i for i in seq if i != x]
                    short = [n for n, i in enumerate(seq) if not full[i]]
                    if short:
                        assert not any(raised[i] for i in seq[short[0] + 1:])


# -- the committed result file ------------------------------------------------------------------------------

def test_committed_results_agree_with_the_laws():
    res = json.loads((ROOT / "benchmarks" / "results" / "resispec.json").read_text(encoding="utf-8"))
    np.testing.assert_allclose(res["critique"]["law"], [0.4, 0.4, 0.2], atol=1e-15)
    for K in (1, 2, 3):
        for order in ORDERS:
            cell = res["critique_pair_guarded"][f"K={K}"][order]
            np.testing.assert_allclose(cell["law"], resispec_law(P, Q, K, order=order)[0], atol=1e-15)
    g = res["generated"]
    for V, row in g.items():
        assert row["K=1"]["index"]["bound_above_tv"] == 0
        for K in (1, 2, 3):
            assert row[f"K={K}"]["control_max_tv"] < 1e-12
            if V == "V=2":
                assert all(row[f"K={K}"][o]["exact"] == row["cases"] for o in ORDERS)
    w = g["V=4"]["K=2"]["draft"]["worst"]
    law = resispec_law(np.array(w["p"]), np.array(w["q"]), 2, order="draft")[0]
    assert tv(law, w["q"]) == pytest.approx(g["V=4"]["K=2"]["draft"]["max_tv"], abs=1e-12)


# -- bad input ----------------------------------------------------------------------------------------------

def test_bad_input():
    with pytest.raises(ValueError, match="not a rejectable candidate"):
        get_proxy(Q, P, 1)  # p_1 = q_1: never rejected
    with pytest.raises(ValueError, match="x must be a token id"):
        get_proxy(Q, P, 3)
    with pytest.raises(ValueError, match="order must be one of"):
        get_proxy(Q, P, 0, order="random")
    with pytest.raises(ValueError, match="permutation of range"):
        get_proxy(Q, P, 0, order=(0, 1, 1))
    with pytest.raises(ValueError, match="Z\\*"):
        get_proxy(Q, P, 0, budget="eq13")
    with pytest.raises(ValueError, match="R"):
        get_proxy(np.array([0.5, 0.6, 0.3]), P, 0)
    with pytest.raises(ValueError, match="same shape"):
        get_proxy(Q, np.array([0.5, 0.5]), 0)
    with pytest.raises(ValueError, match="tol"):
        get_proxy(Q, P, 0, tol=0.1)
    with pytest.raises(ValueError, match="exactly the rejectable candidates"):
        proxy_law(P, Q, {})
    with pytest.raises(ValueError, match="local alignment"):
        proxy_law(P, Q, {0: np.array([0.5, 0.25, 0.25])})
    with pytest.raises(ValueError, match="distribution"):
        proxy_law(P, Q, {0: np.array([0.6, 0.6, -0.2])})
    with pytest.raises(ValueError, match="order must be one of"):
        ResiSpec("bogus")
    with pytest.raises(ValueError, match="budget"):
        ResiSpec("index", "eq13")
    with pytest.raises(ValueError, match="num_children"):
        resispec_law(P, Q, -1)
    with pytest.raises(ValueError, match="permutation of range"):
        resispec_law(P, Q, 1, order=(0, 1))
    # the named failure: a target off the simplex by more than tol (but within the input screen's tolerance)
    with pytest.raises(ProxyConstructionError, match="PROXY_CONSTRUCTION_FAILURE"):
        get_proxy(np.array([0.4, 0.3, 0.3 - 1e-9]), P, 0)


def test_docs_table_is_the_committed_results():
    """docs/multi-draft.md's ResiSpec table, row by row, from benchmarks/results/resispec.json."""
    res = json.loads((ROOT / "benchmarks" / "results" / "resispec.json").read_text(encoding="utf-8"))
    page = (ROOT / "docs" / "multi-draft.md").read_text(encoding="utf-8")
    section = page[page.index("## ResiSpec"):]
    for V in (3, 4, 5, 6):
        for K in (1, 2, 3):
            c = res["generated"][f"V={V}"][f"K={K}"]
            row = (f"| {V} | {K} | " + " / ".join(str(c[o]["exact"]) for o in ORDERS) + " | "
                   + " / ".join(f"{c[o]['max_tv']:.3f}" for o in ORDERS)
                   + f" | {c['index']['mean_tv']:.3f} | {c['index']['mean_acceptance']:.3f} / "
                   f"{c['control_mean_acceptance']:.3f} |")
            assert row in section, row
    bound = " / ".join(str(res["generated"][f"V={V}"]["K=1"]["index"]["bound_proves_inexact"]) for V in (3, 4, 5, 6))
    inexact = " / ".join(str(res["generated"][f"V={V}"]["cases"] - res["generated"][f"V={V}"]["K=1"]["index"]["exact"])
                         for V in (3, 4, 5, 6))
    assert f"proves {bound} of the {inexact} inexact" in " ".join(section.split())
    grid = ", ".join(f"{g['inexact_every_order']} of {g['pairs']}" for g in res["grid"].values())
    assert f"for d = 2..6: {grid}." in " ".join(section.split())
