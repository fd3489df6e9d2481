"""What the two SQL stores share: the schema's tables, its changes from now on, and every query.

``SQLConnection`` is the store interface in SQL that SQLite (3.35 or later:
``RETURNING``, ``ON CONFLICT``, row values) and PostgreSQL both take, each
query written once with ``?`` placeholders. ``sqlite.py`` and ``postgres.py``
subclass it and say how their database differs: how a statement runs, how a
list of values is bound, the column of submit order, row locks, and what is
theirs alone (transactions, the append path, locks, change tokens,
notifications).
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from .. import jsonio, reducer
from ..domain import (
    ActiveRun,
    CancelRequest,
    InputAnswer,
    KeyRow,
    ListedRun,
    RunFields,
    RunHead,
    RunRow,
    StoredEvent,
    Tombstone,
)
from ..lifecycle import ACTIVE_STATUSES, CANCELLABLE, TERMINAL_STATUSES
from . import StoreConnection

# Every table of the store, with its key: the columns its rows are read in order of.
TABLES = {
    "runs": "run_id",
    "events": "run_id, seq",
    "snapshots": "run_id",
    "snapshot_parts": "run_id, part",
    "idempotency_keys": "owner, key",
    "tombstones": "run_id",
    "input_answers": "run_id, request_id",
}

# Schema changes since the two stores' histories met (SQLite's 8th migration,
# PostgreSQL's 1st), written once for both and appended to each history: a
# step is statements both databases take, ``{text}`` standing for the type of
# a text column (PostgreSQL's compare byte for byte, as SQLite's do).
SHARED_MIGRATIONS: list[tuple[str, ...]] = [
    # Resumable runs: which attempt executes the run (one more at each
    # takeover), and the value its agent saved for the next one.
    (
        "ALTER TABLE runs ADD COLUMN attempt integer NOT NULL DEFAULT 1",
        "ALTER TABLE runs ADD COLUMN checkpoint {text}",
    ),
    # Whether the run's agent resumes after its server died (1) or not (0;
    # NULL: not recorded, older runs): a server that does not serve the run's
    # owner may end a run that would never be resumed, and leaves the others.
    ("ALTER TABLE runs ADD COLUMN resumable integer",),
]

# A snapshot's JSON is stored in parts of at least this many characters (the last one shorter).
SNAPSHOT_PART_CHARS = 1 << 20

# ``runs`` columns holding JSON text (the snapshot has tables of its own).
JSON_COLUMNS = (
    "metadata", "input", "output", "error", "cancel", "cancel_request", "checkpoint",
)  # fmt: skip
# A run with its persisted snapshot (``snapshot_seq`` 0 and no snapshot when none).
RUN_SELECT = (
    "SELECT runs.*, coalesce(snapshots.seq, 0) AS snapshot_seq, snapshots.snapshot AS snapshot, "
    "snapshots.parts AS snapshot_parts FROM runs LEFT JOIN snapshots ON snapshots.run_id = runs.run_id"
)
RUN_SELECT_WITHOUT_SNAPSHOT = RUN_SELECT.replace("snapshots.snapshot AS", "NULL AS")
# A run queued behind earlier runs of its session: no server executes it yet.
UNCLAIMED = "executor_id IS NULL AND status = 'queued'"
# What answering for a run needs, without the (possibly huge) snapshot and output.
HEAD_COLUMNS = "run_id, owner, status, last_seq, first_seq, finished_ts"


def _literals(values: Iterable[str]) -> str:
    """A list of the package's own constants as SQL: ``('a', 'b')``."""
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"


ACTIVE = _literals(ACTIVE_STATUSES)
TERMINAL = _literals(TERMINAL_STATUSES)
CANCELLABLE_STATUSES = _literals(CANCELLABLE)


