"""A scripted ACP agent, written with the SDK's agent side, for the tests of ACP agents.

Run as the ``command`` of an ``acp_agents`` entry. What it does is chosen by
the first word of each prompt:

- ``echo TEXT``: answers TEXT.
- ``all``: every kind of update (a thought, a plan, a read step with its
  output and location, an edit step with its diff, usage), then an answer.
- ``permission``: a step that asks for permission; answers ``allowed`` or
  ``rejected``, or ends its turn cancelled when the request was.
- ``slow N``: N pieces of text, one every 50 ms; stops on ``session/cancel``.
- ``stubborn``: text every 50 ms forever, ``session/cancel`` or not.
- ``flood N [GO]``: N pieces of text as fast as it can (once the file GO exists).
- ``stamped N RATE GO``: once the file GO exists, N pieces of 100 characters at
  RATE a second, each beginning with the time it was sent (``time.time_ns()``).
- ``big``: more than an event holds: a 300 KB piece of text, a step with 2 MB
  of output and content and a 3 MB diff, all in characters JSON escapes.
- ``crash``: a line on stderr (with the value of ``$SECRET``), then exits 3.
- ``stuck``: lines on stderr as a model server's client logs a refusal (with
  the value of ``$SECRET``, terminal colours and markup), then says nothing
  until its turn is cancelled.
- ``refuse`` / ``max_tokens``: ends its turn with that stop reason.
- ``usage IN OUT``: answers ``counted``, its turn's usage IN and OUT tokens.
- ``uncounted TEXT``: a usage update of 0 tokens, then answers TEXT and
  reports 0 tokens in and out (an agent its model server told no counts).
- ``write PATH TEXT`` / ``read PATH``: ``fs/write_text_file`` / ``fs/read_text_file``
  (PATH relative to its session's directory unless absolute); answers what came back.
- ``notebook PATH GO CHANGES``: reads the notebook PATH (leaving what it read in
  ``$ACP_TEST_STATE/read``), waits for the file GO (``-``: not), and writes it back
  with CHANGES (JSON: ``edit`` {id: source}, ``insert`` [{after, id?, source, ...}],
  ``delete`` [id], ``outputs`` (every code cell's outputs replaced), ``no_ids``
  (written as nbformat 4.4, without ids)); answers ``{"meta"}`` (the answer's
  ``_meta``) or ``{"refused", "data"}``.
- ``retitle TITLE``: a ``session_info_update`` giving its session the title TITLE
  (which ``session/list`` then says too); answers ``retitled``.
- ``unlistable``: its ``session/list`` fails from then on; answers ``unlistable``.
- ``notebookcall TOOL ARGUMENTS``: calls TOOL with ARGUMENTS (JSON) on the
  ``jupyter-notebook`` MCP server its session was given (the run's notebook
  tools), over streamable HTTP; answers the tool's text (``error: …`` when it failed).
- ``env``, ``pid``, ``cwd``, ``history``, ``state``, ``requests``, ``blocks``, ``mcp``, ``meta``:
  answers its environment (JSON), its pid, its session's directory, the prompts of its
  session so far (JSON), its mode and model, the mode and option requests its session
  was sent (JSON), the prompt's content blocks (JSON),
  the ``mcpServers`` its session was last opened with in this process (JSON), the
  prompt request's ``_meta`` (JSON).

Its sessions are files under ``$ACP_TEST_STATE/sessions`` (so ``session/load``
works in a new process, replaying the history as updates), and each process
leaves its pid in ``$ACP_TEST_STATE/pids``. A prompt that says the last turn was
interrupted repeats that turn's request. Options: ``--hang-initialize``,
``--auth-required``, ``--no-load`` (no ``loadSession``), ``--exit-at-start``,
``--mcp-http`` (its ``mcpCapabilities`` say ``http``), ``--fork-sessions`` (it offers
``session/fork``: a copy of a session's file, as it is, under a new id), ``--list-sessions`` (it offers
``session/list``, two sessions a page, the one last prompted first, each titled TITLE
or ``FIRST PROMPT (N turns)``),
``--linger`` (it does not exit when its stdin closes), ``--helper`` (it starts
a process of its own that would run for an hour; its pid is left in
``$ACP_TEST_STATE/helpers``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import acp
from acp import (
    plan_entry,
    start_tool_call,
    text_block,
    tool_content,
    tool_diff_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    AuthEnvVar,
    AuthMethodAgent,
    EnvVarAuthMethod,
    ForkSessionResponse,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    SessionCapabilities,
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
    SessionForkCapabilities,
    SessionInfo,
    SessionInfoUpdate,
    SessionListCapabilities,
    SessionMode,
    SessionModeState,
    SetSessionConfigOptionResponse,
    ToolCallLocation,
    ToolCallUpdate,
    Usage,
    UsageUpdate,
)

STATE = Path(os.environ.get("ACP_TEST_STATE", "."))
OPTIONS = set(sys.argv[1:])
INTERRUPTED = "Your last turn was interrupted"


async def wait_for_file(path: str) -> None:
    while path and not os.path.exists(path):
        await asyncio.sleep(0.002)


def session_file(session_id: str) -> Path:
    return STATE / "sessions" / f"{session_id}.json"


class Scripted:
    def __init__(self) -> None:
        self.conn: Any = None
        self.cancelled: set[str] = set()
        self.sessions: dict[str, dict[str, Any]] = {}
        self.mcp_servers: dict[str, list[Any]] = {}  # as each session was last opened
        self.meta: dict[str, Any] = {}  # the last prompt request's _meta

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        if "--hang-initialize" in OPTIONS:
            await asyncio.sleep(3600)
        methods = []
        if "--auth-required" in OPTIONS:
            methods = [
                AuthMethodAgent(
                    id="login", name="Log in", description="Run `scripted login` first"
                ),
                EnvVarAuthMethod(
                    id="key", name="API key", type="env_var", vars=[AuthEnvVar(name="SCRIPTED_KEY")]
                ),
            ]
        return InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session="--no-load" not in OPTIONS,
                mcp_capabilities=McpCapabilities(http="--mcp-http" in OPTIONS),
                session_capabilities=SessionCapabilities(
                    list=SessionListCapabilities() if "--list-sessions" in OPTIONS else None,
                    fork=SessionForkCapabilities() if "--fork-sessions" in OPTIONS else None,
                ),
            ),
            auth_methods=methods,
        )

    def _save(self, session_id: str) -> None:
        path = session_file(session_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.sessions[session_id]))

    def _opened(self, session_id: str) -> dict[str, Any]:
        state = self.sessions[session_id]
        return {
            "modes": SessionModeState(
                current_mode_id=state["mode"],
                available_modes=[
                    SessionMode(id="ask", name="Ask", description="Answers, changes nothing"),
                    SessionMode(id="plan", name="Plan", description="Plans before it acts"),
                ],
            ),
            "config_options": [
                SessionConfigOptionSelect(
                    id="model",
                    name="Model",
                    category="model",
                    type="select",
                    current_value=state["model"],
                    options=[
                        SessionConfigSelectOption(value="small", name="Small"),
                        SessionConfigSelectOption(value="large", name="Large"),
                    ],
                )
            ],
        }

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        if "--auth-required" in OPTIONS:
            raise acp.RequestError.auth_required()
        session_id = f"sess_{os.getpid()}_{len(self.sessions)}"
        self.sessions[session_id] = {"cwd": cwd, "turns": [], "mode": "ask", "model": "small"}
        self._save(session_id)
        self._given(session_id, kwargs.get("mcp_servers"))
        return NewSessionResponse(session_id=session_id, **self._opened(session_id))

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        path = session_file(session_id)
        if not path.exists():
            raise acp.RequestError.resource_not_found(session_id)
        state = self.sessions[session_id] = json.loads(path.read_text())
        self._given(session_id, kwargs.get("mcp_servers"))
        for turn in state["turns"]:
            await self.conn.session_update(session_id, update_user_message_text(turn["prompt"]))
            if turn.get("answer") is not None:
                await self.conn.session_update(
                    session_id, update_agent_message_text(turn["answer"])
                )
        return LoadSessionResponse(**self._opened(session_id))

    async def fork_session(
        self, session_id: str, cwd: str, mcp_servers: Any = None, **kwargs: Any
    ) -> ForkSessionResponse:
        path = session_file(session_id)
        if not path.exists():
            raise acp.RequestError.resource_not_found(session_id)
        copy = f"sess_{os.getpid()}_{len(self.sessions)}_fork"
        self.sessions[copy] = {
            **json.loads(path.read_text()),
            "cwd": cwd,
            "forked_from": session_id,
        }
        self._save(copy)
        self._given(copy, mcp_servers)
        return ForkSessionResponse(session_id=copy, **self._opened(copy))

    async def list_sessions(
        self, cursor: str | None = None, cwd: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        files = sorted(
            (STATE / "sessions").glob("*.json"), key=lambda f: f.stat().st_mtime_ns, reverse=True
        )
        listed = []
        for path in files:
            state = json.loads(path.read_text())
            if state.get("unlistable"):
                raise acp.RequestError.internal_error({"reason": "the session list is broken"})
            if cwd is None or state["cwd"] == cwd:
                turns = state["turns"]
                said = f"{turns[0]['prompt']} ({len(turns)} turns)" if turns else None
                title = state.get("title") or said
                listed.append(SessionInfo(session_id=path.stem, cwd=state["cwd"], title=title))
        start = int(cursor or 0)
        more = start + 2 < len(listed)
        return ListSessionsResponse(
            sessions=listed[start : start + 2], next_cursor=str(start + 2) if more else None
        )

    async def notebook_call(self, session_id: str, tool: str, arguments: dict) -> str:
        """Call ``tool`` of the ``jupyter-notebook`` MCP server the session was given, over
        streamable HTTP with its headers, as an ACP agent does; its text, or why not."""
        import httpx
        from mcp.client.session import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        given = {server.get("name"): server for server in self.mcp_servers.get(session_id, [])}
        server = given.get("jupyter-notebook")
        if server is None:
            return "no jupyter-notebook MCP server in this session"
        headers = {header["name"]: header["value"] for header in server.get("headers", [])}
        async with httpx.AsyncClient(headers=headers, timeout=60) as http:
            async with streamable_http_client(server["url"], http_client=http) as streams:
                async with ClientSession(streams[0], streams[1]) as mcp:
                    await mcp.initialize()
                    result = await mcp.call_tool(tool, arguments)
        text = "".join(getattr(block, "text", "") for block in result.content)
        failed = getattr(result, "is_error", None) or getattr(result, "isError", False)
        return ("error: " if failed else "") + text

    def _given(self, session_id: str, servers: Any) -> None:
        self.mcp_servers[session_id] = [
            server.model_dump(by_alias=True, exclude_none=True) for server in servers or ()
        ]

    async def set_session_mode(self, session_id: str, mode_id: str, **kwargs: Any) -> None:
        self.sessions[session_id]["mode"] = mode_id
        self.sessions[session_id].setdefault("requests", []).append(f"session/set_mode {mode_id}")
        self._save(session_id)

    async def set_config_option(
        self, config_id: str, session_id: str, value: Any, **kwargs: Any
    ) -> SetSessionConfigOptionResponse:
        self.sessions[session_id][config_id] = value
        self.sessions[session_id].setdefault("requests", []).append(
            f"session/set_config_option {config_id} {value}"
        )
        self._save(session_id)
        return SetSessionConfigOptionResponse(
            config_options=self._opened(session_id)["config_options"]
        )

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self.cancelled.add(session_id)

    async def say(self, session_id: str, text: str, message_id: str | None = None) -> None:
        update = update_agent_message_text(text)
        if message_id is not None:
            update.message_id = message_id
        await self.conn.session_update(session_id, update)

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        self.cancelled.discard(session_id)
        self.meta = kwargs
        state = self.sessions[session_id]
        text = "".join(getattr(block, "text", "") for block in prompt[:1]).strip()
        if text.startswith(INTERRUPTED):
            pending = [turn for turn in state["turns"] if turn.get("answer") is None]
            text = pending[-1]["prompt"] if pending else "echo nothing to go on with"
        else:
            state["turns"].append({"prompt": text, "answer": None})
            self._save(session_id)
        word, _, rest = text.partition(" ")
        answer, stop = await self.act(session_id, word, rest, prompt, state)
        said = answer if isinstance(answer, str) else None
        if said is not None:
            await self.say(session_id, said)
        for turn in reversed(state["turns"]):
            if turn["answer"] is None:
                turn["answer"] = said or ""
                break
        self._save(session_id)
        usage = None
        if word == "all":
            usage = Usage(input_tokens=100, output_tokens=20, total_tokens=120)
        elif word == "uncounted":
            usage = Usage(input_tokens=0, output_tokens=0, total_tokens=0)
        elif word == "usage":
            input_tokens, output_tokens = map(int, rest.split())
            usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens,
                          total_tokens=input_tokens + output_tokens)  # fmt: skip
        return PromptResponse(stop_reason=stop, usage=usage)

    async def act(self, session_id: str, word: str, rest: str, prompt: list[Any], state: dict):
        conn = self.conn
        cwd = state["cwd"]
        if word == "echo":
            return rest, "end_turn"
        if word == "usage":
            return "counted", "end_turn"
        if word == "uncounted":
            await conn.session_update(
                session_id, UsageUpdate(session_update="usage_update", used=0, size=0)
            )
            return rest, "end_turn"
        if word == "retitle":
            state["title"] = rest
            await conn.session_update(
                session_id, SessionInfoUpdate(session_update="session_info_update", title=rest)
            )
            return "retitled", "end_turn"
        if word == "unlistable":
            state["unlistable"] = True
            return "unlistable", "end_turn"
        if word == "mcp":
            return json.dumps(self.mcp_servers.get(session_id)), "end_turn"
        if word == "notebookcall":
            tool, _, arguments = rest.partition(" ")
            return await self.notebook_call(session_id, tool, json.loads(arguments)), "end_turn"
        if word == "all":
            await conn.session_update(session_id, update_agent_thought_text("Thinking it over."))
            await conn.session_update(
                session_id,
                update_plan(
                    [
                        plan_entry("Read the data", priority="high", status="in_progress"),
                        plan_entry("Plot it", priority="medium", status="pending"),
                    ]
                ),
            )
            data = os.path.join(cwd, "data.csv")
            await conn.session_update(
                session_id,
                start_tool_call(
                    "read-1", "Read data.csv", kind="read", status="pending",
                    locations=[ToolCallLocation(path=data, line=1)], raw_input={"path": data},
                ),
            )  # fmt: skip
            await conn.session_update(
                session_id,
                update_tool_call(
                    "read-1", status="completed",
                    content=[tool_content(text_block("3 rows"))], raw_output={"rows": 3},
                ),
            )  # fmt: skip
            plot = os.path.join(cwd, "plot.py")
            await conn.session_update(
                session_id,
                start_tool_call("edit-1", "Edit plot.py", kind="edit", status="in_progress"),
            )
            await conn.session_update(
                session_id,
                update_tool_call(
                    "edit-1", status="completed",
                    content=[tool_diff_content(plot, new_text="x = 2\n", old_text="x = 1\n")],
                ),
            )  # fmt: skip
            await conn.session_update(
                session_id, UsageUpdate(session_update="usage_update", used=120, size=1000)
            )
            await self.say(session_id, "Done", "msg-1")
            await self.say(session_id, ".", "msg-1")
            return None, "end_turn"
        if word == "permission":
            await conn.session_update(
                session_id,
                start_tool_call("run-1", "Run make clean", kind="execute", status="pending"),
            )
            response = await conn.request_permission(
                session_id,
                ToolCallUpdate(tool_call_id="run-1", title="Run make clean", kind="execute"),
                [
                    PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
                    PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
                ],
            )
            outcome = response.outcome
            if not isinstance(outcome, AllowedOutcome):
                return None, "cancelled"
            allowed = outcome.option_id == "allow"
            await conn.session_update(
                session_id, update_tool_call("run-1", status="completed" if allowed else "failed")
            )
            return ("allowed" if allowed else "rejected"), "end_turn"
        if word in ("slow", "stubborn"):
            count = int(rest or 10**9)
            for index in range(count):
                if word == "slow" and session_id in self.cancelled:
                    return None, "cancelled"
                await self.say(session_id, f"tick {index} ")
                await asyncio.sleep(0.05)
            return None, "end_turn"
        if word == "big":
            wide = "\u00e9\u4e2d" * 150_000  # 300,000 characters, 1.8 MB as JSON escapes them
            await conn.session_update(
                session_id,
                start_tool_call(
                    "big-1", "Big step", kind="other", status="in_progress",
                    raw_input={"blob": wide},
                ),
            )  # fmt: skip
            await conn.session_update(
                session_id,
                update_tool_call(
                    "big-1", status="completed", raw_output={"blob": wide},
                    content=[
                        tool_content(text_block(wide)),
                        tool_diff_content(os.path.join(cwd, "big.txt"), wide + "x\n", wide),
                    ],
                ),
            )  # fmt: skip
            await self.say(session_id, wide)
            return None, "end_turn"
        if word == "flood":
            count, _, go = rest.partition(" ")
            await wait_for_file(go)
            for index in range(int(count)):
                await self.say(session_id, f"chunk {index} ")
            return None, "end_turn"
        if word == "stamped":
            count, rate, go = rest.split(" ")
            await wait_for_file(go)
            start = time.perf_counter()
            for index in range(int(count)):
                pause = start + index / int(rate) - time.perf_counter()
                if pause > 0:
                    await asyncio.sleep(pause)
                stamp = str(time.time_ns())
                await self.say(session_id, stamp + "x" * (100 - len(stamp)))
            return None, "end_turn"
        if word == "crash":
            sys.stderr.write(f"something broke; the key was {os.environ.get('SECRET')}\n")
            sys.stderr.flush()
            os._exit(3)
        if word == "stuck":
            for index in range(30):
                sys.stderr.write(f"retrying the model server, attempt {index}\n")
            sys.stderr.write(
                "\x1b[31mERROR\x1b[0m <b>500</b> Automatic streaming tool choice is not "
                f"supported (key {os.environ.get('SECRET')})\n"
            )
            sys.stderr.flush()
            while session_id not in self.cancelled:
                await asyncio.sleep(0.05)
            return None, "cancelled"
        if word in ("refuse", "max_tokens"):
            await self.say(session_id, "No.")
            return None, "refusal" if word == "refuse" else "max_tokens"
        if word in ("write", "read"):
            path, _, content = rest.partition(" ")
            path = os.path.join(cwd, path)
            try:
                if word == "write":
                    await conn.write_text_file(session_id, path, content)
                    return "written", "end_turn"
                response = await conn.read_text_file(session_id, path)
                return response.content, "end_turn"
            except acp.RequestError as exc:
                return f"refused: {exc}", "end_turn"
        if word == "notebook":
            return await self.rewrite(session_id, cwd, rest), "end_turn"
        if word == "env":
            # As it was given (os.environ has what Python added since: LC_CTYPE, for one).
            given = Path("/proc/self/environ").read_bytes().split(b"\0")
            pairs = (item.decode().partition("=") for item in given if item)
            return json.dumps({name: value for name, _, value in pairs}), "end_turn"
        if word == "pid":
            return str(os.getpid()), "end_turn"
        if word == "meta":
            return json.dumps(self.meta), "end_turn"
        if word == "cwd":
            return json.dumps({"session": cwd, "process": os.getcwd()}), "end_turn"
        if word == "history":
            return json.dumps([turn["prompt"] for turn in state["turns"]]), "end_turn"
        if word == "requests":
            return json.dumps(state.get("requests", [])), "end_turn"
        if word == "state":
            return json.dumps({"mode": state["mode"], "model": state["model"]}), "end_turn"
        if word == "blocks":
            return json.dumps([block.model_dump(exclude_none=True) for block in prompt]), "end_turn"
        return f"unknown: {word}", "end_turn"

    async def rewrite(self, session_id: str, cwd: str, rest: str) -> str:
        """``notebook PATH GO CHANGES``: read the notebook, wait for GO, write it back changed."""
        path, go, changes = rest.split(" ", 2)
        path = os.path.join(cwd, path)
        changes = json.loads(changes)
        try:
            notebook = json.loads((await self.conn.read_text_file(session_id, path)).content)
            (STATE / "read").write_text(json.dumps(notebook))
            await wait_for_file("" if go == "-" else go)
            cells = notebook["cells"]
            for cell in cells:
                if cell["id"] in changes.get("edit", {}):
                    cell["source"] = changes["edit"][cell["id"]]
            for added in changes.get("insert", []):
                at = [cell["id"] for cell in cells].index(added.pop("after")) + 1
                cells.insert(at, {"cell_type": "code", "metadata": {}, "outputs": [],
                                  "execution_count": None, **added})  # fmt: skip
            notebook["cells"] = [c for c in cells if c["id"] not in changes.get("delete", [])]
            for cell in notebook["cells"]:
                if changes.get("no_ids"):
                    cell.pop("id")
                if changes.get("outputs") and cell["cell_type"] == "code":
                    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x"}]
            if changes.get("no_ids"):
                notebook["nbformat_minor"] = 4
            response = await self.conn.write_text_file(session_id, path, json.dumps(notebook))
        except acp.RequestError as exc:
            return json.dumps({"refused": str(exc), "data": exc.data})
        return json.dumps({"meta": response.field_meta})


async def main() -> None:
    if "--exit-at-start" in OPTIONS:
        sys.stderr.write("cannot start: no configuration\n")
        sys.exit(2)
    pids = STATE / "pids"
    pids.mkdir(parents=True, exist_ok=True)
    (pids / str(os.getpid())).write_text(json.dumps(sys.argv[1:]))
    if "--helper" in OPTIONS:
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        helpers = STATE / "helpers"
        helpers.mkdir(exist_ok=True)
        (helpers / str(helper.pid)).write_text("")
    # session/fork is in the protocol's unstable part: the SDK routes it only when asked to.
    await acp.run_agent(Scripted(), use_unstable_protocol="--fork-sessions" in OPTIONS)
    if "--linger" in OPTIONS:
        time.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
