"""Adaptive draft length (``core.draft_stop.DraftStop``, issue 30 item 3): the exact law of the toy loop with
stopping (``toy.sequence_law(..., draft_stop=)``), SpS lossless under it on generated toy pairs, a lossy rule
moved by it, the toy loop sampled against it, and planted policies that show which decisions keep SpS
lossless (any function of the history before the next draft, even one reading ``q``) and which do not (one
reading the candidate draft itself).

Exact comparisons to 1e-12. Statistical tests: level ALPHA = 1e-4 each with fixed seeds (deterministic); the
sample size (``stats.samples_needed``) detects a law at TV >= EPS = 0.02 from the exact one with probability
>= 0.999 over the V^T = 27 cells.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cactus_theory as ct
from cactus_theory.core.draft_stop import DraftStop, check_draft_stop
from cactus_theory.sampler import verify
from cactus_theory.stats import samples_needed
from cactus_theory.theory import toy
from cactus_theory.toy import (
    autoregressive_law,
    budget_law,
    random_pair,
    sequence_law,
    sequence_test,
)

ALPHA, BETA, EPS = 1e-4, 1e-3, 0.02
NEVER = DraftStop(1e-12)  # the top probability is at least 1 / V: never stops
ALWAYS = DraftStop(1 - 1e-9)  # Dirichlet rows: the top probability is below it, so every block drafts one


def tv(a, b) -> float:
    return 0.5 * float(np.abs(a - b).sum())


# -- the policy ------------------------------------------------------------------------------------------------

def test_draft_stop_checks_and_parses():
    assert DraftStop.parse("0.3") == DraftStop(0.3) == check_draft_stop(0.3)
    assert DraftStop.parse("path:0.05") == DraftStop(0.05, "path")
    assert check_draft_stop(None) is None and DraftStop(0.3).label() == "top>=0.3"
    for bad in (0, 1, 1.5, -0.1, float("nan"), True):
        with pytest.raises(ValueError, match="draft_stop"):
            check_draft_stop(bad)
    for bad in ("x", "top:2", "mean:0.3", ""):
        with pytest.raises(ValueError, match="draft_stop"):
            DraftStop.parse(bad)
    with pytest.raises(ValueError, match="signal"):
        DraftStop(0.3, "mean")


def test_continues_reads_numpy_and_torch_alike():
    p = np.array([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
    path = np.array([0.1, 0.4])
    for stop in (DraftStop(0.55), DraftStop(0.3, "path")):
        want = stop.continues(p, path)
        assert want.tolist() == [False, True]
        assert stop.continues(torch.from_numpy(p), torch.from_numpy(path)).tolist() == want.tolist()


def test_verify_checks_lengths():
    B, k, V = 2, 3, 4
    n = torch.zeros((B, k), dtype=torch.long)
    p, q = torch.full((B, k, V), 0.25), torch.full((B, k + 1, V), 0.25)
    for bad, match in ((torch.tensor([1, 4]), r"\[1, 3\]"), (torch.tensor([0, 1]), r"\[1, 3\]"),
                       (torch.tensor([1.0, 2.0]), "integer"), (torch.tensor([1, 2, 3]), "shape"), ([1, 2], "integer")):
        with pytest.raises(ValueError, match=match):
            verify(n, p, q, ct.SpS(), lengths=bad)
    full = verify(n, p, q, ct.SpS(), generator=torch.Generator().manual_seed(0))
    same = verify(n, p, q, ct.SpS(), generator=torch.Generator().manual_seed(0), lengths=torch.tensor([k, k]))
    assert all(torch.equal(x, y) for x, y in zip(full, same, strict=True))  # lengths k: verify as it was


# -- the exact law ---------------------------------------------------------------------------------------------

@st.composite
def toy_cases(draw):
    V = draw(st.integers(2, 4), label="V")
    k = draw(st.integers(1, 4), label="k")
    T = draw(st.integers(2, 4 if V <= 3 else 3), label="T")
    order = draw(st.integers(1, 3), label="order")
    seed = draw(st.integers(0, 10**6), label="seed")
    conc = draw(st.sampled_from([0.3, 1.0, 3.0]), label="concentration")
    signal = draw(st.sampled_from(["top", "path"]), label="signal")
    threshold = draw(st.sampled_from([1e-12, 0.05, 0.2, 0.4, 0.6, 0.9, 1 - 1e-9]), label="threshold")
    return V, k, T, order, seed, conc, DraftStop(threshold, signal)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(toy_cases(), st.booleans())
def test_sps_with_adaptive_stopping_emits_the_verifiers_law(case, verifier_first):
    """The whole-loop exact law with stopping equals the verifier's own sequence law to 1e-12, over generated
    pairs, vocabularies, k, both signals and thresholds that never, sometimes and always stop."""
    V, k, T, order, seed, conc, stop = case
    draft, verifier = random_pair(V, order=order, concentration=conc, weight=0.7, seed=seed)
    law = sequence_law(draft, verifier, ct.SpS(), k, T, draft_stop=stop, verifier_first=verifier_first)
    np.testing.assert_allclose(law, autoregressive_law(verifier, T), rtol=0, atol=1e-12)


def test_sps_stays_lossless_with_a_draft_that_reads_its_block_start():
    """``draft_in_block`` (a feature-level draft: its law depends on where its block started) with stopping."""
    draft, verifier = random_pair(3, order=2, weight=0.6, seed=5)

    def in_block(context, drafts):  # the draft's law mixes in the block's start position
        return 0.7 * draft(context + drafts) + 0.3 * np.roll(draft(context), len(context) % 3)

    for stop in (DraftStop(0.45), DraftStop(0.2, "path")):
        law = sequence_law(None, verifier, ct.SpS(), 3, 4, draft_in_block=in_block, draft_stop=stop,
                           verifier_first=True)
        np.testing.assert_allclose(law, autoregressive_law(verifier, 4), rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule", [ct.Cactus(0.5), ct.Cactus(2.0), ct.TAS()], ids=repr)
def test_a_lossy_rule_with_stopping_lies_between_its_fixed_lengths(rule):
    """Sanity of the programme for a lossy rule: a threshold that never stops gives the fixed-``k`` law, one
    that always stops the ``k = 1`` law (exactly); in between the law is neither of them, nor the verifier's."""
    draft, verifier = random_pair(3, order=2, concentration=0.7, weight=0.6, seed=4)
    T, k = 4, 3
    fixed = sequence_law(draft, verifier, rule, k, T)
    one = sequence_law(draft, verifier, rule, 1, T)
    np.testing.assert_allclose(sequence_law(draft, verifier, rule, k, T, draft_stop=NEVER), fixed, rtol=0, atol=1e-12)
    np.testing.assert_allclose(sequence_law(draft, verifier, rule, k, T, draft_stop=ALWAYS), one, rtol=0, atol=1e-12)
    ar = autoregressive_law(verifier, T)
    for stop in (DraftStop(0.5), DraftStop(0.15, "path")):
        law = sequence_law(draft, verifier, rule, k, T, draft_stop=stop)
        assert law.sum() == pytest.approx(1, abs=1e-12)
        assert tv(law, ar) > 1e-3 and tv(law, fixed) > 1e-4 and tv(law, one) > 1e-4, (stop, tv(law, ar))


