"""``GET streams?runs=<run_id>:<cursor>,…``: the events of many runs over one connection.

Browsers open at most six HTTP/1.1 connections per host, shared by every tab,
and tornado has no HTTP/2: one stream per widget would starve JupyterLab's own
requests after a few live runs. A page opens this one stream instead. Frames
are the per-run stream's without ``id:`` lines (the client keeps one cursor per
run); a run that is unknown, not the caller's, or whose cursor is wrong gets an
``event: error`` frame and is done for this stream while the others go on.
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..cursor import parse_stream_runs
from ..store import StoreUnavailable
from . import sse
from .base import AgentRunsHandler


class StreamsHandler(AgentRunsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        engine = self.engine
        await engine.start()
        runs = parse_stream_runs(self.get_argument("runs", None))
        stream = await engine.streams.page(self.owner, runs)
        if stream.empty:
            self.set_status(204)
            self.finish()
            return
        timeout = engine.settings.write_timeout_seconds
        with engine.stream_slot(self.owner, "page"):
            sse.begin(self)
            try:
                await sse.send(self, stream.opening, timeout)
                # At the server's stop the frames end: the page resumes from its cursors.
                async for text in stream.frames(self.waiter):
                    await sse.send(self, text, timeout)
            except sse.ClientGone:
                return
            except StoreUnavailable as exc:
                # The database went away: end the stream; the page reconnects with its cursors.
                self.log.warning("agentruns: a page stream ended: %s", exc)
        if self.waiter.released:
            return  # the client left: its slot is free now, not at the next write
        self.finish()


default_handlers = [(r"api/agentruns/streams", StreamsHandler)]
