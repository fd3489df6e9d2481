"""POST runs/{id}/cancel, and that nothing else ever cancels a run."""

import asyncio

import pytest

from jupyter_agentruns.record import run_markdown

import agents_for_tests
from agents_for_tests import TEST_AGENTS
from conftest import all_events, demo_input, sse_frames, submit, wait_for, wait_run, wait_seq

SLOW = demo_input(delay=0.05, chunks=200)


async def test_cancel_is_202_then_the_run_ends_cancelled_with_reason_and_stage(api):
    run_id = (await submit(api, input=SLOW)).json()["run_id"]
    await wait_seq(api, run_id, 10)
    response = await api.post(f"runs/{run_id}/cancel", json={"reason": "changed my mind"})
    assert response.status_code == 202
    assert response.json()["status"] in ("cancelling", "cancelled")
    run = await wait_run(api, run_id)
    assert run["status"] == "cancelled"
    events = await all_events(api, run_id)
    types = [e["type"] for e in events]
    assert types[-1] == "run.cancelled"
    requested = types.index("run.cancel_requested")
    assert events[requested]["data"] == {"reason": "changed my mind"}
    stage = events[-1]["data"]["stage"]
    assert events[-1]["data"]["reason"] == "changed my mind"
    assert stage["seq"] == events[requested]["seq"] - 1
    assert stage["step"].startswith(("message m1", "tool ", "progress"))
    assert run["cancel"]["reason"] == "changed my mind"
    assert run["cancel"]["stage"] == stage
    assert run["cancel"]["requested_at"]


async def test_a_repeated_cancel_is_200_and_changes_nothing(api):
    run_id = (await submit(api, input=SLOW)).json()["run_id"]
    assert (await api.post(f"runs/{run_id}/cancel")).status_code == 202
    second = await api.post(f"runs/{run_id}/cancel", json={"reason": "again"})
    assert second.status_code == 200
    run = await wait_run(api, run_id)
    third = await api.post(f"runs/{run_id}/cancel")
    assert third.status_code == 200 and third.json()["status"] == "cancelled"
    events = await all_events(api, run_id)
    assert [e["type"] for e in events].count("run.cancel_requested") == 1
    assert run["cancel"]["reason"] is None


