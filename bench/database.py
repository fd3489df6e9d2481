"""The PostgreSQL side of the bench: its own database, raw baselines, and what it reads directly.

``Database.open()`` creates ``agentruns_bench_<random>`` on the server named
by ``AGENTRUNS_BENCH_POSTGRES_URL`` (default a local ``test`` database) and
``drop()`` removes it at the end; each scenario uses a schema of its own in it
(``url(schema)``, the store's ``?schema=`` parameter). When no PostgreSQL
answers, or psycopg is not installed, the database says why (``reason``) and
the PostgreSQL scenarios skip.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from jupyter_agentruns.settings import SHARED_OWNER
from jupyter_agentruns.timeutil import now_iso

from .agents import delta
from .servers import cpu_seconds

try:
    import psycopg
except ImportError:  # the postgres extra is not installed: the scenarios skip
    psycopg = None

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"
# The engine's one owner when it runs with jupyter_server's token identity.
COPY_EVENTS = "COPY events (run_id, seq, type, ts, data) FROM STDIN"


class Database:
    """A database of the bench's own; ``reason`` says why there is none."""

    def __init__(self, server_url: str, name: str | None, reason: str | None, version: str = ""):
        self.server_url = server_url
        self.name = name
        self.reason = reason
        self.version = version

    @classmethod
    def open(cls) -> Database:
        server_url = os.environ.get("AGENTRUNS_BENCH_POSTGRES_URL") or DEFAULT_URL
        if psycopg is None:
            return cls(server_url, None, "psycopg is not installed (pip install '.[postgres]')")
        name = "agentruns_bench_" + uuid.uuid4().hex[:10]
        try:
            with psycopg.connect(server_url, autocommit=True, connect_timeout=3) as conn:
                version = conn.execute("SHOW server_version").fetchone()[0]
                sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
                conn.execute(f"CREATE DATABASE {name}")
        except psycopg.Error as exc:
            return cls(
                server_url, None, f"{redact(server_url)}: {str(exc).strip().splitlines()[0]}"
            )
        return cls(server_url, name, None, f"{version}, synchronous_commit={sync}")

    @property
    def conninfo(self) -> str:
        return urlunsplit(urlsplit(self.server_url)._replace(path="/" + self.name))

    def url(self, schema: str) -> str:
        """The store URL of one schema in this database (what ``c.AgentRuns.store_url`` gets)."""
        parts = urlsplit(self.conninfo)
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "schema"]
        query.append(("schema", schema))
        return urlunsplit(parts._replace(query=urlencode(query)))

    def connect(self, schema: str | None = None) -> psycopg.Connection:
        if schema:
            return store_connect(self.url(schema))
        return psycopg.connect(self.conninfo, autocommit=True)

    def drop(self) -> None:
        if self.name is None:
            return
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        self.name = None


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{parts.hostname}:{parts.port}"))


def store_connect(url: str) -> psycopg.Connection:
    """A connection to a store URL's database with its schema first in the search path."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = dict(query)["schema"]
    rest = urlencode([(name, value) for name, value in query if name != "schema"])
    return psycopg.connect(
        urlunsplit(parts._replace(query=rest)), autocommit=True, options=f"-c search_path={schema}"
    )


def run_state(url: str, run_ids: list[str]) -> dict[str, tuple[str, int, int]]:
    """``run_id -> (status, last_seq, first_seq)`` read straight from the store's schema."""
    with store_connect(url) as conn:
        rows = conn.execute(
            "SELECT run_id, status, last_seq, first_seq FROM runs WHERE run_id = ANY(%s)",
            [run_ids],
        ).fetchall()
    return {row[0]: row[1:] for row in rows}


# Raw baselines: psycopg into the store's own events table --------------------


def event_rows(count: int) -> list[tuple[str, int, str, str, str]]:
    """``count`` text deltas of one run, as the engine stores them (the SQLite baseline's rows)."""
    run_id, ts = "run_" + uuid.uuid4().hex[:22], now_iso()
    return [
        (
            run_id,
            seq,
            "text.delta",
            ts,
            json.dumps({"message_id": "m1", "delta": delta(100)}, separators=(",", ":")),
        )
        for seq in range(1, count + 1)
    ]


def copy_rate(conn: psycopg.Connection, rows: list, per_commit: int = 1000) -> float:
    """Rows/s of ``COPY`` into ``events``, ``per_commit`` rows a transaction."""
    start = time.perf_counter()
    for first in range(0, len(rows), per_commit):
        with conn.transaction(), conn.cursor() as cursor, cursor.copy(COPY_EVENTS) as copy:
            for row in rows[first : first + per_commit]:
                copy.write_row(row)
    return len(rows) / (time.perf_counter() - start)


def executemany_rate(conn: psycopg.Connection, rows: list, per_commit: int = 1000) -> float:
    """Rows/s of ``executemany(INSERT …)`` into ``events`` (pipelined), ``per_commit`` a transaction."""
    start = time.perf_counter()
    for first in range(0, len(rows), per_commit):
        with conn.transaction(), conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO events (run_id, seq, type, ts, data) VALUES (%s, %s, %s, %s, %s)",
                rows[first : first + per_commit],
            )
    return len(rows) / (time.perf_counter() - start)


# A finished run put straight into a store --------------------------------------


