"""The durable run store: SQLite through sqlite-utils.

Tables: ``runs`` (one row per run, its authoritative state), ``events`` (the
per-run log, keyed by ``(run_id, seq)``), ``snapshots`` (a run's events folded
up to a seq), ``idempotency_keys`` and ``tombstones``. Every
function here is synchronous and takes the connection it works on: writes run
on the writer thread inside its transaction (``writer.py``), reads on the
server's event loop through a read connection of their own.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from . import jsonio, reducer
from .reducer import TERMINAL_TYPES

ACTIVE_STATUSES = ("queued", "running", "cancelling")
TERMINAL_STATUSES = tuple(TERMINAL_TYPES.values())

# How long a connection waits for another process's write lock before the
# writer backs off and retries (it never gives up on a batch).
BUSY_TIMEOUT_MS = 10000

# Columns of ``runs`` that hold JSON text (the snapshot has a table of its own).
JSON_COLUMNS = ("metadata", "input", "output", "error", "cancel", "cancel_request")
# A snapshot's JSON is stored in parts of at least this many characters (the last one shorter).
SNAPSHOT_PART_CHARS = 1 << 20


def _migration_1(db: Database) -> None:
    db["runs"].create(
        {
            "run_id": str,
            "owner": str,
            "agent": str,
            "status": str,
            "session": str,
            "metadata": str,
            "input": str,
            "retry_of": str,
            "created_at": str,
            "started_at": str,
            "finished_at": str,
            "finished_ts": float,
            "last_seq": int,
            "first_seq": int,
            "snapshot": str,
            "snapshot_seq": int,
            "output": str,
            "error": str,
            "cancel": str,
            "executor_id": str,
            "lease_expires": float,
        },
        pk="run_id",
        not_null={"owner", "agent", "status", "created_at", "last_seq", "first_seq", "snapshot_seq"},
        defaults={"last_seq": 0, "first_seq": 1, "snapshot_seq": 0},
    )
    db["runs"].create_index(["owner", "status"])
    db["runs"].create_index(["status", "lease_expires"])
    # sqlite-utils cannot create WITHOUT ROWID tables; events are read by
    # (run_id, seq) ranges, which this layout keeps contiguous on disk.
    db.execute(
        """
        CREATE TABLE events (
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            ts TEXT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        ) WITHOUT ROWID
        """
    )
    db["idempotency_keys"].create(
        {"owner": str, "key": str, "fingerprint": str, "run_id": str, "created_ts": float},
        pk=("owner", "key"),
        not_null={"fingerprint", "run_id", "created_ts"},
    )
    db["idempotency_keys"].create_index(["created_ts"])


def _migration_2(db: Database) -> None:
    # A cancel asked of a server that does not execute the run: the one that
    # does picks it up (see Engine.cancel).
    db["runs"].add_column("cancel_request", str)
    db.execute(
        "CREATE INDEX runs_cancel_requests ON runs (executor_id) WHERE cancel_request IS NOT NULL"
    )


def _migration_3(db: Database) -> None:
    # What is left of a run that retention deleted: GET answers 410, not 404.
    db["tombstones"].create({"run_id": str, "owner": str, "deleted_ts": float}, pk="run_id")
    db["runs"].create_index(["status", "finished_ts"])


def _migration_4(db: Database) -> None:
    # A snapshot can hold 100 MB of text. In the runs row, every last_seq
    # update rewrote it and every read of a later column walked through it.
    db["snapshots"].create({"run_id": str, "seq": int, "snapshot": str}, pk="run_id", not_null={"seq", "snapshot"})
    db.execute(
        "INSERT INTO snapshots (run_id, seq, snapshot) "
        "SELECT run_id, snapshot_seq, snapshot FROM runs WHERE snapshot IS NOT NULL"
    )
    db.execute("ALTER TABLE runs DROP COLUMN snapshot")
    db.execute("ALTER TABLE runs DROP COLUMN snapshot_seq")


def _migration_5(db: Database) -> None:
    # Lists page by (created_at, run_id) of the caller's own runs: a rowid
    # cursor told every user how many runs the server holds.
    db.execute("CREATE INDEX runs_owner_created ON runs (owner, created_at, run_id)")
    db.execute("CREATE INDEX runs_retry_of ON runs (retry_of) WHERE retry_of IS NOT NULL")
    # A key a notebook cell made lives as long as its run, not idempotency_ttl_seconds:
    # re-running Monday's notebook on Tuesday finds Monday's runs.
    db["idempotency_keys"].add_column("with_run", int, not_null_default=0)
    # Older versions took NaN and Infinity in a submit and wrote them back,
    # which no browser can parse: such values become null.
    rows = db.conn.execute(
        "SELECT run_id, input, metadata FROM runs WHERE input LIKE '%NaN%' OR input LIKE '%Infinity%' "
        "OR metadata LIKE '%NaN%' OR metadata LIKE '%Infinity%'"
    ).fetchall()
    for run_id, input, metadata in rows:
        fixed = [jsonio.dumps(jsonio.finite(json.loads(text))) if text else text for text in (input, metadata)]
        db.conn.execute("UPDATE runs SET input = ?, metadata = ? WHERE run_id = ?", [*fixed, run_id])
    # A snapshot is written in parts of about a megabyte, streamed from the
    # reducer: as one value, a 100 MB snapshot was held four times over
    # (joined text, JSON, SQLite's bound copy and its record).
    db["snapshots"].add_column("parts", int, not_null_default=1)
    db.execute(
        """
        CREATE TABLE snapshot_parts (
            run_id TEXT NOT NULL,
            part INTEGER NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (run_id, part)
        ) WITHOUT ROWID
        """
    )


# Append only: a database written by a newer version is refused, an older one
# is brought forward one step at a time.
MIGRATIONS = [_migration_1, _migration_2, _migration_3, _migration_4, _migration_5]

# A run with its persisted snapshot (``snapshot_seq`` 0 and no snapshot when none).
RUN_SELECT = (
    "SELECT runs.*, coalesce(snapshots.seq, 0) AS snapshot_seq, snapshots.snapshot AS snapshot, "
    "snapshots.parts AS snapshot_parts FROM runs LEFT JOIN snapshots ON snapshots.run_id = runs.run_id"
)


def connect(path: str | Path, synchronous: str = "FULL") -> Database:
    """Open the store at ``path``, creating and migrating it as needed."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = OFF")
    db = Database(conn)
    migrate(db)
    return db


