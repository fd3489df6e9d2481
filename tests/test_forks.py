"""``POST runs/{id}/fork``: a run that goes on from the state after one of another run's events.

Through a real server, with the ``openai`` agent against the scripted
OpenAI-compatible server, which records what each model call was sent: a
fork's first call is sent the original's conversation up to the fork's
event, with the fork's input fields over the original's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import all_events, submit, wait_run
from fake_openai import MODEL, answer, tool_calls
from tools_for_tests import TEST_TOOLS

# Above the store (SQLite alone): the fork's column is one of the run's, which
# test_store_contract and test_copy hold to on both stores.
pytestmark = pytest.mark.sqlite_only


GUIDE = Path(__file__).parent.parent / "docs" / "how-to" / "write-an-agent.md"


@pytest.fixture
def agentruns_config(tmp_path, monkeypatch):
    # The guide's forking agent, as written there.
    text = GUIDE.read_text()
    start = text.index("# counting_agents.py")
    (tmp_path / "counting_agents.py").write_text(text[start : text.index("```", start)])
    monkeypatch.syspath_prepend(str(tmp_path))
    yield {
        "agents": {
            "openai": "jupyter_agentruns.agents.openai:OpenAIAgent",
            "plain": "agents_for_tests:echo",
            "count": "counting_agents:count",
        }
    }
    sys.modules.pop("counting_agents", None)


@pytest.fixture
def jp_server_config(jp_server_config, fake):
    settings = {"base_url": fake.url, "model": MODEL, "max_retries": 0, "tools": TEST_TOOLS}
    return {**jp_server_config, "OpenAIAgent": settings}


def chat_messages(fake) -> list[list[dict]]:
    """What each model call was sent, in order."""
    return [r["body"]["messages"] for r in fake.requests if r["path"].endswith("/chat/completions")]


def seq_of(events, type, nth=0) -> int:
    return [event["seq"] for event in events if event["type"] == type][nth]


async def run_to_end(api, input, agent="openai"):
    response = await submit(api, agent=agent, input=input)
    assert response.status_code == 201, response.text
    run = await wait_run(api, response.json()["run_id"])
    assert run["status"] == "succeeded", run["error"]
    return run, await all_events(api, run["run_id"])


async def fork(api, run_id, body, key=None):
    headers = {"Idempotency-Key": key} if key else {}
    return await api.post(f"runs/{run_id}/fork", json=body, headers=headers)


async def test_a_fork_sends_the_model_the_conversation_up_to_its_event(api, fake):
    fake.reply(tool_calls(("add", '{"a": 2, "b": 3}')), answer("It is ", "5."))
    original, events = await run_to_end(api, {"prompt": "What is 2 + 3?"})
    first_call, second_call = chat_messages(fake)

    # After the tool's result: the model is asked what it was asked the second time.
    after_tool = seq_of(events, "tool.completed")
    fake.reply(answer("Five."))
    response = await fork(api, original["run_id"], {"at_seq": after_tool})
    assert response.status_code == 201, response.text
    forked = response.json()
    assert forked["forked_from"] == {"run_id": original["run_id"], "seq": after_tool}
    assert response.headers["Location"].endswith(f"runs/{forked['run_id']}")
    forked = await wait_run(api, forked["run_id"])
    assert forked["status"] == "succeeded", forked["error"]
    assert chat_messages(fake)[-1] == second_call
    assert forked["output"]["text"] == "Five."
    assert forked["input"]["prompt"] == "What is 2 + 3?"
    assert [m["role"] for m in forked["input"]["history"]] == ["assistant", "tool"]
    # Its own log: the fork's steps only, the original's stay the original's.
    assert [e["type"] for e in await all_events(api, forked["run_id"])].count("tool.started") == 0
    assert (await api.get(f"runs/{original['run_id']}")).json()["last_seq"] == original["last_seq"]

    # Before the tool call, with a new prompt: the first call as it would be with that prompt.
    before_tool = seq_of(events, "tool.started") - 1
    fake.reply(tool_calls(("add", '{"a": 20, "b": 30}')), answer("50."))
    response = await fork(
        api, original["run_id"], {"at_seq": before_tool, "input": {"prompt": "And 20 + 30?"}}
    )
    assert response.status_code == 201, response.text
    again = await wait_run(api, response.json()["run_id"])
    assert again["status"] == "succeeded", again["error"]
    assert chat_messages(fake)[-2] == [{"role": "user", "content": "And 20 + 30?"}]
    assert first_call == [{"role": "user", "content": "What is 2 + 3?"}]
    assert "history" not in again["input"]
    assert again["output"]["text"] == "50."

    # The run's family: its forks, newest first (the run page lists them).
    family = (await api.get("runs", params={"forked_from": original["run_id"]})).json()["runs"]
    assert [run["run_id"] for run in family] == [again["run_id"], forked["run_id"]]
    none = await api.get("runs", params={"forked_from": forked["run_id"]})
    assert none.json()["runs"] == []


async def test_a_fork_in_the_middle_of_a_turn_keeps_the_calls_that_ended(api, fake):
    # Two calls in one turn; the fork goes on after the first one's result.
    fake.reply(
        tool_calls(("add", '{"a": 1, "b": 1}'), ("add", '{"a": 2, "b": 2}')),
        answer("2 and 4."),
    )
    original, events = await run_to_end(api, {"prompt": "1+1 and 2+2?", "system": "Be brief."})
    both = chat_messages(fake)[-1]  # the call after both results

    after_first = seq_of(events, "tool.completed", 0)
    fake.reply(tool_calls(("add", '{"a": 2, "b": 2}')), answer("2 and 4."))
    response = await fork(api, original["run_id"], {"at_seq": after_first})
    assert response.status_code == 201, response.text
    forked = await wait_run(api, response.json()["run_id"])
    assert forked["status"] == "succeeded", forked["error"]
    sent = chat_messages(fake)[-2]
    # The system message and prompt, the turn with only its first call, and that call's result.
    assert sent[:2] == both[:2]
    assert [c["function"]["arguments"] for c in sent[2]["tool_calls"]] == ['{"a": 1, "b": 1}']
    assert sent[3] == {**both[3]}
    assert len(sent) == 4

    # A fork of that fork carries both histories.
    fork_events = await all_events(api, forked["run_id"])
    fake.reply(answer("Still 2 and 4."))
    response = await fork(api, forked["run_id"], {"at_seq": seq_of(fork_events, "tool.completed")})
    assert response.status_code == 201, response.text
    deeper = await wait_run(api, response.json()["run_id"])
    assert deeper["status"] == "succeeded", deeper["error"]
    assert chat_messages(fake)[-1][:4] == sent
    assert [m["role"] for m in chat_messages(fake)[-1][4:]] == ["assistant", "tool"]


async def test_a_fork_is_idempotent_with_its_key(api, fake):
    fake.reply(answer("Hi."))
    original, events = await run_to_end(api, {"prompt": "Hello"})
    fake.reply(answer("Hi again."))
    body = {"at_seq": 0, "input": {"prompt": "Hello there"}}
    first = await fork(api, original["run_id"], body, key="fork-1")
    second = await fork(api, original["run_id"], body, key="fork-1")
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.headers["Idempotent-Replayed"] == "true"
    assert first.json()["run_id"] == second.json()["run_id"]
    other = await fork(api, original["run_id"], {**body, "at_seq": 1}, key="fork-1")
    assert other.status_code == 422 and other.json()["error"] == "idempotency_key_reused"
    await wait_run(api, first.json()["run_id"])


async def test_bad_forks_are_refused_and_make_nothing(api, fake):
    fake.reply(answer("Hi."))
    original, events = await run_to_end(api, {"prompt": "Hello"})
    plain = (await submit(api, agent="plain", input={"text": "x"})).json()
    await wait_run(api, plain["run_id"])
    before = len((await api.get("runs")).json()["runs"])

    refused = await fork(api, plain["run_id"], {"at_seq": 1})
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "fork_unsupported"
    assert "'plain'" in refused.json()["message"] and "fork()" in refused.json()["message"]

    cases = [
        ({"at_seq": original["last_seq"] + 1}, 400, "invalid_request"),
        ({"at_seq": -1}, 400, "invalid_request"),
        ({"at_seq": True}, 400, "invalid_request"),
        ({}, 400, "invalid_request"),
        ({"at_seq": 1, "agent": "demo"}, 400, "invalid_request"),
        ({"at_seq": 1, "input": {"temperature": "hot"}}, 400, "invalid_input"),
        ({"at_seq": 1, "input": []}, 400, "invalid_request"),
    ]
    for body, status, error in cases:
        response = await fork(api, original["run_id"], body)
        assert (response.status_code, response.json()["error"]) == (status, error), body
    missing = await fork(api, "run_" + "x" * 22, {"at_seq": 0})
    assert missing.status_code == 404 and missing.json()["error"] == "run_not_found"
    assert len((await api.get("runs")).json()["runs"]) == before


async def test_the_guides_agent_forks_after_the_steps_that_had_ended(api, fake):
    original, events = await run_to_end(api, {"to": 3}, agent="count")
    after_two = seq_of(events, "tool.completed", 1)
    response = await fork(api, original["run_id"], {"at_seq": after_two})
    assert response.status_code == 201, response.text
    forked = await wait_run(api, response.json()["run_id"])
    assert forked["status"] == "succeeded", forked["error"]
    assert forked["input"] == {"to": 3, "start": 2}
    assert [t["args"] for t in forked["snapshot"]["tools"]] == [{"n": 2}]

    during = seq_of(events, "tool.started", 1)
    refused = await fork(api, original["run_id"], {"at_seq": during})
    assert refused.status_code == 422, refused.text
    assert "a step was going on at that event" in refused.json()["message"]
