"""Reading, listing and deleting runs; the JSON error shape everywhere."""

import asyncio
import json
import threading

import httpx
import pytest

from jupyter_agentruns.engine import reads as engine_module
from jupyter_agentruns.reducer import reduce

import agents_for_tests
from agents_for_tests import TEST_AGENTS
from conftest import LoopTurns, all_events, demo_input, submit, wait_for, wait_run, wait_seq


async def finished(api, **input):
    response = await submit(api, input=demo_input(**{"chunks": 3, **input}))
    return await wait_run(api, response.json()["run_id"])


async def test_get_run_is_the_authoritative_state(api):
    run = await finished(api)
    assert run["status"] == "succeeded"
    assert run["output"]["text"] == run["snapshot"]["messages"][0]["text"]
    assert run["error"] is None and run["cancel"] is None
    assert run["started_at"] and run["finished_at"] and run["created_at"]
    assert run["first_seq"] == 1


async def test_unknown_run_is_404_run_not_found(api):
    response = await api.get("runs/run_nope")
    assert response.status_code == 404
    assert response.json()["error"] == "run_not_found"


async def test_list_is_newest_first_and_paginates(api):
    ids = [
        (await submit(api, input=demo_input(chunks=1, tools=False))).json()["run_id"]
        for _ in range(5)
    ]
    for run_id in ids:
        await wait_run(api, run_id)
    page = (await api.get("runs", params={"limit": 2})).json()
    seen = [r["run_id"] for r in page["runs"]]
    while page["next"]:
        page = (await api.get("runs", params={"limit": 2, "before": page["next"]})).json()
        seen += [r["run_id"] for r in page["runs"]]
    assert seen == ids[::-1]


async def test_list_filters_by_status_and_session(api):
    a = await submit(api, input=demo_input(chunks=1), session="a.ipynb")
    b = await submit(api, input=demo_input(chunks=1, fail=True), session="b.ipynb")
    await wait_run(api, a.json()["run_id"])
    await wait_run(api, b.json()["run_id"])
    runs = (await api.get("runs", params={"session": "a.ipynb"})).json()["runs"]
    assert [r["run_id"] for r in runs] == [a.json()["run_id"]]
    runs = (await api.get("runs", params={"status": "failed"})).json()["runs"]
    assert [r["run_id"] for r in runs] == [b.json()["run_id"]]


async def test_search_finds_runs_by_title_agent_or_notebook_in_any_case_and_pages(api):
    made = {}
    for name, input, body in [
        ("weather", demo_input(prompt="Weather in Shanghai\nand more", chunks=1), {}),
        ("titled", demo_input(prompt="x", chunks=1), {"metadata": {"title": "Café 100%_done"}}),
        ("notebook", demo_input(prompt="y", chunks=1), {"session": "work/Report.ipynb"}),
        ("input only", demo_input(prompt="z", chunks=1, tools=False), {}),
    ]:
        made[name] = (await submit(api, input=input, **body)).json()["run_id"]
    for run_id in made.values():
        await wait_run(api, run_id)

    async def found(q, **params):
        runs = (await api.get("runs", params={"q": q, **params})).json()["runs"]
        return [run["run_id"] for run in runs]

    assert await found("WEATHER") == [made["weather"]]
    assert await found("100%_") == [made["titled"]]  # LIKE's wildcards are text here
    assert await found("CAFÉ") == [made["titled"]]  # beyond ASCII too
    assert await found("report") == [made["notebook"]]
    # The agent's name matches every run; a later page goes on from the cursor.
    page = (await api.get("runs", params={"q": "dem", "limit": 3})).json()
    rest = (await api.get("runs", params={"q": "dem", "before": page["next"]})).json()
    assert [r["run_id"] for r in page["runs"] + rest["runs"]] == list(made.values())[::-1]
    # Only the title, agent and notebook: a word deeper in the input is not a match.
    assert await found("and more") == [] and await found("chunks") == []
    assert (await api.get("runs", params={"q": "x" * 201})).status_code == 400


@pytest.mark.parametrize(
    "params", [{"limit": 0}, {"limit": 501}, {"limit": "ten"}, {"before": "x"}, {"status": "done"}]
)
async def test_list_rejects_bad_parameters(api, params):
    response = await api.get("runs", params=params)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"


