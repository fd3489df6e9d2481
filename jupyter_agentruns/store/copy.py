"""Copy a SQLite store into PostgreSQL, once, for a team moving its runs there.

Everything goes as it is: run ids, every event byte for byte (its type, ts
and data), snapshots, Idempotency-Keys (a notebook run again replays its
runs), tombstones (a run retention deleted still answers 410) and answers not
yet taken by their run's server. Runs go in their submit order, SQLite's rowid
order becoming PostgreSQL's ``position``, so the runs waiting in a session's
queue keep their places.

The copy is one transaction on PostgreSQL: a failure leaves nothing behind
and the same command can simply be run again. It goes into an empty schema
only, so that no run is ever mixed with another store's and a second copy
cannot double the first. Tables are streamed, a row at a time from SQLite
into one ``COPY`` per table that psycopg sends in buffers of tens of
kilobytes: memory holds a row and a few buffers whatever the store's size.

The source is opened read-only and never changed: it stays the way back. For
the same reason a file of an older schema is refused, not migrated (a
migration cannot be undone): starting this version's server on it once
migrates it, as an upgrade does anyway.

    jupyter agentruns copy --from agentruns.sqlite3 --to postgresql://…
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .postgres import PostgresStore
from .sql import ACTIVE, TABLES, UNCLAIMED
from .sqlite import MIGRATIONS

# A progress line every this many rows of a table.
PROGRESS_ROWS = 100_000


class CopyRefused(Exception):
    """The copy was not made, and nothing was written: the message says why and what to do."""


def copy_store(
    source_path: str | Path,
    target_url: str,
    *,
    force: bool = False,
    progress: Callable[[str], Any] = print,
) -> dict[str, int]:
    """Copy the SQLite store at ``source_path`` into the empty PostgreSQL store at ``target_url``.

    Returns the rows copied per table. Raises ``CopyRefused``, with no run
    written, when the source is not a current store, holds active runs
    (unless ``force``), changed while it was copied, or the target is not empty.
    """
    started = time.monotonic()
    source = _open_source(Path(source_path))
    try:
        # One read transaction: the copy is of one moment of the file.
        source.execute("BEGIN")
        version = source.execute("PRAGMA data_version").fetchone()[0]
        active = _active_runs(source)
        (queued,) = source.execute(f"SELECT count(*) FROM runs WHERE {UNCLAIMED}").fetchone()
        if active and not force:
            raise CopyRefused(
                f"{source_path} holds {_counted(active)}: a server still executes them, or "
                "was killed before it could end them. Stop every server using the file (a "
                "clean stop ends their runs) and copy again. Or copy them as they are with "
                "--force: the first server on PostgreSQL then ends them interrupted once "
                "their lease runs out."
            )
        store = PostgresStore(target_url)
        progress(f"copying {source_path} to {store.describe()}")
        target = store.open()
        try:
            with target.transaction():
                # Servers already on the target wait: the schema is empty only if it stays so.
                target.execute(f"LOCK TABLE {', '.join(TABLES)} IN EXCLUSIVE MODE")
                _refuse_used(source, target, store)
                counts = {table: _copy_table(source, target, table, progress) for table in TABLES}
                # The first server's queries are planned on these tables' real sizes.
                target.execute(f"ANALYZE {', '.join(TABLES)}")
                source.execute("COMMIT")
                if source.execute("PRAGMA data_version").fetchone()[0] != version:
                    raise CopyRefused(
                        f"{source_path} changed while it was copied: a server still uses it. "
                        "Stop every server using the file and copy again."
                    )
        finally:
            target.close()
    finally:
        source.close()
    seconds = time.monotonic() - started
    progress(
        f"copied in {seconds:.1f} s: "
        + ", ".join(f"{count:,} {table.replace('_', ' ')}" for table, count in counts.items())
    )
    if queued:
        progress(
            f"{queued:,} run{'s' if queued != 1 else ''} waiting in a session's queue: "
            "the first server on PostgreSQL starts them, in their order"
        )
    if active:
        progress(
            f"copied {_counted(active)} with --force: the first server on PostgreSQL ends "
            "them interrupted once their lease runs out"
        )
    return counts


def _open_source(path: Path) -> sqlite3.Connection:
    """The SQLite store read-only, once its schema is known to be this version's."""
    if not path.is_file():
        raise CopyRefused(f"{path} is not a file: give --from the server's c.AgentRuns.db_path")
    uri = f"file:{quote(path.resolve().as_posix())}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise CopyRefused(f"{path} is not a SQLite database ({exc})") from exc
    current = len(MIGRATIONS)
    problem = None
    if version == 0 or "runs" not in tables:
        problem = f"{path} is not an agentruns store (it has no runs table)"
    elif version < current:
        problem = (
            f"{path} has schema version {version}, older than this jupyter_agentruns's "
            f"({current}). The copy never changes its source, so it does not migrate it: "
            "start this version's server on the file once (it migrates it), stop it, and "
            "copy again."
        )
    elif version > current:
        problem = (
            f"{path} has schema version {version}, newer than this jupyter_agentruns knows "
            f"({current}): upgrade the package and copy again."
        )
    if problem:
        conn.close()
        raise CopyRefused(problem)
    return conn


