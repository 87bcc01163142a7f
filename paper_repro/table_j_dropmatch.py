"""Table j (our measurement, not the paper's): DropMatch on the real LM, beside Cactus.

DropMatch (Lee et al., arXiv 2603.03333; ``rules.DropMatch``) accepts a drafted token that SpS's test
accepts or that matches one of ``M`` Monte Carlo dropout paths of the verifier's LM head. On rows of
the verifier's own continuations (teacher-forced, the paper's sampling: temperature 0.6, top-k 20,
top-p 0.95, applied to ``p``, ``q`` and every dropout path alike):

* each row's exact one-step law given the path law ``r``, with ``r`` by Monte Carlo over dropout masks
  (``dropmatch.path_law``) and the jackknife error over mask groups carried to the acceptance and
  the divergence (``dropmatch.step_law``);
* its mean acceptance and mean divergence from ``q`` (KL, and TV because a path may pick a token the
  truncated ``q`` excludes, where KL is infinite);
* Cactus (Corollary 5) at the same mean acceptance and what it costs there (``tradeoff.matched_cactus``);
* a short decoding run through ``speculative_generate`` (the loop binds DropMatch at every step).

The pair: the embedded one (SmolLM2-135M-Instruct + the project's draft, built first when missing); in
fast mode (CI) a SmolLM2 self-draft (its linear layers fake-quantised to 4 bits, groups of 32;
embeddings and head kept), which the result names.

``python -m paper_repro.table_j_dropmatch [--fast]`` writes ``paper_repro/results/table_j_dropmatch.md``.
"""

from __future__ import annotations

import copy
import math
import os

import numpy as np
from tqdm import tqdm

from cactus_theory import Cactus, SpS, acceptance_rate, induced_distribution, kl, registry, tv
from cactus_theory.claims.ledger import all_of, interval_verdict, t_interval
from cactus_theory.core.sampling import SAMPLING
from cactus_theory.rules import DropMatch
from cactus_theory.tradeoff import matched_cactus

from .common import (
    Claim,
    Ctx,
    StepResult,
    atomic_write_text,
    cached_step,
    fmt,
    report_section,
    standalone,
)
from .lm_runs import set_threads

NAME = "table_j_dropmatch"
QUANT = {"bits": 4, "group": 32}


def config(ctx: Ctx) -> dict:
    fast = ctx.fast
    return {"per_style": 1 if fast else 2, "max_new_tokens": 6 if fast else 40, "seed": ctx.seed,
            "rates": [0.01, 0.1] if fast else [0.001, 0.003, 0.01, 0.03, 0.1],
            "paths": [1, 4], "match": [0.01] if fast else [0.003, 0.03], "masks": 32 if fast else 256,
            "groups": 8 if fast else 16, "sampling": SAMPLING.as_dict(), "pair": _pair_id(ctx),
            "decode": {"prompts": 1 if fast else 3, "max_new_tokens": 6 if fast else 32, "k": 4,
                       "rate": 0.01, "paths": 4}, "version": 2}


def _pair_id(ctx: Ctx) -> str:
    if ctx.lm.get("pair") is not None:
        return "injected"
    if ctx.fast:  # CI: no draft build
        return f"smollm2+self-draft-int{QUANT['bits']}-g{QUANT['group']}"
    from cactus_theory.lm.draft import DraftConfig, draft_path

    return f"smollm2+embedded ({os.path.basename(draft_path(DraftConfig()))})"


def quantised(model, bits: int, group: int):
    """A copy of ``model`` whose linear layers (not the head) are fake-quantised: each group of ``group``
    weights rounded to ``2^(bits-1) - 1`` symmetric levels of its largest magnitude."""
    import torch

    d = copy.deepcopy(model)
    head = d.get_output_embeddings()
    with torch.no_grad():
        for m in d.modules():
            if isinstance(m, torch.nn.Linear) and m is not head:
                w = m.weight.reshape(-1, group)
                s = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / (2 ** (bits - 1) - 1)
                m.weight.copy_((torch.round(w / s) * s).reshape(m.weight.shape))
    return d


def get_pair(ctx: Ctx, cfg: dict):
    if ctx.lm.get("pair") is not None:
        return ctx.lm["pair"]
    from cactus_theory.lm.pair import ModelPair, load_model

    if cfg["pair"].startswith("smollm2+embedded"):
        from cactus_theory.lm import load_pair

        from .lm_runs import build_embedded_draft_if_missing

        build_embedded_draft_if_missing()
        return load_pair()
    v, tok = load_model("smollm2")
    return ModelPair(quantised(v, **QUANT), v, tok, name=cfg["pair"])


