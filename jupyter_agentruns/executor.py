"""The run executor: each run is an asyncio task owned by the server.

An ``Execution`` is the executor's side of one run: it numbers the run's
events (contiguous ``seq``), keeps its live snapshot with the reducer, hands
each event with the run-state change it implies to the store writer, and
knows why the run is stopping. ``RunContext`` is what an agent receives as
``run`` (the agent API of ``agents``): the only way the run's events are
written. ``Executor`` starts runs, cancels them, enforces the deadline, and
ends each with the one terminal event that ``lifecycle`` decides.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import json
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import budgets, events, lifecycle, metrics, reducer
from .agents import AgentSpec, EventTooLarge, RunClosed, TokenBudgetExceeded
from .broadcaster import Broadcaster, Waiter
from .errors import error_object
from .events import envelope
from .lifecycle import Transition
from .store import StoreConnection
from .timeutil import now_iso
from .tuning import release_memory
from .writer import Writer, in_transaction

# Event types an agent may emit itself; the run.* lifecycle is the executor's.
AGENT_EVENT_TYPES = {
    "message.started",
    "text.delta",
    "message.completed",
    "tool.started",
    "tool.completed",
    "progress",
    "usage",
    "reasoning.delta",
    "plan.updated",
}
PLAN_STATUSES = ("pending", "in_progress", "completed")
# The events after which a run may have begun or stopped waiting for an answer.
WAITING_CHANGES = frozenset({"input.requested", "input.resolved"})
CUSTOM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
# A tight-looping agent yields to the event loop this often, so commits are
# published and streams served while it runs.
YIELD_EVERY = 64
# A question to a person offers at most this many choices (the view shows a button each).
MAX_CHOICES = 20
# How long a cancelled agent gets to run its ``finally`` blocks.
CANCEL_GRACE_SECONDS = 10
# A run that emitted this much gives the freed memory back to the system when it ends.
RELEASE_MEMORY_AFTER_BYTES = 16 * 1024 * 1024

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
        row: dict[str, Any],
        writer: Writer,
        broadcaster: Broadcaster,
        max_event_bytes: int,
        check_usage: Callable[[Execution], str | None] | None = None,
    ):
        self.run_id: str = row["run_id"]
        self.owner: str = row["owner"]
        # Its usage totals so far (its last usage event), for the token budgets.
        self.tokens = (row.get("input_tokens") or 0) + (row.get("output_tokens") or 0)
        self._check_usage = check_usage
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
        # Questions to a person not yet answered: request_id -> what ask() awaits.
        self.asked: dict[str, asyncio.Future] = {}
        self._writer = writer
        self._broadcaster = broadcaster
        self._max_event_bytes = max_event_bytes
        self._run_id_json = json.dumps(self.run_id)
        self._since_yield = 0
        # A run taken over from another executor: the snapshot it was taken at.
        self.resumed_from: dict[str, Any] | None = None
        self.resumable = False
        self.history: Callable[[], Any] | None = None
        # Since when (monotonic) a question of the run has been open, while one is.
        self.waiting_since: float | None = None
        # When (monotonic) the run last had an event: its agent's silence is counted from it.
        self.last_event_at = time.monotonic()
        self.conversation: Callable[[], Any] | None = None
        # Tool calls numbered so far (c1, c2, ...): shared by every RunContext of
        # the run (its agent's, and the notebook tools' calls made over MCP).
        self.calls: int | None = None

    @property
    def ending(self) -> bool:
        """Asked to stop, or already ended."""
        return self.closed or self.stop is not None

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

        Whoever waits in ``ask()`` is woken with ``RunClosed``.
        """
        self.encode(end.type, end.data)  # an output that cannot be stored fails before anything
        await self.reserve()
        self.closing = True
        for transition in lifecycle.ending(self.snapshot.structure(), end):
            self.apply(transition)
        self.stop_asking()

    def encode(self, type: str, data: dict[str, Any]) -> str:
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
            self.track_waiting()
        if type == "usage" and self._check_usage is not None:
            # The usage event that crosses a budget is kept; the run fails at it.
            problem = self._check_usage(self)
            if problem is not None:
                self.fatal = TokenBudgetExceeded(problem)
                if self.task is not None:
                    self.task.cancel()
                raise self.fatal
        return seq

    def silence_left(self, silence: float) -> float:
        """Seconds before the agent has been silent for ``silence``.

        A run waiting for a person, or for a step of its own (a long cell, a
        tool), is not silent: the count starts again when that ends.
        """
        if self.waiting_since is not None or any(
            tool.get("status") == "running" for tool in self.snapshot.structure().get("tools", ())
        ):
            return silence
        return self.last_event_at + silence - time.monotonic()

    def track_waiting(self) -> None:
        """Note when the run began waiting for an answer (or that it no longer waits)."""
        if not reducer.open_inputs(self.snapshot.structure()):
            self.waiting_since = None
        elif self.waiting_since is None:
            self.waiting_since = time.monotonic()

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

    def status(self) -> str:
        """The run's status now, as its events so far make it."""
        if self.stop is Stop.CANCEL:
            return lifecycle.RunStatus.CANCELLING.value
        if reducer.open_inputs(self.snapshot.structure()):
            return lifecycle.RunStatus.WAITING.value
        return lifecycle.RunStatus.RUNNING.value

    async def ask(
        self, title: str, details: Any, choices: list[str], kind: str, timeout: float | None
    ) -> str:
        """Ask a person (``input.requested``, the run ``waiting``) and wait for the choice."""
        request_id = "in_" + secrets.token_urlsafe(9)
        data = {
            "request_id": request_id,
            "kind": kind,
            "title": title,
            "details": details,
            "choices": choices,
        }
        answered = asyncio.get_running_loop().create_future()
        self.asked[request_id] = answered
        try:
            await self.commit(lifecycle.input_requested(data, self.status()))
            if timeout is None:
                return await asyncio.shield(answered)
            try:
                return await asyncio.wait_for(asyncio.shield(answered), timeout)
            except asyncio.TimeoutError:
                if answered.done():
                    return answered.result()
                if not self.closed:
                    self.resolve(request_id, None, reason="timeout")
                raise TimeoutError(f"nobody answered {title!r} within {timeout:g} s") from None
        finally:
            self.asked.pop(request_id, None)

    async def await_answer(self, request_id: str) -> str:
        """Wait for the answer to a question still open from an earlier attempt."""
        request = reducer.find_input(self.snapshot.structure(), request_id)
        if request is None:
            raise ValueError(f"the run has no question {request_id!r}")
        if request["status"] != "open":
            if request.get("choice") is None:
                raise TimeoutError(f"the question {request_id!r} was closed unanswered")
            return request["choice"]
        answered = self.asked.get(request_id)
        if answered is None:
            answered = self.asked[request_id] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.shield(answered)
        finally:
            self.asked.pop(request_id, None)

    def resolve(
        self,
        request_id: str,
        choice: str | None,
        *,
        note: str | None = None,
        by: str | None = None,
        reason: str | None = None,
    ) -> int | None:
        """Append ``input.resolved`` (synchronous: nothing interleaves) and wake the asking agent.

        A question that is not open (answered, timed out, given up) is left as it is (None).
        """
        request = reducer.find_input(self.snapshot.structure(), request_id)
        if request is None or request["status"] != "open":
            return None
        data: dict[str, Any] = {"request_id": request_id, "choice": choice, "note": note, "by": by}
        if reason is not None:
            data["reason"] = reason
        still_open = len(reducer.open_inputs(self.snapshot.structure())) - 1
        seq = self.apply(lifecycle.input_resolved(data, self.status(), still_open))
        answered = self.asked.get(request_id)
        if answered is not None and not answered.done() and choice is not None:
            answered.set_result(choice)
        return seq

    def stop_asking(self) -> None:
        """Wake every ask() still waiting with ``RunClosed``.

        A thread agent's ask() is a task of its own, which cancelling the
        agent does not reach: without this, its thread would wait forever.
        """
        for answered in self.asked.values():
            if not answered.done():
                answered.set_exception(RunClosed(f"run {self.run_id} has ended"))

    def request_stop(self, why: Stop) -> None:
        self.stop = why
        self.stopping.set()
        if self.task is not None:
            self.task.cancel()


