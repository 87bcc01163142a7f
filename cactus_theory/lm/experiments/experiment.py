"""The real-LM speed / acceptance experiment as a library function (``benchmarks/bench_lm.py`` and the
reproduction call it): each (rule, k, batch size) against the verifier decoding alone at the same
batch size, same prompts, same sampling, in one run, with bootstrap intervals over prompts.

Units: AL = tokens per verifier call, bonus included; per-token acceptance = accepted / drafted;
speedup = tokens/s of the rule / tokens/s of the verifier alone in the same round, the verifier alone
and every rule run once per round in a random order, several rounds (``lm.rounds``), after a warm-up;
its interval is a 95% t-interval over rounds of the log ratio. ``gates`` says when a run's timings are
not to be trusted (a wider forward faster than one position, baseline drift, a phase below its roofline).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from tqdm.auto import tqdm

from ...core import registry
from ...core.draft_stop import DraftStop
from ...core.rules import TAS, Cactus, Interpolation, SpS, TopK
from ...core.tree import check_mode
from ..loop import SAMPLING, autoregressive_generate, speculative_generate, tree_generate
from ..metrics import SequenceCounters, al_of
from ..rounds import LEVEL, drift, interleaved_rounds, pooled_stats, ratio_over_rounds, same_decodes

__all__ = ["DEFAULT_RULES", "SAMPLING", "ROUNDS", "DRIFT_BOUND", "THROUGHPUT_BATCHES", "run_benchmark", "gates",
           "throughput", "format_throughput", "format_table", "bootstrap", "targets", "tree_targets"]

ROUNDS = 5  # interleaved rounds of a run (``--rounds``): enough for a t-interval with 4 degrees of freedom
DEFAULT_RULES = [(registry.label(r), r) for r in (SpS(), TAS(0.09, 0.3), TopK(5), Interpolation(0.5), Cactus(0.25),
                                                  Cactus(0.5), Cactus(1.0))]


def bootstrap(per_seq: list[list], stat, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Point value and 95% percentile interval of ``stat(*runs)`` when prompts are resampled with
    replacement (the same prompts for every run: paired). ``per_seq``: one list of per-prompt
    counters per run; ``stat`` maps those lists (restricted to the resampled prompts) to a number."""
    n = len(per_seq[0])
    point = stat(*per_seq)
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(reps):
        idx = rng.integers(0, n, n)
        v = stat(*[[run[i] for i in idx] for run in per_seq])
        if math.isfinite(v):
            vals.append(v)
    if not vals:
        return point, math.nan, math.nan
    lo, hi = np.percentile(vals, [2.5, 97.5])
    return point, float(lo), float(hi)


def _al(c):
    return al_of(sum(x.accepted for x in c), sum(x.steps for x in c))


def _acc(c):
    d = sum(x.drafted for x in c)
    return sum(x.accepted for x in c) / d if d else math.nan


def _rate(c):
    s = sum(x.seconds for x in c)
    return sum(x.new_tokens for x in c) / s if s > 0 else math.nan


def _row(label, rule, k, batch, results: list, base: list) -> dict:
    """One (rule, k, batch) row from its rounds ``results`` and the verifier alone's rounds ``base`` at the same
    batch size: the counters of the first round (``rounds.same_decodes`` says whether every round decoded the
    same), the timings pooled over rounds (``rounds.pooled_stats``), the speedups within rounds
    (``rounds.ratio_over_rounds``) and bootstrap intervals over prompts of AL and acceptance."""
    first = results[0]
    s = pooled_stats([r.stats for r in results])
    row = {**s.as_dict(), "rule": label, "repr": repr(rule), "k": k, "batch_size": batch}
    row["al_ci"] = bootstrap([first.per_sequence], _al)[1:]
    row["acceptance_ci"] = bootstrap([first.per_sequence], _acc)[1:]
    tps = ratio_over_rounds([r.stats.tokens_per_s for r in results], [r.stats.tokens_per_s for r in base])
    per_prompt = ratio_over_rounds([r.stats.seconds / max(1, r.stats.sequences) for r in base],
                                   [r.stats.seconds / max(1, r.stats.sequences) for r in results])
    row.update(speedup=tps["ratio"], speedup_ci=tps["ci"], speedup_rounds=tps["rounds"],
               prompt_speedup=per_prompt["ratio"], prompt_speedup_ci=per_prompt["ci"],
               prompt_speedup_rounds=per_prompt["rounds"],
               tokens_per_s_rounds=[r.stats.tokens_per_s for r in results], same_decodes=same_decodes(results))
    row["per_sequence"] = [vars(c) for c in first.per_sequence]
    return row


