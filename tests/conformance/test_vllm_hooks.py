"""Conformance, vLLM: the plugin's Model Runner V1 hook (``integrations.vllm.rejection_sample``, reached
through the stand-in ``RejectionSampler.forward`` that ``register`` patches) and its Model Runner V2 hook
(``rejection_sample_v2``, reached through the stand-in V2 runner and ``RejectionSampler`` of
tests/integrations/test_vllm_v2.py, the rule given as a registry spec string in ``additional_config``),
every registry rule, token for token against the reference walk.

Cases: ragged batches with zero-draft requests, padded / placeholder drafts, greedy (temperature 0) and
sampling requests interleaved, per-request temperatures; V1: seeded and unseeded sampling requests
(``sampling_metadata.generators``; unseeded ones judged on the support of their law), one-hot or given
draft laws; V2: non-identity ``idx_mapping`` (requests mapped to scattered request states, more states
than requests), draft logits wider than the target's vocabulary, optional top-k. A rule that draws its own
bonus token or reads the LM head is refused by its declared capability (asserted)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory import registry
from cactus_theory.integrations import vllm as plugin
from cactus_theory.sampler import PLACEHOLDER_TOKEN_ID
from tests.conformance.harness import (
    RULE_KEYS,
    Judge,
    Tally,
    chain,
    chain_support,
    configurations,
    draft_token,
    family,
    float_params,
    log_row,
    one_hot,
    pad_block,
    pair,
    profile,
    refusal,
    softmax64,
    tolerance,
    vocab_sizes,
)
from tests.integrations.test_vllm_v2 import FakeSampler, install_fake_vllm, spec_config, standin

SPS = registry.make("sps")


@pytest.fixture(scope="module")
def vllm():
    """The stand-in vLLM (V2's runner and sampler modules, V1's sampler module) with the plugin registered."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(plugin.ENV_VAR, raising=False)
        plugin._originals.clear()
        plugin._v2_state.clear()
        rs2, mr2 = standin()
        install_fake_vllm(mp, rs2, mr2)
        plugin.register()
        try:
            yield SimpleNamespace(rs2=rs2, mr2=mr2, v1=sys.modules["vllm.v1.sample.rejection_sampler"])
        finally:
            plugin.unregister()


def spec_string(rule) -> str:
    """The rule as ``additional_config`` carries it: ``key:name=value,...`` from the registry's parameters (an
    optional parameter left unset, ``None`` such as SpS's ``rand_bits``, is left out, as a user leaves it out)."""
    s = registry.spec(rule)
    return s.key + ":" + ",".join(f"{p.name}={getattr(rule, p.name)!r}" if p.type is not str
                                  else f"{p.name}={getattr(rule, p.name)}" for p in s.params
                                  if getattr(rule, p.name) is not None)


def greedy_block(ns, logits_rows, bonus):
    """vLLM's greedy semantics: accept while the draft is the argmax of its row, else emit that argmax."""
    out = []
    for j, n in enumerate(ns):
        top = int(np.argmax(logits_rows[j]))
        if int(n) != top:
            return out + [top]
        out.append(top)
    return out + [int(bonus)]


