"""Batched chain verification of drafted blocks, for any rule, in torch (CPU or CUDA).

One call verifies ``k`` drafted tokens for each of ``B`` sequences. Position ``j`` of row ``b``
accepts its drafted token ``n = draft_tokens[b, j]`` with probability ``phi_n`` computed by the
rule's own code from ``p_n = draft_probs[b, j, n]``, ``q_n = verifier_probs[b, j, n]`` and the
rule's row statistics of ``q`` (none for SpS / Cactus, so only one probability per position is
read). The first rejection ends the row: a token is drawn there from the rule's recovery law
``g_n = rule.residual(p, q, n)``, built for that one position only (B rows, never B*k*V). If all
``k`` drafts are accepted, a bonus token is drawn from the verifier's row ``k`` (plain ``q``, not
any ``h``).

Draws use ``torch.rand`` (uniforms for acceptance, ``u < phi_n``) and an inverse-CDF draw for the
emitted token, all from ``generator`` on the generator's device, so a seeded generator reproduces
the output exactly on a given device.
"""

from __future__ import annotations

import torch

from .rules import Rule
from .validate import check_probs, check_token

__all__ = ["verify", "sample_rows", "check_common"]


def check_common(rule, **tensors: torch.Tensor | None) -> None:
    """Checks shared by the verification entry points: ``rule`` is a Rule and every named argument
    is a ``torch.Tensor`` (``None`` where the entry point allows it), all on one device.

    Shapes, token ranges (``validate.check_token``) and probability rows (``validate.check_probs``:
    two reductions, no copy) are checked by each entry point for its own layout.
    """
    if not isinstance(rule, Rule):
        raise ValueError(f"rule must be a cactus_theory Rule (SpS(), Cactus(...), ...), got {rule!r}")
    for name, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    devs = {t.device for t in tensors.values() if t is not None}
    if len(devs) > 1:
        names = ", ".join(n for n, t in tensors.items() if t is not None)
        raise ValueError(f"{names} must be on one device, got {devs}")


def _validate(draft_tokens, draft_probs, verifier_probs, rule, generator) -> None:
    check_common(rule, draft_tokens=draft_tokens, draft_probs=draft_probs, verifier_probs=verifier_probs)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {generator!r} "
                         "(seed one with torch.Generator().manual_seed(seed))")
    if draft_tokens.ndim != 2:
        raise ValueError(f"draft_tokens must have shape (B, k), got {tuple(draft_tokens.shape)}")
    B, k = draft_tokens.shape
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


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    verifier_probs: torch.Tensor,
    rule: Rule,
    generator: torch.Generator | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify ``k`` drafted tokens per sequence with ``rule``; return emitted tokens and counts.

    Args:
        draft_tokens: ``[B, k]`` int64. Token ``n`` drafted at each position.
        draft_probs: ``[B, k, V]`` float. Draft law ``p`` each drafted token was sampled from.
        verifier_probs: ``[B, k + 1, V]`` float. Verifier law ``q`` at each drafted position;
            row ``k`` is the law of the bonus token after all ``k`` drafts.
        rule: any ``cactus_theory`` rule (``SpS()``, ``Cactus(delta)``, ``TAS(...)``, ...).
        generator: ``torch.Generator`` for all random draws (uniforms are drawn on its device).
        check: validate inputs (shapes, ids in [0, V), finite normalised rows within
            ``validate.prob_atol``: 1e-4 float32, 1e-2 float16/bfloat16, 1e-6 float64). It costs
            two reductions over each probability tensor (no copy), a fraction of the call
            (``benchmarks/bench_sampler.py`` prints it); ``False`` skips it for trusted callers.

    Returns:
        tokens: ``[B, k + 1]`` int64. The ``a_b`` accepted drafts, then one recovered (or bonus)
            token, then ``-1`` padding.
        num_accepted: ``[B]`` int64. ``a_b`` in ``[0, k]``, accepted drafts (bonus not counted).

    Acceptance: ``u_j < phi_n`` with ``u_j ~ U[0, 1)``, so ``phi_n = 0`` (e.g. ``p_n = 0``) never
    accepts and ``phi_n = 1`` always does. float16 / bfloat16 inputs are computed in float32.
    """
    if check:
        _validate(draft_tokens, draft_probs, verifier_probs, rule, generator)
    B, k = draft_tokens.shape
    dt = _compute_dtype(draft_probs, verifier_probs)
    n = draft_tokens.long()
    p_all, q_all = draft_probs, verifier_probs  # converted below only where read

    # acceptance: one probability per position (+ the rule's row stats of q, if any)
    p_n = p_all.gather(-1, n.unsqueeze(-1)).squeeze(-1).to(dt)  # [B, k]
    q_n = q_all[:, :k].gather(-1, n.unsqueeze(-1)).squeeze(-1).to(dt)  # [B, k]
    has_stats = type(rule).row_stats is not Rule.row_stats  # SpS / Cactus: nothing else is read
    stats = rule.row_stats(q_all[:, :k].to(dt)) if has_stats else ()
    phi = rule.accept_from(p_n, q_n, *[s[..., 0] for s in stats])  # [B, k]

    dev = generator.device if generator is not None else draft_probs.device
    u = torch.rand((B, k + 1), generator=generator, device=dev, dtype=torch.float64).to(draft_probs.device)
    accepted = u[:, :k] < phi.double()  # [B, k]
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # [B]: index of the first rejection, or k

    # the one row each sequence draws from: recovery at its first rejection, or the bonus row q[k]
    rows = torch.arange(B, device=n.device)
    j = num_accepted.clamp_max(k - 1)
    p_r, q_r, n_r = p_all[rows, j].to(dt), q_all[rows, j].to(dt), n[rows, j]  # [B, V], [B, V], [B]
    g = rule.residual(p_r, q_r, n_r, check=False)  # [B, V]
    full = (num_accepted == k).unsqueeze(-1)
    own = g.dtype == dt and g.is_contiguous()  # g is built from our row copies: safe to overwrite
    dist = torch.where(full, q_all[:, k].to(dt), g, out=g if own else None)  # [B, V]
    last = sample_rows(dist, u[:, k])  # [B]

    pos = torch.arange(k + 1, device=n.device)
    n_pad = torch.cat([n, n.new_full((B, 1), -1)], dim=1)
    tokens = torch.where(pos < num_accepted.unsqueeze(-1), n_pad, torch.full_like(n_pad, -1))
    tokens.scatter_(1, num_accepted.unsqueeze(-1), last.unsqueeze(-1))
    return tokens, num_accepted
