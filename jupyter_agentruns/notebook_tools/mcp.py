"""The notebook tools (and a person's run tools) as an MCP server at ``api/agentruns/mcp``:
Streamable HTTP, stateless.

The SDK's Streamable HTTP transport is an ASGI application; the server's
HTTP handler hands each request to it (``handle``) with the caller it
authenticated in the ASGI scope, under ``SCOPE_CALLER``. Stateless, with JSON
answers: every POST is one JSON-RPC exchange, so nothing is kept between
requests and any server process can answer any request.

The SDK takes most of a second of CPU to import, which every start of the
server would pay: it is imported at the first request (:mod:`.mcp_server`),
off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from . import NotebookAccess

SCOPE_CALLER = "agentruns.caller"
SDK_MODULES = ("mcp", "mcp_types")


@dataclass
class Caller:
    """Who calls: a run (its agent, with the run's token) or a person (their own token)."""

    run: Any = None  # the agent API's ``run`` on the live run
    stopping: asyncio.Event | None = None  # set when the run is asked to stop
    # A person's run tools: ``definitions``, ``names`` and ``call(name, args)`` (raising
    # ``Problem``), made by the server's handler, which knows the engine.
    runs: Any = None
    # Why the notebook tools do not act for this person here (None: they do).
    notebook_problem: str | None = None


def sdk_problem() -> str | None:
    """Why the MCP server cannot be served here (its SDK is not installed), or None."""
    missing = [name for name in SDK_MODULES if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (
        f"the notebook tools' MCP server needs the mcp package (no module {missing[0]!r}): "
        "pip install 'jupyter_agentruns[mcp]'"
    )


def _import_mcp_server() -> ModuleType:
    # In a thread: the SDK's import is most of a second of CPU, which the loop must not wait on.
    from . import mcp_server

    return mcp_server


class NotebookMCP:
    """The MCP server of the notebook tools, made at its first request, and its life on the server's loop."""

    def __init__(self, access: NotebookAccess):
        self.access = access
        self.manager: Any = None  # the SDK's StreamableHTTPSessionManager, once made
        self._running: asyncio.Task | None = None
        # (An Event takes the loop of its first wait: the server's, in handle.)
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Serve one ASGI HTTP request (``scope[SCOPE_CALLER]`` says who calls)."""
        if self._running is None:
            self._running = asyncio.ensure_future(self._run())
        if not self._ready.is_set():
            ready = asyncio.ensure_future(self._ready.wait())
            try:
                await asyncio.wait({ready, self._running}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
            if not self._ready.is_set():  # it could not be made: every request says why
                self._running.result()
                raise RuntimeError("the notebook tools' MCP server stopped")
        await self.manager.handle_request(scope, receive, send)

    async def _run(self) -> None:
        made = await asyncio.to_thread(_import_mcp_server)
        self.manager = made.session_manager(self.access)
        async with self.manager.run():
            self._ready.set()
            await self._stop.wait()

    async def close(self) -> None:
        if self._running is not None:
            self._stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._running, 5)
