"""The pre-registered protocol of the replicated accuracy eval (``replicated``): a committed JSON file that
fixes, before any result exists, what is decoded (tasks, distinct questions, replicates, rules, sampling) and
how it is read (primary metric, margin and why, reference, intervals, family, decision rules).

``load_protocol(path)`` parses and checks it (``ValueError`` naming the field); ``Protocol.sha256`` is the hash
of the file's bytes, recorded in ``eval.json`` and beside the decode cache; ``guard`` refuses to go on when
results exist under another protocol hash, unless the change is declared (an amendment, recorded loudly in
the output). ``git_status`` says whether the file is committed and in which commit (so a reader can check
that the protocol predates the results in history).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Protocol", "DEFAULT_PROTOCOL", "PROTOCOLS", "load_protocol", "protocol_dir", "git_status", "guard",
           "ProtocolChanged"]

# the repository's protocols, found from the package (an editable install or a clone), not from the working directory
PROTOCOLS = Path(__file__).resolve().parents[3] / "paper_repro" / "protocols"
DEFAULT_PROTOCOL = PROTOCOLS / "eval_v3.json"
_DTYPES = ("float32", "bfloat16")
_METRICS = ("lenient", "strict")
_WALL = ("time_per_problem", "tokens_per_s", "length_adjusted")


class ProtocolChanged(ValueError):
    """Results exist under another protocol hash and no amendment was declared."""


@dataclass(frozen=True)
class Protocol:
    """The parsed protocol (see ``paper_repro/protocols/eval_v3.json`` and ``eval_v2.json`` for the meaning of
    each field)."""

    path: str
    sha256: str
    content: dict
    design: dict = field(repr=False, default_factory=dict)
    analysis: dict = field(repr=False, default_factory=dict)

    @property
    def margin(self) -> float:
        """The non-inferiority margin as a proportion (the file states points)."""
        return self.analysis["margin_points"] / 100

    @property
    def alpha(self) -> float:
        return self.analysis["alpha_one_sided"]

    @property
    def primary_metric(self) -> str:
        return self.analysis["primary_metric"]


def _need(d: dict, key: str, where: str, kind, check=None, what: str = ""):
    if key not in d:
        raise ValueError(f"protocol: {where}.{key} is missing")
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool or (check is not None and not check(v)):
        raise ValueError(f"protocol: {where}.{key} must be {what or kind}, got {v!r}")
    return v


def check_content(c: dict) -> None:
    """``ValueError`` naming the first missing or bad field of a protocol's content."""
    from . import tasks

    if not isinstance(c, dict):
        raise ValueError(f"protocol must be a JSON object, got {type(c).__name__}")
    d = _need(c, "design", "protocol", dict)
    a = _need(c, "analysis", "protocol", dict)
    ts = _need(d, "tasks", "design", list, lambda v: len(v) >= 1 and all(t in tasks.TASKS for t in v),
               f"a list of task names among {sorted(tasks.TASKS)}")
    if len(set(ts)) != len(ts):
        raise ValueError(f"protocol: design.tasks lists a task twice: {ts}")
    for k in ("questions_per_task", "replicates", "k", "max_new_tokens", "batch_size"):
        _need(d, k, "design", int, lambda v: v >= 1, "an integer >= 1")
    _need(d, "seed", "design", int, lambda v: v >= 0, "an integer >= 0")
    _need(d, "sampling", "design", dict)
    _need(d, "grid", "design", dict)
    if "methods" in d:  # eval_v3: the methods listed, not the registry at a grid
        _check_methods(d["methods"], "design.methods")
        keys = [m.get("key") for m in d["methods"]]
        if None not in keys or "sps" not in keys:
            raise ValueError("protocol: design.methods must list the verifier alone (key null) and SpS (the references)")
    if "dtype" in d:
        _need(d, "dtype", "design", str, lambda v: v in _DTYPES, f"one of {_DTYPES}")
    if "threads" in d:
        _need(d, "threads", "design", int, lambda v: v >= 1, "an integer >= 1")
    if "lean" in d:
        _need(d, "lean", "design", bool)
    if "shards" in d:
        sh = _need(d, "shards", "design", dict)
        _need(sh, "dir", "design.shards", str, lambda v: len(v) > 0, "a folder relative to the protocol file")
        _need(sh, "batches_per_shard", "design.shards", int, lambda v: v >= 1, "an integer >= 1")
    if "reestimation" in d:
        _need(d["reestimation"], "max_replicates", "design.reestimation", int, lambda v: v >= d["replicates"],
              "an integer >= design.replicates")
    if "sweep" in d:
        sw = _need(d, "sweep", "design", dict)
        _need(sw, "task", "design.sweep", str, lambda v: v in ts, f"one of design.tasks {ts}")
        _need(sw, "questions", "design.sweep", int, lambda v: 1 <= v <= d["questions_per_task"],
              "an integer in [1, design.questions_per_task]")
        _need(sw, "replicates", "design.sweep", int, lambda v: 1 <= v <= d["replicates"],
              "an integer in [1, design.replicates]")
        _check_methods(sw.get("methods"), "design.sweep.methods")
    _need(d, "trees", "design", list, lambda v: all(isinstance(t, list) and len(t) == 3 for t in v),
          "a list of [nodes, depth, topk]")
    _need(a, "primary_metric", "analysis", str, lambda v: v in _METRICS, f"one of {_METRICS}")
    _need(a, "margin_points", "analysis", (int, float), lambda v: 0 < v < 100, "a number of points in (0, 100)")
    _need(a, "margin_justification", "analysis", str, lambda v: len(v) > 40, "a sentence or more")
    _need(a, "alpha_one_sided", "analysis", float, lambda v: 0 < v < 0.5, "a level in (0, 0.5)")
    _need(a, "min_reference_points", "analysis", (int, float), lambda v: v >= a["margin_points"],
          "a number of points >= margin_points")
    _need(a, "power", "analysis", float, lambda v: 0 < v < 1, "a probability")
    _need(a, "aa_splits", "analysis", int, lambda v: v >= 100, "an integer >= 100")
    _need(a, "wall_clock_primary", "analysis", str, lambda v: v in _WALL, f"one of {_WALL}")
    claims = _need(a, "claims", "analysis", dict)
    for key, cl in claims.items():
        _need(cl, "rules", f"analysis.claims.{key}", list, lambda v: len(v) >= 1, "a non-empty list of method labels")
    for k in ("family", "decision_rules", "reference", "interval"):
        _need(a, k, "analysis", (str, list, dict))


