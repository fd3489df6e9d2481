"""Notebook edits: an agent's change to a notebook's cells, recorded in its run and applied once.

An edit is one ``notebook.edit`` event, and later ones of the same
``edit_id`` update it: ``pending`` (recorded, durably, before the notebook is
touched), then ``applied``; or ``conflict`` (the cell no longer holds what
the agent read), ``rejected`` (a person said no), and later ``undone``.

An edit is planned and made on the notebook's content (nbformat 4, by cell
id) by the pure functions here; the :class:`~.places.Change` they answer is
made by the first place holding the notebook (:mod:`.places`: the shared
document, an open page, the file). A cell an agent wrote carries
``metadata.agentruns = {"run_id", "edit_id"}``: that stamp is how a run taken
over after its server died knows whether a ``pending`` edit reached the
notebook, so it is never applied twice nor lost.

``execute_cell`` makes an edit of op ``outputs``: the cell's outputs and
execution count replaced by what running its source showed (``before`` and
``after``: the outputs, each cut to half an edit's room with a note when
larger). It is ``conflict`` when the cell's source changed while it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import re
import secrets
import uuid
from typing import Any

from ..agents.steps import Approval, Ended, completed, failed, tool_step
from .kernels import NotebookNotFound, encoded_size, fit_outputs
from .places import Change, Place, Places

# The tools that change a notebook's cells, and the op each records.
EDIT_TOOLS = {"insert_cell": "insert", "edit_cell": "edit", "delete_cell": "delete"}
EXECUTE_CELL = "execute_cell"
# The tools whose step, left running by a server that died, is settled by the notebook.
CELL_TOOLS = (*EDIT_TOOLS, EXECUTE_CELL)
# How long a change on its way to a place (a save in a thread) is waited for when its run stops.
MAKE_GRACE_SECONDS = 4.0
# How many times an edit is made where its notebook is held, when the place failed (see _make_edit).
MAKE_ATTEMPTS = 2
CELL_TYPES = ("code", "markdown", "raw")
POSITIONS = ("start", "end")
# What nbformat 4.5 allows as a cell's id.
CELL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# The stamp on a cell an agent wrote.
STAMP = "agentruns"


class EditConflict(Exception):
    """The cell no longer holds what the edit expects: nothing was changed."""

    error_type = "edit_conflict"


class CellNotFound(LookupError):
    """No cell of that id in the notebook."""

    error_type = "cell_not_found"


class InvalidEdit(ValueError):
    """An edit whose arguments are not what its tool takes."""

    error_type = "invalid_arguments"


def new_edit_id() -> str:
    """A fresh ``edit_id``."""
    return "ed_" + secrets.token_urlsafe(12)


def source_of(cell: dict[str, Any]) -> str:
    """A cell's source as one text (nbformat keeps it as a text or a list of lines)."""
    source = cell.get("source") or ""
    return "".join(source) if isinstance(source, list) else source


def stamp_of(cell: dict[str, Any]) -> dict[str, Any] | None:
    """``metadata.agentruns`` of a cell an agent wrote, else None."""
    stamp = (cell.get("metadata") or {}).get(STAMP)
    return stamp if isinstance(stamp, dict) else None


def find_cell(notebook: dict[str, Any], cell_id: str) -> tuple[int, dict[str, Any]] | None:
    """``(index, cell)`` of the cell ``cell_id``, or None."""
    for index, cell in enumerate(notebook.get("cells") or []):
        if cell.get("id") == cell_id:
            return index, cell
    return None


def source_hash(source: str) -> str:
    """What an ``outputs`` edit keeps of the source that ran: a cell still holding it ran it."""
    return hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()


