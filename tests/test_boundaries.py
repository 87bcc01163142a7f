"""Library boundaries, read from the source (ast): the library never imports ``paper_repro``; no
module imports another module's private names; every atomic write goes through
``cactus_theory.util.atomic`` (the only ``os.replace``); and the command line answers bad arguments
with one line and exit status 2 without importing torch or transformers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("cactus_theory", "paper_repro")
SOURCES = sorted(p for d in ("cactus_theory", "paper_repro", "benchmarks", "tests", "notebooks")
                 for p in (ROOT / d).rglob("*.py"))


def _imports(path: Path):
    """(module, names) of every import in ``path``, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = path.relative_to(ROOT).with_suffix("").parts[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []
        elif isinstance(node, ast.ImportFrom):
            base = list(pkg[:len(pkg) - node.level + 1]) if node.level else []
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            yield mod, [a.name for a in node.names]


def test_sources_found():
    assert len(SOURCES) > 30 and any(p.name == "atomic.py" for p in SOURCES)


def test_library_never_imports_paper_repro():
    bad = [(p.name, m) for p in SOURCES if p.is_relative_to(ROOT / "cactus_theory")
           for m, _ in _imports(p) if m.split(".")[0] == "paper_repro"]
    assert not bad


def test_no_private_names_imported_across_modules():
    bad = []
    for p in SOURCES:
        for mod, names in _imports(p):
            if mod.split(".")[0] in OURS:
                bad += [f"{p.relative_to(ROOT)}: from {mod} import {n}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_os_replace_only_in_the_atomic_helper():
    bad = []
    for p in SOURCES:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr in ("replace", "rename")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"):
                bad.append(str(p.relative_to(ROOT)))
    assert bad == ["cactus_theory/util/atomic.py"], bad


BAD_ARGS = [
    (["decode", "--rule", "bogus"], "--rule"),
    (["decode", "--temperature", "-1"], "--temperature"),
    (["decode", "-k", "0"], "-k/--num-drafts"),
    (["decode", "--top-p", "0"], "--top-p"),
    (["decode", "--delta", "-1", "--prompt", "x"], "--delta"),
    (["decode", "--rule", "tas", "--delta", "0.5", "--prompt", "x"], "--delta is a parameter of --rule cactus"),
    (["decode", "--divergence", "js", "--prompt", "x"], "solver='exact'"),
    (["decode"], "--prompt"),
    (["decode", "--prompt", "x", "--verifier", "./no/such/folder"], "--verifier"),
    (["decode", "--prompt", "x", "--draft", "embedded", "--verifier", "other.gguf"], "--verifier"),
    (["decode", "--prompt", "x", "--prompts-file", "/no/such/file.txt"], "--prompts-file"),
    (["decode", "--prompt", "x", "--tree-branching", "2,0"], "--tree-branching"),
    (["decode", "--prompt", "x", "--tree-branching", "two"], "--tree-branching"),
    (["decode", "--prompt", "x", "--tree-branching", "2,2", "--tree-scheme", "gumbel"], "--tree-scheme"),
    (["decode", "--prompt", "x", "--tree-branching", "2,2", "--tree-mode", "both"], "--tree-mode"),
    (["decode", "--prompt", "x", "--tree-branching", "2,2", "--tree-mode", "joint", "--rule", "tas"], "--tree-mode"),
    (["decode", "--prompt", "x", "--tree-dynamic", "4,4"], "--tree-dynamic"),
    (["decode", "--prompt", "x", "--tree-dynamic", "4,4,2", "--tree-branching", "2"], "give one tree"),
    (["decode", "--prompt", "x", "--tree-dynamic", "40,40,40"], "at most 256"),
    (["decode", "--prompt", "x", "--tree", "0"], "--tree"),
    (["decode", "--prompt", "x", "--tree", "16", "--tree-scheme", "iid"], "re-ranking random candidates"),
    (["decode", "--prompt", "x", "--tree", "16", "--tree-branching", "2"], "give one tree"),
    (["decode", "--prompt", "x", "--tree-depth", "4"], "give --tree NODES too"),
    (["decode", "--prompt", "x", "--tree", "300"], "at most 256 nodes kept"),
    (["decode", "--prompt", "x", "--tree", "16", "--tree-depth", "2", "--tree-topk", "2"], "exceeds the 6 nodes"),
    (["decode", "--prompt", "x", "--tree-scheme", "deterministic"], "apply to tree decoding"),
    (["decode", "--prompt", "x", "--draft-stop-prob", "1.5"], "--draft-stop-prob"),
    (["decode", "--prompt", "x", "--draft-stop-prob", "mean:0.3"], "--draft-stop-prob"),
    (["decode", "--prompt", "x", "--draft-stop-prob", "0.3", "--tree-branching", "2,2"], "--draft-stop-prob applies"),
    (["check-engine", "--engine", "vllm9"], "--engine"),
    (["check-engine", "--n", "0"], "--n"),
    (["check-engine", "--alpha", "1"], "--alpha"),
    (["check-engine", "--max-new-tokens", "4", "--positions", "5"], "positions 0 .. 3 only"),
    (["check-engine", "--rule", "bogus"], "--rule"),
    (["check-engine", "--engine", "transformers", "--rule", "cactus"], "its own rule (SpS)"),
    (["check-engine", "--engine", "transformers", "--temperature", "0"], "--temperature must be > 0"),
    (["check-engine", "--engine", "transformers", "--tree", "8"], "--tree applies to --engine loop"),
    (["check-engine", "--engine", "transformers", "--draft", "smollm2"], "--draft applies to --engine loop and"),
    (["check-engine", "--assistant-layers", "3"], "--engine transformers only"),
    (["check-engine", "--tree-depth", "3"], "give --tree NODES too"),
    (["check-engine", "--tree", "300"], "at most 256 nodes kept"),
    (["check-engine", "--verifier", "./no/such/folder"], "--verifier"),
    (["check-engine", "--prompts-file", "/no/such/file.txt"], "--prompts-file"),
    (["check-engine", "--json", "/proc/x/y.json"], "--json"),
    (["check-engine", "--engine", "vllm"], "needs --spec ngram or --spec eagle3"),
    (["check-engine", "--engine", "vllm", "--spec", "medusa"], "--spec"),
    (["check-engine", "--spec", "ngram"], "--spec applies to --engine vllm"),
    (["check-engine", "--engine", "transformers", "--vllm-plugin", "fixes"], "--vllm-plugin applies to --engine vllm"),
    (["check-engine", "--engine", "vllm", "--spec", "ngram", "--rule", "cactus"], "vLLM's own rejection sampling"),
    (["check-engine", "--engine", "vllm", "--spec", "ngram", "--tree", "8"], "--tree applies to --engine loop"),
    (["check-engine", "--engine", "vllm", "--spec", "ngram", "--assistant-layers", "2"], "--engine transformers only"),
    (["check-engine", "--engine", "vllm", "--spec", "ngram", "--draft", "d.pt"], "--draft applies to --spec eagle3"),
    (["check-engine", "--engine", "vllm", "--spec", "ngram", "--draft-sampling", "greedy"], "applies to --spec eagle3"),
    (["check-engine", "--engine", "vllm", "--spec", "eagle3", "--draft", "/no/such/draft.pt"], "--spec eagle3 takes"),
    (["check-engine", "--engine", "vllm", "--spec", "eagle3", "--verifier", "org/model", "--draft", "d.pt"],
     "exported for the embedded SmolLM2 only"),
    (["check-engine", "--engine", "llamacpp", "--rule", "cactus"], "llama.cpp's own sample-and-match"),
    (["check-engine", "--engine", "llamacpp", "--tree", "8"], "--tree applies to --engine loop"),
    (["check-engine", "--engine", "llamacpp", "--draft", "d.gguf"], "drafts by prompt lookup"),
    (["check-engine", "--engine", "llamacpp", "--verifier", "org/model"], "'smollm2' or a .gguf file"),
    (["check-engine", "--engine", "llamacpp", "--assistant-layers", "2"], "--engine transformers only"),
    (["check-engine", "--engine", "llamacpp", "--spec", "ngram"], "--spec applies to --engine vllm"),
    (["check-engine", "--negative-control"], "--engine loop declares no planted bug"),
    (["check-engine", "--engine", "llamacpp", "--plant-temperature", "1"], "give --negative-control too"),
    (["check-engine", "--engine", "llamacpp", "--negative-control", "--plant-temperature", "0.6"], "equals --temperature"),
    (["check-engine", "--engine", "llamacpp", "--negative-control", "--plant-temperature", "nan"],
     "--plant-temperature must be"),
    (["verify", "--cases", "0"], "--cases"),
    (["bogus"], "unknown command 'bogus'"),
    (["repro"], "python -m paper_repro"),
    (["--bogus"], "--bogus"),
]

PROBE = """
import sys, io, contextlib
from cactus_theory.cli import main
for argv in {cases!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    print(repr((argv, rc, err.getvalue())))
print(repr(sorted(m for m in ("torch", "transformers") if m in sys.modules)))
"""


def test_cli_user_errors_are_one_line_exit_2_before_anything_loads():
    out = subprocess.run([sys.executable, "-c", PROBE.format(cases=[a for a, _ in BAD_ARGS])], capture_output=True,
                         text=True, cwd=ROOT, timeout=120, check=True).stdout.splitlines()
    results, loaded = [ast.literal_eval(line) for line in out[:-1]], ast.literal_eval(out[-1])
    assert len(results) == len(BAD_ARGS)
    for (argv, rc, err), (_, needle) in zip(results, BAD_ARGS, strict=True):
        assert rc == 2, (argv, rc, err)
        assert err.count("\n") == 1 and err.startswith("cactus-theory") and "Traceback" not in err, (argv, err)
        assert needle in err, (argv, err)
    assert loaded == [], f"argument errors imported {loaded}"


def test_cli_help_and_version():
    run = lambda *a: subprocess.run([sys.executable, "-m", "cactus_theory.cli", *a], capture_output=True,  # noqa: E731
                                    text=True, cwd=ROOT, timeout=120)
    top = run("--help")
    assert top.returncode == 0 and top.stdout.split("\n\n")[1].startswith("Check the theory")
    assert all(c in top.stdout for c in ("verify", "build-draft", "decode"))
    from cactus_theory import __version__

    assert run("--version").stdout.strip() == f"cactus-theory {__version__}"
    dec = run("decode", "--help").stdout
    for flag in ("-k NUM_DRAFTS, --num-drafts", "--top-k", "--topk-rule-k", "--tas-alpha", "--interp-alpha"):
        assert flag in dec
    from cactus_theory import registry

    assert "{" + ",".join(registry.RULES) + "}" in dec and "(default 0.6, the paper's)" in dec


@pytest.mark.parametrize("argv", [["--only", "a,z"], ["--per-style", "0"]])
def test_repro_entry_point_errors_are_one_line(argv):
    r = subprocess.run([sys.executable, "-m", "paper_repro", *argv], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and argv[0] in r.stderr, r.stderr


def test_environment_sets_unsets_and_restores_even_on_an_exception(monkeypatch):
    """util.environ.environment (vLLM's engine start, the notebook kernel): inside the block the variables are
    set and removed as asked; afterwards each is back as it was, a variable that was absent absent again."""
    import os

    from cactus_theory.util.environ import environment

    monkeypatch.setenv("CT_ENV_KEPT", "old")
    monkeypatch.setenv("CT_ENV_DROPPED", "there")
    monkeypatch.delenv("CT_ENV_NEW", raising=False)
    with pytest.raises(RuntimeError, match="inside"):
        with environment({"CT_ENV_KEPT": "new", "CT_ENV_NEW": "1"}, unset=("CT_ENV_DROPPED",)):
            assert (os.environ["CT_ENV_KEPT"], os.environ["CT_ENV_NEW"]) == ("new", "1")
            assert "CT_ENV_DROPPED" not in os.environ
            raise RuntimeError("inside")
    assert os.environ["CT_ENV_KEPT"] == "old" and os.environ["CT_ENV_DROPPED"] == "there"
    assert "CT_ENV_NEW" not in os.environ
