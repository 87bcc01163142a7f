"""The decode loop (``lm.loop``) on a tiny random draft / verifier pair (no download): the exact law of
the first generated tokens, batching with ragged prompts, EOS, determinism, its statistics, bad input and
the teacher-forced first-step laws. Statistical tests: see ``tests/lm/common.py`` (chi-square at
ALPHA = 1e-3, N = 20000, power asserted)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import cactus_theory as ct
from cactus_theory.core.draft_stop import DraftStop
from cactus_theory.lm import ModelPair, autoregressive_generate, speculative_generate
from cactus_theory.stats import goodness_of_fit
from cactus_theory.toy import autoregressive_law, sequence_law
from tests.lm.common import (
    ALPHA,
    DRAFT,
    EOS,
    HEAD,
    HEAD_VER,
    RAW,
    VERIFIER,
    N,
    V,
    assert_fits,
    cond,
    counts_of,
    head_law,
    pair,
    tiny,
)

pytestmark = pytest.mark.usefixtures("one_thread")


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


@pytest.mark.parametrize("rule,k,T,compact", [(ct.Cactus(1.0), 1, 3, True),
                                              pytest.param(ct.Cactus(0.5), 2, 4, True, marks=pytest.mark.slow),
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


@pytest.mark.parametrize("method", ["speculative", "tree", "autoregressive"])
def test_per_row_seeds_make_each_row_independent_of_its_batch(method):
    """``seeds=`` (one per prompt): a row's tokens depend on its own seed and prompt only, not on the batch
    size, the other rows or their order (float64 compact models, so batching cannot round differently);
    the same seeds reproduce, another seed changes the row."""
    from cactus_theory.core.tree import DynamicTree

    prompts = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 1]]
    seeds = [101, 7, 2**40 + 3, 55]
    kw = dict(max_new_tokens=9, temperature=0.9, top_k=0, top_p=0.95)
    p64 = ModelPair(ct.lm.llama.Llama.from_hf(DRAFT, dtype=torch.float64),
                    ct.lm.llama.Llama.from_hf(VERIFIER, dtype=torch.float64), None, eos_token_id=EOS)

    def run(ps, ss, bs):
        if method == "speculative":
            return speculative_generate(p64, ps, ct.Cactus(0.5), k=3, batch_size=bs, seeds=ss, **kw).tokens
        if method == "tree":
            return ct.lm.tree_generate(p64, ps, ct.SpS(), DynamicTree(2, 2, 2), scheme="iid", batch_size=bs,
                                       seeds=ss, **kw).tokens
        return autoregressive_generate(p64, ps, batch_size=bs, seeds=ss, **kw).tokens

    whole = run(prompts, seeds, 4)
    assert run(prompts, seeds, 4) == whole  # reproducible
    order = [2, 0, 3, 1]
    shuffled = run([prompts[i] for i in order], [seeds[i] for i in order], 3)  # other order, other batches
    assert [shuffled[order.index(i)] for i in range(4)] == whole
    assert [run([prompts[i]], [seeds[i]], 1)[0] for i in range(4)] == whole  # each row alone
    assert run(prompts, [s + 1 for s in seeds], 4) != whole


def test_per_row_seeds_keep_the_law():
    """Every row on its own generator (distinct seeds) still emits the exact sequence law (ragged prompts
    interleaved in one batch)."""
    prompts = [[6], [3, 5, 7, 1, 2]]
    batch = [prompts[i % 2] for i in range(2 * 2500)]
    rule = ct.Cactus(0.5)
    res = speculative_generate(pair(), batch, rule, k=2, max_new_tokens=3, batch_size=len(batch),
                               seeds=list(range(len(batch))), track_kl=False, **RAW)
    for j, pr in enumerate(prompts):
        law = sequence_law(cond(DRAFT), cond(VERIFIER), rule, 2, 3, prompt=tuple(pr), verifier_first=True)
        assert_fits(res.tokens[j::2], law, 3)


def test_seeds_are_checked_before_decoding():
    for bad in ([1, 2], "12", [1, -1, 2], [1, 2.5, 3], [True, 1, 2]):
        with pytest.raises(ValueError, match="seeds"):
            speculative_generate(pair(), [[1], [2], [3]], ct.SpS(), max_new_tokens=4, seeds=bad)


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


def test_phase_timer_keeps_the_metric_time_out_of_the_decode_time(monkeypatch):
    """``PhaseTimer`` adds each phase's seconds to its ``DecodeStats`` field (an unknown phase is refused); the
    metric phase (here made slow: each step KL sleeps) is counted in ``metric_seconds`` and left out of
    ``stats.seconds`` and of each sequence's share."""
    from cactus_theory.lm import loop
    from cactus_theory.lm.metrics import DecodeStats

    timer = loop.PhaseTimer(DecodeStats("x"))
    with timer.phase("verify"):
        time.sleep(0.002)
    assert timer.stats.verify_seconds >= 0.002 and timer.stats.draft_seconds == 0
    with pytest.raises(ValueError, match="phase"):
        with timer.phase("bookkeeping"):
            pass
    real = loop.step_kl

    def slow(*args):
        time.sleep(0.02)
        return real(*args)

    monkeypatch.setattr(loop, "step_kl", slow)
    t0 = time.perf_counter()
    res = speculative_generate(pair(), [[1, 2], [3, 4, 5], [6]], ct.Cactus(1.0), k=2, max_new_tokens=8,
                               batch_size=2, seed=5)
    wall = time.perf_counter() - t0
    s = res.stats
    assert s.metric_seconds >= 0.02 * s.kl_count > 0
    assert min(s.draft_seconds, s.verifier_seconds, s.verify_seconds) > 0
    assert s.seconds + s.metric_seconds <= wall  # the sleeps are not in seconds (they are most of the wall time)
    assert sum(c.seconds for c in res.per_sequence) <= s.seconds + 1e-9


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


