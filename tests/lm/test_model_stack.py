"""One model stack: the EAGLE-3-style draft head is built from the verifier's Llama parts
(``LlamaArgs``, attention projections, rotary embedding, ``llama.attend``), the decoding adapters
talk to both cache implementations through one stream interface, and the draft build, its cache
path and loader take the verifier.

The head's numerics are checked against ``_Ref``, a frozen transcription of the head's forward math
in plain tensor operations (explicit softmax attention with repeated key / value heads, the
training-time unrolling with its diagonal terms written out), reading only the saved state dict:
a draft file written in the saved format must keep producing the same outputs.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os

import pytest
import torch

from cactus_theory.lm.cache import open_stream
from cactus_theory.lm.draft import (
    DEFAULT_VERIFIER,
    DEFAULT_VERIFIER_LAYERS,
    FORMAT_VERSION,
    DraftConfig,
    FeatureDraft,
    HeadArgs,
    MissingDraftError,
    draft_path,
    eagle3_aux_layers,
    head_args,
    load_draft,
    verifier_tag,
)
from cactus_theory.lm.llama import Llama, LlamaArgs, attend
from tests.helpers import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")

V = 40
VER = tiny_llama(5, vocab=V, hidden=32, layers=4, scale=2.0)
SHORTLIST = (0, 1, 2, 3, 5, 8, 13, 21, 34, 39)


def random_head(layers: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> FeatureDraft:
    """A random head on ``VER`` (a copy of its embedding) with grouped-query attention (4 query heads,
    2 key / value heads), in ``dtype``."""
    torch.manual_seed(seed)
    a = HeadArgs(dim=32, n_layers=layers, n_heads=4, n_kv_heads=2, head_dim=8, hidden=48, vocab=V,
                 shortlist=len(SHORTLIST), aux_layers=(0, 1, 3), max_positions=64, rope_theta=500.0)
    d = FeatureDraft(a, copy.deepcopy(VER.get_input_embeddings()))
    with torch.no_grad():
        for name, p in d.named_parameters():
            if not name.startswith("embed."):
                p.normal_(0, p.shape[1] ** -0.5) if p.ndim > 1 else p.uniform_(0.5, 1.5)
        d.d2t.copy_(torch.tensor(SHORTLIST))
    return d.to(dtype).eval()


# -- the frozen reference ------------------------------------------------------------------------

class _Ref:
    """The head's forward math on its saved state dict ``sd`` and saved args dict ``a``."""

    def __init__(self, sd: dict, a: dict, embed: torch.Tensor):
        self.sd, self.a, self.E = sd, a, embed

    def norm(self, x, name):
        xf = x.float()
        return self.sd[name + ".weight"] * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.a["norm_eps"]))

    def rope(self, x, pos):
        """x (N, H, T, hd) at positions ``pos`` (T,) or (N, T)."""
        hd = self.a["head_dim"]
        inv = 1.0 / self.a["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        f = pos.float()[..., None] * inv
        emb = torch.cat([f, f], -1)
        cos, sin = emb.cos(), emb.sin()
        if cos.ndim == 3:
            cos, sin = cos[:, None], sin[:, None]
        h = hd // 2
        return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin

    def qkv(self, x, prefix, pos):
        """Queries (N, H, T, hd), keys and values repeated to H heads."""
        H, Hk, hd = self.a["n_heads"], self.a["n_kv_heads"], self.a["head_dim"]
        N, T, _ = x.shape
        q, k, v = (x @ self.sd[prefix + "wqkv.weight"].T).split([H * hd, Hk * hd, Hk * hd], -1)
        q = self.rope(q.view(N, T, H, hd).transpose(1, 2), pos)
        k = self.rope(k.view(N, T, Hk, hd).transpose(1, 2), pos).repeat_interleave(H // Hk, 1)
        v = v.view(N, T, Hk, hd).transpose(1, 2).repeat_interleave(H // Hk, 1)
        return q, k, v

    def out(self, y, prefix):
        N, H, T, hd = y.shape
        return y.transpose(1, 2).reshape(N, T, H * hd) @ self.sd[prefix + "wo.weight"].T

    def mlp(self, x, prefix):
        a, b = (x @ self.sd[prefix + "w13.weight"].T).chunk(2, -1)
        return (torch.nn.functional.silu(a) * b) @ self.sd[prefix + "w2.weight"].T

    def layer_inputs(self, i, feat, tokens, g):
        if i == 0:
            return torch.cat([self.norm(self.E[tokens], "embed_norm"), self.norm(feat, "feat_norm")], -1)
        return self.norm(g, f"blocks.{i - 1}.attn_norm")

    def layer_rest(self, i, g, att):
        p = "" if i == 0 else f"blocks.{i - 1}."
        g = g + self.out(att, p + "attn.")
        return g + self.mlp(self.norm(g, p + ("mlp_norm" if i == 0 else "mlp_norm")), p + "mlp.")

    def logits(self, g):
        return self.norm(g, "norm") @ self.sd["head.weight"].T

    # decode: entries read one block after another, each attending to every entry before it
    def decode(self, blocks):
        """``blocks``: list of (feat (N, W, dim) or None: the previous block's last output, tokens
        (N, W)); block entries take the next positions. Returns each block's outputs (N, W, dim)."""
        past = [([], []) for _ in range(self.a["n_layers"])]
        start, outs = 0, []
        for feat, tokens in blocks:
            if feat is None:
                feat = outs[-1][:, -1:]
            W = tokens.shape[1]
            pos = torch.arange(start, start + W)
            g = feat
            for i in range(self.a["n_layers"]):
                pre = "attn." if i == 0 else f"blocks.{i - 1}.attn."
                q, k, v = self.qkv(self.layer_inputs(i, feat, tokens, g), pre, pos)
                past[i][0].append(k)
                past[i][1].append(v)
                K, Vv = torch.cat(past[i][0], 2), torch.cat(past[i][1], 2)
                sc = q @ K.transpose(-1, -2) / math.sqrt(self.a["head_dim"])
                keys = torch.arange(start + W)
                sc = sc.masked_fill(~(keys[None, :] <= pos[:, None]), -math.inf)
                g = self.layer_rest(i, feat if i == 0 else g, sc.softmax(-1) @ Vv)
            outs.append(g)
            start += W
        return outs

    # training-time test: the draft chains of every entry, their diagonal keys written out
    def unrolled(self, a, tokens, steps):
        T = a.shape[1]
        pos = torch.arange(T)
        kv = [[] for _ in range(self.a["n_layers"])]
        outs, feat = [], a
        for s in range(1, steps + 1):
            g = feat
            for i in range(self.a["n_layers"]):
                pre = "attn." if i == 0 else f"blocks.{i - 1}.attn."
                q, k, v = self.qkv(self.layer_inputs(i, feat, tokens, g), pre, pos)
                kv[i].append((k, v))
                scale = 1 / math.sqrt(self.a["head_dim"])
                sc = (q @ kv[i][0][0].transpose(-1, -2)) * scale
                sc = sc.masked_fill(~(pos[None, :] <= pos[:, None] - (s - 1)), -math.inf)
                diag = [((q * _shift(kv[i][r - 1][0], s - r)) * scale).sum(-1, keepdim=True) for r in range(2, s + 1)]
                w = torch.cat([sc, *diag], -1).softmax(-1)
                y = w[..., :T] @ kv[i][0][1]
                for j, r in enumerate(range(2, s + 1)):
                    y = y + w[..., T + j:T + j + 1] * _shift(kv[i][r - 1][1], s - r)
                g = self.layer_rest(i, feat if i == 0 else g, y)
            outs.append(g)
            feat = _shift(g, 1, 1)
        return outs


def _shift(x, m, dim=2):
    if m == 0:
        return x
    return torch.cat([torch.zeros_like(x.narrow(dim, 0, m)), x.narrow(dim, 0, x.shape[dim] - m)], dim)


# the saved format: the state dict's names and shapes for the head of ``random_head`` (dim 32, 4 / 2
# heads of 8, MLP 48, |S| = 10) with one and with two decoder layers
LAYER0 = {"fc.weight": (32, 96), "embed_norm.weight": (32,), "feat_norm.weight": (32,),
          "attn.wqkv.weight": (64, 64), "attn.wo.weight": (32, 32), "mlp_norm.weight": (32,),
          "mlp.w13.weight": (96, 32), "mlp.w2.weight": (32, 48), "norm.weight": (32,), "head.weight": (10, 32),
          "d2t": (10,)}
BLOCK = {"attn_norm.weight": (32,), "attn.wqkv.weight": (64, 32), "attn.wo.weight": (32, 32),
         "mlp_norm.weight": (32,), "mlp.w13.weight": (96, 32), "mlp.w2.weight": (32, 48)}
SAVED_ARGS = ("dim", "n_heads", "n_kv_heads", "head_dim", "hidden", "vocab", "shortlist", "aux_layers", "n_layers",
              "norm_eps", "rope_theta", "max_positions", "extra")


def saved_blob(head: FeatureDraft) -> dict:
    """The head as a draft file written before the head reused ``LlamaArgs`` (its args dict has exactly
    the fields ``SAVED_ARGS``)."""
    a = head.args
    return {"format": FORMAT_VERSION, "args": {k: getattr(a, k) for k in SAVED_ARGS},
            "state": {k: v.clone() for k, v in head.own_state().items()}, "info": {}}


@pytest.mark.parametrize("layers", [1, 2])
def test_the_saved_format_is_unchanged(layers):
    head = random_head(layers)
    want = dict(LAYER0)
    for i in range(layers - 1):
        want.update({f"blocks.{i}.{k}": s for k, s in BLOCK.items()})
    assert {k: tuple(v.shape) for k, v in head.own_state().items()} == want
    assert set(SAVED_ARGS) <= set(vars(head.args))


def _decode_both(head: FeatureDraft, ref: _Ref, dtype):
    """The head's cached decoding (a prompt block of 11 entries, then 3 single draft steps reading
    its own output) and the reference's: two lists of (3, W, dim)."""
    g = torch.Generator().manual_seed(7)
    feats = [torch.randn(3, 11, 32, generator=g, dtype=dtype) for _ in range(3)]
    toks = torch.randint(0, V, (3, 11), generator=g)
    drafts = torch.randint(0, V, (3, 3), generator=g)
    with torch.no_grad():
        a = head.fuse(feats)
        assert torch.allclose(a, torch.cat(feats, -1) @ ref.sd["fc.weight"].T, rtol=1e-6, atol=0)
        want = ref.decode([(a, toks)] + [(None, drafts[:, j:j + 1]) for j in range(3)])
        cache = head.new_cache(3, 64)
        got = [head.step(a, toks, cache, torch.arange(11).expand(3, 11), 11)]
        for j in range(3):
            got.append(head.step(got[-1][:, -1:], drafts[:, j:j + 1], cache, torch.full((3, 1), 11 + j), 12 + j))
        return got + [head.logits(x) for x in got], want + [ref.logits(y).float() for y in want]


def _rel_diff(got, want) -> float:
    """max |got - want| over max |want| (all tensors of both lists)."""
    return (max((x - y).abs().max().item() for x, y in zip(got, want, strict=True))
            / max(y.abs().max().item() for y in want))


@pytest.mark.parametrize("layers", [1, 2])
def test_a_saved_draft_loads_and_decodes_as_the_reference(layers, tmp_path):
    """Cached decoding of a draft loaded from a file in the saved format equals the frozen reference
    (float32: to 1e-6 of the outputs' scale)."""
    blob = saved_blob(random_head(layers, seed=layers))
    path = tmp_path / "draft.pt"
    torch.save(blob, path)
    head = load_draft(VER, path=str(path))
    ref = _Ref(blob["state"], blob["args"], VER.get_input_embeddings().weight.detach())
    got, want = _decode_both(head, ref, torch.float32)
    assert _rel_diff(got, want) < 1e-6


@pytest.mark.parametrize("layers", [1, 2])
def test_decoding_equals_the_reference_in_float64(layers):
    head = random_head(layers, seed=20 + layers, dtype=torch.float64)
    ref = _Ref(head.own_state(), {k: getattr(head.args, k) for k in SAVED_ARGS}, head.embed.weight.detach())
    got, want = _decode_both(head, ref, torch.float64)
    assert _rel_diff(got, want) < 1e-12


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("layers", [1, 2])
def test_training_time_unrolling_equals_the_reference(layers, dtype, tol):
    head = random_head(layers, seed=10 + layers, dtype=dtype)
    ref = _Ref(head.own_state(), {k: getattr(head.args, k) for k in SAVED_ARGS}, head.embed.weight.detach())
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 13, 32, generator=g, dtype=dtype)
    toks = torch.randint(0, V, (2, 13), generator=g)
    with torch.no_grad():
        got, want = head.unrolled(a, toks, 4), ref.unrolled(a, toks, 4)
    assert _rel_diff(got, want) < tol


def test_attend_is_masked_softmax_attention_with_grouped_heads():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 6, 5, 4, generator=g), torch.randn(2, 3, 7, 4, generator=g), torch.randn(2, 3, 7, 4, generator=g)
    mask = torch.rand(2, 1, 5, 7, generator=g) < 0.6
    mask[..., 0] = True
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    sc = (q @ kr.transpose(-1, -2) / 2.0).masked_fill(~mask, -math.inf)
    assert torch.allclose(attend(q, k, v, mask), sc.softmax(-1) @ vr, atol=1e-6)


def test_the_head_args_are_the_verifiers_llama_args():
    cfg = DraftConfig(shortlist=10, mlp_hidden=48, head_layers=2)
    a = head_args(VER.config, DraftConfig(shortlist=10, mlp_hidden=48, head_layers=2, aux_layers=(0, 1, 3)))
    v = Llama.from_hf(VER).args
    assert isinstance(a, LlamaArgs)
    same = ("dim", "n_heads", "n_kv_heads", "head_dim", "vocab", "norm_eps", "rope_theta", "max_positions")
    assert all(getattr(a, f) == getattr(v, f) for f in same)
    assert (a.n_layers, a.hidden, a.shortlist, a.aux_layers, a.tie_embeddings) == (2, 48, 10, (0, 1, 3), False)
    with pytest.raises(ValueError, match=">= 6 layers"):
        head_args(VER.config, cfg)  # a 4-layer verifier has no default (2, L // 2, L - 3)


# -- one stream interface ------------------------------------------------------------------------

def test_both_streams_follow_one_interface_and_match_full_forwards():
    """Ragged prefill, a block of which rows keep different prefixes, speculative single reads and a
    rewind, on the compact Llama's stream and the Hugging Face stream: each read's logits equal a
    full forward of the row's kept sequence."""
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (5, 8, 3)]
    lens = torch.tensor([5, 8, 3])
    ids = torch.zeros(3, 8, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = torch.tensor(p)
    block = torch.randint(0, V, (3, 4), generator=g)
    keep = torch.tensor([1, 4, 2])
    singles = torch.randint(0, V, (3, 2), generator=g)
    rewind = torch.tensor([2, 0, 1])

    def full(seq):
        with torch.no_grad():
            return VER(input_ids=torch.tensor([seq])).logits[0, -1]

    for model in (Llama.from_hf(VER), VER):
        s = open_stream(model, 3, 40, "cpu", aux_layers=(1,))
        seqs = [list(p) for p in prompts]
        with torch.no_grad():
            logits, aux = s.forward(ids, lens, logits_at=lens - 1)
            s.keep(lens)
            assert torch.equal(s.length, lens) and len(aux) == 1
            assert all(torch.allclose(logits[b, 0], full(seqs[b]), atol=1e-4) for b in range(3))
            logits, _ = s.forward(block)
            s.keep(keep)
            for b in range(3):
                assert torch.allclose(logits[b, keep[b] - 1], full(seqs[b] + block[b, :keep[b]].tolist()), atol=1e-4)
                seqs[b] += block[b, :keep[b]].tolist()
            for j in range(2):
                one = torch.ones(3, dtype=torch.long)
                logits, _ = s.forward(singles[:, j:j + 1], one, logits_at=one - 1)
                s.keep(one)
                for b in range(3):
                    seqs[b].append(int(singles[b, j]))
                    assert torch.allclose(logits[b, 0], full(seqs[b]), atol=1e-4)
            s.rewind(rewind)
            seqs = [sq[:len(sq) - int(r)] for sq, r in zip(seqs, rewind, strict=True)]
            assert s.length.tolist() == [len(sq) for sq in seqs]
            s.select(torch.tensor([2, 0]))
            seqs = [seqs[2], seqs[0]]
            nxt = torch.tensor([[7], [9]])
            logits, _ = s.forward(nxt)
            for b in range(2):
                assert torch.allclose(logits[b, 0], full(seqs[b] + [int(nxt[b, 0])]), atol=1e-4)


def test_the_adapters_do_not_branch_on_the_stream_class():
    import inspect

    from cactus_theory.lm import cache

    for cls in (cache.Target, cache.TokenDrafter):
        src = inspect.getsource(cls)
        assert "_LlamaStream" not in src and "_HFStream" not in src and "isinstance" not in src


# -- the verifier keys the build, the cache path and the loader ----------------------------------

def test_aux_layers_follow_the_verifier_depth():
    assert eagle3_aux_layers(30) == (2, 15, 27)  # SmolLM2-135M: vLLM's low / middle / high layers
    assert eagle3_aux_layers(32) == (2, 16, 29) and eagle3_aux_layers(6) == (2, 3, 3)
    assert DraftConfig().aux_layers is None and DraftConfig().resolved(30).aux_layers == (2, 15, 27)
    assert DraftConfig(aux_layers=[0, 1, 2]).resolved(3).aux_layers == (0, 1, 2)
    for bad in (5, 0, True):
        with pytest.raises(ValueError, match=">= 6 layers"):
            eagle3_aux_layers(bad)
    with pytest.raises(ValueError, match="not all layers"):
        DraftConfig(aux_layers=(0, 1, 9)).resolved(6)
    with pytest.raises(ValueError, match="three layer indices"):
        DraftConfig(aux_layers=(0, 1))


def test_the_default_draft_file_keeps_its_name(monkeypatch, tmp_path):
    """The committed results name ``smollm2-eagle3-v5-S8192-cc6d604f7f.pt``: the key hashes every field
    of the config with the SmolLM2 layers (2, 15, 27)."""
    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path))
    assert DEFAULT_VERIFIER == "smollm2" and DEFAULT_VERIFIER_LAYERS == 30
    fields = {**DraftConfig().__dict__, "aux_layers": [2, 15, 27]}
    key = hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
    assert key == "cc6d604f7f"
    name = "smollm2-eagle3-v5-S8192-cc6d604f7f.pt"
    assert draft_path() == draft_path(DraftConfig(), "smollm2", 30) == str(tmp_path / name)
    assert draft_path(DraftConfig(aux_layers=(2, 15, 27))) == str(tmp_path / name)
    from cactus_theory.lm.pair import embedded_draft_path
    from cactus_theory.lm.train.draft_build import DATA_FIELDS, data_path

    assert embedded_draft_path() == str(tmp_path / name)
    dkey = hashlib.sha1(json.dumps({f: fields[f] for f in DATA_FIELDS}, sort_keys=True).encode()).hexdigest()[:10]
    assert data_path(DraftConfig().resolved(30)) == str(tmp_path / f"smollm2-draft-data-v5-{dkey}.pt")


