"""What a run looks like to an editor over ACP: its events as session updates, its questions
as permission requests, its end as a prompt's stop reason.

The other direction of ``agents/acp/mapping.py`` (which makes an ACP agent's
updates into events): ``text.delta`` → ``agent_message_chunk``,
``reasoning.delta`` → ``agent_thought_chunk``, ``tool.started`` /
``tool.completed`` → ``tool_call`` / ``tool_call_update`` (kind, title,
content with diffs, locations), ``plan.updated`` → ``plan``; the run's token totals
go with the prompt's answer (``usage``); a run's prompt → ``user_message_chunk`` when a conversation
is replayed. Pure functions of events and run objects as the API answers
them: what a field of the wrong type holds is left out, never an error.
"""

from __future__ import annotations

import os
from typing import Any, cast, get_args

from acp import (
    RequestError,
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
    PermissionOption,
    PermissionOptionKind,
    PlanEntryPriority,
    PlanEntryStatus,
    StopReason,
    ToolCallLocation,
    ToolCallUpdate,
    ToolKind,
    Usage,
)

from ..questions import option_names
from .output import items, mapping

# ACP's words; a step of any other kind is "other".
TOOL_KINDS = frozenset(get_args(ToolKind))
PERMISSION_KINDS = frozenset(get_args(PermissionOptionKind))
PLAN_STATUSES = frozenset(get_args(PlanEntryStatus))
PLAN_PRIORITIES = frozenset(get_args(PlanEntryPriority))
# Choices of a question that say no: an editor shows them as a rejection.
NO_WORDS = frozenset(("deny", "no", "reject", "cancel", "stop", "skip"))
# What ends a turn without an error, by the run's terminal event.
STOP_REASONS: dict[str, StopReason] = {"run.succeeded": "end_turn", "run.cancelled": "cancelled"}
# An agent's own stop reasons that a succeeded run keeps in ``output.stop_reason``.
KEPT_STOP_REASONS = frozenset(("max_tokens", "max_turn_requests"))
# The longest piece of text one joined delta carries.
MERGED_TEXT = 64 * 1024
# JSON-RPC's "internal error": the run failed.
RUN_FAILED = -32603


def absolute(path: Any, cwd: str) -> Any:
    """A run's path (relative to the server's root) as the editor names it: under its project."""
    if not isinstance(path, str) or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(cwd, path))


def step_content(content: Any, cwd: str) -> list[Any]:
    """A step's ``content`` (text and diffs) as ACP tool call content."""
    found: list[Any] = []
    for item in map(mapping, items(content)):
        if item.get("type") == "text" and isinstance(item.get("text"), str):
            found.append(tool_content(text_block(item["text"])))
        elif item.get("type") == "diff" and isinstance(item.get("path"), str):
            new, old = item.get("new_text"), item.get("old_text")
            if isinstance(new, str):
                found.append(
                    tool_diff_content(
                        absolute(item["path"], cwd), new, old if isinstance(old, str) else None
                    )
                )
    return found


def step_locations(result: Any, cwd: str) -> list[ToolCallLocation] | None:
    """The files a step touched (``result.locations``, as an ACP agent's steps record them)."""
    found = [
        ToolCallLocation(
            path=absolute(place["path"], cwd),
            line=place.get("line") if isinstance(place.get("line"), int) else None,
        )
        for place in map(mapping, items(mapping(result).get("locations")))
        if isinstance(place.get("path"), str)
    ]
    return found or None


def tool_kind(kind: Any) -> ToolKind:
    return cast(ToolKind, kind) if kind in TOOL_KINDS else "other"


def event_updates(event: dict[str, Any], cwd: str) -> list[Any]:
    """The session updates an event becomes (none for what an editor has no place for)."""
    kind, data = event.get("type"), mapping(event.get("data"))
    run_id = event.get("run_id")
    if kind in ("text.delta", "reasoning.delta"):
        delta = data.get("delta")
        if not isinstance(delta, str) or not delta:
            return []
        if kind == "reasoning.delta":
            return [update_agent_thought_text(delta)]
        update = update_agent_message_text(delta)
        if isinstance(data.get("message_id"), str):
            # A message id is unique in a run only; an editor's is unique in its session.
            update.message_id = f"{run_id}/{data['message_id']}"
        return [update]
    if kind == "tool.started":
        title, name, args = data.get("title"), data.get("name"), data.get("args")
        if not isinstance(title, str) or not title:
            title = name if isinstance(name, str) and name else "step"
        return [
            start_tool_call(
                str(data.get("call_id")),
                title,
                kind=tool_kind(data.get("kind")),
                status="in_progress",
                raw_input=args if isinstance(args, dict) else None,
            )
        ]
    if kind == "tool.completed":
        result = data.get("result")
        error = mapping(data.get("error"))
        content = step_content(data.get("content"), cwd)
        if not content and isinstance(error.get("message"), str):
            content = [tool_content(text_block(error["message"]))]
        return [
            update_tool_call(
                str(data.get("call_id")),
                status="completed" if data.get("ok", True) else "failed",
                content=content or None,
                locations=step_locations(result, cwd),
                raw_output=result,
            )
        ]
    if kind == "plan.updated":
        entries = []
        for entry in map(mapping, items(data.get("entries"))):
            if not isinstance(entry.get("content"), str):
                continue
            status, priority = entry.get("status"), entry.get("priority")
            entries.append(
                plan_entry(
                    entry["content"],
                    priority=cast(PlanEntryPriority, priority)
                    if priority in PLAN_PRIORITIES
                    else "medium",
                    status=cast(PlanEntryStatus, status) if status in PLAN_STATUSES else "pending",
                )
            )
        return [update_plan(entries)]
    # ``usage``: ACP's usage_update is the context window's fill (used of size), which a
    # run does not know; its totals go with the turn's answer (``prompt_usage``).
    return []


