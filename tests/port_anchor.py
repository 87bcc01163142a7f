"""AST anchors for the planted ports of ``tests/mutants.py``: a port names the function (or class) it plants
into by its qualified name and the code it replaces by a fragment of Python (one expression, or one or more
consecutive statements), matched against the function's syntax tree, not its text. So a cosmetic edit of the
function (whitespace, line breaks, comments, parentheses, its docstring, the code around the fragment) leaves the
anchor found, and a semantic edit of the fragment stales it.

Matching (``resolve``): the fragment's tree equals a node's (or a run of statements') tree field by field, with
positions and parentheses ignored, and with the function's local names abstracted: a name of the fragment
that is not a module-level or builtin name of the file matches any local (parameter or assigned name) of the
function, consistently and one to one, and the replacement is renamed the same way. Attribute, keyword and
module-level names must match exactly. A name the replacement reads but the anchor does not contain is not
renamed: if the function renamed it, ``apply`` reports the port as stale (its replacement reads an undefined
name). So a rename of a local inside the function stales nothing, and a rename of the function itself (its
qualified name) stales every port in it. Code inside f-strings is never a match (its positions are unreliable
before Python 3.12); anchor the whole f-string instead. An anchor must match exactly once inside its function:
none is stale, more than one is ambiguous, and both are errors (``StaleAnchor``), never a silent skip.

Applying (``apply``): the matched source span is replaced by the replacement, re-indented to the span's column
(an expression in parentheses, so precedence cannot change); a replacement of a whole body by nothing is
``pass``. The planted function must parse (checked on its own source, not the whole file).

A limit of the abstraction: an anchor made only of local names (``x[i]``) matches any such expression, so it
must be widened until it is unique (``--check`` says when it is not); a semantic edit that leaves another,
equal fragment as the only match is not detected.
"""

from __future__ import annotations

import ast
import builtins
import textwrap
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["StaleAnchor", "Match", "resolve", "apply", "find_function", "function_span", "parse", "parse_segment"]

_BUILTINS = frozenset(dir(builtins))
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class StaleAnchor(RuntimeError):
    """An anchor whose function is missing or repeated, or whose fragment matches zero or several times."""


@dataclass(frozen=True)
class Match:
    start: int  # character offsets of the matched span in the file's text
    end: int
    kind: str  # "expr" or "stmts"
    whole_body: bool  # the span is a whole statement list (an empty replacement becomes ``pass``)
    node: ast.AST
    rename: dict  # fragment name -> the function's name (only the names that differ)
    line: int
    scope: tuple[int, int, int]  # the function's span (from its line's start) and its column


def _fragment(code: str) -> tuple[str, list[ast.AST]]:
    code = textwrap.dedent(code).strip("\n")
    try:
        return "expr", [ast.parse(code, mode="eval").body]
    except SyntaxError:
        return "stmts", ast.parse(code).body


def find_function(tree: ast.Module, qualname: str) -> list[ast.AST]:
    """Every class or function definition whose nesting of class / function names is ``qualname``
    (``Class.method``, ``function``, ``outer.inner``); ``""`` is the module."""
    if not qualname:
        return [tree]
    found = []

    def walk(node, names):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):  # definitions are statements (lambdas have no name)
                continue
            if isinstance(child, _SCOPES):
                here = (*names, child.name)
                if ".".join(here) == qualname:
                    found.append(child)
                walk(child, here)
            else:
                walk(child, names)

    walk(tree, ())
    return found


@lru_cache(maxsize=16)
def parse(text: str) -> ast.Module:
    """``ast.parse(text)``, cached: shared, never to be modified."""
    return ast.parse(text)  # shared, never modified


def _module_names(tree: ast.Module) -> set[str]:
    names = set(_BUILTINS)
    for node in tree.body:
        for sub in ast.walk(node) if not isinstance(node, _SCOPES) else [node]:
            if isinstance(sub, _SCOPES):
                names.add(sub.name)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)
            elif isinstance(sub, ast.alias):
                names.add((sub.asname or sub.name).split(".")[0])
    return names


