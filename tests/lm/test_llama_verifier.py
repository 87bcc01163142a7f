"""Another Llama verifier than SmolLM2 (issue 29 item 6): a tiny random Llama saved as a model folder with a
tiny word-level tokenizer beside it, and a draft made for it (``FeatureDraft`` + ``init_head``, written by
``save_draft``), run through ``cactus-theory decode`` and ``cactus-theory eval`` with ``--draft embedded``,
from the cache (``$CACTUS_THEORY_CACHE``) and from ``--draft-path``; the eval's cache key names the
verifier; bad arguments still fail before a model loads; the draft build refuses a verifier that is not
a Llama before any data work. No download."""

from __future__ import annotations

import argparse
import json
import os

import pytest
import torch

from cactus_theory import cli
from cactus_theory.lm.draft import (
    DraftConfig,
    FeatureDraft,
    MissingDraftError,
    head_args,
    load_draft,
    save_draft,
)
from tests.helpers import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["<eos>", "[UNK]", "user:", "bot:"] + [f"w{i}" for i in range(28)]
V = len(WORDS)  # 32: the tokenizer's ids are the model's vocabulary
LAYERS = 6  # the default aux_layers (2, L // 2, L - 3) need >= 6: the draft file's default name applies


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", unk_token="[UNK]",
        chat_template="{% for m in messages %}user: {{ m['content'] }} {% endfor %}"
                      "{% if add_generation_prompt %}bot:{% endif %}")


@pytest.fixture(scope="module")
def verifier_folder(tmp_path_factory) -> str:
    """A tiny Llama (6 layers) and its tokenizer, saved into one folder as ``save_pretrained`` writes them."""
    folder = str(tmp_path_factory.mktemp("llama") / "tiny-llama")
    tiny_llama(21, vocab=V, hidden=32, layers=LAYERS, ctx=128, scale=2.0).save_pretrained(folder)
    _tokenizer().save_pretrained(folder)
    return folder


def _make_draft(folder: str, path: str) -> FeatureDraft:
    """The project's draft for the verifier in ``folder``, initialised from it (``init_head``), saved at ``path``."""
    from cactus_theory.lm.pair import load_model
    from cactus_theory.lm.train.draft_build import init_head

    ver, _ = load_model(folder)
    draft = FeatureDraft(head_args(ver.config, DraftConfig(shortlist=24, mlp_hidden=48)), ver.get_input_embeddings())
    init_head(draft, ver, torch.arange(24))
    with torch.no_grad():  # the initial layer outputs are zero: give them weight so the head reads its input
        draft.attn.wo.weight.normal_(0, 0.2, generator=torch.Generator().manual_seed(1))
    save_draft(draft, path, {"made_by": "test"})
    return draft


@pytest.fixture(scope="module")
def draft_file(verifier_folder, tmp_path_factory) -> tuple[str, FeatureDraft]:
    path = str(tmp_path_factory.mktemp("draft") / "tiny-draft.pt")
    return path, _make_draft(verifier_folder, path)


def test_the_saved_draft_loads_as_it_was_saved(verifier_folder, draft_file):
    from cactus_theory.lm.pair import load_model

    path, draft = draft_file
    ver, _ = load_model(verifier_folder)
    got = load_draft(ver, path=path, spec=verifier_folder)
    assert got.args == draft.args and got.args.aux_layers == (2, 3, 3) and got.info == {"made_by": "test"}
    mine = got.own_state()
    assert mine.keys() == draft.own_state().keys()
    assert all(torch.equal(mine[k], v) for k, v in draft.own_state().items())
    assert torch.equal(got.head.weight, ver.lm_head.weight[:24]) and torch.equal(got.norm.weight, ver.model.norm.weight)


