"""llama.cpp beside our loop on one model, precision and thread count (issue 40 item 4).

In one run of interleaved rounds (``lm.rounds.interleaved_rounds``: every job once per round, in an order drawn
afresh each round from ``--seed``), on the same prompts (``lm.data.prompt_set``, chat template, encoded once by the
project and handed to both as token ids), ``--max-new-tokens`` each, the paper's sampling, batch 1, ``--threads``
threads on both sides:

  ``llama.cpp plain``      llama-cpp-python's ``Llama.generate`` on the embedded SmolLM2 GGUF converted to ``--dtype``
                           by llama.cpp's own quantizer (``integrations.llamacpp.converted_gguf``), one decode per
                           prompt, its KV cache cleared before each prompt (prompt processing timed, as on our side)
  ``verifier alone``       ``lm.loop.autoregressive_generate`` on the same file loaded by the project (dequantized, in
                           ``--dtype``, the lean CPU step)
  ``SpS`` / ``Cactus``     ``lm.loop.speculative_generate`` (chain ``k``, the embedded draft), rule SpS and Cactus delta=1
  with ``--lookup``        also llama.cpp's own speculation (prompt lookup, ``k`` tokens: ``check-engine --engine llamacpp``'s
                           side a)
  with ``--prototype``     also the project's rules over llama.cpp's forwards (``integrations.llamacpp.rule_generate``:
                           prompt-lookup drafts as one-hot laws, the verifier's ``k + 1`` logits rows from one llama.cpp
                           batch, ``core.sampler.verify``): SpS, Cactus delta=1, and their reference ``plain_generate``
                           (our sampling over llama.cpp's one-position forwards)

Each job's speed is its generated tokens over the wall time of its call (prompt processing included; our metrics
excluded: ``track_kl`` off). Ratios are taken within a round and summarised over rounds (``lm.rounds.ratio_over_rounds``:
geometric mean, 95% t-interval of the log ratio): every job against llama.cpp plain and against our verifier alone.
The issue's goals, met only when the interval clears them: our verifier alone within 1.5x of llama.cpp plain (llama.cpp
plain / verifier alone <= 1.5) and our Cactus faster than llama.cpp plain (Cactus / llama.cpp plain > 1).

**Gates** (as ``bench_lm``: the result is written only when every gate passes, else the run prints its table and the
failed gates and exits 1; ``--no-gates`` writes it with the gates recorded off): (a) at least two rounds (an interval
over rounds needs two); (b) each baseline's per-round tokens/s (llama.cpp plain and our verifier alone), max / min, at
most ``--drift-bound`` (``experiment.DRIFT_BOUND``); (c) no speculative row's verifier forward over ``k + 1`` positions
measured faster than the verifier alone's one-position forward (``DecodeStats`` ``verifier_seconds / verifier_calls``);
(d) every job emitted the same tokens in every round (the rounds time the same work).

The CPU is named (``lm.roofline.cpu_model``) with llama.cpp's system info (the ISA it was built for). Needs
llama-cpp-python: ``make llamacpp-env``, then::

    build/venv-llamacpp/bin/python benchmarks/bench_llamacpp.py --threads 1 --dtype bfloat16 --rounds 5 \\
        --out benchmarks/results/lm/llamacpp_bf16.json
    build/venv-llamacpp/bin/python benchmarks/bench_llamacpp.py --quick --no-gates --out /tmp/llamacpp_quick.json

``--quick``: a smoke test (1 prompt per style, 8 new tokens, 1 round), not a measurement. Bad flags are argparse
errors (exit 2, one line) before anything loads; so is a Python without llama-cpp-python.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

__all__ = ["main", "build_parser", "GOALS"]

GOALS = (("llama.cpp plain / verifier alone", 1.5, "<="), ("Cactus delta=1 / llama.cpp plain", 1.0, ">"))
ROUNDS = 5


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    from cactus_theory.lm.data import MATH_PROMPTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                    help="the precision of both sides (llama.cpp: the GGUF converted to it; ours: the weights and compute)")
    ap.add_argument("--threads", type=_positive, default=1, help="threads on both sides (torch; llama.cpp's n_threads)")
    ap.add_argument("--per-style", type=_positive, default=8, help=f"prompts per style (math, code, prose; 1 to "
                                                                   f"{len(MATH_PROMPTS)})")
    ap.add_argument("--max-new-tokens", type=_positive, default=64)
    ap.add_argument("-k", type=_positive, default=4, help="drafted tokens per step (ours and llama.cpp's lookup)")
    ap.add_argument("--rounds", type=_positive, default=None, help=f"interleaved rounds (default {ROUNDS}; 1 with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lookup", action="store_true", help="also time llama.cpp's own prompt-lookup speculation")
    ap.add_argument("--prototype", action="store_true",
                    help="also time the project's rules over llama.cpp's forwards (integrations.llamacpp.rule_generate)")
    ap.add_argument("--drift-bound", type=float, default=None, help="gate: max / min of a baseline's per-round tokens/s")
    ap.add_argument("--no-gates", action="store_true", help="write the result even when a gate fails (recorded)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 prompt per style, 8 new tokens, 1 round")
    ap.add_argument("--out", default="bench_llamacpp.json")
    return ap


def parse(argv=None) -> argparse.Namespace:
    """The checked arguments (argparse errors, exit 2, before anything loads)."""
    from cactus_theory.integrations.engines import engine_problem
    from cactus_theory.lm.data import MATH_PROMPTS

    ap = build_parser()
    args = ap.parse_args(argv)
    given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])}
    if args.quick:
        args.per_style = 1 if "--per-style" not in given else args.per_style
        args.max_new_tokens = 8 if "--max-new-tokens" not in given else args.max_new_tokens
    if args.rounds is None:
        args.rounds = 1 if args.quick else ROUNDS
    if args.per_style > len(MATH_PROMPTS):
        ap.error(f"--per-style must be 1 to {len(MATH_PROMPTS)}, got {args.per_style}")
    if args.seed < 0:
        ap.error(f"--seed must be >= 0, got {args.seed}")
    if args.drift_bound is not None and not (math.isfinite(args.drift_bound) and args.drift_bound >= 1):
        ap.error(f"--drift-bound must be a finite number >= 1, got {args.drift_bound}")
    problem = engine_problem("llamacpp")
    if problem:
        ap.error(problem.replace("--engine llamacpp", "bench_llamacpp.py"))
    return args


def _llamacpp_job(path, ids, args, speculative: bool):
    """A call decoding every prompt once with llama.cpp (plain, or its prompt lookup), its cache cleared before each
    prompt; returns (token lists, seconds)."""
    from cactus_theory.core.sampling import SAMPLING
    from cactus_theory.integrations.llamacpp import LlamaCppEngine

    eng = LlamaCppEngine(path, args.k, args.max_new_tokens, SAMPLING.temperature, SAMPLING.top_k, SAMPLING.top_p,
                         args.threads)
    side = "lookup" if speculative else "plain"
    llm = eng._open(side, max(len(p) for p in ids) + args.max_new_tokens + args.k + 8)

    def call():
        out = []
        t0 = time.perf_counter()
        for i, p in enumerate(ids):
            llm.reset()  # no prefix reuse across prompts: the prompt is processed, as on our side
            out.append(eng.decode(llm, p, args.seed * len(ids) + i))
        return out, time.perf_counter() - t0
    return call, eng


def _ours_job(pair, ids, args, rule):
    from cactus_theory.core.sampling import SAMPLING
    from cactus_theory.lm.loop import autoregressive_generate, speculative_generate

    kw = dict(max_new_tokens=args.max_new_tokens, batch_size=1, seed=args.seed, **SAMPLING.as_dict())

    def call():
        if rule is None:
            res = autoregressive_generate(pair, ids, **kw)
        else:
            res = speculative_generate(pair, ids, rule, k=args.k, track_kl=False, **kw)
        return res.tokens, res.stats.seconds, res.stats
    return call


def _prototype_job(path, ids, args, rule, eos):
    import torch

    from cactus_theory.core.sampling import SAMPLING
    from cactus_theory.integrations.llamacpp import (
        LlamaForward,
        LookupDraft,
        plain_generate,
        rule_generate,
    )

    fwd = LlamaForward(path, max(len(p) for p in ids) + args.max_new_tokens + args.k + 8, args.threads)
    sampling = SAMPLING.as_tuple()

    def call():
        out = []
        t0 = time.perf_counter()
        for i, p in enumerate(ids):
            fwd.llm.reset()
            g = torch.Generator().manual_seed(args.seed * len(ids) + i)
            if rule is None:
                out.append(plain_generate(fwd, p, args.max_new_tokens, sampling, g, eos))
            else:
                out.append(rule_generate(fwd, LookupDraft(), p, rule, args.k, args.max_new_tokens, sampling, g, eos))
        return out, time.perf_counter() - t0
    return call


def gates(res: dict, drift_bound: float) -> list[str]:
    """Why the run's timings are not to be trusted (module docstring, gates a-d); empty when every gate passes."""
    from cactus_theory.lm.rounds import drift

    failed = []
    if res["settings"]["rounds"] < 2:
        failed.append(f"{res['settings']['rounds']} round: an interval over rounds needs at least two")
    for name in ("llama.cpp plain", "verifier alone"):
        rates = res["jobs"][name]["tokens_per_s_rounds"]
        d = drift(rates)
        if len(rates) > 1 and not (math.isfinite(d) and d <= drift_bound):
            failed.append(f"baseline drift: {name} ran at {', '.join(f'{x:.2f}' for x in rates)} tokens/s over the "
                          f"rounds, max / min {d:.3f} > {drift_bound:g}")
    one = res["jobs"]["verifier alone"].get("verifier_ms")
    for name, job in res["jobs"].items():
        w = job.get("verifier_ms")
        if name != "verifier alone" and w is not None and one is not None and w < one:
            failed.append(f"W = {res['settings']['k'] + 1} forward faster than W = 1: {name}'s verifier forward "
                          f"{w:.2f} ms < the verifier alone's {one:.2f} ms")
        if not job["same_decodes"]:
            failed.append(f"{name} emitted different tokens in different rounds: the rounds did not time the same work")
    return failed


