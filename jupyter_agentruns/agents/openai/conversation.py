"""A run's input: its JSON schema, and the conversation it starts from."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..mcp_client import SEPARATOR


def conversation(input: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages a run starts from: ``system``, then ``messages`` or the ``prompt``, then
    the ``history`` a fork carries on from."""
    messages = [{"role": "system", "content": input["system"]}] if "system" in input else []
    if "messages" in input:
        messages += [sendable(message) for message in input["messages"]]
    else:
        messages.append({"role": "user", "content": input["prompt"]})
    return messages + [sendable(message) for message in input.get("history") or ()]


def sendable(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as every server takes it: an assistant's ``"content": null`` becomes ``""``.

    The OpenAI SDK writes a tool-calling answer with a null content, which some
    servers (llama-cpp-python) refuse with a 500; an empty string passes everywhere.
    """
    message = dict(message)
    if message["role"] == "assistant" and message.get("content", "") is None:
        message["content"] = ""
    return message


def input_schema(
    tool_names: Sequence[str],
    notebook_tool_names: Sequence[str] = (),
    mcp_servers: Sequence[str] = (),
) -> dict[str, Any]:
    """``notebook_tool_names``: the notebook tools, which ``tool_choice`` may name too.

    ``mcp_servers``: the configured MCP servers' names. Their tools
    (``<server>__<tool>``) are known only once a run has listed them: the
    schema takes any name of a configured server, the run checks the rest.
    """
    choices: dict[str, Any] = {
        "enum": ["auto", "none", "required", *tool_names, *notebook_tool_names]
    }
    names: dict[str, Any] = {"enum": list(tool_names)}
    if mcp_servers:
        servers = "|".join(re.escape(server) for server in mcp_servers)
        mcp_tool = {
            "type": "string",
            "pattern": f"^(?:{servers}){SEPARATOR}[A-Za-z0-9_-]+$",
            "maxLength": 64,
            "description": "A configured MCP server's tool, as offered: <server>__<tool>.",
        }
        choices = {"anyOf": [choices, mcp_tool]}
        names = {"anyOf": [names, mcp_tool]}
    return {
        "type": "object",
        "properties": {
            "prompt": {
                "type": "string",
                "description": "The user's message (or `messages`, not both).",
            },
            "messages": {
                "type": "array",
                "minItems": 1,
                "description": "The conversation so far, in OpenAI chat format (or `prompt`, not both).",
                "items": {
                    "type": "object",
                    "properties": {
                        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]}
                    },
                    "required": ["role"],
                },
            },
            "system": {"type": "string", "description": "A system message put first."},
            "history": {
                "type": "array",
                "description": "What followed the prompt before this run, in OpenAI chat format: "
                "a fork's (POST runs/{id}/fork) answers and tool results up to where it starts.",
                "items": {
                    "type": "object",
                    "properties": {"role": {"enum": ["assistant", "tool", "user"]}},
                    "required": ["role"],
                },
            },
            "model": {
                "type": "string",
                "minLength": 1,
                "description": "Another model than the configured one.",
            },
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "max_tokens": {
                "type": "integer",
                "minimum": 1,
                "description": "At most this many tokens in each answer of the model.",
            },
            "tool_choice": {
                **choices,
                "description": "For the first model call: let the model choose (auto), "
                "no tool, some tool, or the tool named.",
            },
            "tools": {
                "type": "array",
                "uniqueItems": True,
                "items": names,
                "description": "The registered tools and MCP servers' tools this run offers "
                "the model (default: all of them).",
            },
        },
        # Exactly one of prompt and messages.
        "if": {"required": ["messages"]},
        "then": {"properties": {"prompt": {"not": {}}}},
        "else": {"required": ["prompt"]},
        "additionalProperties": False,
    }
