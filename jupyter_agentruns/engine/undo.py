"""``POST runs/{id}/edits/{edit_id}/undo``: a person takes back a notebook edit an agent made.

The edit is reversed on the notebook's file when its cell still holds what
the edit wrote (else 409 ``edit_conflict``: the person's later change is
never lost), then recorded ``undone``. A run this server executes gets a
``notebook.edit`` event, from its executor like every event of a live run.
An ended run's log is closed (its terminal event is always its last): the
undo is kept in its persisted snapshot instead, the edit's ``status``
``undone``, so every server and every later read see it. A run another
server executes is answered 409 ``run_active``: its executor alone writes
its events. An undo asked again after its server died between the notebook
change and its record finds the notebook reverted already, and records it.

The same snapshot keeps the end of an edit whose run ended while it was being
made (a call over MCP outlives its run): ``settle_ended``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .. import lifecycle, reducer
from ..agents import RunClosed
from ..domain import RunObject
from ..errors import ErrorCode, Problem
from ..executor import Executor
from ..notebook_tools import EditConflict, NotebookAccess
from ..store import StoreConnection, reduce_stored
from ..writer import Writer, in_transaction
from .reads import Reads


class Undo:
    """Undo of a run's notebook edits, from any page, on a live or an ended run."""

    def __init__(
        self, *, writer: Writer, reads: Reads, executor: Executor, notebook: NotebookAccess | None
    ):
        self._writer = writer
        self._reads = reads
        self._executor = executor
        self._notebook = notebook
        # Undos are rare: one at a time, so two of the same edit never both reverse it.
        self._lock = asyncio.Lock()

    async def undo(self, owner: str, run_id: str, edit_id: str) -> RunObject:
        """Reverse the applied edit ``edit_id`` of the caller's run; returns the run."""
        async with self._lock:
            run = await self._reads.get_run(owner, run_id)
            edit = reducer.find_edit(run["snapshot"], edit_id)
            if edit is None:
                raise Problem(
                    ErrorCode.EDIT_NOT_FOUND, f"The run made no notebook edit {edit_id!r}."
                )
            if edit.get("status") != "applied":
                raise Problem(
                    ErrorCode.EDIT_CONFLICT,
                    f"The edit is {edit.get('status')}, not applied: there is nothing to undo.",
                    status=edit.get("status"),
                )
            access = self._notebook
            if access is None or not access.serves(owner):
                raise Problem(
                    ErrorCode.NOTEBOOK_TOOLS_UNAVAILABLE,
                    "The notebook tools are off on this server: it cannot change notebooks.",
                )
            live = self._executor.context_for(run_id)
            if live is None and not lifecycle.is_terminal(run["status"]):
                raise Problem(
                    ErrorCode.RUN_ACTIVE,
                    "Another server executes this run (or is taking it over): undo its edit "
                    "there, or here once the run has ended.",
                )
            try:
                await access.tools.edits.undo(edit)
            except EditConflict as exc:
                raise Problem(
                    ErrorCode.EDIT_CONFLICT,
                    f"Not undone: {exc}. Change the cell by hand if you still want it back.",
                ) from None
            undone = {**edit, "status": "undone"}
            recorded = False
            if live is not None:
                try:
                    await live[1].emit("notebook.edit", undone)
                    await live[1].durable()
                    recorded = True
                except RunClosed:
                    pass  # it ended meanwhile: its snapshot keeps the undo
            if not recorded:
                await self._writer.run(_keep_edit(run_id, undone))
                self._reads.forget(run_id)
            return await self._reads.get_run(owner, run_id)

    async def settle_ended(self, run_id: str, edits: list[dict[str, Any]]) -> None:
        """Record how the ``pending`` ``edits`` of a run that ended here ended: in its snapshot.

        A call made over MCP may still be making its edit when its run ends,
        too late to record it: ``applied`` if the notebook has it, else
        ``rejected``. A run handed over (not ended) is left to its next attempt.
        """
        access = self._notebook
        if access is None:
            return
        for edit in edits:
            settled = await access.tools.edits.stopped(edit)
            async with self._lock:
                await self._writer.run(_keep_edit(run_id, settled, only_if="pending"))
        self._reads.forget(run_id)


def _keep_edit(run_id: str, kept: dict[str, Any], only_if: str | None = None) -> Any:
    """Put ``kept`` in place of its edit in an ended run's snapshot (``only_if``: when it has that status)."""

    @in_transaction
    def keep(conn: StoreConnection) -> None:
        conn.lock_run(run_id)
        row = conn.get_run(run_id)
        if row is None or not lifecycle.is_terminal(row["status"]):
            return  # deleted meanwhile (nothing to keep it in), or never here
        snapshot = reduce_stored(
            conn,
            run_id,
            reducer.Snapshot(row["snapshot"]),
            row["snapshot_seq"],
            row["last_seq"],
        ).to_dict()
        edit = reducer.find_edit(snapshot, kept["edit_id"])
        if edit is None or (only_if is not None and edit.get("status") != only_if):
            return
        edit.clear()
        edit.update(kept)
        conn.update_run(run_id, {"snapshot": snapshot, "snapshot_seq": row["last_seq"]})

    return keep
