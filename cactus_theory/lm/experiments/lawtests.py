"""Distribution tests on the real LM: does each rule's sampler produce the law the theory says?

Two kinds, reported separately:

* **Verification step (sampled through ``sampler.verify``; the cheap route).** For each prompt, the
  draft's ``p`` and the verifier's ``q`` are computed once (one full forward each, the eval's sampling
  transforms applied to both) at one position: the prompt (chat template) followed by the first ``j``
  tokens of the verifier's own seeded continuation, ``1 <= j < HORIZON`` chosen where Cactus delta = 1's
  step law is farthest from ``q`` (``step_position``: elsewhere every rule's law is about ``q`` and the
  test says little). Then ``draws`` independent steps are
  verified in one batch: ``n ~ p``, ``sampler.verify(n, p, q, rule)`` with ``k = 1``, keeping the first
  emitted token. Its empirical law is tested with ``stats.goodness_of_fit`` against the exact one-step
  law ``exact.induced_distribution(rule, p, q)``. The vocabulary is cut to the union support of ``p``
  and ``q`` plus zero-mass padding tokens (tokens outside carry no mass under either law; the
  padding keeps top-k's k-th largest ``q`` unchanged), so 20,000 draws cost seconds.
  A control per prompt tests SpS's draws against Cactus delta = 1's law (a wrong law): it must
  reject when their TV exceeds the detectable TV.
* **Through the decode loop (end to end, smaller).** ``speculative_generate`` with SpS against
  ``autoregressive_generate`` (the verifier alone) on one short prompt, ``loop_draws`` sequences
  each: a two-sample ``stats.homogeneity`` test on the first 3 tokens; and Cactus delta = 1's first
  verified token through the loop (the second emitted: the loop draws the first from the verifier's
  prompt pass), given the most frequent first token, against its exact law from ``p`` and ``q`` there.

Every test is at level ``ALPHA`` (Bonferroni over all tests of a run keeps the chance of any false
rejection below ``ALPHA`` times their number), with fixed seeds, and reports its power as the TV
distance it detects with probability 0.9 (``stats.detectable_tv``; for the two-sample test at the
effective size ``n1 n2 / (n1 + n2)``).
"""

from __future__ import annotations

import numpy as np
import torch

from ...core.exact import induced_distribution
from ...core.rules import Cactus, SpS, TopK
from ...core.sampler import verify
from ...core.sampling import SAMPLING
from ...theory.stats import detectable_tv, goodness_of_fit, homogeneity

__all__ = ["ALPHA", "BETA", "HORIZON", "LOOP_PROMPT", "step_position", "verify_step_test", "run_lawtests", "format_lawtests",
           "testable", "own_tv"]

ALPHA = 1e-4
BETA = 0.1
HORIZON = 16  # tokens of the verifier's continuation searched for the test position
LOOP_PROMPT = "Question: 7 + 5 = ?\nAnswer:"  # short and raw: the loop's cost is mostly the prompt's prefill


def step_position(pair, prompt_ids: list[int], sampling: dict, horizon: int = HORIZON, seed: int = 0):
    """Where the step tests look: after ``prompt_ids`` plus the first ``j`` tokens of the verifier's
    own continuation (``horizon`` tokens, seeded), ``1 <= j`` (the loop takes the first token from the
    prompt pass, so blocks start from the second), ``j`` chosen where Cactus delta = 1's step law is
    farthest from ``q`` in TV, so the rules' laws differ there (a chat answer's early tokens are often
    near-deterministic, and where ``p`` and ``q`` barely overlap every rule emits about ``q``). ``p`` is the
    draft's law of the first draft of a block starting there, ``q`` the verifier's (``loop.first_step_laws``,
    sampling transforms applied). Returns ``(j, p, q)``, or ``(None, None, None)`` when the
    continuation is too short."""
    from ..loop import autoregressive_generate, first_step_laws

    cont = autoregressive_generate(pair, [prompt_ids], max_new_tokens=horizon, seed=seed, **sampling).tokens[0]
    if len(cont) < 2:
        return None, None, None
    full = prompt_ids + cont
    lo = len(prompt_ids)  # position lo predicts cont[1] (a block's first draft after the first token)
    P, Q = first_step_laws(pair, full, lo, len(full) - 1, **sampling)
    i = int(np.argmax([_lossy_tv(p, q) for p, q in zip(P, Q, strict=True)]))
    return i + 1, P[i], Q[i]


