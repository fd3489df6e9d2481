"""The event semantics: a run's events reduced to its snapshot.

This is the one place in Python that says what each event type means; the
widget's ``applyEvent`` in ``js/src/reducer.js`` is its twin, and both are held to the same test
vectors in ``tests/vectors/``.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Iterator
from json.encoder import encode_basestring_ascii
from typing import Any

from .domain import EventRecord


def empty_snapshot() -> dict[str, Any]:
    """The snapshot of a run with no events."""
    return {"messages": [], "tools": [], "progress": None, "usage": None}


def _find(items: list[dict], key: str, value: Any) -> dict | None:
    # Searching from the end: events almost always concern the newest item.
    for item in reversed(items):
        if item.get(key) == value:
            return item
    return None


def apply(snapshot: dict[str, Any], event: EventRecord) -> dict[str, Any]:
    """Apply one event to ``snapshot`` in place and return it.

    Unknown event types (``x.*`` and future ones) leave the snapshot as it is.
    """
    kind = event["type"]
    data = event.get("data") or {}
    if kind == "message.started":
        snapshot["messages"].append(
            {
                "id": data["message_id"],
                "role": data.get("role", "assistant"),
                "text": "",
                "done": False,
            }
        )
    elif kind == "text.delta":
        message = _find(snapshot["messages"], "id", data["message_id"])
        if message is None:
            # A delta without message.started still carries text worth showing.
            message = {"id": data["message_id"], "role": "assistant", "text": "", "done": False}
            snapshot["messages"].append(message)
        message["text"] += data["delta"]
    elif kind == "message.completed":
        message = _find(snapshot["messages"], "id", data["message_id"])
        if message is not None:
            message["done"] = True
    elif kind == "tool.started":
        tool = {
            "call_id": data["call_id"],
            "name": data["name"],
            "args": data.get("args", {}),
            "status": "running",
            "result": None,
        }
        # What kind of step it is and what it does, in the agent's words (ACP agents say so).
        for name in ("kind", "title"):
            if data.get(name) is not None:
                tool[name] = data[name]
        snapshot["tools"].append(tool)
    elif kind == "tool.completed":
        tool = _find(snapshot["tools"], "call_id", data["call_id"])
        if tool is not None:
            ok = data.get("ok", True)
            tool["status"] = "completed" if ok else "failed"
            tool["result"] = data.get("result")
            if not ok:
                tool["error"] = data.get("error")
            if data.get("content") is not None:
                # What the step showed: text, and the diffs of the files it changed.
                tool["content"] = data["content"]
    elif kind == "reasoning.delta":
        # The model's visible thinking, all of it in one text ("reasoning" appears with the first).
        snapshot["reasoning"] = snapshot.get("reasoning", "") + data["delta"]
    elif kind == "plan.updated":
        # Each plan replaces the last ("plan" appears with the first).
        entries = data.get("entries")
        snapshot["plan"] = list(entries) if isinstance(entries, list) else []
    elif kind == "progress":
        snapshot["progress"] = {"fraction": data.get("fraction"), "message": data.get("message")}
    elif kind == "usage":
        usage = {
            "input_tokens": data.get("input_tokens"),
            "output_tokens": data.get("output_tokens"),
        }
        if data.get("estimated"):
            # Counted by the agent, not reported by the model server: the view says so.
            usage["estimated"] = True
        cost = data.get("cost")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost):
            # In the currency of the agent's prices (c.OpenAIAgent.prices).
            usage["cost"] = cost
        snapshot["usage"] = usage
    elif kind == "input.requested":
        # "inputs" appears with a run's first question (older snapshots have none).
        snapshot.setdefault("inputs", []).append(
            {
                "request_id": data.get("request_id"),
                "kind": data.get("kind"),
                "title": data.get("title"),
                "details": data.get("details"),
                "choices": data.get("choices"),
                "status": "open",
                "choice": None,
            }
        )
    elif kind == "input.resolved":
        request = find_input(snapshot, data.get("request_id"))
        if request is not None:
            request["status"] = "resolved"
            request["choice"] = data.get("choice")
            for name in ("note", "by", "reason"):
                if data.get(name) is not None:
                    request[name] = data[name]
    elif kind == "notebook.edit":
        # "edits" appears with a run's first notebook edit, in order of first appearance;
        # a later event of the same edit_id replaces what the snapshot keeps of it.
        edits = snapshot.setdefault("edits", [])
        edit = find_edit(snapshot, data.get("edit_id"))
        if edit is None:
            edits.append(dict(data))
        else:
            edit.clear()
            edit.update(data)
    return snapshot


def find_edit(snapshot: dict[str, Any], edit_id: str | None) -> dict[str, Any] | None:
    """The notebook edit ``edit_id`` of a run, as its last ``notebook.edit`` left it."""
    return _find(snapshot.get("edits", []), "edit_id", edit_id)


def find_input(snapshot: dict[str, Any], request_id: str | None) -> dict[str, Any] | None:
    """The question ``request_id`` of a run, open or resolved."""
    return _find(snapshot.get("inputs", []), "request_id", request_id)


def open_inputs(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The questions of a run still waiting for an answer."""
    return [request for request in snapshot.get("inputs", []) if request["status"] == "open"]


