"""Asking a person: run.ask, the waiting status, input events and POST runs/{id}/inputs/{request_id}."""

import asyncio
import threading

import pytest

from jupyter_agentruns.engine import Engine

from agents_for_tests import TEST_AGENTS
from conftest import all_events, demo_input, submit, wait_run, waiting

PER_USER = {"identity_provider_class": "identity.HeaderIdentityProvider"}
ASK = demo_input(ask=True, chunks=5)


def open_question(run):
    [question] = [i for i in run["snapshot"]["inputs"] if i["status"] == "open"]
    return question


async def answer(api, run_id, request_id, choice, headers=None, **extra):
    return await api.post(
        f"runs/{run_id}/inputs/{request_id}", json={"choice": choice, **extra}, headers=headers
    )


async def test_an_approved_question_lets_the_run_go_on(api):
    run = (await submit(api, input=ASK)).json()
    run = await waiting(api, run["run_id"])
    question = open_question(run)
    assert question["kind"] == "approval"
    assert question["title"] == "Write the answer about weather in Shanghai?"
    assert question["choices"] == ["approve", "deny"]
    assert question["request_id"].startswith("in_")
    # The waiting run counts as active, and a list can find it.
    listed = (await api.get("runs", params={"status": "waiting"})).json()["runs"]
    assert [r["run_id"] for r in listed] == [run["run_id"]]

    response = await answer(api, run["run_id"], question["request_id"], "approve", note="fine")
    assert response.status_code == 200
    answered = response.json()
    [resolved] = answered["snapshot"]["inputs"]
    assert resolved["status"] == "resolved" and resolved["choice"] == "approve"
    # A token login is an anonymous user with a made-up name: it names no one.
    assert resolved["note"] == "fine" and "by" not in resolved
    done = await wait_run(api, run["run_id"])
    assert done["status"] == "succeeded"
    events = await all_events(api, run["run_id"])
    types = [e["type"] for e in events]
    asked, got = types.index("input.requested"), types.index("input.resolved")
    assert asked < got < types.index("message.started")
    assert events[got]["data"] == {
        "request_id": question["request_id"], "choice": "approve", "note": "fine", "by": None,
    }  # fmt: skip


async def test_a_denied_question_fails_the_demo_run(api):
    run = (await submit(api, input=ASK)).json()
    question = open_question(await waiting(api, run["run_id"]))
    assert (await answer(api, run["run_id"], question["request_id"], "deny")).status_code == 200
    done = await wait_run(api, run["run_id"])
    assert done["status"] == "failed" and done["error"]["type"] == "denied"
    assert done["error"]["message"] == "the request to write the answer was denied"


async def test_answers_are_idempotent_and_bad_ones_change_nothing(api):
    run = (await submit(api, input=ASK)).json()
    run_id = run["run_id"]
    question = open_question(await waiting(api, run_id))
    request_id = question["request_id"]

    bad = await answer(api, run_id, request_id, "maybe")
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_choice"
    assert "'approve'" in bad.json()["message"]
    missing = await answer(api, run_id, "in_nope", "approve")
    assert missing.status_code == 404 and missing.json()["error"] == "input_not_found"
    unknown_run = await answer(api, "run_nope", request_id, "approve")
    assert unknown_run.status_code == 404 and unknown_run.json()["error"] == "run_not_found"
    for body in (
        {},
        {"choice": 1},
        {"choice": "approve", "extra": 1},
        {"choice": "approve", "note": 5},
    ):
        response = await api.post(f"runs/{run_id}/inputs/{request_id}", json=body)
        assert response.status_code == 400 and response.json()["error"] == "invalid_request", body
    assert (await api.get(f"runs/{run_id}")).json()["status"] == "waiting"

    assert (await answer(api, run_id, request_id, "approve")).status_code == 200
    again = await answer(api, run_id, request_id, "approve")
    assert again.status_code == 200
    other = await answer(api, run_id, request_id, "deny")
    assert other.status_code == 409 and other.json()["error"] == "input_resolved"
    assert other.json()["choice"] == "approve"
    await wait_run(api, run_id)
    events = await all_events(api, run_id)
    assert [e["type"] for e in events].count("input.resolved") == 1
    # After the run ended, the same answer is still 200, another still 409.
    assert (await answer(api, run_id, request_id, "approve")).status_code == 200
    assert (await answer(api, run_id, request_id, "deny")).status_code == 409


@pytest.mark.parametrize("server_config", [PER_USER])
async def test_another_users_run_cannot_be_answered_and_by_names_who_answered(api):
    alice, bob = {"X-Test-User": "alice"}, {"X-Test-User": "bob"}
    run = (await submit(api, input=ASK, headers=alice)).json()
    question = open_question(await waiting(api, run["run_id"], headers=alice))
    theirs = await answer(api, run["run_id"], question["request_id"], "approve", headers=bob)
    assert theirs.status_code == 404 and theirs.json()["error"] == "run_not_found"
    mine = await answer(api, run["run_id"], question["request_id"], "approve", headers=alice)
    assert mine.json()["snapshot"]["inputs"][0]["by"] == "alice"
    await wait_run(api, run["run_id"], headers=alice)


