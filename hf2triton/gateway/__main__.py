"""`python -m hf2triton.gateway --grpc HOST:PORT --host H --port P --models a,b --api-key-env NAME`: run the
gateway in the foreground (`make serve` starts it in the background when openai.enabled)."""

from __future__ import annotations

import argparse
import logging
import os


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grpc", required=True, help="tritonserver's gRPC host:port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--models", default="", help="comma-separated model names")
    parser.add_argument("--api-key-env", default="HF2TRITON_API_KEY")
    args = parser.parse_args(argv)
    import uvicorn

    from hf2triton.gateway.app import Gateway, create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    key = os.environ.get(args.api_key_env) or None
    gateway = Gateway(args.grpc, key, [m for m in args.models.split(",") if m])
    logging.getLogger("hf2triton.gateway").info(  # this module runs as __main__
        "gateway on %s:%d for %s, API key %s", args.host, args.port, args.grpc, "required" if key else "off"
    )
    host = args.host.strip("[]")
    uvicorn.run(create_app(gateway), host=host, port=args.port, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
