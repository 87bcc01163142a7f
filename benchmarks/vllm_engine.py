"""Cactus inside a real vLLM engine, end to end, on CPU (``make vllm``): the project's rules verify
vLLM's drafts through the plugin (``cactus_theory.integrations.vllm``), checked against the project's
exact laws and beside the project's own decoding loop.

    .venv-vllm/bin/python benchmarks/vllm_engine.py [--draft FILE] [--out DIR] [--quick] [--force]

Models: the embedded SmolLM2-135M verifier exported as a float32 safetensors folder
(``integrations.vllm_models.export_verifier``) and a project draft (a ``FeatureDraft`` file, ``--draft``;
default: the embedded draft if built, else a reduced draft built once into build/vllm/) exported as
an EAGLE-3 folder. Stages, each written atomically to ``OUT/<stage>.json`` and reused by a rerun with
the same settings (resumable):

``ngram``      a live engine with n-gram drafts (vLLM passes no draft probabilities: the project's
               one-hot convention), the paper's sampling (T 0.6, top-k 20, top-p 0.95), vLLM's own
               rejection sampling and each rule through the plugin (switched in the running engine
               with ``LLM.collective_rpc("cactus_theory_set_rule", ...)``).
``eagle3``     the project's draft loaded by vLLM's EAGLE-3 drafter with
               ``draft_sample_method="probabilistic"`` (vLLM samples the draft and passes its law),
               temperature 0.6 only (vLLM's draft law ignores top-k / top-p, so both engines then use
               the same laws); beside it the project's ``speculative_generate`` with the same draft,
               prompts, rule and sampling (the cross-validation table).
``methods``    vLLM's own rejection methods: ``standard`` with argmax drafts (vLLM's default
               ``draft_sample_method="greedy"``) and ``synthetic`` (lossy: fixed acceptance rates).
``dist``       distribution tests of the first token the rejection step emits (the second new token,
               given the first, sampled at prefill, equals its most likely value), over many seeded
               requests: Cactus through the plugin with EAGLE-3 drafts and with n-gram drafts against
               the exact law (``goodness_of_fit``); SpS through the plugin against vLLM's own sampler
               (``homogeneity``) and both against the exact law.

Every live run is also checked exactly: vLLM's per-request records (``per_request_spec_decode_metrics=
"detailed"``: accepted drafts per step) give the positions where each verification step started;
there the project computes the exact acceptance probability of the first draft from teacher-forced
laws (``lm.first_step_laws``; n-gram proposals by ``ngram_proposal``, an independent port of vLLM's
lookup), and the observed count of first-draft acceptances is compared with its exact expectation
(z = (observed - expected) / sqrt(sum a (1 - a)), a martingale sum). The mean exact step KL at those
positions is the rule's cost where vLLM used it. Timings are wall clock on this machine (shared
CPUs): vLLM's CPU engine and the project's loop are different engines, so their tokens/s compare
engines, not rules.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from cactus_theory.core.sampling import SAMPLING, Sampling

ROOT = Path(__file__).resolve().parent.parent
K = 4  # num_speculative_tokens
PAPER = SAMPLING.as_tuple()  # temperature, top-k, top-p: the paper's
TEMP_ONLY = (SAMPLING.temperature, 0, 1.0)
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
RULES = ["sps", "cactus:delta=0.5", "cactus:delta=1.0", "tas:epsilon=0.09,alpha=0.3"]
SYNTHETIC_RATES = [0.7, 0.49, 0.343, 0.2401]  # unconditional; conditional 0.7 at every position
VLLM_OWN = "vLLM's own (standard)"
MAX_REQUESTS = 20_000  # per distribution test (the report gives the samples and the power they reach)
ALPHA = 1e-3  # level of every distribution test
EPS, EPS_QUICK, BETA = 0.1, 0.2, 0.01  # each test's N: power >= 0.99 against any law at TV >= EPS
# fallback drafts when neither --draft nor the embedded draft exists (built once into --build)
STAGES = ("ngram", "eagle3", "methods", "dist", "seeds")
REDUCED = dict(onpolicy_prompts=96, heldout_prompts=8, wiki_docs=48, epochs=5, lr=3e-3, batch_tokens=1024)
REDUCED_QUICK = dict(onpolicy_prompts=12, heldout_prompts=4, wiki_docs=8, epochs=1)


def log(msg: str) -> None:
    print(f"[vllm_engine {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- pieces with no vLLM in them (unit-tested in the main environment) -------------------------------

def ngram_proposal(tokens, min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM's n-gram lookup, written independently: the longest suffix of ``tokens`` of length
    ``min_n..max_n`` that also occurs earlier (ending before the last token); among the longest, the
    earliest occurrence; the proposal is the (at most ``k``) tokens that followed it."""
    t = list(tokens)
    T = len(t)
    best_n, best_s = 0, None
    for s in range(T - 1):  # occurrence start; longest v <= max_n with t[s:s+v] == t[T-v:] ending before T - 1
        for v in range(min(max_n, T - 1 - s), 0, -1):
            if t[s:s + v] == t[T - v:T]:
                if v > best_n:
                    best_n, best_s = v, s
                break
    if best_n < min_n:
        return []
    start = best_s + best_n
    return t[start:start + min(k, T - start)]


def block_starts(L: int, n_out: int, accepted: list[int], drafted: list[int], proposer=None, tokens=None):
    """Positions where the verification steps of one request started, from vLLM's per-step records.

    Position ``i`` is the index (in prompt + output) of the last token before the step, whose first
    draft is judged as token ``i + 1``; the first step starts at ``L`` (the token sampled at prefill).
    A step that accepts ``a`` drafts moves ``i`` by ``a + 1``. ``proposer(tokens[:i + 1])`` (n-gram)
    says whether vLLM drafted at ``i``: a position without a proposal is a plain decoding step, which
    vLLM does not record. Returns ``[(i, a), ...]`` or None if the records and the walk disagree."""
    out, i, s = [], L, 0
    last = L + n_out - 1  # the last emitted token starts no step
    while i < last and s <= len(accepted):
        if proposer is not None and not proposer(tokens[:i + 1]):
            i += 1
            continue
        if s == len(accepted):
            return None  # vLLM recorded fewer steps than the walk needs
        if drafted[s] <= 0:
            return None
        out.append((i, accepted[s]))
        i += accepted[s] + 1
        s += 1
    return out if s == len(accepted) else None


