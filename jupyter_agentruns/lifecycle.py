"""The run lifecycle: its statuses, and every change of status with the event that records it.

A run's status only ever changes together with an event in its log (the
event and the change commit in one transaction). This module decides both:
each function returns a ``Transition`` (event type, event data, run columns
to set) and the executor, the lease sweep and cancel commit it as they can.
A new status is added here, in the reducer twins and in their shared vectors
(``tests/vectors/lifecycle/statuses.json``), nowhere else.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from .domain import CancelRequest, RunObject
from .timeutil import now_iso


class RunStatus(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"  # for a person's answer (see Asking a person)
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value


# The statuses of a run that is not over: they count against limits and keep a server busy.
ACTIVE = frozenset({RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.CANCELLING})
TERMINAL = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.INTERRUPTED}
)
# Plain strings, for SQL parameters and comparisons with stored rows.
ACTIVE_STATUSES = tuple(sorted(status.value for status in ACTIVE))
TERMINAL_STATUSES = tuple(sorted(status.value for status in TERMINAL))
ALL_STATUSES = tuple(status.value for status in RunStatus)

# Each terminal status has one event type, and a run has exactly one such event, last.
TERMINAL_EVENTS = {
    "run.succeeded": RunStatus.SUCCEEDED.value,
    "run.failed": RunStatus.FAILED.value,
    "run.cancelled": RunStatus.CANCELLED.value,
    "run.interrupted": RunStatus.INTERRUPTED.value,
}
# A cancel can start while the run has not ended or begun to end.
CANCELLABLE = (RunStatus.QUEUED.value, RunStatus.RUNNING.value, RunStatus.WAITING.value)


# What a submit to a session that has an active run does (docs/reference/rest-api.md, Session policy).
SESSION_POLICIES = ("parallel", "reject", "enqueue", "interrupt")


def is_active(status: str) -> bool:
    return status in ACTIVE_STATUSES


def is_terminal(status: str) -> bool:
    return status in TERMINAL_STATUSES


@dataclass(frozen=True)
class Transition:
    """One status change: the event that records it and the run columns it sets."""

    type: str
    data: dict[str, Any]
    fields: dict[str, Any] = field(default_factory=dict)  # a ``domain.RunFields``

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS


def started(trace_context: str | None = None) -> Transition:
    """The run starts; ``trace_context``: its span's, when OpenTelemetry traces runs."""
    fields: dict[str, Any] = {"status": RunStatus.RUNNING.value, "started_at": now_iso()}
    if trace_context is not None:
        fields["trace_context"] = trace_context
    return Transition("run.started", {}, fields)


def cancel_requested(reason: Any, requested_at: str, stage: dict[str, Any]) -> Transition:
    cancel = {"requested_at": requested_at, "reason": reason, "stage": stage}
    return Transition(
        "run.cancel_requested",
        {"reason": reason},
        {"status": RunStatus.CANCELLING.value, "cancel": cancel},
    )


def cancelled_in_queue(reason: Any, last_seq: int) -> Transition:
    """A run cancelled while it waited in its session's queue (no server had started it)."""
    stage = {"seq": last_seq, "step": "not started"}
    ended = cancelled(reason, stage)
    cancel = {"requested_at": ended.fields["finished_at"], "reason": reason, "stage": stage}
    return Transition(ended.type, ended.data, {**ended.fields, "cancel": cancel})


def input_requested(data: dict[str, Any], status: str) -> Transition:
    """The agent asks a person: the run waits (unless it is being cancelled)."""
    waits = status in (RunStatus.RUNNING.value, RunStatus.WAITING.value)
    return Transition("input.requested", data, {"status": RunStatus.WAITING.value} if waits else {})


def input_resolved(data: dict[str, Any], status: str, still_open: int) -> Transition:
    """A question answered (or given up on): the run goes on once none is open."""
    goes_on = status == RunStatus.WAITING.value and still_open == 0
    return Transition(
        "input.resolved", data, {"status": RunStatus.RUNNING.value} if goes_on else {}
    )


def resumed(attempt: int, reason: str, from_seq: int, status: str) -> Transition:
    """Another executor takes the run over (``reason``: ``lease_expired`` or ``server_shutdown``).

    The run goes on ``running``, or ``waiting`` while a question is open.
    """
    goes_on = RunStatus.WAITING if status == RunStatus.WAITING.value else RunStatus.RUNNING
    return Transition(
        "run.resumed",
        {"attempt": attempt, "reason": reason, "from_seq": from_seq},
        {"status": goes_on.value, "attempt": attempt},
    )


def succeeded(output: Any) -> Transition:
    return _end("run.succeeded", {"output": output}, {"output": output})


def failed(error: dict[str, Any]) -> Transition:
    return _end("run.failed", {"error": error}, {"error": error})


def cancelled(reason: Any, stage: dict[str, Any]) -> Transition:
    return _end("run.cancelled", {"reason": reason, "stage": stage})


def interrupted(reason: str) -> Transition:
    return _end("run.interrupted", {"reason": reason})


def _end(type: str, data: dict[str, Any], fields: dict[str, Any] | None = None) -> Transition:
    ended = {"status": TERMINAL_EVENTS[type], "finished_at": now_iso(), "finished_ts": time.time()}
    return Transition(type, data, {**(fields or {}), **ended})


# Why a step still running when its run ended has no result, by how the run ended.
STEP_CUT = {
    "run.succeeded": "the run ended before this step did",
    "run.failed": "the run failed before this step ended",
    "run.cancelled": "the run was cancelled before this step ended",
    "run.interrupted": "the run was interrupted before this step ended",
}


def ending(snapshot: dict[str, Any], end: Transition) -> list[Transition]:
    """What a run's end commits: its open questions given up, its open steps ended, then ``end``.

    ``snapshot`` is the run's (its structure) before the end. A question
    still open is resolved with reason ``cancelled``; a tool step still
    ``running`` completes failed, with error type ``interrupted`` when the run
    ends interrupted and ``cancelled`` otherwise: the log itself says that the
    step stopped with its run. The same for a run its executor ends and for
    one ended in the store.
    """
    given_up = [
        Transition(
            "input.resolved",
            {
                "request_id": request["request_id"],
                "choice": None,
                "note": None,
                "by": None,
                "reason": "cancelled",
            },
        )
        for request in snapshot.get("inputs", [])
        if request["status"] == "open"
    ]
    cut = "interrupted" if end.type == "run.interrupted" else "cancelled"
    stopped = [
        Transition(
            "tool.completed",
            {
                "call_id": tool["call_id"],
                "ok": False,
                "error": {"type": cut, "message": STEP_CUT[end.type]},
            },
        )
        for tool in snapshot.get("tools", [])
        if tool.get("status") == "running"
    ]
    return [*given_up, *stopped, end]


def as_pending_cancel(run: RunObject, request: CancelRequest) -> RunObject:
    """A run object as it will be once the server executing it takes a recorded cancel request."""
    if not is_active(run["status"]):
        return run
    cancel = {
        "requested_at": request.get("requested_at"),
        "reason": request.get("reason"),
        "stage": None,
    }
    return {**run, "status": RunStatus.CANCELLING.value, "cancel": cancel}
