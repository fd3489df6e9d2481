"""``GET conversations``: the caller's conversations, the one with the newest run first."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from .base import AgentRunsHandler
from .runs import LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, notebook_session


class ConversationsHandler(AgentRunsHandler):
    """``GET conversations?agent=&notebook=&limit=&before=``, paged like ``GET runs``."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        limit = self.int_argument("limit", LIST_LIMIT_DEFAULT, 1, LIST_LIMIT_MAX)
        notebook = self.get_argument("notebook", None) or None
        page = await self.engine.list_conversations(
            self.owner,
            agent=self.get_argument("agent", None) or None,
            notebook=None if notebook is None else notebook_session(notebook),
            limit=limit,
            before=self.get_argument("before", None) or None,
        )
        self.write_json(page)


default_handlers = [(r"api/agentruns/conversations", ConversationsHandler)]
