"""Tree decoding on the LM runtime (``lm.loop.tree_generate``, ``Llama.forward_tree``, the tree methods of
``lm.cache``) on the tiny random Llama pair of ``tests/lm/common.py`` (V = 10, no download).

What each test proves: the laws the loop hands to ``verify_tree`` are the models' own next-token laws
at every node (float64 compact models against fresh full forwards, several steps, ragged rows, so the
tree cache, its compaction and the draft's pending tokens are right); at temperature 0 the loop emits
the verifier's greedy continuation; the exact law of the loop's algorithm on these models
(``theory.tree.tree_sequence_law`` after the verifier's first token) is the verifier's law to 1e-12
for SpS with each lossless scheme; and the loop's samples fit that exact law (chi-square at ALPHA =
1e-3, N = 20000 rows, power >= 0.99 at TV 0.06 asserted in ``assert_fits``; the ragged / EOS test has
2500 rows per prompt and TV 0.12), for SpS (the verifier's law) and for Cactus (its own tree law).
Static (``branching_parents``), dynamic (``DynamicTree``) and EAGLE-2 budget (``BudgetTree``: grown,
then re-ranked; its runtime tree equals ``theory.tree.budget_tree``'s) trees; a token-level draft and the
EAGLE-3-style feature draft (its node laws against ``head_law``, 2e-5 in float32); the decode command.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.core.tree import (
    BudgetTree,
    DynamicTree,
    Grow,
    as_tree,
    branching_parents,
    node_depths,
)
from cactus_theory.lm import ModelPair, autoregressive_generate, sampling_probs
from cactus_theory.lm.cache import FeatureDrafter, Target, TokenDrafter, right_pad, tree_sizes
from cactus_theory.lm.llama import Llama
from cactus_theory.lm.loop import check_tree, tree_generate
from cactus_theory.theory.tree import budget_tree, tree_sequence_law
from cactus_theory.toy import autoregressive_law
from tests.lm.common import (
    DRAFT,
    EOS,
    HEAD,
    HEAD_VER,
    RAW,
    VERIFIER,
    N,
    V,
    assert_fits,
    cond,
    head_law,
    pair,
)

pytestmark = pytest.mark.usefixtures("one_thread")

TREE = branching_parents((2, 2))  # (-1, -1, 0, 0, 1, 1)
DYNAMIC = DynamicTree(depth=3, width=2, children=2)  # 2 + 4 + 4 nodes, the best paths grow
BUDGET = BudgetTree(nodes=7, depth=3, topk=3)  # EAGLE-2: 3 + 9 + 9 grown, the 7 most probable kept


def verifier_first_law(draft, verifier, rule, parents, scheme, T, prompt, mode="rounds"):
    """Exact law (V,) * T of the loop's first T tokens: the verifier's first token, then tree blocks."""
    q0 = verifier(tuple(prompt))
    law = np.zeros((V,) * T)
    for y in np.flatnonzero(q0 > 0):
        law[y] = q0[y] * tree_sequence_law(draft, verifier, rule, parents, scheme, T - 1,
                                           prompt=tuple(prompt) + (int(y),), mode=mode)
    return law


def memo(f):
    """``f`` with each prefix's row computed once and renormalised in float64 (the models' rows sum to 1
    to float32 precision only), so the laws built from it read identical rows that sum to 1."""
    rows: dict = {}

    def g(prefix):
        if prefix not in rows:
            r = np.asarray(f(prefix), dtype=np.float64)
            rows[prefix] = r / r.sum()
        return rows[prefix]
    return g


@pytest.mark.parametrize("scheme,tree", [("iid", TREE), ("without_replacement", TREE), ("deterministic", TREE),
                                         ("deterministic", BUDGET)], ids=["iid", "wor", "det", "det-budget"])
def test_exact_tree_law_of_sps_on_the_tiny_llamas_is_the_verifiers(scheme, tree):
    d, v = memo(cond(DRAFT)), memo(cond(VERIFIER))
    prompt = (3, 5, 7)
    law = verifier_first_law(d, v, ct.SpS(), tree, scheme, 3, prompt)
    ar = autoregressive_law(v, 3, prompt=prompt)
    assert np.abs(law - ar).max() < 1e-12
    cactus = verifier_first_law(d, v, ct.Cactus(0.5), tree, scheme, 3, prompt)
    assert abs(cactus.sum() - 1) < 1e-12 and np.abs(cactus - ar).max() > 1e-3  # lossy: a different law


def _plain(m: Llama, seq: list[int]) -> torch.Tensor:
    c = m.new_cache(1, 64)
    return m(torch.tensor([seq]), torch.zeros(1, dtype=torch.long), c)[0][0, -1]


@pytest.mark.parametrize("tree", [(-1, -1, 0, 1, 1, 2, 4), DynamicTree(3, 2, 2), BUDGET],
                         ids=["static", "dynamic", "budget"])
def test_the_laws_given_to_verify_tree_are_the_models_laws_at_every_node(tree):
    """Drive ``TokenDrafter`` / ``Target`` through several tree steps on ragged rows (float64 compact
    models): every node's ``p`` (at its parent) and ``q`` (after it) equal a fresh forward of that
    node's context, so the tree caches, their compaction and the draft's pending tokens are right.
    EAGLE-2's re-ranked tree (``grow_tree`` + ``core.tree.rerank``) is, row by row and step by step,
    the tree ``theory.tree.budget_tree`` grows from the draft's exact laws (plain Python sorting), and
    its draft cache, read through the grown numbering, stays right after pruning."""
    dm, vm = Llama.from_hf(DRAFT, dtype=torch.float64), Llama.from_hf(VERIFIER, dtype=torch.float64)
    prompts = [[6], [3, 5, 7, 1, 2], [2, 9]]
    ids, lens = right_pad(prompts, 0, "cpu")
    # static: an uneven shape (2, then 1 and 2, then 1 and 1 children); dynamic: per-row parents
    gen = torch.Generator().manual_seed(0)
    drafter, target = TokenDrafter(dm, 3, 64, "cpu"), Target(vm, 3, 64, "cpu")
    sampling = (1.0, 0, 1.0)
    soft = lambda x: sampling_probs(x, *sampling)  # noqa: E731  (the loop's transform, on float32 logits)
    with torch.no_grad():
        logits, _ = target.prefill(ids, lens)
        first = torch.multinomial(soft(logits), 1, generator=gen)[:, 0]
        target.pending = first
        drafter.start(ids, lens, first)
        seqs = [p + [int(t)] for p, t in zip(prompts, first, strict=True)]
        err, accepted = 0.0, []
        ref = memo(lambda s: soft(_plain(dm, list(s))).double().numpy())
        for step in range(6):
            scheme = "deterministic" if tree is BUDGET else ("iid", "without_replacement", "deterministic")[step % 3]
            tokens, parents, p = drafter.propose_tree(tree, scheme, sampling, gen)
            if isinstance(tree, tuple):
                assert parents.tolist() == [list(tree)] * 3
            elif tree is BUDGET:
                assert tokens.shape == (3, BUDGET.nodes)
                for b in range(3):
                    par, tok = budget_tree(ref, BUDGET, tuple(seqs[b]))
                    assert parents[b].tolist() == list(par) and tokens[b].tolist() == list(tok)
            else:  # the grown nodes are the previous level's most probable paths
                pp = p.gather(-1, tokens[:, :, None])[:, :, 0].double().log()
                path = pp.clone()
                for j in range(tokens.shape[1]):
                    a = parents[:, j]
                    path[:, j] += torch.where(a >= 0, path.gather(1, a.clamp_min(0)[:, None])[:, 0], 0.0)
                top = lambda x: torch.sort(-x, dim=-1, stable=True).indices[:, :2].sort(-1).values  # noqa: E731
                assert (parents[:, 2:6] == top(path[:, :2]).repeat_interleave(2, 1)).all()
                grown = top(path[:, 2:6]) + 2
                assert (parents[:, 6:] == grown.repeat_interleave(2, 1)).all()
            logits, _ = target.score_tree(tokens, parents)
            q = soft(logits)
            for b in range(3):
                ctx = {-1: seqs[b]}
                for j, a in enumerate(parents[b].tolist()):
                    ctx[j] = ctx[a] + [int(tokens[b, j])]
                    err = max(err, float((p[b, j] - soft(_plain(dm, ctx[a]))).abs().max()))
                    err = max(err, float((q[b, j + 1] - soft(_plain(vm, ctx[j]))).abs().max()))
                err = max(err, float((q[b, 0] - soft(_plain(vm, ctx[-1]))).abs().max()))
            res = ct.tree.verify_tree(tokens, parents, p, q, ct.SpS(), scheme, generator=gen)
            a = res.num_accepted
            target.advance_tree(res.accepted_nodes, a, res.tokens.gather(1, a[:, None])[:, 0])
            drafter.advance_tree(a, res.accepted_nodes, res.tokens)
            for b in range(3):
                seqs[b] += res.tokens[b, :int(a[b]) + 1].tolist()
            accepted += a.tolist()
    assert err < 1e-10, err
    assert 0 in accepted and max(accepted) >= 2  # rejections and accepted paths of length >= 2 both seen


@pytest.mark.parametrize("scheme,tree,compact", [("iid", TREE, True), ("deterministic", TREE, True),
                                                 ("deterministic", DYNAMIC, True), ("deterministic", TREE, False),
                                                 ("deterministic", DYNAMIC, False), ("deterministic", BUDGET, True),
                                                 ("deterministic", BUDGET, False)])
def test_greedy_tree_decoding_is_the_verifiers_greedy_continuation(scheme, tree, compact):
    """Deterministic check of tree masks, positions and the caches kept along the path, on the compact
    Llama and on the Hugging Face forward (4D mask, ``compact=False``)."""
    prompts = [[6], [3, 5, 7, 1, 2, 8, 8], [2, 9], [0, 1, 2, 3]]
    res = tree_generate(pair(), prompts, ct.SpS(), tree, scheme, max_new_tokens=12, temperature=0.0, batch_size=4,
                        compact=compact)
    ar = autoregressive_generate(pair(), prompts, max_new_tokens=12, temperature=0.0, batch_size=4)
    assert res.tokens == ar.tokens
    assert 0 < res.stats.accepted and res.stats.al > 1


@pytest.mark.parametrize("scheme,sampling,tree,compact", [
    ("iid", (1.0, 0, 1.0), TREE, True), ("without_replacement", (0.8, 6, 0.9), TREE, True),
    ("deterministic", (1.0, 0, 1.0), TREE, True), ("iid", (1.0, 0, 1.0), DYNAMIC, True),
    ("deterministic", (0.8, 6, 0.9), DYNAMIC, True), ("without_replacement", (1.0, 0, 1.0), DYNAMIC, False),
    ("deterministic", (0.8, 6, 0.9), BUDGET, True)])
def test_tree_sps_emits_the_verifiers_law(scheme, sampling, tree, compact):
    prompt = [3, 5, 7]
    t, k, p = sampling
    res = tree_generate(pair(), [prompt] * N, ct.SpS(), tree, scheme, max_new_tokens=3, temperature=t, top_k=k,
                        top_p=p, batch_size=N, seed=1, compact=compact)
    assert all(len(x) == 3 for x in res.tokens)
    assert_fits(res.tokens, autoregressive_law(cond(VERIFIER, sampling), 3, prompt=tuple(prompt)), 3)
    assert 1 < res.stats.al < 4


@pytest.mark.parametrize("rule,scheme,mode,tree", [(ct.Cactus(0.5), "iid", "rounds", TREE),
                                                   (ct.Cactus(0.5), "deterministic", "joint", TREE),
                                                   ((ct.TAS(), ct.SpS()), "without_replacement", "rounds", TREE),
                                                   (ct.Cactus(0.5), "deterministic", "rounds", BUDGET)],
                         ids=["cactus-iid-rounds", "cactus-deterministic-joint", "tas-then-sps-wor-rounds",
                              "cactus-budget-rounds"])
def test_tree_lossy_rules_emit_their_exact_tree_law(rule, scheme, mode, tree):
    prompt = [1, 8]
    res = tree_generate(pair(), [prompt] * N, rule, tree, scheme, mode=mode, max_new_tokens=3, batch_size=N, seed=2,
                        **RAW)
    law = verifier_first_law(cond(DRAFT), cond(VERIFIER), rule, tree, scheme, 3, prompt, mode=mode)
    assert_fits(res.tokens, law, 3)


def test_ragged_rows_and_eos_keep_each_rows_law():
    prompts = [[6], [3, 5, 7, 1, 2], [2, 9]]
    batch = [prompts[i % 3] for i in range(3 * 2500)]
    res = tree_generate(pair(EOS), batch, ct.SpS(), TREE, "without_replacement", max_new_tokens=3,
                        batch_size=len(batch), seed=3, **RAW)
    assert all(EOS not in t[:-1] and (len(t) == 3 or t[-1] == EOS) for t in res.tokens)
    assert sum(len(t) < 3 for t in res.tokens) > 50  # EOS reached: the stopping path is exercised
    base = cond(VERIFIER)
    for j, pr in enumerate(prompts):
        n = len(pr)

        def absorbing(prefix, n=n):  # after EOS the (padded) output repeats EOS
            return np.eye(V)[EOS] if EOS in prefix[n:] else base(prefix)

        assert_fits(res.tokens[j::3], autoregressive_law(absorbing, 3, prompt=tuple(pr)), 3, pad=EOS)


def test_node_depths_is_the_one_level_scan():
    """``core.tree.node_depths`` serves the loop's tree check, its draft-level count and ``tree_sizes``."""
    par = branching_parents((2, 2))
    assert node_depths(par) == [0, 0, 1, 1, 1, 1] and tree_sizes(par) == (2, 4)
    assert node_depths((-1, 0, -1)) == [0, 1, 0]  # no name: no level-by-level check
    for name, check in (("parents", tree_sizes), ("tree", check_tree)):
        with pytest.raises(ValueError, match=f"{name} must list its nodes level by level"):
            check((-1, 0, -1))


