"""Tree shapes without torch: the ``Tree`` protocol every tree kind implements (``StaticTree``,
``DynamicTree``, ``BudgetTree``), ``as_tree`` (the one place a public entry point's tree argument,
a ``Tree`` or a bare ``parents`` sequence, is checked and converted), the candidate schemes and modes,
the command line's caps and trees (``flag_tree``), a tree's name and its record in a result (``tree_name``,
``tree_record``, ``tree_from_record``), and node counts computed arithmetically (a tree of depth 10^9 is
counted at once, never walked level by level).

The runtime (``lm.loop``, ``lm.cache``), the exact laws (``theory.tree``) and the commands read a tree
through the protocol only (``depth``, ``nodes``, ``grown``, ``reranks``, ``parents``, ``level_sizes()``,
``levels()``): a new kind is its class (and its tests), with no dispatch on kinds anywhere else. A kind that
results record (the eval's tree rows) also declares its ``kind`` name (``TREE_KINDS``) and a short ``label``.
``core.tree`` (the sampler) re-exports everything here; the command line's argument checks read these
names directly, so a bad tree is refused before torch loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple, Protocol, runtime_checkable

from .validate import check_positive_int

__all__ = ["SCHEMES", "MODES", "RERANK_SCHEMES", "BUDGET_DEPTH", "BUDGET_TOPK", "MAX_KEPT", "MAX_GROWN", "Tree",
           "Grow", "StaticTree", "DynamicTree", "BudgetTree", "as_tree", "dynamic_tree_nodes", "branching_nodes",
           "check_parents", "node_depths", "chain_parents", "branching_parents", "check_scheme", "check_tree_scheme",
           "check_caps", "flag_tree", "TREE_KINDS", "tree_name", "tree_record", "tree_from_record"]

SCHEMES = ("iid", "without_replacement", "deterministic", "eagle")
MODES = ("rounds", "joint")
RERANK_SCHEMES = ("deterministic", "eagle")  # candidates that are not random: the top-k of p
BUDGET_DEPTH, BUDGET_TOPK = 5, 4  # the default shape of a BudgetTree (--tree NODES): sized for a CPU, docs/decoding.md
MAX_KEPT, MAX_GROWN = 256, 4096  # the command line's caps on a tree: nodes verified, nodes grown (drafted)


# -- parents sequences ----------------------------------------------------------------------------

def check_parents(parents) -> tuple[int, ...]:
    try:
        par = tuple(int(x) for x in parents)
    except (TypeError, ValueError):
        raise ValueError(f"parents must be a sequence of integers, got {parents!r}") from None
    if not par:
        raise ValueError("parents must hold at least one node")
    for j, a in enumerate(par):
        if not -1 <= a < j:
            raise ValueError(f"parents must be topological (-1 <= parents[j] < j): parents[{j}] = {a}")
    return par


def node_depths(parents: Sequence[int], name: str | None = None) -> list[int]:
    """Depth of each node of a topological ``parents`` (a root's parent is negative: depth 0). With
    ``name``, ``ValueError`` (``name`` in the message) unless the nodes are listed level by level
    (breadth-first: depth never decreases along the node order)."""
    depth: list[int] = []
    for j, a in enumerate(parents):
        depth.append(0 if a < 0 else depth[a] + 1)
        if name is not None and j and depth[j] < depth[j - 1]:
            raise ValueError(f"{name} must list its nodes level by level (breadth-first), got {parents}")
    return depth


def chain_parents(k: int) -> tuple[int, ...]:
    """A chain of ``k`` drafts as a tree: ``parents = (-1, 0, 1, ..., k - 2)``."""
    check_positive_int(k, "k")
    return tuple(range(-1, k - 1))


def branching_nodes(branching: Sequence[int]) -> int:
    """Nodes of ``branching_parents(branching)``, counted without building it: ``sum_d prod_{e <= d} b_e``."""
    if not branching:
        raise ValueError("branching must name at least one level")
    nodes, width = 0, 1
    for b in branching:  # one level per number given: bounded by the argument's length
        width *= check_positive_int(b, "branching")
        nodes += width
    return nodes


def branching_parents(branching: Sequence[int]) -> tuple[int, ...]:
    """Full tree where every node at depth ``d`` has ``branching[d]`` children, in breadth-first
    (topological) order: ``(2, 2)`` gives ``(-1, -1, 0, 0, 1, 1)``."""
    branching_nodes(branching)  # the checks
    parents, level = [], [-1]
    for b in branching:
        nxt = []
        for par in level:
            for _ in range(b):
                parents.append(par)
                nxt.append(len(parents) - 1)
        level = nxt
    return tuple(parents)


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


# -- the protocol -----------------------------------------------------------------------------------

class Grow(NamedTuple):
    """A level grown by path probability: the ``width`` nodes of highest path probability of the
    previous level (the product of the draft probabilities of the path's tokens; ties to the lower
    node index) grow ``children`` candidates each, kept in node order (``width * children`` nodes).
    Which nodes grow depends only on tokens drawn before them, so a lossless scheme stays lossless."""

    width: int
    children: int


@runtime_checkable
class Tree(Protocol):
    """What the runtime (``lm.cache.grow_tree``, ``lm.loop``), the exact laws (``theory.tree``) and the
    commands read of a draft tree; every tree kind implements it (``StaticTree``, ``DynamicTree``,
    ``BudgetTree``), and nothing outside this module asks which kind a tree is.

    - ``depth``: levels (the draft reads the pending tokens, then every level but the last);
    - ``grown``: nodes drafted per step, ``sum(level_sizes())``;
    - ``nodes``: nodes verified per step (``grown``, or fewer for a tree that ``reranks``);
    - ``reranks``: the grown tree is cut to its ``nodes`` nodes of highest path probability
      (``core.tree.rerank``), which keeps a lossless scheme lossless only for the non-random
      candidates ``RERANK_SCHEMES`` (``check_tree_scheme``);
    - ``parents``: the verified tree's parents when it is the same every step (a static tree), else
      ``None`` (its shape depends on the draws);
    - ``level_sizes()``: nodes per grown level;
    - ``levels()``: how each level grows: a tuple of its nodes' parents (grown-tree node indices, -1
      the root; the same every step) or a ``Grow(width, children)``. Within a level a node's rank
      among its siblings (the candidate it is) is its position among them in node order.

    A repr that names the shape (the dataclasses' own) identifies a tree in cache keys and results."""

    depth: int
    grown: int
    nodes: int
    reranks: bool
    parents: tuple[int, ...] | None

    def level_sizes(self) -> tuple[int, ...]: ...

    def levels(self) -> tuple[tuple[int, ...] | Grow, ...]: ...


def as_tree(tree, name: str = "tree") -> Tree:
    """The one conversion of a public entry point's tree argument: a ``Tree`` as it is, a ``parents``
    sequence (list or tuple, topological, listed level by level) as a ``StaticTree``; ``ValueError``
    naming ``name`` otherwise."""
    if isinstance(tree, Tree):
        return tree
    if isinstance(tree, (list, tuple)):
        par = check_parents(tree)
        node_depths(par, name)
        return StaticTree(par)
    raise ValueError(f"{name} must be a parents sequence such as branching_parents((2, 2)) or a Tree (StaticTree, "
                     f"DynamicTree, BudgetTree: core.tree_shapes), got {tree!r}")


# -- the kinds ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StaticTree:
    """The same tree every step: ``parents`` (N,) topological (``-1 <= parents[j] < j``), listed level
    by level (depth never decreases along the node order), e.g. ``branching_parents((2, 2))``. A
    node's candidates are drawn from the draft's law at its parent per the scheme; nothing is pruned.
    The public entry points also take the bare ``parents`` sequence (``as_tree``)."""

    parents: tuple[int, ...]
    reranks = False  # a plain class attribute, not a dataclass field
    kind = "static"  # its name in a result's record (``tree_record``)

    def __post_init__(self):
        par = check_parents(self.parents)
        node_depths(par, "parents")
        object.__setattr__(self, "parents", par)

    @property
    def label(self) -> str:
        """Its name in tables: ``static tree`` and its parents (two static trees differ in their parents)."""
        return f"static tree {','.join(map(str, self.parents))}"

    @property
    def depth(self) -> int:
        return 1 + max(node_depths(self.parents))

    @property
    def grown(self) -> int:
        return len(self.parents)

    @property
    def nodes(self) -> int:
        return len(self.parents)

    def level_sizes(self) -> tuple[int, ...]:
        depth = node_depths(self.parents)
        return tuple(depth.count(d) for d in range(depth[-1] + 1))

    def levels(self) -> tuple[tuple[int, ...], ...]:
        out, lo = [], 0
        for size in self.level_sizes():
            out.append(self.parents[lo:lo + size])
            lo += size
        return tuple(out)


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
    reranks = False  # a plain class attribute, not a dataclass field
    parents = None  # the shape depends on the draws
    kind = "dynamic"  # its name in a result's record (``tree_record``)

    def __post_init__(self):
        for name in ("depth", "width", "children"):
            object.__setattr__(self, name, check_positive_int(getattr(self, name), name))

    @property
    def label(self) -> str:
        """Its name in tables: ``dynamic tree depth/width/children``."""
        return f"dynamic tree {self.depth}/{self.width}/{self.children}"

    def level_sizes(self) -> tuple[int, ...]:
        """Nodes per level: ``children``, then ``min(width, previous level) * children`` (one entry
        per level: for the runtime, which grows the tree level by level)."""
        sizes = [self.children]
        for _ in range(self.depth - 1):
            sizes.append(min(self.width, sizes[-1]) * self.children)
        return tuple(sizes)

    def levels(self) -> tuple[tuple[int, ...] | Grow, ...]:
        """The root's ``children`` candidates, then ``Grow(min(width, previous level), children)``."""
        sizes = self.level_sizes()
        return ((-1,) * self.children, *(Grow(min(self.width, s), self.children) for s in sizes[:-1]))

    @property
    def nodes(self) -> int:
        """``sum(level_sizes())``, computed arithmetically (``dynamic_tree_nodes``)."""
        return dynamic_tree_nodes(self.depth, self.width, self.children)

    @property
    def grown(self) -> int:
        return self.nodes


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
    reranks = True  # a plain class attribute, not a dataclass field
    parents = None  # the shape depends on the draft's laws
    kind = "budget"  # its name in a result's record (``tree_record``: left out there, see ``RECORD_DEFAULT_KIND``)

    def __post_init__(self):
        for name in ("nodes", "depth", "topk"):
            object.__setattr__(self, name, check_positive_int(getattr(self, name), name))
        if self.nodes > self.grown:  # never verify fewer nodes than asked without saying so
            raise ValueError(f"nodes = {self.nodes} exceeds the {self.grown} nodes a tree of depth {self.depth} and "
                             f"top-{self.topk} grows: lower nodes or raise depth / topk")

    @property
    def label(self) -> str:
        """Its name in tables (the eval's tree rows since issue 19): ``EAGLE-2 tree nodes/depth/topk``."""
        return f"EAGLE-2 tree {self.nodes}/{self.depth}/{self.topk}"

    @property
    def width(self) -> int:
        return self.topk

    @property
    def children(self) -> int:
        return self.topk

    def level_sizes(self) -> tuple[int, ...]:
        """Nodes per level as grown (before re-ranking)."""
        return DynamicTree(self.depth, self.topk, self.topk).level_sizes()

    def levels(self) -> tuple[tuple[int, ...] | Grow, ...]:
        """As grown: ``DynamicTree(depth, topk, topk)``'s."""
        return DynamicTree(self.depth, self.topk, self.topk).levels()

    @property
    def grown(self) -> int:
        """Nodes grown before re-ranking: ``topk + (depth - 1) topk^2``."""
        return dynamic_tree_nodes(self.depth, self.topk, self.topk)

    @property
    def kept(self) -> int:
        """Nodes verified (``nodes``, at most ``grown``: checked)."""
        return self.nodes


# -- schemes and the command line's trees ------------------------------------------------------------

def check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")


def check_tree_scheme(tree, scheme: str) -> None:
    """A tree that ``reranks`` its drawn nodes (``BudgetTree``): only non-random candidates keep a
    lossless verifier lossless (see ``BudgetTree``)."""
    check_scheme(scheme)
    if as_tree(tree).reranks and scheme not in RERANK_SCHEMES:
        raise ValueError(f"scheme {scheme!r} with a node budget (BudgetTree / --tree NODES): re-ranking random "
                         f"candidates by their own probability changes their law, so verification is no longer "
                         f"lossless; use scheme 'deterministic' (or 'eagle'), or a DynamicTree (--tree-dynamic) for "
                         f"{scheme!r} draws")


def check_caps(nodes: int, grown: int, shape: str) -> None:
    """The command line's caps: at most ``MAX_KEPT`` nodes verified and ``MAX_GROWN`` grown per step
    (``ValueError`` starting with ``shape``, the flags as given)."""
    if nodes == grown and nodes > MAX_KEPT:
        raise ValueError(f"{shape} makes {nodes} nodes; at most {MAX_KEPT}")
    if nodes > MAX_KEPT or grown > MAX_GROWN:
        raise ValueError(f"{shape}: at most {MAX_KEPT} nodes kept and {MAX_GROWN} grown, got {nodes} kept of "
                         f"{grown} grown")


_FLAG_KINDS = {  # the command line's tree flags: (nodes, grown) counted before anything is built, the tree
    "branching": (lambda n: (branching_nodes(n),) * 2, lambda n: StaticTree(branching_parents(n))),
    "dynamic": (lambda n: (dynamic_tree_nodes(*n),) * 2, lambda n: DynamicTree(*n)),
    "budget": (lambda n: (n[0], dynamic_tree_nodes(n[1], n[2], n[2])), lambda n: BudgetTree(*n)),
}


def flag_tree(kind: str, nums: Sequence[int], shape: str) -> Tree:
    """The tree of a command-line flag (torch-free, before anything loads): ``kind`` ``"branching"``
    (``nums`` = b1, b2, ...: ``branching_parents``), ``"dynamic"`` (depth, width, children) or
    ``"budget"`` (nodes, depth, topk). Counted arithmetically and held to the caps (``check_caps``)
    before it is built; ``ValueError`` starting with ``shape`` (the flags as given)."""
    if kind not in _FLAG_KINDS:
        raise ValueError(f"tree kind must be one of {tuple(_FLAG_KINDS)}, got {kind!r}")
    count, make = _FLAG_KINDS[kind]
    nums = tuple(nums)
    try:
        nodes, grown = count(nums)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{shape}: {e}") from None
    check_caps(nodes, grown, shape)
    try:
        return make(nums)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{shape}: {e}") from None


# -- a tree in a result: its name and its record ---------------------------------------------------------

TREE_KINDS = {"static": StaticTree, "dynamic": DynamicTree, "budget": BudgetTree}  # the kinds results record
RECORD_DEFAULT_KIND = "budget"  # a record without "kind": the eval recorded only BudgetTrees before other kinds


def _recorded_kind(tree) -> str:
    """The declared ``kind`` of a tree that results can record (one of ``TREE_KINDS``); ``ValueError`` otherwise."""
    kind = getattr(tree, "kind", None)
    if TREE_KINDS.get(kind) is not type(tree):
        raise ValueError(f"a recorded tree must be one of the kinds {tuple(TREE_KINDS)} (core.tree_shapes), "
                         f"got {tree!r}")
    return kind


def tree_name(tree) -> str:
    """A tree's short name in tables and method labels (its kind's ``label``): ``EAGLE-2 tree 12/5/4``,
    ``dynamic tree 3/2/2``, ``static tree -1,-1,0,0``; distinct trees have distinct names."""
    _recorded_kind(tree)
    return tree.label


def tree_record(tree) -> dict:
    """What a result records of a tree (JSON: its fields, tuples as lists, and its ``kind``), rebuilt by
    ``tree_from_record``. A ``BudgetTree`` records ``{"nodes", "depth", "topk"}`` without a kind, as results did
    before the other kinds could be recorded (``RECORD_DEFAULT_KIND``), so those records read the same."""
    kind = _recorded_kind(tree)
    params = {f.name: (list(v) if isinstance(v := getattr(tree, f.name), tuple) else v) for f in fields(tree)}
    return params if kind == RECORD_DEFAULT_KIND else {"kind": kind, **params}


def tree_from_record(record: dict) -> Tree:
    """The tree ``tree_record`` recorded (keys other than its kind's fields, e.g. the eval's ``scheme``, are
    ignored); ``ValueError`` for an unknown kind or missing fields."""
    kind = record.get("kind", RECORD_DEFAULT_KIND)
    if kind not in TREE_KINDS:
        raise ValueError(f"tree record: kind must be one of {tuple(TREE_KINDS)}, got {kind!r}")
    cls = TREE_KINDS[kind]
    names = [f.name for f in fields(cls)]
    missing = [n for n in names if n not in record]
    if missing:
        raise ValueError(f"tree record of kind {kind!r} lacks {missing}: {record!r}")
    return cls(**{n: record[n] for n in names})
