"""Acceptance rules for one verification step, written once for numpy (exact analysis) and torch.

Notation (the paper's): ``p`` draft distribution, ``q`` verifier distribution, both (..., V);
``n`` (...) the drafted token; ``h`` the target law of the step; ``gamma = h_n``.

Every rule exposes
    ``accept_prob(p, q, n)``  phi_n in [0, 1], shape (...)
    ``residual(p, q, n)``     recovery law g_n on rejection, shape (..., V), sums to 1
    ``target(p, q, n)``       h, for rules defined by a target distribution (SpS, Cactus, Interpolation)
and the one-step output law is ``sum_n p_n [phi_n e_n + (1 - phi_n) g_n]`` (see ``exact``).
    ``bonus(q)``              law of the bonus token drawn after all ``k`` drafts of a block are
                              accepted, from the verifier's row ``q`` at the bonus position; ``q``
                              itself unless the rule declares ``bonus_from_q = False`` (Medusa: argmax q)

Conventions shared by all rules (tested): a drafted token with ``p_n = 0`` is never accepted
(the draft could not have sampled it); acceptance only reads ``p_n``, ``q_n`` and, for TAS, TopK
and EARS, one statistic of the row ``q`` (entropy, k-th largest, max).

The references differ on ``p_n = 0``: the authors' code and vLLM accept such a token whenever their
test passes (``q_n / 0 = inf`` in a ratio; TAS and top-k do not read ``p`` at all). The output law
is the same either way: ``n`` is drafted with probability ``p_n = 0``, so its acceptance decision
carries weight 0 in ``h_alg = sum_n p_n [phi_n e_n + (1 - phi_n) g_n]``. Only a caller that drafts
a token its own ``p`` gives probability 0 (e.g. ``p`` truncated after sampling) sees a difference.
``convention="authors"`` (Cactus, TopK, Interpolation, TAS: ``CONVENTIONS``) takes the authors' reference
code's conventions instead; an option added to a rule leaves its ``repr`` unchanged at the option's default
(``_quiet_repr``), so every result cached under the rule's ``identity`` stays valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
from array_api_compat import is_torch_array

from ._array import Array, errstate, gather, one_hot_like, scatter, where0, xlogy, xp_of
from .divergences import F_DIVERGENCES
from .validate import (
    FLOAT16_MAX,
    FLOAT16_TINY,
    check_int,
    check_nonneg,
    check_number,
    check_positive_int,
    check_prob_param,
)
from .validate import check_pqn as _check_inputs

__all__ = [
    "Rule", "TargetRule", "ScalingRule", "SpS", "Cactus", "TAS", "TopK", "Interpolation", "EARS", "Ensemble",
    "CONVENTIONS", "FLOAT32_TINY",
    "two_block_divergence", "two_block_root", "taylor_gamma",
    "SGLangThreshold", "RelaxedAcceptance", "MedusaTypical", "FLy", "DropMatch", "DropMatchAt", "descending_rank",
    "EntropyVerify", "Lenience", "MinP", "Eta", "FSD", "FSD_DIVERGENCES", "fsd_divergence",
    "RowTarget", "CascadeDefer", "Tok3", "Mentored", "SCD", "RFuzzy", "js_divergence", "MaxEps", "MAX_EPS_RECOVERIES",
    "MaxSampled", "SampleMatch", "GRAPHCORE_PIN", "MAX_PIN",
    "check_rule", "refuse_stateful",
]


def _set(rule, **values) -> None:
    """Store validated (converted) constructor values on a frozen rule: a numpy scalar parameter becomes
    the Python number it equals, so every rule holds, compares and prints Python numbers."""
    for k, v in values.items():
        object.__setattr__(rule, k, v)


def _check_choice(value, name: str, choices: tuple) -> None:
    """A string parameter that must be one of ``choices`` (a non-string, even unhashable, is named too)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")


CONVENTIONS = ("ours", "authors")
"""``convention`` of SpS's relatives that the authors' reference code also implements (Cactus, TopK,
Interpolation, TAS): ``"ours"`` (the conventions of this module's docstring) or ``"authors"`` (the code of
MANGA-UOFA/Cactus, a patch of vLLM: a drafted token with ``p_n = 0`` is judged by the rule's own test,
and the recovery's degenerate cases follow that code; each class says what changes, docs/production-rules.md
cites the lines)."""

FLOAT32_TINY = 2.0 ** -126
"""float32's smallest normal number, ``torch.finfo(torch.float32).tiny``: the authors' floor on recovery weights
(``Interpolation(convention="authors")``) and transformers' "numerically zero" residual (``Ensemble``), both
computed in float32 upstream; used as the same constant in every dtype (it rounds to 0 in float16)."""


def _quiet_repr(self) -> str:
    """The dataclass repr, leaving out the options listed in ``type(self)._QUIET`` while they hold their
    defaults: an option added to a rule after results were measured with it does not change the repr of the
    rule it leaves unchanged (``SpS()``, ``Cactus(delta=1.0, divergence='kl', solver='taylor')``), so every
    result cache keyed on ``identity`` stays valid."""
    quiet = type(self)._QUIET
    parts = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
             if f.repr and not (f.name in quiet and getattr(self, f.name) == f.default)]
    return f"{type(self).__qualname__}({', '.join(parts)})"


def _token0_like(r: Array) -> Array:
    """``e_0`` with ``r``'s shape and dtype (..., V)."""
    xp = xp_of(r)
    if is_torch_array(r):
        import torch

        zero = torch.zeros(r.shape[:-1], dtype=torch.long, device=r.device)
    else:
        zero = np.zeros(r.shape[:-1], dtype=np.intp)
    return xp.astype(one_hot_like(r, zero), r.dtype)


def _check_hit(hit) -> None:
    """DropMatch's ``hit`` (..., V): a real (or boolean: a realised 0/1 indicator) numpy array, torch
    tensor or nested list, finite, in [0, 1], with a vocabulary axis; its shape is matched to ``q`` where
    it is used (equal, or a trailing part broadcast over leading axes; never reshaped)."""
    if is_torch_array(hit):
        if hit.is_complex():
            raise ValueError(f"hit must hold real probabilities, got dtype {hit.dtype}")
        ok_range = bool(((hit >= 0) & (hit <= 1)).all()) if hit.numel() else True
        shape = tuple(hit.shape)
    else:
        try:
            arr = np.asarray(hit)
        except Exception as e:  # ragged nested lists
            raise ValueError(f"hit must be an array of probabilities, got {type(hit).__name__}: {e}") from None
        if arr.dtype != np.bool_ and not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"hit must hold probabilities (real numbers), got dtype {arr.dtype}")
        with np.errstate(invalid="ignore"):
            ok_range = bool(np.all((arr >= 0) & (arr <= 1)))
        shape = arr.shape
    if len(shape) < 1:
        raise ValueError(f"hit must have a vocabulary axis last (q's shape), got shape {shape}")
    if not ok_range:
        raise ValueError("hit must hold probabilities in [0, 1] (no NaN): the chance that each token is among the "
                         "dropout paths, or its 0/1 indicator")


def _check_typical(rule) -> None:
    """``epsilon``, ``alpha`` > 0 and ``entropy_eps`` >= 0 of the typical-acceptance rules (TAS, Medusa).

    ``epsilon`` caps the threshold ``min(epsilon, alpha exp(-H(q)))`` and is applied as a clip bound in
    the probabilities' own dtype, so it must be representable there: at most 65504 (float16's largest
    value; above float32's 3.4e38 float32 decoding crashed). Nothing is lost: the threshold is compared
    with ``q_n <= 1``, so every ``epsilon >= 1`` acts exactly as ``epsilon = 1``. ``alpha`` and
    ``entropy_eps`` only need to be finite (a huge value saturates to ``inf`` or 0, never NaN)."""
    _set(rule,
         epsilon=check_number(rule.epsilon, "epsilon", low=0.0, low_open=True, high=FLOAT16_MAX,
                              what="a positive number",
                              why_high="at most 65504, float16's largest value: it is a clip bound applied in the "
                                       "probabilities' dtype, and every epsilon >= 1 acts as 1"),
         alpha=check_number(rule.alpha, "alpha", low=0.0, low_open=True, what="a positive number"),
         entropy_eps=check_nonneg(rule.entropy_eps, "entropy_eps"))


def _normalise(r: Array, fallback: Array) -> Array:
    """``r / sum(r)`` over the last axis; rows with zero mass are replaced by ``fallback``."""
    xp = xp_of(r)
    z = xp.sum(r, axis=-1, keepdims=True)
    ok = z > 0
    return xp.where(ok, r / xp.where(ok, z, xp.ones_like(z)), fallback)


def _pos(x: Array) -> Array:
    xp = xp_of(x)
    return xp.maximum(x, xp.zeros_like(x))


# Declared properties of a rule's law, and the methods each one vouches for. Engines read the
# properties (``sampler.verify`` skips row statistics, ``exact.induced_distribution`` takes the
# O(V log V) two-block path) instead of comparing methods by identity. A subclass that overrides one
# of the vouched-for methods without re-declaring the property in its own body gets the safe value
# (see ``Rule.__init_subclass__``), so a deliberately wrong port is always run from its own code.
_VOUCHED = {
    # acceptance reads p_n, q_n only: no statistic of the row q (safe value: True, stats are computed)
    "needs_row_stats": ("row_stats", "stats_at", "stats_all", "pair_stats_at", "pair_stats_all", "phi", "accept_from",
                        "accept_prob", "accept_prob_all"),
    # phi_n = min(1, gamma(q_n) / p_n), g_n = (h - p)_+ with the two-block h (safe value: False)
    "two_block": ("phi", "accept_from", "accept_prob", "accept_prob_all", "residual", "h_n", "target_rows",
                  "scale"),
    # the bonus token is drawn from q itself (safe value: False, the engines call ``bonus``)
    "bonus_from_q": ("bonus",),
    # acceptance reads a statistic of the pair of rows (p, q), not of q alone (safe value: True, the engines
    # pass the draft's rows to ``pair_stats_at``, whose default is ``stats_at``)
    "reads_draft_row": ("pair_stats_at", "pair_stats_all"),
}
_SAFE = {"needs_row_stats": True, "two_block": False, "bonus_from_q": False, "reads_draft_row": True}


@dataclass(frozen=True)
class Rule:
    """Base class: a rule is ``phi(p_n, q_n, stats(q))`` plus a recovery law ``g_n``.

    Declared properties (class attributes, read by the engines):
        ``needs_row_stats``  ``accept_prob`` reads statistics of the row ``q`` (``row_stats``) beyond
                             ``q_n``; False lets ``sampler.verify`` read one probability per position.
        ``two_block``        the law is fixed by ``gamma(q_n)`` (Theorem 2's shape, ``ScalingRule``);
                             True lets ``exact.induced_distribution`` take its O(V log V) path.
        ``bonus_from_q``     the bonus token (all ``k`` drafts accepted) is drawn from the verifier's
                             row ``q`` itself, as every lossless scheme and most servers do; False: the
                             engines (``sampler.verify`` / ``verify_flat``, ``toy.sequence_law``) draw it
                             from ``bonus(q)`` (Medusa emits ``argmax q``).
        ``reads_draft_row``  the statistics ``phi`` reads come from the pair of rows ``(p, q)`` (FSD's divergence
                             of the draft's row from the verifier's), not from ``q`` alone: the engines then
                             pass the draft's rows to ``pair_stats_at`` (one-hot rows for one-hot drafts).
        ``reads_head``       judging a step needs the verifier's final hidden states and LM head at the
                             drafted positions (DropMatch), not only ``(p, q)``: the decode loop then
                             exposes them in the step it passes to ``bind``.
        ``stateful``         the rule keeps a state per sequence (``SequenceBudget``: the budget left):
                             it has no one-step law of its own, and judges drafts only where a state can
                             be carried (``sampler.verify`` / ``tree.verify_tree`` with ``state=``, the
                             decode loops, ``toy.sequence_law``); every entry point that cannot carry one
                             (the exact one-step laws, ``verify_flat``, the integrations) refuses it.
    A subclass overriding a method that a property vouches for, without declaring the property again
    in its own class body, gets the safe value (row statistics computed; generic exact path).

    ``revision`` numbers the definition of the rule's law: it goes up whenever the law that the same
    parameters give changes, and ``identity`` (the repr plus the revision) is what caches of measured
    results key on, so a result measured under an earlier definition is never reused as the current one.
    """

    revision: ClassVar[int] = 1
    needs_row_stats: ClassVar[bool] = False
    two_block: ClassVar[bool] = False
    bonus_from_q: ClassVar[bool] = True
    reads_head: ClassVar[bool] = False
    reads_draft_row: ClassVar[bool] = False
    _QUIET: ClassVar[tuple] = ()  # options ``repr`` shows only away from their defaults (``_quiet_repr``)
    _AUTHORS_RECOVERY: ClassVar[str] = ""  # the recovery of convention "authors": "floor", "token0", "" (ours)
    stateful: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        for prop, methods in _VOUCHED.items():
            if prop not in own and any(m in own for m in methods):
                setattr(cls, prop, _SAFE[prop])

    @property
    def identity(self) -> str:
        """``repr(self)``, then ``@r<revision>`` past the first revision: what result caches key on."""
        return repr(self) if self.revision == 1 else f"{self!r}@r{self.revision}"

    def bind(self, step) -> Rule:
        """The rule that judges one decoding step, given what the verifier produced at it. ``step`` (the
        decode loop's ``lm.loop.VerifierStep``) has ``k`` (drafted positions), ``sampling``
        (temperature, top_k, top_p), ``generator``, the verifier's ``logits`` (n, k + 1, V) and, for a
        rule that declares ``reads_head``, ``hidden`` (n, k + 1, d) and the head's ``weight`` / ``bias``.
        Default: the rule itself (it needs only ``(p, q)``)."""
        return self

    def rank_depth(self) -> int:
        """How many of a row's largest entries the rule's statistics rank (``TopK``'s ``k``): a row cut
        to its support keeps at least this many entries, or those statistics change. 0: none ranked."""
        return 0

    # -- the two pieces each rule defines ------------------------------------------------
    def row_stats(self, q: Array) -> tuple:
        """Per-row statistics of ``q`` the acceptance test needs, each of shape (..., 1)."""
        return ()

    def stats_all(self, q: Array) -> tuple:
        """The statistics ``phi`` reads, for every candidate token at once: each broadcasts against
        ``q`` (..., V). Default: ``row_stats(q)``, (..., 1). A rule whose statistic differs per token
        (DropMatch's dropout paths) returns (..., V) arrays."""
        return self.row_stats(q)

    def stats_at(self, q: Array, n: Array) -> tuple:
        """The statistics ``phi`` reads at the drafted tokens ``n`` (...): each of shape (...).
        Default: ``row_stats(q)`` without its last axis (a row statistic is the same for every token)."""
        return tuple(s[..., 0] for s in self.row_stats(q))

    def pair_stats_at(self, p: Array, q: Array, n: Array) -> tuple:
        """The statistics ``phi`` reads at the drafted tokens ``n`` (...), from the draft's rows ``p`` and the
        verifier's ``q`` (..., V): each of shape (...). Default: ``stats_at(q, n)`` (``p`` is not read); a rule
        that declares ``reads_draft_row`` reads both."""
        return self.stats_at(q, n)

    def pair_stats_all(self, p: Array, q: Array) -> tuple:
        """``stats_all`` from the pair of rows: each broadcasts against ``q`` (..., V). Default: ``stats_all(q)``."""
        return self.stats_all(q)

    def phi(self, p_n: Array, q_n: Array, *stats: Array) -> Array:
        """Acceptance probability before the ``p_n = 0`` convention (elementwise)."""
        raise NotImplementedError

    def residual(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        """Recovery distribution ``g_n`` (..., V) used when the drafted token is rejected."""
        raise NotImplementedError

    # -- conventions (``CONVENTIONS``): ours, or the authors' reference code ------------------------
    def _authors(self) -> bool:
        """The rule follows the authors' reference code (``convention="authors"``; rules without the option: no)."""
        return getattr(self, "convention", "ours") == "authors"

    def accepts_zero_draft(self) -> bool:
        """A drafted token with ``p_n = 0`` is judged by the rule's own test (``zero_draft_phi``), as the
        reference code does (``convention="authors"``), instead of never accepted (ours)."""
        return self._authors()

    def zero_draft_phi(self, p_n: Array, q_n: Array, *stats: Array) -> Array:
        """``phi_n`` where ``p_n = 0`` under ``accepts_zero_draft``: the rule's own test there (a test that does
        not read ``p``: TAS, TopK). Ratio tests override it (``TargetRule``: ``1[h_n > 0]``)."""
        return self.phi(p_n, q_n, *stats)

    def _recover(self, r: Array, fallback: Array) -> Array:
        """The recovery law from weights ``r`` (..., V) >= 0: ``r / sum r``, and ``fallback`` where
        ``sum r = 0``. Under ``convention="authors"`` the reference code's degenerate cases
        (``_AUTHORS_RECOVERY``): ``"floor"``, every weight raised to at least ``FLOAT32_TINY`` before
        normalising (vLLM 0.7.3's rejection sampler, the authors' ``interp.py``), so every token keeps a
        positive mass; ``"token0"``, token 0 where ``sum r = 0`` (an all-zero row sampled by vLLM 0.7.3's
        exponential race, the authors' ``cactus.py``, ``topk.py`` and Triton kernel)."""
        how = self._AUTHORS_RECOVERY if self._authors() else ""
        if how == "floor":
            xp = xp_of(r)
            return _normalise(xp.maximum(r, xp.full_like(r, FLOAT32_TINY)), fallback)
        if how == "token0":
            return _normalise(r, _token0_like(r))
        return _normalise(r, fallback)

    # -- shared machinery -------------------------------------------------------------------
    def accept_from(self, p_n: Array, q_n: Array, *stats: Array) -> Array:
        """``phi_n`` clipped to [0, 1], with ``phi_n = 0`` where ``p_n = 0`` (``accepts_zero_draft``: the
        rule's ``zero_draft_phi`` there)."""
        xp = xp_of(p_n, q_n)
        phi = xp.clip(self.phi(p_n, q_n, *stats), 0.0, 1.0)
        if self.accepts_zero_draft():
            return xp.where(p_n > 0, phi, xp.clip(self.zero_draft_phi(p_n, q_n, *stats), 0.0, 1.0))
        return where0(p_n > 0, phi)

    def accept_prob(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        """``phi_n``: probability of accepting drafted token ``n``; (..., V) x2, (...) -> (...)."""
        if check:
            _check_inputs(p, q, n)
        return self.accept_from(gather(p, n), gather(q, n), *self.pair_stats_at(p, q, n))

    def accept_prob_all(self, p: Array, q: Array) -> Array:
        """``phi_n`` for every candidate ``n`` at once: (..., V) -> (..., V)."""
        return self.accept_from(p, q, *self.pair_stats_all(p, q))

    def target(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        raise TypeError(f"{type(self).__name__} is not defined by a target distribution h")

    def bonus(self, q: Array) -> Array:
        """Law of the bonus token, (..., V) -> (..., V), from the verifier's row ``q`` at the position
        after the ``k``-th draft. Default: ``q`` itself (the paper's and SpS's bonus)."""
        return q


def check_rule(rule, name: str = "rule", *, stateful: bool = False) -> None:
    """Raise ``ValueError`` unless ``rule`` is a ``cactus_theory`` rule object (not a rule's name); a rule
    that declares ``stateful`` is refused unless the caller carries its state (``stateful=True``)."""
    if not isinstance(rule, Rule):
        hint = f" (build one with cactus_theory.make_rule({rule!r}, ...))" if isinstance(rule, str) else ""
        raise ValueError(f"{name} must be a cactus_theory Rule such as SpS() or Cactus(0.5), got {rule!r}{hint}")
    if rule.stateful and not stateful:
        refuse_stateful(rule, name)


def refuse_stateful(rule, name: str = "rule", where: str = "this entry point") -> None:
    """The ``ValueError`` of an entry point that cannot carry a stateful rule's per-sequence state."""
    raise ValueError(
        f"{name} {rule!r} is stateful per sequence (rule.stateful): its law is a whole decode's, not one step's, "
        f"and {where} cannot carry its state; use sampler.verify / tree.verify_tree with state=rule.start(B), "
        "the decode loops (lm.speculative_generate, lm.tree_generate) or toy.sequence_law")


@dataclass(frozen=True)
class TargetRule(Rule):
    """Generalised speculative sampling towards a target ``h`` (Theorem 1).

    ``phi_n = min(1, h_n / p_n)``, ``g_n = (h - p)_+ / sum (h - p)_+``; the output is exactly ``h``
    when ``h`` does not depend on ``n``. If ``(h - p)_+ = 0`` (then every draft is accepted) ``g_n = h``.
    """

    needs_row_stats: ClassVar[bool] = False  # phi_n reads h_n(p_n, q_n) only

    def h_n(self, p_n: Array, q_n: Array) -> Array:
        """The target's mass on the drafted token, elementwise."""
        raise NotImplementedError

    def target_rows(self, p: Array, q: Array, n: Array) -> Array:
        raise NotImplementedError

    def phi(self, p_n, q_n, *stats):
        xp = xp_of(p_n, q_n)
        with errstate():
            return xp.where(p_n > 0, self.h_n(p_n, q_n) / xp.where(p_n > 0, p_n, xp.ones_like(p_n)), xp.zeros_like(p_n))

    def zero_draft_phi(self, p_n, q_n, *stats):
        """``h_n / 0`` read as the reference code reads it: ``inf`` (accepted) where ``h_n > 0``, NaN (rejected)
        where ``h_n = 0``."""
        xp = xp_of(p_n, q_n)
        return xp.astype(self.h_n(p_n, q_n) > 0, q_n.dtype)

    def target(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        """The target distribution ``h`` (..., V) for drafted token ``n`` (...)."""
        if check:
            _check_inputs(p, q, n)
        return self.target_rows(p, q, n)

    def residual(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        """``g_n = (h - p)_+ / sum_i (h_i - p_i)_+`` (..., V)."""
        if check:
            _check_inputs(p, q, n)
        h = self.target_rows(p, q, n)
        return self._recover(_pos(h - p), h)


@dataclass(frozen=True)
class ScalingRule(TargetRule):
    """Two-block targets (Theorem 2's shape): ``h_n = gamma(q_n)``, ``h_i = q_i (1 - gamma)/(1 - q_n)``.

    Convention: ``q_n = 1`` gives ``h = q`` (the 0/0 scale is taken as 0, as ``q_i = 0`` for ``i != n``).
    Subclasses define ``gamma`` only; one that overrides ``phi`` / ``residual`` / ... loses ``two_block``.
    """

    two_block: ClassVar[bool] = True

    def gamma(self, q_n: Array) -> Array:
        raise NotImplementedError

    def h_n(self, p_n, q_n):
        return self.gamma(q_n)

    def scale(self, q_n: Array, gamma: Array) -> Array:
        """``s = (1 - gamma) / (1 - q_n)``, with ``s = 0`` where ``q_n = 1``."""
        xp = xp_of(q_n)
        room = 1 - q_n
        return where0(room > 0, (1 - gamma) / xp.where(room > 0, room, xp.ones_like(room)))

    def target_rows(self, p, q, n):
        q_n = gather(q, n)
        g = self.gamma(q_n)
        return scatter(q * self.scale(q_n, g)[..., None], n, g)


@dataclass(frozen=True)
class SpS(ScalingRule):
    """Standard speculative sampling: ``h = q``, ``phi_n = min(1, q_n / p_n)``, ``g_n = (q - p)_+``.

    ``rand_bits = b`` (default None: the exact law above): the law of the test ``r <= q_n / p_n`` with ``r``
    uniform on the grid ``{m 2^-b : m = 0 .. 2^b - 1}``: transformers' assisted sampling test ``r_i <=
    probability_ratio`` with float32 uniforms ``r_i = torch.rand_like`` is ``b = 24`` (which versions:
    docs/production-rules.md):

        ``phi_n = min(1, (floor(2^b q_n / p_n) + 1) / 2^b)``   (``p_n > 0``),

    i.e. ``P(r <= rho) = #{m : m 2^-b <= rho} / 2^b``. The acceptance is rounded up to the grid, and a draft the
    verifier gives ``q_n = 0`` is accepted with probability ``2^-b`` (``r = 0``): the step then emits a token
    outside ``q``'s support with probability ``2^-b sum_{n: q_n = 0} p_n``. The recovery is unchanged
    (``(q - p)_+``): a rejection still needs ``q_n < p_n`` (``phi_n < 1`` only where ``floor(2^b q_n / p_n) <
    2^b - 1``), so the recovery row is SpS's, and the O(V log V) two-block law of ``exact`` (which reads
    ``phi`` from ``accept_from``) stays exact: the class vouches for ``two_block``.
    """

    rand_bits: int | None = None
    needs_row_stats: ClassVar[bool] = False  # phi reads p_n and q_n only
    two_block: ClassVar[bool] = True  # vouched (see the docstring), also with rand_bits
    _QUIET: ClassVar[tuple] = ("rand_bits",)
    __repr__ = _quiet_repr

    def __post_init__(self):
        if self.rand_bits is not None:
            b = check_int(self.rand_bits, "rand_bits", low=1)
            if b > 53:
                raise ValueError(f"rand_bits must be an integer in [1, 53] (a uniform on the grid m 2^-rand_bits; "
                                 f"float64 holds 53 bits) or None, got {self.rand_bits!r}")
            _set(self, rand_bits=b)

    def gamma(self, q_n):
        return q_n

    def phi(self, p_n, q_n, *stats):
        """``min(1, q_n / p_n)``; with ``rand_bits = b``, ``min(1, (floor(2^b q_n / p_n) + 1) / 2^b)``."""
        ratio = super().phi(p_n, q_n)
        if self.rand_bits is None:
            return ratio
        xp = xp_of(ratio)
        grid = 2.0 ** self.rand_bits  # up to 2^53: the grid arithmetic runs in float64 whatever the rows' dtype
        r64 = xp.astype(xp.clip(ratio, None, 1.0), xp.float64)
        return xp.astype(xp.clip((xp.floor(r64 * grid) + 1) / grid, None, 1.0), ratio.dtype)


def _boost(q: Array, c: float) -> Array:
    """``sqrt(c q (1 - q))`` for ``q`` in [0, 1], evaluated as ``sqrt(c) sqrt(q (1 - q))`` and set to 0
    where ``q (1 - q) = 0``: a huge ``c`` (``delta = 1e308``, or above float32's range) then gives an
    infinite boost where ``q`` is inside (0, 1) and 0 at the ends, never ``inf * 0 = NaN``."""
    xp = xp_of(q)
    v = q * (1 - q)
    sc = math.sqrt(float(c)) if np.ndim(c) == 0 and not is_torch_array(c) else xp_of(c).sqrt(c)  # c may be an array
    return where0(v > 0, sc * xp.sqrt(xp.where(v > 0, v, xp.ones_like(v))))


def taylor_gamma(q_n: Array, delta: float) -> Array:
    """Corollary 5: ``gamma* = min{q_n + sqrt(2 delta q_n (1 - q_n)), 1}``, with ``q_n`` first clipped
    to [0, 1] (low-precision rows can stray outside), so the square root never sees a negative;
    finite in every dtype for every finite ``delta >= 0`` (see ``_boost``)."""
    xp = xp_of(q_n)
    qc = xp.clip(q_n, 0.0, 1.0)
    return xp.clip(qc + _boost(qc, 2.0 * delta), qc, xp.ones_like(qc))


def two_block_divergence(gamma: Array, q_n: Array, divergence: str = "kl") -> Array:
    """Theorem 2's constraint: ``q_n f(gamma/q_n) + (1 - q_n) f((1 - gamma)/(1 - q_n))``,
    i.e. ``D((gamma, 1 - gamma) || (q_n, 1 - q_n))``, evaluated by the divergence's own code."""
    xp = xp_of(gamma, q_n)
    h2 = xp.stack([gamma, 1 - gamma], axis=-1)
    q2 = xp.stack([q_n, 1 - q_n], axis=-1)
    return F_DIVERGENCES[divergence](h2, q2)


def _closed_form_root(q_n: Array, delta: float, divergence: str) -> Array | None:
    """Closed-form roots of Theorem 2's equation where they exist (before clipping to [q_n, 1])."""
    xp = xp_of(q_n)
    if divergence == "chi2":  # (gamma - q)^2 / (q (1 - q)) = delta
        return q_n + _boost(q_n, delta)
    if divergence == "tv":  # gamma - q = delta
        return q_n + delta
    if divergence == "hellinger":  # 1 - cos(b - a) = delta, q = sin^2 a, gamma = sin^2 b
        if delta >= 1:
            return xp.ones_like(q_n)
        a = xp.asin(xp.sqrt(q_n))
        b = xp.clip(a + math.acos(1 - delta), None, math.pi / 2 + 0 * a)
        return xp.sin(b) ** 2
    return None


def _below_float64(x) -> bool:
    """``x`` is a floating array (numpy or torch) of less precision than float64."""
    return str(getattr(x, "dtype", "")).replace("torch.", "") in ("float32", "float16", "bfloat16")


def _round_down(x: Array, dtype) -> Array:
    """``x`` (float64, >= 0) in ``dtype``, rounded down: the largest value of ``dtype`` that is ``<= x``."""
    xp = xp_of(x)
    y = xp.astype(x, dtype)
    return xp.where(xp.astype(y, xp.float64) > x, xp.nextafter(y, xp.zeros_like(y)), y)


def two_block_root(q_n: Array, delta: float, divergence: str = "kl", iters: int = 100,
                   method: str = "auto") -> Array:
    """Theorem 2's ``gamma*``: the largest ``gamma`` in ``[q_n, 1]`` with
    ``q_n f(gamma/q_n) + (1 - q_n) f((1 - gamma)/(1 - q_n)) <= delta`` (1 if the budget allows 1).

    ``method="auto"`` uses a closed form for chi2, TV and Hellinger and a bracketing solve otherwise
    (``"bisect"`` forces the bracketing solve). The bracket ``[lo, hi]`` keeps ``D(lo) <= delta < D(hi)``
    and shrinks by Illinois regula falsi steps (bisection where the secant is unusable, e.g. an
    infinite ``D(hi)``) until it is below float64 resolution (``hi - lo <= 2^-52 hi + 1e-18``) or
    ``iters`` steps; the feasible end ``lo`` is returned, so the constraint always holds.

    ``q_n`` of a lower precision (float32, float16, bfloat16) is solved in float64 and the root returned
    in ``q_n``'s dtype rounded down (towards ``q_n``, which that dtype holds exactly): the returned
    ``gamma`` keeps ``D <= delta``, where rounding to nearest would overshoot the budget by up to half a
    unit in the last place of ``gamma`` (a D / delta of thousands in bfloat16 at small ``delta``).
    """
    xp = xp_of(q_n)
    if _below_float64(q_n):
        g = two_block_root(xp.astype(q_n, xp.float64), delta, divergence, iters, method)
        return _round_down(g, q_n.dtype)
    q = xp.clip(q_n, 0.0, 1.0)
    one = xp.ones_like(q)
    if delta == 0:  # only h = q is feasible; a bracket would stop ~1e-8 above q_n (D ~ (gamma - q_n)^2)
        return q
    if method == "auto":
        g = _closed_form_root(q, delta, divergence)
        if g is not None:
            return xp.clip(g, q, one)
    with errstate():
        f_hi = two_block_divergence(one, q, divergence) - delta
        done = f_hi <= 0
        lo, hi, f_lo = q, one, xp.zeros_like(q) - delta  # D(q_n) = 0
        last_ok = xp.zeros_like(q)  # +1: lo moved last step, -1: hi moved, 0: neither yet
        for _ in range(iters):
            width = hi - lo
            if bool(xp.all(done | (width <= 2.0**-52 * hi + 1e-18))):
                break
            sec = lo - f_lo * width / (f_hi - f_lo)
            use = xp.isfinite(sec) & (sec > lo) & (sec < hi)
            x = xp.where(use, sec, (lo + hi) / 2)
            f_x = two_block_divergence(x, q, divergence) - delta
            ok = f_x <= 0
            lo, f_lo = xp.where(ok, x, lo), xp.where(ok, f_x, f_lo)
            hi, f_hi = xp.where(ok, hi, x), xp.where(ok, f_hi, f_x)
            # Illinois: an end kept twice in a row has its value halved, so both ends converge
            f_hi = xp.where(ok & (last_ok > 0), f_hi / 2, f_hi)
            f_lo = xp.where(~ok & (last_ok < 0), f_lo / 2, f_lo)
            last_ok = xp.where(ok, one, -one)
    return xp.where(done, one, lo)


@dataclass(frozen=True)
class Cactus(ScalingRule):
    """Cactus: the optimum of ``max h_n`` s.t. ``D_f(h || q) <= delta`` (Theorem 2), two-block shape.

    ``solver="taylor"``: Corollary 5's closed form ``gamma* = min{q_n + sqrt(2 delta q_n (1-q_n)), 1}``
    (KL only). ``solver="exact"``: the root of Theorem 2's two-block equation for ``divergence`` in
    ``kl``, ``reverse_kl``, ``chi2``, ``tv``, ``hellinger``, ``js``. ``gamma`` is clipped to
    ``[q_n, 1]``; ``delta = 0`` is SpS; ``q_n = 1`` gives ``h = q``.

    ``convention="authors"``: the authors' code (``cactus.py``'s ``CactusRejectionSampler`` and its Triton
    kernel): a drafted token with ``p_n = 0`` is accepted iff ``gamma > 0`` (``h_n / 0 = inf``; the kernel's
    ``rand * p_n < h_n``), i.e. iff ``q_n > 0``; and a rejection whose residual ``(h - p)_+`` is all zero emits
    token 0 (ours: a draw from ``h``). Exact law: ``phi_n`` and ``g_n`` change only at ``p_n = 0`` and at
    ``sum (h - p)_+ = 0``, and neither carries weight in ``h_alg = sum_n p_n [phi_n e_n + (1 - phi_n) g_n]``: the
    first has ``p_n = 0``; a rejection needs ``gamma < p_n``, so ``sum (h - p)_+ = sum (p - h)_+ > 0``. ``h_alg``
    is ours exactly; what differs is the law given a drafted ``n`` outside ``p``'s support, ``phi_n e_n + (1 -
    phi_n) g_n`` (a ``p`` truncated after sampling, or rounded to 0 in low precision). The Taylor ``h_n``, its
    clamp to ``[0, 1]`` and the scale ``(1 - h_n) / (1 - q_n)`` (1 at ``q_n = 1`` in the PyTorch path, where
    ``q_i = 0`` for ``i != n``; ``(1 - q_n)`` floored at 1e-10 in the kernel) are ours for ``q_n`` in [0, 1].
    """

    delta: float = 1.0
    divergence: str = "kl"
    solver: str = "taylor"
    convention: str = "ours"
    _QUIET: ClassVar[tuple] = ("convention",)
    _AUTHORS_RECOVERY: ClassVar[str] = "token0"
    __repr__ = _quiet_repr

    def __post_init__(self):
        _set(self, delta=check_nonneg(self.delta, "delta"))
        _check_choice(self.divergence, "divergence", tuple(F_DIVERGENCES))
        _check_choice(self.solver, "solver", ("taylor", "exact"))
        _check_choice(self.convention, "convention", CONVENTIONS)
        if self.solver == "taylor" and self.divergence != "kl":
            raise ValueError(
                f"solver='taylor' (Corollary 5) is defined for divergence='kl' only, got "
                f"divergence={self.divergence!r}; use solver='exact'"
            )

    def gamma(self, q_n):
        if self.solver == "taylor":
            return taylor_gamma(q_n, self.delta)
        return two_block_root(q_n, self.delta, self.divergence)


@dataclass(frozen=True)
class Interpolation(TargetRule):
    """Target ``h = alpha p + (1 - alpha) q``: ``phi_n = min(1, alpha + (1 - alpha) q_n / p_n)``,
    recovery ``(h - p)_+ = (1 - alpha)(q - p)_+``; the output law is exactly ``h``.

    ``convention="authors"``: the authors' ``interp.py`` (``InterpRejectionSampler``, vLLM 0.7.3's recovery): a
    drafted token with ``p_n = 0`` is accepted iff ``h_n > 0`` (``h_n / 0 = inf``), and the recovery weights are
    floored, ``g = max((h - p), t) / sum max((h - p), t)`` with ``t = FLOAT32_TINY = 2^-126``, so that every
    token keeps a positive recovery mass. Exact law: ``h_alg = min(p, h) + sum_n p_n (1 - phi_n) g``, with
    ``R = sum_n p_n (1 - phi_n) = sum (h - p)_+ = (1 - alpha) TV(p, q)`` and ``g`` above (it does not depend on
    ``n``). It puts at least ``R t / sum max(h - p, t)`` (about ``t``) on every token, also on one that neither
    ``p`` nor ``q`` can emit (then ``KL(h_alg || q) = inf`` as soon as a rejection is possible), and lies within TV
    ``sum max(h - p, t) - R <= V t`` of ``h``.
    """

    alpha: float = 0.5
    convention: str = "ours"
    _QUIET: ClassVar[tuple] = ("convention",)
    _AUTHORS_RECOVERY: ClassVar[str] = "floor"
    __repr__ = _quiet_repr

    def __post_init__(self):
        _set(self, alpha=check_number(self.alpha, "alpha", low=0.0, high=1.0, what="in [0, 1]"))
        _check_choice(self.convention, "convention", CONVENTIONS)

    def h_n(self, p_n, q_n):
        return self.alpha * p_n + (1 - self.alpha) * q_n

    def target_rows(self, p, q, n):
        return self.alpha * p + (1 - self.alpha) * q


@dataclass(frozen=True)
class Ensemble(TargetRule):
    """transformers' static ensemble verification (``generate(..., assistant_ensemble_weight=w)``; DIVERSE,
    arXiv 2604.07622), in transformers' parameterisation: ``w = weight`` is the verifier's weight in the target

        ``h = w q + (1 - w) p``,   ``phi_n = min(1, 1 - w + w q_n / p_n)``,
        ``g_n = (q - p)_+ / Z`` with ``Z = sum (q - p)_+``, and ``g_n = q`` where ``Z <= t``,

    ``t = FLOAT32_TINY`` (transformers: ``p_prime_sum <= torch.finfo(p_prime.dtype).tiny``, in float32 there;
    ``Z`` is computed in the rows' dtype). ``w = 1`` is SpS's law, ``w = 0`` accepts every draft (``h = p``);
    transformers takes ``w`` in (0, 1).

    Exact law. ``1 - w + w q_n / p_n = h_n / p_n`` and ``(h - p)_+ = w (q - p)_+``, so where ``Z > t`` (and where
    ``Z = 0``, i.e. ``p = q = h``, where every draft is accepted) the step is Theorem 1's towards ``h``:
    ``h_alg = h``. Where ``0 < Z <= t``, ``h_alg = min(p, h) + w Z q`` (the rejection mass is ``sum (p - h)_+ =
    w Z``), at TV at most ``w Z <= w t`` from ``h``.

    Relation to ``Interpolation``: ``Ensemble(w)`` and ``Interpolation(1 - w)`` have the same target ``h``, the
    same acceptance and, for ``w > 0``, the same recovery except where ``0 < Z <= t`` (Interpolation normalises
    ``(h - p)_+`` whatever its sum): their one-step laws are equal where ``Z > t`` or ``Z = 0``, and within TV
    ``w t`` (about ``1.2e-38 w``) everywhere.

    Upstream: transformers ``transformers/generation/utils.py`` (``_speculative_sampling``) @ 5.24.0 and 5.25.0
    (5.25 changed only ``r_i <= probability_ratio`` to ``<``: with a ratio ``>= 1 - w > 0`` the ``<=`` of 5.24
    only rounds the acceptance up to float32 ``torch.rand``'s grid, by less than ``2^-24``).
    """

    weight: float = 0.5
    needs_row_stats: ClassVar[bool] = False  # phi reads p_n and q_n only

    def __post_init__(self):
        _set(self, weight=check_number(self.weight, "weight", low=0.0, high=1.0, what="in [0, 1]"))

    def h_n(self, p_n, q_n):
        return self.weight * q_n + (1 - self.weight) * p_n

    def target_rows(self, p, q, n):
        return self.weight * q + (1 - self.weight) * p

    def phi(self, p_n, q_n, *stats):
        """``1 - w + w q_n / p_n`` (transformers' ``probability_ratio``; 0 where ``p_n = 0``)."""
        xp = xp_of(p_n, q_n)
        if self.weight == 0:  # every draft is accepted (and w * (q_n / p_n) could read 0 * inf)
            return xp.astype(p_n > 0, p_n.dtype)
        with errstate():
            ratio = q_n / xp.where(p_n > 0, p_n, xp.ones_like(p_n))
        return where0(p_n > 0, (1 - self.weight) + self.weight * ratio)

    def residual(self, p, q, n, *, check=True):
        """``(q - p)_+ / Z`` where ``Z = sum (q - p)_+ > FLOAT32_TINY``, else ``q``."""
        if check:
            _check_inputs(p, q, n)
        xp = xp_of(p, q)
        r = _pos(q - p)
        z = xp.sum(r, axis=-1, keepdims=True)
        ok = z > FLOAT32_TINY
        return xp.where(ok, r / xp.where(ok, z, xp.ones_like(z)), q + 0 * p)


@dataclass(frozen=True)
class TAS(Rule):
    """Typical acceptance sampling (Medusa / vLLM): accept ``n`` deterministically iff
    ``q_n > min(epsilon, alpha exp(-H(q)))``; on rejection emit ``argmax q`` (as vLLM does); the bonus
    token is drawn from ``q``.

    Upstream: vLLM ``vllm/model_executor/layers/typical_acceptance_sampler.py`` (the version matched:
    docs/production-rules.md). It accepts iff ``q_n > min(posterior_threshold, posterior_alpha exp(-H))`` with
    ``H = -sum_i q_i log(q_i + 1e-5)``, recovers ``argmax q`` (``_get_recovered_token_ids``: first
    maximum on ties, as ``argmax`` here) and takes the bonus token from the target's ordinary sampler
    (``q``). Match: yes with ``entropy_eps=1e-5``; the default ``entropy_eps=0`` is Proposition 4's
    exact entropy (the documented API default), not vLLM's constant.

    ``entropy_eps``: the entropy is ``H(q) = -sum_i q_i log(q_i + entropy_eps)``. ``0`` (default) is
    the exact Shannon entropy (Proposition 4's reading); ``1e-5`` is what vLLM's typical acceptance
    sampler computes, which lowers ``H`` on spread-out rows and so raises the threshold (fewer
    acceptances at full vocabulary).

    Proposition 4: equivalently ``H(e_n, q) = -log q_n < max(-log epsilon, H(q) - log alpha)``
    (see ``cross_entropy_threshold``).

    ``convention="authors"``: the authors' ``tas.py`` runs vLLM's ``TypicalAcceptanceSampler``, which
    never reads ``p``: a drafted token with ``p_n = 0`` is accepted iff it passes the test (ours: never). That
    decision has weight ``p_n = 0`` in ``h_alg``, which is ours exactly. The authors' setting is
    ``TAS(entropy_eps=1e-5, convention="authors")``.
    """

    epsilon: float = 0.09
    alpha: float = 0.3
    entropy_eps: float = 0.0
    convention: str = "ours"
    _QUIET: ClassVar[tuple] = ("convention",)
    __repr__ = _quiet_repr

    def __post_init__(self):
        _check_typical(self)
        _check_choice(self.convention, "convention", CONVENTIONS)

    def entropy(self, q: Array) -> Array:
        """``H(q) = -sum_i q_i log(q_i + entropy_eps)`` per row: (..., V) -> (...)."""
        xp = xp_of(q)
        with errstate():
            return -xp.sum(xlogy(q, q + self.entropy_eps), axis=-1)

    def row_stats(self, q):
        xp = xp_of(q)
        return (xp.exp(-self.entropy(q))[..., None],)

    def cross_entropy_threshold(self, q: Array) -> Array:
        """Proposition 4's threshold ``max(-log epsilon, H(q) - log alpha)`` on ``-log q_n``."""
        xp = xp_of(q)
        return xp.clip(self.entropy(q) - math.log(self.alpha), -math.log(self.epsilon), None)

    def phi(self, p_n, q_n, exp_neg_h):
        xp = xp_of(q_n)
        thr = xp.clip(self.alpha * exp_neg_h, None, self.epsilon)
        return xp.astype(q_n > thr, q_n.dtype)

    def residual(self, p, q, n, *, check=True):
        """``g_n = e_{argmax q}`` for every ``n``."""
        if check:
            _check_inputs(p, q, n)
        xp = xp_of(q)
        return xp.astype(one_hot_like(q, xp.argmax(q, axis=-1)), q.dtype)


TOPK_RECOVERIES = ("q", "topk")


@dataclass(frozen=True)
class TopK(Rule):
    """Top-k acceptance: accept ``n`` iff ``q_n >= q_(k)``, the k-th largest ``q`` (ties accepted).

    ``recovery`` on rejection:
      ``"q"``     sample from ``q`` (our default);
      ``"topk"``  the authors' reference code: ``(1[q >= q_(k)] - p)_+`` normalised, i.e. a token of
                  the top-k set, favouring those the draft under-weights (with ``k = 1`` it always
                  emits ``argmax q``). If ``q_(k) = 0`` (fewer than ``k`` tokens with ``q > 0``) the
                  set ``q >= q_(k)`` is the whole vocabulary, as the formula says.
    ``k`` must not exceed the vocabulary size (checked where ``q`` is first seen).

    Upstream: the authors' ``topk.py`` (``TopKRejectionSampler``, MANGA-UOFA/Cactus @ 3b01b81): accept iff
    ``q_n >= q_(k)`` (``topk(...).values[..., k - 1]``, ties accepted) and recover from
    ``(1[q >= q_(k)] - p)_+``: ``recovery="topk"``. Unlike ``RelaxedAcceptance`` (a server's ``top_k`` call),
    this test accepts every tie at ``q_(k)``.

    ``convention="authors"``: that code's conventions: a drafted token with ``p_n = 0`` is judged by the test
    (which never reads ``p``; ours: never accepted), and an all-zero recovery row emits token 0 (ours: uniform on
    the top set). Exact law: both have weight 0 in ``h_alg``, which is ours exactly (a rejected ``n`` with
    ``p_n > 0`` lies outside the top set, so ``(1[q >= q_(k)] - p)_+ > 0`` on it).
    """

    k: int = 1
    recovery: str = "q"
    convention: str = "ours"
    _QUIET: ClassVar[tuple] = ("convention",)
    _AUTHORS_RECOVERY: ClassVar[str] = "token0"
    __repr__ = _quiet_repr

    def __post_init__(self):
        _set(self, k=check_positive_int(self.k, "k"))
        _check_choice(self.recovery, "recovery", TOPK_RECOVERIES)
        _check_choice(self.convention, "convention", CONVENTIONS)

    def rank_depth(self) -> int:
        return int(self.k)  # the k-th largest value q_(k)

    def row_stats(self, q):
        V = q.shape[-1]
        if self.k > V:
            raise ValueError(f"k must be <= the vocabulary size V = {V}, got k = {self.k}")
        k = int(self.k)
        if is_torch_array(q):
            return (q.topk(k, dim=-1).values[..., -1:],)
        return (np.partition(q, V - k, axis=-1)[..., V - k: V - k + 1],)

    def phi(self, p_n, q_n, kth):
        xp = xp_of(q_n)
        return xp.where(q_n >= kth, xp.ones_like(q_n), xp.zeros_like(q_n))

    def residual(self, p, q, n, *, check=True):
        """``g_n = q`` (``recovery="q"``) or ``(1[q >= q_(k)] - p)_+`` normalised (``"topk"``)."""
        if check:
            _check_inputs(p, q, n)
        if self.recovery == "q":
            return q + 0 * p
        xp = xp_of(p, q)
        (kth,) = self.row_stats(q)
        top = xp.astype(q >= kth, q.dtype)
        return self._recover(_pos(top - p), top / xp.sum(top, axis=-1, keepdims=True))


@dataclass(frozen=True)
class EARS(Rule):
    """EARS (arXiv 2512.13194): accept iff ``u < min(1, q_n / p_n + beta (1 - max q))``;
    on rejection sample from ``(q - p)_+`` normalised (``q`` if that is zero). ``beta = 0`` is SpS.

    Upstream: the paper (arXiv 2512.13194 v1: a tolerance ``beta (1 - max q)`` added to the ratio test);
    no released code of it was found, so recovery and bonus are SpS's (``(q - p)_+``, bonus from ``q``).
    """

    beta: float = 0.5

    def __post_init__(self):
        _set(self, beta=check_nonneg(self.beta, "beta"))

    def row_stats(self, q):
        xp = xp_of(q)
        return (xp.max(q, axis=-1, keepdims=True),)

    def phi(self, p_n, q_n, qmax):
        xp = xp_of(p_n, q_n)
        with errstate():
            ratio = q_n / xp.where(p_n > 0, p_n, xp.ones_like(p_n))
        slack = 1 - qmax
        return ratio + where0(slack > 0, self.beta * slack)  # beta = 1e308 in float32: no inf * 0

    def residual(self, p, q, n, *, check=True):
        """``g_n = (q - p)_+ / sum (q - p)_+``."""
        if check:
            _check_inputs(p, q, n)
        return _normalise(_pos(q - p), q + 0 * p)


# -- lossy rules that production servers ship ----------------------------------------------------
# Each is the one-position law of the server's verification, in the paper's letters (p draft, q
# verifier after the sampling transforms); where the server's decision reads more than one position
# (a window, a thinking-phase flag, a tree of siblings) the docstring says what is modelled exactly
# and what is a parameter. Their exact one-step laws and divergence costs come from
# ``exact.induced_distribution`` / ``exact.step_divergence`` like every other rule's.


def descending_rank(q: Array) -> Array:
    """Position of each token in ``q``'s descending order, ties broken by lower token id first:
    ``rank_n = #{i: q_i > q_n} + #{i < n: q_i = q_n}``, (..., V) int. Computed by a stable sort of
    ``-q`` (numpy ``argsort(kind="stable")``, torch ``sort(stable=True)``), so both backends give the
    same ranks; the ``topk`` indices of ``top_k`` in this order are ``{n: rank_n < topk}``."""
    if is_torch_array(q):
        import torch

        order = torch.sort(-q, dim=-1, stable=True).indices
        pos = torch.arange(q.shape[-1], device=q.device).expand_as(order)
        return torch.empty_like(order).scatter_(-1, order, pos)
    q = np.asarray(q)
    order = np.argsort(-q, axis=-1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(q.shape[-1]), order.shape), axis=-1)
    return rank


def _check_prob_param(rule, name: str, *, low_open: bool = False, high_open: bool = False) -> None:
    """``rule.<name>`` must be a probability-valued parameter (``validate.check_prob_param``); a numpy
    scalar is stored back as a Python number."""
    _set(rule, **{name: check_prob_param(getattr(rule, name), name, low_open=low_open, high_open=high_open)})


def _without_n(q: Array, n: Array) -> Array:
    """``q`` with the drafted token's mass removed, renormalised: ``(q - q_n e_n) / (1 - q_n)``
    (``q`` itself where nothing is left, i.e. ``q_n = 1``)."""
    return _normalise(scatter(q, n, 0 * gather(q, n)), q)


@dataclass(frozen=True)
class SGLangThreshold(Rule):
    """SGLang's threshold acceptance (``--speculative-accept-threshold-single`` / ``-acc``), chain case.

    SGLang's target-only verification (``tree_speculative_sampling_target_only``) reads no draft
    probability: a drafted token is accepted iff ``q_n > 0`` and (``u < q_n / threshold_acc`` or
    ``q_n >= threshold_single``), so

        ``phi_n = 1[q_n > 0] (1 if q_n >= threshold_single else min(1, q_n / threshold_acc))``;

    on rejection it samples ``relu(q - p')`` where ``p'`` is zero but for ``p'_n = q_n``, i.e. ``q``
    without ``n``, renormalised; the bonus token is drawn from ``q``. With both thresholds 1 the step's
    law is exactly ``q`` for every draft law (``q_n e_n + (q - q_n e_n) = q``): lossless, acceptance
    ``sum_n p_n q_n``; thresholds below 1 are lossy. Modelled exactly for a chain (one candidate per
    depth, EAGLE ``topk = 1``); in a tree SGLang shares one uniform among siblings and accumulates
    their ``q`` (``prob_acc``), which this one-candidate law does not cover.

    Upstream: ``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh``
    (``TreeSpeculativeSamplingTargetOnly``, reached through ``sglang/kernels/ops/speculative/sampling.py``
    and ``srt/speculative/eagle_utils.py``, ``draft_probs = zeros``) @ sglang 0.5.23. Since SGLang PR
    #35798 a draft with ``q_n = 0`` (``has_target_mass`` false) is never accepted, even at
    ``threshold_single = 0``, where kernels before it accepted it (sglang 0.5.23 runs this JIT kernel on
    CUDA; only its MUSA path still imports sgl-kernel's, not read here). Match: yes (chain).
    """

    threshold_single: float = 1.0
    threshold_acc: float = 1.0
    needs_row_stats: ClassVar[bool] = False  # phi_n reads q_n only

    @property
    def revision(self) -> int:
        """2 at ``threshold_single = 0``, where revision 2 never accepts a draft with ``q_n = 0`` (revision 1
        did); every other setting's law is the same in both (``q_n = 0`` gives ``phi_n = q_n / threshold_acc
        = 0`` there)."""
        return 2 if self.threshold_single == 0 else 1

    def __post_init__(self):
        _check_prob_param(self, "threshold_single")
        _check_prob_param(self, "threshold_acc", low_open=True)
        if self.threshold_acc < FLOAT16_TINY:  # phi divides q_n by it in the probabilities' dtype
            raise ValueError(f"threshold_acc must be >= 2^-24 ~ 5.96e-08 (float16's smallest positive value: phi = "
                             f"q_n / threshold_acc is computed in the probabilities' dtype, where a smaller value "
                             f"rounds to 0 and q_n = 0 gives 0/0 = NaN), got {self.threshold_acc!r}")

    def phi(self, p_n, q_n, *stats):
        xp = xp_of(q_n)
        phi = xp.where(q_n >= self.threshold_single, xp.ones_like(q_n), q_n / self.threshold_acc)
        return where0(q_n > 0, phi)  # no target mass: never accepted, whatever the thresholds

    def residual(self, p, q, n, *, check=True):
        """``g_n = (q - q_n e_n) / (1 - q_n)``."""
        if check:
            _check_inputs(p, q, n)
        return _without_n(q + 0 * p, n)


@dataclass(frozen=True)
class RelaxedAcceptance(Rule):
    """Relaxed acceptance of Modular MAX and TensorRT-LLM (``relaxed_topk``, ``relaxed_delta``).

    Both servers call ``top_k(q, k = topk)`` and accept a drafted token deterministically iff it is one
    of the ``topk`` indices returned and ``q_n >= max q - delta``; on rejection they emit the target's
    argmax (the first index ``top_k`` returns). With ``rank_n`` the position of ``n`` in the order
    ``top_k`` returns,

        ``phi_n = 1[rank_n < topk] 1[q_n >= max q - delta]``,   ``g_n = e_{argmax q}``.

    Exactly ``min(topk, V)`` tokens pass the rank test, so an exact tie at the k-th value does not
    widen the set (unlike ``TopK``). Tie order (ours, deterministic): lower token id first, i.e.
    ``rank`` is the position in a stable sort of ``-q`` (numpy ``argsort(kind="stable")``, torch
    ``sort(stable=True)``: both backends agree); ``g_n``'s argmax is the first maximum, the rank-0 token.
    Upstream's tie order is that of its ``top_k`` kernel, which neither server specifies (torch.topk
    on CUDA, MAX's ``ops.top_k``). ``topk = 1`` accepts the argmax only; ``delta >= 1`` leaves the rank
    test alone. The bonus token is drawn from ``q`` (MAX: the row's ordinary sample; TensorRT-LLM, greedy
    only: the argmax of that row, which is its ``q``'s sample at temperature 0). MAX applies the rule
    only to rows inside a ``<think>`` span (a per-request flag: rows outside are verified losslessly)
    and only with argmax drafts, reading the untempered softmax of the target's logits: pass that row
    as ``q`` to reproduce its decision. Defaults: the values of TensorRT-LLM's DeepSeek-R1 example
    (10, 0.6).

    Upstream: MAX ``max/nn/sampling/rejection_sampler.py`` (``_relaxed_thinking_verdict``);
    TensorRT-LLM ``tensorrt_llm/_torch/speculative/mtp.py`` (``topk_kernel``: ``torch.topk`` of the
    softmax) and ``cpp/tensorrt_llm/kernels/speculativeDecoding/mtpKernels.cu``
    (``mtpRelaxedAcceptanceKernel``: accept iff the draft is one of the ``topk`` ids with value
    ``>= top1 - delta``; the emitted token after the accepted ones is the top-1 id); the versions
    matched: docs/production-rules.md. Match: yes, ties aside.
    """

    topk: int = 10
    delta: float = 0.6
    revision: ClassVar[int] = 2  # r2: exactly the k indices top_k returns (r1: every q_n >= the k-th value)
    needs_row_stats: ClassVar[bool] = True

    def __post_init__(self):
        _set(self, topk=check_positive_int(self.topk, "topk"), delta=check_nonneg(self.delta, "delta"))

    def rank_depth(self) -> int:
        return int(self.topk)  # the topk indices top_k returns

    def stats_all(self, q):
        """``(1[rank_n < topk], max q - delta)``: the membership in ``top_k``'s index set, (..., V) (a
        per-token statistic: which of several tied tokens is in depends on its id), and the floor
        (..., 1)."""
        xp = xp_of(q)
        in_top = xp.astype(descending_rank(q) < self.topk, q.dtype)  # topk > V: every token is in
        return in_top, xp.max(q, axis=-1, keepdims=True) - self.delta

    def stats_at(self, q, n):
        in_top, floor = self.stats_all(q)
        return gather(in_top, n), floor[..., 0]

    def row_stats(self, q):
        raise ValueError("RelaxedAcceptance's top-k membership is a per-token statistic: use stats_all / stats_at")

    def phi(self, p_n, q_n, in_top, floor):
        xp = xp_of(q_n)
        ok = (in_top > 0) & (q_n >= floor)
        return xp.where(ok, xp.ones_like(q_n), xp.zeros_like(q_n))

    def residual(self, p, q, n, *, check=True):
        """``g_n = e_{argmax q}``."""
        if check:
            _check_inputs(p, q, n)
        xp = xp_of(q)
        return xp.astype(one_hot_like(q, xp.argmax(q, axis=-1)), q.dtype)


@dataclass(frozen=True)
class MedusaTypical(Rule):
    """Medusa's typical acceptance (Cai et al. 2024), as Medusa's runnable path runs it.

    Accept iff ``q_n > tau(q) = min(epsilon, alpha exp(-H_eps(q)))`` with Medusa's entropy
    ``H_eps(q) = -sum_i q_i log(q_i + entropy_eps)``; the token emitted after the accepted drafts is
    ``argmax q`` of that position, both after a rejection and as the bonus (all drafts accepted):

        ``phi_n = 1[q_n > tau(q)]``,   ``g_n = e_{argmax q}``,   ``bonus(q) = e_{argmax q}``

    (``bonus_from_q = False``: ``sampler.verify`` / ``verify_flat`` and ``toy.sequence_law`` draw the
    bonus from ``bonus(q)``). Medusa's defaults are ``posterior_threshold = 0.09``,
    ``posterior_alpha = 0.3``, ``1e-5`` in the log. Argmax ties: the first maximum (lowest id), as
    ``torch.argmax``.

    Upstream: FasterDecoding/Medusa ``medusa/model/utils.py`` (``evaluate_posterior`` with
    ``fast=True``, ``generate_candidates``) and ``medusa/model/medusa_model.py`` (``medusa_generate``,
    ``fast=True`` by default) @ commit e2a5d20 (2024-04-18, the repository's newest; package version 1.0,
    never released; the one release, medusa-llm 0.1, always takes ``argmax`` of the verifier's logits
    as the next token). ``fast=True`` accepts by the test above and makes the next step's first
    candidate ``argmax`` of the verifier's logits at the first unaccepted position (so recovery and
    bonus are ``argmax q``; the temperature does not move an argmax). The ``fast=False`` path, which
    would sample the truncated ``q``, raises a TypeError upstream (``evaluate_posterior`` passes six
    arguments to the five-parameter ``get_typical_posterior_mask``), so no released or runnable Medusa
    samples the truncated ``q``, and neither does this class. Match: yes for a chain; Medusa verifies
    a tree of candidates from its heads and keeps the longest accepted path, not modelled.

    Relation to ``TAS``: vLLM's typical acceptance sampler took Medusa's test with these constants
    (``alpha = sqrt(epsilon)``), so ``TAS(epsilon, alpha, entropy_eps)`` accepts and recovers exactly
    as ``MedusaTypical(epsilon, alpha, entropy_eps)`` does; they differ only in the bonus token (vLLM
    samples it from ``q``, Medusa emits ``argmax q``), which changes the law of a whole chain, not of
    one step.
    """

    epsilon: float = 0.09
    alpha: float = 0.3
    entropy_eps: float = 1e-5
    revision: ClassVar[int] = 2  # r2: recovery and bonus argmax q (r1: the truncated q, bonus from q)
    needs_row_stats: ClassVar[bool] = True
    bonus_from_q: ClassVar[bool] = False  # the bonus is argmax q

    def __post_init__(self):
        _check_typical(self)

    def threshold(self, q: Array) -> Array:
        """``tau(q) = min(epsilon, alpha exp(sum_i q_i log(q_i + entropy_eps)))`` per row: (..., V) -> (...)."""
        xp = xp_of(q)
        with errstate():
            terms = xp.where(q > 0, q * xp.log(q + self.entropy_eps), xp.zeros_like(q))
        return xp.clip(self.alpha * xp.exp(xp.sum(terms, axis=-1)), None, self.epsilon)

    def row_stats(self, q):
        return (self.threshold(q)[..., None],)

    def phi(self, p_n, q_n, tau):
        return xp_of(q_n).astype(q_n > tau, q_n.dtype)

    def residual(self, p, q, n, *, check=True):
        """``g_n = e_{argmax q}`` for every ``n``."""
        if check:
            _check_inputs(p, q, n)
        return self.bonus(q + 0 * p)

    def bonus(self, q):
        """``e_{argmax q}`` (first maximum on ties), (..., V)."""
        xp = xp_of(q)
        return xp.astype(one_hot_like(q, xp.argmax(q, axis=-1)), q.dtype)


@dataclass(frozen=True)
class FLy(Rule):
    """vLLM's FLy verification (``rejection_sample_method="fly"``; arXiv 2511.22972), one position.

    FLy runs native speculative sampling and defers (accepts) a native rejection at position ``j`` iff
    the target is uncertain there, ``H_k(q) = -sum_{k largest} q_i log q_i >= entropy_threshold``
    (``fly_entropy_top_k = 3`` by default, on the processed target probabilities), ``q_n > 0``, and
    the next ``W = fly_window_size`` drafts are all natively accepted (with their own uniforms; only
    positions with ``j + W < k`` can defer). A rejection that is not deferred recovers natively from
    ``(q - p)_+``. The window couples positions: the deferral's probability is
    ``P(next W natively accepted | context, n)``, a property of the future drafts, not of this row.
    Modelled here as the parameter ``window_accept = f``:

        ``phi_n = a_n + (1 - a_n) 1[H_k(q) >= entropy_threshold] 1[q_n > 0] f``,
        ``a_n = min(1, q_n / p_n)``, ``g_n = (q - p)_+`` normalised,

    which is exact for a position whose window is accepted with probability ``f`` whatever ``n`` is
    (``f = 1``: the most FLy can defer, an upper bound of its acceptance and cost; ``f = 0``, or a
    position among the last ``W``, is SpS). The greedy (temperature 0) path is not modelled.

    Upstream: vLLM ``vllm/v1/spec_decode/fly.py`` (``compute_fly_entropy``,
    ``apply_fly_random_acceptance_kernel``) and ``vllm/config/speculative.py`` (version: docs/production-rules.md): native
    acceptance ``q_n / p_n >= u``; deferral iff not natively accepted, ``p_n > 0``, ``q_n > 0``,
    ``pos + W < k``, top-k entropy of the processed target probabilities ``>= fly_entropy_threshold``,
    and the next ``W`` drafts natively accepted; recovery and bonus are the native ones (``(q - p)_+``,
    ``q``). Defaults ``fly_entropy_threshold = 0.3``, ``fly_entropy_top_k = 3``. Match: yes (one position,
    ``f`` a parameter as above).
    """

    entropy_threshold: float = 0.3
    entropy_top_k: int = 3
    window_accept: float = 1.0
    needs_row_stats: ClassVar[bool] = True

    def __post_init__(self):
        _set(self, entropy_threshold=check_nonneg(self.entropy_threshold, "entropy_threshold"),
             entropy_top_k=check_positive_int(self.entropy_top_k, "entropy_top_k"))
        _check_prob_param(self, "window_accept")

    def rank_depth(self) -> int:
        return int(self.entropy_top_k)  # the k largest q_i of the top-k entropy

    def top_entropy(self, q: Array) -> Array:
        """``H_k(q) = -sum over the k largest q_i of q_i log q_i`` (not renormalised, as vLLM): (..., V) -> (...)."""
        xp = xp_of(q)
        k = min(int(self.entropy_top_k), q.shape[-1])
        if is_torch_array(q):
            top = q.topk(k, dim=-1).values
        else:
            top = -np.sort(-q, axis=-1)[..., :k]
        with errstate():
            return -xp.sum(xp.where(top > 0, top * xp.log(xp.where(top > 0, top, xp.ones_like(top))),
                                    xp.zeros_like(top)), axis=-1)

    def row_stats(self, q):
        xp = xp_of(q)
        gate = self.top_entropy(q) >= self.entropy_threshold
        return (xp.astype(gate, q.dtype)[..., None],)

    def phi(self, p_n, q_n, gate):
        xp = xp_of(p_n, q_n)
        a = xp.clip(SpS().phi(p_n, q_n), 0.0, 1.0)
        defer = gate * xp.astype(q_n > 0, q_n.dtype) * self.window_accept
        return a + (1 - a) * defer

    def residual(self, p, q, n, *, check=True):
        """``g_n = (q - p)_+ / sum (q - p)_+`` (native recovery; ``q`` if that is zero)."""
        if check:
            _check_inputs(p, q, n)
        return _normalise(_pos(q - p), q + 0 * p)


def _ratio_over(p_n: Array, q_n: Array, c) -> Array:
    """``q_n / (c p_n)``, 0 where ``p_n = 0``, and 1 where ``c = 0`` (a test ``q_n / p_n >= c u`` then always
    passes): the acceptance of a ratio test whose uniform is scaled by ``c`` in (0, 1]."""
    xp = xp_of(p_n, q_n)
    with errstate():
        ratio = q_n / xp.where(p_n > 0, p_n, xp.ones_like(p_n))
        c = c + 0 * ratio
        scaled = xp.where(c > 0, ratio / xp.where(c > 0, c, xp.ones_like(c)), xp.ones_like(ratio))
    return where0(p_n > 0, scaled)


@dataclass(frozen=True)
class EntropyVerify(Rule):
    """vLLM-Ascend's entropy verification (``rejection_sampler_config.enable_entropy_verify``), one position.

    The ratio test's uniform is scaled by an entropy-dependent factor ``c(q) = min(threshold, exp(-alpha H(q)))``,
    ``H(q) = -sum_i q_i log(q_i + entropy_eps)``: a draft is accepted iff ``q_n / p_n >= c(q) u``, so

        ``phi_n = min(1, q_n / (c(q) p_n))``,   ``g_n = (q - p)_+ / sum (q - p)_+``  (``q`` if that is zero),

    and the bonus token is drawn from ``q``. ``c <= threshold <= 1``: the acceptance is SpS's divided by ``c``,
    the recovery SpS's, so the step is lossy for every ``c < 1`` (``threshold = 1, alpha = 0`` is SpS). A confident
    ``q`` (small ``H``) keeps ``c`` near ``threshold``; a spread-out ``q`` lowers it and accepts more.
    ``alpha = 0`` gives the constant ``c = threshold``: ``Lenience(threshold)``'s law.

    Upstream: vllm-project/vllm-ascend ``vllm_ascend/sample/rejection_sampler.py`` (``rejection_random_sample_pytorch``,
    ``ENTROPY_VERIFY``) and ``vllm_ascend/ops/triton/reject_sample.py`` (``rejection_random_sample_kernel``),
    ``vllm_ascend/ascend_config.py`` (``RejectionSamplerConfig``: ``posterior_threshold = 0.95`` in (0, 1],
    ``posterior_alpha = 0.4`` >= 0) (the commit matched: docs/production-rules.md): accept iff
    ``p_n > 0`` and ``q_n / p_n >= min(exp(-alpha H), threshold) u`` with ``EPSILON = 1e-10`` in the entropy;
    recovery vLLM's ``(q - p)_+`` race. Match: yes where the row ``q`` passed here is the one the entropy is read
    from; upstream reads ``H`` from the softmax of the target's raw logits (before temperature, penalties and
    top-k / top-p) and ``q_n`` from the processed row, so with sampling transforms the two rows differ (not
    modelled: pass the raw row's entropy through ``alpha`` and ``threshold`` only at temperature 1 without
    truncation). Its block verification (``enable_block_verify``) is ``theory.tree.verify_block_ascend``.
    """

    threshold: float = 0.95
    alpha: float = 0.4
    entropy_eps: float = 1e-10
    needs_row_stats: ClassVar[bool] = True

    def __post_init__(self):
        _check_prob_param(self, "threshold", low_open=True)
        _set(self, alpha=check_nonneg(self.alpha, "alpha"), entropy_eps=check_nonneg(self.entropy_eps, "entropy_eps"))

    def scale(self, q: Array) -> Array:
        """``c(q) = min(threshold, exp(-alpha H(q)))``, ``H(q) = -sum_i q_i log(q_i + entropy_eps)``: (..., V) -> (...)."""
        xp = xp_of(q)
        with errstate():
            h = -xp.sum(xlogy(q, q + self.entropy_eps), axis=-1)
            return xp.clip(xp.exp(-self.alpha * h), None, self.threshold)

    def row_stats(self, q):
        return (self.scale(q)[..., None],)

    def phi(self, p_n, q_n, c):
        return _ratio_over(p_n, q_n, c)

    def residual(self, p, q, n, *, check=True):
        """``g_n = (q - p)_+ / sum (q - p)_+`` (``q`` if that is zero)."""
        if check:
            _check_inputs(p, q, n)
        return _normalise(_pos(q - p), q + 0 * p)


# -- the rules "Revisiting Lossy Verification in Speculative Decoding" compares, and Fuzzy Speculative Decoding -----


@dataclass(frozen=True)
class Lenience(Rule):
    """Lenience-based relaxation (Fast-HSD, "Revisiting Lossy Verification in Speculative Decoding"): the draft's
    probability is scaled by the lenience ``l`` in (0, 1] before SpS's ratio test,

        ``phi_n = min(1, q_n / (l p_n))``,   ``g_n = (q - p)_+ / sum (q - p)_+``  (``q`` if that is zero),

    bonus from ``q``. ``l = 1`` is SpS. Exact law (the paper's Eq. 7, checked in the tests): ``h_alg(y) = q_y / l``
    where ``p_y >= q_y / l``, ``p_y`` where ``q_y < p_y < q_y / l``, and ``p_y + D (q_y - p_y)`` where ``q_y >= p_y``,
    with ``D = R / TV(p, q)`` and ``R = sum_y (p_y - q_y / l)_+`` the rejected mass.

    Upstream: ZhouYuxuanYX/Fast-HSD ``fast_hsd/core/collaborative_verification.py`` (``lenience_accept_prob``,
    ``lenience_yield_distribution``) @ 812560c and the patched ``transformers/generation/utils.py``
    (``_speculative_sampling``: the draft's ``q_i`` times ``lenience``, recovery ``clamp(p - q, 0)``) @ d409d62
    (their letters swap ours: their ``p`` is the target). Match: yes (chain). Its EAGLE path
    (``EAGLE/eagle/model/utils.py``, ``evaluate_posterior``) reads no draft probability (``min(1, q_n / l)``, recovery
    ``q`` without ``n``): ``SGLangThreshold(1.0, l)``'s law, not this class.
    """

    lenience: float = 0.5
    needs_row_stats: ClassVar[bool] = False  # phi reads p_n and q_n only

    def __post_init__(self):
        _check_prob_param(self, "lenience", low_open=True)

    def phi(self, p_n, q_n, *stats):
        return _ratio_over(p_n, q_n, self.lenience)

    def residual(self, p, q, n, *, check=True):
        """``g_n = (q - p)_+ / sum (q - p)_+`` (``q`` if that is zero)."""
        if check:
            _check_inputs(p, q, n)
        return _normalise(_pos(q - p), q + 0 * p)


@dataclass(frozen=True)
class MinP(Rule):
    """SpecCascades' min-p truncation (Narasimhan et al. 2024), as Fast-HSD runs it: accept the drafted token iff it
    lies in the min-p set of the verifier's law, deterministically; on rejection emit a token of ``q`` other than
    ``n``:

        ``phi_n = 1[q_n >= min_p max q]``,   ``g_n = (q - q_n e_n) / (1 - q_n)``  (``q`` where ``q_n = 1``),

    bonus from ``q``. ``min_p = 1`` accepts only ``q``'s maxima; ``min_p = 0`` every token (``q_n = 0`` included:
    ``0 >= 0``, as upstream).

    Upstream: ZhouYuxuanYX/Fast-HSD ``fast_hsd/core/truncation_verification.py`` (``min_p_allowed_set``,
    ``speccascade_accepts``) @ 812560c and ``EAGLE/eagle/model/utils.py`` (``evaluate_posterior`` with ``min_p``:
    ``acp = 1[p(x) >= max p * min_p]``; a rejected ``x`` is zeroed in the target row, which is renormalised and
    sampled) @ 6750413; ``configs/methods/speccascade.json`` sweeps 0.1 .. 0.9. Match: yes (chain); upstream
    samples ``q`` itself instead where the rest of the row sums to at most 1e-9 (ours: only where it is 0).
    """

    min_p: float = 0.1
    needs_row_stats: ClassVar[bool] = True

    def __post_init__(self):
        _check_prob_param(self, "min_p")

    def row_stats(self, q):
        xp = xp_of(q)
        return (self.min_p * xp.max(q, axis=-1, keepdims=True),)

    def phi(self, p_n, q_n, floor):
        xp = xp_of(q_n)
        return xp.astype(q_n >= floor, q_n.dtype)

    def residual(self, p, q, n, *, check=True):
        """``g_n = (q - q_n e_n) / (1 - q_n)``."""
        if check:
            _check_inputs(p, q, n)
        return _without_n(q + 0 * p, n)


@dataclass(frozen=True)
class Eta(Rule):
    """Eta truncation as an acceptance test (Medusa-style typical acceptance, as Fast-HSD states it): with the
    eta-sampling threshold ``tau(q) = min(epsilon, delta exp(-H(q)))`` (``H`` Shannon's entropy of ``q``),

        ``phi_n = 1[q_n >= tau(q)]``  (``soft = False``),   ``phi_n = min(1, q_n / tau(q))``  (``soft = True``),
        ``g_n = (q - q_n e_n) / (1 - q_n)``  (``q`` where ``q_n = 1``),

    bonus from ``q``. ``soft = True`` with ``delta = sqrt(epsilon)`` is Fast-HSD's EAGLE path. Relation to ``TAS``:
    the same threshold shape, but ``>=`` (TAS: ``>``) and a recovery from ``q`` without ``n`` (TAS: ``argmax q``).

    Upstream: ZhouYuxuanYX/Fast-HSD ``fast_hsd/core/truncation_verification.py`` (``eta_allowed_set``,
    ``medusa_typical_accepts``: ``q_n >= min(epsilon, delta exp(-H))``, ``delta = 1`` by default) @ 812560c and
    ``EAGLE/eagle/model/utils.py`` (``evaluate_posterior`` with ``eta``: ``min(q_n / tau, 1)``, ``tau = min(eta,
    sqrt(eta) exp(-H))``, ``H`` of ``q`` clamped at 1e-10; 1 where ``tau <= 1e-9``; recovery ``q`` without ``n``)
    @ 6750413; ``configs/methods/typical_sampling.json`` sweeps 0.05 .. 0.25. Match: yes (chain) but for that
    clamp, which adds at most ``2.3e-9 V`` nats to ``H`` upstream.
    """

    epsilon: float = 0.1
    delta: float = 1.0
    soft: bool = False
    needs_row_stats: ClassVar[bool] = True

    def __post_init__(self):
        _set(self, epsilon=check_number(self.epsilon, "epsilon", low=0.0, low_open=True, high=1.0,
                                        what="a number in (0, 1]"),
             delta=check_number(self.delta, "delta", low=0.0, low_open=True, what="a positive number"))
        if not (isinstance(self.soft, (bool, np.bool_)) or (isinstance(self.soft, (int, np.integer))
                                                             and self.soft in (0, 1))):
            raise ValueError(f"soft must be True or False (or 1 / 0), got {self.soft!r}")
        _set(self, soft=bool(self.soft))

    def threshold(self, q: Array) -> Array:
        """``tau(q) = min(epsilon, delta exp(sum_i q_i log q_i))``: (..., V) -> (...)."""
        xp = xp_of(q)
        with errstate():
            return xp.clip(self.delta * xp.exp(xp.sum(xlogy(q, q), axis=-1)), None, self.epsilon)

    def row_stats(self, q):
        return (self.threshold(q)[..., None],)

    def phi(self, p_n, q_n, tau):
        xp = xp_of(q_n)
        if self.soft:
            return xp.clip(q_n / tau, 0.0, 1.0)  # tau > 0: exp(-H) >= 1 / V
        return xp.astype(q_n >= tau, q_n.dtype)

    def residual(self, p, q, n, *, check=True):
        """``g_n = (q - q_n e_n) / (1 - q_n)``."""
        if check:
            _check_inputs(p, q, n)
        return _without_n(q + 0 * p, n)


FSD_DIVERGENCES = ("js_div", "kl_div", "tv_div")


def fsd_divergence(p: Array, q: Array, divergence: str = "js_div") -> Array:
    """The divergence FSD thresholds, as its code computes it (``torch.nn.functional.kl_div(log a, b) = KL(b || a)``,
    with its ``p`` the target, our ``q``): (..., V) x2 -> (...).

        ``"kl_div"``  ``KL(p || q) = sum p log(p / q)`` (the draft's row against the verifier's);
        ``"js_div"``  ``(KL(m || p) + KL(m || q)) / 2``, ``m = (p + q) / 2`` (the reverse of Jensen-Shannon's
                      ``(KL(p || m) + KL(q || m)) / 2``: infinite where one row is 0 and the other is not);
        ``"tv_div"``  ``sum |p - q| / 2``."""
    xp = xp_of(p, q)
    with errstate():
        if divergence == "tv_div":
            return xp.sum(xp.abs(p - q), axis=-1) / 2
        if divergence == "kl_div":
            return xp.sum(xlogy(p, p) - xlogy(p, q), axis=-1)
        m = (p + q) / 2
        return (xp.sum(xlogy(m, m) - xlogy(m, p), axis=-1) + xp.sum(xlogy(m, m) - xlogy(m, q), axis=-1)) / 2


class _ReadsDraftRow:
    """For a rule that reads the draft's whole row (``reads_draft_row``): its statistics come in pairs of rows
    (``pair_stats_at`` / ``pair_stats_all``); the ``q``-only entry points refuse by name."""

    def _unpaired(self):
        raise ValueError(f"{self!r} reads the draft's whole row p (reads_draft_row): use pair_stats_at(p, q, n)")

    def row_stats(self, q):
        self._unpaired()

    def stats_at(self, q, n):
        self._unpaired()

    def stats_all(self, q):
        self._unpaired()


@dataclass(frozen=True)
class FSD(_ReadsDraftRow, Rule):
    """Fuzzy Speculative Decoding (Holsman, Huang, Dhingra, arXiv 2502.20704, ACL Findings 2025): every draft at a
    position is accepted iff the draft's and the verifier's rows are within ``threshold`` of each other, and on
    rejection the verifier's row is sampled (no residual):

        ``phi_n = 1[D(p, q) <= threshold]``,   ``g_n = q``,   bonus from ``q``,

    ``D = fsd_divergence(p, q, divergence)``. The step's law is ``p`` where ``D <= threshold`` and ``q`` elsewhere;
    ``threshold = 0`` accepts only where ``D = 0`` (``p = q``): lossless. The test reads the whole draft row
    (``reads_draft_row``), not only ``p_n``.

    Upstream: maxholsman/fsd ``fsd_utils.py`` (``_speculative_backoff_sampling``: ``is_accepted = divs <=
    div_threshold``; after the first rejection ``multinomial`` of the target's row; ``fsd_div_type`` default
    ``"js_div"``) @ e92a157 (2025-03-03). Match: yes for the divergences above, where the rows passed here are the
    ones the divergence is read from: upstream reads it from the softmax of both models' raw logits (before
    temperature and top-k / top-p) and samples the processed target row (not modelled); its top-k / top-p variants
    of the divergence are not modelled.
    """

    threshold: float = 0.4
    divergence: str = "js_div"
    needs_row_stats: ClassVar[bool] = True
    reads_draft_row: ClassVar[bool] = True

    def __post_init__(self):
        _set(self, threshold=check_nonneg(self.threshold, "threshold"))
        _check_choice(self.divergence, "divergence", FSD_DIVERGENCES)

    def gate(self, p: Array, q: Array) -> Array:
        """``1[D(p, q) <= threshold]`` per row, in ``q``'s dtype: (..., V) x2 -> (...). ``D`` is computed in float64
        whatever the rows' dtype: in float32 its cancellations (``m log m - m log p``) leave errors near 1e-7, which
        decide rows within that of the threshold (``threshold = 0``: two rows a few ulps apart) either way."""
        xp = xp_of(p, q)
        d = fsd_divergence(xp.astype(p, xp.float64), xp.astype(q, xp.float64), self.divergence)
        return xp.astype(d <= self.threshold, q.dtype)

    def pair_stats_at(self, p, q, n):
        return (self.gate(p, q),)

    def pair_stats_all(self, p, q):
        return (self.gate(p, q)[..., None],)

    def phi(self, p_n, q_n, gate):
        return gate + 0 * q_n

    def residual(self, p, q, n, *, check=True):
        """``g_n = q``."""
        if check:
            _check_inputs(p, q, n)
        return q + 0 * p


# -- rules that read more than q: the verifier's final hidden state and LM head ------------------------

DROPMATCH_BASES = ("sps", "match")


@dataclass(frozen=True)
class DropMatch(Rule):
    """DropMatch (Lee et al., "Training-free Dropout Sampling for Semantic Token Acceptance in
    Speculative Decoding", arXiv 2603.03333): Monte Carlo dropout on the verifier's LM head only.

    What the paper states (its abstract; the formulas below are our reading, marked as such, see
    docs/dropmatch.md): dropout applied exclusively to the
    LM head produces several decoding paths; their tokens form an empirical distribution against which
    a draft token is accepted ("matched"); the dropout probability controls how many paths disagree,
    so the accepted set grows where the head is uncertain and stays small where it is confident.

    Our reading, exactly what this class computes. At a drafted position with final hidden state
    ``x`` (d,) and head ``W`` (V, d): path ``j = 1..M`` (``M = num_paths``) draws a dropout mask
    ``m_j ~ Bernoulli(1 - rate)^d``, reads the logits ``W (m_j * x) / (1 - rate)`` (inverted dropout on
    the head's input), applies the same sampling transforms as ``q`` and samples its token ``y_j``. The
    drafted token ``n`` is accepted if the base test accepts it or it matches a path, ``n in {y_1..y_M}``:

        ``phi_n = b_n + (1 - b_n) hit_n``,   ``hit_n = P(n in {y_1..y_M}) = 1 - (1 - r_n)^M``,

    where ``r = E_m[transforms(W (m * x) / (1 - rate))]`` is the path law (paths are i.i.d. given the
    context, and independent of the draft) and the base test ``b_n`` is
      ``"sps"``    ``min(1, q_n / p_n)``; recovery on rejection from ``(q - p)_+`` (DropMatch on top of
                   speculative sampling; ``num_paths = 0`` is SpS);
      ``"match"``  ``q_n``: the verifier's own sample ``y_0 ~ q`` is one more path; on rejection the
                   emitted token is ``y_0``, i.e. ``q`` without ``n`` (lossless for ``M = 0``, as
                   exact-match verification: SGLang's target-only test with thresholds 1).
    The one-step law is then exact given ``r`` (``exact.induced_distribution`` of ``rule.at(hit)``);
    ``r`` itself has no closed form and comes from Monte Carlo over masks (``dropmatch.path_law``, with
    its jackknife error). In decoding, ``hit`` is the realised indicator of the ``M`` sampled paths
    (``dropmatch.sample_hits``), whose mean over masks and path draws is ``1 - (1 - r)^M``: the decoded
    law is the exact law above.

    How the rule reaches its extra inputs: ``DropMatch(...)`` is the configuration (registry, CLI); it
    cannot judge a token from ``(p, q)`` alone and says so (``ValueError``). ``rule.at(hit)`` binds
    one step's ``hit`` (..., V), aligned with ``q``, and the bound rule works everywhere a rule does
    (``sampler.verify``, ``exact``, ``tradeoff``). ``speculative_generate`` binds it at every step
    through ``bind``, from the verifier's head input (it declares ``reads_head``, so the loop taps the
    head: ``lm.head_tap.HeadTap``), so ``verify``'s contract is unchanged.
    """

    rate: float = 0.1
    num_paths: int = 4
    base: str = "sps"
    needs_row_stats: ClassVar[bool] = True  # hit_n: a per-token statistic from the dropout paths
    reads_head: ClassVar[bool] = True  # needs the verifier's final hidden state and LM head

    def __post_init__(self):
        _set(self, rate=check_number(self.rate, "rate", low=0.0, high=1.0, high_open=True,
                                     what="a dropout probability in [0, 1)"),
             num_paths=check_int(self.num_paths, "num_paths", low=0))
        _check_choice(self.base, "base", DROPMATCH_BASES)

    def at(self, hit: Array) -> DropMatchAt:
        """This rule bound to one step's ``hit`` (..., V): the probability (or the realised 0/1
        indicator) that each token is among the ``num_paths`` dropout paths."""
        fields = {k: getattr(self, k) for k in ("rate", "num_paths", "base")}
        return DropMatchAt(**fields, hit=hit)

    def bind(self, step) -> DropMatchAt:
        """This rule at one decoding step: ``hit`` from ``num_paths`` dropout paths of the verifier's head
        at the ``step.k`` drafted positions (``dropout.path_hits`` on ``step.hidden``, ``step.weight``,
        ``step.bias``, with the step's sampling transforms and generator)."""
        from .dropout import path_hits

        hit = path_hits(step.hidden[:, :step.k], step.weight, self.rate, self.num_paths, sampling=step.sampling,
                        bias=step.bias, generator=step.generator)
        return self.at(hit)

    def hit_from_law(self, r: Array) -> Array:
        """``1 - (1 - r)^M``: the probability that a token is among ``M`` i.i.d. paths of law ``r``."""
        xp = xp_of(r)
        return 1 - xp.clip(1 - r, 0.0, 1.0) ** self.num_paths

    def _unbound(self):
        raise ValueError(
            f"{self!r} reads the verifier's dropout paths, not only q: bind one step's paths with "
            "rule.at(hit) (hit from cactus_theory.dropmatch.path_law / sample_hits), or decode with "
            "speculative_generate, which binds them at every step")

    def stats_all(self, q):
        self._unbound()

    def stats_at(self, q, n):
        self._unbound()

    def row_stats(self, q):
        self._unbound()

    def base_phi(self, p_n: Array, q_n: Array) -> Array:
        """``b_n``: ``min(1, q_n / p_n)`` (base "sps") or ``q_n`` (base "match")."""
        xp = xp_of(p_n, q_n)
        if self.base == "match":
            return xp.clip(q_n, 0.0, 1.0)
        return xp.clip(SpS().phi(p_n, q_n), 0.0, 1.0)

    def phi(self, p_n, q_n, hit_n):
        b = self.base_phi(p_n, q_n)
        return b + (1 - b) * hit_n

    def residual(self, p, q, n, *, check=True):
        """``(q - p)_+`` normalised (base "sps"; ``q`` if that is zero) or ``q`` without ``n`` (base "match")."""
        if check:
            _check_inputs(p, q, n)
        if self.base == "match":
            return _without_n(q + 0 * p, n)
        return _normalise(_pos(q - p), q + 0 * p)


@dataclass(frozen=True, eq=False)
class DropMatchAt(DropMatch):
    """``DropMatch`` bound to one step's ``hit`` (..., V) (see ``DropMatch.at``); ``hit`` has ``q``'s
    shape, or a trailing part of it (broadcast over the leading axes), or its size (the flattened rows of
    ``exact``)."""

    hit: Any = None

    def __post_init__(self):
        super().__post_init__()
        if self.hit is not None:
            _check_hit(self.hit)

    def _hit_like(self, q):
        hit = self.hit
        if hit is None:
            self._unbound()
        if is_torch_array(q):  # one bound rule serves verify (torch) and the exact laws (numpy)
            import torch

            hit = torch.as_tensor(hit).to(device=q.device, dtype=q.dtype)
        elif is_torch_array(hit):
            hit = hit.detach().cpu().double().numpy()
        else:
            hit = np.asarray(hit, dtype=np.float64)
        if tuple(hit.shape) != tuple(q.shape):
            k = len(hit.shape)
            if k <= len(q.shape) and tuple(q.shape[len(q.shape) - k:]) == tuple(hit.shape):
                hit = hit + 0 * q  # one row's hit, broadcast over leading axes (e.g. repeated samples)
            else:  # never reshaped: a hit of another shape belongs to other rows
                raise ValueError(f"hit must have q's shape {tuple(q.shape)}, got {tuple(hit.shape)}")
        return hit

    def stats_all(self, q):
        return (self._hit_like(q),)

    def stats_at(self, q, n):
        return (gather(self._hit_like(q), n),)

    def row_stats(self, q):
        raise ValueError("DropMatch's hit is a per-token statistic: use stats_all / stats_at")

    def __repr__(self) -> str:
        return f"DropMatch(rate={self.rate!r}, num_paths={self.num_paths!r}, base={self.base!r}).at(hit)"


# -- issue 42: the rules shipped upstream since the last port ------------------------------------------------------
# graphcore-research/relaxed-spec-dec-repro (an overlay on vLLM 0.20.1) and Modular MAX. Their code calls the target
# (verifier) ``p`` and the draft ``q``; this module's letters are the paper's (``p`` the draft, ``q`` the verifier), so
# every formula below is written with the letters swapped back.

GRAPHCORE_PIN = "graphcore-research/relaxed-spec-dec-repro@c28353fee4231a6948ba78a4e0d06d7c513f713c"
"""The commit of relaxed-spec-dec-repro read for issue 42 (2026-06-12): ``vllm_overlay/files/v1/sample/rejection_sampler.py``."""

MAX_PIN = "modular/modular@105920b9a352f04e4ec176a470c8d1cc1981694c"
"""The commit of Modular MAX read for issue 42: ``max/python/max/nn/sampling/rejection_sampler.py``."""


@dataclass(frozen=True)
class RowTarget(_ReadsDraftRow, Rule):
    """Generalised speculative sampling (Theorem 1) towards a target ``h(p, q)`` read from the whole pair of rows,
    the same for every drafted token:

        ``phi_n = min(1, h_n / p_n)``,   ``g_n = (h - p)_+ / sum (h - p)_+``  (``h`` if that is zero),

    bonus from ``q``. The step's output law is exactly ``h`` (``exact.induced_distribution`` sums it from this code;
    the tests check it equals ``h``). Subclasses define ``target_row`` only; ``h`` is passed to ``phi`` as a per-token
    statistic of the pair of rows (``reads_draft_row``)."""

    needs_row_stats: ClassVar[bool] = True
    reads_draft_row: ClassVar[bool] = True

    def target_row(self, p: Array, q: Array) -> Array:
        """``h`` (..., V) from the rows ``p`` and ``q`` (..., V)."""
        raise NotImplementedError

    def pair_stats_at(self, p, q, n):
        return (gather(self.target_row(p, q), n),)

    def pair_stats_all(self, p, q):
        return (self.target_row(p, q),)

    def phi(self, p_n, q_n, h_n):
        xp = xp_of(p_n, q_n)
        with errstate():
            return where0(p_n > 0, h_n / xp.where(p_n > 0, p_n, xp.ones_like(p_n)))

    def target(self, p: Array, q: Array, n: Array, *, check: bool = True) -> Array:
        """``h`` (..., V): the same for every drafted ``n``."""
        if check:
            _check_inputs(p, q, n)
        return self.target_row(p, q)

    def residual(self, p, q, n, *, check=True):
        """``g_n = (h - p)_+ / sum (h - p)_+`` (``h`` where that is zero: then nothing is ever rejected)."""
        if check:
            _check_inputs(p, q, n)
        h = self.target_row(p, q)
        return _normalise(_pos(h - p), h)


@dataclass(frozen=True)
class CascadeDefer(RowTarget):
    """SpecCascades' [OPT] deferral rule (Narasimhan et al. 2024) as relaxed-spec-dec-repro runs it: the step's target
    is the verifier's whole row or the draft's whole row,

        ``h = q`` if ``max p < max q - alpha TV(p, q)``, else ``h = p``,   ``TV(p, q) = sum (q - p)_+``,

    then SpS's test towards ``h`` (``RowTarget``): a row that keeps the draft accepts every draft; a row that defers
    is SpS. Bonus from ``q`` (upstream's default ``target_p``). ``alpha`` has no sign restriction (a negative one
    defers more); upstream's grid is ``{-0.1, 0, 0.05}``.

    Upstream (letters swapped: its ``p`` is the target): ``spec_cascade_opt_defer_mask`` (``draft_max < target_max -
    alpha * tv_distance``, ``tv_distance = (target - draft).clamp_min(0).sum()``) and ``apply_spec_cascade_opt_constraint``
    (``where(defer, target, draft)``), then vLLM's ratio test ``target / draft >= u`` and the recovery from
    ``(target - draft)_+`` (``rejection_random_sample_kernel``, ``sample_recovered_tokens_kernel``) @ ``GRAPHCORE_PIN``.
    Match: yes with ``spec_cascade_opt_gate = "processed"`` (its default: both maxima read from the processed rows
    passed here); its ``"paper"`` gate reads the maxima from the rows before temperature / top-k / top-p (not
    modelled: pass those rows' maxima by calling the rule on them). Upstream computes in float32.
    """

    alpha: float = 0.0

    def __post_init__(self):
        _set(self, alpha=check_number(self.alpha, "alpha"))

    def defers(self, p: Array, q: Array) -> Array:
        """``1[max p < max q - alpha TV(p, q)]`` (..., 1): the row's target is ``q``."""
        xp = xp_of(p, q)
        tv = xp.sum(_pos(q - p), axis=-1, keepdims=True)
        return xp.max(p, axis=-1, keepdims=True) < xp.max(q, axis=-1, keepdims=True) - self.alpha * tv

    def target_row(self, p, q):
        xp = xp_of(p, q)
        return xp.where(self.defers(p, q), q + 0 * p, p + 0 * q)


@dataclass(frozen=True)
class Tok3(RowTarget):
    """SpecCascades' token-level rule [Tok3] as relaxed-spec-dec-repro runs it: with the verifier's top set
    ``T = {i : q_i > 0, q_i >= (1 - alpha) max q}`` (``alpha = 0``: the first maximum of ``q`` only, as ``argmax``),

        ``h_i = p_i 1[i in T] + eta q_i``,   ``eta = sum_{i not in T} p_i``,

    then SpS's test towards ``h`` (``RowTarget``); ``h`` sums to 1. Bonus from ``q`` (upstream's default). ``alpha``
    in [0, 1]; ``alpha = 1`` puts the whole support of ``q`` in ``T``; upstream's grid is ``{0, 0.35, 0.8}``.

    Upstream (letters swapped: its ``p`` is the target): ``spec_cascade_tok3_top_mask_from_logits`` (``logits >= max
    logits + log1p(-alpha)`` among finite logits; ``argmax`` at ``alpha = 0``) and ``apply_spec_cascade_tok3_constraint``
    (``where(top, draft, 0) + eta * target``, ``eta`` the draft's mass off the top set) @ ``GRAPHCORE_PIN``. Match:
    yes with ``spec_cascade_tok3_top_set = "processed"`` (the set read from the row passed here); upstream's default
    ``"paper"`` reads ``T`` from the target's logits before temperature / top-k / top-p, a second row this one-row
    rule does not take. Set membership is computed here on probabilities, upstream on logits (``log1p``): the two
    can differ for a ``q_i`` within rounding of ``(1 - alpha) max q``.
    """

    alpha: float = 0.35

    def __post_init__(self):
        _check_prob_param(self, "alpha")

    def top_set(self, q: Array) -> Array:
        """``1[i in T]`` (..., V), boolean."""
        xp = xp_of(q)
        if self.alpha == 0:
            return one_hot_like(q, xp.argmax(q, axis=-1))
        return (q > 0) & (q >= (1 - self.alpha) * xp.max(q, axis=-1, keepdims=True))

    def target_row(self, p, q):
        xp = xp_of(p, q)
        top = self.top_set(q)
        zero = xp.zeros_like(p + 0 * q)
        eta = xp.sum(xp.where(top, zero, p + zero), axis=-1, keepdims=True)
        return xp.where(top, p + zero, zero) + eta * q


@dataclass(frozen=True)
class Mentored(Rule):
    """Mentored decoding ("lossy speculative decoding" with ``beta = 1``) as relaxed-spec-dec-repro runs it: SpS's
    ratio test with the draft's probability scaled by ``1 - alpha``,

        ``phi_n = min(1, q_n / ((1 - alpha) p_n))``,   ``g_n = (q - p)_+ / sum (q - p)_+``  (``q`` if that is zero),

    bonus from ``q`` (upstream's default). The law is ``Lenience(lenience = 1 - alpha)``'s (the tests check it);
    ``alpha = 0`` is SpS. ``alpha`` in [0, 1); upstream's grid is ``{0.95, 0.7, 0.3}``.

    Upstream (letters swapped: its ``p`` is the target): ``lossy_spec_decode_beta1_accept_ratio`` (``target / ((1 -
    alpha) draft)``, 0 where the draft's probability is 0), ``lossy_spec_decode_beta1_residual_probs`` (``(target -
    draft)_+``) and the kernel's ``LOSSY_MODE`` branch (``accept_ratio >= u``) @ ``GRAPHCORE_PIN``. Match: yes (chain).
    """

    alpha: float = 0.7
    needs_row_stats: ClassVar[bool] = False  # phi reads p_n and q_n only

    def __post_init__(self):
        _check_prob_param(self, "alpha", high_open=True)

    def phi(self, p_n, q_n, *stats):
        return _ratio_over(p_n, q_n, 1 - self.alpha)

    def residual(self, p, q, n, *, check=True):
        """``g_n = (q - p)_+ / sum (q - p)_+`` (``q`` if that is zero)."""
        if check:
            _check_inputs(p, q, n)
        return _normalise(_pos(q - p), q + 0 * p)


@dataclass(frozen=True)
class SCD(RowTarget):
    """Speculative contrastive decoding (SCD) as relaxed-spec-dec-repro runs it, modelled on probabilities: the
    step's target is the contrastive law of the expert (verifier) against the amateur (draft),

        ``h_i  propto  1[i in G] q_i^(1 + beta) / p_i^beta``,   ``G = {i : q_i > 0, q_i >= alpha max q}``,

    then SpS's test towards ``h`` (``RowTarget``); bonus from ``q`` (upstream's default). Upstream computes
    ``softmax(((1 + beta) z_E - beta z_A) / tau)`` over the gate ``z_E >= max z_E + tau log alpha`` from the two
    models' logits ``z_E``, ``z_A``; with ``q = softmax(z_E / tau)`` and ``p = softmax(z_A / tau)`` that is exactly
    the formula above (a logit row's constant shift cancels in the softmax), so the rule takes the probability rows
    at the SCD temperature ``tau`` instead of logits and fits the ``(p, q)`` interface. ``alpha = 0`` gives ``G`` =
    the support of ``q``: upstream's ``scd_expert_toppk_gated`` mode when ``q`` is the processed (top-k / top-p)
    target row. A row with ``p_i = 0`` on ``G`` (upstream refuses it: its amateur logits are finite wherever its
    gate is) is read as the limit ``p_i = e -> 0`` taken alike at every such token: ``h`` is ``q^(1 + beta)`` on
    those tokens, renormalised (at ``beta = 0`` the draft is not read: ``h`` is ``q`` on ``G``). ``beta >= 0``;
    upstream's grid is ``{0.1, 0.5, 1}``.

    Upstream (letters swapped: its ``p`` is the target, its ``q`` the draft): ``scd_alpha_gate_from_logits`` and
    ``apply_scd_constraint`` @ ``GRAPHCORE_PIN``. Match: yes where the draft samples from the row the contrast reads
    (upstream's ratio test reads the draft's processed row and the contrast its logits before top-k / top-p: where
    those differ, pass the processed row; not modelled).
    """

    beta: float = 0.5
    alpha: float = 0.1

    def __post_init__(self):
        _set(self, beta=check_nonneg(self.beta, "beta", high=1e300,
                                     why_high="(1 + beta) log q is computed in float64, where a larger beta overflows"))
        _check_prob_param(self, "alpha")

    def target_row(self, p, q):
        """``h`` (..., V), computed in float64 whatever the rows' dtype (in float16 ``beta log p`` overflows at
        moderate ``beta``) and returned in ``q``'s dtype."""
        xp = xp_of(p, q)
        dtype = q.dtype
        p, q = xp.astype(p + 0 * q, xp.float64), xp.astype(q + 0 * p, xp.float64)
        return xp.astype(self._target64(xp, p, q), dtype)

    def _target64(self, xp, p, q):
        gate = (q > 0) & (q >= self.alpha * xp.max(q, axis=-1, keepdims=True))
        if self.beta == 0:
            w = xp.where(gate, q, xp.zeros_like(q))
            return w / xp.sum(w, axis=-1, keepdims=True)
        hole = gate & (p <= 0)
        any_hole = xp.any(hole, axis=-1, keepdims=True)
        live = xp.where(any_hole, hole, gate)
        one = xp.ones_like(q)
        with errstate():
            s = (1 + self.beta) * xp.log(xp.where(live, q, one)) - xp.where(
                any_hole, 0 * one, self.beta * xp.log(xp.where(live, p, one)))
            s = xp.where(live, s, xp.full_like(s, -math.inf))
            w = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
        w = xp.where(live, w, xp.zeros_like(w))
        return w / xp.sum(w, axis=-1, keepdims=True)


def js_divergence(p: Array, q: Array) -> Array:
    """Jensen-Shannon ``(KL(p || m) + KL(q || m)) / 2``, ``m = (p + q) / 2``, in nats (at most ``log 2``): (..., V) x2
    -> (...). Each term as ``a log(a / m)`` where ``a > 0``."""
    xp = xp_of(p, q)
    m = (p + q) / 2
    one = xp.ones_like(m)
    with errstate():
        kp = xp.where(p > 0, p * xp.log(xp.where(p > 0, p, one) / xp.where(p > 0, m, one)), 0 * m)
        kq = xp.where(q > 0, q * xp.log(xp.where(q > 0, q, one) / xp.where(q > 0, m, one)), 0 * m)
    return (xp.sum(kp, axis=-1) + xp.sum(kq, axis=-1)) / 2


@dataclass(frozen=True)
class RFuzzy(RowTarget):
    """r-fuzzy speculative decoding (relaxed-spec-dec-repro's ``rfsd``): keep the draft's row where it is within
    ``threshold`` of the verifier's in Jensen-Shannon divergence, else the verifier's,

        ``h = p`` if ``JS(p, q) <= threshold``, else ``h = q``,

    then SpS's test towards ``h`` (``RowTarget``): a close row accepts every draft, a far one is SpS (FSD instead
    samples ``q`` afresh on rejection). Bonus from ``q`` (upstream's default). ``JS`` is computed in float64 whatever
    the rows' dtype; ``threshold >= 0``; upstream's grid is ``{0.05, 0.2, 0.3}``.

    Upstream (letters swapped): ``fsd_divergence_scores`` (``"js"``: ``0.5 (KL(target || m) + KL(draft || m))``, logs
    of rows clamped at float32's tiny), ``rfsd_use_draft_mask`` (``<= threshold``) and ``apply_rfsd_constraint``
    (``where(use_draft, draft, target)``) @ ``GRAPHCORE_PIN``. Match: yes for ``"js"`` up to float32 rounding of the
    divergence upstream (a row within about 1e-7 of the threshold may be decided the other way there); its ``"kl"``
    divergence is not ported.
    """

    threshold: float = 0.2

    def __post_init__(self):
        _set(self, threshold=check_nonneg(self.threshold, "threshold"))

    def keeps_draft(self, p: Array, q: Array) -> Array:
        """``1[JS(p, q) <= threshold]`` (..., 1), boolean."""
        xp = xp_of(p, q)
        return (js_divergence(xp.astype(p, xp.float64), xp.astype(q, xp.float64)) <= self.threshold)[..., None]

    def target_row(self, p, q):
        xp = xp_of(p, q)
        return xp.where(self.keeps_draft(p, q), p + 0 * q, q + 0 * p)


MAX_EPS_RECOVERIES = ("argmax", "q")


@dataclass(frozen=True)
class MaxEps(Rule):
    """Modular MAX's ``RejectionSampler`` (the eps rule), modelled on log-probabilities: a draft is rejected iff its
    draft log-probability exceeds the verifier's by more than ``eps``, deterministically,

        ``phi_n = 1[log p_n <= log q_n + eps]``  (so ``q_n = 0`` rejects),

    and the first rejected position emits a sample of the verifier's row: ``argmax q`` (``recovery = "argmax"``,
    upstream's default ``top_k = 1``; first maximum on ties, ours) or ``q`` itself (``recovery = "q"``: a top-k /
    top-p sample, ``q`` being the processed row). Upstream draws the bonus token the same way (the sample at the
    row after the last draft), so the bonus law is the recovery's. ``eps >= 0``.

    Upstream compares raw logits of two models, ``draft_logit > target_logit + eps``, which a constant shift of
    either model's logits changes; pass ``log p`` and ``log q`` as those logits (as a caller that feeds log-softmax
    rows does) and the rule decides the same. Upstream: ``RejectionSampler.__call__`` and its ``topk_fused_sampling``
    recovery @ ``MAX_PIN``. Match: yes on log-probability rows; raw logits: differs by each row's log-partition.
    """

    eps: float = 1e-5
    recovery: str = "argmax"
    needs_row_stats: ClassVar[bool] = False  # phi reads p_n and q_n only
    bonus_from_q: ClassVar[bool] = False

    def __post_init__(self):
        _set(self, eps=check_nonneg(self.eps, "eps"))
        _check_choice(self.recovery, "recovery", MAX_EPS_RECOVERIES)

    def phi(self, p_n, q_n, *stats):
        xp = xp_of(p_n, q_n)
        with errstate():
            ok = xp.log(p_n) <= xp.log(q_n) + self.eps
        return xp.astype(ok & (q_n > 0), q_n.dtype)

    def residual(self, p, q, n, *, check=True):
        """``g_n = e_{argmax q}`` or ``q``, for every ``n``."""
        if check:
            _check_inputs(p, q, n)
        return self.bonus(q + 0 * p)

    def bonus(self, q):
        if self.recovery == "q":
            return q
        xp = xp_of(q)
        return xp.astype(one_hot_like(q, xp.argmax(q, axis=-1)), q.dtype)


@dataclass(frozen=True)
class MaxSampled(Rule):
    """Modular MAX's verdict on sampled drafts (``_sampled_draft_verdict``): SpS, with MAX's convention for a draft
    row that carries no law at the drafted token (``p_n = 0``: "the scheduler had no distribution for the row"), which
    is read as the one-hot ``p = e_n``:

        ``p_n > 0``: ``phi_n = min(1, q_n / p_n)``,   ``g_n = (q - p)_+ / sum (q - p)_+``;
        ``p_n = 0``: ``phi_n = q_n``,                 ``g_n = (q - e_n)_+ / sum (q - e_n)_+ = q`` without ``n``,

    bonus from ``q``. Lossless: the step's law is ``q`` for every draft law, and a token drafted outside ``p``'s
    support (a deterministic draft) is judged as the one-hot draft it is, whose law is ``q`` too (the tests check
    both). Upstream (letters swapped: its ``p_target`` is our ``q``, its ``q_draft`` our ``p_n``): ``q_eff =
    where(q_draft > 0, q_draft, 1)``, ``rejected = u q_eff >= p_target``, ``residual = relu(target - where(has_dist,
    dist, onehot))`` @ ``MAX_PIN``. Match: yes (the test ``u < q_n / p_n`` without a division).
    """

    needs_row_stats: ClassVar[bool] = False  # phi reads p_n and q_n only

    def phi(self, p_n, q_n, *stats):
        return _ratio_over(p_n, q_n, 1.0)

    def accepts_zero_draft(self) -> bool:
        return True

    def zero_draft_phi(self, p_n, q_n, *stats):
        return q_n

    def residual(self, p, q, n, *, check=True):
        """``(q - p)_+`` normalised, or ``q`` without ``n`` where ``p_n = 0``."""
        if check:
            _check_inputs(p, q, n)
        xp = xp_of(p, q)
        own = _normalise(_pos(q - p), q + 0 * p)
        return xp.where((gather(p, n) > 0)[..., None], own, _without_n(q + 0 * p, n))


@dataclass(frozen=True)
class SampleMatch(Rule):
    """Sample-and-match verification: draw ``y ~ q`` from the verifier and accept the drafted token iff ``y = n``,
    else emit ``y``:

        ``phi_n = q_n``,   ``g_n = (q - q_n e_n) / (1 - q_n)``  (``q`` where ``q_n = 1``),   bonus from ``q``.

    Lossless (``q_n e_n + (1 - q_n) g_n = q`` for every ``n``), with acceptance ``sum_n p_n q_n`` instead of SpS's
    ``sum_n min(p_n, q_n)``; the draft's law is never read. Upstream: MAX's ``_argmax_draft_verdict`` (one truncated
    target sample per position, ``rejected = draft != sample``, the sample is the recovered token and the last one
    the bonus) @ ``MAX_PIN``, match: yes; llama.cpp ``common/sampling.cpp`` (``common_sampler_sample_and_accept_n``:
    the target's sampler chain draws at each drafted position, the draw is kept, and the loop stops at the first draw
    that differs from the draft; when all agree one more draw is the bonus) @ ggml-org/llama.cpp 3b3f5fe, match: yes,
    with ``q`` the law of llama.cpp's sampler chain at that position (its penalties and grammar read the tokens kept
    before it, as in plain decoding).
    """

    needs_row_stats: ClassVar[bool] = False  # phi reads q_n only

    def phi(self, p_n, q_n, *stats):
        return q_n + 0 * p_n

    def residual(self, p, q, n, *, check=True):
        """``g_n = (q - q_n e_n) / (1 - q_n)``."""
        if check:
            _check_inputs(p, q, n)
        return _without_n(q + 0 * p, n)
