"""Batched chain verification of drafted blocks, for any rule, in torch (CPU or CUDA).

One call verifies ``k`` drafted tokens for each of ``B`` sequences. Position ``j`` of row ``b``
accepts its drafted token ``n = draft_tokens[b, j]`` with probability ``phi_n`` computed by the
rule's own code from ``p_n = draft_probs[b, j, n]``, ``q_n = verifier_probs[b, j, n]`` and the
rule's row statistics of ``q`` (none for SpS / Cactus, so only one probability per position is
read). The first rejection ends the row: a token is drawn there from the rule's recovery law
``g_n = rule.residual(p, q, n)``, built for that one position only (B rows, never B*k*V). If all
``k`` drafts are accepted, a bonus token is drawn from the verifier's row ``k``: plain ``q``, not any
``h``, unless the rule declares ``bonus_from_q = False`` (then from ``rule.bonus(q)``: Medusa's
``argmax q``).

Draws use ``torch.rand`` (uniforms for acceptance, ``u < phi_n``) and an inverse-CDF draw for the
emitted token, all from ``generator`` on the generator's device, so a seeded generator reproduces
the output exactly on a given device.
"""

from __future__ import annotations

import numpy as np
import torch

from .draws import RowGenerators, check_generator, uniforms
from .rules import Rule, refuse_stateful
from .validate import check_int, check_probs, check_token

__all__ = ["verify", "verify_flat", "sample_rows", "draw", "check_common", "PLACEHOLDER_TOKEN_ID", "RowGenerators"]

PLACEHOLDER_TOKEN_ID = -1  # vLLM V1's filler after the last emitted token of a request


def check_common(rule, stateful: bool = False, **tensors: torch.Tensor | None) -> None:
    """Checks shared by the verification entry points: ``rule`` is a Rule (a ``stateful`` one only where
    the entry point carries its state) and every named argument is a ``torch.Tensor`` (``None`` where the
    entry point allows it), all on one device.

    Shapes, token ranges (``validate.check_token``) and probability rows (``validate.check_probs``:
    two reductions, no copy) are checked by each entry point for its own layout.
    """
    if not isinstance(rule, Rule):
        raise ValueError(f"rule must be a cactus_theory Rule (SpS(), Cactus(...), ...), got {rule!r}")
    if rule.stateful and not stateful:
        refuse_stateful(rule, where="this entry point (vLLM's flat layout has no per-request state)")
    for name, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    devs = {t.device for t in tensors.values() if t is not None}
    if len(devs) > 1:
        names = ", ".join(n for n, t in tensors.items() if t is not None)
        raise ValueError(f"{names} must be on one device, got {devs}")


def _validate(draft_tokens, draft_probs, verifier_probs, rule, generator) -> None:
    check_common(rule, True, draft_tokens=draft_tokens, draft_probs=draft_probs, verifier_probs=verifier_probs)
    if draft_tokens.ndim != 2:
        raise ValueError(f"draft_tokens must have shape (B, k), got {tuple(draft_tokens.shape)}")
    B, k = draft_tokens.shape
    check_generator(generator, B)
    if k < 1:
        raise ValueError(f"draft_tokens must hold k >= 1 drafted tokens per row, got k = {k}")
    if draft_probs.ndim != 3 or tuple(draft_probs.shape[:2]) != (B, k):
        raise ValueError(f"draft_probs must have shape (B, k, V) = ({B}, {k}, V), got {tuple(draft_probs.shape)}")
    V = draft_probs.shape[-1]
    if tuple(verifier_probs.shape) != (B, k + 1, V):
        raise ValueError(
            f"verifier_probs must have shape (B, k + 1, V) = ({B}, {k + 1}, {V}), got "
            f"{tuple(verifier_probs.shape)}"
        )
    check_token(draft_tokens, V, (B, k), "draft_tokens")
    check_probs(draft_probs, "draft_probs")
    check_probs(verifier_probs, "verifier_probs")


