"""GET streams: one connection carries the events of many runs."""

import asyncio

import pytest

from conftest import demo_input, parse_sse, submit, wait_for, wait_run

PER_USER = {"identity_provider_class": "identity.HeaderIdentityProvider"}


async def page_stream(api, runs, headers=None, stop_after=None):
    """(status, frames) of a streams request; ``runs`` is [(run_id, cursor)]."""
    param = ",".join(f"{run_id}:{cursor}" for run_id, cursor in runs)
    frames = []
    async with api.stream(
        "GET",
        "streams",
        params={"runs": param},
        headers={"Accept": "text/event-stream", **(headers or {})},
    ) as response:
        if response.status_code != 200:
            await response.aread()
            return response, frames
        async for frame in parse_sse(response.aiter_lines()):
            frames.append(frame)
            if stop_after is not None and sum(1 for f in frames if "event" in f) >= stop_after:
                break
    return response, frames


def per_run(frames):
    seqs = {}
    for frame in frames:
        if frame.get("event") and frame["event"] not in ("error", "snapshot"):
            seqs.setdefault(frame["data"]["run_id"], []).append(frame["data"]["seq"])
    return seqs


async def test_every_runs_events_arrive_exactly_once_in_order_and_the_stream_ends(api):
    ids = [
        (await submit(api, input=demo_input(chunks=40 + 10 * i, delay=0.002))).json()["run_id"]
        for i in range(5)
    ]
    response, frames = await page_stream(api, [(run_id, 0) for run_id in ids])
    assert response.status_code == 200
    assert all("id" not in frame for frame in frames)
    seqs = per_run(frames)
    for run_id in ids:
        run = await wait_run(api, run_id)
        assert seqs[run_id] == list(range(1, run["last_seq"] + 1))


async def test_each_run_resumes_from_its_own_cursor(api):
    ids = [(await submit(api, input=demo_input(chunks=10))).json()["run_id"] for _ in range(3)]
    runs = [await wait_run(api, run_id) for run_id in ids]
    cursors = [0, 5, runs[2]["last_seq"] - 1]
    _, frames = await page_stream(api, list(zip(ids, cursors, strict=True)))
    seqs = per_run(frames)
    for run, cursor in zip(runs, cursors, strict=True):
        assert seqs[run["run_id"]] == list(range(cursor + 1, run["last_seq"] + 1))


async def test_a_reconnect_with_advanced_cursors_misses_and_repeats_nothing(api):
    ids = [
        (await submit(api, input=demo_input(chunks=100, delay=0.003))).json()["run_id"]
        for _ in range(3)
    ]
    cursors = {run_id: 0 for run_id in ids}
    received = {run_id: [] for run_id in ids}
    for _ in range(100):
        live = [(run_id, cursor) for run_id, cursor in cursors.items()]
        response, frames = await page_stream(api, live, stop_after=25)
        if response.status_code == 204:
            break
        for run_id, seqs in per_run(frames).items():
            received[run_id] += seqs
            cursors[run_id] = seqs[-1]
    for run_id in ids:
        run = await wait_run(api, run_id)
        assert received[run_id] == list(range(1, run["last_seq"] + 1))


@pytest.mark.parametrize("server_config", [PER_USER])
async def test_unknown_or_foreign_runs_get_an_error_frame_and_the_others_go_on(api):
    alice = {"X-Test-User": "alice"}
    mine = (await submit(api, headers=alice, input=demo_input(chunks=10))).json()["run_id"]
    theirs = (
        await submit(api, headers={"X-Test-User": "bob"}, input=demo_input(chunks=10))
    ).json()["run_id"]
    response, frames = await page_stream(
        api, [(mine, 0), (theirs, 0), ("run_nope", 0), (mine + "x", "x")], headers=alice
    )
    errors = {
        f["data"]["run_id"]: f["data"]["error"]["error"]
        for f in frames
        if f.get("event") == "error"
    }
    assert errors == {
        theirs: "run_not_found",
        "run_nope": "run_not_found",
        mine + "x": "invalid_cursor",
    }
    run = await wait_run(api, mine, headers=alice)
    assert per_run(frames) == {mine: list(range(1, run["last_seq"] + 1))}


async def test_a_cursor_ahead_gets_an_error_frame(api):
    run_id = (await submit(api, input=demo_input(chunks=3))).json()["run_id"]
    run = await wait_run(api, run_id)
    _, frames = await page_stream(api, [(run_id, run["last_seq"] + 5)])
    assert [f["data"]["error"]["error"] for f in frames if f.get("event") == "error"] == [
        "cursor_ahead"
    ]


async def test_when_every_run_is_already_caught_up_the_answer_is_204(api):
    run_id = (await submit(api, input=demo_input(chunks=3))).json()["run_id"]
    run = await wait_run(api, run_id)
    response, _ = await page_stream(api, [(run_id, run["last_seq"])])
    assert response.status_code == 204


@pytest.mark.parametrize(
    "runs", ["", "run_a", "run_a:1,run_a:2", ",".join(f"run_{i}:0" for i in range(51)), ":3"]
)
async def test_a_malformed_run_list_is_400(api, runs):
    response = await api.get(
        "streams", params={"runs": runs}, headers={"Accept": "text/event-stream"}
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"


async def test_a_quiet_page_stream_sends_heartbeats(api):
    run_id = (await submit(api, input=demo_input(chunks=2, delay=1.2, tools=False))).json()[
        "run_id"
    ]
    _, frames = await page_stream(api, [(run_id, 0)])
    assert any(f.get("comment") == "ping" for f in frames)


@pytest.mark.parametrize("agentruns_config", [{"max_streams_per_user": 2}])
async def test_open_streams_are_limited_per_owner(api, engine):
    run_id = (await submit(api, input=demo_input(chunks=50, delay=0.05))).json()["run_id"]
    tasks = [asyncio.ensure_future(page_stream(api, [(run_id, 0)])) for _ in range(2)]
    await wait_for(lambda: engine.open_streams["~shared"] == 2, what="two open streams")
    response = await api.get(
        "streams", params={"runs": f"{run_id}:0"}, headers={"Accept": "text/event-stream"}
    )
    assert response.status_code == 429
    assert response.json()["error"] == "too_many_streams"
    per_run_response = await api.get(
        f"runs/{run_id}/events", headers={"Accept": "text/event-stream"}
    )
    assert per_run_response.status_code == 429
    await api.post(f"runs/{run_id}/cancel")
    for task in tasks:
        response, _ = await task
        assert response.status_code == 200