def rows(pair, cfg: dict):
    """Teacher-forced rows along the verifier's own continuations: ``P``, ``Q`` (R, V), the head input
    ``X`` (R, d) and each row's prompt index."""
    import torch

    from cactus_theory.lm import autoregressive_generate
    from cactus_theory.lm.data import prompt_set
    from cactus_theory.lm.head_tap import HeadTap
    from cactus_theory.lm.loop import first_step_laws

    prompts = prompt_set(cfg["per_style"]) if pair.tokenizer is not None else [[1, 2, 3]] * (3 * cfg["per_style"])
    gen = autoregressive_generate(pair, prompts, max_new_tokens=cfg["max_new_tokens"], seed=cfg["seed"], **SAMPLING)
    P, Q, X, who = [], [], [], []
    for i, (pr, out) in enumerate(zip(gen.prompts, gen.tokens, strict=True)):
        ids = pr + out
        lo, hi = len(pr), len(ids) - 1
        if hi <= lo:
            continue
        p, q = first_step_laws(pair, ids, lo, hi, **SAMPLING)
        with torch.inference_mode(), HeadTap(pair.verifier) as tap:
            logits = pair.verifier(input_ids=torch.tensor([ids])).logits
        tap.check(logits)
        P.append(p)
        Q.append(q)
        X.append(tap.hidden[0, lo:hi].detach().float())
        who += [i] * (hi - lo)
    return np.concatenate(P), np.concatenate(Q), torch.cat(X), np.array(who), tap.weight.detach(), tap.bias


def path_laws(X, W, bias, cfg: dict, block: int = 8) -> dict:
    """Per rate, the Monte Carlo path law of every row (``dropmatch.path_law`` in blocks of rows), kept
    sparse: per row, the tokens with ``r > 0``, their ``r`` and their group means (a dense (G, R, V) array
    of group means would take gigabytes at SmolLM2's vocabulary)."""
    import torch

    from cactus_theory.dropmatch import path_law

    out = {}
    g = torch.Generator().manual_seed(cfg["seed"])
    rates = sorted(set(cfg["rates"]) | set(cfg["match"]))
    for rate in tqdm(rates, desc="table j: dropout path laws", leave=False):
        sparse = []
        for s in range(0, X.shape[0], block):
            law = path_law(X[s:s + block], W, rate, cfg["masks"], sampling=SAMPLING.as_tuple(), bias=bias,
                           groups=cfg["groups"], generator=g)
            for i in range(law.r.shape[0]):
                j = np.flatnonzero(law.r[i] > 0)
                sparse.append((j, law.r[i, j], law.group_means[:, i, j]))
        out[rate] = sparse
    return out


def compact(P, Q, laws: dict):
    """Rows cut to the union support of ``p``, ``q`` and every path law, zero-padded to a common width
    (exact: tokens outside carry no mass in any law); returns ``Pc``, ``Qc`` and the laws cut alike
    (``{rate: (r (R, W), group means (G, R, W))}``)."""
    R = P.shape[0]
    cols = []
    for i in range(R):
        j = np.flatnonzero((P[i] > 0) | (Q[i] > 0))
        for sparse in laws.values():
            j = np.union1d(j, sparse[i][0])
        cols.append(j)
    width = max(c.size for c in cols)
    Pc, Qc = np.zeros((R, width)), np.zeros((R, width))
    for i, j in enumerate(cols):
        Pc[i, :j.size], Qc[i, :j.size] = P[i, j], Q[i, j]
    Pc, Qc = Pc / Pc.sum(1, keepdims=True), Qc / Qc.sum(1, keepdims=True)
    claws = {}
    for rate, sparse in laws.items():
        G = sparse[0][2].shape[0]
        r, gm = np.zeros((R, width)), np.zeros((G, R, width))
        for i, (j, rv, gv) in enumerate(sparse):
            pos = np.searchsorted(cols[i], j)  # where each token sits in the row's compacted columns
            r[i, pos], gm[:, i, pos] = rv, gv
        claws[rate] = (r, gm)
    return Pc, Qc, claws, width


def _rules(cfg: dict) -> list[DropMatch]:
    out = [DropMatch(rate, M) for M in cfg["paths"] for rate in cfg["rates"]]
    return out + [DropMatch(rate, 4, "match") for rate in cfg["match"]]


