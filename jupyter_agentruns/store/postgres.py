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

The queries are ``sql.py``'s, written with ``?`` placeholders and given to
psycopg as ``%s``. PostgreSQL's own besides: its first migration, the locks
above, a batch of events in one ``COPY``, runs in the order of their
``position`` column, and lists of values bound as one array (``= ANY(?)``).

A connection lost (the database restarted, a network cut) raises
``StoreUnavailable``; the next use connects again. One found dead outside a
transaction (it sat idle while the database restarted) is replaced at once
and its statement run again: the database that is back answers it.

A database that hangs (a paused process, a proxy whose backend stopped, a
host gone from the network) is unavailable too, within seconds: connecting
is bounded (``connect_timeout``), a statement the database runs too long is
ended by it (``statement_timeout``), and one it never answers (the bytes
accepted, nothing sent back: no timeout of the database's or of TCP's sees
it) is cut by this process after ``ANSWER_TIMEOUT_SECONDS``. TCP keepalives
and ``tcp_user_timeout`` end an idle connection (the listener's) to a host
that is gone; a URL's own libpq parameters of that kind are kept.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import unquote

from ..domain import EventRow, RunFields
from . import Listener, SeqTaken, Store, StoreBusy, StoreRefused, StoreUnavailable
from .sql import SHARED_MIGRATIONS, TABLES, SQLConnection

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.rows import dict_row
except ImportError:  # the extra is not installed: PostgresStore says how to get it
    psycopg = None  # type: ignore[assignment]  # the module, or None: checked where it is used

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 5
# Every statement of a server is bounded (a page of events, a batch of at most
# 16 MB): one the database runs this long is waiting on a lock held by a server
# that hangs, or on a database that cannot keep up. Either way it is unavailable.
STATEMENT_TIMEOUT_SECONDS = 5
# A statement that has no answer this long is cut (the database's own timeout
# above ends one it runs; this ends one it never got or never answers).
ANSWER_TIMEOUT_SECONDS = STATEMENT_TIMEOUT_SECONDS + 1
# A writer's batch (up to 16 MB) is given more time at this rate: a slow link is not a hang.
COPY_BYTES_PER_SECOND = 1024 * 1024
# A host that stops acknowledging: found out within about 15 s, even on an idle connection.
TCP_BOUNDS = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 5,
    "tcp_user_timeout": 15_000,
}
# NOTIFY payloads are at most 8000 bytes: a batch naming more runs sends several.
NOTIFY_MAX_BYTES = 7000
SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# One advisory lock key for schema migrations (two servers starting at once).
MIGRATION_LOCK = 0x61676E7472756E73  # "agntruns"

# Text compares byte for byte, as in SQLite: lists and their pages order runs alike.
TEXT = 'text COLLATE "C"'

# The schema of SQLite's first eight migrations, in one step.
_CREATE = """
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
"""

# Append only, through SHARED_MIGRATIONS (see the package's docstring).
_MIGRATIONS = [
    _CREATE,
    *(";\n".join(statement.format(text=TEXT) for statement in step) for step in SHARED_MIGRATIONS),
]


# The prefixes libpq reads as a URL (it reads anything else as key=value pairs).
URL_PREFIXES = ("postgresql://", "postgres://")
# Connection parameters holding secrets: never said, and starred out of psycopg's messages.
SECRET_PARAMETERS = ("password", "sslpassword")
# libpq's messages quote parts of the string it was given, the password among them:
# from the first quote to the last, but for its quoted "=".
_QUOTED = re.compile(r'".*"', re.DOTALL)


class NoAnswer(StoreUnavailable):
    """The database took a statement and did not answer in time: it hangs, or is overwhelmed."""


class _Waited:
    __slots__ = ("fd", "deadline", "cut")

    def __init__(self, fd: int | None, deadline: float):
        self.fd = fd  # a duplicate of the connection's socket, the waiter's own
        self.deadline = deadline
        self.cut = False


