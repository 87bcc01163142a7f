"""The (p, q, n) cases every randomised check draws: random Dirichlet pairs and the adversarial
kinds of the theorems (equal laws, one-hot and disjoint supports, zeros on either side, ``q_n = 1``,
tiny ``q_n``, near-ties with TAS's and TopK's thresholds). Shared by ``cactus-theory verify``
(``claims.report``) and the test suite's case generator."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["CASE_KINDS", "TAS_DEFAULT", "TIE_OFFSETS", "make_pair"]

CASE_KINDS = ("random", "p_eq_q", "onehot_q", "disjoint", "zeros_in_p", "zeros_in_q", "qn_one", "tiny_qn",
              "tas_tie", "topk_tie")
# TAS at its vLLM defaults: the threshold tas_tie cases sit on
TAS_DEFAULT = (0.09, 0.3)
TIE_OFFSETS = (1e-12, 1e-9, 1e-6)  # relative distances of near-ties from a threshold


def _tas_threshold(q: np.ndarray) -> float:
    eps, alpha = TAS_DEFAULT
    pos = q[q > 0]
    return min(eps, alpha * math.exp(float(np.sum(pos * np.log(pos)))))


def make_pair(kind: str, V: int, rng: np.random.Generator, floor: float = 1e-6):
    """A (p, q, n) case of the given kind over ``V >= 2`` tokens, float64.

    ``random``: Dirichlet with a random concentration; masses below ``floor`` are zeroed (keeps the
    cvxpy checks well conditioned). Adversarial kinds: ``p_eq_q``, ``onehot_q``, ``disjoint``
    supports, ``zeros_in_p`` (where ``q > 0``), ``zeros_in_q`` (where ``p > 0``), ``qn_one``
    (``q = e_n``), ``tiny_qn`` (``q_n = floor``), ``tas_tie`` (``q_n`` on TAS's default threshold
    ``min(0.09, 0.3 exp(-H(q)))``: exactly when that is 0.09, else within ``TIE_OFFSETS`` relative,
    either side) and ``topk_tie`` (``q_n`` tied, exactly or within 1e-12, with other tokens, so the
    k-th largest ``q`` is a tie for several ``k``). ``n`` is drawn from ``p`` (so ``p_n > 0``).
    """
    if kind not in CASE_KINDS:
        raise ValueError(f"kind must be one of {CASE_KINDS}, got {kind!r}")
    if not (isinstance(V, (int, np.integer)) and V >= 2):
        raise ValueError(f"V must be an integer >= 2, got {V!r}")

    def dirichlet() -> np.ndarray:
        x = rng.dirichlet(np.full(V, rng.choice([0.1, 0.3, 1.0, 3.0])))
        x = np.where(x < floor, 0.0, x)
        if x.sum() == 0:
            x[rng.integers(V)] = 1.0
        return x / x.sum()

    p, q = dirichlet(), dirichlet()
    if kind == "p_eq_q":
        p = q.copy()
    elif kind == "onehot_q":
        q = np.eye(V)[rng.integers(V)]
    elif kind == "disjoint":
        cut = int(rng.integers(1, V))
        perm = rng.permutation(V)
        p = np.zeros(V)
        q = np.zeros(V)
        p[perm[:cut]] = rng.dirichlet(np.ones(cut))
        q[perm[cut:]] = rng.dirichlet(np.ones(V - cut))
    elif kind == "zeros_in_p":
        p[rng.permutation(V)[: max(1, V // 2)]] = 0.0
        if p.sum() == 0:
            p = np.eye(V)[int(np.argmin(q))]
        p /= p.sum()
    elif kind == "zeros_in_q":
        q[rng.permutation(V)[: max(1, V // 2)]] = 0.0
        if q.sum() == 0:
            q = np.eye(V)[int(np.argmin(p))]
        q /= q.sum()
    n = int(rng.choice(V, p=p))
    if kind == "qn_one":
        q = np.eye(V)[n]
    elif kind == "tiny_qn":
        q[n] = 0.0
        q = q / q.sum() * (1 - floor) if q.sum() > 0 else np.full(V, (1 - floor) / (V - 1))
        q[n] = floor
    elif kind == "tas_tie":
        rest = q.copy()
        rest[n] = 0.0
        rest = rest / rest.sum() if rest.sum() > 0 else np.where(np.arange(V) == n, 0.0, 1.0 / (V - 1))
        if rng.random() < 0.5:  # a peaked row: low entropy puts the threshold on its epsilon branch
            j = int(rng.choice(np.delete(np.arange(V), n)))
            rest = 0.05 * rest + 0.95 * np.eye(V)[j]
        t = 0.05
        for _ in range(60):  # fixed point t = threshold(q(t)), q(t) = (1 - t) rest + t e_n (a contraction)
            t, t_old = _tas_threshold((1 - t) * rest + t * np.eye(V)[n]), t
            if t == t_old:
                break
        exact = t == TAS_DEFAULT[0]  # on the epsilon branch an exact tie is representable: half the cases
        off = 0.0 if exact and rng.random() < 0.5 else float(rng.choice(TIE_OFFSETS)) * float(rng.choice([-1, 1]))
        t = t * (1 + off)
        q = (1 - t) * rest
        q[n] = t
    elif kind == "topk_tie":
        m = int(rng.integers(2, V + 1))
        tied = np.concatenate([[n], rng.permutation(np.delete(np.arange(V), n))[: m - 1]])
        c = float(rng.uniform(0.3, 1.0)) / m if m < V else 1.0 / V
        q = np.zeros(V)
        if m < V:
            q[np.setdiff1d(np.arange(V), tied)] = rng.dirichlet(np.ones(V - m)) * (1 - m * c)
        q[tied] = c
        free = np.setdiff1d(np.arange(V), tied)
        if free.size and rng.random() < 0.5:  # a near-tie, the excess taken from an untied token
            e = c * float(rng.choice([-1, 1])) * 1e-12
            j = free[np.argmax(q[free])]
            q[n], q[j] = c + e, q[j] - e
    return p, q, n