# -- adaptive draft length (core.draft_stop.DraftStop, issue 30 item 3) ------------------------------------------

@pytest.mark.parametrize("stop,feature,compact", [(DraftStop(0.5), False, True), (DraftStop(0.3, "path"), False, True),
                                                  (DraftStop(0.5), False, False), (DraftStop(0.45), True, True)],
                         ids=["top", "path", "top-hf", "top-head"])
def test_adaptive_sps_gives_the_verifiers_own_law(stop, feature, compact):
    """SpS with each row stopping its block by the draft's signal (ragged blocks, ``verify(..., lengths=)``)
    still emits the verifier's own law: the loop's first 3 tokens (the first from the prompt pass, then
    blocks) against ``autoregressive_law``; the token draft and the feature head."""
    prompt = [3, 5, 7]
    pr, ver = (ModelPair(HEAD, HEAD_VER, None), HEAD_VER) if feature else (pair(), VERIFIER)
    res = speculative_generate(pr, [prompt] * N, ct.SpS(), k=3, max_new_tokens=3, batch_size=N, seed=1,
                               track_kl=False, compact=compact, draft_stop=stop, **RAW)
    assert_fits(res.tokens, autoregressive_law(cond(ver), 3, prompt=tuple(prompt)), 3)
    s = res.stats
    assert s.steps < s.drafted < 3 * s.steps  # the policy stopped some blocks early, not all
    assert 0 <= s.accepted <= s.judged <= s.drafted and s.draft_calls <= 3 * s.verifier_calls


@pytest.mark.parametrize("rule,stop", [(ct.Cactus(0.5), DraftStop(0.5)), (ct.Cactus(1.0), DraftStop(0.3, "path"))],
                         ids=["cactus-top", "cactus-path"])
def test_adaptive_lossy_rule_follows_its_exact_law(rule, stop):
    """A lossy rule with stopping follows ``sequence_law(..., draft_stop=)`` (the toy programme with the same
    policy on the models' exact laws), which the test can tell from the verifier's own law."""
    prompt = [1, 8]
    res = speculative_generate(pair(), [prompt] * N, rule, k=3, max_new_tokens=3, batch_size=N, seed=2,
                               track_kl=False, draft_stop=stop, **RAW)
    law = sequence_law(cond(DRAFT), cond(VERIFIER), rule, 3, 3, prompt=tuple(prompt), verifier_first=True,
                       draft_stop=stop)
    assert_fits(res.tokens, law, 3)
    ar = autoregressive_law(cond(VERIFIER), 3, prompt=tuple(prompt))
    assert goodness_of_fit(counts_of(res.tokens, T=3), ar, alpha=ALPHA, kind="counts").reject


