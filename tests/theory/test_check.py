"""``check_sampler`` (theory/check.py): the exact block law against an enumeration over drafts, the best-first
top blocks, the pooling rule, correct samplers passing and wrong ones caught (with the power the design
states), the exact mode, the adapters (transformers' ``_speculative_sampling`` in one line), streaming at
V = 150,000 and every malformed sampler output refused by name.

Statistical tests: each ``check_sampler`` call is a family at ALPHA = 1e-3 (Holm over its parts) with a
fixed seed, so the file is deterministic; were the seeds redrawn, each of the 7 true-null calls here would
fail with probability <= 1e-3. Power: each call is designed for TV = 0.05 at power 0.9; every wrong port
asserted caught is first shown to sit at a pooled TV above the part's stated detectable TV (so its
detection is what the design predicts, at power >= 0.9, not luck). The calibration over >= 200 seeds is
``benchmarks/check_calibration.py`` (``benchmarks/results/check_calibration.json``).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cactus_theory as ct
from cactus_theory.sampler import verify
from cactus_theory.theory.cases import CASE_KINDS, make_pair
from cactus_theory.theory.check import (
    CHUNK_ELEMENTS,
    as_sampler,
    block_law,
    check_sampler,
    compare_laws,
    exposed_block_law,
    top_blocks,
    transformers_sampler,
    tv_interval,
)
from cactus_theory.toy import one_step_test
from tests.helpers import fitted
from tests.test_wrong_ports import WrongRecoveryCactus, bonus_from_wrong_row

pytestmark = pytest.mark.usefixtures("one_thread")

ALPHA, TV = 1e-3, 0.05
RULES = [ct.SpS(), ct.Cactus(0.5), ct.TAS(), ct.TopK(2), ct.EARS(0.3), ct.Interpolation(0.4), ct.MedusaTypical()]


def rows(seed: int, k: int = 2, V: int = 8, conc: float = 0.7):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, conc), size=k), rng.dirichlet(np.full(V, conc), size=k + 1)


def brute_block_law(rule, P, Q) -> dict:
    """{(a, n_1..n_a, y): probability} by enumerating every draft tuple and walking verify's steps with the
    rule's own accept_prob / residual (no factorisation assumed)."""
    k, V = P.shape
    bonus = ct.exact.bonus_distribution(rule, Q[k])
    law: dict = {}
    for drafts in itertools.product(range(V), repeat=k):
        w = math.prod(P[j, drafts[j]] for j in range(k))
        if w == 0:
            continue
        for j in range(k):
            n = np.array(drafts[j])
            phi = float(rule.accept_prob(P[j], Q[j], n))
            g = rule.residual(P[j], Q[j], n)
            for y in range(V):
                key = (j, *drafts[:j], y)
                law[key] = law.get(key, 0.0) + w * (1 - phi) * g[y]
            w *= phi
        for y in range(V):
            key = (k, *drafts, y)
            law[key] = law.get(key, 0.0) + w * bonus[y]
    return {key: v for key, v in law.items() if v > 0}


def pooled_tv(a: np.ndarray, b: np.ndarray, bins) -> float:
    """TV between token laws ``a`` and ``b`` on a part's bins ("token i" bins, then one "rest" bin)."""
    own = [int(name.split()[1]) for name in bins if name.startswith("token ")]
    rest = np.setdiff1d(np.arange(a.size), own)
    return 0.5 * (np.abs(a[own] - b[own]).sum() + abs(a[rest].sum() - b[rest].sum()))


@st.composite
def row_cases(draw):
    kind = draw(st.sampled_from(CASE_KINDS))
    V, k = draw(st.integers(2, 5)), draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    pairs = [make_pair(kind, V, rng) for _ in range(k + 1)]
    return np.stack([p for p, _, _ in pairs[:k]]), np.stack([q for _, q, _ in pairs]), draw(st.sampled_from(RULES))


