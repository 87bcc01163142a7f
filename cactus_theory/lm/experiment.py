"""The real-LM experiment as a function (used by ``benchmarks/bench_lm.py`` and the repro job):
each rule at each k against the verifier decoding alone, same prompts, same sampling, same run."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from .. import registry
from ..rules import TAS, Cactus, Interpolation, SpS, TopK
from .generate import autoregressive_generate, speculative_generate

__all__ = ["DEFAULT_RULES", "SAMPLING", "run_benchmark", "format_table"]

DEFAULT_RULES = [(registry.label(r), r) for r in (SpS(), TAS(0.09, 0.3), TopK(5), Interpolation(0.5), Cactus(0.25),
                                        Cactus(0.5), Cactus(1.0))]
SAMPLING = dict(temperature=0.6, top_k=20, top_p=0.95)


def run_benchmark(pair, prompts, rules=DEFAULT_RULES, ks=(4, 8), max_new_tokens: int = 64, batch_size: int = 1,
                  seed: int = 0, sampling: dict = SAMPLING, progress: bool = True) -> dict:
    """Decode ``prompts`` with the verifier alone (twice: first and last) and with every (rule, k);
    return ``{"baseline": [...], "rows": [...], "reference_tokens_per_s": ...}``; each row has the
    rule, k, al, al_bonus, acceptance_rate, tokens_per_s, speedup, mean_step_kl, nll and counters."""
    kw = dict(max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, **sampling)
    jobs = [(label, rule, k) for k in ks for label, rule in rules]
    bar = tqdm(total=len(jobs) + 2, desc="bench_lm", disable=not progress)
    base = [autoregressive_generate(pair, prompts, **kw).stats]
    bar.update()
    rows = []
    for label, rule, k in jobs:
        s = speculative_generate(pair, prompts, rule, k=k, **kw).stats
        rows.append({**s.as_dict(), "rule": label, "repr": repr(rule)})
        bar.set_postfix(rule=label, k=k, al=f"{s.al:.2f}")
        bar.update()
    base.append(autoregressive_generate(pair, prompts, **kw).stats)
    bar.update()
    bar.close()
    ref = sum(b.tokens_per_s for b in base) / len(base)
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / ref
    sps = {r["k"]: r["al"] for r in rows if r["repr"] == repr(SpS())}
    for r in rows:
        r["al_vs_sps"] = r["al"] / sps[r["k"]] if sps.get(r["k"]) else float("nan")
    return {"baseline": [b.as_dict() for b in base], "reference_tokens_per_s": ref, "rows": rows,
            "baseline_nll": sum(b.nll for b in base) / len(base),
            "settings": {"max_new_tokens": max_new_tokens, "batch_size": batch_size, "seed": seed,
                         "prompts": len(prompts), **sampling, "threads": torch.get_num_threads()}}


def format_table(res: dict) -> str:
    runs = ", ".join(f"{b['tokens_per_s']:.2f}" for b in res["baseline"])
    lines = [f"verifier alone: {res['reference_tokens_per_s']:.2f} tokens/s (runs: {runs}), NLL {res['baseline_nll']:.3f}",
             f"{'rule':<22}{'k':>3}{'AL':>7}{'AL/SpS':>8}{'AL+1':>7}{'acc':>7}{'tok/s':>8}{'speedup':>9}"
             f"{'step KL':>9}{'NLL':>7}"]
    for r in res["rows"]:
        lines.append(f"{r['rule']:<22}{r['k']:>3}{r['al']:>7.3f}{r['al_vs_sps']:>8.2f}{r['al_bonus']:>7.3f}"
                     f"{r['acceptance_rate']:>7.3f}{r['tokens_per_s']:>8.2f}{r['speedup']:>8.2f}x"
                     f"{r['mean_step_kl']:>9.4f}{r['nll']:>7.3f}")
    return "\n".join(lines)
