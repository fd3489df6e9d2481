"""The ``openai`` agent: its settings, and its loop of model calls and tool calls."""

from __future__ import annotations

import ast
import asyncio
import json
import math
import os
import random
import re
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import openai
from traitlets import Dict, Float, Int, List, TraitError, Unicode, validate
from traitlets.config import Configurable

from ... import budgets
from .. import error_object, import_object
from ..tools import Tool, describe_tool, error_text, needs_approval, redo_tool, result_text
from .tool_calls import call_tool, definition

# Sent when the configured environment variable is unset: local servers want no
# key, but the SDK (and some servers) insist on an Authorization header.
NO_KEY = "no-key"
# A server asking to wait longer than this (Retry-After) is waited for this long.
MAX_RETRY_DELAY = 60.0
UPSTREAM_TEXT_LIMIT = 500


# Errors: each ``error_type`` is the run's ``error.type``. ---------------------


class UpstreamError(Exception):
    """The model server answered with an error the agent cannot recover from."""

    error_type = "upstream_error"


class UpstreamAuth(UpstreamError):
    """The model server refused the API key (401 or 403)."""

    error_type = "upstream_auth"


class UpstreamRateLimit(UpstreamError):
    """Still rate limited (429) after every retry."""

    error_type = "upstream_rate_limit"


class UpstreamTimeout(UpstreamError):
    """The model server sent nothing for ``request_timeout`` seconds."""

    error_type = "upstream_timeout"


class UpstreamUnreachable(UpstreamError):
    """No connection to the model server, or it broke."""

    error_type = "upstream_unreachable"


class UpstreamProtocol(UpstreamError):
    """The stream is not what an OpenAI-compatible server sends."""

    error_type = "upstream_protocol"


class MaxToolIterationsExceeded(Exception):
    """The model still asked for tools after ``max_tool_iterations`` rounds."""

    error_type = "max_tool_iterations_exceeded"


class InvalidInput(ValueError):
    """The run's input contradicts itself in a way its schema cannot say."""

    error_type = "invalid_input"


# One streamed answer -------------------------------------------------------


