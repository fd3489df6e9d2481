"""What a run is given beyond its input: the notebook tools, the MCP servers.

``RunProvisions`` is decided once, when the server wires its engine, and
equips every ``run`` the executor makes (its agent's, and the notebook
tools' calls made over MCP) the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .context import RunContext


@dataclass(frozen=True)
class RunProvisions:
    """The server's provisions for its runs."""

    # A run's notebook tools, made for it (None: a server without them, e.g. the command line's).
    notebook_tools: Callable[[RunContext], Any] | None = None
    # A run's notebook writes (a notebook written whole made cell edits), made for it.
    notebook_writes: Callable[[RunContext], Any] | None = None
    # The configured MCP servers (c.AgentRuns.mcp_servers), by name.
    mcp_servers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # How a step cut by a take-over is settled (c.AgentRuns.in_doubt).
    in_doubt: str = "tell_model"

    def equip(self, run: RunContext) -> RunContext:
        """Give ``run`` its notebook tools and writes, a copy of the MCP servers' entries; returns it."""
        if self.notebook_tools is not None:
            run.notebook_tools = self.notebook_tools(run)
        if self.notebook_writes is not None:
            run.notebook_writes = run.notebook_tools or self.notebook_writes(run)
        run.mcp_servers = {name: dict(entry) for name, entry in self.mcp_servers.items()}
        run.in_doubt = self.in_doubt
        return run
