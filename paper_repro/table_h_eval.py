"""Step h: task accuracy of the rules with intervals (a reduced ``cactus-theory eval``) and the
distribution tests on the real LM, beside the paper's GSM8K / GPQA table.

Reduced run (``REDUCED``; about 5 minutes with the batched decoding loop on 2 cores): the first
``problems`` problems of the eval task, the methods of the paper's table (verifier alone, SpS, TAS,
Cactus delta = 0.75 and 1), k = 4, no ablation; the distribution tests for every registry rule
(verification step: 5 prompts x 20,000 draws; decode loop: 1,000 sequences). The full run
(``make eval``: ``paper_repro/results/eval/eval.json``, committed; 300 problems, the paper's table's
methods and two EAGLE-2 tree rows; ``make eval EVAL_RULES= EVAL_ABLATION=``: every rule and the interpolation
ablation) is shown beside it when it was made with the same pair, and the verdicts then come from it
(more problems, narrower intervals). Verdicts follow the 95% intervals (``claims``): step h is the
primary check of acceptance, task score and the wall clock (batch 32); "Cactus matches SpS" is a
non-inferiority test (``NI_MARGIN_POINTS``) on strict-match, lenient extraction beside it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from cactus_theory.claims.ledger import (
    Claim,
    Interval,
    all_of,
    exact_verdict,
    interval_verdict,
)
from cactus_theory.lm.experiments.lawtests import format_lawtests as lawtest_table
from cactus_theory.lm.experiments.lawtests import own_tv as _own_tv
from cactus_theory.lm.experiments.lawtests import testable

from .common import ROOT, Ctx, StepResult, cached, save_figure, standalone
from .lm_runs import get_pair, set_threads
from .paper_numbers import MAIN_TABLE, OTHER, SETUP, main_table_markdown

NAME = "table_h_eval"
FULL = ROOT / "paper_repro" / "results" / "eval" / "eval.json"
FULL_V3 = ROOT / "paper_repro" / "results" / "eval_v3" / "eval.json"  # the pre-registered eval_v3, once complete
REDUCED = {"problems": 48, "max_new_tokens": 128, "batch_size": 16, "k": 4,
           "lawtest_prompts": 5, "lawtest_draws": 20_000, "loop_draws": 1000}
FAST = {"problems": 4, "max_new_tokens": 8, "batch_size": 2, "k": 2,
        "lawtest_prompts": 2, "lawtest_draws": 2000, "loop_draws": 100}
RULES = ["tas", "Cactus delta=0.75", "Cactus delta=1"]  # with the verifier alone and SpS (always run)
SCOPE_MODEL = "SmolLM2-135M"


class DigitTokenizer:
    """For tokenizer-less test pairs only: ids are digits (mod 10), so the task's plumbing runs."""

    chat_template = None
    eos_token_id = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": [int(c) for c in text if c.isdigit()][-8:] or [0]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(str(i % 10) for i in ids)


def _sampling(cfg: dict) -> str:
    """``"T 0.6 / top-k 20 / top-p 0.95"`` from an eval configuration's sampling."""
    s = cfg["sampling"]
    return f"T {s['temperature']:g} / top-k {s['top_k']} / top-p {s['top_p']:g}"


def _pair(ctx: Ctx):
    pair = get_pair(ctx)
    if pair.tokenizer is None:
        pair = replace(pair, tokenizer=DigitTokenizer())
    return pair


def _pair_id(ctx: Ctx) -> str:
    if ctx.lm.get("pair") is not None:
        return "injected"
    from cactus_theory.lm.experiments.eval import pair_id

    from .lm_runs import lm_config

    cfg = lm_config(ctx)
    return ("fast:" if ctx.fast else "") + pair_id(cfg["draft"], cfg["verifier"])


def config(ctx: Ctx) -> dict:
    return {**(FAST if ctx.fast else REDUCED), "seed": ctx.seed, "pair": _pair_id(ctx), "rules": RULES}


def compute(ctx: Ctx, cfg: dict) -> dict:
    from cactus_theory.lm.experiments import eval as ev

    set_threads(ctx)
    ecfg = ev.EvalConfig(problems=cfg["problems"], seed=cfg["seed"], k=cfg["k"], max_new_tokens=cfg["max_new_tokens"],
                         batch_size=cfg["batch_size"], pair=cfg["pair"])
    res = ev.evaluate(_pair(ctx), ecfg, ctx.results / "eval_reduced", only=cfg["rules"], ablation=False,
                      lawtests={"prompts": cfg["lawtest_prompts"], "draws": cfg["lawtest_draws"],
                                "loop_draws": cfg["loop_draws"]}, progress=True)
    return ev.slim(res)


def full_result(ctx: Ctx, pair: str) -> dict | None:
    """The committed ``make eval`` result, if it was made with this pair: result format 1 (one decode per
    problem, ``claims``) or 2 (the replicated eval of issue 25, ``claims_v2``; ``"format": 2``)."""
    if ctx.fast:
        return None
    for path in (FULL_V3, FULL):  # eval_v3's assembled run first: it decides; the first design is history then
        if path.exists():
            res = json.loads(path.read_text())
            if res.get("config", {}).get("pair") == pair:
                res["_source"] = str(path)  # which run this is (in memory only)
                return res
    return None


# -- verdicts (the claims ledger: cactus_theory.claims) ----------------------------------------------

NI_MARGIN_POINTS = 5.0  # non-inferiority margin, accuracy points (justified in MARGIN_TEXT)
MARGIN_TEXT = (
    "Non-inferiority margin (the first design's): 5 accuracy points. Why 5: the {n_lossless} lossless runs, which "
    "emit exactly the verifier's law, spread over {spread:.1f} points of accuracy by noise alone ({each}), so a margin "
    "below that would call noise a loss; and 5 points is below the minimum detectable difference of this size "
    "({mdd:.1f} points, lenient: McNemar over problem-runs, alpha 0.05, power 0.8). Claim 10 (\"Cactus matches SpS on "
    "task score\") is read on the lenient metric, Cactus against the verifier alone and against the pooled lossless "
    "runs, each part with a 95% interval that resamples whole distinct questions (the {runs} problem-runs are "
    "{questions} distinct questions, each decoded once per method; {n_boot:,} resamples, numpy default_rng seed "
    "{seed}; `results/eval/{clustered}`, table below): a part passes when its lower end lies above -5 points "
    "(one-sided alpha 0.025) and fails when its upper end lies below -5; on this design the claim is **{verdict}**. "
    "Strict-match gives it no verdict: SpS scores {strict_sps:.1f}% there (the 135M verifier rarely writes "
    "\"answer\"), not above {reach:g} points (twice the margin), so no loss could reach \"differs\". The intervals of "
    "the rows above are over problem-runs and understate the noise of one decode per problem. This is the first "
    "design's reading; {pending}.")


