"""POST runs: idempotent submit, the order of checks, and that a rejection stores nothing."""

import asyncio

import pytest

from conftest import demo_input, submit, wait_run


async def count_runs(api):
    return len((await api.get("runs", params={"limit": 500})).json()["runs"])


async def test_new_run_is_201_with_location_and_a_run_object(api, jp_base_url):
    response = await submit(api, key="k1")
    assert response.status_code == 201
    run = response.json()
    assert run["run_id"].startswith("run_") and len(run["run_id"]) >= 4 + 22
    assert response.headers["location"] == f"{jp_base_url}api/agentruns/runs/{run['run_id']}"
    assert run["agent"] == "demo" and run["status"] in ("queued", "running")
    assert run["input"] == demo_input()
    assert "Idempotent-Replayed" not in response.headers


async def test_same_key_and_body_replays_the_same_run_whatever_its_state(api):
    first = await submit(api, key="same")
    run_id = first.json()["run_id"]
    again = await submit(api, key="same")
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["run_id"] == run_id
    await wait_run(api, run_id)
    finished = await submit(api, key="same")
    assert finished.status_code == 200 and finished.json()["status"] == "succeeded"
    assert await count_runs(api) == 1


async def test_same_key_with_a_different_body_is_422_and_changes_nothing(api):
    first = await submit(api, key="k", input=demo_input(prompt="one"))
    response = await submit(api, key="k", input=demo_input(prompt="two"))
    assert response.status_code == 422
    assert response.json()["error"] == "idempotency_key_reused"
    assert await count_runs(api) == 1
    replay = await submit(api, key="k", input=demo_input(prompt="one"))
    assert replay.json()["run_id"] == first.json()["run_id"]


@pytest.mark.parametrize(
    "field,value", [("session", "nb.ipynb"), ("metadata", {"a": 1}), ("agent", "other")]
)
async def test_every_fingerprinted_field_counts(api, field, value):
    await submit(api, key="k")
    body = {"agent": "demo", "input": demo_input(), field: value}
    response = await api.post("runs", json=body, headers={"Idempotency-Key": "k"})
    assert response.status_code == 422


async def test_the_code_of_the_submitting_cell_is_recorded_but_not_fingerprinted(api):
    # A cell re-run with edited code (the same input) finds the run its first code made.
    metadata = {"cell_id": "c1", "cell_source": "submit(1)", "cell_source_sha256": "ab" * 32}
    first = await api.post(
        "runs",
        json={"agent": "demo", "input": demo_input(), "metadata": metadata},
        headers={"Idempotency-Key": "cell"},
    )
    edited = {
        "cell_id": "c1",
        "cell_source": "submit(1)  # edited",
        "cell_source_sha256": "cd" * 32,
    }
    again = await api.post(
        "runs",
        json={"agent": "demo", "input": demo_input(), "metadata": edited},
        headers={"Idempotency-Key": "cell"},
    )
    assert again.status_code == 200 and again.json()["run_id"] == first.json()["run_id"]
    assert again.json()["metadata"] == metadata
    other_cell = await api.post(
        "runs",
        json={"agent": "demo", "input": demo_input(), "metadata": {**edited, "cell_id": "c2"}},
        headers={"Idempotency-Key": "cell"},
    )
    assert other_cell.status_code == 422


async def test_fifty_concurrent_identical_submits_create_exactly_one_run(api):
    responses = await asyncio.gather(
        *(submit(api, key="race", input=demo_input(delay=0.01)) for _ in range(50))
    )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 49 + [201]
    assert len({r.json()["run_id"] for r in responses}) == 1
    assert await count_runs(api) == 1


async def test_submits_without_a_key_each_create_a_run(api):
    a = await submit(api)
    b = await submit(api)
    assert a.status_code == b.status_code == 201
    assert a.json()["run_id"] != b.json()["run_id"]


@pytest.mark.parametrize("agentruns_config", [{"idempotency_ttl_seconds": 0.3}])
async def test_a_key_is_forgotten_after_its_ttl(api):
    first = await submit(api, key="short")
    await asyncio.sleep(0.5)
    second = await submit(api, key="short")
    assert second.status_code == 201
    assert second.json()["run_id"] != first.json()["run_id"]


@pytest.mark.parametrize("agentruns_config", [{"max_active_runs_per_user": 1}])
async def test_too_many_active_runs_is_429_but_a_replay_never_is(api):
    slow = await submit(api, key="slow", input=demo_input(delay=0.05, chunks=100))
    assert slow.status_code == 201
    response = await submit(api, key="other")
    assert response.status_code == 429
    assert response.json()["error"] == "too_many_active_runs"
    assert int(response.headers["retry-after"]) > 0
    replay = await submit(api, key="slow", input=demo_input(delay=0.05, chunks=100))
    assert replay.status_code == 200
    # The rejected key stored nothing: it works once there is room.
    await api.post(f"runs/{slow.json()['run_id']}/cancel")
    await wait_run(api, slow.json()["run_id"])
    assert (await submit(api, key="other")).status_code == 201


