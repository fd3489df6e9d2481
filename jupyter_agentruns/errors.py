"""Errors the API answers with: a code a client can branch on, a message a person can act on."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from typing import Any

# Absolute file paths in error messages: they say where the server keeps things.
# Not inside a URL: "https://host/a/b" keeps its path.
_PATH = re.compile(r"(?<![\w:/.~-])(?:[A-Za-z]:)?(?:[\\/][\w.~-]+){2,}[\\/]?")


class ErrorCode(str, enum.Enum):
    """Every ``error`` an answer of the API carries: what a client branches on.

    A ``str`` (the package runs on Python 3.10, before ``StrEnum``): a code
    compares equal to its text and is written as it in JSON. Each has one
    HTTP status (``handlers/errors.py``, checked by mypy to cover them all).
    """

    # The request itself.
    INVALID_REQUEST = "invalid_request"
    INVALID_INPUT = "invalid_input"
    INVALID_CHOICE = "invalid_choice"
    INVALID_CURSOR = "invalid_cursor"
    INVALID_IDEMPOTENCY_KEY = "invalid_idempotency_key"
    BAD_REQUEST = "bad_request"  # tornado's own 400 (a malformed request line or argument)
    METHOD_NOT_ALLOWED = "method_not_allowed"
    REQUEST_TOO_LARGE = "request_too_large"
    # Who asks.
    FORBIDDEN = "forbidden"
    # What it names.
    NOTEBOOK_TOOLS_UNAVAILABLE = "notebook_tools_unavailable"
    NOT_FOUND = "not_found"
    RUN_NOT_FOUND = "run_not_found"
    UNKNOWN_AGENT = "unknown_agent"
    INPUT_NOT_FOUND = "input_not_found"
    EDIT_NOT_FOUND = "edit_not_found"
    HOOK_NOT_FOUND = "hook_not_found"
    SCHEDULE_NOT_FOUND = "schedule_not_found"
    RUN_EXPIRED = "run_expired"
    # The state it meets.
    RUN_ACTIVE = "run_active"
    INPUT_RESOLVED = "input_resolved"
    EDIT_CONFLICT = "edit_conflict"
    SESSION_BUSY = "session_busy"
    CURSOR_AHEAD = "cursor_ahead"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    FORK_UNSUPPORTED = "fork_unsupported"
    # Limits.
    TOO_MANY_ACTIVE_RUNS = "too_many_active_runs"
    TOO_MANY_STREAMS = "too_many_streams"
    TOKEN_BUDGET_EXHAUSTED = "token_budget_exhausted"
    STORAGE_QUOTA_EXCEEDED = "storage_quota_exceeded"
    # The server.
    STORE_UNAVAILABLE = "store_unavailable"
    SHUTTING_DOWN = "shutting_down"

    def __str__(self) -> str:
        return self.value


class Problem(Exception):
    """Why a request cannot be done: a ``code`` to branch on, a ``message`` a person can act on.

    ``extra`` fields go into the answer beside them; ``retry_after`` says in
    how many seconds trying again may help. Nothing here knows HTTP: the
    handlers map each code to a status (``handlers/errors.py``).
    """

    def __init__(
        self, code: ErrorCode, message: str, *, retry_after: int | None = None, **extra: Any
    ):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.extra = extra

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def body(self) -> dict[str, Any]:
        return {"error": self.code.value, "message": self.message, **self.extra}


def run_not_found(run_id: str) -> Problem:
    return Problem(ErrorCode.RUN_NOT_FOUND, f"No run {run_id!r} exists for you.")


def invalid_request(message: str, **extra: Any) -> Problem:
    return Problem(ErrorCode.INVALID_REQUEST, message, **extra)


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
