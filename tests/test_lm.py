"""cactus_theory.lm on tiny randomly initialised transformers (no download): the exact law of the
first generated tokens, batching with ragged prompts, EOS, determinism, statistics, bad input.

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

import math

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM

import cactus_theory as ct
from cactus_theory.core.transforms import check_sampling
from cactus_theory.exact import step_divergence
from cactus_theory.lm import (
    ModelPair,
    autoregressive_generate,
    sampling_probs,
    speculative_generate,
)
from cactus_theory.lm.draft import DraftConfig, FeatureDraft, HeadArgs
from cactus_theory.lm.llama import Llama
from cactus_theory.lm.metrics import step_kl
from cactus_theory.lm.pair import check_same_tokenizer
from cactus_theory.stats import goodness_of_fit, power
from cactus_theory.toy import autoregressive_law, sequence_law

ALPHA = 1e-3
N = 20000
EPS, EPS_RAGGED, POWER = 0.06, 0.12, 0.99
RAW = dict(temperature=1.0, top_k=0, top_p=1.0)  # plain sampling (the loop's default is the paper's)
V = 10
EOS = 4


pytestmark = pytest.mark.usefixtures("one_thread")


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


# -- transforms -------------------------------------------------------------------------------------

def test_sampling_probs_temperature_topk_topp():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    full = sampling_probs(logits, 1.0)
    assert torch.allclose(full, logits.softmax(-1))
    hot = sampling_probs(logits, 0.5)
    assert torch.allclose(hot, (logits / 0.5).softmax(-1))
    top2 = sampling_probs(logits, 1.0, top_k=2)
    assert torch.allclose(top2[0, :2], logits[0, :2].softmax(-1)) and float(top2[0, 2:].sum()) == 0
    # top-p keeps the smallest prefix whose mass reaches top_p (the crossing token included)
    pr = logits.softmax(-1)[0]
    nucleus = sampling_probs(logits, 1.0, top_p=float(pr[0] + 1e-3))
    assert torch.allclose(nucleus[0, :2], pr[:2] / pr[:2].sum()) and float(nucleus[0, 2:].sum()) == 0
    assert torch.equal(sampling_probs(logits, 1.0, top_p=float(pr[0]) * 0.5)[0], torch.tensor([1.0, 0, 0, 0, 0]))
    greedy = sampling_probs(logits, 0.0)
    assert torch.equal(greedy[0], torch.tensor([1.0, 0, 0, 0, 0]))
    inf = torch.tensor([[0.0, -math.inf, 1.0]])
    assert float(sampling_probs(inf, 0.7, top_k=2)[0, 1]) == 0


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(temperature=float("nan"))])
def test_sampling_args_rejected(bad):
    kw = dict(temperature=1.0, top_k=0, top_p=1.0) | bad
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        check_sampling(**kw)


# -- exact laws -------------------------------------------------------------------------------------

@pytest.mark.parametrize("k,sampling,compact", [(1, (1.0, 0, 1.0), True), (3, (0.8, 6, 0.9), True),
                                                (3, (0.8, 6, 0.9), False)])
def test_sps_gives_the_verifiers_own_law(k, sampling, compact):
    prompt = [3, 5, 7]
    res = speculative_generate(pair(), [prompt] * N, ct.SpS(), k=k, max_new_tokens=3, temperature=sampling[0],
                               top_k=sampling[1], top_p=sampling[2], batch_size=N, seed=1, track_kl=False,
                               compact=compact)
    assert all(len(t) == 3 for t in res.tokens)
    assert_fits(res.tokens, autoregressive_law(cond(VERIFIER, sampling), 3, prompt=tuple(prompt)), 3)
    assert 1 < res.stats.al < k + 1  # a different draft: some but not all drafts accepted


@pytest.mark.parametrize("rule,k,T,compact", [(ct.Cactus(1.0), 1, 3, True), (ct.Cactus(0.5), 2, 4, True),
                                              (ct.TAS(), 2, 3, True), (ct.Cactus(0.5), 2, 3, False)])
def test_lossy_rules_follow_the_exact_sequence_law(rule, k, T, compact):
    prompt = [1, 8]
    res = speculative_generate(pair(), [prompt] * N, rule, k=k, max_new_tokens=T, batch_size=N, seed=2,
                               track_kl=False, compact=compact, **RAW)
    law = sequence_law(cond(DRAFT), cond(VERIFIER), rule, k, T, prompt=tuple(prompt), verifier_first=True)
    assert_fits(res.tokens, law, T)
    # and the law really is not the verifier's: the test has power to tell them apart
    ar = autoregressive_law(cond(VERIFIER), T, prompt=tuple(prompt))
    assert goodness_of_fit(counts_of(res.tokens, T), ar, alpha=ALPHA, kind="counts").reject


def test_ragged_batch_gives_each_row_its_own_law():
    prompts = [[6], [3, 5, 7, 1, 2], [2, 9]]
    batch = [prompts[i % 3] for i in range(3 * 2500)]  # interleaved, so rows of every length share steps
    rule = ct.Cactus(0.5)
    res = speculative_generate(pair(), batch, rule, k=2, max_new_tokens=3, batch_size=len(batch), seed=3,
                               track_kl=False, **RAW)
    for j, pr in enumerate(prompts):
        law = sequence_law(cond(DRAFT), cond(VERIFIER), rule, 2, 3, prompt=tuple(pr), verifier_first=True)
        assert_fits(res.tokens[j::3], law, 3)


@pytest.mark.parametrize("compact", [True, False])
def test_greedy_batch_equals_each_prompt_alone_and_plain_greedy(compact):
    """Deterministic check of caches, masks and positions: at temperature 0 SpS emits the verifier's
    greedy continuation, whatever the batch, padding, and number of drafts accepted per step."""
    prompts = [[6], [3, 5, 7, 1, 2, 8, 8], [2, 9], [0, 1, 2, 3]]
    spec = speculative_generate(pair(), prompts, ct.SpS(), k=3, max_new_tokens=12, temperature=0.0,
                                batch_size=4, seed=0, compact=compact)
    ar = autoregressive_generate(pair(), prompts, max_new_tokens=12, temperature=0.0, batch_size=3, seed=5,
                                 compact=compact)
    for pr, got, base in zip(prompts, spec.tokens, ar.tokens, strict=True):
        seq = list(pr)
        for _ in range(12):
            with torch.no_grad():
                seq.append(int(VERIFIER(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
        assert got == seq[len(pr):] == base
    assert 0 < spec.stats.accepted < spec.stats.drafted


def test_eos_stops_each_row_and_keeps_the_law():
    prompt = [3, 5, 7]
    res = speculative_generate(pair(EOS), [prompt] * N, ct.SpS(), k=2, max_new_tokens=3, batch_size=N, seed=4,
                               track_kl=False, **RAW)
    assert all(EOS not in t[:-1] for t in res.tokens)
    assert all(len(t) == 3 or t[-1] == EOS for t in res.tokens)
    stopped = sum(len(t) < 3 for t in res.tokens)
    assert stopped > 100  # EOS is reachable from this prompt, so the stopping path is exercised

    base = cond(VERIFIER)

    def absorbing(prefix):  # after EOS the (padded) output repeats EOS
        return np.eye(V)[EOS] if EOS in prefix[len(prompt):] else base(prefix)

    assert_fits(res.tokens, autoregressive_law(absorbing, 3, prompt=tuple(prompt)), 3, pad=EOS)


def test_seeded_determinism():
    prompts = [[1, 2, 3], [4], [5, 6]]
    kw = dict(rule=ct.Cactus(1.0), k=3, max_new_tokens=10, temperature=0.9, top_p=0.95, batch_size=2)
    a = speculative_generate(pair(EOS), prompts, seed=11, **kw)
    b = speculative_generate(pair(EOS), prompts, seed=11, **kw)
    c = speculative_generate(pair(EOS), prompts * 4, seed=12, **kw)
    assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted
    assert a.tokens != c.tokens[:3]
    x = autoregressive_generate(pair(), prompts, max_new_tokens=8, seed=3)
    assert x.tokens == autoregressive_generate(pair(), prompts, max_new_tokens=8, seed=3).tokens


# -- statistics -------------------------------------------------------------------------------------

def test_self_drafting_accepts_everything_with_zero_kl():
    """Draft = verifier: p = q exactly, so SpS and Cactus accept every draft and h_alg = q."""
    same = ModelPair(VERIFIER, VERIFIER, None)
    for rule in (ct.SpS(), ct.Cactus(1.0)):
        res = speculative_generate(same, [[1, 2], [3]], rule, k=3, max_new_tokens=9, temperature=0.7,
                                   top_k=5, batch_size=2, seed=0)
        s = res.stats
        assert s.accepted == s.drafted == 3 * s.steps and s.al == 4 and s.acceptance_rate == 1
        # the first token comes from the prompt pass, then 8 more in two calls of k + 1 = 4
        assert s.position_acceptance == 1 and s.verifier_calls == 2 and s.new_tokens == 18
        assert s.kl_count > 0 and abs(s.mean_step_kl) < 1e-6
        assert s.nll > 0 and math.isfinite(s.tokens_per_s)


def test_stats_are_consistent_and_kl_matches_exact():
    rule = ct.Cactus(1.0)
    res = speculative_generate(pair(), [[1, 2], [3, 4, 5]], rule, k=4, max_new_tokens=30, temperature=0.9,
                               top_k=0, batch_size=2, seed=5)
    s = res.stats
    assert s.new_tokens == 60 and s.sequences == 2
    assert s.drafted == 4 * s.steps and 0 <= s.accepted <= s.judged <= s.drafted
    assert s.al == pytest.approx((s.accepted + s.steps) / s.steps) and 1 <= s.al <= 5
    assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
    assert s.kl_count >= s.steps and s.mean_step_kl > 0
    # per-sequence counters add up to the run's
    for name in ("new_tokens", "steps", "accepted", "drafted", "judged", "kl_count", "nll_count"):
        assert sum(getattr(c, name) for c in res.per_sequence) == getattr(s, name), name
    assert [c.new_tokens for c in res.per_sequence] == [30, 30] and all(c.nll_count == 30 for c in res.per_sequence)
    ar = autoregressive_generate(pair(), [[1, 2], [3, 4, 5]], max_new_tokens=30, temperature=0.9, seed=5)
    assert ar.stats.verifier_calls == 29 and ar.stats.new_tokens == 60 and ar.stats.nll > 0


@pytest.mark.parametrize("rule", [ct.SpS(), ct.Cactus(0.7), ct.TAS(), ct.TopK(7), ct.Interpolation(0.4),
                                  ct.EARS(0.3)], ids=repr)
def test_step_kl_on_the_support_equals_the_full_vocabulary(rule):
    rng = np.random.default_rng(0)
    for _ in range(5):
        p, q = rng.dirichlet(np.full(40, 0.5), size=2).astype(np.float32)
        p[rng.random(40) < 0.6] = 0
        q[rng.random(40) < 0.6] = 0
        q[0] = max(q[0], 0.05)
        p[0] = max(p[0], 0.05)
        p, q = p.astype(np.float64), q.astype(np.float64)
        p, q = p / p.sum(), q / q.sum()
        full = float(step_divergence(rule, p, q))
        assert step_kl(rule, p, q) == pytest.approx(full, rel=1e-6, abs=1e-9)


# -- the compact Llama and the feature-level draft --------------------------------------------------

def test_compact_llama_computes_the_hf_function():
    ver = tiny(9, layers=3, scale=2.0)
    m = Llama.from_hf(ver)
    ids = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = ver(input_ids=ids, output_hidden_states=True)
        cache = m.new_cache(3, 32)
        logits, aux = m(ids, torch.zeros(3, dtype=torch.long), cache, aux_layers=(0, 2))
        assert torch.allclose(logits, out.logits, atol=1e-5)
        assert all(torch.allclose(a, out.hidden_states[i], atol=1e-5) for a, i in zip(aux, (0, 2), strict=True))
        # rows at different offsets, a stale speculative block overwritten in place
        cache = m.new_cache(3, 32)
        m(ids[:, :6], torch.zeros(3, dtype=torch.long), cache)
        m(torch.randint(0, V, (3, 4)), torch.full((3,), 6), cache)  # rejected drafts
        step, _ = m(ids[:, 6:10], torch.full((3,), 6), cache)
        assert torch.allclose(step, out.logits[:, 6:10], atol=1e-5)
        last, _ = m(ids[:, 6:10], torch.full((3,), 6), cache, logits_at=torch.tensor([0, 3, 1]))
        assert torch.allclose(last[:, 0], out.logits[[0, 1, 2], [6, 9, 7]], atol=1e-5)


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


@pytest.mark.parametrize("layers", [1, 2])
def test_feature_head_unrolled_steps_equal_sequential_decoding(layers):
    """``unrolled`` (training) computes exactly what the decode loop computes step by step."""
    head = HEAD if layers == 1 else tiny_head(HEAD_VER, seed=3, layers=layers)
    feats = torch.randn(2, 9, 48, generator=torch.Generator().manual_seed(1))
    toks = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = head.fuse([feats])
        outs = head.unrolled(a, toks, 3)
        for b in range(2):
            for j0 in range(9):
                cache = head.new_cache(1, 64)
                g = head.step(a[b:b + 1, :j0 + 1], toks[b:b + 1, :j0 + 1], cache, torch.arange(j0 + 1)[None],
                              j0 + 1)[:, -1:]
                assert torch.allclose(g[0, 0], outs[0][b, j0], atol=1e-5)
                for s in range(2, 4):
                    j = j0 + s - 1
                    if j >= 9:
                        break
                    g = head.step(g, toks[b:b + 1, j:j + 1], cache, torch.tensor([[j]]), j + 1)
                    assert torch.allclose(g[0, 0], outs[s - 1][b, j], atol=1e-4)  # values up to ~20


@pytest.mark.parametrize("compact", [True, False])
def test_feature_draft_sps_gives_the_verifiers_law(compact):
    prompt = [3, 5, 7]
    res = speculative_generate(ModelPair(HEAD, HEAD_VER, None), [prompt] * N, ct.SpS(), k=2, max_new_tokens=3,
                               batch_size=N, seed=6, track_kl=False, compact=compact, **RAW)
    assert_fits(res.tokens, autoregressive_law(cond(HEAD_VER), 3, prompt=tuple(prompt)), 3)
    assert 1 < res.stats.al < 3


@pytest.mark.parametrize("rule", [ct.Cactus(0.5), ct.TAS()], ids=repr)
def test_feature_draft_lossy_rules_follow_the_exact_law(rule):
    prompt = [2, 6]
    res = speculative_generate(ModelPair(HEAD, HEAD_VER, None), [prompt] * N, rule, k=2, max_new_tokens=4,
                               batch_size=N, seed=7, track_kl=False, **RAW)
    law = sequence_law(None, cond(HEAD_VER), rule, 2, 4, prompt=tuple(prompt), verifier_first=True,
                       draft_in_block=head_law())
    assert_fits(res.tokens, law, 4)
    ar = autoregressive_law(cond(HEAD_VER), 4, prompt=tuple(prompt))
    assert goodness_of_fit(counts_of(res.tokens, 4), ar, alpha=ALPHA, kind="counts").reject


def test_head_training_raises_held_out_acceptance():
    """Distillation with the training-time test raises the acceptance at every draft depth."""
    from cactus_theory.lm.train.draft_build import collect_forced, depth_acceptance, train_head

    ver = tiny(13, layers=3, scale=2.0)
    m = Llama.from_hf(ver)
    g = torch.Generator().manual_seed(0)
    seqs = [(torch.randint(0, V, (20,), generator=g).tolist(), 2) for _ in range(48)]
    corpus = collect_forced(m, seqs, 8, (0, 1, 2), progress=False)
    held = collect_forced(m, seqs[:0] + [(torch.randint(0, V, (20,), generator=g).tolist(), 2) for _ in range(12)],
                          8, (0, 1, 2), progress=False)
    head = tiny_head(ver, shortlist=tuple(range(V)))
    cfg = DraftConfig(shortlist=V, epochs=12, batch_tokens=256, lr=1e-2, ttt_steps=2, top_k=0, top_p=1.0,
                      temperature=1.0)
    before = depth_acceptance(head, held, cfg, depths=2)
    losses = train_head(head, corpus, cfg, progress=False)
    after = depth_acceptance(head, held, cfg, depths=2)
    assert losses[-1] < losses[0]
    assert after[0] > before[0] + 0.05 and after[1] > before[1] + 0.05


# -- bad input --------------------------------------------------------------------------------------

def test_bad_input_raises_clear_errors():
    pr = pair()
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        speculative_generate(pr, [[1], []], ct.SpS(), max_new_tokens=8)
    with pytest.raises(ValueError, match="k must be"):
        speculative_generate(pr, [[1]], ct.SpS(), k=0, max_new_tokens=8)
    with pytest.raises(ValueError, match="rule must be one of"):
        speculative_generate(pr, [[1]], "nonsense", max_new_tokens=8)
    with pytest.raises(ValueError, match="context"):
        speculative_generate(pr, [[1] * 60], ct.SpS(), max_new_tokens=10)
    with pytest.raises(ValueError, match="outside"):
        speculative_generate(pr, [[1, V]], ct.SpS(), max_new_tokens=8)
    with pytest.raises(ValueError, match="tokenizer"):
        speculative_generate(pr, ["hello"], ct.SpS(), max_new_tokens=8)
    with pytest.raises(ValueError, match="max_new_tokens"):
        autoregressive_generate(pr, [[1]], max_new_tokens=0)
    with pytest.raises(ValueError, match="vocabularies differ"):
        ModelPair(tiny(3), LlamaForCausalLM(LlamaConfig(vocab_size=V + 1, hidden_size=16, intermediate_size=16,
                                                        num_hidden_layers=1, num_attention_heads=2)), None)


class _Tok:
    def __init__(self, vocab, eos=0):
        self.vocab, self.eos_token_id = vocab, eos

    def get_vocab(self):
        return dict(self.vocab)


def test_tokenizer_mismatch_is_refused():
    check_same_tokenizer(_Tok({"a": 0, "b": 1}), _Tok({"a": 0, "b": 1}))
    with pytest.raises(ValueError, match="tokenizers differ"):
        check_same_tokenizer(_Tok({"a": 0, "b": 1}), _Tok({"a": 1, "b": 0}))
    with pytest.raises(ValueError, match="eos_token_id"):
        check_same_tokenizer(_Tok({"a": 0}, eos=0), _Tok({"a": 0}, eos=1))


def test_run_benchmark_on_the_tiny_pair():
    from cactus_theory.lm.experiments.experiment import format_table, run_benchmark, targets

    rules = [("SpS", ct.SpS()), ("Cactus d=1.0", ct.Cactus(1.0))]
    res = run_benchmark(pair(), [[1, 2], [3], [4, 5]], rules=rules, ks=(1, 4), batch_sizes=(1, 2),
                        max_new_tokens=6, progress=False)
    rows = res["rows"]
    assert [(r["rule"], r["k"], r["batch_size"]) for r in rows] == [
        (n, k, b) for b in (1, 2) for k in (1, 4) for n in ("SpS", "Cactus d=1.0")]
    assert set(res["baselines"]) == {"1", "2"} and all(len(b["runs"]) == 2 for b in res["baselines"].values())
    for r in rows:
        ref = res["baselines"][str(r["batch_size"])]["tokens_per_s"]
        assert r["speedup"] == pytest.approx(r["tokens_per_s"] / ref)
        assert r["new_tokens"] == 18 and 1 <= r["al"] <= r["k"] + 1
        lo, hi = r["al_ci"]
        assert lo <= r["al"] <= hi
        assert ("speedup_ci" in r) == (r["batch_size"] == 1)
        assert sum(c["new_tokens"] for c in r["per_sequence"]) == 18
    assert all(r["al_vs_sps"] == 1 for r in rows if r["rule"] == "SpS")

    def pooled_al(seq):  # tokens per verifier call from the per-prompt counters, bonus included
        steps = sum(c["steps"] for c in seq)
        return (sum(c["accepted"] for c in seq) + steps) / steps

    for r in rows:
        if r["rule"] != "SpS":
            sps = next(x for x in rows if x["rule"] == "SpS" and (x["k"], x["batch_size"]) == (r["k"], r["batch_size"]))
            assert r["al_vs_sps"] == pytest.approx(pooled_al(r["per_sequence"]) / pooled_al(sps["per_sequence"]))
            lo, hi = r["al_vs_sps_ci"]
            assert lo <= r["al_vs_sps"] <= hi
    assert "Cactus d=1.0" in format_table(res)
    assert all(len(t) == 5 for t in targets(res))
    names = [t[0] for t in targets(res)]
    assert "SpS AL" in names and "Cactus d=1 AL / SpS AL" in names


def test_draft_config_and_cache_location(monkeypatch, tmp_path):
    from cactus_theory.lm.draft import MissingDraftError, cache_dir, draft_path, load_draft
    from cactus_theory.lm.pair import load_pair

    with pytest.raises(ValueError, match="shortlist"):
        DraftConfig(shortlist=0)
    with pytest.raises(ValueError, match="loss"):
        DraftConfig(loss="mse")
    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path))
    assert cache_dir() == str(tmp_path)
    a, b = draft_path(DraftConfig()), draft_path(DraftConfig(seed=1))
    assert a != b and a.startswith(str(tmp_path)) and b.startswith(str(tmp_path))
    with pytest.raises(MissingDraftError, match="build-draft"):
        load_draft(VERIFIER, DraftConfig())
    # a library call never builds the draft, and says so before loading any model
    import time

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="cactus-theory build-draft"):
        load_pair("embedded")
    assert time.perf_counter() - t0 < 1.0


def test_training_prompts_are_seeded_and_disjoint_from_the_evaluation_set():
    from cactus_theory.lm.data import prompt_set, training_prompts

    a = training_prompts(30, seed=0)
    assert a == training_prompts(30, seed=0) and a != training_prompts(30, seed=1)
    assert len(a) == 30 and not set(a) & set(prompt_set())
    with pytest.raises(ValueError, match="per_style"):
        prompt_set(0)


def test_eagle3_export_computes_the_same_head(tmp_path):
    """The exported EAGLE-3 folder, read back and run by an independent forward written the way
    vLLM's ``Eagle3LlamaForCausalLM`` computes (separate q/k/v, norms named as there, d2t offsets),
    gives the head's own logits."""
    from safetensors.torch import load_file

    from cactus_theory.lm.draft import export_eagle3

    folder = export_eagle3(HEAD, str(tmp_path / "eagle3"), dtype=torch.float32)
    w = load_file(f"{folder}/model.safetensors")
    import json

    cfg = json.loads((tmp_path / "eagle3" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 8 and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    a = HEAD.args
    emb = HEAD_VER.get_input_embeddings().weight

    def rms(x, g):
        return g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a.norm_eps)

    def vllm_like(aux, ids):  # one sequence, entries 0..T-1, causal attention among them
        T = ids.shape[0]
        h = aux @ w["fc.weight"].T
        e = rms(emb[ids], w["midlayer.input_layernorm.weight"])
        x = torch.cat([e, rms(h, w["midlayer.hidden_norm.weight"])], -1)
        q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(T, a.n_heads, a.head_dim).transpose(0, 1)
        k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(T, a.n_kv_heads, a.head_dim).transpose(0, 1)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(T, a.n_kv_heads, a.head_dim).transpose(0, 1)
        inv = 1.0 / a.rope_theta ** (torch.arange(0, a.head_dim, 2).float() / a.head_dim)
        ang = torch.arange(T).float()[:, None] * inv[None]
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        half = a.head_dim // 2
        rot = lambda t: t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin  # noqa: E731
        q, k = rot(q), rot(k)
        rep = a.n_heads // a.n_kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        att = (q @ k.transpose(-1, -2)) / a.head_dim ** 0.5
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), -math.inf).softmax(-1)
        o = (att @ v).transpose(0, 1).reshape(T, -1) @ w["midlayer.self_attn.o_proj.weight"].T
        resid = o + h
        y = rms(resid, w["midlayer.post_attention_layernorm.weight"])
        y = (torch.nn.functional.silu(y @ w["midlayer.mlp.gate_proj.weight"].T) * (y @ w["midlayer.mlp.up_proj.weight"].T)
             ) @ w["midlayer.mlp.down_proj.weight"].T
        logits_s = rms(y + resid, w["norm.weight"]) @ w["lm_head.weight"].T
        full = torch.full((T, a.vocab), -math.inf)
        full[:, torch.arange(a.shortlist) + w["d2t"]] = logits_s
        return full

    aux = torch.randn(6, 48, generator=torch.Generator().manual_seed(3))
    ids = torch.randint(0, V, (6,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cache = HEAD.new_cache(1, 16)
        g = HEAD.step(HEAD.fuse([aux[None]]), ids[None], cache, torch.arange(6)[None], 6)
        ours = HEAD.full_logits(g[0])
        theirs = vllm_like(aux, ids)
    fin = torch.isfinite(ours)
    assert torch.equal(fin, torch.isfinite(theirs)) and int(fin[0].sum()) == 8
    assert torch.allclose(ours[fin], theirs[fin], atol=1e-4)
    assert w["t2d"].sum() == 8 and w["t2d"].dtype == torch.bool


@pytest.mark.parametrize("feature", [True, False])
def test_first_step_laws_are_the_block_start_laws(feature):
    """Teacher-forced (p, q) rows equal the draft's first-step law and the verifier's law at each
    position (independent references: ``head_law`` / a full draft forward, and ``cond``)."""
    from cactus_theory.lm.loop import first_step_laws

    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    pr = ModelPair(HEAD, HEAD_VER, None) if feature else pair()
    ver = HEAD_VER if feature else VERIFIER
    P, Q = first_step_laws(pr, ids, 2, 7, **RAW)
    assert P.shape == Q.shape == (5, V)
    for r, i in enumerate(range(2, 7)):
        np.testing.assert_allclose(Q[r], cond(ver)(tuple(ids[:i + 1])), atol=1e-5)
        ref = head_law()(tuple(ids[:i + 1]), ()) if feature else cond(DRAFT)(tuple(ids[:i + 1]))
        np.testing.assert_allclose(P[r], ref, atol=1e-5)
    with pytest.raises(ValueError, match="lo"):
        first_step_laws(pr, ids, 5, 3)


@pytest.mark.parametrize("top_k,top_p", [(20, 0.95), (5, 1.0), (0, 0.9), (0, 1.0)])
def test_truncated_law_is_the_sampling_law(top_k, top_p):
    from cactus_theory.lm.train.draft_build import truncated_law

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    cfg = DraftConfig(temperature=0.6, top_k=top_k, top_p=top_p)
    vals, rows = truncated_law(logits, cfg)
    full = torch.zeros(6, 50).scatter(-1, rows, vals)
    assert torch.allclose(full, sampling_probs(logits, 0.6, top_k, top_p), atol=1e-6)


def test_feature_draft_ragged_batch_and_eos_keep_each_rows_law():
    """Rows of different prompt lengths, finishing at different steps (EOS), share one batch: each
    row's first tokens follow its own exact law (the head's caches and pending entries per row)."""
    prompts = [[6], [3, 5, 7, 1, 2], [2, 9]]
    batch = [prompts[i % 3] for i in range(3 * 2500)]
    rule = ct.Cactus(0.5)
    res = speculative_generate(ModelPair(HEAD, HEAD_VER, None, eos_token_id=EOS), batch, rule, k=2,
                               max_new_tokens=3, batch_size=len(batch), seed=8, track_kl=False, **RAW)
    assert sum(len(t) < 3 for t in res.tokens) > 100  # EOS ends some rows early

    ver, head = cond(HEAD_VER), head_law()

    def absorbing_verifier(n_prompt):  # after EOS the padded output repeats EOS
        return lambda c: np.eye(V)[EOS] if EOS in c[n_prompt:] else ver(c)

    def absorbing_draft(n_prompt):
        return lambda c, d: np.eye(V)[EOS] if EOS in (tuple(c) + tuple(d))[n_prompt:] else head(c, d)

    for j, pr in enumerate(prompts):
        law = sequence_law(None, absorbing_verifier(len(pr)), rule, 2, 3, prompt=tuple(pr), verifier_first=True,
                           draft_in_block=absorbing_draft(len(pr)))
        assert_fits(res.tokens[j::3], law, 3, pad=EOS)
