"""Tree shapes without torch: the dynamic and budget trees (``DynamicTree``, ``BudgetTree``), the
candidate schemes and modes, and their node counts, computed arithmetically (a tree of depth 10^9
is counted at once, never walked level by level).

``core.tree`` (the sampler) re-exports everything here; the command line's argument checks read
these names directly, so a bad tree is refused before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from .validate import check_positive_int

__all__ = ["SCHEMES", "MODES", "RERANK_SCHEMES", "BUDGET_DEPTH", "BUDGET_TOPK", "MAX_KEPT", "MAX_GROWN", "DynamicTree",
           "BudgetTree", "dynamic_tree_nodes"]

SCHEMES = ("iid", "without_replacement", "deterministic", "eagle")
MODES = ("rounds", "joint")
RERANK_SCHEMES = ("deterministic", "eagle")  # candidates that are not random: the top-k of p
BUDGET_DEPTH, BUDGET_TOPK = 5, 4  # the default shape of a BudgetTree (--tree NODES): sized for a CPU, docs/decoding.md
MAX_KEPT, MAX_GROWN = 256, 4096  # the command line's caps on a tree: nodes verified, nodes grown (drafted)


def dynamic_tree_nodes(depth: int, width: int, children: int) -> int:
    """Nodes of a ``DynamicTree(depth, width, children)``: the sum of its level sizes
    ``s_1 = children``, ``s_{d+1} = min(width, s_d) children``, in closed form. While ``s_d < width``
    (and ``children > 1``) a level is ``children`` times the previous one, at most ``log2(width) + 1``
    levels; every later level has the same size ``min(width, s_d) children``."""
    depth, width, children = (check_positive_int(v, n) for v, n in ((depth, "depth"), (width, "width"),
                                                                      (children, "children")))
    total = size = children
    level = 1
    while level < depth and size < width and children > 1:  # geometric growth, O(log width) levels
        size *= children
        total += size
        level += 1
    return total + (depth - level) * min(width, size) * children


@dataclass(frozen=True)
class DynamicTree:
    """A draft tree grown from the draft's own probabilities: the root gets ``children`` candidates;
    at each of the next ``depth - 1`` levels the ``width`` nodes of the previous level with the highest
    path probability (product of the draft probabilities of the path's tokens, ties to the lower node
    index) get ``children`` candidates each (drawn per the scheme). Level sizes are fixed
    (``level_sizes``), so every row has the same number of nodes and the shape differs by row only in
    its parents. Nothing drawn is pruned afterwards: which nodes grow children depends only on the
    tokens drawn before them, never on the children themselves, so a lossless scheme stays lossless
    (each node's children are the scheme's draws from ``p`` at that node, whatever their number).
    Parameters are integers >= 1 (numpy integers are stored as ``int``; bools are refused)."""

    depth: int
    width: int
    children: int

    def __post_init__(self):
        for name in ("depth", "width", "children"):
            object.__setattr__(self, name, check_positive_int(getattr(self, name), name))

    def level_sizes(self) -> tuple[int, ...]:
        """Nodes per level: ``children``, then ``min(width, previous level) * children`` (one entry
        per level: for the runtime, which grows the tree level by level)."""
        sizes = [self.children]
        for _ in range(self.depth - 1):
            sizes.append(min(self.width, sizes[-1]) * self.children)
        return tuple(sizes)

    @property
    def nodes(self) -> int:
        """``sum(level_sizes())``, computed arithmetically (``dynamic_tree_nodes``)."""
        return dynamic_tree_nodes(self.depth, self.width, self.children)


@dataclass(frozen=True)
class BudgetTree:
    """EAGLE-2's dynamic tree with a node budget: grown as ``DynamicTree(depth, topk, topk)`` (the root
    gets ``topk`` candidates; at each next level the ``topk`` nodes of highest path probability grow
    ``topk`` each), then re-ranked: the ``nodes`` grown nodes of highest path probability (ties to the
    lower node index) are verified, the rest dropped. A node's path probability is at most its
    parent's, so the kept set holds every kept node's ancestors, and a kept node's kept children are
    its most likely ones (a prefix of its candidates).

    Re-ranking reads the drawn children's own probabilities, so it keeps a scheme lossless only when
    the candidates are not random: ``deterministic`` (top-k, each verified as a point mass; ``eagle``
    reads the same top-k with ``p`` and is not lossless with or without re-ranking). With
    ``iid`` or ``without_replacement`` draws, keeping the likelier draws changes the law the
    candidates come from, and ``verify_tree`` (which reads them as draws from ``p``) is no longer
    lossless: ``check_tree_scheme`` refuses them. Parameters are integers >= 1 (numpy integers are
    stored as ``int``; bools are refused), and ``nodes`` at most the ``grown`` nodes."""

    nodes: int
    depth: int = BUDGET_DEPTH
    topk: int = BUDGET_TOPK

    def __post_init__(self):
        for name in ("nodes", "depth", "topk"):
            object.__setattr__(self, name, check_positive_int(getattr(self, name), name))
        if self.nodes > self.grown:  # never verify fewer nodes than asked without saying so
            raise ValueError(f"nodes = {self.nodes} exceeds the {self.grown} nodes a tree of depth {self.depth} and "
                             f"top-{self.topk} grows: lower nodes or raise depth / topk")

    @property
    def width(self) -> int:
        return self.topk

    @property
    def children(self) -> int:
        return self.topk

    def level_sizes(self) -> tuple[int, ...]:
        """Nodes per level as grown (before re-ranking)."""
        return DynamicTree(self.depth, self.topk, self.topk).level_sizes()

    @property
    def grown(self) -> int:
        """Nodes grown before re-ranking: ``topk + (depth - 1) topk^2``."""
        return dynamic_tree_nodes(self.depth, self.topk, self.topk)

    @property
    def kept(self) -> int:
        """Nodes verified (``nodes``, at most ``grown``: checked)."""
        return self.nodes
