"""Tools in the chat completions API: their definitions, and the model's calls answered."""

from __future__ import annotations

import json
from typing import Any

from ..tools import Tool, run_tool


def definition(spec: Tool) -> dict[str, Any]:
    """The tool as the chat completions API's ``tools`` list takes it."""
    function = {"name": spec.name, "parameters": spec.parameters}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


async def call_tool(
    run,
    tools: dict[str, Tool],
    call: dict[str, Any],
    approve: list[str] | None = None,
    asked: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one tool call the model asked for; returns the tool message that answers it.

    ``approve`` and ``asked`` as :func:`~jupyter_agentruns.agents.tools.run_tool` takes them.
    """
    name, raw = call["function"]["name"], call["function"]["arguments"]
    try:
        args = json.loads(raw or "{}")
        problem = None if isinstance(args, dict) else "the arguments are not a JSON object"
    except ValueError as exc:
        args, problem = None, f"the arguments are not JSON ({exc})"
    shown = args if isinstance(args, dict) else {"arguments": raw}
    content = await run_tool(run, tools, name, shown, problem=problem, approve=approve, asked=asked)
    return {"role": "tool", "tool_call_id": call["id"], "content": content}