def _detached(t):
    """``t.detach()`` for a tensor (verification is not differentiable); anything else as it is (validated later)."""
    return t.detach() if isinstance(t, torch.Tensor) else t


def _check_generators(generator, B: int) -> None:
    """``verify_flat``'s ``generator``: None, one ``torch.Generator``, or ``{request index: torch.Generator}``
    with every key an integer in ``[0, B)`` (no negative index: ``-1`` is not "the last request") and
    every value a ``torch.Generator`` (uniforms are drawn on its own device, as ``verify`` does)."""
    if generator is None or isinstance(generator, torch.Generator):
        return
    if not isinstance(generator, dict):
        raise ValueError(f"generator must be None, a torch.Generator or a dict {{request index: torch.Generator}}, "
                         f"got {type(generator).__name__}")
    for b, g in generator.items():
        if isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, np.integer)):
            raise ValueError(f"generator: key {b!r} must be a request index, an integer in [0, {B})")
        i = int(b)
        if not 0 <= i < B:
            raise ValueError(f"generator: key {b!r} is not a request index in [0, {B}) (B = {B} requests)")
        if not isinstance(g, torch.Generator):
            raise ValueError(f"generator: the value for request {b!r} must be a torch.Generator, got "
                             f"{type(g).__name__}")


def _compute_dtype(*ts: torch.Tensor) -> torch.dtype:
    """float16 / bfloat16 are computed in float32; float32 and float64 are kept (promoted together)."""
    dt = torch.promote_types(ts[0].dtype, ts[1].dtype)
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


