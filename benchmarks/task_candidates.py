"""Measure the verifier ALONE on each candidate task, to choose the task of ``cactus-theory eval``.

The task must be one the verifier gets right between 25% and 85% of the time at the paper's sampling
(temperature 0.6, top-k 20, top-p 0.95), with answers after ~20 or more generated tokens. Prints per
candidate: accuracy with its 95% Wilson interval, the strict ``Answer: N`` rate, the mean number of
generated tokens and of tokens before the answer, and the seconds taken (same run, one setting).

    .venv/bin/python benchmarks/task_candidates.py --problems 80 --json paper_repro/results/eval/task_candidates.json

Candidates: the seeded generators of ``cactus_theory.lm.experiments.tasks`` and, when the ``reasoning_gym``
package is installed, two of its procedural tasks at an easy setting (``rg:chain_sum``, ``rg:leg_counting``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time

import torch

from cactus_theory.core.sampling import SAMPLING
from cactus_theory.lm import ModelPair, autoregressive_generate, load_model, tasks
from cactus_theory.lm.experiments.tasks import (
    TASKS,
    Problem,
    extract_answer,
    make_problems,
    strict_answer,
)
from cactus_theory.stats import proportion_interval
from cactus_theory.util.atomic import atomic_write_json

RG = {"rg:chain_sum": dict(min_terms=2, max_terms=3, min_digits=1, max_digits=2, allow_negation=False),
      "rg:leg_counting": dict(min_animals=1, max_animals=2, max_instances=3)}


def rg_problems(name: str, n: int, seed: int) -> list[Problem]:
    import reasoning_gym

    ds = reasoning_gym.create_dataset(name.split(":", 1)[1], size=n, seed=seed, **RG[name])
    return [Problem(f"{name}/{seed}/{i}", f"{x['question'].strip()} {tasks.INSTRUCTION}", int(x["answer"]))
            for i, x in enumerate(ds)]


def tokens_before_answer(tok, text: str) -> int:
    m = list(re.finditer(r"-?\d[\d,]*", text))
    a = extract_answer(text)
    hits = [x for x in m if x.group().replace(",", "") == str(a)]
    cut = hits[-1].start() if hits else len(text)
    return len(tok(text[:cut])["input_ids"])


def rescore(path: str) -> None:
    """Accuracy of the stored texts under the current ``extract_answer`` (entries without texts: the
    first run, before texts were stored, keep only their original score)."""
    out = json.load(open(path))
    for name, row in out.items():
        if name.startswith("_") or "texts" not in row:
            continue
        ok = [extract_answer(t) == a for t, a in zip(row["texts"], row["answers"], strict=True)]
        ci = proportion_interval(sum(ok), len(ok))
        row["rescored"] = {"accuracy": ci.estimate, "low": ci.low, "high": ci.high,
                           "strict_accuracy": sum(strict_answer(t) == a for t, a in zip(row["texts"], row["answers"],
                                                                                       strict=True)) / len(ok)}
        print(f"{name:<16} rescored accuracy {ci.estimate:.3f} [{ci.low:.3f}, {ci.high:.3f}] (first score "
              f"{row['accuracy']:.3f})")
    atomic_write_json(path, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=80)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default=None, help="comma-separated candidates")
    ap.add_argument("--json", default=None)
    ap.add_argument("--instruction", default=None, help="replace tasks.INSTRUCTION (a variant to compare)")
    ap.add_argument("--tag", default="", help="suffix of the candidates' names in the output (variants)")
    ap.add_argument("--rescore", action="store_true",
                    help="no decoding: rescore the stored texts of --json with the current extractor")
    args = ap.parse_args()
    if args.rescore:
        return rescore(args.json)
    torch.set_num_threads(args.threads)
    if args.instruction:
        tasks.INSTRUCTION = args.instruction
    model, tok = load_model("smollm2")
    pair = ModelPair(model, model, tok, name="smollm2 (verifier alone)")
    names = list(TASKS)
    try:
        import reasoning_gym  # noqa: F401
        names += list(RG)
    except ImportError:
        pass
    if args.only:
        names = [s.strip() for s in args.only.split(",")]
    out = {}
    if args.json and os.path.exists(args.json):
        out = json.load(open(args.json))
    for name in names:
        probs = rg_problems(name, args.problems, 0) if name.startswith("rg:") else make_problems(name, args.problems, 0)
        t0 = time.perf_counter()
        r = autoregressive_generate(pair, [p.question for p in probs], max_new_tokens=args.max_new_tokens,
                                    **SAMPLING, batch_size=args.batch_size, seed=0)
        sec = time.perf_counter() - t0
        ok = [extract_answer(t) == p.answer for t, p in zip(r.texts, probs, strict=True)]
        strict = [strict_answer(t) == p.answer for t, p in zip(r.texts, probs, strict=True)]
        ci = proportion_interval(sum(ok), len(ok))
        row = {"accuracy": ci.estimate, "low": ci.low, "high": ci.high, "strict_accuracy": sum(strict) / len(ok),
               "n": len(ok), "mean_new_tokens": sum(map(len, r.tokens)) / len(ok),
               "mean_tokens_before_answer": sum(tokens_before_answer(tok, t) for t in r.texts) / len(ok),
               "cut_at_budget": sum(len(t) >= args.max_new_tokens for t in r.tokens) / len(ok),
               "seconds": sec, "instruction": tasks.INSTRUCTION,
               "texts": r.texts, "answers": [p.answer for p in probs], "example": {"question": probs[0].question, "answer": probs[0].answer,
                                           "response": r.texts[0]}}
        name = name + args.tag
        out[name] = row
        print(f"{name:<16} accuracy {row['accuracy']:.3f} [{row['low']:.3f}, {row['high']:.3f}]  strict "
              f"{row['strict_accuracy']:.3f}  tokens {row['mean_new_tokens']:.0f} (before answer "
              f"{row['mean_tokens_before_answer']:.0f}, cut at budget {row['cut_at_budget']:.2f})  {sec:.0f} s",
              flush=True)
        if args.json:
            atomic_write_json(args.json, {**out, "_settings": {
                "problems": args.problems, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
                "threads": args.threads, "sampling": SAMPLING.label(), "seed": 0}})


if __name__ == "__main__":
    main()