@settings(max_examples=40, deadline=None)
@given(row_cases())
def test_the_block_law_factorises_as_the_enumeration_says(case):
    P, Q, rule = case
    rule = fitted(rule, P.shape[1])
    law = block_law(rule, P, Q)
    brute = brute_block_law(rule, P, Q)
    k = P.shape[0]
    keys = list(brute)
    tokens = np.full((len(keys), k + 1), -1)
    a = np.array([key[0] for key in keys])
    for i, key in enumerate(keys):
        tokens[i, :len(key) - 1] = key[1:]
    assert law.prob(tokens, a) == pytest.approx(np.array([brute[x] for x in keys]), abs=1e-12)
    assert sum(brute.values()) == pytest.approx(1.0, abs=1e-9)
    assert law.length_probs().sum() == pytest.approx(1.0, abs=1e-9)
    assert law.first() == pytest.approx(ct.induced_distribution(rule, P[0], Q[0]), abs=1e-12)
    # the best-first enumeration finds the most probable blocks
    m = 7
    top = top_blocks(law, m)
    want = sorted(brute.values(), reverse=True)[:m]
    assert [w for w, _ in top] == pytest.approx(want, abs=1e-12)
    assert all(brute[key] == pytest.approx(w, abs=1e-12) for w, key in top)


@pytest.mark.parametrize("rule,seed", [(ct.SpS(), 0), (ct.Cactus(0.5), 1), (ct.TAS(), 2), (ct.MedusaTypical(), 3)])
def test_a_correct_sampler_passes(rule, seed):
    P, Q = rows(seed, k=2, V=8)
    res = check_sampler(verify, P, Q, rule=rule, tv=TV, alpha=ALPHA, seed=seed)
    stat, pvalue = res
    assert (stat, pvalue) == (res.statistic, res.pvalue)
    assert not res.reject, res.table()
    for part in res.parts.values():
        assert part.detectable_tv <= TV * 1.0001 or "capped" in part.note  # the design reached
        assert part.observed.sum() + part.impossible == part.n
        assert part.expected.sum() == pytest.approx(part.n)
        assert part.tv.low <= part.tv.high
    assert res.n >= 1 and res.chunk <= res.n


def test_the_pooling_rule_fills_every_bin_and_keeps_zero_mass_apart():
    V = 200
    e = np.zeros(V)
    e[:150] = np.random.default_rng(0).dirichlet(np.full(150, 0.3))
    P = np.stack([e, e])
    Q = np.stack([e, e, e])
    res = check_sampler(verify, P, Q, tv=TV, alpha=ALPHA, seed=0)
    for part in res.parts.values():
        # every bin (rest included) has expected count >= 5 at the planned draws, and at most 32 bins
        assert len(part.bins) <= 32
        assert part.expected.min() >= 5 * part.n / (res.n if part.name != "bonus" else part.n) - 1e-9
        assert part.impossible == 0
    assert not res.reject
    # an output of probability 0 is impossible: one is enough to reject
    def leaks(d, p, q, rule, generator=None):
        t, a = verify(d, p, q, rule, generator=generator)
        t[0, a[0]] = V - 1  # a token of probability 0
        return t, a

    bad = check_sampler(leaks, P, Q, tv=TV, alpha=ALPHA, seed=0, num_samples=500)
    assert bad.reject and bad.parts["first"].impossible + bad.parts["block"].impossible >= 1


def test_a_bonus_from_the_wrong_row_is_caught_where_the_first_token_test_is_blind():
    P, Q = rows(5, k=2, V=8)
    res = check_sampler(bonus_from_wrong_row, P, Q, tv=TV, alpha=ALPHA, seed=0)
    wrong = pooled_tv(Q[1], Q[2], res.parts["bonus"].bins)
    assert wrong > res.parts["bonus"].detectable_tv
    assert res.reject and res.parts["bonus"].reject
    assert not res.parts["first"].reject  # the first token is right
    assert not one_step_test(ct.SpS(), P, Q, num_samples=res.n, sampler=bonus_from_wrong_row, alpha=ALPHA).reject


def test_a_wrong_recovery_is_caught():
    P, Q = rows(11, k=2, V=8)
    rule = ct.Cactus(0.1)
    wrong = WrongRecoveryCactus(0.1)

    def sampler(d, p, q, _rule, generator=None):
        return verify(d, p, q, wrong, generator=generator)

    res = check_sampler(sampler, P, Q, rule=rule, tv=0.015, alpha=ALPHA, seed=0, parts=("first", "block"))
    dist = pooled_tv(ct.induced_distribution(wrong, P[0], Q[0]), ct.induced_distribution(rule, P[0], Q[0]),
                     res.parts["first"].bins)
    assert dist > res.parts["first"].detectable_tv and res.parts["first"].reject and res.reject


