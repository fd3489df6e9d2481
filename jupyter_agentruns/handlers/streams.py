"""``GET streams?runs=<run_id>:<cursor>,…``: the events of many runs over one connection.

Browsers open at most six HTTP/1.1 connections per host, shared by every tab,
and tornado has no HTTP/2: one stream per widget would starve JupyterLab's own
requests after a few live runs. A page opens this one stream instead. Frames
are the per-run stream's without ``id:`` lines (the client keeps one cursor per
run); a run that is unknown, not the caller's, or whose cursor is wrong gets an
``event: error`` frame and is done for this stream while the others go on.
"""

from __future__ import annotations

import asyncio

from jupyter_server.auth.decorator import authorized
from tornado import web

from .. import jsonio
from ..broadcaster import CursorExpired, RunGone, Subscriber, mark, wait_since
from ..cursor import check_cursor, parse_cursor
from ..errors import Problem, invalid_request
from ..lifecycle import is_terminal
from ..store import StoreUnavailable
from . import sse
from .base import AgentRunsHandler
from .events import resume

MAX_RUNS = 50
BATCH_PER_RUN = 200


def parse_runs(raw: str | None) -> list[tuple[str, str]]:
    """``run_id:cursor,…`` to ``[(run_id, raw_cursor)]`` (cursors are checked per run)."""
    if not raw:
        raise invalid_request("List the runs to follow: ?runs=<run_id>:<cursor>,<run_id>:<cursor>")
    pairs = []
    for item in raw.split(","):
        run_id, colon, cursor = item.partition(":")
        if not run_id or not colon:
            raise invalid_request(f"{item!r} is not of the form <run_id>:<cursor>.")
        pairs.append((run_id, cursor))
    if len(pairs) > MAX_RUNS:
        raise invalid_request(f"At most {MAX_RUNS} runs per stream, not {len(pairs)}.")
    if len({run_id for run_id, _ in pairs}) != len(pairs):
        raise invalid_request("Each run may be listed once.")
    return pairs


class StreamsHandler(AgentRunsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        engine = self.engine
        await engine.start()
        pairs = parse_runs(self.get_argument("runs", None))
        opening: list[str] = []
        subscribers: list[Subscriber] = []
        for run_id, raw_cursor in pairs:
            try:
                cursor = parse_cursor(None, raw_cursor)
                row = await engine.owned_head(self.owner, run_id)
                check_cursor(cursor, row["last_seq"])
            except Problem as error:
                opening.append(
                    sse.named("error", jsonio.dumps({"run_id": run_id, "error": error.body()}))
                )
                continue
            if is_terminal(row["status"]) and cursor == row["last_seq"]:
                continue  # the client has everything of this run
            subscriber, snapshot = await resume(engine, self.owner, row, cursor)
            if snapshot is not None:
                opening.append(sse.named("snapshot", jsonio.dumps(snapshot)))
            if not subscriber.done:
                subscribers.append(subscriber)
        if not opening and not subscribers:
            self.set_status(204)
            self.finish()
            return
        settings = engine.settings
        with engine.stream_slot(self.owner, "page"):
            sse.begin(self)
            try:
                await sse.send(self, "".join(opening), settings.write_timeout_seconds)
                await self._follow(subscribers)
            except sse.ClientGone:
                return
            except StoreUnavailable as exc:
                # The database went away: end the stream; the page reconnects with its cursors.
                self.log.warning("agentruns: a page stream ended: %s", exc)
        self.finish()

    async def _follow(self, subscribers: list[Subscriber]) -> None:
        settings = self.engine.settings
        broadcaster = self.engine.broadcaster
        loop = asyncio.get_running_loop()
        last_write = loop.time()
        # At the server's stop the response ends: the page resumes from its cursors.
        while subscribers and not self.stopping:
            # Marked before reading: a commit during a read away on a reader thread is not missed.
            marks = mark(broadcaster, [s.run_id for s in subscribers])
            frames = []
            for subscriber in subscribers:
                try:
                    events = await subscriber.read(BATCH_PER_RUN)
                except (CursorExpired, RunGone):
                    frames.append(await self._resync(subscriber))
                    continue
                frames.extend(sse.frame(event, with_id=False) for event in events)
            subscribers = [s for s in subscribers if not s.done]
            if frames:
                await sse.send(self, "".join(frames), settings.write_timeout_seconds)
                last_write = loop.time()
                continue
            idle = loop.time() - last_write
            if idle >= settings.heartbeat_interval:
                await sse.send(self, sse.PING, settings.write_timeout_seconds)
                last_write = loop.time()
                continue
            await wait_since(broadcaster, marks, settings.heartbeat_interval - idle, self.waiter)
            if self.waiter.released:
                raise sse.ClientGone()  # its slot is free now, not at the next write

    async def _resync(self, subscriber: Subscriber) -> str:
        """A run compacted (or deleted) under this stream: its snapshot frame, and its cursor moved to it."""
        try:
            row = await self.engine.owned_head(self.owner, subscriber.run_id)
        except Problem as error:  # deleted meanwhile
            subscriber.done = True
            return sse.named(
                "error", jsonio.dumps({"run_id": subscriber.run_id, "error": error.body()})
            )
        fresh, snapshot = await resume(self.engine, self.owner, row, -1)
        subscriber.cursor, subscriber.done = fresh.cursor, fresh.done
        return sse.named("snapshot", jsonio.dumps(snapshot))


default_handlers = [(r"api/agentruns/streams", StreamsHandler)]
