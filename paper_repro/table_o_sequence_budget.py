"""Table o (our result, not the paper's): a KL budget for the whole answer (``SequenceBudget``, issue 28) against
per-token Cactus at the delta that spends the same KL per answer, on the real LM.

Setting: the eval's (``cactus-theory eval``: task ``arith``, chat template, the paper's sampling, ``k = 4``
drafts, up to 128 new tokens, EOS, batches of 32, float32; ``PROBLEMS`` problems of the eval's seed). Methods:
the verifier alone, SpS, ``SequenceBudget(B, allocation, delta_max=1)`` for ``B`` in ``BUDGETS`` nats per
answer and each allocation of ``ALLOCATIONS``, and for each of them per-token ``Cactus(delta_B)`` whose mean
per-answer KL matches the budget's.

Matching (pre-registered): on the first ``calibration`` batch of problems, each budget method's mean realised
KL per answer (``kl_sum``: the exact step KLs of its judged, kept positions) is the target; Cactus runs on the
same batch at every delta of ``LADDER``; ``delta_B`` interpolates log(mean KL per answer) against log(delta)
on the ladder (its running maximum: a monotone curve), rounded to 3 significant digits, clamped to the ladder's
ends (flagged). Then every method decodes every problem in one run (the eval's batch-major loop, each batch
decoded by every method back to back with the same seeds; cached per (batch, method), resumable), and the table
shows both realised KLs with their intervals, so the quality of the match is visible.

Pre-registered reading, per (B, allocation):
  * certificate: **holds** if every answer's realised KL is <= B; else **differs**.
  * AL against the matched Cactus (the claim "the budget reaches a higher AL at the same KL"): paired percentile
    bootstrap over problems (95%) of the AL difference; **holds** (higher) if it lies above 0, **differs** (lower)
    if below, else **inconclusive**.
  * accuracy against the matched Cactus: paired difference (bootstrap 95%) and McNemar's exact p, Holm over the
    ``len(BUDGETS) x len(ALLOCATIONS)`` comparisons at alpha 0.05: **differs** if the adjusted p < 0.05, else
    **no difference detected** (with the minimum detectable difference at power 0.8).

Re-read after the run (issue 41 item 9), from the committed JSON alone (no decoding; ``reread``):
  * AL: Holm over the family of the ``len(BUDGETS) x len(ALLOCATIONS)`` AL comparisons at alpha 0.05. The
    committed result keeps each comparison's estimate and 95% percentile interval but neither the bootstrap
    replicates nor the per-problem records, so each two-sided p-value is read from its interval by the normal
    approximation (``al_pvalue``: SE = interval width / (2 z_0.975)); **differs** / **holds** need a Holm-adjusted
    p < 0.05 (the sign of the estimate says which), else **inconclusive**. The pre-registered reading above had no
    multiplicity adjustment.
  * the match: a row is **not matched** when its delta was clamped at the ladder's end, or when the matched
    Cactus's realised mean KL per answer lies outside the 95% interval of the budget's (the target); such a row
    gets no AL verdict (its "same KL" comparison was not made), and every row prints the KL gap in %.
  * accuracy: the minimum detectable difference at Holm's first step (alpha 0.05 / the family's size:
    ``holm_mdd``), the level the most significant comparison must clear.

``python -m paper_repro.table_o_sequence_budget [--fast]`` writes ``paper_repro/results/table_o_sequence_budget.md``.
About 1.1 hours on 2 CPU cores (18 methods x 300 problems, and the calibration batch; the committed run: 3,929 s).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from cactus_theory.core.sampling import SAMPLING

from .common import (
    Claim,
    Ctx,
    StepResult,
    cached_step,
    fmt,
    report_section,
    standalone,
    write_markdown,
)
from .lm_runs import set_threads

NAME = "table_o_sequence_budget"
BUDGETS = (0.5, 1.0, 2.0, 4.0)  # nats per answer
ALLOCATIONS = ("spend_down", "lagrangian")
LADDER = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)  # Cactus deltas of the calibration
DELTA_MAX = 1.0  # the budget's per-position cap: the paper's Cactus delta
ALPHA = 0.05
FAMILY = "Holm over the budgets x allocations comparisons of accuracy against the matched Cactus, alpha 0.05"
AL_FAMILY = ("Holm over the {n} budgets x allocations comparisons of AL against the matched Cactus, alpha 0.05 "
             "(p-values from the committed 95% intervals, normal approximation)")


def config(ctx: Ctx) -> dict:
    from cactus_theory.lm.experiments import tasks

    size = ({"problems": 4, "max_new_tokens": 8, "batch_size": 2, "k": 2, "ladder": [0.01, 0.1, 1.0]} if ctx.fast else
            {"problems": 300, "max_new_tokens": 128, "batch_size": 32, "k": 4, "ladder": list(LADDER)})
    return {**size, "calibration_batches": 1, "seed": ctx.seed, "pair": _pair_id(ctx), "task": tasks.DEFAULT_TASK,
            "budgets": list(BUDGETS), "allocations": list(ALLOCATIONS), "delta_max": DELTA_MAX,
            "sampling": SAMPLING.as_dict(), "version": 1}


def _pair_id(ctx: Ctx) -> str:
    if ctx.lm.get("pair") is not None:
        return "injected"
    from cactus_theory.lm.experiments.eval import pair_id

    from .lm_runs import lm_config

    cfg = lm_config(ctx)
    return ("fast:" if ctx.fast else "") + pair_id(cfg["draft"], cfg["verifier"])


def _pair(ctx: Ctx):
    from .lm_runs import get_pair
    from .table_h_eval import DigitTokenizer

    pair = get_pair(ctx)
    return replace(pair, tokenizer=DigitTokenizer()) if pair.tokenizer is None else pair


def _methods(cfg: dict):
    import cactus_theory as ct
    from cactus_theory.core import registry
    from cactus_theory.lm.experiments.eval import Method

    refs = [Method("verifier alone", None), Method("SpS", "sps", {}, ct.SpS(), registry.colour("sps"))]
    budgets = []
    for B in cfg["budgets"]:
        for a in cfg["allocations"]:
            rule = ct.SequenceBudget(B, allocation=a, delta_max=cfg["delta_max"])
            budgets.append(Method(f"budget {B:g} ({a})", "sequence_budget",
                                  {"budget": B, "allocation": a, "delta_max": cfg["delta_max"]}, rule,
                                  registry.colour("sequence_budget")))
    return refs, budgets


def _cactus(delta: float):
    import cactus_theory as ct
    from cactus_theory.core import registry
    from cactus_theory.lm.experiments.eval import Method

    return Method(f"Cactus delta={delta:g}", "cactus", {"delta": delta}, ct.Cactus(delta), registry.colour("cactus"))


def per_answer_kl(records: list[dict]) -> np.ndarray:
    """Each answer's realised KL: the sum of the exact step KLs of its judged, kept positions (``kl_sum``)."""
    return np.array([float(r["kl_sum"]) for r in records])


