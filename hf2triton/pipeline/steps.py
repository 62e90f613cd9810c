"""Glue between Snakemake `script:` adapters and the package: logging, user errors, exit codes."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from hf2triton.errors import UserError
from hf2triton.logs import redact, setup_logging


def run_step(smk: Any, func: Callable[..., Any], **kwargs: Any) -> Any:
    """Call `func(**kwargs)` with logging set up for the rule `smk` describes.

    A UserError ends the job with one clear line (no traceback); anything else is a bug: its traceback goes to the
    rule's log and the terminal, redacted (a library's message may quote a URL or header with a token).
    """
    log_file = smk.log[0] if len(smk.log) else None
    log = setup_logging(log_file)
    started = time.monotonic()
    name = getattr(smk, "rule", func.__name__)
    try:
        result = func(**kwargs)
    except UserError as err:
        log.error(err.render())
        print(f"hf2triton: error in {name}: {redact(err.render())}", file=sys.stderr, flush=True)
        logging.shutdown()
        raise SystemExit(1) from None
    except Exception:  # noqa: BLE001 - a bug: kept whole in the log, never with a token in it
        log.exception("%s failed (a bug: please report it with this log)", name)  # the log's formatter redacts
        logging.shutdown()
        raise SystemExit(1) from None
    log.info("%s done in %.1f s", name, time.monotonic() - started)
    return result
