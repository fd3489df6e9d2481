"""From committed events to subscribers, without a queue per subscriber.

Each live run has a ``Channel``: a small window of its most recently committed
events and a wake-up. The writer's commit callback appends to the window and
wakes whoever waits; a ``Subscriber`` is only a cursor that pulls the events
after it, from the window when it covers the cursor, else from the store. A
subscriber that falls behind costs nothing but its cursor: the producer never
waits for it and no memory grows for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from . import store
from .reducer import TERMINAL_TYPES

WINDOW_EVENTS = 2048
WINDOW_BYTES = 4 * 1024 * 1024
STORE_READ_CHUNK = 1000
# One read's worth of event bytes: bounds what a subscriber hands to a response at once.
READ_MAX_BYTES = 1024 * 1024
# Runs no channel here announces (executed by another server sharing the
# database): PRAGMA data_version, which changes on any other connection's
# commit, is checked this often while someone waits for such a run...
DATA_VERSION_POLL_SECONDS = 0.05
# ...and a waiter rereads the store at least this often anyway.
STORE_POLL_SECONDS = 0.5


class Signal:
    """A wake-up for everyone waiting on it at once (a commit, a run's end)."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future] = set()

    def fire(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class Waiter:
    """One client's waits: until a signal fires, a timeout passes, or ``release()``.

    A handler releases its waiter when its client disconnects, so a stream
    that waits for the next event lets go of its slot at once, not at the
    next heartbeat.
    """

    __slots__ = ("released", "_future")

    def __init__(self) -> None:
        self.released = False
        self._future: asyncio.Future | None = None

    def release(self) -> None:
        self.released = True
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    async def wait(self, signals: list[Signal], timeout: float | None) -> None:
        if self.released:
            return
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        for signal in signals:
            signal._waiters.add(future)
        timer = None if timeout is None else loop.call_later(max(0.0, timeout), _settle, future)
        try:
            await future
        finally:
            self._future = None
            if timer is not None:
                timer.cancel()
            for signal in signals:
                signal._waiters.discard(future)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class RunGone(Exception):
    """The run was deleted while a subscriber read it: its stream ends."""


class CursorExpired(Exception):
    """The events after the cursor were compacted away: resume from the run's snapshot."""


class Event:
    """A committed event as subscribers see it: its seq, type and wire JSON."""

    __slots__ = ("seq", "type", "envelope", "_frames")

    def __init__(self, seq: int, type: str, envelope: str):
        self.seq = seq
        self.type = type
        self.envelope = envelope
        self._frames: tuple[str | None, str | None] = (None, None)

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_TYPES

    def sse(self, with_id: bool = True) -> str:
        """The event's SSE frame, built once however many subscribers send it."""
        with_seq, without = self._frames
        if with_id:
            if with_seq is None:
                with_seq = f"id: {self.seq}\nevent: {self.type}\ndata: {self.envelope}\n\n"
                self._frames = (with_seq, without)
            return with_seq
        if without is None:
            without = f"event: {self.type}\ndata: {self.envelope}\n\n"
            self._frames = (with_seq, without)
        return without


def envelope(run_id_json: str, seq: int, type: str, ts: str, data: str) -> str:
    """The event's wire JSON, from its parts (``run_id_json`` already JSON-quoted)."""
    return f'{{"run_id":{run_id_json},"seq":{seq},"type":"{type}","ts":"{ts}","data":{data}}}'


class Channel:
    def __init__(self, run_id: str, committed_seq: int):
        self.run_id = run_id
        self.committed_seq = committed_seq
        self.first_seq = 1
        self.compaction_due = False
        self._window: deque[Event] = deque()
        self._window_bytes = 0
        self.signal = Signal()

    def publish(self, events: list[Event]) -> None:
        for event in events:
            self._window.append(event)
            self._window_bytes += len(event.envelope)
        while len(self._window) > WINDOW_EVENTS or self._window_bytes > WINDOW_BYTES:
            self._window_bytes -= len(self._window.popleft().envelope)
        self.committed_seq = events[-1].seq
        self.signal.fire()

    def window_after(self, cursor: int, limit: int, max_bytes: int) -> list[Event] | None:
        """Committed events after ``cursor`` from the window, or None if it does not reach back."""
        if not self._window or self._window[0].seq > cursor + 1:
            return None
        start = cursor + 1 - self._window[0].seq
        events, size = [], 0
        for index in range(start, min(len(self._window), start + limit)):
            event = self._window[index]
            events.append(event)
            size += len(event.envelope)
            if size >= max_bytes:
                break
        return events


class Broadcaster:
    """The channels of the runs this server executes, and a wake-up for the others."""

    def __init__(self, db=None) -> None:
        self._channels: dict[str, Channel] = {}
        self._db = db
        self._remote_waiters = 0
        # Fired after a commit by any other connection to the database.
        self.remote = Signal()
        self._poller: asyncio.Task | None = None

    @contextlib.contextmanager
    def watching_remote(self):
        """While in this block, ``remote`` fires after other connections' commits."""
        self._remote_waiters += 1
        if self._poller is None and self._db is not None:
            self._poller = asyncio.ensure_future(self._poll_data_version())
        try:
            yield
        finally:
            self._remote_waiters -= 1

    async def _poll_data_version(self) -> None:
        try:
            version = self._data_version()
            while self._remote_waiters > 0:
                await asyncio.sleep(DATA_VERSION_POLL_SECONDS)
                current = self._data_version()
                if current != version:
                    version = current
                    self.remote.fire()
        except Exception:  # the store closed under us: waiters fall back to their timeout
            pass
        finally:
            self._poller = None

    def _data_version(self) -> int:
        return self._db.conn.execute("PRAGMA data_version").fetchone()[0]

    def open(self, run_id: str, committed_seq: int) -> Channel:
        channel = self._channels[run_id] = Channel(run_id, committed_seq)
        return channel

    def get(self, run_id: str) -> Channel | None:
        return self._channels.get(run_id)

    def close(self, run_id: str) -> None:
        channel = self._channels.pop(run_id, None)
        if channel is not None:
            channel.signal.fire()

    def signal_for(self, run_id: str) -> tuple[Signal, bool]:
        """What wakes a waiter for ``run_id``, and whether it is the remote poll (another server's run)."""
        channel = self._channels.get(run_id)
        return (self.remote, True) if channel is None else (channel.signal, False)


class Subscriber:
    """A cursor on one run's events: what follows ``cursor``, exactly once, in order."""

    def __init__(self, db, broadcaster: Broadcaster, run_id: str, cursor: int):
        self._db = db
        self._broadcaster = broadcaster
        self.run_id = run_id
        self.cursor = cursor
        self.done = False
        self._run_id_json = '"' + run_id + '"'

    def read(self, limit: int) -> list[Event]:
        """Committed events after the cursor, at most ``limit``, advancing the cursor.

        Raises ``CursorExpired`` when the next event was compacted away, and
        ``RunGone`` when the run itself was deleted.
        """
        if self.done:
            return []
        channel = self._broadcaster.get(self.run_id)
        events = None
        if channel is not None:
            if channel.committed_seq <= self.cursor:
                return []
            events = channel.window_after(self.cursor, limit, READ_MAX_BYTES)
        if events is None:
            rows = store.read_events(
                self._db, self.run_id, self.cursor, min(limit, STORE_READ_CHUNK), max_bytes=READ_MAX_BYTES
            )
            if rows and rows[0][0] != self.cursor + 1:
                raise CursorExpired(self.run_id)
            if not rows and channel is None:
                # Nothing new, or nothing at all any more: only the run's row tells.
                head = store.get_run_head(self._db, self.run_id)
                if head is None:
                    raise RunGone(self.run_id)
                if head["first_seq"] > self.cursor + 1:
                    raise CursorExpired(self.run_id)
            events = [
                Event(seq, type, envelope(self._run_id_json, seq, type, ts, data))
                for seq, type, ts, data in rows
            ]
        if events:
            self.cursor = events[-1].seq
            if events[-1].terminal:
                self.done = True
        return events

    async def pull(self, limit: int, timeout: float, waiter: Waiter | None = None) -> list[Event]:
        """Like ``read``, but wait up to ``timeout`` seconds for at least one event.

        Returns early, maybe with nothing, once ``waiter`` is released.
        """
        waiter = waiter or Waiter()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            events = self.read(limit)
            remaining = deadline - loop.time()
            if events or self.done or remaining <= 0 or waiter.released:
                return events
            signal, remote = self._broadcaster.signal_for(self.run_id)
            if remote:
                with self._broadcaster.watching_remote():
                    await waiter.wait([signal], min(remaining, STORE_POLL_SECONDS))
            else:
                await waiter.wait([signal], remaining)


async def wait_any(subscribers: list[Subscriber], broadcaster: Broadcaster, timeout: float, waiter: Waiter) -> None:
    """Wait until one of ``subscribers`` may have new events, ``timeout`` passes, or ``waiter`` is released."""
    signals: dict[int, Signal] = {}
    remote = False
    for subscriber in subscribers:
        signal, is_remote = broadcaster.signal_for(subscriber.run_id)
        signals[id(signal)] = signal
        remote = remote or is_remote
    if not remote:
        await waiter.wait(list(signals.values()), timeout)
        return
    with broadcaster.watching_remote():
        await waiter.wait(list(signals.values()), min(timeout, STORE_POLL_SECONDS))
