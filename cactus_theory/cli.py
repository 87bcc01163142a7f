"""The ``cactus-theory`` command. Each subcommand lives in its own module, which defines
``configure(parser)`` (its arguments) and ``run(args) -> int``; modules load only when used."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "verify": ("cactus_theory.report", "check every theory claim on fresh random and adversarial cases"),
    "build-draft": ("cactus_theory.lm.draft", "build (or reuse from cache) the embedded draft model"),
    "decode": ("cactus_theory.lm.cli", "speculative decoding with a (draft, verifier) pair"),
    "eval": ("cactus_theory.lm.eval", "task accuracy, acceptance and distribution tests of every rule on a real LM"),
    "repro": ("paper_repro.main", "regenerate every figure, table and paper_repro/REPORT.md"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="cactus-theory", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser.print_help()
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    name = argv[0]
    module = importlib.import_module(COMMANDS[name][0])
    p = argparse.ArgumentParser(prog=f"cactus-theory {name}", description=COMMANDS[name][1])
    module.configure(p)
    return int(module.run(p.parse_args(argv[1:])) or 0)


if __name__ == "__main__":
    sys.exit(main())
