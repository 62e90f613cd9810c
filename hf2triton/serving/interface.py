"""The serving interface, defined once: the tensors each task exchanges with clients and the `parameters`
that config.pbtxt hands to model.py (with their defaults).

Used by render (config.pbtxt), model.py (which reads its parameters and inputs with it), validation, the
load generators, soak and every client. Standard library only: it is copied next to model.py into each
rendered model (`<repository>/<name>/1/interface.py`), so a rendered repository runs on its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

# Tensor names.
TEXT = "text"
MAX_NEW_TOKENS = "max_new_tokens"
TEMPERATURE = "temperature"
EMBEDDING = "embedding"
LABEL = "label"
SCORE = "score"
TEXT_OUTPUT = "text_output"
# Streaming generation (decoupled models): more request options and the final response's fields.
TOP_P = "top_p"
TOP_K = "top_k"
# OpenAI's penalties on the answer's own tokens (streaming generation): logit -= presence * [count > 0] + frequency *
# count, as vLLM applies them (FP32, PENALTY_RANGE; 0: none)
PRESENCE_PENALTY = "presence_penalty"
FREQUENCY_PENALTY = "frequency_penalty"
# IGNORE_EOS (BOOL, vLLM's extra): the answer goes on past the model's end token, to max_new_tokens or a stop string
# (what benchmarks ask for, to measure a fixed answer length)
IGNORE_EOS = "ignore_eos"
# OPEN_ENDED (BOOL, streaming text-generation): a request without max_new_tokens may answer with what the context leaves,
# up to max_new_tokens_limit, instead of generation.max_new_tokens -- OpenAI's unset max_tokens, as vLLM serves it
# (LangChain and most SDKs send none); a seq2seq model keeps its checkpoint's answer length
OPEN_ENDED = "open_ended"
SEED = "seed"
STOP = "stop"
STREAM = "stream"
MESSAGES = "messages"  # chat form: a JSON list of {"role", "content"}, instead of text
# "tool": a tool's result ({"role": "tool", "tool_call_id", "content"}); an assistant message may carry "tool_calls"
# ([{"id", "type": "function", "function": {"name", "arguments"}}], arguments a JSON object or its JSON text)
CHAT_ROLES = ("system", "user", "assistant", "tool")
# Tool calling: TOOLS (BYTES [1], with MESSAGES) a JSON list of OpenAI tool objects ({"type": "function", "function":
# {"name", "description", "parameters"}}) handed to the chat template (`apply_chat_template(..., tools=...)`); the
# model's template must render them. Tool calls are parsed from the text by the gateway, with the model's
# generation.tool_parser (TOOL_PARSERS; "none": tools are refused).
TOOLS = "tools"
TOOL_PARSERS = ("none", "hermes", "llama3_json")
DEFAULT_TOOL_PARSER = "none"
FINISH_REASON = "finish_reason"
# A request parameter (not a tensor) of a streamed request read over Triton's HTTP event stream (the gateway's --http):
# Triton's HTTP front end sees a closed connection only when it writes to it, so a request still waiting for a place
# would outlive its client there; with KEEPALIVE true it gets an empty piece (TEXT_OUTPUT "") every KEEPALIVE_S until
# its first real one, and the write to a closed connection cancels it as gRPC's closed stream does at once.
KEEPALIVE = "hf2triton_keepalive"
# The start of an error that is the server's fault, not the request's (an engine that raised, a model being unloaded):
# Triton's INTERNAL code where the backend has codes, and these words, which the gateway answers as 500 (an error
# event of Triton's HTTP stream carries no code). A request's own mistakes are INVALID_ARG (400).
INTERNAL_ERROR = "internal error: "
KEEPALIVE_S = 0.5
PROMPT_TOKENS = "prompt_tokens"
COMPLETION_TOKENS = "completion_tokens"
# Log-probabilities (streaming generation, torch batchers): LOGPROBS (INT32) the alternatives per token to report, 0..
# MAX_LOGPROBS (absent or NO_LOGPROBS: none, nothing computed); PROMPT_LOGPROBS (BOOL) the prompt's tokens' too (an
# echo), max_new_tokens then may be 0; PROMPT_IDS (INT64 [-1]) the prompt as token ids, taken as they are (no template).
# Each response then carries TOKEN_LOGPROBS: JSON {"tokens": [entry, ...]} for the tokens chosen since the previous
# one, the first also {"prompt": [entry, ...], "prompt_text"}; entry = {"id", "token", "logprob", "top": [{"id",
# "token", "logprob"}, ...]}, the log-softmax of the model's raw logits (before temperature / top_p); the prompt's
# first token has logprob null (nothing precedes it).
LOGPROBS = "logprobs"
NO_LOGPROBS = -1
MAX_LOGPROBS = 20
PROMPT_LOGPROBS = "prompt_logprobs"
PROMPT_IDS = "prompt_ids"
# RAW_PROMPT (BOOL, with TEXT): the text is the prompt as it is -- no chat template, the tokenizer's special tokens (a
# BOS) added as it adds them: vLLM's and OpenAI's /v1/completions prompt (the gateway sends it with every string prompt
# there). Without it a TEXT prompt takes the chat template as generation.chat_template says.
RAW_PROMPT = "raw_prompt"
TOKEN_LOGPROBS = "token_logprobs"  # noqa: S105 - a tensor name
# Constrained decoding (structured output; streaming generation): GUIDED (BYTES [1]) a JSON object {"kind": K, "value":
# V}: json_schema -> V a JSON schema (object); json_object -> V null (any JSON object); regex -> V a regex string;
# choice -> V a list of strings (the answer is exactly one); grammar -> V an EBNF grammar in xgrammar's dialect
# (GBNF-like, `root ::= ...`). Every generated token is one the grammar allows (xgrammar's token bitmask); the answer
# ends (finish "stop") once the grammar is complete and the model takes its end token, else "length" as usual.
GUIDED = "guided"
GUIDED_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
# token-classification: per text, the entities as the JSON `transformers.pipeline("token-classification")` returns
ENTITIES = "entities"
AGGREGATION_STRATEGY = "aggregation_strategy"
AGGREGATION_STRATEGIES = ("none", "simple", "first", "average", "max")  # the pipeline's AggregationStrategy values
DEFAULT_AGGREGATION_STRATEGY = "simple"
# tokens shared by consecutive windows of a text longer than the context (the pipeline's `stride`); NO_STRIDE: truncate
STRIDE = "stride"
NO_STRIDE = -1
# fill-mask: per text, the candidates as the JSON `transformers.pipeline("fill-mask")` returns; option top_k (INT32)
CANDIDATES = "candidates"
FILL_MASK_TOP_K_RANGE = (1, 50)
DEFAULT_FILL_MASK_TOP_K = 5  # the pipeline's
# text-ranking (cross-encoder rerankers): input query (BYTES, the same value on every row of a request) and the texts
# as the documents; per document its relevance score (FP32: sigmoid of the one logit, as sentence-transformers'
# CrossEncoder) and the tokens its (query, document) pair became (PROMPT_TOKENS)
QUERY = "query"
# feature-extraction: which of the model's prompts (config_sentence_transformers.json) starts every text of a request
PROMPT_NAME = "prompt_name"
# image tasks: IMAGE (BYTES) the encoded image (PNG, JPEG, ...) per row instead of text; per image LABELS, the JSON list
# of {label, score} transformers' pipeline answers (best first). image-classification: option TOP_K (IMAGE_TOP_K_RANGE,
# default the pipeline's 5) and FUNCTION_TO_APPLY (the pipeline's: default by the model's labels, sigmoid, softmax,
# none); zero-shot-image-classification: CANDIDATE_LABELS (a JSON list of strings, needed) and HYPOTHESIS_TEMPLATE
IMAGE = "image"
LABELS = "labels"
FUNCTION_TO_APPLY = "function_to_apply"
FUNCTIONS_TO_APPLY = ("default", "sigmoid", "softmax", "none")
IMAGE_TOP_K_RANGE = (1, 1000)
DEFAULT_IMAGE_TOP_K = 5  # the pipeline's
CANDIDATE_LABELS = "candidate_labels"
HYPOTHESIS_TEMPLATE = "hypothesis_template"
DEFAULT_HYPOTHESIS_TEMPLATE = "This is a photo of {}."  # the pipeline's
MAX_CANDIDATE_LABELS = 256
# zero-shot-image-classification models embed too: a request with EMBED true gets per image its EMBEDDING (the model's
# image features, L2-normalised: what its logits compare), and one with TEXT rows instead of IMAGE per text its text
# features (normalised; PROMPT_TOKENS: its tokens), the vectors CLIP / SigLIP score against each other
EMBED = "embed"
# automatic-speech-recognition (Whisper): AUDIO (BYTES) per row one audio file (WAV, FLAC, OGG, MP3: decoded on the
# server with soundfile, its duration bounded by max_audio_seconds before decoding), or with SAMPLING_RATE (INT32) its
# raw float32 little-endian mono samples at that rate; resampled to the model's rate. Options LANGUAGE (BYTES: a code
# or name, "en" / "english"; absent: the model detects it), SPEECH_TASK (BYTES: transcribe | translate) and
# RETURN_TIMESTAMPS (BOOL: segments), WORD_TIMESTAMPS (BOOL: words, from the cross-attention's alignment heads) and
# SPEECH_PROMPT (BYTES: text the decoder continues from, Whisper's prompt / OpenAI's `prompt`), TEMPERATURE (FP32, 0..1:
# > 0 samples with one beam, as OpenAI's and vLLM's transcriptions). Per row TEXT_OUTPUT
# (the pipeline's text), CHUNKS (JSON list of {timestamp: [start, end], text}; [] unless timestamps were asked), WORDS
# (the same for words; [] unless word timestamps were asked), DURATION (FP32, the audio's seconds) and SPOKEN_LANGUAGE
# (BYTES: the language code the answer was decoded in -- the one asked, else the one Whisper detected; "" where unknown).
AUDIO = "audio"
SAMPLING_RATE = "sampling_rate"
LANGUAGE = "language"
SPEECH_TASK = "task"
RETURN_TIMESTAMPS = "return_timestamps"
WORD_TIMESTAMPS = "word_timestamps"
SPEECH_PROMPT = "prompt"
CHUNKS = "chunks"
WORDS = "words"
DURATION = "duration"
SPOKEN_LANGUAGE = "spoken_language"
SPEECH_TASKS = ("transcribe", "translate")
# the options of a speech request, in inputs.speech_options' order
SPEECH_OPTION_NAMES = (LANGUAGE, SPEECH_TASK, RETURN_TIMESTAMPS, WORD_TIMESTAMPS, SPEECH_PROMPT, TEMPERATURE)
SPEECH_TEMPERATURE_RANGE = (0.0, 1.0)  # OpenAI's for transcriptions; > 0 samples (one beam), 0 is the pipeline's decoding
SAMPLING_RATE_RANGE = (1000, 384_000)

FEATURE_EXTRACTION = "feature-extraction"
CLASSIFICATION = "text-classification"
GENERATION = "text-generation"
TOKEN_CLASSIFICATION = "token-classification"  # noqa: S105 - a task name
FILL_MASK = "fill-mask"
TEXT_RANKING = "text-ranking"
TEXT2TEXT = "text2text-generation"  # encoder-decoder models (T5, BART, Marian)
IMAGE_CLASSIFICATION = "image-classification"
ZERO_SHOT_IMAGE_CLASSIFICATION = "zero-shot-image-classification"  # CLIP, SigLIP
SPEECH_RECOGNITION = "automatic-speech-recognition"  # Whisper
TASKS = (
    FEATURE_EXTRACTION,
    CLASSIFICATION,
    GENERATION,
    TOKEN_CLASSIFICATION,
    FILL_MASK,
    TEXT_RANKING,
    TEXT2TEXT,
    IMAGE_CLASSIFICATION,
    ZERO_SHOT_IMAGE_CLASSIFICATION,
    SPEECH_RECOGNITION,
)
# the tasks whose rows are images (IMAGE), not texts
IMAGE_TASKS = (IMAGE_CLASSIFICATION, ZERO_SHOT_IMAGE_CLASSIFICATION)
# the tasks whose rows are no texts (images, audio): tune, bench and soak, whose loads are texts, leave them out
NON_TEXT_TASKS = (*IMAGE_TASKS, SPEECH_RECOGNITION)
# the tasks that generate text: the same options, streaming and OpenAI endpoints
GENERATIVE_TASKS = (GENERATION, TEXT2TEXT)
# transformers' pipeline names for what a text2text model does: accepted in a config, served as TEXT2TEXT
# (T5's task_specific_params name these: the pipeline of that name adds their prefix and settings; pipeline_task)
TASK_ALIASES = {name: TEXT2TEXT for name in ("summarization", "translation", *(f"translation_en_to_{t}" for t in ("de", "fr", "ro")))}

# Written into an ONNX export by ONNX Runtime GenAI's model builder: its decoder graphs take right-padded
# prompts and derive positions from the mask (runtimes/onnxruntime.py's decoder looks for it).
GENAI_CONFIG = "genai_config.json"

# transformers Auto* class per task (pretrained, export and the serving engines load with the same one)
AUTO_CLASSES = {
    FEATURE_EXTRACTION: "AutoModel",
    CLASSIFICATION: "AutoModelForSequenceClassification",
    GENERATION: "AutoModelForCausalLM",
    TOKEN_CLASSIFICATION: "AutoModelForTokenClassification",
    FILL_MASK: "AutoModelForMaskedLM",
    TEXT_RANKING: "AutoModelForSequenceClassification",  # one label: the relevance logit
    TEXT2TEXT: "AutoModelForSeq2SeqLM",
    IMAGE_CLASSIFICATION: "AutoModelForImageClassification",
    ZERO_SHOT_IMAGE_CLASSIFICATION: "AutoModelForZeroShotImageClassification",
    SPEECH_RECOGNITION: "AutoModelForSpeechSeq2Seq",
}
CTC_AUTO_CLASS = "AutoModelForCTC"  # speech recognition by a CTC head (wav2vec2, HuBERT): architectures *ForCTC


def auto_class(task: str, model_dir: str = "") -> str:
    """The transformers Auto* class a task's model loads with; a speech model's by its config (CTC or seq2seq)."""
    if task == SPEECH_RECOGNITION and model_dir:
        import json

        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as file:
            if any(str(name).endswith("ForCTC") for name in json.load(file).get("architectures") or []):
                return CTC_AUTO_CLASS
    return AUTO_CLASSES[task]


# Limits every request option must respect (the config schema's bounds are the same).
MAX_NEW_TOKENS_RANGE = (1, 8192)
TOP_P_RANGE = (1e-6, 1.0)
PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's
TOP_K_RANGE = (0, 100_000)
MAX_STOPS = 64  # stop strings per request (vLLM sets no limit; lm-eval's code tasks send 5-6)
SEED_RANGE = (0, 2**63 - 1)
TEMPERATURE_RANGE = (0.0, 100.0)
# Sampling divides the logits by the temperature: a tiny one (1e-45, a float32 denormal) makes them inf and
# the sampling probabilities NaN. Allowed: 0 (greedy) or MIN_TEMPERATURE..100; even float16 logits of 100
# stay finite at 0.01 (100 / 0.01 = 1e4 < 65504), and 0.01 is already as good as greedy.
MIN_TEMPERATURE = 0.01
TEMPERATURES_ALLOWED = f"0 (greedy) or a finite number between {MIN_TEMPERATURE} and {TEMPERATURE_RANGE[1]:g}"


def temperature_problem(value: float) -> str | None:
    """Why `value` is no allowed temperature (None when it is): 0 (greedy) or MIN_TEMPERATURE..100."""
    # FP32 requests: float32(0.01) is 0.0099999998, so the minimum allows float32 rounding (NaN: never allowed)
    if value == TEMPERATURE_RANGE[0] or MIN_TEMPERATURE * (1 - 1e-6) <= value <= TEMPERATURE_RANGE[1]:
        return None
    return f"temperature={value} is not allowed: use {TEMPERATURES_ALLOWED}"


@dataclass(frozen=True)
class Tensor:
    """One tensor of the interface. `datatype` is Triton's wire name (BYTES, FP32, INT32); every tensor has
    one row per text, so clients send shape [texts, *dims]."""

    name: str
    datatype: str
    dims: tuple[int, ...] = (1,)
    optional: bool = False


TEXT_TENSOR = Tensor(TEXT, "BYTES")
GENERATION_OPTIONS = (Tensor(MAX_NEW_TOKENS, "INT32", optional=True), Tensor(TEMPERATURE, "FP32", optional=True))
TOKEN_CLASSIFICATION_OPTIONS = (  # one of AGGREGATION_STRATEGIES; a stride (else the model's token_classification.stride)
    Tensor(AGGREGATION_STRATEGY, "BYTES", optional=True),
    Tensor(STRIDE, "INT32", optional=True),
)
FILL_MASK_OPTIONS = (Tensor(TOP_K, "INT32", optional=True),)  # candidates per text, FILL_MASK_TOP_K_RANGE
# the query the texts (documents) are ranked against: needed, but declared optional as every option, so a request
# without it gets model.py's error naming it (inputs.text_ranking_options), not Triton's generic one
# written into config.json by sentence-transformers' CrossEncoder before v4 (since: `sentence_transformers.activation_fn`)
CROSS_ENCODER_KEY = "sbert_ce_default_activation_function"
TEXT_RANKING_OPTIONS = (Tensor(QUERY, "BYTES", optional=True),)
EMBEDDING_OPTIONS = (Tensor(PROMPT_NAME, "BYTES", optional=True),)  # absent: the model's default_prompt_name, else none
IMAGE_TENSOR = Tensor(IMAGE, "BYTES")
IMAGE_CLASSIFICATION_OPTIONS = (Tensor(TOP_K, "INT32", optional=True), Tensor(FUNCTION_TO_APPLY, "BYTES", optional=True))
# candidate_labels: needed to classify, declared optional as the query is (model.py's error names it)
ZERO_SHOT_IMAGE_OPTIONS = (Tensor(CANDIDATE_LABELS, "BYTES", optional=True), Tensor(HYPOTHESIS_TEMPLATE, "BYTES", optional=True))
# its embedding requests: images with EMBED true, or texts (TEXT instead of IMAGE: so IMAGE is optional there too)
ZERO_SHOT_EMBEDDING_INPUTS = (Tensor(TEXT, "BYTES", optional=True), Tensor(EMBED, "BOOL", optional=True))
SPEECH_OPTIONS = (
    Tensor(SAMPLING_RATE, "INT32", optional=True),
    Tensor(LANGUAGE, "BYTES", optional=True),
    Tensor(SPEECH_TASK, "BYTES", optional=True),
    Tensor(RETURN_TIMESTAMPS, "BOOL", optional=True),
    Tensor(WORD_TIMESTAMPS, "BOOL", optional=True),
    Tensor(SPEECH_PROMPT, "BYTES", optional=True),
    Tensor(TEMPERATURE, "FP32", optional=True),
)


STREAMING_OPTIONS = (
    Tensor(MESSAGES, "BYTES", optional=True),
    Tensor(TOP_P, "FP32", optional=True),
    Tensor(TOP_K, "INT32", optional=True),
    Tensor(PRESENCE_PENALTY, "FP32", optional=True),
    Tensor(FREQUENCY_PENALTY, "FP32", optional=True),
    Tensor(IGNORE_EOS, "BOOL", optional=True),
    Tensor(OPEN_ENDED, "BOOL", optional=True),
    Tensor(SEED, "INT64", optional=True),
    Tensor(STOP, "BYTES", (-1,), optional=True),
    Tensor(STREAM, "BOOL", optional=True),
    Tensor(LOGPROBS, "INT32", optional=True),
    Tensor(PROMPT_LOGPROBS, "BOOL", optional=True),
    Tensor(PROMPT_IDS, "INT64", (-1,), optional=True),
    Tensor(RAW_PROMPT, "BOOL", optional=True),
    Tensor(TOOLS, "BYTES", optional=True),
    Tensor(GUIDED, "BYTES", optional=True),
)
STREAMING_OUTPUTS = (
    Tensor(TEXT_OUTPUT, "BYTES"),
    Tensor(FINISH_REASON, "BYTES"),
    Tensor(PROMPT_TOKENS, "INT32"),
    Tensor(COMPLETION_TOKENS, "INT32"),
    Tensor(TOKEN_LOGPROBS, "BYTES"),  # only in the responses of a request that asked for log-probabilities
)


def primary_input(task: str) -> str:
    """The tensor a task's rows are sent in: IMAGE for the image tasks, AUDIO for speech, else TEXT."""
    if task == SPEECH_RECOGNITION:
        return AUDIO
    return IMAGE if task in IMAGE_TASKS else TEXT