def _decode_job(pair, prompts, b, k, rule, kw, tree_scheme):
    """The call that decodes one job ((batch, k or tree or (k, stop), label, rule)), and its row's k."""
    if isinstance(k, tuple) and isinstance(k[1], DraftStop):  # (k, adaptive draft length)
        return (lambda: speculative_generate(pair, prompts, rule, k=k[0], batch_size=b, draft_stop=k[1], **kw),
                f"{k[0]} {k[1].label()}")
    if isinstance(k, tuple):  # (label, tree[, scheme[, mode]])
        return (lambda: tree_generate(pair, prompts, rule, k[1], k[2] if len(k) > 2 else tree_scheme,
                                      mode=k[3] if len(k) > 3 else "rounds", batch_size=b, **kw), k[0])
    return lambda: speculative_generate(pair, prompts, rule, k=k, batch_size=b, **kw), k


def run_benchmark(pair, prompts, rules=DEFAULT_RULES, ks=(4,), batch_sizes=(1,), max_new_tokens: int = 64,
                  seed: int = 0, sampling: dict = SAMPLING, progress: bool = True, warmup: bool = True,
                  trees=(), tree_scheme: str = "iid", draft_stops=(), rounds: int = ROUNDS) -> dict:
    """Decode ``prompts`` with the verifier alone at each batch size and with every (rule, k, batch size),
    in ``rounds`` interleaved rounds (``lm.rounds.interleaved_rounds``: every job once per round, a random
    order per round drawn from ``seed``); return ``{"rows": [...], "baselines": {...}, "orders": [...]}``.
    Every round decodes the same prompts with the same ``seed``, so a job emits the same tokens in every
    round (``same_decodes`` on each row and baseline says whether it did): AL, acceptance, KL and NLL are
    the first round's. Each row has the run's ``DecodeStats`` fields (timings: the mean over rounds),
    ``speedup`` (tokens/s over the verifier alone's at its batch size, within each round: the geometric
    mean of the rounds' ratios, ``speedup_ci`` its 95% t-interval over rounds of the log ratio,
    ``speedup_rounds`` the rounds' ratios), ``prompt_speedup`` (the same for the time per prompt: the
    verifier alone's over the rule's), bootstrap intervals over prompts of AL and acceptance and the
    per-prompt counters. Each baseline has its per-round runs, ``tokens_per_s_rounds`` and ``drift``
    (max / min of those: the gate ``gates`` reads).

    ``trees``: (label, tree) pairs (``tree_generate``'s static parents, ``DynamicTree`` or
    ``BudgetTree``), or (label, tree, scheme) / (label, tree, scheme, mode) tuples; each rule also runs
    on each tree with candidates per the tuple's scheme (else ``tree_scheme``) and its mode (else
    ``"rounds"``; a ``"joint"`` tree runs the two-block rules only, SpS's joint law being its rounds law,
    and is compared with SpS on the tree of the same label without its " joint" suffix); its row's
    ``k`` is the label (``"tree 2,2"``), ``al_vs_sps`` compares with SpS on the same tree, ``al_vs_chain`` (with a paired interval)
    with the same rule's chain at the largest ``k`` of ``ks``, and ``verifier_vs_one`` is its verifier
    forward over the tree against the one-token forward of the verifier alone.

    ``draft_stops``: adaptive draft lengths (``core.draft_stop.DraftStop``); each rule also runs at each ``k``
    with each policy, in the same run as its fixed ``k``: the row's ``k`` is ``"4 top>=0.3"``, ``al_vs_sps``
    compares with SpS under the same policy and ``al_vs_chain`` (paired) with the rule's fixed chain at that ``k``."""
    kw = dict(max_new_tokens=max_new_tokens, seed=seed, **sampling)
    if warmup:  # first calls pay for allocations and one-off setup (the compact model conversion)
        autoregressive_generate(pair, prompts[:1], **{**kw, "max_new_tokens": 4})
        speculative_generate(pair, prompts[:1], rules[0][1], k=ks[0], **{**kw, "max_new_tokens": 8})
    jobs = [(b, k, label, rule) for b in batch_sizes for k in ks for label, rule in rules]
    jobs += [(b, tree, label, rule) for b in batch_sizes for tree in trees for label, rule in rules
             if _runs_on(tree, rule)]
    jobs += [(b, (k, stop), label, rule) for b in batch_sizes for k in ks for stop in draft_stops for label, rule in rules]
    calls, keys = {}, {}
    for b in batch_sizes:
        calls[f"verifier alone B={b}"] = lambda b=b: autoregressive_generate(pair, prompts, batch_size=b, **kw)
    for i, (b, k, label, rule) in enumerate(jobs):
        call, row_k = _decode_job(pair, prompts, b, k, rule, kw, tree_scheme)
        calls[f"{label} {row_k} B={b} #{i}"] = call
        keys[i] = (f"{label} {row_k} B={b} #{i}", row_k)
    bar = tqdm(total=rounds * len(calls), desc="bench_lm", disable=not progress)

    def done(r, name, res):
        bar.set_postfix(round=r + 1, job=name.split(" #")[0], al=f"{res.stats.al:.2f}")
        bar.update()

    results, orders = interleaved_rounds(calls, rounds, seed=seed, on_done=done)
    bar.close()
    rows, baselines = [], {}
    for b in batch_sizes:
        base = results[f"verifier alone B={b}"]
        rates = [r.stats.tokens_per_s for r in base]
        baselines[b] = {"runs": [r.stats.as_dict() for r in base], "tokens_per_s": pooled_stats(
                            [r.stats for r in base]).tokens_per_s, "tokens_per_s_rounds": rates, "drift": drift(rates),
                        "nll": base[0].stats.nll, "same_decodes": same_decodes(base),
                        "verifier_ms": 1000 * sum(r.stats.verifier_seconds for r in base)
                        / max(1, sum(r.stats.verifier_calls for r in base))}
    for i, (b, _, label, rule) in enumerate(jobs):
        name, row_k = keys[i]
        res = results[name]
        base = results[f"verifier alone B={b}"]
        row = _row(label, rule, row_k, b, res, base)
        row["draft_ms"] = 1000 * row["draft_seconds"] / max(1, row["draft_calls"])
        row["draft_vs_verifier"] = row["draft_ms"] / baselines[b]["verifier_ms"]
        row["verifier_ms"] = 1000 * row["verifier_seconds"] / max(1, row["verifier_calls"])
        row["verifier_vs_one"] = row["verifier_ms"] / baselines[b]["verifier_ms"]
        rows.append(row)
    for r in rows:
        same_tree = r["k"].removesuffix(" joint") if isinstance(r["k"], str) else r["k"]
        sps = next((x for x in rows if x["repr"] == repr(SpS()) and x["k"] == same_tree
                    and x["batch_size"] == r["batch_size"]), None)
        r["al_vs_sps"] = r["al"] / sps["al"] if sps else math.nan
        if sps and r is not sps:  # paired over the same prompts
            r["al_vs_sps_ci"] = _paired_al_ratio(r, sps)
        own_k = int(r["k"].split()[0]) if isinstance(r["k"], str) and r["k"].split()[0].isdigit() else max(ks)
        chain = next((x for x in rows if x["repr"] == r["repr"] and x["k"] == own_k  # adaptive: its own k
                      and x["batch_size"] == r["batch_size"]), None)
        if isinstance(r["k"], str) and chain:
            r["al_vs_chain"] = r["al"] / chain["al"]
            r["al_vs_chain_ci"] = _paired_al_ratio(r, chain)
    return {"rows": rows, "baselines": {str(b): v for b, v in baselines.items()},
            "orders": [[n.split(" #")[0] for n in o] for o in orders],
            "settings": {"max_new_tokens": max_new_tokens, "seed": seed, "prompts": len(prompts), **sampling,
                         "ks": list(ks), "batch_sizes": list(batch_sizes), "threads": torch.get_num_threads(),
                         "rounds": rounds, "statistics_from": "round 1 (every round decodes with the same seed)",
                         "speedup": "tokens/s of the rule / the verifier alone's in the same round: geometric mean "
                                    f"over rounds, {LEVEL:.0%} t-interval of the log ratio"}}


