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
                    generation takes one sequence at a time, so the assisted side runs ``n`` calls per prompt.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.rules import Rule, SpS
from ..core.sampling import SAMPLING

__all__ = ["EngineOptions", "EngineRun", "ENGINES", "loop_engine", "transformers_engine", "first_layers"]


@dataclass(frozen=True)
class EngineOptions:
    """What every engine reads. ``rule`` (a Rule; SpS: lossless), ``k`` drafts per step (for transformers:
    ``num_assistant_tokens``, constant schedule, no confidence stop), ``tree`` (loop only: a tree for
    ``tree_generate``, e.g. ``core.tree.BudgetTree(8, 4, 2)``, with ``tree_scheme``), ``max_new_tokens``, the
    sampling transforms, ``batch_size`` (decodes run together; transformers' assisted side runs one at a time),
    ``chat`` (wrap text prompts in the chat template), ``assistant_layers`` (transformers: the assistant's
    depth)."""

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


@dataclass
class EngineRun:
    """Two generators for ``check_generation`` and what they are: ``label_a`` / ``label_b`` and ``notes``
    (models built on the fly, settings that differ from the options)."""

    generate_a: Callable
    generate_b: Callable
    label_a: str
    label_b: str
    notes: list = field(default_factory=list)


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
                     [f"pair: {pair.name}; batches of {opts.batch_size} decodes (ragged prompts share batches)"])


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
    ``assistant`` (default ``first_layers(model, opts.assistant_layers)``). Seeds: torch's global RNG seeded
    with ``seed`` at the start of each generator call (and restored afterwards)."""
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
                if assisted:  # one sequence per call: transformers' assisted generation takes batch 1
                    for _ in range(n):
                        seq = model.generate(x, attention_mask=mask, assistant_model=assistant, **kw)
                        out.append(_cut(seq[0, len(p):].tolist(), eos))
                else:
                    for s in range(0, n, opts.batch_size):
                        m = min(opts.batch_size, n - s)
                        seq = model.generate(x.repeat(m, 1), attention_mask=mask.repeat(m, 1), **kw)
                        out += [_cut(r[len(p):].tolist(), eos) for r in seq]
        return out

    notes.append(f"k = {opts.k} assistant tokens per step (constant schedule, no confidence stop); sampling "
                 f"temperature {opts.temperature}, top-k {opts.top_k}, top-p {opts.top_p} on both sides")
    return EngineRun(lambda p, n, s: run(p, n, s, True), lambda p, n, s: run(p, n, s, False),
                     "transformers generate(assistant_model=...)", "transformers generate", notes)


ENGINES = {"loop": loop_engine, "transformers": transformers_engine}