async def test_delete_an_active_run_is_409_and_a_finished_one_204(api):
    slow = await submit(api, input=demo_input(delay=0.05, chunks=100))
    run_id = slow.json()["run_id"]
    response = await api.delete(f"runs/{run_id}")
    assert response.status_code == 409 and response.json()["error"] == "run_active"
    await api.post(f"runs/{run_id}/cancel")
    await wait_run(api, run_id)
    response = await api.delete(f"runs/{run_id}")
    assert response.status_code == 204
    assert (await api.get(f"runs/{run_id}")).status_code == 404
    assert (await api.get(f"runs/{run_id}/events")).status_code == 404


async def test_deleting_a_run_frees_its_idempotency_key(api):
    first = await submit(api, key="k", input=demo_input(chunks=1))
    await wait_run(api, first.json()["run_id"])
    await api.delete(f"runs/{first.json()['run_id']}")
    again = await submit(api, key="k", input=demo_input(chunks=1))
    assert again.status_code == 201 and again.json()["run_id"] != first.json()["run_id"]


async def test_an_unknown_endpoint_is_a_json_404(api):
    response = await api.get("nothing/here")
    assert response.status_code == 404
    assert set(response.json()) >= {"error", "message"}


async def test_a_wrong_method_is_a_json_405(api):
    response = await api.put("runs")
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"


async def test_unauthenticated_requests_are_a_json_403(api_url):
    async with httpx.AsyncClient(base_url=api_url) as anonymous:
        for method, path in (
            ("GET", "agents"),
            ("GET", "runs"),
            ("POST", "runs"),
            ("GET", "nothing"),
        ):
            response = await anonymous.request(method, path)
            assert response.status_code == 403, (method, path)
            assert response.json()["error"] == "forbidden"
            assert response.json()["message"]


async def test_a_cookie_authenticated_post_without_xsrf_is_a_json_403(api, api_url, token):
    # Log in through the API once to get the cookies a browser would have.
    response = await api.get("agents")
    cookies = response.cookies
    async with httpx.AsyncClient(base_url=api_url, cookies=cookies) as browser:
        assert (await browser.get("agents")).status_code == 200
        response = await browser.post("runs", json={"agent": "demo", "input": demo_input()})
        assert response.status_code == 403
        assert set(response.json()) == {"error", "message"}


@pytest.mark.parametrize("agentruns_config", [{"max_body_bytes": 1000}])
async def test_a_delete_body_over_max_body_bytes_is_413_and_deletes_nothing(api):
    run = await finished(api)

    async def chunked():
        for _ in range(80):
            yield b"x" * 65536

    for content in (b"x" * 50_000, chunked()):
        response = await api.request("DELETE", f"runs/{run['run_id']}", content=content)
        assert response.status_code == 413 and response.json()["error"] == "request_too_large"
    assert (await api.get(f"runs/{run['run_id']}")).status_code == 200


async def test_runs_of_a_notebook_are_listed_by_its_path_under_the_root(api, jp_root_dir):
    session = str(jp_root_dir / "work" / "analysis.ipynb")
    (jp_root_dir / "work").mkdir()
    mine = await submit(
        api, input=demo_input(chunks=1), session=session, metadata={"cell_id": "c1"}
    )
    await submit(api, input=demo_input(chunks=1), session=str(jp_root_dir / "other.ipynb"))
    listed = (await api.get("runs", params={"notebook": "work/analysis.ipynb"})).json()["runs"]
    assert [r["run_id"] for r in listed] == [mine.json()["run_id"]]
    assert listed[0]["metadata"] == {"cell_id": "c1"}
    assert listed[0]["session"] == mine.json()["session"] == "work/analysis.ipynb"
    for bad in ({"notebook": "../etc/x.ipynb"}, {"notebook": "a.ipynb", "session": "s"}):
        response = await api.get("runs", params=bad)
        assert response.status_code == 400 and response.json()["error"] == "invalid_request"


async def test_the_retries_of_a_run_are_listed_newest_first(api):
    first = await finished(api)
    retries = [
        (await submit(api, input=demo_input(chunks=1), retry_of=first["run_id"])).json()["run_id"]
        for _ in range(2)
    ]
    listed = (await api.get("runs", params={"retry_of": first["run_id"]})).json()["runs"]
    assert [r["run_id"] for r in listed] == retries[::-1]


async def test_a_page_of_runs_ends_early_once_it_holds_enough_text(api, monkeypatch):
    from jupyter_agentruns.engine import reads

    ids = []
    for _ in range(5):
        response = await submit(api, input=demo_input(chunks=200, tools=False))
        ids.append((await wait_run(api, response.json()["run_id"]))["run_id"])
    monkeypatch.setattr(reads, "LIST_PAGE_BYTES", 1500)  # about two of these runs' texts
    seen, pages, before = [], 0, None
    while True:
        params = {"limit": 50, **({"before": before} if before else {})}
        page = (await api.get("runs", params=params)).json()
        assert 1 <= len(page["runs"]) < 5
        seen += [run["run_id"] for run in page["runs"]]
        pages += 1
        if page["next"] is None:
            break
        before = page["next"]
    assert seen == ids[::-1] and pages >= 2


