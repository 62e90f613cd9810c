"""The continuous batcher in-process (no Triton): sequences that join and leave a running batch produce
exactly what each produces alone; long prompts prefilled in chunks under max_prefill_tokens; stop strings,
seeds, limits, cancellation, a full queue, and text that never ends in a split character."""

from __future__ import annotations

import pytest

from hf2triton.serving.batching.continuous import ContinuousBatcher
from hf2triton.serving.batching.sequences import Busy, Sampling, Sequence
from hf2triton.serving.batching.settings import StepSettings
from hf2triton.serving.batching.slots import SlotBatcher
from hf2triton.serving.batching.text import Detokenizer, append_token, detokenizer
from hf2triton.serving.interface import DEFAULTS, INTERNAL_ERROR


@pytest.fixture(scope="module")
def llm(tiny_models):
    import transformers

    path = tiny_models["text-generation"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    return model, tokenizer


PROMPTS = ["What is the capital of France?", "Hi", "Tell me a very long story about a dragon and a knight", "你好，介绍一下你自己"]
LONG_PROMPT = " ".join(f"chapter {i}: the dragon met the knight again." for i in range(10))  # 110 tokens


def solo(llm, prompt: str, max_new_tokens: int) -> str:
    model, tokenizer = llm
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).rstrip("\ufffd")


class Collector:
    def __init__(self):
        self.pieces: list[str] = []
        self.finish = None

    def __call__(self, text, finish):
        assert self.finish is None, "nothing after the final event"
        self.pieces.append(text)
        self.finish = finish

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@pytest.fixture(params=[ContinuousBatcher, SlotBatcher], ids=["dynamic-cache", "slots"])
def new_batcher(request):
    """A batcher over the tiny model with the served defaults unless a test sets its own limits: every test runs
    on the CPU's dynamic cache and on the GPU's preallocated slots (here without CUDA graphs: on the CPU)."""

    def build(llm, **limits) -> ContinuousBatcher:
        limits = {
            "max_sequences": DEFAULTS.max_sequences,
            "max_queue": DEFAULTS.max_queue,
            "context": 2048,
            "max_prefill_tokens": DEFAULTS.max_prefill_tokens,
            **limits,
        }
        return request.param(*llm, "cpu", **limits)

    return build


def submit(batcher, llm, prompt, **sampling) -> Collector:
    collector = Collector()
    ids = llm[1](prompt, add_special_tokens=False)["input_ids"]
    batcher.submit(Sequence(ids, Sampling(**{"max_new_tokens": DEFAULTS.max_new_tokens, **sampling}), collector))
    return collector


def drain(batcher, limit: int = 1000) -> None:
    for _ in range(limit):
        if batcher.idle:
            return
        batcher.step()
    raise AssertionError("the batch did not finish")


def test_staggered_sequences_equal_their_solo_greedy_text(llm, new_batcher):
    batcher = new_batcher(llm, max_sequences=3, context=256)
    lengths = [12, 20, 7, 16]
    first = [submit(batcher, llm, p, max_new_tokens=n) for p, n in zip(PROMPTS[:2], lengths)]
    for _ in range(3):
        batcher.step()
    later = [submit(batcher, llm, p, max_new_tokens=n) for p, n in zip(PROMPTS[2:], lengths[2:])]
    drain(batcher)
    for prompt, n, collector in zip(PROMPTS, lengths, first + later):
        assert collector.text == solo(llm, prompt, n), prompt
        assert collector.finish.reason == "length" and collector.finish.completion_tokens == n
        assert "\ufffd" not in "".join(collector.pieces)
        assert collector.finish.prompt_tokens == len(llm[1](prompt, add_special_tokens=False)["input_ids"])


def test_stop_string_ends_and_is_cut(llm, new_batcher):
    batcher = new_batcher(llm)
    full = solo(llm, PROMPTS[0], 20)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    collector = submit(batcher, llm, PROMPTS[0], max_new_tokens=20, stop=(stop,))
    drain(batcher)
    assert collector.finish.reason == "stop" and collector.text == full[: full.index(stop)]


