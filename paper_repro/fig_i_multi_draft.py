"""Figure i (our result, not the paper's): Cactus with several drafts.

With ``K`` drafts drawn i.i.d. from ``p``, the best acceptance any verification with output law ``h``
can have is the multi-draft optimal transport (Hu et al., ICLR 2025), ``A_K(p, h)``
(``optimize.multi_draft_acceptance``; the cvxpy LP ``optimize.max_acceptance_multi``). Cactus's idea
with several drafts: let the step's law move within ``KL(h || q) <= delta`` and maximise
``A_K(p, h)`` jointly over ``h`` and the coupling (``optimize.solve_target_multi``). ``delta = 0`` is
the lossless optimum (multi-draft SpS at its best). On figure c's family of random pairs:

* acceptance against ``K`` and ``delta``: how much of the single-draft gain ``A_1(delta) - A_1(0)``
  survives as ``K`` grows;
* the optimum's shape (``h_i / q_i`` against ``p_i / q_i``);
* ``K = 1``: the optimum at a row's own step KL bounds every single-draft rule there (Theorem 1);
  how close Cactus (Corollary 5, a per-token budget) comes to it;
* cross-checks: the cvxpy LP = the closed form from the dual = brute force over token sets, ``K = 1``
  = ``max_acceptance``; the coupling LP = the cutting-plane dual of ``solve_target_multi``.

``python -m paper_repro.fig_i_multi_draft [--fast]``.
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from cactus_theory import acceptance_rate, induced_distribution, kl, registry
from cactus_theory.claims.ledger import bootstrap_interval, exact_verdict, interval_verdict
from cactus_theory.optimize import (
    max_acceptance,
    max_acceptance_multi,
    multi_draft_acceptance,
    solve_target_multi,
)
from cactus_theory.rules import Cactus, SpS

from .common import Claim, Ctx, StepResult, cached_step, fmt, save_figure, standalone
from .fig_c_tradeoff import random_pairs

NAME = "fig_i_multi_draft"
DELTA_REF = 0.03  # the budget the survival claim is judged at
DELTA_SHAPE = 0.01  # the budget of the shape panel's example
SHAPE_TOL = 1e-3  # solver precision allowed in the shape checks: on log(h_i / q_i), and 1e-4 on h itself
SHAPE_MIN_Q = 1e-6  # the checks read tokens with q_i >= this: Clarabel's ~1e-9 absolute error on h_i makes
# log(h_i / q_i) meaningless below (as optimize.solve_target's docstring says of tiny masses)
FRONTIER_TOL = 1e-6  # a rule's acceptance may exceed the K = 1 optimum by this much (solver precision)


def config(ctx: Ctx) -> dict:
    """The step's inputs: sizes, grids, and the identity of every rule the frontier panel evaluates."""
    fast = ctx.fast
    cfg = {"R": 4 if fast else 16, "V": 12 if fast else 64, "sigma": 1.0, "seed": ctx.seed,
            "K": [1, 2, 4] if fast else [1, 2, 3, 4, 6, 8],
            "delta": [0.0, 0.01, DELTA_REF, 0.1] if fast else [0.0, 0.001, 0.003, 0.01, DELTA_REF, 0.1, 0.3],
            "cactus": [0.05, 0.5] if fast else [0.01, 0.05, 0.25, 1.0],
            "check_V": 4 if fast else 5, "check_K": [1, 2] if fast else [1, 2, 3], "check_cases": 2 if fast else 6,
            "version": 3}
    cfg["rules"] = [r.identity for r in frontier_rules(cfg["cactus"])]  # the registry's rules are an input
    return cfg


def frontier_rules(cactus: list[float]) -> list:
    """The rules of the ``K = 1`` panel: Cactus at each budget of ``cactus``, then every lossy registry rule
    that needs no LM head and has a one-step law (not stateful), at its registry defaults."""
    rules = [Cactus(d) for d in cactus]
    return rules + [s.make() for k, s in registry.RULES.items()
                    if not s.lossless and k != "cactus" and not s.reads_head and not s.stateful]


