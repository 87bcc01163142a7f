"""Results cached under a key that hashes every input of the computation.

One key derivation (``config_key``: SHA-256 of the configuration as canonical JSON, sorted keys) and
three layouts built on it, each written atomically (``util.atomic``):

* ``KeyedFile``: one JSON file ``{"key", "config", "seconds", "data"}``, reused while its key matches;
* ``KeyedDir``: a folder of resumable pieces valid for one key (a ``KEY`` marker; stale pieces are removed);
* ``keyed_subdir``: a folder named by the key, beside folders of other configurations.

The configuration must be plain JSON (dicts, lists, strings, numbers, booleans, None) and must name
every input the cached value depends on: a rule list, a file another step wrote (by content digest),
the sampling settings, the sizes and seeds.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .atomic import atomic_write_json, atomic_write_text

__all__ = ["config_key", "read_json", "file_digest", "KeyedFile", "KeyedDir", "keyed_subdir"]


def config_key(cfg: Any, length: int = 16) -> str:
    """The first ``length`` hex digits of the SHA-256 of ``json.dumps(cfg, sort_keys=True)``."""
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:length]


def read_json(path: str | Path, default: Any = None) -> Any:
    """The parsed file, or ``default`` when it is absent or not valid JSON (a damaged cache is recomputed)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def file_digest(path: str | Path) -> str | None:
    """Content hash of an input file (None when absent): a key part that survives a fresh clone."""
    path = Path(path)
    return hashlib.sha1(path.read_bytes()).hexdigest()[:16] if path.exists() else None


class KeyedFile:
    """``path`` holds ``{"key", "config", "seconds", "data"}``; ``load`` returns ``data`` when the stored key
    is ``config_key(cfg)``, else None; ``compute`` runs ``fn``, stores its value and the seconds it took."""

    def __init__(self, path: str | Path, cfg: Any, length: int = 16):
        self.path, self.cfg, self.key = Path(path), cfg, config_key(cfg, length)

    def load(self) -> Any:
        stored = read_json(self.path)
        if isinstance(stored, dict) and stored.get("key") == self.key and "data" in stored:
            return stored["data"]
        return None

    def compute(self, fn: Callable[[], Any], jsonable: Callable[[Any], Any] = lambda x: x) -> Any:
        t0 = time.perf_counter()
        data = jsonable(fn())
        atomic_write_json(self.path, {"key": self.key, "config": self.cfg,
                                      "seconds": round(time.perf_counter() - t0, 2), "data": data})
        return data


class KeyedDir:
    """Pieces ``<folder>/<piece>.json`` valid for ``config_key(cfg)``, recorded in ``<folder>/KEY``.
    ``stale`` says whether the folder was made for another key (or none); ``reset`` removes the pieces
    and records the key; ``load`` / ``store`` read and write one piece."""

    def __init__(self, folder: str | Path, cfg: Any, length: int = 16):
        self.dir, self.key = Path(folder), config_key(cfg, length)
        marker = self.dir / "KEY"
        self.stale = not marker.exists() or marker.read_text().strip() != self.key

    def reset(self) -> None:
        if self.dir.exists():
            for f in self.dir.glob("*.json"):
                f.unlink()
        atomic_write_text(self.dir / "KEY", self.key + "\n")
        self.stale = False

    def load(self, piece: str, default: Any = None) -> Any:
        return read_json(self.dir / f"{piece}.json", default)

    def store(self, piece: str, value: Any) -> None:
        atomic_write_json(self.dir / f"{piece}.json", value)


def keyed_subdir(root: str | Path, cfg: Any, length: int = 12) -> Path:
    """``<root>/<config_key(cfg, length)>``, with ``config.json`` recording what the key means."""
    folder = Path(root) / config_key(cfg, length)
    atomic_write_json(folder / "config.json", cfg)
    return folder
