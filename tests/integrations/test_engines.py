"""``integrations.engines`` and ``cactus-theory check-engine``: the engine table, the truncated assistant (its
logits are the verifier's hidden state after its first layers through the final norm and head), the command
run end to end on tiny models (table, JSON, exit status) and, marked slow, on the real SmolLM2 with
transformers' assisted generation; the vllm engine's pieces that need no vLLM (its one-line error where vLLM
does not import, its request seeds, its speculative configs; its argument errors are in tests/test_boundaries.py).
The vllm engine itself runs in tests/integrations/vllm_cpu_checks.py (``make test-vllm``).

The statistical content of these runs is not the point (n is small; the detectable TVs are printed): the
loop's losslessness is tested with power in tests/lm/test_planted_bugs.py and tests/lm/test_loop.py.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cactus_theory as ct
from cactus_theory.cli import Parser
from cactus_theory.cli import check_engine as ce
from cactus_theory.integrations import engines as eng_mod
from cactus_theory.integrations.engines import (
    ENGINES,
    VLLM_HINT,
    EngineOptions,
    first_layers,
    request_seeds,
    transformers_engine,
    vllm_engine,
    vllm_speculative_config,
)
from cactus_theory.theory.check_generation import check_generation
from tests.helpers import tiny_llama
from tests.lm.common import pair

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_cli_names_every_engine_of_the_table():
    assert ce.ENGINE_NAMES == tuple(ENGINES)
    assert ce.VLLM_SPECS == eng_mod.VLLM_SPECS and ce.VLLM_PLUGIN_MODES == eng_mod.VLLM_PLUGIN_MODES


def test_vllm_engine_without_vllm_is_one_line_naming_the_fix(monkeypatch, capsys):
    """Where vLLM does not import (blocked here, so this holds in .venv-vllm too): the command's argument check
    answers one line, exit status 2, naming `make vllm-env` and .venv-vllm's command; the engine function refuses
    with the same words before anything else."""
    from cactus_theory.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, find_spec ValueError
    monkeypatch.setattr(ce, "_load", lambda args: pytest.fail("a model was loaded"))
    assert main(["check-engine", "--engine", "vllm", "--spec", "ngram"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot import" in err and VLLM_HINT in err, err
    with pytest.raises(ValueError, match="make vllm-env"):
        vllm_engine(EngineOptions(spec="ngram"))


def test_vllm_argument_checks_run_before_the_vllm_check(monkeypatch, capsys):
    """A wrong argument is named even where vLLM is missing (the availability check comes last)."""
    from cactus_theory.cli import main

    monkeypatch.setitem(sys.modules, "vllm", None)
    assert main(["check-engine", "--engine", "vllm", "--spec", "ngram", "--rule", "cactus"]) == 2
    assert "vLLM's own rejection sampling" in capsys.readouterr().err


def test_vllm_eagle3_missing_embedded_draft_is_an_argument_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CACTUS_THEORY_CACHE", str(tmp_path))  # no draft built there
    with pytest.raises(ValueError, match="cactus-theory build-draft"):
        parse(["--engine", "vllm", "--spec", "eagle3"])
    folder = tmp_path / "eagle3"
    folder.mkdir()
    with pytest.raises(ValueError, match="needs a config.json"):
        parse(["--engine", "vllm", "--spec", "eagle3", "--draft", str(folder)])


def test_torch_cpu_generator_keeps_32_bits_of_a_seed():
    """The premise of ``request_seeds`` (vLLM seeds each request's ``torch.Generator`` with its seed)."""
    a = torch.rand(4, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, torch.rand(4, generator=torch.Generator().manual_seed(2**32 + 5)))
    assert not torch.equal(a, torch.rand(4, generator=torch.Generator().manual_seed(6)))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 4000))
