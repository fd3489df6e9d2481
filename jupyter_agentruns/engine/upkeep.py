"""Leases: this server's kept alive, others' that ran out taken over or ended.

Each run a server executes holds a lease (its executor id and an expiry)
that the upkeep renews, taking in the same transaction the cancels and
answers other servers recorded for those runs. The sweep finds unfinished
runs whose lease expired, or that a server handed over at its clean stop,
and decides each one's fate (``Upkeep.fate``): taken over (``run.resumed``,
this server its executor), ended ``interrupted``, or left for a server that
serves its owner.

Runs on the event loop, but for the functions marked ``in_transaction``,
which the writer runs in its transaction on its thread. ``_expired_seen`` is
the writer thread's alone.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from .. import lifecycle, reducer
from ..agents import AgentSpec
from ..domain import CancelRequest, InputAnswer, RunRow
from ..executor import Executor
from ..settings import Settings
from ..store import StoreConnection, commit_transitions, end_stored, reduce_stored
from ..writer import Writer, in_transaction
from .tally import Tally
from .tokens import TokenBudgets


class Upkeep:
    """This server's leases, and the runs whose executor is gone."""

    def __init__(
        self,
        *,
        settings: Settings,
        writer: Writer,
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
        self._executor = executor
        self._agents = agents
        self._executor_id = executor_id
        self._served_owners = served_owners
        self._budgets = budgets
        self._log = log
        self._on_activity = on_activity
        # Expired leases this server has seen, with when it first saw each: see sweep().
        self._expired_seen: dict[str, tuple[float | None, float]] = {}
        # Set when the server begins to stop: it takes nothing over any more.
        self.stopping = False

    def serves(self, owner: str) -> bool:
        """Whether this server takes over and starts ``owner``'s runs (``served_owners``)."""
        return self._served_owners is None or owner in self._served_owners

    async def renew_leases(self) -> None:
        """Renew this server's leases, and take the cancels and answers other servers recorded."""
        live = self._executor.running_ids()
        if not live:
            return
        expires = time.time() + self._settings.lease_seconds

        @in_transaction
        def renew(
            conn: StoreConnection,
        ) -> tuple[list[tuple[str, CancelRequest]], list[tuple[str, str, InputAnswer]]]:
            conn.renew_leases(self._executor_id, live, expires)
            cancels = conn.take_cancel_requests(self._executor_id)
            return cancels, conn.take_input_answers(self._executor_id)

        cancels, answers = await self._writer.run(renew)
        # Taken from the store in that transaction: each is applied, whatever becomes of the others.
        for run_id, request_id, answer in answers:
            try:
                self._executor.resolve(
                    run_id,
                    request_id,
                    answer["choice"],
                    note=answer["note"],
                    by=answer["by"],
                    check=functools.partial(not_offered, choice=answer["choice"]),
                )
            except Exception:
                self._log.exception("agentruns: an answer for run %s could not be applied", run_id)
        for run_id, request in cancels:
            try:
                await self._executor.cancel(
                    run_id, request.get("reason"), request.get("requested_at")
                )
            except Exception:
                self._log.exception("agentruns: a cancel of run %s could not be applied", run_id)
        self._on_activity()

    async def sweep(self) -> int:
        """Take over, or end ``interrupted``, every unfinished run whose executor is gone.

        Wall clocks jump (a laptop sleeps, a VM is paused): a lease that looks
        expired may belong to a server about to renew it. So a run is touched
        only once this server has seen the same expired lease, unrenewed, for
        ``lease_seconds`` of its own monotonic time; a run its server handed
        over at a clean shutdown is taken at once. Returns how many it took or ended.
        """
        live = set(self._executor.running_ids())
        ttl = self._settings.idempotency_ttl_seconds
        lease = self._settings.lease_seconds
        seen = self._expired_seen
        tally = Tally()

        @in_transaction
        def sweep_expired(
            conn: StoreConnection,
        ) -> tuple[int, list[tuple[RunRow, reducer.Snapshot]]]:
            tally.clear()
            now, clock = time.time(), time.monotonic()
            still: dict[str, tuple[float | None, float]] = {}
            ended = 0
            resumed: list[tuple[RunRow, reducer.Snapshot]] = []
            for row in conn.expired_active_runs(now):
                run_id, expires = row["run_id"], row["lease_expires"]
                if run_id in live:
                    continue
                handed_over = row["executor_id"] is None
                first = seen.get(run_id)
                if not handed_over and (first is None or first[0] != expires):
                    still[run_id] = (expires, clock)
                    continue
                if not handed_over and first is not None and clock - first[1] < lease:
                    still[run_id] = first
                    continue
                fate = self.fate(row)
                if fate is None:
                    still[run_id] = first or (expires, clock)
                    continue  # it waits for a server that serves its owner
                reason = "server_shutdown" if handed_over else "lease_expired"
                if not handed_over:
                    tally.leases_expired += 1
                if fate == "resume":
                    resumed.append(self._take_over(conn, row, reason, now + lease, tally))
                else:
                    end = lifecycle.interrupted(reason)
                    tally.ended(end_stored(conn, row, end), end.fields["status"])
                    ended += 1
            seen.clear()
            seen.update(still)
            conn.purge_keys(now - ttl)
            return ended, resumed

        ended, resumed = await self._writer.run(sweep_expired)
        tally.count()
        if ended:
            self._log.info("agentruns: %d run(s) whose server stopped ended interrupted", ended)
        if resumed:
            self._log.info("agentruns: took over %d run(s) whose server stopped", len(resumed))
            await self._budgets.load({row["owner"] for row, _ in resumed})
            for row, snapshot in resumed:
                spec = self._agents[row["agent"]]
                self._executor.resume(row, spec, snapshot)
            self._on_activity()
        return ended + len(resumed)

    def fate(self, row: RunRow) -> str | None:
        """What this server does with an unfinished run whose executor is gone.

        "resume": it takes the run over; "end": it ends the run
        ``interrupted``; None: it leaves the run to a server that serves its
        owner and has its agent. A server runs another owner's agents only
        for that owner's own server: never with its own keys, tools and
        agents of the same name. A run that nobody would resume (its agent is
        not resumable, or it was being cancelled) may be ended by any server.
        """
        if self.stopping:
            return None  # the next server decides
        cancelling = row["status"] == lifecycle.RunStatus.CANCELLING.value
        spec = self._agents.get(row["agent"])
        if self.serves(row["owner"]) and spec is not None:
            takeovers = (row.get("attempt") or 1) - 1
            if spec.resumable and not cancelling and takeovers < self._settings.max_resume_attempts:
                return "resume"
            return "end"
        if cancelling or row.get("resumable") == 0:
            return "end"
        return None

    def _take_over(
        self,
        conn: StoreConnection,
        row: RunRow,
        reason: str,
        lease_expires: float,
        tally: Tally,
    ) -> tuple[RunRow, reducer.Snapshot]:
        """Commit ``run.resumed`` with this server as the run's executor (writer thread).

        In the sweep's transaction, on the row it locked: one executor at a time.
        """
        snapshot = reduce_stored(
            conn,
            row["run_id"],
            reducer.Snapshot(row["snapshot"]),
            row["snapshot_seq"],
            row["last_seq"],
        )
        waiting = reducer.open_inputs(snapshot.structure())
        status = (lifecycle.RunStatus.WAITING if waiting else lifecycle.RunStatus.RUNNING).value
        takeovers = (row.get("attempt") or 1) - 1
        resumed = lifecycle.resumed(takeovers + 2, reason, row["last_seq"], status)
        taken = lifecycle.Transition(
            resumed.type,
            resumed.data,
            {**resumed.fields, "executor_id": self._executor_id, "lease_expires": lease_expires},
        )
        rows, snapshot = commit_transitions(conn, row, [taken], snapshot)
        tally.events += len(rows)
        tally.resumed.append(reason)
        fields = {**taken.fields, "last_seq": rows[-1][1]}
        return cast(RunRow, {**row, **fields, "snapshot": None}), snapshot


def not_offered(request: dict[str, Any] | None, choice: str) -> bool:
    """Whether an answer another server recorded is to be left: no such question, or not one of its choices."""
    return request is None or choice not in (request.get("choices") or [])
