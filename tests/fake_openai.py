"""A fake OpenAI-compatible chat server: real HTTP on 127.0.0.1, replies scripted by each test.

    fake = FakeOpenAI()
    await fake.start()                  # fake.url is the base_url, e.g. http://127.0.0.1:54321/v1
    fake.reply(answer("Hello", " world"))
    ...                                 # fake.requests holds what clients sent
    await fake.stop()

Each request gets the next scripted reply: a stream of ``chat.completion.chunk``
events (:class:`Stream`, built with :func:`answer` and :func:`tool_calls`), an
error status (:class:`Status`) or silence (:class:`Hang`). The fake counts the
clients that closed a connection before their reply ended (``disconnects``).

Requests to llama-cpp-python's ``/extras/tokenize/count`` are not scripted: with
``fake.tokenizer`` set (text -> count) they get its count, else a 404 as from a
server without that route; ``fake.counted`` holds the texts counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass, field
from typing import Any

MODEL = "fake-model"


class FakeOpenAI:
    def __init__(self) -> None:
        self.replies: list[Any] = []
        self.requests: list[dict[str, Any]] = []  # {"method", "path", "headers", "body"}
        self.on_request = None  # called with each request as it arrives
        self.tokenizer = None
        self.counted: list[str] = []
        self.disconnects = 0
        self.disconnected = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task] = set()
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    def reply(self, *replies: Any) -> None:
        """Queue the replies of the next requests, in order."""
        self.replies.extend(replies)

    def client_closed(self) -> None:
        self.disconnects += 1
        self.disconnected.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._handlers.add(asyncio.current_task())
        try:
            request = await read_request(reader)
            if request is None:
                return
            if request["path"] == "/extras/tokenize/count":
                await self._count_tokens(request, writer)
                return
            self.requests.append(request)
            if self.on_request is not None:
                self.on_request(request)
            reply = (
                self.replies.pop(0)
                if self.replies
                else Status(500, error_body("the fake has no reply scripted", type="server_error"))
            )
            await reply.send(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.client_closed()
        finally:
            writer.close()
            self._handlers.discard(asyncio.current_task())

    async def _count_tokens(self, request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        if self.tokenizer is None:
            await Status(404, {"detail": "Not Found"}).send(self, None, writer)
            return
        self.counted.append(request["body"]["input"])
        count = self.tokenizer(request["body"]["input"])
        await Status(200, {"count": count}).send(self, None, writer)


async def read_request(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return {
        "method": method,
        "path": path,
        "headers": headers,
        "body": json.loads(body) if body else None,
    }


def write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    """One piece of a ``Transfer-Encoding: chunked`` body."""
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


@dataclass
class Stream:
    """A 200 ``text/event-stream``: the chunks (a dict as JSON, a str as it is), then ``[DONE]``."""

    chunks: list[Any]
    hold: bool = False  # after the chunks, send nothing more until the client closes the connection
    cut: bool = False  # after the chunks, drop the connection in the middle of the body

    async def send(self, fake: FakeOpenAI, reader, writer) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        for chunk in self.chunks:
            data = chunk if isinstance(chunk, str) else json.dumps(chunk)
            write_chunk(writer, f"data: {data}\n\n".encode())
            await writer.drain()
        if self.cut:
            return
        if self.hold:
            await wait_for_close(fake, reader)
            return
        write_chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


@dataclass
class Status:
    """An error answer: ``status`` with a JSON body."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    async def send(self, fake: FakeOpenAI, reader, writer) -> None:
        body = json.dumps(self.body).encode()
        head = [
            f"HTTP/1.1 {self.status} Fake",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in self.headers.items()),
        ]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()


class Hang:
    """Read the request, answer nothing, until the client gives up and closes the connection."""

    async def send(self, fake: FakeOpenAI, reader, writer) -> None:
        await wait_for_close(fake, reader)


async def wait_for_close(fake: FakeOpenAI, reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass
    fake.client_closed()


def error_body(
    message: str, type: str = "invalid_request_error", code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


def llama_cpp_validation_error(*errors: dict) -> dict[str, Any]:
    """The 500 body llama-cpp-python (0.3) answers to a request its pydantic models refuse."""
    lines = [
        f"{len(errors)} validation errors:",
        *(f"  {error!r}" for error in errors),
        "",
        '  File "llama_cpp/server/app.py", line 376, in create_chat_completion',
        "    POST /v1/chat/completions",
    ]
    return error_body("\n".join(lines), type="internal_server_error")


def chunk(
    delta: dict | None = None, finish_reason: str | None = None, *, usage=None, model: str = MODEL
) -> dict:
    """One ``chat.completion.chunk``; without delta and finish_reason, a usage-only chunk."""
    choices = []
    if delta is not None or finish_reason is not None:
        choices = [
            {"index": 0, "delta": delta or {}, "finish_reason": finish_reason, "logprobs": None}
        ]
    if usage is not None:
        usage = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        }
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000,
            "model": model, "choices": choices, "usage": usage}  # fmt: skip


def answer(
    *pieces: str, usage: tuple[int, int] | None = (5, 3), model: str = MODEL, **options: Any
) -> Stream:
    """A text streamed as ``pieces``, then ``finish_reason: stop`` and the usage chunk."""
    chunks = [chunk({"role": "assistant", "content": ""}, model=model)]
    chunks += [chunk({"content": piece}, model=model) for piece in pieces]
    chunks.append(chunk(finish_reason="stop", model=model))
    if usage is not None:
        chunks.append(chunk(usage=usage, model=model))
    return Stream(chunks, **options)


def tool_calls(
    *calls: tuple[str, str],
    pieces: int = 3,
    usage: tuple[int, int] | None = (10, 4),
    name_in_every_fragment: bool = False,
) -> Stream:
    """Calls ``(name, arguments JSON)`` split as the API streams them, their fragments interleaved.

    The first fragment of call ``i`` has its ``index``, ``id`` and ``name``; the
    next ones only ``index`` and a piece of the arguments, or, with
    ``name_in_every_fragment`` (as llama-cpp-python sends them), the id and name again.
    """
    chunks = [chunk({"role": "assistant", "content": None})]
    for index, (name, _) in enumerate(calls):
        first = {"index": index, "id": f"call_fake_{index}", "type": "function",
                 "function": {"name": name, "arguments": ""}}  # fmt: skip
        chunks.append(chunk({"tool_calls": [first]}))
    fragments = [split(arguments, pieces) for _, arguments in calls]
    for step in range(pieces):
        for index, parts in enumerate(fragments):
            if parts[step]:
                fragment = {"index": index, "function": {"arguments": parts[step]}}
                if name_in_every_fragment:
                    fragment = {"index": index, "id": f"call_fake_{index}", "type": "function",
                                "function": {"name": calls[index][0],
                                             "arguments": parts[step]}}  # fmt: skip
                chunks.append(chunk({"tool_calls": [fragment]}))
    chunks.append(chunk(finish_reason="tool_calls"))
    if usage is not None:
        chunks.append(chunk(usage=usage))
    return Stream(chunks)


def split(text: str, pieces: int) -> list[str]:
    size = -(-len(text) // pieces)
    return [text[i * size : (i + 1) * size] for i in range(pieces)]


def closed_port_url() -> str:
    """A base_url on 127.0.0.1 where nothing listens: connecting is refused."""
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
