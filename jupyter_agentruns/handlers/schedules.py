"""Schedules: a run at each time a cron expression names (create, list, read, pause, delete)."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..engine.schedules import schedule_not_found
from ..errors import invalid_request, refuse_unknown_fields
from .base import AgentRunsHandler

SCHEDULE_ID = r"(?P<schedule_id>[^/]+)"
CREATE_FIELDS = {"agent": str, "input": dict, "cron": str, "timezone": str, "session": str}
REQUIRED = ("agent", "input", "cron", "timezone")


def create_body(body: dict[str, Any]) -> dict[str, Any]:
    """Check a new schedule's shape (400 ``invalid_request``)."""
    refuse_unknown_fields(body, CREATE_FIELDS)
    for name, kind in CREATE_FIELDS.items():
        value = body.get(name)
        if value is None and name not in REQUIRED:
            continue
        if value is None:
            raise invalid_request(f"The field {name!r} is required.")
        if not isinstance(value, kind):
            expected = "a JSON object" if kind is dict else "a string"
            raise invalid_request(f"The field {name!r} must be {expected}.")
    return body


def check_schedule_id(schedule_id: str) -> None:
    """404 for an id holding NUL: no schedule has one, and PostgreSQL cannot look it up."""
    if "\x00" in schedule_id:
        raise schedule_not_found(schedule_id)


class SchedulesHandler(AgentRunsHandler):
    """``POST schedules`` (create) and ``GET schedules`` (the caller's)."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        body = create_body(self.json_body())
        schedules = await self.engine.scheduled()
        schedule = await schedules.create(self.owner, body)
        self.set_header("Location", self.api_url("schedules", schedule["schedule_id"]))
        self.write_json(schedule, 201)

    @web.authenticated
    @authorized
    async def get(self) -> None:
        schedules = await self.engine.scheduled()
        self.write_json({"schedules": await schedules.list_schedules(self.owner)})


class ScheduleHandler(AgentRunsHandler):
    """``GET``, ``PATCH {"paused"}`` and ``DELETE schedules/{id}``."""

    @web.authenticated
    @authorized
    async def get(self, schedule_id: str) -> None:
        check_schedule_id(schedule_id)
        schedules = await self.engine.scheduled()
        self.write_json(await schedules.get(self.owner, schedule_id))

    @web.authenticated
    @authorized
    async def patch(self, schedule_id: str) -> None:
        check_schedule_id(schedule_id)
        body = self.json_body()
        refuse_unknown_fields(body, ["paused"])
        paused = body.get("paused")
        if not isinstance(paused, bool):
            raise invalid_request("The field 'paused' is required: true or false.")
        schedules = await self.engine.scheduled()
        self.write_json(await schedules.set_paused(self.owner, schedule_id, paused))

    @web.authenticated
    @authorized
    async def delete(self, schedule_id: str) -> None:
        self.check_body_size()
        check_schedule_id(schedule_id)
        schedules = await self.engine.scheduled()
        await schedules.delete(self.owner, schedule_id)
        self.set_status(204)
        self.finish()


default_handlers = [
    (r"api/agentruns/schedules", SchedulesHandler),
    (rf"api/agentruns/schedules/{SCHEDULE_ID}", ScheduleHandler),
]
