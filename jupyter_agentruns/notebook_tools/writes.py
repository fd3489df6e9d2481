"""A notebook an agent writes whole (ACP's ``fs/write_text_file``), made as cell edits.

An agent that edits files writes a ``.ipynb`` as one text. Written over the
file, it would replace the notebook a person has open, their unsaved work
with it. Instead the text is parsed (nbformat) and compared, cell id by cell
id, with what the agent last read of the notebook (``NotebookEdits.saw``)
and with the notebook as its place holds it now: a cell the agent added is
an ``insert_cell`` (at its position, with its id when that id is free), a
cell whose source it changed an ``edit_cell``, a cell it left out a
``delete_cell``. Each is a notebook edit of the run, made exactly as the
notebook tools make theirs (same events, statuses and conflicts). Only the
cells' sources are taken: the outputs, execution counts and metadata of the
text are not, nor a new order of the cells already there.

What the agent reads of a notebook (``fs/read_text_file``) is the notebook
as its place holds it (:func:`notebook_text`), recorded as read, as
``read_notebook`` does.
"""

from __future__ import annotations

import copy
import json
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any

import nbformat

from .edits import CELL_ID, STAMP, NotebookEdits, source_of
from .kernels import NotebookNotFound

# Metadata keys nbformat drops on reading (a contents manager adds ``trusted`` to each cell).
TRANSIENT = {STAMP, "trusted", "signature", "orig_nbformat", "orig_nbformat_minor"}


class InvalidNotebook(ValueError):
    """A written text that is not a notebook, or not one that can be matched cell by cell."""

    error_type = "invalid_notebook"


@dataclass
class Written:
    """What a notebook's write did: ``ok`` when every change it asked for was made.

    ``changes``: each edit, ``{"op", "cell_id", "status", "edit_id"?,
    "message"?}``; ``notes``: what of the text was not taken, and why;
    ``error``: the write was refused whole (``{type, message}``), nothing changed.
    """

    ok: bool
    changes: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        """What the agent reads of it."""
        if self.error is not None:
            return f"{self.error['message']} (nothing was changed)"
        lines = [
            "The notebook was not written over: its cells were changed one by one."
            if self.changes
            else "The notebook was not written over, and no cell of it needed a change."
        ]
        for change in self.changes:
            line = f"- {change['op']} cell {change['cell_id']}: {change['status']}"
            if change.get("message"):
                line += f" ({change['message']})"
            lines.append(line)
        lines.extend(f"Note: {note}" for note in self.notes)
        if not self.ok:
            lines.append(
                "Read the notebook again (fs/read_text_file) and write it from what it holds now."
            )
        return "\n".join(lines)

    def summary(self) -> dict[str, Any]:
        """The same as data (an ACP answer's ``_meta``)."""
        return {"changes": self.changes, "notes": self.notes, "text": self.text}


