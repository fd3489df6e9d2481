"""Tools the tests register with ``c.OpenAIAgent.tools``."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Literal

import rawdb

from jupyter_agentruns.agents.tools import tool

calls: list[tuple[str, dict]] = []


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first one
        b: the second one
    """
    calls.append(("add", {"a": a, "b": b, "thread": threading.current_thread().name}))
    return a + b


async def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict:
    """The current weather in a city.

    Made-up data: the tests need the same answer every time.
    """
    await asyncio.sleep(0)
    calls.append(("get_weather", {"city": city, "unit": unit}))
    return {"city": city, "temperature": 21 if unit == "celsius" else 70, "unit": unit}


def broken(city: str) -> str:
    """Always fails."""
    raise LookupError(f"no weather station in {city}")


@tool(description="Count the tool.started events committed to the test database.",
      schema={"type": "object", "properties": {}})  # fmt: skip
def committed_tool_calls():
    db = rawdb.connect(os.environ["AGENTRUNS_TEST_DB"])
    try:
        return db.execute("SELECT count(*) FROM events WHERE type = 'tool.started'").fetchone()[0]
    finally:
        db.close()


TEST_TOOLS = {
    name: f"tools_for_tests:{name}"
    for name in ("add", "get_weather", "broken", "committed_tool_calls")
}


def slow_note(text: str) -> str:
    """Write a note somewhere (slowly): not idempotent, a second call writes it twice.

    It takes ``AGENTRUNS_TEST_NOTE_SECONDS`` (30 by default), then adds a line to the
    file ``AGENTRUNS_TEST_NOTES`` when that is set."""
    import time

    time.sleep(float(os.environ.get("AGENTRUNS_TEST_NOTE_SECONDS", "30")))
    notes = os.environ.get("AGENTRUNS_TEST_NOTES")
    if notes:
        with open(notes, "a") as file:
            file.write(text + "\n")
    return f"noted: {text}"


@tool(idempotent=True)
def lookup(key: str) -> str:
    """Look a key up (slowly): idempotent, asking twice does no harm."""
    import time

    time.sleep(float(os.environ.get("AGENTRUNS_TEST_LOOKUP_SECONDS", "0")))
    return f"value of {key}"
