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

    python -m jupyter_agentruns.store.copy --from agentruns.sqlite3 --to postgresql://…
"""

from __future__ import annotations

import argparse
import functools
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..lifecycle import ACTIVE_STATUSES
from . import StoreBusy
from .postgres import BadStoreUrl, PostgresStore, StoreUrl, psycopg
from .sql import UNCLAIMED
from .sqlite import MIGRATIONS

# Every table of the store, each read in the order its rows are written in:
# runs in submit order (their position), the others in their key's order.
TABLES = (
    ("runs", "rowid"),
    ("events", "run_id, seq"),
    ("snapshots", "run_id"),
    ("snapshot_parts", "run_id, part"),
    ("idempotency_keys", "owner, key"),
    ("tombstones", "run_id"),
    ("input_answers", "run_id, request_id"),
)
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
                target.execute(f"LOCK TABLE {', '.join(t for t, _ in TABLES)} IN EXCLUSIVE MODE")
                _refuse_used(source, target, store)
                counts = {
                    table: _copy_table(source, target, table, order, progress)
                    for table, order in TABLES
                }
                # The first server's queries are planned on these tables' real sizes.
                target.execute(f"ANALYZE {', '.join(t for t, _ in TABLES)}")
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
    placeholders = ",".join("?" for _ in ACTIVE_STATUSES)
    rows = source.execute(
        f"SELECT status, count(*) FROM runs WHERE status IN ({placeholders}) "
        "AND executor_id IS NOT NULL GROUP BY status ORDER BY status",
        ACTIVE_STATUSES,
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
        for table, _ in TABLES
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
    source: sqlite3.Connection,
    target: Any,
    table: str,
    order: str,
    progress: Callable[[str], Any],
) -> int:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_agentruns.store.copy",
        description=(
            "Copy every run of a SQLite agentruns store into a PostgreSQL one, once: run ids, "
            "events (byte for byte), snapshots, Idempotency-Keys, tombstones, in submit order. "
            "The copy is one transaction: it is all there or none of it, and a failed copy "
            "can be run again."
        ),
        epilog=(
            "Stop every server using the SQLite file first. The file is opened read-only and "
            "never changed. The target schema must be empty; it is created if missing. "
            "Then set c.AgentRuns.store_url (or AGENTRUNS_STORE_URL) to the same URL and "
            "start the servers. Exit status: 0 copied, 1 refused or failed (the reason on "
            "stderr; nothing of the copy is kept), 2 wrong arguments."
        ),
    )
    parser.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="PATH",
        help="the SQLite file the servers used (their c.AgentRuns.db_path)",
    )
    parser.add_argument(
        "--to",
        dest="target",
        default=os.environ.get("AGENTRUNS_STORE_URL"),
        metavar="URL",
        help="postgresql://user:password@host:port/database?schema=NAME, an empty schema "
        "(default: $AGENTRUNS_STORE_URL)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="copy active runs too (their server was killed before it could end them): the "
        "first server on PostgreSQL ends them interrupted",
    )
    args = parser.parse_args(argv)
    if not args.target:
        parser.error("--to URL is required (or set AGENTRUNS_STORE_URL)")
    try:
        target = StoreUrl(args.target)
    except BadStoreUrl as exc:
        parser.error(f"--to (or AGENTRUNS_STORE_URL) {exc}")
    failures: tuple[type[Exception], ...] = (
        StoreBusy, sqlite3.Error, OSError, RuntimeError, ValueError
    )  # fmt: skip
    if psycopg is not None:
        failures += (psycopg.Error,)
    try:
        copy_store(
            args.source,
            args.target,
            force=args.force,
            progress=functools.partial(print, flush=True),
        )
    except CopyRefused as exc:
        print(f"refused: {target.scrub(str(exc))}", file=sys.stderr)
        return 1
    except failures as exc:
        print(
            f"the copy failed: {target.scrub(str(exc))}. It is one "
            "transaction, so nothing of it was kept: run it again once this is fixed.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
