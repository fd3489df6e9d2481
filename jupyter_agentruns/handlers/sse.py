"""Server-sent events on a tornado handler: headers, frames, bounded writes."""

from __future__ import annotations

import asyncio
from typing import cast

from tornado.http1connection import HTTP1Connection
from tornado.iostream import IOStream, StreamClosedError
from tornado.web import RequestHandler

from ..engine.streams import Batch

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


def http_chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked HTTP/1.1 body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class Pusher:
    """A stream's sink for the batches a run's followers share: one write, no flush, no wait.

    Tornado would join, frame and copy the same bytes once per client and
    schedule a callback per write; here the batch is framed once for every
    follower and written straight to each socket, when nothing of the
    client's own is still unsent. A client that has not taken what it was
    sent before gets nothing here: its stream goes back to ``send``, whose
    wait for it is bounded.
    """

    __slots__ = ("_stream", "_chunked", "_direct")

    def __init__(self, stream: IOStream, chunked: bool):
        self._stream = stream
        self._chunked = chunked
        # A plain socket (not TLS) is written to directly; tornado's buffer takes any rest.
        self._direct = type(stream) is IOStream

    def push(self, batch: Batch) -> bool:
        stream = self._stream
        if stream.closed() or stream.writing():
            return False
        data = batch.framed(http_chunk) if self._chunked else batch.data
        if self._direct:
            try:
                sent = stream.socket.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:  # the client is gone: its stream ends at its next send
                stream.close()
                return False
            if sent == len(data):
                return True
            data = memoryview(data)[sent:]
        stream.write(data)
        return True


def pusher(handler: RequestHandler) -> Pusher | None:
    """A sink for ``handler``'s stream once it has begun, or None where the response's
    bytes are not just the frames (a compressing transform, an unknown connection)."""
    connection = handler.request.connection
    stream = getattr(connection, "stream", None)
    chunked = getattr(connection, "_chunking_output", None)
    if handler.application.transforms or not isinstance(stream, IOStream):
        return None
    if not isinstance(chunked, bool):
        return None
    return Pusher(stream, chunked)
