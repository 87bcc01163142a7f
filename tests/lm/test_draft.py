"""The feature-level draft (``lm.draft``): its unrolled training steps, the loop's laws with it (SpS,
lossy rules, ragged batch with EOS), its configuration and cache location, and the EAGLE-3 export.
Statistical tests: see ``tests/lm/common.py`` (chi-square at ALPHA = 1e-3, N = 20000, power
asserted)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.lm import ModelPair, speculative_generate
from cactus_theory.lm.draft import DraftConfig
from cactus_theory.stats import goodness_of_fit
from cactus_theory.toy import autoregressive_law, sequence_law
from tests.lm.common import (
    ALPHA,
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
    tiny_head,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("layers", [1, 2])
def test_feature_head_unrolled_steps_equal_sequential_decoding(layers):
    """``unrolled`` (training) computes exactly what the decode loop computes step by step."""
    head = HEAD if layers == 1 else tiny_head(HEAD_VER, seed=3, layers=layers)
    feats = torch.randn(2, 9, 48, generator=torch.Generator().manual_seed(1))
    toks = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = head.fuse([feats])
        outs = head.unrolled(a, toks, 3)
        for b in range(2):
            for j0 in range(9):
                cache = head.new_cache(1, 64)
                g = head.step(a[b:b + 1, :j0 + 1], toks[b:b + 1, :j0 + 1], cache, torch.arange(j0 + 1)[None],
                              j0 + 1)[:, -1:]
                assert torch.allclose(g[0, 0], outs[0][b, j0], atol=1e-5)
                for s in range(2, 4):
                    j = j0 + s - 1
                    if j >= 9:
                        break
                    g = head.step(g, toks[b:b + 1, j:j + 1], cache, torch.tensor([[j]]), j + 1)
                    assert torch.allclose(g[0, 0], outs[s - 1][b, j], atol=1e-4)  # values up to ~20


@pytest.mark.parametrize("compact", [True, False])
def test_feature_draft_sps_gives_the_verifiers_law(compact):
    prompt = [3, 5, 7]
    res = speculative_generate(ModelPair(HEAD, HEAD_VER, None), [prompt] * N, ct.SpS(), k=2, max_new_tokens=3,
                               batch_size=N, seed=6, track_kl=False, compact=compact, **RAW)
    assert_fits(res.tokens, autoregressive_law(cond(HEAD_VER), 3, prompt=tuple(prompt)), 3)
    assert 1 < res.stats.al < 3


@pytest.mark.slow
@pytest.mark.parametrize("rule", [ct.Cactus(0.5), ct.TAS()], ids=repr)
def test_feature_draft_lossy_rules_follow_the_exact_law(rule):
    prompt = [2, 6]
    res = speculative_generate(ModelPair(HEAD, HEAD_VER, None), [prompt] * N, rule, k=2, max_new_tokens=4,
                               batch_size=N, seed=7, track_kl=False, **RAW)
    law = sequence_law(None, cond(HEAD_VER), rule, 2, 4, prompt=tuple(prompt), verifier_first=True,
                       draft_in_block=head_law())
    assert_fits(res.tokens, law, 4)
    ar = autoregressive_law(cond(HEAD_VER), 4, prompt=tuple(prompt))
    assert goodness_of_fit(counts_of(res.tokens, 4), ar, alpha=ALPHA, kind="counts").reject


def test_feature_draft_ragged_batch_and_eos_keep_each_rows_law():
    """Rows of different prompt lengths, finishing at different steps (EOS), share one batch: each
    row's first tokens follow its own exact law (the head's caches and pending entries per row)."""
    prompts = [[6], [3, 5, 7, 1, 2], [2, 9]]
    batch = [prompts[i % 3] for i in range(3 * 2500)]
    rule = ct.Cactus(0.5)
    res = speculative_generate(ModelPair(HEAD, HEAD_VER, None, eos_token_id=EOS), batch, rule, k=2,
                               max_new_tokens=3, batch_size=len(batch), seed=8, track_kl=False, **RAW)
    assert sum(len(t) < 3 for t in res.tokens) > 100  # EOS ends some rows early

    ver, head = cond(HEAD_VER), head_law()

    def absorbing_verifier(n_prompt):  # after EOS the padded output repeats EOS
        return lambda c: np.eye(V)[EOS] if EOS in c[n_prompt:] else ver(c)

    def absorbing_draft(n_prompt):
        return lambda c, d: np.eye(V)[EOS] if EOS in (tuple(c) + tuple(d))[n_prompt:] else head(c, d)

    for j, pr in enumerate(prompts):
        law = sequence_law(None, absorbing_verifier(len(pr)), rule, 2, 3, prompt=tuple(pr), verifier_first=True,
                           draft_in_block=absorbing_draft(len(pr)))
        assert_fits(res.tokens[j::3], law, 3, pad=EOS)


def test_draft_config_and_cache_location(monkeypatch, tmp_path):
    from cactus_theory.lm.draft import MissingDraftError, cache_dir, draft_path, load_draft
    from cactus_theory.lm.pair import load_pair

    with pytest.raises(ValueError, match="shortlist"):
        DraftConfig(shortlist=0)
    with pytest.raises(ValueError, match="loss"):
        DraftConfig(loss="mse")
    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path))
    assert cache_dir() == str(tmp_path)
    a, b = draft_path(DraftConfig()), draft_path(DraftConfig(seed=1))
    assert a != b and a.startswith(str(tmp_path)) and b.startswith(str(tmp_path))
    with pytest.raises(MissingDraftError, match="build-draft"):
        load_draft(VERIFIER, DraftConfig())
    # a library call never builds the draft, and says so before loading any model
    import time

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="cactus-theory build-draft"):
        load_pair("embedded")
    assert time.perf_counter() - t0 < 1.0


def test_eagle3_export_computes_the_same_head(tmp_path):
    """The exported EAGLE-3 folder, read back and run by an independent forward written the way
    vLLM's ``Eagle3LlamaForCausalLM`` computes (separate q/k/v, norms named as there, d2t offsets),
    gives the head's own logits."""
    from safetensors.torch import load_file

    from cactus_theory.lm.draft import export_eagle3

    folder = export_eagle3(HEAD, str(tmp_path / "eagle3"), dtype=torch.float32)
    w = load_file(f"{folder}/model.safetensors")
    import json

    cfg = json.loads((tmp_path / "eagle3" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 8 and cfg["num_hidden_layers"] == 1
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    a = HEAD.args
    emb = HEAD_VER.get_input_embeddings().weight

    def rms(x, g):
        return g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a.norm_eps)

    def vllm_like(aux, ids):  # one sequence, entries 0..T-1, causal attention among them
        T = ids.shape[0]
        h = aux @ w["fc.weight"].T
        e = rms(emb[ids], w["midlayer.input_layernorm.weight"])
        x = torch.cat([e, rms(h, w["midlayer.hidden_norm.weight"])], -1)
        q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(T, a.n_heads, a.head_dim).transpose(0, 1)
        k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(T, a.n_kv_heads, a.head_dim).transpose(0, 1)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(T, a.n_kv_heads, a.head_dim).transpose(0, 1)
        inv = 1.0 / a.rope_theta ** (torch.arange(0, a.head_dim, 2).float() / a.head_dim)
        ang = torch.arange(T).float()[:, None] * inv[None]
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        half = a.head_dim // 2
        rot = lambda t: t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin  # noqa: E731
        q, k = rot(q), rot(k)
        rep = a.n_heads // a.n_kv_heads
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        att = (q @ k.transpose(-1, -2)) / a.head_dim ** 0.5
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), -math.inf).softmax(-1)
        o = (att @ v).transpose(0, 1).reshape(T, -1) @ w["midlayer.self_attn.o_proj.weight"].T
        resid = o + h
        y = rms(resid, w["midlayer.post_attention_layernorm.weight"])
        y = (torch.nn.functional.silu(y @ w["midlayer.mlp.gate_proj.weight"].T) * (y @ w["midlayer.mlp.up_proj.weight"].T)
             ) @ w["midlayer.mlp.down_proj.weight"].T
        logits_s = rms(y + resid, w["norm.weight"]) @ w["lm_head.weight"].T
        full = torch.full((T, a.vocab), -math.inf)
        full[:, torch.arange(a.shortlist) + w["d2t"]] = logits_s
        return full

    aux = torch.randn(6, 48, generator=torch.Generator().manual_seed(3))
    ids = torch.randint(0, V, (6,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        cache = HEAD.new_cache(1, 16)
        g = HEAD.step(HEAD.fuse([aux[None]]), ids[None], cache, torch.arange(6)[None], 6)
        ours = HEAD.full_logits(g[0])
        theirs = vllm_like(aux, ids)
    fin = torch.isfinite(ours)
    assert torch.equal(fin, torch.isfinite(theirs)) and int(fin[0].sum()) == 8
    assert torch.allclose(ours[fin], theirs[fin], atol=1e-4)
    assert w["t2d"].sum() == 8 and w["t2d"].dtype == torch.bool


def test_cast_leaves_the_shared_embedding_alone():
    """``FeatureDraft.cast`` puts the head's own weights in a dtype and leaves the verifier's embedding (shared,
    not the head's) in the verifier's; the cast head still scores a step, in its new dtype."""
    import copy

    verifier = copy.deepcopy(HEAD_VER)
    head = tiny_head(verifier, seed=5)
    embed_dtype = head.embed.weight.dtype
    assert head.cast(torch.bfloat16) is head
    assert head.embed.weight.dtype == embed_dtype == next(verifier.parameters()).dtype
    own = [t for k, t in head.state_dict().items() if not k.startswith("embed.") and t.is_floating_point()]
    assert own and all(t.dtype == torch.bfloat16 for t in own)
    cache = head.new_cache(1, 8)
    g = head.step(torch.zeros(1, 1, head.args.dim, dtype=torch.bfloat16), torch.tensor([[1]]), cache,
                  torch.tensor([[0]]), 1)
    assert g.dtype == torch.bfloat16 and bool(torch.isfinite(g.float()).all())
