"""Every read and write checks the run's owner; another owner's run is answered as missing."""

import pytest

from conftest import all_events, demo_input, submit, wait_run

PER_USER = {"identity_provider_class": "identity.HeaderIdentityProvider"}
ALICE = {"X-Test-User": "alice"}
BOB = {"X-Test-User": "bob"}


@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize("agentruns_config", [{"owner_mode": "auto"}, {"owner_mode": "per-user"}])
async def test_another_users_run_is_404_on_every_endpoint(api):
    run_id = (await submit(api, headers=ALICE, input=demo_input(delay=0.01, chunks=100))).json()[
        "run_id"
    ]
    not_found = [
        await api.get(f"runs/{run_id}", headers=BOB),
        await api.get(f"runs/{run_id}/events", headers=BOB),
        await api.get(f"runs/{run_id}/events", headers={**BOB, "Accept": "text/event-stream"}),
        await api.post(f"runs/{run_id}/cancel", headers=BOB),
        await api.delete(f"runs/{run_id}", headers=BOB),
        await submit(api, headers=BOB, retry_of=run_id),
    ]
    for response in not_found:
        assert response.status_code == 404, response.request.url
        assert response.json()["error"] == "run_not_found"
    assert (await api.get("runs", headers=BOB)).json()["runs"] == []
    # Bob's attempts changed nothing: Alice's run goes on and is hers alone.
    run = await wait_run(api, run_id, headers=ALICE)
    assert run["status"] == "succeeded"
    assert [r["run_id"] for r in (await api.get("runs", headers=ALICE)).json()["runs"]] == [run_id]


@pytest.mark.parametrize("server_config", [PER_USER])
async def test_idempotency_keys_are_per_owner(api):
    alice = await submit(api, headers=ALICE, key="shared-key")
    bob = await submit(api, headers=BOB, key="shared-key")
    assert alice.status_code == bob.status_code == 201
    assert alice.json()["run_id"] != bob.json()["run_id"]
    other_body = await submit(api, headers=BOB, key="shared-key", input=demo_input(prompt="other"))
    assert other_body.status_code == 422


@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize("agentruns_config", [{"max_active_runs_per_user": 1}])
async def test_the_active_run_limit_is_per_owner(api):
    assert (
        await submit(api, headers=ALICE, input=demo_input(delay=0.05, chunks=100))
    ).status_code == 201
    assert (await submit(api, headers=ALICE)).status_code == 429
    assert (await submit(api, headers=BOB)).status_code == 201


async def test_auto_mode_with_the_default_identity_provider_shares_runs_between_token_requests(
    api, engine
):
    # Each token-only request here is a fresh random anonymous user.
    run_id = (await submit(api, key="k")).json()["run_id"]
    assert (await api.get(f"runs/{run_id}")).status_code == 200
    assert (await submit(api, key="k")).json()["run_id"] == run_id
    await wait_run(api, run_id)
    assert len(await all_events(api, run_id)) > 0


@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize("agentruns_config", [{"owner_mode": "shared"}])
async def test_shared_mode_makes_every_user_the_one_owner(api):
    run_id = (await submit(api, headers=ALICE)).json()["run_id"]
    assert (await api.get(f"runs/{run_id}", headers=BOB)).status_code == 200


@pytest.mark.parametrize("server_config", [PER_USER])
async def test_a_list_cursor_tells_nothing_of_other_users_runs(api):
    mine = [
        (await submit(api, headers=ALICE, input=demo_input(chunks=1, tools=False))).json()["run_id"]
        for _ in range(3)
    ]
    first = (await api.get("runs", params={"limit": 1}, headers=ALICE)).json()["next"]
    for _ in range(5):  # Bob's runs must not move Alice's cursor
        await submit(api, headers=BOB, input=demo_input(chunks=1, tools=False))
    again = (await api.get("runs", params={"limit": 1}, headers=ALICE)).json()["next"]
    assert first == again
    assert not first.isdigit()
    page = (await api.get("runs", params={"limit": 5, "before": first}, headers=ALICE)).json()
    assert [r["run_id"] for r in page["runs"]] == mine[::-1][1:] and page["next"] is None
    # Alice's cursor in Bob's hands lists Bob's runs, never Alice's.
    bobs = (await api.get("runs", params={"limit": 50, "before": first}, headers=BOB)).json()[
        "runs"
    ]
    assert not {r["run_id"] for r in bobs} & set(mine)