class _Answers:
    """Connections awaiting the database's answer, each cut at its deadline by one thread.

    psycopg waits for an answer without a bound: a peer that takes the bytes
    and says nothing holds the calling thread for as long as it hangs. Shutting
    the socket down under the wait ends it (the connection then fails, and is
    replaced on its next use). The socket is duplicated by the waiter itself
    and the duplicate closed by it: libpq may close its own socket meanwhile,
    and that number may then be another connection's. The thread starts at the
    first statement and sleeps until the nearest deadline; with none, until
    there is one. It is woken only by a deadline nearer than the one it sleeps
    until (most statements' deadline is ``seconds`` away, later than any set
    before: they cost no wake-up of another thread).
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._cond = threading.Condition()
        self._waiting: set[_Waited] = set()
        self._thread: threading.Thread | None = None
        self._until: float | None = None  # what the thread sleeps until (None: a deadline)

    @contextlib.contextmanager
    def awaited(
        self, conn: psycopg.Connection | None, seconds: float | None = None
    ) -> Iterator[_Waited]:
        fd = _dup_socket(conn)
        waited = _Waited(fd, time.monotonic() + (seconds or self.seconds))
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="agentruns-postgres-answers", daemon=True
                )
                self._thread.start()
            self._waiting.add(waited)
            if self._until is None or waited.deadline < self._until:
                self._until = waited.deadline
                self._cond.notify()
        try:
            yield waited
        finally:
            with self._cond:
                self._waiting.discard(waited)
            if fd is not None:
                os.close(fd)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for waited in [w for w in self._waiting if w.deadline <= now]:
                    # Under the lock: a statement that ended meanwhile is not cut.
                    self._waiting.discard(waited)
                    waited.cut = True
                    _shut_down(waited.fd)
                nearest = min((w.deadline for w in self._waiting), default=None)
                self._until = nearest
                self._cond.wait(None if nearest is None else max(nearest - now, 0.01))


def _dup_socket(conn: psycopg.Connection | None) -> int | None:
    """A duplicate of a connection's socket (None: it has none), for its caller to close."""
    if conn is None:
        return None
    with contextlib.suppress(OSError, psycopg.Error):
        return os.dup(conn.pgconn.socket)
    return None


def _shut_down(fd: int | None) -> None:
    """Shut a connection's socket down under whoever waits on it: their wait fails at once.

    ``fd`` is a duplicate of that socket, which its waiter closes.
    """
    if fd is None:
        return
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()