class Turn:
    """One assistant answer, put together from its stream of ``chat.completion.chunk``s."""

    def __init__(self, server: str) -> None:
        self.server = server  # host:port, for the errors
        self.chunks = 0
        self.text = ""
        self.calls: dict[int, dict[str, str]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, int] | None = None
        # Usage the server reported that cannot be token counts, as it reported it.
        self.absurd_usage: str | None = None
        self.model: str | None = None
        self.started = False  # a token arrived: retrying now would repeat it
        self.message_id: str | None = None  # the run's message its text streamed into

    def feed(self, chunk: Any) -> str:
        """Take one chunk; returns its text delta (maybe empty)."""
        try:
            return self._feed(chunk)
        except (AttributeError, TypeError, ValueError) as exc:
            raise UpstreamProtocol(
                f"the model server at {self.server} sent a malformed chunk ({exc}): "
                f"{shorten(chunk_json(chunk))}"
            ) from None

    def _feed(self, chunk: Any) -> str:
        self.chunks += 1
        self.model = chunk.model or self.model
        if chunk.usage is not None:
            reported = chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0
            counts = [budgets.reported_count(value) for value in reported]
            if None in counts:
                # Not counts (1e20, -5, "many"): ignored, as if not reported.
                self.usage = None
                self.absurd_usage = (
                    f"prompt_tokens {reported[0]!r:.30}, completion_tokens {reported[1]!r:.30}"
                )
            else:
                self.usage = {"input_tokens": counts[0], "output_tokens": counts[1]}
        text = ""
        for choice in chunk.choices or []:
            if choice.index not in (0, None):
                continue  # we ask for one choice (n=1)
            delta = choice.delta
            if delta is not None:
                text += delta.content or ""
                # Tool calls arrive in pieces: the first fragment of call `index`
                # has its id and name, the next ones more of its arguments. Some
                # servers (llama-cpp-python) repeat the id and name in every
                # fragment, so only the arguments are put together.
                for position, fragment in enumerate(delta.tool_calls or []):
                    index = fragment.index if fragment.index is not None else position
                    call = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                    call["id"] = call["id"] or fragment.id or ""
                    if fragment.function is not None:
                        call["name"] = call["name"] or fragment.function.name or ""
                        call["arguments"] += fragment.function.arguments or ""
                    self.started = True
            self.finish_reason = choice.finish_reason or self.finish_reason
        self.text += text
        self.started = self.started or bool(text)
        return text

    def finish(self) -> None:
        """Check that the stream ended because the answer did."""
        if self.finish_reason is not None:
            return
        if self.chunks == 0:
            raise UpstreamProtocol(
                f"the model server at {self.server} answered 200 with an empty stream (no chunk, "
                "no finish_reason); some servers (llama-cpp-python) answer so to a prompt longer "
                "than the model's context size: shorten the conversation or give the server a "
                "larger context"
            )
        calls = f" and {len(self.calls)} tool call(s)" if self.calls else ""
        raise UpstreamProtocol(
            f"the model server at {self.server} ended its stream after {self.chunks} chunk(s) "
            f"({len(self.text)} characters of text{calls}) with no finish_reason; another request "
            "to the same server may have interrupted this one (llama-cpp-python stops a running "
            "answer when the next request comes): send it one request at a time"
        )

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return [
            {
                "id": call["id"] or f"call_{index}",
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
            for index, call in sorted(self.calls.items())
        ]

    def received_text(self) -> str:
        """The answer's text and tool calls, as a tokenizer should count them."""
        calls = [f"{call['name']} {call['arguments']}" for call in self.calls.values()]
        return "\n".join(part for part in [self.text, *calls] if part)

    def message(self) -> dict[str, Any]:
        """The answer as an assistant message of the conversation."""
        if not self.calls:
            return {"role": "assistant", "content": self.text}
        return {"role": "assistant", "content": self.text, "tool_calls": self.tool_calls}


# The agent -----------------------------------------------------------------


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
        self.input_schema = input_schema(sorted(self.registered))

    async def __call__(self, run, input: dict[str, Any]) -> dict[str, Any]:
        model = input.get("model") or self.model
        messages = conversation(input)
        tools = {name: self.registered[name] for name in input.get("tools", self.registered)}
        request: dict[str, Any] = {
            "model": model,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for option in ("temperature", "max_tokens"):
            if option in input:
                request[option] = input[option]
        if tools:
            request["tools"] = [definition(spec) for spec in tools.values()]
        first_choice = tool_choice(input.get("tool_choice"), tools)
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
                            await earlier.tool_result(run, tools, call, self.approve_tools)
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
                turn = await self._answer(run, client, call)
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
                    messages.append(await call_tool(run, tools, call, self.approve_tools))
                # Every tool result is in the log before the model sees it: after a
                # crash the log shows what ran, and nothing runs twice unnoticed.
                await run.durable()
        raise MaxToolIterationsExceeded(
            f"the model still asked for tools after {self.max_tool_iterations} rounds "
            "(c.OpenAIAgent.max_tool_iterations)"
        )

    def _client(self) -> openai.AsyncOpenAI:
        # One client per run: its connections close with the run, cancelled or not.
        return openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=os.environ.get(self.api_key_env) or NO_KEY,
            timeout=self.request_timeout,
            max_retries=0,  # retries are ours: only before the first token, and visible in the log
        )

    async def _answer(self, run, client: openai.AsyncOpenAI, request: dict[str, Any]) -> Turn:
        """One model call, streamed into the run; retried while no token has arrived."""
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
                error = self._upstream_error(exc, attempt)
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

    def _upstream_error(self, exc: Exception, attempts: int) -> UpstreamError:
        """What went wrong, in words a user can act on, with no secret in them."""
        where = server_name(self.base_url)
        key = os.environ.get(self.api_key_env) or ""
        if isinstance(exc, UpstreamError):  # it may quote what the server sent
            return type(exc)(scrub(str(exc), key))
        if isinstance(exc, json.JSONDecodeError):
            return UpstreamProtocol(
                f"the model server at {where} sent a chunk that is not JSON ({exc.msg}): "
                f"{shorten(scrub(exc.doc, key))}"
            )
        if isinstance(exc, openai.APITimeoutError):
            return UpstreamTimeout(
                f"the model server at {where} sent nothing for {self.request_timeout:g} s "
                "(c.OpenAIAgent.request_timeout)"
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = scrub(str(exc.__cause__ or exc), key) or type(exc.__cause__).__name__
            return UpstreamUnreachable(f"cannot talk to the model server at {where}: {cause}")
        if isinstance(exc, httpx.TransportError):
            # A connection that broke mid-stream: some SDK versions pass httpx's error on as is.
            cause = scrub(str(exc), key) or type(exc).__name__
            return UpstreamUnreachable(
                f"the connection to the model server at {where} broke: {cause}"
            )
        said = scrub(upstream_message(exc), key)
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status in (401, 403):
                hint = (
                    f"check the key in the environment variable {self.api_key_env}"
                    if key
                    else f"the environment variable {self.api_key_env} (c.OpenAIAgent.api_key_env) is not set"
                )
                return UpstreamAuth(
                    f"the model server at {where} refused the API key ({status}: {said}); {hint}"
                )
            if status == 429:
                return UpstreamRateLimit(
                    f"the model server at {where} is rate limiting this key (429 after {attempts} "
                    f"attempt{'s' if attempts > 1 else ''}): {said}"
                )
            return UpstreamError(f"the model server at {where} answered {status}: {said}")
        return UpstreamError(f"the model server at {where} reported an error: {said}")


class Usage:
    """A run's token totals: the server's counts, or estimates where it reports none.

    A server that sends no usage (llama-cpp-python, even asked with
    ``stream_options.include_usage``) is asked to count the text sent and
    received with its own tokenizer (llama-cpp-python's
    ``/extras/tokenize/count``). Those counts miss the chat template's own
    tokens, so they are marked as estimates. With no tokenizer at hand there
    are no counts; either way the run says so once, in an
    ``x.usage_unreported`` event.
    """

    def __init__(
        self,
        run,
        client: openai.AsyncOpenAI,
        base_url: str,
        price: dict[str, float] | None = None,
    ) -> None:
        self.run = run
        self.price = price  # per million input and output tokens
        self.client = client
        self.server = server_name(base_url)
        # The extras live beside the API, not under its /v1.
        self.count_url = urljoin(base_url.rstrip("/") + "/", "../extras/tokenize/count")
        self.totals: dict[str, Any] | None = None
        self.tokenizer = True  # until the server shows it has none
        self.told = False

    async def add(self, request: dict[str, Any], turn: Turn) -> None:
        """Count one model call, and emit the totals so far."""
        counts, estimated = turn.usage, False
        if counts is None:
            counts = await self.estimate(request, turn)
            estimated = counts is not None
            if not self.told:
                self.told = True
                await self.run.custom(
                    "usage_unreported", self.unreported(estimated, turn.absurd_usage)
                )
        if counts is None:
            return
        totals = {kind: (self.totals or {}).get(kind, 0) + count for kind, count in counts.items()}
        if estimated or (self.totals or {}).get("estimated"):
            totals["estimated"] = True
        if self.price is not None:
            totals["cost"] = round(
                (
                    totals.get("input_tokens", 0) * self.price["input"]
                    + totals.get("output_tokens", 0) * self.price["output"]
                )
                / 1_000_000,
                8,
            )
        self.totals = totals
        await self.run.emit("usage", totals)

    async def estimate(self, request: dict[str, Any], turn: Turn) -> dict[str, int] | None:
        """Token counts of the text sent and received, by the server's tokenizer; None without one."""
        if not self.tokenizer:
            return None
        try:
            return {
                "input_tokens": await self.count(sent_text(request), request["model"]),
                "output_tokens": await self.count(turn.received_text(), request["model"]),
            }
        except (openai.APIError, KeyError, TypeError, ValueError):
            self.tokenizer = False
            return None

    async def count(self, text: str, model: str) -> int:
        if not text:
            return 0
        answer = await self.client.post(
            self.count_url, cast_to=object, body={"input": text, "model": model}
        )
        return int(answer["count"])

    def unreported(self, estimated: bool, absurd: str | None = None) -> dict[str, Any]:
        if absurd is None:
            said = f"usage not reported by the model server at {self.server}"
            tokenizer = ", which offers no tokenizer to estimate it with"
        else:
            said = (
                f"usage reported by the model server at {self.server} cannot be token counts "
                f"({absurd}) and is ignored"
            )
            tokenizer = "; it offers no tokenizer to estimate it with"
        if estimated:
            message = f"{said}: the token counts are estimates by its tokenizer"
        else:
            message = f"{said}{tokenizer}: no token counts"
        return {"server": self.server, "estimated": estimated, "message": message}


def sent_text(request: dict[str, Any]) -> str:
    """The text of a chat request, as a tokenizer should count it: contents, tool calls, tools."""
    parts = []
    for message in request["messages"]:
        content = message.get("content") or ""
        parts.append(content if isinstance(content, str) else json.dumps(content))
        for call in message.get("tool_calls") or []:
            parts.append(f"{call['function']['name']} {call['function']['arguments']}")
    parts += [json.dumps(tool["function"]) for tool in request.get("tools", [])]
    return "\n".join(parts)


async def stream_turn(run, client: openai.AsyncOpenAI, request: dict[str, Any], turn: Turn) -> None:
    """Stream one answer into ``turn``, emitting its text as it arrives."""
    message_id = None
    stream = await client.chat.completions.create(**request)
    # Leaving this block by any way (cancellation included) closes the HTTP
    # response, so the server stops generating at once.
    async with stream:
        async for chunk in stream:
            delta = turn.feed(chunk)
            if delta:
                message_id = message_id or await run.message_started()
                await run.text(delta, message_id)
    turn.finish()
    turn.message_id = message_id
    if message_id is not None:
        await run.message_completed(message_id)


class Journal:
    """What a run's earlier attempts did: their model calls (the checkpoint) and the run's snapshot.

    Each model call the agent made is a saved turn: the id of the message its
    text streamed into, and its tool calls. Each tool call the model asked for
    is one ``tool.started`` (in ``call_tool``), in order: the n-th tool of the
    snapshot answers the n-th call of the saved turns.
    """

    def __init__(self, run) -> None:
        snapshot = run.snapshot
        self.turns: list[dict[str, Any]] = list((run.checkpoint or {}).get("turns") or [])
        self._messages = {m["id"]: m for m in snapshot["messages"]}
        self._tools = list(snapshot["tools"])
        self._questions = [q for q in snapshot.get("inputs") or [] if q.get("kind") == "approval"]
        self._usage = snapshot.get("usage")
        self._next_tool = 0
        self._next_question = 0

    def usage(self) -> dict[str, Any] | None:
        return dict(self._usage) if self._usage else None

    def assistant_message(self, turn: dict[str, Any]) -> dict[str, Any]:
        message = self._messages.get(turn.get("message_id") or "")
        text = message["text"] if message is not None else ""
        if not turn["calls"]:
            return {"role": "assistant", "content": text}
        calls = []
        for offset, call in enumerate(turn["calls"]):
            if "arguments" not in call["function"]:  # kept brief: its tool.started has them
                index = self._next_tool + offset
                args = self._tools[index].get("args") if index < len(self._tools) else {}
                call = {**call, "function": {**call["function"], "arguments": json.dumps(args)}}
            calls.append(call)
        return {"role": "assistant", "content": text, "tool_calls": calls}

    def unfinished_messages(self) -> list[str]:
        saved = {turn.get("message_id") for turn in self.turns}
        return [m for m, message in self._messages.items()
                if not message.get("done") and m not in saved]  # fmt: skip

    async def tool_result(
        self, run, tools: dict[str, Tool], call: dict[str, Any], approve: list[str]
    ) -> dict[str, Any]:
        """The tool message for a call an earlier attempt was asked to make."""
        name = call["function"]["name"]
        # Its approval was asked before it started (run_tool), in call order.
        asked = None
        if needs_approval(approve, name, tools) and self._next_question < len(self._questions):
            asked = self._questions[self._next_question]
            self._next_question += 1
        if self._next_tool >= len(self._tools):
            # Not started: its approval, if asked, is answered or still open.
            return await call_tool(run, tools, call, approve, asked)
        started = self._tools[self._next_tool]
        self._next_tool += 1
        if started.get("status") == "running":
            spec = tools.get(name)
            if spec is not None and spec.idempotent:
                # Its server died during it, and doing it again is harmless.
                message = await redo_tool(run, spec, started)
                return {"role": "tool", "tool_call_id": call["id"], "content": message}
            error = {
                "type": "interrupted",
                "message": f"the call of {name} was interrupted when its server stopped, and "
                "was not repeated (it is not declared idempotent): it may or may not have "
                "taken effect",
            }
            await run.tool_completed(started["call_id"], ok=False, error=error)
            return {"role": "tool", "tool_call_id": call["id"], "content": error_text(error)}
        if started.get("status") == "completed":
            content = result_text(started.get("result"))
        else:
            error = started.get("error") or {}
            content = error_text({"type": error.get("type"), "message": error.get("message")})
        return {"role": "tool", "tool_call_id": call["id"], "content": content}


def brief(call: dict[str, Any]) -> dict[str, Any]:
    """A saved tool call without its arguments (the run's tool.started event has them)."""
    return {"id": call["id"], "type": "function", "function": {"name": call["function"]["name"]}}


def conversation(input: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages a run starts from: ``system``, then ``messages`` or the ``prompt``."""
    messages = [{"role": "system", "content": input["system"]}] if "system" in input else []
    if "messages" in input:
        return messages + [sendable(message) for message in input["messages"]]
    return messages + [{"role": "user", "content": input["prompt"]}]


def sendable(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as every server takes it: an assistant's ``"content": null`` becomes ``""``.

    The OpenAI SDK writes a tool-calling answer with a null content, which some
    servers (llama-cpp-python) refuse with a 500; an empty string passes everywhere.
    """
    message = dict(message)
    if message["role"] == "assistant" and message.get("content", "") is None:
        message["content"] = ""
    return message


def tool_choice(choice: str | None, tools: dict[str, Tool]) -> str | dict[str, Any] | None:
    """The input's ``tool_choice`` as the API takes it: a mode, or the tool named."""
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


def input_schema(tool_names: list[str]) -> dict[str, Any]:
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
                "enum": ["auto", "none", "required", *tool_names],
                "description": "For the first model call: let the model choose (auto), "
                "no tool, some tool, or the tool named.",
            },
            "tools": {
                "type": "array",
                "uniqueItems": True,
                "items": {"enum": tool_names},
                "description": "The registered tools this run offers the model (default: all of them).",
            },
        },
        # Exactly one of prompt and messages.
        "if": {"required": ["messages"]},
        "then": {"properties": {"prompt": {"not": {}}}},
        "else": {"required": ["prompt"]},
        "additionalProperties": False,
    }


