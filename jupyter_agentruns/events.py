"""The wire format of an event: its envelope JSON and its SSE frames, built once per event."""

from __future__ import annotations

from .lifecycle import TERMINAL_EVENTS


class Event:
    """A committed event as subscribers see it: its seq, type and wire JSON."""

    __slots__ = ("seq", "type", "envelope", "_frames")

    def __init__(self, seq: int, type: str, envelope: str):
        self.seq = seq
        self.type = type
        self.envelope = envelope
        self._frames: tuple[str | None, str | None] = (None, None)

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS

    def sse(self, with_id: bool = True) -> str:
        """The event's SSE frame, built once however many subscribers send it."""
        with_seq, without = self._frames
        if with_id:
            if with_seq is None:
                with_seq = f"id: {self.seq}\nevent: {self.type}\ndata: {self.envelope}\n\n"
                self._frames = (with_seq, without)
            return with_seq
        if without is None:
            without = f"event: {self.type}\ndata: {self.envelope}\n\n"
            self._frames = (with_seq, without)
        return without


def envelope(run_id_json: str, seq: int, type: str, ts: str, data: str) -> str:
    """The event's wire JSON, from its parts (``run_id_json`` already JSON-quoted)."""
    return f'{{"run_id":{run_id_json},"seq":{seq},"type":"{type}","ts":"{ts}","data":{data}}}'


class Append(Event):
    """One event of one run, with the run-state change it implies; published as is once committed."""

    __slots__ = ("run_id", "ts", "data", "fields")

    def __init__(self, run_id, seq, type, ts, data, fields, envelope):
        super().__init__(seq, type, envelope)  # envelope: the event's wire JSON, built once
        self.run_id = run_id
        self.ts = ts
        self.data = data  # JSON text
        self.fields = fields  # run columns to set with this event (the store encodes them), or None

    @property
    def size(self) -> int:
        return len(self.data) + len(self.envelope)