def test_another_verifier_keys_the_file_and_the_pair(monkeypatch, tmp_path):
    """A tiny Llama folder as the verifier: the draft file is named after it and its depth, the pair
    loads it under the verifier's name, and the loaded head decodes as the reference."""
    from cactus_theory.lm.pair import embedded_draft_path, load_pair, model_depth

    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path / "cache"))
    ver = tiny_llama(8, vocab=V, hidden=32, layers=8, scale=2.0)
    folder = str(tmp_path / "tiny-verifier")
    ver.save_pretrained(folder)
    assert model_depth(folder) == 8
    path = embedded_draft_path(folder)
    assert os.path.basename(path).startswith(verifier_tag(folder) + "-eagle3-v5-S8192-")
    assert verifier_tag(folder).startswith("tiny-verifier-") and path != draft_path()
    assert path == draft_path(DraftConfig(aux_layers=(2, 4, 5)), folder)  # (2, 8 // 2, 8 - 3)
    with pytest.raises(ValueError, match="needs its depth"):
        draft_path(DraftConfig(), folder)
    with pytest.raises(MissingDraftError):
        load_pair("embedded", folder)
    from transformers import AutoModelForCausalLM

    from cactus_theory.lm import pair as pair_module

    # the folder has no tokenizer: load the model alone
    monkeypatch.setattr(pair_module, "load_model", lambda spec, dtype=torch.float32: (
        AutoModelForCausalLM.from_pretrained(spec).eval(), None))
    head = FeatureDraft(head_args(ver.config, DraftConfig(shortlist=10, mlp_hidden=48)), ver.get_input_embeddings())
    assert head.args.aux_layers == (2, 4, 5) and head.args.n_layers == 1
    with torch.no_grad():
        for name, p in head.named_parameters():
            if not name.startswith("embed."):
                p.normal_(0, p.shape[1] ** -0.5) if p.ndim > 1 else p.uniform_(0.5, 1.5)
        head.d2t.copy_(torch.tensor(SHORTLIST))
    blob = saved_blob(head)
    os.makedirs(os.path.dirname(path))
    torch.save(blob, path)
    pair = load_pair("embedded", folder)
    assert pair.name == f"{folder}+embedded-draft"
    assert isinstance(pair.draft, FeatureDraft) and pair.draft.args.aux_layers == (2, 4, 5)
    ref = _Ref(blob["state"], blob["args"], pair.verifier.get_input_embeddings().weight.detach())
    a = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(0))
    toks = torch.randint(0, V, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = pair.draft.step(a, toks, pair.draft.new_cache(1, 16), torch.arange(6)[None], 6)
        assert _rel_diff([got], ref.decode([(a, toks)])) < 1e-6
    with pytest.raises(ValueError, match="not for this one"):
        load_draft(VER, path=path)  # a 4-layer verifier has no layer 5


def test_build_draft_takes_the_verifier():
    import argparse

    from cactus_theory.lm.train import draft_build

    p = argparse.ArgumentParser()
    draft_build.configure(p)
    assert p.parse_args([]).verifier == "smollm2"
    args = p.parse_args(["--verifier", "./no/such/folder"])
    with pytest.raises(ValueError, match="--verifier"):
        draft_build.check(args)


def test_the_default_verifier_depth_is_the_one_its_file_name_uses():
    from cactus_theory.lm.pair import model_depth

    assert model_depth("smollm2") == DEFAULT_VERIFIER_LAYERS
