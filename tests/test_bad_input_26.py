"""Bad input found in issue 26's probe: each refused clearly, before any work (one regression test per
report; each failed on the code before the fix).

  * the command line: trees of depth 10^9 (a Python loop before the 256-node cap), a ``--draft`` that is a
    plain text file, the embedded draft not built (said after loading the verifier), and argument errors
    of ``verify`` / ``build-draft`` / ``eval`` that took seconds (torch, scipy imported first);
  * ``Cactus(delta, solver="exact").gamma`` on float16 / bfloat16 broke its own budget (the root was
    solved in the input dtype);
  * the ledger: NaN units, p-values outside [0, 1], empty or unknown verdicts, ``mcnemar_mdd(n=0)``;
  * trees: ``rerank``'s arguments, ``tree_block_law`` growing fewer nodes than the runtime at ``topk > V``,
    numpy scalars kept in tree shapes;
  * ``theory.stats``: ``n_boot = 0``, a KL estimate on a draw where ``q = 0``, non-integer categories,
    negative ``n``, a bool as a count.
"""

from __future__ import annotations

import ast
import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.claims.ledger import (
    all_of,
    bootstrap_interval,
    holm,
    interval_verdict,
    mcnemar_mdd,
)
from cactus_theory.core.rules import two_block_divergence, two_block_root
from cactus_theory.core.tree import BudgetTree, DynamicTree, rerank
from cactus_theory.core.tree_shapes import dynamic_tree_nodes
from cactus_theory.stats import (
    kl_estimate,
    paired_difference,
    power,
    proportion_interval,
    samples_needed,
    tv_estimate,
)

ROOT = Path(__file__).resolve().parents[1]
ERRORS = (ValueError, TypeError)

# -- the command line: one line, exit 2, before torch / scipy / cvxpy / transformers load ----------------

CLI_CASES = [
    (["decode", "--prompt", "x", "--tree-dynamic", "1000000000,1,1"], "makes 1000000000 nodes; at most 256"),
    (["decode", "--prompt", "x", "--tree", "1", "--tree-depth", "1000000000"], "at most 256 nodes kept and 4096 grown"),
    (["eval", "--out", "{tmp}/out", "--tree", "1", "--tree-depth", "1000000000"], "at most 256 nodes kept and 4096 grown"),
    (["check-engine", "--tree", "1", "--tree-depth", "1000000000"], "at most 256 nodes kept and 4096 grown"),
    (["decode", "--prompt", "x", "--draft", "{text}"], "is a file but not a GGUF model"),
    (["decode", "--prompt", "x", "--draft", "{text_gguf}"], "is a file but not a GGUF model"),
    (["decode", "--prompt", "x", "--draft", "{gguf_no_suffix}"], "must be named *.gguf"),
    (["decode", "--prompt", "x", "--verifier", "{folder}", "--draft", "smollm2"], "a folder without config.json"),
    (["build-draft", "--verifier", "{text}"], "is a file but not a GGUF model"),
    (["decode", "--prompt", "x"], "the embedded draft is not built yet"),
    (["eval", "--out", "{tmp}/out"], "the embedded draft is not built yet"),
    (["eval", "--out", "{tmp}/out", "--draft-path", "{text}"], "is not a draft checkpoint this project can load"),
    (["verify", "--cases", "0"], "--cases"),
    (["build-draft", "--epochs", "1.5"], "--epochs"),
    (["eval", "--rules", "nosuch"], "--rules: unknown ['nosuch']"),
    (["eval", "--rounds", "3"], "--rounds goes with --wall-clock"),
    (["eval", "--wall-clock", "--sweep"], "--wall-clock and --sweep are two runs"),
    (["eval", "--wall-clock", "--rounds", "2"], "rounds: at least 5 in the protocol's wall clock, 2 in this run"),
]
HEAVY = ("torch", "scipy", "cvxpy", "transformers")
SLOW_S = 10.0  # per refusal, generous for a busy 2-core machine: the depth-10^9 trees took > 60 s before

PROBE = """
import io, contextlib, sys, time
from cactus_theory.cli import main
for argv in {cases!r}:
    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    print(repr((argv, rc, err.getvalue(), time.perf_counter() - t0,
                sorted(m for m in {heavy!r} if m in sys.modules))), flush=True)
"""


