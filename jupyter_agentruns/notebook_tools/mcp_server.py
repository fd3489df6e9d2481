"""The notebook tools' MCP server (and a person's run tools), built with the official ``mcp`` SDK.

Imported at the first request to the MCP endpoint, not at the server's start
(see :mod:`.mcp`): the SDK takes most of a second to import.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from ..errors import ErrorCode, Problem
from . import TOOLS, NotebookAccess, definitions
from .mcp import SCOPE_CALLER, Caller


def session_manager(access: NotebookAccess) -> StreamableHTTPSessionManager:
    """The SDK's Streamable HTTP transport (stateless, JSON answers) over the tools."""
    tools = NotebookToolsServer(access)
    server = Server(
        "jupyter-agentruns",
        instructions="Runs of the Jupyter server's agents, which go on in the server whatever "
        "happens to this client (start_run, get_run, answer_run, cancel_run), and tools on "
        "the live kernel of a Jupyter notebook: its variables, its cells, and code run in it.",
        on_list_tools=tools.list_tools,
        on_call_tool=tools.call_tool,
    )
    return StreamableHTTPSessionManager(app=server, json_response=True, stateless=True)


class NotebookToolsServer:
    """The MCP server's two requests: list the tools, call one, for the caller of the request."""

    def __init__(self, access: NotebookAccess):
        self.access = access

    @staticmethod
    def _caller(ctx: Any) -> Caller:
        request = getattr(ctx, "request", None)
        scope = getattr(request, "scope", None) or {}
        caller = scope.get(SCOPE_CALLER)
        if caller is None:
            raise ToolError("the request reached the notebook tools without a caller")
        return caller

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        caller = self._caller(ctx)
        listed = list(caller.runs.definitions) if caller.runs is not None else []
        if caller.run is not None or caller.notebook_problem is None:
            listed += definitions(with_notebook=caller.run is None)
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=tool["name"],
                    description=tool["description"],
                    input_schema=tool["parameters"],
                    annotations=types.ToolAnnotations(**tool["annotations"])
                    if tool.get("annotations")
                    else None,
                )
                for tool in listed
            ]
        )

    async def call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = self._caller(ctx)
        args = dict(params.arguments or {})
        if caller.runs is not None and params.name in caller.runs.names:
            try:
                answer = await caller.runs.call(params.name, args)
            except Problem as problem:
                return _json_result(problem.body(), is_error=True)
            return _json_result(answer)
        if caller.run is None and caller.notebook_problem is not None:
            if params.name not in TOOLS:
                raise ToolError(f"there is no tool {params.name!r} for you on this server")
            problem = Problem(ErrorCode.NOTEBOOK_TOOLS_UNAVAILABLE, caller.notebook_problem)
            return _json_result(problem.body(), is_error=True)
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


def _json_result(value: dict[str, Any], is_error: bool = False) -> types.CallToolResult:
    """A tool's answer as JSON text (what a model reads) and as structured content."""
    text = json.dumps(value, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=value,
        is_error=is_error,
    )
