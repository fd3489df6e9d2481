"""``runs()`` in a notebook: still a list of run objects for code, a table for a person.

The table is plain HTML with inline styles (a notebook output carries no
stylesheet of ours), every value escaped: run inputs and notebook paths are
the user's text.
"""

from __future__ import annotations

import html
import math
from datetime import datetime, timezone
from typing import Any

from .. import words
from ..words import parse_time

STATUS_COLOURS = {
    "queued": "#616161",
    "running": "#1976d2",
    "waiting": "#f57c00",
    "cancelling": "#f57c00",
    "succeeded": "#388e3c",
    "failed": "#d32f2f",
    "cancelled": "#f57c00",
    "interrupted": "#f57c00",
}


# The largest integer every JSON reader (a browser's included) reads exactly.
MAX_COUNT = 2**53 - 1


def token_count(value: Any) -> int | None:
    """A usage count as the run reported it; None when it is no count (text, negative, fractional, absurd)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value) if 0 <= value <= MAX_COUNT else None


def ago(then: datetime, now: datetime) -> str:
    """'just now', '3 min ago', '5 h ago', '2 days ago'."""
    seconds = int((now - then).total_seconds())
    if seconds < 10:
        return "just now"
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 48 * 3600:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} days ago"


def tokens(run: dict[str, Any]) -> str:
    """Input + output tokens of the run's last usage; ``?`` when the run reported no counts."""
    snapshot = run.get("snapshot")
    usage = snapshot.get("usage") if isinstance(snapshot, dict) else None
    if not isinstance(usage, dict):
        return ""
    counts = [token_count(usage.get(name) or 0) for name in ("input_tokens", "output_tokens")]
    total = None if None in counts else sum(counts)  # type: ignore[arg-type]
    text = f"{'≈ ' if usage.get('estimated') else ''}{'?' if total is None else f'{total:,}'}"
    cost = usage.get("cost")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and 0 <= cost < math.inf:
        text += f" · cost {cost:.2f}" if cost >= 0.01 else f" · cost {cost:.2g}"
    return text


class RunList(list):
    """The runs ``runs()`` found, newest first: a list of run objects, shown as a table."""

    def __init__(self, runs: list[dict[str, Any]], next_cursor: str | None = None):
        super().__init__(runs)
        self.next = next_cursor  # more runs after these: runs(before=...)

    def _repr_html_(self, now: datetime | None = None) -> str:
        now = now or datetime.now(timezone.utc)
        if not self:
            return "<p><em>No agent runs.</em></p>"
        cell = 'style="text-align:left;padding:2px 8px;white-space:nowrap"'
        head = "".join(
            f"<th {cell}>{name}</th>"
            for name in ("status", "title", "run", "agent", "notebook", "created", "time", "tokens")
        )
        rows = "".join(self._row(run, now, cell) for run in self)
        more = (
            f"<p><em>More runs: runs(before={html.escape(repr(self.next))})</em></p>"
            if self.next
            else ""
        )
        return f'<table class="agentruns-runs"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{more}'

    @staticmethod
    def _row(run: dict[str, Any], now: datetime, cell: str) -> str:
        status = str(run.get("status", ""))
        colour = STATUS_COLOURS.get(status, "#616161")
        chip = (
            f'<span style="color:{colour};border:1px solid {colour};border-radius:9px;'
            f'padding:0 7px;font-size:85%">{html.escape(status)}</span>'
        )
        created = parse_time(run.get("created_at"))
        values = [
            html.escape(words.title(run)),
            html.escape(str(run.get("run_id", ""))),
            html.escape(str(run.get("agent", ""))),
            html.escape(str(run.get("session") or "")),
            ago(created, now) if created else "",
            html.escape(words.timing(run, now)),
            html.escape(tokens(run)),
        ]
        cells = f"<td {cell}>{chip}</td>" + "".join(
            f"<td {cell}><code>{value}</code></td>" if index == 1 else f"<td {cell}>{value}</td>"
            for index, value in enumerate(values)
        )
        return f"<tr>{cells}</tr>"