def task_inputs(task: str, streaming: bool = False) -> tuple[Tensor, ...]:
    check_task(task)
    if task == SPEECH_RECOGNITION:
        return (Tensor(AUDIO, "BYTES"), *SPEECH_OPTIONS)
    if task == IMAGE_CLASSIFICATION:
        return (IMAGE_TENSOR, *IMAGE_CLASSIFICATION_OPTIONS)
    if task == ZERO_SHOT_IMAGE_CLASSIFICATION:
        return (Tensor(IMAGE, "BYTES", optional=True), *ZERO_SHOT_IMAGE_OPTIONS, *ZERO_SHOT_EMBEDDING_INPUTS)
    if task == TOKEN_CLASSIFICATION:
        return (TEXT_TENSOR, *TOKEN_CLASSIFICATION_OPTIONS)
    if task == FILL_MASK:
        return (TEXT_TENSOR, *FILL_MASK_OPTIONS)
    if task == TEXT_RANKING:
        return (TEXT_TENSOR, *TEXT_RANKING_OPTIONS)
    if task == FEATURE_EXTRACTION:
        return (TEXT_TENSOR, *EMBEDDING_OPTIONS)
    if task not in GENERATIVE_TASKS:
        return (TEXT_TENSOR,)
    if streaming:  # text or messages
        return (Tensor(TEXT, "BYTES", optional=True), *GENERATION_OPTIONS, *STREAMING_OPTIONS)
    return (TEXT_TENSOR, *GENERATION_OPTIONS)


