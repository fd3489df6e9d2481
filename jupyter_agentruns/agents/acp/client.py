"""The ACP client side: a conversation with one agent process, through the SDK's connection.

The agent's session updates and its requests to the client (a permission,
a file to write) reach the run in the order the agent sent them: the SDK
handles each message in a task of its own, and each handler here appends to
the conversation's ``inbox`` before it awaits anything, so the run's turn
(``agent.Turn``) takes them in order. Updates that come while no turn is in
progress (a conversation's history replayed by ``session/load``) are dropped.
File reads are answered at once, under the server's root only; the client
offers no terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections import deque
from collections.abc import Hashable
from importlib.metadata import version
from typing import Any

import acp
from acp import RequestError
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    EnvVariable,
    FileSystemCapabilities,
    HttpHeader,
    HttpMcpServer,
    Implementation,
    InitializeResponse,
    McpServerStdio,
    ReadTextFileResponse,
    RequestPermissionResponse,
    WriteTextFileResponse,
)

from ... import tracing
from .errors import AgentAuthRequired, AgentError, AgentExited
from .files import Files, Refused, excerpt
from .processes import AgentProcess, Pipe

# Messages the run has not taken yet beyond which the agent is read no
# further (it then waits on its own writes), and below which reading goes on.
HIGH_WATER = 512
LOW_WATER = 128
# JSON-RPC's code for "authentication required" in ACP.
AUTH_REQUIRED = -32000
INVALID_PARAMS = -32602
# session/list, asked after each turn for the session's title: how long it may take, and
# how many pages of an agent's sessions are read looking for this one.
LIST_SECONDS = 5.0
LIST_PAGES = 10
CAPABILITIES = ClientCapabilities(
    fs=FileSystemCapabilities(read_text_file=True, write_text_file=True), terminal=False
)

UPDATE, PERMISSION, WRITE = "update", "permission", "write"
# The name under which an agent gets this server's own notebook tools (as in settings).
NOTEBOOK_MCP_NAME = "jupyter-notebook"


def mcp_servers(
    configured: dict[str, dict[str, Any]], notebook: dict[str, Any] | None, http: bool
) -> list[Any]:
    """``mcpServers`` of ``session/new`` and ``session/load``: the configured MCP servers
    (``c.AgentRuns.mcp_servers``) and ``notebook`` (``{"url", "headers"}`` of this server's
    notebook tools with the run's token), those reached over HTTP only when ``http`` (the
    agent's ``mcpCapabilities.http``)."""
    servers: list[Any] = []
    for name, entry in configured.items():
        if "command" in entry:
            command = entry["command"]
            servers.append(
                McpServerStdio(
                    name=name,
                    # ACP asks for the program's absolute path.
                    command=shutil.which(command[0]) or command[0],
                    args=list(command[1:]),
                    env=[EnvVariable(name=k, value=v) for k, v in (entry.get("env") or {}).items()],
                )
            )
        elif http:
            servers.append(http_server(name, entry["url"], entry.get("headers") or {}))
    if notebook is not None and http:
        servers.append(http_server(NOTEBOOK_MCP_NAME, notebook["url"], notebook["headers"]))
    return servers


def http_server(name: str, url: str, headers: dict[str, str]) -> HttpMcpServer:
    return HttpMcpServer(
        type="http",
        name=name,
        url=url,
        headers=[HttpHeader(name=k, value=v) for k, v in headers.items()],
    )


class Conversation:
    """One agent process and its ACP session: one owner's conversation, one turn at a time."""

    def __init__(self, name: str, entry: dict[str, Any], files: Files, log: logging.Logger):
        self.name = name
        self.entry = entry
        self.files = files
        self.log = log
        self.key: Hashable = None
        self.lock = asyncio.Lock()
        self.last_used = time.monotonic()
        self.process: AgentProcess | None = None
        self.pipe: Pipe | None = None
        self.connection: Any = None
        self.info: InitializeResponse | None = None
        self.session_id: str | None = None
        self.cwd: str | None = None
        self.modes: Any = None
        self.options: list[Any] = []
        # The run whose notebook tools' token the session was opened with (None: none).
        self.notebook_run: str | None = None
        # The turn in progress: where updates and requests go (None: nowhere).
        self.turn: Any = None
        self.inbox: deque[tuple[str, Any, asyncio.Future | None]] = deque()
        self.arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False

    @property
    def alive(self) -> bool:
        return not self.closed and (self.process is None or self.process.returncode is None)

    @property
    def can_load(self) -> bool:
        agent = self.info.agent_capabilities if self.info else None  # None if it sent null
        return bool(agent and agent.load_session)

    @property
    def can_resume(self) -> bool:
        agent = self.info.agent_capabilities if self.info else None
        capabilities = agent.session_capabilities if agent else None
        return capabilities is not None and capabilities.resume is not None

    @property
    def can_list(self) -> bool:
        """The agent lists its sessions (``session/list``), with their titles."""
        agent = self.info.agent_capabilities if self.info else None
        capabilities = agent.session_capabilities if agent else None
        return capabilities is not None and capabilities.list is not None

    @property
    def can_fork(self) -> bool:
        """The agent copies a session as it is into a new one (``session/fork``)."""
        agent = self.info.agent_capabilities if self.info else None
        capabilities = agent.session_capabilities if agent else None
        return capabilities is not None and capabilities.fork is not None

    @property
    def takes_http_mcp(self) -> bool:
        """The agent reaches MCP servers over HTTP (its ``mcpCapabilities.http``)."""
        agent = self.info.agent_capabilities if self.info else None
        capabilities = agent.mcp_capabilities if agent else None
        return bool(capabilities and capabilities.http)

    @property
    def embeds_files(self) -> bool:
        agent = self.info.agent_capabilities if self.info else None
        prompt = agent.prompt_capabilities if agent else None
        return bool(prompt and prompt.embedded_context)

    # Starting -------------------------------------------------------------

    async def start(self, cwd: str) -> None:
        """Start the agent's process in ``cwd`` and initialize the protocol."""
        command, env = self.entry["command"], self.entry.get("env", {})
        try:
            # The run that starts it: its trace context, as OpenTelemetry's env carrier names it.
            self.process = await AgentProcess.start(command, {**env, **tracing.environment()}, cwd)
        except OSError as exc:
            self.closed = True
            raise AgentExited(
                f"The agent {self.name!r} cannot be started: {exc.strerror or exc}"
            ) from None
        self.log.info("agentruns: started the ACP agent %r (pid %d)", self.name, self.process.pid)
        self.pipe = Pipe(self.process, self._wait_for_room)
        # The SDK answers "method not found" for what _Client leaves out (terminals, ...);
        # its Client protocol lists every method.
        self.connection = acp.connect_to_agent(_Client(self), self.pipe)  # type: ignore[arg-type]
        timeout = self.entry.get("initialize_timeout", 60)
        initialize = self.connection.initialize(
            protocol_version=acp.PROTOCOL_VERSION,
            client_capabilities=CAPABILITIES,
            client_info=Implementation(
                name="jupyter_agentruns", version=version("jupyter_agentruns")
            ),
        )
        try:
            self.info = await asyncio.wait_for(initialize, timeout)
        except asyncio.TimeoutError:
            tail = self.process.stderr_tail()
            await self.close()
            raise AgentExited(
                f"The agent {self.name!r} did not answer 'initialize' within {timeout:g} s"
                + (f"; it said: {tail}" if tail else "")
            ) from None
        except Exception as exc:
            raise await self.failure(exc, "initialize") from None
        assert self.info is not None  # the SDK's answer to initialize
        if self.info.protocol_version != acp.PROTOCOL_VERSION:
            await self.close()
            raise AgentError(
                f"The agent {self.name!r} speaks version {self.info.protocol_version} of the "
                f"Agent Client Protocol; this server speaks version {acp.PROTOCOL_VERSION}"
            )

    async def failure(self, exc: BaseException, doing: str) -> Exception:
        """What a request that failed with ``exc`` means for the run (closing the conversation if it is over)."""
        if isinstance(exc, RequestError):
            if exc.code == AUTH_REQUIRED:
                await self.close()
                return AgentAuthRequired(self.login_instructions())
            detail = f"{exc}" + (f" ({exc.data})" if exc.data else "")
            return AgentError(f"The agent {self.name!r} refused {doing!r}: {detail}"[:2000])
        code = await self.process.exited(3) if self.process is not None else None
        tail = self.process.stderr_tail() if self.process is not None else ""
        failure = self.pipe.failure if self.pipe is not None else None
        await self.close()
        if code is None and failure is None and not isinstance(exc, (ConnectionError, OSError)):
            return AgentError(f"The agent {self.name!r} failed during {doing!r}: {exc}"[:2000])
        said = f"; it said: {tail}" if tail else ""
        if failure is not None:
            return AgentError(f"The agent {self.name!r} broke the protocol: {failure}{said}")
        how = f"with code {code}" if code is not None else "its connection"
        return AgentExited(f"The agent {self.name!r} exited ({how}) during {doing!r}{said}")

    def login_instructions(self) -> str:
        """The agent's own ways to log in (its ``authMethods``), for a person to follow."""
        ways = []
        for method in (self.info.auth_methods if self.info else None) or ():
            way = method.name
            if method.description:
                way += f": {method.description}"
            variables = [var.name for var in getattr(method, "vars", None) or ()]
            if variables:
                way += f" (set {', '.join(variables)} in its 'env')"
            args = getattr(method, "args", None)
            if getattr(method, "type", None) == "terminal":
                command = " ".join([*self.entry["command"][:1], *(args or [])])
                way += f" (run `{command}` in a terminal, as the server's user)"
            ways.append(way)
        how = "; ".join(ways) if ways else "see its documentation"
        return f"The agent {self.name!r} needs a login first: {how}"[:2000]

    # Sessions ---------------------------------------------------------------

    async def new_session(self, cwd: str, mcp_servers: list[Any] | None = None) -> None:
        try:
            response = await self.connection.new_session(cwd=cwd, mcp_servers=mcp_servers or [])
        except Exception as exc:
            raise await self.failure(exc, "session/new") from None
        self._opened(response, response.session_id, cwd)

    async def load_session(
        self, session_id: str, cwd: str, mcp_servers: list[Any] | None = None
    ) -> None:
        """Go on with an earlier session: ``session/load`` (its replayed history is dropped) or ``session/resume``."""
        try:
            if self.can_load:
                response = await self.connection.load_session(
                    cwd=cwd, session_id=session_id, mcp_servers=mcp_servers or []
                )
            else:
                response = await self.connection.resume_session(
                    cwd=cwd, session_id=session_id, mcp_servers=mcp_servers or []
                )
        except Exception as exc:
            raise await self.failure(
                exc, "session/load" if self.can_load else "session/resume"
            ) from None
        self._opened(response, session_id, cwd)

    async def fork_session(
        self, session_id: str, cwd: str, mcp_servers: list[Any] | None = None
    ) -> None:
        """Go on in a copy of an earlier session as it is (``session/fork``), leaving it as it was."""
        try:
            response = await self.connection.fork_session(
                session_id=session_id, cwd=cwd, mcp_servers=mcp_servers or []
            )
        except Exception as exc:
            raise await self.failure(exc, "session/fork") from None
        self._opened(response, response.session_id, cwd)

    def _opened(self, response: Any, session_id: str, cwd: str) -> None:
        self.session_id, self.cwd = session_id, cwd
        self.modes = getattr(response, "modes", None)
        self.options = list(getattr(response, "config_options", None) or ())

    def offered(self) -> dict[str, Any]:
        """The session's modes and models as ``GET agents`` lists them: ``modes`` and ``models``
        (``[{id, name, description?}]``, each where the agent has some) and their ``current`` ids,
        from its ``modes`` and its ``configOptions`` of category ``mode`` / ``model``."""
        found: dict[str, list[dict[str, str]]] = {"mode": [], "model": []}
        current: dict[str, str] = {}

        def add(category: str, id: str, name: str, description: str | None) -> None:
            if all(choice["id"] != id for choice in found[category]):
                choice = {"id": id, "name": name or id}
                if description:
                    choice["description"] = description
                found[category].append(choice)

        if self.modes is not None:
            for mode in self.modes.available_modes:
                add("mode", mode.id, mode.name, mode.description)
            current["mode"] = self.modes.current_mode_id
        for option in self.options:
            category = getattr(option, "category", None)
            if category not in found or option.type != "select":
                continue
            for choice in select_choices(option):
                add(category, choice.value, choice.name, choice.description)
            current.setdefault(category, option.current_value)
        answer: dict[str, Any] = {
            f"{category}s": choices for category, choices in found.items() if choices
        }
        if answer:
            answer["current"] = {category: current[category] for category in current}
        return answer

    async def choose(self, category: str, value: str) -> None:
        """Set the session's mode or model to ``value`` (raises ``ValueError`` naming the ones it has)."""
        known: list[str] = []
        if category == "mode" and self.modes is not None:
            known = [mode.id for mode in self.modes.available_modes]
            if value in known:
                await self._request(
                    self.connection.set_session_mode(session_id=self.session_id, mode_id=value),
                    "session/set_mode",
                )
                return
        for option in self.options:
            if getattr(option, "category", None) != category or option.type != "select":
                continue
            values = [choice.value for choice in select_choices(option)]
            known += values
            if value in values:
                await self._request(
                    self.connection.set_config_option(
                        config_id=option.id, session_id=self.session_id, value=value
                    ),
                    "session/set_config_option",
                )
                return
        offered = ", ".join(sorted(set(known))) or "none it lets a client choose"
        raise ValueError(
            f"the agent {self.name!r} has no {category} {value!r} (its {category}s: {offered})"
        )

    async def listed_title(self) -> str | None:
        """The title ``session/list`` gives this conversation's session (None: none).

        Raises what the request raised, or ``TimeoutError`` past ``LIST_SECONDS``.
        """
        cursor = None
        for _ in range(LIST_PAGES):
            listing = await asyncio.wait_for(
                self.connection.list_sessions(cwd=self.cwd, cursor=cursor), LIST_SECONDS
            )
            for session in listing.sessions:
                if session.session_id == self.session_id:
                    return session.title
            cursor = listing.next_cursor
            if not cursor:
                break
        return None

    async def _request(self, request: Any, doing: str) -> Any:
        try:
            return await request
        except Exception as exc:
            raise await self.failure(exc, doing) from None

    async def cancel(self) -> None:
        """``session/cancel`` for the turn in progress (a notification: nothing comes back)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.connection.cancel(session_id=self.session_id), 2)

    # What the agent sends, in order ------------------------------------------

    def deliver(self, kind: str, payload: Any, answered: asyncio.Future | None = None) -> None:
        self.inbox.append((kind, payload, answered))
        self.arrived.set()
        if len(self.inbox) >= HIGH_WATER:
            self._room.clear()

    def take(self) -> tuple[str, Any, asyncio.Future | None]:
        item = self.inbox.popleft()
        if len(self.inbox) <= LOW_WATER:
            self._room.set()
        return item

    async def _wait_for_room(self) -> None:
        while len(self.inbox) >= HIGH_WATER:
            self._room.clear()
            await self._room.wait()

    async def ask(self, kind: str, payload: Any) -> Any:
        """Hand a request of the agent to the turn in progress and wait for its answer (None: cancelled)."""
        if self.turn is None:
            return None
        answered = asyncio.get_running_loop().create_future()
        self.deliver(kind, payload, answered)
        return await answered

    def drop(self) -> None:
        """The turn ended: nothing more goes to it; what it did not take is answered "cancelled"."""
        self.turn = None
        while self.inbox:
            _, _, answered = self.inbox.popleft()
            if answered is not None and not answered.done():
                answered.set_result(None)
        self._room.set()

    async def close(self) -> None:
        """End the conversation: its process stops (and with it whatever it started)."""
        if self.closed:
            return
        self.closed = True
        self.drop()
        if self.connection is not None:
            with contextlib.suppress(Exception):
                await self.connection.close()
        if self.process is not None:
            await self.process.stop()
            self.log.info("agentruns: the ACP agent %r (pid %d) ended", self.name, self.process.pid)


def select_choices(option: Any) -> list[Any]:
    """The values of a ``select`` config option, its groups flattened."""
    return [
        choice
        for group in option.options
        for choice in (getattr(group, "options", None) or [group])
        if getattr(choice, "value", None) is not None
    ]


class _Client:
    """What the agent asks of this client (the SDK's ``Client`` interface)."""

    def __init__(self, conversation: Conversation):
        self._conversation = conversation

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        conversation = self._conversation
        if conversation.turn is not None and session_id == conversation.session_id:
            conversation.deliver(UPDATE, update)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> RequestPermissionResponse:
        choice = await self._conversation.ask(PERMISSION, (tool_call, options))
        if choice is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=choice)
        )

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> ReadTextFileResponse:
        files, turn = self._conversation.files, self._conversation.turn
        try:
            # A notebook as its run's notebook tools see it (the open document), else the file.
            notebook = await turn.read_notebook(path) if turn is not None else None
            if notebook is not None:
                text = excerpt(notebook, line, limit)
            else:
                text = await files.read(path, line, limit)
        except Refused as exc:
            raise RequestError(INVALID_PARAMS, str(exc)) from None
        return ReadTextFileResponse(content=text)

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse:
        try:
            self._conversation.files.resolve(path)
        except Refused as exc:
            raise RequestError(INVALID_PARAMS, str(exc)) from None
        # The turn writes it and records the step: True, or why it could not.
        written = await self._conversation.ask(WRITE, (path, content))
        if written is True:
            return WriteTextFileResponse()
        if isinstance(written, dict):  # a notebook, changed cell by cell: what changed
            return WriteTextFileResponse(field_meta=written)
        raise RequestError(INVALID_PARAMS, written or "no turn is in progress: nothing was written")
