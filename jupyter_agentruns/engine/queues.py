"""Session queues: runs submitted behind a session's active runs (``enqueue``, ``interrupt``).

A queued run has no executor until its turn; any server sharing the store
may claim it then, with a conditional update, so exactly one starts it. A
server claims only runs of the owners it serves and of agents it has: the
others wait in their queue for a server that does.

Runs on the event loop, but for the functions marked ``in_transaction``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import cast

from ..agents import AgentSpec
from ..domain import RunRow
from ..executor import Executor
from ..reader import Reader
from ..settings import Settings
from ..store import StoreConnection
from ..writer import Writer, in_transaction
from .tokens import TokenBudgets


class Queues:
    """Starts the runs whose turn came in their session's queue."""

    def __init__(
        self,
        *,
        settings: Settings,
        writer: Writer,
        reader: Reader,
        executor: Executor,
        agents: dict[str, AgentSpec],
        executor_id: str,
        served_owners: frozenset[str] | None,
        budgets: TokenBudgets,
        log: logging.Logger,
        on_activity: Callable[[], None],
    ):
        self._settings = settings
        self._writer = writer
        self._reader = reader
        self._executor = executor
        self._agents = agents
        self._executor_id = executor_id
        self._owners = None if served_owners is None else sorted(served_owners)
        self._budgets = budgets
        self._log = log
        self._on_activity = on_activity
        self._dispatching = False
        self._again = False
        self._soon: set[asyncio.Task] = set()
        # Set when the server begins to stop: nothing more is claimed.
        self.stopping = False

    @property
    def pending(self) -> set[asyncio.Task]:
        """The dispatches ``soon`` started that have not finished (a stop waits for them)."""
        return set(self._soon)

    def soon(self) -> None:
        """Start, in a moment, what waited in a session's queue (a run of it ended, or was queued)."""

        async def dispatch() -> None:
            try:
                await self.dispatch()
            except Exception:
                self._log.exception("agentruns: starting queued runs failed")

        task = asyncio.ensure_future(dispatch())
        self._soon.add(task)
        task.add_done_callback(self._soon.discard)

    async def dispatch(self) -> int:
        """Claim and start the runs whose turn came in their session's queue; how many.

        Called when a run of this server ends, and from the upkeep for runs other servers ended.
        """
        if self.stopping:
            return 0
        if self._dispatching:
            self._again = True
            return 0
        self._dispatching = True
        started = 0
        owners, agents = self._owners, sorted(self._agents)

        def startable(conn: StoreConnection) -> list[RunRow]:
            return conn.startable_queued_runs(owners, agents)

        try:
            while True:
                self._again = False
                ready = await self._reader.run(startable)
                if ready:
                    started += await self.claim_and_start(ready)
                if not self._again:
                    return started
        finally:
            self._dispatching = False

    async def claim_and_start(self, ready: list[RunRow]) -> int:
        """Claim ``ready`` (rows of ``startable_queued_runs``) and start those this server won."""
        expires = time.time() + self._settings.lease_seconds
        executor_id = self._executor_id

        @in_transaction
        def claim(conn: StoreConnection) -> list[RunRow]:
            if self.stopping:
                return []
            return [
                cast(RunRow, conn.get_run(row["run_id"]))  # claimed just now: it exists
                for row in ready
                if conn.claim_run(row["run_id"], executor_id, expires)
            ]

        if self.stopping:
            return 0
        claimed = await self._writer.run(claim)
        if claimed and self.stopping:
            # Claimed as the server began to stop: back to their queue, for the next server.
            run_ids = [row["run_id"] for row in claimed]

            @in_transaction
            def release(conn: StoreConnection) -> None:
                conn.release_claims(run_ids, executor_id)

            await self._writer.run(release)
            return 0
        await self._budgets.load({row["owner"] for row in claimed})
        for row in claimed:
            self._executor.start(row, self._agents[row["agent"]])
        if claimed:
            self._on_activity()
        return len(claimed)
