"""The commands that work on the store itself, with no server: gc, doctor, migrate and copy.

For gc, doctor and migrate, the store is the one a server started here would use:
``c.AgentRuns.*`` from the Jupyter configuration files (and
``AGENTRUNS_STORE_URL``), unless ``--db`` or ``--store-url`` names another.
Both stores are safe to share between processes (SQLite in WAL mode,
PostgreSQL), so they may run while servers use the same store; migrate
changes the schema, for servers of its own version. copy moves
a SQLite file's runs into PostgreSQL, with the file's servers stopped; the
files of several servers merge into one schema (see ``store/copy.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from jupyter_core.application import JupyterApp
from traitlets import TraitError
from traitlets.config import Config

from .. import __version__
from ..broadcaster import Broadcaster
from ..compaction import Compactor
from ..reader import Reader
from ..settings import Settings, from_config
from ..store import Store, StoreBusy, StoreUnavailable, UnsafeStore, factory
from ..store.copy import CopyRefused, copy_store, owner_problem
from ..store.filesystems import network_filesystem
from ..store.postgres import BadStoreUrl, StoreUrl, psycopg
from ..writer import Writer
from . import exits
from .exits import CliError
from .output import printable
from .remote import print_json

# A pass compacts at most 100 runs and deletes at most 1000: a backlog takes
# several. A bound all the same, for a store a busy server keeps refilling.
MAX_PASSES = 10000

log = logging.getLogger("jupyter_agentruns.cli")


class _ServerConfigFiles(JupyterApp):
    """Reads the configuration files a ``jupyter server`` reads (and nothing of its command line)."""

    name = "jupyter-agentruns"
    config_file_name = "jupyter_server_config"


def server_config() -> Config:
    """``c.*`` from ``jupyter_config`` and ``jupyter_server_config`` (.py, .json) in Jupyter's config path."""
    files = _ServerConfigFiles()
    files.load_config_file(suppress_errors=False)
    return files.config


def configured_settings(db: str | None, store_url: str | None) -> Settings:
    """The ``c.AgentRuns`` settings a server here would have, with ``--db``/``--store-url`` on top."""
    if store_url is not None:
        try:
            StoreUrl(store_url.strip())
        except BadStoreUrl as error:
            raise CliError(f"--store-url {error}", exits.USAGE) from None
    try:
        config = server_config()
        if db is not None:
            config.AgentRuns.db_path = db
            config.AgentRuns.store_url = ""  # --db chooses SQLite, whatever the environment says
        if store_url is not None:
            config.AgentRuns.store_url = store_url
        found = from_config(config)
    except (TraitError, ValueError, SyntaxError) as error:
        raise CliError(f"the Jupyter configuration is wrong: {error}", exits.CONFIG) from None
    if found.store_url:
        try:
            StoreUrl(found.store_url)
        except BadStoreUrl as error:
            raise CliError(
                f"the configuration is wrong: {found.store_url_source} {error}", exits.CONFIG
            ) from None
    return found


def kind(settings: Settings) -> str:
    return "postgresql" if settings.store_url else "sqlite"


def open_store(settings: Settings) -> Store:
    """The store, not yet connected; a store that cannot be opened says why.

    Nothing is created or migrated: ``schema_version`` says first whether
    this package and the store agree (``connect()`` migrates).
    """
    try:
        return factory.open_store(settings, migrate=False)
    except UnsafeStore as error:
        raise CliError(str(error), exits.UNAVAILABLE) from None
    except Exception as error:
        raise CliError(
            f"the store at {factory.location(settings)} cannot be opened: "
            f"{factory.without_secrets(settings, str(error))}",
            exits.UNAVAILABLE,
        ) from None


def stored_schema(opened: Store, settings: Settings) -> int:
    """The store's schema version, read without migrating it."""
    try:
        return opened.schema_version()
    except Exception as error:
        raise CliError(
            f"the store at {opened.describe()} cannot be read: "
            f"{factory.without_secrets(settings, str(error))}",
            exits.UNAVAILABLE,
        ) from None


def schema_problem(stored: int, known: int) -> str | None:
    """What is wrong when the store's schema is not this package's: None when it is.

    An older one is left to the servers: they migrate it at their start, and
    a store migrated here would change beneath the older servers using it.
    """
    if stored < known:
        return (
            f"the store has schema version {stored}, this package knows {known}: a server of "
            "this version migrates it at its start, or jupyter agentruns migrate does (this "
            "command does not)"
        )
    if stored > known:
        return (
            f"the store has schema version {stored}, newer than this package knows ({known}): "
            "a newer jupyter_agentruns wrote it; upgrade this package"
        )
    return None


# gc --------------------------------------------------------------------------


