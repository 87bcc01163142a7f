"""The conformance harness's shared pieces: the rule catalogue (from the registry), the capability
table (which entry point runs which rule, by declared flags), the generated cases and the replays.

A replay recomputes what an entry point must emit from the uniforms it is documented to draw (its
seeded generators are replayed with the same calls) and the law written independently in
``cactus_theory.theory.reference`` (``reference_step``: ``phi_n`` and ``g_n`` from the formulas,
``reference_bonus``, ``reference_rule_gamma``), walking the algorithm the entry point documents:
accept draft ``j`` iff ``u_j < phi``, emit by inverse CDF at the documented column. A decision is
exact unless ``u`` falls within ``tol`` of ``phi`` or of a CDF boundary of the emitted law (``tol``
by dtype: 1e-9 for float64 rows, 2e-5 for rows computed in float32); such a row is counted
ambiguous and left out, and every test asserts that few rows are.

Nothing here imports the code it judges beyond the public entry points and the reference module.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, settings

from cactus_theory import registry
from cactus_theory.rules import Rule
from cactus_theory.theory.reference import (
    COVERED,
    reference_bonus,
    reference_rule_gamma,
    reference_step,
)

# -- profile -------------------------------------------------------------------------------------------------

DEEP = int(os.environ.get("CONFORMANCE_EXAMPLES", "0") or 0)
"""``CONFORMANCE_EXAMPLES=N``: every harness test runs at least ``N`` hypothesis examples (the deep
profile; the default lane keeps ``make test`` within its budget)."""


def profile(examples: int):
    """Hypothesis settings of one harness test: derandomized (the same cases every run), no deadline,
    ``max(examples, CONFORMANCE_EXAMPLES)`` examples, no shrinking (a case is a seed and a few choices:
    the first failing one is reported as drawn, and replays exactly)."""
    return settings(max_examples=max(examples, DEEP), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True,
                    phases=(Phase.explicit, Phase.reuse, Phase.generate))


# -- the rule catalogue --------------------------------------------------------------------------------------

# every registry rule with a one-step law: one added later is covered without editing the harness. A rule that
# declares ``stateful`` (SequenceBudget) has a whole decode's law, not one step's: the one-step entry points refuse
# it without its state (tests/conformance/test_rule_laws.py) and its law is the toy loops' (tests/theory/test_budget.py)
RULE_KEYS = tuple(k for k, s in registry.RULES.items() if not s.stateful)
STATEFUL_KEYS = tuple(k for k, s in registry.RULES.items() if s.stateful)
FLOAT_VALUES = (0.0, 1e-5, 0.125, 0.25, 0.5, 1.0, 2.0)
INT_VALUES = (0, 1, 2, 3, 5)


@cache
def configurations(key: str) -> tuple[Rule, ...]:
    """Every valid configuration of registry rule ``key`` over a grid of its declared parameters: each
    parameter's default, its choices, the family's sweep values and, by type, ``FLOAT_VALUES`` /
    ``INT_VALUES``; combinations the constructor refuses are dropped. The registry's own sweep first."""
    s = registry.spec(key)
    names, grid = [], []
    for prm in s.params:
        vals = {s.default(prm.name)}
        vals |= set(prm.choices or ())
        if prm.name == s.sweep[0]:
            vals |= set(s.sweep[1])
        if prm.type is float:
            vals |= set(FLOAT_VALUES)
        elif prm.type is int:
            vals |= set(INT_VALUES)
        names.append(prm.name)
        grid.append(sorted(vals, key=repr))
    out: dict[str, Rule] = {repr(r): r for _, r in s.sweep_rules()}
    for combo in itertools.product(*grid):
        try:
            r = s.make(**dict(zip(names, combo, strict=True)))
        except (ValueError, TypeError):
            continue
        out.setdefault(repr(r), r)
    return tuple(out.values())


def float_params(rule: Rule, dtype: torch.dtype = torch.float64) -> list[float]:
    """The rule's float parameters in (0, 1): values a row's entries are tied to (``param_ties``). Only for rows
    computed in float64: a float32 row holds ``float32(t)``, which the entry point compares with ``t`` rounded
    to float32 (equal) and the float64 reference with ``t`` (not equal), a tie that float32 cannot resolve."""
    if dtype != torch.float64:
        return []
    s = registry.spec(rule)
    return sorted({float(getattr(rule, p.name)) for p in s.params if p.type is float
                   and 0 < float(getattr(rule, p.name)) < 1})


