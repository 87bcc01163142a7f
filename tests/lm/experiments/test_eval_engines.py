"""``cactus-theory eval --engine``: the parts that do not depend on the engine, checked without vLLM (the live
vLLM slice is tests/integrations/vllm_cpu_eval.py, ``make test-vllm``).

* the decode key: the loop's is the one its committed shards were written under (the folder name in
  paper_repro/results/eval_v3/shards, written before engines existed), any engine's differs from it and from
  another engine's;
* row seeds to engine seeds: the loop's is the row seed, vLLM's its low 32 bits (checked on the bits of the
  sha256 digest the row seed is cut from);
* refusals before any load: the engine flags, and a method the engine's declared capabilities cannot apply (a
  fake engine declaring no capability, rules declaring each flag);
* a run through a fake engine (the tiny pair decoding through ``generate_rows``): shards and eval.json under the
  engine's own decode key and folder, every record with the loop's keys and types, the engine's seeds passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
from typing import ClassVar

import pytest

import cactus_theory as ct
from cactus_theory.lm.experiments import replicated as rp
from cactus_theory.lm.experiments.eval import Method, pair_id
from cactus_theory.lm.experiments.protocol import PROTOCOLS, load_protocol
from tests.lm.experiments.test_eval_v3 import _protocol
from tests.lm.experiments.test_replicated import RAGGED

pytestmark = pytest.mark.usefixtures("one_thread")
SHARDS = PROTOCOLS.parent / "results" / "eval_v3" / "shards"


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    rp.configure(p)
    return p.parse_args(list(argv))


# -- the decode key -------------------------------------------------------------------------------------

def test_the_loop_keeps_its_committed_decode_key_and_every_engine_gets_its_own():
    proto = load_protocol(PROTOCOLS / "eval_v3.json")
    cfg, dev = rp.RunConfig.from_protocol(proto, pair_id("embedded", "smollm2"))
    assert dev == [] and cfg.engine == "loop"
    committed = sorted(p.name for p in SHARDS.iterdir() if p.is_dir())
    assert cfg.decode_key() in committed  # the primary run's folder, named before engines existed
    assert "engine" not in cfg.as_dict() and "engine" not in cfg.decode_keyed()
    keys = {cfg.decode_key()}
    for ident in ("vllm/eagle3", "vllm/draft_model", 'vllm/draft_model/chat={"enable_thinking":false}'):
        e = dataclasses.replace(cfg, engine=ident)
        assert e.decode_keyed()["engine"] == ident and e.as_dict()["engine"] == ident
        assert rp.RunConfig(**e.as_dict()).decode_key() == e.decode_key()  # the config round-trips
        keys.add(e.decode_key())
    assert len(keys) == 4
    with pytest.raises(ValueError, match="engine must be"):
        dataclasses.replace(cfg, engine="sglang").check()


# -- seeds ---------------------------------------------------------------------------------------------

def test_engine_seeds_map_row_seeds_as_recorded():
    parts = ("0", "add_wide", "What is two plus three?", "1", "SpS()")
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    row = rp.row_seed(0, "add_wide", "What is two plus three?", 1, "SpS()")
    bits = "".join(f"{b:08b}" for b in digest[:8])[:63]  # the row seed: the digest's first 63 bits
    assert row == int(bits, 2)
    assert rp.engine_seed(row, "loop") == row
    assert rp.engine_seed(row, "vllm/eagle3") == int(bits[-32:], 2) < 2**32  # its last 32 bits
    assert rp.engine_seed(2**32 + 7, "vllm") == 7 and rp.engine_seed(2**63 - 1, "vllm") == 2**32 - 1
    assert set(rp.SEED_MAPS) == set(rp.ENGINES) and "mod 2**32" in rp.SEED_MAPS["vllm"]
    for bad in (-1, 2**63, 1.5, True):
        with pytest.raises(ValueError, match="row seed"):
            rp.engine_seed(bad, "vllm")
    with pytest.raises(ValueError, match="engine must be"):
        rp.engine_seed(3, "sglang")


# -- refusals ------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _ReadsHead(ct.SpS):
    reads_head: ClassVar[bool] = True


@dataclasses.dataclass(frozen=True)
class _Stateful(ct.SpS):
    stateful: ClassVar[bool] = True


@dataclasses.dataclass(frozen=True)
class _OwnBonus(ct.SpS):
    bonus_from_q: ClassVar[bool] = False


@pytest.mark.parametrize("method, cap, why", [
    (Method("head reader", "sps", rule=_ReadsHead()), "reads_head", "LM-head input"),
    (Method("stateful", "sps", rule=_Stateful()), "stateful", "state per sequence"),
    (Method("own bonus", "sps", rule=_OwnBonus()), "own_bonus", "bonus token its own way"),
    (Method("tree", "sps", rule=ct.SpS(), tree=ct.tree.BudgetTree(4, 3, 2)), "trees", "tree"),
])
def test_a_method_the_declared_capabilities_cannot_apply_is_refused_by_name(method, cap, why):
    assert rp.unsupported(method, {}) is not None and why in rp.unsupported(method, {})
    assert rp.unsupported(method, {cap: True}) is None  # the capability declared: accepted
    plain = Method("SpS", "sps", rule=ct.SpS())
    assert rp.unsupported(plain, {}) is None and rp.unsupported(Method("verifier alone", None), {}) is None
    with pytest.raises(ValueError, match=f"--engine vllm cannot apply '{method.label}'"):
        rp.check_methods([Method("verifier alone", None), plain, method], {}, "vllm")


@pytest.mark.parametrize("argv, msg", [
    (["--vllm-arg", "data_parallel_size=2"], "--vllm-arg goes with --engine vllm"),
    (["--vllm-draft-method", "eagle3"], "--vllm-draft-method goes with --engine vllm"),
    (["--engine", "vllm", "--vllm-arg", "tensor_parallel_size"], "must read KEY=VALUE"),
    (["--engine", "vllm", "--vllm-arg", "2x=1"], "must read KEY=VALUE"),
    (["--engine", "vllm", "--vllm-arg", "speculative_config={}"], "sets speculative_config itself"),
    (["--engine", "vllm", "--vllm-arg", "seed=3"], "sets seed itself"),
    (["--engine", "vllm", "--vllm-arg", "a=1", "--vllm-arg", "a=2"], "given twice"),
    (["--engine", "vllm", "--vllm-chat-kwargs", "[1]"], "must be a JSON object"),
    (["--engine", "vllm", "--vllm-chat-kwargs", "{nope"], "must be a JSON object"),
    (["--engine", "vllm", "--device", "cpu"], "--device goes with --engine loop"),
    (["--engine", "vllm", "--seed", "-1"], "--seed must be"),
])
def test_engine_flags_are_checked_before_anything_loads(argv, msg, tmp_path):
    with pytest.raises(ValueError, match=msg):
        rp.run(_args(*argv, "--out", str(tmp_path)), engine=_FakeSpec({}, fail_load=True))


def test_engine_arguments_are_read_as_json_where_they_parse():
    got = rp.parse_engine_args(["data_parallel_size=8", "gpu_memory_utilization=0.85", "enforce_eager=true",
                                "kv_cache_dtype=fp8", 'compilation_config={"level": 3}'])
    assert got == {"data_parallel_size": 8, "gpu_memory_utilization": 0.85, "enforce_eager": True,
                   "kv_cache_dtype": "fp8", "compilation_config": {"level": 3}}


# -- a run through an engine ------------------------------------------------------------------------------

def same_format(rec: dict, ref: dict) -> bool:
    """Same keys, and each value of the same JSON type as the reference's (an answer may be missing: ``pred`` is
    None or an integer)."""
    def kind(k, v):
        return "int" if v is None and k == "pred" else type(v).__name__
    return set(rec) == set(ref) and all(kind(k, rec[k]) == kind(k, ref[k]) for k in ref)


class _FakeEngine:
    """Decodes with the project's loop on the tiny pair, through ``generate_rows`` (as an engine does)."""

    def __init__(self):
        self.seeds: list[int] = []

    def generate_rows(self, prompts, seeds, method, cfg):
        self.seeds += seeds
        return rp._loop_rows(RAGGED, prompts, seeds, method, cfg)


