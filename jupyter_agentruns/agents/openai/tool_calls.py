"""Tools in the chat completions API: their definitions, tool_choice, the model's calls answered."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from ..steps import error_text
from ..tools import Tool, run_tool
from .errors import InvalidInput


def definition(spec: Tool) -> dict[str, Any]:
    """The tool as the chat completions API's ``tools`` list takes it."""
    function = {"name": spec.name, "parameters": spec.parameters}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def offered_tools(
    registered: dict[str, Tool], servers_tools: dict[str, Tool], wanted: list[str] | None
) -> dict[str, Tool]:
    """The tools a run offers: ``wanted`` (the input's ``tools``), else all of them.

    A registered tool wins over an MCP server's of the same name. The input
    schema checked the registered names; an MCP server's tool is known only
    now that the servers are listed, so a name none of them offers is refused
    here, with the names they do offer.
    """
    if wanted is None:
        return {**registered, **{n: t for n, t in servers_tools.items() if n not in registered}}
    missing = [name for name in wanted if name not in registered and name not in servers_tools]
    if missing:
        listed = ", ".join(servers_tools) or "none"
        raise InvalidInput(
            f"tools names {missing[0]!r}, which no configured MCP server offers "
            f"(their tools: {listed})"
        )
    return {name: registered.get(name) or servers_tools[name] for name in wanted}


def tool_choice(choice: str | None, tools: Collection[str]) -> str | dict[str, Any] | None:
    """The input's ``tool_choice`` as the API takes it: a mode, or one of ``tools`` named."""
    if choice is None or choice == "auto":
        return choice
    if not tools:
        raise InvalidInput(f"tool_choice {choice!r} needs tools, and this run offers none")
    if choice in ("none", "required"):
        return choice
    if choice not in tools:
        raise InvalidInput(
            f"tool_choice names {choice!r}, a tool this run does not offer "
            f"(its tools: {', '.join(tools)})"
        )
    return {"type": "function", "function": {"name": choice}}


# The notebook tools' names, for the input schema (made before any run has its
# run.notebook_tools, which define them).
NOTEBOOK_TOOLS = (
    "delete_cell", "describe", "edit_cell", "execute_cell", "insert_cell", "list_variables",
    "read_notebook", "run_code",
)  # fmt: skip


def notebook_definitions(notebook: Any, tools: dict[str, Tool]) -> list[dict[str, Any]]:
    """The run's notebook tools (``run.notebook_tools``) as the ``tools`` list takes them."""
    return [
        {"type": "function", "function": dict(spec)}
        for spec in notebook.definitions
        if spec["name"] not in tools
    ]


def is_notebook_tool(notebook: Any, tools: dict[str, Tool], name: str) -> bool:
    """Whether a call of ``name`` goes to the notebook tools (a registered tool of that name wins)."""
    return (
        notebook is not None
        and name not in tools
        and any(spec["name"] == name for spec in notebook.definitions)
    )


async def call_tool(
    run,
    tools: dict[str, Tool],
    call: dict[str, Any],
    approve: list[str] | None = None,
    asked: dict[str, Any] | None = None,
    notebook: Any = None,
) -> dict[str, Any]:
    """Run one tool call the model asked for; returns the tool message that answers it.

    ``approve`` and ``asked`` as :func:`~jupyter_agentruns.agents.tools.run_tool` takes them;
    ``notebook``: the run's notebook tools, when the model is offered them.
    """
    name, raw = call["function"]["name"], call["function"]["arguments"]
    try:
        args = json.loads(raw or "{}")
        problem = None if isinstance(args, dict) else "the arguments are not a JSON object"
    except ValueError as exc:
        args, problem = None, f"the arguments are not JSON ({exc})"
    shown = args if isinstance(args, dict) else {"arguments": raw}
    if is_notebook_tool(notebook, tools, name):
        if problem is not None:
            # One tool step per call all the same: a resumed run counts them.
            error = {"type": "invalid_arguments", "message": problem}
            call_id = await run.tool_started(name, shown)
            await run.tool_completed(call_id, ok=False, error=error)
            content = error_text(error)
        else:
            content = (await notebook.call(name, shown, asked=asked)).text
        return {"role": "tool", "tool_call_id": call["id"], "content": content}
    content = await run_tool(run, tools, name, shown, problem=problem, approve=approve, asked=asked)
    return {"role": "tool", "tool_call_id": call["id"], "content": content}
