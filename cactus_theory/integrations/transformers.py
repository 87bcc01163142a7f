"""Any project rule inside Hugging Face ``model.generate(..., assistant_model=draft, do_sample=True)``.

    import cactus_theory as ct
    from cactus_theory.integrations.transformers import use_rule

    with use_rule(ct.Cactus(0.5)):
        out = model.generate(**inputs, assistant_model=draft, do_sample=True)

Everything else stays transformers' own: the assistant's drafting (and its schedule), the KV-cache
cropping, stopping criteria, streamers, logits processors. Inside the ``with`` block the one step a
rule defines, verifying the assistant's candidates, is done by ``sampler.verify`` with the rule.

Which hook, and why. transformers 5 offers three places to change speculative sampling:
  * ``custom_generate=<callable>``: the callable replaces the whole decoding method, and for a
    callable transformers rebuilds the mode's keyword arguments from the callable's own new
    parameters, dropping ``assistant_model``, the tokenizers and the streamer. A callable would
    therefore have to re-create the assisted loop (candidate generator, cache cropping, stopping)
    that ``GenerationMixin._assisted_decoding`` already implements: a second copy of that loop.
  * a candidate generator: proposes candidates only; verification is inline in
    ``_assisted_decoding`` and cannot be overridden there.
  * ``transformers.generation.utils._speculative_sampling(candidate_input_ids, candidate_logits,
    candidate_length, new_logits, assistant_ensemble_weight)``: the module-level function that
    ``_assisted_decoding`` looks up at every step, exactly the rejection step and nothing else.
We replace that function for the duration of a ``with`` block (restored on exit, also on errors).
It is a private name: importing this module checks that it exists with the expected parameters and
raises a clear ``ImportError`` naming the installed version otherwise. The swap is process-global
while the block runs (do not run other ``generate`` calls concurrently in other threads).

Letters. transformers calls the target (verifier) law ``p`` and the assistant (draft) law ``q``; this
project uses the paper's ``p`` = draft, ``q`` = verifier. Here ``p = softmax(candidate_logits)``
(the assistant's logits after the same logits processors as the target's: temperature, top-k,
top-p) and ``q = softmax(new_logits)``. Observed in transformers 5.24: the assistant runs those
processors twice (its generation config's warpers and the target's list), so at temperature ``t`` it
drafts from ``softmax(logits / t^2)``, and it reports those same logits; ``p`` is therefore exactly
the law the candidates were drawn from, which is what every rule needs (tests/
test_integration_transformers.py reads the assistant's temperature before computing the exact law).

transformers' own lossy option, ``generate(..., assistant_ensemble_weight=w)``, verifies against
``v = w q + (1 - w) p`` (our letters): the rule ``ct.Ensemble(w)`` (transformers' parameterisation: acceptance
``min(1, 1 - w + w q_n / p_n)``, recovery ``(q - p)_+``, and ``q`` where that residual sums to at most float32's
tiny; the law of ``ct.Interpolation(1 - w)`` but for that fallback). Inside ``use_rule`` the weight is honoured:
``use_rule()`` (no rule) verifies each step with the rule transformers' arguments ask for, ``Ensemble(w)`` when
the weight is set and ``SpS()`` otherwise; ``use_rule(ct.Ensemble(w))`` with the same weight is the same; any
other rule together with a weight raises ``ValueError`` (two verifications asked for; neither is dropped).

Only sampling (``do_sample=True``) goes through ``_speculative_sampling``; greedy assisted decoding
compares argmaxes and never calls a rule.
"""

from __future__ import annotations

import contextlib
import inspect
import threading

import torch

from ..core.rules import Ensemble, Rule, SpS, check_rule
from ..core.sampler import verify
from ..core.validate import check_int, check_number

__all__ = ["use_rule", "assisted_generate", "speculative_sampling", "ensemble_weight_rule"]

try:
    from transformers.generation import utils as _gen_utils
except ImportError as e:  # pragma: no cover - transformers is an optional dependency
    raise ImportError("cactus_theory.integrations.transformers needs transformers (pip install 'cactus-theory[lm]')") from e

_EXPECTED = ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits")
_original = getattr(_gen_utils, "_speculative_sampling", None)
if _original is None or tuple(inspect.signature(_original).parameters)[:4] != _EXPECTED:
    import transformers as _tf

    raise ImportError(
        f"transformers {_tf.__version__} has no generation.utils._speculative_sampling{_EXPECTED}: this "
        "integration supports the transformers 5 assisted-decoding loop")

