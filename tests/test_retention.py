"""Compaction, retention and expired cursors: the server says when it can no longer replay."""

import asyncio
import threading
import time

import pytest
import rawdb

from jupyter_agentruns.compaction import compaction_target
from jupyter_agentruns.reducer import apply, reduce

import agents_for_tests
from agents_for_tests import TEST_AGENTS
from conftest import demo_input, parse_sse, sse_frames, submit, wait_for, wait_run

PER_USER = {"identity_provider_class": "identity.HeaderIdentityProvider"}


def row(status="succeeded", first=1, last=100, finished_ts=0.0):
    return {"status": status, "first_seq": first, "last_seq": last, "finished_ts": finished_ts}


def test_compaction_target_keeps_the_terminal_event_of_an_old_run():
    assert (
        compaction_target(row(finished_ts=0), now=1000, retention_seconds=10, max_events=1000)
        == 100
    )
    assert (
        compaction_target(row(finished_ts=995), now=1000, retention_seconds=10, max_events=1000)
        is None
    )
    assert (
        compaction_target(row(first=100), now=1000, retention_seconds=10, max_events=1000) is None
    )


def test_compaction_target_caps_the_events_kept_per_run_even_while_it_runs():
    assert (
        compaction_target(row("running", last=1500), now=0, retention_seconds=10, max_events=1000)
        == 501
    )
    assert (
        compaction_target(row("running", last=1000), now=0, retention_seconds=10, max_events=1000)
        is None
    )


async def compacted_run(api, engine, **input):
    run_id = (await submit(api, input=demo_input(**input))).json()["run_id"]
    before = await wait_run(api, run_id)
    for _ in range(50):
        after = (await api.get(f"runs/{run_id}")).json()
        if after["first_seq"] == after["last_seq"]:
            return before, after
        await asyncio.sleep(0.1)
    raise AssertionError("the run was not compacted")


@pytest.mark.parametrize("agentruns_config", [{"event_retention_seconds": 0.2}])
async def test_an_old_finished_run_keeps_its_snapshot_and_terminal_event_only(api, engine):
    before, after = await compacted_run(api, engine, chunks=30)
    assert after["first_seq"] == after["last_seq"] == before["last_seq"]
    assert after["snapshot"] == before["snapshot"] and after["output"] == before["output"]

    # Readers ignore the events below first_seq at once; their rows go in small
    # bites after it: gone a moment later.
    for _ in range(100):
        db = rawdb.connect(rawdb.target(engine))
        kept = db.execute(
            "SELECT seq, type FROM events WHERE run_id = ?", [before["run_id"]]
        ).fetchall()
        db.close()
        if len(kept) == 1:
            break
        await asyncio.sleep(0.1)
    assert kept == [(before["last_seq"], "run.succeeded")]


@pytest.mark.parametrize("agentruns_config", [{"event_retention_seconds": 0.2}])
async def test_an_expired_cursor_gets_the_snapshot_first_over_sse_then_the_stream_ends(api, engine):
    before, after = await compacted_run(api, engine, chunks=30)
    last = after["last_seq"]
    for cursor in (0, 5, last - 2):
        response, frames = await sse_frames(api, after["run_id"], after=cursor)
        assert response.status_code == 200
        assert [f["event"] for f in frames if "event" in f] == ["snapshot"]
        snapshot = frames[0] if "event" in frames[0] else frames[1]
        assert snapshot["id"] == str(last)
        assert snapshot["data"] == after
    # A cursor at first_seq - 1 is not expired: it gets the terminal event.
    _, frames = await sse_frames(api, after["run_id"], after=last - 1)
    assert [f["event"] for f in frames if "event" in f] == ["run.succeeded"]
    assert (await sse_frames(api, after["run_id"], after=last))[0].status_code == 204


@pytest.mark.parametrize("agentruns_config", [{"event_retention_seconds": 0.2}])
async def test_an_expired_cursor_gets_the_snapshot_field_over_json(api, engine):
    _, after = await compacted_run(api, engine, chunks=30)
    body = (await api.get(f"runs/{after['run_id']}/events", params={"after": 3})).json()
    assert body["snapshot"] == after
    assert body["events"] == [] and body["done"] is True
    body = (
        await api.get(f"runs/{after['run_id']}/events", params={"after": after["last_seq"] - 1})
    ).json()
    assert "snapshot" not in body and [e["type"] for e in body["events"]] == ["run.succeeded"]


@pytest.mark.parametrize("agentruns_config", [{"max_retained_events": 40}])
async def test_a_live_run_over_its_event_budget_is_compacted_while_a_slow_client_follows(api):
    run_id = (await submit(api, input=demo_input(chunks=600, delay=0.002))).json()["run_id"]
    cursor, state, seen_snapshot, seqs = 0, None, False, []
    while True:
        await asyncio.sleep(0.1)  # a slow reader: compaction overtakes it
        body = (
            await api.get(f"runs/{run_id}/events", params={"after": cursor, "limit": 10})
        ).json()
        if "snapshot" in body:
            seen_snapshot = True
            state = body["snapshot"]["snapshot"]
            cursor = body["snapshot"]["last_seq"]
            seqs.append(("snapshot", cursor))
        for event in body["events"]:
            assert event["seq"] == cursor + 1, "a hole after a snapshot"
            state = apply(state if state is not None else reduce([]), event)
            cursor = event["seq"]
        if body["done"]:
            break
    run = await wait_run(api, run_id)
    assert seen_snapshot
    assert run["first_seq"] > 1
    assert state["messages"][0]["text"] == run["output"]["text"]
    # The last commit (a big batch on a loaded machine) may go over the budget:
    # the compaction it starts brings the run back within it a moment later.
    for _ in range(50):
        if run["last_seq"] - run["first_seq"] + 1 <= 40 + 4 + 1:
            break
        await asyncio.sleep(0.1)
        run = (await api.get(f"runs/{run_id}")).json()
    assert run["last_seq"] - run["first_seq"] + 1 <= 40 + 4 + 1


