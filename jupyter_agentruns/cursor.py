"""Event cursors: where a client resumes a run's stream."""

from __future__ import annotations

from .errors import ApiError


def parse_cursor(last_event_id: str | None, after: str | None) -> int:
    """The cursor a request asks for: ``Last-Event-ID`` wins over ``after``; absent means 0.

    An empty ``Last-Event-ID`` names no event: it counts as absent.
    """
    raw = last_event_id if last_event_id else after
    if raw is None or raw == "":
        return 0
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise ApiError(
            400,
            "invalid_cursor",
            f"The cursor {raw!r} is not a non-negative integer (the seq of the last event you have).",
        )
    return int(raw)


def check_cursor(cursor: int, last_seq: int) -> None:
    """A cursor past the run's last committed event cannot come from this run."""
    if cursor > last_seq:
        raise ApiError(
            409,
            "cursor_ahead",
            f"The cursor {cursor} is beyond the run's last event ({last_seq}); "
            "reread the run and continue from its last_seq.",
            last_seq=last_seq,
        )
