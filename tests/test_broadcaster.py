"""The broadcaster on its own: the live window, store fallback, waits and their release."""

import asyncio

import pytest

from jupyter_agentruns import events
from jupyter_agentruns.broadcaster import Broadcaster, CursorExpired, RunGone, Waiter
from jupyter_agentruns.events import SEQ, envelope
from jupyter_agentruns.reader import Reader

from conftest import LoopTurns


def event(seq, type="text.delta"):
    return events.event(seq, type, envelope('"run_a"', seq, type, "t", "{}"))


class CountingReader(Reader):
    """A reader that counts the reads that reached the store."""

    def __init__(self, store):
        super().__init__(store)
        self.reads = 0

    async def run(self, fn):
        self.reads += 1
        return await super().run(fn)

    async def small(self, fn):
        self.reads += 1
        return await super().small(fn)


@pytest.fixture
def store(make_store):
    store = make_store()
    conn = store.connect()
    with conn.transaction():
        conn.insert_run({"run_id": "run_a", "owner": "me", "agent": "demo", "status": "running",
                         "created_at": "t", "last_seq": 0, "first_seq": 1})  # fmt: skip
        conn.append_events([("run_a", seq, "text.delta", "t", "{}") for seq in range(1, 5001)])
        conn.set_last_seqs([(5000, "run_a")])
    conn.close()
    return store


@pytest.fixture
def reader(store):
    reader = CountingReader(store)
    yield reader
    reader.close()


async def test_a_subscriber_inside_the_window_reads_it_without_the_store(reader):
    broadcaster = Broadcaster(reader)
    channel = broadcaster.open("run_a", 5000)
    channel.publish([event(seq) for seq in range(5001, 5101)])
    subscriber = broadcaster.subscriber("run_a", 5050)
    events = await subscriber.read(1000)
    assert [e[SEQ] for e in events] == list(range(5051, 5101))
    assert reader.reads == 0
    assert await subscriber.read(1000) == []  # nothing after the last committed event


async def test_a_replay_from_the_store_gives_the_loop_a_turn_before_each_read(reader):
    """Even where the store is read on the loop (SQLite), other streams go between the reads."""
    broadcaster = Broadcaster(reader)
    broadcaster.open("run_a", 5000)
    subscriber = broadcaster.subscriber("run_a", 0)
    seen = []
    async with LoopTurns() as turns:
        while subscriber.cursor < 5000:
            await subscriber.read(1000)
            seen.append(turns.count)
    assert len(seen) >= 5 and seen == sorted(set(seen))  # a turn between any two reads


async def test_a_subscriber_behind_the_window_reads_the_store_then_catches_up_from_it(reader):
    broadcaster = Broadcaster(reader)
    channel = broadcaster.open("run_a", 5000)
    channel.publish([event(seq) for seq in range(5001, 5011)])
    subscriber = broadcaster.subscriber("run_a", 0)
    seen = []
    while subscriber.cursor < 5000:
        seen += [e[SEQ] for e in await subscriber.read(1000)]
    assert seen == list(range(1, 5001)) and reader.reads >= 5
    reads = reader.reads
    assert [e[SEQ] for e in await subscriber.read(1000)] == list(range(5001, 5011))
    assert reader.reads == reads


async def test_a_pull_wakes_at_the_next_publish_and_a_release_ends_it_at_once(reader):
    broadcaster = Broadcaster(reader)
    channel = broadcaster.open("run_a", 5000)
    subscriber = broadcaster.subscriber("run_a", 5000)
    pulling = asyncio.ensure_future(subscriber.pull(100, 30))
    await asyncio.sleep(0)
    channel.publish([event(5001)])
    assert [e[SEQ] for e in await asyncio.wait_for(pulling, 5)] == [5001]

    waiter = Waiter()
    pulling = asyncio.ensure_future(subscriber.pull(100, 30, waiter))
    await asyncio.sleep(0)
    waiter.release()  # the client went away
    assert await asyncio.wait_for(pulling, 5) == []


async def test_the_terminal_event_ends_a_subscriber(reader):
    broadcaster = Broadcaster(reader)
    channel = broadcaster.open("run_a", 5000)
    channel.publish([event(5001), event(5002, "run.succeeded")])
    subscriber = broadcaster.subscriber("run_a", 5000)
    assert [e[SEQ] for e in await subscriber.read(10)] == [5001, 5002]
    assert subscriber.done and await subscriber.read(10) == []


