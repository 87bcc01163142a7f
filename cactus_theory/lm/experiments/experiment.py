"""The real-LM speed / acceptance experiment as a library function (``benchmarks/bench_lm.py`` and the
reproduction call it): each (rule, k, batch size) against the verifier decoding alone at the same
batch size, same prompts, same sampling, in one run, with bootstrap intervals over prompts.

Units: AL = tokens per verifier call, bonus included; per-token acceptance = accepted / drafted;
speedup = tokens/s of the rule / tokens/s of the verifier alone (mean of a run before and a run
after the rules, both warmed up). At batch size 1 every prompt is timed on its own, so the speedup
also gets a paired bootstrap interval over prompts.
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

__all__ = ["DEFAULT_RULES", "SAMPLING", "run_benchmark", "format_table", "bootstrap", "targets", "tree_targets"]

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


def _row(label, rule, k, batch, res, base_res):
    s = res.stats
    row = {**s.as_dict(), "rule": label, "repr": repr(rule), "k": k, "batch_size": batch}
    row["al_ci"] = bootstrap([res.per_sequence], _al)[1:]
    row["acceptance_ci"] = bootstrap([res.per_sequence], _acc)[1:]
    if batch == 1:  # per-prompt timings: a paired interval for the speedup over the verifier alone
        row["speedup_ci"] = bootstrap([res.per_sequence, *base_res], lambda a, *b: _rate(a) / np.mean(
            [_rate(x) for x in b]))[1:]
    row["per_sequence"] = [vars(c) for c in res.per_sequence]
    return row


def run_benchmark(pair, prompts, rules=DEFAULT_RULES, ks=(4,), batch_sizes=(1,), max_new_tokens: int = 64,
                  seed: int = 0, sampling: dict = SAMPLING, progress: bool = True, warmup: bool = True,
                  trees=(), tree_scheme: str = "iid", draft_stops=()) -> dict:
    """Decode ``prompts`` with the verifier alone (a run before and one after the rules, at each batch
    size) and with every (rule, k, batch size); return ``{"rows": [...], "baselines": {...}}``. Each
    row has the run's ``DecodeStats`` fields, ``speedup`` (against the mean of the two baseline runs
    at its batch size), bootstrap intervals and the per-prompt counters.

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
    bar = tqdm(total=len(jobs) + 2 * len(batch_sizes), desc="bench_lm", disable=not progress)
    rows, baselines = [], {}
    for b in batch_sizes:
        base = [autoregressive_generate(pair, prompts, batch_size=b, **kw)]
        bar.update()
        mine = [j for j in jobs if j[0] == b]
        results = []
        for _, k, label, rule in mine:
            if isinstance(k, tuple) and isinstance(k[1], DraftStop):  # (k, adaptive draft length)
                res = speculative_generate(pair, prompts, rule, k=k[0], batch_size=b, draft_stop=k[1], **kw)
                k = f"{k[0]} {k[1].label()}"
            elif isinstance(k, tuple):  # (label, tree[, scheme[, mode]])
                res = tree_generate(pair, prompts, rule, k[1], k[2] if len(k) > 2 else tree_scheme,
                                    mode=k[3] if len(k) > 3 else "rounds", batch_size=b, **kw)
                k = k[0]
            else:
                res = speculative_generate(pair, prompts, rule, k=k, batch_size=b, **kw)
            results.append((label, rule, k, res))
            bar.set_postfix(rule=label, k=k, B=b, al=f"{res.stats.al:.2f}")
            bar.update()
        base.append(autoregressive_generate(pair, prompts, batch_size=b, **kw))
        bar.update()
        ref = float(np.mean([r.stats.tokens_per_s for r in base]))
        baselines[b] = {"runs": [r.stats.as_dict() for r in base], "tokens_per_s": ref,
                        "nll": float(np.mean([r.stats.nll for r in base])),
                        "verifier_ms": 1000 * sum(r.stats.verifier_seconds for r in base)
                        / max(1, sum(r.stats.verifier_calls for r in base))}
        base_seq = [r.per_sequence for r in base]
        for label, rule, k, res in results:
            row = _row(label, rule, k, b, res, base_seq)
            row["speedup"] = row["tokens_per_s"] / ref
            row["draft_ms"] = 1000 * res.stats.draft_seconds / max(1, res.stats.draft_calls)
            row["draft_vs_verifier"] = row["draft_ms"] / baselines[b]["verifier_ms"]
            row["verifier_ms"] = 1000 * res.stats.verifier_seconds / max(1, res.stats.verifier_calls)
            row["verifier_vs_one"] = row["verifier_ms"] / baselines[b]["verifier_ms"]
            rows.append(row)
    bar.close()
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
            "settings": {"max_new_tokens": max_new_tokens, "seed": seed, "prompts": len(prompts), **sampling,
                         "ks": list(ks), "batch_sizes": list(batch_sizes), "threads": torch.get_num_threads()}}


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
        lines.append(f"batch {b}: verifier alone {base['tokens_per_s']:.2f} tokens/s (runs {runs}), "
                     f"{base['verifier_ms']:.1f} ms per forward, NLL {base['nll']:.3f}")
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
