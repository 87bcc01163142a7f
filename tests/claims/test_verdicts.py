"""Issue 18's rules for verdicts, each with a test that fails when the rule is broken: one primary check
per statement (a weak check never vetoes), "matches" as non-inferiority on the metric the claim names,
Holm over the declared family with a pooled-lossless reference and the minimum detectable difference,
power only where a test has it (a one-bin law is not testable and not counted), the wall clock over
batches with a t-interval, and a headline with correct plurals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cactus_theory.claims.ledger import holm
from cactus_theory.lm.experiments import eval as ev
from cactus_theory.stats import paired_difference


def _diff(x, y):
    return ev._paired_dict(paired_difference(np.asarray(x), np.asarray(y), seed=0))


def fake_eval(n=300, lenient=None, strict=None, al_diff=(0.3, 0.2, 0.4), rej=(-0.2, -0.3, -0.1), batches=10,
              speed=1.2, noise=0.02, seed=0):
    """An eval result with per-problem records: ``lenient`` / ``strict`` map a label to its accuracy shift
    (in problems flipped from wrong to right relative to SpS)."""
    rng = np.random.default_rng(seed)
    labels = [("verifier alone", None, {}), ("SpS", "sps", {}), ("SGLang threshold threshold_acc=1", "sglang", {}),
              ("Cactus delta=0.75", "cactus", {"delta": 0.75}), ("Cactus delta=1", "cactus", {"delta": 1.0}),
              ("TAS epsilon=0.09", "tas", {"epsilon": 0.09, "alpha": 0.3})]
    base = rng.random(n) < 0.5
    sbase = rng.random(n) < 0.1
    recs, summary, secs = {}, {}, {}
    lenient, strict = lenient or {}, strict or {}
    for lab, _, _ in labels:
        c = base.copy()
        s = sbase.copy()
        k = lenient.get(lab, 0)
        if k > 0:
            c[np.flatnonzero(~c)[:k]] = True
        elif k < 0:
            c[np.flatnonzero(c)[:-k]] = False
        k = strict.get(lab, 0)
        if k > 0:
            s[np.flatnonzero(~s)[:k]] = True
        elif k < 0:
            s[np.flatnonzero(s)[:-k]] = False
        if lab != "SpS":  # some discordance both ways, as real runs have
            flip = rng.choice(n, 30, replace=False)
            c[flip[:15]] = ~c[flip[:15]]
        # ids of the arith task's draws, as a first-design eval has them: step h groups them by question
        recs[lab] = [{"id": f"arith/0/{i}", "correct": bool(c[i]), "strict": bool(s[i])} for i in range(n)]
    tok = 1000
    for lab, key, _ in labels:
        r = 1.0 if key is None else (speed if key == "cactus" else 0.9)
        secs[lab] = [{"tokens": tok, "seconds": 10.0 / (r * math.exp(noise * rng.standard_normal()))} for _ in range(batches)]
    sps_c = [r["correct"] for r in recs["SpS"]]
    for lab, key, _ in labels:
        c = [r["correct"] for r in recs[lab]]
        row = {"problems": n, "accuracy": [float(np.mean(c)), 0, 1], "diff_vs_sps": _diff(c, sps_c),
               "strict_accuracy": float(np.mean([r["strict"] for r in recs[lab]])), "nll": [1, 1, 1]}
        if key is not None:
            row.update(al=[2.0, 1.9, 2.1], al_diff_vs_sps=list(al_diff), rej_vs_sps=list(rej), acceptance=[0.2, 0.1, 0.3],
                       step_kl=[0.1, 0.1, 0.1], speedup=[1.0, 0.9, 1.1])
        summary[lab] = row
    return {"config": {"task": "arith", "problems": n, "k": 4, "seed": 0, "batch_size": 32,
                       "sampling": {"temperature": 0.6, "top_k": 20, "top_p": 0.95}},
            "methods": [{"label": lab, "key": key, "params": p} for lab, key, p in labels],
            "records": recs, "summary": summary, "seconds": secs}


def by_key(claims, key, role="primary"):
    return next(c for c in claims if c.key == key and c.role == role)


def fake_replicated(shift: float = 0.0, n: int = 800, R: int = 4, base=(1, 8), seed: int = 0) -> dict:
    """A format-2 (replicated) eval made by the real analysis (``replicated.analyse``) from constructed rows: per
    question an accuracy p_i ~ Beta(base), every run Bernoulli(p_i), Cactus's runs Bernoulli(p_i + shift)."""
    from cactus_theory.lm.experiments import replicated as rp
    from cactus_theory.lm.experiments.eval import method_info, methods
    from cactus_theory.lm.experiments.protocol import PROTOCOLS, load_protocol
    from cactus_theory.lm.experiments.tasks import Problem

    proto = load_protocol(PROTOCOLS / "eval_v2.json")  # the grid design; eval_v3's claims: test_eval_v3.py
    info = [method_info(m) for m in methods(grid=proto.design["grid"], only=["Cactus delta=0.75", "Cactus delta=1",
                                                                              "tas"])]
    cfg, _ = rp.RunConfig.from_protocol(proto, "fake", questions=n, replicates=R, trees=[])
    rng = np.random.default_rng(seed)
    raw = {"tasks": {}}
    for t in cfg.tasks:
        p = rng.beta(*base, n)
        recs, timing = {}, {}
        for m in info:
            out = rng.random((n, R)) < np.clip(p + (shift if m["key"] == "cactus" else 0.0), 0, 1)[:, None]
            spec = m["key"] is not None
            recs[m["label"]] = [{"q": q, "r": r, "correct": bool(out[q, r]), "strict": bool(out[q, r]),
                                 "new_tokens": 20, "steps": 10 if spec else 0, "accepted": (10 if m["key"] == "sps"
                                 else 12) if spec else 0, "drafted": 40 if spec else 0, "kl_sum": 0.0,
                                 "kl_count": 1, "nll_sum": 1.0, "nll_count": 20} for r in range(R) for q in range(n)]
            timing[m["label"]] = [{"batch": b, "rows": cfg.batch_size, "tokens": 600 + 7 * b, "position": 0,
                                   "seconds": (1.0 + 0.1 * b) * (0.8 if m["key"] == "cactus" else 1.0)
                                   * math.exp(0.01 * rng.standard_normal())} for b in range(8)]
        raw["tasks"][t] = {"problems": [Problem(f"{t}/{i}", f"q{i}", 1) for i in range(n)], "records": recs,
                           "timing": timing}
    res = {"format": 2, "protocol": {"path": str(proto.path), "sha256": proto.sha256, "content": proto.content},
           "config": cfg.as_dict(), "methods": info}
    res["summary"] = rp.analyse(raw, info, {**proto.analysis, "aa_splits": 100}, cfg)
    return res


