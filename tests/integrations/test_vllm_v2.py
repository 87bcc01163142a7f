"""The vLLM plugin on Model Runner V2, without vLLM: a stand-in of V2's Python entry point.

vLLM 0.33.0 (and the 0.32 builds) verify drafts on Model Runner V2 in
``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``: ``RejectionSampler.__call__(logits, input_batch,
draft_logits, invalid_drafts)`` gathers each logits row's input id (``gather_draft_sampled``), and
``RejectionSampler._verify`` applies the sampler's transforms (``sampler.apply_sampling_params``) and calls
the module global ``rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, pos,
idx_mapping, expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps, ...)``
(Triton kernels in ``rejection_sampler_utils.py``), which returns ``(sampled [num_reqs, K + 1] int64,
num_sampled [num_reqs] int32)``; ``get_num_sampled_and_rejected`` then zeroes chunked prefills. The runner
(``vllm/v1/worker/gpu/model_runner.py``, ``GPUModelRunner.load_model``) builds that sampler.

V2 cannot run on CPU (its verification is Triton only, and vLLM's CPU build has no Triton), and this
suite has no vLLM. So ``standin()`` below builds modules with the same names, signatures and call
structure as 0.33's (read from 0.33's source; written here, not copied), whose Triton kernels are
replaced by a small torch reference of V2's standard rejection sampling (``reference_rejection_sample``),
and installs them, with the few V1 modules ``register`` also patches, as a fake ``vllm`` package. The
plugin's own ``register`` then patches them exactly as it patches vLLM. tests/integrations/vllm_cpu_checks.py runs the
same checks against vLLM's real V2 ``RejectionSampler`` (opt-in, in a vLLM environment), with only its
kernels replaced by the references here.

The checks fail if the plugin is a no-op on a V2 runner: a rule must change the accepted counts on fixed
inputs, the first emitted token must follow the rule's exact law (``ct.induced_distribution``) and not
SpS's, ``set_rule`` must raise when the running sampler's hook is not the plugin's, and vLLM's own
``fly`` / ``synthetic`` / ``block`` settings together with a rule must be refused.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.integrations import vllm as plugin
from cactus_theory.stats import goodness_of_fit, samples_needed

ALPHA, EPS = 1e-4, 0.05  # level; the laws compared below differ by far more than EPS (asserted)
V = 8
NO_LOGPROBS = -1


# -- torch references of V2's kernels (standard rejection sampling, V2's semantics) ----------------------

def reference_rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
                               expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps,
                               synthetic_conditional_rates=None, use_fp64=False, use_block_verification=False,
                               contexts=None, watermarking=None, watermarking_skip_mask=None, watermark_key=None,
                               fly_window_size=0, fly_entropy_threshold=0.3, fly_entropy_top_k=3):
    """V2's standard rejection sampling, one request at a time (vLLM's own law, for comparison).

    Args as 0.33's ``rejection_sample``: target_logits ``[num_logits, V]`` float (processed);
    draft_logits ``[max_num_reqs, K, V]`` float before temperature, or None (one-hot drafts);
    draft_sampled ``[num_logits]`` int (row ``i + 1`` holds draft ``i``, -1 a placeholder);
    cu_num_logits ``[num_reqs + 1]`` int32; pos ``[num_logits]`` int64; idx_mapping ``[num_reqs]`` int;
    expanded_idx_mapping / expanded_local_pos ``[num_logits]`` int; temperature / seed ``[max_num_reqs]``;
    num_speculative_steps ``K``. Returns ``sampled [num_reqs, K + 1]`` int64 (-1 after the emitted tokens)
    and ``num_sampled [num_reqs]`` int32. Greedy (temperature 0): accept while the draft is the argmax,
    else emit the argmax; sampling: accept with ``min(1, q_n / p_n)``, else draw from ``(q - p)_+``
    (one-hot: ``q`` without ``n``; placeholder: ``q``); all accepted: the bonus from the last row.
    vLLM's own methods (synthetic, block, fly, watermarking) are not part of this reference.
    """
    assert synthetic_conditional_rates is None and not use_block_verification and not fly_window_size
    assert contexts is None
    R = cu_num_logits.shape[0] - 1
    K = int(num_speculative_steps)
    sampled = torch.full((R, K + 1), -1, dtype=torch.int64)
    num_sampled = torch.zeros(R, dtype=torch.int32)
    for b in range(R):
        lo, hi = int(cu_num_logits[b]), int(cu_num_logits[b + 1])
        s = int(idx_mapping[b])
        t = float(temperature[s])
        g = torch.Generator().manual_seed(int(seed[s]) * 1_000_003 + int(pos[lo]))
        out = []
        for i in range(hi - lo - 1):
            row, n = lo + i, int(draft_sampled[lo + i + 1])
            z = target_logits[row].float()
            if t == 0:
                if n >= 0 and int(z.argmax()) == n:
                    out.append(n)
                    continue
                out.append(int(z.argmax()))
                break
            q = torch.softmax(z, -1)
            p = None if draft_logits is None else torch.softmax(draft_logits[s, i].float() / t, -1)
            if n >= 0:
                ratio = float(q[n]) if p is None else float(q[n] / p[n])
                if float(torch.rand((), generator=g)) < ratio:
                    out.append(n)
                    continue
                res = q.clone()
                if p is None:
                    res[n] = 0
                else:
                    res = (q - p).clamp_min(0)
            else:
                res = q
            out.append(int(torch.multinomial(res / res.sum(), 1, generator=g)))
            break
        else:  # every draft accepted: the bonus token
            z = target_logits[hi - 1].float()
            out.append(int(z.argmax()) if t == 0 else int(torch.multinomial(torch.softmax(z, -1), 1, generator=g)))
        sampled[b, :len(out)] = torch.tensor(out)
        num_sampled[b] = len(out)
    return sampled, num_sampled


def reference_gather_draft_sampled(input_ids, positions, logits_indices, expanded_idx_mapping, expanded_local_pos,
                                   prefill_len):
    """V2's ``gather_draft_sampled``: each logits row's input id and position; draft rows of a step that
    starts inside the prefill are -1.

    input_ids ``[num_tokens]`` int32, positions ``[num_tokens]`` int64, logits_indices ``[num_logits]`` int,
    expanded_idx_mapping / expanded_local_pos ``[num_logits]`` int32, prefill_len ``[max_num_reqs]`` int.
    Returns (draft_sampled ``[num_logits]`` as input_ids, pos ``[num_logits]`` int64)."""
    ids = input_ids[logits_indices].clone()
    pos = positions[logits_indices].clone()
    local = expanded_local_pos.long()
    placeholder = (local > 0) & (pos - local < prefill_len[expanded_idx_mapping.long()])
    return ids.masked_fill(placeholder, -1), pos


def reference_get_num_sampled_and_rejected(num_sampled, seq_lens, cu_num_logits, idx_mapping, prefill_len):
    """V2's ``get_num_sampled_and_rejected``: chunked prefills sample nothing; rejected = rows - sampled.

    num_sampled ``[num_reqs]`` int32, seq_lens ``[num_reqs]`` int32, cu_num_logits ``[num_reqs + 1]`` int32,
    idx_mapping ``[num_reqs]`` int, prefill_len ``[max_num_reqs]`` int. Returns two ``[num_reqs]`` int32."""
    chunked = seq_lens < prefill_len[idx_mapping.long()]
    num_logits = (cu_num_logits[1:] - cu_num_logits[:-1]).to(num_sampled.dtype)
    num_sampled = torch.where(chunked, torch.zeros_like(num_sampled), num_sampled)
    return num_sampled, torch.where(chunked, torch.zeros_like(num_sampled), num_logits - num_sampled)


# -- the stand-in modules -------------------------------------------------------------------------------

def standin(rejection_sample_fn=reference_rejection_sample):
    """Modules named as V2's sampler and runner modules, with 0.33's call structure."""
    rs2 = types.ModuleType(plugin.V2_SAMPLER_MODULE)
    rs2.rejection_sample = rejection_sample_fn
    rs2.gather_draft_sampled = reference_gather_draft_sampled
    rs2.get_num_sampled_and_rejected = reference_get_num_sampled_and_rejected
    rs2.SimpleNamespace = SimpleNamespace

    class RejectionSampler:  # 0.33's attributes and call path (no chunking, no logprobs)
        def __init__(self, sampler, spec_config, device, *, watermark_key=None):
            self.sampler = sampler
            self.watermark_key = watermark_key
            self.num_speculative_steps = spec_config.num_speculative_tokens
            method = spec_config.rejection_sample_method
            self.use_block_verification = method == "block"
            self.fly_window_size = spec_config.fly_window_size if method == "fly" else 0
            self.synthetic_conditional_rates = (torch.tensor(spec_config.synthetic_acceptance_rates)
                                                if method == "synthetic" else None)

        def _verify(self, logits, draft_logits, draft_sampled, pos, cu_num_logits, idx_mapping, idx_mapping_np,
                    expanded_idx_mapping, expanded_local_pos, seq_lens_upper_bound_np, verify_draft_sampled):
            processed = self.sampler.apply_sampling_params(logits, expanded_idx_mapping, idx_mapping, idx_mapping_np,
                                                           pos, draft_sampled, expanded_local_pos,
                                                           seq_lens_upper_bound_np)
            sampled, num_sampled = rejection_sample(  # noqa: F821 - the module global, resolved at call time
                processed, draft_logits, verify_draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                expanded_local_pos, self.sampler.sampling_states.temperature.gpu,
                self.sampler.sampling_states.seeds.gpu, self.num_speculative_steps,
                self.synthetic_conditional_rates, use_fp64=False,
                use_block_verification=self.use_block_verification, fly_window_size=self.fly_window_size)
            return processed, sampled, num_sampled

        def __call__(self, logits, input_batch, draft_logits=None, invalid_drafts=None):
            draft_sampled, pos = gather_draft_sampled(  # noqa: F821
                input_batch.input_ids, input_batch.positions, input_batch.logits_indices,
                input_batch.expanded_idx_mapping, input_batch.expanded_local_pos,
                self.sampler.req_states.prefill_len.gpu)
            verify = draft_sampled if invalid_drafts is None else draft_sampled.masked_fill(invalid_drafts, -1)
            _, sampled, num_sampled = self._verify(
                logits, draft_logits, draft_sampled, pos, input_batch.cu_num_logits, input_batch.idx_mapping,
                input_batch.idx_mapping_np, input_batch.expanded_idx_mapping, input_batch.expanded_local_pos,
                input_batch.seq_lens_cpu_upper_bound.numpy(), verify)
            num_sampled, num_rejected = get_num_sampled_and_rejected(  # noqa: F821
                num_sampled, input_batch.seq_lens, input_batch.cu_num_logits, input_batch.idx_mapping,
                self.sampler.req_states.prefill_len.gpu)
            return SimpleNamespace(sampled_token_ids=sampled, num_sampled=num_sampled, num_rejected=num_rejected,
                                   logprobs_tensors=None)

    # the methods resolve rejection_sample & co. in the stand-in module, as 0.33's do in theirs
    for name in ("_verify", "__call__"):
        f = RejectionSampler.__dict__[name]
        setattr(RejectionSampler, name, types.FunctionType(f.__code__, rs2.__dict__, f.__name__, f.__defaults__,
                                                           f.__closure__))
    RejectionSampler.__module__ = rs2.__name__
    rs2.RejectionSampler = RejectionSampler

    mr2 = types.ModuleType(plugin.V2_RUNNER_MODULE)

    class GPUModelRunner:  # 0.33: __init__ keeps the configs, load_model builds the samplers
        def __init__(self, vllm_config, device):
            self.vllm_config = vllm_config
            self.speculative_config = vllm_config.speculative_config
            self.device = device
            self.rejection_sampler = None

        def load_model(self, *args, **kwargs):
            self.sampler = vllm_config_sampler(self.vllm_config)
            custom = getattr(self.vllm_config, "custom_sampler", None)
            if custom is not None:
                self.rejection_sampler = custom
            elif self.speculative_config is not None:
                self.rejection_sampler = rs2.RejectionSampler(
                    self.sampler, self.speculative_config, self.device,
                    watermark_key=getattr(self.vllm_config, "watermark_key", None))

    GPUModelRunner.__module__ = mr2.__name__
    mr2.GPUModelRunner = GPUModelRunner
    return rs2, mr2


def vllm_config_sampler(vllm_config):
    return vllm_config.sampler


class FakeSampler:
    """What V2's RejectionSampler reads from its Sampler (0.33): ``apply_sampling_params`` (here
    temperature then top-k, in float32), ``sampling_states`` (``temperature.gpu`` / ``seeds.gpu``
    ``[max_num_reqs]``, ``max_num_logprobs``, ``top_k.np``), ``req_states.prefill_len.gpu``,
    ``use_fp64_gumbel``, ``logprobs_mode``, ``return_sampling_mask``, ``compute_nans``."""

    def __init__(self, temperature, seeds, top_k=None, prefill_len=1):
        n = len(temperature)
        self.sampling_states = SimpleNamespace(
            temperature=SimpleNamespace(gpu=torch.tensor(temperature, dtype=torch.float32)),
            seeds=SimpleNamespace(gpu=torch.tensor(seeds, dtype=torch.int64)),
            top_k=SimpleNamespace(np=np.full(n, -1 if top_k is None else top_k)),
            max_num_logprobs=lambda idx_mapping_np: NO_LOGPROBS)
        self.req_states = SimpleNamespace(prefill_len=SimpleNamespace(gpu=torch.full((n,), prefill_len)))
        self.top_k = top_k
        self.use_fp64_gumbel = False
        self.logprobs_mode = "raw_logprobs"
        self.return_sampling_mask = False
        self.compute_nans = False

    def apply_sampling_params(self, logits, expanded_idx_mapping, idx_mapping, idx_mapping_np, pos, input_ids,
                              expanded_local_pos, seq_lens_upper_bound_np, skip_top_k_top_p=False):
        t = self.sampling_states.temperature.gpu[expanded_idx_mapping.long()]
        z = logits.float() / torch.where(t == 0, torch.ones_like(t), t).unsqueeze(-1)
        if self.top_k is not None and not skip_top_k_top_p:
            kth = z.topk(self.top_k, -1).values[:, -1:]
            z = torch.where(z >= kth, z, torch.full_like(z, float("-inf")))
        return z


def spec_config(method="standard", k=3, **kw):
    return SimpleNamespace(num_speculative_tokens=k, rejection_sample_method=method,
                           fly_window_size=kw.get("fly_window_size"),
                           synthetic_acceptance_rates=kw.get("synthetic_acceptance_rates"),
                           synthetic_acceptance_length=None, fly_entropy_threshold=0.3, fly_entropy_top_k=3,
                           enable_adaptive_verification=False)


def v2_batch(draft_ids, logits_rows, K=3, first_pos=10):
    """V2's InputBatch fields the rejection sampler reads, for requests with ``draft_ids[b]`` drafts.

    ``logits_rows[b]``: ``[len(draft_ids[b]) + 1, V]`` target logits of request ``b`` (its last row is the
    bonus row). Request ``b`` is request state ``b``; each scheduled token has a logits row (decode).
    Returns (logits ``[num_logits, V]`` float32, input_batch)."""
    R = len(draft_ids)
    ids, positions, local, req_state, cu = [], [], [], [], [0]
    for b, d in enumerate(draft_ids):
        ids += [1] + list(d)  # the last sampled token, then the drafts
        positions += [first_pos + b * 100 + j for j in range(len(d) + 1)]
        local += list(range(len(d) + 1))
        req_state += [b] * (len(d) + 1)
        cu.append(cu[-1] + len(d) + 1)
    n = cu[-1]
    seq_lens = torch.tensor([positions[cu[b + 1] - 1] + 1 for b in range(R)], dtype=torch.int32)
    batch = SimpleNamespace(
        input_ids=torch.tensor(ids, dtype=torch.int32), positions=torch.tensor(positions, dtype=torch.int64),
        logits_indices=torch.arange(n), expanded_idx_mapping=torch.tensor(req_state, dtype=torch.int32),
        expanded_local_pos=torch.tensor(local, dtype=torch.int32), idx_mapping=torch.arange(R, dtype=torch.int32),
        idx_mapping_np=np.arange(R), cu_num_logits=torch.tensor(cu, dtype=torch.int32), cu_num_logits_np=np.array(cu),
        num_reqs=R, seq_lens=seq_lens, seq_lens_cpu_upper_bound=seq_lens.clone(), num_draft_tokens=n - R)
    return torch.cat([torch.as_tensor(x, dtype=torch.float32) for x in logits_rows]), batch


def install_fake_vllm(monkeypatch, rs2, mr2):
    """A fake ``vllm`` package holding the stand-in V2 modules and the V1 names ``register`` patches."""
    v1rs = types.ModuleType("vllm.v1.sample.rejection_sampler")

    def v1_rejection_sample(*a, **k):
        raise AssertionError("V1 is not used in these tests")

    class V1RejectionSampler:
        def forward(self, *a, **k):
            return rejection_sample(*a, **k)  # noqa: F821

    V1RejectionSampler.forward = types.FunctionType(V1RejectionSampler.forward.__code__, v1rs.__dict__, "forward")
    v1rs.rejection_sample, v1rs.RejectionSampler = v1_rejection_sample, V1RejectionSampler
    v1rs.expand_batch_to_tokens = v1rs.apply_sampling_constraints = v1_rejection_sample
    v1mr = types.ModuleType("vllm.v1.worker.gpu_model_runner")

    class V1Runner:
        def __init__(self, vllm_config, *a, **k):
            self.vllm_config = vllm_config

    v1mr.GPUModelRunner = V1Runner
    wb = types.ModuleType("vllm.v1.worker.worker_base")
    wb.WorkerBase = type("WorkerBase", (), {})
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(is_cpu=lambda: False)
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.HAS_TRITON = True
    mods = {"vllm.v1.sample.rejection_sampler": v1rs, "vllm.v1.worker.gpu_model_runner": v1mr,
            "vllm.v1.worker.worker_base": wb, "vllm.platforms": platforms, "vllm.triton_utils": triton_utils,
            plugin.V2_SAMPLER_MODULE: rs2, plugin.V2_RUNNER_MODULE: mr2}
    for name in ("vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.worker", "vllm.v1.worker.gpu",
                 "vllm.v1.worker.gpu.spec_decode"):
        pkg = types.ModuleType(name)
        pkg.__path__ = []
        mods[name] = pkg
    for name, mod in sorted(mods.items()):
        monkeypatch.setitem(sys.modules, name, mod)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(mods[parent], child, mod)
    return wb.WorkerBase


@pytest.fixture
def v2(monkeypatch):
    """The stand-in V2 installed as vLLM and the plugin registered through its entry point function."""
    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    plugin._originals.clear()
    plugin._v2_state.clear()
    rs2, mr2 = standin()
    worker_base = install_fake_vllm(monkeypatch, rs2, mr2)
    plugin.register()
    yield SimpleNamespace(rs=rs2, mr=mr2, WorkerBase=worker_base)
    plugin.unregister()


def runner(mr2, rule=None, sampler=None, spec=None, **extra):
    cfg = SimpleNamespace(speculative_config=spec or spec_config(), sampler=sampler or FakeSampler([1.0], [0]),
                          additional_config={} if rule is None else {"cactus_theory": rule}, **extra)
    r = mr2.GPUModelRunner(cfg, torch.device("cpu"))
    r.load_model()
    return r


# -- the checks -----------------------------------------------------------------------------------------

def test_register_patches_v2_entry_point(v2):
    """``register`` replaces the module global that ``RejectionSampler._verify`` resolves at call time
    (identity), wraps ``__call__``, and ``unregister`` restores vLLM's own."""
    assert v2.rs.rejection_sample is plugin.rejection_sample_v2
    assert v2.rs.RejectionSampler._verify.__globals__["rejection_sample"] is plugin.rejection_sample_v2
    assert v2.rs.RejectionSampler.__call__ is plugin._patched_v2_call
    r = runner(v2.mr, "cactus:delta=0.5")
    assert r.rejection_sampler.cactus_theory_rule == ct.Cactus(0.5)
    assert plugin.hook_problem(r.rejection_sampler, r) is None
    plugin.unregister()
    assert v2.rs.rejection_sample is reference_rejection_sample
    assert v2.rs.RejectionSampler.__call__ is not plugin._patched_v2_call
    assert plugin.hook_problem(r.rejection_sampler, r) is not None  # the sampler no longer calls the plugin
    plugin.register()


