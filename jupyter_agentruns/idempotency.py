"""Idempotent submit: the request fingerprint and the key's syntax."""

from __future__ import annotations

import hashlib
import json
from typing import Any

MAX_KEY_LENGTH = 255

# What submit() records of the cell that made a run, so that a refreshed page
# restores the run only under the code that made it. Where the run came from,
# not what it runs: the same cell with edited code finds the same run.
CELL_SOURCE_METADATA = ("cell_source", "cell_source_sha256")


def fingerprinted_metadata(metadata: Any) -> Any:
    """``metadata`` without the keys that say which code submitted the run."""
    if not isinstance(metadata, dict) or not any(key in metadata for key in CELL_SOURCE_METADATA):
        return metadata
    kept = {key: value for key, value in metadata.items() if key not in CELL_SOURCE_METADATA}
    return kept or None


def fingerprint(
    agent: str,
    input: Any,
    session: str | None = None,
    metadata: Any = None,
    retry_of: str | None = None,
) -> str:
    """SHA-256 of the compact, key-sorted JSON of what a submit asks for.

    The metadata that records the submitting cell's code is left out (see
    ``CELL_SOURCE_METADATA``).
    """
    canonical = json.dumps(
        {
            "agent": agent,
            "input": input,
            "session": session,
            "metadata": fingerprinted_metadata(metadata),
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