def test_claim_10_rule_reaches_each_of_its_verdicts(monkeypatch):
    """Claim 10 (Cactus 0.75 and 1 match the verifier's accuracy) read from a replicated eval by the protocol's
    rule: consistent when Cactus has the lossless accuracy, inconclusive when its loss sits at the margin,
    differs when it loses far more, out of reach when the reference is too low for a loss to show; it prints
    non-inferiority p-values, never a superiority p-value."""
    from cactus_theory.lm.experiments import replicated as rp
    from paper_repro import table_h_eval as h

    monkeypatch.setattr(rp, "N_BOOT", 300)  # the acceptance intervals only; the verdicts use t-intervals
    seen = {}
    for shift, want in ((0.0, "consistent"), (-0.03, "inconclusive"), (-0.15, "differs")):
        res = fake_replicated(shift)
        c = by_key(h.claims_v2(res), "main-scores-cactus")
        seen[want] = c.verdict
        assert c.verdict == want, (shift, c.ours)
        assert "non-inferiority p = " in c.ours and "McNemar" not in c.ours and "Holm" not in c.ours
        assert c.scope.startswith("SmolLM2-135M") and "3 points" in c.detail
        parts = [v for t in res["summary"]["tasks"].values() for lab, e in t["metrics"]["lenient"]["methods"].items()
                 if lab.startswith("Cactus") for v in [e["vs_lossless"]]]
        assert len(parts) == 4  # 2 rules x 2 tasks
        if want == "consistent":
            assert all(v["low"] > -0.03 and v["p_noninferior"] < 0.025 for v in parts)
        if want == "differs":
            assert any(v["high"] < -0.03 for v in parts) and "inferiority p" in c.ours
    assert seen == {"consistent": "consistent", "inconclusive": "inconclusive", "differs": "differs"}
    low = fake_replicated(0.0, base=(1, 30))  # the lossless runs score about 3%: below 2 x margin
    assert by_key(h.claims_v2(low), "main-scores-cactus").verdict == "out of reach"
    cl = h.claims_v2(res)  # the last: Cactus 15 points worse
    assert by_key(cl, "main-acceptance").verdict == "consistent"  # Cactus and TAS accept 12 of 40 drafts, SpS 10
    assert by_key(cl, "wall-clock").verdict == "consistent"  # Cactus 0.8x the verifier's time per batch
    assert by_key(cl, "tas-arith").kind == "derived" and by_key(cl, "main-scores-tas-gpqa").verdict == "out of reach"


