"""Live runs are server activity: idle culling never stops a server mid-run."""

import asyncio

import pytest

from conftest import demo_input, submit, wait_run


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
