"""The project's models in the folder layouts vLLM loads: the embedded verifier (a quantised GGUF file)
as a plain safetensors Llama folder, and the project's draft as an EAGLE-3 folder.

vLLM can read some GGUF files itself, but its CPU build does not run GGUF-quantised weights, and the
project's own loop computes with the de-quantised float weights that transformers makes of the GGUF
file. ``export_verifier`` writes exactly those weights: transformers de-quantises the GGUF file, its
state dict is copied into a ``LlamaForCausalLM`` built from the same config without the
``quantization_config`` entry, and that model is saved (float32 safetensors, tokenizer, generation
config). So vLLM and ``speculative_generate`` run the same numbers.

Both exports are idempotent: a folder holds a stamp (``cactus_theory_export.json``, written last and
atomically) naming its source; a folder whose stamp matches is reused as it is, an interrupted export
(no stamp) is redone.

    python -m cactus_theory.integrations.vllm_models verifier FOLDER
    python -m cactus_theory.integrations.vllm_models draft DRAFT_FILE FOLDER
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch

from ..util.atomic import atomic_write_json

__all__ = ["export_verifier", "export_draft", "STAMP", "is_exported"]

STAMP = "cactus_theory_export.json"
_EXPORT_VERSION = 1


def _file_digest(path: str, chunk: int = 1 << 22) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()[:16]


def is_exported(folder: str, source: dict) -> bool:
    """True when ``folder`` holds a finished export of ``source`` (its stamp matches)."""
    try:
        with open(os.path.join(folder, STAMP), encoding="utf-8") as f:
            return json.load(f) == source
    except (OSError, ValueError):
        return False


def _start_export(folder: str, source: dict, force: bool) -> str | None:
    """None when ``folder`` already holds a finished export of ``source`` (and not ``force``); else
    the stamp's path, the old stamp removed first, so an interrupted export is never taken as done
    (the stamp is written last)."""
    if not force and is_exported(folder, source):
        return None
    os.makedirs(folder, exist_ok=True)
    stamp = os.path.join(folder, STAMP)
    if os.path.exists(stamp):
        os.remove(stamp)
    return stamp


def export_verifier(folder: str, model: str = "smollm2", force: bool = False) -> str:
    """Write ``model`` (default: the embedded SmolLM2 GGUF) to ``folder`` as a float32 safetensors
    Llama folder vLLM loads; returns ``folder``. Reuses a finished export of the same file."""
    from transformers import AutoModelForCausalLM

    from ..lm.pair import load_model, smollm2_file

    if not isinstance(folder, str) or not folder:
        raise ValueError(f"folder must be a non-empty path, got {folder!r}")
    if model == "smollm2":
        src = os.path.join(*smollm2_file())
    elif isinstance(model, str) and model.endswith(".gguf") and os.path.isfile(model):
        src = os.path.abspath(model)
    else:
        raise ValueError(f"model must be 'smollm2' or an existing .gguf file, got {model!r}")
    source = {"kind": "verifier", "file": os.path.basename(src), "sha1": _file_digest(src),
              "version": _EXPORT_VERSION}
    stamp = _start_export(folder, source, force)
    if stamp is None:
        return folder
    gguf_model, tok = load_model(model if model != "smollm2" else "smollm2", dtype=torch.float32)
    cfg = gguf_model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg["dtype"] = "float32"
    config = type(gguf_model.config).from_dict(cfg)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"GGUF state dict does not fit the plain model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    plain.generation_config = gguf_model.generation_config
    plain.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    atomic_write_json(stamp, source)
    return folder


def export_draft(draft_file: str, folder: str, dtype: torch.dtype = torch.float32, force: bool = False) -> str:
    """Write the project's draft (a ``FeatureDraft`` file written by ``cactus-theory build-draft`` or
    ``draft_build.build_draft``) to ``folder`` as an EAGLE-3 folder (``draft.export_eagle3``); the
    head's shared token embedding is the verifier's, which vLLM shares when the folder has none."""
    from ..lm.draft import export_eagle3, load_draft
    from ..lm.pair import load_model

    if not isinstance(draft_file, str) or not os.path.isfile(draft_file):
        raise ValueError(f"draft_file must be an existing draft file (.pt), got {draft_file!r}")
    source = {"kind": "eagle3", "file": os.path.basename(draft_file), "sha1": _file_digest(draft_file),
              "dtype": str(dtype), "version": _EXPORT_VERSION}
    stamp = _start_export(folder, source, force)
    if stamp is None:
        return folder
    verifier, _ = load_model("smollm2", dtype=torch.float32)
    head = load_draft(verifier, path=draft_file)
    export_eagle3(head.float(), folder, dtype=dtype)
    atomic_write_json(stamp, source)
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cactus_theory.integrations.vllm_models",
                                 description="export the project's models in vLLM's folder layouts")
    sub = ap.add_subparsers(dest="what", required=True)
    v = sub.add_parser("verifier", help="the embedded SmolLM2 (GGUF) as a safetensors Llama folder")
    v.add_argument("folder")
    v.add_argument("--model", default="smollm2", help="'smollm2' or a .gguf file")
    v.add_argument("--force", action="store_true")
    d = sub.add_parser("draft", help="a FeatureDraft file as an EAGLE-3 folder")
    d.add_argument("draft_file")
    d.add_argument("folder")
    d.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.what == "verifier":
            print(export_verifier(args.folder, args.model, force=args.force))
        else:
            print(export_draft(args.draft_file, args.folder, force=args.force))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
