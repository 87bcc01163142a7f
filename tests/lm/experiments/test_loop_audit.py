"""The whole-decode audit (``lm.experiments.loop_audit``) on tiny random pairs: it passes on the loop as it
is (chain, verifier alone, static / dynamic / budget trees with every candidate scheme, the causal-LM
draft and the EAGLE-3-style head, ragged rows ending at EOS or at the budget), and it fails on planted
loop bugs that a one-step kernel test cannot see: a row whose cache is not rolled back after a
rejection, and a drafter that hands ``verify`` another law than the one it drew from."""

from __future__ import annotations

import pytest
import torch

from cactus_theory.core.tree import BudgetTree, DynamicTree
from cactus_theory.lm import ModelPair, cache
from cactus_theory.lm.experiments.loop_audit import audit_decode
from tests.lm.common import EOS, HEAD, HEAD_VER, pair

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 1, 2], [3, 3]] * 3  # ragged, 12 rows in batches of 5
KW = dict(max_new_tokens=10, batch_size=5, chat=False, sampling=(0.9, 0, 0.95), tolerance=1e-4)


@pytest.mark.parametrize("method,extra", [
    ("chain", {}), ("plain", {}), ("tree", dict(tree=BudgetTree(6, 3, 2))),
    ("tree", dict(tree=DynamicTree(2, 2, 2), scheme="iid")),
    ("tree", dict(tree=(-1, -1, 0, 0, 1), scheme="without_replacement")),
])
def test_the_loop_passes_its_audit(method, extra):
    r = audit_decode(pair(EOS), PROMPTS, method=method, **KW, **extra)
    assert r.ok, r
    assert r.outputs["rows"] == 12 and r.outputs["mismatched"] == 0
    assert r.outputs["eos_stops"] > 0 and r.outputs["budget_stops"] > 0  # both endings exercised
    assert r.q["rows"] > 12 and r.q["max_tv"] < 1e-5
    if method != "plain":
        assert r.draws["verify"]["checked"] >= 30 and r.p["rows"] >= 30
    if method == "chain":
        assert r.outputs["rejections"] > 10 and r.draws["drafted"]["checked"] == 4 * r.outputs["steps"]


@pytest.mark.parametrize("method,extra", [("chain", {}), ("tree", dict(tree=BudgetTree(6, 3, 2)))])
def test_the_feature_draft_loop_passes_its_audit(method, extra):
    r = audit_decode(ModelPair(HEAD, HEAD_VER, None, eos_token_id=EOS), PROMPTS, method=method, **KW, **extra)
    assert r.ok, r
    assert r.p["rows"] > 100 and r.p["max_tv"] < 1e-4  # the head's decode cache vs its unrolled path


def test_a_row_left_unrolled_after_a_rejection_fails_the_audit(monkeypatch):
    real = cache.Target.advance
    planted = []

    def advance(self, a, last):  # once: row 0 keeps its first rejected draft in the verifier's cache
        keep = a.clone()
        if not planted and int(a[0]) < 4:
            keep[0] += 1
            planted.append(True)
        real(self, keep, last)

    monkeypatch.setattr(cache.Target, "advance", advance)
    r = audit_decode(pair(EOS), PROMPTS, method="chain", **KW)
    assert planted and not r.ok and r.q["max_tv"] > 0.01, r.q


def test_a_drafter_handing_over_another_law_fails_the_audit(monkeypatch):
    real = cache._sample

    def sample(logits, sampling, gen):  # draws from the transformed law, hands over the untransformed one
        t, _ = real(logits, sampling, gen)
        return t, torch.softmax(logits.float(), -1)

    monkeypatch.setattr(cache, "_sample", sample)
    r = audit_decode(pair(EOS), PROMPTS, method="chain", **KW)
    assert not r.ok and r.p["max_tv"] > 0.01, r.p


def test_a_baseline_dtype_reports_the_rounding_scale():
    """A float64 baseline beside the float32 reference: the loop's laws and the reference stand at the same
    (rounding-sized) distance from it, and the trees grown from both agree."""
    r = audit_decode(pair(EOS), PROMPTS[:4], method="tree", tree=BudgetTree(6, 3, 2), baseline_dtype=torch.float64,
                     **KW)
    assert r.ok, r
    for law in (r.q, r.p):
        assert law["baseline"]["rows"] == law["rows"] and law["baseline"]["max_tv"] < 1e-5
        assert law["reference_vs_baseline"]["max_tv"] < 1e-5
    assert r.draws["tree_reference_vs_baseline"]["checked"] > 0
