"""What the command line prints for people: tables, ages, durations, one line per event.

Pure functions of run objects and events (as the API answers them), so the
commands stay a few lines each and what they print is tested without a server.

Everything in a run is what an agent or a model wrote, or may be: a field
may have any JSON type, and text may hold what a terminal acts on rather
than shows. ``ESC ] 52`` writes the clipboard, ``ESC [ 1A`` rewrites a line
already printed, a bidirectional override makes text read in another order
than it runs. Every value is printed through ``printable`` or ``one_line``,
which show those characters as escapes (``\\x1b``); JSON goes through
``json_text``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from .. import words
from ..kernel.runtable import token_count
from ..questions import option_names
from ..words import parse_time

TEXT_PREVIEW = 300
FIELD_PREVIEW = 60
TITLE_COLUMN = 40
INPUT_PREVIEW = 1000

# C0 controls, DEL, C1 controls (U+009B is a CSI of its own), and the
# bidirectional embeddings, overrides and isolates.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# What JSON itself leaves unescaped of those: it escapes C0 already.
JSON_UNSAFE = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return NAMED.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def printable(text: str) -> str:
    """Text of several lines as a terminal should show it: lines and tabs kept, other controls escaped."""
    return "\n".join(
        CONTROL.sub(lambda m: m.group() if m.group() == "\t" else _escape(m), line)
        for line in text.replace("\r\n", "\n").split("\n")
    )


def one_line(value: Any) -> str:
    """Any value as one line of text: JSON unless a string, a newline as ``⏎``, controls escaped."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return CONTROL.sub(_escape, text.replace("\r\n", "\n").replace("\n", "⏎"))


