"""Issue 42's ports, each against an independent reference written here in its upstream's own letters.

relaxed-spec-dec-repro (``rules.GRAPHCORE_PIN``) and Modular MAX (``rules.MAX_PIN``) call the target (verifier) ``p``
and the draft ``q``; the references below keep those names (``target``, ``draft``) and are called with
``target = q``, ``draft = p`` (the paper's letters), so a port that kept upstream's letters disagrees. Every reference
is exact (no sampling): acceptance probabilities, recovery laws and the one-step law enumerated from the formula,
over generated rows with zeros on either side, exact ties and one-hot rows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cactus_theory import registry
from cactus_theory.core import rules as R
from cactus_theory.exact import acceptance_rate, induced_distribution, relaxed_bonus_distribution

ATOL = 1e-12


# -- generated cases ------------------------------------------------------------------------------------------------

def _row(rng, V, kind):
    if kind == "random":
        return rng.dirichlet(np.full(V, 0.7))
    if kind == "zeros":
        x = rng.dirichlet(np.ones(V))
        x[rng.choice(V, size=V // 2, replace=False)] = 0.0
        return x / x.sum()
    if kind == "ties":
        x = rng.choice([1.0, 2.0, 2.0, 4.0], size=V)
        return x / x.sum()
    if kind == "onehot":
        return np.eye(V)[rng.integers(V)]
    raise ValueError(kind)


KINDS = ("random", "zeros", "ties", "onehot")


def cases(seed=42, per=2):
    """``(p, q)`` pairs: every combination of row kinds on either side, V in {2, 4, 7}, plus p = q and disjoint
    supports."""
    rng = np.random.default_rng(seed)
    out = []
    for V in (2, 4, 7):
        for a in KINDS:
            for b in KINDS:
                for _ in range(per if "random" in (a, b) else 1):
                    out.append((_row(rng, V, a), _row(rng, V, b)))
        x = _row(rng, V, "random")
        out.append((x, x.copy()))
        e = np.zeros(V)
        e[: V // 2] = 1
        out.append((e / e.sum(), (1 - e) / (1 - e).sum()))
    return out


CASES = cases()


def _normalised(r, fallback):
    r = np.maximum(r, 0.0)
    return r / r.sum() if r.sum() > 0 else fallback


def _law(phi, recover, draft):
    """``sum_x draft_x [phi_x e_x + (1 - phi_x) g_x]`` from per-token ``phi`` (V,) and ``recover(x)`` (V,)."""
    V = draft.size
    out = np.zeros(V)
    for x in range(V):
        if draft[x] > 0:
            out[x] += draft[x] * phi[x]
            out += draft[x] * (1 - phi[x]) * recover(x)
    return out


def _ratio_step(pi, draft):
    """vLLM's generic rejector towards a target row ``pi`` (upstream letters): accept iff ``draft_x > 0`` and
    ``pi_x / draft_x >= u``; recover from ``(pi - draft)_+``."""
    phi = np.array([min(1.0, pi[x] / draft[x]) if draft[x] > 0 else 0.0 for x in range(pi.size)])
    return phi, lambda x: _normalised(pi - draft, pi)


def _check(rule, p, q, phi_ref, recover_ref, law_ref=None):
    """The rule's phi (numpy and torch float64) at every drafted token, its recovery law wherever it has weight and
    its exact one-step law, against the reference."""
    V = p.size
    live = [n for n in range(V) if p[n] > 0]
    np.testing.assert_allclose(rule.accept_prob_all(p, q)[live], phi_ref[live], rtol=0, atol=ATOL)
    pt, qt = torch.from_numpy(p), torch.from_numpy(q)
    np.testing.assert_allclose(rule.accept_prob_all(pt, qt).numpy()[live], phi_ref[live], rtol=0, atol=ATOL)
    for n in live:
        np.testing.assert_allclose(rule.accept_prob(p, q, np.asarray(n)), phi_ref[n], rtol=0, atol=ATOL)
        if p[n] * (1 - phi_ref[n]) > 1e-12:
            np.testing.assert_allclose(rule.residual(p, q, np.asarray(n)), recover_ref(n), rtol=0, atol=ATOL)
    law = _law(phi_ref, recover_ref, p)
    np.testing.assert_allclose(induced_distribution(rule, p, q), law, rtol=0, atol=ATOL)
    if law_ref is not None:
        np.testing.assert_allclose(law, law_ref, rtol=0, atol=ATOL)


def _grid(key):
    return [r for _, r in registry.sweep(key)]


# -- relaxed-spec-dec-repro ------------------------------------------------------------------------------------------

def upstream_opt_target(target, draft, alpha):
    """``spec_cascade_opt_defer_mask`` + ``apply_spec_cascade_opt_constraint`` (processed gate)."""
    tv = np.clip(target - draft, 0, None).sum()
    return target.copy() if draft.max() < target.max() - alpha * tv else draft.copy()


def test_cascade_opt_against_upstream():
    for rule in _grid("cascade_opt") + [R.CascadeDefer(0.5), R.CascadeDefer(-1.0)]:
        for p, q in CASES:
            pi = upstream_opt_target(q, p, rule.alpha)
            _check(rule, p, q, *_ratio_step(pi, p), law_ref=pi)  # Theorem 1: the law is the target itself


def _log(x):
    with np.errstate(divide="ignore"):
        return np.log(x)


def upstream_tok3_target(target, draft, alpha):
    """``spec_cascade_tok3_top_mask_from_logits`` on log-probability logits + ``apply_spec_cascade_tok3_constraint``."""
    logits = _log(target)
    finite = np.isfinite(logits)
    if alpha == 0:
        top = np.zeros(target.size, bool)
        top[int(np.argmax(np.where(finite, logits, -np.inf)))] = True
        top &= finite
    elif alpha == 1:
        top = finite
    else:
        top = finite & (logits >= logits.max() + math.log1p(-alpha))
    eta = np.where(top, 0.0, draft).sum()
    return np.where(top, draft, 0.0) + eta * target


def test_tok3_against_upstream():
    for rule in _grid("tok3") + [R.Tok3(1.0), R.Tok3(0.5)]:
        for p, q in CASES:
            pi = upstream_tok3_target(q, p, rule.alpha)
            assert abs(pi.sum() - 1) < 1e-12
            _check(rule, p, q, *_ratio_step(pi, p), law_ref=pi)


def test_tok3_alpha_zero_keeps_one_maximum_of_tied_maxima():
    q = np.array([0.1, 0.4, 0.4, 0.1])
    p = np.full(4, 0.25)
    h = R.Tok3(0.0).target(p, q, np.asarray(0))
    np.testing.assert_allclose(h, [0.75 * 0.1, 0.25 + 0.75 * 0.4, 0.75 * 0.4, 0.75 * 0.1], atol=ATOL)


def upstream_mentored(target, draft, alpha):
    """``lossy_spec_decode_beta1_accept_ratio`` / ``_residual_probs`` and the kernel's ``LOSSY_MODE``."""
    phi = np.array([min(1.0, target[x] / ((1 - alpha) * draft[x])) if draft[x] > 0 else 0.0
                    for x in range(target.size)])
    return phi, lambda x: _normalised(target - draft, target)


