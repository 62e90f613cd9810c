"""Command line.

    python -m hf2triton lint MODEL_REPOSITORY          check any Triton repository for load-time pitfalls (no server)
    python -m hf2triton models                         what the running server serves (task, streaming)
    python -m hf2triton infer MODEL TEXT [--stream]    one request, any task (--json for the raw answer; a tagger,
                                                       fill-mask: the pipeline's JSON, --aggregation-strategy, --stride, --top-k;
                                                       a reranker: --query, the TEXTs are its documents)
                                                       fill-mask: the pipeline's JSON, --aggregation-strategy, --top-k;
                                                       a reranker: --query, the TEXTs are its documents;
                                                       an embedder: --prompt-name, one of its prompts)
    python -m hf2triton infer MODEL IMAGE_FILE...      an image model: each file's labels (--top-k, --function-to-apply;
                                                       zero-shot: --labels 'cat,dog' and --hypothesis-template)
    python -m hf2triton infer MODEL AUDIO_FILE...      a speech model (Whisper): each file's text (--language, --task
                                                       transcribe|translate, --timestamps, --word-timestamps, --prompt)
    python -m hf2triton chat MODEL                     a conversation with a streaming generation model
    python -m hf2triton embed MODEL TEXT...            embeddings as JSON (--prompt-name: one of the model's prompts)
    python -m hf2triton key                            where the client key is (curl needs it), never the key
    python -m hf2triton replica S3_URL --work DIR      serve a published repository (make publish) with a
                                                       tritonserver of its own (--http-port etc.), validated
    python -m hf2triton stop                           stop this project's supervisors, gateways and tritonserver,
                                                       whatever the config says (`make stop` when snakemake's fails)

Addresses: --grpc HOST:PORT alone is enough; without it they come from the config (--config, default
$HF2TRITON_CONFIG or ./config.yaml). --http (optional) sends non-streaming requests over HTTP."""

from __future__ import annotations

import argparse
import signal
import sys

