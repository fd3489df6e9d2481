"""The store: where runs, their events, snapshots and idempotency keys live.

``Store`` opens connections; a ``StoreConnection`` is everything the engine
asks of storage. Writes happen on the writer thread only, inside
``transaction()`` (see ``writer.py``); reads happen on reader threads (see
``reader.py``), or on the event loop when they are bounded and the store is a
local file (``Store.local_reads``).

Two stores, one SQL: ``sql.py`` holds the tables and every query once
(``SQLConnection``); ``sqlite.py`` (one SQLite file, the default) and
``postgres.py`` (a database that servers on many machines share) say how
their database differs. ``copy.py`` moves a SQLite store into PostgreSQL.

The schema has a history per database up to the point where they met:
SQLite's first eight migrations, built step by step as the package grew, and
PostgreSQL's first, which makes their result at once. From there on there is
one history, ``sql.SHARED_MIGRATIONS``, appended to both. A new change of the
schema is a step added there, written once; the two stores' own lists are
closed (a step added to one would renumber the shared steps after it in that
store alone). A store's schema version is the number of steps it has had: a
store of an older version is migrated forward, one of a newer one refused.
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Callable, Iterable
from typing import Any, cast

from .. import jsonio, lifecycle, reducer
from ..domain import (
    ActiveRun,
    CancelRequest,
    EventRow,
    InputAnswer,
    KeyRow,
    ListedConversation,
    ListedRun,
    RunFields,
    RunHead,
    RunRow,
    StoredEvent,
    Tombstone,
)
from ..events import Event, envelope
from ..events import event as make_event
from ..timeutil import now_iso


class UnsafeStore(Exception):
    """A store that cannot or must not be used as configured: the message says why and what to do."""


class StoreBusy(Exception):
    """A passing failure (locked by another process, disk full): the same write may be retried."""


class StoreUnavailable(StoreBusy):
    """The database cannot be reached (restarting, a network cut): the API answers 503 meanwhile."""


class StoreRefused(StoreUnavailable):
    """The database answers, but refuses this server what it needs (a privilege): the message
    says what is missing and what an administrator does about it. Not a passing failure."""


class SeqTaken(Exception):
    """Events were refused because their ``(run_id, seq)`` is taken: another server ended the run."""


class StoreConnection(abc.ABC):
    """One connection, used by one thread at a time. Rows are dicts with JSON columns decoded."""

    # Transactions ------------------------------------------------------------

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """A write transaction: committed at the end of the block, rolled back on an exception."""

    @abc.abstractmethod
    def savepoint(self) -> contextlib.AbstractContextManager[None]:
        """A nested part of the transaction that an exception rolls back alone."""

    @abc.abstractmethod
    def read_transaction(self) -> contextlib.AbstractContextManager[None]:
        """Reads that see one state of the store, whatever other connections commit meanwhile.

        A run is read in several statements (its row, the parts of its
        persisted snapshot, the events after that snapshot): a compaction
        committed between two of them replaces the snapshot and deletes the
        events the row still counts on.
        """

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def change_token(self) -> int:
        """A number that changes whenever another connection commits (wakes readers of others' runs).

        Only asked of a store that cannot ``listen``.
        """

    @abc.abstractmethod
    def serialize(self, scope: str) -> None:
        """Inside a transaction: others serializing on ``scope`` wait until it ends.

        What makes a read-then-write race-free across servers (one run per
        Idempotency-Key, one active run in a ``reject`` session). A store
        whose write transactions already run one at a time does nothing.
        """

    @abc.abstractmethod
    def lock_run(self, run_id: str) -> None:
        """Inside a transaction: another server's change to the run waits until it ends."""

    # Reads -------------------------------------------------------------------

    @abc.abstractmethod
    def get_run(self, run_id: str, *, snapshot: bool = True) -> RunRow | None:
        """Every column of a run, with its persisted ``snapshot`` (None without ``snapshot``) and ``snapshot_seq``."""

    @abc.abstractmethod
    def snapshot_layout(self, run_id: str) -> tuple[int, int] | None:
        """The persisted snapshot's ``(seq, parts)``, or None without one."""

    @abc.abstractmethod
    def snapshot_part(self, run_id: str, part: int, seq: int) -> str | None:
        """Part ``part`` (from 0) of the persisted snapshot's JSON, if it is still the one at ``seq``.

        A snapshot at a given seq is always the same text, cut in the same
        parts: parts read one at a time, each checked against ``seq``, make the
        whole text or, once the snapshot was replaced or deleted, a None.
        """

    @abc.abstractmethod
    def get_run_head(self, run_id: str) -> RunHead | None:
        """``run_id, owner, status, last_seq, first_seq, finished_ts``: cheap, whatever the run's size."""

    @abc.abstractmethod
    def list_runs(
        self,
        owner: str,
        *,
        status: str | None,
        session: str | tuple[str, ...] | None,
        limit: int,
        before: tuple[str, str] | None,
        retry_of: str | None = None,
        search: str | None = None,
        forked_from: str | None = None,
    ) -> list[ListedRun]:
        """The owner's runs, newest first (``created_at``, then ``run_id``), after the ``before`` one.

        ``forked_from``: only the forks of this run.

        ``session``: one, or any of several (the forms a notebook's path was recorded in).
        ``search``: only runs whose agent, session, metadata or input hold this
        text, ignoring the case of ASCII letters (more than the title, agent
        and notebook a search means: the caller checks those); a search with
        other characters than ASCII filters nothing here.

        Without their snapshots (``get_run`` has them): a page of runs must not
        cost the sum of their texts.
        """

    @abc.abstractmethod
    def list_conversations(
        self,
        owner: str,
        *,
        agent: str | None,
        notebook: tuple[str, ...] | None,
        limit: int,
        before: tuple[str, str] | None,
    ) -> list[ListedConversation]:
        """The owner's conversations, the one with the newest run first, after the ``before`` one.

        A conversation is the owner's runs of one ``session`` (not null) and
        one ``agent``; its place is its newest run's ``(created_at, run_id)``,
        which ``before`` names. ``agent``: only that agent's. ``notebook``
        (the forms its path was recorded in): only conversations whose session
        is one of them, or with a run whose ``metadata.notebook`` is. Each
        with its first run's metadata and input, and ``title``: the newest
        ``conversation_title`` of its runs (None: none has one).
        """

    @abc.abstractmethod
    def read_events(
        self,
        run_id: str,
        after: int,
        limit: int,
        upto: int | None = None,
        max_bytes: int | None = None,
    ) -> list[StoredEvent]:
        """``(seq, type, ts, data)`` with ``after < seq <= upto``, in order; at least one row within ``max_bytes``."""

    def read_frames(self, run_id: str, after: int, limit: int, max_bytes: int) -> list[Event]:
        """The events ``read_events`` reads, as subscribers send them (``events.Event``)."""
        run_id_json = json.dumps(run_id)
        return [
            make_event(seq, type, envelope(run_id_json, seq, type, ts, data))
            for seq, type, ts, data in self.read_events(run_id, after, limit, max_bytes=max_bytes)
        ]

    @abc.abstractmethod
    def get_tombstone(self, run_id: str) -> Tombstone | None:
        """What is left of a run retention deleted: its ``owner``."""

    @abc.abstractmethod
    def compaction_candidates(
        self, finished_before: float, max_events: int, limit: int = 100
    ) -> list[str]: ...

    @abc.abstractmethod
    def snapshot_seq(self, run_id: str) -> int:
        """The seq the run's persisted snapshot is at (0: none)."""

    @abc.abstractmethod
    def expired_runs(self, finished_before: float, limit: int = 1000) -> list[tuple[str, str]]:
        """``(run_id, owner)`` of finished runs past their retention."""

    @abc.abstractmethod
    def find_key(self, owner: str, key: str, not_before: float) -> KeyRow | None:
        """The owner's key if made after ``not_before`` or kept as long as its run."""

    @abc.abstractmethod
    def count_active(self, owner: str) -> int: ...

    @abc.abstractmethod
    def count_runs(self, owner: str) -> int:
        """How many runs the owner has stored, whatever their status."""

    @abc.abstractmethod
    def count_runs_by_status(self, owners: list[str] | None = None) -> dict[str, int]:
        """The runs of ``owners`` (None: every run of the store), counted by status (statuses with none are absent)."""

    @abc.abstractmethod
    def diagnostics(self) -> dict[str, Any]:
        """What ``jupyter agentruns doctor`` reports of the database itself.

        ``schema_version`` (and ``schema_versions_known``: this package's
        latest), ``runs_by_status`` (every owner's), and ``versions`` of the
        database and its driver.
        """

    @abc.abstractmethod
    def expired_active_runs(self, now: float) -> list[RunRow]:
        """Runs not yet terminal whose executor's lease has run out (full rows).

        Not the runs queued in their session (no executor holds them yet).
        """

    @abc.abstractmethod
    def active_in_session(self, owner: str, session: str) -> list[ActiveRun]:
        """``run_id, status, executor_id, cancel_request`` of the session's active runs, in submit order."""

    @abc.abstractmethod
    def queued_behind(self, run_id: str) -> str | None:
        """For a run waiting in its session's queue: the oldest earlier active run of the session."""

    @abc.abstractmethod
    def startable_queued_runs(
        self, owners: list[str] | None, agents: list[str], limit: int = 100
    ) -> list[RunRow]:
        """Unclaimed queued runs (``executor_id`` None) with no earlier active run in their session.

        Full rows, in submit order, of the ``owners`` (None: every owner) and
        of the ``agents`` named: what a server serving those owners with those
        agents may claim and start.
        """

    @abc.abstractmethod
    def usage_since(self, owner: str, since: str) -> list[tuple[str, str, int, int]]:
        """``(run_id, created_at, input_tokens, output_tokens)`` of the owner's runs since ``since``.

        Runs created at or after it, oldest first.
        """

    # Writes (inside transaction()) ---------------------------------------------

    @abc.abstractmethod
    def release_claims(self, run_ids: list[str], executor_id: str) -> None:
        """Put claimed runs that never started back in their session's queue."""

    @abc.abstractmethod
    def record_input_answer(
        self, run_id: str, request_id: str, answer: InputAnswer, now: float
    ) -> InputAnswer:
        """Keep an answer (``choice, note, by``) for the server executing the run; the first one wins.

        Returns the answer kept: this one, or the one recorded before it.
        """

    @abc.abstractmethod
    def take_input_answers(self, executor_id: str) -> list[tuple[str, str, InputAnswer]]:
        """``(run_id, request_id, answer)`` recorded for this executor's runs, taken (deleted)."""

    @abc.abstractmethod
    def release_run(self, run_id: str, executor_id: str) -> None:
        """Let go of a run this executor holds (a clean shutdown): the next server takes it over."""

    @abc.abstractmethod
    def claim_run(self, run_id: str, executor_id: str, lease_expires: float) -> bool:
        """Take an unclaimed queued run for this executor; False when another server took it first."""

    @abc.abstractmethod
    def insert_run(self, run: RunFields) -> None: ...

    @abc.abstractmethod
    def insert_key(
        self,
        owner: str,
        key: str,
        fingerprint: str,
        run_id: str,
        now: float,
        with_run: bool = False,
    ) -> None: ...

    @abc.abstractmethod
    def update_run(self, run_id: str, fields: RunFields) -> None:
        """Set columns of a run; ``snapshot`` with ``snapshot_seq`` replaces its persisted snapshot.

        The snapshot (a dict or a ``reducer.Snapshot`` builder) is written in
        parts of about a megabyte as it is encoded: its text is never joined.
        """

    @abc.abstractmethod
    def append_events(self, rows: Iterable[EventRow]) -> None:
        """Append ``(run_id, seq, type, ts, data)``; raises ``SeqTaken`` when a seq exists."""

    @abc.abstractmethod
    def set_last_seqs(self, pairs: list[tuple[int, str]]) -> None:
        """``(last_seq, run_id)``: the only change events without one of their own imply."""

    @abc.abstractmethod
    def delete_events_before(self, run_id: str, seq: int, limit: int) -> int: ...

    @abc.abstractmethod
    def bury(self, run_id: str, owner: str, now: float) -> bool:
        """Delete a run for retention, leaving a tombstone (410, not 404).

        False when the run was gone already (another server sharing the
        store buried it first).
        """

    @abc.abstractmethod
    def delete_run(self, run_id: str) -> bool:
        """Delete a run and all it has; False when there was no such run."""

    @abc.abstractmethod
    def renew_leases(self, executor_id: str, run_ids: list[str], expires: float) -> None: ...

    @abc.abstractmethod
    def record_cancel_request(self, run_id: str, request: CancelRequest) -> None:
        """A cancel for the server that executes the run, which takes it with ``take_cancel_requests``."""

    @abc.abstractmethod
    def take_cancel_requests(self, executor_id: str) -> list[tuple[str, CancelRequest]]: ...

    @abc.abstractmethod
    def purge_keys(self, older_than: float, limit: int = 5000) -> None: ...

    # Webhooks (writes inside transaction()) -------------------------------------
    #
    # ``append_events`` also writes the outbox: a delivery of each event a hook
    # wants (``run.*`` ends and ``input.requested``), in the same transaction.

    @abc.abstractmethod
    def set_server_hooks(self, hooks: list[dict[str, Any]]) -> None:
        """Make the servers' own hooks (owner NULL) these: ``hook_id, url, events, format, secret_env, created_at``."""

    @abc.abstractmethod
    def insert_hook(self, hook: dict[str, Any]) -> None:
        """A user's hook: ``hook_id, owner, url, events, format, secret, created_at``."""

    @abc.abstractmethod
    def list_hooks(self, owner: str) -> list[dict[str, Any]]:
        """The owner's hooks, oldest first (with their secrets: the caller leaves them out)."""

    @abc.abstractmethod
    def get_hook(self, hook_id: str) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    def delete_hook(self, owner: str, hook_id: str) -> bool:
        """Delete the owner's hook and its deliveries; False when the owner has no such hook."""

    @abc.abstractmethod
    def list_deliveries(self, hook_id: str, limit: int) -> list[dict[str, Any]]:
        """The hook's deliveries, newest first."""

    @abc.abstractmethod
    def due_deliveries(self, now: float) -> bool:
        """Whether a delivery waits to be attempted now (a read: no claim)."""

    @abc.abstractmethod
    def claim_deliveries(self, now: float, until: float, limit: int) -> list[dict[str, Any]]:
        """Claim due deliveries until ``until``, each the earliest still pending of its hook and run.

        With their hook's ``url, format, secret, secret_env`` (None: the hook
        is gone) and the run's ``owner`` (None: the run is gone). A delivery
        another server claimed, and whose claim has not run out, is not taken.
        """

    @abc.abstractmethod
    def finish_delivery(
        self, delivery_id: str, now: float, error: str | None, next_attempt: float | None
    ) -> None:
        """Record an attempt: delivered (no ``error``), to try again at ``next_attempt``, or given up."""

    # Schedules ---------------------------------------------------------------
    # A schedule is a dict: schedule_id, owner, agent, input (decoded), cron,
    # timezone, session, paused (bool), created_at, last_slot (the newest slot
    # handled, UTC ISO time), skipped, skips (decoded list), last_error.

    @abc.abstractmethod
    def insert_schedule(self, schedule: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    def get_schedule(self, schedule_id: str) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    def list_schedules(self, owner: str | None) -> list[dict[str, Any]]:
        """The owner's schedules, oldest first (None: every owner's that is not paused)."""

    @abc.abstractmethod
    def set_schedule_paused(self, schedule_id: str, paused: bool, last_slot: str | None) -> None:
        """Pause or resume; ``last_slot`` (when given) replaces the newest slot handled."""

    @abc.abstractmethod
    def delete_schedule(self, schedule_id: str) -> bool: ...

    @abc.abstractmethod
    def advance_schedule(
        self,
        schedule_id: str,
        from_slot: str,
        to_slot: str,
        skipped: int,
        skips: list[dict[str, Any]] | None,
        last_error: str | None,
    ) -> bool:
        """Move the newest slot handled from ``from_slot`` to ``to_slot``, if no one did.

        False when the schedule is gone, paused, or its ``last_slot`` is no longer
        ``from_slot`` (another server handled the slot first): nothing changes.
        """

    @abc.abstractmethod
    def schedule_runs(self, owner: str, schedule_id: str, limit: int) -> list[dict[str, Any]]:
        """The newest runs a schedule made (found by their idempotency keys), newest first."""


class Store(abc.ABC):
    """A place runs are kept, shared by every server configured with it."""

    # Reads cost microseconds (a local file, no network): bounded ones may run on the event loop.
    local_reads: bool = False
    # The schema version this package's migrations bring a store to.
    schema_versions_known: int

    @abc.abstractmethod
    def connect(self) -> StoreConnection:
        """A new connection (each thread that reads or writes has its own).

        The first one brings the store's schema to ``schema_versions_known``.
        """

    @abc.abstractmethod
    def schema_version(self) -> int:
        """The schema version the store holds, read without migrating it (0: no store yet).

        The servers using a store migrate it at their start. A command line of
        a newer package than theirs checks this first: migrating the store
        under a running older server would change its tables beneath it.
        """

    @abc.abstractmethod
    def migrate(self) -> None:
        """Create the store, or bring its schema to ``schema_versions_known``, now."""

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the store is, for the server log (never with credentials)."""

    def listen(self, on_change: Callable[[dict[str, int] | None], None]) -> Listener | None:
        """Call ``on_change`` (from a thread of the store's) after other servers' commits.

        With ``{run_id: last_seq}`` of the runs a commit appended to, or None
        when anything may have changed (a reconnect). None: the store cannot,
        and its readers poll ``change_token`` instead.
        """
        return None


class Listener(abc.ABC):
    """Notifications of other servers' commits, until closed."""

    @abc.abstractmethod
    def close(self) -> None: ...


def reduce_stored(
    conn: StoreConnection, run_id: str, snapshot: reducer.Snapshot, after: int, upto: int
) -> reducer.Snapshot:
    """Apply the stored events ``after < seq <= upto`` of a run to ``snapshot``."""
    while after < upto:
        rows = conn.read_events(run_id, after, 5000, upto)
        if not rows:
            break
        for _seq, type, _ts, data in rows:
            snapshot.apply({"type": type, "data": json.loads(data)})
        after = rows[-1][0]
    return snapshot


def commit_transitions(
    conn: StoreConnection,
    row: RunRow,
    transitions: list[lifecycle.Transition],
    snapshot: reducer.Snapshot | None = None,
) -> tuple[list[EventRow], reducer.Snapshot]:
    """Commit ``transitions`` of a run no executor holds, with the run columns they set.

    In the caller's transaction. ``snapshot``: the run's, up to its
    ``last_seq`` (reduced from the store when not given). A terminal
    transition persists the snapshot with it. Returns the event rows
    appended, ``(run_id, seq, type, ts, data)``, and the snapshot after them.
    """
    run_id, seq = row["run_id"], row["last_seq"]
    if snapshot is None:
        snapshot = reduce_stored(
            conn, run_id, reducer.Snapshot(row["snapshot"]), row["snapshot_seq"], seq
        )
    # An end's events carry its finished_at.
    ts = transitions[-1].fields.get("finished_at") or now_iso()
    rows: list[EventRow] = []
    fields: RunFields = {}
    for transition in transitions:
        seq += 1
        rows.append((run_id, seq, transition.type, ts, jsonio.dumps(transition.data, compact=True)))
        snapshot.apply({"type": transition.type, "data": transition.data})
        fields.update(cast(RunFields, transition.fields))
    conn.append_events(rows)
    fields["last_seq"] = seq
    if transitions[-1].terminal:
        fields["snapshot"] = snapshot
        fields["snapshot_seq"] = seq
    conn.update_run(run_id, fields)
    return rows, snapshot


def end_stored(conn: StoreConnection, row: RunRow, end: lifecycle.Transition) -> list[EventRow]:
    """End a run no executor holds with ``end``, what it left open closed first (``lifecycle.ending``)."""
    snapshot = reduce_stored(
        conn, row["run_id"], reducer.Snapshot(row["snapshot"]), row["snapshot_seq"], row["last_seq"]
    )
    transitions = lifecycle.ending(snapshot.structure(), end)
    return commit_transitions(conn, row, transitions, snapshot)[0]
