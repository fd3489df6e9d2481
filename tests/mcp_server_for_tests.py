"""A small MCP server over stdio, written with the SDK's MCPServer (formerly FastMCP).

Started by the servers of the tests as one of ``c.AgentRuns.mcp_servers``:
``python mcp_server_for_tests.py``. Its tools: ``add`` (two numbers),
``shout`` (a text in capitals, with the server's environment variable
``SHOUT_SUFFIX`` after it, to show that a server's ``env`` reaches it) and
``fail`` (an error with the reason given) and ``wait`` (a while).
"""

import os

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("tests")


@server.tool()
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


if __name__ == "__main__":
    server.run()
