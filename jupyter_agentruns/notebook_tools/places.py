"""Where a notebook edit is made: the places that hold a notebook, tried in order.

DESIGN applies an edit by the first of: the shared document (when
jupyter-collaboration serves the notebook as a live document), a page that
has the notebook open, and the server on the file. Each is a :class:`Place`:
``read`` answers the notebook as that place holds it now (None when it does
not hold it: no live document, no open page), and ``make`` makes a
:class:`Change` there. The change is computed once, on the notebook as read
(see :mod:`.edits`), so every place makes exactly the same edit, and a
place's notebook, read again, tells whether an edit reached it (its cell
stamped with the ``edit_id``).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from jupyter_core.utils import ensure_async

from .kernels import NotebookNotFound


@dataclass(frozen=True)
class Change:
    """What an edit (or its undo) does to a notebook's cells, for a place to make.

    ``kind``: ``insert`` (``cell`` goes at ``index``), ``replace`` (the cell
    at ``index`` becomes ``cell``: same id, new source, outputs or metadata)
    or ``delete`` (the cell at ``index`` goes).
    """

    kind: Literal["insert", "replace", "delete"]
    index: int
    cell: dict[str, Any] | None = None


class Place(Protocol):
    """A place that may hold a notebook and make a change to it."""

    name: str

    async def read(self, path: str) -> dict[str, Any] | None:
        """The notebook's content (nbformat 4, a copy) as this place holds it now, or None."""

    async def make(self, path: str, notebook: dict[str, Any], change: Change) -> None:
        """Make ``change`` here; ``notebook`` is the content as read, with the change made on it.

        Raises when it could not: the caller reads the place again to know
        whether the change got there.
        """


class FilePlace:
    """The notebook's file, through the server's contents manager (its documented ``get`` and ``save``)."""

    name = "file"

    def __init__(self, contents_manager: Any):
        self.contents_manager = contents_manager
        # Called with a notebook's path once a change of it is saved here.
        self.saved: list[Callable[[str], None]] = []

    async def read(self, path: str) -> dict[str, Any]:
        """The file's content (nbformat 4); :class:`NotebookNotFound` when it cannot be read."""
        try:
            model = await ensure_async(
                self.contents_manager.get(path, content=True, type="notebook")
            )
        except Exception as exc:
            raise NotebookNotFound(f"cannot read the notebook {path!r}: {exc}") from None
        return copy.deepcopy(model["content"])

    async def make(self, path: str, notebook: dict[str, Any], change: Change) -> None:
        """Save the whole notebook (the change made on it)."""
        model = {"type": "notebook", "format": "json", "content": notebook}
        await ensure_async(self.contents_manager.save(model, path))
        for told in self.saved:
            told(path)


class Places:
    """The places of a server's notebooks, in the order an edit tries them; the file is last.

    One change of a notebook at a time (``lock``): each reads, changes and
    makes, and two made at once on the same notebook would lose one.
    """

    def __init__(self, file: FilePlace, before: Sequence[Place] = ()):
        self.file = file
        self.order: list[Place] = [*before, file]
        self._locks: dict[str, asyncio.Lock] = {}

    def add(self, place: Place) -> None:
        """Try ``place`` before the file (and after the places added before it)."""
        self.order.insert(len(self.order) - 1, place)

    def lock(self, path: str) -> asyncio.Lock:
        """The lock of the notebook ``path``."""
        return self._locks.setdefault(path, asyncio.Lock())

    async def open(self, path: str) -> tuple[Place, dict[str, Any]]:
        """The first place holding ``path`` now, and the notebook as it holds it."""
        for place in self.order[:-1]:
            notebook = await place.read(path)
            if notebook is not None:
                return place, notebook
        return self.file, await self.file.read(path)