def deterministic_batch(R=64, q_n=0.5):
    """R requests of 3 one-hot drafts each, every drafted token at verifier probability ``q_n`` (the
    argmax) and temperature 1: SpS accepts each with probability ``q_n``; TAS(0.09, 0.3) always."""
    rest = (1 - q_n) / (V - 1)
    row = np.log(np.full(V, rest))
    row[2] = np.log(q_n)
    drafts = [[2, 2, 2]] * R
    return v2_batch(drafts, [np.tile(row, (4, 1))] * R)


def test_v2_runner_is_not_a_noop(v2):
    """Fixed input, V2-configured runner: TAS through the plugin accepts every draft (each is at
    q_n = 0.5 > TAS's threshold); vLLM's own V2 (here the reference) accepts each with probability 0.5.
    A no-op plugin gives the second result."""
    R = 64
    logits, batch = deterministic_batch(R)
    sampler = FakeSampler([1.0] * R, list(range(R)))
    own = runner(v2.mr, None, sampler)
    out_own = own.rejection_sampler(logits, batch)
    assert own.rejection_sampler.cactus_theory_rule is None
    assert float(out_own.num_sampled.float().mean()) < 3.0  # SpS: E = 1 + .5 + .25 + .125 + ... about 1.9
    ours = runner(v2.mr, "tas:epsilon=0.09,alpha=0.3", sampler)
    out = ours.rejection_sampler(logits, batch)
    assert (out.num_sampled == 4).all() and (out.sampled_token_ids[:, :3] == 2).all()
    assert out.sampled_token_ids.dtype == torch.int64 and out.num_sampled.dtype == torch.int32
    assert (out.num_rejected == 0).all()


