"""Conformance, the DropMatch tap: the decode loop's path to a rule that declares ``reads_head``
(``lm.head_tap.HeadTap`` captures the LM head's input during the verifier's forward, ``lm.loop.VerifierStep``
exposes it, ``Rule.bind`` draws the rule's dropout paths from it with ``core.dropout.path_hits``, then
``sampler.verify`` judges the drafts), every registry rule.

A rule that does not read the head is handed the step and must return itself (``Rule.bind``'s declared
default; asserted, exactly). DropMatch's tap is random twice (dropout masks, then each path's token by
``torch.multinomial``), so its output is SAMPLED and judged by ``theory.check.check_sampler`` against the
exact block law of ``rule.at(1 - (1 - r)^M)``, ``r`` the exact path law over all ``2^d`` masks of a
``d = 6`` head (``core.dropmatch.exact_path_law``): first token, bonus and whole blocks, Holm over the
three parts at family level ALPHA = 1e-3, each part sized for power 0.9 against a pooled TV of EPS = 0.05
(``res.detectable_tv`` asserted <= EPS). The hits themselves (the tap's exposed decisions) are judged too:
each (position, token) cell's hit frequency over the N independent steps is Binomial(N, 1 - (1 - r)^M),
an exact binomial test per cell, Holm over the K V cells at family level ALPHA; N (asserted) gives power
>= 0.9 against a shift of DELTA = 0.04 in any one cell (``stats.samples_needed`` at two categories and
level ALPHA / (K V)). Configurations: rate >= 0.1 and at least one path (where dropout moves the path law;
the mutants' table records a port these see, a missing 1 / (1 - rate), moving cells by 0.05 to 0.2). Fixed
seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest

from cactus_theory.core.dropmatch import exact_path_law
from cactus_theory.core.transforms import sampling_probs
from cactus_theory.lm.head_tap import HeadTap
from cactus_theory.lm.loop import VerifierStep
from cactus_theory.sampler import verify
from cactus_theory.theory.check import check_sampler
from cactus_theory.theory.stats import holm, samples_needed
from tests.conformance.harness import RULE_KEYS, configurations, pair, profile, refusal

ALPHA, EPS, POWER, DELTA = 1e-3, 0.05, 0.9, 0.04
V, D, K = 5, 6, 2


class Head(torch.nn.Module):
    """The smallest model HeadTap reads: an LM head (``nn.Linear``) applied to given hidden states."""

    def __init__(self, seed: int, bias: bool):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.head = torch.nn.Linear(D, V, bias=bias, dtype=torch.float64)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(V, D, generator=g, dtype=torch.float64) * 1.5)
            if bias:
                self.head.bias.copy_(torch.randn(V, generator=g, dtype=torch.float64) * 0.5)

    def forward(self, hidden):
        return self.head(hidden)


def tap_step(model, hidden, sampling, generator):
    """What the decode loop builds: the verifier's forward under a HeadTap, then the step."""
    with HeadTap(model) as tap:
        logits = model(hidden)
    return VerifierStep(K, sampling, generator, logits.float(), tap)


@pytest.mark.parametrize("key", RULE_KEYS)
def test_dropmatch_tap(key):
    configs = configurations(key)
    model = Head(0, bias=True)
    hidden = torch.randn(3, K + 1, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    if refusal("dropmatch_tap", configs[0]) is not None:  # declared: the rule reads q only, bind is the identity
        step = tap_step(model, hidden, (1.0, 0, 1.0), torch.Generator().manual_seed(0))
        for rule in configs[:8]:
            assert rule.bind(step) is rule
        return
    live = [r for r in configs if r.num_paths > 0 and r.rate >= 0.1]  # the configurations whose tap does something

    @profile(3)
    @given(i=st.integers(0, len(live) - 1), seed=st.integers(0, 2**32 - 1),
           sampling=st.sampled_from([(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.9)]), bias=st.booleans())
    def run(i, seed, sampling, bias):
        rule = live[i]
        rng = np.random.default_rng(seed)
        model = Head(int(rng.integers(2**31)), bias)
        x = torch.from_numpy(rng.normal(size=(K + 1, D)))
        with torch.no_grad():
            Q = sampling_probs(model(x), *sampling).double()  # the verifier's rows, as the loop computes them
        P = torch.from_numpy(np.stack([pair(rng, V, "random")[0] for _ in range(K)]))
        r = exact_path_law(x[:K], model.head.weight, rule.rate, sampling=sampling, bias=model.head.bias)
        exact = rule.at(rule.hit_from_law(r))  # the law the tap must produce

        hits = {"sum": torch.zeros(K, V, dtype=torch.float64), "n": 0}

        def sampler(draft_tokens, draft_probs, verifier_probs, _rule, generator=None):
            B = draft_tokens.shape[0]
            step = tap_step(model, x.expand(B, K + 1, D), sampling, generator)
            bound = rule.bind(step)
            hit = bound.hit
            assert tuple(hit.shape) == (B, K, V) and set(torch.unique(hit).tolist()) <= {0.0, 1.0}
            assert bool((hit.sum(-1) >= 1).all() & (hit.sum(-1) <= rule.num_paths).all())
            hits["sum"] += hit.double().sum(0)
            hits["n"] += B
            return verify(draft_tokens, draft_probs, verifier_probs, bound, generator=generator)

        res = check_sampler(sampler, P, Q, rule=exact, tv=EPS, alpha=ALPHA, power=POWER, seed=int(rng.integers(2**31)))
        assert res.detectable_tv is None or res.detectable_tv <= EPS + 1e-6, res  # stats.detectable_tv bisects to 1e-6
        assert not res.reject, (rule, sampling, str(res))
        # the hits, cell by cell: Binomial(N, hit law)
        N, want = hits["n"], exact.hit
        assert N >= samples_needed(DELTA, categories=2, alpha=ALPHA / (K * V), beta=1 - POWER), N
        pv = [binomtest(int(c), N, float(h)).pvalue for c, h in zip(hits["sum"].flatten().tolist(),
                                                                    np.asarray(want).flatten().tolist(), strict=True)]
        assert min(holm(pv)) > ALPHA, (rule, sampling, hits["sum"] / N, want)

    run()
