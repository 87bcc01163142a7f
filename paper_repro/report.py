"""REPORT.md: the paper's distinct claims, each with its checks, our numbers, the paper's, a verdict.

Rows are ``cactus_theory.claims.ledger.Claim`` from the figure steps and from ``cactus-theory verify``.
Checks sharing a ``key`` are one statement: shown as one row (each check on its own line, labelled
primary or secondary with the reason) and counted once, with the primary check's verdict
(``cactus_theory.claims.ledger.resolve``). Three sections, never mixed: the paper's claims (the headline
counts only these, theory and experiments apart), results we derived (PAPER.md's notes, our per-step
proxies), checks of our own code.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from cactus_theory.claims.ledger import VERDICTS, Claim, combined_verdict, group, plural, resolve

from .common import StepResult, atomic_write_text
from .paper_numbers import SETUP
from .steps import by_module, figure_text

# the paper's claims in reading order (unknown keys follow, in order of appearance)
ORDER = ["thm1", "thm2", "thm3", "thm3-gamma", "prop4", "cor5", "cor6", "worked-example", "main-acceptance",
         "main-scores-cactus", "main-scores-tas-gpqa", "interpolation-ablation", "wall-clock"]
# the paper's statements that are theory (exact checks); the others are its experiments
THEORY = ("thm1", "thm2", "thm3", "thm3-gamma", "prop4", "cor5", "cor6", "worked-example")
NAMES = {"thm1": "Theorem 1", "thm2": "Theorem 2", "thm3": "Theorem 3's second bound, D_f(p || q)",
         "thm3-gamma": "Theorem 3's first bound, Gamma(delta)", "prop4": "Proposition 4", "cor5": "Corollary 5",
         "cor6": "Corollary 6", "worked-example": "the worked example", "main-acceptance": "acceptance (AL, Rej)",
         "main-scores-cactus": "Cactus matches SpS on task score", "main-scores-tas-gpqa": "TAS loses accuracy on GPQA",
         "interpolation-ablation": "interpolation ablation", "wall-clock": "wall clock"}
FIGURE_TEXT = figure_text()  # {figure stem: (title, caption)} of the registered steps (steps.STEPS)
TITLES = {"paper": "Claims of the paper", "derived": "Results we derived (not claims of the paper)",
          "code": "Checks of our own code"}


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _order(key: str) -> int:
    return ORDER.index(key) if key in ORDER else len(ORDER)


def _mark(v: str) -> str:
    return v if v in ("holds",) or v.startswith("consistent") else f"**{v}**"


def claim_label(checks: list[Claim]) -> str:
    """The statement's verdict as printed: the primary check's, with its scope ("consistent: ...",
    "inconclusive (on ...)"), or "inconclusive (checks disagree)"."""
    r = resolve(checks)
    if r.reason:
        return f"{r.verdict} ({r.reason})"
    return r.primary.label


def _tag(c: Claim) -> str:
    """``*source* (primary, 300 problems)``."""
    return f"*{_esc(c.source or '?')}* ({c.role_label}{', ' + _esc(c.units) if c.units else ''})"


def _how(c: Claim) -> str:
    out = c.how
    if c.decision:
        out += f"; rule: {c.decision}"
    if c.family:
        out += f"; family: {c.family}"
    return out


def _cell(checks: list[Claim], field: str) -> str:
    """One line per check, primary first: ``*source* (role, units): value`` (``<br>`` between lines)."""
    cs = sorted(checks, key=lambda c: c.role != "primary")
    get = _how if field == "how" else (lambda c: getattr(c, field))
    if len(cs) == 1 and not cs[0].units:
        return _esc(get(cs[0]))
    own = (lambda c: f" ({_esc(c.label)})") if field == "ours" and len(cs) > 1 else (lambda c: "")
    return "<br>".join(f"{_tag(c)}: {_esc(get(c))}{own(c)}" for c in cs)


def _our_sections(steps: list[StepResult]) -> list[str]:
    """Sections of results that are ours, not the paper's (multi-draft Cactus, DropMatch on the LM), each
    written by its step's ``section(data)`` from its cached numbers (steps registered with ``section=True``)."""
    import importlib

    registered = by_module()
    out = []
    for s in steps:
        spec = registered.get(s.name)
        if spec is not None and spec.section:
            out += [importlib.import_module(f"paper_repro.{spec.module}").section(s.data), ""]
    return out


