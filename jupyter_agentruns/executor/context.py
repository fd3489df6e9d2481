"""What an agent sees of its run: ``RunContext``, its ``run`` argument.

The agent API (``agents.Run``) on a live run: the events an agent may emit,
each checked before it goes to the run's ``Execution`` (``check_plan``,
``check_tool_content``, ``check_usage``); ``ToolCall``, a tool call as an
``async with``; and ``SyncRun``, the same methods, blocking, for an agent
that is a plain function in a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import re
from collections.abc import Sequence
from typing import Any

from .. import budgets, reducer
from ..agents import EventTooLarge, RunClosed
from ..domain import ForkedFrom
from ..errors import error_object
from .execution import Execution

# Event types an agent may emit itself; the run.* lifecycle is the executor's.
AGENT_EVENT_TYPES = {
    "message.started",
    "text.delta",
    "message.completed",
    "tool.started",
    "tool.completed",
    "progress",
    "usage",
    "reasoning.delta",
    "plan.updated",
    "notebook.edit",
}
PLAN_STATUSES = ("pending", "in_progress", "completed")
EDIT_OPS = ("insert", "edit", "delete", "outputs")
EDIT_STATUSES = ("pending", "applied", "undone", "rejected", "conflict")
CUSTOM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
# A question to a person offers at most this many choices (the view shows a button each).
MAX_CHOICES = 20
# A conversation's title is kept up to this many characters (a list shows one line of it).
CONVERSATION_TITLE_CHARS = 500


class ToolCall:
    """``async with run.tool(name, args) as call``: set ``call.result``; an exception marks it failed."""

    def __init__(self, run: RunContext, name: str, args: dict):
        self._run = run
        self.name = name
        self.args = args
        self.call_id: str | None = None
        self.result: Any = None

    async def __aenter__(self) -> ToolCall:
        self.call_id = await self._run.tool_started(self.name, self.args)
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        assert self.call_id is not None  # set on entering
        if exc is None:
            await self._run.tool_completed(self.call_id, self.result)
        elif not isinstance(exc, (asyncio.CancelledError, RunClosed)):
            await self._run.tool_completed(self.call_id, ok=False, error=error_object(exc))


class RunContext:
    """An agent's handle on its run (the ``run`` argument); see ``agents.Run``."""

    def __init__(self, execution: Execution):
        self._execution = execution
        row = execution.row
        self.run_id: str = row["run_id"]
        self.agent: str = row["agent"]
        self.input = row["input"]
        self.owner: str = row["owner"]
        self.session: str | None = row["session"]
        self.metadata: dict[str, Any] = row.get("metadata") or {}
        self.forked_from: ForkedFrom | None = row.get("forked_from")
        self.attempt: int = row.get("attempt") or 1
        self.checkpoint: Any = row.get("checkpoint")
        resumed = execution.resumed_from
        self.snapshot: dict[str, Any] = resumed if resumed is not None else reducer.empty_snapshot()
        # Ids go on from an earlier attempt's: m1, m2, ... (c1, c2, ... are the execution's)
        self._messages = len(self.snapshot["messages"])
        # The notebook's kernel, for an agent that works on its data (see ``notebook``).
        self.notebook_tools: Any = None
        # A notebook the agent writes whole, made cell edits (the notebook tools' own, or
        # without a kernel): see ``notebook_tools.RunNotebookWrites``.
        self.notebook_writes: Any = None
        # The configured MCP servers (c.AgentRuns.mcp_servers), for an agent that uses their tools.
        self.mcp_servers: dict[str, dict[str, Any]] = {}
        # How a step cut by a take-over is settled (c.AgentRuns.in_doubt).
        self.in_doubt = "tell_model"
        streaming = [m for m in self.snapshot["messages"] if not m.get("done")]
        # A message that was streaming when the last attempt's server died goes on.
        self._message_id: str | None = streaming[-1]["id"] if streaming else None

    @property
    def cancelled(self) -> bool:
        """True once the run was asked to stop (cancel, deadline or shutdown)."""
        return self._execution.ending

    async def emit(self, type: str, data: dict[str, Any] | None = None) -> int:
        """Append one event of a documented type (or ``x.<name>``); returns its seq."""
        if type not in AGENT_EVENT_TYPES and not (
            type.startswith("x.") and CUSTOM_NAME.match(type[2:])
        ):
            raise ValueError(f"agents cannot emit events of type {type!r}")
        data = data or {}
        if type == "usage":
            check_usage(data)
        elif type == "plan.updated":
            check_plan(data.get("entries"))
        elif type == "tool.completed" and data.get("content") is not None:
            check_tool_content(data["content"])
        elif type == "notebook.edit":
            check_edit(data)
        return await self._execution.emit(type, data)

    async def ask(
        self,
        title: str,
        details: Any = None,
        choices: Sequence[str] = ("approve", "deny"),
        kind: str = "approval",
        timeout: float | None = None,
    ) -> str:
        """Ask a person and wait for their choice; see ``agents.Run.ask``."""
        if not isinstance(title, str) or not title.strip():
            raise ValueError("ask() needs a title: the question a person sees")
        if isinstance(choices, str) or not isinstance(choices, Sequence):
            raise ValueError("ask()'s choices are a list of strings")
        choices = list(choices)
        if not choices or len(choices) > MAX_CHOICES or len(set(choices)) != len(choices):
            raise ValueError(f"ask() takes 1 to {MAX_CHOICES} different choices")
        if not all(isinstance(choice, str) and choice.strip() for choice in choices):
            raise ValueError("each of ask()'s choices is a non-empty string")
        if not isinstance(kind, str) or not kind:
            raise ValueError("ask()'s kind is a non-empty string, e.g. 'approval'")
        if kind == budgets.BUDGET_KIND:
            raise ValueError(
                "ask()'s kind 'budget' is the server's own question for more tokens (budget_exceeded)"
            )
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ValueError(
                f"ask()'s timeout is a positive number of seconds or None, not {timeout!r}"
            )
        return await self._execution.questions.ask(title, details, choices, kind, timeout)

    async def custom(self, name: str, data: dict[str, Any] | None = None) -> int:
        """Append an agent-defined event ``x.<name>``."""
        return await self.emit(f"x.{name}", data)

    async def message_started(self, role: str = "assistant") -> str:
        """Start a message; returns its id for ``text`` and ``message_completed``."""
        self._messages += 1
        message_id = f"m{self._messages}"
        await self._execution.emit("message.started", {"message_id": message_id, "role": role})
        self._message_id = message_id
        return message_id

    async def text(self, delta: str, message_id: str | None = None) -> int:
        """Stream a piece of text into a message (the current one by default)."""
        if message_id is None:
            message_id = self._message_id or await self.message_started()
        return await self._execution.emit("text.delta", {"message_id": message_id, "delta": delta})

    async def message_completed(self, message_id: str | None = None) -> int:
        message_id = message_id or self._message_id
        if message_id is None:
            raise ValueError("no message to complete")
        if message_id == self._message_id:
            self._message_id = None
        return await self._execution.emit("message.completed", {"message_id": message_id})

    async def tool_started(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        kind: str | None = None,
        title: str | None = None,
    ) -> str:
        """Record that a tool call starts; returns its ``call_id``.

        ``kind`` (read, edit, execute, search, fetch, think, ...) and ``title``
        (what it does, for a person) are shown by the views.
        """
        call_id = self._execution.next_call_id()
        data: dict[str, Any] = {"call_id": call_id, "name": name, "args": args or {}}
        for key, value in (("kind", kind), ("title", title)):
            if value is not None:
                if not isinstance(value, str):
                    raise ValueError(f"a tool's {key} is text, not {type(value).__name__}")
                data[key] = value
        await self._execution.emit("tool.started", data)
        return call_id

    def _traced_step(self, call_id: str) -> contextlib.AbstractContextManager[None]:
        """``with run._traced_step(call_id):`` around the call a started step makes: with
        traces on, the step's span is the current one meanwhile (what an MCP call carries)."""
        trace = self._execution.trace
        return trace.step(call_id) if trace is not None else contextlib.nullcontext()

    async def tool_completed(
        self,
        call_id: str,
        result: Any = None,
        *,
        ok: bool = True,
        error: Any = None,
        content: list[dict[str, Any]] | None = None,
    ) -> int:
        """Record a tool call's end; ``content``: what it showed (see ``check_tool_content``)."""
        data: dict[str, Any] = {"call_id": call_id, "ok": ok}
        if ok:
            data["result"] = result
        else:
            data["error"] = error
        if content is not None:
            check_tool_content(content)
            data["content"] = content
        try:
            return await self._execution.emit("tool.completed", data)
        except EventTooLarge as exc:
            # The step ends all the same, saying why (the run fails, as any
            # oversized event makes it): never a step left running.
            error = {"type": "event_too_large", "message": f"the call's end was not kept: {exc}"}
            await self._execution.emit(
                "tool.completed", {"call_id": call_id, "ok": False, "error": error}
            )
            raise

    async def reasoning(self, delta: str, message_id: str | None = None) -> int:
        """Stream a piece of the model's visible thinking (the views fold it under "Thinking")."""
        if not isinstance(delta, str):
            raise ValueError(f"reasoning is text, not {type(delta).__name__}")
        message_id = message_id or self._message_id or f"m{self._messages + 1}"
        return await self._execution.emit(
            "reasoning.delta", {"message_id": message_id, "delta": delta}
        )

    async def plan(self, entries: list[dict[str, Any]]) -> int:
        """The agent's plan now, replacing the last: ``[{content, status, priority?}]``."""
        check_plan(entries)
        return await self._execution.emit("plan.updated", {"entries": entries})

    def tool(self, name: str, args: dict[str, Any] | None = None) -> ToolCall:
        """``async with run.tool("name", args) as call: call.result = ...``."""
        return ToolCall(self, name, args or {})

    async def progress(self, fraction: float | None, message: str = "") -> int:
        if fraction is not None and not 0 <= fraction <= 1:
            raise ValueError("progress fraction must be between 0 and 1, or None")
        return await self._execution.emit("progress", {"fraction": fraction, "message": message})

    async def usage(self, input_tokens: int, output_tokens: int) -> int:
        """Token totals so far (each usage event replaces the last)."""
        data = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        check_usage(data)
        return await self._execution.emit("usage", data)

    async def durable(self) -> None:
        """Wait until every event emitted so far is committed to the store.

        Call it before a side effect that must not be repeated: after a crash
        the log shows what was done.
        """
        await self._execution.durable()

    async def history(self) -> list[dict[str, Any]]:
        """The run's kept events so far, oldest first (``{seq, type, ts, data}``)."""
        read = self._execution.history
        return [] if read is None else await read()

    async def save_checkpoint(self, value: Any) -> None:
        """Keep a JSON value for a later attempt, committed after every event emitted before it."""
        await self._execution.save_checkpoint(value)
        self.checkpoint = value

    async def conversation(self) -> Any:
        """The last checkpoint an earlier run of this owner, session and agent saved, or None."""
        read = self._execution.conversation
        if read is None or (self.session is None and self.forked_from is None):
            return None
        return await read()

    async def set_conversation_title(self, title: str) -> None:
        """Name the run's conversation; see ``agents.Run.set_conversation_title``."""
        if not isinstance(title, str):
            raise ValueError("set_conversation_title() takes a string")
        title = " ".join(title.split())[:CONVERSATION_TITLE_CHARS]
        if title and self.session is not None:
            await self._execution.set_conversation_title(title)

    async def answer_to(self, request_id: str) -> str:
        """Wait for the answer to a question an earlier attempt asked."""
        return await self._execution.questions.await_answer(request_id)


