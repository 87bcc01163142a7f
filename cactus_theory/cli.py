"""The ``cactus-theory`` command.

Each subcommand lives in its own module, which defines ``configure(parser)`` (its arguments),
optionally ``check(args)`` (every check that needs no model: raise ``ValueError``) and
``run(args) -> int``. Modules load only when used, so ``--help`` answers at once, and an argument
error is reported as one line with exit status 2 before any model loads. A ``ValueError`` raised
later (a bad model path, tokenizers that differ) is a user error too: one line, exit 2, no
traceback. The reproduction of the paper is not a library command: ``make repro`` or
``python -m paper_repro`` in a clone of the repository.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import tempfile

__all__ = ["main", "Parser", "run_command", "positive_int", "nonneg_int", "nonneg_float", "top_p_float",
           "check_device", "check_writable_dir", "check_writable_file"]

DESCRIPTION = ("Check the theory of lossy speculative sampling (Cactus, Hao & Mou, ICLR 2026) on random and "
               "adversarial cases, and run speculative decoding with real language models under any "
               "acceptance rule.")

COMMANDS = {
    "verify": ("cactus_theory.report", "check every theory claim on fresh random and adversarial cases"),
    "build-draft": ("cactus_theory.lm.draft_build", "build (or reuse from cache) the embedded draft model"),
    "decode": ("cactus_theory.lm.cli", "speculative decoding with a (draft, verifier) pair, timed against "
                                      "the verifier alone"),
    "eval": ("cactus_theory.lm.eval", "task accuracy, acceptance and distribution tests of every rule on a real LM"),
}
MOVED = {"repro": "the paper's reproduction has its own entry point: run `make repro` or "
                  "`python -m paper_repro` in a clone of the repository"}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cactus-theory")
    except PackageNotFoundError:  # a source tree that is not installed
        from . import __version__

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


# -- argument types: checked by argparse, so a bad value fails before anything loads -----------------

def _number(text: str, kind, what: str, ok) -> int | float:
    try:
        v = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if isinstance(v, float) and not math.isfinite(v) or not ok(v):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _number(text, int, "an integer >= 1", lambda v: v >= 1)


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _number(text, int, "an integer >= 0", lambda v: v >= 0)


def nonneg_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    return _number(text, float, "a finite number >= 0", lambda v: v >= 0)


def top_p_float(text: str) -> float:
    """argparse type: a number in (0, 1]."""
    return _number(text, float, "a number in (0, 1]", lambda v: 0 < v <= 1)


# -- checks of paths and devices, for a command's ``check`` (each raises ValueError naming the flag) --------

def check_device(text: str | None, flag: str = "--device") -> None:
    """``text`` must name a torch device that exists here (``cpu``, ``cuda``, ``cuda:1``, ``mps``, ...).
    Imports torch (no model): call it from a command's ``check``, after the cheap checks."""
    if text is None:
        return
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{flag} {text!r} is not a torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    if dev.type == "cpu":
        return
    backend = getattr(torch, dev.type, None) if dev.type != "mps" else getattr(torch.backends, "mps", None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise ValueError(f"{flag} {text!r}: no {dev.type} device is available on this machine")
    count = getattr(backend, "device_count", None)
    if dev.index is not None and count is not None and dev.index >= count():
        raise ValueError(f"{flag} {text!r}: this machine has {count()} {dev.type} device(s) (indices 0..{count() - 1})")


def _nearest_existing(path: str) -> str:
    """``path`` itself, or its nearest ancestor that exists."""
    cur = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(cur):
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    return cur


def check_writable_dir(path: str | None, flag: str, *, shown: str | None = None) -> None:
    """``path`` is a folder this process can write in, or can be created (its nearest existing ancestor is
    a writable folder, not a file). ``shown``: the value to quote in the message (default ``path``)."""
    if path is None:
        return
    shown = path if shown is None else shown
    if not str(path).strip():
        raise ValueError(f"{flag} must name a folder, got {path!r}")
    full = os.path.abspath(os.path.expanduser(path))
    base = _nearest_existing(full)
    if not os.path.isdir(base):
        raise ValueError(f"{flag} {shown!r}: {base!r} is a file, not a folder")
    try:  # a real write (os.access says yes to root even where writes fail, e.g. under /proc)
        with tempfile.TemporaryFile(dir=base, prefix=".cactus-theory-write-check-"):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {shown!r}: cannot write in folder {base!r} ({e.strerror or type(e).__name__})") from None


def check_writable_file(path: str | None, flag: str) -> None:
    """``path`` names a file this process can write: not a folder, and its folder exists or can be created
    and is writable (the project writes atomically: a new file moved onto ``path``, see ``atomic``)."""
    if path is None:
        return
    if not str(path).strip() or os.path.isdir(path):
        raise ValueError(f"{flag} {path!r} must name a file, not a folder")
    check_writable_dir(os.path.dirname(os.path.abspath(os.path.expanduser(path))), flag, shown=path)


# -- running a command ------------------------------------------------------------------------------

def run_command(parser: argparse.ArgumentParser, module, argv: list[str]) -> int:
    """Parse ``argv`` with ``module.configure``'s arguments, run ``module.check`` (if any) and
    ``module.run``; a ``ValueError`` from either is printed as one line with exit status 2, an
    interrupt as one line with status 130."""
    module.configure(parser)
    args = parser.parse_args(argv)
    try:
        if hasattr(module, "check"):
            module.check(args)
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
    module = importlib.import_module(COMMANDS[name][0])
    help_ = COMMANDS[name][1]
    p = Parser(prog=f"cactus-theory {name}", description=getattr(module, "DESCRIPTION", help_[0].upper() + help_[1:] + "."))
    return run_command(p, module, argv[1:])


if __name__ == "__main__":
    sys.exit(main())
