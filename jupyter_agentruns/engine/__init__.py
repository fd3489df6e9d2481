"""The engine: store, writer, readers, broadcaster, executor and compactor put together.

HTTP handlers speak to this and nothing else. Every method takes the caller's
``owner`` and answers another owner's run exactly as a missing one. The
engine is a ``LoggingConfigurable`` child of the extension app: it reads its
settings (the ``c.AgentRuns.*`` traits) from its parent and logs through the
server's log.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import secrets
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from traitlets.config import LoggingConfigurable

from . import budgets, jsonio, lifecycle, metrics, reducer
from .agents import AgentSpec, RunClosed
from .broadcaster import Broadcaster, Subscriber
from .compaction import Compactor
from .cursor import page_cursor, parse_page_cursor
from .errors import ApiError, run_not_found
from .events import EVENT, TYPE, Append
from .executor import Executor
from .idempotency import fingerprint
from .reader import Reader
from .record import run_markdown
from .settings import Settings
from .store import Store, StoreConnection, StoreUnavailable, reduce_stored
from .store import end_stored as store_end
from .timeutil import now_iso
from .writer import Writer

SNAPSHOT_CACHE_BYTES = 64 * 1024 * 1024
# How long the requests being served when the server stops may take to finish
# before the store closes under them.
STOP_GRACE_SECONDS = 5.0
LIST_PAGE_BYTES = 16 * 1024 * 1024
RUN_FIELDS = (
    "run_id", "agent", "status", "session", "metadata", "input", "retry_of",
    "created_at", "started_at", "finished_at", "last_seq", "first_seq", "attempt",
)  # fmt: skip


@dataclass
class SubmitRequest:
    agent: str
    input: Any
    session: str | None = None
    metadata: dict | None = None
    retry_of: str | None = None
    # Not part of the fingerprint: what to do when the session is busy, not what to run.
    session_policy: str | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.agent, self.input, self.session, self.metadata, self.retry_of)


def new_run_id() -> str:
    return "run_" + secrets.token_urlsafe(16)


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
        served_owners: frozenset[str] | None = None,
    ):
        super().__init__(parent=parent)  # for its log: the server's
        # Whose runs this server takes over and starts from a queue (None: everyone's).
        self.served_owners = served_owners
        self.settings = settings
        self.store = store
        self.agents = agents
        self.agent_failures = agent_failures or {}
        self._on_activity = on_activity
        self.executor_id = "exec_" + secrets.token_urlsafe(12)
        self.reader = Reader(store)
        self.broadcaster = Broadcaster(self.reader, store)
        self.writer: Writer | None = None
        self.executor: Executor | None = None
        self.compactor: Compactor | None = None
        self._starting: asyncio.Future | None = None
        self._background: list[asyncio.Task] = []
        self._snapshots: OrderedDict[str, tuple[int, reducer.Snapshot, int]] = OrderedDict()
        self._snapshot_bytes = 0
        self._snapshots_lock = threading.Lock()  # the cache is used from reader threads
        # Expired leases this server has seen, with when it first saw each
        # (writer thread only): see sweep().
        self._expired_seen: dict[str, tuple[float | None, float]] = {}
        self.open_streams: Counter[str] = Counter()
        self.requests = Requests()
        self._dispatching = False
        self._stopping = False
        self._froze_gc = False  # gc.freeze() at start (undone at stop)
        self._switch_interval_before: float | None = None  # the GIL's, set at start
        self._stop_requested = asyncio.Event()
        self._dispatch_again = False
        self._dispatches: set[asyncio.Task] = set()
        # Per owner: the tokens of their runs of the last day that this server
        # does not execute (read from the store; live runs count from memory).
        self._day_tokens: dict[str, dict[str, int]] = {}
        # The store's runs by status, as last counted off the loop (for the
        # metrics): every status is a series from the start.
        self.run_counts: dict[str, int] = dict.fromkeys(lifecycle.ALL_STATUSES, 0)
        self._counted_at = -math.inf
        self._counting = False
        self._count_loop: asyncio.AbstractEventLoop | None = None
        metrics.RUNS.track(self, lambda engine: engine.runs_for_metrics())
        metrics.EXECUTING_RUNS.track(self, lambda engine: len(engine.live))

    @property
    def stopping(self) -> bool:
        """The server began to stop: requests are refused, streams end."""
        return self._stopping

    @property
    def live(self) -> dict[str, Any]:
        """The runs this server is executing now."""
        return self.executor.live if self.executor is not None else {}

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
        settings = self.settings
        self.broadcaster.start(loop)
        if self.writer is None:
            self.writer = Writer(self.store, loop, self._on_commit, self.log)
            self.executor = Executor(
                writer=self.writer,
                broadcaster=self.broadcaster,
                max_event_bytes=settings.max_event_bytes,
                max_run_seconds=settings.max_run_seconds,
                log=self.log,
                on_finished=self._run_finished,
                check_usage=self._check_usage,
                history=self._history,
                max_resume_attempts=settings.max_resume_attempts,
            )
            self.compactor = Compactor(
                writer=self.writer,
                reader=self.reader,
                broadcaster=self.broadcaster,
                settings=settings,
                on_deleted=self.forget_snapshot,
            )
        await self.sweep()
        await self.dispatch_queued()
        if self._stopping:
            return
        self._background = [
            loop.create_task(self._maintain()),
            loop.create_task(self._compact_periodically()),
        ]
        self._count_loop = loop
        self._count_runs_soon()  # the first scrape has a count
        if self.settings.freeze_gc_at_start and not self._froze_gc:
            # A fast run keeps objects alive long enough to fill the collector's
            # oldest generation, whose collections then walk the whole server:
            # what was alive at start (nearly all of it) is left out of them.
            gc.freeze()
            self._froze_gc = True
        interval = self.settings.gil_switch_interval
        if interval and self._switch_interval_before is None:
            # The writer thread lets go of the GIL around every SQLite
            # statement; with Python's 5 ms it then waited up to that long for
            # a busy loop to give it back, several times per batch.
            self._switch_interval_before = sys.getswitchinterval()
            sys.setswitchinterval(interval)

    async def stop(self) -> None:
        """End live runs ``interrupted`` (``server_shutdown``), commit, close the store.

        Runs queued in a session stay queued: the next server to start takes them, in order.
        """
        self._stopping = True
        self._stop_requested.set()
        self.broadcaster.stop_waits()  # streams and long-polls end, their clients resume later
        # The upkeep and the dispatches finish what they are doing (a claim in
        # the writer's queue commits either way: its result must not be lost);
        # the retention pass is only cancelled.
        for task in self._background[1:]:
            task.cancel()
        finishing = [*self._background[:1], *self._dispatches]
        if self._starting is not None and not self._starting.done():
            finishing.append(self._starting)  # its first dispatch may be claiming runs
        if finishing:
            await asyncio.wait(finishing, timeout=30)
        await self.requests.finished(STOP_GRACE_SECONDS)
        loop = asyncio.get_running_loop()
        if self.writer is not None:
            await self.executor.shutdown()
            await loop.run_in_executor(None, self.writer.close)
        await loop.run_in_executor(None, self.reader.close)
        self.broadcaster.close_watch()
        if self._froze_gc:
            gc.unfreeze()  # what became garbage since can be collected again
            self._froze_gc = False
        if self._switch_interval_before is not None:
            sys.setswitchinterval(self._switch_interval_before)
            self._switch_interval_before = None
        metrics.RUNS.untrack(self)
        metrics.EXECUTING_RUNS.untrack(self)

    def _on_commit(self, appended: dict[str, list[Append]], refused: dict[str, str]) -> None:
        limit = self.settings.max_retained_events
        for run_id, items in appended.items():
            count_runs_in_commit(items)
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
            self.executor.lost(run_id, taken=why == "taken")

    def _run_finished(self, execution) -> None:
        self.forget_snapshot(execution.run_id)
        if execution.owner in self._day_tokens:
            # No longer counted from memory: its last total joins the owner's stored day.
            self._day_tokens[execution.owner][execution.run_id] = execution.tokens
        self.activity_changed()
        if execution.row.get("session") is not None:
            # Only a run of a session can be what queued runs wait for.
            self._dispatch_soon()

    def _dispatch_soon(self) -> None:
        """Start, in a moment, what waited in a session's queue for a run that just ended."""

        async def dispatch() -> None:
            try:
                await self.dispatch_queued()
            except Exception:
                self.log.exception("agentruns: starting queued runs failed")

        task = asyncio.ensure_future(dispatch())
        self._dispatches.add(task)
        task.add_done_callback(self._dispatches.discard)

    async def _maintain(self) -> None:
        # Often enough that a cancel sent to another server sharing the
        # database takes effect within a second.
        interval = max(0.05, min(1.0, self.settings.lease_seconds / 3))
        unavailable = False
        while not self._stopping:
            try:
                await asyncio.wait_for(self._stop_requested.wait(), interval)
                return  # the server stops
            except asyncio.TimeoutError:
                pass
            try:
                await self.renew_leases()
                await self.sweep()
                await self.dispatch_queued()
                await self._refresh_day_tokens()
            except StoreUnavailable as exc:
                # Said once per outage; the writer says when it commits again.
                if not unavailable:
                    self.log.warning("agentruns: lease upkeep waits for the store: %s", exc)
                unavailable = True
            except Exception:
                self.log.exception("agentruns: lease upkeep failed")
            else:
                unavailable = False

    async def _compact_live(self, channel) -> None:
        limit = self.settings.max_retained_events
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

    def runs_for_metrics(self) -> dict[str, int]:
        """The store's runs by status as last counted; a scrape that finds the count old asks
        for a new one.

        ``/metrics`` is answered on the event loop, which must never wait on
        the store: it reports the last count, and the count runs on a reader
        thread for the next scrape. Nobody scraping, nothing is counted.
        """
        if time.monotonic() - self._counted_at >= metrics.RUN_COUNT_SECONDS:
            self._count_runs_soon()
        return self.run_counts

    def _count_runs_soon(self) -> None:
        loop = self._count_loop
        if self._counting or loop is None or loop.is_closed() or self._stopping:
            return
        self._counting = True
        # Thread-safe: a registry may be scraped from a thread of its own.
        loop.call_soon_threadsafe(lambda: loop.create_task(self._count_runs()))

    async def _count_runs(self) -> None:
        try:
            counts = await self.reader.run(lambda conn: conn.count_runs_by_status())
        except Exception as exc:  # the store is away: the last count stands
            self.log.debug("agentruns: counting runs for the metrics failed: %s", exc)
        else:
            self.run_counts = {status: counts.get(status, 0) for status in lifecycle.ALL_STATUSES}
            self._counted_at = time.monotonic()
        finally:
            self._counting = False

    async def _compact_periodically(self) -> None:
        settings = self.settings
        shortest = min(settings.event_retention_seconds, settings.run_retention_seconds)
        interval = min(60.0, max(0.2, shortest / 4))
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

    async def renew_leases(self) -> None:
        """Renew this server's leases, and take the cancels other servers recorded for its runs."""
        live = list(self.live)
        if not live:
            return
        expires = time.time() + self.settings.lease_seconds

        def renew(conn: StoreConnection):
            conn.renew_leases(self.executor_id, live, expires)
            return conn.take_cancel_requests(self.executor_id), conn.take_input_answers(
                self.executor_id
            )

        cancels, answers = await self.writer.run(renew)
        # Taken from the store in that transaction: each is applied, whatever becomes of the others.
        for run_id, request_id, answer in answers:
            # Answers sent to another server sharing the store, for a question of a run here.
            execution = self.live.get(run_id)
            if execution is None or execution.closed:
                continue
            request = reducer.find_input(execution.snapshot.structure(), request_id)
            if request is None or answer["choice"] not in (request.get("choices") or []):
                continue
            try:
                execution.resolve(
                    request_id, answer["choice"], note=answer["note"], by=answer["by"]
                )
            except Exception:
                self.log.exception("agentruns: an answer for run %s could not be applied", run_id)
        for run_id, request in cancels:
            execution = self.live.get(run_id)
            if execution is None:
                continue
            try:
                await self.executor.cancel(
                    execution, request.get("reason"), request.get("requested_at")
                )
            except Exception:
                self.log.exception("agentruns: a cancel of run %s could not be applied", run_id)
        self.activity_changed()

    async def sweep(self) -> int:
        """Take over, or end ``interrupted``, every unfinished run whose executor is gone.

        A run of a resumable agent is taken over (``run.resumed``, this server
        its executor) up to ``max_resume_attempts`` times; any other ends
        ``interrupted``. Wall clocks jump (a laptop sleeps, a VM is paused): a
        lease that looks expired may belong to a server about to renew it. So
        a run is touched only once this server has seen the same expired
        lease, unrenewed, for ``lease_seconds`` of its own monotonic time;
        a run its server handed over at a clean shutdown is taken at once.
        """
        live = set(self.live)
        ttl = self.settings.idempotency_ttl_seconds
        lease = self.settings.lease_seconds
        seen = self._expired_seen
        tally = Tally()

        def sweep_expired(conn: StoreConnection) -> tuple[int, list]:
            tally.clear()
            now, clock = time.time(), time.monotonic()
            still: dict[str, tuple[float | None, float]] = {}
            ended, resumed = 0, []
            for row in conn.expired_active_runs(now):
                run_id, expires = row["run_id"], row["lease_expires"]
                if run_id in live:
                    continue
                handed_over = row["executor_id"] is None
                first = seen.get(run_id)
                if not handed_over and (first is None or first[0] != expires):
                    still[run_id] = (expires, clock)
                    continue
                if not handed_over and clock - first[1] < lease:
                    still[run_id] = first
                    continue
                fate = self._fate(row)
                if fate is None:
                    still[run_id] = first or (expires, clock)
                    continue  # it waits for a server that serves its owner
                reason = "server_shutdown" if handed_over else "lease_expired"
                if not handed_over:
                    tally.leases_expired += 1
                if fate == "resume":
                    resumed.append(self._take_over(conn, row, reason, now + lease, tally))
                else:
                    end_stored(conn, row, lifecycle.interrupted(reason), tally)
                    ended += 1
            seen.clear()
            seen.update(still)
            conn.purge_keys(now - ttl)
            return ended, resumed

        ended, resumed = await self.writer.run(sweep_expired)
        tally.count()
        if ended:
            self.log.info("agentruns: %d run(s) whose server stopped ended interrupted", ended)
        if resumed:
            self.log.info("agentruns: took over %d run(s) whose server stopped", len(resumed))
            await self._load_day_tokens({row["owner"] for row, _ in resumed})
            for row, snapshot in resumed:
                self.executor.resume(row, self.agents[row["agent"]], snapshot)
            self.activity_changed()
        return ended + len(resumed)

    def serves(self, owner: str) -> bool:
        """Whether this server takes over and starts ``owner``'s runs (``served_owners``)."""
        return self.served_owners is None or owner in self.served_owners

    def _fate(self, row: dict[str, Any]) -> str | None:
        """What this server does with an unfinished run whose executor is gone.

        "resume": it takes the run over; "end": it ends the run
        ``interrupted``; None: it leaves the run to a server that serves its
        owner and has its agent. A server runs another owner's agents only
        for that owner's own server: never with its own keys, tools and
        agents of the same name. A run that nobody would resume (its agent is
        not resumable, or it was being cancelled) may be ended by any server.
        """
        if self._stopping:
            return None  # the next server decides
        cancelling = row["status"] == lifecycle.RunStatus.CANCELLING.value
        spec = self.agents.get(row["agent"])
        if self.serves(row["owner"]) and spec is not None:
            takeovers = (row.get("attempt") or 1) - 1
            if spec.resumable and not cancelling and takeovers < self.settings.max_resume_attempts:
                return "resume"
            return "end"
        if cancelling or row.get("resumable") == 0:
            return "end"
        return None

    def _take_over(
        self,
        conn: StoreConnection,
        row: dict[str, Any],
        reason: str,
        lease_expires: float,
        tally: Tally,
    ) -> tuple[dict[str, Any], reducer.Snapshot]:
        """Commit ``run.resumed`` with this server as the run's executor (``_fate`` said "resume").

        In the sweep's transaction, on the row it locked: one executor at a time.
        """
        takeovers = (row.get("attempt") or 1) - 1
        run_id, seq = row["run_id"], row["last_seq"]
        snapshot = reduce_stored(
            conn, run_id, reducer.Snapshot(row["snapshot"]), row["snapshot_seq"], seq
        )
        waiting = reducer.open_inputs(snapshot.structure())
        status = (lifecycle.RunStatus.WAITING if waiting else lifecycle.RunStatus.RUNNING).value
        transition = lifecycle.resumed(takeovers + 2, reason, seq, status)
        conn.append_events(
            [(run_id, seq + 1, transition.type, now_iso(),
              jsonio.dumps(transition.data, compact=True))]
        )  # fmt: skip
        fields = {
            **transition.fields,
            "last_seq": seq + 1,
            "executor_id": self.executor_id,
            "lease_expires": lease_expires,
        }
        conn.update_run(run_id, fields)
        tally.events += 1
        tally.resumed.append(reason)
        snapshot.apply({"type": transition.type, "data": transition.data})
        return {**row, **fields, "snapshot": None}, snapshot

    async def _history(self, run_id: str) -> list[dict[str, Any]]:
        """A run's kept events, decoded (for a resumed agent's ``run.history()``)."""

        def read(conn: StoreConnection) -> list[dict[str, Any]]:
            events, after = [], 0
            while True:
                rows = conn.read_events(run_id, after, 5000)
                if not rows:
                    return events
                events.extend(
                    {"seq": seq, "type": type, "ts": ts, "data": json.loads(data)}
                    for seq, type, ts, data in rows
                )
                after = rows[-1][0]

        return await self.reader.run(read)

    def activity_changed(self) -> None:
        self._on_activity()

    # Runs ----------------------------------------------------------------

    def unknown_agent(self, name: str) -> ApiError:
        failure = self.agent_failures.get(name)
        if failure is not None:
            return ApiError(
                404,
                "unknown_agent",
                f"The agent {name!r} failed to load ({failure}); the server log says more, "
                "GET agents lists the others.",
            )
        return ApiError(404, "unknown_agent", f"No agent named {name!r}; GET agents lists them.")

    async def submit(
        self, owner: str, request: SubmitRequest, key: str | None, key_with_run: bool = False
    ) -> tuple[dict[str, Any], bool]:
        """Create a run, or find the one this key made; returns ``(run, replayed)``.

        ``key_with_run``: the key is remembered as long as the run exists, not
        ``idempotency_ttl_seconds`` (what a notebook cell's key wants).
        """
        await self.start()
        spec = self.agents.get(request.agent)
        if spec is None:
            problem: ApiError | None = self.unknown_agent(request.agent)
        else:
            reason = spec.input_problem(request.input)
            problem = ApiError(400, "invalid_input", reason) if reason else None
        fp = request.fingerprint
        settings = self.settings
        ttl, max_active, lease = (
            settings.idempotency_ttl_seconds,
            settings.max_active_runs_per_user,
            settings.lease_seconds,
        )
        now = time.time()
        policy = request.session_policy or settings.default_session_policy
        interrupted: list[str] = []  # the session's runs this run interrupts
        day_rows: list[tuple[str, str, int, int]] = []  # the owner's day, for the budget
        tally = Tally()  # queued runs of the session this run ends (interrupt)

        def create(conn: StoreConnection) -> tuple[dict[str, Any], dict[str, Any] | None]:
            """The run's row, and the answer for a new run (None: the key's run, replayed)."""
            tally.clear()
            # The owner's submits one at a time, across servers sharing the store:
            # the key, the session and the active runs are read and written as one.
            conn.serialize(f"submit:{owner}")
            if key is not None:
                existing = conn.find_key(owner, key, now - ttl)
                if existing is not None:
                    if existing["fingerprint"] != fp:
                        raise ApiError(
                            422,
                            "idempotency_key_reused",
                            "This Idempotency-Key was used for a different request; "
                            "use a new key for a new run.",
                        )
                    row = conn.get_run(existing["run_id"])
                    if row is not None:
                        return row, None
            if problem is not None:
                raise problem
            if request.retry_of is not None:
                original = conn.get_run_head(request.retry_of)
                if original is None or original["owner"] != owner:
                    raise run_not_found(request.retry_of)
            active = (
                conn.active_in_session(owner, request.session)
                if request.session is not None and policy != "parallel"
                else []
            )
            if policy == "reject" and active:
                raise ApiError(
                    409,
                    "session_busy",
                    f"The session {request.session!r} has an active run, {active[0]['run_id']}; "
                    "wait for it or cancel it, or submit with session_policy 'enqueue' or 'interrupt'.",
                    active_run_id=active[0]["run_id"],
                )
            day_rows[:] = self._check_day_budget(conn, owner, now)
            if conn.count_active(owner) >= max_active:
                raise ApiError(
                    429,
                    "too_many_active_runs",
                    f"You have {max_active} active runs, the most allowed; wait for one to finish or cancel one.",
                    headers={"Retry-After": "5"},
                )
            stored_limit = settings.max_stored_runs_per_user
            if stored_limit and conn.count_runs(owner) >= stored_limit:
                raise ApiError(
                    429,
                    "storage_quota_exceeded",
                    f"You have {stored_limit} stored runs, the most allowed; delete runs you no "
                    "longer need (finished runs are also deleted after run_retention_seconds).",
                )
            run_id = new_run_id()
            # Behind the session's active runs: queued with no executor until its turn.
            behind = bool(active)
            row = {
                "run_id": run_id,
                "owner": owner,
                "agent": request.agent,
                "status": lifecycle.RunStatus.QUEUED.value,
                "session": request.session,
                "metadata": request.metadata if request.metadata is not None else {},
                "input": request.input,
                "retry_of": request.retry_of,
                "created_at": now_iso(),
                "last_seq": 0,
                "first_seq": 1,
                "resumable": int(spec.resumable),
                "executor_id": None if behind else self.executor_id,
                "lease_expires": None if behind else time.time() + lease,
            }
            conn.insert_run(row)
            if key is not None:
                conn.insert_key(owner, key, fp, run_id, now, key_with_run)
            if policy == "interrupt":
                # A run still in the queue ends cancelled here; one a server
                # executes gets a cancel request (this server's own are
                # cancelled at once after the commit, others' within a lease upkeep).
                for other in active:
                    request_cancel(conn, other["run_id"], {"interrupted_by": run_id}, tally)
                interrupted[:] = [other["run_id"] for other in active]
            created = conn.get_run(run_id)
            # Answered from this transaction: once the run is committed, no
            # later read may fail and tell the caller (503) that nothing was made.
            return created, self.run_object(conn, created)

        row, run = await self.writer.run(create)
        tally.count()
        replayed = run is None
        if day_rows:
            self._day_tokens[owner] = {r[0]: r[2] + r[3] for r in day_rows}
        if replayed:
            run = await self.reader.run(lambda conn: self.run_object(conn, row))
        else:
            if row["executor_id"] == self.executor_id:
                # Started after the last await: the caller gets the run before its task ran.
                self.executor.start(row, spec)
            for run_id in interrupted:
                # This server's own at once (the others' take their cancel request).
                execution = self.live.get(run_id)
                if execution is not None:
                    await self.executor.cancel(execution, {"interrupted_by": row["run_id"]})
            if row["executor_id"] is None:
                self._dispatch_soon()  # its turn may already have come (its session emptied)
            self.activity_changed()
        return run, replayed

    async def dispatch_queued(self) -> int:
        """Claim and start the runs whose turn came in their session's queue; how many.

        Any server sharing the store may: the claim is a conditional update,
        so exactly one of them starts each run. Called when a run of this
        server ends, and from the lease upkeep for runs other servers ended.
        """
        if self._stopping:
            return 0
        if self._dispatching:
            self._dispatch_again = True
            return 0
        self._dispatching = True
        started = 0
        owners = None if self.served_owners is None else sorted(self.served_owners)
        agents = sorted(self.agents)

        def startable(conn: StoreConnection) -> list[dict[str, Any]]:
            return conn.startable_queued_runs(owners, agents)

        try:
            while True:
                self._dispatch_again = False
                ready = await self.reader.run(startable)
                if ready:
                    started += await self._claim_and_start(ready)
                if not self._dispatch_again:
                    return started
        finally:
            self._dispatching = False

    async def _claim_and_start(self, ready: list[dict[str, Any]]) -> int:
        expires = time.time() + self.settings.lease_seconds

        def claim(conn: StoreConnection) -> list[dict[str, Any]]:
            claimed: list[dict[str, Any]] = []
            if self._stopping:
                return claimed
            for row in ready:
                # Runs of an agent this server lacks, or of an owner it does not
                # serve, were not read: they wait in their queue for a server that can.
                if conn.claim_run(row["run_id"], self.executor_id, expires):
                    claimed.append(conn.get_run(row["run_id"]))
            return claimed

        if self._stopping:
            return 0
        claimed = await self.writer.run(claim)
        if claimed and self._stopping:
            # Claimed as the server began to stop: back to their queue, for the next server.
            run_ids = [row["run_id"] for row in claimed]
            await self.writer.run(lambda conn: conn.release_claims(run_ids, self.executor_id))
            return 0
        await self._load_day_tokens({row["owner"] for row in claimed})
        for row in claimed:
            self.executor.start(row, self.agents[row["agent"]])
        if claimed:
            self.activity_changed()
        return len(claimed)

    # Token budgets -----------------------------------------------------
    #
    # Per owner, the tokens of each of their runs of the last day as the
    # store has them (``_day_tokens``, written on the loop only). A run this
    # server executes counts with its live total instead of its stored one,
    # decided when the sum is made: nothing is counted twice.

    def _check_day_budget(
        self, conn: StoreConnection, owner: str, now: float
    ) -> list[tuple[str, str, int, int]]:
        """429 ``token_budget_exhausted`` once the owner's runs of the last day used their budget.

        Returns the window's rows (writer thread: the caller files them on the loop).
        """
        limit = self.settings.tokens_per_user_per_day
        if not limit:
            return []
        rows = conn.usage_since(owner, budgets.day_start(now))
        used = sum(row[2] + row[3] for row in rows)
        if used >= limit:
            wait = budgets.retry_after(rows, limit, now)
            raise ApiError(
                429,
                "token_budget_exhausted",
                f"Your runs of the last 24 hours used {used} tokens, the most allowed is {limit} "
                f"(tokens_per_user_per_day); the window frees up in {wait} s.",
                headers={"Retry-After": str(wait)},
            )
        return rows

    def _day_used(self, owner: str) -> int:
        live = {e.run_id: e.tokens for e in self.live.values() if e.owner == owner}
        stored = self._day_tokens.get(owner, {})
        return sum(t for run_id, t in stored.items() if run_id not in live) + sum(live.values())

    def _check_usage(self, execution) -> str | None:
        """Called at each usage event (on the loop): why the run must fail now, or None."""
        settings = self.settings
        per_run = settings.max_tokens_per_run
        if per_run and execution.tokens > per_run:
            return f"the run used {execution.tokens} tokens, over max_tokens_per_run ({per_run})"
        per_day = settings.tokens_per_user_per_day
        if per_day:
            used = self._day_used(execution.owner)
            if used > per_day:
                return (
                    f"your runs of the last 24 hours used {used} tokens, "
                    f"over tokens_per_user_per_day ({per_day})"
                )
        return None

    async def _load_day_tokens(self, owners: set[str]) -> None:
        """Read the owners' runs of the last day from the store (other servers' runs included)."""
        if not self.settings.tokens_per_user_per_day or not owners:
            return
        since = budgets.day_start(time.time())

        def read(conn: StoreConnection) -> dict[str, dict[str, int]]:
            return {
                owner: {row[0]: row[2] + row[3] for row in conn.usage_since(owner, since)}
                for owner in owners
            }

        self._day_tokens.update(await self.reader.run(read))

    async def _refresh_day_tokens(self) -> None:
        """Reread the day of every owner with a live run: other servers' runs, runs leaving the window."""
        owners = {execution.owner for execution in self.live.values()}
        for owner in set(self._day_tokens) - owners:
            del self._day_tokens[owner]
        await self._load_day_tokens(owners)

    async def usage(self, owner: str) -> dict[str, int]:
        """``GET usage``: the owner's token totals of the last 24 hours."""
        since = budgets.day_start(time.time())
        rows = await self.reader.run(lambda conn: conn.usage_since(owner, since))
        return budgets.window_totals(rows)

    async def owned_head(self, owner: str, run_id: str) -> dict[str, Any]:
        """The caller's run's owner, status and seqs, or 404/410 (a small read)."""
        return await self.reader.small(lambda conn: self._owned(conn, owner, run_id, full=False))

    def _owned(
        self, conn: StoreConnection, owner: str, run_id: str, *, full: bool, snapshot: bool = True
    ) -> dict[str, Any]:
        row = conn.get_run(run_id, snapshot=snapshot) if full else conn.get_run_head(run_id)
        if row is None:
            tombstone = conn.get_tombstone(run_id)
            if tombstone is not None and tombstone["owner"] == owner:
                raise ApiError(
                    410,
                    "run_expired",
                    f"The run {run_id!r} finished long ago and was deleted "
                    "(run_retention_seconds); its output is no longer kept.",
                )
        if row is None or row["owner"] != owner:
            raise run_not_found(run_id)
        return row

    async def get_run(self, owner: str, run_id: str) -> dict[str, Any]:
        """The caller's run object, read (and its snapshot brought up to date) off the event loop."""
        return await self.reader.run(
            lambda conn: self.run_object(conn, self._owned(conn, owner, run_id, full=True))
        )

    async def run_answer(
        self, owner: str, run_id: str, markdown: bool = False
    ) -> AsyncIterator[bytes]:
        """What ``GET runs/{id}`` answers, JSON (or the Markdown record), in pieces to send in turn.

        A run's snapshot can hold 100 MB of text, and decoding or encoding
        that holds the interpreter for a second. When the persisted snapshot
        is current, its stored JSON goes out as it is, spliced into the run
        object, read a part (about a megabyte) at a time between the sends:
        each read is short, so on a local store it runs on the event loop,
        which a thread reading the whole text would hold back instead (the
        two would take turns at the GIL every switch interval). Raises
        ``ApiError`` before the first piece; ``SnapshotReplaced`` once a piece
        was sent, if the snapshot went away meanwhile (the answer is then cut).
        """

        def head(conn: StoreConnection) -> tuple[bytes, bytes, tuple[int, int]] | None:
            row = self._owned(conn, owner, run_id, full=True, snapshot=False)
            if markdown or not row["snapshot_seq"] == row["last_seq"] > 0:
                return None
            layout = conn.snapshot_layout(run_id)
            if layout is None or layout[0] != row["snapshot_seq"]:
                return None
            mark = f"\x00{secrets.token_hex(16)}\x00"  # nothing else in the run can hold it
            before, after = jsonio.dumps(self.run_object(conn, {**row, "snapshot": mark})).split(
                jsonio.dumps(mark)
            )
            return before.encode(), after.encode(), layout

        spliced = await self.reader.small(head)
        if spliced is not None:
            return self._spliced(run_id, *spliced)

        def whole(conn: StoreConnection) -> bytes:
            run = self.run_object(conn, self._owned(conn, owner, run_id, full=True))
            return (run_markdown(run) if markdown else jsonio.dumps(run)).encode("utf-8")

        return _pieces(await self.reader.run(whole))

    async def _spliced(
        self, run_id: str, before: bytes, after: bytes, layout: tuple[int, int]
    ) -> AsyncIterator[bytes]:
        seq, parts = layout
        yield before
        for part in range(parts):
            text = await self.reader.small(
                lambda conn, part=part: conn.snapshot_part(run_id, part, seq)
            )
            if text is None:
                raise SnapshotReplaced(run_id)
            yield text.encode()
        yield after

    async def list_runs(
        self,
        owner: str,
        *,
        status: str | None,
        session: str | None,
        limit: int,
        before: str | None,
        retry_of: str | None = None,
    ) -> bytes:
        """One page of the owner's runs, newest first, with the ``before`` of the next page: JSON.

        Made off the event loop, and bounded: a page stops early before the
        run that would take its JSON over ``LIST_PAGE_BYTES`` (its ``next``
        goes on from there); only a page of one run may be larger.
        """
        after = parse_page_cursor(before) if before else None

        def page(conn: StoreConnection) -> bytes:
            rows = conn.list_runs(
                owner,
                status=status,
                session=session,
                limit=limit + 1,
                before=after,
                retry_of=retry_of,
            )
            encoded: list[str] = []
            size = 0
            last: dict[str, Any] | None = None
            for row in rows[:limit]:
                full = conn.get_run(row["run_id"])
                if full is None:
                    continue  # deleted since the list was read
                text = jsonio.dumps(self.run_object(conn, full))
                # A page ends before the run that would take it over its
                # bound (its next page begins there); a page holds at least one run.
                if encoded and size + len(text) > LIST_PAGE_BYTES:
                    break
                encoded.append(text)
                size += len(text)
                last = full
            more = last is not None and len(rows) > len(encoded)
            next_page = page_cursor(last["created_at"], last["run_id"]) if more else None
            return (
                '{"runs":[' + ",".join(encoded) + '],"next":' + jsonio.dumps(next_page) + "}"
            ).encode("utf-8")

        return await self.reader.run(page)

    async def cancel(
        self, owner: str, run_id: str, reason: str | None
    ) -> tuple[dict[str, Any], bool]:
        """Cancel a run; returns ``(run, started)``, started False when it was already ending."""
        await self.start()
        await self.owned_head(owner, run_id)
        execution = self.live.get(run_id)
        if execution is not None:
            started = await self.executor.cancel(execution, reason)
        else:
            tally = Tally()  # a run still queued in its session ends cancelled here

            def cancel(conn: StoreConnection) -> bool:
                tally.clear()
                return request_cancel(conn, run_id, reason, tally)

            started = await self.writer.run(cancel)
            tally.count()
            if started:
                self._dispatch_soon()  # it may have been queued in its session
        return await self.get_run(owner, run_id), started

    async def answer(
        self, owner: str, by: str, run_id: str, request_id: str, choice: str, note: str | None
    ) -> dict[str, Any]:
        """Answer a run's question (``POST runs/{id}/inputs/{request_id}``); returns the run.

        The same answer again changes nothing; another answer to a resolved
        question is 409 ``input_resolved``. The server executing the run
        resolves it at once; another server sharing the store records the
        answer for it and waits (a few seconds at most) until it is resolved.
        """
        await self.start()
        await self.owned_head(owner, run_id)
        execution = self.live.get(run_id)
        if execution is not None:
            if not execution.closed:
                # Checked and resolved with no await in between: two racing answers, one wins.
                request = reducer.find_input(execution.snapshot.structure(), request_id)
                if not check_answer(request, request_id, choice):
                    execution.resolve(request_id, choice, note=note, by=by)
            try:
                await execution.durable()
            except RunClosed:
                pass  # another server ended it: the store says how
            run = await self.get_run(owner, run_id)
            check_answer(reducer.find_input(run["snapshot"], request_id), request_id, choice)
            return run
        run = await self.get_run(owner, run_id)
        if check_answer(reducer.find_input(run["snapshot"], request_id), request_id, choice):
            return run
        if lifecycle.is_terminal(run["status"]):
            raise ApiError(409, "input_resolved", "The run has ended: its questions are closed.")
        # Another server executes the run: record the answer for it, then wait
        # (its lease upkeep takes answers every second) to say how it went.
        answer = {"choice": choice, "note": note, "by": by}
        kept = await self.writer.run(
            lambda conn: conn.record_input_answer(run_id, request_id, answer, time.time())
        )
        if kept["choice"] != choice:
            raise input_resolved(kept["choice"])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(3.0, 3 * min(1.0, self.settings.lease_seconds / 3))
        seen = run["last_seq"]
        while loop.time() < deadline:
            await asyncio.sleep(0.05)
            # The run's head is a small read; the whole run only once it has new events.
            if (await self.owned_head(owner, run_id))["last_seq"] == seen:
                continue
            run = await self.get_run(owner, run_id)
            seen = run["last_seq"]
            request = reducer.find_input(run["snapshot"], request_id)
            if (request or {}).get("status") == "resolved":
                # Resolved otherwise (another answer first, a timeout, the run's end): 409.
                check_answer(request, request_id, choice)
                return run
            if lifecycle.is_terminal(run["status"]):
                raise ApiError(409, "input_resolved", "The run ended before it took the answer.")
        # Recorded, not yet taken (the executing server is slow, or died and
        # its run will be interrupted): the run as it is now.
        return run

    async def delete(self, owner: str, run_id: str) -> None:
        await self.start()
        await self.owned_head(owner, run_id)  # 404, or 410 for a run retention deleted

        def delete(conn: StoreConnection) -> None:
            conn.lock_run(run_id)
            row = conn.get_run_head(run_id)
            if row is None or row["owner"] != owner:
                raise run_not_found(run_id)
            if lifecycle.is_active(row["status"]):
                raise ApiError(409, "run_active", "The run is still active; cancel it first.")
            conn.delete_run(run_id)

        await self.writer.run(delete)
        metrics.RUNS_DELETED.labels("request").inc()
        self.forget_snapshot(run_id)

    def forget_snapshot(self, run_id: str) -> None:
        with self._snapshots_lock:
            cached = self._snapshots.pop(run_id, None)
            if cached is not None:
                self._snapshot_bytes -= cached[2]

    def run_object(self, conn: StoreConnection, row: dict[str, Any]) -> dict[str, Any]:
        """The public run object: ``snapshot`` is exactly the events up to ``last_seq`` (reader thread)."""
        run = {name: row.get(name) for name in RUN_FIELDS}
        if run["metadata"] is None:
            run["metadata"] = {}
        run["snapshot"] = self._snapshot_at(conn, row)
        run["output"] = row.get("output")
        run["error"] = row.get("error")
        run["cancel"] = row.get("cancel")
        # Waiting in its session's queue (enqueue, interrupt): behind which run.
        waits = (
            row["status"] == lifecycle.RunStatus.QUEUED.value
            and row.get("executor_id") is None
            and row.get("session")
        )
        run["queued_behind"] = conn.queued_behind(row["run_id"]) if waits else None
        if row.get("cancel_request") is not None:
            # Recorded for the server executing the run, which has not taken it
            # yet: answer with the run as it will be in a moment.
            run = lifecycle.as_pending_cancel(run, row["cancel_request"])
        return run

    def _snapshot_at(self, conn: StoreConnection, row: dict[str, Any]) -> dict[str, Any]:
        run_id, last_seq = row["run_id"], row["last_seq"]
        if row["snapshot_seq"] == last_seq and row["snapshot"] is not None:
            return row["snapshot"]
        with self._snapshots_lock:
            cached = self._snapshots.pop(run_id, None)
            if cached is not None:
                self._snapshot_bytes -= cached[2]
        if cached is not None and row["snapshot_seq"] <= cached[0] <= last_seq:
            seq, builder = cached[0], cached[1]
        else:
            seq, builder = row["snapshot_seq"], reducer.Snapshot(row["snapshot"])
        snapshot = reduce_stored(conn, run_id, builder, seq, last_seq).to_dict()
        # Cached for the next read of a live run, within a memory budget. A
        # builder is used by one reader at a time: it left the cache above.
        size = approximate_size(snapshot)
        if size <= SNAPSHOT_CACHE_BYTES // 4:
            # The answer gets a copy of its structure: once the builder is back
            # in the cache, the next reader applies later events to it while
            # this answer may still be being written out. (The texts are
            # strings, shared, never changed in place: the copy costs no text.)
            snapshot = detached(snapshot)
            with self._snapshots_lock:
                self._snapshots[run_id] = (last_seq, builder, size)
                self._snapshot_bytes += size
                while self._snapshot_bytes > SNAPSHOT_CACHE_BYTES:
                    self._snapshot_bytes -= self._snapshots.popitem(last=False)[1][2]
        return snapshot

    # Events --------------------------------------------------------------

    def subscriber(self, run_id: str, cursor: int) -> Subscriber:
        return self.broadcaster.subscriber(run_id, cursor)

    @contextmanager
    def stream_slot(self, owner: str, kind: str):
        """Hold one of the owner's ``max_streams_per_user`` open streams.

        ``kind`` (``metrics.STREAM_KINDS``): run, page, or poll (a long-poll that waits).
        """
        limit = self.settings.max_streams_per_user
        if self.open_streams[owner] >= limit:
            raise ApiError(
                429,
                "too_many_streams",
                f"You have {limit} open event streams, the most allowed; "
                "close one (the page stream carries many runs on one connection).",
                headers={"Retry-After": "5"},
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


def detached(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot whose lists and their items are its own (the reducer changes those in place)."""
    copy = dict(snapshot)
    for key in ("messages", "tools", "inputs"):
        if isinstance(copy.get(key), list):
            copy[key] = [dict(item) for item in copy[key]]
    return copy


def approximate_size(snapshot: dict) -> int:
    """Roughly the bytes a snapshot holds: its text, plus a little per tool call."""
    return sum(len(m["text"]) for m in snapshot["messages"]) + 512 * (len(snapshot["tools"]) + 1)


def input_resolved(choice: Any) -> ApiError:
    return ApiError(
        409,
        "input_resolved",
        f"This question was already answered ({choice!r}); a different answer cannot replace it.",
        choice=choice,
    )


def input_given_up(reason: str | None) -> ApiError:
    why = {
        "timeout": "nobody answered it in the time the agent gave",
        "cancelled": "the run was cancelled or ended before it was answered",
    }.get(reason or "", "the run stopped waiting for it")
    return ApiError(
        409,
        "input_resolved",
        f"This question was given up ({why}): it takes no answer any more.",
        choice=None,
        reason=reason,
    )


def check_answer(request: dict[str, Any] | None, request_id: str, choice: str) -> bool:
    """Whether an answer was already given (True: the same one); raise for a wrong one."""
    if request is None:
        raise ApiError(404, "input_not_found", f"The run has no question {request_id!r}.")
    choices = request.get("choices") or []
    if choice not in choices:
        raise ApiError(
            400,
            "invalid_choice",
            f"{choice!r} is not one of the choices offered: {', '.join(map(repr, choices))}.",
            path="choice",
        )
    if request["status"] == "resolved":
        if request.get("choice") is None:
            raise input_given_up(request.get("reason"))
        if request.get("choice") == choice:
            return True
        raise input_resolved(request.get("choice"))
    return False


def request_cancel(conn: StoreConnection, run_id: str, reason: Any, tally: Tally) -> bool:
    """Record a cancel for the server executing ``run_id``; False when there is nothing to start.

    A run queued in its session, which no server executes yet, ends ``cancelled`` here.
    """
    conn.lock_run(run_id)  # a server claiming the queued run waits, then finds it ended
    row = conn.get_run(run_id)
    if (
        row is None
        or row["status"] not in lifecycle.CANCELLABLE
        or row["cancel_request"] is not None
    ):
        return False
    if row["status"] == lifecycle.RunStatus.QUEUED.value and row["executor_id"] is None:
        end_stored(conn, row, lifecycle.cancelled_in_queue(reason, row["last_seq"]), tally)
        return True
    conn.record_cancel_request(run_id, {"reason": reason, "requested_at": now_iso()})
    return True


def end_stored(
    conn: StoreConnection, row: dict[str, Any], transition: lifecycle.Transition, tally: Tally
) -> None:
    """Commit a terminal transition for a run no executor holds, in the caller's transaction."""
    rows = store_end(conn, row, transition)
    tally.events += len(rows)
    tally.finished.append(transition.fields["status"])


class Tally:
    """What a store operation wrote outside the writer's event queue, for the metrics.

    Counted once the operation committed (``count``). The writer runs an
    operation again when its batch is retried: it starts with ``clear()``.
    """

    __slots__ = ("events", "finished", "resumed", "leases_expired")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.events = 0
        self.finished: list[str] = []  # the outcomes of the runs it ended
        self.resumed: list[str] = []  # the reasons of the runs it took over
        self.leases_expired = 0

    def count(self) -> None:
        if self.events:
            metrics.EVENTS_APPENDED.inc(self.events)
        for outcome in self.finished:
            metrics.RUNS_FINISHED.labels(outcome).inc()
        for reason in self.resumed:
            metrics.RUNS_RESUMED.labels(reason).inc()
        if self.leases_expired:
            metrics.LEASES_EXPIRED.inc(self.leases_expired)


def count_runs_in_commit(items: list[Append]) -> None:
    """A run's committed events in the metrics: did it start, did it end (two looks a batch)."""
    if items[0][EVENT][TYPE] == "run.started":
        metrics.RUNS_STARTED.inc()
    outcome = lifecycle.TERMINAL_EVENTS.get(items[-1][EVENT][TYPE])
    if outcome is not None:
        metrics.RUNS_FINISHED.labels(outcome).inc()


class SnapshotReplaced(Exception):
    """A run's snapshot was replaced or deleted while its answer was being sent."""


async def _pieces(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece
