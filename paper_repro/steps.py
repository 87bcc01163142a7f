"""The reproduction's steps, registered once: everything that lists steps reads ``STEPS``.

``python -m paper_repro`` runs them in this order (``main``); its ``--only`` and ``--no-lm`` help, the
report's figure captions and per-step sections (``report``), README.md's findings for steps that write
their own (``findings``), the script table of ``paper_repro/README.md`` (``readme_table``, written between
its markers) and the recorded compute times all derive from it.

A step is a module ``paper_repro/<module>.py`` with ``run(ctx) -> StepResult`` (and, as every step,
``if __name__ == "__main__": standalone(run)``), plus one ``Step(...)`` line below. Optional hooks of the
module, found by name: ``section(data) -> str`` (a section of results of our own in REPORT.md) and
``findings(results, claims) -> list[str]`` (bullets for README.md's findings).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Step:
    """One step: ``id`` (the letter ``--only`` takes), ``module`` (under ``paper_repro``), ``makes``, ``item``
    (the paper's item) and ``cost`` (the README table's cells), ``lm`` (decodes with a language model: skipped
    by ``--no-lm``), ``figure`` (the stem of the PNG / SVG it draws, None for a table) with its report
    ``title`` and ``caption``, ``readme_image`` (the alt text of its image in README.md, None when not shown)
    ``section`` (its module writes a REPORT.md section of our own results: ``section(data)``) and ``findings``
    (its module adds bullets to README.md's findings: ``findings(results, claims)``)."""

    id: str
    module: str
    makes: str
    item: str = "-"
    cost: str = "-"
    lm: bool = False
    figure: str | None = None
    title: str | None = None
    caption: str | None = None
    readme_image: str | None = None
    section: bool = False
    findings: bool = False

    def __post_init__(self):
        if not (len(self.id) == 1 and self.id.isalpha() and self.id.islower()):
            raise ValueError(f"a step id is one lower-case letter, got {self.id!r}")
        if (self.figure is None) != (self.title is None) or (self.figure is None) != (self.caption is None):
            raise ValueError(f"step {self.id}: figure, title and caption go together")
        if self.readme_image is not None and self.figure is None:
            raise ValueError(f"step {self.id}: a README image needs a figure")


STEPS: list[Step] = [
    Step("a", "fig_a_worked_example",
         "`figures/fig_a_worked_example`: q, p and h as bars; SpS vs Cactus acceptance; KL spent",
         "the overview figure's worked example", "< 1 s", figure="fig_a_worked_example",
         title="a. The worked example",
         caption="q, p and the Cactus target h as bars; acceptance and KL spent at delta = 0.21 and at the budget "
                 "that gives the paper's .825."),
    Step("b", "fig_b_gamma",
         "`figures/fig_b_gamma`: gamma*(q_n, delta) Taylor vs exact root vs cvxpy (`optimize.solve_target`, six "
         "f-divergences); KL(h_taylor‖q)/delta over (q_n, delta) with Corollary 6's gamma* = 0.5 boundary",
         "Theorem 2, Corollaries 5 and 6", "~5 s", figure="fig_b_gamma", title="b. gamma*(q_n, delta)",
         caption="Taylor closed form vs exact KL root vs cvxpy; KL(h_taylor || q) / delta on a diverging scale "
                 "centred at 1 (red: the Taylor rule overspends) with Corollary 6's gamma* = 0.5 boundary.",
         readme_image="gamma*(q_n, delta)"),
    Step("d", "fig_d_gamma_delta",
         "`figures/fig_d_gamma_delta`: worst KL(h_alg‖q) found (`optimize.gamma_search`) vs delta for V = 3, 10, "
         "30, and random Dirichlet(0.3) pairs at V = 1000", "Theorem 3", "1-4 min", figure="fig_d_gamma_delta",
         title="d. Gamma(delta)",
         caption="lower bounds on the worst one-step KL(h_alg || q) vs delta for several V (running maximum over "
                 "delta: Gamma is non-decreasing).", readme_image="Gamma(delta)"),
    Step("e", "fig_e_lm",
         "`figures/fig_e_lm`: AL vs delta and vs k; exact per-step KL and verifier NLL vs AL for every rule; "
         "speedup vs delta", "accuracy-vs-acceptance figure, interpolation ablation, wall-clock", "(in lm_runs)",
         lm=True, figure="fig_e_lm", title="e. Real decoding",
         caption="AL vs delta and k; distortion and verifier NLL vs AL; speedup vs delta.",
         readme_image="real decoding"),
    Step("f", "table_f_main",
         "`results/table_f_main.md`: AL / Rej vs SpS / speedup / per-step KL / NLL per prompt style, next to the "
         "paper's main table", "main table", "< 1 s", lm=True),
    Step("c", "fig_c_tradeoff",
         "`figures/fig_c_tradeoff`: mean acceptance vs divergence of the exact one-step law from q, for Cactus "
         "(delta), TAS (epsilon), interpolation (alpha), top-k (k), EARS (beta) sweeps, on random pairs and on "
         "(p, q) rows of the embedded LM pair", "accuracy-vs-acceptance figure (per-step proxy)", "~5 s",
         figure="fig_c_tradeoff", title="c. Acceptance vs KL of the step's output law",
         caption="rule sweeps over random and LM-derived (p, q) pairs (exact one-step laws); the baselines are the "
                 "references' variants (vLLM's TAS entropy, the authors' top-k recovery).",
         readme_image="acceptance vs divergence"),
    Step("g", "table_g_production",
         "`results/table_g_production.md`: the production servers' lossy rules against Cactus at matched "
         "acceptance and cost", "-", "~15 s"),
    Step("h", "table_h_eval",
         "`figures/fig_h_eval`: task accuracy vs AL with 95% intervals; a reduced `cactus-theory eval` (48 "
         "problems; verifier alone, SpS, TAS, Cactus 0.75 and 1) and the distribution tests on the real LM; shows "
         "the committed full run (`make eval`, `results/eval/eval.json`) beside it when made with the same pair: a "
         "format-2 run (the replicated eval, issue 25) is read by its pre-registered protocol "
         "(`protocols/eval_v2.json`: non-inferiority against the pooled lossless runs at the protocol's margin), a "
         "format-1 run by the first design's rules",
         "main table (scores, AL, Rej), interpolation ablation, wall-clock", "~5 min with the batched loop",
         lm=True, figure="fig_h_eval", title="h. Task accuracy vs AL",
         caption="accuracy (95% Wilson interval) against AL (tokens per verifier call, bonus included; 95% "
                 "bootstrap interval) per rule, on the eval task (`cactus-theory eval`)."),
    Step("i", "fig_i_multi_draft",
         "`figures/fig_i_multi_draft`: **our result, not the paper's**: the best acceptance of K i.i.d. drafts "
         "when the step's law may move within KL(h‖q) <= delta (`optimize.solve_target_multi`), against K and "
         "delta; the optimum's shape; with one draft, every rule beside the optimum at its own step KL; the LP / "
         "dual cross-checks", "- (Hu et al.'s multi-draft LP, extended)", "~6 min (loaded)",
         figure="fig_i_multi_draft", title="i. Cactus with several drafts (our result)",
         caption="the best acceptance of K i.i.d. drafts with the step's law within KL(h || q) <= delta, against K "
                 "and delta (delta = 0: the lossless multi-draft optimum); the optimum's shape; with one draft, "
                 "every rule beside the optimum at its own step KL.",
         readme_image="Cactus with several drafts", section=True),
    Step("j", "table_j_dropmatch",
         "`results/table_j_dropmatch.md`: **our measurement**: DropMatch's exact step laws on teacher-forced rows "
         "of SmolLM2 (path law by Monte Carlo over dropout masks, jackknife errors), Cactus at equal acceptance, "
         "a short decoding run", "-", "LM step", lm=True, section=True),
    Step("k", "table_k_trees",
         "`results/table_k_trees.md`: **our result**: trees by exact law on toy pairs: EAGLE-style top-K "
         "multi-round verification's step KL (draft probability read vs taken as 1); tree Cactus (rounds, joint) "
         "as a share of the multi-draft optimum's gain at the same KL; block verification's losslessness and AL "
         "beside SpS (the real-LM rows: step l)", "-", "~15 s", section=True),
    Step("l", "table_l_lm_trees",
         "`results/table_l_lm_trees.md`: **our measurement**: trees on the real LM by exact law: EAGLE-style "
         "multi-round verification's step KL on teacher-forced rows (draft probability read vs taken as 1); the "
         "loop's first EAGLE-2 tree step (drafted tree, node laws, verification) against its exact block law "
         "(goodness of fit)", "-", "LM step", lm=True, section=True, findings=True),
    Step("m", "table_m_lossless",
         "`results/table_m_lossless.md`: **our check**: the decode loop lossless end to end in the eval's setting "
         "(ragged 32-row chat batch, 128 new tokens, EOS; chain and EAGLE-2 tree; float32 and bfloat16): every law "
         "handed to verify against fresh forwards, every draw replayed", "-", "LM step (about an hour)", lm=True,
         section=True, findings=True),
    Step("n", "table_n_lossless_law",
         "`results/table_n_lossless_law.md`: **our check**: SpS (chain and EAGLE-2 tree) against the verifier alone "
         "over whole answers (`check_generation`: per-position conditional tests along the prefix tree and the "
         "answer-level accuracy test), 24 questions x 100 decodes per method", "-", "LM step (about an hour)",
         lm=True, section=True, findings=True),
    Step("o", "table_o_sequence_budget",
         "`results/table_o_sequence_budget.md`: **our result**: `SequenceBudget` (a KL budget of 0.5 / 1 / 2 / 4 nats "
         "per answer, spend-down and Lagrangian allocations) against per-token Cactus at the delta that spends the "
         "same mean KL per answer: AL, accuracy, realised KL per answer (the certificate), the eval's setting",
         "-", "LM step (about 1.5 hours)", lm=True, section=True, findings=True),
    Step("p", "table_p_certificates",
         "`results/table_p_certificates.md`: **our check** of arXiv 2606.30265's exact KL certificates (strict greedy, "
         "additive / multiplicative relaxed, top-m, entropy-thresholded, greedy-tree top-m coverage): closed forms "
         "(`theory.certificates`) against cvxpy, margin bounds, the registry rules inside the radius",
         "- (arXiv 2606.30265)", "~1 min", section=True),
    Step("q", "table_q_graphcore_grid",
         "`results/table_q_graphcore_grid.md`: **our result**, by a pre-registered protocol "
         "(`protocols/graphcore_grid_v1.json`): relaxed-spec-dec-repro's relaxation grid (ens, spec-casc-opt / -tok, "
         "mentored-dec, spec-cont-dec, r-fuzzy, always-accept) at the one-step level, exact acceptance and KL per "
         "setting on random and LM-derived pairs, beside Cactus at equal KL; a verdict per rule",
         "- (relaxed-spec-dec-repro's grid, issue 42)", "~15 s", section=True),
]
"""The steps in run order (``c`` after ``e``: its LM panel reads the rows ``e`` saves)."""

# the README table's rows for the modules that are not steps: (file, what it makes, paper item, cost);
# ``lm_runs.py`` comes before the first LM step, the others after the steps
SUPPORT = [
    ("lm_runs.py", "the decoding runs (one per method and prompt style) shared by e and f, and "
                   "`results/lm_pairs.npz` for c", "-", "~5 min"),
    ("report.py", "`REPORT.md` and `results/claims.json`: each distinct claim, how we checked it, ours vs the "
                  "paper's number, verdict", "all", "< 1 s"),
    ("findings.py", "README.md's \"What the checks found\", generated from `results/*.json` (`python -m "
                    "paper_repro.findings`)", "-", "< 1 s"),
    ("main.py", "the `python -m paper_repro` command (the embedded draft is built by the first decoding step "
                "that must compute, when not cached: the committed build took about 15 minutes, "
                "`results/draft_build.json`; `--force` recomputes everything: `results/timings.json` lists each "
                "step's recorded compute time); runs `cactus_theory.claims.report.verify_claims` (randomised "
                "checks of Theorems 1-3, Proposition 4, Corollaries 5-6)", "-", "+ draft build"),
    ("common.py", "paths, fast mode, atomic cached results, resumable pieces, figure saving (the `Claim` row is "
                  "`cactus_theory.claims.ledger.Claim`)", "-", "-"),
    ("paper_numbers.py", "the paper's reported numbers, printed beside ours", "-", "-"),
]

_seen: set = set()
for _s in STEPS:
    if _s.id in _seen or _s.id == "verify":
        raise ValueError(f"step id {_s.id!r} is registered twice")
    _seen.add(_s.id)


def ids(steps: list[Step] | None = None) -> list[str]:
    """The step letters in run order."""
    return [s.id for s in (STEPS if steps is None else steps)]


def lm_ids(steps: list[Step] | None = None) -> list[str]:
    """The letters of the steps that decode with a language model."""
    return [s.id for s in (STEPS if steps is None else steps) if s.lm]


def by_module(steps: list[Step] | None = None) -> dict[str, Step]:
    return {s.module: s for s in (STEPS if steps is None else steps)}


def figure_text(steps: list[Step] | None = None) -> dict[str, tuple[str, str]]:
    """``{figure stem: (title, caption)}``: the report's figure captions."""
    return {s.figure: (s.title, s.caption) for s in (STEPS if steps is None else steps) if s.figure}


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def only_help(steps: list[Step] | None = None) -> str:
    return (f"comma-separated steps to (re)compute among {','.join(sorted(ids(steps)))},verify; the others are "
            "taken from their cache when present")


def no_lm_help(steps: list[Step] | None = None) -> str:
    return f"skip the language-model steps {_and(sorted(lm_ids(steps)))}"


TABLE_BEGIN = "<!-- steps: generated from paper_repro/steps.py by `python -m paper_repro.steps`; do not edit -->"
TABLE_END = "<!-- /steps -->"


def readme_table(steps: list[Step] | None = None) -> str:
    """The script table of ``paper_repro/README.md``: the steps by letter, ``lm_runs.py`` before the first
    LM step, then the other modules."""
    steps = sorted(STEPS if steps is None else steps, key=lambda s: s.id)
    rows = [("|", "script", "what it makes", "paper item", "cost (full, 2 CPU cores)")]
    first_lm = next((s.id for s in steps if s.lm), None)
    for s in steps:
        if s.id == first_lm:
            rows.append(("|", f"`{SUPPORT[0][0]}`", *SUPPORT[0][1:]))
        rows.append(("|", f"`{s.module}.py`", s.makes, s.item, s.cost))
    rows += [("|", f"`{f}`", m, i, c) for f, m, i, c in (SUPPORT if first_lm is None else SUPPORT[1:])]
    lines = ["| " + " | ".join(r[1:]) + " |" for r in rows]
    return "\n".join([lines[0], "|---|---|---|---|", *lines[1:]])


README = Path(__file__).resolve().parent / "README.md"


def update_readme(path: Path = README, steps: list[Step] | None = None) -> bool:
    """Write ``readme_table`` between the markers of ``path``; returns whether the file changed."""
    from cactus_theory.util.atomic import atomic_write_text

    text = path.read_text()
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise ValueError(f"{path} has no steps table ({TABLE_BEGIN!r} ... {TABLE_END!r})")
    head, rest = text.split(TABLE_BEGIN, 1)
    tail = rest.split(TABLE_END, 1)[1]
    new = f"{head}{TABLE_BEGIN}\n{readme_table(steps)}\n{TABLE_END}{tail}"
    if new != text:
        atomic_write_text(path, new)
    return new != text


if __name__ == "__main__":
    print(README.name, "updated" if update_readme() else "already up to date")
