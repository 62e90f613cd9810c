"""Tokens to text for the torch batchers: the next token of each row, incremental detokenisation, stop strings."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from .sequences import PARTIAL_CHARACTER, Sequence, TokenLogprob


def eos_token_ids(model, tokenizer) -> set[int]:
    """The tokens that end an answer: the generation config's eos (one or a list) and the tokenizer's."""
    eos = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
    eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
    return {int(e) for e in [*eos, tokenizer.eos_token_id] if e is not None}


@dataclass(frozen=True)
class Detokenizer:
    """How a batcher's rows' tokens become text. `decode`: the tokenizer's decode (fast_decode). `clean_up`: where the
    tokenizer cleans up spaces before punctuation and contractions the standard way, that clean-up, applied here to
    the raw text so that a stream's pieces add up to the whole answer's decode (cleaned_text); None where it does
    none, or its own way (then its decode cleans each window, text.new_text). `stream`: where the raw text is the Rust
    backend's plain decode, a new answer's incremental decoder, token -> new text or None (tokenizers' DecodeStream:
    one call per token, 1.7 vs 5-8 µs for new_text's two windows on 2 cores)."""

    decode: Callable[..., str]
    clean_up: Callable[[str], str] | None = None
    stream: Callable[[], Callable[[int], str | None]] | None = None
    primed: bool = True  # a stream first reads the prompt's last tokens (a decoder-only model's answer continues them)


def detokenizer(tokenizer) -> Detokenizer:
    decode = fast_decode(tokenizer)
    # bound methods compare equal, never identical: a tokenizer that decodes its own way, window by window
    if decode == tokenizer.decode:
        return Detokenizer(decode)
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase  # fast_decode imported it

    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:  # tokenizers < 0.21
        stream = None
    else:
        backend = tokenizer._tokenizer
        stream = lambda: functools.partial(DecodeStream(skip_special_tokens=True).step, backend)  # noqa: E731
    if not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return Detokenizer(decode, stream=stream)
    if type(tokenizer).clean_up_tokenization is PreTrainedTokenizerBase.clean_up_tokenization:
        return Detokenizer(decode, tokenizer.clean_up_tokenization, stream)
    return Detokenizer(decode)  # its own clean-up: its decode cleans each window


def cleaned_text(sequence: Sequence, clean_up: Callable[[str], str]) -> tuple[str, int]:
    """The clean-up of `sequence.raw` (transformers' PreTrainedTokenizerBase.clean_up_tokenization: " .", " ?", " !",
    " ,", " ' ", " n't", " 'm", " 's", " 've", " 're" lose their first space, " ' " its last too, in that order), and how
    many of its last characters may still change: those after the last point that three non-spaces precede where
    they hold an apostrophe, else its trailing spaces and a " n" before them. The text before such a point cleans up alone
    (every pattern starts with a space, is at most 4 characters long and keeps its last characters), so it is cleaned
    once and kept, and each token cleans only the tail after it (tests/test_detokenize.py checks every prefix let
    out against the whole text's clean-up on random texts)."""
    raw, split = sequence.raw, sequence.clean_split
    end, floor = len(raw), max(split, len(raw) - 64)  # a text of short words only: a longer tail, never a longer scan
    while end > floor and " " in raw[max(0, end - 3) : end]:
        end -= 1
    if " " in raw[max(0, end - 3) : end]:  # none within the scan
        end = split
    if end > split:
        sequence.clean_head += clean_up(raw[split:end])
        sequence.clean_split = split = end
    tail = clean_up(raw[split:])
    text = sequence.clean_head + tail
    if "'" in tail:  # " ' " drops its last space, which a later " ." (cleaned first) may take instead: all of it waits
        return text, len(tail)
    bare = text.rstrip(" ")  # a later " ' " and then " 's" take up to two spaces before the quote
    if bare.endswith(" n"):  # " n't" may be arriving (" n ' t" too: " ' " first)
        bare = bare[:-1].rstrip(" ")
    return text, len(text) - len(bare)


def fast_decode(tokenizer) -> Callable[..., str]:
    """`tokenizer.decode` for the incremental detokenisation, without transformers' wrapper where a fast tokenizer's
    decode is exactly its Rust backend's plus the optional clean-up: the two decodes per token cost 18 µs through the
    wrapper, 5 µs direct (SmolLM2, 2 cores; benchmarks/probes/detokenize.py), per running row at every step on the
    batcher's thread. A tokenizer that decodes its own way (Whisper's, a slow one) keeps its `decode`."""
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:  # another transformers than the pinned one
        return tokenizer.decode
    kind = type(tokenizer)
    plain = isinstance(tokenizer, PreTrainedTokenizerFast) and kind.decode is PreTrainedTokenizerBase.decode
    if not (plain and kind._decode is PreTrainedTokenizerFast._decode):
        return tokenizer.decode
    backend, clean_up = tokenizer._tokenizer, tokenizer.clean_up_tokenization

    def decode(ids: list[int], skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None) -> str:
        text = backend.decode(ids, skip_special_tokens=skip_special_tokens)
        cleans = tokenizer.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        return clean_up(text) if cleans else text

    return decode


def penalized(torch, rows: list[Sequence], logits):
    """`logits` with each row's presence / frequency penalties taken off its answer's tokens (OpenAI's and vLLM's rule:
    logit -= presence * [count > 0] + frequency * count); the same tensor where no row asks for any."""
    asking = [i for i, row in enumerate(rows) if (row.sampling.presence_penalty or row.sampling.frequency_penalty) and row.generated]
    if not asking:
        return logits
    out = logits.clone()  # the raw logits stay for the log-probabilities
    for index in asking:
        options = rows[index].sampling
        tokens, counts = torch.tensor(rows[index].generated, device=logits.device).unique(return_counts=True)
        out[index, tokens] -= options.presence_penalty + options.frequency_penalty * counts.to(out.dtype)
    return out


def sample_tokens(torch, rows: list[Sequence], logits) -> list[int]:
    """Each row's next token: the argmax for a greedy row, else a draw from softmax(logits / temperature) within
    top_k / top_p, from the sequence's own generator when it has a seed."""
    tokens = logits.argmax(-1).tolist()  # greedy rows: the same argmax generate() takes
    for index, sequence in enumerate(rows):
        options = sequence.sampling
        if options.temperature <= 0:
            continue
        scores = logits[index] / options.temperature
        if options.top_k > 0:
            kth = torch.topk(scores, min(options.top_k, scores.shape[-1])).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if options.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True)
            cumulative = ordered.softmax(-1).cumsum(-1)
            drop = cumulative - ordered.softmax(-1) > options.top_p  # keep the smallest prefix reaching top_p
            scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
        probs = scores.softmax(-1).cpu()
        tokens[index] = int(torch.multinomial(probs, 1, generator=sequence.generator).item())
    return tokens