async def test_cancelling_a_finished_run_is_200_and_it_stays_succeeded(api):
    run_id = (await submit(api, input=demo_input(chunks=2))).json()["run_id"]
    await wait_run(api, run_id)
    response = await api.post(f"runs/{run_id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "succeeded"
    assert response.json()["cancel"] is None


async def test_a_run_cancelled_while_queued_ends_cancelled_at_once(api, engine):
    from jupyter_agentruns.engine import SubmitRequest

    # Cancel in the same loop turn as the submit returns: the run's task has not started.
    run, _ = await engine.submit("~shared", SubmitRequest("demo", demo_input()), None)
    started = await engine.executor.cancel(run["run_id"], "too soon")
    assert started
    finished = await wait_run(api, run["run_id"])
    assert finished["status"] == "cancelled"
    types = [e["type"] for e in await all_events(api, run["run_id"])]
    assert types == ["run.cancel_requested", "run.cancelled"]


async def test_closing_a_stream_never_cancels_the_run(api):
    run_id = (await submit(api, input=demo_input(delay=0.01, chunks=50))).json()["run_id"]
    for _ in range(3):
        await sse_frames(api, run_id, limit=2)
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded"


@pytest.mark.parametrize("body", [b"{", b'{"reason": 3}', b'{"why": "x"}', b"[]"])
async def test_a_bad_cancel_body_is_400_and_the_run_goes_on(api, body):
    run_id = (await submit(api, input=demo_input(delay=0.01, chunks=20))).json()["run_id"]
    response = await api.post(f"runs/{run_id}/cancel", content=body)
    assert response.status_code == 400
    assert (await wait_run(api, run_id))["status"] == "succeeded"


async def test_cancelling_an_unknown_run_is_404(api):
    response = await api.post("runs/run_nope/cancel")
    assert response.status_code == 404 and response.json()["error"] == "run_not_found"


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_cancel_runs_the_agents_finally_blocks(api):
    run_id = (await submit(api, agent="sleeper", input={})).json()["run_id"]
    await wait_seq(api, run_id, 2)  # run.started, tool.started
    await api.post(f"runs/{run_id}/cancel")
    run = await wait_run(api, run_id)
    assert run["status"] == "cancelled"
    assert run_id in agents_for_tests.finally_ran
    assert run["cancel"]["stage"]["step"] == "tool wait running"


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_a_step_running_when_its_run_is_cancelled_ends_cancelled_in_the_log_and_the_record(
    api,
):
    run_id = (await submit(api, agent="sleeper", input={})).json()["run_id"]
    await wait_seq(api, run_id, 2)  # run.started, tool.started
    await api.post(f"runs/{run_id}/cancel")
    run = await wait_run(api, run_id)
    assert run["status"] == "cancelled"
    events = await all_events(api, run_id)
    assert [e["type"] for e in events][-2:] == ["tool.completed", "run.cancelled"]
    cut = {"type": "cancelled", "message": "the run was cancelled before this step ended"}
    assert events[-2]["data"] == {"call_id": "c1", "ok": False, "error": cut}
    [step] = run["snapshot"]["tools"]
    assert step["status"] == "failed" and step["error"] == cut
    assert "failed: the run was cancelled before this step ended" in run_markdown(run)


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_cancel_stops_a_plain_function_agent_at_its_next_event(api):
    run_id = (await submit(api, agent="counter", input={"n": 1000, "sleep": 0.01})).json()["run_id"]
    await wait_seq(api, run_id, 10)
    await api.post(f"runs/{run_id}/cancel")
    run = await wait_run(api, run_id)
    assert run["status"] == "cancelled"
    # Then nothing more: the thread's next emit raised.
    await asyncio.sleep(0.2)
    emitted = agents_for_tests.thread_emits[run_id]
    await asyncio.sleep(0.2)
    assert agents_for_tests.thread_emits[run_id] == emitted < 1000
    events = await all_events(api, run_id)
    assert [e["seq"] for e in events] == list(range(1, run["last_seq"] + 1))


async def test_cancel_while_the_store_queue_is_full_keeps_the_log_in_order(api, engine):
    from jupyter_agentruns.engine import SubmitRequest

    await engine.start()
    writer = engine.writer
    limit = writer.max_pending_events
    writer.max_pending_events = 0  # the queue is full: emits wait for space
    try:
        run, _ = await engine.submit("~shared", SubmitRequest("demo", demo_input(chunks=5)), None)
        await wait_for(
            lambda: engine.executor._live[run["run_id"]].started, what="the run to wait for space"
        )
        cancel = asyncio.ensure_future(
            api.post(f"runs/{run['run_id']}/cancel", json={"reason": "full"})
        )
        # Nothing can be observed while the queue is full: give the cancel time to wait too.
        await asyncio.sleep(0.2)
    finally:
        writer.max_pending_events = limit  # the next commit (lease upkeep) lets both go
    response = await cancel
    assert response.status_code == 202
    finished = await wait_run(api, run["run_id"])
    assert finished["status"] == "cancelled"
    types = [e["type"] for e in await all_events(api, run["run_id"])]
    assert types[-2:] == ["run.cancel_requested", "run.cancelled"] or types[-1] == "run.cancelled"
    assert "run.started" not in types[types.index("run.cancel_requested") :]
    assert types.count("run.cancel_requested") == 1


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_an_agent_that_ignores_cancellation_still_ends_cancelled(api, monkeypatch):
    from jupyter_agentruns.executor import tasks

    monkeypatch.setattr(tasks, "CANCEL_GRACE_SECONDS", 0.5)
    run_id = (await submit(api, agent="stubborn", input={})).json()["run_id"]
    await wait_seq(api, run_id, 3)  # run.started, message.started, text.delta
    assert (await api.post(f"runs/{run_id}/cancel")).status_code == 202
    run = await wait_run(api, run_id, timeout=10)
    assert run["status"] == "cancelled"


@pytest.mark.parametrize(
    "agentruns_config", [{"agents": TEST_AGENTS, "max_active_runs_per_user": 40}]
)
async def test_cancelled_plain_functions_that_never_return_do_not_starve_new_ones(api):
    blocked = [
        (await submit(api, agent="sleepy", input={"seconds": 60})).json()["run_id"]
        for _ in range(20)
    ]
    for run_id in blocked:
        await api.post(f"runs/{run_id}/cancel")
    for run_id in blocked:
        assert (await wait_run(api, run_id))["status"] == "cancelled"
    fresh = (await submit(api, agent="counter", input={"n": 3})).json()["run_id"]
    assert (await wait_run(api, fresh, timeout=10))["status"] == "succeeded"


@pytest.mark.parametrize("agentruns_config", [{"max_body_bytes": 1000}])
async def test_a_cancel_body_over_max_body_bytes_is_413_and_cancels_nothing(api):
    run_id = (await submit(api, input=SLOW)).json()["run_id"]
    await wait_seq(api, run_id, 1)  # run.started: running
    big = b'{"reason": "' + b"x" * 5_000_000 + b'"}'

    async def chunked():  # no Content-Length: the server reads it all, keeping none of it
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    # With a Content-Length the answer comes before the body is read (and the
    # connection closes): small enough here that the client finishes sending.
    for content in (big[:50_000], chunked()):
        response = await api.post(f"runs/{run_id}/cancel", content=content)
        assert response.status_code == 413 and response.json()["error"] == "request_too_large"
    assert (await api.get(f"runs/{run_id}")).json()["status"] == "running"
    assert (await api.post(f"runs/{run_id}/cancel")).status_code == 202
