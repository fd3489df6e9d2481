"""What the command line prints for people: tables, ages, durations, one line per event.

Pure functions of run objects and events (as the API answers them), so the
commands stay a few lines each and what they print is tested without a server.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

TEXT_PREVIEW = 300
FIELD_PREVIEW = 60


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def span(seconds: float) -> str:
    """``0.4s``, ``12s``, ``3m``, ``5h``, ``2d``: short enough for a table column."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m"
    if seconds < 86400:
        return f"{seconds // 3600:.0f}h"
    return f"{seconds // 86400:.0f}d"


def age(value: str | None, now: datetime | None = None) -> str:
    """``3m ago`` for an ISO timestamp (``-`` when there is none)."""
    when = parse_time(value)
    if when is None:
        return "-"
    now = now or datetime.now(timezone.utc)
    seconds = (now - when).total_seconds()
    return "just now" if seconds < 1 else f"{span(seconds)} ago"


def duration(run: dict[str, Any], now: datetime | None = None) -> str:
    """How long the run ran: to its end, or so far (``-`` before it started)."""
    started = parse_time(run.get("started_at"))
    if started is None:
        return "-"
    ended = parse_time(run.get("finished_at")) or now or datetime.now(timezone.utc)
    return span(max(0.0, (ended - started).total_seconds()))


def tokens(run: dict[str, Any]) -> str:
    """Input + output tokens of the run's last ``usage`` (``-`` when it reported none)."""
    usage = (run.get("snapshot") or {}).get("usage")
    if not usage:
        return "-"
    return f"{(usage.get('input_tokens') or 0) + (usage.get('output_tokens') or 0):,}"


def short(text: Any, limit: int = FIELD_PREVIEW) -> str:
    """One line of at most ``limit`` characters (a newline shows as ``⏎``)."""
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    text = text.replace("\n", "⏎")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned on the widest cell; the last column is not padded."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def runs_table(runs: list[dict[str, Any]], now: datetime | None = None) -> str:
    headers = ("RUN", "STATUS", "AGENT", "SESSION", "AGE", "DURATION", "TOKENS")
    rows = [
        (
            run["run_id"],
            run["status"],
            run["agent"],
            short(run.get("session") or "-", 40),
            age(run.get("created_at"), now),
            duration(run, now),
            tokens(run),
        )
        for run in runs
    ]
    return table(headers, rows)


def open_inputs(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The questions of the run that wait for a person's answer."""
    inputs = (run.get("snapshot") or {}).get("inputs") or []
    return [request for request in inputs if request.get("status") == "open"]


def run_details(run: dict[str, Any], now: datetime | None = None) -> str:
    """What ``show`` prints: state, timing, what the run did, its usage, its open questions."""
    snapshot = run.get("snapshot") or {}
    lines = [f"{run['run_id']}  {run['status']}  ({run['agent']})"]

    def field(name: str, value: Any) -> None:
        lines.append(f"  {name:<10}{value}")

    if run.get("session"):
        field("session", run["session"])
    field("created", f"{run.get('created_at')} ({age(run.get('created_at'), now)})")
    if run.get("started_at"):
        field("started", run["started_at"])
    if run.get("finished_at"):
        field("finished", run["finished_at"])
    field("duration", duration(run, now))
    field("attempt", run.get("attempt", 1))
    field("events", f"{run.get('first_seq', 1)}..{run.get('last_seq', 0)} kept")
    if run.get("retry_of"):
        field("retry of", run["retry_of"])
    progress = snapshot.get("progress")
    if progress and progress.get("message"):
        fraction = progress.get("fraction")
        percent = f" {fraction:.0%}" if isinstance(fraction, (int, float)) else ""
        field("progress", f"{short(progress['message'])}{percent}")
    for tool in snapshot.get("tools") or []:
        field("tool", f"{tool['name']} {short(tool.get('args'), 40)} → {tool.get('status')}")
    messages = snapshot.get("messages") or []
    text = "".join(message.get("text", "") for message in messages)
    field("messages", f"{len(messages)}, {len(text):,} characters")
    if text:
        preview = text if len(text) <= TEXT_PREVIEW else text[:TEXT_PREVIEW] + "…"
        lines.extend("    " + line for line in preview.splitlines())
    usage = snapshot.get("usage")
    if usage:
        field(
            "usage",
            f"{usage.get('input_tokens', 0):,} input, {usage.get('output_tokens', 0):,} output tokens",
        )
    if run.get("error"):
        field("error", f"{run['error'].get('type')}: {short(run['error'].get('message'), 200)}")
    if run.get("cancel"):
        field("cancel", short(run["cancel"].get("reason") or "no reason given", 200))
    for request in open_inputs(run):
        field(
            "asks",
            f"{request['request_id']}: {short(request.get('title') or '')} "
            f"[{' | '.join(request.get('choices') or [])}]",
        )
    return "\n".join(lines)


def event_line(event: dict[str, Any]) -> str:
    """One short line for an event that is not a text delta."""
    data = event.get("data") or {}
    kind = event["type"]
    detail = {
        "message.started": lambda: data.get("role", ""),
        "tool.started": lambda: f"{data.get('name')} {short(data.get('args'), 50)}",
        "tool.completed": lambda: "ok" if data.get("ok") else f"error {short(data.get('error'))}",
        "progress": lambda: short(data.get("message") or ""),
        "usage": lambda: (
            f"{data.get('input_tokens', 0):,} in, {data.get('output_tokens', 0):,} out"
        ),
        "input.requested": lambda: (
            f"{data.get('request_id')}: {short(data.get('title') or '')} "
            f"[{' | '.join(data.get('choices') or [])}]"
        ),
        "input.resolved": lambda: f"{data.get('request_id')} → {data.get('choice')}",
        "run.resumed": lambda: f"attempt {data.get('attempt')} ({data.get('reason')})",
        "run.failed": lambda: short(
            f"{(data.get('error') or {}).get('type')}: {(data.get('error') or {}).get('message')}",
            200,
        ),
        "run.cancelled": lambda: short(data.get("reason") or "", 200),
        "run.cancel_requested": lambda: short(data.get("reason") or "", 200),
        "run.interrupted": lambda: str(data.get("reason") or ""),
    }.get(kind, lambda: "")()
    return f"[{event['seq']}] {kind}{' ' + detail if detail else ''}"


def usage_line(usage: dict[str, Any]) -> str:
    hours = usage.get("window_seconds", 86400) / 3600
    return (
        f"last {hours:g} h: {usage.get('runs', 0):,} runs, "
        f"{usage.get('input_tokens', 0):,} input tokens, "
        f"{usage.get('output_tokens', 0):,} output tokens"
    )
