"""Webhooks: ``POST/GET hooks``, ``GET/DELETE hooks/{id}``, ``GET hooks/{id}/deliveries``."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import refuse_unknown_fields
from .base import AgentRunsHandler

HOOK_ID = r"(?P<hook_id>[^/]+)"


class HooksHandler(AgentRunsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        hooks = await self.engine.hooks()
        self.write_json({"hooks": await hooks.list_hooks(self.owner)})

    @web.authenticated
    @authorized
    async def post(self) -> None:
        """201 with the hook and its ``secret``, which is never answered again."""
        body = self.json_body()
        refuse_unknown_fields(body, ["url", "events", "format"])
        hooks = await self.engine.hooks()
        self.write_json(await hooks.create(self.owner, body), status=201)


class HookHandler(AgentRunsHandler):
    @web.authenticated
    @authorized
    async def get(self, hook_id: str) -> None:
        hooks = await self.engine.hooks()
        self.write_json(await hooks.get(self.owner, hook_id))

    @web.authenticated
    @authorized
    async def delete(self, hook_id: str) -> None:
        self.check_body_size()
        hooks = await self.engine.hooks()
        await hooks.delete(self.owner, hook_id)
        self.set_status(204)
        self.finish()


class DeliveriesHandler(AgentRunsHandler):
    @web.authenticated
    @authorized
    async def get(self, hook_id: str) -> None:
        hooks = await self.engine.hooks()
        self.write_json({"deliveries": await hooks.deliveries(self.owner, hook_id)})


default_handlers = [
    (r"api/agentruns/hooks", HooksHandler),
    (rf"api/agentruns/hooks/{HOOK_ID}", HookHandler),
    (rf"api/agentruns/hooks/{HOOK_ID}/deliveries", DeliveriesHandler),
]