def evaluate(Pc, Qc, claws, who, cfg: dict) -> list[dict]:
    """Per DropMatch setting: acceptance, TV, mass outside ``q``'s support and KL (with Monte Carlo
    errors); Cactus at the same mean acceptance on all rows, and on the rows where DropMatch's KL is
    finite (Cactus matched again on those rows), per prompt for the intervals."""
    from cactus_theory.dropmatch import PathLaw, step_law

    out = []
    for rule in tqdm(_rules(cfg), desc="table j: exact laws", leave=False):
        r, gm = claws[rule.rate]
        law = PathLaw(r=r, group_means=gm, masks=cfg["masks"], rate=rule.rate)
        st = step_law(rule, Pc, Qc, law)
        bound = rule.at(rule.hit_from_law(r))
        R = len(Pc)
        fin = np.isfinite(st.kl)
        oos = np.where(Qc > 0, 0.0, st.h).sum(1)  # mass on tokens the truncated q excludes
        m_all = matched_cactus(bound, Pc, Qc, "kl")
        row = {"rule": registry.label(rule), "rate": rule.rate, "paths": rule.num_paths, "base": rule.base,
               "accept": float(st.accept.mean()), "accept_mc_se": float(np.sqrt((st.accept_se ** 2).sum()) / R),
               "tv": float(tv(st.h, Qc).mean()), "oos": float(oos.mean()), "oos_rows": float((oos > 0).mean()),
               "kl_finite_frac": float(fin.mean()), "cactus_delta": m_all.delta_at_accept, "cactus_kl": m_all.cactus_cost,
               "per_prompt": {"accept": _by(st.accept, who), "oos": _by(oos, who)}}
        if fin.sum() >= 2:
            bf = rule.at(rule.hit_from_law(r[fin]))
            m_f = matched_cactus(bf, Pc[fin], Qc[fin], "kl")
            d_f = m_f.delta_at_accept
            row.update(kl_finite_mean=float(st.kl[fin].mean()),
                       kl_mc_se=float(np.sqrt((st.kl_se[fin] ** 2).sum()) / fin.sum()),
                       cactus_delta_finite=d_f, cactus_kl_finite=m_f.cactus_cost)
            if math.isfinite(d_f):
                ck = kl(induced_distribution(Cactus(d_f), Pc[fin], Qc[fin]), Qc[fin])
                row["per_prompt"]["kl_minus_cactus_finite"] = _by(st.kl[fin] - ck, who[fin])
        out.append(row)
    return out


def _by(x: np.ndarray, who: np.ndarray) -> list[float]:
    """Per-prompt means (prompts in order of first row)."""
    return [float(np.mean(x[who == i])) for i in np.unique(who)]


def references(Pc, Qc) -> list[dict]:
    out = []
    for rule in [SpS()] + [Cactus(d) for d in (0.01, 0.05, 0.1, 0.25, 0.5, 1.0)]:
        H = induced_distribution(rule, Pc, Qc)
        out.append({"rule": registry.label(rule), "accept": float(acceptance_rate(rule, Pc, Qc).mean()),
                    "kl": float(kl(H, Qc).mean()), "tv": float(tv(H, Qc).mean())})
    return out


def decode_run(pair, cfg: dict) -> list[dict]:
    """DropMatch, SpS and Cactus at DropMatch's matched budget through ``speculative_generate``."""
    from cactus_theory.lm import speculative_generate
    from cactus_theory.lm.data import prompt_set

    c = cfg["decode"]
    prompts = prompt_set(1)[:c["prompts"]] if pair.tokenizer is not None else [[1, 2, 3]] * c["prompts"]
    out = []
    for rule in (SpS(), DropMatch(c["rate"], c["paths"]), Cactus(c["delta"])):
        res = speculative_generate(pair, prompts, rule, k=c["k"], max_new_tokens=c["max_new_tokens"], batch_size=1,
                                   seed=cfg["seed"], **SAMPLING)
        s = res.stats
        out.append({"rule": registry.label(rule), "al": s.al, "acceptance_rate": s.acceptance_rate,
                    "new_tokens": s.new_tokens, "mean_step_kl": s.mean_step_kl, "kl_skipped": s.kl_skipped,
                    "seconds": s.seconds})
    return out


