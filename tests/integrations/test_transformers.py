"""cactus_theory.integrations.transformers: project rules inside ``model.generate(assistant_model=...)``.

* the output law of ``generate`` under ``use_rule`` equals the exact law (``toy.sequence_law``) on a
  tiny randomly initialised Llama pair: Pearson test at level ALPHA = 1e-3, fixed seed, with
  N = samples_needed(0.1, 36 categories, alpha=1e-3, beta=0.01) draws, i.e. power >= 0.99 against
  any law at TV >= 0.1 from the exact one, such as transformers' own (lossless) rule, which is
  asserted to lie at TV > 0.3 here;
* transformers' ``assistant_ensemble_weight = w`` is ``Ensemble(w)``: its acceptance probabilities and
  recovery laws, read from its own ``_speculative_sampling``, equal ``Ensemble(w)``'s to float64 precision, and
  the one-step law is ``Interpolation(1 - w)``'s; ``check_sampler`` judges transformers' function against
  ``Ensemble(w)`` in exact and sampled mode; inside ``use_rule()`` a ``generate(..., assistant_ensemble_weight=w)``
  is verified by ``Ensemble(w)``;
* one run with the real SmolLM2 verifier and a 4-layer truncated copy of it as the assistant.
"""

from __future__ import annotations

import copy
from unittest import mock

import numpy as np
import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation import utils as gen_utils

import cactus_theory as ct
from cactus_theory.integrations import transformers as ct_tf
from cactus_theory.stats import goodness_of_fit, samples_needed
from cactus_theory.toy import autoregressive_law, sequence_law

V, K, T, TEMP = 6, 2, 2, 0.8
PROMPT = (1, 2)


def tiny_llama(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                      initializer_range=0.5, tie_word_embeddings=False, bos_token_id=0, eos_token_id=None,
                      pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config = GenerationConfig(pad_token_id=0, eos_token_id=None, bos_token_id=0)
    return model


def conditional(model, prompt, temperature=TEMP):
    """Exact next-token law after ``prompt + prefix`` at ``temperature``."""
    def cond(prefix):
        with torch.no_grad():
            logits = model(torch.tensor([list(prompt) + list(prefix)])).logits[0, -1]
        return torch.softmax(logits.double() / temperature, -1).numpy()
    return cond


def assistant_temperature(target, draft, cfg) -> float:
    """The temperature of the law the assistant drafts from, read from what transformers hands to
    ``_speculative_sampling``. transformers 5.24 applies the logits processors to the assistant twice
    (its generation config's warpers and the target's list), so it drafts at TEMP**2, and reports
    those same processed logits (so its own rule stays lossless). Whichever it is, the exact law must
    use the law the assistant really samples from."""
    seen = []

    def capture(rule, cii, cl, k, nl, w=None, generator=None):
        seen.append(cl[0, 0].double())
        return ct_tf.speculative_sampling.__wrapped__(rule, cii, cl, k, nl, w, generator=generator)

    capture.__wrapped__ = ct_tf.speculative_sampling
    ids = torch.tensor([PROMPT])
    with mock.patch.object(ct_tf, "speculative_sampling", capture), ct_tf.use_rule(ct.SpS()):
        target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft, generation_config=cfg)
    with torch.no_grad():
        raw = draft(ids).logits[0, -1].double()
    reported = torch.softmax(seen[0], -1)
    for temp in (TEMP, TEMP ** 2):
        if torch.allclose(reported, torch.softmax(raw / temp, -1), atol=1e-6):
            return temp
    raise AssertionError(f"the assistant's reported law {reported} matches neither temperature")


@pytest.fixture(scope="module")
def tiny_pair():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    target, draft = tiny_llama(0), tiny_llama(1)
    # a fixed number of drafts per step (no heuristic schedule, no confidence stop)
    draft.generation_config.num_assistant_tokens = K
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    yield target, draft
    torch.set_num_threads(old)


@pytest.mark.slow  # one transformers generate() per sequence
def test_generate_law_equals_exact_law(tiny_pair):
    target, draft = tiny_pair
    rule = ct.Cactus(0.5)
    cfg = GenerationConfig(do_sample=True, temperature=TEMP, top_k=0, top_p=1.0, max_new_tokens=T + 1,
                           pad_token_id=0, eos_token_id=None)
    law = sequence_law(conditional(draft, PROMPT, assistant_temperature(target, draft, cfg)),
                       conditional(target, PROMPT), rule, K, T)
    lossless = autoregressive_law(conditional(target, PROMPT), T)
    assert ct.tv(law.ravel(), lossless.ravel()) > 0.3  # transformers' own rule would be caught
    N = samples_needed(0.1, categories=V ** T, alpha=1e-3, beta=0.01)
    ids = torch.tensor([PROMPT])
    torch.manual_seed(0)
    out = np.empty((N, T), dtype=np.int64)
    with ct_tf.use_rule(rule):
        for i in range(N):
            # T + 1 new tokens: every one of the first T is verified (min(K, T - emitted) drafts per
            # step), as toy.sequence_law's loop does; the (T + 1)-th is not tested
            seq = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                                  generation_config=cfg)
            out[i] = seq[0, len(PROMPT):len(PROMPT) + T].numpy()
    res = goodness_of_fit(out, law, alpha=1e-3, kind="samples")
    assert not res.reject, res