def test_the_budget_law_with_stopping():
    """A stateful rule (SequenceBudget) with stopping: the programme with the state (``budget_law``) keeps its
    budget, and with a never-stopping policy it is the fixed-``k`` law."""
    draft, verifier = random_pair(3, order=2, weight=0.6, seed=2)
    rule = ct.SequenceBudget(0.2, delta_max=3.0)
    fixed = budget_law(draft, verifier, rule, 2, 3)
    np.testing.assert_allclose(budget_law(draft, verifier, rule, 2, 3, draft_stop=NEVER).law, fixed.law,
                               rtol=0, atol=1e-12)
    law = budget_law(draft, verifier, rule, 2, 3, draft_stop=DraftStop(0.6))
    assert law.max_exact <= 0.2 + 1e-12 and law.law.sum() == pytest.approx(1, abs=1e-12)
    assert tv(law.law, fixed.law) > 1e-4


# -- planted policies: what the argument needs -----------------------------------------------------------------

def planted(decide):
    """``toy._drafts_next`` replaced by ``decide(stop, p, q, path)`` at every position after the first."""
    def drafts_next(stop, p, q, path, j):
        return True if stop is None or j == 0 else decide(stop, p, q, path)
    return mock.patch.object(toy, "_drafts_next", drafts_next)


