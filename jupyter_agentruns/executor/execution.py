"""One run as the executor holds it: its events numbered, its snapshot, its end.

An ``Execution`` numbers the run's events (contiguous ``seq``), keeps its live
snapshot with the reducer, hands each event with the run-state change it
implies to the store writer, waits until they are committed, keeps its
checkpoint, and knows why the run is stopping (``Stop``). Its questions to a
person are its ``questions`` (``asking.Questions``).
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
from collections.abc import Callable
from typing import Any

from .. import budgets, events, lifecycle, reducer
from ..agents import EventTooLarge, RunClosed, TokenBudgetExceeded
from ..broadcaster import Broadcaster, Waiter
from ..domain import RunRow
from ..events import envelope
from ..lifecycle import Transition
from ..store import StoreConnection
from ..timeutil import now_iso
from ..tracing import RunTrace
from ..writer import Writer, in_transaction
from .asking import Questions

# The events after which a run may have begun or stopped waiting for an answer.
WAITING_CHANGES = frozenset({"input.requested", "input.resolved"})
# A tight-looping agent yields to the event loop this often, so commits are
# published and streams served while it runs.
YIELD_EVERY = 64

# Built once: json.dumps with options builds an encoder per call. allow_nan=False:
# NaN is not JSON, and a browser could not parse the event.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# What _ENCODER does to a string, called directly: a text delta, most of a run's
# events, is encoded in a fifth of the time the encoder takes for its dict.
_quote = json.encoder.encode_basestring_ascii


def text_delta_json(data: dict[str, Any]) -> str | None:
    """A ``text.delta``'s JSON as _ENCODER writes it, built directly; None if it is not the usual two strings."""
    if len(data) != 2:
        return None
    message_id, delta = data.get("message_id"), data.get("delta")
    if message_id.__class__ is not str or delta.__class__ is not str:
        return None
    return '{"message_id":' + _quote(message_id) + ',"delta":' + _quote(delta) + "}"


class Stop(enum.Enum):
    """Why a run is being stopped before its agent returned."""

    CANCEL = "cancel"  # a cancel request: ends cancelled
    SHUTDOWN = "shutdown"  # the server stops: ends interrupted
    DEADLINE = "deadline"  # max_run_seconds: ends failed
    SILENT = "silent"  # agent_silence_seconds without an event: ends failed
    LOST = "lost"  # ended by another server, or by the writer (a value the store refused): nothing more is written
    HANDOVER = "handover"  # the server stops: a resumable run is left for the next executor


