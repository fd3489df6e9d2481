"""A hand-written agent: the weather in a few cities, and a cold-weather alert.

No model and no network, so it runs anywhere; it shows what every agent does
with ``run``: tool calls, streamed text, progress, durability before a side
effect, and cancellation. Register it (with this folder on ``PYTHONPATH``)::

    c.AgentRuns.agents = {"weather": "weather_agent:weather"}

``get_weather`` is also a tool for the built-in ``openai`` agent::

    c.OpenAIAgent.tools = {"get_weather": "weather_agent:get_weather"}
"""

from __future__ import annotations

import asyncio
import json
import os
import zlib
from typing import Literal

from jupyter_agentruns import agent

SKIES = ["sunny", "cloudy", "rainy", "snowy", "windy"]


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict:
    """The current weather in a city.

    Made-up but stable: the same city always gets the same weather.

    Args:
        city: the city's name, e.g. "Shanghai"
        unit: the temperature's unit
    """
    seed = zlib.crc32(city.strip().lower().encode())
    celsius = seed % 40 - 10
    temperature = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32)
    return {"city": city, "temperature": temperature, "unit": unit, "sky": SKIES[seed % len(SKIES)]}


def send_alert(cities: list[str], below: float) -> str:
    """The side effect that must never happen twice by accident (a file stands in for a pager)."""
    with open(os.environ.get("WEATHER_ALERTS_FILE", "weather_alerts.jsonl"), "a") as alerts:
        alerts.write(json.dumps({"cold": cities, "below": below}) + "\n")
    return f"alert sent for {', '.join(cities)}"


@agent(
    description="The weather in a few cities (made-up data), with an alert when one is cold.",
    input_schema={
        "type": "object",
        "properties": {
            "cities": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 20},
            "alert_below": {
                "type": "number",
                "description": "Send an alert for cities colder than this (°C).",
            },
            "delay": {"type": "number", "minimum": 0, "maximum": 5, "default": 0.5},
        },
        "required": ["cities"],
        "additionalProperties": False,
    },
)
async def weather(run, input: dict) -> dict:
    cities = input["cities"]
    delay = input.get("delay", 0.5)
    reports = []
    for done, city in enumerate(cities):
        await run.progress(done / len(cities), f"asking about {city}")
        # tool.started now, tool.completed with call.result when the block ends
        # (or ok=false with the error if it raises).
        async with run.tool("get_weather", {"city": city}) as call:
            # A cancel raises CancelledError at an await like this one: the
            # block ends without tool.completed and the run ends `cancelled`,
            # its stage saying "tool get_weather running".
            await asyncio.sleep(delay)  # a slow weather service
            call.result = get_weather(city)
        reports.append(call.result)

    await run.message_started()
    for report in reports:
        await run.text(f"{report['city']}: {report['temperature']} °C, {report['sky']}.\n")
    await run.message_completed()

    alerted = None
    below = input.get("alert_below")
    cold = [
        report["city"] for report in reports if below is not None and report["temperature"] < below
    ]
    if cold:
        async with run.tool("send_alert", {"cities": cold, "below": below}) as call:
            # Durability before the side effect: once this returns, the log
            # holds everything up to `tool.started send_alert`. If the server
            # dies after the alert left, the run ends `interrupted` and its log
            # shows the alert was (maybe) sent; the run is never re-executed.
            await run.durable()
            call.result = alerted = await asyncio.to_thread(send_alert, cold, below)
    await run.progress(1.0, "done")
    return {"reports": reports, "alert": alerted}