def _brute(p: np.ndarray, h: np.ndarray, K: int) -> float:
    """``min_S h(S) + 1 - p(S)^K`` over all ``2^V`` token sets (the dual, without the prefix rule)."""
    V = p.size
    S = ((np.arange(2 ** V)[:, None] >> np.arange(V)[None, :]) & 1).astype(bool)
    return float(np.min(S @ h + 1 - (S @ p) ** K))


def crosscheck(rng: np.random.Generator, cfg: dict) -> dict:
    """Small cases: LP vs closed form vs brute force vs max_acceptance (K = 1), coupling vs dual."""
    lp_err = k1_err = joint_err = 0.0
    for _ in range(cfg["check_cases"]):
        V = cfg["check_V"]
        p, h, q = (rng.dirichlet(np.full(V, 0.7)) for _ in range(3))
        for K in cfg["check_K"]:
            lp = max_acceptance_multi(p, h, K).value
            lp_err = max(lp_err, abs(lp - multi_draft_acceptance(p, h, K).value), abs(lp - _brute(p, h, K)))
            if K == 1:
                k1_err = max(k1_err, abs(lp - max_acceptance(p, h).value), abs(lp - (1 - 0.5 * np.abs(p - h).sum())))
            for d in (0.02, 0.2):
                a = solve_target_multi(p, q, d, K, method="coupling").value
                b = solve_target_multi(p, q, d, K, method="dual").value
                joint_err = max(joint_err, abs(a - b))
    return {"lp_vs_dual": lp_err, "k1_vs_max_acceptance": k1_err, "coupling_vs_dual": joint_err}


def grid(P: np.ndarray, Q: np.ndarray, cfg: dict) -> dict:
    """Per (K, delta): each row's optimal acceptance and the KL its optimum spends; one example's optima."""
    acc, spent, shapes = {}, {}, {"clip_err": 0.0, "mono": {}, "rows": 0}
    jobs = [(K, d) for K in cfg["K"] for d in cfg["delta"]]
    example = {"p": P[0], "q": Q[0], "h": {}, "value": {}, "delta": DELTA_SHAPE}
    for K, d in tqdm(jobs, desc="fig i: K x delta", leave=False):
        vals, kls = [], []
        for i, (p, q) in enumerate(zip(P, Q, strict=True)):
            r = solve_target_multi(p, q, d, K, method="dual")
            vals.append(r.value)
            kls.append(float(kl(r.h, q)))
            if i == 0 and d == DELTA_SHAPE:
                example["h"][str(K)], example["value"][str(K)] = r.h, r.value
            if d > 0 and r.value < 1 - 1e-6:  # unsaturated: the optimum is unique (see the notebook)
                shapes["rows"] += 1
                big = q >= SHAPE_MIN_Q
                t = np.log(r.h[big] / q[big])
                o = np.argsort(p[big] / q[big], kind="stable")
                shapes["mono"][str(K)] = min(shapes["mono"].get(str(K), 0.0), float(np.diff(t[o]).min()))
                if K == 1:  # h = clip(p, c_b q, c_a q)
                    cb, ca = float(np.exp(t.min())), float(np.exp(t.max()))
                    shapes["clip_err"] = max(shapes["clip_err"], float(np.abs(r.h - np.clip(p, cb * q, ca * q)).max()))
        acc[f"{K}|{d:g}"] = vals
        spent[f"{K}|{d:g}"] = kls
    return {"accept": acc, "kl": spent, "shape": shapes, "example": example}


def frontier(P: np.ndarray, Q: np.ndarray, cfg: dict) -> list[dict]:
    """K = 1: each rule's per-row (acceptance, KL(h_alg || q)) and the optimum at that row's KL."""
    rules = frontier_rules(cfg["cactus"])
    out = []
    sps = acceptance_rate(SpS(), P, Q)
    for rule in tqdm(rules, desc="fig i: K = 1 frontier", leave=False):
        a = acceptance_rate(rule, P, Q)
        k = kl(induced_distribution(rule, P, Q), Q)
        best = [solve_target_multi(p, q, float(kk), 1, method="dual").value if np.isfinite(kk) else 1.0
                for p, q, kk in zip(P, Q, k, strict=True)]
        out.append({"rule": registry.label(rule), "key": registry.spec(rule).key, "accept": a, "kl": k,
                    "best": best, "sps": sps})
    return out


