"""How tight the sequence budget's certificate is, per allocation, by exact law on toy pairs.

For random toy pairs (``toy.random_pair``: V tokens, order 2, draft noise weight w) and budgets B, the exact
law of the first T tokens of the budgeted decode (``toy.budget_law``, k drafts per block) gives
``KL(P_T || Q_T)`` against the verifier's own law; the certificate says ``KL <= E[sum of charged costs] <= B``.
Printed per allocation: the mean over pairs of ``KL / B`` (how much of the budget the law really moves),
``E[charged] / B`` (how much the controller spends) and ``KL / E[charged]`` (what data processing loses: the
states' information), their minimum and maximum, and the largest realised per-path sum over B (never above 1).
Also the exact expected accepted drafts per verification (``E[accepted] / blocks``) is not computed here: the
real-LM AL comparison is paper_repro step o.

    python benchmarks/budget_tightness.py [--pairs 6] [--V 3] [--T 3] [--k 2] [--json out.json]
"""

from __future__ import annotations

import argparse

import numpy as np

import cactus_theory as ct
from cactus_theory import toy
from cactus_theory.core.budget import ALLOCATIONS
from cactus_theory.divergences import kl

BUDGETS = (0.02, 0.1, 0.3, 1.0)
WEIGHTS = (0.5, 0.9)


def measure(pairs: int, V: int, T: int, k: int, delta_max: float) -> dict:
    out: dict = {}
    for alloc in ALLOCATIONS:
        rows = []
        for seed in range(pairs):
            for w in WEIGHTS:
                d, v = toy.random_pair(V, order=2, concentration=0.5, weight=w, seed=seed)
                ar = toy.autoregressive_law(v, T).ravel()
                for B in BUDGETS:
                    res = toy.budget_law(d, v, ct.SequenceBudget(B, allocation=alloc, delta_max=delta_max), k, T)
                    K = float(kl(res.law.ravel(), ar))
                    rows.append({"seed": seed, "weight": w, "budget": B, "kl": K, "expected": res.expected_spent,
                                 "max": res.max_exact})
        r = {key: np.array([x[key] for x in rows]) for key in ("kl", "expected", "max", "budget")}
        ratio = {"kl/B": r["kl"] / r["budget"], "E/B": r["expected"] / r["budget"],
                 "KL/E": np.where(r["expected"] > 0, r["kl"] / np.maximum(r["expected"], 1e-300), 1.0),
                 "max/B": r["max"] / r["budget"]}
        out[alloc] = {"cases": len(rows), **{name: [float(v.mean()), float(v.min()), float(v.max())]
                                            for name, v in ratio.items()}, "rows": rows}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--V", type=int, default=3)
    ap.add_argument("--T", type=int, default=3)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--delta-max", type=float, default=5.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    res = measure(a.pairs, a.V, a.T, a.k, a.delta_max)
    print(f"{a.pairs} seeds x weights {WEIGHTS} x budgets {BUDGETS}; V = {a.V}, T = {a.T}, k = {a.k}, "
          f"delta_max = {a.delta_max:g}; mean [min, max] over cases")
    print("| allocation | KL / B | E[charged] / B | KL / E[charged] | max path sum / B |")
    print("|---|---|---|---|---|")
    for alloc, r in res.items():
        cell = lambda v: f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"  # noqa: E731
        print(f"| {alloc} | {cell(r['kl/B'])} | {cell(r['E/B'])} | {cell(r['KL/E'])} | {cell(r['max/B'])} |")
    if a.json:
        from cactus_theory.util.atomic import atomic_write_json

        atomic_write_json(a.json, {"args": vars(a), "results": res})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