def task_outputs(task: str, embedding_dim: int | None = None, streaming: bool = False) -> tuple[Tensor, ...]:
    check_task(task)
    if streaming:
        return STREAMING_OUTPUTS
    if task == FEATURE_EXTRACTION:  # + the tokens each text became (usage counts without tokenising twice)
        return (Tensor(EMBEDDING, "FP32", (embedding_dim or -1,)), Tensor(PROMPT_TOKENS, "INT32"))
    if task == CLASSIFICATION:
        return (Tensor(LABEL, "BYTES"), Tensor(SCORE, "FP32"))
    if task == TOKEN_CLASSIFICATION:  # a JSON list of entities per text
        return (Tensor(ENTITIES, "BYTES"),)
    if task == FILL_MASK:  # a JSON list of candidates per text
        return (Tensor(CANDIDATES, "BYTES"),)
    if task == TEXT_RANKING:  # per document its relevance score, and its pair's tokens (usage)
        return (Tensor(SCORE, "FP32"), Tensor(PROMPT_TOKENS, "INT32"))
    if task == ZERO_SHOT_IMAGE_CLASSIFICATION:  # labels, or (an embedding request) the vectors and a text's tokens
        return (Tensor(LABELS, "BYTES"), Tensor(EMBEDDING, "FP32", (embedding_dim or -1,)), Tensor(PROMPT_TOKENS, "INT32"))
    if task in IMAGE_TASKS:  # a JSON list of {label, score} per image
        return (Tensor(LABELS, "BYTES"),)
    if task == SPEECH_RECOGNITION:
        texts = (Tensor(TEXT_OUTPUT, "BYTES"), Tensor(CHUNKS, "BYTES"), Tensor(WORDS, "BYTES"))
        return (*texts, Tensor(DURATION, "FP32"), Tensor(SPOKEN_LANGUAGE, "BYTES"))
    return (Tensor(TEXT_OUTPUT, "BYTES"),)


