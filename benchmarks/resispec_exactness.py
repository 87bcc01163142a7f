"""Is ResiSpec (arXiv 2608.24411v1, reconstructed in ``cactus_theory.theory.resispec``) exact? By exact law.

Writes one JSON (default ``benchmarks/results/resispec.json``) with:

* ``critique``: the secondary source's one-step counterexample (a sample-dependent proxy meeting every local
  condition), its output law by the marginal condition, and the standard residual's law beside it;
* ``critique_pair_guarded``: the guarded reconstruction on the same pair, K = 1, 2, 3, each fill order, with
  SpecInfer's recursive rejection (SpS rounds, i.i.d. candidates) as the lossless control;
* ``generated``: seeded pairs (``theory.cases.make_pair``'s kinds, plus a draft with tied entries and a pair with
  equal entries ``p_i = q_i > 0``), V = 2..6, K = 1, 2, 3, each named fill order: how many are exact (TV to ``q`` at
  most 1e-12) and of which kinds, the largest and mean TV and the worst pair, the mean acceptance; the same for
  the control; and at K = 1 the order-free lower bound ``k1_tv_lower_bound`` against every law (never above its
  TV) and how many cases it alone proves inexact;
* ``grid``: the smallest counterexample: V = 3, K = 1 (V = 2 is exact for every proxy), pairs on the grid of
  multiples of 1/d, d = 2..6, under every fill order chosen per rejected token (all permutations).

    python benchmarks/resispec_exactness.py [--seeds 12] [--json benchmarks/results/resispec.json]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

import cactus_theory as ct
from cactus_theory.theory.cases import CASE_KINDS, make_pair
from cactus_theory.theory.resispec import (
    ORDERS,
    get_proxy,
    k1_tv_lower_bound,
    proxy_law,
    resispec_law,
)
from cactus_theory.theory.tree import tree_step_law

EXACT = 1e-12  # TV at or below this counts as exact (float64 laws)
KS = (1, 2, 3)
VS = (2, 3, 4, 5, 6)
KINDS = CASE_KINDS + ("draft_tie", "equal_entries")


def tv(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).sum() / 2)


def make_case(kind: str, V: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A (p, q) pair: ``make_pair``'s kinds, ``draft_tie`` (two entries of the draft equal), ``equal_entries``
    (the verifier equal to the draft on a random set of tokens, the rest rescaled)."""
    if kind in CASE_KINDS:
        p, q, _ = make_pair(kind, V, rng)
        return p, q
    p, q, _ = make_pair("random", V, rng)
    i, j = rng.choice(V, 2, replace=False)
    if kind == "draft_tie":
        p[i] = p[j] = (p[i] + p[j]) / 2
        return p, q
    S = np.zeros(V, dtype=bool)
    S[[i, j][: int(rng.integers(1, min(2, V - 1) + 1))]] = True
    rest = q[~S].sum()
    if rest <= 0 or p[S].sum() >= 1:
        return p, q
    q = np.where(S, p, q * (1 - p[S].sum()) / rest)
    return p, q / q.sum()


def critique() -> dict:
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.4, 0.3, 0.3])  # our letters: p draft, q verifier
    k = np.array([0.6, 0.2, 0.2])
    law = proxy_law(p, q, {0: k})
    std = proxy_law(p, q, {0: p})  # the standard residual (q - p)_+: proxy k = p
    return {"p": p.tolist(), "q": q.tolist(), "proxy_for_x0": k.tolist(), "law": law.tolist(), "tv": tv(law, q),
            "standard_residual_law": std.tolist(), "standard_tv": tv(std, q)}


def critique_guarded() -> dict:
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.4, 0.3, 0.3])
    out: dict = {"proxy_x0": {o: get_proxy(q, p, 0, order=o).k.tolist() for o in ORDERS}}
    for K in KS:
        ctrl, ctrl_acc = tree_step_law(ct.SpS(), p, q, K, "iid")
        row = {"control_tv": tv(ctrl, q), "control_acceptance": ctrl_acc}
        for o in ORDERS:
            law, acc = resispec_law(p, q, K, order=o)
            row[o] = {"law": law.tolist(), "tv": tv(law, q), "acceptance": acc}
        out[f"K={K}"] = row
    return out


