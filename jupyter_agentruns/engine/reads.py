"""The engine's reads: run objects with their snapshots, list pages, big answers, a run's history.

Reads run off the event loop on the reader's threads (``Reader.run``),
except bounded ones of a local store (``Reader.small``: a run's head, one
snapshot part). A snapshot is made from the persisted one and the events
after it, with a cache of reducers for live runs, within a memory budget.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal, overload

from .. import budgets, jsonio, lifecycle, reducer, words
from ..cursor import page_cursor, parse_page_cursor
from ..domain import (
    JSON,
    Conversation,
    JSONObject,
    ListedRun,
    LoggedEvent,
    RunHead,
    RunObject,
    RunRow,
)
from ..errors import ErrorCode, Problem, run_not_found
from ..reader import Reader
from ..record import FOLLOW_UPS_SHOWN, run_markdown
from ..sessions import SessionPaths
from ..store import StoreConnection, reduce_stored

# The metadata key of a follow-up sent from a run's reply box: the id of its thread's first run.
FOLLOW_UP_OF = "follow_up_of"
SNAPSHOT_CACHE_BYTES = 64 * 1024 * 1024
# run.conversation() looks this far back in a session for an earlier run's checkpoint.
CONVERSATION_RUNS = 1000
LIST_PAGE_BYTES = 16 * 1024 * 1024
# A run's record looks this far back in its session for the follow-ups of its thread.
THREAD_RUNS_READ = 1000
# Runs a search reads from the store at a time (the store's match is wider than
# the search's: each is checked here).
SEARCH_BATCH = 200


class SnapshotReplaced(Exception):
    """A run's snapshot was replaced or deleted while its answer was being sent."""


