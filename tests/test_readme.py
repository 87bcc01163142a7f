"""README.md and every docs/*.md page run as written: each file's ```python blocks, top to bottom, in one
namespace per file (later blocks may use what earlier ones of the same file defined, as a reader would; no
file depends on another's). A block opened as ```python no-run is shown but not run (docs/vllm.md's
reproducers of vLLM's CPU bugs need vLLM). Works for any block or page added later: nothing here names a
block. Also: every relative link in these files points at a file of the repository, and README's results
table quotes its source file cell for cell."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number, source)`` of each runnable ```python block of ``text``, in order."""
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text)
            if "no-run" not in m.group(1)]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_block_finder():
    text = "x\n```python\na = 1\n```\n```bash\nls\n```\n```python no-run\nboom()\n```\n```python\nb = a\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n"), (12, "b = a\n")]


def test_the_pages_keep_their_runnable_blocks():
    """README's quick start, and the examples moved from it to docs/ (rules, statistical tests, production
    rules, DropMatch, several drafts, transformers, verify_flat): none silently turned into no-run or dropped."""
    counts = {_name(p): len(python_blocks(p.read_text(encoding="utf-8"))) for p in PAGES}
    assert counts["README.md"] >= 1, counts
    assert sum(counts.values()) >= 8, counts
    for page in ["rules", "statistical-tests", "production-rules", "dropmatch", "multi-draft"]:
        assert counts[f"docs/{page}.md"] >= 1, counts
    assert counts["docs/integrations.md"] >= 2, counts


RUNNABLE = [p for p in PAGES if python_blocks(p.read_text(encoding="utf-8"))]  # pages without one: nothing to run


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_python_blocks_run_top_to_bottom(page, monkeypatch, tmp_path):
    blocks = python_blocks(page.read_text(encoding="utf-8"))
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    ns: dict = {"__name__": "__readme__"}
    for line, src in blocks:
        code = compile("\n" * (line - 1) + src, str(page), "exec")  # tracebacks point into the page
        try:
            exec(code, ns)
        except Exception as e:  # noqa: BLE001 - report which block failed, then fail
            pytest.fail(f"{_name(page)} block at line {line} raised {type(e).__name__}: {e}")


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_point_at_files(page):
    text = page.read_text(encoding="utf-8")
    missing = []
    for m in LINK.finditer(text):
        target = m.group(1).split("#", 1)[0]
        if not target or re.match(r"^[a-z]+:", target):  # an anchor in the page, or a URL
            continue
        if not (page.parent / target).exists():
            missing.append(m.group(1))
    assert not missing, f"{_name(page)} links to missing files: {missing}"


def _table(text: str, header: str) -> list[dict[str, str]]:
    """The markdown table of ``text`` whose header row starts with ``header``, as one dict per row."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    cols = [c.strip() for c in lines[start].strip().strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(cols, [c.strip() for c in line.strip().strip("|").split("|")], strict=True)))
    return rows


def test_readme_results_table_quotes_its_source_file():
    """Each cell of README's "Results at a glance" table is the cell of the same row (method) and column in the
    committed file the README names beside it, so the table can never drift from the results."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Results at a glance", 1)[1].split("\n## ", 1)[0]
    source = "paper_repro/results/eval/eval.md"
    assert f"]({source})" in section.split("| method |", 1)[0], "the table must name its source file"
    ours = _table(section, "| method |")
    theirs = {r["method"]: r for r in _table((ROOT / source).read_text(encoding="utf-8"), "| method |")}
    assert ours
    for row in ours:
        assert row["method"] in theirs, row["method"]
        for col, cell in row.items():
            assert col in theirs[row["method"]], col
            assert cell == theirs[row["method"]][col], (row["method"], col, cell, theirs[row["method"]][col])


def test_the_rule_tables_cover_the_registry():
    """docs/rules.md's and docs/production-rules.md's rule tables have a row for each registered rule, and name
    no rule the registry lacks."""
    import cactus_theory as ct

    text = "".join((ROOT / "docs" / f).read_text(encoding="utf-8") for f in ("rules.md", "production-rules.md"))
    rows = set(re.findall(r"^\| `(\w+)\(", text, re.M))
    names = {cls.__name__ for cls in ct.RULE_CLASSES.values()}
    assert rows == names, (sorted(rows - names), sorted(names - rows))


def test_readme_chain_and_tree_table_quotes_the_bench_run():
    """README's chain / tree table: each cell re-derived from the committed bench run it names."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Decoding speed: chain and tree side by side", 1)[1].split("\n### ", 1)[0]
    source = "benchmarks/results/lm/trees_bf16.json"
    assert f"]({source})" in section
    res = json.loads((ROOT / source).read_text(encoding="utf-8"))
    label = {"chain k = 4": 4, "EAGLE-2 tree, 8 nodes": "eagle2 8,4,2", "EAGLE-2 tree, 16 nodes": "eagle2 16,5,4",
             "EAGLE-2 tree, 24 nodes": "eagle2 24,6,4"}

    def row(k, rule):
        return next(r for r in res["rows"] if r["k"] == k and r["rule"] == rule and r["batch_size"] == 1)

    def al(r):
        return f"{r['al']:.2f} [{r['al_ci'][0]:.2f}, {r['al_ci'][1]:.2f}]"

    def sp(r):
        return f"{r['speedup']:.2f}x [{r['speedup_ci'][0]:.2f}, {r['speedup_ci'][1]:.2f}]"

    rows = _table(section, "| draft |")
    assert [r["draft"] for r in rows] == list(label)
    for r in rows:
        sps, cac = row(label[r["draft"]], "SpS"), row(label[r["draft"]], "Cactus delta=1")
        assert r["SpS AL"] == al(sps) and r["SpS speedup"] == sp(sps)
        assert r["Cactus delta=1 AL"] == al(cac) and r["Cactus delta=1 speedup"] == sp(cac)
        assert r["verifier forward / one token"] == f"{sps['verifier_vs_one']:.2f}x"
