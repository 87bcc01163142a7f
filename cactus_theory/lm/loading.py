"""Before and while models load: the check of a model argument (a path that does not exist is
refused before anything loads) and a context that silences transformers' warnings and progress bars.
Imports neither torch nor transformers at import time."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

__all__ = ["check_model", "quiet_transformers", "GGUF_MAGIC"]


GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file


def check_model(spec: str, flag: str) -> None:
    """A model argument (``--draft`` / ``--verifier``) names the embedded pair, a .gguf file, a local
    model folder, or a hub id ("org/name"), checked before anything loads (cheaply: a file's first bytes,
    a folder's listing): a path that does not exist, a file that is not GGUF (its magic ``b"GGUF"``), or a
    folder without ``config.json`` (what transformers reads first) is refused (``ValueError`` naming
    ``flag``). A hub id is not looked up here."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"{flag} must name a model, got {spec!r}")
    if spec in ("smollm2", "embedded"):
        return
    if spec.endswith(".gguf") and not os.path.isfile(spec):
        raise ValueError(f"{flag} {spec!r}: no such .gguf file")
    path = os.path.expanduser(spec)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            head = f.read(len(GGUF_MAGIC))
        if head != GGUF_MAGIC:
            raise ValueError(f"{flag} {spec!r} is a file but not a GGUF model (it starts with {head!r}, not "
                             f"{GGUF_MAGIC!r}): give a .gguf file, a model folder with config.json, or a hub id")
        if not spec.endswith(".gguf"):
            raise ValueError(f"{flag} {spec!r}: a GGUF file must be named *.gguf (how the loaders tell it from a "
                             "folder or a hub id)")
        return
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"{flag} {spec!r}: a folder without config.json is not a model folder (transformers "
                             "reads its config.json first)")
        return
    looks_local = spec.startswith((".", "/", "~", os.sep)) or spec.count("/") > 1  # a hub id is "org/name"
    if looks_local:
        raise ValueError(f"{flag} {spec!r}: no such file or folder")


@contextlib.contextmanager
def quiet_transformers(verbose: bool = False):
    """While loading models: no transformers warnings below errors, no loading or GGUF
    de-quantisation progress bars (restored afterwards). ``verbose=True`` changes nothing."""
    if verbose:
        yield
        return
    import transformers
    from transformers.utils import logging as tlog

    level, bars = tlog.get_verbosity(), tlog.is_progress_bar_enabled()
    gguf = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
    if gguf is None:
        with contextlib.suppress(ImportError):
            from transformers import modeling_gguf_pytorch_utils as gguf
    old_tqdm = getattr(gguf, "tqdm", None)
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()
    if old_tqdm is not None:
        gguf.tqdm = lambda *a, **kw: old_tqdm(*a, **{**kw, "disable": True})
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"transformers(\.|$)")
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        tlog.set_verbosity(level)
        if bars:
            tlog.enable_progress_bar()
        if old_tqdm is not None:
            gguf.tqdm = old_tqdm
    del transformers