def match_delta(ladder, kls, target: float) -> tuple[float, bool]:
    """``delta`` whose mean KL per answer is ``target`` on the calibration curve (log-log interpolation of its
    running maximum), 3 significant digits; and whether the target lay outside the ladder (clamped)."""
    x, y = np.log(np.asarray(ladder, dtype=float)), np.maximum.accumulate(np.asarray(kls, dtype=float))
    y = np.log(np.maximum(y, 1e-300))
    t = math.log(max(target, 1e-300))
    outside = not (y[0] <= t <= y[-1])
    d = float(np.exp(np.interp(t, y, x)))
    return float(f"{d:.3g}"), outside


def _paired_al(a: list[dict], b: list[dict], seed: int, n_boot: int = 4000) -> list[float]:
    """AL(a) - AL(b) (AL: (accepted + steps) / steps, pooled) and its paired percentile bootstrap over problems."""
    ea, sa = np.array([r["accepted"] + r["steps"] for r in a], float), np.array([r["steps"] for r in a], float)
    eb, sb = np.array([r["accepted"] + r["steps"] for r in b], float), np.array([r["steps"] for r in b], float)
    idx = np.random.default_rng(seed).integers(0, len(a), size=(n_boot, len(a)))
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = ea[idx].sum(1) / sa[idx].sum(1) - eb[idx].sum(1) / sb[idx].sum(1)
    boot = boot[np.isfinite(boot)]
    lo, hi = np.quantile(boot, [0.025, 0.975]) if boot.size else (math.nan, math.nan)
    return [float(ea.sum() / sa.sum() - eb.sum() / sb.sum()), float(lo), float(hi)]


