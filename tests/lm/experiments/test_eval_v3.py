"""eval_v3 (paper_repro/protocols/eval_v3.json): the methods it lists, committed shards that a run resumes from
and that alone complete a run, the blinded re-estimation of the replicates, the A/A equivalence claim and the
sweep's plan; each checked against a direct count or formula written here, on a tiny pair (the real LM's run is
the committed shards themselves)."""

from __future__ import annotations

import gzip
import json
import math
import shutil

import numpy as np
import pytest
from scipy import stats

from cactus_theory.lm.experiments import replicated as rp
from cactus_theory.lm.experiments.protocol import DEFAULT_PROTOCOL, PROTOCOLS, load_protocol
from tests.lm.experiments.test_replicated import RAGGED

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_default_protocol_is_eval_v3_found_from_the_package():
    assert DEFAULT_PROTOCOL.is_absolute() and DEFAULT_PROTOCOL == PROTOCOLS / "eval_v3.json"
    proto = load_protocol()
    d, a = proto.design, proto.analysis
    labels = [m.label for m in rp.protocol_methods(proto)]
    assert labels == ["verifier alone", "SpS", "Cactus delta=0.75", "Cactus delta=1", "TAS epsilon=0.09"]
    for claim in a["claims"].values():  # every claimed rule is run
        assert set(claim["rules"]) <= set(labels)
    assert set(a["aa_claim"]["methods"]) <= set(labels)
    # the planned numbers the protocol states, from its own design (normal approximation)
    n, R, w, m = d["questions_per_task"], d["replicates"], 0.16, a["margin_points"] / 100
    se = math.sqrt(w * (1 / R + 1 / (2 * R)) / n)
    part = stats.norm.cdf(m / se - stats.norm.ppf(0.975))
    assert f"SE of a part {100 * se:.3f}" in a["planned_power"] and f"{part:.3f}" in a["planned_power"]
    assert f"{part ** 4:.3f}" in a["planned_power"] and f"{part ** 2:.3f}" in a["planned_power"]
    # the sweep: every registry rule not in the primary run, none twice; its rows are the primary's first batches
    sw = d["sweep"]
    assert sw["questions"] * sw["replicates"] % d["batch_size"] == 0
    keys = [(s["key"], json.dumps(s.get("params", {}), sort_keys=True)) for s in d["methods"] + sw["methods"]]
    assert len(keys) == len(set(keys))


def _protocol(tmp_path, **design) -> rp.Protocol:
    """eval_v3 shrunk for a tiny pair, as a file of its own (its shards go beside it, under tmp_path)."""
    content = json.loads((PROTOCOLS / "eval_v3.json").read_text())
    content["design"].update(questions_per_task=6, replicates=2, max_new_tokens=8, batch_size=4, k=2,
                             dtype="float32", threads=1)
    content["design"]["shards"]["batches_per_shard"] = 2
    content["design"]["reestimation"].update(after_batches=2, max_replicates=3)
    content["design"]["sweep"].update(questions=4)
    content["design"].update(design)
    path = tmp_path / "protocols" / "eval_v3.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(content, indent=1))
    return load_protocol(path)


def _run(proto, out, pair, cache=None):
    cfg, dev = rp.RunConfig.from_protocol(proto, "tiny-ragged")
    assert dev == []
    res = rp.evaluate(pair, proto, cfg, out, cache, progress=False, lawtests=False, figure=False, log=lambda *_: None)
    return res, json.loads((out / "eval.json").read_text())


def _shards(root):
    out = {}
    for f in sorted(root.glob("*/*/*/c*.json.gz")):
        with gzip.open(f, "rt") as fh:
            out[f.relative_to(root).as_posix()] = json.load(fh)
    return out


def _stable(saved: dict) -> dict:
    """What a rerun must reproduce: the rows, the summary and the claims (not the clock of this run)."""
    return {k: saved[k] for k in ("rows", "summary", "claims", "config", "methods")}


