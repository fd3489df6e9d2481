"""Session policies: parallel, reject (409 session_busy), enqueue and interrupt, on a real server."""

import asyncio
import json

import pytest

from conftest import all_events, demo_input, submit, wait_run, wait_seq

SLOW = demo_input(prompt="slow", chunks=400, delay=0.02)
QUICK = demo_input(prompt="quick", chunks=5, tools=False)


async def status(api, run_id):
    return (await api.get(f"runs/{run_id}")).json()["status"]


async def test_runs_of_a_session_run_side_by_side_by_default(api):
    first = (await submit(api, input=SLOW, session="nb.ipynb")).json()
    second = await submit(api, input=SLOW, session="nb.ipynb")
    assert second.status_code == 201
    second = second.json()
    assert second["queued_behind"] is None
    await wait_seq(api, first["run_id"], 3)
    await wait_seq(api, second["run_id"], 3)
    assert {await status(api, first["run_id"]), await status(api, second["run_id"])} == {"running"}
    for run in (first, second):
        await api.post(f"runs/{run['run_id']}/cancel")


async def test_reject_answers_409_with_the_active_run_and_stores_nothing(api):
    first = (await submit(api, input=SLOW, session="chat", key="first")).json()
    busy = await submit(api, input=QUICK, session="chat", session_policy="reject", key="second")
    assert busy.status_code == 409
    assert busy.json()["error"] == "session_busy"
    assert busy.json()["active_run_id"] == first["run_id"]
    assert first["run_id"] in busy.json()["message"]
    # Nothing was stored: the session has one run, and the refused key is free again.
    listed = (await api.get("runs", params={"session": "chat"})).json()["runs"]
    assert [run["run_id"] for run in listed] == [first["run_id"]]
    # A replay of an existing key is still 200, busy or not.
    replay = await submit(api, input=SLOW, session="chat", session_policy="reject", key="first")
    assert replay.status_code == 200 and replay.json()["run_id"] == first["run_id"]
    # Another session, or no session at all, is not busy.
    assert (
        await submit(api, input=QUICK, session="other", session_policy="reject")
    ).status_code == 201
    assert (await submit(api, input=QUICK, session_policy="reject")).status_code == 201
    await api.post(f"runs/{first['run_id']}/cancel")
    await wait_run(api, first["run_id"])
    again = await submit(api, input=QUICK, session="chat", session_policy="reject", key="second")
    assert again.status_code == 201
    assert (await wait_run(api, again.json()["run_id"]))["status"] == "succeeded"


async def test_fifty_racing_reject_submits_create_exactly_one_run(api):
    responses = await asyncio.gather(
        *(
            submit(api, input=SLOW, session="race", session_policy="reject", key=f"k{i}")
            for i in range(50)
        )
    )
    created = [r for r in responses if r.status_code == 201]
    busy = [r for r in responses if r.status_code == 409]
    assert len(created) == 1 and len(busy) == 49, [r.status_code for r in responses]
    run_id = created[0].json()["run_id"]
    assert {r.json()["active_run_id"] for r in busy} == {run_id}
    assert len((await api.get("runs", params={"session": "race"})).json()["runs"]) == 1
    await api.post(f"runs/{run_id}/cancel")


async def test_the_session_of_another_user_is_not_busy(jp_serverapp, api):
    # Sessions are the owner's: here, the same session name under another owner.
    engine = jp_serverapp.web_app.settings["agentruns_engine"]
    from jupyter_agentruns.engine import SubmitRequest

    theirs, _ = await engine.submit(
        "someone-else", SubmitRequest(agent="demo", input=SLOW, session="shared-name"), None
    )
    mine = await submit(api, input=QUICK, session="shared-name", session_policy="reject")
    assert mine.status_code == 201
    await engine.cancel("someone-else", theirs["run_id"], None)