class SQLConnection(StoreConnection):
    """The store interface on a SQL database; a subclass runs the statements and says what differs."""

    # The column runs are numbered by as they are submitted (a session's queue is in its order).
    SUBMIT_ORDER: str
    # Added to a read of rows the transaction then changes: others' changes wait until it ends.
    LOCK_ROWS: str
    # Added to the lease sweep's read: the rows it takes are locked, rows
    # another server is ending are left to it.
    SKIP_LOCKED: str
    # The most values bound in one ``_in`` (None: any number).
    MOST_LISTED: int | None
    # The schema version this package's migrations bring the database to.
    schema_versions_known: int

    def __init__(self) -> None:
        self._savepoints = 0

    # How the database runs a statement -----------------------------------------

    @abc.abstractmethod
    def _execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run a statement written with ``?`` placeholders; returns its DB-API cursor."""

    @abc.abstractmethod
    def _dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """A query's rows as dicts of column name to value."""

    @abc.abstractmethod
    def _in(self, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """What follows a column to match any of ``values`` (at most ``MOST_LISTED``), and its parameters."""

    @abc.abstractmethod
    def _read_within(self, sql: str, params: list[Any], max_bytes: int) -> list[tuple]:
        """The rows of a query of events, up to the one whose data reaches ``max_bytes``."""

    @abc.abstractmethod
    def _schema_version(self) -> int:
        """The schema version the database holds."""

    @abc.abstractmethod
    def _versions(self) -> dict[str, str]:
        """The versions of the database and its driver, for doctor."""

    def _connected(self) -> bool:
        """Whether the connection is still there to roll a savepoint back on (a file's always is)."""
        return True

    def _chunks(self, values: list[Any]) -> Iterator[list[Any]]:
        most = self.MOST_LISTED or max(len(values), 1)
        for start in range(0, len(values), most):
            yield values[start : start + most]

    # Transactions ------------------------------------------------------------

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        self._savepoints += 1
        name = f"s{self._savepoints}"
        self._execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            if self._connected():
                self._execute(f"ROLLBACK TO SAVEPOINT {name}")
                self._execute(f"RELEASE SAVEPOINT {name}")
            raise
        else:
            self._execute(f"RELEASE SAVEPOINT {name}")
        finally:
            self._savepoints -= 1

    # Reads -------------------------------------------------------------------

    def get_run(self, run_id: str, *, snapshot: bool = True) -> RunRow | None:
        select = RUN_SELECT if snapshot else RUN_SELECT_WITHOUT_SNAPSHOT
        rows = self._dicts(f"{select} WHERE runs.run_id = ?", [run_id])
        return cast(RunRow, self._decode(rows[0])) if rows else None

    def snapshot_layout(self, run_id: str) -> tuple[int, int] | None:
        row = self._execute(
            "SELECT seq, parts FROM snapshots WHERE run_id = ?", [run_id]
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def snapshot_part(self, run_id: str, part: int, seq: int) -> str | None:
        if part == 0:
            row = self._execute(
                "SELECT snapshot FROM snapshots WHERE run_id = ? AND seq = ?", [run_id, seq]
            ).fetchone()
        else:
            row = self._execute(
                "SELECT p.data FROM snapshot_parts AS p JOIN snapshots AS s ON s.run_id = p.run_id "
                "WHERE p.run_id = ? AND p.part = ? AND s.seq = ?",
                [run_id, part, seq],
            ).fetchone()
        return None if row is None else row[0]

    def _later_parts(self, run_id: str) -> list[str]:
        rows = self._execute(
            "SELECT data FROM snapshot_parts WHERE run_id = ? ORDER BY part", [run_id]
        ).fetchall()
        return [data for (data,) in rows]

    def get_run_head(self, run_id: str) -> RunHead | None:
        rows = self._dicts(f"SELECT {HEAD_COLUMNS} FROM runs WHERE run_id = ?", [run_id])
        return cast(RunHead, rows[0]) if rows else None

    def list_runs(
        self,
        owner: str,
        *,
        status: str | None,
        session: str | tuple[str, ...] | None,
        limit: int,
        before: tuple[str, str] | None,
        retry_of: str | None = None,
        search: str | None = None,
    ) -> list[ListedRun]:
        where = ["owner = ?"]
        params: list[Any] = [owner]
        sessions = (session,) if isinstance(session, str) else session
        for column, values in (
            ("status", (status,)),
            ("session", sessions),
            ("retry_of", (retry_of,)),
        ):
            values = tuple(value for value in values or () if value is not None)
            if values:
                where.append(f"{column} IN ({', '.join('?' for _ in values)})")
                params.extend(values)
        if before is not None:
            where.append("(created_at, run_id) < (?, ?)")
            params.extend(before)
        if search and search.isascii():
            # lower() folds ASCII letters alike in both databases (other
            # letters differ): a search with others is matched by the caller.
            escaped = search.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where.append(
                "lower(agent || ' ' || coalesce(session, '') || ' ' || coalesce(metadata, '') "
                "|| ' ' || coalesce(input, '')) LIKE ? ESCAPE '\\'"
            )
            params.append(f"%{escaped}%")
        params.append(limit)
        rows = self._dicts(
            f"SELECT * FROM runs WHERE {' AND '.join(where)} "
            "ORDER BY created_at DESC, run_id DESC LIMIT ?",
            params,
        )
        return [cast(ListedRun, self._decode(row)) for row in rows]

    def read_events(
        self,
        run_id: str,
        after: int,
        limit: int,
        upto: int | None = None,
        max_bytes: int | None = None,
    ) -> list[StoredEvent]:
        if upto is None:
            sql = "SELECT seq, type, ts, data FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
            params: list[Any] = [run_id, after, limit]
        else:
            sql = (
                "SELECT seq, type, ts, data FROM events WHERE run_id = ? AND seq > ? AND seq <= ? "
                "ORDER BY seq LIMIT ?"
            )
            params = [run_id, after, upto, limit]
        if max_bytes is None:
            return self._execute(sql, params).fetchall()
        return self._read_within(sql, params, max_bytes)

    def get_tombstone(self, run_id: str) -> Tombstone | None:
        rows = self._dicts("SELECT * FROM tombstones WHERE run_id = ?", [run_id])
        return cast(Tombstone, rows[0]) if rows else None

    def compaction_candidates(
        self, finished_before: float, max_events: int, limit: int = 100
    ) -> list[str]:
        rows = self._execute(
            f"SELECT run_id FROM runs WHERE (status IN {TERMINAL} AND finished_ts < ? "
            "AND first_seq < last_seq) OR last_seq - first_seq + 1 > ? LIMIT ?",
            [finished_before, max_events, limit],
        ).fetchall()
        return [row[0] for row in rows]

    def snapshot_seq(self, run_id: str) -> int:
        row = self._execute("SELECT seq FROM snapshots WHERE run_id = ?", [run_id]).fetchone()
        return row[0] if row else 0

    def expired_runs(self, finished_before: float, limit: int = 1000) -> list[tuple[str, str]]:
        rows = self._execute(
            f"SELECT run_id, owner FROM runs WHERE status IN {TERMINAL} AND finished_ts < ? LIMIT ?",
            [finished_before, limit],
        ).fetchall()
        return [tuple(row) for row in rows]

    def find_key(self, owner: str, key: str, not_before: float) -> KeyRow | None:
        rows = self._dicts(
            "SELECT * FROM idempotency_keys WHERE owner = ? AND key = ? "
            "AND (created_ts >= ? OR with_run = 1)",
            [owner, key, not_before],
        )
        return cast(KeyRow, rows[0]) if rows else None

    def count_active(self, owner: str) -> int:
        return self._execute(
            f"SELECT count(*) FROM runs WHERE owner = ? AND status IN {ACTIVE}", [owner]
        ).fetchone()[0]

    def count_runs(self, owner: str) -> int:
        return self._execute("SELECT count(*) FROM runs WHERE owner = ?", [owner]).fetchone()[0]

    def count_runs_by_status(self, owners: list[str] | None = None) -> dict[str, int]:
        if owners is None:
            return dict(
                self._execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall()
            )
        owners_in, params = self._in(owners)
        return dict(
            self._execute(
                f"SELECT status, count(*) FROM runs WHERE owner {owners_in} GROUP BY status", params
            ).fetchall()
        )

    def diagnostics(self) -> dict[str, Any]:
        return {
            "schema_version": self._schema_version(),
            "schema_versions_known": self.schema_versions_known,
            "runs_by_status": self.count_runs_by_status(),
            "versions": self._versions(),
        }

    def expired_active_runs(self, now: float) -> list[RunRow]:
        rows = self._dicts(
            f"{RUN_SELECT} WHERE status IN {ACTIVE} AND (lease_expires IS NULL OR lease_expires < ?) "
            f"AND NOT ({UNCLAIMED}){self.SKIP_LOCKED}",
            [now],
        )
        return [cast(RunRow, self._decode(row)) for row in rows]

    def active_in_session(self, owner: str, session: str) -> list[ActiveRun]:
        rows = self._execute(
            "SELECT run_id, status, executor_id, cancel_request FROM runs "
            f"WHERE owner = ? AND session = ? AND status IN {ACTIVE} ORDER BY {self.SUBMIT_ORDER}",
            [owner, session],
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
        order = self.SUBMIT_ORDER
        row = self._execute(
            f"""
            SELECT earlier.run_id FROM runs AS queued JOIN runs AS earlier
              ON earlier.owner = queued.owner AND earlier.session = queued.session
             AND earlier.{order} < queued.{order} AND earlier.status IN {ACTIVE}
            WHERE queued.run_id = ? AND queued.status = 'queued' AND queued.executor_id IS NULL
            ORDER BY earlier.{order} LIMIT 1
            """,
            [run_id],
        ).fetchone()
        return row[0] if row else None

    def startable_queued_runs(
        self, owners: list[str] | None, agents: list[str], limit: int = 100
    ) -> list[RunRow]:
        order = self.SUBMIT_ORDER
        agents_in, params = self._in(agents)
        served = ""
        if owners is not None:
            owners_in, owner_params = self._in(owners)
            served = f"AND queued.owner {owners_in}"
            params += owner_params
        rows = self._dicts(
            f"""
            {RUN_SELECT} WHERE runs.run_id IN (
                SELECT queued.run_id FROM runs AS queued
                WHERE queued.executor_id IS NULL AND queued.status = 'queued'
                  AND queued.agent {agents_in} {served}
                  AND NOT EXISTS (
                    SELECT 1 FROM runs AS earlier
                    WHERE earlier.owner = queued.owner AND earlier.session = queued.session
                      AND earlier.{order} < queued.{order} AND earlier.status IN {ACTIVE}
                  )
                ORDER BY queued.{order} LIMIT ?
            )
            ORDER BY runs.{order}
            """,
            [*params, limit],
        )
        return [cast(RunRow, self._decode(row)) for row in rows]

    def usage_since(self, owner: str, since: str) -> list[tuple[str, str, int, int]]:
        rows = self._execute(
            "SELECT run_id, created_at, input_tokens, output_tokens FROM runs "
            "WHERE owner = ? AND created_at >= ? ORDER BY created_at, run_id",
            [owner, since],
        ).fetchall()
        return [tuple(row) for row in rows]

    def _decode(self, row: dict[str, Any]) -> dict[str, Any]:
        row.pop("position", None)
        return decode_run(row, self._later_parts)

    # Writes (inside transaction()) ---------------------------------------------

    def insert_run(self, run: RunFields) -> None:
        columns = encode_columns(run)
        names = ", ".join(columns)
        values = ", ".join("?" for _ in columns)
        self._execute(f"INSERT INTO runs ({names}) VALUES ({values})", list(columns.values()))

    def insert_key(
        self,
        owner: str,
        key: str,
        fingerprint: str,
        run_id: str,
        now: float,
        with_run: bool = False,
    ) -> None:
        self._execute(
            "INSERT INTO idempotency_keys (owner, key, fingerprint, run_id, created_ts, with_run) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner, key) DO UPDATE SET "
            "fingerprint = excluded.fingerprint, run_id = excluded.run_id, "
            "created_ts = excluded.created_ts, with_run = excluded.with_run",
            [owner, key, fingerprint, run_id, now, int(with_run)],
        )

    def update_run(self, run_id: str, fields: RunFields) -> None:
        columns = encode_columns(fields)
        snapshot, seq = columns.pop("snapshot", None), columns.pop("snapshot_seq", None)
        if snapshot is not None:
            self.write_snapshot(run_id, seq, snapshot)
        if columns:
            assignments = ", ".join(f"{name} = ?" for name in columns)
            self._execute(
                f"UPDATE runs SET {assignments} WHERE run_id = ?", [*columns.values(), run_id]
            )

    def write_snapshot(
        self, run_id: str, seq: int, snapshot: dict[str, Any] | reducer.Snapshot
    ) -> None:
        """Store the run's snapshot at ``seq``, streamed from a builder so a long text is never joined."""
        builder = (
            snapshot if isinstance(snapshot, reducer.Snapshot) else reducer.Snapshot.wrap(snapshot)
        )
        self._execute("DELETE FROM snapshot_parts WHERE run_id = ?", [run_id])
        first, count = "", 0
        for data in split_parts(builder.json_chunks(), SNAPSHOT_PART_CHARS):
            if count == 0:
                first = data  # kept for the snapshots row; the others are written as they fill
            else:
                self._execute(
                    "INSERT INTO snapshot_parts (run_id, part, data) VALUES (?, ?, ?)",
                    [run_id, count, data],
                )
            count += 1
        self._execute(
            "INSERT INTO snapshots (run_id, seq, snapshot, parts) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, "
            "snapshot = excluded.snapshot, parts = excluded.parts",
            [run_id, seq, first, count],
        )

    def delete_events_before(self, run_id: str, seq: int, limit: int) -> int:
        return self._execute(
            "DELETE FROM events WHERE run_id = ? AND seq IN "
            "(SELECT seq FROM events WHERE run_id = ? AND seq < ? ORDER BY seq LIMIT ?)",
            [run_id, run_id, seq, limit],
        ).rowcount

    def bury(self, run_id: str, owner: str, now: float) -> bool:
        deleted = self.delete_run(run_id)
        self._execute(
            "INSERT INTO tombstones (run_id, owner, deleted_ts) VALUES (?, ?, ?) "
            "ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, deleted_ts = excluded.deleted_ts",
            [run_id, owner, now],
        )
        return deleted

    def delete_run(self, run_id: str) -> bool:
        # The runs row last: whether it was there says whether the run was.
        for table in ("events", "idempotency_keys", "snapshots", "snapshot_parts", "input_answers"):
            self._execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        return self._execute("DELETE FROM runs WHERE run_id = ?", [run_id]).rowcount > 0

    def renew_leases(self, executor_id: str, run_ids: list[str], expires: float) -> None:
        for chunk in self._chunks(run_ids):
            listed, params = self._in(chunk)
            self._execute(
                f"UPDATE runs SET lease_expires = ? WHERE executor_id = ? AND run_id {listed}",
                [expires, executor_id, *params],
            )

    def release_claims(self, run_ids: list[str], executor_id: str) -> None:
        for chunk in self._chunks(run_ids):
            listed, params = self._in(chunk)
            self._execute(
                "UPDATE runs SET executor_id = NULL, lease_expires = NULL WHERE executor_id = ? "
                f"AND status = 'queued' AND last_seq = 0 AND run_id {listed}",
                [executor_id, *params],
            )

    def record_input_answer(
        self, run_id: str, request_id: str, answer: InputAnswer, now: float
    ) -> InputAnswer:
        self._execute(
            'INSERT INTO input_answers (run_id, request_id, choice, note, "by", answered_ts) '
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [run_id, request_id, answer["choice"], answer.get("note"), answer.get("by"), now],
        )
        choice, note, by = self._execute(
            'SELECT choice, note, "by" FROM input_answers WHERE run_id = ? AND request_id = ?',
            [run_id, request_id],
        ).fetchone()
        return {"choice": choice, "note": note, "by": by}

    def take_input_answers(self, executor_id: str) -> list[tuple[str, str, InputAnswer]]:
        rows = self._execute(
            "DELETE FROM input_answers WHERE EXISTS (SELECT 1 FROM runs "
            "WHERE runs.run_id = input_answers.run_id AND runs.executor_id = ?) "
            'RETURNING run_id, request_id, choice, note, "by", answered_ts',
            [executor_id],
        ).fetchall()
        rows.sort(key=lambda row: row[5])
        return [
            (run_id, request_id, {"choice": choice, "note": note, "by": by})
            for run_id, request_id, choice, note, by, _ in rows
        ]

    def release_run(self, run_id: str, executor_id: str) -> None:
        self._execute(
            "UPDATE runs SET executor_id = NULL, lease_expires = NULL "
            "WHERE run_id = ? AND executor_id = ?",
            [run_id, executor_id],
        )

    def claim_run(self, run_id: str, executor_id: str, lease_expires: float) -> bool:
        cursor = self._execute(
            f"UPDATE runs SET executor_id = ?, lease_expires = ? WHERE run_id = ? AND {UNCLAIMED}",
            [executor_id, lease_expires, run_id],
        )
        return cursor.rowcount == 1

    def record_cancel_request(self, run_id: str, request: CancelRequest) -> None:
        self._execute(
            f"UPDATE runs SET cancel_request = ? WHERE run_id = ? AND status IN {CANCELLABLE_STATUSES}",
            [jsonio.dumps(request), run_id],
        )

    def take_cancel_requests(self, executor_id: str) -> list[tuple[str, CancelRequest]]:
        rows = self._execute(
            "SELECT run_id, cancel_request FROM runs WHERE executor_id = ? "
            f"AND cancel_request IS NOT NULL{self.LOCK_ROWS}",
            [executor_id],
        ).fetchall()
        for chunk in self._chunks([run_id for run_id, _ in rows]):
            listed, params = self._in(chunk)
            self._execute(f"UPDATE runs SET cancel_request = NULL WHERE run_id {listed}", params)
        return [(run_id, json.loads(request)) for run_id, request in rows]

    def purge_keys(self, older_than: float, limit: int = 5000) -> None:
        # At most ``limit`` a sweep: the sweep's transaction stays short however
        # many keys piled up meanwhile (the next sweeps take the rest).
        self._execute(
            "DELETE FROM idempotency_keys WHERE (owner, key) IN (SELECT owner, key "
            "FROM idempotency_keys WHERE created_ts < ? AND with_run = 0 LIMIT ?)",
            [older_than, limit],
        )


def split_parts(pieces: Iterable[str], size: int) -> Iterator[str]:
    """Pieces of text joined into parts of at least ``size`` characters (the last one shorter)."""
    buffer: list[str] = []
    length = 0
    for piece in pieces:
        buffer.append(piece)
        length += len(piece)
        if length >= size:
            yield "".join(buffer)
            buffer, length = [], 0
    if buffer:
        yield "".join(buffer)


def encode_columns(fields: RunFields) -> dict[str, Any]:
    """Columns to set, JSON columns encoded (strictly: no NaN); a ``snapshot`` stays as it is."""
    return {
        name: jsonio.dumps(value) if name in JSON_COLUMNS and value is not None else value
        for name, value in fields.items()
    }


def decode_run(row: dict[str, Any], later_parts: Callable[[str], list[str]]) -> dict[str, Any]:
    """A ``RUN_SELECT`` row as the engine takes it: JSON decoded, the snapshot joined from its parts.

    ``later_parts(run_id)``: the stored snapshot's parts after the first, in order.
    """
    for column in JSON_COLUMNS:
        if row.get(column) is not None:
            row[column] = json.loads(row[column])
    parts = row.pop("snapshot_parts", None)
    if row.get("snapshot") is not None:
        text = row["snapshot"]
        if parts is not None and parts > 1:
            text = "".join([text, *later_parts(row["run_id"])])
        row["snapshot"] = json.loads(text)
    return row
