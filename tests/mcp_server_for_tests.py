"""A small MCP server over stdio, written with the SDK's MCPServer (formerly FastMCP).

Started by the servers of the tests as one of ``c.AgentRuns.mcp_servers``:
``python mcp_server_for_tests.py``. Its tools: ``add`` (two numbers; read-only, it says),
``shout`` (a text in capitals, with the server's environment variable
``SHOUT_SUFFIX`` after it, to show that a server's ``env`` reaches it) and
``fail`` (an error with the reason given), ``wait`` (a while),
``header`` (an HTTP header of the request), ``traced`` (the trace context in
the call's ``_meta``) and ``variable`` (an environment variable of the server's process).
"""

import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

server = MCPServer("tests")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper() + os.environ.get("SHOUT_SUFFIX", "")


@server.tool()
def fail(reason: str) -> str:
    """Fail with the reason given."""
    raise ToolError(reason)  # the SDK tells the client its message


@server.tool()
async def wait(seconds: float) -> str:
    """Wait that long, then say so (not declared idempotent)."""
    await anyio.sleep(seconds)
    return "waited"


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The request's HTTP header of that name (over Streamable HTTP)."""
    request = getattr(ctx.request_context, "request", None)
    return getattr(request, "headers", {}).get(name, "")


@server.tool()
def traced(ctx: Context) -> str:
    """The trace context the call came with (its _meta's traceparent)."""
    meta = ctx.request_context.meta or {}
    return str(meta.get("traceparent", ""))


@server.tool()
def variable(name: str) -> str:
    """The server process's environment variable of that name."""
    return os.environ.get(name, "")


if __name__ == "__main__":
    # python mcp_server_for_tests.py [PORT]: over stdio, or Streamable HTTP at 127.0.0.1:PORT/mcp.
    if len(sys.argv) > 1:
        server.run("streamable-http", port=int(sys.argv[1]))
    else:
        server.run()
