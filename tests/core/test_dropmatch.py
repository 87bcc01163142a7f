"""DropMatch (``rules.DropMatch``, ``dropmatch``): its law against an independent reference, its
special cases against other rules, the dropout path law exact vs Monte Carlo, and the decode loop's
output against the exact law on a tiny pair.

Statistical tests (fixed seeds, so the suite is deterministic): chi-square goodness of fit at
ALPHA = 1e-3; with N = 20000 sequences and at most 100 pooled cells, a law at TV distance 0.06 from
the exact one is rejected with probability >= 0.99 (``stats.power``, asserted in the test). Monte
Carlo estimates are compared within 5 standard errors (a false alarm per entry ~ 6e-7).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

import cactus_theory as ct
from cactus_theory import registry
from cactus_theory.dropmatch import (
    PathLaw,
    exact_path_law,
    jackknife,
    path_law,
    sample_hits,
    step_law,
    synthetic_head,
)
from cactus_theory.lm import ModelPair, sampling_probs, speculative_generate
from cactus_theory.lm.head_tap import HeadTap
from cactus_theory.rules import DropMatch
from cactus_theory.stats import goodness_of_fit, power
from cactus_theory.theory.reference import reference_law
from cactus_theory.toy import one_step_test
from tests.helpers import tiny_llama

ALPHA, N, EPS = 1e-3, 20000, 0.06
V = 10


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(seed: int) -> LlamaForCausalLM:
    return tiny_llama(seed, V, hidden=12, ctx=32)


DRAFT, VERIFIER = tiny(1), tiny(2)


def rows(seed: int, R: int = 3, V: int = 7):
    rng = np.random.default_rng(seed)
    p, q, hit = rng.dirichlet(np.ones(V), size=R), rng.dirichlet(np.ones(V), size=R), rng.uniform(size=(R, V))
    p[0, 2] = 0.0  # a token the draft cannot draft
    q[-1, 3] = 0.0  # a token the verifier excludes
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True), hit


@pytest.mark.parametrize("base", ["sps", "match"])
def test_law_equals_the_reference(base):
    p, q, hit = rows(0)
    rule = DropMatch(0.1, 3, base).at(hit)
    h = ct.induced_distribution(rule, p, q)
    for i in range(len(p)):
        ref = reference_law(DropMatch(0.1, 3, base).at(hit[i]), p[i], q[i])
        np.testing.assert_allclose(h[i], ref, atol=1e-14)
    assert np.allclose(h.sum(-1), 1)


def test_no_paths_is_sps_and_exact_match_verification():
    p, q, _ = rows(1)
    zero = np.zeros_like(p)
    np.testing.assert_allclose(ct.induced_distribution(DropMatch(0.1, 0).at(zero), p, q), q, atol=1e-14)
    np.testing.assert_allclose(ct.acceptance_rate(DropMatch(0.1, 0).at(zero), p, q), ct.acceptance_rate(ct.SpS(), p, q))
    # base "match": the verifier's own sample is the only path (SGLang's target-only test at thresholds 1)
    m = DropMatch(0.1, 0, "match").at(zero)
    np.testing.assert_allclose(ct.induced_distribution(m, p, q), q, atol=1e-14)
    np.testing.assert_allclose(ct.acceptance_rate(m, p, q), ct.acceptance_rate(ct.SGLangThreshold(1.0, 1.0), p, q))
    # hit = 1 everywhere accepts every draft: the law is p
    one = np.ones_like(p)
    np.testing.assert_allclose(ct.induced_distribution(DropMatch().at(one), p, q), p, atol=1e-14)


def test_unbound_rule_says_how_to_bind():
    p, q, _ = rows(2)
    with pytest.raises(ValueError, match=r"rule\.at\(hit\)"):
        ct.acceptance_rate(DropMatch(), p, q)
    with pytest.raises(ValueError, match="hit must have"):
        ct.acceptance_rate(DropMatch().at(np.zeros((2, 5))), p, q)
    # one bound rule serves torch (verify) and numpy (exact laws)
    np.testing.assert_allclose(ct.acceptance_rate(DropMatch().at(torch.zeros(p.shape)), p, q),
                               ct.acceptance_rate(ct.SpS(), p, q))
    for bad, name in ((dict(rate=1.0), "rate"), (dict(rate=-0.1), "rate"), (dict(num_paths=-1), "num_paths"),
                      (dict(num_paths=1.5), "num_paths"), (dict(base="bogus"), "base")):
        with pytest.raises(ValueError, match=name):
            DropMatch(**bad)


def test_verify_samples_the_exact_law():
    p, q, hit = rows(3, R=1)
    P, Q = p, np.concatenate([q, q])  # one drafted position and the bonus row
    for base in ("sps", "match"):
        res = one_step_test(DropMatch(0.2, 2, base).at(torch.from_numpy(hit[0])), P, Q, num_samples=N, alpha=ALPHA)
        assert power(N, EPS, categories=res.bins, alpha=ALPHA) >= 0.99
        assert not res.reject, res


def test_path_law_monte_carlo_and_exact_agree():
    g = torch.Generator().manual_seed(0)
    x, W = torch.randn(3, 8, generator=g), torch.randn(V, 8, generator=g)
    b = torch.randn(V, generator=g)
    exact = exact_path_law(x, W, 0.25, sampling=(0.8, 5, 0.95), bias=b)
    assert exact.shape == (3, V) and np.allclose(exact.sum(-1), 1)
    mc = path_law(x, W, 0.25, 4096, sampling=(0.8, 5, 0.95), bias=b, groups=16, generator=g)
    se = np.maximum(mc.stderr, 1e-4)
    assert np.all(np.abs(mc.r - exact) <= 5 * se)
    # rate 0: every path is the undropped head, so r is q itself
    q = sampling_probs(torch.nn.functional.linear(x, W, b), 0.8, 5, 0.95).double().numpy()
    np.testing.assert_allclose(exact_path_law(x, W, 0.0, sampling=(0.8, 5, 0.95), bias=b), q, atol=1e-6)


def test_sample_hits_average_to_one_minus_miss_probability():
    g = torch.Generator().manual_seed(1)
    x, W = torch.randn(6, generator=g), torch.randn(V, 6, generator=g)
    rule = DropMatch(0.3, 3)
    r = exact_path_law(x, W, rule.rate)
    draws = 6000
    hits = sample_hits(x.expand(draws, 6), W, rule, generator=g).double().numpy()
    expect = rule.hit_from_law(r)
    se = np.sqrt(np.maximum(expect * (1 - expect), 1e-6) / draws)
    assert np.all(np.abs(hits.mean(0) - expect) <= 5 * se)
    assert set(np.unique(hits)) <= {0.0, 1.0} and np.all(hits.sum(-1) <= 3)


def test_step_law_jackknife_covers_the_exact_value():
    g = torch.Generator().manual_seed(2)
    x, W = torch.randn(4, 8, generator=g), torch.randn(V, 8, generator=g) * 2
    rng = np.random.default_rng(2)
    q = sampling_probs(torch.nn.functional.linear(x, W), 1.0).double().numpy()
    p = rng.dirichlet(np.ones(V), size=4)
    rule = DropMatch(0.2, 2)
    exact = step_law(rule, p, q, PathLaw(exact_path_law(x, W, 0.2), np.stack([exact_path_law(x, W, 0.2)] * 2), 0, 0.2))
    mc = step_law(rule, p, q, path_law(x, W, 0.2, 2048, groups=16, generator=g))
    assert np.all(np.abs(mc.accept - exact.accept) <= 5 * mc.accept_se + 1e-9)
    assert np.all(np.abs(mc.kl - exact.kl) <= 5 * mc.kl_se + 1e-9)
    assert np.all(exact.accept_se == 0)  # identical groups: no Monte Carlo error
    est, se = jackknife(lambda r: r.sum(-1), PathLaw(exact_path_law(x, W, 0.2), np.stack([exact_path_law(x, W, 0.2)] * 3), 0, 0.2))
    assert np.allclose(est, 1) and np.allclose(se, 0)


def test_synthetic_head_reproduces_the_logits():
    z = np.random.default_rng(5).normal(size=(2, 9)) * 3
    x, W = synthetic_head(z, dim=16)
    assert np.allclose(torch.einsum("rvd,rd->rv", W, x).numpy(), z)


def _tapped(model, ids):
    with torch.no_grad(), HeadTap(model) as tap:
        out = model(input_ids=torch.tensor([ids]))
    tap.check(out.logits)
    return tap


@pytest.mark.parametrize("compact", [True, False])
def test_decode_loop_follows_dropmatchs_exact_law(compact):
    """First token from the prompt pass (q), second from one DropMatch step: law q(t1) h_alg(t2 | t1),
    with the path law exact (2^12 masks of the tiny head)."""
    rule = DropMatch(0.3, 3)
    prompt = [1, 8]
    pair = ModelPair(DRAFT, VERIFIER, None)

    def law_at(model, prefix):
        with torch.no_grad():
            return sampling_probs(model(input_ids=torch.tensor([prefix])).logits[0, -1].double(), 1.0).numpy()

    law = np.zeros((V, V))
    lossless = np.zeros((V, V))
    q1 = law_at(VERIFIER, prompt)
    for t1 in range(V):
        pre = prompt + [t1]
        tap = _tapped(VERIFIER, pre)
        r = exact_path_law(tap.hidden[0, -1], tap.weight, rule.rate)
        p, q = law_at(DRAFT, pre), law_at(VERIFIER, pre)
        law[t1] = q1[t1] * ct.induced_distribution(rule.at(rule.hit_from_law(r)), p, q)
        lossless[t1] = q1[t1] * q
    res = speculative_generate(pair, [prompt] * N, rule, k=2, max_new_tokens=2, batch_size=N, seed=2,
                               temperature=1.0, top_k=0, top_p=1.0, compact=compact)
    counts = np.zeros((V, V))
    for t in res.tokens:
        counts[t[0], t[1]] += 1
    fit = goodness_of_fit(counts, law / law.sum(), alpha=ALPHA, kind="counts")
    assert power(N, EPS, categories=fit.bins, alpha=ALPHA) >= 0.99
    assert not fit.reject, fit
    assert goodness_of_fit(counts, lossless / lossless.sum(), alpha=ALPHA, kind="counts").reject  # not SpS's law
    assert res.stats.kl_skipped > 0 and res.stats.kl_count == 0  # the loop does not estimate its step KL


def test_head_tap_refuses_what_it_cannot_read():
    class NoHead(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="LM head"):
        HeadTap(NoHead())
    m = tiny(3)
    m.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="softcapping"):
        HeadTap(m)
    tap = HeadTap(tiny(4))
    with pytest.raises(ValueError, match="captured"):
        tap.check(torch.zeros(1, V))


def test_registry_and_cli():
    s = registry.spec("dropmatch")
    assert s.reads_head and registry.verification("dropmatch") == "collaborative"
    import argparse

    ap = argparse.ArgumentParser()
    registry.add_rule_arguments(ap)
    args = ap.parse_args(["--rule", "dropmatch", "--dropmatch-paths", "2", "--dropmatch-base", "match"])
    assert registry.rule_from_args(args) == DropMatch(0.1, 2, "match")
    assert registry.label(DropMatch(0.1, 2).at(np.zeros(3))).startswith("DropMatch")

