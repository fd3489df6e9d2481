"""The resume journal: what a run's earlier attempts did, for the attempt that takes it over."""

from __future__ import annotations

import json
from typing import Any

from ..tools import Tool, needs_approval, resume_tool
from .tool_calls import call_tool, is_notebook_tool


class Journal:
    """What a run's earlier attempts did: their model calls (the checkpoint) and the run's snapshot.

    Each model call the agent made is a saved turn: the id of the message its
    text streamed into, and its tool calls. Each tool call the model asked for
    is one ``tool.started`` (in ``tool_step``), in order: the n-th tool of the
    snapshot answers the n-th call of the saved turns.
    """

    def __init__(self, run) -> None:
        snapshot = run.snapshot
        self.turns: list[dict[str, Any]] = list((run.checkpoint or {}).get("turns") or [])
        self._messages = {m["id"]: m for m in snapshot["messages"]}
        self._tools = list(snapshot["tools"])
        self._questions = [q for q in snapshot.get("inputs") or [] if q.get("kind") == "approval"]
        self._usage = snapshot.get("usage")
        self._next_tool = 0
        self._next_question = 0

    def usage(self) -> dict[str, Any] | None:
        return dict(self._usage) if self._usage else None

    def assistant_message(self, turn: dict[str, Any]) -> dict[str, Any]:
        message = self._messages.get(turn.get("message_id") or "")
        text = message["text"] if message is not None else ""
        if not turn["calls"]:
            return {"role": "assistant", "content": text}
        calls = []
        for offset, call in enumerate(turn["calls"]):
            if "arguments" not in call["function"]:  # kept brief: its tool.started has them
                index = self._next_tool + offset
                args = self._tools[index].get("args") if index < len(self._tools) else {}
                call = {**call, "function": {**call["function"], "arguments": json.dumps(args)}}
            calls.append(call)
        return {"role": "assistant", "content": text, "tool_calls": calls}

    def unfinished_messages(self) -> list[str]:
        saved = {turn.get("message_id") for turn in self.turns}
        return [m for m, message in self._messages.items()
                if not message.get("done") and m not in saved]  # fmt: skip

    async def tool_result(
        self,
        run,
        tools: dict[str, Tool],
        call: dict[str, Any],
        approve: list[str],
        notebook: Any = None,
    ) -> dict[str, Any]:
        """The tool message for a call an earlier attempt was asked to make.

        A notebook tool's call (``notebook``: the run's notebook tools) that
        started without a recorded result is never repeated: ``run_code`` may
        have changed the kernel's state; an edit is settled by the notebook's
        file instead (applied once, never lost).
        """
        name = call["function"]["name"]
        # Its approval was asked before it started (tool_step), in call order.
        asked = None
        asks = needs_approval(approve, name, tools) or (
            is_notebook_tool(notebook, tools, name) and notebook.asks(name)
        )
        if asks and self._next_question < len(self._questions):
            asked = self._questions[self._next_question]
            self._next_question += 1
        if self._next_tool >= len(self._tools):
            # Not started: its approval, if asked, is answered or still open.
            return await call_tool(run, tools, call, approve, asked, notebook)
        started = self._tools[self._next_tool]
        self._next_tool += 1
        if is_notebook_tool(notebook, tools, name):
            # An edit is settled by the notebook's file: made once, never lost.
            content = (await notebook.resume(started)).text
            return {"role": "tool", "tool_call_id": call["id"], "content": content}
        content = await resume_tool(run, tools, name, started)
        return {"role": "tool", "tool_call_id": call["id"], "content": content}


def brief(call: dict[str, Any]) -> dict[str, Any]:
    """A saved tool call without its arguments (the run's tool.started event has them)."""
    return {"id": call["id"], "type": "function", "function": {"name": call["function"]["name"]}}