def compute(ctx: Ctx, cfg: dict) -> dict:
    from cactus_theory.claims.ledger import bootstrap_interval, holm, mcnemar_mdd
    from cactus_theory.lm.experiments import eval as ev
    from cactus_theory.theory.stats import paired_difference

    set_threads(ctx)
    pair = _pair(ctx)
    cache = ctx.results / f"{NAME}.parts"  # the eval's cache: one JSON per (batch, method), atomic, resumable
    ecfg = ev.EvalConfig(task=cfg["task"], problems=cfg["problems"], seed=cfg["seed"], k=cfg["k"],
                         max_new_tokens=cfg["max_new_tokens"], batch_size=cfg["batch_size"],
                         sampling=dict(cfg["sampling"]), pair=cfg["pair"])
    refs, budgets = _methods(cfg)
    # 1. calibration on the first batch(es): the budgets' realised KL per answer, Cactus's along the ladder
    ccfg = replace(ecfg, problems=min(cfg["problems"], cfg["batch_size"] * cfg["calibration_batches"]))
    ladder = [_cactus(d) for d in cfg["ladder"]]
    cal = ev.run_eval(pair, ccfg, refs + budgets + ladder, cache, ablation=False, progress=False)
    ladder_kl = [float(per_answer_kl(cal["records"][m.label]).mean()) for m in ladder]
    matched, calib = {}, []
    for m in budgets:
        target = float(per_answer_kl(cal["records"][m.label]).mean())
        d, outside = match_delta(cfg["ladder"], ladder_kl, target)
        matched[m.label] = _cactus(d)
        calib.append({"method": m.label, "target_kl": target, "delta": d, "outside_ladder": outside})
    # 2. one run: every method on every problem
    cactus = list({c.label: c for c in matched.values()}.values())
    res = ev.run_eval(pair, ecfg, refs + budgets + cactus, cache, ablation=False, progress=not ctx.fast)
    recs, summ = res["records"], res["summary"]
    rows = []  # a list: the table's order (refs, budgets, matched Cactus) survives the JSON cache
    for m in refs + budgets + cactus:
        kl = per_answer_kl(recs[m.label])
        s = summ[m.label]
        row = {"accuracy": s["accuracy"], "al": s.get("al"), "acceptance": s.get("acceptance"),
               "diff_vs_sps": s["diff_vs_sps"], "new_tokens": s["new_tokens"]}
        if m.rule is not None:
            iv = bootstrap_interval(kl, seed=cfg["seed"])
            row.update(kl_mean=[iv.estimate, iv.lo, iv.hi], kl_max=float(kl.max()), kl_median=float(np.median(kl)))
        rows.append({"label": m.label, **row})
    comps = []
    for m in budgets:
        c = matched[m.label]
        acc = paired_difference(np.array([r["correct"] for r in recs[m.label]], float),
                                np.array([r["correct"] for r in recs[c.label]], float), seed=cfg["seed"])
        disc = float(np.mean([r1["correct"] != r2["correct"] for r1, r2 in zip(recs[m.label], recs[c.label],
                                                                               strict=True)]))
        comps.append({"method": m.label, "budget": m.params["budget"], "allocation": m.params["allocation"],
                      "cactus": c.label, "delta": c.params["delta"],
                      "certificate_max": next(r["kl_max"] for r in rows if r["label"] == m.label),
                      "accuracy_diff": [acc.estimate, acc.low, acc.high], "pvalue": acc.pvalue,
                      "mdd": mcnemar_mdd(max(disc, 1.0 / len(recs[m.label])), len(recs[m.label]), alpha=ALPHA),
                      "al_diff": _paired_al(recs[m.label], recs[c.label], cfg["seed"])})
    for c, a in zip(comps, holm([c["pvalue"] for c in comps]), strict=True):
        c["holm"] = a
    return {"config": cfg, "pair": cfg["pair"], "calibration": {"ladder": cfg["ladder"], "ladder_kl": ladder_kl,
                                                                  "targets": calib},
            "rows": rows, "comparisons": comps}