PAIRS = [(3, 2, 0.6, 4), (4, 2, 0.8, 9), (2, 3, 0.7, 1)]  # V, order, weight, seed


@pytest.mark.parametrize("V,order,weight,seed", PAIRS)
def test_a_stop_reading_the_verifier_at_the_history_is_lossless_too(V, order, weight, seed):
    """The argument needs the decision to be a function of the history before the next draft, not that it
    read the draft only: stopping when ``max q_{j+1}`` is low (impractical: ``q`` comes after the verifier's
    forward) leaves SpS lossless, exactly."""
    draft, verifier = random_pair(V, order=order, weight=weight, seed=seed)
    with planted(lambda stop, p, q, path: bool(q.max() >= stop.threshold)):
        law = sequence_law(draft, verifier, ct.SpS(), 3, 4, draft_stop=DraftStop(0.5))
    np.testing.assert_allclose(law, autoregressive_law(verifier, 4), rtol=0, atol=1e-12)


@pytest.mark.parametrize("decide", ["path with the candidate", "q at the candidate"])
@pytest.mark.parametrize("V,order,weight,seed", PAIRS)
def test_a_stop_reading_the_candidate_is_not_lossless(decide, V, order, weight, seed):
    """Planted wrong policies, each withholding a drawn candidate ``x_{j+1}`` by a signal of that candidate:
    the path probability including it (an off-by-one of EAGLE-2's confidence: it reads the draft only) or the
    verifier's probability of it. The same exact law shows both NOT lossless (TV >= 0.005 from ``q``'s law)."""
    draft, verifier = random_pair(V, order=order, weight=weight, seed=seed)
    rules = {"path with the candidate": lambda stop, p, q, path: path * p >= stop.threshold,
             "q at the candidate": lambda stop, p, q, path: q >= stop.threshold}
    stop = DraftStop(0.25, "path") if decide.startswith("path") else DraftStop(0.25)
    with planted(rules[decide]):
        law = sequence_law(draft, verifier, ct.SpS(), 3, 4, draft_stop=stop)
    assert law.sum() == pytest.approx(1, abs=1e-12)
    assert tv(law, autoregressive_law(verifier, 4)) > 5e-3


# -- the toy loop, sampled ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rule,stop", [(ct.SpS(), DraftStop(0.5)), (ct.Cactus(0.5), DraftStop(0.5)),
                                       (ct.Cactus(1.0), DraftStop(0.15, "path")),
                                       (ct.SequenceBudget(0.3), DraftStop(0.1, "path"))], ids=repr)
def test_the_toy_loop_with_stopping_follows_its_exact_law(rule, stop):
    """``speculative_decode(..., draft_stop=)`` (ragged blocks through ``verify(..., lengths=)``) fits the
    exact law of ``sequence_law(..., draft_stop=)`` (``budget_law`` for the stateful rule)."""
    V, T, k = 3, 3, 3
    draft, verifier = random_pair(V, order=2, concentration=0.7, weight=0.6, seed=4)
    n = samples_needed(EPS, categories=V**T, alpha=ALPHA, beta=BETA)
    res = sequence_test(draft, verifier, rule, k, T, num_sequences=n, seed=3, alpha=ALPHA, draft_stop=stop)
    assert not res.reject, res


def test_the_toy_loop_drafts_ragged_blocks():
    """The sampler sees each sequence's own length: drafts per block between 1 and k, ending where the
    policy says (the top signal read on the draft's law at each position)."""
    draft, verifier = random_pair(3, order=2, concentration=0.7, weight=0.6, seed=4)
    seen = []

    def spy(n, p, q, rule, generator=None, lengths=None):
        seen.append((p.numpy().copy(), lengths.numpy().copy()))
        return verify(n, p, q, rule, generator=generator, lengths=lengths)

    stop = DraftStop(0.5)
    toy.speculative_decode(draft, verifier, ct.SpS(), 4, 12, num_sequences=64,
                           generator=torch.Generator().manual_seed(0), sampler=spy, draft_stop=stop)
    sizes = np.concatenate([s for _, s in seen])
    assert sizes.min() == 1 and sizes.max() <= 4 and len(set(sizes.tolist())) > 1
    for p, size in seen:
        for b, m in enumerate(size):
            top = p[b].max(-1)
            assert (top[1:m] >= 0.5).all() and (m == p.shape[1] or top[m] < 0.5 or m == 4)
