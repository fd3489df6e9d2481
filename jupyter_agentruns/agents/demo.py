"""The built-in ``demo`` agent: deterministic, offline, for docs, demos and tests."""

from __future__ import annotations

import asyncio
import itertools
import math
import re

from . import agent

FILLER = (
    "This answer streams from a durable run owned by the Jupyter server, so a page refresh, "
    "a dropped connection or a kernel restart only pauses the view, never the run."
).split()
# The answer quotes the prompt up to this many characters: a delta stays far
# below what a client takes (64 KiB), however few the chunks.
PROMPT_SHOWN = 2000
# A delta is a word with the space or line breaks that follow it.
_TOKEN = re.compile(r"\S+\s*|\s+")

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "prompt": {"type": "string", "maxLength": 100000},
        "chunks": {"type": "integer", "minimum": 1, "maximum": 100000, "default": 40},
        "delay": {"type": "number", "minimum": 0, "maximum": 10, "default": 0.05},
        "tools": {"type": "boolean", "default": True},
        "fail": {"type": "boolean", "default": False},
        "ask": {"type": "boolean", "default": False},
    },
    "required": ["prompt"],
    "additionalProperties": False,
}


OUTPUT_TEXT_LIMIT = 64 * 1024


class DemoFailure(Exception):
    """The demo agent was asked to fail."""


class Denied(Exception):
    """A person denied the demo agent's request to go on."""

    error_type = "denied"


def answer_markdown(prompt: str, chunks: int) -> str:
    """The demo's answer as Markdown: a heading, a list, a table and the prompt, as given, in a code block."""
    title = " ".join(prompt.split()[:12])[:80] or "nothing"
    quoted = prompt[:PROMPT_SHOWN]
    # A fence longer than any run of backticks in the prompt: the prompt cannot close it.
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", quoted)), default=0))
    cut = f" (its first {PROMPT_SHOWN} of {len(prompt)} characters)" if quoted != prompt else ""
    return (
        f"## Demo answer about {title}\n\n"
        "This answer streams from a durable run owned by the Jupyter server:\n\n"
        "- a page refresh only pauses the view;\n"
        "- a dropped connection picks up from the last event it saw;\n"
        "- a kernel restart finds the same run again.\n\n"
        "| the prompt | count |\n"
        "| --- | ---: |\n"
        f"| characters | {len(prompt)} |\n"
        f"| words | {len(prompt.split())} |\n"
        f"| chunks asked for | {chunks} |\n\n"
        f"The prompt, as given{cut}:\n\n"
        f"{fence}text\n{quoted}\n{fence}\n"
    )


