"""What a person does to a run: cancel it, answer its question, delete it.

The server executing a run cancels it and resolves its questions at once;
another server sharing the store records the cancel or the answer in the
store, and the executing server's upkeep takes it within a second.

Runs on the event loop, but for the functions marked ``in_transaction``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from .. import lifecycle, metrics, reducer
from ..domain import InputAnswer, RunObject
from ..errors import ErrorCode, Problem, run_not_found
from ..executor import Executor
from ..settings import Settings
from ..store import StoreConnection, end_stored
from ..timeutil import now_iso
from ..writer import Writer, in_transaction
from .queues import Queues
from .reads import Reads
from .tally import Tally


class Controls:
    """``POST runs/{id}/cancel``, ``POST runs/{id}/inputs/{request_id}``, ``DELETE runs/{id}``."""

    def __init__(
        self,
        *,
        settings: Settings,
        writer: Writer,
        reads: Reads,
        executor: Executor,
        queues: Queues,
    ):
        self._settings = settings
        self._writer = writer
        self._reads = reads
        self._executor = executor
        self._queues = queues

    async def cancel(self, owner: str, run_id: str, reason: str | None) -> tuple[RunObject, bool]:
        """Cancel a run; returns ``(run, started)``, started False when it was already ending."""
        await self._reads.owned_head(owner, run_id)
        if self._executor.executes(run_id):
            started = await self._executor.cancel(run_id, reason)
        else:
            tally = Tally()  # a run still queued in its session ends cancelled here

            @in_transaction
            def cancel(conn: StoreConnection) -> bool:
                tally.clear()
                return request_cancel(conn, run_id, reason, tally)

            started = await self._writer.run(cancel)
            tally.count()
            if started:
                self._queues.soon()  # it may have been queued in its session
        return await self._reads.get_run(owner, run_id), started

    async def answer(
        self,
        owner: str,
        by: str | None,
        run_id: str,
        request_id: str,
        choice: str,
        note: str | None,
    ) -> RunObject:
        """Answer a run's question (``POST runs/{id}/inputs/{request_id}``); returns the run.

        The same answer again changes nothing; another answer to a resolved
        question is 409 ``input_resolved``. The server executing the run
        resolves it at once; another server sharing the store records the
        answer for it and waits (a few seconds at most) until it is resolved.
        """
        await self._reads.owned_head(owner, run_id)
        answered_here = await self._executor.answer(
            run_id,
            request_id,
            choice,
            note=note,
            by=by,
            check=functools.partial(check_answer, request_id=request_id, choice=choice),
        )
        if answered_here:
            run = await self._reads.get_run(owner, run_id)
            check_answer(reducer.find_input(run["snapshot"], request_id), request_id, choice)
            return run
        run = await self._reads.get_run(owner, run_id)
        if check_answer(reducer.find_input(run["snapshot"], request_id), request_id, choice):
            return run
        if lifecycle.is_terminal(run["status"]):
            raise Problem(ErrorCode.INPUT_RESOLVED, "The run has ended: its questions are closed.")
        # Another server executes the run: record the answer for it, then wait
        # (its lease upkeep takes answers every second) to say how it went.
        answer: InputAnswer = {"choice": choice, "note": note, "by": by}

        @in_transaction
        def record(conn: StoreConnection) -> InputAnswer:
            return conn.record_input_answer(run_id, request_id, answer, time.time())

        kept = await self._writer.run(record)
        if kept["choice"] != choice:
            raise input_resolved(kept["choice"])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(3.0, 3 * min(1.0, self._settings.lease_seconds / 3))
        seen = run["last_seq"]
        while loop.time() < deadline:
            await asyncio.sleep(0.05)
            # The run's head is a small read; the whole run only once it has new events.
            if (await self._reads.owned_head(owner, run_id))["last_seq"] == seen:
                continue
            run = await self._reads.get_run(owner, run_id)
            seen = run["last_seq"]
            request = reducer.find_input(run["snapshot"], request_id)
            if (request or {}).get("status") == "resolved":
                # Resolved otherwise (another answer first, a timeout, the run's end): 409.
                check_answer(request, request_id, choice)
                return run
            if lifecycle.is_terminal(run["status"]):
                raise Problem(ErrorCode.INPUT_RESOLVED, "The run ended before it took the answer.")
        # Recorded, not yet taken (the executing server is slow, or died and
        # its run will be interrupted): the run as it is now.
        return run

    async def delete(self, owner: str, run_id: str) -> None:
        await self._reads.owned_head(owner, run_id)  # 404, or 410 for a run retention deleted

        @in_transaction
        def delete(conn: StoreConnection) -> None:
            conn.lock_run(run_id)
            row = conn.get_run_head(run_id)
            if row is None or row["owner"] != owner:
                raise run_not_found(run_id)
            if lifecycle.is_active(row["status"]):
                raise Problem(ErrorCode.RUN_ACTIVE, "The run is still active; cancel it first.")
            conn.delete_run(run_id)

        await self._writer.run(delete)
        metrics.RUNS_DELETED.labels("request").inc()
        self._reads.forget(run_id)


def input_resolved(choice: Any) -> Problem:
    return Problem(
        ErrorCode.INPUT_RESOLVED,
        f"This question was already answered ({choice!r}); a different answer cannot replace it.",
        choice=choice,
    )


def input_given_up(reason: str | None) -> Problem:
    why = {
        "timeout": "nobody answered it in the time the agent gave",
        "cancelled": "the run was cancelled or ended before it was answered",
    }.get(reason or "", "the run stopped waiting for it")
    return Problem(
        ErrorCode.INPUT_RESOLVED,
        f"This question was given up ({why}): it takes no answer any more.",
        choice=None,
        reason=reason,
    )


def check_answer(request: dict[str, Any] | None, request_id: str, choice: str) -> bool:
    """Whether an answer was already given (True: the same one); raise for a wrong one."""
    if request is None:
        raise Problem(ErrorCode.INPUT_NOT_FOUND, f"The run has no question {request_id!r}.")
    choices = request.get("choices") or []
    if choice not in choices:
        raise Problem(
            ErrorCode.INVALID_CHOICE,
            f"{choice!r} is not one of the choices offered: {', '.join(map(repr, choices))}.",
            path="choice",
        )
    if request["status"] == "resolved":
        if request.get("choice") is None:
            raise input_given_up(request.get("reason"))
        if request.get("choice") == choice:
            return True
        raise input_resolved(request.get("choice"))
    return False


def request_cancel(conn: StoreConnection, run_id: str, reason: Any, tally: Tally) -> bool:
    """Record a cancel for the server executing ``run_id``; False when there is nothing to start.

    A run queued in its session, which no server executes yet, ends ``cancelled`` here.
    """
    conn.lock_run(run_id)  # a server claiming the queued run waits, then finds it ended
    row = conn.get_run(run_id)
    if (
        row is None
        or row["status"] not in lifecycle.CANCELLABLE
        or row["cancel_request"] is not None
    ):
        return False
    if row["status"] == lifecycle.RunStatus.QUEUED.value and row["executor_id"] is None:
        end = lifecycle.cancelled_in_queue(reason, row["last_seq"])
        tally.ended(end_stored(conn, row, end), end.fields["status"])
        return True
    conn.record_cancel_request(run_id, {"reason": reason, "requested_at": now_iso()})
    return True