DRIFT_BOUND = 1.10


def gates(res: dict, drift_bound: float = DRIFT_BOUND) -> list[str]:
    """Why a run's timings are not to be trusted, one sentence per failed gate (empty: every gate passed).
    ``res``: ``run_benchmark``'s result, with ``res["roofline"]`` (``bench_lm``'s ``roofline_of``) when the
    run measured its roofs.

    (a) **A wider forward faster than the one-token forward**: at each batch size, a rule's verifier
        forward over W > 1 positions (a chain's k + 1, a tree's nodes + 1; the roofline's ``"verifier"``
        phase of the rule's row) measured faster than the verifier alone's W = 1 forward (its
        ``"verifier"`` phase). A forward over more positions reads the same weights and does more work,
        so this says the two were measured in different machine states (the committed lean run had
        31.1 ms at W = 5 against 31.9 ms at W = 1). On a device where W = 5 costs the same as W = 1
        (a GPU), noise alone can trip it: there the gates are to be turned off and the run says so.
    (b) **Baseline drift**: at each batch size, the verifier alone's per-round tokens/s, max / min, above
        ``drift_bound`` (a result of the former design: its runs before and after the rules). Pairing within rounds cancels a drift slower than a round, but a speed that
        moves by more than the effects being measured (speedups of 1.05x to 1.4x) during the run
        says the machine was not quiet. The default 1.10: of the 15 before / after baseline pairs in the
        committed results (benchmarks/results/lm, batch 1 to 8), 9 differ by 1.003 to 1.06 and 6 by 1.08 to
        1.25; a 10% drift is the size of the effects measured, so a run past it does not resolve them.
    (c) **A phase below its roofline**: any roofline row with measured / roofline < 1, which the
        machine cannot do if its roofs were measured right (the roofs are the best of repeated
        measurements of the same machine; ``lm.roofline``). It flags a roof measured in a slower state
        than the decodes; the one legitimate exception, a phase whose bytes stay in the cache between
        calls (``lm.roofline``'s module docstring), is also refused: such a run needs ``--no-gates``
        and says why."""
    if not (isinstance(drift_bound, (int, float)) and math.isfinite(drift_bound) and drift_bound >= 1):
        raise ValueError(f"drift_bound must be a finite number >= 1, got {drift_bound!r}")
    failed = []
    for b, base in res["baselines"].items():  # a result of the former design: its runs before and after the rules
        rates = base.get("tokens_per_s_rounds") or [r["tokens_per_s"] for r in base.get("runs", [])]
        d = drift(rates)
        if not math.isfinite(d) or d > drift_bound:
            failed.append(f"baseline drift: the verifier alone at batch {b} ran at "
                          f"{', '.join(f'{x:.2f}' for x in rates)} tokens/s over the rounds, "
                          f"max / min {d:.3f} > {drift_bound:g}")
    phases = (res.get("roofline") or {}).get("phases", [])
    one = {p["batch_size"]: p for p in phases if p["rule"] is None and p["phase"] == "verifier"}
    for p in phases:
        ref = one.get(p["batch_size"])
        if p["rule"] is not None and p["phase"] == "verifier" and ref is not None and p["ms"] < ref["ms"]:
            failed.append(f"W = {p.get('width', '>1')} forward faster than W = 1: {p['row']}'s verifier forward "
                          f"{p['ms']:.2f} ms < the verifier alone's one-token forward {ref['ms']:.2f} ms "
                          f"(batch {p['batch_size']})")
    for p in phases:
        if not p["ratio"] >= 1:
            failed.append(f"below its roofline: {p['row']} {p['phase']} measured {p['ms']:.3f} ms < roofline "
                          f"{p['roofline_ms']:.3f} ms (ratio {p['ratio']:.2f} < 1; the roof measurement is wrong)")
    return failed


