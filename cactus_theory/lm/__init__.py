"""Language models: (draft, verifier) pairs, sampling transforms, batched speculative decoding.

The names below load their submodule (and torch, transformers) on first use, so that
``cactus-theory decode --help`` and its argument checks answer without loading them.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "DecodeResult": ".metrics", "DecodeStats": ".metrics", "SequenceCounters": ".metrics",
    "autoregressive_generate": ".loop", "speculative_generate": ".loop", "tree_generate": ".loop", "SAMPLING": ".loop",
    "ModelPair": ".pair", "check_same_tokenizer": ".pair", "load_model": ".pair", "load_pair": ".pair",
    "sampling_probs": "..core.transforms", "DraftStop": "..core.draft_stop",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