def clustered_table(cl: dict) -> str:
    """The parts of ``first_design_clustered`` as a markdown table (accuracies in %, differences in points)."""
    lines = ["| Cactus | reference | Cactus % | reference % | difference (points) [95%, questions resampled] |",
             "|---|---|---|---|---|"]
    for p in cl["parts"]:
        ref = p["reference"] + ("" if p["reference_methods"] == [p["reference"]] else
                                f" ({' + '.join(p['reference_methods'])})")
        lines.append(f"| {p['method']} | {ref} | {100 * p['method_accuracy']:.1f} | {100 * p['reference_accuracy']:.1f} "
                     f"| {100 * p['estimate']:+.1f} [{100 * p['low']:+.1f}, {100 * p['high']:+.1f}] |")
    return "\n".join(lines)


def margin_text(res: dict) -> str:
    """MARGIN_TEXT with this eval's numbers (the lossless runs' spread, the MDD, the clustered reading of claim 10,
    SpS's strict-match rate), then the clustered parts' table."""
    from cactus_theory.lm.experiments.eval import comparisons

    m = comparisons(res)["metrics"]
    le = m["lenient"]
    pl = le.get("pooled_lossless")
    if pl is None or "mdd" not in le:
        return ""
    each = pl["each"]
    sps = next(x["label"] for x in res["methods"] if x["key"] == "sps")
    cl = first_design_clustered(res)
    text = MARGIN_TEXT.format(n_lossless={2: "two", 3: "three", 4: "four"}.get(len(each), str(len(each))),
                              spread=100 * (max(each.values()) - min(each.values())),
                              each=", ".join(f"{k} {100 * v:.1f}%" for k, v in each.items()),
                              mdd=100 * le["mdd"]["points"], runs=cl["runs"], questions=cl["questions"],
                              n_boot=cl["n_boot"], seed=cl["seed"], clustered=CLUSTERED.name, verdict=cl["verdict"],
                              strict_sps=100 * res["summary"][sps].get("strict_accuracy", float("nan")),
                              reach=100 * REACH_FACTOR * cl["margin"], pending=pending_text())
    return text + "\n\n" + clustered_table(cl)


def _iv(v, n: int) -> Interval:
    """``[estimate, low, high]`` or a paired-difference dict as an ``Interval`` over ``n`` problems."""
    if isinstance(v, dict):
        return Interval(v["estimate"], v["low"], v["high"], n)
    return Interval(v[0], v[1], v[2], n)


def _neg(iv: Interval) -> Interval:
    return Interval(-iv.estimate, -iv.hi, -iv.lo, iv.n)


def _pts(iv: Interval) -> str:
    return f"{100 * iv.estimate:+.1f} [{100 * iv.lo:+.1f}, {100 * iv.hi:+.1f}] points"


def _p(d: dict) -> str:
    return f"McNemar p = {d['pvalue']:.2g}, Holm {d['holm']:.2g}"


def _scoped(v: str, sc: str) -> str:
    return sc if v in ("consistent", "inconclusive", "differs") else ""


# -- the first design's accuracy claim, clustered by question (issue 39 item 6) -----------------------------

CLUSTER_BOOT = 4000  # bootstrap resamples of whole distinct questions
CLUSTER_SEED = 39  # numpy.random.default_rng seed of that bootstrap (the number)
CLUSTER_LEVEL = 0.95
REACH_FACTOR = 2.0  # a part can reach "differs" only when its reference accuracy exceeds REACH_FACTOR x the margin
CLUSTERED = FULL.parent / "eval_first_design_clustered.json"
PROTOCOL_V3 = ROOT / "paper_repro" / "protocols" / "eval_v3.json"


def pending_text(path=PROTOCOL_V3) -> str:
    """Where the answer to claim 10 will come from, with the design read from the committed protocol file."""
    p = json.loads(path.read_text())
    d, a = p["design"], p["analysis"]
    return (f"the pending answer is the pre-registered eval_v3 (`paper_repro/protocols/{path.name}`: "
            f"{len(d['tasks'])} tasks x {d['questions_per_task']:,} distinct questions x {d['replicates']} replicates, "
            f"margin {a['margin_points']:g} points), running")


def question_keys(records: list[dict]) -> list[str]:
    """The distinct question of each problem-run of a first-design eval (format 1), in record order. A record's
    ``id`` is ``task/seed/i``: draw ``i`` of the task's generator, seeded by that very string
    (``tasks.make_problems``), so the question is re-made from the id and keyed by its content
    (``tasks.content_key``: ``task:`` and the numbers, plus the operator for ``arith``). ``ValueError`` when an id
    names no task's draw, or when the re-made question's answer is not the record's ``answer``."""
    import random

    from cactus_theory.lm.experiments import tasks

    out = []
    for r in records:
        rid = str(r.get("id", ""))
        parts = rid.split("/")
        if len(parts) != 3 or parts[0] not in tasks.TASKS or not parts[2].isdigit():
            raise ValueError(f"question_keys: record id {rid!r} is not 'task/seed/index' of a known task")
        text, answer = tasks.TASKS[parts[0]](random.Random(rid))
        if "answer" in r and int(r["answer"]) != int(answer):
            raise ValueError(f"question_keys: record {rid!r} has answer {r['answer']!r}, its re-made question "
                             f"{text!r} has {answer}")
        out.append(f"{parts[0]}:{tasks.content_key(parts[0], text)}")
    return out


def clustered_difference(x, y, keys: list[str], *, n_boot: int = CLUSTER_BOOT, seed: int = CLUSTER_SEED,
                         level: float = CLUSTER_LEVEL) -> dict:
    """Mean over problem-runs of ``x - y`` (paired per run) with a percentile bootstrap that resamples whole
    questions: questions are numbered by first appearance in ``keys``; each of ``n_boot`` resamples draws as many
    question numbers as there are questions, uniformly with replacement (``default_rng(seed).integers``, one
    resample after the other), and takes the mean of ``x - y`` over every run of the drawn questions (a question
    drawn twice counts twice); the interval is the ``(1 -+ level) / 2`` quantiles (numpy's linear rule)."""
    d = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    if d.ndim != 1 or d.size != len(keys) or d.size == 0:
        raise ValueError(f"clustered_difference: x, y and keys must have one equal length > 0, got {d.shape}, "
                         f"{len(keys)}")
    order = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    idx = np.array([order[k] for k in keys])
    g = len(order)
    s = np.bincount(idx, weights=d, minlength=g)
    c = np.bincount(idx, minlength=g).astype(np.float64)
    draws = np.random.default_rng(seed).integers(0, g, size=(n_boot, g))
    stat = s[draws].sum(1) / c[draws].sum(1)
    lo, hi = np.quantile(stat, [(1 - level) / 2, (1 + level) / 2])
    return {"estimate": float(d.mean()), "low": float(lo), "high": float(hi), "questions": g, "runs": int(d.size)}


def clustered_verdict(parts: list[dict], margin: float, scope: str = "") -> str:
    """The rule of the first design's accuracy claim on its clustered parts: "out of reach" with no part or when a
    part's reference accuracy is not above ``REACH_FACTOR`` x ``margin`` (a loss could not fall ``margin`` below it
    by a clear interval: "differs" unreachable); else "consistent" (with ``scope``; "holds" without) if every part's
    lower end lies above ``-margin``, "differs" if some part's upper end lies below ``-margin``, else
    "inconclusive" (``interval_verdict`` per part, ``all_of`` over them)."""
    if not parts or any(p["reference_accuracy"] <= REACH_FACTOR * margin for p in parts):
        return "out of reach"
    return all_of(interval_verdict(Interval(p["estimate"], p["low"], p["high"], p["questions"]), above=-margin,
                                   scope=scope) for p in parts)