def test_mentored_against_upstream_and_equal_to_lenience():
    for rule in _grid("mentored") + [R.Mentored(0.0)]:
        for p, q in CASES:
            _check(rule, p, q, *upstream_mentored(q, p, rule.alpha))
            np.testing.assert_allclose(induced_distribution(rule, p, q),
                                       induced_distribution(R.Lenience(1 - rule.alpha), p, q), rtol=0, atol=ATOL)
    p, q = CASES[5]
    np.testing.assert_allclose(induced_distribution(R.Mentored(0.0), p, q), q, atol=ATOL)  # alpha = 0 is SpS


def upstream_scd_target(z_expert, z_amateur, beta, tau, alpha):
    """``scd_alpha_gate_from_logits`` + ``apply_scd_constraint`` on logits."""
    gate = np.isfinite(z_expert) & (z_expert >= z_expert.max() + tau * math.log(alpha)) if alpha > 0 \
        else np.isfinite(z_expert)
    scores = np.where(gate, ((1 + beta) * z_expert - beta * z_amateur) / tau, -np.inf)
    w = np.where(gate, np.exp(scores - scores.max()), 0.0)
    return w / w.sum()


def _softmax(z):
    w = np.exp(z - z.max())
    return w / w.sum()


def test_scd_on_probabilities_is_upstream_on_logits():
    """Random logits of both models, shifted by arbitrary constants: the rule on ``q = softmax(z_E / tau)``,
    ``p = softmax(z_A / tau)`` gives upstream's contrastive target, and its one-step law is that target."""
    rng = np.random.default_rng(7)
    for rule in _grid("scd") + [R.SCD(0.0, 0.5), R.SCD(2.0, 0.0), R.SCD(0.5, 1.0)]:
        for V in (2, 5, 8, 13):
            for _ in range(4):
                z_e, z_a = rng.normal(0, 2, V) + rng.normal(0, 5), rng.normal(0, 2, V) + rng.normal(0, 5)
                tau = float(rng.choice([0.6, 1.0, 1.7]))
                q, p = _softmax(z_e / tau), _softmax(z_a / tau)
                pi = upstream_scd_target(z_e, z_a, rule.beta, tau, max(rule.alpha, 0.0))
                np.testing.assert_allclose(rule.target(p, q, np.asarray(0)), pi, rtol=0, atol=1e-12)
                _check(rule, p, q, *_ratio_step(pi, p), law_ref=pi)


