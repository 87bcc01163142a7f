"""Step h: task accuracy of the rules with intervals (a reduced ``cactus-theory eval``) and the
distribution tests on the real LM, beside the paper's GSM8K / GPQA table.

Reduced run (``REDUCED``; about 5 minutes with the batched decoding loop on 2 cores): the first
``problems`` problems of the eval task, the methods of the paper's table (verifier alone, SpS, TAS,
Cactus delta = 0.75 and 1), k = 4, no ablation; the distribution tests for every registry rule
(verification step: 5 prompts x 20,000 draws; decode loop: 1,000 sequences). The full run
(``make eval``: ``paper_repro/results/eval/eval.json``, committed; every rule, the interpolation
ablation) is shown beside it when it was made with the same pair, and the verdicts then come from it
(more problems, narrower intervals). Verdicts follow the 95% intervals (``claims``).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

from cactus_theory.claims import Claim, Interval, all_of, exact_verdict, interval_verdict

from .common import ROOT, Ctx, StepResult, cached, save_figure, standalone
from .lm_runs import get_pair, set_threads
from .paper_numbers import MAIN_TABLE, OTHER, SETUP, main_table_markdown

NAME = "table_h_eval"
FULL = ROOT / "paper_repro" / "results" / "eval" / "eval.json"
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


def _pair(ctx: Ctx):
    pair = get_pair(ctx)
    if pair.tokenizer is None:
        pair = replace(pair, tokenizer=DigitTokenizer())
    return pair


def _pair_id(ctx: Ctx) -> str:
    if ctx.lm.get("pair") is not None:
        return "injected"
    from cactus_theory.lm.eval import pair_id

    from .lm_runs import lm_config

    cfg = lm_config(ctx)
    return ("fast:" if ctx.fast else "") + pair_id(cfg["draft"], cfg["verifier"])


def config(ctx: Ctx) -> dict:
    return {**(FAST if ctx.fast else REDUCED), "seed": ctx.seed, "pair": _pair_id(ctx), "rules": RULES}


def compute(ctx: Ctx, cfg: dict) -> dict:
    from cactus_theory.lm import eval as ev

    set_threads(ctx)
    ecfg = ev.EvalConfig(problems=cfg["problems"], seed=cfg["seed"], k=cfg["k"], max_new_tokens=cfg["max_new_tokens"],
                         batch_size=cfg["batch_size"], pair=cfg["pair"])
    res = ev.evaluate(_pair(ctx), ecfg, ctx.results / "eval_reduced", only=cfg["rules"], ablation=False,
                      lawtests={"prompts": cfg["lawtest_prompts"], "draws": cfg["lawtest_draws"],
                                "loop_draws": cfg["loop_draws"]}, progress=True)
    return ev.slim(res)


def full_result(ctx: Ctx, pair: str) -> dict | None:
    """The committed ``make eval`` result, if it was made with this pair."""
    if ctx.fast or not FULL.exists():
        return None
    res = json.loads(FULL.read_text())
    return res if res.get("config", {}).get("pair") == pair else None


# -- verdicts (the claims ledger: cactus_theory.claims) ----------------------------------------------

def _iv(v, n: int) -> Interval:
    """``[estimate, low, high]`` or a paired-difference dict as an ``Interval`` over ``n`` problems."""
    if isinstance(v, dict):
        return Interval(v["estimate"], v["low"], v["high"], n)
    return Interval(v[0], v[1], v[2], n)


def _neg(iv: Interval) -> Interval:
    return Interval(-iv.estimate, -iv.hi, -iv.lo, iv.n)


def _pts(iv: Interval) -> str:
    return f"{100 * iv.estimate:+.1f} [{100 * iv.lo:+.1f}, {100 * iv.hi:+.1f}] points"


def claims(res: dict, which: str) -> list[Claim]:
    """Checks of the paper's main-table statements (same keys as steps e and f: each is one more check
    of that statement). Each part is judged by ``interval_verdict`` on its 95% interval over problems
    ("consistent" on this model and scale, "inconclusive" when the interval straddles no effect);
    a statement with several parts takes the weakest (``all_of``)."""
    S, c = res["summary"], res["config"]
    n = c["problems"]
    sc = f"{SCOPE_MODEL}, k = {c['k']}, task {c['task']}, {n} problems ({which})"
    how = (f"`cactus-theory eval`: task {c['task']} ({n} problems, chat template, exact match), k = {c['k']}, "
           "T 0.6 / top-k 20 / top-p 0.95; 95% paired bootstrap over problems")
    lab = {m["key"]: m["label"] for m in res["methods"] if m["key"] not in ("cactus", None)}
    cac = [m["label"] for m in res["methods"] if m["key"] == "cactus" and m["params"].get("delta") in (0.75, 1.0)]
    sps = lab["sps"]
    lossy = ([lab["tas"]] if "tas" in lab else []) + cac

    def make(key, claim, ref, how_, parts, paper, detail=""):
        v = all_of(interval_verdict(iv, scope=sc) for _, iv in parts) if parts else "out of reach"
        ours = "; ".join(text for text, _ in parts) or "-"
        return Claim(key=key, claim=claim, ref=ref, kind="paper", how=how_, ours=ours, verdict=v, paper=paper,
                     scope=sc if v == "consistent" else "", detail=detail, source=NAME)

    out = []
    parts = [(f"{m} minus SpS {_pts(_iv(S[m]['diff_vs_sps'], n))} (McNemar p = {S[m]['diff_vs_sps']['pvalue']:.2g})",
              _iv(S[m]["diff_vs_sps"], n)) for m in cac]
    if "tas" in lab:
        d = _iv(S[lab["tas"]]["diff_vs_sps"], n)
        parts.append((f"TAS minus SpS {_pts(d)}", _neg(d)))
    out.append(make("main-scores", "task scores (GSM8K, GPQA strict-match): Cactus matches or beats SpS while TAS "
                    "loses accuracy on GPQA", "main table (scores); GPQA with Qwen3-8B",
                    how + "; parts: Cactus minus SpS > 0, SpS minus TAS > 0", parts,
                    "e.g. GPQA: SpS 40.91, TAS 40.40, Cactus 1.0 45.46; Qwen3-8B: TAS 42.93 -> 38.89",
                    f"accuracy on a {c['task']} task instead of GSM8K / GPQA"))
    parts = []
    for m in lossy:
        a = _iv(S[m]["al_diff_vs_sps"], n)
        r = _iv(S[m]["rej_vs_sps"], n)
        parts += [(f"{m}: AL {S[m]['al'][0]:.2f} vs SpS {S[sps]['al'][0]:.2f} (difference {a.estimate:+.3f} "
                   f"[{a.lo:+.3f}, {a.hi:+.3f}])", a),
                  (f"Rej {100 * r.estimate:+.0f}% [{100 * r.lo:+.0f}, {100 * r.hi:+.0f}]", _neg(r))]
    out.append(make("main-acceptance", "TAS and Cactus (delta = 0.75, 1.0) accept more drafts than SpS: higher AL, "
                    "fewer rejections", "main table (AL, Rej)", how + "; parts: AL minus SpS's > 0, Rej < 0", parts,
                    f"GSM8K, m = 20: SpS {MAIN_TABLE['SpS']['GSM8K'][1]}, TAS {MAIN_TABLE['TAS']['GSM8K'][1]}, "
                    f"Cactus 0.75 {MAIN_TABLE['Cactus delta=0.75']['GSM8K'][1]}, Cactus 1.0 "
                    f"{MAIN_TABLE['Cactus delta=1.0']['GSM8K'][1]}; Rej -32% to -50%",
                    "AL: tokens per verifier call, bonus included; k = 4 (paper m = 20)"))
    c1 = next((m for m in cac if m.endswith("=1")), None)
    if c1 is not None and "speedup" in S[c1]:
        sp = S[c1]["speedup"]
        iv = Interval(sp[0] - 1, sp[1] - 1, sp[2] - 1, n)
        out.append(make("wall-clock", "Cactus delta = 1.0 decodes faster than the verifier alone",
                        "wall-clock experiment", how + "; tokens/s ratio, batch by batch in one run, bootstrap over "
                        "batches", [(f"{sp[0]:.2f}x [{sp[1]:.2f}, {sp[2]:.2f}]", iv)], OTHER["speedup"],
                        "CPU timings on a shared machine are noisy"))
    ab = res.get("ablation") or {}
    if ab.get("status") == "matched":
        d = _iv(ab["cactus_minus_interpolation"], n)
        out.append(make("interpolation-ablation", "at similar acceptance, Cactus distorts the verifier less than "
                        "interpolation", "interpolation ablation",
                        how + f"; Cactus delta = {ab['delta']:.3g} matched to interpolation alpha = 0.9's AL on the "
                        "first batch; accuracy, Cactus minus interpolation", [(f"Cactus minus interpolation {_pts(d)}", d)],
                        OTHER["interpolation"]))
    elif ab.get("status") == "unreachable":
        lab_ab = ab["method"]["label"]
        out.append(make("interpolation-ablation", "at similar acceptance, Cactus distorts the verifier less than "
                        "interpolation", "interpolation ablation", how, [], OTHER["interpolation"],
                        f"no Cactus budget reaches interpolation alpha = 0.9's AL ({ab['target_al']:.2f}); the largest "
                        f"Cactus AL (delta = {ab['delta']:.4g}) is {ab['summary'][lab_ab]['al'][0]:.2f}"))
    return out


def lawtest_claims(lt: dict) -> list[Claim]:
    """The samplers' laws on the real LM (a check of our code; exact laws as the reference)."""
    rej = [r for r in lt["step"] if r["reject"]]
    dtv = max(r["detectable_tv"] for r in lt["step"])
    loop = lt["loop"]
    h, g = loop["sps_vs_verifier_3_tokens"], loop["cactus_second_token"]
    ctl = [r for r in lt["control"] if r["tv_between_laws"] > r["detectable_tv"]]
    ok = not rej and not h["reject"] and not g["reject"] and all(r["reject"] for r in ctl)
    return [Claim(
        key="samplers-real-lm", claim="every rule's sampler emits its exact one-step law on the real LM, and SpS's "
        "first 3 tokens through the decode loop have the verifier's law", ref="sampler.py / Theorem 1", kind="code",
        how=(f"goodness of fit of {lt['step'][0]['draws']} verified tokens per (rule, prompt), "
             f"{len({r['prompt'] for r in lt['step']})} prompts, vs exact.induced_distribution (verification step); SpS "
             f"vs verifier alone, {loop['draws']} sequences each through the decode loop (homogeneity, 3 tokens); "
             f"alpha = {lt['alpha']:g} per test"),
        ours=(f"{len(rej)}/{len(lt['step'])} rejections (detectable TV <= {dtv:.3f}); loop: SpS vs verifier p = "
              f"{h['pvalue']:.3g} (detectable TV {h['detectable_tv']:.3f}), Cactus second token p = {g['pvalue']:.3g}; "
              f"control (a wrong law) rejected {sum(r['reject'] for r in ctl)}/{len(ctl)} where detectable"),
        verdict=exact_verdict(ok), source=NAME)]


