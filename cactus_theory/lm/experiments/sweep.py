"""The secondary sweep of eval_v3 (``design.sweep``): every other rule at one run per question on a subset of one
task, read against the primary run's lossless runs of the same questions. It reports estimates; a rule
'differs' only where its Holm-adjusted two-sided p-value is below 0.05, otherwise 'no difference detected' with
the difference the sweep could have detected; never 'consistent'.

Per sweep method ``m`` and question ``i`` (the first ``n`` questions, replicate 0):

* ``d_i = y_mi - pool_i``, ``y_mi`` the method's outcome (one run), ``pool_i`` the mean of the verifier alone's and
  SpS's ``R`` runs each of question ``i`` in the primary run (independent of ``y_mi``: another rule identity, so
  other row seeds); 95% Student-t interval of ``mean(d)``; two-sided p of ``H0: mean(d) = 0``; Holm over the
  sweep's methods; the minimum detectable difference ``(t_(0.975, n-1) + t_(0.8, n-1)) sd(d) / sqrt(n)``.
* AL, acceptance, step KL, NLL: ratios of sums over questions; Rej vs SpS: rejected drafts per emitted token over
  SpS's (SpS's replicate-0 runs of the same questions); 95% percentile bootstrap over questions (4,000, seeded).
"""

from __future__ import annotations

import math

import numpy as np

from .eval import COUNTERS

__all__ = ["analyse_sweep", "format_sweep", "N_BOOT"]

N_BOOT = 4000


def _t(d: np.ndarray) -> dict:
    from scipy import stats

    n = d.size
    m, sd = float(d.mean()), float(d.std(ddof=1)) if n > 1 else math.nan
    se = sd / math.sqrt(n)
    tq = stats.t.ppf(0.975, n - 1)
    p = 1.0 if se == 0 else float(2 * stats.t.sf(abs(m) / se, n - 1))
    mdd = (tq + stats.t.ppf(0.8, n - 1)) * se
    return {"estimate": m, "low": m - tq * se, "high": m + tq * se, "p_two_sided": p, "mdd": float(mdd), "n": n}


def _ratio(num: np.ndarray, den: np.ndarray, idx: np.ndarray) -> list[float]:
    with np.errstate(invalid="ignore", divide="ignore"):
        est = float(num.sum() / den.sum()) if den.sum() else math.nan
        boot = num[idx].sum(1) / den[idx].sum(1)
    boot = boot[np.isfinite(boot)]
    if not boot.size:
        return [est, math.nan, math.nan]
    lo, hi = np.quantile(boot, [0.025, 0.975])
    return [est, float(lo), float(hi)]


def _by_question(records: list[dict], n: int, replicates: int | None = None) -> dict:
    """(n, R) outcomes and (n,) counter sums of the records of questions ``< n`` (replicates ``< replicates``)."""
    rs = sorted({r["r"] for r in records if r["q"] < n and (replicates is None or r["r"] < replicates)})
    out = {"correct": np.full((n, len(rs)), np.nan), **{c: np.zeros(n) for c in COUNTERS}}
    for rec in records:
        q, r = rec["q"], rec["r"]
        if q >= n or r not in rs:
            continue
        out["correct"][q, rs.index(r)] = float(bool(rec["correct"]))
        for c in COUNTERS:
            out[c][q] += rec[c]
    if np.isnan(out["correct"]).any():
        raise ValueError(f"{int(np.isnan(out['correct']).sum())} (question, replicate) rows have no record")
    return out


