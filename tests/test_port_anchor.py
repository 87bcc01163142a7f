"""The planted ports' anchors (tests/mutants.py, tests/port_anchor.py) survive cosmetic edits of the code they
plant into and go stale, loudly, on semantic ones (issue 29 item 5). Each case edits a temporary copy of
``cactus_theory/core/rules.py``, never the repository."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys

import mutants
import port_anchor
import pytest

RULES = "cactus_theory/core/rules.py"
PORTS = {p.id: p for p in mutants.PORTS}


def source() -> str:
    with open(os.path.join(mutants.ROOT, RULES), encoding="utf-8") as f:
        return f.read()


def unparsed(text: str, *qualnames: str) -> str:
    """``text`` with each function re-emitted by ``ast.unparse`` (its comments dropped, other quotes, line breaks
    and parentheses), with a comment line above each statement (a class named here is re-emitted whole)."""
    tree = port_anchor.parse(text)
    spans = []
    for name in qualnames:
        if any(name.startswith(other + ".") for other in qualnames):
            continue
        (node,) = port_anchor.find_function(tree, name)
        s, e, col = port_anchor.function_span(text, name)
        lines = ast.unparse(node).splitlines()
        starts = {st.lineno - 1 for st in ast.walk(ast.parse(ast.unparse(node))) if isinstance(st, ast.stmt)}
        body = []
        for i, line in enumerate(lines):  # and a comment line above each statement
            if i in starts and i:
                body.append(" " * col + line[:len(line) - len(line.lstrip())] + "# (reformatted)")
            body.append(" " * col + line if line else line)
        spans.append((s, e, "\n".join(body)))
    for s, e, body in sorted(spans, reverse=True):
        text = text[:s] + body + text[e:]
    return text


class _NoDocstrings(ast.NodeTransformer):
    def generic_visit(self, node):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list):
                setattr(node, field, [b for b in body if not (isinstance(b, ast.Expr) and isinstance(
                    b.value, ast.Constant) and isinstance(b.value.value, str))] or [ast.Pass()])
        return super().generic_visit(node)


def law(base: str, mutated: str, qualname: str) -> str:
    """The syntax tree of ``qualname`` in ``mutated`` (``base`` with one port planted in that function), strings
    standing alone as statements (docstrings, which ``unparsed`` re-indents) left out."""
    s, e, col = port_anchor.function_span(base, qualname)
    tree = port_anchor.parse_segment(mutated[s:e + len(mutated) - len(base)], col)
    return ast.dump(_NoDocstrings().visit(tree))


def same_law(a: str, b: str) -> bool:
    return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))


def test_every_rules_port_survives_unparsing_its_function():
    """Every port in rules.py still resolves, once, after its function is re-emitted by ``ast.unparse``, and
    plants the same code there as in the original."""
    text = source()
    ports = [p for p in mutants.PORTS if p.file == RULES]
    assert len(ports) >= 40
    names = sorted({p.at for p in ports})
    new = unparsed(text, *names)

    def source_of(t, name):
        s, e, _ = port_anchor.function_span(t, name)
        return t[s:e]

    assert all(source_of(new, n) != source_of(text, n) for n in names)
    for port in ports:
        assert law(new, mutants.planted(port, new), port.at) == law(text, mutants.planted(port, text), port.at), port.id


def test_anchor_survives_line_breaks_comments_parentheses_and_a_renamed_local():
    text = source()
    tas, target = PORTS["tas-ge"], PORTS["target-residual-q"]
    reformatted = text.replace(
        "        return xp.astype(q_n > thr, q_n.dtype)\n",
        "        return xp.astype(  # the strict test\n            ((q_n) > (thr)),\n            q_n.dtype,\n        )\n")
    reformatted = reformatted.replace(  # rename the local h of TargetRule.residual (its anchor names h)
        "        h = self.target_rows(p, q, n)\n        return self._recover(_pos(h - p), h)",
        "        target = self.target_rows(p, q, n)\n\n        return self._recover(\n"
        "            _pos(target - p),  # (h - p)_+\n            target)")
    assert reformatted.count("target = self.target_rows") == 1 and "((q_n) > (thr))" in reformatted
    assert mutants.check_anchors([tas, target], root=_tree_with(reformatted)) == []
    got = mutants.planted(tas, reformatted)
    assert same_law(got, mutants.planted(tas, text).replace(
        "        h = self.target_rows(p, q, n)\n        return self._recover(_pos(h - p), h)",
        "        target = self.target_rows(p, q, n)\n        return self._recover(_pos(target - p), target)"))
    # the renamed local is renamed in the replacement too: (q - p)_+ with the function's own names
    planted = mutants.planted(target, reformatted)
    assert same_law(planted, reformatted.replace("_pos(target - p)", "_pos(q - p)"))


_TMP: list[str] = []


def _tree_with(rules_text: str) -> str:
    """A temporary root holding ``rules_text`` as cactus_theory/core/rules.py (and the mutants scripts)."""
    import tempfile

    root = tempfile.mkdtemp(prefix="port-anchor-")
    _TMP.append(root)
    os.makedirs(os.path.join(root, "cactus_theory", "core"))
    os.makedirs(os.path.join(root, "tests"))
    with open(os.path.join(root, RULES), "w", encoding="utf-8") as f:
        f.write(rules_text)
    for name in ("mutants.py", "port_anchor.py"):
        shutil.copy(os.path.join(mutants.ROOT, "tests", name), os.path.join(root, "tests", name))
    return root


@pytest.fixture(autouse=True)
def _cleanup():
    yield
    while _TMP:
        shutil.rmtree(_TMP.pop(), ignore_errors=True)


def _check(root: str, ports: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(root, "tests", "mutants.py"), "--check", "--ports", ports],
                          capture_output=True, text=True, cwd=root)


@pytest.mark.parametrize("edit, expect", [
    # a semantic edit of the anchored code: the port's anchor is gone
    (("        return xp.astype(q_n > thr, q_n.dtype)\n", "        return xp.astype(q_n >= thr, q_n.dtype)\n"),
     "port tas-ge: cactus_theory/core/rules.py, function TAS.phi: anchor not found (stale)"),
    # a second copy of the anchored code in the function: ambiguous
    (("        return xp.astype(q_n > thr, q_n.dtype)\n",
      "        keep = xp.astype(q_n > thr, q_n.dtype)\n        return xp.astype(q_n > thr, q_n.dtype)\n"),
     "port tas-ge: cactus_theory/core/rules.py, function TAS.phi: anchor found 2 times, at lines"),
    # the function renamed
    (("    def phi(self, p_n, q_n, exp_neg_h):\n        xp = xp_of(q_n)\n        thr = xp.clip(self.alpha",
      "    def accept(self, p_n, q_n, exp_neg_h):\n        xp = xp_of(q_n)\n        thr = xp.clip(self.alpha"),
     "port tas-ge: cactus_theory/core/rules.py, function TAS.phi: the function is defined 0 times"),
])
def test_a_semantic_edit_stales_the_port_and_check_fails_loudly(edit, expect):
    text = source()
    assert text.count(edit[0]) == 1
    root = _tree_with(text.replace(edit[0], edit[1]))
    assert any(expect in line for line in mutants.check_anchors([PORTS["tas-ge"]], root=root))
    proc = _check(root, "tas-ge,target-residual-q")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "STALE PORTS: 1 of 2" in proc.stderr and expect in proc.stderr, proc.stderr


def test_check_passes_on_the_unmodified_and_on_a_reformatted_copy():
    text = source()
    proc = _check(_tree_with(unparsed(text, "TAS.phi", "TargetRule.residual")), "tas-ge,target-residual-q")
    assert proc.returncode == 0 and "2 ports anchored" in proc.stdout, proc.stdout + proc.stderr


def test_a_replacement_reading_a_renamed_name_is_stale():
    """A name the replacement reads but its anchor does not contain is not renamed; if the function renamed
    it, the port is reported (not planted as a NameError the tests would 'catch')."""
    port = PORTS["target-residual-q"]  # replaces _pos(h - p) by _pos(q - p): q is not in the anchor
    text = source()
    old = "        h = self.target_rows(p, q, n)\n        return self._recover(_pos(h - p), h)"
    s, e, _ = port_anchor.function_span(text, "TargetRule.residual")
    fn = text[s:e].replace("q: Array", "target_probs: Array").replace("_check_inputs(p, q, n)",
                                                                       "_check_inputs(p, target_probs, n)")
    fn = fn.replace(old, old.replace("(p, q, n)", "(p, target_probs, n)"))
    with pytest.raises(port_anchor.StaleAnchor, match=r"reads \['q'\], which the function does not define"):
        mutants.planted(port, text[:s] + fn + text[e:])
