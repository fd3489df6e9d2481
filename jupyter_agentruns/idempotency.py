"""Idempotent submit: the request fingerprint and the key's syntax."""

from __future__ import annotations

import hashlib
import json
from typing import Any

MAX_KEY_LENGTH = 255

# What submit() records of where a run was asked from, not of what it is: the
# cell's code (a refreshed page restores the run only under the code that made
# it) and the kernel (the notebook tools act on it). Left out of the
# fingerprint: the same cell with edited code, or re-run after a kernel
# restart (a new kernel id), finds the same run.
ORIGIN_METADATA = ("cell_source", "cell_source_sha256", "kernel_id")


def fingerprinted_metadata(metadata: Any) -> Any:
    """``metadata`` without the keys that say where the run was asked from."""
    if not isinstance(metadata, dict) or not any(key in metadata for key in ORIGIN_METADATA):
        return metadata
    kept = {key: value for key, value in metadata.items() if key not in ORIGIN_METADATA}
    return kept or None


def fingerprint(
    agent: str,
    input: Any,
    session: str | None = None,
    metadata: Any = None,
    retry_of: str | None = None,
    forked_from: Any = None,
) -> str:
    """SHA-256 of the compact, key-sorted JSON of what a submit asks for.

    The metadata that records the submitting cell's code and kernel is left
    out (see ``ORIGIN_METADATA``). ``forked_from`` counts only when set: a
    submit's key made before forks existed keeps its fingerprint.
    """
    asked: dict[str, Any] = {
        "agent": agent,
        "input": input,
        "session": session,
        "metadata": fingerprinted_metadata(metadata),
        "retry_of": retry_of,
    }
    if forked_from is not None:
        asked["forked_from"] = forked_from
    canonical = json.dumps(
        asked,
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
