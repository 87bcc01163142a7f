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
    (["--rounds", "1"], "--rounds must be >= 2 (an interval over rounds needs two), got 1"),
    (["--drift-bound", "0.9"], "--drift-bound must be a finite number >= 1"),
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


TINY_PROMPTS = [[1, 2], [3], [4, 5], [6, 7, 8]]


@pytest.fixture
def tiny(monkeypatch):
    """bench_lm with the tiny pair of tests/lm/common.py (token-id prompts, no tokenizer) instead of SmolLM2."""
    import cactus_theory.lm.pair as pair_mod
    from tests.lm.common import pair

    monkeypatch.setattr(pair_mod, "load_pair", lambda *a, **k: pair())
    mod = bench_lm()
    monkeypatch.setattr(mod, "prompt_set", lambda per_style: TINY_PROMPTS[:3 * per_style])
    return mod


SMALL = ["--per-style", "1", "--max-new-tokens", "4", "--roofline-mib", "1", "--roofline-repeats", "1", "--threads", "1"]


def test_a_failed_gate_writes_nothing_and_exits_1(tiny, monkeypatch, tmp_path, capsys):
    """The wiring of the gates (their logic: tests/lm/test_rounds.py): a failed gate refuses the file with its
    reason; --no-gates writes it, recording that the gates were off and what failed."""
    monkeypatch.setattr(tiny, "gates", lambda res, bound: ["baseline drift: constructed"])
    out = tmp_path / "r.json"
    argv = [*SMALL, "--rules", "sps", "--ks", "1", "--rounds", "2", "--out", str(out)]
    assert tiny.main(argv) == 1
    err = capsys.readouterr().err
    assert "gate failed: baseline drift: constructed" in err and "not written" in err and not out.exists()
    assert tiny.main([*argv, "--no-gates"]) == 0
    import json

    res = json.loads(out.read_text())
    assert res["gates"] == {"on": False, "drift_bound": 1.10, "failed": ["baseline drift: constructed"]}
    assert res["settings"]["rounds"] == 2 and len(res["orders"]) == 2
    assert all(p["width"] == (1 if p["rule"] is None else 2) for p in res["roofline"]["phases"])


def test_throughput_reports_every_method_and_batch_with_its_compute_roof_ratio(tiny, tmp_path, capsys):
    """--throughput: the verifier alone, SpS and Cactus delta=1 at each batch size in one interleaved run, the
    prompts cycled to fill the largest batch; each figure recomputed from the run's own JSON (rows, baselines,
    roofline)."""
    import json

    out = tmp_path / "t.json"
    assert tiny.main([*SMALL, "--throughput", "--batch-sizes", "1", "4", "--ks", "2", "--rounds", "2", "--no-gates",
                      "--out", str(out)]) == 0
    assert "batch throughput" in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["settings"]["prompts"] == 4 and res["settings"]["distinct_prompts"] == 3  # 3 cycled to fill B = 4
    got = {(e["method"], e["batch_size"]): e for e in res["throughput"]}
    assert set(got) == {(m, b) for m in ("verifier alone", "SpS k=2", "Cactus delta=1 k=2") for b in (1, 4)}
    roof = res["roofline"]
    base1 = res["baselines"]["1"]["tokens_per_s"]
    for (method, b), e in got.items():
        if method == "verifier alone":
            base = res["baselines"][str(b)]
            runs = base["runs"]
            tps, steps, calls = base["tokens_per_s"], runs[0]["steps"], runs[0]["verifier_calls"]
            secs = sum(r["seconds"] - r["prefill_seconds"] for r in runs) / len(runs)
            label, new, seqs = f"verifier alone B={b}", runs[0]["new_tokens"], runs[0]["sequences"]
            assert e["speedup"] is None
        else:
            row = next(r for r in res["rows"] if f"{r['rule']} k={r['k']}" == method and r["batch_size"] == b)
            tps, steps, calls = row["tokens_per_s"], row["steps"], row["verifier_calls"]
            secs, label = row["seconds"] - row["prefill_seconds"], f"{method} B={b}"
            new, seqs = row["new_tokens"], row["sequences"]
            assert e["speedup"] == row["speedup"] and e["speedup_ci"] == row["speedup_ci"]
        assert e["tokens_per_s"] == pytest.approx(tps)
        assert e["rows"] == pytest.approx(steps / calls) and (e["rows"] > 1) == (b > 1)
        assert e["tokens_per_s_per_row"] == pytest.approx(tps * calls / steps)
        assert e["vs_batch1"] == pytest.approx(tps / base1)
        assert e["seconds_per_1000_answers"] == pytest.approx(1000 * new / seqs / tps)
        flops = sum(p["flops"] for p in roof["phases"] if p["row"] == label)  # one dtype: one compute roof
        assert flops > 0
        assert e["compute_roof_ratio"] == pytest.approx((secs / calls) / (flops / roof["flop_rate"]))


def test_decode_baseline_rounds_uses_the_benchmarks_helper(monkeypatch, tmp_path, capsys):
    """``cactus-theory decode --baseline --rounds R`` times through ``lm.rounds.interleaved_rounds`` (the benchmark's
    own function, not a copy) and reports the speedup as the benchmark does: the rounds' ratios, their geometric
    mean and the t-interval of the log ratio (recomputed with scipy); --rounds without --baseline is refused."""
    import json

    import numpy as np
    from scipy import stats

    import cactus_theory.lm.rounds as rounds_mod
    from cactus_theory import cli
    from cactus_theory.cli import lm as cli_lm
    from cactus_theory.lm import ModelPair
    from tests.lm.common import DRAFT, VERIFIER
    from tests.lm.test_tree_loop import _CharTokenizer

    calls = []
    real = rounds_mod.interleaved_rounds

    def spy(jobs, rounds, seed=0, on_done=None):
        calls.append((sorted(jobs), rounds, seed))
        return real(jobs, rounds, seed, on_done)

    monkeypatch.setattr(rounds_mod, "interleaved_rounds", spy)
    monkeypatch.setattr(cli_lm, "_load", lambda args: ModelPair(DRAFT, VERIFIER, _CharTokenizer(), name="tiny"))
    out = tmp_path / "d.json"
    rc = cli.main(["decode", "--draft", "smollm2", "--rule", "sps", "-k", "2", "--prompt", "abc", "--prompt", "hello",
                   "--max-new-tokens", "4", "--no-warmup", "--baseline", "--rounds", "3", "--seed", "5",
                   "--json", str(out)])
    assert rc == 0 and calls == [(["speculative", "verifier alone"], 3, 5)]
    blob = json.loads(out.read_text())
    r = np.array(blob["speedup_rounds"])
    assert blob["rounds"] == 3 and len(r) == 3 and blob["speedup"] == pytest.approx(stats.gmean(r))
    ci = stats.ttest_1samp(np.log(r), 0.0).confidence_interval(0.95)
    assert blob["speedup_ci"] == pytest.approx([np.exp(ci.low), np.exp(ci.high)])
    assert "3 interleaved rounds" in capsys.readouterr().out
    assert cli.main(["decode", "--prompt", "x", "--rounds", "3"]) == 2
    assert "error: --rounds 3 times the decode against the verifier alone: give --baseline too" in capsys.readouterr().err