def json_text(value: Any, **options: Any) -> str:
    """``json.dumps`` with text as text (not ``\\u`` escapes), except what a terminal acts on."""
    text = json.dumps(value, ensure_ascii=False, **options)
    return JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def mapping(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one: a field of the wrong type shows as absent."""
    return value if isinstance(value, dict) else {}


def items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def count(value: Any) -> str:
    """A count, ``1,234`` (none reported is 0); ``?`` when it is no count (text, a negative or absurd number)."""
    number = token_count(0 if value is None else value)
    return "?" if number is None else f"{number:,}"


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


def age(value: Any, now: datetime | None = None) -> str:
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


def timing(run: dict[str, Any], now: datetime | None = None) -> str:
    """How long the run ran, in words: ``took 2.0s``, ``waiting for an answer``, ``never started``."""
    return words.timing(run, now or datetime.now(timezone.utc), span)


def tokens(run: dict[str, Any]) -> str:
    """Input + output tokens of the run's last ``usage`` (``-`` when it reported none, ``?`` when not counts)."""
    usage = mapping(mapping(run.get("snapshot")).get("usage"))
    if not usage:
        return "-"
    counts = [token_count(usage.get(name) or 0) for name in ("input_tokens", "output_tokens")]
    return "?" if None in counts else f"{sum(counts):,}"  # type: ignore[arg-type]


def short(text: Any, limit: int = FIELD_PREVIEW) -> str:
    """One line of at most ``limit`` characters (a newline shows as ``⏎``)."""
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned on the widest cell; the last column is not padded."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def runs_table(runs: list[Any], now: datetime | None = None) -> str:
    headers = ("RUN", "STATUS", "AGENT", "SESSION", "AGE", "DURATION", "TOKENS", "TITLE")
    rows = [
        (
            one_line(run.get("run_id")),
            one_line(run.get("status")),
            short(run.get("agent"), 40),
            short(run.get("session") or "-", 40),
            age(run.get("created_at"), now),
            duration(run, now) if run.get("started_at") else _not_started(run),
            tokens(run),
            short(words.title(run), TITLE_COLUMN),
        )
        for run in map(mapping, runs)
    ]
    return table(headers, rows)


def conversations_table(conversations: list[Any], now: datetime | None = None) -> str:
    """What ``conversations`` prints: one line each, the newest first."""
    headers = ("SESSION", "AGENT", "RUNS", "UPDATED", "LAST RUN", "TITLE")
    rows = [
        (
            short(conversation.get("session"), 40),
            short(conversation.get("agent"), 40),
            one_line(conversation.get("runs")),
            age(conversation.get("updated_at"), now),
            one_line(conversation.get("last_run_id")),
            short(conversation.get("title"), TITLE_COLUMN),
        )
        for conversation in map(mapping, conversations)
    ]
    return table(headers, rows)


def schedules_table(schedules: list[Any]) -> str:
    """What ``schedules`` prints: one line each, the oldest first; times in UTC."""
    headers = ("SCHEDULE", "AGENT", "CRON", "TIMEZONE", "NEXT (UTC)", "LAST RUNS", "SKIPPED")
    rows = []
    for schedule in map(mapping, schedules):
        runs = [mapping(run) for run in items(schedule.get("last_runs"))]
        last = ", ".join(one_line(run.get("status")) for run in runs[:3]) or "-"
        next_at = (
            "paused" if schedule.get("paused") is True else one_line(schedule.get("next_at") or "-")
        )
        rows.append(
            (
                one_line(schedule.get("schedule_id")),
                short(schedule.get("agent"), 40),
                short(schedule.get("cron"), 40),
                short(schedule.get("timezone"), 40),
                next_at.replace("T", " ").removesuffix("Z"),
                last,
                count(schedule.get("skipped")),
            )
        )
    return table(headers, rows)


def _not_started(run: dict[str, Any]) -> str:
    return "never started" if words.ended(run.get("status")) else "-"


def choices(request: dict[str, Any]) -> str:
    """What a question offers: its choices, a permission's as ``name (id)``."""
    names = option_names(request)
    shown = []
    for choice in items(request.get("choices")):
        name = names.get(choice) if isinstance(choice, str) else None
        shown.append(f"{short(name, 40)} ({short(choice, 40)})" if name else short(choice, 40))
    return " | ".join(shown)


def progress_text(status: Any, progress: Any) -> str:
    """A live run's progress (``searching 40%``); empty once the run ended."""
    return short(words.progress(status, progress))


def message_text(messages: Any) -> str:
    """The text of the snapshot's messages, as the run wrote it."""
    texts = (mapping(message).get("text") for message in items(messages))
    return "".join(text for text in texts if isinstance(text, str))


def error_text(error: Any) -> str:
    error = mapping(error)
    return short(f"{one_line(error.get('type'))}: {one_line(error.get('message'))}", 200)


def run_details(run: dict[str, Any], now: datetime | None = None) -> str:
    """What ``show`` prints: title, state, timing, input, what the run did, its usage, its
    questions (those still open, and those answered with their answers)."""
    snapshot = mapping(run.get("snapshot"))
    lines = [
        f"{one_line(run.get('run_id'))}  {one_line(run.get('status'))}  ({short(run.get('agent'))})",
        f"  {short(words.title(run), 200)}",
    ]

    def field(name: str, value: str) -> None:
        lines.append(f"  {name:<10}{value}")

    if run.get("session"):
        field("session", short(run["session"], 200))
    field("created", f"{one_line(run.get('created_at'))} ({age(run.get('created_at'), now)})")
    if run.get("started_at"):
        field("started", one_line(run["started_at"]))
    if run.get("finished_at"):
        field("finished", one_line(run["finished_at"]))
    field("duration", timing(run, now))
    field("attempt", one_line(run.get("attempt", 1)))
    field("events", f"{one_line(run.get('first_seq', 1))}..{one_line(run.get('last_seq', 0))} kept")
    if run.get("retry_of"):
        field("retry of", one_line(run["retry_of"]))
    forked = run.get("forked_from")
    if isinstance(forked, dict):
        field(
            "forked from",
            f"{one_line(forked.get('run_id'))} after event {one_line(forked.get('seq'))}",
        )
    if run.get("input") is not None:
        field("input", short(run["input"], INPUT_PREVIEW))
    if progress := progress_text(run.get("status"), snapshot.get("progress")):
        field("progress", progress)
    for tool in map(mapping, items(snapshot.get("tools"))):
        field(
            "tool",
            f"{short(tool.get('name'), 40)} {short(tool.get('args'), 40)} → {short(tool.get('status'), 20)}",
        )
    messages = items(snapshot.get("messages"))
    text = message_text(messages)
    field("messages", f"{len(messages)}, {len(text):,} characters")
    if text:
        preview = text if len(text) <= TEXT_PREVIEW else text[:TEXT_PREVIEW] + "…"
        lines.extend("    " + line for line in printable(preview).splitlines())
    usage = snapshot.get("usage")
    if usage:
        usage = mapping(usage)
        field(
            "usage",
            f"{count(usage.get('input_tokens', 0))} input, "
            f"{count(usage.get('output_tokens', 0))} output tokens",
        )
    if run.get("error"):
        field("error", error_text(run["error"]))
    if run.get("cancel"):
        field("cancel", short(words.cancelled(mapping(run["cancel"]).get("reason")), 200))
    for request in map(mapping, items(snapshot.get("inputs"))):
        question = (
            f"{one_line(request.get('request_id'))}: {short(request.get('title') or '')} "
            f"[{choices(request)}]"
        )
        if request.get("status") == "open":
            field("asks", question)
        else:
            field("asked", f"{question} → {short(words.answer(request), 200)}")
    return "\n".join(lines)


def event_line(event: dict[str, Any]) -> str:
    """One short line for an event that is not a text delta."""
    data = mapping(event.get("data"))
    kind = event.get("type")
    detail = {
        "message.started": lambda: short(data.get("role", "")),
        "tool.started": lambda: f"{short(data.get('name'), 40)} {short(data.get('args'), 50)}",
        "tool.completed": lambda: "ok" if data.get("ok") else f"error {short(data.get('error'))}",
        "progress": lambda: short(data.get("message") or ""),
        "usage": lambda: (
            f"{count(data.get('input_tokens', 0))} in, {count(data.get('output_tokens', 0))} out"
        ),
        "input.requested": lambda: (
            f"{one_line(data.get('request_id'))}: {short(data.get('title') or '')} "
            f"[{choices(data)}]"
        ),
        "input.resolved": lambda: (
            f"{one_line(data.get('request_id'))} → {short(words.answer(data), 200)}"
        ),
        "run.resumed": lambda: (
            f"attempt {one_line(data.get('attempt'))} ({short(data.get('reason'))})"
        ),
        "run.failed": lambda: error_text(data.get("error")),
        "run.cancelled": lambda: short(data.get("reason") or "", 200),
        "run.cancel_requested": lambda: short(data.get("reason") or "", 200),
        "run.interrupted": lambda: short(data.get("reason") or "", 200),
    }.get(kind if isinstance(kind, str) else "", lambda: "")()
    return f"[{one_line(event.get('seq'))}] {one_line(kind)}{' ' + detail if detail else ''}"


def usage_line(usage: dict[str, Any]) -> str:
    window = token_count(usage.get("window_seconds", 86400))
    hours = "?" if window is None else f"{window / 3600:g}"
    return (
        f"last {hours} h: {count(usage.get('runs', 0))} runs, "
        f"{count(usage.get('input_tokens', 0))} input tokens, "
        f"{count(usage.get('output_tokens', 0))} output tokens"
    )