def test_bad_tree_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="tree"):
        tree_generate(pair(), [[1]], ct.SpS(), "2,2")
    with pytest.raises(ValueError, match="level by level"):
        tree_generate(pair(), [[1]], ct.SpS(), (-1, 0, -1))
    with pytest.raises(ValueError, match="topological"):
        tree_generate(pair(), [[1]], ct.SpS(), (-1, 1))
    with pytest.raises(ValueError, match="scheme"):
        tree_generate(pair(), [[1]], ct.SpS(), TREE, "gumbel")
    with pytest.raises(ValueError, match="width"):
        tree_generate(pair(), [[1]], ct.SpS(), DynamicTree(2, 0, 2))
    with pytest.raises(ValueError, match="joint"):
        tree_generate(pair(), [[1]], ct.TAS(), TREE, "iid", mode="joint")
    for scheme in ("iid", "without_replacement"):  # re-ranking random draws would break losslessness
        with pytest.raises(ValueError, match="re-ranking"):
            tree_generate(pair(), [[1]], ct.SpS(), BUDGET, scheme)
    with pytest.raises(ValueError, match="nodes"):
        BudgetTree(0, 3, 3)
    with pytest.raises(ValueError, match="exceeds the 6 nodes"):  # never fewer nodes than asked, silently
        BudgetTree(7, 2, 2)


