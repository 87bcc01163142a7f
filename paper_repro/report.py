"""REPORT.md: the paper's distinct claims, each with its checks, our numbers, the paper's, a verdict.

Rows are ``cactus_theory.claims.Claim`` from the figure steps and from ``cactus-theory verify``.
Checks sharing a ``key`` are one statement: shown as one row (each check on its own line) and
counted once. Three sections, never mixed: the paper's claims (the headline counts only these),
results we derived (PAPER.md's notes, our per-step proxies), checks of our own code.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from cactus_theory.claims import VERDICTS, Claim, combined_verdict, group

from .common import StepResult, atomic_write_text
from .paper_numbers import SETUP

# the paper's claims in reading order (unknown keys follow, in order of appearance)
ORDER = ["thm1", "thm2", "thm3", "prop4", "cor5", "cor6", "worked-example", "main-acceptance", "main-scores",
         "interpolation-ablation", "wall-clock"]
FIGURE_TEXT = {
    "fig_a_worked_example": ("a. The worked example", "q, p and the Cactus target h as bars; acceptance and KL spent "
                             "at delta = 0.21 and at the budget that gives the paper's .825."),
    "fig_b_gamma": ("b. gamma*(q_n, delta)", "Taylor closed form vs exact KL root vs cvxpy; KL(h_taylor || q) / delta "
                    "on a diverging scale centred at 1 (red: the Taylor rule overspends) with Corollary 6's "
                    "gamma* = 0.5 boundary."),
    "fig_c_tradeoff": ("c. Acceptance vs KL of the step's output law",
                       "rule sweeps over random and LM-derived (p, q) pairs (exact one-step laws); the baselines "
                       "are the references' variants (vLLM's TAS entropy, the authors' top-k recovery)."),
    "fig_d_gamma_delta": ("d. Gamma(delta)", "lower bounds on the worst one-step KL(h_alg || q) vs delta for several V "
                          "(running maximum over delta: Gamma is non-decreasing)."),
    "fig_e_lm": ("e. Real decoding", "AL vs delta and k; distortion and verifier NLL vs AL; speedup vs delta."),
    "fig_h_eval": ("h. Task accuracy vs AL", "accuracy (95% Wilson interval) against AL (tokens per verifier call, "
                   "bonus included; 95% bootstrap interval) per rule, on the eval task (`cactus-theory eval`)."),
    "fig_i_multi_draft": ("i. Cactus with several drafts (our result)",
                          "the best acceptance of K i.i.d. drafts with the step's law within KL(h || q) <= delta, "
                          "against K and delta (delta = 0: the lossless multi-draft optimum); the optimum's shape; "
                          "with one draft, every rule beside the optimum at its own step KL."),
}
TITLES = {"paper": "Claims of the paper", "derived": "Results we derived (not claims of the paper)",
          "code": "Checks of our own code"}


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _order(key: str) -> int:
    return ORDER.index(key) if key in ORDER else len(ORDER)


def _mark(v: str) -> str:
    return v if v in ("holds",) or v.startswith("consistent") else f"**{v}**"


def _label(checks: list[Claim]) -> str:
    """The statement's verdict as printed (a "consistent" verdict names its scope)."""
    v = combined_verdict(checks)
    if v == "consistent":
        scopes = sorted({c.scope for c in checks if c.verdict == "consistent"})
        return "consistent: " + "; ".join(scopes)
    return v


def _cell(checks: list[Claim], field: str) -> str:
    """One line per check: ``source: value`` (``<br>`` between lines)."""
    vals = [(c.source or "?", getattr(c, field)) for c in checks]
    if len({v for _, v in vals}) == 1 and len(vals) == 1:
        return _esc(vals[0][1])
    return "<br>".join(f"*{_esc(s)}*: {_esc(v)}" for s, v in vals)


def _our_sections(steps: list[StepResult]) -> list[str]:
    """Sections of results that are ours, not the paper's (multi-draft Cactus, DropMatch on the LM), each
    written by its step from its cached numbers."""
    from . import fig_i_multi_draft, table_j_dropmatch

    writers = {"fig_i_multi_draft": fig_i_multi_draft.section, "table_j_dropmatch": table_j_dropmatch.section}
    out = []
    for s in steps:
        if s.name in writers:
            out += [writers[s.name](s.data), ""]
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
            label = _label(cs)
            notes = "; ".join(dict.fromkeys(c.detail for c in cs if c.detail))
            verdict = _mark(label) + (f" ({_esc(notes)})" if notes and combined_verdict(cs) not in ("holds",) else "")
            src = ", ".join(dict.fromkeys(c.source or "?" for c in cs))
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


def headline(claims: list[Claim]) -> str:
    c = counts(claims, "paper")
    total = sum(c.values())
    parts = [f"{c['holds']} hold", f"{c['consistent']} are consistent on another model or scale",
             f"{c['inconclusive']} are inconclusive", f"{c['differs']} differ", f"{c['out of reach']} are out of reach"]
    d, k = counts(claims, "derived"), counts(claims, "code")
    return (f"**Of the paper's {total} distinct claims checked here, " + ", ".join(parts) + ".** "
            f"Separately: {sum(d.values())} results we derived ({d['holds']} hold) and {sum(k.values())} checks of "
            f"our own code ({k['holds']} pass).")


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
        "Verdicts: *holds* (exact checks pass, or a 95% interval excludes the opposite direction on the paper's "
        "own setting); *consistent: ...* (the same, measured on another model or scale, named); *inconclusive* "
        "(the interval contains no effect); *differs*; *out of reach* (not measurable here, or fewer than 5 "
        "comparable points). Empirical intervals are percentile bootstraps over prompts or pairs. A statement "
        "checked several ways is one row, each check on its own line, and counts once.",
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
            if f.suffix == ".png" and f.stem in FIGURE_TEXT:
                title, text = FIGURE_TEXT[f.stem]
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