# -- Model Runner V1 ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", RULE_KEYS)
def test_vllm_v1_hook(vllm, key):
    configs = configurations(key)
    why = refusal("vllm_v1", configs[0])
    if why is not None:
        md = SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(1), generators={})
        args = (torch.tensor([1], dtype=torch.int32), [1], 1, torch.tensor([1], dtype=torch.int32), None,
                torch.zeros(1, 4), torch.zeros(1, 1, dtype=torch.long), md)
        with pytest.raises(ValueError, match=why):
            plugin.rejection_sample(*args, rule=configs[0])
        return

    tally = Tally()

    @profile(6)
    @given(data=st.data())
    def run(data):
        rule = configs[data.draw(st.integers(0, len(configs) - 1), label="config")]
        V = data.draw(st.sampled_from(vocab_sizes(rule)), label="V")
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
        onehot_drafts = data.draw(st.booleans(), label="one-hot drafts")
        B = 3 if V > 64 else int(rng.integers(1, 14))
        counts = [int(c) for c in rng.integers(0, 5, size=B)]
        greedy = rng.random(B) < 0.35
        if greedy.all():
            greedy[int(rng.integers(B))] = False  # vLLM's own function serves an all-greedy batch
        T, K = sum(counts), max(counts)
        P, Q = np.zeros((T, V)), np.zeros((T, V))
        ids = np.zeros(T, dtype=np.int64)
        for t in range(T):
            P[t], Q[t] = pair(rng, V, family(rng, V), float_params(rule, torch.float32))
            ids[t] = draft_token(rng, Q[t] if onehot_drafts else P[t])
            if rng.random() < 0.08:
                ids[t] = -1
        logits = torch.from_numpy(log_row(Q)).float()
        draft_probs = None if onehot_drafts else torch.from_numpy(P).float()
        P64 = one_hot(V, np.maximum(ids, 0)) if onehot_drafts else draft_probs.double().numpy()
        Q64 = softmax64(logits.double().numpy())
        Q32 = logits.softmax(-1, dtype=torch.float32).double().numpy()  # the hook's row (harness.chain: Q32)
        bonus = rng.integers(0, V, size=B)
        seeded = [b for b in range(B) if not greedy[b] and rng.random() < 0.7]
        seeds = {b: int(rng.integers(2**62)) for b in seeded}
        md = SimpleNamespace(all_greedy=False, all_random=not greedy.any(),
                             temperature=torch.tensor([0.0 if g else float(rng.choice([0.6, 1.0, 1.3])) for g in greedy]),
                             generators={b: torch.Generator().manual_seed(s) for b, s in seeds.items()})
        sampler = vllm.v1.RejectionSampler()
        sampler.cactus_theory_rule = rule
        out = sampler.forward(torch.from_numpy(ids).int(), counts, K, torch.tensor(np.cumsum(counts)).int(),
                              draft_probs, logits, torch.from_numpy(bonus).reshape(-1, 1), md).numpy()
        assert out.shape == (B, K + 1)
        judge = tally.judge(tolerance(torch.float32))
        s = 0
        for b, c in enumerate(counts):
            sl = slice(s, s + c)
            s += c
            got = [int(x) for x in out[b] if x != PLACEHOLDER_TOKEN_ID]
            if greedy[b]:
                assert got == greedy_block(ids[sl], logits[sl].numpy(), bonus[b]), (b, got)
            elif b in seeds and c > 0:
                us = torch.rand(c + 1, generator=torch.Generator().manual_seed(seeds[b]), dtype=torch.float64).numpy()
                want = chain(lambda j: rule, ids[sl], P64[sl], Q64[sl], us, us[c], judge, bonus=bonus[b], Q32=Q32[sl])
                judge.done(want)
                if want is not None:
                    assert out[b].tolist() == pad_block(want, K + 1), (b, rule, out[b].tolist(), want)
            else:
                bad = chain_support(lambda j: rule, ids[sl], P64[sl], Q64[sl], got, judge.tol, bonus=bonus[b],
                                    Q32=Q32[sl])
                assert bad is None, (b, rule, bad)

    run()
    tally.check()


# -- Model Runner V2 ---------------------------------------------------------------------------------------