def main(argv=None) -> int:
    args = parse(argv)
    import llama_cpp
    import torch

    from cactus_theory.lm.experiments.experiment import DRIFT_BOUND

    if args.drift_bound is None:
        args.drift_bound = DRIFT_BOUND
    from cactus_theory.integrations.llamacpp import converted_gguf, gguf_path
    from cactus_theory.lm.data import encode_prompts, prompt_set
    from cactus_theory.lm.pair import load_pair
    from cactus_theory.lm.roofline import cpu_model
    from cactus_theory.lm.rounds import interleaved_rounds, ratio_over_rounds
    from cactus_theory.rules import Cactus, SpS
    from cactus_theory.util.atomic import atomic_write_json

    torch.set_num_threads(args.threads)
    t0 = time.time()
    path = converted_gguf(gguf_path("smollm2"), args.dtype)
    pair = load_pair(dtype=getattr(torch, args.dtype))
    ids = encode_prompts(pair.tokenizer, prompt_set(args.per_style), chat=True)
    eos = pair.eos_token_id
    jobs, engines = {}, []
    for name, speculative in (("llama.cpp plain", False), (f"llama.cpp lookup k={args.k}", True)):
        if speculative and not args.lookup:
            continue
        jobs[name], eng = _llamacpp_job(path, ids, args, speculative)
        engines.append(eng)
    jobs["verifier alone"] = _ours_job(pair, ids, args, None)
    jobs[f"SpS k={args.k}"] = _ours_job(pair, ids, args, SpS())
    jobs[f"Cactus delta=1 k={args.k}"] = _ours_job(pair, ids, args, Cactus(1.0))
    if args.prototype:
        stop = (lambda t: t == eos) if eos is not None else None
        jobs["prototype: our sampling over llama.cpp"] = _prototype_job(path, ids, args, None, stop)
        jobs[f"prototype: SpS over llama.cpp lookup k={args.k}"] = _prototype_job(path, ids, args, SpS(), stop)
        jobs[f"prototype: Cactus delta=1 over llama.cpp lookup k={args.k}"] = _prototype_job(path, ids, args,
                                                                                          Cactus(1.0), stop)
    for call in jobs.values():  # warm-up: one-off allocations, the lean step's packing, llama.cpp's first batch
        call()
    print(f"loaded and warmed in {time.time() - t0:.1f} s; {cpu_model()}; {args.threads} thread(s), {args.dtype}; "
          f"{len(ids)} prompts x {args.max_new_tokens} new tokens; {args.rounds} round(s)", flush=True)
    results, orders = interleaved_rounds(jobs, args.rounds, seed=args.seed,
                                         on_done=lambda r, n, _: print(f"  round {r + 1}: {n}", flush=True))
    out = {"settings": {"dtype": args.dtype, "threads": args.threads, "prompts": len(ids), "k": args.k,
                        "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "seed": args.seed,
                        "cpu": cpu_model(), "llama_cpp": llama_cpp.__version__,
                        "llama_cpp_system": llama_cpp.llama_print_system_info().decode().strip(),
                        "gguf": path, "timing": "generated tokens / wall time of the job's call (prompt processing "
                                                "included; our step KL off)"},
           "orders": orders, "jobs": {}}
    for name, rounds in results.items():
        toks = [r[0] for r in rounds]
        tps = [sum(len(t) for t in r[0]) / r[1] for r in rounds]
        job = {"tokens_per_s_rounds": tps, "tokens": sum(len(t) for t in toks[0]),
               "same_decodes": all(t == toks[0] for t in toks[1:])}
        if len(rounds[0]) > 2:  # ours: DecodeStats
            st = rounds[0][2]
            job.update(al=st.al, verifier_ms=1000 * sum(r[2].verifier_seconds for r in rounds)
                       / max(1, sum(r[2].verifier_calls for r in rounds)))
        out["jobs"][name] = job
    base = {b: out["jobs"][b]["tokens_per_s_rounds"] for b in ("llama.cpp plain", "verifier alone")}
    for job in out["jobs"].values():
        job["vs_llamacpp_plain"] = ratio_over_rounds(job["tokens_per_s_rounds"], base["llama.cpp plain"])
        job["vs_verifier_alone"] = ratio_over_rounds(job["tokens_per_s_rounds"], base["verifier alone"])
    goals = []
    for what, bound, op in GOALS:
        num, den = what.split(" / ")
        num = next(n for n in out["jobs"] if n.startswith(num))
        r = ratio_over_rounds(out["jobs"][num]["tokens_per_s_rounds"], out["jobs"][den]["tokens_per_s_rounds"])
        hi, lo = r["ci"][1], r["ci"][0]
        met = (hi <= bound) if op == "<=" else (lo > bound)
        goals.append({"what": what, "ratio": r["ratio"], "ci": r["ci"], "goal": f"{op} {bound:g}", "met": bool(met)})
    out["goals"] = goals
    failed = gates(out, args.drift_bound)
    out["gates"] = {"on": not args.no_gates, "drift_bound": args.drift_bound, "failed": failed}
    print(f"{'job':58} {'tok/s':>8} {'vs llama.cpp':>22} {'vs verifier alone':>22}")
    for name, job in out["jobs"].items():
        tps = sum(job["tokens_per_s_rounds"]) / len(job["tokens_per_s_rounds"])
        cells = []
        for key in ("vs_llamacpp_plain", "vs_verifier_alone"):
            r = job[key]
            ci = "" if not all(map(math.isfinite, r["ci"])) else f" [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]"
            cells.append(f"{r['ratio']:.2f}x{ci}")
        print(f"{name:58} {tps:8.1f} {cells[0]:>22} {cells[1]:>22}")
    for g in goals:
        print(f"goal {g['what']} {g['goal']}: {g['ratio']:.2f} {g['ci']} {'met' if g['met'] else 'MISSED'}")
    for why in failed:
        print(f"gate failed: {why}", file=sys.stderr)
    for e in engines:
        e.close()
    if failed and not args.no_gates:
        print(f"not written: {len(failed)} gate(s) failed (or --no-gates to write it with the gates recorded off)",
              file=sys.stderr)
        return 1
    atomic_write_json(args.out, out)
    print(f"wrote {args.out}" + (f" (gates OFF, {len(failed)} failed)" if args.no_gates else " (every gate passed)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
