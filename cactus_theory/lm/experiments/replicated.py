"""The replicated accuracy eval (``cactus-theory eval``, result format 2): distinct questions, ``R`` decodes
per (question, method), every registry rule, a calibrated lossless null, read by a pre-registered protocol
(``protocol``).

Design (the protocol fixes each number):

* **Items.** Per task (``RunConfig.tasks``: two tasks of different kinds), ``questions`` distinct questions
  (``tasks.distinct_problems``; the count of distinct question texts is recorded). The question is the unit.
* **Replicates and seeds.** Rows are (question, replicate), replicate-major, cut into batches. Row ``(q, r)``
  of method ``m`` draws from its own generator seeded by ``row_seed(seed, task, question text, r, m's rule
  identity)`` (the loops' ``seeds=``, ``core.draws.RowGenerators``): its tokens do not depend on which rows
  share its batch. Methods and replicates share no random numbers (no common random numbers).
* **Methods.** The verifier alone, every registry rule at the protocol's grid (``eval.methods``), SpS and
  Cactus delta = 1 on the protocol's trees. The lossless pool: the verifier alone and every method whose
  registry rule is declared ``lossless`` (SpS on the chain and on each tree).
* **Timing.** Per (task, batch) every method decodes the batch's rows back to back, in a random order seeded
  by (seed, task, batch), so drifts in machine load do not favour a method.

Reading (``analyse``; every interval the JSON holds is the one printed, ``format_report`` only formats):

* accuracy per method: the mean over questions of the per-question mean over replicates, 95% t-interval over
  questions; against the pooled lossless mean per question (``d_i``), a non-inferiority test at the protocol's
  margin (``claims.ledger.noninferiority``: t over questions, one-sided p-values), Holm over the family of
  lossy methods x tasks; a lossless method is compared with the pool of the other lossless runs (an A/A);
* the null (``aa_null``): A/A intervals between replicate sets (even / odd replicates of the verifier alone and
  of SpS; verifier alone against SpS) and the share of A/A intervals excluding 0 over random re-splits of each
  question's lossless runs;
* power (``power_table``): the within-question variance of the lossless runs gives the standard deviation of
  ``d``, hence the minimum detectable difference at these ``n`` and ``R``, the power at the margin and the
  questions (and problem-runs) the margin needs at the protocol's power;
* AL (tokens per verifier call, bonus included), acceptance, Rej vs SpS, step KL, NLL: ratios of sums, 95%
  percentile bootstrap over questions;
* wall clock (``wall_clock``), per full batch against the verifier alone on the same rows: time per problem
  and tokens/s ratios (t-interval over full batches, log scale) and the time ratio at equal output length
  (log seconds regressed on log tokens with batch and method effects); the partial last batch is dropped.

Engines (``--engine``): the project's loop decodes by default; any other engine (``vllm``: vLLM with the project's
plugin, ``integrations.vllm_eval``, handed in by the command) decodes the same rows through ``generate_rows`` with
its own seed map (``engine_seed``, ``SEED_MAPS``), and the records, shards and verdicts are this module's. The engine
is in the decode key (``RunConfig.decode_keyed``; the loop's key is unchanged), and a method an engine cannot apply
is refused before anything loads (``check_methods``, from the capabilities the engine declares).

Resumable: every (task, method, batch) is one JSON file under the cache, valid while its rule identity and
its rows (question, replicate, seed) match; the first batch of every (task, method) runs first, and the
compute estimate (problem-runs and projected hours from those batches) is printed before the rest.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ...core import registry
from ...core.sampling import SAMPLING, Sampling
from ...core.tree_shapes import BUDGET_DEPTH, BUDGET_TOPK
from ...util.args import positive_int
from ...util.atomic import atomic_write_json, atomic_write_text
from ...util.keyed_cache import config_key, read_json
from . import eval as _legacy
from . import tasks
from .eval import (
    COUNTERS,
    DEFAULT_OUT,
    Method,
    eval_trees,
    listed_methods,
    method_info,
    pair_id,
    save_figure,
)
from .eval import methods as eval_methods
from .protocol import Protocol, git_status, guard

__all__ = ["FORMAT", "RunConfig", "row_seed", "batch_rows", "method_order", "lossless_labels", "run_replicated",
           "analyse", "aa_null", "power_table", "wall_clock", "claim_parts", "claim_verdicts", "format_report",
           "plot_accuracy_vs_al", "evaluate", "rows_arrays", "N_BOOT", "configure", "check", "run", "ENGINES",
           "SEED_MAPS", "engine_seed", "unsupported", "check_methods", "parse_engine_args", "check_engine_flags",
           "VLLM_RESERVED"]

FORMAT = 2
N_BOOT = 4000


# -- configuration --------------------------------------------------------------------------------

@dataclass
class RunConfig:
    """What one replicated eval decodes (from the protocol's design; ``overrides`` are deviations)."""

    tasks: list = field(default_factory=lambda: ["add_wide", "lookup"])
    questions: int = 1000
    replicates: int = 4
    seed: int = 0
    k: int = 4
    max_new_tokens: int = 128
    batch_size: int = 32
    sampling: dict = field(default_factory=SAMPLING.as_dict)
    pair: str = "pair"
    trees: list = field(default_factory=list)
    dtype: str = "float32"
    lean: bool = True
    engine: str = "loop"  # who decodes: "loop" (the project's loop) or an engine's identity ("vllm/eagle3", ...)

    FROM_DESIGN = {"tasks": "tasks", "questions": "questions_per_task", "replicates": "replicates", "seed": "seed",
                   "k": "k", "max_new_tokens": "max_new_tokens", "batch_size": "batch_size", "sampling": "sampling",
                   "trees": "trees"}
    OPTIONAL = {"dtype": "float32", "lean": True}  # design keys of eval_v3 (eval_v2 states neither)

    @classmethod
    def from_protocol(cls, protocol: Protocol, pair: str, **overrides) -> tuple[RunConfig, list[str]]:
        """The protocol's design, then ``overrides`` (None values ignored); returns the config and the list of
        deviations from the protocol, one line each (empty for the pre-registered run)."""
        d = protocol.design
        cfg = cls(**{f: d[k] for f, k in cls.FROM_DESIGN.items()}, **{f: d.get(f, v) for f, v in cls.OPTIONAL.items()},
                  pair=pair)
        dev = []
        for name, v in overrides.items():
            if v is None:
                continue
            if name not in cls.FROM_DESIGN and name not in cls.OPTIONAL:
                raise ValueError(f"unknown override {name!r}")
            if v != getattr(cfg, name):
                dev.append(f"{name}: {getattr(cfg, name)!r} in the protocol, {v!r} in this run")
                setattr(cfg, name, v)
        cfg.check()
        return cfg, dev

    def check(self) -> None:
        """``ValueError`` naming the first bad field (before any model loads)."""
        if not isinstance(self.tasks, list) or not self.tasks or any(t not in tasks.TASKS for t in self.tasks):
            raise ValueError(f"tasks must be a non-empty list among {sorted(tasks.TASKS)}, got {self.tasks!r}")
        for name in ("questions", "replicates", "k", "max_new_tokens", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.questions < 2:
            raise ValueError(f"questions must be >= 2 (intervals over questions), got {self.questions}")
        for t in self.tasks:
            cap = tasks.DISTINCT.get(t)
            if cap is not None and self.questions > cap:
                raise ValueError(f"questions: task {t!r} has only {cap} distinct questions, asked for {self.questions}")
        Sampling(self.sampling["temperature"], self.sampling["top_k"], self.sampling["top_p"])
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        if not isinstance(self.lean, bool):
            raise ValueError(f"lean must be true or false, got {self.lean!r}")
        if not isinstance(self.engine, str) or self.engine.split("/")[0] not in ENGINES:
            raise ValueError(f"engine must be 'loop' or an identity starting with one of {ENGINES[1:]} "
                             f"(e.g. 'vllm/eagle3'), got {self.engine!r}")

    def as_dict(self) -> dict:
        d = {"tasks": list(self.tasks), "questions": self.questions, "replicates": self.replicates,
             "seed": self.seed, "k": self.k, "max_new_tokens": self.max_new_tokens, "batch_size": self.batch_size,
             "sampling": dict(self.sampling), "pair": self.pair, "trees": [list(t) for t in self.trees],
             "dtype": self.dtype, "lean": self.lean}
        if self.engine != "loop":  # the loop's config reads as it did before engines existed
            d["engine"] = self.engine
        return d

    DECODE_KEYS = ("questions", "seed", "k", "max_new_tokens", "batch_size", "sampling", "pair", "dtype", "lean")

    def decode_keyed(self) -> dict:
        """What the decode key hashes: ``DECODE_KEYS``, and the engine unless it is the loop (the loop's key is the
        one its committed shards were written under before engines existed, so it stays as it was; any other
        engine's key differs from it, and loop and engine shards never share a folder)."""
        d = self.as_dict()
        out = {k: d[k] for k in self.DECODE_KEYS}
        if self.engine != "loop":
            out["engine"] = self.engine
        return out

    def decode_key(self) -> str:
        """Names the cache folder: what a row's decode depends on besides its method, task and rows. Replicates
        are not in it (rows are replicate-major: more replicates add batches, the earlier stay valid)."""
        return config_key(self.decode_keyed(), 12)


ENGINES = ("loop", "vllm")  # who may decode the eval's rows (``--engine``)
# how each engine turns a row seed (``row_seed``) into its random source; recorded in every shard and eval.json
SEED_MAPS = {
    "loop": "the row seed seeds the row's own torch.Generator (core.draws.RowGenerators): its draws do not depend "
            "on the rest of its batch",
    "vllm": "vLLM request seed = row seed mod 2**32 (engine_seed; SamplingParams.seed, one request per row): vLLM "
            "draws a seeded request's tokens from its own torch.Generator, and torch's CPU generator keeps 32 bits "
            "of a seed, so every device sees the same value",
}


def engine_seed(row: int, engine: str) -> int:
    """The seed a row's decode gets from ``engine``: the loop takes the row seed itself (63 bits); vLLM's request
    seed is its low 32 bits, ``row mod 2**32`` (``SEED_MAPS``). ``ValueError`` for a row seed outside [0, 2**63) or
    an unknown engine."""
    if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < 2**63:
        raise ValueError(f"row seed must be an integer in [0, 2**63), got {row!r}")
    kind = engine.split("/")[0] if isinstance(engine, str) else engine
    if kind == "loop":
        return row
    if kind == "vllm":
        return row & 0xFFFFFFFF
    raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")


def unsupported(method: Method, caps: dict) -> str | None:
    """Why an engine with the declared capabilities ``caps`` cannot decode ``method`` (None: it can). ``caps``
    (booleans, a missing one is False): ``trees`` (tree drafts), ``reads_head`` (rules that read the verifier's
    LM-head input), ``stateful`` (rules with a state per sequence), ``own_bonus`` (rules that draw their bonus
    token their own way). Read from the rule's declared flags, never its class."""
    if method.tree is not None and not caps.get("trees"):
        return "it decodes a tree, and this engine verifies chains only"
    rule = method.rule
    if rule is None:
        return None
    for flag, cap, why in (("reads_head", "reads_head", "it reads the verifier's LM-head input"),
                           ("stateful", "stateful", "it keeps a state per sequence")):
        if getattr(rule, flag, False) and not caps.get(cap):
            return f"{why}, which this engine's rejection step does not receive"
    if not getattr(rule, "bonus_from_q", True) and not caps.get("own_bonus"):
        return "it draws its bonus token its own way, and this engine draws the bonus from the verifier's law"
    return None


def check_methods(method_list: list[Method], caps: dict, engine: str) -> None:
    """``ValueError`` naming every method ``engine`` cannot decode (``unsupported``), before anything loads."""
    bad = [(m.label, why) for m in method_list if (why := unsupported(m, caps)) is not None]
    if bad:
        raise ValueError(f"--engine {engine} cannot apply " + "; ".join(f"{lab!r}: {why}" for lab, why in bad)
                         + " (drop them with --rules, or use --engine loop)")


def row_seed(seed: int, task: str, question: str, replicate: int, rule_id: str) -> int:
    """The seed of row (question, replicate) of a method: the first 63 bits of sha256(seed, task, question text,
    replicate, rule identity). Keyed by the question's text, not its position: a question keeps its draws
    whatever list or batch it is in; keyed by the method: no common random numbers across methods."""
    h = hashlib.sha256("\x1f".join((str(seed), task, question, str(replicate), rule_id)).encode()).digest()
    return int.from_bytes(h[:8], "big") >> 1


def batch_rows(n_questions: int, replicates: int, batch_size: int) -> list[list[tuple[int, int]]]:
    """Rows ``(question index, replicate)``, replicate-major, cut into batches of ``batch_size``."""
    rows = [(q, r) for r in range(replicates) for q in range(n_questions)]
    return [rows[s:s + batch_size] for s in range(0, len(rows), batch_size)]


def method_order(labels: list[str], seed: int, task: str, batch: int) -> list[str]:
    """The order in which the methods decode batch ``batch`` of ``task``: a permutation seeded by (seed, task, batch)."""
    out = list(labels)
    random.Random(f"order/{seed}/{task}/{batch}").shuffle(out)
    return out


def lossless_labels(infos: list[dict]) -> list[str]:
    """The lossless pool: the verifier alone and every method whose registry rule is declared lossless."""
    return [m["label"] for m in infos if m["key"] is None or registry.spec(m["key"]).lossless]


# -- decoding -------------------------------------------------------------------------------------

def _loop_rows(pair, prompts: list[str], seeds: list[int], method: Method, cfg: RunConfig, track_kl: bool = True) -> dict:
    """The loop's decode of one batch: ``texts``, ``tokens``, ``counters`` (per row, ``COUNTERS``) and ``seconds``
    (the loop's decode seconds, KL tracking excluded); ``track_kl=False`` (the wall-clock benchmark) skips the
    exact step KL: same tokens, KL counters zero."""
    from ..loop import autoregressive_generate, speculative_generate, tree_generate

    kw = dict(max_new_tokens=cfg.max_new_tokens, batch_size=len(prompts), seeds=seeds, **cfg.sampling)
    if method.rule is None:
        res = autoregressive_generate(pair, prompts, **kw)
    elif method.tree is not None:
        res = tree_generate(pair, prompts, method.rule, method.tree, "deterministic", **kw)
    else:
        res = speculative_generate(pair, prompts, method.rule, k=cfg.k, track_kl=track_kl, **kw)
    return {"texts": res.texts, "tokens": res.tokens, "seconds": float(res.stats.seconds),
            "counters": [{c: getattr(sc, c) for c in COUNTERS} for sc in res.per_sequence]}


def _decode(pair, problems: list, rows: list, method: Method, cfg: RunConfig, task: str, track_kl: bool = True) -> dict:
    """One batch: texts scored, per-row counters, the decode seconds. ``pair`` is the loop's model pair, or an
    engine that declares ``generate_rows(prompts, seeds, method, cfg)`` (same return as ``_loop_rows``; ``seeds``
    the rows' engine seeds, ``engine_seed``): the records are built here, the same for every engine."""
    prompts = [problems[q].question for q, _ in rows]
    seeds = [row_seed(cfg.seed, task, problems[q].question, r, method.rule_id) for q, r in rows]
    generate = getattr(pair, "generate_rows", None)
    if generate is None:
        res = _loop_rows(pair, prompts, seeds, method, cfg, track_kl)
    else:
        res = generate(prompts, [engine_seed(s, cfg.engine) for s in seeds], method, cfg)
    recs = []
    for (q, r), s, text, sc, toks in zip(rows, seeds, res["texts"], res["counters"], res["tokens"], strict=True):
        pred = tasks.extract_answer(text)
        recs.append({"q": q, "r": r, "seed": s, "pred": pred, "correct": pred == problems[q].answer,
                     "strict": tasks.strict_answer(text) == problems[q].answer, "text": text, "tokens": list(toks),
                     **{c: sc[c] for c in COUNTERS}})
    return {"rule": method.rule_id, "rows": [[q, r, s] for (q, r), s in zip(rows, seeds, strict=True)],
            "seconds": float(res["seconds"]), "records": recs}


class _Cache:
    """``<root>/<decode key>/<task>/<method slug>/b<batch>.json``; ``config.json`` says what the key means and
    ``protocol.sha256`` which protocol the decodes were made under."""

    def __init__(self, root: Path | None, cfg: RunConfig, shards=None):
        self.dir = None if root is None else Path(root) / cfg.decode_key()
        self.cfg = cfg
        self.shards = shards  # a shards.ShardStore: committed batches, read first

    @property
    def protocol_file(self) -> Path | None:
        return None if self.dir is None else self.dir / "protocol.sha256"

    def recorded_protocol(self) -> str | None:
        f = self.protocol_file
        return f.read_text().strip() if f is not None and f.exists() else None

    def record_protocol(self, sha: str) -> None:
        if self.dir is not None:
            atomic_write_text(self.protocol_file, sha + "\n")
            d = self.cfg.as_dict()
            atomic_write_json(self.dir / "config.json", {k: d[k] for k in RunConfig.DECODE_KEYS})

    def lookup(self, task: str, method: Method, b: int, want_rows: list) -> dict | None:
        """Batch ``b`` of ``method`` on ``task`` from a committed shard or the local cache, when its rule identity
        and rows (question, replicate, seed) are the ones wanted; else None."""
        for got in (None if self.shards is None else self.shards.get(task, method.slug, b),
                    None if self.dir is None else read_json(self.dir / task / method.slug / f"b{b:05d}.json")):
            if got is not None and got.get("rule") == method.rule_id and got.get("rows") == want_rows:
                return got
        return None

    def get(self, task: str, method: Method, b: int, want_rows: list, compute) -> tuple[dict, bool]:
        got = self.lookup(task, method, b, want_rows)
        if got is not None:
            return got, True
        val = compute()
        if self.dir is not None:
            atomic_write_json(self.dir / task / method.slug / f"b{b:05d}.json", val)
        return val, False


def run_replicated(pair, cfg: RunConfig, method_list: list[Method], cache_dir: Path | None = None, *,
                   protocol_sha: str = "", progress: bool = True, calibrate_only: bool = False, log=print,
                   shards=None, seal: list[str] | None = None, max_batches: int | None = None,
                   reestimate=None, engine_info: dict | None = None) -> dict:
    """Decode every (batch, task, method), batch-major (the first batch of each first: the calibration; then the
    estimate is logged) and return the raw result: per task the problems, the per-row records of each method (row
    order: ``batch_rows``), the per-batch timings; ``"estimate"``: the compute estimate. ``calibrate_only``: stop
    after the calibration (the estimate only).

    ``pair``: the model pair, or a function that loads it (called only if some batch must be decoded, so that a
    run complete in its shards loads no model). ``shards`` (``shards.ShardStore``): committed batches are read
    first, and once every method in ``seal`` (labels; default all) has every batch of a chunk, the chunk's shard
    is written. ``max_batches``: only the first batches (the sweep's rows). ``reestimate(got, batches_done)``:
    called after each round of batches; it may return a larger replicate count (the blinded re-estimation),
    which extends the rows (replicate-major: the batches decoded stay valid). ``engine_info``: what a shard records
    of the engine that decoded it besides the machine (an engine other than the loop: its versions, the seed map)."""
    from tqdm.auto import tqdm

    cfg.check()
    if not any(m.key == "sps" and m.tree is None for m in method_list) or not any(m.rule is None for m in method_list):
        raise ValueError("methods must include the verifier alone and SpS (the lossless references)")
    labels = [m.label for m in method_list]
    if len(set(labels)) != len(labels):
        raise ValueError(f"method labels must be distinct, got {labels}")
    by_label = {m.label: m for m in method_list}
    seal = labels if seal is None else list(seal)
    cache = _Cache(cache_dir, cfg, shards)
    if protocol_sha:
        cache.record_protocol(protocol_sha)
    problems = {t: tasks.distinct_problems(t, cfg.questions, cfg.seed) for t in cfg.tasks}
    loaded = [] if callable(pair) else [pair]

    def the_pair():
        if not loaded:
            loaded.append(pair())
        return loaded[0]

    def layout():
        bs = batch_rows(cfg.questions, cfg.replicates, cfg.batch_size)
        return bs if max_batches is None else bs[:max_batches]

    batches = layout()

    def one(task, b, label):
        m, rows = by_label[label], batches[b]
        want = [[q, r, row_seed(cfg.seed, task, problems[task][q].question, r, m.rule_id)] for q, r in rows]
        return cache.get(task, m, b, want, lambda: _decode(the_pair(), problems[task], rows, m, cfg, task))

    got: dict = {t: {lab: {} for lab in labels} for t in cfg.tasks}

    def seal_ready(t, b):
        if shards is None:
            return
        c = shards.chunk(b)
        members = shards.chunk_batches(c, len(batches))
        if shards.sealed(t, c, members) or not all(bb in got[t][lab] for lab in seal for bb in members):
            return
        path = shards.seal(t, c, {by_label[lab].slug: {bb: got[t][lab][bb] for bb in members} for lab in seal},
                           extra={"machine": _machine(), **({"engine": engine_info} if engine_info else {})})
        log(f"shard written: {path}")

    t0, fresh = time.perf_counter(), 0
    for t in cfg.tasks:  # the calibration: batch 0 of every (task, method)
        for lab in method_order(labels, cfg.seed, t, 0):
            got[t][lab][0], hit = one(t, 0, lab)
            fresh += not hit
        seal_ready(t, 0)
    est = estimate(cfg, labels, {t: {lab: got[t][lab][0] for lab in labels} for t in cfg.tasks}, len(batches),
                   cached=_count_cached(cache, cfg, method_list, batches, problems))
    log(est["text"])
    if calibrate_only:
        return {"estimate": est}
    bar = tqdm(total=len(cfg.tasks) * (len(batches) - 1) * len(labels), desc="eval", disable=not progress)
    b = 1
    while b < len(batches):
        for t in cfg.tasks:
            for lab in method_order(labels, cfg.seed, t, b):
                got[t][lab][b], hit = one(t, b, lab)
                bar.set_postfix(task=t, batch=b, method=lab[:20], cached=hit)
                bar.update()
            seal_ready(t, b)
        b += 1
        if reestimate is not None:
            new_r = reestimate(got, b)
            if new_r is not None and new_r > cfg.replicates:
                cfg.replicates = new_r
                batches = layout()
                bar.total = len(cfg.tasks) * (len(batches) - 1) * len(labels)
                bar.refresh()
    bar.close()
    out = {"estimate": est, "seconds_this_run": time.perf_counter() - t0, "tasks": {}}
    for t in cfg.tasks:
        timing = {lab: [{"batch": b, "seconds": got[t][lab][b]["seconds"], "rows": len(batches[b]),
                         "tokens": sum(r["new_tokens"] for r in got[t][lab][b]["records"]),
                         "position": method_order(labels, cfg.seed, t, b).index(lab)}
                        for b in range(len(batches))] for lab in labels}
        out["tasks"][t] = {"problems": problems[t],
                           "records": {lab: [r for b in range(len(batches)) for r in got[t][lab][b]["records"]]
                                       for lab in labels},
                           "timing": timing}
    return out


def _count_cached(cache: _Cache, cfg: RunConfig, method_list, batches, problems) -> int:
    """Batch decodes already done: in a committed shard or the local cache."""
    n = 0
    for t in cfg.tasks:
        for m in method_list:
            folder = None if cache.dir is None else cache.dir / t / m.slug
            n += sum(1 for b in range(len(batches))
                     if (cache.shards is not None and cache.shards.get(t, m.slug, b) is not None)
                     or (folder is not None and (folder / f"b{b:05d}.json").exists()))
    return n


def _duration(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 5400 else (f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s")


def estimate(cfg: RunConfig, labels: list[str], first: dict, n_batches: int, cached: int = 0) -> dict:
    """The compute of the whole run: problem-runs (tasks x questions x replicates x methods) and its projected
    seconds, each (task, method) at the seconds per row of its first batch (``first[task][label]``)."""
    runs = len(cfg.tasks) * cfg.questions * cfg.replicates * len(labels)
    rows = cfg.questions * cfg.replicates
    per = {t: {lab: first[t][lab]["seconds"] / max(1, len(first[t][lab]["records"])) for lab in labels}
           for t in cfg.tasks}
    total = sum(per[t][lab] * rows for t in cfg.tasks for lab in labels)
    decodes = len(cfg.tasks) * len(labels) * n_batches
    left = total * max(0, decodes - cached) / decodes
    text = (f"compute: {len(cfg.tasks)} tasks x {cfg.questions} questions x {cfg.replicates} replicates x "
            f"{len(labels)} methods = {runs:,} problem-runs in {decodes:,} batch decodes of up to {cfg.batch_size} rows; "
            f"calibration (each task's first batch, every method): {np.mean([v for d in per.values() for v in d.values()]):.2f} "
            f"s per problem-run on average; projected {_duration(total)} of decoding for the whole run, "
            f"{_duration(left)} left ({cached:,} of {decodes:,} batch decodes cached)")
    return {"problem_runs": runs, "batch_decodes": decodes, "seconds_per_run": per, "projected_seconds": total,
            "projected_seconds_left": left, "cached_batches": cached, "text": text}


# -- statistics -----------------------------------------------------------------------------------

def _t_iv(x) -> list[float]:
    from ...claims.ledger import t_interval

    iv = t_interval(np.asarray(x, dtype=np.float64))
    return [iv.estimate, iv.lo, iv.hi]


def _ni_dict(ni) -> dict:
    return {"estimate": ni.estimate, "low": ni.lo, "high": ni.hi, "n": ni.n, "margin": ni.margin,
            "p_noninferior": ni.p_noninferior, "p_inferior": ni.p_inferior}


def _ratio(num: np.ndarray, den: np.ndarray, idx: np.ndarray) -> list[float]:
    """sum(num) / sum(den) over questions with its 95% percentile bootstrap interval over questions (``idx``)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        est = num.sum() / den.sum() if den.sum() else math.nan
        boot = num[idx].sum(1) / den[idx].sum(1)
    boot = boot[np.isfinite(boot)]
    if not boot.size:
        return [float(est), math.nan, math.nan]
    lo, hi = np.quantile(boot, [0.025, 0.975])
    return [float(est), float(lo), float(hi)]


def per_question(records: list[dict], n: int, R: int) -> dict:
    """The per-question arrays of one method's rows: ``correct`` and ``strict`` (n, R) booleans, the counter sums
    over replicates (n,)."""
    out = {"correct": np.zeros((n, R), bool), "strict": np.zeros((n, R), bool)}
    sums = {c: np.zeros(n) for c in COUNTERS}
    seen = np.zeros((n, R), bool)
    for rec in records:
        q, r = rec["q"], rec["r"]
        if seen[q, r]:
            raise ValueError(f"row (question {q}, replicate {r}) appears twice")
        seen[q, r] = True
        out["correct"][q, r], out["strict"][q, r] = bool(rec["correct"]), bool(rec["strict"])
        for c in COUNTERS:
            sums[c][q] += rec[c]
    if not seen.all():
        raise ValueError(f"{int((~seen).sum())} rows (question, replicate) have no record")
    out.update(sums)
    return out


def aa_null(pool: np.ndarray, fixed: dict[str, tuple[np.ndarray, np.ndarray]], splits: int, seed: int) -> dict:
    """The lossless null. ``fixed``: named pairs of (n, a) / (n, b) outcome arrays (replicate sets) compared by a
    95% t-interval over questions of the per-question difference of means. ``pool`` (n, L): every lossless run of
    each question; ``splits`` times, each question's runs are shuffled independently and cut into two halves
    (exchangeable under the null: the same law), and the share of the halves' A/A intervals excluding 0 is
    counted (0.05 expected for a calibrated interval)."""
    from scipy import stats

    out = {"fixed": {}}
    for name, (a, b) in fixed.items():
        out["fixed"][name] = _t_iv(a.mean(1) - b.mean(1))
    n, L = pool.shape
    half = L // 2
    if half >= 1 and n >= 2:
        rng = np.random.default_rng(seed)
        x = pool[:, :2 * half].astype(np.float64)
        crit = stats.t.ppf(0.975, n - 1)
        excl = 0
        for _ in range(splits):
            p = rng.permuted(x, axis=1)
            d = p[:, :half].mean(1) - p[:, half:].mean(1)
            se = d.std(ddof=1) / math.sqrt(n)
            excl += bool(se > 0 and abs(d.mean()) > crit * se)
        out["calibration"] = {"splits": splits, "runs_per_question": 2 * half, "exclude_zero": excl / splits,
                              "expected": 0.05, "mc_se": math.sqrt(0.05 * 0.95 / splits)}
    return out


def power_table(pool: np.ndarray, n: int, R: int, margin: float, alpha: float, power: float) -> dict:
    """The design's power from the lossless runs' within-question variance ``w`` (mean over questions of the
    variance across a question's ``L`` pooled runs, ddof 1). A lossy method's ``d_i`` (mean of its ``R`` runs minus
    the mean of the ``L`` pooled runs, independent) has variance ``w (1/R + 1/L)`` when it has the verifier's
    accuracy on every question: ``sd_d``. Returns ``w``, ``sd_d``, the minimum detectable difference (two-sided
    0.05, ``power``), the non-inferiority power at ``margin`` and the questions (and problem-runs per method) the
    margin needs at ``power``; the same at 3 points, and for one run per question against one reference run
    (the earlier eval's design: ``sd = sqrt(2 w)``)."""
    from ...claims.ledger import noninferiority_power, noninferiority_sample_size, t_mdd

    L = pool.shape[1]
    w = float(pool.astype(np.float64).var(axis=1, ddof=1).mean()) if L >= 2 else math.nan
    sd = math.sqrt(w * (1 / R + 1 / L))
    out = {"within_question_variance": w, "pooled_runs_per_question": L, "replicates": R, "questions": n,
           "sd_d": sd, "mdd_two_sided_0.05": t_mdd(sd, n, power=power)}
    if not sd > 0:
        return out
    out["ni_power_at_margin"] = noninferiority_power(sd, n, margin, alpha=alpha)
    for name, m in (("margin", margin), ("3_points", 0.03)):
        q = noninferiority_sample_size(sd, m, alpha=alpha, power=power)
        out[f"questions_needed_{name}"] = q
        out[f"runs_per_method_needed_{name}"] = q * R
    q1 = noninferiority_sample_size(math.sqrt(2 * w), 0.03, alpha=alpha, power=power)
    out["runs_per_method_needed_3_points_one_run_vs_one_run"] = q1
    return out


def wall_clock(timing: dict, base: str, labels: list[str], batch_size: int) -> dict:
    """Per method against ``base`` (the verifier alone) on the same full batches: ``time_per_problem`` = exp of
    the mean log(base seconds / method seconds) with its 95% t-interval over full batches (above 1: faster per
    answer); ``tokens_per_s`` likewise with log(method tokens/s / base tokens/s); ``length_adjusted``: log(seconds)
    of every (full batch, method) = batch effect + method effect + gamma log(tokens), least squares; exp(-(method
    effect - base effect)) with its 95% t-interval (residual degrees of freedom): the time ratio at equal output
    length. The partial last batch is dropped (``dropped``)."""
    from scipy import stats

    from ...claims.ledger import t_interval

    full = [i for i, b in enumerate(timing[base]) if b["rows"] == batch_size]
    out = {"batches": len(full), "dropped": len(timing[base]) - len(full), "methods": {}}
    if len(full) < 2:
        return out
    sec = {lab: np.array([timing[lab][i]["seconds"] for i in full]) for lab in labels}
    tok = {lab: np.array([timing[lab][i]["tokens"] for i in full], dtype=np.float64) for lab in labels}
    exp3 = lambda iv: [math.exp(iv.estimate), math.exp(iv.lo), math.exp(iv.hi)]  # noqa: E731
    for lab in labels:
        row = {"seconds_per_problem": float(sec[lab].sum() / (len(full) * batch_size)),
               "tokens_per_s": float(tok[lab].sum() / sec[lab].sum()),
               "mean_tokens": float(tok[lab].sum() / (len(full) * batch_size))}
        if lab != base:
            row["time_per_problem"] = exp3(t_interval(np.log(sec[base] / sec[lab])))
            row["tokens_per_s_ratio"] = exp3(t_interval(np.log((tok[lab] / sec[lab]) / (tok[base] / sec[base]))))
        out["methods"][lab] = row
    # length regression: y = log s, x = log tokens, batch and method effects (base method = reference level)
    B, M = len(full), len(labels)
    others = [lab for lab in labels if lab != base]
    y = np.concatenate([np.log(sec[lab]) for lab in labels])
    x = np.concatenate([np.log(np.maximum(tok[lab], 1.0)) for lab in labels])
    X = np.zeros((B * M, B + len(others) + 1))
    for j, lab in enumerate(labels):
        X[j * B:(j + 1) * B, :B] = np.eye(B)
        if lab != base:
            X[j * B:(j + 1) * B, B + others.index(lab)] = 1.0
    X[:, -1] = x
    dof = X.shape[0] - X.shape[1]
    if dof >= 1 and np.linalg.matrix_rank(X) == X.shape[1]:
        beta, *_ = np.linalg.lstsq(X, y, rcond=None)
        resid = y - X @ beta
        s2 = float(resid @ resid / dof)
        cov = s2 * np.linalg.inv(X.T @ X)
        tq = stats.t.ppf(0.975, dof)
        out["length_slope"] = [float(beta[-1]), float(beta[-1] - tq * math.sqrt(cov[-1, -1])),
                               float(beta[-1] + tq * math.sqrt(cov[-1, -1]))]
        out["regression_dof"] = dof
        for lab in others:
            j = B + others.index(lab)
            e, h = float(beta[j]), float(tq * math.sqrt(cov[j, j]))
            out["methods"][lab]["length_adjusted"] = [math.exp(-e), math.exp(-e - h), math.exp(-e + h)]
    return out


def analyse(raw: dict, infos: list[dict], protocol_analysis: dict, cfg: RunConfig) -> dict:
    """Per task: per method its accuracy, strict accuracy, the comparison with the lossless pool (non-inferiority
    at the margin, or an A/A for a lossless method), AL, acceptance, Rej vs SpS, step KL, NLL, the wall clock;
    the A/A null and the power table; then the family's Holm adjustment over lossy methods x tasks."""
    from ...claims.ledger import holm, noninferiority

    margin = protocol_analysis["margin_points"] / 100
    alpha = protocol_analysis["alpha_one_sided"]
    power = protocol_analysis["power"]
    splits = protocol_analysis["aa_splits"]
    labels = [m["label"] for m in infos]
    info = {m["label"]: m for m in infos}
    pool_labels = lossless_labels(infos)
    base = next(m["label"] for m in infos if m["key"] is None)
    sps = next(m["label"] for m in infos if m["key"] == "sps" and not m.get("tree"))
    n, R = cfg.questions, cfg.replicates
    out: dict = {"tasks": {}, "lossless": pool_labels, "margin": margin, "alpha_one_sided": alpha}
    family = []
    for t, tr in raw["tasks"].items():
        probs = tr["problems"]
        pq = {lab: per_question(tr["records"][lab], n, R) for lab in labels}
        rng = np.random.default_rng(cfg.seed)
        idx = rng.integers(0, n, size=(N_BOOT, n))  # one set of question resamples, paired across methods
        task = {"questions": n, "distinct_question_texts": len({p.question for p in probs}),
                "distinct_contents": len({tasks.content_key(t, p.question) for p in probs}), "replicates": R,
                "problem_runs_per_method": n * R, "methods": {}, "metrics": {}}
        for metric in ("lenient", "strict"):
            col = "correct" if metric == "lenient" else "strict"
            pool = np.concatenate([pq[lab][col] for lab in pool_labels], axis=1).astype(np.float64)  # (n, L)
            ref = pool.mean(1)
            mt = {"reference": _t_iv(ref), "methods": {}}
            for lab in labels:
                acc = pq[lab][col].mean(1)
                e = {"accuracy": _t_iv(acc)}
                if lab in pool_labels:  # an A/A: the other lossless runs as its reference
                    others = np.concatenate([pq[o][col] for o in pool_labels if o != lab], axis=1).mean(1)
                    e["aa_vs_other_lossless"] = _t_iv(acc - others)
                else:
                    ni = noninferiority(acc - ref, margin)
                    e["vs_lossless"] = _ni_dict(ni)
                    if metric == protocol_analysis["primary_metric"]:
                        family.append((t, lab))
                mt["methods"][lab] = e
            fixed = {f"{base}: even vs odd replicates": (pq[base][col][:, 0::2], pq[base][col][:, 1::2]),
                     f"{sps}: even vs odd replicates": (pq[sps][col][:, 0::2], pq[sps][col][:, 1::2]),
                     f"{base} vs {sps}": (pq[base][col], pq[sps][col])} if R >= 2 else \
                {f"{base} vs {sps}": (pq[base][col], pq[sps][col])}
            mt["aa"] = aa_null(pool, fixed, splits, cfg.seed)
            mt["power"] = power_table(pool, n, R, margin, alpha, power)
            mt["reachable"] = bool(ref.mean() > protocol_analysis["min_reference_points"] / 100)
            task["metrics"][metric] = mt
        s = pq[sps]
        rej_sps = (s["drafted"] - s["accepted"], s["new_tokens"])
        for lab in labels:
            p = pq[lab]
            row = {"new_tokens": int(p["new_tokens"].sum()), "nll": _ratio(p["nll_sum"], p["nll_count"], idx)}
            if info[lab]["key"] is not None:
                emitted = p["accepted"] + p["steps"]
                row["al"] = _ratio(emitted, p["steps"], idx)
                row["acceptance"] = _ratio(p["accepted"], p["drafted"], idx)
                row["step_kl"] = _ratio(p["kl_sum"], p["kl_count"], idx)
                with np.errstate(invalid="ignore", divide="ignore"):
                    al_b = emitted[idx].sum(1) / p["steps"][idx].sum(1) - \
                        (s["accepted"] + s["steps"])[idx].sum(1) / s["steps"][idx].sum(1)
                al_b = al_b[np.isfinite(al_b)]
                row["al_diff_vs_sps"] = [row["al"][0] - float((s["accepted"] + s["steps"]).sum() / s["steps"].sum()),
                                         *(np.quantile(al_b, [0.025, 0.975]).tolist() if al_b.size else [math.nan] * 2)]
                if not info[lab].get("tree"):
                    rej = p["drafted"] - p["accepted"]
                    with np.errstate(invalid="ignore", divide="ignore"):
                        est = (rej.sum() / p["new_tokens"].sum()) / (rej_sps[0].sum() / rej_sps[1].sum()) - 1
                        boot = (rej[idx].sum(1) / p["new_tokens"][idx].sum(1)) / (
                            rej_sps[0][idx].sum(1) / rej_sps[1][idx].sum(1)) - 1
                    boot = boot[np.isfinite(boot)]
                    row["rej_vs_sps"] = [float(est), *(np.quantile(boot, [0.025, 0.975]).tolist() if boot.size
                                                       else [math.nan] * 2)]
            task["methods"][lab] = row
        task["wall_clock"] = wall_clock(tr["timing"], base, labels, cfg.batch_size)
        out["tasks"][t] = task
    prim = protocol_analysis["primary_metric"]
    ps = [out["tasks"][t]["metrics"][prim]["methods"][lab]["vs_lossless"]["p_noninferior"] for t, lab in family]
    adj = holm(ps) if ps else []
    for (t, lab), a in zip(family, adj, strict=True):
        out["tasks"][t]["metrics"][prim]["methods"][lab]["vs_lossless"]["holm"] = a
    out["family"] = {"metric": prim, "members": [f"{lab} on {t}" for t, lab in family], "adjustment": "holm",
                     "size": len(family)}
    return out


# -- blinded re-estimation and the A/A equivalence (eval_v3) ---------------------------------------

def blinded_variance(got: dict, upto: int, column: str = "correct") -> dict[str, dict]:
    """Per task, the blinded within-question variance of the first ``upto`` batches of every method in ``got``
    (``got[task][label][batch]``, as ``run_replicated`` keeps them): each question's runs pooled over the methods
    (labels not used), the variance (ddof 1) of its outcomes, averaged over questions with at least two runs.
    Returns ``{task: {"w": ..., "questions": ..., "runs": ...}}``."""
    out = {}
    for t, per_method in got.items():
        runs: dict[int, list[float]] = {}
        for batches in per_method.values():
            for b in range(upto):
                for rec in batches[b]["records"]:
                    runs.setdefault(rec["q"], []).append(float(bool(rec[column])))
        v = [np.var(x, ddof=1) for x in runs.values() if len(x) >= 2]
        out[t] = {"w": float(np.mean(v)) if v else math.nan, "questions": len(v),
                  "runs": int(sum(len(x) for x in runs.values()))}
    return out


def reestimated_replicates(w: dict[str, float], n: int, R: int, r_max: int, margin: float, parts_per_task: int = 2,
                           alpha: float = 0.025, target: float = 0.8) -> dict:
    """eval_v3's rule: per task the power of one non-inferiority part, ``pi_t = Phi(margin / sqrt(w_t (1/R +
    1/(2R)) / n) - z_(1 - alpha))`` (a rule against the pool of the verifier alone's and SpS's R runs each, no
    true difference); the claim's power ``prod_t pi_t ** parts_per_task``. Returns the smallest R' in [R, r_max]
    whose power reaches ``target`` (else ``r_max``; never below ``R``) and the power at each R'."""
    from scipy import stats

    z = stats.norm.ppf(1 - alpha)

    def part_power(wt, r):  # w = 0: no noise, every part passes; an unknown w: assume no power (raise R)
        if not math.isfinite(wt):
            return 0.0
        se = math.sqrt(wt * (1 / r + 1 / (2 * r)) / n)
        return 1.0 if se == 0 else float(stats.norm.cdf(margin / se - z))

    def claim_power(r):
        return float(np.prod([part_power(wt, r) ** parts_per_task for wt in w.values()]))

    powers = {r: claim_power(r) for r in range(R, r_max + 1)}
    chosen = next((r for r in range(R, r_max + 1) if powers[r] >= target), r_max)
    return {"replicates": chosen, "claim_power": {str(r): p for r, p in powers.items()}, "target": target}


def aa_equivalence(raw: dict, base: str, sps: str, n: int, R: int, margin: float, column: str = "correct") -> dict:
    """eval_v3's A/A claim: per question d_i = (``base``'s mean of its R runs) - (``sps``'s), pooled over the tasks,
    a 95% t-interval over questions. 'differs' if it excludes 0; else 'equivalent within the margin' if it lies
    inside (-margin, margin) (two one-sided tests at 0.025); else 'inconclusive'."""
    d = np.concatenate([per_question(tr["records"][base], n, R)[column].mean(1)
                        - per_question(tr["records"][sps], n, R)[column].mean(1) for tr in raw["tasks"].values()])
    est, lo, hi = _t_iv(d)
    verdict = ("differs" if lo > 0 or hi < 0 else
               "equivalent within the margin" if -margin < lo and hi < margin else "inconclusive")
    return {"methods": [base, sps], "questions": int(d.size), "estimate": est, "low": lo, "high": hi,
            "margin": margin, "verdict": verdict}


# -- claims of the protocol -----------------------------------------------------------------------

def claim_parts(result: dict, rules: list[str], metric: str | None = None) -> list[tuple[str, str, object, float]]:
    """``[(task, rule label, NonInferiority, reference accuracy)]``: the parts of a claim over ``rules`` x every
    task, from a format-2 result's summary (the primary metric unless ``metric``)."""
    from ...claims.ledger import NonInferiority

    summ = result["summary"]
    metric = metric or result["protocol"]["content"]["analysis"]["primary_metric"]
    out = []
    for t, task in summ["tasks"].items():
        mt = task["metrics"][metric]
        for lab in rules:
            if lab not in mt["methods"] or "vs_lossless" not in mt["methods"][lab]:
                continue
            v = mt["methods"][lab]["vs_lossless"]
            out.append((t, lab, NonInferiority(v["estimate"], v["low"], v["high"], v["n"], v["margin"],
                                               v["p_noninferior"], v["p_inferior"]), mt["reference"][0]))
    return out


def claim_verdicts(result: dict, scope: str = "") -> dict:
    """Each accuracy claim of the protocol decided by its rule (``claims.ledger.noninferiority_verdict``: parts =
    its rules x every task; out of reach on a task whose reference is not above ``min_reference_points``)."""
    from ...claims.ledger import noninferiority_verdict

    a = result["protocol"]["content"]["analysis"]
    out = {}
    for key, cl in a["claims"].items():
        if key == "wall-clock":
            continue
        parts = claim_parts(result, cl["rules"])
        missing = [lab for lab in cl["rules"] if not any(p[1] == lab for p in parts)]
        v = "out of reach" if missing else noninferiority_verdict(
            [p[2] for p in parts], scope=scope, references=[p[3] for p in parts],
            min_reference=a["min_reference_points"] / 100)
        out[key] = {"verdict": v, "missing": missing,
                    "parts": [{"task": t, "rule": lab, **_ni_dict(ni), "reference": ref} for t, lab, ni, ref in parts]}
    return out


# -- output ---------------------------------------------------------------------------------------

def _pts(v, signed: bool = False) -> str:
    f = (lambda x: f"{100 * x:+.1f}") if signed else (lambda x: f"{100 * x:.1f}")
    return "-" if v is None or not math.isfinite(v[0]) else f"{f(v[0])} [{f(v[1])}, {f(v[2])}]"


def _num(v, d: int = 2) -> str:
    return "-" if v is None or not math.isfinite(v[0]) else f"{v[0]:.{d}f} [{v[1]:.{d}f}, {v[2]:.{d}f}]"


def _p(x: float) -> str:
    return f"{x:.2g}" if x >= 1e-4 else "<1e-4"


def format_report(result: dict) -> str:
    """Markdown of a format-2 result, formatted from its summary (no statistic is recomputed here)."""
    summ, cfg, proto = result["summary"], result["config"], result["protocol"]
    a = proto["content"]["analysis"]
    prim, m_pts = a["primary_metric"], a["margin_points"]
    lines = [f"Protocol `{proto['path']}` sha256 `{proto['sha256'][:16]}`"
             + (f", committed in {proto['git']['committed_in'][:10]}" if proto.get("git", {}).get("committed_in") else "")
             + ("" if proto.get("git", {}).get("clean", True) else " (**the file has uncommitted changes**)") + "."]
    for d in proto.get("deviations", []):
        lines.append(f"**Deviation from the protocol**: {d}.")
    for am in proto.get("amendments", []):
        lines.append(f"**PROTOCOL AMENDED after results existed** ({am['where']}): sha256 {am['from'][:12]} -> "
                     f"{am['to'][:12]}; reason: {am['reason']}.")
    lines.append(f"Design: {len(cfg['tasks'])} tasks, {cfg['questions']} distinct questions each, {cfg['replicates']} "
                 f"replicates per (question, method), k = {cfg['k']}, up to {cfg['max_new_tokens']} new tokens, T "
                 f"{cfg['sampling']['temperature']:g} / top-k {cfg['sampling']['top_k']} / top-p "
                 f"{cfg['sampling']['top_p']:g}, batches of {cfg['batch_size']} rows; seeds per (question, replicate, "
                 "method), no common random numbers; methods in a random order per batch.")
    lines.append("")
    base = next(m["label"] for m in result["methods"] if m["key"] is None)
    for t, task in summ["tasks"].items():
        mt = task["metrics"][prim]
        ref = mt["reference"]
        lines += [f"### Task `{t}`: {task['distinct_question_texts']} distinct questions ({task['distinct_contents']} "
                  f"distinct contents) x {task['replicates']} replicates = {task['problem_runs_per_method']} problem-runs "
                  "per method", ""]
        lines += [f"| method | accuracy % ({prim}) | vs pooled lossless (points) | non-inferiority p (margin {m_pts:g}) "
                  f"| Holm | strict % | AL | acceptance | Rej vs SpS | step KL | NLL | time per problem vs verifier | "
                  "tokens/s vs verifier | time at equal length vs verifier |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        wc = task["wall_clock"]["methods"]
        for lab, row in task["methods"].items():
            e = mt["methods"][lab]
            se = task["metrics"]["strict"]["methods"][lab]
            if "vs_lossless" in e:
                v = e["vs_lossless"]
                diff = _pts([v["estimate"], v["low"], v["high"]], True)
                nip = _p(v["p_noninferior"])
                if v["high"] < -v["margin"]:
                    nip += f" (inferiority p {_p(v['p_inferior'])})"
                hol = _p(v["holm"]) if "holm" in v else "-"
            else:
                diff, nip, hol = f"A/A {_pts(e['aa_vs_other_lossless'], True)}", "lossless", "-"
            rej = row.get("rej_vs_sps")
            rej_s = "-" if rej is None else ("ref" if lab in summ["lossless"] else
                                             f"{100 * rej[0]:+.0f}% [{100 * rej[1]:+.0f}, {100 * rej[2]:+.0f}]")
            w = wc.get(lab, {})
            ratio = lambda k, w=w, lab=lab: "ref" if lab == base else _num(w.get(k))  # noqa: E731
            lines.append(f"| {lab} | {_pts(e['accuracy'])} | {diff} | {nip} | {hol} | {_pts(se['accuracy'])} | "
                         f"{_num(row.get('al'))} | {_num(row.get('acceptance'))} | {rej_s} | {_num(row.get('step_kl'), 3)} | "
                         f"{_num(row.get('nll'))} | {ratio('time_per_problem')} | {ratio('tokens_per_s_ratio')} | "
                         f"{ratio('length_adjusted')} |")
        lines.append(f"| pooled lossless ({' + '.join(summ['lossless'])}) | {_pts(ref)} | - | - | - | "
                     f"{_pts(task['metrics']['strict']['reference'])} | - | - | - | - | - | - | - | - |")
        lines.append("")
        notes = []
        if not mt["reachable"]:
            notes.append(f"**The pooled lossless accuracy {100 * ref[0]:.1f}% is not above {a['min_reference_points']:g} "
                         "points (2 x margin): 'differs' is unreachable on this task; its claim parts are out of reach.**")
        notes.append(f"The margin of {m_pts:g} points is {100 * m_pts / 100 / ref[0]:.0f}% of the reference accuracy "
                     f"here ({100 * ref[0]:.1f}%)." if ref[0] > 0 else "The reference accuracy is 0.")
        aa = mt["aa"]
        notes.append("A/A (lossless against lossless; 95% t-intervals over questions, points): "
                     + "; ".join(f"{k} {_pts(v, True)}" for k, v in aa["fixed"].items()) + ".")
        if "calibration" in aa:
            c = aa["calibration"]
            notes.append(f"Calibration of the interval: over {c['splits']} random splits of each question's "
                         f"{c['runs_per_question']} lossless runs into two halves, {100 * c['exclude_zero']:.1f}% of the "
                         f"A/A intervals exclude 0 (5% expected; Monte Carlo error about {100 * c['mc_se']:.1f} points, "
                         "the splits share their runs).")
        pw = mt["power"]
        if "ni_power_at_margin" in pw:
            notes.append(f"Power ({prim}): within-question variance of the lossless runs {pw['within_question_variance']:.3f}; "
                         f"sd of d {pw['sd_d']:.3f} at R = {pw['replicates']} against {pw['pooled_runs_per_question']} pooled "
                         f"runs; minimum detectable difference {100 * pw['mdd_two_sided_0.05']:.1f} points (two-sided "
                         f"0.05, power {a['power']:g}); power of the non-inferiority test at the margin with no true "
                         f"difference {pw['ni_power_at_margin']:.3f}; the margin needs {pw['questions_needed_margin']} "
                         f"questions ({pw['runs_per_method_needed_margin']} problem-runs per method); 3 points need "
                         f"{pw['runs_per_method_needed_3_points']} problem-runs per method at this R and pool "
                         f"({pw['runs_per_method_needed_3_points_one_run_vs_one_run']} with one run against one "
                         "reference run).")
        sp = task["metrics"]["strict"]["power"]
        if "mdd_two_sided_0.05" in sp and math.isfinite(sp["mdd_two_sided_0.05"]):
            notes.append(f"Minimum detectable difference (strict): {100 * sp['mdd_two_sided_0.05']:.1f} points.")
        w = task["wall_clock"]
        notes.append(f"Wall clock: {w['batches']} full batches of {cfg['batch_size']} rows ({w['dropped']} partial "
                     "batch dropped); ratios to the verifier alone on the same rows, above 1 = faster; 95% t-intervals "
                     "over full batches of the log ratio; time at equal length: log seconds regressed on log tokens with "
                     "batch and method effects"
                     + (f" (slope {_num(w['length_slope'])}, {w['regression_dof']} residual degrees of freedom)."
                        if "length_slope" in w else "."))
        lines += [f"- {x}" for x in notes] + [""]
    fam = summ["family"]
    lines.append(f"- Family: the {fam['size']} non-inferiority tests of the lossy methods x tasks ({fam['metric']}); "
                 "Holm-adjusted one-sided p-values in the Holm column. Intervals: accuracy and differences, 95% t over "
                 "questions (per question the mean of its replicates); AL, acceptance, Rej, step KL, NLL: 95% percentile "
                 "bootstrap over questions. Non-inferiority p: H0 mean(d) <= -margin, one-sided t over questions.")
    cv = result.get("claims") or {}
    if cv:
        lines += ["", "Pre-registered claims (decision rules of the protocol):", ""]
        for key, c in cv.items():
            if "parts" not in c:  # the A/A equivalence (eval_v3)
                a, b = c["methods"]
                lines.append(f"- {key}: **{c['verdict']}**: {a} minus {b}, {c['questions']} questions pooled over the "
                             f"tasks, {100 * c['estimate']:+.1f} [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}] points "
                             f"(equivalence margin +-{100 * c['margin']:g}; 'differs' if the interval excludes 0)")
                continue
            parts = "; ".join(f"{p['rule']} on {p['task']} {100 * p['estimate']:+.1f} [{100 * p['low']:+.1f}, "
                              f"{100 * p['high']:+.1f}] points (non-inferiority p {_p(p['p_noninferior'])})"
                              for p in c["parts"])
            lines.append(f"- {key}: **{c['verdict']}**: {parts}")
    return "\n".join(lines)


def plot_accuracy_vs_al(result: dict, path_stem: str | Path | None = None):
    """Per task, accuracy (primary metric, %) against AL with 95% intervals, one colour per rule; the pooled
    lossless accuracy as a band at AL = 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = result["summary"]
    prim = result["protocol"]["content"]["analysis"]["primary_metric"]
    ts = list(summ["tasks"])
    fig, axes = plt.subplots(1, len(ts), figsize=(6.5 * len(ts), 4.8), squeeze=False)
    info = {m["label"]: m for m in result["methods"]}
    for ax, t in zip(axes[0], ts, strict=True):
        task = summ["tasks"][t]
        mt = task["metrics"][prim]
        ref = mt["reference"]
        ax.axhspan(100 * ref[1], 100 * ref[2], color="0.85", zorder=0)
        ax.axhline(100 * ref[0], color="0.3", lw=1, ls=":", label="pooled lossless")
        for lab, row in task["methods"].items():
            if "al" not in row:
                continue
            acc, al = [100 * x for x in mt["methods"][lab]["accuracy"]], row["al"]
            ax.errorbar(al[0], acc[0], xerr=[[al[0] - al[1]], [al[2] - al[0]]],
                        yerr=[[acc[0] - acc[1]], [acc[2] - acc[0]]], fmt=registry.marker(info[lab]["key"]),
                        color=info[lab]["colour"], capsize=3, label=lab)
        ax.set_xlabel("AL: tokens per verifier call (bonus included)")
        ax.set_ylabel(f"accuracy ({prim}, %), 95% t-interval")
        ax.set_title(f"{t}: {task['questions']} questions x {task['replicates']} replicates", fontsize=10)
        ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    if path_stem is not None:
        save_figure(fig, path_stem)
    return fig


def compact(raw: dict, infos: list[dict], n: int, R: int) -> dict:
    """What eval.json keeps of the rows (the cache keeps texts): per task the question ids and, per method, one
    string per field, a space between questions (``rows_arrays`` reads it back): the replicates' outcomes
    ("0110": replicates 0..R-1) and the counters summed over replicates (6 significant digits)."""
    out = {}
    for t, tr in raw["tasks"].items():
        per = {}
        for m in infos:
            p = per_question(tr["records"][m["label"]], n, R)
            per[m["label"]] = {"correct": " ".join("".join("1" if x else "0" for x in row) for row in p["correct"]),
                               "strict": " ".join("".join("1" if x else "0" for x in row) for row in p["strict"]),
                               **{c: " ".join(f"{float(x):.6g}" for x in p[c]) for c in COUNTERS}}
        out[t] = {"question_ids": " ".join(p.id for p in tr["problems"]), "per_question": per, "timing": tr["timing"]}
    return out


def rows_arrays(result: dict, task: str, label: str) -> dict:
    """``compact``'s strings of one (task, method) of a saved result as arrays: ``correct`` / ``strict`` (n, R)
    booleans and each counter's (n,) sums over replicates."""
    d = result["rows"][task]["per_question"][label]
    out = {k: np.array([[c == "1" for c in s] for s in d[k].split()]) for k in ("correct", "strict")}
    out.update({c: np.array([float(x) for x in d[c].split()]) for c in COUNTERS})
    return out


def protocol_methods(protocol: Protocol, only: list[str] | None = None, trees=()) -> list[Method]:
    """The methods a protocol runs: those it lists (eval_v3's ``design.methods``), else the verifier alone and
    every registry rule at its grid (eval_v2); then the tree rows of ``trees``."""
    if "methods" in protocol.design:
        return listed_methods(protocol.design["methods"], only=only, trees=trees)
    return eval_methods(grid=protocol.design["grid"], only=only, trees=trees)


def _shown_path(path) -> str:
    """``path`` relative to the repository when it lies inside it (results do not record a machine's folders)."""
    from .protocol import PROTOCOLS

    p, root = Path(path).resolve(), PROTOCOLS.parents[1]
    return str(p.relative_to(root)) if p.is_relative_to(root) else str(path)


def shard_store(protocol: Protocol, cfg: RunConfig, run: str):
    """The protocol's committed shards (``design.shards``), for ``run`` (``"primary"`` or ``"sweep"``), or None."""
    sh = protocol.design.get("shards")
    if sh is None:
        return None
    from .protocol import protocol_dir
    from .shards import ShardStore

    meta = {"protocol_sha256": protocol.sha256, "decode_key": cfg.decode_key()}
    return ShardStore(protocol_dir(protocol, sh["dir"]), run, sh["batches_per_shard"], meta)


def _machine() -> dict:
    """What a shard records of the machine that decoded it."""
    import torch

    from ..roofline import cpu_model

    return {"cpu": cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def complete_in_shards(protocol: Protocol, cfg: RunConfig, only: list[str] | None = None) -> bool:
    """Whether the protocol's committed shards hold every batch of every method of the primary run (then
    ``evaluate`` assembles the result without a model; read without torch)."""
    from ...core.tree_shapes import BudgetTree

    shards = shard_store(protocol, cfg, "primary")
    if shards is None:
        return False
    prev = read_json(protocol_dir_of(protocol) / "reestimation.json")
    R = max(cfg.replicates, int(prev["replicates"])) if prev else cfg.replicates
    n_batches = len(batch_rows(cfg.questions, R, cfg.batch_size))
    ml = protocol_methods(protocol, only, [BudgetTree(*t) for t in cfg.trees])
    return all(shards.get(t, m.slug, b) is not None for t in cfg.tasks for m in ml for b in range(n_batches))


def protocol_dir_of(protocol: Protocol) -> Path:
    """The protocol's results folder: the parent of its shards folder (eval_v3), else the first design's."""
    from .protocol import protocol_dir

    sh = protocol.design.get("shards")
    return DEFAULT_OUT if sh is None else protocol_dir(protocol, sh["dir"]).parent


def _reestimation(protocol: Protocol, cfg: RunConfig, out_dir: Path, log):
    """eval_v3's blinded re-estimation (``design.reestimation``): the replicates decided earlier (read from
    ``out_dir/reestimation.json``) and the callback ``run_replicated`` calls after each round of batches, which
    decides once, after ``after_batches`` batches of every task, and writes the decision before any later batch."""
    spec = protocol.design.get("reestimation")
    if spec is None:
        return None
    path = out_dir / "reestimation.json"
    prev = read_json(path)
    if prev is not None:
        cfg.replicates = max(cfg.replicates, int(prev["replicates"]))
        return None

    def decide(got: dict, done: int):
        if done != spec["after_batches"] or path.exists():
            return None
        w = blinded_variance(got, done, "correct" if protocol.primary_metric == "lenient" else "strict")
        dec = reestimated_replicates({t: v["w"] for t, v in w.items()}, cfg.questions, cfg.replicates,
                                     spec["max_replicates"], protocol.margin, alpha=protocol.alpha,
                                     target=protocol.analysis["power"])
        rec = {"after_batches": done, "replicates_planned": cfg.replicates, **dec, "blinded_variance": w,
               "protocol_sha256": protocol.sha256}
        atomic_write_json(path, rec)
        log(f"blinded re-estimation after {done} batches of every task: w = "
            + ", ".join(f"{t} {v['w']:.3f}" for t, v in w.items())
            + f"; replicates {cfg.replicates} -> {dec['replicates']} (claim power {dec['claim_power']})")
        return dec["replicates"]

    return decide


def evaluate(pair, protocol: Protocol, cfg: RunConfig, out_dir: Path, cache_dir: Path | None = None, *,
             deviations=(), only: list[str] | None = None, amendment: str | None = None, progress: bool = True,
             calibrate_only: bool = False, lawtests: bool = True, figure: bool = True, log=print,
             use_shards: bool = True, engine_info: dict | None = None) -> dict:
    """The whole eval: the protocol guard (results under another protocol hash refuse to go on unless
    ``amendment``), decoding (``run_replicated``), the summary (``analyse``), the protocol's claims, the distribution
    tests (``lawtests.run_lawtests``, the protocol's sizes) and ``eval.json`` (format 2), ``eval.md`` and the figure
    (``figure``). ``use_shards``: read and write the protocol's committed shards (eval_v3); a run that deviates
    from the protocol keeps its decodes in its own cache (the command passes False then). ``engine_info``: the
    engine that decodes, when not the loop (``pair`` is then that engine or its loader): recorded in every shard
    and in eval.json (``engine``)."""
    from ...core.tree_shapes import BudgetTree
    from .protocol import ProtocolChanged

    out_dir = Path(out_dir)
    cache_dir = out_dir / "cache" if cache_dir is None else Path(cache_dir)
    cache = _Cache(cache_dir, cfg)
    amendments = []
    prev = read_json(out_dir / "eval.json")
    for where, rec in ((str(out_dir / "eval.json"), (prev or {}).get("protocol", {}).get("sha256")
                        if (prev or {}).get("format") == FORMAT else None),
                       (str(cache.dir), cache.recorded_protocol())):
        am = guard(protocol, rec, amendment, where)
        if am is not None:
            amendments.append(am)
    shards = shard_store(protocol, cfg, "primary") if use_shards else None
    for sha in sorted(shards.protocols) if shards is not None else []:  # committed shards of another protocol hash
        am = guard(protocol, sha, amendment, str(shards.root))
        if am is not None and am not in amendments:
            amendments.append(am)
    if amendment and not amendments:
        raise ProtocolChanged("--amend-protocol: nothing to amend (no result was made under another protocol hash)")
    trees = [BudgetTree(*t) for t in cfg.trees]
    ml = protocol_methods(protocol, only, trees)
    info = [method_info(m) for m in ml]
    reest = _reestimation(protocol, cfg, out_dir, log)
    t0 = time.perf_counter()
    raw = run_replicated(pair, cfg, ml, cache_dir, protocol_sha=protocol.sha256, progress=progress,
                         calibrate_only=calibrate_only, log=log, shards=shards, reestimate=reest,
                         engine_info=engine_info)
    if calibrate_only:
        return {"estimate": raw["estimate"]}
    res = {"format": FORMAT,
           "protocol": {"path": _shown_path(protocol.path), "sha256": protocol.sha256,
                        "git": git_status(protocol.path), "deviations": list(deviations), "amendments": amendments,
                        "content": protocol.content},
           "config": cfg.as_dict(), "methods": info, "estimate": raw["estimate"],
           "pair_name": cfg.pair if callable(pair) else getattr(pair, "name", "pair")}
    if engine_info:
        res["engine"] = engine_info
    if shards is not None:
        res["shards"] = {"dir": _shown_path(shards.root), "files": shards.files, "run": shards.run}
    res["summary"] = analyse(raw, info, protocol.analysis, cfg)
    res["claims"] = claim_verdicts(res)
    if "aa_claim" in protocol.analysis:
        base, sps = protocol.analysis["aa_claim"]["methods"]
        col = "correct" if protocol.primary_metric == "lenient" else "strict"
        res["claims"]["aa-equivalence"] = aa_equivalence(raw, base, sps, cfg.questions, cfg.replicates,
                                                         protocol.margin, col)
    res["rows"] = compact(raw, info, cfg.questions, cfg.replicates)
    lt = protocol.design.get("lawtests")
    if lawtests and lt:
        from .lawtests import run_lawtests

        res["lawtests"] = run_lawtests(pair, ml, tasks.distinct_problems(cfg.tasks[0], lt["prompts"], cfg.seed + 1),
                                       draws=lt["draws"], loop_draws=lt["loop_draws"], k=cfg.k, sampling=cfg.sampling,
                                       seed=cfg.seed, progress=progress)
    res["wall_seconds"] = time.perf_counter() - t0
    atomic_write_json(out_dir / "eval.json", res)
    atomic_write_text(out_dir / "eval.md", format_report(res) + "\n")
    if figure:
        import matplotlib.pyplot as plt

        plt.close(plot_accuracy_vs_al(res, out_dir / "fig_eval_accuracy_al"))
    res["raw"] = raw
    return res


# -- command (cactus-theory eval) -------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    """The replicated eval's arguments (``replicated``): the protocol fixes the design; any flag below that
    changes it is a deviation, recorded in eval.json and printed at the top of eval.md."""
    from .protocol import DEFAULT_PROTOCOL

    parser.add_argument("--protocol", default=str(DEFAULT_PROTOCOL),
                        help="the pre-registered protocol (JSON): tasks, questions, replicates, rules, margin, decision rules")
    parser.add_argument("--tasks", default=None, help=f"deviation: comma-separated tasks among {sorted(tasks.TASKS)}")
    parser.add_argument("--questions", type=int, default=None, help="deviation: distinct questions per task")
    parser.add_argument("--replicates", type=int, default=None, help="deviation: decodes per (question, method)")
    parser.add_argument("--rules", default=None,
                        help="deviation: comma-separated registry keys or labels to run (SpS and the verifier alone always run)")
    parser.add_argument("-k", type=int, default=None, help="deviation: drafted tokens per step")
    parser.add_argument("--tree", type=int, nargs="*", default=None, metavar="NODES",
                        help="deviation: SpS and Cactus delta = 1 on EAGLE-2 budget trees of these node counts "
                             "(--tree-depth, --tree-topk; deterministic top-k candidates) instead of the protocol's")
    parser.add_argument("--tree-depth", type=int, default=BUDGET_DEPTH,
                        help=f"levels of the --tree trees (default {BUDGET_DEPTH})")
    parser.add_argument("--tree-topk", type=int, default=BUDGET_TOPK,
                        help=f"candidates per grown node of the --tree trees (default {BUDGET_TOPK})")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="deviation: new tokens per row at most")
    parser.add_argument("--batch-size", type=int, default=None, help="deviation: rows decoded together (one cache piece)")
    parser.add_argument("--seed", type=int, default=None, help="deviation: questions and decoding seed")
    parser.add_argument("--draft", default="embedded", help="'embedded', a .gguf path, a folder or a hub id")
    parser.add_argument("--verifier", default="smollm2", help="'smollm2', a .gguf path, a folder or a hub id")
    parser.add_argument("--draft-path", default=None,
                        help="with --draft embedded: this checkpoint of the embedded draft instead of the cached build")
    parser.add_argument("--device", default=None, help="torch device (default cpu)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    parser.add_argument("--no-lawtests", action="store_true", help="skip the distribution tests")
    parser.add_argument("--calibrate-only", action="store_true",
                        help="decode the first batch of every (task, method), print the compute estimate and stop")
    parser.add_argument("--amend-protocol", default=None, metavar="REASON",
                        help="go on although results exist under another hash of the protocol; the reason and both "
                             "hashes are recorded in eval.json and eval.md")
    parser.add_argument("--out", default=None,
                        help="folder for eval.json, eval.md and the figure (default: the protocol's results folder, "
                             "the parent of its design.shards.dir; paper_repro/results/eval for eval_v2)")
    parser.add_argument("--cache", default=None, help="per-batch cache folder (default <out>/cache)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (the model load's included)")
    parser.add_argument("--sweep", action="store_true",
                        help="run the protocol's secondary sweep (design.sweep: the other rules at R = 1 on its "
                             "questions, the primary run's lossless runs as the reference) instead of the primary run")
    parser.add_argument("--wall-clock", action="store_true",
                        help="run the protocol's wall-clock benchmark (analysis.wall_clock: the first 24 questions of "
                             "each task, batch 1, one thread, interleaved rounds of the primary methods; run it on a "
                             "quiet machine) into <out>/wall_clock.json instead of the primary run")
    parser.add_argument("--rounds", type=positive_int, default=None,
                        help="with --wall-clock: interleaved rounds (the protocol's at least 5; fewer is a deviation)")
    g = parser.add_argument_group("engine", "who decodes the rows (docs/eval.md#engines): the same protocol, questions, "
                                            "replicates, row seeds and records under every engine")
    g.add_argument("--engine", default="loop", choices=ENGINES,
                   help="'loop': the project's decoding loop; 'vllm': a vLLM engine with the project's plugin applying "
                        "each rule (the verifier alone: the same vLLM without speculation); its shards and eval.json "
                        "live under their own decode key")
    g.add_argument("--vllm-arg", action="append", default=None, metavar="KEY=VALUE",
                   help="with --engine vllm: an engine argument passed to vLLM's LLM(...) as is (VALUE read as JSON "
                        "when it parses, else a string), e.g. data_parallel_size=8, tensor_parallel_size=2, "
                        f"gpu_memory_utilization=0.85; repeatable; the eval sets {', '.join(VLLM_RESERVED)} itself")
    g.add_argument("--vllm-draft-method", default="auto", choices=("auto", "eagle3", "draft_model"),
                   help="with --engine vllm: vLLM's speculative method; auto: eagle3 for the project's drafts "
                        "('embedded', a .pt file, an EAGLE-3 folder), draft_model for a causal LM (a folder or hub id); "
                        "drafts are sampled (draft_sample_method='probabilistic') so every rule sees the draft's law")
    g.add_argument("--vllm-chat-kwargs", default=None, metavar="JSON",
                   help="with --engine vllm: keyword arguments of the chat template, e.g. '{\"enable_thinking\": false}' "
                        "for Qwen3 (part of the decode key)")


def _overrides(args) -> dict:
    out = {"tasks": [s.strip() for s in args.tasks.split(",") if s.strip()] if args.tasks else None,
           "questions": args.questions, "replicates": args.replicates, "k": args.k,
           "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size, "seed": args.seed}
    if args.tree is not None:
        out["trees"] = [[t.nodes, t.depth, t.topk] for t in eval_trees(args)]
    return out


# engine arguments the eval sets itself (the protocol's, the plugin's or what a row's law depends on)
VLLM_RESERVED = ("model", "tokenizer", "speculative_config", "additional_config", "dtype", "seed",
                 "skip_tokenizer_init", "max_model_len")


def parse_engine_args(values: list[str] | None) -> dict:
    """``--vllm-arg KEY=VALUE`` flags as a dict: VALUE read as JSON when it parses (numbers, booleans, objects),
    else kept as a string. ``ValueError`` naming the flag for a missing ``=``, a key that is not an identifier, a key
    given twice, or one of ``VLLM_RESERVED``."""
    import json

    out: dict = {}
    for item in values or []:
        key, eq, raw = str(item).partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise ValueError(f"--vllm-arg must read KEY=VALUE with KEY an engine argument's name, got {item!r}")
        if key in VLLM_RESERVED:
            raise ValueError(f"--vllm-arg {key}: the eval sets {key} itself (the protocol, the pair or the plugin fix it)")
        if key in out:
            raise ValueError(f"--vllm-arg {key} given twice")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def check_engine_flags(args) -> None:
    """The engine flags (``ValueError`` naming the flag, before anything loads): ``--vllm-*`` only with ``--engine
    vllm``; ``--vllm-arg`` parsed (``args.engine_args``), ``--vllm-chat-kwargs`` a JSON object
    (``args.chat_kwargs``); with vLLM, no ``--device`` or ``--draft-path`` (vLLM places and loads the models
    itself: ``--vllm-arg``)."""
    import json

    engine = getattr(args, "engine", "loop")
    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {ENGINES}, got {engine!r}")
    given = [f for f, v in (("--vllm-arg", getattr(args, "vllm_arg", None)),
                            ("--vllm-draft-method", None if getattr(args, "vllm_draft_method", "auto") == "auto"
                             else args.vllm_draft_method),
                            ("--vllm-chat-kwargs", getattr(args, "vllm_chat_kwargs", None))) if v is not None]
    if engine == "loop":
        if given:
            raise ValueError(f"{given[0]} goes with --engine vllm")
        args.engine_args, args.chat_kwargs = {}, {}
        return
    for flag, v in (("--device", args.device), ("--draft-path", args.draft_path)):
        if v is not None:
            raise ValueError(f"{flag} goes with --engine loop (vLLM places and loads the models itself: --vllm-arg)")
    args.engine_args = parse_engine_args(args.vllm_arg)
    args.chat_kwargs = {}
    if args.vllm_chat_kwargs is not None:
        try:
            ck = json.loads(args.vllm_chat_kwargs)
        except json.JSONDecodeError as e:
            raise ValueError(f"--vllm-chat-kwargs must be a JSON object, got {args.vllm_chat_kwargs!r} ({e})") from None
        if not isinstance(ck, dict):
            raise ValueError(f"--vllm-chat-kwargs must be a JSON object, got {args.vllm_chat_kwargs!r}")
        args.chat_kwargs = ck


def _plan(args, pair: str = "pair"):
    """The protocol, the run's config and deviations, ``--rules`` and the output folder (``ValueError`` naming the
    flag). An engine other than the loop writes, by default, under the protocol's results folder in
    ``engines/<decode key>`` (never the loop's eval.json); a run of it that deviates needs its own ``--out``."""
    from .protocol import load_protocol

    if args.seed is not None and args.seed < 0:
        raise ValueError(f"--seed must be an integer >= 0, got {args.seed}")
    check_engine_flags(args)
    protocol = load_protocol(args.protocol)
    cfg, dev = RunConfig.from_protocol(protocol, pair, **_overrides(args))
    only = [s.strip() for s in args.rules.split(",") if s.strip()] if args.rules else None
    if only is not None:
        dev.append(f"rules: only {only} (and the references) of the protocol's methods in this run")
    from ...core.tree_shapes import BudgetTree

    protocol_methods(protocol, only, [BudgetTree(*t) for t in cfg.trees])
    if args.sweep and "sweep" not in protocol.design:
        raise ValueError(f"--sweep: the protocol {args.protocol} has no design.sweep")
    rounds = getattr(args, "rounds", None)
    if rounds is not None and not getattr(args, "wall_clock", False):
        raise ValueError(f"--rounds goes with --wall-clock, got --rounds {rounds} without it")
    if getattr(args, "wall_clock", False):
        from .wallclock import ROUNDS

        if args.sweep:
            raise ValueError("--wall-clock and --sweep are two runs: give one")
        if getattr(args, "engine", "loop") != "loop":
            raise ValueError(f"--wall-clock times the project's loop (the protocol's wall clock): it takes --engine loop, "
                             f"got --engine {args.engine}")
        if "wall_clock" not in protocol.analysis:
            raise ValueError(f"--wall-clock: the protocol {args.protocol} has no analysis.wall_clock")
        args.rounds = ROUNDS if rounds is None else rounds
        if args.rounds < ROUNDS:
            dev.append(f"rounds: at least {ROUNDS} in the protocol's wall clock, {args.rounds} in this run")
    sh = protocol.design.get("shards")
    committed = protocol_dir_of(protocol)
    out = committed if args.out is None else Path(args.out)
    if dev and (out.resolve() == committed.resolve() or (args.engine != "loop" and args.out is None)):
        raise ValueError(f"--out: a run that deviates from the protocol ({'; '.join(dev)}) does not write the committed "
                         f"results in {committed}: give another --out")
    args.out_dir = out
    args.use_shards = sh is not None and not dev  # a deviating run keeps its decodes in its own cache only
    return protocol, cfg, dev, only


def check(args, engine=None) -> None:
    """Every check that needs no model (``ValueError`` naming the flag), run by the CLI before ``run``: the
    protocol and the run's config, ``--rules``, the engine flags, the model arguments, ``--out`` / ``--cache``
    writable, ``--device`` a torch device present here (this imports torch, no model), and the draft:
    ``--draft-path`` a torch.save file, or the embedded draft built (for a protocol with committed shards, only once
    a batch must be decoded: a run complete in its shards needs no model). ``engine`` (with ``--engine vllm``: the
    engine's spec, ``integrations.vllm_eval.VllmEvalSpec``): its own checks (``engine.check(args)``) and every
    method the run decodes against its declared capabilities (``check_methods``)."""
    from ...util.args import check_device, check_writable_dir
    from ..draft_config import check_draft_built, check_draft_file
    from ..loading import check_model

    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads!r}")
    protocol, cfg, _, only = _plan(args)
    check_model(args.verifier, "--verifier")
    check_model(args.draft, "--draft")
    if args.engine != "loop":
        if engine is None:
            raise ValueError(f"--engine {args.engine}: run it through the cactus-theory command")
        engine.check(args)
        _engine_plan(args, protocol, cfg, engine)
        check_methods(_run_methods(protocol, cfg, only, args.sweep), engine.caps, args.engine)
        check_writable_dir(str(args.out_dir), "--out")
        check_writable_dir(args.cache, "--cache")
        return
    if args.draft_path is not None and (args.draft != "embedded" or not os.path.isfile(args.draft_path)):
        raise ValueError(f"--draft-path must be an existing file and goes with --draft embedded, got "
                         f"{args.draft_path!r} with --draft {args.draft!r}")
    check_writable_dir(str(args.out_dir), "--out")
    check_writable_dir(args.cache, "--cache")
    check_device(args.device)
    if args.draft_path is not None:
        check_draft_file(args.draft_path, "--draft-path")
    elif args.draft == "embedded" and not (args.use_shards and not args.sweep and not getattr(args, "wall_clock", False)
                                           and complete_in_shards(
            protocol, replace(cfg, pair=pair_id(args.draft, args.verifier)), only)):
        check_draft_built(args.verifier)  # not built yet: say so now, not after the verifier loads


def _loader(args, cfg: RunConfig, progress: bool):
    """The pair, loaded when first needed: the run's dtype and lean step, on ``--device``."""
    def load():
        from ..draft_config import check_draft_built
        from ..loading import quiet_transformers

        if args.draft_path is None and args.draft == "embedded":
            check_draft_built(args.verifier)
        with quiet_transformers(progress):
            pair = _legacy.load_eval_pair(args.draft, args.verifier, args.draft_path, cfg.dtype, cfg.lean)
        if args.device:
            pair.draft.to(args.device)
            pair.verifier.to(args.device)
        return pair

    return load


def _run_methods(protocol: Protocol, cfg: RunConfig, only, sweep: bool) -> list[Method]:
    """The methods a run decodes: the sweep's (``sweep_plan``) or the primary run's."""
    from ...core.tree_shapes import BudgetTree

    if sweep:
        return sweep_plan(protocol, cfg)[1]
    return protocol_methods(protocol, only, [BudgetTree(*t) for t in cfg.trees])


def _engine_plan(args, protocol: Protocol, cfg: RunConfig, engine) -> None:
    """An engine run's pair, engine identity (both in the decode key) and default output folder
    (``engines/<decode key>`` under the protocol's results folder)."""
    cfg.pair = pair_id(args.draft, args.verifier, args.draft_path)
    cfg.engine = engine.identity(args)
    cfg.check()
    if args.out is None:
        args.out_dir = protocol_dir_of(protocol) / "engines" / cfg.decode_key()


def run(args, engine=None) -> int:
    """``cactus-theory eval``: the replicated eval of the protocol (``replicated.evaluate``), or its sweep
    (``--sweep``). ``engine``: with ``--engine vllm``, the engine's spec (``integrations.vllm_eval.VllmEvalSpec``:
    ``identity(args)``, ``caps``, ``info(args, cfg)``, ``load(args, cfg, methods)``), passed by the command; the
    rows, seeds, records, shards and verdicts are this module's whatever the engine."""
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads!r}")
    if args.draft_path is not None and (args.draft != "embedded" or not os.path.isfile(args.draft_path)):
        raise ValueError(f"--draft-path must be an existing file and goes with --draft embedded, got "
                         f"{args.draft_path!r} with --draft {args.draft!r}")
    protocol, cfg, dev, only = _plan(args)  # every argument checked before a model loads
    if args.engine != "loop" and engine is None:
        raise ValueError(f"--engine {args.engine}: run it through the cactus-theory command")
    if args.no_progress:
        os.environ["TQDM_DISABLE"] = "1"  # every bar, the libraries' too
    cfg.pair = pair_id(args.draft, args.verifier, args.draft_path)
    info = None
    if args.engine == "loop":
        import torch

        threads = args.threads or protocol.design.get("threads")
        if threads:
            torch.set_num_threads(threads)
        load = _loader(args, cfg, not args.no_progress)
    else:
        _engine_plan(args, protocol, cfg, engine)
        ml = _run_methods(protocol, cfg, only, args.sweep)
        check_methods(ml, engine.caps, args.engine)  # before any model loads
        info = {**engine.info(args, cfg), "seed_map": SEED_MAPS[args.engine]}

        def load():
            return engine.load(args, cfg, ml)
    if args.sweep:
        if dev:
            raise ValueError(f"--sweep reads the primary run's committed shards: it takes no deviation ({'; '.join(dev)})")
        return run_sweep(load, protocol, cfg, args)
    if getattr(args, "wall_clock", False):
        from . import wallclock

        return wallclock.run(load, protocol, cfg, args, protocol_methods(protocol), _decode)
    res = evaluate(load, protocol, cfg, args.out_dir, args.cache, deviations=dev, only=only,
                   amendment=args.amend_protocol, progress=not args.no_progress,
                   calibrate_only=args.calibrate_only, lawtests=not args.no_lawtests and args.engine == "loop",
                   use_shards=args.use_shards, engine_info=info)
    if args.calibrate_only:
        return 0
    print(format_report(res))
    if "lawtests" in res:
        from .lawtests import format_lawtests

        print(format_lawtests(res["lawtests"]))
    print(f"wrote {args.out_dir / 'eval.json'} ({res['wall_seconds']:.0f} s)")
    return 0


def sweep_plan(protocol: Protocol, cfg: RunConfig) -> tuple[RunConfig, list[Method], list[str], int]:
    """The sweep's config (the sweep's task and replicates; the primary run's question list, so its rows and decode
    key are the primary's), its methods (the references, then ``design.sweep``'s rules and tree rows), the labels
    it seals (all but the references, which the primary run's shards hold) and its batches."""
    from ...core.tree_shapes import BudgetTree

    sw = protocol.design["sweep"]
    scfg = RunConfig(**{**cfg.as_dict(), "tasks": [sw["task"]], "replicates": sw["replicates"]})
    refs = [m for m in protocol.design["methods"] if m["key"] in (None, "sps")]
    ml = listed_methods(refs + sw["methods"], trees=[BudgetTree(*t) for t in sw.get("trees", [])])
    n_rows = sw["questions"] * sw["replicates"]
    if sw["replicates"] != 1 and sw["questions"] != cfg.questions:
        raise ValueError("design.sweep: a subset of the questions is the first batches only at one replicate")
    own = [m.label for m in ml if not (m.key is None or (m.key == "sps" and m.tree is None))]
    return scfg, ml, own, -(-n_rows // cfg.batch_size)


def run_sweep(pair, protocol: Protocol, cfg: RunConfig, args) -> int:
    """Decode the sweep (``sweep_plan``) into its committed shards, then read it (``sweep.analyse_sweep``) against the
    primary run's lossless runs of its questions, once the primary run has them all (``sweep.json`` / ``sweep.md``
    beside eval.json)."""
    from .sweep import analyse_sweep, format_sweep

    scfg, ml, seal, n_batches = sweep_plan(protocol, cfg)
    cache_dir = Path(args.cache) if args.cache else args.out_dir / "cache"
    raw = run_replicated(pair, scfg, ml, cache_dir, protocol_sha=protocol.sha256, progress=not args.no_progress,
                         calibrate_only=args.calibrate_only, shards=shard_store(protocol, scfg, "sweep"), seal=seal,
                         max_batches=n_batches)
    if args.calibrate_only:
        return 0
    sw = protocol.design["sweep"]
    task, n = sw["task"], sw["questions"]
    refs = ml[:2]
    pool = pool_records(protocol, cfg, refs, task, n, cache_dir)
    if pool is None:
        print(f"sweep decoded ({len(seal)} methods x {n_batches} batches of {task}); its reading waits for the primary "
              f"run's lossless runs of these {n} questions")
        return 0
    res = analyse_sweep(pool, raw["tasks"][task]["records"], seal, n, refs[0].label, refs[1].label, seed=cfg.seed)
    res["protocol_sha256"] = protocol.sha256
    atomic_write_json(args.out_dir / "sweep.json", res)
    atomic_write_text(args.out_dir / "sweep.md", format_sweep(res, task) + "\n")
    print(format_sweep(res, task))
    return 0


def pool_records(protocol: Protocol, cfg: RunConfig, refs: list[Method], task: str, n: int,
                 cache_dir: Path | None) -> dict | None:
    """The primary run's records of ``refs`` (the verifier alone, SpS) on the first ``n`` questions of ``task``, every
    replicate, from its shards or cache; None while some are not decoded yet."""
    prev = read_json(cache_dir.parent / "reestimation.json") if cache_dir is not None else None
    R = max(cfg.replicates, int(prev["replicates"])) if prev else cfg.replicates
    cache = _Cache(cache_dir, cfg, shard_store(protocol, cfg, "primary"))
    problems = tasks.distinct_problems(task, cfg.questions, cfg.seed)
    out = {m.label: [] for m in refs}
    for b, rows in enumerate(batch_rows(cfg.questions, R, cfg.batch_size)):
        if not any(q < n for q, _ in rows):
            continue
        for m in refs:
            want = [[q, r, row_seed(cfg.seed, task, problems[q].question, r, m.rule_id)] for q, r in rows]
            got = cache.lookup(task, m, b, want)
            if got is None:
                return None
            out[m.label] += [r for r in got["records"] if r["q"] < n]
    return out
