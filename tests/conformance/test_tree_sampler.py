"""Conformance, trees: ``core.tree.verify_tree`` in every scheme (``SCHEMES``) and mode (``MODES``), every
registry rule, token for token against the documented walk (``harness.tree_walk``) at its documented
uniforms (``u [B, N + 1]``: column ``j`` decides node ``j``, column ``N`` draws the emitted token; one
generator or ``RowGenerators``), and the accepted nodes against the walk's path.

Cases: ragged batches (each row its own random tree, absent nodes and their subtrees), candidates per
scheme (zero-mass candidates included: iid draws of zero mass, exhausted supports without replacement,
deterministic top-k beyond the draft's support), every row family, one rule or a rule per round,
float64 and float32. ``mode="joint"`` needs a two-block rule (declared ``two_block``): any other rule is
refused, the reason asserted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cactus_theory.core.tree import MODES, SCHEMES, verify_tree
from cactus_theory.sampler import RowGenerators
from tests.conformance.harness import (
    RULE_KEYS,
    Tally,
    as_tensor,
    configurations,
    float_params,
    min_vocab,
    pad_block,
    profile,
    read64,
    refusal,
    rule_for_rows,
    tolerance,
    tree_case,
    tree_walk,
    vocab_sizes,
)


@pytest.mark.parametrize("key", RULE_KEYS)
def test_verify_tree(key):
    """Each example draws one batch per scheme and runs it in every mode the rule supports."""
    configs = configurations(key)
    modes = [m for m in MODES if refusal(f"verify_tree[{m}]", configs[0]) is None]
    for m in MODES:
        why = refusal(f"verify_tree[{m}]", configs[0])
        if why is not None:
            tok, par, DP, VP = tree_case(np.random.default_rng(0), 1, 2, 4, "iid")
            with pytest.raises(ValueError, match=why):
                verify_tree(torch.from_numpy(tok), torch.from_numpy(par), torch.from_numpy(DP), torch.from_numpy(VP),
                            rule_for_rows(configs[0], DP, VP, np.random.default_rng(0), hit=np.ones(4)), "iid", mode=m)

    tally = Tally()

    @profile(4)
    @given(data=st.data())
    def run(data):
        rule = configs[data.draw(st.integers(0, len(configs) - 1), label="config")]
        V = data.draw(st.sampled_from([v for v in vocab_sizes(rule, large=False)] + [1000]), label="V")
        dtype = data.draw(st.sampled_from([torch.float64, torch.float32]), label="dtype")
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
        per_round = data.draw(st.booleans(), label="a rule per round")
        rows = data.draw(st.booleans(), label="RowGenerators")
        B, N = (2, 4) if V > 64 else (10, 6)
        hit = rng.uniform(size=V) if rng.random() < 0.5 else (rng.uniform(size=V) < 0.3).astype(float)
        bind = lambda r: rule_for_rows(r, None, None, rng, hit=hit) if r.reads_head else r  # noqa: E731
        fit = [c for c in configs if min_vocab(c) <= V]
        second = fit[int(rng.integers(len(fit)))]
        judge = tally.judge(tolerance(dtype))
        for scheme in SCHEMES:
            tok, par, DP, VP = tree_case(rng, B, N, V, scheme, float_params(rule, dtype))
            DPt, VPt = as_tensor(DP, dtype), as_tensor(VP, dtype)
            DP64, VP64 = read64(DPt), read64(VPt)
            for mode in modes:
                rules = (bind(rule), bind(second)) if per_round and mode == "rounds" else (bind(rule),)
                seeds = [int(s) for s in rng.integers(0, 2**62, size=B)]
                gen = RowGenerators.from_seeds(seeds) if rows else torch.Generator().manual_seed(seeds[0])
                res = verify_tree(torch.from_numpy(tok), torch.from_numpy(par), DPt, VPt,
                                  rules if len(rules) > 1 else rules[0], scheme, generator=gen, mode=mode)
                if rows:
                    u = np.stack([torch.rand(N + 1, generator=torch.Generator().manual_seed(s),
                                             dtype=torch.float64).numpy() for s in seeds])
                else:
                    u = torch.rand((B, N + 1), generator=torch.Generator().manual_seed(seeds[0]),
                                   dtype=torch.float64).numpy()
                for b in range(B):
                    want = tree_walk(rules, scheme, mode, tok[b], par[b], DP64[b], VP64[b], u[b], judge)
                    judge.done(want)
                    if want is None:
                        continue
                    toks, nodes = want
                    ctx = (scheme, mode, b, rules, tok[b].tolist(), par[b].tolist())
                    assert res.tokens[b].tolist() == pad_block(toks, N + 1), (*ctx, res.tokens[b].tolist(), toks)
                    assert int(res.num_accepted[b]) == len(toks) - 1, ctx
                    assert res.accepted_nodes[b].tolist() == pad_block(nodes, N), ctx
        judge.check_coverage()

    run()
    tally.check()