def test_v2_greedy_requests_keep_argmax_and_placeholders_reject(v2):
    """Greedy requests keep V2's exact argmax matching under any rule (identical to vLLM's own output),
    and a -1 placeholder draft ends a sampling request's verification (recovered from q)."""
    rng = np.random.default_rng(0)
    drafts = [[3, 5, 1], [], [4, 4], [0, 6, 2]]
    rows = [rng.normal(size=(len(d) + 1, V)) for d in drafts]
    rows[0][0, 3] = 9  # request 0: draft 0 is the argmax, draft 1 is not
    rows[0][1, 5] = -9
    rows[2][:, 4] = 9  # request 2: both drafts are the argmax, then the bonus argmax
    logits, batch = v2_batch(drafts, rows)
    sampler = FakeSampler([0.0, 0.0, 0.0, 1.0], [1, 2, 3, 4])
    own = runner(v2.mr, None, sampler).rejection_sampler(logits, batch)
    ours = runner(v2.mr, "cactus:delta=1.0", sampler).rejection_sampler(logits, batch)
    for b in range(3):
        n = int(own.num_sampled[b])
        assert int(ours.num_sampled[b]) == n
        assert ours.sampled_token_ids[b, :n].tolist() == own.sampled_token_ids[b, :n].tolist()
    assert ours.sampled_token_ids[0, :2].tolist() == [3, int(np.argmax(rows[0][1]))]
    assert ours.sampled_token_ids[2].tolist() == [4, 4, 4, -1]
    # a placeholder at request 3's second draft: at most one draft accepted, whatever the rule
    invalid = torch.zeros(logits.shape[0], dtype=torch.bool)
    invalid[int(batch.cu_num_logits[3]) + 2] = True
    for _ in range(5):
        out = runner(v2.mr, "tas", sampler).rejection_sampler(logits, batch, None, invalid)
        assert int(out.num_sampled[3]) <= 2


