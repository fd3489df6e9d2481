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
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from .. import jsonio, reducer
from ..domain import (
    ActiveRun,
    CancelRequest,
    EventRow,
    InputAnswer,
    KeyRow,
    ListedConversation,
    ListedRun,
    RunFields,
    RunHead,
    RunRow,
    StoredEvent,
    Tombstone,
)
from ..lifecycle import ACTIVE_STATUSES, CANCELLABLE, TERMINAL_STATUSES
from ..settings import WEBHOOK_EVENTS
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
    "webhooks": "hook_id",
    "webhook_deliveries": "delivery_id",
    "schedules": "schedule_id",
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
    # Conversations (an owner's runs of one session and agent): each one's
    # newest run, first run and count are found in the index, not by reading
    # every run of the session.
    ("CREATE INDEX runs_conversation ON runs (owner, session, agent, created_at, run_id)",),
    # The title an agent gave its conversation during a run (an ACP agent's
    # session title): a conversation's newest one is one probe of an index
    # holding the runs that have one, however many runs have none.
    (
        "ALTER TABLE runs ADD COLUMN conversation_title {text}",
        "CREATE INDEX runs_conversation_title ON runs (owner, session, agent, created_at, run_id) "
        "WHERE conversation_title IS NOT NULL",
    ),
    # The W3C traceparent of the span of a run's latest attempt, when
    # OpenTelemetry traces runs: the attempt after a takeover links to it.
    ("ALTER TABLE runs ADD COLUMN trace_context {text}",),
    # Webhooks: the hooks (a user's, or the servers' own: owner NULL, their
    # secret in an environment variable), and the outbox of their deliveries,
    # written in the transaction of the event each one tells of.
    (
        "CREATE TABLE webhooks (hook_id {text} PRIMARY KEY, owner {text}, url {text} NOT NULL, "
        "events {text} NOT NULL, format {text} NOT NULL, secret {text}, secret_env {text}, "
        "created_at {text} NOT NULL)",
        "CREATE TABLE webhook_deliveries (delivery_id {text} PRIMARY KEY, "
        "hook_id {text} NOT NULL, run_id {text} NOT NULL, seq bigint NOT NULL, "
        "type {text} NOT NULL, status {text} NOT NULL, attempts integer NOT NULL DEFAULT 0, "
        "created_ts double precision NOT NULL, next_attempt double precision NOT NULL, "
        "claimed_until double precision NOT NULL DEFAULT 0, last_error {text}, "
        "delivered_ts double precision)",
        "CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_attempt)",
        "CREATE INDEX webhook_deliveries_order ON webhook_deliveries (hook_id, run_id, seq)",
    ),
    # Schedules: a run submitted at each time a cron expression names.
    # ``last_slot`` is the newest slot handled (UTC ISO time; at creation, the
    # creation time); ``skipped`` counts the older missed slots passed over,
    # ``skips`` lists the newest such passes (JSON).
    (
        "CREATE TABLE schedules (schedule_id {text} PRIMARY KEY, owner {text} NOT NULL, "
        "agent {text} NOT NULL, input {text} NOT NULL, cron {text} NOT NULL, "
        "timezone {text} NOT NULL, session {text}, paused integer NOT NULL DEFAULT 0, "
        "created_at {text} NOT NULL, last_slot {text} NOT NULL, "
        "skipped integer NOT NULL DEFAULT 0, skips {text}, last_error {text})",
        "CREATE INDEX schedules_owner ON schedules (owner, created_at)",
    ),
    # Forks: the run and event a run was started from (``{"run_id", "seq"}``, JSON).
    ("ALTER TABLE runs ADD COLUMN forked_from {text}",),
]

# The events webhooks tell of: a run's end, and a question waiting for a person.
HOOK_EVENTS = frozenset(WEBHOOK_EVENTS)
HOOK_COLUMNS = "hook_id, owner, url, events, format, secret, secret_env, created_at"

# A snapshot's JSON is stored in parts of at least this many characters (the last one shorter).
SNAPSHOT_PART_CHARS = 1 << 20