def test_step_h_reads_a_format_2_run_by_its_protocol(tmp_path, monkeypatch):
    """Step h with a committed format-2 run: eval.md re-rendered from it, the figure drawn, the claims from the
    protocol's rules (claims_v2), the first design's reduced run shown beside it."""
    import json

    from cactus_theory.lm.experiments import replicated as rp
    from paper_repro import table_h_eval as h
    from paper_repro.common import Ctx

    monkeypatch.setattr(rp, "N_BOOT", 300)
    full = fake_replicated(0.0, n=200)
    full["claims"] = rp.claim_verdicts(full)
    monkeypatch.setattr(h, "FULL", tmp_path / "eval" / "eval.json")
    h.FULL.parent.mkdir()
    h.FULL.write_text(json.dumps(full))
    ctx = Ctx(results=tmp_path / "results", figures=tmp_path / "figures")
    drawn = []  # the figure itself is drawn in the pilot (tests/lm/experiments/test_replicated.py): seconds saved here
    monkeypatch.setattr(rp, "plot_accuracy_vs_al", lambda r: drawn.append(r["format"]) or "fig")
    monkeypatch.setattr(h, "save_figure", lambda fig, c, stem: [f"{stem}:{fig}"])
    res = h.run_v2(ctx, fake_eval(), json.loads(h.FULL.read_text()), 0.0)
    assert (tmp_path / "eval" / "eval.md").read_text() == rp.format_report(full) + "\n"
    assert res.figures == ["fig_h_eval:fig"] and drawn == [2]
    assert res.data["full_format"] == 2
    text = res.data["sections"][0][1]
    assert "the replicated eval of the pre-registered protocol" in text and "the first eval design" in text
    assert {c.key for c in res.claims} >= {"main-scores-cactus", "tas-arith", "main-acceptance", "wall-clock"}
    assert all("McNemar" not in c.ours for c in res.claims if c.key in ("main-scores-cactus", "tas-arith"))


