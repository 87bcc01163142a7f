"""``python -m paper_repro`` (what ``make repro`` runs): regenerate every figure and table and
``paper_repro/REPORT.md``. The reproduction is not part of the library: it imports
``cactus_theory``, never the reverse.

Order: a (worked example), b (gamma*), d (Gamma(delta)), e (real decoding; the embedded draft is
built first when a language-model step has to compute and the draft is not cached), f (main-table analogue), c (rule sweeps; its LM panel uses rows saved by e), g
(production rules), h (task accuracy: a reduced ``cactus-theory eval``), i (Cactus with several drafts: our
result), j (DropMatch on the real LM: our measurement), the randomised claim checks of ``cactus-theory
verify``, then the report. Every step caches its numbers under ``--results`` (atomic writes, keyed by
the step's configuration, the draft's build config included), so a rerun only redraws, an interrupted
run resumes, and a fresh clone redraws the committed results without building the draft
(``--force`` recomputes).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

from . import steps as _steps
from .common import (
    FIGURES,
    REPORT,
    RESULTS,
    Ctx,
    NotCached,
    atomic_write_json,
    cached,
    cached_seconds,
    fast_mode,
)


def _current() -> dict[str, str]:
    """``{letter: module}`` of ``steps.STEPS`` as it is now (a step registered at run time included)."""
    return {s.id: s.module for s in _steps.STEPS}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fast", action="store_true", help="small sizes for CI (also CACTUS_FAST=1)")
    parser.add_argument("--only", default=None, help=_steps.only_help())
    parser.add_argument("--no-lm", action="store_true", help=_steps.no_lm_help())
    parser.add_argument("--force", action="store_true", help="recompute the selected steps, ignoring caches")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=None, help="cases per claim for the randomised checks")
    parser.add_argument("--verifier", default="smollm2", help="verifier: 'smollm2' (embedded), .gguf, folder or hub id")
    parser.add_argument("--draft", default="embedded", help="draft: 'embedded' (built for smollm2) or a model like --verifier")
    parser.add_argument("--device", default=None, help="torch device for the LM steps (default: cpu)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads for the LM steps (default: 1 on a busy machine, else torch's)")
    parser.add_argument("--per-style", type=int, default=None, help="prompts per style (math, code, prose)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per prompt")
    parser.add_argument("--results", default=str(RESULTS), help="cache folder for the numbers")
    parser.add_argument("--figures", default=str(FIGURES), help="output folder for the figures")
    parser.add_argument("--report", default=str(REPORT), help="path of the report to write")


def check(args: argparse.Namespace) -> list[str]:
    """Argument checks that need no computation (``ValueError`` naming the option); returns the selected steps."""
    STEPS = _current()
    only = list(STEPS) + ["verify"] if args.only is None else [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in (*STEPS, "verify")]
    if bad:
        raise ValueError(f"--only must list steps among {sorted([*STEPS, 'verify'])}, got {bad}")
    for name in ("per_style", "max_new_tokens", "cases", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    return only


def verify_step(ctx: Ctx, cases: int, selected: bool) -> list:
    """``cactus-theory verify``'s checks at the run's seed (cached like a step); rows are ``Claim``."""
    from cactus_theory.claims.ledger import Claim
    from cactus_theory.claims.report import CLAIMS, verify_claims

    c = dataclasses.replace(ctx, cache_only=not selected, force=ctx.force and selected)

    def go():
        return [dataclasses.asdict(r) for r in verify_claims(ctx.seed, cases)]

    # the key names the checks run, so adding (or dropping) one recomputes instead of serving the old list
    key = {"seed": ctx.seed, "cases": cases, "claims": [check.__name__ for check in CLAIMS], "version": 2}
    rows = cached(c, "verify_claims", key, go)
    return [Claim(**r) for r in rows]


def write_compute_times(ctx: Ctx, mode: str) -> dict:
    """``results/timings.json``: the compute time each result records in its cache (so a rerun that only
    redraws leaves it unchanged), the draft build, and their sum; rewritten only when it changes."""
    import json

    rec = {name: cached_seconds(ctx, name) for name in [*_current().values(), "verify_claims"]}
    rec = {k: round(v, 1) for k, v in rec.items() if v is not None}
    build = ctx.results / "draft_build.json"
    if build.exists():
        rec["build embedded draft"] = round(float(json.loads(build.read_text())["seconds"]), 1)
    out = {"mode": mode, "cpu_count": os.cpu_count(), "compute_seconds": rec,
           "total_compute_seconds": round(sum(rec.values()), 1)}
    path = ctx.results / "timings.json"
    try:
        same = json.loads(path.read_text()) == out
    except (OSError, ValueError):
        same = False
    if not same:
        atomic_write_json(path, out)
    return out


def repro(ctx: Ctx, only: list[str], lm: bool = True, cases: int | None = None,
          report: Path = REPORT) -> dict:
    """Run the steps; returns ``{"steps": [...], "timings": {...}, "skipped": {...}, "report": text}``."""
    import importlib

    from .report import write_claims, write_report

    t_all = time.perf_counter()
    steps, timings, skipped = [], {}, {}
    lm_steps = _steps.lm_ids()
    for key, mod in _current().items():
        if key in lm_steps and not lm:
            skipped[f"{key} ({mod})"] = "language-model steps disabled (--no-lm)"
            continue
        selected = key in only
        c = dataclasses.replace(ctx, cache_only=not selected, force=ctx.force and selected)
        if key == "e" and (ctx.results / "draft_build.json").exists() and not ctx.fast:
            import json

            b = json.loads((ctx.results / "draft_build.json").read_text())
            timings[f"embedded draft {b['draft']} (built in {b['seconds']:.1f} s)"] = 0.0
        t0 = time.perf_counter()
        try:
            res = importlib.import_module(f"paper_repro.{mod}").run(c)
        except NotCached as e:
            skipped[f"{key} ({mod})"] = f"not selected by --only and no cached result ({e})"
            continue
        steps.append(res)
        label = f"{key}: {mod}"
        if not selected or time.perf_counter() - t0 < 0.5 * (cached_seconds(ctx, mod) or 0):
            label += f" (from cache; computed in {cached_seconds(ctx, mod) or 0:.1f} s)"
        timings[label] = time.perf_counter() - t0
        print(f"[{key}] {label}: {timings[label]:.1f} s", flush=True)
    extra = []
    t0 = time.perf_counter()  # the randomised checks: verify_claims at the run's seed
    cases = cases or (20 if ctx.fast else 100)
    try:
        extra = verify_step(ctx, cases, "verify" in only)
        # a statement a step checks has that step's check as its primary; verify's randomised re-check of the
        # same statement is an independent secondary (cactus_theory.claims.ledger.resolve)
        # (and its second check of one statement, when no step checks it, one more)
        seen = {c.key for s in steps for c in s.claims}
        relabelled = []
        for c in extra:
            relabelled.append(dataclasses.replace(c, role="independent") if c.key in seen and c.role == "primary"
                              else c)
            seen.add(c.key)
        extra = relabelled
        timings["verify: randomised claim checks"] = time.perf_counter() - t0
    except NotCached as e:
        skipped["verify"] = f"not selected by --only and no cached result ({e})"
    timings["total"] = time.perf_counter() - t_all
    mode = "fast mode" if ctx.fast else "full run"
    compute = write_compute_times(ctx, mode)
    # the report quotes the recorded compute times (results/timings.json), not this invocation's wall times,
    # so a rerun that only redraws leaves it unchanged
    text = write_report(report, steps, extra, compute, mode, skipped, ctx.figures)
    write_claims(ctx.results / "claims.json", [c for s in steps for c in s.claims] + list(extra))
    return {"steps": steps, "extra": extra, "timings": timings, "skipped": skipped, "report": text}


DESCRIPTION = ("Regenerate every figure and table of the paper's reproduction and paper_repro/REPORT.md "
               "(each step cached, so a rerun only redraws and an interrupted run resumes).")


def run(args: argparse.Namespace) -> int:
    only = check(args)
    lm = {"verifier": args.verifier, "draft": args.draft}
    for k in ("device", "threads", "per_style", "max_new_tokens"):
        if getattr(args, k) is not None:
            lm[k] = getattr(args, k)
    ctx = Ctx(results=args.results, figures=args.figures, fast=args.fast or fast_mode(), force=args.force,
              seed=args.seed, lm=lm)
    out = repro(ctx, only, lm=not args.no_lm, cases=args.cases, report=Path(args.report))
    if Path(args.results).resolve() == RESULTS.resolve() and not ctx.fast:
        from .findings import update_readme

        update_readme()  # README's findings quote the default results
        _steps.update_readme()  # paper_repro/README.md's script table lists the registered steps
    from .report import headline

    claims = [c for s in out["steps"] for c in s.claims] + out["extra"]
    print(f"wrote {args.report}: {headline(claims).replace('**', '')} Total {out['timings']['total']:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m paper_repro [--fast] [--only b,c] ...``: one-line errors (exit 2), as the library's CLI."""
    import sys

    from cactus_theory.cli import Parser, run_command

    module = sys.modules[__name__]
    return run_command(Parser(prog="python -m paper_repro", description=DESCRIPTION), module,
                       sys.argv[1:] if argv is None else list(argv))