_ANSWERS = _Answers(ANSWER_TIMEOUT_SECONDS)


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
        if any(char.isspace() for char in rest):
            # Newer libpq refuses a space as written, older ones read it as part of a
            # value: refused here, whatever libpq the driver brings.
            raise BadStoreUrl("holds a space as written: percent-encode it (a space as %20)")
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
        self.parameters: dict[str, Any] | None = None
        if psycopg is not None:
            try:
                self.parameters = conninfo_to_dict(conninfo)
            except psycopg.Error as exc:
                said = _QUOTED.sub("…", str(exc).strip().replace('"="', "'='"))
                raise BadStoreUrl(f"is not a URL libpq can read ({self.scrub(said)})") from None
            self._hide(
                value
                for name, value in self.parameters.items()
                if name in SECRET_PARAMETERS and isinstance(value, str)  # parsed: all text
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

    def open(self, statement_timeout: float | None = None) -> psycopg.Connection:
        """A new autocommit connection with the store's schema first in its search path."""
        conn = self._open(statement_timeout)
        if not self._migrated:
            with self._migrating:
                if not self._migrated:
                    try:
                        _migrate(conn, self.schema)
                        missing = _missing_privileges(conn, self.schema)
                    except psycopg.errors.InsufficientPrivilege as exc:
                        conn.close()
                        raise self._refused(str(exc)) from None
                    except Exception as exc:
                        conn.close()
                        raise StoreUnavailable(
                            f"{self.describe()} cannot hold the agentruns schema: "
                            f"{self.url.scrub(str(exc))}"
                        ) from None
                    if missing:
                        conn.close()
                        raise self._refused("the role lacks " + "; ".join(missing))
                    self._migrated = True
        return conn

    def _refused(self, why: str) -> StoreRefused:
        return StoreRefused(
            f"{self.describe()} refuses this server what it needs: {self.url.scrub(why)}. "
            "A database administrator grants it: on a schema that does not exist yet, CREATE "
            "on the database; once it exists, USAGE on the schema and "
            f"{TABLE_PRIVILEGES} on its tables, USAGE on its sequences (the "
            "documentation's JupyterHub guide has the statements)"
        )

    def _open(self, statement_timeout: float | None = None) -> psycopg.Connection:
        """A connection as ``open`` makes it, without migrating the schema."""
        try:
            assert self.url.parameters is not None  # read where psycopg is installed
            options = f"-c search_path={self.schema}"
            if statement_timeout is not None:
                options += f" -c statement_timeout={round(statement_timeout * 1000)}"
            parameters: dict[str, Any] = {
                **TCP_BOUNDS,
                **self.url.parameters,
                "connect_timeout": CONNECT_TIMEOUT_SECONDS,
                "options": options,
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
            table = _one(
                conn.execute("SELECT to_regclass(%s)", [f'"{self.schema}".schema_version'])
            )[0]
            if table is None:
                return 0
            [version] = _one(
                conn.execute(f'SELECT max(version) FROM "{self.schema}".schema_version')
            )
            return version or 0
        finally:
            conn.close()

    def connect(self) -> PostgresConnection:
        return PostgresConnection(self)

    def migrate(self) -> None:
        self.open().close()  # a connection connects at its first use: this one at once

    def describe(self) -> str:
        return self.url.describe()

    def listen(self, on_change: Callable[[dict[str, int] | None], None]) -> Listener:
        return _Listener(self, on_change)


class PostgresConnection(SQLConnection):
    """One connection, reconnected on its next use after it was lost."""

    SUBMIT_ORDER = "position"
    LOCK_ROWS = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE OF runs SKIP LOCKED"
    MOST_LISTED = None  # a list is one array parameter
    schema_versions_known = len(_MIGRATIONS)

    def __init__(self, store: PostgresStore):
        super().__init__()
        self._store = store
        self._conn: psycopg.Connection | None = None  # connected on first use
        self._in_transaction = False
        # Runs whose events this transaction appended (or that it deleted): their new last_seq.
        self._touched: dict[str, int] = {}

    # Plumbing ----------------------------------------------------------------

    def _connection(self) -> psycopg.Connection:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if self._in_transaction:
                raise StoreUnavailable("the connection to PostgreSQL was lost mid-transaction")
            self._discard()
            # The server's own statements are all small (the copy's, through open(), are not).
            conn = self._conn = self._store.open(STATEMENT_TIMEOUT_SECONDS)
        return conn

    def _connected(self) -> bool:
        conn = self._conn
        return conn is not None and not conn.closed and not conn.broken

    def _discard(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    @contextlib.contextmanager
    def _errors(self, seconds: float | None = None) -> Iterator[None]:
        """psycopg's failures as the store's: a lost connection, no answer, or a batch to retry.

        An answer is awaited ``seconds`` (``ANSWER_TIMEOUT_SECONDS`` unless said).
        """
        conn = self._conn
        try:
            with _ANSWERS.awaited(conn, seconds) as waited:
                yield
        except psycopg.errors.QueryCanceled:
            raise NoAnswer(
                f"{self._store.describe()} did not finish a statement within "
                f"{STATEMENT_TIMEOUT_SECONDS} s"
            ) from None
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if waited.cut:
                self._discard()
                raise NoAnswer(
                    f"{self._store.describe()} did not answer within "
                    f"{seconds or ANSWER_TIMEOUT_SECONDS:g} s"
                ) from None
            if not self._connected():
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
        except NoAnswer:
            raise  # a database that hangs: asking again would wait as long again
        except StoreUnavailable:
            if self._in_transaction:
                raise
        conn = self._connection()
        with self._errors():
            return statement(conn)

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor:
        query = _pyformat(sql)
        return self._run(lambda conn: conn.execute(query, params, prepare=False))

    def _dicts(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        query = _pyformat(sql)
        return self._run(
            lambda conn: conn.cursor(row_factory=dict_row).execute(query, params).fetchall()
        )

    def _in(self, values: Sequence[Any]) -> tuple[str, list[Any]]:
        return "= ANY(?)", [list(values)]

    def _read_within(self, sql: str, params: list[Any], max_bytes: int) -> list[tuple]:
        # Sizes from the rows' headers (octet_length reads no text), summed over
        # the page only: the rows before the one that reaches max_bytes, and it.
        return self._execute(
            "SELECT seq, type, ts, data FROM ("
            "  SELECT seq, type, ts, data,"
            "         sum(octet_length(data)) OVER (ORDER BY seq) - octet_length(data) AS before"
            f"  FROM ({sql}) AS page"
            ") AS sized WHERE before < ? ORDER BY seq",
            [*params, max_bytes],
        ).fetchall()

    def _schema_version(self) -> int:
        return _one(self._execute("SELECT max(version) FROM schema_version"))[0] or 0

    def _versions(self) -> dict[str, str]:
        server_version = _one(self._execute("SHOW server_version"))[0]
        return {"postgresql": server_version, "psycopg": psycopg.__version__}

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
            self._roll_back()
            raise
        finally:
            self._in_transaction = False
            self._touched = {}

    @contextlib.contextmanager
    def read_transaction(self) -> Iterator[None]:
        self._execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        # A connection lost inside is unavailable, not silently replaced by one
        # that sees another state.
        self._in_transaction = True
        try:
            yield
        except BaseException:
            self._roll_back()
            raise
        else:
            self._execute("COMMIT")
        finally:
            self._in_transaction = False

    def _roll_back(self) -> None:
        if self._connected():
            assert self._conn is not None  # it is connected
            with contextlib.suppress(psycopg.Error, StoreBusy), self._errors():
                self._conn.execute("ROLLBACK")

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
        self._execute("SELECT pg_notify(?, ?)", [self._store.channel, payload])

    def close(self) -> None:
        self._discard()

    def change_token(self) -> int:
        return 0  # other servers' commits arrive as notifications (see listen)

    def serialize(self, scope: str) -> None:
        self._execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", [scope])

    def lock_run(self, run_id: str) -> None:
        self._execute("SELECT 1 FROM runs WHERE run_id = ? FOR UPDATE", [run_id])

    # Writes that other servers are told of ----------------------------------------

    def update_run(self, run_id: str, fields: RunFields) -> None:
        super().update_run(run_id, fields)
        if "last_seq" in fields:
            self._touched[run_id] = fields["last_seq"]

    def delete_run(self, run_id: str) -> bool:
        deleted = super().delete_run(run_id)
        self._touched[run_id] = 0  # its subscribers on other servers learn it is gone
        return deleted

    # The append path -----------------------------------------------------------

    def append_events(self, rows: Iterable[EventRow]) -> None:
        rows = list(rows)
        conn = self._connection()
        touched = self._touched
        # A batch of megabytes takes time to send on a slow link: its bound grows with it.
        seconds = (
            STATEMENT_TIMEOUT_SECONDS + sum(len(row[4]) for row in rows) / COPY_BYTES_PER_SECOND
        )
        if seconds > STATEMENT_TIMEOUT_SECONDS + 1:
            self._execute(f"SET LOCAL statement_timeout = {round(seconds * 1000)}")
        try:
            with self.savepoint(), self._errors(seconds + 1), conn.cursor() as cursor:
                with cursor.copy("COPY events (run_id, seq, type, ts, data) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                        touched[row[0]] = row[1]
        except psycopg.errors.UniqueViolation as exc:
            if self._stored_already(rows):
                return  # a batch whose COMMIT was answered by a lost connection, written again
            raise SeqTaken(str(exc)) from exc
        self._queue_deliveries(rows)

    def _stored_already(self, rows: list[tuple[str, int, str, str, str]]) -> bool:
        """Whether every one of these events is stored exactly so (the commit did happen)."""
        stored = self._execute(
            "SELECT e.run_id, e.seq, e.type, e.ts, e.data FROM events AS e "
            "JOIN unnest(?::text[], ?::bigint[]) AS k(run_id, seq) "
            "ON e.run_id = k.run_id AND e.seq = k.seq",
            [[row[0] for row in rows], [row[1] for row in rows]],
        ).fetchall()
        return sorted(stored) == sorted(tuple(row) for row in rows)

    def set_last_seqs(self, pairs: list[tuple[int, str]]) -> None:
        if not pairs:
            return
        self._execute(
            "UPDATE runs SET last_seq = v.seq FROM unnest(?::bigint[], ?::text[]) AS v(seq, run_id) "
            "WHERE runs.run_id = v.run_id",
            [[seq for seq, _ in pairs], [run_id for _, run_id in pairs]],
        )


@functools.lru_cache(maxsize=512)
def _pyformat(sql: str) -> str:
    """A statement written with ``?`` placeholders as psycopg takes it: ``%s``, and ``%`` doubled.

    No statement of the store has a ``?`` of its own (in a string or an operator).
    """
    return sql.replace("%", "%%").replace("?", "%s")


def _migrate(conn: psycopg.Connection, schema: str) -> None:
    """Bring the schema forward, one step at a time; two servers starting at once take turns.

    A schema already at this version is left as it is, and nothing is
    created: a role needs CREATE (on the database, for the schema; on the
    schema, for its tables) only when there is something to create.
    """
    if _stored_version(conn, schema) == len(_MIGRATIONS):
        return
    with conn.transaction():
        # A migration may wait for another server's lock on a table, or take long: unbounded.
        conn.execute("SET LOCAL statement_timeout = 0")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIGRATION_LOCK])
        # Quoted: a lower-case name may still be a keyword (user, order, cross).
        exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [schema]).fetchone()
        if not exists:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        version = _stored_version(conn, schema)
        if version is None:
            conn.execute("CREATE TABLE schema_version (version integer NOT NULL)")
            version = 0
        if version > len(_MIGRATIONS):
            raise RuntimeError(
                f"the agentruns database has schema version {version}, newer than this "
                f"jupyter_agentruns knows ({len(_MIGRATIONS)}): upgrade the package"
            )
        for number, sql in enumerate(_MIGRATIONS[version:], start=version + 1):
            conn.execute(sql)
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", [number])


def _one(cursor: psycopg.Cursor) -> tuple[Any, ...]:
    """The row of a query that always answers one (an aggregate, a function of constants)."""
    row = cursor.fetchone()
    assert row is not None
    return row


def _stored_version(conn: psycopg.Connection, schema: str) -> int | None:
    """The schema's version, or None where it has no version table (yet)."""
    if _one(conn.execute("SELECT to_regclass(%s)", [f'"{schema}".schema_version']))[0] is None:
        return None
    return _one(conn.execute(f'SELECT max(version) FROM "{schema}".schema_version'))[0] or 0


# What a server does to each table (the copy and the schema's owner need more).
TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"


def _missing_privileges(conn: psycopg.Connection, schema: str) -> list[str]:
    """What the connected role lacks of what a server needs in the schema, in GRANT's words."""
    missing = []
    if not _one(conn.execute("SELECT has_schema_privilege(%s, 'USAGE')", [schema]))[0]:
        return [f'USAGE ON SCHEMA "{schema}"']
    for table in TABLES:
        # has_table_privilege is true when any one of several privileges is held: one at a time.
        lacking = [
            privilege
            for privilege in TABLE_PRIVILEGES.split(", ")
            if not _one(
                conn.execute(
                    "SELECT has_table_privilege(%s, %s)", [f'"{schema}".{table}', privilege]
                )
            )[0]
        ]
        if lacking:
            missing.append(f'{", ".join(lacking)} ON "{schema}".{table}')
    sequence = f'"{schema}".runs_position_seq'
    if not _one(conn.execute("SELECT has_sequence_privilege(%s, 'USAGE')", [sequence]))[0]:
        missing.append(f"USAGE ON SEQUENCE {sequence}")
    return missing


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
        self._conn_lock = threading.Lock()  # its connection is closed, or its socket shut, not both
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentruns-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay, warned = 0.1, False
        while not self._stop.is_set():
            try:
                # A connection to listen on: it needs no table, and leaves the schema to the writer.
                conn = self._conn = self._store._open()
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
                with self._conn_lock:
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
        self._interrupt()
        self._thread.join(5)

    def _interrupt(self) -> None:
        """End the wait for notifications now, not at its next timeout: a server's stop
        would otherwise take up to a quarter of a second longer. Its connection's socket
        is shut down under it; the thread then sees the connection fail, and stops."""
        with self._conn_lock:
            fd = _dup_socket(self._conn)
        if fd is not None:
            _shut_down(fd)
            os.close(fd)