def z_score(observed: float, probs) -> float:
    a = np.asarray(probs, dtype=np.float64)
    var = float(np.sum(a * (1 - a)))
    if var > 1e-12:
        return (observed - float(a.sum())) / math.sqrt(var)
    return 0.0 if abs(observed - float(a.sum())) < 1e-6 else math.inf  # every decision was certain


def ratio_ci(num, den, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """sum(num) / sum(den) with a 95% percentile bootstrap interval over sequences."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    point = num.sum() / den.sum() if den.sum() else math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(num), (reps, len(num)))
    d = den[idx].sum(1)
    v = num[idx].sum(1)[d > 0] / d[d > 0]
    lo, hi = np.percentile(v, [2.5, 97.5]) if v.size else (math.nan, math.nan)
    return float(point), float(lo), float(hi)


def diff_ci(a: tuple, b: tuple, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Difference of two ratio-of-sums statistics (independent runs): point and 95% interval."""
    rng = np.random.default_rng(seed)

    def boot(num, den):
        num, den = np.asarray(num, float), np.asarray(den, float)
        idx = rng.integers(0, len(num), (reps, len(num)))
        return num[idx].sum(1) / np.maximum(den[idx].sum(1), 1e-12)

    d = boot(*a) - boot(*b)
    point = np.sum(a[0]) / np.sum(a[1]) - np.sum(b[0]) / np.sum(b[1])
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float(point), float(lo), float(hi)


# -- models -------------------------------------------------------------------------------------------

def prepare_models(build: Path, draft: str | None, quick: bool = False) -> tuple[str, str, str, str]:
    """(verifier folder, draft file, EAGLE-3 folder, what the draft is)."""
    from cactus_theory.integrations.vllm_models import export_draft, export_verifier
    from cactus_theory.lm.draft import draft_path

    log("verifier: exporting the embedded SmolLM2 (GGUF) to a safetensors folder (reused when done)")
    vdir = export_verifier(str(build / "smollm2"))
    if draft:
        what = f"given draft {draft}"
    elif os.path.exists(draft_path()):
        draft, what = draft_path(), f"embedded draft {draft_path()}"
    else:
        from cactus_theory.lm.draft import DraftConfig
        from cactus_theory.lm.train.draft_build import build_draft

        cfg = REDUCED_QUICK if quick else REDUCED
        draft = str(build / ("draft-reduced-quick.pt" if quick else "draft-reduced.pt"))
        what = (f"reduced draft {draft} (the embedded draft is not built: DraftConfig({cfg}); rerun with "
                f"--draft once `cactus-theory build-draft` has built the final one)")
        if not os.path.exists(draft):
            log(f"building a {what}")
            build_draft(replace(DraftConfig(), **cfg), path=draft)
    log(f"draft: {what}; exporting it as an EAGLE-3 folder")
    h = hashlib.sha1(os.path.abspath(draft).encode()).hexdigest()[:8]
    edir = export_draft(draft, str(build / f"eagle3-{h}"))
    return vdir, draft, edir, what


class Exact:
    """The project's side: the verifier (Hugging Face, float32) and the draft, exact laws."""

    def __init__(self, draft_file: str):
        import torch

        from cactus_theory.lm.draft import load_draft
        from cactus_theory.lm.pair import ModelPair, load_model

        torch.set_num_threads(1)
        verifier, tok = load_model("smollm2", torch.float32)
        self.pair = ModelPair(load_draft(verifier, path=draft_file), verifier, tok, name="smollm2+draft")
        self.tok = tok

    def laws(self, ids, positions, p_sampling, q_sampling):
        """(P, Q) at each position ``i`` (law of token i + 1): P the draft's first-step law after
        ``p_sampling`` (vLLM: temperature only; temperature 0: its argmax, one-hot), Q the verifier's
        after ``q_sampling``."""
        from cactus_theory.lm.loop import first_step_laws

        lo, hi = min(positions), max(positions) + 1
        P, _ = first_step_laws(self.pair, ids, lo, hi, **Sampling(*p_sampling))
        _, Q = first_step_laws(self.pair, ids, lo, hi, **Sampling(*q_sampling))
        rows = [i - lo for i in positions]
        P, Q = P[rows], Q[rows]
        return P / P.sum(-1, keepdims=True), Q / Q.sum(-1, keepdims=True)  # float32 rounding, in float64

    def q_laws(self, ids, positions, q_sampling):
        import torch

        from cactus_theory.core.transforms import sampling_probs

        with torch.inference_mode():
            logits = self.pair.verifier(input_ids=torch.tensor([ids])).logits[0, positions].float()
        q = sampling_probs(logits, *q_sampling).double().numpy()
        return q / q.sum(-1, keepdims=True)


def one_hot(V: int, n: int) -> np.ndarray:
    e = np.zeros(V)
    e[n] = 1.0
    return e


# -- vLLM side ------------------------------------------------------------------------------------------

ENGINE_ARGS: dict = {}  # set by main: tensor_parallel_size and, on GPUs, gpu_memory_utilization


def start_engine(model_dir: str, spec: dict | None, max_num_seqs: int = 64, max_prompt: int = 128, **kw):
    """A vLLM engine (float32, eager) with per-request speculative records. The token budget of a step
    holds every running request's whole prompt: vLLM's CPU build cannot split the prefill of a seeded
    request (limitation 9 in docs/vllm.md: ``RuntimeError: CPU Generator does not use offset``)."""
    from vllm import LLM

    t = time.time()
    kw.setdefault("max_num_batched_tokens", max(4096, max_num_seqs * (max_prompt + 2 * K + 2)))
    if spec is not None:
        kw.update(per_request_spec_decode_metrics="detailed", speculative_config=spec)
    llm = LLM(model=model_dir, dtype="float32", max_model_len=1024, max_num_seqs=max_num_seqs, enforce_eager=True,
              seed=0, disable_log_stats=False, **ENGINE_ARGS, **kw)
    log(f"engine up in {time.time() - t:.0f} s: {spec}")
    return llm


def set_rule(llm, rule: str | None) -> str:
    label = llm.collective_rpc("cactus_theory_set_rule", args=(rule,))[0]
    return VLLM_OWN if label == "vllm" else label


def generate(llm, prompts: list[list[int]], sampling, max_tokens: int, seeds) -> tuple[list[dict], float]:
    from vllm import SamplingParams

    T, top_k, top_p = sampling
    params = [SamplingParams(temperature=T, top_k=top_k if top_k else -1, top_p=top_p, max_tokens=max_tokens, seed=s)
              for s in seeds]
    t = time.time()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    secs = time.time() - t
    rows = []
    for o in outs:
        c = o.outputs[0]
        m = c.spec_decode_metrics
        rows.append({"tokens": list(c.token_ids), "accepted": list(m.per_step_accepted) if m else [],
                     "drafted": list(m.per_step_drafted) if m else []})
    return rows, secs


def engine_counts(rows) -> dict:
    acc = [sum(r["accepted"]) for r in rows]
    steps = [len(r["accepted"]) for r in rows]
    drafted = [sum(r["drafted"]) for r in rows]
    return {"accepted": acc, "steps": steps, "drafted": drafted, "new_tokens": [len(r["tokens"]) for r in rows]}


def exact_check(ex: Exact, rule, prompts, rows, p_sampling, q_sampling, ngram: dict | None = None) -> dict:
    """Observed first-draft acceptances at vLLM's block starts vs their exact expectation, and the
    mean exact step KL there (see the module docstring)."""
    from cactus_theory.exact import acceptance_rate
    from cactus_theory.lm.metrics import step_kl

    probs, hits, kls, skipped = [], 0, [], 0
    V = ex.pair.vocab_size
    for prompt, r in zip(prompts, rows, strict=True):
        ids = prompt + r["tokens"]
        prop = None
        if ngram:
            def prop(ctx):
                return ngram_proposal(ctx, ngram["prompt_lookup_min"], ngram["prompt_lookup_max"], K)
        starts = block_starts(len(prompt), len(r["tokens"]), r["accepted"], r["drafted"], prop, ids)
        if starts is None:
            skipped += 1
            continue
        if not starts:
            continue
        pos = [i for i, _ in starts]
        if ngram:
            Q = ex.q_laws(ids, pos, q_sampling)
            P = np.stack([one_hot(V, ngram_proposal(ids[:i + 1], ngram["prompt_lookup_min"],
                                                    ngram["prompt_lookup_max"], K)[0]) for i in pos])
        else:
            P, Q = ex.laws(ids, pos, p_sampling, q_sampling)
        a = acceptance_rate(rule, P, Q, check=False)
        probs += list(a)
        hits += sum(1 for _, acc in starts if acc >= 1)
        for j in range(len(pos)):
            v = step_kl(rule, P[j], Q[j])
            if v is not None:
                kls.append(v)
    return {"blocks": len(probs), "observed": hits, "expected": float(np.sum(probs)), "z": z_score(hits, probs),
            "mean_step_kl": float(np.mean(kls)) if kls else math.nan, "kl_positions": len(kls),
            "requests_skipped": skipped}


def summarise(counts: dict, secs: float) -> dict:
    al = ratio_ci(np.add(counts["accepted"], counts["steps"]), counts["steps"])
    acc = ratio_ci(counts["accepted"], counts["drafted"])
    return {"al": al, "acceptance": acc, "seconds": secs, "new_tokens": int(sum(counts["new_tokens"])),
            "tokens_per_s": sum(counts["new_tokens"]) / secs if secs > 0 else math.nan}


def cpu_limitations() -> dict:
    """Minimal reproducers of what vLLM's CPU build gets wrong, run on vLLM's own functions before any
    engine (so before the plugin is loaded): each entry is the exact message or the wrong value."""
    import torch
    from vllm.platforms import current_platform

    out = {}
    if not current_platform.is_cpu():
        return out
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample import rejection_sampler as rs

    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    temp = torch.tensor([0.7, 0.0, 0.5])
    got = [rs.expand_batch_to_tokens(temp, cu, 5, replace_from=0, replace_to=1).tolist() for _ in range(3)]
    out["expand_batch_to_tokens"] = {"expected": [0.7, 0.7, 0.5, 0.5, 0.5], "got (3 calls)": got,
                                     "wrong": any(np.abs(np.subtract(g, [0.7, 0.7, 0.5, 0.5, 0.5])).max() > 1e-6
                                                  for g in got)}
    try:
        rs.apply_top_k_top_p(torch.zeros((0, 8)), torch.zeros(0, dtype=torch.int32) + 3, None)
        out["top_k_empty_batch"] = "no error"
    except Exception as e:  # noqa: BLE001 - the message is the result
        out["top_k_empty_batch"] = f"{type(e).__name__}: {e}"
    try:
        ids = torch.tensor([1, 2], dtype=torch.int32)
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.metadata import SamplingMetadata

        md = SamplingMetadata(temperature=torch.ones(1), all_greedy=False, all_random=True, top_p=None, top_k=None,
                              generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
                              frequency_penalties=torch.zeros(1), presence_penalties=torch.zeros(1),
                              repetition_penalties=torch.ones(1), output_token_ids=[[]], allowed_token_ids_mask=None,
                              bad_words_token_ids={}, logitsprocs=LogitsProcessors())
        rs.rejection_sample(ids, [2], 2, torch.tensor([2], dtype=torch.int32), None, torch.zeros(2, 8),
                            torch.zeros((1, 1), dtype=torch.int64), md, True, torch.full((2,), 0.5))
        out["synthetic_mode"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["synthetic_mode"] = f"{type(e).__name__}: {e}"
    try:
        from vllm.config import SpeculativeConfig

        SpeculativeConfig(method="ngram", num_speculative_tokens=K, prompt_lookup_max=4, rejection_sample_method="fly")
        out["fly_method"] = "accepted"
    except Exception as e:  # noqa: BLE001
        out["fly_method"] = f"{type(e).__name__}: {str(e).splitlines()[0]}: {str(e).splitlines()[2].strip()}"
    return out


# -- stages -------------------------------------------------------------------------------------------------

def stage_ngram(ctx) -> dict:
    from cactus_theory.integrations.vllm import rule_from_spec

    llm = start_engine(ctx.vdir, NGRAM)
    out = {"spec": NGRAM, "sampling": PAPER, "rows": {}}
    try:
        for name in [None, *RULES]:
            label = set_rule(llm, name)
            rows, secs = generate(llm, ctx.prompts, PAPER, ctx.max_new, range(len(ctx.prompts)))
            rule = rule_from_spec(name or "sps")
            row = summarise(engine_counts(rows), secs)
            row["exact"] = exact_check(ctx.ex, rule, ctx.prompts, rows, None, PAPER, ngram=NGRAM)
            out["rows"][label] = row
            log(f"ngram {label}: AL {row['al'][0]:.3f}, acceptance {row['acceptance'][0]:.3f}, exact z "
                f"{row['exact']['z']:+.2f}")
    finally:
        _shutdown(llm)
    return out


def stage_eagle3(ctx) -> dict:
    from cactus_theory.integrations.vllm import rule_from_spec
    from cactus_theory.lm import speculative_generate

    spec = {"method": "eagle3", "model": ctx.edir, "num_speculative_tokens": K, "draft_sample_method": "probabilistic"}
    llm = start_engine(ctx.vdir, spec)
    out = {"spec": spec, "sampling": TEMP_ONLY, "rows": {}}
    try:
        for name in [None, *RULES]:
            label = set_rule(llm, name)
            rows, secs = generate(llm, ctx.prompts, TEMP_ONLY, ctx.max_new, range(len(ctx.prompts)))
            rule = rule_from_spec(name or "sps")
            counts = engine_counts(rows)
            row = {"vllm": summarise(counts, secs), "vllm_counts": counts}
            row["vllm"]["exact"] = exact_check(ctx.ex, rule, ctx.prompts, rows, TEMP_ONLY, TEMP_ONLY)
            if name is not None:
                res = speculative_generate(ctx.ex.pair, ctx.prompts, rule, k=K, max_new_tokens=ctx.max_new,
                                           temperature=TEMP_ONLY[0], top_k=TEMP_ONLY[1], top_p=TEMP_ONLY[2],
                                           batch_size=8, seed=0, track_kl=False)
                ps = res.per_sequence
                ours = {"accepted": [c.accepted for c in ps], "steps": [c.steps for c in ps],
                        "drafted": [c.drafted for c in ps], "new_tokens": [c.new_tokens for c in ps]}
                row["ours"] = summarise(ours, res.stats.seconds)
                row["ours_counts"] = ours
                row["al_diff"] = diff_ci((np.add(counts["accepted"], counts["steps"]), counts["steps"]),
                                         (np.add(ours["accepted"], ours["steps"]), ours["steps"]))
                row["acceptance_diff"] = diff_ci((counts["accepted"], counts["drafted"]),
                                                 (ours["accepted"], ours["drafted"]))
            out["rows"][label] = row
            log(f"eagle3 {label}: vLLM AL {row['vllm']['al'][0]:.3f}"
                + (f", ours {row['ours']['al'][0]:.3f}" if "ours" in row else "")
                + f", exact z {row['vllm']['exact']['z']:+.2f}")
    finally:
        _shutdown(llm)
    return out


def stage_methods(ctx) -> dict:
    from cactus_theory.integrations.vllm import VllmSynthetic
    from cactus_theory.rules import SpS

    out = {"rows": {}}
    greedy = (0.0, 0, 1.0)  # vLLM's greedy drafts: the draft's argmax (one-hot p)
    cases = [("standard, argmax drafts", {"draft_sample_method": "greedy"}, SpS(), PAPER),
             ("standard, sampled drafts", {"draft_sample_method": "probabilistic"}, SpS(), TEMP_ONLY),
             ("synthetic, rates " + ",".join(f"{r:g}" for r in SYNTHETIC_RATES),
              {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": SYNTHETIC_RATES},
              VllmSynthetic(SYNTHETIC_RATES[0]), PAPER),
             # block verification is implemented in vLLM's ModelRunner V2 only; the CPU build runs V1
             ("block (requested; V1 runner: standard)", {"rejection_sample_method": "block"}, SpS(), PAPER)]
    for label, extra, rule, sampling in cases:
        spec = {"method": "eagle3", "model": ctx.edir, "num_speculative_tokens": K, **extra}
        if label.startswith("standard, sampled"):
            rows = ctx.cache.get("eagle3", {}).get("rows", {}).get(VLLM_OWN)
            if rows:  # the eagle3 stage ran it already
                out["rows"][label] = {"spec": spec, "sampling": sampling, **rows["vllm"]}
                continue
        llm = None
        try:
            llm = start_engine(ctx.vdir, spec)
            rows, secs = generate(llm, ctx.prompts, sampling, ctx.max_new, range(len(ctx.prompts)))
        except Exception as e:  # noqa: BLE001 - a method the CPU build cannot run is a result, recorded
            out["rows"][label] = {"spec": spec, "sampling": sampling, "rule": repr(rule),
                                  "error": f"{type(e).__name__}: {e}"[:500]}
            log(f"method {label}: FAILED ({type(e).__name__}: {str(e)[:200]})")
            continue
        finally:
            if llm is not None:
                _shutdown(llm)
        row = summarise(engine_counts(rows), secs)
        p_sampling = greedy if extra.get("draft_sample_method", "greedy") == "greedy" else TEMP_ONLY
        row["exact"] = exact_check(ctx.ex, rule, ctx.prompts, rows, p_sampling, sampling)
        out["rows"][label] = {"spec": spec, "sampling": sampling, "rule": repr(rule), **row}
        log(f"method {label}: AL {row['al'][0]:.3f}, acceptance {row['acceptance'][0]:.3f}, exact z "
            f"{row['exact']['z']:+.2f}, mean step KL {row['exact']['mean_step_kl']:.4f}")
    return out


def _second_token_samples(rows, first):
    return np.array([r["tokens"][1] for r in rows if len(r["tokens"]) >= 2 and r["tokens"][0] == first])


def choose_prompt(ex: Exact, prompts: list[list[int]], rule, q_sampling, p_sampling, ngram=None, answer: int = 40):
    """Where to test: a request ``prefix`` (a prompt plus the first ``m`` tokens of the verifier's
    greedy answer to it, for every ``m``) whose first new token ``x1`` (sampled at prefill) is likely
    and after which the rule's exact law ``h`` of the next token differs from ``q`` (so that the test
    sees the rule, not only the verifier). Returns ``(score, prefix, x1, P(x1), p, q, h)`` or None."""
    import torch

    from cactus_theory import induced_distribution, tv

    best = None
    V = ex.pair.vocab_size
    for ids in prompts:
        with torch.inference_mode():
            seq = ex.pair.verifier.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                            max_new_tokens=answer, do_sample=False)[0].tolist()
        L = len(ids)
        if len(seq) < L + 3:
            continue
        cuts = range(L, len(seq) - 1)  # prefix = seq[:c], x1 = seq[c], test position c (law of token c + 1)
        Q1 = ex.q_laws(seq, [c - 1 for c in cuts], q_sampling)
        if ngram is None:
            P, Q = ex.laws(seq, list(cuts), p_sampling, q_sampling)
        else:
            Q = ex.q_laws(seq, list(cuts), q_sampling)
        for j, c in enumerate(cuts):
            x1 = seq[c]
            if ngram is None:
                p = P[j]
            else:
                prop = ngram_proposal(seq[:c + 1], ngram["prompt_lookup_min"], ngram["prompt_lookup_max"], K)
                if not prop:
                    continue
                p = one_hot(V, prop[0])
            h = induced_distribution(rule, p, Q[j])
            score = Q1[j, x1] * min(tv(h, Q[j]), 0.3)
            if best is None or score > best[0]:
                best = (float(score), seq[:c], x1, float(Q1[j, x1]), p, Q[j], h)
    return best


def dist_test(llm, prompt, x1, pmode, law, sampling, n_needed, seed0):
    from cactus_theory.stats import goodness_of_fit

    n_req = min(int(math.ceil(n_needed / pmode * 1.1)), MAX_REQUESTS)
    rows, secs = generate(llm, [prompt] * n_req, sampling, 2, range(seed0, seed0 + n_req))
    xs = _second_token_samples(rows, x1)
    g = goodness_of_fit(xs, law, alpha=ALPHA, kind="samples")
    return {"requests": n_req, "samples": int(xs.size), "seconds": secs, "statistic": g.statistic,
            "pvalue": g.pvalue, "bins": g.bins, "reject": bool(g.reject), "draws": xs.tolist()}


def _power(n: int, eps: float, cats: int) -> float:
    from cactus_theory.stats import power

    return float(power(n, min(max(eps, 1e-9), 1.0), categories=max(cats, 2), alpha=ALPHA))


def stage_dist(ctx) -> dict:
    """Distribution tests (see the module docstring); each finished test is kept in
    ``OUT/dist.partial.json`` so an interrupted stage resumes after it."""
    from cactus_theory import Cactus, SpS, induced_distribution, tv
    from cactus_theory.stats import homogeneity, samples_needed

    eps = ctx.eps
    out = ctx.load_partial("dist") or {}
    out.update(alpha=ALPHA, eps=eps, power_target=1 - BETA)
    cactus = Cactus(0.5)
    spec = {"method": "eagle3", "model": ctx.edir, "num_speculative_tokens": K, "draft_sample_method": "probabilistic"}
    need = [k for k in ("eagle3_cactus", "eagle3_sps_plugin", "eagle3_sps_vllm") if k not in out]
    if need:
        # (a) EAGLE-3 drafts, Cactus through the plugin; the paper's sampling for q, temperature only for p
        _, prompt, x1, pmode, P, Q, h = choose_prompt(ctx.ex, ctx.all_prompts[:ctx.n_candidates], cactus, PAPER,
                                                      TEMP_ONLY)
        cats = int(np.count_nonzero(h > 1e-6))
        n_needed = samples_needed(eps, categories=max(cats, 2), alpha=ALPHA, beta=BETA)
        P_next, Q_next = ctx.ex.laws(prompt + [x1, int(Q.argmax())], [len(prompt) + 1], TEMP_ONLY, PAPER)
        P_prev, Q_prev = ctx.ex.laws(prompt + [x1], [len(prompt) - 1], TEMP_ONLY, PAPER)
        P_tk, _ = ctx.ex.laws(prompt + [x1], [len(prompt)], PAPER, PAPER)
        alt = {"vLLM's own law (SpS: q)": Q,
               "off by one (the laws of the next position)": induced_distribution(cactus, P_next[0], Q_next[0]),
               "off by one (the laws of the previous position)": induced_distribution(cactus, P_prev[0], Q_prev[0]),
               "draft law with top-k / top-p (the project's loop, not vLLM's)": induced_distribution(cactus, P_tk[0], Q)}
        h_sps = induced_distribution(SpS(), P, Q)
        cats_s = int(np.count_nonzero(h_sps > 1e-6))
        n_s = samples_needed(eps, categories=max(cats_s, 2), alpha=ALPHA, beta=BETA)
        llm = start_engine(ctx.vdir, spec, max_num_seqs=128)
        try:
            if "eagle3_cactus" not in out:
                set_rule(llm, "cactus:delta=0.5")
                res = dist_test(llm, prompt, x1, pmode, h, PAPER, n_needed, 10_000)
                res.update(prompt_tokens=len(prompt), x1=x1, p_x1=float(pmode), categories=cats, n_needed=n_needed,
                           alternatives={k: {"tv": float(tv(v, h)), "power": _power(res["samples"], float(tv(v, h)),
                                                                                   cats)}
                                         for k, v in alt.items()})
                out["eagle3_cactus"] = res
                ctx.save_partial("dist", out)
                log(f"dist eagle3 Cactus(0.5): {res['samples']} samples, p = {res['pvalue']:.3g}")
            # (b) SpS through the plugin and vLLM's own sampler, same prompt, each against q
            for key, rule, seed0 in (("eagle3_sps_plugin", "sps", 20_000), ("eagle3_sps_vllm", None, 40_000)):
                if key not in out:
                    set_rule(llm, rule)
                    res = dist_test(llm, prompt, x1, pmode, h_sps, PAPER, n_s, seed0)
                    res.update(n_needed=n_s, categories=cats_s, tv_cactus_vs_sps=float(tv(h, h_sps)))
                    out[key] = res
                    ctx.save_partial("dist", out)
                    log(f"dist {key}: {res['samples']} samples, p = {res['pvalue']:.3g}")
        finally:
            _shutdown(llm)
    a, b = out["eagle3_sps_plugin"], out["eagle3_sps_vllm"]
    hom = homogeneity(np.array(a["draws"]), np.array(b["draws"]), ctx.ex.pair.vocab_size, alpha=ALPHA, kind="samples")
    out["eagle3_sps_homogeneity"] = {"statistic": hom.statistic, "pvalue": hom.pvalue, "reject": bool(hom.reject)}
    log(f"dist SpS plugin vs vLLM's own: p = {hom.pvalue:.3g}")
    # (c) n-gram drafts (one-hot), Cactus through the plugin
    if "ngram_cactus" not in out:
        best = choose_prompt(ctx.ex, ctx.all_prompts[:ctx.n_candidates], cactus, PAPER, None, ngram=NGRAM)
        if best is None:
            out["ngram_cactus"] = {"error": "no candidate prompt has an n-gram proposal after its likeliest first token"}
        else:
            _, prompt, x1, pmode, P, Q, h = best
            cats = int(np.count_nonzero(h > 1e-6))
            n_needed = samples_needed(eps, categories=max(cats, 2), alpha=ALPHA, beta=BETA)
            llm = start_engine(ctx.vdir, NGRAM, max_num_seqs=128)
            try:
                set_rule(llm, "cactus:delta=0.5")
                res = dist_test(llm, prompt, x1, pmode, h, PAPER, n_needed, 60_000)
            finally:
                _shutdown(llm)
            res.update(prompt_tokens=len(prompt), x1=x1, p_x1=float(pmode), draft=int(np.argmax(P)), categories=cats,
                       n_needed=n_needed, tv_vs_q=float(tv(h, Q)), power_vs_q=_power(res["samples"], float(tv(h, Q)),
                                                                                     cats))
            out["ngram_cactus"] = res
            log(f"dist ngram Cactus(0.5): {res['samples']} samples, p = {res['pvalue']:.3g}")
        ctx.save_partial("dist", out)
    return out


def stage_seeds(ctx) -> dict:
    """Is a seeded request reproducible? The same 16 seeded requests twice, with n-gram drafts (no
    draft sampling) and with sampled EAGLE-3 drafts (vLLM samples the draft without the request's
    generator: "TODO(woosuk): Consider seeds" in ``compute_probs_and_sample_next_token``)."""
    out = {}
    prompts = [ctx.prompts[0]] * 16
    for name, spec in (("ngram", NGRAM), ("eagle3 sampled drafts", {"method": "eagle3", "model": ctx.edir,
                                                                    "num_speculative_tokens": K,
                                                                    "draft_sample_method": "probabilistic"})):
        llm = start_engine(ctx.vdir, spec)
        try:
            a, _ = generate(llm, prompts, TEMP_ONLY, ctx.max_new, range(16))
            b, _ = generate(llm, prompts, TEMP_ONLY, ctx.max_new, range(16))
        finally:
            _shutdown(llm)
        same = sum(x["tokens"] == y["tokens"] for x, y in zip(a, b, strict=True))
        out[name] = {"requests": 16, "identical_reruns": int(same)}
        log(f"seeds {name}: {same}/16 seeded requests identical when rerun")
    # limitation 9: a seeded request whose prefill is split over steps (100 prompt tokens, 64 per step)
    from vllm import SamplingParams

    llm = start_engine(ctx.vdir, None, max_num_seqs=4, max_num_batched_tokens=64)
    probe = {}
    try:
        for seed in (None, 0):
            try:
                llm.generate([{"prompt_token_ids": list(range(100, 200))}],
                             SamplingParams(temperature=1.0, max_tokens=4, seed=seed), use_tqdm=False)
                probe[f"seed={seed}"] = "ok"
            except Exception as e:  # noqa: BLE001 - the failure is the result
                probe[f"seed={seed}"] = f"{type(e).__name__} (the worker's log: RuntimeError: CPU Generator does not use offset)"
                break
    finally:
        _shutdown(llm)
    out["seeded_chunked_prefill"] = probe
    log(f"seeds: a seeded request with a chunked prefill: {probe}")
    return out


def _shutdown(llm) -> None:
    import gc

    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - best effort: the engine process may be gone already
        pass
    del llm
    gc.collect()


# -- report ----------------------------------------------------------------------------------------------

def _ordered(rows: dict):
    """vLLM's own sampler first, then the rules by name."""
    return sorted(rows.items(), key=lambda kv: (kv[0] != VLLM_OWN, kv[0]))


def _kl(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"


def _ci(t) -> str:
    return f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"


def report(res: dict) -> str:
    lines = [f"# Cactus inside vLLM {res['meta']['vllm']} (CPU), end to end", "",
             f"Verifier: SmolLM2-135M-Instruct (float32 export). Draft: {res['meta']['draft']}; its build report's "
             f"held-out SpS acceptance by draft depth: {res['meta'].get('draft_heldout_acceptance_by_depth')}. "
             f"{res['meta']['prompts']} prompts (the evaluation set, chat-wrapped), at most {res['meta']['max_new']} "
             f"new tokens, k = {K} drafts per step. Loaded machine (2 shared cores): timings are indicative only, "
             f"and vLLM's CPU engine and the project's loop are different engines. AL = tokens per verifier call, "
             f"bonus included; acceptance = accepted drafts / drafted tokens; [95% bootstrap over prompts]. "
             f"Exact check: first-draft acceptances observed at vLLM's verification steps vs their exact "
             f"expectation (z); mean exact step KL(h || q) at those steps.", ""]
    if "eagle3" in res:
        e = res["eagle3"]
        lines += ["## Cross-validation: vLLM (EAGLE-3 drafter, sampled drafts) vs the project's loop",
                  "", f"Temperature {TEMP_ONLY[0]}, no top-k / top-p (vLLM's draft law is temperature-only).", "",
                  "| rule | vLLM AL | ours AL | AL diff | vLLM accept | ours accept | accept diff | vLLM tok/s "
                  "| ours tok/s | exact z (vLLM) | step KL |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for label, r in _ordered(e["rows"]):
            v, o = r["vllm"], r.get("ours")
            lines.append(f"| {label} | {_ci(v['al'])} | {_ci(o['al']) if o else '-'} | "
                         f"{_ci(r['al_diff']) if o else '-'} | {_ci(v['acceptance'])} | "
                         f"{_ci(o['acceptance']) if o else '-'} | {_ci(r['acceptance_diff']) if o else '-'} | "
                         f"{v['tokens_per_s']:.1f} | {o['tokens_per_s']:.1f} |".replace("| - | - |", "| - | - |")
                         if o else
                         f"| {label} | {_ci(v['al'])} | - | - | {_ci(v['acceptance'])} | - | - | "
                         f"{v['tokens_per_s']:.1f} | - |")
            lines[-1] += f" {v['exact']['z']:+.2f} ({v['exact']['observed']}/{v['exact']['expected']:.1f}) | " \
                         f"{_kl(v['exact']['mean_step_kl'])} |"
        lines.append("")
    if "ngram" in res:
        lines += ["## The plugin in a live engine: n-gram drafts (one-hot, no draft probabilities)", "",
                  f"The paper's sampling (T {PAPER[0]}, top-k {PAPER[1]}, top-p {PAPER[2]}); "
                  f"{json.dumps(NGRAM)}.", "",
                  "| rule | AL | acceptance | tok/s | exact z (obs/exp) | step KL |", "|---|---|---|---|---|---|"]
        for label, r in _ordered(res["ngram"]["rows"]):
            x = r["exact"]
            lines.append(f"| {label} | {_ci(r['al'])} | {_ci(r['acceptance'])} | {r['tokens_per_s']:.1f} | "
                         f"{x['z']:+.2f} ({x['observed']}/{x['expected']:.1f}) | {_kl(x['mean_step_kl'])} |")
        lines.append("")
    if "methods" in res:
        lines += ["## vLLM's own rejection methods, measured exactly (EAGLE-3 drafter)", "",
                  "| method | rule (exact law) | sampling | AL | acceptance | exact z (obs/exp) | step KL |",
                  "|---|---|---|---|---|---|---|"]
        for label, r in res["methods"]["rows"].items():
            if "error" in r:
                lines.append(f"| {label} | {r.get('rule', '-')} | {r['sampling']} | fails on this build: "
                             f"{r['error'][:160]} | | | |")
                continue
            x = r["exact"]
            lines.append(f"| {label} | {r.get('rule', 'SpS()')} | {r['sampling']} | {_ci(r['al'])} | "
                         f"{_ci(r['acceptance'])} | {x['z']:+.2f} ({x['observed']}/{x['expected']:.1f}) | "
                         f"{_kl(x['mean_step_kl'])} |")
        lines.append("")
    if "dist" in res:
        d = res["dist"]
        lines += ["## Distribution tests (first token emitted by the rejection step, given the first new token)",
                  "", f"Level {d['alpha']}; N from `samples_needed` for power >= {d['power_target']} against any "
                  f"law at TV >= {d['eps']}.", "",
                  "| test | samples | p-value | verdict |", "|---|---|---|---|"]

        def verdict(r):
            return "reject" if r["reject"] else "consistent"

        if "eagle3_cactus" in d:
            r = d["eagle3_cactus"]
            lines.append(f"| EAGLE-3, Cactus(0.5) via plugin vs exact law | {r['samples']} | {r['pvalue']:.3g} | "
                         f"{verdict(r)} |")
        for key, what in (("eagle3_sps_plugin", "EAGLE-3, SpS via plugin vs exact law (q)"),
                          ("eagle3_sps_vllm", "EAGLE-3, vLLM's own sampler vs exact law (q)")):
            if key in d:
                r = d[key]
                lines.append(f"| {what} | {r['samples']} | {r['pvalue']:.3g} | {verdict(r)} |")
        if "eagle3_sps_homogeneity" in d:
            r = d["eagle3_sps_homogeneity"]
            lines.append(f"| EAGLE-3, SpS via plugin vs vLLM's own (two-sample) | {d['eagle3_sps_plugin']['samples']} + "
                         f"{d['eagle3_sps_vllm']['samples']} | {r['pvalue']:.3g} | {verdict(r)} |")
        if "ngram_cactus" in d and "samples" in d["ngram_cactus"]:
            r = d["ngram_cactus"]
            lines.append(f"| n-gram, Cactus(0.5) via plugin vs exact law | {r['samples']} | {r['pvalue']:.3g} | "
                         f"{verdict(r)} |")
        if "eagle3_cactus" in d:
            lines += ["", "What the EAGLE-3 Cactus test would catch (TV from the exact law, power at that TV):", ""]
            for k, v in d["eagle3_cactus"]["alternatives"].items():
                lines.append(f"- {k}: TV {v['tv']:.3f}, power {v['power']:.3f}")
        lines.append("")
    if "seeds" in res:
        lines += ["## Seeded requests rerun", ""]
        for k, v in res["seeds"].items():
            if isinstance(v, dict) and "requests" in v:
                lines.append(f"- {k}: {v['identical_reruns']}/{v['requests']} identical")
            elif isinstance(v, dict):
                lines.append(f"- {k} (no speculation; 100 prompt tokens, 64 tokens per step): {json.dumps(v)}")
        lines.append("")
    if res.get("cpu_limitations"):
        lines += ["## vLLM CPU limitations reproduced (minimal calls of vLLM's own functions)", ""]
        for k, v in res["cpu_limitations"].items():
            lines.append(f"- {k}: {json.dumps(v)}")
        lines.append("")
    return "\n".join(lines)


class Ctx:
    pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default=None, help="a FeatureDraft file (default: the embedded draft, else a reduced "
                                                  "one built into --build)")
    ap.add_argument("--build", default=str(ROOT / "build" / "vllm"), help="exported models (default build/vllm)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vllm_cpu"),
                    help="results: one JSON per stage, report.md (default benchmarks/results/vllm_cpu)")
    ap.add_argument("--stages", default=None, help=f"comma-separated stages to run (default: {', '.join(STAGES)}; "
                                                   f"--quick: all but seeds)")
    ap.add_argument("--quick", action="store_true", help="6 prompts, 32 new tokens, distribution tests at TV 0.2, "
                                                        "no seeds stage (the `make vllm` check)")
    ap.add_argument("--force", action="store_true", help="rerun stages whose results exist")
    ap.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM tensor parallelism (GPUs)")
    args = ap.parse_args(argv)
    if args.stages is None:
        args.stages = ",".join(st for st in STAGES if not (args.quick and st == "seeds"))
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        print(f"error: --stages has unknown stage(s) {bad}; choose from {', '.join(STAGES)}", file=sys.stderr)
        return 2
    if args.draft is not None and not os.path.isfile(args.draft):
        print(f"error: --draft {args.draft!r} does not exist", file=sys.stderr)
        return 2
    if args.tensor_parallel_size < 1:
        print(f"error: --tensor-parallel-size must be >= 1, got {args.tensor_parallel_size}", file=sys.stderr)
        return 2
    if os.environ.get("CACTUS_THEORY_RULE"):
        print("error: unset CACTUS_THEORY_RULE: the benchmark chooses each rule itself", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import vllm
    from vllm.platforms import current_platform

    ENGINE_ARGS["tensor_parallel_size"] = args.tensor_parallel_size
    if not current_platform.is_cpu():
        ENGINE_ARGS["gpu_memory_utilization"] = 0.5

    from cactus_theory.lm.data import encode_prompts, prompt_set
    from cactus_theory.util.atomic import atomic_write_json, atomic_write_text

    build, out = Path(args.build), Path(args.out)
    ctx = Ctx()
    ctx.vdir, ctx.draft, ctx.edir, what = prepare_models(build, args.draft, args.quick)
    ctx.ex = Exact(ctx.draft)
    texts = prompt_set(2 if args.quick else None)
    ctx.prompts = encode_prompts(ctx.ex.tok, texts, chat=True)
    ctx.all_prompts = encode_prompts(ctx.ex.tok, prompt_set(), chat=True)
    ctx.max_new = 32 if args.quick else 64
    key = {"draft_sha1": hashlib.sha1(Path(ctx.draft).read_bytes()).hexdigest()[:16], "quick": args.quick,
           "vllm": vllm.__version__, "k": K, "rules": RULES}
    import torch

    info = torch.load(ctx.draft, map_location="cpu", weights_only=False).get("info", {})
    res = {"meta": {"vllm": vllm.__version__, "draft": what, "prompts": len(ctx.prompts), "max_new": ctx.max_new,
                    "draft_heldout_acceptance_by_depth": info.get("heldout_acceptance_by_depth"),
                    "draft_config": info.get("config"), "key": key}}
    atomic_write_json(out / "meta.json", res["meta"])
    ctx.cache = {}
    ctx.eps = EPS_QUICK if args.quick else EPS
    ctx.n_candidates = 6 if args.quick else 12  # prompts whose greedy answers the distribution tests search

    def load_partial(name):
        f = out / f"{name}.partial.json"
        if f.exists() and not args.force:
            blob = json.loads(f.read_text())
            if blob.get("key") == key:
                return blob["result"]
        return None

    ctx.load_partial = load_partial
    ctx.save_partial = lambda name, r: atomic_write_json(out / f"{name}.partial.json", {"key": key, "result": r})
    res["cpu_limitations"] = cpu_limitations()
    for name in STAGES:
        f = out / f"{name}.json"
        if f.exists():
            blob = json.loads(f.read_text())
            if blob.get("key") == key:
                ctx.cache[name] = blob["result"]
    fns = {"ngram": stage_ngram, "eagle3": stage_eagle3, "methods": stage_methods, "dist": stage_dist,
           "seeds": stage_seeds}
    for name in stages:
        if name in ctx.cache and not args.force:
            log(f"stage {name}: reusing {out / (name + '.json')}")
        else:
            log(f"stage {name}: running")
            t = time.time()
            ctx.cache[name] = fns[name](ctx)
            ctx.cache[name]["stage_seconds"] = time.time() - t
            atomic_write_json(out / f"{name}.json", {"key": key, "result": ctx.cache[name]})
    res.update({k: ctx.cache[k] for k in STAGES if k in ctx.cache})  # this run's stages and earlier ones (same key)
    text = report(res)
    atomic_write_text(out / "report.md", text + "\n")
    print(text)
    failed = []
    for name in ("ngram", "eagle3", "methods"):
        for label, r in res.get(name, {}).get("rows", {}).items():
            if "error" in r:  # a method vLLM's build cannot run (recorded in the report)
                continue
            z = (r.get("vllm") or r)["exact"]["z"]
            if not math.isnan(z) and abs(z) > 4:
                failed.append(f"{name} {label}: exact z {z:+.2f}")
    for k, r in res.get("dist", {}).items():
        if isinstance(r, dict) and r.get("reject"):
            failed.append(f"dist {k}: p = {r['pvalue']:.3g}")
    if failed:
        print("FAILED: " + "; ".join(failed))
        return 1
    print("vllm_engine: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
