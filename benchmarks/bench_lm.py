"""Real-LM speculative decoding benchmark: the embedded SmolLM2 pair on this machine.

For each rule (SpS, TAS, top-k, interpolation, Cactus delta in {0.25, 0.5, 1.0}) and each k in
{4, 8}, at the paper's sampling (temperature 0.6, top-p 0.95, top-k 20), on a fixed prompt set
(math / code / prose, ``lm.data.prompt_set``): AL, acceptance rate, wall-clock speedup over the
verifier decoding alone in the same run (measured before and after the rules; their mean is the
reference), mean exact per-step KL(h_alg || q), verifier NLL. Writes a JSON atomically, prints a
table.

    .venv/bin/python benchmarks/bench_lm.py --per-style 4 --max-new-tokens 64 --out bench_lm.json
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from cactus_theory.atomic import atomic_write_json
from cactus_theory.lm.data import prompt_set
from cactus_theory.lm.experiment import DEFAULT_RULES, SAMPLING, format_table, run_benchmark

__all__ = ["DEFAULT_RULES", "SAMPLING", "format_table", "main", "run_benchmark"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-style", type=int, default=4, help="prompts per style (math, code, prose)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="bench_lm.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from cactus_theory.lm.pair import load_pair

    t0 = time.time()
    pair = load_pair()
    print(f"loaded {pair.name} in {time.time() - t0:.1f} s; draft info: "
          f"{getattr(pair.draft, 'info', {}).get('heldout_acceptance', 'n/a')}", flush=True)
    res = run_benchmark(pair, prompt_set(args.per_style), ks=tuple(args.ks), max_new_tokens=args.max_new_tokens,
                        batch_size=args.batch_size, seed=args.seed)
    res["draft_info"] = getattr(pair.draft, "info", None)
    atomic_write_json(args.out, res)
    print(format_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
