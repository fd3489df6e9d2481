"""The agent plug-in interface: how agents declare themselves and are found.

An agent is an async callable ``(run, input) -> output`` (or a plain function,
run in a worker thread). Decorate it with :func:`agent` to give it a name, a
description and the JSON schema its input must satisfy, then register it by
entry point (group ``jupyter_agentruns.agents``) or with
``c.AgentRuns.agents = {"name": "module:attr"}``.

An agent may also be a ``traitlets.config.Configurable`` subclass whose
instances are such callables: it is instantiated with the server's
configuration, so ``c.<ClassName>.<trait>`` configures it.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import jsonschema
from traitlets.config import Configurable

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "jupyter_agentruns.agents"
ANY_OBJECT = {"type": "object"}


def agent(
    fn: Callable | None = None,
    *,
    input_schema: dict[str, Any] | None = None,
    description: str | None = None,
):
    """Declare an agent's input schema and description (both optional)."""

    def decorate(fn: Callable) -> Callable:
        fn.input_schema = input_schema or ANY_OBJECT
        fn.description = description or inspect.getdoc(fn) or ""
        return fn

    return decorate(fn) if fn is not None else decorate


@dataclass(frozen=True)
class AgentSpec:
    name: str
    fn: Callable
    description: str
    input_schema: dict[str, Any]

    @property
    def is_async(self) -> bool:
        call = self.fn if inspect.isfunction(self.fn) or inspect.ismethod(self.fn) else self.fn.__call__
        return inspect.iscoroutinefunction(call)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    def input_problem(self, value: Any) -> str | None:
        """Why ``value`` does not satisfy the input schema, or None."""
        validator = jsonschema.Draft202012Validator(self.input_schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is None:
            return None
        where = "/".join(str(part) for part in error.absolute_path)
        return f"input{'/' + where if where else ''}: {error.message}"


def spec_for(name: str, fn: Callable, parent: Configurable | None = None) -> AgentSpec:
    if isinstance(fn, type) and issubclass(fn, Configurable):
        fn = fn(parent=parent)
    schema = getattr(fn, "input_schema", None) or ANY_OBJECT
    jsonschema.Draft202012Validator.check_schema(schema)
    description = getattr(fn, "description", None) or inspect.getdoc(fn) or ""
    return AgentSpec(name=name, fn=fn, description=description.strip(), input_schema=schema)


def import_object(reference: str) -> Any:
    """``"package.module:attr"`` to the object it names."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{reference!r} is not of the form 'module:attr'")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_agents(configured: dict[str, str], parent: Configurable | None = None) -> dict[str, AgentSpec]:
    """The built-in agents, then entry points, then configuration (later wins on a name clash)."""
    from .demo import demo

    found: dict[str, AgentSpec] = {"demo": spec_for("demo", demo)}
    try:
        from .openai_chat import OpenAIAgent
    except ImportError as exc:  # the optional `openai` package is not installed
        log.info("agentruns: no built-in 'openai' agent (%s); pip install 'jupyter_agentruns[openai]'", exc)
    else:
        found["openai"] = spec_for("openai", OpenAIAgent, parent)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            found[point.name] = spec_for(point.name, point.load(), parent)
        except Exception:
            log.exception("agentruns: cannot load agent %r from entry point %s", point.name, point.value)
    for name, reference in configured.items():
        found[name] = spec_for(name, import_object(reference), parent)
    return found
