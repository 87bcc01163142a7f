"""Committed shards of a replicated eval (eval_v3): its decodes kept in the repository in small pieces, so that a
run that stops leaves what it finished in main and a later run, here or on another machine, goes on from them.

A shard is one gzipped JSON file per (design, run, task, chunk of ``per_shard`` batches)::

    <dir>/<decode key>/<run>/<task>/c<chunk>.json.gz
    {"format": 1, "run": "primary", "task": "add_wide", "chunk": 3, "batches": [15, ..., 19],
     "protocol_sha256": ..., "decode_key": ..., "machine": {"cpu": ..., "torch": ..., "threads": ...},
     "methods": {<method slug>: {"rule": <rule identity>, "batches": {"15": <batch>, ...}}}}

(the decode key names what a row's decode depends on: questions, seed, budget, sampling, pair, dtype...; two
designs never write the same file), where a batch is what ``replicated._decode`` returns (rows with their seeds, decode seconds, per-row records)
without the token ids (the texts, answers and counters stay). A shard is written once, atomically, when every
method of its run has decoded every batch of its chunk; ``ShardStore.get`` serves a batch from any run's
shards (the sweep reads the primary run's lossless batches) when its rule identity and rows match.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ...util.atomic import atomic_write_bytes

__all__ = ["ShardStore", "FORMAT", "strip_tokens"]

FORMAT = 1


def strip_tokens(batch: dict) -> dict:
    """``batch`` without its rows' token ids (a shard keeps texts, answers and counters)."""
    return {**batch, "records": [{k: v for k, v in r.items() if k != "tokens"} for r in batch["records"]]}


def _write_gz_json(path: Path, obj) -> None:
    """``obj`` as gzipped JSON at ``path``, atomically (``util.atomic``); the gzip header carries no time stamp, so
    the same content gives the same bytes."""
    data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    atomic_write_bytes(path, gzip.compress(data, compresslevel=9, mtime=0))


class ShardStore:
    """The shards under ``root`` (every run's, read once at start) and the sealing of this run's chunks.

    ``run``: this run's name (``"primary"`` or ``"sweep"``); ``per_shard``: batches per chunk; ``meta``: what every
    shard this run writes records (protocol hash, decode key, machine)."""

    def __init__(self, root: Path, run: str, per_shard: int, meta: dict | None = None):
        if not isinstance(per_shard, int) or isinstance(per_shard, bool) or per_shard < 1:
            raise ValueError(f"per_shard must be an integer >= 1, got {per_shard!r}")
        self.root, self.run, self.per_shard, self.meta = Path(root), run, per_shard, dict(meta or {})
        self._index: dict[tuple[str, str, int], dict] = {}
        self._sealed: dict[tuple[str, str, int], list[int]] = {}  # (run, task, chunk) on disk -> its batches
        self.files = 0
        self.protocols: set[str] = set()  # the protocol hashes the shards on disk were made under
        key = self.meta.get("decode_key", "any")
        folder = self.root / key
        for f in sorted(folder.glob("*/*/c*.json.gz")) if folder.is_dir() else []:
            with gzip.open(f, "rt") as fh:
                sh = json.load(fh)
            if sh.get("format") != FORMAT:
                raise ValueError(f"{f}: shard format {sh.get('format')!r}, expected {FORMAT}")
            if sh.get("decode_key", "any") != key:
                raise ValueError(f"{f}: a shard of decode key {sh.get('decode_key')!r} in the folder of {key!r}")
            self.files += 1
            self.protocols.add(sh.get("protocol_sha256", ""))
            self._sealed[(sh["run"], sh["task"], sh["chunk"])] = list(sh["batches"])
            for slug, m in sh["methods"].items():
                for b, batch in m["batches"].items():
                    self._index[(sh["task"], slug, int(b))] = {**batch, "rule": m["rule"]}

    def chunk(self, b: int) -> int:
        return b // self.per_shard

    def chunk_batches(self, chunk: int, n_batches: int) -> list[int]:
        return list(range(chunk * self.per_shard, min(n_batches, (chunk + 1) * self.per_shard)))

    def path(self, task: str, chunk: int) -> Path:
        return self.root / self.meta.get("decode_key", "any") / self.run / task / f"c{chunk:03d}.json.gz"

    def get(self, task: str, slug: str, b: int) -> dict | None:
        """The batch ``b`` of method ``slug`` on ``task`` from any run's shard, or None."""
        return self._index.get((task, slug, b))

    def sealed(self, task: str, chunk: int, members: list[int]) -> bool:
        """Whether this run's shard of (``task``, ``chunk``) is on disk with exactly the batches ``members`` (a last
        chunk that grew when the replicates grew is written again)."""
        return self._sealed.get((self.run, task, chunk)) == list(members)

    def seal(self, task: str, chunk: int, batches: dict[str, dict[int, dict]], extra: dict | None = None) -> Path:
        """Write this run's shard of (``task``, ``chunk``): ``batches[slug][b]`` for every method it seals and every
        batch of the chunk. Returns its path."""
        bs = sorted({b for per in batches.values() for b in per})
        methods = {slug: {"rule": next(iter(per.values()))["rule"],
                          "batches": {str(b): {k: v for k, v in strip_tokens(per[b]).items() if k != "rule"}
                                      for b in sorted(per)}}
                   for slug, per in sorted(batches.items())}
        obj = {"format": FORMAT, "run": self.run, "task": task, "chunk": chunk, "batches": bs, **self.meta,
               **(extra or {}), "methods": methods}
        path = self.path(task, chunk)
        _write_gz_json(path, obj)
        self._sealed[(self.run, task, chunk)] = bs
        self.files += 1
        for slug, per in batches.items():
            for b, batch in per.items():
                self._index[(task, slug, b)] = strip_tokens(batch)
        return path