def output_names(task: str) -> tuple[str, ...]:
    return tuple(t.name for t in task_outputs(task))


def check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} (one of {', '.join(TASKS)})")


PORTABLE_PATHS = ("model_dir", "onnx_dir", "trt_engine")  # the parameters that name a model's files


@dataclass(frozen=True)
class ModelParameters:
    """What config.pbtxt `parameters` tell model.py; the defaults apply to keys a hand-written config leaves
    out. `to_strings` writes only the keys that matter for the task and backend."""

    task: str = ""  # empty in a hand-written config that is not hf2triton's
    model_dir: str = ""
    backend: str = "python"
    dtype: str = "auto"
    cuda_graphs: bool = True  # on a GPU: encoders' small batches (python, onnx), generation's decoding steps (python, onnx) replay graphs
    num_threads: int = 0
    max_input_bytes: int = 65536
    max_texts_per_request: int = 256
    max_request_bytes: int = 8388608  # all texts of one request together
    onnx_dir: str = ""
    quantize: str = "none"
    trt_engine: str = ""
    max_new_tokens: int = 64
    temperature: float = 0.0
    chat_template: bool = True
    streaming: bool = False  # decoupled model: continuous batching, one response per new piece of text
    checkpoint_defaults: bool = True  # text2text: the checkpoint's generation_config.json settings, as the pipeline
    pipeline_task: str = ""  # text2text: the alias configured (summarization, translation_en_to_de...): its task_specific_params
    max_sequences: int = 32  # running batch of the continuous batcher
    max_prefill_tokens: int = 2048  # prompt tokens prefilled per batcher step (longer prompts: in chunks)
    max_queue: int = 64  # requests waiting for a place; beyond it "busy" at once
    max_new_tokens_limit: int = 1024  # per-request cap
    time_limit_s: float = 300.0  # per-request generation time limit
    max_n: int = 8  # samples of one prompt an OpenAI request may ask for (`n`; each a sequence of its own)
    tool_parser: str = DEFAULT_TOOL_PARSER  # how the gateway reads tool calls in this model's answers (TOOL_PARSERS)
    response_threads: int = 0  # threads sending a streaming model's responses; 0: batching/responder.response_threads()
    # backend vllm (runtimes/vllm.py): vLLM's engine settings as render resolved them (the config's vllm block)
    gpu_memory_utilization: float = 0.5  # fraction of the whole GPU the engine takes
    max_model_len: int = 0  # prompt + answer tokens per sequence (rendered: the served context)
    max_num_seqs: int = 64  # the engine's running batch
    max_num_batched_tokens: int = 0  # tokens per engine step; 0: vLLM's default
    enforce_eager: bool = False  # no torch.compile / CUDA graphs
    enable_prefix_caching: bool = True  # vLLM's automatic prefix caching (its default)
    async_scheduling: str = ""  # "": vLLM's choice; "true" / "false": the config's vllm.async_scheduling
    quantization: str = ""  # vLLM's quantization method; "": the checkpoint's own
    load_format: str = "auto"  # dummy: random weights (benchmarks)
    tensor_parallel_size: int = 1  # GPUs each layer is split over
    pipeline_parallel_size: int = 1  # stages of layers, each on tensor_parallel_size GPUs
    vllm_gpus: str = ""  # the GPUs the engine spans ("2,3"; its CUDA_VISIBLE_DEVICES); "": the instance's GPU
    frontends: int = 1  # the model's instances, each a client of the one engine (runtimes/vllm_frontends.py)
    stride: int = NO_STRIDE  # token-classification: the default window overlap of long texts (NO_STRIDE: truncate)
    # feature-extraction: facts for clients (the gateway), from the model's files at render time (serving/pooling.py;
    # the engine reads the same files itself): its prompt names (a JSON list), whether it normalises, and the widths
    # its Matryoshka declaration allows ("": none, "any", or "768,512,...")
    prompt_names: str = ""
    normalize: bool = True
    matryoshka_dimensions: str = ""
    # image tasks: an image's width x height at most, checked from its header before it is decoded
    max_image_pixels: int = 25_000_000
    # automatic-speech-recognition: an audio's seconds at most, read from its header before it is decoded
    max_audio_seconds: float = 600.0
    # automatic-speech-recognition: 0 sequential long-form (the pipeline's default); > 0 the pipeline's chunking
    chunk_length_s: float = 0.0
    # automatic-speech-recognition: Whisper's decoding steps shared by the audios of every request (batching/whisper.py)
    continuous_batching: bool = True

    def relevant(self) -> tuple[str, ...]:
        keys = ["task", "backend", "model_dir", "dtype", "num_threads", "max_input_bytes", "max_texts_per_request", "max_request_bytes"]
        if self.backend in ("onnx", "tensorrt"):
            keys += ["onnx_dir", "quantize"]
        if self.backend == "tensorrt":
            keys.append("trt_engine")
        # encoders; torch decoding (a text2text model's batcher takes no graphs)
        graphed = self.task not in GENERATIVE_TASKS or (self.task == GENERATION and self.streaming and self.backend == "python")
        graphed = graphed and self.task not in (*IMAGE_TASKS, SPEECH_RECOGNITION)  # these engines run no graphs
        if graphed and self.backend in ("python", "onnx"):
            keys.append("cuda_graphs")
        if self.task == TOKEN_CLASSIFICATION:
            keys.append("stride")
        if self.task == FEATURE_EXTRACTION:
            keys += ["prompt_names", "normalize", "matryoshka_dimensions"]
        if self.task in IMAGE_TASKS:
            keys.append("max_image_pixels")
        if self.task == SPEECH_RECOGNITION:
            keys += ["max_audio_seconds", "chunk_length_s", "continuous_batching"]
        if self.task in GENERATIVE_TASKS:
            keys += ["max_new_tokens", "temperature", "chat_template", "streaming"]
            keys += ["checkpoint_defaults", *(["pipeline_task"] if self.pipeline_task else [])] if self.task == TEXT2TEXT else []
            if self.streaming:
                keys += ["max_queue", "max_new_tokens_limit", "time_limit_s", "max_n", "response_threads"]
                keys += ["tool_parser"] if self.tool_parser != DEFAULT_TOOL_PARSER else []
                keys += VLLM_KEYS if self.backend == "vllm" else ["max_sequences", "max_prefill_tokens"]  # whose batcher
        return tuple(keys)

    def to_strings(self) -> dict[str, str]:
        return {key: _to_string(getattr(self, key)) for key in self.relevant()}

    def located(self, version_dir: str) -> ModelParameters:
        """The artifact paths resolved against the model's version directory: a published repository
        (hf2triton.deploy.publish) carries its weights inside and names them relative to it, so it loads wherever a
        replica puts it; a repository rendered here names absolute paths, which stay as they are."""
        paths = {
            key: os.path.join(version_dir, value) for key in PORTABLE_PATHS if (value := getattr(self, key)) and not os.path.isabs(value)
        }
        return replace(self, **paths)

    @classmethod
    def from_strings(cls, values: dict[str, str]) -> ModelParameters:
        """Parse config.pbtxt string parameters (unknown keys ignored, missing ones defaulted)."""
        kwargs: dict[str, Any] = {}
        for item in fields(cls):
            if item.name in values and values[item.name] != "":
                kwargs[item.name] = _from_string(values[item.name], cls.__dataclass_fields__[item.name].type)
        return cls(**kwargs)


VLLM_KEYS = [
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enforce_eager",
    "enable_prefix_caching",
    "async_scheduling",
    "quantization",
    "load_format",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "vllm_gpus",
    "frontends",
]


def _to_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _from_string(text: str, annotation: str) -> Any:
    if annotation == "bool":
        return text.strip().lower() in ("true", "1", "yes")
    if annotation == "int":
        return int(text)
    if annotation == "float":
        return float(text)
    return text


DEFAULTS = ModelParameters()