# -- one claim, one paper statement; "matches" as non-inferiority --------------------------------------
def test_main_scores_split_and_read_on_lenient_clustered_with_strict_beside_it():
    """Claim 10 on a first-design eval: primary on the lenient metric against the verifier alone and the pooled
    lossless runs, intervals over distinct questions; strict-match against SpS beside it (same runs), out of reach
    while SpS's strict-match accuracy is not above twice the margin. Each verdict of the rule is reached."""
    from paper_repro import table_h_eval as h

    cl = h.claims(fake_eval(), "full run")
    keys = [c.key for c in cl]
    assert "main-scores" not in keys  # the merged claim is gone
    assert {"main-scores-cactus", "main-scores-tas-gpqa", "tas-arith"} <= set(keys)
    prim = by_key(cl, "main-scores-cactus")
    assert "lenient extraction" in prim.how and "resampling whole distinct questions" in prim.how
    assert "-5 points" in prim.decision and "first design" in prim.decision and "eval_v3" in prim.ours
    # the 300 arith draws of seed 0 are 97 distinct questions (the committed eval's ids)
    assert prim.units == "97 distinct questions (300 problem-runs)" and "97 distinct questions" in prim.scope
    assert by_key(cl, "main-scores-cactus", "same runs").how.startswith("the same runs; accuracy by strict-match")
    assert by_key(cl, "main-scores-tas-gpqa").verdict == "out of reach"
    tas = by_key(cl, "tas-arith")
    assert tas.kind == "derived" and tas.scope  # our arithmetic result is scoped, not the paper's GPQA claim
    # Cactus a little below a lossless run (one part's estimate about -1 point) is non-inferior at a 5-point margin:
    # "matches" is not coded as "beats"
    res = fake_eval(lenient={"Cactus delta=0.75": -1, "Cactus delta=1": -3})
    parts = h.first_design_clustered(res)["parts"]
    assert min(p["estimate"] for p in parts) < 0 and all(p["low"] > -0.05 for p in parts)
    assert by_key(h.claims(res, "full run"), "main-scores-cactus").verdict == "consistent"
    # one part's interval reaching below -5 points while its upper end stays above: inconclusive
    res = fake_eval(lenient={"Cactus delta=0.75": -1, "Cactus delta=1": -12})
    parts = h.first_design_clustered(res)["parts"]
    assert min(p["low"] for p in parts) < -0.05 < min(p["high"] for p in parts)
    assert by_key(h.claims(res, "full run"), "main-scores-cactus").verdict == "inconclusive"
    # Cactus about 20 points worse than every lossless run: every interval lies below -5: differs
    res = fake_eval(lenient={"Cactus delta=0.75": -75, "Cactus delta=1": -75})
    assert all(p["high"] < -0.05 for p in h.first_design_clustered(res)["parts"])
    assert by_key(h.claims(res, "full run"), "main-scores-cactus").verdict == "differs"
    # strict-match: SpS near 10% cannot reach "differs" (out of reach); raised to ~60%, a 25-point loss differs there
    low = fake_eval(strict={"SpS": -10})
    assert low["summary"]["SpS"]["strict_accuracy"] <= 0.10
    assert by_key(h.claims(low, "full run"), "main-scores-cactus", "same runs").verdict == "out of reach"
    res = fake_eval(strict={"SpS": 150})
    assert by_key(h.claims(res, "full run"), "main-scores-cactus", "same runs").verdict == "differs"


def test_eval_table_has_holm_the_pooled_lossless_row_and_the_mdd():
    res = fake_eval(lenient={"TAS epsilon=0.09": 20})
    comp = ev.comparisons(res)
    fam = comp["family"]
    assert "SpS" not in fam and len(fam) == len(res["methods"]) - 1  # every method against SpS
    le = comp["metrics"]["lenient"]["diffs"]
    raw = [le[lab]["pvalue"] for lab in fam]
    assert [le[lab]["holm"] for lab in fam] == pytest.approx(holm(raw))
    assert le["TAS epsilon=0.09"]["holm"] > le["TAS epsilon=0.09"]["pvalue"]  # adjusted, not the raw value
    md = ev.format_table(res)
    assert "Holm" in md and "| pooled lossless (verifier alone + SpS + SGLang threshold threshold_acc=1; 900 problem-runs)" in md
    assert "Minimum detectable difference (lenient; 300 problems" in md and "Family of the p-values: the 5 comparisons" in md
    pl = comp["metrics"]["lenient"]["pooled_lossless"]
    per = np.mean([[r["correct"] for r in res["records"][lab]] for lab in pl["methods"]], 0)
    assert pl["estimate"] == pytest.approx(per.mean())
    # clustered by problem: the interval is wider than a naive one over 900 independent runs would be
    naive = 1.96 * math.sqrt(per.mean() * (1 - per.mean()) / 900)
    assert (pl["high"] - pl["low"]) / 2 > naive
    mdd = comp["metrics"]["lenient"]["mdd"]
    assert mdd["points"] == pytest.approx(2.8016 * math.sqrt(mdd["discordance"] / 300), rel=1e-3)


