"""The tools of the configured MCP servers (``c.AgentRuns.mcp_servers``), through the ``mcp`` SDK.

A run that uses them opens one client session per server for its whole
length (``mcp_tools``): a server given by ``command`` is started over stdio
(``stdio_client``; it gets the SDK's default environment and its ``env``),
one given by ``url`` is reached over Streamable HTTP
(``streamable_http_client``, with its ``headers``). Each is listed once; its
tools become :class:`~jupyter_agentruns.agents.tools.Tool` objects named
``<server>__<tool>``, so that they cannot clash with each other, nor with
registered tools or the notebook tools (whose names have no ``__``). A tool
whose name does not fit a tool name (letters, digits, ``_`` and ``-``, at
most 64) that way is left out. A server that cannot be started or listed
fails the run, naming the server: a run that silently lacks tools it was
configured with would answer worse without saying why.

A call is not declared idempotent (a run taken over after its server died
reports a call that started without a result as interrupted, and does not
repeat it) unless the server says it is read-only or idempotent (its tool
annotations ``readOnlyHint``, ``idempotentHint``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from .. import tracing
from .tools import TOOL_NAME, Tool

SEPARATOR = "__"
# How long a server may take to start and list its tools.
LIST_SECONDS = 60.0
# How long closing the sessions (ending the servers started) may take after the run.
CLOSE_SECONDS = 5.0


class McpServerFailed(Exception):
    """A configured MCP server could not be started, or did not list its tools."""

    error_type = "mcp_server_failed"


class McpToolError(Exception):
    """An MCP server answered a tool call with an error."""

    error_type = "mcp_tool_error"


def offered_name(server: str, tool: str) -> str | None:
    """The name a server's tool is offered under, or None when it cannot be a tool name."""
    name = f"{server}{SEPARATOR}{tool}"
    return name if TOOL_NAME.match(name) else None


@contextlib.asynccontextmanager
async def mcp_tools(servers: dict[str, dict[str, Any]]) -> AsyncIterator[dict[str, Tool]]:
    """The tools of ``servers`` (``{name: entry}``), callable while the context is open.

    The sessions live in a task of their own: the SDK's clients hold task
    groups, which would wrap whatever the run raises meanwhile in an
    exception group (and its ``error_type`` would be lost).
    """
    if not servers:
        yield {}
        return
    try:
        import anyio  # noqa: F401
        from mcp.client.session import ClientSession  # noqa: F401
    except ImportError as exc:
        raise McpServerFailed(
            f"the MCP servers {', '.join(sorted(servers))} (c.AgentRuns.mcp_servers) need the "
            f"mcp package ({exc}): pip install 'jupyter_agentruns[mcp]'"
        ) from None
    ready: asyncio.Future[dict[str, Tool]] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()
    holder = asyncio.ensure_future(_hold(servers, ready, done))
    try:
        tools = await asyncio.shield(ready)
        yield tools
    finally:
        done.set()
        if not ready.done():
            holder.cancel()
        await asyncio.wait({holder}, timeout=CLOSE_SECONDS)
        if not holder.done():
            holder.cancel()
        elif not holder.cancelled():
            holder.exception()  # retrieved: closing a session may fail, the run is over


async def _hold(
    servers: dict[str, dict[str, Any]],
    ready: asyncio.Future[dict[str, Tool]],
    done: asyncio.Event,
) -> None:
    """Open a session with each server and list its tools; keep them open until ``done``."""
    import anyio

    async with contextlib.AsyncExitStack() as stack:
        tools: dict[str, Tool] = {}
        for server, entry in servers.items():
            try:
                # (Each scope inside the session's context: anyio's scopes must nest.)
                session = await stack.enter_async_context(_session(entry))
                with anyio.fail_after(LIST_SECONDS):
                    listed = await _list(session)
            except Exception as exc:
                how = (
                    f"did not start and list its tools within {LIST_SECONDS:g} s"
                    if isinstance(exc, TimeoutError)
                    else f"could not be started or listed: {_cause(exc)}"
                )
                if not ready.done():
                    ready.set_exception(
                        McpServerFailed(
                            f"the MCP server {server!r} (c.AgentRuns.mcp_servers) {how}"
                        )
                    )
                return
            for tool in listed:
                name = offered_name(server, tool.name)
                if name is None or name in tools:
                    continue
                annotations = tool.annotations
                idempotent = annotations is not None and bool(
                    annotations.read_only_hint or annotations.idempotent_hint
                )
                tools[name] = Tool(
                    name,
                    tool.description or "",
                    dict(tool.input_schema or {"type": "object"}),
                    _caller(session, server, tool.name),
                    idempotent,
                )
        if not ready.done():
            ready.set_result(tools)
        await done.wait()


@contextlib.asynccontextmanager
async def _session(entry: dict[str, Any]) -> AsyncIterator[Any]:
    """An initialized client session with the server of ``entry``."""
    import anyio
    from mcp.client.session import ClientSession

    async with contextlib.AsyncExitStack() as stack:
        if "command" in entry:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            command = entry["command"]
            parameters = StdioServerParameters(
                command=command[0],
                args=command[1:],
                env={**(entry.get("env") or {}), **tracing.environment()},
            )
            streams = await stack.enter_async_context(stdio_client(parameters))
        else:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = await stack.enter_async_context(
                create_mcp_http_client(
                    headers={**(entry.get("headers") or {}), **tracing.headers()}
                )
            )
            streams = await stack.enter_async_context(
                streamable_http_client(entry["url"], http_client=client)
            )
        session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
        with anyio.fail_after(LIST_SECONDS):
            await session.initialize()
        yield session


async def _list(session: Any) -> list[Any]:
    """Every tool the server lists, page after page."""
    from mcp_types import PaginatedRequestParams

    tools: list[Any] = []
    cursor = None
    while True:
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools


def _caller(session: Any, server: str, tool: str) -> Any:
    async def call(**args: Any) -> Any:
        result = await session.call_tool(tool, args)
        text = result_text(result)
        if result.is_error:
            raise McpToolError(text or f"the MCP server {server!r} failed the call of {tool}")
        return text

    return call


def result_text(result: Any) -> Any:
    """What a model reads of a tool's result: its text parts, else its structured content."""
    parts = []
    for item in result.content or ():
        kind = getattr(item, "type", None)
        if kind == "text":
            parts.append(item.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(item, 'mime_type', '')}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {item.uri}]")
        elif kind == "resource":
            resource = item.resource
            parts.append(getattr(resource, "text", None) or f"[resource: {resource.uri}]")
    if parts:
        return "\n".join(parts)
    structured = getattr(result, "structured_content", None)
    return json.loads(json.dumps(structured, default=str)) if structured is not None else ""


def _cause(exc: BaseException) -> str:
    """The first real error in ``exc`` (task groups wrap theirs), in words."""
    inner = getattr(exc, "exceptions", None)  # an exception group (no builtin in Python 3.10)
    while inner:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    said = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {said}"[:1000]