def test_request_seeds_are_distinct_modulo_2_32_within_a_call_and_across_the_two_sides(s, count):
    if (2 * s + 2) * count > 2**32:
        with pytest.raises(ValueError, match="below 2\\*\\*32"):
            request_seeds(2 * s + 1, count)
        return
    a, b = request_seeds(2 * s, count), request_seeds(2 * s + 1, count)  # check_generation's two sides
    assert len(a) == len(b) == count and len({x % 2**32 for x in a + b}) == 2 * count
    assert a == request_seeds(2 * s, count)  # a decode's seed depends on (seed, its index) only


def test_request_seeds_refuse_bad_arguments():
    for bad in (-1, 1.0, True, None):
        with pytest.raises(ValueError, match="seed must be"):
            request_seeds(bad, 3)
    for bad in (0, -2, 2.0):
        with pytest.raises(ValueError, match="count must be"):
            request_seeds(0, bad)


def test_vllm_speculative_configs():
    assert vllm_speculative_config(EngineOptions(spec="ngram", k=3)) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    assert vllm_speculative_config(EngineOptions(spec="eagle3", draft_sampling="probabilistic"), "/d") == {
        "method": "eagle3", "model": "/d", "num_speculative_tokens": 4, "draft_sample_method": "probabilistic"}
    with pytest.raises(ValueError, match="EAGLE-3 folder"):
        vllm_speculative_config(EngineOptions(spec="eagle3"))
    with pytest.raises(ValueError, match="spec in"):
        vllm_speculative_config(EngineOptions(spec="medusa"))


def test_vllm_plugin_environment_excludes_or_includes_the_projects_plugin(monkeypatch):
    import importlib.metadata as md
    from types import SimpleNamespace

    installed = [SimpleNamespace(name=n) for n in ("lora_filesystem_resolver", "cactus_theory")]
    monkeypatch.setattr(md, "entry_points", lambda group: installed if group == "vllm.general_plugins" else [])
    assert eng_mod.plugin_environment("none") == {"VLLM_PLUGINS": "lora_filesystem_resolver"}
    assert eng_mod.plugin_environment("fixes") == {"VLLM_PLUGINS": "cactus_theory,lora_filesystem_resolver"}
    installed.pop()
    with pytest.raises(ValueError, match="not installed"):
        eng_mod.plugin_environment("fixes")


def test_first_layers_is_the_verifier_cut_after_its_first_layers():
    model = tiny_llama(3, 10, layers=3)
    a = first_layers(model, 2)
    assert len(a.model.layers) == 2 and len(model.model.layers) == 3 and a.config.num_hidden_layers == 2
    x = torch.tensor([[1, 4, 2, 7]])
    with torch.no_grad():
        hs = model(x, output_hidden_states=True).hidden_states  # hidden_states[2]: after 2 decoder layers
        want = model.lm_head(model.model.norm(hs[2]))
        assert torch.allclose(a(x).logits, want, atol=1e-5)
    with pytest.raises(ValueError, match="assistant_layers must be in"):
        first_layers(model, 3)


def parse(argv):
    p = Parser(prog="cactus-theory check-engine")
    ce.configure(p)
    args = p.parse_args(argv)
    ce.check(args)
    return args


def test_positions_default_to_the_decode_length_at_most_16():
    assert parse(["--max-new-tokens", "4"]).positions == 4
    assert parse(["--max-new-tokens", "64"]).positions == 16
    assert parse(["--max-new-tokens", "64", "--positions", "40"]).positions == 40


def test_check_engine_loop_runs_end_to_end_on_a_tiny_pair(tmp_path, capsys):
    out = tmp_path / "res.json"
    args = parse(["--engine", "loop", "--prompt", "x", "-k", "2", "--max-new-tokens", "3", "--n", "400",
                  "--positions", "3", "--temperature", "1", "--top-k", "0", "--top-p", "1", "--batch-size", "800",
                  "--json", str(out)])
    args.prompts = [[3, 5, 7], [1]]  # the tiny pair has no tokenizer: token-id prompts
    rc = ce.run(args, models={"pair": pair()})
    table = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert rc == (1 if data["reject"] else 0) == 0
    assert "position 0" in table and "verdict" in table and data["engine"] == "loop" and data["n"] == 400
    pooled = [t["position"] for t in data["tests"] if not t["name"].endswith("exact")]
    assert pooled == list(range(len(pooled))) and data["config"]["rule"] == "SpS()" and data["verdict"] != "untested"


