"""Notebook edits: an agent's change to a notebook's cells, recorded in its run and applied once.

An edit is one ``notebook.edit`` event, and later ones of the same
``edit_id`` update it: ``pending`` (recorded, durably, before the notebook is
touched), then ``applied``; or ``conflict`` (the cell no longer holds what
the agent read), ``rejected`` (a person said no), and later ``undone``.

DESIGN's edits are applied by the first of the shared document
(jupyter-collaboration), a page that has the notebook open, and the server
on the file. This module is the last of the three: the server changes the
notebook's file through its contents manager, by cell id. A cell an agent
wrote carries ``metadata.agentruns = {"run_id", "edit_id"}``: that stamp is
how a run taken over after its server died knows whether a ``pending`` edit
reached the file, so it is never applied twice nor lost.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import uuid
from typing import Any

from jupyter_core.utils import ensure_async

from ..agents.steps import Approval, Ended, completed, failed, tool_step
from .kernels import NotebookNotFound, encoded_size

# The tools that change a notebook's cells, and the op each records.
EDIT_TOOLS = {"insert_cell": "insert", "edit_cell": "edit", "delete_cell": "delete"}
CELL_TYPES = ("code", "markdown", "raw")
POSITIONS = ("start", "end")
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
        cell_id = uuid.uuid4().hex[:8]
        while cell_id in taken:
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


def apply(notebook: dict[str, Any], edit: dict[str, Any], run_id: str | None) -> int:
    """Make ``edit`` on ``notebook`` (in place), stamped; returns the cell's index.

    Raises :class:`EditConflict` when the notebook changed since the edit was
    planned so that it no longer fits: the notebook is then untouched.
    """
    cells = notebook.setdefault("cells", [])
    stamp = {"run_id": run_id, "edit_id": edit["edit_id"]}
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
        return index
    index, cell = _cell_holding(
        notebook,
        edit["cell_id"],
        edit["before"],
        "changed since it was read: it holds something else now",
    )
    if edit["op"] == "delete":
        del cells[index]
    else:
        cell["source"] = edit["after"]
        cell.setdefault("metadata", {})[STAMP] = stamp
    return index


def is_applied(notebook: dict[str, Any], edit: dict[str, Any]) -> bool:
    """Whether ``edit`` is in ``notebook``: a cell stamped with it, or, for a delete, the cell gone."""
    if edit["op"] == "delete":
        return find_cell(notebook, edit["cell_id"]) is None
    return any(
        (stamp_of(cell) or {}).get("edit_id") == edit["edit_id"]
        for cell in notebook.get("cells") or []
    )


def revert(notebook: dict[str, Any], edit: dict[str, Any]) -> None:
    """Undo an applied ``edit`` on ``notebook`` (in place), when its cell still holds its ``after``.

    Raises :class:`EditConflict` (the notebook untouched) when it does not.
    """
    cells = notebook.setdefault("cells", [])
    if edit["op"] == "delete":
        if find_cell(notebook, edit["cell_id"]) is not None:
            raise EditConflict(f"the notebook has a cell {edit['cell_id']!r} again")
        cell = _new_cell(edit.get("cell_type") or "code", edit["before"], edit["cell_id"])
        cells.insert(min(edit.get("index") or 0, len(cells)), cell)
        return
    index, cell = _cell_holding(
        notebook,
        edit["cell_id"],
        edit["after"],
        "was changed since the edit: undoing it would lose that change",
    )
    if edit["op"] == "insert":
        del cells[index]
        return
    cell["source"] = edit["before"]
    if (stamp_of(cell) or {}).get("edit_id") == edit["edit_id"]:
        del cell["metadata"][STAMP]


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


class NotebookFiles:
    """Notebooks' files through the server's contents manager (only its documented ``get`` and ``save``)."""

    def __init__(self, contents_manager: Any):
        self.contents_manager = contents_manager

    async def read(self, path: str) -> dict[str, Any]:
        """The notebook's content (nbformat 4)."""
        try:
            model = await ensure_async(
                self.contents_manager.get(path, content=True, type="notebook")
            )
        except Exception as exc:
            raise NotebookNotFound(f"cannot read the notebook {path!r}: {exc}") from None
        return copy.deepcopy(model["content"])

    async def write(self, path: str, notebook: dict[str, Any]) -> None:
        """Save the notebook's content."""
        model = {"type": "notebook", "format": "json", "content": notebook}
        await ensure_async(self.contents_manager.save(model, path))


