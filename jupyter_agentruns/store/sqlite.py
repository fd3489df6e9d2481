"""The store on one SQLite file, through sqlite-utils: the embedded default.

Tables: ``runs`` (one row per run, its authoritative state), ``events`` (the
per-run log, keyed by ``(run_id, seq)``), ``snapshots`` and ``snapshot_parts``
(a run's events folded up to a seq), ``idempotency_keys`` and ``tombstones``.
WAL lets readers on their own connections go on while the writer commits;
several servers on one machine may share the file. WAL needs a local disk.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from .. import budgets, jsonio, reducer
from ..lifecycle import ACTIVE_STATUSES, CANCELLABLE, TERMINAL_STATUSES
from . import (
    HEAD_COLUMNS,
    RUN_SELECT,
    UNCLAIMED,
    SeqTaken,
    Store,
    StoreBusy,
    StoreConnection,
    decode_run,
    encode_columns,
    split_parts,
)

# How long a connection waits for another process's write lock before the
# writer backs off and retries (it never gives up on a batch).
BUSY_TIMEOUT_MS = 10000

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
        not_null={
            "owner",
            "agent",
            "status",
            "created_at",
            "last_seq",
            "first_seq",
            "snapshot_seq",
        },
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
    db["snapshots"].create(
        {"run_id": str, "seq": int, "snapshot": str}, pk="run_id", not_null={"seq", "snapshot"}
    )
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
        fixed = [
            jsonio.dumps(jsonio.finite(json.loads(text))) if text else text
            for text in (input, metadata)
        ]
        db.conn.execute(
            "UPDATE runs SET input = ?, metadata = ? WHERE run_id = ?", [*fixed, run_id]
        )
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


def _migration_6(db: Database) -> None:
    # Session queues: runs waiting behind earlier runs of their session
    # (``enqueue``, ``interrupt``) are queued with no executor, until one claims them.
    db.execute(
        "CREATE INDEX runs_session_queue ON runs (owner, session) "
        "WHERE executor_id IS NULL AND status = 'queued'"
    )


_TRAILING_USAGE = re.compile(r'"usage":(\{[^{}]*\})\}\s*$')


def _migration_7(db: Database) -> None:
    # Token budgets: a run's usage totals (its last usage event), summed per
    # owner over a sliding day by every server sharing the store.
    db["runs"].add_column("input_tokens", int, not_null_default=0)
    db["runs"].add_column("output_tokens", int, not_null_default=0)
    # Older runs' totals from their snapshots (in Python: UPDATE … FROM and
    # SQLite's JSON functions are missing from some SQLite builds still in use).
    updates = []
    for run_id, text in db.conn.execute("SELECT run_id, snapshot FROM snapshots WHERE parts = 1"):
        try:
            usage = json.loads(text).get("usage")
        except (ValueError, AttributeError):
            continue
        if isinstance(usage, dict):
            updates.append((*budgets.tokens(usage), run_id))
    # A snapshot in parts (a run of megabytes) ends with its usage: read the last part only.
    for run_id, tail in db.conn.execute(
        "SELECT p.run_id, p.data FROM snapshot_parts AS p JOIN snapshots AS s "
        "ON s.run_id = p.run_id AND p.part = s.parts - 1 WHERE s.parts > 1"
    ):
        found = _TRAILING_USAGE.search(tail)
        if found:
            try:
                updates.append((*budgets.tokens(json.loads(found.group(1))), run_id))
            except ValueError:
                continue
    db.conn.executemany(
        "UPDATE runs SET input_tokens = ?, output_tokens = ? WHERE run_id = ?", updates
    )


def _migration_8(db: Database) -> None:
    # An answer to a run's question sent to a server that does not execute
    # the run: the one that does takes it (see Engine.answer). First one wins.
    db["input_answers"].create(
        {
            "run_id": str,
            "request_id": str,
            "choice": str,
            "note": str,
            "by": str,
            "answered_ts": float,
        },
        pk=("run_id", "request_id"),
        not_null={"choice", "answered_ts"},
    )


def _migration_9(db: Database) -> None:
    # Resumable runs: which attempt executes the run (one more at each
    # takeover), and the value its agent saved for the next one.
    db["runs"].add_column("attempt", int, not_null_default=1)
    db["runs"].add_column("checkpoint", str)


def _migration_10(db: Database) -> None:
    # Whether the run's agent resumes after its server died (1) or not (0;
    # NULL: not recorded, older runs): a server that does not serve the run's
    # owner may end a run that would never be resumed, and leaves the others.
    db["runs"].add_column("resumable", int)


# Append only: a database written by a newer version is refused, an older one
# is brought forward one step at a time.
MIGRATIONS = [
    _migration_1, _migration_2, _migration_3, _migration_4, _migration_5, _migration_6,
    _migration_7, _migration_8, _migration_9, _migration_10,
]  # fmt: skip


# The most rows one INSERT of events holds (five parameters each; SQLite
# allows 32,766 parameters since 3.32, 999 before: see ``insert_rows``).
INSERT_ROWS = 4096


def insert_rows(conn: sqlite3.Connection) -> int:
    """The most rows an INSERT of events holds here: a power of two within the parameter limit."""
    if hasattr(conn, "getlimit"):  # Python 3.11
        parameters = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    else:
        parameters = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
    return min(INSERT_ROWS, 1 << ((parameters // 5).bit_length() - 1))


@functools.cache
def _set_last_seqs_sql(runs: int) -> str:
    values = ",".join(["(?, ?)"] * runs)
    return (
        f"WITH v (seq, run_id) AS (VALUES {values}) "
        "UPDATE runs SET last_seq = (SELECT v.seq FROM v WHERE v.run_id = runs.run_id) "
        "WHERE run_id IN (SELECT run_id FROM v)"
    )


@functools.cache
def _insert_events_sql(rows: int) -> str:
    values = ",".join(["(?, ?, ?, ?, ?)"] * rows)
    return f"INSERT INTO events (run_id, seq, type, ts, data) VALUES {values}"


class SQLiteStore(Store):
    """One SQLite file, created and migrated on first use."""

    local_reads = True

    schema_versions_known = len(MIGRATIONS)

    def __init__(self, path: str | Path, synchronous: str = "FULL", *, migrate: bool = True):
        """``migrate`` False: the file is neither created nor migrated until ``connect()``."""
        self.path = Path(path)
        self.synchronous = synchronous
        if migrate:
            self.connect().close()  # create and migrate it now: a problem shows at start-up

    def connect(self) -> SQLiteConnection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute("PRAGMA foreign_keys = OFF")
        db = Database(conn)
        migrate(db)
        return SQLiteConnection(db)

    def schema_version(self) -> int:
        if not self.path.exists():
            return 0
        # Read-only: neither a migration nor a journal mode change can happen on it.
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            return conn.execute("PRAGMA user_version").fetchone()[0]
        finally:
            conn.close()

    def describe(self) -> str:
        return f"SQLite {self.path}"


def migrate(db: Database) -> None:
    """Apply the migrations this database has not seen, in one transaction."""
    conn = db.conn
    if conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS):
        return
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


class SQLiteConnection(StoreConnection):
    def __init__(self, db: Database):
        self.db = db
        self.conn = db.conn
        self._savepoints = 0

    # Transactions ------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreBusy(str(exc)) from exc
        try:
            yield
            self.conn.execute("COMMIT")
        except BaseException as exc:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError):
                raise StoreBusy(str(exc)) from exc
            raise

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        self._savepoints += 1
        name = f"s{self._savepoints}"
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self.conn.execute(f"ROLLBACK TO {name}")
            self.conn.execute(f"RELEASE {name}")
            raise
        else:
            self.conn.execute(f"RELEASE {name}")
        finally:
            self._savepoints -= 1

    def close(self) -> None:
        self.conn.close()

    def change_token(self) -> int:
        return self.conn.execute("PRAGMA data_version").fetchone()[0]

    def serialize(self, scope: str) -> None:
        pass  # BEGIN IMMEDIATE: every write transaction on the file already runs alone

    def lock_run(self, run_id: str) -> None:
        pass  # the same

    # Reads -------------------------------------------------------------------

    def get_run(self, run_id: str, *, snapshot: bool = True) -> dict[str, Any] | None:
        select = RUN_SELECT if snapshot else RUN_SELECT.replace("snapshots.snapshot AS", "NULL AS")
        rows = list(self.db.query(f"{select} WHERE runs.run_id = ?", [run_id]))
        return self._decode(rows[0]) if rows else None

    def snapshot_layout(self, run_id: str) -> tuple[int, int] | None:
        row = self.conn.execute(
            "SELECT seq, parts FROM snapshots WHERE run_id = ?", [run_id]
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def snapshot_part(self, run_id: str, part: int, seq: int) -> str | None:
        if part == 0:
            row = self.conn.execute(
                "SELECT snapshot FROM snapshots WHERE run_id = ? AND seq = ?", [run_id, seq]
            ).fetchone()
        else:
            row = self.conn.execute(
                "SELECT p.data FROM snapshot_parts AS p JOIN snapshots AS s ON s.run_id = p.run_id "
                "WHERE p.run_id = ? AND p.part = ? AND s.seq = ?",
                [run_id, part, seq],
            ).fetchone()
        return None if row is None else row[0]

    def _later_parts(self, run_id: str) -> list[str]:
        rows = self.conn.execute(
            "SELECT data FROM snapshot_parts WHERE run_id = ? ORDER BY part", [run_id]
        ).fetchall()
        return [data for (data,) in rows]

    def get_run_head(self, run_id: str) -> dict[str, Any] | None:
        cursor = self.conn.execute(f"SELECT {HEAD_COLUMNS} FROM runs WHERE run_id = ?", [run_id])
        row = cursor.fetchone()
        if row is None:
            return None
        return dict(zip([c[0] for c in cursor.description], row, strict=True))

    def list_runs(
        self,
        owner: str,
        *,
        status: str | None,
        session: str | None,
        limit: int,
        before: tuple[str, str] | None,
        retry_of: str | None = None,
    ) -> list[dict[str, Any]]:
        where = ["owner = ?"]
        params: list[Any] = [owner]
        for column, value in (("status", status), ("session", session), ("retry_of", retry_of)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if before is not None:
            where.append("(created_at < ? OR (created_at = ? AND runs.run_id < ?))")
            params.extend([before[0], before[0], before[1]])
        params.append(limit)
        sql = (
            f"SELECT runs.* FROM runs WHERE {' AND '.join(where)} "
            "ORDER BY created_at DESC, runs.run_id DESC LIMIT ?"
        )
        return [self._decode(row) for row in self.db.query(sql, params)]

    def read_events(
        self,
        run_id: str,
        after: int,
        limit: int,
        upto: int | None = None,
        max_bytes: int | None = None,
    ) -> list[tuple[int, str, str, str]]:
        if upto is None:
            sql = "SELECT seq, type, ts, data FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
            params: list[Any] = [run_id, after, limit]
        else:
            sql = (
                "SELECT seq, type, ts, data FROM events WHERE run_id = ? AND seq > ? AND seq <= ? "
                "ORDER BY seq LIMIT ?"
            )
            params = [run_id, after, upto, limit]
        cursor = self.conn.execute(sql, params)
        if max_bytes is None:
            return cursor.fetchall()
        # Stepped through, not fetched at once: stop once the data read reaches max_bytes.
        rows, size = [], 0
        for row in cursor:
            rows.append(row)
            size += len(row[3])
            if size >= max_bytes:
                break
        cursor.close()
        return rows

    def get_tombstone(self, run_id: str) -> dict[str, Any] | None:
        rows = list(self.db.query("SELECT * FROM tombstones WHERE run_id = ?", [run_id]))
        return rows[0] if rows else None

    def compaction_candidates(
        self, finished_before: float, max_events: int, limit: int = 100
    ) -> list[str]:
        placeholders = ",".join("?" for _ in TERMINAL_STATUSES)
        rows = self.conn.execute(
            f"SELECT run_id FROM runs WHERE (status IN ({placeholders}) AND finished_ts < ? AND first_seq < last_seq) "
            "OR last_seq - first_seq + 1 > ? LIMIT ?",
            [*TERMINAL_STATUSES, finished_before, max_events, limit],
        ).fetchall()
        return [row[0] for row in rows]

    def snapshot_seq(self, run_id: str) -> int:
        row = self.conn.execute("SELECT seq FROM snapshots WHERE run_id = ?", [run_id]).fetchone()
        return row[0] if row else 0

    def expired_runs(self, finished_before: float, limit: int = 1000) -> list[tuple[str, str]]:
        placeholders = ",".join("?" for _ in TERMINAL_STATUSES)
        return self.conn.execute(
            f"SELECT run_id, owner FROM runs WHERE status IN ({placeholders}) AND finished_ts < ? LIMIT ?",
            [*TERMINAL_STATUSES, finished_before, limit],
        ).fetchall()

    def find_key(self, owner: str, key: str, not_before: float) -> dict[str, Any] | None:
        rows = list(
            self.db.query(
                "SELECT * FROM idempotency_keys WHERE owner = ? AND key = ? AND (created_ts >= ? OR with_run = 1)",
                [owner, key, not_before],
            )
        )
        return rows[0] if rows else None

    def count_active(self, owner: str) -> int:
        placeholders = ",".join("?" for _ in ACTIVE_STATUSES)
        return self.conn.execute(
            f"SELECT count(*) FROM runs WHERE owner = ? AND status IN ({placeholders})",
            [owner, *ACTIVE_STATUSES],
        ).fetchone()[0]

    def count_runs(self, owner: str) -> int:
        return self.conn.execute("SELECT count(*) FROM runs WHERE owner = ?", [owner]).fetchone()[0]

    def count_runs_by_status(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT status, count(*) FROM runs GROUP BY status"))

    def diagnostics(self) -> dict[str, Any]:
        return {
            "schema_version": self.conn.execute("PRAGMA user_version").fetchone()[0],
            "schema_versions_known": len(MIGRATIONS),
            "runs_by_status": self.count_runs_by_status(),
            "versions": {"sqlite": sqlite3.sqlite_version},
        }

    def expired_active_runs(self, now: float) -> list[dict[str, Any]]:
        placeholders = ",".join("?" for _ in ACTIVE_STATUSES)
        rows = self.db.query(
            f"{RUN_SELECT} WHERE status IN ({placeholders}) AND (lease_expires IS NULL OR lease_expires < ?) "
            f"AND NOT ({UNCLAIMED})",
            [*ACTIVE_STATUSES, now],
        )
        return [self._decode(row) for row in rows]

    def active_in_session(self, owner: str, session: str) -> list[dict[str, Any]]:
        placeholders = ",".join("?" for _ in ACTIVE_STATUSES)
        rows = self.conn.execute(
            f"SELECT run_id, status, executor_id, cancel_request FROM runs "
            f"WHERE owner = ? AND session = ? AND status IN ({placeholders}) ORDER BY rowid",
            [owner, session, *ACTIVE_STATUSES],
        ).fetchall()
        return [
            {
                "run_id": run_id,
                "status": status,
                "executor_id": executor_id,
                "cancel_request": json.loads(request) if request else None,
            }
            for run_id, status, executor_id, request in rows
        ]

    def queued_behind(self, run_id: str) -> str | None:
        placeholders = ",".join("?" for _ in ACTIVE_STATUSES)
        row = self.conn.execute(
            f"""
            SELECT earlier.run_id FROM runs AS queued JOIN runs AS earlier
              ON earlier.owner = queued.owner AND earlier.session = queued.session
             AND earlier.rowid < queued.rowid AND earlier.status IN ({placeholders})
            WHERE queued.run_id = ? AND queued.status = 'queued' AND queued.executor_id IS NULL
            ORDER BY earlier.rowid LIMIT 1
            """,
            [*ACTIVE_STATUSES, run_id],
        ).fetchone()
        return row[0] if row else None

    def startable_queued_runs(
        self, owners: list[str] | None, agents: list[str], limit: int = 100
    ) -> list[dict[str, Any]]:
        placeholders = ",".join("?" for _ in ACTIVE_STATUSES)
        served = "" if owners is None else f"AND queued.owner IN ({','.join('?' for _ in owners)})"
        rows = self.db.query(
            f"""
            {RUN_SELECT} WHERE runs.run_id IN (
                SELECT queued.run_id FROM runs AS queued
                WHERE queued.executor_id IS NULL AND queued.status = 'queued'
                  AND queued.agent IN ({",".join("?" for _ in agents)}) {served}
                  AND NOT EXISTS (
                    SELECT 1 FROM runs AS earlier
                    WHERE earlier.owner = queued.owner AND earlier.session = queued.session
                      AND earlier.rowid < queued.rowid AND earlier.status IN ({placeholders})
                  )
                ORDER BY queued.rowid LIMIT ?
            )
            ORDER BY runs.rowid
            """,
            [*agents, *(owners or []), *ACTIVE_STATUSES, limit],
        )
        return [self._decode(row) for row in rows]

    def _decode(self, row: dict[str, Any]) -> dict[str, Any]:
        return decode_run(row, self._later_parts)

    # Writes (inside transaction()) ---------------------------------------------

    def insert_run(self, run: dict[str, Any]) -> None:
        self.db["runs"].insert(encode_columns(run))

    def insert_key(
        self,
        owner: str,
        key: str,
        fingerprint: str,
        run_id: str,
        now: float,
        with_run: bool = False,
    ) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO idempotency_keys (owner, key, fingerprint, run_id, created_ts, with_run) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [owner, key, fingerprint, run_id, now, int(with_run)],
        )

    def update_run(self, run_id: str, fields: dict[str, Any]) -> None:
        columns = encode_columns(fields)
        snapshot, seq = columns.pop("snapshot", None), columns.pop("snapshot_seq", None)
        if snapshot is not None:
            self.write_snapshot(run_id, seq, snapshot)
        if columns:
            # Raw SQL: ``Table.update`` reads the row first, and this is on the append path.
            assignments = ", ".join(f"{name} = ?" for name in columns)
            self.conn.execute(
                f"UPDATE runs SET {assignments} WHERE run_id = ?", [*columns.values(), run_id]
            )

    def write_snapshot(
        self, run_id: str, seq: int, snapshot: dict[str, Any] | reducer.Snapshot
    ) -> None:
        builder = (
            snapshot if isinstance(snapshot, reducer.Snapshot) else reducer.Snapshot.wrap(snapshot)
        )
        self.conn.execute("DELETE FROM snapshot_parts WHERE run_id = ?", [run_id])
        first, count = "", 0
        for data in split_parts(builder.json_chunks(), SNAPSHOT_PART_CHARS):
            if count == 0:
                first = data  # kept for the snapshots row; the others are written as they fill
            else:
                self.conn.execute(
                    "INSERT INTO snapshot_parts (run_id, part, data) VALUES (?, ?, ?)",
                    [run_id, count, data],
                )
            count += 1
        self.conn.execute(
            "INSERT OR REPLACE INTO snapshots (run_id, seq, snapshot, parts) VALUES (?, ?, ?, ?)",
            [run_id, seq, first, count],
        )

    def append_events(self, rows: Iterable[tuple[str, int, str, str, str]]) -> None:
        # As few statements as can be, not ``executemany``: Python's sqlite3
        # lets go of the GIL around every statement it steps, and a thread
        # that lets go waits up to the interpreter's switch interval (5 ms)
        # to get it back from a busy event loop. One row per step paid that
        # at every event; a statement of thousands of rows pays it once and
        # inserts them all in SQLite's own code while the loop goes on.
        # Statements hold a power of two of rows (a dozen texts, all cached).
        rows = rows if isinstance(rows, list) else list(rows)
        try:
            self._in_statements(_insert_events_sql, rows, insert_rows(self.conn))
        except sqlite3.IntegrityError as exc:
            raise SeqTaken(str(exc)) from exc

    def set_last_seqs(self, pairs: list[tuple[int, str]]) -> None:
        # A statement for up to 256 runs, not one each (see append_events).
        # Each row looks its seq up in the VALUES: 256 keeps that look short.
        # Its rows are padded with copies of the last pair (a run set to the
        # same seq twice) to a power of two: one statement, not one per bit.
        most = min(256, insert_rows(self.conn))
        for start in range(0, len(pairs), most):
            chunk = pairs[start : start + most]
            rows = 1 << (len(chunk) - 1).bit_length()
            chunk.extend([chunk[-1]] * (rows - len(chunk)))
            self.conn.execute(_set_last_seqs_sql(rows), list(itertools.chain.from_iterable(chunk)))

    def _in_statements(self, sql: Callable[[int], str], rows: list[tuple], most: int) -> None:
        """``rows`` in statements of ``sql(count)`` rows: powers of two, at most ``most``."""
        start, left = 0, len(rows)
        while left:
            count = min(most, 1 << (left.bit_length() - 1))
            self.conn.execute(
                sql(count), list(itertools.chain.from_iterable(rows[start : start + count]))
            )
            start += count
            left -= count

    def delete_events_before(self, run_id: str, seq: int, limit: int) -> int:
        return self.conn.execute(
            "DELETE FROM events WHERE run_id = ? AND seq IN "
            "(SELECT seq FROM events WHERE run_id = ? AND seq < ? ORDER BY seq LIMIT ?)",
            [run_id, run_id, seq, limit],
        ).rowcount

    def bury(self, run_id: str, owner: str, now: float) -> bool:
        deleted = self.delete_run(run_id)
        self.conn.execute(
            "INSERT OR REPLACE INTO tombstones (run_id, owner, deleted_ts) VALUES (?, ?, ?)",
            [run_id, owner, now],
        )
        return deleted

    def delete_run(self, run_id: str) -> bool:
        tables = (
            "events",
            "idempotency_keys",
            "snapshots",
            "snapshot_parts",
            "input_answers",
            "runs",
        )
        for table in tables:
            deleted = self.conn.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id]).rowcount
        return deleted > 0

    def renew_leases(self, executor_id: str, run_ids: list[str], expires: float) -> None:
        self.conn.executemany(
            "UPDATE runs SET lease_expires = ? WHERE run_id = ? AND executor_id = ?",
            [(expires, run_id, executor_id) for run_id in run_ids],
        )

    def usage_since(self, owner: str, since: str) -> list[tuple[str, str, int, int]]:
        rows = self.conn.execute(
            "SELECT run_id, created_at, input_tokens, output_tokens FROM runs "
            "WHERE owner = ? AND created_at >= ? ORDER BY created_at, run_id",
            [owner, since],
        ).fetchall()
        return [tuple(row) for row in rows]

    def release_claims(self, run_ids: list[str], executor_id: str) -> None:
        self.conn.executemany(
            "UPDATE runs SET executor_id = NULL, lease_expires = NULL "
            "WHERE run_id = ? AND executor_id = ? AND status = 'queued' AND last_seq = 0",
            [(run_id, executor_id) for run_id in run_ids],
        )

    def record_input_answer(
        self, run_id: str, request_id: str, answer: dict[str, Any], now: float
    ) -> dict[str, Any]:
        self.conn.execute(
            "INSERT OR IGNORE INTO input_answers (run_id, request_id, choice, note, by, answered_ts) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [run_id, request_id, answer["choice"], answer.get("note"), answer.get("by"), now],
        )
        choice, note, by = self.conn.execute(
            "SELECT choice, note, by FROM input_answers WHERE run_id = ? AND request_id = ?",
            [run_id, request_id],
        ).fetchone()
        return {"choice": choice, "note": note, "by": by}

    def take_input_answers(self, executor_id: str) -> list[tuple[str, str, dict[str, Any]]]:
        rows = self.conn.execute(
            "SELECT a.run_id, a.request_id, a.choice, a.note, a.by FROM input_answers AS a "
            "JOIN runs ON runs.run_id = a.run_id WHERE runs.executor_id = ? ORDER BY a.answered_ts",
            [executor_id],
        ).fetchall()
        self.conn.executemany(
            "DELETE FROM input_answers WHERE run_id = ? AND request_id = ?",
            [(run_id, request_id) for run_id, request_id, *_ in rows],
        )
        return [
            (run_id, request_id, {"choice": choice, "note": note, "by": by})
            for run_id, request_id, choice, note, by in rows
        ]

    def release_run(self, run_id: str, executor_id: str) -> None:
        self.conn.execute(
            "UPDATE runs SET executor_id = NULL, lease_expires = NULL "
            "WHERE run_id = ? AND executor_id = ?",
            [run_id, executor_id],
        )

    def claim_run(self, run_id: str, executor_id: str, lease_expires: float) -> bool:
        cursor = self.conn.execute(
            f"UPDATE runs SET executor_id = ?, lease_expires = ? WHERE run_id = ? AND {UNCLAIMED}",
            [executor_id, lease_expires, run_id],
        )
        return cursor.rowcount == 1

    def record_cancel_request(self, run_id: str, request: dict[str, Any]) -> None:
        placeholders = ",".join("?" for _ in CANCELLABLE)
        self.conn.execute(
            f"UPDATE runs SET cancel_request = ? WHERE run_id = ? AND status IN ({placeholders})",
            [jsonio.dumps(request), run_id, *CANCELLABLE],
        )

    def take_cancel_requests(self, executor_id: str) -> list[tuple[str, dict[str, Any]]]:
        rows = self.conn.execute(
            "SELECT run_id, cancel_request FROM runs WHERE executor_id = ? AND cancel_request IS NOT NULL",
            [executor_id],
        ).fetchall()
        self.conn.executemany(
            "UPDATE runs SET cancel_request = NULL WHERE run_id = ?", [(r[0],) for r in rows]
        )
        return [(run_id, json.loads(request)) for run_id, request in rows]

    def purge_keys(self, older_than: float) -> None:
        self.conn.execute(
            "DELETE FROM idempotency_keys WHERE created_ts < ? AND with_run = 0", [older_than]
        )