def write_clustered(full: dict, path=None) -> dict:
    """``CLUSTERED`` (or ``path``): ``first_design_clustered(full)`` as JSON, rewritten only when it changes (a
    cache-only run leaves the committed file as it is); returns the numbers."""
    from .common import atomic_write_json

    path = CLUSTERED if path is None else path
    cl = first_design_clustered(full)
    try:
        same = json.loads(path.read_text()) == cl
    except (OSError, ValueError):
        same = False
    if not same:
        atomic_write_json(path, cl)
    return cl


def first_design_clustered(res: dict) -> dict:
    """Claim 10 on a first-design eval (format 1), lenient metric, clustered by distinct question: for Cactus
    delta = 0.75 and 1 (chains), the difference to (a) the verifier alone and (b) the pooled lossless runs
    (``eval.lossless_labels``, the methods of ``comparisons``' pooled reference: per problem the mean of their
    ``correct``), each with ``clustered_difference``; the verdict of ``clustered_verdict`` at ``NI_MARGIN_POINTS``.
    What ``CLUSTERED`` holds for the committed eval."""
    from cactus_theory.lm.experiments.eval import lossless_labels

    recs = res["records"]
    chain = [m for m in res["methods"] if "tree" not in m]
    base = next(m["label"] for m in chain if m["key"] is None)
    cac = [m["label"] for m in chain if m["key"] == "cactus" and m["params"].get("delta") in (0.75, 1.0)]
    pool = lossless_labels(res)
    if len(pool) < 2:
        raise ValueError(f"first_design_clustered: a pooled lossless reference needs two lossless runs, got {pool}")
    ids = [r["id"] for r in recs[base]]
    for lab in [*cac, *pool]:
        if [r["id"] for r in recs[lab]] != ids:
            raise ValueError(f"first_design_clustered: {lab!r}'s records are not the verifier alone's problems")
    keys = question_keys(recs[base])

    def acc(lab):
        return np.array([float(r["correct"]) for r in recs[lab]])

    refs = {"verifier alone": ([base], acc(base)),
            "pooled lossless": (pool, np.mean([acc(lab) for lab in pool], axis=0))}
    parts = [{"method": m, "reference": name, "reference_methods": labs, "reference_accuracy": float(y.mean()),
              "method_accuracy": float(acc(m).mean()), **clustered_difference(acc(m), y, keys)}
             for m in cac for name, (labs, y) in refs.items()]
    margin = NI_MARGIN_POINTS / 100
    return {"what": "claim 10 (Cactus matches SpS on task score) on the first eval design, lenient metric: "
                    "Cactus minus the verifier alone and minus the pooled lossless runs, 95% percentile bootstrap "
                    "resampling whole distinct questions (paper_repro/table_h_eval.py, first_design_clustered)",
            "source": "paper_repro/results/eval/eval.json", "task": res["config"]["task"], "metric": "lenient",
            "questions": len(set(keys)), "runs": len(keys), "n_boot": CLUSTER_BOOT, "seed": CLUSTER_SEED,
            "level": CLUSTER_LEVEL, "margin": margin, "reach_factor": REACH_FACTOR, "parts": parts,
            "verdict": clustered_verdict(parts, margin, scope="the first eval design")}


def _first_design_score_claims(res: dict, which: str, cac: list[str], paper: str, metrics: dict) -> list[Claim]:
    """Claim 10 ("Cactus matches SpS on task score") on a first-design eval. Primary: the lenient metric against
    the verifier alone and the pooled lossless runs, intervals resampling whole distinct questions
    (``first_design_clustered``), judged by ``clustered_verdict`` and worded as the first design's reading (eval_v3
    pending). Secondary (same runs): strict-match against SpS over problem-runs, "out of reach" when SpS's
    strict-match accuracy is not above ``REACH_FACTOR`` x the margin (no loss could reach "differs")."""
    c = res["config"]
    cl = first_design_clustered(res)
    g, runs, margin = cl["questions"], cl["runs"], cl["margin"]
    m_pts, reach_pts = 100 * margin, 100 * REACH_FACTOR * margin
    sc = (f"the first eval design: {SCOPE_MODEL}, k = {c['k']}, task {c['task']}, {runs} problem-runs of {g} distinct "
          f"questions, one decode each ({which})")
    parts = cl["parts"]
    v = clustered_verdict(parts, margin, scope=sc)
    pool = next(p["reference_methods"] for p in parts if p["reference"] == "pooled lossless")
    refs = dict.fromkeys((p["reference"], p["reference_accuracy"]) for p in parts)
    reachable = all(a > REACH_FACTOR * margin for _, a in refs)
    ours = "; ".join(f"{p['method']} minus {p['reference']} "
                     f"{_pts(Interval(p['estimate'], p['low'], p['high'], g))}" for p in parts)
    ours += (" (reference accuracies: " + ", ".join(f"{name} {100 * a:.1f}%" for name, a in refs) + "; "
             + (f"each above {reach_pts:g} points, twice the margin: every verdict reachable)" if reachable else
                f"not all above {reach_pts:g} points, twice the margin: 'differs' unreachable)"))
    ours += f"; the first design's reading: {pending_text()}"
    claim = ("task scores: Cactus (delta = 0.75, 1.0) matches the verifier's accuracy (non-inferiority against the "
             f"verifier alone and against the pooled lossless runs: not worse by more than {m_pts:g} points)")
    how = (f"`cactus-theory eval`, first design: task {c['task']} ({runs} problem-runs of {g} distinct questions, one "
           f"decode each, chat template), k = {c['k']}, {_sampling(c)}; accuracy by lenient extraction (last "
           "\"answer\", else \"=\", else last integer); each part the mean over problem-runs of Cactus minus a "
           f"reference: the verifier alone, or the pooled lossless runs ({', '.join(pool)}; per problem the mean over "
           f"them); 95% percentile bootstrap resampling whole distinct questions ({cl['n_boot']:,} resamples, numpy "
           f"default_rng seed {cl['seed']}; results/eval/{CLUSTERED.name})")
    decision = (f"the first design's reading: consistent (on this design) if the lower end of every part's 95% "
                f"interval lies above -{m_pts:g} points (non-inferiority, one-sided alpha 0.025); differs if some "
                f"part's upper end lies below -{m_pts:g}; else inconclusive; out of reach if a reference accuracy is "
                f"not above {reach_pts:g} points (twice the margin: 'differs' unreachable)")
    family = (f"{len(parts)} parts ({len(cac)} rules x 2 references): an intersection-union test (each part at "
              "one-sided 0.025, all must pass): no adjustment")
    detail = (f"the first design's reading, not the answer: one decode per problem on {g} distinct questions, so "
              f"intervals over problems understate the noise; {pending_text()}; accuracy on an {c['task']} task with a 135M "
              "verifier, not GSM8K / GPQA with Qwen3")
    out = [Claim(key="main-scores-cactus", claim=claim, ref="main table (scores)", kind="paper", how=how, ours=ours,
                 verdict=v, paper=paper, scope=_scoped(v, sc), detail=detail, source=NAME, role="primary",
                 units=f"{g} distinct questions ({runs} problem-runs)", decision=decision, family=family)]
    st = metrics.get("strict")
    if st:
        n = c["problems"]
        sps = next(m["label"] for m in res["methods"] if m["key"] == "sps" and "tree" not in m)
        s_acc = res["summary"][sps]["strict_accuracy"]
        sparts = [(f"{m} minus SpS {_pts(_iv(st['diffs'][m], n))} ({_p(st['diffs'][m])})", _iv(st["diffs"][m], n))
                  for m in cac]
        reach = s_acc > REACH_FACTOR * margin
        sv = all_of(interval_verdict(iv, above=-margin, scope=sc) for _, iv in sparts) if reach else "out of reach"
        sours = "; ".join(t for t, _ in sparts) + (
            "" if reach else f"; SpS's strict-match accuracy is {100 * s_acc:.1f}%, not above {reach_pts:g} points "
            "(twice the margin): 'differs' is unreachable, so this metric gives no verdict")
        out.append(Claim(key="main-scores-cactus", claim=claim, ref="main table (scores)", kind="paper",
                         how=("the same runs; accuracy by strict-match (the integer after \"answer\"), Cactus minus "
                              "SpS; 95% paired percentile bootstrap over problem-runs (not clustered by question)"),
                         ours=sours, verdict=sv, paper=paper, scope=_scoped(sv, sc), source=NAME, role="same runs",
                         units=f"{n} problem-runs", decision=decision))
    return out


