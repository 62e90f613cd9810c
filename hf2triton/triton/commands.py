"""The client commands of `python -m hf2triton` against the running server (addresses from config.yaml, or
--http/--grpc): `models`, `infer MODEL TEXT [--stream] [--json]`, `chat MODEL`, `embed MODEL TEXT...`.

Each reads the model's served config to know its task and whether it streams, builds the inputs from the one
serving interface, prints streamed text as it arrives, and turns a server error into one line with the
matching troubleshooting hint."""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from hf2triton.errors import UserError
from hf2triton.serving import interface
from hf2triton.triton import client
from hf2triton.triton.pitfalls import explain


def _server_error(err: Exception, model: str) -> UserError:
    hints = "; ".join(dict.fromkeys(p.fix for p in explain(str(err))))
    return UserError(f"{model}: {err}", hints or "check `make status` and the server log")


def _grpc(url: str):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(url)


def model_facts(grpc_url: str, model: str) -> dict[str, Any]:
    """Task, streaming, max_batch_size of a served model (a clear error when it is not served)."""
    from hf2triton.triton.modelconfig import model_parameters

    triton = _grpc(grpc_url)
    try:
        if not triton.is_server_live():
            raise UserError(f"no server answers at {grpc_url}", "start it with `make serve`")
        config = triton.get_model_config(model).config
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - the server's answer, with its hint
        names = sorted({s["name"] for s in triton.get_inference_statistics(as_json=True).get("model_stats", [])})
        raise UserError(f"model {model!r} is not served at {grpc_url} ({err})", f"use one of: {', '.join(names) or '(none)'}") from None
    finally:
        triton.close()
    params = model_parameters(config)
    return {"task": params.task, "streaming": bool(config.model_transaction_policy.decoupled), "max_batch_size": config.max_batch_size}


def list_models(grpc_url: str) -> list[dict[str, Any]]:
    """The loaded models, from the statistics API (the repository API is admin-only on an hf2triton server)."""
    triton = _grpc(grpc_url)
    try:
        stats = triton.get_inference_statistics(as_json=True).get("model_stats", [])
    except Exception as err:  # noqa: BLE001
        raise UserError(f"no server answers at {grpc_url} ({err})", "start it with `make serve`") from None
    finally:
        triton.close()
    rows = []
    for name in sorted({s["name"] for s in stats}):
        ready = _grpc(grpc_url).is_model_ready(name)
        rows.append({"name": name, "state": "READY" if ready else "UNAVAILABLE", **(model_facts(grpc_url, name) if ready else {})})
    return rows


def infer(
    http_url: str, grpc_url: str, model: str, texts: list[str], options: dict[str, Any], stream: bool, out=sys.stdout
) -> dict[str, Any]:
    """One request for any task; streamed text is written to `out` as it arrives when `stream`."""
    facts = model_facts(grpc_url, model)
    try:
        if facts["task"] == interface.GENERATION and facts["streaming"]:
            if len(texts) != 1:
                raise UserError(f"{model} streams: one prompt per request (got {len(texts)})", "send one TEXT")
            printer = (lambda piece: (out.write(piece), out.flush())) if stream else None
            answer = client.stream_generate(grpc_url, model, texts[0], options, on_piece=printer)
            if stream:
                out.write("\n")
            return {k: answer[k] for k in ("text", "finish_reason", "prompt_tokens", "completion_tokens")}
        import tritonclient.http as httpclient

        result = httpclient.InferenceServerClient(http_url).infer(model, client.build_inputs(httpclient, texts, options or None))
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
    return {"texts": [v.decode() for v in outputs[interface.TEXT_OUTPUT].reshape(-1)]}


def summary(result: dict[str, Any]) -> str:
    """A human line for `infer` without --json."""
    if "embeddings" in result:
        vectors = np.asarray(result["embeddings"])
        return "\n".join(f"[{len(v)} dims] {' '.join(f'{x:.4f}' for x in v[:6])} ... (norm {np.linalg.norm(v):.4f})" for v in vectors)
    if "labels" in result:
        return "\n".join(f"{label} ({score:.4f})" for label, score in zip(result["labels"], result["scores"]))
    if "texts" in result:
        return "\n".join(result["texts"])
    return result["text"]


def chat(grpc_url: str, model: str, options: dict[str, Any], read=input, out=sys.stdout) -> int:
    """A conversation with history; Ctrl-D or Ctrl-C leaves cleanly."""
    facts = model_facts(grpc_url, model)
    if facts["task"] != interface.GENERATION or not facts["streaming"]:
        raise UserError(f"{model} is not a streaming text-generation model", "chat with a text-generation model served with streaming")
    history: list[dict[str, str]] = []
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


def main(args) -> int:
    """Dispatch of the client subcommands (argparse namespace from hf2triton.__main__)."""
    http_url, grpc_url = args.http, args.grpc
    if http_url is None or grpc_url is None:
        from hf2triton.specs import load_project
        from hf2triton.triton.process import Settings

        project = load_project(args.config)
        settings = Settings.of(project.server, project.names, project.work)
        http_url, grpc_url = http_url or settings.url(), grpc_url or settings.url("grpc_port")
    options = {interface.MAX_NEW_TOKENS: args.max_tokens} if getattr(args, "max_tokens", None) else {}
    if args.command == "models":
        rows = list_models(grpc_url)
        if args.json:
            print(json.dumps(rows, indent=1))
        for row in [] if args.json else rows:
            extra = f"{row.get('task', '')}{' (streaming)' if row.get('streaming') else ''}"
            print(f"{row['name']:<24} {row['state']:<12} {extra}")
        return 0
    if args.command == "chat":
        return chat(grpc_url, args.model, options)
    texts = args.text
    result = infer(http_url, grpc_url, args.model, texts, options, stream=getattr(args, "stream", False) and not args.json)
    if args.json:
        print(json.dumps(result, ensure_ascii=False))
    elif not getattr(args, "stream", False) or "text" not in result:
        print(summary(result))
    return 0
