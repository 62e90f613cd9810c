"""The client commands of `python -m hf2triton` against the running server: `models`, `infer MODEL TEXT
[--stream] [--json]` (an image model: `infer MODEL IMAGE_FILE... [--labels a,b]`), `chat MODEL`, `embed MODEL
TEXT...`, and `key` (where the client key is, for curl).
Every command can speak gRPC, so `--grpc HOST:PORT` alone is enough; without it the addresses come from the
config (--config, default $HF2TRITON_CONFIG or ./config.yaml). `--http` is optional (non-streaming `infer`
then goes over HTTP).

Each reads the model's served config to know its task and whether it streams, builds the inputs from the one
serving interface, prints streamed text as it arrives, and turns a server error into one line with the
matching troubleshooting hint."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.errors import UserError
from hf2triton.serving import interface
from hf2triton.triton import client
from hf2triton.triton.pitfalls import explain


def _server_error(err: Exception, model: str) -> UserError:
    hints = "; ".join(dict.fromkeys(p.fix for p in explain(str(err))))
    return UserError(f"{model}: {err}", hints or "check `make status` and the server log")


CONFIG_ENV = "HF2TRITON_CONFIG"  # the config file `make` and snakemake read too


def _refused(err: Exception, url: str) -> UserError | None:
    """The server refused our client key (it was started with another key file): say so, not "not served"."""
    if "restricted" not in str(err):
        return None
    return UserError(
        f"tritonserver at {url} refused hf2triton's client key ({client.key_file()})",
        f"that server was started with another key file: run as its user with the same ${client.KEY_FILE_ENV}, "
        "or restart it with `make serve`",
    )


def model_facts(grpc_url: str, model: str) -> dict[str, Any]:
    """Task, streaming, max_batch_size of a served model (a clear error when it is not served)."""
    from hf2triton.triton.modelconfig import model_parameters

    triton = client.grpc_client(grpc_url)
    try:
        try:
            live = triton.is_server_live()
        except Exception:  # noqa: BLE001 - nothing answers there
            live = False
        if not live:
            raise UserError(f"no server answers at {grpc_url}", "start it with `make serve`, or give its gRPC address: --grpc HOST:PORT")
        try:
            config = triton.get_model_config(model).config
        except Exception as err:  # noqa: BLE001 - the server's answer, with its hint
            refused = _refused(err, grpc_url)
            if refused:
                raise refused from None
            names = sorted({s["name"] for s in triton.get_inference_statistics(as_json=True).get("model_stats", [])})
            raise UserError(f"model {model!r} is not served at {grpc_url} ({err})", f"use one of: {', '.join(names) or '(none)'}") from None
    finally:
        triton.close()
    params = model_parameters(config)
    facts = {"task": params.task, "streaming": bool(config.model_transaction_policy.decoupled), "max_batch_size": config.max_batch_size}
    if params.task == interface.FEATURE_EXTRACTION:  # what a request may ask of it: a prompt, a Matryoshka width
        facts["prompt_names"] = json.loads(params.prompt_names or "[]")
        facts["matryoshka_dimensions"] = params.matryoshka_dimensions
        facts["normalize"] = params.normalize
    return facts


def list_models(grpc_url: str) -> list[dict[str, Any]]:
    """The loaded models, from the statistics API (the repository API is admin-only on an hf2triton server)."""
    triton = client.grpc_client(grpc_url)
    try:
        try:
            stats = triton.get_inference_statistics(as_json=True).get("model_stats", [])
        except Exception as err:  # noqa: BLE001
            raise _refused(err, grpc_url) or UserError(f"no server answers at {grpc_url} ({err})", "start it with `make serve`") from None
        ready = {name: triton.is_model_ready(name) for name in sorted({s["name"] for s in stats})}
    finally:
        triton.close()
    return [{"name": n, "state": "READY" if ok else "UNAVAILABLE", **(model_facts(grpc_url, n) if ok else {})} for n, ok in ready.items()]


def infer(
    http_url: str | None,
    grpc_url: str,
    model: str,
    texts: list[str],
    options: dict[str, Any],
    stream: bool,
    out=sys.stdout,
    task: str | None = None,
) -> dict[str, Any]:
    """One request for any task (`task`: the one the command needs, checked before anything is sent); over
    HTTP when `http_url` is given, else gRPC; streamed text is written to `out` as it arrives when `stream`."""
    facts = model_facts(grpc_url, model)
    if task is not None and facts["task"] != task:
        raise UserError(f"{model} is a {facts['task']} model, not {task}", f"use a {task} model (`python -m hf2triton models` lists them)")
    if facts["task"] == interface.TEXT_RANKING and not options.get(interface.QUERY):
        raise UserError(f"{model} is a reranker: it scores the TEXTs (documents) against a query", "add --query 'QUERY'")
    if interface.GUIDED in options and not (facts["task"] in interface.GENERATIVE_TASKS and facts["streaming"]):
        raise UserError(f"{model} is not a streaming generation model: --json-schema / --regex need one", "use a streaming model")
    if facts["task"] in interface.IMAGE_TASKS or facts["task"] == interface.SPEECH_RECOGNITION:  # the arguments are files
        texts = input_files(model, facts["task"], texts, options)
    try:
        if facts["task"] in interface.GENERATIVE_TASKS and facts["streaming"]:
            if len(texts) != 1:
                raise UserError(f"{model} streams: one prompt per request (got {len(texts)})", "send one TEXT")
            printer = (lambda piece: (out.write(piece), out.flush())) if stream else None
            answer = client.stream_generate(grpc_url, model, texts[0], options, on_piece=printer)
            if stream:
                out.write("\n")
            return {k: answer[k] for k in ("text", "finish_reason", "prompt_tokens", "completion_tokens")}
        if http_url:
            import tritonclient.http as module

            triton = client.http_client(http_url)
        else:
            import tritonclient.grpc as module

            triton = client.grpc_client(grpc_url)
        try:
            inputs = client.build_inputs(module, texts, options or None, primary=interface.primary_input(facts["task"]))
            result = triton.infer(model, inputs)
        finally:
            triton.close()
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - the server's answer, with its hint
        raise _server_error(err, model) from None
    outputs = {name: result.as_numpy(name) for name in interface.output_names(facts["task"])}
    if facts["task"] == interface.FEATURE_EXTRACTION:
        return {"embeddings": outputs[interface.EMBEDDING].reshape(len(texts), -1).tolist()}
    if facts["task"] == interface.CLASSIFICATION:
        labels = [v.decode() for v in outputs[interface.LABEL].reshape(-1)]
        return {"labels": labels, "scores": [round(float(v), 6) for v in outputs[interface.SCORE].reshape(-1)]}
    if facts["task"] == interface.TOKEN_CLASSIFICATION:  # per text the pipeline's JSON list of entities
        return {"entities": [json.loads(v) for v in outputs[interface.ENTITIES].reshape(-1)]}
    if facts["task"] == interface.FILL_MASK:  # per text the pipeline's JSON list of candidates
        return {"candidates": [json.loads(v) for v in outputs[interface.CANDIDATES].reshape(-1)]}
    if facts["task"] == interface.TEXT_RANKING:  # per text (document) its relevance to the query
        return {"relevance_scores": [float(v) for v in outputs[interface.SCORE].reshape(-1)]}
    if facts["task"] in interface.IMAGE_TASKS:  # per image the pipeline's JSON list of {label, score}
        return {"predictions": [json.loads(v) for v in outputs[interface.LABELS].reshape(-1)]}
    if facts["task"] == interface.SPEECH_RECOGNITION:  # + each one's chunks and words where asked
        answer: dict[str, Any] = {"texts": [v.decode() for v in outputs[interface.TEXT_OUTPUT].reshape(-1)]}
        for name, asked in ((interface.CHUNKS, interface.RETURN_TIMESTAMPS), (interface.WORDS, interface.WORD_TIMESTAMPS)):
            if options.get(asked):
                answer[name] = [json.loads(v) for v in outputs[name].reshape(-1)]
        return answer
    return {"texts": [v.decode() for v in outputs[interface.TEXT_OUTPUT].reshape(-1)]}


def input_files(model: str, task: str, paths: list[str], options: dict[str, Any]) -> list[bytes]:
    """An image or speech task's arguments: image or audio files, read whole (the server decodes and checks them);
    zero-shot needs --labels."""
    if task == interface.ZERO_SHOT_IMAGE_CLASSIFICATION and not options.get(interface.CANDIDATE_LABELS):
        raise UserError(f"{model} classifies images into labels the request names", "add --labels 'cat,dog,a red car'")
    kind, formats = ("audio", "WAV, FLAC, OGG or MP3") if task == interface.SPEECH_RECOGNITION else ("image", "PNG or JPEG")
    files = []
    for path in paths:
        try:
            files.append(Path(path).read_bytes())
        except OSError as err:
            message = f"{model} takes {kind} files: cannot read {path!r} ({err.strerror or err})"
            raise UserError(message, f"pass {formats} file paths") from None
    return files


def summary(result: dict[str, Any]) -> str:
    """A human line for `infer` without --json."""
    if "embeddings" in result:
        vectors = np.asarray(result["embeddings"])
        return "\n".join(f"[{len(v)} dims] {' '.join(f'{x:.4f}' for x in v[:6])} ... (norm {np.linalg.norm(v):.4f})" for v in vectors)
    if "labels" in result:
        return "\n".join(f"{label} ({score:.4f})" for label, score in zip(result["labels"], result["scores"]))
    if "entities" in result:  # one line per entity, a blank line between texts
        return "\n\n".join("\n".join(entity_line(e) for e in entities) or "(no entities)" for entities in result["entities"])
    if "candidates" in result:  # one line per candidate, a blank line between texts
        lines = ["\n".join(f"{c['token_str']!r} ({c['score']:.4f}) {c['sequence']}" for c in each) for each in result["candidates"]]
        return "\n\n".join(lines)
    if "predictions" in result:  # an image's labels, best first; a blank line between images
        return "\n\n".join("\n".join(f"{p['label']} ({p['score']:.4f})" for p in each) for each in result["predictions"])
    if "relevance_scores" in result:  # best first: score and the text's position
        ranked = sorted(enumerate(result["relevance_scores"]), key=lambda pair: -pair[1])
        return "\n".join(f"{score:.4f} text {index}" for index, score in ranked)
    if "texts" in result:
        return "\n".join(result["texts"])
    return result["text"]


def entity_line(entity: dict[str, Any]) -> str:
    """One entity of a tagger's answer, readable: label, the text, its character span and score."""
    label = entity.get("entity_group", entity.get("entity"))
    return f"{label:<8} {entity['word']!r} [{entity['start']}:{entity['end']}] ({entity['score']:.4f})"


