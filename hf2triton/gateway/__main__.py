"""`python -m hf2triton.gateway --grpc HOST:PORT[,HOST:PORT...] [--http HOST:PORT] --host H --port P --models a,b --api-key-env NAME
[--allowed-hosts a,b] [--allowed-origins o1,o2] [--max-embedding-inputs N] [--request-timeout-s S] [--max-audio-upload-mib M]
[--workers N]`:
run the gateway in the foreground (`make serve` starts it in the background when openai.enabled). Several --grpc
addresses are replicas of one repository: requests are spread over them (gRPC round_robin)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

ARGV_ENV = "HF2TRITON_GATEWAY_ARGV"  # how uvicorn's worker processes get the command line (they import app_factory)


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    from hf2triton.gateway.boundary import MAX_AUDIO_UPLOAD_MIB

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grpc", required=True, help="tritonserver's gRPC host:port (several, comma-separated: replicas)")
    parser.add_argument(
        "--http", default=None, help="tritonserver's HTTP host:port: generation streams read from its event stream instead of gRPC",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--models", default="", help="comma-separated model names")
    parser.add_argument("--api-key-env", default="HF2TRITON_API_KEY")
    parser.add_argument("--allowed-hosts", default="", help="host names to answer under besides loopback and this machine's")
    parser.add_argument("--allowed-origins", default="", help="web origins (scheme://host[:port]) allowed to call from a browser")
    parser.add_argument("--max-embedding-inputs", type=int, default=None, help="texts per /v1/embeddings request (default: the model's)")
    parser.add_argument("--request-timeout-s", type=float, default=30.0, help="seconds a client has to send its request body")
    parser.add_argument(
        "--max-audio-upload-mib", type=int, default=MAX_AUDIO_UPLOAD_MIB, choices=range(1, 1025), metavar="1..1024",
        help="MiB an audio endpoint's form may have (JSON bodies: 8 MiB)",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, choices=range(1, 65), metavar="1..64", help="processes sharing the port")
    return parser.parse_args(argv)


def build(args: argparse.Namespace):
    """The app for these arguments (the API key from its environment variable, read here, never passed)."""
    from hf2triton.gateway.app import create_app
    from hf2triton.gateway.backend import Gateway
    from hf2triton.gateway.boundary import served_names

    key = os.environ.get(args.api_key_env) or None
    gateway = Gateway(args.grpc, key, _names(args.models), args.max_embedding_inputs, args.http)
    hosts = served_names(args.host.strip("[]"), _names(args.allowed_hosts))
    return create_app(gateway, hosts, _names(args.allowed_origins), args.request_timeout_s, args.max_audio_upload_mib), hosts


def app_factory():
    """uvicorn's entry in each worker process (--workers > 1)."""
    return build(parse(json.loads(os.environ[ARGV_ENV])))[0]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app, hosts = build(args)
    except ValueError as err:  # a --grpc address that is not host:port, or cannot be resolved
        print(f"hf2triton gateway: {err}", file=sys.stderr)
        return 2
    key_note = "required" if os.environ.get(args.api_key_env) else "off"
    logging.getLogger("hf2triton.gateway").info(  # this module runs as __main__
        "gateway on %s:%d for %s, %d process(es), API key %s, host names %s",
        args.host, args.port, args.grpc, args.workers, key_note, ", ".join(sorted(hosts)),
    )  # fmt: skip
    options = {"host": args.host.strip("[]"), "port": args.port, "log_level": "warning", "access_log": False}
    options["timeout_graceful_shutdown"] = 5
    options["http"] = "hf2triton.gateway.connections:GuardedHttpTools"  # header deadline, per-client bound
    if args.workers == 1:
        uvicorn.run(app, **options)
    else:  # uvicorn's workers import the app by name: the command line reaches them through the environment
        os.environ[ARGV_ENV] = json.dumps(argv)
        uvicorn.run("hf2triton.gateway.__main__:app_factory", factory=True, workers=args.workers, **options)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
