"""The store writer: one thread, one connection, group commit.

Every write goes through here, from every run: event appends (with the run
state they imply) and one-off operations (submit, cancel, delete, leases). The
thread takes whatever is queued the moment it is free, writes it in one
transaction, commits, and only then reports back to the event loop, which
publishes the committed events to subscribers (publish-after-commit). There is
no timer: under load batches grow by themselves, idle appends commit at once.

The queue is bounded in events and bytes: ``Writer.full`` tells the producer
to wait (``wait_for_space``) until commits drain it. Nothing is ever dropped:
a batch that fails for a passing reason (``StoreBusy``: the database locked
by another process, a full disk) is retried until it commits. The writer
knows the store only through its interface, whichever database it is.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from . import events, jsonio, lifecycle, metrics
from .domain import RunFields
from .events import EVENT, FIELDS, ROW, RUN_ID, SEQ, SIZE, Append, envelope
from .store import SeqTaken, Store, StoreBusy, StoreConnection, StoreUnavailable, end_stored

# A batch costs a few statements whatever its size (each a wait for the GIL
# while the event loop is busy): under load, bigger batches pay them less often.
MAX_BATCH = 8192
MAX_PENDING_EVENTS = 4 * MAX_BATCH
# Events queued but not yet committed; beyond either bound producers wait. The
# bytes bound is what a run of large events can hold in memory before the disk.
MAX_PENDING_BYTES = 16 * 1024 * 1024
RETRY_FIRST_SECONDS = 0.05
RETRY_MAX_SECONDS = 2.0
CLOSE_TIMEOUT_SECONDS = 30.0


# The writer's thread, by name: functions marked ``in_transaction`` check they run on it.
WRITER_THREAD = "agentruns-writer"


def in_transaction(fn: Callable[[StoreConnection], Any]) -> Callable[[StoreConnection], Any]:
    """Mark ``fn(conn)`` as a function the writer runs inside its transaction, on its thread.

    ``Writer.run`` takes only functions marked so, and each checks where it
    runs: what a part of the engine does in the store's transaction is said
    where it is written, and a call from anywhere else fails at once.
    """

    @functools.wraps(fn)
    def on_writer_thread(conn: StoreConnection) -> Any:
        if threading.current_thread().name != WRITER_THREAD:
            raise RuntimeError(f"{fn.__qualname__} runs on the store writer's thread only")
        return fn(conn)

    on_writer_thread.in_transaction = True  # type: ignore[attr-defined]
    return on_writer_thread


class Op:
    """A function run inside the writer's transaction, answered through a future."""

    __slots__ = ("fn", "future", "abandoned")

    def __init__(self, fn: Callable[[StoreConnection], Any], future: asyncio.Future):
        self.fn = fn
        self.future = future
        # Answered 503 while still queued (the store unreachable): never run.
        self.abandoned = False


