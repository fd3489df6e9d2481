"""The store on one SQLite file: the embedded default.

Tables: ``runs`` (one row per run, its authoritative state), ``events`` (the
per-run log, keyed by ``(run_id, seq)``), ``snapshots`` and ``snapshot_parts``
(a run's events folded up to a seq), ``idempotency_keys``, ``tombstones`` and
``input_answers``. WAL lets readers on their own connections go on while the
writer commits; several servers on one machine may share the file. WAL needs
a local disk.

The queries are ``sql.py``'s. SQLite's own: its first eight migrations
(through sqlite-utils), write transactions one at a time on the file (``BEGIN
IMMEDIATE``: no other lock is needed), a batch of events in a few multi-row
INSERTs, runs in ``rowid`` order, and the file's change counter as the change
token.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import sqlite3
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from .. import budgets, jsonio
from ..domain import EventRow
from . import SeqTaken, Store, StoreBusy
from .sql import SHARED_MIGRATIONS, SQLConnection

# How long a connection waits for another process's write lock before the
# writer backs off and retries (it never gives up on a batch).
BUSY_TIMEOUT_MS = 10000


def _migration_1(db: Database) -> None:
    db.table("runs").create(
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
    db.table("runs").create_index(["owner", "status"])
    db.table("runs").create_index(["status", "lease_expires"])
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
    db.table("idempotency_keys").create(
        {"owner": str, "key": str, "fingerprint": str, "run_id": str, "created_ts": float},
        pk=("owner", "key"),
        not_null={"fingerprint", "run_id", "created_ts"},
    )
    db.table("idempotency_keys").create_index(["created_ts"])


def _migration_2(db: Database) -> None:
    # A cancel asked of a server that does not execute the run: the one that
    # does picks it up (see Engine.cancel).
    db.table("runs").add_column("cancel_request", str)
    db.execute(
        "CREATE INDEX runs_cancel_requests ON runs (executor_id) WHERE cancel_request IS NOT NULL"
    )


def _migration_3(db: Database) -> None:
    # What is left of a run that retention deleted: GET answers 410, not 404.
    db.table("tombstones").create({"run_id": str, "owner": str, "deleted_ts": float}, pk="run_id")
    db.table("runs").create_index(["status", "finished_ts"])


def _migration_4(db: Database) -> None:
    # A snapshot can hold 100 MB of text. In the runs row, every last_seq
    # update rewrote it and every read of a later column walked through it.
    db.table("snapshots").create(
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
    db.table("idempotency_keys").add_column("with_run", int, not_null_default=0)
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
    db.table("snapshots").add_column("parts", int, not_null_default=1)
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
    db.table("runs").add_column("input_tokens", int, not_null_default=0)
    db.table("runs").add_column("output_tokens", int, not_null_default=0)
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
    db.table("input_answers").create(
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


def _shared(statements: tuple[str, ...]) -> Callable[[Database], None]:
    """A step of ``SHARED_MIGRATIONS`` as SQLite takes it."""

    def migration(db: Database) -> None:
        for statement in statements:
            db.execute(statement.format(text="TEXT"))

    return migration


# Append only, through SHARED_MIGRATIONS (see the package's docstring): a
# database written by a newer version is refused, an older one is brought
# forward one step at a time.
MIGRATIONS = [
    _migration_1, _migration_2, _migration_3, _migration_4, _migration_5, _migration_6,
    _migration_7, _migration_8, *(_shared(step) for step in SHARED_MIGRATIONS),
]  # fmt: skip


# The most rows one INSERT of events holds (five parameters each; SQLite
# allows 32,766 parameters since 3.32, 999 before: see ``insert_rows``).
INSERT_ROWS = 4096


def insert_rows(conn: sqlite3.Connection) -> int:
    """The most rows an INSERT of events holds here: a power of two within the parameter limit."""
    if sys.version_info >= (3, 11):  # conn.getlimit
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

    def migrate(self) -> None:
        self.connect().close()

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


class SQLiteConnection(SQLConnection):
    """A connection to the file; its write transactions run one at a time (``BEGIN IMMEDIATE``)."""

    SUBMIT_ORDER = "rowid"
    LOCK_ROWS = ""  # the file's write lock: nothing changes beneath a write transaction
    SKIP_LOCKED = ""
    MOST_LISTED = 500  # within even an old SQLite's 999 parameters
    schema_versions_known = len(MIGRATIONS)

    def __init__(self, db: Database):
        super().__init__()
        self.db = db
        self.conn = db.conn

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def _dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cursor = self.conn.execute(sql, params)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]

    def _in(self, values: Sequence[Any]) -> tuple[str, list[Any]]:
        return f"IN ({', '.join('?' for _ in values)})", list(values)

    def _read_within(self, sql: str, params: list[Any], max_bytes: int) -> list[tuple]:
        # Stepped through, not fetched at once: stop once the data read reaches max_bytes.
        cursor = self.conn.execute(sql, params)
        rows, size = [], 0
        for row in cursor:
            rows.append(row)
            size += len(row[3])
            if size >= max_bytes:
                break
        cursor.close()
        return rows

    def _schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    def _versions(self) -> dict[str, str]:
        return {"sqlite": sqlite3.sqlite_version}

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
    def read_transaction(self) -> Iterator[None]:
        # In WAL mode a transaction reads the state of its first read until it ends.
        self.conn.execute("BEGIN")
        try:
            yield
        finally:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")  # it wrote nothing

    def close(self) -> None:
        self.conn.close()

    def change_token(self) -> int:
        return self.conn.execute("PRAGMA data_version").fetchone()[0]

    def serialize(self, scope: str) -> None:
        pass  # BEGIN IMMEDIATE: every write transaction on the file already runs alone

    def lock_run(self, run_id: str) -> None:
        pass  # the same

    # The append path -----------------------------------------------------------

    def append_events(self, rows: Iterable[EventRow]) -> None:
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
        self._queue_deliveries(rows)

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
