"""What `serve` checks once the gateway is up (results/validation/gateway.{json,md}): chat through the gateway
(one answer and streamed) equals Triton's own streamed answer; embeddings through it equal Triton's (also with a
prompt_name, and for a Matryoshka model cut to its smallest width); a reranker's /v1/rerank and /v1/score scores equal
Triton's; a tagger's and an image model's /v1/models/{model}:predict equals Triton's own JSON."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.fsutil import atomic_write_json, atomic_write_text
from hf2triton.serving import interface
from hf2triton.triton import client

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
OPTIONS = {"max_tokens": 24, "temperature": 0}
TEXTS = ["The weather is lovely today.", "Ein Mann isst Essen.", "你好，世界"]


def check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _answer(url: str, body: dict[str, Any], key: str | None) -> dict[str, Any]:
    status, text = client.http_post(url, _headers(key), body, timeout=300)
    if status != 200:
        raise RuntimeError(f"HTTP {status} from {url}: {text[:300]}")
    return json.loads(text)


def _streamed_chat(base: str, model: str, key: str | None) -> str:
    body = {"model": model, "messages": QUESTION, "stream": True, **OPTIONS}
    events = client.http_post_events(f"{base}/chat/completions", _headers(key), body)
    return "".join(c["delta"].get("content") or "" for event in events for c in event.get("choices", []))


def _triton_rows(
    http_url: str, name: str, texts: list[str] | list[bytes], options: dict[str, Any] | None, output: str, primary: str = interface.TEXT
) -> np.ndarray:
    """Triton's own answer (`output`, one row per text; `primary`: the input they go in) to one request over HTTP."""
    import tritonclient.http as httpclient

    inputs = client.build_inputs(httpclient, texts, options, primary=primary)
    return client.http_client(http_url).infer(name, inputs).as_numpy(output).reshape(-1)


def rerank_checks(base: str, http_url: str, name: str, key: str | None) -> list[dict[str, Any]]:
    """POST /v1/rerank of TEXTS against QUESTION's text: per document the relevance score of Triton's own answer
    (exactly: float32 through JSON), best first; POST /v1/score of the same pairs: the same scores, in the pairs' order."""
    query = QUESTION[0]["content"]
    direct = _triton_rows(http_url, name, TEXTS, {interface.QUERY: query}, interface.SCORE)
    results = _answer(f"{base}/rerank", {"model": name, "query": query, "documents": TEXTS}, key)["results"]
    served = {r["index"]: r["relevance_score"] for r in results}
    same = sorted(served) == list(range(len(TEXTS))) and all(np.float32(served[i]) == direct[i] for i in served)
    ordered = [r["relevance_score"] for r in results] == sorted(served.values(), reverse=True)
    detail = f"{len(results)} documents, scores {[round(float(s), 6) for s in direct]} (Triton), best first: {ordered}"
    scored = _answer(f"{base}/score", {"model": name, "text_1": query, "text_2": TEXTS}, key)["data"]
    paired = [d["index"] for d in scored] == list(range(len(TEXTS))) and all(np.float32(d["score"]) == direct[d["index"]] for d in scored)
    return [
        check(f"{name}: rerank equals Triton", same and ordered, detail),
        check(f"{name}: score equals Triton", paired, f"{len(scored)} pairs, in order, each Triton's score"),
    ]


def predict_check(base: str, http_url: str, name: str, key: str | None) -> dict[str, Any]:
    """POST /v1/models/{name}:predict of TEXTS: a tagger's entities per text, exactly the JSON Triton answers."""
    direct = [json.loads(row) for row in _triton_rows(http_url, name, TEXTS, None, interface.ENTITIES)]
    served = _answer(f"{base}/models/{name}:predict", {"instances": TEXTS}, key)["predictions"]
    detail = f"{sum(len(entities) for entities in direct)} entities in {len(TEXTS)} texts (Triton)"
    return check(f"{name}: predict equals Triton", served == direct, detail)


