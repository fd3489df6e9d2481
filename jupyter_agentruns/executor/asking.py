"""A run's questions to a person: asked, awaited, resolved, given up.

``Questions`` owns what waits for an answer (the futures of ``ask`` and
``answer_to``) and since when the run has been waiting; the questions
themselves are the run's snapshot's, and their events go through the
run's ``Execution`` like any other.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import weakref
from typing import TYPE_CHECKING, Any

from .. import lifecycle, reducer
from ..agents import RunClosed

if TYPE_CHECKING:
    from .execution import Execution


class Questions:
    """The open questions of one run (``execution.questions``)."""

    def __init__(self, execution: Execution):
        # Weak: with a strong one the two would be a cycle, and an ended run's
        # events and text would stay in memory until the collector's next full
        # pass (rare: the engine freezes what it started with), not go at once.
        self._execution: Execution = weakref.proxy(execution)
        # Questions not yet answered: request_id -> what ask() awaits.
        self._asked: dict[str, asyncio.Future] = {}
        # Since when (monotonic) a question of the run has been open, while one is.
        self.waiting_since: float | None = None

    def find(self, request_id: str) -> dict[str, Any] | None:
        """The question ``request_id`` as the run's events so far make it (None: no such question)."""
        return reducer.find_input(self._execution.snapshot.structure(), request_id)

    async def ask(
        self, title: str, details: Any, choices: list[str], kind: str, timeout: float | None
    ) -> str:
        """Ask a person (``input.requested``, the run ``waiting``) and wait for the choice."""
        execution = self._execution
        request_id = "in_" + secrets.token_urlsafe(9)
        data = {
            "request_id": request_id,
            "kind": kind,
            "title": title,
            "details": details,
            "choices": choices,
        }
        answered = asyncio.get_running_loop().create_future()
        self._asked[request_id] = answered
        try:
            await execution.commit(lifecycle.input_requested(data, execution.status()))
            if timeout is None:
                return await asyncio.shield(answered)
            try:
                return await asyncio.wait_for(asyncio.shield(answered), timeout)
            except asyncio.TimeoutError:
                if answered.done():
                    return answered.result()
                if not execution.closed:
                    self.resolve(request_id, None, reason="timeout")
                raise TimeoutError(f"nobody answered {title!r} within {timeout:g} s") from None
        finally:
            self._asked.pop(request_id, None)

    async def await_answer(self, request_id: str) -> str:
        """Wait for the answer to a question still open from an earlier attempt."""
        request = self.find(request_id)
        if request is None:
            raise ValueError(f"the run has no question {request_id!r}")
        if request["status"] != "open":
            if request.get("choice") is None:
                raise TimeoutError(f"the question {request_id!r} was closed unanswered")
            return request["choice"]
        answered = self._asked.get(request_id)
        if answered is None:
            answered = self._asked[request_id] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.shield(answered)
        finally:
            self._asked.pop(request_id, None)

    def resolve(
        self,
        request_id: str,
        choice: str | None,
        *,
        note: str | None = None,
        by: str | None = None,
        reason: str | None = None,
    ) -> int | None:
        """Append ``input.resolved`` (synchronous: nothing interleaves) and wake the asking agent.

        A question that is not open (answered, timed out, given up) is left as it is (None).
        """
        execution = self._execution
        request = self.find(request_id)
        if request is None or request["status"] != "open":
            return None
        data: dict[str, Any] = {"request_id": request_id, "choice": choice, "note": note, "by": by}
        if reason is not None:
            data["reason"] = reason
        still_open = len(reducer.open_inputs(execution.snapshot.structure())) - 1
        seq = execution.apply(lifecycle.input_resolved(data, execution.status(), still_open))
        answered = self._asked.get(request_id)
        if answered is not None and not answered.done() and choice is not None:
            answered.set_result(choice)
        return seq

    def stop_asking(self) -> None:
        """Wake every ask() still waiting with ``RunClosed``.

        A thread agent's ask() is a task of its own, which cancelling the
        agent does not reach: without this, its thread would wait forever.
        """
        for answered in self._asked.values():
            if not answered.done():
                answered.set_exception(RunClosed(f"run {self._execution.run_id} has ended"))

    def track_waiting(self) -> None:
        """Note when the run began waiting for an answer (or that it no longer waits)."""
        if not reducer.open_inputs(self._execution.snapshot.structure()):
            self.waiting_since = None
        elif self.waiting_since is None:
            self.waiting_since = time.monotonic()