def test_ignore_eos_goes_on_past_the_end_token():
    """vLLM's ignore_eos (what benchmarks send for a fixed answer length): the end token is generated and skipped."""
    words = Detokenizer(lambda ids, **_: "".join({0: "a", 1: "b"}.get(i, "") for i in ids))
    for ignore, expected in ((False, [None, "stop"]), (True, [None, None, "length"])):
        sequence = Sequence([5], Sampling(max_new_tokens=3, ignore_eos=ignore), Collector())
        reasons = [append_token(sequence, token, {9}, 100, words, lambda *_: None) for token in (0, 9, 1)[: len(expected)]]
        assert reasons == expected, ignore
    assert sequence.text == "ab" and sequence.generated == [0, 9, 1]


def test_the_earliest_stop_string_ends_the_text_whichever_is_listed_first():
    """OpenAI's contract: the answer holds none of its stop strings ("som" comes first in the text)."""
    vocabulary = {0: "Say", 1: " something", 2: " else"}
    words = Detokenizer(lambda ids, **_: "".join(vocabulary[i] for i in ids))
    for stops in (("thing", "som"), ("som", "thing")):
        sequence = Sequence([5], Sampling(max_new_tokens=8, stop=stops), Collector())
        reasons = [append_token(sequence, token, set(), 100, words, lambda *_: None) for token in (0, 1)]
        assert reasons == [None, "stop"] and sequence.text == "Say ", stops


def test_a_decode_stream_failing_on_bytes_that_are_no_text_restarts_at_the_token():
    """A byte-fallback tokenizer's DecodeStream (Llama-2, Mistral) raises "Invalid prefix encountered" when bytes it
    held are no UTF-8 after all (a newline byte, then a cut-off character): a fresh stream takes the token, as vLLM
    does, and the answer goes on."""
    streams = []

    def stream():
        streams.append(len(streams))
        first = len(streams) == 1

        def step(token: int) -> str:
            if first and token == 2:
                raise Exception("Invalid prefix encountered while decoding stream. Token ids: [1, 2]")
            return {1: "a", 2: "b", 3: "c"}[token]

        return step

    words = Detokenizer(lambda ids, **_: "", stream=stream)
    sequence = Sequence([5], Sampling(max_new_tokens=8), Collector())
    assert [append_token(sequence, token, set(), 100, words, lambda *_: None) for token in (1, 2, 3)] == [None] * 3
    assert sequence.text == "abc" and streams == [0, 1]