def _certificate(c: dict) -> str:
    return "holds" if c["certificate_max"] <= c["budget"] else "differs"


def _acc_reading(c: dict) -> str:
    return "differs" if c["holm"] < ALPHA else "no difference detected"


def al_pvalue(al_diff) -> float:
    """Two-sided p-value of "AL difference = 0" read from a committed ``[estimate, low, high]`` (95% percentile
    bootstrap) by the normal approximation: SE = (high - low) / (2 z_0.975), p = 2 Phi(-|estimate| / SE). A
    zero-width interval gives 0 (estimate != 0) or 1; an undefined end gives 1 (nothing excluded)."""
    from scipy.stats import norm

    est, lo, hi = (float(x) for x in al_diff)
    if not all(math.isfinite(x) for x in (est, lo, hi)):
        return 1.0
    se = (hi - lo) / (2 * norm.ppf(1 - ALPHA / 2))
    if se <= 0:
        return 1.0 if est == 0 else 0.0
    return float(2 * norm.sf(abs(est) / se))


def holm_mdd(mdd: float, m: int, power: float = 0.8) -> float:
    """The minimum detectable difference ``mdd`` (McNemar, two-sided ``ALPHA``, ``power``) at Holm's first step,
    two-sided ``ALPHA / m``: ``ledger.mcnemar_mdd`` is ``(z_{1 - a/2} + z_power) sqrt(discordance / n)``, so the
    stored value is rescaled by ``(z_{1 - ALPHA/(2m)} + z_power) / (z_{1 - ALPHA/2} + z_power)``."""
    from scipy.stats import norm

    return float(mdd * (norm.isf(ALPHA / (2 * m)) + norm.ppf(power)) / (norm.isf(ALPHA / 2) + norm.ppf(power)))


def reread(d: dict) -> list[dict]:
    """Per comparison of the committed result (same order): the AL p-value (``al_pvalue``) and its Holm-adjusted
    value over the AL family, the match (the KL gap of the matched Cactus to the budget, in % of the budget's mean
    KL per answer; ``clamped``; ``matched``), the AL reading ("higher" / "lower" / "no difference detected" by
    Holm, or "not matched") and the accuracy MDD at Holm's first step."""
    from cactus_theory.claims.ledger import holm

    comps = d["comparisons"]
    rows = {r["label"]: r for r in d["rows"]}
    clamped = {t["method"]: bool(t["outside_ladder"]) for t in d["calibration"]["targets"]}
    p = [al_pvalue(c["al_diff"]) for c in comps]
    adj = holm(p)
    out = []
    for c, pv, a in zip(comps, p, adj, strict=True):
        b, k = rows[c["method"]]["kl_mean"], rows[c["cactus"]]["kl_mean"]
        matched = not clamped[c["method"]] and b[1] <= k[0] <= b[2]
        if not matched:
            reading = "not matched"
        elif a < ALPHA:
            reading = "higher" if c["al_diff"][0] > 0 else "lower"
        else:
            reading = "no difference detected"
        out.append({"method": c["method"], "al_p": pv, "al_holm": a, "budget_kl": b, "cactus_kl": k,
                    "kl_gap_pct": 100 * (k[0] / b[0] - 1), "clamped": clamped[c["method"]], "matched": matched,
                    "al_reading": reading, "mdd_holm": holm_mdd(c["mdd"], len(comps))})
    return out


