"""Event streams: where a stream resumes from its cursor, and the frames it sends next.

The handlers speak HTTP (status, headers, a bounded write to the client);
what goes into a stream is decided here: a snapshot frame first when the
events after the cursor were compacted away, the committed events after it,
a ping when nothing happened for a heartbeat, and the end (the run ended, the
client left, the server stops). Runs on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .. import jsonio
from ..broadcaster import (
    Batch,
    Broadcaster,
    CursorExpired,
    RunGone,
    Sink,
    Subscriber,
    Waiter,
    mark,
    wait_since,
)
from ..cursor import StreamRun, check_cursor
from ..domain import RunHead, RunObject
from ..errors import Problem, run_not_found
from ..events import FRAME, envelope_of, sse
from ..lifecycle import is_terminal

__all__ = ["PING", "Batch", "PageStream", "RunStream", "Sink", "Streams", "Waiter", "named"]

# A comment line: keeps proxies from closing an idle stream, tells the client it is alive.
PING = ": ping\n\n"
SSE_BATCH = 500
# The first write of a resumed stream is small, so the first event arrives at once.
SSE_FIRST_BATCH = 32
BATCH_PER_RUN = 200


def named(name: str, data: str, seq: int | None = None) -> str:
    """A frame of a named event (``snapshot``, ``error``), with an ``id:`` line when ``seq`` is given."""
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {name}\ndata: {data}\n\n"


class RunStream:
    """One run's stream from a cursor: ``opening`` first, then ``frames(waiter)``."""

    def __init__(self, streams: Streams, subscriber: Subscriber, opening: str):
        self._streams = streams
        self.subscriber = subscriber
        self.opening = opening

    async def frames(self, waiter: Waiter, sink: Sink | None = None) -> AsyncIterator[str]:
        """The frames to send in turn, until the run ended, ``waiter`` was released or the server stops.

        With a ``sink``, a stream that has every event so far follows the
        run's channel: the live events are written to the sink as they
        commit, a batch shared by all its followers, not yielded here; what
        is yielded then is a ping after a heartbeat without events.

        A run compacted under a slow reader, or deleted, ends the stream: the
        client's reconnect starts with a snapshot frame (or is answered 410 / 404).
        """
        streams, subscriber = self._streams, self.subscriber
        heartbeat = streams.settings.heartbeat_interval
        batch = SSE_FIRST_BATCH
        try:
            while not subscriber.done and not streams.stopping():
                follow = subscriber.follow(sink) if sink is not None else None
                if follow is not None:
                    idle = await follow.wait(waiter, heartbeat)
                    if waiter.released:
                        return
                    if idle:
                        yield PING
                    continue  # the run ended, the client is behind, or the server stops
                events = await subscriber.pull(batch, heartbeat, waiter)
                if waiter.released or (not events and streams.stopping()):
                    return
                batch = SSE_BATCH
                yield "".join([event[FRAME] for event in events]) if events else PING
        except (CursorExpired, RunGone):
            return


class PageStream:
    """Many runs' events over one stream (``GET streams``): ``opening`` first, then ``frames(waiter)``."""

    def __init__(self, streams: Streams, owner: str, subscribers: list[Subscriber], opening: str):
        self._streams = streams
        self._owner = owner
        self.subscribers = subscribers
        self.opening = opening

    @property
    def empty(self) -> bool:
        """Nothing to send: the client has every event of every run it listed."""
        return not self.opening and not self.subscribers

    async def frames(self, waiter: Waiter) -> AsyncIterator[str]:
        """Frames without ``id:`` lines (the client keeps a cursor per run), pings, until
        every run ended, ``waiter`` was released or the server stops."""
        streams = self._streams
        heartbeat = streams.settings.heartbeat_interval
        broadcaster = streams.broadcaster
        loop = asyncio.get_running_loop()
        last_write = loop.time()
        subscribers = self.subscribers
        while subscribers and not streams.stopping():
            # Marked before reading: a commit during a read away on a reader thread is not missed.
            marks = mark(broadcaster, [s.run_id for s in subscribers])
            frames = []
            for subscriber in subscribers:
                try:
                    events = await subscriber.read(BATCH_PER_RUN)
                except (CursorExpired, RunGone):
                    frames.append(await self._resync(subscriber))
                    continue
                frames.extend(sse(event, with_id=False) for event in events)
            subscribers = [s for s in subscribers if not s.done]
            if frames:
                yield "".join(frames)
                last_write = loop.time()
                continue
            idle = loop.time() - last_write
            if idle >= heartbeat:
                yield PING
                last_write = loop.time()
                continue
            await wait_since(broadcaster, marks, heartbeat - idle, waiter)
            if waiter.released:
                return

    async def _resync(self, subscriber: Subscriber) -> str:
        """A run compacted (or deleted) under this stream: its snapshot frame, its cursor moved to it."""
        streams = self._streams
        try:
            row = await streams.owned_head(self._owner, subscriber.run_id)
        except Problem as error:  # deleted meanwhile
            subscriber.done = True
            return named(
                "error", jsonio.dumps({"run_id": subscriber.run_id, "error": error.body()})
            )
        fresh, snapshot = await streams.resume(self._owner, row, -1)
        subscriber.cursor, subscriber.done = fresh.cursor, fresh.done
        return named("snapshot", jsonio.dumps(snapshot))


