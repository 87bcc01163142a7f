"""sampler.verify_flat (vLLM V1's flat, ragged layout): token-for-token agreement with ``verify``,
its law against the exact law (one-hot and sampled drafts, ragged batches with empty requests),
per-request generators, padded drafts and validation.

Statistical tests: level ALPHA = 1e-4, fixed seeds; sample sizes from ``stats.samples_needed`` so
that any law at TV distance >= EPS = 0.01 from the exact one is rejected with probability >= 0.999.
"""

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.sampler import PLACEHOLDER_TOKEN_ID, sample_rows, verify, verify_flat
from cactus_theory.stats import goodness_of_fit, samples_needed
from cactus_theory.toy import one_step_test

ALPHA, BETA, EPS = 1e-4, 1e-3, 0.01
V = 8
RULES = [ct.SpS(), ct.Cactus(0.1), ct.TAS(), ct.TopK(3), ct.Interpolation(0.4), ct.EARS(0.3)]


def rows(k, seed, B=None):
    rng = np.random.default_rng(seed)
    shape = (k,) if B is None else (B, k)
    p = rng.dirichlet(np.full(V, 0.7), size=shape)
    q = rng.dirichlet(np.full(V, 0.7), size=shape[:-1] + (k + 1,))
    return torch.from_numpy(p), torch.from_numpy(q)


def flat_sampler(n, P, Q, rule, generator=None):
    """``verify``'s interface on top of ``verify_flat`` (equal draft counts), for the toy harness:
    the bonus token is drawn by the caller from row k, as vLLM does."""
    B, k = n.shape
    bonus = sample_rows(Q[:, k], torch.rand(B, generator=generator, dtype=torch.float64)).unsqueeze(-1)
    cu = torch.arange(1, B + 1, dtype=torch.int32) * k
    out = verify_flat(n.reshape(-1).int(), cu, P.reshape(-1, P.shape[-1]), Q[:, :k].reshape(-1, Q.shape[-1]),
                      bonus, rule, generator=generator)
    emitted = (out != PLACEHOLDER_TOKEN_ID).sum(-1)
    return out.long(), emitted - 1


@pytest.mark.parametrize("rule", RULES, ids=repr)
def test_same_tokens_as_verify(rule):
    B, k = 400, 3
    P, Q = rows(k, 1, B)
    n = torch.stack([sample_rows(P[:, j], torch.rand(B, generator=torch.Generator().manual_seed(j),
                                                        dtype=torch.float64)) for j in range(k)], 1)
    tokens, acc = verify(n, P, Q, rule, generator=torch.Generator().manual_seed(7))
    bonus = torch.randint(0, V, (B, 1))
    cu = torch.arange(1, B + 1, dtype=torch.int32) * k
    out = verify_flat(n.reshape(-1).int(), cu, P.reshape(-1, V), Q[:, :k].reshape(-1, V), bonus, rule,
                      generator=torch.Generator().manual_seed(7))
    assert out.dtype == torch.int32 and out.shape == (B, k + 1)
    full = acc == k
    assert 0 < int(full.sum()) < B and int((acc == 0).sum()) > 0  # every branch is exercised
    expect = tokens.clone()
    expect[full, k] = bonus[full, 0]  # the bonus comes from the caller in vLLM's layout
    assert torch.equal(out.long(), expect)


@pytest.mark.parametrize("rule", [ct.SpS(), ct.Cactus(0.1), ct.TAS(), ct.EARS(0.3)], ids=repr)
def test_one_step_law_sampled_drafts(rule):
    p, q = rows(2, 11)
    assert 0.05 < float(ct.acceptance_rate(rule, p[0].numpy(), q[0].numpy())) < 0.95
    N = samples_needed(EPS, categories=V, alpha=ALPHA, beta=BETA)
    res = one_step_test(rule, p.numpy(), q.numpy(), num_samples=N, seed=5, alpha=ALPHA, sampler=flat_sampler)
    assert not res.reject, res


