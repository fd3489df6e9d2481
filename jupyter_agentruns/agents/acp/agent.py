"""An ACP agent as an agent of this server: each run is one turn of a conversation.

Runs of one owner and ``session`` continue one ACP session: in the process
kept from the last turn when there is one, else loaded (``session/load`` or
``session/resume``) from the checkpoint an earlier run saved, else a new one
(the run says so with an ``x.acp_new_conversation`` event). A run taken over
after its server died loads its own session without appending the replayed
history, offers its open permission question again, and asks the agent to
go on.

A run of an agent that offers ``session/fork`` can be forked where its turn
ended, while it is the latest turn of its conversation: the fork's run goes on
in a copy of that ACP session (``session/fork``), which leaves the original as
it was. An ACP session is copied as it is now, so not from inside a turn, nor
once the conversation went on.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from acp.schema import (
    EmbeddedResourceContentBlock,
    ResourceContentBlock,
    TextContentBlock,
    TextResourceContents,
)

from ... import tracing
from ...lifecycle import TERMINAL_EVENTS
from .. import ForkPoint, ForkUnsupported
from ..steps import ask_once
from . import mapping
from .client import PERMISSION, UPDATE, Conversation, mcp_servers
from .errors import AgentError, CannotFork, CannotResume, InvalidInput, Refusal
from .files import MAX_READ_BYTES, Files, Refused
from .processes import Processes

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "prompt": {"type": "string", "minLength": 1, "maxLength": 1_000_000},
        "files": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": 4096},
            "maxItems": 100,
            "description": "paths under the server's root, as JupyterLab names them",
        },
        "mode": {"type": "string", "minLength": 1, "maxLength": 200},
        "model": {"type": "string", "minLength": 1, "maxLength": 200},
    },
    "required": ["prompt"],
    "additionalProperties": False,
}
# What a run taken over asks the agent once its conversation is loaded again.
CONTINUE_PROMPT = (
    "Your last turn was interrupted: the Jupyter server running you stopped before you "
    "answered. Its request was:\n\n{prompt}\n\nGo on with it from where you were, without "
    "doing again the steps that are done."
)
# How long an agent has to end its turn after session/cancel before its process is ended.
CANCEL_SECONDS = 3.0
# A file given in the input is sent whole (when the agent takes embedded files) up to this size.
EMBED_BYTES = 256 * 1024


class AcpAgent:
    """One entry of ``c.AgentRuns.acp_agents``: a program speaking ACP over stdio.

    Its modes and models are known once it has opened a session (its process
    starts at its first run, not with the server): ``choices()`` says those
    of the last session it opened, and a run naming another is refused at submit.
    """

    input_schema = INPUT_SCHEMA
    choices_checked = True
    # It forks a conversation as a turn left it, not from one of the turn's steps.
    forks_steps = False

    def __init__(
        self,
        name: str,
        entry: dict[str, Any],
        *,
        files: Files,
        processes: Processes,
        log: logging.Logger,
    ):
        self.name = name
        self.entry = entry
        self.files = files
        self.processes = processes
        self.log = log
        command = " ".join(entry["command"])
        self.description = entry.get("description") or f"An ACP agent: {command}"
        self.resumable = bool(entry.get("resumable", False))
        self.offered: dict[str, Any] | None = None

    def choices(self) -> dict[str, Any] | None:
        """The modes and models its last opened session offered (None before its first)."""
        return self.offered

    def remember(self, offered: dict[str, Any]) -> None:
        self.offered = offered

    def fork(self, point: ForkPoint) -> dict[str, Any]:
        """A fork's input (``POST runs/{id}/fork``), where the original's turn ended and its
        conversation did not go on; the run then forks the ACP session (``session/fork``)."""
        checkpoint = point.checkpoint if isinstance(point.checkpoint, dict) else {}
        last = point.events[-1]["type"] if point.events else None
        if last not in TERMINAL_EVENTS or not checkpoint.get("stop_reason"):
            raise ForkUnsupported(
                "an ACP agent's conversation is copied as a turn left it (session/fork), not "
                "from inside a turn: fork it at its last event, once its turn ended"
            )
        if not checkpoint.get("forks"):
            raise ForkUnsupported(
                f"the agent {self.name!r} does not offer session/fork (its sessionCapabilities)"
            )
        if point.later_runs:
            raise ForkUnsupported(
                f"its conversation went on after it (run {point.later_runs[0]}), and an ACP "
                "agent copies a conversation only as it is now: fork the latest run of it"
            )
        return dict(point.input)

    async def __call__(self, run: Any, input: dict[str, Any]) -> dict[str, Any]:
        cwd = self.working_directory(run)
        attached = [self.attachment(path) for path in input.get("files", [])]
        # A run without a session is a conversation of its own, closed at its end.
        key = (self.name, run.owner, run.session) if run.session is not None else object()
        conversation = await self.processes.acquire(
            key,
            lambda: Conversation(self.name, self.entry, self.files, self.log),
            lambda message: run.progress(None, message),
        )
        turn = Turn(self.name, run, conversation, self.files, self.remember)
        self.processes.turns[run.run_id] = conversation
        try:
            return await turn.take(input, cwd, attached)
        finally:
            self.processes.turns.pop(run.run_id, None)
            # Not awaited here: a cancelled run ends at once, while its agent
            # gets its few seconds to stop the turn.
            self.processes.spawn(turn.end(self.processes, keep=run.session is not None))

    def working_directory(self, run: Any) -> str:
        """The directory of the notebook that submitted the run, else the server's root."""
        metadata = getattr(run, "metadata", None) or {}
        candidates = [metadata.get("notebook")]
        if isinstance(run.session, str) and run.session.endswith(".ipynb"):
            candidates.append(run.session)  # submit()'s default session is its notebook
        for path in candidates:
            if not isinstance(path, str) or not path:
                continue
            try:
                directory = os.path.dirname(self.files.under_root(path))
            except Refused:
                continue
            if os.path.isdir(directory):
                return directory
        return self.files.root

    def attachment(self, path: str) -> str:
        try:
            real = self.files.under_root(path)
        except Refused as exc:
            raise InvalidInput(f"input.files: {exc}") from None
        if not os.path.exists(real):
            raise InvalidInput(f"input.files: {path} does not exist under the server's root")
        return real


