"""Language models: (draft, verifier) pairs, sampling transforms, batched speculative decoding."""

from .generate import DecodeResult, DecodeStats, autoregressive_generate, speculative_generate
from .pair import ModelPair, check_same_tokenizer, load_model, load_pair
from .transforms import sampling_probs

__all__ = ["DecodeResult", "DecodeStats", "ModelPair", "autoregressive_generate", "check_same_tokenizer",
           "load_model", "load_pair", "sampling_probs", "speculative_generate"]
