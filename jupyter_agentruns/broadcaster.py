"""From committed events to subscribers, without a queue per subscriber.

Each live run has a ``Channel``: a small window of its most recently committed
events and a wake-up. The writer's commit callback appends to the window and
wakes whoever waits; a ``Subscriber`` is only a cursor that pulls the events
after it, from the window when it covers the cursor, else from the store. A
subscriber that falls behind costs nothing but its cursor: the producer never
waits for it and no memory grows for it.

A subscriber that has every event so far can instead ``follow`` its channel
with a ``Sink`` (a client's connection): after each commit the channel joins
and encodes the new events once, as a ``Batch``, and hands that same batch to
every follower's sink, which writes it to its client at once, in one call. No
task wakes per client and nothing is built per client: with 1,000 clients a
commit costs 1,000 socket writes, not 1,000 wake-ups, reads, joins, encodings
and flushes. A sink that cannot take a batch at once (its client reads slowly,
or left) stops following, and its task goes on from its cursor the usual way,
with a bounded wait for the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Protocol

from . import metrics
from .events import FRAME, SEQ, Event, is_terminal
from .reader import Reader
from .store import Listener, Store, StoreConnection

WINDOW_EVENTS = 2048
WINDOW_BYTES = 4 * 1024 * 1024
STORE_READ_CHUNK = 1000
# One read's worth of event bytes: bounds what a subscriber hands to a response
# at once, and how long a store read on the event loop holds it (about 0.5 ms).
READ_MAX_BYTES = 256 * 1024
# Runs no channel here announces (executed by another server sharing the
# store): the change token, which moves on any other connection's commit, is
# checked this often while someone waits for such a run...
CHANGE_POLL_SECONDS = 0.05
# ...and a waiter rereads the store at least this often anyway.
STORE_POLL_SECONDS = 0.5
# A store that notifies (PostgreSQL) wakes waiters itself: this is only the
# safety net, no more often than a stream's heartbeat.
NOTIFIED_POLL_SECONDS = 15.0
# A remote run someone asked about within this many seconds: a notification naming it wakes waiters.
REMOTE_INTEREST_SECONDS = 60.0
# Between two batches to a run's followers, at least this long per follower: at
# most 25,000 socket writes a second for a run, however many follow it (1,000
# followers get a batch every 40 ms at most, 10 every 0.4 ms).
PUSH_PAUSE_PER_FOLLOWER = 40e-6


class Signal:
    """A wake-up for everyone waiting on it at once (a commit, a run's end).

    ``generation`` counts the fires: a reader that noted it before an await
    knows whether it missed one.
    """

    __slots__ = ("_waiters", "generation")

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future] = set()
        self.generation = 0

    def fire(self) -> None:
        self.generation += 1
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


class Batch:
    """Events committed one after the other, joined and encoded once for every follower."""

    __slots__ = ("events", "size", "_data", "_framed")

    def __init__(self, events: list[Event]):
        self.events = events
        self.size = sum([len(event[FRAME]) for event in events])
        self._data: bytes | None = None
        self._framed: dict[Callable[[bytes], bytes], bytes] = {}

    @property
    def data(self) -> bytes:
        """The events' SSE frames, as the bytes a stream sends."""
        if self._data is None:
            self._data = "".join([event[FRAME] for event in self.events]).encode()
        return self._data

    def framed(self, frame: Callable[[bytes], bytes]) -> bytes:
        """``frame(data)`` (an HTTP chunk, say), made once for all the sinks that frame alike."""
        framed = self._framed.get(frame)
        if framed is None:
            framed = self._framed[frame] = frame(self.data)
        return framed


class Sink(Protocol):
    """A client's connection that a follower's batches are written to."""

    def push(self, batch: Batch) -> bool:
        """Write ``batch`` now, without waiting; False, writing nothing, when the client
        cannot take it at once (it has not read what it was sent before, or it left)."""


class Follow:
    """A subscriber that gets its channel's batches written to its sink as they commit."""

    __slots__ = ("channel", "subscriber", "sink", "signal", "pushed_at")

    def __init__(self, channel: Channel, subscriber: Subscriber, sink: Sink, now: float):
        self.channel = channel
        self.subscriber = subscriber
        self.sink = sink
        # Fired when the channel lets go of this follower.
        self.signal = Signal()
        self.pushed_at = now

    async def wait(self, waiter: Waiter, heartbeat: float) -> bool:
        """Until the channel lets go of this follower (True if after ``heartbeat`` seconds
        without a batch), or ``waiter`` is released. The follower stops following."""
        loop = asyncio.get_running_loop()
        signal = self.signal
        try:
            while signal.generation == 0 and not waiter.released:
                remaining = self.pushed_at + heartbeat - loop.time()
                if remaining <= 0:
                    return True
                await waiter.wait([signal], remaining)
            return False
        finally:
            self.channel.unfollow(self)


class Channel:
    def __init__(self, run_id: str, committed_seq: int):
        self.run_id = run_id
        self.committed_seq = committed_seq
        self.first_seq = 1
        self.compaction_due = False
        self._window: deque[Event] = deque()
        self._window_bytes = 0
        self.signal = Signal()
        # Followers (an ordered set), and the events committed since their last batch.
        self._followers: dict[Follow, None] = {}
        self._pushed_seq = committed_seq
        self._unpushed: list[Event] = []
        self._push_due = False
        # Loop time before which no batch goes out: a pass over the followers
        # is followed by a pause as long as the pass (see ``push``).
        self._push_after = 0.0

    def publish(self, events: list[Event]) -> None:
        self._window.extend(events)
        self._window_bytes += sum([len(event[FRAME]) for event in events])
        while len(self._window) > WINDOW_EVENTS or self._window_bytes > WINDOW_BYTES:
            self._window_bytes -= len(self._window.popleft()[FRAME])
        self.committed_seq = events[-1][SEQ]
        if self._push_due:
            self._unpushed.extend(events)
        elif self._followers:
            # One batch for the commits that reach the loop together: a loop
            # that is behind sends fewer, larger batches.
            self._unpushed.extend(events)
            self._push_due = True
            loop = asyncio.get_running_loop()
            pause = self._push_after - loop.time()
            if pause > 0:
                loop.call_later(pause, self.push)
            else:
                loop.call_soon(self.push)
        else:
            self._pushed_seq = self.committed_seq
        self.signal.fire()

    def follow(self, subscriber: Subscriber, sink: Sink) -> Follow | None:
        """``subscriber`` follows with ``sink``, if it has every event up to the next batch."""
        if subscriber.done or subscriber.cursor != self._pushed_seq:
            return None
        follow = Follow(self, subscriber, sink, asyncio.get_running_loop().time())
        self._followers[follow] = None
        return follow

    def unfollow(self, follow: Follow) -> None:
        if self._followers.pop(follow, 0) is None:
            follow.signal.fire()

    def push(self) -> None:
        """The events committed since the last batch, as one batch, to every follower.

        The next batch waits at least as long as this pass took (fan-out takes
        at most half of the loop), and ``PUSH_PAUSE_PER_FOLLOWER`` per follower:
        with many followers, or a loop short of a core, commits gather into
        fewer batches, and each client too is woken fewer times, to read more.
        With a few followers the pause is microseconds.
        """
        self._push_due = False
        events, self._unpushed = self._unpushed, []
        if not events:
            return
        before, self._pushed_seq = self._pushed_seq, events[-1][SEQ]
        followers = self._followers
        if not followers:
            return
        batch = Batch(events)
        if batch.size > READ_MAX_BYTES:
            # More than a stream sends at once: each reads it in parts, waiting for its client.
            self.end_follows()
            return
        last = self._pushed_seq
        ends = is_terminal(events[-1])
        loop = asyncio.get_running_loop()
        now = loop.time()
        left = []
        for follow in followers:
            subscriber = follow.subscriber
            try:
                taken = subscriber.cursor == before and follow.sink.push(batch)
            except Exception:  # noqa: BLE001 (one broken connection must not stop the others)
                taken = False
            if taken:
                subscriber.cursor = last
                follow.pushed_at = now
                if ends:
                    subscriber.done = True
                    left.append(follow)
            else:
                left.append(follow)
        for follow in left:
            self.unfollow(follow)
        done = loop.time()
        self._push_after = done + max(done - now, PUSH_PAUSE_PER_FOLLOWER * len(followers))

    def end_follows(self) -> None:
        """Every follower stops following (and goes on from its cursor)."""
        followers, self._followers = self._followers, {}
        for follow in followers:
            follow.signal.fire()

    def window_after(self, cursor: int, limit: int, max_bytes: int) -> list[Event] | None:
        """Committed events after ``cursor`` from the window, or None if it does not reach back."""
        if not self._window or self._window[0][SEQ] > cursor + 1:
            return None
        start = cursor + 1 - self._window[0][SEQ]
        events, size = [], 0
        for index in range(start, min(len(self._window), start + limit)):
            event = self._window[index]
            events.append(event)
            size += len(event[FRAME])
            if size >= max_bytes:
                break
        return events


class Broadcaster:
    """The channels of the runs this server executes, and a wake-up for the others.

    The runs another server executes (sharing the store) have no channel
    here: their subscribers wait on ``remote``, which fires after other
    servers' commits. A store that notifies (``Store.listen``) says which
    runs a commit appended to; for one that cannot, a connection of its own
    polls the store's change token while someone waits.
    """

    def __init__(self, reader: Reader, store: Store | None = None) -> None:
        self.reader = reader
        self._channels: dict[str, Channel] = {}
        self._store = store
        self._watch: StoreConnection | None = None
        self._listener: Listener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._remote_waiters = 0
        # Runs of other servers someone asked about, with when (loop time).
        self._interest: dict[str, float] = {}
        # Fired after a commit by any other connection to the store.
        self.remote = Signal()
        self.remote_poll_seconds = STORE_POLL_SECONDS
        # The server stops: no wait for events begins, and those under way end.
        self.stopped = False
        self._poller: asyncio.Task | None = None
        # The subscribers of requests being served (for the metrics): each
        # leaves this set when its request lets go of it.
        self._subscribers: weakref.WeakSet[Subscriber] = weakref.WeakSet()
        metrics.SUBSCRIBERS.track(self, lambda broadcaster: broadcaster.following())
        metrics.SUBSCRIBER_MAX_LAG.track(self, lambda broadcaster: broadcaster.max_lag())

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen to the store's notifications, or get ready to poll it (on the event loop)."""
        if self._store is None or self._loop is not None:
            return
        self._loop = loop
        self._listener = self._store.listen(self._changed_elsewhere)
        if self._listener is not None:
            self.remote_poll_seconds = NOTIFIED_POLL_SECONDS
        else:
            self._watch = self._store.connect()

    def _changed_elsewhere(self, runs: dict[str, int] | None) -> None:
        # The listener's thread: over to the loop.
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(self._remote_commit, runs)

    def _remote_commit(self, runs: dict[str, int] | None) -> None:
        if runs is None or any(run_id in self._interest for run_id in runs):
            self.remote.fire()

    def subscriber(self, run_id: str, cursor: int) -> Subscriber:
        subscriber = Subscriber(self, run_id, cursor)
        self._subscribers.add(subscriber)
        return subscriber

    def following(self) -> int:
        """How many subscribers still follow their run (its terminal event not yet read)."""
        return sum(not subscriber.done for subscriber in self._subscribers)

    def max_lag(self) -> int:
        """The most committed events a subscriber of a run executed here has yet to read."""
        lags = [0]
        for subscriber in self._subscribers:
            channel = self._channels.get(subscriber.run_id)
            if channel is not None and not subscriber.done:
                lags.append(channel.committed_seq - subscriber.cursor)
        return max(lags)

    @contextlib.contextmanager
    def watching_remote(self):
        """While in this block, ``remote`` fires after other connections' commits."""
        self._remote_waiters += 1
        if self._poller is None and self._watch is not None:
            self._poller = asyncio.ensure_future(self._poll_changes())
        try:
            yield
        finally:
            self._remote_waiters -= 1

    async def _poll_changes(self) -> None:
        # A token read costs microseconds (SQLite: PRAGMA data_version): it stays on the loop.
        try:
            assert self._watch is not None  # started only with one; closed later: see except
            token = self._watch.change_token()
            while self._remote_waiters > 0:
                await asyncio.sleep(CHANGE_POLL_SECONDS)
                current = self._watch.change_token()
                if current != token:
                    token = current
                    self.remote.fire()
        except Exception:  # the store closed under us: waiters fall back to their timeout
            pass
        finally:
            self._poller = None

    def stop_waits(self) -> None:
        """At the server's stop: every wait for events ends now, and none begins after."""
        self.stopped = True
        for channel in self._channels.values():
            channel.end_follows()
            channel.signal.fire()
        self.remote.fire()

    def close_watch(self) -> None:
        """At the server's stop: no more notifications, polls or metrics from here."""
        metrics.SUBSCRIBERS.untrack(self)
        metrics.SUBSCRIBER_MAX_LAG.untrack(self)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def open(self, run_id: str, committed_seq: int) -> Channel:
        channel = self._channels[run_id] = Channel(run_id, committed_seq)
        return channel

    def get(self, run_id: str) -> Channel | None:
        return self._channels.get(run_id)

    def close(self, run_id: str) -> None:
        channel = self._channels.pop(run_id, None)
        if channel is not None:
            channel.push()  # the last batch, if its turn has not come yet
            channel.end_follows()
            channel.signal.fire()

    def signal_for(self, run_id: str) -> tuple[Signal, bool]:
        """What wakes a waiter for ``run_id``, and whether it is the remote poll (another server's run)."""
        channel = self._channels.get(run_id)
        if channel is not None:
            return channel.signal, False
        now = time.monotonic()
        if len(self._interest) > 10000:  # forget runs nobody asked about for a while
            self._interest = {
                r: t for r, t in self._interest.items() if now - t < REMOTE_INTEREST_SECONDS
            }
        self._interest[run_id] = now
        return self.remote, True


class Subscriber:
    """A cursor on one run's events: what follows ``cursor``, exactly once, in order."""

    def __init__(self, broadcaster: Broadcaster, run_id: str, cursor: int):
        self._broadcaster = broadcaster
        self.run_id = run_id
        self.cursor = cursor
        self.done = False

    async def read(self, limit: int, *, from_store: bool = False) -> list[Event]:
        """Committed events after the cursor, at most ``limit``, advancing the cursor.

        From the live window when it reaches back that far (no wait), else
        from the store on a reader thread. Raises ``CursorExpired`` when the
        next event was compacted away, and ``RunGone`` when the run itself
        was deleted. The window learns of a commit a moment after the store
        shows it: ``from_store`` reads the store, for an answer that must not
        be behind a read of the run's row made before it.
        """
        if self.done:
            return []
        channel = self._broadcaster.get(self.run_id)
        events = None
        if channel is not None and not from_store:
            if channel.committed_seq <= self.cursor:
                return []
            events = channel.window_after(self.cursor, limit, READ_MAX_BYTES)
        if events is None:
            # A read with a bound (STORE_READ_CHUNK events, READ_MAX_BYTES):
            # on the event loop for a local store. A long replay is many such
            # reads with a send after each, when the other streams go on; on a
            # reader thread it went slower and held those streams back more, the
            # thread and the loop taking turns at the GIL every switch interval.
            events = await self._broadcaster.reader.small(
                lambda conn: self._from_store(
                    conn, min(limit, STORE_READ_CHUNK), remote=channel is None
                )
            )
        if events:
            self.cursor = events[-1][SEQ]
            if is_terminal(events[-1]):
                self.done = True
        return events

    def _from_store(self, conn: StoreConnection, limit: int, remote: bool) -> list[Event]:
        cursor = self.cursor
        events = conn.read_frames(self.run_id, cursor, limit, READ_MAX_BYTES)
        if events and events[0][SEQ] != cursor + 1:
            raise CursorExpired(self.run_id)
        if not events and remote:
            # Nothing new, or nothing at all any more: only the run's row tells.
            head = conn.get_run_head(self.run_id)
            if head is None:
                raise RunGone(self.run_id)
            if head["first_seq"] > cursor + 1:
                raise CursorExpired(self.run_id)
        return events

    def follow(self, sink: Sink) -> Follow | None:
        """Follow the run's channel with ``sink``, if this server executes the run and the
        subscriber has every event up to the channel's next batch; else None."""
        channel = self._broadcaster.get(self.run_id)
        if channel is None or self._broadcaster.stopped:
            return None
        return channel.follow(self, sink)

    async def pull(self, limit: int, timeout: float, waiter: Waiter | None = None) -> list[Event]:
        """Like ``read``, but wait up to ``timeout`` seconds for at least one event.

        Returns early, maybe with nothing, once ``waiter`` is released or the server stops.
        """
        waiter = waiter or Waiter()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            signal, remote = self._broadcaster.signal_for(self.run_id)
            generation = signal.generation
            events = await self.read(limit)
            remaining = deadline - loop.time()
            if (
                events
                or self.done
                or remaining <= 0
                or waiter.released
                or self._broadcaster.stopped
            ):
                return events
            if remote:
                if signal.generation != generation:
                    continue  # another server committed while the read was away
                with self._broadcaster.watching_remote():
                    poll = self._broadcaster.remote_poll_seconds
                    await waiter.wait([signal], min(remaining, poll))
            elif signal.generation == generation:  # else it fired while the read was away
                await waiter.wait([signal], remaining)


def mark(broadcaster: Broadcaster, run_ids: list[str]) -> list[tuple[Signal, int]]:
    """The signals that wake readers of ``run_ids``, with their generations now (before reading)."""
    signals = {}
    for run_id in run_ids:
        signal, _ = broadcaster.signal_for(run_id)
        signals[id(signal)] = signal
    return [(signal, signal.generation) for signal in signals.values()]


async def wait_since(
    broadcaster: Broadcaster, marks: list[tuple[Signal, int]], timeout: float, waiter: Waiter
) -> None:
    """Wait until a marked signal fires (at once if one fired since it was marked), ``timeout``, or a release."""
    if broadcaster.stopped or any(signal.generation != generation for signal, generation in marks):
        return
    signals = [signal for signal, _ in marks]
    if broadcaster.remote not in signals:
        await waiter.wait(signals, timeout)
        return
    with broadcaster.watching_remote():
        await waiter.wait(signals, min(timeout, broadcaster.remote_poll_seconds))
