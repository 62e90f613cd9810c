"""Command line: `python -m hf2triton lint MODEL_REPOSITORY` checks any Triton repository (hand-written
ones too) for the load-time pitfalls, without starting a server."""

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
    args = parser.parse_args(argv)

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
