"""The paper's own numbers, as summarised in the project's PAPER.md (Hao & Mou, ICLR 2026,
arXiv 2604.04987, CC BY 4.0), kept here so REPORT.md can print them beside ours without that file."""

from __future__ import annotations

SETUP = ("vLLM 0.7.3, lm-eval, chat template, temperature 0.6, top-p 0.95, top-k 20, up to 4096 new "
         "tokens; Qwen3-0.6B draft, Qwen3-14B verifier, m = 20 drafts; strict-match scores")

# method -> dataset -> (score, AL, Rej vs SpS); None where the paper reports none
MAIN_TABLE = {
    "verifier alone": {"GSM8K": (91.71, None, None), "GPQA": (40.07, None, None)},
    "SpS": {"GSM8K": (91.89, 5.11, "ref"), "GPQA": (40.91, 3.84, "ref")},
    "TAS": {"GSM8K": (92.87, 6.78, "-32%"), "GPQA": (40.40, 6.41, "-46%")},
    "Cactus delta=0.75": {"GSM8K": (92.15, 7.15, "-36%"), "GPQA": (45.46, 6.46, "-46%")},
    "Cactus delta=1.0": {"GSM8K": (92.87, 7.00, "-34%"), "GPQA": (45.46, 6.74, "-50%")},
}

OTHER = {
    "gpqa_8b_tas": "GPQA with Qwen3-8B, m = 20: TAS drops the score from 42.93 to 38.89",
    "interpolation": ("interpolation ablation: at about 90% acceptance Cactus scores above 86 while "
                      "interpolation (alpha = 0.9) scores below 72"),
    "speedup": "A100 40GB, vLLM, 0.6B + 14B, m = 10: Cactus delta = 1.0 about 1.9x faster than the verifier alone",
}



def main_table_markdown() -> str:
    """The paper's main table (Qwen3-14B + 0.6B, m = 20) as markdown: score / AL / Rej."""
    lines = ["| method | GSM8K (score / AL / Rej) | GPQA (score / AL / Rej) |", "|---|---|---|"]
    for m, row in MAIN_TABLE.items():
        cells = [" / ".join("-" if v is None else str(v) for v in row[d]) for d in ("GSM8K", "GPQA")]
        lines.append(f"| {m} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)