def test_adaptive_rows_are_independent_of_their_batch():
    """Per-row seeds with stopping: a row that stops early draws nothing more from its generator in that block,
    so each row's tokens are those it emits alone; counters add up, each block drafting 1..k."""
    prompts = [[6], [3, 5, 7, 1, 2], [2, 9], [0, 1, 2, 3]]
    seeds = [101, 7, 55, 9]
    kw = dict(k=3, max_new_tokens=12, seeds=seeds, draft_stop=DraftStop(0.5), temperature=0.9, top_k=0)
    whole = speculative_generate(pair(), prompts, ct.Cactus(0.5), batch_size=4, **kw)
    for i in range(4):
        alone = speculative_generate(pair(), [prompts[i]], ct.Cactus(0.5), batch_size=1,
                                     **{**kw, "seeds": [seeds[i]]})
        assert alone.tokens[0] == whole.tokens[i]
    s = whole.stats
    assert s.steps <= s.drafted < 3 * s.steps and s.judged <= s.drafted
    for name in ("steps", "accepted", "drafted", "judged"):
        assert sum(getattr(c, name) for c in whole.per_sequence) == getattr(s, name), name
    # greedy: the top probability is 1, so the policy never stops and the decode is the fixed-k one
    greedy = dict(k=3, max_new_tokens=10, temperature=0.0, batch_size=4)
    assert (speculative_generate(pair(), prompts, ct.SpS(), draft_stop=0.9, **greedy).tokens
            == speculative_generate(pair(), prompts, ct.SpS(), **greedy).tokens)


def test_draft_stop_is_checked():
    for bad in (0, 1, 1.5, "0.3", True):
        with pytest.raises(ValueError, match="draft_stop"):
            speculative_generate(pair(), [[1]], ct.SpS(), max_new_tokens=4, draft_stop=bad)


def test_decode_command_runs_an_adaptive_draft_length(monkeypatch, tmp_path, capsys):
    """``cactus-theory decode --draft-stop-prob``: the chain with the policy, labelled, its counters in the JSON."""
    import json

    from cactus_theory import cli
    from cactus_theory.cli import lm as cli_lm

    class Chars:  # a tokenizer of the tiny vocabulary
        eos_token_id = None

        def __call__(self, text):
            return {"input_ids": [ord(c) % V for c in text]}

        def decode(self, ids, skip_special_tokens=True):
            return "".join(str(i) for i in ids)

    monkeypatch.setattr(cli_lm, "_load", lambda args: ModelPair(DRAFT, VERIFIER, Chars(), name="tiny"))
    out = tmp_path / "stats.json"
    rc = cli.main(["decode", "--draft", "smollm2", "--rule", "sps", "-k", "4", "--draft-stop-prob", "path:0.2",
                   "--no-chat", "--prompt", "abc", "--prompt", "hello", "--max-new-tokens", "12", "--no-warmup",
                   "--json", str(out)])
    assert rc == 0
    cap = capsys.readouterr()
    assert "k=4 (adaptive, path>=0.2)" in cap.out and "Traceback" not in cap.err
    s = json.loads(out.read_text())["speculative"]
    assert s["new_tokens"] == 24 and s["steps"] <= s["drafted"] <= 4 * s["steps"]


def test_no_loop_function_takes_more_than_six_positional_parameters():
    """The loop's state travels in named objects (``DecodeContext``): every function of ``lm/loop.py``, the public
    entry points included, takes at most six positional parameters (the rest keyword-only)."""
    import ast
    from pathlib import Path

    import cactus_theory.lm.loop as loop_module

    tree = ast.parse(Path(loop_module.__file__).read_text(encoding="utf-8"))
    def positional(f) -> int:
        names = [a.arg for a in f.args.posonlyargs + f.args.args]
        return len(names) - (names[:1] == ["self"])

    wide = [(f.name, positional(f)) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and positional(f) > 6]
    assert not wide, wide
    with pytest.raises(TypeError):
        speculative_generate(pair(), [[1]], ct.SpS(), 2, 4, 0.7)  # sampling is keyword-only