class SyncRun:
    """The ``run`` a plain-function agent gets: the same methods, blocking, from its worker thread."""

    _METHODS = {
        "emit", "custom", "message_started", "text", "message_completed",
        "tool_started", "tool_completed", "progress", "usage", "durable", "ask",
        "history", "save_checkpoint", "answer_to", "reasoning", "plan", "conversation",
        "set_conversation_title",
    }  # fmt: skip

    def __init__(self, run: RunContext, execution: Execution, loop: asyncio.AbstractEventLoop):
        self._run = run
        self._execution = execution
        self._loop = loop
        self.run_id = run.run_id
        self.input = run.input
        self.metadata = run.metadata
        self.forked_from = run.forked_from
        self.attempt = run.attempt
        self.snapshot = run.snapshot
        self.notebook_tools = run.notebook_tools
        self.notebook_writes = run.notebook_writes
        self.mcp_servers = run.mcp_servers
        self.in_doubt = run.in_doubt

    @property
    def cancelled(self) -> bool:
        return self._run.cancelled

    @property
    def checkpoint(self) -> Any:
        return self._run.checkpoint

    def __getattr__(self, name: str):
        if name not in self._METHODS:
            raise AttributeError(name)
        method = getattr(self._run, name)

        @functools.wraps(method)
        def call(*args, **kwargs):
            if self._execution.closed:
                raise RunClosed(f"run {self.run_id} has ended")
            try:
                future = asyncio.run_coroutine_threadsafe(method(*args, **kwargs), self._loop)
            except RuntimeError:  # the server's event loop is gone
                raise RunClosed(f"run {self.run_id} has ended") from None
            return future.result()

        return call


