"""``cactus-theory decode``: speculative decoding with a (draft, verifier) pair, printing the texts
and the statistics (defaults: the embedded SmolLM2 pair, the paper's sampling)."""

from __future__ import annotations

import argparse
import json
import os

__all__ = ["configure", "run", "rule_from_args"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    parser.add_argument("--prompts-file", help="a text file with one prompt per line")
    from ..registry import add_rule_arguments

    add_rule_arguments(parser)
    parser.add_argument("-k", type=int, default=4, help="drafted tokens per step")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draft", default="embedded", help="'embedded', 'smollm2', a .gguf path, a folder or a hub id")
    parser.add_argument("--verifier", default="smollm2", help="'smollm2', a .gguf path, a folder or a hub id")
    parser.add_argument("--no-chat", action="store_true", help="feed prompts raw, without the chat template")
    parser.add_argument("--baseline", action="store_true", help="also run the verifier alone and print the speedup")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", help="write the statistics to this JSON file")


def rule_from_args(args):
    from ..registry import rule_from_args as from_args

    return from_args(args)


def _prompts(args) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file:
        if not os.path.isfile(args.prompts_file):
            raise ValueError(f"--prompts-file {args.prompts_file!r} does not exist")
        with open(args.prompts_file, encoding="utf-8") as f:
            prompts += [line.rstrip("\n").replace("\\n", "\n") for line in f if line.strip()]
    if not prompts:
        raise ValueError("give at least one --prompt or a --prompts-file")
    return prompts


def _print_stats(label: str, s) -> None:
    print(f"[{label}] sequences {s.sequences}, new tokens {s.new_tokens}, {s.tokens_per_s:.2f} tokens/s, "
          f"verifier forwards {s.verifier_calls}")
    if s.method == "speculative":
        print(f"[{label}] AL {s.al:.3f} (with bonus {s.al_bonus:.3f}), acceptance rate {s.acceptance_rate:.3f}, "
              f"mean exact step KL(h_alg || q) {s.mean_step_kl:.4f}")
    print(f"[{label}] verifier NLL {s.nll:.4f} nats/token")


def run(args) -> int:
    import torch

    from .generate import autoregressive_generate, speculative_generate
    from .pair import ModelPair, load_model, load_pair

    rule = rule_from_args(args)
    prompts = _prompts(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.draft == args.verifier:  # self-drafting: one model, loaded once
        model, tok = load_model(args.verifier)
        pair = ModelPair(model, model, tok, name=f"{args.verifier} (self-draft)")
    else:
        pair = load_pair(args.draft, args.verifier)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
              top_p=args.top_p, batch_size=args.batch_size, seed=args.seed, chat=not args.no_chat)
    res = speculative_generate(pair, prompts, rule, k=args.k, **kw)
    for i, text in enumerate(res.texts or []):
        print(f"--- [{i}] {prompts[i][:60]!r}\n{text}\n")
    _print_stats(f"{rule!r}, k={args.k}", res.stats)
    out = {"pair": pair.name, "rule": repr(rule), "speculative": res.stats.as_dict(), "texts": res.texts}
    if args.baseline:
        base = autoregressive_generate(pair, prompts, **kw)
        _print_stats("verifier alone", base.stats)
        print(f"speedup over the verifier alone: {res.stats.tokens_per_s / base.stats.tokens_per_s:.2f}x")
        out["autoregressive"] = base.stats.as_dict()
    if args.json:
        tmp = f"{args.json}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=2)
        os.replace(tmp, args.json)
    return 0