def law_batch(N, seed, one_hot):
    """N requests with one drafted token each (drawn from the draft law p, or fixed with one-hot drafts),
    the same verifier row q; temperature 0.7 and top-k 5 applied by the sampler (q processed as vLLM)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=V) * 0.6  # verifier logits
    p_raw = z + rng.normal(size=V) * 0.6  # draft logits before temperature: a draft near the verifier
    t, k = 0.7, 5
    zp = z / t
    zp = np.where(zp >= np.sort(zp)[-k], zp, -np.inf)
    q = np.exp(zp - zp.max())
    q /= q.sum()
    p = np.exp(p_raw / t - (p_raw / t).max())
    p /= p.sum()
    if one_hot:
        n = int(np.argsort(q)[-2])  # the second most likely token: a lossy rule raises its acceptance
        drafts, d = [[n]] * N, np.eye(V)[n]
    else:
        drafts, d = [[int(x)] for x in rng.choice(V, size=N, p=p)], p
    logits, batch = v2_batch(drafts, [np.stack([z, z])] * N)
    draft_logits = None if one_hot else torch.tensor(np.tile(p_raw, (N, 3, 1)), dtype=torch.float32)
    return logits, batch, draft_logits, FakeSampler([t] * N, list(range(N)), top_k=k), d, q


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_logits", "one_hot"])
def test_v2_first_token_follows_the_rules_exact_law(v2, one_hot):
    """Through the V2 runner's sampler with the plugin: the first emitted token follows Cactus(1.0)'s exact
    one-step law on the processed rows (draft law softmax(draft_logits / T), verifier law after temperature
    and top-k), which differs from SpS's (asserted), and SpS through the plugin follows SpS's law."""
    N = samples_needed(EPS, categories=V, alpha=ALPHA, beta=1e-3)
    logits, batch, draft_logits, sampler, d, q = law_batch(N, seed=4, one_hot=one_hot)
    rule = ct.Cactus(1.0)
    law, sps_law = ct.induced_distribution(rule, d, q), ct.induced_distribution(ct.SpS(), d, q)
    assert ct.tv(law, sps_law) > 2 * EPS  # a no-op plugin (vLLM's own SpS) would be rejected
    for r, expected in ((rule, law), (ct.SpS(), sps_law)):
        out = runner(v2.mr, r, sampler).rejection_sampler(logits, batch, draft_logits)
        res = goodness_of_fit(out.sampled_token_ids[:, 0].numpy(), expected, alpha=ALPHA, kind="samples")
        assert not res.reject, (r, res)


def test_v2_reference_is_sps(v2):
    """The stand-in's own kernels (vLLM's law) follow SpS's exact law: the references above are faithful
    enough for the no-op comparisons."""
    N = samples_needed(EPS, categories=V, alpha=ALPHA, beta=1e-3) // 4
    logits, batch, draft_logits, sampler, d, q = law_batch(N, seed=4, one_hot=False)
    out = runner(v2.mr, None, sampler).rejection_sampler(logits, batch, draft_logits)
    res = goodness_of_fit(out.sampled_token_ids[:, 0].numpy(), ct.induced_distribution(ct.SpS(), d, q),
                          alpha=ALPHA, kind="samples")
    assert not res.reject, res


def test_v2_seeded_requests_reproduce(v2):
    """A request's draws depend on its seed and position, not on the rest of the batch."""
    logits, batch, draft_logits, sampler, d, q = law_batch(40, seed=5, one_hot=False)
    r = runner(v2.mr, "cactus:delta=0.5", sampler)
    a = r.rejection_sampler(logits, batch, draft_logits).sampled_token_ids
    b = r.rejection_sampler(logits, batch, draft_logits).sampled_token_ids
    assert torch.equal(a, b)
    sampler.sampling_states.seeds.gpu += 1000
    c = r.rejection_sampler(logits, batch, draft_logits).sampled_token_ids
    assert not torch.equal(a, c)


