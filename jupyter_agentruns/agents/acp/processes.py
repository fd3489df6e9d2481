"""ACP agents' processes: started clean and guarded, read at the run's pace, pooled per conversation.

- ``AgentProcess``: one agent program, started through ``guard.py`` (it never
  outlives the server, even one killed with SIGKILL) with a clean
  environment: ``PATH``, ``HOME`` and its entry's ``env``, nothing else of the
  server's (no Jupyter token, no store URL). Its stderr is drained into a
  bounded tail for error messages, with the entry's ``env`` values and runs'
  notebook-tools tokens blanked.
- ``Pipe``: its stdio as the SDK's message transport. It reads the next
  message only while the conversation has room: a fast agent then blocks on
  its own writes, and the store sets the pace (nothing piles up in memory).
- ``Processes``: the server's live conversations, one process each, at most
  ``max_agent_processes``; an idle one is kept ``acp_idle_seconds`` for the
  next run of its conversation, or closed to make room.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Hashable
from pathlib import Path
from typing import Any

GUARD = Path(__file__).with_name("guard.py")
# One ACP message at most (a tool's output, a file's contents).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
STDERR_TAIL_BYTES = 16 * 1024
# What a view shows of it: its last lines, each cut at so many characters.
STDERR_LINES = 20
STDERR_LINE_CHARS = 300
# Terminal colours and cursor moves (ANSI escapes), then what else is not text.
_ESCAPE = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A run's token for the notebook tools (``agr_`` and 43 URL-safe characters), which
# the agent is given in its session's MCP servers and may log: this run's or an
# earlier run's of the same process.
_RUN_TOKEN = re.compile(r"agr_[A-Za-z0-9_-]{16,}")
# How long a process gets to exit once its stdin is closed, then after SIGTERM.
STOP_SECONDS = 2.0


def last_lines(text: str) -> list[str]:
    """At most ``STDERR_LINES`` last lines of ``text``, as plain text: colours and control characters removed."""
    text = _CONTROL.sub("", _ESCAPE.sub("", text))
    lines = [line.rstrip()[:STDERR_LINE_CHARS] for line in text.splitlines()]
    return [line for line in lines if line.strip()][-STDERR_LINES:]


def clean_environment(env: dict[str, str]) -> dict[str, str]:
    """What an agent's process gets: ``PATH`` and ``HOME`` of the server, then its entry's ``env``."""
    inherited = {name: os.environ[name] for name in ("PATH", "HOME") if name in os.environ}
    return {**inherited, **env}


class AgentProcess:
    """One agent program, started through the guard, with its stderr's tail kept."""

    def __init__(self, process: asyncio.subprocess.Process, secrets: list[str]):
        self.process = process
        self._secrets = sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True)
        self._tail = bytearray()
        self._stderr = asyncio.ensure_future(self._drain_stderr())

    @classmethod
    async def start(cls, command: list[str], env: dict[str, str], cwd: str) -> AgentProcess:
        """Start ``command`` in ``cwd``: from the event loop's thread, which the guard's
        parent-death signal is tied to (Linux sends it when the thread that forked dies)."""
        environment = clean_environment(env)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-I", str(GUARD), str(os.getpid()), ",".join(environment), *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=environment,
            cwd=cwd,
            # Signals for the server's process group (a terminal's Ctrl-C, a
            # kill of the group) reach the agent only through the server.
            start_new_session=True,
            limit=MAX_MESSAGE_BYTES,
        )  # fmt: skip
        return cls(process, list(env.values()))

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def _drain_stderr(self) -> None:
        stream = self.process.stderr
        assert stream is not None  # started with stderr=PIPE
        while True:
            try:
                chunk = await stream.read(65536)
            except Exception:
                return
            if not chunk:
                return
            self._tail += chunk
            if len(self._tail) > STDERR_TAIL_BYTES:
                del self._tail[: len(self._tail) - STDERR_TAIL_BYTES]

    def stderr_tail(self, characters: int = 1500) -> str:
        """The end of what the agent wrote to stderr, without its entry's secrets."""
        text = self._tail.decode("utf-8", errors="replace")
        for secret in self._secrets:
            text = text.replace(secret, "[hidden]")
        text = _RUN_TOKEN.sub("agr_[hidden]", text)
        text = text.strip()
        return text[-characters:] if len(text) > characters else text

    async def exited(self, timeout: float) -> int | None:
        """Its exit code once it exited (waiting up to ``timeout`` seconds), else None."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.process.wait()), timeout)
        if self.process.returncode is not None:
            # What it wrote last is read before anyone shows it.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._stderr), 1)
        return self.process.returncode

    async def stop(self, grace: float = STOP_SECONDS) -> None:
        """Close its stdin (the agent's cue to exit), then SIGTERM to the guard, then SIGKILL."""
        process = self.process
        if process.returncode is None and process.stdin is not None:
            with contextlib.suppress(Exception):
                process.stdin.close()
            if await self.exited(grace) is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)  # the guard ends the agent's group
                if await self.exited(grace + 6) is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await self.exited(5)
        self._stderr.cancel()

    def kill(self) -> None:
        """End it now (the guard still ends what the agent started)."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)


def _no_constant(name: str) -> None:
    # NaN and infinities are not JSON (a browser could not read the event):
    # an agent's NaN becomes null.
    return None


class Pipe:
    """An agent's stdio as the ACP SDK's message transport: one JSON object a line.

    ``room()`` is awaited before each message is read: it returns once the
    conversation can take one more.
    """

    def __init__(self, process: AgentProcess, room: Callable[[], Awaitable[None]]):
        assert process.process.stdout is not None and process.process.stdin is not None  # pipes
        self._reader = process.process.stdout
        self._writer = process.process.stdin
        self._room = room
        self._draining = asyncio.Lock()
        self._ended = False
        self.failure: str | None = None  # why reading stopped, when not the agent's exit

    async def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        self._writer.write(data)
        async with self._draining:
            await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        while not self._ended:
            await self._room()
            try:
                line = await self._reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as end:
                self._ended = True
                line = end.partial
            except asyncio.LimitOverrunError:
                self._ended = True
                self.failure = f"the agent sent a message over {MAX_MESSAGE_BYTES} bytes"
                return None
            line = line.strip()
            if not line:
                continue
            try:
                message = json.loads(line, parse_constant=_no_constant)
            except ValueError:
                continue  # not a message: something the agent printed to stdout
            if isinstance(message, dict):
                return message
        return None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()


class Processes:
    """This server's conversations with ACP agents, one process each, at most ``limit``.

    ``acquire`` gives a conversation with its turn held (one turn at a time);
    ``release`` keeps it ``idle_seconds`` for its next run. When every place
    is taken, the least recently used idle conversation is closed; when none
    is idle, the run waits for one to finish its turn (and says so).
    """

    def __init__(self, limit: int, idle_seconds: float, log: logging.Logger):
        self.limit = limit
        self.idle_seconds = idle_seconds
        self.log = log
        self.live: dict[Hashable, Any] = {}
        # run_id -> the conversation whose turn the run is taking (see stderr_lines).
        self.turns: dict[str, Any] = {}
        self._changed = asyncio.Event()
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Future] = set()
        self.closed = False

    async def acquire(
        self,
        key: Hashable,
        make: Callable[[], Any],
        waiting: Callable[[str], Awaitable[None]],
    ) -> Any:
        """The live conversation of ``key`` (``make()``-d, not started, when there is none), its turn held."""
        said: set[str] = set()

        async def say(message: str) -> None:
            if message not in said:
                said.add(message)
                await waiting(message)

        while True:
            if self.closed:
                raise RuntimeError("the server is stopping")
            conversation = self.live.get(key)
            if conversation is not None and not conversation.alive:
                self.forget(conversation)  # its agent exited while it waited
                self._spawn(conversation.close())
                conversation = None
            if conversation is not None:
                if conversation.lock.locked():
                    await say("waiting for the conversation's turn in progress to end")
                await conversation.lock.acquire()
                if conversation.alive and self.live.get(key) is conversation:
                    self._stop_timer(conversation)
                    return conversation
                conversation.lock.release()
                continue
            if len(self.live) < self.limit:
                conversation = make()
                conversation.key = key
                self.live[key] = conversation
                await conversation.lock.acquire()
                return conversation
            idle = [c for c in self.live.values() if not c.lock.locked()]
            if idle:
                oldest = min(idle, key=lambda c: c.last_used)
                self.forget(oldest)
                self._spawn(oldest.close())
                continue
            await say(
                f"waiting for one of this server's {self.limit} agent processes "
                "(max_agent_processes) to end its turn"
            )
            changed = self._changed
            await changed.wait()

    def stderr_lines(self, run_id: str) -> list[str] | None:
        """The last lines the agent taking ``run_id``'s turn wrote to stderr (None: no such turn here)."""
        conversation = self.turns.get(run_id)
        if conversation is None:
            return None
        process = conversation.process
        return last_lines(process.stderr_tail()) if process is not None else []

    def release(self, conversation: Any, keep: bool) -> None:
        """The conversation's turn ended: keep it for the next run (``keep``) or close it."""
        conversation.last_used = time.monotonic()
        conversation.lock.release()
        if keep and conversation.alive and not self.closed:
            loop = asyncio.get_running_loop()
            self._stop_timer(conversation)
            self._timers[id(conversation)] = loop.call_later(
                self.idle_seconds, self._expire, conversation
            )
        else:
            self.forget(conversation)
            self._spawn(conversation.close())
        self._wake()

    def forget(self, conversation: Any) -> None:
        """It no longer counts (it exited or is being closed)."""
        self._stop_timer(conversation)
        key = conversation.key
        if self.live.get(key) is conversation:
            del self.live[key]
            self._wake()

    def _expire(self, conversation: Any) -> None:
        self._timers.pop(id(conversation), None)
        if not conversation.lock.locked():
            self.forget(conversation)
            self._spawn(conversation.close())

    def _stop_timer(self, conversation: Any) -> None:
        timer = self._timers.pop(id(conversation), None)
        if timer is not None:
            timer.cancel()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def spawn(self, coro: Awaitable[None]) -> None:
        """Run ``coro`` to its end whatever happens to the run that started it (a turn's ending)."""
        self._spawn(coro)

    async def close(self) -> None:
        """At the server's stop: every conversation closed, every process ended."""
        self.closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        conversations = list(self.live.values())
        self.live.clear()
        self._wake()
        closing = [asyncio.ensure_future(c.close()) for c in conversations]
        pending = [*closing, *self._tasks]
        if pending:
            await asyncio.wait(pending, timeout=15)
