"""Calibration, power, memory and time of ``check_sampler`` and ``check_generation`` (the numbers that
docs/statistical-tests.md quotes; results in benchmarks/results/check_calibration.json, one key per section).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/check_calibration.py            # every section
    ... benchmarks/check_calibration.py --only sampler_fpr,planted                             # some sections

Sections (each writes its key of the JSON as soon as it is done; the others are kept):
  ``sampler_fpr``      check_sampler of the correct sampler (verify) over 200 seeds: rejection rate at alpha 0.05,
                       0.01 and 1e-3 (Clopper-Pearson 95% intervals), three rules, fixed rows V = 50, k = 3.
  ``sampler_power``    check_sampler at its defaults but tv = 0.05 against three wrong samplers (wrong recovery,
                       bonus from the wrong row, bonus at another temperature), 50 seeds each, and
                       toy.one_step_test with the same draws.
  ``generation_fpr``   check_generation of a correct pair over 300 seeds (toy n-gram: the loop under SpS vs plain
                       sampling) and 200 seeds (tiny random Llamas: our loop vs the verifier alone).
  ``planted``          the four planted engine bugs of tests/planted.py through our loop (the setting of
                       tests/lm/test_planted_bugs.py), 20 seeds each: check_generation's detection rate, and the
                       one-step test and check_sampler on the kernel the loop calls.
  ``real_v``           peak memory (RSS) and time of check_sampler at V = 150,000 (each run in its own process),
                       with verify (tv 0.05 and the defaults), with transformers' _speculative_sampling (2000 rows),
                       in exact mode, and toy.one_step_test
                       at a small N for comparison. Timings on a shared machine: the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats as sps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cactus_theory as ct  # noqa: E402
from cactus_theory.sampler import verify  # noqa: E402
from cactus_theory.theory.check import check_sampler  # noqa: E402
from cactus_theory.theory.check_generation import check_generation  # noqa: E402
from cactus_theory.toy import one_step_test, random_pair, toy_generate  # noqa: E402
from cactus_theory.util.atomic import atomic_write_json  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "check_calibration.json"
SECTIONS = ("sampler_fpr", "sampler_power", "generation_fpr", "planted", "real_v")


def rate(hits: int, n: int) -> dict:
    ci = sps.binomtest(int(hits), int(n)).proportion_ci(0.95)
    return {"hits": int(hits), "seeds": int(n), "rate": hits / n, "ci95": [float(ci.low), float(ci.high)]}


def save(key: str, value) -> None:
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    data[key] = value
    atomic_write_json(OUT, data)
    print(f"wrote {OUT.relative_to(ROOT)} [{key}]", flush=True)


def rows(seed: int, k: int, V: int, conc: float):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, conc), size=k), rng.dirichlet(np.full(V, conc), size=k + 1)


# -- check_sampler --------------------------------------------------------------------------------------

def sampler_fpr(seeds: int) -> dict:
    P, Q = rows(0, 3, 50, 0.5)
    out = {"rows": "Dirichlet(0.5) rows, V = 50, k = 3 (seed 0)", "tv": 0.05, "power": 0.9, "rules": {}}
    for rule in (ct.SpS(), ct.Cactus(0.5), ct.TAS()):
        t0 = time.perf_counter()
        res = [check_sampler(verify, P, Q, rule=rule, tv=0.05, alpha=0.05, seed=s) for s in range(seeds)]
        p = np.array([r.pvalue for r in res])
        out["rules"][repr(rule)] = {
            "n_rows": res[0].n, "parts": {k: {"n": v.n, "bins": len(v.bins), "detectable_tv": v.detectable_tv}
                                          for k, v in res[0].parts.items()},
            **{f"alpha {a:g}": rate(int((p < a).sum()), seeds) for a in (0.05, 0.01, 1e-3)},
            "seconds": time.perf_counter() - t0}
        print(repr(rule), {k: v for k, v in out["rules"][repr(rule)].items() if k.startswith("alpha")}, flush=True)
    return out


def sampler_power(seeds: int) -> dict:
    from tests.planted import bonus_tempered
    from tests.test_wrong_ports import WrongRecoveryCactus, bonus_from_wrong_row

    def wrong_recovery(d, p, q, rule, generator=None):
        return verify(d, p, q, WrongRecoveryCactus(0.1), generator=generator)

    P, Q = rows(11, 2, 8, 0.7)  # tests/test_wrong_ports.py's rows (its wrong recovery sits at TV 0.019 there)
    alts = {"wrong recovery (Cactus 0.1 accepting, SpS recovering)": (wrong_recovery, ct.Cactus(0.1)),
            "bonus from row k - 1": (bonus_from_wrong_row, ct.SpS()),
            "bonus at temperature x2 (q_k^(1/2))": (bonus_tempered(2.0), ct.SpS())}
    out = {"rows": "tests/test_wrong_ports.py rows(11): Dirichlet(0.7), V = 8, k = 2", "alpha": 1e-3, "tv": 0.05,
           "alternatives": {}}
    for name, (sampler, rule) in alts.items():
        res = [check_sampler(sampler, P, Q, rule=rule, tv=0.05, alpha=1e-3, seed=s) for s in range(seeds)]
        one = [one_step_test(rule, P, Q, num_samples=res[s].n, sampler=sampler, seed=s, alpha=1e-3).reject
               for s in range(seeds)]
        parts = {k: rate(sum(r.parts[k].reject for r in res), seeds) for k in res[0].parts}
        exact_first = ct.tv(ct.induced_distribution(rule, P[0], Q[0]), ct.induced_distribution(
            WrongRecoveryCactus(0.1), P[0], Q[0])) if "recovery" in name else 0.0
        out["alternatives"][name] = {
            "n_rows": res[0].n, "check_sampler": rate(sum(r.reject for r in res), seeds), "parts": parts,
            "one_step_test": rate(sum(one), seeds), "first_token_tv": float(exact_first),
            "detectable_tv": {k: v.detectable_tv for k, v in res[0].parts.items()}}
        print(name, out["alternatives"][name]["check_sampler"], "one-step", out["alternatives"][name]["one_step_test"],
              flush=True)
    # the same design with a smaller tv, for the wrong recovery (TV 0.019 on the first token)
    r = [check_sampler(wrong_recovery, P, Q, rule=ct.Cactus(0.1), tv=0.015, alpha=1e-3, seed=s, parts=("first", "block"))
         for s in range(seeds)]
    out["wrong recovery at tv 0.015"] = {"n_rows": r[0].n, "check_sampler": rate(sum(x.reject for x in r), seeds),
                                         "detectable_tv_first": r[0].parts["first"].detectable_tv}
    return out


# -- check_generation -----------------------------------------------------------------------------------

def generation_fpr(seeds_toy: int, seeds_llama: int) -> dict:
    d, v = random_pair(5, order=2, concentration=0.7, weight=0.5, seed=3)
    spec, plain = toy_generate(v, 5, draft=d, rule=ct.SpS(), k=2), toy_generate(v, 5)
    p_toy = [check_generation(spec, plain, [(1,), (2, 4)], n=1000, positions=5, alpha=0.05, seed=s).pvalue
             for s in range(seeds_toy)]
    out = {"toy": {"setting": "random_pair(5, order 2, concentration 0.7, weight 0.5, seed 3), SpS k = 2, 2 prompts, "
                              "n = 1000 per prompt per side, 5 positions",
                   **{f"alpha {a:g}": rate(int((np.array(p_toy) < a).sum()), seeds_toy) for a in (0.05, 0.01, 1e-3)}}}
    print("toy", out["toy"], flush=True)
    from cactus_theory.integrations.engines import EngineOptions, loop_engine
    from tests.lm.common import pair

    opts = EngineOptions(rule=ct.SpS(), k=1, max_new_tokens=6, temperature=0.7, top_k=5, top_p=1.0, batch_size=2000)
    eng = loop_engine(opts, pair=pair())
    t0 = time.perf_counter()
    p_l = [check_generation(eng.generate_a, eng.generate_b, [[3, 5, 7], [1]], n=1000, positions=6, alpha=0.05,
                            seed=s).pvalue for s in range(seeds_llama)]
    out["tiny_llama"] = {"setting": "tests/lm/common.py pair, our loop SpS k = 1 vs the verifier alone, 6 new tokens, "
                                    "T 0.7, top-k 5, ragged prompts [3,5,7] and [1], n = 1000 per prompt per side",
                         **{f"alpha {a:g}": rate(int((np.array(p_l) < a).sum()), seeds_llama)
                            for a in (0.05, 0.01, 1e-3)}, "seconds": time.perf_counter() - t0}
    print("tiny llama", out["tiny_llama"], flush=True)
    return out


def planted(seeds: int) -> dict:
    from unittest import mock

    from tests.lm import test_planted_bugs as T
    from tests.planted import PLANTED, WEAKER

    P, Q = T.kernel_rows()
    out = {"setting": {"n": T.N, "k": T.SETTING.k, "alpha": T.ALPHA, "max_new_tokens": T.SETTING.max_new_tokens,
                       "temperature": T.SETTING.temperature, "top_k": T.SETTING.top_k, "prompts": T.PROMPTS,
                       "positions": 6}, "bugs": {}}
    for bug, (desc, _, kernel) in (PLANTED | WEAKER).items():
        with mock.patch.dict(PLANTED, WEAKER):  # planted_run reads the bug from PLANTED
            res = [T.planted_run(bug, seed=s) for s in range(seeds)]
        one = [one_step_test(ct.SpS(), P, Q, num_samples=20_000, sampler=kernel, seed=s, alpha=T.ALPHA).reject
               for s in range(seeds)]
        cs = [check_sampler(kernel, P, Q, tv=0.05, alpha=T.ALPHA, seed=s) for s in range(seeds)]
        pv = np.array([r.pvalue for r in res])
        out["bugs"][bug] = {"description": desc,
                            "check_generation": rate(sum(r.reject for r in res), seeds) | {
                                "median_p": float(np.median(pv)), "max_p": float(pv.max()),
                                "first_rejecting_position": int(min((t for t in res[0].tests if t.reject),
                                                                    key=lambda t: t.holm).position)
                                if res[0].reject else None},
                            "one_step_test": rate(sum(one), seeds) | {"n": 20_000},
                            "check_sampler": rate(sum(r.reject for r in cs), seeds) | {"n": cs[0].n}}
        print(bug, out["bugs"][bug]["check_generation"]["rate"], "one-step", out["bugs"][bug]["one_step_test"]["rate"],
              "check_sampler", out["bugs"][bug]["check_sampler"]["rate"], flush=True)
    res = [T.planted_run(None, seed=s) for s in range(seeds)]
    out["correct"] = rate(sum(r.reject for r in res), seeds)
    return out


# -- memory and time at V = 150,000 -----------------------------------------------------------------------

PROBE = r"""
import json, resource, sys, time, torch
torch.set_num_threads(1)
import cactus_theory as ct
from cactus_theory.sampler import verify
from cactus_theory.theory.check import check_sampler, transformers_sampler
from cactus_theory.toy import one_step_test
V, k = 150_000, 4
g = torch.Generator().manual_seed(0)
Q = torch.softmax(torch.randn(k + 1, V, generator=g, dtype=torch.float64) * 3, -1)
P = torch.softmax(Q[:k].log() + 0.5 * torch.randn(k, V, generator=g, dtype=torch.float64), -1)
Q32, P32 = Q.float(), P.float()
case = sys.argv[1]
if case.startswith("hf"):
    import transformers.generation.utils  # imported before the baseline
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if case == "verify":
    r = check_sampler(verify, P32, Q32, tv=0.05)
