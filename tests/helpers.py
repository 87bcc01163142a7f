"""Shared test helpers, imported as ``from tests.helpers import ...`` (fixtures stay in ``conftest.py``).

Cases are drawn as (kind, V, seed) by hypothesis and built by ``cactus_theory.theory.cases.make_pair``,
so every random and adversarial kind (p = q, one-hot q, disjoint supports, zeros on either side,
q_n = 1, tiny q_n, q_n on TAS's threshold or within 1e-12..1e-6 of it, q_n tied with the k-th
largest q) is covered and any failure replays exactly.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from cactus_theory.theory.cases import CASE_KINDS, make_pair


@st.composite
def cases(draw, min_V: int = 2, max_V: int = 12, kinds=CASE_KINDS):
    """A (p, q, n) case: ``n`` drawn from ``p``; positive masses >= 1e-6."""
    kind = draw(st.sampled_from(kinds))
    V = draw(st.integers(min_V, max_V))
    seed = draw(st.integers(0, 2**32 - 1))
    p, q, n = make_pair(kind, V, np.random.default_rng(seed))
    return p, q, n


deltas = st.sampled_from([1e-4, 1e-3, 0.01, 0.05, 0.2, 0.5, 1.0, 3.0])


def fitted(rule, V: int):
    """``rule`` usable on a vocabulary of ``V`` tokens: a TopK with ``k > V`` (refused) becomes ``k = V``."""
    import dataclasses

    from cactus_theory.rules import TopK

    if isinstance(rule, TopK) and rule.k > V:
        return dataclasses.replace(rule, k=V)  # every other option kept (recovery, convention)
    return rule


def assert_step_matches_reference(rule, p, q, n: int) -> None:
    """``rule``'s ``phi_n`` and ``g_n`` (numpy and torch) and its one-step law (default and generic paths) equal
    the independent re-implementation of ``theory.reference`` on the float64 rows ``p``, ``q`` (atol 1e-12)."""
    import numpy as np
    import pytest
    import torch

    import cactus_theory as ct
    from cactus_theory.exact import induced_generic
    from cactus_theory.theory.reference import reference_law, reference_step

    phi_ref, g_ref = reference_step(rule, p, q, n)
    assert float(rule.accept_prob(p, q, np.asarray(n))) == pytest.approx(phi_ref, abs=1e-12)
    np.testing.assert_allclose(rule.residual(p, q, np.asarray(n)), g_ref, rtol=0, atol=1e-12)
    pt, qt = torch.from_numpy(p), torch.from_numpy(q)
    assert float(rule.accept_prob(pt, qt, torch.tensor(n))) == pytest.approx(phi_ref, abs=1e-12)
    np.testing.assert_allclose(rule.residual(pt, qt, torch.tensor(n)).numpy(), g_ref, rtol=0, atol=1e-12)
    law = reference_law(rule, p, q)
    np.testing.assert_allclose(ct.induced_distribution(rule, p, q), law, rtol=0, atol=1e-12)
    np.testing.assert_allclose(induced_generic(rule, p, q), law, rtol=0, atol=1e-12)


def tiny_llama(seed: int, vocab: int = 10, hidden: int = 16, layers: int = 2, ctx: int = 64, scale: float = 4.0):
    """A tiny random Hugging Face Llama (seeded by ``seed``) for exact-law tests: its weights are scaled by
    ``scale`` for sharper, more varied next-token laws than the default init (MLP width ``2 * hidden``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=ctx,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(scale)
    return m


def holm_written_out(p, alpha: float = 0.05) -> tuple[list[float], set[int]]:
    """Holm's step-down, written out (the tests' reference for every Holm the project computes): the adjusted
    p-values (running maximum of ``(m - rank) p`` over the sorted p-values, capped at 1) and the rejected set (walk
    up the sorted p-values while ``p_(i) <= alpha / (m - i)``, 0-based ``i``)."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adj, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    rejected = set()
    for rank, i in enumerate(order):
        if p[i] > alpha / (m - rank):
            break
        rejected.add(i)
    return adj, rejected