async def test_enqueued_runs_start_in_submit_order_after_the_earlier_ones_end(api):
    first = (await submit(api, input=demo_input(chunks=40, delay=0.02), session="q")).json()
    second = (await submit(api, input=QUICK, session="q", session_policy="enqueue")).json()
    third = (await submit(api, input=QUICK, session="q", session_policy="enqueue")).json()
    assert second["status"] == "queued" and third["status"] == "queued"
    assert second["queued_behind"] == first["run_id"]
    assert third["queued_behind"] == first["run_id"]
    assert (await api.get(f"runs/{second['run_id']}")).json()["queued_behind"] == first["run_id"]
    runs = [await wait_run(api, run["run_id"]) for run in (first, second, third)]
    assert [run["status"] for run in runs] == ["succeeded"] * 3
    # Each started only once the one before it had finished.
    assert runs[0]["finished_at"] <= runs[1]["started_at"]
    assert runs[1]["finished_at"] <= runs[2]["started_at"]
    assert all(run["queued_behind"] is None for run in runs)
    # Its log is an ordinary run's: started, then the rest.
    events = await all_events(api, second["run_id"])
    assert events[0]["type"] == "run.started" and events[-1]["type"] == "run.succeeded"


async def test_enqueue_into_an_idle_session_starts_at_once(api):
    run = await submit(api, input=QUICK, session="idle", session_policy="enqueue")
    assert run.status_code == 201 and run.json()["queued_behind"] is None
    assert (await wait_run(api, run.json()["run_id"]))["status"] == "succeeded"


async def test_an_enqueued_run_cancelled_while_queued_ends_at_once_and_the_queue_goes_on(api):
    first = (await submit(api, input=demo_input(chunks=40, delay=0.02), session="qc")).json()
    second = (await submit(api, input=QUICK, session="qc", session_policy="enqueue")).json()
    third = (await submit(api, input=QUICK, session="qc", session_policy="enqueue")).json()
    response = await api.post(f"runs/{second['run_id']}/cancel", json={"reason": "not needed"})
    assert response.status_code == 202
    cancelled = response.json()
    assert cancelled["status"] == "cancelled"
    assert cancelled["cancel"]["reason"] == "not needed"
    assert cancelled["cancel"]["stage"] == {"seq": 0, "step": "not started"}
    events = await all_events(api, second["run_id"])
    assert [e["type"] for e in events] == ["run.cancelled"]
    assert (await api.post(f"runs/{second['run_id']}/cancel")).status_code == 200
    # The third now waits only for the first.
    assert (await api.get(f"runs/{third['run_id']}")).json()["queued_behind"] == first["run_id"]
    done = await wait_run(api, third["run_id"])
    assert done["status"] == "succeeded"
    assert (await wait_run(api, first["run_id"]))["finished_at"] <= done["started_at"]


async def test_interrupt_cancels_the_session_s_runs_then_starts(api):
    first = (await submit(api, input=SLOW, session="i")).json()
    queued = (await submit(api, input=QUICK, session="i", session_policy="enqueue")).json()
    await wait_seq(api, first["run_id"], 3)
    response = await submit(api, input=QUICK, session="i", session_policy="interrupt")
    assert response.status_code == 201
    newest = response.json()
    reason = {"interrupted_by": newest["run_id"]}
    runs = [await wait_run(api, run["run_id"]) for run in (first, queued, newest)]
    assert [run["status"] for run in runs] == ["cancelled", "cancelled", "succeeded"]
    assert runs[0]["cancel"]["reason"] == reason and runs[1]["cancel"]["reason"] == reason
    assert runs[0]["finished_at"] <= runs[2]["started_at"]
    events = await all_events(api, first["run_id"])
    types = [e["type"] for e in events]
    # Between the request and the end, only the steps it cut short, ended with it.
    requested = types.index("run.cancel_requested")
    assert types[-1] == "run.cancelled" and set(types[requested + 1 : -1]) <= {"tool.completed"}
    assert events[requested]["data"] == {"reason": reason}
    # The queued run never started.
    assert [e["type"] for e in await all_events(api, queued["run_id"])] == ["run.cancelled"]


