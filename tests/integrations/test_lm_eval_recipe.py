"""The lm-eval recipe's parts that need neither lm-eval nor vLLM (the live run: tests/integrations/lmeval_cpu_checks.py,
``make test-lmeval``): the flat model arguments to vLLM's dicts, and the task folder built from the eval's questions,
scored by the eval's own extraction."""

from __future__ import annotations

import importlib.util
import json

import pytest

import cactus_theory as ct
from cactus_theory.integrations.lm_eval import speculative_model_args
from cactus_theory.integrations.vllm import rule_from_spec
from cactus_theory.lm.experiments import tasks
from cactus_theory.lm.experiments.lm_eval_task import write_task


def test_flat_model_args_become_vllms_speculative_and_plugin_configs():
    out = speculative_model_args({"draft": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 3, "cactus_rule": "cactus",
                                  "cactus_delta": 1.0, "dtype": "bfloat16", "data_parallel_size": 2})
    assert out["speculative_config"] == {"method": "draft_model", "model": "Qwen/Qwen3-0.6B",
                                         "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}
    assert rule_from_spec(out["additional_config"]["cactus_theory"]) == ct.Cactus(delta=1.0)
    assert {k: out[k] for k in ("dtype", "data_parallel_size")} == {"dtype": "bfloat16", "data_parallel_size": 2}
    assert not any(k.startswith("cactus_") or k in ("draft", "num_speculative_tokens") for k in out)
    tas = speculative_model_args({"draft": "d", "cactus_rule": "tas", "cactus_epsilon": 0.09, "cactus_alpha": 0.3})
    assert rule_from_spec(tas["additional_config"]["cactus_theory"]) == ct.TAS(epsilon=0.09, alpha=0.3)
    plain = speculative_model_args({"draft": "d"})  # no rule here: the environment's, or vLLM's own
    assert "additional_config" not in plain and plain["speculative_config"]["num_speculative_tokens"] == 4


@pytest.mark.parametrize("args, msg", [
    ({}, "draft must name the draft model"),
    ({"draft": "d", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
    ({"draft": "d", "cactus_rule": "nope"}, "rule must be one of"),
    ({"draft": "d", "cactus_rule": "cactus", "cactus_budget": 1}, "has no parameter 'budget'"),
    ({"draft": "d", "cactus_delta": 1.0}, "cactus_delta need cactus_rule"),
    ({"draft": "d", "speculative_config": {}}, "speculative_config: built from"),
    ({"draft": "d", "draft_method": "medusa"}, "--vllm-draft-method must be"),
])
def test_bad_model_args_are_refused_by_name(args, msg):
    with pytest.raises(ValueError, match=msg):
        speculative_model_args(args)


def test_the_task_folder_holds_the_eval_questions_scored_as_the_eval_scores(tmp_path):
    name = write_task(tmp_path, "add_wide", questions=5, seed=0)
    rows = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    probs = tasks.distinct_problems("add_wide", 5, 0)
    assert [(r["question"], r["answer"]) for r in rows] == [(p.question, p.answer) for p in probs]
    yaml = (tmp_path / f"{name}.yaml").read_text()
    assert f"task: {name}" in yaml and "dataset_path: json" in yaml and str(tmp_path / f"{name}.jsonl") in yaml
    gen = json.loads(next(line for line in yaml.splitlines() if line.startswith("generation_kwargs:")).split(": ", 1)[1])
    assert gen == {"until": [], "do_sample": True, "temperature": 0.6, "max_gen_toks": 128, "top_k": 20, "top_p": 0.95}
    spec = importlib.util.spec_from_file_location("u", tmp_path / f"{name}_utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    doc = rows[0]
    right, loose = f"So the answer is {doc['answer']}.", f"{doc['answer'] + 1} or... = {doc['answer']}"
    assert utils.process_results(doc, [right]) == {"lenient": 1.0, "strict": 1.0}
    assert utils.process_results(doc, [loose]) == {"lenient": 1.0, "strict": 0.0}  # the "=" form: lenient only
    assert utils.process_results(doc, ["no idea"]) == {"lenient": 0.0, "strict": 0.0}
    for bad, msg in ((dict(task="gsm8k"), "task must be"), (dict(questions=0), "questions must be")):
        with pytest.raises(ValueError, match=msg):
            write_task(tmp_path / "x", **bad)
