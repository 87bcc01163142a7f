"""``integrations.engines`` and ``cactus-theory check-engine``: the engine table, the truncated assistant (its
logits are the verifier's hidden state after its first layers through the final norm and head), the command
run end to end on tiny models (table, JSON, exit status) and, marked slow, on the real SmolLM2 with
transformers' assisted generation.

The statistical content of these runs is not the point (n is small; the detectable TVs are printed): the
loop's losslessness is tested with power in tests/lm/test_planted_bugs.py and tests/lm/test_loop.py.
"""

from __future__ import annotations

import json

import pytest
import torch

import cactus_theory as ct
from cactus_theory.cli import Parser
from cactus_theory.cli import check_engine as ce
from cactus_theory.integrations.engines import (
    ENGINES,
    EngineOptions,
    first_layers,
    transformers_engine,
)
from cactus_theory.theory.check_generation import check_generation
from tests.helpers import tiny_llama
from tests.lm.common import pair

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_cli_names_every_engine_of_the_table():
    assert ce.ENGINE_NAMES == tuple(ENGINES)


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
    assert [t["position"] for t in data["tests"]] == list(range(len(data["tests"]))) and data["config"]["rule"] == "SpS()"


def test_check_engine_transformers_runs_on_a_tiny_llama():
    model = tiny_llama(2, 10, layers=2)
    eng = transformers_engine(EngineOptions(k=2, assistant_layers=1, max_new_tokens=3, temperature=1.0, top_k=0,
                                            top_p=1.0, batch_size=100), model=model)
    assert any("first 1 of 2 decoder layers" in n for n in eng.notes)
    a = eng.generate_a([[3, 5, 7]], 5, 0)
    assert len(a) == 5 and all(len(d) == 3 for d in a) and eng.generate_a([[3, 5, 7]], 5, 0) == a  # seeded
    res = check_generation(eng.generate_a, eng.generate_b, [[3, 5, 7]], n=100, positions=2, alpha=1e-3, seed=0)
    assert res.tests and res.n == 100
    with pytest.raises(ValueError, match="its own rule"):
        transformers_engine(EngineOptions(rule=ct.Cactus(0.5)), model=model)


@pytest.mark.lm
@pytest.mark.slow
def test_check_engine_transformers_on_the_real_smollm2(smollm2, tmp_path, capsys):
    model, tok = smollm2
    out = tmp_path / "tf.json"
    args = parse(["--engine", "transformers", "--prompt", "Name a colour.", "--n", "8", "--max-new-tokens", "2",
                  "--positions", "2", "--json", str(out)])
    rc = ce.run(args, models={"model": model, "tokenizer": tok})
    data = json.loads(out.read_text())
    assert rc in (0, 1) and data["engine"] == "transformers" and data["n"] == 8
    assert any("first 4 of 30 decoder layers" in n for n in data["notes"])
    assert "transformers generate(assistant_model=...)" in capsys.readouterr().out