class _FakeSpec:
    """An engine spec with declared capabilities ``caps`` (replicated.run's contract)."""

    def __init__(self, caps: dict, fail_load: bool = False):
        self.caps, self.fail_load, self.loaded = caps, fail_load, []

    def check(self, args):
        pass

    def identity(self, args):
        return "vllm/fake"

    def info(self, args, cfg):
        return {"name": "fake", "identity": cfg.engine}

    def load(self, args, cfg, methods):
        if self.fail_load:
            pytest.fail("an engine was loaded")
        self.loaded.append([m.label for m in methods])
        self.engine = _FakeEngine()
        return self.engine


def test_an_engine_run_writes_its_own_shards_and_records_in_the_loops_format(tmp_path, capsys, monkeypatch):
    proto = _protocol(tmp_path, reestimation={"after_batches": 99, "max_replicates": 2, "when": "", "statistic": "",
                                              "rule": ""},
                      methods=[{"key": None}, {"key": "sps"}, {"key": "cactus", "params": {"delta": 1.0}}],
                      tasks=["add_wide"], questions_per_task=4)
    monkeypatch.setattr(rp, "plot_accuracy_vs_al", lambda *a, **k: None)  # the figure is not this test's subject
    root = tmp_path / "results" / "eval_v3"
    spec = _FakeSpec({"trees": False})
    args = _args("--protocol", str(proto.path), "--engine", "vllm", "--no-progress")
    assert rp.run(args, engine=spec) == 0
    cfg = rp.RunConfig.from_protocol(proto, pair_id("embedded", "smollm2"))[0]
    eng_cfg = dataclasses.replace(cfg, engine="vllm/fake")
    key = eng_cfg.decode_key()
    assert key != cfg.decode_key() and spec.loaded == [["verifier alone", "SpS", "Cactus delta=1"]]
    saved = json.loads((root / "engines" / key / "eval.json").read_text())
    assert not (root / "eval.json").exists()  # the loop's result is never written by an engine
    assert saved["config"]["engine"] == "vllm/fake" and saved["engine"]["seed_map"] == rp.SEED_MAPS["vllm"]
    shards = sorted((root / "shards").glob("*/*/*/c*.json.gz"))
    assert shards and {f.relative_to(root / "shards").parts[0] for f in shards} == {key}
    # the record keys and types are the loop's (the committed primary run's shards: an independent reference)
    ref = next(iter(sorted(SHARDS.glob("*/primary/*/c*.json.gz"))))
    with gzip.open(ref, "rt") as fh:
        loop_recs = [r for m in json.load(fh)["methods"].values() for b in m["batches"].values() for r in b["records"]]
    for f in shards:
        with gzip.open(f, "rt") as fh:
            sh = json.load(fh)
        assert sh["decode_key"] == key and sh["engine"] == {"name": "fake", "identity": "vllm/fake",
                                                            "seed_map": rp.SEED_MAPS["vllm"]}
        for m in sh["methods"].values():
            for batch in m["batches"].values():
                for rec in batch["records"]:
                    assert same_format(rec, loop_recs[0])
    # the engine was handed each row's vLLM seed: the row seed's low 32 bits
    rows = [s for f in shards for m in json.load(gzip.open(f, "rt"))["methods"].values()
            for b in m["batches"].values() for _, _, s in b["rows"]]
    assert sorted(spec.engine.seeds) == sorted(s % 2**32 for s in rows)
    # a deviating engine run needs its own --out; a missing capability refuses before loading
    with pytest.raises(ValueError, match="give another --out"):
        rp.run(_args("--protocol", str(proto.path), "--engine", "vllm", "--questions", "3"), engine=spec)
    bad = _args("--protocol", str(proto.path), "--engine", "vllm", "--tree", "4", "--out", str(tmp_path / "t"))
    with pytest.raises(ValueError, match="cannot apply 'SpS, EAGLE-2 tree 4/"):
        rp.run(bad, engine=_FakeSpec({}, fail_load=True))
    capsys.readouterr()
