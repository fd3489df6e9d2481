"""The commands that ask a running Jupyter server: list, conversations, show, tail, cancel,
answer, export, usage.

They are clients of the REST API, through the notebook API's ``Client``:
what they may do is exactly what a person with the server's token may do.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any, Protocol, TextIO

from ..kernel.client import AgentRunsError, Client, NotAgentRunsServer, ServerNotFound
from ..lifecycle import TERMINAL_EVENTS, TERMINAL_STATUSES
from ..questions import choice_for, choice_name
from . import exits, output
from .exits import CliError

LIST_PAGE_MAX = 500  # GET runs answers at most this many a page
EXPORT_PAGE = 1000
# Reads of a run's events that compaction overtook before export gives up.
EXPORT_ATTEMPTS = 10
# The server's ``retry:`` is the floor of the reconnect backoff; this its ceiling.
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0


def print_json(value: Any, out: TextIO) -> None:
    out.write(output.json_text(value, indent=2) + "\n")


# list ------------------------------------------------------------------------


def list_runs(
    client: Client,
    *,
    status: str | None,
    session: str | None,
    agent: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    """The caller's newest ``limit`` runs matching the filters, following ``next`` page by page.

    The API filters by status and session; ``agent`` is filtered here, page
    by page, so a rare agent may take several pages to fill ``limit``.
    """
    runs: list[dict[str, Any]] = []
    before = None
    while len(runs) < limit:
        wanted = limit - len(runs)
        page = client.list_runs(
            status=status,
            session=session,
            limit=LIST_PAGE_MAX if agent else min(wanted, LIST_PAGE_MAX),
            before=before,
        )
        listed = page.get("runs")
        if not isinstance(listed, list):
            raise CliError("the server's answer has no list of runs", exits.UNAVAILABLE)
        runs += [
            run for run in map(output.mapping, listed) if agent is None or run.get("agent") == agent
        ]
        before = page.get("next")
        if not before or not isinstance(before, str):
            break
    return runs[:limit]


def cmd_list(client: Client, args, out: TextIO) -> int:
    runs = list_runs(
        client, status=args.status, session=args.session, agent=args.agent, limit=args.limit
    )
    if args.json:
        print_json(runs, out)
    elif runs:
        out.write(output.runs_table(runs) + "\n")
    else:
        out.write(
            "no runs" + (" match" if args.status or args.session or args.agent else "") + "\n"
        )
    return exits.OK


# conversations ---------------------------------------------------------------


def cmd_conversations(client: Client, args, out: TextIO) -> int:
    found: list[dict[str, Any]] = []
    before = None
    while len(found) < args.limit:
        page = client.conversations(
            agent=args.agent,
            notebook=args.notebook,
            limit=min(args.limit - len(found), LIST_PAGE_MAX),
            before=before,
        )
        listed = page.get("conversations")
        if not isinstance(listed, list):
            raise CliError("the server's answer has no list of conversations", exits.UNAVAILABLE)
        found += map(output.mapping, listed)
        before = page.get("next")
        if not before or not isinstance(before, str):
            break
    found = found[: args.limit]
    if args.json:
        print_json(found, out)
    elif found:
        out.write(output.conversations_table(found) + "\n")
    else:
        out.write("no conversations" + (" match" if args.agent or args.notebook else "") + "\n")
    return exits.OK


# show ------------------------------------------------------------------------


def cmd_show(client: Client, args, out: TextIO) -> int:
    run = client.get_run(args.run)
    if args.json:
        print_json(run, out)
    else:
        out.write(output.run_details(run) + "\n")
    return exits.OK


# tail ------------------------------------------------------------------------


class Printer(Protocol):
    """Where ``follow`` hands what it receives: ``tail`` prints it, the ACP bridge sends it on."""

    def event(self, event: dict[str, Any]) -> None: ...

    def snapshot(self, seq: int, run: dict[str, Any]) -> None: ...

    def end(self) -> None: ...


class EventPrinter:
    """Prints what ``tail`` receives: text as text, other events one short line each.

    While a message streams, its progress and usage events are left out: a
    line between two words would cut the text (``--json`` has every event).
    """

    QUIET_IN_TEXT = ("progress", "usage")

    def __init__(self, out: TextIO, as_json: bool):
        self.out = out
        self.as_json = as_json
        self.mid_line = False  # the last thing printed was text without its newline
        self.in_message = False

    def event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if self.as_json:
            self._line(output.json_text(event, separators=(",", ":")))
        elif kind == "text.delta":
            delta = output.mapping(event.get("data")).get("delta")
            if delta and isinstance(delta, str):
                self.out.write(output.printable(delta))
                self.mid_line = not delta.endswith("\n")
        elif kind in ("message.started", "message.completed"):
            self.in_message = kind == "message.started"
        elif not (self.in_message and kind in self.QUIET_IN_TEXT):
            self._line(output.event_line(event))
        self.out.flush()

    def snapshot(self, seq: int, run: dict[str, Any]) -> None:
        """The run at ``seq``, when the events before it were compacted away."""
        if self.as_json:
            self._line(output.json_text({"type": "snapshot", "seq": seq, "run": run}))
        else:
            self._line(f"[{seq}] snapshot: the events up to here were compacted")
            text = output.message_text(output.mapping(run.get("snapshot")).get("messages"))
            if text:
                self.out.write(output.printable(text))
                self.mid_line = not text.endswith("\n")
        self.out.flush()

    def end(self) -> None:
        if self.mid_line:
            self.out.write("\n")
            self.mid_line = False
        self.out.flush()

    def _line(self, text: str) -> None:
        if self.mid_line:
            self.out.write("\n")
            self.mid_line = False
        self.out.write(text + "\n")


class Backoff:
    """Exponential reconnect delays with jitter, so a restarted server is not stampeded.

    Never shorter than ``floor``: the server's ``retry:`` when it said one.
    """

    def __init__(self) -> None:
        self.attempts = 0
        self.floor = BACKOFF_FIRST_SECONDS

    def next(self, retry_after: float | None = None) -> float:
        delay = min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2**self.attempts)
        self.attempts += 1
        delay = delay * random.uniform(0.5, 1.0)
        return max(delay, self.floor, retry_after or 0.0)

    def reset(self) -> None:
        self.attempts = 0

    def set_floor(self, seconds: float) -> None:
        self.floor = min(BACKOFF_MAX_SECONDS, max(BACKOFF_FIRST_SECONDS, seconds))


class Reconnects:
    """When ``tail`` tries the server again, and when it gives up on it.

    The give-up clock runs while the server stays away: any answer from it
    (a stream that opens, even with only pings) stops it and resets the
    backoff, so a short cut long after a long one is a short cut.
    """

    TRANSIENT = (429, 502, 503, 504)

    def __init__(self, run_id: str, give_up_after: float, notices: TextIO):
        self.run_id = run_id
        self.give_up_after = give_up_after
        self.notices = notices
        self.backoff = Backoff()
        self.unreachable_since: float | None = None

    def answered(self) -> None:
        self.unreachable_since = None
        self.backoff.reset()

    def failed(self, error: ServerNotFound | AgentRunsError, cursor: int) -> None:
        """Wait before the next try; raises when the error is no passing one, or it is time to give up."""
        if isinstance(error, AgentRunsError) and error.status not in self.TRANSIENT:
            raise exits.from_api(error) from None
        if isinstance(error, NotAgentRunsServer):
            raise CliError(str(error), exits.UNAVAILABLE) from None
        now = time.monotonic()
        self.unreachable_since = self.unreachable_since or now
        if now - self.unreachable_since >= self.give_up_after:
            raise CliError(
                f"gave up following {self.run_id} after {self.give_up_after:g} s without the "
                f"server ({error}); run again with --after {cursor} to go on from here",
                exits.UNAVAILABLE,
            ) from None
        delay = self.backoff.next(getattr(error, "retry_after", None))
        self.notices.write(
            f"{output.one_line(str(error))}; reconnecting in {delay:.1f} s from event {cursor}\n"
        )
        self.notices.flush()
        time.sleep(delay)

    def pause(self) -> None:
        """A stream ended with nothing new (a server stopping): not straight back at it."""
        time.sleep(self.backoff.next())


def follow(
    client: Client,
    run_id: str,
    *,
    after: int,
    printer: Printer,
    reconnects: Reconnects,
    read_timeout: float,
) -> str:
    """Print the run's events after ``after`` until its terminal one; returns its final status.

    The cursor is the last ``seq`` printed: after a dropped connection, a
    server restart or a 503 the stream is asked again from it (with
    ``Last-Event-ID``), so every event is printed exactly once. Reconnects
    back off (at least what ``Retry-After`` and the stream's ``retry:`` say)
    and give up once the server has been unreachable for the give-up time
    in a row.
    """
    cursor = after
    try:
        while True:
            before = cursor
            try:
                for frame in client.stream_events(
                    run_id,
                    cursor,
                    read_timeout,
                    on_open=reconnects.answered,
                    on_retry=reconnects.backoff.set_floor,
                ):
                    if frame.get("event") == "snapshot":
                        cursor = frame["id"]
                        printer.snapshot(cursor, frame["data"])
                        continue
                    event = frame["data"]
                    if event["seq"] <= cursor:
                        continue  # already printed (a server may repeat what follows the cursor)
                    printer.event(event)
                    cursor = event["seq"]
                    if event["type"] in TERMINAL_EVENTS:
                        return event["type"].removeprefix("run.")
                # The stream ended without the terminal event (a 204, a server stopping):
                # the run itself says whether anything is left.
                run = client.get_run(run_id)
                if run["status"] in TERMINAL_STATUSES and cursor >= run["last_seq"]:
                    return run["status"]
                if cursor == before:
                    reconnects.pause()
            except (ServerNotFound, AgentRunsError) as error:
                reconnects.failed(error, cursor)
    finally:
        printer.end()


def first_look(client: Client, run_id: str, reconnects: Reconnects, after: int) -> dict[str, Any]:
    """The run, asked until the server answers: a run that is not there is said at once."""
    while True:
        try:
            run = client.get_run(run_id)
        except (ServerNotFound, AgentRunsError) as error:
            reconnects.failed(error, after)
        else:
            reconnects.answered()
            return run


def cmd_tail(client: Client, args, out: TextIO) -> int:
    reconnects = Reconnects(args.run, args.give_up_after, sys.stderr)
    first_look(client, args.run, reconnects, args.after)
    status = follow(
        client,
        args.run,
        after=args.after,
        printer=EventPrinter(out, args.json),
        reconnects=reconnects,
        read_timeout=args.read_timeout,
    )
    if not args.json:
        sys.stderr.write(f"{output.one_line(args.run)} {status}\n")
    return exits.OUTCOMES[status]


# cancel, answer --------------------------------------------------------------


def cmd_cancel(client: Client, args, out: TextIO) -> int:
    run = client.cancel(args.run, args.reason)
    if args.json:
        print_json(run, out)
    elif run.get("status") in TERMINAL_STATUSES and not run.get("cancel"):
        out.write(f"{output.one_line(args.run)} had already {run['status']}: nothing to cancel\n")
    else:
        out.write(f"{output.one_line(args.run)} {output.one_line(run.get('status'))}\n")
    return exits.OK


def cmd_answer(client: Client, args, out: TextIO) -> int:
    """Answer with one of the question's choices, or a permission option's name (its id is sent)."""
    inputs = output.items(output.mapping(client.get_run(args.run).get("snapshot")).get("inputs"))
    request = next(
        (item for item in map(output.mapping, inputs) if item.get("request_id") == args.request), {}
    )
    try:
        choice = choice_for(request, args.choice)
    except ValueError as error:
        raise CliError(str(error), exits.REFUSED) from None
    run = client.answer(args.run, args.request, choice, args.note)
    if args.json:
        print_json(run, out)
    else:
        name = choice_name(request, choice)
        out.write(
            f"answered {output.one_line(args.request)} with {output.one_line(repr(choice))}"
            f"{f' ({output.one_line(name)})' if name != choice else ''}; "
            f"{output.one_line(args.run)} is {output.one_line(run.get('status'))}\n"
        )
    return exits.OK


# export ----------------------------------------------------------------------


def exported_json(client: Client, run_id: str) -> dict[str, Any]:
    """The run object and its kept events ``first_seq..last_seq``: one consistent record.

    Compaction may take events away while they are read (a run over its
    event budget, retention): the record is then read again from a fresh
    run object, a few times, rather than written with a hole.
    """
    for _ in range(EXPORT_ATTEMPTS):
        run = client.get_run(run_id)
        events = kept_events(client, run)
        if events is not None:
            return {"run": run, "events": events}
    raise CliError(
        f"the events of {run_id} were compacted faster than they could be read "
        f"({EXPORT_ATTEMPTS} tries): export it again, or as Markdown (--format md)",
        exits.UNAVAILABLE,
    )


def kept_events(client: Client, run: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The run's events from its ``first_seq`` to its ``last_seq``; None when some were compacted meanwhile."""
    events: list[dict[str, Any]] = []
    after = run["first_seq"] - 1
    while after < run["last_seq"]:
        page = client.events_page(run["run_id"], after, EXPORT_PAGE)
        # An expired cursor answers with a snapshot instead: the events after it are gone.
        if "snapshot" in page or not page["events"] or page["events"][0]["seq"] != after + 1:
            return None
        events += [event for event in page["events"] if event["seq"] <= run["last_seq"]]
        after = events[-1]["seq"]
    return events


def cmd_export(client: Client, args, out: TextIO) -> int:
    if args.format == "md":
        text = output.printable(client.record(args.run))
        text += "" if text.endswith("\n") else "\n"  # a file ends with a line end
    else:
        text = output.json_text(exported_json(client, args.run), indent=2) + "\n"
    if args.output is None:
        out.write(text)
        return exits.OK
    path = Path(args.output)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise CliError(f"cannot write {path}: {error.strerror}", exits.USAGE) from None
    size = len(text.encode("utf-8"))
    if args.json:
        print_json(
            {"run_id": args.run, "format": args.format, "path": str(path), "bytes": size}, out
        )
    else:
        out.write(f"wrote {output.one_line(str(path))} ({size:,} bytes)\n")
    return exits.OK


# usage -----------------------------------------------------------------------


def cmd_usage(client: Client, args, out: TextIO) -> int:
    usage = client.usage()
    if args.json:
        print_json(usage, out)
    else:
        out.write(output.usage_line(output.mapping(usage)) + "\n")
    return exits.OK


# schedules -------------------------------------------------------------------


def cmd_schedules(client: Client, args, out: TextIO) -> int:
    answer = output.mapping(client.request("GET", "schedules")[2])
    listed = answer.get("schedules")
    if not isinstance(listed, list):
        raise CliError("the server's answer has no list of schedules", exits.UNAVAILABLE)
    if args.json:
        print_json(listed, out)
    elif listed:
        out.write(output.schedules_table(listed) + "\n")
    else:
        out.write("no schedules\n")
    return exits.OK


COMMANDS = {
    "list": cmd_list,
    "conversations": cmd_conversations,
    "show": cmd_show,
    "tail": cmd_tail,
    "cancel": cmd_cancel,
    "answer": cmd_answer,
    "export": cmd_export,
    "usage": cmd_usage,
    "schedules": cmd_schedules,
}
