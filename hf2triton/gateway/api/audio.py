"""POST /v1/audio/transcriptions and /v1/audio/translations: automatic-speech-recognition models (Whisper), in OpenAI's
shape: a multipart form (`file`, `model`, `language`, `prompt`, `response_format` json | text | verbose_json | srt | vtt,
`temperature`, `timestamp_granularities[]` segment and/or word) -> {"text"}, the bare text, {task, language, duration,
text, segments, words}, or subtitles (SubRip, WebVTT: one cue per segment). Segments come from Whisper's timestamp
tokens, words from its alignment heads (two decodings when both are asked, as the pipeline's own `return_timestamps`
True and "word" are). The audio file goes to Triton as it came (the model decodes and resamples it); the form is read
through the Boundary (bounded in size and time as JSON bodies are; a cross-site form post carries a foreign Origin and
is refused there)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from hf2triton.gateway.backend import gateway_of
from hf2triton.gateway.boundary import KEY
from hf2triton.gateway.errors import ApiError
from hf2triton.serving import interface

router = APIRouter()
FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
SUBTITLES = ("srt", "vtt")  # subtitle files from the segments' times
GRANULARITY = "timestamp_granularities[]"
GRANULARITIES = ("segment", "word")
FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature", GRANULARITY)


async def read_form(request: Request) -> tuple[bytes, dict[str, str]]:
    """The form's audio file and its text fields (a repeated `timestamp_granularities[]`: its values joined by
    commas); a field this endpoint does not serve is a 400 naming it."""
    try:
        form = await request.form()
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - a malformed multipart body is the client's
        raise ApiError(400, f"the body must be a multipart form (multipart/form-data) with a 'file' field: {err}") from None
    fields: dict[str, str] = {}
    upload = None
    for key, value in form.multi_items():
        if key not in FIELDS:
            raise ApiError(400, f"'{key}' is not served here (fields: {', '.join(FIELDS)})", param=key)
        if key == "file":
            upload = value
        elif isinstance(value, str):
            fields[key] = f"{fields[key]},{value}" if key == GRANULARITY and key in fields else value
    if upload is None or isinstance(upload, str):
        raise ApiError(400, "'file' is required: the audio file (WAV, FLAC, OGG, MP3, AIFF, CAF) as a form file field", param="file")
    audio = await upload.read()
    if not audio:
        raise ApiError(400, "'file' is empty: send the audio file's bytes", param="file")
    return audio, fields


def speech_options(fields: dict[str, str], task: str) -> tuple[str, dict[str, Any]]:
    """The response format and the model's options from the form's fields (400 naming a wrong one)."""
    response_format = fields.get("response_format", "json")
    if response_format not in FORMATS:
        raise ApiError(400, f"response_format={response_format!r} is not served: use one of {', '.join(FORMATS)}", param="response_format")
    try:
        temperature = float(fields.get("temperature", "0"))
    except ValueError:
        raise ApiError(400, f"temperature={fields['temperature']!r} is not a number", param="temperature") from None
    low, high = interface.SPEECH_TEMPERATURE_RANGE
    if not low <= temperature <= high:  # NaN too
        raise ApiError(400, f"temperature={temperature:g} must be between {low:g} and {high:g}", param="temperature")
    granularities = set(fields.get(GRANULARITY, "segment").split(","))
    if not granularities <= set(GRANULARITIES):
        wrong = ", ".join(sorted(granularities - set(GRANULARITIES)))
        raise ApiError(400, f"timestamp_granularities: {wrong!r} is not served: use segment and/or word", param=GRANULARITY)
    if GRANULARITY in fields and response_format != "verbose_json":
        raise ApiError(400, "timestamp_granularities needs response_format=verbose_json (the others carry no times)", param=GRANULARITY)
    verbose = response_format == "verbose_json"
    options: dict[str, Any] = {
        interface.RETURN_TIMESTAMPS: (verbose and "segment" in granularities) or response_format in SUBTITLES,
        interface.WORD_TIMESTAMPS: verbose and "word" in granularities,
        interface.TEMPERATURE: temperature,  # 0: the pipeline's decoding; > 0 sampled
    }
    if fields.get("prompt"):  # Whisper's prompt: the transcript continues it (spellings, names, style)
        options[interface.SPEECH_PROMPT] = fields["prompt"]
    if task == "translate":  # transcriptions send none: the model's own default, as the pipeline's
        options[interface.SPEECH_TASK] = task
    if fields.get("language"):
        options[interface.LANGUAGE] = fields["language"]
    return response_format, options


# the model's option -> the form field that set it (return_timestamps: a response_format with times; task translate:
# the translations endpoint, which needs a multilingual model)
OPTION_FIELDS = {
    interface.LANGUAGE: "language",
    interface.SPEECH_PROMPT: "prompt",
    interface.WORD_TIMESTAMPS: GRANULARITY,
    interface.RETURN_TIMESTAMPS: "response_format",
    interface.TEMPERATURE: "temperature",
    interface.SPEECH_TASK: "model",
}


def field_named(message: str) -> str:
    """The form field a model's refusal is about: the option it names first (a refusal opens with the one it refuses
    and may list others after it), else the file."""

    def first(name: str) -> int:  # where the message names the option; -1: nowhere
        return min((i for i in (message.find(f"'{name}'"), message.find(f"{name}=")) if i >= 0), default=-1)

    named = sorted((first(name), field) for name, field in OPTION_FIELDS.items() if first(name) >= 0)
    return named[0][1] if named else "file"


def name_refusal(err: ApiError, response_format: str) -> None:
    """A model's 400 named as the form field that sent it; a refusal of timestamps said as the response_format that
    asked for them (the client sent no 'return_timestamps')."""
    err.param = field_named(err.message)
    if err.param == "response_format":
        err.message = (
            f"response_format={response_format!r} needs timestamps, which this model does not give: use json or text ({err.message})"
        )


async def recognize(request: Request, task: str):
    audio, fields = await read_form(request)
    gateway = gateway_of(request)
    served = await gateway.model({"model": fields.get("model")}, interface.SPEECH_RECOGNITION)
    response_format, options = speech_options(fields, task)
    try:
        (result,) = await gateway.infer_texts(served, [audio], options, "file")
    except ApiError as err:  # the model's words about the audio or an option, named as the field that sent it
        if err.status == 400 and err.param is None:
            name_refusal(err, response_format)
        raise
    text = result.as_numpy(interface.TEXT_OUTPUT).reshape(-1)[0].decode("utf-8")
    if response_format == "text":
        return PlainTextResponse(text)
    if response_format == "json":
        return {"text": text}
    duration = float(result.as_numpy(interface.DURATION).reshape(-1)[0])

    def timed(name: str) -> list[tuple[dict[str, Any], float, float]]:  # the pipeline's chunks, an open end: the audio's
        chunks = json.loads(result.as_numpy(name).reshape(-1)[0])
        return [(c, c["timestamp"][0], c["timestamp"][1] if c["timestamp"][1] is not None else duration) for c in chunks]

    if response_format in SUBTITLES:
        cues = [(start, end, c["text"]) for c, start, end in timed(interface.CHUNKS)]
        return PlainTextResponse(subtitles(cues, response_format), media_type="text/vtt" if response_format == "vtt" else "text/plain")
    answer = {"task": task, "language": language_name(result, fields.get("language", "")), "duration": duration, "text": text}
    if options[interface.RETURN_TIMESTAMPS]:
        answer["segments"] = [
            {"id": i, "seek": 0, "start": start, "end": end, "text": c["text"], "tokens": [], "temperature": options[interface.TEMPERATURE],
             "avg_logprob": 0.0, "compression_ratio": 0.0, "no_speech_prob": 0.0}
            for i, (c, start, end) in enumerate(timed(interface.CHUNKS))
        ]  # fmt: skip
    if options[interface.WORD_TIMESTAMPS]:
        answer["words"] = [{"word": c["text"].strip(), "start": start, "end": end} for c, start, end in timed(interface.WORDS)]
    return answer


def subtitles(cues: list[tuple[float, float, str]], kind: str) -> str:
    """SubRip (numbered cues, `00:00:01,500 --> ...`) or WebVTT (a `WEBVTT` header, `00:00:01.500 --> ...`) text, as
    OpenAI's srt / vtt formats write a transcript's segments."""

    def stamp(seconds: float) -> str:
        millis = round(max(seconds, 0.0) * 1000)
        hours, millis = divmod(millis, 3_600_000)
        minutes, millis = divmod(millis, 60_000)
        return f"{hours:02d}:{minutes:02d}:{millis // 1000:02d}{',' if kind == 'srt' else '.'}{millis % 1000:03d}"

    blocks = [f"{stamp(start)} --> {stamp(end)}\n{text.strip()}\n" for start, end, text in cues]
    if kind == "srt":
        return "\n".join(f"{number}\n{block}" for number, block in enumerate(blocks, 1))
    return "\n".join(["WEBVTT\n", *blocks])


@router.post("/v1/audio/transcriptions", dependencies=KEY)
async def transcriptions(request: Request):
    return await recognize(request, "transcribe")


@router.post("/v1/audio/translations", dependencies=KEY)
async def translations(request: Request):
    return await recognize(request, "translate")


def language_name(result: Any, asked: str) -> str:
    """verbose_json's `language` as OpenAI writes it, the language's name ("english"): the model's SPOKEN_LANGUAGE
    (the language asked, else the one Whisper detected), else what was asked."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    spoken = result.as_numpy(interface.SPOKEN_LANGUAGE)
    code = spoken.reshape(-1)[0].decode("utf-8") if spoken is not None else asked
    return LANGUAGES.get(code, code)
