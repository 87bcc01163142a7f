"""DropMatch's extra inputs: Monte Carlo dropout on the verifier's LM head (see ``rules.DropMatch``).

A DropMatch step needs, at each drafted position, the verifier's final hidden state ``x`` (the LM
head's input, (..., d)) and the head itself (``W`` (V, d), optional bias (V,)). From them:

    ``dropout_logits``  ``W (m * x) / (1 - rate) + bias`` for ``S`` masks ``m ~ Bernoulli(1 - rate)^d``
    ``path_law``        the path law ``r = E_m[transforms(dropout logits)]`` by Monte Carlo over ``S``
                        masks, kept in ``G`` groups so that any function of ``r`` gets a jackknife error
    ``exact_path_law``  the same law exactly, by enumerating the ``2^d`` masks of a small head
    ``sample_hits``     one step of decoding: ``M`` paths sampled, ``hit`` = 1 at their tokens
    ``step_law``        acceptance and ``KL(h_alg || q)`` of ``DropMatch`` on rows, with MC errors
    ``synthetic_head``  a random head whose undropped logits equal given logits (toy pairs, figure c)

Notation: ``p`` draft, ``q`` verifier (after the sampling transforms), ``r`` path law, ``M`` paths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .divergences import kl
from .dropout import check_head, check_rate, dropout_logits, path_hits
from .exact import acceptance_rate, induced_distribution
from .rules import DropMatch
from .transforms import check_sampling, sampling_probs
from .validate import check_positive_int

__all__ = ["PathLaw", "StepLaw", "dropout_logits", "path_law", "exact_path_law", "sample_hits", "step_law",
           "synthetic_head", "jackknife"]


@dataclass
class PathLaw:
    """Monte Carlo estimate of the path law ``r`` (..., V): the mean of ``groups`` group means, each over
    ``masks / groups`` masks (``group_means`` (G, ..., V)). Any function ``f(r)`` gets its error from the
    groups by the jackknife (``jackknife``)."""

    r: np.ndarray
    group_means: np.ndarray
    masks: int
    rate: float

    @property
    def stderr(self) -> np.ndarray:
        """Standard error of each ``r`` entry (between-group spread / sqrt(G))."""
        G = self.group_means.shape[0]
        return self.group_means.std(0, ddof=1) / np.sqrt(G)


def path_law(hidden: torch.Tensor, weight: torch.Tensor, rate: float, num_masks: int = 256, *,
             sampling: tuple = (1.0, 0, 1.0), bias: torch.Tensor | None = None, groups: int = 16,
             chunk: int = 32, generator: torch.Generator | None = None) -> PathLaw:
    """The law ``r = E_m[transforms(W (m * x) / (1 - rate) + bias)]`` of one dropout path's token, by Monte
    Carlo over ``num_masks`` masks (a multiple of ``groups``), ``chunk`` masks at a time.

    ``sampling = (temperature, top_k, top_p)``: the transforms applied to ``q`` (a path samples its
    token exactly as the verifier would). The error of each ``r_i`` is ``PathLaw.stderr``; for a
    function of ``r`` (an acceptance, a KL) use ``jackknife``. float64 results.
    """
    check_head(hidden, weight, bias)
    check_rate(rate)
    check_positive_int(num_masks, "num_masks")
    check_positive_int(groups, "groups")
    if groups < 2 or num_masks % groups:
        raise ValueError(f"num_masks must be a multiple of groups >= 2, got num_masks={num_masks}, groups={groups}")
    check_sampling(*sampling)
    per = num_masks // groups
    sums = []
    with torch.inference_mode():
        for _ in range(groups):
            acc = None
            for s in range(0, per, chunk):
                n = min(chunk, per - s)
                pr = sampling_probs(dropout_logits(hidden, weight, rate, n, bias, generator), *sampling)
                part = pr.double().sum(0)
                acc = part if acc is None else acc + part
            sums.append((acc / per).cpu().numpy())
    gm = np.stack(sums)
    return PathLaw(r=gm.mean(0), group_means=gm, masks=num_masks, rate=float(rate))


EXACT_MAX_DIM = 20  # exact_path_law enumerates 2^d masks


def exact_path_law(hidden: torch.Tensor, weight: torch.Tensor, rate: float, *, sampling: tuple = (1.0, 0, 1.0),
                   bias: torch.Tensor | None = None) -> np.ndarray:
    """The path law ``r`` exactly, for a small head (``d <= EXACT_MAX_DIM``): the sum over all ``2^d``
    masks ``m`` of ``(1 - rate)^|m| rate^(d - |m|) transforms(W (m * x) / (1 - rate) + bias)``. float64."""
    check_head(hidden, weight, bias)
    check_rate(rate)
    check_sampling(*sampling)
    d = weight.shape[1]
    if d > EXACT_MAX_DIM:
        raise ValueError(f"exact_path_law enumerates 2^d masks; d = {d} > {EXACT_MAX_DIM}: use path_law (Monte Carlo)")
    with torch.inference_mode():
        bits = ((torch.arange(2 ** d)[:, None] >> torch.arange(d)[None, :]) & 1).double()  # (2^d, d) kept inputs
        w = (1 - rate) ** bits.sum(1) * rate ** (d - bits.sum(1))  # (2^d,)
        x = hidden.detach().double().cpu().unsqueeze(0) * bits.reshape(2 ** d, *([1] * (hidden.ndim - 1)), d) / (1 - rate)
        b = None if bias is None else bias.detach().double().cpu()
        logits = torch.nn.functional.linear(x, weight.detach().double().cpu(), b)
        pr = sampling_probs(logits, *sampling).double()  # (2^d, ..., V)
        return torch.einsum("m,m...->...", w, pr).numpy()


def sample_hits(hidden: torch.Tensor, weight: torch.Tensor, rule: DropMatch, *, sampling: tuple = (1.0, 0, 1.0),
                bias: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """One decoding step's ``hit`` (..., V): 1 at the tokens of ``rule.num_paths`` sampled dropout paths
    (each its own mask, then a token from the transformed logits), 0 elsewhere, in float32. Its mean
    over masks and draws is ``1 - (1 - r)^M``, so ``rule.at(hit)`` decodes with ``DropMatch``'s exact law."""
    if not isinstance(rule, DropMatch):
        raise ValueError(f"rule must be a DropMatch rule, got {rule!r}")
    return path_hits(hidden, weight, rule.rate, rule.num_paths, sampling=sampling, bias=bias, generator=generator)