elif case == "verify_default":  # the defaults: tv = 0.02, alpha = 1e-3, power 0.9
    r = check_sampler(verify, P32, Q32)
elif case == "hf":
    r = check_sampler(transformers_sampler(), P32, Q32, tv=0.05, num_samples=2000)
elif case == "hf_exact":
    r = check_sampler(transformers_sampler(), P32, Q32, mode="exact")
elif case == "one_step":
    r = one_step_test(ct.SpS(), P32.double().numpy(), Q32.double().numpy(), num_samples=int(sys.argv[2]))
secs = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = {"case": case, "seconds": secs, "rss_before_mb": base / 1024, "peak_rss_mb": peak / 1024,
       "added_mb": (peak - base) / 1024}
if case != "one_step":
    out |= {"n_rows": r.n, "chunk": r.chunk, "reject": r.reject, "pvalue": r.pvalue,
            "parts": {k: {"n": v.n, "detectable_tv": v.detectable_tv} for k, v in r.parts.items()}}
    if r.n:
        out["seconds_per_row"] = r.seconds / r.n
else:
    out |= {"n_rows": int(sys.argv[2]), "reject": bool(r.reject)}
print(json.dumps(out))
"""


def real_v() -> dict:
    out = {"V": 150_000, "k": 4, "rows": "float32 rows: Q = softmax(3 N(0, 1)), P = softmax(log Q[:k] + 0.5 N(0, 1))",
           "runs": []}
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for case in (["verify"], ["verify_default"], ["hf"], ["hf_exact"], ["one_step", "500"], ["one_step", "1000"]):
        load = os.getloadavg()[0]
        r = subprocess.run([sys.executable, "-c", PROBE, *case], capture_output=True, text=True, env=env, cwd=ROOT,
                           timeout=3600)
        if r.returncode:
            res = {"case": " ".join(case), "error": r.stderr.strip().splitlines()[-1]}
        else:
            res = json.loads(r.stdout.strip().splitlines()[-1])
        res["load_average_1min"] = load
        out["runs"].append(res)
        print(res, flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.only.split(","):
        if name not in SECTIONS:
            ap.error(f"unknown section {name!r}; choose from {SECTIONS}")
    only = args.only.split(",")
    t0 = time.perf_counter()
    if "sampler_fpr" in only:
        save("sampler_fpr", sampler_fpr(200))
    if "sampler_power" in only:
        save("sampler_power", sampler_power(50))
    if "generation_fpr" in only:
        save("generation_fpr", generation_fpr(300, 200))
    if "planted" in only:
        save("planted", planted(20))
    if "real_v" in only:
        save("real_v", real_v())
    print(f"done in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
