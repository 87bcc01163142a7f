"""Table m (our check, not the paper's): is the decode loop lossless end to end, in the eval's setting?

(a) Deterministic audit (``lm.experiments.loop_audit.audit_decode``) of whole decodes of a ragged batch of
    32 chat-templated prompts the eval does not use (16 arithmetic questions of another seed, 16 of the
    benchmark's long-form prompts), batch 32, up to 128 new tokens, EOS, the paper's sampling, SpS on the
    chain (k = 4) and on the eval's 8-node EAGLE-2 tree (depth 4, top-2), in float32 (the eval's dtype)
    and bfloat16: every ``q`` and ``p`` the loop handed to ``verify`` / ``verify_tree`` against fresh Hugging
    Face forwards, every draw and every verification replayed from the rows' own uniform streams, the
    outputs rebuilt. Pre-registered reading: float32 holds if every replay matches exactly, no support
    differs and every row's TV to the reference is <= ``TOL_FP32``; bfloat16 (where the Hugging Face
    reference rounds differently from the compact Llama) holds if every replay matches exactly and the
    loop's laws are no farther from a float32 baseline than bfloat16's own reference is: the 99th
    percentile TV within ``BF16_RATIO`` times the reference's, and the tree-candidate disagreements with the
    reference no more than ``BF16_RATIO`` times the baseline's own.

``python -m paper_repro.table_m_lossless [--fast]`` writes ``paper_repro/results/table_m_lossless.md``.
"""

from __future__ import annotations

import os

from cactus_theory.core.sampling import SAMPLING

from .common import (
    Claim,
    Ctx,
    Parts,
    StepResult,
    cached_step,
    report_section,
    standalone,
    write_markdown,
)
from .lm_runs import set_threads

NAME = "table_m_lossless"
TOL_FP32 = 1e-4  # TV per row: float32 rounding of two implementations of the same network (measured ~2e-5)
BF16_RATIO = 1.5
FAMILY = "step m's claims, each its own statement (one per dtype and draft shape)"
CONFIGS = [("float32", "chain"), ("float32", "tree"), ("bfloat16", "chain"), ("bfloat16", "tree")]


def config(ctx: Ctx) -> dict:
    fast = ctx.fast
    return {"seed": ctx.seed, "sampling": SAMPLING.as_dict(), "pair": _pair_id(ctx),
            "audit": {"arith": 2 if fast else 16, "long": 2 if fast else 16, "max_new_tokens": 8 if fast else 128,
                      "batch_size": 32, "k": 4, "tree": [4, 2, 2] if fast else [8, 4, 2], "arith_seed": 9001,
                      "configs": [list(c) for c in CONFIGS]},
            "version": 1}


def _pair_id(ctx: Ctx) -> str:
    if ctx.lm.get("pair") is not None:
        return "injected"
    from cactus_theory.lm.draft import DraftConfig, draft_path

    return f"smollm2+embedded ({os.path.basename(draft_path(DraftConfig()))})"


def _pair(ctx: Ctx, dtype: str):
    import torch

    if ctx.lm.get("pair") is not None:  # an injected pair (tests): cast to the audited dtype
        import copy

        from cactus_theory.lm import ModelPair

        pr = ctx.lm["pair"]
        dt = getattr(torch, dtype)
        if next(pr.verifier.parameters()).dtype == dt:
            return pr
        return ModelPair(copy.deepcopy(pr.draft).to(dt), copy.deepcopy(pr.verifier).to(dt), pr.tokenizer,
                         eos_token_id=pr.eos_token_id)
    from cactus_theory.lm import load_pair

    from .lm_runs import build_embedded_draft_if_missing

    build_embedded_draft_if_missing()
    return load_pair(dtype=getattr(torch, dtype))