def _active_runs(source: sqlite3.Connection) -> dict[str, int]:
    """Runs a server executes, or executed until it was killed: ``{status: count}``.

    Not the runs no server holds: those waiting in their session's queue, and
    resumable runs a clean stop handed over; the next server starts them or
    takes them over.
    """
    rows = source.execute(
        f"SELECT status, count(*) FROM runs WHERE status IN {ACTIVE} "
        "AND executor_id IS NOT NULL GROUP BY status ORDER BY status"
    ).fetchall()
    return dict(rows)


def _counted(active: dict[str, int]) -> str:
    total = sum(active.values())
    statuses = ", ".join(f"{count} {status}" for status, count in active.items())
    return f"{total} active run{'s' if total != 1 else ''} ({statuses})"


def _refuse_used(source: sqlite3.Connection, target: Any, store: PostgresStore) -> None:
    """Refuse a target holding anything: a copy goes into an empty schema only."""
    used = [
        table
        for table in TABLES
        if target.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()[0]
    ]
    if not used:
        return
    runs = target.execute("SELECT count(*) FROM runs").fetchone()[0]
    first = source.execute("SELECT run_id FROM runs ORDER BY rowid LIMIT 1").fetchone()
    copied = (
        first is not None
        and target.execute("SELECT 1 FROM runs WHERE run_id = %s", first).fetchone() is not None
    )
    raise CopyRefused(
        f"{store.describe()} is not empty ({runs:,} runs; rows in {', '.join(used)})"
        + ("; it holds this file's runs: they were copied already" if copied else "")
        + ". A copy goes into an empty schema only, so that no run is mixed with another "
        "store's: name a new schema in the URL (?schema=NAME), or drop this one if nothing "
        "in it is needed."
    )


def _copy_table(
    source: sqlite3.Connection, target: Any, table: str, progress: Callable[[str], Any]
) -> int:
    # Runs in their submit order (SQLite's rowid becomes PostgreSQL's position), the rest by key.
    order = "rowid" if table == "runs" else TABLES[table]
    columns = [row[1] for row in source.execute(f"PRAGMA table_info({table})")]
    names = ", ".join(f'"{name}"' for name in columns)
    total = source.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    rows = source.execute(f"SELECT {names} FROM {table} ORDER BY {order}")
    started = time.monotonic()
    count = 0
    with target.cursor() as cursor:
        with cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
                count += 1
                if count % PROGRESS_ROWS == 0:
                    rate = count / max(time.monotonic() - started, 1e-6)
                    progress(f"{table}: {count:,} of {total:,} ({rate:,.0f}/s)")
    rate = count / max(time.monotonic() - started, 1e-6)
    progress(f"{table}: {count:,} copied" + (f" ({rate:,.0f}/s)" if count else ""))
    return count
