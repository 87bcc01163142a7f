"""The embedded draft's build configuration, its cache file and the error for a draft not built yet,
without torch (``draft.py`` re-exports every name here): the command line finds out whether the draft
is built, and refuses a bad ``build-draft`` argument, before torch loads."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass, replace

from ..core.sampling import SAMPLING

__all__ = ["FORMAT_VERSION", "DEFAULT_VERIFIER", "DEFAULT_VERIFIER_LAYERS", "BUILD_TIME", "eagle3_aux_layers",
           "DraftConfig", "MissingDraftError", "cache_dir", "verifier_tag", "draft_path", "check_draft_built",
           "check_draft_file", "TORCH_ZIP_MAGIC"]

# 5: the build draws transcripts among the top-k only, trains in bfloat16 on CPUs with AVX512-BF16
# too, computes the head's logits on answer rows only and no longer serves allocations from mmap
# (issue 19: 37 -> ~13 minutes): a v4 file of the same config is another draft
FORMAT_VERSION = 5
DEFAULT_VERIFIER = "smollm2"  # the embedded verifier (``pair.load_model``'s spec)
DEFAULT_VERIFIER_LAYERS = 30  # its depth (SmolLM2-135M): names its draft's file without loading it


def eagle3_aux_layers(n_layers: int) -> tuple[int, int, int]:
    """The verifier layers whose input the head reads: EAGLE-3's low / middle / high choice, as vLLM
    sets it, ``(2, L // 2, L - 3)`` for a verifier of ``L`` decoder layers ((2, 15, 27) for ``L = 30``).
    Defined for ``L >= 6`` (the three indices never decrease; ``L = 6`` reads layer 3 twice); give
    ``DraftConfig.aux_layers`` otherwise."""
    if not isinstance(n_layers, int) or isinstance(n_layers, bool) or n_layers < 6:
        raise ValueError(f"the default aux_layers (2, L // 2, L - 3) need a verifier of >= 6 layers, got L = "
                         f"{n_layers!r}: give DraftConfig(aux_layers=...)")
    return (2, n_layers // 2, n_layers - 3)


@dataclass(frozen=True)
class DraftConfig:
    """Architecture, data and training of the embedded draft (every field enters the cache key)."""

    aux_layers: tuple[int, int, int] | None = None  # None: eagle3_aux_layers(verifier depth), see ``resolved``
    shortlist: int = 8192  # draft vocabulary (the verifier's most likely tokens on the training data)
    mlp_hidden: int = 1536
    head_layers: int = 1  # decoder layers of the head (vLLM's EAGLE-3 loads any number)
    onpolicy_prompts: int = 720  # requests answered by the verifier (its own transcripts)
    onpolicy_tokens: int = 160  # new tokens per transcript (at most)
    wiki_docs: int = 1200  # Wikipedia summaries as chat answers (teacher forced)
    wiki_tokens: int = 192  # answer tokens kept per summary
    heldout_prompts: int = 48  # further requests whose transcripts are held out for the report
    gen_batch: int = 64
    ttt_steps: int = 3  # draft steps unrolled in training (the head reads its own features)
    epochs: int = 4
    batch_tokens: int = 2048
    lr: float = 3e-3
    weight_decay: float = 0.0
    feature_noise: float = 0.0  # std of Gaussian noise on the fused features, relative to their RMS
    loss: str = "acc+kl1"  # see draft_build.step_loss: "kl", "tv", "kl+tv", "acc+kl1"
    temperature: float = SAMPLING.temperature  # the sampling the draft is trained for (the paper's)
    top_k: int = SAMPLING.top_k
    top_p: float = SAMPLING.top_p
    dtype: str = "auto"  # verifier / training compute dtype: "auto" = bfloat16 where the CPU has AMX
    seed: int = 0

    def __post_init__(self):
        for name in ("shortlist", "mlp_hidden", "head_layers", "onpolicy_tokens", "wiki_tokens", "gen_batch", "ttt_steps",
                     "epochs", "batch_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("onpolicy_prompts", "wiki_docs", "heldout_prompts"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if self.onpolicy_prompts + self.wiki_docs < 1:
            raise ValueError("the draft needs training text: onpolicy_prompts + wiki_docs must be >= 1")
        if self.aux_layers is not None:  # None: from the verifier's depth (``resolved``)
            if (not isinstance(self.aux_layers, (tuple, list)) or len(self.aux_layers) != 3
                    or not all(isinstance(i, int) and i >= 0 for i in self.aux_layers)):
                raise ValueError(f"aux_layers must be three layer indices >= 0, got {self.aux_layers!r}")
            object.__setattr__(self, "aux_layers", tuple(self.aux_layers))
        if self.loss not in ("kl", "tv", "kl+tv", "acc+kl1"):
            raise ValueError(f"loss must be 'kl', 'tv', 'kl+tv' or 'acc+kl1', got {self.loss!r}")
        if not (isinstance(self.temperature, (int, float)) and 0 < self.temperature < math.inf):
            raise ValueError(f"temperature must be > 0 (the draft is trained for sampling), got {self.temperature!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a finite number > 0, got {self.lr!r}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"dtype must be 'auto', 'float32' or 'bfloat16', got {self.dtype!r}")

    def resolved(self, n_layers: int) -> DraftConfig:
        """This config for a verifier of ``n_layers`` decoder layers: ``aux_layers`` filled in
        (``eagle3_aux_layers``) when None, and checked to be layers of that verifier."""
        cfg = self if self.aux_layers is not None else replace(self, aux_layers=eagle3_aux_layers(n_layers))
        if max(cfg.aux_layers) >= n_layers:
            raise ValueError(f"aux_layers {cfg.aux_layers} are not all layers of a {n_layers}-layer verifier")
        return cfg

    def key(self) -> str:
        """A hash of every field (``aux_layers`` must be resolved: see ``resolved``)."""
        if self.aux_layers is None:
            raise ValueError("the config's aux_layers are not resolved: call cfg.resolved(n_layers) first")
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


BUILD_TIME = "about 15 minutes on 2 CPU cores"
"""How long ``cactus-theory build-draft`` takes, as measured by the committed build
(``paper_repro/results/draft_build.json``: ``seconds`` and ``threads``)."""


class MissingDraftError(ValueError):
    """The embedded draft has not been built yet (``cactus-theory build-draft``)."""

    @classmethod
    def not_built(cls, path: str, verifier: str = "smollm2") -> MissingDraftError:
        """The error for a draft file ``path`` that does not exist, naming the command and its cost
        (the cost measured for the default verifier; a larger verifier takes longer)."""
        cmd = "cactus-theory build-draft" + ("" if verifier == "smollm2" else f" --verifier {verifier}")
        return cls(f"the embedded draft is not built yet ({path} does not exist): run `{cmd}` ({BUILD_TIME} "
                   "for SmolLM2-135M)")


def cache_dir() -> str:
    """``$CACTUS_THEORY_CACHE``, else ``$XDG_CACHE_HOME/cactus-theory``, else ``~/.cache/cactus-theory``."""
    if os.environ.get("CACTUS_THEORY_CACHE"):
        return os.environ["CACTUS_THEORY_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cactus-theory")


def verifier_tag(verifier: str = DEFAULT_VERIFIER) -> str:
    """The verifier's part of a draft file name: ``"smollm2"`` for the default verifier, else the last
    part of the model argument (path or hub id) reduced to ``[A-Za-z0-9._-]`` plus 8 hex digits of its
    SHA-1 (two arguments with one last part stay apart)."""
    if verifier == DEFAULT_VERIFIER:
        return DEFAULT_VERIFIER
    if not isinstance(verifier, str) or not verifier:
        raise ValueError(f"verifier must be a model argument (a non-empty string), got {verifier!r}")
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(verifier.rstrip("/\\")) or "model")[:48]
    return f"{base}-{hashlib.sha1(verifier.encode()).hexdigest()[:8]}"


def draft_path(cfg: DraftConfig = DraftConfig(), verifier: str = DEFAULT_VERIFIER, n_layers: int | None = None) -> str:
    """The cache file of the draft built with ``cfg`` for ``verifier`` (a model argument) of
    ``n_layers`` decoder layers (needed when ``cfg.aux_layers`` is None, except for the default
    verifier, whose depth is ``DEFAULT_VERIFIER_LAYERS``). The default verifier's files are named
    ``smollm2-eagle3-v{FORMAT_VERSION}-S{shortlist}-{key}.pt``; another verifier's start with its
    ``verifier_tag``."""
    if cfg.aux_layers is None:
        if n_layers is None:
            if verifier != DEFAULT_VERIFIER:
                raise ValueError(f"the draft file for verifier {verifier!r} needs its depth (n_layers) or "
                                 "explicit aux_layers")
            n_layers = DEFAULT_VERIFIER_LAYERS
        cfg = cfg.resolved(n_layers)
    return os.path.join(cache_dir(), f"{verifier_tag(verifier)}-eagle3-v{FORMAT_VERSION}-S{cfg.shortlist}-{cfg.key()}.pt")


def check_draft_built(verifier: str = DEFAULT_VERIFIER) -> None:
    """Raise ``MissingDraftError`` when the embedded draft for the default verifier has not been built:
    its file name needs no model file, so a command says so before anything loads. Another verifier's
    draft file is named after that verifier's depth (read from its config): ``pair.load_pair`` checks it
    once the config is read, before the weights load."""
    if verifier != DEFAULT_VERIFIER:
        return
    path = draft_path(DraftConfig(), verifier)
    if not os.path.exists(path):
        raise MissingDraftError.not_built(path, verifier)


TORCH_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's file format (a zip archive) since torch 1.6


def check_draft_file(path: str, flag: str) -> None:
    """``path`` is a file in ``torch.save``'s format (a zip archive: its first bytes), as every draft the
    project builds is; a text file or a folder is refused before anything loads (``ValueError`` naming
    ``flag``)."""
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path!r}: no such file")
    with open(path, "rb") as f:
        head = f.read(len(TORCH_ZIP_MAGIC))
    if head != TORCH_ZIP_MAGIC:
        raise ValueError(f"{flag} {path!r} is not a draft checkpoint this project can load (a torch.save file, a zip "
                         f"archive: it starts with {head!r}, not {TORCH_ZIP_MAGIC!r})")