def image_predict_check(base: str, http_url: str, name: str, task: str, key: str | None) -> dict[str, Any]:
    """POST /v1/models/{name}:predict of validation's probe images (KServe's {"image_bytes": {"b64"}}): per image
    exactly the labels Triton answers."""
    import base64

    from hf2triton.pipeline.image_probes import probe_images, validation_options

    images, options = probe_images(), validation_options(task)
    direct = [json.loads(row) for row in _triton_rows(http_url, name, images, options, interface.LABELS, interface.IMAGE)]
    instances = [{"image_bytes": {"b64": base64.b64encode(image).decode()}} for image in images]
    body = {"instances": instances, **({"parameters": options} if options else {})}
    served = _answer(f"{base}/models/{name}:predict", body, key)["predictions"]
    return check(f"{name}: predict equals Triton", served == direct, f"{len(images)} images, {sum(map(len, direct))} labels (Triton)")


def transcription_check(base: str, http_url: str, name: str, key: str | None) -> dict[str, Any]:
    """POST /v1/audio/transcriptions of validation's first probe audio (a multipart form, as OpenAI's SDK sends it):
    exactly the text Triton answers for the same file."""
    import urllib.error
    import urllib.request
    import uuid

    from hf2triton.pipeline.audio_probes import probe_audios

    audio = probe_audios()[0]
    direct = _triton_rows(http_url, name, [audio], None, interface.TEXT_OUTPUT, interface.AUDIO)[0].decode("utf-8")
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{name}\r\n'.encode()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="probe.wav"\r\n\r\n'.encode())
    body = b"".join(parts) + audio + f"\r\n--{boundary}--\r\n".encode()
    headers = {**_headers(key), "Content-Type": f"multipart/form-data; boundary={boundary}"}
    request = urllib.request.Request(f"{base}/audio/transcriptions", data=body, headers=headers, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=300) as response:  # noqa: S310 - our own gateway
            served = json.loads(response.read())["text"]
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"HTTP {err.code} from {base}/audio/transcriptions: {err.read()[:300]!r}") from None
    return check(f"{name}: transcription equals Triton", served == direct, f"{len(audio)} bytes of WAV -> {direct[:60]!r} (Triton)")


def dual_embeddings_check(base: str, http_url: str, name: str, key: str | None) -> dict[str, Any]:
    """A zero-shot image model's POST /v1/embeddings of a text and an image (a data URL), in that order: each vector
    Triton's own (within float32 rounding)."""
    import base64

    from hf2triton.pipeline.image_probes import probe_images

    image = probe_images()[0]
    text_vector = _triton_rows(http_url, name, TEXTS[:1], None, interface.EMBEDDING)
    image_vector = _triton_rows(http_url, name, [image], {interface.EMBED: True}, interface.EMBEDDING, interface.IMAGE)
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    body = {"model": name, "input": [TEXTS[0], {"type": "image_url", "image_url": {"url": url}}]}
    data = _answer(f"{base}/embeddings", body, key)["data"]
    served = [np.asarray(d["embedding"], dtype=np.float32) for d in data]
    diff = max(float(np.abs(a - b).max()) for a, b in zip(served, (text_vector, image_vector)))
    return check(
        f"{name}: embeddings equal Triton",
        len(served) == 2 and diff <= 1e-6,
        f"a text and an image, {served[0].size} dims, max diff {diff:.1e}",
    )