class NotebookEdits:
    """The edit tools' calls made for runs: each a tool step, its edit recorded, applied once on the file.

    ``mode``: ``"apply"`` (at once) or ``"ask"`` (each edit a question
    showing its diff first, ``c.AgentRuns.notebook_edits``); ``room``: the
    bytes an edit's texts may take in its event.
    """

    def __init__(self, files: NotebookFiles, mode: str = "apply", room: int = 131072):
        self.files = files
        self.mode = mode
        self.room = room
        # One edit of a notebook at a time: each reads, changes and saves the whole file.
        self._locks: dict[str, asyncio.Lock] = {}
        # run_id -> cell id -> the cell's source as the run's agent last read or wrote it.
        self._seen: dict[str, dict[str, str]] = {}

    def saw(self, run_id: str, cells: dict[str, str]) -> None:
        """The run's agent read these cells (by id): its edits expect them so."""
        self._seen.setdefault(run_id, {}).update(cells)

    def forget(self, run_id: str) -> None:
        """The run ended here."""
        self._seen.pop(run_id, None)

    def _lock(self, path: str) -> asyncio.Lock:
        return self._locks.setdefault(path, asyncio.Lock())

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
            edit = plan(tool, args, await self.files.read(path), path, self._seen.get(run.run_id))
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
        started = _StepRun(run)

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
        if edit["status"] == "conflict":
            await run.emit(EVENT, edit)
            return answer(edit)
        # Durable before the file is touched: a run taken over finds the edit and settles it.
        await run.emit(EVENT, edit)
        await run.durable()
        return await self._settle(run, edit, applied_yet=False)

    async def _settle(self, run: Any, edit: dict[str, Any], applied_yet: bool = True) -> Ended:
        """Bring a ``pending`` edit to ``applied`` (made now if the file lacks it) or ``conflict``.

        ``applied_yet``: whether the file may hold it already (a take-over).
        """
        path = edit["notebook"]
        settled = dict(edit)
        async with self._lock(path):
            notebook = await self.files.read(path)
            if applied_yet and is_applied(notebook, edit):
                found = find_cell(notebook, edit["cell_id"])
                settled["status"] = "applied"
                if found is not None:
                    settled["index"] = found[0]
            else:
                try:
                    settled["index"] = apply(notebook, edit, run.run_id)
                    settled["status"] = "applied"
                except EditConflict as exc:
                    settled["status"] = "conflict"
                    settled["reason"] = str(exc)
                if settled["status"] == "applied":
                    try:
                        await self.files.write(path, notebook)
                    except Exception:
                        # Saved or not, the file says which (never recorded applied unsaid).
                        if not is_applied(await self.files.read(path), edit):
                            settled["status"] = "conflict"
                            settled["reason"] = "the notebook could not be saved"
        await run.emit(EVENT, settled)
        if settled["status"] == "applied" and settled["op"] != "delete":
            self.saw(run.run_id, {settled["cell_id"]: settled["after"]})
        return answer(settled)

    async def resume(self, run: Any, step: dict[str, Any]) -> Ended:
        """A step of an edit tool an earlier attempt of ``run`` started: settled by the file, made once.

        A ``pending`` edit whose cell is stamped with its ``edit_id`` (or, for
        a delete, whose cell is gone) was applied and is recorded so; one the
        file lacks is applied now, unless its cell changed (``conflict``). A
        step whose edit was never recorded never touched the file.
        """
        edits = [e for e in run.snapshot.get("edits") or [] if e.get("call_id") == step["call_id"]]

        async def act() -> Ended:
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
        """Reverse an applied edit on its notebook's file (``EditConflict`` when its cell changed)."""
        path = edit["notebook"]
        async with self._lock(path):
            notebook = await self.files.read(path)
            revert(notebook, edit)
            await self.files.write(path, notebook)

    async def direct(self, tool: str, args: dict[str, Any], path: str) -> Ended:
        """A call made with a person's own token: no run records it, the file is changed at once."""
        async with self._lock(path):
            notebook = await self.files.read(path)
            edit = plan(tool, args, notebook, path)
            if edit["status"] == "pending":
                try:
                    edit["index"] = apply(notebook, edit, None)
                    edit["status"] = "applied"
                except EditConflict as exc:
                    edit["status"], edit["reason"] = "conflict", str(exc)
            if edit["status"] == "applied":
                await self.files.write(path, notebook)
        return answer(edit)


class _StepRun:
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
QUESTIONS = {
    "insert": "Insert this cell",
    "edit": "Change this cell",
    "delete": "Delete this cell",
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
