"""The live shared document of a notebook, where jupyter-collaboration serves one.

With jupyter-collaboration, every page that has a notebook open edits one
shared document (a ``YNotebook`` of ``jupyter_ydoc``, kept in sync with the
pages over the collaboration websocket), and the collaboration extension
saves it to the file by itself. An edit made there shows in every open page
at once, with no "Reload from Disk" and no prompt to overwrite the file: the
first place an edit is made (DESIGN, "Agents that edit the notebook").

Only the collaboration extension's documented ``get_document`` is used, and
nothing of it is imported here: the server hands its method over when the
extension is enabled.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .places import Change

# jupyter_server_ydoc's YDocExtension.get_document.
GetDocument = Callable[..., Awaitable[Any]]


class DocumentChanged(RuntimeError):
    """The live document changed between reading it and making a change: nothing was changed."""


class DocumentPlace:
    """A notebook's live shared document, when a page holds it open in a collaboration room.

    ``get_document``: the collaboration extension's
    ``get_document(path=..., content_type=..., file_format=..., copy=...)``.
    """

    name = "document"

    def __init__(self, get_document: GetDocument, log: logging.Logger | None = None):
        self.get_document = get_document
        self.log = log or logging.getLogger(__name__)
        # path -> (the notebook as last read, its cells' ids and sources then):
        # a change is made only on that very read (another read since, and the
        # change is refused: the caller reads again) and on the document as it was.
        self._read: dict[str, tuple[dict[str, Any], list[tuple[Any, str]]]] = {}

    async def _live(self, path: str) -> Any:
        """The live ``YNotebook`` of ``path``, or None when no room holds it."""
        try:
            document = await self.get_document(
                path=path, content_type="notebook", file_format="json", copy=False
            )
        except Exception as exc:  # its file then: the room picks up a change of the file
            self.log.warning("agentruns: the live document of %s cannot be read: %s", path, exc)
            return None
        return document

    async def read(self, path: str) -> dict[str, Any] | None:
        """The live document's content (nbformat 4), or None when no page holds it open."""
        document = await self._live(path)
        self._read.pop(path, None)
        if document is None:
            return None
        # Read at once (no await until it is kept): one state of the document.
        notebook = document.get()
        if not notebook.get("nbformat"):
            return None  # a room still loading its file holds no notebook yet
        self._read[path] = (notebook, _cells(document))
        return notebook

    async def make(self, path: str, notebook: dict[str, Any], change: Change) -> None:
        """Make ``change`` in the live document, in one transaction that every page receives.

        Raises :class:`DocumentChanged` (nothing changed) when the document's
        cells moved, or the changed cell's text changed, since ``notebook`` was read.
        """
        document = await self._live(path)
        read, cells = self._read.pop(path, (None, None))
        if document is None:
            raise DocumentChanged(f"the live document of {path} was closed")
        # From here on nothing awaits: no one else changes the document meanwhile.
        now = _cells(document)
        if read is not notebook or cells is None or [i for i, _ in now] != [i for i, _ in cells]:
            raise DocumentChanged(f"the cells of {path} changed while the edit was made")
        if change.kind != "insert" and now[change.index][1] != cells[change.index][1]:
            raise DocumentChanged(f"the cell {now[change.index][0]!r} changed meanwhile")
        with document.ydoc.transaction():
            if change.kind == "insert":
                assert change.cell is not None  # an insert carries its cell
                document.ycells.insert(change.index, document.create_ycell(change.cell))
            elif change.kind == "delete":
                del document.ycells[change.index]
            else:
                assert change.cell is not None  # a replace carries the cell it becomes
                _replace(document, change.index, change.cell)


def _cells(document: Any) -> list[tuple[Any, str]]:
    """Each cell's id and source, in order."""
    return [(ycell.get("id"), str(ycell.get("source", ""))) for ycell in document.ycells]


def _replace(document: Any, index: int, cell: dict[str, Any]) -> None:
    """Make the cell at ``index`` hold ``cell``, changing only what differs.

    The cell stays the same shared object: a person's cursor in another cell,
    or in this one's unchanged text, stays where it is.
    """
    from pycrdt import Array, Map, Text

    ycell = document.ycells[index]
    was = document.get_cell(index)
    if was.get("cell_type") != cell.get("cell_type") or not isinstance(ycell.get("metadata"), Map):
        document.set_cell(index, cell)
        return
    source = cell.get("source") or ""
    source = "".join(source) if isinstance(source, list) else source
    if source != str(ycell["source"]):
        document.set_cell(index, source=source)  # the text's own diff: granular
    metadata = ycell["metadata"]
    new_metadata = cell.get("metadata") or {}
    for key in set(was.get("metadata") or {}) - set(new_metadata):
        del metadata[key]
    for key, value in new_metadata.items():
        if (was.get("metadata") or {}).get(key) != value:
            metadata[key] = value
    for key in set(was) - set(cell) - {"id"}:
        del ycell[key]
    for key, value in cell.items():
        if key in ("source", "metadata", "cell_type") or was.get(key) == value:
            continue
        if key == "outputs" and isinstance(ycell.get("outputs"), Array):
            outputs = ycell["outputs"]
            outputs.clear()
            # As jupyter_ydoc keeps them: a stream's text is shared text.
            outputs.extend(
                [
                    Map(
                        {**output, "text": Text(_text(output.get("text")))}
                        if output.get("output_type") == "stream"
                        else dict(output)
                    )
                    for output in value
                ]
            )
        else:
            ycell[key] = value


def _text(text: Any) -> str:
    return "".join(text) if isinstance(text, list) else str(text or "")
