"""Schedules: a run submitted at each time a cron expression names, in a time zone.

A schedule remembers the newest slot handled (``last_slot``). Every
``schedule_tick_seconds`` (and once at start-up) each server reads the
schedules of the owners it serves: one whose next slot has come is submitted
through ``Submissions.submit``, as its owner, with the Idempotency-Key
``schedule:<id>:<slot>``: however many servers share the store and see the
slot at once, it makes one run. Then the slot is recorded as handled, by
whichever server comes first (``advance_schedule`` checks the slot it read).
Slots missed while no server ran: the newest one runs, the older ones are
skipped and counted in the schedule's history (``skipped``, ``skips``).

Cron expressions are croniter's: five fields, or six with seconds last
(``*/10 * * * * *``: every ten seconds). Runs on the event loop, but for the
functions given to the writer (``in_transaction``) and the reader.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..agents import AgentSpec
from ..errors import ErrorCode, Problem, invalid_request
from ..reader import Reader
from ..store import StoreBusy, StoreConnection
from ..timeutil import now_iso
from ..writer import Writer, in_transaction
from .submissions import Submissions, SubmitRequest
from .upkeep import Upkeep

try:
    from croniter import croniter
except ImportError:  # the extra is not installed: schedules say how to get it
    croniter = None

CRON_MAX_CHARS = 200
# The most missed slots counted one by one; beyond, the newest is found at once.
MISSED_COUNTED = 1000
# The skips a schedule's history keeps, newest last.
SKIPS_KEPT = 20
# The runs listed with each schedule.
LAST_RUNS = 5
# The most schedules one owner has.
MAX_SCHEDULES_PER_OWNER = 100
FIELDS = ("agent", "input", "cron", "timezone", "session")


def schedule_not_found(schedule_id: str) -> Problem:
    return Problem(
        ErrorCode.SCHEDULE_NOT_FOUND,
        f"No schedule {schedule_id[:80]!r}; GET schedules lists yours.",
    )


def slot_iso(slot: datetime) -> str:
    """A slot as stored and keyed: UTC, to the second (``2026-12-07T09:00:00Z``)."""
    return slot.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_slot(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def cron_problem(cron: str) -> str | None:
    """Why ``cron`` is not a cron expression schedules take, or None."""
    assert croniter is not None  # the caller says when it is missing
    if len(cron) > CRON_MAX_CHARS:
        return f"is at most {CRON_MAX_CHARS} characters"
    fields = cron.split()
    if not cron.startswith("@") and len(fields) not in (5, 6):
        return (
            "has five fields (minute hour day-of-month month day-of-week), or six with "
            f"seconds last, not {len(fields)}"
        )
    if cron.strip() == "@reboot" or not croniter.is_valid(cron):
        return "is not a cron expression croniter reads"
    return None


def zone_problem(name: str) -> str | None:
    """Why ``name`` is not an IANA time zone (``Europe/Paris``, ``UTC``), or None."""
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return "is not an IANA time zone name such as 'UTC' or 'Europe/Paris'"
    return None


def next_slot(schedule: dict[str, Any], after: datetime) -> datetime:
    """The schedule's first slot after ``after``."""
    assert croniter is not None  # schedules exist only where croniter is installed
    start = after.astimezone(ZoneInfo(schedule["timezone"]))
    return croniter(schedule["cron"], start).get_next(datetime)


def due(
    schedule: dict[str, Any], now: datetime
) -> tuple[datetime, int, datetime | None, datetime | None] | None:
    """The slot to run now, how many older ones it skips, and the first and last of those.

    None when no slot came since the last one handled.
    """
    assert croniter is not None  # schedules exist only where croniter is installed
    zone = ZoneInfo(schedule["timezone"])
    slots = croniter(schedule["cron"], parse_slot(schedule["last_slot"]).astimezone(zone))
    first = slot = slots.get_next(datetime)
    if slot > now:
        return None
    previous: datetime | None = None
    count = 0
    while count < MISSED_COUNTED:
        following = slots.get_next(datetime)
        count += 1
        if following > now:
            skipped_last = previous
            return slot, count - 1, (first if count > 1 else None), skipped_last
        previous, slot = slot, following
    # More than MISSED_COUNTED slots missed: the newest is found from now.
    newest = croniter(schedule["cron"], now.astimezone(zone)).get_prev(datetime)
    before = croniter(schedule["cron"], newest).get_prev(datetime)
    return newest, count, first, before


