"""Build the executed notebooks from their sources: ``NN_name.py`` (jupytext percent scripts, the
files to edit and review) -> ``NN_name.ipynb`` (executed, with outputs and figures, for reading on
GitHub), paired as ``ipynb,py:percent`` so ``jupytext --sync`` also works.

    .venv/bin/python notebooks/build.py            # execute and write all of them (make notebooks)
    .venv/bin/python notebooks/build.py 04         # only notebook 04 (make notebooks NB=04)
    .venv/bin/python notebooks/build.py --check    # committed .ipynb match their sources and are executed

Rebuilding is byte-stable: fixed seeds, one torch thread, no timing metadata, stable cell ids, no
stderr (progress bars, warnings), and notebooks that print no timings; an unchanged source
rebuilds to the identical file.
``CACTUS_FAST=1`` (``--fast``) shrinks every size, as the tests run them; fast builds are for
checking only and are never written over the committed notebooks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

from cactus_theory.util.environ import environment

HERE = Path(__file__).resolve().parent
SOURCES = sorted(HERE.glob("[0-9][0-9]_*.py"))
TIMEOUT_S = 1800  # per cell: notebook 04 may build the embedded draft on first use
VOLATILE = ("execution", "collapsed", "scrolled")  # cell metadata a run may add


def notebook_from_source(src: Path) -> nbformat.NotebookNode:
    """The unexecuted notebook of one percent script, with stable cell ids and pairing metadata."""
    nb = jupytext.read(src)
    for i, cell in enumerate(nb.cells):
        cell.id = f"{src.name[:2]}-{i:02d}"
        cell.metadata = {}
    nb.metadata = {"jupytext": {"formats": "ipynb,py:percent"},
                   "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    return nb


def execute(nb: nbformat.NotebookNode, fast: bool = False) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel (working directory: this folder), top to bottom; raises
    ``nbclient.exceptions.CellExecutionError`` on the first failing cell."""
    env = {"CACTUS_FAST": "1" if fast else "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONHASHSEED": "0", "TQDM_DISABLE": "1"}
    if fast:
        env["MPLBACKEND"] = "Agg"  # the tests need no figures
    with environment(env):  # the kernel inherits this process's environment
        NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def scrub(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what changes from run to run without changing the content: per-cell run metadata, the
    kernel's version details and stderr (progress bars, library warnings); results are printed to
    stdout or drawn. Consecutive stdout chunks are merged into one output: how the kernel splits a
    stream depends on timing (a loaded machine splits one print into two), not on the content."""
    for cell in nb.cells:
        for k in VOLATILE:
            cell.metadata.pop(k, None)
        if cell.cell_type == "code":
            merged = []
            for o in cell.outputs:
                if o.output_type == "stream" and o.name == "stderr":
                    continue
                if o.output_type == "stream" and merged and merged[-1].output_type == "stream" \
                        and merged[-1].name == o.name:
                    merged[-1].text += o.text
                else:
                    merged.append(o)
            cell.outputs = merged
    nb.metadata.pop("language_info", None)
    nb.metadata.pop("widgets", None)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def build(names: list[str] | None = None, out: Path = HERE, fast: bool = False) -> list[Path]:
    """Execute the selected notebooks (all when ``names`` is empty; ``"04"`` or a file name selects)
    and write them to ``out`` atomically. Returns the written paths."""
    from cactus_theory.util.atomic import atomic_write_text

    if fast and Path(out).resolve() == HERE:
        raise ValueError("fast builds are for checking: give another out folder than notebooks/")
    paths = []
    for src in select(names):
        print(f"executing {src.name} ...", file=sys.stderr, flush=True)
        nb = scrub(execute(notebook_from_source(src), fast=fast))
        path = Path(out) / f"{src.stem}.ipynb"
        atomic_write_text(path, render(nb))
        paths.append(path)
    return paths


def select(names: list[str] | None) -> list[Path]:
    if not names:
        return SOURCES
    chosen = [s for s in SOURCES if any(s.stem == n or s.name == n or s.stem[:2] == n or s.stem + ".ipynb" == n
                                        for n in names)]
    unknown = [n for n in names if not any(n in (s.stem, s.name, s.stem[:2], s.stem + ".ipynb") for s in SOURCES)]
    if unknown:
        raise ValueError(f"unknown notebook(s) {unknown}; choose among {[s.stem for s in SOURCES]}")
    return chosen


def check(names: list[str] | None = None) -> list[str]:
    """Problems with the committed notebooks (empty when all is well): each ``.ipynb`` exists, has
    exactly its source's cells and every code cell executed without an error."""
    problems = []
    for src in select(names):
        path = HERE / f"{src.stem}.ipynb"
        if not path.exists():
            problems.append(f"{path.name}: missing (run notebooks/build.py {src.stem[:2]})")
            continue
        committed = nbformat.read(path, as_version=4)
        fresh = notebook_from_source(src)
        if [(c.cell_type, c.source) for c in committed.cells] != [(c.cell_type, c.source) for c in fresh.cells]:
            problems.append(f"{path.name}: cells differ from {src.name} (rebuild: notebooks/build.py {src.stem[:2]})")
            continue
        code = [c for c in committed.cells if c.cell_type == "code"]
        if not all(c.get("execution_count") for c in code):
            problems.append(f"{path.name}: not executed")
        if any(o.get("output_type") == "error" for c in code for o in c.outputs):
            problems.append(f"{path.name}: a cell failed")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Execute the notebooks from their percent-script sources.")
    ap.add_argument("names", nargs="*", help="notebooks to build: 01, 04, 04_decoding_with_real_lms... (default: all)")
    ap.add_argument("--check", action="store_true", help="only check the committed notebooks against their sources")
    ap.add_argument("--fast", action="store_true", help="CACTUS_FAST=1 sizes (needs --out)")
    ap.add_argument("--out", type=Path, default=HERE, help="output folder (default: notebooks/)")
    args = ap.parse_args(argv)
    try:
        if args.check:
            problems = check(args.names)
            for p in problems:
                print(p, file=sys.stderr)
            return 1 if problems else 0
        for p in build(args.names, args.out, args.fast):
            print("wrote", p)
    except ValueError as e:
        ap.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