from hf2triton.errors import UserError, exit_on_user_error
from hf2triton.serving.interface import AGGREGATION_STRATEGIES, FUNCTIONS_TO_APPLY, SPEECH_TASKS


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (0 or less is a mistake, not "the default")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value}); leave it out for the model's default")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (1-65535)")
    return value


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf2triton", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    lint = sub.add_parser("lint", help="statically check a model repository")
    lint.add_argument("repository")
    lint.add_argument("--gpu", action="store_true", help="the server will have a GPU (KIND_GPU allowed)")
    config_help = "config file for the addresses (default: $HF2TRITON_CONFIG, else ./config.yaml)"
    key = sub.add_parser("key", help="where the client key tritonserver requires is (never the key), with a curl example")
    key.add_argument("--config", help=config_help)
    key.add_argument("--new", action="store_true", help="write a new key (running servers take it at their next `make serve`)")
    for name, text in (("models", None), ("infer", "+"), ("chat", None), ("embed", "+")):
        command = sub.add_parser(name, help=f"client: {name}")
        command.add_argument("--config", help=config_help)
        command.add_argument("--http", help="host:port of Triton's HTTP API (optional: non-streaming requests then use HTTP)")
        command.add_argument("--grpc", help="host:port of Triton's gRPC API (enough on its own; default: from the config)")
        if name != "models":
            command.add_argument("model")
        if name in ("infer", "chat"):
            command.add_argument("--max-tokens", type=positive_int, help="generation: max_new_tokens (default: the model's)")
            command.add_argument("--temperature", type=float, help="generation, speech: sampling temperature (0: greedy)")
            command.add_argument("--top-p", type=float, help="generation: nucleus sampling (0 < p <= 1)")
            command.add_argument("--seed", type=int, help="generation: sampling seed (the same seed, the same answer)")
            command.add_argument("--stop", action="append", help="generation: stop at this text (repeat for several)")
            command.add_argument("--json-schema", metavar="FILE", help="generation: the answer is JSON valid against this schema file")
            command.add_argument("--regex", help="generation: the answer matches this regular expression (constrained decoding)")
        if name == "chat":
            command.add_argument("--system", help="a system prompt that starts the conversation")
        if text:
            command.add_argument("text", nargs=text)
        if name in ("models", "infer", "embed"):
            command.add_argument("--json", action="store_true", default=name == "embed", help="print the answer as JSON")
        if name == "infer":
            command.add_argument("--stream", action="store_true", help="print generated text as it arrives")
            joined = "token-classification: how tokens join into entities (default simple)"
            command.add_argument("--aggregation-strategy", choices=AGGREGATION_STRATEGIES, help=joined)
            windows = (
                "token-classification: tokens shared by the windows of a text longer than the context (-1: truncate; default the model's)"
            )
            command.add_argument("--stride", type=int, help=windows)
            command.add_argument(
                "--top-k",
                type=positive_int,
                help="fill-mask: candidates per text (1-50, default 5); image-classification: labels per image (default 5)",
            )
            command.add_argument(
                "--function-to-apply", choices=FUNCTIONS_TO_APPLY, help="image-classification: the pipeline's score function"
            )
            command.add_argument("--labels", help="zero-shot-image-classification: the candidate labels, comma-separated")
            command.add_argument(
                "--hypothesis-template",
                help="zero-shot-image-classification: the text each label goes in (default 'This is a photo of {}.')",
            )
            command.add_argument("--query", help="text-ranking: the query the TEXTs (documents) are scored against")
            command.add_argument("--language", help="automatic-speech-recognition: the audio's language (en, english; default: detected)")
            command.add_argument("--task", choices=SPEECH_TASKS, help="automatic-speech-recognition: transcribe, or translate to English")
            command.add_argument("--timestamps", action="store_true", help="automatic-speech-recognition: each file's timestamped chunks")
            command.add_argument("--word-timestamps", action="store_true", help="automatic-speech-recognition: each file's words, timed")
            command.add_argument("--prompt", help="automatic-speech-recognition: text the transcript continues (spellings, names, style)")
        if name in ("infer", "embed"):
            prompt = "feature-extraction: the model's prompt to start each TEXT with (e.g. query; default: its default_prompt_name)"
            command.add_argument("--prompt-name", help=prompt)
    replica = sub.add_parser("replica", help="fetch a published repository (make publish) and serve it with a tritonserver of its own")
    replica.add_argument("url", help="publish.url: s3://BUCKET/PREFIX")
    replica.add_argument("--work", required=True, help="this replica's directory (the fetched repository, server state, report)")
    replica.add_argument("--endpoint-url", default="", help="an S3-compatible server (default: AWS); credentials: AWS_* environment")
    replica.add_argument("--region", default="us-east-1")
    replica.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    for flag, port in (("--http-port", 8000), ("--grpc-port", 8001), ("--metrics-port", 8002)):
        replica.add_argument(flag, type=port_number, default=port)
    replica.add_argument("--stop", action="store_true", help="stop this replica's server")
    stop = sub.add_parser("stop", help="stop what serves this project (the current directory), whatever the config says")
    configured_work = "a config file whose paths.work is stopped too, if it loads (default: $HF2TRITON_CONFIG, else ./config.yaml)"
    stop.add_argument("--config", help=configured_work)
    args = parser.parse_args(argv)
    if args.command == "stop":
        from hf2triton.pipeline.serve import stop_project

        stop_project(args.config)
        return 0
    if args.command == "replica":
        from hf2triton.deploy.publish import replica_main

        return replica_main(args)
    if args.command != "lint":
        from hf2triton.triton.commands import main as client_main

        # Ctrl-C is how a stream or a chat answer is stopped (KeyboardInterrupt cancels it on the server). A program
        # started with SIGINT ignored -- a background job of a non-interactive shell (`cmd &` in a script, CI
        # runners) -- gets no KeyboardInterrupt from Python: take SIGINT back, as Go's signal.Notify does.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return client_main(args)
        except KeyboardInterrupt:  # Ctrl-C: the stream was cancelled on the server (client.stream_generate)
            print("\n[stopped]", file=sys.stderr)
            return 130

    from pathlib import Path

    from hf2triton.triton.install import locate_tritonserver
    from hf2triton.triton.lint import Finding, lint_repository

    repository = Path(args.repository)
    if not repository.is_dir():
        raise UserError(f"{args.repository} is not a directory", "pass the model repository directory")
    if (repository / "config.pbtxt").is_file():
        raise UserError(f"{args.repository} is a model directory, not a repository", f"pass its parent: {repository.resolve().parent}")
    report = lint_repository(repository, locate_tritonserver().backends, args.gpu)
    if not report["models"]:
        raise UserError(
            f"{args.repository} holds no model directories: nothing to lint",
            "pass the model repository (one directory per model, each with its config.pbtxt)",
        )
    for name, model in report["models"].items():
        findings = [Finding(**f) for f in model["findings"]]
        print(f"{name}: {'ok' if model['ok'] else 'ERRORS'}")
        for finding in findings:
            print(f"  {finding.line()}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
