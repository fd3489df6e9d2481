"""The agent API: what an agent is, what it receives, and how agents are found.

An agent is an async callable ``(run, input) -> output`` (or a plain function,
run in a worker thread). Decorate it with :func:`agent` to give it a name, a
description and the JSON schema its input must satisfy, then register it by
entry point (group ``jupyter_agentruns.agents``, which is how the built-in
``demo`` and ``openai`` agents are found) or with
``c.AgentRuns.agents = {"name": "module:attr"}``.

An agent may also be a ``traitlets.config.Configurable`` subclass whose
instances are such callables: it is instantiated with the server's
configuration, so ``c.<ClassName>.<trait>`` configures it. One that declares
an ``mcp_servers`` trait (not configurable: a ``Dict``) is given the
server's ``c.AgentRuns.mcp_servers`` in it.

Agents import this module (and nothing of the server): ``Run`` says what
their ``run`` argument offers, and the errors below are what they may see.

An agent declared ``@agent(resumable=True)`` survives the death of its
server: another server (or the restarted one) takes its run over and calls
it again, with ``run.attempt`` > 1, ``run.snapshot`` (everything the run did
so far) and ``run.checkpoint``. It must then go on from there and never
repeat a step whose completion is in the log.

An agent with modes or models a run may choose gives them with a
``choices()`` method (``{"modes": [{id, name, description?}], "models":
[...], "current": {"mode", "model"}}``, None while it does not know):
``GET agents`` lists them, and the front end's pickers put the chosen ones
in the input as ``mode`` / ``model``. With ``choices_checked = True`` a
submit naming another is refused (400 ``invalid_input``).

An agent that can start a run from the middle of another one (``POST
runs/{id}/fork``) has a ``fork(point)`` method: given a :class:`ForkPoint`
(the input, with the fork's fields over the original's, and the original
run's state after the chosen event) it returns the input of the new run,
which then runs as any other; it raises :class:`ForkUnsupported` to refuse a
point it cannot start from. An agent without one is refused (422
``fork_unsupported``). The new run has no session: its ``run.forked_from``
says where it came from, and ``run.conversation()`` gives the checkpoint the
original saved. An agent that can fork only where a turn ended (an ACP
agent, whose ``session/fork`` copies a conversation as it is) says
``forks_steps = False``: ``GET agents`` then lists it with ``forks: false``,
and the views offer no Retry from here on its steps.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol

import jsonschema
from traitlets.config import Configurable

from ..errors import error_object

__all__ = [
    "ENTRY_POINT_GROUP", "AgentSpec", "EventTooLarge", "ForkPoint", "ForkUnsupported", "Run",
    "RunClosed", "TokenBudgetExceeded", "agent", "error_object", "import_object", "load_agents",
]  # fmt: skip

ENTRY_POINT_GROUP = "jupyter_agentruns.agents"
ANY_OBJECT = {"type": "object"}


class RunClosed(Exception):
    """The run has ended (or was cancelled): it takes no more events."""


class EventTooLarge(ValueError):
    """An event's data is larger than ``max_event_bytes``: the run fails with ``event_too_large``."""


class TokenBudgetExceeded(Exception):
    """A usage event crossed ``max_tokens_per_run`` or the owner's ``tokens_per_user_per_day``.

    Raised from the emit of that usage event (which is kept); the run fails
    with ``token_budget_exceeded`` whatever the agent does next.
    """

    error_type = "token_budget_exceeded"


class ForkUnsupported(Exception):
    """An agent cannot start a run from this point of another (422 ``fork_unsupported``, saying why)."""