def joined(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` with adjacent deltas of one message's text (or thoughts) as one delta.

    A run streams its answer a few characters an event: the editor reads it
    the same in far fewer updates, which is what keeps up with a fast run and
    makes a long conversation load in a moment. The events given are left as
    they were.
    """
    out: list[dict[str, Any]] = []
    pieces: list[str] = []  # the deltas of out[-1], when it is a delta being joined
    size = 0

    def close() -> None:
        if len(pieces) > 1:
            out[-1] = {**out[-1], "data": {**out[-1]["data"], "delta": "".join(pieces)}}
        pieces.clear()

    for event in events:
        data = mapping(event.get("data"))
        delta = data.get("delta")
        if event.get("type") not in ("text.delta", "reasoning.delta") or not isinstance(delta, str):
            close()
            out.append(event)
            continue
        last = out[-1] if out and pieces else None
        if (
            last is not None
            and last.get("type") == event.get("type")
            and last.get("run_id") == event.get("run_id")
            and last["data"].get("message_id") == data.get("message_id")
            and size + len(delta) <= MERGED_TEXT
        ):
            pieces.append(delta)
            size += len(delta)
            continue
        close()
        out.append(event)
        pieces.append(delta)
        size = len(delta)
    close()
    return out


def tokens(usage: Any) -> int | None:
    """Input and output tokens of a ``usage`` (None when it holds no counts)."""
    counts = [mapping(usage).get(name) for name in ("input_tokens", "output_tokens")]
    if not all(isinstance(count, int) and count >= 0 for count in counts):
        return None
    return sum(counts)  # type: ignore[arg-type]


def prompt_usage(run: dict[str, Any]) -> Usage | None:
    """The run's token totals, for the prompt's answer."""
    usage = mapping(mapping(run.get("snapshot")).get("usage"))
    total = tokens(usage)
    if total is None:
        return None
    return Usage(
        input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"], total_tokens=total
    )


def prompt_text(run: dict[str, Any]) -> str | None:
    """What the person asked, as the run's input holds it."""
    prompt = mapping(run.get("input")).get("prompt")
    return prompt if isinstance(prompt, str) and prompt else None


def user_message(run: dict[str, Any]) -> Any:
    """A replayed run's prompt, as the editor shows the person's own messages."""
    text = prompt_text(run)
    return None if text is None else update_user_message_text(text)


def snapshot_text(run: dict[str, Any]) -> str:
    """The text a run's snapshot holds: what is shown for events that were compacted away."""
    texts = [
        message.get("text")
        for message in map(mapping, items(mapping(run.get("snapshot")).get("messages")))
    ]
    return "".join(text for text in texts if isinstance(text, str))


def permission_options(request: dict[str, Any]) -> list[PermissionOption]:
    """A question's choices as an editor's permission options.

    A permission (an ACP agent's question) keeps the agent's own options; an
    approval's first choice allows, the others reject; any other question's
    choices allow, but those that say no.
    """
    choices = [choice for choice in items(request.get("choices")) if isinstance(choice, str)]
    if request.get("kind") == "permission":
        kinds = {
            option.get("optionId"): option.get("kind")
            for option in map(mapping, items(mapping(request.get("details")).get("options")))
        }
        names = option_names(request)
        return [
            PermissionOption(
                option_id=choice,
                name=names.get(choice, choice),
                kind=cast(PermissionOptionKind, kinds[choice])
                if kinds.get(choice) in PERMISSION_KINDS
                else "allow_once",
            )
            for choice in choices
        ]
    options = []
    for index, choice in enumerate(choices):
        if request.get("kind") == "approval":
            allows = index == 0
        else:
            allows = choice.casefold() not in NO_WORDS
        kind: PermissionOptionKind = "allow_once" if allows else "reject_once"
        options.append(PermissionOption(option_id=choice, name=choice, kind=kind))
    return options


def permission_tool_call(request: dict[str, Any], call_id: str | None, cwd: str) -> ToolCallUpdate:
    """The step a question is about: the step in progress, with what the question shows of it."""
    tool = mapping(mapping(request.get("details")).get("tool"))
    title = request.get("title") if isinstance(request.get("title"), str) else None
    return ToolCallUpdate(
        tool_call_id=call_id or str(request.get("request_id")),
        title=title or "The agent asks to go on",
        kind=tool_kind(tool.get("kind")) if tool else None,
        content=step_content(tool.get("content"), cwd) or None,
    )


def stop_reason(terminal: dict[str, Any]) -> StopReason:
    """A turn's stop reason from its run's terminal event; a run that failed is an error."""
    kind, data = terminal.get("type"), mapping(terminal.get("data"))
    if kind == "run.succeeded":
        reason = mapping(data.get("output")).get("stop_reason")
        return cast(StopReason, reason) if reason in KEPT_STOP_REASONS else "end_turn"
    if isinstance(kind, str) and kind in STOP_REASONS:
        return STOP_REASONS[kind]
    error = mapping(data.get("error"))
    if kind == "run.failed" and error.get("type") == "refused":
        return "refusal"
    message = error.get("message") if isinstance(error.get("message"), str) else None
    if kind == "run.interrupted":
        reason = data.get("reason")
        message = "the run was interrupted" + (f": {reason}" if isinstance(reason, str) else "")
    raise RequestError(
        RUN_FAILED,
        message or "the run failed",
        {"run_id": terminal.get("run_id"), "error": error or None},
    )
