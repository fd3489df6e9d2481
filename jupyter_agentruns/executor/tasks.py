"""The executor: each run an asyncio task owned by the server, from its start to its end.

``Executor`` starts runs and resumes runs taken over, watches their deadline
and their agent's silence, cancels them, takes their answers, decides how
each ends (its one terminal event, as ``lifecycle`` says), hands resumable
runs over at a shutdown, and lets go of runs another server took. The rest
of the server names a run by its id: the ``Execution`` of each live run is
the executor's own.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .. import budgets, lifecycle, metrics, reducer, tracing
from ..agents import AgentSpec, EventTooLarge, RunClosed
from ..broadcaster import Broadcaster
from ..domain import RunRow
from ..errors import error_object
from ..lifecycle import Transition
from ..store import StoreConnection
from ..timeutil import now_iso
from ..tuning import release_memory
from ..writer import Writer, in_transaction
from .context import RunContext, SyncRun
from .execution import Execution, Stop
from .provisions import RunProvisions

# How long a cancelled agent gets to run its ``finally`` blocks.
CANCEL_GRACE_SECONDS = 10
# A run that emitted this much gives the freed memory back to the system when it ends.
RELEASE_MEMORY_AFTER_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class FinishedRun:
    """A run that ended here (or was handed over, or lost), as the executor lets it go."""

    run_id: str
    owner: str
    session: str | None
    tokens: int  # its usage totals at the end


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
        on_finished: Callable[[FinishedRun], None],
        check_usage: Callable[[str, int, dict[str, int]], budgets.Overspent | None] | None = None,
        history: Callable[[str], Any] | None = None,
        conversation: Callable[[RunRow], Awaitable[Any]] | None = None,
        max_resume_attempts: int = 0,
        provisions: RunProvisions | None = None,
        agent_silence_seconds: float = 0,
        tracer: Any = None,
    ):
        # OpenTelemetry's tracer when it traces runs (``tracing.configure``), else None.
        self._tracer = tracer
        self._provisions = provisions or RunProvisions()
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
        # The runs this server executes now, by id.
        self._live: dict[str, Execution] = {}
        self._tasks: set[asyncio.Task] = set()

    def start(self, row: RunRow, spec: AgentSpec) -> None:
        """Start executing a freshly created (queued) run."""
        execution = self._execution(row, spec)
        self._spawn(self._execute(execution, spec))

    def resume(self, row: RunRow, spec: AgentSpec, snapshot: reducer.Snapshot) -> None:
        """Go on with a run taken over from another executor (its ``run.resumed`` is committed).

        ``snapshot`` is the run's, up to and with that event: the agent is called
        again and sees what the run did so far as ``run.snapshot``.
        """
        execution = self._execution(row, spec)
        execution.resume(snapshot)
        self._spawn(self._execute(execution, spec, resumed=True))

    def _execution(self, row: RunRow, spec: AgentSpec) -> Execution:
        execution = Execution(
            row, self._writer, self._broadcaster, self._max_event_bytes, self._check_usage
        )
        execution.resumable = spec.resumable
        if self._history is not None:
            execution.history = functools.partial(self._history, execution.run_id)
        if self._conversation is not None:
            execution.conversation = functools.partial(self._conversation, execution.row)
        self._live[execution.run_id] = execution
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
            if self._tracer is not None:
                execution.trace = tracing.RunTrace(self._tracer, execution.row, resumed)
            # Its span's context is kept with the run: its start's, or (taken over) one write more.
            traceparent = execution.trace.traceparent if execution.trace is not None else None
            if not resumed:
                execution.apply(lifecycle.started(traceparent))
            elif traceparent is not None:
                await execution.save_trace_context(traceparent)
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

    def _context(self, execution: Execution) -> RunContext:
        """A ``run`` for the agent API on a live run (its agent's, or the notebook tools')."""
        return self._provisions.equip(RunContext(execution))

    async def _call_agent(self, execution: Execution, spec: AgentSpec) -> Any:
        # The run's span is current for its agent: what it starts or calls carries it.
        with tracing.current(execution.trace):
            if execution.resumed_from is not None:
                # A budget question open when its last server stopped: answered before the agent goes on.
                await execution.ask_for_more()
            return await self._agent(execution, spec)

    async def _agent(self, execution: Execution, spec: AgentSpec) -> Any:
        run = self._context(execution)
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

        threading.Thread(
            target=contextvars.copy_context().run,
            args=(target,),
            name=f"agentruns-{execution.run_id}",
            daemon=True,
        ).start()
        return await result

    async def _finish(self, execution: Execution) -> None:
        """Commit the run's one terminal event, wait for it, let the run go.

        A resumable run the server hands over at its shutdown gets none: its
        lease is released, and the next server takes it over.
        """
        if execution.stop is Stop.HANDOVER and not execution.closed:
            execution.closed = True  # the agent's last events are in; nothing more
            execution.questions.stop_asking()
            await self._forget(execution)
            if not self._writer.closed:
                run_id, executor_id = execution.run_id, execution.row["executor_id"]
                assert executor_id is not None  # a running run is held by its executor

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
        if execution.trace is not None:
            execution.trace.end()  # handed over, or lost: else its terminal event ended it
        self._live.pop(execution.run_id, None)
        self._broadcaster.close(execution.run_id)
        self._on_finished(
            FinishedRun(
                execution.run_id, execution.owner, execution.row.get("session"), execution.tokens
            )
        )
        if execution.bytes >= RELEASE_MEMORY_AFTER_BYTES:
            # The run's text was freed just now, but the C allocator keeps the
            # pages; a big run would otherwise leave the server that much larger.
            asyncio.get_running_loop().call_soon(release_memory)

    async def cancel(self, run_id: str, reason: Any, requested_at: str | None = None) -> bool:
        """Start cancelling a run executed here; False when it was already ending or cancelling, or is not here.

        ``requested_at``: when the cancel was asked of another server sharing the store.
        """
        execution = self._live.get(run_id)
        if execution is None or execution.ending:
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
        execution = self._live.get(run_id)
        if execution is None:
            return
        if taken:
            metrics.LEASES_LOST.inc()
        execution.closed = True
        execution.request_stop(Stop.LOST)
        execution.questions.stop_asking()
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
        for execution in list(self._live.values()):
            if execution.ending:
                continue
            takeovers = (execution.row.get("attempt") or 1) - 1
            hand_over = execution.resumable and takeovers < self._max_resume_attempts
            execution.request_stop(Stop.HANDOVER if hand_over else Stop.SHUTDOWN)
            if not execution.started:
                self._spawn(self._finish(execution))
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CANCEL_GRACE_SECONDS + 5)

    def resolve(
        self,
        run_id: str,
        request_id: str,
        choice: str,
        *,
        note: str | None = None,
        by: str | None = None,
        check: Callable[[dict[str, Any] | None], bool],
    ) -> bool:
        """Answer a question of a run executed here at once; False when the run is not here.

        ``check`` sees the question as it is (None: the run has none by that
        id) and says whether to leave it (True: answered already) or raises;
        checked and resolved with no await in between: of two racing answers, one wins.
        """
        execution = self._live.get(run_id)
        if execution is None:
            return False
        if not execution.closed and not check(execution.questions.find(request_id)):
            execution.questions.resolve(request_id, choice, note=note, by=by)
        return True

    async def answer(
        self,
        run_id: str,
        request_id: str,
        choice: str,
        *,
        note: str | None = None,
        by: str | None = None,
        check: Callable[[dict[str, Any] | None], bool],
    ) -> bool:
        """``resolve``, then wait until the run's events so far are committed; False when the run is not here."""
        execution = self._live.get(run_id)
        if not self.resolve(run_id, request_id, choice, note=note, by=by, check=check):
            return False
        assert execution is not None  # resolve found it
        try:
            await execution.durable()
        except RunClosed:
            pass  # another server ended it: the store says how
        return True

    def executes(self, run_id: str) -> bool:
        """Whether this server executes the run now."""
        return run_id in self._live

    def running_ids(self) -> list[str]:
        """The runs this server executes now."""
        return list(self._live)

    def busy(self, patience: float) -> list[str]:
        """The runs here, but the resumable ones that have waited for an answer ``patience`` seconds or longer."""
        now = time.monotonic()
        return sorted(
            run_id
            for run_id, execution in self._live.items()
            if not (
                execution.resumable
                and execution.questions.waiting_since is not None
                and now - execution.questions.waiting_since >= patience
            )
        )

    def tokens(self) -> dict[str, tuple[str, int]]:
        """Each run here by id: its owner and the tokens it used so far."""
        return {run_id: (e.owner, e.tokens) for run_id, e in self._live.items()}

    def context_for(self, run_id: str) -> tuple[asyncio.Event, RunContext] | None:
        """A ``run`` on a live run for a caller beside its agent (the notebook tools over MCP).

        With the event set once the run is asked to stop; None when the run
        is not here or is ending.
        """
        execution = self._live.get(run_id)
        if execution is None or execution.ending:
            return None
        return execution.stopping, self._context(execution)


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