class ToolCall:
    """``async with run.tool(name, args) as call``: set ``call.result``; an exception marks it failed."""

    def __init__(self, run: RunContext, name: str, args: dict):
        self._run = run
        self.name = name
        self.args = args
        self.call_id: str | None = None
        self.result: Any = None

    async def __aenter__(self) -> ToolCall:
        self.call_id = await self._run.tool_started(self.name, self.args)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        assert self.call_id is not None  # set on entering
        if exc is None:
            await self._run.tool_completed(self.call_id, self.result)
        elif not isinstance(exc, (asyncio.CancelledError, RunClosed)):
            await self._run.tool_completed(self.call_id, ok=False, error=error_object(exc))


class RunContext:
    """An agent's handle on its run (the ``run`` argument); see ``agents.Run``."""

    def __init__(self, execution: Execution):
        self._execution = execution
        row = execution.row
        self.run_id: str = row["run_id"]
        self.agent: str = row["agent"]
        self.input = row["input"]
        self.owner: str = row["owner"]
        self.session: str | None = row["session"]
        self.metadata: dict[str, Any] = row.get("metadata") or {}
        self.attempt: int = row.get("attempt") or 1
        self.checkpoint: Any = row.get("checkpoint")
        resumed = execution.resumed_from
        self.snapshot: dict[str, Any] = resumed if resumed is not None else reducer.empty_snapshot()
        # Ids go on from an earlier attempt's: m1, m2, ... and c1, c2, ...
        self._messages = len(self.snapshot["messages"])
        if execution.calls is None:
            execution.calls = len(self.snapshot["tools"])
        # The notebook's kernel, for an agent that works on its data (see ``notebook``).
        self.notebook_tools: Any = None
        # The configured MCP servers (c.AgentRuns.mcp_servers), for an agent that uses their tools.
        self.mcp_servers: dict[str, dict[str, Any]] = {}
        streaming = [m for m in self.snapshot["messages"] if not m.get("done")]
        # A message that was streaming when the last attempt's server died goes on.
        self._message_id: str | None = streaming[-1]["id"] if streaming else None

    @property
    def cancelled(self) -> bool:
        """True once the run was asked to stop (cancel, deadline or shutdown)."""
        return self._execution.ending

    async def emit(self, type: str, data: dict[str, Any] | None = None) -> int:
        """Append one event of a documented type (or ``x.<name>``); returns its seq."""
        if type not in AGENT_EVENT_TYPES and not (
            type.startswith("x.") and CUSTOM_NAME.match(type[2:])
        ):
            raise ValueError(f"agents cannot emit events of type {type!r}")
        data = data or {}
        if type == "usage":
            check_usage(data)
        elif type == "plan.updated":
            check_plan(data.get("entries"))
        elif type == "tool.completed" and data.get("content") is not None:
            check_tool_content(data["content"])
        return await self._execution.emit(type, data)

    async def ask(
        self,
        title: str,
        details: Any = None,
        choices: Sequence[str] = ("approve", "deny"),
        kind: str = "approval",
        timeout: float | None = None,
    ) -> str:
        """Ask a person and wait for their choice; see ``agents.Run.ask``."""
        if not isinstance(title, str) or not title.strip():
            raise ValueError("ask() needs a title: the question a person sees")
        if isinstance(choices, str) or not isinstance(choices, Sequence):
            raise ValueError("ask()'s choices are a list of strings")
        choices = list(choices)
        if not choices or len(choices) > MAX_CHOICES or len(set(choices)) != len(choices):
            raise ValueError(f"ask() takes 1 to {MAX_CHOICES} different choices")
        if not all(isinstance(choice, str) and choice.strip() for choice in choices):
            raise ValueError("each of ask()'s choices is a non-empty string")
        if not isinstance(kind, str) or not kind:
            raise ValueError("ask()'s kind is a non-empty string, e.g. 'approval'")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ValueError(
                f"ask()'s timeout is a positive number of seconds or None, not {timeout!r}"
            )
        return await self._execution.ask(title, details, choices, kind, timeout)

    async def custom(self, name: str, data: dict[str, Any] | None = None) -> int:
        """Append an agent-defined event ``x.<name>``."""
        return await self.emit(f"x.{name}", data)

    async def message_started(self, role: str = "assistant") -> str:
        """Start a message; returns its id for ``text`` and ``message_completed``."""
        self._messages += 1
        message_id = f"m{self._messages}"
        await self._execution.emit("message.started", {"message_id": message_id, "role": role})
        self._message_id = message_id
        return message_id

    async def text(self, delta: str, message_id: str | None = None) -> int:
        """Stream a piece of text into a message (the current one by default)."""
        if message_id is None:
            message_id = self._message_id or await self.message_started()
        return await self._execution.emit("text.delta", {"message_id": message_id, "delta": delta})

    async def message_completed(self, message_id: str | None = None) -> int:
        message_id = message_id or self._message_id
        if message_id is None:
            raise ValueError("no message to complete")
        if message_id == self._message_id:
            self._message_id = None
        return await self._execution.emit("message.completed", {"message_id": message_id})

    async def tool_started(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        kind: str | None = None,
        title: str | None = None,
    ) -> str:
        """Record that a tool call starts; returns its ``call_id``.

        ``kind`` (read, edit, execute, search, fetch, think, ...) and ``title``
        (what it does, for a person) are shown by the views.
        """
        assert self._execution.calls is not None  # set by every RunContext's __init__
        self._execution.calls += 1
        call_id = f"c{self._execution.calls}"
        data: dict[str, Any] = {"call_id": call_id, "name": name, "args": args or {}}
        for key, value in (("kind", kind), ("title", title)):
            if value is not None:
                if not isinstance(value, str):
                    raise ValueError(f"a tool's {key} is text, not {type(value).__name__}")
                data[key] = value
        await self._execution.emit("tool.started", data)
        return call_id

    async def tool_completed(
        self,
        call_id: str,
        result: Any = None,
        *,
        ok: bool = True,
        error: Any = None,
        content: list[dict[str, Any]] | None = None,
    ) -> int:
        """Record a tool call's end; ``content``: what it showed (see ``check_tool_content``)."""
        data: dict[str, Any] = {"call_id": call_id, "ok": ok}
        if ok:
            data["result"] = result
        else:
            data["error"] = error
        if content is not None:
            check_tool_content(content)
            data["content"] = content
        try:
            return await self._execution.emit("tool.completed", data)
        except EventTooLarge as exc:
            # The step ends all the same, saying why (the run fails, as any
            # oversized event makes it): never a step left running.
            error = {"type": "event_too_large", "message": f"the call's end was not kept: {exc}"}
            await self._execution.emit(
                "tool.completed", {"call_id": call_id, "ok": False, "error": error}
            )
            raise

    async def reasoning(self, delta: str, message_id: str | None = None) -> int:
        """Stream a piece of the model's visible thinking (the views fold it under "Thinking")."""
        if not isinstance(delta, str):
            raise ValueError(f"reasoning is text, not {type(delta).__name__}")
        message_id = message_id or self._message_id or f"m{self._messages + 1}"
        return await self._execution.emit(
            "reasoning.delta", {"message_id": message_id, "delta": delta}
        )

    async def plan(self, entries: list[dict[str, Any]]) -> int:
        """The agent's plan now, replacing the last: ``[{content, status, priority?}]``."""
        check_plan(entries)
        return await self._execution.emit("plan.updated", {"entries": entries})

    def tool(self, name: str, args: dict[str, Any] | None = None) -> ToolCall:
        """``async with run.tool("name", args) as call: call.result = ...``."""
        return ToolCall(self, name, args or {})

    async def progress(self, fraction: float | None, message: str = "") -> int:
        if fraction is not None and not 0 <= fraction <= 1:
            raise ValueError("progress fraction must be between 0 and 1, or None")
        return await self._execution.emit("progress", {"fraction": fraction, "message": message})

    async def usage(self, input_tokens: int, output_tokens: int) -> int:
        """Token totals so far (each usage event replaces the last)."""
        data = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        check_usage(data)
        return await self._execution.emit("usage", data)

    async def durable(self) -> None:
        """Wait until every event emitted so far is committed to the store.

        Call it before a side effect that must not be repeated: after a crash
        the log shows what was done.
        """
        await self._execution.durable()

    async def history(self) -> list[dict[str, Any]]:
        """The run's kept events so far, oldest first (``{seq, type, ts, data}``)."""
        read = self._execution.history
        return [] if read is None else await read()

    async def save_checkpoint(self, value: Any) -> None:
        """Keep a JSON value for a later attempt, committed after every event emitted before it."""
        await self._execution.save_checkpoint(value)
        self.checkpoint = value

    async def conversation(self) -> Any:
        """The last checkpoint an earlier run of this owner, session and agent saved, or None."""
        read = self._execution.conversation
        return None if read is None or self.session is None else await read()

    async def answer_to(self, request_id: str) -> str:
        """Wait for the answer to a question an earlier attempt asked."""
        return await self._execution.await_answer(request_id)