def claims_tables(claims: list[Claim]) -> dict[str, str]:
    """Markdown table per kind, one row per statement (checks of one ``key`` merged)."""
    groups = group(claims)
    out = {}
    for kind in ("paper", "derived", "code"):
        keys = sorted((k for k, cs in groups.items() if cs[0].kind == kind), key=_order)
        if not keys:
            continue
        head = ("| # | claim | ref | checked by | how we checked | ours | paper | verdict |" if kind == "paper" else
                "| # | statement | ref | checked by | how we checked | ours | verdict |")
        lines = [head, "|---" * (8 if kind == "paper" else 7) + "|"]
        for i, k in enumerate(keys, 1):
            cs = groups[k]
            label = claim_label(cs)
            prim = resolve(cs).primary
            verdict = _mark(_esc(label)) + (f"; {_esc(prim.detail)}" if prim is not None and prim.detail
                                            and combined_verdict(cs) != "holds" else "")
            src = "<br>".join(_tag(c) for c in sorted(cs, key=lambda c: c.role != "primary"))
            row = [str(i), _esc(cs[0].claim), _esc(cs[0].ref), src, _cell(cs, "how"), _cell(cs, "ours")]
            if kind == "paper":
                row.append(_esc(cs[0].paper))
            row.append(verdict)
            lines.append("| " + " | ".join(row) + " |")
        out[kind] = "\n".join(lines)
    return out


def counts(claims: list[Claim], kind: str = "paper") -> dict[str, int]:
    """Statements of ``kind`` per combined verdict (each statement once, however many checks)."""
    groups = [cs for cs in group(claims).values() if cs[0].kind == kind]
    return {v: sum(combined_verdict(cs) == v for cs in groups) for v in VERDICTS}


_PHRASES = {"holds": ("holds", "hold"), "consistent": ("is consistent on another model or task",
                                                      "are consistent on another model or task"),
            "inconclusive": ("is inconclusive", "are inconclusive"), "differs": ("differs", "differ"),
            "out of reach": ("is out of reach (not measurable here)", "are out of reach (not measurable here)")}


def _phrase(c: dict[str, int], skip: tuple = ()) -> str:
    """``"2 hold, 1 is inconclusive"``: the non-zero counts with verbs that agree."""
    return ", ".join(plural(n, *_PHRASES[v]) for v, n in c.items() if n and v not in skip)


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def headline(claims: list[Claim]) -> str:
    """``Theory: x/N hold; experiments: ...`` over the paper's statements (each once, its primary check's
    verdict), then the derived results and the checks of our code; verbs agree with their counts."""
    groups = {k: cs for k, cs in group(claims).items() if cs[0].kind == "paper"}
    th = {k: combined_verdict(cs) for k, cs in groups.items() if k in THEORY}
    ex = {v: sum(combined_verdict(cs) == v for k, cs in groups.items() if k not in THEORY) for v in VERDICTS}
    held = sum(v == "holds" for v in th.values())
    others = [f"{NAMES.get(k, k)}: {v}" for k, v in th.items() if v != "holds"]
    theory = (f"Theory: {held}/{len(th)} {'holds' if len(th) == 1 else 'hold'}"
              + (f" ({'; '.join(others)})" if others else ""))
    n_ex = sum(ex.values())
    parts = [plural(n, *_PHRASES[v]) for v, n in ex.items() if n]
    exp = f"experiments: of {plural(n_ex, 'claim')} of the paper's tables, " + (_and(parts) if parts else "none checked")
    d, k = counts(claims, "derived"), counts(claims, "code")
    nd, nk = sum(d.values()), sum(k.values())
    return (f"**{theory}; {exp}.** Separately: {plural(nd, 'result')} we derived" + (f" ({_phrase(d)})" if nd else "")
            + f" and {plural(nk, 'check')} of our own code" + (f" ({k['holds']} pass" + (
                f", {_phrase(k, skip=('holds',))}" if nk > k["holds"] else "") + ")" if nk else "") + ".")


