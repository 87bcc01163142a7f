"""Prepacked linear maps for decoding on CPU: the weight reordered once into oneDNN's blocked layout.

At decode time every linear map multiplies a few rows (W = 1 to a few dozen positions) by a weight that is
read once from memory: the phase is bound by how fast the kernel streams the weight. ``F.linear`` hands the
weight to oneDNN in its plain (out, in) layout, and oneDNN reorders it into its blocked layout on every call;
a prepacked weight (``torch.ops.mkldnn._reorder_linear_weight``, the op ``torch.compile``'s CPU freezing
uses) is streamed as is (the measurement, packed against unpacked in one session: docs/decoding.md, "A lean
step on CPU").

``PackedLinear`` is an ``nn.Linear`` (same ``weight``, ``in_features``, ``out_features``: the roofline counts
its bytes and FLOPs as before) whose forward reads the packed copy; the packed copy is a plain attribute,
not a buffer, so the module's state (and ``lm.roofline``'s byte count) is the weight's. ``prepack(module)``
swaps every ``nn.Linear`` inside ``module`` for one; CPU only, refused with a ``ValueError`` where oneDNN's op
is missing. The decode loop packs the modules it runs by default (``lm.loop.runtime_models``, ``ModelPair.lean``).
A packed copy never goes stale: when the weight has changed since it was packed (another tensor, dtype or
device, or an in-place update), the next call packs it again on CPU, or multiplies by the weight itself elsewhere. The product is oneDNN's GEMM either
way; whether it is bit for bit ``F.linear``'s is measured, not assumed (``tests/lm/test_packed.py`` reports
the largest difference per dtype and width).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["PackedLinear", "prepack", "can_prepack", "PACKABLE"]


PACKABLE = (torch.float32, torch.bfloat16, torch.float16)  # the dtypes oneDNN's packed GEMM takes


def can_prepack(device=None, dtype: torch.dtype | None = None) -> str | None:
    """``None`` if linear maps on ``device`` (in ``dtype``, when given) can be prepacked here, else the reason
    they cannot."""
    dev = torch.device("cpu" if device is None else device)
    if dev.type != "cpu":
        return f"prepacking is for CPU decoding; the model is on {dev}"
    if dtype is not None and dtype not in PACKABLE:
        return f"oneDNN packs {', '.join(str(d).replace('torch.', '') for d in PACKABLE)} weights, not {dtype}"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight") or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch build lacks torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise"
    return None


class PackedLinear(nn.Linear):
    """``nn.Linear`` (no bias or a bias) whose forward multiplies by a copy of ``weight`` packed once for
    ``rows`` rows per call (a hint to oneDNN's blocking, not a limit). ``x`` (..., in) -> (..., out), in
    the weight's dtype."""

    def __init__(self, linear: nn.Linear, rows: int = 1):
        why = can_prepack(linear.weight.device, linear.weight.dtype)
        if why is not None:
            raise ValueError(f"cannot prepack {linear}: {why}")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            raise ValueError(f"rows must be an integer >= 1, got {rows!r}")
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter (a tied LM head stays tied to its embedding)
        self.bias = linear.bias
        self.rows = rows
        self.repack()

    def _stamp(self) -> tuple:
        """What identifies the weight's current values: its storage, dtype, device and in-place version."""
        w = self.weight
        return (w.data_ptr(), w.dtype, w.device, w._version)

    def repack(self) -> None:
        """Pack ``weight`` again (after its values or dtype changed; ``forward`` does so itself when needed)."""
        with torch.no_grad():
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), self.rows)
        self._packed_from = self._stamp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad):
            return F.linear(x, self.weight, self.bias)  # the packed op has no backward
        if self._stamp() != self._packed_from:  # moved, cast or updated since packing
            if can_prepack(self.weight.device, self.weight.dtype) is not None:
                return F.linear(x, self.weight, self.bias)
            self.repack()
        lead = x.shape[:-1]
        b = None if self.bias is None else self.bias.detach()
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self._packed, b, "none", [], "")
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, packed for {self.rows} row(s)"


def prepack(module: nn.Module, rows: int = 1) -> int:
    """Swap every ``nn.Linear`` inside ``module`` (in place) for a ``PackedLinear`` of the same weight;
    returns how many were swapped (0 when already packed). ``ValueError`` naming the reason where the
    module is not on a CPU with oneDNN. A later ``.to(...)`` or in-place update is followed (``PackedLinear``)."""
    params = list(module.parameters())
    why = can_prepack(params[0].device if params else None, params[0].dtype if params else None)
    if why is not None:
        raise ValueError(f"cannot prepack {type(module).__name__}: {why}")
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and not isinstance(child, PackedLinear):
                setattr(parent, name, PackedLinear(child, rows))
                swapped += 1
    return swapped
