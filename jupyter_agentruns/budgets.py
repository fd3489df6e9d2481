"""Token budgets: a run's limit, and an owner's over a sliding day (docs/how-to/budgets-and-quotas.md).

Plain functions over a run's usage totals and an owner's runs of the last
day; the engine reads those from the store and keeps live runs' totals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .timeutil import iso

DAY_SECONDS = 86400


# The largest token count a usage event may carry: every JSON reader (a
# browser's included) reads integers up to it exactly, and the store's
# 64-bit columns hold any sum of them.
MAX_TOKENS = 2**53


# The kind of the question a run over a budget asks (budget_exceeded = "ask"):
# the server's own, which agents cannot ask.
BUDGET_KIND = "budget"
APPROVE = "approve"


@dataclass(frozen=True)
class Overspent:
    """A budget a run's usage went over, and what a person may allow it.

    ``budget``: "run" (``max_tokens_per_run``) or "day" (``tokens_per_user_per_day``);
    ``used`` and ``limit`` as that budget counts them, the limit raised by what
    was allowed so far. ``more``: the tokens a budget question offers, so that
    approving it lets the run go on by another step of that budget (a run's
    whole budget; a tenth of the day's); 0 when the run fails at once
    (``budget_exceeded = "fail"``).
    """

    budget: str
    message: str
    used: int
    limit: int
    more: int

    def question(self) -> dict[str, Any]:
        """The budget question's title and details."""
        setting = "max_tokens_per_run" if self.budget == "run" else "tokens_per_user_per_day"
        whose = "the run" if self.budget == "run" else "your runs of the last 24 hours"
        return {
            "title": f"Allow {self.more} more tokens? {whose.capitalize()} used {self.used}, "
            f"over the limit of {self.limit} ({setting}).",
            "details": {
                "budget": self.budget,
                "used": self.used,
                "limit": self.limit,
                "more": self.more,
                "message": self.message,
            },
        }


def allowed(snapshot: dict[str, Any]) -> dict[str, int]:
    """The tokens a person allowed a run beyond its budgets, by budget, from its approved budget questions."""
    more = {"run": 0, "day": 0}
    for request in snapshot.get("inputs", ()):
        details = request.get("details")
        if (
            request.get("kind") == BUDGET_KIND
            and request.get("choice") == APPROVE
            and isinstance(details, dict)
            and details.get("budget") in more
            and isinstance(details.get("more"), int)
        ):
            more[details["budget"]] += details["more"]
    return more


def usage_problem(usage: Any) -> str | None:
    """What is wrong with a usage event's data, or None: counts are integers 0 … 2^53, cost finite."""
    if not isinstance(usage, dict):
        return f"usage is an object of token counts, not {type(usage).__name__}"
    for name in ("input_tokens", "output_tokens"):
        value = usage.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
            return f"usage's {name} must be an integer from 0 to 2**53, not {value!r:.40}"
    cost = usage.get("cost")
    if cost is not None and (
        isinstance(cost, bool)
        or not isinstance(cost, (int, float))
        or not math.isfinite(cost)
        or not 0 <= cost <= MAX_TOKENS
    ):
        return f"usage's cost must be a number from 0 to 2**53, not {cost!r:.40}"
    return None


def reported_count(value: Any) -> int | None:
    """A token count reported from outside (a model server, an ACP agent), or None when it cannot be one.

    Negative, fractional or not a number: None. A number above 2**53 (``1e20``)
    is counted as 2**53, the most a count can be: over any token budget, so
    ``max_tokens_per_run`` stops the run; the agent says so in the run's log
    (``over_max``).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value > MAX_TOKENS:
        return MAX_TOKENS
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if value >= 0 else None


def over_max(value: Any) -> bool:
    """Whether a reported count is a number above 2**53 (counted as 2**53)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > MAX_TOKENS


def over_max_message(source: str, reported: str) -> str:
    """What a run's log says of counts above 2**53 that ``source`` reported."""
    return (
        f"usage reported by {source} is over 2**53 tokens ({reported}): counted as 2**53, "
        "over any token budget"
    )


def tokens(usage: dict[str, Any]) -> tuple[int, int]:
    """``(input_tokens, output_tokens)`` of a usage event's data; what is not a count is 0."""
    return _count(usage.get("input_tokens")), _count(usage.get("output_tokens"))


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0
    return max(0, int(value))


def day_start(now: float) -> str:
    """The window's start, comparable with ``created_at`` as text."""
    return iso(now - DAY_SECONDS)


def window_totals(rows: list[tuple[str, str, int, int]]) -> dict[str, int]:
    """``GET usage``'s answer from ``(run_id, created_at, input, output)`` rows of the window."""
    return {
        "window_seconds": DAY_SECONDS,
        "input_tokens": sum(row[2] for row in rows),
        "output_tokens": sum(row[3] for row in rows),
        "runs": len(rows),
    }


def retry_after(rows: list[tuple[str, str, int, int]], limit: int, now: float) -> int:
    """Seconds until enough of the window's oldest runs leave it that the owner is under ``limit``."""
    used = sum(row[2] + row[3] for row in rows)
    for _run_id, created_at, input_tokens, output_tokens in rows:  # oldest first
        used -= input_tokens + output_tokens
        if used < limit:
            created = datetime.fromisoformat(created_at.replace("Z", "+00:00")).timestamp()
            return max(1, math.ceil(created + DAY_SECONDS - now))
    return DAY_SECONDS
