"""Resumable runs: a run survives the death of its server and goes on where it was.

Real server processes, killed (SIGKILL) or stopped (SIGTERM) mid-run, on
either store. The demo agent is resumable: a resumed run must end with
exactly the text and tool calls of an uninterrupted one, and its log must
read as one run.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from jupyter_agentruns.agents.demo import answer_words

from servers import ServerProcess, wait_status

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}
SLOW = {"prompt": "resume me", "chunks": 400, "delay": 0.01}


@pytest.fixture
def servers(tmp_path, store_config):
    started = []

    def start(name="a", extra_path=None, **agentruns):
        config = {"lease_seconds": 1.5, **store_config, **agentruns}
        server = ServerProcess(tmp_path / name, tmp_path / "agentruns.sqlite3", config)
        if extra_path is not None:  # where an agent's module is
            server.env["PYTHONPATH"] = os.pathsep.join([extra_path, server.env["PYTHONPATH"]])
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.kill()


def wait_seq(client, run_id, seq, timeout=30):
    deadline = time.monotonic() + timeout
    while client.get(f"runs/{run_id}").json()["last_seq"] < seq:
        assert time.monotonic() < deadline, f"{run_id} never reached seq {seq}"
        time.sleep(0.02)


def raw_events(client, run_id):
    """Every stored event as served, byte for byte (one JSON page per 1000)."""
    events, after = [], 0
    while True:
        body = json.loads(
            client.get(f"runs/{run_id}/events", params={"after": after, "limit": 1000}).text
        )
        events += [json.dumps(e, separators=(",", ":")) for e in body["events"]]
        if not body["events"]:
            return events
        after = body["events"][-1]["seq"]


def check_reads_as_one_run(client, run, prompt=SLOW["prompt"], chunks=SLOW["chunks"]):
    """Contiguous seqs, one terminal event, last; each tool called once; the uninterrupted text."""
    events = [json.loads(e) for e in raw_events(client, run["run_id"])]
    types = [e["type"] for e in events]
    assert [e["seq"] for e in events] == list(range(1, run["last_seq"] + 1))
    assert sum(t in ("run.succeeded", "run.failed", "run.cancelled", "run.interrupted")
               for t in types) == 1 and types[-1].startswith("run.")  # fmt: skip
    assert types.count("run.started") == 1
    started = [e["data"]["name"] for e in events if e["type"] == "tool.started"]
    assert started == ["search", "summarize"]  # never a completed call again
    text = "".join(e["data"]["delta"] for e in events if e["type"] == "text.delta")
    assert text == "".join(answer_words(prompt, chunks))
    assert run["snapshot"]["messages"][0]["text"] == text
    assert run["output"]["text"] == text
    return events


@pytest.mark.timeout(120)
def test_a_killed_servers_run_is_taken_over_and_ends_as_if_never_interrupted(servers):
    first = servers("a")
    with first.client() as client:
        run = client.post("runs", json={"agent": "demo", "input": SLOW}).json()
        wait_seq(client, run["run_id"], 60)
        before = raw_events(client, run["run_id"])
    first.kill()

    with servers("b").client() as client:
        ended = wait_status(client, run["run_id"], TERMINAL)
        assert ended["status"] == "succeeded" and ended["attempt"] == 2
        events = check_reads_as_one_run(client, ended)
        # Every event served before the kill is stored as it was.
        assert raw_events(client, run["run_id"])[: len(before)] == before
        [resumed] = [e for e in events if e["type"] == "run.resumed"]
        assert resumed["data"]["attempt"] == 2 and resumed["data"]["reason"] == "lease_expired"
        assert resumed["data"]["from_seq"] == resumed["seq"] - 1 >= len(before)


@pytest.mark.timeout(180)
def test_a_clean_stop_hands_a_resumable_run_to_the_next_server_at_once(servers):
    """Every way a hub stops a server is a stop, not a crash: SIGINT is its spawners' way.

    One run, handed on by each way in turn: each next server takes it over at
    once, long before the lease of the one stopped would expire.
    """
    server = servers("a", lease_seconds=30)  # a lease long enough to show it is not waited for
    with server.client() as client:
        run = client.post("runs", json={"agent": "demo", "input": SLOW}).json()
    for attempt, stop in enumerate(["SIGTERM", "SIGINT", "api/shutdown"], start=2):
        with server.client() as client:
            wait_seq(
                client, run["run_id"], client.get(f"runs/{run['run_id']}").json()["last_seq"] + 30
            )
        if stop == "api/shutdown":
            shutdown = httpx.post(f"{server.url}api/shutdown", headers=server.client().headers)
            assert shutdown.status_code == 200
            assert server.process.wait(30) == 0
        else:
            assert server.terminate(timeout=30, sig=getattr(signal, stop)) == 0, stop
        server = servers(f"after-{attempt}", lease_seconds=30)
        with server.client() as client:
            deadline = time.monotonic() + 20
            while (taken := client.get(f"runs/{run['run_id']}").json())["attempt"] < attempt:
                assert time.monotonic() < deadline, f"the run was not taken over after {stop}"
                time.sleep(0.05)
            assert taken["status"] == "running", (stop, taken["status"])

    with server.client() as client:
        ended = wait_status(client, run["run_id"], TERMINAL, timeout=25)
        assert ended["status"] == "succeeded" and ended["attempt"] == 4
        events = check_reads_as_one_run(client, ended)
        resumed = [e["data"] for e in events if e["type"] == "run.resumed"]
        assert [(r["attempt"], r["reason"]) for r in resumed] == [
            (2, "server_shutdown"),
            (3, "server_shutdown"),
            (4, "server_shutdown"),
        ]
        assert "run.interrupted" not in [e["type"] for e in events]


@pytest.mark.timeout(120)
def test_a_question_open_when_the_server_died_is_still_open_after_the_takeover(servers):
    asking = {"prompt": "approve me", "chunks": 5, "delay": 0, "ask": True}
    first = servers("a")
    with first.client() as client:
        run = client.post("runs", json={"agent": "demo", "input": asking}).json()
        [question] = wait_status(client, run["run_id"], {"waiting"})["snapshot"]["inputs"]
    first.kill()

    with servers("b").client() as client:
        deadline = time.monotonic() + 20
        while client.get(f"runs/{run['run_id']}").json()["attempt"] < 2:
            assert time.monotonic() < deadline, "the run was not taken over"
            time.sleep(0.05)
        taken = client.get(f"runs/{run['run_id']}").json()
        assert taken["status"] == "waiting"
        assert taken["snapshot"]["inputs"] == [question]  # the same question, still open
        answer = client.post(
            f"runs/{run['run_id']}/inputs/{question['request_id']}", json={"choice": "approve"}
        )
        assert answer.status_code == 200
        ended = wait_status(client, run["run_id"], TERMINAL)
        assert ended["status"] == "succeeded"
        check_reads_as_one_run(client, ended, asking["prompt"], asking["chunks"])
        types = [json.loads(e)["type"] for e in raw_events(client, run["run_id"])]
        assert types.count("input.requested") == 1 and types.count("input.resolved") == 1


@pytest.mark.timeout(180)
def test_after_max_resume_attempts_takeovers_the_run_ends_interrupted(servers):
    server = servers("a", max_resume_attempts=1)
    with server.client() as client:
        run = client.post("runs", json={"agent": "demo", "input": SLOW}).json()
        wait_seq(client, run["run_id"], 20)
    server.kill()
    server = servers("b", max_resume_attempts=1)
    with server.client() as client:
        deadline = time.monotonic() + 20
        while client.get(f"runs/{run['run_id']}").json()["attempt"] < 2:
            assert time.monotonic() < deadline, "the run was not taken over"
            time.sleep(0.05)
    server.kill()
    with servers("c", max_resume_attempts=1).client() as client:
        ended = wait_status(client, run["run_id"], TERMINAL)
        assert ended["status"] == "interrupted" and ended["attempt"] == 2
        events = [json.loads(e) for e in raw_events(client, run["run_id"])]
        assert [e["seq"] for e in events] == list(range(1, ended["last_seq"] + 1))
        assert events[-1]["type"] == "run.interrupted"
        assert events[-1]["data"] == {"reason": "lease_expired"}


@pytest.mark.timeout(400)
def test_a_run_killed_again_and_again_still_ends_with_the_uninterrupted_answer(servers):
    """Killed at a different point each time, restarted each time: one run, one answer."""
    kills = 6
    config = {"max_resume_attempts": kills + 1, "lease_seconds": 1}
    server = servers("s0", **config)
    # Still going at the last kill, however long each restart takes: it streams only
    # while a server runs it, and the kills come after 7 * 15 + 18 = 123 of its chunks
    # and those that stream while each kill is on its way (at most tens each).
    long = {**SLOW, "chunks": 1200}
    with server.client() as client:
        run = client.post("runs", json={"agent": "demo", "input": long}).json()
    seen: list[str] = []
    for kill in range(kills):
        with server.client() as client:
            # A different moment each time: some events after the takeover, or right at it.
            target = client.get(f"runs/{run['run_id']}").json()["last_seq"] + 7 * kill + 3
            wait_seq(client, run["run_id"], target)
            stored = raw_events(client, run["run_id"])
        assert stored[: len(seen)] == seen  # nothing served before a kill ever changes
        seen = stored
        server.kill()
        server = servers(f"s{kill + 1}", **config)
    with server.client() as client:
        ended = wait_status(client, run["run_id"], TERMINAL, timeout=60)
        assert ended["status"] == "succeeded"
        assert ended["attempt"] == kills + 1
        events = check_reads_as_one_run(client, ended, chunks=long["chunks"])
        assert raw_events(client, run["run_id"])[: len(seen)] == seen
        resumed = [e["data"] for e in events if e["type"] == "run.resumed"]
        assert [r["attempt"] for r in resumed] == list(range(2, kills + 2))


@pytest.mark.timeout(120)
def test_the_docs_resumable_agent_does_each_step_once_across_a_kill(servers, tmp_path):
    readme = (Path(__file__).parent.parent / "docs" / "how-to" / "write-an-agent.md").read_text()
    start = readme.index("# resumable_agents.py")
    code = textwrap.dedent(
        readme[readme.rindex("```python", 0, start) + 9 : readme.index("```", start)]
    )
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "resumable_agents.py").write_text(code)
    agents = {"agents": {"steps": "resumable_agents:steps"}}
    first = servers("a", **agents, extra_path=str(modules))
    with first.client() as client:
        run = client.post("runs", json={"agent": "steps", "input": {"steps": 30}}).json()
        wait_seq(client, run["run_id"], 12)
    first.kill()
    with servers("b", **agents, extra_path=str(modules)).client() as client:
        ended = wait_status(client, run["run_id"], TERMINAL)
        assert ended["status"] == "succeeded", ended["error"]
        assert ended["output"] == {"squares": [n * n for n in range(30)]}
        tools = ended["snapshot"]["tools"]
        completed = [t["args"]["n"] for t in tools if t["status"] == "completed"]
        assert completed == list(range(30))  # each step completed once, in order
        assert all(t["status"] in ("completed", "failed") for t in tools)


@pytest.mark.timeout(120)
def test_a_step_running_when_its_server_is_killed_ends_interrupted_with_its_run(servers):
    first = servers("a", agents={"sleeper": "agents_for_tests:sleeper"})
    with first.client() as client:
        run = client.post("runs", json={"agent": "sleeper", "input": {}}).json()
        wait_seq(client, run["run_id"], 2)  # run.started, tool.started
    first.kill()
    # The sleeper is not resumable: the next server ends its run interrupted.
    with servers("b", agents={"sleeper": "agents_for_tests:sleeper"}).client() as client:
        ended = wait_status(client, run["run_id"], TERMINAL)
        assert ended["status"] == "interrupted"
        cut = {"type": "interrupted", "message": "the run was interrupted before this step ended"}
        [step] = ended["snapshot"]["tools"]
        assert step["status"] == "failed" and step["error"] == cut
        events = [json.loads(e) for e in raw_events(client, run["run_id"])]
        assert [e["type"] for e in events] == [
            "run.started",
            "tool.started",
            "tool.completed",
            "run.interrupted",
        ]
        assert events[2]["data"] == {"call_id": "c1", "ok": False, "error": cut}
