"""The store on PostgreSQL, through psycopg 3: runs shared by servers on many machines.

The same tables as the SQLite store, in a schema of their own (``agentruns``
unless the URL's ``schema`` parameter names another) so that the store can
live in a database that holds other things. What SQLite gets from its one
write lock, PostgreSQL gets from locks of its own:

- Submits of one owner serialize on an advisory lock held until their
  transaction ends (``serialize``): two servers given the same
  Idempotency-Key, or a ``reject`` session, make one run between them. The
  unique keys remain the backstop.
- A read that decides a write locks the run's row (``lock_run``), and the
  lease sweep skips rows another server is ending (``SKIP LOCKED``).
- A deadlock or a serialization failure is a passing failure: the writer
  retries its batch.

Every commit that appends events sends one ``NOTIFY`` (sent by PostgreSQL
only once the transaction commits: publish-after-commit) naming the runs and
their new ``last_seq``; each server's listener wakes the subscribers of runs
other servers execute, with no polling.

A connection lost (the database restarted, a network cut) raises
``StoreUnavailable``; the next use connects again. One found dead outside a
transaction (it sat idle while the database restarted) is replaced at once
and its statement run again: the database that is back answers it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import unquote

from .. import jsonio, reducer
from ..lifecycle import ACTIVE_STATUSES, CANCELLABLE, TERMINAL_STATUSES
from . import (
    HEAD_COLUMNS,
    RUN_SELECT,
    UNCLAIMED,
    Listener,
    SeqTaken,
    Store,
    StoreBusy,
    StoreConnection,
    StoreUnavailable,
    decode_run,
    encode_columns,
    split_parts,
)

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.rows import dict_row
except ImportError:  # the extra is not installed: PostgresStore says how to get it
    psycopg = None

log = logging.getLogger(__name__)

SNAPSHOT_PART_CHARS = 1 << 20
CONNECT_TIMEOUT_SECONDS = 5
# NOTIFY payloads are at most 8000 bytes: a batch naming more runs sends several.
NOTIFY_MAX_BYTES = 7000
SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# One advisory lock key for schema migrations (two servers starting at once).
MIGRATION_LOCK = 0x61676E7472756E73  # "agntruns"

_MIGRATIONS = [
    # 1: the schema of SQLite's eight migrations, in one step. Text compares byte
    # for byte (COLLATE "C"), as in SQLite: lists and their pages order runs alike.
    """
    CREATE TABLE runs (
        run_id text COLLATE "C" PRIMARY KEY,
        position bigserial NOT NULL,
        owner text COLLATE "C" NOT NULL,
        agent text COLLATE "C" NOT NULL,
        status text COLLATE "C" NOT NULL,
        session text COLLATE "C",
        metadata text COLLATE "C",
        input text COLLATE "C",
        retry_of text COLLATE "C",
        created_at text COLLATE "C" NOT NULL,
        started_at text COLLATE "C",
        finished_at text COLLATE "C",
        finished_ts double precision,
        last_seq bigint NOT NULL DEFAULT 0,
        first_seq bigint NOT NULL DEFAULT 1,
        output text COLLATE "C",
        error text COLLATE "C",
        cancel text COLLATE "C",
        executor_id text COLLATE "C",
        lease_expires double precision,
        cancel_request text COLLATE "C",
        input_tokens bigint NOT NULL DEFAULT 0,
        output_tokens bigint NOT NULL DEFAULT 0
    );
    CREATE INDEX runs_owner_status ON runs (owner, status);
    CREATE INDEX runs_status_lease ON runs (status, lease_expires);
    CREATE INDEX runs_status_finished ON runs (status, finished_ts);
    CREATE INDEX runs_owner_created ON runs (owner, created_at, run_id);
    CREATE INDEX runs_retry_of ON runs (retry_of) WHERE retry_of IS NOT NULL;
    CREATE INDEX runs_cancel_requests ON runs (executor_id) WHERE cancel_request IS NOT NULL;
    CREATE INDEX runs_session_queue ON runs (owner, session, position)
        WHERE executor_id IS NULL AND status = 'queued';
    CREATE INDEX runs_position ON runs (position);
    CREATE TABLE events (
        run_id text COLLATE "C" NOT NULL,
        seq bigint NOT NULL,
        type text COLLATE "C" NOT NULL,
        ts text COLLATE "C" NOT NULL,
        data text COLLATE "C" NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE snapshots (
        run_id text COLLATE "C" PRIMARY KEY,
        seq bigint NOT NULL,
        snapshot text COLLATE "C" NOT NULL,
        parts integer NOT NULL DEFAULT 1
    );
    CREATE TABLE snapshot_parts (
        run_id text COLLATE "C" NOT NULL,
        part integer NOT NULL,
        data text COLLATE "C" NOT NULL,
        PRIMARY KEY (run_id, part)
    );
    CREATE TABLE idempotency_keys (
        owner text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        fingerprint text COLLATE "C" NOT NULL,
        run_id text COLLATE "C" NOT NULL,
        created_ts double precision NOT NULL,
        with_run integer NOT NULL DEFAULT 0,
        PRIMARY KEY (owner, key)
    );
    CREATE INDEX idempotency_keys_created ON idempotency_keys (created_ts);
    CREATE INDEX idempotency_keys_run ON idempotency_keys (run_id);
    CREATE TABLE tombstones (
        run_id text COLLATE "C" PRIMARY KEY,
        owner text COLLATE "C",
        deleted_ts double precision
    );
    CREATE TABLE input_answers (
        run_id text COLLATE "C" NOT NULL,
        request_id text COLLATE "C" NOT NULL,
        choice text COLLATE "C" NOT NULL,
        note text COLLATE "C",
        "by" text COLLATE "C",
        answered_ts double precision NOT NULL,
        PRIMARY KEY (run_id, request_id)
    );
    """,
    # 2: resumable runs (SQLite's ninth).
    """
    ALTER TABLE runs ADD COLUMN attempt integer NOT NULL DEFAULT 1;
    ALTER TABLE runs ADD COLUMN checkpoint text COLLATE "C";
    """,
    # 3: whether a run's agent resumes it (SQLite's tenth).
    """
    ALTER TABLE runs ADD COLUMN resumable integer;
    """,
]


# The prefixes libpq reads as a URL (it reads anything else as key=value pairs).
URL_PREFIXES = ("postgresql://", "postgres://")
# Connection parameters holding secrets: never said, and starred out of psycopg's messages.
SECRET_PARAMETERS = ("password", "sslpassword")
# libpq's messages quote parts of the string it was given, the password among them:
# from the first quote to the last, but for its quoted "=".
_QUOTED = re.compile(r'".*"', re.DOTALL)


class BadStoreUrl(ValueError):
    """A store URL that cannot be used: the message says why, and never quotes the URL."""


class StoreUrl:
    """A store URL read by libpq's own rules: where the database is, the schema, the secrets.

    ``?schema=`` is this package's parameter, not libpq's: it is taken out of
    the URL as written (nothing is decoded and encoded again) before libpq
    reads the rest. Nothing here shows the URL itself: ``describe`` says
    where the database is from what libpq read, and ``scrub`` stars the
    secrets out of a message (libpq's and psycopg's quote what they were given).
    """

    def __init__(self, url: str):
        prefix = next((p for p in URL_PREFIXES if url.startswith(p)), None)
        if prefix is None:
            raise BadStoreUrl(_not_a_url(url))
        rest = url[len(prefix) :]
        # libpq's reading: the user name and password end at the first "@"
        # before any "/", the query starts at the first "?" after them.
        at = next((i for i, char in enumerate(rest) if char in "@/"), len(rest))
        userinfo, authority = (rest[:at], at + 1) if rest[at : at + 1] == "@" else ("", 0)
        query_at = rest.find("?", authority)
        before_query = rest[authority:] if query_at < 0 else rest[authority:query_at]
        if "@" in before_query or "?" in userinfo.partition(":")[0]:
            # libpq would take part of the password for the host, the database or the
            # user name, and say it in every message: refused before it is ever read.
            raise BadStoreUrl(
                "is ambiguous: percent-encode its user name and password (an '@' as %40, "
                "'/' as %2F, '?' as %3F; Python's urllib.parse.quote(password, safe='') "
                "does it)"
            )
        hidden = {userinfo.partition(":")[2]}
        kept, schemas = [], []
        for parameter in rest[query_at + 1 :].split("&") if query_at >= 0 else []:
            name, _, value = parameter.partition("=")
            if unquote(name) == "schema":
                schemas.append(unquote(value))
                continue
            if unquote(name) in SECRET_PARAMETERS:
                hidden.add(value)
            kept.append(parameter)
        self.schema = schemas[-1] if schemas else "agentruns"
        if not SCHEMA_NAME.match(self.schema):
            raise BadStoreUrl(
                f"names the schema {self.schema!r}: it must be a lower-case SQL name "
                "(letters, digits and _, as in ?schema=agentruns)"
            )
        conninfo = prefix + (rest if query_at < 0 else rest[:query_at])
        if kept:
            conninfo += "?" + "&".join(kept)
        self._secrets: list[str] = []
        self._hide(hidden)
        # libpq's own reading, with the driver; without it the store says what to install.
        self.parameters: dict[str, str] | None = None
        if psycopg is not None:
            try:
                self.parameters = conninfo_to_dict(conninfo)
            except psycopg.Error as exc:
                said = _QUOTED.sub("…", str(exc).strip().replace('"="', "'='"))
                raise BadStoreUrl(f"is not a URL libpq can read ({self.scrub(said)})") from None
            self._hide(
                value for name, value in self.parameters.items() if name in SECRET_PARAMETERS
            )

    def _hide(self, secrets: Iterable[str]) -> None:
        forms = {form for secret in secrets for form in (secret, unquote(secret))}
        # The longest first: a secret that contains another is starred out whole.
        self._secrets = sorted(forms.union(self._secrets) - {""}, key=len, reverse=True)

    def describe(self) -> str:
        """Where the database is, for logs and messages: no password, no URL."""
        found = self.parameters or {}
        words = ["PostgreSQL"]
        if "dbname" in found:
            words.append(f"database {found['dbname']}")
        if host := found.get("host") or found.get("hostaddr"):
            words.append(f"at {host}" + (f" port {found['port']}" if "port" in found else ""))
        if "user" in found:
            words.append(f"as {found['user']}")
        return " ".join(words) + f" (schema {self.schema})"

    def scrub(self, text: str) -> str:
        """``text`` with every secret of the URL starred out, as written or decoded."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text


def _not_a_url(value: str) -> str:
    """Why a store URL is not one, saying no more of it than its scheme."""
    needed = (
        "must be a postgresql:// URL (postgresql://user:password@host:port/database, "
        "optionally ?schema=name)"
    )
    if scheme := re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", value):
        return f"{needed}, not a {scheme.group(0)} one"
    if "=" in value:
        return f"{needed}, not key=value pairs"
    return needed


class PostgresStore(Store):
    """A PostgreSQL database (``postgresql://user:password@host:port/database?schema=agentruns``)."""

    local_reads = False

    def __init__(self, url: str):
        if psycopg is None:
            raise RuntimeError(
                "c.AgentRuns.store_url names a PostgreSQL database, which needs the psycopg "
                "driver: pip install 'jupyter_agentruns[postgres]'"
            )
        self.url = StoreUrl(url)
        self.schema = self.url.schema
        self.channel = f"agentruns.{self.schema}"
        # Names this process in its notifications: its own commits wake nobody here.
        self.instance = secrets.token_hex(8)
        # Migrated on the first connection that succeeds: a database that is
        # down when the server starts is waited for, not fatal.
        self._migrated = False
        self._migrating = threading.Lock()

    schema_versions_known = len(_MIGRATIONS)

    def open(self) -> psycopg.Connection:
        """A new autocommit connection with the store's schema first in its search path."""
        conn = self._open()
        if not self._migrated:
            with self._migrating:
                if not self._migrated:
                    try:
                        _migrate(conn, self.schema)
                    except Exception as exc:
                        conn.close()
                        raise StoreUnavailable(
                            f"{self.describe()} cannot hold the agentruns schema: "
                            f"{self.url.scrub(str(exc))}"
                        ) from None
                    self._migrated = True
        return conn

    def _open(self) -> psycopg.Connection:
        """A connection as ``open`` makes it, without migrating the schema."""
        try:
            parameters = {
                **self.url.parameters,
                "connect_timeout": CONNECT_TIMEOUT_SECONDS,
                "options": f"-c search_path={self.schema}",
            }
            conn = psycopg.connect(autocommit=True, **parameters)
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"{self.describe()} cannot be reached: {self.url.scrub(str(exc))}"
            ) from None
        return conn

    def schema_version(self) -> int:
        conn = self._open()
        try:
            table = conn.execute(
                "SELECT to_regclass(%s)", [f'"{self.schema}".schema_version']
            ).fetchone()[0]
            if table is None:
                return 0
            [version] = conn.execute(
                f'SELECT max(version) FROM "{self.schema}".schema_version'
            ).fetchone()
            return version or 0
        finally:
            conn.close()

    def connect(self) -> PostgresConnection:
        return PostgresConnection(self)

    def describe(self) -> str:
        return self.url.describe()

    def listen(self, on_change: Callable[[dict[str, int] | None], None]) -> Listener:
        return _Listener(self, on_change)


