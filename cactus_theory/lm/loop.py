"""Batched speculative decoding with a (draft, verifier) pair, and the verifier decoding alone.

One step, for every unfinished row (``_speculative_rows``, in the spirit of gpt-fast's
``speculative_decode``)::

    drafts, p = drafter.propose(k)            # draft: n_1..n_k ~ p(. | prefix, n_<j), with their laws
    logits = target.score(drafts)             # score: ONE verifier forward over [pending, n_1..n_k]
    q = sampling_probs(logits)                # the same transforms as p (temperature, top-k, top-p)
    tokens, a = verify(drafts, p, q, rule)    # verify: the rule's own code accepts a drafts, emits one more
    target.advance(a, tokens[a]); drafter.advance(a, tokens, features)    # advance
    _count(ctx, rows, a, kept, n, nll, kl=...)                            # count

**What a step reads** is named once per batch: a ``DecodeContext`` (the runtime draft and verifier, ``max_new``,
the sampling transforms, the run's ``DecodeStats``, EOS, the observer, and per batch its generator and its
rows' ``SequenceCounters``), built by each entry point and specialised per batch by ``_run``
(``DecodeContext.for_batch``); the loops (``_speculative_rows``, ``_tree_rows``, ``_autoregressive_rows``) take
it and their method's own arguments only. Its ``PhaseTimer`` times each step's phases (``with
timer.phase("draft")``: ``draft``, ``verifier``, ``verify``, ``metric``) into ``DecodeStats``; the metric time
(NLL, step KL) is left out of ``stats.seconds`` and of each sequence's ``seconds`` (``_run``). Every loop keeps
its counters through one function, ``_count`` (steps, accepted, drafted, judged, NLL of the kept tokens, and the
KL of judged kept positions from a KL source: the chain's exact step KL ``_step_kls``, the tree's charged node
costs ``_node_costs``; the verifier alone counts steps that accept and draft nothing).

**Adaptive draft length** (``draft_stop=``, a ``core.draft_stop.DraftStop``): each row stops drafting its
block once the draft's signal (its next law's top probability, or its path probability) falls below a
threshold, so rows draft ragged lengths ``n_r`` in ``1..k``; the drafter stops its forwards once every row has
stopped, the verifier scores the longest row's drafts, and ``verify(..., lengths=n)`` judges each row's own
``n_r`` (the bonus from ``q`` after its last draft). The decision reads the draft's history only, so SpS stays
lossless (the argument in ``core/draft_stop.py``; ``theory.toy.sequence_law(..., draft_stop=)`` is the law).

The first new token of each row comes from the verifier's prompt pass (``prefill``), exactly as
when the verifier decodes alone. Rows stop independently at EOS or after ``max_new_tokens``;
finished rows leave the batch (``_drop_finished``). Llama-family Hugging Face models run as the
compact Llama of ``llama.py`` (converted once per pair, same function); others through their own
forward (``cache.py``).

**Trees** (``tree_generate``): the same loop with a tree.

One step, for every unfinished row (``_tree_rows``)::

    tokens, p = drafter.propose_tree(parents, scheme)   # a static tree of N nodes, candidates per scheme
    logits = target.score_tree(tokens, parents)         # ONE verifier forward over [pending, N nodes]
    q = sampling_probs(logits)                          # the same transforms as p
    res = verify_tree(tokens, parents, p, q, rule, scheme, mode=mode)   # a path + one token
    target.advance_tree(res.accepted_nodes, a, last); drafter.advance_tree(a, res.accepted_nodes, res.tokens)

The tree is static (``branching_parents((2, 2))``: every root child has 2 children; or any
topological ``parents`` listed level by level) or dynamic (``core.tree.DynamicTree(depth, width,
children)``: the root gets ``children`` candidates, then at each level the ``width`` nodes of highest
draft path probability get ``children`` each; per-row parents, nothing pruned after drawing, so the
lossless schemes stay lossless) or EAGLE-2's re-ranked ``core.tree.BudgetTree``; any ``core.tree.Tree``
(the protocol of ``core.tree_shapes``: the loop reads its node counts and levels, never its kind). Tree
attention and the cache compaction to the accepted path are ``Llama.forward_tree`` / ``KVCache.keep_path``
on the compact Llama (other Hugging Face models, or ``compact=False``: a 4D mask through their own forward,
the unkept slots masked out, ``cache._HFStream``); the EAGLE-3-style feature draft grows the tree with the
head's ``tree_step`` (each node reads its parent's output and its token) and takes the verifier's features
along the accepted path. First token, EOS, ragged rows and finished rows as in the chain
loop (``_first_tokens``, ``_emit``, ``_drop_finished``), counted by the same ``_count``. AL is tokens per
verifier call, bonus included; ``drafted`` counts the N nodes of each tree, ``judged`` the path plus one, and
under a stateful rule (``SequenceBudget``) the KL is its nodes' charged costs along the path.

SpS with ``"iid"``, ``"without_replacement"`` or ``"deterministic"`` emits exactly the verifier's
law (``theory.tree``; tests on tiny Llama pairs); any rule emits ``theory.tree.tree_sequence_law``.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..core.draft_stop import DraftStop, check_draft_stop
from ..core.draws import RowGenerators
from ..core.registry import make_rule
from ..core.rules import Rule
from ..core.sampler import draw, verify
from ..core.sampling import SAMPLING as _SAMPLING
from ..core.transforms import check_sampling, sampling_probs
from ..core.tree import (
    as_tree,
    check_mode,
    check_rules,
    check_tree_scheme,
    verify_tree,
)
from .cache import Target, make_drafter, right_pad
from .head_tap import HeadTap
from .llama import Llama, supports_hf
from .metrics import COUNTERS, DecodeResult, DecodeStats, SequenceCounters, nll_of, step_kl
from .packed import can_prepack, prepack
from .pair import ModelPair, context_length

__all__ = ["speculative_generate", "autoregressive_generate", "prepare_prompts", "SAMPLING", "runtime_models",
           "first_step_laws", "lean_step", "VerifierStep", "tree_generate", "check_tree", "first_tree_step", "tree_nodes"]

SAMPLING = _SAMPLING  # the paper's (core.sampling.SAMPLING: temperature 0.6, top-k 20, top-p 0.95)


def prepare_prompts(pair: ModelPair, prompts, max_new_tokens: int, chat: bool = True) -> list[list[int]]:
    """Validate prompts (strings need the pair's tokenizer; or lists of token ids) -> token ids."""
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError(f"prompts must be a non-empty list of strings or token-id lists, got {prompts!r}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if all(isinstance(p, str) for p in prompts):
        if pair.tokenizer is None:
            raise ValueError("text prompts need a tokenizer; this pair has none (pass token-id lists)")
        from .data import encode_prompts

        ids = encode_prompts(pair.tokenizer, list(prompts), chat=chat)
    else:
        ids = []
        for i, p in enumerate(prompts):
            if isinstance(p, torch.Tensor):
                p = p.tolist()
            if not isinstance(p, (list, tuple)) or not all(isinstance(t, (int, np.integer)) for t in p):
                raise ValueError(f"prompts[{i}] must be a string or a list of token ids, got {p!r}")
            ids.append([int(t) for t in p])
    V, ctx = pair.vocab_size, context_length(pair.verifier)
    for i, p in enumerate(ids):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty: a prompt needs at least one token")
        if min(p) < 0 or max(p) >= V:
            raise ValueError(f"prompts[{i}] has token ids outside [0, {V}): {[t for t in p if not 0 <= t < V][:5]}")
        if ctx is not None and len(p) + max_new_tokens > ctx:
            raise ValueError(f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} it exceeds "
                             f"the verifier's context of {ctx} positions")
    return ids


def _check_args(k: int, batch_size: int, temperature: float, top_k: int, top_p: float) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (drafts per step), got {k!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    check_sampling(temperature, top_k, top_p)


def _as_rule(rule) -> Rule:
    if isinstance(rule, str):
        return make_rule(rule)
    if not isinstance(rule, Rule):
        raise ValueError(f"rule must be a Rule (SpS(), Cactus(delta), ...) or a rule name, got {rule!r}")
    return rule


def _device(model) -> torch.device:
    return next(model.parameters()).device


def runtime_models(pair: ModelPair, compact: bool = True):
    """The (draft, verifier) modules the loop runs: Llama-family Hugging Face models as the compact
    Llama (converted once, cached on the pair), anything else as given. A Hugging Face model that the
    compact Llama does not reproduce runs as given, announced once per model and pair (``RuntimeWarning``
    naming the reason), so that a slower path is never taken silently. With ``pair.lean`` (the default) the
    runtime modules take the lean CPU step first (``lean_step``), so every entry point decodes the same way."""
    def run_as(model):
        if not compact or isinstance(model, Llama) or getattr(model, "needs_features", False):
            return model  # a feature draft is already a runtime module
        why = supports_hf(model)
        if why is not None:
            told = pair.__dict__.setdefault("_told", set())
            if getattr(model, "config", None) is not None and id(model) not in told:
                told.add(id(model))
                warnings.warn(f"{type(model).__name__} runs as the Hugging Face module, not the compact Llama: {why}",
                              RuntimeWarning, stacklevel=3)
            return model
        cache = pair.__dict__.setdefault("_compact", {})
        if id(model) not in cache:
            cache[id(model)] = Llama.from_hf(model)
        return cache[id(model)]

    draft, verifier = run_as(pair.draft), run_as(pair.verifier)
    if compact and pair.lean:
        lean_step(pair, draft, verifier)
    return draft, verifier


def _runs_here(model) -> bool:
    """Whether ``model`` is one of the project's runtime modules (a compact Llama or a feature draft), the
    modules the lean step may reshape; a Hugging Face model run as given is the user's and left alone."""
    return isinstance(model, Llama) or getattr(model, "needs_features", False)


def lean_step(pair: ModelPair, draft, verifier) -> str:
    """The lean CPU step (``ModelPair.lean``), applied once per pair and recorded in ``pair.lean_state``: a
    feature draft (declares ``cast``) in ``pair.draft_dtype`` (default: the verifier's dtype), then every linear
    map of the runtime modules prepacked (``lm.packed``). Off CPU, or where oneDNN's op is missing, nothing is
    changed and the reason is recorded. Returns the description."""
    done = pair.__dict__.get("lean_state")
    if done is not None:
        return done
    why = can_prepack(_device(verifier), next(verifier.parameters()).dtype)
    if why is not None:
        state = f"not lean ({why})"
    else:
        dtype = pair.draft_dtype or next(verifier.parameters()).dtype
        if draft is not None and hasattr(draft, "cast") and draft.dtype != dtype:
            draft.cast(dtype)
        n_v = prepack(verifier) if _runs_here(verifier) else 0
        n_d = prepack(draft) if draft is not None and _runs_here(draft) else 0
        d_dtype = str(getattr(draft, "dtype", None) or next(draft.parameters()).dtype).replace("torch.", "")
        state = f"lean (prepacked {n_v} verifier and {n_d} draft linear maps; draft in {d_dtype})"
    pair.__dict__["lean_state"] = state
    return state


# -- what a batch's decode reads: its context, the phase timer, the one counting path -------------------

_PHASES = ("draft", "verifier", "verify", "prefill", "metric")


class PhaseTimer:
    """Wall-clock seconds of a decode step's phases, added to the run's ``DecodeStats``: ``"draft"`` (draft
    forwards and sampling: ``draft_seconds``), ``"verifier"`` (its forward and the transforms of ``q``:
    ``verifier_seconds``), ``"verify"`` (the sampler: ``verify_seconds``), ``"prefill"`` (the prompts' prefill and
    first tokens: ``prefill_seconds``, not the loop's bookkeeping) and ``"metric"`` (NLL and step KL:
    ``metric_seconds``, which ``_run`` takes out of ``seconds`` and of each sequence's share)::

        with timer.phase("draft"):
            drafts, p, size = drafter.propose(k, sampling, gen, stop)
    """

    def __init__(self, stats: DecodeStats):
        self.stats = stats

    @contextlib.contextmanager
    def phase(self, name: str):
        if name not in _PHASES:
            raise ValueError(f"phase must be one of {_PHASES}, got {name!r}")
        field_name = f"{name}_seconds"
        t0 = time.perf_counter()
        yield
        setattr(self.stats, field_name, getattr(self.stats, field_name) + (time.perf_counter() - t0))


@dataclass(frozen=True, eq=False)
class DecodeContext:
    """What every step of a batch reads, named once: the runtime ``draft`` (None when the verifier decodes
    alone) and ``verifier`` modules (``runtime_models``), ``max_new`` tokens per row, the ``sampling``
    transforms ``(temperature, top_k, top_p)``, the run's ``stats``, the ``eos`` token and the ``observer``
    (None, or the audit's: ``speculative_generate``); then, per batch (``for_batch``, called by ``_run``), its
    random source ``gen`` (the run's generator, or the batch's ``RowGenerators``) and the ``per_seq`` counters
    of its rows. ``timer`` times each step's phases into ``stats`` (``PhaseTimer``)."""

    draft: torch.nn.Module | None
    verifier: torch.nn.Module
    max_new: int
    sampling: tuple
    stats: DecodeStats
    eos: int | None = None
    observer: object = None
    gen: torch.Generator | RowGenerators | None = None
    per_seq: list = field(default_factory=list)
    timer: PhaseTimer = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "timer", PhaseTimer(self.stats))

    def for_batch(self, gen, per_seq: list) -> DecodeContext:
        """This context for one batch: its random source and its rows' counters."""
        return replace(self, gen=gen, per_seq=per_seq)


def _count(ctx: DecodeContext, rows, a, kept, n, nll, *, judged=None, kl=None) -> None:
    """The one place a decode step's counters are kept (the chain, the tree and the verifier alone). For each
    running row ``i`` (sequence ``rows[i]`` of the batch): one step, ``a[i]`` accepted drafts, ``n[i]`` drafted
    (the chain's ``k`` or its adaptive length, the tree's N nodes, 0 for the verifier alone), ``judged[i]``
    positions judged (default ``min(a + 1, n)``: the accepted drafts and the rejected one; a tree judges its path
    plus one), the verifier NLL ``nll[i][:kept[i]]`` of the ``kept[i]`` tokens the row kept and, given a KL source
    ``kl(i, j)``, the KL of every judged position ``j`` whose output was kept (``None``: skipped, counted in
    ``stats.kl_skipped``): the chain's exact step KL (``_step_kls``), the tree's charged node costs
    (``_node_costs``)."""
    for i, b in enumerate(rows):
        c = ctx.per_seq[b]
        judge = min(a[i] + 1, n[i]) if judged is None else judged[i]
        c.steps += 1
        c.accepted += a[i]
        c.drafted += n[i]
        c.judged += judge
        c.nll_sum += sum(nll[i][:kept[i]])
        c.nll_count += kept[i]
        if kl is None:
            continue
        for j in range(min(judge, kept[i])):
            v = kl(i, j)
            if v is None:
                ctx.stats.kl_skipped += 1
            else:
                c.kl_sum += v
                c.kl_count += 1


def _step_kls(rule, state, p, q):
    """The chain's KL source for ``_count``: the exact step KL at judged position ``j`` of row ``i``, of the rule
    that judged it (under a stateful rule, the Cactus its plan gave that position: ``state.last.at``), from the
    step's ``(p, q)`` in float64 (``metrics.step_kl``; None where it is skipped)."""
    P, Q = p.cpu().double().numpy(), q.cpu().double().numpy()
    return lambda i, j: step_kl(rule if state is None else state.last.at(i, j), P[i, j], Q[i, j])


def _emit(ctx: DecodeContext, out, rows, toks, counts) -> tuple[list[int], torch.Tensor]:
    """Append each row's emitted tokens (cut after EOS and at ``max_new``); return how many each row
    kept and a mask of rows still running."""
    eos, max_new = ctx.eos, ctx.max_new
    kept, alive = [], []
    toks_l, counts_l = toks.tolist(), counts.tolist()
    for i, b in enumerate(rows):
        em = toks_l[i][:counts_l[i]]
        stop = False
        if eos is not None and eos in em:
            em, stop = em[:em.index(eos) + 1], True
        em = em[:max_new - len(out[b])]
        out[b] += em
        kept.append(len(em))
        alive.append(not stop and len(out[b]) < max_new)
    return kept, torch.tensor(alive, dtype=torch.bool)


def _drop_finished(alive: torch.Tensor, rows: list[int], parts: list, dev) -> list[int]:
    """Remove finished rows from every cache and pending state in ``parts``; returns the rows left."""
    if bool(alive.all()):
        return rows
    rows = [r for r, keep in zip(rows, alive.tolist(), strict=True) if keep]
    if rows:
        idx = torch.nonzero(alive.to(dev))[:, 0]
        for p in parts:
            p.select(idx)
    return rows


def _per_row(gen) -> list:
    """Per-row generators leave the batch with their rows (``_drop_finished``); one shared generator stays."""
    return [gen] if isinstance(gen, RowGenerators) else []


def _first_tokens(ctx: DecodeContext, target, ids, lens, out):
    """The prompts' prefill and each row's first token, drawn from the verifier (as when it decodes alone), its
    NLL counted. Returns (the first tokens, the verifier's features, the rows still running)."""
    with ctx.timer.phase("prefill"):
        logits, feats = target.prefill(ids, lens)
        p = sampling_probs(logits, *ctx.sampling)
        first = draw(p, ctx.gen)
    ctx.stats.prefill_calls += 1
    rows = list(range(len(out)))
    if ctx.observer is not None:
        ctx.observer.first(rows, p, first)
    kept, alive = _emit(ctx, out, rows, first[:, None], torch.ones_like(first))
    nll = nll_of(logits[:, None], first[:, None])[:, 0].tolist()
    for b in rows:
        ctx.per_seq[b].nll_sum += nll[b]
        ctx.per_seq[b].nll_count += 1
    target.pending = first
    return first, feats, alive


def _start(ctx: DecodeContext, prompts, width: int):
    """Both loops' first step: caches for ``width`` drafted positions per step, the prompts' prefill and
    first tokens (from the verifier), the drafter started on them. Returns (device, drafter, target,
    the per-row outputs, the rows still running)."""
    dev = _device(ctx.verifier)
    B = len(prompts)
    ids, lens = right_pad(prompts, ctx.eos or 0, dev)
    cap = int(lens.max()) + ctx.max_new + width + 2
    drafter = make_drafter(ctx.draft, B, cap, dev)
    target = Target(ctx.verifier, B, cap, dev, drafter.feature_layers if drafter.needs_features else ())
    out: list[list[int]] = [[] for _ in range(B)]
    first, feats, alive = _first_tokens(ctx, target, ids, lens, out)
    drafter.start(ids, lens, first, feats)
    return dev, drafter, target, out, _drop_finished(alive, list(range(B)), [target, drafter, *_per_row(ctx.gen)],
                                                     dev)


@torch.inference_mode()
def _speculative_rows(ctx: DecodeContext, prompts, rule, k: int, track_kl: bool, stop: DraftStop | None):
    """One batch of the chain loop (module docstring): draft, score, verify, advance, count, until every row
    has stopped. Returns the rows' tokens."""
    dev, drafter, target, out, rows = _start(ctx, prompts, k)
    sampling, gen, timer = ctx.sampling, ctx.gen, ctx.timer
    tap = HeadTap(ctx.verifier) if rule.reads_head else None  # the head's input, only for a rule that reads it
    state = _budget_state(rule, rows, out, ctx.max_new)
    while rows:
        with timer.phase("draft"):  # (n, J), (n, J, V), (n,) drafts per row (None with a fixed k: J = k); J the longest
            drafts, p, size = drafter.propose(k, sampling, gen, stop)
        with timer.phase("verifier"):
            with tap if tap is not None else contextlib.nullcontext():
                logits, feats = target.score(drafts)  # (n, J + 1, V)
            q = sampling_probs(logits, *sampling)
        with timer.phase("verify"):
            step = VerifierStep(drafts.shape[1], sampling, gen, logits, tap)
            ragged = {} if size is None else {"lengths": size}
            tokens, a = verify(drafts, p, q, rule.bind(step), generator=gen, check=False, **_carry(state), **ragged)
        if ctx.observer is not None:
            ctx.observer.chain(rows, drafts, p, q, tokens, a, **ragged)
        target.advance(a, tokens.gather(1, a[:, None])[:, 0])
        drafter.advance(a, tokens, feats)
        kept, alive = _emit(ctx, out, rows, tokens, a + 1)
        ctx.stats.draft_calls += drafter.forwards
        ctx.stats.verifier_calls += 1
        with timer.phase("metric"):
            n = [k] * len(rows) if size is None else size.tolist()
            nll = nll_of(logits, tokens).tolist()
            _count(ctx, rows, a.tolist(), kept, n, nll, kl=_step_kls(rule, state, p, q) if track_kl else None)
        rows = _drop_finished(alive, rows, [target, drafter, *_per_row(gen), *_carried(state)], dev)
    return out


def _budget_state(rule, rows: list[int], out: list[list[int]], max_new: int):
    """A stateful rule's per-sequence state (``SequenceBudget``) for the rows still running, each of which may
    emit ``max_new`` minus what it has emitted (its first token, from the verifier); None for other rules."""
    if not rule.stateful:
        return None
    return rule.start(len(rows), [max_new - len(out[b]) for b in rows])


def _carry(state) -> dict:
    """``state=`` for the samplers only under a stateful rule (a sampler written for stateless rules needs none)."""
    return {} if state is None else {"state": state}


def _carried(state) -> list:
    """A budget state leaves the batch with its rows (``_drop_finished``)."""
    return [] if state is None else [state]


@dataclass
class VerifierStep:
    """What the verifier produced at one decoding step, for ``Rule.bind``: ``k`` drafted positions, the
    loop's sampling transforms ``(temperature, top_k, top_p)`` and ``generator``, the verifier's
    ``logits`` (n, k + 1, V) and, when the rule declares ``reads_head`` (the loop then taps the head),
    the head's input ``hidden`` (n, k + 1, d) and its ``weight`` (V, d) and ``bias`` (V,) or None. The
    first read of the head in a batch checks that it reproduces the logits (``HeadTap.check``)."""

    k: int
    sampling: tuple
    generator: torch.Generator | None
    logits: torch.Tensor
    tap: HeadTap | None = None

    def _head(self) -> HeadTap:
        if self.tap is None:
            raise ValueError("this step carries no LM-head input: a rule that reads the verifier's head "
                             "declares reads_head = True")
        if not self.tap.checked:
            self.tap.check(self.logits)
        return self.tap

    @property
    def hidden(self) -> torch.Tensor:
        return self._head().hidden

    @property
    def weight(self) -> torch.Tensor:
        return self._head().weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self._head().bias


@torch.inference_mode()
def _autoregressive_rows(ctx: DecodeContext, prompts):
    """One batch of the verifier decoding alone: one forward and one draw per token, counted as steps that
    accept and draft nothing (``_count``). Returns the rows' tokens."""
    dev = _device(ctx.verifier)
    B = len(prompts)
    ids, lens = right_pad(prompts, ctx.eos or 0, dev)
    target = Target(ctx.verifier, B, int(lens.max()) + ctx.max_new + 2, dev)
    out: list[list[int]] = [[] for _ in range(B)]
    _, _, alive = _first_tokens(ctx, target, ids, lens, out)
    rows = _drop_finished(alive, list(range(B)), [target, *_per_row(ctx.gen)], dev)
    zero = torch.zeros(B, dtype=torch.long, device=dev)
    while rows:
        with ctx.timer.phase("verifier"):
            logits, _ = target.score(None)  # (n, 1, V)
            q = sampling_probs(logits[:, 0], *ctx.sampling)  # (n, V)
            t = draw(q, ctx.gen)[:, None]  # (n, 1)
        ctx.stats.verifier_calls += 1
        if ctx.observer is not None:
            ctx.observer.plain(rows, q, t[:, 0])
        target.advance(zero[:len(rows)], t[:, 0])
        kept, alive = _emit(ctx, out, rows, t, torch.ones(len(rows), dtype=torch.long))
        with ctx.timer.phase("metric"):
            none = [0] * len(rows)
            _count(ctx, rows, none, kept, none, nll_of(logits, t).tolist())
        rows = _drop_finished(alive, rows, [target, *_per_row(ctx.gen)], dev)
    return out


def _check_seeds(seeds, n: int) -> list[int] | None:
    if seeds is None:
        return None
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__len__") or len(seeds) != n:
        raise ValueError(f"seeds must be None or one integer seed per prompt ({n}), got {seeds!r}")
    RowGenerators.from_seeds(seeds)  # checks every seed (ValueError naming the bad one)
    return [int(x) for x in seeds]


def _run(pair, prompts, ctx: DecodeContext, body, *, batch_size: int, seed: int, chat: bool, seeds) -> DecodeResult:
    """Decode ``prompts`` ``batch_size`` at a time: ``body(ctx.for_batch(gen, counters), batch)`` (one of the
    ``_*_rows``) returns each row's tokens; then each sequence's share of its batch's time and the run's totals
    (``stats.seconds`` and the shares without the metric time)."""
    ids = prepare_prompts(pair, prompts, ctx.max_new, chat)
    seeds = _check_seeds(seeds, len(ids))
    dev = _device(pair.verifier)
    gen = torch.Generator(dev).manual_seed(int(seed))
    stats = ctx.stats
    tokens: list[list[int]] = []
    per_seq = [SequenceCounters() for _ in ids]
    t0 = time.perf_counter()
    for s in range(0, len(ids), batch_size):
        chunk, t1, m1 = per_seq[s:s + batch_size], time.perf_counter(), stats.metric_seconds
        rng = gen if seeds is None else RowGenerators.from_seeds(seeds[s:s + batch_size], dev)
        if ctx.observer is not None:
            ctx.observer.batch(s, ids[s:s + batch_size])
        tokens += body(ctx.for_batch(rng, chunk), ids[s:s + batch_size])
        for c in chunk:
            c.seconds = (time.perf_counter() - t1 - (stats.metric_seconds - m1)) / len(chunk)
    stats.seconds = time.perf_counter() - t0 - stats.metric_seconds
    for c, t in zip(per_seq, tokens, strict=True):
        c.new_tokens = len(t)
        for name in (*COUNTERS, "judged"):
            setattr(stats, name, getattr(stats, name) + getattr(c, name))
    stats.sequences = len(ids)
    texts = None
    if pair.tokenizer is not None:
        texts = [pair.tokenizer.decode(t, skip_special_tokens=True) for t in tokens]
    return DecodeResult(tokens, texts, stats, ids, per_seq)


def speculative_generate(pair: ModelPair, prompts, rule: Rule | str, k: int = 4, max_new_tokens: int = 64, *,
                         temperature: float = SAMPLING.temperature, top_k: int = SAMPLING.top_k,
                         top_p: float = SAMPLING.top_p, batch_size: int = 8, seed: int = 0, chat: bool = True,
                         track_kl: bool = True, compact: bool = True, seeds=None, observer=None,
                         draft_stop: DraftStop | float | None = None) -> DecodeResult:
    """Speculative decoding of ``prompts`` (strings, chat-wrapped if ``chat``, or token-id lists) with
    ``rule`` deciding every drafted token through ``sampler.verify`` (see the module docstring).

    ``draft_stop``: an adaptive draft length (``core.draft_stop.DraftStop(threshold, signal)``, or a threshold
    in (0, 1) of the draft's top probability): each row drafts at most ``k`` and stops its block once the
    draft's signal falls below the threshold (SpS stays lossless). ``stats.drafted`` counts the drafts made,
    ``stats.draft_calls`` the draft forwards taken.

    Randomness: ``seed`` seeds one generator shared by each batch (a row's draws then depend on its
    batch, never its law); ``seeds`` (one integer per prompt) gives row ``i`` its own generator
    (``core.draws.RowGenerators``), so its tokens do not depend on the batch size or composition either.

    Sampling defaults are the paper's (temperature 0.6, top-k 20, top-p 0.95), applied to ``p`` and
    ``q`` alike. ``track_kl`` computes the exact step ``KL(h_alg || q)`` at every judged position
    (outside the timed decode). ``compact=False`` runs Hugging Face Llama models through their own
    forward instead of the compact Llama.

    ``observer`` (for audits, ``lm.experiments.loop_audit``): an object told, at each batch, what the loop
    hands to its samplers: ``batch(start, prompts)`` (the batch's first prompt index and its token ids),
    ``first(rows, q, tokens)`` (the verifier's law of each row's first token and the draw),
    ``chain(rows, drafts, p, q, tokens, num_accepted)`` (each ``verify`` call), ``tree(rows, tokens,
    parents, p, q, result)`` (each ``verify_tree`` call) and ``plain(rows, q, tokens)`` (each verifier-alone
    draw); ``rows`` are indices within the batch (add ``start``). Tensors are the loop's own: copy to keep.
    With ``draft_stop``, ``chain`` also gets ``lengths=`` (the drafts of each row; its later columns are padding).
    """
    rule = _as_rule(rule)
    _check_args(k, batch_size, temperature, top_k, top_p)
    stop = check_draft_stop(draft_stop)
    stats = DecodeStats("speculative", rule=repr(rule), k=k)
    sampling = (temperature, top_k, top_p)
    draft, verifier = runtime_models(pair, compact)
    ctx = DecodeContext(draft, verifier, max_new_tokens, sampling, stats, pair.eos_token_id, observer)
    return _run(pair, prompts, ctx, lambda c, batch: _speculative_rows(c, batch, rule, k, track_kl, stop),
                batch_size=batch_size, seed=seed, chat=chat, seeds=seeds)


def autoregressive_generate(pair: ModelPair, prompts, max_new_tokens: int = 64, *,
                            temperature: float = SAMPLING.temperature, top_k: int = SAMPLING.top_k,
                            top_p: float = SAMPLING.top_p, batch_size: int = 8, seed: int = 0,
                            chat: bool = True, compact: bool = True, seeds=None, observer=None) -> DecodeResult:
    """The baseline: the verifier alone, one forward per token, the same sampling transforms
    (``seed`` / ``seeds`` as ``speculative_generate``)."""
    _check_args(1, batch_size, temperature, top_k, top_p)
    stats = DecodeStats("autoregressive")
    sampling = (temperature, top_k, top_p)
    _, verifier = runtime_models(pair, compact)
    ctx = DecodeContext(None, verifier, max_new_tokens, sampling, stats, pair.eos_token_id, observer)
    return _run(pair, prompts, ctx, _autoregressive_rows, batch_size=batch_size, seed=seed, chat=chat, seeds=seeds)


@torch.inference_mode()
def first_step_laws(pair: ModelPair, ids: list[int], lo: int, hi: int, *, temperature: float = SAMPLING.temperature,
                    top_k: int = SAMPLING.top_k, top_p: float = SAMPLING.top_p):
    """Teacher-forced laws along a token sequence: for each position ``i`` in ``[lo, hi)``, the
    verifier's law ``q_i`` of token ``i + 1`` given ``ids[:i + 1]`` and the draft's law ``p_i`` of the
    same token when a block starts there (its first draft step), both after the sampling transforms.
    Returns numpy arrays ``(P, Q)`` of shape (hi - lo, V) in float64. ``lo >= 1`` for a feature draft
    (it reads the verifier's feature at ``i - 1``)."""
    if not 0 <= lo < hi <= len(ids):
        raise ValueError(f"need 0 <= lo < hi <= len(ids) = {len(ids)}, got lo={lo}, hi={hi}")
    sampling = (temperature, top_k, top_p)
    draft, verifier = pair.draft, pair.verifier
    x = torch.tensor([ids], device=_device(verifier))
    if getattr(draft, "needs_features", False):
        if lo < 1:
            raise ValueError(f"a feature-level draft needs lo >= 1, got lo={lo}")
        out = verifier(input_ids=x, output_hidden_states=True)
        feats = draft.fuse([out.hidden_states[i] for i in draft.args.aux_layers])
        g = draft.unrolled(feats[:, :-1], x[:, 1:], 1)[0]  # entry j reads feature j and token j + 1
        p_logits = draft.full_logits(g[0, lo - 1:hi - 1])
    else:
        out = verifier(input_ids=x)
        p_logits = draft(input_ids=x).logits[0, lo:hi]
    q = sampling_probs(out.logits[0, lo:hi].float(), *sampling)
    p = sampling_probs(p_logits.float(), *sampling)
    return p.double().cpu().numpy(), q.double().cpu().numpy()


# -- trees --------------------------------------------------------------------------------------

def check_tree(tree):
    """``tree``: a ``core.tree.Tree`` (``StaticTree``, ``DynamicTree``, ``BudgetTree``; returned as is) or a
    ``parents`` sequence (topological, level by level; returned as a ``StaticTree``): ``core.tree.as_tree``."""
    return as_tree(tree)


@torch.inference_mode()
def _tree_rows(ctx: DecodeContext, prompts, rules, tree, scheme: str, mode: str):
    """One batch of the tree loop (module docstring): draft a tree, score it, verify it, advance along the
    accepted path, count, until every row has stopped. Returns the rows' tokens."""
    N, grown = tree_nodes(tree)
    dev, drafter, target, out, rows = _start(ctx, prompts, grown + 1)
    sampling, gen, timer = ctx.sampling, ctx.gen, ctx.timer
    levels = tree.depth  # draft forwards per step: the pending tokens, then each level but the last
    state = _budget_state(rules[0], rows, out, ctx.max_new)
    while rows:
        with timer.phase("draft"):
            tokens, par, p = drafter.propose_tree(tree, scheme, sampling, gen)  # (n, N), (n, N), (n, N, V)
        with timer.phase("verifier"):
            logits, feats = target.score_tree(tokens, par)  # (n, N + 1, V)
            q = sampling_probs(logits, *sampling)
        with timer.phase("verify"):
            res = verify_tree(tokens, par, p, q, rules, scheme, generator=gen, check=False, mode=mode,
                              **_carry(state))
        if ctx.observer is not None:
            ctx.observer.tree(rows, tokens, par, p, q, res)
        a, path = res.num_accepted, res.accepted_nodes
        target.advance_tree(path, a, res.tokens.gather(1, a[:, None])[:, 0])
        drafter.advance_tree(a, path, res.tokens, feats)
        kept, alive = _emit(ctx, out, rows, res.tokens, a + 1)
        ctx.stats.draft_calls += levels
        ctx.stats.verifier_calls += 1
        with timer.phase("metric"):
            acc = a.tolist()
            nll = _path_nll(logits, a, path, res.tokens)
            _count(ctx, rows, acc, kept, [N] * len(rows), nll, judged=[x + 1 for x in acc],
                   kl=None if state is None else _node_costs(state, a, path))
        rows = _drop_finished(alive, rows, [target, drafter, *_per_row(gen), *_carried(state)], dev)
    return out


def _path_nll(logits, a, path, tokens) -> list[list[float]]:
    """The verifier NLL of each row's emitted tokens along its accepted path: its logits at column 0 (the pending
    token), then after each accepted node."""
    cols = torch.cat([torch.zeros_like(a)[:, None], torch.where(path >= 0, path + 1, 0)], 1)
    return nll_of(logits.gather(1, cols[:, :, None].expand(-1, -1, logits.shape[-1])), tokens).tolist()


def _node_costs(state, a, path):
    """The tree's KL source for ``_count``: a budget's exact cost of the node judged at position ``j`` of row
    ``i``'s path (the root first), as charged (the certificate's sum)."""
    slots = torch.cat([torch.zeros_like(a)[:, None], path + 1], 1).tolist()  # the judged nodes, root first
    return lambda i, j: float(state.last.cost[i, slots[i][j]])


def tree_nodes(tree) -> tuple[int, int]:
    """``(verified, grown)`` nodes per step of ``tree`` (``Tree.nodes``, ``Tree.grown``): a tree that
    re-ranks (``BudgetTree``) grows more than it keeps; other trees verify all they grow."""
    tree = as_tree(tree)
    return tree.nodes, tree.grown


@torch.inference_mode()
def first_tree_step(pair: ModelPair, ids: list[int], tree, scheme: str = "deterministic", *,
                    temperature: float = SAMPLING.temperature, top_k: int = SAMPLING.top_k,
                    top_p: float = SAMPLING.top_p, seed: int = 0, compact: bool = True):
    """The runtime's first tree step after ``ids`` (a prompt whose last token is the pending one, as
    ``tree_generate`` holds it after the verifier's first token): the drafted tree and the laws
    ``verify_tree`` is handed, computed by the loop's own drafter and target (one row). Returns
    ``tokens`` (1, N) int64, ``parents`` (1, N) int64, ``draft_probs`` (1, N, V) and ``verifier_probs``
    (1, N + 1, V) float32: replicate them to sample many verifications of the same step (its law
    is ``theory.tree.tree_block_law`` of the same models, the reference ``paper_repro`` step l tests)."""
    if len(ids) < 2:
        raise ValueError(f"ids must hold a prompt and its pending token (>= 2 ids), got {len(ids)}")
    tree = check_tree(tree)
    check_tree_scheme(tree, scheme)
    _check_args(1, 1, temperature, top_k, top_p)
    draft, verifier = runtime_models(pair, compact)
    sampling = (temperature, top_k, top_p)
    dev = _device(verifier)
    gen = torch.Generator(dev).manual_seed(seed)
    N, grown = tree_nodes(tree)
    drafter = make_drafter(draft, 1, len(ids) + grown + 2, dev)
    target = Target(verifier, 1, len(ids) + grown + 2, dev,
                    drafter.feature_layers if drafter.needs_features else ())
    prompt = torch.tensor([ids[:-1]], device=dev)
    lens = torch.tensor([len(ids) - 1], device=dev)
    _, feats = target.prefill(prompt, lens)
    first = torch.tensor([ids[-1]], device=dev)
    target.pending = first
    drafter.start(prompt, lens, first, feats)
    tokens, parents, p = drafter.propose_tree(tree, scheme, sampling, gen)
    logits, _ = target.score_tree(tokens, parents)
    return tokens, parents, p, sampling_probs(logits, *sampling)


def tree_generate(pair: ModelPair, prompts, rule, tree, scheme: str = "iid", mode: str = "rounds", *,
                  max_new_tokens: int = 64, temperature: float = SAMPLING.temperature, top_k: int = SAMPLING.top_k,
                  top_p: float = SAMPLING.top_p, batch_size: int = 8, seed: int = 0,
                  chat: bool = True, compact: bool = True, seeds=None, observer=None) -> DecodeResult:
    """Tree speculative decoding of ``prompts`` (as ``speculative_generate``): each step drafts the static
    tree ``tree`` (a parents sequence, e.g. ``core.tree.branching_parents((2, 2))``, or a
    ``core.tree.DynamicTree(depth, width, children)`` grown by path probability, or EAGLE-2's
    ``core.tree.BudgetTree(nodes, depth, topk)``, grown then re-ranked to its ``nodes`` most probable,
    deterministic candidates only) with candidates
    drawn per ``scheme`` (``core.tree.SCHEMES``), scores it in one verifier forward and verifies it with
    ``core.tree.verify_tree(rule, scheme, mode)``. ``rule``: a Rule or a sequence of Rules (one per
    round). Llama-family models run as the compact Llama (``compact=False``: through their own
    forward with a 4D tree mask, as any other Hugging Face causal LM); the draft a causal LM or the
    EAGLE-3-style feature head; any other ``core.tree.Tree`` runs alike. ``seed`` / ``seeds`` as ``speculative_generate``. Returns ``DecodeResult`` (``stats.k`` = N nodes per tree; ``stats.al`` tokens per verifier call)."""
    rules = check_rules(rule if isinstance(rule, (list, tuple)) else _as_rule(rule))
    tree = check_tree(tree)
    check_tree_scheme(tree, scheme)
    check_mode(mode, rules)
    if any(r.reads_head for r in rules):
        raise ValueError(f"rule: a rule that reads the verifier's LM head is not supported on trees, got {rule!r}")
    _check_args(1, batch_size, temperature, top_k, top_p)
    draft, verifier = runtime_models(pair, compact)
    stats = DecodeStats("tree", rule=repr(rules[0] if len(rules) == 1 else rules), k=tree.nodes)
    sampling = (temperature, top_k, top_p)
    ctx = DecodeContext(draft, verifier, max_new_tokens, sampling, stats, pair.eos_token_id, observer)
    return _run(pair, prompts, ctx, lambda c, batch: _tree_rows(c, batch, rules, tree, scheme, mode),
                batch_size=batch_size, seed=seed, chat=chat, seeds=seeds)
