"""Table g: the lossy rules production servers ship, against Cactus at matched acceptance and cost.

For each production rule (SGLang threshold acceptance, MAX / TensorRT-LLM relaxed acceptance, Medusa
typical acceptance, vLLM's FLy, and TAS for reference) on the pairs of figure c: its exact mean
acceptance and mean ``KL(h_alg || q)``; the Cactus budget with the same acceptance and what Cactus
costs there; the budget with the same cost and what Cactus accepts there (``tradeoff.matched_cactus``).
Two draft modes: ``sampled`` (the draft token drawn from ``p``, as figure c) and ``greedy`` (the
draft's argmax, ``p = e_{argmax p}``: how SGLang's EAGLE chains and MAX's relaxed acceptance run).
A per-step proxy: quality is the divergence of one step's law, not task accuracy.

``python -m paper_repro.table_g_production [--fast]`` writes ``paper_repro/results/table_g_production.md``.
"""

from __future__ import annotations

import math

import numpy as np
from tqdm import tqdm

from cactus_theory import registry
from cactus_theory.rules import TAS, FLy, MedusaTypical, RelaxedAcceptance, SGLangThreshold
from cactus_theory.tradeoff import matched_cactus

from .common import (
    Ctx,
    StepResult,
    cached_step,
    file_digest,
    standalone,
    write_markdown,
)
from .fig_c_tradeoff import load_lm_pairs, random_pairs

NAME = "table_g_production"
RULES = [
    SGLangThreshold(1.0, 0.5), SGLangThreshold(1.0, 0.2), SGLangThreshold(0.8, 0.4),
    RelaxedAcceptance(10, 0.6), RelaxedAcceptance(10, 0.01),
    MedusaTypical(0.09, 0.3),
    FLy(0.3, 3, 1.0), FLy(0.3, 3, 0.5), FLy(0.3, 3, 0.1),
    TAS(0.09, 0.3, entropy_eps=1e-5),  # as vLLM computes its entropy (what the reproduction runs)
]


def config(ctx: Ctx) -> dict:
    lm = ctx.results / "lm_pairs.npz"
    return {"R": 12 if ctx.fast else 48, "V": 64 if ctx.fast else 256, "sigma": 1.0, "seed": ctx.seed,
            "rules": [repr(r) for r in RULES], "lm_pairs": file_digest(lm)}


def greedy(P: np.ndarray) -> np.ndarray:
    """The argmax draft as a law: ``e_{argmax p}`` per row."""
    return np.eye(P.shape[-1])[P.argmax(-1)]


def table(P: np.ndarray, Q: np.ndarray, label: str) -> list[dict]:
    out = []
    for mode, D in (("sampled", P), ("greedy", greedy(P))):
        for rule in tqdm(RULES, desc=f"table g: {label} {mode}", leave=False):
            m = matched_cactus(rule, D, Q, "kl")
            out.append({"rule": registry.label(rule), "mode": mode, **m.__dict__})
    return out


def compute(ctx: Ctx, cfg: dict) -> dict:
    P, Q = random_pairs(np.random.default_rng(cfg["seed"]), cfg["R"], cfg["V"], cfg["sigma"])
    out = {"random": table(P, Q, "random")}
    lm = load_lm_pairs(ctx.results / "lm_pairs.npz")
    if lm is not None:
        out["lm"] = table(*lm, "LM")
    return out


def _f(x: float, nd: int = 3) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{nd}f}" if abs(x) >= 10 ** -nd or x == 0 else f"{x:.1e}"


def render(d: dict, cfg_note: str) -> str:
    lines = ["# Table g: production lossy rules vs Cactus at matched acceptance and cost", "",
             "Exact one-step laws (`exact.induced_distribution`), means over rows; cost = mean KL(h_alg || q) "
             "in nats. 'Cactus at same acceptance': the Cactus budget delta with the rule's acceptance and "
             "Cactus's cost there ('-' where SpS, delta = 0, already accepts more at zero cost). 'Cactus at same "
             "cost': the budget with the rule's cost and Cactus's acceptance there ('inf' where the rule costs "
             "more than accepting every draft costs Cactus, i.e. KL(p || q)). " + cfg_note, ""]
    for key, title in (("random", "random correlated pairs (figure c's)"), ("lm", "LM-derived pairs")):
        if key not in d:
            continue
        lines += [f"## {title}", "",
                  "| rule | draft | acceptance | KL cost | Cactus delta (same acc.) | Cactus KL there | "
                  "Cactus delta (same KL) | Cactus acc. there |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in d[key]:
            lines.append(f"| {r['rule']} | {r['mode']} | {_f(r['accept'])} | {_f(r['cost'])} | "
                         f"{_f(r['delta_at_accept'], 4)} | {_f(r['cactus_cost'])} | {_f(r['delta_at_cost'], 4)} | "
                         f"{_f(r['cactus_accept'])} |")
        lines.append("")
    return "\n".join(lines)


def run(ctx: Ctx) -> StepResult:
    cfg = config(ctx)
    note = f"Random pairs: {cfg['R']} rows, V = {cfg['V']}, seed {cfg['seed']}{' (fast mode)' if ctx.fast else ''}."

    return cached_step(ctx, NAME, cfg, lambda: compute(ctx, cfg), write_markdown(NAME, lambda d: render(d, note) + "\n"),
                       lambda d: [])


if __name__ == "__main__":
    standalone(run)