@pytest.fixture(scope="module")
def byte_fallback_tokenizer(tmp_path_factory):
    """A Llama-2-style tokenizer trained here: BPE with byte fallback, Metaspace "▁", a decoder that strips the
    text's first space (what Llama-2, Mistral and Gemma ship)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, LlamaTokenizerFast

    corpus = ["Hello world. The capital of France is Paris.", "I like pizza, don't you?", "Tell me a story about a dragon!"] * 20
    raw = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    raw.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens]))
    raw.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    path = tmp_path_factory.mktemp("byte-fallback")
    LlamaTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>", legacy=True).save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def test_a_byte_fallback_tokenizers_stream_keeps_the_first_space_and_survives_bytes_that_are_no_text(byte_fallback_tokenizer):
    """The torch batchers' text as vLLM's: the first generated token decodes after the prompt (" Paris" after "The
    capital of France is", as transformers' pipeline gives it too), and a newline byte followed by a cut-off character
    (`<0x0A> <0xE2> <0x80>`, then a word), which made tokenizers' DecodeStream raise "Invalid prefix encountered" and
    failed the whole batch, leaves an answer that goes on."""
    tokenizer = byte_fallback_tokenizer
    words = detokenizer(tokenizer)
    assert words.stream is not None, "the tokenizers DecodeStream path"
    prompt = tokenizer("The capital of France is")["input_ids"]
    answer = tokenizer(" Paris. Hello", add_special_tokens=False)["input_ids"]
    sequence = Sequence(prompt, Sampling(max_new_tokens=16), Collector())
    for token in answer:
        append_token(sequence, token, {tokenizer.eos_token_id}, 1000, words, lambda *_: None)
    whole = tokenizer.decode(prompt + answer, skip_special_tokens=True)
    assert sequence.text.startswith(" Paris") and sequence.text == whole[len(tokenizer.decode(prompt, skip_special_tokens=True)) :]
    broken = [tokenizer.convert_tokens_to_ids(t) for t in ("\u2581Hello", "<0x0A>", "<0xE2>", "<0x80>", "\u2581Hello")]
    sequence = Sequence(prompt, Sampling(max_new_tokens=16), Collector())
    reasons = [append_token(sequence, token, {tokenizer.eos_token_id}, 1000, words, lambda *_: None) for token in broken]
    # the bytes the failed stream held (the newline, the cut-off character) are dropped, as vLLM drops them
    assert reasons == [None] * 5 and sequence.text.startswith(" Hello") and sequence.text.endswith("Hello"), repr(sequence.text)


def test_a_row_whose_text_fails_ends_with_an_internal_error_and_the_batch_decodes_on(llm, new_batcher):
    """One stream's detokenisation raising ends that stream (a server error, 500 at the gateway), not the batch."""
    batcher = new_batcher(llm)
    healthy = submit(batcher, llm, PROMPTS[0], max_new_tokens=8)
    broken = Collector()
    sequence = Sequence(llm[1](PROMPTS[1], add_special_tokens=False)["input_ids"], Sampling(max_new_tokens=8), broken)
    sequence.decode_stream = lambda token: (_ for _ in ()).throw(RuntimeError("a tokenizer bug"))
    batcher.submit(sequence)
    drain(batcher)
    assert broken.finish.reason == "error" and broken.finish.message.startswith(INTERNAL_ERROR), broken.finish
    assert "a tokenizer bug" in broken.finish.message
    assert healthy.finish.reason == "length" and healthy.text == solo(llm, PROMPTS[0], 8)


# below 1 the penalty favours the prompt's and answer's own tokens: a random model's answer changes for sure
@pytest.mark.parametrize("settings", [{"repetition_penalty": 0.2}, {"repetition_penalty": 0.2, "no_repeat_ngram_size": 3}])
def test_a_checkpoints_step_settings_give_generates_greedy_tokens(llm, new_batcher, settings):
    """A chat checkpoint's generation_config.json repetition_penalty (Qwen2.5-Instruct: 1.05-1.1) applies to streamed
    answers as generate() and transformers' pipeline apply it: one gather / scatter for the batch where it is the only
    setting, transformers' processors per row otherwise."""
    import copy

    model, tokenizer = llm
    model = copy.deepcopy(model)
    for name, value in settings.items():
        setattr(model.generation_config, name, value)
    step = StepSettings.read(model.generation_config, {tokenizer.eos_token_id})
    assert step is not None and step.repetition_penalty == 0.2
    batcher = new_batcher((model, tokenizer), settings=step)
    answers = [submit(batcher, (model, tokenizer), prompt, max_new_tokens=12) for prompt in PROMPTS[:3]]
    drain(batcher)
    assert [a.text for a in answers] == [solo((model, tokenizer), prompt, 12) for prompt in PROMPTS[:3]]
    assert answers[0].text != solo(llm, PROMPTS[0], 12), "the penalty changes this model's answer"


def greedy_with_penalties(llm, prompt: str, new_tokens: int, presence: float, frequency: float) -> list[int]:
    """The reference: the model's greedy tokens, each step's logits less OpenAI's penalties on the tokens so far."""
    import torch

    model, tokenizer = llm
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer: list[int] = []
    with torch.inference_mode():
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids + answer])).logits[0, -1].clone()
            for token in set(answer):
                logits[token] -= presence + frequency * answer.count(token)
            answer.append(int(logits.argmax()))
    return answer


def test_presence_and_frequency_penalties_are_openais(llm, new_batcher):
    """logit -= presence * [count > 0] + frequency * count on the answer's tokens, row by row: a penalised row next to
    a plain one (negative values favour repeats: a random model's answer changes for sure)."""
    batcher = new_batcher(llm)
    penalised = submit(batcher, llm, PROMPTS[0], max_new_tokens=8, presence_penalty=-1.5, frequency_penalty=-0.5)
    plain = submit(batcher, llm, PROMPTS[0], max_new_tokens=8)
    drain(batcher)
    expected = greedy_with_penalties(llm, PROMPTS[0], 8, -1.5, -0.5)
    assert penalised.text == llm[1].decode(expected, skip_special_tokens=True) and plain.text == solo(llm, PROMPTS[0], 8)
    assert penalised.text != plain.text


