"""``GET agents``: what can be run, and the input each agent takes."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from .base import AgentRunsHandler


class AgentsHandler(AgentRunsHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        agents = [spec.describe() for _, spec in sorted(self.engine.agents.items())]
        self.write_json({"agents": agents})


default_handlers = [(r"api/agentruns/agents", AgentsHandler)]