def test_scd_zero_draft_on_the_gate_is_the_limit():
    """A draft row with zeros on the gate is read as the limit ``p_i = e -> 0`` at every such token alike."""
    q = np.array([0.4, 0.3, 0.2, 0.1])
    p = np.array([0.0, 0.5, 0.0, 0.5])
    for beta in (0.1, 0.5, 1.0):
        rule = R.SCD(beta, 0.1)
        h0 = rule.target(p, q, np.asarray(1))
        e = 1e-200
        pe = np.array([e, 0.5 - e, e, 0.5 - e])
        w = q ** (1 + beta) / pe ** beta
        np.testing.assert_allclose(h0, w / w.sum(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(h0, np.array([0.4, 0, 0.2, 0]) ** (1 + beta) / (0.4 ** (1 + beta) + 0.2 ** (
            1 + beta)), atol=1e-15)
    np.testing.assert_allclose(R.SCD(0.0, 0.0).target(p, q, np.asarray(1)), q, atol=1e-15)  # beta = 0: q on its support


def test_scd_on_generated_rows_against_the_formula():
    for rule in _grid("scd"):
        for p, q in CASES:
            gate = (q > 0) & (q >= rule.alpha * q.max())
            holes = gate & (p == 0)
            live = holes if holes.any() else gate
            w = np.zeros(q.size)
            for i in np.flatnonzero(live):
                w[i] = q[i] ** (1 + rule.beta) * (1.0 if holes.any() else p[i] ** -rule.beta)
            pi = w / w.sum()
            _check(rule, p, q, *_ratio_step(pi, p), law_ref=pi)


TINY32 = float(np.finfo(np.float32).tiny)


def upstream_js(target, draft):
    """``fsd_divergence_scores(..., "js")`` (its clamps at float32's tiny), in float64."""
    m = 0.5 * (target + draft)
    t, d, mm = np.maximum(target, TINY32), np.maximum(draft, TINY32), np.maximum(m, TINY32)
    return 0.5 * ((target * (np.log(t) - np.log(mm))).sum() + (draft * (np.log(d) - np.log(mm))).sum())


def test_rfuzzy_against_upstream():
    for rule in _grid("rfuzzy") + [R.RFuzzy(0.0), R.RFuzzy(1.0)]:
        for p, q in CASES:
            js = upstream_js(q, p)
            if abs(js - rule.threshold) < 1e-9:
                continue  # a tie within rounding of upstream's log differences
            pi = p.copy() if js <= rule.threshold else q.copy()  # rfsd_use_draft_mask + apply_rfsd_constraint
            _check(rule, p, q, *_ratio_step(pi, p), law_ref=pi)
    assert float(R.js_divergence(np.array([1.0, 0]), np.array([0, 1.0]))) == pytest.approx(math.log(2), abs=1e-15)


def test_relaxed_T_qp_bonus_is_one_step_of_the_rule_at_the_bonus_row():
    """Upstream's ``relaxed_T_qp`` bonus (``RejectionSampler.apply_relaxed_bonus``), enumerated: OPT and r-fuzzy pick
    the draft's or the verifier's own bonus sample by the gate (law: the chosen row), Tok3 and SCD sample the target
    row, mentored decoding runs one accept / residual step on the draft's bonus sample. ``relaxed_bonus_distribution``
    is each of these; the registry's rules keep upstream's default, the verifier's row (``target_p``)."""
    for p, q in CASES[::3]:
        np.testing.assert_allclose(relaxed_bonus_distribution(R.CascadeDefer(0.05), p, q),
                                   upstream_opt_target(q, p, 0.05), atol=ATOL)
        js = upstream_js(q, p)
        if abs(js - 0.2) > 1e-9:
            np.testing.assert_allclose(relaxed_bonus_distribution(R.RFuzzy(0.2), p, q), p if js <= 0.2 else q, atol=ATOL)
        np.testing.assert_allclose(relaxed_bonus_distribution(R.Tok3(0.35), p, q), upstream_tok3_target(q, p, 0.35),
                                   atol=ATOL)
        phi, rec = upstream_mentored(q, p, 0.7)
        np.testing.assert_allclose(relaxed_bonus_distribution(R.Mentored(0.7), p, q), _law(phi, rec, p), atol=ATOL)
        for key in ("cascade_opt", "tok3", "mentored", "scd", "rfuzzy"):
            np.testing.assert_array_equal(registry.make(key).bonus(q), q)  # target_p, upstream's default


# -- Modular MAX -----------------------------------------------------------------------------------------------------

def upstream_max_eps(target, draft, eps, recovery):
    """``RejectionSampler``: rejected iff ``draft_logit > target_logit + eps`` (log-probability logits); the
    recovered and bonus token is ``topk_fused_sampling`` of the target (``top_k = 1``: its argmax)."""
    rejected = _log(draft) > _log(target) + eps
    g = np.eye(target.size)[int(np.argmax(target))] if recovery == "argmax" else target.copy()
    return (~rejected).astype(float), lambda x: g


def test_max_eps_against_upstream():
    for rule in _grid("max_eps") + [R.MaxEps(0.3, "q"), R.MaxEps(1e-5)]:
        for p, q in CASES:
            phi, rec = upstream_max_eps(q, p, rule.eps, rule.recovery)
            _check(rule, p, q, phi, rec)
            np.testing.assert_allclose(rule.bonus(q), rec(0), atol=0)


def upstream_max_sampled(target, draft, x):
    """``_sampled_draft_verdict`` at drafted token ``x``: ``rejected = u q_eff >= p_target``, ``q_eff`` the draft's
    probability or 1 where it is 0; the residual subtracts the draft's row, or a one-hot of ``x``."""
    has = draft[x] > 0
    q_eff = draft[x] if has else 1.0
    accept = min(1.0, target[x] / q_eff)  # P(u q_eff < p_target), u uniform on [0, 1)
    mass = draft if has else np.eye(target.size)[x]
    return accept, _normalised(target - mass, target)


def test_max_sampled_against_upstream_and_lossless():
    rule = registry.make("max_sampled")
    for p, q in CASES:
        V = p.size
        for n in range(V):  # every token, p_n = 0 included: MAX's row without a draft law
            a, g = upstream_max_sampled(q, p, n)
            assert float(rule.accept_prob(p, q, np.asarray(n))) == pytest.approx(a, abs=ATOL)
            if 1 - a > 1e-12:
                np.testing.assert_allclose(rule.residual(p, q, np.asarray(n)), g, rtol=0, atol=ATOL)
            if p[n] == 0:  # a token drafted outside p (deterministically: p = e_n) is judged so: its one-step law is q
                np.testing.assert_allclose(a * np.eye(V)[n] + (1 - a) * g, q, atol=ATOL)
        np.testing.assert_allclose(induced_distribution(rule, p, q), q, atol=ATOL)
        np.testing.assert_allclose(acceptance_rate(rule, p, q), np.minimum(p, q).sum(), atol=ATOL)
    pt, qt = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64), torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert float(rule.accept_prob(pt, qt, torch.tensor(0))) == pytest.approx(0.2)


def test_sample_and_match_by_enumerating_the_verifier_sample():
    """``y ~ q``; accept iff ``y = n``, else emit ``y``: enumerate ``y`` for each ``n``."""
    rule = registry.make("sample_match")
    for p, q in CASES:
        V = q.size
        for n in range(V):
            if p[n] == 0:
                continue
            accept = sum(q[y] for y in range(V) if y == n)
            emitted = np.array([q[y] if y != n else 0.0 for y in range(V)])
            assert float(rule.accept_prob(p, q, np.asarray(n))) == pytest.approx(accept, abs=ATOL)
            if 1 - accept > 1e-12:
                np.testing.assert_allclose(rule.residual(p, q, np.asarray(n)), emitted / emitted.sum(), atol=ATOL)
        np.testing.assert_allclose(induced_distribution(rule, p, q), q, atol=ATOL)  # lossless
        np.testing.assert_allclose(acceptance_rate(rule, p, q), (p * q).sum(), atol=ATOL)  # q_n, not min(1, q_n / p_n)


# -- the registry's declarations -----------------------------------------------------------------------------------

UPSTREAM_GRIDS = {"cascade_opt": (-0.1, 0.0, 0.05), "tok3": (0.0, 0.35, 0.8), "mentored": (0.95, 0.7, 0.3),
                  "scd": (0.1, 0.5, 1.0), "rfuzzy": (0.05, 0.2, 0.3)}


def test_registry_declarations():
    for key, grid in UPSTREAM_GRIDS.items():
        assert registry.spec(key).sweep[1] == grid, key  # the repository's own grids
        assert not registry.spec(key).lossless
    assert registry.spec("max_sampled").lossless and registry.spec("sample_match").lossless
    assert not registry.spec("max_eps").lossless
    for key in ("cascade_opt", "tok3", "scd", "rfuzzy"):
        assert registry.spec(key).cls.reads_draft_row  # the engines pass the draft's rows
    assert not R.MaxEps.bonus_from_q and R.MaxEps().bonus(np.array([0.2, 0.5, 0.3])).tolist() == [0, 1, 0]


@pytest.mark.parametrize("make", [lambda: R.Tok3(1.5), lambda: R.Tok3(-0.1), lambda: R.Mentored(1.0),
                                  lambda: R.Mentored(-0.1), lambda: R.SCD(-1.0), lambda: R.SCD(0.5, 1.5),
                                  lambda: R.RFuzzy(-0.1), lambda: R.MaxEps(-1.0), lambda: R.MaxEps(0.1, "top"),
                                  lambda: R.CascadeDefer(math.nan)])
def test_bad_parameters_are_refused(make):
    with pytest.raises(ValueError):
        make()


def test_float32_torch_rows_agree_with_float64():
    rng = np.random.default_rng(3)
    P = rng.dirichlet(np.ones(50), size=6)
    Q = rng.dirichlet(np.ones(50) * 0.5, size=6)
    for key in ("cascade_opt", "tok3", "mentored", "scd", "rfuzzy", "max_eps", "max_sampled", "sample_match"):
        for rule in _grid(key):
            a64 = rule.accept_prob_all(P, Q)
            a32 = rule.accept_prob_all(torch.from_numpy(P).float(), torch.from_numpy(Q).float()).double().numpy()
            assert np.abs(a32 - a64).max() < 1e-4, (key, rule)