class Schedules:
    """``schedules``: create, list, pause, delete; and the slots that came, submitted."""

    def __init__(
        self,
        *,
        writer: Writer,
        reader: Reader,
        submissions: Submissions,
        upkeep: Upkeep,
        agents: dict[str, AgentSpec],
        log: logging.Logger,
    ):
        self._writer = writer
        self._reader = reader
        self._submissions = submissions
        self._upkeep = upkeep
        self._agents = agents
        self._log = log

    # What the handlers ask ----------------------------------------------------

    async def create(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        agent, input = body["agent"], body["input"]
        spec = self._agents.get(agent)
        if spec is None:
            raise self._submissions.unknown_agent(agent)
        found = spec.input_problem(input)
        if found:
            raise Problem(ErrorCode.INVALID_INPUT, found[1], path=found[0])
        if croniter is None:
            raise invalid_request(
                "Schedules need the croniter package on the server: "
                "pip install 'jupyter-agentruns[schedules]', then restart it."
            )
        problem = cron_problem(body["cron"])
        if problem is not None:
            raise invalid_request(f"The cron expression {body['cron'][:80]!r} {problem}.")
        problem = zone_problem(body["timezone"])
        if problem is not None:
            raise invalid_request(f"The timezone {body['timezone'][:80]!r} {problem}.")
        schedule = {
            "schedule_id": "sch_" + secrets.token_urlsafe(12),
            "owner": owner,
            "agent": agent,
            "input": input,
            "cron": body["cron"],
            "timezone": body["timezone"],
            "session": body.get("session"),
            "created_at": now_iso(),
            # Slots after this second are the schedule's.
            "last_slot": slot_iso(datetime.now(timezone.utc)),
        }

        @in_transaction
        def insert(conn: StoreConnection) -> None:
            conn.serialize(f"schedules:{owner}")
            if len(conn.list_schedules(owner)) >= MAX_SCHEDULES_PER_OWNER:
                raise Problem(
                    ErrorCode.STORAGE_QUOTA_EXCEEDED,
                    f"You have {MAX_SCHEDULES_PER_OWNER} schedules, the most allowed; "
                    "delete one you no longer need.",
                )
            conn.insert_schedule(schedule)

        await self._writer.run(insert)
        return await self.get(owner, schedule["schedule_id"])

    async def list_schedules(self, owner: str) -> list[dict[str, Any]]:
        def read(conn: StoreConnection) -> list[dict[str, Any]]:
            with conn.read_transaction():
                return [
                    self._answer(conn, schedule, brief=True)
                    for schedule in conn.list_schedules(owner)
                ]

        return await self._reader.run(read)

    async def get(self, owner: str, schedule_id: str) -> dict[str, Any]:
        def read(conn: StoreConnection) -> dict[str, Any] | None:
            with conn.read_transaction():
                schedule = conn.get_schedule(schedule_id)
                if schedule is None or schedule["owner"] != owner:
                    return None
                return self._answer(conn, schedule, brief=False)

        answer = await self._reader.run(read)
        if answer is None:
            raise schedule_not_found(schedule_id)
        return answer

    async def set_paused(self, owner: str, schedule_id: str, paused: bool) -> dict[str, Any]:
        @in_transaction
        def update(conn: StoreConnection) -> bool:
            schedule = conn.get_schedule(schedule_id)
            if schedule is None or schedule["owner"] != owner:
                return False
            # Resumed: the slots that came while it was paused are not run.
            resumed = schedule["paused"] and not paused
            last_slot = slot_iso(datetime.now(timezone.utc)) if resumed else None
            conn.set_schedule_paused(schedule_id, paused, last_slot)
            return True

        if not await self._writer.run(update):
            raise schedule_not_found(schedule_id)
        return await self.get(owner, schedule_id)

    async def delete(self, owner: str, schedule_id: str) -> None:
        @in_transaction
        def remove(conn: StoreConnection) -> bool:
            schedule = conn.get_schedule(schedule_id)
            if schedule is None or schedule["owner"] != owner:
                return False
            return conn.delete_schedule(schedule_id)

        if not await self._writer.run(remove):
            raise schedule_not_found(schedule_id)

    def _answer(
        self, conn: StoreConnection, schedule: dict[str, Any], brief: bool
    ) -> dict[str, Any]:
        """A schedule as the API answers it: its next time and last runs, not its owner."""
        answer = {name: schedule[name] for name in ("schedule_id", *FIELDS, "paused")}
        answer["created_at"] = schedule["created_at"]
        answer["next_at"] = None
        if not schedule["paused"] and croniter is not None:
            answer["next_at"] = slot_iso(next_slot(schedule, parse_slot(schedule["last_slot"])))
        answer["last_slot"] = schedule["last_slot"]
        answer["last_error"] = schedule["last_error"]
        answer["skipped"] = schedule["skipped"]
        if not brief:
            answer["skips"] = schedule["skips"]
        answer["last_runs"] = conn.schedule_runs(
            schedule["owner"], schedule["schedule_id"], LAST_RUNS
        )
        return answer

    # The slots that came ----------------------------------------------------

    async def tick(self) -> int:
        """Submit a run for each served schedule whose slot came; returns how many were submitted."""
        if croniter is None:
            return 0
        schedules = await self._reader.run(lambda conn: conn.list_schedules(None))
        submitted = 0
        for schedule in schedules:
            if self._upkeep.stopping:
                break
            if not self._upkeep.serves(schedule["owner"]) or schedule["agent"] not in self._agents:
                continue  # left to a server that serves its owner and has its agent
            try:
                submitted += await self._handle(schedule)
            except StoreBusy:
                raise  # the store, not this schedule: said once by the loop
            except Exception:
                self._log.exception(
                    "agentruns: schedule %s could not be handled", schedule["schedule_id"]
                )
        return submitted

    async def _handle(self, schedule: dict[str, Any]) -> int:
        found = due(schedule, datetime.now(timezone.utc))
        if found is None:
            return 0
        slot, skipped, first_skipped, last_skipped = found
        schedule_id, slot_text = schedule["schedule_id"], slot_iso(slot)
        request = SubmitRequest(
            agent=schedule["agent"],
            input=schedule["input"],
            session=schedule["session"],
            metadata={"schedule_id": schedule_id, "scheduled_for": slot_text},
            # A slot's run waits behind the session's active run rather than being lost.
            session_policy="enqueue",
        )
        skips = None
        if skipped:
            assert first_skipped is not None and last_skipped is not None  # some were skipped
            record = {
                "first": slot_iso(first_skipped),
                "last": slot_iso(last_skipped),
                "count": skipped,
                "skipped_at": now_iso(),
            }
            skips = [*schedule["skips"], record][-SKIPS_KEPT:]

        def advance(conn: StoreConnection, error: str | None = None) -> bool:
            return conn.advance_schedule(
                schedule_id, schedule["last_slot"], slot_text, skipped, skips, error
            )

        def claim(conn: StoreConnection) -> None:
            # With the run, in its transaction: the slot is handled once, and a
            # schedule paused or deleted meanwhile makes no run.
            if not advance(conn):
                raise SlotTaken

        try:
            # Kept as long as the run: the schedule lists its runs by their keys.
            _, replayed = await self._submissions.submit(
                schedule["owner"],
                request,
                f"schedule:{schedule_id}:{slot_text}",
                key_with_run=True,
                within=claim,
            )
        except SlotTaken:
            return 0  # another server made it, or the schedule was paused or deleted
        except Problem as problem:
            # The slot is lost (a limit of its owner, its input no longer valid):
            # said in the schedule, not tried again.
            error = f"{slot_text}: {problem.code}: {problem.message}"
            if await self._writer.run(in_transaction(lambda conn: advance(conn, error))):
                self._log.warning("agentruns: schedule %s made no run: %s", schedule_id, error)
            return 0
        if not replayed and skipped:
            self._log.info(
                "agentruns: schedule %s ran its slot %s; %d older slot(s) missed while no "
                "server ran were skipped",
                schedule_id,
                slot_text,
                skipped,
            )
        return 0 if replayed else 1


class SlotTaken(Exception):
    """The slot was handled by another server, or its schedule paused or deleted."""