def test_same_seed_same_text(llm, new_batcher):
    batcher = new_batcher(llm)
    runs = [submit(batcher, llm, PROMPTS[1], max_new_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=s) for s in (7, 7, 8)]
    drain(batcher)
    assert runs[0].text == runs[1].text and runs[0].text != runs[2].text


def test_cancelled_sequence_leaves_within_one_step_and_frees_its_place(llm, new_batcher):
    batcher = new_batcher(llm, max_sequences=1)
    gone = {"flag": False}
    collector = Collector()
    ids = llm[1](PROMPTS[2], add_special_tokens=False)["input_ids"]
    batcher.submit(Sequence(ids, Sampling(max_new_tokens=200), collector, cancelled=lambda: gone["flag"]))
    waiting = submit(batcher, llm, PROMPTS[1], max_new_tokens=4)
    batcher.step()
    assert len(batcher.running) == 1 and len(batcher.waiting) == 1
    gone["flag"] = True
    batcher.step()
    assert collector.finish.reason == "cancelled" and collector.finish.completion_tokens <= 2
    assert not batcher.waiting, "its place went to the waiting request in the same step"
    drain(batcher)
    assert waiting.text == solo(llm, PROMPTS[1], 4)


def test_a_cancelled_row_among_running_ones_leaves_and_the_rest_decode_on(llm, new_batcher):
    """Regression: the slots' move of the last row into a cancelled one's slot ran outside inference mode, on
    inference tensors (RuntimeError: every running stream failed)."""
    batcher = new_batcher(llm)
    gone = {"flag": False}
    ids = llm[1](PROMPTS[2], add_special_tokens=False)["input_ids"]
    batcher.submit(Sequence(ids, Sampling(max_new_tokens=40), Collector(), cancelled=lambda: gone["flag"]))
    others = [submit(batcher, llm, prompt, max_new_tokens=12) for prompt in PROMPTS[:2]]
    batcher.step()
    gone["flag"] = True
    drain(batcher)
    assert [collector.text for collector in others] == [solo(llm, prompt, 12) for prompt in PROMPTS[:2]]


def test_full_queue_is_refused_at_once(llm, new_batcher):
    batcher = new_batcher(llm, max_sequences=1, max_queue=2)
    for _ in range(2):
        submit(batcher, llm, PROMPTS[1], max_new_tokens=2)
    with pytest.raises(Busy, match="generation.max_queue = 2"):
        submit(batcher, llm, PROMPTS[1], max_new_tokens=2)
    drain(batcher)


def test_context_limit_ends_with_length(llm, new_batcher):
    batcher = new_batcher(llm, context=12)
    collector = submit(batcher, llm, PROMPTS[0], max_new_tokens=100)
    drain(batcher)
    assert collector.finish.reason == "length" and collector.finish.prompt_tokens + collector.finish.completion_tokens == 12


def test_time_limit_ends_a_sequence_and_spares_the_others(llm, new_batcher):
    import time

    batcher = new_batcher(llm)
    slow = submit(batcher, llm, PROMPTS[2], max_new_tokens=100, time_limit_s=0.05)
    other = submit(batcher, llm, PROMPTS[1], max_new_tokens=6)
    batcher.step()
    time.sleep(0.1)
    drain(batcher)
    assert slow.finish.reason == "time" and slow.finish.completion_tokens < 100
    assert other.text == solo(llm, PROMPTS[1], 6)


