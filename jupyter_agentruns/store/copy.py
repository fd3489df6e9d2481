"""Copy a SQLite store into PostgreSQL: a team's runs, file after file, into one schema.

Everything goes as it is: run ids, every event byte for byte (its type, ts
and data), snapshots, Idempotency-Keys (a notebook run again replays its
runs), tombstones (a run retention deleted still answers 410) and answers not
yet taken by their run's server. Runs go in their submit order, SQLite's rowid
order becoming PostgreSQL's ``position`` (after the runs already there), so
the runs waiting in a session's queue keep their places.

Several files merge into one schema, each copy one transaction: a failure
leaves nothing of that file behind and the same command can simply be run
again. A run already there (the same id, owner, agent, input and creation
time) is skipped with all of its rows, whatever became of it there since: so
a second copy of a file changes nothing. A run deleted there (its tombstone)
is not brought back. A run id that is there as another run (another owner,
say) refuses the whole file: ids name one run, wherever it is kept. An
Idempotency-Key the target already has for another run of the same owner
stays with that run. Owners are kept, but for ``~shared``, the one owner of
a single-user server's runs: ``owner`` gives those to a user, as a hub's
per-user servers need (they show a run to its owner only).

Tables are streamed, a row at a time from SQLite into one ``COPY`` per table
that psycopg sends in buffers of tens of kilobytes: memory holds a row, a
few buffers and the ids of the file's runs, whatever the store's size.
Servers may use the target meanwhile: a copy takes no lock they wait for.

The source is opened read-only and never changed: it stays the way back. For
the same reason a file of an older schema is refused, not migrated (a
migration cannot be undone): starting this version's server on it once
migrates it, as an upgrade does anyway.

    jupyter agentruns copy --from agentruns.sqlite3 --to postgresql://… [--owner NAME]
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..settings import SHARED_OWNER
from .postgres import PostgresStore
from .sql import ACTIVE, TABLES, UNCLAIMED
from .sqlite import MIGRATIONS

# A progress line every this many rows of a table.
PROGRESS_ROWS = 100_000
# What makes a run the run it is: set at its submit, never changed after.
IDENTITY = ("owner", "agent", "created_at", "input", "session", "metadata", "retry_of")
# One copy into a schema at a time: two copies of one file would both find its runs new.
COPY_LOCK = 0x636F7079  # "copy"
# Tables copied with their runs, only for the runs this copy adds.
RUN_TABLES = ("events", "snapshots", "snapshot_parts", "input_answers")


class CopyRefused(Exception):
    """The copy was not made, and nothing was written: the message says why and what to do."""


@dataclass
class Copied:
    """What a copy wrote, and what of the file it found in the target already."""

    rows: dict[str, int] = field(default_factory=dict)
    runs_already_there: int = 0
    runs_deleted_there: int = 0
    keys_taken: int = 0
    shared_runs: int = 0  # runs of ~shared the copy added (given to ``owner`` when one was named)


def owner_problem(owner: str | None) -> str | None:
    """Why ``owner`` cannot take the runs of ``~shared`` (None: it can)."""
    if owner is None or (owner and owner == owner.strip() and not owner.startswith("~")):
        return None
    return f"--owner {owner!r} is not a user name: give the name of the user the runs belong to"


def copy_store(
    source_path: str | Path,
    target_url: str,
    *,
    force: bool = False,
    owner: str | None = None,
    progress: Callable[[str], Any] = print,
) -> Copied:
    """Copy the runs of the SQLite store at ``source_path`` into the PostgreSQL store at ``target_url``.

    ``owner`` takes the runs of ``~shared``. Raises ``CopyRefused``, with no
    run written, when the source is not a current store, holds active runs
    (unless ``force``), changed while it was copied, or holds a run whose id
    the target has for another run.
    """
    problem = owner_problem(owner)
    if problem:
        raise CopyRefused(problem)
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
                target.execute("SELECT pg_advisory_xact_lock(%s)", [COPY_LOCK])
                copied = _merge(source, target, store, Path(source_path), owner, progress)
                # Queries are planned on these tables' real sizes.
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
        + ", ".join(f"{count:,} {table.replace('_', ' ')}" for table, count in copied.rows.items())
    )
    _report(copied, owner, progress)
    if queued:
        progress(
            f"{_runs(queued)} waiting in a session's queue: "
            "the first server on PostgreSQL starts them, in their order"
        )
    if active:
        progress(
            f"copied {_counted(active)} with --force: the first server on PostgreSQL ends "
            "them interrupted once their lease runs out"
        )
    return copied


def _runs(count: int) -> str:
    return f"{count:,} run{'s' if count != 1 else ''}"


def _report(copied: Copied, owner: str | None, progress: Callable[[str], Any]) -> None:
    if copied.runs_already_there:
        progress(f"{_runs(copied.runs_already_there)} already there (copied before): skipped")
    if copied.runs_deleted_there:
        progress(f"{_runs(copied.runs_deleted_there)} deleted there: not brought back")
    if copied.keys_taken:
        progress(
            f"{copied.keys_taken:,} Idempotency-Key{'s' if copied.keys_taken != 1 else ''} "
            "already used there for another run of the same owner: kept for that run "
            "(the copied run is still found by its id)"
        )
    if copied.shared_runs and owner is not None:
        progress(f"{_runs(copied.shared_runs)} of {SHARED_OWNER} copied as {owner}'s")
    elif copied.shared_runs:
        progress(
            f"{_runs(copied.shared_runs)} copied as {SHARED_OWNER}'s, the one owner of a "
            "single-user server: servers in per-user owner mode (a hub's) show them to "
            "nobody. To give them to a user, copy the file into a new schema with --owner NAME."
        )


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


def _columns(source: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in source.execute(f"PRAGMA table_info({table})")]


def _quoted(columns: Iterable[str]) -> str:
    return ", ".join(f'"{name}"' for name in columns)


def _merge(
    source: sqlite3.Connection,
    target: Any,
    store: PostgresStore,
    path: Path,
    owner: str | None,
    progress: Callable[[str], Any],
) -> Copied:
    """Add the file's runs that the target lacks, with their rows: inside the caller's transaction."""
    copied = Copied()
    # The file's runs, keys and tombstones go first to tables of this
    # transaction's own, where they meet the target's in SQL.
    staged = {"runs": "copy_runs", "idempotency_keys": "copy_keys", "tombstones": "copy_tombstones"}
    for table, stage in staged.items():
        columns = _columns(source, table)
        target.execute(
            f"CREATE TEMP TABLE {stage} ON COMMIT DROP AS "
            f"SELECT {_quoted(columns)} FROM {table} WITH NO DATA"
        )
        if table == "runs":
            # Their submit order, and whether they were the shared owner's.
            target.execute(
                "ALTER TABLE copy_runs ADD COLUMN copy_order bigint, "
                "ADD COLUMN shared boolean NOT NULL DEFAULT false"
            )
            _stream(source, target, table, stage, columns, extra=("rowid", "copy_order"))
            target.execute(
                "UPDATE copy_runs SET shared = true, owner = coalesce(%s, owner) WHERE owner = %s",
                [owner, SHARED_OWNER],
            )
        else:
            _stream(source, target, table, stage, columns)
            if owner is not None:
                target.execute(
                    f"UPDATE {stage} SET owner = %s WHERE owner = %s", [owner, SHARED_OWNER]
                )
    _refuse_others(target, store, path)

    runs = _quoted(_columns(source, "runs"))
    target.execute("CREATE TEMP TABLE copy_new (run_id text PRIMARY KEY) ON COMMIT DROP")
    target.execute(
        f"""WITH added AS (
                INSERT INTO runs ({runs})
                SELECT {runs} FROM copy_runs AS c
                WHERE NOT EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = c.run_id)
                  AND NOT EXISTS (SELECT 1 FROM tombstones AS t WHERE t.run_id = c.run_id)
                ORDER BY c.copy_order
                RETURNING run_id
            )
            INSERT INTO copy_new SELECT run_id FROM added"""
    )
    # A run of the file that was not added is there already, or was deleted there.
    counts = target.execute(
        """SELECT count(n.run_id), count(*) FILTER (WHERE n.run_id IS NULL AND EXISTS
                      (SELECT 1 FROM runs AS r WHERE r.run_id = c.run_id)),
                  count(*) FILTER (WHERE n.run_id IS NULL AND NOT EXISTS
                      (SELECT 1 FROM runs AS r WHERE r.run_id = c.run_id)),
                  count(n.run_id) FILTER (WHERE c.shared)
           FROM copy_runs AS c LEFT JOIN copy_new AS n USING (run_id)"""
    ).fetchone()
    (
        copied.rows["runs"],
        copied.runs_already_there,
        copied.runs_deleted_there,
        copied.shared_runs,
    ) = counts
    progress(f"runs: {copied.rows['runs']:,} copied")

    added = {run_id for (run_id,) in target.execute("SELECT run_id FROM copy_new")}
    for table in RUN_TABLES:
        copied.rows[table] = _stream(
            source, target, table, table, _columns(source, table), progress=progress, runs=added
        )

    # A key goes with its run, or alone when its run is in neither store (deleted,
    # the key kept for its lifetime); one the owner uses there already stays that run's.
    (copied.keys_taken,) = target.execute(
        """SELECT count(*) FROM copy_keys AS c JOIN idempotency_keys AS k USING (owner, key)
           WHERE c.run_id IN (SELECT run_id FROM copy_new)"""
    ).fetchone()
    keys = _quoted(_columns(source, "idempotency_keys"))
    copied.rows["idempotency_keys"] = target.execute(
        f"""INSERT INTO idempotency_keys ({keys}) SELECT {keys} FROM copy_keys AS c
            WHERE c.run_id IN (SELECT run_id FROM copy_new)
               OR NOT EXISTS (SELECT 1 FROM copy_runs AS r WHERE r.run_id = c.run_id)
            ON CONFLICT DO NOTHING"""
    ).rowcount
    # A tombstone never hides a run the target holds.
    tombstones = _quoted(_columns(source, "tombstones"))
    copied.rows["tombstones"] = target.execute(
        f"""INSERT INTO tombstones ({tombstones}) SELECT {tombstones} FROM copy_tombstones AS c
            WHERE NOT EXISTS (SELECT 1 FROM runs AS r WHERE r.run_id = c.run_id)
            ON CONFLICT DO NOTHING"""
    ).rowcount
    for table in ("idempotency_keys", "tombstones"):
        progress(f"{table}: {copied.rows[table]:,} copied")
    _merge_hooks(source, target, owner, copied, added, progress)
    _merge_schedules(source, target, owner, copied, progress)
    copied.rows = {table: copied.rows[table] for table in TABLES}
    return copied


def _merge_hooks(
    source: sqlite3.Connection,
    target: Any,
    owner: str | None,
    copied: Copied,
    added: set[str],
    progress: Callable[[str], Any],
) -> None:
    """The users' webhooks the target lacks, and the deliveries of the runs this copy adds.

    The servers' own webhooks (owner NULL) are not copied: the target's
    servers make their configuration's the store's at their start.
    """
    _merge_owned(
        source, target, owner, copied, progress, "webhooks", "hook_id", "owner IS NOT NULL"
    )
    copied.rows["webhook_deliveries"] = _stream(
        source,
        target,
        "webhook_deliveries",
        "webhook_deliveries",
        _columns(source, "webhook_deliveries"),
        progress=progress,
        runs=added,
    )


def _merge_schedules(
    source: sqlite3.Connection,
    target: Any,
    owner: str | None,
    copied: Copied,
    progress: Callable[[str], Any],
) -> None:
    """The schedules the target lacks, each with its last slot: a copied schedule
    goes on from where its file's servers left it, never runs a slot twice."""
    _merge_owned(source, target, owner, copied, progress, "schedules", "schedule_id", "TRUE")


