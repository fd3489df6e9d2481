"""ACP agents and the death of their server: no agent process outlives it, and the run goes on.

Real server processes (tests/servers.py) on either store, killed with
SIGKILL (the server process alone, as the kernel's OOM killer does) or
stopped with SIGTERM. What is left running is read from /proc.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from servers import ServerProcess, children, wait_status

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}
SCRIPTED = [sys.executable, str(Path(__file__).with_name("acp_agent.py"))]

pytestmark = pytest.mark.timeout(120)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids, timeout=30):  # a guard ends its agent in at most about 12 s
    deadline = time.monotonic() + timeout
    while any(map(alive, pids)):
        left = [pid for pid in pids if alive(pid)]
        assert time.monotonic() < deadline, f"still running: {left}"
        time.sleep(0.05)


def agent_pids(state: Path) -> list[int]:
    pids = state / "pids"
    return sorted(int(p.name) for p in pids.iterdir()) if pids.exists() else []


def helper_pids(state: Path) -> list[int]:
    helpers = state / "helpers"
    return sorted(int(p.name) for p in helpers.iterdir()) if helpers.exists() else []


@pytest.fixture
def state(tmp_path):
    path = tmp_path / "acp-state"
    path.mkdir()
    return path


@pytest.fixture
def servers(tmp_path, store_config, state):
    started = []

    def start(name):
        config = {
            "lease_seconds": 1.5,
            "acp_agents": {
                "scripted": {
                    # It outlives its stdin and starts a process of its own: only
                    # its guard ends them.
                    "command": [*SCRIPTED, "--linger", "--helper"],
                    "env": {"ACP_TEST_STATE": str(state)},
                    "resumable": True,
                    "initialize_timeout": 30,
                }
            },
            **store_config,
        }
        server = ServerProcess(tmp_path / name, tmp_path / "agentruns.sqlite3", config)
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.kill()


def events_of(client, run_id):
    return client.get(f"runs/{run_id}/events", params={"limit": 1000}).json()["events"]


def test_a_killed_servers_agent_processes_end_and_its_run_goes_on_in_the_next(
    servers, state, tmp_path
):
    notebook = {"session": "nb.ipynb"}
    first = servers("a")
    with first.client() as client:
        earlier = client.post(
            "runs", json={"agent": "scripted", "input": {"prompt": "echo first answer"}, **notebook}
        ).json()
        assert wait_status(client, earlier["run_id"], TERMINAL)["status"] == "succeeded"
        run = client.post(
            "runs", json={"agent": "scripted", "input": {"prompt": "permission"}, **notebook}
        ).json()
        [question] = wait_status(client, run["run_id"], {"waiting"})["snapshot"]["inputs"]
    [agent] = agent_pids(state)
    [helper] = helper_pids(state)
    guards = children(first.process.pid)
    assert guards and alive(agent) and alive(helper)
    os.kill(first.process.pid, signal.SIGKILL)  # the server alone: its guards see it die
    first.process.wait(10)
    wait_gone([agent, helper, *guards])

    with servers("b").client() as client:
        deadline = time.monotonic() + 30
        while (taken := client.get(f"runs/{run['run_id']}").json())["attempt"] < 2:
            assert time.monotonic() < deadline, "the run was not taken over"
            time.sleep(0.05)
        # The conversation was loaded in a new process, and the agent asked again:
        # the person still sees the one question, and answers it once.
        deadline = time.monotonic() + 30
        while len(agent_pids(state)) < 2 or len(taken["snapshot"]["tools"]) < 2:
            assert time.monotonic() < deadline, taken
            time.sleep(0.05)
            taken = client.get(f"runs/{run['run_id']}").json()
        assert taken["status"] == "waiting"
        assert taken["snapshot"]["inputs"] == [question]
        answer = client.post(
            f"runs/{run['run_id']}/inputs/{question['request_id']}", json={"choice": "allow"}
        )
        assert answer.status_code == 200
        ended = wait_status(client, run["run_id"], TERMINAL)
        assert ended["status"] == "succeeded", ended["error"]
        assert ended["output"] == {"text": "allowed", "stop_reason": "end_turn"}
        events = events_of(client, run["run_id"])
    types = [e["type"] for e in events]
    assert [e["seq"] for e in events] == list(range(1, ended["last_seq"] + 1))
    assert types.count("run.started") == 1 and types.count("run.resumed") == 1
    assert types[-1] == "run.succeeded" and sum(t.startswith("run.") for t in types) == 3
    assert types.count("input.requested") == 1 and types.count("input.resolved") == 1
    # The history session/load replayed (the earlier run's answer) is not this run's.
    assert [m["text"] for m in ended["snapshot"]["messages"]] == ["allowed"]
    first_step, second_step = ended["snapshot"]["tools"]
    assert first_step["status"] == "failed" and first_step["error"]["type"] == "interrupted"
    assert second_step["status"] == "completed" and second_step["title"] == "Run make clean"
    checkpoint_session = json.loads((state / "sessions").iterdir().__next__().read_text())
    assert [t["prompt"] for t in checkpoint_session["turns"]] == ["echo first answer", "permission"]


@pytest.mark.sqlite_only
def test_a_stopping_server_ends_its_agent_processes(servers, state):
    server = servers("a")
    with server.client() as client:
        for session in ("one", "two"):
            run = client.post(
                "runs",
                json={"agent": "scripted", "input": {"prompt": "echo hi"}, "session": session},
            ).json()
            assert wait_status(client, run["run_id"], TERMINAL)["status"] == "succeeded"
    pids = agent_pids(state) + helper_pids(state)
    assert len(pids) == 4 and all(map(alive, pids))  # kept for the next runs of their sessions
    guards = children(server.process.pid)
    assert server.terminate(timeout=30) == 0
    wait_gone([*pids, *guards], timeout=5)