async def test_a_page_of_runs_is_bounded_by_its_whole_size_not_only_its_text(api, monkeypatch):
    """Runs with big metadata and no text made a page of 500 runs 74 MB."""
    from jupyter_agentruns.engine import reads

    ids = []
    for index in range(6):
        metadata = {"notes": f"{index}" * 300_000}
        response = await submit(api, input=demo_input(chunks=1, tools=False), metadata=metadata)
        ids.append((await wait_run(api, response.json()["run_id"]))["run_id"])
    monkeypatch.setattr(reads, "LIST_PAGE_BYTES", 1_000_000)  # three of these runs at most
    seen, before = [], None
    while True:
        params = {"limit": 500, **({"before": before} if before else {})}
        response = await api.get("runs", params=params)
        assert len(response.content) <= 1_000_000
        page = response.json()
        assert 1 <= len(page["runs"]) <= 3
        seen += [run["run_id"] for run in page["runs"]]
        if page["next"] is None:
            break
        before = page["next"]
    assert seen == ids[::-1]


@pytest.mark.parametrize("agentruns_config", [{"max_stored_runs_per_user": 3}])
async def test_at_max_stored_runs_per_user_a_new_run_is_refused_until_one_is_deleted(api):
    kept = [(await submit(api, key=f"k{index}")).json() for index in range(3)]
    for run in kept:
        await wait_run(api, run["run_id"])
    refused = await submit(api, key="k3")
    assert refused.status_code == 429
    assert refused.json()["error"] == "storage_quota_exceeded"
    assert "3 stored runs" in refused.json()["message"]
    assert len((await api.get("runs")).json()["runs"]) == 3  # nothing stored
    # A replay of a key is no new run: it is answered as ever.
    replay = await submit(api, key="k0")
    assert replay.status_code == 200 and replay.json()["run_id"] == kept[0]["run_id"]
    assert (await api.delete(f"runs/{kept[0]['run_id']}")).status_code == 204
    assert (await submit(api, key="k3")).status_code == 201


async def test_a_run_object_once_made_never_changes_under_later_reads(api, engine):
    """Answers share no lists with the cached snapshot builder that later reads go on with."""
    from jupyter_agentruns.settings import SHARED_OWNER

    run_id = (await submit(api, input=demo_input(chunks=300, delay=0.005))).json()["run_id"]
    await wait_seq(api, run_id, 20)
    first = await engine.get_run(SHARED_OWNER, run_id)
    frozen = json.dumps(first)
    await wait_seq(api, run_id, first["last_seq"] + 30)
    later = await engine.get_run(SHARED_OWNER, run_id)
    assert later["last_seq"] > first["last_seq"]
    assert json.dumps(first) == frozen


def small_parts(monkeypatch):
    from jupyter_agentruns.store import sql

    monkeypatch.setattr(sql, "SNAPSHOT_PART_CHARS", 300)


async def test_a_snapshot_in_many_parts_is_answered_whole_a_part_at_a_time(api, monkeypatch):
    small_parts(monkeypatch)  # a part per few deltas
    run = await finished(api, chunks=200)
    events = [event for event in await all_events(api, run["run_id"])]
    assert run["snapshot"] == reduce(events)
    assert run["snapshot"]["messages"][0]["text"] == run["output"]["text"]
    markdown = await api.get(f"runs/{run['run_id']}", headers={"Accept": "text/markdown"})
    assert markdown.status_code == 200 and run["output"]["text"][:40] in markdown.text


async def test_a_big_answer_goes_out_a_slice_per_turn_of_the_loop(api, monkeypatch):
    """Other streams are served between the slices, even when the socket takes each at once."""
    from jupyter_agentruns.handlers import runs

    small_parts(monkeypatch)
    run = await finished(api, chunks=200)
    monkeypatch.setattr(runs, "SEND_BYTES", 100)
    sends = []
    flush = runs.RunHandler.flush
    async with LoopTurns() as turns:

        def counted_flush(handler, *args, **kwargs):
            sends.append((turns.count, sum(map(len, handler._write_buffer))))
            return flush(handler, *args, **kwargs)

        monkeypatch.setattr(runs.RunHandler, "flush", counted_flush)
        response = await api.get(f"runs/{run['run_id']}")
    assert response.json() == run
    assert len(sends) >= len(response.content) / 100  # a slice per flush, not a part
    assert all(size <= 100 for _, size in sends)
    turns_at = [turn for turn, _ in sends[:-1]]  # the last slice goes out with finish()
    assert turns_at == sorted(set(turns_at))  # the loop turned between any two