_lock = threading.RLock()


def ensemble_weight_rule(w: float) -> Rule:
    """The project rule of transformers' ``assistant_ensemble_weight = w`` (in (0, 1), as transformers checks):
    ``Ensemble(w)``."""
    w = check_number(w, "assistant_ensemble_weight", low=0.0, high=1.0, low_open=True, high_open=True,
                     what="in (0, 1)")
    return Ensemble(w)


def _step_rule(rule: Rule | None, weight) -> Rule:
    """The rule that verifies a step: ``rule``, or the one transformers' arguments ask for (``Ensemble(w)`` with a
    weight, ``SpS()`` without); a rule and a weight that disagree raise ``ValueError``."""
    if weight is None:
        return SpS() if rule is None else rule
    asked = ensemble_weight_rule(weight)
    if rule is None or rule == asked:
        return asked
    raise ValueError(
        f"assistant_ensemble_weight={weight!r} asks transformers to verify with {asked!r}, while the cactus_theory "
        f"rule {rule!r} was given: pass one of them (use_rule({asked!r}) is the weight's rule)")


def _check_no_head(rule: Rule) -> None:
    """A rule that declares ``reads_head`` (DropMatch) needs the verifier's LM-head input at each step, which
    transformers' hook never sees (it gets the logits only): refused by that declared capability."""
    if rule.reads_head:
        raise ValueError(f"{rule!r} reads the verifier's LM head (its dropout paths), but transformers' "
                         "_speculative_sampling receives only the logits: decode it with "
                         "cactus_theory.lm.speculative_generate, which taps the LM head")


