"""Observed false-positive rate of the suite's statistical tests against their nominal level.

Runs the same harness the tests use (``toy.one_step_test``, ``toy.sequence_test``, plus
``stats.homogeneity`` on two independent ``verify`` runs) with the *correct* sampler over many
seeds, at a level large enough to measure (default alpha = 0.05), and prints the rejection rate
with a Clopper-Pearson 95% interval. A calibrated test has rate ~alpha (the interval covers it).

    .venv/bin/python benchmarks/false_positive_rate.py --seeds 200
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from scipy import stats as sps
from tqdm import tqdm

import cactus_theory as ct
from cactus_theory.sampler import sample_rows, verify
from cactus_theory.stats import goodness_of_fit, homogeneity
from cactus_theory.toy import one_step_test, random_pair, sequence_test
from cactus_theory.util.atomic import atomic_write_json

RULES = [ct.SpS(), ct.Cactus(0.5), ct.TAS(), ct.TopK(3), ct.Interpolation(0.4), ct.EARS(0.3)]


def homogeneity_pvalue(rule, p, q, n: int, seed: int, alpha: float) -> float:
    """Two independent verify runs (first emitted token) tested for the same law."""
    k, V = p.shape
    out = []
    for s in (2 * seed, 2 * seed + 1):
        g = torch.Generator().manual_seed(s)
        P = torch.from_numpy(p).expand(n, k, V)
        Q = torch.from_numpy(q).expand(n, k + 1, V)
        d = torch.stack([sample_rows(P[:, j], torch.rand(n, generator=g, dtype=torch.float64)) for j in range(k)], 1)
        out.append(verify(d, P, Q, rule, generator=g)[0][:, 0].numpy())
    return homogeneity(out[0], out[1], V, alpha=alpha).pvalue


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--samples", type=int, default=5000, help="draws per test")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here (atomically)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.full(8, 0.7), size=2), rng.dirichlet(np.full(8, 0.7), size=3)
    d, v = random_pair(3, order=2, concentration=1.0, weight=0.6, seed=0)
    tests = {}
    for rule in RULES:
        tests[f"one_step chi2 {rule!r}"] = lambda s, r=rule: one_step_test(r, p, q, num_samples=args.samples, seed=s, alpha=args.alpha).pvalue
    tests["one_step gtest Cactus(0.5)"] = lambda s: one_step_test(ct.Cactus(0.5), p, q, num_samples=args.samples, seed=s, alpha=args.alpha, statistic="gtest").pvalue
    for rule in (ct.SpS(), ct.Cactus(0.5)):
        tests[f"sequence k=2 T=3 {rule!r}"] = lambda s, r=rule: sequence_test(d, v, r, 2, 3, num_sequences=args.samples, seed=s, alpha=args.alpha).pvalue
    tests["homogeneity Cactus(0.5)"] = lambda s: homogeneity_pvalue(ct.Cactus(0.5), p, q, args.samples, s, args.alpha)
    small = rng.dirichlet(np.ones(5))
    tests["montecarlo gof N=15"] = lambda s: goodness_of_fit(np.random.default_rng(10_000 + s).choice(5, 15, p=small), small, method="montecarlo", n_sim=2000, seed=s).pvalue
    tests["exact gof N=15"] = lambda s: goodness_of_fit(np.random.default_rng(10_000 + s).choice(5, 15, p=small), small, method="exact").pvalue

    print(f"nominal alpha {args.alpha}, {args.seeds} seeds per test, {args.samples} draws per test")
    print(f"{'test':<60} {'rejections':>10} {'rate':>7}  95% CI")
    rows = []
    total = 0
    for name, fn in tqdm(tests.items(), desc="tests", leave=False):
        rej = sum(fn(s) < args.alpha for s in range(args.seeds))
        ci = sps.binomtest(rej, args.seeds).proportion_ci(0.95)
        rows.append(dict(test=name, rejections=int(rej), seeds=args.seeds, rate=rej / args.seeds, ci=[ci.low, ci.high]))
        total += rej
        tqdm.write(f"{name:<60} {rej:>10} {rej / args.seeds:>7.3f}  [{ci.low:.3f}, {ci.high:.3f}]")
    n = args.seeds * len(tests)
    ci = sps.binomtest(total, n).proportion_ci(0.95)
    print(f"{'all tests pooled':<60} {total:>10} {total / n:>7.3f}  [{ci.low:.3f}, {ci.high:.3f}]")
    if args.out:
        atomic_write_json(args.out, {"alpha": args.alpha, "rows": rows, "pooled": [total, n]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