def check_plan(entries: Any) -> None:
    """Refuse a plan that is not a list of ``{content, status, priority?}`` (ValueError, to the agent)."""
    if not isinstance(entries, list):
        raise ValueError("a plan is a list of entries")
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise ValueError("each entry of a plan has its content as text")
        if entry.get("status") not in PLAN_STATUSES:
            raise ValueError(f"a plan entry's status is one of {', '.join(PLAN_STATUSES)}")
        if not isinstance(entry.get("priority", ""), str):
            raise ValueError("a plan entry's priority is text")


def check_edit(data: dict[str, Any]) -> None:
    """Refuse a ``notebook.edit`` without its ``edit_id``, or with an unknown op or status."""
    if not isinstance(data.get("edit_id"), str) or not data["edit_id"]:
        raise ValueError("a notebook edit has its edit_id as text")
    if data.get("op") not in EDIT_OPS:
        raise ValueError(f"a notebook edit's op is one of {', '.join(EDIT_OPS)}")
    if data.get("status") not in EDIT_STATUSES:
        raise ValueError(f"a notebook edit's status is one of {', '.join(EDIT_STATUSES)}")


def check_tool_content(content: Any) -> None:
    """Refuse tool content that is not ``[{type: "text", text} | {type: "diff", path, old_text, new_text}]``."""
    if not isinstance(content, list):
        raise ValueError("a tool's content is a list")
    for item in content:
        if not isinstance(item, dict):
            raise ValueError("each item of a tool's content is an object")
        if item.get("type") == "text" and isinstance(item.get("text"), str):
            continue
        if (
            item.get("type") == "diff"
            and isinstance(item.get("path"), str)
            and isinstance(item.get("new_text"), str)
            and (item.get("old_text") is None or isinstance(item.get("old_text"), str))
        ):
            continue
        raise ValueError(
            "a tool's content items are {type: 'text', text} or "
            "{type: 'diff', path, old_text (None for a new file), new_text}"
        )


def check_usage(data: Any) -> None:
    """Refuse usage an agent hands over that is not token counts (ValueError, to the agent).

    An absurd count (``10**20``) is out of the store's range: in a batch of
    the writer it would take other runs' events down with it.
    """
    problem = budgets.usage_problem(data)
    if problem is not None:
        raise ValueError(problem)