# ``runs`` columns holding JSON text (the snapshot has tables of its own).
JSON_COLUMNS = (
    "metadata", "input", "output", "error", "cancel", "cancel_request", "checkpoint",
    "forked_from",
)  # fmt: skip
# A run with its persisted snapshot (``snapshot_seq`` 0 and no snapshot when none).
RUN_SELECT = (
    "SELECT runs.*, coalesce(snapshots.seq, 0) AS snapshot_seq, snapshots.snapshot AS snapshot, "
    "snapshots.parts AS snapshot_parts FROM runs LEFT JOIN snapshots ON snapshots.run_id = runs.run_id"
)
RUN_SELECT_WITHOUT_SNAPSHOT = RUN_SELECT.replace("snapshots.snapshot AS", "NULL AS")
# A run queued behind earlier runs of its session: no server executes it yet.
UNCLAIMED = "executor_id IS NULL AND status = 'queued'"
# The runs of the conversation of the run ``last``: the same owner, session and agent.
SAME_CONVERSATION = "c.owner = last.owner AND c.session = last.session AND c.agent = last.agent"
# The most runs one statement of list_conversations reads, looking for conversations.
CONVERSATION_SCAN_MAX = 1000
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
        forked_from: str | None = None,
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
        if forked_from is not None:
            where.append("forked_from LIKE ? ESCAPE '\\'")
            params.append(_forked_from_pattern(forked_from))
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

    def list_conversations(
        self,
        owner: str,
        *,
        agent: str | None,
        notebook: tuple[str, ...] | None,
        limit: int,
        before: tuple[str, str] | None,
    ) -> list[ListedConversation]:
        if notebook:
            found = self._notebook_conversations(owner, agent, notebook, limit, before)
        else:
            found = self._newest_conversations(owner, agent, limit, before)
        # The first run of each, and the newest title its agent gave it (found
        # through runs_conversation_title from the first run: the same owner, session and agent).
        titled = (
            "SELECT c.conversation_title FROM runs AS c WHERE c.owner = first_run.owner "
            "AND c.session = first_run.session AND c.agent = first_run.agent "
            "AND c.conversation_title IS NOT NULL ORDER BY c.created_at DESC, c.run_id DESC LIMIT 1"
        )
        firsts: dict[str, dict[str, Any]] = {}
        for chunk in self._chunks([row["first_run_id"] for row in found]):
            listed, params = self._in(chunk)
            sql = (
                f"SELECT run_id, metadata, input, ({titled}) AS title FROM runs AS first_run "
                f"WHERE run_id {listed}"
            )
            firsts.update((row["run_id"], row) for row in self._dicts(sql, params))
        conversations: list[ListedConversation] = []
        for row in found:
            first = firsts.get(row.pop("first_run_id"), {})
            metadata, input = first.get("metadata"), first.get("input")
            row["first_metadata"] = None if metadata is None else json.loads(metadata)
            row["first_input"] = None if input is None else json.loads(input)
            row["title"] = first.get("title")
            conversations.append(cast(ListedConversation, row))
        return conversations

    def _newest_conversations(
        self, owner: str, agent: str | None, limit: int, before: tuple[str, str] | None
    ) -> list[dict[str, Any]]:
        """``limit`` conversations after ``before``, newest first, with their count and first run.

        The owner's runs are read in the order of runs_owner_created, a batch
        at a time, and only those are looked up in runs_conversation (is each
        its conversation's newest?): PostgreSQL, given the whole query, looks
        up every run of the owner, then sorts.
        """
        newest = (
            f"last.run_id = (SELECT c.run_id FROM runs AS c WHERE {SAME_CONVERSATION} "
            "ORDER BY c.created_at DESC, c.run_id DESC LIMIT 1)"
        )
        found: list[dict[str, Any]] = []
        batch = min(max(4 * limit, 100), CONVERSATION_SCAN_MAX)
        while len(found) < limit:
            where = ["owner = ?", "session IS NOT NULL"]
            params: list[Any] = [owner]
            if agent is not None:
                where.append("agent = ?")
                params.append(agent)
            if before is not None:
                where.append("(created_at, run_id) < (?, ?)")
                params.extend(before)
            rows = self._dicts(
                "SELECT last.session AS session, last.agent AS agent, last.run_id AS last_run_id, "
                "last.created_at AS updated_at, "
                f"CASE WHEN {newest} THEN "
                f"(SELECT count(*) FROM runs AS c WHERE {SAME_CONVERSATION}) END AS runs, "
                f"CASE WHEN {newest} THEN (SELECT c.run_id FROM runs AS c "
                f"WHERE {SAME_CONVERSATION} ORDER BY c.created_at, c.run_id LIMIT 1) "
                "END AS first_run_id "
                "FROM (SELECT owner, session, agent, run_id, created_at FROM runs "
                f"WHERE {' AND '.join(where)} ORDER BY created_at DESC, run_id DESC LIMIT ?"
                ") AS last ORDER BY last.created_at DESC, last.run_id DESC",
                [*params, batch],
            )
            found += [row for row in rows if row["runs"] is not None]
            if len(rows) < batch:
                break
            before = (rows[-1]["updated_at"], rows[-1]["last_run_id"])
        return found[:limit]

    def _notebook_conversations(
        self,
        owner: str,
        agent: str | None,
        notebook: tuple[str, ...],
        limit: int,
        before: tuple[str, str] | None,
    ) -> list[dict[str, Any]]:
        """``limit`` of the notebook's conversations after ``before``, newest first.

        They are found in one read of the owner's runs, grouped: those whose
        session is the notebook, and those with a run whose metadata holds its
        path; the second are made sure of by ``_names_notebook``.
        """
        patterns = _notebook_patterns(notebook)
        where = ["owner = ?", "session IS NOT NULL"]
        params: list[Any] = [owner]
        if agent is not None:
            where.append("agent = ?")
            params.append(agent)
        named = " OR ".join("metadata LIKE ? ESCAPE '\\'" for _ in patterns)
        # created_at and run_id joined by a space, which sorts before any of their characters:
        # the greatest and least of these are the newest and first run.
        rows = self._dicts(
            "SELECT session, agent, count(*) AS runs, max(created_at || ' ' || run_id) AS newest, "
            "min(created_at || ' ' || run_id) AS first "
            f"FROM runs WHERE {' AND '.join(where)} GROUP BY session, agent "
            f"HAVING session IN ({', '.join('?' for _ in notebook)}) "
            f"OR max(CASE WHEN {named} THEN 1 ELSE 0 END) = 1",
            [*params, *notebook, *patterns],
        )
        candidates = []
        for row in rows:
            updated_at, _, last_run_id = row.pop("newest").partition(" ")
            if before is None or (updated_at, last_run_id) < before:
                first_run_id = row.pop("first").partition(" ")[2]
                candidates.append(
                    {**row, "last_run_id": last_run_id, "updated_at": updated_at,
                     "first_run_id": first_run_id}
                )  # fmt: skip
        candidates.sort(key=lambda row: (row["updated_at"], row["last_run_id"]), reverse=True)
        found: list[dict[str, Any]] = []
        for row in candidates:
            if len(found) == limit:
                break
            if row["session"] in notebook or self._names_notebook(owner, row, notebook):
                found.append(row)
        return found

    def _names_notebook(self, owner: str, row: dict[str, Any], notebook: tuple[str, ...]) -> bool:
        """Whether a run of the conversation has one of these paths as its ``metadata.notebook``.

        A LIKE found the path somewhere in a run's metadata (SQLite's ignoring
        the case of ASCII letters): the metadata is read here to make sure.
        """
        patterns = _notebook_patterns(notebook)
        rows = self._execute(
            "SELECT metadata FROM runs WHERE owner = ? AND session = ? AND agent = ? AND ("
            + " OR ".join("metadata LIKE ? ESCAPE '\\'" for _ in patterns)
            + ")",
            [owner, row["session"], row["agent"], *patterns],
        ).fetchall()
        for (text,) in rows:
            metadata = json.loads(text)
            if isinstance(metadata, dict) and metadata.get("notebook") in notebook:
                return True
        return False

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

    # Webhooks ------------------------------------------------------------------

    def _queue_deliveries(self, rows: list[EventRow]) -> None:
        """The outbox: a delivery of each event a hook wants, in the event's own transaction.

        The hooks of the run's owner and the servers' own (owner NULL). A
        delivery's id is its hook's and its event's: the same at every attempt.
        """
        now = None
        for row in rows:
            type = row[2]
            if type not in HOOK_EVENTS:
                continue
            run_id, seq = row[0], row[1]
            now = now or time.time()
            self._execute(
                "INSERT INTO webhook_deliveries (delivery_id, hook_id, run_id, seq, type, status, "
                "created_ts, next_attempt) SELECT hook_id || ?, hook_id, ?, ?, ?, 'pending', ?, ? "
                "FROM webhooks WHERE events LIKE ? AND (owner IS NULL OR owner = "
                "(SELECT owner FROM runs WHERE run_id = ?)) ON CONFLICT DO NOTHING",
                [f":{run_id}:{seq}", run_id, seq, type, now, now, f'%"{type}"%', run_id],
            )

    def set_server_hooks(self, hooks: list[dict[str, Any]]) -> None:
        kept = {hook["hook_id"] for hook in hooks}
        for (hook_id,) in self._execute("SELECT hook_id FROM webhooks WHERE owner IS NULL"):
            if hook_id not in kept:
                self._execute("DELETE FROM webhooks WHERE hook_id = ?", [hook_id])
        for hook in hooks:
            self._execute(
                f"INSERT INTO webhooks ({HOOK_COLUMNS}) VALUES (?, NULL, ?, ?, ?, NULL, ?, ?) "
                "ON CONFLICT (hook_id) DO UPDATE SET url = excluded.url, "
                "events = excluded.events, format = excluded.format, "
                "secret_env = excluded.secret_env",
                [
                    hook["hook_id"],
                    hook["url"],
                    json.dumps(hook["events"]),
                    hook["format"],
                    hook["secret_env"],
                    hook["created_at"],
                ],
            )

    def insert_hook(self, hook: dict[str, Any]) -> None:
        self._execute(
            f"INSERT INTO webhooks ({HOOK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, ?)",
            [
                hook["hook_id"],
                hook["owner"],
                hook["url"],
                json.dumps(hook["events"]),
                hook["format"],
                hook["secret"],
                hook["created_at"],
            ],
        )

    def _hook(self, row: dict[str, Any]) -> dict[str, Any]:
        row["events"] = json.loads(row["events"])
        return row

    def list_hooks(self, owner: str) -> list[dict[str, Any]]:
        return [
            self._hook(row)
            for row in self._dicts(
                f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE owner = ? ORDER BY created_at, hook_id",
                [owner],
            )
        ]

    def get_hook(self, hook_id: str) -> dict[str, Any] | None:
        rows = self._dicts(f"SELECT {HOOK_COLUMNS} FROM webhooks WHERE hook_id = ?", [hook_id])
        return self._hook(rows[0]) if rows else None

    def delete_hook(self, owner: str, hook_id: str) -> bool:
        if (
            self._execute(
                "DELETE FROM webhooks WHERE hook_id = ? AND owner = ?", [hook_id, owner]
            ).rowcount
            != 1
        ):
            return False
        self._execute("DELETE FROM webhook_deliveries WHERE hook_id = ?", [hook_id])
        return True

    def list_deliveries(self, hook_id: str, limit: int) -> list[dict[str, Any]]:
        return self._dicts(
            "SELECT delivery_id, run_id, seq, type, status, attempts, last_error, created_ts, "
            "next_attempt, delivered_ts FROM webhook_deliveries WHERE hook_id = ? "
            "ORDER BY created_ts DESC, run_id, seq DESC LIMIT ?",
            [hook_id, limit],
        )

    def due_deliveries(self, now: float) -> bool:
        return bool(
            self._execute(
                "SELECT 1 FROM webhook_deliveries WHERE status = 'pending' AND next_attempt <= ? "
                "AND claimed_until < ? LIMIT 1",
                [now, now],
            ).fetchall()
        )

    def claim_deliveries(self, now: float, until: float, limit: int) -> list[dict[str, Any]]:
        rows = self._dicts(
            "SELECT d.delivery_id, d.hook_id, d.run_id, d.seq, d.type, d.attempts, d.created_ts, "
            "h.url, h.format, h.secret, h.secret_env, r.owner "
            "FROM webhook_deliveries d LEFT JOIN webhooks h ON h.hook_id = d.hook_id "
            "LEFT JOIN runs r ON r.run_id = d.run_id "
            "WHERE d.status = 'pending' AND d.next_attempt <= ? AND d.claimed_until < ? "
            "AND NOT EXISTS (SELECT 1 FROM webhook_deliveries e WHERE e.hook_id = d.hook_id "
            "AND e.run_id = d.run_id AND e.seq < d.seq AND e.status = 'pending') "
            "ORDER BY d.next_attempt, d.delivery_id LIMIT ?",
            [now, now, limit],
        )
        # Another server may have read the same rows: the one whose update
        # finds the row still unclaimed has it (the other's waits, then finds none).
        return [
            row
            for row in rows
            if self._execute(
                "UPDATE webhook_deliveries SET claimed_until = ? WHERE delivery_id = ? "
                "AND status = 'pending' AND claimed_until < ?",
                [until, row["delivery_id"], now],
            ).rowcount
            == 1
        ]

    def finish_delivery(
        self, delivery_id: str, now: float, error: str | None, next_attempt: float | None
    ) -> None:
        if error is None:
            status = "delivered"
        else:
            status = "pending" if next_attempt is not None else "failed"
        self._execute(
            "UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, last_error = ?, "
            "next_attempt = ?, claimed_until = 0, delivered_ts = ? WHERE delivery_id = ?",
            [
                status,
                error,
                next_attempt if next_attempt is not None else now,
                now if error is None else None,
                delivery_id,
            ],
        )

    # Schedules ---------------------------------------------------------------

    def insert_schedule(self, schedule: dict[str, Any]) -> None:
        columns = {
            **schedule,
            "input": jsonio.dumps(schedule["input"]),
            "paused": int(schedule.get("paused", False)),
            "skips": None,
        }
        names = ", ".join(columns)
        values = ", ".join("?" for _ in columns)
        self._execute(f"INSERT INTO schedules ({names}) VALUES ({values})", list(columns.values()))

    def get_schedule(self, schedule_id: str) -> dict[str, Any] | None:
        rows = self._dicts("SELECT * FROM schedules WHERE schedule_id = ?", [schedule_id])
        return _decode_schedule(rows[0]) if rows else None

    def list_schedules(self, owner: str | None) -> list[dict[str, Any]]:
        if owner is None:
            rows = self._dicts(
                "SELECT * FROM schedules WHERE paused = 0 ORDER BY created_at, schedule_id"
            )
        else:
            rows = self._dicts(
                "SELECT * FROM schedules WHERE owner = ? ORDER BY created_at, schedule_id",
                [owner],
            )
        return [_decode_schedule(row) for row in rows]

    def set_schedule_paused(self, schedule_id: str, paused: bool, last_slot: str | None) -> None:
        self._execute(
            "UPDATE schedules SET paused = ?, last_slot = coalesce(?, last_slot) "
            "WHERE schedule_id = ?",
            [int(paused), last_slot, schedule_id],
        )

    def delete_schedule(self, schedule_id: str) -> bool:
        cursor = self._execute("DELETE FROM schedules WHERE schedule_id = ?", [schedule_id])
        return cursor.rowcount > 0

    def advance_schedule(
        self,
        schedule_id: str,
        from_slot: str,
        to_slot: str,
        skipped: int,
        skips: list[dict[str, Any]] | None,
        last_error: str | None,
    ) -> bool:
        cursor = self._execute(
            "UPDATE schedules SET last_slot = ?, skipped = skipped + ?, "
            "skips = coalesce(?, skips), last_error = ? "
            "WHERE schedule_id = ? AND last_slot = ? AND paused = 0",
            [
                to_slot,
                skipped,
                None if skips is None else jsonio.dumps(skips),
                last_error,
                schedule_id,
                from_slot,
            ],
        )
        return cursor.rowcount == 1

    def schedule_runs(self, owner: str, schedule_id: str, limit: int) -> list[dict[str, Any]]:
        # The keys of one schedule's runs share a prefix (see engine/schedules.py):
        # a range of the (owner, key) primary key, newest slot last.
        prefix = f"schedule:{schedule_id}:"
        return self._dicts(
            "SELECT runs.run_id AS run_id, runs.status AS status, runs.created_at AS created_at, "
            "runs.finished_at AS finished_at FROM idempotency_keys AS k "
            "JOIN runs ON runs.run_id = k.run_id "
            "WHERE k.owner = ? AND k.key >= ? AND k.key < ? ORDER BY k.key DESC LIMIT ?",
            [owner, prefix, prefix[:-1] + ";", limit],
        )


def _decode_schedule(row: dict[str, Any]) -> dict[str, Any]:
    row["input"] = json.loads(row["input"])
    row["skips"] = json.loads(row["skips"]) if row.get("skips") else []
    row["paused"] = bool(row["paused"])
    return row


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


def _forked_from_pattern(run_id: str) -> str:
    """The LIKE pattern of a fork's stored ``forked_from`` naming ``run_id``.

    It is stored as ``jsonio.dumps`` writes what the fork made: ``{"run_id": "<id>", "seq": N}``.
    """
    text = '{"run_id": ' + jsonio.dumps(run_id) + ","
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _notebook_patterns(notebook: tuple[str, ...]) -> list[str]:
    """LIKE patterns of a run's stored metadata that names one of these paths as its ``notebook``.

    Metadata is stored as ``jsonio.dumps`` writes it: ``"notebook": "<path>"``.
    """
    patterns = []
    for path in notebook:
        text = f'"notebook": {jsonio.dumps(path)}'
        escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        patterns.append(f"%{escaped}%")
    return patterns


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
