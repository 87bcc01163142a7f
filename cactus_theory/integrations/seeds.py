"""Request seeds for engines that seed each request (vLLM, llama.cpp): one function shared by the engines and the
engine modules below them (``integrations.engines`` re-exports it)."""

from __future__ import annotations

__all__ = ["request_seeds"]


def request_seeds(seed: int, count: int) -> list[int]:
    """The ``SamplingParams.seed`` of each of a call's ``count`` requests: ``seed * count + i``.

    vLLM draws a seeded request's tokens from its own ``torch.Generator`` seeded with it, and torch's CPU
    generator keeps only the low 32 bits of a seed (``manual_seed(2**32 + s)`` draws what ``manual_seed(s)``
    does). So the seeds of one call must differ modulo ``2**32``, and so must those of the two sides of
    ``check_generation`` (seeds ``2 s`` and ``2 s + 1``, same ``count``): ``seed * count + i`` are distinct for
    every ``seed`` and ``i < count`` while ``(seed + 1) * count <= 2**32``, refused beyond."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count!r}")
    if (seed + 1) * count > 2**32:
        raise ValueError(f"seed {seed} with {count} requests: the request seeds seed * count + i must stay below 2**32 "
                         f"(torch's CPU generator keeps 32 bits of a seed); use a seed below {2**32 // count}")
    return [seed * count + i for i in range(count)]