def sample_rows(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw, one token per row: ``probs`` (R, V) non-negative (need not sum to 1),
    ``u`` (R,) uniforms in [0, 1) -> (R,) int64 with ``P(y) = probs[y] / sum(probs)``.

    The CDF is accumulated in float64; the draw is the first ``y`` with ``cdf[y] > u * cdf[V-1]``,
    capped at the last token with positive mass, so a zero-mass token is never returned.
    """
    cdf = probs.clamp_min(0).cumsum(-1, dtype=torch.float64)  # [R, V]
    total = cdf[:, -1:].contiguous()
    y = torch.searchsorted(cdf, u.double().unsqueeze(-1) * total, right=True)
    last_pos = torch.searchsorted(cdf, total, right=False)  # cdf first reaches the total here
    return torch.minimum(y, last_pos).squeeze(-1)


def draw(probs: torch.Tensor, generator=None) -> torch.Tensor:
    """One token per row from ``probs`` (B, V) (non-negative rows; need not sum to 1) -> (B,) int64.

    One ``torch.Generator`` (or None): ``torch.multinomial`` from it, the stream plain sampling has always
    used. ``RowGenerators``: row ``b``'s token by inverse CDF (``sample_rows``) at one float64 uniform
    from its own generator, so it does not depend on the other rows."""
    if isinstance(generator, RowGenerators):
        return sample_rows(probs, generator.rand(1, probs.device)[:, 0])
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    verifier_probs: torch.Tensor,
    rule: Rule,
    generator: torch.Generator | None = None,
    check: bool = True,
    state=None,
    lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify ``k`` drafted tokens per sequence with ``rule``; return emitted tokens and counts.

    Args:
        draft_tokens: ``[B, k]`` int64. Token ``n`` drafted at each position.
        draft_probs: ``[B, k, V]`` float. Draft law ``p`` each drafted token was sampled from.
        verifier_probs: ``[B, k + 1, V]`` float. Verifier law ``q`` at each drafted position;
            row ``k`` is the verifier's law after all ``k`` drafts: the bonus token is drawn from it
            (from ``rule.bonus(row k)`` for a rule with ``bonus_from_q = False``).
        rule: any ``cactus_theory`` rule (``SpS()``, ``Cactus(delta)``, ``TAS(...)``, ...).
        generator: ``torch.Generator`` for all random draws (uniforms are drawn on its device), or a
            ``RowGenerators`` (one generator per row: row ``b`` draws its ``k + 1`` uniforms from its own).
        check: validate inputs (shapes, ids in [0, V), finite normalised rows within
            ``validate.prob_atol``: 1e-4 float32, 1e-2 float16/bfloat16, 1e-6 float64). It costs
            two reductions over each probability tensor (no copy), a fraction of the call
            (``benchmarks/bench_sampler.py`` prints it); ``False`` skips it for trusted callers.
        state: the per-sequence state of a rule that declares ``stateful`` (``SequenceBudget``: from
            ``rule.start(B, max_tokens)``), one entry per row, updated in place: before any draw the
            rule plans each position (``rule.plan``: Cactus's ``delta`` at position ``j`` from the budget
            left after charging positions ``1..j-1``), then each row is charged the costs of the positions
            it judged (its accepted drafts and the first rejected one). ``None`` for every other rule.
        lengths: ``[B]`` int64 in ``[1, k]`` or None (every row ``k``): row ``b`` drafted only its first
            ``lengths[b]`` positions (an adaptive draft length, ``core.draft_stop``); the rest are padding,
            never judged. All ``lengths[b]`` accepted: the bonus is drawn from row ``lengths[b]`` of
            ``verifier_probs`` (the verifier's law after the row's last draft). Uniforms as ``verify_flat``
            draws them: one ``[B, k + 1]`` draw, the emitted token at column ``k``; from ``RowGenerators``,
            ``lengths[b] + 1`` per row, the emitted token at column ``lengths[b]`` (so a row's draws do not
            depend on the other rows' lengths).

    Returns:
        tokens: ``[B, k + 1]`` int64. The ``a_b`` accepted drafts, then one recovered (or bonus)
            token, then ``-1`` padding.
        num_accepted: ``[B]`` int64. ``a_b`` in ``[0, k]`` (``[0, lengths[b]]``), accepted drafts (bonus not
            counted).

    Acceptance: ``u_j < phi_n`` with ``u_j ~ U[0, 1)``, so ``phi_n = 0`` (e.g. ``p_n = 0``) never
    accepts and ``phi_n = 1`` always does. float16 / bfloat16 inputs are computed in float32.

    Not differentiable: verification samples tokens, so probabilities that require grad are read
    detached (no graph is built, and none is needed to call it).
    """
    draft_probs, verifier_probs = _detached(draft_probs), _detached(verifier_probs)
    if check:
        _validate(draft_tokens, draft_probs, verifier_probs, rule, generator)
        if lengths is not None:
            _check_lengths(lengths, *draft_tokens.shape)
    B, k = draft_tokens.shape
    dt = _compute_dtype(draft_probs, verifier_probs)
    n = draft_tokens.long()
    p_all, q_all = draft_probs, verifier_probs  # converted below only where read
    plan = None
    if rule.stateful:  # every position's rule is decided now, before any draw
        state = rule.check_state(state, B)
        plan = rule.plan(state, p_all, q_all)
    elif state is not None:
        raise ValueError(f"state is read only by a stateful rule (rule.stateful); {rule!r} has none: pass state=None")
    judge = rule if plan is None else plan.rows(*np.indices((B, k)))  # one delta per (row, position)

    # acceptance: one probability per position (+ the rule's row stats of q, if any)
    p_n = p_all.gather(-1, n.unsqueeze(-1)).squeeze(-1).to(dt)  # [B, k]
    q_n = q_all[:, :k].gather(-1, n.unsqueeze(-1)).squeeze(-1).to(dt)  # [B, k]
    if judge.reads_draft_row:  # a statistic of the pair of rows (FSD's divergence)
        stats = judge.pair_stats_at(p_all.to(dt), q_all[:, :k].to(dt), n)
    else:
        stats = judge.stats_at(q_all[:, :k].to(dt), n) if judge.needs_row_stats else ()  # SpS / Cactus: none
    phi = judge.accept_from(p_n, q_n, *stats)  # [B, k]

    rows = torch.arange(B, device=n.device)
    u, last_col = _uniforms(generator, B, k, lengths, draft_probs.device)  # [B, k + 1] float64, [B]
    accepted = u[:, :k] < phi.double()  # [B, k]
    if lengths is not None:  # a row's padded positions are never judged
        size = lengths.to(n.device, torch.long)
        accepted &= torch.arange(k, device=n.device) < size[:, None]
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # [B]: index of the first rejection, or k (lengths[b])
    ends = k if lengths is None else size  # [B] (or k): the row's last drafted position + 1

    # the one row each sequence draws from: recovery at its first rejection, or the bonus row q[ends]
    j = num_accepted.clamp_max(k - 1) if lengths is None else torch.minimum(num_accepted, size - 1)
    p_r, q_r, n_r = p_all[rows, j].to(dt), q_all[rows, j].to(dt), n[rows, j]  # [B, V], [B, V], [B]
    at = rule if plan is None else plan.rows(rows, j)  # the rule of each row's last judged position
    g = at.residual(p_r, q_r, n_r, check=False)  # [B, V]
    full = (num_accepted == ends).unsqueeze(-1)
    q_bonus = (q_all[:, k] if lengths is None else q_all[rows, size]).to(dt)
    bonus = q_bonus if rule.bonus_from_q else rule.bonus(q_bonus)  # the rule's bonus law (default q)
    own = g.dtype == dt and g.is_contiguous()  # g is built from our row copies: safe to overwrite
    dist = torch.where(full, bonus, g, out=g if own else None)  # [B, V]
    last = sample_rows(dist, u[:, last_col] if isinstance(last_col, int) else u[rows, last_col])  # [B]

    pos = torch.arange(k + 1, device=n.device)
    n_pad = torch.cat([n, n.new_full((B, 1), -1)], dim=1)
    tokens = torch.where(pos < num_accepted.unsqueeze(-1), n_pad, torch.full_like(n_pad, -1))
    tokens.scatter_(1, num_accepted.unsqueeze(-1), last.unsqueeze(-1))
    if plan is not None:  # charge the judged positions: the accepted drafts and the first rejected one
        a = num_accepted.cpu().numpy()
        ends_np = k if lengths is None else size.cpu().numpy()
        state.charge(plan, np.arange(k)[None, :] < np.minimum(a + 1, ends_np)[:, None], a + 1)
    return tokens, num_accepted


def _check_lengths(lengths, B: int, k: int) -> None:
    """``verify``'s ``lengths``: an integer tensor ``[B]`` with every entry in ``[1, k]``."""
    if not isinstance(lengths, torch.Tensor) or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be an integer torch.Tensor of shape (B,) = ({B},), got {lengths!r}")
    if tuple(lengths.shape) != (B,):
        raise ValueError(f"lengths must have shape (B,) = ({B},), got {tuple(lengths.shape)}")
    if B and (int(lengths.min()) < 1 or int(lengths.max()) > k):
        raise ValueError(f"lengths must lie in [1, k] = [1, {k}] (drafts judged per row), got {lengths.tolist()}")


def _uniforms(generator, B: int, k: int, lengths, device) -> tuple[torch.Tensor, torch.Tensor | int]:
    """``verify``'s uniforms ``[B, k + 1]`` and the column of each row's emitted token: one draw and column
    ``k``; with ``lengths`` and ``RowGenerators``, ``lengths[b] + 1`` from row ``b``'s generator, column
    ``lengths[b]`` (the entries after it unused)."""
    if lengths is None or not isinstance(generator, RowGenerators):
        return uniforms(generator, B, k + 1, device), k
    size = lengths.tolist()
    u = torch.zeros((B, k + 1), dtype=torch.float64, device=device)
    for b, g in enumerate(generator):
        u[b, :size[b] + 1] = torch.rand(size[b] + 1, generator=g, device=g.device, dtype=torch.float64).to(device)
    return u, lengths.to(device, torch.long)


# -- vLLM V1's flat, ragged layout -------------------------------------------------------------

def _validate_flat(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids, rule,
                   generator, max_spec_len) -> None:
    check_common(rule, draft_token_ids=draft_token_ids, cu_num_draft_tokens=cu_num_draft_tokens,
                 draft_probs=draft_probs, target_probs=target_probs, bonus_token_ids=bonus_token_ids)
    for name, t in (("draft_token_ids", draft_token_ids), ("cu_num_draft_tokens", cu_num_draft_tokens),
                    ("bonus_token_ids", bonus_token_ids)):
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"{name} must hold integers, got dtype {t.dtype}")
    if draft_token_ids.ndim != 1:
        raise ValueError(f"draft_token_ids must have shape (T,), got {tuple(draft_token_ids.shape)}")
    if cu_num_draft_tokens.ndim != 1:
        raise ValueError(f"cu_num_draft_tokens must have shape (B,), got {tuple(cu_num_draft_tokens.shape)}")
    T, B = draft_token_ids.shape[0], cu_num_draft_tokens.shape[0]
    if target_probs.ndim != 2 or target_probs.shape[0] != T:
        raise ValueError(f"target_probs must have shape (T, V) = ({T}, V), got {tuple(target_probs.shape)}")
    V = target_probs.shape[1]
    if draft_probs is not None and tuple(draft_probs.shape) != (T, V):
        raise ValueError(f"draft_probs must have shape (T, V) = ({T}, {V}) or be None, got {tuple(draft_probs.shape)}")
    if tuple(bonus_token_ids.shape) != (B, 1):
        raise ValueError(f"bonus_token_ids must have shape (B, 1) = ({B}, 1), got {tuple(bonus_token_ids.shape)}")
    cu = cu_num_draft_tokens.long().cpu()
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    if B and (counts.min() < 0 or int(cu[-1]) != T):
        raise ValueError(
            f"cu_num_draft_tokens must be non-decreasing cumulative draft counts ending at T = {T}, got "
            f"{cu.tolist()}")
    if B == 0 and T:
        raise ValueError(f"cu_num_draft_tokens is empty but draft_token_ids holds {T} tokens")
    longest = int(counts.max()) if B else 0
    if max_spec_len is not None:
        check_int(max_spec_len, "max_spec_len", low=longest)  # "an integer >= <the longest draft>"
    _check_generators(generator, B)
    ids = draft_token_ids.detach().cpu()
    if ids.numel() and (int(ids.min()) < PLACEHOLDER_TOKEN_ID or int(ids.max()) >= V):
        bad = ids[(ids < PLACEHOLDER_TOKEN_ID) | (ids >= V)]
        raise ValueError(f"draft_token_ids has token ids out of range [-1, {V}) (-1: a padded draft): "
                         f"{bad[:8].tolist()}")
    check_token(bonus_token_ids, V, (B, 1), "bonus_token_ids")
    check_probs(target_probs, "target_probs")
    if draft_probs is not None:
        check_probs(draft_probs, "draft_probs")


