"""Conformance, chains: ``sampler.verify``, ``sampler.verify_flat``, the transformers hook and block
verification, every registry rule, token for token against the reference walk (``harness.chain``,
``harness.block_walk``) at the uniforms each entry point documents; and the emission primitive
(``sampler.sample_rows``, ``sampler.draw`` with ``RowGenerators``) at controlled uniforms.

Cases (hypothesis, derandomized): V from 2 to 4,096, float64 and float32 rows, every row family of
``harness.FAMILIES`` per position (zeros in p and in q, exact ties, one-hot and near-degenerate rows),
drafts the draft gives no mass, padded (-1) drafts, ragged layouts with zero-draft requests, one
generator, one generator per row / request, some requests unseeded (judged on the support of their law)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory.sampler import (
    PLACEHOLDER_TOKEN_ID,
    RowGenerators,
    draw,
    sample_rows,
    verify,
    verify_flat,
)
from cactus_theory.theory.reference import reference_bonus
from cactus_theory.theory.tree import verify_block
from tests.conformance.harness import (
    RULE_KEYS,
    Judge,
    Tally,
    as_tensor,
    block_walk,
    chain,
    chain_rows,
    chain_support,
    configurations,
    draft_token,
    family,
    float_params,
    log_row,
    one_hot,
    pad_block,
    pair,
    profile,
    read64,
    refusal,
    row_rule,
    rule_for_rows,
    tolerance,
    vocab_sizes,
)

DTYPES = (torch.float64, torch.float32)


def _case(data, rule):
    V = data.draw(st.sampled_from(vocab_sizes(rule)), label="V")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    return V, dtype, np.random.default_rng(seed)


# -- sampler.verify ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", RULE_KEYS)
def test_verify(key):
    """``verify``: one ``[B, k + 1]`` uniform draw (or ``k + 1`` per row from ``RowGenerators``); column ``j``
    accepts position ``j``, column ``k`` draws the recovered or bonus token (the rule's bonus law)."""
    _check_verify(key, ragged=False, examples=6)


@pytest.mark.parametrize("key", RULE_KEYS)
def test_verify_with_lengths(key):
    """``verify(..., lengths=)`` (an adaptive draft length, ``core.draft_stop``): row ``b`` judges its first
    ``lengths[b]`` drafts only (the padded positions after them hold rows the walk never reads), the bonus from
    row ``lengths[b]`` of ``q``. Uniforms: one ``[B, k + 1]`` draw, the emitted token at column ``k``; from
    ``RowGenerators``, ``lengths[b] + 1`` per row, the emitted token at column ``lengths[b]``."""
    _check_verify(key, ragged=True, examples=4)


def _check_verify(key, ragged: bool, examples: int) -> None:
    """``verify`` against the reference chain walk over generated cases; ``ragged``: with per-row ``lengths``
    (row ``b`` drafted ``m_b`` in 1..k), else every row ``m_b = k`` and no ``lengths`` argument."""
    configs = configurations(key)

    tally = Tally()

    @profile(examples)
    @given(data=st.data())
    def run(data):
        rule = configs[data.draw(st.integers(0, len(configs) - 1), label="config")]
        V, dtype, rng = _case(data, rule)
        k = data.draw(st.integers(1, 4), label="k")
        B = data.draw(st.integers(1, 3 if V > 64 else 24), label="B")
        rows = data.draw(st.booleans(), label="RowGenerators")
        P, Q, n = chain_rows(rng, B, k, V, float_params(rule, dtype))
        size = rng.integers(1, k + 1, size=B) if ragged else np.full(B, k)
        Pt, Qt = as_tensor(P, dtype), as_tensor(Q, dtype)
        P, Q = read64(Pt), read64(Qt)
        bound = rule_for_rows(rule, P, Q[:, :k], rng)
        hit = getattr(bound, "hit", None)
        seeds = [int(s) for s in rng.integers(0, 2**62, size=B)]
        gen = RowGenerators.from_seeds(seeds) if rows else torch.Generator().manual_seed(seeds[0])
        lengths = {"lengths": torch.from_numpy(size)} if ragged else {}
        tokens, acc = verify(torch.from_numpy(n), Pt, Qt, bound, generator=gen, **lengths)
        if not rows:
            u = torch.rand((B, k + 1), generator=torch.Generator().manual_seed(seeds[0]), dtype=torch.float64).numpy()
        judge = tally.judge(tolerance(dtype))
        for b in range(B):
            m = int(size[b])
            if rows:
                ub = torch.rand(m + 1, generator=torch.Generator().manual_seed(seeds[b]), dtype=torch.float64).numpy()
                last = ub[m]
            else:
                ub, last = u[b], u[b, k]

            def rule_of(j, b=b):
                return row_rule(rule, None if hit is None else hit[b, j])
            want = chain(rule_of, n[b, :m], P[b, :m], Q[b, :m + 1], ub, last, judge,
                         bonus_law=reference_bonus(rule_of(0), Q[b, m]))
            judge.done(want)
            if want is not None:
                assert tokens[b].tolist() == pad_block(want, k + 1), (b, m, rule, tokens[b].tolist(), want)
                assert int(acc[b]) == len(want) - 1
        judge.check_coverage()

    run()
    tally.check()


# -- sampler.verify_flat -------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", RULE_KEYS)
def test_verify_flat(key):
    """``verify_flat`` in vLLM V1's ragged layout: requests with 0..4 drafts, padded drafts, one-hot or given
    draft laws, ``max_spec_len`` wider than needed. One generator: one ``[B, K + 1]`` draw (column ``K``
    draws each request's token); per-request generators: ``n_b + 1`` draws each (acceptance, then the
    recovery or own bonus at column ``n_b``), none for a zero-draft request; requests without one are
    judged on the support of their law."""
    configs = configurations(key)

    tally = Tally()

    @profile(6)
    @given(data=st.data())
    def run(data):
        rule = configs[data.draw(st.integers(0, len(configs) - 1), label="config")]
        V, dtype, rng = _case(data, rule)
        B = data.draw(st.integers(1, 3 if V > 64 else 16), label="B")
        mode = data.draw(st.sampled_from(["one", "all", "some", "none"]), label="generators")
        onehot_drafts = data.draw(st.booleans(), label="one-hot drafts")
        wide = data.draw(st.integers(0, 2), label="extra width")
        counts = [int(c) for c in rng.choice([0, 1, 2, 3, 4], size=B, p=[0.2, 0.2, 0.2, 0.2, 0.2])]
        T, K = sum(counts), max(counts)
        Pf, Qf, ids = np.zeros((T, V)), np.zeros((T, V)), np.zeros(T, dtype=np.int64)
        for t in range(T):
            p, q = pair(rng, V, family(rng, V), float_params(rule, dtype))
            Qf[t] = q
            if onehot_drafts:
                ids[t] = draft_token(rng, q) if rng.random() < 0.8 else int(rng.integers(V))
                Pf[t] = one_hot(V, ids[t])
            else:
                Pf[t], ids[t] = p, draft_token(rng, p)
            if rng.random() < 0.08:
                ids[t] = -1  # a padded draft
        bonus = rng.integers(0, V, size=B)
        own_bonus = not rule.bonus_from_q
        BQ = np.stack([pair(rng, V, family(rng, V))[1] for _ in range(B)]) if own_bonus else None
        Pt, Qt = (None if onehot_drafts else as_tensor(Pf, dtype)), as_tensor(Qf, dtype)
        Qf = read64(Qt)
        if not onehot_drafts:
            Pf = read64(Pt)
        bound = rule_for_rows(rule, Pf, Qf, rng)
        hit = getattr(bound, "hit", None)
        BQt = None if BQ is None else as_tensor(BQ, dtype)
        BQ = None if BQt is None else read64(BQt)
        seeds = {b: int(s) for b, s in enumerate(rng.integers(0, 2**62, size=B))}
        if mode == "one":
            gen = torch.Generator().manual_seed(seeds[0])
        elif mode == "none":
            gen = None
        else:
            keep = [b for b in range(B) if mode == "all" or rng.random() < 0.5]
            gen = {b: torch.Generator().manual_seed(seeds[b]) for b in keep}
        width = K + wide
        with torch.random.fork_rng():
            torch.manual_seed(int(rng.integers(2**31)))
            out = verify_flat(torch.from_numpy(ids).to(torch.int32 if rng.random() < 0.5 else torch.int64),
                              torch.tensor(np.cumsum(counts), dtype=torch.int64), Pt, Qt,
                              torch.from_numpy(bonus).reshape(-1, 1), bound, gen,
                              max_spec_len=width if wide else None, bonus_probs=BQt)
        assert out.dtype == torch.int32 and tuple(out.shape) == (B, width + 1)
        if mode == "one":
            u_all = torch.rand((B, width + 1), generator=torch.Generator().manual_seed(seeds[0]),
                               dtype=torch.float64).numpy()
        judge = tally.judge(tolerance(dtype))
        s = 0
        for b, c in enumerate(counts):
            sl = slice(s, s + c)
            s += c

            def rule_of(j, sl=sl):
                return row_rule(rule, None if hit is None else hit[sl][j])
            law = None if BQ is None else reference_bonus(rule, BQ[b])  # a rule's own bonus law (Medusa: argmax)
            got = [int(x) for x in out[b].tolist() if x != PLACEHOLDER_TOKEN_ID]
            assert out[b, len(got):].eq(PLACEHOLDER_TOKEN_ID).all() and 1 <= len(got) <= c + 1
            if mode == "one":
                us, last = u_all[b], u_all[b, width]
            elif c == 0 and law is None:  # no drafts, no draws: the caller's bonus token
                judge.done(True)
                assert got == [int(bonus[b])], (b, got)
                continue
            elif isinstance(gen, dict) and b in gen and c > 0:
                us = torch.rand(c + 1, generator=torch.Generator().manual_seed(seeds[b]), dtype=torch.float64).numpy()
                last = us[c]
            else:
                bad = chain_support(rule_of, ids[sl], Pf[sl], Qf[sl], got, judge.tol, bonus=bonus[b], bonus_law=law)
                assert bad is None, (b, rule, bad)
                continue
            want = chain(rule_of, ids[sl], Pf[sl], Qf[sl], us, last, judge, bonus=bonus[b], bonus_law=law)
            judge.done(want)
            if want is not None:
                assert got == want, (b, rule, counts, got, want)
        if mode in ("one", "all"):
            judge.check_coverage()

    run()
    tally.check()


# -- the transformers hook ---------------------------------------------------------------------------------

@pytest.mark.parametrize("key", RULE_KEYS)
def test_transformers_hook(key):
    """``use_rule(rule, generator)`` in place of transformers' ``_speculative_sampling``: ``p`` and ``q`` are
    the float32 softmax of the assistant's and the target's processed logits (``-inf``: zero mass), the
    candidates the last ``k`` ids; ``verify``'s uniform layout (one ``[1, k + 1]`` draw; ``k = 0``: one
    uniform for the token drawn from ``q``)."""
    from transformers.generation import utils as gen_utils

    from cactus_theory.integrations.transformers import use_rule

    configs = configurations(key)
    why = refusal("transformers", configs[0])
    if why is not None:  # declared: the hook has no LM-head input to bind
        with pytest.raises(ValueError, match=why), use_rule(configs[0]):
            pass
        return

    tally = Tally()

    @profile(6)
    @given(data=st.data())
    def run(data):
        rule = configs[data.draw(st.integers(0, len(configs) - 1), label="config")]
        V, _, rng = _case(data, rule)
        judge = tally.judge(tolerance(torch.float32))
        for call in range(3 if V > 64 else 8):
            k = int(rng.integers(0, 5))
            P, Q, n = chain_rows(rng, 1, k, V, float_params(rule, torch.float32))
            cand = torch.from_numpy(log_row(P)).float()
            new = torch.from_numpy(log_row(Q)).float()
            P64 = cand.softmax(-1).double().numpy()[0]  # what the hook reads: softmax of the logits in float32
            Q64 = new.softmax(-1).double().numpy()[0]
            ids = torch.tensor([[int(x) for x in rng.integers(0, V, 3)] + [int(x) for x in n[0]]])
            seed = int(rng.integers(2**62))
            with use_rule(rule, generator=torch.Generator().manual_seed(seed)):
                toks, a = gen_utils._speculative_sampling(ids, cand, k, new, None)
            g = torch.Generator().manual_seed(seed)  # k > 0: verify's [1, k + 1] draw; k = 0: one uniform
            u = (torch.rand((1, k + 1), generator=g, dtype=torch.float64)[0] if k else
                 torch.rand(1, generator=g, dtype=torch.float64)).numpy()
            want = chain(lambda j: rule, n[0], P64, Q64, u, u[k], judge, bonus_law=reference_bonus(rule, Q64[k]))
            judge.done(want)
            if want is not None:
                assert toks[0].tolist() == want and int(a) == len(want) - 1, (call, rule, toks, want)
        judge.check_coverage(0.4)

    run()
    tally.check()


# -- block verification ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", RULE_KEYS)
def test_block_verification(key):
    """``verify_block`` (lossless only: a rule whose registry entry is not ``lossless`` is refused) against the
    algorithm re-implemented in ``harness.block_walk``, at its documented uniforms (``u[:, i - 1]`` is
    ``eta_i``, ``u[:, k]`` draws the emitted token)."""
    configs = configurations(key)
    why = refusal("verify_block", configs[0])
    if why is not None:
        P, Q, n = chain_rows(np.random.default_rng(0), 1, 2, 4)
        with pytest.raises(ValueError, match=why):
            verify_block(torch.from_numpy(n), torch.from_numpy(P), torch.from_numpy(Q), configs[0])
        return

    tally = Tally()

    @profile(10)
    @given(data=st.data())
    def run(data):
        rule = configs[data.draw(st.integers(0, len(configs) - 1), label="config")]
        V, dtype, rng = _case(data, rule)
        k = data.draw(st.integers(1, 4), label="k")
        B = data.draw(st.integers(1, 3 if V > 64 else 32), label="B")
        P, Q, n = chain_rows(rng, B, k, V)
        Pt, Qt = as_tensor(P, dtype), as_tensor(Q, dtype)
        P, Q = read64(Pt), read64(Qt)
        seed = int(rng.integers(2**62))
        tokens, tau = verify_block(torch.from_numpy(n), Pt, Qt, rule, generator=torch.Generator().manual_seed(seed))
        u = torch.rand((B, k + 1), generator=torch.Generator().manual_seed(seed), dtype=torch.float64).numpy()
        judge = tally.judge(tolerance(dtype))
        for b in range(B):
            want = block_walk(P[b], Q[b], n[b], u[b], judge)
            judge.done(want)
            if want is not None:
                assert tokens[b].tolist() == pad_block(want, k + 1) and int(tau[b]) == len(want) - 1, (b, want)
        judge.check_coverage()

    run()
    tally.check()


# -- emission ------------------------------------------------------------------------------------------------

@profile(8)
@given(seed=st.integers(0, 2**32 - 1), V=st.sampled_from([2, 3, 7, 64, 1000, 4096]))
def test_emission_at_controlled_uniforms(seed, V):
    """``sample_rows(probs, u)`` at uniforms placed inside chosen tokens' CDF intervals (their midpoints,
    boundaries computed in extended precision), at 0 and just below 1 (the last token, when its
    mass is above float64's resolution): it returns exactly that token, never
    one of zero mass; rows near-degenerate (tails of 1e-6 over thousands of tokens), tied, with zeros,
    unnormalised. ``draw`` with ``RowGenerators`` is ``sample_rows`` at each row's own first uniform."""
    rng = np.random.default_rng(seed)
    rows, us, want = [], [], []
    for _ in range(12):
        fam = str(rng.choice(["near_degenerate", "ties", "zeros_in_q", "random", "onehot_q", "tail"]))
        if fam == "tail":
            w = np.full(V, 1e-6 / max(V - 1, 1))
            w[int(rng.integers(V))] = 1 - 1e-6
        else:
            w = pair(rng, V, fam)[1]
        w = w * float(rng.choice([1.0, 0.5, 3.0]))  # need not sum to 1
        c = np.cumsum(w.astype(np.longdouble))
        total = c[-1]
        live = np.flatnonzero(w > 0)
        wide = [y for y in live if w[y] > 1e-11 * float(total)]
        for y in rng.choice(wide, size=min(3, len(wide)), replace=False):
            lo = c[y - 1] if y > 0 else np.longdouble(0)
            rows.append(w)
            us.append(float((lo + np.longdouble(w[y]) / 2) / total))
            want.append(int(y))
        rows.append(w)  # u = 0: the first token of positive mass
        us.append(0.0)
        want.append(int(live[0]))
        if live[-1] in wide:  # u just below 1: the last token (when its mass is above float64's resolution)
            rows.append(w)
            us.append(float(np.nextafter(1.0, 0.0)))
            want.append(int(live[-1]))
    got = sample_rows(torch.from_numpy(np.stack(rows)), torch.tensor(us, dtype=torch.float64))
    assert got.tolist() == want
    # draw with one generator per row: row b's first uniform, by the same inverse CDF
    seeds = [int(s) for s in rng.integers(0, 2**62, size=len(rows))]
    got = draw(torch.from_numpy(np.stack(rows)), RowGenerators.from_seeds(seeds))
    u = [float(torch.rand(1, generator=torch.Generator().manual_seed(s), dtype=torch.float64)) for s in seeds]
    judge = Judge(1e-12)
    for b, (w, x) in enumerate(zip(rows, u, strict=True)):
        y = judge.draw(w, x)
        if y is not None:
            assert int(got[b]) == y, (b, x)
