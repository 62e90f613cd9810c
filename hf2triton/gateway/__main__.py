"""`python -m hf2triton.gateway --grpc HOST:PORT --host H --port P --models a,b --api-key-env NAME
[--allowed-hosts a,b] [--allowed-origins o1,o2] [--max-embedding-inputs N] [--request-timeout-s S]`: run the
gateway in the foreground (`make serve` starts it in the background when openai.enabled)."""

from __future__ import annotations

import argparse
import logging
import os


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grpc", required=True, help="tritonserver's gRPC host:port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--models", default="", help="comma-separated model names")
    parser.add_argument("--api-key-env", default="HF2TRITON_API_KEY")
    parser.add_argument("--allowed-hosts", default="", help="host names to answer under besides loopback and this machine's")
    parser.add_argument("--allowed-origins", default="", help="web origins (scheme://host[:port]) allowed to call from a browser")
    parser.add_argument("--max-embedding-inputs", type=int, default=None, help="texts per /v1/embeddings request (default: the model's)")
    parser.add_argument("--request-timeout-s", type=float, default=30.0, help="seconds a client has to send its request body")
    args = parser.parse_args(argv)
    import uvicorn

    from hf2triton.gateway.app import Gateway, create_app, served_names

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    key = os.environ.get(args.api_key_env) or None
    gateway = Gateway(args.grpc, key, _names(args.models), args.max_embedding_inputs)
    host = args.host.strip("[]")
    hosts = served_names(host, _names(args.allowed_hosts))
    key_note = "required" if key else "off"
    logging.getLogger("hf2triton.gateway").info(  # this module runs as __main__
        "gateway on %s:%d for %s, API key %s, host names %s", args.host, args.port, args.grpc, key_note, ", ".join(sorted(hosts))
    )
    app = create_app(gateway, hosts, _names(args.allowed_origins), args.request_timeout_s)
    uvicorn.run(app, host=host, port=args.port, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
