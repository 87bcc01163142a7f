"""``lm.pair``: a draft and verifier with different tokenizers are refused."""

from __future__ import annotations

import pytest

from cactus_theory.lm.pair import check_same_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


class _Tok:
    def __init__(self, vocab, eos=0):
        self.vocab, self.eos_token_id = vocab, eos

    def get_vocab(self):
        return dict(self.vocab)


def test_tokenizer_mismatch_is_refused():
    check_same_tokenizer(_Tok({"a": 0, "b": 1}), _Tok({"a": 0, "b": 1}))
    with pytest.raises(ValueError, match="tokenizers differ"):
        check_same_tokenizer(_Tok({"a": 0, "b": 1}), _Tok({"a": 1, "b": 0}))
    with pytest.raises(ValueError, match="eos_token_id"):
        check_same_tokenizer(_Tok({"a": 0}, eos=0), _Tok({"a": 0}, eos=1))
