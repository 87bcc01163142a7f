"""The package's layering, read from the source (ast): every import of every ``cactus_theory``
module (module-level and inside functions, relative and absolute, and constant module names given
to ``importlib.import_module`` or to ``lm``'s lazy-name table) goes to its own layer or to one that
``docs/architecture.md``'s table lets it import; the module graph has no cycle; package code never
imports a public-path alias; and every documented public path imports its documented names."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import cactus_theory

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "cactus_theory"
DOC = ROOT / "docs" / "architecture.md"


def layer_table(text: str) -> dict[str, set[str]]:
    """``{layer: layers it may import}`` from the "What may import what" table of the doc."""
    section = text.split("## What may import what", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("layer", "") and not set(cells[0]) <= {"-"}:
            table[cells[0]] = {x.strip() for x in cells[2].split(",")}
    return table


LAYERS = layer_table(DOC.read_text(encoding="utf-8"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer_of(module: str) -> str:
    """The layer of a ``cactus_theory`` module: its folder (``lm.train`` and ``lm.experiments`` are
    layers of their own); the root package is ``api``."""
    parts = module.split(".")[1:]
    if not parts:
        return "api"
    if parts[0] == "lm" and len(parts) > 1 and parts[1] in ("train", "experiments"):
        return f"lm.{parts[1]}"
    return parts[0]


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + (module.split(".") if module else []))


def _target(name: str) -> str:
    """``name`` itself when it is a module of the package (or not ours), else its nearest parent module
    (``from pkg import attr`` imports ``pkg``)."""
    while name.startswith("cactus_theory") and name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(module: str, source: str) -> list[tuple[str, int]]:
    """(imported module, line) of every import in ``source``: ``import a.b``, ``from .x import y``
    (``y`` counts as the module ``x.y`` when that module exists), ``importlib.import_module("...")``
    with constant arguments, any string constant that is the full dotted name of a module of the package
    (e.g. the command table of ``cli``, loaded with ``import_module``), and the values of a module-level ``_WHERE`` table of lazy names (read
    relative to the module, as ``lm/__init__.py`` imports them)."""
    tree = ast.parse(source)
    is_pkg = MODULES[module].name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_pkg, node.level, node.module) if node.level else node.module
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub if sub in MODULES or sub in cactus_theory.PUBLIC_PATHS else base, node.lineno))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            name = node.args[0].value
            out.append((_resolve(module, is_pkg, len(name) - len(name.lstrip(".")), name.lstrip(".")) if name.startswith(".")
                        else name, node.lineno))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value
              and (node.value in MODULES or node.value in cactus_theory.PUBLIC_PATHS)):
            out.append((node.value, node.lineno))  # a module named by a string (a command table)
        elif (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_WHERE" for t in node.targets)
              and isinstance(node.value, ast.Dict)):
            for v in node.value.values:
                if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.startswith("."):
                    name = v.value
                    out.append((_resolve(module, is_pkg, len(name) - len(name.lstrip(".")), name.lstrip(".")), v.lineno))
    return out


def graph() -> dict[str, list[tuple[str, int]]]:
    """Edges between ``cactus_theory`` modules (aliases kept as their own names)."""
    g = {}
    for mod, path in MODULES.items():
        g[mod] = [(_target(t), line) for t, line in imports_of(mod, path.read_text(encoding="utf-8"))
                  if t.split(".")[0] == "cactus_theory"]
    return g


def layering_errors(g: dict[str, list[tuple[str, int]]]) -> list[str]:
    bad = []
    for mod, edges in g.items():
        src = layer_of(mod)
        for tgt, line in edges:
            where = f"{MODULES[mod].relative_to(ROOT)}:{line}"
            if tgt in cactus_theory.PUBLIC_PATHS:
                bad.append(f"{where}: imports the public alias {tgt} (import {cactus_theory.PUBLIC_PATHS[tgt]})")
            elif tgt not in MODULES:
                bad.append(f"{where}: imports {tgt}, which is no module of the package")
            elif layer_of(tgt) not in LAYERS.get(src, set()):
                bad.append(f"{where}: {mod} ({src}) imports {tgt} ({layer_of(tgt)}); {src} may import "
                           f"{sorted(LAYERS.get(src, set()))}")
    return bad


def cycles(g: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (or a self-import)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _ in g.get(v, []):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or any(w == v for w, _ in g.get(v, [])):
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_the_table_is_parsed_and_covers_every_layer():
    assert {"util", "core", "theory", "claims", "lm", "lm.train", "lm.experiments", "integrations", "cli",
            "api"} == set(LAYERS)
    for name, allowed in LAYERS.items():
        assert name in allowed or name == "api", name
        assert allowed <= set(LAYERS), (name, allowed - set(LAYERS))
    assert {layer_of(m) for m in MODULES} <= set(LAYERS)


def test_lower_layers_never_import_higher_ones():
    assert LAYERS["util"] == {"util"}
    assert not LAYERS["core"] & {"theory", "lm", "claims", "cli", "lm.train", "lm.experiments", "integrations"}
    assert not LAYERS["theory"] & {"lm", "lm.train", "lm.experiments", "claims", "cli", "integrations"}
    assert not LAYERS["lm"] & {"theory", "claims", "lm.train", "lm.experiments", "cli", "integrations"}


def test_every_import_respects_the_layers():
    bad = layering_errors(graph())
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, found


def test_the_checks_see_function_level_and_relative_imports():
    g = graph()
    assert any(t == "cactus_theory.util.args" for t, _ in g["cactus_theory.core.registry"])  # inside a function
    assert any(t == "cactus_theory.lm.metrics" for t, _ in g["cactus_theory.lm"])  # the lazy-name table
    assert any(t == "cactus_theory.cli.lm" for t, _ in g["cactus_theory.cli"])  # the command table
    planted = {"cactus_theory.core.exact": [("cactus_theory.theory.stats", 1)],
               "cactus_theory.theory.stats": [("cactus_theory.core.exact", 1)],
               "cactus_theory.core.rules": [("cactus_theory.sampler", 1)]}
    errors = layering_errors(planted)
    assert len(errors) == 2 and "imports the public alias" in errors[1], errors
    assert cycles(planted) == [["cactus_theory.core.exact", "cactus_theory.theory.stats"]]


def test_every_alias_is_its_target():
    for alias, target in cactus_theory.PUBLIC_PATHS.items():
        assert alias not in MODULES, f"{alias} is an alias and must not be a file too"
        assert target in MODULES, target
        assert importlib.import_module(alias) is importlib.import_module(target), alias


def _design_public_names() -> list[tuple[str, str]]:
    """(module, name): the design notes' public names by module path (listed here), and every
    ``from cactus_theory.X import a, b`` line of the code in README.md and docs/*.md."""
    pairs = [
        ("cactus_theory.sampler", "verify"), ("cactus_theory.sampler", "verify_flat"),
        ("cactus_theory.optimize", "solve_target"), ("cactus_theory.optimize", "max_acceptance"),
        ("cactus_theory.optimize", "gamma_search"), ("cactus_theory.stats", "goodness_of_fit"),
        ("cactus_theory.stats", "samples_needed"), ("cactus_theory.exact", "induced_distribution"),
        ("cactus_theory.exact", "acceptance_rate"), ("cactus_theory.divergences", "divergence"),
        ("cactus_theory.divergences", "kl"), ("cactus_theory.rules", "Cactus"), ("cactus_theory.rules", "Rule"),
        ("cactus_theory.registry", "make_rule"), ("cactus_theory.registry", "RULES"), ("cactus_theory.toy", "one_step_test"),
        ("cactus_theory.toy", "sequence_test"), ("cactus_theory.tradeoff", "matched_cactus"),
        ("cactus_theory.validate", "check_number"), ("cactus_theory.dropmatch", "path_law"),
        ("cactus_theory.integrations.transformers", "use_rule"), ("cactus_theory.integrations.vllm", "register"),
    ]
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^from (cactus_theory[\w.]*) import ([\w, ]+)", text, re.M):
            pairs += [(m.group(1), n.strip()) for n in m.group(2).split(",") if n.strip()]
    return sorted(set(pairs))


@pytest.mark.parametrize("module,name", _design_public_names(), ids=lambda x: x)
def test_documented_public_names_import_from_their_documented_path(module, name):
    mod = importlib.import_module(module)
    assert hasattr(mod, name), f"{module}.{name}"


def test_the_top_level_api_has_no_name_shared_with_the_registry():
    assert not hasattr(cactus_theory, "RULES")
    assert set(cactus_theory.RULE_CLASSES) == set(cactus_theory.registry.RULES)


def test_the_decode_loop_names_no_rule_and_no_draft_class():
    """The loop reads declared capabilities (``Rule.reads_head`` and ``Rule.bind``, a drafter's
    ``needs_features``), never a rule's or a draft's class."""
    src = (PKG / "lm" / "loop.py").read_text(encoding="utf-8")
    tree = ast.parse(src)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    rule_classes = set(cactus_theory.RULE_CLASSES.values())
    assert not {c.__name__ for c in rule_classes} & names
    assert "dropmatch" not in src.lower() and "FeatureDraft" not in src
    assert not [t for t, _ in graph()["cactus_theory.lm.loop"] if t.endswith("dropmatch") or t.endswith(".draft")]


def test_public_modules_are_attributes_of_the_package():
    """``ct.sampler``, ``ct.rules``, ...: each top-level public path is reachable as an attribute (imported on
    first access), the very module its alias names; an unknown name is still an AttributeError."""
    import importlib

    import cactus_theory as ct

    for alias, target in ct.PUBLIC_PATHS.items():
        name = alias.removeprefix("cactus_theory.")
        if "." not in name:
            assert getattr(ct, name) is importlib.import_module(target)
    with pytest.raises(AttributeError, match="no attribute 'not_a_module'"):
        ct.not_a_module  # noqa: B018


def test_the_api_imports_the_theory_layer_lazily():
    """``ct.check_sampler`` / ``ct.check_generation`` live in the theory layer and are served on first access:
    the api has no module-level import of ``theory``, and ``import cactus_theory`` loads neither that layer
    nor scipy (a fresh interpreter)."""
    import subprocess
    import sys

    tree = ast.parse((PKG / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:  # module level only: imports inside functions run on access
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("theory"), node.module
    code = ("import sys, cactus_theory as ct; assert 'scipy' not in sys.modules, 'scipy'; "
            "assert not [m for m in sys.modules if m.startswith('cactus_theory.theory')], 'theory'; "
            "f = ct.check_sampler; g = ct.check_generation; "
            "assert f.__module__ == 'cactus_theory.theory.check' and g.__module__ == 'cactus_theory.theory.check_generation'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
