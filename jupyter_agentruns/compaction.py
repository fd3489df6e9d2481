"""Retention: fold old events into a run's snapshot, delete runs past their time.

Token deltas are the bulk of a log. Once a run finished more than
``event_retention_seconds`` ago, or holds more than ``max_retained_events``,
its oldest events are folded into its persisted snapshot and deleted, and its
``first_seq`` advances; the terminal event always stays. A client whose cursor
falls before ``first_seq - 1`` then gets the snapshot and continues from its
watermark (see ``Subscriber``). Finished runs older than
``run_retention_seconds`` are deleted, leaving a tombstone (410, not 404).

The work never holds the store for long: events are reduced on a reader
thread, the writer only records the result, and deletes go in small chunks
between other writes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from . import metrics, reducer
from .broadcaster import Broadcaster
from .domain import RunFields, RunHead
from .lifecycle import is_terminal
from .reader import Reader
from .settings import Settings
from .store import StoreConnection, reduce_stored
from .writer import Writer, in_transaction

DELETE_CHUNK = 5000


def compaction_target(
    row: RunHead, now: float, retention_seconds: float, max_events: int
) -> int | None:
    """The ``first_seq`` a run should have now, or None when it has nothing to compact."""
    target = row["first_seq"]
    finished_ts = row["finished_ts"]
    if (
        is_terminal(row["status"])
        and finished_ts is not None
        and now - finished_ts >= retention_seconds
    ):
        target = row["last_seq"]  # keep only the terminal event
    if row["last_seq"] - row["first_seq"] + 1 > max_events:
        target = max(target, row["last_seq"] - max_events + 1)
    return target if target > row["first_seq"] else None


class Compactor:
    def __init__(
        self,
        *,
        writer: Writer,
        reader: Reader,
        broadcaster: Broadcaster,
        settings: Settings,
        on_deleted: Callable[[str], None],
    ):
        self._writer = writer
        self._reader = reader
        self._broadcaster = broadcaster
        self._settings = settings
        self._on_deleted = on_deleted
        self._lock = asyncio.Lock()  # one compaction at a time

    async def run_once(self) -> dict[str, int]:
        """One pass: compact what is due, delete what expired.

        Returns counts: runs ``compacted``, the ``events`` folded into their
        snapshots, runs ``deleted`` (a pass takes a bounded number of each:
        a backlog takes several passes).
        """
        async with self._lock:
            now = time.time()
            settings = self._settings
            candidates = await self._reader.run(
                lambda conn: conn.compaction_candidates(
                    now - settings.event_retention_seconds, settings.max_retained_events
                )
            )
            compacted = events = 0
            for run_id in candidates:
                folded = await self._compact(run_id)
                if folded:
                    compacted += 1
                    events += folded
            expired = await self._reader.run(
                lambda conn: conn.expired_runs(now - settings.run_retention_seconds)
            )
            deleted = 0
            for run_id, owner in expired:
                deleted += await self.bury(run_id, owner)
            return {"compacted": compacted, "events": events, "deleted": deleted}

    async def compact(self, run_id: str) -> bool:
        """Fold the run's old events into its snapshot; True when ``first_seq`` advanced."""
        async with self._lock:
            return await self._compact(run_id) > 0

    async def _compact(self, run_id: str) -> int:
        """The number of events folded into the snapshot (0: none were due, or the run changed)."""
        settings = self._settings

        def reduce(conn: StoreConnection) -> tuple[int, int, reducer.Snapshot | None] | None:
            head = conn.get_run_head(run_id)
            if head is None:
                return None
            target = compaction_target(
                head, time.time(), settings.event_retention_seconds, settings.max_retained_events
            )
            if target is None:
                return None
            base_seq = conn.snapshot_seq(run_id)
            if base_seq >= target - 1:
                return target, base_seq, None
            # Only now the stored snapshot is needed, as the base to reduce onto.
            stored = conn.get_run(run_id)
            if stored is None:
                return None  # deleted since its head was read (another server's delete)
            base = reducer.Snapshot(stored["snapshot"])
            return target, base_seq, reduce_stored(conn, run_id, base, base_seq, target - 1)

        reduced = await self._reader.run(reduce)
        if reduced is None:
            return 0
        target, base_seq, snapshot = reduced
        watermark = target - 1

        @in_transaction
        def record(conn: StoreConnection) -> int:
            """How many events the run's new ``first_seq`` leaves behind (0: none)."""
            conn.lock_run(run_id)
            current = conn.get_run_head(run_id)
            if current is None or current["first_seq"] >= target:
                return 0
            fields: RunFields = {"first_seq": target}
            # A newer snapshot (the terminal one) is never replaced by an older one.
            current_seq = conn.snapshot_seq(run_id)
            if current_seq < watermark:
                if snapshot is None or current_seq != base_seq:
                    return 0  # reduced from a base that changed meanwhile: next pass
                fields["snapshot"] = snapshot
                fields["snapshot_seq"] = watermark
            conn.update_run(run_id, fields)
            return target - current["first_seq"]

        folded = await self._writer.run(record)
        if not folded:
            return 0
        metrics.EVENTS_COMPACTED.inc(folded)
        channel = self._broadcaster.get(run_id)
        if channel is not None:
            channel.first_seq = target
        # Readers already ignore what is below first_seq; the rows go in small bites.

        @in_transaction
        def delete_some(conn: StoreConnection) -> int:
            return conn.delete_events_before(run_id, target, DELETE_CHUNK)

        while await self._writer.run(delete_some):
            await asyncio.sleep(0)
        return folded

    async def bury(self, run_id: str, owner: str) -> bool:
        """Delete a run past its retention, in chunks, leaving its tombstone.

        False when another server sharing the store deleted it first: counted once, by that one.
        """

        @in_transaction
        def delete_some(conn: StoreConnection) -> int:
            return conn.delete_events_before(run_id, 2**62, DELETE_CHUNK)

        @in_transaction
        def bury(conn: StoreConnection) -> bool:
            return conn.bury(run_id, owner, time.time())

        while await self._writer.run(delete_some):
            await asyncio.sleep(0)
        buried = await self._writer.run(bury)
        if buried:
            metrics.RUNS_DELETED.labels("retention").inc()
        self._on_deleted(run_id)
        return buried
