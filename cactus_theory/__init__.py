"""cactus-theory: exact theory and verification of lossy speculative sampling (Cactus and friends).

Notation follows Hao & Mou (ICLR 2026): ``p`` draft, ``q`` verifier, ``n`` drafted token,
``h`` target law, ``gamma = h_n``, ``delta`` divergence budget.

Every module lives in a layer folder (``util``, ``core``, ``theory``, ``claims``, ``lm``, ``integrations``,
``cli``; see docs/architecture.md). The documented module paths (``cactus_theory.sampler``,
``cactus_theory.optimize``, ...) are aliases of the modules in those folders (``PUBLIC_PATHS``): the same
module object under both names, loaded on first import.
"""

from .core.budget import SequenceBudget
from .core.divergences import (
    DIVERGENCES,
    F_DIVERGENCES,
    chi2,
    cross_entropy,
    divergence,
    entropy,
    hellinger,
    js,
    kl,
    reverse_kl,
    tv,
)
from .core.exact import acceptance_rate, induced_distribution, step_divergence
from .core.registry import make_rule, rule_classes
from .core.rules import (
    EARS,
    FSD,
    SCD,
    TAS,
    Cactus,
    CascadeDefer,
    DropMatch,
    Ensemble,
    EntropyVerify,
    Eta,
    FLy,
    Interpolation,
    Lenience,
    MaxEps,
    MaxSampled,
    MedusaTypical,
    Mentored,
    MinP,
    RelaxedAcceptance,
    RFuzzy,
    Rule,
    SampleMatch,
    SGLangThreshold,
    SpS,
    Tok3,
    TopK,
    two_block_root,
)
from .util.aliases import install as _install_aliases

RULE_CLASSES = rule_classes()  # {"sps": SpS, "cactus": Cactus, ...}; metadata (RuleSpec) in cactus_theory.registry

PUBLIC_PATHS = {f"cactus_theory.{alias}": f"cactus_theory.{target}" for alias, target in {
    "divergences": "core.divergences", "rules": "core.rules", "exact": "core.exact", "registry": "core.registry",
    "sampler": "core.sampler", "validate": "core.validate", "dropmatch": "core.dropmatch",
    "optimize": "theory.optimize", "stats": "theory.stats", "toy": "theory.toy", "tradeoff": "theory.tradeoff",
    "tree": "theory.tree",
    "lm.transforms": "core.transforms", "lm.draft_build": "lm.train.draft_build", "lm.cli": "cli.lm",
}.items()}
_install_aliases(PUBLIC_PATHS)


# public functions of the theory layer, imported on first access (``import cactus_theory`` stays free of scipy)
_LAZY = {"check_sampler": "cactus_theory.theory.check", "check_generation": "cactus_theory.theory.check_generation"}


def __getattr__(name: str):
    """``ct.sampler``, ``ct.rules``, ...: a public module path as an attribute, imported on first access; and
    ``ct.check_sampler`` / ``ct.check_generation`` (``_LAZY``), from the theory layer on first access."""
    import importlib

    if f"cactus_theory.{name}" in PUBLIC_PATHS:
        return importlib.import_module(f"cactus_theory.{name}")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cactus_theory' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [
    "DIVERGENCES", "F_DIVERGENCES", "chi2", "cross_entropy", "divergence", "entropy", "hellinger",
    "js", "kl", "reverse_kl", "tv", "acceptance_rate", "induced_distribution", "step_divergence",
    "EARS", "RULE_CLASSES", "TAS", "Cactus", "Interpolation", "Rule", "SpS", "TopK", "make_rule",
    "two_block_root", "SGLangThreshold", "RelaxedAcceptance", "MedusaTypical", "FLy", "DropMatch", "Ensemble",
    "EntropyVerify", "Lenience", "MinP", "Eta", "FSD", "check_sampler", "check_generation", "SequenceBudget",
    "CascadeDefer", "Tok3", "Mentored", "SCD", "RFuzzy", "MaxEps", "MaxSampled", "SampleMatch",
]