def append_token(sequence: Sequence, token: int, eos_ids: set[int], context: int, detokenizer: Detokenizer, emit) -> str | None:
    """Record a token; `emit(sequence, text)` the complete new text, holding back what may be the start of a stop
    string (the text ends before one, which is not part of it) or still change in the clean-up; the finish reason
    when the sequence is done (`context`: the tokens the model attends to)."""
    options = sequence.sampling
    if token in eos_ids and not options.ignore_eos:
        return "stop"
    sequence.generated.append(token)
    # a guided answer is exactly the tokens its grammar accepted: no clean-up (" ," stays)
    clean_up = detokenizer.clean_up if not options.guided else None
    if detokenizer.stream is not None:
        piece = _stream_step(sequence, token, detokenizer)
    else:
        piece = new_text(detokenizer.decode, sequence, raw=clean_up is not None)
    unsettled = 0
    if clean_up is None:
        complete = sequence.text + piece
    else:
        sequence.raw += piece
        complete, unsettled = cleaned_text(sequence, clean_up)
    # the earliest stop string in the text ends it, whichever of them is listed first (none stays in the answer)
    found = [at for stop in options.stop if (at := complete.find(stop, max(0, sequence.sent - len(stop)))) >= 0]
    if found:
        sequence.text = complete[: min(found)]
        return "stop"
    sequence.text = complete
    held = max([unsettled, *(len(s) - 1 for s in options.stop)])  # a stop string may be arriving
    visible = len(sequence.text) - held
    if visible > sequence.sent:
        emit(sequence, sequence.text[sequence.sent : visible])
        sequence.sent = visible
    if len(sequence.generated) >= options.max_new_tokens:
        return "length"
    if len(sequence.prompt_ids) + len(sequence.generated) >= context:
        return "length"
    if options.time_limit_s and time.monotonic() - sequence.started > options.time_limit_s:
        return "time"
    return None