def worker(r):
    return SimpleNamespace(model_runner=r)


def test_set_rule_confirms_the_running_hook(v2):
    """``set_rule`` (the worker method ``register`` adds) switches the rule and confirms the hook; it raises
    when what the running sampler calls is not the plugin's, naming the V1 fix."""
    assert getattr(v2.WorkerBase, plugin.SET_RULE_METHOD) is plugin.set_rule
    r = runner(v2.mr)
    assert plugin.set_rule(worker(r), "tas") == repr(ct.TAS())
    assert r.rejection_sampler.cactus_theory_rule == ct.TAS()
    assert plugin.set_rule(worker(r), None) == "vllm" and r.rejection_sampler.cactus_theory_rule is None
    with pytest.raises(ValueError, match="stateful"):  # SequenceBudget: vLLM's step carries no per-request state
        plugin.set_rule(worker(r), "sequence_budget:budget=1.0")
    assert r.rejection_sampler.cactus_theory_rule is None
    # someone else re-binds the module global the sampler resolves: the hook is no longer ours
    v2.rs.rejection_sample = reference_rejection_sample
    with pytest.raises(RuntimeError, match=plugin.V2_FIX):
        plugin.set_rule(worker(r), "tas")
    v2.rs.rejection_sample = plugin.rejection_sample_v2
    assert plugin.set_rule(worker(r), "tas") == repr(ct.TAS())
    # a model-specific sampler subclass overriding __call__ (the patched class attribute is shadowed)
    sub = type("OwnSampler", (v2.rs.RejectionSampler,), {"__call__": lambda self, *a, **k: None})
    r.rejection_sampler.__class__ = sub
    with pytest.raises(RuntimeError, match="OwnSampler.*VLLM_USE_V2_MODEL_RUNNER=0"):
        plugin.set_rule(worker(r), "tas")
    # a custom sampler from the model state (not V2's RejectionSampler): refused at engine start
    with pytest.raises(RuntimeError, match="model-specific sampler.*VLLM_USE_V2_MODEL_RUNNER=0"):
        runner(v2.mr, "tas", custom_sampler=SimpleNamespace())
    assert runner(v2.mr, None, custom_sampler=SimpleNamespace()).rejection_sampler is not None  # no rule: untouched
    with pytest.raises(ValueError, match="no rejection sampler"):
        plugin.set_rule(worker(SimpleNamespace(rejection_sampler=None)), "tas")


