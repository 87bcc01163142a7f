"""Figure e: real decoding with the embedded pair (or ``--verifier/--draft``).

Panels: ``AL`` (tokens per verifier call, bonus included) vs Cactus's ``delta`` and vs the number of drafts ``k``;
quality vs AL for every rule, quality being the exact per-step ``KL(h_alg || q)`` at each verified
position and the verifier's own NLL (temperature 1) of the generated tokens (the analogue of the
paper's accuracy-vs-acceptance figure and its interpolation ablation); wall-clock speedup over the
verifier alone vs ``delta``. ``AL`` is tokens per verifier call with the bonus included (DESIGN.md's
unit); per-token acceptance is accepted / drafted.

Verdicts come from 95% t-intervals over prompts (each prompt decoded alone, so every counter exists per
prompt; two methods pair up prompt by prompt; a pooled ratio's standard error by the jackknife over prompts);
the wall clock from a t-interval on the per-prompt log tokens/s ratio (9 prompts are too few for a percentile
bootstrap).
Measured on the embedded SmolLM2 pair with k = 4, the rows name that scope, never a bare "holds";
fewer than 5 prompts is "out of reach". These checks are secondary to step h's 300-problem eval
(``Claim.role``): acceptance here is underpowered, the wall clock here is batch 1, another protocol.
"""

from __future__ import annotations

import math

import numpy as np

from cactus_theory import registry
from cactus_theory.claims.ledger import all_of, interval_verdict, jackknife_t_interval, t_interval

from .common import Claim, Ctx, StepResult, cached_step, fmt, save_figure, standalone
from .lm_runs import (
    STYLES,
    derived,
    get_pair,
    lm_config,
    per_prompt,
    pooled,
    run_all,
    save_lm_pairs,
    scope,
)
from .paper_numbers import MAIN_TABLE, OTHER

NAME = "fig_e_lm"


def compute(ctx: Ctx) -> dict:
    runs = run_all(ctx)
    rows = save_lm_pairs(ctx, runs)
    cfg = lm_config(ctx)
    return {"pooled": {m: pooled(runs, m) for m in runs},
            "per_style": {m: {s: runs[m][s]["stats"] for s in STYLES} for m in runs},
            "per_prompt": {m: per_prompt(runs, m) for m in runs},
            "methods": cfg["methods"], "lm_pair_rows": rows, "pair_name": getattr(get_pair(ctx), "name", "pair"),
            "samples": {m: (runs[m]["prose"]["texts"] or [])[:1] for m in runs},
            "config": {k: v for k, v in cfg.items() if k != "methods"}}


def _cactus(d: dict, k: int = 4) -> list[tuple[float, dict]]:
    out = [(0.0, d["pooled"]["SpS"])]
    for m, spec in d["methods"].items():
        if spec["rule"] == "cactus" and spec["k"] == k and m in d["pooled"]:
            out.append((spec["params"]["delta"], d["pooled"][m]))
    return sorted(out, key=lambda t: t[0])