@pytest.mark.parametrize("from_cache", [True, False])
def test_decode_runs_another_llama_verifier_with_its_draft(from_cache, verifier_folder, draft_file, tmp_path,
                                                            monkeypatch, capsys):
    """``cactus-theory decode --verifier FOLDER --draft embedded [--draft-path D]`` loads the draft built for
    that verifier and decodes."""
    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path / "empty"))
    extra = ["--draft-path", draft_file[0]]
    if from_cache:
        path = _cache(verifier_folder, draft_file[0], tmp_path, monkeypatch)
        extra = []
    out = tmp_path / "stats.json"
    rc = cli.main(["decode", "--verifier", verifier_folder, "--draft", "embedded", *extra, "--prompt", "w1 w2 w3",
                   "--prompt", "w4", "--max-new-tokens", "6", "-k", "3", "--no-warmup", "--json", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    blob = json.loads(out.read_text())
    name = "embedded-draft" if from_cache else os.path.basename(draft_file[0])
    assert blob["pair"] == f"{verifier_folder}+{name}"
    assert blob["speculative"]["new_tokens"] > 0 and blob["speculative"]["drafted"] > 0
    assert len(blob["texts"]) == 2
    if from_cache:
        assert os.path.isfile(path)


def _cache(folder: str, src: str, tmp_path, monkeypatch) -> str:
    import shutil

    from cactus_theory.lm.pair import embedded_draft_path

    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path / "cache"))
    path = embedded_draft_path(folder)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    shutil.copyfile(src, path)
    return path


def _eval_args(argv: list[str], out) -> argparse.Namespace:
    from cactus_theory.lm.experiments import replicated as rp

    p = argparse.ArgumentParser()
    rp.configure(p)
    return p.parse_args(argv + ["--out", str(out)])


def test_eval_takes_another_llama_verifier_and_keys_its_cache_by_it(verifier_folder, draft_file, tmp_path,
                                                                     monkeypatch):
    """The eval's checks accept ``--verifier FOLDER --draft embedded`` (cached, or with ``--draft-path``); the
    pair id (the cache key) names the verifier and its draft file; the eval pair's draft drives
    ``speculative_generate``."""
    from cactus_theory.core import registry
    from cactus_theory.lm.experiments import replicated as rp
    from cactus_theory.lm.experiments.eval import load_eval_pair, pair_id
    from cactus_theory.lm.loop import speculative_generate

    path = _cache(verifier_folder, draft_file[0], tmp_path, monkeypatch)
    for extra in ([], ["--draft-path", draft_file[0]]):
        rp.check(_eval_args(["--verifier", verifier_folder, "--draft", "embedded", *extra, "--questions", "2"],
                            tmp_path / "out"))
    pid = pair_id("embedded", verifier_folder)
    assert pid == f"embedded:{os.path.basename(path)}->{verifier_folder}"
    assert os.path.basename(path).startswith("tiny-llama-")
    smollm2 = pair_id("embedded", "smollm2")
    assert smollm2.startswith("embedded:smollm2-eagle3-") and smollm2.endswith("->smollm2") and smollm2 != pid
    assert pair_id("embedded", verifier_folder, draft_file[0]) == f"embedded:tiny-draft.pt->{verifier_folder}"
    for draft_path in (None, draft_file[0]):
        pair = load_eval_pair("embedded", verifier_folder, draft_path)
        assert isinstance(pair.draft, FeatureDraft) and pair.draft.args.aux_layers == (2, 3, 3)
        assert all(torch.equal(pair.draft.own_state()[k], v) for k, v in draft_file[1].own_state().items())
        res = speculative_generate(pair, ["w1 w2 w3", "w5"], registry.make("sps"), k=3, max_new_tokens=6, seed=0,
                                   batch_size=2)
        assert res.stats.drafted > 0 and res.stats.new_tokens > 0 and len(res.texts) == 2


