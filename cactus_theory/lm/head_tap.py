"""``HeadTap``: captures the input of a model's LM head (its final hidden state) during a forward,
for rules that read the verifier's head (DropMatch draws its dropout paths from it and the head's
weight and bias)."""

from __future__ import annotations

import torch

__all__ = ["HeadTap"]


class HeadTap:
    """Captures the input of a model's LM head at every forward: ``with HeadTap(model) as tap: ...``,
    then ``tap.hidden`` (..., d) of the last forward, ``tap.weight`` / ``tap.bias``.

    The head is ``model.head`` (the compact Llama) or ``model.get_output_embeddings()`` (Hugging Face
    causal LMs); both are ``nn.Linear`` and the logits are exactly ``head(hidden)`` (a model that
    transforms logits after its head, e.g. soft-capping, is refused by ``check``).
    """

    def __init__(self, model: torch.nn.Module):
        head = getattr(model, "head", None)
        if not isinstance(head, torch.nn.Linear):
            get = getattr(model, "get_output_embeddings", None)
            head = get() if callable(get) else None
        if not isinstance(head, torch.nn.Linear):
            raise ValueError(f"DropMatch needs the verifier's LM head as an nn.Linear; {type(model).__name__} has none")
        cfg = getattr(model, "config", None)
        for attr in ("final_logit_softcapping", "logit_scale"):
            if getattr(cfg, attr, None) not in (None, 0, 1, 1.0):
                raise ValueError(f"DropMatch reads the head's logits; this model transforms them after the head "
                                 f"({attr} = {getattr(cfg, attr)}), which is not modelled")
        self.head = head
        self.hidden: torch.Tensor | None = None
        self.checked = False  # set by a successful ``check``
        self._handle = None

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.head.bias

    def _hook(self, module, args):
        self.hidden = args[0]

    def __enter__(self) -> HeadTap:
        self._handle = self.head.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def check(self, logits: torch.Tensor, atol: float = 1e-3) -> None:
        """Raise ``ValueError`` unless the captured input reproduces ``logits`` through the head."""
        if self.hidden is None:
            raise ValueError("no head input was captured (the forward did not run the LM head)")
        with torch.inference_mode():
            again = torch.nn.functional.linear(self.hidden, self.weight, self.bias).float()
        if again.shape != logits.shape or not torch.allclose(again, logits.float(), atol=atol, rtol=1e-3):
            raise ValueError("the verifier's logits are not head(hidden): DropMatch cannot read this model's head")
        self.checked = True
