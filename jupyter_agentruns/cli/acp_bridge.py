"""``jupyter agentruns acp``: an ACP agent on stdio whose turns are runs of a Jupyter server.

An editor (Zed, JetBrains, Neovim, ...) starts it as it starts any ACP agent,
and talks to the server's agents through it with the person's token:

- ``session/new``: a conversation on the server (session ``acp-<uuid>``), its
  agent ``--agent`` or the server's ``default_agent``; the session's modes are
  the server's agents, and ``session/set_mode`` picks the next prompt's.
- ``session/prompt``: a run in that conversation (``POST runs``, one
  Idempotency-Key per prompt), its events streamed back as session updates
  (``acp_updates.py``) over SSE, resumed from the last ``seq`` when the
  connection drops; a question is ``session/request_permission``, the answer
  posted to the run; the run's end is the turn's stop reason.
- ``session/cancel``: cancels the run. Nothing else does: an editor that quits
  mid-run leaves the run going on the server.
- ``session/load`` and ``session/resume``: the conversation replayed from the
  store (each run's prompt, then its events), a run still going followed, its
  open questions asked again. ``session/list``: the person's conversations.

This is a client of the REST API, like the other server commands: the
blocking ``Client`` runs in worker threads, each run's stream in a thread of
its own (``remote.follow``, the same loop as ``tail``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import acp
from acp import RequestError, update_agent_message_text
from acp.schema import (
    AgentCapabilities,
    CloseSessionResponse,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionInfo,
    SessionListCapabilities,
    SessionMode,
    SessionModeState,
    SessionResumeCapabilities,
)

from ..kernel.client import AgentRunsError, Client, ServerNotFound
from ..lifecycle import TERMINAL_STATUSES
from . import acp_updates, exits, remote
from .exits import CliError
from .output import items, mapping

# A stream gives up after the server was unreachable this long in a row (the
# run goes on: loading the session again follows it).
GIVE_UP_SECONDS = 300
READ_TIMEOUT_SECONDS = 120
# Tries of a submit when the server cannot be reached (the same Idempotency-Key each time).
SUBMIT_TRIES = 4
EVENTS_PAGE = 1000
# Events a stream hands over at most at once (their text joined, see acp_updates.joined).
BATCH = 1000
LIST_PAGE = 50
CANCEL_REASON = "cancelled from the editor"
# ACP's "resource not found" (a run or session the server does not have for this token).
RESOURCE_NOT_FOUND = -32002


class _Stopped(Exception):
    """The stream's reader was told to stop (the session was closed)."""


class _Feed:
    """``remote.follow``'s printer: what its thread receives goes to the event loop's queue,
    as lists of what came since the loop last took some (one wake-up of the loop each)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self.loop = loop
        self.queue = queue
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._pending: list[tuple[str, Any]] = []

    def put(self, kind: str, value: Any) -> None:
        if self.stopped.is_set():
            raise _Stopped
        with self._lock:
            self._pending.append((kind, value))
            if len(self._pending) > 1:
                return  # the loop is to take it with those before it
        self.loop.call_soon_threadsafe(self._hand_over)

    def _hand_over(self) -> None:
        with self._lock:
            taken, self._pending = self._pending, []
        self.queue.put_nowait(taken)

    def event(self, event: dict[str, Any]) -> None:
        self.put("event", event)

    def snapshot(self, seq: int, run: dict[str, Any]) -> None:
        self.put("snapshot", run)

    def end(self) -> None:
        pass


def stream(client: Client, run_id: str, after: int) -> tuple[_Feed, asyncio.Queue]:
    """The run's events after ``after``, read in a thread. The queue holds lists of
    ``("event", e)`` and ``("snapshot", run)``, then ``("end", status)`` or ``("error", exception)``."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    feed = _Feed(loop, queue)

    def read() -> None:
        reconnects = remote.Reconnects(run_id, GIVE_UP_SECONDS, sys.stderr)
        try:
            status = remote.follow(
                client,
                run_id,
                after=after,
                printer=feed,
                reconnects=reconnects,
                read_timeout=READ_TIMEOUT_SECONDS,
            )
            feed.put("end", status)
        except _Stopped:
            pass
        except BaseException as error:  # handed to the loop, which says it
            with contextlib.suppress(_Stopped, RuntimeError):  # RuntimeError: the loop closed
                feed.put("error", error)

    # A daemon: an editor that quits ends the bridge at once, whatever its streams do.
    threading.Thread(target=read, name=f"stream {run_id}", daemon=True).start()
    return feed, queue