def test_long_prompt_prefilled_in_chunks_equals_its_solo_greedy_text(llm, new_batcher):
    """max_prefill_tokens 16: a 110-token prompt goes in as 7 chunks, its KV cache growing per chunk."""
    batcher = new_batcher(llm, max_prefill_tokens=16)
    prompt_tokens = len(llm[1](LONG_PROMPT, add_special_tokens=False)["input_ids"])
    collector = submit(batcher, llm, LONG_PROMPT, max_new_tokens=12)
    chunks = 0
    while not collector.pieces:
        batcher.step()
        chunks += 1
        assert batcher.partial is None or batcher.partial.past[0][0].shape[2] == batcher.partial.prefilled == 16 * chunks
    assert chunks == -(-prompt_tokens // 16) > 1
    drain(batcher)
    assert collector.text == solo(llm, LONG_PROMPT, 12) and collector.finish.prompt_tokens == prompt_tokens


def test_running_sequences_decode_while_a_long_prompt_is_prefilled_and_short_ones_go_ahead(llm, new_batcher):
    batcher = new_batcher(llm, max_prefill_tokens=16)
    running = submit(batcher, llm, PROMPTS[1], max_new_tokens=30)
    batcher.step()
    long = submit(batcher, llm, LONG_PROMPT, max_new_tokens=8)
    short = submit(batcher, llm, PROMPTS[0], max_new_tokens=8)  # 7 tokens: fits beside the long prompt's half of the budget
    batcher.step()
    assert batcher.partial is not None and short in [s.emit for s in batcher.running], "the short prompt went ahead"
    while batcher.partial is not None:
        before = len(running.pieces)
        batcher.step()
        assert len(running.pieces) == before + 1, "every prefill chunk comes with a decoding step"
    drain(batcher)
    assert running.text == solo(llm, PROMPTS[1], 30) and long.text == solo(llm, LONG_PROMPT, 8) and short.text == solo(llm, PROMPTS[0], 8)


def test_a_cancelled_long_prefill_frees_its_place_and_cache(llm, new_batcher):
    batcher = new_batcher(llm, max_prefill_tokens=16, max_sequences=1)
    gone = {"flag": False}
    collector = Collector()
    ids = llm[1](LONG_PROMPT, add_special_tokens=False)["input_ids"]
    sequence = Sequence(ids, Sampling(max_new_tokens=4), collector, cancelled=lambda: gone["flag"])
    batcher.submit(sequence)
    waiting = submit(batcher, llm, PROMPTS[1], max_new_tokens=4)
    batcher.step()
    assert batcher.partial is sequence and len(batcher.waiting) == 1, "the long prompt holds the only place"
    gone["flag"] = True
    batcher.step()
    assert collector.finish.reason == "cancelled" and sequence.past is None and batcher.partial is None
    drain(batcher)
    assert waiting.text == solo(llm, PROMPTS[1], 4)


def test_served_batcher_is_the_preallocated_one_where_it_reproduces_the_dynamic_cache(llm):
    from hf2triton.serving.batching.slots import new_batcher as served_batcher

    lines: list[str] = []
    limits = {"max_sequences": 4, "max_queue": 4, "context": 256}
    assert type(served_batcher(*llm, "cpu", cuda_graphs=True, log=lines.append, **limits)) is ContinuousBatcher, "the CPU default"
    batcher = served_batcher(*llm, "cpu", cuda_graphs=True, log=lines.append, slots=True, **limits)
    assert type(batcher) is SlotBatcher and not batcher.use_graphs and "preallocated KV cache (4 slots x 256 tokens)" in lines[-1]


class EagerCaptures(SlotBatcher):
    """capture_buckets on the CPU: each "capture" runs the bucket's pass eagerly and is recorded."""

    def _captures(self) -> bool:
        return True

    def _capture(self, rows: int, columns: int) -> bool:
        self.captured.append((rows, columns))
        self._pass(rows, columns)
        return True


def test_buckets_captured_at_load_leave_the_slots_serving_the_solo_greedy_text(llm):
    """Issue 46: every row bucket up to max_sequences (the largest first) x the first column buckets within the
    context is captured before anything is served, and the passes leave nothing behind: the texts decoded after
    them equal their solo greedy text."""
    batcher = EagerCaptures(*llm, "cpu", max_sequences=5, max_queue=8, context=200)
    batcher.captured = []
    lines: list[str] = []
    batcher.capture_buckets(lines.append)
    assert batcher.captured == [(5, 200), (5, 128), (4, 200), (4, 128), (2, 200), (2, 128), (1, 200), (1, 128)]
    assert "captured 8 decoding steps (rows 1-5 x columns 128-200)" in lines[-1], lines
    assert batcher.idle and batcher.lengths == [] and not batcher.positions.any()
    lengths = [9, 4, 12]
    collectors = [submit(batcher, llm, p, max_new_tokens=n) for p, n in zip(PROMPTS, lengths)]
    drain(batcher)
    for prompt, n, collector in zip(PROMPTS, lengths, collectors):
        assert collector.text == solo(llm, prompt, n), prompt


def test_slots_refill_from_the_last_row_and_padded_rows_stay_in_free_slots(llm, new_batcher):
    """Six sequences of different lengths through three slots: rows leave from the middle (the last row moves into
    the hole), the bucket pads 3 rows to 4, and every text equals its solo greedy text."""
    batcher = new_batcher(llm, max_sequences=3, context=256)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(6)]
    lengths = [5, 14, 9, 3, 11, 7]
    collectors = [submit(batcher, llm, p, max_new_tokens=n) for p, n in zip(prompts, lengths)]
    drain(batcher)
    for prompt, n, collector in zip(prompts, lengths, collectors):
        assert collector.text == solo(llm, prompt, n), (prompt, n)