THROUGHPUT_BATCHES = (1, 8, 32)  # bench_lm --throughput: the eval decodes at batch 32 (``replicated.RunConfig``)


def throughput(res: dict) -> list[dict]:
    """Batch throughput of a run (``bench_lm --throughput``), one dict per (method, batch size) for the verifier
    alone and the SpS and Cactus delta=1 chain rows: ``tokens_per_s`` (every row of the batch together: new
    tokens over the pooled decode time), ``rows`` (mean live rows per verifier call, steps / verifier calls),
    ``tokens_per_s_per_row`` (``tokens_per_s / rows``: what one sequence of the batch sees), ``speedup`` with
    ``speedup_ci`` (over the verifier alone at the same batch size, within rounds; None for the verifier alone),
    ``vs_batch1`` (``tokens_per_s`` over the verifier alone's at batch 1), ``seconds_per_1000_answers`` (1,000
    answers of the run's mean length at ``tokens_per_s``: what a batch of the eval's size costs it) and
    ``compute_roof_ratio``: the decode's time per verifier call (the prefill excluded) over the time its GEMM
    FLOPs take at the compute roof (``res["roofline"]``: the phases' FLOPs per verifier call over
    ``flop_rate``, the draft's phases over ``draft_flop_rate`` where the draft runs in another dtype); 1 at the
    roof, NaN without a roofline row."""
    roof = res.get("roofline") or {}
    rate = roof.get("flop_rate")
    draft_rate = roof.get("draft_flop_rate", rate)
    out = []
    base1 = res["baselines"].get("1", {}).get("tokens_per_s", math.nan)

    def roof_ratio(label, seconds):
        ph = [p for p in roof.get("phases", []) if p["row"] == label]
        if not ph or not rate:
            return math.nan
        flops_s = sum(p["flops"] / (draft_rate if p["phase"] in ("draft", "bookkeeping") else rate) for p in ph)
        return seconds / flops_s if flops_s > 0 else math.nan

    def entry(method, b, st, speedup=None, ci=None, label=None):
        tps = st["tokens_per_s"]
        rows = st["steps"] / max(1, st["verifier_calls"])
        per_call = (st["seconds"] - st.get("prefill_seconds", 0.0)) / max(1, st["verifier_calls"])
        return {"method": method, "batch_size": b, "tokens_per_s": tps, "rows": rows,
                "tokens_per_s_per_row": tps / rows if rows > 0 else math.nan, "speedup": speedup, "speedup_ci": ci,
                "vs_batch1": tps / base1 if base1 > 0 else math.nan,
                "seconds_per_1000_answers": 1000 * st["new_tokens"] / max(1, st["sequences"]) / tps if tps > 0
                else math.nan, "compute_roof_ratio": roof_ratio(label, per_call)}

    for b, base in res["baselines"].items():
        runs = base["runs"]
        pooled = {f: float(np.mean([r[f] for r in runs])) for f in ("seconds", "prefill_seconds")}
        st = {**runs[0], **pooled, "tokens_per_s": base["tokens_per_s"]}
        out.append(entry("verifier alone", int(b), st, label=f"verifier alone B={b}"))
        for r in res["rows"]:
            if r["batch_size"] == int(b) and isinstance(r["k"], int) and r["repr"] in (repr(SpS()), repr(Cactus(1.0))):
                out.append(entry(f"{r['rule']} k={r['k']}", int(b), r, r["speedup"], r.get("speedup_ci"),
                                 f"{r['rule']} k={r['k']} B={b}"))
    return out


def format_throughput(entries: list[dict]) -> str:
    """The throughput table (``throughput``)."""
    lines = [f"{'method':<22}{'B':>4}{'tok/s':>9}{'rows':>6}{'tok/s/row':>10}{'speedup':>9}{'95% CI':>14}"
             f"{'vs B=1':>8}{'s/1000 ans':>11}{'compute roof':>13}"]
    for e in entries:
        sp = f"{e['speedup']:.2f}x" if e["speedup"] is not None else "-"
        lines.append(f"{e['method']:<22}{e['batch_size']:>4}{e['tokens_per_s']:>9.1f}{e['rows']:>6.1f}"
                     f"{e['tokens_per_s_per_row']:>10.2f}{sp:>9}{_ci(e['speedup_ci']):>14}{e['vs_batch1']:>7.2f}x"
                     f"{e['seconds_per_1000_answers']:>11.0f}{e['compute_roof_ratio']:>12.1f}x")
    return "\n".join(lines)


def _runs_on(tree: tuple, rule) -> bool:
    """Whether ``rule`` runs on the tree entry ``tree``: every rule in mode ``"rounds"``; in mode
    ``"joint"`` the rules that mode takes (``core.tree.check_mode``) except SpS, whose joint law is its
    rounds law (its row would repeat the rounds tree's)."""
    if len(tree) < 4 or tree[3] != "joint":
        return True
    try:
        check_mode("joint", (rule,))
    except ValueError:
        return False
    return rule != SpS()


