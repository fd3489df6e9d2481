"""The engine: store, writer, broadcaster and executor put together.

HTTP handlers speak to this and nothing else. Every method takes the caller's
``owner`` and answers another owner's run exactly as a missing one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from . import reducer, store
from .agents import AgentSpec
from .broadcaster import Broadcaster, Subscriber
from .compaction import Compactor
from .cursor import page_cursor, parse_page_cursor
from .errors import ApiError, run_not_found
from .executor import Executor
from .idempotency import fingerprint
from .timeutil import now_iso
from .writer import Append, Writer

log = logging.getLogger(__name__)

SNAPSHOT_CACHE_BYTES = 64 * 1024 * 1024
RUN_FIELDS = (
    "run_id", "agent", "status", "session", "metadata", "input", "retry_of",
    "created_at", "started_at", "finished_at", "last_seq", "first_seq",
)  # fmt: skip


@dataclass
class Config:
    """The engine's settings; ``AgentRuns`` fills them from ``c.AgentRuns.*``."""

    db_path: str
    idempotency_ttl_seconds: float = 86400
    event_retention_seconds: float = 86400
    max_retained_events: int = 100000
    run_retention_seconds: float = 2592000
    max_active_runs_per_user: int = 8
    max_streams_per_user: int = 64
    heartbeat_interval: float = 15
    write_timeout_seconds: float = 30
    lease_seconds: float = 30
    max_body_bytes: int = 1048576
    max_event_bytes: int = 262144
    max_run_seconds: float = 86400
    sqlite_synchronous: str = "FULL"


@dataclass
class SubmitRequest:
    agent: str
    input: Any
    session: str | None = None
    metadata: dict | None = None
    retry_of: str | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.agent, self.input, self.session, self.metadata, self.retry_of)


def new_run_id() -> str:
    return "run_" + secrets.token_urlsafe(16)