def _holm_tally(d: dict, rr: list[dict]) -> str:
    """``"0 higher, 3 lower, 5 no difference detected"``: the AL readings by Holm alone, the match not checked."""
    n = {"higher": 0, "lower": 0, "no difference detected": 0}
    for c, r in zip(d["comparisons"], rr, strict=True):
        n["no difference detected" if r["al_holm"] >= ALPHA else "higher" if c["al_diff"][0] > 0 else "lower"] += 1
    return ", ".join(f"{v} {k}" for k, v in n.items())


def _match_text(r: dict) -> str:
    why = ("delta clamped at the ladder's end; " if r["clamped"] else "") + (
        f"Cactus {fmt(r['cactus_kl'][0])} vs budget {fmt(r['budget_kl'][0])} [{fmt(r['budget_kl'][1])}, "
        f"{fmt(r['budget_kl'][2])}] nats ({r['kl_gap_pct']:+.1f}%)")
    return ("matched: " if r["matched"] else "not matched: ") + why


def _iv(v, pct: bool = False, digits: int = 3) -> str:
    if v is None:
        return "-"
    f = (lambda x: f"{100 * x:.1f}") if pct else (lambda x: fmt(x, digits))
    return f"{f(v[0])} [{f(v[1])}, {f(v[2])}]"


def render(d: dict) -> str:
    cfg, rows = d["config"], d["rows"]
    lines = ["# Table o: a KL budget for the whole answer against per-token Cactus at the same KL", "",
             f"Pair: {d['pair']}; task {cfg['task']}, {cfg['problems']} problems (seed {cfg['seed']}), chat template, "
             f"T {cfg['sampling']['temperature']:g} / top-k {cfg['sampling']['top_k']} / top-p "
             f"{cfg['sampling']['top_p']:g}, k = {cfg['k']}, up to {cfg['max_new_tokens']} new tokens, EOS, batches of "
             f"{cfg['batch_size']}. Budgets in nats per answer (`SequenceBudget(B, allocation, delta_max="
             f"{cfg['delta_max']:g})`); each matched with per-token Cactus at the delta whose mean KL per answer is the "
             "same on the calibration batch. KL per answer: the sum of the exact step KLs of its judged, kept "
             "positions. Intervals 95%, bootstrap over problems.", "",
             "| method | accuracy % | AL | KL per answer: mean | max | certificate (max <= B) |", "|---|---|---|---|---|---|"]
    comp = {c["method"]: c for c in d["comparisons"]}
    for r in rows:
        label = r["label"]
        cert = f"{_certificate(comp[label])} (B = {comp[label]['budget']:g})" if label in comp else "-"
        lines.append(f"| {label} | {_iv(r['accuracy'], pct=True)} | {_iv(r['al'], digits=2)} | {_iv(r.get('kl_mean'))} | "
                     f"{fmt(r.get('kl_max'))} | {cert} |")
    rr = reread(d)
    m = len(d["comparisons"])
    lines += ["", f"Re-read from the committed numbers (issue 41): AL by Holm over its {m} comparisons (p-values from the "
              "95% intervals by the normal approximation: the bootstrap replicates are not stored); a row is not "
              "matched when its delta was clamped at the ladder's end or the matched Cactus's mean KL per answer lies "
              "outside the budget's 95% interval (no AL verdict then); accuracy by McNemar with Holm over its "
              f"{m} comparisons, the detectable difference at Holm's first step (alpha 0.05 / {m}, power 0.8). "
              f"By Holm alone the AL comparisons read {_holm_tally(d, rr)}; with the match checked, "
              + ", ".join(f"{sum(r['al_reading'] == v for r in rr)} {v}" for v in
                          ("higher", "lower", "no difference detected", "not matched")) + ".", "",
              "| budget (allocation) | matched Cactus | KL match (mean KL per answer) | AL difference | AL p (Holm) | "
              "AL reading | accuracy difference (points) | Holm p | detectable (power 0.8, alpha 0.05 / "
              f"{m}) | accuracy reading |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c, r in zip(d["comparisons"], rr, strict=True):
        lines.append(f"| {c['budget']:g} ({c['allocation']}) | {c['cactus']} | {_match_text(r)} | "
                     f"{_iv(c['al_diff'], digits=2)} | {fmt(r['al_p'])} ({fmt(r['al_holm'])}) | {r['al_reading']} | "
                     f"{_iv(c['accuracy_diff'], pct=True)} | {fmt(c['holm'])} | {r['mdd_holm'] * 100:.1f} | "
                     f"{_acc_reading(c)} |")
    cal = d["calibration"]
    lines += ["", "Calibration (first batch): Cactus's mean KL per answer along the ladder: "
              + ", ".join(f"delta {x:g}: {fmt(y)}" for x, y in zip(cal["ladder"], cal["ladder_kl"], strict=True)) + "; "
              + "; ".join(f"{t['method']}: target {fmt(t['target_kl'])} -> delta {t['delta']:g}"
                          + (" (outside the ladder: clamped)" if t["outside_ladder"] else "") for t in cal["targets"])
              + "."]
    return "\n".join(lines) + "\n"


def section(d: dict) -> str:
    return report_section("### o. A KL budget for the whole answer (our result)", render(d))


def claims(d: dict) -> list[Claim]:
    out = []
    units = f"{d['config']['problems']} problems"
    rr = reread(d)
    m = len(d["comparisons"])
    for c, r in zip(d["comparisons"], rr, strict=True):
        tag = f"{c['budget']:g}-{c['allocation']}"
        out.append(Claim(
            f"sequence-budget-certificate-{tag}",
            f"SequenceBudget({c['budget']:g}, {c['allocation']}) keeps every answer's realised KL within its budget",
            "ours (issue 28)", "derived", "the loop's kl_sum per answer (exact step KLs of the judged, kept positions)",
            f"max {fmt(c['certificate_max'])} nats per answer", _certificate(c), units=units,
            decision="holds if every answer's realised KL is <= B; else differs"))
        out.append(Claim(
            f"sequence-budget-vs-cactus-{tag}",
            f"SequenceBudget({c['budget']:g}, {c['allocation']}) reaches a higher AL than per-token Cactus at the same "
            f"mean KL per answer ({c['cactus']})", "ours (issue 28)", "derived",
            "paired over problems, one run: AL difference (bootstrap 95%; p-value from the interval, normal "
            "approximation; Holm over the AL comparisons); the match checked on the realised mean KL per answer; "
            "accuracy difference (bootstrap 95%, McNemar, Holm over the comparisons) reported beside it",
            f"{_match_text(r)}; AL {_iv(c['al_diff'], digits=2)}, p {fmt(r['al_p'])}, Holm {fmt(r['al_holm'])} "
            f"({r['al_reading']}); accuracy {_iv(c['accuracy_diff'], pct=True)} points, Holm p {fmt(c['holm'])} "
            f"({_acc_reading(c)}, detectable {100 * r['mdd_holm']:.1f} points at alpha 0.05 / {m})",
            {"higher": "holds", "lower": "differs", "not matched": "out of reach"}.get(r["al_reading"], "inconclusive"),
            units=units, detail="not matched: no AL verdict at the same KL" if not r["matched"] else "",
            decision=("out of reach (not matched) if the delta was clamped at the ladder's end or the matched Cactus's "
                      "mean KL per answer lies outside the budget's 95% interval; else holds if the Holm-adjusted AL "
                      "p-value is < 0.05 with the budget higher, differs if < 0.05 with it lower, else inconclusive"),
            family=f"{AL_FAMILY.format(n=m)}; accuracy: {FAMILY}"))
    return out


def findings(results, claims: list[Claim]) -> list[str]:
    """README's bullet and its table: what the budget adds over every per-token rule (a cap on each answer's KL)
    with the numbers of one run: each budget's largest realised KL per answer beside its matched Cactus's, and
    the paired AL and accuracy differences."""
    rows = [c for c in claims if c.key.startswith("sequence-budget-certificate-")]
    if not rows:
        return []
    from cactus_theory.util.keyed_cache import read_json

    ok = sum(c.verdict == "holds" for c in rows)
    out = [f"* **A KL budget for the whole answer** (our result; REPORT.md section o, docs/sequence-budget.md): "
           f"`SequenceBudget(B)` caps every answer's KL to the verifier (the realised sum of exact step KLs), which no "
           f"per-token rule does (Cactus, TAS, top-k and the production rules bound one position at most); on the real "
           f"LM the realised KL per answer stayed within its budget in {ok}/{len(rows)} (budget, allocation) "
           f"settings. Against per-token Cactus at the delta matched to the same mean KL per answer (one run, "
           f"paired over problems; Holm over the {len(rows)} AL comparisons and over the {len(rows)} accuracy "
           f"comparisons), the pre-registered claim that the budget reaches a higher AL "
           f"{_tally([c for c in claims if c.key.startswith('sequence-budget-vs-cactus-')])}:"]
    stored = read_json(results / f"{NAME}.json")
    if not (isinstance(stored, dict) and "data" in stored):
        return out
    d = stored["data"]
    by = {r["label"]: r for r in d["rows"]}
    out += ["", "| B (nats / answer) | allocation | largest KL per answer: budget | matched Cactus (its largest) | "
            "mean KL per answer: Cactus vs budget | AL: budget | AL difference vs Cactus (Holm) | accuracy difference "
            "(points) |", "|---|---|---|---|---|---|---|---|"]
    for c, r in zip(d["comparisons"], reread(d), strict=True):
        b, m = by[c["method"]], by[c["cactus"]]
        out.append(f"| {c['budget']:g} | {c['allocation']} | {fmt(c['certificate_max'])} | {c['cactus']} "
                   f"({fmt(m.get('kl_max'))}) | {fmt(r['cactus_kl'][0])} vs {fmt(r['budget_kl'][0])} "
                   f"({r['kl_gap_pct']:+.1f}%{', clamped' if r['clamped'] else ''}: "
                   f"{'matched' if r['matched'] else 'not matched'}) | {_iv(b['al'], digits=2)} | "
                   f"{_iv(c['al_diff'], digits=2)} ({r['al_reading']}) | {_iv(c['accuracy_diff'], pct=True)} "
                   f"({_acc_reading(c)}) |")
    out.append("")
    return out


def _tally(rows: list[Claim]) -> str:
    """``"holds in 0, differs (lower AL) in 0 and is inconclusive in 4 of 8 settings; 4 not matched (no verdict)"``."""
    n = {v: sum(c.verdict == v for c in rows) for v in ("holds", "differs", "inconclusive", "out of reach")}
    return (f"holds in {n['holds']}, differs (lower AL) in {n['differs']} and is inconclusive in "
            f"{n['inconclusive']} of {len(rows)} settings; {n['out of reach']} not matched in KL (no verdict)")


def run(ctx: Ctx) -> StepResult:
    cfg = config(ctx)

    return cached_step(ctx, NAME, cfg, lambda: compute(ctx, cfg), write_markdown(NAME, render), claims)


if __name__ == "__main__":
    standalone(run)
