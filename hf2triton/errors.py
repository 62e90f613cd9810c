"""User-facing errors: one line that names what is wrong and how to fix it, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import TypeVar

F = TypeVar("F", bound=Callable)


class UserError(Exception):
    """A mistake the user can fix (bad config, busy port, missing file). Printed without traceback."""

    def __init__(self, message: str, fix: str | None = None):
        self.message = message
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        return f"{self.message} -- fix: {self.fix}" if self.fix else self.message


def exit_on_user_error(func: F) -> F:
    """Run `func`; turn a UserError into one line on stderr and exit status 1."""

    @wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except UserError as err:
            print(f"hf2triton: error: {err.render()}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None

    return wrapper  # type: ignore[return-value]
