"""``lm.packed``: a prepacked linear map computes ``x W^T`` (against a float64 product, at each dtype's
rounding), keeps a tied LM head tied, leaves the roofline's byte and FLOP counts as they were, and a
prepacked compact Llama scores a block as the plain one does; bad arguments are refused by name."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cactus_theory.lm.llama import Llama
from cactus_theory.lm.packed import PackedLinear, can_prepack, prepack
from cactus_theory.lm.roofline import verifier_forward_cost
from tests.lm.common import tiny

# float32: a few ulps of the row's scale; bfloat16: the output is rounded to 8 bits of mantissa (2^-8 relative)
TOL = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 5, 17, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_is_the_product(dtype, rows, bias):
    g = torch.Generator().manual_seed(rows)
    lin = nn.Linear(40, 24, bias=bias).to(dtype).requires_grad_(False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(24, 40, generator=g))
        if bias:
            lin.bias.copy_(torch.randn(24, generator=g))
    x = torch.randn(2, rows, 40, generator=g).to(dtype)
    exact = x.double() @ lin.weight.double().T + (lin.bias.double() if bias else 0)
    got = PackedLinear(copy.deepcopy(lin), rows=1)(x)
    assert got.shape == (2, rows, 24) and got.dtype == dtype
    scale = (x.double().abs() @ lin.weight.double().abs().T).amax() + 1
    assert float((got.double() - exact).abs().max()) <= TOL[dtype] * float(scale)
    plain = F.linear(x, lin.weight, lin.bias)  # the same GEMM family: no farther from the exact product
    assert float((got.double() - exact).abs().max()) <= 2 * float((plain.double() - exact).abs().max()) + 1e-6 * float(scale)


def test_prepack_keeps_the_model():
    model = Llama.from_hf(tiny(0))
    with torch.no_grad():  # tie the head, as SmolLM2's is
        model.head.weight = model.embed.weight
    plain = copy.deepcopy(model)
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    before = verifier_forward_cost(model, 5, 20)
    assert prepack(model) == n_linear and prepack(model) == 0  # idempotent
    assert all(isinstance(m, PackedLinear) for m in model.modules() if isinstance(m, nn.Linear))
    assert model.head.weight is model.embed.weight  # a tied head stays tied
    assert verifier_forward_cost(model, 5, 20) == before
    ids = torch.randint(0, model.args.vocab, (3, 9), generator=torch.Generator().manual_seed(1))
    start = torch.zeros(3, dtype=torch.long)
    with torch.inference_mode():
        a, _ = plain(ids, start, plain.new_cache(3, 16))
        b, _ = model(ids, start, model.new_cache(3, 16))
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_this_build_can_prepack():
    assert can_prepack("cpu") is None  # CPU torch builds ship oneDNN; the benchmark's default relies on it


def test_bad_arguments():
    with pytest.raises(ValueError, match="rows"):
        PackedLinear(nn.Linear(4, 4), rows=0)
    with pytest.raises(ValueError, match="rows"):
        prepack(nn.Sequential(nn.Linear(4, 4)), rows=True)
    assert "CPU" in can_prepack("meta")
    with pytest.raises(ValueError, match="cannot prepack"):
        prepack(nn.Linear(4, 4, device="meta"))
