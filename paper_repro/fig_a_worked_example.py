"""Figure a: the paper's worked example (its overview figure).

Verifier ``q = (.30, .35, .35)``, draft ``p = (.05, .80, .15)``, drafted token ``n = 2`` (index 1).
SpS accepts with ``q_n / p_n``; Cactus raises ``h_n`` to ``gamma* = q_n + sqrt(2 delta q_n (1 - q_n))``
and scales the rest by ``(1 - gamma*)/(1 - q_n)``, accepting with ``gamma* / p_n`` at a KL cost
``KL(h || q)``. We also give the exact-root Cactus and the whole step's output law ``h_alg``.
"""

from __future__ import annotations

import numpy as np

from cactus_theory import Cactus, SpS, acceptance_rate, induced_distribution, kl
from cactus_theory.claims.report import WORKED_EXAMPLE, worked_example
from cactus_theory.registry import colour

from .common import Claim, Ctx, StepResult, cached_step, save_figure, standalone

NAME = "fig_a_worked_example"
Q, P, N = list(WORKED_EXAMPLE["q"]), list(WORKED_EXAMPLE["p"]), WORKED_EXAMPLE["n"]
DELTA = WORKED_EXAMPLE["delta"]  # "about delta = 0.21" in the paper
DELTA_STAR = worked_example()["delta_star"]  # the budget giving h_n = .66, i.e. the paper's .825


def compute(ctx: Ctx) -> dict:
    p, q, n = np.array(P), np.array(Q), np.array(N)
    out = {"delta": DELTA, "delta_star": DELTA_STAR}
    for key, rule in (("sps", SpS()), ("cactus", Cactus(DELTA)), ("cactus_star", Cactus(DELTA_STAR)),
                      ("cactus_exact", Cactus(DELTA, solver="exact"))):
        h = rule.target(p, q, n)
        h_alg = induced_distribution(rule, p, q)
        out[key] = {
            "h": h, "accept_n": float(rule.accept_prob(p, q, n)), "kl_h": float(kl(h, q)),
            "h_alg": h_alg, "kl_h_alg": float(kl(h_alg, q)), "accept_rate": float(acceptance_rate(rule, p, q)),
        }
    return out


def plot(d: dict, ctx: Ctx) -> list:
    import matplotlib.pyplot as plt

    fig, (a0, a1) = plt.subplots(1, 2, figsize=(11.5, 4.0), gridspec_kw={"width_ratios": [1.2, 1.3]})
    x = np.arange(3)
    w = 0.27
    for i, (lab, v, c) in enumerate((("q (verifier)", Q, "tab:gray"), ("p (draft)", P, "tab:olive"),
                                     (f"h (Cactus, delta={DELTA})", d["cactus"]["h"], colour("cactus")))):
        bars = a0.bar(x + (i - 1) * w, v, w, label=lab, color=c)
        a0.bar_label(bars, fmt="%.2f", fontsize=8)
    a0.set_xticks(x, [f"token {i + 1}" + (" (drafted)" if i == N else "") for i in range(3)])
    a0.set_ylabel("probability")
    a0.set_ylim(0, 1)
    a0.set_title("worked example: distributions")
    a0.legend(fontsize=8, loc="upper left")

    names = ["SpS", f"Cactus Taylor\ndelta={DELTA}", f"Cactus Taylor\ndelta={DELTA_STAR:.4f}",
             f"Cactus exact root\ndelta={DELTA}"]
    keys = ["sps", "cactus", "cactus_star", "cactus_exact"]
    acc = [d[k]["accept_n"] for k in keys]
    bars = a1.bar(names, acc, color=[colour("sps"), colour("cactus"), colour("cactus"), colour("cactus")],
                  alpha=0.9)
    for b, k in zip(bars, keys, strict=True):
        if k in ("cactus_star", "cactus_exact"):
            b.set_hatch("//" if k == "cactus_star" else "..")
    for b, k in zip(bars, keys, strict=True):
        a1.annotate(f"accept {d[k]['accept_n']:.4f}\nKL(h||q) {d[k]['kl_h']:.4f}",
                    (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    a1.axhline(WORKED_EXAMPLE["cactus_accept"], ls=":", color="k", lw=1, label="paper: Cactus 0.825")
    a1.axhline(WORKED_EXAMPLE["sps_accept"], ls="--", color="k", lw=1, label="paper: SpS 0.4375")
    a1.set_ylabel("P(accept drafted token 2)")
    a1.set_ylim(0, 1.25)
    a1.tick_params(axis="x", labelsize=8)
    a1.set_title("acceptance and KL spent")
    a1.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return save_figure(fig, ctx, "fig_a_worked_example")


def claims(d: dict) -> list[Claim]:
    """None: the worked example is one claim, checked by ``cactus-theory verify`` (``report.worked_example``,
    the same numbers); this step draws it."""
    return []


def run(ctx: Ctx) -> StepResult:
    cfg = {"p": P, "q": Q, "n": N, "delta": DELTA, "delta_star": DELTA_STAR}
    return cached_step(ctx, NAME, cfg, lambda: compute(ctx), plot, claims)


if __name__ == "__main__":
    standalone(run)
