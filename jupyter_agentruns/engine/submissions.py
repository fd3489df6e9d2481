"""Submitting a run: idempotently, within the owner's limits, as its session's policy says.

Runs on the event loop, but for ``create``, which the writer runs in its
transaction: the key, the session, the limits and the new run are read and
written as one, serialized per owner across every server sharing the store.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .. import lifecycle
from ..agents import AgentSpec
from ..domain import ForkedFrom, RunFields, RunObject, RunRow
from ..errors import ErrorCode, Problem, run_not_found
from ..executor import Executor
from ..idempotency import fingerprint
from ..sessions import SessionPaths
from ..settings import Settings
from ..store import StoreConnection
from ..timeutil import now_iso
from ..writer import Writer, in_transaction
from .controls import request_cancel
from .queues import Queues
from .reads import Reads
from .tally import Tally
from .tokens import TokenBudgets


@dataclass
class SubmitRequest:
    agent: str
    input: Any
    session: str | None = None
    metadata: dict | None = None
    retry_of: str | None = None
    # A fork's origin (``POST runs/{id}/fork``): set by the server, never by a submit's body.
    forked_from: ForkedFrom | None = None
    # Not part of the fingerprint: what to do when the session is busy, not what to run.
    session_policy: str | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(
            self.agent, self.input, self.session, self.metadata, self.retry_of, self.forked_from
        )


def new_run_id() -> str:
    return "run_" + secrets.token_urlsafe(16)


class Submissions:
    """``POST runs``: a new run, or the one its Idempotency-Key made."""

    def __init__(
        self,
        *,
        settings: Settings,
        writer: Writer,
        reads: Reads,
        executor: Executor,
        queues: Queues,
        budgets: TokenBudgets,
        agents: dict[str, AgentSpec],
        agent_failures: dict[str, str],
        executor_id: str,
        on_activity: Callable[[], None],
        sessions: SessionPaths,
    ):
        self._settings = settings
        self._sessions = sessions
        self._writer = writer
        self._reads = reads
        self._executor = executor
        self._queues = queues
        self._budgets = budgets
        self._agents = agents
        self._agent_failures = agent_failures
        self._executor_id = executor_id
        self._on_activity = on_activity

    def unknown_agent(self, name: str) -> Problem:
        failure = self._agent_failures.get(name)
        if failure is not None:
            return Problem(
                ErrorCode.UNKNOWN_AGENT,
                f"The agent {name!r} failed to load ({failure}); the server log says more, "
                "GET agents lists the others.",
            )
        return Problem(ErrorCode.UNKNOWN_AGENT, f"No agent named {name!r}; GET agents lists them.")

    async def submit(
        self,
        owner: str,
        request: SubmitRequest,
        key: str | None,
        key_with_run: bool = False,
        within: Callable[[StoreConnection], None] | None = None,
    ) -> tuple[RunObject, bool]:
        """Create a run, or find the one this key made; returns ``(run, replayed)``.

        ``key_with_run``: the key is remembered as long as the run exists, not
        ``idempotency_ttl_seconds`` (what a notebook cell's key wants).
        ``within(conn)``: called in the transaction that creates a new run (not
        for a replay), before the owner's limits are checked; what it writes
        commits with the run, and what it raises makes nothing (a schedule
        records its slot handled, or finds it taken).
        """
        spec = self._agents.get(request.agent)
        if spec is None:
            problem: Problem | None = self.unknown_agent(request.agent)
        else:
            found = spec.input_problem(request.input)
            problem = Problem(ErrorCode.INVALID_INPUT, found[1], path=found[0]) if found else None
        # Of the request as sent: a notebook's path is recorded relative to the
        # server's root, but the client retrying with its absolute path, or a
        # kernel re-running the cell of a run recorded before, still replays.
        fp = request.fingerprint
        request = replace(
            request,
            session=self._sessions.relative(request.session),
            metadata=self._sessions.metadata(request.metadata),
        )
        settings = self._settings
        ttl, max_active, lease = (
            settings.idempotency_ttl_seconds,
            settings.max_active_runs_per_user,
            settings.lease_seconds,
        )
        now = time.time()
        policy = request.session_policy or settings.default_session_policy
        interrupted: list[str] = []  # the session's runs this run interrupts
        day_rows: list[tuple[str, str, int, int]] = []  # the owner's day, for the budget
        tally = Tally()  # queued runs of the session this run ends (interrupt)

        @in_transaction
        def create(conn: StoreConnection) -> tuple[RunRow, RunObject | None]:
            """The run's row, and the answer for a new run (None: the key's run, replayed)."""
            tally.clear()
            # The owner's submits one at a time, across servers sharing the store:
            # the key, the session and the active runs are read and written as one.
            conn.serialize(f"submit:{owner}")
            if key is not None:
                existing = conn.find_key(owner, key, now - ttl)
                if existing is not None:
                    if existing["fingerprint"] != fp:
                        raise Problem(
                            ErrorCode.IDEMPOTENCY_KEY_REUSED,
                            "This Idempotency-Key was used for a different request; "
                            "use a new key for a new run.",
                        )
                    row = conn.get_run(existing["run_id"])
                    if row is not None:
                        return row, None
            if problem is not None:
                raise problem
            assert spec is not None  # else a problem was raised
            if within is not None:
                within(conn)
            if request.retry_of is not None:
                original = conn.get_run_head(request.retry_of)
                if original is None or original["owner"] != owner:
                    raise run_not_found(request.retry_of)
            active = (
                conn.active_in_session(owner, request.session)
                if request.session is not None and policy != "parallel"
                else []
            )
            if policy == "reject" and active:
                raise Problem(
                    ErrorCode.SESSION_BUSY,
                    f"The session {request.session!r} has an active run, {active[0]['run_id']}; "
                    "wait for it or cancel it, or submit with session_policy 'enqueue' or 'interrupt'.",
                    active_run_id=active[0]["run_id"],
                )
            day_rows[:] = self._budgets.check_day(conn, owner, now)
            if conn.count_active(owner) >= max_active:
                raise Problem(
                    ErrorCode.TOO_MANY_ACTIVE_RUNS,
                    f"You have {max_active} active runs, the most allowed; wait for one to finish or cancel one.",
                    retry_after=5,
                )
            stored_limit = settings.max_stored_runs_per_user
            if stored_limit and conn.count_runs(owner) >= stored_limit:
                raise Problem(
                    ErrorCode.STORAGE_QUOTA_EXCEEDED,
                    f"You have {stored_limit} stored runs, the most allowed; delete runs you no "
                    "longer need (finished runs are also deleted after run_retention_seconds).",
                )
            run_id = new_run_id()
            # Behind the session's active runs: queued with no executor until its turn.
            behind = bool(active)
            fields: RunFields = {
                "run_id": run_id,
                "owner": owner,
                "agent": request.agent,
                "status": lifecycle.RunStatus.QUEUED.value,
                "session": request.session,
                "metadata": request.metadata if request.metadata is not None else {},
                "input": request.input,
                "retry_of": request.retry_of,
                "forked_from": request.forked_from,
                "created_at": now_iso(),
                "last_seq": 0,
                "first_seq": 1,
                "resumable": int(spec.resumable),
                "executor_id": None if behind else self._executor_id,
                "lease_expires": None if behind else time.time() + lease,
            }
            conn.insert_run(fields)
            if key is not None:
                conn.insert_key(owner, key, fp, run_id, now, key_with_run)
            if policy == "interrupt":
                # A run still in the queue ends cancelled here; one a server
                # executes gets a cancel request (this server's own are
                # cancelled at once after the commit, others' within a lease upkeep).
                for other in active:
                    request_cancel(conn, other["run_id"], {"interrupted_by": run_id}, tally)
                interrupted[:] = [other["run_id"] for other in active]
            created = conn.get_run(run_id)
            assert created is not None  # inserted above, in this transaction
            # Answered from this transaction: once the run is committed, no
            # later read may fail and tell the caller (503) that nothing was made.
            return created, self._reads.run_object(conn, created)

        row, run = await self._writer.run(create)
        tally.count()
        replayed = run is None
        self._budgets.file(owner, day_rows)
        if replayed:
            # Read again, row and events at once: a compaction since may have moved its snapshot on.
            run = await self._reads.get_run(owner, row["run_id"])
        else:
            if row["executor_id"] == self._executor_id:
                # Started after the last await: the caller gets the run before its task ran.
                assert spec is not None  # a new run, of a known agent
                self._executor.start(row, spec)
            for run_id in interrupted:
                # This server's own at once (the others' take their cancel request).
                await self._executor.cancel(run_id, {"interrupted_by": row["run_id"]})
            if row["executor_id"] is None:
                self._queues.soon()  # its turn may already have come (its session emptied)
            self._on_activity()
        return run, replayed
