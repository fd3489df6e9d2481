"""The run executor: each run is an asyncio task owned by the server.

``RunContext`` is what an agent receives as ``run``: the only way events of a
run are written. It numbers them (contiguous ``seq``), keeps the run's live
snapshot with the reducer, and hands each event, with the run-state change it
implies, to the store writer. ``Executor`` starts runs, cancels them, enforces
the deadline, and decides each run's one terminal event.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import json
import logging
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from . import reducer, store
from .agents import AgentSpec
from .broadcaster import Waiter, envelope
from .timeutil import now_iso
from .writer import Append

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

# Event types an agent may emit itself; the run.* lifecycle is the executor's.
AGENT_EVENT_TYPES = {
    "message.started",
    "text.delta",
    "message.completed",
    "tool.started",
    "tool.completed",
    "progress",
    "usage",
}
CUSTOM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
# A tight-looping agent yields to the event loop this often, so commits are
# published and streams served while it runs.
YIELD_EVERY = 64
# How long a cancelled agent gets to run its ``finally`` blocks.
CANCEL_GRACE_SECONDS = 10
# A run that emitted this much gives the freed memory back to the system when it ends.
RELEASE_MEMORY_AFTER_BYTES = 16 * 1024 * 1024
# Absolute file paths in error messages: they say where the server keeps things.
# Not inside a URL: "https://host/a/b" keeps its path.
_PATH = re.compile(r"(?<![\w:/.~-])(?:[A-Za-z]:)?(?:[\\/][\w.~-]+){2,}[\\/]?")


# Built once: json.dumps with options builds an encoder per call. allow_nan=False:
# NaN is not JSON, and a browser could not parse the event.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


class RunClosed(Exception):
    """The run has ended (or was cancelled): it takes no more events."""


class EventTooLarge(ValueError):
    """An event's data is larger than ``max_event_bytes``."""


def error_object(exc: BaseException) -> dict[str, str]:
    """``{type, message}`` for a failed run: no traceback, no server paths.

    The type is the exception's ``error_type`` (a str attribute) if it has one, else its class name.
    """
    message = _PATH.sub("<path>", str(exc))[:2000]
    error_type = getattr(exc, "error_type", None)
    return {"type": error_type if isinstance(error_type, str) else type(exc).__name__, "message": message}


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
        if exc is None:
            await self._run.tool_completed(self.call_id, self.result)
        elif not isinstance(exc, (asyncio.CancelledError, RunClosed)):
            await self._run.tool_completed(self.call_id, ok=False, error=error_object(exc))


