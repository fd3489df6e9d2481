"""Errors the API answers with: a code a client can branch on, a message a person can act on."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# Absolute file paths in error messages: they say where the server keeps things.
# Not inside a URL: "https://host/a/b" keeps its path.
_PATH = re.compile(r"(?<![\w:/.~-])(?:[A-Za-z]:)?(?:[\\/][\w.~-]+){2,}[\\/]?")


class Problem(Exception):
    """Why a request cannot be done: a ``code`` to branch on, a ``message`` a person can act on.

    ``extra`` fields go into the answer beside them; ``retry_after`` says in
    how many seconds trying again may help. Nothing here knows HTTP: the
    handlers map each code to a status (``handlers/errors.py``).
    """

    def __init__(self, code: str, message: str, *, retry_after: int | None = None, **extra: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.extra = extra

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.extra}


def run_not_found(run_id: str) -> Problem:
    return Problem("run_not_found", f"No run {run_id!r} exists for you.")


def invalid_request(message: str, **extra: Any) -> Problem:
    return Problem("invalid_request", message, **extra)


def refuse_unknown_fields(body: dict[str, Any], allowed: Iterable[str]) -> None:
    """400 ``invalid_request`` naming the fields of ``body`` that are not ``allowed``."""
    allowed = list(allowed)
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise invalid_request(
            f"Unknown field(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}."
        )


def error_object(exc: BaseException) -> dict[str, str]:
    """``{type, message}`` for a failed run or tool call: no traceback, no server paths.

    The type is the exception's ``error_type`` (a str attribute) if it has one, else its class name.
    """
    message = _PATH.sub("<path>", str(exc))[:2000]
    error_type = getattr(exc, "error_type", None)
    return {
        "type": error_type if isinstance(error_type, str) else type(exc).__name__,
        "message": message,
    }
