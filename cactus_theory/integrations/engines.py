"""The engines ``cactus-theory check-engine`` judges, one function per engine, as pairs of whole-decode generators.

Each engine function takes ``EngineOptions`` (and, optionally, models already loaded) and returns an
``EngineRun``: ``generate_a`` (the engine with speculation) and ``generate_b`` (the same engine without it),
each ``generate(prompts, n, seed) -> list of token-id lists`` (``n`` decodes per prompt, prompt order, the
generated tokens only, EOS included when emitted), as ``theory.check_generation`` takes them; their labels;
and notes on anything built on the fly. ``ENGINES`` maps the command's ``--engine`` names to the functions:
an engine added later is one function and one entry.

  ``loop``          our speculative loop (``lm.loop.speculative_generate``, or ``tree_generate`` with a tree;
                    any registry rule) against the verifier alone (``autoregressive_generate``) on a
                    ``ModelPair`` (default: SmolLM2-135M-Instruct and the embedded draft).
  ``transformers``  Hugging Face ``generate(assistant_model=..., do_sample=True, temperature, top_k, top_p)``
                    against plain ``generate`` with the same sampling, on the verifier; the assistant is a real
                    causal LM with the verifier's tokenizer: its first ``assistant_layers`` decoder layers with
                    its final norm and LM head (``first_layers``), made on the fly. transformers' assisted
                    generation takes one sequence at a time, so both sides run one sequence per ``generate``
                    call (equal batch sizes: a difference cannot come from batching alone).
  ``vllm``          vLLM's offline ``LLM.generate`` with speculative decoding (``spec``: vLLM's n-gram lookup, or
                    EAGLE-3 with the project's draft exported for vLLM) against the same vLLM without it, on the
                    verifier (default: the embedded SmolLM2, exported once to a float32 folder). vLLM is imported
                    only here, so the rest of the table runs without it. Each decode is its own request with its
                    own seed (``SamplingParams.seed``, from ``request_seeds``): decodes are independent and a
                    decode's tokens depend on its seed only.
  ``llamacpp``      llama.cpp through llama-cpp-python (``make llamacpp-env``): ``Llama.generate`` with its
                    prompt-lookup speculation (``LlamaPromptLookupDecoding``, ``k`` tokens, n-grams up to 2;
                    sample-and-match verification) against the same ``Llama.generate`` without a draft model, on the
                    verifier's GGUF file (the embedded SmolLM2 as shipped, or a float32 / bfloat16 copy written by
                    llama.cpp's own quantizer), one decode at a time on both sides (``integrations.llamacpp``). Its
                    run also carries the planted negative control (``generate_planted``, ``plant_size``).

``ENGINE_CAPS`` declares what each engine can do (any rule or only its own lossless one, trees, the module it
needs, a planted negative control); ``cactus-theory check-engine`` reads these flags, never an engine's type.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.rules import Rule, SpS
from ..core.sampling import SAMPLING
from ..util.environ import environment
from .llamacpp import LLAMACPP_HINT, PLANT
from .seeds import request_seeds

__all__ = ["EngineOptions", "EngineRun", "EngineCaps", "ENGINES", "ENGINE_CAPS", "engine_problem", "llamacpp_engine",
           "loop_engine", "transformers_engine", "vllm_engine", "first_layers", "request_seeds", "vllm_problem",
           "vllm_speculative_config", "vllm_verifier_dir", "vllm_draft_dir", "plugin_environment", "VLLM_SPECS",
           "VLLM_PLUGIN_MODES", "VLLM_HINT"]

VLLM_HINT = "run `make vllm-env` and use .venv-vllm/bin/cactus-theory"
VLLM_SPECS = ("ngram", "eagle3")
VLLM_PLUGIN_MODES = ("none", "fixes")
VLLM_NGRAM_LOOKUP = (1, 4)  # prompt_lookup_min, prompt_lookup_max (benchmarks/vllm_engine.py's NGRAM)
PROJECT_PLUGIN = "cactus_theory"  # the project's vllm.general_plugins entry point (integrations.vllm)


@dataclass(frozen=True)
class EngineOptions:
    """What every engine reads. ``rule`` (a Rule; SpS: lossless), ``k`` drafts per step (for transformers:
    ``num_assistant_tokens``, constant schedule, no confidence stop), ``tree`` (loop only: a tree for
    ``tree_generate``, e.g. ``core.tree.BudgetTree(8, 4, 2)``, with ``tree_scheme``), ``max_new_tokens``, the
    sampling transforms, ``batch_size`` (decodes run together; transformers runs both sides one at a time),
    ``chat`` (wrap text prompts in the chat template), ``assistant_layers`` (transformers: the assistant's
    depth); vLLM: ``spec`` (``"ngram"`` or ``"eagle3"``), ``draft_sampling`` (EAGLE-3's
    ``draft_sample_method``: vLLM's default ``"greedy"``, argmax drafts, or ``"probabilistic"``) and
    ``vllm_plugin`` (``"none"``: vLLM as shipped, the project's plugin not loaded; ``"fixes"``: the project's
    plugin loaded without a rule, i.e. vLLM's own rejection sampling with the plugin's CPU fixes, docs/vllm.md)."""

    rule: Rule = field(default_factory=SpS)
    k: int = 4
    tree: object = None
    tree_scheme: str = "deterministic"
    max_new_tokens: int = 32
    temperature: float = SAMPLING.temperature
    top_k: int = SAMPLING.top_k
    top_p: float = SAMPLING.top_p
    batch_size: int = 32
    chat: bool = True
    assistant_layers: int = 4
    spec: str | None = None
    draft_sampling: str = "greedy"
    vllm_plugin: str = "none"
    plant_temperature: float = 1.0


@dataclass(frozen=True)
class EngineCaps:
    """What an engine declares: ``rules`` (it runs any registry rule; False: it verifies with its own lossless
    rule, so only ``SpS`` describes it), ``trees`` (it drafts trees), ``module`` (the Python module it runs on,
    found without importing it; None: the project's own code) with ``hint`` (how to get it), ``own_loader`` (it
    loads its models itself from the model arguments; False: the project loads them with torch and passes
    them), ``drafts`` (what ``--draft`` names for it, None: it takes no ``--draft``) and ``negative_control`` (the
    planted bug its ``EngineRun`` carries as ``generate_planted``, None: none)."""

    rules: bool
    trees: bool
    module: str | None = None
    hint: str | None = None
    own_loader: bool = False
    drafts: str | None = None
    negative_control: str | None = None


@dataclass
class EngineRun:
    """Two generators for ``check_generation`` and what they are: ``label_a`` / ``label_b`` and ``notes``
    (models built on the fly, settings that differ from the options); ``close`` (if any) releases what the
    generators hold (vLLM's engine processes); ``batch_sizes``: the decodes each side runs together (at most),
    equal on both sides for every engine here, so that a difference is not batching alone. An engine that
    declares a negative control also gives ``generate_planted`` (side a with the planted bug, the same signature),
    ``plant_label`` and ``plant_size`` (``plant_size(prompts, decodes_a, decodes_b, n, positions, min_count) ->
    dict``: the bug's size at the prefixes the check compared)."""

    generate_a: Callable
    generate_b: Callable
    label_a: str
    label_b: str
    notes: list = field(default_factory=list)
    close: Callable | None = None
    batch_sizes: tuple = (None, None)
    generate_planted: Callable | None = None
    plant_label: str | None = None
    plant_size: Callable | None = None


def _expand(prompts, n: int) -> list:
    return [p for p in prompts for _ in range(n)]


def loop_engine(opts: EngineOptions, pair=None) -> EngineRun:
    """Our loop (chain, or ``opts.tree``) under ``opts.rule`` against the verifier alone, on ``pair`` (default
    ``lm.pair.load_pair()``: SmolLM2-135M-Instruct and the embedded draft)."""
    from ..lm.loop import autoregressive_generate, speculative_generate, tree_generate

    if pair is None:
        from ..lm.pair import load_pair

        pair = load_pair()
    sampling = dict(temperature=opts.temperature, top_k=opts.top_k, top_p=opts.top_p)
    common = dict(max_new_tokens=opts.max_new_tokens, batch_size=opts.batch_size, chat=opts.chat, **sampling)

    def speculative(prompts, n, seed):
        if opts.tree is not None:
            return tree_generate(pair, _expand(prompts, n), opts.rule, opts.tree, scheme=opts.tree_scheme, seed=seed,
                                 **common).tokens
        return speculative_generate(pair, _expand(prompts, n), opts.rule, k=opts.k, seed=seed, track_kl=False,
                                    **common).tokens

    def plain(prompts, n, seed):
        return autoregressive_generate(pair, _expand(prompts, n), seed=seed, **common).tokens

    what = (f"tree {opts.tree!r} ({opts.tree_scheme})" if opts.tree is not None else f"chain k = {opts.k}")
    return EngineRun(speculative, plain, f"loop {opts.rule!r}, {what}", "loop, verifier alone",
                     [f"pair: {pair.name}; batches of {opts.batch_size} decodes (ragged prompts share batches)"],
                     batch_sizes=(opts.batch_size, opts.batch_size))


def first_layers(model, layers: int):
    """A copy of a Llama-family causal LM (``model.model.layers``) keeping its first ``layers`` decoder layers
    and its final norm and LM head: a real assistant with the model's tokenizer, made on the fly."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ValueError(f"first_layers needs a Llama-family causal LM (model.model.layers), got {type(model).__name__}")
    total = len(inner.layers)
    if not 1 <= layers < total:
        raise ValueError(f"assistant_layers must be in [1, {total - 1}] for a verifier of {total} layers, got {layers}")
    a = copy.deepcopy(model)
    a.model.layers = a.model.layers[:layers]
    a.config.num_hidden_layers = layers
    if getattr(a.config, "layer_types", None) is not None:
        a.config.layer_types = list(a.config.layer_types)[:layers]
    return a.eval()


def _encode(tokenizer, prompts, chat: bool) -> list[list[int]]:
    if all(isinstance(p, str) for p in prompts):
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer; pass token-id lists")
        from ..lm.data import encode_prompts

        return encode_prompts(tokenizer, list(prompts), chat=chat)
    return [[int(t) for t in p] for p in prompts]


def _cut(row: list[int], eos: int | None) -> list[int]:
    return row[:row.index(eos) + 1] if eos is not None and eos in row else row


def transformers_engine(opts: EngineOptions, model=None, tokenizer=None, assistant=None) -> EngineRun:
    """transformers' assisted ``generate`` (SpS, its own verification) against plain ``generate``, both with
    ``do_sample=True`` and the options' sampling, on ``model`` (default: SmolLM2-135M-Instruct, loaded), with
    ``assistant`` (default ``first_layers(model, opts.assistant_layers)``). Both sides run one sequence per
    ``generate`` call (assisted generation takes batch 1; ``opts.batch_size`` is not used), so the two sides
    differ in the assistant only. Seeds: torch's global RNG seeded with ``seed`` at the start of each generator
    call (and restored afterwards)."""
    import torch

    if not isinstance(opts.rule, SpS):
        raise ValueError(f"the transformers engine verifies with its own rule (SpS); got rule {opts.rule!r}")
    if opts.tree is not None:
        raise ValueError("the transformers engine drafts chains only: no tree")
    if opts.temperature <= 0:
        raise ValueError(f"the transformers engine samples (do_sample=True): temperature must be > 0, got {opts.temperature}")
    notes = []
    if model is None:
        from ..lm.pair import SMOLLM2, load_model

        model, tokenizer = load_model(SMOLLM2)
    model = model.eval()
    if assistant is None:
        assistant = first_layers(model, opts.assistant_layers)
        notes.append(f"assistant: the verifier's first {opts.assistant_layers} of {len(model.model.layers)} decoder "
                     f"layers with its final norm and LM head, made on the fly (shares its tokenizer)")
    g = assistant.generation_config
    g.num_assistant_tokens, g.num_assistant_tokens_schedule, g.assistant_confidence_threshold = opts.k, "constant", 0.0
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else model.generation_config.eos_token_id
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    pad = eos if eos is not None else 0
    kw = dict(do_sample=True, temperature=opts.temperature, top_k=opts.top_k, top_p=opts.top_p,
              max_new_tokens=opts.max_new_tokens, pad_token_id=pad, eos_token_id=eos)

    def run(prompts, n, seed, assisted: bool):
        ids = _encode(tokenizer, prompts, opts.chat)
        out = []
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(int(seed))
            for p in ids:
                x = torch.tensor([p], device=model.device)
                mask = torch.ones_like(x)
                extra = dict(assistant_model=assistant) if assisted else {}
                for _ in range(n):  # one sequence per call on both sides: assisted generation takes batch 1
                    seq = model.generate(x, attention_mask=mask, **extra, **kw)
                    out.append(_cut(seq[0, len(p):].tolist(), eos))
        return out

    import transformers

    notes.append(f"transformers {transformers.__version__}, torch {torch.__version__}")
    notes.append(f"k = {opts.k} assistant tokens per step (constant schedule, no confidence stop); sampling "
                 f"temperature {opts.temperature}, top-k {opts.top_k}, top-p {opts.top_p} on both sides")
    notes.append("batch 1 on both sides: one sequence per generate call (assisted generation takes one)")
    return EngineRun(lambda p, n, s: run(p, n, s, True), lambda p, n, s: run(p, n, s, False),
                     "transformers generate(assistant_model=...)", "transformers generate", notes, batch_sizes=(1, 1))


def vllm_problem() -> str | None:
    """Why ``--engine vllm`` cannot run in this Python (one line naming the fix), or None. Finds the package
    without importing it (vLLM's import takes seconds)."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):  # a module entry of None (blocked), or a broken package
        found = False
    if found:
        return None
    return f"--engine vllm needs vLLM, which this Python ({sys.executable}) cannot import: {VLLM_HINT}"


def vllm_speculative_config(opts: EngineOptions, draft_dir: str | None = None) -> dict:
    """vLLM's ``speculative_config`` for ``opts.spec``: n-gram lookup (``prompt_lookup_min`` 1, ``max`` 4, as
    benchmarks/vllm_engine.py) or EAGLE-3 from ``draft_dir`` with ``draft_sample_method=opts.draft_sampling``;
    ``opts.k`` drafted tokens per step."""
    if opts.spec == "ngram":
        lo, hi = VLLM_NGRAM_LOOKUP
        return {"method": "ngram", "num_speculative_tokens": opts.k, "prompt_lookup_min": lo, "prompt_lookup_max": hi}
    if opts.spec == "eagle3":
        if not draft_dir:
            raise ValueError("spec 'eagle3' needs the draft's EAGLE-3 folder")
        if opts.draft_sampling not in ("greedy", "probabilistic"):
            raise ValueError(f"draft_sampling must be 'greedy' or 'probabilistic', got {opts.draft_sampling!r}")
        return {"method": "eagle3", "model": draft_dir, "num_speculative_tokens": opts.k,
                "draft_sample_method": opts.draft_sampling}
    raise ValueError(f"the vllm engine needs spec in {VLLM_SPECS}, got {opts.spec!r}")


def vllm_verifier_dir(verifier: str) -> str:
    """A folder vLLM loads: the embedded SmolLM2 or a .gguf file exported once (``vllm_models.export_verifier``,
    reused while its source is unchanged) into the project's cache; a folder or hub id as given."""
    from ..lm.draft import cache_dir, verifier_tag
    from .vllm_models import export_verifier

    if verifier == "smollm2" or verifier.endswith(".gguf"):
        return export_verifier(os.path.join(cache_dir(), "vllm", verifier_tag(verifier)), model=verifier)
    return verifier


def vllm_draft_dir(draft: str, verifier: str) -> str:
    """The EAGLE-3 folder of ``draft``: ``"embedded"`` (the project's draft for SmolLM2) or a draft file
    (``.pt``), exported once into the project's cache (``vllm_models.export_draft``, float32); a folder
    holding ``config.json`` as given (an EAGLE-3 folder for ``verifier``)."""
    from ..lm.draft import MissingDraftError, cache_dir
    from ..lm.pair import embedded_draft_path
    from .vllm_models import export_draft

    if os.path.isdir(draft):
        if not os.path.isfile(os.path.join(draft, "config.json")):
            raise ValueError(f"--draft {draft!r}: an EAGLE-3 folder needs a config.json")
        return draft
    if verifier != "smollm2":
        raise ValueError(f"--draft {draft!r}: the project's drafts are exported for the embedded SmolLM2 only; for "
                         f"--verifier {verifier!r} give an EAGLE-3 folder")
    path = embedded_draft_path() if draft == "embedded" else draft
    if not os.path.isfile(path):
        if draft == "embedded":
            raise MissingDraftError.not_built(path)
        raise ValueError(f"--draft {draft!r}: no such draft file")
    tag = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:8]
    return export_draft(path, os.path.join(cache_dir(), "vllm", f"eagle3-{tag}"))


def plugin_environment(mode: str) -> dict:
    """``VLLM_PLUGINS`` for ``mode``: every installed ``vllm.general_plugins`` entry point, less the project's
    (``"none"``) or with it (``"fixes"``, refused when it is not installed)."""
    from importlib.metadata import entry_points

    names = sorted({e.name for e in entry_points(group="vllm.general_plugins")})
    if mode == "fixes" and PROJECT_PLUGIN not in names:
        raise ValueError(f"--vllm-plugin fixes needs the project's vLLM plugin (entry point {PROJECT_PLUGIN!r}), which "
                         f"is not installed in this Python: {VLLM_HINT}")
    return {"VLLM_PLUGINS": ",".join(n for n in names if mode == "fixes" or n != PROJECT_PLUGIN)}


def vllm_engine(opts: EngineOptions, verifier: str = "smollm2", draft: str = "embedded", dtype: str = "float32",
                threads: int | None = None) -> EngineRun:
    """vLLM's ``LLM.generate`` with ``opts.spec`` speculative decoding (``vllm_speculative_config``) against the
    same engine without speculation, both with the options' sampling (``SamplingParams`` temperature, top-k,
    top-p; temperature 0 is vLLM's greedy decoding), ``max_tokens = opts.max_new_tokens``, vLLM's own EOS
    stop (the EOS token is in ``token_ids``). ``verifier``: ``"smollm2"`` (the embedded model) or a .gguf file,
    exported once; a folder or hub id as given. ``draft`` (EAGLE-3): ``"embedded"``, a draft file or an EAGLE-3
    folder. ``opts.vllm_plugin`` chooses whether the project's plugin loads (``plugin_environment``);
    ``threads``: vLLM's CPU worker runs that many OpenMP threads, unpinned
    (``VLLM_CPU_OMP_THREADS_BIND=nobind``); ``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 (GiB) per engine.

    Each engine starts on its generator's first call (a few seconds to a minute on CPU; its token budget per
    step holds every running request's whole prompt, since vLLM's CPU build cannot split a seeded request's
    prefill: docs/vllm.md limitation 9) and stays up until ``close``. Each decode is its own request: decode
    ``j`` of prompt ``i`` has seed ``request_seeds(seed, len(prompts) * n)[i * n + j]``."""
    problem = vllm_problem()
    if problem:
        raise ValueError(problem)
    if not isinstance(opts.rule, SpS):
        raise ValueError(f"the vllm engine verifies with its own rejection sampling (SpS); got rule {opts.rule!r}")
    if opts.tree is not None:
        raise ValueError("the vllm engine drafts chains only: no tree")
    if opts.vllm_plugin not in VLLM_PLUGIN_MODES:
        raise ValueError(f"vllm_plugin must be one of {VLLM_PLUGIN_MODES}, got {opts.vllm_plugin!r}")
    if opts.spec not in VLLM_SPECS:
        raise ValueError(f"the vllm engine needs spec in {VLLM_SPECS}, got {opts.spec!r}")
    try:
        import vllm
        from vllm import LLM, SamplingParams
    except ImportError as e:
        raise ValueError(f"--engine vllm: importing vLLM failed ({e}): {VLLM_HINT}") from None
    from transformers import AutoTokenizer

    env = plugin_environment(opts.vllm_plugin)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    if threads:
        env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS=str(threads))
    model_dir = vllm_verifier_dir(verifier)
    draft_dir = vllm_draft_dir(draft, verifier) if opts.spec == "eagle3" else None
    spec = vllm_speculative_config(opts, draft_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engines: dict = {}

    def engine(which: str, ids: list[list[int]]):
        longest = max(len(p) for p in ids)
        if which in engines:
            llm, budget = engines[which]
            if longest > budget:
                raise ValueError(f"a prompt of {longest} tokens is longer than the {budget} this engine was started "
                                 f"for (its first call's longest); start a new engine")
            return llm
        per_request = longest + 2 * opts.k + 2
        kw = dict(model=model_dir, dtype=dtype, enforce_eager=True, seed=0, disable_log_stats=True,
                  max_model_len=longest + opts.max_new_tokens + 2 * opts.k + 8, max_num_seqs=opts.batch_size,
                  max_num_batched_tokens=max(4096, opts.batch_size * per_request))
        if which == "spec":
            kw["speculative_config"] = spec
        with environment(env, unset=("CACTUS_THEORY_RULE",)):
            llm = LLM(**kw)
        engines[which] = (llm, longest)
        return llm

    top_k = opts.top_k if opts.top_k and opts.top_k > 0 else -1

    def run(prompts, n, seed, which):
        ids = _encode(tokenizer, prompts, opts.chat)
        expanded = _expand(ids, n)
        llm = engine(which, ids)
        params = [SamplingParams(temperature=opts.temperature, top_k=top_k, top_p=opts.top_p,
                                 max_tokens=opts.max_new_tokens, seed=s)
                  for s in request_seeds(int(seed), len(expanded))]
        outs = llm.generate([{"prompt_token_ids": p} for p in expanded], params, use_tqdm=False)
        return [[int(t) for t in o.outputs[0].token_ids] for o in outs]

    def close():
        for llm, _ in engines.values():
            with contextlib.suppress(Exception):  # best effort: the engine process may be gone already
                llm.llm_engine.engine_core.shutdown()
        engines.clear()

    what = ("n-gram lookup" if opts.spec == "ngram" else f"EAGLE-3 ({opts.draft_sampling} drafts)")
    plugin = ("as shipped (the project's plugin not loaded)" if opts.vllm_plugin == "none" else
              "with the project's plugin loaded without a rule (vLLM's own rejection sampling, the plugin's CPU fixes)")
    notes = [f"vLLM {vllm.__version__}, {plugin}; VLLM_PLUGINS={env['VLLM_PLUGINS']!r}",
             f"speculative_config {spec}" + (f" (draft {draft!r})" if draft_dir else ""),
             f"verifier folder {model_dir} ({dtype}); up to {opts.batch_size} requests per step; one request per decode, "
             f"seeds request_seeds(seed, len(prompts) * n)",
             f"sampling temperature {opts.temperature}, top-k {opts.top_k}, top-p {opts.top_p} on both sides"]
    if opts.spec == "eagle3" and opts.draft_sampling == "probabilistic":
        notes.append("vLLM draws sampled drafts without the request's generator (docs/vllm.md limitation 7): the "
                     "speculative side's decodes are independent but not reproducible from their seeds")
    return EngineRun(lambda p, n, s: run(p, n, s, "spec"), lambda p, n, s: run(p, n, s, "plain"),
                     f"vLLM {vllm.__version__} {what}, k = {opts.k}", f"vLLM {vllm.__version__} without speculation",
                     notes, close, batch_sizes=(opts.batch_size, opts.batch_size))


def llamacpp_engine(opts: EngineOptions, verifier: str = "smollm2", dtype: str | None = None,
                    threads: int | None = None, tokenizer=None) -> EngineRun:
    """llama.cpp's ``Llama.generate`` with prompt-lookup speculation (``opts.k`` tokens) against the same without a
    draft model, both with the options' sampling through llama.cpp's own sampler chain (min-p 0, typical-p 1, no
    repetition penalty), one decode at a time, on ``verifier``'s GGUF file (``"smollm2"``: the embedded file;
    ``dtype`` None: as it is, ``"float32"`` / ``"bfloat16"``: a copy in that precision written by llama.cpp's
    quantizer), ``threads`` llama.cpp threads (prompt and generation). Prompts are encoded by the project
    (``lm.data.encode_prompts``, the model's chat template) and handed over as token ids. The run carries the
    planted negative control (``integrations.llamacpp.PLANT``) at ``opts.plant_temperature``."""
    from . import llamacpp as L

    caps = ENGINE_CAPS["llamacpp"]
    problem = engine_problem("llamacpp")
    if problem:
        raise ValueError(problem)
    _refuse_beyond_caps("llamacpp", opts)
    if not opts.plant_temperature > 0 or opts.plant_temperature == opts.temperature:
        raise ValueError(f"plant_temperature must be > 0 and differ from the temperature {opts.temperature}, got "
                         f"{opts.plant_temperature}")
    import llama_cpp

    path = L.converted_gguf(L.gguf_path(verifier), dtype)
    if tokenizer is None:
        tokenizer = L.tokenizer_for(verifier)
    eng = L.LlamaCppEngine(path, opts.k, opts.max_new_tokens, opts.temperature, opts.top_k, opts.top_p, threads,
                           opts.plant_temperature)

    def side(which):
        return lambda prompts, n, seed: eng.generate(_encode(tokenizer, prompts, opts.chat), n, seed, which)

    def size(prompts, decodes_a, decodes_b, n, positions, min_count):
        ids = _encode(tokenizer, prompts, opts.chat)
        return eng.plant_size(ids, L.tested_prefixes(decodes_a, decodes_b, n, positions, min_count))

    plant = (f"{caps.negative_control}: every token drawn from the logits after an accepted draft token (the check of "
             f"the next draft, or the bonus) drawn at temperature {opts.plant_temperature:g} instead of "
             f"{opts.temperature:g}")
    notes = [f"llama-cpp-python {llama_cpp.__version__}, GGUF {os.path.basename(path)}"
             + (f" (written from the shipped file by llama.cpp's quantizer, all tensors {dtype})" if dtype else
                " (as shipped)") + (f", {threads} threads" if threads else ""),
             f"speculation: LlamaPromptLookupDecoding(max_ngram_size={L.LOOKUP_NGRAM}, num_pred_tokens={opts.k}), "
             "sample-and-match verification (llama_cpp/llama.py Llama.generate)",
             f"sampling through llama.cpp's chain on both sides: top-k {opts.top_k}, top-p {opts.top_p} (on the "
             f"untempered logits), then temperature {opts.temperature}; min-p 0, typical-p 1, repeat penalty 1",
             "one decode at a time on both sides (the binding runs one sequence); decode j of prompt i seeded "
             "request_seeds(seed, len(prompts) * n)[i * n + j]"]
    return EngineRun(side("lookup"), side("plain"), f"llama.cpp prompt lookup, k = {opts.k}",
                     "llama.cpp without speculation", notes, eng.close, batch_sizes=(1, 1),
                     generate_planted=side("planted"), plant_label=plant, plant_size=size)


def _refuse_beyond_caps(name: str, opts: EngineOptions) -> None:
    """``ValueError`` when ``opts`` asks engine ``name`` for more than ``ENGINE_CAPS`` declares."""
    caps = ENGINE_CAPS[name]
    if not caps.rules and repr(opts.rule) != repr(SpS()):
        raise ValueError(f"the {name} engine verifies with its own lossless rule (SpS only); got rule {opts.rule!r}")
    if not caps.trees and opts.tree is not None:
        raise ValueError(f"the {name} engine drafts chains only: no tree")


def engine_problem(name: str) -> str | None:
    """Why engine ``name`` cannot run in this Python (one line naming ``ENGINE_CAPS[name].hint``), or None; the
    module is found without importing it."""
    caps = ENGINE_CAPS[name]
    if caps.module is None:
        return None
    try:
        found = importlib.util.find_spec(caps.module) is not None
    except (ImportError, ValueError):  # a module entry of None (blocked), or a broken package
        found = False
    if found:
        return None
    return f"--engine {name} needs the module {caps.module!r}, which this Python ({sys.executable}) cannot import: {caps.hint}"


ENGINES = {"loop": loop_engine, "transformers": transformers_engine, "vllm": vllm_engine, "llamacpp": llamacpp_engine}
ENGINE_CAPS = {
    "loop": EngineCaps(rules=True, trees=True, drafts="'embedded', 'smollm2', a .gguf file, a folder or a hub id"),
    "transformers": EngineCaps(rules=False, trees=False),
    "vllm": EngineCaps(rules=False, trees=False, module="vllm", hint=VLLM_HINT, own_loader=True,
                       drafts="--spec eagle3: 'embedded', a draft file (.pt) or an EAGLE-3 folder"),
    "llamacpp": EngineCaps(rules=False, trees=False, module="llama_cpp", hint=LLAMACPP_HINT, own_loader=True,
                           negative_control=PLANT),
}
