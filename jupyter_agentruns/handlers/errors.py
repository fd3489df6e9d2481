"""HTTP statuses for the engine's problems: the one place a domain error becomes an answer."""

from __future__ import annotations

from ..errors import Problem

STATUS = {
    # The request itself.
    "invalid_request": 400,
    "invalid_input": 400,
    "invalid_choice": 400,
    "invalid_cursor": 400,
    "invalid_idempotency_key": 400,
    "request_too_large": 413,
    # Who asks.
    "forbidden": 403,
    # What it names.
    "notebook_tools_unavailable": 404,
    "not_found": 404,
    "run_not_found": 404,
    "unknown_agent": 404,
    "input_not_found": 404,
    "run_expired": 410,
    # The state it meets.
    "run_active": 409,
    "input_resolved": 409,
    "session_busy": 409,
    "cursor_ahead": 409,
    "idempotency_key_reused": 422,
    # Limits.
    "too_many_active_runs": 429,
    "too_many_streams": 429,
    "token_budget_exhausted": 429,
    "storage_quota_exceeded": 429,
    # The server.
    "store_unavailable": 503,
    "shutting_down": 503,
}


def status_of(problem: Problem) -> int:
    """The HTTP status a problem is answered with (500 for a code this table lacks: a bug)."""
    return STATUS.get(problem.code, 500)