def _lossy_tv(p: np.ndarray, q: np.ndarray) -> float:
    """``TV(h_alg, q)`` of one step of Cactus delta = 1: how far a lossy rule's law is from SpS's there."""
    rule = Cactus(1.0)
    idx = _support((rule,), p, q)
    pc, qc = p[idx] / p[idx].sum(), q[idx] / q[idx].sum()
    return float(0.5 * np.abs(induced_distribution(rule, pc, qc) - qc).sum())


def _support(rules, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Union support of ``p`` and ``q`` plus zero-mass tokens: at least one, and enough that top-k's
    k-th largest ``q`` is unchanged."""
    sup = np.flatnonzero((p > 0) | (q > 0))
    kk = max([r.k for r in rules if isinstance(r, TopK)], default=0)
    need = max(1, kk + 1 - sup.size)
    return np.concatenate([sup, np.flatnonzero((p <= 0) & (q <= 0))[:need]])


def verify_step_test(rule, p: np.ndarray, q: np.ndarray, draws: int, seed: int, law_rule=None) -> dict:
    """``draws`` first emitted tokens of one verification step (see module docstring), tested against
    the exact law of ``law_rule`` (default ``rule``). Returns the test's numbers."""
    law_rule = rule if law_rule is None else law_rule
    idx = _support((rule, law_rule), p, q)
    pc, qc = p[idx] / p[idx].sum(), q[idx] / q[idx].sum()
    law = induced_distribution(law_rule, pc, qc)
    gen = torch.Generator().manual_seed(seed)
    P, Q = torch.from_numpy(pc), torch.from_numpy(qc)
    n = torch.multinomial(P, draws, replacement=True, generator=gen)[:, None]  # (N, 1): n ~ p
    toks, _ = verify(n, P.expand(draws, 1, -1), Q.expand(draws, 2, -1), rule, generator=gen)
    res = goodness_of_fit(toks[:, 0].numpy(), law, alpha=ALPHA)
    return {"rule": repr(rule), "law_of": repr(law_rule), "draws": draws, "statistic": res.statistic,
            "pvalue": res.pvalue, "reject": res.reject, "bins": res.bins,
            "detectable_tv": detectable_tv(draws, categories=res.bins, alpha=ALPHA, beta=BETA) if res.bins >= 2 else None,
            "support": int(idx.size)}


def _loop_tokens(res, T: int) -> list[tuple]:
    return [tuple(t[:T]) + (-1,) * (T - len(t[:T])) for t in res.tokens]


def loop_tests(pair, k: int, sampling: dict, draws: int, seed: int) -> dict:
    """The end-to-end checks through the decode loop (module docstring). The loop samples the first
    token from the verifier's prompt pass, so Cactus's first verified token is the second: it is
    tested given the most frequent first token, against the exact law from ``p`` and ``q`` there."""
    from ..loop import autoregressive_generate, first_step_laws, speculative_generate

    kw = dict(max_new_tokens=3, batch_size=min(draws, 256), chat=False, **sampling)
    prompts = [LOOP_PROMPT] * draws
    if pair.tokenizer is None:  # tiny test pairs: a fixed token-id prompt
        prompts = [[1, 2, 3]] * draws
    a = autoregressive_generate(pair, prompts, seed=seed, **kw)
    s = speculative_generate(pair, prompts, SpS(), k=k, seed=seed + 1, track_kl=False, **kw)
    ta, ts = _loop_tokens(a, 3), _loop_tokens(s, 3)
    cats = {c: i for i, c in enumerate(sorted(set(ta) | set(ts)))}
    ca = np.bincount([cats[t] for t in ta], minlength=len(cats))
    cs = np.bincount([cats[t] for t in ts], minlength=len(cats))
    h = homogeneity(cs, ca, len(cats), alpha=ALPHA, kind="counts")
    n_eff = draws * draws / (2 * draws)
    out = {"prompt": LOOP_PROMPT if pair.tokenizer is not None else [1, 2, 3], "draws": draws,
           "sps_vs_verifier_3_tokens": {"statistic": h.statistic, "pvalue": h.pvalue, "reject": h.reject,
                                        "bins": h.bins, "distinct_sequences": len(cats),
                                        "detectable_tv": detectable_tv(n_eff, categories=h.bins, alpha=ALPHA,
                                                                       beta=BETA) if h.bins >= 2 else None}}
    rule = Cactus(1.0)
    c = speculative_generate(pair, prompts, rule, k=k, seed=seed + 2, track_kl=False, **{**kw, "max_new_tokens": 2})
    firsts = [t[0] for t in c.tokens if len(t) == 2]
    t1 = max(set(firsts), key=firsts.count)
    second = [t[1] for t in c.tokens if len(t) == 2 and t[0] == t1]
    ids = a.prompts[0] + [t1]
    P, Q = first_step_laws(pair, ids, len(ids) - 1, len(ids), **sampling)
    p, q = P[0], Q[0]
    idx = _support((rule,), p, q)
    law = induced_distribution(rule, p[idx] / p[idx].sum(), q[idx] / q[idx].sum())
    pos = {int(t): i for i, t in enumerate(idx)}
    if any(int(t) not in pos for t in second):
        raise AssertionError("the loop emitted a token outside the union support of p and q")
    g = goodness_of_fit(np.array([pos[int(t)] for t in second]), law, alpha=ALPHA)
    out["cactus_second_token"] = {"rule": repr(rule), "given_first_token": int(t1), "draws": len(second),
                                  "statistic": g.statistic, "pvalue": g.pvalue, "reject": g.reject, "bins": g.bins,
                                  "detectable_tv": detectable_tv(len(second), categories=g.bins, alpha=ALPHA,
                                                                 beta=BETA) if g.bins >= 2 else None}
    return out


def run_lawtests(pair, method_list, problems, draws: int = 20_000, loop_draws: int = 1000, k: int = 4,
                 sampling: dict | None = None, seed: int = 0, progress: bool = True) -> dict:
    """Every rule of ``method_list`` on every problem's first position (verification step), the
    control, and the loop checks. Returns ``{"alpha", "beta", "step": [...], "control": [...], "loop": {...}}``."""
    from tqdm.auto import tqdm

    from ..data import encode_prompts

    sampling = sampling or SAMPLING.as_dict()
    # tree rows decode with a chain rule's own rule: their one-step (chain) law is that rule's, tested once
    rules = [m for m in method_list if m.rule is not None and not m.rule.reads_head and not m.rule.stateful
             and getattr(m, "tree", None) is None]
    # a rule that reads the verifier's head (DropMatch) has no one-step law from (p, q) alone: its law
    # needs the dropout paths' law (dropmatch.path_law), tested in tests/core/test_dropmatch.py instead
    untested = {m.label: "reads the verifier's head: its step law needs the dropout path law (tests/test_dropmatch.py)"
                for m in method_list if m.rule is not None and m.rule.reads_head}
    untested.update({m.label: "stateful per sequence (SequenceBudget): no one-step law; its whole-decode law is "
                              "checked exactly on toy pairs (tests/theory/test_budget.py) and its realised KL per "
                              "answer is at most its budget (the eval's kl_sum)"
                     for m in method_list if m.rule is not None and m.rule.stateful})
    untested.update({m.label: "a tree row: its rule's verification step is tested on the chain row; the tree's first "
                              "step is tested against its exact law in paper_repro step l"
                     for m in method_list if getattr(m, "tree", None) is not None})
    if pair.tokenizer is not None:
        prompt_ids = encode_prompts(pair.tokenizer, [p.question for p in problems], chat=True)
    else:
        rng = np.random.default_rng(seed)
        prompt_ids = [rng.integers(0, pair.vocab_size, size=5).tolist() for _ in problems]
    step, control = [], []
    bar = tqdm(total=len(prompt_ids) * (len(rules) + 1) + 1, desc="distribution tests", disable=not progress)
    for i, ids in enumerate(prompt_ids):
        j, p, q = step_position(pair, ids, sampling, seed=seed + i)
        if j is None:
            bar.update(len(rules) + 1)
            continue
        for r_i, m in enumerate(rules):
            r = verify_step_test(m.rule, p, q, draws, seed=seed * 7919 + 101 * i + r_i)
            step.append({"prompt": i, "position": j, "tv_pq": float(0.5 * np.abs(p - q).sum()), "method": m.label, **r})
            bar.update()
        r = verify_step_test(SpS(), p, q, draws, seed=seed * 7919 + 101 * i + 99, law_rule=Cactus(1.0))
        sup = _support((SpS(),), p, q)
        pc, qc = p[sup] / p[sup].sum(), q[sup] / q[sup].sum()
        r["tv_between_laws"] = float(0.5 * np.abs(induced_distribution(SpS(), pc, qc)
                                                  - induced_distribution(Cactus(1.0), pc, qc)).sum())
        control.append({"prompt": i, **r})
        bar.update()
    loop = loop_tests(pair, k, sampling, loop_draws, seed)
    bar.update()
    bar.close()
    n_tests = sum(r["bins"] >= 2 for r in step) + 2  # one pooled bin: no power, not counted (``testable``)
    return {"alpha": ALPHA, "beta": BETA, "tests": n_tests, "familywise_bound": min(1.0, n_tests * ALPHA),
            "prompts": [p.id for p in problems], "step": step, "control": control, "loop": loop,
            "untested": untested}


def own_tv(r: dict, lt: dict) -> float:
    """The TV a test detects with probability 1 - beta on its own pooled bins (call it on a testable test)."""
    return detectable_tv(r["draws"], categories=r["bins"], alpha=lt["alpha"], beta=lt["beta"])


def testable(r: dict) -> bool:
    """A chi-square test has power only with at least two pooled bins (one bin: statistic 0, p = 1 always)."""
    return r["bins"] >= 2


def format_lawtests(lt: dict, stale: dict | None = None) -> str:
    """The distribution tests, power per test on its own pooled bins; tests whose law has fewer than two
    pooled bins are "not testable", counted apart (never among the tests that could reject). ``stale``: the
    labels of methods measured under an earlier definition of their rule (``eval.stale_methods``), marked."""
    step = [r for r in lt["step"] if testable(r)]
    n_tests = len(step) + 2
    lines = [f"Distribution tests at alpha = {lt['alpha']:g} each; power on the pooled bins of each test (categories "
             f"with expected count < 5 pooled), as the TV detected with probability {1 - lt['beta']:.2g}. A law with "
             "fewer than two pooled bins gives a test with no power (statistic 0, p = 1 whatever the draws): "
             "\"not testable\", counted apart. Family: the "
             f"{n_tests} testable tests (verification step and decode loop; the controls excluded), Bonferroni: "
             f"P(any false rejection) <= {min(1.0, n_tests * lt['alpha']):.3g}.", "",
             "| test | kind | draws | testable | rejections (testable) | min p-value (testable) | detectable TV (own bins) |",
             "|---|---|---|---|---|---|---|"]
    by: dict[str, list] = {}
    for r in lt["step"]:
        by.setdefault(r["method"], []).append(r)
    for m, rs in by.items():
        ok = [r for r in rs if testable(r)]
        tv = [own_tv(r, lt) for r in ok]
        tvs = "-" if not tv else (f"{min(tv):.3f}" if min(tv) == max(tv) else f"{min(tv):.3f}-{max(tv):.3f}")
        tag = " (earlier definition: tested against that rule's exact law)" if m in (stale or {}) else ""
        lines.append(f"| {m}{tag}: first token vs exact law, {len(rs)} prompts | verification step | {rs[0]['draws']} | "
                     f"{len(ok)}/{len(rs)} | {sum(r['reject'] for r in ok)}/{len(ok)} | "
                     f"{min((r['pvalue'] for r in ok), default=float('nan')):.3g} | {tvs} |")
    c = lt["control"]
    lines.append(f"| control: SpS draws vs Cactus delta=1's law (TV between laws {min(r['tv_between_laws'] for r in c):.3f}"
                 f"-{max(r['tv_between_laws'] for r in c):.3f}) | verification step | {c[0]['draws']} | "
                 f"{sum(testable(r) for r in c)}/{len(c)} | {sum(r['reject'] for r in c if testable(r))}/"
                 f"{sum(testable(r) for r in c)} | {min(r['pvalue'] for r in c):.3g} | "
                 f"{max(own_tv(r, lt) for r in c if testable(r)):.3f} |")
    lo = lt["loop"]
    h, g = lo["sps_vs_verifier_3_tokens"], lo["cactus_second_token"]
    n_eff = lo["draws"] / 2
    h_tv = detectable_tv(n_eff, categories=h["bins"], alpha=lt["alpha"], beta=lt["beta"]) if testable(h) else None
    lines.append(f"| SpS vs verifier alone, first 3 tokens (homogeneity, {h['distinct_sequences']} sequences seen) | "
                 f"decode loop | {lo['draws']} each | {int(testable(h))}/1 | {int(h['reject'])}/{int(testable(h))} | "
                 f"{h['pvalue']:.3g} | {'-' if h_tv is None else f'{h_tv:.3f}'} |")
    lines.append(f"| Cactus delta=1 second token (the first one verified) vs exact law, given the most frequent "
                 f"first token | decode loop | {g['draws']} | {int(testable(g))}/1 | {int(g['reject'])}/{int(testable(g))} | "
                 f"{g['pvalue']:.3g} | {f'{own_tv(g, lt):.3f}' if testable(g) else '-'} |")
    for label, why in lt.get("untested", {}).items():
        lines.append(f"| {label}: not tested here ({why}) | - | - | - | - | - | - |")
    return "\n".join(lines)