def test_transformers_speculative_sampling_in_one_line_and_the_exact_mode():
    from transformers.generation.utils import _speculative_sampling

    P, Q = rows(7, k=2, V=8)
    fast = dict(tv=0.15, alpha=ALPHA, seed=0, parts=("first", "block"))
    res = check_sampler(transformers_sampler(_speculative_sampling), P, Q, **fast)
    assert not res.reject, res.table()
    # rows where the draft puts mass on a token the verifier never emits: the exact mode sees r <= ratio
    # accept it (u = 0 has probability 2**-24); sampling at this size cannot
    Q0 = Q.copy()
    Q0[:, 0] = 0
    Q0 /= Q0.sum(1, keepdims=True)
    P0 = P.copy()
    P0[:, 0] = 0.3
    P0 /= P0.sum(1, keepdims=True)
    hf = transformers_sampler(_speculative_sampling)
    ex = check_sampler(hf, P0, Q0, mode="exact")
    if hf.accepts_at_equality:  # transformers 5.24: r <= ratio
        assert ex.reject and ex.pvalue == 0.0
        # accepting draft 0 at position 0, or at position 1 after an accepted first draft: 2**-24 each time
        A0 = block_law(ct.SpS(), P0, Q0).acc[0].sum()
        want = 2.0**-24 * (P0[0, 0] + A0 * P0[1, 0])
        assert ex.exact.impossible_mass == pytest.approx(want, rel=1e-3)
    else:  # 5.25: r < ratio never accepts a q = 0 draft
        assert ex.exact.impossible_mass == 0
    assert ex.exact.max_abs_diff < 1e-6  # nothing else beyond float32 rounding and the 2**-24 grid
    sampled = check_sampler(hf, P0, Q0, **fast)
    assert not sampled.reject and sampled.parts["first"].impossible == 0
    assert check_sampler(hf, P, Q, mode="exact").exact.impossible_mass == 0  # no q = 0 draft: nothing impossible


@pytest.mark.parametrize("q0", [0.0, 3e-8, 0.2])
def test_the_probed_comparison_is_what_transformers_does(monkeypatch, q0):
    """The exact mode's premise, on transformers' code itself (whatever version is installed), beyond the probe's
    row: with the uniform forced to each grid point around the ratio ``rho`` transformers computes, the draft is
    accepted iff ``r < rho``, or ``r == rho`` where the probe found ``r <= ratio``; and the law's ``phi`` is the
    share of the ``2**24`` grid points that accept, counted here with integers."""
    from fractions import Fraction

    from transformers.generation import utils

    from cactus_theory.theory.check import TransformersSampler

    V, grid = 4, 2**24
    hf = TransformersSampler(utils._speculative_sampling)
    p = torch.tensor([[[0.5, 0.25, 0.125, 0.125]]]).log()  # draft
    new = torch.cat([torch.tensor([[[q0, 0.5, 0.25, 0.25 - q0]]]).log(), torch.full((1, 1, V), 0.25).log()], 1)
    p32, q32 = float(p[0, 0].softmax(-1)[0]), float(new[0, 0].softmax(-1)[0])
    rho = Fraction(float(torch.tensor(q32) / torch.tensor(p32)))  # the float32 ratio, exactly
    m = int(rho * grid)  # floor
    for point in sorted({max(m - 1, 0), m, m + 1}):
        r = Fraction(point, grid)
        monkeypatch.setattr(utils.torch, "rand_like", lambda x, r=r: torch.full_like(x, float(r)))
        _, n = utils._speculative_sampling(torch.tensor([[0]]), p, 1, new)
        assert int(n) == int(r < rho or (r == rho and hf.accepts_at_equality)), (point, rho)
    monkeypatch.undo()
    on_grid = rho * grid == m
    count = m + (1 if hf.accepts_at_equality else 0) if on_grid else m + 1
    assert hf._phi(np.float32([p32]), np.float32([q32]))[0] * grid == min(count, grid)
    if q0 == 0.0:
        assert count == (1 if hf.accepts_at_equality else 0)  # the q = 0 draft: 2**-24 under <=, never under <
    assert float(torch.rand(10**6).mul(2**24).remainder(1).abs().max()) == 0  # torch.rand lies on the 2**-24 grid


def test_the_exposed_law_of_a_rule_is_its_block_law():
    P, Q = rows(8, k=2, V=6)
    for rule in (ct.SpS(), ct.TAS(), ct.Cactus(0.3)):
        r = compare_laws(exposed_block_law(rule, P, Q), block_law(rule, P, Q), 1e-12)
        assert r.max_abs_diff < 1e-12 and r.impossible_mass == 0 and not r.reject
    other = compare_laws(exposed_block_law(ct.Cactus(0.5), P, Q), block_law(ct.SpS(), P, Q), 1e-12)
    assert other.reject and other.block_tv_low <= other.block_tv_high and other.first_tv > 0.01