def parse(text: str) -> dict[str, Any]:
    """The notebook (nbformat 4) a text holds; :class:`InvalidNotebook` saying why when it holds none.

    A cell written without an id has none in the answer (nbformat would make one up).
    """
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or not isinstance(raw.get("nbformat"), int):
            # nbformat would take it for a notebook of its first version.
            raise ValueError("it has no 'nbformat' version")
        cells = raw.get("cells")
        ids = [c.get("id") if isinstance(c, dict) else None for c in cells or ()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nbformat's about the ids it adds
            notebook = nbformat.reads(text, as_version=4)
            nbformat.validate(notebook)
    except Exception as exc:  # not JSON, not a notebook, not valid: nbformat says which
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidNotebook(
            f"the text written is not a valid notebook: {message[:500]}"
        ) from None
    # nbformat gives a new id to a cell without one, and to the second of two of one id.
    given = [cell_id for cell_id in ids if cell_id]
    if len(set(given)) != len(given):
        raise InvalidNotebook("the text written has two cells of the same id")
    content = json.loads(json.dumps(notebook))
    if len(ids) == len(content["cells"]):
        for cell, cell_id in zip(content["cells"], ids, strict=True):
            if not cell_id:
                cell.pop("id", None)
    return content


def notebook_text(notebook: dict[str, Any]) -> str:
    """A notebook's content as its file holds it (nbformat's JSON)."""
    return nbformat.writes(nbformat.from_dict(copy.deepcopy(notebook)), version=nbformat.NO_CONVERT)


def plan_calls(
    written: dict[str, Any], now: dict[str, Any], seen: dict[str, str]
) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The edit tools' calls that make ``now`` hold the cells of ``written``, and what is not taken.

    ``seen``: the cells' sources as the agent last read them (by id). A cell
    whose written source is what the agent read is left as the notebook holds
    it now (a person's change since stays); a cell of the notebook the agent
    never read (one a person added since) is kept. Raises
    :class:`InvalidNotebook` when cells cannot be matched.
    """
    now_cells = now.get("cells") or []
    if any(not cell.get("id") for cell in now_cells):
        raise InvalidNotebook(
            "the notebook's cells have no ids (nbformat before 4.5): it cannot be changed cell "
            "by cell; open it in JupyterLab and save it once, which gives each cell its id"
        )
    written_cells = list(written.get("cells") or [])
    if written_cells and all(not cell.get("id") for cell in written_cells):
        # An older notebook's cells (or ones whose ids were left out): by position, or not at all.
        if len(written_cells) != len(now_cells):
            raise InvalidNotebook(
                f"the text written has cells without ids, and {len(written_cells)} cells where "
                f"the notebook has {len(now_cells)}: cells without ids are matched by position "
                "only when the counts agree; write the notebook with its cells' ids, as reading "
                "it gives them"
            )
        written_cells = [
            {**cell, "id": now_cell["id"]}
            for cell, now_cell in zip(written_cells, now_cells, strict=True)
        ]
    by_id = {cell["id"]: cell for cell in now_cells}
    taken = set(by_id)
    calls: list[tuple[str, dict[str, Any]]] = []
    notes: list[str] = []
    ignored = _lasting(written.get("metadata")) != _lasting(now.get("metadata"))
    kept_order: list[str] = []
    previous = "start"
    for cell in written_cells:
        cell_id = cell.get("id") or ""  # none: a new cell among cells with ids
        source = source_of(cell)
        current = by_id.get(cell_id)
        if current is not None:
            kept_order.append(cell_id)
            if source != seen.get(cell_id, source_of(current)):
                calls.append(("edit_cell", {"cell_id": cell_id, "source": source}))
            if cell.get("cell_type") != current.get("cell_type"):
                notes.append(
                    f"cell {cell_id} stays a {current.get('cell_type')} cell: a write does not "
                    "change a cell's type (delete it and add a new one)"
                )
            ignored = ignored or _extras(cell) != _extras(current)
        elif cell_id in seen:
            if source != seen[cell_id]:  # its edit fails as one of a cell that is gone
                calls.append(("edit_cell", {"cell_id": cell_id, "source": source}))
            notes.append(
                f"cell {cell_id} was deleted from the notebook since you read it: it was not "
                "added again"
            )
            continue
        else:
            new_id = cell_id if CELL_ID.match(cell_id) and cell_id not in taken else _fresh(taken)
            taken.add(new_id)
            args = {"source": source, "cell_type": cell.get("cell_type", "code")}
            calls.append(("insert_cell", {**args, "after": previous, "cell_id": new_id}))
            ignored = ignored or any(_extras(cell).values())
            cell_id = new_id
        previous = cell_id
    read_any = any(cell_id in seen for cell_id in by_id)
    written_ids = {cell.get("id") for cell in written_cells}
    for cell_id in by_id:
        if cell_id in written_ids:
            continue
        if cell_id in seen or not read_any:
            calls.append(("delete_cell", {"cell_id": cell_id}))
        else:
            notes.append(f"cell {cell_id} was added to the notebook since you read it: it was kept")
    if kept_order != [cell_id for cell_id in by_id if cell_id in set(kept_order)]:
        notes.append(
            "the cells already in the notebook keep their order: a write does not move cells"
        )
    if ignored:
        notes.append(
            "only the cells' sources are taken from a written notebook: its outputs, execution "
            "counts and metadata were not"
        )
    return calls, notes


async def write(edits: NotebookEdits, run: Any, path: str, text: str) -> Written | None:
    """Make the notebook ``path`` hold the cells ``text`` has, as the run's edits, one step each.

    None when no place holds ``path`` as a notebook (no such file, or not a
    notebook): there is no notebook to change cell by cell.
    """
    try:
        _, now = await edits.places.open(path)
    except NotebookNotFound:
        return None
    try:
        written = parse(text)
        calls, notes = plan_calls(written, now, edits.seen_by(run.run_id))
    except InvalidNotebook as exc:
        return Written(False, error={"type": InvalidNotebook.error_type, "message": str(exc)})
    changes: list[dict[str, Any]] = []
    # The cells inserted as another id than planned, and (to the cell before them) those
    # that could not be: the cells planned after them go after that cell.
    moved: dict[str, str] = {}
    for tool, args in calls:
        while tool == "insert_cell" and args["after"] in moved:
            args = {**args, "after": moved[args["after"]]}
        ended = await edits.step(run, tool, args, path)
        change = {"op": tool.split("_")[0], "cell_id": args["cell_id"]}
        if ended.ok:
            change.update(status="applied", edit_id=ended.result["edit_id"])
            change["cell_id"] = ended.result["cell_id"]
        else:
            error = ended.error or {}
            change.update(status=str(error.get("type")), message=str(error.get("message"))[:500])
            if error.get("edit_id"):
                change["edit_id"] = error["edit_id"]
        if tool == "insert_cell" and (not ended.ok or change["cell_id"] != args["cell_id"]):
            moved[args["cell_id"]] = change["cell_id"] if ended.ok else args["after"]
        changes.append(change)
    return Written(all(c["status"] == "applied" for c in changes), changes, notes)


def _fresh(taken: set[str]) -> str:
    cell_id = uuid.uuid4().hex[:8]
    while cell_id in taken:
        cell_id = uuid.uuid4().hex[:8]
    return cell_id


def _extras(cell: dict[str, Any]) -> dict[str, Any]:
    """What a cell holds beside its id, type and source: what a write does not take."""
    return {
        "outputs": cell.get("outputs") or [],
        "execution_count": cell.get("execution_count"),
        "metadata": _lasting(cell.get("metadata")),
        "attachments": cell.get("attachments") or {},
    }


def _lasting(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """Metadata without what is no one's writing: an agent's stamp, and what nbformat drops on
    reading (a contents manager's ``trusted``, the notebook's signature)."""
    return {k: v for k, v in (metadata or {}).items() if k not in TRANSIENT}
