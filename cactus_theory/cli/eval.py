"""``cactus-theory eval``: the replicated eval of the pre-registered protocol (``lm.experiments.replicated``),
decoded by the project's loop (``--engine loop``, the default) or by vLLM with the project's plugin applying each
rule (``--engine vllm``, ``integrations.vllm_eval``). The arguments, the protocol, the rows, seeds, records,
shards and verdicts are ``replicated``'s; this module only hands it the engine (the layers: ``lm.experiments``
never imports ``integrations``)."""

from __future__ import annotations

from ..lm.experiments import replicated

__all__ = ["configure", "check", "run"]


def _engine(args):
    """The engine spec of ``--engine`` (None: the loop); vLLM's module imports no vLLM until it loads."""
    if getattr(args, "engine", "loop") == "vllm":
        from ..integrations.vllm_eval import SPEC

        return SPEC
    return None


def configure(parser) -> None:
    replicated.configure(parser)


def check(args) -> None:
    """Every flag, before any model loads (``replicated.check``; with ``--engine vllm`` the engine's checks and
    each method against its declared capabilities)."""
    replicated.check(args, _engine(args))


def run(args) -> int:
    return replicated.run(args, _engine(args))
