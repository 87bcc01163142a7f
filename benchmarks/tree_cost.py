"""What one verifier forward over W tree nodes costs against a one-token forward, on this machine.

A tree draft only pays if the verifier scores its W nodes in about the time of one token. On a CPU
without AMX the forward is compute-bound and the cost grows with W; this script measures that curve
for the embedded verifier (SmolLM2-135M-Instruct, the compact Llama), so every tree result can be
read beside it. No draft is needed.

For each width W it scores a random tree of W nodes (`Llama.forward_tree`: the committed prefix plus
each node's ancestors) after a prefix of `--context` tokens, batch 1, and reports the median of
`--reps` timed forwards divided by the median one-token forward (`Llama.forward`, W = 1) of the same
run. Two tree shapes: a chain (each node the child of the previous one) and a bushy tree (a node's
parent drawn uniformly among the earlier nodes). The CPU model, dtype and thread count are recorded.
Each width also gets its roofline (``lm.roofline``, roofs measured in the same run: copy bandwidth and the
GEMM rate in the dtype): the bytes and FLOPs of the forward (``verifier_forward_cost``), its roofline time
and the ratio measured / roofline (added keys ``roofline`` per dtype and ``bytes``, ``flops``,
``roofline_ms``, ``roofline_ratio`` per row).

    python benchmarks/tree_cost.py --dtype float32 bfloat16 --out benchmarks/results/lm/tree_cost.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cactus_theory.lm.roofline import cpu_model  # noqa: F401  (bench_lm reads it here)

WIDTHS = (1, 2, 4, 8, 16, 24, 32, 48, 64)




def parents_of(shape: str, W: int, gen: torch.Generator) -> torch.Tensor:
    """(1, W) int64 parents, topological: ``chain`` (node j under node j - 1) or ``bushy`` (under a
    uniformly drawn earlier node, or the prefix)."""
    if shape == "chain":
        return torch.arange(-1, W - 1).unsqueeze(0)
    par = [-1] + [int(torch.randint(-1, j, (1,), generator=gen)) for j in range(1, W)]
    return torch.tensor([par])


def _median_seconds(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(model, dtype: torch.dtype, context: int, reps: int, widths, seed: int = 0, roofline_mib: int = 256) -> dict:
    """``{"one_token_ms", "rows": [{"W", "shape", "ms", "ratio", "bytes", "flops", "roofline_ms",
    "roofline_ratio"}], "roofline": {...}}`` for one dtype (``roofline_mib``: the bandwidth copy's size)."""
    from cactus_theory.lm.llama import Llama
    from cactus_theory.lm.roofline import measure_roofs, roofline, verifier_forward_cost

    m = Llama.from_hf(model, dtype=dtype).eval()
    gen = torch.Generator().manual_seed(seed)
    V = m.args.vocab
    cap = context + max(widths) + 2
    cache = m.new_cache(1, cap)
    prefix = torch.randint(0, V, (1, context), generator=gen)
    with torch.inference_mode():
        m.forward(prefix, torch.zeros(1, dtype=torch.long), cache)
        start = torch.tensor([context])
        one = torch.randint(0, V, (1, 1), generator=gen)
        base = _median_seconds(lambda: m.forward(one, start, cache), reps)
        rows = []
        for W in widths:
            for shape in ("chain", "bushy"):
                par = parents_of(shape, W, gen)
                ids = torch.randint(0, V, (1, W), generator=gen)
                s = _median_seconds(lambda ids=ids, par=par: m.forward_tree(ids, par, start, cache), reps)
                rows.append({"W": W, "shape": shape, "ms": 1e3 * s, "ratio": s / base})
    roof = measure_roofs(m, widths, roofline_mib * 2**20, repeats=5)
    del roof["phases"]
    for r in rows:  # the bare forward: its logits are not sampled here
        c = verifier_forward_cost(m, r["W"], context, sampled=False)
        t, bound = roofline(c, roof["bandwidth"], roof["flop_rate"])
        r.update(bytes=c.bytes, flops=c.flops, roofline_ms=1e3 * t, bound=bound, roofline_ratio=r["ms"] / (1e3 * t))
    return {"one_token_ms": 1e3 * base, "rows": rows, "roofline": roof}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    ap.add_argument("--context", type=int, default=256, help="committed prefix length (tokens)")
    ap.add_argument("--reps", type=int, default=15, help="timed forwards per cell (median)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    ap.add_argument("--out", default=None, help="write the results JSON here (atomically)")
    ap.add_argument("--roofline-mib", type=int, default=256, help="MiB copied by the bandwidth measurement")
    args = ap.parse_args(argv)
    for name in ("context", "reps", "threads", "roofline_mib"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(w < 1 for w in args.widths):
        ap.error(f"--widths must all be >= 1, got {args.widths}")
    if 1 not in args.widths:
        args.widths = [1, *args.widths]
    torch.set_num_threads(args.threads)
    from cactus_theory.lm.pair import load_model

    model, _ = load_model("smollm2", torch.float32)
    out = {"cpu": cpu_model(), "threads": args.threads, "context": args.context, "reps": args.reps,
           "verifier": "SmolLM2-135M-Instruct (compact Llama)", "dtypes": {}}
    for name in args.dtype:
        res = measure(model, getattr(torch, name), args.context, args.reps, args.widths, roofline_mib=args.roofline_mib)
        out["dtypes"][name] = res
        print(f"{name}: one-token forward {res['one_token_ms']:.1f} ms ({out['cpu']}, {args.threads} thread(s), "
              f"context {args.context})")
        roof = res["roofline"]
        print(f"roofs: copy bandwidth {roof['bandwidth'] / 1e9:.1f} GB/s, GEMM {roof['flop_rate'] / 1e9:.1f} GFLOP/s "
              f"at {roof['peak_rows']} rows")
        print("| W | chain ms | chain / one token | bushy ms | bushy / one token | MB | MFLOP | roofline ms | bound "
              "| chain / roofline |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        by = {(r["W"], r["shape"]): r for r in res["rows"]}
        for W in args.widths:
            c, b = by[(W, "chain")], by[(W, "bushy")]
            print(f"| {W} | {c['ms']:.1f} | {c['ratio']:.2f}x | {b['ms']:.1f} | {b['ratio']:.2f}x | {c['bytes'] / 1e6:.1f} "
                  f"| {c['flops'] / 1e6:.0f} | {c['roofline_ms']:.1f} | {c['bound']} | {c['roofline_ratio']:.1f}x |")
    if args.out:
        from cactus_theory.util.atomic import atomic_write_json

        atomic_write_json(args.out, out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
