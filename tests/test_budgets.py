"""Token budgets: per run, per owner over a sliding day (across servers sharing the store), GET usage."""

import asyncio
import time

import pytest
import rawdb
from traitlets import TraitError

from jupyter_agentruns.app import AgentRuns
from jupyter_agentruns.timeutil import iso

from agents_for_tests import TEST_AGENTS
from conftest import all_events, submit, wait_run

PER_USER = {"identity_provider_class": "identity.HeaderIdentityProvider"}
ALICE = {"X-Test-User": "alice"}
BOB = {"X-Test-User": "bob"}


def spend(*steps, **extra):
    return {"steps": [list(step) for step in steps], **extra}


async def run_to_end(api, input, headers=None):
    response = await submit(api, "spender", input, headers=headers)
    assert response.status_code == 201, response.text
    return await wait_run(api, response.json()["run_id"], headers=headers)


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS, "max_tokens_per_run": 100}])
async def test_a_run_fails_at_the_usage_event_that_crosses_max_tokens_per_run(api):
    run = await run_to_end(api, spend((10, 20), (40, 50), (60, 70), (80, 90)))
    assert run["status"] == "failed"
    assert run["error"]["type"] == "token_budget_exceeded"
    assert (
        "130 tokens" in run["error"]["message"]
        and "max_tokens_per_run (100)" in run["error"]["message"]
    )
    events = await all_events(api, run["run_id"])
    types = [e["type"] for e in events]
    # The crossing usage event is kept, and nothing of the agent's comes after it.
    assert types[-2:] == ["usage", "run.failed"]
    assert events[-2]["data"] == {"input_tokens": 60, "output_tokens": 70}
    assert run["snapshot"]["usage"] == {"input_tokens": 60, "output_tokens": 70}
    # Exactly at the limit is within it.
    ok = await run_to_end(api, spend((50, 50)))
    assert ok["status"] == "succeeded"


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS, "max_tokens_per_run": 100}])
async def test_a_step_open_when_its_run_crosses_its_token_budget_ends_with_the_run(api):
    run = await run_to_end(api, spend((60, 70), in_step=True))
    assert run["status"] == "failed" and run["error"]["type"] == "token_budget_exceeded"
    events = await all_events(api, run["run_id"])
    # Over its budget the agent adds nothing more, but its end still closes its step.
    assert [e["type"] for e in events][-3:] == ["usage", "tool.completed", "run.failed"]
    cut = {"type": "cancelled", "message": "the run failed before this step ended"}
    assert events[-2]["data"] == {"call_id": "c1", "ok": False, "error": cut}
    assert run["snapshot"]["tools"][0]["status"] == "failed"


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS, "max_tokens_per_run": 100}])
async def test_an_agent_that_catches_the_budget_error_still_fails_and_emits_nothing_more(api):
    run = await run_to_end(api, spend((80, 80), (90, 90), swallow=True))
    assert run["status"] == "failed" and run["error"]["type"] == "token_budget_exceeded"
    events = await all_events(api, run["run_id"])
    assert [e["type"] for e in events][-2:] == ["usage", "run.failed"]
    assert not any("regardless" in e["data"].get("delta", "") for e in events)


