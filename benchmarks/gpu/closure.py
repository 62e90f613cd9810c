"""The installed distributions ROOTS need (their requirements' closure, extras "", grpc and http), one `name==version`
per line, as installed here (= the pins); `--minus ROOT...`: less the closure of those (what another call set
carries already). prepare.sh and prepare_clients.sh read it."""

from __future__ import annotations

import re
import sys
from importlib import metadata

from packaging.requirements import Requirement


def closure(roots: list[str]) -> dict[str, str]:
    """name -> installed version of `roots` and everything they require, following the extras a requirement names
    (guidellm's `httpx[http2]` brings h2)."""
    seen: dict[str, str] = {}
    done: set[tuple[str, str]] = set()
    stack = [(name, "") for name in roots]
    while stack:
        name, extra = stack.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if (key, extra) in done:
            continue
        done.add((key, extra))
        dist = metadata.distribution(name)
        seen[key] = dist.version
        extras = ("", "grpc", "http", extra) if extra else ("", "grpc", "http")
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras):
                stack.append((req.name, ""))
                stack.extend((req.name, wanted) for wanted in req.extras)
    return seen


def main(argv: list[str]) -> None:
    roots, minus = (argv[: argv.index("--minus")], argv[argv.index("--minus") + 1 :]) if "--minus" in argv else (argv, [])
    carried = closure(minus)
    for key, version in sorted(closure(roots).items()):
        if key not in carried:
            print(f"{key}=={version}")


if __name__ == "__main__":
    main(sys.argv[1:])