class SyncRun:
    """The ``run`` a plain-function agent gets: the same methods, blocking, from its worker thread."""

    _METHODS = {
        "emit", "custom", "message_started", "text", "message_completed",
        "tool_started", "tool_completed", "progress", "usage", "durable", "ask",
        "history", "save_checkpoint", "answer_to", "reasoning", "plan", "conversation",
    }  # fmt: skip

    def __init__(self, run: RunContext, execution: Execution, loop: asyncio.AbstractEventLoop):
        self._run = run
        self._execution = execution
        self._loop = loop
        self.run_id = run.run_id
        self.input = run.input
        self.metadata = run.metadata
        self.attempt = run.attempt
        self.snapshot = run.snapshot
        self.notebook_tools = run.notebook_tools
        self.mcp_servers = run.mcp_servers

    @property
    def cancelled(self) -> bool:
        return self._run.cancelled

    @property
    def checkpoint(self) -> Any:
        return self._run.checkpoint

    def __getattr__(self, name: str):
        if name not in self._METHODS:
            raise AttributeError(name)
        method = getattr(self._run, name)

        @functools.wraps(method)
        def call(*args, **kwargs):
            if self._execution.closed:
                raise RunClosed(f"run {self.run_id} has ended")
            try:
                future = asyncio.run_coroutine_threadsafe(method(*args, **kwargs), self._loop)
            except RuntimeError:  # the server's event loop is gone
                raise RunClosed(f"run {self.run_id} has ended") from None
            return future.result()

        return call


