"""Table f: the main-table analogue, per prompt style, printed next to the paper's table.

Methods: verifier alone, SpS, TAS, Cactus delta = 0.75 and 1.0, top-k (k = 3), interpolation
(alpha = 0.5). Columns per style (math ~ GSM8K-style problems, code ~ HumanEval prompts, prose):
``AL`` (tokens per verifier call, bonus included), ``Rej`` (change in rejected drafts per emitted token vs SpS,
rejected = drafted - accepted), speedup over the verifier alone, exact per-step ``KL(h_alg || q)``
and verifier NLL (nats/token). Task accuracy is out of reach for a 135M verifier; the paper's
scores are printed for reference. Reads the cached runs of ``lm_runs`` (figure e runs them).
"""

from __future__ import annotations

import time

from .common import Ctx, StepResult, atomic_write_text, fmt, standalone
from .lm_runs import STYLES, lm_config, pooled, run_all
from .paper_numbers import SETUP, main_table_markdown

NAME = "table_f_main"
ROWS = ["verifier alone", "SpS", "TAS", "Cactus delta=0.75", "Cactus delta=1", "top-k k=3", "interpolation alpha=0.5"]
STYLE_NAMES = {"math": "math (GSM8K-style)", "code": "code (HumanEval-style)", "prose": "prose"}


def table(runs: dict) -> tuple[str, dict]:
    """Markdown of our table and its numbers ``{method: {style: {...}}}``."""
    nums: dict = {}
    for m in ROWS:
        for s in (*STYLES, "all"):
            t = pooled(runs, m, STYLES if s == "all" else (s,))
            base = pooled(runs, "verifier alone", STYLES if s == "all" else (s,))
            ref = pooled(runs, "SpS", STYLES if s == "all" else (s,))
            nums.setdefault(m, {})[s] = {
                "al": t["al"], "speedup": t["tokens_per_s"] / base["tokens_per_s"], "kl": t["mean_step_kl"],
                "nll": t["nll"], "rej": (t["rejected_per_token"] / ref["rejected_per_token"] - 1) if m != "verifier alone" else None}
    head = "| method | " + " | ".join(STYLE_NAMES.get(s, "all styles") for s in (*STYLES, "all")) + " |"
    lines = [head, "|---" * (len(STYLES) + 2) + "|"]
    for m in ROWS:
        cells = []
        for s in (*STYLES, "all"):
            v = nums[m][s]
            if m == "verifier alone":
                cells.append(f"- / - / 1.00x / - / {fmt(v['nll'], 2)}")
            else:
                rej = "ref" if m == "SpS" else f"{100 * v['rej']:+.0f}%"
                cells.append(f"{fmt(v['al'], 2)} / {rej} / {fmt(v['speedup'], 2)}x / {fmt(v['kl'], 3)} / {fmt(v['nll'], 2)}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines), nums


def run(ctx: Ctx) -> StepResult:
    t0 = time.perf_counter()
    runs = run_all(ctx)
    cfg = lm_config(ctx)
    md, nums = table(runs)
    s = cfg["sampling"]
    text = (f"Ours: {cfg['draft']} draft -> {cfg['verifier']} verifier, k = 4, {cfg['per_style']} prompts per style, "
            f"{cfg['max_new_tokens']} new tokens, T = {s['temperature']:g}, top-k {s['top_k']}, top-p {s['top_p']:g}. Cells: AL / Rej vs SpS / speedup / "
            f"per-step KL(h_alg||q) (nats) / verifier NLL (nats/token).\n\n{md}\n\n"
            f"Paper ({SETUP}); cells: score / AL / Rej.\n\n{main_table_markdown()}\n")
    atomic_write_text(ctx.results / "table_f_main.md", text)
    # steps e and f are two views of the same runs: their check of the main table is step e's (one check,
    # not two), so this step only draws the table
    return StepResult(NAME, {"markdown": text, "numbers": nums}, [], [], time.perf_counter() - t0)


if __name__ == "__main__":
    standalone(run)