class Writer:
    """The one writer of a store in this server: a thread with its own connection."""

    def __init__(
        self,
        store: Store,
        loop: asyncio.AbstractEventLoop,
        on_commit: Callable[[dict[str, list[Append]], dict[str, str]], None],
        log: logging.Logger,
        max_pending_events: int = MAX_PENDING_EVENTS,
        max_pending_bytes: int = MAX_PENDING_BYTES,
    ):
        self._conn = store.connect()
        self._log = log
        self._loop = loop
        self._on_commit = on_commit
        # The queue's bounds (public: a test fills the queue by lowering one).
        self.max_pending_events = max_pending_events
        self.max_pending_bytes = max_pending_bytes
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._idle = False
        # Runs whose appends were refused once: later ones would leave a hole.
        # Touched on the writer thread only.
        self._refused: set[str] = set()
        # Why the database cannot be reached, while it cannot (set by the writer
        # thread, read on the loop): new one-off operations fail at once (503).
        self.unavailable: StoreUnavailable | None = None
        # Touched on the event loop only.
        self.pending_events = 0
        self.pending_bytes = 0
        self._space = asyncio.Event()
        self._space.set()
        metrics.WRITER_QUEUE_EVENTS.track(self, lambda writer: writer.pending_events)
        metrics.WRITER_QUEUE_BYTES.track(self, lambda writer: writer.pending_bytes)
        self._thread = threading.Thread(target=self._run, name=WRITER_THREAD, daemon=True)
        self._thread.start()

    # Event-loop side -------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._stopping

    @property
    def full(self) -> bool:
        return (
            self.pending_events >= self.max_pending_events
            or self.pending_bytes >= self.max_pending_bytes
        )

    async def wait_for_space(self) -> None:
        while self.full:
            self._space.clear()
            await self._space.wait()

    def append(self, item: Append) -> None:
        """Queue one event; the caller waits for space first (``full``)."""
        self._put(item)
        self.pending_events += 1
        self.pending_bytes += item[SIZE]

    def run(self, fn: Callable[[StoreConnection], Any]) -> asyncio.Future:
        """Run ``fn(connection)`` in the writer's next transaction; the future gets its result.

        While the database cannot be reached the future fails with
        ``StoreUnavailable`` (at once, or when its batch finds out): a request
        is answered 503, not held until the database is back. Events are
        never failed: they stay queued and their producers wait for room.
        """
        if not getattr(fn, "in_transaction", False):
            raise TypeError(
                f"{fn!r} is not marked to run in the writer's transaction (in_transaction)"
            )
        future = self._loop.create_future()
        unavailable = self.unavailable
        if unavailable is not None:
            future.set_exception(type(unavailable)(str(unavailable)))
            return future
        self._put(Op(fn, future))
        return future

    def forget_refused(self, run_id: str) -> asyncio.Future:
        """Drop the record of a refused run once its queued appends are behind us."""

        @in_transaction
        def forget(conn: StoreConnection) -> None:
            self._refused.discard(run_id)

        return self.run(forget)

    def _put(self, item) -> None:
        if self._stopping:
            raise RuntimeError("the agentruns store is closed")
        self._queue.append(item)  # deque appends are atomic: no lock per event
        # Wake the writer only when it sleeps (or is about to): it sets _idle
        # under the lock before it looks at the queue, so no append is missed.
        # Once woken it is not idle any more: the appends that follow until
        # it runs take no lock (each would wait for the waking thread's).
        if self._idle:
            with self._cond:
                self._idle = False
                self._cond.notify()

    def _committed(
        self,
        appended: dict[str, list[Append]],
        refused: dict[str, list[Append]],
        results,
        ended: dict[str, list[Append]] | None = None,
    ) -> None:
        try:
            for items in (*appended.values(), *refused.values()):
                self.pending_events -= len(items)
                self.pending_bytes -= sum([item[SIZE] for item in items])
            # Why each refused run was: "taken" (another server ended it) or
            # "invalid" (the writer ended it failed, its end in ``appended``).
            reasons = {
                run_id: "invalid" if run_id in (ended or ()) else "taken" for run_id in refused
            }
            if ended:
                appended = {**appended, **ended}
            self._on_commit(appended, reasons)
        finally:
            for future, ok, value in results:
                if future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
            if not self.full:
                self._space.set()

    def _abandon_queued_ops(self) -> None:
        """Answer 503 to the operations queued while the store cannot be reached; they never run."""
        unavailable = self.unavailable
        if unavailable is None:
            return  # the store is back: they run in turn
        with self._cond:  # the writer thread takes batches under it
            ops = [item for item in self._queue if item.__class__ is Op and not item.abandoned]
            for op in ops:
                op.abandoned = True
        for op in ops:
            if not op.future.done():
                op.future.set_exception(type(unavailable)(str(unavailable)))

    def close(self, timeout: float = CLOSE_TIMEOUT_SECONDS) -> None:
        """Commit what is queued, then stop the thread and close its connection.

        A store that stays locked (another process holding its write lock)
        would keep the batch retrying forever: a stopping server waits
        ``timeout`` seconds for it, then says so and goes.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)
        metrics.WRITER_QUEUE_EVENTS.untrack(self)
        metrics.WRITER_QUEUE_BYTES.untrack(self)
        if self._thread.is_alive():
            self._log.error(
                "agentruns: the store stayed busy for %g s at shutdown: %d queued event(s) were not "
                "committed (their runs end interrupted at the next start)",
                timeout,
                self.pending_events,
            )
            return
        self._conn.close()

    # Writer thread ---------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    # Set before each look at the queue (a producer that wakes
                    # us clears it): an append after the look sees it and wakes us.
                    self._idle = True
                    if self._queue or self._stopping:
                        break
                    self._cond.wait()
                self._idle = False
                if not self._queue and self._stopping:
                    return
                # Taken under the lock, under which the loop abandons queued operations.
                popleft = self._queue.popleft
                batch = [popleft() for _ in range(min(len(self._queue), MAX_BATCH))]
            self._write_until_committed(batch)

    def _write_until_committed(self, batch: list) -> None:
        delay = RETRY_FIRST_SECONDS
        while True:
            try:
                began = time.perf_counter()
                outcome = self._write(batch)
                count_commit(outcome[0], time.perf_counter() - began)
                self.unavailable = None
            except StoreBusy as exc:
                if isinstance(exc, StoreUnavailable):
                    self.unavailable = exc
                    try:
                        # Those queued after this batch was taken, before the
                        # mark above, would otherwise wait for the store too.
                        self._loop.call_soon_threadsafe(self._abandon_queued_ops)
                    except RuntimeError:
                        return  # the event loop is closed: nobody is waiting any more
                    # One-off operations are answered now (their requests get
                    # a 503, not a wait of unknown length); events stay and retry.
                    ops = [item for item in batch if isinstance(item, Op)]
                    if ops:
                        batch = [item for item in batch if not isinstance(item, Op)]
                        failures: list[tuple[asyncio.Future, bool, BaseException]] = [
                            (op.future, False, type(exc)(str(exc))) for op in ops
                        ]
                        if not batch:
                            # Nothing is left to retry, so the writer is free:
                            # the next request tries the store itself. Left
                            # set, this one failure would refuse every request
                            # of an idle server long after the database is back.
                            # (Cleared before the answers go out: a caller that
                            # tries again at once must find it cleared.)
                            self.unavailable = None
                        try:
                            self._loop.call_soon_threadsafe(self._committed, {}, {}, failures)
                        except RuntimeError:
                            return  # the event loop is closed: nobody is waiting any more
                        if not batch:
                            return
                # Locked by another process, disk full, I/O error: nothing
                # is dropped; producers wait (the queue is bounded) until
                # the same batch commits.
                self._log.warning(
                    "agentruns: store write failed (%s); retrying in %.2f s", exc, delay
                )
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)
                continue
            except BaseException as exc:  # a bug: answer the batch, keep the thread alive
                self._log.exception("agentruns: store writer failed on a batch")
                failures = [(op.future, False, exc) for op in batch if isinstance(op, Op)]
                outcome = ({}, self._refuse_all(batch), failures, {})
            try:
                self._loop.call_soon_threadsafe(self._committed, *outcome)
            except RuntimeError:
                return  # the event loop is closed: nobody is waiting any more
            return

    def _refuse_all(self, batch: list) -> dict[str, list[Append]]:
        refused: dict[str, list[Append]] = {}
        for item in batch:
            if item.__class__ is tuple:  # an Append
                run_id = item[ROW][RUN_ID]
                self._refused.add(run_id)
                refused.setdefault(run_id, []).append(item)
        return refused

    @staticmethod
    def _fail_poisoned(conn: StoreConnection, run_id: str, exc: Exception) -> list[Append]:
        """End a run whose events the store refused ``failed`` (``invalid_event``), in this batch.

        Its refused events are dropped: the run's log ends at what was
        committed, then its one terminal event.
        """
        row = conn.get_run(run_id)
        if row is None or not lifecycle.is_active(row["status"]):
            return []
        error = {
            "type": "invalid_event",
            "message": f"the run emitted a value the store cannot hold ({type(exc).__name__})",
        }
        run_id_json = jsonio.dumps(run_id)
        return [
            events.append(*event, None, envelope(run_id_json, *event[1:]))
            for event in end_stored(conn, row, lifecycle.failed(error))
        ]

    @staticmethod
    def _append(conn: StoreConnection, runs: dict[str, list[Append]]) -> None:
        """The events of ``runs`` and the run state they imply."""
        conn.append_events([item[ROW] for items in runs.values() for item in items])
        plain = []
        for run_id, items in runs.items():
            fields: RunFields = {}
            for item in items:
                if item[FIELDS]:
                    fields.update(cast(RunFields, item[FIELDS]))
            last_seq = items[-1][EVENT][SEQ]
            if fields:
                fields["last_seq"] = last_seq
                conn.update_run(run_id, fields)
            else:
                plain.append((last_seq, run_id))
        conn.set_last_seqs(plain)

    def _write(self, batch: list):
        """One transaction for the batch; returns (appended, refused, op results)."""
        conn = self._conn
        appended: dict[str, list[Append]] = {}
        refused: dict[str, list[Append]] = {}
        # The events the writer itself appended: a poisoned run's end.
        ended: dict[str, list[Append]] = {}
        results: list = []
        pending_runs: dict[str, list[Append]] = {}

        def flush_appends() -> None:
            runs = {}
            for run_id, items in pending_runs.items():
                if run_id in self._refused:
                    refused.setdefault(run_id, []).extend(items)
                else:
                    runs[run_id] = items
            pending_runs.clear()
            if not runs:
                return
            try:
                # All runs' events in one statement: the common case.
                with conn.savepoint():
                    self._append(conn, runs)
                accepted = runs
            except StoreBusy:
                raise
            except Exception:
                # Some run's events were refused: find which, one run at a time,
                # so that the others in the batch still commit.
                accepted = {}
                for run_id, items in runs.items():
                    try:
                        with conn.savepoint():
                            self._append(conn, {run_id: items})
                    except StoreBusy:
                        raise
                    except SeqTaken:
                        # Another server ended this run after this server's
                        # lease on it expired.
                        self._log.error(
                            "agentruns: events of %s were refused: another server ended it", run_id
                        )
                        self._refused.add(run_id)
                        refused.setdefault(run_id, []).extend(items)
                    except Exception as exc:
                        # A value the store cannot hold (a number out of its
                        # range): the run that emitted it fails, no other.
                        self._log.error(
                            "agentruns: events of %s cannot be stored (%s: %s): the run fails",
                            run_id,
                            type(exc).__name__,
                            exc,
                        )
                        self._refused.add(run_id)
                        refused.setdefault(run_id, []).extend(items)
                        ended[run_id] = self._fail_poisoned(conn, run_id, exc)
                    else:
                        accepted[run_id] = items
            for run_id, items in accepted.items():
                appended.setdefault(run_id, []).extend(items)

        with conn.transaction():
            for item in batch:
                if item.__class__ is tuple:  # an Append
                    run_id = item[ROW][RUN_ID]
                    items = pending_runs.get(run_id)
                    if items is None:
                        pending_runs[run_id] = [item]
                    else:
                        items.append(item)
                    continue
                if item.abandoned:
                    continue  # already answered 503 while it was queued
                flush_appends()
                try:
                    with conn.savepoint():
                        value = item.fn(conn)
                    results.append((item.future, True, value))
                except StoreBusy:
                    raise
                except Exception as exc:  # an answer for the caller, e.g. a 4xx
                    results.append((item.future, False, exc))
            flush_appends()
        return appended, refused, results, ended


def count_commit(appended: dict[str, list[Append]], seconds: float) -> None:
    """One committed batch in the metrics: a few updates per commit, none per event."""
    events = sum(map(len, appended.values()))
    metrics.COMMITS.inc()
    metrics.COMMIT_EVENTS.observe(events)
    metrics.COMMIT_SECONDS.observe(seconds)
    if events:
        metrics.EVENTS_APPENDED.inc(events)
