"""The wire format of an event: its envelope JSON and its SSE frame, built once per event.

Events in flight are plain tuples, read with the index names below; their
types (``Event``, ``Append``) are for mypy alone. A run emitting as fast as
it can keeps tens of thousands of them alive at once (in the writer's queue,
then in its channel's window), long enough for the garbage collector to
move them to its oldest generation, whose collections walk the whole
server's heap. The collector stops tracking a tuple of strings and numbers
the first time it looks at it; an object of a class it tracks until it dies.
Measured with one run at full speed: the collector took a third of the
server's time with objects, next to nothing with tuples.

An event is ``(seq, type, frame)``: ``frame`` is its SSE frame with its
``id:`` line, built when the event is, so that however many subscribers send
it, it is built once; its envelope (the JSON) is the frame's ``data:`` line.
An append (what the executor hands the writer) is ``(row, fields, event,
size)``: ``row`` is the ``(run_id, seq, type, ts, data)`` the store inserts,
``fields`` the run columns the event sets (or None), ``size`` the characters
it holds.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

from .domain import EventRow
from .lifecycle import TERMINAL_EVENTS

# An event: ``(seq, type, frame)``.
Event: TypeAlias = tuple[int, str, str]
SEQ: Final = 0
TYPE: Final = 1
FRAME: Final = 2
# An append: ``(row, fields, event, size)``; ``fields`` the columns of a ``domain.RunFields``.
Append: TypeAlias = tuple[EventRow, "dict[str, Any] | None", Event, int]
ROW: Final = 0
FIELDS: Final = 1
EVENT: Final = 2
SIZE: Final = 3
# An append's row (``domain.EventRow``).
RUN_ID: Final = 0


def envelope(run_id_json: str, seq: int, type: str, ts: str, data: str) -> str:
    """The event's wire JSON, from its parts (``run_id_json`` already JSON-quoted)."""
    return f'{{"run_id":{run_id_json},"seq":{seq},"type":"{type}","ts":"{ts}","data":{data}}}'


def event(seq: int, type: str, envelope: str) -> Event:
    return (seq, type, f"id: {seq}\nevent: {type}\ndata: {envelope}\n\n")


def append(
    run_id: str,
    seq: int,
    type: str,
    ts: str,
    data: str,
    fields: dict[str, Any] | None,
    envelope: str,
) -> Append:
    """One event of one run with the run-state change it implies; its event is published once committed."""
    made = event(seq, type, envelope)
    return ((run_id, seq, type, ts, data), fields, made, len(data) + len(made[FRAME]))


def is_terminal(event: Event) -> bool:
    return event[TYPE] in TERMINAL_EVENTS


def envelope_of(event: Event) -> str:
    """The event's wire JSON: its frame's ``data:`` line (the lines before it hold no ``data:``)."""
    frame = event[FRAME]
    return frame[frame.index("\ndata: ") + 7 : -2]


def sse(event: Event, with_id: bool = True) -> str:
    """The event's SSE frame; without its ``id:`` line for a stream of many runs."""
    frame = event[FRAME]
    return frame if with_id else frame[frame.index("\n") + 1 :]