class Executor:
    """Runs agents, each run a task, and ends each run with its one terminal event."""

    def __init__(
        self,
        *,
        writer: Writer,
        broadcaster: Broadcaster,
        max_event_bytes: int,
        max_run_seconds: float,
        log: logging.Logger,
        on_finished: Callable[[Execution], None],
        check_usage: Callable[[Execution], str | None] | None = None,
        history: Callable[[str], Any] | None = None,
        conversation: Callable[[dict[str, Any]], Any] | None = None,
        max_resume_attempts: int = 0,
        notebook_tools: Callable[[RunContext], Any] | None = None,
        mcp_servers: dict[str, dict[str, Any]] | None = None,
        agent_silence_seconds: float = 0,
    ):
        self._notebook_tools = notebook_tools
        self._mcp_servers = mcp_servers or {}
        self._history = history
        self._conversation = conversation
        self._max_resume_attempts = max_resume_attempts
        self._writer = writer
        self._broadcaster = broadcaster
        self._max_event_bytes = max_event_bytes
        self._max_run_seconds = max_run_seconds
        self._agent_silence_seconds = agent_silence_seconds
        self._log = log
        self._on_finished = on_finished
        self._check_usage = check_usage
        self.live: dict[str, Execution] = {}
        self._tasks: set[asyncio.Task] = set()

    def start(self, row: dict[str, Any], spec: AgentSpec) -> None:
        """Start executing a freshly created (queued) run."""
        execution = self._execution(row, spec)
        self._spawn(self._execute(execution, spec))

    def resume(self, row: dict[str, Any], spec: AgentSpec, snapshot: reducer.Snapshot) -> None:
        """Go on with a run taken over from another executor (its ``run.resumed`` is committed).

        ``snapshot`` is the run's, up to and with that event: the agent is called
        again and sees what the run did so far as ``run.snapshot``.
        """
        execution = self._execution(row, spec)
        execution.snapshot = snapshot
        execution.resumed_from = json.loads(json.dumps(snapshot.to_dict()))
        execution.track_waiting()  # a question still open: it waits from now
        execution.started = True
        self._spawn(self._execute(execution, spec, resumed=True))

    def _execution(self, row: dict[str, Any], spec: AgentSpec) -> Execution:
        execution = Execution(
            row, self._writer, self._broadcaster, self._max_event_bytes, self._check_usage
        )
        execution.resumable = spec.resumable
        if self._history is not None:
            execution.history = functools.partial(self._history, execution.run_id)
        if self._conversation is not None:
            execution.conversation = functools.partial(self._conversation, execution.row)
        self.live[execution.run_id] = execution
        self._broadcaster.open(execution.run_id, execution.seq)
        return execution

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, execution: Execution, spec: AgentSpec, resumed: bool = False) -> None:
        try:
            if execution.ending and not resumed:
                return  # stopped while queued: cancel() or shutdown() end it
            execution.started = True
            await execution.reserve()
            if execution.ending:  # asked to stop while waiting for queue space
                await self._finish(execution)
                return
            if not resumed:
                execution.apply(lifecycle.started())
            agent = execution.task = asyncio.ensure_future(self._call_agent(execution, spec))
            # The end may be decided by something else (a cancel, an oversized
            # event): retrieve the agent's exception anyway, or asyncio logs
            # "Task exception was never retrieved" with a traceback.
            agent.add_done_callback(_retrieve)
            stopping = asyncio.ensure_future(execution.stopping.wait())
            overdue = await self._watch(execution, {agent, stopping})
            stopping.cancel()
            if not agent.done():
                if execution.stop is None:
                    execution.request_stop(overdue or Stop.DEADLINE)
                agent.cancel()
                # The agent's finally blocks get a bounded time, not forever.
                await asyncio.wait({agent}, timeout=CANCEL_GRACE_SECONDS)
            await self._finish(execution)
        except RunClosed:
            await self._forget(execution)
        except Exception:
            self._log.exception("agentruns: executing %s failed", execution.run_id)
            await self._forget(execution)

    async def _watch(self, execution: Execution, waits: set[asyncio.Future]) -> Stop | None:
        """Wait until one of ``waits`` is done (None), or the run is overdue: why it must stop.

        ``Stop.DEADLINE`` after ``max_run_seconds``; ``Stop.SILENT`` once its
        agent has emitted nothing for ``agent_silence_seconds`` (when set).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_run_seconds
        silence = self._agent_silence_seconds
        while True:
            timeout = deadline - loop.time()
            if silence > 0:
                timeout = min(timeout, max(execution.silence_left(silence), 0))
            done, _ = await asyncio.wait(
                waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                return None
            if loop.time() >= deadline:
                return Stop.DEADLINE
            if silence > 0 and execution.silence_left(silence) <= 0:
                return Stop.SILENT

    def context(self, execution: Execution) -> RunContext:
        """A ``run`` for the agent API on a live run (its agent's, or the notebook tools')."""
        run = RunContext(execution)
        if self._notebook_tools is not None:
            run.notebook_tools = self._notebook_tools(run)
        run.mcp_servers = {name: dict(entry) for name, entry in self._mcp_servers.items()}
        return run

    async def _call_agent(self, execution: Execution, spec: AgentSpec) -> Any:
        run = self.context(execution)
        if spec.is_async:
            return await spec.fn(run, run.input)
        # A daemon thread, not a pool: a cancelled plain function cannot be
        # stopped, and must neither hold a worker forever nor block exit.
        loop = asyncio.get_running_loop()
        result = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if result.done():
                return
            if ok:
                result.set_result(value)
            else:
                result.set_exception(value)

        def target() -> None:
            try:
                outcome = (True, spec.fn(SyncRun(run, execution, loop), run.input))
            except BaseException as exc:
                outcome = (False, exc)
            try:
                loop.call_soon_threadsafe(settle, *outcome)
            except RuntimeError:
                pass  # the server stopped meanwhile

        threading.Thread(target=target, name=f"agentruns-{execution.run_id}", daemon=True).start()
        return await result

    async def _finish(self, execution: Execution) -> None:
        """Commit the run's one terminal event, wait for it, let the run go.

        A resumable run the server hands over at its shutdown gets none: its
        lease is released, and the next server takes it over.
        """
        if execution.stop is Stop.HANDOVER and not execution.closed:
            execution.closed = True  # the agent's last events are in; nothing more
            execution.stop_asking()
            await self._forget(execution)
            if not self._writer.closed:
                run_id, executor_id = execution.run_id, execution.row["executor_id"]

                @in_transaction
                def release(conn: StoreConnection) -> None:
                    conn.release_run(run_id, executor_id)

                await self._writer.run(release)
                metrics.RUNS_HANDED_OVER.inc()
            return
        if not execution.closed:
            transition = self._outcome(execution)
            try:
                await execution.end(transition)
            except (TypeError, ValueError) as exc:  # an output that is not JSON, or too large
                if transition.type != "run.succeeded":
                    raise
                error = {
                    "type": "invalid_output",
                    "message": f"the agent's output cannot be stored: {exc}",
                }
                await execution.end(lifecycle.failed(error))
        await self._forget(execution)

    def _outcome(self, execution: Execution) -> Transition:
        """How the run ends, from why it stopped and what its agent did."""
        task = execution.task
        if execution.stop is Stop.CANCEL:
            assert execution.cancel is not None  # set with this stop
            return lifecycle.cancelled(execution.cancel["reason"], execution.cancel["stage"])
        if execution.stop is Stop.SHUTDOWN:
            return lifecycle.interrupted("server_shutdown")
        if execution.stop is Stop.DEADLINE:
            return lifecycle.failed(
                {
                    "type": "deadline_exceeded",
                    "message": f"the run took longer than max_run_seconds ({self._max_run_seconds:g} s)",
                }
            )
        if execution.stop is Stop.SILENT:
            return lifecycle.failed(
                {
                    "type": "agent_silent",
                    "message": "the agent said nothing for "
                    f"{self._agent_silence_seconds:g} s (agent_silence_seconds) and was stopped",
                }
            )
        if execution.fatal is not None:
            error = error_object(execution.fatal)
            if isinstance(execution.fatal, EventTooLarge):
                error["type"] = "event_too_large"
            return lifecycle.failed(error)
        if task is None or not task.done() or task.cancelled():
            return lifecycle.failed(
                {"type": "cancelled", "message": "the agent stopped without an answer"}
            )
        if (failure := task.exception()) is not None:
            self._log.warning("agentruns: run %s failed", execution.run_id, exc_info=failure)
            return lifecycle.failed(error_object(failure))
        return lifecycle.succeeded(task.result())

    async def _forget(self, execution: Execution) -> None:
        try:
            await execution.durable()
        except RunClosed:
            pass
        self.live.pop(execution.run_id, None)
        self._broadcaster.close(execution.run_id)
        self._on_finished(execution)
        if execution.bytes >= RELEASE_MEMORY_AFTER_BYTES:
            # The run's text was freed just now, but the C allocator keeps the
            # pages; a big run would otherwise leave the server that much larger.
            asyncio.get_running_loop().call_soon(release_memory)

    async def cancel(
        self, execution: Execution, reason: Any, requested_at: str | None = None
    ) -> bool:
        """Start cancelling a run; False when it was already ending or cancelling.

        ``requested_at``: when the cancel was asked of another server sharing the store.
        """
        if execution.ending:
            return False
        await execution.reserve()
        if execution.ending:  # it ended, or another cancel won, while we waited
            return False
        # Decide and append with no await in between: whatever the run does
        # next comes after its cancel_requested event.
        transition = lifecycle.cancel_requested(
            reason, requested_at or now_iso(), execution.stage()
        )
        execution.apply(transition)
        execution.cancel = transition.fields["cancel"]
        execution.request_stop(Stop.CANCEL)
        if not execution.started:
            self._spawn(self._finish(execution))
        await execution.durable()
        return True

    def lost(self, run_id: str, taken: bool = True) -> None:
        """The store refused this run's events and the run has ended: stop it, write nothing more.

        ``taken``: another server ended it; else the writer ended it failed
        (``invalid_event``: a value the store cannot hold).
        """
        execution = self.live.get(run_id)
        if execution is None:
            return
        if taken:
            metrics.LEASES_LOST.inc()
        execution.closed = True
        execution.request_stop(Stop.LOST)
        execution.stop_asking()
        channel = self._broadcaster.get(run_id)
        if channel is not None:
            channel.signal.fire()
        if not self._writer.closed:
            self._writer.forget_refused(run_id)

    async def shutdown(self) -> None:
        """End every live run ``interrupted`` (reason ``server_shutdown``) and wait for it.

        A resumable run is handed over instead: its agent is stopped, its lease
        released, and the next server to look takes it over.
        """
        for execution in list(self.live.values()):
            if execution.ending:
                continue
            takeovers = (execution.row.get("attempt") or 1) - 1
            hand_over = execution.resumable and takeovers < self._max_resume_attempts
            execution.request_stop(Stop.HANDOVER if hand_over else Stop.SHUTDOWN)
            if not execution.started:
                self._spawn(self._finish(execution))
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CANCEL_GRACE_SECONDS + 5)


def check_plan(entries: Any) -> None:
    """Refuse a plan that is not a list of ``{content, status, priority?}`` (ValueError, to the agent)."""
    if not isinstance(entries, list):
        raise ValueError("a plan is a list of entries")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise ValueError("each entry of a plan has its content as text")
        if entry.get("status") not in PLAN_STATUSES:
            raise ValueError(f"a plan entry's status is one of {', '.join(PLAN_STATUSES)}")
        if not isinstance(entry.get("priority", ""), str):
            raise ValueError("a plan entry's priority is text")


def check_tool_content(content: Any) -> None:
    """Refuse tool content that is not ``[{type: "text", text} | {type: "diff", path, old_text, new_text}]``."""
    if not isinstance(content, list):
        raise ValueError("a tool's content is a list")
    for item in content:
        if not isinstance(item, dict):
            raise ValueError("each item of a tool's content is an object")
        if item.get("type") == "text" and isinstance(item.get("text"), str):
            continue
        if (
            item.get("type") == "diff"
            and isinstance(item.get("path"), str)
            and isinstance(item.get("new_text"), str)
            and (item.get("old_text") is None or isinstance(item.get("old_text"), str))
        ):
            continue
        raise ValueError(
            "a tool's content items are {type: 'text', text} or "
            "{type: 'diff', path, old_text (None for a new file), new_text}"
        )


def check_usage(data: Any) -> None:
    """Refuse usage an agent hands over that is not token counts (ValueError, to the agent).

    An absurd count (``10**20``) is out of the store's range: in a batch of
    the writer it would take other runs' events down with it.
    """
    problem = budgets.usage_problem(data)
    if problem is not None:
        raise ValueError(problem)


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
