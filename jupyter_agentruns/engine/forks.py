"""Forking a run: a new run that goes on from the state after one of another run's events."""

from __future__ import annotations

from typing import Any

from .. import reducer
from ..agents import AgentSpec, ForkPoint, ForkUnsupported
from ..domain import JSONObject, LoggedEvent, RunObject, RunRow
from ..errors import ErrorCode, Problem, invalid_request
from ..store import StoreConnection
from .reads import Reads, logged_events
from .submissions import Submissions, SubmitRequest


class Forks:
    """``POST runs/{id}/fork``: the agent makes the new run's input, which is then submitted."""

    def __init__(
        self, *, reads: Reads, submissions: Submissions, agents: dict[str, AgentSpec]
    ) -> None:
        self._reads = reads
        self._submissions = submissions
        self._agents = agents

    async def fork(
        self,
        owner: str,
        run_id: str,
        at_seq: int,
        fields: JSONObject,
        metadata: JSONObject | None,
        key: str | None,
    ) -> tuple[RunObject, bool]:
        """Start a run from the state after event ``at_seq`` of ``run_id``, ``fields`` over its
        input; returns ``(run, replayed)`` as a submit does (the same key, the same fork)."""
        row, events, later = await self._reads.reader.run(
            lambda conn: self._point(conn, owner, run_id, at_seq)
        )
        spec = self._agents.get(row["agent"])
        if spec is None:
            raise self._submissions.unknown_agent(row["agent"])
        original = row["input"] if isinstance(row["input"], dict) else {}
        point = ForkPoint(
            run_id=run_id,
            at_seq=at_seq,
            input={**original, **fields},
            events=events,
            snapshot=reducer.reduce(events),
            checkpoint=row["checkpoint"],
            later_runs=later,
        )
        try:
            forked: dict[str, Any] = await spec.fork(point)
        except ForkUnsupported as exc:
            raise Problem(
                ErrorCode.FORK_UNSUPPORTED, f"The run {run_id} cannot be forked: {exc}."
            ) from None
        request = SubmitRequest(
            agent=row["agent"],
            input=forked,
            metadata=metadata if metadata is not None else row["metadata"],
            forked_from={"run_id": run_id, "seq": at_seq},
        )
        return await self._submissions.submit(owner, request, key)

    def _point(
        self, conn: StoreConnection, owner: str, run_id: str, at_seq: int
    ) -> tuple[RunRow, list[LoggedEvent], list[str]]:
        """The caller's run, its events up to ``at_seq`` and the later runs of its
        conversation (reader thread)."""
        row = self._reads.owned(conn, owner, run_id, full=True, snapshot=False)
        if at_seq > row["last_seq"]:
            raise invalid_request(
                f"at_seq is {at_seq}, after the run's last event ({row['last_seq']}).",
                path="at_seq",
            )
        if row["first_seq"] > 1 and at_seq > 0:
            raise Problem(
                ErrorCode.FORK_UNSUPPORTED,
                f"The run {run_id} cannot be forked at {at_seq}: its events before "
                f"{row['first_seq']} were folded into its snapshot (event_retention_seconds, "
                "max_retained_events), so the state after one of them is no longer known.",
            )
        events = logged_events(conn, run_id, upto=at_seq) if at_seq else []
        return row, events, later_runs(conn, row)


def later_runs(conn: StoreConnection, row: RunRow, most: int = 100) -> list[str]:
    """The runs of ``row``'s conversation (its owner, session and agent) started after it,
    newest first (at most ``most``; none for a run without a session)."""
    if row["session"] is None:
        return []
    found: list[str] = []
    before: tuple[str, str] | None = None
    while len(found) < most:
        page = conn.list_runs(
            row["owner"], status=None, session=row["session"], limit=100, before=before
        )
        for listed in page:
            if (listed["created_at"], listed["run_id"]) <= (row["created_at"], row["run_id"]):
                return found
            if listed["agent"] == row["agent"]:
                found.append(listed["run_id"])
        if len(page) < 100:
            return found
        before = (page[-1]["created_at"], page[-1]["run_id"])
    return found
