"""The test's store opened behind the server's back, SQLite or PostgreSQL alike.

Tests look at what is committed (or plant what another server would have)
with plain SQL. ``connect(target)`` takes a SQLite path or a store URL and
answers DB-API calls with ``?`` placeholders on both, every statement
committed on its own unless the test says ``BEGIN``.
"""

from __future__ import annotations

import sqlite3
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


def target(engine_or_app: Any) -> str:
    """Where the server keeps its runs: its store URL, else its SQLite file."""
    settings = getattr(engine_or_app, "settings", engine_or_app)
    return settings.store_url or settings.db_path


def connect(where: str):
    if str(where).startswith("postgres"):
        return PostgresConnection(where)
    return sqlite3.connect(where, isolation_level=None)  # autocommit, as the PostgreSQL one


class PostgresConnection:
    """Enough of sqlite3's connection for the tests: autocommit, ``?`` placeholders."""

    def __init__(self, url: str):
        import psycopg

        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        schema = query.pop("schema", "agentruns")
        conninfo = urlunsplit(parts._replace(query=urlencode(query)))
        self._conn = psycopg.connect(conninfo, autocommit=True, options=f"-c search_path={schema}")

    def execute(self, sql: str, params: Any = ()):
        if sql.strip().upper() == "BEGIN":
            # What SQLite's BEGIN gives a reader: one snapshot for the whole transaction.
            sql = "BEGIN ISOLATION LEVEL REPEATABLE READ"
        elif sql.strip().upper() == "BEGIN IMMEDIATE":
            sql = "BEGIN"  # a writer: row locks and unique keys do the rest
        return self._conn.execute(sql.replace("?", "%s"), params or None)

    def executemany(self, sql: str, rows: Any):
        with self._conn.cursor() as cursor:
            cursor.executemany(sql.replace("?", "%s"), rows)

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass  # as sqlite3's: the end of a transaction (here every statement commits), not a close
