"""``GET usage``: the caller's token totals of the last 24 hours (see Token budgets)."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from .base import AgentRunsHandler


class UsageHandler(AgentRunsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.write_json(await self.engine.usage(self.owner))


default_handlers = [(r"api/agentruns/usage", UsageHandler)]