@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize(
    "agentruns_config", [{"agents": TEST_AGENTS, "tokens_per_user_per_day": 200}]
)
async def test_a_day_budget_per_owner_fails_the_crossing_run_then_refuses_submits(
    api, jp_serverapp
):
    assert (await run_to_end(api, spend((100, 50)), ALICE))["status"] == "succeeded"
    usage = (await api.get("usage", headers=ALICE)).json()
    assert usage == {"window_seconds": 86400, "input_tokens": 100, "output_tokens": 50, "runs": 1}
    assert (await api.get("usage", headers=BOB)).json()["runs"] == 0
    # The next run crosses the owner's day (150 + 60 > 200) and fails at that usage event.
    crossing = await run_to_end(api, spend((10, 10), (30, 30)), ALICE)
    assert crossing["status"] == "failed"
    assert crossing["error"]["type"] == "token_budget_exceeded"
    assert "tokens_per_user_per_day (200)" in crossing["error"]["message"]
    # 210 used: a submit is refused, with when the window frees up, and stores nothing.
    refused = await submit(api, "spender", spend((1, 1)), headers={**ALICE, "Idempotency-Key": "k"})
    assert refused.status_code == 429
    assert refused.json()["error"] == "token_budget_exhausted"
    assert 86000 < int(refused.headers["Retry-After"]) <= 86400
    assert len((await api.get("runs", headers=ALICE)).json()["runs"]) == 2
    # Bob has his own day.
    assert (await run_to_end(api, spend((100, 90)), BOB))["status"] == "succeeded"
    # Once Alice's first run is older than a day, she is under the limit again.
    db = rawdb.connect(rawdb.target(jp_serverapp.web_app.settings["agentruns_engine"]))
    first = (await api.get("runs", headers=ALICE)).json()["runs"][-1]["run_id"]
    with db:
        db.execute(
            "UPDATE runs SET created_at = '2020-01-01T00:00:00.000Z' WHERE run_id = ?", [first]
        )
    db.close()
    assert (await api.get("usage", headers=ALICE)).json() == {
        "window_seconds": 86400, "input_tokens": 30, "output_tokens": 30, "runs": 1,
    }  # fmt: skip
    assert (await run_to_end(api, spend((5, 5)), ALICE))["status"] == "succeeded"


@pytest.mark.parametrize(
    "agentruns_config", [{"agents": TEST_AGENTS, "tokens_per_user_per_day": 1000}]
)
async def test_retry_after_says_when_enough_of_the_day_leaves_the_window(api, jp_serverapp):
    for steps in ((300, 0), (300, 0), (400, 0)):
        assert (await run_to_end(api, spend(steps)))["status"] == "succeeded"
    runs = (await api.get("runs")).json()["runs"][::-1]  # oldest first
    db = rawdb.connect(rawdb.target(jp_serverapp.web_app.settings["agentruns_engine"]))
    now = time.time()
    with db:  # the first two runs were made 23 h 50 min and 23 h 40 min ago
        for run, age in zip(runs[:2], (86400 - 600, 86400 - 1200), strict=True):
            db.execute(
                "UPDATE runs SET created_at = ? WHERE run_id = ?", [iso(now - age), run["run_id"]]
            )
    db.close()
    refused = await submit(api, "spender", spend((1, 1)))
    assert refused.status_code == 429
    # 1000 used: once the first leaves (in ~600 s) 700 remain, under the limit.
    assert 590 <= int(refused.headers["Retry-After"]) <= 601


async def test_usage_counts_only_the_caller_s_runs_of_the_last_day(api):
    assert (await api.get("usage")).json() == {
        "window_seconds": 86400, "input_tokens": 0, "output_tokens": 0, "runs": 0,
    }  # fmt: skip
    run = await submit(api, input={"prompt": "two words", "chunks": 3, "delay": 0})
    await wait_run(api, run.json()["run_id"])
    # The demo agent reports the prompt's words in and its chunks out.
    assert (await api.get("usage")).json() == {
        "window_seconds": 86400, "input_tokens": 2, "output_tokens": 3, "runs": 1,
    }  # fmt: skip


def test_a_negative_token_limit_is_refused():
    with pytest.raises(TraitError, match="max_tokens_per_run"):
        AgentRuns(max_tokens_per_run=-1)


async def twice_the_same_total(run, input):
    await run.usage(input_tokens=600, output_tokens=0)
    await asyncio.sleep(0.3)
    await run.usage(input_tokens=600, output_tokens=0)  # the same total: nothing more spent
    return {}


@pytest.mark.parametrize(
    "agentruns_config",
    [
        {
            "agents": {"twice": "test_budgets:twice_the_same_total"},
            "tokens_per_user_per_day": 1000,
        }
    ],
)
async def test_a_run_started_during_a_refresh_of_the_day_is_counted_once(api, engine):
    keep = (await submit(api, input={"prompt": "p", "chunks": 1000, "delay": 0.05})).json()
    real = engine.reader.run

    def slow(fn):
        async def later():
            await asyncio.sleep(0.15)  # a busy reader pool
            return await real(fn)

        return asyncio.ensure_future(later())

    engine.reader.run = slow
    refresh = asyncio.ensure_future(engine.budgets.refresh())
    await asyncio.sleep(0)
    engine.reader.run = real
    run = (await submit(api, "twice", {})).json()
    await refresh
    done = await wait_run(api, run["run_id"])
    await api.post(f"runs/{keep['run_id']}/cancel")
    assert done["status"] == "succeeded", done["error"]


