"""Where the random draws of verification and decoding come from: one ``torch.Generator`` for a whole
batch, or one generator per row (``RowGenerators``).

With one generator the draws of a row depend on the other rows of its batch (they share one stream),
though never its law. With ``RowGenerators`` row ``b`` draws only from its own generator, so the tokens
a row emits do not depend on which rows share its batch or in which order: what an evaluation keyed by
(question, replicate, method) needs, and what vLLM's per-request generators give.

``uniforms(generator, B, n, device)`` is the one place uniforms are drawn: ``[B, n]`` float64 in [0, 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

__all__ = ["RowGenerators", "uniforms", "check_generator"]


class RowGenerators:
    """One ``torch.Generator`` per row of a batch.

    ``RowGenerators.from_seeds(seeds, device)`` seeds row ``b``'s generator with ``seeds[b]``;
    ``rand(n)`` draws ``[B, n]`` float64 uniforms, row ``b``'s ``n`` from its own generator (in row order,
    each row's stream advancing by ``n``); ``select(idx)`` keeps the rows ``idx`` (finished rows leave a
    decoding batch), in place.
    """

    def __init__(self, generators: Iterable[torch.Generator]):
        gens = list(generators)
        for i, g in enumerate(gens):
            if not isinstance(g, torch.Generator):
                raise TypeError(f"RowGenerators: item {i} must be a torch.Generator, got {type(g).__name__}")
        if not gens:
            raise ValueError("RowGenerators needs at least one generator (one per row)")
        self.generators = gens

    @classmethod
    def from_seeds(cls, seeds: Sequence[int], device="cpu") -> RowGenerators:
        """One generator per seed, on ``device``; every seed an integer in [0, 2**63)."""
        gens = []
        for i, s in enumerate(seeds):
            if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or not 0 <= int(s) < 2 ** 63:
                raise ValueError(f"seeds[{i}] must be an integer in [0, 2**63), got {s!r}")
            gens.append(torch.Generator(device).manual_seed(int(s)))
        return cls(gens)

    def __len__(self) -> int:
        return len(self.generators)

    def __iter__(self):
        return iter(self.generators)

    def __getitem__(self, i: int) -> torch.Generator:
        return self.generators[i]

    @property
    def device(self) -> torch.device:
        return self.generators[0].device

    def rand(self, n: int, device=None) -> torch.Tensor:
        """``[B, n]`` float64 uniforms in [0, 1), row ``b``'s drawn from generator ``b``."""
        u = torch.stack([torch.rand(n, generator=g, device=g.device, dtype=torch.float64) for g in self.generators])
        return u if device is None else u.to(device)

    def select(self, idx) -> None:
        """Keep rows ``idx`` (a sequence or 1-d tensor of row indices), in that order."""
        ids = idx.tolist() if isinstance(idx, torch.Tensor) else list(idx)
        self.generators = [self.generators[int(i)] for i in ids]

    def __repr__(self) -> str:
        return f"RowGenerators({len(self)} rows)"


def check_generator(generator, B: int, name: str = "generator") -> None:
    """``generator``: None, one ``torch.Generator``, or a ``RowGenerators`` with exactly ``B`` rows."""
    if generator is None or isinstance(generator, torch.Generator):
        return
    if isinstance(generator, RowGenerators):
        if len(generator) != B:
            raise ValueError(f"{name}: RowGenerators has {len(generator)} generators for a batch of B = {B} rows")
        return
    raise ValueError(f"{name} must be a torch.Generator, a RowGenerators (one per row) or None, got {generator!r} "
                     "(seed one with torch.Generator().manual_seed(seed))")


def uniforms(generator, B: int, n: int, device) -> torch.Tensor:
    """``[B, n]`` float64 uniforms on ``device``: one ``torch.rand((B, n))`` call from ``generator`` (or torch's
    default generator when None; drawn on the generator's device), or row ``b`` from ``generator[b]`` for a
    ``RowGenerators``."""
    if isinstance(generator, RowGenerators):
        return generator.rand(n, device)
    gdev = generator.device if generator is not None else device
    return torch.rand((B, n), generator=generator, device=gdev, dtype=torch.float64).to(device)
