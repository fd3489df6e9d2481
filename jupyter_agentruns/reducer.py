"""The event semantics: a run's events reduced to its snapshot.

This is the one place in Python that says what each event type means; the
widget's ``applyEvent`` in ``js/widget.js`` is its twin, and both are held to the same test
vectors in ``tests/vectors/``.
"""

from __future__ import annotations

import copy
from typing import Any

TERMINAL_TYPES = {
    "run.succeeded": "succeeded",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "run.interrupted": "interrupted",
}


def empty_snapshot() -> dict[str, Any]:
    """The snapshot of a run with no events."""
    return {"messages": [], "tools": [], "progress": None, "usage": None}


def _find(items: list[dict], key: str, value: Any) -> dict | None:
    # Searching from the end: events almost always concern the newest item.
    for item in reversed(items):
        if item.get(key) == value:
            return item
    return None


def apply(snapshot: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """Apply one event to ``snapshot`` in place and return it.

    Unknown event types (``x.*`` and future ones) leave the snapshot as it is.
    """
    kind = event["type"]
    data = event.get("data") or {}
    if kind == "message.started":
        snapshot["messages"].append(
            {"id": data["message_id"], "role": data.get("role", "assistant"), "text": "", "done": False}
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
        snapshot["tools"].append(
            {
                "call_id": data["call_id"],
                "name": data["name"],
                "args": data.get("args", {}),
                "status": "running",
                "result": None,
            }
        )
    elif kind == "tool.completed":
        tool = _find(snapshot["tools"], "call_id", data["call_id"])
        if tool is not None:
            ok = data.get("ok", True)
            tool["status"] = "completed" if ok else "failed"
            tool["result"] = data.get("result")
            if not ok:
                tool["error"] = data.get("error")
    elif kind == "progress":
        snapshot["progress"] = {"fraction": data.get("fraction"), "message": data.get("message")}
    elif kind == "usage":
        snapshot["usage"] = {
            "input_tokens": data.get("input_tokens"),
            "output_tokens": data.get("output_tokens"),
        }
    return snapshot


class Snapshot:
    """A snapshot built event by event, the same as ``apply`` but fast for long texts.

    Appending a delta to a string held in a dict copies the whole text each
    time, which is quadratic over a long answer. Here the deltas of each
    message are kept as pieces and joined only when the snapshot is read.
    """

    def __init__(self, base: dict[str, Any] | None = None):
        self._snapshot = copy.deepcopy(base) if base is not None else empty_snapshot()
        self._pieces: dict[int, list[str]] = {}  # message index -> deltas not yet joined

    def apply(self, event: dict[str, Any]) -> None:
        if event["type"] != "text.delta":
            apply(self._snapshot, event)
            return
        data = event["data"]
        messages = self._snapshot["messages"]
        for index in range(len(messages) - 1, -1, -1):
            if messages[index]["id"] == data["message_id"]:
                break
        else:
            apply(self._snapshot, {"type": "message.started", "data": {"message_id": data["message_id"]}})
            index = len(messages) - 1
        self._pieces.setdefault(index, []).append(data["delta"])

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as a dict (the builder's own: serialize or copy it before applying more)."""
        messages = self._snapshot["messages"]
        for index, pieces in self._pieces.items():
            messages[index]["text"] += "".join(pieces)
        self._pieces.clear()
        return self._snapshot


def reduce(events, snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
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
    if last_type == "progress" and snapshot["progress"]:
        return f"progress: {snapshot['progress'].get('message') or ''}".rstrip(": ")
    if last_type == "run.started":
        return "started"
    return last_type
