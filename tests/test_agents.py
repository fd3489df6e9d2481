"""The agent interface: plain functions, failures, limits, durability, custom events."""

import asyncio
import gc
import logging

import pytest
import rawdb

from jupyter_agentruns.agents import load_agents
from jupyter_agentruns.agents.demo import answer_words

from agents_for_tests import TEST_AGENTS
from conftest import all_events, submit, wait_run


@pytest.fixture
def agentruns_config():
    return {"agents": TEST_AGENTS, "max_event_bytes": 4096}


async def run_agent(api, name, input=None):
    response = await submit(api, agent=name, input=input or {})
    assert response.status_code == 201, response.text
    return await wait_run(api, response.json()["run_id"])


async def test_a_plain_function_agent_runs_in_a_thread_through_the_same_ordered_path(api):
    run = await run_agent(api, "counter", {"n": 300})
    assert run["status"] == "succeeded" and run["output"] == {"count": 300}
    events = await all_events(api, run["run_id"])
    assert [e["seq"] for e in events] == list(range(1, 304))  # started, message, 300 deltas, end
    assert run["snapshot"]["messages"][0]["text"] == "".join(f"{i} " for i in range(300))


async def test_an_exception_fails_the_run_without_traceback_or_server_paths(api):
    run = await run_agent(api, "crashes")
    assert run["status"] == "failed"
    assert run["error"]["type"] == "FileNotFoundError"
    assert "/home/someone" not in run["error"]["message"]
    assert "Traceback" not in run["error"]["message"]
    assert "is missing" in run["error"]["message"]
    events = await all_events(api, run["run_id"])
    assert events[-1] == {**events[-1], "type": "run.failed", "data": {"error": run["error"]}}


async def test_an_event_over_max_event_bytes_fails_the_run(api):
    run = await run_agent(api, "huge_event")
    assert run["status"] == "failed"
    assert run["error"]["type"] == "event_too_large"
    types = [e["type"] for e in await all_events(api, run["run_id"])]
    assert types == ["run.started", "message.started", "run.failed"]


async def test_a_tool_step_too_large_to_record_ends_failed_and_the_run_fails(api):
    run = await run_agent(api, "oversized_step")
    assert run["status"] == "failed" and run["error"]["type"] == "event_too_large"
    # The step is never left running: it ends with why its result was not kept.
    [step] = run["snapshot"]["tools"]
    assert step["status"] == "failed" and step["error"]["type"] == "event_too_large"
    assert "over max_event_bytes (4096)" in step["error"]["message"]
    types = [e["type"] for e in await all_events(api, run["run_id"])]
    assert types == ["run.started", "tool.started", "tool.completed", "run.failed"]


async def test_an_output_that_is_not_json_fails_the_run(api):
    run = await run_agent(api, "bad_output")
    assert run["status"] == "failed" and run["error"]["type"] == "invalid_output"


async def test_an_output_holding_nan_fails_the_run_and_no_answer_carries_nan(api):
    # Python would write NaN, which no browser can parse: the run fails instead.
    run = await run_agent(api, "nan_output")
    assert run["status"] == "failed" and run["error"]["type"] == "invalid_output"
    listing = await api.get("runs")
    assert listing.status_code == 200
    assert b"NaN" not in listing.content and b"Infinity" not in listing.content


async def test_an_oversized_event_logs_no_unretrieved_task_exception(api, caplog):
    run = await run_agent(api, "huge_event")
    assert run["error"]["type"] == "event_too_large"
    gc.collect()  # an unretrieved exception is reported when its task is collected
    await asyncio.sleep(0.05)
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_agents_cannot_forge_lifecycle_events(api):
    run = await run_agent(api, "reserved_type")
    assert run["status"] == "failed" and run["error"]["type"] == "ValueError"
    assert [e["type"] for e in await all_events(api, run["run_id"])] == [
        "run.started",
        "run.failed",
    ]


async def test_durable_waits_until_every_emitted_event_is_in_the_database(api, engine, monkeypatch):
    monkeypatch.setenv("AGENTRUNS_TEST_DB", rawdb.target(engine))
    run = await run_agent(api, "durable_count", {"n": 500})
    assert run["output"] == {"stored": 502, "emitted": 502}


async def test_tool_context_records_success_failure_and_custom_events(api):
    run = await run_agent(api, "tool_user")
    assert run["status"] == "succeeded"
    tools = run["snapshot"]["tools"]
    assert [(t["name"], t["status"]) for t in tools] == [
        ("lookup", "completed"),
        ("broken", "failed"),
    ]
    assert tools[0]["result"] == {"found": True}
    assert tools[1]["error"]["type"] == "KeyError"
    events = await all_events(api, run["run_id"])
    assert {"type": "x.chart", "data": {"kind": "bar"}}.items() <= events[-2].items()