def test_responder_sends_pieces_that_queue_during_a_send_as_one_and_notices_gone_clients(llm):
    import threading
    import time

    from hf2triton.serving.batching.responder import Responder

    sends: list[str] = []
    release, sending = threading.Event(), threading.Event()

    def slow_emit(text, finish):
        sending.set()
        release.wait(5)
        sends.append(text if finish is None else f"{text}|{finish.reason}")

    gone = {"flag": False}
    responder = Responder(log=print)
    batcher = ContinuousBatcher(*llm, "cpu", max_sequences=2, max_queue=2, context=256, responder=responder)
    ids = llm[1](PROMPTS[2], add_special_tokens=False)["input_ids"]
    sequence = Sequence(ids, Sampling(max_new_tokens=200), slow_emit, cancelled=lambda: gone["flag"])
    batcher.submit(sequence)
    while not sending.is_set() and sequence.finish is None:  # until the first piece is being sent (and blocked) ...
        batcher.step()
        sending.wait(0.5)  # the responder thread picks it up (a busy machine may take a moment)
    for _ in range(5):
        batcher.step()  # ... the next pieces wait and go together
    release.set()
    deadline = time.monotonic() + 5
    while len(sends) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sends) == 2 and "".join(sends) == sequence.text, f"pieces queued during a send go as one: {sends}"
    gone["flag"] = True
    while not sequence.gone and time.monotonic() < deadline:
        time.sleep(0.01)
    batcher.step()
    assert sequence.gone and batcher.idle
    responder.stop()
    assert sends[-1].endswith("|cancelled")


def reference_logprobs(llm, ids: list[int]):
    """log_softmax of the model's own logits over `ids` in one plain forward ([tokens, vocabulary])."""
    import torch

    with torch.inference_mode():
        return llm[0](torch.tensor([ids])).logits[0].float().log_softmax(-1)