class RunContext:
    """An agent's handle on its run (the ``run`` argument)."""

    def __init__(self, executor: Executor, row: dict[str, Any]):
        self._executor = executor
        self._writer = executor.engine.writer
        self.run_id: str = row["run_id"]
        self.agent: str = row["agent"]
        self.input = row["input"]
        self.owner: str = row["owner"]
        self.session: str | None = row["session"]
        self._run_id_json = json.dumps(self.run_id)
        self._seq: int = row["last_seq"]
        self._snapshot = reducer.Snapshot()
        self._last_type: str | None = None
        self._closed = False
        self._cancel: dict[str, Any] | None = None
        self._fatal: BaseException | None = None
        self._interrupt_reason: str | None = None
        self._deadline_hit = False
        self._started = False
        self._since_yield = 0
        self._counters = {"m": 0, "c": 0}
        self._message_id: str | None = None
        self._agent_task: asyncio.Future | None = None
        self._stop = asyncio.Event()  # set by cancel() and shutdown()
        self._lost = False
        self._bytes = 0  # of event data emitted

    # What agents call ------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """True once the run was asked to stop (cancel, deadline or shutdown)."""
        return self._closed or self._cancel is not None or self._interrupt_reason is not None

    async def emit(self, type: str, data: dict[str, Any] | None = None) -> int:
        """Append one event of a documented type (or ``x.<name>``); returns its seq."""
        if type not in AGENT_EVENT_TYPES and not (
            type.startswith("x.") and CUSTOM_NAME.match(type[2:])
        ):
            raise ValueError(f"agents cannot emit events of type {type!r}")
        return await self._emit(type, data or {})

    async def custom(self, name: str, data: dict[str, Any] | None = None) -> int:
        """Append an agent-defined event ``x.<name>``."""
        return await self.emit(f"x.{name}", data)

    async def message_started(self, role: str = "assistant") -> str:
        """Start a message; returns its id for ``text`` and ``message_completed``."""
        self._counters["m"] += 1
        message_id = f"m{self._counters['m']}"
        await self._emit("message.started", {"message_id": message_id, "role": role})
        self._message_id = message_id
        return message_id

    async def text(self, delta: str, message_id: str | None = None) -> int:
        """Stream a piece of text into a message (the current one by default)."""
        if message_id is None:
            message_id = self._message_id or await self.message_started()
        return await self._emit("text.delta", {"message_id": message_id, "delta": delta})

    async def message_completed(self, message_id: str | None = None) -> int:
        message_id = message_id or self._message_id
        if message_id is None:
            raise ValueError("no message to complete")
        if message_id == self._message_id:
            self._message_id = None
        return await self._emit("message.completed", {"message_id": message_id})

    async def tool_started(self, name: str, args: dict[str, Any] | None = None) -> str:
        """Record that a tool call starts; returns its ``call_id``."""
        self._counters["c"] += 1
        call_id = f"c{self._counters['c']}"
        await self._emit("tool.started", {"call_id": call_id, "name": name, "args": args or {}})
        return call_id

    async def tool_completed(
        self, call_id: str, result: Any = None, *, ok: bool = True, error: Any = None
    ) -> int:
        data: dict[str, Any] = {"call_id": call_id, "ok": ok}
        if ok:
            data["result"] = result
        else:
            data["error"] = error
        return await self._emit("tool.completed", data)

    def tool(self, name: str, args: dict[str, Any] | None = None) -> ToolCall:
        """``async with run.tool("name", args) as call: call.result = ...``."""
        return ToolCall(self, name, args or {})

    async def progress(self, fraction: float | None, message: str = "") -> int:
        if fraction is not None and not 0 <= fraction <= 1:
            raise ValueError("progress fraction must be between 0 and 1, or None")
        return await self._emit("progress", {"fraction": fraction, "message": message})

    async def usage(self, input_tokens: int, output_tokens: int) -> int:
        """Token totals so far (each usage event replaces the last)."""
        return await self._emit("usage", {"input_tokens": input_tokens, "output_tokens": output_tokens})

    async def durable(self) -> None:
        """Wait until every event emitted so far is committed to the store.

        Call it before a side effect that must not be repeated: after a crash
        the log shows what was done.
        """
        channel = self._executor.engine.broadcaster.get(self.run_id)
        target = self._seq
        while channel is not None and channel.committed_seq < target:
            if self._lost:
                raise RunClosed(f"run {self.run_id} lost its store writes")
            await Waiter().wait([channel.signal], None)

    # The executor's side -------------------------------------------------

    async def _emit(self, type: str, data: dict[str, Any], fields: dict[str, Any] | None = None) -> int:
        data_json = self._encode(type, data)
        await self._reserve()
        seq = self._append(type, data, data_json, fields)
        self._since_yield += 1
        if self._since_yield >= YIELD_EVERY:
            self._since_yield = 0
            await asyncio.sleep(0)
        return seq

    def _encode(self, type: str, data: dict[str, Any]) -> str:
        if self._closed:
            raise RunClosed(f"run {self.run_id} has ended")
        data_json = _ENCODER.encode(data)
        limit = self._executor.engine.config.max_event_bytes
        if len(data_json) > limit:
            error = EventTooLarge(f"a {type} event of {len(data_json)} bytes is over max_event_bytes ({limit})")
            if type not in reducer.TERMINAL_TYPES:
                self._fatal = error
            raise error
        return data_json

    async def _reserve(self) -> None:
        """Wait until the writer's queue has room (backpressure: the disk sets the pace)."""
        if self._writer.full:
            await self._writer.wait_for_space()

    def _append(self, type: str, data: dict[str, Any], data_json: str, fields: dict[str, Any] | None) -> int:
        """Number the event and hand it to the writer; synchronous, so nothing interleaves."""
        if self._closed or self._writer.closed:
            raise RunClosed(f"run {self.run_id} has ended")
        seq = self._seq + 1
        ts = now_iso()
        if type in reducer.TERMINAL_TYPES:
            fields = dict(fields or {})
            # The builder itself: the writer streams it into the store in parts,
            # so a long text is never joined or encoded whole.
            fields["snapshot"] = self._snapshot
            fields["snapshot_seq"] = seq
        item = Append(
            self.run_id,
            seq,
            type,
            ts,
            data_json,
            store.encode_fields(fields) if fields else None,
            envelope(self._run_id_json, seq, type, ts, data_json),
        )
        self._writer.append(item)
        self._bytes += len(data_json)
        self._seq = seq
        if type in reducer.TERMINAL_TYPES:
            self._closed = True
        else:
            self._snapshot.apply({"type": type, "data": data})
            self._last_type = type
        return seq

    @property
    def _ending(self) -> bool:
        """Asked to stop (cancel or shutdown) or already ended."""
        return self._closed or self._cancel is not None or self._interrupt_reason is not None

    def _stage(self) -> dict[str, Any]:
        return {"seq": self._seq, "step": reducer.describe_step(self._snapshot.structure(), self._last_type)}


