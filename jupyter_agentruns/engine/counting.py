"""Runs by status, for the metrics: counted off the event loop, only when scraped.

The runs of the owners this server serves, unless ``store_wide_metrics``
asks for every run of the store: on a store shared by a hub's users, each
user's server would otherwise show everyone's counts.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from .. import lifecycle, metrics
from ..reader import Reader


class RunCounts:
    """``/metrics`` is answered on the event loop, which must never wait on the store.

    A scrape reports the last count, and one that finds it old starts a new
    count on a reader thread for the next scrape. Nobody scraping, nothing
    is counted. Every status is a series from the start.
    """

    def __init__(self, reader: Reader, log: logging.Logger, owners: frozenset[str] | None):
        self._reader = reader
        # Whose runs are counted: None, every run of the store.
        self._owners = None if owners is None else sorted(owners)
        self._log = log
        self.counts: dict[str, int] = dict.fromkeys(lifecycle.ALL_STATUSES, 0)
        self._counted_at = -math.inf
        self._counting = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._soon()  # the first scrape has a count

    def stop(self) -> None:
        self._loop = None

    def for_scrape(self) -> dict[str, int]:
        if time.monotonic() - self._counted_at >= metrics.RUN_COUNT_SECONDS:
            self._soon()
        return self.counts

    def _soon(self) -> None:
        loop = self._loop
        if self._counting or loop is None or loop.is_closed():
            return
        self._counting = True
        # Thread-safe: a registry may be scraped from a thread of its own.
        loop.call_soon_threadsafe(lambda: loop.create_task(self._count()))

    async def _count(self) -> None:
        try:
            owners = self._owners
            counts = await self._reader.run(lambda conn: conn.count_runs_by_status(owners))
        except Exception as exc:  # the store is away: the last count stands
            self._log.debug("agentruns: counting runs for the metrics failed: %s", exc)
        else:
            self.counts = {status: counts.get(status, 0) for status in lifecycle.ALL_STATUSES}
            self._counted_at = time.monotonic()
        finally:
            self._counting = False