def v2_inputs(rng, rule, V: int, K: int):
    """A V2 batch: ``R`` requests (0..K drafts each) mapped to scattered request states among ``S > R``,
    per-state temperatures (some 0: greedy) and seeds, target logits, draft logits (or None: one-hot
    drafts, ids drawn from q) wider than V, placeholder drafts."""
    R = int(rng.integers(1, 3 if V > 64 else 10))
    S = R + int(rng.integers(1, 4))
    idx = rng.permutation(S)[:R]
    if R > 1 and (idx == np.arange(R)).all():
        idx = idx[::-1].copy()
    temps = [0.0 if rng.random() < 0.3 else float(rng.choice([0.5, 0.8, 1.0, 1.4])) for _ in range(S)]
    seeds = [int(x) for x in rng.integers(0, 2**40, size=S)]
    onehot_drafts = rng.random() < 0.4
    Vd = V + int(rng.integers(0, 3))
    draft_logits = None if onehot_drafts else torch.from_numpy(rng.normal(size=(S, K, Vd)) * 1.5).float()
    counts = [int(c) for c in rng.integers(0, K + 1, size=R)]
    rows, ids, positions, local, states, cu = [], [], [], [], [], [0]
    for b, c in enumerate(counts):
        start = 10 + 100 * b + int(rng.integers(0, 50))
        q_rows = [pair(rng, V, family(rng, V), float_params(rule, torch.float32))[1] for _ in range(c + 1)]
        rows += q_rows
        drafts = [draft_token(rng, q_rows[j]) if onehot_drafts else int(rng.integers(V)) for j in range(c)]
        ids += [1] + drafts
        positions += [start + j for j in range(c + 1)]
        local += list(range(c + 1))
        states += [int(idx[b])] * (c + 1)
        cu.append(cu[-1] + c + 1)
    n = cu[-1]
    seq_lens = torch.tensor([positions[cu[b + 1] - 1] + 1 for b in range(R)], dtype=torch.int32)
    batch = SimpleNamespace(
        input_ids=torch.tensor(ids, dtype=torch.int32), positions=torch.tensor(positions, dtype=torch.int64),
        logits_indices=torch.arange(n), expanded_idx_mapping=torch.tensor(states, dtype=torch.int32),
        expanded_local_pos=torch.tensor(local, dtype=torch.int32), idx_mapping=torch.tensor(idx, dtype=torch.int32),
        idx_mapping_np=np.asarray(idx), cu_num_logits=torch.tensor(cu, dtype=torch.int32),
        cu_num_logits_np=np.array(cu), num_reqs=R, seq_lens=seq_lens, seq_lens_cpu_upper_bound=seq_lens.clone(),
        num_draft_tokens=n - R)
    invalid = torch.zeros(n, dtype=torch.bool)
    for b, c in enumerate(counts):
        for j in range(c):
            if rng.random() < 0.08:
                invalid[cu[b] + j + 1] = True
    logits = torch.from_numpy(log_row(np.stack(rows))).float()
    top_k = None if rng.random() < 0.6 else int(rng.integers(1, V + 1))
    sampler = FakeSampler(temps, seeds, top_k=top_k)
    return SimpleNamespace(R=R, idx=idx, temps=temps, seeds=seeds, counts=counts, cu=cu, batch=batch, logits=logits,
                           draft_logits=draft_logits, invalid=invalid, sampler=sampler, ids=ids, positions=positions)


def v2_expected(x, rule, V: int, K: int, judge: Judge):
    """Each request's tokens by V2's documented contract: its generator seeded by (its state's seed, its first
    row's position); one uniform for the bonus token (greedy: the argmax), then ``n_b + 1`` for the chain."""
    b_ = x.batch
    z = x.sampler.apply_sampling_params(x.logits, b_.expanded_idx_mapping, b_.idx_mapping, b_.idx_mapping_np,
                                        b_.positions, b_.input_ids, b_.expanded_local_pos, None).double().numpy()
    out = []
    for b, c in enumerate(x.counts):
        lo = x.cu[b]
        s = int(x.idx[b])
        t = x.temps[s]
        rows = z[lo:lo + c + 1]
        ids = [-1 if bool(x.invalid[lo + j + 1]) else int(x.ids[lo + j + 1]) for j in range(c)]
        if t == 0:
            out.append(greedy_block(ids, rows[:c], int(np.argmax(rows[c]))))
            continue
        g = torch.Generator().manual_seed(plugin._request_seed(x.seeds[s], x.positions[lo]))
        q = softmax64(rows)
        y = judge.draw(q[c], float(torch.rand(1, generator=g, dtype=torch.float64)))
        if y is None:
            out.append(None)
            continue
        if x.draft_logits is None:
            P = one_hot(V, np.maximum(ids, 0)) if c else np.zeros((0, V))
        else:
            P = softmax64(x.draft_logits[s, :c, :V].double().numpy() / t)
        us = torch.rand(c + 1, generator=g, dtype=torch.float64).numpy() if c else np.zeros(1)
        out.append(chain(lambda j: rule, ids, P, q[:c], us, us[c], judge, bonus=y))
    return out


