"""Table k (our result, not the paper's): what the exact tree laws say, on toy pairs only.

Three parts, each computed from exact laws of ``cactus_theory.theory.tree`` (float64, no sampling) on
seeded random toy pairs (``toy.random_pair``; a draft that mixes the verifier with ``weight`` noise):

(a) EAGLE-2/3's tree sampling: the top-K draft tokens verified in multi-round fashion. Scheme
    ``"eagle"`` reads each candidate with the draft's probability (``min(1, r(x) / p(x))``, the rejected
    token zeroed in ``r`` and ``r`` renormalised); scheme ``"deterministic"`` takes each candidate's draft
    probability as 1 (what EAGLE's released ``evaluate_posterior`` does). Per pair: the exact step law's
    ``KL(law || q)`` and ``max |law - q|``, over a (V, K) grid of single-node pairs (``order=1``).
(b) tree Cactus, modes ``"rounds"`` and ``"joint"``, ``K`` i.i.d. drafts: its exact (acceptance, step KL)
    and the multi-draft optimum at that same KL (``optimize.solve_target_multi``); the share of the
    optimal acceptance gain over lossless tree SpS (``K`` i.i.d. drafts, recursive rejection sampling)
    that it takes, ``(acc - acc_SpS) / (opt(KL) - acc_SpS)``.
(c) block verification (Sun et al.) of a chain of ``k`` drafts: lossless by exact sequence law
    (``block_sequence_law`` against ``toy.autoregressive_law``) and its AL (tokens per verifier call,
    bonus included; ``expected_length`` of ``block_verification_law``) beside SpS's on the same chain
    (``tree_block_law`` with ``chain_parents(k)``), on bigram pairs.

The real-LM rows of (a), and the real-LM tree loop's first step against its exact law, are step l
(``table_l_lm_trees``: it needs the embedded draft; this step runs on toy pairs only).

``python -m paper_repro.table_k_trees [--fast]`` writes ``paper_repro/results/table_k_trees.md``.
"""

from __future__ import annotations

import numpy as np

from cactus_theory import kl, toy
from cactus_theory.claims.ledger import bootstrap_interval, exact_verdict, interval_verdict
from cactus_theory.optimize import solve_target_multi
from cactus_theory.rules import Cactus, SpS
from cactus_theory.tree import (
    block_sequence_law,
    block_verification_law,
    chain_parents,
    expected_length,
    tree_block_law,
    tree_step_law,
)

from .common import (
    Claim,
    Ctx,
    StepResult,
    cached_step,
    fmt,
    standalone,
    write_markdown,
)

NAME = "table_k_trees"
EXACT_TOL = 1e-12  # exact checks: float64 sums of a few hundred terms
OPT_TOL = 1e-6  # tree Cactus may exceed the optimum at its own KL by this much (cvxpy's precision)
FAMILY = "step k's claims, each its own statement; no multiplicity adjustment (one interval per claim)"
TOY = "toy pairs"  # every check of this step is on toy models: its verdicts say so ("holds (on toy pairs)")


def config(ctx: Ctx) -> dict:
    """The step's inputs: pair counts, grids and the toy pairs' shape."""
    fast = ctx.fast
    return {"seed": ctx.seed, "weight": 0.5, "concentration": 1.0,
            "a": {"N": 6 if fast else 40, "V": [8] if fast else [8, 32], "K": [2] if fast else [2, 4]},
            "b": {"N": 5 if fast else 40, "V": 6, "K": [2] if fast else [2, 3],
                  "delta": [0.1] if fast else [0.03, 0.1, 0.3]},
            "c": {"N": 5 if fast else 40, "V": 3 if fast else 4, "k": [2, 3] if fast else [2, 3, 4],
                  "lossless_pairs": 2 if fast else 5, "T": 3},
            "version": 1}


def _pair(V: int, seed: int, cfg: dict, order: int = 1):
    """``(draft, verifier)`` of ``toy.random_pair`` with the config's weight and concentration."""
    return toy.random_pair(V, order=order, concentration=cfg["concentration"], weight=cfg["weight"], seed=seed)


