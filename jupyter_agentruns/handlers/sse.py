"""Server-sent events on a tornado handler: headers, frames, bounded writes."""

from __future__ import annotations

import asyncio
from typing import cast

from tornado.http1connection import HTTP1Connection
from tornado.iostream import StreamClosedError
from tornado.web import RequestHandler

# The reconnect delay a browser EventSource uses; our own clients treat it as
# the floor of their exponential backoff.
RETRY_MS = 1000


class ClientGone(Exception):
    """The client closed the connection, or read nothing for ``write_timeout_seconds``."""


def begin(handler: RequestHandler) -> None:
    handler.set_header("Content-Type", "text/event-stream")
    handler.set_header("Cache-Control", "no-cache")
    handler.set_header("X-Accel-Buffering", "no")
    # Tornado leaves Nagle's algorithm on for streamed responses: tens of ms per frame.
    stream = cast(HTTP1Connection, handler.request.connection).stream  # tornado's HTTP server
    if stream is not None:
        stream.set_nodelay(True)
    handler.write(f"retry: {RETRY_MS}\n\n")


async def send(handler: RequestHandler, text: str, timeout: float) -> None:
    """Write and flush, waiting at most ``timeout`` for the client to take it.

    Tornado's write buffer is unbounded: without this wait, a client that stops
    reading would grow server memory by everything the run emits.
    """
    handler.write(text)
    try:
        flushed = handler.flush()
        if not flushed.done():  # the socket is full: the client is slow, wait a bounded time
            await asyncio.wait_for(flushed, timeout)
        else:
            flushed.result()
            # A fast reader of a long replay would otherwise never let the loop
            # go: every other stream and run waits until the replay ends.
            await asyncio.sleep(0)
    except (StreamClosedError, asyncio.TimeoutError):
        stream = cast(HTTP1Connection, handler.request.connection).stream
        if stream is not None and not stream.closed():
            stream.close()
        raise ClientGone() from None
