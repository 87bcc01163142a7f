"""A slice of the pre-registered eval decoded by both engines (``make vllm-eval-slice``): the project's loop and vLLM
with the plugin (``cactus-theory eval --engine vllm``), the same protocol file, questions, replicates, row seeds
and record format; written to ``benchmarks/results/vllm_cpu/eval_slice.json``.

    OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/vllm_eval_slice.py [--questions 16]

The slice: a copy of ``paper_repro/protocols/eval_v3.json`` (so nothing is written beside the committed protocol or
its shards), its first ``--questions`` distinct questions of ``add_wide``, 2 replicates, the verifier alone, SpS
and Cactus delta = 1 (``--rules``); every other setting the protocol's (k = 4, 128 new tokens, the paper's sampling,
bfloat16). Both runs are deviations from the protocol (recorded as such in their eval.json) and write only under
``--work``.

What the JSON holds: each engine's per-method accuracy (lenient and strict, 95% t-interval over questions), AL,
acceptance, NLL per token and mean new tokens, from its eval.json; the record format of each engine (every record's
keys and value types) and whether they agree; the verifier-alone comparison (per question the mean of its
replicates, vLLM minus loop, 95% t-interval over questions; the two engines share the model, dtype, prompts and
sampling, not their random streams: a difference is reported, not hidden); each row's outcome per engine (so every
number can be recomputed); wall seconds of each run and the versions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "vllm_cpu" / "eval_slice.json"
RULES = "Cactus delta=1"


def run_engine(engine: str, protocol: Path, out: Path, questions: int, replicates: int, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "cactus_theory.cli", "eval", "--protocol", str(protocol), "--engine", engine,
           "--tasks", "add_wide", "--questions", str(questions), "--replicates", str(replicates), "--rules", RULES,
           "--out", str(out), "--no-progress", *extra]
    print("$", " ".join(cmd), flush=True)
    t = time.time()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return time.time() - t


def records(out: Path) -> dict[str, list[dict]]:
    """Every cached batch's records per method label (the eval's cache keeps texts and token ids)."""
    saved = json.loads((out / "eval.json").read_text())
    label_of = {m["rule"]: m["label"] for m in saved["methods"]}
    key_dir = next(p for p in (out / "cache").iterdir() if p.is_dir())
    recs: dict[str, list[dict]] = {}
    for folder in sorted((key_dir / "add_wide").iterdir()):
        batches = [json.loads(f.read_text()) for f in sorted(folder.glob("b*.json"))]
        if batches:
            recs[label_of[batches[0]["rule"]]] = [r for b in batches for r in b["records"]]
    return recs


def t_interval(x: list[float]) -> list[float]:
    from scipy import stats

    n = len(x)
    m = sum(x) / n
    if n < 2:
        return [m, math.nan, math.nan]
    sd = math.sqrt(sum((v - m) ** 2 for v in x) / (n - 1))
    h = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return [m, m - h, m + h]


def summary(saved: dict) -> dict:
    task = saved["summary"]["tasks"]["add_wide"]
    out = {}
    for lab, row in task["methods"].items():
        out[lab] = {"accuracy": task["metrics"]["lenient"]["methods"][lab]["accuracy"],
                    "strict": task["metrics"]["strict"]["methods"][lab]["accuracy"],
                    "al": row.get("al"), "acceptance": row.get("acceptance"), "nll_per_token": row.get("nll"),
                    "new_tokens": row["new_tokens"]}
    return out


def record_format(recs: dict[str, list[dict]]) -> dict:
    """Per record field, the set of value types seen (``pred`` may be None where no integer was found)."""
    kinds: dict[str, set] = {}
    for rows in recs.values():
        for r in rows:
            for k, v in r.items():
                kinds.setdefault(k, set()).add(type(v).__name__)
    return {k: sorted(v) for k, v in sorted(kinds.items())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", type=int, default=16)
    p.add_argument("--replicates", type=int, default=2)
    p.add_argument("--work", default=str(ROOT / "build" / "vllm_eval_slice"))
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)
    work = Path(a.work)  # a rerun resumes from the runs' caches there (the eval's own resuming)
    (work / "protocols").mkdir(parents=True, exist_ok=True)
    protocol = work / "protocols" / "eval_v3.json"
    shutil.copyfile(ROOT / "paper_repro" / "protocols" / "eval_v3.json", protocol)
    secs = {"loop": run_engine("loop", protocol, work / "loop", a.questions, a.replicates, ["--threads", "1"]),
            "vllm": run_engine("vllm", protocol, work / "vllm", a.questions, a.replicates, [])}
    saved = {e: json.loads((work / e / "eval.json").read_text()) for e in secs}
    recs = {e: records(work / e) for e in secs}
    fmt = {e: record_format(recs[e]) for e in secs}
    loop_fields = {k: set(v) for k, v in fmt["loop"].items()}
    vllm_fields = {k: set(v) for k, v in fmt["vllm"].items()}
    same = set(loop_fields) == set(vllm_fields) and all(
        (loop_fields[k] | vllm_fields[k]) <= ({"int", "NoneType"} if k == "pred" else loop_fields[k] | vllm_fields[k])
        and (k == "pred" or loop_fields[k] == vllm_fields[k]) for k in loop_fields)
    # the verifier alone: per question the mean of its replicates, vLLM minus loop
    base = "verifier alone"
    per_q = {e: {} for e in secs}
    for e in secs:
        for r in recs[e][base]:
            per_q[e].setdefault(r["q"], []).append(float(r["correct"]))
    qs = sorted(per_q["loop"])
    diff = [sum(per_q["vllm"][q]) / len(per_q["vllm"][q]) - sum(per_q["loop"][q]) / len(per_q["loop"][q]) for q in qs]
    import torch
    import vllm

    from cactus_theory.lm.roofline import cpu_model

    res = {
        "what": "a slice of eval_v3 decoded by the project's loop and by vLLM with the plugin (cactus-theory eval "
                "--engine vllm): the same protocol file (a copy), questions, replicates, row seeds and record format",
        "command": "make vllm-eval-slice (benchmarks/vllm_eval_slice.py)",
        "slice": {"task": "add_wide", "questions": a.questions, "replicates": a.replicates,
                  "methods": list(summary(saved["loop"])), "protocol": "paper_repro/protocols/eval_v3.json (copied)",
                  "deviations": saved["vllm"]["protocol"]["deviations"]},
        "config": {e: saved[e]["config"] for e in secs},
        "engine": saved["vllm"].get("engine"),
        "summary": {e: summary(saved[e]) for e in secs},
        "record_format": {**fmt, "same": bool(same)},
        "verifier_alone": {"loop": t_interval([sum(v) / len(v) for _, v in sorted(per_q["loop"].items())]),
                           "vllm": t_interval([sum(v) / len(v) for _, v in sorted(per_q["vllm"].items())]),
                           "vllm_minus_loop": t_interval(diff), "questions": len(qs),
                           "interval": "95% t-interval over questions of the per-question mean over replicates"},
        "rows": {e: {lab: [[r["q"], r["r"], r["seed"], int(bool(r["correct"])), r["new_tokens"], r["steps"],
                            r["accepted"], r["drafted"]] for r in sorted(rows, key=lambda r: (r["q"], r["r"]))]
                     for lab, rows in recs[e].items()} for e in secs},
        "rows_fields": ["q", "r", "row seed", "correct", "new_tokens", "steps", "accepted", "drafted"],
        "seconds": secs,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "vllm": vllm.__version__,
                    "note": "wall seconds on a shared 2-core machine: not a timing result"},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({"verifier_alone": res["verifier_alone"], "same_format": res["record_format"]["same"]}, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
