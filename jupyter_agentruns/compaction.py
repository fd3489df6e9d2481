"""Retention: fold old events into a run's snapshot, delete runs past their time.

Token deltas are the bulk of a log. Once a run finished more than
``event_retention_seconds`` ago, or holds more than ``max_retained_events``,
its oldest events are folded into its persisted snapshot and deleted, and its
``first_seq`` advances; the terminal event always stays. A client whose cursor
falls before ``first_seq - 1`` then gets the snapshot and continues from its
watermark (see ``Subscriber``). Finished runs older than
``run_retention_seconds`` are deleted, leaving a tombstone (410, not 404).

The work never holds the store for long: events are reduced on a thread of
their own with a read connection, the writer only records the result, and
deletes go in small chunks between other writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from . import reducer, store

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger(__name__)

DELETE_CHUNK = 5000


def compaction_target(row: dict[str, Any], now: float, retention_seconds: float, max_events: int) -> int | None:
    """The ``first_seq`` a run should have now, or None when it has nothing to compact."""
    target = row["first_seq"]
    finished_ts = row.get("finished_ts")
    if row["status"] in store.TERMINAL_STATUSES and finished_ts is not None and now - finished_ts >= retention_seconds:
        target = row["last_seq"]  # keep only the terminal event
    if row["last_seq"] - row["first_seq"] + 1 > max_events:
        target = max(target, row["last_seq"] - max_events + 1)
    return target if target > row["first_seq"] else None


class Compactor:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._db = None  # the compactor thread's own read connection
        self._lock = asyncio.Lock()  # one compaction at a time

    @property
    def config(self):
        return self.engine.config

    def _read_db(self):
        if self._db is None:
            self._db = store.connect(self.config.db_path, self.config.sqlite_synchronous)
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.conn.close()
            self._db = None

    async def run_once(self) -> dict[str, int]:
        """One pass: compact what is due, delete what expired. Returns counts."""
        async with self._lock:
            now = time.time()
            config = self.config
            candidates = store.compaction_candidates(
                self.engine.db, now - config.event_retention_seconds, config.max_retained_events
            )
            compacted = 0
            for run_id in candidates:
                if await self._compact(run_id):
                    compacted += 1
            expired = store.expired_runs(self.engine.db, now - config.run_retention_seconds)
            for run_id, owner in expired:
                await self.bury(run_id, owner)
            return {"compacted": compacted, "deleted": len(expired)}

    async def compact(self, run_id: str) -> bool:
        """Fold the run's old events into its snapshot; True when ``first_seq`` advanced."""
        async with self._lock:
            return await self._compact(run_id)

    async def _compact(self, run_id: str) -> bool:
        config = self.config
        head = store.get_run_head(self.engine.db, run_id)
        if head is None:
            return False
        target = compaction_target(head, time.time(), config.event_retention_seconds, config.max_retained_events)
        if target is None:
            return False
        watermark = target - 1
        base_seq = store.snapshot_seq(self.engine.db, run_id)
        snapshot = None
        if base_seq < watermark:
            # Only now the stored snapshot is needed, as the base to reduce onto.
            base = reducer.Snapshot(store.get_run(self.engine.db, run_id)["snapshot"])
            loop = asyncio.get_running_loop()
            snapshot = await loop.run_in_executor(None, self._reduce, run_id, base, base_seq, watermark)

        def record(db) -> bool:
            current = store.get_run_head(db, run_id)
            if current is None or current["first_seq"] >= target:
                return False
            fields: dict[str, Any] = {"first_seq": target}
            # A newer snapshot (the terminal one) is never replaced by an older one.
            current_seq = store.snapshot_seq(db, run_id)
            if current_seq < watermark:
                if snapshot is None or current_seq != base_seq:
                    return False  # reduced from a base that changed meanwhile: next pass
                fields["snapshot"] = snapshot
                fields["snapshot_seq"] = watermark
            store.update_run(db, run_id, store.encode_fields(fields))
            return True

        if not await self.engine.writer.run(record):
            return False
        channel = self.engine.broadcaster.get(run_id)
        if channel is not None:
            channel.first_seq = target
        # Readers already ignore what is below first_seq; the rows go in small bites.
        while await self.engine.writer.run(
            lambda db: store.delete_events_before(db, run_id, target, DELETE_CHUNK)
        ):
            await asyncio.sleep(0)
        return True

    def _reduce(self, run_id: str, snapshot: reducer.Snapshot, after: int, upto: int) -> reducer.Snapshot:
        from .engine import reduce_stored

        return reduce_stored(self._read_db(), run_id, snapshot, after, upto)

    async def bury(self, run_id: str, owner: str) -> None:
        """Delete a run past its retention, in chunks, leaving its tombstone."""
        while await self.engine.writer.run(
            lambda db: store.delete_events_before(db, run_id, 2**62, DELETE_CHUNK)
        ):
            await asyncio.sleep(0)
        await self.engine.writer.run(lambda db: store.bury(db, run_id, owner, time.time()))
        self.engine.forget_snapshot(run_id)