def retryable(exc: Exception) -> bool:
    """Worth another try: the request never got an answer, or a busy (429) or failing (5xx) one.

    Not a 5xx that says the request is invalid: some servers (llama-cpp-python)
    answer 500 to what they cannot validate, and the same request fails again.
    """
    if isinstance(exc, openai.APITimeoutError):
        return False  # another wait of request_timeout would rarely end otherwise
    if isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
        return True
    return isinstance(exc, openai.APIStatusError) and (
        exc.status_code == 429 or (exc.status_code >= 500 and not says_invalid(exc))
    )


def says_invalid(exc: Exception) -> bool:
    """The server's error says the request itself is wrong."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and body.get("type") == "invalid_request_error":
        return True
    return bool(validation_errors(server_words(body)))


def retry_delay(exc: Exception, backoff: float) -> float:
    """The server's Retry-After if it gives one, else ``backoff`` with jitter; at most a minute."""
    response = getattr(exc, "response", None)
    try:
        delay = float(response.headers["retry-after"]) if response is not None else None
    except (KeyError, ValueError):
        delay = None
    # "nan" and "inf" parse as floats: a NaN sleep would corrupt the event loop's timers.
    if delay is None or not math.isfinite(delay) or delay < 0:
        delay = backoff * random.uniform(0.75, 1.0)
    return round(min(delay, MAX_RETRY_DELAY), 3)