def generated(seeds: int) -> dict:
    out: dict = {}
    for V in VS:
        cases = [(kind, s, *make_case(kind, V, np.random.default_rng([V, KINDS.index(kind), s])))
                 for kind in KINDS for s in range(seeds)]
        rowV: dict = {"cases": len(cases)}
        for K in KS:
            rowK: dict = {}
            ctrl = [tree_step_law(ct.SpS(), p, q, K, "iid") for _, _, p, q in cases]
            rowK["control_max_tv"] = max(tv(law, q) for (law, _), (_, _, _, q) in zip(ctrl, cases, strict=True))
            rowK["control_mean_acceptance"] = float(np.mean([acc for _, acc in ctrl]))
            for o in ORDERS:
                tvs, accs = [], []
                for _, _, p, q in cases:
                    law, acc = resispec_law(p, q, K, order=o)
                    tvs.append(tv(law, q))
                    accs.append(acc)
                tvs_a = np.array(tvs)
                worst = int(tvs_a.argmax())
                exact = tvs_a <= EXACT
                kinds: dict = {}
                for (kind, *_), e in zip(cases, exact, strict=True):
                    kinds[kind] = kinds.get(kind, 0) + int(e)
                cell = {"exact": int(exact.sum()), "exact_by_kind": kinds, "max_tv": float(tvs_a.max()),
                        "mean_tv": float(tvs_a.mean()), "mean_acceptance": float(np.mean(accs)),
                        "worst": {"kind": cases[worst][0], "seed": cases[worst][1],
                                  "p": cases[worst][2].tolist(), "q": cases[worst][3].tolist()}}
                if K == 1:
                    lb = np.array([k1_tv_lower_bound(p, q) for _, _, p, q in cases])
                    cell["bound_above_tv"] = int((lb > tvs_a + 1e-13).sum())  # must be 0
                    cell["bound_proves_inexact"] = int((lb > EXACT).sum())
                rowK[o] = cell
            rowV[f"K={K}"] = rowK
        out[f"V={V}"] = rowV
    return out


def _k1_law_any_orders(p: np.ndarray, q: np.ndarray, perms: dict[int, tuple]) -> np.ndarray:
    law = np.minimum(p, q)
    for x, order in perms.items():
        pr = get_proxy(q, p, x, order=order)
        law = law + pr.r
    return law


def grid(dmax: int) -> dict:
    """V = 3, K = 1, pairs on the grid of multiples of 1/d: how many are inexact under every fill order."""
    V = 3
    perms = list(itertools.permutations(range(V)))
    out: dict = {}
    for d in range(2, dmax + 1):
        pts = [np.array(c, dtype=np.float64) / d for c in itertools.product(range(d + 1), repeat=V) if sum(c) == d]
        inexact_index, inexact_all, best = 0, 0, None
        for p, q in itertools.product(pts, pts):
            A = [int(x) for x in np.flatnonzero(p > q)]
            law = _k1_law_any_orders(p, q, {x: tuple(range(V)) for x in A})
            inexact_index += tv(law, q) > EXACT
            tvs = [tv(_k1_law_any_orders(p, q, dict(zip(A, c, strict=True))), q) for c in itertools.product(perms, repeat=len(A))]
            if min(tvs) > EXACT:
                inexact_all += 1
                key = (-min(tvs), p.tolist(), q.tolist())
                if best is None or key < best[0]:
                    best = (key, {"p": p.tolist(), "q": q.tolist(), "min_tv_over_orders": min(tvs),
                                  "max_tv_over_orders": max(tvs),
                                  "k1_tv_lower_bound": k1_tv_lower_bound(p, q)})
        out[f"d={d}"] = {"pairs": len(pts) ** 2, "inexact_index_order": int(inexact_index),
                         "inexact_every_order": int(inexact_all), "worst": best[1] if best else None}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=12, help="pairs per (V, kind)")
    ap.add_argument("--grid", type=int, default=6, help="largest grid denominator d")
    ap.add_argument("--json", default="benchmarks/results/resispec.json")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = {"args": vars(a), "exact_atol": EXACT, "critique": critique(), "critique_pair_guarded": critique_guarded(),
           "generated": generated(a.seeds), "grid": grid(a.grid)}
    c = res["critique"]
    print(f"critique: law {np.round(c['law'], 12).tolist()} vs q {c['q']}, TV {c['tv']:.12g}")
    print("| V | K | cases | " + " | ".join(f"{o}: exact, max TV" for o in ORDERS) + " | control max TV |")
    print("|---|---|---|" + "---|" * (len(ORDERS) + 1))
    for V in VS:
        rv = res["generated"][f"V={V}"]
        for K in KS:
            rk = rv[f"K={K}"]
            cells = " | ".join(f"{rk[o]['exact']}, {rk[o]['max_tv']:.3f}" for o in ORDERS)
            print(f"| {V} | {K} | {rv['cases']} | {cells} | {rk['control_max_tv']:.1e} |")
    for d, g in res["grid"].items():
        print(d, {k: v for k, v in g.items() if k != "worst"}, g["worst"])
    if a.json:
        from cactus_theory.util.atomic import atomic_write_json

        atomic_write_json(a.json, res)
    print(f"{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
