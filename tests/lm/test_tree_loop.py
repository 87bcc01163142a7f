"""Tree decoding on the LM runtime (``lm.loop.tree_generate``, ``Llama.forward_tree``, the tree methods of
``lm.cache``) on the tiny random Llama pair of ``tests/lm/common.py`` (V = 10, no download).

What each test proves: the laws the loop hands to ``verify_tree`` are the models' own next-token laws
at every node (float64 compact models against fresh full forwards, several steps, ragged rows, so the
tree cache, its compaction and the draft's pending tokens are right); at temperature 0 the loop emits
the verifier's greedy continuation; the exact law of the loop's algorithm on these models
(``theory.tree.tree_sequence_law`` after the verifier's first token) is the verifier's law to 1e-12
for SpS with each lossless scheme; and the loop's samples fit that exact law (chi-square at ALPHA =
1e-3, N = 20000 rows, power >= 0.99 at TV 0.06 asserted in ``assert_fits``; the ragged / EOS test has
2500 rows per prompt and TV 0.12), for SpS (the verifier's law) and for Cactus (its own tree law).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.core.tree import branching_parents
from cactus_theory.lm import autoregressive_generate, sampling_probs
from cactus_theory.lm.cache import Target, TokenDrafter, right_pad
from cactus_theory.lm.llama import Llama
from cactus_theory.lm.loop import tree_generate
from cactus_theory.theory.tree import tree_sequence_law
from cactus_theory.toy import autoregressive_law
from tests.lm.common import DRAFT, EOS, RAW, VERIFIER, N, V, assert_fits, cond, pair

pytestmark = pytest.mark.usefixtures("one_thread")

TREE = branching_parents((2, 2))  # (-1, -1, 0, 0, 1, 1)


def verifier_first_law(draft, verifier, rule, parents, scheme, T, prompt, mode="rounds"):
    """Exact law (V,) * T of the loop's first T tokens: the verifier's first token, then tree blocks."""
    q0 = verifier(tuple(prompt))
    law = np.zeros((V,) * T)
    for y in np.flatnonzero(q0 > 0):
        law[y] = q0[y] * tree_sequence_law(draft, verifier, rule, parents, scheme, T - 1,
                                           prompt=tuple(prompt) + (int(y),), mode=mode)
    return law


def memo(f):
    """``f`` with each prefix's row computed once and renormalised in float64 (the models' rows sum to 1
    to float32 precision only), so the laws built from it read identical rows that sum to 1."""
    rows: dict = {}

    def g(prefix):
        if prefix not in rows:
            r = np.asarray(f(prefix), dtype=np.float64)
            rows[prefix] = r / r.sum()
        return rows[prefix]
    return g


@pytest.mark.parametrize("scheme", ["iid", "without_replacement", "deterministic"])
def test_exact_tree_law_of_sps_on_the_tiny_llamas_is_the_verifiers(scheme):
    d, v = memo(cond(DRAFT)), memo(cond(VERIFIER))
    prompt = (3, 5, 7)
    law = verifier_first_law(d, v, ct.SpS(), TREE, scheme, 3, prompt)
    ar = autoregressive_law(v, 3, prompt=prompt)
    assert np.abs(law - ar).max() < 1e-12
    cactus = verifier_first_law(d, v, ct.Cactus(0.5), TREE, scheme, 3, prompt)
    assert abs(cactus.sum() - 1) < 1e-12 and np.abs(cactus - ar).max() > 1e-3  # lossy: a different law


def _plain(m: Llama, seq: list[int]) -> torch.Tensor:
    c = m.new_cache(1, 64)
    return m(torch.tensor([seq]), torch.zeros(1, dtype=torch.long), c)[0][0, -1]


def test_the_laws_given_to_verify_tree_are_the_models_laws_at_every_node():
    """Drive ``TokenDrafter`` / ``Target`` through several tree steps on ragged rows (float64 compact
    models): every node's ``p`` (at its parent) and ``q`` (after it) equal a fresh forward of that
    node's context, so the tree caches, their compaction and the draft's pending tokens are right."""
    dm, vm = Llama.from_hf(DRAFT, dtype=torch.float64), Llama.from_hf(VERIFIER, dtype=torch.float64)
    prompts = [[6], [3, 5, 7, 1, 2], [2, 9]]
    ids, lens = right_pad(prompts, 0, "cpu")
    parents = (-1, -1, 0, 1, 1, 2, 4)  # a ragged shape: 2, then 1 and 2, then 1 and 1 children
    gen = torch.Generator().manual_seed(0)
    drafter, target = TokenDrafter(dm, 3, 64, "cpu"), Target(vm, 3, 64, "cpu")
    sampling = (1.0, 0, 1.0)
    soft = lambda x: sampling_probs(x, *sampling)  # noqa: E731  (the loop's transform, on float32 logits)
    with torch.no_grad():
        logits, _ = target.prefill(ids, lens)
        first = torch.multinomial(soft(logits), 1, generator=gen)[:, 0]
        target.pending = first
        drafter.start(ids, lens, first)
        seqs = [p + [int(t)] for p, t in zip(prompts, first, strict=True)]
        err, accepted = 0.0, []
        for step in range(6):
            scheme = ("iid", "without_replacement", "deterministic")[step % 3]
            tokens, p = drafter.propose_tree(parents, scheme, sampling, gen)
            logits, _ = target.score_tree(tokens, torch.tensor(parents).expand(3, -1))
            q = soft(logits)
            for b in range(3):
                ctx = {-1: seqs[b]}
                for j, a in enumerate(parents):
                    ctx[j] = ctx[a] + [int(tokens[b, j])]
                    err = max(err, float((p[b, j] - soft(_plain(dm, ctx[a]))).abs().max()))
                    err = max(err, float((q[b, j + 1] - soft(_plain(vm, ctx[j]))).abs().max()))
                err = max(err, float((q[b, 0] - soft(_plain(vm, ctx[-1]))).abs().max()))
            res = ct.tree.verify_tree(tokens, torch.tensor(parents).expand(3, -1), p, q, ct.SpS(), scheme,
                                      generator=gen)
            a = res.num_accepted
            target.advance_tree(res.accepted_nodes, a, res.tokens.gather(1, a[:, None])[:, 0])
            drafter.advance_tree(a, res.accepted_nodes, res.tokens)
            for b in range(3):
                seqs[b] += res.tokens[b, :int(a[b]) + 1].tolist()
            accepted += a.tolist()
    assert err < 1e-10, err
    assert 0 in accepted and max(accepted) >= 2  # rejections and accepted paths of length >= 2 both seen


@pytest.mark.parametrize("scheme", ["iid", "deterministic"])
def test_greedy_tree_decoding_is_the_verifiers_greedy_continuation(scheme):
    prompts = [[6], [3, 5, 7, 1, 2, 8, 8], [2, 9], [0, 1, 2, 3]]
    res = tree_generate(pair(), prompts, ct.SpS(), TREE, scheme, max_new_tokens=12, temperature=0.0, batch_size=4)
    ar = autoregressive_generate(pair(), prompts, max_new_tokens=12, temperature=0.0, batch_size=4)
    assert res.tokens == ar.tokens
    assert 0 < res.stats.accepted and res.stats.al > 1


@pytest.mark.parametrize("scheme,sampling", [("iid", (1.0, 0, 1.0)), ("without_replacement", (0.8, 6, 0.9)),
                                             ("deterministic", (1.0, 0, 1.0))])
def test_tree_sps_emits_the_verifiers_law(scheme, sampling):
    prompt = [3, 5, 7]
    t, k, p = sampling
    res = tree_generate(pair(), [prompt] * N, ct.SpS(), TREE, scheme, max_new_tokens=3, temperature=t, top_k=k,
                        top_p=p, batch_size=N, seed=1)
    assert all(len(x) == 3 for x in res.tokens)
    assert_fits(res.tokens, autoregressive_law(cond(VERIFIER, sampling), 3, prompt=tuple(prompt)), 3)
    assert 1 < res.stats.al < 4


@pytest.mark.parametrize("scheme,mode", [("iid", "rounds"), ("deterministic", "joint")])
def test_tree_cactus_emits_its_exact_tree_law(scheme, mode):
    prompt = [1, 8]
    rule = ct.Cactus(0.5)
    res = tree_generate(pair(), [prompt] * N, rule, TREE, scheme, mode=mode, max_new_tokens=3, batch_size=N, seed=2,
                        **RAW)
    law = verifier_first_law(cond(DRAFT), cond(VERIFIER), rule, TREE, scheme, 3, prompt, mode=mode)
    assert_fits(res.tokens, law, 3)


def test_ragged_rows_and_eos_keep_each_rows_law():
    prompts = [[6], [3, 5, 7, 1, 2], [2, 9]]
    batch = [prompts[i % 3] for i in range(3 * 2500)]
    res = tree_generate(pair(EOS), batch, ct.SpS(), TREE, "without_replacement", max_new_tokens=3,
                        batch_size=len(batch), seed=3, **RAW)
    assert all(EOS not in t[:-1] and (len(t) == 3 or t[-1] == EOS) for t in res.tokens)
    assert sum(len(t) < 3 for t in res.tokens) > 50  # EOS reached: the stopping path is exercised
    base = cond(VERIFIER)
    for j, pr in enumerate(prompts):
        n = len(pr)

        def absorbing(prefix, n=n):  # after EOS the (padded) output repeats EOS
            return np.eye(V)[EOS] if EOS in prefix[n:] else base(prefix)

        assert_fits(res.tokens[j::3], autoregressive_law(absorbing, 3, prompt=tuple(pr)), 3, pad=EOS)


def test_bad_tree_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="tree"):
        tree_generate(pair(), [[1]], ct.SpS(), "2,2")
    with pytest.raises(ValueError, match="level by level"):
        tree_generate(pair(), [[1]], ct.SpS(), (-1, 0, -1))
    with pytest.raises(ValueError, match="topological"):
        tree_generate(pair(), [[1]], ct.SpS(), (-1, 1))
    with pytest.raises(ValueError, match="scheme"):
        tree_generate(pair(), [[1]], ct.SpS(), TREE, "gumbel")
    with pytest.raises(ValueError, match="joint"):
        tree_generate(pair(), [[1]], ct.TAS(), TREE, "iid", mode="joint")