@pytest.mark.parametrize("agentruns_config", [{"default_session_policy": "reject"}])
async def test_the_server_default_policy_applies_when_a_submit_names_none(api):
    first = (await submit(api, input=SLOW, session="d")).json()
    busy = await submit(api, input=QUICK, session="d")
    assert busy.status_code == 409 and busy.json()["active_run_id"] == first["run_id"]
    # A submit may still ask for another policy.
    assert (
        await submit(api, input=QUICK, session="d", session_policy="parallel")
    ).status_code == 201
    await api.post(f"runs/{first['run_id']}/cancel")


async def test_an_unknown_policy_is_400_and_a_policy_does_not_change_the_fingerprint(api):
    bad = await submit(api, input=QUICK, session="f", session_policy="sometimes", key="f1")
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_request"
    assert "session_policy" in bad.json()["message"]
    wrong_type = await submit(api, input=QUICK, session="f", session_policy=3)
    assert wrong_type.status_code == 400
    assert (await api.get("runs", params={"session": "f"})).json()["runs"] == []
    created = await submit(api, input=QUICK, session="f", session_policy="enqueue", key="f1")
    replay = await submit(api, input=QUICK, session="f", session_policy="reject", key="f1")
    assert replay.status_code == 200 and replay.json()["run_id"] == created.json()["run_id"]


@pytest.mark.parametrize("agentruns_config", [{"max_active_runs_per_user": 2}])
async def test_queued_runs_count_against_the_active_run_limit(api):
    first = (await submit(api, input=SLOW, session="l")).json()
    await submit(api, input=QUICK, session="l", session_policy="enqueue")
    over = await submit(api, input=QUICK, session="l", session_policy="enqueue")
    assert over.status_code == 429 and over.json()["error"] == "too_many_active_runs"
    await api.post(f"runs/{first['run_id']}/cancel")


async def test_a_queued_run_is_answered_as_json_that_browsers_parse(api):
    first = (await submit(api, input=SLOW, session="j")).json()
    queued = await submit(api, input=QUICK, session="j", session_policy="enqueue")
    json.loads(queued.text)
    listed = (await api.get("runs", params={"session": "j"})).json()["runs"]
    assert [run["queued_behind"] for run in listed] == [first["run_id"], None]
    await api.post(f"runs/{first['run_id']}/cancel")
    assert (await wait_run(api, queued.json()["run_id"]))["status"] == "succeeded"


@pytest.mark.parametrize("agentruns_config", [{"lease_seconds": 1}])
async def test_a_run_claimed_as_its_server_stops_goes_back_to_its_queue(
    api, engine, jp_serverapp, monkeypatch
):
    from jupyter_agentruns.engine import Engine
    from jupyter_agentruns.engine.queues import Queues

    async def leave_the_queue_alone(queues) -> int:
        return 0

    app = jp_serverapp.extension_manager.extension_points["jupyter_agentruns"].app
    first = (await submit(api, input=SLOW, session="stop")).json()
    queued = (await submit(api, input=QUICK, session="stop", session_policy="enqueue")).json()
    # Both servers leave the queue alone, for now: the test claims, below.
    monkeypatch.setattr(Queues, "dispatch", leave_the_queue_alone)
    if engine.queues.pending:
        await asyncio.wait(engine.queues.pending)
    await api.post(f"runs/{first['run_id']}/cancel")
    await wait_run(api, first["run_id"])
    other = Engine(
        parent=app, settings=engine.settings, store=app.open_store(), agents=engine.agents
    )
    await other.start()
    ready = await other.reader.run(lambda conn: conn.startable_queued_runs(None, ["demo"]))
    assert [row["run_id"] for row in ready] == [queued["run_id"]]
    claiming = asyncio.ensure_future(other.queues.claim_and_start(ready))
    await asyncio.sleep(0)  # the claim is in the other server's writer queue
    await other.stop()
    assert await claiming == 0
    row = await engine.reader.run(lambda conn: conn.get_run(queued["run_id"]))
    assert (row["status"], row["executor_id"]) == ("queued", None)
    monkeypatch.undo()  # this server's upkeep starts it now
    assert (await wait_run(api, queued["run_id"], timeout=20))["status"] == "succeeded"
