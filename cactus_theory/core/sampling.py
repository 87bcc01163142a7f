"""The sampling settings (temperature, top-k, top-p) as one value, and the paper's default.

``Sampling`` is a frozen, validated value; ``SAMPLING`` (temperature 0.6, top-k 20, top-p 0.95, the
paper's) is the one default that the decoding functions, the command line, the draft's build, the
evaluation and the reproduction read. ``as_dict()`` is the form stored in result files and cache
keys. A ``Sampling`` is also a read-only mapping over those three names, so ``f(**sampling)`` and
``sampling["top_p"]`` work. No torch here: ``core.transforms`` applies the settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Sampling", "SAMPLING", "check_sampling"]


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raise ``ValueError`` naming the first bad sampling parameter."""
    if (not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not math.isfinite(temperature)
            or temperature < 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not (0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")


@dataclass(frozen=True)
class Sampling:
    """Temperature (0 = greedy), top-k (0 = off) and top-p (1 = off), applied alike to ``p`` and ``q``;
    checked on construction (``ValueError`` naming the field)."""

    temperature: float = 0.6
    top_k: int = 20
    top_p: float = 0.95

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p)

    def as_dict(self) -> dict:
        """``{"temperature": ..., "top_k": ..., "top_p": ...}``, in that order (results and cache keys)."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    def as_tuple(self) -> tuple:
        """``(temperature, top_k, top_p)``, the positional form of ``transforms.sampling_probs``."""
        return (self.temperature, self.top_k, self.top_p)

    def label(self) -> str:
        """``"T 0.6, top-k 20, top-p 0.95"``."""
        return f"T {self.temperature:g}, top-k {self.top_k}, top-p {self.top_p:g}"

    @classmethod
    def from_dict(cls, d: dict) -> Sampling:
        """The inverse of ``as_dict`` (unknown or missing names raise ``TypeError``)."""
        return cls(**d)

    # read-only mapping over the three names: ``**sampling`` and ``sampling["top_k"]``
    def keys(self):
        return ("temperature", "top_k", "top_p")

    def __getitem__(self, name: str):
        if name not in self.keys():
            raise KeyError(name)
        return getattr(self, name)


SAMPLING = Sampling()
"""The paper's sampling (temperature 0.6, top-k 20, top-p 0.95): the default everywhere."""