def embeddings_check(base: str, http_url: str, name: str, facts: dict[str, Any], key: str | None) -> dict[str, Any]:
    """POST /v1/embeddings equals Triton's own embedding (within float32 rounding): plain, with the model's first
    prompt_name, and for a Matryoshka model `dimensions` (its smallest width): Triton's vector cut, normalised again
    where the model normalises."""
    import tritonclient.http as httpclient

    triton = client.http_client(http_url)
    prompt = (facts.get("prompt_names") or [None])[0]
    widths = facts.get("matryoshka_dimensions") or ""
    cases = [{}, *([{"prompt_name": prompt}] if prompt else []), *([{"dimensions": widths}] if widths else [])]
    details, ok = [], True
    for extra in cases:
        options = {interface.PROMPT_NAME: extra["prompt_name"]} if "prompt_name" in extra else None
        direct = triton.infer(name, client.build_inputs(httpclient, TEXTS[:1], options)).as_numpy(interface.EMBEDDING)[0]
        if "dimensions" in extra:  # the smallest width it declares (any: half its own)
            extra = {"dimensions": direct.size // 2 if widths == "any" else min(int(w) for w in widths.split(","))}
            direct = direct[: extra["dimensions"]]
            direct = direct / np.linalg.norm(direct) if facts.get("normalize", True) else direct
        answer = _answer(f"{base}/embeddings", {"model": name, "input": TEXTS[:1], **extra}, key)
        served = np.asarray(answer["data"][0]["embedding"], dtype=np.float32)
        diff = float(np.abs(served - direct).max()) if served.shape == direct.shape else float("inf")
        ok = ok and diff <= 1e-6 * max(1.0, float(np.linalg.norm(direct)))
        details.append(f"{json.dumps(extra) if extra else 'plain'}: {served.size} dims, max diff {diff:.1e}")
    return check(f"{name}: embeddings equal Triton", ok, "; ".join(details))


def check_gateway(base: str, grpc_url: str, http_url: str, models: dict[str, dict[str, Any]], key: str | None) -> dict[str, Any]:
    """`models`: name -> {"task", "streaming"}; `base`: http://host:port/v1."""
    checks = []
    for name, facts in models.items():
        try:
            if facts["task"] in interface.GENERATIVE_TASKS and facts["streaming"]:
                greedy = {interface.MAX_NEW_TOKENS: OPTIONS["max_tokens"], interface.TEMPERATURE: 0.0}
                direct = client.stream_generate(grpc_url, name, QUESTION, greedy)["text"]
                whole = _answer(f"{base}/chat/completions", {"model": name, "messages": QUESTION, **OPTIONS}, key)
                whole = whole["choices"][0]["message"]["content"]
                checks.append(check(f"{name}: chat equals Triton", whole == direct, f"gateway {whole!r} vs Triton {direct!r}"))
                streamed = _streamed_chat(base, name, key)
                checks.append(check(f"{name}: streamed chat equals Triton", streamed == direct, f"gateway {streamed!r}"))
            elif facts["task"] == interface.FEATURE_EXTRACTION:
                checks.append(embeddings_check(base, http_url, name, facts, key))
            elif facts["task"] == interface.TEXT_RANKING:
                checks.extend(rerank_checks(base, http_url, name, key))
            elif facts["task"] == interface.TOKEN_CLASSIFICATION:
                checks.append(predict_check(base, http_url, name, key))
            elif facts["task"] in interface.IMAGE_TASKS:
                checks.append(image_predict_check(base, http_url, name, facts["task"], key))
                if facts["task"] == interface.ZERO_SHOT_IMAGE_CLASSIFICATION:
                    checks.append(dual_embeddings_check(base, http_url, name, key))
            elif facts["task"] == interface.SPEECH_RECOGNITION:
                checks.append(transcription_check(base, http_url, name, key))
        except Exception as err:  # noqa: BLE001 - a failed check, reported
            checks.append(check(f"{name}: gateway", False, f"{type(err).__name__}: {err}"))
    return {"ok": all(c["ok"] for c in checks), "base_url": base, "checks": checks, "checked_at": time.time()}


def write_report(report: dict[str, Any], stem: str) -> None:
    atomic_write_json(f"{stem}.json", report)
    lines = [f"# hf2triton gateway check: {'PASS' if report['ok'] else 'FAIL'}", "", f"OpenAI-compatible API at {report['base_url']}", ""]
    lines += ["| check | result | detail |", "|---|---|---|"]
    lines += [f"| {c['name']} | {'ok' if c['ok'] else '**FAIL**'} | {c['detail'].replace('|', '/')} |" for c in report["checks"]]
    Path(stem).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(f"{stem}.md", "\n".join(lines) + "\n")


def api_key(env_name: str) -> str | None:
    return os.environ.get(env_name) or None