class Engine:
    def __init__(
        self,
        config: Config,
        agents: dict[str, AgentSpec],
        on_activity: Callable[[], None] = lambda: None,
    ):
        self.config = config
        self.agents = agents
        self._on_activity = on_activity
        # The read connection, used on the event loop only; writes go through the writer.
        self.db = store.connect(config.db_path, config.sqlite_synchronous)
        self.executor_id = "exec_" + secrets.token_urlsafe(12)
        self.broadcaster = Broadcaster(self.db)
        self.writer: Writer | None = None
        self.executor = Executor(self)
        self.compactor = Compactor(self)
        self._compacting: asyncio.Task | None = None
        self._starting: asyncio.Task | None = None
        self._maintenance: asyncio.Task | None = None
        self._snapshots: OrderedDict[str, tuple[int, dict, int]] = OrderedDict()
        self._snapshot_bytes = 0
        # Expired leases this server has seen, with when it first saw each
        # (writer thread only): see sweep().
        self._expired_seen: dict[str, tuple[float | None, float]] = {}
        self.open_streams: Counter[str] = Counter()

    # Life cycle ------------------------------------------------------------

    async def start(self) -> None:
        """Start the writer and the lease keeper; safe to call from every request."""
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
        loop = asyncio.get_running_loop()
        if self.writer is None:
            writer_db = store.connect(self.config.db_path, self.config.sqlite_synchronous)
            self.writer = Writer(writer_db, loop, self._on_commit)
        await self.sweep()
        self._maintenance = loop.create_task(self._maintain())
        self._compacting = loop.create_task(self._compact_periodically())

    async def stop(self) -> None:
        """End live runs ``interrupted`` (``server_shutdown``), commit, close the store."""
        for task in (self._maintenance, self._compacting):
            if task is not None:
                task.cancel()
        if self.writer is not None:
            await self.executor.shutdown()
            await asyncio.get_running_loop().run_in_executor(None, self.writer.close)
        self.compactor.close()
        self.db.conn.close()

    def _on_commit(self, appended: dict[str, list[Append]], failed: set[str]) -> None:
        limit = self.config.max_retained_events
        for run_id, items in appended.items():
            channel = self.broadcaster.get(run_id)
            if channel is None:
                continue
            channel.publish(items)
            # A live run over its event budget (with some slack, so this is
            # not every batch) is compacted while it goes on.
            kept = channel.committed_seq - channel.first_seq + 1
            if kept > limit + max(1, limit // 10) and not channel.compaction_due:
                channel.compaction_due = True
                asyncio.ensure_future(self._compact_live(channel))
        for run_id in failed:
            self.executor.lost(run_id)

    async def _maintain(self) -> None:
        # Often enough that a cancel sent to another server sharing the
        # database takes effect within a second.
        interval = max(0.05, min(1.0, self.config.lease_seconds / 3))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew_leases()
                await self.sweep()
            except Exception:
                log.exception("agentruns: lease upkeep failed")

    async def _compact_live(self, channel) -> None:
        try:
            await self.compactor.compact(channel.run_id)
        except Exception:
            log.exception("agentruns: compacting %s failed", channel.run_id)
        finally:
            channel.compaction_due = False

    async def _compact_periodically(self) -> None:
        config = self.config
        shortest = min(config.event_retention_seconds, config.run_retention_seconds)
        interval = min(60.0, max(0.2, shortest / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.compactor.run_once()
            except Exception:
                log.exception("agentruns: retention pass failed")

    async def renew_leases(self) -> None:
        """Renew this server's leases, and take the cancels other servers recorded for its runs."""
        live = list(self.executor.live)
        if not live:
            return
        expires = time.time() + self.config.lease_seconds

        def renew(db) -> list[tuple[str, str | None]]:
            store.renew_leases(db, self.executor_id, live, expires)
            return store.take_cancel_requests(db, self.executor_id)

        for run_id, request in await self.writer.run(renew):
            ctx = self.executor.live.get(run_id)
            if ctx is not None:
                await self.executor.cancel(ctx, request.get("reason"), request.get("requested_at"))
        self.activity_changed()

    async def sweep(self) -> int:
        """End ``interrupted`` every unfinished run whose executor's lease expired.

        Wall clocks jump (a laptop sleeps, a VM is paused): a lease that looks
        expired may belong to a server about to renew it. So a run is
        interrupted only once this server has seen the same expired lease,
        unrenewed, for ``lease_seconds`` of its own monotonic time.
        """
        live = set(self.executor.live)
        ttl = self.config.idempotency_ttl_seconds
        lease = self.config.lease_seconds
        seen = self._expired_seen

        def interrupt_expired(db) -> int:
            now, clock = time.time(), time.monotonic()
            still: dict[str, tuple[float | None, float]] = {}
            count = 0
            for row in store.expired_active_runs(db, now):
                run_id, expires = row["run_id"], row["lease_expires"]
                if run_id in live:
                    continue
                first = seen.get(run_id)
                if first is None or first[0] != expires:
                    still[run_id] = (expires, clock)
                elif clock - first[1] >= lease:
                    interrupt(db, row, "lease_expired")
                    count += 1
                else:
                    still[run_id] = first
            seen.clear()
            seen.update(still)
            store.purge_keys(db, now - ttl)
            return count

        count = await self.writer.run(interrupt_expired)
        if count:
            log.info("agentruns: %d run(s) whose server stopped ended interrupted", count)
        return count

    def activity_changed(self) -> None:
        self._on_activity()

    # Runs ----------------------------------------------------------------

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
            problem: ApiError | None = ApiError(
                404, "unknown_agent", f"No agent named {request.agent!r}; GET agents lists them."
            )
        else:
            reason = spec.input_problem(request.input)
            problem = ApiError(400, "invalid_input", reason) if reason else None
        fp = request.fingerprint
        config = self.config
        now = time.time()

        def create(db) -> tuple[dict[str, Any], bool]:
            if key is not None:
                existing = store.find_key(db, owner, key, now - config.idempotency_ttl_seconds)
                if existing is not None:
                    if existing["fingerprint"] != fp:
                        raise ApiError(
                            422,
                            "idempotency_key_reused",
                            "This Idempotency-Key was used for a different request; "
                            "use a new key for a new run.",
                        )
                    row = store.get_run(db, existing["run_id"])
                    if row is not None:
                        return row, True
            if problem is not None:
                raise problem
            if request.retry_of is not None:
                original = store.get_run(db, request.retry_of)
                if original is None or original["owner"] != owner:
                    raise run_not_found(request.retry_of)
            if store.count_active(db, owner) >= config.max_active_runs_per_user:
                raise ApiError(
                    429,
                    "too_many_active_runs",
                    f"You have {config.max_active_runs_per_user} active runs, the most allowed; "
                    "wait for one to finish or cancel one.",
                    headers={"Retry-After": "5"},
                )
            row = {
                "run_id": new_run_id(),
                "owner": owner,
                "agent": request.agent,
                "status": "queued",
                "session": request.session,
                "metadata": request.metadata if request.metadata is not None else {},
                "input": request.input,
                "retry_of": request.retry_of,
                "created_at": now_iso(),
                "last_seq": 0,
                "first_seq": 1,
                "executor_id": self.executor_id,
                "lease_expires": time.time() + config.lease_seconds,
            }
            store.insert_run(db, row)
            if key is not None:
                store.insert_key(db, owner, key, fp, row["run_id"], now, key_with_run)
            return store.get_run(db, row["run_id"]), False

        row, replayed = await self.writer.run(create)
        if not replayed:
            self.executor.start(row, spec)
            self.activity_changed()
        return self.run_object(row), replayed

    def owned_row(self, owner: str, run_id: str, *, full: bool = False) -> dict[str, Any]:
        """The caller's run (``full``: every column; else only its head), or 404/410."""
        row = store.get_run(self.db, run_id) if full else store.get_run_head(self.db, run_id)
        if row is None:
            tombstone = store.get_tombstone(self.db, run_id)
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

    def get_run(self, owner: str, run_id: str) -> dict[str, Any]:
        return self.run_object(self.owned_row(owner, run_id, full=True))

    def list_runs(
        self,
        owner: str,
        *,
        status: str | None,
        session: str | None,
        limit: int,
        before: str | None,
        retry_of: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of the owner's runs, newest first, and the ``before`` of the next page (or None)."""
        after = parse_page_cursor(before) if before else None
        rows = store.list_runs(
            self.db, owner, status=status, session=session, limit=limit + 1, before=after, retry_of=retry_of
        )
        more = len(rows) > limit
        rows = rows[:limit]
        next_page = page_cursor(rows[-1]["created_at"], rows[-1]["run_id"]) if more else None
        return [self.run_object(row) for row in rows], next_page

    async def cancel(self, owner: str, run_id: str, reason: str | None) -> tuple[dict[str, Any], bool]:
        """Cancel a run; returns ``(run, started)``, started False when it was already ending."""
        await self.start()
        self.owned_row(owner, run_id)
        ctx = self.executor.live.get(run_id)
        if ctx is not None:
            started = await self.executor.cancel(ctx, reason)
        else:
            started = await self.writer.run(lambda db: request_cancel(db, run_id, reason))
        return self.get_run(owner, run_id), started

    async def delete(self, owner: str, run_id: str) -> None:
        await self.start()
        self.owned_row(owner, run_id)  # 404, or 410 for a run retention deleted

        def delete(db) -> None:
            row = store.get_run(db, run_id)
            if row is None or row["owner"] != owner:
                raise run_not_found(run_id)
            if row["status"] in store.ACTIVE_STATUSES:
                raise ApiError(409, "run_active", "The run is still active; cancel it first.")
            store.delete_run(db, run_id)

        await self.writer.run(delete)
        self.forget_snapshot(run_id)

    def forget_snapshot(self, run_id: str) -> None:
        cached = self._snapshots.pop(run_id, None)
        if cached is not None:
            self._snapshot_bytes -= cached[2]

    def run_object(self, row: dict[str, Any]) -> dict[str, Any]:
        """The public run object: ``snapshot`` is exactly the events up to ``last_seq``."""
        run = {name: row.get(name) for name in RUN_FIELDS}
        if run["metadata"] is None:
            run["metadata"] = {}
        run["snapshot"] = self._snapshot_at(row)
        run["output"] = row.get("output")
        run["error"] = row.get("error")
        run["cancel"] = row.get("cancel")
        request = row.get("cancel_request")
        if request is not None and run["status"] in store.ACTIVE_STATUSES:
            # Recorded for the server executing the run, which has not taken it
            # yet: answer with the run as it will be in a moment.
            run["status"] = "cancelling"
            run["cancel"] = {"requested_at": request.get("requested_at"), "reason": request.get("reason"), "stage": None}
        return run

    def _snapshot_at(self, row: dict[str, Any]) -> dict[str, Any]:
        run_id, last_seq = row["run_id"], row["last_seq"]
        if row["snapshot_seq"] == last_seq and row["snapshot"] is not None:
            return row["snapshot"]
        cached = self._snapshots.pop(run_id, None)
        if cached is not None:
            self._snapshot_bytes -= cached[2]
        if cached is not None and row["snapshot_seq"] <= cached[0] <= last_seq:
            seq, builder = cached[0], cached[1]
        else:
            seq, builder = row["snapshot_seq"], reducer.Snapshot(row["snapshot"])
        snapshot = reduce_stored(self.db, run_id, builder, seq, last_seq).to_dict()
        # Cached for the next read of a live run, within a memory budget.
        size = approximate_size(snapshot)
        if size <= SNAPSHOT_CACHE_BYTES // 4:
            self._snapshots[run_id] = (last_seq, builder, size)
            self._snapshot_bytes += size
            while self._snapshot_bytes > SNAPSHOT_CACHE_BYTES:
                self._snapshot_bytes -= self._snapshots.popitem(last=False)[1][2]
        return snapshot

    # Events --------------------------------------------------------------

    def subscriber(self, run_id: str, cursor: int) -> Subscriber:
        return Subscriber(self.db, self.broadcaster, run_id, cursor)

    @contextmanager
    def stream_slot(self, owner: str):
        """Hold one of the owner's ``max_streams_per_user`` open streams."""
        if self.open_streams[owner] >= self.config.max_streams_per_user:
            raise ApiError(
                429,
                "too_many_streams",
                f"You have {self.config.max_streams_per_user} open event streams, the most allowed; "
                "close one (the page stream carries many runs on one connection).",
                headers={"Retry-After": "5"},
            )
        self.open_streams[owner] += 1
        try:
            yield
        finally:
            self.open_streams[owner] -= 1


def approximate_size(snapshot: dict) -> int:
    """Roughly the bytes a snapshot holds: its text, plus a little per tool call."""
    return sum(len(m["text"]) for m in snapshot["messages"]) + 512 * (len(snapshot["tools"]) + 1)


def request_cancel(db, run_id: str, reason: str | None) -> bool:
    """Record a cancel for the server executing ``run_id``; False when there is nothing to start."""
    row = store.get_run(db, run_id)
    if row is None or row["status"] not in ("queued", "running") or row["cancel_request"] is not None:
        return False
    request = {"reason": reason, "requested_at": now_iso()}
    store.update_run(db, run_id, store.encode_fields({"cancel_request": request}))
    return True


def reduce_stored(db, run_id: str, snapshot: reducer.Snapshot, after: int, upto: int) -> reducer.Snapshot:
    """Apply the stored events ``after < seq <= upto`` to ``snapshot``."""
    while after < upto:
        rows = store.read_events(db, run_id, after, 5000, upto)
        if not rows:
            break
        for _seq, type, _ts, data in rows:
            snapshot.apply({"type": type, "data": json.loads(data)})
        after = rows[-1][0]
    return snapshot


def interrupt(db, row: dict[str, Any], reason: str) -> None:
    """End an unfinished run ``interrupted`` with its terminal event, in the caller's transaction."""
    seq = row["last_seq"] + 1
    snapshot = reduce_stored(
        db, row["run_id"], reducer.Snapshot(row["snapshot"]), row["snapshot_seq"], row["last_seq"]
    )
    ts = now_iso()
    store.append_events(db, [(row["run_id"], seq, "run.interrupted", ts, json.dumps({"reason": reason}))])
    store.update_run(
        db,
        row["run_id"],
        store.encode_fields(
            {
                "status": "interrupted",
                "finished_at": ts,
                "finished_ts": time.time(),
                "last_seq": seq,
                "snapshot": snapshot,
                "snapshot_seq": seq,
            }
        ),
    )