def speculative_sampling(rule: Rule | None, candidate_input_ids: torch.Tensor, candidate_logits: torch.Tensor,
                         candidate_length: int, new_logits: torch.Tensor,
                         assistant_ensemble_weight: float | None = None,
                         generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``_speculative_sampling`` contract, verified by ``rule``.

    Args:
        rule: a project rule, or None: the rule transformers' arguments ask for (``Ensemble(w)`` with a weight,
            ``SpS()`` without).
        candidate_input_ids: ``[1, L + k]`` int64, the sequence with the ``k`` candidates last.
        candidate_logits: ``[1, k, V]`` float, the assistant's processed logits at the candidates.
        candidate_length: ``k``.
        new_logits: ``[1, k + 1, V]`` float32, the target's processed logits (row ``k``: bonus).
        assistant_ensemble_weight: transformers' ``w`` in (0, 1), or None: with a weight the step is verified by
            ``Ensemble(w)`` (``rule`` must then be None or equal to it: ``ValueError`` otherwise).
        generator: random source (default: torch's global generator, as transformers).

    Returns:
        ``valid_tokens`` ``[1, a + 1]`` int64 (accepted candidates, then the recovered or bonus
        token) and ``n_matches`` ``a`` (0-d int64 tensor), as transformers expects.

    Batch 1 only, as transformers' own ``_speculative_sampling`` (its assisted loop decodes one
    sequence; ``n_matches`` is one number): a batch of several rows raises ``ValueError``.
    """
    if rule is not None:
        check_rule(rule)
    rule = _step_rule(rule, assistant_ensemble_weight)
    _check_no_head(rule)
    for name, t in (("candidate_input_ids", candidate_input_ids), ("candidate_logits", candidate_logits),
                    ("new_logits", new_logits)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    k = check_int(candidate_length, "candidate_length", low=0)
    if candidate_input_ids.ndim != 2 or new_logits.ndim != 3 or candidate_logits.ndim != 3:
        raise ValueError(f"candidate_input_ids must be [1, L + k], candidate_logits [1, k, V] and new_logits "
                         f"[1, k + 1, V], got shapes {tuple(candidate_input_ids.shape)}, "
                         f"{tuple(candidate_logits.shape)} and {tuple(new_logits.shape)}")
    if candidate_input_ids.shape[0] != 1 or new_logits.shape[0] != 1:
        raise ValueError(f"speculative_sampling verifies one sequence (batch 1, as transformers' assisted decoding); "
                         f"got candidate_input_ids of batch {candidate_input_ids.shape[0]} and new_logits of batch "
                         f"{new_logits.shape[0]}")
    if new_logits.shape[1] != k + 1 or (k and tuple(candidate_logits.shape[:2]) != (1, k)) or \
            candidate_input_ids.shape[1] < k:
        raise ValueError(f"candidate_length = {k} does not match the shapes: candidate_input_ids "
                         f"{tuple(candidate_input_ids.shape)} (needs >= {k} tokens), candidate_logits "
                         f"{tuple(candidate_logits.shape)} (needs [1, {k}, V]), new_logits {tuple(new_logits.shape)} "
                         f"(needs [1, {k + 1}, V])")
    if candidate_logits.shape[-1] != new_logits.shape[-1]:
        raise ValueError(
            f"the assistant's vocabulary ({candidate_logits.shape[-1]} logits) differs from the target's "
            f"({new_logits.shape[-1]}): speculative sampling needs one shared vocabulary")
    q = new_logits.detach().float().softmax(-1)  # [1, k + 1, V]
    if not bool(torch.isfinite(q).all()):
        raise ValueError("new_logits has NaN, +inf, or a row with no finite logit: no verifier law to sample from")
    if k == 0:  # no candidates: the token after them is the bonus token, from the rule's bonus law (default q)
        u = torch.rand(1, generator=generator, dtype=torch.float64, device=q.device)
        from ..core.sampler import sample_rows

        law = q[:, 0] if rule.bonus_from_q else rule.bonus(q[:, 0])
        return sample_rows(law, u).view(1, 1), torch.zeros((), dtype=torch.long)
    p = candidate_logits.detach().to(q.device).float().softmax(-1)  # [1, k, V]
    if not bool(torch.isfinite(p).all()):
        raise ValueError("candidate_logits has NaN, +inf, or a row with no finite logit: no draft law")
    drafts = candidate_input_ids[:, -k:].to(q.device)
    tokens, num_accepted = verify(drafts, p, q, rule, generator=generator)
    a = num_accepted[0]
    return tokens[:, : int(a) + 1], a


@contextlib.contextmanager
def use_rule(rule: Rule | None = None, generator: torch.Generator | None = None):
    """Within the block, transformers' speculative sampling verifies with ``rule``.

    ``rule=None``: with the rule transformers' arguments ask for, through ``sampler.verify``: ``Ensemble(w)`` for
    ``generate(..., assistant_ensemble_weight=w)``, ``SpS()`` without a weight. A rule together with a weight
    that asks for another rule raises ``ValueError`` at the first step.
    ``generator``: random source of the verification draws (default torch's global generator,
    which ``torch.manual_seed`` seeds, as for transformers' own sampling).
    """
    if rule is not None and not isinstance(rule, Rule):
        raise ValueError(f"rule must be a cactus_theory Rule (ct.SpS(), ct.Cactus(0.5), ...), got {rule!r}")
    if rule is not None:
        check_rule(rule)  # a stateful rule (SequenceBudget) is refused: transformers' assisted loop carries no state
        _check_no_head(rule)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {generator!r}")

    def patched(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                assistant_ensemble_weight=None):
        return speculative_sampling(rule, candidate_input_ids, candidate_logits, candidate_length, new_logits,
                                    assistant_ensemble_weight, generator=generator)

    with _lock:
        before = _gen_utils._speculative_sampling
        _gen_utils._speculative_sampling = patched
        try:
            yield rule
        finally:
            _gen_utils._speculative_sampling = before


def assisted_generate(model, assistant_model, rule: Rule | None = None, generator: torch.Generator | None = None,
                      **kwargs):
    """``model.generate(assistant_model=assistant_model, do_sample=True, **kwargs)`` verified by ``rule`` (None:
    ``Ensemble(w)`` with ``assistant_ensemble_weight=w`` among ``kwargs``, ``SpS()`` without; see ``use_rule``).

    ``assistant_model`` is required (a draft model): without one transformers samples plainly and
    never calls the rule (nor with prompt lookup, which has no draft law), so ``None`` raises
    ``ValueError`` instead of silently ignoring ``rule``."""
    if assistant_model is None:
        raise ValueError("assistant_model is None: without a draft model transformers samples plainly and never "
                         "calls the rule; pass the draft model (or call model.generate inside use_rule(rule))")
    if kwargs.get("do_sample") is False:
        raise ValueError("do_sample=False never calls a verification rule (greedy assisted decoding "
                         "compares argmaxes); leave do_sample=True")
    kwargs["do_sample"] = True
    weight = kwargs.get("assistant_ensemble_weight", getattr(kwargs.get("generation_config"), "assistant_ensemble_weight",
                                                             None))
    _step_rule(rule, weight)  # a rule and a weight that disagree: refused before generate runs
    with use_rule(rule, generator=generator):
        return model.generate(assistant_model=assistant_model, **kwargs)