@pytest.mark.parametrize("key", RULE_KEYS)
def test_vllm_v2_hook(vllm, key):
    configs = configurations(key)
    why = refusal("vllm_v2", configs[0])
    if why is not None:  # refused at engine start (load_model) and by the entry point itself
        with pytest.raises(ValueError, match=why):
            r = vllm.mr2.GPUModelRunner(SimpleNamespace(speculative_config=spec_config(), sampler=FakeSampler([1.0], [0]),
                                                        additional_config={"cactus_theory": spec_string(configs[0])}),
                                        torch.device("cpu"))
            r.load_model()
        x = v2_inputs(np.random.default_rng(0), configs[0], 4, 2)
        with pytest.raises(ValueError, match=why):
            plugin.rejection_sample_v2(x.logits, None, x.batch.input_ids.long(), x.batch.cu_num_logits,
                                       x.batch.positions, x.batch.idx_mapping, x.batch.expanded_idx_mapping,
                                       x.batch.expanded_local_pos, torch.tensor(x.temps).clamp_min(1.0),
                                       torch.tensor(x.seeds), 2,
                                       rule=configs[0])
        return

    tally = Tally()

    @profile(6)
    @given(data=st.data())
    def run(data):
        rule = configs[data.draw(st.integers(0, len(configs) - 1), label="config")]
        V = data.draw(st.sampled_from(vocab_sizes(rule)), label="V")
        K = data.draw(st.integers(1, 4), label="K")
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
        x = v2_inputs(rng, rule, V, K)
        cfg = SimpleNamespace(speculative_config=spec_config(k=K), sampler=x.sampler,
                              additional_config={"cactus_theory": spec_string(rule)})
        runner = vllm.mr2.GPUModelRunner(cfg, torch.device("cpu"))
        runner.load_model()
        assert runner.rejection_sampler.cactus_theory_rule == rule  # the spec string resolves to the rule itself
        res = runner.rejection_sampler(x.logits, x.batch, x.draft_logits, x.invalid)
        judge = tally.judge(tolerance(torch.float32))
        want = v2_expected(x, rule, V, K, judge)
        for b in range(x.R):
            judge.done(want[b])
            if want[b] is None:
                continue
            assert res.sampled_token_ids[b].tolist() == pad_block(want[b], K + 1), \
                (b, rule, x.idx.tolist(), x.counts, res.sampled_token_ids[b].tolist(), want[b])
            assert int(res.num_sampled[b]) == len(want[b])
        judge.check_coverage(0.4)

    run()
    tally.check()


def test_vllm_v1_greedy_request_ignores_the_draft_law(vllm):
    """A greedy request accepts a draft equal to the target's argmax whatever probability the draft's law gave
    it (vLLM's argmax matching), here 0: the case the deep profile (CONFORMANCE_EXAMPLES=15) drew, where the
    hook verified greedy requests as SpS against the draft's own law and rejected it."""
    V = 3
    logits = torch.tensor([[0.0, 2.0, -1.0], [1.0, 0.0, 3.0]])
    draft_probs = torch.tensor([[0.5, 0.0, 0.5], [0.2, 0.3, 0.5]])  # the first draft (1, the argmax) has p = 0
    md = SimpleNamespace(all_greedy=False, all_random=False, temperature=torch.tensor([0.0, 1.0]), generators={})
    sampler = vllm.v1.RejectionSampler()
    sampler.cactus_theory_rule = registry.make("cactus", delta=0.5)
    out = sampler.forward(torch.tensor([1, 2], dtype=torch.int32), [1, 1], 1, torch.tensor([1, 2], dtype=torch.int32),
                          draft_probs, logits, torch.tensor([[0], [0]]), md)
    assert out[0].tolist() == [1, 0] and V == logits.shape[1]  # accepted, then the caller's bonus
