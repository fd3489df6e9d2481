"""Token budgets, as the engine keeps them: per run, and per owner over a sliding day.

Per owner, the tokens of each of their runs of the last day as the store has
them (``_day_tokens``, written on the event loop only). A run this server
executes counts with its live total instead of its stored one, decided when
the sum is made: nothing is counted twice. The arithmetic is ``budgets``'.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .. import budgets
from ..budgets import Overspent
from ..errors import ErrorCode, Problem
from ..executor import FinishedRun
from ..reader import Reader
from ..settings import Settings
from ..store import StoreConnection


class TokenBudgets:
    """``max_tokens_per_run`` and ``tokens_per_user_per_day`` for the runs of this server."""

    def __init__(
        self, settings: Settings, reader: Reader, live: Callable[[], dict[str, tuple[str, int]]]
    ):
        self._settings = settings
        self._reader = reader
        self._live = live  # the runs this server executes, by id: (owner, tokens)
        self._day_tokens: dict[str, dict[str, int]] = {}

    def check_day(self, conn: StoreConnection, owner: str, now: float) -> list[tuple]:
        """429 ``token_budget_exhausted`` once the owner's runs of the last day used their budget.

        Called in the writer's transaction of a submit; returns the window's
        rows, which the caller files on the loop (``file``).
        """
        limit = self._settings.tokens_per_user_per_day
        if not limit:
            return []
        rows = conn.usage_since(owner, budgets.day_start(now))
        used = sum(row[2] + row[3] for row in rows)
        if used >= limit:
            wait = budgets.retry_after(rows, limit, now)
            raise Problem(
                ErrorCode.TOKEN_BUDGET_EXHAUSTED,
                f"Your runs of the last 24 hours used {used} tokens, the most allowed is {limit} "
                f"(tokens_per_user_per_day); the window frees up in {wait} s.",
                retry_after=wait,
            )
        return rows

    def file(self, owner: str, rows: list[tuple]) -> None:
        """Keep the owner's day as ``check_day`` read it."""
        if rows:
            self._day_tokens[owner] = {row[0]: row[2] + row[3] for row in rows}

    def used_today(self, owner: str) -> int:
        live = {run_id: t for run_id, (o, t) in self._live().items() if o == owner}
        stored = self._day_tokens.get(owner, {})
        return sum(t for run_id, t in stored.items() if run_id not in live) + sum(live.values())

    def check_usage(self, owner: str, tokens: int, allowed: dict[str, int]) -> Overspent | None:
        """At each usage event of a run here, with its owner, ``tokens`` so far and the tokens a
        person allowed it beyond its budgets (``budgets.allowed``): the budget it is over, or None."""
        asks = self._settings.budget_exceeded == "ask"
        per_run = self._settings.max_tokens_per_run
        if per_run:
            limit = per_run + allowed.get("run", 0)
            if tokens > limit:
                return Overspent(
                    "run",
                    f"the run used {tokens} tokens, over max_tokens_per_run ({limit})",
                    tokens,
                    limit,
                    tokens - limit + per_run if asks else 0,
                )
        per_day = self._settings.tokens_per_user_per_day
        if per_day:
            used = self.used_today(owner)
            limit = per_day + allowed.get("day", 0)
            if used > limit:
                return Overspent(
                    "day",
                    f"your runs of the last 24 hours used {used} tokens, "
                    f"over tokens_per_user_per_day ({limit})",
                    used,
                    limit,
                    used - limit + max(1, per_day // 10) if asks else 0,
                )
        return None

    def run_finished(self, run: FinishedRun) -> None:
        """A run here ended: no longer counted from memory, its last total joins the stored day."""
        if run.owner in self._day_tokens:
            self._day_tokens[run.owner][run.run_id] = run.tokens

    async def load(self, owners: set[str]) -> None:
        """Read the owners' runs of the last day from the store (other servers' runs included)."""
        if not self._settings.tokens_per_user_per_day or not owners:
            return
        since = budgets.day_start(time.time())

        def read(conn: StoreConnection) -> dict[str, dict[str, int]]:
            return {
                owner: {row[0]: row[2] + row[3] for row in conn.usage_since(owner, since)}
                for owner in owners
            }

        self._day_tokens.update(await self._reader.run(read))

    async def refresh(self) -> None:
        """Reread the day of every owner with a live run: other servers' runs, runs leaving the window."""
        owners = {owner for owner, _ in self._live().values()}
        for owner in set(self._day_tokens) - owners:
            del self._day_tokens[owner]
        await self.load(owners)
