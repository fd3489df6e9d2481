"""Python functions as tools a model may call, and their calls recorded in a run.

A tool's JSON schema comes from its signature and docstring, or from
:func:`tool`. Shared by every agent that takes tools: nothing here belongs to
one model's API.
"""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import json
import re
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import jsonschema

from . import check_schema
from .steps import Approval, tool_step

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class UnknownTool(LookupError):
    """The model called a tool that this run does not offer."""

    error_type = "unknown_tool"


class InvalidToolArguments(ValueError):
    """The model's arguments for a tool do not fit its schema."""

    error_type = "invalid_arguments"


def tool(
    fn: Callable | None = None,
    *,
    description: str | None = None,
    schema: dict | None = None,
    idempotent: bool = False,
):
    """Give a tool function its description or its parameters' JSON schema explicitly.

    ``idempotent=True``: calling it twice with the same arguments does no more
    harm than once (a lookup, a pure computation). A call its server died in
    is then made again when the run is resumed; any other is reported to the
    model as interrupted, not repeated.
    """

    def decorate(fn: Any) -> Callable:  # Any: it is given attributes
        fn.tool_description = description
        fn.tool_schema = schema
        fn.tool_idempotent = idempotent
        return fn

    return decorate(fn) if fn is not None else decorate


@dataclass(frozen=True)
class Tool:
    """A Python function the model may call, with the JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable
    idempotent: bool = False

    def check(self, args: dict[str, Any]) -> None:
        """Raise :class:`InvalidToolArguments` when ``args`` do not fit the parameters' schema."""
        validator = jsonschema.Draft202012Validator(self.parameters)
        invalid = jsonschema.exceptions.best_match(validator.iter_errors(args))
        if invalid is not None:
            raise InvalidToolArguments(invalid.message)

    async def call(self, args: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**args)
        # A sync tool must not block the server's event loop.
        return await asyncio.to_thread(self.fn, **args)


def describe_tool(name: str, fn: Callable) -> Tool:
    """``fn`` as the tool ``name``, with its explicit schema (see :func:`tool`) or a derived one."""
    if not TOOL_NAME.match(name):
        raise ValueError(
            f"{name!r} is not a valid tool name (letters, digits, '_' and '-', at most 64)"
        )
    summary, notes = docstring_parts(fn)
    schema = getattr(fn, "tool_schema", None) or parameters_schema(fn, notes)
    check_schema(schema)
    if schema.get("type") != "object":
        raise ValueError(f"tool {name!r}: its parameters' schema must be of type 'object'")
    return Tool(
        name,
        getattr(fn, "tool_description", None) or summary,
        schema,
        fn,
        bool(getattr(fn, "tool_idempotent", False)),
    )


