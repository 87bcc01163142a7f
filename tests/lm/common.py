"""Shared pieces of the ``cactus_theory.lm`` tests (tests/lm/, tests/lm/train/, tests/lm/experiments/): a
tiny random draft / verifier pair and a tiny feature-level (EAGLE-3-style) head on a tiny verifier, built
once per session, the exact next-token law of a model (``cond``, ``head_law``) and the goodness-of-fit
check of sampled sequences against an exact law (``assert_fits``).

Statistical tests: chi-square goodness of fit (``stats.goodness_of_fit``, cells pooled to expected
count >= 5) at level ALPHA = 1e-3 each, with fixed seeds, so the suite is deterministic; were the
seeds redrawn, each of the 11 true-null checks here would fail with probability 1e-3 (~1.1% for
the file). Power (``stats.power``, checked in ``assert_fits`` from each test's own pooled cell count):
N = 20000 sequences reject a law at TV distance EPS = 0.06 from the exact one with probability
>= 0.99 up to 1159 pooled cells; the most any test here has is 883 (3 tokens of V = 10), where TV
0.04 would be detected with probability 0.43 only. The ragged-batch test's 2500 rows per prompt (up
to 123 cells) detect TV >= EPS_RAGGED = 0.12 with probability >= 0.99.

The loop runs Llama models as the compact Llama (``lm/llama.py``) by default; the exact-law tests
run both that path and the Hugging Face forward (``compact=False``).
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaForCausalLM

from cactus_theory.lm import ModelPair, sampling_probs
from cactus_theory.lm.draft import FeatureDraft, HeadArgs
from cactus_theory.stats import goodness_of_fit, power
from tests.helpers import tiny_llama

ALPHA = 1e-3
N = 20000
EPS, EPS_RAGGED, POWER = 0.06, 0.12, 0.99
RAW = dict(temperature=1.0, top_k=0, top_p=1.0)  # plain sampling (the loop's default is the paper's)
V = 10
EOS = 4



def tiny(seed: int, layers: int = 2, scale: float = 4.0, ctx: int = 64) -> LlamaForCausalLM:
    return tiny_llama(seed, V, layers=layers, ctx=ctx, scale=scale)


DRAFT, VERIFIER = tiny(1), tiny(2)


def pair(eos: int | None = None) -> ModelPair:
    return ModelPair(DRAFT, VERIFIER, None, eos_token_id=eos)


def cond(model, sampling=(1.0, 0, 1.0)):
    """Exact next-token law from a full (cache-free) forward over the prefix, after the transforms."""
    def f(prefix):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prefix])).logits[0, -1].double()
        return sampling_probs(logits, *sampling).double().numpy()
    return f


def counts_of(tokens: list[list[int]], T: int, pad: int | None = None) -> np.ndarray:
    c = np.zeros((V,) * T)
    for t in tokens:
        t = t + [pad] * (T - len(t)) if pad is not None else t
        c[tuple(t[:T])] += 1
    return c


def assert_fits(tokens, law, T, pad=None):
    res = goodness_of_fit(counts_of(tokens, T, pad), law, alpha=ALPHA, kind="counts")
    assert res.n == len(tokens)
    # the power the module docstring states, for this test's own sample size and pooled cells
    eps = EPS if res.n >= N else EPS_RAGGED
    assert power(res.n, eps, categories=res.bins, alpha=ALPHA) >= POWER, (res.n, res.bins)
    assert not res.reject, res




def tiny_head(verifier, seed: int = 0, shortlist=(0, 1, 2, 3, 4, 5, 7, 9), layers: int = 1) -> FeatureDraft:
    """A random EAGLE-3-style head on a tiny verifier (shortlist of 8 of the 10 tokens)."""
    torch.manual_seed(seed)
    a = HeadArgs(dim=16, n_heads=2, n_kv_heads=1, head_dim=8, hidden=24, vocab=V, shortlist=len(shortlist),
                 aux_layers=(0, 1, 2), max_positions=64, n_layers=layers)
    d = FeatureDraft(a, verifier.get_input_embeddings())
    with torch.no_grad():
        for name, p in d.named_parameters():
            if not name.startswith("embed."):
                p.normal_(0, 0.5) if p.ndim > 1 else p.fill_(1.0)
        d.d2t.copy_(torch.tensor(shortlist))
    return d.eval()


HEAD_VER = tiny(12, layers=3, scale=3.0)
HEAD = tiny_head(HEAD_VER)


def head_law(sampling=(1.0, 0, 1.0)):
    """The head's law of the next draft given the context at its block start and the drafts so far,
    from full verifier forwards and a fresh cache (independent of the loop's state keeping)."""
    def f(context, drafts):
        with torch.no_grad():
            hs = HEAD_VER(input_ids=torch.tensor([context]), output_hidden_states=True).hidden_states
            feats = HEAD.fuse([hs[i] for i in HEAD.args.aux_layers])[:, :-1]  # entries 0..len-2
            ids = torch.tensor([context[1:]])
            cache = HEAD.new_cache(1, 64)
            n = ids.shape[1]
            g = HEAD.step(feats, ids, cache, torch.arange(n)[None], n)[:, -1:]
            for i, t in enumerate(drafts):
                g = HEAD.step(g, torch.tensor([[t]]), cache, torch.tensor([[n + i]]), n + i + 1)
            return sampling_probs(HEAD.full_logits(g[0, 0]).double(), *sampling).numpy()
    return f

