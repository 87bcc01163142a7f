"""Bad input gets a ValueError that names the argument (and shows the bad value)."""

import numpy as np
import pytest
import torch

import cactus_theory as ct
from cactus_theory.claims.report import verify_claims
from cactus_theory.optimize import gamma_search, max_acceptance, solve_target
from cactus_theory.rules import EARS, TAS, Cactus, Interpolation, SpS, TopK
from cactus_theory.theory.cases import make_pair

P = np.array([0.2, 0.3, 0.5])
Q = np.array([0.4, 0.4, 0.2])
N = np.asarray(1)
RULES = [SpS(), Cactus(0.5), Cactus(0.5, "tv", "exact"), TAS(), TopK(2), Interpolation(0.5), EARS(0.5)]


def _bad_rows():
    nan = P.copy()
    nan[0] = np.nan
    return [
        (np.array([-0.1, 0.6, 0.5]), "negative"),
        (nan, "NaN"),
        (np.array([0.2, 0.3, 0.6]), "not normalised"),
        (np.array([0.2, 0.3, 0.5 + 2e-6]), "not normalised"),  # beyond float64's 1e-6 tolerance
    ]


@pytest.mark.parametrize("rule", RULES, ids=repr)
@pytest.mark.parametrize("bad,what", _bad_rows())
@pytest.mark.parametrize("which", ["p", "q"])
def test_bad_probabilities(rule, bad, what, which):
    args = {"p": P, "q": Q, which: bad}
    for method in (rule.accept_prob, rule.residual):
        with pytest.raises(ValueError, match=rf"^{which} .*{what}"):
            method(args["p"], args["q"], N)
    with pytest.raises(ValueError, match=rf"^{which} .*{what}"):
        ct.induced_distribution(rule, args["p"], args["q"])
    with pytest.raises(ValueError, match=rf"^{which} .*{what}"):
        ct.acceptance_rate(rule, args["p"], args["q"])


def test_integer_rows_rejected_by_rules_cast_by_exact():
    with pytest.raises(ValueError, match="^p must hold floating-point probabilities"):
        SpS().accept_prob(np.array([1, 0, 0]), Q, N)
    # the exact-analysis entry points cast to float64 first (documented in exact.py)
    np.testing.assert_allclose(ct.induced_distribution(SpS(), np.array([1, 0, 0]), Q), Q, atol=1e-15)


def test_tolerance_by_dtype():
    off = np.array([0.2, 0.3, 0.5 + 5e-7])
    assert float(SpS().accept_prob(off, Q, N)) > 0  # within float64's 1e-6
    p32 = torch.tensor([0.2, 0.3, 0.5 + 5e-5], dtype=torch.float32)
    q32 = torch.tensor(Q, dtype=torch.float32)
    assert float(SpS().accept_prob(p32, q32, torch.tensor(1))) > 0  # within float32's 1e-4
    with pytest.raises(ValueError, match=r"^p is not normalised.*tolerance 0\.0001"):
        SpS().accept_prob(torch.tensor([0.2, 0.3, 0.5 + 3e-4], dtype=torch.float32), q32, torch.tensor(1))
    half = torch.tensor([0.2, 0.3, 0.505], dtype=torch.float16)  # within half's 1e-2
    assert float(SpS().accept_prob(half, q32.half(), torch.tensor(1))) > 0


def test_mismatched_shapes():
    with pytest.raises(ValueError, match=r"p and q must have the same shape.*\(3,\).*\(4,\)"):
        SpS().accept_prob(P, np.full(4, 0.25), N)
    with pytest.raises(ValueError, match="h and q must have the same shape"):
        ct.divergence(P, np.full(4, 0.25), "kl")
    with pytest.raises(ValueError, match="p and h must have the same shape"):
        max_acceptance(P, np.full(4, 0.25))
    with pytest.raises(ValueError, match="p and q must have the same shape"):
        solve_target(Q, 0, 0.1, p=np.full(4, 0.25))
    with pytest.raises(ValueError, match=r"^n must have shape \(2,\)"):
        SpS().accept_prob(np.stack([P, P]), np.stack([Q, Q]), N)


@pytest.mark.parametrize("n", [-1, 3, 10])
def test_token_out_of_range(n):
    with pytest.raises(ValueError, match=rf"^n has token ids out of range \[0, 3\).*{n}"):
        Cactus(0.2).target(P, Q, np.asarray(n))
    with pytest.raises(ValueError, match=r"^n has token ids out of range"):
        solve_target(Q, n, 0.1)


def test_token_must_be_integer():
    with pytest.raises(ValueError, match="^n must hold integer token ids"):
        SpS().accept_prob(P, Q, np.asarray(1.0))
    with pytest.raises(ValueError, match="^n must hold integer token ids"):
        SpS().accept_prob(torch.tensor(P), torch.tensor(Q), torch.tensor(1.0))


@pytest.mark.parametrize("delta", [-0.1, float("nan"), float("inf"), "0.1"])
def test_bad_delta(delta):
    with pytest.raises(ValueError, match="^delta must"):
        Cactus(delta)
    with pytest.raises(ValueError, match="^delta must"):
        solve_target(Q, 0, delta)
    with pytest.raises(ValueError, match="^delta must"):
        gamma_search(delta, 3)