def test_cli_refuses_bad_trees_files_and_arguments_at_once(tmp_path):
    """Every case: exit status 2, one line naming the problem, in well under ``SLOW_S`` seconds, and none of
    torch, scipy, cvxpy, transformers imported by then (the cases run in one process, in order, so an
    import by any case shows in every later one)."""
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a model\n")
    text_gguf = tmp_path / "fake.gguf"
    text_gguf.write_text("not GGUF either\n")
    gguf_no_suffix = tmp_path / "model.bin"
    gguf_no_suffix.write_bytes(b"GGUF" + bytes(16))
    folder = tmp_path / "folder"
    folder.mkdir()
    subs = {"{text}": str(text), "{text_gguf}": str(text_gguf), "{gguf_no_suffix}": str(gguf_no_suffix),
            "{folder}": str(folder), "{tmp}": str(tmp_path)}
    cases = [[subs.get(a, a.replace("{tmp}", str(tmp_path))) for a in argv] for argv, _ in CLI_CASES]
    env = {**os.environ, "CACTUS_THEORY_CACHE": str(tmp_path / "empty-cache"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE.format(cases=cases, heavy=HEAVY)], capture_output=True,
                         text=True, cwd=ROOT, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    results = [ast.literal_eval(line) for line in out.stdout.splitlines()]
    assert len(results) == len(CLI_CASES), out.stdout[-2000:]
    for (argv, rc, err, secs, heavy), (_, needle) in zip(results, CLI_CASES, strict=True):
        assert rc == 2, (argv, rc, err)
        assert err.count("\n") == 1 and err.startswith("cactus-theory") and "Traceback" not in err, (argv, err)
        assert needle in err, (argv, err)
        assert secs < SLOW_S, (argv, secs)
        assert heavy == [], (argv, heavy)


def test_the_file_checks_accept_what_the_project_loads(tmp_path):
    """The other side of the file checks: a GGUF file (its magic), a model folder (config.json) and a
    ``torch.save`` file pass, before anything loads."""
    from cactus_theory.lm.draft_config import check_draft_file
    from cactus_theory.lm.loading import check_model

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(28))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for spec in (str(gguf), str(folder), "smollm2", "embedded", "org/name"):
        check_model(spec, "--draft")
    pt = tmp_path / "draft.pt"
    torch.save({"format": 0}, pt)
    check_draft_file(str(pt), "--draft-path")
    with pytest.raises(ValueError, match="no such file"):
        check_draft_file(str(tmp_path / "none.pt"), "--draft-path")


def test_tree_node_counts_are_arithmetic_and_equal_the_level_sizes():
    """``dynamic_tree_nodes`` (closed form) against the sum of the level sizes (the recurrence walked), on
    every small shape; a depth of 10^9 is counted at once (it looped for minutes before)."""
    for d, w, c in itertools.product(range(1, 9), range(1, 10), range(1, 6)):
        assert dynamic_tree_nodes(d, w, c) == sum(DynamicTree(d, w, c).level_sizes()) == DynamicTree(d, w, c).nodes
    assert dynamic_tree_nodes(10**9, 1, 1) == 10**9
    assert BudgetTree(1, 10**9, 4).grown == 4 + (10**9 - 1) * 16
    assert DynamicTree(10**9, 3, 2).nodes == 2 + 4 + 6 * (10**9 - 2)  # 2, min(3, 2) 2 = 4, then min(3, 4) 2 = 6


@pytest.mark.parametrize("make", [lambda v: BudgetTree(v), lambda v: BudgetTree(8, v), lambda v: DynamicTree(v, 2, 2),
                                  lambda v: DynamicTree(2, v, 2), lambda v: DynamicTree(2, 2, v)])
def test_tree_shapes_store_python_ints_and_refuse_non_integers(make):
    t = make(np.int64(5))
    assert all(type(getattr(t, f)) is int for f in t.__dataclass_fields__) and t == make(5)
    for bad in (True, np.bool_(True), 5.0, "5"):
        with pytest.raises(ERRORS, match="must be an integer >= 1"):
            make(bad)


# -- Cactus's exact root in low precision keeps its budget ---------------------------------------------