class Reads:
    """Every read of runs the engine answers; owns the snapshot cache."""

    def __init__(self, reader: Reader, sessions: SessionPaths):
        self.reader = reader
        self.sessions = sessions
        self._snapshots: OrderedDict[str, tuple[int, reducer.Snapshot, int]] = OrderedDict()
        self._snapshot_bytes = 0
        self._snapshots_lock = threading.Lock()  # the cache is used from reader threads

    async def usage(self, owner: str) -> dict[str, int]:
        """``GET usage``: the owner's token totals of the last 24 hours."""
        since = budgets.day_start(time.time())
        rows = await self.reader.run(lambda conn: conn.usage_since(owner, since))
        return budgets.window_totals(rows)

    async def owned_head(self, owner: str, run_id: str) -> RunHead:
        """The caller's run's owner, status and seqs, or 404/410 (a small read)."""
        return await self.reader.small(lambda conn: self.owned(conn, owner, run_id, full=False))

    @overload
    def owned(
        self,
        conn: StoreConnection,
        owner: str,
        run_id: str,
        *,
        full: Literal[True],
        snapshot: bool = True,
    ) -> RunRow: ...

    @overload
    def owned(
        self,
        conn: StoreConnection,
        owner: str,
        run_id: str,
        *,
        full: Literal[False],
        snapshot: bool = True,
    ) -> RunHead: ...

    def owned(
        self, conn: StoreConnection, owner: str, run_id: str, *, full: bool, snapshot: bool = True
    ) -> RunRow | RunHead:
        """The caller's run (``full``: its row, else its head), or 404 (410 once retention deleted it)."""
        row: RunRow | RunHead | None = (
            conn.get_run(run_id, snapshot=snapshot) if full else conn.get_run_head(run_id)
        )
        if row is None:
            tombstone = conn.get_tombstone(run_id)
            if tombstone is not None and tombstone["owner"] == owner:
                raise Problem(
                    ErrorCode.RUN_EXPIRED,
                    f"The run {run_id!r} finished long ago and was deleted "
                    "(run_retention_seconds); its output is no longer kept.",
                )
        if row is None or row["owner"] != owner:
            raise run_not_found(run_id)
        return row

    async def get_run(self, owner: str, run_id: str) -> RunObject:
        """The caller's run object, read (and its snapshot brought up to date) off the event loop."""
        return await self.reader.run(
            in_one_read(
                lambda conn: self.run_object(conn, self.owned(conn, owner, run_id, full=True))
            )
        )

    async def get_run_without_snapshot(self, owner: str, run_id: str) -> RunObject:
        """The caller's run object with ``snapshot`` None: a few columns, whatever the run's size."""
        return await self.reader.run(
            lambda conn: self.run_object(
                conn, self.owned(conn, owner, run_id, full=True, snapshot=False), snapshot=False
            )
        )

    async def text_after(
        self, owner: str, run_id: str, after_seq: int, max_chars: int
    ) -> tuple[str, int]:
        """The caller's run's text written after ``after_seq``: about ``max_chars`` of it at
        most (whole events), and the seq it reaches, to continue from.

        A cursor beyond the run's last event is ``cursor_ahead``; one before
        the events compaction kept is ``invalid_cursor`` (the text is then
        read whole from the run).
        """

        def read(conn: StoreConnection) -> tuple[str, int]:
            head = self.owned(conn, owner, run_id, full=False)
            if after_seq > head["last_seq"]:
                raise Problem(
                    ErrorCode.CURSOR_AHEAD,
                    f"after_seq {after_seq} is beyond the run's last event ({head['last_seq']}).",
                    last_seq=head["last_seq"],
                )
            if after_seq < head["first_seq"] - 1:
                raise Problem(
                    ErrorCode.INVALID_CURSOR,
                    f"The run's events up to seq {head['first_seq'] - 1} are no longer kept one "
                    "by one: read its whole text without after_seq.",
                )
            parts: list[str] = []
            chars, reached = 0, after_seq
            while reached < head["last_seq"]:
                rows = conn.read_events(run_id, reached, 1000, upto=head["last_seq"])
                if not rows:
                    break
                for seq, kind, _, data in rows:
                    if kind == "text.delta":
                        delta = json.loads(data).get("delta") or ""
                        if parts and chars + len(delta) > max_chars:
                            return "".join(parts), reached
                        parts.append(delta)
                        chars += len(delta)
                    reached = seq
            return "".join(parts), reached

        return await self.reader.run(in_one_read(read))

    async def run_answer(
        self, owner: str, run_id: str, markdown: bool = False
    ) -> AsyncIterator[bytes]:
        """What ``GET runs/{id}`` answers, JSON (or the Markdown record), in pieces to send in turn.

        A run's snapshot can hold 100 MB of text, and decoding or encoding
        that holds the interpreter for a second. When the persisted snapshot
        is current, its stored JSON goes out as it is, spliced into the run
        object, read a part (about a megabyte) at a time between the sends:
        each read is short, so on a local store it runs on the event loop,
        which a thread reading the whole text would hold back instead (the
        two would take turns at the GIL every switch interval). Raises
        ``Problem`` before the first piece; ``SnapshotReplaced`` once a piece
        was sent, if the snapshot went away meanwhile (the answer is then cut).
        """

        def head(conn: StoreConnection) -> tuple[bytes, bytes, tuple[int, int]] | None:
            row = self.owned(conn, owner, run_id, full=True, snapshot=False)
            if markdown or not row["snapshot_seq"] == row["last_seq"] > 0:
                return None
            layout = conn.snapshot_layout(run_id)
            if layout is None or layout[0] != row["snapshot_seq"]:
                return None
            mark = f"\x00{secrets.token_hex(16)}\x00"  # nothing else in the run can hold it
            before, after = jsonio.dumps(self.run_object(conn, {**row, "snapshot": mark})).split(
                jsonio.dumps(mark)
            )
            return before.encode(), after.encode(), layout

        spliced = await self.reader.small(head)
        if spliced is not None:
            return self._spliced(run_id, *spliced)

        def whole(conn: StoreConnection) -> bytes:
            run = self.run_object(conn, self.owned(conn, owner, run_id, full=True))
            if not markdown:
                return jsonio.dumps(run).encode("utf-8")
            # The record a notebook keeps of a cell's output holds its thread.
            return run_markdown(run, self._follow_ups(conn, owner, run)).encode("utf-8")

        return _pieces(await self.reader.run(in_one_read(whole)))

    async def _spliced(
        self, run_id: str, before: bytes, after: bytes, layout: tuple[int, int]
    ) -> AsyncIterator[bytes]:
        seq, parts = layout
        yield before
        for part in range(parts):

            def read_part(conn: StoreConnection, part: int = part) -> str | None:
                return conn.snapshot_part(run_id, part, seq)

            text = await self.reader.small(read_part)
            if text is None:
                raise SnapshotReplaced(run_id)
            yield text.encode()
        yield after

    async def list_runs(
        self,
        owner: str,
        *,
        status: str | None,
        session: str | None,
        limit: int,
        before: str | None,
        retry_of: str | None = None,
        search: str | None = None,
        forked_from: str | None = None,
    ) -> bytes:
        """One page of the owner's runs, newest first, with the ``before`` of the next page: JSON.

        Made off the event loop, and bounded: a page stops early before the
        run that would take its JSON over ``LIST_PAGE_BYTES`` (its ``next``
        goes on from there); only a page of one run may be larger.
        ``search``: only runs whose title, agent or notebook contain this text
        (any case).
        """
        after = parse_page_cursor(before) if before else None

        def matching(conn: StoreConnection, wanted: int) -> list[ListedRun]:
            forms = None if session is None else self.sessions.forms(session)
            if not search:
                return conn.list_runs(
                    owner,
                    status=status,
                    session=forms,
                    limit=wanted,
                    before=after,
                    retry_of=retry_of,
                    forked_from=forked_from,
                )
            found: list[ListedRun] = []
            cursor = after
            while len(found) < wanted:
                rows = conn.list_runs(
                    owner,
                    status=status,
                    session=forms,
                    limit=SEARCH_BATCH,
                    before=cursor,
                    retry_of=retry_of,
                    search=search,
                    forked_from=forked_from,
                )
                found.extend(row for row in rows if self._found(row, search))
                if len(rows) < SEARCH_BATCH:
                    break
                cursor = (rows[-1]["created_at"], rows[-1]["run_id"])
            return found[:wanted]

        def page(conn: StoreConnection) -> bytes:
            rows = matching(conn, limit + 1)
            encoded: list[str] = []
            size = 0
            last: RunRow | None = None
            for row in rows[:limit]:
                full = conn.get_run(row["run_id"])
                assert full is not None  # listed in the same read
                text = jsonio.dumps(self.run_object(conn, full))
                # A page ends before the run that would take it over its
                # bound (its next page begins there); a page holds at least one run.
                if encoded and size + len(text) > LIST_PAGE_BYTES:
                    break
                encoded.append(text)
                size += len(text)
                last = full
            more = last is not None and len(rows) > len(encoded)
            next_page = page_cursor(last["created_at"], last["run_id"]) if last and more else None
            return (
                '{"runs":[' + ",".join(encoded) + '],"next":' + jsonio.dumps(next_page) + "}"
            ).encode("utf-8")

        return await self.reader.run(in_one_read(page))

    async def list_conversations(
        self,
        owner: str,
        *,
        agent: str | None,
        notebook: str | None,
        limit: int,
        before: str | None,
    ) -> dict[str, Any]:
        """One page of the owner's conversations, the one with the newest run first, and ``next``.

        ``notebook`` (a path under the server's root): the conversations whose
        session is that notebook, or with a run that names it in ``metadata.notebook``.
        A conversation's place is its newest run, so the cursor is that run's.
        """
        after = parse_page_cursor(before) if before else None
        forms = None if notebook is None else self.sessions.forms(notebook)

        def page(conn: StoreConnection) -> dict[str, Any]:
            rows = conn.list_conversations(
                owner, agent=agent, notebook=forms, limit=limit + 1, before=after
            )
            conversations: list[Conversation] = [
                {
                    "session": self.sessions.relative(row["session"]) or row["session"],
                    "agent": row["agent"],
                    # The agent's own title of it where it gave one, else its first run's.
                    "title": row["title"]
                    or words.run_title(row["first_metadata"], row["first_input"], row["agent"]),
                    "runs": row["runs"],
                    "last_run_id": row["last_run_id"],
                    "updated_at": row["updated_at"],
                }
                for row in rows[:limit]
            ]
            last = rows[limit - 1] if len(rows) > limit else None
            next_page = (
                None if last is None else page_cursor(last["updated_at"], last["last_run_id"])
            )
            return {"conversations": conversations, "next": next_page}

        return await self.reader.run(in_one_read(page))

    def _follow_ups(
        self, conn: StoreConnection, owner: str, run: RunObject
    ) -> list[Mapping[str, Any]]:
        """The runs sent as follow-ups of ``run`` (``metadata.follow_up_of``), oldest first (reader thread).

        They are in its session and newer than it: the session's runs are
        read from the newest down to it, at most ``THREAD_RUNS_READ``; of
        those found, the record's first ``FOLLOW_UPS_SHOWN`` are read whole,
        the others only counted.
        """
        session = run["session"]
        if not session or run["metadata"].get(FOLLOW_UP_OF):
            return []
        since = (run["created_at"], run["run_id"])
        found: list[ListedRun] = []
        before: tuple[str, str] | None = None
        read = 0
        while read < THREAD_RUNS_READ:
            rows = conn.list_runs(
                owner, status=None, session=self.sessions.forms(session), limit=100, before=before
            )
            newer = [row for row in rows if (row["created_at"], row["run_id"]) > since]
            found += [row for row in newer if _follows_up(row, run["run_id"])]
            read += len(rows)
            if len(rows) < 100 or len(newer) < len(rows):
                break
            before = (rows[-1]["created_at"], rows[-1]["run_id"])
        found.reverse()
        follow_ups: list[Mapping[str, Any]] = []
        for index, row in enumerate(found):
            if index >= FOLLOW_UPS_SHOWN:
                # Counted, not shown: the record says how many more there are.
                follow_ups.append({"run_id": row["run_id"], "created_at": row["created_at"]})
                continue
            full = conn.get_run(row["run_id"])
            if full is not None:
                follow_ups.append(self.run_object(conn, full))
        return follow_ups

    def _found(self, row: ListedRun, search: str) -> bool:
        """Whether a run's title, agent or notebook hold ``search``, in any case."""
        metadata = row.get("metadata")
        if not isinstance(metadata, dict):
            metadata = {}
        notebook = metadata.get("notebook")
        if not isinstance(notebook, str):
            notebook = ""
        places = (
            words.run_title(metadata, row.get("input"), row["agent"]),
            row["agent"],
            self.sessions.relative(row.get("session")) or "",
            self.sessions.relative(notebook) or "",
        )
        needle = search.casefold()
        return any(needle in place.casefold() for place in places)

    async def history(self, run_id: str) -> list[LoggedEvent]:
        """A run's kept events, decoded (for a resumed agent's ``run.history()``)."""
        return await self.reader.run(lambda conn: logged_events(conn, run_id))

    async def conversation(self, row: RunRow) -> JSON:
        """The last checkpoint an earlier run of this run's owner, session and agent saved, or None.

        For an agent that goes on with a conversation (an ACP agent's session):
        the runs of the session, newest first, older than this one. For a fork
        (which has no session): the checkpoint of the run it was forked from.
        """
        owner, session, agent = row["owner"], row["session"], row["agent"]
        forked = row.get("forked_from")
        if session is None:
            if not isinstance(forked, dict):
                return None

            def origin(conn: StoreConnection) -> JSON:
                full = conn.get_run(forked["run_id"], snapshot=False)
                if full is None or full["owner"] != owner or full["agent"] != agent:
                    return None
                return full.get("checkpoint")

            return await self.reader.run(origin)

        def read(conn: StoreConnection) -> JSON:
            before: tuple[str, str] | None = (row["created_at"], row["run_id"])
            seen = 0
            while before is not None and seen < CONVERSATION_RUNS:
                rows = conn.list_runs(owner, status=None, session=session, limit=100, before=before)
                for earlier in rows:
                    if earlier["agent"] != agent:
                        continue
                    full = conn.get_run(earlier["run_id"], snapshot=False)
                    if full is not None and full.get("checkpoint") is not None:
                        return full["checkpoint"]
                seen += len(rows)
                before = (rows[-1]["created_at"], rows[-1]["run_id"]) if len(rows) == 100 else None
            return None

        return await self.reader.run(read)

    def forget(self, run_id: str) -> None:
        with self._snapshots_lock:
            cached = self._snapshots.pop(run_id, None)
            if cached is not None:
                self._snapshot_bytes -= cached[2]

    def run_object(self, conn: StoreConnection, row: RunRow, *, snapshot: bool = True) -> RunObject:
        """The public run object: ``snapshot`` is exactly the events up to ``last_seq`` (reader thread).

        Without ``snapshot`` (a row read without it), its ``snapshot`` is None.
        """
        # A run recorded with its notebook's absolute path shows the relative one, as runs now record it.
        metadata: JSONObject = self.sessions.metadata(row["metadata"]) or {}
        state = self._snapshot_at(conn, row) if snapshot else None
        # Waiting in its session's queue (enqueue, interrupt): behind which run.
        waits = (
            row["status"] == lifecycle.RunStatus.QUEUED.value
            and row["executor_id"] is None
            and row["session"]
        )
        queued_behind = conn.queued_behind(row["run_id"]) if waits else None
        # When a run going on last had an event: a view says when its agent has been silent long.
        last_event_at = None
        if lifecycle.is_active(row["status"]) and row["last_seq"]:
            last = conn.read_events(row["run_id"], row["last_seq"] - 1, 1, max_bytes=1)
            last_event_at = last[0][2] if last else None
        run: RunObject = {
            "run_id": row["run_id"],
            "agent": row["agent"],
            "status": row["status"],
            "session": self.sessions.relative(row["session"]),
            "metadata": metadata,
            "input": row["input"],
            "retry_of": row["retry_of"],
            "forked_from": row.get("forked_from"),
            "created_at": row["created_at"],
            "started_at": row["started_at"],
            "finished_at": row["finished_at"],
            "last_seq": row["last_seq"],
            "first_seq": row["first_seq"],
            "attempt": row["attempt"],
            "title": words.run_title(metadata, row["input"], row["agent"]),
            "snapshot": state,
            "output": row["output"],
            "error": row["error"],
            "cancel": row["cancel"],
            "queued_behind": queued_behind,
            "last_event_at": last_event_at,
        }
        request = row["cancel_request"]
        if request is not None:
            # Recorded for the server executing the run, which has not taken it
            # yet: answer with the run as it will be in a moment.
            run = lifecycle.as_pending_cancel(run, request)
        return run

    def _snapshot_at(self, conn: StoreConnection, row: RunRow) -> dict[str, Any]:
        run_id, last_seq = row["run_id"], row["last_seq"]
        if row["snapshot_seq"] == last_seq and row["snapshot"] is not None:
            return row["snapshot"]
        with self._snapshots_lock:
            cached = self._snapshots.pop(run_id, None)
            if cached is not None:
                self._snapshot_bytes -= cached[2]
        if cached is not None and row["snapshot_seq"] <= cached[0] <= last_seq:
            seq, builder = cached[0], cached[1]
        else:
            seq, builder = row["snapshot_seq"], reducer.Snapshot(row["snapshot"])
        snapshot = reduce_stored(conn, run_id, builder, seq, last_seq).to_dict()
        # Cached for the next read of a live run, within a memory budget. A
        # builder is used by one reader at a time: it left the cache above.
        size = approximate_size(snapshot)
        if size <= SNAPSHOT_CACHE_BYTES // 4:
            # The answer gets a copy of its structure: once the builder is back
            # in the cache, the next reader applies later events to it while
            # this answer may still be being written out. (The texts are
            # strings, shared, never changed in place: the copy costs no text.)
            snapshot = detached(snapshot)
            with self._snapshots_lock:
                # Another reader of the run may have put its own back meanwhile:
                # replaced, it must leave the count too.
                other = self._snapshots.pop(run_id, None)
                if other is not None:
                    self._snapshot_bytes -= other[2]
                self._snapshots[run_id] = (last_seq, builder, size)
                self._snapshot_bytes += size
                while self._snapshot_bytes > SNAPSHOT_CACHE_BYTES:
                    self._snapshot_bytes -= self._snapshots.popitem(last=False)[1][2]
        return snapshot


