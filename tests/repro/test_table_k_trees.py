"""Step k (trees by exact law): it runs in fast mode, its cells agree with independent recomputations
(EAGLE's step law by brute-force enumeration of the rounds; SpS's chain AL by its own recursion), and a
planted wrong law turns the claims it feeds."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

from cactus_theory import toy
from paper_repro import table_k_trees as tk
from paper_repro.common import Ctx


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("k")
    return tk.run(Ctx(results=tmp / "results", figures=tmp / "figures", fast=True))


def _eagle_law(p: np.ndarray, q: np.ndarray, K: int, prob_one: bool) -> np.ndarray:
    """EAGLE's multi-round verification of the top-K tokens of ``p``, its law written out directly:
    round i accepts candidate c w.p. min(1, r(c) / p(c)) (or r(c) when ``prob_one``); a rejection sets
    r(c) = 0 and renormalises; after K rejections the token is drawn from r."""
    cands = np.argsort(-p, kind="stable")[:K]
    law, r, reach = np.zeros_like(q), q.copy(), 1.0
    for c in cands:
        a = r[c] if prob_one else min(1.0, r[c] / p[c])
        law[c] += reach * a
        reach *= 1 - a
        r = r.copy()
        r[c] = 0.0
        r = r / r.sum()
    return law + reach * r


def _sps_chain_al(draft, verifier, k: int) -> float:
    """AL of SpS on a chain of k drafts: 1 + sum_i P(the first i drafts are all accepted), the sum over
    every drafted prefix of prod_j p(x_j | x_<j) min(1, q(x_j | x_<j) / p(x_j | x_<j))."""
    V = verifier(()).size
    total = 1.0
    for i in range(1, k + 1):
        for xs in itertools.product(range(V), repeat=i):
            w = 1.0
            for j in range(i):
                p, q = draft(xs[:j]), verifier(xs[:j])
                w *= min(p[xs[j]], q[xs[j]])
            total += w
    return total


def test_step_runs_fast_and_writes_its_table(step):
    d = step.data
    assert {c.key for c in step.claims} == {"eagle-tree-lossy", "eagle-tree-prob-one", "tree-cactus-joint-share",
                                           "block-verification-lossless", "block-verification-al"}
    v = {c.key: c.verdict for c in step.claims}  # the real-LM rows are step l's (table_l_lm_trees)
    assert v["eagle-tree-lossy"] == v["eagle-tree-prob-one"] == v["block-verification-lossless"] == "holds"
    assert all(c.kind == "derived" and c.units and c.decision and c.family for c in step.claims)
    text = step.figures[0].read_text()
    assert "(a) EAGLE-2/3 tree sampling" in text and "(c) block verification" in text
    assert len(d["a"]) == d["config"]["a"]["N"] * len(d["config"]["a"]["V"]) * len(d["config"]["a"]["K"])


def test_eagle_kl_matches_a_brute_force_law(step):
    cfg = step.data["config"]
    for r in step.data["a"]:
        draft, verifier = tk._pair(r["V"], r["seed"], cfg)
        p, q = draft(()), verifier(())
        le = _eagle_law(p, q, r["K"], prob_one=False)
        m = le > 0  # 0 log 0 = 0: the rounds can leave a token no mass
        assert r["kl_eagle"] == pytest.approx(float(np.sum(le[m] * np.log(le[m] / q[m]))), abs=1e-12)
        assert r["err_det"] <= 1e-12 and np.abs(_eagle_law(p, q, r["K"], prob_one=True) - q).max() <= 1e-12


def test_sps_chain_al_matches_its_own_recursion_and_block_is_not_below(step):
    cfg = step.data["config"]
    for r in step.data["c"]["rows"]:
        draft, verifier = toy.random_pair(cfg["c"]["V"], order=2, concentration=cfg["concentration"],
                                          weight=cfg["weight"], seed=r["seed"])
        assert r["al_sps"] == pytest.approx(_sps_chain_al(draft, verifier, r["k"]), abs=1e-12)
        assert r["al_block"] >= r["al_sps"] - 1e-12


def test_tree_cactus_never_beats_the_optimum_at_its_own_kl(step):
    for r in step.data["b"]:
        assert r["accept"] <= r["opt"] + tk.OPT_TOL and r["acc_sps"] <= r["opt"] + tk.OPT_TOL


def test_planted_wrong_laws_turn_the_verdicts(step):
    good = {c.key: c.verdict for c in tk.claims(step.data)}
    d = copy.deepcopy(step.data)
    for r in d["a"]:
        r["kl_eagle"] = 0.0  # EAGLE read with p planted lossless
        r["err_det"] = 1e-3  # prob. 1 planted lossy
    for r in d["c"]["rows"]:
        r["al_block"] = r["al_sps"] - 0.01  # block verification planted below SpS
    d["c"]["lossless_err"] = 1e-6
    for r in d["b"]:
        if r["mode"] == "joint":
            r["share"] = 0.0  # joint planted at no gain
    bad = {c.key: c.verdict for c in tk.claims(d)}
    assert good["eagle-tree-lossy"] == "holds" and bad["eagle-tree-lossy"] == "inconclusive"
    assert bad["eagle-tree-prob-one"] == "differs"
    assert bad["block-verification-al"] == "differs" and bad["block-verification-lossless"] == "differs"
    assert good["tree-cactus-joint-share"] == "holds" and bad["tree-cactus-joint-share"] == "differs"