def release_memory() -> None:
    """Return the C heap's free pages to the system (glibc only; elsewhere nothing to do)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


class SyncRun:
    """The ``run`` a plain-function agent gets: the same methods, blocking, from its worker thread."""

    _METHODS = {
        "emit", "custom", "message_started", "text", "message_completed",
        "tool_started", "tool_completed", "progress", "usage", "durable",
    }  # fmt: skip

    def __init__(self, run: RunContext, loop: asyncio.AbstractEventLoop):
        self._run = run
        self._loop = loop
        self.run_id = run.run_id
        self.input = run.input

    @property
    def cancelled(self) -> bool:
        return self._run.cancelled

    def __getattr__(self, name: str):
        if name not in self._METHODS:
            raise AttributeError(name)
        method = getattr(self._run, name)

        @functools.wraps(method)
        def call(*args, **kwargs):
            if self._run._closed:
                raise RunClosed(f"run {self.run_id} has ended")
            try:
                future = asyncio.run_coroutine_threadsafe(method(*args, **kwargs), self._loop)
            except RuntimeError:  # the server's event loop is gone
                raise RunClosed(f"run {self.run_id} has ended") from None
            return future.result()

        return call


class Executor:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.live: dict[str, RunContext] = {}
        self._tasks: set[asyncio.Task] = set()

    def start(self, row: dict[str, Any], spec: AgentSpec) -> RunContext:
        """Start executing a freshly created (queued) run."""
        ctx = RunContext(self, row)
        self.live[ctx.run_id] = ctx
        self.engine.broadcaster.open(ctx.run_id, ctx._seq)
        self._spawn(self._execute(ctx, spec))
        return ctx

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _execute(self, ctx: RunContext, spec: AgentSpec) -> None:
        try:
            if ctx._ending:
                return  # ended while queued: cancel() or shutdown() finish it
            ctx._started = True
            data_json = ctx._encode("run.started", {})
            await ctx._reserve()
            if ctx._ending:  # asked to stop while waiting for queue space
                await self._finish(ctx)
                return
            ctx._append("run.started", {}, data_json, {"status": "running", "started_at": now_iso()})
            agent = ctx._agent_task = asyncio.ensure_future(self._call_agent(ctx, spec))
            # The end may be decided by something else (a cancel, an oversized
            # event): retrieve the agent's exception anyway, or asyncio logs
            # "Task exception was never retrieved" with a traceback.
            agent.add_done_callback(_retrieve)
            stop = asyncio.ensure_future(ctx._stop.wait())
            done, _ = await asyncio.wait(
                {agent, stop}, timeout=self.engine.config.max_run_seconds, return_when=asyncio.FIRST_COMPLETED
            )
            stop.cancel()
            if agent not in done:
                ctx._deadline_hit = not ctx._stop.is_set()
                agent.cancel()
                # The agent's finally blocks get a bounded time, not forever.
                await asyncio.wait({agent}, timeout=CANCEL_GRACE_SECONDS)
            await self._finish(ctx)
        except RunClosed:
            await self._forget(ctx)
        except Exception:
            log.exception("agentruns: executing %s failed", ctx.run_id)
            await self._forget(ctx)

    async def _call_agent(self, ctx: RunContext, spec: AgentSpec) -> Any:
        if spec.is_async:
            return await spec.fn(ctx, ctx.input)
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
                outcome = (True, spec.fn(SyncRun(ctx, loop), ctx.input))
            except BaseException as exc:
                outcome = (False, exc)
            try:
                loop.call_soon_threadsafe(settle, *outcome)
            except RuntimeError:
                pass  # the server stopped meanwhile

        threading.Thread(target=target, name=f"agentruns-{ctx.run_id}", daemon=True).start()
        return await result

    async def _finish(self, ctx: RunContext) -> None:
        """Emit the run's one terminal event, wait for it to commit, let the run go."""
        if not ctx._closed:
            await self._emit_terminal(ctx)
        await self._forget(ctx)

    async def _emit_terminal(self, ctx: RunContext) -> None:
        now = {"finished_at": now_iso(), "finished_ts": time.time()}
        task = ctx._agent_task
        if ctx._cancel is not None:
            data = {"reason": ctx._cancel["reason"], "stage": ctx._cancel["stage"]}
            await ctx._emit("run.cancelled", data, {"status": "cancelled", **now})
            return
        if ctx._interrupt_reason is not None:
            await ctx._emit(
                "run.interrupted", {"reason": ctx._interrupt_reason}, {"status": "interrupted", **now}
            )
            return
        if ctx._deadline_hit:
            seconds = self.engine.config.max_run_seconds
            error = {"type": "deadline_exceeded", "message": f"the run took longer than max_run_seconds ({seconds:g} s)"}
        elif ctx._fatal is not None:
            error = error_object(ctx._fatal)
            if isinstance(ctx._fatal, EventTooLarge):
                error["type"] = "event_too_large"
        elif not task.done() or task.cancelled():
            error = {"type": "cancelled", "message": "the agent stopped without an answer"}
        elif task.exception() is not None:
            exc = task.exception()
            log.warning("agentruns: run %s failed", ctx.run_id, exc_info=exc)
            error = error_object(exc)
        else:
            output = task.result()
            try:
                await ctx._emit(
                    "run.succeeded", {"output": output}, {"status": "succeeded", "output": output, **now}
                )
                return
            except (TypeError, ValueError) as exc:  # not JSON, or too large
                error = {"type": "invalid_output", "message": f"the agent's output cannot be stored: {exc}"}
        await ctx._emit("run.failed", {"error": error}, {"status": "failed", "error": error, **now})

    async def _forget(self, ctx: RunContext) -> None:
        try:
            await ctx.durable()
        except RunClosed:
            pass
        self.live.pop(ctx.run_id, None)
        self.engine.broadcaster.close(ctx.run_id)
        self.engine.forget_snapshot(ctx.run_id)
        self.engine.activity_changed()
        if ctx._bytes >= RELEASE_MEMORY_AFTER_BYTES:
            # The run's text was freed just now, but the C allocator keeps the
            # pages; a big run would otherwise leave the server that much larger.
            asyncio.get_running_loop().call_soon(release_memory)

    async def cancel(self, ctx: RunContext, reason: str | None, requested_at: str | None = None) -> bool:
        """Start cancelling ``ctx``; False when it was already ending or cancelling.

        ``requested_at``: when the cancel was asked of another server sharing the store.
        """
        if ctx._ending:
            return False
        data = {"reason": reason}
        data_json = ctx._encode("run.cancel_requested", data)
        await ctx._reserve()
        if ctx._ending:  # it ended, or another cancel won, while we waited
            return False
        # Decide and append with no await in between: whatever the run does
        # next comes after its cancel_requested event.
        ctx._cancel = {"requested_at": requested_at or now_iso(), "reason": reason, "stage": ctx._stage()}
        ctx._append("run.cancel_requested", data, data_json, {"status": "cancelling", "cancel": ctx._cancel})
        self._stop(ctx)
        await ctx.durable()
        return True

    def _stop(self, ctx: RunContext) -> None:
        """Make a run asked to stop (``_cancel`` or ``_interrupt_reason`` set) reach its end."""
        ctx._stop.set()
        if ctx._agent_task is not None:
            ctx._agent_task.cancel()
        elif not ctx._started:
            self._spawn(self._finish(ctx))
        # Otherwise _execute is waiting for queue space to emit run.started;
        # it sees the request and finishes the run itself.

    def lost(self, run_id: str) -> None:
        """The store refused this run's events (another server ended it): stop it."""
        ctx = self.live.get(run_id)
        if ctx is None:
            return
        ctx._lost = True
        ctx._closed = True
        ctx._stop.set()
        if ctx._agent_task is not None:
            ctx._agent_task.cancel()
        channel = self.engine.broadcaster.get(run_id)
        if channel is not None:
            channel.signal.fire()
        if not self.engine.writer.closed:
            self.engine.writer.forget_refused(run_id)

    async def shutdown(self) -> None:
        """End every live run ``interrupted`` (reason ``server_shutdown``) and wait for it."""
        for ctx in list(self.live.values()):
            if ctx._ending:
                continue
            ctx._interrupt_reason = "server_shutdown"
            self._stop(ctx)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CANCEL_GRACE_SECONDS + 5)