def test_check_engine_transformers_runs_on_a_tiny_llama():
    model = tiny_llama(2, 10, layers=2)
    eng = transformers_engine(EngineOptions(k=2, assistant_layers=1, max_new_tokens=3, temperature=1.0, top_k=0,
                                            top_p=1.0, batch_size=100), model=model)
    assert any("first 1 of 2 decoder layers" in n for n in eng.notes)
    a = eng.generate_a([[3, 5, 7]], 5, 0)
    assert len(a) == 5 and all(len(d) == 3 for d in a) and eng.generate_a([[3, 5, 7]], 5, 0) == a  # seeded
    res = check_generation(eng.generate_a, eng.generate_b, [[3, 5, 7]], n=60, positions=2, alpha=1e-3, seed=0)
    assert res.tests and res.n == 60
    with pytest.raises(ValueError, match="its own rule"):
        transformers_engine(EngineOptions(rule=ct.Cactus(0.5)), model=model)


def test_the_transformers_check_runs_both_sides_at_batch_1():
    """Matched sides (issue 41 item 1): assisted generation takes one sequence per call, so plain generate gets
    one too, whatever batch_size says; the sides differ in the assistant only. Read off the calls themselves."""
    model = tiny_llama(2, 10, layers=2)
    eng = transformers_engine(EngineOptions(k=2, assistant_layers=1, max_new_tokens=2, temperature=1.0, top_k=0,
                                            top_p=1.0, batch_size=8), model=model)
    calls = []
    real = model.generate

    def generate(x, **kw):
        calls.append((x.shape[0], "assistant_model" in kw))
        return real(x, **kw)

    model.generate = generate  # after the assistant is copied from the model
    a, b = eng.generate_a([[3, 5], [1]], 3, 0), eng.generate_b([[3, 5], [1]], 3, 1)
    assert len(a) == len(b) == 6 and eng.batch_sizes == (1, 1)
    assert sorted(calls) == [(1, False)] * 6 + [(1, True)] * 6
    assert any("batch 1 on both sides" in n for n in eng.notes)


@pytest.mark.lm
@pytest.mark.slow
def test_check_engine_transformers_on_the_real_smollm2(smollm2, tmp_path, capsys):
    model, tok = smollm2
    out = tmp_path / "tf.json"
    args = parse(["--engine", "transformers", "--prompt", "Name a colour.", "--n", "8", "--min-count", "4",
                  "--max-new-tokens", "2", "--positions", "2", "--json", str(out)])  # --n 8 below --min-count 20 tests nothing
    rc = ce.run(args, models={"model": model, "tokenizer": tok})
    data = json.loads(out.read_text())
    assert rc in (0, 1, ce.EXIT_UNTESTED) and data["engine"] == "transformers" and data["n"] == 8
    assert any("first 4 of 30 decoder layers" in n for n in data["notes"])
    assert "transformers generate(assistant_model=...)" in capsys.readouterr().out


