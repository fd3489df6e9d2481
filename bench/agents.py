"""Agents the bench registers with ``c.AgentRuns.agents`` (they run inside the server).

They coordinate with the bench through files, never through the server: a
``go`` file they wait for before emitting (so clients can connect first) and a
``report`` file where they write their own timing (so waiting for a run costs
the server nothing).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from jupyter_agentruns import agent

PAD = "x" * 4096
DELTA_SIZE = 100


def delta(size: int) -> str:
    """A text delta of ``size`` characters that starts with its emit time (``time.time_ns()``)."""
    stamp = str(time.time_ns())
    return stamp + PAD[: size - len(stamp)]


async def wait_for_file(path: str | None) -> None:
    while path and not os.path.exists(path):
        await asyncio.sleep(0.002)


def write_report(path: str | None, report: dict) -> None:
    if path:
        with open(path + ".tmp", "w") as file:
            json.dump(report, file)
        os.replace(path + ".tmp", path)


@agent(description="Bench: text deltas as fast as it can, or at a given rate.")
async def flood(run, input: dict) -> dict:
    """Emit ``events`` deltas of ``size`` characters (100), a new message every ``per_message``.

    ``rate`` (events/s) paces them; ``max_seconds`` stops early; ``custom``
    emits ``x.delta`` events (the reducer ignores them) instead of ``text.delta``.
    """
    events = input["events"]
    rate = input.get("rate")
    per_message = input.get("per_message") or events
    max_seconds = input.get("max_seconds")
    custom = input.get("custom", False)
    size = input.get("size", DELTA_SIZE)
    await wait_for_file(input.get("go"))
    start_wall, start = time.time(), time.perf_counter()
    message = None
    emitted = 0
    for index in range(events):
        if index % per_message == 0:
            if message is not None:
                await run.message_completed(message)
            message = await run.message_started()
        if rate:
            wait = start + index / rate - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
        if custom:
            await run.custom("delta", {"message_id": message, "delta": delta(size)})
        else:
            await run.text(delta(size), message)
        emitted += 1
        if max_seconds and index % 256 == 0 and time.perf_counter() - start > max_seconds:
            break
    if message is not None:
        await run.message_completed(message)
    emit_seconds = time.perf_counter() - start
    await run.durable()
    report = {
        "events": emitted,
        "start": start_wall,
        "end": time.time(),
        "seconds": time.perf_counter() - start,
        "emit_seconds": emit_seconds,
    }
    write_report(input.get("report"), report)
    return report


@agent(description="Bench: one event, then nothing until cancelled (for idle streams).")
async def idle(run, input: dict) -> dict:
    await run.progress(0.0, "waiting")
    await asyncio.sleep(input.get("seconds", 3600))
    return {}


@agent(description="Bench: inserts cells at the end of its notebook, one after another.")
async def cell_writer(run, input):
    """``input["cells"]`` cells ``# bench cell N`` through the notebook tools; the report has
    when each was asked for (``time.time()``, before its call) and what failed."""
    tools = run.notebook_tools
    if tools is None:
        raise RuntimeError(
            "cell_writer needs the run's notebook tools (a notebook and a kernel id)"
        )
    asked, failed = [], []
    for number in range(input["cells"]):
        asked.append(time.time())
        outcome = await tools.call(
            "insert_cell", {"source": f"# bench cell {number}", "after": "end"}
        )
        if not outcome.ok:
            failed.append(outcome.text)
    write_report(input.get("report"), {"asked": asked, "failed": failed})
    return {"inserted": input["cells"] - len(failed)}
