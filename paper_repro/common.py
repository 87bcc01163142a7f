"""Shared plumbing of the reproduction steps: paths, fast mode, atomic cached results, figures.

Claims are ``cactus_theory.claims.ledger.Claim``, the row type ``cactus-theory verify`` uses too."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cactus_theory.claims.ledger import VERDICTS, Claim  # noqa: F401  (the one claim type, re-exported)
from cactus_theory.util.atomic import atomic_path, atomic_write_text  # noqa: F401  (re-exported)
from cactus_theory.util.atomic import atomic_write_json as _atomic_write_json
from cactus_theory.util.keyed_cache import KeyedDir, KeyedFile, file_digest  # noqa: F401  (file_digest re-exported)
from cactus_theory.util.keyed_cache import config_key as _config_key

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "paper_repro" / "results"
FIGURES = ROOT / "figures"
REPORT = ROOT / "paper_repro" / "REPORT.md"


def fast_mode() -> bool:
    """``CACTUS_FAST=1`` shrinks every step (CI, notebooks in tests)."""
    return os.environ.get("CACTUS_FAST", "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Ctx:
    """Where a run writes and how big it is. ``lm`` holds the LM options (verifier, draft, device...)."""

    results: Path = RESULTS
    figures: Path = FIGURES
    fast: bool = False
    force: bool = False
    seed: int = 0
    cache_only: bool = False  # steps not selected by --only: reuse their cache, never compute
    lm: dict = field(default_factory=dict)

    def __post_init__(self):
        self.results, self.figures = Path(self.results), Path(self.figures)


class NotCached(Exception):
    """A step that may only reuse its cache (``Ctx.cache_only``) has none for its configuration."""


def to_jsonable(x: Any) -> Any:
    """numpy scalars / arrays and dataclasses -> plain JSON types (NaN and inf kept as floats)."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    if isinstance(x, np.generic):
        return x.item()
    if hasattr(x, "__dataclass_fields__"):
        return to_jsonable(asdict(x))
    return x


def atomic_write_json(path: Path, obj: Any) -> None:
    """``cactus_theory.util.atomic.atomic_write_json`` of ``to_jsonable(obj)``."""
    _atomic_write_json(path, to_jsonable(obj))


def config_key(cfg: dict) -> str:
    """The cache key of a step's configuration (``util.keyed_cache.config_key`` of its JSON form)."""
    return _config_key(to_jsonable(cfg))


def cached(ctx: Ctx, name: str, cfg: dict, fn: Callable[[], dict]) -> dict:
    """``fn()`` cached in ``results/<name>.json`` (``util.keyed_cache.KeyedFile``); reused while ``cfg``,
    which must name every input of ``fn``, is unchanged (unless ``force``)."""
    store = KeyedFile(ctx.results / f"{name}.json", to_jsonable(cfg))
    if not ctx.force:
        data = store.load()
        if data is not None:
            return data
    if ctx.cache_only:
        raise NotCached(name)
    return store.compute(fn, to_jsonable)


def cached_seconds(ctx: Ctx, name: str) -> float | None:
    """Compute time recorded in ``results/<name>.json`` (None if absent or unreadable)."""
    try:
        return float(json.loads((ctx.results / f"{name}.json").read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Parts:
    """Resumable pieces of one long step: ``results/<name>.parts/<piece>.json``, valid for one config
    (``util.keyed_cache.KeyedDir``)."""

    def __init__(self, ctx: Ctx, name: str, cfg: dict):
        self.store = KeyedDir(ctx.results / f"{name}.parts", to_jsonable(cfg))
        self.dir, self.key = self.store.dir, self.store.key
        self.cache_only = ctx.cache_only
        if ctx.cache_only and self.store.stale:
            raise NotCached(name)
        if (ctx.force and not ctx.cache_only) or self.store.stale:
            self.store.reset()

    def get(self, piece: str, fn: Callable[[], Any]) -> Any:
        got = self.store.load(piece, _MISSING)
        if got is not _MISSING:
            return got
        if self.cache_only:
            raise NotCached(f"{self.dir.name}/{piece}")
        value = to_jsonable(fn())
        self.store.store(piece, value)
        return value


_MISSING = object()


def save_figure(fig, ctx: Ctx, stem: str, dpi: int = 110) -> list[Path]:
    """Save ``fig`` as ``<stem>.png`` (modest dpi) and ``<stem>.svg`` (vector), reproducibly."""
    import matplotlib.pyplot as plt

    ctx.figures.mkdir(parents=True, exist_ok=True)
    out = []
    for ext, kw in (("png", {"dpi": dpi, "metadata": {"Software": None}}), ("svg", {"metadata": {"Date": None}})):
        path = ctx.figures / f"{stem}.{ext}"
        with atomic_path(path) as tmp, plt.rc_context({"svg.hashsalt": "cactus-theory", "svg.fonttype": "none"}):
            fig.savefig(tmp, bbox_inches="tight", **kw)
        out.append(path)
    plt.close(fig)
    return out


def fmt(x: float, digits: int = 3) -> str:
    """Short number for tables: ``fmt(0.19834) == '0.198'``; inf / nan spelt out."""
    if x is None:
        return "-"
    x = float(x)
    if not np.isfinite(x):
        return str(x)
    if x != 0 and (abs(x) < 10 ** -digits or abs(x) >= 10 ** 5):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}f}"


@dataclass
class StepResult:
    """What one step hands to the report: its numbers, the files it drew and its claims."""

    name: str
    data: dict
    figures: list[Path]
    claims: list[Claim]
    seconds: float = 0.0


def cached_step(ctx: Ctx, name: str, cfg: dict, compute: Callable[[], dict],
                plot: Callable[[dict, Ctx], list[Path]], claims: Callable[[dict], list[Claim]]) -> StepResult:
    """A figure step: ``compute()`` cached under ``cfg`` (see ``cached``), then drawn and judged."""
    t0 = time.perf_counter()
    d = cached(ctx, name, cfg, compute)
    rows = claims(d)
    for c in rows:
        c.source = c.source or name
    return StepResult(name, d, plot(d, ctx), rows, time.perf_counter() - t0)


def write_markdown(name: str, text: Callable[[dict], str]) -> Callable[[dict, Ctx], list[Path]]:
    """A table step's ``plot`` for ``cached_step``: ``results/<name>.md`` holding ``text(d)``, written atomically."""

    def write(d: dict, ctx: Ctx) -> list[Path]:
        path = ctx.results / f"{name}.md"
        atomic_write_text(path, text(d))
        return [path]

    return write


def report_section(heading: str, page: str) -> str:
    """REPORT.md's section of a table step: ``page`` (its markdown, whose first two lines are its title and a
    blank line) without its title, under ``heading`` (a line of the report's level)."""
    return f"{heading}\n\n" + page.split("\n", 2)[2].rstrip("\n")


def standalone(run: Callable[[Ctx], StepResult], argv: list[str] | None = None) -> StepResult:
    """``python -m paper_repro.<step> [--fast] [--force]``: run one step on the default paths."""
    import argparse

    ap = argparse.ArgumentParser(description=run.__module__)
    ap.add_argument("--fast", action="store_true", help="small sizes (also CACTUS_FAST=1)")
    ap.add_argument("--force", action="store_true", help="ignore cached results")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    res = run(Ctx(fast=args.fast or fast_mode(), force=args.force, seed=args.seed))
    for c in res.claims:
        print(f"[{c.label}] {c.claim}: ours {c.ours}" + (f" | paper {c.paper}" if c.paper else ""))
    for f in res.figures:
        print("wrote", f)
    return res
