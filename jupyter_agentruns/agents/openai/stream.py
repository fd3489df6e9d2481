"""One model call: its answer put together from its stream of chunks, its text streamed live."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import budgets
from .errors import UpstreamProtocol
from .upstream import shorten

if TYPE_CHECKING:
    import openai


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
        # Usage it reported over 2**53 tokens (counted as 2**53), as it reported it.
        self.over_max_usage: str | None = None
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
            input_tokens, output_tokens = (budgets.reported_count(value) for value in reported)
            said = f"prompt_tokens {reported[0]!r:.30}, completion_tokens {reported[1]!r:.30}"
            if input_tokens is None or output_tokens is None:
                # Not counts (-5, 1.5, "many"): ignored, as if not reported.
                self.usage = None
                self.absurd_usage = said
            else:
                self.usage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
                if any(budgets.over_max(value) for value in reported):
                    self.over_max_usage = said
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


def chunk_json(chunk: Any) -> str:
    """A chunk as the server sent it, as near as the SDK's object tells."""
    try:
        return chunk.to_json(indent=None, warnings=False)
    except (TypeError, ValueError):  # a chunk malformed enough may not even serialize
        return repr(chunk)
