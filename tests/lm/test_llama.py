"""The compact Llama (``lm.llama``) computes the Hugging Face function, with its cache."""

from __future__ import annotations

import pytest
import torch

from cactus_theory.lm.llama import Llama
from tests.lm.common import V, tiny

pytestmark = pytest.mark.usefixtures("one_thread")


def test_compact_llama_computes_the_hf_function():
    ver = tiny(9, layers=3, scale=2.0)
    m = Llama.from_hf(ver)
    ids = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = ver(input_ids=ids, output_hidden_states=True)
        cache = m.new_cache(3, 32)
        logits, aux = m(ids, torch.zeros(3, dtype=torch.long), cache, aux_layers=(0, 2))
        assert torch.allclose(logits, out.logits, atol=1e-5)
        assert all(torch.allclose(a, out.hidden_states[i], atol=1e-5) for a, i in zip(aux, (0, 2), strict=True))
        # one feature per aux_layers entry, in its order, as the Hugging Face stream reads them: a layer listed
        # twice (eagle3_aux_layers(6) = (2, 3, 3)) and an unsorted list
        for layers in ((1, 2, 2), (2, 0, 1)):
            _, aux = m(ids, torch.zeros(3, dtype=torch.long), m.new_cache(3, 32), aux_layers=layers)
            assert len(aux) == 3
            assert all(torch.allclose(a, out.hidden_states[i], atol=1e-5) for a, i in zip(aux, layers, strict=True))
        # rows at different offsets, a stale speculative block overwritten in place
        cache = m.new_cache(3, 32)
        m(ids[:, :6], torch.zeros(3, dtype=torch.long), cache)
        m(torch.randint(0, V, (3, 4)), torch.full((3,), 6), cache)  # rejected drafts
        step, _ = m(ids[:, 6:10], torch.full((3,), 6), cache)
        assert torch.allclose(step, out.logits[:, 6:10], atol=1e-5)
        last, _ = m(ids[:, 6:10], torch.full((3,), 6), cache, logits_at=torch.tensor([0, 3, 1]))
        assert torch.allclose(last[:, 0], out.logits[[0, 1, 2], [6, 9, 7]], atol=1e-5)


def _ancestors(par: list[int], j: int) -> list[int]:
    out = []
    while j >= 0:
        out.append(j)
        j = par[j]
    return out[::-1]


def test_tree_forward_scores_every_node_as_its_own_sequence_and_keeps_a_path():
    """``forward_tree`` on ragged rows (different prefix lengths, different random trees per row, read in
    two chunks over stale slots): each node's logits equal a plain forward of prefix + its root-to-node
    path (float64, fresh cache); after ``keep_path`` the next block's logits equal a plain forward of
    the new sequence."""
    m = Llama.from_hf(tiny(9, layers=3, scale=2.0), dtype=torch.float64)
    g = torch.Generator().manual_seed(3)
    B, N = 3, 7
    lens = torch.tensor([2, 5, 3])
    prefix = torch.randint(0, V, (B, 5), generator=g)
    parents = torch.tensor([[-1, -1, 0, 0, 1, 2, 5], [-1, 0, 1, 2, 3, 4, 5], [-1, -1, -1, 0, 3, 3, 1]])
    tokens = torch.randint(0, V, (B, N), generator=g)

    def plain(seq: list[int]) -> torch.Tensor:
        c = m.new_cache(1, 32)
        return m(torch.tensor([seq]), torch.zeros(1, dtype=torch.long), c)[0][0, -1]

    with torch.no_grad():
        cache = m.new_cache(B, 32)
        m(prefix, torch.zeros(B, dtype=torch.long), cache)  # right-padded: slots past lens are stale
        m(torch.randint(0, V, (B, 9), generator=g), lens, cache)  # a rejected block: stale slots
        first, _ = m.forward_tree(tokens[:, :3], parents, lens, cache, lo=0)
        second, _ = m.forward_tree(tokens[:, 3:], parents, lens, cache, lo=3)
        logits = torch.cat([first, second], 1)
        err = 0.0
        for b in range(B):
            pre = prefix[b, :lens[b]].tolist()
            for j in range(N):
                path = _ancestors(parents[b].tolist(), j)
                ref = plain(pre + tokens[b, path].tolist())
                err = max(err, float((logits[b, j] - ref).abs().max()))
        assert err < 1e-10, err
        at, _ = m.forward_tree(tokens, parents, lens, cache, logits_at=torch.tensor([6, 0, 4]))
        assert float((at[:, 0] - logits[[0, 1, 2], [6, 0, 4]]).abs().max()) < 1e-10
        # keep one root-to-node path per row (lengths 3, 2, 0), then read two new tokens after it
        paths = [_ancestors(parents[0].tolist(), 5), _ancestors(parents[1].tolist(), 1), []]
        nodes = torch.full((B, N), -1)
        for b, pth in enumerate(paths):
            nodes[b, :len(pth)] = torch.tensor(pth, dtype=torch.long)
        cache.keep_path(lens, nodes)
        kept = torch.tensor([len(pth) for pth in paths])
        nxt = torch.randint(0, V, (B, 2), generator=g)
        step, _ = m(nxt, lens + kept, cache)
        for b, pth in enumerate(paths):
            seq = prefix[b, :lens[b]].tolist() + tokens[b, pth].tolist()
            for i in range(2):
                ref = plain(seq + nxt[b, :i + 1].tolist())
                err = max(err, float((step[b, i] - ref).abs().max()))
        assert err < 1e-10, err


def test_a_model_the_compact_llama_does_not_reproduce_runs_as_given_and_is_announced_once():
    """runtime_models never takes the slower Hugging Face path silently: a Llama with an activation the
    compact Llama lacks runs as given with one RuntimeWarning naming the reason (not one per call), and a
    supported Llama is converted without a warning."""
    import warnings

    from transformers import LlamaConfig, LlamaForCausalLM

    from cactus_theory.lm.llama import Llama
    from cactus_theory.lm.loop import runtime_models
    from cactus_theory.lm.pair import ModelPair

    cfg = LlamaConfig(vocab_size=10, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=32, hidden_act="gelu",
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    gelu = LlamaForCausalLM(cfg).eval()
    pair = ModelPair(draft=gelu, verifier=gelu)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            draft, verifier = runtime_models(pair)
            assert draft is gelu and verifier is gelu
    told = [w for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(told) == 1 and "not the compact Llama" in str(told[0].message) and "'gelu'" in str(told[0].message)

    ok = ModelPair(draft=tiny(0), verifier=tiny(1))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        draft, verifier = runtime_models(ok)
    assert isinstance(draft, Llama) and isinstance(verifier, Llama)
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)]
