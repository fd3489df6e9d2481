"""``POST runs/{id}/edits/{edit_id}/undo``: a person takes back a notebook edit an agent made."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import refuse_unknown_fields
from .base import AgentRunsHandler
from .runs import RUN_ID, check_run_id


class UndoEditHandler(AgentRunsHandler):
    """200 with the run, the edit ``undone``; 409 ``edit_conflict`` when its cell changed since."""

    @web.authenticated
    @authorized
    async def post(self, run_id: str, edit_id: str) -> None:
        refuse_unknown_fields(self.json_body(required=False), [])
        check_run_id(run_id)
        run = await self.engine.undo_edit(self.owner, run_id, edit_id)
        self.write_json(run)


default_handlers = [
    (rf"api/agentruns/runs/{RUN_ID}/edits/(?P<edit_id>[^/]+)/undo", UndoEditHandler),
]
