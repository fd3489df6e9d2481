"""The baseline server: a bare tornado SSE handler writing the engine's frames, no store.

``python -m bench.bare PORT``. ``GET /live?events=N&rate=R`` writes N frames
at R a second, one flush each (as the engine does for a live run at that
rate); ``GET /replay?events=N`` writes N frames as fast as the client takes
them, 500 per flush (as the engine replays a finished run).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from tornado import web

from jupyter_agentruns.events import envelope
from jupyter_agentruns.timeutil import now_iso

from .agents import delta

RUN_ID_JSON = '"run_bareBaselineBareBaselineBa"'
BATCH = 500


def data() -> str:
    return json.dumps({"message_id": "m1", "delta": delta(100)}, separators=(",", ":"))


def frame(seq: int, ts: str, data: str) -> str:
    """What the engine sends for a stored event: the envelope, then the SSE frame around it."""
    return (
        f"id: {seq}\nevent: text.delta\n"
        f"data: {envelope(RUN_ID_JSON, seq, 'text.delta', ts, data)}\n\n"
    )


class SSEHandler(web.RequestHandler):
    def begin(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self.request.connection.stream.set_nodelay(True)
        self.write("retry: 1000\n\n")


class Live(SSEHandler):
    async def get(self) -> None:
        events = int(self.get_argument("events"))
        rate = float(self.get_argument("rate"))
        self.begin()
        await self.flush()
        start = time.perf_counter()
        for seq in range(1, events + 1):
            wait = start + (seq - 1) / rate - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            self.write(frame(seq, now_iso(), data()))
            await self.flush()
        self.finish()


class Replay(SSEHandler):
    async def get(self) -> None:
        events = int(self.get_argument("events"))
        self.begin()
        # The engine reads ts and data from the store: here they are made once.
        ts = now_iso()
        payloads = [data() for _ in range(BATCH)]
        for first in range(1, events + 1, BATCH):
            self.write(
                "".join(
                    frame(seq, ts, payloads[seq - first])
                    for seq in range(first, min(first + BATCH, events + 1))
                )
            )
            await self.flush()
        self.finish()


class Ready(web.RequestHandler):
    def get(self) -> None:
        self.write("ok")


async def main(port: int) -> None:
    app = web.Application([("/live", Live), ("/replay", Replay), ("/ready", Ready)])
    app.listen(port, address="127.0.0.1")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