def _merge_owned(
    source: sqlite3.Connection,
    target: Any,
    owner: str | None,
    copied: Copied,
    progress: Callable[[str], Any],
    table: str,
    key: str,
    kept: str,
) -> None:
    """The rows of ``table`` the target lacks (by ``key``) among those where ``kept`` holds,
    with the file's shared owner made ``owner`` as for its runs."""
    columns = _columns(source, table)
    target.execute(
        f"CREATE TEMP TABLE copy_{table} ON COMMIT DROP AS "
        f"SELECT {_quoted(columns)} FROM {table} WITH NO DATA"
    )
    _stream(source, target, table, f"copy_{table}", columns)
    if owner is not None:
        target.execute(
            f"UPDATE copy_{table} SET owner = %s WHERE owner = %s", [owner, SHARED_OWNER]
        )
    copied.rows[table] = target.execute(
        f"INSERT INTO {table} ({_quoted(columns)}) SELECT {_quoted(columns)} FROM copy_{table} "
        f"WHERE {kept} ON CONFLICT ({key}) DO NOTHING"
    ).rowcount
    progress(f"{table}: {copied.rows[table]:,} copied")


def _refuse_others(target: Any, store: PostgresStore, path: Path) -> None:
    """Refuse a file with a run whose id the target has for another run, or another owner's tombstone."""
    pairs = ", ".join(f'c."{name}", r."{name}"' for name in IDENTITY)
    differs = " OR ".join(f'c."{name}" IS DISTINCT FROM r."{name}"' for name in IDENTITY)
    others: list[tuple[Any, tuple[str, ...], Any]] = [
        (run_id, IDENTITY, values)
        for run_id, *values in target.execute(
            f"""SELECT c.run_id, {pairs} FROM copy_runs AS c JOIN runs AS r USING (run_id)
                WHERE {differs} ORDER BY c.copy_order LIMIT 3"""
        )
    ]
    others += [
        (run_id, ("owner",), values)
        for run_id, *values in target.execute(
            """SELECT c.run_id, c.owner, t.owner FROM copy_runs AS c
               JOIN tombstones AS t USING (run_id)
               WHERE c.owner IS DISTINCT FROM t.owner ORDER BY c.copy_order LIMIT 3"""
        )
    ]
    if not others:
        return
    examples = []
    for run_id, names, values in others[:3]:
        differences = "; ".join(
            f"{name} {there!r} there, {here!r} here"
            for name, here, there in zip(names, values[0::2], values[1::2], strict=True)
            if here != there
        )
        examples.append(f"{run_id} ({differences})")
    raise CopyRefused(
        f"{path} holds runs whose ids {store.describe()} has for other runs: "
        + ", ".join(examples)
        + ". A run id names one run wherever it is kept: was the file copied there before "
        "with another --owner? Nothing of the file was copied. Copy it as it was copied "
        "then, or into another schema (?schema=NAME)."
    )


