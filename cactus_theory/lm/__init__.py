"""Language models: (draft, verifier) pairs, sampling transforms, batched speculative decoding."""

from .loop import SAMPLING, autoregressive_generate, speculative_generate
from .metrics import DecodeResult, DecodeStats, SequenceCounters
from .pair import ModelPair, check_same_tokenizer, load_model, load_pair
from .transforms import sampling_probs

__all__ = ["SAMPLING", "DecodeResult", "DecodeStats", "ModelPair", "SequenceCounters", "autoregressive_generate",
           "check_same_tokenizer", "load_model", "load_pair", "sampling_probs", "speculative_generate"]