def claims(res: dict, which: str) -> list[Claim]:
    """Checks of the paper's main-table statements; each is judged by ``interval_verdict`` on its 95%
    interval (over problems, or batches for the wall clock) and says which it is (``role``): step h's
    300-problem eval is the primary check of acceptance, task score and wall clock (batch 32); steps e / f
    add a secondary check of the same statements. Multi-part statements take the weakest part
    (``all_of``: an intersection-union test, no multiplicity adjustment)."""
    from cactus_theory.lm.experiments.eval import comparisons, speedup_interval

    S, c = res["summary"], res["config"]
    n = c["problems"]
    sc = f"{SCOPE_MODEL}, k = {c['k']}, task {c['task']}, {n} problems ({which})"
    units = f"{n} problems"
    how = (f"`cactus-theory eval`: task {c['task']} ({n} problems, chat template), k = {c['k']}, "
           f"{_sampling(c)}; 95% paired percentile bootstrap over problems")
    chain = [m for m in res["methods"] if "tree" not in m]  # the paper's claims are about chains; tree rows aside
    lab = {m["key"]: m["label"] for m in chain if m["key"] not in ("cactus", None)}
    cac = [m["label"] for m in chain if m["key"] == "cactus" and m["params"].get("delta") in (0.75, 1.0)]
    sps = lab["sps"]
    lossy = ([lab["tas"]] if "tas" in lab else []) + cac
    comp = comparisons(res)
    fam = (f"accuracy vs SpS: the {len(comp['family'])} comparisons of the eval table (every method against SpS); "
           "Holm-adjusted p-values printed; the non-inferiority parts form an intersection-union test (each part "
           "at one-sided 0.025, all must pass): no adjustment")
    margin = NI_MARGIN_POINTS / 100

    def make(key, claim, ref, how_, parts, paper, detail="", kind="paper", role="primary", decision="", family="",
             above=0.0):
        v = all_of(interval_verdict(iv, above=above, scope=sc) for _, iv in parts) if parts else "out of reach"
        ours = "; ".join(text for text, _ in parts) or "-"
        return Claim(key=key, claim=claim, ref=ref, kind=kind, how=how_, ours=ours, verdict=v,
                     paper=paper if kind == "paper" else "", scope=_scoped(v, sc), detail=detail, source=NAME,
                     role=role, units=units if parts else "", decision=decision, family=family)

    out = []
    # -- task score, one paper statement per claim
    ni = (f"consistent (on this task) if the lower end of every part's 95% interval lies above "
          f"-{NI_MARGIN_POINTS:g} points (non-inferiority, one-sided alpha 0.025); differs if an upper end lies below "
          f"-{NI_MARGIN_POINTS:g}; else inconclusive")
    metrics = comp["metrics"]
    cac_paper = (f"GSM8K: SpS {MAIN_TABLE['SpS']['GSM8K'][0]}, Cactus 0.75 {MAIN_TABLE['Cactus delta=0.75']['GSM8K'][0]}, "
                 f"1.0 {MAIN_TABLE['Cactus delta=1.0']['GSM8K'][0]}; GPQA: SpS {MAIN_TABLE['SpS']['GPQA'][0]}, "
                 f"Cactus 0.75 / 1.0 {MAIN_TABLE['Cactus delta=0.75']['GPQA'][0]}")
    if cac and "lenient" in metrics and "pooled_lossless" in metrics["lenient"]:
        out += _first_design_score_claims(res, which, cac, cac_paper, metrics)
    out.append(Claim(key="main-scores-tas-gpqa", claim="TAS loses accuracy on GPQA (Qwen3-8B verifier)",
                     ref="GPQA with Qwen3-8B", kind="paper", how="not measurable here", ours="-",
                     verdict="out of reach", paper=OTHER["gpqa_8b_tas"], source=NAME,
                     detail="GPQA and a Qwen3-8B verifier need the dataset and a GPU; our arithmetic task is the "
                            "analogue of GSM8K, where the paper has TAS above SpS (results we derived: TAS on the "
                            "arithmetic task)"))
    if "tas" in lab and "strict" in metrics:
        t = lab["tas"]
        for metric, role in (("strict", "primary"), ("lenient", "same runs")):
            D = metrics[metric]["diffs"]
            d = D[t]
            text = f"TAS minus SpS {_pts(_iv(d, n))} ({_p(d)})"
            pl = metrics[metric].get("pooled_lossless")
            if metric == "lenient":
                noise = D.get("verifier alone")
                text += ("; superiority is not established after Holm" if d["holm"] >= 0.05 else "")
                if noise is not None:
                    text += f"; the pure-noise comparison verifier alone minus SpS is {_pts(_iv(noise, n))}"
                if pl is not None:
                    text += (f"; SpS {100 * pl['each'][sps]:.1f}% sits low among the lossless runs ("
                             + ", ".join(f"{100 * v:.1f}" for v in pl["each"].values())
                             + f"; pooled {100 * pl['estimate']:.1f} [{100 * pl['low']:.1f}, {100 * pl['high']:.1f}])")
            out.append(make("tas-arith", "TAS does not lose accuracy against SpS on an arithmetic task (the analogue "
                            "of GSM8K, where the paper has TAS 92.87 vs SpS 91.89; not of GPQA): non-inferiority, "
                            f"margin {NI_MARGIN_POINTS:g} points", "derived from the main table's GSM8K column",
                            f"{how}; accuracy by " + ("strict-match" if metric == "strict" else "lenient extraction"),
                            [(text, _iv(d, n))], "",
                            f"an {c['task']} task with a 135M verifier", kind="derived", role=role, decision=ni,
                            family=fam, above=-margin))
    # -- acceptance
    parts = []
    for m in lossy:
        a = _iv(S[m]["al_diff_vs_sps"], n)
        r = _iv(S[m]["rej_vs_sps"], n)
        parts += [(f"{m}: AL {S[m]['al'][0]:.2f} vs SpS {S[sps]['al'][0]:.2f} (difference {a.estimate:+.3f} "
                   f"[{a.lo:+.3f}, {a.hi:+.3f}])", a),
                  (f"Rej {100 * r.estimate:+.0f}% [{100 * r.lo:+.0f}, {100 * r.hi:+.0f}]", _neg(r))]
    out.append(make("main-acceptance", "TAS and Cactus (delta = 0.75, 1.0) accept more drafts than SpS: higher AL, "
                    "fewer rejections", "main table (AL, Rej)", how, parts,
                    f"GSM8K, m = 20: SpS {MAIN_TABLE['SpS']['GSM8K'][1]}, TAS {MAIN_TABLE['TAS']['GSM8K'][1]}, "
                    f"Cactus 0.75 {MAIN_TABLE['Cactus delta=0.75']['GSM8K'][1]}, Cactus 1.0 "
                    f"{MAIN_TABLE['Cactus delta=1.0']['GSM8K'][1]}; Rej -32% to -50%",
                    "AL: tokens per verifier call, bonus included; k = 4 (paper m = 20): directions comparable, "
                    "sizes not",
                    decision=f"each of the {len(parts)} parts (AL minus SpS's > 0, Rej < 0, per rule) must have its "
                             "95% interval on the claimed side of 0; the weakest part decides",
                    family=f"a conjunction of {len(parts)} one-sided claims (intersection-union test): no adjustment"))
    # -- wall clock, batch 32 (the eval's protocol: every batch decoded by every method back to back)
    c1 = next((m for m in cac if m.endswith("=1")), None)
    base = next(m["label"] for m in res["methods"] if m["key"] is None)
    secs = res.get("seconds") or {}
    if c1 is not None and c1 in secs and base in secs and len(secs[c1]) == len(secs[base]):
        lr = speedup_interval(secs[c1], secs[base])
        iv = Interval(lr.estimate, lr.lo, lr.hi, lr.n)
        wsc = f"{SCOPE_MODEL} + embedded draft, this CPU, batch {c['batch_size']}, k = {c['k']}"
        v = interval_verdict(iv, scope=wsc)
        out.append(Claim(
            key="wall-clock", claim="Cactus delta = 1.0 decodes faster than the verifier alone",
            ref="wall-clock experiment", kind="paper",
            how=(f"protocol batch {c['batch_size']}: the eval's {lr.n} batches of {c['batch_size']} problems, each decoded "
                 "by every method back to back; per batch log(tokens/s ratio), 95% t-interval on their mean "
                 f"({lr.n - 1} degrees of freedom)"),
            ours=(f"geometric-mean speedup {math.exp(iv.estimate):.2f}x [{math.exp(iv.lo):.2f}, {math.exp(iv.hi):.2f}] "
                  f"(pooled tokens/s ratio {S[c1]['speedup'][0]:.2f}x)"),
            verdict=v, paper=OTHER["speedup"], scope=wsc if v in ("consistent", "inconclusive", "differs") else "",
            detail="CPU timings on a shared machine; the A100 / vLLM figure itself is out of reach here",
            source=NAME, units=f"{lr.n} batches",
            decision="consistent if the 95% interval of the speedup lies above 1x, differs if below, else inconclusive"))
    else:
        out.append(make("wall-clock", "Cactus delta = 1.0 decodes faster than the verifier alone",
                        "wall-clock experiment", how, [], OTHER["speedup"],
                        "no per-batch timings of Cactus delta = 1 and the verifier alone in this eval"))
    ab = res.get("ablation") or {}
    abc = "at similar acceptance, Cactus distorts the verifier less than interpolation"
    if ab.get("status") == "matched":
        d = _iv(ab["cactus_minus_interpolation"], n)
        out.append(make("interpolation-ablation", abc, "interpolation ablation",
                        how + f"; Cactus delta = {ab['delta']:.3g} matched to interpolation alpha = 0.9's AL on the "
                        "first batch; accuracy, Cactus minus interpolation", [(f"Cactus minus interpolation {_pts(d)}", d)],
                        OTHER["interpolation"], decision="consistent if the 95% interval lies above 0"))
    elif ab.get("status") != "unreachable":
        out.append(make("interpolation-ablation", abc, "interpolation ablation", how, [], OTHER["interpolation"],
                        f"the interpolation ablation was not run in this eval ({which})"))
    else:
        lab_ab = ab["method"]["label"]
        out.append(make("interpolation-ablation", abc, "interpolation ablation", how, [], OTHER["interpolation"],
                        f"no Cactus budget reaches interpolation alpha = 0.9's AL ({ab['target_al']:.2f}); the largest "
                        f"Cactus AL (delta = {ab['delta']:.4g}) is {ab['summary'][lab_ab]['al'][0]:.2f}"))
    return out


