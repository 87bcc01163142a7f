"""The engines' controls (issue 41, items 1 and 3) without an engine: benchmarks/engine_controls.py's rows of one
setting differ in their role only; the planted bug of tests/planted.py is the stated law (the verifier's row at
temperature ``T / c`` on the same support, against the transformation written out) and reaches the drafted rows
only, in transformers' and in vLLM's rejection step (each function replaced by a recorder); the prefixes whose
planted TV a negative control states are the ones a direct count finds."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.planted import plant_vllm_tempered_target, tempered_law, transformers_tempered_target

ROOT = Path(__file__).resolve().parents[2]


def _controls():
    spec = importlib.util.spec_from_file_location("engine_controls", ROOT / "benchmarks" / "engine_controls.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_rows_of_a_setting_differ_in_their_role_only():
    ec = _controls()
    for setting in ec.SETTINGS:
        engine = ec.SETTINGS[setting][1]
        argvs = {role: ec.argv_of(setting, role) for role in ec.ROLES[engine]}
        strip = {role: [a for a in v if a not in ("none", "fixes")] for role, v in argvs.items()}
        assert len({tuple(v) for v in strip.values()}) == 1, setting  # same n, batch, sampling, seed, alpha, ...
        for role, v in argvs.items():
            if engine == "vllm":
                assert v[v.index("--vllm-plugin") + 1] == ("none" if role == "shipped" else "fixes")
            assert ec.out_name(setting, role).startswith(f"{engine}_") and role in ec.out_name(setting, role)
    assert ec.out_name("vllm_ngram_temperature", "fixes") == "vllm_ngram_fixes_temperature.json"
    assert ec.argv_of("vllm_ngram_temperature", "fixes", n=40)[ec.argv_of("vllm_ngram_temperature", "fixes").index(
        "--n") + 1] == "40"
    with pytest.raises(ValueError, match="--role for transformers"):
        ec.argv_of("transformers_paper", "fixes")
    with pytest.raises(ValueError, match="--setting"):
        ec.argv_of("sglang_paper", "shipped")
    assert ec.main(["--setting", "transformers_paper", "--role", "fixes"]) == 2


def test_the_tempered_law_is_the_row_at_temperature_t_over_c_on_its_support():
    """q = sampling transforms of logits l at T (top-k 3 of 6): q_c must be softmax(c l / T) on q's support."""
    from cactus_theory.core.transforms import sampling_probs

    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(2, 6)) * 2)
    T, c = 0.6, 1.5
    q = sampling_probs(logits, T, 3, 1.0)
    got = tempered_law(q, c)
    for r in range(2):
        keep = q[r] > 0
        want = np.zeros(6)
        z = np.exp(c * logits[r].numpy()[keep.numpy()] / T)
        want[keep.numpy()] = z / z.sum()
        assert np.allclose(got[r].numpy(), want, atol=1e-12)
    with pytest.raises(ValueError, match="c must be > 0"):
        tempered_law(q, 0.0)


def test_the_planted_transformers_bug_tempers_the_drafted_rows_and_keeps_the_bonus_row(monkeypatch):
    from transformers.generation import utils as gu

    seen = {}

    def recorder(ids, cand_logits, length, new_logits, *args, **kwargs):
        seen.update(new=new_logits, kwargs=kwargs)
        return "tokens", 0

    monkeypatch.setattr(gu, "_speculative_sampling", recorder)
    new = torch.randn(1, 4, 7)
    new[0, 1, 2] = -torch.inf
    with transformers_tempered_target(2.0):
        assert gu._speculative_sampling(None, None, 3, new, assistant_ensemble_weight=None) == ("tokens", 0)
    assert gu._speculative_sampling is recorder  # restored
    assert torch.equal(seen["new"][0, :3], 2.0 * new[0, :3]) and torch.equal(seen["new"][0, 3], new[0, 3])
    assert seen["new"][0, 1, 2] == -torch.inf and seen["kwargs"] == {"assistant_ensemble_weight": None}


def test_the_planted_vllm_bug_tempers_the_target_logits_and_marks_the_process(tmp_path, monkeypatch):
    """vLLM is not needed: its rejection-sampler module is replaced by one recording what reaches its function."""
    seen = []
    fake = types.ModuleType("vllm.v1.sample.rejection_sampler")
    fake.rejection_sample = lambda *a, **k: seen.append((a, k)) or "out"
    for name in ("vllm", "vllm.v1", "vllm.v1.sample"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.sample.rejection_sampler", fake)
    sys.modules["vllm.v1.sample"].rejection_sampler = fake
    marker = tmp_path / "pids"
    plant_vllm_tempered_target(1.5, str(marker))
    target, bonus = torch.randn(5, 9), torch.tensor([[3], [4]])
    assert fake.rejection_sample("ids", [0, 0], 4, "cu", None, target, bonus, "meta", synthetic_mode=False) == "out"
    assert not marker.exists()  # a step without drafts does not count as reaching the verification
    fake.rejection_sample("ids", [3, 2], 4, "cu", None, target, bonus, "meta", synthetic_mode=False)
    a, k = seen[-1]
    assert torch.equal(a[5], 1.5 * target) and a[6] is bonus and a[:5] == ("ids", [3, 2], 4, "cu", None)
    assert k == {"synthetic_mode": False} and marker.read_text().split() == [str(__import__("os").getpid())]
    with pytest.raises(ValueError, match="c must be > 0"):
        plant_vllm_tempered_target(-1.0)


def test_the_negative_controls_prefixes_are_a_direct_count():
    ec = _controls()
    rng = np.random.default_rng(1)
    n, prompts, mc = 40, 2, 5
    a = [list(rng.integers(0, 3, size=rng.integers(0, 4))) for _ in range(n * prompts)]
    b = [list(rng.integers(0, 3, size=rng.integers(0, 4))) for _ in range(n * prompts)]
    for t in (0, 1, 2):
        got = ec.tested_prefixes(a, b, prompts, n, t, mc)
        want = sorted({(i // n, tuple(d[:t])) for i, d in enumerate(a) if len(d) >= t
                       if sum(1 for j, e in enumerate(a) if j // n == i // n and len(e) >= t and e[:t] == d[:t]) >= mc
                       and sum(1 for j, e in enumerate(b) if j // n == i // n and len(e) >= t and e[:t] == d[:t]) >= mc})
        assert got == want and (t > 0 or got == [(0, ()), (1, ())])