class _Beam:
    """A throwaway tree kind, written here only: a beam of ``width`` paths (the root gets ``width``
    candidates, then the ``width`` most probable paths of each level grow one child each). It implements
    the ``core.tree_shapes.Tree`` protocol and nothing else: the loop, the caches and the exact laws take
    it without a line of theirs changed."""

    reranks = False
    parents = None  # grown by path probability: the shape depends on the draws

    def __init__(self, depth: int, width: int):
        self.depth, self.width = depth, width
        self.nodes = self.grown = depth * width

    def level_sizes(self):
        return (self.width,) * self.depth

    def levels(self):
        return ((-1,) * self.width, *(Grow(self.width, 1),) * (self.depth - 1))

    def __repr__(self):
        return f"_Beam({self.depth}, {self.width})"


class _Answers:
    """Another throwaway kind: only a tree's protocol answers, nothing of its class."""

    def __init__(self, tree):
        tree = as_tree(tree)
        self.depth, self.nodes, self.grown = tree.depth, tree.nodes, tree.grown
        self.reranks, self.parents = tree.reranks, tree.parents
        self._sizes, self._levels = tree.level_sizes(), tree.levels()

    def level_sizes(self):
        return self._sizes

    def levels(self):
        return self._levels


def test_a_new_tree_kind_runs_through_the_loop_and_the_exact_laws():
    """Adding a tree kind touches its class only: ``_Beam`` (defined in this test) decodes greedily to the
    verifier's greedy continuation (compact Llama and the Hugging Face forward); its exact SpS law
    (``theory.tree``, deterministic candidates: the beam is a function of the context) is the verifier's
    law to 1e-12; and the loop's tree for it is, step by step, the one ``theory.tree.budget_tree`` grows."""
    beam = _Beam(3, 2)
    prompts = [[6], [3, 5, 7, 1, 2, 8, 8], [2, 9], [0, 1, 2, 3]]
    ar = autoregressive_generate(pair(), prompts, max_new_tokens=12, temperature=0.0, batch_size=4)
    for compact in (True, False):
        res = tree_generate(pair(), prompts, ct.SpS(), beam, "deterministic", max_new_tokens=12, temperature=0.0,
                            batch_size=4, compact=compact)
        assert res.tokens == ar.tokens and res.stats.k == 6 and res.stats.al > 1
    d, v = memo(cond(DRAFT)), memo(cond(VERIFIER))
    law = verifier_first_law(d, v, ct.SpS(), beam, "deterministic", 3, (3, 5, 7))
    assert np.abs(law - autoregressive_law(v, 3, prompt=(3, 5, 7))).max() < 1e-12
    with pytest.raises(ValueError, match="random draws"):  # its shape would depend on the draws
        tree_sequence_law(d, v, ct.SpS(), beam, "iid", 2, prompt=(3,))
    dm = Llama.from_hf(DRAFT, dtype=torch.float64)
    drafter = TokenDrafter(dm, 1, 64, "cpu")
    ids, lens = right_pad([[3, 5]], 0, "cpu")
    drafter.start(ids, lens, torch.tensor([7]))
    soft = lambda x: sampling_probs(x, 1.0, 0, 1.0)  # noqa: E731
    with torch.no_grad():
        tokens, parents, _ = drafter.propose_tree(beam, "deterministic", (1.0, 0, 1.0), torch.Generator())
        par, tok = budget_tree(memo(lambda s: soft(_plain(dm, list(s))).double().numpy()), beam, (3, 5, 7))
    assert parents[0].tolist() == list(par) and tokens[0].tolist() == list(tok)