@pytest.mark.parametrize("agentruns_config", [{"agents": TEST_AGENTS}])
@pytest.mark.parametrize(
    "usage", [(10**20, 0), (-1000, 5), (2**53 + 1, 0), (1.5, 2), ("many", 0), (True, 1)]
)
async def test_usage_that_is_not_token_counts_is_refused_to_the_agent_and_changes_nothing(
    api, usage
):
    """Stored, 10**20 tokens failed every run in the writer's batch; now only the agent hears of it."""
    others = [
        (await submit(api, "spender", spend(*[(1, 1)] * 20))).json()["run_id"] for _ in range(3)
    ]
    caught = await run_to_end(api, spend((5, 5), usage, (7, 7), swallow=True))
    assert caught["status"] == "succeeded"
    assert caught["snapshot"]["usage"] == {"input_tokens": 7, "output_tokens": 7}
    events = await all_events(api, caught["run_id"])
    assert [e["data"] for e in events if e["type"] == "usage"] == [
        {"input_tokens": 5, "output_tokens": 5},
        {"input_tokens": 7, "output_tokens": 7},
    ]
    uncaught = await run_to_end(api, spend((5, 5), usage))
    assert uncaught["status"] == "failed" and uncaught["error"]["type"] == "ValueError"
    assert "must be an integer from 0 to 2**53" in uncaught["error"]["message"]
    for run_id in others:
        assert (await wait_run(api, run_id))["status"] == "succeeded"


# budget_exceeded = "ask": a run at its limit asks a person for more ----------------

ASK = {"agents": TEST_AGENTS, "budget_exceeded": "ask"}