@pytest.mark.parametrize("method,extra,named", [
    ("fly", {"fly_window_size": 2}, "rejection_sample_method='fly'"),
    ("synthetic", {"synthetic_acceptance_rates": [0.9, 0.8, 0.7]}, "synthetic_acceptance_rates"),
    ("block", {}, "rejection_sample_method='block'"),
])
def test_own_lossy_settings_with_a_rule_are_refused(v2, monkeypatch, method, extra, named):
    """A rule together with vLLM's own fly_* / synthetic / block settings: the engine refuses to start
    (config or environment), ``set_rule`` refuses, and the entry point itself refuses; without a rule,
    vLLM's own method runs untouched."""
    spec = spec_config(method, **extra)
    with pytest.raises(ValueError, match=f"Cactus\\(delta=0.5.*{named}"):
        runner(v2.mr, "cactus:delta=0.5", spec=spec)
    monkeypatch.setenv(plugin.ENV_VAR, "tas")
    with pytest.raises(ValueError, match=f"TAS.*{named}"):
        runner(v2.mr, None, spec=spec)
    monkeypatch.delenv(plugin.ENV_VAR)
    r = runner(v2.mr, None, spec=spec)
    assert r.rejection_sampler.cactus_theory_rule is None
    with pytest.raises(ValueError, match=named):
        plugin.set_rule(worker(r), "tas")
    assert r.rejection_sampler.cactus_theory_rule is None
    kw = {"synthetic": {"synthetic_conditional_rates": torch.ones(3)}, "block": {"use_block_verification": True},
          "fly": {"fly_window_size": 2}}[method]
    logits, batch = deterministic_batch(2)
    args = (logits, None, batch.input_ids.long(), batch.cu_num_logits, batch.positions, batch.idx_mapping,
            batch.expanded_idx_mapping, batch.expanded_local_pos, torch.ones(2), torch.zeros(2, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="cannot run together"):
        plugin.rejection_sample_v2(*args, rule=ct.TAS(), **kw)


def test_v1_entry_point_refuses_own_lossy_methods_with_a_rule():
    """V1's hook no longer drops a rule silently for vLLM's synthetic (0.32) or FLy (0.33) modes."""
    md = SimpleNamespace(all_greedy=False, all_random=True)
    args = (torch.tensor([1], dtype=torch.int32), [1], 1, torch.tensor([1], dtype=torch.int32), None,
            torch.zeros(1, V), torch.zeros(1, 1, dtype=torch.long), md)
    with pytest.raises(ValueError, match="synthetic"):
        plugin.rejection_sample(*args, True, torch.ones(1), rule=ct.Cactus(0.5))
    with pytest.raises(ValueError, match="fly"):
        plugin.rejection_sample(*args, rule=ct.Cactus(0.5), fly_window_size=2, fly_entropy_threshold=0.3)
    assert plugin.own_methods(spec_config()) == []
    assert plugin.own_methods(None) == []


def test_watermarking_with_a_rule_is_refused(v2):
    with pytest.raises(RuntimeError, match="watermark"):
        runner(v2.mr, "tas", watermark_key=123)
    assert runner(v2.mr, None, watermark_key=123).rejection_sampler.watermark_key == 123


def test_unknown_v2_signature_refuses_to_start(monkeypatch):
    """A V2 ``rejection_sample`` whose parameters this plugin does not know is not patched; a V2 engine
    with a rule then refuses to start with one line naming VLLM_USE_V2_MODEL_RUNNER=0; without a rule it
    runs vLLM's own."""
    def renamed(target_logits, draft_probs, *rest, **kw):  # a future vLLM's renamed parameter
        return reference_rejection_sample(target_logits, draft_probs, *rest, **kw)

    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    plugin._originals.clear()
    plugin._v2_state.clear()
    rs2, mr2 = standin(renamed)
    install_fake_vllm(monkeypatch, rs2, mr2)
    plugin.register()
    try:
        assert rs2.rejection_sample is renamed and "draft_probs" in plugin._v2_state["unsupported"]
        with pytest.raises(RuntimeError) as e:
            runner(mr2, "cactus:delta=0.5")
        msg = str(e.value)
        assert "\n" not in msg and "draft_probs" in msg and plugin.V2_FIX in msg
        logits, batch = deterministic_batch(4)
        out = runner(mr2, None, FakeSampler([1.0] * 4, [0, 1, 2, 3])).rejection_sampler(logits, batch)
        assert out.sampled_token_ids.shape == (4, 4)
    finally:
        plugin.unregister()


def test_a_rule_that_draws_its_own_bonus_is_refused(v2):
    """MedusaTypical emits ``argmax q`` as its bonus token (``bonus_from_q = False``); vLLM draws the bonus
    itself from q, so running it would be another law: refused at engine start and by ``set_rule``."""
    assert not ct.MedusaTypical().bonus_from_q
    with pytest.raises(ValueError, match="MedusaTypical.*bonus"):
        runner(v2.mr, "medusa")
    r = runner(v2.mr, None)
    with pytest.raises(ValueError, match="bonus"):
        plugin.set_rule(worker(r), "medusa")
    assert r.rejection_sampler.cactus_theory_rule is None



# -- the draft's noise and the target's (vLLM 0.33's _DRAFT_NOISE_SALT; vLLM #54282 on 0.28) ----------------------
#
# V2 draws a probabilistic draft (draft_sample_method="probabilistic") by Gumbel-max (``gumbel_sample(...,
# is_drafting=True)``) with noise keyed on the request's seed and the position of the row that verifies it, and its
# own target side resamples a rejected draft's residual (``_seeded_resample_argmax``) with noise keyed on the same
# (seed, position). vLLM 0.28 keyed both alike: the residual was resampled with the very noise vector that drew the
# draft (#54282); 0.33 adds ``_DRAFT_NOISE_SALT = 1 << 30`` to the drafter's position
# (vllm/v1/worker/gpu/sample/gumbel.py). The stand-in ``gumbel`` module below keys its noise with the reference's
# own key (seed * 1_000_003 + position, a torch generator, where vLLM hashes with murmur3 token by token), with the
# salt of 0.33 or none (0.28). The plugin replaces the target side: whichever keying the drafter uses, its draws
# must be independent of the drafter's noise.

DRAFT_NOISE_SALT = 1 << 30
NOISE_V = 4
GUMBEL_MODULE = "vllm.v1.worker.gpu.sample.gumbel"


def noise_key(seed: int, pos: int) -> int:
    """The stand-in's key of V2's noise stream at (request seed, position): the reference sampler's own."""
    return int(seed) * 1_000_003 + int(pos)


_NOISE_GEN = torch.Generator()


def gumbel_draw(logits: torch.Tensor, key: int) -> int:
    """Gumbel-max with noise from the keyed stream: ``argmax(logits - log(-log u))``, ``u`` (V,) float64."""
    u = torch.rand(logits.shape[-1], generator=_NOISE_GEN.manual_seed(key), dtype=torch.float64)
    return int(torch.argmax(logits.double() - torch.log(-torch.log(u))))


def standin_gumbel(salt: int) -> types.ModuleType:
    """V2's ``gumbel`` module (0.33's ``gumbel_sample`` signature, without the logits cache) over the stand-in's
    keyed noise; ``is_drafting`` adds ``salt`` to the position (0.33: ``1 << 30``; 0.28: 0)."""
    mod = types.ModuleType(GUMBEL_MODULE)
    mod._DRAFT_NOISE_SALT = salt

    def gumbel_sample(logits, expanded_idx_mapping, temperature, seed, pos, apply_temperature, is_drafting, **kw):
        state = expanded_idx_mapping.long()
        t = temperature[state].double()
        z = logits.double() / torch.where(t > 0, t, 1.0)[:, None] if apply_temperature else logits.double()
        out = []
        for i, (s, x) in enumerate(zip(seed[state].tolist(), pos.tolist(), strict=True)):
            out.append(int(z[i].argmax()) if t[i] == 0 else gumbel_draw(z[i], noise_key(s, x + (salt if is_drafting else 0))))
        return torch.tensor(out, dtype=torch.int64)

    mod.gumbel_sample = gumbel_sample
    return mod


def keyed_reference_rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
                                     expanded_idx_mapping, expanded_local_pos, temperature, seed,
                                     num_speculative_steps, synthetic_conditional_rates=None, use_fp64=False,
                                     use_block_verification=False, fly_window_size=0, **kw):
    """V2's standard path with its keyed draws, one draft per request: accept with a uniform of the row's own
    stream, else resample ``(q - p)_+`` with ``gumbel_sample`` at the row's (seed, position), as V2's
    ``_seeded_resample_argmax``; the bonus from the bonus row's keyed noise."""
    gumbel = sys.modules[GUMBEL_MODULE]
    R = cu_num_logits.shape[0] - 1
    lo = cu_num_logits[:-1].long()
    state = idx_mapping.long()
    n = draft_sampled[lo + 1].long()
    q = torch.softmax(target_logits[lo].double(), -1)
    p = torch.softmax(draft_logits[state, 0].double() / temperature[state, None].double(), -1)
    rows = torch.arange(R)
    ratio = (q[rows, n] / p[rows, n]).clamp(max=1.0).tolist()
    keys = [noise_key(s, x) ^ 0x5EED for s, x in zip(seed[state].tolist(), pos[lo].tolist(), strict=True)]
    accepted = torch.tensor([float(torch.rand((), generator=_NOISE_GEN.manual_seed(k), dtype=torch.float64)) < r
                             for k, r in zip(keys, ratio, strict=True)])
    at = {"temperature": temperature, "seed": seed, "apply_temperature": False, "is_drafting": False}
    sampled = torch.full((R, int(num_speculative_steps) + 1), -1, dtype=torch.int64)
    a, r = accepted, ~accepted
    bonus = gumbel.gumbel_sample(torch.log_softmax(target_logits[lo[a] + 1].double(), -1), state[a], pos=pos[lo[a] + 1],
                                 **at)
    sampled[a, 0], sampled[a, 1] = n[a], bonus
    sampled[r, 0] = gumbel.gumbel_sample(torch.log((q[r] - p[r]).clamp_min(0)), state[r], pos=pos[lo[r]], **at)
    return sampled, (sampled >= 0).sum(-1).to(torch.int32)