def _local_names(scope: ast.AST) -> set[str]:
    if isinstance(scope, (ast.Module, ast.ClassDef)):
        return set()  # module and class attributes are API: never abstracted
    out = set()
    for sub in ast.walk(scope):
        if isinstance(sub, ast.arg):
            out.add(sub.arg)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            out.add(sub.id)
        elif isinstance(sub, ast.alias):
            out.add((sub.asname or sub.name).split(".")[0])
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            out.add(sub.name)
    return out


class _Matcher:
    def __init__(self, local: set[str], module: set[str]):
        self.local, self.module = local, module

    def same(self, a, b, m: dict, rev: dict) -> bool:
        if type(a) is not type(b):
            return False
        if isinstance(a, ast.Name):
            if not self._name(a.id, b.id, m, rev):
                return False
        elif isinstance(a, ast.arg):
            if not self._name(a.arg, b.arg, m, rev):
                return False
        for field in a._fields:
            if isinstance(a, ast.Name) and field == "id" or isinstance(a, ast.arg) and field == "arg":
                continue
            if field in ("type_comment", "kind"):
                continue
            va, vb = getattr(a, field, None), getattr(b, field, None)
            if isinstance(va, list):
                if not isinstance(vb, list) or len(va) != len(vb):
                    return False
                if not all(self._value(x, y, m, rev) for x, y in zip(va, vb, strict=True)):
                    return False
            elif not self._value(va, vb, m, rev):
                return False
        return True

    def _value(self, x, y, m, rev) -> bool:
        if isinstance(x, ast.AST):
            return isinstance(y, ast.AST) and self.same(x, y, m, rev)
        return type(x) is type(y) and x == y

    def _name(self, a: str, b: str, m: dict, rev: dict) -> bool:
        if a in m:
            return m[a] == b
        if b in rev:
            return False
        if a != b and not (b in self.local and (a not in self.module or a in self.local)):
            return False
        m[a], rev[b] = b, a
        return True


def _in_fstring(scope: ast.AST) -> set[int]:
    inside = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.JoinedStr):
            inside.update(id(sub) for sub in ast.walk(node) if sub is not node)
    return inside


def _stmt_lists(scope: ast.AST):
    for node in ast.walk(scope):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield body


