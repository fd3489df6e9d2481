from conftest import all_events, submit, wait_run


async def test_demo_run_end_to_end(api):
    response = await submit(api, key="smoke")
    assert response.status_code == 201, response.text
    run = await wait_run(api, response.json()["run_id"])
    assert run["status"] == "succeeded"
    events = await all_events(api, run["run_id"])
    assert [e["seq"] for e in events] == list(range(1, run["last_seq"] + 1))
