"""``benchmarks/bench_lm.py``: bad flags answered by argparse (exit 2, one line naming the flag and the value)
before any model loads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def bench_lm():
    spec = importlib.util.spec_from_file_location("bench_lm", ROOT / "benchmarks" / "bench_lm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def no_load(monkeypatch):
    """Loading a model fails the test: a bad flag must be refused before."""
    import cactus_theory.lm.pair as pair_mod

    def refuse(*a, **k):
        pytest.fail("a model was loaded before the bad flag was refused")

    monkeypatch.setattr(pair_mod, "load_pair", refuse)
    monkeypatch.setattr(pair_mod, "load_model", refuse)


@pytest.mark.parametrize("argv, says", [
    (["--threads", "-1"], "argument --threads: must be an integer >= 1, got '-1'"),
    (["--threads", "0"], "argument --threads: must be an integer >= 1, got '0'"),
    (["--device", "banana"], "--device 'banana' is not a torch device"),
    (["--ks", "0"], "argument --ks: must be an integer >= 1, got '0'"),
    (["--ks", "4", "0"], "argument --ks: must be an integer >= 1, got '0'"),
    (["--batch-sizes", "0"], "argument --batch-sizes: must be an integer >= 1, got '0'"),
    (["--per-style", "9"], "argument --per-style: must be an integer in [1, 8] (prompts per style), got '9'"),
    (["--per-style", "0"], "argument --per-style: must be an integer in [1, 8] (prompts per style), got '0'"),
    (["--tree-budget", "8,4"], "--tree-budget must be three integers >= 1, NODES,DEPTH,TOPK, got '8,4'"),
    (["--tree-budget", "8,4,x"], "--tree-budget must be three integers >= 1, NODES,DEPTH,TOPK, got '8,4,x'"),
    (["--tree-dynamic", "4,4"], "--tree-dynamic must be three integers >= 1, DEPTH,WIDTH,CHILDREN, got '4,4'"),
    (["--tree-branching", "2,0"], "--tree-branching must be comma-separated integers >= 1, got '2,0'"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be an integer >= 1, got '0'"),
])
def test_bad_flags_exit_2_naming_the_flag_before_any_load(argv, says, no_load, capsys):
    mod = bench_lm()
    with pytest.raises(SystemExit) as e:
        mod.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "error: " in last and says in last, err  # argparse's one error line names the flag and the value
    assert "Traceback" not in err
