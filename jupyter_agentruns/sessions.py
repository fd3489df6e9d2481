"""A notebook's path in a run: relative to the server's root, as JupyterLab names files.

A kernel knows its notebook by its path on disk (``JPY_SESSION_NAME`` is
absolute), and ``submit()`` sends that as the run's ``session``. The server
records it relative to its root instead, so that the CLI's ``--session``,
``?notebook=``, the panel and every run object name a notebook as the file
browser does, and no path of the machine shows. Runs recorded with the
absolute path before are still found by the relative one, and shown with it.
"""

from __future__ import annotations

import os
from typing import Any


class SessionPaths:
    """The sessions of runs on a server whose files are under ``root`` (None: no files, nothing to change)."""

    def __init__(self, root: str | None):
        self.root = os.path.abspath(root) if root else None

    def relative(self, session: str | None) -> str | None:
        """``session`` as runs record and show it: a path under the root relative to it
        (``/``-separated, as JupyterLab names files); anything else as it is."""
        if session is None or self.root is None or not os.path.isabs(session):
            return session
        try:
            relative = os.path.relpath(os.path.normpath(session), self.root)
        except ValueError:  # on another drive
            return session
        if relative in (os.curdir, os.pardir) or relative.startswith(os.pardir + os.sep):
            return session  # not under the root: the root cannot name it
        return relative.replace(os.sep, "/")

    def forms(self, session: str) -> tuple[str, ...]:
        """Every form a run may have recorded ``session`` in: relative, and the absolute path of older runs."""
        relative = self.relative(session)
        assert relative is not None
        if self.root is None or os.path.isabs(relative):
            return (relative,)
        parts = relative.split("/")
        if any(part in ("", os.curdir, os.pardir) for part in parts):
            return (relative,)
        return (relative, os.path.join(self.root, *parts))

    def metadata(self, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
        """``metadata`` with its ``notebook`` (what ``submit()`` records beside another session) relative."""
        notebook = metadata.get("notebook") if metadata else None
        if not isinstance(notebook, str) or self.relative(notebook) == notebook:
            return metadata
        assert metadata is not None  # it has a notebook
        return {**metadata, "notebook": self.relative(notebook)}