def test_shards_resume_and_complete_a_run(tmp_path):
    proto = _protocol(tmp_path, reestimation={"after_batches": 99, "max_replicates": 2, "when": "", "statistic": "",
                                              "rule": ""})
    out = tmp_path / "results" / "eval_v3"
    calls = []

    def loader():
        calls.append(1)
        return RAGGED

    res, saved = _run(proto, out, loader)
    assert calls == [1]  # loaded once, when the first batch had to be decoded
    root = tmp_path / "results" / "eval_v3" / "shards"
    sh = _shards(root)
    n_batches = math.ceil(6 * 2 / 4)
    # one shard per (task, chunk of 2 batches), every method's batches in it, no token ids
    key = rp.RunConfig.from_protocol(proto, "tiny-ragged")[0].decode_key()
    assert sorted(sh) == sorted(f"{key}/primary/{t}/c{c:03d}.json.gz" for t in proto.design["tasks"]
                                for c in range(math.ceil(n_batches / 2)))
    labels = [m["label"] for m in saved["methods"]]
    for s in sh.values():
        assert s["protocol_sha256"] == proto.sha256 and s["machine"]["threads"] >= 1 and len(s["methods"]) == 5
        for m in s["methods"].values():
            assert sorted(map(int, m["batches"])) == s["batches"]
            for batch in m["batches"].values():
                assert all("tokens" not in r and "text" in r for r in batch["records"])
    # every record of the raw result is in exactly one shard, equal but for its token ids
    for t, tr in res["raw"]["tasks"].items():
        for lab in labels:
            in_shards = [r for s in sh.values() if s["task"] == t for m in s["methods"].values()
                         if m["rule"] == next(x["rule"] for x in saved["methods"] if x["label"] == lab)
                         for b in m["batches"].values() for r in b["records"]]
            assert sorted(json.dumps(r, sort_keys=True) for r in in_shards) == sorted(
                json.dumps({k: v for k, v in r.items() if k != "tokens"}, sort_keys=True) for r in tr["records"][lab])
    # complete from the shards alone: no local cache, no model (and the command knows it before any load)
    cfg0, _ = rp.RunConfig.from_protocol(proto, "tiny-ragged")
    assert rp.complete_in_shards(proto, cfg0)
    shutil.rmtree(out / "cache")
    _, again = _run(proto, out, lambda: pytest.fail("a model was loaded"))
    assert _stable(again) == _stable(saved)
    # one shard removed: only its batches are decoded again, and the result is the same
    gone = sorted(sh)[1]
    (root / gone).unlink()
    assert not rp.complete_in_shards(proto, cfg0)
    shutil.rmtree(out / "cache")
    decoded = []
    real = rp._decode

    def counting(pair, problems, rows, method, cfg, task):
        decoded.append((task, tuple(rows)))
        return real(pair, problems, rows, method, cfg, task)

    rp_decode, rp._decode = rp._decode, counting
    try:
        _, third = _run(proto, out, lambda: RAGGED)
    finally:
        rp._decode = rp_decode
    missing = sh[gone]
    want_rows = {tuple(map(tuple, ([q, r] for q, r, _ in b["rows"]))) for m in missing["methods"].values()
                 for b in m["batches"].values()}
    assert {rows for _, rows in decoded} == want_rows and {t for t, _ in decoded} == {missing["task"]}
    assert len(decoded) == 5 * len(missing["batches"])
    # the same decodes (the same seeds): every outcome, counter, summary and claim; only the re-decoded batches'
    # seconds differ
    assert {t: r["per_question"] for t, r in third["rows"].items()} == \
        {t: r["per_question"] for t, r in saved["rows"].items()}
    assert third["claims"] == saved["claims"]
    for t, task in saved["summary"]["tasks"].items():
        assert {k: v for k, v in third["summary"]["tasks"][t].items() if k != "wall_clock"} == \
            {k: v for k, v in task.items() if k != "wall_clock"}
    def no_clock(shard):
        return {**shard, "methods": {k: {**m, "batches": {b: {**x, "seconds": None} for b, x in m["batches"].items()}}
                                     for k, m in shard["methods"].items()}}

    assert no_clock(_shards(root)[gone]) == no_clock(sh[gone])  # written again: the same seeds, the same decodes


