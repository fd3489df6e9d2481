"""The notebook tools as an MCP server (the official ``mcp`` SDK), Streamable HTTP, stateless.

The SDK's Streamable HTTP transport is an ASGI application; the server's
HTTP handler hands each request to it (``handle``) with the caller it
authenticated in the ASGI scope, under ``SCOPE_CALLER``. Stateless, with JSON
answers: every POST is one JSON-RPC exchange, so nothing is kept between
requests and any server process can answer any request.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from . import NotebookAccess, definitions

SCOPE_CALLER = "agentruns.caller"


@dataclass
class Caller:
    """Who calls: a run (its agent, with the run's token) or a person (their own token)."""

    run: Any = None  # the agent API's ``run`` on the live run
    stopping: asyncio.Event | None = None  # set when the run is asked to stop


class NotebookMCP:
    """The MCP server of the notebook tools, and its session manager's life on the server's loop."""

    def __init__(self, access: NotebookAccess):
        self.access = access
        self.server = Server(
            "jupyter-agentruns-notebook",
            instructions="Tools on the live kernel of a Jupyter notebook: its variables, its "
            "cells, and code run in it.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.manager = StreamableHTTPSessionManager(
            app=self.server, json_response=True, stateless=True
        )
        self._running: asyncio.Task | None = None
        # (An Event takes the loop of its first wait: the server's, in handle.)
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Serve one ASGI HTTP request (``scope[SCOPE_CALLER]`` says who calls)."""
        if self._running is None:
            self._running = asyncio.ensure_future(self._run())
        await self._ready.wait()
        await self.manager.handle_request(scope, receive, send)

    async def _run(self) -> None:
        async with self.manager.run():
            self._ready.set()
            await self._stop.wait()

    async def close(self) -> None:
        if self._running is not None:
            self._stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._running, 5)

    @staticmethod
    def _caller(ctx: Any) -> Caller:
        request = getattr(ctx, "request", None)
        scope = getattr(request, "scope", None) or {}
        caller = scope.get(SCOPE_CALLER)
        if caller is None:
            raise ToolError("the request reached the notebook tools without a caller")
        return caller

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        caller = self._caller(ctx)
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=tool["name"],
                    description=tool["description"],
                    input_schema=tool["parameters"],
                )
                for tool in definitions(with_notebook=caller.run is None)
            ]
        )

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = self._caller(ctx)
        args = dict(params.arguments or {})
        if caller.run is None:
            notebook = args.pop("notebook", None)
            if not isinstance(notebook, str) or not notebook:
                raise ToolError(
                    "each notebook tool takes 'notebook': the notebook's path relative to the "
                    "server's root"
                )
            outcome = await self.access.tools.call(params.name, args, notebook=notebook)
        else:
            tools = self.access.for_run(caller.run)
            if tools is None:
                raise ToolError("this run has no notebook kernel of its owner's to work in")
            outcome = await self._for_run(caller, tools.call(params.name, args))
        content: list[Any] = [types.TextContent(type="text", text=outcome.text)]
        for image in outcome.images:
            content.append(
                types.ImageContent(type="image", data=image["data"], mime_type=image["mime"])
            )
        return types.CallToolResult(content=content, is_error=not outcome.ok)

    @staticmethod
    async def _for_run(caller: Caller, call: Any) -> Any:
        """The call, cancelled (the kernel interrupted) when its run is cancelled or ends."""
        assert caller.stopping is not None  # a run's caller is made with its run's stopping
        task = asyncio.ensure_future(call)
        stopping = asyncio.ensure_future(caller.stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise ToolError("the run was cancelled or ended: the call was stopped")
        return task.result()
