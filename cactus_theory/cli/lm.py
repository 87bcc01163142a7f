"""``cactus-theory decode``: speculative decoding with a (draft, verifier) pair, printing the texts
and the statistics, and with ``--baseline`` the verifier alone on the same prompts, its texts and
the speedup (defaults: the embedded SmolLM2 pair, the paper's sampling).

Every argument is checked (``check``) before any model loads. Timing: both runs are warmed up on
the first batch before they are timed, so one-time costs (allocations, lazy initialisation) land
in neither; speeds are decode time only (the exact step-KL bookkeeping excluded); a speedup that
rests on fewer than ``MIN_TIMED_TOKENS`` generated tokens is flagged as noise. ``--rounds R`` times
the two with the benchmark's own helper (``lm.rounds.interleaved_rounds``: R rounds, a random order
per round) and reports the speedup as ``benchmarks/bench_lm.py`` does (``lm.rounds.ratio_over_rounds``:
the geometric mean of the rounds' ratios and its 95% t-interval); without it, one round.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from ..core.draft_stop import DraftStop
from ..core.tree_shapes import BUDGET_DEPTH, BUDGET_TOPK, MODES, RERANK_SCHEMES, SCHEMES, flag_tree
from ..lm.draft_config import check_draft_built, check_draft_file
from ..lm.loading import check_model, quiet_transformers
from ..util.args import check_writable_file, positive_int, read_prompts

__all__ = ["DESCRIPTION", "configure", "check", "check_model", "run", "quiet_transformers", "MIN_TIMED_TOKENS"]

DESCRIPTION = ("Speculative decoding with a (draft, verifier) pair under any acceptance rule: prints the "
               "texts, AL and per-token acceptance, the exact per-step KL and the verifier's NLL; with "
               "--baseline also the verifier alone (its texts and the speedup, both runs warmed up first).")
MIN_TIMED_TOKENS = 100  # fewer generated tokens than this and a CPU speedup is mostly noise
WARMUP_TOKENS = 8


def configure(parser: argparse.ArgumentParser) -> None:
    from ..core.registry import add_rule_arguments, add_sampling_arguments

    g = parser.add_argument_group("prompts")
    g.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    g.add_argument("--prompts-file", help=r"a UTF-8 text file, one prompt per line ('\n' inside a line is a newline)")
    g.add_argument("--no-chat", action="store_true", help="feed prompts raw, without the chat template")
    add_rule_arguments(parser)
    g = parser.add_argument_group("decoding")
    g.add_argument("-k", "--num-drafts", dest="num_drafts", type=positive_int, default=4,
                   help="drafted tokens per step (the paper's m)")
    g.add_argument("--max-new-tokens", type=positive_int, default=128, help="new tokens per prompt at most")
    g.add_argument("--draft-stop-prob", default=None, metavar="P",
                   help="adaptive draft length: a row stops drafting its block once the draft's top probability at "
                        "the next position is below P (or path:P, once the drafted path's probability is below P); "
                        "at most -k drafts; SpS stays lossless")
    g.add_argument("--tree", type=positive_int, default=None, metavar="NODES",
                   help="tree decoding with EAGLE-2's dynamic tree: grow --tree-depth levels (the --tree-topk most "
                        "probable paths of each level get --tree-topk candidates each), keep the NODES nodes of "
                        "highest path probability, verify them in one verifier forward (-k unused; deterministic "
                        "top-k candidates, lossless with SpS)")
    g.add_argument("--tree-depth", type=positive_int, default=None, metavar="D",
                   help=f"levels of the --tree NODES tree (default {BUDGET_DEPTH})")
    g.add_argument("--tree-topk", type=positive_int, default=None, metavar="K",
                   help=f"candidates per grown node, and nodes grown per level, of the --tree NODES tree "
                        f"(default {BUDGET_TOPK})")
    g.add_argument("--tree-branching", default=None, metavar="B1,B2,...",
                   help="tree decoding: draft a static tree whose nodes at depth d have B_d children (e.g. 2,2: "
                        "6 nodes) and verify it in one verifier forward (-k unused)")
    g.add_argument("--tree-dynamic", default=None, metavar="DEPTH,WIDTH,CHILDREN",
                   help="tree decoding with a dynamic tree: the root gets CHILDREN candidates, then at each of "
                        "DEPTH - 1 levels the WIDTH most probable paths get CHILDREN each (e.g. 4,4,2)")
    g.add_argument("--tree-scheme", default=None,
                   help="how a tree node's children are drawn: iid, without_replacement, deterministic (top-k) or "
                        "eagle (default: deterministic with --tree, else iid; the first three keep SpS lossless; "
                        "--tree takes deterministic or eagle only)")
    g.add_argument("--tree-mode", default="rounds", help="rounds or joint (a lossy rule over a node's children)")
    g.add_argument("--batch-size", type=positive_int, default=8, help="prompts decoded together")
    g.add_argument("--seed", type=int, default=0, help="seed of every draw (batch i uses seed + i)")
    add_sampling_arguments(parser)
    g = parser.add_argument_group("models")
    g.add_argument("--draft", default="embedded",
                   help="'embedded' (the project's draft built for --verifier by build-draft), 'smollm2', a .gguf file, "
                        "a folder or a hub id")
    g.add_argument("--verifier", default="smollm2", help="'smollm2', a .gguf file, a folder or a hub id")
    g.add_argument("--draft-path", default=None,
                   help="with --draft embedded: this draft file (built for --verifier) instead of the cached build")
    g.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads (1 is faster on a busy machine; default: torch's)")
    g.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="weights and compute of the models (bfloat16: fast on CPUs with AMX and on GPUs)")
    g.add_argument("--no-lean", action="store_true",
                   help="opt out of the lean CPU step (default: linear maps prepacked once, the draft in --dtype)")
    g = parser.add_argument_group("output")
    g.add_argument("--baseline", action="store_true", help="also run the verifier alone: its texts and the speedup")
    g.add_argument("--rounds", type=positive_int, default=None, metavar="R",
                   help="with --baseline: time both in R interleaved rounds (a random order per round, lm.rounds, as "
                        "benchmarks/bench_lm.py does) and report the speedup within rounds with its 95%% interval "
                        "over rounds (R >= 2 for an interval); default one round")
    g.add_argument("--no-warmup", action="store_true", help="time the first runs cold (not recommended)")
    g.add_argument("--json", help="also write the statistics and texts to this JSON file (atomically)")
    g.add_argument("--verbose", action="store_true",
                   help="keep transformers' warnings and model-loading progress bars")


def _prompts(args) -> list[str]:
    prompts = read_prompts(args)
    if not prompts:
        raise ValueError("give at least one --prompt or a --prompts-file")
    if any(not p.strip() for p in prompts):
        raise ValueError("--prompt must not be empty")
    return prompts


def check(args: argparse.Namespace) -> None:
    """Every check that needs no model (``ValueError`` naming the flag), the model arguments' files (a
    GGUF file's magic, a folder's config.json) and, for ``--draft embedded``, that the draft is built (or
    that ``--draft-path`` is a draft file); stores the rule and prompts."""
    from ..core.registry import rule_from_args

    args.rule_obj = rule_from_args(args)
    args.prompts = _prompts(args)
    check_model(args.verifier, "--verifier")
    check_model(args.draft, "--draft")
    args.tree = _check_tree_args(args)
    args.draft_stop = _check_draft_stop(args)
    if args.json:
        check_writable_file(args.json, "--json")
    if getattr(args, "rounds", None) is not None and not args.baseline:
        raise ValueError(f"--rounds {args.rounds} times the decode against the verifier alone: give --baseline too")
    if args.draft_path is not None:
        if args.draft != "embedded":
            raise ValueError(f"--draft-path goes with --draft embedded, got --draft {args.draft!r}")
        check_draft_file(args.draft_path, "--draft-path")
    elif args.draft == "embedded":  # not built yet: say so now, not after the verifier loads
        check_draft_built(args.verifier)


def _check_draft_stop(args: argparse.Namespace) -> DraftStop | None:
    """``--draft-stop-prob`` as a ``DraftStop`` (or None); refused with a tree (chains only)."""
    text = getattr(args, "draft_stop_prob", None)
    if text is None:
        return None
    try:
        stop = DraftStop.parse(text)
    except ValueError as e:
        raise ValueError(f"--draft-stop-prob must be P or path:P with P in (0, 1), got {text!r} ({e})") from None
    if args.tree is not None:
        raise ValueError("--draft-stop-prob applies to chains (-k drafts), not to tree decoding: drop --tree / "
                         "--tree-branching / --tree-dynamic or --draft-stop-prob")
    return stop


def _check_tree_args(args: argparse.Namespace) -> tuple[int, ...] | None:
    """``("budget", (nodes, depth, topk))`` from ``--tree`` (with ``--tree-depth`` / ``--tree-topk``),
    ``("branching", (b1, b2, ...))`` from ``--tree-branching``, ``("dynamic", (depth, width, children))``
    from ``--tree-dynamic``, or None; with the scheme, mode, rule and draft checked; no torch (argument
    errors answer before anything loads)."""
    if isinstance(getattr(args, "tree", None), tuple):  # checked already: ``check`` stores its result in args.tree
        return args.tree
    branching, dynamic = getattr(args, "tree_branching", None), getattr(args, "tree_dynamic", None)
    budget = getattr(args, "tree", None)
    given = [f for f, v in (("--tree", budget), ("--tree-branching", branching), ("--tree-dynamic", dynamic))
             if v is not None]
    for flag in ("tree_depth", "tree_topk"):
        if getattr(args, flag, None) is not None and budget is None:
            raise ValueError(f"--{flag.replace('_', '-')} {getattr(args, flag)} shapes the --tree NODES tree: give "
                             f"--tree NODES too")
    if args.tree_scheme is None:
        args.tree_scheme = "deterministic" if budget is not None else "iid"
    if not given:
        if args.tree_scheme != "iid" or args.tree_mode != "rounds":
            raise ValueError(f"--tree-scheme / --tree-mode apply to tree decoding: give --tree, --tree-branching or "
                             f"--tree-dynamic (got --tree-scheme {args.tree_scheme}, --tree-mode {args.tree_mode})")
        return None
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)}: give one tree, not several")
    if budget is not None:
        depth = args.tree_depth if args.tree_depth is not None else BUDGET_DEPTH
        topk = args.tree_topk if args.tree_topk is not None else BUDGET_TOPK
        kind, nums, shape = "budget", (budget, depth, topk), f"--tree {budget} --tree-depth {depth} --tree-topk {topk}"
    else:
        flag, text = ("--tree-branching", branching) if branching is not None else ("--tree-dynamic", dynamic)
        kind, shape = ("branching" if flag == "--tree-branching" else "dynamic"), f"{flag} {text}"
        try:
            nums = tuple(int(x) for x in text.split(","))
        except ValueError:
            nums = ()
        if not nums or min(nums) < 1 or (kind == "dynamic" and len(nums) != 3):
            raise ValueError(f"{flag} must be {'comma-separated integers' if kind == 'branching' else 'three integers DEPTH,WIDTH,CHILDREN'} "
                             f">= 1 (e.g. {'2,2' if kind == 'branching' else '4,4,2'}), got {text!r}")
    tree = flag_tree(kind, nums, shape)  # counted arithmetically, held to the caps, then built (torch-free)
    if tree.reranks and args.tree_scheme not in RERANK_SCHEMES:
        raise ValueError(f"--tree-scheme {args.tree_scheme} with --tree NODES: re-ranking random candidates by "
                         "their own probability breaks losslessness; use deterministic (or eagle), or "
                         "--tree-dynamic for random draws")
    _check_tree_rule(args)
    return kind, nums


def _check_tree_rule(args: argparse.Namespace) -> None:
    from ..core.rules import ScalingRule

    if args.tree_scheme not in SCHEMES:
        raise ValueError(f"--tree-scheme must be one of {', '.join(SCHEMES)}, got {args.tree_scheme!r}")
    if args.tree_mode not in MODES:
        raise ValueError(f"--tree-mode must be one of {', '.join(MODES)}, got {args.tree_mode!r}")
    two_block = isinstance(args.rule_obj, ScalingRule) or getattr(args.rule_obj, "two_block_steps", False)
    if args.tree_mode == "joint" and not two_block:
        raise ValueError(f"--tree-mode joint needs a two-block rule (sps, cactus, sequence_budget), got --rule {args.rule}")
    if args.rule_obj.stateful and args.tree_scheme == "eagle":
        raise ValueError(f"--rule {args.rule} with --tree-scheme eagle: eagle is not lossless at delta = 0, so no budget "
                         "can be kept with it; use deterministic")
    if args.rule_obj.reads_head:
        raise ValueError(f"--rule {args.rule}: a rule that reads the verifier's LM head is not supported on trees")


def _load(args):
    import torch

    from ..lm.pair import ModelPair, load_model, load_pair

    dtype = getattr(torch, args.dtype)
    try:
        if args.draft == args.verifier:  # self-drafting: one model, loaded once
            model, tok = load_model(args.verifier, dtype)
            return ModelPair(model, model, tok, name=f"{args.verifier} (self-draft)", lean=not args.no_lean)
        return load_pair(args.draft, args.verifier, dtype=dtype, draft_path=args.draft_path, lean=not args.no_lean)
    except OSError as e:  # transformers: not a local folder and not reachable as a hub id
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"could not load --verifier {args.verifier!r} / --draft {args.draft!r}: {first}") from None


def _merge(parts: list):
    """One ``DecodeStats`` from per-batch ones: counters (numbers) add up; labels are kept."""
    first = parts[0]
    kw = {}
    for f in dataclasses.fields(first):
        vals = [getattr(s, f.name) for s in parts]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)
        kw[f.name] = sum(vals) if numeric and f.name != "k" else vals[0]
    return dataclasses.replace(first, **kw)


def _decode(fn, batches: list[list[str]], label: str, seed: int, **kw):
    """``fn`` over the batches (seed + i for batch i), with a progress bar over prompts when
    there is more than one batch; returns (texts, merged stats)."""
    from tqdm.auto import tqdm

    texts, stats, kls = [], [], []
    total = sum(len(b) for b in batches)
    with tqdm(total=total, desc=label, unit="prompt", disable=len(batches) < 2, leave=False, file=sys.stderr) as bar:
        for i, b in enumerate(batches):
            res = fn(prompts=b, seed=seed + i, **kw)
            texts += res.texts or [None] * len(b)
            stats.append(res.stats)
            kls += [c.kl_sum for c in res.per_sequence]
            bar.update(len(b))
    return texts, _merge(stats), kls


def _stats_lines(label: str, s, rule=None, kls=()) -> list[str]:
    lines = [f"[{label}] {s.sequences} sequences, {s.new_tokens} new tokens, {s.tokens_per_s:.2f} tokens/s "
             f"(decode time), {s.verifier_calls} verifier forwards"]
    if rule is not None and rule.stateful and kls:  # SequenceBudget: the certificate's realised sums
        lines.append(f"[{label}] sequence budget {rule.budget:g} nats per answer: realised KL per answer (sum of the "
                     f"exact step KLs charged) max {max(kls):.4f}, mean {sum(kls) / len(kls):.4f}; certificate: "
                     f"KL(answer's law || verifier's) <= {rule.budget:g} for every prompt")
    if s.method == "tree" and not (rule is not None and rule.stateful):
        lines.append(f"[{label}] AL {s.al:.3f} tokens per verifier call (bonus included), accepted per step "
                     f"{s.accepted_per_step:.3f} of a {s.k}-node tree (step KL not computed for trees)")
    if s.method == "speculative":
        kl = (f"{s.mean_step_kl:.4f} nats" if s.kl_count else
              f"not computed (skipped at {s.kl_skipped} positions: the rule reads the verifier's head, as "
              "DropMatch does, see cactus_theory.dropmatch.step_law, or its support is too large)")
        lines.append(f"[{label}] AL {s.al:.3f} tokens per verifier call (bonus included), per-token acceptance "
                     f"{s.acceptance_rate:.3f}, mean exact step KL(h_alg || q) {kl}")
    lines.append(f"[{label}] verifier NLL of the text {s.nll:.4f} nats/token")
    return lines


def run(args: argparse.Namespace) -> int:
    if not hasattr(args, "rule_obj"):
        check(args)
    import torch

    from ..core.registry import label
    from ..lm.loop import autoregressive_generate, speculative_generate, tree_generate
    from ..lm.rounds import interleaved_rounds, pooled_stats, ratio_over_rounds
    from ..util.atomic import atomic_write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    rule, prompts, k = args.rule_obj, args.prompts, args.num_drafts
    print(f"loading verifier {args.verifier!r} and draft {args.draft!r} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with quiet_transformers(args.verbose):
        pair = _load(args)
        from ..lm.loop import runtime_models

        runtime_models(pair)  # the lean step (or its reason not to), once, before any timed decode
    print(f"loaded {pair.name} in {time.perf_counter() - t0:.1f} s; "
          f"{getattr(pair, 'lean_state', 'not lean (--no-lean)')}", file=sys.stderr, flush=True)

    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, chat=not args.no_chat)
    spec_kw = dict(pair=pair, rule=rule, k=k, draft_stop=getattr(args, "draft_stop", None), **sampling)
    base_kw = dict(pair=pair, **sampling)
    bs = args.batch_size
    batches = [prompts[i:i + bs] for i in range(0, len(prompts), bs)]
    runs = [("speculative", speculative_generate, spec_kw)]
    if args.tree is not None:
        kind, nums = args.tree
        tree = flag_tree(kind, nums, "--tree")  # checked in ``check``
        runs = [("speculative", tree_generate, dict(pair=pair, rule=rule, tree=tree, scheme=args.tree_scheme,
                                                    mode=args.tree_mode, **sampling))]
        size, grown = tree.nodes, tree.grown
        shape = (f"EAGLE-2 budget tree ({size} nodes of {grown} grown, depth {nums[1]}, top-{nums[2]}"
                 if kind == "budget" else f"{kind} tree {','.join(map(str, nums))} ({size} nodes")
        k = f"{shape}, {args.tree_scheme}, {args.tree_mode})"
    elif spec_kw["draft_stop"] is not None:
        k = f"{k} (adaptive, {spec_kw['draft_stop'].label()})"
    if args.baseline:
        runs.append(("verifier alone", autoregressive_generate, base_kw))
    with quiet_transformers(args.verbose):
        if not args.no_warmup:  # one-time costs of each run paid here, outside the timings
            print("warming up ...", file=sys.stderr, flush=True)
            for _, fn, kw in runs:
                fn(prompts=batches[0], max_new_tokens=min(WARMUP_TOKENS, args.max_new_tokens),
                   batch_size=bs, seed=args.seed, **kw)
        jobs = {name: (lambda fn=fn, kw=kw, name=name: _decode(fn, batches, name, args.seed, batch_size=bs,
                                                                max_new_tokens=args.max_new_tokens, **kw))
                for name, fn, kw in runs}
        rounds = getattr(args, "rounds", None) or 1
        by_round, _ = interleaved_rounds(jobs, rounds, seed=args.seed)
    # every round decodes with the same seeds: texts and counters of the first, timings pooled over rounds
    results = {name: (r[0][0], pooled_stats([x[1] for x in r]), r[0][2]) for name, r in by_round.items()}
    spec_texts, spec, spec_kls = results["speculative"]
    base_texts, base, _ = results.get("verifier alone", (None, None, None))
    for i, prompt in enumerate(prompts):
        print(f"--- [{i}] {prompt[:60]!r}")
        print(f"speculative ({label(rule)}, k={k}):\n{spec_texts[i]}\n")  # k: drafts, or the tree
        if base_texts is not None:
            print(f"verifier alone:\n{base_texts[i]}\n")
    for line in _stats_lines(f"{label(rule)}, k={k}", spec, rule, spec_kls):
        print(line)
    out = {"pair": pair.name, "rule": repr(rule), "k": k, "sampling": sampling, "speculative": spec.as_dict(),
           "texts": spec_texts}
    if rule.stateful:
        out["kl_per_answer"] = spec_kls
    if base is not None:
        for line in _stats_lines("verifier alone", base):
            print(line)
        ratio = ratio_over_rounds([x[1].tokens_per_s for x in by_round["speculative"]],
                                  [x[1].tokens_per_s for x in by_round["verifier alone"]])
        speedup = ratio["ratio"]
        over = (f"{rounds} interleaved rounds: geometric mean {speedup:.2f}x, 95% interval [{ratio['ci'][0]:.2f}, "
                f"{ratio['ci'][1]:.2f}], rounds {', '.join(f'{x:.2f}' for x in ratio['rounds'])}" if rounds > 1
                else "one round; --rounds R for an interval")
        print(f"speedup over the verifier alone: {speedup:.2f}x (same prompts, sampling and batch size; {over}; "
              f"warmed up{'' if not args.no_warmup else ': NO, --no-warmup'})")
        timed = min(spec.new_tokens, base.new_tokens)
        if timed < MIN_TIMED_TOKENS:
            print(f"warning: this speedup rests on {timed} generated tokens (< {MIN_TIMED_TOKENS}): CPU timings this "
                  "short are mostly noise; use more prompts or a larger --max-new-tokens", file=sys.stderr)
        out.update(autoregressive=base.as_dict(), baseline_texts=base_texts, speedup=speedup,
                   speedup_ci=ratio["ci"], speedup_rounds=ratio["rounds"], rounds=rounds)
    if args.json:
        atomic_write_json(args.json, out)
    return 0
