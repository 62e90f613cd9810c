"""Command line.

    python -m hf2triton lint MODEL_REPOSITORY          check any Triton repository for load-time pitfalls (no server)
    python -m hf2triton models                         what the running server serves (task, streaming)
    python -m hf2triton infer MODEL TEXT [--stream]    one request, any task (--json for the raw answer)
    python -m hf2triton chat MODEL                     a conversation with a streaming generation model
    python -m hf2triton embed MODEL TEXT...            embeddings as JSON

Addresses come from config.yaml (--config) unless --http/--grpc are given."""

from __future__ import annotations

import argparse
import sys

from hf2triton.errors import UserError, exit_on_user_error


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf2triton", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    lint = sub.add_parser("lint", help="statically check a model repository")
    lint.add_argument("repository")
    lint.add_argument("--gpu", action="store_true", help="the server will have a GPU (KIND_GPU allowed)")
    for name, text in (("models", None), ("infer", "+"), ("chat", None), ("embed", "+")):
        command = sub.add_parser(name, help=f"client: {name}")
        command.add_argument("--config", default="config.yaml")
        command.add_argument("--http", help="host:port of Triton's HTTP API (default: from the config)")
        command.add_argument("--grpc", help="host:port of Triton's gRPC API (default: from the config)")
        if name != "models":
            command.add_argument("model")
            command.add_argument("--max-tokens", type=int, help="generation: max_new_tokens")
        if text:
            command.add_argument("text", nargs=text)
        if name in ("models", "infer", "embed"):
            command.add_argument("--json", action="store_true", default=name == "embed", help="print the answer as JSON")
        if name == "infer":
            command.add_argument("--stream", action="store_true", help="print generated text as it arrives")
    args = parser.parse_args(argv)
    if args.command != "lint":
        from hf2triton.triton.commands import main as client_main

        return client_main(args)

    from pathlib import Path

    from hf2triton.triton.install import locate_tritonserver
    from hf2triton.triton.lint import Finding, lint_repository

    if not Path(args.repository).is_dir():
        raise UserError(f"{args.repository} is not a directory", "pass the model repository directory")
    report = lint_repository(args.repository, locate_tritonserver().backends, args.gpu)
    for name, model in report["models"].items():
        findings = [Finding(**f) for f in model["findings"]]
        print(f"{name}: {'ok' if model['ok'] else 'ERRORS'}")
        for finding in findings:
            print(f"  {finding.line()}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