@cache
def min_vocab(rule: Rule) -> int:
    """The smallest vocabulary the rule accepts (TopK refuses ``k > V``): tried on uniform rows."""
    for V in range(2, 65):
        row = np.full(V, 1.0 / V)
        try:
            rule_for_rows(rule, row[None], row[None], np.random.default_rng(0)).accept_prob_all(row[None], row[None])
        except ValueError:
            continue
        return V
    raise AssertionError(f"{rule!r} accepts no vocabulary up to 64")


def reads_head(rule: Rule) -> bool:
    return bool(rule.reads_head)


def rule_for_rows(rule: Rule, P: np.ndarray, Q: np.ndarray, rng: np.random.Generator, hit=None):
    """The rule that judges rows ``(P, Q)`` (..., V): itself, or, for a rule that declares ``reads_head``,
    the rule bound to one hit per row (``rule.at(hit)``, the documented way to give it its dropout paths;
    a mixture of realised 0/1 indicators and probabilities unless ``hit`` is given)."""
    if not reads_head(rule):
        return rule
    if hit is None:
        hit = rng.uniform(size=Q.shape)
        hit = np.where(rng.uniform(size=Q.shape[:-1] + (1,)) < 0.5, (hit < 0.3).astype(float), hit)
    return rule.at(hit)


def row_rule(rule: Rule, hit_row=None) -> Rule:
    """The rule of one row for the reference: a bound rule is re-bound to that row's ``hit`` (V,)."""
    if hit_row is None or not reads_head(rule):
        return rule
    return rule.at(np.asarray(hit_row, dtype=np.float64))


# -- the capability table -------------------------------------------------------------------------------------

ENTRY_POINTS = ("verify", "verify_flat", "verify_tree[rounds]", "verify_tree[joint]", "verify_block", "vllm_v1",
                "vllm_v2", "transformers", "dropmatch_tap", "sample_rows")


def refusal(entry: str, rule: Rule) -> str | None:
    """Why ``entry`` does not run ``rule``, read from the rule's declared capabilities (None: it runs it),
    as a regular expression its refusal message must match. A rule that declares ``reads_head`` runs on
    the ``(p, q)`` entry points bound to its hit (``rule.at(hit)``); the engine hooks, which see no LM-head
    input, refuse it."""
    if entry == "verify_tree[joint]" and not rule.two_block:
        return "joint.*two-block rule"
    if entry == "verify_block" and registry.spec(rule).key != "sps":
        # Sun et al.'s block verification is SpS's alone: a lossless rule with another one-step test (sample-and-match,
        # MAX's sampled verdict) is refused like every lossy one
        return "block verification is lossless speculative sampling"
    if entry in ("vllm_v1", "vllm_v2", "transformers") and reads_head(rule):
        return "LM head"
    if entry in ("vllm_v1", "vllm_v2") and not rule.bonus_from_q:
        return "bonus"
    if entry == "dropmatch_tap" and not reads_head(rule):
        return "bind"  # the tap binds nothing: Rule.bind returns the rule itself (asserted)
    return None


# -- tolerances and one decision -------------------------------------------------------------------------------

def tolerance(dtype: torch.dtype) -> float:
    """How close ``u`` may come to a threshold before a replayed decision is called ambiguous: rows
    computed in float64 agree with the reference to ~1e-15, rows computed in float32 to ~1e-7."""
    return 1e-9 if dtype == torch.float64 else 2e-5


@dataclass
class Judge:
    """Counts decided and ambiguous replays; ``accept`` / ``draw`` return None when ambiguous."""

    tol: float
    decided: int = 0
    ambiguous: int = 0

    def accept(self, u: float, phi: float) -> bool | None:
        if abs(u - phi) < self.tol:
            return None
        return u < phi

    def draw(self, w, u: float) -> int | None:
        """Inverse CDF as ``sampler.sample_rows`` documents it: the first ``y`` with ``cdf[y] > u * total``,
        capped at the last token of positive mass; None when ``u * total`` is within ``tol`` of a boundary."""
        w = np.maximum(np.asarray(w, dtype=np.float64), 0.0)
        c = np.cumsum(w)
        total = c[-1]
        assert total > 0, "an emission law with no mass"
        t = u * total
        y = int(np.searchsorted(c, t, side="right"))
        last = int(np.flatnonzero(w > 0)[-1])
        y = min(y, last)
        near = [abs(c[y] - t)] + ([abs(c[y - 1] - t)] if y > 0 else [])
        if min(near) < self.tol * total:
            return None
        return y

    def done(self, ok: bool | None):
        if ok is None:
            self.ambiguous += 1
        else:
            self.decided += 1

    def check_coverage(self, max_share: float = 0.2) -> None:
        """At most ``max_share`` of this example's replayed rows were ambiguous (plus one)."""
        total = self.decided + self.ambiguous
        assert self.ambiguous <= max_share * total + 1, (self.ambiguous, total)


