"""The eval's questions as an lm-eval task (lm-eval 0.4.x's custom YAML task over a local file; no hub access).

``write_task(folder, task, questions)`` writes three files into ``folder``, which lm-eval reads with
``--include_path folder``:

* ``<name>.jsonl``: the protocol's questions (``tasks.distinct_problems(task, questions, seed)``: the first
  ``questions`` distinct questions, the eval's own list), one ``{"id", "question", "answer"}`` per line;
* ``<name>.yaml``: a ``generate_until`` task over that file (``dataset_path: json``, ``data_files``), the question
  as the prompt (use lm-eval's ``--apply_chat_template``: the eval wraps each question as a user turn), the
  protocol's sampling (``do_sample``, temperature, top-k, top-p) and ``max_gen_toks``; without sampling vLLM
  decodes greedily and the plugin keeps vLLM's exact argmax matching, so no rule would act;
* ``<name>_utils.py``: the scoring, ``process_results`` with the eval's own ``tasks.extract_answer`` (lenient,
  the protocol's primary metric) and ``tasks.strict_answer`` (strict), so lm-eval's accuracy is the eval's.

For GSM8K, GPQA or IFEval the same recipe runs lm-eval's own task YAMLs over the user's copy of the data
(docs/vllm.md#lm-eval).

    python -m cactus_theory.lm.experiments.lm_eval_task FOLDER [--task add_wide] [--questions 32] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ...core.sampling import SAMPLING
from ...util.atomic import atomic_write_text
from . import tasks

__all__ = ["write_task", "task_name", "main"]

_UTILS = '''"""Scoring of the cactus-theory eval's questions (written by cactus_theory.lm.experiments.lm_eval_task)."""

from cactus_theory.lm.experiments.tasks import extract_answer, strict_answer


def process_results(doc, results):
    text = results[0]
    return {"lenient": float(extract_answer(text) == int(doc["answer"])),
            "strict": float(strict_answer(text) == int(doc["answer"]))}
'''


def task_name(task: str) -> str:
    return f"cactus_{task}"


def write_task(folder: str | Path, task: str = "add_wide", questions: int = 32, seed: int = 0,
               max_gen_toks: int = 128, sampling: dict | None = None) -> str:
    """Write the task's data, YAML and scoring into ``folder`` (see the module docstring); returns its lm-eval task
    name (``cactus_<task>``). ``ValueError`` naming the argument for an unknown task or a bad count."""
    if task not in tasks.TASKS:
        raise ValueError(f"task must be one of {sorted(tasks.TASKS)}, got {task!r}")
    for name, v in (("questions", questions), ("max_gen_toks", max_gen_toks)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    s = dict(SAMPLING.as_dict() if sampling is None else sampling)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = task_name(task)
    probs = tasks.distinct_problems(task, questions, seed)
    data = folder / f"{name}.jsonl"
    atomic_write_text(data, "".join(json.dumps({"id": p.id, "question": p.question, "answer": p.answer}) + "\n"
                                    for p in probs))
    atomic_write_text(folder / f"{name}_utils.py", _UTILS)
    gen = {"until": [], "do_sample": True, "temperature": s["temperature"], "max_gen_toks": max_gen_toks}
    if s.get("top_k"):
        gen["top_k"] = s["top_k"]
    if s.get("top_p", 1.0) < 1.0:
        gen["top_p"] = s["top_p"]
    yaml = "\n".join([
        f"# the first {questions} distinct questions of the cactus-theory eval's task {task!r} (seed {seed}), scored",
        "# as the eval scores them; written by cactus_theory.lm.experiments.lm_eval_task",
        f"task: {name}",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        f"    test: {json.dumps(str(data.resolve()))}",
        "test_split: test",
        "output_type: generate_until",
        'doc_to_text: "{{question}}"',
        'doc_to_target: "{{answer}}"',
        f"generation_kwargs: {json.dumps(gen)}",
        f"process_results: !function {name}_utils.process_results",
        "metric_list:",
        "  - metric: lenient",
        "    aggregation: mean",
        "    higher_is_better: true",
        "  - metric: strict",
        "    aggregation: mean",
        "    higher_is_better: true",
        "metadata:",
        "  version: 1.0",
        "",
    ])
    atomic_write_text(folder / f"{name}.yaml", yaml)
    return name


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cactus_theory.lm.experiments.lm_eval_task",
                                description="write the eval's questions as an lm-eval task folder (--include_path)")
    p.add_argument("folder")
    p.add_argument("--task", default="add_wide", choices=sorted(tasks.TASKS))
    p.add_argument("--questions", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-gen-toks", type=int, default=128)
    a = p.parse_args(argv)
    try:
        print(write_task(a.folder, a.task, a.questions, a.seed, a.max_gen_toks))
    except ValueError as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
