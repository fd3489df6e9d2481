"""Errors the API answers with: a status, a code a client can branch on, a message a person can act on."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from tornado.web import HTTPError

# Absolute file paths in error messages: they say where the server keeps things.
# Not inside a URL: "https://host/a/b" keeps its path.
_PATH = re.compile(r"(?<![\w:/.~-])(?:[A-Za-z]:)?(?:[\\/][\w.~-]+){2,}[\\/]?")


class ApiError(HTTPError):
    """An error answered as JSON ``{"error": code, "message": message, **extra}``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ):
        super().__init__(status)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.extra}


def run_not_found(run_id: str) -> ApiError:
    return ApiError(404, "run_not_found", f"No run {run_id!r} exists for you.")


def invalid_request(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


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