def _check_methods(ms, where: str) -> None:
    """A list of ``{"key": registry key or null, "params": {...}}`` (the rules are built where they are used)."""
    from ...core import registry

    if not isinstance(ms, list) or not ms:
        raise ValueError(f"protocol: {where} must be a non-empty list of {{key, params}}, got {ms!r}")
    for m in ms:
        if not isinstance(m, dict) or set(m) - {"key", "params"} or "key" not in m:
            raise ValueError(f"protocol: {where}: each entry is {{key, params}}, got {m!r}")
        if m["key"] is not None and m["key"] not in registry.RULES:
            raise ValueError(f"protocol: {where}: unknown rule {m['key']!r}; known: {list(registry.RULES)}")
        if not isinstance(m.get("params", {}), dict):
            raise ValueError(f"protocol: {where}: params of {m['key']!r} must be an object, got {m['params']!r}")


def protocol_dir(protocol: Protocol, rel: str) -> Path:
    """A folder the protocol names relative to its own file (``design.shards.dir``), wherever the command runs."""
    return (Path(protocol.path).resolve().parent / rel).resolve()


def load_protocol(path: str | Path = DEFAULT_PROTOCOL) -> Protocol:
    """The protocol at ``path``, checked (``ValueError`` naming the field; ``FileNotFoundError``-free: a missing
    file is a ``ValueError`` naming the path)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--protocol {str(path)!r}: no such file")
    raw = path.read_bytes()
    try:
        content = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"--protocol {str(path)!r}: not JSON ({e})") from None
    check_content(content)
    return Protocol(str(path), hashlib.sha256(raw).hexdigest(), content, content["design"], content["analysis"])


def git_status(path: str | Path) -> dict:
    """``{"committed_in": <last commit touching path> | None, "clean": bool | None}`` from git, or Nones where git
    or the repository is not there (a copy outside a clone)."""
    path = Path(path).resolve()
    try:
        commit = subprocess.run(["git", "log", "-1", "--format=%H", "--", path.name], cwd=path.parent,
                                capture_output=True, text=True, timeout=20, check=True).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", path.name], cwd=path.parent,
                               capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"committed_in": None, "clean": None}
    return {"committed_in": commit, "clean": commit is not None and not dirty}


def guard(protocol: Protocol, recorded: str | None, amendment: str | None, where: str) -> dict | None:
    """Refuse (``ProtocolChanged``) when results at ``where`` were made under the protocol hash ``recorded`` and
    the file now hashes otherwise, unless ``amendment`` (a reason) declares the change; returns the amendment
    record ``{"from", "to", "reason", "where"}`` to be written into the results (None when nothing changed)."""
    if recorded is None or recorded == protocol.sha256:
        return None
    if not amendment:
        raise ProtocolChanged(
            f"the protocol {protocol.path} changed after results exist ({where} was made under sha256 {recorded[:12]}, "
            f"the file now hashes {protocol.sha256[:12]}): a pre-registered protocol is not edited after the fact. "
            "Restore it, or declare the change with --amend-protocol REASON (recorded in eval.json and eval.md)")
    return {"from": recorded, "to": protocol.sha256, "reason": amendment, "where": where}
