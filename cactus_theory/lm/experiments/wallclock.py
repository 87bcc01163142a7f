"""The eval's wall clock (eval_v3 ``analysis.wall_clock``): an interleaved benchmark on the eval's own questions.

The eval's batches are decoded beside other work and in batches of 32, so their seconds say little about what a
user waits for one answer. The protocol reads its wall-clock claim ("Cactus delta = 1 answers faster than the
verifier alone") from this benchmark instead, run on a quiet machine:

* rows: the first ``QUESTIONS`` questions of each of the protocol's tasks, replicate 0, with the eval's own row
  seeds (``replicated.row_seed``), so every round decodes the very rows the eval decoded first;
* one row at a time (batch size 1), one torch thread, the protocol's dtype and lean step, no step-KL tracking;
* jobs: every primary method (the verifier alone included) decodes all those rows once per round; the jobs of a
  round run in an order drawn afresh each round (``numpy.random.default_rng(seed)``, one permutation per round,
  the scheme of ``lm.rounds.interleaved_rounds``), at least ``ROUNDS`` rounds;
* per round r and method m: time per problem ``T_VA,r / T_m,r`` (total seconds of the verifier alone over the
  method's, both over the same rows; > 1: the method answers faster) and the tokens/s ratio
  ``(N_m / T_m,r) / (N_VA / T_VA,r)`` (length accounted for); the point is the geometric mean over rounds and the
  interval the 95% Student-t interval of the log ratio over rounds (``lm.rounds.ratio_over_rounds``).

Claim (pre-registered): consistent if the time-per-problem interval of Cactus delta = 1, pooled over the tasks, lies
above 1, differs if it lies below 1, else inconclusive. The run records the CPU, the load average before every
round (a quiet machine shows under 1 on 2 cores with the benchmark's one thread) and the verifier alone's drift over
rounds (``lm.rounds.drift``; ``experiment.DRIFT_BOUND`` is the benchmark's gate). Rounds are written atomically as
they finish (``wall_clock.json`` beside eval.json): a stopped run resumes at its next round.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...util.atomic import atomic_write_json, atomic_write_text
from ...util.keyed_cache import read_json
from ..rounds import drift, ratio_over_rounds

__all__ = ["QUESTIONS", "ROUNDS", "plan_orders", "one_pass", "run_wall_clock", "analyse_wall_clock",
           "format_wall_clock", "CLAIM_METHOD"]

QUESTIONS = 24  # the first 24 questions of each task (eval_v3 analysis.wall_clock)
ROUNDS = 5  # at least 5 rounds
BATCH = 1
THREADS = 1
CLAIM_METHOD = "Cactus delta=1"
BASE = "verifier alone"


def plan_orders(labels: list[str], rounds: int, seed: int) -> list[list[str]]:
    """Round r's job order: the r-th permutation of ``default_rng(seed)`` (as ``interleaved_rounds`` draws them), so
    a resumed run keeps the orders of an uninterrupted one."""
    rng = np.random.default_rng(seed)
    return [[labels[i] for i in rng.permutation(len(labels))] for _ in range(rounds)]


def one_pass(pair, problems: dict, method, cfg, questions: int, decode) -> dict:
    """One job: ``method`` decodes rows (q, 0), q < ``questions``, of every task one at a time through ``decode`` (the
    eval's batch decode, ``replicated._decode``, passed in by the eval command); per task the wall seconds of each
    row's decode call (``time.perf_counter`` around it), the tokens each row emitted and the verifier calls (AL =
    tokens / calls)."""
    out = {}
    for t, probs in problems.items():
        secs, toks, calls = [], [], []
        for q in range(questions):
            t0 = time.perf_counter()
            got = decode(pair, probs, [(q, 0)], method, cfg, t, track_kl=False)
            secs.append(time.perf_counter() - t0)
            rec = got["records"][0]
            toks.append(len(rec["tokens"]))
            calls.append(int(rec.get("steps", 0)))
        out[t] = {"seconds": secs, "tokens": toks, "verifier_calls": calls}
    return out


def _meta(protocol, cfg, labels: list[str], seed: int) -> dict:
    from ..roofline import cpu_model

    return {"protocol_sha256": protocol.sha256, "decode": {k: v for k, v in cfg.as_dict().items()
                                                           if k in ("tasks", "seed", "k", "max_new_tokens", "sampling",
                                                                    "pair", "dtype", "lean")},
            "questions": QUESTIONS, "batch_size": BATCH, "threads": THREADS, "methods": labels, "order_seed": seed,
            "cpu": cpu_model()}


def run_wall_clock(pair, protocol, cfg, methods: list, path: Path, decode, rounds: int = ROUNDS, seed: int = 0,
                   progress: bool = True, log=print) -> dict:
    """Decode ``rounds`` interleaved rounds (``plan_orders``) of ``one_pass`` for every method in ``methods`` (the
    protocol's primary methods, the verifier alone first), appending each finished round to ``path`` (atomic); a
    record at ``path`` made under the same protocol and settings is resumed, another one refused (``ValueError``).
    ``pair``: a ModelPair or a call that loads one (loaded only if a round is left)."""
    import torch

    from . import tasks

    labels = [m.label for m in methods]
    if BASE not in labels or CLAIM_METHOD not in labels:
        raise ValueError(f"methods must include {BASE!r} and {CLAIM_METHOD!r}, got {labels}")
    path = Path(path)
    meta = _meta(protocol, cfg, labels, seed)
    rec = read_json(path)
    if rec is not None and rec.get("meta") != meta:
        raise ValueError(f"{path}: a wall-clock record made under other settings exists "
                         f"({ {k: v for k, v in rec.get('meta', {}).items() if meta.get(k) != v} }); move it away")
    rec = rec or {"meta": meta, "rounds": []}
    orders = plan_orders(labels, rounds, seed)
    if len(rec["rounds"]) >= rounds:
        return rec
    if callable(pair):
        pair = pair()
    torch.set_num_threads(THREADS)
    one = replace(cfg, batch_size=BATCH)
    problems = {t: tasks.distinct_problems(t, QUESTIONS, cfg.seed) for t in cfg.tasks}
    by_label = dict(zip(labels, methods, strict=True))
    for r in range(len(rec["rounds"]), rounds):
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        jobs = {}
        for j, label in enumerate(orders[r]):
            if progress:
                log(f"wall clock: round {r + 1}/{rounds}, job {j + 1}/{len(labels)}: {label}")
            jobs[label] = one_pass(pair, problems, by_label[label], one, QUESTIONS, decode)
        rec["rounds"].append({"order": orders[r], "load_before": load, "jobs": jobs})
        atomic_write_json(path, rec)
    return rec


def _totals(job: dict, tasks: list[str]) -> tuple[float, int]:
    return (float(sum(sum(job[t]["seconds"]) for t in tasks)), int(sum(sum(job[t]["tokens"]) for t in tasks)))


def analyse_wall_clock(rec: dict, level: float = 0.95) -> dict:
    """Per method (against the verifier alone) and per scope (each task, and ``"pooled"`` over the tasks): the time
    per problem and tokens/s ratios over rounds (``ratio_over_rounds``), tokens per problem, AL; the claim's
    verdict; the verifier alone's drift and the load averages. Needs 1 round (an interval needs 2)."""
    meta, rounds = rec["meta"], rec["rounds"]
    if not rounds:
        raise ValueError("the wall-clock record holds no finished round")
    tasks = list(meta["decode"]["tasks"])
    labels = list(meta["methods"])
    scopes = {t: [t] for t in tasks} | {"pooled": tasks}
    out = {"rounds": len(rounds), "cpu": meta["cpu"], "questions": meta["questions"], "tasks": tasks,
           "load_before": [r["load_before"] for r in rounds], "scopes": {}}
    same = True
    for label in labels:  # every round decodes the same rows with the same seeds: the same tokens
        first = rounds[0]["jobs"][label]
        same &= all(r["jobs"][label][t]["tokens"] == first[t]["tokens"] for r in rounds for t in tasks)
    out["same_decodes"] = bool(same)
    for name, ts in scopes.items():
        base = [_totals(r["jobs"][BASE], ts) for r in rounds]
        sc = {"drift_verifier_alone": drift([n / s for s, n in base]), "methods": {}}
        n_problems = len(ts) * meta["questions"]
        for label in labels:
            got = [_totals(r["jobs"][label], ts) for r in rounds]
            calls = sum(sum(rounds[0]["jobs"][label][t]["verifier_calls"]) for t in ts)
            row = {"seconds_per_problem": float(np.mean([s for s, _ in got])) / n_problems,
                   "tokens_per_problem": got[0][1] / n_problems,
                   "tokens_per_s": float(np.mean([n / s for s, n in got])),
                   "al": got[0][1] / calls if calls else float("nan")}
            if label != BASE:
                row["time_per_problem"] = ratio_over_rounds([s for s, _ in base], [s for s, _ in got], level)
                row["tokens_per_s_ratio"] = ratio_over_rounds([n / s for s, n in got], [n / s for s, n in base], level)
            sc["methods"][label] = row
        out["scopes"][name] = sc
    tp = out["scopes"]["pooled"]["methods"][CLAIM_METHOD]["time_per_problem"]
    lo, hi = tp["ci"]
    out["claim"] = {"method": CLAIM_METHOD, "ratio": tp["ratio"], "ci": tp["ci"],
                    "verdict": ("inconclusive" if not (np.isfinite(lo) and np.isfinite(hi)) else
                                "consistent" if lo > 1 else "differs" if hi < 1 else "inconclusive")}
    return out


def format_wall_clock(res: dict) -> str:
    """The wall-clock table (markdown): per scope and method, seconds and tokens per problem, tokens/s, AL and the two
    ratios with their intervals; the claim's line under it."""
    def r(v):
        lo, hi = v["ci"]
        return f"{v['ratio']:.2f}x [{lo:.2f}, {hi:.2f}]"

    lines = [f"Wall clock: {res['rounds']} interleaved rounds, {res['questions']} questions per task, batch 1, one "
             f"thread, {res['cpu']}; load average before the rounds "
             f"{', '.join(f'{x:.2f}' for x in res['load_before'])}; same decodes every round: {res['same_decodes']}.",
             "", "| scope | method | s / problem | tokens / problem | tokens/s | AL | time per problem vs verifier alone "
             "| tokens/s vs verifier alone |", "|---|---|---|---|---|---|---|---|"]
    for name, sc in res["scopes"].items():
        for label, m in sc["methods"].items():
            lines.append(f"| {name} | {label} | {m['seconds_per_problem']:.2f} | {m['tokens_per_problem']:.1f} | "
                         f"{m['tokens_per_s']:.1f} | {m['al']:.2f} | "
                         f"{r(m['time_per_problem']) if 'time_per_problem' in m else '1'} | "
                         f"{r(m['tokens_per_s_ratio']) if 'tokens_per_s_ratio' in m else '1'} |")
    c = res["claim"]
    lines += ["", f"Claim \"{c['method']} answers faster than the verifier alone\" (time per problem, pooled over the "
              f"tasks): {c['ratio']:.2f}x [{c['ci'][0]:.2f}, {c['ci'][1]:.2f}]: {c['verdict']}. The verifier alone's "
              f"drift over rounds (max / min tokens/s): "
              + ", ".join(f"{n} {sc['drift_verifier_alone']:.3f}" for n, sc in res["scopes"].items()) + "."]
    return "\n".join(lines)


def run(load, protocol, cfg, args, methods: list, decode) -> int:
    """``cactus-theory eval --wall-clock``: the benchmark of the protocol's primary ``methods`` into
    ``<out>/wall_clock.json`` and ``.md`` (``decode``: the eval's batch decode)."""
    path = Path(args.out_dir) / "wall_clock.json"
    rec = run_wall_clock(load, protocol, cfg, methods, path, decode, rounds=args.rounds, seed=cfg.seed,
                         progress=not args.no_progress)
    res = analyse_wall_clock(rec)
    text = format_wall_clock(res)
    atomic_write_json(path.with_name("wall_clock_summary.json"), res)
    atomic_write_text(path.with_suffix(".md"), text + "\n")
    print(text)
    return 0