def _seeds(cfg: dict, part: str, n: int) -> list[int]:
    """``n`` pair seeds for one part, drawn from the step's seed (distinct parts, distinct streams)."""
    rng = np.random.default_rng([cfg["seed"], *part.encode()])
    return [int(s) for s in rng.integers(0, 2 ** 31, size=n)]


def part_a(cfg: dict) -> list[dict]:
    """Per (V, K) cell and pair: EAGLE-read and deterministic-read step KL and max |law - q|."""
    a = cfg["a"]
    rows = []
    for V in a["V"]:
        for K in a["K"]:
            for s in _seeds(cfg, f"a{V}_{K}", a["N"]):
                draft, verifier = _pair(V, s, cfg)
                p, q = draft(()), verifier(())
                le, acc_e = tree_step_law(SpS(), p, q, K, "eagle")
                ld, acc_d = tree_step_law(SpS(), p, q, K, "deterministic")
                rows.append({"V": V, "K": K, "seed": s, "kl_eagle": float(kl(le, q)),
                             "err_eagle": float(np.abs(le - q).max()), "acc_eagle": acc_e,
                             "kl_det": float(kl(ld, q)), "err_det": float(np.abs(ld - q).max()), "acc_det": acc_d})
    return rows


def part_b(cfg: dict) -> list[dict]:
    """Per pair, K, delta and mode: tree Cactus's acceptance and KL, the optimum at that KL, SpS's acceptance."""
    b = cfg["b"]
    rows = []
    for s in _seeds(cfg, "b", b["N"]):
        draft, verifier = _pair(b["V"], s, cfg)
        p, q = draft(()), verifier(())
        for K in b["K"]:
            _, acc_sps = tree_step_law(SpS(), p, q, K, "iid")
            for d in b["delta"]:
                for mode in ("rounds", "joint"):
                    law, acc = tree_step_law(Cactus(d), p, q, K, "iid", mode=mode)
                    step_kl = float(kl(law, q))
                    opt = float(solve_target_multi(p, q, step_kl, K).value)
                    den = opt - acc_sps
                    share = (acc - acc_sps) / den if den > 1e-9 else float("nan")
                    rows.append({"seed": s, "K": K, "delta": d, "mode": mode, "accept": acc, "kl": step_kl,
                                 "opt": opt, "acc_sps": acc_sps, "share": share})
    return rows


def part_c(cfg: dict) -> dict:
    """Per pair and k: block verification's and SpS's AL on the same chain; the exact lossless check on the
    first ``lossless_pairs`` pairs (first ``T`` tokens of the loop against the verifier's own law)."""
    c = cfg["c"]
    rows, err = [], 0.0
    for i, s in enumerate(_seeds(cfg, "c", c["N"])):
        draft, verifier = _pair(c["V"], s, cfg, order=2)
        for k in c["k"]:
            al_block = expected_length(block_verification_law(draft, verifier, k))
            al_sps = expected_length(tree_block_law(draft, verifier, SpS(), chain_parents(k), "iid"))
            rows.append({"seed": s, "k": k, "al_block": al_block, "al_sps": al_sps})
            if i < c["lossless_pairs"]:
                law = block_sequence_law(draft, verifier, k, c["T"])
                err = max(err, float(np.abs(law - toy.autoregressive_law(verifier, c["T"])).max()))
    return {"rows": rows, "lossless_err": err}


def compute(cfg: dict) -> dict:
    return {"config": cfg, "a": part_a(cfg), "b": part_b(cfg), "c": part_c(cfg)}


# -- summaries ------------------------------------------------------------------------------------

def _iv(x, seed: int = 0):
    return bootstrap_interval(np.asarray(x, dtype=np.float64), n_boot=2000, seed=seed)


def summary_a(d: dict) -> list[dict]:
    """Per (V, K) cell: mean and max EAGLE-read KL (with an interval of the mean), max |law - q| of both."""
    out = []
    cells = sorted({(r["V"], r["K"]) for r in d["a"]})
    for V, K in cells:
        rs = [r for r in d["a"] if (r["V"], r["K"]) == (V, K)]
        ke = [r["kl_eagle"] for r in rs]
        out.append({"V": V, "K": K, "n": len(rs), "kl_eagle": _iv(ke), "kl_eagle_max": max(ke),
                    "err_eagle_max": max(r["err_eagle"] for r in rs),
                    "kl_det_max": max(r["kl_det"] for r in rs), "err_det_max": max(r["err_det"] for r in rs),
                    "acc_eagle": float(np.mean([r["acc_eagle"] for r in rs])),
                    "acc_det": float(np.mean([r["acc_det"] for r in rs]))})
    return out


