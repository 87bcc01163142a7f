"""``cactus-theory eval --engine vllm`` on vLLM's CPU build (``make test-vllm``; the name keeps it out of ``make
test``, whose environment has no vLLM).

* the committed slice (benchmarks/results/vllm_cpu/eval_slice.json, ``make vllm-eval-slice``): both engines'
  records have the fields and types of the committed primary run's shards (the loop's format, an independent
  reference), vLLM's counters obey the counting rules (the verifier alone: one step per token after the first, no
  drafts; speculative rows: at most k drafts a step, accepted <= drafted, new tokens at most 1 + (k + 1) steps), and
  the verifier-alone comparison it reports is recomputed from its rows;
* a fresh run of two questions x two replicates (the protocol copied into a temporary folder): the records' format,
  the plugin's rule on the worker for every method (the run refuses otherwise), and the verifier alone's rows
  reproduced from their seeds by a second run (vLLM's plain decoding draws from each request's seeded generator);
* a rule the engine cannot apply (the sweep's Medusa, DropMatch, sequence budget and tree rows) refused before any engine
  starts.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scipy import stats

pytest.importorskip("vllm")  # run by `make test-vllm` inside the vLLM environment only

ROOT = Path(__file__).resolve().parents[2]
SLICE = ROOT / "benchmarks" / "results" / "vllm_cpu" / "eval_slice.json"
SHARDS = ROOT / "paper_repro" / "results" / "eval_v3" / "shards"
K = 4


def _loop_fields() -> dict[str, str]:
    """Field -> type of a record of the committed primary run (the loop's)."""
    f = sorted(SHARDS.glob("*/primary/*/c*.json.gz"))[0]
    with gzip.open(f, "rt") as fh:
        sh = json.load(fh)
    rec = next(r for m in sh["methods"].values() for b in m["batches"].values() for r in b["records"]
               if r["pred"] is not None)
    return {k: type(v).__name__ for k, v in rec.items()}


def _same_format(rec: dict, ref: dict[str, str]) -> bool:
    return set(rec) - {"tokens"} == set(ref) and all(
        (type(rec[k]).__name__ == t) or (k == "pred" and rec[k] is None) for k, t in ref.items())


def _counting_rules(label: str, new_tokens: int, steps: int, accepted: int, drafted: int) -> None:
    if label == "verifier alone":
        assert (steps, accepted, drafted) == (max(0, new_tokens - 1), 0, 0)
    else:
        assert 0 <= accepted <= drafted <= K * steps and new_tokens <= 1 + (K + 1) * steps


def test_the_committed_slice():
    assert SLICE.exists(), "run `make vllm-eval-slice` (benchmarks/vllm_eval_slice.py) first"
    res = json.loads(SLICE.read_text())
    ref = _loop_fields()
    assert res["record_format"]["same"]
    for engine in ("loop", "vllm"):
        fmt = res["record_format"][engine]
        assert set(fmt) - {"tokens"} == set(ref)
        assert all(ref[k] in v for k, v in fmt.items() if k in ref)
    assert res["config"]["vllm"]["engine"].startswith("vllm/") and "engine" not in res["config"]["loop"]
    for label, rows in res["rows"]["vllm"].items():
        for _q, _r, _seed, _ok, new, steps, acc, drafted in rows:
            _counting_rules(label, new, steps, acc, drafted)
    # the verifier alone's comparison, recomputed from the rows
    per_q = {}
    for engine in ("loop", "vllm"):
        for q, _r, _s, ok, *_ in res["rows"][engine]["verifier alone"]:
            per_q.setdefault(q, {}).setdefault(engine, []).append(ok)
    d = [sum(v["vllm"]) / len(v["vllm"]) - sum(v["loop"]) / len(v["loop"]) for _, v in sorted(per_q.items())]
    n, m = len(d), sum(d) / len(d)
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
    h = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    assert res["verifier_alone"]["vllm_minus_loop"] == pytest.approx([m, m - h, m + h])
    # the same rows (questions, replicates, row seeds) under both engines
    for label in res["rows"]["loop"]:
        assert [r[:3] for r in res["rows"]["loop"][label]] == [r[:3] for r in res["rows"]["vllm"][label]]


def test_vllm_sees_the_loops_prompt_tokens():
    """The exported verifier folder's tokenizer wraps and encodes the protocol's questions into the loop's ids."""
    from transformers import AutoTokenizer

    from cactus_theory.integrations.engines import vllm_verifier_dir
    from cactus_theory.lm.data import encode_prompts
    from cactus_theory.lm.experiments import tasks
    from cactus_theory.lm.pair import load_model

    _, loop_tok = load_model("smollm2")
    vllm_tok = AutoTokenizer.from_pretrained(vllm_verifier_dir("smollm2"))
    qs = [p.question for t in ("add_wide", "lookup") for p in tasks.distinct_problems(t, 16, 0)]
    assert encode_prompts(vllm_tok, qs) == encode_prompts(loop_tok, qs)


def _eval(work: Path, out: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "cactus_theory.cli", "eval", "--protocol", str(work / "protocols" / "eval_v3.json"),
           "--engine", "vllm", "--out", str(work / out), "--no-progress", *extra]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    w = tmp_path_factory.mktemp("vllm_eval")
    (w / "protocols").mkdir()
    shutil.copyfile(ROOT / "paper_repro" / "protocols" / "eval_v3.json", w / "protocols" / "eval_v3.json")
    return w


def test_rules_the_engine_cannot_apply_are_refused_before_any_engine_starts(work):
    t = time.time()
    r = _eval(work, "sweep", "--sweep")
    assert r.returncode == 2 and "--engine vllm cannot apply" in r.stderr, r.stderr
    for label in ("Medusa typical", "DropMatch", "sequence budget", "EAGLE-2 tree 8/4/2"):
        assert label in r.stderr, r.stderr
    assert "Initializing" not in r.stderr and time.time() - t < 600  # no engine started


def test_a_fresh_slice_and_its_verifier_alone_rows_reproduced(work):
    slice_args = ("--tasks", "add_wide", "--questions", "2", "--replicates", "2", "--max-new-tokens", "24",
                  "--rules", "Cactus delta=1")
    r = _eval(work, "a", *slice_args)
    assert r.returncode == 0, r.stderr[-4000:]
    saved = json.loads((work / "a" / "eval.json").read_text())
    assert saved["config"]["engine"] == "vllm/eagle3" and "mod 2**32" in saved["engine"]["seed_map"]
    ref = _loop_fields()
    cache = next((work / "a" / "cache").iterdir())
    batches = {f.parent.name: json.loads(f.read_text()) for f in cache.glob("add_wide/*/b00000.json")}
    assert len(batches) == 3
    label_of = {m["rule"]: m["label"] for m in saved["methods"]}
    for b in batches.values():
        for rec in b["records"]:
            assert _same_format(rec, ref), rec
            _counting_rules(label_of[b["rule"]], rec["new_tokens"], rec["steps"], rec["accepted"], rec["drafted"])
            assert rec["nll_count"] == rec["new_tokens"] and rec["kl_count"] == 0
    # a second run: the verifier alone's rows again, from their seeds (plain vLLM sampling is seeded per request)
    r2 = _eval(work, "b", *slice_args)
    assert r2.returncode == 0, r2.stderr[-4000:]
    cache2 = next((work / "b" / "cache").iterdir())
    base = next(m for m in saved["methods"] if m["key"] is None)
    one = next(b for b in batches.values() if b["rule"] == base["rule"])
    two = next(json.loads(f.read_text()) for f in cache2.glob("add_wide/*/b00000.json")
               if json.loads(f.read_text())["rule"] == base["rule"])
    assert [r["tokens"] for r in one["records"]] == [r["tokens"] for r in two["records"]]
    assert len({tuple(r["tokens"]) for r in one["records"]}) > 1  # different rows, different draws