@pytest.mark.parametrize("forced", [None, 3])
def test_blinded_reestimation_raises_the_replicates_and_keeps_what_was_decoded(tmp_path, monkeypatch, forced):
    """The decision written before any later batch, from the blinded variance; ``forced``: the rule's answer
    replaced by 3 (the tiny pair answers nothing right, w = 0 keeps R), so the extension itself is exercised."""
    proto = _protocol(tmp_path)
    out = tmp_path / "results" / "eval_v3"
    if forced:
        real = rp.reestimated_replicates
        monkeypatch.setattr(rp, "reestimated_replicates", lambda *a, **k: {**real(*a, **k), "replicates": forced})
    res, saved = _run(proto, out, RAGGED)
    rec = json.loads((out / "reestimation.json").read_text())
    # the blinded variance against a direct count over the first after_batches batches (every method pooled)
    batches = rp.batch_rows(6, 2, 4)[:2]
    for t, tr in res["raw"]["tasks"].items():
        runs = {}
        for recs in tr["records"].values():
            for r in recs:
                if (r["q"], r["r"]) in {x for b in batches for x in b}:
                    runs.setdefault(r["q"], []).append(float(r["correct"]))
        v = [np.var(x, ddof=1) for x in runs.values() if len(x) >= 2]
        assert rec["blinded_variance"][t]["w"] == pytest.approx(float(np.mean(v)) if v else math.nan, nan_ok=True)
    # the decision, from the protocol's formula written out
    w = {t: v["w"] for t, v in rec["blinded_variance"].items()}
    z = stats.norm.ppf(0.975)

    def power(r):
        out_ = 1.0
        for wt in w.values():  # a task with w = 0 has no noise: its parts pass
            out_ *= 1.0 if wt == 0 else stats.norm.cdf(0.03 / math.sqrt(wt * (1 / r + 1 / (2 * r)) / 6) - z) ** 2
        return out_

    if forced is None:
        want = 2 if all(x == 0 for x in w.values()) else next((r for r in (2, 3) if power(r) >= 0.8), 3)
        assert rec["replicates"] == want
    if all(np.isfinite(list(w.values()))):
        for r in (2, 3):
            assert rec["claim_power"][str(r)] == pytest.approx(power(r))
    # the run went on with the decided replicates: every question has that many runs per method
    assert saved["config"]["replicates"] == rec["replicates"]
    for t in saved["rows"]:
        for lab, per in saved["rows"][t]["per_question"].items():
            assert all(len(x) == rec["replicates"] for x in per["correct"].split()), (t, lab)


def test_the_reestimation_rule():
    # a small variance keeps R; a large one raises it, never above the cap; powers are the formula's
    keep = rp.reestimated_replicates({"a": 0.05, "b": 0.05}, 1120, 3, 5, 0.03)
    assert keep["replicates"] == 3 and keep["claim_power"]["3"] > 0.99
    up = rp.reestimated_replicates({"a": 0.191, "b": 0.191}, 1120, 3, 5, 0.03)
    assert up["replicates"] == 4
    assert up["claim_power"]["3"] == pytest.approx(0.660, abs=2e-3) and up["claim_power"]["4"] == pytest.approx(0.861, abs=2e-3)
    cap = rp.reestimated_replicates({"a": 0.25, "b": 0.25}, 200, 3, 5, 0.03)
    assert cap["replicates"] == 5 and cap["claim_power"]["5"] < 0.8
    assert rp.reestimated_replicates({"a": 0.0, "b": 0.0}, 10, 3, 5, 0.03)["replicates"] == 3  # no noise
    assert rp.reestimated_replicates({"a": math.nan, "b": 0.1}, 10, 3, 5, 0.03)["replicates"] == 5  # unknown: the cap