# -- wall clock: n = batches, a t-interval on the log ratio, per protocol -------------------------------
def test_wall_clock_is_over_batches_with_a_t_interval():
    from paper_repro import table_h_eval as h

    res = fake_eval(batches=10, speed=1.2, noise=0.05)
    w = by_key(h.claims(res, "full run"), "wall-clock")
    assert w.units == "10 batches" and "t-interval" in w.how and "batch 32" in w.scope
    iv = ev.speedup_interval(res["seconds"]["Cactus delta=1"], res["seconds"]["verifier alone"])
    assert iv.n == 10
    r = [math.log((a["tokens"] / a["seconds"]) / (b["tokens"] / b["seconds"]))
         for a, b in zip(res["seconds"]["Cactus delta=1"], res["seconds"]["verifier alone"], strict=True)]
    half = 2.262 * np.std(r, ddof=1) / math.sqrt(10)
    assert iv.hi - iv.lo == pytest.approx(2 * half, rel=1e-3)
    assert f"{math.exp(iv.lo):.2f}" in w.ours and w.verdict == "consistent"
    slow = fake_eval(batches=10, speed=1.0, noise=0.2, seed=1)
    assert by_key(h.claims(slow, "full run"), "wall-clock").verdict == "inconclusive"


def test_batch_1_is_another_protocol_never_a_veto():
    from cactus_theory.claims.ledger import Claim, combined_verdict

    def c(**kw):
        base = dict(key="wall-clock", claim="faster", ref="wall-clock experiment", kind="paper", how="h", ours="o",
                    verdict="consistent", paper="p", scope="batch 32")
        return Claim(**(base | kw))

    checks = [c(), c(verdict="inconclusive", scope="batch 1", role="other protocol")]
    assert combined_verdict(checks) == "consistent"


# -- power only where a test has it ------------------------------------------------------------------
def _lt(bins_list, reject_one_bin=False):
    step = [{"method": f"rule{i}", "prompt": 0, "draws": 20000, "bins": b, "pvalue": 1.0 if b < 2 else 0.5,
             "statistic": 0.0 if b < 2 else 1.0, "reject": False, "detectable_tv": 0.02} for i, b in enumerate(bins_list)]
    ctl = [{"prompt": 0, "draws": 20000, "bins": 5, "pvalue": 0.0, "reject": True, "tv_between_laws": 0.4,
            "detectable_tv": 0.02}]
    loop = {"draws": 1000, "sps_vs_verifier_3_tokens": {"bins": 5, "pvalue": 0.5, "reject": False,
                                                         "distinct_sequences": 9, "detectable_tv": 0.1},
            "cactus_second_token": {"bins": 4, "pvalue": 0.5, "reject": False, "draws": 1000, "detectable_tv": 0.1}}
    return {"alpha": 1e-4, "beta": 0.1, "step": step, "control": ctl, "loop": loop, "untested": {}}


def test_one_bin_tests_are_not_counted_and_power_is_on_their_own_bins():
    from cactus_theory.stats import detectable_tv
    from paper_repro import table_h_eval as h

    lt = _lt([1, 1, 2, 7])
    row = h.lawtest_claims(lt)[0]
    assert row.ours.startswith("0/2 testable tests reject") and "2 not testable" in row.ours
    assert row.units == "2 testable tests"
    md = h.lawtest_table(lt)
    assert "not testable" in md and "power on the pooled bins" in md
    # a 2-bin test's power on its own bins (1 degree of freedom), not max(bins, 2) of a 1-bin law
    tv2 = detectable_tv(20000, categories=2, alpha=1e-4, beta=0.1)
    tv7 = detectable_tv(20000, categories=7, alpha=1e-4, beta=0.1)
    assert f"{tv2:.3f}" in md and f"{tv7:.3f}" in md
    rule0 = next(line for line in md.splitlines() if line.startswith("| rule0:"))
    assert "| 0/1 | 0/0 |" in rule0 and rule0.endswith("| - |")  # no power shown for a test that has none
    # no testable test at all: nothing was checked, so no "holds" (the old count read "0/2 reject")
    assert h.lawtest_claims(_lt([1, 1]))[0].verdict == "out of reach"


