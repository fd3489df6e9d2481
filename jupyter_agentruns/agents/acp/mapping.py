"""What an ACP agent's session updates become in a run: the events of the agent API.

``agent_message_chunk`` → ``text.delta`` (a message per agent message, and a
new one after each tool step); ``agent_thought_chunk`` → ``reasoning.delta``;
``tool_call`` / ``tool_call_update`` → ``tool.started`` / ``tool.completed``
(with the step's kind, title, content and diffs); ``plan`` → ``plan.updated``;
``usage_update`` → ``usage`` (a turn the agent counts no tokens of has an
estimate, marked ``estimated``); ``session_info_update`` with a title → the
title of the run's conversation. Everything an agent sends is bounded here
before it becomes an event: an event over ``max_event_bytes`` would fail the
run, and a client refuses a text delta over 64 KiB.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from ... import budgets

# A text delta at most: clients refuse one over 64 KiB.
TEXT_PIECE = 16 * 1024
# What one tool event may carry of the agent's input, output and content
# (an event's data is at most max_event_bytes, 256 KiB by default).
ARGS_BYTES = 32 * 1024
RESULT_BYTES = 32 * 1024
CONTENT_BYTES = 96 * 1024
# Lines of context kept around a change when a diff is too large to show whole.
DIFF_CONTEXT_LINES = 20
# A run's output keeps its text up to this size (the snapshot has all of it).
OUTPUT_TEXT_LIMIT = 64 * 1024
# With no tokenizer of the agent's model at hand, the usual rule of thumb for
# English text and code: an estimate, and the run's usage says it is one.
CHARACTERS_PER_TOKEN = 4
PLAN_STATUSES = ("pending", "in_progress", "completed")
MAX_PLAN_ENTRIES = 200


def relative(path: str, root: str) -> str:
    """``path`` as JupyterLab names it (relative to the server's root, ``/``-separated) when it is under the root."""
    if not isinstance(path, str) or not os.path.isabs(path):
        return path
    normal = os.path.normpath(path)
    if normal == root:
        return "."
    if normal.startswith(root.rstrip(os.sep) + os.sep):
        return os.path.relpath(normal, root).replace(os.sep, "/")
    return path


def block_text(block: Any) -> str:
    """A content block as text: text as it is, anything else named, never fetched."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind == "resource_link":
        return f"[{block.title or block.name}]({block.uri})"
    if kind == "resource":
        text = getattr(block.resource, "text", None)
        return text if isinstance(text, str) else f"[{block.resource.uri}]"
    if kind in ("image", "audio"):
        return f"[{kind}: {getattr(block, 'mime_type', '') or 'unknown type'}]"
    return ""


def pieces(text: str, size: int = TEXT_PIECE) -> list[str]:
    """``text`` cut into deltas a client accepts."""
    if len(text) <= size:
        return [text]
    return [text[start : start + size] for start in range(0, len(text), size)]


def bounded(value: Any, limit: int) -> Any:
    """``value`` if its JSON fits in ``limit`` characters, else a preview of it that does."""
    try:
        text = json.dumps(value, allow_nan=False, default=str)
    except ValueError:
        return None
    if len(text) <= limit:
        return value
    return {"truncated": True, "characters": len(text), "preview": fit_text(text, limit // 2)}


def encoded_size(value: Any) -> int:
    """Characters of ``value`` in an event, as the run's encoder writes it (non-ASCII escaped)."""
    return len(json.dumps(value, separators=(",", ":")))


def fit_text(text: str, limit: int) -> str:
    """``text``, or its beginning and how long it was, in at most ``limit`` characters of JSON."""
    size = encoded_size(text)
    if size <= limit:
        return text
    note = f"\n... ({len(text)} characters in all)"
    keep = max(0, limit - len(note) - 2)
    while keep > 0:
        cut = text[:keep] + note
        over = encoded_size(cut) - limit
        if over <= 0:
            return cut
        keep -= max(over, 1)
    return note.strip()[:limit]


def shrink_diff(old: str | None, new: str, limit: int) -> tuple[str | None, str] | None:
    """A diff's texts cut to the lines that changed and some context, or None if even that is too large."""
    if encoded_size(old or "") + encoded_size(new) <= limit:
        return old, new
    old_lines, new_lines = (old or "").splitlines(keepends=True), new.splitlines(keepends=True)
    start = 0
    while start < min(len(old_lines), len(new_lines)) and old_lines[start] == new_lines[start]:
        start += 1
    end = 0
    while (
        end < min(len(old_lines), len(new_lines)) - start
        and old_lines[-1 - end] == new_lines[-1 - end]
    ):
        end += 1
    first = max(0, start - DIFF_CONTEXT_LINES)
    keep = max(0, end - DIFF_CONTEXT_LINES)
    old_part = "".join(old_lines[first : len(old_lines) - keep])
    new_part = "".join(new_lines[first : len(new_lines) - keep])
    if encoded_size(old_part) + encoded_size(new_part) > limit:
        return None
    return (old_part if old is not None else None), new_part


def tool_content(items: Any, root: str, limit: int = CONTENT_BYTES) -> list[dict[str, Any]]:
    """An ACP tool call's content as the run records it: ``text`` items and ``diff`` items.

    Paths under the server's root are given as JupyterLab names them; a
    terminal (which this client does not offer) is left out; everything is
    cut to fit ``limit`` characters.
    """
    content: list[dict[str, Any]] = []
    left = limit
    for item in items or ():
        kind = getattr(item, "type", None)
        if kind == "content":
            text = block_text(item.content)
            if not text:
                continue
            entry: dict[str, Any] = {"type": "text", "text": fit_text(text, left - 30)}
        elif kind == "diff":
            path = relative(item.path, root)
            shrunk = shrink_diff(item.old_text, item.new_text, left)
            if shrunk is None:
                size = len(item.old_text or "") + len(item.new_text)
                entry = {
                    "type": "text",
                    "text": f"{path}: changed ({size} characters, too large to show)",
                }
            else:
                entry = {"type": "diff", "path": path, "old_text": shrunk[0], "new_text": shrunk[1]}
        else:
            continue
        size = encoded_size(entry)
        if size > left and entry["type"] == "diff":
            entry = {"type": "text", "text": f"{entry['path']}: changed (too large to show)"}
            size = encoded_size(entry)
        if size > left:
            break
        content.append(entry)
        left -= size
    return content


def diff_content(name: str, old: str | None, new: str) -> list[dict[str, Any]]:
    """A file write as a tool step's content: its diff, cut to fit."""
    shrunk = shrink_diff(old, new, CONTENT_BYTES)
    if shrunk is None:
        size = len(old or "") + len(new)
        return [{"type": "text", "text": f"{name}: written ({size} characters, too large to show)"}]
    return [{"type": "diff", "path": name, "old_text": shrunk[0], "new_text": shrunk[1]}]


def plan_entries(entries: Any) -> list[dict[str, Any]]:
    """An ACP plan's entries as ``plan.updated`` takes them."""
    plan = []
    for entry in list(entries or ())[:MAX_PLAN_ENTRIES]:
        status = entry.status if entry.status in PLAN_STATUSES else "pending"
        item = {"content": entry.content[:2000], "status": status}
        if isinstance(entry.priority, str):
            item["priority"] = entry.priority
        plan.append(item)
    return plan


def token_count(value: Any) -> int | None:
    """A token count an agent reported, or None when it cannot be one; one above 2**53 is 2**53."""
    if not isinstance(value, int):
        return None  # ACP's counts are integers
    return budgets.reported_count(value)


def permission_question(
    tool_call: Any, options: Any, root: str
) -> tuple[str, dict[str, Any], list[str]] | None:
    """``(title, details, choices)`` of a person's question for ``session/request_permission``.

    The choices are the agent's option ids; ``details.options`` says what
    each is (its name, and its kind: ``allow_once``, ``reject_always``, ...).
    None when the agent offered nothing to choose.
    """
    chosen: list[dict[str, str]] = []
    for option in options or ():
        option_id = option.option_id
        if not option_id.strip() or any(o["optionId"] == option_id for o in chosen):
            continue
        chosen.append({"optionId": option_id, "name": option.name[:200], "kind": option.kind})
        if len(chosen) == 20:
            break
    if not chosen:
        return None
    title = (getattr(tool_call, "title", None) or "").strip() or "The agent asks to go on"
    tool = {
        "title": getattr(tool_call, "title", None),
        "kind": getattr(tool_call, "kind", None),
        "content": tool_content(getattr(tool_call, "content", None), root, RESULT_BYTES),
    }
    details = {"options": chosen, "tool": tool}
    return title[:500], details, [option["optionId"] for option in chosen]


def same_choice(earlier: dict[str, Any], choice: str, options: Any) -> str | None:
    """The option of a new permission request that answers as ``choice`` did an earlier one.

    The same id if the agent offers it again, else the option of the same kind.
    """
    offered = {option.option_id: option for option in options or ()}
    if choice in offered:
        return choice
    kinds = {
        o.get("optionId"): o.get("kind") for o in (earlier.get("details") or {}).get("options", [])
    }
    kind = kinds.get(choice)
    for option_id, option in offered.items():
        if kind is not None and option.kind == kind:
            return option_id
    return None


@dataclass
class Step:
    """An ACP tool call, as the run knows it: its ``call_id`` and what it showed last."""

    call_id: str
    title: str | None = None
    kind: str | None = None
    content: Any = None
    locations: Any = None
    raw_output: Any = None
    done: bool = False
    texts: list[str] = field(default_factory=list)


class Translation:
    """One turn's session updates, in order, as the run's events."""

    def __init__(self, run: Any, root: str):
        self.run = run
        self.root = root
        self.steps: dict[str, Step] = {}
        self._message: str | None = None
        self._agent_message: str | None = None
        # The text of each message of the turn, for the run's output.
        self._answers: list[list[str]] = []
        self._text_size = 0
        self._told_over_max = False
        # For an estimate of the turn's tokens when the agent counts none.
        self.context_tokens: int | None = None
        self.received_size = 0
        # The title the agent last gave its session (session_info_update, session/list).
        self.title: str | None = None

    async def apply(self, update: Any) -> None:
        kind = getattr(update, "session_update", None)
        if kind == "agent_message_chunk":
            await self.text(block_text(update.content), update.message_id)
        elif kind == "agent_thought_chunk":
            text = block_text(update.content)
            self.received_size += len(text or "")
            for piece in pieces(text) if text else ():
                await self.run.reasoning(piece)
        elif kind in ("tool_call", "tool_call_update"):
            await self.tool(update)
        elif kind == "plan":
            await self.run.plan(plan_entries(update.entries))
        elif kind == "usage_update":
            # The tokens the conversation's context holds: what the next
            # model call reads. The turn's own counts replace it at its end.
            if await self.usage(used=update.used):
                self.context_tokens = token_count(update.used)
        elif kind == "session_info_update":
            await self.name_conversation(getattr(update, "title", None))
        # Anything else (the user's own message replayed, commands, modes) is not part of the run.

    async def name_conversation(self, title: Any) -> None:
        """The agent's title of its session, as the run's conversation's (once each new one)."""
        if isinstance(title, str) and title.strip() and title != self.title:
            self.title = title
            await self.run.set_conversation_title(title)

    async def usage(self, **reported: Any) -> bool:
        """Usage the agent reported (``used``, or ``input_tokens`` and ``output_tokens``), as the run's.

        What cannot be counts is left out; counts over 2**53 are counted as
        2**53, and the run's log says so once. Whether they were counts.
        """
        counts = [token_count(value) for value in reported.values()]
        # Agents that were told none by their model server say 0 and 0: not a count.
        if None in counts or not any(counts):
            return False
        if not self._told_over_max and any(map(budgets.over_max, reported.values())):
            self._told_over_max = True
            said = ", ".join(f"{name} {value!r:.30}" for name, value in reported.items())
            await self.run.custom(
                "usage_over_max", {"message": budgets.over_max_message("the agent", said)}
            )
        await self.run.usage(*counts, *[0] * (2 - len(counts)))
        return True

    async def text(self, text: str, agent_message: str | None = None) -> None:
        if not text:
            return
        if self._message is None or (
            agent_message is not None and agent_message != self._agent_message
        ):
            await self.complete_message()
            self._message = await self.run.message_started()
            self._answers.append([])
        self._agent_message = agent_message
        for piece in pieces(text):
            await self.run.text(piece, self._message)
        self._text_size += len(text)
        self.received_size += len(text)
        if self._text_size <= OUTPUT_TEXT_LIMIT:
            self._answers[-1].append(text)

    async def complete_message(self) -> None:
        if self._message is not None:
            message, self._message = self._message, None
            await self.run.message_completed(message)

    def estimated_usage(self, sent_size: int) -> dict[str, Any]:
        """The turn's tokens when the agent counts none: the context it reported, else
        the characters sent, and those received, at about four characters a token."""
        return {
            "input_tokens": self.context_tokens or math.ceil(sent_size / CHARACTERS_PER_TOKEN),
            "output_tokens": math.ceil(self.received_size / CHARACTERS_PER_TOKEN),
            "estimated": True,
        }

    def output_text(self) -> str | None:
        """The turn's answer, its messages one after the other (None when too long to keep here)."""
        if self._text_size > OUTPUT_TEXT_LIMIT:
            return None
        return "\n\n".join("".join(parts) for parts in self._answers)

    async def tool(self, update: Any) -> Step:
        """A ``tool_call`` or ``tool_call_update`` (or a permission's tool call): the step, started if new."""
        step = self.steps.get(update.tool_call_id)
        if step is None:
            await self.complete_message()
            kind = update.kind or "other"
            raw = update.raw_input
            args = raw if isinstance(raw, dict) else {} if raw is None else {"input": raw}
            args = bounded(args, ARGS_BYTES) or {}
            call_id = await self.run.tool_started(
                kind, args, kind=kind, title=(update.title or None) and update.title[:500]
            )
            step = self.steps[update.tool_call_id] = Step(call_id)
        for name in ("title", "kind", "content", "locations", "raw_output"):
            value = getattr(update, name, None)
            if value is not None:
                setattr(step, name, value)
        status = getattr(update, "status", None)
        if status in ("completed", "failed") and not step.done:
            await self.complete_step(step, ok=status == "completed")
        return step

    async def complete_step(
        self, step: Step, ok: bool, error: dict[str, Any] | None = None
    ) -> None:
        step.done = True
        content = tool_content(step.content, self.root)
        result: dict[str, Any] = {}
        if step.raw_output is not None:
            result["output"] = bounded(step.raw_output, RESULT_BYTES)
        if step.locations:
            result["locations"] = bounded(
                [
                    {"path": relative(location.path, self.root), "line": location.line}
                    for location in step.locations[:100]
                ],
                RESULT_BYTES // 4,
            )
        if not ok and error is None:
            said = next((item["text"] for item in content if item["type"] == "text"), None)
            error = {"type": "failed", "message": (said or "the step failed")[:2000]}
        await self.run.tool_completed(
            step.call_id, result or None, ok=ok, error=error, content=content or None
        )

    async def finish(self) -> None:
        """The turn ended: its message is complete, and a step the agent left open says so."""
        await self.complete_message()
        for step in self.steps.values():
            if not step.done:
                await self.complete_step(
                    step,
                    ok=False,
                    error={
                        "type": "unfinished",
                        "message": "the agent ended its turn without saying how this step ended",
                    },
                )
