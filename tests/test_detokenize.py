"""The batchers' incremental detokenisation: `fast_decode` (a fast tokenizer's Rust backend without transformers'
wrapper) gives `tokenizer.decode`'s text for every window, option and tokenizer family, and a stream of pieces adds
up to the whole answer's decode, clean-up of spaces before punctuation and contractions included."""

from __future__ import annotations

import dataclasses
import random

import pytest
from transformers import AutoTokenizer

from hf2triton.serving.batching.sequences import Sampling, Sequence
from hf2triton.serving.batching.text import Detokenizer, append_token, cleaned_text, detokenizer, fast_decode
from tests.helpers import minilm_dir, smollm2_gguf, t5_tokenizer

PROSE = "Hello , world ! Isn't it a test ? Ünïcödé, emoji 🙂🚀 and code: def f(x):\n    return x ** 2  # done. 3.50 € / 4,20 $ ."
# the clean-up's contractions after a space (" 's", " ' "): the token that makes it remove a space comes after it
TEXT = PROSE + " It 's a test ; I 'm sure they 're right , we 've seen ' quoted ' text . Isn 't it ? Don 't !"


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


def stream(detokenizer: Detokenizer, ids: list[int], guided: bool = False) -> list[str]:
    pieces: list[str] = []
    sequence = Sequence([0], Sampling(max_new_tokens=len(ids) + 1, guided=object() if guided else None), lambda text, finish: None)
    for token in ids:
        append_token(sequence, token, set(), 10**6, detokenizer, lambda _, piece: pieces.append(piece))
    return [*pieces, sequence.text[sequence.sent :]]  # the rest, as the finish sends it


@pytest.mark.parametrize("way", ["decode_stream", "windows"])
@pytest.mark.parametrize("text", [PROSE, TEXT], ids=["prose", "contractions"])
def test_a_stream_of_pieces_adds_up_to_the_decode_of_the_whole_answer(tokenizer, text, way):
    """tokenizers' DecodeStream where the backend decodes plainly, else new_text's two windows per token."""
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]  # special tokens too: skipped
    detokenize = detokenizer(tokenizer)
    assert detokenize.stream is not None and detokenize.clean_up is (
        tokenizer.clean_up_tokenization if tokenizer.clean_up_tokenization_spaces else None
    )
    detokenize = detokenize if way == "decode_stream" else dataclasses.replace(detokenize, stream=None)
    pieces = stream(detokenize, ids)
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True), pieces
    assert all(pieces[:-1]), "no empty piece is sent"
    guided = "".join(stream(detokenize, ids, guided=True))  # exactly its tokens: no clean-up
    assert guided == tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if tokenizer.clean_up_tokenization_spaces and text is TEXT:
        assert guided != "".join(pieces), "the clean-up had something to do"


def test_the_clean_up_of_a_stream_never_takes_back_what_it_sent():
    """cleaned_text against transformers' clean-up of the whole text, on random texts of the characters its patterns
    are made of, growing a few characters at a time: every prefix it lets out stays, and the end is the whole clean-up."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    clean_up = PreTrainedTokenizerBase.clean_up_tokenization
    picks = random.Random(7)
    for index in range(20000):  # every 40th a long text of short words: no point to clean up to for 64+ characters
        alphabet, longest = (" ' .,?!ntsmvrea  '", 30) if index % 40 else ("a b n't ' .", 300)
        raw = "".join(picks.choice(alphabet) for _ in range(picks.randint(1, longest)))
        sequence = Sequence([0], Sampling(max_new_tokens=1), lambda text, finish: None)
        at = 0
        while at < len(raw):
            at = min(len(raw), at + picks.randint(1, 3))
            sequence.raw = raw[:at]
            text, unsettled = cleaned_text(sequence, clean_up)
            assert text == clean_up(raw[:at]), raw[:at]
            settled = text[: len(text) - unsettled]
            assert clean_up(raw).startswith(settled), (raw, raw[:at], settled)


def test_a_tokenizer_that_decodes_its_own_way_keeps_its_decode(tokenizer):
    class OwnDecode(type(tokenizer)):
        def _decode(self, token_ids, **kwargs):
            return "own"

    tokenizer.__class__, kind = OwnDecode, type(tokenizer)
    try:
        assert fast_decode(tokenizer) == tokenizer.decode
        assert detokenizer(tokenizer) == Detokenizer(tokenizer.decode), "its decode, window by window, cleaning its own way"
    finally:
        tokenizer.__class__ = kind.__mro__[1]
