"""The llama.cpp engine against llama.cpp itself (``make test-llamacpp``: build/venv-llamacpp, minutes; not part of
``make test``, whose Python has no llama-cpp-python). What the cheap tests (tests/integrations/test_llamacpp.py)
replay in plain Python is checked here against the binding: its prompt lookup, its sampling law, which draws its
speculative ``generate`` makes after an accepted draft; then the engine through ``check_generation`` (speculation
against none, no difference at alpha 1e-3; the planted bug caught), the CLI end to end, the GGUF conversion against
the project's own loading of the same file, and the prototype over llama.cpp's forwards (its cache rollback exact,
SpS over lookup drafts against our plain sampling over the same forwards).

Every statistical check has a fixed seed and alpha 1e-3; the sizes are stated where they are asserted."""

from __future__ import annotations

import json

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: make llamacpp-env")  # noqa: F841

import torch  # noqa: E402

from cactus_theory.core.rules import SpS  # noqa: E402
from cactus_theory.core.sampling import SAMPLING  # noqa: E402
from cactus_theory.integrations import engines as E  # noqa: E402
from cactus_theory.integrations import llamacpp as L  # noqa: E402
from cactus_theory.theory.check_generation import check_generation  # noqa: E402
from cactus_theory.theory.stats import goodness_of_fit  # noqa: E402

ALPHA = 1e-3
PROMPT = "Write one sentence about the sea."


@pytest.fixture(scope="module")
def path():
    return L.gguf_path("smollm2")


@pytest.fixture(scope="module")
def ids():
    from cactus_theory.lm.data import encode_prompts

    return encode_prompts(L.tokenizer_for("smollm2"), [PROMPT], chat=True)[0]


def _engine(path, k=4, max_new=12, plant_temperature=1.0):
    return L.LlamaCppEngine(path, k, max_new, SAMPLING.temperature, SAMPLING.top_k, SAMPLING.top_p, 1, plant_temperature)


def test_lookup_matches_the_binding():
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    rng = np.random.default_rng(0)
    for _ in range(300):
        ctx = rng.integers(0, 6, rng.integers(1, 30)).tolist()
        k = int(rng.integers(1, 6))
        theirs = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=k)(np.array(ctx, dtype=np.intc))
        assert L.lookup_drafts(ctx, k) == [int(t) for t in theirs], ctx


def test_llamacpp_law_is_the_binding_sampler(path, ids):
    """3,000 first tokens drawn by llama.cpp's chain (distinct seeds) follow ``llamacpp_law`` of its logits (Pearson,
    alpha 1e-3); the project's order (temperature first) is a different law on this row, stated as a TV."""
    eng = _engine(path, max_new=1)
    draws = eng.generate([ids], 3000, 0, "plain")
    law = L.llamacpp_law(eng.logits_at(ids), SAMPLING.temperature, SAMPLING.top_k, SAMPLING.top_p)
    res = goodness_of_fit(np.array([d[0] for d in draws]), law, alpha=ALPHA, kind="samples")
    eng.close()
    assert res.pvalue > ALPHA, res


def test_planted_draws_are_the_replayed_ones(path, ids):
    """The planted Llama's draws made with the planted chain are exactly those ``planted_positions`` replays."""
    eng = _engine(path, k=3, max_new=24, plant_temperature=1.5)
    llm = eng._open("planted", len(ids) + 24 + 3 + 8)
    logged = []
    real = type(llm).sample

    def sample(self, *a, idx=None, **kw):
        t = real(self, *a, idx=idx, **kw)
        logged.append(idx is not None and self._first_draw is not None and idx > self._first_draw)
        return t

    type(llm).sample = sample
    try:
        acting = 0
        for seed in range(20):
            logged.clear()
            toks = eng.decode(llm, ids, seed)
            want = L.planted_positions(ids, toks, lambda c: L.lookup_drafts(c, 3))
            assert logged[:len(toks)] == want, (seed, toks)
            acting += sum(want)
        assert acting > 0  # the bug did act on these decodes
    finally:
        type(llm).sample = real
        eng.close()