def audit_prompts(pair, cfg: dict) -> list:
    """The audit's prompts: arithmetic questions of a seed the eval never draws, then long-form prompts."""
    from cactus_theory.lm.data import prompt_set
    from cactus_theory.lm.experiments import tasks

    a = cfg["audit"]
    if pair.tokenizer is None:
        return [[1, 2, 3], [4, 5], [6], [7, 8, 9, 1]] * ((a["arith"] + a["long"]) // 4 + 1)
    arith = [p.question for p in tasks.make_problems("arith", a["arith"], seed=a["arith_seed"])]
    return arith + prompt_set()[:a["long"]]


def compute(ctx: Ctx, cfg: dict) -> dict:
    import torch

    from cactus_theory.core.tree import BudgetTree
    from cactus_theory.lm.experiments.loop_audit import audit_decode

    set_threads(ctx)
    parts = Parts(ctx, NAME, cfg)
    a = cfg["audit"]
    out = []
    for dtype, method in (tuple(c) for c in a["configs"]):
        def one(dtype=dtype, method=method):
            pair = _pair(ctx, dtype)
            kw = dict(tree=BudgetTree(*a["tree"])) if method == "tree" else dict(k=a["k"])
            r = audit_decode(pair, audit_prompts(pair, cfg), method=method, max_new_tokens=a["max_new_tokens"],
                             batch_size=a["batch_size"], seed=cfg["seed"], sampling=SAMPLING.as_tuple(),
                             tolerance=TOL_FP32, baseline_dtype=torch.float32 if dtype == "bfloat16" else None,
                             **kw)
            return r.as_dict()
        out.append(parts.get(f"audit_{dtype}_{method}", one))
    return {"config": cfg, "pair": cfg["pair"], "audit": out}


def _verdict(r: dict) -> tuple[str, str]:
    """(verdict, the numbers it rests on) of one audit under the pre-registered reading."""
    d, q, p, o = r["draws"], r["q"], r["p"], r["outputs"]
    replays = {k: d[k] for k in ("first", "plain", "drafted", "verify") if d[k]["checked"]}  # a fixed order
    replay_ok = all(v["mismatched"] == 0 for v in replays.values()) and o["mismatched"] == 0
    exact = ", ".join(f"{k} {v['checked'] - v['mismatched']}/{v['checked']}" for k, v in replays.items())
    nums = f"replays exact: {exact}; outputs {o['rows'] - o['mismatched']}/{o['rows']}"
    if r["setting"]["dtype"] == "float32":
        cand = d["tree_candidates"]
        ok = (replay_ok and q["max_tv"] <= TOL_FP32 and p["max_tv"] <= TOL_FP32
              and q["support_mismatch"] + p["support_mismatch"] == 0 and cand["mismatched"] == 0)
        nums += (f"; max TV q {q['max_tv']:.1e} ({q['rows']} rows), p {p['max_tv']:.1e} ({p['rows']} rows); supports "
                 f"differing {q['support_mismatch'] + p['support_mismatch']}")
        if cand["checked"]:
            nums += f"; trees equal to the reference {cand['checked'] - cand['mismatched']}/{cand['checked']}"
        return ("holds" if ok else "differs"), nums
    ok = replay_ok
    for name, law in (("q", q), ("p", p)):
        loop, ref = law["baseline"]["p99_tv"], law["reference_vs_baseline"]["p99_tv"]
        ok &= loop <= BF16_RATIO * ref
        nums += f"; p99 TV to float32: {name} loop {loop:.3f}, bf16 reference {ref:.3f}"
    cand, rb = d["tree_candidates"], d["tree_reference_vs_baseline"]
    if cand["checked"]:
        ok &= cand["mismatched"] <= BF16_RATIO * max(rb["mismatched"], 1)
        nums += (f"; trees differing from the bf16 reference {cand['mismatched']}/{cand['checked']} (the float32 tree "
                 f"differs from it at {rb['mismatched']}/{rb['checked']})")
    return ("holds" if ok else "differs"), nums


def render(d: dict) -> str:
    c = d["config"]["audit"]
    lines = ["# Table m: the decode loop, lossless end to end", "",
             f"Pair: {d['pair']}; {c['arith'] + c['long']} chat prompts ({c['arith']} arithmetic questions of seed "
             f"{c['arith_seed']}, {c['long']} long-form), batch {c['batch_size']}, up to {c['max_new_tokens']} new "
             "tokens, EOS; the paper's sampling; SpS. Law differences are TVs of the rows handed to verify against "
             "fresh Hugging Face forwards (max / 99th percentile / median); replays are exact token comparisons.", "",
             "| dtype | draft | steps | rejections (past token 64) | q rows: max / p99 TV | p rows: max / p99 TV | "
             "supports differing | replays and outputs exact | trees = reference tree | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["audit"]:
        s, q, p, o, dr = r["setting"], r["q"], r["p"], r["outputs"], r["draws"]
        rep = [v for k, v in dr.items() if k not in ("tree_reference_vs_baseline", "tree_candidates")]
        checked, bad = sum(v["checked"] for v in rep), sum(v["mismatched"] for v in rep) + o["mismatched"]
        tc = dr["tree_candidates"]
        trees = f"{tc['checked'] - tc['mismatched']}/{tc['checked']}" if tc["checked"] else "-"
        shape = f"chain k = {s['k']}" if s["method"] == "chain" else f"EAGLE-2 tree {'/'.join(map(str, c['tree']))}"
        rej = f"{o['rejections']} ({o['rejections_past_64']})" if s["method"] == "chain" else "-"
        lines.append(f"| {s['dtype']} | {shape} | {o['steps']} | {rej} | {q['max_tv']:.1e} / {q['p99_tv']:.1e} | "
                     f"{p['max_tv']:.1e} / {p['p99_tv']:.1e} | {q['support_mismatch'] + p['support_mismatch']} | "
                     f"{checked + o['rows'] - bad}/{checked + o['rows']} | {trees} | {_verdict(r)[0]} |")
    lines += ["", "bfloat16 against a float32 baseline (the rounding scale): the loop's laws and the bfloat16 Hugging Face "
              "reference, each against fresh float32 forwards.", "",
              "| draft | law | loop vs float32: median / p99 / max TV | bf16 reference vs float32: median / p99 / max TV |",
              "|---|---|---|---|"]
    for r in d["audit"]:
        if r["setting"]["dtype"] != "bfloat16":
            continue
        for name in ("q", "p"):
            b, rb = r[name]["baseline"], r[name]["reference_vs_baseline"]
            lines.append(f"| {r['setting']['method']} | {name} | {b['median_tv']:.4f} / {b['p99_tv']:.3f} / "
                         f"{b['max_tv']:.3f} | {rb['median_tv']:.4f} / {rb['p99_tv']:.3f} / {rb['max_tv']:.3f} |")
    return "\n".join(lines) + "\n"


def section(d: dict) -> str:
    return report_section("### m. The decode loop, lossless end to end (our check)", render(d))


def claims(d: dict) -> list[Claim]:
    out = []
    for r in d["audit"]:
        s = r["setting"]
        verdict, nums = _verdict(r)
        shape = "chain k = 4" if s["method"] == "chain" else "EAGLE-2 tree " + "/".join(map(str, d["config"]["audit"]["tree"]))
        rule = (f"holds if every replay is exact, no support differs and every TV <= {TOL_FP32:g}; else differs"
                if s["dtype"] == "float32" else
                f"holds if every replay is exact and the loop's 99th-percentile TV to float32 is within {BF16_RATIO:g}x "
                "the bfloat16 reference's (trees: disagreements within the same ratio); else differs")
        out.append(Claim(
            f"loop-audit-{s['dtype']}-{s['method']}", f"the loop hands verify the models' exact laws and emits what "
            f"verify returns ({s['dtype']}, {shape}, whole decodes)", "ours (issue 24, deliverable 3a)", "code",
            "lm.experiments.loop_audit on 32 ragged chat prompts, batch 32, 128 new tokens, EOS: laws against fresh "
            "Hugging Face forwards, draws and verifications replayed from the rows' uniform streams",
            nums, verdict, units=f"{s['prompts']} decodes, {r['outputs']['steps']} steps", decision=rule,
            family=FAMILY))
    return out


def findings(results, claims: list[Claim]) -> list[str]:
    rows = [c for c in claims if c.key.startswith("loop-audit-")]
    if not rows:
        return []
    cells = "; ".join(f"{c.key.removeprefix('loop-audit-')}: {c.verdict}" for c in rows)
    return ["* **Lossless end to end** (our check; REPORT.md section m): whole decodes of a ragged 32-row chat batch "
            f"(128 new tokens, EOS) replayed against fresh forwards and the rows' own random streams: {cells}."]


def run(ctx: Ctx) -> StepResult:
    cfg = config(ctx)

    return cached_step(ctx, NAME, cfg, lambda: compute(ctx, cfg), write_markdown(NAME, render), claims)


if __name__ == "__main__":
    standalone(run)
