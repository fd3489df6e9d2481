"""The ``openai`` agent: its settings, and its loop of model calls and tool calls."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import math
import os
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from traitlets import Bool, Dict, Float, Int, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from ... import tracing
from .. import ForkPoint, error_object, import_object
from ..mcp_client import mcp_tools
from ..tools import Tool, describe_tool
from .conversation import conversation, input_schema
from .errors import MaxToolIterationsExceeded, UpstreamError
from .fork import forked_input
from .journal import Journal, brief
from .stream import Turn, stream_turn
from .tool_calls import (
    NOTEBOOK_TOOLS,
    call_tool,
    definition,
    notebook_definitions,
    offered_tools,
    tool_choice,
)
from .upstream import NO_KEY, retry_delay, retryable, server_name, upstream_error
from .usage import Usage

if TYPE_CHECKING:
    import openai
elif importlib.util.find_spec("openai") is None:
    # Imported at the first run (see OpenAIAgent.__call__), but missing now: the
    # agent is left out at the server's start, saying which extra to install.
    raise ModuleNotFoundError("No module named 'openai'", name="openai")


class OpenAIAgent(Configurable):
    """Streams from an OpenAI-compatible chat server, calling registered Python tools.

    Resumable: each finished model call is saved in the run's checkpoint (its
    message's id and its tool calls); a run taken over after its server died
    rebuilds the conversation from that and the run's snapshot (each message's
    text, each tool call's result) and asks the model only for the next step.
    """

    resumable = True

    base_url = Unicode(
        "https://api.openai.com/v1",
        help="The server's OpenAI-compatible API, e.g. http://localhost:11434/v1 for Ollama.",
    ).tag(config=True)
    model = Unicode("gpt-4o-mini", help="The model, unless a run's input names another.").tag(
        config=True
    )
    api_key_env = Unicode(
        "OPENAI_API_KEY",
        help="The NAME of the environment variable holding the API key (never the key itself). "
        "When it is unset a placeholder is sent, which is what local servers want.",
    ).tag(config=True)
    request_timeout = Float(
        600.0,
        min=0.001,
        help="Seconds the server may stay silent (connecting, before the first token, between chunks).",
    ).tag(config=True)
    max_tool_iterations = Int(
        10,
        min=0,
        help="Rounds of tool calls a run may make; one more request for tools fails the run.",
    ).tag(config=True)
    max_retries = Int(
        2,
        min=0,
        help="Retries of a request that failed before its first token (connection error, 429, 5xx).",
    ).tag(config=True)
    retry_backoff = Float(
        1.0,
        min=0,
        help="Seconds before the first retry; each next one waits twice as long (or what Retry-After says).",
    ).tag(config=True)
    tools = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="Python functions (sync or async) the model may call: name -> 'module:attr'.",
    ).tag(config=True)

    notebook_tools = Bool(
        False,
        help="Offer the model the notebook tools (run_code, list_variables, describe, "
        "read_notebook) on the kernel of the notebook that submitted the run, where the server "
        "has them (see c.AgentRuns.notebook_tools_approval).",
    ).tag(config=True)

    approve_tools = List(
        Unicode(),
        help="Tools a person must approve before each call: names, or ['*'] for all. "
        "A denied call is not run; the model reads that it was denied.",
    ).tag(config=True)
    prices = Dict(
        value_trait=Dict(),
        help="Prices per million tokens, by model: {'gpt-4o-mini': {'input': 0.15, 'output': 0.6}}. "
        "A run of a model listed here has a cost in its usage events (in that currency).",
    ).tag(config=True)
    # Not configurable here: the loader gives the server's c.AgentRuns.mcp_servers.
    mcp_servers = Dict(
        value_trait=Dict(),
        help="The server's MCP servers (c.AgentRuns.mcp_servers): an input may name their tools.",
    )

    @validate("prices")
    def _valid_prices(self, proposal: dict[str, Any]) -> dict[str, Any]:
        for model, price in proposal["value"].items():
            for kind in ("input", "output"):
                value = price.get(kind)
                if (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                    or value < 0
                ):
                    raise TraitError(
                        f"c.OpenAIAgent.prices[{model!r}][{kind!r}] must be a number of at least 0 "
                        f"(per million {kind} tokens), not {value!r}"
                    )
        return proposal["value"]

    @validate("request_timeout", "retry_backoff")
    def _finite(self, proposal: dict[str, Any]) -> float:
        value = proposal["value"]
        if not math.isfinite(value):
            raise TraitError(
                f"c.OpenAIAgent.{proposal['trait'].name} must be a finite number, not {value!r}"
            )
        return value

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.registered: dict[str, Tool] = {}
        for name, reference in self.tools.items():
            try:
                self.registered[name] = describe_tool(name, import_object(reference))
            except Exception as exc:
                raise ValueError(f"c.OpenAIAgent.tools[{name!r}] = {reference!r}: {exc}") from exc
        offered = f"; tools: {', '.join(self.registered)}" if self.registered else ""
        where = server_name(self.base_url)
        self.description = (
            f"Chat with {self.model} at {where} (an OpenAI-compatible server){offered}."
        )
        notebook = sorted(set(NOTEBOOK_TOOLS) - set(self.registered)) if self.notebook_tools else []
        # An input may name the MCP servers' tools, which each run lists when it starts.
        self.input_schema = input_schema(
            sorted(self.registered), notebook, sorted(self.mcp_servers)
        )

    def fork(self, point: ForkPoint) -> dict[str, Any]:
        """A run going on from the middle of another: its conversation up to there (``history``)."""
        return forked_input(point)

    def choices(self) -> dict[str, Any]:
        """Its models: the configured one, then those ``prices`` names (an input may name others)."""
        names = dict.fromkeys([self.model, *sorted(self.prices)])
        return {
            "models": [{"id": name, "name": name} for name in names],
            "current": {"model": self.model},
        }

    async def __call__(self, run, input: dict[str, Any]) -> dict[str, Any]:
        # The openai SDK takes most of a second of CPU to import: not at the server's
        # start (most servers and CLI commands never call a model), but at the first
        # run, off the event loop, whose other runs keep streaming meanwhile.
        if "openai" not in sys.modules:
            await asyncio.to_thread(importlib.import_module, "openai")
        # The configured MCP servers' tools, listed once, their sessions open for the run.
        async with mcp_tools(getattr(run, "mcp_servers", None) or {}) as servers_tools:
            return await self._run(run, input, servers_tools)

    async def _run(
        self, run, input: dict[str, Any], servers_tools: dict[str, Tool]
    ) -> dict[str, Any]:
        model = input.get("model") or self.model
        messages = conversation(input)
        tools = offered_tools(self.registered, servers_tools, input.get("tools"))
        request: dict[str, Any] = {
            "model": model,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for option in ("temperature", "max_tokens"):
            if option in input:
                request[option] = input[option]
        notebook = getattr(run, "notebook_tools", None) if self.notebook_tools else None
        offered = [definition(spec) for spec in tools.values()]
        if notebook is not None:
            offered += notebook_definitions(notebook, tools)
        if offered:
            request["tools"] = offered
        # A run's tool_choice may name a notebook tool the run offers.
        offered_names: dict[str, None] = {name: None for name in tools}  # in order, once each
        if notebook is not None:
            offered_names.update({spec["name"]: None for spec in notebook.definitions})
        first_choice = tool_choice(input.get("tool_choice"), offered_names)
        # What earlier attempts did (a run taken over after its server died).
        earlier = Journal(run) if getattr(run, "attempt", 1) > 1 else None
        turns: list[dict[str, Any]] = []
        async with self._client() as client:
            usage = Usage(run, client, self.base_url, self.prices.get(model))
            if earlier is not None:
                usage.totals = earlier.usage()
                for saved in earlier.turns:
                    turns.append(saved)
                    messages.append(earlier.assistant_message(saved))
                    if not saved["calls"]:  # the answer was complete: only its end was missing
                        return {
                            "text": messages[-1]["content"],
                            "messages": messages,
                            "model": saved.get("model") or model,
                            "finish_reason": saved.get("finish_reason"),
                            "usage": usage.totals,
                        }
                    for call in saved["calls"]:
                        messages.append(
                            await earlier.tool_result(
                                run, tools, call, self.approve_tools, notebook
                            )
                        )
                # A message the model was streaming when the server died: closed as
                # it is; the model is asked again (that call is paid at most twice).
                for message_id in earlier.unfinished_messages():
                    await run.message_completed(message_id)
            for rounds in range(len(turns), self.max_tool_iterations + 1):
                # The tool_choice asked for holds for the first call only: forcing
                # a tool on every call would call it again and again.
                choice = first_choice if rounds == 0 else None
                call = {**request, "messages": messages}
                if choice is not None:
                    call["tool_choice"] = choice
                with tracing.chat(call["model"], urlsplit(self.base_url).hostname) as span:
                    turn = await self._answer(run, client, call)
                    tracing.chat_usage(span, turn.model, turn.finish_reason, turn.usage)
                    await usage.add(call, turn)
                messages.append(turn.message())
                turns.append(
                    {
                        "message_id": turn.message_id,
                        "calls": turn.tool_calls if turn.calls else [],
                        "model": turn.model,
                        "finish_reason": turn.finish_reason,
                    }
                )
                # After the call's events: a later attempt knows it was made and paid for.
                # Earlier turns' calls all started: their arguments are in the snapshot.
                for earlier_turn in turns[:-1]:
                    earlier_turn["calls"] = [brief(c) for c in earlier_turn["calls"]]
                await run.save_checkpoint({"turns": turns})
                if not turn.calls:
                    return {
                        "text": turn.text,
                        "messages": messages,
                        "model": turn.model or model,
                        "finish_reason": turn.finish_reason,
                        "usage": usage.totals,
                    }
                if rounds == self.max_tool_iterations:
                    break
                for call in turn.tool_calls:
                    messages.append(
                        await call_tool(run, tools, call, self.approve_tools, notebook=notebook)
                    )
                # Every tool result is in the log before the model sees it: after a
                # crash the log shows what ran, and nothing runs twice unnoticed.
                await run.durable()
        raise MaxToolIterationsExceeded(
            f"the model still asked for tools after {self.max_tool_iterations} rounds "
            "(c.OpenAIAgent.max_tool_iterations)"
        )

    def _client(self) -> openai.AsyncOpenAI:
        import openai  # not at the top: see __call__

        # One client per run: its connections close with the run, cancelled or not.
        return openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=os.environ.get(self.api_key_env) or NO_KEY,
            timeout=self.request_timeout,
            max_retries=0,  # retries are ours: only before the first token, and visible in the log
        )

    async def _answer(self, run, client: openai.AsyncOpenAI, request: dict[str, Any]) -> Turn:
        """One model call, streamed into the run; retried while no token has arrived."""
        import openai  # not at the top: see __call__

        attempt = 0
        while True:
            turn = Turn(server_name(self.base_url))
            attempt += 1
            try:
                await stream_turn(run, client, request, turn)
                return turn
            except (
                openai.APIError,
                httpx.TransportError,
                json.JSONDecodeError,
                UpstreamError,
            ) as exc:
                error = upstream_error(
                    exc,
                    attempt,
                    base_url=self.base_url,
                    api_key_env=self.api_key_env,
                    request_timeout=self.request_timeout,
                )
                if turn.started or attempt > self.max_retries or not retryable(exc):
                    raise error from None  # the SDK's exception may quote the key
                delay = retry_delay(exc, self.retry_backoff * 2 ** (attempt - 1))
            retry = {
                "retry": attempt,
                "max_retries": self.max_retries,
                "delay": delay,
                "error": error_object(error),
            }
            await run.custom("upstream_retry", retry)
            await asyncio.sleep(delay)