def printed_json(result: dict[str, Any]) -> Any:
    """What `infer --json` prints: a tagger's or fill-mask's answer as transformers' pipeline returns it (one text:
    its list of entities / candidates; several: a list per text); other tasks' answers as they are."""
    for key in ("entities", "candidates", "predictions"):
        if key in result:
            return result[key][0] if len(result[key]) == 1 else result[key]
    return result


def generation_flags(args: Any) -> dict[str, Any]:
    """--max-tokens, --temperature, --top-p, --seed, --stop as the model's request options (the server checks them)."""
    flags = {
        interface.MAX_NEW_TOKENS: getattr(args, "max_tokens", None),
        interface.TEMPERATURE: getattr(args, "temperature", None),
        interface.TOP_P: getattr(args, "top_p", None),
        interface.SEED: getattr(args, "seed", None),
        interface.STOP: getattr(args, "stop", None),
        interface.AGGREGATION_STRATEGY: getattr(args, "aggregation_strategy", None),  # token-classification
        interface.STRIDE: getattr(args, "stride", None),  # token-classification: windows of long texts
        interface.TOP_K: getattr(args, "top_k", None),  # fill-mask: candidates per text
        interface.QUERY: getattr(args, "query", None),  # text-ranking: the texts are the documents
        interface.PROMPT_NAME: getattr(args, "prompt_name", None),  # feature-extraction: one of the model's prompts
        interface.GUIDED: guided_flag(getattr(args, "json_schema", None), getattr(args, "regex", None)),  # structured output
        interface.FUNCTION_TO_APPLY: getattr(args, "function_to_apply", None),  # image-classification
        interface.HYPOTHESIS_TEMPLATE: getattr(args, "hypothesis_template", None),  # zero-shot-image-classification
        interface.LANGUAGE: getattr(args, "language", None),  # automatic-speech-recognition
        interface.SPEECH_TASK: getattr(args, "task", None),
        interface.RETURN_TIMESTAMPS: getattr(args, "timestamps", None) or None,
        interface.WORD_TIMESTAMPS: getattr(args, "word_timestamps", None) or None,
        interface.SPEECH_PROMPT: getattr(args, "prompt", None),
    }
    labels = getattr(args, "labels", None)
    if labels is not None:  # zero-shot-image-classification: comma-separated
        flags[interface.CANDIDATE_LABELS] = [label.strip() for label in labels.split(",") if label.strip()]
    return {name: value for name, value in flags.items() if value is not None}


