"""Live runs are server activity: idle culling never stops a server mid-run."""

import asyncio

import pytest

from agents_for_tests import TEST_AGENTS
from conftest import demo_input, submit, wait_run, waiting


def extension(serverapp):
    return serverapp.extension_manager.extension_points["jupyter_agentruns"].app


@pytest.mark.parametrize("agentruns_config", [{"lease_seconds": 0.3}])
async def test_a_live_run_is_current_activity_and_keeps_last_activity_moving(api, jp_serverapp):
    app = extension(jp_serverapp)
    assert not app.current_activity()
    run_id = (await submit(api, input=demo_input(chunks=30, delay=0.05))).json()["run_id"]
    assert app.current_activity() == [run_id]
    assert jp_serverapp.extension_manager.any_activity()
    seen = []
    for _ in range(5):
        await asyncio.sleep(0.2)  # no API request meanwhile
        seen.append(jp_serverapp.web_app.settings["agentruns_last_activity"])
    assert seen == sorted(seen) and len(set(seen)) >= 3
    assert jp_serverapp.web_app.last_activity() >= seen[-1]
    await wait_run(api, run_id)
    await asyncio.sleep(0.05)
    assert not app.current_activity()


@pytest.mark.parametrize(
    "agentruns_config",
    [{"lease_seconds": 0.3, "waiting_activity_seconds": 1, "agents": TEST_AGENTS}],
)
async def test_a_resumable_run_waiting_for_an_answer_lets_its_server_be_culled_after_a_while(
    api, jp_serverapp
):
    """A question left open overnight must not keep a hub server running until max_run_seconds.

    A resumable run's question survives the cull (handed over, taken over by
    the next server); a run of an agent that cannot resume would be lost, so
    it keeps its server busy for as long as it waits.
    """
    app = extension(jp_serverapp)
    resumable = (await submit(api, input=demo_input(ask=True, chunks=5))).json()["run_id"]
    other = (await submit(api, "asker", {"questions": [{"title": "Go on?"}]})).json()["run_id"]
    await waiting(api, resumable)
    await waiting(api, other)
    assert app.current_activity() == sorted([resumable, other])
    await asyncio.sleep(1.2)
    assert app.current_activity() == [other]  # the resumable one waited long enough
    run = await waiting(api, other)
    request_id = run["snapshot"]["inputs"][0]["request_id"]
    await api.post(f"runs/{other}/inputs/{request_id}", json={"choice": "approve"})
    await wait_run(api, other)
    await asyncio.sleep(0.1)
    assert not app.current_activity()  # nothing keeps the server: it may be culled
    before = jp_serverapp.web_app.settings["agentruns_last_activity"]
    await asyncio.sleep(0.7)  # two lease renewals of the waiting run
    assert jp_serverapp.web_app.settings["agentruns_last_activity"] == before
    # Answered, it runs again: activity again.
    run = await waiting(api, resumable)
    request_id = run["snapshot"]["inputs"][0]["request_id"]
    await api.post(f"runs/{resumable}/inputs/{request_id}", json={"choice": "approve"})
    assert (await wait_run(api, resumable))["status"] == "succeeded"