def test_logprobs_of_chosen_and_prompt_tokens_are_the_models_own_in_a_mixed_batch(llm, new_batcher):
    """Issue 44 #1/#2: rows that ask get the raw distribution's log-softmax (generated tokens with their top
    alternatives; an echo the prompt's, the first null; a long prompt through chunks too); rows that do not ask get
    none and the same text; max_new_tokens 0 generates nothing."""
    batcher = new_batcher(llm, max_prefill_tokens=64)  # LONG_PROMPT (110 tokens) is prefilled in chunks
    tokenizer = llm[1]
    plain = submit(batcher, llm, PROMPTS[0], max_new_tokens=6)
    asked = Sequence(tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"], Sampling(max_new_tokens=6, logprobs=3), Collector())
    long_ids = tokenizer(LONG_PROMPT, add_special_tokens=False)["input_ids"]
    echo = Sequence(long_ids, Sampling(max_new_tokens=0, logprobs=1, prompt_logprobs=True), Collector())
    short_echo = Sequence(asked.prompt_ids, Sampling(max_new_tokens=2, prompt_logprobs=True), Collector())
    for sequence in (asked, echo, short_echo):
        batcher.submit(sequence)
    drain(batcher)
    assert plain.text == asked.emit.text and plain.finish.completion_tokens == 6, "asking changes nothing else"
    reference = reference_logprobs(llm, asked.prompt_ids + asked.generated)
    assert len(asked.logprobs) == 6 and asked.prompt_logprobs is None
    for step, item in enumerate(asked.logprobs):
        row = reference[len(asked.prompt_ids) - 1 + step]
        assert item.id == asked.generated[step] and abs(item.logprob - float(row[item.id])) < 1e-4
        assert [i for i, _ in item.top] == row.topk(3).indices.tolist() and item.top[0][0] == item.id  # greedy: its own token first
    assert echo.generated == [] and echo.emit.finish.reason == "length" and echo.emit.finish.completion_tokens == 0
    assert len(echo.prompt_logprobs) == len(long_ids) and echo.prompt_logprobs[0].logprob is None
    reference = reference_logprobs(llm, long_ids)
    for position, item in enumerate(echo.prompt_logprobs[1:], start=1):
        assert item.id == long_ids[position] and abs(item.logprob - float(reference[position - 1, item.id])) < 1e-4
        assert [i for i, _ in item.top] == [int(reference[position - 1].argmax())]
    assert [item.id for item in short_echo.prompt_logprobs] == asked.prompt_ids and short_echo.logprobs == []
    assert all(item.top == () for item in short_echo.prompt_logprobs), "no alternatives asked"


def test_samples_of_one_prompt_share_its_prefill(llm, new_batcher):
    """Issue 44 #3: an OpenAI request's `n` samples arrive as n sequences of one prompt; joining together, the prompt
    is prefilled once (one row for it in the prefill pass) and each sample draws as it would alone (its own seed)."""
    sampled = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.95}
    alone = []
    for seed in (1, 2, 3):
        batcher = new_batcher(llm)
        alone.append(submit(batcher, llm, PROMPTS[2], seed=seed, **sampled))
        drain(batcher)
    batcher = new_batcher(llm)
    rows = []
    forward = batcher._forward

    def counted(input_ids, *args, **kwargs):
        rows.append(tuple(input_ids.shape))
        return forward(input_ids, *args, **kwargs)

    batcher._forward = counted
    together = [submit(batcher, llm, PROMPTS[2], seed=seed, **sampled) for seed in (1, 2, 3)]
    other = submit(batcher, llm, PROMPTS[0], max_new_tokens=8)
    echo = Sequence(
        llm[1](PROMPTS[2], add_special_tokens=False)["input_ids"], Sampling(max_new_tokens=1, prompt_logprobs=True), Collector()
    )
    batcher.submit(echo)
    drain(batcher)
    prompt_tokens = len(llm[1](PROMPTS[2], add_special_tokens=False)["input_ids"])
    assert rows[0] == (2, prompt_tokens), "the prefill pass: one row per distinct prompt, not five"
    assert [c.text for c in together] == [c.text for c in alone] and len({c.text for c in together}) > 1
    assert other.text == solo(llm, PROMPTS[0], 8)
    reference = reference_logprobs(llm, echo.prompt_ids)
    assert [item.id for item in echo.prompt_logprobs] == echo.prompt_ids, "a shared row's prompt log-probabilities too"
    assert all(abs(item.logprob - float(reference[i - 1, item.id])) < 1e-4 for i, item in enumerate(echo.prompt_logprobs) if i)


def test_the_first_response_carries_the_first_piece_alone():
    """Pieces the engine made before a response thread took the stream (2 loaded cores: all 24 of a tiny model's
    tokens, and CI's validation saw one response) go out as the first piece, then the rest with the finish: a stream
    of more than one piece is never one response, and the first response is the first token's."""
    import json
    import threading

    from hf2triton.serving.batching.responder import Responder
    from hf2triton.serving.batching.sequences import Finish, TokenLogprob, add_pending, after_send, take_pending

    sends: list[tuple[str, str | None]] = []
    done = threading.Event()

    def emit(text, finish):
        sends.append((text, finish and finish.reason))
        if finish is not None:
            done.set()

    responder = Responder(log=print, threads=2)
    sequence = Sequence([1], Sampling(max_new_tokens=3), emit)
    responder.watch(sequence)
    responder.post_many([(sequence, "a"), (sequence, " b"), (sequence, " c")], Finish("length", 1, 3))  # one lock
    assert done.wait(5)
    responder.stop()
    assert sends == [("a", None), (" b c", "length")]
    single = Sequence([1], Sampling(max_new_tokens=1), lambda text, finish: None)
    add_pending(single, "a", Finish("length", 1, 1))
    assert take_pending(single) == ("a", Finish("length", 1, 1)), "a one-piece answer stays one response"
    # each response's log-probabilities are its text's tokens': the first piece's 1, then the rest's 2
    asked = Sequence([1], Sampling(max_new_tokens=3, logprobs=0), lambda text, finish: None)
    for token, text in enumerate(("a", " b", " c")):
        asked.logprobs.append(TokenLogprob(token, -1.0))
        add_pending(asked, text, None)
    taken = []
    for _ in range(2):
        text, _finish = take_pending(asked)
        taken.append((text, [item["id"] for item in json.loads(asked.take_logprobs(str))["tokens"]]))
        after_send(asked, False)
    assert taken == [("a", [0]), (" b c", [1, 2])]