def _wall_text(w: dict) -> str:
    e = lambda v: f"{v[0]:.2f}x [{v[1]:.2f}, {v[2]:.2f}]" if v else "-"  # noqa: E731
    return (f"time per problem {e(w.get('time_per_problem'))}, tokens/s {e(w.get('tokens_per_s_ratio'))}, "
            f"time at equal output length {e(w.get('length_adjusted'))}")


def claims_v2(res: dict) -> list[Claim]:
    """The main-table statements read from a format-2 (replicated) eval by its pre-registered protocol: the
    accuracy claims by the protocol's non-inferiority rule against the pooled lossless runs
    (``replicated.claim_parts``, ``claims.ledger.noninferiority_verdict``: every claim rule x every task, one-sided
    non-inferiority p-values printed, out of reach on a task whose reference accuracy is not above
    ``min_reference_points``), acceptance (AL and Rej against SpS, per task), the wall clock by the protocol's
    primary wall-clock metric (per task, t over full batches)."""
    from cactus_theory.claims.ledger import noninferiority_verdict
    from cactus_theory.lm.experiments.replicated import claim_parts

    a = res["protocol"]["content"]["analysis"]
    c, S = res["config"], res["summary"]
    ts = list(S["tasks"])
    m_pts = a["margin_points"]
    sc = f"{SCOPE_MODEL}, k = {c['k']}, tasks {' and '.join(ts)}"
    units = f"{c['questions']} questions x {c['replicates']} replicates per task, {len(ts)} tasks"
    how = (f"`cactus-theory eval` (protocol {res['protocol']['path']}, sha256 {res['protocol']['sha256'][:12]}): tasks "
           f"{', '.join(ts)} ({c['questions']} distinct questions each, {c['replicates']} decodes per question and "
           f"method, seeds per (question, replicate, method)), k = {c['k']}, {_sampling(c)}; per question the "
           "method's mean minus the pooled lossless mean, 95% Student-t interval over questions")
    dec = a["decision_rules"]
    decision = f"{dec['part']}; claim: {dec['claim']}"
    out = []

    def ni_claim(key, claim, ref, kind, paper, metric, role):
        parts = claim_parts(res, a["claims"][key]["rules"], metric)
        refs = [p[3] for p in parts]
        v = noninferiority_verdict([p[2] for p in parts], scope=sc, references=refs,
                                   min_reference=a["min_reference_points"] / 100) if parts else "out of reach"
        ours = "; ".join(f"{lab} on {t}: {100 * ni.estimate:+.1f} [{100 * ni.lo:+.1f}, {100 * ni.hi:+.1f}] points vs "
                         f"pooled lossless {100 * r:.1f}% (non-inferiority p = {ni.p_noninferior:.2g}"
                         + (f", inferiority p = {ni.p_inferior:.2g}" if ni.hi < -ni.margin else "") + ")"
                         for t, lab, ni, r in parts) or "-"
        name = "lenient extraction" if metric == "lenient" else "strict-match"
        rel = "; ".join(f"{m_pts / r:.0f}% of the reference on {t}" for t, r in {t: r for t, _, _, r in parts}.items()
                        if r > 0)
        detail = f"margin {m_pts:g} points absolute ({rel}): {a['margin_justification']}"
        return Claim(key=key, claim=claim, ref=ref, kind=kind, how=f"{how}; accuracy by {name}", ours=ours, verdict=v,
                     paper=paper if kind == "paper" else "", scope=_scoped(v, sc), detail=detail, source=NAME,
                     role=role, units=units, decision=decision, family=a["family"])

    cac_paper = (f"GSM8K: SpS {MAIN_TABLE['SpS']['GSM8K'][0]}, Cactus 0.75 {MAIN_TABLE['Cactus delta=0.75']['GSM8K'][0]}, "
                 f"1.0 {MAIN_TABLE['Cactus delta=1.0']['GSM8K'][0]}; GPQA: SpS {MAIN_TABLE['SpS']['GPQA'][0]}, "
                 f"Cactus 0.75 / 1.0 {MAIN_TABLE['Cactus delta=0.75']['GPQA'][0]}")
    prim = a["primary_metric"]
    other = "strict" if prim == "lenient" else "lenient"
    for metric, role in ((prim, "primary"), (other, "same runs")):
        out.append(ni_claim("main-scores-cactus", "task scores: Cactus (delta = 0.75, 1.0) matches the verifier's "
                            f"accuracy (non-inferiority against the lossless runs: not worse by more than {m_pts:g} "
                            "points, on every task)", "main table (scores)", "paper", cac_paper, metric, role))
    out.append(Claim(key="main-scores-tas-gpqa", claim="TAS loses accuracy on GPQA (Qwen3-8B verifier)",
                     ref="GPQA with Qwen3-8B", kind="paper", how="not measurable here", ours="-",
                     verdict="out of reach", paper=OTHER["gpqa_8b_tas"], source=NAME,
                     detail="GPQA and a Qwen3-8B verifier need the dataset and a GPU (results we derived: TAS on the "
                            "eval's tasks)"))
    tas_key = "tas-scores" if "tas-scores" in a["claims"] else "tas-arith"  # eval_v3 / eval_v2
    for metric, role in ((prim, "primary"), (other, "same runs")):
        out.append(ni_claim(tas_key, "TAS does not lose accuracy against the lossless runs (non-inferiority, "
                            f"margin {m_pts:g} points, on every task of the eval)", "derived from the main table's GSM8K "
                            "column", "derived", "", metric, role))
    if "aa-equivalence" in res.get("claims", {}):
        out.append(aa_claim(res, sc, units))
    # acceptance, per task
    lab = {m["key"]: m["label"] for m in res["methods"] if not m.get("tree") and m["key"] not in ("cactus", None)}
    cac = [m["label"] for m in res["methods"] if m["key"] == "cactus" and not m.get("tree")
           and m["params"].get("delta") in (0.75, 1.0)]
    lossy = ([lab["tas"]] if "tas" in lab else []) + cac
    parts = []
    for t in ts:
        M = S["tasks"][t]["methods"]
        n = S["tasks"][t]["questions"]
        for m in lossy:
            d, r = M[m]["al_diff_vs_sps"], M[m]["rej_vs_sps"]
            parts += [(f"{m} on {t}: AL {M[m]['al'][0]:.2f} (difference {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}])",
                       Interval(d[0], d[1], d[2], n)),
                      (f"Rej {100 * r[0]:+.0f}% [{100 * r[1]:+.0f}, {100 * r[2]:+.0f}]", Interval(-r[0], -r[2], -r[1], n))]
    v = all_of(interval_verdict(iv, scope=sc) for _, iv in parts) if parts else "out of reach"
    out.append(Claim(key="main-acceptance", claim="TAS and Cactus (delta = 0.75, 1.0) accept more drafts than SpS: "
                     "higher AL, fewer rejections", ref="main table (AL, Rej)", kind="paper",
                     how=how.replace("95% Student-t interval over questions", "95% percentile bootstrap over questions"),
                     ours="; ".join(x for x, _ in parts) or "-", verdict=v,
                     paper=(f"GSM8K, m = 20: SpS {MAIN_TABLE['SpS']['GSM8K'][1]}, TAS {MAIN_TABLE['TAS']['GSM8K'][1]}, "
                            f"Cactus 0.75 {MAIN_TABLE['Cactus delta=0.75']['GSM8K'][1]}, Cactus 1.0 "
                            f"{MAIN_TABLE['Cactus delta=1.0']['GSM8K'][1]}; Rej -32% to -50%"),
                     scope=_scoped(v, sc), detail="AL: tokens per verifier call, bonus included; k = 4 (paper m = 20): "
                     "directions comparable, sizes not", source=NAME, units=units,
                     decision=f"each of the {len(parts)} parts (AL minus SpS's > 0, Rej < 0, per rule and task) must "
                              "have its 95% interval on the claimed side of 0; the weakest part decides",
                     family=f"a conjunction of {len(parts)} one-sided claims (intersection-union test): no adjustment"))
    if "wall-clock" not in a["claims"]:  # eval_v3: read from the interleaved benchmark, never from the batches
        out.append(wall_clock_claim_v3(res, wall_clock_summary()))
        out.append(make_missing_ablation(res))
        return out
    # wall clock: the protocol's primary wall-clock metric, per task
    wkey = {"time_per_problem": "time_per_problem", "tokens_per_s": "tokens_per_s_ratio",
            "length_adjusted": "length_adjusted"}[a["wall_clock_primary"]]
    c1 = a["claims"]["wall-clock"]["rules"][0]
    wsc = f"{SCOPE_MODEL} + embedded draft, this CPU, batch {c['batch_size']}, k = {c['k']}, tasks {' and '.join(ts)}"
    wparts = []
    for t in ts:
        w = S["tasks"][t]["wall_clock"]
        row = w["methods"].get(c1, {})
        if wkey in row:
            e = row[wkey]
            wparts.append((f"{t} ({w['batches']} full batches): {_wall_text(row)}",
                           Interval(math.log(e[0]), math.log(e[1]), math.log(e[2]), w["batches"])))
    v = all_of(interval_verdict(iv, scope=wsc) for _, iv in wparts) if wparts else "out of reach"
    out.append(Claim(key="wall-clock", claim="Cactus delta = 1.0 decodes faster than the verifier alone",
                     ref="wall-clock experiment", kind="paper",
                     how=(f"every full batch of {c['batch_size']} rows decoded by every method back to back in a random "
                          f"order; primary metric {a['wall_clock_primary'].replace('_', ' ')} (the verifier alone's over "
                          "the method's, same rows), 95% t-interval over full batches of the log ratio; tokens/s and the "
                          "time at equal output length beside it"),
                     ours="; ".join(x for x, _ in wparts) or "-", verdict=v, paper=OTHER["speedup"],
                     scope=wsc if v in ("consistent", "inconclusive", "differs") else "",
                     detail="CPU timings on a shared machine; the A100 / vLLM figure itself is out of reach here",
                     source=NAME, units=f"full batches per task ({len(ts)} tasks)",
                     decision=a["decision_rules"]["wall_clock"]))
    out.append(make_missing_ablation(res))
    return out


