"""The engine verdicts that docs/statistical-tests.md and README.md quote, built from the committed ``cactus-theory
check-engine --json`` files in benchmarks/results/check_engine/ (and ``benchmarks/engine_controls.py``'s, the same
format plus ``control``) and the records of runs that wrote none (``*.txt``: the command and the engine's error).

    python benchmarks/check_engine_table.py             # the matched-control table, the wording, the per-position table
    python benchmarks/check_engine_table.py --write     # ... into docs/statistical-tests.md's blocks

``matched_table()``: one block of rows per setting (engine, speculation, sampling, n, prompts, batch sizes, new
tokens, positions, seed, alpha, min_count: a row's setting is read from its file, never from its name), one row per
role: the engine as shipped, with the fix, and the negative control (a planted bug of a stated size through the same
check at the same n); a role with no committed run at that setting says so. ``wording(res)``: the sentence a
non-rejection gets ("no difference detected; a next-token TV >= x at every tested prefix of position f ... would be
detected with probability 0.9 (...)"), ``x`` the detectable TV at ``f``, the first position speculation can change
(``FIRST_SPECULATIVE``). ``table()``: every file's detectable TV per position. ``summary()``: the paragraph the docs
and README.md print (``paper_repro.findings`` renders README's from it).

tests/integrations/test_engines.py checks that the page's blocks are this script's output.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "check_engine"
LINK = "../benchmarks/results/check_engine"
HEADER = ("| engine | setting | n decodes per prompt x prompts | positions tested | verdict | smallest Holm p "
          "| detectable TV per position (power 0.9) |")
ORDER = ["vllm_ngram_shipped_paper", "vllm_ngram_planted_paper", "vllm_ngram_shipped_temperature",
         "vllm_ngram_fixes_temperature", "vllm_ngram_planted_temperature", "vllm_ngram_fixes_paper",
         "vllm_eagle3_shipped_temperature", "vllm_eagle3_fixes_temperature", "vllm_eagle3_planted_temperature",
         "vllm_eagle3_shipped_paper", "vllm_eagle3_fixes_paper", "vllm_eagle3_planted_paper", "transformers_shipped_paper",
         "transformers_planted_paper", "transformers_assisted_paper", "llamacpp_lookup_paper"]
# The first position speculation can change, per engine: vLLM samples a request's first token in its prefill step,
# which has no drafts, and our loop draws it from the verifier's prompt pass; transformers' assisted generation
# verifies the assistant's first drafts in its first forward, so its position 0 is already speculative.
FIRST_SPECULATIVE = {"vllm": 1, "loop": 1, "transformers": 0, "llamacpp": 0}  # llama.cpp: lookup drafts from the prompt at once
ROLE_NAMES = {"shipped": "as shipped", "fixes": "with the fix", "planted": "negative control"}
ROLE_ORDER = ("shipped", "fixes", "planted")
MISSING = {"shipped": "the run as shipped", "fixes": "the run with the fix", "planted": "the negative control"}


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


def _speculation(res: dict) -> str:
    c = res["config"]
    if res["engine"] == "vllm":
        return ("n-gram lookup" if c["spec"] == "ngram" else
                f"EAGLE-3 (the project's draft, {c['draft_sampling'] or 'greedy'} drafts)") + f", k = {c['num_drafts']}"
    if res["engine"] == "transformers":
        return f"assistant: the verifier's first {c['assistant_layers'] or 4} layers, k = {c['num_drafts']}"
    if res["engine"] == "llamacpp":
        return f"prompt lookup, k = {c['num_drafts']}, GGUF {c.get('dtype') or 'as shipped'}"
    return f"rule {c['rule']}, k = {c['num_drafts']}"


def _setting(res: dict, as_role: str | None = None) -> str:
    """The row's setting in words (``as_role``: as if the run were that role; a ``.txt`` record names its setting
    this way)."""
    c = res["config"]
    r = as_role or role(res)
    what = _speculation(res)
    if res["engine"] == "vllm":
        what += ", " + ("as shipped" if r == "shipped" else "with the plugin's CPU fixes")
    if r == "planted":
        what += f", planted: target at T / {res['control']['planted']['c']:g}"
    return f"{what}; {_sampling(c)}; {c['max_new_tokens']} new tokens, {'raw' if c['no_chat'] else 'chat'} prompts"


def role(res: dict) -> str:
    """"shipped", "fixes" or "planted": ``control.role`` where the file has one, else read from the configuration
    (vLLM: the plugin loaded or not; transformers: as shipped)."""
    if res.get("control"):
        return res["control"]["role"]
    return "fixes" if (res["config"].get("vllm_plugin") or "none") == "fixes" else "shipped"


def batch_sizes(res: dict) -> tuple:
    """Each side's decodes run together: recorded since issue 41; before, transformers' assisted side ran one
    sequence at a time and its plain side ``--batch-size``, and the other engines ``--batch-size`` on both."""
    if res.get("batch_sizes"):
        return tuple(res["batch_sizes"])
    bs = res["config"]["batch_size"]
    return (1, bs) if res["engine"] == "transformers" else (bs, bs)


def setting_key(res: dict) -> tuple:
    """Everything a matched control must share (not the role)."""
    c = res["config"]
    return (res["engine"], c.get("spec"), c.get("draft_sampling"), c.get("assistant_layers"), c["num_drafts"],
            c["temperature"], c["top_k"], c["top_p"], c["max_new_tokens"], c["no_chat"], tuple(c["prompts"]),
            res["n"], batch_sizes(res), c["positions"], c["seed"], c["alpha"], c["min_count"], c.get("dtype"),
            c.get("verifier"))


def first_test(res: dict) -> dict | None:
    """The pooled test at the first position speculation can change (None: not tested)."""
    f = FIRST_SPECULATIVE.get(res["engine"], 0)
    return next((t for t in res["tests"] if t["name"] == f"position {f}"), None)


def _positions(res: dict) -> tuple[int, int]:
    tested = {t["position"] for t in res["tests"] if t["position"] is not None}
    return len(tested), res["config"]["positions"]


def wording(res: dict) -> str:
    """The verdict in words (``check_generation.verdict_words`` at the engine's first speculative position): a
    rejection "differs (...)"; a non-rejection "no difference detected; a next-token TV >= x at every tested prefix
    of position f ... would be detected with probability 0.9 (...)"."""
    from cactus_theory.theory.check_generation import verdict_words

    return verdict_words(res, FIRST_SPECULATIVE.get(res["engine"], 0))


def _planted_size(res: dict) -> str:
    pt = res.get("planted_tv")
    if not pt or not pt["prefixes"]:
        return "-"
    tvs = [p["tv"] for p in pt["prefixes"]]
    bound = "" if pt["exact"] else "at most "
    return (f"{bound}{min(tvs):.3f}-{max(tvs):.3f} (median {statistics.median(tvs):.3f}) at its "
            f"{len(tvs)} tested prefixes of position {pt['position']}")


def _verdict_cell(res: dict) -> str:
    if role(res) == "planted":
        return "**caught**" if res["reject"] else "**missed**"
    out = "**differs**" if res["reject"] else "no difference detected"
    nc = res.get("negative_control")  # a check-engine run with its own planted control (--negative-control)
    if nc:
        size = nc["size"]
        tv = f", TV there mean {size['mean_tv']:.3f}" if size["acting"] else ""
        out += (f"; negative control (planted: draws after an accepted draft at T {nc['plant_temperature']:g}, acting"
                f" at {size['acting']} of {size['prefixes']} compared prefixes{tv}): "
                f"{'caught' if nc['caught'] else '**missed**'}")
    return out


def load(path: Path) -> dict:
    """A committed result: the JSON, or for a ``.txt`` record ``{"dead": ...}`` with the fields it states."""
    if path.suffix == ".txt":
        lines = path.read_text(encoding="utf-8").splitlines()
        error = next((ln.strip() for ln in lines if ln.strip().startswith("RuntimeError")), "see the record")
        field = {k: v for k, _, v in (ln.lstrip("# ").partition(": ") for ln in lines if ln.startswith("# "))}
        return {"dead": error, "engine_name": field["engine"], "setting": field["setting"], "path": path}
    return json.loads(path.read_text(encoding="utf-8")) | {"path": path}


def files() -> list[Path]:
    found = {p.stem: p for p in sorted(RESULTS.glob("*.json")) + sorted(RESULTS.glob("*.txt"))}
    return [found[k] for k in ORDER if k in found] + [p for k, p in sorted(found.items()) if k not in ORDER]


def _link(path: Path) -> str:
    return f"[{path.name}]({LINK}/{path.name})"


def row(path: Path) -> str:
    """One row of the per-position table from a ``--json`` file (or a ``.txt`` record of a run that died)."""
    res = load(path)
    if "dead" in res:
        return f"| {res['engine_name']} | {res['setting']} | - | - | the engine dies: `{res['dead']}` ({_link(path)}) | - | - |"
    tests = [t for t in res["tests"] if t["position"] is not None and not t["name"].endswith("exact")]
    holm = min(t["holm"] for t in res["tests"])
    tvs = ", ".join(f"{t['position']}: {t['detectable']:.3f}" for t in tests)
    tested, asked = _positions(res)
    return (f"| {_engine(res)} | {_setting(res)} | {res['n']} x {res['prompts']} | {tested} of {asked} | "
            f"{_verdict_cell(res)} ({_link(path)}) | {holm:.2g} | {tvs} |")


def table() -> str:
    sep = "|" + "---|" * HEADER.count(" |")
    return "\n".join([HEADER, sep] + [row(p) for p in files()])


MATCHED_HEADER = ("| setting | row | n x prompts | batch (spec / plain) | verdict | smallest Holm p "
                  "| detectable TV at the first speculative position | planted next-token TV | file |")


def groups() -> list[tuple[tuple, dict]]:
    """(setting key, {role: result}) in ``ORDER``; a role run twice at one setting is an error."""
    out: dict = {}
    for p in files():
        res = load(p)
        if "dead" in res:
            continue
        key = setting_key(res)
        slot = out.setdefault(key, {})
        r = role(res)
        if r in slot:
            raise ValueError(f"two {r} runs at one setting: {slot[r]['path'].name} and {p.name}")
        slot[r] = res
    return list(out.items())


def _dead() -> dict[str, dict]:
    """The ``.txt`` records of runs that died, by the setting they name (``_setting``'s words)."""
    return {d["setting"]: d for d in (load(p) for p in files() if p.suffix == ".txt")}


def matched_table() -> str:
    lines = [MATCHED_HEADER, "|" + "---|" * MATCHED_HEADER.count(" |")]
    dead = _dead()
    for _key, slot in groups():
        any_res = next(iter(slot.values()))
        c = any_res["config"]
        name = (f"{_engine(any_res)}: {_speculation(any_res)}; {_sampling(c)}; {c['max_new_tokens']} new tokens")
        roles = [r for r in ROLE_ORDER if r in slot or (any_res["engine"] == "vllm" or r != "fixes")]
        for i, r in enumerate(roles):
            head = name if i == 0 else ""
            if r not in slot:
                d = dead.get(_setting(any_res, r)) if r != "planted" else None
                what = (f"the engine dies: `{d['dead']}`" if d else "no committed run at this setting")
                lines.append(f"| {head} | {ROLE_NAMES[r]} | - | - | {what} | - | - | - | {_link(d['path']) if d else '-'} |")
                continue
            res = slot[r]
            bs = batch_sizes(res)
            t = first_test(res)
            f = FIRST_SPECULATIVE.get(res["engine"], 0)
            det = f"{t['detectable']:.3f} (position {f})" if t else f"position {f} not tested"
            flags = []
            if bs[0] != bs[1]:
                flags.append("unmatched batch sizes")
            if any("one next-token bin" in s for s in res.get("not_tested", [])):
                flags.append("one-bin strata skipped: run before their exact test")
            flag = f" ({'; '.join(flags)})" if flags else ""
            lines.append(f"| {head} | {ROLE_NAMES[r]} | {res['n']} x {res['prompts']} | {bs[0]} / {bs[1]}{flag} | "
                         f"{_verdict_cell(res)} | {min(x['holm'] for x in res['tests']):.2g} | {det} | "
                         f"{_planted_size(res) if r == 'planted' else '-'} | {_link(res['path'])} |")
    return "\n".join(lines)


def summary() -> str:
    """One sentence per committed run, in the table's order: its setting and role, then ``wording``."""
    out = []
    dead = _dead()
    for _key, slot in groups():
        any_res = next(iter(slot.values()))
        for r in ROLE_ORDER:
            if r not in slot:
                continue
            res = slot[r]
            c = res["config"]
            head = f"{_engine(res)}, {_speculation(res)}, {_sampling(c)}, {ROLE_NAMES[r]}"
            bs = batch_sizes(res)
            if bs[0] != bs[1]:
                head += f" (batch {bs[0]} against {bs[1]}: not a matched comparison)"
            if r == "planted":
                head += (f" (the rejection step at temperature T / {res['control']['planted']['c']:g}; planted "
                         f"next-token TV {_planted_size(res)})")
                out.append(f"{head}: {'caught' if res['reject'] else 'missed'}; {wording(res)}.")
            else:
                out.append(f"{head}: {wording(res)}.")
        missing = [MISSING[r] for r in ROLE_ORDER if r not in slot and (r != "fixes" or any_res["engine"] == "vllm")
                   and not (r != "planted" and _setting(any_res, r) in dead)]
        if missing:
            out[-1] = out[-1][:-1] + f"; not yet committed at this setting: {', '.join(missing)}."
    for p in files():
        if p.suffix == ".txt":
            d = load(p)
            out.append(f"{d['engine_name']}, {d['setting']}: the engine dies (`{d['dead']}`).")
    return " ".join(out)


DOC = ROOT / "docs" / "statistical-tests.md"
BLOCKS = {"check_engine_matched": matched_table, "check_engine_summary": summary, "check_engine_table": table}


def render(text: str) -> str:
    """``text`` (docs/statistical-tests.md) with each ``<!-- name -->`` ... ``<!-- /name -->`` block of ``BLOCKS``
    replaced by its generator's output."""
    for name, make in BLOCKS.items():
        head, tail = f"<!-- {name} -->", f"<!-- /{name} -->"
        if text.count(head) != 1 or text.count(tail) != 1:
            raise ValueError(f"the page needs one {head} ... {tail} block")
        before, rest = text.split(head, 1)
        _, after = rest.split(tail, 1)
        text = f"{before}{head}\n{make()}\n{tail}{after}"
    return text


def blocks(text: str) -> dict[str, str]:
    """The blocks as they stand in ``text``."""
    return {name: text.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->", 1)[0] for name in BLOCKS}


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        DOC.write_text(render(DOC.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"wrote {DOC.relative_to(ROOT)}'s blocks")
    else:
        sys.stdout.write(matched_table() + "\n\n" + summary() + "\n\n" + table() + "\n")
