"""The engine: the store, its writer and readers, the broadcaster, the executor and the parts that use them.

HTTP handlers speak to this and nothing else. Every method takes the caller's
``owner`` and answers another owner's run exactly as a missing one. The
``Engine`` wires its parts together and does nothing of theirs; each part
owns its state:

- ``reads.Reads``: run objects and their snapshots, list pages, big answers;
- ``streams.Streams``: event streams and long-polls, from a cursor (the frames to send);
- ``submissions.Submissions``: ``POST runs``;
- ``controls.Controls``: cancel, answer, delete;
- ``queues.Queues``: session queues;
- ``upkeep.Upkeep``: leases, and runs whose executor is gone;
- ``tokens.TokenBudgets``: token budgets per run and per owner's day;
- ``counting.RunCounts``: the store's runs by status, for the metrics;
- ``webhooks.Webhooks``: the users' hooks, and the deliveries of the store's outbox.
- ``schedules.Schedules``: schedules, and a run for each of their slots.

Threads: everything runs on the event loop, but for the functions marked
``writer.in_transaction`` (the writer runs them in its transaction, on its
thread; each checks it) and the reads given to ``Reader.run`` (reader
threads). The engine is a ``LoggingConfigurable`` child of the extension
app, for its log.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import contextmanager
from typing import Any

from traitlets.config import LoggingConfigurable

from .. import lifecycle, metrics, tracing
from ..agents import AgentSpec
from ..broadcaster import Broadcaster, Channel
from ..compaction import Compactor
from ..domain import JSONObject, RunHead, RunObject
from ..errors import ErrorCode, Problem
from ..events import EVENT, TYPE, Append
from ..executor import Executor, FinishedRun, RunContext, RunProvisions
from ..notebook_tools import NotebookAccess
from ..reader import Reader
from ..sessions import SessionPaths
from ..settings import Settings
from ..store import Store, StoreUnavailable
from ..store.sql import HOOK_EVENTS
from ..tuning import InterpreterTuning
from ..writer import Writer
from .controls import Controls
from .counting import RunCounts
from .forks import Forks
from .periodic import Passes
from .queues import Queues
from .reads import Reads, SnapshotReplaced
from .schedules import Schedules
from .streams import Streams
from .submissions import Submissions, SubmitRequest
from .tally import count_runs_in_commit
from .tokens import TokenBudgets
from .undo import Undo
from .upkeep import Upkeep
from .webhooks import Webhooks

__all__ = ["Engine", "Requests", "SnapshotReplaced", "SubmitRequest"]

# How long the requests being served when the server stops may take to finish
# before the store closes under them.
STOP_GRACE_SECONDS = 5.0


class Engine(LoggingConfigurable):
    """Runs owned by this server, and every other run of the store it shares."""

    def __init__(
        self,
        *,
        parent: Any,
        settings: Settings,
        store: Store,
        agents: dict[str, AgentSpec],
        agent_failures: dict[str, str] | None = None,
        on_activity: Callable[[], None] = lambda: None,
        sessions: SessionPaths | None = None,
        notebook: NotebookAccess | None = None,
        agent_stderr: Callable[[str], list[str] | None] | None = None,
        link_url: str = "",
    ):
        super().__init__(parent=parent)  # for its log: the server's
        # The notebook tools (None: a server without them, e.g. the command line's).
        self.notebook = notebook
        # What the agent process of a run this server executes wrote to stderr (ACP agents').
        self._agent_stderr = agent_stderr
        # A notebook's path in a session, relative to the server's root (none: as sent).
        self.sessions = sessions or SessionPaths(None)
        self.settings = settings
        self.store = store
        self.agents = agents
        self.agent_failures = agent_failures or {}
        self._on_activity = on_activity
        self.executor_id = "exec_" + secrets.token_urlsafe(12)
        self.reader = Reader(store)
        self.broadcaster = Broadcaster(self.reader, store)
        self.reads = Reads(self.reader, self.sessions)
        self.streams = Streams(
            settings=settings,
            broadcaster=self.broadcaster,
            owned_head=self.reads.owned_head,
            get_run=self.reads.get_run,
            stopping=lambda: self._stopping,
        )
        self.budgets = TokenBudgets(settings, self.reader, self._live_tokens)
        self.counts = RunCounts(
            self.reader, self.log, None if settings.store_wide_metrics else settings.owners_served
        )
        self.tuning = InterpreterTuning(settings)
        self.requests = Requests()
        self.open_streams: Counter[str] = Counter()
        # Made at start, on the server's event loop.
        self.writer: Writer | None = None
        self.executor: Executor | None = None
        self.compactor: Compactor | None = None
        self.upkeep: Upkeep | None = None
        self.queues: Queues | None = None
        self.submissions: Submissions | None = None
        self.forks: Forks | None = None
        self.controls: Controls | None = None
        self.undo: Undo | None = None
        self.webhooks: Webhooks | None = None
        # Where people open this server: run pages' links in webhooks' messages.
        self._link_url = settings.webhooks_link_url or link_url
        self.schedules: Schedules | None = None
        self._starting: asyncio.Future | None = None
        self._background: list[asyncio.Task] = []
        self._settling: set[asyncio.Future] = set()
        self._stopping = False
        self._stop_requested = asyncio.Event()
        metrics.RUNS.track(self, lambda engine: engine.counts.for_scrape())
        metrics.EXECUTING_RUNS.track(self, lambda engine: len(engine.running_ids()))

    @property
    def stopping(self) -> bool:
        """The server began to stop: requests are refused, streams end."""
        return self._stopping

    def running_ids(self) -> list[str]:
        """The runs this server is executing now."""
        return self.executor.running_ids() if self.executor is not None else []

    def busy(self) -> list[str]:
        """The live runs that keep this server from being culled as idle.

        All but the resumable runs that have waited for an answer longer than
        ``waiting_activity_seconds``: culled, the server hands them over with
        their questions, and the next server takes them over.
        """
        if self.executor is None:
            return []
        return self.executor.busy(self.settings.waiting_activity_seconds)

    def _live_tokens(self) -> dict[str, tuple[str, int]]:
        return self.executor.tokens() if self.executor is not None else {}

    # Life cycle ------------------------------------------------------------

    async def start(self) -> None:
        """Start the writer, the executor and the upkeep; safe to call from every request."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        try:
            await asyncio.shield(self._starting)
        except Exception:
            # Not cached: the next request tries again (the database may
            # have been locked by another process for a while).
            self._starting = None
            raise

    async def _start(self) -> None:
        if self._stopping:
            return  # the server stopped before its start came round: start nothing
        loop = asyncio.get_running_loop()
        self.broadcaster.start(loop)
        if self.writer is None:
            self._wire(loop)
        assert self.upkeep is not None and self.queues is not None  # wired above, or before
        assert self.webhooks is not None
        await self.webhooks.install_server_hooks()
        await self.upkeep.sweep()
        await self.queues.dispatch()
        if self._stopping:
            return
        self._background = [
            loop.create_task(self._maintain()),
            loop.create_task(self.webhooks.run(self._stop_requested)),
            loop.create_task(self._compact_periodically()),
            loop.create_task(self._schedule_periodically()),
        ]
        self.counts.start(loop)
        self.tuning.apply()

    def _wire(self, loop: asyncio.AbstractEventLoop) -> None:
        """The parts that write: they need the writer, which needs the running loop."""
        settings = self.settings
        self.writer = Writer(self.store, loop, self._on_commit, self.log)
        self.executor = Executor(
            writer=self.writer,
            broadcaster=self.broadcaster,
            max_event_bytes=settings.max_event_bytes,
            max_run_seconds=settings.max_run_seconds,
            agent_silence_seconds=settings.agent_silence_seconds,
            log=self.log,
            on_finished=self._run_finished,
            check_usage=self.budgets.check_usage,
            history=self.reads.history,
            conversation=self.reads.conversation,
            max_resume_attempts=settings.max_resume_attempts,
            tracer=tracing.configure(self.log),
            provisions=RunProvisions(
                notebook_tools=self.notebook.for_run if self.notebook is not None else None,
                notebook_writes=self.notebook.writes_for if self.notebook is not None else None,
                mcp_servers=settings.mcp_servers,
                in_doubt=settings.in_doubt,
            ),
        )
        self.compactor = Compactor(
            writer=self.writer,
            reader=self.reader,
            broadcaster=self.broadcaster,
            settings=settings,
            on_deleted=self.reads.forget,
        )
        common: dict[str, Any] = {
            "settings": settings,
            "writer": self.writer,
            "executor": self.executor,
        }
        wired = {
            **common,
            "agents": self.agents,
            "executor_id": self.executor_id,
            # Whose runs this server takes over and starts from a queue (None: everyone's).
            "served_owners": settings.owners_served,
            "budgets": self.budgets,
            "log": self.log,
            "on_activity": self._on_activity,
        }
        self.upkeep = Upkeep(**wired)
        self.queues = Queues(**wired, reader=self.reader)
        self.submissions = Submissions(
            **common,
            reads=self.reads,
            queues=self.queues,
            budgets=self.budgets,
            agents=self.agents,
            agent_failures=self.agent_failures,
            executor_id=self.executor_id,
            on_activity=self._on_activity,
            sessions=self.sessions,
        )
        self.forks = Forks(reads=self.reads, submissions=self.submissions, agents=self.agents)
        self.controls = Controls(**common, reads=self.reads, queues=self.queues)
        self.undo = Undo(
            writer=self.writer, reads=self.reads, executor=self.executor, notebook=self.notebook
        )
        self.webhooks = Webhooks(
            settings=settings,
            writer=self.writer,
            reader=self.reader,
            reads=self.reads,
            link_url=self._link_url,
            log=self.log,
        )
        self.schedules = Schedules(
            writer=self.writer,
            reader=self.reader,
            submissions=self.submissions,
            upkeep=self.upkeep,
            agents=self.agents,
            log=self.log,
        )

    async def stop(self) -> None:
        """End live runs ``interrupted`` (``server_shutdown``), commit, close the store.

        Resumable runs are handed over; runs queued in a session stay queued:
        the next server to start takes them, in order.
        """
        self._stopping = True
        if self.upkeep is not None and self.queues is not None:
            self.upkeep.stopping = self.queues.stopping = True
        self._stop_requested.set()
        if self.webhooks is not None:
            self.webhooks.wake()  # its loop sees the stop at once
        self.broadcaster.stop_waits()  # streams and long-polls end, their clients resume later
        # The upkeep and the dispatches finish what they are doing (a claim in
        # the writer's queue commits either way: its result must not be lost);
        # the retention pass is only cancelled.
        for task in self._background[2:]:
            task.cancel()
        # The cancelled ones too: a task left pending when the loop closes is an error.
        finishing: list[asyncio.Future] = [*self._background]
        if self.queues is not None:
            finishing += self.queues.pending
        if self._starting is not None and not self._starting.done():
            finishing.append(self._starting)  # its first dispatch may be claiming runs
        if finishing:
            await asyncio.wait(finishing, timeout=30)
        if self.webhooks is not None:
            await self.webhooks.stop()
        await self.requests.finished(STOP_GRACE_SECONDS)
        loop = asyncio.get_running_loop()
        if self.writer is not None:
            assert self.executor is not None  # wired with the writer
            await self.executor.shutdown()
            await loop.run_in_executor(None, self.writer.close)
            await loop.run_in_executor(None, tracing.flush)  # the spans still held are sent
        await loop.run_in_executor(None, self.reader.close)
        self.broadcaster.close_watch()
        self.counts.stop()
        self.tuning.undo()
        metrics.RUNS.untrack(self)
        metrics.EXECUTING_RUNS.untrack(self)

    # From commits to subscribers -------------------------------------------

    def _on_commit(self, appended: dict[str, list[Append]], refused: dict[str, str]) -> None:
        limit = self.settings.max_retained_events
        for run_id, items in appended.items():
            count_runs_in_commit(items)
            if self.webhooks is not None and any(
                [item[EVENT][TYPE] in HOOK_EVENTS for item in items]
            ):
                self.webhooks.wake()
            channel = self.broadcaster.get(run_id)
            if channel is None:
                continue
            channel.publish([item[EVENT] for item in items])
            # A live run over its event budget (with some slack, so this is
            # not every batch) is compacted while it goes on.
            kept = channel.committed_seq - channel.first_seq + 1
            if kept > limit + max(1, limit // 10) and not channel.compaction_due:
                channel.compaction_due = True
                asyncio.ensure_future(self._compact_live(channel))
        for run_id, why in refused.items():
            assert self.executor is not None  # commits come from the writer, wired with it
            self.executor.lost(run_id, taken=why == "taken")

    def _run_finished(self, run: FinishedRun) -> None:
        self.reads.forget(run.run_id)
        if self.notebook is not None:
            pending = self.notebook.forget(run.run_id)
            if pending and self.undo is not None:
                # Its edits that a call still going when it ended left pending.
                settling = asyncio.ensure_future(self.undo.settle_ended(run.run_id, pending))
                self._settling.add(settling)
                settling.add_done_callback(self._settling.discard)
        self.budgets.run_finished(run)
        self._on_activity()
        if run.session is not None:
            # Only a run of a session can be what queued runs wait for.
            assert self.queues is not None  # runs are executed once wired
            self.queues.soon()

    # Upkeep --------------------------------------------------------------

    async def _maintain(self) -> None:
        # Often enough that a cancel sent to another server sharing the
        # database takes effect within a second.
        interval = max(0.05, min(1.0, self.settings.lease_seconds / 3))
        assert self.upkeep is not None and self.queues is not None  # started once wired
        unavailable = False
        while not self._stopping:
            try:
                await asyncio.wait_for(self._stop_requested.wait(), interval)
                return  # the server stops
            except asyncio.TimeoutError:
                pass
            try:
                await self.upkeep.renew_leases()
                await self.upkeep.sweep()
                await self.queues.dispatch()
                await self.budgets.refresh()
            except StoreUnavailable as exc:
                # Said once per outage; the writer says when it commits again.
                if not unavailable:
                    self.log.warning("agentruns: lease upkeep waits for the store: %s", exc)
                unavailable = True
            except Exception:
                self.log.exception("agentruns: lease upkeep failed")
            else:
                unavailable = False

    async def _compact_live(self, channel: Channel) -> None:
        limit = self.settings.max_retained_events
        assert self.compactor is not None  # commits come from the writer, wired with it
        try:
            # Again while the run is still over its budget: the events committed
            # during a pass (a fast run, a slow database) trigger no pass of their own.
            while await self.compactor.compact(channel.run_id):
                if channel.committed_seq - channel.first_seq + 1 <= limit + max(1, limit // 10):
                    break
        except Exception:
            self.log.exception("agentruns: compacting %s failed", channel.run_id)
        finally:
            channel.compaction_due = False

    async def _compact_periodically(self) -> None:
        settings = self.settings
        shortest = min(settings.event_retention_seconds, settings.run_retention_seconds)
        interval = min(60.0, max(0.2, shortest / 4))
        assert self.compactor is not None  # started once wired
        while True:
            await asyncio.sleep(interval)
            try:
                counts = await self.compactor.run_once()
            except Exception:
                self.log.exception("agentruns: retention pass failed")
            else:
                if counts["deleted"]:
                    self.log.info(
                        "agentruns: deleted %d run(s) past run_retention_seconds", counts["deleted"]
                    )

    async def _schedule_periodically(self) -> None:
        """Submit the runs of the schedules' slots: at once (the slots missed while no
        server ran), then every ``schedule_tick_seconds``."""
        assert self.schedules is not None  # started once wired
        passes = Passes(self.log, "schedules")
        while not self._stopping:
            await passes.run(self.schedules.tick)
            await asyncio.sleep(self.settings.schedule_tick_seconds)

    # What handlers ask -------------------------------------------------------

    async def hooks(self) -> Webhooks:
        """The users' hooks (``webhooks.Webhooks``), once the engine started."""
        await self.start()
        assert self.webhooks is not None  # None only if the server stopped first: a 503
        return self.webhooks

    async def submit(
        self, owner: str, request: SubmitRequest, key: str | None, key_with_run: bool = False
    ) -> tuple[RunObject, bool]:
        """Create a run, or find the one this key made; returns ``(run, replayed)``."""
        await self.start()
        assert self.submissions is not None  # None only if the server stopped first: a 503
        return await self.submissions.submit(owner, request, key, key_with_run)

    async def fork(
        self,
        owner: str,
        run_id: str,
        at_seq: int,
        fields: JSONObject,
        metadata: JSONObject | None,
        key: str | None,
    ) -> tuple[RunObject, bool]:
        """Start a run from the state after event ``at_seq`` of another; returns ``(run, replayed)``."""
        await self.start()
        assert self.forks is not None  # None only if the server stopped first: a 503
        return await self.forks.fork(owner, run_id, at_seq, fields, metadata, key)

    async def cancel(self, owner: str, run_id: str, reason: str | None) -> tuple[RunObject, bool]:
        """Cancel a run; returns ``(run, started)``, started False when it was already ending."""
        await self.start()
        assert self.controls is not None  # None only if the server stopped first: a 503
        return await self.controls.cancel(owner, run_id, reason)

    async def answer(
        self,
        owner: str,
        by: str | None,
        run_id: str,
        request_id: str,
        choice: str,
        note: str | None,
    ) -> RunObject:
        """Answer a run's question; returns the run."""
        await self.start()
        assert self.controls is not None  # None only if the server stopped first: a 503
        return await self.controls.answer(owner, by, run_id, request_id, choice, note)

    async def delete(self, owner: str, run_id: str) -> None:
        await self.start()
        assert self.controls is not None  # None only if the server stopped first: a 503
        await self.controls.delete(owner, run_id)

    async def undo_edit(self, owner: str, run_id: str, edit_id: str) -> RunObject:
        """Reverse a run's applied notebook edit and record it ``undone``; returns the run."""
        await self.start()
        assert self.undo is not None  # None only if the server stopped first: a 503
        return await self.undo.undo(owner, run_id, edit_id)

    async def scheduled(self) -> Schedules:
        """The schedules part, once started (``POST/GET/PATCH/DELETE schedules``)."""
        await self.start()
        assert self.schedules is not None  # None only if the server stopped first: a 503
        return self.schedules

    def run_for_token(self, token: str) -> tuple[asyncio.Event, RunContext] | None:
        """For the live run a notebook tools token was made for: its stop signal and a ``run`` on it.

        None once the run ended or is ending.
        """
        run_id = self.notebook.run_of(token) if self.notebook is not None else None
        if run_id is None or self.executor is None:
            return None
        return self.executor.context_for(run_id)

    async def owned_head(self, owner: str, run_id: str) -> RunHead:
        """The caller's run's owner, status and seqs, or 404/410 (a small read)."""
        return await self.reads.owned_head(owner, run_id)

    async def get_run(self, owner: str, run_id: str) -> RunObject:
        return await self.reads.get_run(owner, run_id)

    async def text_after(
        self, owner: str, run_id: str, after_seq: int, max_chars: int
    ) -> tuple[str, int]:
        """The run's text written after ``after_seq`` and the seq it reaches (``Reads.text_after``)."""
        return await self.reads.text_after(owner, run_id, after_seq, max_chars)

    async def run_answer(
        self, owner: str, run_id: str, markdown: bool = False
    ) -> AsyncIterator[bytes]:
        """What ``GET runs/{id}`` answers, in pieces to send in turn (see ``Reads.run_answer``)."""
        return await self.reads.run_answer(owner, run_id, markdown)

    async def list_runs(self, owner: str, **query: Any) -> bytes:
        """One page of the owner's runs as JSON (see ``Reads.list_runs``)."""
        return await self.reads.list_runs(owner, **query)

    async def list_conversations(self, owner: str, **query: Any) -> dict[str, Any]:
        """One page of the owner's conversations (see ``Reads.list_conversations``)."""
        return await self.reads.list_conversations(owner, **query)

    async def agent_stderr(self, owner: str, run_id: str) -> dict[str, Any]:
        """The last lines the agent process of the caller's active run wrote to stderr.

        ``live`` is false when this server runs no such process for the run
        (not an ACP agent's run, ended, or executed by another server).
        """
        head = await self.reads.owned_head(owner, run_id)
        lines = None
        if self._agent_stderr is not None and lifecycle.is_active(head["status"]):
            lines = self._agent_stderr(run_id)
        return {"run_id": run_id, "live": lines is not None, "lines": lines or []}

    async def usage(self, owner: str) -> dict[str, int]:
        return await self.reads.usage(owner)

    # Events --------------------------------------------------------------

    @contextmanager
    def stream_slot(self, owner: str, kind: str):
        """Hold one of the owner's ``max_streams_per_user`` open streams.

        ``kind`` (``metrics.STREAM_KINDS``): run, page, or poll (a long-poll that waits).
        """
        limit = self.settings.max_streams_per_user
        if self.open_streams[owner] >= limit:
            raise Problem(
                ErrorCode.TOO_MANY_STREAMS,
                f"You have {limit} open event streams, the most allowed; "
                "close one (the page stream carries many runs on one connection).",
                retry_after=5,
            )
        self.open_streams[owner] += 1
        gauge = metrics.OPEN_STREAMS.labels(kind)
        gauge.inc()
        try:
            yield
        finally:
            self.open_streams[owner] -= 1
            gauge.dec()


class Requests:
    """The requests being served: a stop lets them finish before it closes the store."""

    def __init__(self) -> None:
        self.count = 0
        self._none = asyncio.Event()
        self._none.set()

    def began(self) -> None:
        self.count += 1
        self._none.clear()

    def ended(self) -> None:
        self.count -= 1
        if not self.count:
            self._none.set()

    async def finished(self, timeout: float) -> None:
        """Wait until none is being served, at most ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._none.wait(), timeout)
        except asyncio.TimeoutError:
            pass  # what those still going read or write next fails as the server stopping