def _transformers_parts(p, q, w):
    """Acceptance probabilities and recovery laws of transformers' own ``_speculative_sampling``
    with ``assistant_ensemble_weight = w`` (float64 logits), read by intercepting its draws."""
    seen = {}

    def rand_like(ratio):  # records the acceptance ratio, then rejects (u = 2)
        seen["ratio"] = float(ratio.reshape(-1)[0])
        return torch.full_like(ratio, 2.0)

    def multinomial(probs, num_samples):  # records the recovery law
        seen["g"] = probs.reshape(-1).numpy().copy()
        return torch.zeros((1, 1), dtype=torch.long)

    acc, res = np.zeros(V), np.zeros((V, V))
    for n in range(V):
        with mock.patch.object(torch, "rand_like", rand_like), mock.patch.object(torch, "multinomial", multinomial):
            gen_utils._speculative_sampling(
                torch.tensor([[n]]), torch.from_numpy(np.log(p))[None, None],  # their q: the assistant
                1, torch.from_numpy(np.log(np.stack([q, q])))[None], assistant_ensemble_weight=w)
        acc[n] = min(1.0, seen["ratio"])
        res[n] = seen["g"]
    return acc, res


@pytest.mark.parametrize("w", [0.2, 0.5, 0.9])
def test_assistant_ensemble_weight_is_ensemble(w):
    rng = np.random.default_rng(int(10 * w))
    p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    assert gen_utils._speculative_sampling is ct_tf._original  # not inside use_rule
    acc, res = _transformers_parts(p, q, w)
    rule = ct_tf.ensemble_weight_rule(w)
    assert rule == ct.Ensemble(w)
    n = np.arange(V)
    P, Q = np.broadcast_to(p, (V, V)), np.broadcast_to(q, (V, V))
    np.testing.assert_allclose(acc, rule.accept_prob(P, Q, n), rtol=0, atol=1e-12)
    rej = acc < 1
    np.testing.assert_allclose(res[rej], rule.residual(P, Q, n)[rej], rtol=0, atol=1e-12)
    h_tf = (p * acc) @ np.eye(V) + (p * (1 - acc)) @ np.where(rej[:, None], res, 0)
    np.testing.assert_allclose(h_tf, ct.induced_distribution(rule, p, q), rtol=0, atol=1e-12)
    # its law is Interpolation(1 - w)'s, hence h = w q + (1 - w) p exactly (Theorem 1)
    np.testing.assert_allclose(h_tf, ct.induced_distribution(ct.Interpolation(1 - w), p, q), rtol=0, atol=1e-12)
    np.testing.assert_allclose(h_tf, w * q + (1 - w) * p, rtol=0, atol=1e-12)
    assert ct.tv(h_tf, q) > 1e-3  # a lossy rule: the pin is not trivially q = q


def test_ensemble_fallback_is_transformers_own():
    """Where the residual ``(q - p)_+`` sums to at most float32's tiny, transformers recovers from the target ``q``
    (its ensemble-only fallback), and so does ``Ensemble(w)`` on the same float32 rows; ``Interpolation(1 - w)``
    normalises the residual instead. float32 logits ``z_q = (0, 0, -88, -89)``, ``z_p = (0, 0, -89, -88)``: the rows
    differ only below float32's tiny (``Z`` about 1.9e-39), draft 3 is rejected with probability about ``0.63 w``."""
    w = 0.5
    zq = torch.tensor([0.0, 0.0, -88.0, -89.0])
    zp = torch.tensor([0.0, 0.0, -89.0, -88.0])
    q32, p32 = zq.softmax(-1), zp.softmax(-1)
    z = (q32 - p32).clamp_min(0).sum()
    assert 0 < float(z) <= torch.finfo(torch.float32).tiny
    seen = {}

    def multinomial(probs, num_samples):
        seen["g"] = probs.reshape(-1).clone()
        return torch.zeros((1, 1), dtype=torch.long)

    with mock.patch.object(torch, "rand_like", lambda r: torch.full_like(r, 2.0)), \
            mock.patch.object(torch, "multinomial", multinomial):
        gen_utils._speculative_sampling(torch.tensor([[3]]), zp[None, None], 1, torch.stack([zq, zq])[None],
                                        assistant_ensemble_weight=w)
    assert torch.equal(seen["g"], q32)  # transformers: the target itself
    n = torch.tensor(3)
    assert torch.equal(ct.Ensemble(w).residual(p32, q32, n), q32)
    assert torch.equal(ct.Interpolation(1 - w).residual(p32, q32, n), torch.eye(4)[2])
    assert 0.5 < float(ct.Ensemble(w).accept_prob(p32, q32, n)) < 1  # the draft can be rejected: the fallback is read