Q_GRID = np.concatenate([[0.0, 1e-6, 1e-3, 0.5, 1 - 1e-3, 1.0], np.linspace(0.0, 1.0, 401)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, np.float32, np.float16])
@pytest.mark.parametrize("div", ["kl", "reverse_kl", "js", "chi2", "hellinger", "tv"])
def test_exact_gamma_in_low_precision_keeps_its_budget(dtype, div):
    """``Cactus(delta, solver="exact").gamma`` on a low-precision ``q_n`` returns that dtype and keeps
    ``D(h || q) <= delta`` (float64's tolerance 1e-12 of tests/core/test_rules.py, D evaluated in float64 at
    the returned gamma and the given q_n). Before: solved in the input dtype, D / delta up to 5e3 in
    bfloat16 at delta = 1e-6 (kl, reverse_kl). The returned gamma is the float64 root rounded down: the
    largest value of the dtype not above it."""
    q = torch.tensor(Q_GRID).to(dtype) if isinstance(dtype, torch.dtype) else Q_GRID.astype(dtype)
    q64 = q.double() if isinstance(q, torch.Tensor) else q.astype(np.float64)
    for delta in (1e-8, 1e-6, 1e-4, 0.05, 1.0):
        g = ct.Cactus(delta, div, solver="exact").gamma(q)
        assert g.dtype == q.dtype
        g64 = g.double() if isinstance(g, torch.Tensor) else g.astype(np.float64)
        d = two_block_divergence(g64, q64, div)
        assert float((d - delta).max()) <= 1e-12, (delta, float((d / delta).max()))
        assert bool((g64 >= q64).all()) and bool((g64 <= 1).all())
        root = two_block_root(q64, delta, div)  # the float64 root
        assert bool((g64 <= root).all())
        if isinstance(g, torch.Tensor):
            up = torch.nextafter(g, torch.ones_like(g)).double()
        else:
            up = np.nextafter(g, np.ones_like(g)).astype(np.float64)
        assert bool(((up > root) | (g64 == 1)).all())  # rounded down, not further: the next value is above the root


def test_exact_gamma_in_float64_is_unchanged():
    """float64 takes the same path as before (bit for bit): the committed results do not move."""
    q = torch.tensor(Q_GRID)
    for div in ("kl", "reverse_kl", "chi2"):
        a = ct.Cactus(0.1, div, solver="exact").gamma(q)
        b = two_block_root(q, 0.1, div)
        assert a.dtype == torch.float64 and torch.equal(a, b)
        assert np.array_equal(ct.Cactus(0.1, div, solver="exact").gamma(Q_GRID), two_block_root(Q_GRID, 0.1, div))


# -- the ledger ----------------------------------------------------------------------------------------

def test_a_nan_unit_is_refused_never_dropped():
    """Before: the NaN unit's resamples were dropped and the interval of the rest read "holds"."""
    units = np.array([1.0, 1.2, 0.9, np.nan, 1.1, 1.0])
    for bad in (units, np.where(np.isnan(units), np.inf, units), np.stack([units, np.ones(6)], 1)):
        with pytest.raises(ValueError, match=r"units must be finite: unit\(s\) \[3\]"):
            bootstrap_interval(bad)
    finite = bootstrap_interval(np.nan_to_num(units, nan=1.0))
    assert interval_verdict(finite) == "holds"  # the same data without the NaN: a real verdict
    with pytest.raises(ValueError, match="n_boot must be an integer >= 1"):
        bootstrap_interval(np.ones(6), n_boot=0)
    with pytest.raises(ValueError, match="level must be in"):
        bootstrap_interval(np.ones(6), level=1.0)
    from cactus_theory.claims.ledger import t_interval

    with pytest.raises(ValueError, match="x must be finite"):
        t_interval([0.1, np.nan, 0.2])


@pytest.mark.parametrize("ps, needle", [([2.0, -1.0], r"\[2.0, -1.0\]"), ([0.1, np.nan], "nan"),
                                        ([np.inf], "inf"), ([-1e-12, 0.5], "-1e-12"), (["a"], "numbers")])
def test_holm_refuses_what_is_not_a_p_value(ps, needle):
    """Before: holm([2, -1]) returned [1, 0] and NaN became 1."""
    with pytest.raises(ValueError, match=f"pvalues must be.*{needle}"):
        holm(ps)
    from cactus_theory.stats import holm as stats_holm

    with pytest.raises(ValueError, match="pvalues must be"):
        stats_holm(ps)


