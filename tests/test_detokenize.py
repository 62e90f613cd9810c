"""The batchers' incremental detokenisation: `fast_decode` (a fast tokenizer's Rust backend without transformers'
wrapper) gives `tokenizer.decode`'s text for every window, option and tokenizer family, and a stream of pieces
built with it equals the whole answer's decode."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from hf2triton.serving.batching.sequences import Sampling, Sequence
from hf2triton.serving.batching.text import fast_decode, new_text
from tests.helpers import minilm_dir, smollm2_gguf, t5_tokenizer

PROSE = "Hello , world ! Isn't it a test ? Ünïcödé, emoji 🙂🚀 and code: def f(x):\n    return x ** 2  # done. 3.50 € / 4,20 $ ."
# with the clean-up's contractions after a space (" 's", " ' "): where a piece was sent before the token that makes
# the clean-up remove its space, the stream keeps it (text.new_text); both decodes must still give the same pieces
TEXT = PROSE + " It 's a test ; I 'm sure they 're right , we 've seen ' quoted ' text ."


@pytest.fixture(scope="module", params=["smollm2", "minilm", "t5"])
def tokenizer(request, tmp_path_factory):
    if request.param == "smollm2":  # byte-level BPE, clean-up on (as transformers loads it from the GGUF file)
        return AutoTokenizer.from_pretrained(smollm2_gguf().parent, gguf_file=smollm2_gguf().name)
    if request.param == "minilm":  # WordPiece (BERT), clean-up on
        return AutoTokenizer.from_pretrained(minilm_dir())
    return t5_tokenizer(tmp_path_factory.mktemp("t5"))  # Unigram with Metaspace pieces


def test_the_direct_decode_equals_the_tokenizers_for_every_window_and_option(tokenizer):
    decode = fast_decode(tokenizer)
    assert decode != tokenizer.decode  # a fast tokenizer that decodes the plain way: the wrapper is skipped
    ids = tokenizer(TEXT, add_special_tokens=True)["input_ids"]
    picks = random.Random(0)
    windows = [ids, ids[:1], [], *[ids[a : a + picks.randint(1, 6)] for a in picks.sample(range(len(ids)), 40)]]
    for window in windows:
        for options in ({}, {"skip_special_tokens": True}, {"skip_special_tokens": True, "clean_up_tokenization_spaces": False}):
            options = {**options, "clean_up_tokenization_spaces": True} if window is ids[:1] else options
            assert decode(window, **options) == tokenizer.decode(window, **options), (window, options)


@pytest.mark.parametrize("text", [PROSE, TEXT], ids=["prose", "contractions"])
def test_a_stream_of_pieces_is_the_same_with_either_decode(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    streamed = {}
    for name, decode in (("wrapper", tokenizer.decode), ("direct", fast_decode(tokenizer))):
        sequence = Sequence([0], Sampling(max_new_tokens=len(ids)), lambda text, finish: None)
        pieces = []
        for token in ids:
            sequence.generated.append(token)
            pieces.append(new_text(decode, sequence))
        streamed[name] = pieces
    assert streamed["direct"] == streamed["wrapper"]
    if text is PROSE:
        assert "".join(streamed["direct"]).strip() == tokenizer.decode(ids, skip_special_tokens=True).strip()


def test_a_tokenizer_that_decodes_its_own_way_keeps_its_decode(tokenizer):
    class OwnDecode(type(tokenizer)):
        def _decode(self, token_ids, **kwargs):
            return "own"

    tokenizer.__class__, kind = OwnDecode, type(tokenizer)
    try:
        assert fast_decode(tokenizer) == tokenizer.decode
    finally:
        tokenizer.__class__ = kind.__mro__[1]
