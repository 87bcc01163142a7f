"""``--engine llamacpp`` and ``integrations.llamacpp`` without llama.cpp (cheap, in ``make test``): the engine's
declared capabilities, the one-line refusal where llama-cpp-python does not import, the pieces that replay
llama.cpp's behaviour in plain Python (prompt lookup, which draws sample-and-match makes after an accepted draft,
llama.cpp's sampling law, the prefixes a check compares), and the prototype loop (the project's rules over
``Forward`` models) exact in law on a toy pair. The engine itself runs in tests/integrations/llamacpp_checks.py
(``make test-llamacpp``); its argument errors are in tests/test_boundaries.py."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from cactus_theory.cli import check_engine as ce
from cactus_theory.core.rules import Cactus, SpS
from cactus_theory.integrations import engines as eng_mod
from cactus_theory.integrations import llamacpp as L
from cactus_theory.theory import toy
from cactus_theory.theory.stats import detectable_tv, goodness_of_fit

pytestmark = pytest.mark.usefixtures("one_thread")


def test_llamacpp_is_a_declared_engine():
    caps = eng_mod.ENGINE_CAPS
    assert set(caps) == set(eng_mod.ENGINES) == set(ce.ENGINE_NAMES)
    c = caps["llamacpp"]
    assert (c.rules, c.trees, c.module, c.own_loader, c.negative_control) == (False, False, "llama_cpp", True, L.PLANT)
    assert "make llamacpp-env" in c.hint
    assert [n for n, x in caps.items() if x.negative_control] == ["llamacpp"]
    assert caps["loop"].rules and caps["loop"].trees and caps["loop"].module is None


def test_llamacpp_without_the_binding_is_one_line_naming_the_env_target(monkeypatch, capsys):
    """Where llama_cpp does not import (blocked here, so this holds in the llamacpp venv too): one line, exit 2, no
    model loaded; the engine function refuses with the same words before anything else."""
    from cactus_theory.cli import main

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setattr(ce, "_load", lambda args: pytest.fail("a model was loaded"))
    assert main(["check-engine", "--engine", "llamacpp", "--negative-control"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot import" in err and "make llamacpp-env" in err, err
    with pytest.raises(ValueError, match="make llamacpp-env"):
        eng_mod.llamacpp_engine(eng_mod.EngineOptions())
    assert main(["check-engine", "--engine", "llamacpp", "--rule", "tas"]) == 2  # argument errors come first
    assert "sample-and-match" in capsys.readouterr().err


def test_engine_refuses_what_its_capabilities_do_not_declare(monkeypatch):
    monkeypatch.setattr(eng_mod, "engine_problem", lambda name: None)
    with pytest.raises(ValueError, match="own lossless rule"):
        eng_mod.llamacpp_engine(eng_mod.EngineOptions(rule=Cactus(1.0)))
    with pytest.raises(ValueError, match="chains only"):
        eng_mod.llamacpp_engine(eng_mod.EngineOptions(tree=object()))
    with pytest.raises(ValueError, match="plant_temperature"):
        eng_mod.llamacpp_engine(eng_mod.EngineOptions(plant_temperature=0.6))


@pytest.mark.parametrize("context, k, want", [
    ([5, 6, 7, 5, 6], 2, [7, 5]),        # the last bigram (5, 6) occurred at 0: what followed it
    ([5, 6, 7, 5, 6], 9, [7, 5, 6]),     # up to k, cut at the context's end
    ([1, 2, 3, 9, 2], 3, [3, 9, 2]),     # no earlier (9, 2): the unigram 2 at 1
    ([1, 2, 1, 2, 1, 2], 1, [1]),        # the earliest occurrence wins
    ([1, 2, 3], 4, []),                  # nothing repeats
    ([4], 4, []),                        # one token: nothing to look up
    ([3, 3], 2, [3]),                    # the unigram 3 at 0, followed by 3
])
def test_prompt_lookup_proposals(context, k, want):
    assert L.lookup_drafts(context, k) == want


def test_planted_positions_replays_sample_and_match():
    """By hand, prompt [1, 2, 3], k = 2: token 0 comes from the prompt's batch. Step 1: lookup after [1, 2, 3, 1]
    proposes [2, 3] (the unigram 1 at 0); its first draw (2) matches d1, so the next draw (3) is made after d1
    (planted) and matches d2, so the next (7, the bonus) is made after d2 (planted). Steps 2 and 3: nothing to look
    up after 7 or 8, each draw is a step's first. Second case: the draw 4 mismatches d1 (step over); after [.., 1, 4]
    nothing; after [.., 4, 2] lookup proposes [3, 1]: its first draw 3 matches, so the draw after it is planted."""
    drafts = lambda c: L.lookup_drafts(c, 2)  # noqa: E731
    assert L.planted_positions([1, 2, 3], [1, 2, 3, 7, 8, 9], drafts) == [False, False, True, True, False, False]
    assert L.planted_positions([1, 2, 3], [1, 4, 2, 3, 1], drafts) == [False, False, False, False, True]


def test_llamacpp_law_cuts_before_the_temperature():
    """llama.cpp's chain: top-k, then top-p on the untempered softmax, then the temperature (by hand), which keeps
    fewer tokens than the project's order (temperature first) on this row."""
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    got = L.llamacpp_law(z, 0.5, 3, 0.8)  # top-3 -> {0.5, 0.3, 0.15}/0.95; cumulative 0.526, 0.842: keep 2
    w = np.array([0.5, 0.3]) ** 2  # temperature 0.5 on the two kept
    assert np.allclose(got, np.r_[w / w.sum(), 0, 0], atol=1e-12)
    from cactus_theory.core.transforms import sampling_probs

    ours = sampling_probs(torch.tensor(z), 0.5, 3, 0.8).numpy()  # tempered first: 0.69, 0.25 -> keep 2 as well
    assert np.count_nonzero(ours) == 2
    z2 = np.log(np.array([0.4, 0.35, 0.25]))  # untempered: 0.4 + 0.35 reaches top-p 0.72, two kept
    assert np.count_nonzero(L.llamacpp_law(z2, 2.0, 0, 0.72)) == 2
    # tempered first (T 2): 0.367, 0.343, 0.290; the first two hold 0.710 < 0.72, so the project keeps all three
    assert np.count_nonzero(sampling_probs(torch.tensor(z2), 2.0, 0, 0.72).numpy()) == 3
    assert L.llamacpp_law(z, 0, 0, 1.0).tolist() == [1, 0, 0, 0]