def noise_batch(N, gumbel, seed=11):
    """N requests, one probabilistic draft each, drawn by V2's drafter (``gumbel.gumbel_sample(...,
    is_drafting=True)`` on the draft logits, at the verifying row's position) from ``p``; verifier law ``q``;
    temperature 1. Returns (logits, batch, draft_logits, sampler, drafts, p, q)."""
    rng = np.random.default_rng(seed)
    q = np.array([0.05, 0.55, 0.2, 0.2])  # the draft's favourite (token 0) is often rejected, and its runner-up
    p = np.array([0.6, 0.35, 0.03, 0.02])  # (token 1) is the main recovery: shared noise moves (draft, recovery) most
    seeds = torch.tensor(rng.choice(2**40, size=N, replace=False), dtype=torch.int64)
    logits, batch = v2_batch([[0]] * N, [np.log(np.stack([q, q]))] * N)  # drafts filled in below
    d = torch.tensor(np.log(np.tile(p, (N, 1))), dtype=torch.float32)
    drafts = gumbel.gumbel_sample(d, torch.arange(N), torch.ones(N), seeds, batch.positions[0::2],
                                  apply_temperature=True, is_drafting=True)
    batch.input_ids[1::2] = drafts.to(torch.int32)  # row 2b + 1 holds request b's draft
    draft_logits = d[:, None, :].repeat(1, 3, 1)
    return logits, batch, draft_logits, FakeSampler([1.0] * N, seeds.tolist()), drafts.numpy(), p, q


