"""The registry is the one source of rule metadata: complete, consistent, and used by the CLI."""

import argparse
import dataclasses

import pytest

import cactus_theory as ct
from cactus_theory import registry
from cactus_theory import rules as R


def _rule_classes_in_rules_module():
    """Every concrete rule class defined in rules.py (found independently of the registry): all but the
    base classes (RowTarget: issue 42's whole-row targets) and DropMatch bound to one step's paths."""
    out = []
    for obj in vars(R).values():
        if isinstance(obj, type) and issubclass(obj, R.Rule) and obj.__module__ == R.__name__:
            if obj not in (R.Rule, R.TargetRule, R.ScalingRule, R.RowTarget, R.DropMatchAt):
                out.append(obj)
    return out


def test_every_rule_class_is_registered_once():
    classes = _rule_classes_in_rules_module()
    assert classes, "no rule classes found"
    registered = [s.cls for s in registry.RULES.values()]
    for cls in classes:
        assert registered.count(cls) == 1, cls
    assert ct.RULE_CLASSES == {k: s.cls for k, s in registry.RULES.items()}


@pytest.mark.parametrize("key", list(registry.RULES))
def test_spec_lists_constructor_parameters_and_sweeps(key):
    s = registry.RULES[key]
    assert {p.name for p in s.params} == {f.name for f in dataclasses.fields(s.cls)}
    default = s.make()
    for p in s.params:
        assert getattr(default, p.name) == s.default(p.name), (key, p.name)
    pts = s.sweep_rules()
    assert pts and all(isinstance(r, s.cls) for _, r in pts)
    if s.sweep[0]:
        assert [getattr(r, s.sweep[0]) for _, r in pts] == list(s.sweep[1])
    assert registry.spec(default) is s and registry.spec(key) is s and registry.spec(s.cls) is s
    assert registry.label(default).startswith(s.label)


def test_colours_and_flags_are_distinct():
    colours = [s.colour for s in registry.RULES.values()]
    assert len(set(colours)) == len(colours)
    flags = [p.flag for s in registry.RULES.values() for p in s.params]
    assert len(set(flags)) == len(flags)
    assert "--top-k" not in flags and "-k" not in flags  # reserved for sampling and drafts per step


def test_cli_round_trip():
    ap = argparse.ArgumentParser()
    registry.add_rule_arguments(ap)
    assert registry.rule_from_args(ap.parse_args([])) == ct.Cactus(1.0)
    assert registry.rule_from_args(ap.parse_args(["--rule", "tas", "--tas-alpha", "0.2"])) == ct.TAS(0.09, 0.2)
    assert registry.rule_from_args(ap.parse_args(["--rule", "interpolation", "--interp-alpha", "0.9"])) == \
        ct.Interpolation(0.9)
    assert registry.rule_from_args(ap.parse_args(["--rule", "topk", "--topk-rule-k", "3"])) == ct.TopK(3)
    with pytest.raises(SystemExit):
        ap.parse_args(["--rule", "bogus"])


def test_labels_and_bad_names():
    assert registry.label(ct.Cactus(1.0)) == "Cactus delta=1"
    assert registry.label(ct.Cactus(0.5, "tv", "exact")) == "Cactus delta=0.5 divergence=tv solver=exact"
    assert registry.label(ct.SpS()) == "SpS"
    with pytest.raises(ValueError, match="rule must be one of"):
        registry.make("bogus")  # ("medusa" is a rule since issue 11)
    with pytest.raises(ValueError, match="rule name must be a string"):
        registry.make(None)
    with pytest.raises(ValueError, match="no registered rule"):
        registry.spec(object())


def test_a_subclass_maps_to_its_registered_base():
    @dataclasses.dataclass(frozen=True)
    class MyCactus(ct.Cactus):
        pass

    assert registry.spec(MyCactus(0.5)) is registry.RULES["cactus"]


def test_taxonomy_matches_each_rules_behaviour():
    """registry.VERIFICATION: a truncation rule's acceptance never reads p (two drafts, same q, same
    acceptance of every token); a collaborative rule's does (some pair of drafts changes it)."""
    import numpy as np

    rng = np.random.default_rng(0)
    V = 24  # above every swept top-k
    q = rng.dirichlet(np.ones(V) * 0.5, size=8)
    p1, p2 = rng.dirichlet(np.ones(V), size=8), rng.dirichlet(np.ones(V), size=8)
    hit = rng.uniform(0, 0.5, size=(8, V))
    seen = set()
    for key, s in registry.RULES.items():
        assert s.verification in registry.VERIFICATION and s.why, key
        same = []
        for _, rule in s.sweep_rules() or [(None, s.make())]:
            if s.reads_head:
                rule = rule.at(hit)
            if s.stateful:  # judged by the Cactus its plan sets per row from (p, q) and the budget left
                a = [rule.plan(rule.start(8), p[:, None], q[:, None]).rows(np.arange(8), np.zeros(8, int))
                     .accept_prob_all(p, q) for p in (p1, p2)]
                same.append(np.allclose(*a, atol=1e-12))
                continue
            same.append(np.allclose(rule.accept_prob_all(p1, q), rule.accept_prob_all(p2, q), atol=1e-12))
        # truncation: no configuration reads p; collaborative: some configuration does
        assert (all(same) if s.verification == "truncation" else not all(same)), (key, s.verification)
        seen.add(s.verification)
    assert seen == set(registry.VERIFICATION)