@dataclass
class Session:
    """An editor's session: one conversation (``session``) on the server."""

    session_id: str
    agent: str
    cwd: str
    # Runs of the session this bridge follows (a prompt's, a loaded session's), to cancel.
    active: set[str] = field(default_factory=set)
    # A cancel came while a prompt's run was being submitted: it is cancelled once it exists.
    cancel_requested: bool = False
    followers: set[asyncio.Task] = field(default_factory=set)
    feeds: set[_Feed] = field(default_factory=set)


@dataclass
class Steps:
    """The steps of a run in progress: a question is about the one that started last."""

    open: list[str] = field(default_factory=list)

    def see(self, event: dict[str, Any]) -> None:
        call_id = mapping(event.get("data")).get("call_id")
        if event.get("type") == "tool.started" and isinstance(call_id, str):
            self.open.append(call_id)
        elif event.get("type") == "tool.completed" and call_id in self.open:
            self.open.remove(call_id)

    @property
    def current(self) -> str | None:
        return self.open[-1] if self.open else None


class Bridge:
    """The ACP agent: each method is one request of the editor, answered through the REST API."""

    def __init__(self, client: Client, agents: list[dict[str, Any]], agent: str):
        self.client = client
        self.agents = agents
        self.agent = agent
        self.conn: Any = None
        self.sessions: dict[str, Session] = {}

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """A blocking API call, in a worker thread; the API's errors as the editor's."""
        try:
            return await asyncio.to_thread(function, *args, **kwargs)
        except AgentRunsError as error:
            raise api_error(error) from None
        except ServerNotFound as error:
            raise RequestError(acp_updates.RUN_FAILED, str(error)) from None

    # Starting ---------------------------------------------------------------------

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(embedded_context=True),
                session_capabilities=SessionCapabilities(
                    list=SessionListCapabilities(),
                    resume=SessionResumeCapabilities(),
                    close=SessionCloseCapabilities(),
                ),
            ),
            agent_info=Implementation(
                name="jupyter-agentruns",
                title="Jupyter agent runs",
                version=version("jupyter_agentruns"),
            ),
            auth_methods=[],
        )

    def modes(self, agent: str) -> SessionModeState:
        """The session's modes: the server's agents."""
        return SessionModeState(
            current_mode_id=agent,
            available_modes=[
                SessionMode(
                    id=spec["name"], name=spec["name"], description=spec.get("description") or None
                )
                for spec in self.agents
            ],
        )

    async def new_session(self, cwd: str, **kwargs: Any) -> NewSessionResponse:
        session = Session(f"acp-{uuid.uuid4().hex}", self.agent, cwd)
        self.sessions[session.session_id] = session
        return NewSessionResponse(session_id=session.session_id, modes=self.modes(session.agent))

    async def set_session_mode(self, session_id: str, mode_id: str, **kwargs: Any) -> None:
        session = self.session(session_id)
        if all(spec["name"] != mode_id for spec in self.agents):
            names = ", ".join(spec["name"] for spec in self.agents)
            raise RequestError.invalid_params(
                {"mode_id": f"no agent {mode_id!r} (agents: {names})"}
            )
        session.agent = mode_id

    def session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise RequestError.resource_not_found(session_id)
        return session

    # A turn -----------------------------------------------------------------------

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        session = self.session(session_id)
        spec = next((spec for spec in self.agents if spec["name"] == session.agent), {})
        text, files = prompt_input(prompt, session.cwd)
        input: dict[str, Any] = {"prompt": text}
        if files and "files" in mapping(mapping(spec.get("input_schema")).get("properties")):
            input["files"] = files
        body = {"agent": session.agent, "input": input, "session": session.session_id}
        session.cancel_requested = False
        run = await self.submit(body, "acp-" + uuid.uuid4().hex)
        run_id = run["run_id"]
        session.active.add(run_id)
        try:
            if session.cancel_requested:
                await self.call(self.client.cancel, run_id, CANCEL_REASON)
            ended = await self.follow(session, run_id, 0, Steps())
        finally:
            session.active.discard(run_id)
        stop = acp_updates.stop_reason(terminal_event(ended))
        return PromptResponse(stop_reason=stop, usage=acp_updates.prompt_usage(ended))

    async def submit(self, body: dict[str, Any], key: str) -> dict[str, Any]:
        """``POST runs``, tried again with the same key while the server cannot be reached."""
        backoff = remote.Backoff()
        for attempt in range(SUBMIT_TRIES):
            try:
                run, _ = await asyncio.to_thread(self.client.submit, body, key)
                return run
            except ServerNotFound as error:
                if attempt == SUBMIT_TRIES - 1:
                    raise RequestError(acp_updates.RUN_FAILED, str(error)) from None
                await asyncio.sleep(backoff.next())
            except AgentRunsError as error:
                raise api_error(error) from None
        raise AssertionError("unreachable")

    async def follow(
        self,
        session: Session,
        run_id: str,
        after: int,
        steps: Steps,
        open_questions: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        """Send the run's events after ``after`` to the editor until its end, asking its
        ``open_questions`` and those that come; returns the run."""
        feed, queue = stream(self.client, run_id, after)
        session.feeds.add(feed)
        asking: set[asyncio.Task] = set()

        def ask(request: dict[str, Any]) -> None:
            task = asyncio.create_task(self.ask(session, run_id, request, steps.current))
            asking.add(task)
            task.add_done_callback(asking.discard)

        for request in open_questions:
            ask(request)
        try:
            ended = False
            while not ended:
                # What came meanwhile goes as one batch: a run's deltas, several to an update.
                batch = await queue.get()
                while not queue.empty() and len(batch) < BATCH:
                    batch += queue.get_nowait()
                events: list[dict[str, Any]] = []
                questions: list[dict[str, Any]] = []
                for kind, value in batch:
                    if kind == "event":
                        events.append(value)
                        if value.get("type") == "input.requested":
                            questions.append(mapping(value.get("data")))
                        continue
                    await self.send(session, events, steps)
                    events = []
                    if kind == "snapshot":
                        text = acp_updates.snapshot_text(value)
                        if text:
                            await self.update(session, update_agent_message_text(text))
                    elif kind == "error":
                        if isinstance(value, CliError):  # the server stayed away, or refused
                            raise RequestError(
                                acp_updates.RUN_FAILED,
                                f"stopped following the run {run_id}, which goes on on the "
                                "server: open this chat again to follow it",
                                {"run_id": run_id, "cause": str(value)},
                            )
                        raise value
                    else:
                        ended = True
                await self.send(session, events, steps)
                for request in questions:  # once the editor has the step they are about
                    ask(request)
        finally:
            feed.stopped.set()
            session.feeds.discard(feed)
            for task in asking:
                task.cancel()
        return await self.call(self.client.get_run, run_id)

    async def send(self, session: Session, events: list[dict[str, Any]], steps: Steps) -> None:
        """A run's events to the editor as session updates, in order, adjacent deltas as one."""
        for event in events:
            steps.see(event)
        for event in acp_updates.joined(events):
            for update in acp_updates.event_updates(event, session.cwd):
                await self.update(session, update)

    async def update(self, session: Session, update: Any) -> None:
        await self.conn.session_update(session_id=session.session_id, update=update)

    async def ask(
        self, session: Session, run_id: str, request: dict[str, Any], call_id: str | None
    ) -> None:
        """A run's question as ``session/request_permission``; the editor's answer goes to the run."""
        options = acp_updates.permission_options(request)
        request_id = request.get("request_id")
        if not options or not isinstance(request_id, str):
            return
        try:
            response = await self.conn.request_permission(
                session_id=session.session_id,
                tool_call=acp_updates.permission_tool_call(request, call_id, session.cwd),
                options=options,
            )
        except Exception as error:  # the editor could not ask: the run still waits for an answer
            sys.stderr.write(
                f"jupyter agentruns acp: the editor did not ask {request_id}: {error}\n"
            )
            return
        outcome = response.outcome
        if getattr(outcome, "outcome", None) != "selected":
            return  # the editor cancelled its turn: session/cancel says what to do
        try:
            await asyncio.to_thread(self.client.answer, run_id, request_id, outcome.option_id)
        except (AgentRunsError, ServerNotFound) as error:
            # Answered meanwhile (in JupyterLab, by another editor) or the run ended: nothing to do.
            sys.stderr.write(f"jupyter agentruns acp: the answer was not taken: {error}\n")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        session = self.sessions.get(session_id)
        if session is None:
            return
        session.cancel_requested = True
        for run_id in list(session.active):
            await self.call(self.client.cancel, run_id, CANCEL_REASON)

    # Going back to a conversation -------------------------------------------------

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        session = await self.reopen(cwd, session_id)
        return LoadSessionResponse(modes=self.modes(session.agent))

    async def resume_session(
        self, cwd: str, session_id: str, **kwargs: Any
    ) -> ResumeSessionResponse:
        session = await self.reopen(cwd, session_id)
        return ResumeSessionResponse(modes=self.modes(session.agent))

    async def reopen(self, cwd: str, session_id: str) -> Session:
        """Replay the conversation's runs, the oldest first; follow the last if it is going on."""
        runs = await self.call(self.session_runs, session_id)
        if not runs:
            raise RequestError.resource_not_found(session_id)
        known = {spec["name"] for spec in self.agents}
        agent = runs[-1].get("agent")
        session = Session(session_id, agent if agent in known else self.agent, cwd)
        old = self.sessions.get(session_id)
        if old is not None:
            self.forget(old)
        self.sessions[session_id] = session
        for run in runs:
            steps = Steps()
            user = acp_updates.user_message(run)
            if user is not None:
                await self.update(session, user)
            last_seq = await self.replay(session, run, steps)
            if run.get("status") in TERMINAL_STATUSES:
                continue
            # Still going: its open questions asked again, the rest of it followed after the answer.
            session.active.add(run["run_id"])
            task = asyncio.create_task(self.go_on(session, run, last_seq, steps))
            session.followers.add(task)
            task.add_done_callback(session.followers.discard)
        return session

    def session_runs(self, session_id: str) -> list[dict[str, Any]]:
        """Every run of the session, the oldest first."""
        runs: list[dict[str, Any]] = []
        before = None
        while True:
            page = self.client.list_runs(
                session=session_id, limit=remote.LIST_PAGE_MAX, before=before
            )
            runs += map(mapping, items(page.get("runs")))
            before = page.get("next")
            if not before or not isinstance(before, str):
                return runs[::-1]

    async def replay(self, session: Session, run: dict[str, Any], steps: Steps) -> int:
        """The run's kept events up to its ``last_seq`` as updates; returns that ``seq``."""
        last_seq = run.get("last_seq") or 0
        after = 0
        while after < last_seq:
            page = await self.call(self.client.events_page, run["run_id"], after, EVENTS_PAGE)
            if "snapshot" in page:  # the first events were compacted: their text, at once
                snapshot = mapping(page["snapshot"])
                text = acp_updates.snapshot_text(snapshot)
                if text:
                    await self.update(session, update_agent_message_text(text))
                after = max(after, snapshot.get("last_seq") or 0)
            events = [event for event in items(page.get("events")) if event["seq"] > after]
            if not events:
                break
            kept = [event for event in events if event["seq"] <= last_seq]
            await self.send(session, kept, steps)
            after = kept[-1]["seq"] if kept else after
            if after < events[-1]["seq"]:
                break
        return last_seq

    async def go_on(self, session: Session, run: dict[str, Any], after: int, steps: Steps) -> None:
        """Follow a run that was going on when its session was loaded, asking what is open."""
        run_id = run["run_id"]
        inputs = map(mapping, items(mapping(run.get("snapshot")).get("inputs")))
        try:
            await self.follow(
                session,
                run_id,
                after,
                steps,
                [item for item in inputs if item.get("status") == "open"],
            )
        except RequestError as error:
            sys.stderr.write(f"jupyter agentruns acp: stopped following {run_id}: {error}\n")
        finally:
            session.active.discard(run_id)

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        """The person's conversations on the server, the newest first (one per session)."""
        page = await self.call(self.client.conversations, limit=LIST_PAGE, before=cursor)
        sessions: list[SessionInfo] = []
        for conversation in map(mapping, items(page.get("conversations"))):
            name = conversation.get("session")
            if not isinstance(name, str) or any(s.session_id == name for s in sessions):
                continue
            title = conversation.get("title")
            updated = conversation.get("updated_at")
            sessions.append(
                SessionInfo(
                    session_id=name,
                    cwd=cwd or os.getcwd(),
                    title=title if isinstance(title, str) else None,
                    updated_at=updated if isinstance(updated, str) else None,
                )
            )
        after = page.get("next")
        return ListSessionsResponse(
            sessions=sessions, next_cursor=after if isinstance(after, str) else None
        )

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        """The editor is done with the session: it is no longer followed (its runs go on)."""
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self.forget(session)
        return CloseSessionResponse()

    def forget(self, session: Session) -> None:
        for feed in session.feeds:
            feed.stopped.set()
        for task in session.followers:
            task.cancel()


def api_error(error: AgentRunsError) -> RequestError:
    """An error the API answered, as the editor gets it: its message, the answer in ``data``."""
    code = RESOURCE_NOT_FOUND if error.status in (404, 410) else acp_updates.RUN_FAILED
    data = {"status": error.status, **error.body}
    return RequestError(code, error.message or error.code, data)


def prompt_input(blocks: list[Any], cwd: str) -> tuple[str, list[str]]:
    """A prompt's text, and the files it links that are under the editor's project (relative
    to it: the server's root when the editor opened the same directory)."""
    parts: list[str] = []
    files: list[str] = []
    root = Path(cwd).resolve()
    for block in blocks:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource_link":
            path = file_path(block.uri)
            inside = path is not None and (path == root or root in path.parents)
            if inside:
                files.append(path.relative_to(root).as_posix())  # type: ignore[union-attr]
            parts.append(f"[{block.name or block.uri}]({block.uri})")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            if isinstance(text, str):
                parts.append(f"\n{resource.uri}:\n```\n{text}\n```\n")
    return "\n".join(part for part in parts if part), files


def file_path(uri: str) -> Path | None:
    parts = urlsplit(uri)
    if parts.scheme != "file":
        return None
    return Path(unquote(parts.path)).resolve()


def terminal_event(run: dict[str, Any]) -> dict[str, Any]:
    """The ended run's terminal event, as the run object says it (its output or error)."""
    status = run.get("status")
    return {
        "type": f"run.{status}",
        "run_id": run.get("run_id"),
        "data": {
            "output": run.get("output"),
            "error": run.get("error"),
            "reason": mapping(run.get("cancel")).get("reason"),
        },
    }


def choose_agent(answer: dict[str, Any], wanted: str | None) -> tuple[list[dict[str, Any]], str]:
    """The server's agents (``GET agents``) and the one new sessions start with."""
    agents = [spec for spec in map(mapping, items(answer.get("agents"))) if spec.get("name")]
    names = [spec["name"] for spec in agents]
    agent = wanted or answer.get("default_agent")
    if agent not in names:
        raise CliError(
            f"the server has no agent {agent!r} (its agents: {', '.join(names) or 'none'}): "
            "pass --agent with one of them",
            exits.USAGE,
        )
    return agents, agent  # type: ignore[return-value]


def serve(client: Client, wanted: str | None) -> int:
    """Check the server and the token, then be an ACP agent on stdin and stdout until stdin ends."""
    # Before any ACP: a wrong URL or token is one line on stderr and an exit status,
    # which an editor shows as the agent server's failure.
    _, _, answer = client.request("GET", "agents")
    agents, agent = choose_agent(mapping(answer), wanted)
    # session/resume and session/close are in the SDK's "unstable" part of the protocol.
    # The SDK's Agent protocol lists every method; the SDK answers "method not found" for the rest.
    bridge = Bridge(client, agents, agent)
    asyncio.run(acp.run_agent(bridge, use_unstable_protocol=True))  # type: ignore[arg-type]
    return exits.OK