async def test_another_servers_run_wakes_its_subscribers_on_commits_of_other_connections(
    store, reader, make_store
):
    broadcaster = Broadcaster(reader, store)
    broadcaster.start(asyncio.get_running_loop())
    listener = broadcaster._listener
    if listener is not None:  # PostgreSQL: LISTENing before the commit
        await asyncio.get_running_loop().run_in_executor(None, listener.connected.wait, 5)
    subscriber = broadcaster.subscriber("run_a", 5000)  # no channel: another server executes it
    pulling = asyncio.ensure_future(subscriber.pull(100, 30))
    await asyncio.sleep(0.1)
    conn = make_store().connect()  # another server's connection
    with conn.transaction():
        conn.append_events([("run_a", 5001, "text.delta", "t", "{}")])
    # At once: not at the safety net's reread (0.5 s polled, 15 s notified).
    events = await asyncio.wait_for(pulling, 0.4)
    assert [e[SEQ] for e in events] == [5001]
    conn.close()
    broadcaster.close_watch()


async def test_compacted_events_and_a_deleted_run_are_said_not_skipped(store, reader):
    broadcaster = Broadcaster(reader)
    conn = store.connect()
    with conn.transaction():
        conn.delete_events_before("run_a", 100, 1000)
        conn.update_run("run_a", {"first_seq": 100})
    with pytest.raises(CursorExpired):
        await broadcaster.subscriber("run_a", 10).read(100)
    with conn.transaction():
        conn.delete_run("run_a")
    conn.close()
    with pytest.raises(RunGone):
        await broadcaster.subscriber("run_a", 5000).read(100)


class Sink:
    """A client's connection as a follower sees it: takes a batch, or not (its client is slow)."""

    def __init__(self, takes=True):
        self.takes = takes
        self.batches = []

    def push(self, batch):
        if self.takes:
            self.batches.append(batch)
        return self.takes


async def test_followers_get_one_batch_per_turn_of_the_loop_shared_by_all(reader):
    """Commits that reach the loop together are one batch, joined and encoded once for everyone."""
    broadcaster = Broadcaster(reader)
    channel = broadcaster.open("run_a", 5000)
    subscribers = [broadcaster.subscriber("run_a", 5000) for _ in range(3)]
    sinks = [Sink() for _ in subscribers]
    follows = [s.follow(sink) for s, sink in zip(subscribers, sinks, strict=True)]
    assert all(follows)
    channel.publish([event(5001)])
    channel.publish([event(5002), event(5003)])
    await asyncio.sleep(0)
    batch = sinks[0].batches[0]
    assert all(sink.batches == [batch] for sink in sinks)  # the same object for every follower
    assert [e[SEQ] for e in batch.events] == [5001, 5002, 5003]
    assert batch.data == b"".join(e[2].encode() for e in batch.events)
    assert batch.data is batch.data and batch.framed(bytes.upper) is batch.framed(bytes.upper)
    assert all(s.cursor == 5003 and not s.done for s in subscribers)
    # The run's end: the last batch, then each follower is let go of, done.
    waits = [asyncio.ensure_future(follow.wait(Waiter(), 30)) for follow in follows]
    channel.publish([event(5004, "run.succeeded")])
    assert await asyncio.wait_for(asyncio.gather(*waits), 5) == [False] * 3
    assert all(s.cursor == 5004 and s.done for s in subscribers)
    assert all(len(sink.batches) == 2 for sink in sinks)


async def test_a_follower_that_cannot_take_a_batch_goes_on_from_its_cursor(reader):
    broadcaster = Broadcaster(reader)
    channel = broadcaster.open("run_a", 5000)
    slow, fast = broadcaster.subscriber("run_a", 5000), broadcaster.subscriber("run_a", 5000)
    slow_follow, fast_follow = slow.follow(Sink(takes=False)), fast.follow(Sink())
    waiting = asyncio.ensure_future(slow_follow.wait(Waiter(), 30))
    channel.publish([event(5001)])
    assert await asyncio.wait_for(waiting, 5) is False  # let go of, not idle
    assert slow.cursor == 5000 and fast.cursor == 5001
    assert [e[SEQ] for e in await slow.read(10)] == [5001]  # the usual way, from the window
    assert slow.follow(Sink()) is not None  # caught up: it may follow again
    # Only a subscriber with every event up to the next batch may follow.
    assert broadcaster.subscriber("run_a", 4000).follow(Sink()) is None
    # A heartbeat without a batch ends a follower's wait (the stream sends a ping); so does a release.
    assert await asyncio.wait_for(fast_follow.wait(Waiter(), 0.05), 5) is True
    waiter = Waiter()
    following = asyncio.ensure_future(fast.follow(Sink()).wait(waiter, 30))
    await asyncio.sleep(0)
    waiter.release()
    assert await asyncio.wait_for(following, 5) is False
    # The server's stop lets go of every follower.
    following = asyncio.ensure_future(fast.follow(Sink()).wait(Waiter(), 30))
    await asyncio.sleep(0)
    broadcaster.stop_waits()
    assert await asyncio.wait_for(following, 5) is False
    assert fast.follow(Sink()) is None
