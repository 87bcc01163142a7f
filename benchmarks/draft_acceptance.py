"""Teacher-forced acceptance of the embedded draft on the benchmark's own prompts.

The verifier answers the evaluation prompts (``lm.data.prompt_set``: math, code, prose) with the
decoding sampling (T 0.6, top-k 20, top-p 0.95); along those answers, the draft's expected SpS
acceptance ``sum_i min(p'_i, q'_i)`` at draft depths 1..4 (depth ``s`` reads the head's own features
for its last ``s - 1`` steps), per style and over all. This is the build report's held-out number on
the prompts ``bench_lm.py`` decodes: it separates "the draft is weaker on these prompts" from
"the decode loop loses acceptance".

    .venv/bin/python benchmarks/draft_acceptance.py --out benchmarks/results/lm/draft_acceptance.json
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import torch

from cactus_theory.lm.data import prompt_set
from cactus_theory.lm.draft import DraftConfig, load_draft
from cactus_theory.lm.llama import Llama
from cactus_theory.lm.train import draft_build
from cactus_theory.util.atomic import atomic_write_json

STYLES = ("math", "code", "prose")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-style", type=int, default=8, help="prompts per style (at most 8)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                    help="verifier compute dtype (the build uses bfloat16 on CPUs with AMX)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    prompts = prompt_set(args.per_style)  # validates --per-style before any model loads
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    torch.set_num_threads(args.threads)
    from cactus_theory.lm.pair import load_model

    t0 = time.time()
    verifier, tok = load_model("smollm2")
    model = Llama.from_hf(verifier, dtype=getattr(torch, args.dtype))
    draft = load_draft(verifier)
    cfg = replace(DraftConfig(), onpolicy_tokens=args.max_new_tokens, gen_batch=len(prompts))
    gen = torch.Generator().manual_seed(args.seed)
    out = {"settings": {**vars(args), "prompts": len(prompts)}, "by_style": {}}
    for i, style in enumerate(STYLES):
        ids = [draft_build.encode_chat(tok, p)[0] for p in prompts[i::3]]
        corpus = draft_build.collect_onpolicy(model, ids, cfg, tok.eos_token_id, gen, progress=False)
        out["by_style"][style] = {"answer_tokens": corpus.answer_tokens,
                                  "acceptance_by_depth": draft_build.depth_acceptance(draft, corpus, cfg)}
    n = sum(s["answer_tokens"] for s in out["by_style"].values())
    out["all"] = [sum(s["answer_tokens"] * s["acceptance_by_depth"][d] for s in out["by_style"].values()) / n
                  for d in range(4)]
    out["build_report_heldout"] = (getattr(draft, "info", {}) or {}).get("heldout_acceptance_by_depth")
    out["seconds"] = time.time() - t0
    for style, s in out["by_style"].items():
        print(f"{style:<6} {s['answer_tokens']:>5} answer tokens: " + " ".join(f"{a:.3f}" for a in s["acceptance_by_depth"]))
    print("all    " + " ".join(f"{a:.3f}" for a in out["all"]) + "   (build report, held-out requests: "
          + " ".join(f"{a:.3f}" for a in out["build_report_heldout"] or []) + ")")
    if args.out:
        atomic_write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
