"""ACP agents: programs speaking the Agent Client Protocol over stdio, as agents of this server.

``c.AgentRuns.acp_agents = {"opencode": {"command": ["opencode", "acp"]}}``
makes each entry an agent of that name (opencode, Claude Code through
``claude-code-acp``, Codex through ``codex-acp``, Gemini CLI, goose, ...).
The server builds them with ``acp_agents``, giving them what they need of it
(its root, its contents manager): this package imports nothing of the
server. The modules: ``processes`` (the agents' processes, their clean
environment, their pool), ``client`` (the ACP client side, through the SDK),
``mapping`` (what the agent sends, as the run's events), ``files`` (the file
system an agent sees), ``agent`` (a run as one turn of a conversation).
Needs the ``acp`` extra (``pip install 'jupyter_agentruns[acp]'``).
"""

from __future__ import annotations

import logging
from typing import Any

from .. import AgentSpec, spec_for

__all__ = ["acp_agents"]


def acp_agents(
    entries: dict[str, dict[str, Any]],
    *,
    root_dir: str,
    contents_manager: Any,
    max_processes: int,
    idle_seconds: float,
    log: logging.Logger,
) -> tuple[dict[str, AgentSpec], dict[str, str], Any]:
    """The agents of ``entries``, the reasons of those that cannot be loaded, and the
    processes they share (closed with ``await processes.close()`` at the server's stop)."""
    if not entries:
        return {}, {}, None
    try:
        from .agent import AcpAgent
        from .files import Files
        from .processes import Processes
    except ImportError as exc:
        reason = f"{type(exc).__name__}: {exc}; pip install 'jupyter_agentruns[acp]'"
        log.error("agentruns: no ACP agents (%s): %s", ", ".join(sorted(entries)), reason)
        return {}, {name: reason for name in entries}, None
    files = Files(root_dir, contents_manager)
    processes = Processes(max_processes, idle_seconds, log)
    agents = {
        name: spec_for(name, AcpAgent(name, entry, files=files, processes=processes, log=log))
        for name, entry in entries.items()
    }
    return agents, {}, processes
