"""GET runs/{id}/events: resuming from any cursor, over SSE and JSON long-poll."""

import asyncio
import re

import pytest
import rawdb

from agents_for_tests import TEST_AGENTS
from conftest import (
    TERMINAL,
    all_events,
    demo_input,
    parse_sse,
    sse_frames,
    submit,
    wait_for,
    wait_run,
    wait_seq,
)

ENVELOPE_KEYS = {"run_id", "seq", "type", "ts", "data"}
TERMINAL_TYPES = {"run.succeeded", "run.failed", "run.cancelled", "run.interrupted"}


async def finished_run(api, **input):
    response = await submit(api, input=demo_input(**input))
    assert response.status_code == 201, response.text
    return await wait_run(api, response.json()["run_id"])


async def test_events_are_contiguous_envelopes_with_one_terminal_event_last(api):
    run = await finished_run(api)
    events = await all_events(api, run["run_id"])
    assert [e["seq"] for e in events] == list(range(1, run["last_seq"] + 1))
    for event in events:
        assert set(event) == ENVELOPE_KEYS
        assert event["run_id"] == run["run_id"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event["ts"])
    assert events[0]["type"] == "run.started"
    assert [e["type"] for e in events if e["type"] in TERMINAL_TYPES] == ["run.succeeded"]
    assert events[-1]["type"] == "run.succeeded"
    assert events[-1]["data"] == {"output": run["output"]}


