"""Cursors: where a client resumes a run's stream, and where a list of runs continues."""

from __future__ import annotations

import base64
import binascii
import re
from typing import NamedTuple

from .errors import ErrorCode, Problem, invalid_request

# The runs one page stream follows (``GET streams?runs=``).
MAX_STREAM_RUNS = 50

_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")
_RUN_ID = re.compile(r"^run_[A-Za-z0-9_-]{1,64}$")


def parse_seq(raw: str | None) -> int:
    """The seq a cursor names: a non-negative integer; absent or empty means 0."""
    if raw is None or raw == "":
        return 0
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise Problem(
            ErrorCode.INVALID_CURSOR,
            f"The cursor {raw!r} is not a non-negative integer (the seq of the last event you have).",
        )
    return int(raw)


def parse_cursor(last_event_id: str | None, after: str | None) -> int:
    """The cursor a request asks for: ``Last-Event-ID`` wins over ``after``; absent means 0.

    An empty ``Last-Event-ID`` names no event: it counts as absent.
    """
    return parse_seq(last_event_id if last_event_id else after)


class StreamRun(NamedTuple):
    """A run a page stream follows, and its cursor, or why its cursor is none."""

    run_id: str
    cursor: int | Problem


def parse_stream_runs(raw: str | None) -> list[StreamRun]:
    """``run_id:cursor,…`` (``GET streams?runs=``) to the runs to follow.

    A malformed list is refused as a whole (400); a run whose cursor is not a
    seq keeps its ``invalid_cursor`` as its cursor: that run alone gets an
    error frame, the others go on.
    """
    if not raw:
        raise invalid_request("List the runs to follow: ?runs=<run_id>:<cursor>,<run_id>:<cursor>")
    runs = []
    for item in raw.split(","):
        run_id, colon, cursor = item.partition(":")
        if not run_id or not colon:
            raise invalid_request(f"{item!r} is not of the form <run_id>:<cursor>.")
        try:
            runs.append(StreamRun(run_id, parse_seq(cursor)))
        except Problem as problem:
            runs.append(StreamRun(run_id, problem))
    if len(runs) > MAX_STREAM_RUNS:
        raise invalid_request(f"At most {MAX_STREAM_RUNS} runs per stream, not {len(runs)}.")
    if len({run.run_id for run in runs}) != len(runs):
        raise invalid_request("Each run may be listed once.")
    return runs


def check_cursor(cursor: int, last_seq: int) -> None:
    """A cursor past the run's last committed event cannot come from this run."""
    if cursor > last_seq:
        raise Problem(
            ErrorCode.CURSOR_AHEAD,
            f"The cursor {cursor} is beyond the run's last event ({last_seq}); "
            "reread the run and continue from its last_seq.",
            last_seq=last_seq,
        )


def page_cursor(created_at: str, run_id: str) -> str:
    """The ``next`` of a page that ends with this run: opaque, and only about the caller's own run."""
    return base64.urlsafe_b64encode(f"{created_at}|{run_id}".encode()).decode().rstrip("=")


def parse_page_cursor(raw: str) -> tuple[str, str]:
    """``(created_at, run_id)`` from a ``before`` parameter (400 when no server made it)."""
    try:
        text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("ascii")
    except (binascii.Error, UnicodeError, ValueError):
        text = ""
    created_at, _, run_id = text.partition("|")
    # fullmatch: a `$` would let a newline after either through.
    if not (raw.isascii() and _TIMESTAMP.fullmatch(created_at) and _RUN_ID.fullmatch(run_id)):
        raise invalid_request(
            f"before={raw!r} is not a cursor: pass the `next` of the previous page."
        )
    return created_at, run_id