INVALID_PREFIX = "Invalid prefix encountered"  # tokenizers' DecodeStream, once bytes it held cannot become text


PRIMING_TOKENS = (4, 24)  # vLLM's: the shortest prompt suffix of 4..23 tokens that decodes to whole characters


def _primed_stream(sequence: Sequence, detokenizer: Detokenizer) -> Callable[[int], str | None]:
    """A DecodeStream that has read the prompt's last tokens (their text dropped), as vLLM primes its own: the first
    generated token decodes after the prompt, not at the start of a text -- a SentencePiece tokenizer (Llama-2,
    Mistral, Gemma) keeps its leading space (" Paris", as vLLM and transformers' pipeline give it; "Paris" after
    "The capital of France is" joined "isParis")."""
    step = detokenizer.stream()
    prompt = sequence.prompt_ids
    low, high = PRIMING_TOKENS
    suffix = next(
        (prompt[-n:] for n in range(low, min(len(prompt) + 1, high)) if PARTIAL_CHARACTER not in detokenizer.decode(prompt[-n:])),
        prompt[-low:],
    )
    try:
        for token in suffix:
            step(token)
    except Exception:  # noqa: BLE001 - a suffix it cannot read: the answer's text starts on its own, as before
        return detokenizer.stream()
    return step


def _stream_step(sequence: Sequence, token: int, detokenizer: Detokenizer) -> str:
    """The text `token` completes in the sequence's DecodeStream ("" for a split character or a special token). A
    byte-fallback tokenizer (Llama-2, Mistral, Gemma) fails the step when bytes it held turn out not to be UTF-8
    (a newline byte, then a cut-off character): as vLLM does (its issue 17448), a fresh stream takes the token."""
    if sequence.decode_stream is None:
        sequence.decode_stream = _primed_stream(sequence, detokenizer) if detokenizer.primed else detokenizer.stream()
    try:
        return sequence.decode_stream(token) or ""
    except Exception as err:
        if not str(err).startswith(INVALID_PREFIX):
            raise
        sequence.decode_stream = detokenizer.stream()
        return sequence.decode_stream(token) or ""


def new_text(decode, sequence: Sequence, raw: bool = False) -> str:
    """The complete characters the newest tokens add, decoding only the last few tokens (text-generation-
    inference's and vLLM's incremental detokenisation) rather than the whole answer at every token. A split
    multi-byte character waits for its next token. `raw`: without the tokenizer's clean-up (a guided answer's, or
    one cleaned_text cleans up)."""
    generated = sequence.generated
    options = {"skip_special_tokens": True, **({"clean_up_tokenization_spaces": False} if raw or sequence.sampling.guided else {})}
    known = decode(generated[sequence.prefix_offset : sequence.read_offset], **options)
    text = decode(generated[sequence.prefix_offset :], **options)
    if text.endswith(PARTIAL_CHARACTER):
        return ""
    # a tokenizer's own clean-up (not cleaned_text's) can remove a space `known` ends with (sent already) once
    # punctuation follows: the new text starts where the two part, or that punctuation would be lost
    start = len(known) if text.startswith(known) else len(os.path.commonprefix([known, text]))
    if len(text) <= start:
        return ""
    sequence.prefix_offset, sequence.read_offset = sequence.read_offset, len(generated)
    return text[start:]


def token_logprobs(torch, logits, tokens: list[int], tops: list[int]) -> list[TokenLogprob]:
    """Per row of raw `logits` ([rows, vocabulary], before any temperature or top_p, as vLLM reports them): the
    log-softmax of `tokens[row]` and the `tops[row]` most likely alternatives."""
    logprobs = logits.float().log_softmax(-1)
    chosen = logprobs.gather(-1, torch.tensor(tokens, device=logprobs.device)[:, None])[:, 0].tolist()
    most = max(tops, default=0)
    values, ids = logprobs.topk(most, -1) if most else (None, None)
    values, ids = (values.tolist(), ids.tolist()) if most else ([[]] * len(tokens), [[]] * len(tokens))
    rows = enumerate(zip(tokens, chosen, tops))
    return [TokenLogprob(token, logprob, tuple(zip(ids[row][:top], values[row][:top]))) for row, (token, logprob, top) in rows]