def test_tested_prefixes_against_a_direct_count():
    a = [[1, 2], [1, 2], [1, 3], [4]]  # n = 2 decodes per prompt, 2 prompts
    b = [[1, 2], [1, 5], [1, 3], [4, 4]]
    got = L.tested_prefixes(a, b, n=2, positions=3, min_count=1)
    # prompt 0 (decodes 0, 1): (), (1,), (1, 2) on both sides ((1, 5) in b only); prompt 1 (decodes 2, 3): (), (1,),
    # (1, 3), (4,) on both sides ((4, 4) in b only)
    want = sorted([(0, 0, ()), (1, 0, (1,)), (2, 0, (1, 2)), (0, 1, ()), (1, 1, (1,)), (2, 1, (1, 3)), (1, 1, (4,))])
    assert got == want
    assert L.tested_prefixes(a, b, n=2, positions=3, min_count=2) == [(0, 0, ()), (0, 1, ()), (1, 0, (1,))]


# -- the prototype: rule_generate over Forward models, exact in law on a toy ---------------------------------------

N_TOY, T_TOY, ALPHA = 500, 2, 1e-3


def toy_run(rule, draft, verifier, seed, n=N_TOY, lookup=False):
    """``n`` decodes of ``T_TOY`` tokens after the prompt (0, 1) by ``rule_generate`` over toy forwards (k = 2,
    temperature 1, no top-k / top-p: the transforms leave the toy's laws as they are), one generator."""
    g = torch.Generator().manual_seed(seed)
    fv = L.ToyForward(verifier)
    fd = L.LookupDraft() if lookup else L.ToyForward(draft)
    return np.array([L.rule_generate(fv, fd, (0, 1), rule, 2, T_TOY, (1.0, 0, 1.0), g) for _ in range(n)])


