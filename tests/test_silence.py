"""A run whose agent says nothing: ``agent_silence_seconds`` fails it ``agent_silent``."""

import asyncio

import pytest

from jupyter_agentruns.settings import from_values

from agents_for_tests import TEST_AGENTS
from conftest import all_events, demo_input, submit, wait_run, waiting

SILENT_AFTER = {"agents": TEST_AGENTS, "agent_silence_seconds": 1.5}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agentruns_config", [SILENT_AFTER])
async def test_a_run_whose_agent_says_nothing_for_a_while_fails_agent_silent(api):
    # It says "working", then waits an hour without a word.
    run_id = (await submit(api, agent="slow_to_stop", input={"seconds": 0})).json()["run_id"]
    run = await wait_run(api, run_id, timeout=30)
    assert run["status"] == "failed"
    assert run["error"]["type"] == "agent_silent"
    assert "said nothing for 1.5 s (agent_silence_seconds)" in run["error"]["message"]
    events = await all_events(api, run_id)
    assert events[-1]["type"] == "run.failed"
    assert "tool.started" not in [e["type"] for e in events]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agentruns_config", [SILENT_AFTER])
async def test_a_run_waiting_for_its_own_step_is_not_silent_and_its_count_starts_again_after(api):
    # The sleeper starts a step (a long cell, a tool) and waits a minute in it.
    run_id = (await submit(api, agent="sleeper", input={})).json()["run_id"]
    await asyncio.sleep(3)  # twice agent_silence_seconds
    run = (await api.get(f"runs/{run_id}")).json()
    assert run["status"] == "running" and run["snapshot"]["tools"][0]["status"] == "running"
    await api.post(f"runs/{run_id}/cancel")
    events = await all_events(api, (await wait_run(api, run_id))["run_id"])
    assert [e["type"] for e in events][-2:] == ["tool.completed", "run.cancelled"]
    assert events[-2]["data"]["error"]["type"] == "cancelled"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agentruns_config", [SILENT_AFTER])
async def test_a_run_waiting_for_a_person_is_not_silent(api):
    run_id = (await submit(api, agent="asker", input={})).json()["run_id"]
    [question] = (await waiting(api, run_id))["snapshot"]["inputs"]
    await asyncio.sleep(3)  # twice agent_silence_seconds
    assert (await api.get(f"runs/{run_id}")).json()["status"] == "waiting"
    await api.post(f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": "approve"})
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded", run["error"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agentruns_config", [SILENT_AFTER])
async def test_an_agent_that_keeps_talking_slowly_is_never_silent(api):
    # 4 s in all, an event every 0.5 s.
    run_id = (await submit(api, input=demo_input(chunks=8, delay=0.5, tools=False))).json()[
        "run_id"
    ]
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded", run["error"]


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf")])
def test_agent_silence_seconds_is_0_or_a_positive_number(value):
    with pytest.raises(Exception, match="agent_silence_seconds must be 0 or a positive number"):
        from_values({"agent_silence_seconds": value})
