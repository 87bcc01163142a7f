"""The tree drafter's pieces against independent references over generated cases: ``ranked_tokens`` against a
stable descending sort (ties, zeros, one-hot and uniform laws, every ``m``), ``tree_ancestry`` against a
node-by-node walk up the parents, and ``grow_tree`` on a shortlist (``support``) against the same tree grown
over the whole vocabulary, for static, dynamic and re-ranked trees."""

from __future__ import annotations

import pytest
import torch

from cactus_theory.core.tree import BudgetTree, DynamicTree, Grow, as_tree, branching_parents
from cactus_theory.lm.cache import grow_tree, ranked_tokens
from cactus_theory.lm.draft import spread
from cactus_theory.lm.llama import node_ancestors, tree_ancestry


def _laws(g: torch.Generator, rows: int, V: int, dtype=torch.float32) -> torch.Tensor:
    """Laws with ties and zeros: a random support, values from {1, 2, 3} (normalised), some one-hot, some
    uniform."""
    p = torch.zeros(rows, V, dtype=torch.float64)
    for r in range(rows):
        kind = int(torch.randint(0, 4, (1,), generator=g))
        if kind == 0:
            p[r, int(torch.randint(0, V, (1,), generator=g))] = 1.0
        elif kind == 1:
            p[r] = 1.0
        else:
            k = int(torch.randint(1, V + 1, (1,), generator=g))
            cols = torch.randperm(V, generator=g)[:k]
            p[r, cols] = torch.randint(1, 4, (k,), generator=g).double()
    return (p / p.sum(-1, keepdim=True)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_ranked_tokens_is_the_stable_sort(dtype):
    g = torch.Generator().manual_seed(0)
    for case in range(60):
        V = [1, 2, 5, 9, 33, 200][case % 6]
        p = _laws(g, 7, V, dtype)
        p[0] = torch.where(p[0] == 0, -0.0, p[0])  # a negative zero ties with 0.0
        ref = torch.sort(-p, dim=-1, stable=True).indices
        for m in range(1, V + 1):
            assert torch.equal(ranked_tokens(p, m), ref[:, :m]), (case, m)
    p = _laws(g, 6, 11).view(2, 3, 11)  # leading dimensions are kept
    assert torch.equal(ranked_tokens(p, 4), torch.sort(-p, dim=-1, stable=True).indices[..., :4])
    for m in (0, 12):
        with pytest.raises(ValueError, match="m must be"):
            ranked_tokens(p, m)


def _ancestry_walk(parents: list[int]) -> tuple[list[set[int]], list[int]]:
    anc, depth = [], []
    for j in range(len(parents)):
        seen, i = {j}, parents[j]
        while i >= 0:
            seen.add(i)
            i = parents[i]
        anc.append(seen)
        depth.append(len(seen) - 1)
    return anc, depth


def test_tree_ancestry_walks_up_the_parents():
    g = torch.Generator().manual_seed(1)
    for case in range(80):
        B, M = 1 + case % 3, 1 + (case * 7) % 70
        rows = []
        for _ in range(B):
            chain = case % 5 == 0  # a chain: the deepest tree of M nodes
            rows.append([j - 1 if chain else (int(torch.randint(-1, j, (1,), generator=g)) if j else -1)
                         for j in range(M)])
        anc, depth = tree_ancestry(torch.tensor(rows))
        assert anc.dtype == torch.bool and depth.dtype == torch.int64
        for b, par in enumerate(rows):
            ref_anc, ref_depth = _ancestry_walk(par)
            assert depth[b].tolist() == ref_depth
            for j in range(M):
                assert set(torch.nonzero(anc[b, j])[:, 0].tolist()) == ref_anc[j]
    with pytest.raises(ValueError, match="topological"):
        tree_ancestry(torch.tensor([[-1, 1]]))


def test_node_ancestors_walks_up_the_parents():
    """Some nodes of each row (their own per row, any order): their ancestors and depths, as the walk up."""
    g = torch.Generator().manual_seed(3)
    for case in range(80):
        B, M = 1 + case % 3, 1 + (case * 7) % 70
        W = 1 + case % M
        rows = [[j - 1 if case % 5 == 0 else (int(torch.randint(-1, j, (1,), generator=g)) if j else -1)
                 for j in range(M)] for _ in range(B)]
        nodes = torch.stack([torch.randperm(M, generator=g)[:W] for _ in range(B)])
        own, depth = node_ancestors(torch.tensor(rows), nodes)
        assert own.shape == (B, W, M) and own.dtype == torch.bool and depth.dtype == torch.int64
        for b, par in enumerate(rows):
            ref_anc, ref_depth = _ancestry_walk(par)
            for w, j in enumerate(nodes[b].tolist()):
                assert depth[b, w] == ref_depth[j] and set(torch.nonzero(own[b, w])[:, 0].tolist()) == ref_anc[j]
    own, depth = node_ancestors(torch.tensor([[-1, 0]]), torch.zeros((1, 0), dtype=torch.long))  # no nodes
    assert own.shape == (1, 0, 2) and depth.shape == (1, 0)
    with pytest.raises(ValueError, match="topological"):
        node_ancestors(torch.tensor([[-1, 1]]), torch.tensor([[1]]))


def test_spread_writes_a_shortlist_into_the_vocabulary():
    """``spread`` against an entry-by-entry write, with a fill, and into a reused buffer (only the shortlist's
    columns are written, so the rest keeps its fill from one call to the next)."""
    g = torch.Generator().manual_seed(4)
    V = 30
    ids = torch.randperm(V, generator=g)[:11].sort().values
    buf = torch.zeros(2, 3, V)
    for _ in range(3):
        x = torch.rand(2, 3, 11, generator=g)
        ref = torch.zeros(2, 3, V)
        for i, t in enumerate(ids.tolist()):
            ref[..., t] = x[..., i]
        assert torch.equal(spread(x, ids, V), ref)
        assert spread(x, ids, V, out=buf) is buf and torch.equal(buf, ref)
        ref_inf = torch.full((2, 3, V), float("-inf"))
        ref_inf[..., ids] = x
        assert torch.equal(spread(x, ids, V, float("-inf")), ref_inf)
    for bad in (torch.zeros(2, 3, V + 1), torch.zeros(2, 3, V, dtype=torch.float64)):
        with pytest.raises(ValueError, match="out must be"):
            spread(x, ids, V, out=bad)


def _reader(g, B: int, S: int, V: int, ids):
    """A level reader with fixed random laws over ``ids`` per (tokens, parents, level), and the map of a law
    over ``ids`` into the vocabulary of ``V``."""
    table: dict = {}

    def short(tok, par, lo):
        key = (tuple(tok.flatten().tolist()), tuple(par.flatten().tolist()), lo)
        if key not in table:
            table[key] = _laws(g, B * tok.shape[1], S).view(B, tok.shape[1], S)
        return table[key]

    def whole(law):
        return law.new_zeros((*law.shape[:-1], V)).index_copy_(-1, ids, law)

    return short, whole


TREES = [branching_parents((2, 2)), branching_parents((3, 1, 2)), DynamicTree(3, 2, 2), BudgetTree(6, 3, 2),
         BudgetTree(5, 4, 3)]


@pytest.mark.parametrize("tree", TREES, ids=repr)
def test_grow_tree_on_a_shortlist_is_the_whole_vocabulary_tree(tree):
    """The support path (laws over ascending ids only) grows the same tokens, parents and laws as the same
    laws written into the vocabulary; laws whose support is smaller than the children rank zeros too."""
    g = torch.Generator().manual_seed(2)
    for case in range(25):
        B, V = 2, [6, 12, 40][case % 3]
        S = int(torch.randint(1, V + 1, (1,), generator=g))
        ids = torch.randperm(V, generator=g)[:S].sort().values
        short, whole = _reader(g, B, S, V, ids)

        p0 = _laws(g, B, S)
        a = grow_tree(p0, short, tree, "deterministic", None, support=(ids, V))
        b = grow_tree(whole(p0), lambda t, p, lo, s=short, w=whole: w(s(t, p, lo)), tree, "deterministic", None)
        for x, y in zip(a, b, strict=True):
            assert x.shape == y.shape and torch.equal(x, y), case
        buf = torch.zeros(B, as_tree(tree).nodes, V)  # a drafter's buffer, reused across its steps
        for _ in range(2):
            c = grow_tree(p0, short, tree, "deterministic", None, support=(ids, V), out=buf)
            assert c[2] is buf and torch.equal(buf, b[2]), case
            p0 = _laws(g, B, S)
            b = grow_tree(whole(p0), lambda t, p, lo, s=short, w=whole: w(s(t, p, lo)), tree, "deterministic", None)
    with pytest.raises(ValueError, match="deterministic"):
        grow_tree(p0, short, tree, "iid", torch.Generator(), support=(ids, V))
    with pytest.raises(ValueError, match="out"):
        grow_tree(whole(p0), short, tree, "deterministic", None, out=torch.zeros(B, as_tree(tree).nodes, V))


@pytest.mark.parametrize("tree", [BudgetTree(6, 3, 2), BudgetTree(9, 4, 3), DynamicTree(3, 2, 2),
                                  branching_parents((2, 2))], ids=repr)
def test_a_sparse_read_grows_the_same_tree(tree):
    """``sparse=True`` reads a level only at the nodes the next ``Grow`` level expands; with laws that depend on
    the node alone (as a drafter's do: its token and its ancestors), the tree, its laws and which nodes are
    read are those of a full read, except that unexpanded nodes are not read; the reader sees each node's
    index and gets exactly the expanded ones."""
    B, V = 3, 12
    for case in range(20):
        asked = []

        def node_law(b: int, j: int, case=case) -> torch.Tensor:
            return _laws(torch.Generator().manual_seed(1_000 * case + 50 * b + j), 1, V)[0]

        def read(tok, par, lo, nodes=None, asked=asked):
            idx = torch.arange(lo, lo + tok.shape[1]).expand(B, -1) if nodes is None else nodes
            asked.append(idx.clone())
            return torch.stack([torch.stack([node_law(b, int(j)) for j in idx[b]]) for b in range(B)])

        p0 = _laws(torch.Generator().manual_seed(case), B, V)
        full = grow_tree(p0, read, tree, "deterministic", None)
        n_full = sum(x.numel() for x in asked)
        asked.clear()
        sparse = grow_tree(p0, read, tree, "deterministic", None, sparse=True)
        for x, y in zip(full[:3] + full[4:], sparse[:3] + sparse[4:], strict=True):  # tokens, parents, laws, nodes
            assert torch.equal(x, y), case
        assert bool((sparse[3] <= full[3]).all())  # read: a subset of the full read's nodes
        grows = [lv for lv in as_tree(tree).levels()[1:] if isinstance(lv, Grow)]
        if grows:  # a tree that grows by path probability reads fewer nodes
            assert sum(x.numel() for x in asked) < n_full