class _Text:
    """Line / byte-column (as ``ast`` reports them) to character offsets of a text."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", errors="replace"))


def _describe(path: str, qualname: str) -> str:
    return f"{path}, {'function ' + qualname if qualname else 'module level'}"


def resolve(text: str, qualname: str, old: str, *, path: str = "<file>") -> Match:
    """The one place of ``old`` inside ``qualname`` of the source ``text``; ``StaleAnchor`` otherwise."""
    tree = parse(text)
    scopes = find_function(tree, qualname)
    where = _describe(path, qualname)
    if len(scopes) != 1:
        raise StaleAnchor(f"{where}: the function is defined {len(scopes)} times (must be exactly once)")
    scope = scopes[0]
    kind, pattern = _fragment(old)
    if not pattern:
        raise StaleAnchor(f"{where}: empty anchor")
    matcher = _Matcher(_local_names(scope), _module_names(tree))
    hits = []
    if kind == "expr":
        skip = _in_fstring(scope)
        for node in ast.walk(scope):
            if isinstance(node, ast.expr) and id(node) not in skip:
                m: dict = {}
                if matcher.same(pattern[0], node, m, {}):
                    hits.append(([node], m, False))
    else:
        k = len(pattern)
        for body in _stmt_lists(scope):
            for i in range(len(body) - k + 1):
                m, rev = {}, {}
                if all(matcher.same(p, s, m, rev) for p, s in zip(pattern, body[i:i + k], strict=True)):
                    hits.append((body[i:i + k], m, k == len(body)))
    if len(hits) != 1:
        lines = ", ".join(str(h[0][0].lineno) for h in hits)
        how = "not found (stale)" if not hits else f"found {len(hits)} times, at lines {lines} (ambiguous)"
        raise StaleAnchor(f"{where}: anchor {how}: {textwrap.shorten(' '.join(old.split()), 100)}")
    nodes, m, whole = hits[0]
    t = _Text(text)
    start = t.offset(nodes[0].lineno, nodes[0].col_offset)
    end = t.offset(nodes[-1].end_lineno, nodes[-1].end_col_offset)
    return Match(start, end, kind, whole, nodes[0], {a: b for a, b in m.items() if a != b}, nodes[0].lineno,
                 _span(t, scope))


def _span(t: _Text, scope: ast.AST) -> tuple[int, int, int]:
    if isinstance(scope, ast.Module):
        return 0, len(t.text), 0
    return t.starts[scope.lineno - 1], t.offset(scope.end_lineno, scope.end_col_offset), scope.col_offset


def function_span(text: str, qualname: str) -> tuple[int, int, int]:
    """``(start, end, column)``: the character span of the one definition ``qualname`` in ``text``, from the
    start of its ``def`` / ``class`` line (decorators excluded), and its indentation."""
    scopes = find_function(parse(text), qualname)
    if len(scopes) != 1:
        raise StaleAnchor(f"{qualname}: defined {len(scopes)} times")
    return _span(_Text(text), scopes[0])


def parse_segment(segment: str, column: int) -> ast.Module:
    """A definition cut out of its file (``function_span``), parsed where it stands (indented by ``column``)."""
    return ast.parse("if 1:\n" + segment if column else segment)


def _renamed(code: str, rename: dict) -> str:
    if not rename or not code.strip():
        return code
    _, nodes = _fragment(code)
    t = _Text(textwrap.dedent(code).strip("\n"))
    edits = []
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in rename:
                edits.append((t.offset(sub.lineno, sub.col_offset), t.offset(sub.end_lineno, sub.end_col_offset),
                              rename[sub.id]))
    out = t.text
    for s, e, name in sorted(edits, reverse=True):
        out = out[:s] + name + out[e:]
    return out


def apply(text: str, qualname: str, old: str, new: str, *, path: str = "<file>") -> str:
    """``text`` with the one match of ``old`` inside ``qualname`` replaced by ``new``."""
    m = resolve(text, qualname, old, path=path)
    new = _renamed(textwrap.dedent(new).strip("\n"), m.rename)
    if m.kind == "expr":
        plain = isinstance(m.node, ast.Slice) or isinstance(m.node, ast.Tuple) and any(
            isinstance(e, ast.Slice) for e in m.node.elts)
        repl = new if plain else f"({new}\n)" if "#" in new else f"({new})"
    else:
        if not new.strip():
            new = "pass" if m.whole_body else ""
        col = m.start - (text.rfind("\n", 0, m.start) + 1)
        repl = new.replace("\n", "\n" + " " * col)
    out = text[:m.start] + repl + text[m.end:]
    where = _describe(path, qualname)
    s, e, col = m.scope
    segment = out[s:e + len(out) - len(text)]  # the planted function alone: parsed, not the whole file
    try:
        tree = parse_segment(segment, col)
    except SyntaxError as err:
        raise StaleAnchor(f"{where}: the replacement does not parse ({err})") from err
    scope = tree if not qualname else tree.body[0].body[0] if col else tree.body[0]
    original = parse(text)
    known = _module_names(original) | _local_names(scope)
    for outer in _scope_chain(original, qualname)[:-1]:
        known |= _local_names(outer)
    read = {n.id for n in ast.walk(ast.parse(new or "pass")) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if read - known:  # a name the function no longer defines (renamed, but not in the anchor)
        raise StaleAnchor(f"{where}: the replacement reads {sorted(read - known)}, which the function does not define")
    return out


def _scope_chain(tree: ast.Module, qualname: str) -> list[ast.AST]:
    parts = qualname.split(".") if qualname else []
    return [s for i in range(1, len(parts) + 1) for s in find_function(tree, ".".join(parts[:i]))]
