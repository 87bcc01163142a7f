"""``lm.roofline``: the bytes and FLOPs of each phase against a hand count on a tiny config, the composition
of a verifier call's phases (chain and tree), the roofs' measurements (positive, finite; bad input refused
with a ValueError naming the argument), and ``benchmarks/roofline_table.py``'s block in docs/decoding.md."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from cactus_theory.core.tree import branching_parents
from cactus_theory.lm.draft import FeatureDraft, HeadArgs
from cactus_theory.lm.llama import Llama, LlamaArgs
from cactus_theory.lm.roofline import (
    Cost,
    bookkeeping_cost,
    cpu_model,
    draft_step_cost,
    format_table,
    gemm_shape,
    measure_bandwidth,
    measure_matmul,
    nominal_bandwidth,
    phase_cost,
    phase_rows,
    roofline,
    step_costs,
    verifier_forward_cost,
    verify_cost,
)

ROOT = Path(__file__).resolve().parents[2]

# dim 16, 2 layers, 2 query heads and 1 key / value head of 8, SwiGLU width 24, 10 tokens, tied head
ARGS = LlamaArgs(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, hidden=24, vocab=10, max_positions=64)


def _verifier(dtype=torch.float32) -> Llama:
    torch.manual_seed(0)
    return Llama(ARGS).to(dtype).eval()


def _draft(verifier: Llama) -> FeatureDraft:
    a = HeadArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, hidden=24, vocab=10, shortlist=8,
                 aux_layers=(0, 1), max_positions=64)
    return FeatureDraft(a, verifier.embed).eval()


# Hand count of the tiny verifier (float32, 4 bytes). Per layer: attn_norm 16, wqkv 16 -> (2 + 2) * 8 = 32
# (512), wo 16 -> 16 (256), mlp_norm 16, w13 16 -> 48 (768), w2 24 -> 16 (384): 1952 parameters, 1920 of
# them in linear maps. Two layers 3904, final norm 16, the tied head 10 x 16 = 160: 4080 parameters read.
# Linear maps' inputs + outputs per row and layer: 48 + 32 + 64 + 40 = 184.

def test_verifier_forward_bytes_and_flops_by_hand():
    W, L = 3, 5
    c = verifier_forward_cost(_verifier(), width=W, context=L)
    assert c.weights == 4080 * 4 + W * 16 * 4  # every weight once + the W embedding rows
    assert c.kv == 2 * 2 * 1 * 8 * (L + W) * 4  # keys and values, 2 layers, 1 head of 8, L + W slots
    assert c.other == 2 * 184 * W * 4 + W * (16 + 10) * 4 + 3 * W * 10 * 4  # activations, head, logits / q
    assert c.flops == 2 * 3840 * W + 2 * 160 * W + 4 * 2 * 2 * 8 * W * (L + W)  # GEMMs + attention
    assert c.bytes == c.weights + c.kv + c.other
    # batch rows share the weights; KV, activations and FLOPs scale; bfloat16 halves the model's bytes
    c2 = verifier_forward_cost(_verifier(), width=W, context=L, batch=2)
    assert (c2.weights, c2.kv, c2.flops) == (4080 * 4 + 2 * W * 16 * 4, 2 * c.kv, 2 * c.flops)
    cb = verifier_forward_cost(_verifier(torch.bfloat16), width=W, context=L)
    assert cb.weights == 4080 * 2 + W * 16 * 2 and cb.kv == c.kv / 2 and cb.flops == c.flops


def test_draft_step_bytes_and_flops_by_hand():
    # the head's step: embed_norm 16, feat_norm 16, wqkv 32 -> 32 (1024), wo 256, mlp_norm 16, w13 768, w2 384,
    # norm 16, shortlist head 8 x 16 = 128: 2624 float parameters; d2t 8 int64 (64 bytes); fc is not read here
    d = _draft(_verifier())
    W, L, R = 2, 5, 1
    c = draft_step_cost(d, width=W, context=L, head_rows=R)
    assert c.weights == 2624 * 4 + 64 + W * 16 * 4
    assert c.kv == 2 * 1 * 1 * 8 * (L + W) * 4
    assert c.flops == 2 * (1024 + 256 + 768 + 384) * W + 2 * 128 * R + 4 * 1 * 2 * 8 * W * (L + W)
    assert c.other == (64 + 32 + 64 + 40) * W * 4 + R * (16 + 8) * 4 + R * (2 * 8 + 10) * 4
    # a compact Llama as a token-level draft: its forward with the head on R rows, plus the law written
    v = _verifier()
    t = draft_step_cost(v, width=W, context=L, head_rows=R)
    f = verifier_forward_cost(v, width=W, context=L, head_rows=R)
    assert t == f + Cost(other=R * 10 * 4)


def test_verify_and_bookkeeping_by_hand():
    assert verify_cost(10, drafted=4, batch=2) == Cost(other=2 * (4 + 5) * 10 * 4)
    v = _verifier()
    d = _draft(v)
    chain = bookkeeping_cost(d, v, width=5)
    assert chain == Cost(weights=32 * 16 * 4, other=(32 + 16) * 5 * 4, flops=2 * 32 * 16 * 5)  # fc over 5 features
    tree = bookkeeping_cost(d, v, width=5, kept=2)  # + 2 kept entries moved (read + written) in both caches
    assert tree.kv == 2 * (2 * 2 * 1 * 8 * 2 * 4) + 2 * (2 * 1 * 1 * 8 * 2 * 4)
    assert bookkeeping_cost(v, v, width=5) == Cost()  # a token-level draft fuses nothing
    assert phase_cost("verify", vocab=10, drafted=4, batch=2) == verify_cost(10, 4, 2)


def test_step_costs_compose_the_phases():
    v = _verifier()
    d = _draft(v)
    c = step_costs(d, v, context=7, k=3, al=2.0)
    assert c["draft"] == draft_step_cost(d, 2.0, 7) + draft_step_cost(d, 1, 7).times(2)
    assert c["verifier"] == verifier_forward_cost(v, 4, 7)
    assert c["verify"] == verify_cost(10, 3)
    assert c["bookkeeping"] == bookkeeping_cost(d, v, 4)
    tree = branching_parents((2, 2))  # levels of 2 and 4 nodes: the root step, then one step over level 0
    t = step_costs(d, v, context=7, tree=tree, al=1.5)
    assert t["draft"] == draft_step_cost(d, 1.5, 7) + draft_step_cost(d, 2, 7, head_rows=2)
    assert t["verifier"] == verifier_forward_cost(v, 7, 7) and t["verify"] == verify_cost(10, 6)
    assert t["bookkeeping"] == bookkeeping_cost(d, v, 7, kept=1.5)


def test_roofline_and_phase_rows():
    c = Cost(weights=1e6, flops=1e6)
    assert roofline(c, 1e9, 1e12) == (1e-3, "memory")
    assert roofline(c, 1e12, 1e9) == (1e-3, "compute")
    assert roofline(Cost(other=2e6), 1e9, None) == (2e-3, "memory")
    rows = phase_rows("SpS k=4 B=1", {"verify": 4e-3}, {"verify": Cost(other=2e6)}, 1e9, 1e12, nominal=2e9)
    r = rows[0]
    assert r["roofline_ms"] == pytest.approx(2.0) and r["ratio"] == pytest.approx(2.0)
    assert r["bandwidth_share"] == pytest.approx(0.5) and r["nominal_share"] == pytest.approx(0.25)
    roof = {"device": "cpu", "device_name": "Tiny CPU", "dtype": "float32", "threads": 1, "bandwidth": 1e9,
            "bandwidth_nbytes": 2**25, "nominal_bandwidth": None, "gemm_shape": [48, 16], "peak_rows": 256,
            "flop_rate": 1e12, "flop_rates_by_rows": {"1": 1e10},
            "phases": [{**r, "rule": "SpS"}, {**r, "rule": "TAS", "row": "TAS k=4 B=1"}]}
    text = format_table(roof, rules=("SpS",))
    assert "Tiny CPU" in text and "| SpS k=4 B=1 | verify | 4.00 |" in text and "TAS" not in text
    assert "2.0x" in text and "50%" in text and "nominal share" in text


def test_measurements_positive_finite():
    assert math.isfinite(bw := measure_bandwidth(nbytes=2**20, repeats=2)) and bw > 0
    assert math.isfinite(f := measure_matmul(torch.float32, 4, 48, 16, repeats=2)) and f > 0
    assert gemm_shape(_verifier()) == (48, 16)  # w13: 2 x 24 by 16
    assert nominal_bandwidth("cpu") is None and isinstance(cpu_model(), str) and cpu_model()


@pytest.mark.parametrize("call, name", [
    (lambda: measure_bandwidth(nbytes=0), "nbytes"),
    (lambda: measure_bandwidth(nbytes=100), "nbytes"),
    (lambda: measure_bandwidth(nbytes=2.5e6), "nbytes"),
    (lambda: measure_bandwidth(nbytes=2**20, repeats=0), "repeats"),
    (lambda: measure_bandwidth(nbytes=2**20, device="nowhere"), "device"),
    (lambda: measure_matmul(torch.int64, 4, 8, 8), "dtype"),
    (lambda: measure_matmul(torch.float32, 0, 8, 8), "m"),
    (lambda: measure_matmul(torch.float32, 4, True, 8), "n"),
    (lambda: measure_matmul(torch.float32, 4, 8, -1), "k"),
    (lambda: measure_matmul(torch.float32, 4, 8, 8, repeats=1.5), "repeats"),
    (lambda: verifier_forward_cost(_verifier(), width=0, context=1), "width"),
    (lambda: verifier_forward_cost(_verifier(), width=1, context=-1), "context"),
    (lambda: verifier_forward_cost(_verifier(), width=1, context=1, batch=0), "batch"),
    (lambda: verifier_forward_cost(_verifier(), width=math.nan, context=1), "width"),
    (lambda: verifier_forward_cost(nn.Linear(2, 2), width=1, context=1), "model"),
    (lambda: draft_step_cost(nn.Linear(2, 2), width=1, context=1), "draft"),
    (lambda: draft_step_cost(_verifier(), width=1, context=1, head_rows=-1), "head_rows"),
    (lambda: verify_cost(0, 4), "vocab"),
    (lambda: verify_cost(10, 0), "drafted"),
    (lambda: bookkeeping_cost(_verifier(), _verifier(), width=2, kept=-1), "kept"),
    (lambda: phase_cost("sampling"), "phase"),
    (lambda: step_costs(_draft(_verifier()), _verifier(), 5), "k"),
    (lambda: step_costs(_draft(_verifier()), _verifier(), 5, k=0), "k"),
    (lambda: step_costs(_draft(_verifier()), _verifier(), 5, k=2, al=0.5), "al"),
    (lambda: roofline(Cost(other=1.0), 0, None), "bandwidth"),
    (lambda: roofline(Cost(flops=1.0), 1e9, None), "flop_rate"),
])
def test_bad_input_refused_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def _table_script():
    spec = importlib.util.spec_from_file_location("roofline_table", ROOT / "benchmarks" / "roofline_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_docs_table_block_is_replaced_and_nothing_else(tmp_path):
    mod = _table_script()
    page = (ROOT / "docs" / "decoding.md").read_text(encoding="utf-8")
    assert page.count(mod.BEGIN) == 1 and page.count(mod.END) == 1  # the page carries the generated block
    new = mod.replace_block(page, "| a | b |\n|---|---|")
    before, after = page.split(mod.BEGIN)[0], page.split(mod.END)[1]
    assert new.startswith(before) and new.endswith(after) and f"{mod.BEGIN}\n| a | b |\n|---|---|\n{mod.END}" in new
    assert mod.replace_block(new, "x") == mod.replace_block(page, "x")  # idempotent: only the block changes
    with pytest.raises(ValueError, match="roofline_table"):
        mod.replace_block("no markers here", "x")
    with pytest.raises(ValueError, match="no roofline"):
        mod.table({"rows": []}, "old.json")


def test_bare_forward_writes_its_logits_only():
    v = _verifier()
    assert (verifier_forward_cost(v, 3, 5).other - verifier_forward_cost(v, 3, 5, sampled=False).other
            == 2 * 3 * 10 * 4)  # the transforms' read of the logits and their write of q


COMMITTED = "benchmarks/results/lm/lean_bf16.json"


def test_docs_table_is_the_committed_runs():
    """Once the roofline run is committed, the page's table is the script's output for it."""
    import json

    path = ROOT / COMMITTED
    if not path.exists():
        pytest.skip(f"{COMMITTED} is not committed yet (the page holds a placeholder)")
    mod = _table_script()
    page = (ROOT / "docs" / "decoding.md").read_text(encoding="utf-8")
    block = page.split(mod.BEGIN + "\n", 1)[1].split("\n" + mod.END, 1)[0]
    assert block == mod.table(json.loads(path.read_text(encoding="utf-8")), COMMITTED).strip()


def test_measure_roofs_on_a_tiny_verifier():
    from cactus_theory.lm.roofline import measure_roofs

    roof = measure_roofs(_verifier(), widths=(1, 4), nbytes=2**20, repeats=1)
    assert roof["gemm_shape"] == [48, 16] and roof["peak_rows"] == 256 and set(roof["flop_rates_by_rows"]) == {"1", "4"}
    assert all(math.isfinite(v) and v > 0 for v in (roof["bandwidth"], roof["flop_rate"], *roof["flop_rates_by_rows"].values()))
    assert roof["dtype"] == "float32" and roof["nominal_bandwidth"] is None and roof["phases"] == []