def words(count: int) -> str:
    """The text of a paced_writer run after ``count`` words."""
    return "".join(f"{index} " for index in range(count))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS, "max_retained_events": 10}])
async def test_a_live_run_compacted_while_it_is_read_is_answered_at_its_last_seq(
    api, engine, monkeypatch
):
    """The run's row is read, then a compaction deletes the events after its snapshot, then those events are read."""
    run_id = (await submit(api, agent="paced_writer", input={"batches": [30, 30]})).json()["run_id"]
    gate = agents_for_tests.gates.setdefault(run_id, asyncio.Event())
    # run.started, message.started, then word i at seq i + 3: 30 words end at seq 32.
    channel = engine.broadcaster.get(run_id)
    await wait_for(
        lambda: channel.committed_seq == 32 and not channel.compaction_due,
        what="the first words, compacted",
    )
    loop = asyncio.get_running_loop()
    probe = engine.store.connect()
    connection_class = type(probe)
    probe.close()
    read_events = connection_class.read_events
    armed, deleted = threading.Event(), threading.Event()
    armed.set()

    def read_events_after_a_compaction(conn, run, after, limit, upto=None, max_bytes=None):
        # The first read of events up to a last_seq on a reader thread is the
        # answer's: nothing else reads the run until its gate opens.
        reader = threading.current_thread().name.startswith("agentruns-reader")
        if reader and upto is not None and armed.is_set():
            armed.clear()
            loop.call_soon_threadsafe(gate.set)  # 30 more words, compacted as they come
            db = rawdb.connect(rawdb.target(engine))
            try:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not deleted.is_set():
                    left = db.execute(
                        "SELECT count(*) FROM events WHERE run_id = ? AND seq <= ?", [run, upto]
                    ).fetchone()[0]
                    if left == 0:
                        deleted.set()
                    time.sleep(0.01)
            finally:
                db.close()
        return read_events(conn, run, after, limit, upto, max_bytes)

    monkeypatch.setattr(connection_class, "read_events", read_events_after_a_compaction)
    run = (await api.get(f"runs/{run_id}")).json()
    assert deleted.is_set(), "the compaction did not overtake the read"
    assert run["last_seq"] == 32 and run["first_seq"] <= 23
    assert run["snapshot"]["messages"][0]["text"] == words(30)

    await wait_for(lambda: channel.committed_seq == 62 and not channel.compaction_due)
    run = (await api.get(f"runs/{run_id}")).json()
    assert run["last_seq"] == 62 and run["snapshot"]["messages"][0]["text"] == words(60)
    gate.set()
    run = await wait_run(api, run_id)
    assert run["snapshot"]["messages"][0]["text"] == words(60)


@pytest.mark.parametrize("agentruns_config", [{"event_retention_seconds": 0.2}])
async def test_the_page_stream_sends_a_snapshot_frame_for_an_expired_cursor(api, engine):
    _, old = await compacted_run(api, engine, chunks=10)
    fresh = (await submit(api, input=demo_input(chunks=10))).json()["run_id"]
    frames = []
    async with api.stream(
        "GET",
        "streams",
        params={"runs": f"{old['run_id']}:2,{fresh}:0"},
        headers={"Accept": "text/event-stream"},
    ) as response:
        async for frame in parse_sse(response.aiter_lines()):
            frames.append(frame)
    snapshots = [f["data"] for f in frames if f.get("event") == "snapshot"]
    assert snapshots == [old]
    fresh_seqs = [
        f["data"]["seq"]
        for f in frames
        if f.get("event") not in (None, "snapshot") and f["data"]["run_id"] == fresh
    ]
    assert fresh_seqs == list(range(1, fresh_seqs[-1] + 1))


@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize("agentruns_config", [{"run_retention_seconds": 0.3}])
async def test_a_run_past_its_retention_is_gone_with_410_for_its_owner_and_404_for_others(api):
    alice = {"X-Test-User": "alice"}
    run_id = (await submit(api, headers=alice, input=demo_input(chunks=3))).json()["run_id"]
    await wait_run(api, run_id, headers=alice)
    for _ in range(50):
        response = await api.get(f"runs/{run_id}", headers=alice)
        if response.status_code == 410:
            break
        await asyncio.sleep(0.1)
    assert response.status_code == 410 and response.json()["error"] == "run_expired"
    assert (await api.get(f"runs/{run_id}/events", headers=alice)).status_code == 410
    assert (await api.post(f"runs/{run_id}/cancel", headers=alice)).status_code == 410
    assert (await api.delete(f"runs/{run_id}", headers=alice)).status_code == 410
    assert (await api.get(f"runs/{run_id}", headers={"X-Test-User": "bob"})).status_code == 404
    assert (await api.get("runs", headers=alice)).json()["runs"] == []
