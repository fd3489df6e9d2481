"""The server's root as an ACP agent sees it: files read and written inside it only.

An agent names files by absolute path (``fs/read_text_file``,
``fs/write_text_file``). Each path is resolved with its symbolic links and
must stay under the server's root; a write goes through jupyter_server's
contents manager (passed in by the server: agents do not import it), so an
open JupyterLab sees the change as it sees its own. Hidden files (a name
under the root starting with ".", ``.git/config`` among them) are refused
before anything is read or written, as JupyterLab hides them, unless the
contents manager's ``allow_hidden`` (``c.ContentsManager.allow_hidden``) is
on: a repository's configuration can run commands at its next ``git status``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from typing import Any

# A file an agent reads at once, at most.
MAX_READ_BYTES = 16 * 1024 * 1024


class Refused(Exception):
    """A path outside the server's root or hidden, or a file that cannot be read or written as text."""


class Files:
    """Reads and writes under ``root``, writes through ``contents_manager`` when there is one."""

    def __init__(self, root: str, contents_manager: Any = None):
        self.root = os.path.realpath(root)
        self.contents_manager = contents_manager

    @property
    def allow_hidden(self) -> bool:
        """Hidden files are the agent's too (the contents manager's ``allow_hidden``)."""
        return bool(getattr(self.contents_manager, "allow_hidden", False))

    def resolve(self, path: str) -> str:
        """The real path of ``path`` (absolute), if it is under the root and not hidden; else ``Refused``."""
        if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
            raise Refused(f"{path!r} is not an absolute path")
        real = os.path.realpath(path)
        if real != self.root and not real.startswith(self.root + os.sep):
            raise Refused(
                f"{path} is outside the Jupyter server's root: an agent reads and writes "
                "files under it only"
            )
        hidden = [part for part in self.name(real).split("/") if part.startswith(".")]
        if hidden and real != self.root and not self.allow_hidden:
            raise Refused(
                f"{path} is hidden ({hidden[0]!r} starts with '.'): an agent reads and writes "
                "hidden files only where c.ContentsManager.allow_hidden is True"
            )
        return real

    def under_root(self, path: str) -> str:
        """The real path of ``path``, relative to the root (as JupyterLab names files) or absolute."""
        if not os.path.isabs(path):
            path = os.path.join(self.root, path)
        return self.resolve(path)

    def name(self, real: str) -> str:
        """``real`` (under the root) as JupyterLab names it: relative, ``/``-separated."""
        return os.path.relpath(real, self.root).replace(os.sep, "/")

    async def read(self, path: str, line: int | None = None, limit: int | None = None) -> str:
        """The text of the file at ``path``, from its ``line`` (1-based), ``limit`` lines of it."""
        real = self.resolve(path)
        text = await asyncio.to_thread(_read_text, real)
        if text is None:
            raise Refused(f"{path} does not exist")
        return excerpt(text, line, limit)

    async def write(self, path: str, content: str) -> tuple[str, str | None]:
        """Write ``content`` to ``path``; returns its name and its text before (None: a new file)."""
        real = self.resolve(path)
        if os.path.isdir(real):
            raise Refused(f"{path} is a directory")
        old = await asyncio.to_thread(_read_text, real)
        name = self.name(real)
        manager = self.contents_manager
        if manager is None:
            await asyncio.to_thread(_write_text, real, content)
            return name, old
        try:
            parent = os.path.dirname(name)
            missing = []
            while parent and not os.path.isdir(os.path.join(self.root, parent)):
                missing.append(parent)
                parent = os.path.dirname(parent)
            for directory in reversed(missing):
                await _maybe_await(manager.save({"type": "directory"}, directory))
            model = {"type": "file", "format": "text", "content": content}
            await _maybe_await(manager.save(model, name))
        except Exception as exc:
            # A contents manager may fail after writing (reading the file back,
            # a post-save hook): what is on disk says whether the write was done.
            if await asyncio.to_thread(_read_text_or_none, real) == content:
                return name, old
            # Its own refusals (a read-only directory) are tornado HTTP errors:
            # their reason is log_message.
            reason = getattr(exc, "log_message", None) or str(exc) or type(exc).__name__
            raise Refused(f"{path} cannot be written: {reason}") from None
        return name, old


def excerpt(text: str, line: int | None = None, limit: int | None = None) -> str:
    """``limit`` lines of ``text`` from its ``line`` (1-based); all of it when neither is given."""
    if line is None and limit is None:
        return text
    lines = text.splitlines(keepends=True)
    start = max(0, (line or 1) - 1)
    end = len(lines) if limit is None else start + max(0, limit)
    return "".join(lines[start:end])


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _read_text(real: str) -> str | None:
    try:
        with open(real, "rb") as file:
            data = file.read(MAX_READ_BYTES + 1)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise Refused(f"{real} is a directory") from None
    except OSError as exc:
        raise Refused(f"{real} cannot be read: {exc.strerror}") from None
    if len(data) > MAX_READ_BYTES:
        raise Refused(f"{real} is larger than {MAX_READ_BYTES // (1024 * 1024)} MiB")
    return data.decode("utf-8", errors="replace")


def _read_text_or_none(real: str) -> str | None:
    try:
        return _read_text(real)
    except Refused:
        return None


def _write_text(real: str, content: str) -> None:
    os.makedirs(os.path.dirname(real), exist_ok=True)
    with open(real, "w", encoding="utf-8") as file:
        file.write(content)