def plot(d: dict, ctx: Ctx) -> list:
    import matplotlib.pyplot as plt

    P, M = d["pooled"], d["methods"]
    base = P["verifier alone"]["tokens_per_s"]
    fig, ax = plt.subplots(2, 3, figsize=(15, 8.2))
    cac = _cactus(d)
    x = [t[0] for t in cac]
    ax[0, 0].plot(x, [t[1]["al"] for t in cac], marker="o", color=registry.colour("cactus"),
                  label="Cactus (k=4), delta=0 is SpS")
    if "TAS" in P:
        ax[0, 0].axhline(P["TAS"]["al"], color=registry.colour("tas"), ls="--", label="TAS (eps=0.09, alpha=0.3)")
    ax[0, 0].set_xlabel("Cactus budget delta (nats)")
    ax[0, 0].set_ylabel("AL: tokens per verifier call (bonus included)")
    ax[0, 0].set_title("AL vs delta")
    ax[0, 0].legend(fontsize=8)

    for fam, rule, params in (("SpS", "sps", {}), ("Cactus delta=1", "cactus", {"delta": 1.0})):
        pts = sorted((s["k"], P[m]["al"]) for m, s in M.items() if s["rule"] == rule and s["params"] == params)
        ax[0, 1].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=registry.colour(rule), label=fam)
    ax[0, 1].set_xlabel("drafts per step k (tokens)")
    ax[0, 1].set_ylabel("AL: tokens per verifier call (bonus included)")
    ax[0, 1].set_title("AL vs k")
    ax[0, 1].legend(fontsize=8)

    ax[0, 2].plot(x, [t[1]["tokens_per_s"] / base for t in cac], marker="o", color=registry.colour("cactus"),
                  label="Cactus (k=4)")
    ax[0, 2].axhline(1.0, color="gray", lw=0.8, ls=":", label="verifier alone")
    ax[0, 2].set_xlabel("Cactus budget delta (nats)")
    ax[0, 2].set_ylabel("wall-clock speedup (x, tokens/s ratio)")
    ax[0, 2].set_title("speedup vs delta (this CPU)")
    ax[0, 2].legend(fontsize=8)

    finite = [P[m]["mean_step_kl"] for m in P if m != "verifier alone" and math.isfinite(P[m]["mean_step_kl"])]
    top = 1.15 * max(finite + [1e-3])
    for m, s in M.items():
        if s["rule"] is None or s["k"] != 4:
            continue
        fam = s["rule"]
        c = registry.colour(fam)
        kl_v = P[m]["mean_step_kl"]
        inf = not math.isfinite(kl_v)
        ax[1, 0].scatter(P[m]["al"], top if inf else kl_v, color=c, marker="^" if inf else "o")
        ax[1, 0].annotate(m + (" (KL = inf)" if inf else ""), (P[m]["al"], top if inf else kl_v), fontsize=6,
                          xytext=(3, 3), textcoords="offset points")
        ax[1, 1].scatter(P[m]["al"], P[m]["nll"], color=c)
        ax[1, 1].annotate(m, (P[m]["al"], P[m]["nll"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax[1, 2].scatter(P[m]["al"], P[m]["tokens_per_s"] / base, color=c)
        ax[1, 2].annotate(m, (P[m]["al"], P[m]["tokens_per_s"] / base), fontsize=6, xytext=(3, 3),
                          textcoords="offset points")
    ax[1, 1].axhline(P["verifier alone"]["nll"], color="gray", lw=0.8, ls=":", label="verifier alone")
    ax[1, 1].legend(fontsize=8)
    ax[1, 0].set_ylabel("mean exact per-step KL(h_alg || q) (nats)")
    ax[1, 0].set_title("distortion vs AL (triangles: infinite KL)")
    ax[1, 1].set_ylabel("verifier NLL of generated tokens (nats/token)")
    ax[1, 1].set_title("verifier NLL vs AL (lower = closer to verifier)")
    ax[1, 2].set_ylabel("wall-clock speedup (x)")
    ax[1, 2].set_title("speedup vs AL, all rules (k=4)")
    for a in ax[1]:
        a.set_xlabel("AL: tokens per verifier call (bonus included)")
    for a in ax.flat:
        a.grid(alpha=0.3)
    c = d["config"]
    s = c["sampling"]
    fig.suptitle(f"real decoding, pair {d.get('pair_name', '?')}: {c['per_style']} prompts x 3 styles, "
                 f"{c['max_new_tokens']} new tokens, T={s['temperature']:g}, top-k {s['top_k']}, top-p {s['top_p']:g}",
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, ctx, "fig_e_lm")


def _units(d: dict, *methods: str) -> np.ndarray | None:
    """Per-prompt counters of ``methods`` side by side: (prompts, len(methods), len(COUNTERS))."""
    from .lm_runs import COUNTERS

    rows = [d.get("per_prompt", {}).get(m, []) for m in methods]
    if not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        return None
    return np.array([[[r[i][k] for k in COUNTERS] for r in rows] for i in range(len(rows[0]))], dtype=np.float64)


def _stat(u: np.ndarray, j: int, name: str) -> float:
    """Derived figure ``name`` of method ``j`` pooled over the unit rows ``u`` (ratio of sums)."""
    from .lm_runs import COUNTERS

    return derived(dict(zip(COUNTERS, u[:, j].sum(0), strict=True)))[name]


def paired_interval(d: dict, a: str, b: str, name: str, how: str = "diff"):
    """95% t-interval over prompts (jackknife standard error, ``claims.jackknife_t_interval``: 9 prompts are too
    few for a percentile bootstrap) of ``name(a) - name(b)`` (``how="diff"``) or ``name(a) / name(b) - 1``
    (``"ratio"``), each pooled over the prompts; None without per-prompt counters."""
    u = _units(d, a, b)
    if u is None:
        return None
    f = (lambda x: _stat(x, 0, name) - _stat(x, 1, name)) if how == "diff" else \
        (lambda x: _stat(x, 0, name) / _stat(x, 1, name) - 1)
    return jackknife_t_interval(u, f)


def _iv(iv, pct: bool = False) -> str:
    if iv is None:
        return "no per-prompt counters"
    f = (lambda x: f"{100 * x:+.0f}%") if pct else (lambda x: f"{x:+.3f}")
    return f"{f(iv.estimate)} [{f(iv.lo)}, {f(iv.hi)}]"


def _sc(v: str, sc: str) -> str:
    return sc if v in ("consistent", "inconclusive", "differs") else ""


def speedup_interval(d: dict, a: str, b: str):
    """Per prompt, log of the tokens/s ratio of ``a`` over ``b`` (each prompt decoded alone by both, batch 1);
    95% t-interval on their mean (n = prompts; ``claims.t_interval``), on the log scale. None without
    per-prompt counters."""
    pa, pb = d.get("per_prompt", {}).get(a, []), d.get("per_prompt", {}).get(b, [])
    if not pa or len(pa) != len(pb):
        return None
    r = [math.log((x["new_tokens"] / x["seconds"]) / (y["new_tokens"] / y["seconds"])) for x, y in zip(pa, pb, strict=True)]
    return t_interval(r)


def claims(d: dict) -> list[Claim]:
    """Step e's checks of the main-table statements: secondary to step h's 300-problem eval (``role``):
    acceptance on 9 prompts is underpowered (AL here, and Rej from the same runs: table f is another view of
    them, not a second check); the wall clock here is batch 1, another protocol than the eval's batch 32."""
    P = d["pooled"]
    base = P["verifier alone"]["tokens_per_s"]
    sc = scope(d["config"])
    n = len(d.get("per_prompt", {}).get("SpS", []))
    units = f"{n} prompts"
    lossy = [m for m in ("TAS", "Cactus delta=0.75", "Cactus delta=1") if m in P]
    ivs = {m: paired_interval(d, m, "SpS", "al") for m in lossy}
    # fewer rejections: "1 - Rej ratio > 0", Rej = rejected drafts per emitted token vs SpS (table f's column)
    rivs = {m: paired_interval(d, "SpS", m, "rejected_per_token", how="ratio") for m in lossy}
    verdicts = [interval_verdict(iv, scope=sc) if iv is not None else "out of reach"
                for iv in [*ivs.values(), *rivs.values()]]
    v = all_of(verdicts)
    gsm = MAIN_TABLE

    def rej(m):
        iv = rivs[m]
        own = P[m]["rejected_per_token"] / P["SpS"]["rejected_per_token"] - 1
        # SpS / m - 1 > 0 <=> m / SpS - 1 < 0; print the latter's interval: 1 / (1 + x) - 1
        return f"{m} {100 * own:+.0f}%" + ("" if iv is None else
                                           f" [{100 * (1 / (1 + iv.hi) - 1):+.0f}%, {100 * (1 / (1 + iv.lo) - 1):+.0f}%]")

    out = [Claim(
        key="main-acceptance", claim="TAS and Cactus (delta = 0.75, 1.0) accept more drafts than SpS: higher AL, "
        "fewer rejections", ref="main table (AL, Rej)", kind="paper",
        how="real decoding (steps e and f: one set of runs, table f shows it per style); AL (tokens per verifier "
            "call, bonus included) minus SpS's and Rej (rejected drafts per emitted token) relative to SpS, paired "
            "by prompt, 95% t-interval over prompts (jackknife standard error)",
        ours="AL: SpS " + fmt(P["SpS"]["al"], 2) + "; " + "; ".join(
            f"{m} {fmt(P[m]['al'], 2)} (minus SpS {_iv(ivs[m])})" for m in lossy)
        + "; Rej vs SpS: " + ", ".join(rej(m) for m in lossy),
        paper=(f"GSM8K, m = 20: SpS {gsm['SpS']['GSM8K'][1]}, TAS {gsm['TAS']['GSM8K'][1]}, Cactus 0.75 "
               f"{gsm['Cactus delta=0.75']['GSM8K'][1]}, Cactus 1.0 {gsm['Cactus delta=1.0']['GSM8K'][1]}"),
        verdict=v, scope=_sc(v, sc), role="underpowered", units=units,
        decision="each part's 95% interval on the claimed side of 0; the weakest part decides",
        detail="another model and k = 4 instead of 20, short generations: directions comparable, sizes not")]
    interp = next((m for m in ("interpolation alpha=0.9", "interpolation alpha=0.5") if m in P), None)
    if interp is not None:
        cac = _cactus(d)
        # Cactus budget whose per-token acceptance is closest to interpolation's, for like-for-like quality
        delta, near = min(cac, key=lambda t: abs(t[1]["acceptance_rate"] - P[interp]["acceptance_rate"]))
        gap = abs(near["acceptance_rate"] - P[interp]["acceptance_rate"])
        name = next(m for m in P if m == ("SpS" if delta == 0 else f"Cactus delta={delta:g}"))
        iv = paired_interval(d, interp, name, "nll") if gap <= 0.05 else None
        v = interval_verdict(iv, scope=sc) if iv is not None else "out of reach"
        out.append(Claim(
            key="interpolation-ablation", claim="at similar acceptance, Cactus distorts the verifier less than "
            "interpolation", ref="interpolation ablation", kind="paper",
            how=(f"{interp} vs the Cactus budget with the nearest per-token acceptance (delta = {delta:g}); "
                 "comparable if within 0.05; verifier NLL (interpolation minus Cactus), paired by prompt, 95% t-interval over "
                 "prompts (jackknife standard error)"),
            ours=(f"{interp}: acceptance {fmt(P[interp]['acceptance_rate'], 2)}, NLL {fmt(P[interp]['nll'])}; Cactus: "
                  f"acceptance {fmt(near['acceptance_rate'], 2)}, NLL {fmt(near['nll'])}"
                  + (f"; NLL difference {_iv(iv)}" if iv is not None else "")),
            paper=OTHER["interpolation"], verdict=v, scope=_sc(v, sc), role="other protocol",
            units=units if iv is not None else "",
            detail=("quality = verifier NLL of the generated text (no task accuracy for a 135M verifier)" if gap <= 0.05
                    else f"no Cactus budget run here reaches interpolation's acceptance (nearest differs by "
                         f"{gap:.2f}): with this draft the comparison at similar acceptance is not possible")))
    c1 = "Cactus delta=1"
    iv = speedup_interval(d, c1, "verifier alone")
    wsc = sc + ", this CPU, batch 1"
    v = interval_verdict(iv, scope=wsc) if iv is not None else "out of reach"
    out.append(Claim(
        key="wall-clock", claim="Cactus delta = 1.0 decodes faster than the verifier alone", ref="wall-clock experiment",
        kind="paper", how="protocol batch 1: each prompt decoded alone by both, in one process after a warm-up; per "
                          "prompt log(tokens/s ratio), 95% t-interval on their mean",
        ours=(f"pooled tokens/s ratio {fmt(P[c1]['tokens_per_s'] / base, 2)}x; geometric-mean speedup "
              + ("-" if iv is None else f"{math.exp(iv.estimate):.2f}x [{math.exp(iv.lo):.2f}, {math.exp(iv.hi):.2f}]")
              + f"; SpS {fmt(P['SpS']['tokens_per_s'] / base, 2)}x"),
        paper=OTHER["speedup"], verdict=v, scope=_sc(v, wsc), role="other protocol", units=units,
        decision="consistent if the 95% interval of the speedup lies above 1x, differs if below, else inconclusive",
        detail="batch 1 is its own setting (the verifier's per-call cost dominates less than at batch 32): read "
               "beside the batch-32 check, not against it"))
    return out


def run(ctx: Ctx) -> StepResult:
    return cached_step(ctx, NAME, dict(lm_config(ctx)), lambda: compute(ctx), plot, claims)


if __name__ == "__main__":
    standalone(run)