def upstream_message(exc: Exception) -> str:
    """The server's own words from an error body, else the SDK's.

    A list of validation errors is told as where and what is wrong, so that
    shortening the message (``UPSTREAM_TEXT_LIMIT``) cannot cut that part off.
    """
    said = server_words(getattr(exc, "body", None))
    errors = validation_errors(said)
    if errors:
        return validation_summary(errors)
    if isinstance(said, str) and said:
        return said
    return getattr(exc, "message", None) or str(exc)


def server_words(body: Any) -> Any:
    """The message in an error body, a text or FastAPI's list of validation errors.

    OpenAI's and llama-cpp-python's ``error.message`` (the SDK unwraps
    ``error``), Ollama's ``error``, FastAPI's ``detail``.
    """
    if isinstance(body, dict):
        said = body.get("message") or body.get("error") or body.get("detail")
        return said.get("message") if isinstance(said, dict) else said
    return body


# A pydantic validation error as FastAPI writes it into a text, one per line:
# {'type': 'string_type', 'loc': ('body', 'messages', 1, ...), 'msg': '...', 'input': ...}
_VALIDATION_TEXT = re.compile(r"^\d+ validation errors?:")
_VALIDATION_LINE = re.compile(
    r"""\{'type': '(?P<type>\w+)', 'loc': (?P<loc>\([^()]*\)), """
    r"""'msg': (?P<msg>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
)


def validation_errors(said: Any) -> list[dict[str, Any]]:
    """The ``{type, loc, msg}`` of each validation error in a FastAPI ``detail`` or error text."""
    if isinstance(said, list):
        return [
            error
            for error in said
            if isinstance(error, dict)
            and isinstance(error.get("loc"), list | tuple)
            and isinstance(error.get("msg"), str)
        ]
    if not isinstance(said, str) or not _VALIDATION_TEXT.match(said):
        return []
    errors = []
    for line in said.splitlines()[1:]:
        found = _VALIDATION_LINE.search(line)
        if found is None:
            continue
        try:
            loc, msg = ast.literal_eval(found["loc"]), ast.literal_eval(found["msg"])
        except (ValueError, SyntaxError):  # not the shape it looks like
            continue
        errors.append({"type": found["type"], "loc": loc, "msg": msg})
    return errors


def validation_summary(errors: list[dict[str, Any]]) -> str:
    """``invalid request (N validation errors): where: what; …`` for the errors that matter.

    A message that fits none of a union's members (the kinds of chat message)
    gets an error from each; the members whose tag (a literal, such as the
    ``role``) did not match are not what the request meant, so their errors are
    left out. When no member's tag matched, the tags are what is wrong.
    """
    unmeant = {tuple(error["loc"][:-1]) for error in errors if error.get("type") == "literal_error"}
    meant = [
        error
        for error in errors
        if not any(tuple(error["loc"][: len(member)]) == member for member in unmeant)
    ]
    told = [
        f"{'.'.join(str(part) for part in error['loc'] if part != 'body')}: {error['msg']}"
        for error in meant or [error for error in errors if error.get("type") == "literal_error"]
    ]
    count = f"{len(errors)} validation error{'s' if len(errors) > 1 else ''}"
    return f"invalid request ({count}): {'; '.join(told)}"


# A part of the key this long is a secret wherever it shows up.
KEY_FRAGMENT = 8
_SECRET_SHAPES = [
    # Authorization headers and bearer tokens an upstream error echoes back.
    (
        re.compile(
            r"(?i)\b(authorization[\"']?\s*[:=]\s*[\"']?)(?:bearer\s+|token\s+)?[^\s\"',;]+"
        ),
        r"\1***",
    ),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1***"),
    # Key shapes of OpenAI and most compatible services.
    (re.compile(r"\b(sk-|sk-proj-|sk-ant-)[A-Za-z0-9_-]{6,}"), r"\1***"),
]


def mask_key(text: str, key: str) -> str:
    """``text`` with every run of it that is part of ``key`` (8 characters or more) masked."""
    if not key or key == NO_KEY:
        return text
    if len(key) < KEY_FRAGMENT:
        return text.replace(key, "***")
    fragments = {key[i : i + KEY_FRAGMENT] for i in range(len(key) - KEY_FRAGMENT + 1)}
    secret = bytearray(len(text))  # 1 where a character belongs to a fragment of the key
    for i in range(len(text) - KEY_FRAGMENT + 1):
        if text[i : i + KEY_FRAGMENT] in fragments:
            secret[i : i + KEY_FRAGMENT] = b"\x01" * KEY_FRAGMENT
    if not any(secret):
        return text
    out, i = [], 0
    while i < len(text):
        if secret[i]:
            out.append("***")
            while i < len(text) and secret[i]:
                i += 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def scrub(text: str, key: str) -> str:
    """``text`` with the API key (whole or in part) and anything shaped like a token masked, then shortened."""
    text = mask_key(text, key)
    for pattern, replacement in _SECRET_SHAPES:
        text = pattern.sub(replacement, text)
    text = " ".join(text.split())
    return text if len(text) <= UPSTREAM_TEXT_LIMIT else text[: UPSTREAM_TEXT_LIMIT - 1] + "…"


def chunk_json(chunk: Any) -> str:
    """A chunk as the server sent it, as near as the SDK's object tells."""
    try:
        return chunk.to_json(indent=None, warnings=False)
    except (TypeError, ValueError):  # a chunk malformed enough may not even serialize
        return repr(chunk)


def shorten(text: str, limit: int = 120) -> str:
    """A quote of what the server sent, short enough for an error message."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def server_name(base_url: str) -> str:
    """``host:port`` of a URL: enough to recognise the server, without credentials or path."""
    parts = urlsplit(base_url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname:
        return "(invalid base_url)"
    return f"{parts.hostname}:{port}" if port else parts.hostname