def _stream(
    source: sqlite3.Connection,
    target: Any,
    table: str,
    into: str,
    columns: list[str],
    *,
    extra: tuple[str, str] | None = None,
    progress: Callable[[str], Any] | None = None,
    runs: set[str] | None = None,
) -> int:
    """COPY the table's rows (of ``runs`` only, when given) into the target's table ``into``.

    ``extra`` is one more value read (an SQLite expression) and the column it goes to.
    """
    # Runs in their submit order, the rest by their key.
    order = "rowid" if table == "runs" else TABLES[table]
    selected, copied_into = _quoted(columns), _quoted(columns)
    if extra is not None:
        selected += f", {extra[0]}"
        copied_into += f', "{extra[1]}"'
    position = columns.index("run_id") if runs is not None else -1
    total = source.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    rows = source.execute(f"SELECT {selected} FROM {table} ORDER BY {order}")
    started = time.monotonic()
    count = read = 0
    with target.cursor() as cursor:
        with cursor.copy(f"COPY {into} ({copied_into}) FROM STDIN") as copy:
            for row in rows:
                read += 1
                if runs is None or row[position] in runs:
                    copy.write_row(row)
                    count += 1
                if progress is not None and read % PROGRESS_ROWS == 0:
                    rate = read / max(time.monotonic() - started, 1e-6)
                    progress(f"{table}: {read:,} of {total:,} ({rate:,.0f}/s)")
    if progress is not None:
        rate = count / max(time.monotonic() - started, 1e-6)
        progress(f"{table}: {count:,} copied" + (f" ({rate:,.0f}/s)" if count else ""))
    return count