def answer_words(prompt: str, chunks: int) -> list[str]:
    """The ``chunks`` text deltas the demo streams for ``prompt``: same input, same text.

    The answer (``answer_markdown``) comes whole whatever ``chunks`` is: with
    fewer chunks than its words, a delta holds several; with more, a
    paragraph follows it until there are ``chunks`` deltas.
    """
    words = _TOKEN.findall(answer_markdown(prompt, chunks))
    if chunks <= len(words):
        return [
            "".join(words[index * len(words) // chunks : (index + 1) * len(words) // chunks])
            for index in range(chunks)
        ]
    more = [word + " " for word in itertools.islice(itertools.cycle(FILLER), chunks - len(words))]
    more[0] = "\n" + more[0]
    more[-1] = more[-1].rstrip(" ,.") + ".\n"
    return words + more


@agent(
    input_schema=INPUT_SCHEMA,
    description="Deterministic demo agent: two tool calls, then a streamed answer "
    "(with ask: after a person approves). No network. Resumable.",
    resumable=True,
)
async def demo(run, input: dict) -> dict:
    prompt = input["prompt"]
    chunks = input.get("chunks", 40)
    delay = input.get("delay", 0.05)
    # The API refuses NaN and Infinity, but an agent called some other way must
    # not hand one to asyncio.sleep: it would corrupt the event loop's timers.
    if not isinstance(delay, (int, float)) or not math.isfinite(delay) or not 0 <= delay <= 10:
        raise ValueError(f"delay must be a number of seconds between 0 and 10, not {delay!r}")

    async def pause() -> None:
        if delay:
            await asyncio.sleep(delay)

    # Taken over after its server died or stopped: what the run did so far is
    # in its snapshot, and nothing done is done again (the same input gives
    # the same text and tool calls, whatever the attempt).
    done = Progress(getattr(run, "snapshot", None))

    tools_used = []
    if input.get("tools", True):
        hits = len(prompt.split()) + 2
        if not done.tool("search"):
            await run.progress(0.0, "searching")
            await pause()
            call = done.open_call("search") or await run.tool_started("search", {"query": prompt})
            await pause()
            await run.tool_completed(call, {"hits": hits, "top": f"Notes on {prompt}"})
            await pause()
        if not done.tool("summarize"):
            call = done.open_call("summarize") or await run.tool_started(
                "summarize", {"hits": hits}
            )
            await pause()
            await run.tool_completed(call, {"summary": f"{hits} notes summarised"})
        tools_used = ["search", "summarize"]
        await pause()

    if input.get("ask"):
        choice = done.answer()
        if choice is None:
            request = done.open_question()
            if request is not None:  # asked before the takeover: still waiting for a person
                choice = await run.answer_to(request)
            else:
                await run.progress(0.0, "waiting for approval")
                choice = await run.ask(
                    f"Write the answer about {prompt.strip()[:80] or 'nothing'}?",
                    details={"prompt": prompt[:200], "chunks": chunks},
                    choices=["approve", "deny"],
                    kind="approval",
                )
        if choice != "approve":
            raise Denied("the request to write the answer was denied")

    deltas = answer_words(prompt, chunks)
    message, written, finished = done.message(deltas)
    if not finished:
        message = message or await run.message_started()
        step = max(1, chunks // 10)
        for index, delta in enumerate(deltas[written:], start=written + 1):
            await run.text(delta, message)
            await pause()
            if index % step == 0 and index < chunks:
                await run.progress(index / chunks, f"writing {index}/{chunks}")
        await run.message_completed(message)
    await run.progress(1.0, "done")
    await run.usage(input_tokens=len(prompt.split()), output_tokens=chunks)
    if input.get("fail"):
        raise DemoFailure("the demo agent was asked to fail")
    text = "".join(deltas)
    # A long answer stays in the run's snapshot: an output is one event, and
    # events are bounded (max_event_bytes).
    return {
        "text": text if len(text) <= OUTPUT_TEXT_LIMIT else None,
        "characters": len(text),
        "tools": tools_used,
    }


class Progress:
    """What an earlier attempt of the run did, read from its snapshot (nothing on a first attempt)."""

    def __init__(self, snapshot: dict | None):
        snapshot = snapshot or {}
        self._tools = snapshot.get("tools") or []
        self._inputs = snapshot.get("inputs") or []
        self._messages = snapshot.get("messages") or []

    def tool(self, name: str) -> bool:
        """Whether a call of the tool completed."""
        return any(t["name"] == name and t["status"] == "completed" for t in self._tools)

    def open_call(self, name: str) -> str | None:
        """A call that started and never completed: the demo's tools are pure, so it is finished now."""
        for tool in self._tools:
            if tool["name"] == name and tool["status"] == "running":
                return tool["call_id"]
        return None

    def answer(self) -> str | None:
        for request in self._inputs:
            if request["status"] == "resolved" and request.get("choice") is not None:
                return request["choice"]
        return None

    def open_question(self) -> str | None:
        for request in self._inputs:
            if request["status"] == "open":
                return request["request_id"]
        return None

    def message(self, deltas: list[str]) -> tuple[str | None, int, bool]:
        """The answer's message id, how many of its deltas it holds, and whether it is complete."""
        if not self._messages:
            return None, 0, False
        message = self._messages[-1]
        text, written = message["text"], 0
        while written < len(deltas) and text.startswith(deltas[written]):
            text = text[len(deltas[written]) :]
            written += 1
        return message["id"], written, message.get("done", False)