ENSEMBLE_TV = 0.15  # the sampled checks below detect a pooled TV of 0.15 with power 0.9 at level 1e-3


def _rows(seed):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, 0.7), size=K), rng.dirichlet(np.full(V, 0.7), size=K + 1)


@pytest.mark.parametrize("w", [0.3, 0.7])
def test_check_sampler_judges_transformers_ensemble_against_its_rule(w):
    """transformers' own ``_speculative_sampling`` with ``assistant_ensemble_weight = w`` (installed version) against
    ``Ensemble(w)``'s exact block law: exact mode (its law read from its code: equal to float32 rounding and the
    ``2**-24`` grid of ``torch.rand``, nothing impossible) and sampled mode (N rows sized for TV 0.15 at power 0.9,
    alpha 1e-3, seed 0: not rejected). SpS's law, at first-token TV > 0.2 on these rows, is rejected in both modes."""
    from cactus_theory.theory.check import block_law, transformers_sampler

    P, Q = _rows(9)
    hf = transformers_sampler(gen_utils._speculative_sampling, assistant_ensemble_weight=w)
    ex = ct.check_sampler(hf, P, Q, rule=ct.Ensemble(w), mode="exact")
    assert not ex.reject and ex.exact.impossible_mass == 0 and ex.exact.max_abs_diff < 1e-6, ex.exact
    assert ct.check_sampler(hf, P, Q, rule=ct.SpS(), mode="exact").reject
    ens, sps = block_law(ct.Ensemble(w), P, Q), block_law(ct.SpS(), P, Q)
    assert 0.5 * np.abs(ens.first() - sps.first()).sum() > 0.2
    res = ct.check_sampler(hf, P, Q, rule=ct.Ensemble(w), tv=ENSEMBLE_TV, seed=0, parts=("first", "block"))
    assert not res.reject, res.table()
    other = ct.check_sampler(hf, P, Q, rule=ct.SpS(), tv=ENSEMBLE_TV, seed=0, parts=("first", "block"))
    assert other.reject, other.table()


def test_use_rule_verifies_a_weighted_step_with_ensemble():
    """Inside ``use_rule()`` (no rule), transformers' step with a weight is verified by ``Ensemble(w)`` through
    ``sampler.verify``: its first-token and block laws are Ensemble's (sampled, TV 0.15 at power 0.9, alpha 1e-3),
    and a disagreeing rule is refused naming both."""
    from cactus_theory.theory.check import transformers_sampler

    w = 0.4
    P, Q = _rows(3)

    def step(cii, cl, k, nl, assistant_ensemble_weight=None):  # what use_rule() installs, with torch's global RNG
        return ct_tf.speculative_sampling(None, cii, cl, k, nl, assistant_ensemble_weight)

    ours = transformers_sampler(step, assistant_ensemble_weight=w)  # sampled mode only: its exact law is not ours
    res = ct.check_sampler(ours, P, Q, rule=ct.Ensemble(w), tv=ENSEMBLE_TV, seed=1, parts=("first", "block"))
    assert not res.reject, res.table()
    assert ct.check_sampler(ours, P, Q, rule=ct.SpS(), tv=ENSEMBLE_TV, seed=1, parts=("first", "block")).reject
    lp, lq = torch.log(torch.tensor(P[None], dtype=torch.float32)), torch.log(torch.tensor(Q[None], dtype=torch.float32))
    with pytest.raises(ValueError, match=r"Ensemble\(weight=0.4\).*Cactus"):
        ct_tf.speculative_sampling(ct.Cactus(0.5), torch.tensor([[0, 1]]), lp, K, lq, w)
    tokens, a = ct_tf.speculative_sampling(ct.Ensemble(w), torch.tensor([[0, 1]]), lp, K, lq, w)  # the same rule
    assert tokens.shape == (1, int(a) + 1)


