"""Opening the store a server is configured with: the one way the server, the CLI and the benchmarks do."""

from __future__ import annotations

from ..settings import Settings
from . import Store, UnsafeStore
from .filesystems import network_filesystem
from .postgres import BadStoreUrl, PostgresStore, StoreUrl
from .sqlite import SQLiteStore


def open_store(settings: Settings, *, migrate: bool = True) -> Store:
    """The store ``settings`` name: PostgreSQL at ``store_url``, else SQLite at ``db_path``.

    What the server, the command line and the benchmarks open. ``migrate``
    False: nothing is created or migrated before the first ``connect()``.
    Raises ``UnsafeStore`` for a store URL that cannot be used (naming the
    setting, never the URL) or a SQLite file on a network file system.
    """
    if settings.store_url:
        try:
            StoreUrl(settings.store_url)
        except BadStoreUrl as exc:
            raise UnsafeStore(f"{settings.store_url_source} {exc}") from None
        return PostgresStore(settings.store_url)
    if fstype := network_filesystem(settings.db_path):
        raise UnsafeStore(
            f"the agentruns SQLite file {settings.db_path} is on a network file system "
            f"({fstype}), where SQLite's locking is unsafe and a database can be corrupted: "
            "set c.AgentRuns.db_path to a local disk, or c.AgentRuns.store_url to a "
            "PostgreSQL database"
        )
    return SQLiteStore(settings.db_path, settings.sqlite_synchronous, migrate=migrate)


def location(settings: Settings) -> str:
    """Where runs are kept, for logs and messages: never the store URL's password."""
    if not settings.store_url:
        return settings.db_path
    return StoreUrl(settings.store_url).describe()


def without_secrets(settings: Settings, text: str) -> str:
    """``text`` with the store URL's password starred out (drivers quote what they were given)."""
    if not settings.store_url:
        return text
    return StoreUrl(settings.store_url).scrub(text)