def _table_module():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("check_engine_table", root / "benchmarks" / "check_engine_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, root


def test_the_docs_engine_verdicts_are_the_committed_results():
    """docs/statistical-tests.md's matched-control table, its wording and its per-position table are
    benchmarks/check_engine_table.py's output for the committed check-engine JSON files (every number there traces
    to a file); read independently of the generator: each file's row states its own n, prompts, batch sizes and
    verdict, rows of one block share every setting (the whole configuration compared, less the role), and each
    non-rejection is worded with the detectable TV its file states at the first speculative position."""
    mod, root = _table_module()
    text = (root / "docs" / "statistical-tests.md").read_text(encoding="utf-8")
    assert mod.blocks(text) == {name: make() for name, make in mod.BLOCKS.items()}
    assert len(mod.files()) >= 3 and all(p.stem in mod.ORDER for p in mod.files())
    matched, summary = mod.matched_table(), mod.summary()
    block, blocks = None, {}
    for line in matched.splitlines()[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        block = cells[0] or block
        blocks.setdefault(block, []).append(cells)
    for path in mod.RESULTS.glob("*.json"):
        d = json.loads(path.read_text(encoding="utf-8"))
        (cells,) = [c for rows in blocks.values() for c in rows if f"[{path.name}]" in c[-1]]
        assert cells[2] == f"{d['n']} x {len(d['config']['prompts'])}"
        sides = d.get("batch_sizes") or ([1, d["config"]["batch_size"]] if d["engine"] == "transformers"
                                          else [d["config"]["batch_size"]] * 2)
        assert cells[3].startswith(f"{sides[0]} / {sides[1]}") and ("unmatched" in cells[3]) == (sides[0] != sides[1])
        assert ("differs" in cells[4] or "caught" in cells[4]) == d["reject"]
        if not d["reject"]:
            f = 0 if d["engine"] == "transformers" else 1
            det = next(t["detectable"] for t in d["tests"] if t["name"] == f"position {f}")
            assert f"a next-token TV >= {det:.3f} at every tested prefix of position {f}" in summary
            assert f"{det:.3f} (position {f})" == cells[6]
    for rows in blocks.values():
        res = [json.loads((mod.RESULTS / r[-1].split("](")[0].lstrip("[")).read_text()) for r in rows
               if r[-1].endswith(".json)")]
        strip = [{k: v for k, v in r["config"].items() if k not in ("vllm_plugin", "json")} for r in res]
        assert all(s == strip[0] for s in strip) and len({str(r.get("batch_sizes")) for r in res}) <= 1


def test_the_matched_table_pairs_roles_by_setting_and_reads_a_negative_control(tmp_path, monkeypatch):
    """Constructed files: an as-shipped run, its fixed run and a caught negative control at one setting form one
    block; a fixed run at another n forms its own block with its missing roles said; a planted row states its TV."""
    import shutil

    mod, _ = _table_module()
    src = mod.RESULTS / "vllm_ngram_shipped_temperature.json"
    d = json.loads(src.read_text())
    fixed = json.loads(json.dumps(d))
    fixed["config"]["vllm_plugin"], fixed["reject"] = "fixes", False
    for t in fixed["tests"]:
        t["holm"], t["reject"] = 1.0, False
    planted = json.loads(json.dumps(fixed))
    planted["reject"] = True
    planted["tests"][1]["holm"] = 1e-9
    planted["control"] = {"role": "planted", "planted": {"c": 2.0}, "setting": "vllm_ngram_temperature"}
    planted["planted_tv"] = {"position": 1, "exact": False, "prefixes": [{"tv": 0.3}, {"tv": 0.1}, {"tv": 0.2}]}
    other = json.loads(json.dumps(fixed))
    other["n"] = 400
    shutil.copy(src, tmp_path / src.name)
    for name, res in (("vllm_ngram_fixes_temperature", fixed), ("vllm_ngram_planted_temperature", planted),
                      ("zz_other", other)):
        (tmp_path / f"{name}.json").write_text(json.dumps(res))
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    lines = mod.matched_table().splitlines()[2:]
    assert [ln.split("|")[2].strip() for ln in lines] == ["as shipped", "with the fix", "negative control"] * 2
    assert lines[0].split("|")[1].strip() and not lines[1].split("|")[1].strip() and lines[3].split("|")[1].strip()
    assert "**caught**" in lines[2] and "at most 0.100-0.300 (median 0.200) at its 3 tested prefixes of position 1" in lines[2]
    assert "| 400 x 3 |" in lines[4] and "no committed run at this setting" in lines[3] and "no committed" in lines[5]
    assert "caught; differs (smallest Holm-adjusted p 1e-09" in mod.summary()
