"""``GET runs/{id}/events``: resume a run's events from a cursor, over SSE or JSON long-poll."""

from __future__ import annotations

import contextlib

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..cursor import check_cursor, parse_cursor
from ..domain import RunHead
from ..errors import invalid_request
from ..lifecycle import is_terminal
from ..store import StoreUnavailable
from . import sse
from .base import AgentRunsHandler
from .runs import RUN_ID, check_run_id

POLL_LIMIT_DEFAULT = 100
POLL_LIMIT_MAX = 1000
POLL_WAIT_MAX = 30


class EventsHandler(AgentRunsHandler):
    @web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        check_run_id(run_id)
        engine = self.engine
        await engine.start()
        row = await engine.owned_head(self.owner, run_id)
        cursor = parse_cursor(
            self.request.headers.get("Last-Event-ID"), self.get_argument("after", None)
        )
        check_cursor(cursor, row["last_seq"])
        caught_up = is_terminal(row["status"]) and cursor == row["last_seq"]
        if "text/event-stream" in self.request.headers.get("Accept", ""):
            await self._stream(row, cursor, caught_up)
        else:
            await self._poll(row, cursor, caught_up)

    async def _stream(self, row: RunHead, cursor: int, caught_up: bool) -> None:
        if caught_up:
            # 204 is the one answer that stops a browser EventSource reconnecting.
            self.set_status(204)
            self.finish()
            return
        engine = self.engine
        timeout = engine.settings.write_timeout_seconds
        with engine.stream_slot(self.owner, "run"):
            stream = await engine.streams.run(self.owner, row, cursor)
            sse.begin(self)
            try:
                await sse.send(self, stream.opening, timeout)
                # At the server's stop the frames end: the client resumes from its cursor.
                async for text in stream.frames(self.waiter, sse.pusher(self)):
                    await sse.send(self, text, timeout)
            except sse.ClientGone:
                return
            except StoreUnavailable as exc:
                # The database went away mid-stream: end it; the client resumes from
                # its cursor (answered 503 until the database is back).
                self.log.warning("agentruns: a stream of %s ended: %s", row["run_id"], exc)
        if self.waiter.released:
            return  # the client left: its slot is free now, not at the next write
        self.finish()

    async def _poll(self, row: RunHead, cursor: int, caught_up: bool) -> None:
        limit = self.int_argument("limit", POLL_LIMIT_DEFAULT, 1, POLL_LIMIT_MAX)
        assert limit is not None  # it has a default
        wait = self._wait_argument()
        # A long-poll that waits holds a connection like a stream: it counts as one.
        slot = (
            self.engine.stream_slot(self.owner, "poll")
            if wait > 0 and not caught_up
            else contextlib.nullcontext()
        )
        with slot:
            answer = await self.engine.streams.poll(
                self.owner,
                row,
                cursor,
                limit=limit,
                wait=wait,
                waiter=self.waiter,
                caught_up=caught_up,
            )
        if answer is not None:  # else the client left
            self.write_json(answer)

    def _wait_argument(self) -> float:
        raw = self.get_argument("wait", None)
        if raw in (None, ""):
            return 0.0
        try:
            wait = float(raw)
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= POLL_WAIT_MAX:
            raise invalid_request(
                f"wait must be a number of seconds between 0 and {POLL_WAIT_MAX}, not {raw!r}."
            )
        return wait


default_handlers = [(rf"api/agentruns/runs/{RUN_ID}/events", EventsHandler)]