@dataclass(frozen=True)
class ForkPoint:
    """Where a fork starts: what an agent's ``fork(point)`` builds the new run's input from.

    ``input``: the original run's input with the fork's fields over it.
    ``at_seq``: the original's last event the fork keeps. ``events``: the
    original's events up to it (``{seq, type, ts, data}``), and ``snapshot``
    the state they make (``run.snapshot``'s shape). ``checkpoint``: the last
    value the original's agent saved (``run.save_checkpoint``), which may be
    from after ``at_seq``. ``later_runs``: the runs of the original's
    conversation (its owner, session and agent) started after it, newest first.
    """

    run_id: str
    at_seq: int
    input: dict[str, Any]
    events: Sequence[Mapping[str, Any]]
    snapshot: dict[str, Any]
    checkpoint: Any = None
    later_runs: Sequence[str] = ()


class Run(Protocol):
    """The ``run`` an agent receives. A plain-function agent gets the same methods, blocking.

    Every method appends events to the run's durable log, in order; each
    returns once the event is queued (``durable()`` waits for the commit).
    Raise any exception to fail the run: its ``error_type`` attribute (a
    string), if it has one, becomes the run's ``error.type``.
    """

    run_id: str
    """The run's id (``run_…``)."""

    agent: str
    """The name the run was submitted to (this agent's, as registered)."""

    input: Any
    """The submit's ``input``, valid against the agent's input schema."""

    owner: str
    """Who submitted the run."""

    session: str | None
    """The session the run belongs to (a notebook's path, by default), or None."""

    metadata: dict[str, Any]
    """What the submit said about the run (``cell_id``, ``notebook``, ``kernel_id``, ``title``, ...)."""

    forked_from: dict[str, Any] | None
    """For a fork (``POST runs/{id}/fork``): ``{run_id, seq}``, the run and event it goes on from."""

    notebook_tools: Any
    """The notebook tools on the kernel that submitted the run, or None (no kernel, or the
    server's kernels are not all the run owner's). ``definitions``: ``[{name, description,
    parameters}]``; ``await call(name, args)``: one call, recorded as a tool step (``run_code``
    asks the person first unless ``notebook_tools_approval`` is ``"never"``), returning
    ``.ok``, ``.text`` (what a model reads) and ``.images``; ``mcp_server()``: ``{"url",
    "headers"}`` of the server's MCP endpoint with a token good for this run only. A resumed
    run's ``await resume(step)`` answers a call an earlier attempt started (an edit settled by
    the notebook's file), ``await settle()`` every edit step it left running (``settles(step)``:
    whether it is one of those). For agents that read and write notebooks as files (ACP's
    ``fs/*``): ``await read_notebook_text(path)``, the notebook as the person has it, as its
    file's text, recorded as read; ``await write_notebook(path, text)``, a notebook written
    whole made as cell edits, one tool step each (``.ok``, ``.text``, ``.changes``,
    ``.notes``, ``.error``); None from either when nothing holds a notebook at ``path``."""

    notebook_writes: Any
    """A notebook read and written whole as the person has it, with a kernel or without (a
    run from the runs panel, from REST): ``read_notebook_text``, ``write_notebook``,
    ``resume``, ``settle`` and ``settles`` as ``notebook_tools`` has them (which it is, where
    the run has notebook tools). None where the notebook tools do not serve the run's owner."""

    mcp_servers: dict[str, dict[str, Any]]
    """The configured MCP servers (``c.AgentRuns.mcp_servers``), by name: ``{"command": [...],
    "env": {...}}`` (stdio) or ``{"url": "...", "headers": {...}}`` (Streamable HTTP)."""

    @property
    def cancelled(self) -> bool:
        """True once the run was asked to stop (its task is also cancelled)."""

    async def message_started(self, role: str = "assistant") -> str:
        """Start a message; returns its id."""

    async def text(self, delta: str, message_id: str | None = None) -> int:
        """Stream a piece of text into a message (the current one by default)."""

    async def message_completed(self, message_id: str | None = None) -> int:
        """End a message (the current one by default)."""

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
        (what it does, in words) are shown by the views.
        """

    async def tool_completed(
        self,
        call_id: str,
        result: Any = None,
        *,
        ok: bool = True,
        error: Any = None,
        content: list[dict[str, Any]] | None = None,
    ) -> int:
        """Record a tool call's end. ``content``: what it showed, ``[{"type": "text", "text"}``
        or ``{"type": "diff", "path", "old_text", "new_text"}]`` (a diff is shown as one)."""

    async def reasoning(self, delta: str, message_id: str | None = None) -> int:
        """Stream a piece of the model's visible thinking (the views fold it)."""

    async def plan(self, entries: list[dict[str, Any]]) -> int:
        """The agent's plan now, replacing the last: ``[{"content", "status", "priority"?}]``,
        status ``pending``, ``in_progress`` or ``completed``."""

    def tool(self, name: str, args: dict[str, Any] | None = None) -> Any:
        """``async with run.tool(name, args) as call: call.result = ...`` (an exception marks it failed)."""

    async def progress(self, fraction: float | None, message: str = "") -> int:
        """How far the run is: ``fraction`` from 0 to 1 (None: unknown), and a word on it."""

    async def usage(self, input_tokens: int, output_tokens: int) -> int:
        """Token totals so far (each usage event replaces the last).

        Each is an integer from 0 to 2**53; anything else raises ``ValueError``.
        """

    async def custom(self, name: str, data: dict[str, Any] | None = None) -> int:
        """An agent-defined event ``x.<name>``."""

    async def emit(self, type: str, data: dict[str, Any] | None = None) -> int:
        """Any documented agent event type, or ``x.<name>``."""

    async def durable(self) -> None:
        """Wait until every event emitted so far is committed (call it before a side effect)."""

    # Resuming (an agent declared resumable=True) --------------------------

    attempt: int
    """1, then one more each time the run was taken over after its server died or stopped."""

    snapshot: dict[str, Any]
    """The run so far, when this attempt began (its messages, tools, inputs, progress, usage)."""

    checkpoint: Any
    """The last value ``save_checkpoint`` stored (None before the first)."""

    in_doubt: str
    """How a step an earlier attempt started and never ended is settled, when doing it again
    could repeat its effect (``c.AgentRuns.in_doubt``): ``"tell_model"`` (it is not made again,
    and fails ``interrupted``) or ``"ask"`` (a question of kind ``in_doubt``: run it again,
    skip it, or stop the run). ``agents.steps.tool_step`` does either."""

    async def history(self) -> list[dict[str, Any]]:
        """The run's kept events so far, ``{seq, type, ts, data}``, oldest first.

        Compacted events are gone: ``snapshot`` has what they did.
        """

    async def save_checkpoint(self, value: Any) -> None:
        """Store a JSON value for a later attempt, committed after every event emitted before it."""

    async def answer_to(self, request_id: str) -> str:
        """Wait for the answer to a question an earlier attempt asked (still open in ``snapshot``)."""

    async def conversation(self) -> Any:
        """The last checkpoint an earlier run of the same owner, session and agent saved, or None.

        For an agent whose runs of a session go on with one conversation: the
        earlier run saved where that conversation is (e.g. an ACP session id).
        For a fork (``forked_from``), the last checkpoint the run it was forked from saved.
        """

    async def set_conversation_title(self, title: str) -> None:
        """Name the run's conversation (its owner's runs of its session and agent) in the agent's
        own words: ``GET conversations`` shows the newest title given, in place of the first
        prompt. At most 500 characters are kept; a run without a session has no conversation to name.
        """

    async def ask(
        self,
        title: str,
        details: Any = None,
        choices: Sequence[str] = ("approve", "deny"),
        kind: str = "approval",
        timeout: float | None = None,
    ) -> str:
        """Ask a person and wait for their choice (one of ``choices``).

        Emits ``input.requested``; the run is ``waiting`` until every open
        question is answered. The question is durable: a page refresh or a
        kernel restart does not lose it, and it can be answered from the
        widget or with ``POST runs/{id}/inputs/{request_id}``. Raises
        ``TimeoutError`` after ``timeout`` seconds (the question is then
        resolved with ``reason: "timeout"``). The kind ``budget`` is the
        server's own question for more tokens: asking it raises ``ValueError``.
        """


