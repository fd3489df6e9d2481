"""Timestamps as the API writes them: ISO 8601, UTC, millisecond precision."""

from __future__ import annotations

import time
from datetime import datetime, timezone

_last: tuple[int, str] = (-1, "")


def iso(ts: float) -> str:
    """``ts`` (seconds since the epoch) as the API writes timestamps; comparable as text."""
    stamp = datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def now_iso() -> str:
    # Formatting a datetime costs more than the rest of an event's bookkeeping;
    # runs emit thousands of events per millisecond-stamp, so reuse it.
    global _last
    millis = time.time_ns() // 1_000_000
    if millis != _last[0]:
        _last = (millis, iso(millis / 1000))
    return _last[1]