class PostgresConnection(StoreConnection):
    """One connection, reconnected on its next use after it was lost."""

    def __init__(self, store: PostgresStore):
        self._store = store
        self._conn: psycopg.Connection | None = None  # connected on first use
        self._in_transaction = False
        self._savepoints = 0
        # Runs whose events this transaction appended (or that it deleted): their new last_seq.
        self._touched: dict[str, int] = {}

    # Plumbing ----------------------------------------------------------------

    def _connection(self) -> psycopg.Connection:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if self._in_transaction:
                raise StoreUnavailable("the connection to PostgreSQL was lost mid-transaction")
            self._discard()
            conn = self._conn = self._store.open()
        return conn

    def _discard(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """psycopg's failures as the store's: a lost connection, or a batch to retry."""
        try:
            yield
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                raise StoreUnavailable(
                    f"the connection to PostgreSQL was lost: {self._store.url.scrub(str(exc))}"
                ) from None
            raise StoreBusy(self._store.url.scrub(str(exc))) from None

    def _run(self, statement: Callable[[psycopg.Connection], Any]) -> Any:
        """Run a statement; outside a transaction, once more on a new connection if this one died.

        A connection that sat idle while the database restarted is found dead
        only when used. Outside a transaction the statement is a read or a
        BEGIN, which may run twice: the caller gets its answer, not a 503.
        """
        conn = self._connection()
        try:
            with self._errors():
                return statement(conn)
        except StoreUnavailable:
            if self._in_transaction:
                raise
        conn = self._connection()
        with self._errors():
            return statement(conn)

    def _execute(self, sql: str, params: Iterable[Any] | dict | None = None) -> psycopg.Cursor:
        return self._run(lambda conn: conn.execute(sql, params, prepare=False))

    def _dicts(self, sql: str, params: Iterable[Any] | None = None) -> list[dict[str, Any]]:
        return self._run(
            lambda conn: conn.cursor(row_factory=dict_row).execute(sql, params).fetchall()
        )

    # Transactions ------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self._execute("BEGIN")
        self._in_transaction = True
        self._touched = {}
        try:
            yield
            self._notify()
            self._execute("COMMIT")
        except BaseException:
            conn = self._conn
            if conn is not None and not conn.closed and not conn.broken:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
            raise
        finally:
            self._in_transaction = False
            self._touched = {}

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        self._savepoints += 1
        name = f"s{self._savepoints}"
        self._execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            conn = self._conn
            if conn is not None and not conn.closed and not conn.broken:
                self._execute(f"ROLLBACK TO SAVEPOINT {name}")
                self._execute(f"RELEASE SAVEPOINT {name}")
            raise
        else:
            self._execute(f"RELEASE SAVEPOINT {name}")
        finally:
            self._savepoints -= 1

    def _notify(self) -> None:
        if not self._touched:
            return
        runs: dict[str, int] = {}
        size = 0
        for run_id, seq in self._touched.items():
            runs[run_id] = seq
            size += len(run_id) + 16
            if size >= NOTIFY_MAX_BYTES:
                self._send(runs)
                runs, size = {}, 0
        if runs:
            self._send(runs)

    def _send(self, runs: dict[str, int]) -> None:
        payload = json.dumps({"from": self._store.instance, "runs": runs}, separators=(",", ":"))
        self._execute("SELECT pg_notify(%s, %s)", [self._store.channel, payload])

    def close(self) -> None:
        self._discard()

    def change_token(self) -> int:
        return 0  # other servers' commits arrive as notifications (see listen)

    def serialize(self, scope: str) -> None:
        self._execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [scope])

    def lock_run(self, run_id: str) -> None:
        self._execute("SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE", [run_id])

    # Reads -------------------------------------------------------------------

    def get_run(self, run_id: str, *, snapshot: bool = True) -> dict[str, Any] | None:
        select = RUN_SELECT if snapshot else RUN_SELECT.replace("snapshots.snapshot AS", "NULL AS")
        rows = self._dicts(f"{select} WHERE runs.run_id = %s", [run_id])
        return self._decode(rows[0]) if rows else None

    def snapshot_layout(self, run_id: str) -> tuple[int, int] | None:
        row = self._execute(
            "SELECT seq, parts FROM snapshots WHERE run_id = %s", [run_id]
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def snapshot_part(self, run_id: str, part: int, seq: int) -> str | None:
        if part == 0:
            row = self._execute(
                "SELECT snapshot FROM snapshots WHERE run_id = %s AND seq = %s", [run_id, seq]
            ).fetchone()
        else:
            row = self._execute(
                "SELECT p.data FROM snapshot_parts AS p JOIN snapshots AS s ON s.run_id = p.run_id "
                "WHERE p.run_id = %s AND p.part = %s AND s.seq = %s",
                [run_id, part, seq],
            ).fetchone()
        return None if row is None else row[0]

    def _later_parts(self, run_id: str) -> list[str]:
        rows = self._execute(
            "SELECT data FROM snapshot_parts WHERE run_id = %s ORDER BY part", [run_id]
        ).fetchall()
        return [data for (data,) in rows]

    def get_run_head(self, run_id: str) -> dict[str, Any] | None:
        rows = self._dicts(f"SELECT {HEAD_COLUMNS} FROM runs WHERE run_id = %s", [run_id])
        return rows[0] if rows else None

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
        where = ["owner = %s"]
        params: list[Any] = [owner]
        for column, value in (("status", status), ("session", session), ("retry_of", retry_of)):
            if value is not None:
                where.append(f"{column} = %s")
                params.append(value)
        if before is not None:
            where.append("(created_at, run_id) < (%s, %s)")
            params.extend(before)
        params.append(limit)
        rows = self._dicts(
            f"SELECT * FROM runs WHERE {' AND '.join(where)} "
            "ORDER BY created_at DESC, run_id DESC LIMIT %s",
            params,
        )
        return [self._decode(row) for row in rows]

    def read_events(
        self,
        run_id: str,
        after: int,
        limit: int,
        upto: int | None = None,
        max_bytes: int | None = None,
    ) -> list[tuple[int, str, str, str]]:
        bound = "" if upto is None else " AND seq <= %(upto)s"
        params = {"run_id": run_id, "after": after, "upto": upto, "limit": limit}
        head = (
            f"SELECT seq, type, ts, data FROM events WHERE run_id = %(run_id)s AND seq > %(after)s"
            f"{bound} ORDER BY seq LIMIT %(limit)s"
        )
        if max_bytes is None:
            return self._execute(head, params).fetchall()
        # Sizes from the rows' headers (octet_length reads no text), summed over
        # the page only: the rows before the one that reaches max_bytes, and it.
        params["max_bytes"] = max_bytes
        return self._execute(
            "SELECT seq, type, ts, data FROM ("
            "  SELECT seq, type, ts, data,"
            "         sum(octet_length(data)) OVER (ORDER BY seq) - octet_length(data) AS before"
            f"  FROM ({head}) AS page"
            ") AS sized WHERE before < %(max_bytes)s ORDER BY seq",
            params,
        ).fetchall()

    def get_tombstone(self, run_id: str) -> dict[str, Any] | None:
        rows = self._dicts("SELECT * FROM tombstones WHERE run_id = %s", [run_id])
        return rows[0] if rows else None

    def compaction_candidates(
        self, finished_before: float, max_events: int, limit: int = 100
    ) -> list[str]:
        rows = self._execute(
            "SELECT run_id FROM runs WHERE (status = ANY(%s) AND finished_ts < %s "
            "AND first_seq < last_seq) OR last_seq - first_seq + 1 > %s LIMIT %s",
            [list(TERMINAL_STATUSES), finished_before, max_events, limit],
        ).fetchall()
        return [row[0] for row in rows]

    def snapshot_seq(self, run_id: str) -> int:
        row = self._execute("SELECT seq FROM snapshots WHERE run_id = %s", [run_id]).fetchone()
        return row[0] if row else 0

    def expired_runs(self, finished_before: float, limit: int = 1000) -> list[tuple[str, str]]:
        rows = self._execute(
            "SELECT run_id, owner FROM runs WHERE status = ANY(%s) AND finished_ts < %s LIMIT %s",
            [list(TERMINAL_STATUSES), finished_before, limit],
        ).fetchall()
        return [tuple(row) for row in rows]

    def find_key(self, owner: str, key: str, not_before: float) -> dict[str, Any] | None:
        rows = self._dicts(
            "SELECT * FROM idempotency_keys WHERE owner = %s AND key = %s "
            "AND (created_ts >= %s OR with_run = 1)",
            [owner, key, not_before],
        )
        return rows[0] if rows else None

    def count_active(self, owner: str) -> int:
        return self._execute(
            "SELECT count(*) FROM runs WHERE owner = %s AND status = ANY(%s)",
            [owner, list(ACTIVE_STATUSES)],
        ).fetchone()[0]

    def count_runs(self, owner: str) -> int:
        return self._execute("SELECT count(*) FROM runs WHERE owner = %s", [owner]).fetchone()[0]

    def count_runs_by_status(self) -> dict[str, int]:
        return dict(self._execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())

    def diagnostics(self) -> dict[str, Any]:
        server_version = self._execute("SHOW server_version").fetchone()[0]
        return {
            "schema_version": self._execute("SELECT max(version) FROM schema_version").fetchone()[0]
            or 0,
            "schema_versions_known": len(_MIGRATIONS),
            "runs_by_status": self.count_runs_by_status(),
            "versions": {"postgresql": server_version, "psycopg": psycopg.__version__},
        }

    def expired_active_runs(self, now: float) -> list[dict[str, Any]]:
        # Locked until the sweep's transaction ends; rows another server is
        # ending right now are left to it.
        rows = self._dicts(
            f"{RUN_SELECT} WHERE status = ANY(%s) AND (lease_expires IS NULL OR lease_expires < %s) "
            f"AND NOT ({UNCLAIMED}) FOR UPDATE OF runs SKIP LOCKED",
            [list(ACTIVE_STATUSES), now],
        )
        return [self._decode(row) for row in rows]

    def active_in_session(self, owner: str, session: str) -> list[dict[str, Any]]:
        rows = self._execute(
            "SELECT run_id, status, executor_id, cancel_request FROM runs "
            "WHERE owner = %s AND session = %s AND status = ANY(%s) ORDER BY position",
            [owner, session, list(ACTIVE_STATUSES)],
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
        row = self._execute(
            """
            SELECT earlier.run_id FROM runs AS queued JOIN runs AS earlier
              ON earlier.owner = queued.owner AND earlier.session = queued.session
             AND earlier.position < queued.position AND earlier.status = ANY(%s)
            WHERE queued.run_id = %s AND queued.status = 'queued' AND queued.executor_id IS NULL
            ORDER BY earlier.position LIMIT 1
            """,
            [list(ACTIVE_STATUSES), run_id],
        ).fetchone()
        return row[0] if row else None

    def startable_queued_runs(
        self, owners: list[str] | None, agents: list[str], limit: int = 100
    ) -> list[dict[str, Any]]:
        served = "" if owners is None else "AND queued.owner = ANY(%s)"
        rows = self._dicts(
            f"""
            {RUN_SELECT} WHERE runs.run_id IN (
                SELECT queued.run_id FROM runs AS queued
                WHERE queued.executor_id IS NULL AND queued.status = 'queued'
                  AND queued.agent = ANY(%s) {served}
                  AND NOT EXISTS (
                    SELECT 1 FROM runs AS earlier
                    WHERE earlier.owner = queued.owner AND earlier.session = queued.session
                      AND earlier.position < queued.position AND earlier.status = ANY(%s)
                  )
                ORDER BY queued.position LIMIT %s
            )
            ORDER BY runs.position
            """,
            [
                list(agents),
                *([] if owners is None else [list(owners)]),
                list(ACTIVE_STATUSES),
                limit,
            ],
        )
        return [self._decode(row) for row in rows]

    def usage_since(self, owner: str, since: str) -> list[tuple[str, str, int, int]]:
        rows = self._execute(
            "SELECT run_id, created_at, input_tokens, output_tokens FROM runs "
            "WHERE owner = %s AND created_at >= %s ORDER BY created_at, run_id",
            [owner, since],
        ).fetchall()
        return [tuple(row) for row in rows]

    def _decode(self, row: dict[str, Any]) -> dict[str, Any]:
        row.pop("position", None)
        return decode_run(row, self._later_parts)

    # Writes (inside transaction()) ---------------------------------------------

    def insert_run(self, run: dict[str, Any]) -> None:
        columns = encode_columns(run)
        names = ", ".join(columns)
        values = ", ".join("%s" for _ in columns)
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
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (owner, key) DO UPDATE SET "
            "fingerprint = excluded.fingerprint, run_id = excluded.run_id, "
            "created_ts = excluded.created_ts, with_run = excluded.with_run",
            [owner, key, fingerprint, run_id, now, int(with_run)],
        )

    def update_run(self, run_id: str, fields: dict[str, Any]) -> None:
        columns = encode_columns(fields)
        snapshot, seq = columns.pop("snapshot", None), columns.pop("snapshot_seq", None)
        if snapshot is not None:
            self.write_snapshot(run_id, seq, snapshot)
        if columns:
            assignments = ", ".join(f"{name} = %s" for name in columns)
            self._execute(
                f"UPDATE runs SET {assignments} WHERE run_id = %s", [*columns.values(), run_id]
            )
        if "last_seq" in columns:
            self._touched[run_id] = columns["last_seq"]

    def write_snapshot(
        self, run_id: str, seq: int, snapshot: dict[str, Any] | reducer.Snapshot
    ) -> None:
        builder = (
            snapshot if isinstance(snapshot, reducer.Snapshot) else reducer.Snapshot.wrap(snapshot)
        )
        self._execute("DELETE FROM snapshot_parts WHERE run_id = %s", [run_id])
        first, count = "", 0
        for data in split_parts(builder.json_chunks(), SNAPSHOT_PART_CHARS):
            if count == 0:
                first = data
            else:
                self._execute(
                    "INSERT INTO snapshot_parts (run_id, part, data) VALUES (%s, %s, %s)",
                    [run_id, count, data],
                )
            count += 1
        self._execute(
            "INSERT INTO snapshots (run_id, seq, snapshot, parts) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq, "
            "snapshot = excluded.snapshot, parts = excluded.parts",
            [run_id, seq, first, count],
        )

    def append_events(self, rows: Iterable[tuple[str, int, str, str, str]]) -> None:
        rows = list(rows)
        conn = self._connection()
        touched = self._touched
        try:
            with self.savepoint(), self._errors(), conn.cursor() as cursor:
                with cursor.copy("COPY events (run_id, seq, type, ts, data) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                        touched[row[0]] = row[1]
        except psycopg.errors.UniqueViolation as exc:
            if self._stored_already(rows):
                return  # a batch whose COMMIT was answered by a lost connection, written again
            raise SeqTaken(str(exc)) from exc

    def _stored_already(self, rows: list[tuple[str, int, str, str, str]]) -> bool:
        """Whether every one of these events is stored exactly so (the commit did happen)."""
        stored = self._execute(
            "SELECT e.run_id, e.seq, e.type, e.ts, e.data FROM events AS e "
            "JOIN unnest(%s::text[], %s::bigint[]) AS k(run_id, seq) "
            "ON e.run_id = k.run_id AND e.seq = k.seq",
            [[row[0] for row in rows], [row[1] for row in rows]],
        ).fetchall()
        return sorted(stored) == sorted(tuple(row) for row in rows)

    def set_last_seqs(self, pairs: list[tuple[int, str]]) -> None:
        if not pairs:
            return
        self._execute(
            "UPDATE runs SET last_seq = v.seq FROM unnest(%s::bigint[], %s::text[]) AS v(seq, run_id) "
            "WHERE runs.run_id = v.run_id",
            [[seq for seq, _ in pairs], [run_id for _, run_id in pairs]],
        )

    def delete_events_before(self, run_id: str, seq: int, limit: int) -> int:
        return self._execute(
            "DELETE FROM events WHERE run_id = %s AND seq IN "
            "(SELECT seq FROM events WHERE run_id = %s AND seq < %s ORDER BY seq LIMIT %s)",
            [run_id, run_id, seq, limit],
        ).rowcount

    def bury(self, run_id: str, owner: str, now: float) -> bool:
        deleted = self.delete_run(run_id)
        self._execute(
            "INSERT INTO tombstones (run_id, owner, deleted_ts) VALUES (%s, %s, %s) "
            "ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, deleted_ts = excluded.deleted_ts",
            [run_id, owner, now],
        )
        return deleted

    def delete_run(self, run_id: str) -> bool:
        for table in (
            "events",
            "idempotency_keys",
            "snapshots",
            "snapshot_parts",
            "input_answers",
            "runs",
        ):
            deleted = self._execute(f"DELETE FROM {table} WHERE run_id = %s", [run_id]).rowcount
        self._touched[run_id] = 0  # its subscribers on other servers learn it is gone
        return deleted > 0

    def renew_leases(self, executor_id: str, run_ids: list[str], expires: float) -> None:
        self._execute(
            "UPDATE runs SET lease_expires = %s WHERE executor_id = %s AND run_id = ANY(%s)",
            [expires, executor_id, run_ids],
        )

    def release_claims(self, run_ids: list[str], executor_id: str) -> None:
        self._execute(
            "UPDATE runs SET executor_id = NULL, lease_expires = NULL "
            "WHERE run_id = ANY(%s) AND executor_id = %s AND status = 'queued' AND last_seq = 0",
            [run_ids, executor_id],
        )

    def record_input_answer(
        self, run_id: str, request_id: str, answer: dict[str, Any], now: float
    ) -> dict[str, Any]:
        self._execute(
            'INSERT INTO input_answers (run_id, request_id, choice, note, "by", answered_ts) '
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            [run_id, request_id, answer["choice"], answer.get("note"), answer.get("by"), now],
        )
        choice, note, by = self._execute(
            'SELECT choice, note, "by" FROM input_answers WHERE run_id = %s AND request_id = %s',
            [run_id, request_id],
        ).fetchone()
        return {"choice": choice, "note": note, "by": by}

    def take_input_answers(self, executor_id: str) -> list[tuple[str, str, dict[str, Any]]]:
        rows = self._execute(
            "DELETE FROM input_answers AS a USING runs WHERE runs.run_id = a.run_id "
            'AND runs.executor_id = %s RETURNING a.run_id, a.request_id, a.choice, a.note, a."by", '
            "a.answered_ts",
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
            "WHERE run_id = %s AND executor_id = %s",
            [run_id, executor_id],
        )

    def claim_run(self, run_id: str, executor_id: str, lease_expires: float) -> bool:
        cursor = self._execute(
            f"UPDATE runs SET executor_id = %s, lease_expires = %s WHERE run_id = %s AND {UNCLAIMED}",
            [executor_id, lease_expires, run_id],
        )
        return cursor.rowcount == 1

    def record_cancel_request(self, run_id: str, request: dict[str, Any]) -> None:
        self._execute(
            "UPDATE runs SET cancel_request = %s WHERE run_id = %s AND status = ANY(%s)",
            [jsonio.dumps(request), run_id, list(CANCELLABLE)],
        )

    def take_cancel_requests(self, executor_id: str) -> list[tuple[str, dict[str, Any]]]:
        rows = self._execute(
            "WITH taken AS (SELECT run_id, cancel_request FROM runs WHERE executor_id = %s "
            "AND cancel_request IS NOT NULL FOR UPDATE) "
            "UPDATE runs SET cancel_request = NULL FROM taken WHERE runs.run_id = taken.run_id "
            "RETURNING taken.run_id, taken.cancel_request",
            [executor_id],
        ).fetchall()
        return [(run_id, json.loads(request)) for run_id, request in rows]

    def purge_keys(self, older_than: float) -> None:
        self._execute(
            "DELETE FROM idempotency_keys WHERE created_ts < %s AND with_run = 0", [older_than]
        )


def _migrate(conn: psycopg.Connection, schema: str) -> None:
    """Bring the schema forward, one step at a time; two servers starting at once take turns."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIGRATION_LOCK])
        # Quoted: a lower-case name may still be a keyword (user, order, cross).
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version integer NOT NULL)")
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] or 0
        if version > len(_MIGRATIONS):
            raise RuntimeError(
                f"the agentruns database has schema version {version}, newer than this "
                f"jupyter_agentruns knows ({len(_MIGRATIONS)}): upgrade the package"
            )
        for number, sql in enumerate(_MIGRATIONS[version:], start=version + 1):
            conn.execute(sql)
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", [number])


class _Listener(Listener):
    """A thread with its own connection that ``LISTEN``s for other servers' commits.

    After it (re)connects it reports ``None`` (everything may have changed):
    what was committed while it was away is read from the store by the
    subscribers, from their cursors. No wake-up is missed.
    """

    def __init__(self, store: PostgresStore, on_change: Callable[[dict[str, int] | None], None]):
        self._store = store
        self._on_change = on_change
        self._stop = threading.Event()
        self._conn: psycopg.Connection | None = None
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentruns-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay, warned = 0.1, False
        while not self._stop.is_set():
            try:
                conn = self._conn = self._store.open()
                conn.execute(f'LISTEN "{self._store.channel}"')
                self.connected.set()
                if warned:
                    log.warning("agentruns: listening to PostgreSQL again")
                delay, warned = 0.1, False
                self._on_change(None)
                while not self._stop.is_set():
                    for notice in conn.notifies(timeout=0.25):
                        self._received(notice.payload)
            except (psycopg.Error, StoreUnavailable) as exc:
                self.connected.clear()
                if self._stop.is_set():
                    break
                if not warned:
                    log.warning(
                        "agentruns: lost the PostgreSQL notification connection (%s); reconnecting",
                        self._store.url.scrub(str(exc)),
                    )
                    warned = True
                self._stop.wait(delay)
                delay = min(delay * 2, 2.0)
            finally:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None

    def _received(self, payload: str) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            self._on_change(None)
            return
        if message.get("from") == self._store.instance:
            return  # this server's own commit: its subscribers were woken already
        self._on_change(message.get("runs") or None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