def test_engine_speculation_holds_and_the_planted_bug_is_caught(path):
    """llama.cpp's prompt lookup against no speculation: no difference at alpha 1e-3 (400 decodes of one prompt per
    side, positions 0-11); the planted bug at T' = 3 (its size stated by ``plant_size``: it must act at some compared
    prefix, else this design cannot show anything) through the same check at the same n against the same plain
    decodes: rejected."""
    opts = E.EngineOptions(k=4, max_new_tokens=12, plant_temperature=3.0)
    run = E.llamacpp_engine(opts, threads=1)
    kept = {}

    def plain(p, n, s):
        if (n, s) not in kept:
            kept[(n, s)] = run.generate_b(p, n, s)
        return kept[(n, s)]

    try:
        res = check_generation(run.generate_a, plain, [PROMPT], n=400, positions=12, alpha=ALPHA)
        assert res.tested and not res.reject, res.table()
        planted = {}
        res_p = check_generation(lambda p, n, s: planted.setdefault((n, s), run.generate_planted(p, n, s)), plain,
                                 [PROMPT], n=400, positions=12, alpha=ALPHA)
        size = run.plant_size([PROMPT], planted[(400, 0)], kept[(400, 1)], 400, 12, 20)
        assert size["acting"] > 0 and size["mean_tv"] > 0.05, size
        assert res_p.reject, (size, res_p.table())
    finally:
        run.close()


def test_cli_end_to_end(tmp_path):
    from cactus_theory.cli import main

    out = tmp_path / "llamacpp.json"
    rc = main(["check-engine", "--engine", "llamacpp", "--quick", "--negative-control", "--threads", "1",
               "--json", str(out)])
    res = json.loads(out.read_text())
    assert rc in (0, 1) and res["engine"] == "llamacpp" and res["n"] == 50
    assert res["negative_control"]["plant"].startswith(L.PLANT) and "size" in res["negative_control"]


def test_converted_gguf_runs_the_weights_the_project_loads(path, ids):
    """The float32 copy written by llama.cpp's quantizer and the project's torch float32 verifier (the same file,
    dequantized by transformers) give the same next-token logits up to float32 rounding."""
    from cactus_theory.lm.pair import SMOLLM2, load_model

    f32 = L.converted_gguf(path, "float32")
    fwd = L.LlamaForward(f32, len(ids) + 8, 1)
    z = fwd.rows(ids, 1)[0]
    model, _ = load_model(SMOLLM2, torch.float32)
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0, -1].numpy()
    assert np.abs(z - ref).max() < 5e-2 * max(1.0, np.abs(ref).max()), np.abs(z - ref).max()
    assert int(z.argmax()) == int(ref.argmax())


def test_prototype_forward_rolls_back_exactly_and_keeps_the_law(path, ids):
    """``LlamaForward.rows`` after a rollback equals a fresh evaluation; SpS over lookup drafts on llama.cpp's forwards
    against our plain sampling over the same forwards: no difference at alpha 1e-3 (300 decodes, positions 0-3)."""
    fwd = L.LlamaForward(path, len(ids) + 40, 1)
    a = fwd.rows(ids + [1, 2, 3, 4], 5)
    fwd.rows(ids + [9, 9, 9, 9, 9, 9], 3)  # another branch, then back
    b = fwd.rows(ids + [1, 2, 3, 4], 5)
    fresh = L.LlamaForward(path, len(ids) + 40, 1).rows(ids + [1, 2, 3, 4], 5)
    assert np.allclose(a, b, atol=1e-4) and np.allclose(b, fresh, atol=1e-4)

    def gen(rule):
        def g(prompts, n, seed):
            gg = torch.Generator().manual_seed(seed)
            if rule is None:
                return [L.plain_generate(fwd, ids, 4, SAMPLING.as_tuple(), gg) for _ in range(n)]
            return [L.rule_generate(fwd, L.LookupDraft(), ids, rule, 4, 4, SAMPLING.as_tuple(), gg) for _ in range(n)]
        return g

    res = check_generation(gen(SpS()), gen(None), [PROMPT], n=300, positions=4, alpha=ALPHA)
    assert res.tested and not res.reject, res.table()


def test_prototype_loop_follows_cactus_exact_law_on_a_toy():
    """Cactus(0.5) through ``rule_generate`` with a stochastic toy draft follows its exact sequence law
    (``theory.toy.sequence_law``), 1,000 decodes, alpha 1e-3 (no llama.cpp needed; here for its cost)."""
    from cactus_theory.core.rules import Cactus
    from cactus_theory.theory import toy
    from tests.integrations.test_llamacpp import T_TOY, toy_run

    draft, verifier = toy.random_pair(3, order=2, concentration=1.0, weight=0.8, seed=3)
    law = toy.sequence_law(draft, verifier, Cactus(0.5), 2, T_TOY, prompt=(0, 1))
    res = goodness_of_fit(toy_run(Cactus(0.5), draft, verifier, 7, n=1000), law, alpha=ALPHA, kind="samples")
    assert res.pvalue > ALPHA, res
