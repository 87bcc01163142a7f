"""Fail closed (issue 41, item 8): the checkers and the certificates refuse what they cannot judge, by name,
before any work; a check that tested nothing says so (never "p = 1"); the TV interval's lower end and the
report header say what was run.

Statistical tests here: ``test_the_tv_interval_covers_a_large_deviation_on_a_rare_bin`` (coverage of a 95%
interval over 200 seeded draws, fixed seed; binomial(200, 0.95) falls below 186 with probability ~0.2%) and
the planted-difference checks of ``check_sampler`` below are deterministic (fixed seeds).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.cli import check_engine as ce
from cactus_theory.cli import main
from cactus_theory.core.draft_stop import DraftStop, check_draft_stop
from cactus_theory.core.exact import induced_distribution, step_divergence
from cactus_theory.sampler import verify
from cactus_theory.theory import certificates as C
from cactus_theory.theory.check import check_sampler, tv_interval
from cactus_theory.theory.check_generation import check_generation

pytestmark = pytest.mark.usefixtures("one_thread")


def _never(prompts, n, seed):
    raise AssertionError("the generator ran: the argument should have been refused first")


def _constant(token_lists):
    def generate(prompts, n, seed):
        return [list(t) for _ in prompts for t in (token_lists * n)[:n]]
    return generate


# -- check_generation: nothing tested ---------------------------------------------------------------------

def test_n_below_min_count_is_refused_before_generating():
    with pytest.raises(ValueError, match=r"n = 10 .*min_count = 20"):
        check_generation(_never, _never, ["p"], n=10, positions=2, min_count=20)


def test_a_check_that_tested_nothing_is_untested_not_p_1():
    """Decodes of one token: position 3 has no prefix at all, so nothing is tested."""
    res = check_generation(_constant([[1]]), _constant([[1]]), ["p"], n=30, positions=[3], min_count=20)
    assert res.verdict == "untested" and not res.tested and not res.reject
    assert math.isnan(res.pvalue) and "UNTESTED" in res.table() and "p = 1" not in res.table()
    assert json.loads(json.dumps(res.as_dict()))["verdict"] == "untested"
    assert ce.exit_status(res) == ce.EXIT_UNTESTED != 0


def test_check_engine_n_below_min_count_exits_2_in_one_line(capsys):
    rc = main(["check-engine", "--n", "5", "--min-count", "1000000"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--n 5" in err and "--min-count 1000000" in err


# -- check_sampler ------------------------------------------------------------------------------------------

P = np.array([[0.5, 0.3, 0.2]])
Q = np.array([[0.2, 0.3, 0.5], [0.1, 0.6, 0.3]])


@pytest.mark.parametrize("atol", [math.nan, math.inf, -1.0, -1e-12])
def test_exact_mode_refuses_a_non_finite_or_negative_atol(atol):
    with pytest.raises(ValueError, match=r"atol must be a finite number >= 0.*got"):
        check_sampler(ct.SpS(), P, Q, mode="exact", atol=atol)


def test_the_header_states_the_n_run_not_the_design():
    """With ``num_samples`` the header says N was set by it and quotes the TV detected at that N (the largest
    ``detectable_tv`` over the parts, recomputed here from the parts), not "sized for TV 0.02"."""
    res = check_sampler(verify, P, Q, num_samples=400, alpha=0.05, seed=1)
    head = res.table().splitlines()[0]
    det = max(p.detectable_tv for p in res.parts.values())
    assert "set by num_samples" in head and "sized for" not in head and f"{det:.4g}" in head and det > 0.02
    sized = check_sampler(verify, P, Q, tv=0.2, alpha=0.05, seed=1)
    head = sized.table().splitlines()[0]
    assert "sized for TV 0.2 at power 0.9" in head
    assert max(p.detectable_tv for p in sized.parts.values()) <= 0.2 + 1e-6


# -- the TV interval --------------------------------------------------------------------------------------

def test_the_tv_interval_lower_end_is_close_to_a_large_plug_in():
    """3,546 draws at TV 0.8 on four bins, one rare (e = 0.02): the old lower end was the chi-square bound
    ``sqrt(e_min l / n) / 2`` alone; the L1 deviation bound puts it within ``e / 2`` of the plug-in, with
    ``e = sqrt(2 (ln(2^4 - 2) + ln(1 / 0.0125)) / 3546)`` (Weissman et al., written out here)."""
    rng = np.random.default_rng(0)
    e = np.array([0.6, 0.3, 0.08, 0.02])
    p = np.array([0.05, 0.05, 0.1, 0.8])
    obs = rng.multinomial(3546, p)
    r = tv_interval(obs, e)
    margin = math.sqrt(2 * (math.log(2 ** 4 - 2) + math.log(1 / 0.0125)) / 3546)
    plug = 0.5 * np.abs(obs / 3546 - e).sum()
    assert r.low == pytest.approx(plug - margin / 2, abs=1e-9)
    assert r.low <= 0.8 <= r.high and r.low > 0.75


def test_the_tv_interval_covers_a_large_deviation_on_a_rare_bin():
    """TV 0.3 moved from the top bin onto a bin of mass 0.005 (8 bins, 4000 draws): the case where the
    noncentral chi-square approximation is poorest; the 95% interval covers in >= 186 of 200 seeded draws."""
    rng = np.random.default_rng(1)
    e = np.array([0.43, 0.05, 0.04, 0.2, 0.005, 0.0185, 0.1415, 0.115])
    e = e / e.sum()
    p = e.copy()
    p[0] -= 0.3
    p[4] += 0.3
    tv = 0.5 * np.abs(p - e).sum()
    hits = 0
    for _ in range(200):
        r = tv_interval(rng.multinomial(4000, p), e)
        hits += r.low <= tv + 1e-12 <= r.high + 1e-12
    assert hits >= 186, hits


# -- certificates -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, err, needle", [
    (lambda: C.pair_certificate(math.nan, 0.2), ValueError, r"^a must be .*nan"),
    (lambda: C.pair_certificate(5, 0, "reverse_kl"), ValueError, r"^a must be .*\[0, 1\].*5"),
    (lambda: C.pair_certificate(0.2, -0.1), ValueError, r"^b must be"),
    (lambda: C.pair_certificate(0.2, 0.3), ValueError, r"b must be <= a"),
    (lambda: C.pair_certificate(0.7, 0.6), ValueError, r"a \+ b must be <= 1"),
    (lambda: C.kl2(2), ValueError, r"^x must be .*\[0, 1\].*2"),
    (lambda: C.kl2(math.nan), ValueError, r"^x must be"),
    (lambda: C.certificate_cases(0, -1), ValueError, r"^n must be an integer >= 0, got -1"),
    (lambda: C.certificate_cases(-1, 3), ValueError, r"^seed must be"),
    (lambda: C.certificate_cases(0, 3, sizes=(1,)), ValueError, r"sizes\[i\] must be"),
    (lambda: C.rejected_tokens(np.array([0.5, 0.5]), "additive"), ValueError, r"'additive' needs the parameter delta"),
    (lambda: C.rejected_tokens(np.array([0.5, 0.5]), "entropy", epsilon=0.5), ValueError, r"needs the parameter alpha"),
])
def test_certificates_refuse_by_name(call, err, needle):
    with pytest.raises(err, match=needle):
        call()


def test_certificates_keep_their_values_inside_the_domain():
    """The closed forms, written out: ``-log(1 - (sqrt a - sqrt b)^2)`` and ``(a + b) kl_2((a - b) / (a + b))``."""
    a, b = 0.5, 0.2
    assert C.pair_certificate(a, b) == pytest.approx(-math.log(1 - (math.sqrt(a) - math.sqrt(b)) ** 2))
    x = (a - b) / (a + b)
    assert C.pair_certificate(a, b, "reverse_kl") == pytest.approx(
        (a + b) * 0.5 * ((1 + x) * math.log(1 + x) + (1 - x) * math.log(1 - x)))
    assert C.kl2(1) == pytest.approx(math.log(2)) and C.certificate_cases(0, 0) == []


# -- the scorer, DraftStop, step_divergence -----------------------------------------------------------------

def test_a_scorer_returning_a_string_is_named():
    def my_scorer(prompt, tokens):
        return "correct"

    with pytest.raises(TypeError, match=r"scorer my_scorer must return a real number.*'correct'.*str"):
        check_generation(_constant([[1]]), _constant([[1]]), ["p"], n=20, positions=1, scorer=my_scorer)


def test_a_scorer_outside_0_1_is_refused_for_the_equivalence_bound():
    with pytest.raises(ValueError, match=r"scorer <lambda> returned 2.0 .*\[0, 1\]"):
        check_generation(_constant([[1]]), _constant([[1]]), ["p"], n=20, positions=1, scorer=lambda p, t: 2,
                         equivalence=0.1)


@pytest.mark.parametrize("value", [np.float32(0.3), np.float64(0.3), np.array(0.3, dtype=np.float32)[()]])
def test_draft_stop_takes_numpy_real_scalars(value):
    assert DraftStop(value).threshold == float(value)
    assert check_draft_stop(value).threshold == float(value)


@pytest.mark.parametrize("value", [np.bool_(True), np.float32(1.5), np.float32("nan")])
def test_draft_stop_still_refuses_what_is_not_in_0_1(value):
    with pytest.raises(ValueError, match="threshold"):
        DraftStop(value)


def test_step_divergence_upcasts_bfloat16_rows_as_induced_distribution_does():
    """Reference: KL(h || q) summed by hand on the float64 upcast of the bfloat16 rows, renormalised."""
    p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.bfloat16)
    q = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.bfloat16)
    got = step_divergence(ct.SpS(), p, q)
    q64 = q.double().numpy()
    q64 = q64 / q64.sum(-1, keepdims=True)
    h = induced_distribution(ct.SpS(), p, q)
    ref = float(np.sum(np.where(h > 0, h * np.log(h / q64), 0.0)))
    assert got.shape == (1,) and got[0] == pytest.approx(ref, abs=1e-12)


# -- check-engine: --assistant-layers before the load, --quick ---------------------------------------------

def test_assistant_layers_beyond_the_verifier_is_refused_from_its_config(tmp_path, capsys, monkeypatch):
    """A model folder whose config says 30 layers: 999 is refused in ``check`` (no weights exist to load)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 30,
                                                      "hidden_size": 64, "intermediate_size": 128,
                                                      "num_attention_heads": 4, "vocab_size": 100}))
    monkeypatch.setattr(ce, "_load", lambda args: pytest.fail("the model was loaded before the check"))
    rc = main(["check-engine", "--engine", "transformers", "--verifier", str(tmp_path), "--assistant-layers", "999"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--assistant-layers must be in [1, 29]" in err and "999" in err


def _parsed(argv):
    import argparse

    parser = argparse.ArgumentParser()
    ce.configure(parser)
    args = parser.parse_args(argv)
    ce.check(args)
    return args


def test_quick_is_the_smallest_meaningful_run_and_explicit_flags_win():
    args = _parsed(["--quick"])
    assert (args.n, args.positions, args.max_new_tokens, len(args.prompts)) == (50, 2, 2, 1)
    assert args.n >= args.min_count  # position 0 and 1 can be tested
    args = _parsed(["--quick", "--n", "80", "--max-new-tokens", "4"])
    assert (args.n, args.positions, args.max_new_tokens) == (80, 2, 4)
    args = _parsed([])
    assert (args.n, args.positions, args.max_new_tokens, len(args.prompts)) == (500, 16, 32, 3)