class Execution:
    """One running run, as the executor sees it."""

    def __init__(
        self,
        row: RunRow,
        writer: Writer,
        broadcaster: Broadcaster,
        max_event_bytes: int,
        check_usage: Callable[[str, int, dict[str, int]], budgets.Overspent | None] | None = None,
    ):
        self.run_id: str = row["run_id"]
        self.owner: str = row["owner"]
        # Its usage totals so far (its last usage event), for the token budgets.
        self.tokens = (row.get("input_tokens") or 0) + (row.get("output_tokens") or 0)
        self._check_usage = check_usage
        # The tokens a person allowed it beyond its budgets (its approved budget questions).
        self.allowed = {"run": 0, "day": 0}
        # A budget it went over at its last usage event, to ask about (budget_exceeded = "ask").
        self._overspent: budgets.Overspent | None = None
        self.row = row
        self.seq: int = row["last_seq"]
        self.snapshot = reducer.Snapshot()
        self.last_type: str | None = None
        self.closed = False  # its terminal event is queued: it takes no more events
        self.closing = False  # its end is being appended: only the end's own events follow
        self.stop: Stop | None = None
        self.cancel: dict[str, Any] | None = None  # {requested_at, reason, stage} once Stop.CANCEL
        self.fatal: BaseException | None = (
            None  # what makes the run fail whatever the agent does next
        )
        self.started = False
        self.task: asyncio.Future | None = None
        self.stopping = asyncio.Event()  # set with self.stop
        self.bytes = 0  # of event data emitted
        self.questions = Questions(self)
        self._writer = writer
        self._broadcaster = broadcaster
        self._max_event_bytes = max_event_bytes
        self._run_id_json = json.dumps(self.run_id)
        self._since_yield = 0
        # A run taken over from another executor: the snapshot it was taken at.
        self.resumed_from: dict[str, Any] | None = None
        self.resumable = False
        self.history: Callable[[], Any] | None = None
        # When (monotonic) the run last had an event: its agent's silence is counted from it.
        self.last_event_at = time.monotonic()
        self.conversation: Callable[[], Any] | None = None
        # Tool calls numbered so far (c1, c2, ...): shared by every RunContext of
        # the run (its agent's, and the notebook tools' calls made over MCP).
        self._calls = 0
        # Its attempt as spans, when OpenTelemetry traces runs (see ``tracing``).
        self.trace: RunTrace | None = None

    def resume(self, snapshot: reducer.Snapshot) -> None:
        """Go on from ``snapshot``: the run's as an earlier attempt left it, with its ``run.resumed``."""
        self.snapshot = snapshot
        self.resumed_from = json.loads(json.dumps(snapshot.to_dict()))
        self.allowed = budgets.allowed(self.resumed_from)
        # Ids go on from the earlier attempt's.
        self._calls = len(self.resumed_from["tools"])
        self.questions.track_waiting()  # a question still open: it waits from now
        self.started = True

    @property
    def ending(self) -> bool:
        """Asked to stop, or already ended."""
        return self.closed or self.stop is not None

    def next_call_id(self) -> str:
        """The id of a tool call that starts: c1, c2, ..."""
        self._calls += 1
        return f"c{self._calls}"

    def stage(self) -> dict[str, Any]:
        """What the run had done last, for a cancellation."""
        return {
            "seq": self.seq,
            "step": reducer.describe_step(self.snapshot.structure(), self.last_type),
        }

    async def emit(self, type: str, data: dict[str, Any]) -> int:
        """Append an event: wait for queue space (backpressure), then number and queue it."""
        data_json = self.encode(type, data)
        if self._writer.full:
            await self._writer.wait_for_space()
        seq = self.append(type, data, data_json)
        if self._overspent is not None:
            await self.ask_for_more()
        self._since_yield += 1
        if self._since_yield >= YIELD_EVERY:
            self._since_yield = 0
            await asyncio.sleep(0)
        return seq

    async def commit(self, transition: Transition) -> int:
        """Append a lifecycle transition once the writer has room (see ``apply``)."""
        self.encode(transition.type, transition.data)  # refused before any wait
        await self.reserve()
        return self.apply(transition)

    def apply(self, transition: Transition) -> int:
        """Append a lifecycle transition now: its event and the run columns it sets, together."""
        data_json = self.encode(transition.type, transition.data)
        return self.append(transition.type, transition.data, data_json, transition.fields)

    async def end(self, end: Transition) -> None:
        """Commit the run's end: its open questions given up and steps ended, then ``end`` (``lifecycle.ending``).

        Whoever waits in ``questions.ask()`` is woken with ``RunClosed``.
        """
        self.encode(end.type, end.data)  # an output that cannot be stored fails before anything
        await self.reserve()
        self.closing = True
        for transition in lifecycle.ending(self.snapshot.structure(), end):
            self.apply(transition)
        self.questions.stop_asking()

    def encode(self, type: str, data: dict[str, Any]) -> str:
        """The event's data as JSON; ``RunClosed`` once the run ended, ``EventTooLarge`` over ``max_event_bytes``."""
        if self.closed:
            raise RunClosed(f"run {self.run_id} has ended")
        data_json = (text_delta_json(data) if type == "text.delta" else None) or _ENCODER.encode(
            data
        )
        if len(data_json) > self._max_event_bytes:
            error = EventTooLarge(
                f"a {type} event of {len(data_json)} bytes is over max_event_bytes ({self._max_event_bytes})"
            )
            # The first reason the run must fail stays its reason (a spent budget
            # keeps holding back the agent's events).
            if type not in lifecycle.TERMINAL_EVENTS and self.fatal is None:
                self.fatal = error
            raise error
        return data_json

    async def reserve(self) -> None:
        """Wait until the writer's queue has room (the disk sets the pace)."""
        if self._writer.full:
            await self._writer.wait_for_space()

    def append(
        self, type: str, data: dict[str, Any], data_json: str, fields: dict[str, Any] | None = None
    ) -> int:
        """Number the event and hand it to the writer; synchronous, so nothing interleaves."""
        if self.closed or self._writer.closed:
            raise RunClosed(f"run {self.run_id} has ended")
        if (
            isinstance(self.fatal, TokenBudgetExceeded)
            and not self.closing
            and not type.startswith("run.")
            and type != "input.resolved"
        ):
            raise self.fatal  # over its budget: nothing more but its end
        seq = self.seq + 1
        ts = now_iso()
        terminal = type in lifecycle.TERMINAL_EVENTS
        if type == "usage":
            # The run's totals, kept in its row: a day's budget is summed from them.
            input_tokens, output_tokens = budgets.tokens(data)
            fields = {
                **(fields or {}),
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
            }
            self.tokens = input_tokens + output_tokens
        if terminal:
            # The builder itself: the writer streams it into the store in parts,
            # so a long text is never joined or encoded whole.
            fields = {**(fields or {}), "snapshot": self.snapshot, "snapshot_seq": seq}
        item = events.append(
            self.run_id,
            seq,
            type,
            ts,
            data_json,
            fields or None,
            envelope(self._run_id_json, seq, type, ts, data_json),
        )
        self._writer.append(item)
        self.bytes += len(data_json)
        self.seq = seq
        self.last_event_at = time.monotonic()
        if terminal:
            self.closed = True
        else:
            if type == "text.delta":
                self.snapshot.add_text(data["message_id"], data["delta"])
            else:
                self.snapshot.apply({"type": type, "data": data})
            self.last_type = type
        if type in WAITING_CHANGES:
            self.questions.track_waiting()
        if self.trace is not None:
            self.trace.event(type, data)
        if type == "usage" and self._check_usage is not None:
            # The usage event that crosses a budget is kept; the run fails at it.
            over = self._check_usage(self.owner, self.tokens, self.allowed)
            if over is not None:
                if not over.more:
                    self._fail_budget(over.message)
                self._overspent = over  # asked by emit(), once this event is queued
        return seq

    async def ask_for_more(self) -> None:
        """Ask a person for more tokens (``budget_exceeded = "ask"``) and wait.

        Approved, the run goes on, its limit raised by what the question
        offered; denied (or closed unanswered), it fails ``token_budget_exceeded``.
        A budget question still open from an earlier attempt is waited for, not
        asked again. Also called before a resumed run's agent goes on.
        """
        while True:
            open_question = next(
                (
                    request
                    for request in reducer.open_inputs(self.snapshot.structure())
                    if request.get("kind") == budgets.BUDGET_KIND
                ),
                None,
            )
            over, self._overspent = self._overspent, None
            if open_question is not None:
                try:
                    choice = await self.questions.await_answer(open_question["request_id"])
                except TimeoutError:
                    choice = None
                message = str((open_question.get("details") or {}).get("message") or "")
            elif over is not None:
                question = over.question()
                choice = await self.questions.ask(
                    question["title"],
                    question["details"],
                    [budgets.APPROVE, "deny"],
                    budgets.BUDGET_KIND,
                    None,
                )
                message = over.message
            else:
                return
            if choice != budgets.APPROVE:
                self._fail_budget(f"{message}; a person did not allow more")
            self.allowed = budgets.allowed(self.snapshot.structure())
            if self._check_usage is not None:
                # Still over: the day's budget, which the owner's other runs used meanwhile.
                self._overspent = self._check_usage(self.owner, self.tokens, self.allowed)

    def _fail_budget(self, message: str) -> None:
        self.fatal = TokenBudgetExceeded(message)
        if self.task is not None:
            self.task.cancel()
        raise self.fatal

    def silence_left(self, silence: float) -> float:
        """Seconds before the agent has been silent for ``silence``.

        A run waiting for a person, or for a step of its own (a long cell, a
        tool), is not silent: the count starts again when that ends.
        """
        if self.questions.waiting_since is not None or any(
            tool.get("status") == "running" for tool in self.snapshot.structure().get("tools", ())
        ):
            return silence
        return self.last_event_at + silence - time.monotonic()

    async def durable(self) -> None:
        """Wait until every event queued so far is committed."""
        channel = self._broadcaster.get(self.run_id)
        target = self.seq
        while channel is not None and channel.committed_seq < target:
            if self.stop is Stop.LOST:
                raise RunClosed(f"run {self.run_id} lost its store writes")
            await Waiter().wait([channel.signal], None)

    async def save_checkpoint(self, value: Any) -> None:
        """Store ``value`` in the run's row, in the writer's queue after the events before it."""
        if self.closed:
            raise RunClosed(f"run {self.run_id} has ended")
        data_json = _ENCODER.encode(value)
        if len(data_json) > self._max_event_bytes:
            raise EventTooLarge(
                f"a checkpoint of {len(data_json)} bytes is over max_event_bytes ({self._max_event_bytes})"
            )
        stored = json.loads(data_json)

        @in_transaction
        def save(conn: StoreConnection) -> None:
            conn.update_run(self.run_id, {"checkpoint": stored})

        await self._writer.run(save)

    async def save_trace_context(self, traceparent: str) -> None:
        """Keep this attempt's span context in the run's row: an attempt after a takeover links to it."""

        @in_transaction
        def save(conn: StoreConnection) -> None:
            conn.update_run(self.run_id, {"trace_context": traceparent})

        await self._writer.run(save)

    async def set_conversation_title(self, title: str) -> None:
        """Store the title the agent gave the run's conversation, after the events before it."""
        if self.closed:
            raise RunClosed(f"run {self.run_id} has ended")

        @in_transaction
        def save(conn: StoreConnection) -> None:
            conn.update_run(self.run_id, {"conversation_title": title})

        await self._writer.run(save)

    def status(self) -> str:
        """The run's status now, as its events so far make it."""
        if self.stop is Stop.CANCEL:
            return lifecycle.RunStatus.CANCELLING.value
        if reducer.open_inputs(self.snapshot.structure()):
            return lifecycle.RunStatus.WAITING.value
        return lifecycle.RunStatus.RUNNING.value

    def request_stop(self, why: Stop) -> None:
        """Stop the run for ``why``: its watch wakes, its agent's task is cancelled."""
        self.stop = why
        self.stopping.set()
        if self.task is not None:
            self.task.cancel()