@pytest.mark.parametrize("agentruns_config", [{"max_run_seconds": 0.3}])
async def test_a_run_past_max_run_seconds_fails_with_deadline_exceeded(api):
    response = await submit(api, input={"prompt": "p", "delay": 0.05, "chunks": 100})
    run = await wait_run(api, response.json()["run_id"])
    assert run["status"] == "failed"
    assert run["error"]["type"] == "deadline_exceeded"


async def test_the_demo_agent_can_be_asked_to_fail(api):
    response = await submit(api, input={"prompt": "p", "chunks": 3, "delay": 0, "fail": True})
    run = await wait_run(api, response.json()["run_id"])
    assert run["status"] == "failed" and run["error"]["type"] == "DemoFailure"
    assert run["snapshot"]["messages"][0]["done"] is True


PROMPT = "Plot `sales.csv`:\n    by month,  then ```by region```"


@pytest.mark.parametrize("chunks", [1, 4, 40, 300])
def test_the_demo_answer_is_markdown_holding_the_prompt_as_given_in_chunks_deltas(chunks):
    deltas = answer_words(PROMPT, chunks)
    assert len(deltas) == chunks and all(deltas)
    text = "".join(deltas)
    assert text.startswith(
        "## Demo answer about Plot `sales.csv`: by month, then ```by region```\n"
    )
    assert "\n- a page refresh only pauses the view;\n" in text
    assert "| --- | ---: |\n| characters | 53 |\n| words | 7 |\n" in text
    # The prompt as given, whitespace and backticks kept, in a fence it cannot close.
    assert f"\n````text\n{PROMPT}\n````\n" in text
    assert text == "".join(answer_words(PROMPT, chunks))
    if chunks == 300:  # more chunks than the answer's words: a paragraph follows it
        after = text.split("\n````\n", 1)[1]
        assert after.startswith("\nThis answer streams from a durable run") and after.endswith(
            ".\n"
        )


def test_the_demo_quotes_a_long_prompt_in_part_and_says_so():
    prompt = "x" * 5000
    (delta,) = answer_words(prompt, 1)
    assert "The prompt, as given (its first 2000 of 5000 characters):" in delta
    assert f"```text\n{'x' * 2000}\n```" in delta and len(delta) < 4000


async def test_the_same_demo_input_streams_the_same_deltas(api):
    input = {"prompt": PROMPT, "chunks": 30, "delay": 0}
    streamed = []
    for _ in range(2):
        run = await wait_run(api, (await submit(api, input=input)).json()["run_id"])
        events = await all_events(api, run["run_id"])
        streamed.append([e["data"]["delta"] for e in events if e["type"] == "text.delta"])
        assert run["output"]["text"] == run["snapshot"]["messages"][0]["text"]
    assert streamed[0] == streamed[1] == answer_words(PROMPT, 30)


async def test_thinking_a_plan_and_tool_steps_with_their_content_are_recorded(api):
    run = await run_agent(api, "stepper")
    assert run["status"] == "succeeded"
    snapshot = run["snapshot"]
    assert snapshot["reasoning"] == "Look at the file, then change it."
    assert snapshot["plan"] == [{"content": "Read a.py", "status": "completed", "priority": "high"}]
    read, edit = snapshot["tools"]
    assert (read["kind"], read["title"], read["content"]) == (
        "read", "Read a.py", [{"type": "text", "text": "x = 1"}],
    )  # fmt: skip
    assert (
        edit["content"][0]["new_text"] == "x = 2\n" and edit["content"][0]["old_text"] == "x = 1\n"
    )
    types = [event["type"] for event in await all_events(api, run["run_id"])]
    assert types.count("reasoning.delta") == 2 and types.count("plan.updated") == 2


@pytest.mark.parametrize("bad", ["plan", "content"])
async def test_a_plan_or_tool_content_of_the_wrong_shape_is_refused_to_the_agent(api, bad):
    run = await run_agent(api, "stepper", {"bad": bad})
    assert run["status"] == "failed" and run["error"]["type"] == "ValueError"
    assert "plan" not in run["snapshot"] and not any(
        "content" in tool for tool in run["snapshot"]["tools"]
    )


def test_an_agent_that_is_not_callable_fails_to_load_saying_why():
    agents, failures = load_agents({"notes": "agents_for_tests:TEST_AGENTS"}, logging.getLogger())
    assert "notes" not in agents
    assert failures["notes"].startswith("TypeError: a dict is not callable")