def noise_ratio(X, W, bias, rate: float = 0.1, masks: int = 8, seed: int = 0) -> float:
    """Mean over rows of std_v(dropout logits - logits) / std_v(logits) at ``rate``: how loud the head's
    dropout is (figure c's synthetic heads are calibrated to about this)."""
    import torch

    from cactus_theory.dropmatch import dropout_logits

    with torch.inference_mode():
        z = torch.nn.functional.linear(X.to(W.dtype), W, bias).float()
        zd = dropout_logits(X, W, rate, masks, bias, torch.Generator().manual_seed(seed))
        return float(((zd - z).std(-1) / z.std(-1)).mean())


def compute(ctx: Ctx, cfg: dict) -> dict:
    set_threads(ctx)
    pair = get_pair(ctx, cfg)
    P, Q, X, who, W, bias = rows(pair, cfg)
    laws = path_laws(X, W, bias, cfg)
    Pc, Qc, claws, width = compact(P, Q, laws)
    table = evaluate(Pc, Qc, claws, who, cfg)
    ref = next(t for t in table if t["rate"] == cfg["decode"]["rate"] and t["paths"] == cfg["decode"]["paths"]
               and t["base"] == "sps")
    dec_cfg = dict(cfg, decode=dict(cfg["decode"], delta=ref["cactus_delta"] if math.isfinite(ref["cactus_delta"])
                                    else 1.0))
    return {"pair": getattr(pair, "name", cfg["pair"]), "rows": int(P.shape[0]), "prompts": int(len(np.unique(who))),
            "support_width": width, "table": table, "references": references(Pc, Qc),
            "noise_ratio_at_0.1": noise_ratio(X[:32], W, bias),
            "decode": decode_run(pair, dec_cfg), "config": {k: v for k, v in cfg.items()}}


def section(d: dict) -> str:
    """REPORT.md's section (the table without its title, under a heading of the report's level)."""
    return report_section("### j. DropMatch on the real LM, beside Cactus (our measurement)", render(d))


def render(d: dict) -> str:
    c = d["config"]
    lines = ["# Table j: DropMatch on the real LM, beside Cactus", "",
             f"Pair: {d['pair']}; {d['rows']} teacher-forced rows of the verifier's own continuations of "
             f"{d['prompts']} prompts; sampling temperature {c['sampling']['temperature']:g}, top-k "
             f"{c['sampling']['top_k']}, top-p {c['sampling']['top_p']:g} on p, q and every dropout path. "
             f"Path law by Monte Carlo over {c['masks']} dropout masks per row ({c['groups']} groups; '+-': jackknife "
             "standard error of the mean over rows). Exact one-step laws given the path law. 'outside q': mass the "
             "step's law puts on tokens the truncated q excludes (the verifier's own sampler never emits them; KL is "
             "infinite on such rows). Cactus (Corollary 5) matched to DropMatch's mean acceptance, on all rows and on "
             "the rows where DropMatch's KL is finite. Mean TV from q equals acceptance minus SpS's acceptance "
             f"({fmt(d['references'][0]['accept'])}) for both rules: at equal acceptance TV cannot tell them apart. "
             f"Dropout at rate 0.1 moves the head's logits by {fmt(d['noise_ratio_at_0.1'], 2)} of their spread over "
             "the vocabulary (mean over rows).",
             "", "| DropMatch | acceptance | outside q: mean mass, rows | Cactus delta, KL at equal acceptance "
             "| finite-KL rows: share, DropMatch KL | Cactus KL at equal acceptance there |", "|---|---|---|---|---|---|"]
    for t in d["table"]:
        se = fmt(t["accept_mc_se"], 1) if t["accept_mc_se"] < 1e-3 else fmt(t["accept_mc_se"])
        fin = (f"{fmt(t['kl_finite_frac'], 2)}, {fmt(t['kl_finite_mean'])} +- {fmt(t['kl_mc_se'], 1)}"
               if "kl_finite_mean" in t else f"{fmt(t['kl_finite_frac'], 2)}, -")
        lines.append(f"| rate {t['rate']:g}, {t['paths']} paths, base {t['base']} | {fmt(t['accept'])} +- {se} | "
                     f"{fmt(t['oos'])}, {fmt(100 * t['oos_rows'], 0)}% | {fmt(t['cactus_delta'])}, {fmt(t['cactus_kl'])} | "
                     f"{fin} | {fmt(t.get('cactus_kl_finite', math.nan))} |")
    lines += ["", "References on the same rows:", "", "| rule | acceptance | mean TV | mean KL |", "|---|---|---|---|"]
    lines += [f"| {r['rule']} | {fmt(r['accept'])} | {fmt(r['tv'])} | {fmt(r['kl'])} |" for r in d["references"]]
    lines += ["", "Decoding through `speculative_generate` (k = 4, batch 1; DropMatch's step KL is not tracked in the "
              "loop: its law needs the path law, computed above):", "",
              "| rule | AL (tokens per verifier call) | per-token acceptance | new tokens | mean step KL |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['rule']} | {fmt(r['al'], 2)} | {fmt(r['acceptance_rate'])} | {r['new_tokens']} | "
              f"{fmt(r['mean_step_kl'])} |" for r in d["decode"]]
    return "\n".join(lines) + "\n"


