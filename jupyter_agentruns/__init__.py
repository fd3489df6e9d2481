"""Durable, resumable AI agent runs owned by the Jupyter server."""

from __future__ import annotations

from .agents import agent

__version__ = "0.1.0"
__all__ = ["__version__", "agent"]


def _jupyter_server_extension_points():
    from .app import AgentRuns

    return [{"module": "jupyter_agentruns", "app": AgentRuns}]