@pytest.mark.parametrize("inputs", ["probs", "logits"])
def test_adapters_logits_batch_one_and_global_rng(inputs):
    """A batch-1, global-RNG, rule-free sampler (transformers' convention), numpy out: wrapped in one call, it
    passes; and the adapter leaves the caller's global RNG as it was."""
    def fn(d, p, q):
        if inputs == "logits":
            p, q = p.softmax(-1), q.softmax(-1)
        assert d.shape[0] == 1
        t, a = verify(d, p, q, ct.SpS())  # torch's global RNG
        return t[0, :int(a[0]) + 1].numpy(), a[0].numpy()

    P, Q = rows(9, k=2, V=6)
    state = torch.random.get_rng_state()
    res = check_sampler(as_sampler(fn, inputs=inputs, batch=1, rng="global", takes_rule=False), P, Q, tv=0.15,
                        alpha=ALPHA, seed=1, parts=("first", "block"))
    assert not res.reject, res.table()
    assert torch.equal(torch.random.get_rng_state(), state)


def shared_row_sps(d, p, q, rule, generator=None):
    """An independent SpS sampler for batches that repeat one row (as check_sampler passes them): per position,
    accept ``n`` iff ``u < min(1, q_n / p_n)``, recover from ``(q - p)_+`` (built once per call, O(k V)), bonus from
    ``q[k]``; torch's inverse-CDF draws from ``generator``."""
    assert p.stride(0) == 0 and q.stride(0) == 0  # the expanded view: no copy of the rows
    B, k = d.shape
    u = torch.rand((B, k + 1), generator=generator, dtype=torch.float64)
    rows = torch.arange(B)
    a = torch.full((B,), k)
    for j in range(k - 1, -1, -1):
        phi = (q[0, j, d[:, j]] / p[0, j, d[:, j]]).clamp(max=1)
        a = torch.where(u[:, j] >= phi, torch.full_like(a, j), a)
    last = torch.empty(B, dtype=torch.long)
    for j in range(k + 1):
        sel = a == j
        law = q[0, k] if j == k else (q[0, j] - p[0, j]).clamp(min=0)
        cdf = law.cumsum(0)
        last[sel] = torch.searchsorted(cdf, u[sel, k] * cdf[-1], right=True).clamp(max=law.nonzero().max())
    tokens = torch.where(torch.arange(k + 1) < a[:, None], torch.cat([d, d[:, :1]], 1), torch.full((B, k + 1), -1))
    tokens[rows, a] = last
    return tokens, a


def test_streaming_at_v_150000_calls_the_sampler_in_chunks_of_2_22_entries():
    V, k = 150_000, 2
    g = torch.Generator().manual_seed(0)
    Q = torch.softmax(torch.randn(k + 1, V, generator=g, dtype=torch.float64) * 3, -1)
    P = torch.softmax(Q[:k].log() + 0.3 * torch.randn(k, V, generator=g, dtype=torch.float64), -1)
    seen = []

    def spy(d, p, q, rule, generator=None):
        seen.append(p.shape[0])
        return shared_row_sps(d, p, q, rule, generator=generator)

    res = check_sampler(spy, P, Q, tv=0.1, alpha=ALPHA, seed=0)
    assert max(seen) == CHUNK_ELEMENTS // V == res.chunk and sum(seen) == res.n > 1000
    assert not res.reject, res.table()


BAD = [
    (lambda t, a: (t,), TypeError, "must return (tokens, num_accepted)"),
    (lambda t, a: t, TypeError, "must return (tokens, num_accepted)"),
    (lambda t, a: (t.float(), a), TypeError, "tokens must hold integer token ids, got dtype torch.float32"),
    (lambda t, a: (t.float() * np.nan, a), TypeError, "holds NaN"),
    (lambda t, a: (t.numpy().astype(np.float64), a), TypeError, "tokens must hold integer token ids, got dtype float64"),
    (lambda t, a: (t[:, :-1], a), ValueError, "tokens must have shape (B, k + 1)"),
    (lambda t, a: (t, a[:, None]), ValueError, "num_accepted must have shape (B,)"),
    (lambda t, a: (t, a + 5), ValueError, "num_accepted must be in [0, k]"),
    (lambda t, a: (t.tolist(), a), TypeError, "must be a torch.Tensor or a numpy array"),
    (lambda t, a: (t.scatter(1, a[:, None], 1000), a), ValueError, "must be in [0, V)"),
    (lambda t, a: (torch.where(t < 0, torch.zeros_like(t), t), a), ValueError, "-1 padding"),
    (lambda t, a: (t, torch.full_like(a, 2)), ValueError, "must be the accepted drafts"),
]