RULES_TEXT = (
    "How to read a verdict. Each statement has one *primary* check, the most powerful on the setting closest to "
    "the paper's; the statement's verdict is the primary's, re-derivable from its printed interval and its printed "
    "rule. Other checks are *secondary*, labelled: *underpowered* (too few units to decide), *same runs* (another "
    "view or metric of the primary's runs), *other protocol* (another setting, read as its own) or *independent* "
    "(a second check of similar power). A secondary check never vetoes the primary; only an independent one "
    "pointing the other way makes the statement *inconclusive (checks disagree)*. Verdicts: *holds* (exact checks "
    "pass, or a 95% interval lies on the claimed side, on the paper's own setting); *consistent: ...* (the same, "
    "measured on another model, task or scale, named); *inconclusive* (the interval contains the comparison "
    "point); *differs* (an exact check fails, or the interval excludes the claim); *out of reach* (not measurable "
    "here, or fewer than 5 units). Any verdict measured elsewhere names where. Each check names its interval's "
    "units and n (problems, prompts, batches, pairs) and its method: percentile bootstraps over 300 problems or "
    "over pairs; Student-t intervals where the units are few (10 batches, 9 prompts: the wall clock, on the log "
    "of the tokens/s ratio). \"Matches\" is tested as non-inferiority (margin in section h). Tests that share a "
    "family print raw and Holm-adjusted p-values and name the family; a conjunction of parts (\"each of the "
    "three exceeds SpS\") is an intersection-union test, each part at its own level. Distribution tests state "
    "their power on each test's pooled bins; a test with fewer than two pooled bins has no power and is not "
    "counted.")


def write_report(path: Path, steps: list[StepResult], extra: list[Claim], compute: dict,
                 mode: str, skipped: dict[str, str], figures_dir: Path) -> str:
    """Render and atomically write REPORT.md; returns its text. ``compute``: ``results/timings.json``'s
    content (each result's recorded compute time)."""
    claims = [c for s in steps for c in s.claims] + list(extra)
    tables = claims_tables(claims)
    rel = os.path.relpath(figures_dir, Path(path).parent)
    out = [
        "# Reproduction report: Cactus (Hao & Mou, ICLR 2026)",
        "",
        f"Generated by `python -m paper_repro` ({mode}) on {platform.machine()} / {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}. Regenerate rather than edit; the numbers come from the JSON files in "
        "`paper_repro/results/`.",
        "",
        headline(claims),
        "",
        RULES_TEXT,
        "",
    ]
    for kind in ("paper", "derived", "code"):
        if kind in tables:
            out += [f"## {TITLES[kind]}", "", tables[kind], ""]
        if kind == "derived":
            out += _our_sections(steps)
    out += ["## Figures", ""]
    for s in steps:
        for f in s.figures:
            captions = figure_text()
            if f.suffix == ".png" and f.stem in captions:
                title, text = captions[f.stem]
                out += [f"### {title}", "", text, "", f"![{title}]({rel}/{f.name}) ([vector]({rel}/{f.stem}.svg))", ""]
    for s in steps:
        if "markdown" in s.data:
            out += ["## f. Main-table analogue", "", s.data["markdown"], ""]
        for title, text in s.data.get("sections", []):
            out += [f"## {title}", "", text, ""]
    if skipped:
        out += ["## Not run in this invocation", ""]
        out += [f"- {k}: {v}" for k, v in skipped.items()]
        out.append("")
    out += ["## Compute time", "", f"Recorded when each result was computed ({compute['mode']}, "
            f"{compute['cpu_count']} CPU cores; `results/timings.json`):", "", "| result | seconds |", "|---|---|"]
    out += [f"| {k} | {v:.1f} |" for k, v in compute["compute_seconds"].items()]
    out += [f"| total | {compute['total_compute_seconds']:.1f} |"]
    out += ["", "## Full-scale configuration (not run here)", "",
            "The decoding steps take any (draft, verifier) pair sharing a tokenizer, e.g. on a GPU:",
            "",
            "```bash",
            "python -m paper_repro --only e,f,c --verifier Qwen/Qwen3-14B --draft Qwen/Qwen3-0.6B \\",
            "    --device cuda --per-style 8 --max-new-tokens 512 --results runs/qwen3 --figures runs/qwen3/figures \\",
            "    --report runs/qwen3/REPORT.md",
            "```",
            "",
            f"The paper's setting: {SETUP}.", ""]
    text = "\n".join(out)
    atomic_write_text(path, text)
    return text


def write_claims(path: Path, claims: list[Claim]) -> None:
    """``results/claims.json``: every check's row, the source of README's findings; rewritten only on change."""
    import dataclasses
    import json

    obj = {"claims": [dataclasses.asdict(c) for c in claims]}
    try:
        if json.loads(Path(path).read_text()) == obj:
            return
    except (OSError, ValueError):
        pass
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")
