"""ACP agents as runs: a scripted agent (tests/acp_agent.py, the SDK's agent side) run by a real server.

What the agent sends becomes the run's events; its permission requests are
questions to a person; its files stay under the server's root; its process
is one per conversation, gets nothing of the server's environment, and
stops when the run is cancelled. The SQLite store is enough for these: what
they test is above the store (the resume tests run on both).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from tornado import web

from conftest import all_events, submit, wait_for, wait_run, waiting

pytestmark = [pytest.mark.sqlite_only, pytest.mark.timeout(60)]

SCRIPTED = [sys.executable, str(Path(__file__).with_name("acp_agent.py"))]
SECRET = "sk-test-entry-secret-0123456789"


def entry(state, *options, **extra):
    return {
        "command": [*SCRIPTED, *options],
        "env": {"ACP_TEST_STATE": str(state), "SECRET": SECRET},
        "initialize_timeout": 20,
        **extra,
    }


@pytest.fixture
def state(tmp_path):
    path = tmp_path / "acp-state"
    path.mkdir()
    return path


@pytest.fixture
def acp_settings():
    """Per-test settings beside the agents."""
    return {}


@pytest.fixture
def agentruns_config(state, acp_settings):
    return {
        "acp_agents": {
            "scripted": entry(state, description="The scripted test agent", resumable=True),
            "hanging": entry(state, "--hang-initialize", initialize_timeout=1),
            "slowstart": entry(state, "--hang-initialize", initialize_timeout=30),
            "locked": entry(state, "--auth-required"),
            "forgetful": entry(state, "--no-load"),
            "broken": entry(state, "--exit-at-start"),
            "mcphttp": entry(state, "--mcp-http"),
            "titled": entry(state, "--list-sessions"),
            "forking": entry(state, "--fork-sessions"),
        },
        **acp_settings,
    }


@pytest.fixture
def root(jp_serverapp):
    return Path(jp_serverapp.root_dir).resolve()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def agent_pids(state) -> list[int]:
    pids = state / "pids"
    return sorted(int(p.name) for p in pids.iterdir()) if pids.exists() else []


async def run_prompt(api, prompt, agent="scripted", **body):
    response = await submit(api, agent, {"prompt": prompt}, **body)
    assert response.status_code == 201, response.text
    return await wait_run(api, response.json()["run_id"])


async def test_each_entry_is_an_agent_with_its_input_schema(api):
    agents = {a["name"]: a for a in (await api.get("agents")).json()["agents"]}
    scripted = agents["scripted"]
    assert scripted["description"] == "The scripted test agent" and scripted["resumable"] is True
    assert agents["hanging"]["resumable"] is False
    assert scripted["input_schema"]["required"] == ["prompt"]
    assert set(scripted["input_schema"]["properties"]) == {"prompt", "files", "mode", "model"}
    bad = await submit(api, "scripted", {"prompt": "echo hi", "temperature": 1})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_input"


async def test_every_kind_of_update_becomes_its_event(api, root):
    run = await run_prompt(api, "all")
    assert run["status"] == "succeeded", run["error"]
    assert run["output"] == {"text": "Done.", "stop_reason": "end_turn"}
    events = await all_events(api, run["run_id"])
    types = [e["type"] for e in events]
    assert types == [
        "run.started", "reasoning.delta", "plan.updated",
        "tool.started", "tool.completed", "tool.started", "tool.completed", "usage",
        "message.started", "text.delta", "text.delta", "message.completed", "usage",
        "run.succeeded",
    ]  # fmt: skip
    data = [e["data"] for e in events]
    assert data[1]["delta"] == "Thinking it over."
    assert data[2]["entries"] == [
        {"content": "Read the data", "status": "in_progress", "priority": "high"},
        {"content": "Plot it", "status": "pending", "priority": "medium"},
    ]
    read_started, read_completed = data[3], data[4]
    assert read_started["name"] == "read" and read_started["kind"] == "read"
    assert read_started["title"] == "Read data.csv"
    assert read_started["args"] == {"path": str(root / "data.csv")}
    assert read_completed["ok"] is True
    assert read_completed["result"] == {
        "output": {"rows": 3},
        "locations": [{"path": "data.csv", "line": 1}],  # as JupyterLab names it
    }
    assert read_completed["content"] == [{"type": "text", "text": "3 rows"}]
    edit = data[6]
    assert edit["content"] == [
        {"type": "diff", "path": "plot.py", "old_text": "x = 1\n", "new_text": "x = 2\n"}
    ]
    assert data[7] == {"input_tokens": 120, "output_tokens": 0}
    assert data[12] == {"input_tokens": 100, "output_tokens": 20}  # the turn's own counts
    snapshot = run["snapshot"]
    assert snapshot["reasoning"] == "Thinking it over."
    assert [t["status"] for t in snapshot["tools"]] == ["completed", "completed"]
    assert snapshot["messages"][0]["text"] == "Done." and snapshot["messages"][0]["done"]
    assert snapshot["plan"][1]["content"] == "Plot it"


async def test_a_turn_the_agent_counts_no_tokens_of_has_an_estimate_that_says_so(api):
    answer = "Twelve chars" * 10  # 120 characters: about 30 tokens
    run = await run_prompt(api, f"uncounted {answer}")
    assert run["status"] == "succeeded", run["error"]
    events = await all_events(api, run["run_id"])
    usages = [e["data"] for e in events if e["type"] == "usage"]
    prompt = len(f"uncounted {answer}")
    # Its "0 in, 0 out" is no count: one estimate, at about four characters a token.
    assert usages == [{"input_tokens": -(-prompt // 4), "output_tokens": 30, "estimated": True}]
    assert run["snapshot"]["usage"]["estimated"] is True
    [said] = [e["data"] for e in events if e["type"] == "x.usage_unreported"]
    assert said["estimated"] is True and "reported no token counts" in said["message"]
    counted = await run_prompt(api, "all")
    assert "estimated" not in counted["snapshot"]["usage"]  # the agent's own counts


async def test_whatever_an_agent_sends_fits_in_the_runs_events(api):
    run = await run_prompt(api, "big")
    assert run["status"] == "succeeded", run["error"]
    events = await all_events(api, run["run_id"])
    for event in events:
        assert len(json.dumps(event["data"], separators=(",", ":"))) <= 262144, event["type"]
    deltas = [e["data"]["delta"] for e in events if e["type"] == "text.delta"]
    assert "".join(deltas) == "\u00e9\u4e2d" * 150_000
    assert max(map(len, deltas)) < 64 * 1024
    [step] = run["snapshot"]["tools"]
    assert step["status"] == "completed" and step["args"]["truncated"] is True
    assert step["result"]["output"]["truncated"] is True
    assert step["content"][0]["text"].endswith("(300000 characters in all)")
    assert step["content"][1]["text"].startswith("big.txt: changed (")
    assert step["content"][1]["text"].endswith("too large to show)")


async def test_a_permission_request_is_a_question_and_its_answer_goes_back(api):
    response = await submit(api, "scripted", {"prompt": "permission"})
    run_id = response.json()["run_id"]
    run = await waiting(api, run_id)
    [question] = run["snapshot"]["inputs"]
    assert question["kind"] == "permission" and question["title"] == "Run make clean"
    assert question["choices"] == ["allow", "reject"]
    assert question["details"]["options"] == [
        {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
        {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
    ]
    assert question["details"]["tool"]["kind"] == "execute"
    assert run["snapshot"]["tools"][0]["title"] == "Run make clean"
    answered = await api.post(
        f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": "reject"}
    )
    assert answered.status_code == 200
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded" and run["output"]["text"] == "rejected"
    assert run["snapshot"]["tools"][0]["status"] == "failed"


async def test_a_cancel_answers_the_open_permission_cancelled_and_the_conversation_goes_on(api):
    response = await submit(api, "scripted", {"prompt": "permission"}, session="s1")
    run_id = response.json()["run_id"]
    await waiting(api, run_id)
    assert (await api.post(f"runs/{run_id}/cancel")).status_code == 202
    run = await wait_run(api, run_id)
    assert run["status"] == "cancelled"
    [question] = run["snapshot"]["inputs"]
    assert question["status"] == "resolved" and question["reason"] == "cancelled"
    # The agent heard "cancelled" and ended its turn: the same process takes the next one.
    history = await run_prompt(api, "history", session="s1")
    assert json.loads(history["output"]["text"]) == ["permission", "history"]


async def test_cancel_sends_session_cancel_and_the_agent_stops_its_turn(api, state):
    response = await submit(api, "scripted", {"prompt": "slow 2000"}, session="s1")
    run_id = response.json()["run_id"]
    await wait_for_text(api, run_id, "tick 3 ")
    [pid] = agent_pids(state)
    assert (await api.post(f"runs/{run_id}/cancel")).status_code == 202
    run = await wait_run(api, run_id)
    assert run["status"] == "cancelled"
    # It heard session/cancel and ended its turn: its process goes on, for the next run.
    echo = await run_prompt(api, "pid", session="s1")
    assert echo["output"]["text"] == str(pid) and alive(pid)


async def test_an_agent_that_ignores_the_cancel_is_ended(api, state):
    response = await submit(api, "scripted", {"prompt": "stubborn"}, session="s1")
    run_id = response.json()["run_id"]
    await wait_for_text(api, run_id, "tick 2 ")
    [pid] = agent_pids(state)
    assert (await api.post(f"runs/{run_id}/cancel")).status_code == 202
    assert (await wait_run(api, run_id))["status"] == "cancelled"  # at once
    await wait_for(lambda: not alive(pid), timeout=15, what="the agent's process to end")
    # The conversation starts again in a new process, and goes on.
    history = await run_prompt(api, "history", session="s1")
    assert json.loads(history["output"]["text"]) == ["stubborn", "history"]


async def wait_for_text(api, run_id, text, timeout=20):
    async def has_text():
        run = (await api.get(f"runs/{run_id}")).json()
        return any(text in m["text"] for m in run["snapshot"]["messages"])

    deadline = asyncio.get_running_loop().time() + timeout
    while not await has_text():
        assert asyncio.get_running_loop().time() < deadline, f"no {text!r} in {run_id}"
        await asyncio.sleep(0.05)


async def test_an_agent_that_cannot_take_its_turn_fails_the_run_saying_why(api, state):
    started = {}
    for agent, prompt in (("scripted", "crash"), ("hanging", "echo hi"),
                          ("broken", "echo hi"), ("locked", "echo hi")):  # fmt: skip
        response = await submit(api, agent, {"prompt": prompt})
        started[agent] = response.json()["run_id"]
    runs = {agent: await wait_run(api, run_id) for agent, run_id in started.items()}
    errors = {agent: run["error"] for agent, run in runs.items()}
    assert {agent: run["status"] for agent, run in runs.items()} == dict.fromkeys(runs, "failed")
    # It crashed: the end of its stderr says why, without the secrets of its env.
    crash = errors["scripted"]
    assert crash["type"] == "agent_exited"
    assert "'scripted' exited (with code 3)" in crash["message"]
    assert "something broke; the key was [hidden]" in crash["message"]
    assert SECRET not in crash["message"]
    # It never answered initialize.
    assert errors["hanging"]["type"] == "agent_exited"
    assert "did not answer 'initialize' within 1 s" in errors["hanging"]["message"]
    # It exited at once.
    assert errors["broken"]["type"] == "agent_exited"
    assert "cannot start: no configuration" in errors["broken"]["message"]
    # It needs a login: its own instructions.
    assert errors["locked"]["type"] == "agent_auth_required"
    assert "Log in: Run `scripted login` first" in errors["locked"]["message"]
    assert "API key (set SCRIPTED_KEY in its 'env')" in errors["locked"]["message"]
    # And none of them is left running.
    await wait_for(lambda: not any(map(alive, agent_pids(state))), timeout=15, what="agents to end")


async def test_a_run_cancelled_while_its_agent_starts_leaves_no_agent_behind(api, state):
    response = await submit(api, "slowstart", {"prompt": "echo hi"}, session="s1")
    run_id = response.json()["run_id"]
    await wait_for(lambda: agent_pids(state), timeout=20, what="the agent to start")
    assert (await api.post(f"runs/{run_id}/cancel")).status_code == 202
    assert (await wait_run(api, run_id))["status"] == "cancelled"
    [pid] = agent_pids(state)
    # Never initialized, it cannot take the conversation's next turn: it is ended, not kept.
    await wait_for(lambda: not alive(pid), timeout=15, what="the starting agent to end")


async def test_the_stop_reason_ends_the_run(api):
    refused = await run_prompt(api, "refuse", session="s1")
    assert refused["status"] == "failed" and refused["error"]["type"] == "refused"
    cut = await run_prompt(api, "max_tokens", session="s1")
    assert cut["status"] == "succeeded"
    assert cut["output"] == {"text": "No.", "stop_reason": "max_tokens"}
    ended = await run_prompt(api, "echo hello there", session="s1")
    assert ended["output"] == {"text": "hello there", "stop_reason": "end_turn"}


@pytest.mark.parametrize("acp_settings", [{"max_tokens_per_run": 1000}])
async def test_usage_over_2_53_tokens_is_said_and_counted_as_2_53_so_the_budget_stops_the_run(api):
    # Left out, it let a run past its token budget, and nobody was told.
    run = await run_prompt(api, f"usage {10**20} 5")
    assert run["status"] == "failed" and run["error"]["type"] == "token_budget_exceeded", run
    events = await all_events(api, run["run_id"])
    assert [e["type"] for e in events][-3:] == ["x.usage_over_max", "usage", "run.failed"]
    said = events[-3]["data"]["message"]
    assert f"input_tokens {10**20}" in said and "counted as 2**53" in said
    assert events[-2]["data"] == {"input_tokens": 2**53, "output_tokens": 5}
    within = await run_prompt(api, "usage 600 400")
    assert within["status"] == "succeeded", within["error"]


async def fork_at(api, run, prompt, at_seq=None):
    seq = run["last_seq"] if at_seq is None else at_seq
    return await api.post(
        f"runs/{run['run_id']}/fork", json={"at_seq": seq, "input": {"prompt": prompt}}
    )


async def test_a_conversation_is_forked_where_its_latest_turn_ended_and_stays_as_it_was(api):
    """session/fork copies an ACP session as it is: a fork goes on in the copy, from the end
    of the conversation's latest turn; the conversation itself never sees the fork's turn."""
    first = await run_prompt(api, "echo one", agent="forking", session="talk")
    second = await run_prompt(api, "echo two", agent="forking", session="talk")
    runs = len((await api.get("runs")).json()["runs"])

    inside = await fork_at(api, second, "history", at_seq=second["last_seq"] - 1)
    assert inside.status_code == 422 and inside.json()["error"] == "fork_unsupported"
    assert "not from inside a turn" in inside.json()["message"]
    earlier = await fork_at(api, first, "history")
    assert earlier.status_code == 422, earlier.text
    assert f"went on after it (run {second['run_id']})" in earlier.json()["message"]
    unforking = await run_prompt(api, "echo three", session="other")  # no session/fork
    refused = await fork_at(api, unforking, "history")
    assert refused.status_code == 422, refused.text
    assert "'scripted' does not offer session/fork" in refused.json()["message"]
    assert len((await api.get("runs")).json()["runs"]) == runs + 1  # the refusals made none

    response = await fork_at(api, second, "history")
    assert response.status_code == 201, response.text
    forked = await wait_run(api, response.json()["run_id"])
    assert forked["status"] == "succeeded", forked["error"]
    assert forked["forked_from"] == {"run_id": second["run_id"], "seq": second["last_seq"]}
    assert json.loads(forked["output"]["text"]) == ["echo one", "echo two", "history"]
    # The conversation goes on as it was, without the fork's turn.
    after = await run_prompt(api, "history", agent="forking", session="talk")
    assert json.loads(after["output"]["text"]) == ["echo one", "echo two", "history"]
    # Its steps offer no Retry from here: a turn is copied whole or not at all.
    agents = {a["name"]: a for a in (await api.get("agents")).json()["agents"]}
    assert agents["forking"]["forks"] is False


@pytest.mark.parametrize("acp_settings", [{"acp_idle_seconds": 0.3}])
async def test_runs_of_a_session_continue_one_conversation(api, state):
    first = await run_prompt(api, "echo one", session="nb.ipynb")
    second = await run_prompt(api, "history", session="nb.ipynb")
    assert json.loads(second["output"]["text"]) == ["echo one", "history"]
    other = await run_prompt(api, "history", session="other")  # another session, its own
    assert json.loads(other["output"]["text"]) == ["history"]
    pids = agent_pids(state)
    assert len(pids) == 2
    await wait_for(lambda: not any(map(alive, pids)), timeout=10, what="idle agents to close")
    # A new process loads the conversation (session/load): its history replayed is not the run's.
    third = await run_prompt(api, "history", session="nb.ipynb")
    assert json.loads(third["output"]["text"]) == ["echo one", "history", "history"]
    assert len(agent_pids(state)) == 3
    assert [m["text"] for m in third["snapshot"]["messages"]] == [third["output"]["text"]]
    types = [e["type"] for e in await all_events(api, third["run_id"])]
    assert "x.acp_new_conversation" not in types
    assert first["status"] == "succeeded"


@pytest.mark.parametrize("acp_settings", [{"acp_idle_seconds": 0.3}])
async def test_an_agent_that_cannot_load_a_conversation_starts_a_new_one_and_says_so(api, state):
    await run_prompt(api, "echo one", agent="forgetful", session="s1")
    [pid] = agent_pids(state)
    await wait_for(lambda: not alive(pid), timeout=10, what="the idle agent to close")
    run = await run_prompt(api, "history", agent="forgetful", session="s1")
    assert json.loads(run["output"]["text"]) == ["history"]
    [note] = [
        e for e in await all_events(api, run["run_id"]) if e["type"] == "x.acp_new_conversation"
    ]
    assert "cannot load an earlier conversation" in note["data"]["message"]


async def conversation_title(api, agent):
    [conversation] = (await api.get("conversations", params={"agent": agent})).json()[
        "conversations"
    ]
    return conversation["title"]


async def test_a_conversation_has_the_title_the_agent_gives_its_session(api, caplog):
    for prompt in ("echo Plan the trip", "echo and the hotel?"):
        run = await run_prompt(api, prompt, agent="titled", session="trip")
        assert run["status"] == "succeeded", run["error"]
    # session/list after each turn: the agent's own title, not the first prompt.
    assert await conversation_title(api, "titled") == "echo Plan the trip (2 turns)"
    # A title it gives during a turn (session_info_update) is as good.
    await run_prompt(api, "retitle Trip to Lisbon", agent="titled", session="trip")
    assert await conversation_title(api, "titled") == "Trip to Lisbon"
    # Its session/list failing fails no run: the conversation keeps the title it had.
    for prompt in ("unlistable", "echo and the museum?"):
        run = await run_prompt(api, prompt, agent="titled", session="trip")
        assert run["status"] == "succeeded" and run["output"]["text"] == prompt.split(" ", 1)[-1]
    assert await conversation_title(api, "titled") == "Trip to Lisbon"
    assert "the ACP agent 'titled' did not list its sessions" in caplog.text


async def test_an_agent_that_does_not_list_its_sessions_keeps_the_first_prompts_title(api):
    for prompt in ("echo Plan the trip", "echo and the hotel?"):
        await run_prompt(api, prompt, session="trip")
    assert await conversation_title(api, "scripted") == "echo Plan the trip"
    # Unless it titles its session itself: on one line, at most 500 characters kept.
    await run_prompt(api, "retitle Trip\n to  Lisbon " + "x" * 600, session="trip")
    title = await conversation_title(api, "scripted")
    assert title.startswith("Trip to Lisbon xxx") and len(title) == 500


async def test_a_run_without_a_session_has_a_process_of_its_own_for_its_turn(api, state):
    await run_prompt(api, "echo one")
    [pid] = agent_pids(state)
    await wait_for(lambda: not alive(pid), timeout=10, what="the agent to close")


async def test_the_agent_gets_nothing_of_the_servers_environment(api, monkeypatch):
    run = await run_prompt(api, "env")
    env = json.loads(run["output"]["text"])
    assert set(env) == {"PATH", "HOME", "ACP_TEST_STATE", "SECRET"}
    assert env["PATH"] == os.environ["PATH"] and env["HOME"] == os.environ["HOME"]
    assert env["SECRET"] == SECRET  # its own entry's, which it was given


async def test_files_are_read_and_written_under_the_root_only(api, root, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    (root / "escape.txt").symlink_to(outside)
    (root / "data.txt").write_text("a,b\n1,2\n")
    read = await run_prompt(api, "read data.txt", session="s1")
    assert read["output"]["text"] == "a,b\n1,2\n"
    for prompt in (f"read {outside}", "read escape.txt", f"write {outside} overwritten",
                   "write escape.txt overwritten", "read ../outside.txt"):  # fmt: skip
        run = await run_prompt(api, prompt, session="s1")
        assert run["output"]["text"].startswith("refused: "), prompt
        assert "outside the Jupyter server's root" in run["output"]["text"], prompt
        assert run["snapshot"]["tools"] == []
    assert outside.read_text() == "not yours"


def files_under(root):
    """Every file and directory under ``root``: its bytes (None: a directory) and mtime."""
    return {
        path: (None if path.is_dir() else path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
    }


async def test_hidden_files_are_refused_before_any_byte_is_read_or_written(api, root):
    git = root / ".git"
    git.mkdir()
    (git / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    (root / "visible.txt").write_text("kept\n")
    os.symlink(git / "config", root / "config-link")
    before = files_under(root)
    for prompt in ("write .git/config [core] fsmonitor = touch pwned",
                   "write config-link [core] fsmonitor = touch pwned",
                   "write .env KEY=1", "write notes/.hidden/new.txt x", "read .git/config",
                   "read config-link"):  # fmt: skip
        run = await run_prompt(api, prompt, session="s1")
        text = run["output"]["text"]
        assert text.startswith("refused: ") and "is hidden" in text, (prompt, text)
        assert "c.ContentsManager.allow_hidden" in text
        assert run["snapshot"]["tools"] == []  # nothing was done: no step says otherwise
    assert files_under(root) == before  # not a byte, not an mtime, no new file or directory


async def test_with_allow_hidden_a_hidden_write_is_done_and_recorded_with_its_diff(
    api, root, jp_serverapp
):
    jp_serverapp.contents_manager.allow_hidden = True  # c.ContentsManager.allow_hidden = True
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    run = await run_prompt(api, "write .git/config [user]", session="s1")
    assert run["output"]["text"] == "written"
    assert (root / ".git" / "config").read_text() == "[user]"
    [step] = run["snapshot"]["tools"]
    assert step["status"] == "completed" and step["title"] == "Write .git/config"
    assert step["content"] == [
        {"type": "diff", "path": ".git/config", "old_text": "[core]\n", "new_text": "[user]"}
    ]
    read = await run_prompt(api, "read .git/config", session="s1")
    assert read["output"]["text"] == "[user]"


async def test_a_write_the_contents_manager_did_before_failing_is_recorded_as_done(
    api, root, jp_serverapp
):
    manager = jp_serverapp.contents_manager
    original = manager.save

    async def save(model, path):
        await original(model, path)
        raise web.HTTPError(404, "file or directory does not exist")  # as when reading back

    manager.save = save
    (root / "kept.txt").write_text("before\n")
    run = await run_prompt(api, "write kept.txt after", session="s1")
    assert run["output"]["text"] == "written"
    assert (root / "kept.txt").read_text() == "after"
    [step] = run["snapshot"]["tools"]
    assert step["status"] == "completed"
    assert step["content"] == [
        {"type": "diff", "path": "kept.txt", "old_text": "before\n", "new_text": "after"}
    ]


async def test_a_write_goes_through_the_contents_manager_and_is_a_step_with_its_diff(
    api, root, jp_serverapp
):
    saved = []
    manager = jp_serverapp.contents_manager
    original = manager.save

    def save(model, path):
        saved.append(path)
        return original(model, path)

    manager.save = save
    (root / "notes").mkdir()
    (root / "notes" / "old.txt").write_text("before\n")
    run = await run_prompt(api, "write notes/old.txt after", session="s1")
    assert run["output"]["text"] == "written"
    assert (root / "notes" / "old.txt").read_text() == "after"
    new = await run_prompt(api, "write fresh/dir/new.txt hello", session="s1")
    assert (root / "fresh" / "dir" / "new.txt").read_text() == "hello"
    assert saved == ["notes/old.txt", "fresh", "fresh/dir", "fresh/dir/new.txt"]
    [step] = run["snapshot"]["tools"]
    assert step["name"] == "write_text_file" and step["kind"] == "edit"
    assert step["title"] == "Write notes/old.txt" and step["status"] == "completed"
    assert step["content"] == [
        {"type": "diff", "path": "notes/old.txt", "old_text": "before\n", "new_text": "after"}
    ]
    assert new["snapshot"]["tools"][0]["content"][0]["old_text"] is None  # a new file


async def test_the_working_directory_is_the_notebooks(api, root):
    (root / "project").mkdir()
    run = await run_prompt(api, "cwd", session="project/analysis.ipynb")
    assert json.loads(run["output"]["text"]) == {
        "session": str(root / "project"),
        "process": str(root / "project"),
    }
    # A session of its own name, from a notebook named in the metadata.
    run = await run_prompt(api, "cwd", session="chat", metadata={"notebook": "project/x.ipynb"})
    assert json.loads(run["output"]["text"])["session"] == str(root / "project")
    run = await run_prompt(api, "cwd", session="chat2")
    assert json.loads(run["output"]["text"])["session"] == str(root)
    # Nothing outside the root, whatever the metadata says.
    run = await run_prompt(api, "cwd", session="chat3", metadata={"notebook": "/etc/x.ipynb"})
    assert json.loads(run["output"]["text"])["session"] == str(root)


async def test_files_of_the_input_are_sent_as_links_and_must_be_under_the_root(api, root):
    (root / "data.csv").write_text("a\n")
    response = await submit(api, "scripted", {"prompt": "blocks", "files": ["data.csv"]})
    run = await wait_run(api, response.json()["run_id"])
    blocks = json.loads(run["output"]["text"])
    assert blocks[1] == {
        "type": "resource_link", "uri": (root / "data.csv").as_uri(), "name": "data.csv",
    }  # fmt: skip
    for path in ("missing.csv", "../etc/passwd"):
        response = await submit(api, "scripted", {"prompt": "blocks", "files": [path]})
        run = await wait_run(api, response.json()["run_id"])
        assert run["status"] == "failed" and run["error"]["type"] == "invalid_input", path


async def test_mode_and_model_are_set_in_the_agents_session(api):
    response = await submit(
        api, "scripted", {"prompt": "state", "mode": "plan", "model": "large"}, session="s1"
    )
    run = await wait_run(api, response.json()["run_id"])
    assert json.loads(run["output"]["text"]) == {"mode": "plan", "model": "large"}
    run = await run_prompt(api, "requests", session="s1")
    assert json.loads(run["output"]["text"]) == [
        "session/set_mode plan",
        "session/set_config_option model large",
    ]


async def test_agents_lists_an_acp_agents_modes_and_models_once_it_opened_a_session(api):
    def scripted(listing):
        return next(agent for agent in listing.json()["agents"] if agent["name"] == "scripted")

    before = scripted(await api.get("agents"))
    assert "modes" not in before and "models" not in before
    # Not known yet: the agent says whether it has that mode.
    run = await run_prompt(api, "echo hi", session="s1")
    assert run["status"] == "succeeded"
    after = scripted(await api.get("agents"))
    assert after["modes"] == [
        {"id": "ask", "name": "Ask", "description": "Answers, changes nothing"},
        {"id": "plan", "name": "Plan", "description": "Plans before it acts"},
    ]
    assert after["models"] == [{"id": "small", "name": "Small"}, {"id": "large", "name": "Large"}]
    assert after["current"] == {"mode": "ask", "model": "small"}


async def test_a_mode_or_model_the_agent_does_not_offer_is_refused_at_submit(api, state):
    response = await submit(api, "scripted", {"prompt": "state", "mode": "yolo"}, session="s1")
    run = await wait_run(api, response.json()["run_id"])  # unknown until its first session
    assert run["status"] == "failed" and run["error"]["type"] == "invalid_input"
    assert "no mode 'yolo' (its modes: ask, plan)" in run["error"]["message"]
    for category, value in (("mode", "yolo"), ("model", "huge")):
        response = await submit(api, "scripted", {"prompt": "state", category: value})
        assert response.status_code == 400, response.text
        error = response.json()
        assert error["error"] == "invalid_input" and error["path"] == f"input.{category}"
        assert f"has no {category} {value!r}" in error["message"]
    runs = (await api.get("runs", params={"agent": "scripted"})).json()
    assert len(runs["runs"]) == 1  # the refused ones stored nothing


@pytest.mark.parametrize("acp_settings", [{"max_agent_processes": 1}])
async def test_beyond_max_agent_processes_a_run_waits_for_one_and_idle_ones_make_room(api, state):
    busy = (await submit(api, "scripted", {"prompt": "slow 30"}, session="a")).json()
    await wait_for_text(api, busy["run_id"], "tick 1 ")
    waiting_run = (await submit(api, "scripted", {"prompt": "echo b"}, session="b")).json()
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        run = (await api.get(f"runs/{waiting_run['run_id']}")).json()
        progress = run["snapshot"]["progress"] or {}
        if "max_agent_processes" in (progress.get("message") or ""):
            break
        assert asyncio.get_running_loop().time() < deadline, run
        await asyncio.sleep(0.05)
    assert (await wait_run(api, busy["run_id"]))["status"] == "succeeded"
    assert (await wait_run(api, waiting_run["run_id"]))["output"]["text"] == "b"
    first, second = agent_pids(state)
    assert not alive(first) and alive(second)  # the idle one made room


MCP_SERVERS = {
    "files": {"command": ["python3", "-m", "files_server"], "env": {"ROOT": "/srv"}},
    "web": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer web-key"}},
}


@pytest.mark.parametrize("acp_settings", [{"mcp_servers": MCP_SERVERS}])
async def test_an_acp_agent_gets_the_mcp_servers_and_the_runs_notebook_tools_in_its_session(api):
    files = {
        "type": "stdio",
        "name": "files",
        "command": shutil.which("python3"),
        "args": ["-m", "files_server"],
        "env": [{"name": "ROOT", "value": "/srv"}],
    }
    web = {
        "type": "http",
        "name": "web",
        "url": "http://127.0.0.1:9/mcp",
        "headers": [{"name": "Authorization", "value": "Bearer web-key"}],
    }

    def given(run):
        assert run["status"] == "succeeded", run["error"]
        servers = json.loads(run["output"]["text"])
        for server in servers:
            server.setdefault("type", "stdio")  # ACP's stdio server has no type
        return servers

    # An agent without mcpCapabilities.http gets the servers it starts itself only.
    assert given(await run_prompt(api, "mcp", metadata={"kernel_id": "k1"})) == [files]
    # One that reaches HTTP servers gets them all, and the run's notebook tools.
    first = given(
        await run_prompt(api, "mcp", "mcphttp", session="s", metadata={"kernel_id": "k1"})
    )
    assert first[:2] == [files, web]
    notebook = first[2]
    assert notebook["name"] == "jupyter-notebook" and notebook["type"] == "http"
    assert notebook["url"].endswith("/api/agentruns/mcp")
    token = notebook["headers"][0]["value"]
    assert notebook["headers"][0]["name"] == "Authorization" and token.startswith("Bearer agr_")
    # The next run of the conversation: its session, kept, is opened again with its own token.
    second = given(
        await run_prompt(api, "mcp", "mcphttp", session="s", metadata={"kernel_id": "k1"})
    )
    assert second[:2] == [files, web] and second[2]["headers"][0]["value"] not in (token, "")
    # A run without a kernel has no notebook tools.
    assert given(await run_prompt(api, "mcp", "mcphttp")) == [files, web]


async def test_a_stuck_agent_s_last_stderr_lines_are_served_for_its_run(api):
    run_id = (await submit(api, "scripted", {"prompt": "stuck"})).json()["run_id"]

    async def said() -> dict:
        answer = await api.get(f"runs/{run_id}/stderr")
        assert answer.status_code == 200
        return answer.json()

    for _ in range(200):
        answer = await said()
        if any("not supported" in line for line in answer["lines"]):
            break
        await asyncio.sleep(0.05)
    assert answer["run_id"] == run_id and answer["live"] is True
    # The last 20 lines, as text: the entry's secret hidden, colours removed, markup left as it is.
    assert len(answer["lines"]) == 20
    assert answer["lines"][0] == "retrying the model server, attempt 11"
    assert answer["lines"][-1] == (
        "ERROR <b>500</b> Automatic streaming tool choice is not supported (key [hidden])"
    )
    run = (await api.get(f"runs/{run_id}")).json()
    assert run["status"] == "running" and run["last_event_at"] is not None
    await api.post(f"runs/{run_id}/cancel")
    ended = await wait_run(api, run_id)
    assert ended["last_event_at"] is None
    assert await said() == {"run_id": run_id, "live": False, "lines": []}
    assert (await api.get("runs/run_nobody_has/stderr")).status_code == 404


@pytest.mark.sqlite_only  # what it tests is above the store
async def test_an_acp_agent_inserts_a_cell_through_the_notebook_tools_it_was_given(api, root):
    """The agent calls insert_cell on the jupyter-notebook MCP server of its session, as an ACP
    agent does: the edit is the run's, made in the notebook and stamped."""
    cell = {"cell_type": "code", "id": "c-1", "metadata": {}, "execution_count": None,
            "source": "x = 1", "outputs": []}  # fmt: skip
    notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (root / "acp.ipynb").write_text(json.dumps(notebook))
    call = json.dumps({"source": "y = x + 1", "after": "c-1"})
    run = await run_prompt(
        api, f"notebookcall insert_cell {call}", "mcphttp",
        metadata={"kernel_id": "k1", "notebook": "acp.ipynb"},
    )  # fmt: skip
    assert run["status"] == "succeeded", run["error"]
    assert not run["output"]["text"].startswith("error"), run["output"]
    [edit] = run["snapshot"]["edits"]
    assert (edit["op"], edit["status"], edit["after"]) == ("insert", "applied", "y = x + 1")
    cells = json.loads((root / "acp.ipynb").read_text())["cells"]
    assert ["".join(c["source"]) for c in cells] == ["x = 1", "y = x + 1"]
    stamp = {"run_id": run["run_id"], "edit_id": edit["edit_id"]}
    assert cells[1]["metadata"]["agentruns"] == stamp
    assert edit["cell_id"] in run["output"]["text"]