async def test_sse_headers_and_retry_line_come_first(api):
    run = await finished_run(api, chunks=3)
    async with api.stream(
        "GET", f"runs/{run['run_id']}/events", headers={"Accept": "text/event-stream"}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        body = (await response.aread()).decode()
    assert body.startswith("retry: ")
    assert body.endswith("\n\n")


async def test_sse_resume_with_after_at_every_cursor(api):
    run = await finished_run(api, chunks=10)
    last = run["last_seq"]
    for cursor in range(last):
        response, frames = await sse_frames(api, run["run_id"], after=cursor)
        assert response.status_code == 200
        events = [f for f in frames if "event" in f]
        assert [int(f["id"]) for f in events] == list(range(cursor + 1, last + 1))
        assert [f["data"]["seq"] for f in events] == list(range(cursor + 1, last + 1))
        assert all(f["event"] == f["data"]["type"] for f in events)


async def test_sse_resume_with_last_event_id_at_every_cursor_and_it_wins_over_after(api):
    run = await finished_run(api, chunks=10)
    last = run["last_seq"]
    for cursor in range(last):
        _, frames = await sse_frames(api, run["run_id"], after=0, last_event_id=cursor)
        assert [int(f["id"]) for f in frames if "event" in f] == list(range(cursor + 1, last + 1))


async def test_json_resume_at_every_cursor_with_small_pages(api):
    run = await finished_run(api, chunks=10)
    last = run["last_seq"]
    for cursor in range(last + 1):
        seqs, after = [], cursor
        while True:
            body = (
                await api.get(f"runs/{run['run_id']}/events", params={"after": after, "limit": 3})
            ).json()
            seqs += [e["seq"] for e in body["events"]]
            assert body["last_seq"] == last and body["status"] == "succeeded"
            if body["done"]:
                break
            after = body["events"][-1]["seq"]
        assert seqs == list(range(cursor + 1, last + 1))


async def test_cursor_at_the_end_of_a_finished_run_is_204_over_sse_and_done_over_json(api):
    run = await finished_run(api, chunks=3)
    response, _ = await sse_frames(api, run["run_id"], after=run["last_seq"])
    assert response.status_code == 204
    response, _ = await sse_frames(api, run["run_id"], last_event_id=run["last_seq"])
    assert response.status_code == 204
    body = (await api.get(f"runs/{run['run_id']}/events", params={"after": run["last_seq"]})).json()
    assert body["events"] == [] and body["done"] is True and body["status"] == "succeeded"


async def test_cursor_beyond_last_seq_is_409_cursor_ahead(api):
    run = await finished_run(api, chunks=3)
    for accept in ("text/event-stream", "application/json"):
        response = await api.get(
            f"runs/{run['run_id']}/events",
            params={"after": run["last_seq"] + 1},
            headers={"Accept": accept},
        )
        assert response.status_code == 409
        assert response.json()["error"] == "cursor_ahead"


@pytest.mark.parametrize("cursor", ["-1", "abc", "1.5", "0x3", "1e3", "9" * 30])
async def test_cursor_that_is_not_a_non_negative_integer_is_400(api, cursor):
    run = await finished_run(api, chunks=3)
    for headers, params in (({"Last-Event-ID": cursor}, {}), ({}, {"after": cursor})):
        response = await api.get(f"runs/{run['run_id']}/events", params=params, headers=headers)
        assert response.status_code == 400
        assert response.json()["error"] == "invalid_cursor"


@pytest.mark.parametrize(
    "params",
    [{"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"wait": 31}, {"wait": -1}, {"wait": "soon"}],
)
async def test_long_poll_bounds_are_checked(api, params):
    run = await finished_run(api, chunks=3)
    response = await api.get(f"runs/{run['run_id']}/events", params=params)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"


async def test_events_of_an_unknown_run_are_404(api):
    response = await api.get(
        "runs/run_doesnotexist/events", headers={"Accept": "text/event-stream"}
    )
    assert response.status_code == 404
    assert response.json()["error"] == "run_not_found"


async def test_live_tail_with_disconnects_gives_exactly_every_event_once(api):
    response = await submit(api, input=demo_input(chunks=120, delay=0.005))
    run_id = response.json()["run_id"]
    received, cursor, connections = [], 0, 0
    while True:
        connections += 1
        response, frames = await sse_frames(api, run_id, last_event_id=cursor, limit=7)
        if response.status_code == 204:
            break
        events = [f["data"] for f in frames if "event" in f]
        received += events
        if events:
            cursor = events[-1]["seq"]
        if events and events[-1]["type"] in TERMINAL_TYPES:
            break
    run = await wait_run(api, run_id)
    assert connections > 5
    assert [e["seq"] for e in received] == list(range(1, run["last_seq"] + 1))


async def test_many_subscribers_at_random_cursors_during_appends_see_no_hole_and_no_duplicate(api):
    response = await submit(api, input=demo_input(chunks=300, delay=0.002))
    run_id = response.json()["run_id"]

    async def follow(delay):
        await asyncio.sleep(delay)
        body = (await api.get(f"runs/{run_id}/events")).json()
        start = body["last_seq"] // 2
        _, frames = await sse_frames(api, run_id, after=start)
        return start, [f["data"]["seq"] for f in frames if "event" in f]

    results = await asyncio.gather(*(follow(i * 0.03) for i in range(20)))
    run = await wait_run(api, run_id)
    for start, seqs in results:
        assert seqs == list(range(start + 1, run["last_seq"] + 1))


async def test_nothing_reaches_a_subscriber_before_it_is_committed(api, engine):
    response = await submit(api, input=demo_input(chunks=200, delay=0.001))
    run_id = response.json()["run_id"]
    db = rawdb.connect(rawdb.target(engine))
    try:
        async with api.stream(
            "GET", f"runs/{run_id}/events", headers={"Accept": "text/event-stream"}
        ) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("id: "):
                    seq = int(line[4:])
                    stored = db.execute(
                        "SELECT count(*) FROM events WHERE run_id = ? AND seq = ?", [run_id, seq]
                    ).fetchone()[0]
                    assert stored == 1, f"event {seq} was served before it was committed"
    finally:
        db.close()


async def test_heartbeat_comments_arrive_while_a_run_is_quiet(api):
    response = await submit(api, input=demo_input(chunks=2, delay=1.6, tools=False))
    run_id = response.json()["run_id"]
    _, frames = await sse_frames(api, run_id)
    assert any(f.get("comment") == "ping" for f in frames)
    assert frames[-1]["event"] == "run.succeeded"


async def test_snapshot_text_equals_the_concatenated_deltas_during_and_after_the_run(api):
    response = await submit(api, input=demo_input(chunks=200, delay=0.003))
    run_id = response.json()["run_id"]
    answers = []

    async def read_until_the_end():
        while not answers or answers[-1]["status"] not in TERMINAL:
            answers.append((await api.get(f"runs/{run_id}")).json())

    await asyncio.gather(*(read_until_the_end() for _ in range(3)))
    # Read afterwards: a poll that does not wait may answer before the newest
    # commit was published, with fewer events than a run object just read.
    events = await all_events(api, run_id)
    assert sum(answer["status"] == "running" for answer in answers) > 3
    for answer in answers:
        deltas = "".join(
            e["data"]["delta"]
            for e in events
            if e["type"] == "text.delta" and e["seq"] <= answer["last_seq"]
        )
        assert "".join(m["text"] for m in answer["snapshot"]["messages"]) == deltas
    run = await wait_run(api, run_id)
    deltas = "".join(e["data"]["delta"] for e in events if e["type"] == "text.delta")
    assert run["snapshot"]["messages"][0]["text"] == deltas == run["output"]["text"]
    assert [t["status"] for t in run["snapshot"]["tools"]] == ["completed", "completed"]


async def test_long_poll_waits_for_the_next_event(api):
    response = await submit(api, input=demo_input(chunks=3, delay=0.3, tools=False))
    run_id = response.json()["run_id"]
    body = (await api.get(f"runs/{run_id}/events", params={"after": 0, "wait": 10})).json()
    cursor = body["events"][-1]["seq"]
    body = (await api.get(f"runs/{run_id}/events", params={"after": cursor, "wait": 10})).json()
    assert body["events"] and body["events"][0]["seq"] == cursor + 1


async def test_an_empty_last_event_id_counts_as_absent(api):
    run = await finished_run(api, chunks=3)
    response = await api.get(
        f"runs/{run['run_id']}/events", params={"after": "x"}, headers={"Last-Event-ID": ""}
    )
    assert response.status_code == 400 and response.json()["error"] == "invalid_cursor"
    body = (
        await api.get(
            f"runs/{run['run_id']}/events", params={"after": 2}, headers={"Last-Event-ID": ""}
        )
    ).json()
    assert body["events"][0]["seq"] == 3


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_a_stream_of_a_run_deleted_while_it_is_read_ends_and_its_reconnect_is_404(
    api, engine
):
    # 32 MB: well over what loopback's socket buffers take in while the client does not read.
    run_id = (await submit(api, agent="big_text", input={"n": 16000, "size": 2000})).json()[
        "run_id"
    ]
    run = await wait_run(api, run_id)
    received = []
    async with api.stream(
        "GET", f"runs/{run_id}/events", headers={"Accept": "text/event-stream"}
    ) as response:
        lines = response.aiter_lines()
        async for frame in parse_sse(lines):
            if "id" in frame:
                received.append(int(frame["id"]))
                break
        # The server fills the socket and waits for this client; meanwhile the run goes.
        assert (await api.delete(f"runs/{run_id}")).status_code == 204
        async for frame in parse_sse(lines):
            if "id" in frame:
                received.append(int(frame["id"]))
    assert received == list(range(1, len(received) + 1)) and len(received) < run["last_seq"]
    assert engine.open_streams["~shared"] == 0
    reconnect = await api.get(
        f"runs/{run_id}/events",
        headers={"Accept": "text/event-stream", "Last-Event-ID": str(received[-1])},
    )
    assert reconnect.status_code == 404 and reconnect.json()["error"] == "run_not_found"


@pytest.mark.parametrize("agentruns_config", [{"max_streams_per_user": 2, "agents": TEST_AGENTS}])
async def test_waiting_long_polls_count_against_max_streams_per_user(api, engine):
    run_id = (await submit(api, agent="sleeper", input={})).json()["run_id"]
    first = await wait_seq(api, run_id, 2)  # run.started, tool.started: then it sleeps a minute
    polls = [
        asyncio.ensure_future(api.get(f"runs/{run_id}/events", params={"after": first, "wait": 3}))
        for _ in range(2)
    ]
    await wait_for(lambda: engine.open_streams["~shared"] == 2, what="two waiting long-polls")
    third = await api.get(f"runs/{run_id}/events", params={"after": first, "wait": 3})
    assert third.status_code == 429 and third.json()["error"] == "too_many_streams"
    # One that does not wait holds nothing.
    assert (await api.get(f"runs/{run_id}/events", params={"after": 0})).status_code == 200
    assert all(r.status_code == 200 for r in await asyncio.gather(*polls))
    await api.post(f"runs/{run_id}/cancel")


@pytest.mark.parametrize(
    "agentruns_config", [{"max_streams_per_user": 2, "heartbeat_interval": 30}]
)
async def test_a_client_that_disconnects_frees_its_stream_slot_at_once(api, engine):
    run_id = (await submit(api, input=demo_input(delay=5, chunks=2, tools=False))).json()["run_id"]
    for _ in range(10):  # a page reloading in a loop
        for path, params in ((f"runs/{run_id}/events", {}), ("streams", {"runs": f"{run_id}:0"})):
            async with api.stream(
                "GET", path, params=params, headers={"Accept": "text/event-stream"}
            ) as response:
                assert response.status_code == 200, await response.aread()
                async for line in response.aiter_lines():
                    if line.startswith("retry:"):
                        break
    deadline = asyncio.get_running_loop().time() + 5
    while engine.open_streams["~shared"] and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    assert engine.open_streams["~shared"] == 0
    await api.post(f"runs/{run_id}/cancel")
