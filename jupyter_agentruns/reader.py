"""Store reads off the event loop: a few threads, each with its own connection.

Reading a run can mean decoding a 100 MB snapshot or stepping through
thousands of events; on the event loop that would stall every stream of
every user. The loop only awaits ``Reader.run(fn)``; ``fn(connection)`` runs
on one of the reader threads.

Small reads with a bound (a run's head, 256 KB of events, a part of a
snapshot) are another matter: a hop to a thread and back costs more than they
do when the store is a local file, and a thread busy with Python takes turns
with the event loop at the GIL, every switch interval (5 ms), so a long
replay or a 100 MB answer read on a thread holds the live streams back longer
than the same reads made a part at a time on the loop, with sends between
them. ``Reader.small(fn)`` runs those on the loop's own connection for a store
that says its reads are local (SQLite), and on a reader thread for one across
a network.

A read of a store across a network waits at most ``THREAD_WAIT_SECONDS`` for
a reader thread: while the database hangs, the threads wait on it (until the
store's own bound on an answer) and the reads queued behind them are answered
``StoreUnavailable`` rather than held.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .store import Store, StoreConnection, StoreUnavailable

T = TypeVar("T")

THREAD_WAIT_SECONDS = 5.0


class Reader:
    def __init__(self, store: Store, threads: int = 2):
        self._store = store
        self._local = threading.local()
        self._connections: list[StoreConnection] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="agentruns-reader")
        self._inline = store.connect() if store.local_reads else None
        # A local file does not hang: its reads wait their turn, however long.
        self._thread_wait = None if store.local_reads else THREAD_WAIT_SECONDS

    async def run(self, fn: Callable[[StoreConnection], T]) -> T:
        """``fn(connection)`` on a reader thread."""
        if self._thread_wait is None:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._call, fn)
        future = self._pool.submit(self._call, fn)
        read = asyncio.wrap_future(future)
        try:
            return await asyncio.wait_for(asyncio.shield(read), self._thread_wait)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            if future.cancel():  # still queued: it never runs
                raise StoreUnavailable(
                    f"no connection to the store was free within {self._thread_wait:g} s "
                    "(the database is slow to answer)"
                ) from None
        return await read  # started in time: its statements have their own bounds

    async def small(self, fn: Callable[[StoreConnection], T]) -> T:
        """``fn(connection)`` for a read with a bound: on the loop when the store is local.

        The loop turns once before each such read. A caller reading part after
        part to a client whose socket takes each part at once never waits in
        its own awaits: without that turn, a 100 MB answer went out in one
        step of the loop, half a second in which no other stream was served.
        """
        if self._inline is not None:
            await asyncio.sleep(0)
            return fn(self._inline)
        return await self.run(fn)

    def _call(self, fn: Callable[[StoreConnection], Any]) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._store.connect()
            with self._lock:
                self._connections.append(conn)
        return fn(conn)

    def close(self) -> None:
        """Wait for running reads, then close every connection."""
        self._pool.shutdown(wait=True)
        if self._inline is not None:
            self._inline.close()
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
