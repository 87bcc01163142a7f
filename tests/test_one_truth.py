"""One source of truth: the sampling default is one ``Sampling`` value that every user reads; every list
of divergences derives from ``divergences.F_DIVERGENCES``; every keyed cache derives its key with
``util.keyed_cache.config_key`` from a configuration naming all its inputs (figure i's names the registry's
rules), and the committed results' keys are unchanged; the draft's build time is stated once."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from cactus_theory.core import registry  # noqa: E402
from cactus_theory.core.divergences import F_DIVERGENCES  # noqa: E402
from cactus_theory.core.sampling import SAMPLING, Sampling  # noqa: E402
from cactus_theory.util.keyed_cache import KeyedDir, KeyedFile, config_key, keyed_subdir, read_json  # noqa: E402

RESULTS = ROOT / "paper_repro" / "results"


# -- sampling ---------------------------------------------------------------------------------------

def test_the_default_is_the_paper_s_and_its_dict_is_the_stored_one():
    assert SAMPLING == Sampling(0.6, 20, 0.95) and SAMPLING.as_tuple() == (0.6, 20, 0.95)
    assert SAMPLING.as_dict() == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    assert list(SAMPLING.as_dict()) == ["temperature", "top_k", "top_p"]
    assert dict(**SAMPLING) == SAMPLING.as_dict() and SAMPLING["top_p"] == 0.95
    assert Sampling.from_dict(SAMPLING.as_dict()) == SAMPLING and SAMPLING.label() == "T 0.6, top-k 20, top-p 0.95"
    # the committed results store exactly this dict (their cache keys hash it)
    runs = json.loads((RESULTS / "fig_e_lm.json").read_text())["config"]["sampling"]
    evals = json.loads((RESULTS / "eval" / "eval.json").read_text())["config"]["sampling"]
    assert json.dumps(runs) == json.dumps(evals) == json.dumps(SAMPLING.as_dict(), sort_keys=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SAMPLING.top_k = 5
    with pytest.raises(KeyError):
        SAMPLING["seed"]


@pytest.mark.parametrize("bad,field", [((-1, 20, 0.9), "temperature"), ((0.6, -1, 0.9), "top_k"),
                                       ((0.6, 2.0, 0.9), "top_k"), ((0.6, 20, 0.0), "top_p"),
                                       ((0.6, 20, 1.5), "top_p"), ((float("nan"), 20, 0.9), "temperature"),
                                       ((True, 20, 0.9), "temperature")])
def test_bad_sampling_is_refused_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        Sampling(*bad)


def test_every_default_reads_the_one_value():
    from cactus_theory.lm import loop
    from cactus_theory.lm.draft import DraftConfig
    from cactus_theory.lm.experiments.eval import EvalConfig

    assert registry.SAMPLING is SAMPLING and loop.SAMPLING is SAMPLING
    d = DraftConfig()
    assert (d.temperature, d.top_k, d.top_p) == SAMPLING.as_tuple()
    assert EvalConfig().sampling == SAMPLING.as_dict()
    for fn in (loop.speculative_generate, loop.autoregressive_generate, loop.first_step_laws):
        sig = inspect.signature(fn).parameters
        assert tuple(sig[k].default for k in SAMPLING.keys()) == SAMPLING.as_tuple(), fn.__name__


def test_no_sampling_literal_outside_its_module():
    """``0.95`` as a top-p and ``0.6`` / ``20`` as keyword sampling defaults appear only in core/sampling.py."""
    pat = re.compile(r"top_p\W{1,4}0\.95|\"temperature\": 0\.6|temperature=0\.6|top_k=20\b|PAPER = \(0\.6")
    hits = []
    for folder in ("cactus_theory", "paper_repro", "benchmarks"):
        for p in (ROOT / folder).rglob("*.py"):
            if p.name == "sampling.py" and p.parent.name == "core":
                continue
            hits += [f"{p.relative_to(ROOT)}:{i}" for i, line in enumerate(p.read_text().splitlines(), 1)
                     if pat.search(line)]
    assert not hits, hits


# -- divergences ------------------------------------------------------------------------------------

def test_every_divergence_list_derives_from_the_one():
    from cactus_theory.claims.report import THM2_DIVERGENCES
    from cactus_theory.theory import optimize
    from paper_repro.fig_b_gamma import CVX_DIVS

    assert set(optimize.CVX_DIVERGENCES) == set(F_DIVERGENCES) - set(optimize.CVX_UNSUPPORTED)
    assert tuple(optimize.CVX_DIVERGENCES) == tuple(d for d in F_DIVERGENCES if d in optimize.CVX_DIVERGENCES)
    assert all(isinstance(r, str) and r for r in optimize.CVX_UNSUPPORTED.values())
    assert sorted(CVX_DIVS) == sorted(optimize.CVX_DIVERGENCES)
    assert {k for k, s in registry.DIVERGENCES.items() if s.f_divergence} == set(F_DIVERGENCES)
    assert tuple(THM2_DIVERGENCES) == tuple(F_DIVERGENCES)
    assert registry.spec("cactus").params[1].choices == tuple(F_DIVERGENCES)


def test_a_new_divergence_joins_figure_b_last(monkeypatch):
    from cactus_theory.theory import optimize
    from paper_repro import fig_b_gamma

    order = sorted((*optimize.CVX_DIVERGENCES, "new"),
                   key=lambda d: fig_b_gamma.DRAW_ORDER.index(d) if d in fig_b_gamma.DRAW_ORDER else 99)
    assert order[-1] == "new" and order[:-1] == fig_b_gamma.CVX_DIVS


# -- keyed caches -----------------------------------------------------------------------------------

def test_config_key_is_the_sorted_json_sha256():
    cfg = {"b": [1, 2.5, None], "a": {"y": True, "x": "s"}}
    want = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()
    assert config_key(cfg) == want[:16] and config_key(cfg, 12) == want[:12]
    assert config_key({**cfg, "c": 0}) != config_key(cfg) and config_key({"b": [2, 1]}) != config_key({"b": [1, 2]})


def test_keyed_file_reuses_only_its_own_key_and_survives_damage(tmp_path):
    path = tmp_path / "x.json"
    calls = []
    f = KeyedFile(path, {"n": 1})
    assert f.load() is None
    assert f.compute(lambda: calls.append(1) or {"v": 1}) == {"v": 1}
    assert KeyedFile(path, {"n": 1}).load() == {"v": 1} and KeyedFile(path, {"n": 2}).load() is None
    stored = json.loads(path.read_text())
    assert set(stored) == {"key", "config", "seconds", "data"} and stored["config"] == {"n": 1}
    path.write_text("{ damaged")
    assert KeyedFile(path, {"n": 1}).load() is None and read_json(path, "d") == "d"


def test_keyed_dir_resets_stale_pieces(tmp_path):
    d = KeyedDir(tmp_path / "p", {"n": 1})
    assert d.stale
    d.reset()
    d.store("a", [1])
    again = KeyedDir(tmp_path / "p", {"n": 1})
    assert not again.stale and again.load("a") == [1]
    other = KeyedDir(tmp_path / "p", {"n": 2})
    assert other.stale
    other.reset()
    assert other.load("a") is None and (tmp_path / "p" / "KEY").read_text().strip() == other.key
    sub = keyed_subdir(tmp_path / "e", {"k": 1})
    assert sub.name == config_key({"k": 1}, 12) and json.loads((sub / "config.json").read_text()) == {"k": 1}


def test_committed_results_keys_are_their_configs_keys():
    from paper_repro.common import config_key as step_key

    for p in sorted(RESULTS.glob("*.json")):
        stored = json.loads(p.read_text())
        if isinstance(stored, dict) and "key" in stored:
            assert step_key(stored["config"]) == stored["key"], p.name
    parts = RESULTS / "lm_runs.parts"
    from paper_repro.common import Ctx
    from paper_repro.lm_runs import lm_config

    assert (parts / "KEY").read_text().strip() == step_key(lm_config(Ctx()))


@pytest.mark.parametrize("module", ["fig_b_gamma", "fig_c_tradeoff", "fig_d_gamma_delta",
                                    "fig_i_multi_draft", "table_g_production", "table_q_graphcore_grid"])
def test_the_steps_configs_give_the_committed_keys(module):
    import importlib

    from paper_repro.common import Ctx
    from paper_repro.common import config_key as step_key

    mod = importlib.import_module(f"paper_repro.{module}")
    stored = json.loads((RESULTS / f"{module}.json").read_text())
    assert step_key(mod.config(Ctx())) == stored["key"], module


def test_the_eval_cache_key_is_unchanged():
    from cactus_theory.lm.experiments.eval import EvalConfig

    cfg = EvalConfig(**json.loads((RESULTS / "eval" / "eval.json").read_text())["config"])
    old = hashlib.sha256(json.dumps(cfg.as_dict(), sort_keys=True).encode()).hexdigest()[:12]
    assert cfg.key() == old


def test_figure_i_key_covers_the_registry_rules(monkeypatch):
    from paper_repro import fig_i_multi_draft as fig_i
    from paper_repro.common import Ctx
    from paper_repro.common import config_key as step_key

    before = step_key(fig_i.config(Ctx()))
    rules = dict(registry.RULES)
    rules["planted"] = dataclasses.replace(registry.RULES["interpolation"], key="planted")
    monkeypatch.setattr(registry, "RULES", rules)
    cfg = fig_i.config(Ctx())
    assert step_key(cfg) != before
    assert len(fig_i.frontier_rules(cfg["cactus"])) == len(cfg["rules"])  # the key names what the panel runs
    monkeypatch.setattr(registry, "RULES", {k: v for k, v in rules.items() if k != "planted"})
    assert step_key(fig_i.config(Ctx())) == before


def test_figure_i_key_covers_a_rule_s_revision(monkeypatch):
    from paper_repro import fig_i_multi_draft as fig_i
    from paper_repro.common import Ctx

    cfg = fig_i.config(Ctx())
    changed = copy.deepcopy(cfg)
    changed["rules"][-1] += "@r9"
    assert cfg["rules"] == [r.identity for r in fig_i.frontier_rules(cfg["cactus"])]
    assert changed != cfg


# -- the draft's build time -------------------------------------------------------------------------

def test_the_build_time_is_the_measured_one_and_stated_once():
    from cactus_theory.lm.draft import BUILD_TIME, MissingDraftError

    build = json.loads((RESULTS / "draft_build.json").read_text())
    minutes = int(re.search(r"about (\d+) minutes on (\d+) CPU cores", BUILD_TIME).group(1))
    cores = int(re.search(r"on (\d+) CPU cores", BUILD_TIME).group(1))
    assert minutes == round(build["seconds"] / 60) and cores == build["threads"]
    err = MissingDraftError.not_built("/nowhere/draft.pt")
    assert isinstance(err, ValueError) and BUILD_TIME in str(err) and "build-draft" in str(err)
    stated = [p for p in (ROOT / "cactus_theory").rglob("*.py") if re.search(r"\d+(-\d+)? minutes on \d", p.read_text())]
    assert [p.name for p in stated] == ["draft_config.py"]  # BUILD_TIME, re-exported by draft.py
