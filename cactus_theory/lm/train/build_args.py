"""``cactus-theory build-draft``'s arguments and their checks, without torch: the command line parses
and refuses a bad argument (``--epochs 1.5``, a ``--verifier`` that is not a model) at once, and imports
``draft_build`` (torch, the training code) only to run the build."""

from __future__ import annotations

import argparse
from dataclasses import replace

from ...util.args import positive_int
from ..draft_config import DEFAULT_VERIFIER, DraftConfig
from ..loading import check_model

__all__ = ["configure", "args_config", "check"]


def configure(parser: argparse.ArgumentParser) -> None:
    d = DraftConfig()
    parser.add_argument("--verifier", default=DEFAULT_VERIFIER,
                        help=f"the Llama verifier the draft is built for: {DEFAULT_VERIFIER!r} (default), a .gguf "
                             "file, a folder or a hub id; the head reads its layers (2, L // 2, L - 3)")
    parser.add_argument("--prompts", type=int, default=d.onpolicy_prompts,
                        help=f"requests answered by the verifier for training (default {d.onpolicy_prompts})")
    parser.add_argument("--wiki-docs", type=int, default=d.wiki_docs,
                        help=f"Wikipedia summaries as teacher-forced answers (default {d.wiki_docs})")
    parser.add_argument("--epochs", type=int, default=d.epochs, help=f"training epochs (default {d.epochs})")
    parser.add_argument("--shortlist", type=int, default=d.shortlist, help=f"draft vocabulary (default {d.shortlist})")
    parser.add_argument("--seed", type=int, default=d.seed, help=f"seed (default {d.seed})")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")


def args_config(args) -> DraftConfig:
    return replace(DraftConfig(), onpolicy_prompts=args.prompts, wiki_docs=args.wiki_docs, epochs=args.epochs,
                   shortlist=args.shortlist, seed=args.seed)


def check(args) -> None:
    """Every check that needs no model (``ValueError`` naming the field), before ``run``."""
    args_config(args)
    check_model(args.verifier, "--verifier")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be an integer >= 1, got {args.threads!r}")