def test_all_of_an_empty_or_unknown_family_is_never_holds():
    """Before: all_of([]) and all_of(["holds", "bogus"]) returned "holds"."""
    assert all_of([]) == "out of reach"
    assert all_of(iter([])) == "out of reach"
    with pytest.raises(ValueError, match="'bogus'"):
        all_of(["holds", "bogus"])
    with pytest.raises(ValueError, match="'Holds'"):
        all_of(["Holds"])


@pytest.mark.parametrize("kw, needle", [(dict(n=0), "n must be an integer >= 1"), (dict(n=2.5), "n must be an integer"),
                                        (dict(n=True), "n must be an integer"),
                                        (dict(discordance=1.5), "discordance must be"),
                                        (dict(discordance=np.nan), "discordance must be"),
                                        (dict(alpha=0.0), "alpha must be in"), (dict(power=1.0), "power must be in")])
def test_mcnemar_mdd_refuses_bad_arguments(kw, needle):
    """Before: n = 0 raised ZeroDivisionError."""
    args = dict(discordance=0.2, n=100) | kw
    with pytest.raises(ERRORS, match=needle):
        mcnemar_mdd(args.pop("discordance"), args.pop("n"), **args)


# -- trees ---------------------------------------------------------------------------------------------

def _logpath_parents():
    parents = np.array([[-1, -1, 0, 0, 1]])
    logpath = np.log(np.array([[0.6, 0.4, 0.3, 0.2, 0.35]]))
    return logpath, parents


@pytest.mark.parametrize("as_torch", [False, True])
def test_rerank_refuses_bad_arguments(as_torch):
    """Before: keep > N raised torch's "expanded size" RuntimeError, keep = -1 a broadcast error, and
    logpath / parents of other shapes returned silently."""
    lp, par = _logpath_parents()
    conv = (lambda a: torch.from_numpy(a)) if as_torch else (lambda a: a)
    lp, par = conv(lp), conv(par)
    order, kept = rerank(lp, par, 3)  # the valid call: the three likeliest nodes 0, 1, 4; 4's parent 1 -> 1
    assert np.asarray(order).tolist() == [[0, 1, 4]] and np.asarray(kept).tolist() == [[-1, -1, 1]]
    for keep, needle in ((6, r"keep must be an integer in \[0, N = 5\]"), (-1, "keep must be an integer >= 0"),
                         (2.0, "keep must be an integer"), (True, "keep must be an integer")):
        with pytest.raises(ERRORS, match=needle):
            rerank(lp, par, keep)
    for a, b in ((lp[:, :4], par), (lp, par[:, :4]), (lp[0], par), (lp[:, :0], par[:, :0])):
        with pytest.raises(ValueError, match="one shape"):
            rerank(a, b, 2)
    with pytest.raises(ValueError, match=r"node indices in \[-1, N = 5\)"):
        rerank(lp, par * 0 + 7, 2)
    with pytest.raises(ValueError, match="must hold integers"):
        rerank(lp, par * 1.0, 2)
    nan = lp.clone() if as_torch else lp.copy()
    nan[0, 2] = math.nan
    with pytest.raises(ValueError, match="logpath has NaN"):
        rerank(nan, par, 2)
    other = par.numpy() if as_torch else torch.from_numpy(par)
    with pytest.raises(ValueError, match="must both be torch tensors or both numpy arrays"):
        rerank(lp, other, 2)