async def open_question(api, run_id, headers=None, timeout=30):
    """The run's one open question, once it waits for it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        run = (await api.get(f"runs/{run_id}", headers=headers)).json()
        if run["status"] == "waiting":
            [question] = [q for q in run["snapshot"]["inputs"] if q["status"] == "open"]
            return question
        assert run["status"] not in ("succeeded", "failed", "cancelled", "interrupted"), run
        assert asyncio.get_running_loop().time() < deadline, f"{run_id} never asked"
        await asyncio.sleep(0.02)


async def answer(api, run_id, question, choice, headers=None):
    response = await api.post(
        f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": choice}, headers=headers
    )
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("agentruns_config", [{**ASK, "max_tokens_per_run": 100}])
async def test_a_run_at_its_limit_asks_and_approving_raises_the_limit_by_what_it_offered(api):
    started = await submit(api, "spender", spend((60, 70), (80, 90), (100, 140)))
    run_id = started.json()["run_id"]
    question = await open_question(api, run_id)
    # 130 used of 100: another run's budget beyond what it used.
    assert question["kind"] == "budget" and question["choices"] == ["approve", "deny"]
    assert question["details"] == {
        "budget": "run", "used": 130, "limit": 100, "more": 130,
        "message": "the run used 130 tokens, over max_tokens_per_run (100)",
    }  # fmt: skip
    assert question["title"].startswith("Allow 130 more tokens?")
    # Nothing of the agent's follows the crossing usage event while it waits.
    events = (await api.get(f"runs/{run_id}/events", params={"limit": 1000})).json()["events"]
    assert [e["type"] for e in events][-2:] == ["usage", "input.requested"]
    await answer(api, run_id, question, "approve")
    # 170 is within 230; 240 is over it, and asks again, for 240 - 230 + 100.
    again = await open_question(api, run_id)
    assert again["request_id"] != question["request_id"]
    assert (again["details"]["used"], again["details"]["limit"], again["details"]["more"]) == (
        240, 230, 110,
    )  # fmt: skip
    await answer(api, run_id, again, "approve")
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded" and run["output"] == {"spent": [[100, 140]]}
    types = [e["type"] for e in await all_events(api, run_id)]
    assert types.count("input.requested") == 2 and types.count("usage") == 3


@pytest.mark.parametrize("agentruns_config", [{**ASK, "max_tokens_per_run": 100}])
async def test_denying_more_tokens_fails_the_run_and_the_agent_writes_nothing_more(api):
    started = await submit(api, "spender", spend((60, 70), (1, 1), swallow=True))
    run_id = started.json()["run_id"]
    await answer(api, run_id, await open_question(api, run_id), "deny")
    run = await wait_run(api, run_id)
    assert run["status"] == "failed" and run["error"]["type"] == "token_budget_exceeded"
    assert "130 tokens" in run["error"]["message"]
    assert "did not allow more" in run["error"]["message"]
    types = [e["type"] for e in await all_events(api, run_id)]
    # The agent caught the error and tried to go on: none of it is in the log.
    assert types[-4:] == ["usage", "input.requested", "input.resolved", "run.failed"]


@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize("agentruns_config", [{**ASK, "tokens_per_user_per_day": 200}])
async def test_a_run_that_crosses_its_owners_day_asks_for_a_tenth_of_the_day_more(api):
    assert (await run_to_end(api, spend((100, 50)), ALICE))["status"] == "succeeded"
    started = await submit(api, "spender", spend((10, 10), (30, 30)), headers=ALICE)
    run_id = started.json()["run_id"]
    question = await open_question(api, run_id, ALICE)
    # 150 + 60 = 210 of 200: allow 10 over it and a tenth of the day (20).
    assert question["details"]["budget"] == "day"
    assert (question["details"]["used"], question["details"]["more"]) == (210, 30)
    assert "tokens_per_user_per_day (200)" in question["details"]["message"]
    await answer(api, run_id, question, "approve", ALICE)
    run = await wait_run(api, run_id, headers=ALICE)
    assert run["status"] == "succeeded"
    # The allowance was the run's: a new run of the owner is still refused.
    refused = await submit(api, "spender", spend((1, 1)), headers=ALICE)
    assert refused.status_code == 429


@pytest.mark.parametrize("agentruns_config", [ASK])
async def test_an_agent_cannot_ask_the_servers_budget_question(api):
    started = await submit(api, "asker", {"questions": [{"title": "More?", "kind": "budget"}]})
    run = await wait_run(api, started.json()["run_id"])
    assert run["status"] == "failed"
    assert "the server's own question" in run["error"]["message"]
    assert "inputs" not in run["snapshot"]


def test_a_budget_question_open_when_its_server_was_killed_is_answered_on_the_next(tmp_path):
    """Approved on the server that took the run over: it goes on with its raised limit, asked once."""
    from servers import ServerProcess, wait_status

    config = {"lease_seconds": 1.5, "budget_exceeded": "ask", "max_tokens_per_run": 10}
    first = ServerProcess(tmp_path / "a", tmp_path / "agentruns.sqlite3", config).start()
    try:
        with first.client() as client:
            input = {"prompt": "two words", "chunks": 20, "delay": 0, "tools": False}
            run = client.post("runs", json={"agent": "demo", "input": input}).json()
            waiting = wait_status(client, run["run_id"], {"waiting"})
        [question] = waiting["snapshot"]["inputs"]
        assert question["kind"] == "budget" and question["details"]["used"] == 22
    finally:
        first.kill()
    second = ServerProcess(tmp_path / "b", tmp_path / "agentruns.sqlite3", config).start()
    try:
        with second.client() as client:
            deadline = time.monotonic() + 20
            while client.get(f"runs/{run['run_id']}").json()["attempt"] < 2:
                assert time.monotonic() < deadline, "the run was not taken over"
                time.sleep(0.05)
            taken = client.get(f"runs/{run['run_id']}").json()
            assert taken["status"] == "waiting" and taken["snapshot"]["inputs"] == [question]
            response = client.post(
                f"runs/{run['run_id']}/inputs/{question['request_id']}", json={"choice": "approve"}
            )
            assert response.status_code == 200, response.text
            ended = wait_status(client, run["run_id"], {"succeeded", "failed"})
            assert ended["status"] == "succeeded", ended.get("error")
            types = [
                e["type"]
                for e in client.get(f"runs/{run['run_id']}/events", params={"limit": 1000}).json()[
                    "events"
                ]
            ]
            assert types.count("input.requested") == 1 and types.count("input.resolved") == 1
    finally:
        second.kill()
