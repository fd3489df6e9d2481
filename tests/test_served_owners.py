"""Servers of different users sharing one store take over and start only their own users' runs.

Alice's server and Bob's share a store (both stores: one SQLite file, or one
PostgreSQL schema), each a real ``jupyter server`` process in per-user mode.
Bob's server has an agent named ``demo`` of its own. When Alice's server
stops or dies, Bob's must never run her runs with its agents (its keys, its
tools, its ``demo``): her resumable and queued runs wait for her server and
finish there. Only a run that nobody would resume may be ended by any server.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from jupyter_agentruns.agents.demo import answer_words

from servers import ServerProcess, wait_status

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}
ALICE = {"X-Test-User": "alice"}
SLOW = {"prompt": "alice's question", "chunks": 300, "delay": 0.01}
QUICK = {"prompt": "next", "chunks": 5, "delay": 0, "tools": False}
LONG_COUNT = {"n": 4000, "sleep": 0.01}
PER_USER = {"ServerApp": {"identity_provider_class": "identity.HeaderIdentityProvider"}}
LEASE = 1.5
# Long enough for another server to have swept the store several times and
# to have acted on an expired lease (first seen, then seen again a lease later).
SEVERAL_SWEEPS = 3 * LEASE + 1


@pytest.fixture
def servers(tmp_path, store_config):
    """``start(name, ...)`` starts servers on the test's store in parallel; all killed at the end."""
    started: list[ServerProcess] = []

    def make(name: str, hub_user: str | None = None, **agentruns) -> ServerProcess:
        config = {"lease_seconds": LEASE, "owner_mode": "per-user", **store_config, **agentruns}
        server = ServerProcess(
            tmp_path / name, tmp_path / "shared.sqlite3", config, config=PER_USER
        )
        if hub_user is not None:
            server.env["JUPYTERHUB_USER"] = hub_user
        started.append(server)
        return server

    def start(*servers: ServerProcess) -> None:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda server: server.start(), servers))

    yield make, start
    for server in started:
        server.kill()


def alices_server(make, name: str) -> ServerProcess:
    return make(name, served_owners=["alice"], agents=TEST_AGENTS)


def bobs_server(make) -> ServerProcess:
    # Served owners from JupyterHub's environment ('auto'); a demo agent of its own.
    return make("bob", hub_user="bob", agents={"demo": "agents_for_tests:forged_demo"})


def submit(server: ServerProcess, agent: str, input: dict, **body) -> dict:
    with server.client() as client:
        response = client.post("runs", json={"agent": agent, "input": input, **body}, headers=ALICE)
    assert response.status_code == 201, response.text
    return response.json()


def get(server: ServerProcess, run_id: str) -> dict:
    with server.client() as client:
        return client.get(f"runs/{run_id}", headers=ALICE).json()


def wait_seq(server: ServerProcess, run_id: str, seq: int) -> None:
    deadline = time.monotonic() + 30
    while get(server, run_id)["last_seq"] < seq:
        assert time.monotonic() < deadline, f"{run_id} never reached seq {seq}"
        time.sleep(0.05)


def finished(server: ServerProcess, run_id: str) -> dict:
    with server.client() as client:
        client.headers.update(ALICE)
        return wait_status(client, run_id, TERMINAL, timeout=60)


def event_types(server: ServerProcess, run_id: str) -> list[str]:
    with server.client() as client:
        body = client.get(f"runs/{run_id}/events", params={"limit": 1000}, headers=ALICE).json()
    return [event["type"] for event in body["events"]]


TEST_AGENTS = {"counter": "agents_for_tests:counter"}


@pytest.mark.timeout(180)
def test_runs_handed_over_at_a_clean_stop_wait_for_their_owners_server_not_another_users(
    servers,
):
    make, start = servers
    alice, bob = alices_server(make, "alice"), bobs_server(make)
    start(alice, bob)
    resumable = submit(alice, "demo", SLOW)
    first = submit(alice, "counter", LONG_COUNT, session="s")
    queued = [
        submit(alice, "demo", QUICK, session="s", session_policy="enqueue"),
        submit(alice, "counter", {"n": 3}, session="s", session_policy="enqueue"),
    ]
    wait_seq(alice, resumable["run_id"], 40)
    assert alice.terminate() == 0  # a clean stop (a cull): the resumable run is handed over

    time.sleep(SEVERAL_SWEEPS)
    # Bob's server took nothing of Alice's: her run waits as it was handed over...
    waiting = get(bob, resumable["run_id"])
    assert waiting["status"] == "running" and waiting["attempt"] == 1
    assert "run.resumed" not in event_types(bob, resumable["run_id"])
    # ...her non-resumable run ended at her server's stop, and her queue waits.
    assert get(bob, first["run_id"])["status"] == "interrupted"
    for run in queued:
        assert get(bob, run["run_id"])["status"] == "queued"

    again = alices_server(make, "alice-again")
    start(again)
    done = finished(again, resumable["run_id"])
    assert done["status"] == "succeeded" and done["attempt"] == 2
    assert done["output"]["text"] == "".join(answer_words(SLOW["prompt"], SLOW["chunks"]))
    assert [finished(again, run["run_id"])["status"] for run in queued] == ["succeeded"] * 2
    assert finished(again, queued[0]["run_id"])["output"] != {"forged": True}
    assert "took over" not in bob.log_tail(1000)


@pytest.mark.timeout(180)
def test_a_dead_servers_run_nobody_would_resume_is_ended_by_any_server_and_the_rest_wait(
    servers,
):
    make, start = servers
    alice, bob = alices_server(make, "alice"), bobs_server(make)
    start(alice, bob)
    resumable = submit(alice, "demo", SLOW)
    first = submit(alice, "counter", LONG_COUNT, session="s")
    queued = submit(alice, "demo", QUICK, session="s", session_policy="enqueue")
    wait_seq(alice, resumable["run_id"], 40)
    alice.kill()  # kill -9: no hand-over, the leases run out

    # Alice's counter run would never be resumed: Bob's server may end it.
    ended = finished(bob, first["run_id"])
    assert ended["status"] == "interrupted"
    time.sleep(SEVERAL_SWEEPS)
    # Her resumable run waits for her server; so does the run queued behind
    # the ended one, which Bob's server has an agent of the name for.
    assert get(bob, resumable["run_id"])["status"] == "running"
    assert get(bob, queued["run_id"])["status"] == "queued"

    again = alices_server(make, "alice-again")
    start(again)
    done = finished(again, resumable["run_id"])
    assert done["status"] == "succeeded" and done["attempt"] == 2
    assert done["output"]["text"] == "".join(answer_words(SLOW["prompt"], SLOW["chunks"]))
    next_run = finished(again, queued["run_id"])
    assert next_run["status"] == "succeeded" and next_run["output"] != {"forged": True}