def _per_pair_b(d: dict) -> dict[str, np.ndarray]:
    """Per pair: the mean share over the (K, delta) cells, for each mode (pairs in seed order)."""
    seeds = list(dict.fromkeys(r["seed"] for r in d["b"]))
    out = {}
    for mode in ("rounds", "joint"):
        out[mode] = np.array([np.nanmean([r["share"] for r in d["b"] if r["seed"] == s and r["mode"] == mode])
                              for s in seeds])
    return out


def summary_b(d: dict) -> list[dict]:
    """Per (K, delta, mode): mean acceptance, step KL, optimum, SpS acceptance and the share (interval)."""
    out = []
    cells = sorted({(r["K"], r["delta"]) for r in d["b"]})
    for K, dl in cells:
        for mode in ("rounds", "joint"):
            rs = [r for r in d["b"] if (r["K"], r["delta"], r["mode"]) == (K, dl, mode)]
            sh = [r["share"] for r in rs if np.isfinite(r["share"])]
            out.append({"K": K, "delta": dl, "mode": mode, "n": len(sh),
                        "accept": float(np.mean([r["accept"] for r in rs])),
                        "kl": float(np.mean([r["kl"] for r in rs])), "opt": float(np.mean([r["opt"] for r in rs])),
                        "acc_sps": float(np.mean([r["acc_sps"] for r in rs])), "share": _iv(sh),
                        "excess": max(r["accept"] - r["opt"] for r in rs)})
    return out


def summary_c(d: dict) -> list[dict]:
    """Per k: mean AL of block verification and SpS, the paired difference (interval), its minimum."""
    out = []
    for k in sorted({r["k"] for r in d["c"]["rows"]}):
        rs = [r for r in d["c"]["rows"] if r["k"] == k]
        diff = [r["al_block"] - r["al_sps"] for r in rs]
        out.append({"k": k, "n": len(rs), "al_block": float(np.mean([r["al_block"] for r in rs])),
                    "al_sps": float(np.mean([r["al_sps"] for r in rs])), "diff": _iv(diff), "diff_min": min(diff)})
    return out


# -- claims ---------------------------------------------------------------------------------------

