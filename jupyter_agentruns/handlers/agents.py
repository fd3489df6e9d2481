"""``GET agents``: what can be run, and the input each agent takes."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from .base import AgentRunsHandler


class AgentsHandler(AgentRunsHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        engine = self.engine
        agents = [spec.describe() for _, spec in sorted(engine.agents.items())]
        answer: dict[str, Any] = {
            "agents": agents,
            "default_agent": engine.settings.default_agent or "demo",
        }
        if engine.notebook is not None:
            answer["notebook_tools"] = engine.notebook.describe()
            if engine.notebook.available and not engine.notebook.serves(self.owner):
                answer["notebook_tools"] = {
                    "available": False,
                    "reason": "the notebook tools act for this server's own user only: its "
                    "kernels are theirs",
                }
        self.write_json(answer)


default_handlers = [(r"api/agentruns/agents", AgentsHandler)]