AA_VERDICT = {"equivalent within the margin": "holds", "differs": "differs", "inconclusive": "inconclusive"}


def aa_claim(res: dict, sc: str, units: str) -> Claim:
    """eval_v3's A/A claim (``replicated.aa_equivalence``): the two lossless methods agree. A check of our own loop
    and sampler: 'equivalent within the margin' reads "holds", an interval that excludes 0 "differs"."""
    aa = res["claims"]["aa-equivalence"]
    a = res["protocol"]["content"]["analysis"]
    base, sps = aa["methods"]
    m = 100 * aa["margin"]
    return Claim(key="aa-equivalence", claim=f"the two lossless methods ({base}, {sps}) have the same accuracy: "
                 f"equivalent within +-{m:g} points, no difference detected", ref="Theorem 1 (SpS is lossless)",
                 kind="code", how=(f"per question (verifier alone's mean of its runs) minus (SpS's), pooled over the "
                                   f"tasks, {aa['questions']:,} questions, 95% Student-t interval over questions"),
                 ours=(f"{100 * aa['estimate']:+.2f} [{100 * aa['low']:+.2f}, {100 * aa['high']:+.2f}] points: "
                       f"{aa['verdict']}"),
                 verdict=AA_VERDICT[aa["verdict"]], source=NAME, units=units, scope=sc,
                 decision=a["decision_rules"]["aa_equivalence"],
                 family="its own claim (the protocol's A/A equivalence), two one-sided tests at 0.025")