def test_eval_runs_another_llama_verifier(verifier_folder, draft_file, tmp_path, monkeypatch, capsys):
    """``cactus-theory eval --verifier FOLDER --draft embedded --draft-path D --calibrate-only`` (a deviating
    pilot: 2 questions, SpS and the verifier alone, no trees, 4 tokens) decodes its first batches, cached under
    the verifier's pair id."""
    from cactus_theory.lm.experiments.eval import pair_id

    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path / "empty"))
    out = tmp_path / "out"
    rc = cli.main(["eval", "--verifier", verifier_folder, "--draft", "embedded", "--draft-path", draft_file[0],
                   "--tasks", "arith", "--questions", "2", "--replicates", "1", "--rules", "sps", "--tree",
                   "--max-new-tokens", "4", "--batch-size", "2", "--no-progress", "--calibrate-only", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    [config] = (out / "cache").glob("*/config.json")
    assert json.loads(config.read_text())["pair"] == pair_id("embedded", verifier_folder, draft_file[0])
    [sps] = config.parent.glob("arith/SpS-*/b00000.json")
    assert sum(r["drafted"] for r in json.loads(sps.read_text())["records"]) > 0


@pytest.mark.parametrize("argv, msg", [
    (["--draft-path", "/no/such/file.pt"], "draft-path"),
    (["--draft-path", "TEXT"], "not a draft checkpoint"),
    (["--draft", "smollm2", "--draft-path", "DRAFT"], "goes with --draft embedded"),
])
@pytest.mark.parametrize("command", ["eval", "decode"])
def test_bad_draft_arguments_fail_before_models_load(command, argv, msg, verifier_folder, draft_file, tmp_path,
                                                     monkeypatch, capsys):
    from cactus_theory.cli import lm as cli_lm
    from cactus_theory.lm import pair as pair_module
    from cactus_theory.lm.experiments import eval as legacy

    for mod, name in ((legacy, "load_eval_pair"), (cli_lm, "_load"), (pair_module, "load_model")):
        monkeypatch.setattr(mod, name, lambda *a, **k: pytest.fail("a model was loaded"))
    text = tmp_path / "notes.txt"
    text.write_text("not a draft")
    argv = [{"TEXT": str(text), "DRAFT": draft_file[0]}.get(a, a) for a in argv]
    rest = ["--prompt", "w1"] if command == "decode" else ["--questions", "2", "--out", str(tmp_path / "out")]
    rc = cli.main([command, "--verifier", verifier_folder, *argv, *rest])
    assert rc == 2 and msg in capsys.readouterr().err


def test_a_missing_draft_of_another_verifier_is_named_before_its_weights_load(verifier_folder, tmp_path,
                                                                               monkeypatch, capsys):
    """Its draft's file name needs the verifier's depth: read from its config, then refused before the weights
    load, by ``eval`` and ``decode`` alike, naming the build command for that verifier."""
    from cactus_theory.lm import pair as pair_module

    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(pair_module, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    for argv in (["eval", "--questions", "2", "--out", str(tmp_path / "out")], ["decode", "--prompt", "w1"]):
        rc = cli.main([argv[0], "--verifier", verifier_folder, "--draft", "embedded", *argv[1:]])
        err = capsys.readouterr().err
        assert rc == 2 and "not built yet" in err and f"build-draft --verifier {verifier_folder}" in err
    with pytest.raises(MissingDraftError):
        pair_module.load_pair("embedded", verifier_folder)


def test_the_draft_build_refuses_a_verifier_that_is_not_a_llama(tmp_path, monkeypatch):
    """A GPT-2 verifier: ``build_draft`` names the reason before any data work, and ``init_head`` refuses it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from cactus_theory.lm import data
    from cactus_theory.lm.train import draft_build

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=64, n_embd=16, n_layer=6, n_head=2)).eval()
    for mod, name in ((data, "training_prompts"), (data, "wiki_answers"), (draft_build, "collect_onpolicy"),
                      (draft_build, "collect_forced")):
        monkeypatch.setattr(mod, name, lambda *a, **k: pytest.fail("data work began"))
    out = tmp_path / "d.pt"
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel is not a Hugging Face Llama .*not a Llama model "
                                         r"\(model_type 'gpt2'\)"):
        draft_build.build_draft(DraftConfig(shortlist=8), path=str(out), progress=False, verifier=gpt2,
                                tokenizer=_tokenizer())
    assert os.listdir(tmp_path) == []
    llama = tiny_llama(3, vocab=V, hidden=16, layers=LAYERS)
    draft = FeatureDraft(head_args(llama.config, DraftConfig(shortlist=8, mlp_hidden=16)), llama.get_input_embeddings())
    with pytest.raises(ValueError, match="not a Llama model"):
        draft_build.init_head(draft, gpt2, torch.arange(8))