# -- the step -------------------------------------------------------------------------------------

def markdown(reduced: dict, full: dict | None) -> str:
    from cactus_theory.lm.eval import format_table
    from cactus_theory.lm.lawtests import format_lawtests

    parts = []
    for res, name in ((full, "full run (`make eval`)"), (reduced, "reduced run (`make repro`)")):
        if res is None:
            continue
        c = res["config"]
        parts += [f"Ours, {name}: task `{c['task']}` ({c['problems']} problems, chat template, exact match), "
                  f"{res.get('pair_name', c['pair'])}, k = {c['k']}, up to {c['max_new_tokens']} new tokens, "
                  "T 0.6 / top-k 20 / top-p 0.95. Cells: estimate [95% interval]; accuracy in %, difference vs SpS "
                  "in points (paired bootstrap over problems; McNemar p); AL = tokens per verifier call (bonus "
                  "included); acceptance = accepted / drafted; Rej = rejected drafts per emitted token vs SpS; "
                  "step KL = mean exact KL(h_alg || q) (nats); NLL = verifier NLL (nats/token); speedup over the "
                  "verifier alone (tokens/s, same run).", "", format_table(res), ""]
    parts += [f"Paper ({SETUP}); cells: score / AL / Rej.", "", main_table_markdown(), ""]
    lt = (full or {}).get("lawtests") or reduced.get("lawtests")
    if lt:
        parts += ["Distribution tests on the real LM (rows 'verification step': `sampler.verify` on p, q computed "
                  "once per prompt; rows 'decode loop': through `speculative_generate` / `autoregressive_generate`).",
                  "", format_lawtests(lt), ""]
    return "\n".join(parts)


def run(ctx: Ctx) -> StepResult:
    t0 = time.perf_counter()
    cfg = config(ctx)
    reduced = cached(ctx, NAME, cfg, lambda: compute(ctx, cfg))
    full = full_result(ctx, cfg["pair"])
    main = full or reduced
    from cactus_theory.lm.eval import plot_accuracy_vs_al

    figs = save_figure(plot_accuracy_vs_al(main), ctx, "fig_h_eval")
    cl = claims(main, "full run" if full else "reduced run")
    lt = main.get("lawtests") or reduced.get("lawtests")
    if lt:
        cl += lawtest_claims(lt)
    data = {"reduced": reduced, "full_used": full is not None,
            "sections": [("h. Task accuracy with intervals (cactus-theory eval)", markdown(reduced, full))]}
    return StepResult(NAME, data, figs, cl, time.perf_counter() - t0)


if __name__ == "__main__":
    standalone(run)