class Tally(list):
    """The judges of one test's examples: ``check`` asserts that the test replayed some decision at all."""

    def judge(self, tol: float) -> Judge:
        j = Judge(tol)
        self.append(j)
        return j

    def check(self) -> None:
        assert sum(j.decided for j in self) > 0, "no replayed decision in any example"


def pair_tie(rule: Rule, p, q, n: int, u: float, judge: Judge) -> bool:
    """A rule that reads the pair of rows (``reads_draft_row``: FSD's divergence) may decide by the rows' exact
    equality (FSD at ``threshold = 0`` accepts iff ``p = q``), which rounding keeps or breaks: equal rows with
    two or more positive entries, renormalised (without replacement's rounds) or read back from a float32
    softmax, differ by an ulp on one side of the comparison and not on the other. Where every entry of ``p``
    is within 8 ulps (of the rows' dtype, by ``judge.tol``) of ``q``'s, a decision that the equal pair
    ``(q, q)`` and ``q`` nudged by those ulps decide differently is ambiguous (True)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if not rule.reads_draft_row or np.count_nonzero(q > 0) < 2:
        return False  # a one-hot row survives renormalisation and softmax exactly
    ulps = 8 * float(np.finfo(np.float32 if judge.tol > 1e-9 else np.float64).eps)
    if np.any(np.abs(p - q) > ulps * np.maximum(np.abs(p), np.abs(q))):
        return False
    nudged = q * (1 + ulps * np.where(np.arange(q.size) % 2 == 0, 1.0, -1.0))
    return judge.accept(u, reference_step(rule, q, q, n)[0]) != judge.accept(u, reference_step(rule, nudged, q, n)[0])


def chain(rule_of, ns, P, Q, us, last: float, judge: Judge, bonus=None, bonus_law=None, Q32=None):
    """One request's block by the documented chain walk: draft ``j`` (``ns[j]``, -1 padded: always
    rejected, recovered from ``q``) is accepted iff ``us[j] < phi_j``; the first rejection emits from
    ``g_j`` at uniform ``last``; all accepted: ``bonus`` (an id) or a draw from ``bonus_law`` at ``last``.
    ``rule_of(j)`` is position ``j``'s rule. Returns the token list or None (ambiguous).

    ``Q32``: where the entry point computes ``q`` itself in float32 from logits, that row as it documents
    computing it (read in float64). A rule whose ``phi`` jumps (a threshold on ``q``'s entries, FSD's test on
    the pair of rows) can decide a row whose statistic sits on its threshold in float64 (the ``ties`` rows)
    either way after float32's rounding: a decision that the float64 row and ``Q32`` decide differently is
    ambiguous (``judge.accept`` tolerates only ``u`` near ``phi``, not ``phi`` itself moving by 1); so is one
    that ``pair_tie`` finds on rows equal up to rounding."""
    out = []
    for j, n in enumerate(ns):
        n = int(n)
        if n < 0:
            y = judge.draw(Q[j], last)
            return None if y is None else out + [y]
        phi, g = reference_step(rule_of(j), P[j], Q[j], n)
        a = judge.accept(float(us[j]), phi)
        if a is None:
            return None
        if Q32 is not None and judge.accept(float(us[j]), reference_step(rule_of(j), P[j], Q32[j], n)[0]) != a:
            return None
        if pair_tie(rule_of(j), P[j], Q[j], n, float(us[j]), judge):
            return None
        if not a:
            y = judge.draw(g, last)
            return None if y is None else out + [y]
        out.append(n)
    if bonus_law is not None:
        y = judge.draw(bonus_law, last)
        return None if y is None else out + [y]
    return out + [int(bonus)]


def chain_support(rule_of, ns, P, Q, got: list[int], tol: float, bonus=None, bonus_law=None,
                  Q32=None) -> str | None:
    """For a request whose uniforms are not replayable (torch's default generator): the emitted block is
    one the law allows: accepted drafts had ``phi > 0``, the stop had ``phi < 1`` and its token has
    positive mass in the recovery (or bonus) law. Returns a description of the violation or None.
    ``Q32`` (as ``chain``): a step is allowed where the float64 row or ``Q32`` allows it, or, where
    ``pair_tie`` finds rows equal up to rounding, the equal pair ``(q, q)``."""

    def readings(j):
        out = [(P[j], Q[j])] + ([] if Q32 is None else [(P[j], Q32[j])])
        if pair_tie(rule_of(j), P[j], Q[j], max(int(ns[j]), 0), 0.5, Judge(tol)):
            out.append((Q[j], Q[j]))
        return out

    a = len(got) - 1
    for j in range(a):
        if got[j] != int(ns[j]) or int(ns[j]) < 0:
            return f"position {j}: emitted {got[j]}, drafted {int(ns[j])}"
        phi = max(reference_step(rule_of(j), Pr, Qr, int(ns[j]))[0] for Pr, Qr in readings(j))
        if phi <= 0:
            return f"position {j}: draft {int(ns[j])} accepted at phi = 0"
    y = got[a]
    if a < len(ns):
        n = int(ns[a])
        if n < 0:
            law = Q[a]
        else:
            steps = [reference_step(rule_of(a), Pr, Qr, n) for Pr, Qr in readings(a)]
            if min(phi for phi, _ in steps) >= 1:
                return f"position {a}: draft {n} rejected at phi = 1"
            law = np.maximum.reduce([g for _, g in steps])
        if law[y] <= 0:
            return f"position {a}: emitted {y} outside the recovery law's support"
        return None
    if bonus_law is not None:
        return None if bonus_law[y] > 0 else f"bonus {y} outside the bonus law's support"
    return None if y == int(bonus) else f"bonus {y}, caller's {int(bonus)}"


# -- rows --------------------------------------------------------------------------------------------------

FAMILIES = ("random", "p_eq_q", "zeros_in_p", "zeros_in_q", "disjoint", "onehot_p", "onehot_q", "near_degenerate",
            "ties", "param_ties", "qn_one_noisy", "tiny")
LARGE_FAMILIES = ("random", "zeros_in_p", "zeros_in_q", "near_degenerate", "ties", "p_eq_q")


def one_hot(V: int, ids) -> np.ndarray:
    """``e_i`` (V,) for an id, or the rows ``e_{ids}`` (len(ids), V) for an array of ids (no V x V identity)."""
    ids = np.asarray(ids)
    out = np.zeros(ids.shape + (V,))
    np.put_along_axis(out, ids[..., None].astype(np.int64), 1.0, axis=-1)
    return out


def _dirichlet(rng, V):
    x = rng.dirichlet(np.full(V, float(rng.choice([0.1, 0.3, 1.0, 3.0]))))
    x = np.where(x < 1e-300, 0.0, x)
    if x.sum() <= 0:
        x[rng.integers(V)] = 1.0
    return x / x.sum()


def _ties(rng, V, values=(1, 2, 3, 4)):
    x = rng.choice(np.asarray(values, dtype=np.float64), size=V)
    return x / x.sum()


def pair(rng: np.random.Generator, V: int, family: str, params=()) -> tuple[np.ndarray, np.ndarray]:
    """A (p, q) pair of one family over ``V`` tokens, float64 (rows sum to 1 up to float rounding; the
    ``qn_one_noisy`` row carries +5e-8, as a float32 softmax may). ``params``: the rule's float
    parameters in (0, 1), which ``param_ties`` puts entries of ``q`` on exactly."""
    p, q = _dirichlet(rng, V), _dirichlet(rng, V)
    if family == "p_eq_q":
        p = q.copy()
    elif family == "zeros_in_p":  # p = 0 where q > 0
        p[rng.permutation(V)[: max(1, V // 2)]] = 0.0
        p = p / p.sum() if p.sum() > 0 else one_hot(V, int(np.argmin(q)))
    elif family == "zeros_in_q":  # q = 0 where p > 0
        q[rng.permutation(V)[: max(1, V // 2)]] = 0.0
        q = q / q.sum() if q.sum() > 0 else one_hot(V, int(np.argmin(p)))
    elif family == "disjoint":
        cut = int(rng.integers(1, V))
        perm = rng.permutation(V)
        p, q = np.zeros(V), np.zeros(V)
        p[perm[:cut]] = rng.dirichlet(np.ones(cut))
        q[perm[cut:]] = rng.dirichlet(np.ones(V - cut))
    elif family == "onehot_p":
        p = one_hot(V, int(rng.integers(V)))
    elif family == "onehot_q":
        q = one_hot(V, int(rng.integers(V)))
    elif family == "near_degenerate":
        eps = float(rng.choice([1e-6, 1e-9, 1e-12]))
        q = (1 - eps) * one_hot(V, int(rng.integers(V))) + eps * _dirichlet(rng, V)
        if rng.random() < 0.5:
            p = (1 - eps) * one_hot(V, int(rng.integers(V))) + eps * _dirichlet(rng, V)
    elif family == "ties":  # exact ties in q, and in the ratios p / q
        q = _ties(rng, V)
        p = _ties(rng, V) if rng.random() < 0.5 else q * _ties(rng, V, (1, 2)) * V
        p = p / p.sum()
    elif family == "param_ties" and params:
        t = float(rng.choice(params))
        m = int(rng.integers(1, max(1, min(V - 1, int(1 / t) - 1 if t > 0 else 1)) + 1))
        if m * t < 1:
            q = np.zeros(V)
            idx = rng.permutation(V)
            q[idx[:m]] = t
            rest = idx[m:]
            if rest.size:
                if rng.random() < 0.5:
                    q[rest[0]] = 1 - m * t
                else:
                    q[rest] = (1 - m * t) * rng.dirichlet(np.ones(rest.size))
    elif family == "qn_one_noisy":
        j = int(rng.integers(V))
        q = np.zeros(V)
        q[j] = 1.0
        others = [i for i in range(V) if i != j]
        for i, e in zip(rng.permutation(others)[:2], (3e-8, 2e-8), strict=False):
            q[i] = e
    elif family == "tiny":
        j = int(rng.integers(V))
        q[j] = 0.0
        q = q / q.sum() * (1 - 1e-12) if q.sum() > 0 else q
        q[j] = 1e-12 if q.sum() > 0 else 1.0
    return p, q


def draft_token(rng, p: np.ndarray) -> int:
    """A drafted token: drawn from ``p`` mostly, else one ``p`` gives no mass (a draft the entry point must
    never accept) when there is one."""
    zero = np.flatnonzero(p <= 0)
    if zero.size and rng.random() < 0.1:
        return int(rng.choice(zero))
    return int(rng.choice(p.size, p=p / p.sum()))


def family(rng, V: int) -> str:
    return str(rng.choice(LARGE_FAMILIES if V > 64 else FAMILIES))


def as_tensor(x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(dtype)


def read64(t: torch.Tensor) -> np.ndarray:
    """What an entry point was given, in float64 (the reference reads the rounded values)."""
    return t.detach().double().cpu().numpy()


def vocab_sizes(rule: Rule, large: bool = True) -> list[int]:
    """Vocabulary sizes for the cases: small ones from the rule's smallest, and 1,000 to 4,096."""
    lo = min_vocab(rule)
    small = [v for v in (2, 3, 4, 5, 8, 16) if v >= lo] or [lo]
    return small + ([1000, 4096] if large else [])


# -- exact-law references beyond one step -----------------------------------------------------------------------

def set_target(rule: Rule, q: np.ndarray, S: np.ndarray) -> np.ndarray:
    """Theorem 2 on a candidate set ``S`` (boolean (V,)), from the reference gamma: ``h = q gamma / q_S`` on
    ``S`` and ``q (1 - gamma) / (1 - q_S)`` off it; ``q`` itself where ``q_S`` is 0 (or ``S`` empty)."""
    qS = min(max(float(q[S].sum()), 0.0), 1.0)
    if qS <= 0:
        return q.copy()
    g = reference_rule_gamma(rule, qS)
    out = np.where(S, q * g / qS, q * ((1 - g) / (1 - qS) if qS < 1 else 0.0))
    return out


def drop(r: np.ndarray, x: int) -> np.ndarray:
    """EAGLE's recovery: ``r`` with ``r(x) = 0``, renormalised (``r`` itself if nothing is left)."""
    z = r.copy()
    z[x] = 0.0
    return z / z.sum() if z.sum() > 0 else r.copy()


def tree_walk(rules, scheme: str, mode: str, tok, par, P, Q, u, judge: Judge):
    """One row of ``verify_tree`` by its documented walk (``cactus_theory.theory.tree``): at a node with
    children ``x_1..x_K`` (node order), round ``i`` tests ``x_i`` against the current target ``r`` with
    the round's draft law ``p_i`` (iid / eagle: ``p``; without replacement: ``p`` without the earlier
    siblings; deterministic: ``e_x``); a candidate with ``p_i(x) = 0`` is skipped (``r`` unchanged);
    rejection sets ``r`` to the recovery (eagle: ``r`` without ``x``); acceptance enters the child,
    whose target is its verifier row (joint: the set target of its children); a node whose children are
    all rejected emits from ``r``, a node without children the bonus law of the first round's rule.
    ``u[j]`` decides node ``j``, ``u[N]`` draws the emitted token. Returns (tokens, accepted nodes), or None
    (ambiguous; ``pair_tie``)."""
    N, V = len(tok), Q.shape[-1]
    kids = [[j for j in range(N) if tok[j] >= 0 and par[j] + 1 == s] for s in range(N + 1)]
    joint = mode == "joint"
    first = rules[0]
    sps = registry.make("sps")

    def target(slot):
        if not joint:
            return Q[slot].copy()
        S = np.zeros(V, dtype=bool)
        S[[tok[j] for j in kids[slot]]] = True
        return set_target(first, Q[slot], S)

    slot, out, nodes = 0, [], []
    r = target(0)
    while True:
        removed = np.zeros(V, dtype=bool)
        entered = False
        for i, j in enumerate(kids[slot]):
            x = int(tok[j])
            rl = sps if joint else rules[min(i, len(rules) - 1)]
            p = P[j]
            if scheme in ("iid", "eagle"):
                p_i = p
            elif scheme == "without_replacement":
                z = np.where(removed, 0.0, p)
                p_i = z / z.sum() if z.sum() > 0 else np.zeros(V)
            else:
                p_i = one_hot(V, x)
            removed[x] = True
            if p_i[x] <= 0:
                continue  # a candidate the scheme could not have drawn: skipped
            phi, g = reference_step(rl, p_i, r, x)
            a = judge.accept(float(u[j]), phi)
            if a is None:
                return None
            if pair_tie(rl, p_i, r, x, float(u[j]), judge):
                return None
            if a:
                out.append(x)
                nodes.append(j)
                slot = j + 1
                r = target(slot)
                entered = True
                break
            r = drop(r, x) if scheme == "eagle" else g
        if entered:
            continue
        law = r if kids[slot] else reference_bonus(first, r)
        y = judge.draw(law, float(u[N]))
        return None if y is None else (out + [y], nodes)


def block_walk(P, Q, xs, us, judge: Judge):
    """Block verification (Sun et al., ICLR 2025) of one chain, re-implemented from the algorithm: weights
    ``w_0 = 1``, ``w_i = min(1, w_{i-1} q_i(x_i) / p_i(x_i))`` (0 where ``p_i(x_i) = 0``); residuals
    ``rho_{i+1} = (w_i q_{i+1} - p_{i+1})_+``; stop probabilities ``h_i = |rho_{i+1}| / (|rho_{i+1}| + 1 - w_i)``
    for ``0 < i < k`` and ``h_k = w_k``; ``tau`` the last ``i`` with ``us[i - 1] < h_i`` (0 if none); the
    emitted token from ``q_{k+1}`` if ``tau = k`` else from ``rho_{tau+1}`` (``q_{tau+1}`` if it has no mass),
    at uniform ``us[k]``."""
    k = len(xs)
    w = [1.0]
    for i in range(k):
        pn, qn = float(P[i][xs[i]]), float(Q[i][xs[i]])
        w.append(0.0 if pn <= 0 else min(1.0, w[-1] * qn / pn))
    rho = [np.maximum(w[i] * Q[i] - P[i], 0.0) for i in range(k)]
    tau = 0
    for i in range(1, k + 1):
        h = w[k] if i == k else (float(rho[i].sum()) / (float(rho[i].sum()) + 1 - w[i]) if rho[i].sum() > 0 else 0.0)
        a = judge.accept(float(us[i - 1]), h)
        if a is None:
            return None
        if a:
            tau = i
    law = Q[k] if tau == k else (rho[tau] if rho[tau].sum() > 0 else Q[tau])
    y = judge.draw(law, float(us[k]))
    return None if y is None else [int(x) for x in xs[:tau]] + [y]


def covered_by_reference(rule: Rule) -> bool:
    return any(c.__name__ in COVERED for c in type(rule).__mro__)


def stable_top(p: np.ndarray, K: int) -> list[int]:
    """The ``K`` most likely tokens of ``p``, ties to the lower id (a plain sort)."""
    return sorted(range(p.size), key=lambda i: (-float(p[i]), i))[:K]


def softmax64(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    m = np.max(z, axis=-1, keepdims=True)
    e = np.exp(z - np.where(np.isfinite(m), m, 0.0))
    return e / e.sum(-1, keepdims=True)


def log_row(x: np.ndarray) -> np.ndarray:
    """Logits whose softmax is ``x``: ``log x``, ``-inf`` where ``x = 0``."""
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(x, dtype=np.float64))



# -- chain cases ----------------------------------------------------------------------------------------------

def chain_rows(rng, B: int, k: int, V: int, params=()):
    """``B`` chains of ``k`` drafts: draft rows ``P`` (B, k, V), verifier rows ``Q`` (B, k + 1, V), drafts
    ``n`` (B, k), every row pair of a family drawn per position."""
    P, Q = np.zeros((B, k, V)), np.zeros((B, k + 1, V))
    n = np.zeros((B, k), dtype=np.int64)
    for b in range(B):
        for j in range(k + 1):
            p, q = pair(rng, V, family(rng, V), params)
            Q[b, j] = q
            if j < k:
                P[b, j] = p
                n[b, j] = draft_token(rng, p)
    return P, Q, n


def pad_block(tokens: list[int], width: int) -> list[int]:
    return tokens + [-1] * (width - len(tokens))


# -- tree cases -----------------------------------------------------------------------------------------------

def tree_case(rng, B: int, N: int, V: int, scheme: str, params=()):
    """``verify_tree``'s inputs for ``B`` random trees of at most ``N`` nodes (ragged: absent nodes, -1,
    with their subtrees), candidates drawn per ``scheme`` from the node's draft law (iid draws, sometimes
    one of zero mass; without replacement, a placeholder once the support is exhausted; the draft's
    stable top-k for the deterministic schemes, which reaches tokens of zero mass when a node has more
    children than the draft has support). Returns tokens, parents (B, N), draft rows (B, N, V) (each
    node's parent's law), verifier rows (B, N + 1, V), float64."""
    tok = np.full((B, N), -1, dtype=np.int64)
    par = np.full((B, N), -1, dtype=np.int64)
    DP = np.full((B, N, V), 1.0 / V)
    VP = np.full((B, N + 1, V), 1.0 / V)
    for b in range(B):
        parents = [-1 if j == 0 or rng.random() < 0.3 else int(rng.integers(-1, j)) for j in range(N)]
        absent = np.zeros(N, dtype=bool)
        for j in range(N):
            absent[j] = rng.random() < 0.15 or (parents[j] >= 0 and absent[parents[j]])
        slots = {0: pair(rng, V, family(rng, V), params)}
        for j in range(N):
            if not absent[j]:
                slots[j + 1] = pair(rng, V, family(rng, V), params)
        for s, (_, q) in slots.items():
            VP[b, s] = q
        for s in slots:
            kids = [j for j in range(N) if not absent[j] and parents[j] + 1 == s]
            if scheme in ("deterministic", "eagle") and len(kids) > V:
                for j in kids[V:]:
                    absent[j] = True
                    for i in range(j + 1, N):
                        absent[i] = absent[i] or (parents[i] >= 0 and absent[parents[i]])
                kids = kids[:V]
            p = slots[s][0]
            top = stable_top(p, len(kids))
            removed = np.zeros(V, dtype=bool)
            for rank, j in enumerate(kids):
                if scheme in ("deterministic", "eagle"):
                    x = top[rank]
                elif scheme == "iid":
                    x = draft_token(rng, p)
                else:
                    z = np.where(removed, 0.0, p)
                    x = int(rng.choice(V, p=z / z.sum())) if z.sum() > 0 else int(rng.integers(V))
                removed[x] = True
                tok[b, j], DP[b, j] = x, p
        for j in range(N):
            if absent[j]:
                tok[b, j] = -1
            par[b, j] = parents[j]
    return tok, par, DP, VP