def test_several_response_threads_keep_each_stream_in_order():
    """Issue 46 #1: with 4 response threads, different streams are sent at once, each stream by one thread at a
    time: every stream's responses arrive in order, its final one last, and pieces posted meanwhile coalesce."""
    import random
    import threading
    import time

    from hf2triton.serving.batching.responder import Responder
    from hf2triton.serving.batching.sequences import Finish

    received: dict[int, list[str]] = {index: [] for index in range(16)}
    finals: dict[int, str] = {}
    active, most = [0], [0]
    lock = threading.Lock()

    def emitter(index: int):
        def emit(text, finish):
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            time.sleep(random.uniform(0, 0.002))  # noqa: S311 - a send's jitter
            with lock:
                active[0] -= 1
                assert index not in finals, "nothing after the final response"
                received[index].append(text)
                if finish is not None:
                    finals[index] = finish.reason

        return emit

    responder = Responder(log=print, threads=4)
    sequences = [Sequence([1], Sampling(max_new_tokens=50), emitter(index)) for index in range(16)]
    for sequence in sequences:
        responder.watch(sequence)
    for step in range(50):  # a step's pieces one by one, or all at once as the batcher posts them (post_many)
        if step % 2:
            responder.post_many([(sequence, f"{step},") for sequence in sequences])
            continue
        for sequence in sequences:
            responder.post(sequence, f"{step},")
    for sequence in sequences:
        responder.post(sequence, "", Finish("length", 1, 50))
    deadline = time.monotonic() + 10
    while len(finals) < 16 and time.monotonic() < deadline:
        time.sleep(0.01)
    responder.stop()
    expected = "".join(f"{step}," for step in range(50))
    assert all("".join(received[index]) == expected for index in range(16)), "each stream whole and in order"
    assert set(finals.values()) == {"length"} and most[0] > 1, "streams were sent on several threads at once"
    assert sum(len(pieces) for pieces in received.values()) < 16 * 51, "pieces posted during a send went out together"


def test_the_poll_never_asks_about_a_stream_being_sent_or_finished():
    """Triton answers is_cancelled through the request's response factory, which python_backend deletes with the final
    response: asking then (or during a send, which may be the final one) made tritonserver read freed memory and die
    (tests/test_response_threads.py). The poll holds a stream as a send does: never at once with its send, never after
    its final one; pieces posted while it asks still go out, in order."""
    import threading
    import time

    from hf2triton.serving.batching.responder import Responder
    from hf2triton.serving.batching.sequences import Finish

    streams, violations, lock = 200, [], threading.Lock()
    state: dict[int, str] = {}  # index -> "sending" | "done" (absent: idle)
    received: dict[int, list[str]] = {index: [] for index in range(streams)}

    def make(index: int):
        def emit(text, finish):
            with lock:
                state[index] = "sending"
            time.sleep(0.0002)
            with lock:
                received[index].append(text)
                state[index] = "done" if finish is not None else "idle"

        def cancelled():
            with lock:
                if state.get(index) in ("sending", "done"):
                    violations.append((index, state[index]))
            time.sleep(0.0002)  # the IPC round trip: a send or a final may be posted meanwhile
            return False

        return Sequence([1], Sampling(max_new_tokens=4), emit, cancelled)

    responder = Responder(log=print, threads=4)
    responder.POLL_S = 0.0  # poll as often as it can
    sequences = [make(index) for index in range(streams)]
    for sequence in sequences:
        responder.watch(sequence)
    for step in range(4):
        for sequence in sequences:
            responder.post(sequence, f"{step},")
        time.sleep(0.001)
    for sequence in sequences:
        responder.post(sequence, "", Finish("length", 1, 4))
    deadline = time.monotonic() + 20
    while any(state.get(index) != "done" for index in range(streams)) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # polls after the finals
    responder.stop()
    assert not violations, violations[:5]
    assert all("".join(received[index]) == "0,1,2,3," for index in range(streams))
