"""HTTP statuses for the engine's problems: the one place a domain error becomes an answer.

Every ``ErrorCode`` has its status in ``status`` (mypy checks that none is
left out); tornado's own errors (a malformed request, a method an endpoint
lacks, a failure) are answered with the code of their status in
``GENERIC_CODES``; a store that cannot be reached is answered as a
``store_unavailable`` problem, a request while the server stops as ``shutting_down``.
"""

from __future__ import annotations

from typing import NoReturn

from ..errors import ErrorCode, Problem
from ..store import StoreRefused, StoreUnavailable

# The code of an error tornado raised itself (an HTTPError), by its status.
GENERIC_CODES = {
    400: ErrorCode.BAD_REQUEST,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.REQUEST_TOO_LARGE,
}
# Tornado's errors of any other status: these two words, never a problem's.
SERVER_ERROR = "server_error"
HTTP_ERROR = "http_error"


def status(code: ErrorCode) -> int:
    """The HTTP status a code is answered with."""
    match code:
        # The request itself.
        case (
            ErrorCode.INVALID_REQUEST
            | ErrorCode.INVALID_INPUT
            | ErrorCode.INVALID_CHOICE
            | ErrorCode.INVALID_CURSOR
            | ErrorCode.INVALID_IDEMPOTENCY_KEY
            | ErrorCode.BAD_REQUEST
        ):
            return 400
        case ErrorCode.METHOD_NOT_ALLOWED:
            return 405
        case ErrorCode.REQUEST_TOO_LARGE:
            return 413
        # Who asks.
        case ErrorCode.FORBIDDEN:
            return 403
        # What it names.
        case (
            ErrorCode.NOTEBOOK_TOOLS_UNAVAILABLE
            | ErrorCode.NOT_FOUND
            | ErrorCode.RUN_NOT_FOUND
            | ErrorCode.UNKNOWN_AGENT
            | ErrorCode.INPUT_NOT_FOUND
            | ErrorCode.EDIT_NOT_FOUND
            | ErrorCode.HOOK_NOT_FOUND
            | ErrorCode.SCHEDULE_NOT_FOUND
        ):
            return 404
        case ErrorCode.RUN_EXPIRED:
            return 410
        # The state it meets.
        case (
            ErrorCode.RUN_ACTIVE
            | ErrorCode.INPUT_RESOLVED
            | ErrorCode.EDIT_CONFLICT
            | ErrorCode.SESSION_BUSY
            | ErrorCode.CURSOR_AHEAD
        ):
            return 409
        case ErrorCode.IDEMPOTENCY_KEY_REUSED | ErrorCode.FORK_UNSUPPORTED:
            return 422
        # Limits.
        case (
            ErrorCode.TOO_MANY_ACTIVE_RUNS
            | ErrorCode.TOO_MANY_STREAMS
            | ErrorCode.TOKEN_BUDGET_EXHAUSTED
            | ErrorCode.STORAGE_QUOTA_EXCEEDED
        ):
            return 429
        # The server.
        case ErrorCode.STORE_UNAVAILABLE | ErrorCode.SHUTTING_DOWN:
            return 503
        case _:
            _unreachable(code)


def _unreachable(code: NoReturn) -> NoReturn:
    # mypy refuses a call with a code no case above took (typing.assert_never, before 3.11).
    raise AssertionError(f"no HTTP status for {code!r}")


def status_of(problem: Problem) -> int:
    """The HTTP status a problem is answered with."""
    return status(problem.code)


def generic_code(status_code: int) -> str:
    """The code of an error tornado raised itself (not a problem), by its status."""
    code = GENERIC_CODES.get(status_code)
    if code is not None:
        return code.value
    return SERVER_ERROR if status_code >= 500 else HTTP_ERROR


def shutting_down() -> Problem:
    """The answer to a request that comes, or outlives its grace, while the server stops."""
    return Problem(
        ErrorCode.SHUTTING_DOWN,
        "The server is stopping. Try again in a few seconds, once it (or another server "
        "sharing its store) is back: runs and their events are kept, streams resume from "
        "their cursors.",
        retry_after=5,
    )


def store_unavailable(reason: StoreUnavailable) -> Problem:
    """The answer to a store that cannot be reached, or refuses what this server needs."""
    if isinstance(reason, StoreRefused):
        return Problem(ErrorCode.STORE_UNAVAILABLE, f"{str(reason)[0].upper()}{str(reason)[1:]}.")
    return Problem(
        ErrorCode.STORE_UNAVAILABLE,
        f"The agentruns database cannot be reached just now ({reason}). Try again in a few "
        "seconds (a submit with the same Idempotency-Key never makes two runs).",
        retry_after=5,
    )