def compute(ctx: Ctx, cfg: dict) -> dict:
    rng = np.random.default_rng(cfg["seed"])
    P, Q = random_pairs(rng, cfg["R"], cfg["V"], cfg["sigma"])
    return {"grid": grid(P, Q, cfg), "frontier": frontier(P, Q, cfg), "check": crosscheck(rng, cfg),
            "K": cfg["K"], "delta": cfg["delta"], "R": cfg["R"], "V": cfg["V"]}


def table(d: dict) -> dict:
    """Mean acceptance per (K, delta), the gain over delta = 0, and the gain's survival ``gain_K / gain_1``."""
    g = d["grid"]["accept"]
    mean = {K: {dl: float(np.mean(g[f"{K}|{dl:g}"])) for dl in d["delta"]} for K in d["K"]}
    gain = {K: {dl: mean[K][dl] - mean[K][0.0] for dl in d["delta"]} for K in d["K"]}
    surv = {K: {dl: gain[K][dl] / gain[1][dl] if gain[1][dl] > 0 else float("nan") for dl in d["delta"]}
            for K in d["K"]}
    return {"mean": mean, "gain": gain, "survival": surv}


def section(d: dict) -> str:
    """REPORT.md's section: mean optimal acceptance per K and delta (delta = 0: lossless, i.e. multi-draft
    SpS at its best), the gain over it, and the share of the one-draft gain each K keeps."""
    t = table(d)
    Ks, deltas = d["K"], d["delta"]
    head = "| K | " + " | ".join("SpS (delta = 0)" if dl == 0 else f"delta = {dl:g}" for dl in deltas) + " |"
    lines = ["### i. Cactus with several drafts (our result, not the paper's)", "",
             f"Exact optima (`optimize.solve_target_multi`) on {d['R']} random pairs of figure c's family, V = "
             f"{d['V']}: the best mean acceptance of K drafts drawn i.i.d. from p when the step's output law may sit "
             "within KL(h || q) <= delta of the verifier (delta = 0 is the lossless multi-draft optimum of Hu et al., "
             "the best any multi-draft SpS can do). Cells: mean acceptance (gain over delta = 0; share of the K = 1 "
             "gain kept).", "", head, "|---" * (len(deltas) + 1) + "|"]
    for K in Ks:
        cells = []
        for dl in deltas:
            m = fmt(t["mean"][K][dl])
            if dl > 0:
                m += f" (+{fmt(t['gain'][K][dl])}; {fmt(t['survival'][K][dl], 2)})"
            cells.append(m)
        lines.append(f"| {K} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(d: dict, ctx: Ctx) -> list:
    import matplotlib.pyplot as plt

    t = table(d)
    Ks, deltas = d["K"], d["delta"]
    fig, ax = plt.subplots(1, 4, figsize=(20, 4.6))
    cm = plt.get_cmap("viridis")
    for i, dl in enumerate(deltas):
        lab = "delta = 0 (lossless optimum, multi-draft SpS)" if dl == 0 else f"delta = {dl:g}"
        ax[0].plot(Ks, [t["mean"][K][dl] for K in Ks], marker="o", color="k" if dl == 0 else cm(i / len(deltas)),
                   ls="--" if dl == 0 else "-", label=lab)
    ax[0].set(xlabel="drafts per position K (i.i.d. from p)", ylabel="mean optimal acceptance A_K",
              title="acceptance vs K")
    pos = [dl for dl in deltas if dl > 0]
    for j, K in enumerate(Ks):
        ax[1].plot(pos, [t["mean"][K][dl] for dl in pos], marker="o", color=cm(j / len(Ks)), label=f"K = {K}")
        ax[1].axhline(t["mean"][K][0.0], color=cm(j / len(Ks)), ls=":", lw=0.8)
    ax[1].set(xscale="log", xlabel="budget delta = max KL(h || q) of the step (nats)", ylabel="mean optimal acceptance",
              title="acceptance vs delta (dotted: delta = 0)")
    ex = d["grid"]["example"]
    p, q = np.asarray(ex["p"]), np.asarray(ex["q"])
    big = q >= SHAPE_MIN_Q
    o = np.argsort(p[big] / q[big])
    for j, K in enumerate(Ks):  # unsaturated optima only (A < 1: unique)
        if str(K) in ex["h"] and ex["value"][str(K)] < 1 - 1e-6:
            h = np.asarray(ex["h"][str(K)])[big]
            ax[2].plot((p[big] / q[big])[o], (h / q[big])[o], marker=".", color=cm(j / len(Ks)),
                       label=f"K = {K} (A = {ex['value'][str(K)]:.3f})")
    ax[2].plot((p[big] / q[big])[o], (p[big] / q[big])[o], color="gray", ls=":", lw=0.8, label="h = p")
    ax[2].set(xscale="log", yscale="log", xlabel="p_i / q_i (one pair; tokens with q_i >= 1e-6)",
              ylabel="h*_i / q_i", title=f"shape of the optimum (delta = {ex['delta']:g})")
    for row in d["frontier"]:
        c, m = registry.colour(row["key"]), registry.marker(row["key"])
        k = np.asarray(row["kl"], dtype=float)
        ax[3].scatter([np.mean(k)], [np.mean(row["accept"])], color=c, marker=m, s=28,
                      label=row["rule"] if row["key"] == "cactus" else registry.spec(row["key"]).label)
    ks = [float(np.mean(d["grid"]["kl"][f"1|{dl:g}"])) for dl in deltas]
    ax[3].plot(ks, [t["mean"][1][dl] for dl in deltas], color="k", marker="o", ms=3,
               label="K = 1 optimum, same budget on every pair")
    ax[3].set(xlabel="mean KL(h_alg || q) of the step (nats)", ylabel="mean acceptance", xscale="symlog",
              title="one draft: rules vs the optimum")
    ax[3].set_xscale("symlog", linthresh=1e-3)
    for a in ax:
        a.grid(alpha=0.3)
        a.legend(fontsize=6.5)
    fig.suptitle(f"Cactus with several drafts (our result): exact optima on {d['R']} random pairs, V = {d['V']}",
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, ctx, NAME)


def claims(d: dict) -> list[Claim]:
    t = table(d)
    Ks = d["K"]
    out = []
    c = d["check"]
    worst = max(c.values())
    out.append(Claim(
        "multi-draft-lp", "the multi-draft coupling LP (cvxpy) equals its dual in closed form, min_S h(S) + 1 - p(S)^K "
        "at a prefix of the tokens sorted by h_i / p_i; K = 1 is max_acceptance (1 - TV); solve_target_multi's "
        "coupling LP equals its cutting-plane dual", "optimize.max_acceptance_multi / multi_draft_acceptance / "
        "solve_target_multi", "code",
        "random Dirichlet(0.7) triples (p, h, q) at V = 5, K = 1..3; brute force over all 2^V token sets",
        f"max |LP - closed form, brute force| {c['lp_vs_dual']:.1e}; K = 1 vs max_acceptance {c['k1_vs_max_acceptance']:.1e}; "
        f"coupling vs dual {c['coupling_vs_dual']:.1e}", exact_verdict(worst <= 1e-6)))
    # survival of the single-draft gain
    g = d["grid"]["accept"]
    Kmax = max(Ks)
    rows = np.array([np.array(g[f"1|{DELTA_REF:g}"]) - np.array(g["1|0"]),
                     np.array(g[f"{Kmax}|{DELTA_REF:g}"]) - np.array(g[f"{Kmax}|0"])]).T  # (R, 2)
    iv = bootstrap_interval(rows, lambda x: float(np.mean(x[:, 0]) - np.mean(x[:, 1])), n_boot=2000)
    surv = ", ".join(f"K = {K}: {fmt(t['survival'][K][DELTA_REF], 2)}" for K in Ks if K > 1)
    acc = "; ".join(f"K = {K}: {fmt(t['mean'][K][0.0], 3)} -> {fmt(t['mean'][K][DELTA_REF], 3)}" for K in Ks)
    out.append(Claim(
        "multi-draft-gain", f"the acceptance a KL budget buys shrinks as drafts are added: at delta = {DELTA_REF:g} "
        f"the gain over the lossless optimum at K = {Kmax} is smaller than at K = 1", "ours", "derived",
        f"exact optima (optimize.solve_target_multi) on {d['R']} random pairs, V = {d['V']}; 95% bootstrap interval "
        f"over pairs of gain(K = 1) - gain(K = {Kmax})",
        f"mean acceptance lossless -> delta = {DELTA_REF:g}: {acc}; share of the K = 1 gain kept: {surv}; "
        f"gain(1) - gain({Kmax}) = {iv}", interval_verdict(iv), scope=f"random pairs, V = {d['V']}"))
    sh = d["grid"]["shape"]
    mono = min(sh["mono"].values()) if sh["mono"] else 0.0
    ok = sh["rows"] > 0 and sh["clip_err"] <= 0.1 * SHAPE_TOL and mono >= -SHAPE_TOL
    out.append(Claim(
        "multi-draft-shape", "the optimum is not Cactus's two-block target: h*_i / q_i is non-decreasing in p_i / q_i "
        "(h moves towards the draft); with one draft it is h* = clip(p, c_b q, c_a q): tokens the draft under-weights "
        "share one scale-down factor c_b, those it over-weights one scale-up factor c_a, and h* = p in between; with "
        "K > 1 the middle becomes a staircase of intermediate levels", "ours", "derived",
        f"every unsaturated optimum (A < 1: then it is unique) of the K x delta grid, {sh['rows']} in all, on the "
        f"tokens with q_i >= {SHAPE_MIN_Q:g} (below, the solver's ~1e-9 absolute error swamps h_i / q_i); tolerance "
        f"{0.1 * SHAPE_TOL:g} on h, {SHAPE_TOL:g} on log(h_i / q_i)",
        f"max |h* - clip(p, c_b q, c_a q)| at K = 1: {sh['clip_err']:.1e}; most negative step of log(h*_i / q_i) "
        f"along increasing p_i / q_i: {mono:.1e}", exact_verdict(ok), scope=f"random pairs, V = {d['V']}"))
    # K = 1 frontier
    over, cac = 0.0, []
    for row in d["frontier"]:
        a, b, s = (np.asarray(row[x], dtype=float) for x in ("accept", "best", "sps"))
        over = max(over, float(np.max(a - b)))
        if row["key"] == "cactus":
            cac.append(f"{row['rule']}: {fmt(np.mean(a - s) / max(np.mean(b - s), 1e-12), 2)}")
    out.append(Claim(
        "single-draft-frontier", "with one draft, no rule accepts more than the optimum at its own step KL(h_alg || q) "
        "(Theorem 1: acceptance <= 1 - TV(p, h_alg)); Cactus's per-token budget reaches a share of that optimum's gain "
        "over SpS", "Theorem 1 + optimize.solve_target_multi (K = 1)", "derived",
        f"per pair: each registry rule's exact (acceptance, KL(h_alg || q)) and the optimum at that KL; {d['R']} pairs",
        f"largest excess over the optimum {over:.1e}; Cactus's share of the optimal gain at its own KL: " + ", ".join(cac),
        exact_verdict(over <= FRONTIER_TOL), scope=f"random pairs, V = {d['V']}"))
    return out


def run(ctx: Ctx) -> StepResult:
    cfg = config(ctx)
    return cached_step(ctx, NAME, cfg, lambda: compute(ctx, cfg), plot, claims)


if __name__ == "__main__":
    standalone(run)
