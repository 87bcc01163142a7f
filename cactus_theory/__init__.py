"""cactus-theory: exact theory and verification of lossy speculative sampling (Cactus and friends).

Notation follows Hao & Mou (ICLR 2026): ``p`` draft, ``q`` verifier, ``n`` drafted token,
``h`` target law, ``gamma = h_n``, ``delta`` divergence budget.
"""

from .divergences import (
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
from .exact import acceptance_rate, induced_distribution, step_divergence
from .registry import make_rule, rule_classes
from .rules import (
    EARS,
    TAS,
    Cactus,
    DropMatch,
    FLy,
    Interpolation,
    MedusaTypical,
    RelaxedAcceptance,
    Rule,
    SGLangThreshold,
    SpS,
    TopK,
    two_block_root,
)

RULES = rule_classes()  # {"sps": SpS, "cactus": Cactus, ...}; metadata in cactus_theory.registry

__version__ = "0.1.0"

__all__ = [
    "DIVERGENCES", "F_DIVERGENCES", "chi2", "cross_entropy", "divergence", "entropy", "hellinger",
    "js", "kl", "reverse_kl", "tv", "acceptance_rate", "induced_distribution", "step_divergence",
    "EARS", "RULES", "TAS", "Cactus", "Interpolation", "Rule", "SpS", "TopK", "make_rule",
    "two_block_root", "SGLangThreshold", "RelaxedAcceptance", "MedusaTypical", "FLy", "DropMatch",
]
