"""Talking to the model server: retries, its errors in words a user can act on, the key masked."""

from __future__ import annotations

import ast
import json
import math
import os
import random
import re
from typing import Any
from urllib.parse import urlsplit

import httpx

from .errors import (
    UpstreamAuth,
    UpstreamError,
    UpstreamProtocol,
    UpstreamRateLimit,
    UpstreamTimeout,
    UpstreamUnreachable,
)

# Sent when the configured environment variable is unset: local servers want no
# key, but the SDK (and some servers) insist on an Authorization header.
NO_KEY = "no-key"
# A server asking to wait longer than this (Retry-After) is waited for this long.
MAX_RETRY_DELAY = 60.0
UPSTREAM_TEXT_LIMIT = 500


def retryable(exc: Exception) -> bool:
    """Worth another try: the request never got an answer, or a busy (429) or failing (5xx) one.

    Not a 5xx that says the request is invalid: some servers (llama-cpp-python)
    answer 500 to what they cannot validate, and the same request fails again.
    """
    import openai  # not at the top: see OpenAIAgent.__call__

    if isinstance(exc, openai.APITimeoutError):
        return False  # another wait of request_timeout would rarely end otherwise
    if isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
        return True
    return isinstance(exc, openai.APIStatusError) and (
        exc.status_code == 429 or (exc.status_code >= 500 and not says_invalid(exc))
    )


def says_invalid(exc: Exception) -> bool:
    """The server's error says the request itself is wrong."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and body.get("type") == "invalid_request_error":
        return True
    return bool(validation_errors(server_words(body)))


def retry_delay(exc: Exception, backoff: float) -> float:
    """The server's Retry-After if it gives one, else ``backoff`` with jitter; at most a minute."""
    response = getattr(exc, "response", None)
    try:
        delay = float(response.headers["retry-after"]) if response is not None else None
    except (KeyError, ValueError):
        delay = None
    # "nan" and "inf" parse as floats: a NaN sleep would corrupt the event loop's timers.
    if delay is None or not math.isfinite(delay) or delay < 0:
        delay = backoff * random.uniform(0.75, 1.0)
    return round(min(delay, MAX_RETRY_DELAY), 3)


def upstream_error(
    exc: Exception, attempts: int, *, base_url: str, api_key_env: str, request_timeout: float
) -> UpstreamError:
    """What went wrong, in words a user can act on, with no secret in them."""
    import openai  # not at the top: see OpenAIAgent.__call__

    where = server_name(base_url)
    key = os.environ.get(api_key_env) or ""
    if isinstance(exc, UpstreamError):  # it may quote what the server sent
        return type(exc)(scrub(str(exc), key))
    if isinstance(exc, json.JSONDecodeError):
        return UpstreamProtocol(
            f"the model server at {where} sent a chunk that is not JSON ({exc.msg}): "
            f"{shorten(scrub(exc.doc, key))}"
        )
    if isinstance(exc, openai.APITimeoutError):
        return UpstreamTimeout(
            f"the model server at {where} sent nothing for {request_timeout:g} s "
            "(c.OpenAIAgent.request_timeout)"
        )
    if isinstance(exc, openai.APIConnectionError):
        cause = scrub(str(exc.__cause__ or exc), key) or type(exc.__cause__).__name__
        return UpstreamUnreachable(f"cannot talk to the model server at {where}: {cause}")
    if isinstance(exc, httpx.TransportError):
        # A connection that broke mid-stream: some SDK versions pass httpx's error on as is.
        cause = scrub(str(exc), key) or type(exc).__name__
        return UpstreamUnreachable(f"the connection to the model server at {where} broke: {cause}")
    said = scrub(upstream_message(exc), key)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status in (401, 403):
            hint = (
                f"check the key in the environment variable {api_key_env}"
                if key
                else f"the environment variable {api_key_env} (c.OpenAIAgent.api_key_env) is not set"
            )
            return UpstreamAuth(
                f"the model server at {where} refused the API key ({status}: {said}); {hint}"
            )
        if status == 429:
            return UpstreamRateLimit(
                f"the model server at {where} is rate limiting this key (429 after {attempts} "
                f"attempt{'s' if attempts > 1 else ''}): {said}"
            )
        return UpstreamError(f"the model server at {where} answered {status}: {said}")
    return UpstreamError(f"the model server at {where} reported an error: {said}")


def upstream_message(exc: Exception) -> str:
    """The server's own words from an error body, else the SDK's.

    A list of validation errors is told as where and what is wrong, so that
    shortening the message (``UPSTREAM_TEXT_LIMIT``) cannot cut that part off.
    """
    said = server_words(getattr(exc, "body", None))
    errors = validation_errors(said)
    if errors:
        return validation_summary(errors)
    if isinstance(said, str) and said:
        return said
    return getattr(exc, "message", None) or str(exc)


