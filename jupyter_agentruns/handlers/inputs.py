"""``POST runs/{id}/inputs/{request_id}``: a person answers a run's question (see Asking a person)."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from .. import words
from ..errors import invalid_request, refuse_unknown_fields
from .base import AgentRunsHandler
from .runs import RUN_ID, check_run_id

MAX_NOTE_CHARS = 4000


class InputHandler(AgentRunsHandler):
    """200 with the run; the same answer again is 200 and changes nothing."""

    @web.authenticated
    @authorized
    async def post(self, run_id: str, request_id: str) -> None:
        body = self.json_body()
        refuse_unknown_fields(body, ["choice", "note"])
        choice, note = body.get("choice"), body.get("note")
        if not isinstance(choice, str):
            raise invalid_request("The field 'choice' is required: one of the question's choices.")
        if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE_CHARS):
            raise invalid_request(
                f"The field 'note' must be a string of at most {MAX_NOTE_CHARS} characters."
            )
        # Who answered, as people read it: the user's name (a hub's username).
        # A single-user server's token login is a new anonymous name per
        # request, which names nobody: no one is recorded then.
        user = self.current_user
        by = words.person(getattr(user, "name", None) or user.username)
        check_run_id(run_id)
        run = await self.engine.answer(self.owner, by, run_id, request_id, choice, note)
        self.write_json(run)


default_handlers = [
    (rf"api/agentruns/runs/{RUN_ID}/inputs/(?P<request_id>[^/]+)", InputHandler),
]
