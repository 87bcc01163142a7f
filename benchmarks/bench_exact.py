"""Speed of the exact one-step law and of the cvxpy target problem. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_exact.py [--quick]

1. ``induced_distribution`` fast O(V log V) path vs the generic path (all V recovery rows, chunked)
   at V = 1,000 and 10,000, same run, one row, with their ratio and max difference.
2. The fast path alone at V = 151,936 (the Qwen3 vocabulary); target < 1 s.
3. ``solve_target`` (cvxpy + Clarabel) median time at V = 10, 100, 1,000 per divergence.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch

from cactus_theory.exact import induced_generic, induced_scaling
from cactus_theory.optimize import CVX_DIVERGENCES, solve_target
from cactus_theory.rules import Cactus, SpS


def timed(fn, reps: int) -> tuple[float, object]:
    """Median wall time of ``reps`` calls (seconds) and the last result."""
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def short(rule) -> str:
    """``SpS``, ``Cactus(0.05, kl, taylor)``, ..."""
    if isinstance(rule, Cactus):
        return f"Cactus({rule.delta}, {rule.divergence}, {rule.solver})"
    return type(rule).__name__


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the V=10,000 generic run and V=1,000 cvxpy")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"# bench_exact  ({platform.processor() or platform.machine()}, torch threads "
          f"{torch.get_num_threads()}, numpy {np.__version__})\n")

    print("## induced_distribution: fast vs generic (one row, independent Dirichlet(0.3) p and q)")
    print("rejectable = drafted tokens with phi_n < 1 (the generic path builds one recovery row each)")
    print(f"{'V':>7} {'rule':<28} {'rejectable':>10} {'generic s':>10} {'fast s':>9} {'ratio':>7} {'max|diff|':>10}")
    for V in (1_000, 10_000):
        if args.quick and V > 1_000:
            continue
        p, q = rng.dirichlet(np.full(V, 0.3)), rng.dirichlet(np.full(V, 0.3))
        for rule in (SpS(), Cactus(0.05), Cactus(0.05, "kl", "exact"), Cactus(0.5)):
            rej = int(np.sum((p > 0) & (rule.accept_prob_all(p, q) < 1)))
            tg, hg = timed(lambda r=rule, p=p, q=q: induced_generic(r, p, q), 1)
            tf, hf = timed(lambda r=rule, p=p, q=q: induced_scaling(r, p, q), 5)
            print(f"{V:>7} {short(rule):<28} {rej:>10} {tg:>10.3f} {tf:>9.4f} {tg / tf:>7.0f} {np.abs(hg - hf).max():>10.1e}")

    V = 151_936
    print(f"\n## fast path alone at V = {V:,} (median of 5; target < 1 s)")
    p, q = rng.dirichlet(np.full(V, 0.1)), rng.dirichlet(np.full(V, 0.1))
    for rule in (SpS(), Cactus(0.05), Cactus(0.05, "kl", "exact"), Cactus(1e-4, "kl", "exact"),
                 Cactus(0.05, "hellinger", "exact")):
        rej = int(np.sum((p > 0) & (rule.accept_prob_all(p, q) < 1)))
        t, h = timed(lambda r=rule, p=p, q=q: induced_scaling(r, p, q), 5)
        print(f"{short(rule):<28} {t:.3f} s  ({rej} rejectable, sum h_alg - 1 = {h.sum() - 1:.1e})")

    print("\n## solve_target (cvxpy, Clarabel, tight tolerances): median seconds")
    sizes = (10, 100) if args.quick else (10, 100, 1_000)
    print(f"{'divergence':<12}" + "".join(f"{f'V={v}':>12}" for v in sizes))
    for div in CVX_DIVERGENCES:
        row = []
        for V in sizes:
            q = rng.dirichlet(np.ones(V))
            t, _ = timed(lambda q=q, V=V, div=div: solve_target(q, V // 2, 0.3, div), 5 if V < 1_000 else 3)
            row.append(t)
        print(f"{div:<12}" + "".join(f"{t:>12.4f}" for t in row))


if __name__ == "__main__":
    main()
