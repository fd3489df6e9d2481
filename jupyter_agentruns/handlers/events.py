"""``GET runs/{id}/events``: resume a run's events from a cursor, over SSE or JSON long-poll."""

from __future__ import annotations

import contextlib

from jupyter_server.auth.decorator import authorized
from tornado import web

from .. import jsonio
from ..broadcaster import CursorExpired, RunGone, Subscriber
from ..cursor import check_cursor, parse_cursor
from ..errors import invalid_request, run_not_found
from ..events import FRAME, envelope_of
from ..lifecycle import is_terminal
from ..store import StoreUnavailable
from . import sse
from .base import AgentRunsHandler
from .runs import RUN_ID, check_run_id

SSE_BATCH = 500
# The first write of a resumed stream is small, so the first event arrives at once.
SSE_FIRST_BATCH = 32
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

    async def _stream(self, row: dict, cursor: int, caught_up: bool) -> None:
        if caught_up:
            # 204 is the one answer that stops a browser EventSource reconnecting.
            self.set_status(204)
            self.finish()
            return
        settings = self.engine.settings
        with self.engine.stream_slot(self.owner, "run"):
            subscriber, snapshot = await resume(self.engine, self.owner, row, cursor)
            sse.begin(self)
            if snapshot is not None:
                self.write(sse.named("snapshot", jsonio.dumps(snapshot), seq=subscriber.cursor))
            try:
                await sse.send(self, "", settings.write_timeout_seconds)
                batch = SSE_FIRST_BATCH
                # At the server's stop the response ends: the client resumes from its cursor.
                while not subscriber.done and not self.stopping:
                    events = await subscriber.pull(batch, settings.heartbeat_interval, self.waiter)
                    if self.waiter.released:
                        return  # the client left: its slot is free now, not at the next write
                    if not events and self.stopping:
                        break
                    batch = SSE_BATCH
                    text = "".join([event[FRAME] for event in events]) if events else sse.PING
                    await sse.send(self, text, settings.write_timeout_seconds)
            except sse.ClientGone:
                return
            except (CursorExpired, RunGone):
                # Compacted under a slow reader, or deleted: end here. A snapshot
                # frame only ever comes first, so the reconnect starts with one
                # (or answers 410 / 404).
                pass
            except StoreUnavailable as exc:
                # The database went away mid-stream: end it; the client resumes from
                # its cursor (answered 503 until the database is back).
                self.log.warning("agentruns: a stream of %s ended: %s", row["run_id"], exc)
        self.finish()

    async def _poll(self, row: dict, cursor: int, caught_up: bool) -> None:
        limit = self.int_argument("limit", POLL_LIMIT_DEFAULT, 1, POLL_LIMIT_MAX)
        wait = self._wait_argument()
        # A long-poll that waits holds a connection like a stream: it counts as one.
        slot = (
            self.engine.stream_slot(self.owner, "poll")
            if wait > 0 and not caught_up
            else contextlib.nullcontext()
        )
        with slot:
            subscriber, snapshot = await resume(self.engine, self.owner, row, cursor)
            try:
                events = [] if caught_up else await subscriber.pull(limit, wait, self.waiter)
            except CursorExpired:
                row = await self.engine.owned_head(self.owner, row["run_id"])
                subscriber, snapshot = await resume(self.engine, self.owner, row, -1)
                events = await subscriber.pull(limit, 0)
            except RunGone:
                await self.engine.owned_head(self.owner, row["run_id"])  # 410 or 404 now
                raise run_not_found(row["run_id"]) from None
        if self.waiter.released:
            return
        row = await self.engine.owned_head(self.owner, row["run_id"])
        done = caught_up or subscriber.done
        tail = {"last_seq": row["last_seq"], "status": row["status"], "done": done}
        if snapshot is not None:
            tail["snapshot"] = snapshot
        tail_json = jsonio.dumps(tail, compact=True)
        self.write_json('{"events":[' + ",".join(map(envelope_of, events)) + "]," + tail_json[1:])

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


async def resume(engine, owner: str, row: dict, cursor: int) -> tuple[Subscriber, dict | None]:
    """Where to resume: the cursor, or, when its events were compacted away, the run's snapshot.

    The snapshot is the run object now, at ``W = last_seq``; events follow from W + 1.
    """
    if cursor >= row["first_seq"] - 1:
        return engine.subscriber(row["run_id"], cursor), None
    snapshot = await engine.get_run(owner, row["run_id"])
    subscriber = engine.subscriber(row["run_id"], snapshot["last_seq"])
    subscriber.done = is_terminal(snapshot["status"])
    return subscriber, snapshot


default_handlers = [(rf"api/agentruns/runs/{RUN_ID}/events", EventsHandler)]