@pytest.mark.parametrize("acp_settings", [{"agent_silence_seconds": 2}])
async def test_a_stuck_agent_fails_agent_silent_after_agent_silence_seconds(api):
    run_id = (await submit(api, "scripted", {"prompt": "stuck"})).json()["run_id"]
    run = await wait_run(api, run_id, timeout=30)
    assert run["status"] == "failed" and run["error"]["type"] == "agent_silent"
    # Its process was told to stop its turn, and nothing is left running for the run.
    assert (await api.get(f"runs/{run_id}/stderr")).json()["live"] is False


def test_an_agent_s_stderr_never_shows_a_run_s_notebook_tools_token():
    from jupyter_agentruns.agents.acp.processes import AgentProcess, last_lines
    from jupyter_agentruns.notebook_tools import NotebookAccess

    access = NotebookAccess(None, owner_mode="per-user")  # type: ignore[arg-type]  # tokens only
    token = access.token_for("run_a")
    # An agent that logs the MCP servers its session was given, headers and all.
    script = (
        "import sys; "
        f"sys.stderr.write('mcp: Authorization: Bearer {token}\\n'); "
        f"sys.stderr.write('url?token={token}&x=1 key SECRET-VALUE\\n')"
    )

    async def tail() -> str:
        process = await AgentProcess.start(
            [sys.executable, "-c", script], {"KEY": "SECRET-VALUE"}, os.getcwd()
        )
        assert await process.exited(10) == 0
        return process.stderr_tail()

    text = asyncio.run(tail())
    assert token not in text and "SECRET-VALUE" not in text
    assert last_lines(text) == [
        "mcp: Authorization: Bearer agr_[hidden]",
        "url?token=agr_[hidden]&x=1 key [hidden]",
    ]