class Snapshot:
    """A snapshot built event by event, the same as ``apply`` but fast and compact for long texts.

    Appending a delta to a string held in a dict copies the whole text each
    time, which is quadratic over a long answer. Here the deltas of each
    message are kept as pieces, joined into chunks of about ``CHUNK_CHARS``
    as they come (a million small strings cost far more memory than their
    text), and into the message's text only when the snapshot is read.
    ``json_chunks`` writes the snapshot as JSON without ever joining it.
    """

    CHUNK_CHARS = 1 << 20

    def __init__(self, base: dict[str, Any] | None = None):
        self._snapshot = copy.deepcopy(base) if base is not None else empty_snapshot()
        # message index -> [chunks..., pieces not yet in a chunk], and the pieces' length
        self._pending: dict[int, list[str]] = {}
        self._loose: dict[
            int, tuple[int, int]
        ] = {}  # message index -> (first loose piece, their chars)

    @classmethod
    def wrap(cls, snapshot: dict[str, Any]) -> Snapshot:
        """A builder over ``snapshot`` itself, not a copy (for writing it out)."""
        builder = cls.__new__(cls)
        builder._snapshot = snapshot
        builder._pending = {}
        builder._loose = {}
        return builder

    def apply(self, event: EventRecord) -> None:
        if event["type"] != "text.delta":
            apply(self._snapshot, event)
            return
        data = event["data"]
        self.add_text(data["message_id"], data["delta"])

    def add_text(self, message_id: str, delta: str) -> None:
        """``apply`` of a ``text.delta``: the event most of a run is made of."""
        messages = self._snapshot["messages"]
        index = len(messages) - 1
        if index < 0 or messages[index]["id"] != message_id:  # not the latest message
            for index in range(len(messages) - 1, -1, -1):
                if messages[index]["id"] == message_id:
                    break
            else:
                apply(
                    self._snapshot, {"type": "message.started", "data": {"message_id": message_id}}
                )
                index = len(messages) - 1
        pending = self._pending.get(index)
        if pending is None:
            pending = self._pending[index] = []
        start, chars = self._loose.get(index, (len(pending), 0))
        pending.append(delta)
        chars += len(delta)
        if chars >= self.CHUNK_CHARS:
            pending[start:] = ["".join(pending[start:])]
            start, chars = len(pending), 0
        self._loose[index] = (start, chars)

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as a dict (the builder's own: serialize or copy it before applying more)."""
        messages = self._snapshot["messages"]
        for index, pending in self._pending.items():
            messages[index]["text"] += "".join(pending)
        self._pending.clear()
        self._loose.clear()
        return self._snapshot

    def structure(self) -> dict[str, Any]:
        """The snapshot without its latest text joined in: enough to see its messages and tools."""
        return self._snapshot

    def json_chunks(self) -> Iterator[str]:
        """The snapshot's JSON text in pieces, never holding a message's whole text twice."""
        for position, (key, value) in enumerate(self._snapshot.items()):
            yield ("{" if position == 0 else ",") + _STRICT.encode(key) + ":"
            if key != "messages":
                yield _STRICT.encode(value)
                continue
            yield "["
            for index, message in enumerate(value):
                yield "{" if index == 0 else ",{"
                for place, (name, field) in enumerate(message.items()):
                    yield ("" if place == 0 else ",") + _STRICT.encode(name) + ":"
                    if name != "text":
                        yield _STRICT.encode(field)
                        continue
                    yield '"'
                    for part in _slices(field, self.CHUNK_CHARS):
                        yield encode_basestring_ascii(part)[1:-1]
                    for part in self._pending.get(index, ()):
                        yield encode_basestring_ascii(part)[1:-1]
                    yield '"'
                yield "}"
            yield "]"
        yield "}"


# NaN is not JSON: a snapshot holding one fails loudly rather than becoming unreadable.
_STRICT = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def _slices(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def reduce(events: Iterable[EventRecord], snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
    """Reduce ``events`` onto a copy of ``snapshot`` (or an empty one)."""
    builder = Snapshot(snapshot)
    for event in events:
        builder.apply(event)
    return builder.to_dict()


def describe_step(snapshot: dict[str, Any], last_type: str | None) -> str:
    """Say in a few words what a run had done last, for a cancellation's ``stage``."""
    if last_type is None:
        return "not started"
    if last_type.startswith("tool.") and snapshot["tools"]:
        tool = snapshot["tools"][-1]
        return f"tool {tool['name']} {tool['status']}"
    if last_type in ("message.started", "text.delta", "message.completed") and snapshot["messages"]:
        message = snapshot["messages"][-1]
        state = "completed" if message["done"] else "streaming"
        return f"message {message['id']} {state}"
    if last_type == "reasoning.delta":
        return "thinking"
    if last_type == "plan.updated":
        return "plan updated"
    if last_type == "progress" and snapshot["progress"]:
        return f"progress: {snapshot['progress'].get('message') or ''}".rstrip(": ")
    if last_type == "run.started":
        return "started"
    return last_type
