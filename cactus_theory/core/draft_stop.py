"""Adaptive draft length: when a chain stops drafting its block (``DraftStop``).

A block of at most ``k`` drafts. After drafting position ``j`` (``1 <= j < k``) a row drafts position
``j + 1`` only if the draft's own signal is at least ``threshold``:

* ``signal="top"`` (default): ``max_x p_{j+1}(x)``, the top probability of the draft's next law (its
  sampling law after the transforms, given the prefix and ``x_1..x_j``): the draft expects to be
  uncertain at ``j + 1`` below it;
* ``signal="path"``: ``prod_{i <= j} p_i(x_i)``, the draft's probability of the path it has drawn
  (EAGLE-2's path confidence).

Each row stops on its own, so the rows of a batch have ragged lengths ``n_r`` in ``1..k``; the
verifier judges each row's ``n_r`` drafts and, when all are accepted, draws the bonus from its own
law ``q`` at position ``n_r + 1`` (``sampler.verify(..., lengths=)``).

**Why SpS stays lossless.** Write ``p`` for the draft, ``q`` for the verifier, ``y_1, y_2, ...`` for
the emitted tokens. Whether position ``j + 1`` is drafted is a function of the prefix and the drafts
``x_1..x_j`` only: it is decided before ``x_{j+1}`` is drawn, and it reads neither the acceptance
uniforms nor ``x_{j+1}`` (a stopping time of the drafts). It only matters when ``x_1..x_j`` were all
accepted, i.e. equal ``y_1..y_j``, so given the emitted prefix the decision is fixed. Then ``y_{j+1}``
is either SpS's verdict on ``x_{j+1} ~ p_{j+1}`` (law ``q_{j+1}``, by SpS's one-step identity
``min(p, q) + (1 - sum min(p, q)) (q - p)_+ / sum (q - p)_+ = q``) or the bonus, drawn from ``q_{j+1}``:
``q_{j+1}`` either way, so every token has the verifier's conditional law and the sequence has
``q``'s law. The argument needs the decision to be a function of the history before ``x_{j+1}``,
not that it read the draft only: a stop reading ``q_{j+1}`` at that history would be lossless too
(but ``q`` is not known before the verifier's forward), while a stop reading the draft's probability
of the candidate ``x_{j+1}`` itself (dropping a drawn draft whose ``p_{j+1}(x_{j+1})`` is small) is
not: it judges ``x_{j+1}`` against ``p_{j+1}`` while the candidates it keeps follow ``p_{j+1}``
restricted. ``theory.toy.sequence_law(..., draft_stop=)`` gives the exact law of the loop with
stopping; tests/theory/test_draft_stop.py checks both statements on toy pairs.

A lossy rule (Cactus) stays as lossy as its steps are, but its law moves with the block boundaries:
stopping earlier emits more bonus tokens, drawn from ``q`` itself.

No torch here (the command line parses ``--draft-stop-prob`` before loading it): ``continues`` reads
numpy arrays and torch tensors alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["DraftStop", "SIGNALS", "check_draft_stop"]

SIGNALS = ("top", "path")


@dataclass(frozen=True)
class DraftStop:
    """Stop drafting a row's block once the draft's signal falls below ``threshold`` (module docstring).

    ``threshold`` in (0, 1); ``signal`` ``"top"`` (the next law's top probability) or ``"path"`` (the
    drawn path's probability). ``DraftStop.parse("0.3")`` / ``parse("path:0.05")`` read the command
    line's form."""

    threshold: float
    signal: str = "top"

    def __post_init__(self):
        t = self.threshold
        if isinstance(t, (np.integer, np.floating)) and not isinstance(t, np.bool_):  # a numpy real scalar
            t = t.item()
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t < 1:
            raise ValueError(f"draft_stop: threshold must be a number in (0, 1), got {t!r}")
        if self.signal not in SIGNALS:
            raise ValueError(f"draft_stop: signal must be one of {SIGNALS}, got {self.signal!r}")
        object.__setattr__(self, "threshold", float(t))

    def continues(self, p_next, path):
        """Whether each row drafts its next position: ``p_next`` (..., V) the draft's law there, ``path``
        (...) the product of the draft's probabilities of the drafts drawn so far; a bool array (...)."""
        if self.signal == "path":
            return path >= self.threshold
        top = p_next.amax(-1) if hasattr(p_next, "amax") else p_next.max(axis=-1)
        return top >= self.threshold

    def label(self) -> str:
        """``"top>=0.3"`` (results tables)."""
        return f"{self.signal}>={self.threshold:g}"

    @classmethod
    def parse(cls, text: str) -> DraftStop:
        """``"P"`` (the top signal at threshold P) or ``"SIGNAL:P"`` -> a ``DraftStop``; ValueError otherwise."""
        signal, _, value = str(text).rpartition(":")
        try:
            threshold = float(value)
        except ValueError:
            raise ValueError(f"draft_stop: expected P or SIGNAL:P with P in (0, 1) and SIGNAL one of {SIGNALS}, "
                             f"got {text!r}") from None
        return cls(threshold, signal or "top")


def check_draft_stop(draft_stop, name: str = "draft_stop") -> DraftStop | None:
    """``draft_stop``: None (fixed ``k``), a ``DraftStop`` or a threshold in (0, 1) (the top signal) ->
    a ``DraftStop`` or None; ``ValueError`` naming ``name`` otherwise."""
    if draft_stop is None or isinstance(draft_stop, DraftStop):
        return draft_stop
    if isinstance(draft_stop, (bool, np.bool_)) or not isinstance(draft_stop, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be None, a DraftStop or a threshold in (0, 1), got {draft_stop!r}")
    try:
        return DraftStop(draft_stop)
    except ValueError as e:
        raise ValueError(f"{name} must be a threshold in (0, 1) (the draft's top probability), got {draft_stop!r}") \
            from e
