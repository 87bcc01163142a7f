"""The vLLM end-to-end benchmark's pieces that need no vLLM (benchmarks/vllm_engine.py, run by
``make vllm``), the synthetic-mode rule of the plugin module, and the model exports' argument checks.

The n-gram lookup is also checked against vLLM's own numba function in tests/integrations/vllm_cpu_checks.py;
here it is checked against hand-worked cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import vllm_engine as ve  # benchmarks/vllm_engine.py (pytest's pythonpath)

import cactus_theory as ct
from cactus_theory.integrations.vllm import VllmSynthetic


@pytest.mark.parametrize("tokens,min_n,max_n,k,expected", [
    ([1, 2, 3, 9, 1, 2], 1, 3, 2, [3, 9]),           # suffix "1 2" seen at 0: propose what followed
    ([1, 2, 3, 9, 1, 2], 3, 3, 2, []),               # no earlier 3-gram "9 1 2"
    ([5, 1, 7, 1, 8, 1], 1, 2, 3, [7, 1, 8]),        # longest "1" only; earliest occurrence (index 1)
    ([4, 1, 2, 5, 1, 2, 6, 1, 2], 1, 4, 1, [5]),     # "1 2" at 1 and 4: the earliest wins
    ([3, 3, 3], 1, 4, 4, [3]),                       # overlapping match, proposal cut at the context end
    ([7], 1, 2, 4, []),                              # too short
])
def test_ngram_proposal_cases(tokens, min_n, max_n, k, expected):
    assert ve.ngram_proposal(tokens, min_n, max_n, k) == expected


def test_block_starts_walks_vllm_records():
    # prompt of 5 tokens, 7 new tokens: steps accepting 2, 0, 1 drafts start at 5, 8, 9; the token
    # sampled at prefill sits at index 5, the last emitted at 11
    assert ve.block_starts(5, 7, [2, 0, 1], [4, 4, 4]) == [(5, 2), (8, 0), (9, 1)]
    assert ve.block_starts(5, 7, [2, 0], [4, 4]) is None  # records end before the output does
    # n-gram: positions without a proposal are plain steps that vLLM does not record
    toks = list(range(20))
    assert ve.block_starts(5, 4, [1], [2], proposer=lambda ctx: len(ctx) == 7, tokens=toks) == [(6, 1)]


def test_z_score_and_intervals():
    assert ve.z_score(3, [0.5] * 6) == 0.0
    assert math.isclose(ve.z_score(5, [0.5] * 4), (5 - 2) / 1.0)
    assert ve.z_score(2, [1.0, 1.0, 0.0]) == 0.0 and ve.z_score(1, [1.0, 1.0]) == math.inf
    point, lo, hi = ve.ratio_ci([1, 2, 3], [2, 4, 6])
    assert point == lo == hi == 0.5
    d, lo, hi = ve.diff_ci(([1, 1], [2, 2]), ([1, 1], [2, 2]))
    assert d == 0 and lo <= 0 <= hi


def test_vllm_synthetic_law_closed_form():
    """vLLM's synthetic mode at one position, h = rate e_n + (1 - rate) q_(-n) / (1 - q_n) for a
    one-hot draft; with a draft law, rate p + (1 - rate) sum_n p_n (q - p)_+ / sum (q - p)_+."""
    q = np.array([0.5, 0.3, 0.15, 0.05])
    e = np.eye(4)[1]
    r = 0.7
    h = ct.induced_distribution(VllmSynthetic(r), e, q)
    rest = q * (np.arange(4) != 1) / (1 - q[1])
    np.testing.assert_allclose(h, r * e + (1 - r) * rest, atol=1e-12)
    assert math.isclose(ct.acceptance_rate(VllmSynthetic(r), e, q), r)
    p = np.array([0.1, 0.6, 0.2, 0.1])
    res = np.clip(q - p, 0, None)
    np.testing.assert_allclose(ct.induced_distribution(VllmSynthetic(r), p, q), r * p + (1 - r) * res / res.sum(),
                               atol=1e-12)
    with pytest.raises(ValueError, match="rate"):
        VllmSynthetic(1.5)


def test_exports_refuse_bad_arguments(tmp_path):
    from cactus_theory.integrations.vllm_models import export_draft, export_verifier, is_exported

    with pytest.raises(ValueError, match="model"):
        export_verifier(str(tmp_path / "v"), model="no-such.gguf")
    with pytest.raises(ValueError, match="draft_file"):
        export_draft(str(tmp_path / "missing.pt"), str(tmp_path / "d"))
    assert not is_exported(str(tmp_path), {"kind": "verifier"})
    (tmp_path / "cactus_theory_export.json").write_text('{"kind": "verifier"}')
    assert is_exported(str(tmp_path), {"kind": "verifier"}) and not is_exported(str(tmp_path), {"kind": "x"})


def test_benchmark_refuses_bad_arguments(capsys):
    assert ve.main(["--stages", "bogus"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert ve.main(["--draft", "/no/such/draft.pt"]) == 2
    assert "--draft" in capsys.readouterr().err
