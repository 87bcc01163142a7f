"""The lean CPU step is the loop's default (``ModelPair.lean``, ``lm.loop.lean_step``): every entry point runs
the same prepacked runtime modules, a feature draft in the run's dtype, one opt-out; a packed copy never goes
stale. The laws under the lean step are the loop's exact-law tests (tests/lm/test_loop.py and the others run
with the default); here: what runs, against a direct look at the modules, and the packed map against
``F.linear`` after every change a user can make to a weight."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cactus_theory.core.tree import branching_parents
from cactus_theory.lm import ModelPair
from cactus_theory.lm.loop import (
    autoregressive_generate,
    runtime_models,
    speculative_generate,
    tree_generate,
)
from cactus_theory.lm.packed import PackedLinear
from tests.lm.common import RAW, tiny, tiny_head

PROMPTS = [[1, 2, 3], [5, 6]]


def _linears(module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def _fresh(lean: bool = True, **kw) -> ModelPair:
    return ModelPair(tiny(1), tiny(2), None, lean=lean, **kw)


@pytest.mark.parametrize("entry", ["speculative", "autoregressive", "tree"])
def test_every_entry_point_runs_the_lean_step(entry):
    pair = _fresh()
    run = {"speculative": lambda p: speculative_generate(p, PROMPTS, "sps", k=2, max_new_tokens=4, **RAW),
           "autoregressive": lambda p: autoregressive_generate(p, PROMPTS, max_new_tokens=4, **RAW),
           "tree": lambda p: tree_generate(p, PROMPTS, "sps", branching_parents((2,)), max_new_tokens=4, **RAW)}[entry]
    run(pair)
    draft, verifier = runtime_models(pair)
    assert pair.lean_state.startswith("lean (prepacked")
    for m in (draft, verifier):
        lin = _linears(m)
        assert lin and all(isinstance(x, PackedLinear) for x in lin)
    # the user's Hugging Face modules are never reshaped: the compact copies are
    assert not any(isinstance(x, PackedLinear) for x in _linears(pair.verifier) + _linears(pair.draft))


def test_lean_false_is_the_one_opt_out():
    pair = _fresh(lean=False)
    speculative_generate(pair, PROMPTS, "sps", k=2, max_new_tokens=4, **RAW)
    draft, verifier = runtime_models(pair)
    assert "lean_state" not in pair.__dict__
    assert not any(isinstance(x, PackedLinear) for x in _linears(draft) + _linears(verifier))


def test_a_feature_draft_runs_in_the_verifiers_dtype_unless_told():
    ver = tiny(12, layers=3, scale=3.0).to(torch.bfloat16)
    pair = ModelPair(tiny_head(ver), ver, None)
    assert pair.draft.dtype == torch.float32  # as built
    draft, _ = runtime_models(pair)
    assert draft.dtype == torch.bfloat16 and "draft in bfloat16" in pair.lean_state
    assert pair.draft.embed.weight.dtype == torch.bfloat16  # the shared embedding is the verifier's, untouched
    ver2 = tiny(12, layers=3, scale=3.0).to(torch.bfloat16)
    kept = ModelPair(tiny_head(ver2), ver2, None, draft_dtype=torch.float32)
    draft2, _ = runtime_models(kept)
    assert draft2.dtype == torch.float32 and "draft in float32" in kept.lean_state


def test_a_float64_pair_is_not_lean_and_says_why():
    pair = ModelPair(tiny(1).double(), tiny(2).double(), None)
    out = speculative_generate(pair, PROMPTS, "sps", k=2, max_new_tokens=3, **RAW)
    assert pair.lean_state.startswith("not lean (oneDNN packs") and "float64" in pair.lean_state
    assert len(out.tokens) == 2


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_lean_must_be_a_bool(bad):
    with pytest.raises(TypeError, match="lean must be True or False"):
        ModelPair(tiny(1), tiny(2), None, lean=bad)
    with pytest.raises(TypeError, match="draft_dtype"):
        ModelPair(tiny(1), tiny(2), None, draft_dtype="bfloat16")


def _packed(seed: int = 0) -> tuple[PackedLinear, nn.Linear]:
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(12, 7).requires_grad_(False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(7, 12, generator=g))
        lin.bias.copy_(torch.randn(7, generator=g))
    return PackedLinear(copy.deepcopy(lin)), lin


def test_a_packed_map_follows_its_weight():
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(1))
    pk, _ = _packed()
    with torch.no_grad():  # an in-place update after packing
        pk.weight.mul_(-2.0)
    torch.testing.assert_close(pk(x), F.linear(x, pk.weight, pk.bias), rtol=1e-5, atol=1e-5)
    pk.to(torch.float64)  # a dtype oneDNN does not pack: the plain product, in that dtype
    y = pk(x.double())
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, F.linear(x.double(), pk.weight, pk.bias))
    pk.to(torch.bfloat16)  # packed again in the new dtype
    xb = x.to(torch.bfloat16)
    torch.testing.assert_close(pk(xb).float(), F.linear(xb, pk.weight, pk.bias).float(), rtol=2 ** -7, atol=1e-2)


def test_a_packed_map_keeps_gradients():
    pk, lin = _packed(2)
    pk.requires_grad_(True)
    lin.requires_grad_(True)
    x = torch.randn(4, 12, generator=torch.Generator().manual_seed(3))
    pk(x).square().sum().backward()
    lin(x).square().sum().backward()
    torch.testing.assert_close(pk.weight.grad, lin.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pk.bias.grad, lin.bias.grad, rtol=1e-5, atol=1e-5)
