"""``jupyter agentruns acp``: an editor drives the server's runs over ACP.

The bridge runs as editors start it, a subprocess speaking ACP on stdio
(``python -m jupyter_agentruns.cli acp --url --token``), driven by the ACP
SDK's client side as an editor drives an agent, against a real server with
the demo agent and the test agents. Everything a test checks at the editor
it checks on the server too: the run exists there, in the session's
conversation, and its end is the turn's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import acp
import pytest
from acp.schema import AllowedOutcome, ClientCapabilities, RequestPermissionResponse
from tcpproxy import TcpProxy

from jupyter_agentruns.cli import acp_updates

from agents_for_tests import PERMISSION_OPTIONS, TEST_AGENTS
from servers import ServerProcess, wait_status

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("bridge")
    (home / "acp-state").mkdir()
    scripted = {
        "command": [sys.executable, str(Path(__file__).with_name("acp_agent.py"))],
        "env": {"ACP_TEST_STATE": str(home / "acp-state")},
    }
    config = {"agents": TEST_AGENTS, "acp_agents": {"scripted": scripted}}
    started = ServerProcess(home, home / "agentruns.sqlite3", config).start()
    yield started
    started.kill()


class Editor:
    """What an editor does with an agent's messages: keeps the updates, answers permissions.

    ``answers``: the option id to choose for each permission asked, in turn;
    once they run out, a permission is left unanswered (the editor shows it).
    """

    def __init__(self, answers: list[str] | None = None):
        self.updates: list[tuple[str, Any]] = []
        self.permissions: list[tuple[Any, list[Any]]] = []
        self.answers = list(answers or [])
        self.changed = asyncio.Event()

    def on_connect(self, conn: Any) -> None:
        pass

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        self.changed.set()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.permissions.append((tool_call, options))
        self.changed.set()
        if not self.answers:
            await asyncio.Event().wait()  # never answered here
        choice = self.answers.pop(0)
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=choice)
        )

    def of(self, session_id: str, kind: str) -> list[Any]:
        return [u for s, u in self.updates if s == session_id and u.session_update == kind]

    def text(self, session_id: str, kind: str = "agent_message_chunk") -> str:
        return "".join(update.content.text for update in self.of(session_id, kind))

    async def until(self, predicate, timeout: float = 30) -> None:
        async def wait() -> None:
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), timeout)


def bridge_command(server: ServerProcess, *args: str, url: str | None = None) -> list[str]:
    return [
        sys.executable, "-m", "jupyter_agentruns.cli", "acp",
        "--url", url or server.url, "--token", server.token, *args,
    ]  # fmt: skip


@contextlib.asynccontextmanager
async def bridge(server: ServerProcess, editor: Editor, *args: str, url: str | None = None):
    """The bridge started as an editor starts it, initialized: ``(connection, process)``."""
    command = bridge_command(server, *args, url=url)
    async with acp.spawn_agent_process(editor, command[0], *command[1:], env=dict(os.environ)) as (
        conn,
        process,
    ):
        answer = await asyncio.wait_for(
            conn.initialize(
                protocol_version=acp.PROTOCOL_VERSION, client_capabilities=ClientCapabilities()
            ),
            30,
        )
        # What an editor builds its menus from: load, list, resume and close, and text with
        # embedded resources (files as context) in a prompt.
        capabilities = answer.agent_capabilities
        assert capabilities.load_session and capabilities.prompt_capabilities.embedded_context
        sessions = capabilities.session_capabilities
        assert sessions.list and sessions.resume and sessions.close, sessions
        try:
            yield conn, process
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()


def session_runs(server: ServerProcess, session_id: str) -> list[dict]:
    with server.client() as client:
        return client.get("runs", params={"session": session_id}).json()["runs"]


def run_text(run: dict) -> str:
    return "".join(message["text"] for message in run["snapshot"]["messages"])


async def test_a_prompt_is_a_run_in_the_conversation_streamed_back_to_the_end(server, tmp_path):
    editor = Editor()
    async with bridge(server, editor) as (conn, _):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        modes = session.modes
        assert modes.current_mode_id == "demo"  # the server's default agent
        assert {"demo", "asker", "permission_asker"} <= {m.id for m in modes.available_modes}

        answer = await conn.prompt(
            session_id=session.session_id, prompt=[acp.text_block("Tell me about the data")]
        )

    assert answer.stop_reason == "end_turn"
    [run] = session_runs(server, session.session_id)
    assert run["agent"] == "demo" and run["status"] == "succeeded"
    # The turn's answer has the run's token totals.
    usage = run["snapshot"]["usage"]
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (
        usage["input_tokens"], usage["output_tokens"],
    ) == (5, 40)  # fmt: skip
    assert run["input"] == {"prompt": "Tell me about the data"}
    # Every word the run wrote reached the editor, once, and its two steps too.
    assert editor.text(session.session_id) == run_text(run) != ""
    started = editor.of(session.session_id, "tool_call")
    ended = editor.of(session.session_id, "tool_call_update")
    assert len(started) == 2 and [u.status for u in ended] == ["completed", "completed"]
    assert {u.tool_call_id for u in started} == {u.tool_call_id for u in ended}


async def test_the_mode_picker_switches_agent_and_steps_come_with_thoughts_plans_and_diffs(
    server, tmp_path
):
    editor = Editor()
    async with bridge(server, editor) as (conn, _):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_session_mode(session_id=session.session_id, mode_id="stepper")
        answer = await conn.prompt(
            session_id=session.session_id, prompt=[acp.text_block("Change a.py")]
        )
        with pytest.raises(acp.RequestError):
            await conn.set_session_mode(session_id=session.session_id, mode_id="no-such-agent")

    sid = session.session_id
    assert answer.stop_reason == "end_turn"
    assert session_runs(server, sid)[0]["agent"] == "stepper"
    assert editor.text(sid, "agent_thought_chunk") == "Look at the file, then change it."
    assert editor.text(sid) == "Done."
    plans = editor.of(sid, "plan")
    assert [e.status for e in plans[-1].entries] == ["completed"]
    assert plans[-1].entries[0].content == "Read a.py"
    [read, edit] = editor.of(sid, "tool_call")
    assert (read.kind, read.title, edit.kind, edit.title) == (
        "read",
        "Read a.py",
        "edit",
        "Edit a.py",
    )
    [diff] = [
        c for u in editor.of(sid, "tool_call_update") for c in u.content or [] if c.type == "diff"
    ]
    # The run's path is relative to the server's root: the editor gets it under its project.
    assert (diff.path, diff.old_text, diff.new_text) == (
        str(tmp_path / "a.py"), "x = 1\n", "x = 2\n",
    )  # fmt: skip


async def test_questions_are_permissions_and_the_editors_answer_reaches_the_run(server, tmp_path):
    editor = Editor(answers=["proceed_once", "deny"])
    async with bridge(server, editor) as (conn, _):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        # An ACP agent's permission: its own options, passed through.
        await conn.set_session_mode(session_id=sid, mode_id="permission_asker")
        allowed = await conn.prompt(session_id=sid, prompt=[acp.text_block("Plot the means")])
        # An approval: allow or reject.
        await conn.set_session_mode(session_id=sid, mode_id="asker")
        denied = await conn.prompt(session_id=sid, prompt=[acp.text_block("Go")])

    assert allowed.stop_reason == denied.stop_reason == "end_turn"
    (permission, options), (approval, choices) = editor.permissions
    assert [(o.option_id, o.name, o.kind) for o in options] == [
        (o["optionId"], o["name"], o["kind"]) for o in PERMISSION_OPTIONS
    ]
    # It is about the step in progress, whose diff it shows.
    [edit] = [u for u in editor.of(sid, "tool_call") if u.title == "Edit plot.py"]
    assert permission.tool_call_id == edit.tool_call_id
    assert [c.path for c in permission.content] == [str(tmp_path / "plot.py")]
    assert [(o.option_id, o.kind) for o in choices] == [
        ("approve", "allow_once"), ("deny", "reject_once"),
    ]  # fmt: skip
    assert approval.title == "Go on?"
    first, second = session_runs(server, sid)[::-1]
    assert first["output"] == {"choice": "proceed_once"}
    assert second["output"] == {"answers": ["deny"]}
    assert "Go on? deny." in editor.text(sid)


async def test_an_acp_agent_on_the_server_reaches_the_editor_through_both_hops(server):
    root = server.home  # the editor opened the server's root directory
    (root / "notes.txt").write_text("the notes")
    editor = Editor(answers=["allow"])
    async with bridge(server, editor, "--agent", "scripted") as (conn, _):
        session = await conn.new_session(cwd=str(root), mcp_servers=[])
        sid = session.session_id
        allowed = await conn.prompt(session_id=sid, prompt=[acp.text_block("permission")])
        everything = await conn.prompt(session_id=sid, prompt=[acp.text_block("all")])
        link = acp.resource_link_block("notes.txt", (root / "notes.txt").as_uri())
        await conn.prompt(session_id=sid, prompt=[acp.text_block("echo read it"), link])

    # The agent's own permission options, through the server's question, to the editor and back.
    [(_, options)] = editor.permissions
    assert [(o.option_id, o.name, o.kind) for o in options] == [
        ("allow", "Allow", "allow_once"), ("reject", "Reject", "reject_once"),
    ]  # fmt: skip
    assert allowed.stop_reason == everything.stop_reason == "end_turn"
    assert editor.text(sid).startswith("allowedDone.")
    assert editor.text(sid, "agent_thought_chunk") == "Thinking it over."
    assert [e.content for e in editor.of(sid, "plan")[-1].entries] == ["Read the data", "Plot it"]
    updates = editor.of(sid, "tool_call_update")
    [place] = [place for u in updates for place in u.locations or []]
    assert (place.path, place.line) == (str(root / "data.csv"), 1)
    [diff] = [c for u in updates for c in u.content or [] if c.type == "diff"]
    assert (diff.path, diff.new_text) == (str(root / "plot.py"), "x = 2\n")
    assert (everything.usage.input_tokens, everything.usage.output_tokens) == (100, 20)
    # A file the editor links, under its project, is a file of the run's input.
    runs = session_runs(server, sid)
    assert runs[0]["input"]["files"] == ["notes.txt"]
    assert runs[0]["input"]["prompt"].startswith("echo read it")


async def test_cancel_in_the_editor_cancels_the_run(server, tmp_path):
    editor = Editor()
    async with bridge(server, editor) as (conn, _):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("long")]))
        await editor.until(lambda: editor.of(sid, "agent_message_chunk"))
        await conn.cancel(session_id=sid)
        answer = await asyncio.wait_for(turn, 30)

    assert answer.stop_reason == "cancelled"
    [run] = session_runs(server, sid)
    assert run["status"] == "cancelled" and run["cancel"]["reason"] == "cancelled from the editor"


async def test_a_cancel_that_comes_while_the_run_is_being_submitted_cancels_it(server, tmp_path):
    line = TcpProxy("127.0.0.1", server.port)
    editor = Editor()
    try:
        async with bridge(server, editor, url=f"http://127.0.0.1:{line.port}/") as (conn, _):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            line.pause()  # the submit is on its way, not answered
            turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("x")]))
            await asyncio.sleep(0)  # the turn's task sends the prompt: the cancel goes after it
            await conn.cancel(session_id=sid)
            # Handled in the order sent: once this is answered, the cancel was taken.
            await conn.set_session_mode(session_id=sid, mode_id="demo")
            line.resume()
            answer = await asyncio.wait_for(turn, 30)
    finally:
        line.close()

    assert answer.stop_reason == "cancelled"
    [run] = session_runs(server, sid)
    assert run["status"] == "cancelled"


@pytest.mark.parametrize("quits", ["killed", "stdin closed"])
async def test_an_editor_that_quits_mid_run_leaves_it_going_and_a_new_one_loads_it_all(
    server, tmp_path, quits
):
    first = Editor()
    async with bridge(server, first) as (conn, process):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("go")]))
        await first.until(lambda: first.of(sid, "agent_message_chunk"))
        if quits == "killed":
            process.send_signal(signal.SIGKILL)
        else:  # an editor that quits closes the agent's stdin: the bridge ends on its own
            process.stdin.close()
        assert await asyncio.wait_for(process.wait(), 30) in (0, -signal.SIGKILL)
        turn.cancel()

    [run] = session_runs(server, sid)
    with server.client() as client:
        # The demo streams 40 pieces 50 ms apart: a test can act while it streams.
        run = wait_status(client, run["run_id"], {"succeeded", "failed", "cancelled"})
    assert run["status"] == "succeeded"

    second = Editor()
    async with bridge(server, second) as (conn, _):
        listed = await conn.list_sessions(cwd=str(tmp_path))
        await conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])

    mine = [s for s in listed.sessions if s.session_id == sid]
    assert [(s.title, s.updated_at is not None) for s in mine] == [("go", True)]
    # The whole conversation: the person's prompt, then all the run wrote; no second run.
    assert second.text(sid, "user_message_chunk") == "go"
    assert second.text(sid) == run_text(run)
    assert len(second.of(sid, "tool_call")) == 2
    assert len(session_runs(server, sid)) == 1


async def test_an_open_question_is_asked_again_by_the_bridge_that_loads_the_session(
    server, tmp_path
):
    first = Editor()  # answers nothing: the person closes the editor instead
    async with bridge(server, first) as (conn, process):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        await conn.set_session_mode(session_id=sid, mode_id="asker")
        turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("ask")]))
        await first.until(lambda: first.permissions)
        process.send_signal(signal.SIGKILL)
        await process.wait()
        turn.cancel()

    [run] = session_runs(server, sid)
    assert run["status"] == "waiting"
    second = Editor(answers=["approve"])
    async with bridge(server, second) as (conn, _):
        await conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
        # Followed after the load: the answer goes to the run, and the rest of it comes.
        await second.until(lambda: "Go on? approve." in second.text(sid))

    [(approval, _)] = second.permissions
    assert approval.title == "Go on?"
    with server.client() as client:
        run = wait_status(client, run["run_id"], {"succeeded"})
    assert run["output"] == {"answers": ["approve"]}


async def test_a_dropped_connection_resumes_from_the_last_event(server, tmp_path):
    line = TcpProxy("127.0.0.1", server.port)
    editor = Editor()
    try:
        async with bridge(server, editor, url=f"http://127.0.0.1:{line.port}/") as (conn, _):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("x")]))
            await editor.until(lambda: editor.of(sid, "agent_message_chunk"))
            line.cut()
            line.restore()
            answer = await asyncio.wait_for(turn, 30)
    finally:
        line.close()

    assert answer.stop_reason == "end_turn"
    [run] = session_runs(server, sid)
    assert editor.text(sid) == run_text(run)  # nothing lost, nothing twice


async def test_a_submit_that_cannot_reach_the_server_is_tried_again_as_the_same_run(
    server, tmp_path
):
    line = TcpProxy("127.0.0.1", server.port)
    editor = Editor()
    try:
        async with bridge(server, editor, url=f"http://127.0.0.1:{line.port}/") as (conn, _):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            sid = session.session_id
            await conn.set_session_mode(session_id=sid, mode_id="stepper")
            line.cut()
            turn = asyncio.create_task(conn.prompt(session_id=sid, prompt=[acp.text_block("x")]))
            while line.refused == 0 and not turn.done():  # its first try was refused
                await asyncio.sleep(0.01)
            line.restore()
            answer = await asyncio.wait_for(turn, 30)
    finally:
        line.close()

    assert answer.stop_reason == "end_turn"
    assert len(session_runs(server, sid)) == 1


@pytest.mark.parametrize(
    "change, status, said",
    [
        ({"token": "wrong"}, 77, "refused the token"),
        ({"url": "http://127.0.0.1:9/"}, 69, "Cannot reach"),
        ({"agent": "nobody"}, 64, "no agent 'nobody'"),
    ],
)
def test_a_wrong_server_token_or_agent_is_one_clear_line_at_start(server, change, status, said):
    command = bridge_command(server, url=change.get("url"))
    if "token" in change:
        command[command.index("--token") + 1] = change["token"]
    if "agent" in change:
        command += ["--agent", change["agent"]]
    result = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == status
    assert result.stdout == "" and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert said in line


async def test_a_failed_run_is_an_error_answer_with_its_message(server, tmp_path):
    editor = Editor()
    async with bridge(server, editor) as (conn, _):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.set_session_mode(session_id=session.session_id, mode_id="crashes")
        with pytest.raises(acp.RequestError) as failed:
            await conn.prompt(session_id=session.session_id, prompt=[acp.text_block("load it")])

    [run] = session_runs(server, session.session_id)
    assert run["status"] == "failed"
    assert str(failed.value) == run["error"]["message"]
    assert failed.value.data["run_id"] == run["run_id"]


async def test_resume_replays_the_conversation_and_close_leaves_it_on_the_server(server, tmp_path):
    first = Editor()
    async with bridge(server, first, "--agent", "stepper") as (conn, _):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        assert session.modes.current_mode_id == "stepper"
        for prompt in ("one", "two"):
            await conn.prompt(session_id=sid, prompt=[acp.text_block(prompt)])

    second = Editor()
    async with bridge(server, second) as (conn, _):
        resumed = await conn.resume_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
        await conn.close_session(session_id=sid)
        with pytest.raises(acp.RequestError):  # closed: a prompt needs it opened again
            await conn.prompt(session_id=sid, prompt=[acp.text_block("three")])
        with pytest.raises(acp.RequestError):
            await conn.load_session(cwd=str(tmp_path), session_id="acp-nothing", mcp_servers=[])

    # The conversation's agent, its two prompts each followed by what its run wrote.
    assert resumed.modes.current_mode_id == "stepper"
    said = [
        (u.session_update, u.content.text)
        for _, u in second.updates
        if u.session_update in ("user_message_chunk", "agent_message_chunk")
    ]
    assert said == [
        ("user_message_chunk", "one"), ("agent_message_chunk", "Done."),
        ("user_message_chunk", "two"), ("agent_message_chunk", "Done."),
    ]  # fmt: skip
    assert len(session_runs(server, sid)) == 2


@pytest.mark.parametrize(
    "terminal, stop",
    [
        (
            {"type": "run.succeeded", "data": {"output": {"stop_reason": "max_tokens"}}},
            "max_tokens",
        ),
        ({"type": "run.succeeded", "data": {"output": "text"}}, "end_turn"),
        ({"type": "run.cancelled", "data": {"reason": "no"}}, "cancelled"),
        (
            {"type": "run.failed", "data": {"error": {"type": "refused", "message": "No"}}},
            "refusal",
        ),
    ],
)
def test_a_runs_end_is_the_turns_stop_reason(terminal, stop):
    assert acp_updates.stop_reason(terminal) == stop


def test_an_interrupted_run_is_an_error_that_says_so():
    with pytest.raises(acp.RequestError, match="interrupted: its server died"):
        acp_updates.stop_reason(
            {"type": "run.interrupted", "run_id": "run_x", "data": {"reason": "its server died"}}
        )


def test_a_questions_choices_are_options_those_that_say_no_rejecting():
    options = acp_updates.permission_options(
        {"kind": "choice", "choices": ["csv", "parquet", "No"], "request_id": "r1"}
    )
    assert [(o.option_id, o.kind) for o in options] == [
        ("csv", "allow_once"), ("parquet", "allow_once"), ("No", "reject_once"),
    ]  # fmt: skip


def test_events_with_fields_of_the_wrong_type_become_what_can_be_shown():
    cwd = "/project"
    assert acp_updates.event_updates({"type": "text.delta", "data": {"delta": 3}}, cwd) == []
    [step] = acp_updates.event_updates(
        {"type": "tool.started", "data": {"call_id": "c1", "name": "grep", "kind": "dance"}}, cwd
    )
    assert (step.title, step.kind, step.raw_input) == ("grep", "other", None)
    [done] = acp_updates.event_updates(
        {
            "type": "tool.completed",
            "data": {
                "call_id": "c1",
                "ok": False,
                "error": {"message": "no such file"},
                "content": [{"type": "diff", "path": "a.py"}, "junk"],
                "result": {"locations": [{"path": "src/b.py", "line": 3}, {"line": 1}]},
            },
        },
        cwd,
    )
    assert done.status == "failed" and [c.content.text for c in done.content] == ["no such file"]
    assert [(place.path, place.line) for place in done.locations] == [("/project/src/b.py", 3)]
    [plan] = acp_updates.event_updates(
        {"type": "plan.updated", "data": {"entries": [{"content": "x", "status": "maybe"}, 7]}},
        cwd,
    )
    assert [(e.content, e.status, e.priority) for e in plan.entries] == [("x", "pending", "medium")]


def test_adjacent_deltas_of_one_message_go_as_one_update_and_nothing_else_is_joined():
    def delta(kind, text, message="m1"):
        data = {"message_id": message, "delta": text}
        return {"type": kind, "run_id": "run_x", "data": data}

    events = [
        delta("text.delta", "Hel"), delta("text.delta", "lo"),
        delta("reasoning.delta", "hm"), delta("reasoning.delta", "m"),
        delta("text.delta", " again"), delta("text.delta", "!", "m2"),
        {"type": "tool.started", "data": {"call_id": "c1", "name": "read"}},
        delta("text.delta", "x"), delta("text.delta", "y" * acp_updates.MERGED_TEXT),
    ]  # fmt: skip
    joined = acp_updates.joined(events)
    updates = [u for event in joined for u in acp_updates.event_updates(event, "/")]
    assert [(u.session_update, getattr(u, "content", None) and u.content.text[:6]) for u in updates] == [
        ("agent_message_chunk", "Hello"), ("agent_thought_chunk", "hmm"),
        ("agent_message_chunk", " again"), ("agent_message_chunk", "!"),
        ("tool_call", None), ("agent_message_chunk", "x"), ("agent_message_chunk", "yyyyyy"),
    ]  # fmt: skip
    assert [u.message_id for u in updates if u.session_update == "agent_message_chunk"][:3] == [
        "run_x/m1", "run_x/m1", "run_x/m2",
    ]  # fmt: skip
    assert events[0]["data"]["delta"] == "Hel"  # the events given are left as they were