def finished_run_events(
    run_id: str, events: int, per_message: int = 1000
) -> Iterator[tuple[str, int, str, str, str]]:
    """The rows of a finished run of ``events`` events: text deltas in messages, as flood makes."""
    ts = now_iso()
    started, completed = '{"message_id":"m%d","role":"assistant"}', '{"message_id":"m%d"}'
    text = '{"message_id":"m%d","delta":"' + "x" * 100 + '"}'
    yield run_id, 1, "run.started", ts, "{}"
    cycle = per_message + 2
    for seq in range(2, events):
        message, at = divmod(seq - 2, cycle)
        if at == 0:
            yield run_id, seq, "message.started", ts, started % (message + 1)
        elif at == cycle - 1:
            yield run_id, seq, "message.completed", ts, completed % (message + 1)
        else:
            yield run_id, seq, "text.delta", ts, text % (message + 1)
    yield run_id, events, "run.succeeded", ts, '{"output":{}}'


def insert_finished_run(conn: psycopg.Connection, events: int) -> str:
    """A finished run of ``events`` events, by ``COPY``, in the schema ``conn`` searches first."""
    run_id = "run_" + uuid.uuid4().hex[:22]
    ts = now_iso()
    with conn.transaction():
        conn.execute(
            "INSERT INTO runs (run_id, owner, agent, status, metadata, input, created_at, "
            "started_at, finished_at, finished_ts, last_seq, output) "
            "VALUES (%s, %s, 'flood', 'succeeded', '{}', '{}', %s, %s, %s, %s, %s, '{}')",
            [run_id, SHARED_OWNER, ts, ts, ts, time.time(), events],
        )
        with conn.cursor() as cursor, cursor.copy(COPY_EVENTS) as copy:
            for row in finished_run_events(run_id, events):
                copy.write_row(row)
    return run_id


# Who is busy: the servers, PostgreSQL, or the disk -----------------------------


# PostgreSQL's own processes that work for every database: WAL, checkpoints, dirty pages.
SHARED_PROCESSES = ("walwriter", "checkpointer", "background writer")


def postgres_pids(database: str) -> list[int]:
    """PostgreSQL's backends of ``database`` and its shared processes (not other databases')."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f" {database} " in title or any(title.rstrip().endswith(p) for p in SHARED_PROCESSES):
            pids.append(int(entry.name))
    return pids


def cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:  # a backend that ended meanwhile
            pass
    return total


def machine_cpu() -> tuple[float, float]:
    """Busy and idle CPU seconds of the whole machine, all cores (``/proc/stat``)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    user, nice, system, idle, iowait, irq, softirq = fields
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, (idle + iowait) / tick


class Meter:
    """Who was busy during a measurement: the servers, PostgreSQL, the rest of the machine.

    ``start()`` and ``stop()`` bracket it; meanwhile a thread samples what the
    bench database's backends are doing (``pg_stat_activity``) every 20 ms.
    PostgreSQL publishes its commit counts about a second after a backend
    goes idle: ``start()`` and ``stop()`` wait that long first.
    """

    SETTLE_SECONDS = 1.2
    SAMPLE_SECONDS = 0.02

    def __init__(self, database: Database, server_pids: list[int]):
        self.database = database
        self.server_pids = server_pids
        self.states: Counter[str] = Counter()
        self._queries = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _commits(self, conn) -> int:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
            [self.database.name],
        ).fetchone()
        return row[0] - self._queries  # the sampler's own queries are transactions too

    def start(self) -> None:
        self._conn = self.database.connect()
        time.sleep(self.SETTLE_SECONDS)
        self._postgres = postgres_pids(self.database.name)
        self._commits_before = self._commits(self._conn)
        self._before = (
            cpu_of(self.server_pids),
            cpu_of(self._postgres),
            machine_cpu(),
            time.monotonic(),
        )
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with self.database.connect() as conn:
            me = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            while not self._stop.wait(self.SAMPLE_SECONDS):
                rows = conn.execute(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> %s AND backend_type = 'client backend' "
                    "AND state <> 'idle'",
                    [self.database.name, me],
                ).fetchall()
                self._queries += 1
                if not rows:
                    self.states["no transaction"] += 1
                for state, kind, event in rows:
                    self.states[state_name(state, kind, event)] += 1

    def stop(self) -> dict:
        """Busy cores of the servers, PostgreSQL and the machine; commits; backend states."""
        seconds = time.monotonic() - self._before[3]
        servers, postgres, machine = cpu_of(self.server_pids), cpu_of(self._postgres), machine_cpu()
        self._stop.set()
        self._thread.join()
        time.sleep(self.SETTLE_SECONDS)
        commits = self._commits(self._conn) - self._commits_before
        self._conn.close()
        busy, idle = (machine[i] - self._before[2][i] for i in (0, 1))
        total = sum(self.states.values()) or 1
        return {
            "seconds": seconds,
            "cores": os.cpu_count(),
            "server_cores": (servers - self._before[0]) / seconds,
            "postgres_cores": (postgres - self._before[1]) / seconds,
            "machine_cores": os.cpu_count() * busy / ((busy + idle) or 1),
            "commits": commits,
            "states": [(name, n / total) for name, n in self.states.most_common(4)],
            "load": os.getloadavg()[0],
        }


def state_name(state: str, kind: str | None, event: str | None) -> str:
    """A backend's state in words: what it waits for, or that it runs."""
    if state == "idle in transaction":
        return "idle in transaction (the server between statements)"
    if event == "ClientRead":
        return "reading COPY rows from the server"
    if kind is None:
        return "running"
    return f"{kind}:{event}"