async def test_a_cancel_while_waiting_gives_up_the_question(api):
    run = (await submit(api, input=ASK)).json()
    question = open_question(await waiting(api, run["run_id"]))
    response = await api.post(f"runs/{run['run_id']}/cancel", json={"reason": "no time"})
    assert response.status_code == 202
    done = await wait_run(api, run["run_id"])
    assert done["status"] == "cancelled"
    [given_up] = done["snapshot"]["inputs"]
    assert given_up["status"] == "resolved" and given_up["choice"] is None
    assert given_up["reason"] == "cancelled"
    events = await all_events(api, run["run_id"])
    assert [e["type"] for e in events][-4:] == [
        "input.requested", "run.cancel_requested", "input.resolved", "run.cancelled",
    ]  # fmt: skip
    late = await answer(api, run["run_id"], question["request_id"], "approve")
    assert late.status_code == 409 and late.json()["error"] == "input_resolved"
    # Not "already answered (None)": nobody answered it.
    assert late.json()["message"].startswith("This question was given up (the run was cancelled")
    assert late.json()["choice"] is None and late.json()["reason"] == "cancelled"


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_a_question_nobody_answers_in_time_times_out(api):
    questions = [{"title": "Quick?", "timeout": 0.3}, {"title": "Then?", "choices": ["a", "b"]}]
    run = (await submit(api, "asker", {"questions": questions})).json()
    run = await waiting(api, run["run_id"], asked=2)
    second = open_question(run)
    assert second["title"] == "Then?"
    first = run["snapshot"]["inputs"][0]
    assert first["status"] == "resolved" and first["choice"] is None
    assert first["reason"] == "timeout"
    await answer(api, run["run_id"], second["request_id"], "b")
    done = await wait_run(api, run["run_id"])
    assert done["status"] == "succeeded"
    assert done["output"]["answers"][0].startswith("timeout: nobody answered 'Quick?'")
    assert done["output"]["answers"][1] == "b"


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_a_plain_function_agent_asks_from_its_thread(api):
    run = (await submit(api, "thread_asker", {})).json()
    question = open_question(await waiting(api, run["run_id"]))
    assert question["kind"] == "choice" and question["choices"] == ["yes", "no"]
    await answer(api, run["run_id"], question["request_id"], "yes")
    done = await wait_run(api, run["run_id"])
    assert done["status"] == "succeeded" and done["output"] == {"choice": "yes"}


@pytest.mark.parametrize("agentruns_config", [{"max_active_runs_per_user": 1}])
async def test_a_waiting_run_counts_against_the_active_run_limit(api):
    run = (await submit(api, input=ASK)).json()
    await waiting(api, run["run_id"])
    over = await submit(api, input=demo_input())
    assert over.status_code == 429
    await api.post(f"runs/{run['run_id']}/cancel")


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_bad_questions_are_the_agent_s_error(api):
    for question in (
        {"title": ""},
        {"title": "x", "choices": []},
        {"title": "x", "choices": ["a", "a"]},
        {"title": "x", "timeout": -1},
    ):
        run = (await submit(api, "asker", {"questions": [question]})).json()
        done = await wait_run(api, run["run_id"])
        assert done["status"] == "failed" and done["error"]["type"] == "ValueError", question


async def test_a_waiting_run_keeps_the_server_busy(api, jp_serverapp):
    run = (await submit(api, input=ASK)).json()
    await waiting(api, run["run_id"])
    extension = jp_serverapp.extension_manager.extension_points["jupyter_agentruns"].app
    assert extension.current_activity() == [run["run_id"]]
    assert jp_serverapp.extension_manager.any_activity()
    await api.post(f"runs/{run['run_id']}/cancel")


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
async def test_a_thread_agent_cancelled_while_asking_lets_its_thread_go(api):
    run = (await submit(api, "thread_asker", {})).json()
    await waiting(api, run["run_id"])
    await api.post(f"runs/{run['run_id']}/cancel")
    assert (await wait_run(api, run["run_id"]))["status"] == "cancelled"
    name = f"agentruns-{run['run_id']}"
    for _ in range(200):
        if not any(thread.name == name for thread in threading.enumerate()):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the agent's thread still waits in run.ask()")


async def test_an_answer_another_server_recorded_but_that_lost_is_409(api, engine, jp_serverapp):
    # A second engine on the same store stands for another server.
    app = jp_serverapp.extension_manager.extension_points["jupyter_agentruns"].app
    other = Engine(
        parent=app, settings=engine.settings, store=app.open_store(), agents=engine.agents
    )
    await other.start()
    try:
        run = (await submit(api, input=ASK)).json()
        question = open_question(await waiting(api, run["run_id"]))
        owner = engine.executor._live[run["run_id"]].owner
        remote = asyncio.ensure_future(
            other.answer(owner, "bob", run["run_id"], question["request_id"], "deny", None)
        )
        await asyncio.sleep(0.01)
        local = await answer(api, run["run_id"], question["request_id"], "approve")
        assert local.status_code == 200
        with pytest.raises(Exception) as lost:
            await remote
        assert getattr(lost.value, "code", None) == "input_resolved"
        assert lost.value.extra == {"choice": "approve"}
    finally:
        await other.stop()
