"""A run of the ``openai`` agent started from the middle of another: the conversation up to there."""

from __future__ import annotations

import json
from typing import Any

from .. import ForkPoint
from ..steps import error_text, step_text


def forked_input(point: ForkPoint) -> dict[str, Any]:
    """The input of a run that goes on from event ``point.at_seq`` of another.

    Its ``history`` is what the model had said and the tools had answered by
    then, as the messages that follow the prompt: each of the original's
    model calls (its checkpoint's turns) whose answer was complete, with the
    tool calls that had ended (their results, as the model read them). A
    call that had not ended is not in it: the new run asks the model again
    from there. The original's own ``history`` (a fork of a fork) comes first.
    """
    snapshot = point.snapshot
    messages = {message["id"]: message for message in snapshot["messages"]}
    steps = list(snapshot["tools"])
    history: list[dict[str, Any]] = list(point.input.get("history") or [])
    # The n-th tool step of the snapshot answers the n-th call of the turns (as in resume).
    next_step = 0
    for turn in (point.checkpoint or {}).get("turns") or []:
        message_id = turn.get("message_id")
        text = ""
        if message_id:
            message = messages.get(message_id)
            if message is None or not message.get("done"):
                break  # this answer was not complete by then
            text = message["text"]
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for call in turn.get("calls") or []:
            step = steps[next_step] if next_step < len(steps) else None
            if step is None or step.get("status") == "running":
                break
            next_step += 1
            arguments = call["function"].get("arguments")
            if arguments is None:  # kept brief in the checkpoint: its step has them
                arguments = json.dumps(step.get("args") or {})
            calls.append({**call, "function": {**call["function"], "arguments": arguments}})
            ended = step.get("status") == "completed"
            content = step_text(step) if ended else error_text(step.get("error") or {})
            results.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        if not text and not calls:
            break  # nothing of this model call had ended
        said: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            said["tool_calls"] = calls
        history += [said, *results]
        if len(calls) < len(turn.get("calls") or []):
            break  # the fork goes on from the middle of this turn's calls
    forked = {key: value for key, value in point.input.items() if key != "history"}
    if history:
        forked["history"] = history
    return forked