def _paired_al_ratio(r: dict, ref: dict) -> list:
    """Bootstrap 95% interval of AL(r) / AL(ref), resampling prompts jointly (same prompts, paired)."""
    return bootstrap([[SequenceCounters(**c) for c in r["per_sequence"]],
                      [SequenceCounters(**c) for c in ref["per_sequence"]]], lambda a, b: _al(a) / _al(b))[1:]


def _ci(v) -> str:
    return f"[{v[0]:.2f}, {v[1]:.2f}]" if v and all(math.isfinite(x) for x in v) else ""


def format_table(res: dict) -> str:
    lines = []
    for b, base in res["baselines"].items():
        runs = ", ".join(f"{x['tokens_per_s']:.2f}" for x in base["runs"])
        lines.append(f"batch {b}: verifier alone {base['tokens_per_s']:.2f} tokens/s (rounds {runs}; max / min "
                     f"{base.get('drift', math.nan):.3f}), {base['verifier_ms']:.1f} ms per forward, NLL {base['nll']:.3f}")
    kw = max([3] + [len(str(r["k"])) + 1 for r in res["rows"]])  # tree labels name the tree
    lines.append(f"{'rule':<18}{'k':>{kw}}{'B':>3}{'AL':>7}{'95% CI':>14}{'acc':>7}{'95% CI':>14}{'AL/SpS':>7}"
                 f"{'tok/s':>8}{'speedup':>9}{'95% CI':>14}{'step KL':>9}{'NLL':>7}{'draft/ver':>10}{'fwd/one':>8}")
    for r in res["rows"]:
        lines.append(f"{r['rule']:<18}{str(r['k']):>{kw}}{r['batch_size']:>3}{r['al']:>7.3f}{_ci(r['al_ci']):>14}"
                     f"{r['acceptance_rate']:>7.3f}{_ci(r['acceptance_ci']):>14}{r['al_vs_sps']:>7.2f}"
                     f"{r['tokens_per_s']:>8.2f}{r['speedup']:>8.2f}x{_ci(r.get('speedup_ci')):>14}"
                     f"{r['mean_step_kl']:>9.4f}{r['nll']:>7.3f}{r['draft_vs_verifier']:>9.1%}"
                     f"{r.get('verifier_vs_one', math.nan):>7.2f}x")
    lines.append("profile (per verifier call): " + "; ".join(
        f"{r['rule']} k={r['k']} B={r['batch_size']}: draft {1000 * r['draft_seconds'] / max(1, r['verifier_calls']):.1f}"
        f" / verifier {1000 * r['verifier_seconds'] / max(1, r['verifier_calls']):.1f}"
        f" / verify {1000 * r['verify_seconds'] / max(1, r['verifier_calls']):.1f}"
        f" / bookkeeping {1000 * r['bookkeeping_seconds'] / max(1, r['verifier_calls']):.1f}"
        f" / prefill {1000 * r.get('prefill_seconds', 0.0) / max(1, r['verifier_calls']):.1f} ms"
        for r in res["rows"] if (r["k"] == 4 or isinstance(r["k"], str))
        and r["batch_size"] == min(int(b) for b in res["baselines"])))
    return "\n".join(lines)