def jackknife(fn, law: PathLaw) -> tuple[np.ndarray, np.ndarray]:
    """``fn(r)`` at the Monte Carlo path law and its jackknife standard error over the mask groups:
    ``se = sqrt((G - 1) / G * sum_g (fn(r_-g) - mean)^2)``, ``r_-g`` the mean without group ``g``."""
    gm = law.group_means
    G = gm.shape[0]
    est = np.asarray(fn(law.r), dtype=np.float64)
    loo = np.stack([np.asarray(fn((gm.sum(0) - gm[g]) / (G - 1)), dtype=np.float64) for g in range(G)])
    with np.errstate(invalid="ignore"):  # an infinite value (KL outside q's support) has no finite error: NaN
        se = np.sqrt((G - 1) / G * ((loo - loo.mean(0)) ** 2).sum(0))
    return est, se


@dataclass
class StepLaw:
    """Per-row acceptance ``sum_n p_n phi_n`` and ``KL(h_alg || q)`` of a DropMatch step, with their
    Monte Carlo (jackknife) standard errors over mask groups; ``h`` the law at the estimated ``r``."""

    accept: np.ndarray
    accept_se: np.ndarray
    kl: np.ndarray
    kl_se: np.ndarray
    h: np.ndarray


def step_law(rule: DropMatch, p, q, law: PathLaw) -> StepLaw:
    """Exact one-step law of ``rule`` on rows ``(p, q)`` (..., V) given the path law ``law.r`` (same
    shape): ``h_alg`` of ``rule.at(1 - (1 - r)^M)``, its acceptance and KL from ``q``, with jackknife errors."""
    if not isinstance(rule, DropMatch):
        raise ValueError(f"rule must be a DropMatch rule, got {rule!r}")
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if law.r.shape != q.shape:
        raise ValueError(f"the path law must have q's shape {q.shape}, got {law.r.shape}")

    def bound(r):
        return rule.at(rule.hit_from_law(r))

    acc, acc_se = jackknife(lambda r: acceptance_rate(bound(r), p, q), law)
    kls, kl_se = jackknife(lambda r: kl(induced_distribution(bound(r), p, q), q), law)
    return StepLaw(acc, acc_se, kls, kl_se, induced_distribution(bound(law.r), p, q))


def synthetic_head(logits: np.ndarray, dim: int = 64, noise: float = 1.0, seed: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A random head for toy pairs: ``(x, W)`` with ``x = 1`` (d,) per row and ``W`` (R, V, d) such that
    ``W x = logits`` exactly: ``W_v = logits_v / d + noise * g_v`` with ``g_v`` Gaussian, centred to sum 0
    over ``d``. Dropout then perturbs logit ``v`` by ``sum_j W_vj (m_j / (1 - rate) - 1)``, whose variance
    is ``rate / (1 - rate) * |W_v|^2`` (about ``rate / (1 - rate) * noise^2 d``). Returns float64 tensors
    ``x`` (R, d) and ``W`` (R, V, d); pass row ``i`` as ``path_law(x[i], W[i], ...)``."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2:
        raise ValueError(f"logits must be (R, V), got shape {z.shape}")
    check_positive_int(dim, "dim")
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(*z.shape, dim))
    g -= g.mean(-1, keepdims=True)
    W = z[..., None] / dim + noise * g
    return torch.ones((z.shape[0], dim), dtype=torch.float64), torch.from_numpy(W)