@pytest.mark.parametrize("tree,scheme", [(TREE, "without_replacement"), (DYNAMIC, "iid"), (BUDGET, "deterministic")],
                         ids=["static", "dynamic", "budget"])
def test_the_loop_reads_a_tree_through_its_protocol_only(tree, scheme):
    """A tree's protocol answers alone (``_Answers``: no class of ``core.tree_shapes``) decode exactly as
    the tree itself: same draws, same node order, same counts."""
    prompts = [[6], [3, 5, 7, 1, 2], [2, 9]]
    kw = dict(max_new_tokens=6, batch_size=3, seed=5, **RAW)
    a = tree_generate(pair(), prompts, ct.Cactus(0.5), tree, scheme, **kw)
    b = tree_generate(pair(), prompts, ct.Cactus(0.5), _Answers(tree), scheme, **kw)
    assert a.tokens == b.tokens and (a.stats.accepted, a.stats.drafted) == (b.stats.accepted, b.stats.drafted)
    assert a.stats.k == b.stats.k == as_tree(tree).nodes


def test_tree_shapes_import_without_torch():
    """``core.tree_shapes`` (the ``Tree`` protocol, the kinds, the command line's caps and trees) loads
    without torch: the commands check a tree before anything heavy loads."""
    import subprocess
    import sys

    code = ("import sys; from cactus_theory.core import tree_shapes as t; "
            "x = t.flag_tree('budget', (8, 3, 3), '--tree 8'); assert isinstance(x, t.Tree) and x.reranks; "
            "assert t.as_tree([-1, -1, 0]) == t.StaticTree((-1, -1, 0)); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


class _CharTokenizer:
    """Text <-> the tiny models' 10 ids (one per character), enough for the decode command's plumbing."""

    chat_template = None
    eos_token_id = None

    def __call__(self, text):
        return {"input_ids": [ord(c) % V for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(str(i) for i in ids)


@pytest.mark.parametrize("flag,value,nodes", [("--tree-branching", "2,2", 6), ("--tree-dynamic", "3,2,2", 10),
                                              ("--tree", "7 --tree-depth 3 --tree-topk 2", 7)])
def test_decode_command_runs_tree_decoding(monkeypatch, tmp_path, capsys, flag, value, nodes):
    import json

    from cactus_theory import cli
    from cactus_theory.cli import lm as cli_lm
    monkeypatch.setattr(cli_lm, "_load", lambda args: ModelPair(DRAFT, VERIFIER, _CharTokenizer(), name="tiny"))
    out = tmp_path / "stats.json"
    rc = cli.main(["decode", "--draft", "smollm2", "--rule", "sps", flag, *value.split(), "--tree-scheme", "deterministic",
                   "--prompt", "abc", "--prompt", "hello", "--max-new-tokens", "6", "--no-warmup", "--json", str(out)])
    assert rc == 0
    cap = capsys.readouterr()
    assert f"({nodes} nodes" in cap.out and "deterministic, rounds)" in cap.out and "AL " in cap.out
    assert "Traceback" not in cap.err
    blob = json.loads(out.read_text())
    assert blob["speculative"]["method"] == "tree" and blob["speculative"]["k"] == nodes
    assert blob["speculative"]["new_tokens"] == 12 and blob["speculative"]["al"] >= 1


# -- the EAGLE-3-style feature draft on trees -------------------------------------------------------

@pytest.mark.parametrize("tree", [(-1, -1, 0, 1, 1, 2, 4), DynamicTree(3, 2, 2)], ids=["static", "dynamic"])
def test_feature_draft_tree_laws_are_the_heads_laws_at_every_node(tree):
    """The feature drafter's law at each node is the head's law given the committed sequence and the
    node's path (``head_law``: full verifier forwards and a fresh head cache), over several steps on
    ragged rows, so its tree steps and the verifier's features along the accepted path are right
    (float32 models: 2e-5)."""
    ver = Llama.from_hf(HEAD_VER)
    law = head_law()
    prompts = [[6], [3, 5, 7, 1, 2], [2, 9]]
    ids, lens = right_pad(prompts, 0, "cpu")
    gen = torch.Generator().manual_seed(1)
    drafter = FeatureDrafter(HEAD, 3, 64, "cpu")
    target = Target(ver, 3, 64, "cpu", drafter.feature_layers)
    sampling = (1.0, 0, 1.0)
    with torch.no_grad():
        logits, feats = target.prefill(ids, lens)
        first = torch.multinomial(sampling_probs(logits, *sampling), 1, generator=gen)[:, 0]
        target.pending = first
        drafter.start(ids, lens, first, feats)
        seqs = [p + [int(t)] for p, t in zip(prompts, first, strict=True)]
        err, accepted = 0.0, []
        for step in range(4):
            scheme = ("iid", "deterministic")[step % 2]
            tokens, parents, p = drafter.propose_tree(tree, scheme, sampling, gen)
            logits, feats = target.score_tree(tokens, parents)
            q = sampling_probs(logits, *sampling)
            for b in range(3):
                path = {-1: []}
                for j, a in enumerate(parents[b].tolist()):
                    path[j] = path[a] + [int(tokens[b, j])]
                    err = max(err, float(np.abs(p[b, j].double().numpy() - law(seqs[b], path[a])).max()))
            res = ct.tree.verify_tree(tokens, parents, p, q, ct.SpS(), scheme, generator=gen)
            a = res.num_accepted
            target.advance_tree(res.accepted_nodes, a, res.tokens.gather(1, a[:, None])[:, 0])
            drafter.advance_tree(a, res.accepted_nodes, res.tokens, feats)
            for b in range(3):
                seqs[b] += res.tokens[b, :int(a[b]) + 1].tolist()
            accepted += a.tolist()
    assert err < 2e-5, err
    assert 0 in accepted and max(accepted) >= 1


@pytest.mark.parametrize("scheme,tree", [("iid", TREE), ("deterministic", DYNAMIC), ("deterministic", BUDGET)])
def test_feature_draft_tree_sps_emits_the_verifiers_law(scheme, tree):
    prompt = [3, 5, 7]
    res = tree_generate(ModelPair(HEAD, HEAD_VER, None), [prompt] * N, ct.SpS(), tree, scheme, max_new_tokens=3,
                        batch_size=N, seed=5, **RAW)
    assert_fits(res.tokens, autoregressive_law(cond(HEAD_VER), 3, prompt=tuple(prompt)), 3)
    assert 1 < res.stats.al


def test_feature_draft_greedy_tree_is_the_verifiers_greedy_continuation():
    prompts = [[6], [3, 5, 7, 1, 2, 8, 8], [2, 9], [0, 1, 2, 3]]
    pr = ModelPair(HEAD, HEAD_VER, None)
    ar = autoregressive_generate(pr, prompts, max_new_tokens=12, temperature=0.0, batch_size=4)
    for tree, compact in ((TREE, True), (DYNAMIC, True), (DYNAMIC, False), (BUDGET, True), (BUDGET, False)):
        res = tree_generate(pr, prompts, ct.SpS(), tree, "deterministic", max_new_tokens=12, temperature=0.0,
                            batch_size=4, compact=compact)
        assert res.tokens == ar.tokens and res.stats.accepted > 0
