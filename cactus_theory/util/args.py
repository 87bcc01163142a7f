"""Checks of command-line values, shared by every command: argparse types (a bad value fails
before anything loads) and checks of devices and paths for a command's ``check`` (each raises
``ValueError`` naming the flag). No project imports."""

from __future__ import annotations

import argparse
import math
import os
import tempfile

__all__ = ["positive_int", "nonneg_int", "nonneg_float", "top_p_float", "check_device", "check_writable_dir",
           "check_writable_file", "read_prompts"]


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


def read_prompts(args) -> list[str]:
    """``--prompt`` values, then the non-blank lines of ``--prompts-file`` (``\\n`` read as a newline);
    ``ValueError`` when the file is missing. Each command checks the list it gets."""
    prompts = list(args.prompt)
    if args.prompts_file:
        if not os.path.isfile(args.prompts_file):
            raise ValueError(f"--prompts-file {args.prompts_file!r}: no such file")
        with open(args.prompts_file, encoding="utf-8") as f:
            prompts += [line.rstrip("\n").replace("\\n", "\n") for line in f if line.strip()]
    return prompts
