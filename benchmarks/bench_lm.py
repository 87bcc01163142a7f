"""Real-LM speculative decoding benchmark: the embedded SmolLM2 pair (or any pair) on this machine.

Every rule at every k and batch size against the verifier decoding alone at the same batch size,
in one run, same prompts (held-out: ``lm.data.prompt_set``, math / code / prose), the paper's
sampling (temperature 0.6, top-k 20, top-p 0.95). Prints AL (tokens per verifier call, bonus
included) and per-token acceptance with bootstrap 95% intervals over prompts, the speedup over the
verifier alone with its 95% interval over rounds, the mean exact step KL(h_alg || q), the verifier
NLL, the ratio of one draft step to one verifier forward, a per-step profile (draft / verifier forward
/ verify / bookkeeping), and the draft issue's targets, each marked met or missed. Writes the results
JSON atomically, and only when the run passes its gates.

**Timing: interleaved rounds** (``lm.rounds``, the helper ``cactus-theory decode --baseline --rounds R`` uses
too). The verifier alone (at each batch size) and every method run once per round, in an order drawn afresh
each round from ``--seed``, ``--rounds R`` rounds (default 5), each round decoding the same prompts with the
same seed (so the same tokens: AL, acceptance, KL and NLL are the first round's; ``same_decodes`` in the JSON
says whether every round repeated it). The speedup is the ratio of a method's tokens/s to the verifier alone's
in the same round (``prompt_speedup``: the same for the time per prompt); the point is the geometric mean of
the rounds' ratios, the interval a 95% Student-t interval over rounds of the log ratio, and the rounds' own
ratios are kept (``speedup_rounds``). The run's orders are in ``orders``. Cost: R times the decodes of one
pass (a pass = the verifier alone plus every method, at each batch size).

**Gates** (``experiment.gates``): the result file is written only when (a) no rule's verifier forward over
W > 1 positions was measured faster than the verifier alone's one-token forward at the same batch size,
(b) the verifier alone's per-round tokens/s, max / min, is at most ``--drift-bound`` (default 1.10: of the 15
before / after baseline pairs in the committed results, 9 differ by 1.003 to 1.06, 6 by 1.08 to 1.25) and (c) no phase was measured
below its roofline (measured / roofline < 1). Otherwise the run prints its tables and the failed gates and
exits 1 without writing; ``--no-gates`` writes it with ``gates.on = false`` and the failures listed.

The committed measurement (a quiet machine, nothing else running):

    .venv/bin/python benchmarks/bench_lm.py --threads 1 --dtype bfloat16 --rules sps cactus --ks 4 --batch-sizes 1 \
        --rounds 5 --out benchmarks/results/lm/<name>.json

Other runs:

    .venv/bin/python benchmarks/bench_lm.py --ks 2 4 6 8 --batch-sizes 1 4 8 --rules sps cactus
    .venv/bin/python benchmarks/bench_lm.py --rules sps cactus --tree-branching 2,2 4,2,1 --tree-dynamic 4,4,2
    .venv/bin/python benchmarks/bench_lm.py --threads 1 --dtype bfloat16 --rules sps cactus --tree-budget 16,5,4
    .venv/bin/python benchmarks/bench_lm.py --threads 1 --rules sps cactus --ks 4 6 --draft-stop-prob 0.3 path:0.1
    .venv/bin/python benchmarks/bench_lm.py --threads 1 --dtype bfloat16 --throughput     # batch 1, 8, 32

``--throughput``: the verifier alone, SpS and Cactus delta=1 (unless ``--rules``) at batch sizes 1, 8 and 32
(unless ``--batch-sizes``) in the same interleaved run, the prompts cycled to fill the largest batch (24 prompts
-> 32); prints and stores (``throughput``) per method and batch size the tokens/s of the whole batch, the live
rows per verifier call, the tokens/s per row, the speedup over the verifier alone at that batch size, the gain
over the verifier alone at batch 1, the seconds 1,000 answers of this length take (the eval decodes at batch 32,
``replicated.RunConfig``) and the compute-roof ratio (``experiment.throughput``). Cost: 3 methods x 3 batch
sizes x R rounds of 32 prompts; the batch-1 decodes dominate (about 32 x 64 tokens at the verifier alone's
speed per method and round).

Bad flags (``--threads 0``, ``--ks 0``, ``--per-style 9``, ``--device banana``, ``--tree-budget 8,4``, ...) are
argparse errors (exit 2, one line naming the flag and value) before any model loads.

Every run also measures this machine's roofs in the same process (``lm.roofline``: a STREAM-like copy
for the memory bandwidth, a GEMM shaped like the verifier's widest layer in the run's dtype for the
compute rate) and prints, per (rule, k or tree, batch) row and phase (draft, verifier forward, verify,
bookkeeping, per verifier call; and the verifier alone's one-token forward), its time, the bytes it must
move and its FLOPs, its roofline time and the ratio measured / roofline, with the CPU model (or GPU
name); all of it goes into the JSON under ``roofline`` (``benchmarks/roofline_table.py`` writes the
table into docs/decoding.md). ``--quick``: a smoke test (1 prompt per style, 8 new tokens, SpS and
Cactus only, 2 rounds, a 32 MiB copy), not a measurement (its timings are too short for the gates: add
``--no-gates`` to see the file).

    .venv/bin/python benchmarks/bench_lm.py --quick --threads 1 --dtype bfloat16 --no-gates --out /tmp/bench_quick.json

The pair runs the library's lean CPU step, as every entry point does (``ModelPair.lean``,
``lm.loop.lean_step``): the draft in ``--dtype`` too (``--draft-dtype`` to differ; the built draft is stored in
float32) and the linear maps of both models prepacked once (``lm.packed``); ``--no-lean`` is the library's
opt-out (plain ``F.linear``, the draft as loaded unless ``--draft-dtype``). The settings record what was done,
and the verifier alone runs the same modules as the speculative rows.

``--tree-budget NODES,DEPTH,TOPK``: EAGLE-2's re-ranked tree (``core.tree.BudgetTree``), always with
deterministic top-k candidates (the only lossless scheme under re-ranking); its rows also get the
tree targets (``experiment.tree_targets``: met only when the 95% interval clears the target).

``--draft-stop-prob P [SIGNAL:P ...]``: also run every rule at every k with an adaptive draft length
(``core.draft_stop.DraftStop``: a row stops its block once the draft's top probability, or ``path:`` its path
probability, falls below P), beside the fixed k in the same run; its row's k reads ``"4 top>=0.3"`` and
``al_vs_chain`` is its AL over the fixed chain's at the same k (paired).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from cactus_theory.core.draft_stop import DraftStop
from cactus_theory.core.tree import SCHEMES, BudgetTree, DynamicTree, branching_parents
from cactus_theory.lm.data import MATH_PROMPTS, prompt_set
from cactus_theory.lm.experiments.experiment import (
    DEFAULT_RULES,
    DRIFT_BOUND,
    ROUNDS,
    SAMPLING,
    THROUGHPUT_BATCHES,
    format_table,
    format_throughput,
    gates,
    run_benchmark,
    targets,
    throughput,
    tree_targets,
)
from cactus_theory.lm.roofline import cpu_model
from cactus_theory.lm.roofline import format_table as roofline_table
from cactus_theory.rules import Cactus, SpS
from cactus_theory.util.args import check_device, positive_int
from cactus_theory.util.atomic import atomic_write_json

__all__ = ["main"]

RULE_SETS = {"all": DEFAULT_RULES, "sps": [r for r in DEFAULT_RULES if r[1] == SpS()],
             "cactus": [r for r in DEFAULT_RULES if r[1] == Cactus(1.0)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-style", type=_per_style, default=8,
                    help=f"prompts per style (math, code, prose; 1 to {len(MATH_PROMPTS)})")
    ap.add_argument("--max-new-tokens", type=positive_int, default=64)
    ap.add_argument("--ks", type=positive_int, nargs="+", default=[4], help="drafts per step")
    ap.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[1])
    ap.add_argument("--tree-branching", nargs="+", default=[], metavar="B1,B2,...",
                    help="also run every rule on these static trees (depth d nodes have B_d children)")
    ap.add_argument("--tree-dynamic", nargs="+", default=[], metavar="DEPTH,WIDTH,CHILDREN",
                    help="also run every rule on these dynamic trees (core.tree.DynamicTree)")
    ap.add_argument("--tree-budget", nargs="+", default=[], metavar="NODES,DEPTH,TOPK",
                    help="also run every rule on these EAGLE-2 budget trees (core.tree.BudgetTree; deterministic)")
    ap.add_argument("--tree-joint", action="store_true",
                    help="also run the two-block rules (Cactus) on each --tree-budget tree in mode joint")
    ap.add_argument("--tree-scheme", default="iid", choices=list(SCHEMES),
                    help="how the candidates of --tree-branching / --tree-dynamic trees are drawn")
    ap.add_argument("--draft-stop-prob", nargs="+", default=[], metavar="P",
                    help="also run every rule at every k with these adaptive draft lengths (P: the draft's top "
                         "probability, path:P its path probability; core.draft_stop.DraftStop)")
    ap.add_argument("--rules", nargs="+", default=["all"], choices=sorted(RULE_SETS),
                    help="rule sets: all (SpS, TAS, top-k, interpolation, Cactus 0.25 / 0.5 / 1), sps, cactus")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (the targets' run uses 1)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="verifier and draft dtype")
    ap.add_argument("--draft-dtype", default=None, choices=["float32", "bfloat16"],
                    help="the draft's dtype when it differs from --dtype (the built draft is stored in float32)")
    ap.add_argument("--no-lean", action="store_true",
                    help="the library's opt-out of the lean CPU step (ModelPair.lean): plain F.linear, the draft as "
                         "loaded (unless --draft-dtype)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="bench_lm.json")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 prompt per style, 8 new tokens, rules sps and cactus (unless given), "
                         "a 32 MiB copy and 3 repeats for the roofs; not a measurement")
    ap.add_argument("--throughput", action="store_true",
                    help="batch throughput: the verifier alone, SpS and Cactus delta=1 (unless --rules) at batch sizes "
                         f"{' '.join(map(str, THROUGHPUT_BATCHES))} (unless --batch-sizes) in the same interleaved run, "
                         "the prompts cycled to fill the largest batch; prints tokens/s, per row, and the compute-roof "
                         "ratio")
    ap.add_argument("--rounds", type=positive_int, default=None,
                    help=f"interleaved rounds: the verifier alone and every method once per round, in a random order "
                         f"(default {ROUNDS}, 2 with --quick; at least 2, for the interval over rounds)")
    ap.add_argument("--drift-bound", type=float, default=DRIFT_BOUND,
                    help="gate: refuse the run when the verifier alone's per-round tokens/s, max / min, exceeds this "
                         f"(default {DRIFT_BOUND}; experiment.gates says why)")
    ap.add_argument("--no-gates", action="store_true",
                    help="write the result even when a gate fails (the JSON records that the gates were off and "
                         "which failed)")
    ap.add_argument("--roofline-mib", type=positive_int, default=None,
                    help="MiB copied by the bandwidth measurement (default 256, 32 with --quick; past the caches)")
    ap.add_argument("--roofline-repeats", type=positive_int, default=None,
                    help="repeats of each roof measurement, the best kept (default 10, 3 with --quick)")
    args = ap.parse_args(argv)
    given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
    if args.throughput:
        args.batch_sizes = list(THROUGHPUT_BATCHES) if "--batch-sizes" not in given else args.batch_sizes
        args.rules = ["sps", "cactus"] if "--rules" not in given else args.rules
    if args.quick:
        args.per_style = 1 if "--per-style" not in given else args.per_style
        args.max_new_tokens = 8 if "--max-new-tokens" not in given else args.max_new_tokens
        args.rules = ["sps", "cactus"] if "--rules" not in given else args.rules
    if args.roofline_mib is None:
        args.roofline_mib = 32 if args.quick else 256
    if args.roofline_repeats is None:
        args.roofline_repeats = 3 if args.quick else 10
    if args.rounds is None:
        args.rounds = 2 if args.quick else ROUNDS
    if args.rounds < 2:
        ap.error(f"--rounds must be >= 2 (an interval over rounds needs two), got {args.rounds}")
    if not (math.isfinite(args.drift_bound) and args.drift_bound >= 1):
        ap.error(f"--drift-bound must be a finite number >= 1 (max / min of the baseline's rounds), got "
                 f"{args.drift_bound}")
    try:
        check_device(args.device, "--device")
    except ValueError as e:
        ap.error(str(e))
    trees = []
    for flag, texts, arity in (("--tree-branching", args.tree_branching, None),
                               ("--tree-dynamic", args.tree_dynamic, "DEPTH,WIDTH,CHILDREN"),
                               ("--tree-budget", args.tree_budget, "NODES,DEPTH,TOPK")):
        for t in texts:
            nums = _tree_numbers(t)
            want = f"three integers >= 1, {arity}" if arity else "comma-separated integers >= 1"
            if nums is None or (arity and len(nums) != 3):
                ap.error(f"{flag} must be {want}, got {t!r}")
            try:
                if flag == "--tree-branching":
                    trees.append((f"tree {t}", branching_parents(nums)))
                elif flag == "--tree-dynamic":
                    trees.append((f"dyn {t}", DynamicTree(*nums)))
                else:
                    tree = BudgetTree(*nums)
                    trees.append((f"eagle2 {t}", tree, "deterministic", "rounds"))
                    if args.tree_joint:
                        trees.append((f"eagle2 {t} joint", tree, "deterministic", "joint"))
            except (ValueError, TypeError) as e:
                ap.error(f"{flag} {t!r}: {e}")
    try:
        stops = [DraftStop.parse(t) for t in args.draft_stop_prob]
    except ValueError as e:
        ap.error(f"--draft-stop-prob: {e}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rules = []
    for name in args.rules:
        rules += [r for r in RULE_SETS[name] if r not in rules]
    from cactus_theory.lm.loop import runtime_models
    from cactus_theory.lm.pair import load_pair

    t0 = time.time()
    pair = load_pair(dtype=getattr(torch, args.dtype), lean=not args.no_lean)
    pair.verifier.to(args.device)
    pair.draft.to(args.device)
    if args.draft_dtype:
        pair.draft_dtype = getattr(torch, args.draft_dtype)
        if args.no_lean:  # the lean step casts it otherwise
            pair.draft.cast(pair.draft_dtype) if hasattr(pair.draft, "cast") else pair.draft.to(pair.draft_dtype)
    run_draft, _ = runtime_models(pair)  # the lean step, once, before any timing
    packed = getattr(pair, "lean_state", "not lean (--no-lean)")
    draft_dtype = str(next(run_draft.parameters()).dtype).replace("torch.", "")
    info = getattr(pair.draft, "info", {}) or {}
    print(f"loaded {pair.name} ({args.dtype}, draft {draft_dtype}, {packed}, {args.device}, "
          f"{torch.get_num_threads()} threads) in "
          f"{time.time() - t0:.1f} s; draft held-out acceptance by depth: "
          f"{info.get('heldout_acceptance_by_depth', 'n/a')}", flush=True)
    prompts = prompt_set(args.per_style)
    if args.throughput and len(prompts) < max(args.batch_sizes):  # fill the largest batch: the prompts cycled
        prompts = [prompts[i % len(prompts)] for i in range(max(args.batch_sizes))]
    res = run_benchmark(pair, prompts, rules=rules, ks=tuple(args.ks),
                        batch_sizes=tuple(args.batch_sizes), max_new_tokens=args.max_new_tokens, seed=args.seed,
                        sampling=SAMPLING, trees=trees, tree_scheme=args.tree_scheme, draft_stops=stops,
                        rounds=args.rounds)
    res["draft_info"] = {k: v for k, v in info.items() if k != "losses"}
    res["settings"].update(dtype=args.dtype, draft_dtype=draft_dtype, prepacked=packed,
                           device=args.device, cpu=cpu_model(), throughput=args.throughput,
                           distinct_prompts=len(set(map(str, prompts))))
    found = targets(res, k=4 if 4 in args.ks else args.ks[0], batch=min(args.batch_sizes))
    for t in trees:
        found += tree_targets(res, t[0], batch=min(args.batch_sizes))
    res["targets"] = [dict(zip(("what", "measured", "ci", "target", "met"), t, strict=True)) for t in found]
    res["roofline"] = roofline_of(pair, res, prompts, trees, args)
    if args.throughput:
        res["throughput"] = throughput(res)
    failed = gates(res, args.drift_bound)
    res["gates"] = {"on": not args.no_gates, "drift_bound": args.drift_bound, "failed": failed}
    print(format_table(res))
    print("roofline (per verifier call; bytes moved and GEMM FLOPs a phase must do; SpS and Cactus delta=1 rows "
          "and the verifier alone; every row in the JSON):")
    print(roofline_table(res["roofline"], rules=ROOFLINE_RULES))
    print("targets (chain k = 4 and each tree, batch size 1, this run):")
    for t in res["targets"]:
        ci = f"[{t['ci'][0]:.3f}, {t['ci'][1]:.3f}]" if t["ci"] else ""
        print(f"  {t['what']:<54} {t['measured']:8.3f} {ci:>16}  target {t['target']:<28} "
              f"{'met' if t['met'] else 'MISSED'}")
    if args.throughput:
        print("batch throughput (tok/s: every row of the batch together; rows: live rows per verifier call; compute "
              "roof: time per verifier call over its GEMM FLOPs at the compute roof):")
        print(format_throughput(res["throughput"]))
    for why in failed:
        print(f"gate failed: {why}", file=sys.stderr)
    if failed and not args.no_gates:
        print(f"not written: {len(failed)} gate(s) failed, so these timings are not to be trusted; rerun on a quiet "
              f"machine (or --no-gates to write the result with the gates recorded as off)", file=sys.stderr)
        return 1
    atomic_write_json(args.out, res)
    print(f"wrote {args.out}" + (f" (gates OFF, {len(failed)} failed)" if args.no_gates else " (every gate passed)"))
    return 0


ROOFLINE_RULES = ("SpS", "Cactus delta=1")


def roofline_of(pair, res: dict, prompts, trees, args) -> dict:
    """The run's roofline (``lm.roofline``): this machine's roofs measured now, and per row of ``res``
    and phase the time per verifier call, the cost at the row's mean context (the prompts' mean length
    plus half the new tokens), mean rows per verifier call and AL, its roofline time and the ratio."""
    from cactus_theory.lm.loop import prepare_prompts, runtime_models
    from cactus_theory.lm.roofline import (
        gemm_shape,
        measure_matmul,
        measure_roofs,
        phase_rows,
        step_costs,
        verifier_forward_cost,
    )

    draft, verifier = runtime_models(pair)
    by_label = {t[0]: t[1] for t in trees}
    widths = {1} | {k + 1 for k in args.ks} | {_tree_width(t) + 1 for t in by_label.values()}
    roof = measure_roofs(verifier, widths, args.roofline_mib * 2**20, args.roofline_repeats, args.device)
    rates = dict.fromkeys(("verifier", "verify", "bookkeeping", "draft"), roof["flop_rate"])
    if draft.dtype != verifier.dtype:  # the draft's GEMMs (its steps, its fc in the bookkeeping) run in its dtype
        roof["draft_dtype"] = str(draft.dtype).replace("torch.", "")
        roof["draft_flop_rate"] = measure_matmul(draft.dtype, roof["peak_rows"], *gemm_shape(verifier),
                                                 args.roofline_repeats, args.device)
        rates["draft"] = rates["bookkeeping"] = roof["draft_flop_rate"]
    prompt_len = sum(len(p) for p in prepare_prompts(pair, prompts, args.max_new_tokens)) / len(prompts)
    roof["mean_prompt_tokens"] = prompt_len
    for b, base in res["baselines"].items():
        runs = base["runs"]
        calls = sum(r["verifier_calls"] for r in runs)
        ctx = prompt_len + sum(r["new_tokens"] for r in runs) / max(1, sum(r["sequences"] for r in runs)) / 2
        cost = {"verifier": verifier_forward_cost(verifier, 1, ctx, sum(r["steps"] for r in runs) / max(1, calls))}
        rows = phase_rows(f"verifier alone B={b}", {"verifier": sum(r["verifier_seconds"] for r in runs)
                                                    / max(1, calls)}, cost, roof["bandwidth"], rates,
                          roof["nominal_bandwidth"])
        roof["phases"] += [{**r, "rule": None, "k": 0, "batch_size": int(b), "context": ctx, "width": 1} for r in rows]
    for row in res["rows"]:
        calls = max(1, row["verifier_calls"])
        ctx = prompt_len + row["new_tokens"] / max(1, row["sequences"]) / 2
        adaptive = isinstance(row["k"], str) and row["k"] not in by_label  # an adaptive chain: "4 top>=0.3"
        if adaptive:
            shape = {"k": int(row["k"].split()[0])}
        else:
            shape = {"tree": by_label[row["k"]]} if isinstance(row["k"], str) else {"k": row["k"]}
        costs = step_costs(draft, verifier, ctx, row["steps"] / calls, al=max(1.0, row["al"]), **shape)
        if adaptive:  # the drafts actually made: the draft steps taken per verifier call, not the cap k
            costs["draft"] = costs["draft"].times(row["draft_calls"] / calls / shape["k"])
        secs = {ph: row[f"{ph}_seconds"] / calls for ph in ("draft", "verifier", "verify", "bookkeeping")}
        what = row["k"] if isinstance(row["k"], str) else f"k={row['k']}"  # a tree's label names it
        rows = phase_rows(f"{row['rule']} {what} B={row['batch_size']}", secs, costs, roof["bandwidth"],
                          rates, roof["nominal_bandwidth"])
        width = shape["k"] + 1 if "k" in shape else _tree_width(shape["tree"]) + 1  # positions the verifier scores
        roof["phases"] += [{**r, "rule": row["rule"], "k": row["k"], "batch_size": row["batch_size"], "context": ctx,
                            "width": width} for r in rows]
    return roof


def _per_style(text: str) -> int:
    """argparse type of ``--per-style``: an integer in [1, len(MATH_PROMPTS)] (the prompt set has that many a style)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= len(MATH_PROMPTS):
        raise argparse.ArgumentTypeError(f"must be an integer in [1, {len(MATH_PROMPTS)}] (prompts per style), "
                                         f"got {text!r}")
    return n


def _tree_numbers(text: str) -> tuple[int, ...] | None:
    """The integers >= 1 of a comma-separated tree flag value, or None when it is not one."""
    try:
        nums = tuple(int(x) for x in text.split(","))
    except ValueError:
        return None
    return nums if nums and min(nums) >= 1 else None


def _tree_width(tree) -> int:
    """The nodes a tree's verifier forward scores (a BudgetTree keeps fewer than it grows)."""
    from cactus_theory.lm.loop import tree_nodes

    return tree_nodes(tree)[0]


if __name__ == "__main__":
    sys.exit(main())