def wall_clock_summary() -> dict | None:
    """The committed wall-clock benchmark of eval_v3 (``cactus-theory eval --wall-clock``), or None."""
    path = FULL_V3.parent / "wall_clock_summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def wall_clock_claim_v3(res: dict, w: dict | None) -> Claim:
    """eval_v3's wall-clock claim from its interleaved benchmark (``lm.experiments.wallclock``): the time per problem
    of Cactus delta = 1 over the verifier alone's, pooled over the tasks, t-interval over rounds; "not run yet" reads
    inconclusive, never a number from the eval's batches."""
    a = res["protocol"]["content"]["analysis"]
    base = dict(key="wall-clock", claim="Cactus delta = 1.0 answers faster than the verifier alone",
                ref="wall-clock experiment", kind="paper", paper=OTHER["speedup"], source=NAME,
                decision=a["wall_clock"])
    if w is None:
        return Claim(**base, how="the protocol's interleaved benchmark (`cactus-theory eval --wall-clock`, a quiet "
                     "machine)", ours="not run yet", verdict="inconclusive", detail="the eval's batch seconds are "
                     "reported in section h as such, never as this claim's evidence")
    c = w["claim"]
    wsc = f"{SCOPE_MODEL} + embedded draft, {w['cpu']}, batch 1, one thread, tasks {' and '.join(w['tasks'])}"
    rows = "; ".join(f"{name}: {_wall_text({'time_per_problem': _trio(m['time_per_problem']), 'tokens_per_s_ratio': _trio(m['tokens_per_s_ratio'])})}"
                     for name, sc in w["scopes"].items() for lab, m in sc["methods"].items() if lab == c["method"])
    return Claim(**base, how=(f"{w['rounds']} interleaved rounds of every primary method on the first {w['questions']} "
                              "questions of each task (the eval's row seeds), random order per round; time per problem "
                              "(the verifier alone's seconds over the method's, same rows), 95% t-interval over rounds of "
                              "the log ratio; tokens/s beside it"),
                 ours=rows, verdict=c["verdict"], scope=wsc if c["verdict"] != "out of reach" else "",
                 units=f"{w['rounds']} rounds", detail=f"verifier alone's drift over rounds "
                 f"{w['scopes']['pooled']['drift_verifier_alone']:.3f} (max / min tokens/s)")


def _trio(r: dict) -> list[float]:
    return [r["ratio"], *r["ci"]]


def make_missing_ablation(res: dict) -> Claim:
    return Claim(key="interpolation-ablation", claim="at similar acceptance, Cactus distorts the verifier less than "
                 "interpolation", ref="interpolation ablation", kind="paper", how="not run", ours="-",
                 verdict="out of reach", paper=OTHER["interpolation"], source=NAME,
                 detail="the replicated eval does not run the interpolation ablation (the first eval design's "
                        "`run_ablation`)")


def lawtest_claims(lt: dict) -> list[Claim]:
    """The samplers' laws on the real LM (a check of our code; exact laws as the reference). Only tests
    with at least two pooled bins count (``testable``)."""
    ok_step = [r for r in lt["step"] if testable(r)]
    untestable = len(lt["step"]) - len(ok_step)
    rej = [r for r in ok_step if r["reject"]]
    tvs = [_own_tv(r, lt) for r in ok_step]
    loop = lt["loop"]
    h, g = loop["sps_vs_verifier_3_tokens"], loop["cactus_second_token"]
    ctl = [r for r in lt["control"] if testable(r) and r["tv_between_laws"] > _own_tv(r, lt)]
    ok = bool(ok_step) and not rej and not h["reject"] and not g["reject"] and all(r["reject"] for r in ctl)
    tested = list(dict.fromkeys(r["method"] for r in lt["step"]))  # the rules whose samplers were tested, in order
    return [Claim(
        key="samplers-real-lm", claim=f"the samplers of the {len(tested)} rules tested ({', '.join(tested)}) emit "
        "their exact one-step law on the real LM, and SpS's first 3 tokens through the decode loop have the "
        "verifier's law", ref="sampler.py / Theorem 1", kind="code",
        how=(f"goodness of fit of {lt['step'][0]['draws']} verified tokens per (rule, prompt), "
             f"{len({r['prompt'] for r in lt['step']})} prompts, vs exact.induced_distribution (verification step); SpS "
             f"vs verifier alone, {loop['draws']} sequences each through the decode loop (homogeneity, 3 tokens); "
             f"alpha = {lt['alpha']:g} per test; power on each test's own pooled bins"),
        ours=(f"{len(rej)}/{len(ok_step)} testable tests reject"
              + (f" (detectable TV {min(tvs):.3f} to {max(tvs):.3f}); " if tvs else "; ") +
              f"{untestable} not testable (one pooled bin: no power), not counted; loop: SpS vs verifier p = "
              f"{h['pvalue']:.3g}, Cactus second token p = {g['pvalue']:.3g}; control (a wrong law) rejected "
              f"{sum(r['reject'] for r in ctl)}/{len(ctl)} where detectable"),
        verdict=exact_verdict(ok) if ok_step else "out of reach", source=NAME, units=f"{len(ok_step)} testable tests",
        detail=("not tested here: " + ", ".join(lt["untested"])) if lt.get("untested") else "",
        decision="holds if no testable test rejects at alpha = 1e-4 and every detectable control rejects",
        family=f"the {len(ok_step) + 2} testable tests, each at 1e-4 (Bonferroni bound {(len(ok_step) + 2) * lt['alpha']:.3g})")]