@pytest.mark.parametrize("rule", [ct.SpS(), ct.Cactus(0.5), ct.TAS(), ct.Interpolation(0.4)], ids=repr)
def test_one_hot_drafts_ragged_batch_law(rule):
    """draft_probs=None (n-gram / EAGLE drafters): p = e_n. Requests of 0, 1 and 3 drafts in one
    batch; each kind's first emitted token must follow its own exact law."""
    rng = np.random.default_rng(3)
    q_rows = rng.dirichlet(np.full(V, 0.7), size=3)
    n_fix = np.array([2, 5, 1])  # drafted ids of a 3-draft request; the 1-draft request drafts 2
    q_bonus = rng.dirichlet(np.full(V, 0.7))
    N = samples_needed(EPS, categories=V, alpha=ALPHA, beta=BETA)
    counts = np.tile([3, 0, 1], N)  # request kinds interleaved, N of each
    ids = np.concatenate([n_fix if c == 3 else n_fix[:1] for c in counts if c]).astype(np.int32)
    tp = np.concatenate([q_rows if c == 3 else q_rows[:1] for c in counts if c])
    g = torch.Generator().manual_seed(11)
    bonus = sample_rows(torch.from_numpy(q_bonus).expand(len(counts), V),
                        torch.rand(len(counts), generator=g, dtype=torch.float64)).unsqueeze(-1)
    out = verify_flat(torch.from_numpy(ids), torch.from_numpy(np.cumsum(counts).astype(np.int32)), None,
                      torch.from_numpy(tp), bonus, rule, generator=g)
    assert out.shape == (len(counts), 4)
    e = np.eye(V)[n_fix[0]]
    law = ct.induced_distribution(rule, e, q_rows[0])  # one-hot draft: one term of the mixture
    for kind in (0, 2):
        first = out[kind::3, 0].numpy()
        res = goodness_of_fit(first, law, alpha=ALPHA, kind="samples")
        assert not res.reject, (kind, res)
    zero = out[1::3]  # no drafts: the bonus, then placeholders
    assert torch.equal(zero[:, 0].long(), bonus[1::3, 0]) and (zero[:, 1:] == PLACEHOLDER_TOKEN_ID).all()
    assert (out[2::3, 2:] == PLACEHOLDER_TOKEN_ID).all()


def test_per_request_generators_do_not_depend_on_the_batch():
    P, Q = rows(3, 4, 5)
    n = torch.randint(0, V, (5, 3), generator=torch.Generator().manual_seed(0))
    bonus = torch.randint(0, V, (5, 1), generator=torch.Generator().manual_seed(1))

    def run(keep, seed_other):
        counts = torch.tensor([3, 0, 2, 3, 1])[keep]
        ids = torch.cat([n[b, :c] for b, c in zip(keep, counts, strict=True)])
        tp = torch.cat([Q[b, :c] for b, c in zip(keep, counts, strict=True)])
        dp = torch.cat([P[b, :c] for b, c in zip(keep, counts, strict=True)])
        gens = {keep.index(3): torch.Generator().manual_seed(42)}
        torch.manual_seed(seed_other)  # the other requests draw from torch's default generator
        return verify_flat(ids, torch.cumsum(counts, 0), dp, tp, bonus[keep], ct.Cactus(0.3), gens)

    a = run([0, 1, 2, 3, 4], 0)
    outs = [run([1, 3], 1)[1], run([3, 4, 0], 2)[0]]
    for o in outs:  # request 3's tokens are fixed by its own generator, whatever the batch
        assert torch.equal(o[:4], a[3])


def test_padded_draft_is_rejected_and_recovered_from_q():
    q = torch.tensor([[0.0, 0.25, 0.75, 0.0], [0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
    ids = torch.tensor([-1, 1], dtype=torch.int32)
    B = 20000
    out = verify_flat(ids.repeat(B), torch.arange(1, B + 1) * 2, None, q.repeat(B, 1),
                      torch.zeros((B, 1), dtype=torch.long), ct.Cactus(1.0),
                      generator=torch.Generator().manual_seed(0))
    assert (out[:, 1:] == PLACEHOLDER_TOKEN_ID).all()  # rejected at once
    freq = np.bincount(out[:, 0].numpy(), minlength=4) / B
    assert freq[0] == 0 and freq[3] == 0 and abs(freq[2] - 0.75) < 0.02


def test_validation():
    q = torch.full((2, 4), 0.25)
    ok = dict(draft_token_ids=torch.tensor([1, 2]), cu_num_draft_tokens=torch.tensor([2, 2]), draft_probs=None,
              target_probs=q, bonus_token_ids=torch.zeros((2, 1), dtype=torch.long), rule=ct.SpS())
    assert verify_flat(**ok).shape == (2, 3)
    assert verify_flat(**ok, max_spec_len=5).shape == (2, 6)
    bad = [("cu_num_draft_tokens", torch.tensor([2, 1]), "cumulative"),
           ("cu_num_draft_tokens", torch.tensor([1, 1]), "ending at T = 2"),
           ("draft_token_ids", torch.tensor([1, 4]), "out of range"),
           ("draft_token_ids", torch.tensor([1.0, 2.0]), "integers"),
           ("target_probs", torch.full((2, 4), 0.3), "target_probs"),
           ("draft_probs", torch.full((2, 3), 1 / 3), "draft_probs"),
           ("bonus_token_ids", torch.zeros(2, dtype=torch.long), "bonus_token_ids"),
           ("rule", "sps", "rule"),
           ("max_spec_len", 1, "max_spec_len")]
    for name, value, msg in bad:
        with pytest.raises(ValueError, match=msg):
            verify_flat(**{**ok, name: value})
    with pytest.raises(ValueError, match="generator"):
        verify_flat(**ok, generator=3)