def guided_flag(schema_file: str | None, regex: str | None) -> dict[str, Any] | None:
    """--json-schema FILE or --regex as the model's GUIDED input (constrained decoding; the server compiles it)."""
    if schema_file and regex:
        raise UserError("--json-schema and --regex both constrain the answer", "give one of them")
    if regex:
        return {"kind": "regex", "value": regex}
    if not schema_file:
        return None
    try:
        schema = json.loads(Path(schema_file).read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"--json-schema {schema_file}: cannot read it ({err.strerror})", "give the path of a JSON schema file") from None
    except ValueError as err:
        raise UserError(f"--json-schema {schema_file} is not JSON ({err})", "give a JSON schema file (a JSON object)") from None
    if not isinstance(schema, dict):
        raise UserError(f"--json-schema {schema_file} holds no JSON object", 'a JSON schema is an object, e.g. {"type": "object"}')
    return {"kind": "json_schema", "value": schema}


def chat(grpc_url: str, model: str, options: dict[str, Any], read=input, out=sys.stdout, system: str | None = None) -> int:
    """A conversation with history (starting with `system`, if given); Ctrl-D or Ctrl-C leaves cleanly."""
    facts = model_facts(grpc_url, model)
    if facts["task"] not in interface.GENERATIVE_TASKS or not facts["streaming"]:
        raise UserError(f"{model} is not a streaming text-generation model", "chat with a text-generation model served with streaming")
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    out.write(f"chatting with {model} (Ctrl-D or Ctrl-C to leave)\n")
    while True:
        try:
            line = read("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return 0
        if not line:
            continue
        history.append({"role": "user", "content": line})
        out.write(f"{model}> ")
        out.flush()
        try:
            answer = client.stream_generate(grpc_url, model, history, options, on_piece=lambda piece: (out.write(piece), out.flush()))
        except KeyboardInterrupt:
            out.write(" [stopped]\n")
            history.pop()
            continue
        except Exception as err:  # noqa: BLE001 - report and go on with the conversation
            out.write(f"\nerror: {_server_error(err, model).render()}\n")
            history.pop()
            continue
        out.write("\n")
        history.append({"role": "assistant", "content": answer["text"]})


def config_path(given: str | None) -> Path:
    """--config, else $HF2TRITON_CONFIG, else ./config.yaml."""
    return Path(given or os.environ.get(CONFIG_ENV) or "config.yaml")


def _configured_urls(config: Path) -> tuple[str, str]:
    from hf2triton.config import load_project
    from hf2triton.triton.settings import Settings

    project = load_project(config)
    settings = Settings.of(project.server, project.names, project.work)
    return settings.url(), settings.url("grpc_port")


def addresses(http: str | None, grpc: str | None, config: str | None) -> tuple[str | None, str]:
    """(HTTP address or None, gRPC address): --grpc alone is enough (every command can speak gRPC); without it
    both come from the config (an --http given wins)."""
    if grpc:
        return http, grpc
    path = config_path(config)
    if not path.is_file():
        raise UserError(
            f"no server address: --grpc not given and no config file {path}",
            f"pass --grpc HOST:PORT (tritonserver's gRPC port, 8001 by default), --config FILE, or export {CONFIG_ENV}=FILE",
        )
    configured_http, configured_grpc = _configured_urls(path)
    return http or configured_http, configured_grpc


def show_key(config: str | None, new: bool = False, out=sys.stdout) -> int:
    """Where the client key is and how curl sends it; never the key itself. `new`: write a new key first."""
    if new:
        client.create_key(replace=True)
        print(f"hf2triton: a new client key is in {client.key_file()}; a running server takes it at its next `make serve`", file=sys.stderr)
    client.client_key()  # a missing key is an error naming the fix: clients never write it
    path = config_path(config)
    http = _configured_urls(path)[0] if path.is_file() else "127.0.0.1:8000"
    out.write(
        f"{client.key_file()}\n"
        f"# tritonserver's metadata, inference, model-config and statistics APIs need this header (health does not); e.g.\n"
        f'curl -H "{client.KEY_HEADER}: $(cat {shlex.quote(str(client.key_file()))})" http://{http}/v2/models/MODEL\n'
        f"# gRPC clients send it as metadata {client.GRPC_KEY_HEADER}\n"
    )
    return 0


def main(args) -> int:
    """Dispatch of the client subcommands (argparse namespace from hf2triton.__main__)."""
    if args.command == "key":
        return show_key(args.config, args.new)
    http_url, grpc_url = addresses(args.http, args.grpc, args.config)
    options = generation_flags(args)
    if args.command == "models":
        rows = list_models(grpc_url)
        if args.json:
            print(json.dumps(rows, indent=1))
        for row in [] if args.json else rows:
            extra = f"{row.get('task', '')}{' (streaming)' if row.get('streaming') else ''}"
            print(f"{row['name']:<24} {row['state']:<12} {extra}")
        return 0
    if args.command == "chat":
        return chat(grpc_url, args.model, options, system=args.system)
    stream = getattr(args, "stream", False)
    task = interface.FEATURE_EXTRACTION if args.command == "embed" else None  # embed must never generate
    result = infer(http_url, grpc_url, args.model, args.text, options, stream=stream and not args.json, task=task)
    if args.json:
        print(json.dumps(printed_json(result), ensure_ascii=False))
    elif not stream or "text" not in result:
        print(summary(result))
    return 0