def test_rule_over_forwards_is_exact_on_a_toy_and_catches_a_wrong_rule():
    """SpS through the loop with a stochastic draft: its decodes follow the verifier's law, which
    ``theory.toy.sequence_law`` gives exactly (and equals the autoregressive law), Pearson at alpha 1e-3, seed fixed.
    The negative control at the same n: Cactus(0.05) decodes judged against SpS's law; its exact TV from it (0.23 on
    this pair, computed here) is above the test's detectable TV at power 0.9 (0.13 for 500 draws over 9 cells), and it
    is rejected. V = 3, 2 tokens, 500 decodes each."""
    draft, verifier = toy.random_pair(3, order=2, concentration=1.0, weight=0.8, seed=3)
    law = toy.sequence_law(draft, verifier, SpS(), 2, T_TOY, prompt=(0, 1))
    assert np.allclose(law, toy.autoregressive_law(verifier, T_TOY, prompt=(0, 1)))
    assert goodness_of_fit(toy_run(SpS(), draft, verifier, 1), law, alpha=ALPHA, kind="samples").pvalue > ALPHA
    wrong = toy.sequence_law(draft, verifier, Cactus(0.05), 2, T_TOY, prompt=(0, 1))
    tv = 0.5 * np.abs(wrong - law).sum()
    assert tv > detectable_tv(N_TOY, categories=law.size, alpha=ALPHA, beta=0.1)
    res = goodness_of_fit(toy_run(Cactus(0.05), draft, verifier, 2), law, alpha=ALPHA, kind="samples")
    assert res.pvalue < ALPHA, (tv, res)


def test_rule_over_lookup_drafts_keeps_the_verifier_law():
    """Prompt-lookup drafts (one-hot laws, 0 to k of them per step) under SpS: the decodes follow the verifier's
    autoregressive law (SpS is lossless for any draft); 500 decodes, alpha 1e-3."""
    _, verifier = toy.random_pair(3, order=2, concentration=1.0, seed=5)
    law = toy.autoregressive_law(verifier, T_TOY, prompt=(0, 1))
    assert goodness_of_fit(toy_run(SpS(), None, verifier, 4, lookup=True), law, alpha=ALPHA,
                           kind="samples").pvalue > ALPHA


def test_the_verdict_table_reads_a_llamacpp_run(tmp_path):
    """benchmarks/check_engine_table.py's row for a llama.cpp verdict with its negative control (a made-up file)."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("check_engine_table", root / "benchmarks" / "check_engine_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    res = {"engine": "llamacpp", "notes": ["llama-cpp-python 0.3.36, GGUF x.gguf (as shipped)"], "reject": False,
           "n": 500, "prompts": 3,
           "config": {"num_drafts": 4, "dtype": None, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                      "max_new_tokens": 16, "no_chat": False, "positions": 16},
           "tests": [{"name": "position 0", "position": 0, "holm": 1.0, "detectable": 0.134}],
           "negative_control": {"plant_temperature": 1.0, "caught": True,
                                "size": {"acting": 12, "prefixes": 40, "mean_tv": 0.21}}}
    path = tmp_path / "llamacpp_lookup_paper.json"
    path.write_text(json.dumps(res))
    row = mod.row(path)
    assert row.startswith("| llama.cpp (llama-cpp-python 0.3.36, CPU) | prompt lookup, k = 4, GGUF as shipped; T 0.6")
    assert "acting at 12 of 40 compared prefixes, TV there mean 0.210): caught" in row and "| 500 x 3 |" in row


BENCH_BAD = [(["--threads", "0"], "--threads"), (["--threads", "-1"], "--threads"), (["--per-style", "99"], "--per-style"),
             (["--rounds", "0"], "--rounds"), (["-k", "0"], "-k"), (["--dtype", "float16"], "--dtype"),
             (["--drift-bound", "0.5"], "--drift-bound"), (["--seed", "-1"], "--seed"), ([], "make llamacpp-env")]


@pytest.mark.parametrize("argv, needle", BENCH_BAD)
def test_bench_llamacpp_flags_fail_fast(argv, needle, monkeypatch, capsys):
    """benchmarks/bench_llamacpp.py: each bad flag, and a Python without llama-cpp-python, is one argparse error (exit
    2) naming it, before llama.cpp, torch or a model loads."""
    import importlib.util
    from pathlib import Path

    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_llamacpp.py"
    spec = importlib.util.spec_from_file_location("bench_llamacpp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit) as e:
        mod.parse(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err, err