def test_unknown_divergence_solver_rule():
    with pytest.raises(ValueError, match="^divergence must be one of.*'bogus'"):
        Cactus(0.1, "bogus", "exact")
    with pytest.raises(ValueError, match="^solver must be.*'newton'"):
        Cactus(0.1, "kl", "newton")
    with pytest.raises(ValueError, match="^solver='taylor'.*divergence='chi2'"):
        Cactus(0.1, "chi2", "taylor")
    with pytest.raises(ValueError, match="^divergence must be one of.*'bogus'"):
        ct.divergence(P, Q, "bogus")
    with pytest.raises(ValueError, match="^divergence must be one of.*'cross_entropy'"):
        solve_target(Q, 0, 0.1, "cross_entropy")
    with pytest.raises(ValueError, match="^divergence must be one of.*'bogus'"):
        gamma_search(0.1, 3, "bogus")
    with pytest.raises(ValueError, match="^rule must be one of.*'bogus'"):
        ct.make_rule("bogus")  # ("medusa" is a rule since issue 11)


def test_bad_rule_parameters():
    with pytest.raises(ValueError, match="^epsilon must be a positive number"):
        TAS(epsilon=0.0)
    with pytest.raises(ValueError, match="^alpha must be a positive number"):
        TAS(alpha=-1.0)
    with pytest.raises(ValueError, match="^k must be an integer >= 1"):
        TopK(0)
    with pytest.raises(ValueError, match=r"^alpha must be in \[0, 1\]"):
        Interpolation(1.5)
    with pytest.raises(ValueError, match="^beta must"):
        EARS(-0.2)


def test_bad_arguments_of_helpers():
    with pytest.raises(ValueError, match="^q must be one distribution"):
        solve_target(np.stack([Q, Q]), 0, 0.1)
    with pytest.raises(ValueError, match="^V must be an integer >= 2"):
        gamma_search(0.1, 1)
    with pytest.raises(ValueError, match="^starts must be an integer >= 1"):
        gamma_search(0.1, 3, starts=0)
    with pytest.raises(ValueError, match="^kind must be one of"):
        make_pair("weird", 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="^cases must be an integer >= 1"):
        verify_claims(0, 0)
    with pytest.raises(ValueError, match="^q contains NaN"):
        solve_target(np.array([np.nan, 0.5, 0.5]), 0, 0.1)


def test_crashes_became_clear_errors():
    """Each of these used to crash with an AttributeError / TypeError deep inside, or silently clamp."""
    from cactus_theory.sampler import verify

    with pytest.raises(ValueError, match="^p must be a numpy array or a torch tensor, got list"):
        SpS().accept_prob([0.2, 0.3, 0.5], Q, N)
    with pytest.raises(ValueError, match="^q must be a numpy array or a torch tensor, got tuple"):
        Cactus(0.5).target(P, (0.4, 0.4, 0.2), N)
    with pytest.raises(ValueError, match="^p and q must both be numpy arrays or both torch tensors"):
        SpS().accept_prob(P, torch.tensor(Q), N)
    with pytest.raises(ValueError, match="^n must be a torch tensor when p and q are"):
        SpS().accept_prob(torch.tensor(P), torch.tensor(Q), N)
    with pytest.raises(ValueError, match=r"^rule must be a cactus_theory Rule.*'cactus'.*make_rule"):
        ct.induced_distribution("cactus", P, Q)
    with pytest.raises(ValueError, match="^rule must be a cactus_theory Rule.*None"):
        ct.acceptance_rate(None, P, Q)
    with pytest.raises(ValueError, match="^rule must be a cactus_theory Rule"):
        ct.step_divergence("sps", P, Q)
    with pytest.raises(ValueError, match="^generator must be a torch.Generator, a RowGenerators \\(one per row\\) or None, got 123"):
        verify(torch.tensor([[1]]), torch.tensor(P).view(1, 1, 3), torch.tensor(np.stack([Q, Q])).view(1, 2, 3),
               SpS(), generator=123)
    with pytest.raises(ValueError, match="^k must be an integer >= 1, got True"):
        TopK(True)
    with pytest.raises(ValueError, match="^k must be <= the vocabulary size V = 3"):
        TopK(10**6).accept_prob(P, Q, N)
    with pytest.raises(ValueError, match="^k must be <= the vocabulary size V = 3"):
        ct.induced_distribution(TopK(4), P, Q)
    with pytest.raises(ValueError, match="^entropy_eps must be finite and >= 0"):
        TAS(entropy_eps=-1e-5)
    with pytest.raises(ValueError, match="^epsilon must be a positive number, got True"):
        TAS(epsilon=True)
    with pytest.raises(ValueError, match="^cases must be an integer >= 1, got True"):
        verify_claims(0, True)
    with pytest.raises(ValueError, match="^seed must be a non-negative integer or None"):
        verify_claims(-1, 3)
