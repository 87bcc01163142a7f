"""The law of ``check_generation`` itself (issue 41, item 7), over 1,000 seeds at a small vocabulary: every member's
size at alpha 0.05 and 0.01 (each position's pooled test, each position's exact member, the answer test), the
family's, the parts' Holm-adjusted p-values against Holm's step-down, and the coverage of the answer test's 95%
interval. Writes benchmarks/results/check_generation_laws.json; tests/theory/test_checker_laws.py re-derives every
law from it and recomputes a spread of its seeds (make test); ``--check`` recomputes every seed and compares
(``make checker-laws``, opt-in: minutes).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/check_generation_laws.py          # write the JSON
    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/check_generation_laws.py --check  # recompute, compare

Design (``DESIGN``): decodes of at most 4 tokens over V = 3 tokens and an end token (id 3, emitted, then the decode
stops), from an order-1 chain: the first token's law depends on the prompt (``FIRST``), each next token's on the
previous token (``NEXT``; after token 2 nearly always 2 again, so some strata pool to one bin and are tested
exactly). Two prompts, ``N`` = 150 decodes per prompt per side, positions 0..3, ``min_count`` 20, scorer "the first
token is 0". H0: both sides draw from the chain (seeds 0..999, ``check_generation``'s seed ``s``). Coverage under
H1 as well: side a's first token for prompt 0 drawn from ``FIRST_H1`` (the answer's true difference ``D_H1``,
computed from the laws), 1,000 seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "check_generation_laws.json"

END, LENGTH, N, SEEDS, MIN_COUNT, POSITIONS = 3, 4, 150, 1000, 20, 4
FIRST = {0: [0.45, 0.25, 0.25, 0.05], 1: [0.25, 0.35, 0.35, 0.05]}
FIRST_H1 = [0.35, 0.30, 0.30, 0.05]  # prompt 0 on side a under H1
NEXT = {0: [0.55, 0.25, 0.10, 0.10], 1: [0.30, 0.40, 0.20, 0.10], 2: [0.02, 0.01, 0.96, 0.01]}
D_H1 = (FIRST_H1[0] - FIRST[0][0]) / 2  # mean over the two prompts of P_a(first = 0) - P_b(first = 0)
DESIGN = {"vocabulary": "3 tokens and an end token (3)", "length": LENGTH, "first": FIRST, "next": NEXT,
          "first_h1_prompt0_side_a": FIRST_H1, "prompts": 2, "n": N, "positions": POSITIONS, "min_count": MIN_COUNT,
          "scorer": "1 if the first token is 0", "seeds": SEEDS, "true_difference_h1": D_H1}


def chain(first_h1: bool = False):
    """A generator ``generate(prompts, n, seed)`` of the chain; prompts are (0,) and (1,)."""
    def generate(prompts, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for pr in prompts:
            law0 = FIRST_H1 if (first_h1 and pr[0] == 0) else FIRST[pr[0]]
            toks = np.full((n, LENGTH), -1)
            alive = np.ones(n, bool)
            prev = None
            for t in range(LENGTH):
                u = rng.random(n)
                if t == 0:
                    nxt = np.searchsorted(np.cumsum(law0), u, side="right")
                else:
                    cdf = np.cumsum(np.array([NEXT[int(p)] if p != END and p >= 0 else NEXT[0] for p in prev]), 1)
                    nxt = (u[:, None] >= cdf).sum(1)
                nxt = np.minimum(nxt, END)
                toks[alive, t] = nxt[alive]
                alive &= nxt != END
                prev = nxt
            out += [[int(x) for x in row if x >= 0] for row in toks]
        return out
    return generate


def first_is_zero(prompt, tokens) -> float:
    return float(bool(tokens) and tokens[0] == 0)


PROMPTS = [(0,), (1,)]


def _r(x):
    """A number as stored: 10 significant digits (None for NaN)."""
    return None if x is None or math.isnan(x) else float(f"{x:.10g}")


def one(seed: int, h1: bool = False) -> dict:
    """One run of check_generation (alpha 0.05) at ``seed``: every member's raw and Holm-adjusted p-value (by name),
    the family's p-value and verdict, the answer's difference and 95% interval (numbers as stored, ``_r``)."""
    from cactus_theory.theory.check_generation import check_generation

    res = check_generation(chain(first_h1=h1), chain(), PROMPTS, n=N, positions=POSITIONS, alpha=0.05, seed=seed,
                           scorer=first_is_zero, min_count=MIN_COUNT)
    ans = next(t for t in res.tests if t.name == "answer")
    return {"tests": {t.name: [_r(t.pvalue), _r(t.holm)] for t in res.tests}, "pvalue": _r(res.pvalue),
            "reject": res.reject, "answer": [_r(ans.tv_observed), _r(ans.low), _r(ans.high)]}


def pack(h0: list[dict], h1: list[dict]) -> dict:
    """The JSON: ``members`` (every test name seen), per H0 seed (in order) each member's ``[p, holm]`` or None
    where the member was absent, the family's p-value and verdict, the answer's ``[difference, low, high]``; per H1
    seed the answer's."""
    members = sorted({k for r in h0 for k in r["tests"]}, key=lambda k: (k == "answer", k))
    return {"design": DESIGN, "members": members,
            "h0": {"tests": [[r["tests"].get(m) for m in members] for r in h0], "pvalue": [r["pvalue"] for r in h0],
                   "reject": [r["reject"] for r in h0], "answer": [r["answer"] for r in h0]},
            "h1": {"answer": [r["answer"] for r in h1]}}


def row(data: dict, seed: int) -> dict:
    """Seed ``seed``'s H0 run as ``one`` returns it, read back from the JSON."""
    h0 = data["h0"]
    return {"tests": {m: v for m, v in zip(data["members"], h0["tests"][seed], strict=True) if v is not None},
            "pvalue": h0["pvalue"][seed], "reject": h0["reject"][seed], "answer": h0["answer"][seed]}


def compute(seeds=range(SEEDS)) -> dict:
    return pack([one(s) for s in seeds], [one(s, h1=True) for s in seeds])


def same(a, b, tol: float = 1e-8) -> bool:
    """Two stored values agree: containers alike, numbers to a relative ``tol`` (the stored 10 digits)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and not isinstance(b, bool) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=tol, abs_tol=1e-300)
    return a == b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="recompute every seed and compare with the committed JSON")
    a = ap.parse_args(argv)
    got = compute()
    if a.check:
        ref = json.loads(OUT.read_text())
        bad = [s for s in range(SEEDS) if not same(row(ref, s), row(got, s))]
        bad += [f"h1 {s}" for s in range(SEEDS) if not same(ref["h1"]["answer"][s], got["h1"]["answer"][s])]
        ok = not bad and ref["design"] == json.loads(json.dumps(DESIGN)) and ref["members"] == got["members"]
        print(f"{2 * SEEDS - len(bad)} of {2 * SEEDS} runs reproduce" + (f"; differ: {bad[:20]}" if bad else ""))
        return 0 if ok else 1
    OUT.write_text(json.dumps(got, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