def _every_setting(x: np.ndarray, scope: str):
    """Per setting (a column of ``x``: prompts x settings) the 95% t-interval of the mean over prompts (few prompts:
    no percentile bootstrap); the claim "above 0 in every setting" takes the weakest (``all_of``: an
    intersection-union test). Returns the interval with the lowest lower end and the verdict."""
    ivs = [t_interval(x[:, j]) for j in range(x.shape[1])]
    return min(ivs, key=lambda iv: iv.lo), all_of(interval_verdict(iv, scope=scope) for iv in ivs)


def claims(d: dict) -> list[Claim]:
    scope = f"{d['pair']}, {d['rows']} rows of {d['prompts']} prompts"
    sps = [t for t in d["table"] if t["base"] == "sps"]
    ref = "rules.DropMatch, dropmatch.step_law, tradeoff.matched_cactus"
    mc = f"path law by Monte Carlo over {d['config']['masks']} masks"
    # 1. mass outside the truncated q (Cactus never puts any there: its h lives on q's support)
    O = np.array([t["per_prompt"]["oos"] for t in sps]).T  # (prompts, settings)
    iv, v = _every_setting(O, scope)
    out = [Claim(
        "dropmatch-outside-q", "DropMatch's step law puts mass on tokens the verifier's truncated q excludes (top-k / "
        "top-p), so its KL(h_alg || q) is infinite there; Cactus's law never leaves q's support", ref, "derived",
        f"exact one-step laws on teacher-forced rows ({mc}); per prompt, the mean mass outside q's support; 95% "
        "t-interval over prompts per setting (base sps), every setting's above 0 (intersection-union); the setting "
        "with the lowest lower end shown",
        "; ".join(f"rate {t['rate']:g}, M = {t['paths']}: {fmt(t['oos'])} on {fmt(100 * t['oos_rows'], 0)}% of rows"
                  for t in sps) + f"; smallest {iv}", v, scope=scope if v in ("consistent", "inconclusive", "differs") else "",
        detail="tokens the verifier's own sampler never emits")]
    # 2. where it stays inside q's support: KL against Cactus at equal acceptance
    diffs = [t["per_prompt"]["kl_minus_cactus_finite"] for t in sps if "kl_minus_cactus_finite" in t["per_prompt"]]
    how = (f"exact one-step laws on teacher-forced rows ({mc}); on the rows where DropMatch's KL is finite, Cactus "
           "matched to its mean acceptance there; per prompt, the mean KL difference; 95% t-interval over prompts per "
           "setting (base sps), every setting's above 0 (intersection-union); the setting with the lowest lower end "
           "shown")
    ours = "; ".join(f"rate {t['rate']:g}, M = {t['paths']}: accept {fmt(t['accept'])}, KL "
                     f"{fmt(t.get('kl_finite_mean', math.nan))} vs Cactus {fmt(t.get('cactus_kl_finite', math.nan))} "
                     f"on {fmt(100 * t['kl_finite_frac'], 0)}% of rows" for t in sps)
    if not diffs:
        out.append(Claim("dropmatch-vs-cactus", _CLAIM, ref, "derived", how, ours or "-", "out of reach"))
        return out
    iv, v = _every_setting(np.array(diffs).T, scope)
    out.append(Claim("dropmatch-vs-cactus", _CLAIM, ref, "derived", how, ours + f"; smallest KL difference {iv}", v,
                     scope=scope if v in ("consistent", "inconclusive", "differs") else "",
                     detail="per-step divergence of the output law, not task accuracy"))
    return out


_CLAIM = ("where DropMatch's step law stays inside q's support, it costs more KL(h_alg || q) than Cactus at equal "
          "acceptance")


def run(ctx: Ctx) -> StepResult:
    cfg = config(ctx)

    def plot(d, c):
        atomic_write_text(c.results / f"{NAME}.md", render(d))
        return []

    return cached_step(ctx, NAME, cfg, lambda: compute(ctx, cfg), plot, claims)


if __name__ == "__main__":
    standalone(run)