def outputs_edit(
    path: str,
    cell: dict[str, Any],
    index: int | None,
    source: str,
    outputs: list[dict[str, Any]],
    execution_count: int | None,
    room: int,
) -> dict[str, Any]:
    """The ``outputs`` edit that puts ``outputs`` into ``cell`` (at ``index``), which ran ``source``.

    ``before`` is the cell's outputs now, and both sides are cut to half of
    ``room`` (the rest said in a note output): an edit is never refused for
    its size. ``conflict`` when the cell's source is no longer ``source``.
    """
    edit: dict[str, Any] = {
        "edit_id": new_edit_id(), "notebook": path, "op": "outputs", "cell_id": cell.get("id"),
        "index": index, "before": fit_outputs(cell.get("outputs") or [], room // 2),
        "after": fit_outputs(outputs, room // 2), "cell_type": "code",
        "execution_count": execution_count, "before_execution_count": cell.get("execution_count"),
        "before_stamp": stamp_of(cell), "source_sha256": source_hash(source),
    }  # fmt: skip
    changed = source_of(cell) != source
    edit["status"] = "conflict" if changed else "pending"
    if changed:
        edit["reason"] = f"the cell {cell.get('id')!r} was changed while it ran"
    return edit


def same_outputs(one: Any, other: Any) -> bool:
    """Whether two lists of nbformat outputs hold the same (texts as strings or lists of lines)."""
    return _plain(one or []) == _plain(other or [])


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(item, str) for item in value):
            return "".join(value)
        return [_plain(item) for item in value]
    return value


def _text(args: dict[str, Any], name: str, tool: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise InvalidEdit(f"{tool} takes {name!r} as text")
    return value


def _cell_id(args: dict[str, Any], tool: str) -> str:
    value = _text(args, "cell_id", tool)
    if not value:
        raise InvalidEdit(f"{tool} takes the cell's id ('cell_id'; read_notebook shows each)")
    return value


def _insert_index(notebook: dict[str, Any], position: str) -> int | None:
    """Where a cell inserted after ``position`` goes, or None when that cell is gone."""
    if position == "start":
        return 0
    if position == "end":
        return len(notebook.get("cells") or [])
    found = find_cell(notebook, position)
    return None if found is None else found[0] + 1


def plan(
    tool: str,
    args: dict[str, Any],
    notebook: dict[str, Any],
    path: str,
    seen: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The edit a call of ``tool`` makes on ``notebook`` (the file's content at ``path``), not yet recorded.

    ``seen``: the cells' sources as the agent last read them (by cell id):
    the edit expects those (its ``before``), else the notebook's now.
    Raises :class:`InvalidEdit` or :class:`CellNotFound` for a call that
    cannot be an edit; its ``status`` is ``conflict`` when the cell no
    longer holds what the agent read.
    """
    op = EDIT_TOOLS[tool]
    edit: dict[str, Any] = {"edit_id": new_edit_id(), "notebook": path, "op": op}
    if op == "insert":
        source = _text(args, "source", tool)
        cell_type = args.get("cell_type", "code")
        if cell_type not in CELL_TYPES:
            raise InvalidEdit(f"insert_cell's cell_type is one of {', '.join(CELL_TYPES)}")
        position = args.get("after", "end")
        if not isinstance(position, str) or not position:
            raise InvalidEdit("insert_cell's 'after' is a cell's id, 'start' or 'end'")
        index = _insert_index(notebook, position)
        if index is None:
            raise CellNotFound(
                f"the notebook has no cell {position!r} to insert after (read_notebook shows "
                "each cell's id; 'start' and 'end' need none)"
            )
        taken = {cell.get("id") for cell in notebook.get("cells") or []}
        # The id asked for (a notebook written whole keeps its new cells' ids), when free.
        cell_id = args.get("cell_id")
        while not isinstance(cell_id, str) or not CELL_ID.match(cell_id) or cell_id in taken:
            cell_id = uuid.uuid4().hex[:8]
        edit.update(cell_id=cell_id, index=index, before=None, after=source)
        edit.update(cell_type=cell_type, position=position, status="pending")
        return edit
    cell_id = _cell_id(args, tool)
    found = find_cell(notebook, cell_id)
    if found is None:
        raise CellNotFound(
            f"the notebook has no cell {cell_id!r} (read_notebook shows each cell's id)"
        )
    index, cell = found
    now = source_of(cell)
    before = (seen or {}).get(cell_id, now)
    after = _text(args, "source", tool) if op == "edit" else None
    edit.update(cell_id=cell_id, index=index, before=before, after=after)
    edit.update(cell_type=cell.get("cell_type", "code"))
    edit["status"] = "pending" if now == before else "conflict"
    return edit


def check_size(edit: dict[str, Any], room: int) -> None:
    """Refuse an edit whose texts would not fit in its event: it is kept whole, to be undone."""
    size = sum(encoded_size(edit.get(name) or "") for name in ("before", "after"))
    if size > room:
        raise InvalidEdit(
            f"the cell's texts take {size} bytes, more than an edit keeps ({room}): an edit "
            "is recorded whole so that it can be undone; split the cell first"
        )


def apply(notebook: dict[str, Any], edit: dict[str, Any], run_id: str | None) -> Change:
    """Make ``edit`` on ``notebook`` (in place), stamped; returns the change, for a place to make.

    Raises :class:`EditConflict` when the notebook changed since the edit was
    planned so that it no longer fits: the notebook is then untouched.
    """
    cells = notebook.setdefault("cells", [])
    stamp = {"run_id": run_id, "edit_id": edit["edit_id"]}
    if edit["op"] == "outputs":
        found = find_cell(notebook, edit["cell_id"])
        if found is None:
            raise EditConflict(f"the cell {edit['cell_id']!r} is gone from the notebook")
        if source_hash(source_of(found[1])) != edit.get("source_sha256"):
            raise EditConflict(f"the cell {edit['cell_id']!r} was changed while it ran")
    if edit["op"] == "insert":
        index = _insert_index(notebook, edit.get("position") or "end")
        if index is None:
            raise EditConflict(
                f"the cell {edit['position']!r} to insert after is gone from the notebook"
            )
        if find_cell(notebook, edit["cell_id"]) is not None:
            raise EditConflict(f"the notebook has a cell {edit['cell_id']!r} already")
        cell = _new_cell(edit.get("cell_type") or "code", edit["after"], edit["cell_id"])
        cell["metadata"][STAMP] = stamp
        cells.insert(index, cell)
        return Change("insert", index, copy.deepcopy(cell))
    if edit["op"] == "outputs":
        index, cell = find_cell(notebook, edit["cell_id"]) or (0, {})
    else:
        index, cell = _cell_holding(
            notebook,
            edit["cell_id"],
            edit["before"],
            "changed since it was read: it holds something else now",
        )
    if edit["op"] == "delete":
        del cells[index]
        return Change("delete", index)
    if edit["op"] == "outputs":
        cell["outputs"] = copy.deepcopy(edit["after"])
        cell["execution_count"] = edit.get("execution_count")
    else:
        cell["source"] = edit["after"]
    cell.setdefault("metadata", {})[STAMP] = stamp
    return Change("replace", index, copy.deepcopy(cell))


def is_applied(notebook: dict[str, Any], edit: dict[str, Any]) -> bool:
    """Whether ``edit`` is in ``notebook``: a cell stamped with it, or, for a delete, the cell gone."""
    if edit["op"] == "delete":
        return find_cell(notebook, edit["cell_id"]) is None
    return any(
        (stamp_of(cell) or {}).get("edit_id") == edit["edit_id"]
        for cell in notebook.get("cells") or []
    )


def revert(notebook: dict[str, Any], edit: dict[str, Any]) -> Change:
    """Undo an applied ``edit`` on ``notebook`` (in place), when its cell still holds its ``after``.

    Raises :class:`EditConflict` (the notebook untouched) when it does not.
    """
    cells = notebook.setdefault("cells", [])
    if edit["op"] == "delete":
        if find_cell(notebook, edit["cell_id"]) is not None:
            raise EditConflict(f"the notebook has a cell {edit['cell_id']!r} again")
        cell = _new_cell(edit.get("cell_type") or "code", edit["before"], edit["cell_id"])
        index = min(edit.get("index") or 0, len(cells))
        cells.insert(index, cell)
        return Change("insert", index, copy.deepcopy(cell))
    if edit["op"] == "outputs":
        return _revert_outputs(notebook, edit)
    index, cell = _cell_holding(
        notebook,
        edit["cell_id"],
        edit["after"],
        "was changed since the edit: undoing it would lose that change",
    )
    if edit["op"] == "insert":
        del cells[index]
        return Change("delete", index)
    cell["source"] = edit["before"]
    if (stamp_of(cell) or {}).get("edit_id") == edit["edit_id"]:
        del cell["metadata"][STAMP]
    return Change("replace", index, copy.deepcopy(cell))


def _revert_outputs(notebook: dict[str, Any], edit: dict[str, Any]) -> Change:
    """Put back the outputs an ``outputs`` edit replaced, when the cell still holds the agent's."""
    found = find_cell(notebook, edit["cell_id"])
    if found is None:
        raise EditConflict(f"the cell {edit['cell_id']!r} is gone from the notebook")
    index, cell = found
    if not same_outputs(cell.get("outputs"), edit["after"]):
        raise EditConflict(
            f"the cell {edit['cell_id']!r} has other outputs since the agent ran it: undoing "
            "would lose them"
        )
    cell["outputs"] = copy.deepcopy(edit.get("before") or [])
    cell["execution_count"] = edit.get("before_execution_count")
    if (stamp_of(cell) or {}).get("edit_id") == edit["edit_id"]:
        earlier = edit.get("before_stamp")
        if isinstance(earlier, dict):
            cell["metadata"][STAMP] = dict(earlier)
        else:
            del cell["metadata"][STAMP]
    return Change("replace", index, copy.deepcopy(cell))


def is_reverted(notebook: dict[str, Any], edit: dict[str, Any]) -> bool:
    """Whether ``notebook`` holds what undoing the applied ``edit`` would make of it.

    So an undo that changed the notebook and stopped before it was recorded
    (its server died) is recorded ``undone`` when it is asked again.
    """
    found = find_cell(notebook, edit["cell_id"])
    if edit["op"] == "insert":
        return found is None
    if found is None:
        return False
    cell = found[1]
    if edit["op"] == "delete":
        return source_of(cell) == edit.get("before")
    if (stamp_of(cell) or {}).get("edit_id") == edit["edit_id"]:
        return False
    if edit["op"] == "outputs":
        return same_outputs(cell.get("outputs"), edit.get("before"))
    return source_of(cell) == edit.get("before")


def _cell_holding(
    notebook: dict[str, Any], cell_id: str, source: str, changed: str
) -> tuple[int, dict[str, Any]]:
    """The cell ``cell_id`` and its index, when it still holds ``source``; else :class:`EditConflict`."""
    found = find_cell(notebook, cell_id)
    if found is None:
        raise EditConflict(f"the cell {cell_id!r} is gone from the notebook")
    if source_of(found[1]) != source:
        raise EditConflict(f"the cell {cell_id!r} {changed}")
    return found


def _new_cell(cell_type: str, source: str, cell_id: str) -> dict[str, Any]:
    """A cell as nbformat 4.5 writes it."""
    cell: dict[str, Any] = {"cell_type": cell_type, "id": cell_id, "metadata": {}, "source": source}
    if cell_type == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


class NotebookEdits:
    """The edit tools' calls made for runs: each a tool step, its edit recorded, applied once.

    ``mode``: ``"apply"`` (at once) or ``"ask"`` (each edit a question
    showing its diff first, ``c.AgentRuns.notebook_edits``); ``room``: the
    bytes an edit's texts may take in its event.
    """

    def __init__(self, places: Places, mode: str = "apply", room: int = 131072):
        self.places = places
        self.mode = mode
        self.room = room
        # run_id -> cell id -> the cell's source as the run's agent last read or wrote it.
        self._seen: dict[str, dict[str, str]] = {}
        # run_id -> edit_id -> an edit recorded pending here whose settling is not recorded yet.
        self._pending: dict[str, dict[str, dict[str, Any]]] = {}

    def saw(self, run_id: str, cells: dict[str, str]) -> None:
        """The run's agent read these cells (by id): its edits expect them so."""
        self._seen.setdefault(run_id, {}).update(cells)

    def seen_by(self, run_id: str) -> dict[str, str]:
        """The cells' sources (by id) as the run's agent last read or wrote them."""
        return dict(self._seen.get(run_id) or {})

    def forget(self, run_id: str) -> list[dict[str, Any]]:
        """The run ended here; returns its edits recorded ``pending`` whose end it could not record.

        (Made from an MCP call still going when its run ended, whose last
        event came too late: :meth:`stopped` settles each.)
        """
        self._seen.pop(run_id, None)
        return list(self._pending.pop(run_id, {}).values())

    async def _emit(self, run: Any, edit: dict[str, Any]) -> None:
        """Record ``edit``; one ``pending`` is kept in mind until its end is recorded too."""
        await run.emit(EVENT, edit)
        if edit["status"] == "pending":
            self._pending.setdefault(run.run_id, {})[edit["edit_id"]] = dict(edit)
        else:
            self._pending.get(run.run_id, {}).pop(edit["edit_id"], None)

    async def step(
        self,
        run: Any,
        tool: str,
        args: dict[str, Any],
        path: str | None,
        asked: dict[str, Any] | None = None,
    ) -> Ended:
        """One call of the edit tool ``tool`` for ``run``, on the notebook ``path``, as a tool step."""
        edit: dict[str, Any] | None = None
        problem: Exception | None = None
        try:
            if path is None:
                raise NotebookNotFound(
                    "the run has no notebook to edit (it was not submitted from one)"
                )
            _, notebook = await self.places.open(path)
            edit = plan(tool, args, notebook, path, self._seen.get(run.run_id))
            check_size(edit, self.room)
        except Exception as exc:  # the step fails with it: the caller reads why, nothing changed
            edit, problem = None, exc
        approval = None
        if edit is not None and edit["status"] == "pending" and self.mode == "ask":
            approval = Approval(
                f"{QUESTIONS[edit['op']]} in {path}?",
                details={"tool": tool, **_diff(edit)},
                refused="this edit of the notebook",
            )
        started = StepRun(run)

        async def act() -> Ended:
            if problem is not None:
                raise problem
            assert edit is not None  # planned, when nothing went wrong
            edit["call_id"] = started.call_id
            return await self._carry_out(run, edit)

        ended = await tool_step(
            started,
            tool,
            dict(args),
            act,
            approval=approval,
            asked=asked,
            kind="edit",
            title=title(tool, args),
        )
        if edit is not None and (ended.error or {}).get("type") == "denied":
            await run.emit(EVENT, {**edit, "call_id": started.call_id, "status": "rejected"})
        return ended

    async def _carry_out(self, run: Any, edit: dict[str, Any]) -> Ended:
        return answer(await self.carry_out(run, edit))

    async def carry_out(self, run: Any, edit: dict[str, Any]) -> dict[str, Any]:
        """Record a planned edit and make it; returns it as it ended (``applied`` or ``conflict``).

        Stopped in between (its run cancelled, or its server handing it over),
        the edit does not stay ``pending``: it is recorded ``applied`` when
        the notebook has it, else ``rejected`` (the notebook unchanged by it).
        """
        if edit["status"] == "conflict":
            await run.emit(EVENT, edit)
            return edit
        try:
            # Durable before the notebook is touched: a run taken over finds the edit and settles it.
            await self._emit(run, edit)
            await run.durable()
            return await self._settle_edit(run, edit, applied_yet=False)
        except asyncio.CancelledError:
            # Recorded before the run's end is (which waits for its agent to stop).
            await _despite_cancel(asyncio.ensure_future(self._settle_stopped(run, edit)))
            raise

    async def _settle_stopped(self, run: Any, edit: dict[str, Any]) -> None:
        """Record how an edit whose run stopped while it was made ended: applied, or not."""
        settled = await self.stopped(edit)
        with contextlib.suppress(Exception):  # the run closed meanwhile: forget() says so
            await self._emit(run, settled)
            await run.durable()

    async def stopped(self, edit: dict[str, Any]) -> dict[str, Any]:
        """A ``pending`` edit whose run stopped: ``applied`` if its notebook has it, else ``rejected``.

        Read once no change of the notebook is being made (its lock): a change
        made for a stopping run is made before, or not at all.
        """
        settled = dict(edit)
        with contextlib.suppress(Exception):  # (the notebook unreadable: it is not applied)
            async with self.places.lock(edit["notebook"]):
                _, notebook = await self.places.open(edit["notebook"])
                if is_applied(notebook, edit):
                    settled["status"] = "applied"
        if settled["status"] != "applied":
            settled["status"] = "rejected"
            settled["reason"] = STOPPED
        return settled

    async def _settle(self, run: Any, edit: dict[str, Any], applied_yet: bool = True) -> Ended:
        """:meth:`_settle_edit`, answered to the caller."""
        return answer(await self._settle_edit(run, edit, applied_yet))

    async def _settle_edit(
        self, run: Any, edit: dict[str, Any], applied_yet: bool = True
    ) -> dict[str, Any]:
        """Bring a ``pending`` edit to ``applied`` (made now if the notebook lacks it) or ``conflict``.

        ``applied_yet``: whether the notebook may hold it already (a take-over).
        """
        path = edit["notebook"]
        settled = dict(edit)
        async with self.places.lock(path):
            place, notebook = await self.places.open(path)
            if applied_yet and is_applied(notebook, edit):
                found = find_cell(notebook, edit["cell_id"])
                settled["status"] = "applied"
                if found is not None:
                    settled["index"] = found[0]
            elif not applied_yet and run.cancelled:
                # Asked to stop before the change began (a call made over MCP goes on
                # until it hears so): not made now.
                settled["status"], settled["reason"] = "rejected", STOPPED
            else:
                settled.update(await self._make_edit(run, edit, place, notebook))
        await self._emit(run, settled)
        if settled["status"] == "applied" and settled["op"] in ("insert", "edit"):
            self.saw(run.run_id, {settled["cell_id"]: settled["after"]})
        return settled

    async def _make_edit(
        self, run: Any, edit: dict[str, Any], place: Place, notebook: dict[str, Any]
    ) -> dict[str, Any]:
        """Make ``edit`` on ``notebook`` as ``place`` holds it: its ``status`` then (and ``index``, ``reason``).

        A place that fails (a page refreshed or closed while making it, or that
        did not answer in time) may have made it, or not: the notebook is read
        again where it is held now (the page, or the file that page saved),
        and the edit is found there, or made there once more. Never recorded
        applied unsaid, never made twice (a page refuses a cell id it holds, or
        a cell changed since it was read).
        """
        path = edit["notebook"]
        for attempt in range(MAKE_ATTEMPTS):
            if attempt:
                place, notebook = await self.places.open(path)
                if is_applied(notebook, edit):
                    found = find_cell(notebook, edit["cell_id"])
                    return {"status": "applied", **({"index": found[0]} if found else {})}
            try:
                change = apply(notebook, edit, run.run_id)
            except EditConflict as exc:
                return {"status": "conflict", "reason": str(exc)}
            try:
                await _make(place, path, notebook, change)
            except Exception:
                continue
            return {"status": "applied", "index": change.index}
        return {"status": "conflict", "reason": f"the notebook's {place.name} could not be changed"}

    async def outputs(
        self,
        run: Any,
        path: str,
        cell_id: str,
        source: str,
        outputs: list[dict[str, Any]],
        execution_count: int | None,
        call_id: str | None = None,
    ) -> dict[str, Any]:
        """Put what running ``source`` showed into the cell ``cell_id``: an ``outputs`` edit, returned as it ended.

        ``run``: the run it is made for (recorded, made once), or None (a
        person's own call: made at once, recorded nowhere).
        """
        async with self.places.lock(path):
            place, notebook = await self.places.open(path)
            index, cell = find_cell(notebook, cell_id) or (None, {"id": cell_id})
            edit = outputs_edit(path, cell, index, source, outputs, execution_count, self.room)
            if index is None:
                edit["status"] = "conflict"
                edit["reason"] = f"the cell {cell_id!r} was deleted while it ran"
            if run is None and edit["status"] == "pending":
                change = apply(notebook, edit, None)
                await place.make(path, notebook, change)
                edit["status"] = "applied"
        if run is None:
            return edit
        edit["call_id"] = call_id
        return await self.carry_out(run, edit)

    async def resume(self, run: Any, step: dict[str, Any]) -> Ended:
        """A step of an edit tool an earlier attempt of ``run`` started: settled by the notebook, made once.

        A ``pending`` edit whose cell is stamped with its ``edit_id`` (or, for
        a delete, whose cell is gone) was applied and is recorded so; one the
        notebook lacks is applied now, unless its cell changed (``conflict``).
        A step whose edit was never recorded never touched the notebook.
        """
        edits = [e for e in run.snapshot.get("edits") or [] if e.get("call_id") == step["call_id"]]

        async def act() -> Ended:
            if not edits and step["name"] == EXECUTE_CELL:
                return failed(
                    {
                        "type": "interrupted",
                        "message": "the server stopped while the cell ran, before its outputs "
                        "were recorded: it was not run again, its outputs are not in the notebook, "
                        "and the kernel may or may not have run it (look at its variables, or "
                        "call execute_cell again)",
                    }
                )
            if not edits:
                return failed(
                    {
                        "type": "interrupted",
                        "message": f"the server stopped before the {step['name']} call made its "
                        "edit: the notebook was not changed; call it again",
                    }
                )
            edit = edits[-1]
            if edit["status"] == "pending":
                return await self._settle(run, edit)
            return answer(edit)

        return await tool_step(
            run, step["name"], step.get("args") or {}, act, earlier=step, idempotent=True
        )

    async def undo(self, edit: dict[str, Any]) -> None:
        """Reverse an applied edit on its notebook (``EditConflict`` when its cell changed)."""
        path = edit["notebook"]
        async with self.places.lock(path):
            place, notebook = await self.places.open(path)
            try:
                change = revert(notebook, edit)
            except EditConflict:
                if is_reverted(notebook, edit):
                    return  # undone already (by an undo its server died before recording)
                raise
            await place.make(path, notebook, change)

    async def direct(self, tool: str, args: dict[str, Any], path: str) -> Ended:
        """A call made with a person's own token: no run records it, the notebook is changed at once."""
        async with self.places.lock(path):
            place, notebook = await self.places.open(path)
            edit = plan(tool, args, notebook, path)
            if edit["status"] == "pending":
                try:
                    change = apply(notebook, edit, None)
                except EditConflict as exc:
                    edit["status"], edit["reason"] = "conflict", str(exc)
                else:
                    await place.make(path, notebook, change)
                    edit["index"], edit["status"] = change.index, "applied"
        return answer(edit)


async def _make(place: Any, path: str, notebook: dict[str, Any], change: Change) -> None:
    """``place.make``, waited for a while if its run stops meanwhile: the change may be on its way."""
    made = asyncio.ensure_future(place.make(path, notebook, change))
    try:
        await asyncio.shield(made)
    except asyncio.CancelledError:
        await _despite_cancel(made)
        if made.done() and not made.cancelled():
            made.exception()  # (retrieved: the caller reads the place to know what it did)
        raise


async def _despite_cancel(task: asyncio.Future, seconds: float = MAKE_GRACE_SECONDS) -> None:
    """Wait for ``task`` (at most ``seconds``) in a task being cancelled, perhaps more than once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not task.done() and loop.time() < deadline:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task}, timeout=deadline - loop.time())


class StepRun:
    """The run as a tool step uses it, keeping the ``call_id`` of the step it starts (an edit names it)."""

    def __init__(self, run: Any):
        self._run = run
        self.call_id: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    async def tool_started(self, *args: Any, **kwargs: Any) -> str:
        self.call_id = await self._run.tool_started(*args, **kwargs)
        return self.call_id


EVENT = "notebook.edit"
STOPPED = "the run was stopped before the edit was made"
QUESTIONS = {
    "insert": "Insert this cell",
    "edit": "Change this cell",
    "delete": "Delete this cell",
    "outputs": "Put these outputs into the cell",
}


def _diff(edit: dict[str, Any]) -> dict[str, Any]:
    return {
        name: edit.get(name)
        for name in ("notebook", "op", "cell_id", "cell_type", "before", "after")
    }


def title(tool: str, args: dict[str, Any]) -> str:
    """What a call of an edit tool does, for a person."""
    if tool == "insert_cell":
        return f"Insert a {args.get('cell_type') or 'code'} cell"
    verb = "Edit" if tool == "edit_cell" else "Delete"
    return f"{verb} the cell {args.get('cell_id')}"


def answer(edit: dict[str, Any]) -> Ended:
    """What the caller (a model) reads of an edit as it ended."""
    if edit["op"] == "outputs":
        return _outputs_answer(edit)
    if edit["status"] == "applied":
        return completed(
            {
                "status": "applied",
                "edit_id": edit["edit_id"],
                "cell_id": edit["cell_id"],
                "index": edit.get("index"),
            }
        )
    if edit["status"] == "conflict":
        why = edit.get("reason") or (f"the cell {edit['cell_id']!r} changed since you read it")
        return failed(
            {
                "type": "edit_conflict",
                "message": f"{why}: the notebook was not changed. Read it again "
                "(read_notebook) and make the edit on what it holds now.",
                "edit_id": edit["edit_id"],
            }
        )
    return failed(
        {
            "type": edit["status"],
            "message": f"the edit was {edit['status']}: the notebook was not changed by it",
            "edit_id": edit["edit_id"],
        }
    )


def _outputs_answer(edit: dict[str, Any]) -> Ended:
    """What the caller reads of an ``outputs`` edit settled after a take-over: its outputs' text."""
    if edit["status"] == "applied":
        text = (
            f"Ran the cell {edit['cell_id']} (execution count {edit.get('execution_count')}); "
            "its outputs are in the notebook:\n" + outputs_text(edit.get("after") or [])
        )
        result = {key: edit.get(key) for key in ("status", "edit_id", "cell_id", "index")}
        return Ended(True, text, {**result, "execution_count": edit.get("execution_count")})
    why = edit.get("reason") or f"the edit was {edit['status']}"
    return failed(
        {
            "type": "edit_conflict" if edit["status"] == "conflict" else edit["status"],
            "message": f"{why}: the cell ran, but its outputs were not written into the notebook. "
            "Read it again (read_notebook) before you run it again.",
            "edit_id": edit["edit_id"],
        }
    )


def outputs_text(outputs: list[dict[str, Any]], limit: int = 8000) -> str:
    """nbformat outputs as a model reads them: their text, an image as a reference, bounded."""
    parts = []
    for output in outputs:
        kind = output.get("output_type")
        if kind == "stream":
            parts.append(f"{output.get('name', 'stdout')}:\n" + _joined(output.get("text")))
        elif kind == "error":
            parts.append(f"error: {output.get('ename')}: {output.get('evalue')}")
        elif kind in ("execute_result", "display_data"):
            data = output.get("data") or {}
            images = [mime for mime in data if mime.startswith("image/")]
            text = _joined(data.get("text/plain"))
            label = "result" if kind == "execute_result" else "display"
            if text and not images:
                parts.append(f"{label}:\n{text}")
            for mime in images:
                parts.append(f"[{mime} image: in the cell's outputs]")
    text = "\n".join(parts) or "(no output)"
    return (
        text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"
    )


def _joined(text: Any) -> str:
    if isinstance(text, list):
        return "".join(str(line) for line in text)
    return text if isinstance(text, str) else ""