def test_the_aa_equivalence_claim_against_a_direct_interval():
    rng = np.random.default_rng(4)
    n, R = 300, 3

    def recs(p):
        return [{"q": q, "r": r, "correct": bool(rng.random() < p[q]), "strict": False,
                 **{c: 0 for c in rp.COUNTERS}} for r in range(R) for q in range(n)]

    for shift, want in ((0.0, "equivalent within the margin"), (0.2, "differs")):
        raw = {"tasks": {}}
        ds = []
        for t in ("a", "b"):
            p = rng.uniform(0.1, 0.5, n)
            ra, rb = recs(p), recs(np.clip(p + shift, 0, 1))
            raw["tasks"][t] = {"records": {"verifier alone": ra, "SpS": rb}}
            ma = np.array([[x["correct"] for x in ra if x["q"] == q] for q in range(n)]).mean(1)
            mb = np.array([[x["correct"] for x in rb if x["q"] == q] for q in range(n)]).mean(1)
            ds.append(ma - mb)
        d = np.concatenate(ds)
        got = rp.aa_equivalence(raw, "verifier alone", "SpS", n, R, 0.03 if shift == 0 else 0.03)
        half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
        assert got["questions"] == 2 * n
        assert got["estimate"] == pytest.approx(d.mean()) and got["low"] == pytest.approx(d.mean() - half)
        assert got["high"] == pytest.approx(d.mean() + half)
        lo, hi = got["low"], got["high"]
        direct = "differs" if lo > 0 or hi < 0 else ("equivalent within the margin" if -0.03 < lo and hi < 0.03
                                                     else "inconclusive")
        assert got["verdict"] == direct
        if shift:
            assert got["verdict"] == want


def test_the_sweep_plan_reuses_the_primary_rows():
    proto = load_protocol()
    cfg, _ = rp.RunConfig.from_protocol(proto, "pair")
    scfg, ml, seal, n_batches = rp.sweep_plan(proto, cfg)
    assert scfg.decode_key() == cfg.decode_key()  # the same cache folder and shards: the same rows and seeds
    assert n_batches == 10 and scfg.tasks == ["add_wide"] and scfg.replicates == 1
    assert rp.batch_rows(scfg.questions, 1, scfg.batch_size)[:n_batches] == rp.batch_rows(
        cfg.questions, cfg.replicates, cfg.batch_size)[:n_batches]
    assert [m.label for m in ml[:2]] == ["verifier alone", "SpS"] and set(seal) == {m.label for m in ml[2:]}
    assert len(seal) == len(proto.design["sweep"]["methods"]) + 2  # and the two tree rows