class Streams:
    """Opens the streams and long-polls of the caller's runs (``GET runs/{id}/events``, ``GET streams``)."""

    def __init__(
        self,
        *,
        settings: Any,
        broadcaster: Broadcaster,
        owned_head: Callable[[str, str], Awaitable[RunHead]],
        get_run: Callable[[str, str], Awaitable[RunObject]],
        stopping: Callable[[], bool],
    ):
        self.settings = settings
        self.broadcaster = broadcaster
        self.owned_head = owned_head
        self._get_run = get_run
        self.stopping = stopping

    async def resume(
        self, owner: str, row: RunHead, cursor: int
    ) -> tuple[Subscriber, RunObject | None]:
        """Where to resume: the cursor, or, when its events were compacted away, the run's snapshot.

        The snapshot is the run object now, at ``W = last_seq``; events follow from W + 1.
        """
        if cursor >= row["first_seq"] - 1:
            return self.broadcaster.subscriber(row["run_id"], cursor), None
        snapshot = await self._get_run(owner, row["run_id"])
        subscriber = self.broadcaster.subscriber(row["run_id"], snapshot["last_seq"])
        subscriber.done = is_terminal(snapshot["status"])
        return subscriber, snapshot

    async def run(self, owner: str, row: RunHead, cursor: int) -> RunStream:
        """A run's stream from ``cursor`` (checked against ``row``, the caller's run's head)."""
        subscriber, snapshot = await self.resume(owner, row, cursor)
        opening = ""
        if snapshot is not None:
            opening = named("snapshot", jsonio.dumps(snapshot), seq=subscriber.cursor)
        return RunStream(self, subscriber, opening)

    async def poll(
        self,
        owner: str,
        row: RunHead,
        cursor: int,
        *,
        limit: int,
        wait: float,
        waiter: Waiter,
        caught_up: bool,
    ) -> str | None:
        """The JSON answer of a long-poll: the events after ``cursor`` (waiting up to ``wait``
        seconds for one), the run's ``last_seq`` and status, and its snapshot when the cursor
        had expired. None when the client left meanwhile."""
        run_id = row["run_id"]
        subscriber, snapshot = await self.resume(owner, row, cursor)
        try:
            events = [] if caught_up else await subscriber.pull(limit, wait, waiter)
            if not events and not caught_up and not subscriber.done:
                # Nothing in the live window: the store may have committed what the
                # window hears of a moment later (and the client may have seen it
                # in the run's row already).
                events = await subscriber.read(limit, from_store=True)
        except CursorExpired:
            row = await self.owned_head(owner, run_id)
            subscriber, snapshot = await self.resume(owner, row, -1)
            events = await subscriber.pull(limit, 0)
        except RunGone:
            await self.owned_head(owner, run_id)  # 410 or 404 now
            raise run_not_found(run_id) from None
        if waiter.released:
            return None
        row = await self.owned_head(owner, run_id)
        done = caught_up or subscriber.done
        tail = {"last_seq": row["last_seq"], "status": row["status"], "done": done}
        if snapshot is not None:
            tail["snapshot"] = snapshot
        tail_json = jsonio.dumps(tail, compact=True)
        return '{"events":[' + ",".join(map(envelope_of, events)) + "]," + tail_json[1:]

    async def page(self, owner: str, runs: list[StreamRun]) -> PageStream:
        """The page stream of ``runs`` (run id, parsed cursor): a run that is unknown, not the
        caller's, or whose cursor is wrong gets an ``error`` frame; the others go on."""
        opening: list[str] = []
        subscribers: list[Subscriber] = []
        for run_id, cursor in runs:
            try:
                if isinstance(cursor, Problem):
                    raise cursor
                row = await self.owned_head(owner, run_id)
                check_cursor(cursor, row["last_seq"])
            except Problem as error:
                opening.append(
                    named("error", jsonio.dumps({"run_id": run_id, "error": error.body()}))
                )
                continue
            if is_terminal(row["status"]) and cursor == row["last_seq"]:
                continue  # the client has everything of this run
            subscriber, snapshot = await self.resume(owner, row, cursor)
            if snapshot is not None:
                opening.append(named("snapshot", jsonio.dumps(snapshot)))
            if not subscriber.done:
                subscribers.append(subscriber)
        return PageStream(self, owner, subscribers, "".join(opening))