def analyse_sweep(primary: dict, sweep: dict, labels: list[str], n: int, base: str = "verifier alone",
                  sps: str = "SpS", seed: int = 0) -> dict:
    """``primary[label]``: the primary run's records of the task (every replicate); ``sweep[label]``: the sweep's
    records (replicate 0) of each sweep method ``labels``. Returns per method its accuracy, its difference from the
    pool with the verdict, and the acceptance statistics (see the module docstring)."""
    from ...claims.ledger import holm

    pool = np.concatenate([_by_question(primary[lab], n)["correct"] for lab in (base, sps)], axis=1).mean(1)
    s0 = _by_question(primary[sps], n, replicates=1)
    idx = np.random.default_rng(seed).integers(0, n, size=(N_BOOT, n))
    out = {"questions": n, "pool_runs_per_question": int(sum(_by_question(primary[lab], n)["correct"].shape[1]
                                                             for lab in (base, sps))),
           "pool_accuracy": float(pool.mean()), "methods": {}}
    for lab in labels:
        x = _by_question(sweep[lab], n, replicates=1)
        y = x["correct"][:, 0]
        row = {"accuracy": float(y.mean()), "vs_pool": _t(y - pool)}
        emitted = x["accepted"] + x["steps"]
        row["al"] = _ratio(emitted, x["steps"], idx)
        row["acceptance"] = _ratio(x["accepted"], x["drafted"], idx)
        row["step_kl"] = _ratio(x["kl_sum"], x["kl_count"], idx)
        row["nll"] = _ratio(x["nll_sum"], x["nll_count"], idx)
        rej, rej0 = x["drafted"] - x["accepted"], s0["drafted"] - s0["accepted"]
        with np.errstate(invalid="ignore", divide="ignore"):
            est = (rej.sum() / x["new_tokens"].sum()) / (rej0.sum() / s0["new_tokens"].sum()) - 1
            boot = (rej[idx].sum(1) / x["new_tokens"][idx].sum(1)) / (rej0[idx].sum(1) / s0["new_tokens"][idx].sum(1)) - 1
        boot = boot[np.isfinite(boot)]
        row["rej_vs_sps"] = [float(est), *(np.quantile(boot, [0.025, 0.975]).tolist() if boot.size else [math.nan] * 2)]
        out["methods"][lab] = row
    adj = holm([out["methods"][lab]["vs_pool"]["p_two_sided"] for lab in labels]) if labels else []
    for lab, a in zip(labels, adj, strict=True):
        v = out["methods"][lab]["vs_pool"]
        v["holm"] = a
        v["verdict"] = "differs" if a < 0.05 else "no difference detected"
    return out


def format_sweep(res: dict, task: str) -> str:
    """Markdown of ``analyse_sweep``'s result (nothing recomputed)."""
    def pts(v):
        return f"{100 * v['estimate']:+.1f} [{100 * v['low']:+.1f}, {100 * v['high']:+.1f}]"

    def num(v, d=2):
        return "-" if v is None or not math.isfinite(v[0]) else f"{v[0]:.{d}f} [{v[1]:.{d}f}, {v[2]:.{d}f}]"

    lines = [f"Secondary sweep, task `{task}`: {res['questions']} questions x 1 run per method, against the primary "
             f"run's {res['pool_runs_per_question']} lossless runs of each question (pooled accuracy "
             f"{100 * res['pool_accuracy']:.1f}%). Estimates; 'differs' only at a Holm-adjusted two-sided p below 0.05 "
             "over the sweep's methods; otherwise no difference detected, with the difference the sweep would detect "
             "(power 0.8); never 'consistent'.", "",
             "| method | accuracy % | minus pool (points) | Holm p | verdict | detectable (points) | AL | acceptance "
             "| Rej vs SpS | step KL | NLL |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for lab, r in res["methods"].items():
        v, rej = r["vs_pool"], r["rej_vs_sps"]
        lines.append(f"| {lab} | {100 * r['accuracy']:.1f} | {pts(v)} | {v['holm']:.2g} | {v['verdict']} | "
                     f"{100 * v['mdd']:.1f} | {num(r['al'])} | {num(r['acceptance'])} | "
                     f"{100 * rej[0]:+.0f}% [{100 * rej[1]:+.0f}, {100 * rej[2]:+.0f}] | {num(r['step_kl'], 3)} | "
                     f"{num(r['nll'])} |")
    return "\n".join(lines)
