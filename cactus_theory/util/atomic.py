"""Atomic file writes: the one helper every writer of results, figures, caches and notebooks uses.

A file is written under a temporary name in its own folder and moved onto its final name with
``os.replace`` (atomic on POSIX and Windows), so a reader or an interrupted run never sees a
half-written file, and a rerun can trust whatever file it finds.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "atomic_write_text", "atomic_write_bytes", "atomic_write_json"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for any writer (``savefig``, ``torch.save``,
    ``np.savez``...); on normal exit it replaces ``path``, on an exception it is removed.

    The temporary name keeps ``path``'s suffix (``.name.<pid>.tmp.npz``), so writers that choose a
    format by extension, or append one, behave as they would on ``path``. Parent folders are made.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see the module docstring)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int = 1, sort_keys: bool = True) -> None:
    """Write ``obj`` as JSON (with a final newline) to ``path`` atomically; NaN and inf are kept
    as JSON's ``NaN`` / ``Infinity`` extensions, which Python's ``json`` reads back."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")