async def collect(opened: Store, settings: Settings, on_pass) -> dict[str, int]:
    """Retention now, pass after pass until nothing is due: the server's own compactor, here.

    ``on_pass(totals)`` after each pass (the progress display).
    """
    loop = asyncio.get_running_loop()
    reader = Reader(opened)
    writer = Writer(opened, loop, lambda appended, refused: None, log)
    compactor = Compactor(
        writer=writer,
        reader=reader,
        broadcaster=Broadcaster(reader),  # no channels: no run is executed here
        settings=settings,
        on_deleted=lambda run_id: None,
    )
    totals = {"runs_deleted": 0, "runs_compacted": 0, "events_compacted": 0}
    try:
        for _ in range(MAX_PASSES):
            counts = await compactor.run_once()
            totals["runs_deleted"] += counts["deleted"]
            totals["runs_compacted"] += counts["compacted"]
            totals["events_compacted"] += counts["events"]
            on_pass(totals)
            if not counts["deleted"] and not counts["compacted"]:
                break
    finally:
        await loop.run_in_executor(None, writer.close)
        await loop.run_in_executor(None, reader.close)
    return totals


def gc_summary(totals: dict[str, int]) -> str:
    return (
        f"{totals['runs_deleted']:,} runs deleted, {totals['events_compacted']:,} events "
        f"compacted in {totals['runs_compacted']:,} runs"
    )


def cmd_gc(args, out: TextIO) -> int:
    configured = configured_settings(args.db, args.store_url)
    opened = None
    if kind(configured) == "postgresql" or Path(configured.db_path).exists():
        opened = open_store(configured)
    stored = stored_schema(opened, configured) if opened is not None else 0
    where = factory.location(configured)
    if stored == 0:
        totals = {"runs_deleted": 0, "runs_compacted": 0, "events_compacted": 0}
        if args.json:
            print_json({"store": where, **totals}, out)
        else:
            out.write(f"no store at {where} yet: nothing to collect\n")
        return exits.OK
    assert opened is not None  # a schema was read from it
    problem = schema_problem(stored, opened.schema_versions_known)
    if problem:
        raise CliError(f"{problem}; gc leaves it as it is", exits.UNAVAILABLE)
    progress = sys.stderr.isatty() and not args.json

    def on_pass(totals: dict[str, int]) -> None:
        if progress:
            sys.stderr.write(f"\rcollecting: {gc_summary(totals)}…")
            sys.stderr.flush()

    totals = asyncio.run(collect(opened, configured, on_pass))
    if progress:
        sys.stderr.write("\r\033[K")
    if args.json:
        print_json({"store": where, **totals}, out)
    else:
        out.write(gc_summary(totals) + "\n")
    return exits.OK


# doctor ----------------------------------------------------------------------


def versions() -> dict[str, str]:
    import jupyter_server

    return {
        "jupyter_agentruns": __version__,
        "jupyter_server": jupyter_server.__version__,
        "python": platform.python_version(),
    }


def expired_leases(opened: Store, now: float) -> list[dict[str, Any]]:
    """Unfinished runs no live server holds: their executor's lease ran out (or was handed over)."""
    conn = opened.connect()
    try:
        rows = conn.expired_active_runs(now)
    finally:
        conn.close()
    return [
        {
            "run_id": row["run_id"],
            "status": row["status"],
            "agent": row["agent"],
            "owner": row["owner"],
            "lease_expired_seconds_ago": (
                round(now - expires, 1) if (expires := row["lease_expires"]) else None
            ),
            "handed_over": row["executor_id"] is None,
        }
        for row in rows
    ]


def diagnose(configured: Settings) -> dict[str, Any]:
    """Everything doctor reports, with ``problems``: one line each, saying what to do."""
    report: dict[str, Any] = {
        "store": {"kind": kind(configured), "location": factory.location(configured)},
        "versions": versions(),
        "problems": [],
    }
    problems = report["problems"]
    if kind(configured) == "sqlite":
        fstype = network_filesystem(configured.db_path)
        report["store"]["network_filesystem"] = fstype
        report["store"]["exists"] = Path(configured.db_path).exists()
        if fstype:
            problems.append(
                f"the SQLite file is on a network file system ({fstype}): servers refuse it; "
                "set c.AgentRuns.db_path to a local disk, or c.AgentRuns.store_url to PostgreSQL"
            )
            return report
        if not report["store"]["exists"]:
            report["note"] = "no store yet: the first server started here creates it"
            return report
    try:
        opened = open_store(configured)
        stored = stored_schema(opened, configured)
        if stored == 0:
            report["note"] = "no store yet: the first server started here creates it"
            return report
        report["schema_version"] = stored
        report["schema_versions_known"] = opened.schema_versions_known
        problem = schema_problem(stored, opened.schema_versions_known)
        if problem:
            problems.append(problem)
            report["note"] = "runs and leases not read: the store's schema is not this package's"
            return report
        conn = opened.connect()
        try:
            found = conn.diagnostics()
        finally:
            conn.close()
        report["versions"].update(found.pop("versions"))
        report.update(found)
        report["expired_leases"] = expired_leases(opened, time.time())
    except CliError as error:
        problems.append(str(error))
        return report
    except Exception as error:
        problems.append(
            f"the store cannot be read: {type(error).__name__}: "
            f"{factory.without_secrets(configured, str(error))}"
        )
        return report
    for lease in report["expired_leases"]:
        problems.append(
            f"run {lease['run_id']} is {lease['status']} but no server executes it "
            "(its server's lease expired): start a server on this store, which takes it over "
            "or ends it interrupted"
        )
    return report


