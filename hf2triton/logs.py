"""Logging for pipeline steps: to the rule's log file and to the terminal, with secrets redacted."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

TOKEN_PATTERN = re.compile(r"hf_[A-Za-z0-9]{16,}")
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN")


def without_secrets(env: dict[str, str] | os._Environ) -> dict[str, str]:
    """A copy of `env` without the hub tokens: for the long-running processes (tritonserver, its supervisor, the
    gateway), which never need hub credentials and must not hold them."""
    return {name: value for name, value in env.items() if name not in SECRET_ENV}


LOG_ROTATE_BYTES = 20 * 1024**2  # a log appended to across starts (the gateway's, the supervisor's) is kept below about twice this


def rotate(path: Path, above_bytes: int | None = None) -> None:
    """Before a process starts writing `path`: when it is larger than `above_bytes` (LOG_ROTATE_BYTES unless given; 0:
    whenever it exists), it becomes `path`.1, replacing the one before. The long-running processes' logs would
    otherwise grow without bound."""
    limit = LOG_ROTATE_BYTES if above_bytes is None else above_bytes
    try:
        if path.stat().st_size > limit or limit == 0:
            os.replace(path, path.with_name(f"{path.name}.1"))
    except FileNotFoundError:
        pass


def redact(text: str) -> str:
    """Mask Hugging Face tokens and the values of token environment variables."""
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return TOKEN_PATTERN.sub("hf_***", text)


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup_logging(log_file: Path | str | None = None, level: int = logging.INFO) -> logging.Logger:
    """Send hf2triton's log lines to stderr and (if given) `log_file`; returns the package logger."""
    formatter = RedactingFormatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.WARNING)  # libraries (e.g. the ONNX quantizer) log per tensor at INFO
    logging.getLogger("hf2triton").setLevel(level)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file, mode="w", encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    for noisy in ("urllib3", "filelock", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger("hf2triton")
