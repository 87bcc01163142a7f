"""The table of engine verdicts docs/statistical-tests.md quotes, built from the committed ``cactus-theory
check-engine --json`` files in benchmarks/results/check_engine/ (one row per file, in ``ORDER``) and the
records of runs that wrote none (``*.txt``: the command and the engine's error).

    python benchmarks/check_engine_table.py        # prints the markdown table

tests/integrations/test_engines.py checks that the page's table is this script's output.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "check_engine"
HEADER = ("| engine | setting | n decodes per prompt x prompts | positions tested | verdict | smallest Holm p "
          "| detectable TV per position (power 0.9) |")
ORDER = ["vllm_ngram_shipped_paper", "vllm_ngram_shipped_temperature", "vllm_ngram_fixes_temperature",
         "vllm_ngram_fixes_paper", "vllm_eagle3_fixes_paper", "vllm_eagle3_shipped_temperature",
         "transformers_assisted_paper", "llamacpp_lookup_paper"]


def _engine(res: dict) -> str:
    notes = " ".join(res.get("notes", []))
    if res["engine"] == "vllm":
        m = re.search(r"vLLM (\S+),", notes)
        return f"vLLM {m.group(1) if m else '?'} (CPU)"
    if res["engine"] == "transformers":
        m = re.search(r"transformers (\S+),", notes)
        return f"transformers {m.group(1) if m else '?'}"
    if res["engine"] == "llamacpp":
        m = re.search(r"llama-cpp-python (\S+),", notes)
        return f"llama.cpp (llama-cpp-python {m.group(1) if m else '?'}, CPU)"
    return res["engine"]


def _sampling(c: dict) -> str:
    if c["temperature"] == 0:
        return "greedy"
    parts = [f"T {c['temperature']:g}"]
    parts += [f"top-k {c['top_k']}"] if c["top_k"] else []
    parts += [f"top-p {c['top_p']:g}"] if c["top_p"] < 1 else []
    return ", ".join(parts) + ("" if len(parts) > 1 else " (no top-k / top-p)")


def _setting(res: dict) -> str:
    c = res["config"]
    if res["engine"] == "vllm":
        spec = "n-gram lookup" if c["spec"] == "ngram" else f"EAGLE-3 (the project's draft, {c['draft_sampling'] or 'greedy'} drafts)"
        plugin = "as shipped" if (c["vllm_plugin"] or "none") == "none" else "with the plugin's CPU fixes"
        what = f"{spec}, k = {c['num_drafts']}, {plugin}"
    elif res["engine"] == "transformers":
        what = f"assistant: the verifier's first {c['assistant_layers'] or 4} layers, k = {c['num_drafts']}"
    elif res["engine"] == "llamacpp":
        what = f"prompt lookup, k = {c['num_drafts']}, GGUF {c.get('dtype') or 'as shipped'}"
    else:
        what = f"rule {c['rule']}, k = {c['num_drafts']}"
    return f"{what}; {_sampling(c)}; {c['max_new_tokens']} new tokens, {'raw' if c['no_chat'] else 'chat'} prompts"


def row(path: Path) -> str:
    """One table row from a ``--json`` file (or a ``.txt`` record of a run the engine did not finish)."""
    link = f"[{path.name}](../benchmarks/results/check_engine/{path.name})"
    if path.suffix == ".txt":
        lines = path.read_text(encoding="utf-8").splitlines()
        error = next((ln.strip() for ln in lines if ln.strip().startswith("RuntimeError")), "see the record")
        field = {k: v for k, _, v in (ln.lstrip("# ").partition(": ") for ln in lines if ln.startswith("# "))}
        return f"| {field['engine']} | {field['setting']} | - | - | the engine dies: `{error}` ({link}) | - | - |"
    res = json.loads(path.read_text(encoding="utf-8"))
    tests = [t for t in res["tests"] if t["name"].startswith("position")]
    verdict = "**differs**" if res["reject"] else "holds (no difference found)"
    nc = res.get("negative_control")
    if nc:
        size = nc["size"]
        tv = f", TV there mean {size['mean_tv']:.3f}" if size["acting"] else ""
        verdict += (f"; negative control (planted: draws after an accepted draft at T {nc['plant_temperature']:g}, acting"
                    f" at {size['acting']} of {size['prefixes']} compared prefixes{tv}):"
                    f" {'caught' if nc['caught'] else '**missed**'}")
    holm = min(t["holm"] for t in res["tests"])
    tvs = ", ".join(f"{t['position']}: {t['detectable']:.3f}" for t in tests)
    positions = f"{len(tests)} of {res['config']['positions']}"
    return (f"| {_engine(res)} | {_setting(res)} | {res['n']} x {res['prompts']} | {positions} | {verdict} ({link}) "
            f"| {holm:.2g} | {tvs} |")


def files() -> list[Path]:
    found = {p.stem: p for p in sorted(RESULTS.glob("*.json")) + sorted(RESULTS.glob("*.txt"))}
    return [found[k] for k in ORDER if k in found] + [p for k, p in sorted(found.items()) if k not in ORDER]


def table() -> str:
    sep = "|" + "---|" * HEADER.count(" |")
    return "\n".join([HEADER, sep] + [row(p) for p in files()])


if __name__ == "__main__":
    sys.stdout.write(table() + "\n")
