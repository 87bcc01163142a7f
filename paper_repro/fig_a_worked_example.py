"""Figure a: the paper's worked example (its overview figure).

Verifier ``q = (.30, .35, .35)``, draft ``p = (.05, .80, .15)``, drafted token ``n = 2`` (index 1).
SpS accepts with ``q_n / p_n``; Cactus raises ``h_n`` to ``gamma* = q_n + sqrt(2 delta q_n (1 - q_n))``
and scales the rest by ``(1 - gamma*)/(1 - q_n)``, accepting with ``gamma* / p_n`` at a KL cost
``KL(h || q)``. We also give the exact-root Cactus and the whole step's output law ``h_alg``.
"""

from __future__ import annotations

import numpy as np

from cactus_theory import Cactus, SpS, acceptance_rate, induced_distribution, kl
from cactus_theory.report import WORKED_EXAMPLE

from .common import Claim, Ctx, StepResult, cached_step, fmt, save_figure, standalone

NAME = "fig_a_worked_example"
Q, P, N = list(WORKED_EXAMPLE["q"]), list(WORKED_EXAMPLE["p"]), WORKED_EXAMPLE["n"]
DELTA = WORKED_EXAMPLE["delta"]  # "about delta = 0.21" in the paper
PAPER = {k: WORKED_EXAMPLE[k] for k in ("sps_accept", "cactus_accept", "h", "kl")}


def compute(ctx: Ctx) -> dict:
    p, q, n = np.array(P), np.array(Q), np.array(N)
    out = {}
    for key, rule in (("sps", SpS()), ("cactus", Cactus(DELTA)), ("cactus_exact", Cactus(DELTA, solver="exact"))):
        h = rule.target(p, q, n)
        h_alg = induced_distribution(rule, p, q)
        out[key] = {
            "h": h, "accept_n": float(rule.accept_prob(p, q, n)), "kl_h": float(kl(h, q)),
            "h_alg": h_alg, "kl_h_alg": float(kl(h_alg, q)), "accept_rate": float(acceptance_rate(rule, p, q)),
        }
    return out


def plot(d: dict, ctx: Ctx) -> list:
    import matplotlib.pyplot as plt

    fig, (a0, a1) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1.4, 1]})
    x = np.arange(3)
    w = 0.27
    for i, (lab, v, c) in enumerate((("q (verifier)", Q, "tab:blue"), ("p (draft)", P, "tab:orange"),
                                     (f"h (Cactus, delta={DELTA})", d["cactus"]["h"], "tab:green"))):
        bars = a0.bar(x + (i - 1) * w, v, w, label=lab, color=c)
        a0.bar_label(bars, fmt="%.2f", fontsize=8)
    a0.set_xticks(x, [f"token {i + 1}" + (" (drafted)" if i == N else "") for i in range(3)])
    a0.set_ylabel("probability")
    a0.set_ylim(0, 1)
    a0.set_title("worked example: distributions")
    a0.legend(fontsize=8, loc="upper left")

    names = ["SpS", f"Cactus Taylor\ndelta={DELTA}", f"Cactus exact root\ndelta={DELTA}"]
    keys = ["sps", "cactus", "cactus_exact"]
    acc = [d[k]["accept_n"] for k in keys]
    bars = a1.bar(names, acc, color=["tab:gray", "tab:green", "tab:olive"])
    for b, k in zip(bars, keys, strict=True):
        a1.annotate(f"accept {d[k]['accept_n']:.3f}\nKL(h||q) {d[k]['kl_h']:.3f} nats",
                    (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    a1.axhline(PAPER["cactus_accept"], ls=":", color="k", lw=1, label="paper: Cactus 0.825")
    a1.axhline(PAPER["sps_accept"], ls="--", color="k", lw=1, label="paper: SpS 0.4375")
    a1.set_ylabel("P(accept drafted token 2)")
    a1.set_ylim(0, 1.2)
    a1.set_title("acceptance and KL spent")
    a1.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return save_figure(fig, ctx, "fig_a_worked_example")


def claims(d: dict) -> list[Claim]:
    c = d["cactus"]
    ok = (abs(d["sps"]["accept_n"] - PAPER["sps_accept"]) < 5e-4 and abs(c["accept_n"] - PAPER["cactus_accept"]) < 5e-3
          and np.allclose(c["h"], PAPER["h"], atol=5e-3) and abs(c["kl_h"] - PAPER["kl"]) < 5e-3)
    return [Claim(
        claim="Worked example: SpS accepts .4375; Cactus (delta about 0.21) gives h = (.16, .66, .18), acceptance .825 at KL .198 nats",
        paper_ref="overview figure", how=f"closed form (Cor. 5) at delta = {DELTA} on the paper's p, q, n",
        ours=(f"SpS {fmt(d['sps']['accept_n'], 4)}; h = ({', '.join(fmt(v, 3) for v in c['h'])}), "
              f"accept {fmt(c['accept_n'])}, KL {fmt(c['kl_h'])}; whole-step KL(h_alg||q) {fmt(c['kl_h_alg'])}"),
        paper="SpS .4375; h = (.16, .66, .18), accept .825, KL .198",
        verdict="holds" if ok else "differs",
        detail="agreement to the paper's rounding (3 decimals)" if ok else "see fig_a",
    )]


def run(ctx: Ctx) -> StepResult:
    cfg = {"p": P, "q": Q, "n": N, "delta": DELTA}
    return cached_step(ctx, NAME, cfg, lambda: compute(ctx), plot, claims)


if __name__ == "__main__":
    standalone(run)