def targets(res: dict, k: int = 4, batch: int = 1) -> list[tuple[str, float, list | None, str, bool]]:
    """The draft issue's targets, each (what, measured, 95% interval or None, target, met), from one
    run's rows; "met" needs the whole 95% interval past the target where the run has one, the point
    value only where it has none (the draft-call ratio, the acceptance per judged draft)."""
    rows = {r["repr"]: r for r in res["rows"] if r["k"] == k and r["batch_size"] == batch}
    sps, cac = rows.get(repr(SpS())), rows.get(repr(Cactus(1.0)))
    out = []
    if sps:
        out += [("SpS per-token acceptance", sps["acceptance_rate"], sps["acceptance_ci"], ">= 0.6",
                 _clears(sps["acceptance_ci"], 0.6)),
                ("SpS acceptance per judged draft", sps["position_acceptance"], None,
                 "(>= 0.6 if read per judged draft)", sps["position_acceptance"] >= 0.6),
                ("SpS AL", sps["al"], sps["al_ci"], ">= 2.5", _clears(sps["al_ci"], 2.5)),
                ("SpS speedup", sps["speedup"], sps.get("speedup_ci"), ">= 1.5x", _clears(sps.get("speedup_ci"), 1.5)),
                ("draft call / verifier forward", sps["draft_vs_verifier"], None, "<= 10%",
                 sps["draft_vs_verifier"] <= 0.10)]
    if sps and cac:
        out += [("Cactus d=1 AL / SpS AL", cac["al_vs_sps"], cac.get("al_vs_sps_ci"), ">= 1.15",
                 _clears(cac.get("al_vs_sps_ci"), 1.15)),
                ("Cactus d=1 speedup", cac["speedup"], cac.get("speedup_ci"), ">= 1.8x", _clears(cac.get("speedup_ci"), 1.8)),
                ("Cactus d=1 mean step KL (nats)", cac["mean_step_kl"], None, "(reported)", True)]
    return out


def _clears(ci, bound: float) -> bool:
    """Whether a 95% interval ``[low, high]`` lies wholly at or above ``bound`` (no interval: not met)."""
    return bool(ci) and ci[0] >= bound


def tree_targets(res: dict, tree: str, batch: int = 1) -> list[tuple[str, float, list | None, str, bool]]:
    """The tree issue's targets for the tree row labelled ``tree``, each (what, measured, 95% interval
    or None, target, met); "met" needs the whole interval past the target (a point value alone does
    not), except the forward-cost ratio, which has no interval."""
    base = tree.removesuffix(" joint")  # a joint tree's SpS row is its rounds twin's
    rows = {r["repr"]: r for r in res["rows"] if r["k"] == tree and r["batch_size"] == batch}
    sps = next((r for r in res["rows"] if r["k"] == base and r["batch_size"] == batch and r["repr"] == repr(SpS())),
               None)
    cac = rows.get(repr(Cactus(1.0)))
    out = []
    if sps and base == tree:
        out += [(f"{tree}: SpS AL", sps["al"], sps["al_ci"], ">= 2.6", _clears(sps["al_ci"], 2.6))]
        if "al_vs_chain" in sps:
            out += [(f"{tree}: SpS AL / chain SpS AL", sps["al_vs_chain"], sps["al_vs_chain_ci"], ">= 1.4",
                     _clears(sps["al_vs_chain_ci"], 1.4))]
        out += [(f"{tree}: SpS speedup", sps["speedup"], sps.get("speedup_ci"), ">= 1.6x",
                 _clears(sps.get("speedup_ci"), 1.6)),
                (f"{tree}: verifier forward / one-token forward", sps["verifier_vs_one"], None, "<= 1.5x",
                 sps["verifier_vs_one"] <= 1.5)]
    if sps and cac:
        out += [(f"{tree}: Cactus d=1 AL / SpS AL", cac["al_vs_sps"], cac.get("al_vs_sps_ci"), ">= 1.10",
                 _clears(cac.get("al_vs_sps_ci"), 1.10)),
                (f"{tree}: Cactus d=1 speedup", cac["speedup"], cac.get("speedup_ci"), ">= 1.8x",
                 _clears(cac.get("speedup_ci"), 1.8))]
    return out
