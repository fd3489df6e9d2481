"""Idempotent submit: the request fingerprint and the key's syntax."""

from __future__ import annotations

import hashlib
import json
from typing import Any

MAX_KEY_LENGTH = 255


def fingerprint(
    agent: str,
    input: Any,
    session: str | None = None,
    metadata: Any = None,
    retry_of: str | None = None,
) -> str:
    """SHA-256 of the compact, key-sorted JSON of what a submit asks for.

    ``metadata.kernel_id`` is left out: it says where the run was asked from,
    not what it is, and a cell re-run after a kernel restart (a new kernel id)
    must find its run.
    """
    if isinstance(metadata, dict) and "kernel_id" in metadata:
        metadata = {k: v for k, v in metadata.items() if k != "kernel_id"} or None
    canonical = json.dumps(
        {
            "agent": agent,
            "input": input,
            "session": session,
            "metadata": metadata,
            "retry_of": retry_of,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid ``Idempotency-Key``, or None when it is."""
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        return f"must be 1 to {MAX_KEY_LENGTH} characters long, not {len(key)}"
    if not all(" " <= ch <= "~" for ch in key):
        return "may contain printable ASCII characters only"
    return None
