"""Error codes: one ErrorCode each, each with its HTTP status, the same as the docs and openapi.json say."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import jupyter_agentruns
from jupyter_agentruns import jsonio
from jupyter_agentruns.errors import ErrorCode, Problem
from jupyter_agentruns.handlers.errors import GENERIC_CODES, generic_code, status, status_of

PACKAGE = Path(jupyter_agentruns.__file__).parent
DOCS = PACKAGE.parent / "docs"
# "413 request_too_large", "**422** `idempotency_key_reused`", "`409 {"error": "session_busy"`".
STATUS_AND_CODE = re.compile(r"\b([45]\d\d)\*{0,2}\s+`?([a-z]+_[a-z_]+)`")
NAMED_CODE = re.compile(r'"error":\s*"([a-z_]+)"')


def openapi_codes() -> set[str]:
    """The codes openapi.json lists in its error answers' ``error`` enums."""
    found: set[str] = set()
    stack = [json.loads((PACKAGE / "openapi.json").read_text())]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            error = node.get("properties", {}).get("error")
            if isinstance(error, dict):
                found.update(error.get("enum", []))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def documented_statuses() -> set[tuple[int, str]]:
    """``(status, code)`` as the docs name them together."""
    return {
        (int(found), code)
        for page in DOCS.rglob("*.md")
        for found, code in STATUS_AND_CODE.findall(page.read_text())
        if not code.endswith("_")
    }


def documented_codes() -> set[str]:
    return {code for _, code in documented_statuses()} | {
        code for page in DOCS.rglob("*.md") for code in NAMED_CODE.findall(page.read_text())
    }


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_has_a_status(code):
    assert 400 <= status(code) < 600


def test_every_code_openapi_json_lists_is_an_error_code():
    listed = openapi_codes()
    assert listed, "openapi.json lists no error codes"
    assert not listed - set(ErrorCode), sorted(listed - set(ErrorCode))


def test_every_code_the_docs_name_is_an_error_code_with_their_status():
    named = documented_codes()
    assert {"idempotency_key_reused", "session_busy", "store_unavailable"} <= named
    assert not named - set(ErrorCode), sorted(named - set(ErrorCode))
    wrong = {
        (said, code) for said, code in documented_statuses() if status(ErrorCode(code)) != said
    }
    assert not wrong, f"the docs give these codes another status: {sorted(wrong)}"


def test_tornados_own_errors_get_the_code_of_their_status():
    for code_status, code in GENERIC_CODES.items():
        assert status(code) == code_status
    assert (generic_code(400), generic_code(405)) == ("bad_request", "method_not_allowed")
    assert (generic_code(502), generic_code(401)) == ("server_error", "http_error")


def test_a_problem_answers_with_its_code_as_text():
    problem = Problem(ErrorCode.SESSION_BUSY, "Busy.", active_run_id="run_a")
    assert status_of(problem) == 409
    assert str(problem) == "session_busy: Busy."
    assert jsonio.dumps(problem.body()) == (
        '{"error": "session_busy", "message": "Busy.", "active_run_id": "run_a"}'
    )
