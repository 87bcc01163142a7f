"""The ``cactus-theory`` command.

Each subcommand lives in its own module, which defines ``configure(parser)`` (its arguments),
optionally ``check(args)`` (every check that needs no model: raise ``ValueError``) and
``run(args) -> int``. Modules load only when used, so ``--help`` answers at once, and an argument
error is reported as one line with exit status 2 before any model loads, and before torch, scipy,
cvxpy or transformers load (a command module imports them inside the functions that use them; one
whose code needs torch at import has its ``configure`` / ``check`` in a lighter module, ``ARGS``). A ``ValueError`` raised
later (a bad model path, tokenizers that differ) is a user error too: one line, exit 2, no
traceback. The reproduction of the paper is not a library command: ``make repro`` or
``python -m paper_repro`` in a clone of the repository.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main", "Parser", "run_command", "COMMANDS", "ARGS"]

DESCRIPTION = ("Check the theory of lossy speculative sampling (Cactus, Hao & Mou, ICLR 2026) on random and "
               "adversarial cases, and run speculative decoding with real language models under any "
               "acceptance rule.")

COMMANDS = {
    "verify": ("cactus_theory.claims.report", "check every theory claim on fresh random and adversarial cases"),
    "build-draft": ("cactus_theory.lm.train.draft_build", "build (or reuse from cache) the embedded draft model"),
    "decode": ("cactus_theory.cli.lm", "speculative decoding with a (draft, verifier) pair, timed against "
                                      "the verifier alone"),
    "eval": ("cactus_theory.cli.eval", "task accuracy (distinct questions x replicates, a pre-registered protocol), "
                                       "acceptance and distribution tests of every rule on a real LM, decoded by the "
                                       "project's loop or by vLLM with the plugin (--engine vllm)"),
    "check-engine": ("cactus_theory.cli.check_engine", "is an engine's speculative decoding lossless over whole decodes? "
                                                       "(our loop, transformers)"),
}
# commands whose module imports torch at import: their arguments and checks come from this lighter module,
# and the module itself is imported only to run
ARGS = {"build-draft": "cactus_theory.lm.train.build_args"}
MOVED = {"repro": "the paper's reproduction has its own entry point: run `make repro` or "
                  "`python -m paper_repro` in a clone of the repository"}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cactus-theory")
    except PackageNotFoundError:  # a source tree that is not installed
        from .. import __version__

        return __version__


class _Formatter(argparse.HelpFormatter):
    """Appends each option's default to its help, unless the help already states it or there is
    none worth stating (a flag, an empty list, no default)."""

    def _get_help_string(self, action):
        h = action.help or ""
        d = action.default
        if (not action.option_strings or "default" in h or d is None or d is False or d is argparse.SUPPRESS
                or d == [] or action.nargs == 0):
            return h
        return f"{h} (default %(default)s)" if h else "(default %(default)s)"


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with defaults in ``--help`` and one-line errors:
    ``prog: error: message (see prog --help)``, exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- running a command ------------------------------------------------------------------------------

def run_command(parser: argparse.ArgumentParser, module, argv: list[str], args_module=None) -> int:
    """Parse ``argv`` with ``configure``'s arguments, run ``check`` (if any) and ``module.run``;
    ``configure`` and ``check`` come from ``args_module`` (default: ``module``; a module name is
    imported), ``module`` may be a module name, imported only after the checks pass. A ``ValueError``
    from either is printed as one line with exit status 2, an interrupt as one line with status 130."""
    front = importlib.import_module(args_module) if isinstance(args_module, str) else args_module
    front = front if front is not None else module
    front.configure(parser)
    args = parser.parse_args(argv)
    try:
        if hasattr(front, "check"):
            front.check(args)
        if isinstance(module, str):
            module = importlib.import_module(module)
        return int(module.run(args) or 0)
    except ValueError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = Parser(prog="cactus-theory", description=DESCRIPTION,
                    epilog="Run `cactus-theory COMMAND --help` for a command's options.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    if not argv or argv[0].startswith("-"):
        parser.parse_args(argv)  # --help, --version, or an unknown option: argparse answers and exits
        parser.print_help()  # no command given
        return 0
    name = argv[0]
    if name not in COMMANDS:
        hint = MOVED.get(name, f"choose from {', '.join(COMMANDS)}")
        parser.error(f"unknown command {name!r}: {hint}")
    path, help_ = COMMANDS[name]
    front = importlib.import_module(ARGS.get(name, path))  # light: the command's own module only if so
    module = front if name not in ARGS else path
    p = Parser(prog=f"cactus-theory {name}", description=getattr(front, "DESCRIPTION", help_[0].upper() + help_[1:] + "."))
    return run_command(p, module, argv[1:], front)