async def test_a_run_deleted_while_its_answer_is_sent_cuts_the_answer(api, engine, monkeypatch):
    from jupyter_agentruns.engine import SnapshotReplaced
    from jupyter_agentruns.settings import SHARED_OWNER

    small_parts(monkeypatch)
    run = await finished(api, chunks=200)
    pieces = await engine.run_answer(SHARED_OWNER, run["run_id"])
    assert (await anext(pieces)).startswith(b"{")
    await engine.delete(SHARED_OWNER, run["run_id"])
    with pytest.raises(SnapshotReplaced):
        async for _ in pieces:
            pass


async def test_a_run_deleted_before_any_of_its_answer_went_out_is_not_found(
    api, engine, monkeypatch
):
    """Its snapshot went away between the run's head and its first part: read again, a 404."""
    small_parts(monkeypatch)
    run = await finished(api, chunks=200)
    answer = engine.run_answer

    async def deleted_after_the_head(owner, run_id, **options):
        pieces = await answer(owner, run_id, **options)

        async def then_deleted():
            yield await anext(pieces)
            await engine.delete(owner, run_id)
            async for piece in pieces:
                yield piece

        return then_deleted()

    monkeypatch.setattr(engine, "run_answer", deleted_after_the_head)
    response = await api.get(f"runs/{run['run_id']}")
    assert response.status_code == 404, response.text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_reads_of_a_live_run_overtaking_each_other_leave_it_cached_for_the_next_read(
    api, engine, monkeypatch
):
    """Two readers each bring the run's snapshot up to date and leave it for the next read.

    The one that finishes last replaces the other's: what the replaced one
    held must leave the snapshot cache's count of bytes too. Counted twice,
    the count grew until the cache evicted every snapshot as soon as it was
    put, and each read of a live run read all its events again.
    """
    monkeypatch.setattr(engine_module, "SNAPSHOT_CACHE_BYTES", 4096)
    rounds = 10
    run_id = (
        await submit(api, agent="paced_writer", input={"batches": [30] + [1] * (rounds + 1)})
    ).json()["run_id"]
    gate = agents_for_tests.gates.setdefault(run_id, asyncio.Event())
    channel = engine.broadcaster.get(run_id)
    probe = engine.store.connect()
    connection_class = type(probe)
    probe.close()
    read_events = connection_class.read_events
    hold, held, release = threading.Event(), threading.Event(), threading.Event()
    reads_after: list[int] = []  # where each read of events up to a last_seq began

    def read_events_held(conn, run, after, limit, upto=None, max_bytes=None):
        if upto is not None:
            reads_after.append(after)
            if hold.is_set():
                hold.clear()
                held.set()
                release.wait(10)
        return read_events(conn, run, after, limit, upto, max_bytes)

    async def next_word(seq: int) -> None:
        gate.set()
        await wait_for(lambda: channel.committed_seq == seq, what=f"seq {seq}")

    def text(seq: int) -> str:
        # run.started, message.started, then word i at seq i + 3
        return "".join(f"{index} " for index in range(seq - 2))

    monkeypatch.setattr(connection_class, "read_events", read_events_held)
    await wait_for(lambda: channel.committed_seq == 32, what="the first words")
    for seq in range(32, 32 + rounds):
        if seq > 32:
            await next_word(seq)
        hold.set()
        held.clear()
        release.clear()
        first = asyncio.ensure_future(api.get(f"runs/{run_id}"))
        await wait_for(held.is_set, what="the first read, under way")
        # The other reader thread answers meanwhile; then the first one ends.
        second = await api.get(f"runs/{run_id}")
        release.set()
        for response in (await first, second):
            assert response.status_code == 200, response.text
            run = response.json()
            assert run["last_seq"] == seq and run["snapshot"]["messages"][0]["text"] == text(seq)
    # A read on its own now takes up where the last one left the run's snapshot.
    seq = 32 + rounds
    await next_word(seq)
    reads_after.clear()
    run = (await api.get(f"runs/{run_id}")).json()
    assert run["last_seq"] == seq and run["snapshot"]["messages"][0]["text"] == text(seq)
    assert reads_after == [seq - 1]
    await next_word(seq + 1)
    gate.set()
    await wait_run(api, run_id)