def docstring_parts(fn: Callable) -> tuple[str, dict[str, str]]:
    """The first paragraph of ``fn``'s docstring, and its ``Args:`` section as ``{name: text}``."""
    doc = inspect.getdoc(fn) or ""
    first = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
    summary = "" if re.match(r"(Args|Arguments|Parameters):", first) else " ".join(first.split())
    notes: dict[str, str] = {}
    section = re.search(
        r"^(?:Args|Arguments|Parameters):[ \t]*\n((?:[ \t]+\S.*(?:\n|$))+)", doc, re.MULTILINE
    )
    if section:
        current = None
        for line in section.group(1).splitlines():
            entry = re.match(r"\s*\**(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
            if entry:
                current = entry.group(1)
                notes[current] = entry.group(2).strip()
            elif current:
                notes[current] = f"{notes[current]} {line.strip()}".strip()
    return summary, notes


def parameters_schema(fn: Callable, notes: dict[str, str] | None = None) -> dict[str, Any]:
    """The JSON schema of ``fn``'s keyword arguments: type hints, defaults (not required), notes."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ValueError(f"cannot read the type hints of {name}: {exc}") from exc
    properties: dict[str, Any] = {}
    required = []
    extra = False
    for param in inspect.signature(fn).parameters.values():
        if param.kind is param.VAR_KEYWORD:
            extra = True
            continue
        if param.kind is param.VAR_POSITIONAL:
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise ValueError(
                f"parameter {param.name!r} of {name} is positional-only: tools take keywords"
            )
        try:
            schema = type_schema(hints.get(param.name, Any))
        except TypeError as exc:
            raise ValueError(
                f"parameter {param.name!r} of {name}: {exc}; "
                "give the schema explicitly with @tool(schema=...)"
            ) from None
        if notes and notes.get(param.name) and "description" not in schema:
            schema["description"] = notes[param.name]
        if param.default is param.empty:
            required.append(param.name)
        elif is_json(param.default):
            schema["default"] = param.default
        properties[param.name] = schema
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": extra,
    }


_SIMPLE_TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}
_ARRAYS = (list, set, frozenset, collections.abc.Sequence, collections.abc.Set)
_OBJECTS = (dict, collections.abc.Mapping)


def type_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of a type hint; TypeError for a type JSON cannot carry."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return {}
    if origin is typing.Annotated:
        schema = type_schema(args[0])
        text = [note for note in args[1:] if isinstance(note, str)]
        return {**schema, "description": text[0]} if text else schema
    if hint in _SIMPLE_TYPES:
        return {"type": _SIMPLE_TYPES[hint]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        options = [type_schema(arg) for arg in args]
        if all(list(option) == ["type"] for option in options):
            return {"type": [option["type"] for option in options]}
        return {"anyOf": options}
    if hint is tuple or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return {"type": "array", **({"items": type_schema(args[0])} if args else {})}
    if origin is tuple:
        items = [type_schema(arg) for arg in args]
        return {
            "type": "array",
            "prefixItems": items,
            "minItems": len(items),
            "maxItems": len(items),
        }
    if hint in _ARRAYS or origin in _ARRAYS:
        return {"type": "array", **({"items": type_schema(args[0])} if args else {})}
    if hint in _OBJECTS or origin in _OBJECTS:
        return {
            "type": "object",
            **({"additionalProperties": type_schema(args[1])} if args else {}),
        }
    raise TypeError(f"the type {hint!r} has no JSON schema here")


def is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


# Calls ---------------------------------------------------------------------


def needs_approval(approve: list[str] | None, name: str, tools: dict[str, Tool]) -> bool:
    """A person must approve each call of ``name``: it is named in ``approve``, or ``"*"`` is."""
    return bool(approve and ("*" in approve or name in approve) and name in tools)


async def run_tool(
    run,
    tools: dict[str, Tool],
    name: str,
    args: dict[str, Any],
    *,
    problem: str | None = None,
    approve: list[str] | None = None,
    asked: dict[str, Any] | None = None,
) -> str:
    """Run one call of the tool ``name`` that a model asked for; returns what the model reads of it.

    ``args`` are shown in the run's ``tool.started``; ``problem`` says why what
    the model sent is no arguments at all, and the call then fails. A tool
    named in ``approve`` (or any, with ``"*"``) runs only once a person
    approved it. ``asked``: the approval question an earlier attempt of the run
    asked for this call (answered, or still open): it is not asked again.
    """
    approval = None
    if needs_approval(approve, name, tools):
        approval = Approval(
            f"Run the tool {name}?",
            details={"tool": name, "arguments": args},
            refused=f"this call of {name}",
        )
    act = _caller(tools, name, args, problem)
    return (await tool_step(run, name, args, act, approval=approval, asked=asked)).text


async def resume_tool(run, tools: dict[str, Tool], name: str, started: dict[str, Any]) -> str:
    """What the model reads of a call an earlier attempt of the run started (``started``: its step).

    Never made twice, but for an idempotent tool whose server died during the call.
    """
    spec = tools.get(name)
    args = started.get("args") or {}
    ended = await tool_step(
        run,
        name,
        args,
        _caller(tools, name, args),
        earlier=started,
        idempotent=spec is not None and spec.idempotent,
    )
    return ended.text


def _caller(
    tools: dict[str, Tool], name: str, args: dict[str, Any], problem: str | None = None
) -> Callable[[], Awaitable[Any]]:
    """The call of the tool ``name`` with ``args``: it fails when there is no such tool, or no
    such arguments."""

    async def act() -> Any:
        spec = tools.get(name)
        if spec is None:
            offered = ", ".join(tools) or "none"
            raise UnknownTool(f"there is no tool {name!r} in this run (tools: {offered})")
        if problem is not None:
            raise InvalidToolArguments(problem)
        spec.check(args)
        return await spec.call(args)

    return act
