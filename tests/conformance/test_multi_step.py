"""Multi-step contracts of per-request randomness: a request decoded over several steps with its own
generator (``verify_flat``'s ``{request: Generator}``, vLLM V1's ``sampling_metadata.generators``) or its
own seed (vLLM V2: a generator per step seeded by the request state's seed and the step's first
position) draws DIFFERENT uniforms at different steps of the same request (its stream continues, or its
position moves on), REPRODUCES them across runs, and does not depend on the rest of its batch.

Each test decodes several steps of the same fixed rows (so only the draws can change the tokens): every
step's tokens equal the replay of the request's documented stream at that step (``harness.chain``), the
steps are not all alike, a second run with fresh generators of the same seeds gives the same tokens, and
the request alone gives the same tokens as in its batch."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cactus_theory import registry
from cactus_theory.integrations import vllm as plugin
from cactus_theory.sampler import PLACEHOLDER_TOKEN_ID, verify_flat
from tests.conformance.harness import Judge, chain, log_row, one_hot, softmax64
from tests.integrations.test_vllm_v2 import FakeSampler, install_fake_vllm, spec_config, standin

STEPS = 6
V = 5
RULE = registry.make("cactus", delta=0.05)


def rows(seed: int, T: int):
    """Rows where each draft is accepted about half the time and the recovery is spread: the drafted token
    carries 0.7 of the draft's mass and about 1/V of the verifier's."""
    rng = np.random.default_rng(seed)
    Q = rng.dirichlet(np.full(V, 5.0), size=T)
    ids = rng.integers(0, V, size=T)
    P = 0.3 * Q + 0.7 * one_hot(V, ids)
    return P, Q, ids


def tokens(out, b) -> list[int]:
    return [int(x) for x in out[b].tolist() if x != PLACEHOLDER_TOKEN_ID]


def test_verify_flat_per_request_generators_over_steps():
    counts = [3, 0, 2, 4]
    P, Q, ids = rows(0, sum(counts))
    cu = torch.tensor(np.cumsum(counts))
    bonus = torch.tensor([[1], [2], [3], [4]])
    seeds = {0: 11, 2: 12, 3: 13}

    def decode(gens, only=None):
        out = []
        for _ in range(STEPS):
            if only is None:
                o = verify_flat(torch.from_numpy(ids), cu, torch.from_numpy(P), torch.from_numpy(Q), bonus, RULE, gens)
                out.append([tokens(o, b) for b in range(len(counts))])
            else:  # request ``only`` alone in its batch
                s = sum(counts[:only])
                sl = slice(s, s + counts[only])
                o = verify_flat(torch.from_numpy(ids[sl]), torch.tensor([counts[only]]), torch.from_numpy(P[sl]),
                                torch.from_numpy(Q[sl]), bonus[only:only + 1], RULE, {0: gens[only]})
                out.append(tokens(o, 0))
        return out

    first = decode({b: torch.Generator().manual_seed(s) for b, s in seeds.items()})
    again = decode({b: torch.Generator().manual_seed(s) for b, s in seeds.items()})
    assert first == again  # reproduces across runs
    judge = Judge(1e-9)
    for b, s in seeds.items():
        stream = torch.rand(STEPS * (counts[b] + 1), generator=torch.Generator().manual_seed(s), dtype=torch.float64)
        sl = slice(sum(counts[:b]), sum(counts[:b + 1]))
        for t in range(STEPS):  # step t reads the request's stream from offset t (n_b + 1): it continues
            us = stream[t * (counts[b] + 1):(t + 1) * (counts[b] + 1)].numpy()
            want = chain(lambda j: RULE, ids[sl], P[sl], Q[sl], us, us[counts[b]], judge, bonus=int(bonus[b]))
            assert want is None or first[t][b] == want, (b, t, first[t][b], want)
        assert len({tuple(first[t][b]) for t in range(STEPS)}) > 1, b  # different draws at different steps
        alone = decode({b: torch.Generator().manual_seed(s)}, only=b)
        assert alone == [first[t][b] for t in range(STEPS)], b  # the batch does not move it
    assert all(first[t][1] == [2] for t in range(STEPS))  # no drafts: the bonus, no draws


@pytest.fixture(scope="module")
def vllm():
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


def test_vllm_v1_request_generators_over_steps(vllm):
    counts = [2, 3, 1]
    P, Q, ids = rows(1, sum(counts))
    logits = torch.from_numpy(log_row(Q)).float()
    Q64 = softmax64(logits.double().numpy())
    P64 = one_hot(V, ids)
    seeds = {0: 21, 1: 22, 2: 23}

    def decode(gens):
        sampler = vllm.v1.RejectionSampler()
        sampler.cactus_theory_rule = RULE
        md = SimpleNamespace(all_greedy=False, all_random=True, temperature=torch.ones(3), generators=gens)
        seen = []
        for _ in range(STEPS):
            out = sampler.forward(torch.from_numpy(ids).int(), counts, 3, torch.tensor(np.cumsum(counts)).int(), None,
                                  logits, torch.tensor([[0], [1], [2]]), md)
            seen.append([tokens(out, b) for b in range(3)])
        return seen

    first = decode({b: torch.Generator().manual_seed(s) for b, s in seeds.items()})
    assert first == decode({b: torch.Generator().manual_seed(s) for b, s in seeds.items()})
    judge = Judge(2e-5)
    for b, s in seeds.items():
        n = counts[b]
        stream = torch.rand(STEPS * (n + 1), generator=torch.Generator().manual_seed(s), dtype=torch.float64).numpy()
        sl = slice(sum(counts[:b]), sum(counts[:b + 1]))
        for t in range(STEPS):
            us = stream[t * (n + 1):(t + 1) * (n + 1)]
            want = chain(lambda j: RULE, ids[sl], P64[sl], Q64[sl], us, us[n], judge, bonus=b)
            assert want is None or first[t][b] == want, (b, t)
        assert len({tuple(first[t][b]) for t in range(STEPS)}) > 1, b


def test_vllm_v2_seeds_and_positions_over_steps(vllm):
    """V2: request state ``s`` keeps its seed; each step its first position moves on by the tokens it
    emitted, so its generator (seeded by (seed, position)) differs step to step; the same (seed, position)
    reproduces, whichever request-state slot or batch the request is in."""
    K = 3
    rng = np.random.default_rng(2)
    z = np.log(rng.dirichlet(np.ones(V), size=(2, K + 1)))  # two requests' fixed logits rows
    d = rng.normal(size=(4, K, V))
    temps, seeds = [1.0, 0.8, 1.0, 0.8], [31, 77, 31, 77]  # states 2, 3 repeat states 0, 1's settings

    def step(states, pos, order):
        R = len(order)
        ids, positions, local, st, cu = [], [], [], [], [0]
        for b in order:
            ids += [1] + [int(x) for x in np.argmax(z[b, :K], -1)]
            positions += [pos[b] + j for j in range(K + 1)]
            local += list(range(K + 1))
            st += [states[b]] * (K + 1)
            cu.append(cu[-1] + K + 1)
        n = cu[-1]
        seq = torch.tensor([positions[cu[i + 1] - 1] + 1 for i in range(R)], dtype=torch.int32)
        batch = SimpleNamespace(
            input_ids=torch.tensor(ids, dtype=torch.int32), positions=torch.tensor(positions), logits_indices=torch.arange(n),
            expanded_idx_mapping=torch.tensor(st, dtype=torch.int32), expanded_local_pos=torch.tensor(local, dtype=torch.int32),
            idx_mapping=torch.tensor([states[b] for b in order], dtype=torch.int32), idx_mapping_np=np.array([states[b] for b in order]),
            cu_num_logits=torch.tensor(cu, dtype=torch.int32), cu_num_logits_np=np.array(cu), num_reqs=R, seq_lens=seq,
            seq_lens_cpu_upper_bound=seq.clone(), num_draft_tokens=n - R)
        logits = torch.from_numpy(np.concatenate([z[b] for b in order])).float()
        cfg = SimpleNamespace(speculative_config=spec_config(k=K), sampler=FakeSampler(temps, seeds),
                              additional_config={"cactus_theory": "cactus:delta=0.05"})
        runner = vllm.mr2.GPUModelRunner(cfg, torch.device("cpu"))
        runner.load_model()
        out = runner.rejection_sampler(logits, batch, torch.from_numpy(d).float())
        return {b: tokens(out.sampled_token_ids, i) for i, b in enumerate(order)}

    def decode(states, order):
        pos, seen = {0: 40, 1: 90}, []
        for _ in range(STEPS):
            got = step(states, pos, order)
            seen.append(got)
            for b in order:
                pos[b] += len(got[b])
        return seen

    first = decode({0: 0, 1: 1}, [0, 1])
    assert first == decode({0: 0, 1: 1}, [0, 1])  # reproduces across runs
    assert first == decode({0: 2, 1: 3}, [1, 0])  # another slot with the same seed, another order: the same
    alone = decode({0: 0, 1: 1}, [0])
    assert [s[0] for s in alone] == [s[0] for s in first]  # the batch does not move it
    for b in (0, 1):
        assert len({tuple(s[b]) for s in first}) > 1, b  # its draws differ from step to step
    # and each step is the replay of the request's (seed, position) generator
    judge = Judge(2e-5)
    pos = {0: 40, 1: 90}
    for t in range(STEPS):
        for b in (0, 1):
            g = torch.Generator().manual_seed(plugin._request_seed(seeds[b], pos[b]))
            q = softmax64(z[b] / temps[b])
            y = judge.draw(q[K], float(torch.rand(1, generator=g, dtype=torch.float64)))
            us = torch.rand(K + 1, generator=g, dtype=torch.float64).numpy()
            ns = np.argmax(z[b, :K], -1)
            want = None if y is None else chain(lambda j: RULE, ns, softmax64(d[b, :K] / temps[b]), q[:K], us, us[K],
                                                judge, bonus=y)
            assert want is None or first[t][b] == want, (t, b)
            pos[b] += len(first[t][b])