# -- the step -------------------------------------------------------------------------------------

def markdown(reduced: dict, full: dict | None) -> str:
    from cactus_theory.lm.experiments.eval import format_table, stale_methods

    parts = []
    for res, name in ((full, "full run (`make eval`)"), (reduced, "reduced run (`make repro`)")):
        if res is None:
            continue
        c = res["config"]
        parts += [f"Ours, {name}: task `{c['task']}` ({c['problems']} problems, chat template, exact match), "
                  f"{res.get('pair_name', c['pair'])}, k = {c['k']}, up to {c['max_new_tokens']} new tokens, "
                  f"{_sampling(c)}. Cells: estimate [95% interval]; accuracy in % (Wilson interval); "
                  "difference vs SpS in points (paired percentile bootstrap over problems; McNemar p, raw and "
                  "Holm-adjusted over the family below); AL = tokens per verifier call (bonus included); acceptance "
                  "= accepted / drafted; Rej = rejected drafts per emitted token vs SpS (intervals: bootstrap over "
                  "problems); step KL = mean exact KL(h_alg || q) (nats); NLL = verifier NLL (nats/token); speedup "
                  "over the verifier alone: geometric mean over batches of the per-batch tokens/s ratio, 95% "
                  "t-interval over batches (n = batches, not problems).", "", format_table(res), ""]
        if res is (full or reduced):
            parts += [margin_text(res), ""]
    parts += [f"Paper ({SETUP}); cells: score / AL / Rej.", "", main_table_markdown(), ""]
    lt = (full or {}).get("lawtests") or reduced.get("lawtests")
    if lt:
        parts += ["Distribution tests on the real LM (rows 'verification step': `sampler.verify` on p, q computed "
                  "once per prompt; rows 'decode loop': through `speculative_generate` / `autoregressive_generate`).",
                  "", lawtest_table(lt, stale=stale_methods(full or reduced)), ""]
    return "\n".join(parts)


def markdown_v2(reduced: dict, full: dict) -> str:
    """Section h with a format-2 full run: its report (``replicated.format_report``), the reduced run of the first
    design beside it, the paper's table, the distribution tests."""
    from cactus_theory.lm.experiments.eval import format_table, stale_methods
    from cactus_theory.lm.experiments.replicated import format_report

    c = full["config"]
    parts = [f"Ours, full run (`make eval`): {full.get('pair_name', c['pair'])}; the replicated eval of the "
             "pre-registered protocol. Cells: estimate [95% interval]; accuracy in % (t-interval over questions of "
             "the per-question mean of the replicates); difference vs the pooled lossless runs in points, with the "
             "one-sided non-inferiority p-value at the margin, raw and Holm-adjusted over the family; ratios to the "
             "verifier alone: t-intervals over full batches.", "", format_report(full), ""]
    here = Path(full.get("_source", FULL)).parent
    for name, what in (("wall_clock.md", "The wall clock (the protocol's interleaved benchmark, `cactus-theory eval "
                        "--wall-clock`; the claim's evidence):"),
                       ("sweep.md", "The secondary sweep (`cactus-theory eval --sweep`; estimates, Holm for "
                        "'differs', never 'consistent'):")):
        if (here / name).exists():
            parts += [what, "", (here / name).read_text().strip(), ""]
    rc = reduced["config"]
    parts += [f"Reduced run (`make repro`; the first eval design: one decode per problem, a seed per batch): task "
              f"`{rc['task']}`, {rc['problems']} problems, k = {rc['k']}.", "", format_table(reduced), ""]
    parts += [f"Paper ({SETUP}); cells: score / AL / Rej.", "", main_table_markdown(), ""]
    lt = full.get("lawtests") or reduced.get("lawtests")
    if lt:
        parts += ["Distribution tests on the real LM (rows 'verification step': `sampler.verify` on p, q computed "
                  "once per prompt; rows 'decode loop': through `speculative_generate` / `autoregressive_generate`).",
                  "", lawtest_table(lt, stale=stale_methods(full)), ""]
    return "\n".join(parts)


def run(ctx: Ctx) -> StepResult:
    t0 = time.perf_counter()
    cfg = config(ctx)
    reduced = cached(ctx, NAME, cfg, lambda: compute(ctx, cfg))
    full = full_result(ctx, cfg["pair"])
    if full is not None and full.get("format") == 2:
        return run_v2(ctx, reduced, full, t0)
    main = full or reduced
    from cactus_theory.lm.experiments.eval import format_table, plot_accuracy_vs_al
    from cactus_theory.util.atomic import atomic_write_text

    if full is not None:  # the full run's table, re-rendered under the current rendering rules
        table, md = format_table(full) + "\n", FULL.with_suffix(".md")
        if not md.exists() or md.read_text() != table:
            atomic_write_text(md, table)
        write_clustered(full)

    figs = save_figure(plot_accuracy_vs_al(main), ctx, "fig_h_eval")
    cl = claims(main, "full run" if full else "reduced run")
    lt = main.get("lawtests") or reduced.get("lawtests")
    if lt:
        cl += lawtest_claims(lt)
    data = {"reduced": reduced, "full_used": full is not None,
            "sections": [("h. Task accuracy with intervals (cactus-theory eval)", markdown(reduced, full))]}
    return StepResult(NAME, data, figs, cl, time.perf_counter() - t0)


def run_v2(ctx: Ctx, reduced: dict, full: dict, t0: float) -> StepResult:
    from cactus_theory.lm.experiments.replicated import format_report, plot_accuracy_vs_al
    from cactus_theory.util.atomic import atomic_write_text

    table, md = format_report(full) + "\n", Path(full.get("_source", FULL)).with_suffix(".md")
    if not md.exists() or md.read_text() != table:
        atomic_write_text(md, table)
    figs = save_figure(plot_accuracy_vs_al(full), ctx, "fig_h_eval")
    cl = claims_v2(full)
    lt = full.get("lawtests") or reduced.get("lawtests")
    if lt:
        cl += lawtest_claims(lt)
    data = {"reduced": reduced, "full_used": True, "full_format": 2,
            "sections": [("h. Task accuracy with intervals (cactus-theory eval)", markdown_v2(reduced, full))]}
    return StepResult(NAME, data, figs, cl, time.perf_counter() - t0)


if __name__ == "__main__":
    standalone(run)