def agent(
    fn: Callable | None = None,
    *,
    input_schema: dict[str, Any] | None = None,
    description: str | None = None,
    resumable: bool = False,
):
    """Declare an agent's input schema and description (both optional), and whether it resumes."""

    def decorate(fn: Any) -> Callable:  # Any: it is given attributes
        fn.input_schema = input_schema or ANY_OBJECT
        fn.description = description or inspect.getdoc(fn) or ""
        fn.resumable = resumable
        return fn

    return decorate(fn) if fn is not None else decorate


@dataclass(frozen=True)
class AgentSpec:
    name: str
    fn: Callable
    description: str
    input_schema: dict[str, Any]
    # Taken over after its server dies or stops, instead of ending interrupted.
    resumable: bool = False

    @property
    def is_async(self) -> bool:
        call = (
            self.fn
            if inspect.isfunction(self.fn) or inspect.ismethod(self.fn)
            else self.fn.__call__  # type: ignore[operator]  # mypy cannot type a Callable's own __call__
        )
        return inspect.iscoroutinefunction(call)

    def describe(self) -> dict[str, Any]:
        """The agent as ``GET agents`` lists it, with its modes and models where it says them."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "resumable": self.resumable,
            "forks": self.forks,
            **(self.choices() or {}),
        }

    def choices(self) -> dict[str, Any] | None:
        """What a run may choose (``modes``, ``models``: ``[{id, name, description?}]``, and the
        ``current`` ids), as the agent's optional ``choices()`` says them; None when it says none."""
        offered = getattr(self.fn, "choices", None)
        return offered() if callable(offered) else None

    def choice_problem(self, value: Any) -> tuple[str, str] | None:
        """An input's ``mode`` or ``model`` that the agent does not offer (for an agent whose
        ``choices_checked`` is true, once it has said its choices), or None."""
        if not getattr(self.fn, "choices_checked", False) or not isinstance(value, dict):
            return None
        offered = self.choices() or {}
        for category in ("mode", "model"):
            known = [choice["id"] for choice in offered.get(f"{category}s") or ()]
            chosen = value.get(category)
            if known and isinstance(chosen, str) and chosen not in known:
                return f"input.{category}", (
                    f"input.{category}: the agent {self.name!r} has no {category} {chosen!r} "
                    f"(its {category}s: {', '.join(known)})"
                )
        return None

    @property
    def forks(self) -> bool:
        """Whether a run of the agent can be forked from one of its steps (Retry from here): it
        has ``fork`` and does not say ``forks_steps = False`` (forks only where a turn ended)."""
        return callable(getattr(self.fn, "fork", None)) and bool(
            getattr(self.fn, "forks_steps", True)
        )

    async def fork(self, point: ForkPoint) -> dict[str, Any]:
        """The input of a run started at ``point``, as the agent's ``fork(point)`` makes it.

        Raises :class:`ForkUnsupported` when the agent has no ``fork`` or refuses the point.
        """
        if not callable(getattr(self.fn, "fork", None)):
            raise ForkUnsupported(
                f"the agent {self.name!r} cannot start a run from the middle of another "
                "(it has no fork(); see 'Write an agent')"
            )
        agent: Any = self.fn  # (it has a fork, as self.forks says)
        made = agent.fork(point)
        if inspect.isawaitable(made):
            made = await made
        if not isinstance(made, dict):
            raise TypeError(
                f"the agent {self.name!r}'s fork() returned {type(made).__name__}, not a dict"
            )
        return made

    def input_problem(self, value: Any) -> tuple[str, str] | None:
        """Where ``value`` breaks the input schema (or names a mode or model the agent does
        not offer: ``choice_problem``) and why, or None.

        Where is a path in the body as ``invalid_request`` names one
        (``input.delay``, ``input.tools[1]``; ``input`` for the object itself).
        """
        validator = jsonschema.Draft202012Validator(self.input_schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is None:
            return self.choice_problem(value)
        where = "input" + "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
        )
        return where, f"{where}: {error.message}"