def in_one_read(fn: Callable[[StoreConnection], Any]) -> Callable[[StoreConnection], Any]:
    """``fn(conn)`` in one read transaction: a run's row, snapshot and events from one state of the store."""

    def read(conn: StoreConnection) -> Any:
        with conn.read_transaction():
            return fn(conn)

    return read


def detached(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot whose lists and their items are its own (the reducer changes those in place)."""
    copy = dict(snapshot)
    for key in ("messages", "tools", "inputs"):
        if isinstance(copy.get(key), list):
            copy[key] = [dict(item) for item in copy[key]]
    return copy


def approximate_size(snapshot: dict) -> int:
    """Roughly the bytes a snapshot holds: its text, plus a little per tool call."""
    return sum(len(m["text"]) for m in snapshot["messages"]) + 512 * (len(snapshot["tools"]) + 1)


def _follows_up(row: ListedRun, run_id: str) -> bool:
    metadata = row.get("metadata")
    return isinstance(metadata, dict) and metadata.get(FOLLOW_UP_OF) == run_id


async def _pieces(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


def logged_events(conn: StoreConnection, run_id: str, upto: int | None = None) -> list[LoggedEvent]:
    """A run's kept events (those up to ``upto``, if given), decoded, read a chunk at a time."""
    events: list[LoggedEvent] = []
    after = 0
    while True:
        rows = conn.read_events(run_id, after, 5000, upto=upto)
        if not rows:
            return events
        events.extend(
            {"seq": seq, "type": type, "ts": ts, "data": json.loads(data)}
            for seq, type, ts, data in rows
        )
        after = rows[-1][0]
