"""SSE clients over raw asyncio streams: cheap enough to run 1,000 in one process.

They speak just enough HTTP/1.1 (``Connection: close``; the body's chunk
framing is left in place, harmless here because the servers write whole frames
per chunk). What a client measures comes from the bytes: a text delta starts
with its emit time (``bench.agents.delta``), so receive − emit is a latency
across processes.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from array import array

STAMP = re.compile(rb'"delta":"(\d{19})')
DELTA = b'"delta":"'
TEXT_DELTA = b"event: text.delta\n"
READ_SIZE = 256 * 1024


class Stream:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int):
        self.reader = reader
        self.writer = writer
        self.status = status

    def close(self) -> None:
        self.writer.close()


def request_bytes(port: int, path: str, headers: dict[str, str] | None) -> bytes:
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Accept: text/event-stream",
        "Connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def open_stream(port: int, path: str, headers: dict[str, str] | None = None) -> Stream:
    """Send the request and read the response head; the body is left to read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=4 * READ_SIZE)
    writer.write(request_bytes(port, path, headers))
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status != 200:
        writer.close()
        raise RuntimeError(f"GET {path} answered {status}: {head.decode(errors='replace')}")
    return Stream(reader, writer, status)


async def open_streams(
    port: int, path: str, headers: dict[str, str] | None, count: int, wave: int = 100
) -> list[Stream]:
    """``count`` streams, opened ``wave`` at a time (the listen backlog is 128)."""
    streams: list[Stream] = []
    while len(streams) < count:
        size = min(wave, count - len(streams))
        streams.extend(
            await asyncio.gather(*(open_stream(port, path, headers) for _ in range(size)))
        )
    return streams


async def read_until(stream: Stream, marker: bytes) -> bytes:
    """Read until ``marker`` has arrived (e.g. the idle run's first event)."""
    data = b""
    while marker not in data:
        more = await stream.reader.read(READ_SIZE)
        if not more:
            raise RuntimeError(f"stream ended before {marker!r}")
        data += more
    return data


async def latencies(stream: Stream, out: array) -> int:
    """Read to the end; append receive − emit (ns) of every text delta to ``out``.

    Returns the number of text deltas read.
    """
    reader = stream.reader
    pending = b""
    count = 0
    while True:
        data = await reader.read(READ_SIZE)
        received = time.time_ns()
        if not data:
            break
        pending += data
        cut = pending.rfind(b"\n\n")
        if cut < 0:
            continue
        stamps = STAMP.findall(pending, 0, cut)
        pending = pending[cut + 2 :]
        out.extend([received - int(stamp) for stamp in stamps])
        count += len(stamps)
    stream.close()
    return count


async def arrivals(stream: Stream, out: array) -> int:
    """Read to the end; for each read that completed text deltas, append its receive
    time (ns) and how many it completed to ``out``. Returns the number of text deltas.

    Every client of a run gets the same deltas in the same order, so one client's
    emit times (``stamps``) give every other client's latencies (``latencies_from``)
    without each parsing 19 digits per delta: with 1,000 clients in this process,
    that parsing alone took a third of a core at 1,000 ev/s, on the cores the
    server measured needs.
    """
    reader = stream.reader
    pending = b""
    count = 0
    while True:
        data = await reader.read(READ_SIZE)
        received = time.time_ns()
        if not data:
            break
        pending += data
        cut = pending.rfind(b"\n\n")
        if cut < 0:
            continue
        completed = pending.count(DELTA, 0, cut)
        pending = pending[cut + 2 :]
        if completed:
            out.append(received)
            out.append(completed)
            count += completed
    stream.close()
    return count


async def stamps(stream: Stream, emitted: array, out: array) -> int:
    """``latencies``, also keeping each delta's emit time (ns), in order, in ``emitted``."""
    reader = stream.reader
    pending = b""
    count = 0
    while True:
        data = await reader.read(READ_SIZE)
        received = time.time_ns()
        if not data:
            break
        pending += data
        cut = pending.rfind(b"\n\n")
        if cut < 0:
            continue
        found = [int(stamp) for stamp in STAMP.findall(pending, 0, cut)]
        pending = pending[cut + 2 :]
        emitted.extend(found)
        out.extend([received - stamp for stamp in found])
        count += len(found)
    stream.close()
    return count


def latencies_from(emitted: array, arrived: array, out: array) -> None:
    """Append receive − emit (ns) of each delta of ``arrived`` (see ``arrivals``) to ``out``."""
    index = 0
    for at in range(0, len(arrived), 2):
        received, completed = arrived[at], arrived[at + 1]
        out.extend([received - stamp for stamp in emitted[index : index + completed]])
        index += completed


async def count_deltas(stream: Stream) -> tuple[int, int]:
    """Read to the end as fast as possible; returns (text deltas, bytes)."""
    reader = stream.reader
    tail = b""
    count = size = 0
    keep = len(TEXT_DELTA) - 1
    while True:
        data = await reader.read(READ_SIZE)
        if not data:
            break
        size += len(data)
        # A marker split across two reads is counted once: the tail is too short to hold one.
        count += (tail + data).count(TEXT_DELTA)
        tail = data[-keep:]
    stream.close()
    return count, size


async def first_event(port: int, path: str, headers: dict[str, str]) -> tuple[float, int]:
    """Seconds from connecting to the first whole event frame, and its ``id``."""
    start = time.perf_counter()
    stream = await open_stream(port, path, headers)
    data = b""
    try:
        while True:
            more = await stream.reader.read(READ_SIZE)
            if not more:
                raise RuntimeError("the stream ended before its first event")
            data += more
            at = data.find(b"id: ")
            if at >= 0 and data.find(b"\n\n", at) >= 0:
                elapsed = time.perf_counter() - start
                return elapsed, int(data[at + 4 : data.index(b"\n", at)])
    finally:
        stream.close()


def stalled_client(port: int, path: str, headers: dict[str, str]) -> socket.socket:
    """A client that reads the response head, then never reads again."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(request_bytes(port, path, headers))
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"stalled client: {head!r}")
    return sock