def claims(d: dict) -> list[Claim]:
    """The step's claims (kind "derived"), each with its units, decision rule and family."""
    cfg = d["config"]
    out = []
    a = d["a"]
    ke = [r["kl_eagle"] for r in a]
    iv = _iv(ke)
    cells = "; ".join(f"V = {s['V']}, K = {s['K']}: mean {fmt(s['kl_eagle'].estimate)} (max {fmt(s['kl_eagle_max'])})"
                      for s in summary_a(d))
    out.append(Claim(
        "eagle-tree-lossy", "EAGLE-style multi-round verification of top-K candidates, read with the draft's "
        "probability (accept min(1, r(x)/p(x)), zero the rejected token and renormalise), is not lossless",
        "ours (issue 19, deliverable 4a)", "derived",
        "exact step law (tree.tree_step_law, scheme 'eagle', SpS) on seeded random toy pairs; KL(law || q); 95% "
        "percentile bootstrap interval of the mean over pairs, pooled over the (V, K) cells",
        f"mean KL {iv} nats over {iv.n} pairs; {cells}", interval_verdict(iv),
        units=f"{iv.n} toy pairs ({len(cfg['a']['V']) * len(cfg['a']['K'])} (V, K) cells x {cfg['a']['N']})",
        decision="holds if the interval's lower end > 0; differs if its upper end < 0; else inconclusive",
        family=FAMILY, scope=TOY))
    err = max(r["err_det"] for r in a)
    out.append(Claim(
        "eagle-tree-prob-one", "EAGLE-style multi-round verification with each candidate's draft probability "
        "taken as 1 (as EAGLE's released evaluate_posterior does) is lossless",
        "ours (issue 19, deliverable 4a)", "derived",
        "exact step law (scheme 'deterministic', SpS) on the same pairs; max |law - q| over every pair",
        f"max |law - q| = {err:.1e} over {len(a)} pairs (tolerance {EXACT_TOL:g})", exact_verdict(err <= EXACT_TOL),
        units=f"{len(a)} toy pairs", decision=f"holds if max |law - q| <= {EXACT_TOL:g} on every pair", family=FAMILY, scope=TOY))
    per = _per_pair_b(d)
    diff = per["joint"] - per["rounds"]
    ivd = _iv(diff[np.isfinite(diff)])
    sb = summary_b(d)
    excess = max(s["excess"] for s in sb)
    shares = "; ".join(f"K = {s['K']}, delta = {s['delta']:g}, {s['mode']}: {s['share']}" for s in sb)
    out.append(Claim(
        "tree-cactus-joint-share", "tree Cactus's joint mode takes a larger share of the multi-draft optimum's "
        "acceptance gain (at the same step KL) over lossless tree SpS than its rounds mode",
        "ours (issue 19, deliverable 4b)", "derived",
        f"exact (acceptance, KL(law || q)) of tree Cactus, K i.i.d. drafts, V = {cfg['b']['V']}; optimum at that KL "
        "from optimize.solve_target_multi; share = (acc - acc_SpS) / (opt - acc_SpS); per pair the mean share over "
        "the (K, delta) cells; 95% bootstrap interval of the paired difference joint - rounds",
        f"joint - rounds = {ivd}; shares (95% interval): {shares}; largest excess of tree Cactus over the optimum "
        f"{excess:.1e}", interval_verdict(ivd) if excess <= OPT_TOL else "differs",
        units=f"{ivd.n} toy pairs", decision="holds if the interval's lower end > 0; differs if its upper end < 0 "
        f"(or tree Cactus exceeds the optimum by more than {OPT_TOL:g}); else inconclusive", family=FAMILY, scope=TOY))
    c = d["c"]
    out.append(Claim(
        "block-verification-lossless", "block verification (Sun et al.) of a chain of k drafts is lossless",
        "ours (issue 19, deliverable 4c)", "derived",
        f"exact law of the first {cfg['c']['T']} tokens of the loop (tree.block_sequence_law) against the "
        f"verifier's own law, k in {cfg['c']['k']}, on the first {cfg['c']['lossless_pairs']} bigram pairs",
        f"max |law - verifier's law| = {c['lossless_err']:.1e} (tolerance {EXACT_TOL:g})",
        exact_verdict(c["lossless_err"] <= EXACT_TOL),
        units=f"{cfg['c']['lossless_pairs']} toy bigram pairs x {len(cfg['c']['k'])} k",
        decision=f"holds if the max error <= {EXACT_TOL:g}", family=FAMILY, scope=TOY))
    rs = c["rows"]
    seeds = list(dict.fromkeys(r["seed"] for r in rs))
    pd = np.array([np.mean([r["al_block"] - r["al_sps"] for r in rs if r["seed"] == s]) for s in seeds])
    ivc = _iv(pd)
    mn = min(r["al_block"] - r["al_sps"] for r in rs)
    verdict = "differs" if mn < -EXACT_TOL else ("holds" if ivc.lo > 0 else "inconclusive")
    sc = "; ".join(f"k = {s['k']}: {fmt(s['al_block'])} vs {fmt(s['al_sps'])} ({s['diff']})" for s in summary_c(d))
    out.append(Claim(
        "block-verification-al", "block verification's AL (tokens per verifier call, bonus included) is at least "
        "SpS's on the same chain of drafts", "ours (issue 19, deliverable 4c; a theorem of Sun et al.)", "derived",
        f"exact AL (expected_length of block_verification_law and of tree_block_law on chain_parents(k), SpS) on "
        f"{len(seeds)} bigram pairs, V = {cfg['c']['V']}; per pair the mean difference over k; 95% bootstrap interval",
        f"block - SpS = {ivc} tokens per call; per k, block vs SpS (difference): {sc}; smallest difference on any "
        f"pair {mn:.1e}", verdict, units=f"{len(seeds)} toy bigram pairs",
        decision=f"differs if any pair's difference < -{EXACT_TOL:g} (exact check); else holds if the interval's "
        "lower end > 0, else inconclusive", family=FAMILY, scope=TOY))
    return out


