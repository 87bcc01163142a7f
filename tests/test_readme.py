"""README.md runs as written: every ```python block, top to bottom, in one namespace (later blocks
may use what earlier ones defined, as a reader would). A block opened as ```python no-run is
shown but not run (none today). Works for any block added later: nothing here names a block."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(first line number, source)`` of each runnable ```python block of ``text``, in order."""
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text)
            if "no-run" not in m.group(1)]


def test_block_finder():
    text = "x\n```python\na = 1\n```\n```bash\nls\n```\n```python no-run\nboom()\n```\n```python\nb = a\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n"), (12, "b = a\n")]


def test_readme_python_blocks_run_top_to_bottom(monkeypatch, tmp_path):
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    ns: dict = {"__name__": "__readme__"}
    for line, src in blocks:
        code = compile("\n" * (line - 1) + src, str(README), "exec")  # tracebacks point into README.md
        try:
            exec(code, ns)
        except Exception as e:  # noqa: BLE001 - report which block failed, then fail
            pytest.fail(f"README.md block at line {line} raised {type(e).__name__}: {e}")