def test_the_sweep_reading_against_direct_formulas():
    """``sweep.analyse_sweep`` on constructed records: the difference from the pool against scipy's one-sample t
    test, Holm written out, the verdict rule, AL and Rej from direct sums."""
    from cactus_theory.lm.experiments.sweep import analyse_sweep, format_sweep

    rng = np.random.default_rng(7)
    n, R = 120, 3
    p = rng.uniform(0.05, 0.6, n)

    def recs(shift, reps, accepted):
        return [{"q": q, "r": r, "correct": bool(rng.random() < min(1, p[q] + shift)), "strict": False,
                 "new_tokens": 30, "steps": 10, "accepted": accepted, "drafted": 40, "kl_sum": 0.5, "kl_count": 10,
                 "nll_sum": 3.0, "nll_count": 30} for r in range(reps) for q in range(n)]

    primary = {"verifier alone": recs(0, R, 0), "SpS": recs(0, R, 8)}
    sweep = {"same": recs(0, 1, 12), "worse": recs(-0.3, 1, 20)}
    res = analyse_sweep(primary, sweep, ["same", "worse"], n)
    pool = np.zeros(n)
    for lab in primary:
        for r in primary[lab]:
            pool[r["q"]] += r["correct"] / (2 * R)
    ps = []
    for lab in ("same", "worse"):
        y = np.array([r["correct"] for r in sorted(sweep[lab], key=lambda r: r["q"])], float)
        t = stats.ttest_1samp(y - pool, 0.0)
        v = res["methods"][lab]["vs_pool"]
        assert v["estimate"] == pytest.approx((y - pool).mean()) and v["p_two_sided"] == pytest.approx(t.pvalue)
        lo, hi = t.confidence_interval(0.95)
        assert (v["low"], v["high"]) == pytest.approx((lo, hi))
        ps.append(t.pvalue)
    order = np.argsort(ps)
    holm = [0.0, 0.0]
    holm[order[0]] = min(1, 2 * ps[order[0]])
    holm[order[1]] = max(holm[order[0]], min(1, ps[order[1]]))
    for lab, h in zip(("same", "worse"), holm, strict=True):
        v = res["methods"][lab]["vs_pool"]
        assert v["holm"] == pytest.approx(h)
        assert v["verdict"] == ("differs" if h < 0.05 else "no difference detected")
    assert res["methods"]["worse"]["vs_pool"]["verdict"] == "differs"  # a 30-point loss at n = 120
    # AL = (accepted + steps) / steps; Rej vs SpS = (rejected per token) / SpS's - 1, SpS at replicate 0
    assert res["methods"]["same"]["al"][0] == pytest.approx(22 / 10)
    assert res["methods"]["worse"]["rej_vs_sps"][0] == pytest.approx((20 / 30) / (32 / 30) - 1)
    md = format_sweep(res, "add_wide")
    assert "never 'consistent'" in md and "| worse |" in md and "consistent |" not in md


def test_committed_shards_of_another_protocol_hash_refuse_without_an_amendment(tmp_path):
    from cactus_theory.lm.experiments.protocol import ProtocolChanged

    proto = _protocol(tmp_path, reestimation={"after_batches": 99, "max_replicates": 2, "when": "", "statistic": "",
                                              "rule": ""})
    out = tmp_path / "results" / "eval_v3"
    _run(proto, out, RAGGED)
    shutil.rmtree(out / "cache")
    (out / "eval.json").unlink()  # only the shards remain to say which protocol they were made under
    path = tmp_path / "protocols" / "eval_v3.json"
    content = json.loads(path.read_text())
    content["analysis"]["margin_points"] = 2.0  # edited after results exist
    path.write_text(json.dumps(content, indent=1))
    edited = load_protocol(path)
    cfg, _ = rp.RunConfig.from_protocol(edited, "tiny-ragged")
    with pytest.raises(ProtocolChanged, match="changed after results exist .*shards"):
        rp.evaluate(lambda: pytest.fail("a model was loaded"), edited, cfg, out, progress=False, lawtests=False,
                    figure=False, log=lambda *_: None)
    res = rp.evaluate(lambda: pytest.fail("a model was loaded"), edited, cfg, out, progress=False, lawtests=False,
                      figure=False, log=lambda *_: None, amendment="margin typo")
    assert [a["reason"] for a in res["protocol"]["amendments"]] == ["margin typo"]
    assert res["protocol"]["amendments"][0]["from"] == proto.sha256


def test_a_run_without_the_shards_writes_none(tmp_path):
    """What the command does for a run that deviates from the protocol: its decodes stay in its own cache."""
    proto = _protocol(tmp_path, reestimation={"after_batches": 99, "max_replicates": 2, "when": "", "statistic": "",
                                              "rule": ""})
    out = tmp_path / "elsewhere"
    cfg, _ = rp.RunConfig.from_protocol(proto, "tiny-ragged")
    res = rp.evaluate(RAGGED, proto, cfg, out, progress=False, lawtests=False, figure=False, log=lambda *_: None,
                      use_shards=False)
    assert "shards" not in res and not (tmp_path / "results").exists()
    assert any((out / "cache").rglob("b*.json"))
