"""A run's token counts and cost: the server's, or its tokenizer's estimates."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

from ... import budgets
from .stream import Turn
from .upstream import server_name

if TYPE_CHECKING:
    import openai


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
        self.told_over_max = False

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
        if turn.over_max_usage is not None and not self.told_over_max:
            self.told_over_max = True
            await self.run.custom(
                "usage_over_max",
                {
                    "server": self.server,
                    "message": budgets.over_max_message(
                        f"the model server at {self.server}", turn.over_max_usage
                    ),
                },
            )
        # No total is over 2**53 either: what is over it is as much as a count can say.
        totals = {
            kind: min((self.totals or {}).get(kind, 0) + count, budgets.MAX_TOKENS)
            for kind, count in counts.items()
        }
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
        import openai  # not at the top: see OpenAIAgent.__call__

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
        answer: Any = await self.client.post(  # JSON: a wrong shape is caught by the caller
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