def spec_for(
    name: str,
    fn: Any,
    parent: Configurable | None = None,
    mcp_servers: dict[str, dict[str, Any]] | None = None,
) -> AgentSpec:
    """The agent ``fn`` (a Configurable class is instantiated, with ``mcp_servers`` if it takes them)."""
    if isinstance(fn, type) and issubclass(fn, Configurable):
        given = {"mcp_servers": mcp_servers or {}} if "mcp_servers" in fn.class_traits() else {}
        fn = fn(parent=parent, **given)
    if not callable(fn):  # else each of its runs would fail, saying less
        raise TypeError(f"a {type(fn).__name__} is not callable: an agent is a function or a class")
    schema = getattr(fn, "input_schema", None) or ANY_OBJECT
    check_schema(schema)
    description = getattr(fn, "description", None) or inspect.getdoc(fn) or ""
    return AgentSpec(
        name=name,
        fn=fn,
        description=description.strip(),
        input_schema=schema,
        resumable=bool(getattr(fn, "resumable", False)),
    )


def check_schema(schema: Any) -> None:
    """Raise jsonschema's SchemaError where ``schema`` is not a valid JSON Schema.

    A schema found valid is not checked again in this process (a check against
    the meta-schema takes milliseconds, and a server's agents are loaded at each
    start of it, many times in one process when it runs in-process).
    """
    try:
        text = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):  # not JSON: checked every time, as it is
        jsonschema.Draft202012Validator.check_schema(schema)
    else:
        _check_schema_text(text)