def verify_flat(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    rule: Rule,
    generator: torch.Generator | dict[int, torch.Generator] | None = None,
    *,
    max_spec_len: int | None = None,
    check: bool = True,
    bonus_probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """``verify`` in vLLM V1's flat, ragged layout (the layout of its ``rejection_sample``).

    Args:
        draft_token_ids: ``[T]`` int32 or int64. Drafted ids of all ``B`` requests, concatenated;
            -1 marks a padded draft (as in vLLM): always rejected, its recovered token drawn from ``q``.
        cu_num_draft_tokens: ``[B]`` int32 or int64. Cumulative draft counts (ends of each request's
            slice, no leading 0); a request may have 0 drafts (then it emits its bonus token only).
        draft_probs: ``[T, V]`` float, the draft law ``p`` each token was drawn from, or ``None``:
            one-hot drafts (``p = e_n``), as vLLM passes for n-gram and EAGLE drafters.
        target_probs: ``[T, V]`` float. Verifier law ``q`` at each drafted position (after the
            sampling transforms).
        bonus_token_ids: ``[B, 1]`` int. Drawn by the caller from each request's bonus position
            (vLLM samples them with the request's own top-k / top-p); used when all drafts pass, for a
            rule whose bonus is drawn from ``q`` (``rule.bonus_from_q``).
        rule: any ``cactus_theory`` rule.
        generator: ``None`` (torch's default generator), one ``torch.Generator`` for the batch, or
            ``{request index: torch.Generator}`` as vLLM's ``sampling_metadata.generators`` (requests
            not in it draw from the default generator). A request with its own generator draws
            ``n_b + 1`` uniforms from it (acceptance, then the recovery draw) and a request with no
            drafts draws none, so its tokens do not depend on the rest of the batch.
        max_spec_len: output width minus one; default the longest draft in the batch.
        check: validate inputs (as ``verify``); ``False`` skips it for trusted callers.
        bonus_probs: ``[B, V]`` float, the verifier's law at each request's bonus position. Required
            by a rule that draws its own bonus (``rule.bonus_from_q`` False, e.g. ``MedusaTypical``):
            a request whose drafts all pass then emits a draw from ``rule.bonus(bonus_probs)`` (with
            the uniform its recovery would have used) instead of ``bonus_token_ids``. Refused
            (``ValueError``) for a rule whose bonus is drawn from ``q``: the caller's bonus ids are used.

    Returns:
        ``[B, max_spec_len + 1]`` int32 (vLLM's ``sampled_token_ids`` dtype): each request's accepted
        drafts, then its recovered token (first rejection) or its bonus token (all accepted), then
        ``PLACEHOLDER_TOKEN_ID`` (-1).

    With one ``torch.Generator`` and equal draft counts ``k`` the uniforms are drawn exactly as
    ``verify`` draws them (one ``[B, k + 1]`` call), so the two functions emit the same tokens.
    Not differentiable, as ``verify``: probabilities that require grad are read detached.
    """
    draft_probs, target_probs = _detached(draft_probs), _detached(target_probs)
    if isinstance(rule, Rule) and rule.stateful:  # even unchecked: the flat layout carries no per-request state
        refuse_stateful(rule, where="verify_flat (vLLM's flat layout has no per-request state)")
    if check:
        _validate_flat(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids, rule,
                       generator, max_spec_len)
    dev = target_probs.device
    B, (T, V) = cu_num_draft_tokens.shape[0], target_probs.shape
    cu = cu_num_draft_tokens.to(dev, torch.long)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    counts = cu - starts  # [B]
    K = int(counts.max()) if B else 0
    K = K if max_spec_len is None else max_spec_len
    out = torch.full((B, K + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=dev)
    if B == 0:
        return out
    dt = _compute_dtype(target_probs, target_probs if draft_probs is None else draft_probs)
    ids = draft_token_ids.to(dev, torch.long)  # [T]; -1 marks a padded draft (always rejected)
    padded = ids < 0
    n = ids.clamp_min(0)

    # uniforms [B, K + 1]: column j < n_b accepts position j, column n_b (own generator) or K draws
    # the recovered token; the batch draw matches verify's [B, k + 1] call
    shared = generator if isinstance(generator, torch.Generator) else None
    gdev = shared.device if shared is not None else dev
    u = torch.rand((B, K + 1), generator=shared, device=gdev, dtype=torch.float64).to(dev)
    last_col = torch.full((B,), K, dtype=torch.long, device=dev)
    if isinstance(generator, dict):
        for b, g in generator.items():
            nb = int(counts[b])
            if nb > 0:  # no draws for a request without drafts (vLLM does the same)
                u[b, :nb + 1] = torch.rand(nb + 1, generator=g, device=g.device, dtype=torch.float64).to(dev)
                last_col[b] = nb

    # acceptance of every drafted position: one probability each (+ the rule's row stats of q)
    q_n = target_probs.gather(-1, n.unsqueeze(-1)).squeeze(-1).to(dt)  # [T]
    p_n = torch.ones_like(q_n) if draft_probs is None else draft_probs.gather(-1, n.unsqueeze(-1)).squeeze(-1).to(dt)
    if rule.reads_draft_row:  # a statistic of the pair of rows; one-hot drafts are the rows e_n
        p_rows = (torch.nn.functional.one_hot(n, V).to(dt) if draft_probs is None else draft_probs.to(dt))
        stats = rule.pair_stats_at(p_rows, target_probs.to(dt), n)
    else:
        stats = rule.stats_at(target_probs.to(dt), n) if rule.needs_row_stats else ()
    phi = rule.accept_from(p_n, q_n, *stats).masked_fill(padded, 0.0)  # [T]

    req = torch.repeat_interleave(torch.arange(B, device=dev), counts, output_size=T)  # [T] request of each
    pos = torch.arange(T, device=dev) - starts[req]  # [T] position within its request
    acc = torch.zeros((B, K), dtype=torch.bool, device=dev)
    acc[req, pos] = u[req, pos] < phi.double()
    num_accepted = acc.long().cumprod(-1).sum(-1).minimum(counts)  # [B] in [0, n_b]

    # the one token each request draws: recovery at its first rejection (or the caller's bonus)
    rejected = num_accepted < counts
    rows = torch.nonzero(rejected).squeeze(-1)
    last = bonus_token_ids.reshape(B).to(dev, torch.long).clone()
    if rule.bonus_from_q and bonus_probs is not None:
        raise ValueError(f"bonus_probs is read only by a rule that draws its own bonus token (rule.bonus_from_q "
                         f"False); {rule!r} emits bonus_token_ids: pass bonus_probs=None")
    if not rule.bonus_from_q:  # the rule's own bonus law (Medusa: argmax q), drawn here
        if not isinstance(bonus_probs, torch.Tensor) or tuple(bonus_probs.shape) != (B, V):
            got = None if bonus_probs is None else tuple(getattr(bonus_probs, "shape", ())) or type(bonus_probs).__name__
            raise ValueError(f"{rule!r} draws its own bonus token (rule.bonus): pass bonus_probs, the verifier's "
                             f"law at each bonus position, of shape (B, V) = ({B}, {V}); got {got}")
        if check:
            check_probs(bonus_probs.detach(), "bonus_probs")
        full = torch.nonzero(~rejected).squeeze(-1)
        if full.numel():
            last[full] = sample_rows(rule.bonus(bonus_probs[full].to(dev, dt)), u[full, last_col[full]])
    if rows.numel():
        t = starts[rows] + num_accepted[rows]  # flat index of each first rejection
        q_r = target_probs[t].to(dt)
        n_r = n[t]
        p_r = (torch.nn.functional.one_hot(n_r, V).to(dt) if draft_probs is None else draft_probs[t].to(dt))
        g = rule.residual(p_r, q_r, n_r, check=False)  # [R, V]
        g = torch.where(padded[t].unsqueeze(-1), q_r, g)  # a padded draft carries nothing: recover from q
        last[rows] = sample_rows(g, u[rows, last_col[rows]])

    col = torch.arange(K + 1, device=dev)
    drafted = torch.zeros((B, K + 1), dtype=torch.long, device=dev)
    drafted[req, pos] = n
    out = torch.where(col < num_accepted.unsqueeze(-1), drafted, torch.full_like(drafted, PLACEHOLDER_TOKEN_ID))
    out.scatter_(1, num_accepted.unsqueeze(-1), last.unsqueeze(-1))
    return out.to(torch.int32)
