"""The cost of one eval batch under each compute setting (issue 39 item 3): which settings the eval_v3 protocol
should fix. Every setting leaves the laws unchanged (each rule is judged against the laws the run computes);
what differs is the seconds.

One batch = the eval's rows: the first ``--rows`` questions of ``--task`` (replicate 0, the protocol's row seeds),
decoded by the verifier alone, SpS and Cactus delta = 1 at k = 4, up to 128 new tokens, the paper's sampling.
Settings, each timed in rounds (a random order per round, seeded), the same rows every time:

* dtype float32 / bfloat16, the lean CPU step on / off (``ModelPair.lean``), the exact step KL tracked or not
  (``track_kl``; tracked outside the timed decode, but it costs wall time), 1 or 2 torch threads.

Prints seconds per batch (median over rounds) and the projected hours of the protocol's primary run
(tasks x batches x methods at these costs); writes the JSON atomically. Run it alone on the machine::

    .venv/bin/python benchmarks/eval_cost.py --rounds 2 --out benchmarks/results/lm/eval_cost.json
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import time

__all__ = ["main"]

METHODS = ("verifier alone", "SpS", "Cactus delta=1")


def _decode(pair, prompts, seeds, method: str, max_new: int, track_kl: bool) -> tuple[float, int]:
    from cactus_theory.lm.loop import autoregressive_generate, speculative_generate

    kw = dict(max_new_tokens=max_new, batch_size=len(prompts), seeds=seeds)
    t0 = time.perf_counter()
    if method == "verifier alone":
        res = autoregressive_generate(pair, prompts, **kw)
    else:
        rule = "sps" if method == "SpS" else "cactus"
        res = speculative_generate(pair, prompts, rule, k=4, track_kl=track_kl, **kw)
    return time.perf_counter() - t0, res.stats.new_tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="add_wide")
    ap.add_argument("--rows", type=int, default=32, help="rows of the batch (the protocol's batch size)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    for name in ("rows", "rounds", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(t < 1 for t in args.threads):
        ap.error(f"--threads must be >= 1, got {args.threads}")
    import torch

    from cactus_theory.core import registry
    from cactus_theory.lm.experiments import tasks
    from cactus_theory.lm.experiments.replicated import row_seed
    from cactus_theory.lm.loop import runtime_models
    from cactus_theory.lm.pair import load_pair
    from cactus_theory.lm.roofline import cpu_model
    from cactus_theory.util.atomic import atomic_write_json

    probs = tasks.distinct_problems(args.task, args.rows, 0)
    prompts = [p.question for p in probs]
    ids = {"verifier alone": "None", "SpS": registry.make("sps").identity, "Cactus delta=1":
           registry.make("cactus", delta=1.0).identity}
    seeds = {m: [row_seed(0, args.task, p.question, 0, ids[m]) for p in probs] for m in METHODS}
    settings = [dict(dtype=d, lean=lean, track_kl=kl, threads=th)
                for d, lean, kl, th in itertools.product(args.dtypes, (True, False), (True, False), args.threads)
                if not (kl is False and lean is False)]  # the KL cost is measured on the lean step only
    pairs = {}
    for d, lean in {(s["dtype"], s["lean"]) for s in settings}:
        pair = load_pair(dtype=getattr(torch, d), lean=lean)
        runtime_models(pair)
        pairs[(d, lean)] = pair
    rng = random.Random(0)
    times: dict = {}
    tokens: dict = {}
    jobs = [(i, m) for i in range(len(settings)) for m in METHODS]
    for r in range(args.rounds):
        order = jobs[:]
        rng.shuffle(order)
        for n, (i, m) in enumerate(order):
            s = settings[i]
            torch.set_num_threads(s["threads"])
            sec, tok = _decode(pairs[(s["dtype"], s["lean"])], prompts, seeds[m], m, args.max_new_tokens,
                               s["track_kl"])
            times.setdefault((i, m), []).append(sec)
            tokens[(i, m)] = tok
            print(f"round {r + 1}/{args.rounds} job {n + 1}/{len(order)}: {s} {m}: {sec:.1f} s, {tok} tokens",
                  file=sys.stderr, flush=True)
    rows = []
    for i, s in enumerate(settings):
        per = {m: statistics.median(times[(i, m)]) for m in METHODS}
        # the primary run: 2 tasks x 105 batches x (verifier alone, SpS, 3 lossy rules at Cactus's cost)
        hours = 2 * 105 * (per["verifier alone"] + per["SpS"] + 3 * per["Cactus delta=1"]) / 3600
        rows.append({**s, "seconds": per, "rounds": {m: times[(i, m)] for m in METHODS},
                     "tokens": {m: tokens[(i, m)] for m in METHODS}, "projected_primary_hours": hours})
    print(f"\none batch of {args.rows} rows of {args.task}, up to {args.max_new_tokens} new tokens, median of "
          f"{args.rounds} rounds ({cpu_model()}):")
    print("| dtype | lean | step KL | threads | verifier alone s | SpS s | Cactus delta=1 s | primary run h |")
    print("|---|---|---|---|---|---|---|---|")
    for row in sorted(rows, key=lambda x: x["projected_primary_hours"]):
        sec = row["seconds"]
        print(f"| {row['dtype']} | {row['lean']} | {row['track_kl']} | {row['threads']} | {sec['verifier alone']:.1f} | "
              f"{sec['SpS']:.1f} | {sec['Cactus delta=1']:.1f} | {row['projected_primary_hours']:.2f} |")
    if args.out:
        atomic_write_json(args.out, {"cpu": cpu_model(), "torch": torch.__version__, "task": args.task,
                                     "rows": args.rows, "rounds": args.rounds, "max_new_tokens": args.max_new_tokens,
                                     "settings": rows})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