def doctor_text(report: dict[str, Any]) -> str:
    store = report["store"]
    lines = [f"store      {store['kind']} {store['location']}"]
    if store["kind"] == "sqlite":
        lines.append(f"filesystem {store.get('network_filesystem') or 'local'}")
    if "note" in report:
        lines.append(f"note       {report['note']}")
    if "schema_version" in report:
        lines.append(
            f"schema     version {report['schema_version']} "
            f"(this package knows up to {report['schema_versions_known']})"
        )
    if "runs_by_status" in report:
        counts = report["runs_by_status"]
        runs = ", ".join(f"{n:,} {status}" for status, n in sorted(counts.items())) or "none"
        lines.append(f"runs       {runs}")
        lines.append(f"leases     {len(report.get('expired_leases', []))} expired")
    lines.append(
        "versions   " + ", ".join(f"{name} {value}" for name, value in report["versions"].items())
    )
    for problem in report["problems"]:
        lines.append(f"problem    {problem}")
    if not report["problems"]:
        lines.append("ok")
    return "\n".join(lines)


def cmd_doctor(args, out: TextIO) -> int:
    report = diagnose(configured_settings(args.db, args.store_url))
    if args.json:
        print_json(report, out)
    else:
        out.write(printable(doctor_text(report)) + "\n")  # runs' fields are the store's text
    return exits.FAILED if report["problems"] else exits.OK


# migrate ---------------------------------------------------------------------


def cmd_migrate(args, out: TextIO) -> int:
    configured = configured_settings(args.db, args.store_url)
    opened = open_store(configured)
    where = factory.location(configured)
    known = opened.schema_versions_known
    before = stored_schema(opened, configured)
    if before > known:
        raise CliError(
            f"{schema_problem(before, known)}; migrate leaves it as it is", exits.UNAVAILABLE
        )
    if before < known:
        try:
            opened.migrate()
        except Exception as error:
            raise CliError(
                f"the store at {where} could not be migrated, and is left as it was: "
                f"{factory.without_secrets(configured, str(error))}",
                exits.UNAVAILABLE,
            ) from None
    after = stored_schema(opened, configured)
    if args.json:
        print_json({"store": where, "schema_version_before": before, "schema_version": after}, out)
    elif before == after:
        out.write(f"the store at {where} is up to date: schema version {after}\n")
    elif before == 0:
        out.write(f"created the store at {where}: schema version {after}\n")
    else:
        out.write(f"migrated the store at {where} from schema version {before} to {after}\n")
    return exits.OK


# copy ------------------------------------------------------------------------


def cmd_copy(args, out: TextIO) -> int:
    given = args.target is not None
    url = (args.target if given else os.environ.get("AGENTRUNS_STORE_URL", "")).strip()
    if not url:
        raise CliError(
            "--to URL is needed (or AGENTRUNS_STORE_URL): the store to copy into", exits.USAGE
        )
    try:
        target = StoreUrl(url)
    except BadStoreUrl as error:
        if given:
            raise CliError(f"--to {error}", exits.USAGE) from None
        raise CliError(
            f"the environment variable AGENTRUNS_STORE_URL {error}", exits.CONFIG
        ) from None
    problem = owner_problem(args.owner)
    if problem:
        raise CliError(problem, exits.USAGE)
    # With --json, standard output is the result alone.
    said = sys.stderr if args.json else out

    def progress(line: str) -> None:
        said.write(line + "\n")
        said.flush()

    failures: tuple[type[Exception], ...] = (
        StoreBusy, sqlite3.Error, OSError, RuntimeError, ValueError
    )  # fmt: skip
    if psycopg is not None:
        failures += (psycopg.Error,)
    try:
        copied = copy_store(args.source, url, force=args.force, owner=args.owner, progress=progress)
    except CopyRefused as error:
        raise CliError(f"refused: {target.scrub(str(error))}", exits.FAILED) from None
    except StoreUnavailable as error:
        raise CliError(
            f"{target.scrub(str(error))}; nothing was copied", exits.UNAVAILABLE
        ) from None
    except failures as error:
        raise CliError(
            f"the copy failed: {target.scrub(str(error))}. It is one transaction, so nothing "
            "of it was kept: run it again once this is fixed.",
            exits.FAILED,
        ) from None
    if args.json:
        print_json(
            {
                "from": args.source,
                "to": target.describe(),
                "copied": copied.rows,
                "skipped": {
                    "runs_already_there": copied.runs_already_there,
                    "runs_deleted_there": copied.runs_deleted_there,
                    "keys_taken": copied.keys_taken,
                },
            },
            out,
        )
    return exits.OK


# STORE_COMMANDS of the parser
COMMANDS = {"gc": cmd_gc, "doctor": cmd_doctor, "migrate": cmd_migrate, "copy": cmd_copy}