@functools.lru_cache(maxsize=256)  # only valid ones: an error is raised, not kept
def _check_schema_text(text: str) -> None:
    jsonschema.Draft202012Validator.check_schema(json.loads(text))


@functools.cache
def installed_agents() -> tuple[EntryPoint, ...]:
    """The agents installed packages declare: read once in a process (a look at the
    metadata of every installed package), as a server reads them once at its start."""
    return tuple(entry_points(group=ENTRY_POINT_GROUP))


def import_object(reference: str) -> Any:
    """``"package.module:attr"`` to the object it names."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{reference!r} is not of the form 'module:attr'")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_agents(
    configured: dict[str, str],
    log: logging.Logger,
    parent: Configurable | None = None,
    mcp_servers: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, AgentSpec], dict[str, str]]:
    """The agents of the entry points, then of the configuration (later wins on a name clash).

    ``parent`` configures the Configurable ones; ``mcp_servers`` (the server's
    ``c.AgentRuns.mcp_servers``) is given to those that declare that trait.
    Returns ``(agents, failures)``: an agent that cannot be loaded costs only
    itself. It is left out, the log says why, and ``failures`` keeps the
    reason for the answer to a submit that names it.
    """
    found: dict[str, AgentSpec] = {}
    failures: dict[str, str] = {}
    sources = [(point.name, point.value, point.load) for point in installed_agents()]
    sources += [
        (name, reference, functools.partial(import_object, reference))
        for name, reference in configured.items()
    ]
    for name, reference, load in sources:
        try:
            found[name] = spec_for(name, load(), parent, mcp_servers)
        except Exception as exc:
            found.pop(name, None)
            reason = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, ImportError) and reference.startswith("jupyter_agentruns."):
                # A built-in agent whose optional dependency is not installed.
                log.info(
                    "agentruns: no built-in %r agent (%s); pip install 'jupyter_agentruns[%s]'",
                    name,
                    reason,
                    name,
                )
            else:
                log.error(
                    "agentruns: cannot load the agent %r from %s: %s", name, reference, reason
                )
            failures[name] = reason
        else:
            failures.pop(name, None)
    return found, failures