def migrate(db: Database) -> None:
    """Apply the migrations this database has not seen, each in its own transaction."""
    conn = db.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise RuntimeError(
                f"the agentruns database has schema version {version}, newer than this "
                f"jupyter_agentruns knows ({len(MIGRATIONS)}): upgrade the package"
            )
        for number, migration in enumerate(MIGRATIONS[version:], start=version + 1):
            migration(db)
            conn.execute(f"PRAGMA user_version = {number}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def decode_run(db: Database, row: dict[str, Any]) -> dict[str, Any]:
    """A run row (``RUN_SELECT``) with its JSON columns and its snapshot decoded."""
    for column in JSON_COLUMNS:
        if row.get(column) is not None:
            row[column] = json.loads(row[column])
    parts = row.pop("snapshot_parts", None)
    if row.get("snapshot") is not None:
        text = row["snapshot"]
        if parts is not None and parts > 1:
            rest = db.conn.execute(
                "SELECT data FROM snapshot_parts WHERE run_id = ? ORDER BY part", [row["run_id"]]
            ).fetchall()
            text = "".join([text, *(data for (data,) in rest)])
        row["snapshot"] = json.loads(text)
    return row


def encode_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Columns to set, JSON columns encoded; a ``snapshot`` stays as it is (``write_snapshot``)."""
    return {
        name: jsonio.dumps(value) if name in JSON_COLUMNS and value is not None else value
        for name, value in fields.items()
    }


# Reads -------------------------------------------------------------------


def get_run(db: Database, run_id: str) -> dict[str, Any] | None:
    rows = list(db.query(f"{RUN_SELECT} WHERE runs.run_id = ?", [run_id]))
    return decode_run(db, rows[0]) if rows else None


# What answering for a run needs, without the (possibly huge) snapshot and output.
HEAD_COLUMNS = "run_id, owner, status, last_seq, first_seq, finished_ts"


def get_run_head(db: Database, run_id: str) -> dict[str, Any] | None:
    """A run's owner, status and seqs: cheap, whatever the size of its snapshot."""
    cursor = db.conn.execute(f"SELECT {HEAD_COLUMNS} FROM runs WHERE run_id = ?", [run_id])
    row = cursor.fetchone()
    if row is None:
        return None
    return dict(zip([c[0] for c in cursor.description], row))


def list_runs(
    db: Database,
    owner: str,
    *,
    status: str | None,
    session: str | None,
    limit: int,
    before: tuple[str, str] | None,
    retry_of: str | None = None,
) -> list[dict[str, Any]]:
    """The owner's runs, newest first; ``before`` is the ``(created_at, run_id)`` a page ends with."""
    where = ["owner = ?"]
    params: list[Any] = [owner]
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if session is not None:
        where.append("session = ?")
        params.append(session)
    if retry_of is not None:
        where.append("retry_of = ?")
        params.append(retry_of)
    if before is not None:
        where.append("(created_at < ? OR (created_at = ? AND runs.run_id < ?))")
        params.extend([before[0], before[0], before[1]])
    params.append(limit)
    sql = f"{RUN_SELECT} WHERE {' AND '.join(where)} ORDER BY created_at DESC, runs.run_id DESC LIMIT ?"
    return [decode_run(db, row) for row in db.query(sql, params)]


def read_events(
    db: Database,
    run_id: str,
    after: int,
    limit: int,
    upto: int | None = None,
    max_bytes: int | None = None,
) -> list[tuple]:
    """Rows ``(seq, type, ts, data)`` of ``run_id`` with ``after < seq <= upto``, in order.

    With ``max_bytes``, stop once the data read reaches it (at least one row):
    rows are stepped through, not fetched all at once.
    """
    if upto is None:
        sql = "SELECT seq, type, ts, data FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        params: list[Any] = [run_id, after, limit]
    else:
        sql = (
            "SELECT seq, type, ts, data FROM events WHERE run_id = ? AND seq > ? AND seq <= ? "
            "ORDER BY seq LIMIT ?"
        )
        params = [run_id, after, upto, limit]
    cursor = db.conn.execute(sql, params)
    if max_bytes is None:
        return cursor.fetchall()
    rows, size = [], 0
    for row in cursor:
        rows.append(row)
        size += len(row[3])
        if size >= max_bytes:
            break
    cursor.close()
    return rows


def get_tombstone(db: Database, run_id: str) -> dict[str, Any] | None:
    rows = list(db.query("SELECT * FROM tombstones WHERE run_id = ?", [run_id]))
    return rows[0] if rows else None


def compaction_candidates(db: Database, finished_before: float, max_events: int, limit: int = 100) -> list[str]:
    """Ids of runs with events to fold into their snapshot: finished long enough ago, or too many events."""
    placeholders = ",".join("?" for _ in TERMINAL_STATUSES)
    rows = db.conn.execute(
        f"SELECT run_id FROM runs WHERE (status IN ({placeholders}) AND finished_ts < ? AND first_seq < last_seq) "
        "OR last_seq - first_seq + 1 > ? LIMIT ?",
        [*TERMINAL_STATUSES, finished_before, max_events, limit],
    ).fetchall()
    return [row[0] for row in rows]


def snapshot_seq(db: Database, run_id: str) -> int:
    """The seq the run's persisted snapshot is at (0: none)."""
    row = db.conn.execute("SELECT seq FROM snapshots WHERE run_id = ?", [run_id]).fetchone()
    return row[0] if row else 0


def expired_runs(db: Database, finished_before: float, limit: int = 1000) -> list[tuple[str, str]]:
    """``(run_id, owner)`` of finished runs past their retention."""
    placeholders = ",".join("?" for _ in TERMINAL_STATUSES)
    return db.conn.execute(
        f"SELECT run_id, owner FROM runs WHERE status IN ({placeholders}) AND finished_ts < ? LIMIT ?",
        [*TERMINAL_STATUSES, finished_before, limit],
    ).fetchall()


def find_key(db: Database, owner: str, key: str, not_before: float) -> dict[str, Any] | None:
    """The owner's key, if it was made after ``not_before`` or lives as long as its run."""
    rows = list(
        db.query(
            "SELECT * FROM idempotency_keys WHERE owner = ? AND key = ? AND (created_ts >= ? OR with_run = 1)",
            [owner, key, not_before],
        )
    )
    return rows[0] if rows else None


def count_active(db: Database, owner: str) -> int:
    placeholders = ",".join("?" for _ in ACTIVE_STATUSES)
    return db.conn.execute(
        f"SELECT count(*) FROM runs WHERE owner = ? AND status IN ({placeholders})",
        [owner, *ACTIVE_STATUSES],
    ).fetchone()[0]


def expired_active_runs(db: Database, now: float) -> list[dict[str, Any]]:
    """Runs not yet terminal whose executor's lease has run out."""
    placeholders = ",".join("?" for _ in ACTIVE_STATUSES)
    rows = db.query(
        f"{RUN_SELECT} WHERE status IN ({placeholders}) "
        "AND (lease_expires IS NULL OR lease_expires < ?)",
        [*ACTIVE_STATUSES, now],
    )
    return [decode_run(db, row) for row in rows]


# Writes (inside the writer's transaction) ---------------------------------


def insert_run(db: Database, run: dict[str, Any]) -> None:
    db["runs"].insert(encode_fields(run))


def insert_key(
    db: Database, owner: str, key: str, fingerprint: str, run_id: str, now: float, with_run: bool = False
) -> None:
    db["idempotency_keys"].insert(
        {
            "owner": owner,
            "key": key,
            "fingerprint": fingerprint,
            "run_id": run_id,
            "created_ts": now,
            "with_run": int(with_run),
        },
        replace=True,
    )


def update_run(db: Database, run_id: str, encoded: dict[str, Any]) -> None:
    """Set columns of a run; JSON columns already encoded (``encode_fields``).

    ``snapshot`` and ``snapshot_seq`` (always together) go to the snapshots table.
    """
    columns = dict(encoded)
    snapshot, seq = columns.pop("snapshot", None), columns.pop("snapshot_seq", None)
    if snapshot is not None:
        write_snapshot(db, run_id, seq, snapshot)
    if columns:
        # Raw SQL: ``Table.update`` reads the row first, and this is on the append path.
        assignments = ", ".join(f"{name} = ?" for name in columns)
        db.conn.execute(f"UPDATE runs SET {assignments} WHERE run_id = ?", [*columns.values(), run_id])


def write_snapshot(db: Database, run_id: str, seq: int, snapshot: dict[str, Any] | reducer.Snapshot) -> None:
    """Store the run's snapshot at ``seq``, streamed into parts: its text is never joined or copied whole."""
    builder = snapshot if isinstance(snapshot, reducer.Snapshot) else reducer.Snapshot.wrap(snapshot)
    db.conn.execute("DELETE FROM snapshot_parts WHERE run_id = ?", [run_id])
    first: str | None = None
    count = 0
    buffer: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal first, count, buffer, size
        data = "".join(buffer)
        if count == 0:
            first = data
        else:
            db.conn.execute("INSERT INTO snapshot_parts (run_id, part, data) VALUES (?, ?, ?)", [run_id, count, data])
        count += 1
        buffer, size = [], 0

    for piece in builder.json_chunks():
        buffer.append(piece)
        size += len(piece)
        if size >= SNAPSHOT_PART_CHARS:
            flush()
    if buffer or count == 0:
        flush()
    db.conn.execute(
        "INSERT OR REPLACE INTO snapshots (run_id, seq, snapshot, parts) VALUES (?, ?, ?, ?)",
        [run_id, seq, first, count],
    )


def set_last_seqs(db: Database, pairs: list[tuple[int, str]]) -> None:
    """``(last_seq, run_id)`` pairs: the runs' state change for events that imply no other."""
    db.conn.executemany("UPDATE runs SET last_seq = ? WHERE run_id = ?", pairs)


def append_events(db: Database, rows: Iterable[tuple]) -> None:
    """Append ``(run_id, seq, type, ts, data)`` rows; a duplicate ``(run_id, seq)`` raises."""
    db.conn.executemany("INSERT INTO events (run_id, seq, type, ts, data) VALUES (?, ?, ?, ?, ?)", rows)


def delete_events_before(db: Database, run_id: str, seq: int, limit: int) -> int:
    """Delete up to ``limit`` of the run's events with a smaller seq; returns how many."""
    return db.conn.execute(
        "DELETE FROM events WHERE run_id = ? AND seq IN "
        "(SELECT seq FROM events WHERE run_id = ? AND seq < ? ORDER BY seq LIMIT ?)",
        [run_id, run_id, seq, limit],
    ).rowcount


def bury(db: Database, run_id: str, owner: str, now: float) -> None:
    """Delete a run for retention, leaving a tombstone."""
    delete_run(db, run_id)
    db["tombstones"].insert({"run_id": run_id, "owner": owner, "deleted_ts": now}, replace=True)


def delete_run(db: Database, run_id: str) -> None:
    db.conn.execute("DELETE FROM events WHERE run_id = ?", [run_id])
    db.conn.execute("DELETE FROM idempotency_keys WHERE run_id = ?", [run_id])
    db.conn.execute("DELETE FROM snapshots WHERE run_id = ?", [run_id])
    db.conn.execute("DELETE FROM snapshot_parts WHERE run_id = ?", [run_id])
    db.conn.execute("DELETE FROM runs WHERE run_id = ?", [run_id])


def renew_leases(db: Database, executor_id: str, run_ids: list[str], expires: float) -> None:
    db.conn.executemany(
        "UPDATE runs SET lease_expires = ? WHERE run_id = ? AND executor_id = ?",
        [(expires, run_id, executor_id) for run_id in run_ids],
    )


def take_cancel_requests(db: Database, executor_id: str) -> list[tuple[str, dict[str, Any]]]:
    """Cancels other servers recorded for this executor's runs, cleared as they are taken."""
    rows = db.conn.execute(
        "SELECT run_id, cancel_request FROM runs WHERE executor_id = ? AND cancel_request IS NOT NULL",
        [executor_id],
    ).fetchall()
    db.conn.executemany("UPDATE runs SET cancel_request = NULL WHERE run_id = ?", [(r[0],) for r in rows])
    return [(run_id, json.loads(request)) for run_id, request in rows]


def purge_keys(db: Database, older_than: float) -> None:
    """Forget keys past their time; keys that live with their run go with it (``delete_run``)."""
    db.conn.execute("DELETE FROM idempotency_keys WHERE created_ts < ? AND with_run = 0", [older_than])
