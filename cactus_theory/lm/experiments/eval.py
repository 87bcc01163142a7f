"""The first eval design (result format 1): task accuracy, acceptance and distortion of every acceptance rule
on a real (draft, verifier) pair, one decode per problem, with intervals. ``cactus-theory eval`` now runs the
replicated design (``replicated``: distinct questions, replicates, a pre-registered protocol); this module
keeps what renders the committed format-1 result (``format_table``, ``comparisons``, ``summarise``), the
reduced run of ``paper_repro`` step h (``evaluate``), and what both designs share (``methods``, ``Method``,
``EVAL_GRID``, ``pair_id``, ``load_eval_pair``). Its design flaws (repeated questions, one sample per
problem, a seed shared per batch across methods, a wall clock confounded by output length) are issue 25's.

Task: ``tasks.DEFAULT_TASK`` = ``arith`` ("What is 7 + 5? Explain briefly, then give the final answer
as a number.", chat template, exact match of the extracted integer), chosen by the verifier's measured
accuracy alone at the paper's sampling (``benchmarks/task_candidates.py``, 80 problems each, numbers in
``paper_repro/results/eval/task_candidates.json``): ``arith`` 46% [36, 57] with answers after ~23
generated tokens, the only candidate inside 25-85% besides ``add1`` (34%); word problems with "think
step by step" scored 3-19% (the 135M verifier rambles past its answer), ``reasoning-gym``'s chain_sum and
leg_counting 14% and 1%. Methods: the verifier alone and every rule of the registry at the sweep values
of ``EVAL_GRID`` (registry defaults for rules the grid does not name), ``k`` drafts per step, the
paper's sampling (temperature 0.6, top-k 20, top-p 0.95, applied to ``p`` and ``q``).

Per method (``summarise``): accuracy with a 95% Wilson interval; the paired difference against SpS on
the same problems (percentile bootstrap over problems, McNemar's exact p-value); AL = tokens emitted
per verifier call, bonus included (``DecodeStats.al``: (accepted + steps) / steps); per-token acceptance = accepted drafts / drafted tokens; Rej =
rejected drafts per emitted token relative to SpS (paired bootstrap); mean exact step
``KL(h_alg || q)`` and verifier NLL (nats/token); speedup = tokens/s over the verifier alone's tokens/s,
both measured batch by batch in the same run (each batch of problems is decoded by every method
back to back, so machine load cancels in the ratio). All intervals are 95%, bootstrap over problems
(over batches for the speedup), seeded. ``format_table`` re-derives from the per-problem records what a
reader needs to judge the comparisons (``comparisons``): Holm-adjusted p-values over the declared family,
strict-match beside the lenient score, the pooled lossless reference and the minimum detectable difference;
and it prints the speedup as the geometric mean of the per-batch ratios with a t-interval over the batches
(``speedup_interval``: 10 batches are too few for a percentile bootstrap).

The interpolation ablation (``ablation``): the smallest Cactus ``delta`` on a ladder (x4 steps,
then bisection in log delta) whose AL on the first batch reaches interpolation alpha = 0.9's AL, run
on all problems and compared in accuracy; if no ``delta <= DELTA_MAX`` reaches it, the largest AL
Cactus reaches is reported instead.

Resumable: every (batch, method) is cached as one JSON file written atomically under ``--cache``
(one folder per configuration); a rerun decodes only what is missing.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...core import registry
from ...core.sampling import SAMPLING as _SAMPLING
from ...core.sampling import Sampling
from ...core.tree_shapes import tree_from_record, tree_name, tree_record
from ...util.atomic import atomic_path, atomic_write_json, atomic_write_text
from ...util.keyed_cache import config_key, keyed_subdir, read_json
from ..metrics import COUNTERS, al_of
from . import tasks

__all__ = ["EVAL_GRID", "SAMPLING", "Method", "EvalConfig", "methods", "run_eval", "summarise", "format_table",
           "plot_accuracy_vs_al", "evaluate", "pair_id", "load_eval_pair", "eval_trees", "method_info",
           "listed_methods", "tree_methods"]

SAMPLING = _SAMPLING  # the paper's (core.sampling.SAMPLING)
# the sweep per registry key; rules not named here run once at their registry defaults
EVAL_GRID: dict[str, list[dict]] = {
    "sps": [{}],
    "cactus": [{"delta": d} for d in (0.25, 0.5, 0.75, 1.0, 2.0)],
    "tas": [{"epsilon": 0.09, "alpha": 0.3}],
    "topk": [{"k": 3, "recovery": "topk"}],
    "interpolation": [{"alpha": 0.5}, {"alpha": 0.9}],
    "sequence_budget": [{"budget": b} for b in (0.5, 1.0, 2.0, 4.0)],  # nats per answer (issue 28)
}
ABLATION_ALPHA = 0.9
DELTA_MAX = 2048.0
N_BOOT = 4000


# -- methods (from the registry) ------------------------------------------------------------------

@dataclass(frozen=True)
class Method:
    """One decoding method: ``rule`` None is the verifier alone; ``key`` is the registry key."""

    label: str
    key: str | None
    params: dict = field(default_factory=dict)
    rule: object = None
    colour: str = "black"
    tree: object = None  # a core.tree_shapes tree (any kind): tree decoding (deterministic candidates), not a chain

    @property
    def slug(self) -> str:
        s = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.label)
        return f"{s[:48]}-{hashlib.sha256(self.rule_id.encode()).hexdigest()[:8]}"

    @property
    def rule_id(self) -> str:
        """The rule's ``identity`` (its repr and the revision of its law), and the tree if any: what
        cached batches key on."""
        rid = "None" if self.rule is None else self.rule.identity
        return rid if self.tree is None else f"{rid}|{self.tree!r}|deterministic"


def _build(key: str, params: dict):
    """A rule from its registry key and parameters; a parameter the rule does not take is a
    ``ValueError`` naming it (never dropped: the grid would silently run another rule)."""
    from dataclasses import fields

    known = {f.name for f in fields(registry.spec(key).cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"grid parameters {unknown} are not parameters of rule {key!r} (it takes {sorted(known)})")
    return registry.make(key, **params)


TREE_RULES = (("sps", {}), ("cactus", {"delta": 1.0}))  # the rules run on each tree (--tree)


def tree_label(rule_label: str, tree) -> str:
    """A tree row's label: the rule's, then the tree's name (``core.tree_shapes.tree_name``: ``EAGLE-2 tree
    nodes/depth/topk`` for a ``BudgetTree``, as every tree row was labelled before other kinds)."""
    return f"{rule_label}, {tree_name(tree)}"


def methods(grid: dict[str, list[dict]] | None = None, only: list[str] | None = None, trees=()) -> list[Method]:
    """The verifier alone, then every registry rule at its ``grid`` values (``EVAL_GRID`` by
    default; a rule the grid does not name runs once at its defaults); ``only``: keep the methods
    whose registry key or label is listed (SpS, the reference, always stays); then, for each tree of
    ``trees`` (any kind of ``core.tree_shapes``: ``BudgetTree``, ``DynamicTree``, ``StaticTree``), SpS and Cactus
    delta = 1 decoding that tree (``TREE_RULES``; deterministic top-k candidates, the scheme that keeps SpS
    lossless under a ``BudgetTree``'s re-ranking)."""
    grid = EVAL_GRID if grid is None else grid
    out = [Method("verifier alone", None)]
    for key in registry.RULES:
        for params in grid.get(key, [{}]):
            rule = _build(key, params)
            out.append(Method(registry.label(rule), key, dict(params), rule, registry.colour(key)))
    if only is not None:
        bad = [o for o in only if not any(o in (m.key, m.label) for m in out)]
        if bad:
            raise ValueError(f"--rules: unknown {bad}; known keys {list(registry.RULES)} and labels "
                             f"{[m.label for m in out[1:]]}")
        out = [m for m in out if m.key is None or m.key == "sps" or m.key in only or m.label in only]
    return out + tree_methods(trees)


def tree_methods(trees=()) -> list[Method]:
    """SpS and Cactus delta = 1 (``TREE_RULES``) decoding each tree of ``trees`` (deterministic top-k candidates)."""
    out = []
    for tree in trees:
        for key, params in TREE_RULES:
            rule = _build(key, params)
            out.append(Method(tree_label(registry.label(rule), tree), key, dict(params), rule, registry.colour(key),
                              tree))
    return out


def listed_methods(specs: list[dict], only: list[str] | None = None, trees=()) -> list[Method]:
    """The methods a protocol lists (``[{"key": registry key or None, "params": {...}}]``, eval_v3), in its order;
    ``only`` as ``methods``; then the tree rows of ``trees``."""
    out = []
    for spec in specs:
        key, params = spec["key"], dict(spec.get("params", {}))
        if key is None:
            out.append(Method("verifier alone", None))
            continue
        rule = _build(key, params)
        out.append(Method(registry.label(rule), key, params, rule, registry.colour(key)))
    if only is not None:
        bad = [o for o in only if not any(o in (m.key, m.label) for m in out)]
        if bad:
            raise ValueError(f"--rules: unknown {bad}; the protocol's methods are {[m.label for m in out]}")
        out = [m for m in out if m.key is None or m.key == "sps" or m.key in only or m.label in only]
    return out + tree_methods(trees)


# -- configuration and cache ----------------------------------------------------------------------

@dataclass
class EvalConfig:
    """What one evaluation runs; its hash names the cache folder."""

    task: str = tasks.DEFAULT_TASK
    problems: int = 300
    seed: int = 0
    k: int = 4
    max_new_tokens: int = 128
    batch_size: int = 32
    sampling: dict = field(default_factory=SAMPLING.as_dict)
    pair: str = "smollm2+embedded"

    def check(self) -> None:
        """``ValueError`` naming the first bad field (before any model is loaded)."""
        if self.task not in tasks.TASKS:
            raise ValueError(f"task must be one of {sorted(tasks.TASKS)}, got {self.task!r}")
        for name in ("problems", "k", "max_new_tokens", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        Sampling(self.sampling["temperature"], self.sampling["top_k"], self.sampling["top_p"])

    def as_dict(self) -> dict:
        return {"task": self.task, "problems": self.problems, "seed": self.seed, "k": self.k,
                "max_new_tokens": self.max_new_tokens, "batch_size": self.batch_size,
                "sampling": dict(self.sampling), "pair": self.pair}

    def key(self) -> str:
        """Names the cache folder (``util.keyed_cache.config_key`` of ``as_dict()``, 12 digits)."""
        return config_key(self.as_dict(), 12)


# -- decoding one batch ---------------------------------------------------------------------------

def _decode(pair, prompts: list[str], method: Method, cfg: EvalConfig, seed: int) -> tuple[list[str], list[dict], float]:
    """Texts, per-sequence counters (``COUNTERS``, from the loop's ``DecodeResult.per_sequence``) and
    the decode seconds of one batch, decoded at once."""
    from ..loop import autoregressive_generate, speculative_generate, tree_generate

    kw = dict(max_new_tokens=cfg.max_new_tokens, seed=seed, batch_size=len(prompts), **cfg.sampling)
    if method.rule is None:
        res = autoregressive_generate(pair, prompts, **kw)
    elif method.tree is not None:
        res = tree_generate(pair, prompts, method.rule, method.tree, "deterministic", **kw)
    else:
        res = speculative_generate(pair, prompts, method.rule, k=cfg.k, **kw)
    per = [{c: getattr(sc, c) for c in COUNTERS} for sc in res.per_sequence]
    return list(res.texts), per, float(res.stats.seconds)


def _batch_record(pair, batch: list[tasks.Problem], method: Method, cfg: EvalConfig, seed: int) -> dict:
    texts, per, secs = _decode(pair, [p.question for p in batch], method, cfg, seed)
    recs = []
    for p, t, c in zip(batch, texts, per, strict=True):
        pred = tasks.extract_answer(t)
        recs.append({"id": p.id, "answer": p.answer, "pred": pred, "correct": pred == p.answer,
                     "strict": tasks.strict_answer(t) == p.answer, "text": t, **c})
    return {"rule": method.rule_id, "seconds": secs, "records": recs}


class _Cache:
    """``<root>/<config key>/<method slug>/b<batch>.json``; a config file records what the key means."""

    def __init__(self, root: Path | None, cfg: EvalConfig):
        self.dir = None if root is None else keyed_subdir(root, cfg.as_dict(), 12)

    def get(self, method: Method, b: int, compute):
        path = None if self.dir is None else self.dir / method.slug / f"b{b:04d}.json"
        if path is not None:
            got = read_json(path)  # None when absent or damaged: recomputed
            if got is not None and got.get("rule") == method.rule_id:
                return got, True
        val = compute()
        if path is not None:
            atomic_write_json(path, val)
        return val, False


def batch_seed(seed: int, b: int) -> int:
    """The decoding seed of batch ``b`` of an eval run at ``seed`` (every method of a batch draws from it)."""
    return seed * 100_003 + b


def _batches(problems: list, size: int) -> list[list]:
    return [problems[s:s + size] for s in range(0, len(problems), size)]


def run_eval(pair, cfg: EvalConfig, method_list: list[Method], cache_dir: Path | None = None,
             ablation: bool = True, progress: bool = True) -> dict:
    """Decode every problem with every method (batch-major, see module docstring) and summarise.
    Returns ``{"config", "methods", "records", "seconds", "summary", "ablation"}``."""
    from tqdm.auto import tqdm

    cfg.check()
    if not any(m.key == "sps" for m in method_list) or not any(m.rule is None for m in method_list):
        raise ValueError("methods must include the verifier alone and SpS (the references)")
    problems = tasks.make_problems(cfg.task, cfg.problems, cfg.seed)
    batches = _batches(problems, cfg.batch_size)
    cache = _Cache(cache_dir, cfg)
    recs = {m.label: [] for m in method_list}
    secs = {m.label: [] for m in method_list}
    bar = tqdm(total=len(batches) * len(method_list), desc="eval", disable=not progress)
    for b, batch in enumerate(batches):
        for m in method_list:
            val, hit = cache.get(m, b, lambda m=m, batch=batch, b=b: _batch_record(pair, batch, m, cfg,
                                                                                   batch_seed(cfg.seed, b)))
            recs[m.label] += val["records"]
            secs[m.label].append(_timing(val))
            bar.set_postfix(batch=b, method=m.label[:24], cached=hit)
            bar.update()
    bar.close()
    out = {"config": cfg.as_dict(), "methods": [method_info(m) for m in method_list], "records": recs,
           "seconds": secs}
    out["summary"] = summarise(recs, secs, method_list, seed=cfg.seed)
    if ablation:
        out["ablation"] = run_ablation(pair, cfg, method_list, recs, secs, cache, batches, progress)
    return out


def _timing(batch_value: dict) -> dict:
    return {"seconds": batch_value["seconds"], "tokens": sum(r["new_tokens"] for r in batch_value["records"])}


def method_info(m: Method) -> dict:
    """What a result records of a method: label, registry key, parameters, rule identity, colour (and its tree:
    ``core.tree_shapes.tree_record`` and the scheme; a ``BudgetTree`` as ``{nodes, depth, topk, scheme}``)."""
    out = {"label": m.label, "key": m.key, "params": m.params, "rule": m.rule_id, "colour": m.colour}
    if m.tree is not None:
        out["tree"] = {**tree_record(m.tree), "scheme": "deterministic"}
    return out


# -- the interpolation ablation -------------------------------------------------------------------

def _al(records: list[dict]) -> float:
    """AL of pooled records (``metrics.al_of``, as ``DecodeStats.al``), bonus included."""
    return al_of(sum(r["accepted"] for r in records), sum(r["steps"] for r in records))


def run_ablation(pair, cfg, method_list, recs, secs, cache, batches, progress=True) -> dict:
    """Cactus at the ``delta`` whose AL matches interpolation alpha = 0.9's (see module docstring)."""
    interp = [m for m in method_list if m.key == "interpolation" and m.params.get("alpha") == ABLATION_ALPHA]
    if not interp:
        return {"status": "not run", "reason": f"interpolation alpha={ABLATION_ALPHA} is not among the methods"}
    target = _al(recs[interp[0].label][:len(batches[0])])  # like with like: the probes run on the first batch
    probes: dict[float, float] = {}

    def probe(delta: float) -> float:
        rule = registry.make("cactus", delta=delta)
        m = Method(f"{registry.label(rule)} (ablation)", "cactus", {"delta": delta}, rule, registry.colour("cactus"))
        val, _ = cache.get(m, 0, lambda: _batch_record(pair, batches[0], m, cfg, batch_seed(cfg.seed, 0)))
        probes[delta] = _al(val["records"])
        return probes[delta]

    grid = sorted(m.params["delta"] for m in method_list if m.key == "cactus")
    lo = grid[-1] if grid else 1.0
    hi = None
    while lo < DELTA_MAX:  # x4 ladder from the largest delta of the grid
        d = min(lo * 4, DELTA_MAX)
        if probe(d) >= target:
            hi = d
            break
        lo = d
    if hi is None:
        chosen, status = DELTA_MAX, "unreachable"
    else:
        for _ in range(3):  # bisection in log delta on the first batch
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if probe(mid) < target else (lo, mid)
        chosen, status = hi, "matched"
    rule = registry.make("cactus", delta=chosen)
    m = Method(f"{registry.label(rule)} (ablation)", "cactus", {"delta": chosen}, rule, registry.colour("cactus"))
    from tqdm.auto import tqdm

    from ...theory.stats import paired_difference

    rs, ss = [], []
    for b, batch in enumerate(tqdm(batches, desc=f"ablation delta={chosen:.4g}", disable=not progress)):
        val, _ = cache.get(m, b, lambda b=b, batch=batch: _batch_record(pair, batch, m, cfg, batch_seed(cfg.seed, b)))
        rs += val["records"]
        ss.append(_timing(val))
    ref = [x for x in method_list if x.rule is None or x.key == "sps" or x is interp[0]]
    summ = summarise({**{x.label: recs[x.label] for x in ref}, m.label: rs},
                     {**{x.label: secs[x.label] for x in ref}, m.label: ss}, [*ref, m], seed=cfg.seed)
    diff = paired_difference(np.array([r["correct"] for r in rs]),
                             np.array([r["correct"] for r in recs[interp[0].label]]), seed=cfg.seed)
    return {"status": status, "target_al": _al(recs[interp[0].label]), "target_al_first_batch": target,
            "probes_first_batch": {f"{d:.6g}": a for d, a in sorted(probes.items())}, "delta": chosen,
            "method": method_info(m), "records": rs, "seconds": ss,
            "summary": {m.label: summ[m.label], interp[0].label: summ[interp[0].label]},
            "cactus_minus_interpolation": _paired_dict(diff)}


# -- statistics -----------------------------------------------------------------------------------

def _paired_dict(r) -> dict:
    return {"estimate": r.estimate, "low": r.low, "high": r.high, "pvalue": r.pvalue, "n": r.n,
            "x_only": r.x_only, "y_only": r.y_only}


def _ratio_ci(num: np.ndarray, den: np.ndarray, idx: np.ndarray) -> tuple[float, float, float]:
    """sum(num)/sum(den) and its percentile interval over the resampled index sets ``idx`` (B, N)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        est = num.sum() / den.sum() if den.sum() else math.nan
        boot = num[idx].sum(1) / den[idx].sum(1)
    boot = boot[~np.isnan(boot)]
    if not boot.size:
        return est, math.nan, math.nan
    lo, hi = np.quantile(boot, [0.025, 0.975], method="inverted_cdf")  # order statistics: inf stays inf
    return float(est), float(lo), float(hi)


def summarise(recs: dict[str, list[dict]], secs: dict[str, list[dict]], method_list: list[Method],
              seed: int = 0) -> dict:
    """Per method: the statistics of the module docstring, each as ``[estimate, low, high]``."""
    from ...theory.stats import paired_difference, proportion_interval

    base = next(m for m in method_list if m.rule is None).label
    sps = next(m for m in method_list if m.key == "sps").label
    N = len(recs[sps])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, N, size=(N_BOOT, N))  # one set of resamples: paired across methods
    col = lambda label, c: np.array([float(r[c]) for r in recs[label]])  # noqa: E731
    rej_sps = (col(sps, "drafted") - col(sps, "accepted"), col(sps, "new_tokens"))
    n_b = len(secs[base])
    bidx = rng.integers(0, n_b, size=(N_BOOT, n_b))
    out = {}
    for m in method_list:
        R = recs[m.label]
        if len(R) != N or [r["id"] for r in R] != [r["id"] for r in recs[sps]]:
            raise ValueError(f"method {m.label!r} has records for other problems than SpS")
        correct = col(m.label, "correct")
        ci = proportion_interval(int(correct.sum()), N)
        row = {"problems": N, "accuracy": [ci.estimate, ci.low, ci.high],
               "strict_accuracy": float(col(m.label, "strict").mean()),
               "new_tokens": int(col(m.label, "new_tokens").sum()),
               "seconds": float(sum(b["seconds"] for b in secs[m.label]))}
        d = paired_difference(correct, col(sps, "correct"), seed=seed)
        row["diff_vs_sps"] = _paired_dict(d)
        row["nll"] = list(_ratio_ci(col(m.label, "nll_sum"), col(m.label, "nll_count"), idx))
        if m.rule is not None:
            emitted = col(m.label, "accepted") + col(m.label, "steps")  # DecodeStats.al's numerator
            row["al"] = list(_ratio_ci(emitted, col(m.label, "steps"), idx))
            with np.errstate(invalid="ignore", divide="ignore"):  # AL minus SpS's AL, paired resamples
                al_b = emitted[idx].sum(1) / col(m.label, "steps")[idx].sum(1) - \
                    (col(sps, "accepted") + col(sps, "steps"))[idx].sum(1) / col(sps, "steps")[idx].sum(1)
            al_b = al_b[np.isfinite(al_b)]
            row["al_diff_vs_sps"] = [row["al"][0] - _al(recs[sps]),
                                     *(np.quantile(al_b, [0.025, 0.975]).tolist() if al_b.size else [math.nan] * 2)]
            row["acceptance"] = list(_ratio_ci(col(m.label, "accepted"), col(m.label, "drafted"), idx))
            row["step_kl"] = list(_ratio_ci(col(m.label, "kl_sum"), col(m.label, "kl_count"), idx))
            rej = col(m.label, "drafted") - col(m.label, "accepted")
            row["rejected_per_token"] = float(rej.sum() / col(m.label, "new_tokens").sum())
        if m.rule is not None and m.tree is None:  # Rej: a tree's unvisited nodes are not rejections
            with np.errstate(invalid="ignore", divide="ignore"):
                est = (rej.sum() / col(m.label, "new_tokens").sum()) / (rej_sps[0].sum() / rej_sps[1].sum()) - 1
                boot = (rej[idx].sum(1) / col(m.label, "new_tokens")[idx].sum(1)) / (
                    rej_sps[0][idx].sum(1) / rej_sps[1][idx].sum(1)) - 1
            boot = boot[np.isfinite(boot)]
            row["rej_vs_sps"] = [float(est), *(np.quantile(boot, [0.025, 0.975]).tolist() if boot.size else
                                               [math.nan, math.nan])]
        # speedup: tokens/s over the verifier alone's, pooled over batches; bootstrap over batches
        if len(secs[m.label]) == n_b:
            tok, s = np.array([b["tokens"] for b in secs[m.label]]), np.array([b["seconds"] for b in secs[m.label]])
            tok0, s0 = np.array([b["tokens"] for b in secs[base]]), np.array([b["seconds"] for b in secs[base]])
            with np.errstate(invalid="ignore", divide="ignore"):
                est = (tok.sum() / s.sum()) / (tok0.sum() / s0.sum())
                boot = (tok[bidx].sum(1) / s[bidx].sum(1)) / (tok0[bidx].sum(1) / s0[bidx].sum(1))
            row["tokens_per_s"] = float(tok.sum() / s.sum()) if s.sum() else math.nan
            row["speedup"] = [float(est), *np.quantile(boot, [0.025, 0.975]).tolist()]
        out[m.label] = row
    return out


# -- output ---------------------------------------------------------------------------------------

def _iv(v, digits: int = 2, pct: bool = False) -> str:
    """``[estimate, low, high]`` as ``est [low, high]``; percentages if ``pct``."""
    if v is None or math.isnan(v[0]):
        return "-"  # not computed (e.g. DropMatch's step KL: its law needs the dropout path law)
    f = (lambda x: f"{100 * x:.1f}") if pct else (lambda x: f"{x:.{digits}f}" if math.isfinite(x) else str(x))
    est, lo, hi = (0.0 if abs(x) < 1e-12 else x for x in v)  # no "-0.000" from float round-off
    if not (math.isfinite(lo) and math.isfinite(hi)) and not math.isfinite(est):
        return f(est)
    return f"{f(est)} [{f(lo)}, {f(hi)}]"


# the lossless methods: each emits exactly the verifier's law, so their accuracies differ by noise alone
LOSSLESS = ("verifier alone", "SpS", "SGLang threshold threshold_acc=1")


def _strict_or_none(records: list[dict]) -> np.ndarray | None:
    return np.array([bool(r["strict"]) for r in records]) if records and all("strict" in r for r in records) else None


def lossless_labels(result: dict) -> list[str]:
    """The methods of a saved eval that emit exactly the verifier's law, in table order: ``LOSSLESS``, and SpS on a
    tree (deterministic candidates: lossless by exact law); the pooled lossless reference of ``comparisons``."""
    labels = [m["label"] for m in result["methods"] if m["label"] in result["summary"]]
    return [lab for lab in labels if lab in LOSSLESS or any(
        m["label"] == lab and m.get("key") == "sps" and m.get("tree") for m in result["methods"])]


def comparisons(result: dict) -> dict:
    """The accuracy comparisons against SpS of a saved eval, re-derived from its per-problem records:
    for each metric (``"lenient"``: ``correct``, the extracted answer; ``"strict"``: the integer after
    "answer", GSM8K's strict-match), per method its paired difference vs SpS (estimate, 95% percentile
    bootstrap over problems, McNemar's exact p) and the Holm-adjusted p-value over the declared family:
    every method of the table compared with SpS (the verifier alone included, the ablation row not).
    Also the pooled lossless reference (``LOSSLESS`` and SpS on a tree: every problem-run of the methods that emit the
    verifier's law; interval clustered by problem) and the minimum detectable difference (McNemar,
    alpha 0.05 two-sided, power 0.8) at the discordance rate of the lossless methods against SpS."""
    from ...claims.ledger import holm, mcnemar_mdd
    from ...theory.stats import paired_difference

    labels = [m["label"] for m in result["methods"] if m["label"] in result["summary"]]
    sps = next(m["label"] for m in result["methods"] if m["key"] == "sps")
    recs = result.get("records") or {}
    seed = result["config"].get("seed", 0)
    family = [lab for lab in labels if lab != sps]
    out: dict = {"family": family, "reference": sps, "metrics": {}}
    for metric in ("lenient", "strict"):
        diffs = {}
        for lab in family:
            if metric == "lenient":
                d = dict(result["summary"][lab]["diff_vs_sps"])
            else:
                x, y = _strict_or_none(recs.get(lab, [])), _strict_or_none(recs.get(sps, []))
                if x is None or y is None or x.size != y.size:
                    diffs = {}
                    break
                d = _paired_dict(paired_difference(x, y, seed=seed))
            diffs[lab] = d
        if not diffs:
            continue
        adj = holm([diffs[lab]["pvalue"] for lab in family])
        for lab, a in zip(family, adj, strict=True):
            diffs[lab]["holm"] = a
        n = result["summary"][sps]["problems"]
        lossless_all = lossless_labels(result)
        lossless = [lab for lab in lossless_all if lab != sps]
        disc = [(diffs[lab]["x_only"] + diffs[lab]["y_only"]) / n for lab in lossless]
        entry = {"diffs": diffs, "n": n}
        if disc:
            rate = float(np.mean(disc))
            entry["mdd"] = {"discordance": rate, "from": lossless, "alpha": 0.05, "power": 0.8,
                            "points": mcnemar_mdd(rate, n),
                            "points_holm_first_step": mcnemar_mdd(rate, n, alpha=0.05 / len(family))}
        pool = lossless_all
        key = "correct" if metric == "lenient" else "strict"
        if len(pool) >= 2 and all(len(recs.get(lab, [])) == n for lab in pool):
            from scipy import stats as _st

            per = np.array([[float(r[key]) for r in recs[lab]] for lab in pool]).mean(0)  # per problem
            est = float(per.mean())
            half = float(_st.t.ppf(0.975, n - 1) * per.std(ddof=1) / math.sqrt(n))
            entry["pooled_lossless"] = {"methods": pool, "runs": len(pool) * n, "estimate": est,
                                        "low": est - half, "high": est + half,
                                        "each": {lab: float(np.mean([r[key] for r in recs[lab]])) for lab in pool}}
        out["metrics"][metric] = entry
    return out


def speedup_interval(secs: list[dict], base: list[dict]):
    """Wall-clock speedup over the verifier alone, batch by batch (each batch decoded by both back to back, so
    the machine's load cancels): per batch the log of the tokens/s ratio, and a Student-t interval on their
    mean (n = batches, n - 1 degrees of freedom; a percentile bootstrap over 10 batches is too narrow).
    Returns a ``claims.Interval`` on the log scale: ``exp`` of it is the geometric-mean speedup."""
    from ...claims.ledger import t_interval

    r = [math.log((a["tokens"] / a["seconds"]) / (b["tokens"] / b["seconds"])) for a, b in zip(secs, base, strict=True)]
    return t_interval(r)


def _speedup_cell(result: dict, label: str, r: dict) -> str:
    secs = dict(result.get("seconds") or {})
    ab = result.get("ablation") or {}
    if ab.get("seconds") and ab.get("method", {}).get("label") == label:
        secs[label] = ab["seconds"]
    base = next(m["label"] for m in result["methods"] if m["key"] is None)
    if label in secs and base in secs and len(secs[label]) == len(secs[base]) >= 2:
        if label == base:
            return "1.00"
        iv = speedup_interval(secs[label], secs[base])
        return f"{math.exp(iv.estimate):.2f} [{math.exp(iv.lo):.2f}, {math.exp(iv.hi):.2f}]"
    return _iv(r.get("speedup"))


def _diff_cell(d: dict) -> str:
    return (f"{100 * d['estimate']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] "
            f"(p={d['pvalue']:.2g}; Holm {d['holm']:.2g})")


def stale_methods(result: dict) -> dict[str, tuple[str, str]]:
    """``{label: (measured identity, current identity)}`` for the methods of a saved result whose rule was
    measured under an earlier definition of its law (``Rule.revision``)."""
    out = {}
    for m in result["methods"]:
        if m.get("key") is None or "rule" not in m:  # the verifier alone; a result that records no rule
            continue
        now = _build(m["key"], m.get("params", {})).identity
        if m.get("tree"):  # a tree row: its id also names the tree (Method.rule_id), rebuilt from its record
            now = f"{now}|{tree_from_record(m['tree'])!r}|{m['tree']['scheme']}"
        if m["rule"] != now:
            out[m["label"]] = (m["rule"], now)
    return out


def format_table(result: dict) -> str:
    """Markdown: one row per method (ablation row last), then the pooled lossless reference row, then a
    note on the comparisons' family and the minimum detectable difference (``comparisons``). Cells:
    accuracy (%) [95% CI]; accuracy minus SpS (points) [95% CI], McNemar p and its Holm-adjusted value
    over the family; the same for strict-match; AL (bonus included); per-token acceptance; Rej vs SpS;
    mean exact step KL(h_alg || q) (nats); verifier NLL (nats/token); speedup over the verifier alone."""
    order = [m["label"] for m in result["methods"] if m["label"] in result["summary"]]
    rows = {lab: result["summary"][lab] for lab in order}  # the methods' order (a saved JSON's keys are sorted)
    ab = result.get("ablation") or {}
    if ab.get("status") in ("matched", "unreachable"):
        lab = ab["method"]["label"]
        rows[lab] = dict(ab["summary"][lab])
        rows[lab]["diff_vs_sps"] = None
    comp = comparisons(result)
    sps = comp["reference"]
    strict = comp["metrics"].get("strict")
    lenient = comp["metrics"]["lenient"]
    stale = stale_methods(result)
    lines = ["| method | accuracy % | vs SpS (points) | strict-match % | strict vs SpS (points) | AL | acceptance | "
             "Rej vs SpS | step KL | NLL | speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        if label == sps:
            dd = sd = "ref"
        elif label in lenient["diffs"]:
            dd = _diff_cell(lenient["diffs"][label])
            sd = _diff_cell(strict["diffs"][label]) if strict else "-"
        else:
            dd = sd = "-"
        rej = r.get("rej_vs_sps")
        rej_s = "-" if rej is None else ("ref" if dd == "ref" else
                                         f"{100 * rej[0]:+.0f}% [{100 * rej[1]:+.0f}, {100 * rej[2]:+.0f}]")
        sa = r.get("strict_accuracy")
        sa_s = "-" if sa is None else f"{100 * sa:.1f}"
        lines.append(f"| {label}{' (earlier definition)' if label in stale else ''} | {_iv(r['accuracy'], pct=True)} | {dd} | {sa_s} | {sd} | {_iv(r.get('al'))} | "
                     f"{_iv(r.get('acceptance'))} | {rej_s} | {_iv(r.get('step_kl'), 3)} | {_iv(r['nll'])} | "
                     f"{_speedup_cell(result, label, r)} |")
    pl = lenient.get("pooled_lossless")
    if pl is not None:
        ps = (strict or {}).get("pooled_lossless")
        pcell = lambda e: f"{100 * e['estimate']:.1f} [{100 * e['low']:.1f}, {100 * e['high']:.1f}]"  # noqa: E731
        lines.append(f"| pooled lossless ({' + '.join(pl['methods'])}; {pl['runs']} problem-runs) | {pcell(pl)} | - | "
                     f"{pcell(ps) if ps else '-'} | - | - | - | - | - | - | - |")
    notes = [f"Family of the p-values: the {len(comp['family'])} comparisons against SpS above "
             f"({', '.join(comp['family'])}); Holm's step-down adjustment over that family, per metric. "
             "Accuracy = the extracted answer (the last \"answer\", else \"=\", else last integer); strict-match = "
             "the integer after the last \"answer\" only."]
    for label, (then, now) in stale.items():
        notes.append(f"{label} (earlier definition): measured with {then}, whose law differs from the current rule's "
                     f"({now}); its row is kept as measured, and `cactus-theory eval` recomputes it (its cached "
                     "batches key on the rule's identity).")
    if pl is not None:
        notes.append("Pooled lossless: every method that emits exactly the verifier's law, pooled per problem "
                     "(95% t-interval over problems, so the runs sharing a problem count once); each alone: "
                     + ", ".join(f"{lab} {100 * v:.1f}" for lab, v in pl["each"].items()) + ".")
    for metric, e in comp["metrics"].items():
        if "mdd" in e:
            m = e["mdd"]
            notes.append(f"Minimum detectable difference ({metric}; {e['n']} problems, paired, McNemar, alpha 0.05 "
                         f"two-sided, power 0.8): {100 * m['points']:.1f} points at the discordance rate "
                         f"{m['discordance']:.3f} of {' and '.join(m['from'])} against SpS "
                         f"({100 * m['points_holm_first_step']:.1f} points at Holm's first step, alpha 0.05 / "
                         f"{len(comp['family'])}).")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def plot_accuracy_vs_al(result: dict, path_stem: str | Path | None = None):
    """Accuracy (%) against AL with 95% intervals on both axes, one colour per rule (the registry's),
    the verifier alone as a horizontal band at AL = 1; returns the figure (saved as png + svg if
    ``path_stem``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    info = {m["label"]: m for m in result["methods"]}
    order = [m["label"] for m in result["methods"] if m["label"] in result["summary"]]
    rows = {lab: result["summary"][lab] for lab in order}  # the methods' order (a saved JSON's keys are sorted)
    ab = result.get("ablation") or {}
    if ab.get("status") in ("matched", "unreachable"):
        rows[ab["method"]["label"]] = ab["summary"][ab["method"]["label"]]
        info[ab["method"]["label"]] = ab["method"]
    for label, r in rows.items():
        acc = [100 * x for x in r["accuracy"]]
        if "al" not in r:
            ax.axhspan(acc[1], acc[2], color="0.85", zorder=0)
            ax.axhline(acc[0], color="0.3", lw=1, ls=":", label=f"{label} (AL 1 by definition)")
            continue
        al, key = r["al"], info[label]["key"]
        ax.errorbar(al[0], acc[0], xerr=[[al[0] - al[1]], [al[2] - al[0]]], yerr=[[acc[0] - acc[1]], [acc[2] - acc[0]]],
                    fmt=registry.marker(key), color=info[label]["colour"], capsize=3, label=label,
                    mfc="none" if "ablation" in label else info[label]["colour"])
        if " " in label:  # one colour per rule family: the parameter tells the family's points apart
            ax.annotate(label.split(" ", 1)[1], (al[0], acc[0]), textcoords="offset points", xytext=(4, 4), fontsize=6)
    ax.set_xlabel("AL: tokens emitted per verifier call (bonus included)")
    ax.set_ylabel("accuracy (%), 95% Wilson interval")
    c = result["config"]
    ax.set_title(f"{c['task']}: {c['problems']} problems, k = {c['k']}, {c['pair']}", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    if path_stem is not None:
        save_figure(fig, path_stem)
    return fig


def slim(result: dict) -> dict:
    """The result without the per-problem texts (what is committed; the cache keeps the texts)."""
    out = {k: v for k, v in result.items() if k not in ("records",)}
    out["records"] = {m: [{k: v for k, v in r.items() if k != "text"} for r in rs] for m, rs in result["records"].items()}
    if isinstance(out.get("ablation"), dict) and "records" in out["ablation"]:
        out["ablation"] = {**out["ablation"], "records": [{k: v for k, v in r.items() if k != "text"}
                                                          for r in out["ablation"]["records"]]}
    return out


# -- command --------------------------------------------------------------------------------------

DEFAULT_OUT = Path("paper_repro/results/eval")


def eval_trees(args) -> list:
    """The ``BudgetTree`` of each ``--tree NODES`` (``ValueError`` naming the flag); torch-free, as every
    check the CLI runs before ``run`` (``theory.stats`` too is imported where used: `eval --rules bogus`
    refuses before scipy or torch loads)."""
    from ...core.tree_shapes import flag_tree

    trees = []
    for n in getattr(args, "tree", None) or []:
        for flag, v in (("--tree", n), ("--tree-depth", args.tree_depth), ("--tree-topk", args.tree_topk)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{flag} must be an integer >= 1, got {v!r}")
        shape = f"--tree {n} --tree-depth {args.tree_depth} --tree-topk {args.tree_topk}"
        trees.append(flag_tree("budget", (n, args.tree_depth, args.tree_topk), shape))  # as decode's: capped
    return trees


def pair_id(draft: str, verifier: str, draft_path: str | None = None) -> str:
    """A name for the pair that changes when the embedded draft's build changes (cache keys): the draft
    file's name, which encodes its build config and its verifier (``pair.embedded_draft_path``: for
    another verifier than the default one its depth is read from its config, no weights), and the
    verifier argument, so the caches of two verifiers never mix. It does not depend on whether the file
    exists here, so a fresh clone finds the committed results under the same name."""
    if draft != "embedded":
        return f"{draft}->{verifier}"
    if draft_path is None:
        from ..draft_config import DEFAULT_VERIFIER, DraftConfig
        from ..draft_config import draft_path as default_path

        if verifier == DEFAULT_VERIFIER:  # named without torch or a model file (a check before any load)
            draft_path = default_path(DraftConfig(), verifier)
        else:
            from ..pair import embedded_draft_path

            draft_path = embedded_draft_path(verifier)
    return f"embedded:{os.path.basename(draft_path)}->{verifier}"


def load_eval_pair(draft: str, verifier: str, draft_path: str | None = None, dtype: str = "float32",
                   lean: bool = True):
    """``pair.load_pair``: with ``draft_path``, the embedded draft from that file (a checkpoint of another
    build) for ``verifier``; ``dtype`` a torch dtype's name, ``lean`` the lean CPU step (``ModelPair.lean``)."""
    import torch

    from ..pair import load_pair

    return load_pair(draft, verifier, dtype=getattr(torch, dtype), draft_path=draft_path, lean=lean)


def evaluate(pair, cfg: EvalConfig, out_dir: Path, cache_dir: Path | None = None, only: list[str] | None = None,
             ablation: bool = True, lawtests: dict | None = None, progress: bool = True, trees=()) -> dict:
    """Run everything and write ``eval.json`` (without texts), ``eval.md`` and ``fig_eval_accuracy_al``;
    ``trees``: trees (any ``core.tree_shapes`` kind) whose tree rows join the table (``methods``)."""
    out_dir = Path(out_dir)
    cache_dir = out_dir / "cache" if cache_dir is None else Path(cache_dir)
    t0 = time.perf_counter()
    ml = methods(only=only, trees=trees)
    res = run_eval(pair, cfg, ml, cache_dir, ablation=ablation, progress=progress)
    if lawtests is not None:
        from .lawtests import run_lawtests

        res["lawtests"] = run_lawtests(pair, ml, tasks.make_problems(cfg.task, lawtests["prompts"], cfg.seed + 1),
                                       draws=lawtests["draws"], loop_draws=lawtests["loop_draws"], k=cfg.k,
                                       sampling=cfg.sampling, seed=cfg.seed, progress=progress)
    res["wall_seconds"] = time.perf_counter() - t0
    res["pair_name"] = getattr(pair, "name", "pair")
    atomic_write_json(out_dir / "eval.json", slim(res))
    atomic_write_text(out_dir / "eval.md", format_table(res) + "\n")
    import matplotlib.pyplot as plt

    plt.close(plot_accuracy_vs_al(res, out_dir / "fig_eval_accuracy_al"))
    return res


def save_figure(fig, path_stem) -> None:
    """``fig`` as ``<path_stem>.png`` and ``.svg``, byte-stable (no software / date stamps, a fixed SVG hash salt),
    each written atomically; the folder is made if missing."""
    import matplotlib.pyplot as plt

    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    for ext, kw in (("png", {"dpi": 110, "metadata": {"Software": None}}), ("svg", {"metadata": {"Date": None}})):
        with atomic_path(stem.with_suffix(f".{ext}")) as tmp, \
                plt.rc_context({"svg.hashsalt": "cactus-theory", "svg.fonttype": "none"}):
            fig.savefig(tmp, bbox_inches="tight", **kw)