def test_generate_with_an_ensemble_weight_verifies_with_ensemble(tiny_pair):
    """``generate(..., assistant_ensemble_weight=w)`` inside ``use_rule()`` and through ``assisted_generate`` reaches
    ``sampler.verify`` with ``Ensemble(w)`` at every step (never refused, never ignored); without a weight, SpS."""
    target, draft = tiny_pair
    ids = torch.tensor([PROMPT])
    seen = []

    def spy(*args, **kwargs):
        seen.append(args[3])
        return ct.sampler.verify(*args, **kwargs)

    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, pad_token_id=0)
    torch.manual_seed(0)
    with mock.patch.object(ct_tf, "verify", spy):
        with ct_tf.use_rule():
            target.generate(**kw, assistant_model=draft, do_sample=True, assistant_ensemble_weight=0.3)
        assert seen and all(r == ct.Ensemble(0.3) for r in seen)
        seen.clear()
        ct_tf.assisted_generate(target, draft, **kw, assistant_ensemble_weight=0.6)
        assert seen and all(r == ct.Ensemble(0.6) for r in seen)
        seen.clear()
        ct_tf.assisted_generate(target, draft, ct.Ensemble(0.6), **kw, assistant_ensemble_weight=0.6)
        assert seen and all(r == ct.Ensemble(0.6) for r in seen)
        seen.clear()
        with ct_tf.use_rule():
            target.generate(**kw, assistant_model=draft, do_sample=True)
        assert seen and all(r == ct.SpS() for r in seen)


def test_use_rule_restores_and_refuses_bad_input(tiny_pair):
    target, draft = tiny_pair
    original = gen_utils._speculative_sampling
    with pytest.raises(RuntimeError, match="boom"):
        with ct_tf.use_rule(ct.SpS()):
            assert gen_utils._speculative_sampling is not original
            raise RuntimeError("boom")
    assert gen_utils._speculative_sampling is original
    with pytest.raises(ValueError, match="rule"):
        with ct_tf.use_rule("cactus"):
            pass
    for call in (lambda: ct_tf.use_rule(ct.SequenceBudget(1.0)).__enter__(),  # no per-sequence state in the
                 lambda: ct_tf.speculative_sampling(ct.SequenceBudget(1.0), torch.tensor([[1, 2]]),  # assisted loop
                                                    torch.zeros(1, 1, V), 1, torch.zeros(1, 2, V))):
        with pytest.raises(ValueError, match="stateful"):
            call()
    assert gen_utils._speculative_sampling is original
    ids = torch.tensor([PROMPT])
    with pytest.raises(ValueError, match=r"Ensemble\(weight=0.3\).*Cactus"):
        ct_tf.assisted_generate(target, draft, ct.Cactus(0.5), input_ids=ids, attention_mask=torch.ones_like(ids),
                                max_new_tokens=3, assistant_ensemble_weight=0.3)
    with pytest.raises(ValueError, match="do_sample"):
        ct_tf.assisted_generate(target, draft, ct.SpS(), input_ids=ids, do_sample=False)
    with pytest.raises(ValueError, match="vocabulary"):
        ct_tf.speculative_sampling(ct.SpS(), torch.tensor([[1, 2]]), torch.zeros(1, 1, V + 1), 1,
                                   torch.zeros(1, 2, V))


@pytest.mark.lm
@pytest.mark.slow
def test_smollm2_with_truncated_assistant(smollm2):
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, tok = smollm2  # load_model("smollm2"), shared with tests/lm/test_smollm2.py (conftest)
        cfg = copy.deepcopy(model.config)
        cfg.num_hidden_layers = 4  # an untrained early exit: the first 4 of 30 layers, shared head
        draft = type(model)(cfg).eval()
        missing, _ = draft.load_state_dict(model.state_dict(), strict=False)
        assert not missing
        draft.generation_config.num_assistant_tokens = 3
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        calls = []

        def spy(*args, **kwargs):
            out = ct.sampler.verify(*args, **kwargs)
            calls.append(int(out[1][0]))
            return out

        ids = tok("The capital of France is", return_tensors="pt")
        torch.manual_seed(0)
        with mock.patch.object(ct_tf, "verify", spy):
            out = ct_tf.assisted_generate(model, draft, ct.Cactus(1.0), **ids, max_new_tokens=8,
                                          temperature=0.6, top_k=20, top_p=0.95)
        new = out[0, ids["input_ids"].shape[1]:]
        assert len(new) == 8 and calls and max(calls) >= 1  # drafts were verified, some accepted
        text = tok.decode(new)
        assert isinstance(text, str) and text.strip()
    finally:
        torch.set_num_threads(old)