def test_acceptance_verdicts_follow_the_intervals():
    """Step h's acceptance check: intervals above 0 (AL) / below 0 (Rej) -> consistent (another scale, named);
    the other side -> differs; across -> inconclusive."""
    from paper_repro import table_h_eval as h

    def v(al, rej):
        return by_key(h.claims(fake_eval(al_diff=al, rej=rej), "full run"), "main-acceptance")

    better = v((0.5, 0.4, 0.6), (-0.3, -0.4, -0.2))
    assert better.verdict == "consistent" and better.scope.startswith("SmolLM2-135M, k = 4")
    assert better.units == "300 problems"
    assert v((-0.1, -0.2, -0.05), (0.1, 0.05, 0.2)).verdict == "differs"
    assert v((0.0, -0.1, 0.1), (0.0, -0.1, 0.1)).verdict == "inconclusive"


# -- the committed files follow the rules --------------------------------------------------------------
def test_committed_eval_md_is_rendered_from_eval_json():
    import json

    from paper_repro.common import ROOT

    d = ROOT / "paper_repro" / "results" / "eval"
    assert (d / "eval.md").read_text() == ev.format_table(json.loads((d / "eval.json").read_text())) + "\n"


def test_committed_claims_have_one_primary_and_readme_one_line_per_claim():
    from cactus_theory.claims.ledger import group, resolve
    from paper_repro.common import RESULTS
    from paper_repro.findings import block, load_claims
    from paper_repro.report import NAMES

    claims = load_claims(RESULTS)
    g = group(claims)
    for cs in g.values():
        resolve(cs)  # exactly one primary, or ValueError
    assert "main-scores" not in g and {"main-scores-cactus", "main-scores-tas-gpqa", "tas-arith"} <= set(g)
    # steps e and f are one check of the main table, not two
    assert [c.source for c in g["main-acceptance"]] == ["fig_e_lm", "table_h_eval"]
    assert not any(c.source == "table_f_main" for c in claims)
    text = block()
    for key, cs in g.items():
        if cs[0].kind == "paper":
            assert text.count(f"* **{NAMES[key]}**") == 1, key
    # a 1-bin distribution test is never counted
    lt = next(c for c in claims if c.key == "samplers-real-lm")
    import json

    full = json.loads((RESULTS / "eval" / "eval.json").read_text())
    testable = sum(1 for t in full["lawtests"]["step"] if t["bins"] >= 2)  # the eval's own record of its tests
    assert "not testable" in lt.ours and lt.ours.split(" testable")[0] == f"0/{testable}"


# -- a row measured under an earlier definition of its rule is marked, never passed off as current ----------
def test_rows_measured_with_an_earlier_rule_definition_are_marked():
    from cactus_theory.rules import MedusaTypical, RelaxedAcceptance, SGLangThreshold

    res = fake_eval()
    res["methods"] = [dict(m) for m in res["methods"]]
    tas = next(m for m in res["methods"] if m["label"] == "TAS epsilon=0.09")
    tas["rule"] = ev._build(tas["key"], tas["params"]).identity
    assert ev.stale_methods(res) == {}  # current identity: not stale
    assert "earlier definition" not in ev.format_table(res)
    tas["rule"] = tas["rule"] + "@r0"  # as if measured under another revision
    assert list(ev.stale_methods(res)) == ["TAS epsilon=0.09"]
    assert "| TAS epsilon=0.09 (earlier definition) |" in ev.format_table(res)
    # the revised rules carry their revision in the identity that caches key on; SGLang only where its law moved
    assert MedusaTypical().identity.endswith("@r2") and RelaxedAcceptance().identity.endswith("@r2")
    assert SGLangThreshold().identity == repr(SGLangThreshold())
    assert SGLangThreshold(threshold_single=0.0).identity.endswith("@r2")