@pytest.mark.parametrize("mangle,err,needle", BAD, ids=[b[2][:30] for b in BAD])
def test_malformed_sampler_output_is_refused_by_name(mangle, err, needle):
    P, Q = rows(10, k=2, V=6)

    def sampler(d, p, q, rule, generator=None):
        t, a = verify(d, p, q, rule, generator=generator)
        if (a == 2).all():  # the accepted-drafts case needs a row that rejected
            a = a.clone()
            a[0] = 0
            t = t.clone()
            t[0, 1:] = -1
        return mangle(t, a)

    with pytest.raises(err) as e:
        check_sampler(sampler, P, Q, num_samples=50, seed=0)
    assert needle in str(e.value), str(e.value)


def test_a_sampler_without_a_generator_keyword_is_refused_before_it_runs():
    calls = []

    def no_gen(d, p, q, rule):
        calls.append(1)
        return verify(d, p, q, rule)

    P, Q = rows(11)
    with pytest.raises(TypeError, match="no generator= keyword.*as_sampler"):
        check_sampler(no_gen, P, Q)
    with pytest.raises(TypeError, match="4 .*as_sampler"):
        check_sampler(lambda d, p, q, generator=None: verify(d, p, q, ct.SpS()), P, Q)
    assert not calls
    with pytest.raises(TypeError, match="expose"):
        check_sampler(verify, P, Q, mode="exact")


@pytest.mark.parametrize("kwargs,err,needle", [
    (dict(P=np.ones((2, 4)) / 4, Q=np.ones((2, 4)) / 4), ValueError, "Q must have shape (k + 1, V)"),
    (dict(P=[[0.5, 0.5]], Q=np.ones((2, 2)) / 2), TypeError, "P must be a numpy array or a torch tensor"),
    (dict(P=np.ones((1, 4)), Q=np.ones((2, 4)) / 4), ValueError, "not normalised"),
    (dict(tv=0.0), ValueError, "tv"), (dict(alpha=1.0), ValueError, "alpha"), (dict(power=1.5), ValueError, "power"),
    (dict(rule="sps"), ValueError, "rule must be a cactus_theory Rule"), (dict(parts=("first", "x")), ValueError, "parts"),
    (dict(mode="fast"), ValueError, "mode"), (dict(num_samples=0), ValueError, "num_samples"),
])
def test_bad_arguments_are_refused_by_name(kwargs, err, needle):
    P, Q = rows(12)
    args = dict(P=P, Q=Q) | kwargs
    with pytest.raises(err) as e:
        check_sampler(verify, args.pop("P"), args.pop("Q"), **args)
    assert needle in str(e.value)


def test_the_bonus_is_untestable_when_the_rule_never_reaches_it():
    P, Q = rows(13)
    Q[0] = 0
    Q[0, 0] = 1.0
    P[0] = 0
    P[0, 1:] = 1 / 7  # draft 1 is never the verifier's only token: SpS never accepts it
    res = check_sampler(verify, P, Q, tv=TV, alpha=ALPHA, seed=0)
    assert "bonus" in res.not_testable and "probability 0" in res.not_testable["bonus"]
    assert "bonus" not in res.parts and not res.reject


def test_the_tv_interval_covers_at_its_level():
    """Simulated coverage of ``tv_interval`` on 8 bins at TV 0 and 0.05 (200 draws each): >= 0.95 at 0.95, the
    level; a percentile bootstrap of the plug-in covers TV = 0 never (it is biased upwards)."""
    rng = np.random.default_rng(0)
    e = rng.dirichlet(np.ones(8))
    for shift in (0.0, 0.05):
        p = e.copy()
        i, j = np.argmax(e), np.argmin(e)
        p[i] -= shift
        p[j] += shift
        hits = 0
        for _ in range(200):
            r = tv_interval(rng.multinomial(4000, p), e)
            hits += r.low <= 0.5 * np.abs(p - e).sum() + 1e-12 <= r.high + 1e-12
        assert hits >= 0.93 * 200, (shift, hits)  # binomial(200, 0.95) falls below 186 with prob ~0.2%
