"""Crash, restart and shared-database behaviour with real server processes."""

import json
import sqlite3

import pytest

from servers import ServerProcess, wait_status

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


@pytest.fixture
def servers(tmp_path):
    started = []

    def start(name="a", **agentruns):
        server = ServerProcess(tmp_path / name, tmp_path / "agentruns.sqlite3", agentruns).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def read_events(client, run_id, count):
    """The first ``count`` event frames of a live SSE stream, as raw data lines."""
    received = []
    with client.stream(
        "GET", f"runs/{run_id}/events", headers={"Accept": "text/event-stream"}
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                received.append(line[6:])
                if len(received) == count:
                    break
    return received


def all_raw_events(client, run_id):
    body = client.get(f"runs/{run_id}/events", params={"limit": 1000}).text
    return [json.dumps(e, separators=(",", ":")) for e in json.loads(body)["events"]]


SLOW = {"prompt": "slow", "chunks": 1000, "delay": 0.02}


@pytest.mark.timeout(180)
def test_after_a_kill_and_restart_finished_runs_are_intact_and_unfinished_ones_end_interrupted(
    servers,
):
    # Runs that cannot be taken over (no attempts left): see test_resume.py for those that are.
    first = servers("a", lease_seconds=1.5, max_resume_attempts=0)
    with first.client() as client:
        fast = client.post(
            "runs", json={"agent": "demo", "input": {"prompt": "p", "chunks": 5, "delay": 0}}
        ).json()
        fast = wait_status(client, fast["run_id"], TERMINAL)
        fast_events = all_raw_events(client, fast["run_id"])
        slow = client.post(
            "runs", json={"agent": "demo", "input": SLOW}, headers={"Idempotency-Key": "slow"}
        ).json()
        received = read_events(client, slow["run_id"], 15)
    first.kill()

    second = servers("b", lease_seconds=1.5, max_resume_attempts=0)
    with second.client() as client:
        again = client.get(f"runs/{fast['run_id']}").json()
        assert again == fast
        assert all_raw_events(client, fast["run_id"]) == fast_events

        run = wait_status(client, slow["run_id"], TERMINAL, timeout=30)
        assert run["status"] == "interrupted"
        events = all_raw_events(client, slow["run_id"])
        # Everything a client received before the kill is stored, byte for byte.
        assert events[: len(received)] == received
        parsed = [json.loads(e) for e in events]
        assert [e["seq"] for e in parsed] == list(range(1, run["last_seq"] + 1))
        assert parsed[-1]["type"] == "run.interrupted"
        assert parsed[-1]["data"] == {"reason": "lease_expired"}
        text = "".join(e["data"]["delta"] for e in parsed if e["type"] == "text.delta")
        assert run["snapshot"]["messages"][0]["text"] == text
        # Re-submitting with the same key finds the same run, never a second one.
        replay = client.post(
            "runs", json={"agent": "demo", "input": SLOW}, headers={"Idempotency-Key": "slow"}
        )
        assert replay.status_code == 200 and replay.json()["run_id"] == slow["run_id"]


@pytest.mark.timeout(120)
def test_a_clean_stop_ends_live_runs_interrupted_with_server_shutdown(servers, tmp_path):
    server = servers("a", max_resume_attempts=0)  # else the demo's run is handed over
    with server.client() as client:
        slow = client.post("runs", json={"agent": "demo", "input": SLOW}).json()
        read_events(client, slow["run_id"], 5)
    server.terminate()
    db = sqlite3.connect(tmp_path / "agentruns.sqlite3")
    status, last_seq = db.execute(
        "SELECT status, last_seq FROM runs WHERE run_id = ?", [slow["run_id"]]
    ).fetchone()
    seq, type, data = db.execute(
        "SELECT seq, type, data FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
        [slow["run_id"]],
    ).fetchone()
    db.close()
    assert status == "interrupted"
    assert (seq, type, data) == (last_seq, "run.interrupted", '{"reason":"server_shutdown"}')


@pytest.mark.timeout(120)
def test_two_live_servers_on_one_database_never_interrupt_each_others_runs(servers):
    a = servers("a", lease_seconds=1)
    b = servers("b", lease_seconds=1)
    with a.client() as client_a, b.client() as client_b:
        run = client_a.post(
            "runs", json={"agent": "demo", "input": {"prompt": "p", "chunks": 60, "delay": 0.05}}
        ).json()
        # B sweeps for expired leases three times a second while A executes for ~3 s.
        seen_by_b = wait_status(client_b, run["run_id"], TERMINAL, timeout=60)
        assert seen_by_b["status"] == "succeeded"
        # B can also stream the run A executed.
        events = all_raw_events(client_b, run["run_id"])
        assert len(events) == seen_by_b["last_seq"]


@pytest.mark.timeout(120)
def test_a_cancel_sent_to_another_server_on_the_same_database_takes_effect(servers):
    a = servers("a")
    b = servers("b")
    with a.client() as client_a, b.client() as client_b:
        run = client_a.post("runs", json={"agent": "demo", "input": SLOW}).json()
        read_events(client_a, run["run_id"], 3)
        response = client_b.post(f"runs/{run['run_id']}/cancel", json={"reason": "from b"})
        assert response.status_code == 202
        # B answers with the run as it will be, though A has not taken the cancel yet.
        assert response.json()["status"] == "cancelling"
        assert (
            response.json()["cancel"]["reason"] == "from b"
            and response.json()["cancel"]["requested_at"]
        )
        assert client_b.post(f"runs/{run['run_id']}/cancel").status_code == 200
        finished = wait_status(client_b, run["run_id"], TERMINAL, timeout=30)
        assert finished["status"] == "cancelled"
        assert finished["cancel"]["reason"] == "from b"
        events = [json.loads(e) for e in all_raw_events(client_a, run["run_id"])]
        types = [e["type"] for e in events]
        assert types[-1] == "run.cancelled" and types.count("run.cancel_requested") == 1
        # Between the request and the end, only the end of a step the cancel cut
        # short (a cancel that came during a tool call): nothing more of the agent.
        between = events[types.index("run.cancel_requested") + 1 : -1]
        assert all(
            e["type"] == "tool.completed" and e["data"]["error"]["type"] == "cancelled"
            for e in between
        ), between


@pytest.mark.timeout(180)
def test_runs_queued_in_a_session_start_in_submit_order_after_a_kill_and_a_restart(servers):
    first = servers("a", lease_seconds=1.5, max_resume_attempts=0)
    quick = {"prompt": "q", "chunks": 3, "delay": 0, "tools": False}
    with first.client() as client:
        running = client.post("runs", json={"agent": "demo", "input": SLOW, "session": "s"}).json()
        queued = [
            client.post(
                "runs",
                json={"agent": "demo", "input": quick, "session": "s", "session_policy": "enqueue"},
            ).json()
            for _ in range(3)
        ]
        read_events(client, running["run_id"], 3)
        assert [run["status"] for run in queued] == ["queued"] * 3
    first.kill()

    second = servers("b", lease_seconds=1.5, max_resume_attempts=0)
    with second.client() as client:
        ended = wait_status(client, running["run_id"], TERMINAL)
        assert ended["status"] == "interrupted"
        runs = [wait_status(client, run["run_id"], TERMINAL) for run in queued]
        assert [run["status"] for run in runs] == ["succeeded"] * 3
        assert ended["finished_at"] <= runs[0]["started_at"]
        assert runs[0]["finished_at"] <= runs[1]["started_at"]
        assert runs[1]["finished_at"] <= runs[2]["started_at"]


@pytest.mark.timeout(120)
def test_a_clean_stop_leaves_a_session_s_queue_for_the_next_server(servers, tmp_path):
    server = servers("a", max_resume_attempts=0)
    quick = {"prompt": "q", "chunks": 3, "delay": 0, "tools": False}
    with server.client() as client:
        running = client.post("runs", json={"agent": "demo", "input": SLOW, "session": "s"}).json()
        queued = client.post(
            "runs",
            json={"agent": "demo", "input": quick, "session": "s", "session_policy": "enqueue"},
        ).json()
        read_events(client, running["run_id"], 3)
    server.terminate()
    db = sqlite3.connect(tmp_path / "agentruns.sqlite3")
    rows = dict(db.execute("SELECT run_id, status FROM runs").fetchall())
    db.close()
    assert rows == {running["run_id"]: "interrupted", queued["run_id"]: "queued"}
    with servers("b").client() as client:
        assert wait_status(client, queued["run_id"], TERMINAL)["status"] == "succeeded"


@pytest.mark.timeout(120)
def test_session_policies_hold_across_servers_sharing_the_store(servers):
    a = servers("a")
    b = servers("b")
    quick = {"prompt": "q", "chunks": 3, "delay": 0, "tools": False}
    with a.client() as client_a, b.client() as client_b:
        running = client_a.post(
            "runs", json={"agent": "demo", "input": SLOW, "session": "s"}
        ).json()
        read_events(client_a, running["run_id"], 3)
        busy = client_b.post(
            "runs",
            json={"agent": "demo", "input": quick, "session": "s", "session_policy": "reject"},
        )
        assert busy.status_code == 409 and busy.json()["active_run_id"] == running["run_id"]
        # B interrupts the run A executes: A takes the cancel, B (or A) starts the new run.
        newest = client_b.post(
            "runs",
            json={"agent": "demo", "input": quick, "session": "s", "session_policy": "interrupt"},
        ).json()
        assert newest["status"] == "queued"
        old = wait_status(client_b, running["run_id"], TERMINAL)
        assert old["status"] == "cancelled"
        assert old["cancel"]["reason"] == {"interrupted_by": newest["run_id"]}
        done = wait_status(client_a, newest["run_id"], TERMINAL)
        assert done["status"] == "succeeded" and old["finished_at"] <= done["started_at"]


@pytest.mark.timeout(120)
def test_a_day_s_token_budget_counts_the_runs_of_every_server_sharing_the_store(servers):
    budget = {"agents": {"spender": "agents_for_tests:spender"}, "tokens_per_user_per_day": 100}
    a = servers("a", **budget)
    b = servers("b", **budget)
    with a.client() as client_a, b.client() as client_b:
        run = client_a.post(
            "runs", json={"agent": "spender", "input": {"steps": [[60, 30]]}}
        ).json()
        assert wait_status(client_a, run["run_id"], TERMINAL)["status"] == "succeeded"
        assert client_b.get("usage").json()["input_tokens"] == 60
        # B's run crosses the day that A's run began: it fails at that usage event.
        crossing = client_b.post(
            "runs", json={"agent": "spender", "input": {"steps": [[5, 5], [10, 10]]}}
        ).json()
        failed = wait_status(client_b, crossing["run_id"], TERMINAL)
        assert failed["status"] == "failed"
        assert failed["error"]["type"] == "token_budget_exceeded"
        refused = client_a.post("runs", json={"agent": "spender", "input": {"steps": [[1, 1]]}})
        assert refused.status_code == 429
        assert refused.json()["error"] == "token_budget_exhausted"


ASKING = {"prompt": "p", "chunks": 3, "delay": 0, "ask": True}


@pytest.mark.timeout(120)
def test_a_question_answered_on_another_server_resumes_the_run_where_it_waits(servers):
    a = servers("a")
    b = servers("b")
    with a.client() as client_a, b.client() as client_b:
        run = client_a.post("runs", json={"agent": "demo", "input": ASKING}).json()
        [question] = wait_status(client_a, run["run_id"], {"waiting"})["snapshot"]["inputs"]
        url = f"runs/{run['run_id']}/inputs/{question['request_id']}"
        answered = client_b.post(url, json={"choice": "approve"})
        assert answered.status_code == 200
        # B waited until A took the answer: the run object says so.
        assert answered.json()["snapshot"]["inputs"][0]["choice"] == "approve"
        assert client_b.post(url, json={"choice": "deny"}).status_code == 409
        assert wait_status(client_b, run["run_id"], TERMINAL)["status"] == "succeeded"


@pytest.mark.timeout(120)
def test_a_run_waiting_when_its_server_is_killed_ends_interrupted_with_its_question_given_up(
    servers,
):
    # With no takeover left (test_resume.py has the run taken over, still waiting).
    first = servers("a", lease_seconds=1.5, max_resume_attempts=0)
    with first.client() as client:
        run = client.post("runs", json={"agent": "demo", "input": ASKING}).json()
        [question] = wait_status(client, run["run_id"], {"waiting"})["snapshot"]["inputs"]
    first.kill()
    with servers("b", lease_seconds=1.5, max_resume_attempts=0).client() as client:
        ended = wait_status(client, run["run_id"], TERMINAL)
        assert ended["status"] == "interrupted"
        [given_up] = ended["snapshot"]["inputs"]
        assert given_up["status"] == "resolved" and given_up["reason"] == "cancelled"
        events = all_raw_events(client, run["run_id"])
        assert [json.loads(e)["type"] for e in events][-2:] == ["input.resolved", "run.interrupted"]
        late = client.post(
            f"runs/{run['run_id']}/inputs/{question['request_id']}", json={"choice": "approve"}
        )
        assert late.status_code == 409
