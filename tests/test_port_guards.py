"""Guards against wrong ports that the rest of the suite let through (issue 17; ``tests/mutants.py``
plants them, ``make mutants`` prints which test catches each), for the code the conformance harness
(``tests/conformance``, docs/conformance.md) does not judge: the eval cache's keys, the multi-draft optimum
and vLLM's CPU helper ``expand_batch_to_tokens``. The guards of the samplers, the hooks and the rules' laws
were removed once the harness caught the same planted ports (issue 26): their Port entries name the harness.

Every check here compares the library with an independent reference written below in plain Python (a
brute-force enumeration, a loop, the old cache layout written by hand), not the library's code path.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.optimize import multi_draft_acceptance


def dirichlet(rng, V, c=0.7, size=None):
    return rng.dirichlet(np.full(V, c), size=size)



def test_eval_cache_never_reuses_a_row_of_an_earlier_revision(tmp_path):
    """A batch cached by a run under the rule's earlier law (revision 1: folder named after
    sha256(repr), record keyed by repr, as the eval cache was written before revisions) is recomputed,
    never returned as the current rule's; a batch of the current revision is reused. The old layout is
    written out by hand here, not through the library's Method / _Cache."""
    import hashlib
    import json

    from cactus_theory.lm.experiments import eval as ev

    cfg = ev.EvalConfig(problems=2, batch_size=1)
    cache = ev._Cache(tmp_path, cfg)
    for label, rule in [("Medusa typical", ct.MedusaTypical()), ("relaxed", ct.RelaxedAcceptance()),
                        ("SGLang", ct.SGLangThreshold(0.0, 0.5))]:
        assert rule.revision >= 2
        method = ev.Method(label, ct.registry.spec(rule).key, {}, rule)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
        old_dir = tmp_path / cfg.key() / f"{safe[:48]}-{hashlib.sha256(repr(rule).encode()).hexdigest()[:8]}"
        old_dir.mkdir(parents=True)
        (old_dir / "b0000.json").write_text(json.dumps({"rule": repr(rule), "seconds": 1.0, "records": ["r1"]}))
        calls = []

        def compute(rule=rule, calls=calls):
            calls.append(1)
            return {"rule": f"{rule!r}@r{rule.revision}", "seconds": 2.0, "records": ["now"]}

        got, hit = cache.get(method, 0, compute)
        assert not hit and calls == [1] and got["records"] == ["now"], label  # the r1 row is not reused
        got, hit = cache.get(method, 0, compute)
        assert hit and calls == [1] and got["records"] == ["now"], label  # the current row is


def test_multi_draft_with_zeros_in_p_against_brute_force():
    """Tokens the draft never proposes (p_i = 0) against every token set, K = 1..3."""
    rng = np.random.default_rng(4)
    for _ in range(6):
        V = 6
        p, h = dirichlet(rng, V), dirichlet(rng, V)
        p[rng.choice(V, 2, replace=False)] = 0
        p /= p.sum()
        for K in (1, 2, 3):
            best = min(h[list(S)].sum() + 1 - p[list(S)].sum() ** K
                       for m in range(V + 1) for S in itertools.combinations(range(V), m))
            assert multi_draft_acceptance(p, h, K).value == pytest.approx(best, abs=1e-12)


def test_vllm_expand_batch_to_tokens_against_a_loop():
    from cactus_theory.integrations.vllm import expand_batch_to_tokens

    x = torch.tensor([0.5, -1.0, 2.0, -1.0])
    counts = [2, 0, 3, 1]
    cu = torch.tensor(np.cumsum(counts))
    got = expand_batch_to_tokens(x, cu, sum(counts), replace_from=-1.0, replace_to=7.0)
    expect = [7.0 if v == -1.0 else v for v, c in zip(x.tolist(), counts, strict=True) for _ in range(c)]
    assert got.tolist() == expect
    assert expand_batch_to_tokens(x, cu, sum(counts)).tolist() == [0.5, 0.5, 2.0, 2.0, 2.0, -1.0]