class Turn:
    """One run's turn of the conversation: its prompt, and what the agent sends until it answers."""

    def __init__(
        self,
        name: str,
        run: Any,
        conversation: Conversation,
        files: Files,
        remember: Callable[[dict[str, Any]], None],
    ):
        self.name = name
        self.remember = remember
        self.run = run
        self.conversation = conversation
        self.files = files
        self.translation = mapping.Translation(run, files.root)
        self.prompting: asyncio.Future | None = None
        # Permission questions an earlier attempt left open: the agent asks again, a person answers once.
        self.earlier_questions: list[dict[str, Any]] = []

    async def take(self, input: dict[str, Any], cwd: str, attached: list[str]) -> dict[str, Any]:
        run, conversation = self.run, self.conversation
        checkpoint = run.checkpoint if run.attempt > 1 and isinstance(run.checkpoint, dict) else {}
        if checkpoint.get("stop_reason"):
            # The agent had answered when the server died: its answer is in the run.
            return self.outcome(checkpoint["stop_reason"], answer(run.snapshot))
        resumed = checkpoint.get("session_id")
        if conversation.process is None:
            await conversation.start(cwd)
        servers, notebook = self.mcp_servers()
        if conversation.session_id is None:
            earlier = checkpoint if resumed else await run.conversation()
            if run.forked_from is not None and not resumed:
                await self.fork(earlier, cwd, servers)
            else:
                await self.open(earlier, cwd, bool(resumed), servers)
        elif notebook and conversation.notebook_run != run.run_id:
            # The session kept from an earlier run has that run's token for the notebook
            # tools, good no more: opened again with this run's, where the agent can.
            if conversation.can_load or conversation.can_resume:
                assert conversation.cwd is not None  # set with its session
                await conversation.load_session(conversation.session_id, conversation.cwd, servers)
        conversation.notebook_run = run.run_id if notebook else None
        self.remember(conversation.offered())
        assert conversation.cwd is not None  # set with its session
        await run.save_checkpoint(
            {
                "session_id": conversation.session_id,
                "cwd": self.files.name(conversation.cwd),
                "forks": conversation.can_fork,
            }
        )
        for category in ("mode", "model"):
            if input.get(category):
                try:
                    await conversation.choose(category, input[category])
                except ValueError as exc:
                    raise InvalidInput(f"input.{category}: {exc}") from None
        prompt = input["prompt"]
        if resumed:
            await self.tidy_earlier_attempt()
            prompt = CONTINUE_PROMPT.format(prompt=prompt)
        blocks = self.blocks(prompt, attached)
        response = await self.prompt(blocks)
        await self.count_usage(response.usage, blocks)
        await self.name_conversation()
        await run.save_checkpoint(
            {
                "session_id": conversation.session_id,
                "cwd": self.files.name(conversation.cwd),
                "forks": conversation.can_fork,
                "stop_reason": response.stop_reason,
            }
        )
        return self.outcome(response.stop_reason, self.translation.output_text())

    async def count_usage(self, usage: Any, blocks: list[Any]) -> None:
        """The turn's token counts, or an estimate (said once) where the agent gives none."""
        if usage is not None and await self.translation.usage(
            input_tokens=usage.input_tokens, output_tokens=usage.output_tokens
        ):
            return
        sent = sum(len(mapping.block_text(block)) for block in blocks)
        await self.run.custom(
            "usage_unreported",
            {
                "agent": self.name,
                "estimated": True,
                "message": f"the agent {self.name!r} reported no token counts: the counts are "
                f"estimates, about {mapping.CHARACTERS_PER_TOKEN} characters a token",
            },
        )
        await self.run.emit("usage", self.translation.estimated_usage(sent))

    async def name_conversation(self) -> None:
        """The agent's own title of its session, for an agent that lists its sessions: the
        run's conversation takes it. The run goes on without it if ``session/list`` fails."""
        conversation = self.conversation
        if not conversation.can_list:
            return
        try:
            title = await conversation.listed_title()
        except Exception as exc:
            conversation.log.warning(
                "agentruns: the ACP agent %r did not list its sessions (run %s): %s",
                self.name, self.run.run_id, f"{type(exc).__name__}: {exc}"[:500],
            )  # fmt: skip
            return
        await self.translation.name_conversation(title)

    def mcp_servers(self) -> tuple[list[Any], bool]:
        """The MCP servers this run's session gets, and whether the notebook tools are among them.

        The configured ones (``run.mcp_servers``), and, where the run has notebook
        tools, this server's own MCP endpoint with the run's token; those reached
        over HTTP only for an agent whose ``mcpCapabilities`` say ``http``.
        """
        http = self.conversation.takes_http_mcp
        tools = getattr(self.run, "notebook_tools", None)
        endpoint = tools.mcp_server() if tools is not None and http else None
        configured = getattr(self.run, "mcp_servers", None) or {}
        return mcp_servers(configured, endpoint, http), endpoint is not None

    async def open(self, earlier: Any, cwd: str, resumed: bool, servers: list[Any]) -> None:
        """The ACP session of this run: the earlier one of its conversation when the agent can load it."""
        conversation = self.conversation
        previous = earlier.get("session_id") if isinstance(earlier, dict) else None
        if not isinstance(previous, str) or not previous:
            await conversation.new_session(cwd, servers)
            return
        if conversation.can_load or conversation.can_resume:
            try:
                await conversation.load_session(previous, self.saved_cwd(earlier, cwd), servers)
                return
            except AgentError as exc:
                why = f"it could not load the earlier one ({exc})"
        else:
            why = "it cannot load an earlier conversation (no loadSession in its capabilities)"
        if resumed:
            raise CannotResume(
                f"The run was taken over after its server stopped, but the agent {self.name!r} "
                f"cannot go on with its conversation: {why}"
            )
        await conversation.new_session(cwd, servers)
        await self.run.custom(
            "acp_new_conversation", {"message": f"A new conversation with {self.name}: {why}."}
        )

    async def fork(self, origin: Any, cwd: str, servers: list[Any]) -> None:
        """The session of a fork: a copy of the one its original run's turn left (``session/fork``)."""
        conversation = self.conversation
        previous = origin.get("session_id") if isinstance(origin, dict) else None
        if not isinstance(previous, str) or not previous:
            raise CannotFork(
                f"The run {self.run.forked_from['run_id']} it was forked from left no "
                f"conversation of {self.name!r} to copy"
            )
        if not conversation.can_fork:
            raise CannotFork(f"The agent {self.name!r} does not offer session/fork any more")
        await conversation.fork_session(previous, self.saved_cwd(origin, cwd), servers)

    def saved_cwd(self, saved: dict[str, Any], cwd: str) -> str:
        """The directory a checkpoint saved for its session, where it is still one under the
        server's root; else ``cwd``."""
        where = saved.get("cwd")
        if isinstance(where, str):
            try:
                where = self.files.under_root(where)
            except Refused:
                return cwd
            if os.path.isdir(where):
                return where
        return cwd

    async def tidy_earlier_attempt(self) -> None:
        """What the earlier attempt left open: its message ends, its notebook edits are settled,
        its other steps are interrupted, its questions are kept for the agent's asking again."""
        snapshot = self.run.snapshot
        for message in snapshot.get("messages", []):
            if not message.get("done"):
                await self.run.message_completed(message["id"])
        # Notebook edits (of a notebook it wrote, or through the notebook tools) are settled by
        # the notebook: applied once, never lost.
        tools: Any = getattr(self.run, "notebook_writes", None)
        settles = getattr(tools, "settles", None)
        if settles is not None:
            await tools.settle()
        for tool in snapshot.get("tools", []):
            if settles is not None and settles(tool):
                continue
            if tool.get("status") == "running":
                await self.run.tool_completed(
                    tool["call_id"],
                    ok=False,
                    error={
                        "type": "interrupted",
                        "message": "the server stopped before this step ended; the agent was "
                        "asked to go on, not to repeat it",
                    },
                )
        self.earlier_questions = [
            question
            for question in snapshot.get("inputs", [])
            if question.get("status") == "open" and question.get("kind") == "permission"
        ]

    def blocks(self, prompt: str, attached: list[str]) -> list[Any]:
        blocks: list[Any] = [TextContentBlock(type="text", text=prompt)]
        for real in attached:
            uri, name = Path(real).as_uri(), self.files.name(real)
            text = embeddable(real) if self.conversation.embeds_files else None
            if text is not None:
                resource = TextResourceContents(
                    uri=uri, text=text, mime_type=mimetypes.guess_type(real)[0]
                )
                blocks.append(EmbeddedResourceContentBlock(type="resource", resource=resource))
            else:
                blocks.append(ResourceContentBlock(type="resource_link", uri=uri, name=name))
        return blocks

    async def prompt(self, blocks: list[Any]) -> Any:
        """``session/prompt``, taking what the agent sends meanwhile in order; its answer."""
        conversation = self.conversation
        conversation.turn = self
        self.prompting = prompting = asyncio.ensure_future(
            # The run's trace context in ``_meta`` (ACP's reserved traceparent key).
            conversation.connection.prompt(
                session_id=conversation.session_id, prompt=blocks, **tracing.headers()
            )
        )
        prompting.add_done_callback(lambda _: conversation.arrived.set())
        while True:
            while conversation.inbox:
                await self.handle(*conversation.take())
            if prompting.done():
                break
            conversation.arrived.clear()
            if not conversation.inbox and not prompting.done():
                await conversation.arrived.wait()
        conversation.drop()
        try:
            response = prompting.result()
        except Exception as exc:
            raise await conversation.failure(exc, "session/prompt") from None
        await self.translation.finish()
        return response

    async def handle(self, kind: str, payload: Any, answered: asyncio.Future | None) -> None:
        if kind == UPDATE:
            await self.translation.apply(payload)
            return
        result = None
        try:
            if kind == PERMISSION:
                result = await self.permission(*payload)
            else:
                result = await self.write(*payload)
        finally:
            if answered is not None and not answered.done():
                answered.set_result(result)

    async def permission(self, tool_call: Any, options: list[Any]) -> str | None:
        """A person's choice among the agent's options (None: cancelled)."""
        question = mapping.permission_question(tool_call, options, self.files.root)
        if question is None:
            return None
        await self.translation.tool(tool_call)
        title, details, choices = question
        return await ask_once(
            self.run,
            title,
            details=details,
            choices=choices,
            kind="permission",
            earlier=self.earlier_questions,
            same=lambda earlier, choice: mapping.same_choice(earlier, choice, options),
        )

    async def write(self, path: str, content: str) -> bool | str | dict[str, Any]:
        """``fs/write_text_file``: written through the contents manager, recorded as a step with its diff.

        A notebook is not written over: its cells are changed one by one
        (:meth:`write_notebook`), with or without the run's notebook tools.
        """
        run = self.run
        await self.translation.complete_message()
        name = path
        try:
            name = self.files.name(self.files.resolve(path))
        except Refused:
            pass
        else:
            if name.endswith(".ipynb"):
                written = await self.write_notebook(name, content)
                if written is not None:
                    return written
        call_id = await run.tool_started(
            "write_text_file", {"path": name}, kind="edit", title=f"Write {name}"[:500]
        )
        try:
            name, old = await self.files.write(path, content)
        except Refused as exc:
            await run.tool_completed(
                call_id, ok=False, error={"type": "refused", "message": str(exc)[:2000]}
            )
            return str(exc)
        await run.tool_completed(call_id, None, content=mapping.diff_content(name, old, content))
        return True

    async def write_notebook(self, name: str, content: str) -> str | dict[str, Any] | None:
        """The notebook ``name`` written as the run's cell edits, each a step of its own; what
        the agent is answered: ``_meta`` saying what changed, or why something was not.

        None where the run has no notebook writes (a server whose notebook tools do not serve
        the run's owner) or no place holds the notebook (a new file): the file is written.
        """
        writing = getattr(getattr(self.run, "notebook_writes", None), "write_notebook", None)
        written = await writing(name, content) if writing is not None else None
        if written is None:
            return None
        if written.error is not None:
            call_id = await self.run.tool_started(
                "write_text_file", {"path": name}, kind="edit", title=f"Write {name}"[:500]
            )
            error = {**written.error, "message": str(written.error["message"])[:2000]}
            await self.run.tool_completed(call_id, ok=False, error=error)
            return written.text
        return {"agentruns": written.summary()} if written.ok else written.text

    async def read_notebook(self, path: str) -> str | None:
        """``fs/read_text_file`` of a notebook a place holds: the notebook as the person has it
        now, recorded as read (a write expects those cells); else None."""
        reading = getattr(getattr(self.run, "notebook_writes", None), "read_notebook_text", None)
        name = self.files.name(self.files.resolve(path))
        if reading is None or not name.endswith(".ipynb"):
            return None
        text: str | None = await reading(name)
        if text is not None and len(text.encode()) > MAX_READ_BYTES:
            raise Refused(f"{path} is larger than {MAX_READ_BYTES // (1024 * 1024)} MiB")
        return text

    def outcome(self, stop_reason: str, text: str | None) -> dict[str, Any]:
        if stop_reason == "refusal":
            raise Refusal(f"The agent {self.name!r} refused to answer")
        if stop_reason == "cancelled":
            raise AgentCancelled(f"The agent {self.name!r} cancelled its turn")
        return {"text": text, "stop_reason": stop_reason}

    async def end(self, processes: Processes, keep: bool) -> None:
        """After the run: a turn still going is cancelled (its process ended if it does not
        stop in time); the conversation is kept for the next run, or closed."""
        conversation = self.conversation
        try:
            prompting = self.prompting
            if prompting is not None and not prompting.done():
                conversation.drop()  # an open permission request is answered "cancelled"
                await conversation.cancel()
                await asyncio.wait({prompting}, timeout=CANCEL_SECONDS)
                if not prompting.done():
                    await conversation.close()
            if prompting is not None and prompting.done() and not prompting.cancelled():
                prompting.exception()  # retrieved: a failure was the run's to report
            conversation.drop()
        finally:
            # One stopped before it was initialized cannot be taken up again.
            processes.release(conversation, keep=keep and conversation.info is not None)


class AgentCancelled(AgentError):
    """The agent ended its turn as cancelled without being asked to."""

    error_type = "cancelled"


def answer(snapshot: dict[str, Any]) -> str | None:
    """The text of a run's messages, as a run's output keeps it."""
    texts = [message.get("text", "") for message in snapshot.get("messages", [])]
    text = "\n\n".join(texts)
    return text if len(text) <= mapping.OUTPUT_TEXT_LIMIT else None


def embeddable(real: str) -> str | None:
    """The text of a file small enough to send whole, else None (it is sent as a link)."""
    try:
        if not os.path.isfile(real) or os.path.getsize(real) > EMBED_BYTES:
            return None
        with open(real, "rb") as file:
            return file.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