def server_words(body: Any) -> Any:
    """The message in an error body, a text or FastAPI's list of validation errors.

    OpenAI's and llama-cpp-python's ``error.message`` (the SDK unwraps
    ``error``), Ollama's ``error``, FastAPI's ``detail``.
    """
    if isinstance(body, dict):
        said = body.get("message") or body.get("error") or body.get("detail")
        return said.get("message") if isinstance(said, dict) else said
    return body


# A pydantic validation error as FastAPI writes it into a text, one per line:
# {'type': 'string_type', 'loc': ('body', 'messages', 1, ...), 'msg': '...', 'input': ...}
_VALIDATION_TEXT = re.compile(r"^\d+ validation errors?:")
_VALIDATION_LINE = re.compile(
    r"""\{'type': '(?P<type>\w+)', 'loc': (?P<loc>\([^()]*\)), """
    r"""'msg': (?P<msg>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
)


def validation_errors(said: Any) -> list[dict[str, Any]]:
    """The ``{type, loc, msg}`` of each validation error in a FastAPI ``detail`` or error text."""
    if isinstance(said, list):
        return [
            error
            for error in said
            if isinstance(error, dict)
            and isinstance(error.get("loc"), list | tuple)
            and isinstance(error.get("msg"), str)
        ]
    if not isinstance(said, str) or not _VALIDATION_TEXT.match(said):
        return []
    errors = []
    for line in said.splitlines()[1:]:
        found = _VALIDATION_LINE.search(line)
        if found is None:
            continue
        try:
            loc, msg = ast.literal_eval(found["loc"]), ast.literal_eval(found["msg"])
        except (ValueError, SyntaxError):  # not the shape it looks like
            continue
        errors.append({"type": found["type"], "loc": loc, "msg": msg})
    return errors


def validation_summary(errors: list[dict[str, Any]]) -> str:
    """``invalid request (N validation errors): where: what; …`` for the errors that matter.

    A message that fits none of a union's members (the kinds of chat message)
    gets an error from each; the members whose tag (a literal, such as the
    ``role``) did not match are not what the request meant, so their errors are
    left out. When no member's tag matched, the tags are what is wrong.
    """
    unmeant = {tuple(error["loc"][:-1]) for error in errors if error.get("type") == "literal_error"}
    meant = [
        error
        for error in errors
        if not any(tuple(error["loc"][: len(member)]) == member for member in unmeant)
    ]
    told = [
        f"{'.'.join(str(part) for part in error['loc'] if part != 'body')}: {error['msg']}"
        for error in meant or [error for error in errors if error.get("type") == "literal_error"]
    ]
    count = f"{len(errors)} validation error{'s' if len(errors) > 1 else ''}"
    return f"invalid request ({count}): {'; '.join(told)}"


# A part of the key this long is a secret wherever it shows up.
KEY_FRAGMENT = 8
_SECRET_SHAPES = [
    # Authorization headers and bearer tokens an upstream error echoes back.
    (
        re.compile(
            r"(?i)\b(authorization[\"']?\s*[:=]\s*[\"']?)(?:bearer\s+|token\s+)?[^\s\"',;]+"
        ),
        r"\1***",
    ),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1***"),
    # Key shapes of OpenAI and most compatible services.
    (re.compile(r"\b(sk-|sk-proj-|sk-ant-)[A-Za-z0-9_-]{6,}"), r"\1***"),
]


def mask_key(text: str, key: str) -> str:
    """``text`` with every run of it that is part of ``key`` (8 characters or more) masked."""
    if not key or key == NO_KEY:
        return text
    if len(key) < KEY_FRAGMENT:
        return text.replace(key, "***")
    fragments = {key[i : i + KEY_FRAGMENT] for i in range(len(key) - KEY_FRAGMENT + 1)}
    secret = bytearray(len(text))  # 1 where a character belongs to a fragment of the key
    for i in range(len(text) - KEY_FRAGMENT + 1):
        if text[i : i + KEY_FRAGMENT] in fragments:
            secret[i : i + KEY_FRAGMENT] = b"\x01" * KEY_FRAGMENT
    if not any(secret):
        return text
    out, i = [], 0
    while i < len(text):
        if secret[i]:
            out.append("***")
            while i < len(text) and secret[i]:
                i += 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def scrub(text: str, key: str) -> str:
    """``text`` with the API key (whole or in part) and anything shaped like a token masked, then shortened."""
    text = mask_key(text, key)
    for pattern, replacement in _SECRET_SHAPES:
        text = pattern.sub(replacement, text)
    text = " ".join(text.split())
    return text if len(text) <= UPSTREAM_TEXT_LIMIT else text[: UPSTREAM_TEXT_LIMIT - 1] + "…"


def shorten(text: str, limit: int = 120) -> str:
    """A quote of what the server sent, short enough for an error message."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def server_name(base_url: str) -> str:
    """``host:port`` of a URL: enough to recognise the server, without credentials or path."""
    parts = urlsplit(base_url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname:
        return "(invalid base_url)"
    return f"{parts.hostname}:{port}" if port else parts.hostname