def joint_law(rule, p, q):
    """``P(n, y)`` of one drafted token ``n ~ p`` and the first emitted token ``y`` (V x V, flattened)."""
    V = p.size
    n = np.arange(V)
    P, Q = np.broadcast_to(p, (V, V)), np.broadcast_to(q, (V, V))
    phi = rule.accept_prob(P, Q, n)
    return (p[:, None] * (phi[:, None] * np.eye(V) + (1 - phi)[:, None] * rule.residual(P, Q, n))).ravel()


NOISE_N = samples_needed(EPS, categories=NOISE_V**2, alpha=ALPHA, beta=1e-3)  # TV 0.05 at power 0.999, level 1e-4


def _joint_test(out, drafts, law):
    cells = drafts * NOISE_V + out.sampled_token_ids[:, 0].numpy()
    return goodness_of_fit(cells, law, alpha=ALPHA, kind="samples")


@pytest.mark.parametrize("salt", [0, DRAFT_NOISE_SALT], ids=["drafter_keyed_as_0.28", "drafter_salted_as_0.33"])
def test_v2_plugin_draws_are_independent_of_the_draft_noise(v2, monkeypatch, salt):
    """Drafts drawn by V2's drafter, whose Gumbel noise is keyed on the seed and position the plugin receives: the
    joint law of (draft, first emitted token) through the plugin is the rule's exact joint law, with the drafter keyed
    as vLLM 0.28 keyed it (the key of V2's own resampling: shared noise for vLLM's sampler) and as 0.33 (salted).
    ``NOISE_N`` draws detect a joint law at TV 0.05 with power 0.999 at level 1e-4 (``samples_needed``, 16 cells)."""
    gumbel = standin_gumbel(salt)
    monkeypatch.setitem(sys.modules, GUMBEL_MODULE, gumbel)
    logits, batch, draft_logits, sampler, drafts, p, q = noise_batch(NOISE_N, gumbel)
    rule = ct.Cactus(0.1)  # rejects a draft with probability 0.45 here: the recovery is tested, not only acceptance
    out = runner(v2.mr, rule, sampler).rejection_sampler(logits, batch, draft_logits)
    res = _joint_test(out, drafts, joint_law(rule, p, q))
    assert not res.reject, res


def test_the_joint_test_catches_shared_noise(monkeypatch):
    """The test above on V2's own target side (the stand-in's keyed reference): with the drafter keyed as 0.28 (the
    draft's noise vector reused to resample its residual, #54282) the joint law is rejected; with 0.33's salt it
    holds. So the plugin's test sees a plugin whose draws share the draft's noise (tests/mutants.py plants one)."""
    plugin._originals.clear()
    plugin._v2_state.clear()
    rs2, mr2 = standin(keyed_reference_rejection_sample)
    install_fake_vllm(monkeypatch, rs2, mr2)
    for salt, shared in ((0, True), (DRAFT_NOISE_SALT, False)):
        gumbel = standin_gumbel(salt)
        monkeypatch.setitem(sys.modules, GUMBEL_MODULE, gumbel)
        logits, batch, draft_logits, sampler, drafts, p, q = noise_batch(NOISE_N, gumbel)
        out = runner(mr2, None, sampler).rejection_sampler(logits, batch, draft_logits)
        res = _joint_test(out, drafts, joint_law(ct.SpS(), p, q))
        assert res.reject == shared, (salt, res)
