"""The store writer: one thread, one connection, group commit.

Every write goes through here, from every run: event appends (with the run
state they imply) and one-off operations (submit, cancel, delete, leases). The
thread takes whatever is queued the moment it is free, writes it in one
transaction, commits, and only then reports back to the event loop, which
publishes the committed events to subscribers (publish-after-commit). There is
no timer: under load batches grow by themselves, idle appends commit at once.

The queue is bounded: ``Writer.full`` tells the producer to wait
(``wait_for_space``) until commits drain it. Nothing is ever dropped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from sqlite_utils import Database

from . import store

log = logging.getLogger(__name__)

MAX_BATCH = 5000


class Append:
    """One event of one run, with the run-state change it implies."""

    __slots__ = ("run_id", "seq", "type", "ts", "data", "fields", "envelope")

    def __init__(self, run_id, seq, type, ts, data, fields, envelope):
        self.run_id = run_id
        self.seq = seq
        self.type = type
        self.ts = ts
        self.data = data  # JSON text
        self.fields = fields  # runs columns to set with this event, or None
        self.envelope = envelope  # the event's wire JSON, built once


class Op:
    """A function run inside the writer's transaction, answered through a future."""

    __slots__ = ("fn", "future")

    def __init__(self, fn: Callable[[Database], Any], future: asyncio.Future):
        self.fn = fn
        self.future = future


class Writer:
    def __init__(
        self,
        db: Database,
        loop: asyncio.AbstractEventLoop,
        on_commit: Callable[[dict[str, list[Append]], set[str]], None],
        max_pending: int = 20000,
    ):
        self._db = db
        self._loop = loop
        self._on_commit = on_commit
        self._max_pending = max_pending
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._stopping = False
        # Runs whose appends were refused once: later ones would leave a hole.
        self._refused: set[str] = set()
        # Touched on the event loop only.
        self.pending = 0
        self._space = asyncio.Event()
        self._space.set()
        self._thread = threading.Thread(target=self._run, name="agentruns-writer", daemon=True)
        self._thread.start()

    # Event-loop side -------------------------------------------------------

    @property
    def full(self) -> bool:
        return self.pending >= self._max_pending

    async def wait_for_space(self) -> None:
        while self.full:
            self._space.clear()
            await self._space.wait()

    def append(self, item: Append) -> None:
        """Queue one event; the caller checks ``full`` and waits for space first."""
        self.pending += 1
        self._put(item)

    def run(self, fn: Callable[[Database], Any]) -> asyncio.Future:
        """Run ``fn(db)`` in the writer's next transaction; the future gets its result."""
        future = self._loop.create_future()
        self._put(Op(fn, future))
        return future

    def _put(self, item) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("the agentruns store is closed")
            self._queue.append(item)
            self._cond.notify()

    def close(self) -> None:
        """Commit what is queued, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    # Writer thread ---------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue and self._stopping:
                    return
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH))]
            self._write(batch)

    def _write(self, batch: list) -> None:
        db = self._db
        appended: dict[str, list[Append]] = {}
        failed: dict[str, int] = {}
        results: list = []
        pending_runs: dict[str, list[Append]] = {}

        def flush_appends() -> None:
            for run_id, items in pending_runs.items():
                if run_id in self._refused:
                    failed[run_id] = failed.get(run_id, 0) + len(items)
                    continue
                try:
                    with db.atomic():
                        store.append_events(
                            db, [(i.run_id, i.seq, i.type, i.ts, i.data) for i in items]
                        )
                        fields: dict[str, Any] = {}
                        for item in items:
                            if item.fields:
                                fields.update(item.fields)
                        fields["last_seq"] = items[-1].seq
                        store.update_run(db, run_id, fields)
                except Exception:
                    # Another writer took these seqs (a run this server lost
                    # its lease on): this run's events are refused, the
                    # others in the batch still commit.
                    log.exception("agentruns: could not append events of %s", run_id)
                    self._refused.add(run_id)
                    failed[run_id] = failed.get(run_id, 0) + len(items)
                    continue
                appended.setdefault(run_id, []).extend(items)
            pending_runs.clear()

        try:
            db.conn.execute("BEGIN IMMEDIATE")
            for item in batch:
                if isinstance(item, Append):
                    pending_runs.setdefault(item.run_id, []).append(item)
                    continue
                flush_appends()
                try:
                    with db.atomic():
                        value = item.fn(db)
                    results.append((item.future, True, value))
                except Exception as exc:  # an answer for the caller, e.g. a 4xx
                    results.append((item.future, False, exc))
            flush_appends()
            db.conn.execute("COMMIT")
        except Exception as exc:
            log.exception("agentruns: a store commit failed")
            if db.conn.in_transaction:
                db.conn.execute("ROLLBACK")
            appended, failed, results = {}, {}, []
            for item in batch:
                if isinstance(item, Append):
                    self._refused.add(item.run_id)
                    failed[item.run_id] = failed.get(item.run_id, 0) + 1
                else:
                    results.append((item.future, False, exc))
        self._loop.call_soon_threadsafe(self._committed, appended, failed, results)

    def _committed(self, appended, failed: dict[str, int], results) -> None:
        self.pending -= sum(failed.values())
        self.pending -= sum(len(items) for items in appended.values())
        self._on_commit(appended, set(failed))
        for future, ok, value in results:
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
        if not self.full:
            self._space.set()