def test_eval_grid_refuses_a_parameter_the_rule_does_not_take():
    with pytest.raises(ValueError, match="not parameters of rule 'tas'"):
        ev._build("tas", {"epsilon": 0.09, "delta": 1.0})


def test_a_one_bin_step_test_reports_no_power():
    """The library's own step test (what `cactus-theory eval` prints) gives a one-bin law no detectable TV,
    and its table counts it apart (the old code showed a TV computed with max(bins, 2))."""
    from cactus_theory.lm.experiments.lawtests import format_lawtests, verify_step_test
    from cactus_theory.rules import SpS

    q = np.array([0.0, 1.0, 0.0, 0.0])
    one = verify_step_test(SpS(), q.copy(), q, draws=500, seed=0)
    assert one["bins"] == 1 and one["detectable_tv"] is None and one["pvalue"] == 1.0
    p2 = np.array([0.25, 0.25, 0.25, 0.25])
    two = verify_step_test(SpS(), p2, p2, draws=2000, seed=1)
    assert two["bins"] >= 2 and 0 < two["detectable_tv"] < 1
    ctl = dict(two, prompt=0, tv_between_laws=0.5)
    lt = {"alpha": 1e-4, "beta": 0.1, "step": [dict(one, method="SpS"), dict(two, method="SpS")], "control": [ctl],
          "loop": {"draws": 100, "sps_vs_verifier_3_tokens": {"bins": 1, "pvalue": 1.0, "reject": False,
                                                               "distinct_sequences": 1},
                   "cactus_second_token": {"bins": 3, "pvalue": 0.5, "reject": False, "draws": 1000}}}
    md = format_lawtests(lt)
    assert "| 1/2 | 0/1 |" in md  # one of two step tests testable, none of the testable ones rejects


# -- toy-only results say so ------------------------------------------------------------------------------------
def test_results_derived_on_toy_or_random_pairs_name_them_whatever_the_verdict():
    """A derived result (or a code check) whose evidence is toy or random pairs only reads "holds (on toy pairs)";
    a paper claim's "holds" never carries a scope. Checked on the steps' committed cached data (no recomputation)."""
    import json

    from cactus_theory.claims.ledger import Claim
    from paper_repro import fig_c_tradeoff, fig_d_gamma_delta, fig_i_multi_draft, table_k_trees
    from paper_repro.common import RESULTS

    c = Claim("k", "c", "r", "derived", "h", "o", "holds", scope="toy pairs")
    assert c.label == "holds (on toy pairs)" and c.passed
    with pytest.raises(ValueError, match="paper claim's 'holds' none"):
        Claim("k", "c", "r", "paper", "h", "o", "holds", paper="p", scope="toy pairs")
    toy_keys = {"topk-recovery", "gamma-far-above-delta", "kl-far-above-delta", "multi-draft-gain", "multi-draft-shape",
                "single-draft-frontier", "eagle-tree-lossy", "eagle-tree-prob-one", "tree-cactus-joint-share",
                "block-verification-lossless", "block-verification-al"}
    seen = set()
    for mod in (fig_c_tradeoff, fig_d_gamma_delta, fig_i_multi_draft, table_k_trees):
        d = json.loads((RESULTS / f"{mod.NAME}.json").read_text())["data"]
        # step c's claim of this kind alone (its frontier claim recomputes for seconds)
        rows = [fig_c_tradeoff._topk_claim(d["random"])] if mod is fig_c_tradeoff else mod.claims(d)
        for cl in rows:
            if cl.key in toy_keys:
                seen.add(cl.key)
                assert cl.scope and ("pairs" in cl.scope), (cl.key, cl.scope)
                assert cl.label.startswith(cl.verdict) and cl.scope in cl.label
    assert seen == toy_keys


def test_step_h_reads_eval_v3_claims_the_aa_check_and_the_benchmarks_wall_clock(monkeypatch):
    """An eval_v3 result (format 2 under eval_v3.json, built by the real analysis from constructed rows): step h
    reads its two accuracy claims by their protocol keys, the A/A equivalence as a check of our loop (its verdict
    mapped from the protocol's wording), and the wall clock only from the interleaved benchmark: "not run yet" is
    inconclusive, never a number from the eval's batches; with a benchmark summary, its verdict."""
    from cactus_theory.lm.experiments import replicated as rp
    from cactus_theory.lm.experiments import wallclock as wc
    from cactus_theory.lm.experiments.protocol import load_protocol
    from cactus_theory.lm.experiments.tasks import Problem
    from paper_repro import table_h_eval as h
    from tests.lm.experiments.test_wallclock import _record

    monkeypatch.setattr(rp, "N_BOOT", 300)
    proto = load_protocol()  # eval_v3
    info = [rp.method_info(m) for m in rp.protocol_methods(proto)]
    cfg, _ = rp.RunConfig.from_protocol(proto, "fake", questions=60)
    rng = np.random.default_rng(5)
    raw = {"tasks": {}}
    for t in cfg.tasks:
        p = rng.beta(2, 3, 60)
        recs = {}
        for m in info:
            out = rng.random((60, 3)) < p[:, None]
            spec = m["key"] is not None
            recs[m["label"]] = [{"q": q, "r": r, "correct": bool(out[q, r]), "strict": bool(out[q, r]),
                                 "new_tokens": 20, "steps": 10 if spec else 20, "accepted": 12 if spec else 0,
                                 "drafted": 40 if spec else 0, "kl_sum": 0.0, "kl_count": 1, "nll_sum": 1.0,
                                 "nll_count": 20} for r in range(3) for q in range(60)]
        timing = {m["label"]: [{"batch": b, "rows": 32, "tokens": 600, "position": 0, "seconds": 1.0 + 0.01 * b}
                               for b in range(4)] for m in info}
        raw["tasks"][t] = {"problems": [Problem(f"{t}/{i}", f"q{i}", 1) for i in range(60)], "records": recs,
                           "timing": timing}
    res = {"format": 2, "protocol": {"path": str(proto.path), "sha256": proto.sha256, "content": proto.content},
           "config": cfg.as_dict(), "methods": info}
    res["summary"] = rp.analyse(raw, info, {**proto.analysis, "aa_splits": 10}, cfg)
    res["claims"] = rp.claim_verdicts(res)
    res["claims"]["aa-equivalence"] = aa = rp.aa_equivalence(raw, "verifier alone", "SpS", 60, 3, proto.margin)
    monkeypatch.setattr(h, "wall_clock_summary", lambda: None)
    cl = h.claims_v2(res)
    keys = [c.key for c in cl]
    assert {"main-scores-cactus", "tas-scores", "aa-equivalence", "wall-clock"} <= set(keys)
    assert "tas-arith" not in keys
    a = by_key(cl, "aa-equivalence")
    assert a.kind == "code" and a.verdict == {"equivalent within the margin": "holds", "differs": "differs",
                                              "inconclusive": "inconclusive"}[aa["verdict"]]
    assert f"{100 * aa['low']:+.2f}" in a.ours and f"{aa['questions']:,} questions" in a.how
    w = by_key(cl, "wall-clock")
    assert w.verdict == "inconclusive" and w.ours == "not run yet"
    for scale, want in ((0.5, "consistent"), (2.0, "differs")):
        base = [10.0, 10.5, 9.8, 10.2, 10.1]
        summ = wc.analyse_wall_clock(_record({"verifier alone": base, "Cactus delta=1": [b * scale for b in base]},
                                             {"verifier alone": 100, "Cactus delta=1": 100}))
        monkeypatch.setattr(h, "wall_clock_summary", lambda s=summ: s)
        w = by_key(h.claims_v2(res), "wall-clock")
        assert w.verdict == want == summ["claim"]["verdict"] and f"{1 / scale:.2f}x" in w.ours