# -- report ---------------------------------------------------------------------------------------

def section(d: dict) -> str:
    """REPORT.md's section: the three tables of step k (toy pairs, exact laws)."""
    cfg = d["config"]
    L = ["### k. Trees: what the exact laws say (our result, toy pairs only)", "",
         f"Exact laws (`theory.tree`) on seeded random toy pairs (`toy.random_pair`, draft weight {cfg['weight']:g}, "
         f"Dirichlet({cfg['concentration']:g}) rows). The real-LM rows of (a) are in section l.", "",
         "**(a) EAGLE-2/3 tree sampling** (top-K candidates, multi-round SpS verification). 'eagle': each "
         "candidate read with the draft's probability; 'prob. 1': its draft probability taken as 1 (EAGLE's "
         "released code). KL(law || q) in nats, mean with its 95% bootstrap interval over pairs.", "",
         "| V | K | pairs | KL eagle (mean [95%]) | KL eagle max | max abs(law - q) eagle | max abs(law - q) prob. 1 | "
         "acceptance eagle | acceptance prob. 1 |", "|---|---|---|---|---|---|---|---|---|"]
    for s in summary_a(d):
        iv = s["kl_eagle"]
        L.append(f"| {s['V']} | {s['K']} | {s['n']} | {fmt(iv.estimate)} [{fmt(iv.lo)}, {fmt(iv.hi)}] | "
                 f"{fmt(s['kl_eagle_max'])} | {fmt(s['err_eagle_max'])} | {s['err_det_max']:.1e} | "
                 f"{fmt(s['acc_eagle'])} | {fmt(s['acc_det'])} |")
    L += ["", f"**(b) tree Cactus vs the multi-draft optimum at the same step KL** (K i.i.d. drafts, V = "
          f"{cfg['b']['V']}, {cfg['b']['N']} pairs). Share = (acc - acc_SpS) / (opt(KL) - acc_SpS): the part of the "
          "optimal acceptance gain over lossless tree SpS that tree Cactus takes, 95% bootstrap interval over pairs.",
          "", "| K | delta | mode | acceptance | step KL | optimum at that KL | tree SpS | share [95%] |",
          "|---|---|---|---|---|---|---|---|"]
    for s in summary_b(d):
        iv = s["share"]
        L.append(f"| {s['K']} | {s['delta']:g} | {s['mode']} | {fmt(s['accept'])} | {fmt(s['kl'])} | {fmt(s['opt'])} | "
                 f"{fmt(s['acc_sps'])} | {fmt(iv.estimate)} [{fmt(iv.lo)}, {fmt(iv.hi)}] |")
    L += ["", f"**(c) block verification (Sun et al.) vs SpS on chains** (bigram pairs, V = {cfg['c']['V']}, "
          f"{cfg['c']['N']} pairs). AL: tokens per verifier call, bonus included; the difference's 95% bootstrap "
          f"interval over pairs. Lossless: max abs(law - verifier's law) of the first {cfg['c']['T']} tokens = "
          f"{d['c']['lossless_err']:.1e} on {cfg['c']['lossless_pairs']} pairs.", "",
          "| k | pairs | AL block | AL SpS | block - SpS [95%] | min difference |", "|---|---|---|---|---|---|"]
    for s in summary_c(d):
        iv = s["diff"]
        L.append(f"| {s['k']} | {s['n']} | {fmt(s['al_block'])} | {fmt(s['al_sps'])} | {fmt(iv.estimate)} "
                 f"[{fmt(iv.lo)}, {fmt(iv.hi)}] | {s['diff_min']:.1e} |")
    return "\n".join(L)


def run(ctx: Ctx) -> StepResult:
    cfg = config(ctx)

    def text(d):
        return "# Table k: trees, what the exact laws say\n\n" + section(d).split("\n", 2)[2] + "\n"

    return cached_step(ctx, NAME, cfg, lambda: compute(cfg), write_markdown(NAME, text), claims)


if __name__ == "__main__":
    standalone(run)