async def test_a_rejected_request_stores_nothing_so_its_key_can_be_used_again(api):
    assert (await submit(api, agent="nope", key="k")).status_code == 404
    assert (await submit(api, input={"prompt": 3}, key="k")).status_code == 400
    response = await submit(api, key="k")
    assert response.status_code == 201
    assert await count_runs(api) == 1


@pytest.mark.parametrize(
    "body,code",
    [
        (b"not json", "invalid_request"),
        (b"[1, 2]", "invalid_request"),
        (b'{"input": {}}', "invalid_request"),
        (b'{"agent": "demo"}', "invalid_request"),
        (b'{"agent": 3, "input": {}}', "invalid_request"),
        (b'{"agent": "demo", "input": "text"}', "invalid_request"),
        (b'{"agent": "demo", "input": {}, "metadata": []}', "invalid_request"),
        (b'{"agent": "demo", "input": {}, "session": 1}', "invalid_request"),
        (b'{"agent": "demo", "input": {}, "colour": "red"}', "invalid_request"),
        (b"", "invalid_request"),
    ],
)
async def test_malformed_bodies_are_400_invalid_request(api, body, code):
    response = await api.post("runs", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"] == code
    assert response.json()["message"]
    assert await count_runs(api) == 0


@pytest.mark.parametrize("key", ["", "x" * 256, "naïve", "tab\there"])
async def test_invalid_idempotency_keys_are_400(api, key):
    response = await api.post(
        "runs",
        json={"agent": "demo", "input": demo_input()},
        headers={"Idempotency-Key": key.encode()},
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_idempotency_key"


async def test_invalid_input_is_400_with_the_schema_problem(api):
    response = await submit(api, input={"prompt": "x", "chunks": 0})
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid_input"
    assert body["path"] == "input.chunks"
    assert body["message"] == "input.chunks: 0 is less than the minimum of 1"
    assert await count_runs(api) == 0


@pytest.mark.parametrize(
    "body,code,path",
    [
        (b'{"agent": "demo", "input": {"prompt": "p", "delay": 11}}', "invalid_input", "input.delay"),
        (b'{"agent": "demo", "input": {"prompt": "p", "delay": NaN}}', "invalid_request", "input.delay"),
        (b'{"agent": "demo", "input": {"prompt": ["p"]}}', "invalid_input", "input.prompt"),
        (b'{"agent": "demo", "input": {"chunks": 2}}', "invalid_input", "input"),
    ],
)  # fmt: skip
async def test_both_codes_name_the_value_in_path_the_same_way(api, body, code, path):
    response = await api.post("runs", content=body, headers={"Idempotency-Key": "where"})
    assert response.status_code == 400
    answer = response.json()
    assert (answer["error"], answer["path"]) == (code, path)
    assert path in answer["message"]
    assert await count_runs(api) == 0


async def test_unknown_agent_is_404(api):
    response = await submit(api, agent="nope")
    assert response.status_code == 404
    assert response.json()["error"] == "unknown_agent"


@pytest.mark.parametrize(
    "agentruns_config", [{"max_body_bytes": 2000, "max_active_runs_per_user": 1}]
)
async def test_checks_come_in_the_documented_order(api):
    big = {"agent": "demo", "input": {"prompt": "x" * 3000}}
    # 413 before a bad key.
    response = await api.post("runs", json=big, headers={"Idempotency-Key": ""})
    assert response.status_code == 413
    # Bad JSON before a bad key.
    response = await api.post("runs", content=b"{", headers={"Idempotency-Key": ""})
    assert response.json()["error"] == "invalid_request"
    # A bad key before an unknown agent.
    response = await api.post(
        "runs", json={"agent": "nope", "input": {}}, headers={"Idempotency-Key": ""}
    )
    assert response.json()["error"] == "invalid_idempotency_key"
    # The key (422) before the agent.
    await submit(api, key="used", input=demo_input(delay=0.05, chunks=100))
    response = await submit(api, agent="nope", key="used")
    assert response.status_code == 422
    # Unknown agent before input; input before the active-run limit.
    response = await submit(api, agent="nope", input={"bad": 1}, key="fresh")
    assert response.json()["error"] == "unknown_agent"
    response = await submit(api, input={"bad": 1}, key="fresh")
    assert response.json()["error"] == "invalid_input"
    response = await submit(api, key="fresh")
    assert response.json()["error"] == "too_many_active_runs"


@pytest.mark.parametrize("agentruns_config", [{"max_body_bytes": 1000}])
async def test_a_body_over_max_body_bytes_is_413_even_when_chunked(api):
    payload = b'{"agent": "demo", "input": {"prompt": "' + b"x" * 5000 + b'"}}'
    response = await api.post("runs", content=payload)
    assert response.status_code == 413
    assert response.json()["error"] == "request_too_large"

    async def chunks():
        for start in range(0, len(payload), 512):
            yield payload[start : start + 512]

    response = await api.post("runs", content=chunks())
    assert response.status_code == 413
    assert await count_runs(api) == 0


async def test_retry_of_links_a_new_run_to_the_old_one(api):
    first = await submit(api, key="a")
    again = await submit(api, key="b", retry_of=first.json()["run_id"])
    assert again.status_code == 201
    assert again.json()["retry_of"] == first.json()["run_id"]
    missing = await submit(api, key="c", retry_of="run_missing")
    assert missing.status_code == 404 and missing.json()["error"] == "run_not_found"


async def test_agents_lists_the_demo_agent_with_its_input_schema(api):
    agents = (await api.get("agents")).json()["agents"]
    demo = next(a for a in agents if a["name"] == "demo")
    assert demo["description"]
    assert demo["input_schema"]["properties"]["chunks"]["maximum"] == 100000
    assert demo["input_schema"]["required"] == ["prompt"]


@pytest.mark.parametrize(
    "body,path",
    [
        (b'{"agent": "demo", "input": {"prompt": "p", "delay": NaN}}', "input.delay"),
        (b'{"agent": "demo", "input": {"prompt": "p", "delay": Infinity}}', "input.delay"),
        (b'{"agent": "demo", "input": {"prompt": "p", "delay": 1e999}}', "input.delay"),
        (
            b'{"agent": "demo", "input": {"prompt": "p"}, "metadata": {"scores": [1, -Infinity]}}',
            "metadata.scores[1]",
        ),
    ],
)
async def test_non_finite_numbers_anywhere_in_a_body_are_400_naming_where(api, body, path):
    response = await api.post("runs", content=body, headers={"Idempotency-Key": "nan"})
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"
    assert response.json()["path"] == path
    assert path in response.json()["message"]
    assert await count_runs(api) == 0
    # The key stored nothing: a corrected request takes it.
    assert (await submit(api, key="nan")).status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        b'{"agent": "demo", "input": ' + b"[" * 100000 + b"]" * 100000 + b"}",
        b'{"agent": "demo", "input": {"prompt": "p", "n": '
        + b'{"a": ' * 200
        + b"1"
        + b"}" * 200
        + b"}}",
        b'{"agent": "demo", "input": {"prompt": "p"}, "session": "\\ud800"}',
        b'{"agent": "demo", "input": {"prompt": "p"}, "retry_of": "run_\\udfff"}',
        b'{"agent": "demo", "input": {"prompt": "p\\ud83d"}}',
        b'{"agent": "demo", "input": {"\\ud800": 1, "prompt": "p"}}',
        b'{"agent": "demo", "input": {"prompt": "p", "chunks": 1' + b"0" * 5000 + b"}}",
    ],
    ids=[
        "deep-array",
        "deep-object",
        "surrogate-session",
        "surrogate-retry-of",
        "surrogate-input",
        "surrogate-key",
        "huge-int",
    ],
)
async def test_odd_json_is_400_invalid_request_never_a_500(api, body):
    response = await api.post("runs", content=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_request"
    assert await count_runs(api) == 0


@pytest.mark.parametrize("agentruns_config", [{"idempotency_ttl_seconds": 0.3}])
async def test_a_key_that_lives_with_its_run_outlasts_the_ttl(api, engine):
    lasting = await submit(api, key="cell", headers={"Idempotency-Key-Lifetime": "run"})
    short = await submit(api, key="rest")
    await asyncio.sleep(0.5)
    await engine.upkeep.sweep()  # the sweep also purges keys past their time
    again = await submit(api, key="cell", headers={"Idempotency-Key-Lifetime": "run"})
    assert again.status_code == 200 and again.json()["run_id"] == lasting.json()["run_id"]
    assert (await submit(api, key="rest")).json()["run_id"] != short.json()["run_id"]
    # Deleting the run takes its key with it.
    await wait_run(api, lasting.json()["run_id"])
    assert (await api.delete(f"runs/{lasting.json()['run_id']}")).status_code == 204
    assert (
        await submit(api, key="cell", headers={"Idempotency-Key-Lifetime": "run"})
    ).status_code == 201


async def test_an_unknown_key_lifetime_is_400_and_stores_nothing(api):
    response = await submit(api, key="k", headers={"Idempotency-Key-Lifetime": "forever"})
    assert response.status_code == 400 and response.json()["error"] == "invalid_idempotency_key"
    assert await count_runs(api) == 0