def test_budget_tree_law_raises_as_the_runtime_when_topk_exceeds_v():
    """``BudgetTree(4, 2, 4)`` at V = 3: the runtime's ``grow_tree`` raises; the exact law silently grew
    3 candidates per node and returned a law. Both now raise the same ValueError."""
    from cactus_theory.lm.cache import grow_tree
    from cactus_theory.theory.toy import random_pair
    from cactus_theory.theory.tree import budget_tree, tree_block_law

    draft, verifier = random_pair(3, 2)
    tree = BudgetTree(4, 2, 4)
    needle = "a node has more than V = 3 deterministic children"
    with pytest.raises(ValueError, match=needle):
        tree_block_law(draft, verifier, ct.SpS(), tree, "deterministic")
    with pytest.raises(ValueError, match=needle):
        budget_tree(draft, tree)
    p0 = torch.full((1, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=needle):
        grow_tree(p0, lambda tok, par, lo: torch.full((1, tok.shape[1], 3), 1 / 3, dtype=torch.float64), tree,
                  "deterministic", None)
    ok = tree_block_law(draft, verifier, ct.SpS(), BudgetTree(4, 2, 3), "deterministic")  # topk = V: fine
    assert abs(sum(ok.values()) - 1) < 1e-12


# -- theory.stats ----------------------------------------------------------------------------------------

P3 = np.array([0.5, 0.3, 0.2])


def test_n_boot_zero_is_refused():
    """Before: IndexError from an empty resample array."""
    x = np.array([0, 1, 2, 0, 1, 0])
    for call in (lambda: tv_estimate(x, P3, n_boot=0), lambda: kl_estimate(x, P3, n_boot=0),
                 lambda: paired_difference([0, 1, 1], [1, 1, 0], n_boot=0),
                 lambda: tv_estimate(x, P3, n_boot=2.5), lambda: paired_difference([0, 1], [1, 1], n_boot=True)):
        with pytest.raises(ERRORS, match="n_boot must be an integer >= 1"):
            call()


def test_kl_estimate_on_a_draw_where_q_is_zero_is_a_certain_infinity():
    """Before: estimate inf with a NaN interval. A draw where q = 0 proves KL(P || q) = inf: the estimate
    and both ends are inf (a valid interval, of coverage 1), and the method says why; TV stays finite."""
    q = np.array([0.6, 0.4, 0.0])
    x = np.array([0, 1, 0, 2, 1, 0, 0, 1])
    r = kl_estimate(x, q)
    assert (r.estimate, r.low, r.high) == (math.inf, math.inf, math.inf) and "q = 0" in r.method
    assert not any(math.isnan(v) for v in r)
    t = tv_estimate(x, q)
    assert math.isfinite(t.estimate) and t.low <= t.estimate <= t.high
    r0 = kl_estimate(np.array([0, 1, 0, 1, 1, 0]), q)  # no draw where q = 0: finite, as before
    assert math.isfinite(r0.estimate) and r0.low <= r0.estimate <= r0.high


@pytest.mark.parametrize("call, needle", [
    (lambda: samples_needed(0.1, categories=2.5), "categories must be an integer >= 2"),  # before: 222
    (lambda: samples_needed(0.1, categories=True), "categories must be an integer >= 2"),
    (lambda: power(100, 0.1, categories=2.5), "categories must be an integer >= 2"),
    (lambda: power(-5, 0.1, categories=3), "n must be a finite number >= 0"),  # before: NaN
    (lambda: power(math.nan, 0.1, categories=3), "n must be a finite number >= 0"),
    (lambda: power(True, 0.1, categories=3), "n must be a finite number"),
    (lambda: power(10, math.nan, categories=3), r"eps must be in \(0, 1\]"),
    (lambda: samples_needed(1.5, categories=3), r"eps must be in \(0, 1\]"),
    (lambda: proportion_interval(True, 3), "successes must be an integer"),  # before: accepted as 1
    (lambda: proportion_interval(1, True), "n must be an integer"),
    (lambda: proportion_interval(1.0, 3), "successes must be an integer"),
    (lambda: proportion_interval(4, 3), r"successes must be an integer in \[0, n=3\]"),
])
def test_stats_refuse_what_is_not_a_count_or_a_size(call, needle):
    with pytest.raises(ERRORS, match=needle):
        call()


def test_stats_accept_numpy_integers_alike():
    assert samples_needed(0.1, categories=np.int64(3)) == samples_needed(0.1, categories=3)
    assert power(np.int64(50), 0.1, categories=3) == power(50, 0.1, categories=3) == power(50.0, 0.1, categories=3)
    a, b = proportion_interval(np.int64(2), np.int32(7)), proportion_interval(2, 7)
    assert (a.estimate, a.low, a.high) == (b.estimate, b.low, b.high)
    assert power(0, 0.1, categories=3) == pytest.approx(0.05, rel=1e-9)  # no draws: the test's level
