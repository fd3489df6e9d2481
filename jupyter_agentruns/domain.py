"""The shapes of the domain's data: a run as the store keeps it and as the API answers it, its events.

Types only, for mypy: at run time a run is a plain dict and an event row a
plain tuple, as they always were (``TypedDict`` costs nothing per object).
The wire format of an event in flight is ``events.py``'s.
"""

from __future__ import annotations

from typing import Any, TypeAlias, TypedDict

# A value JSON can carry (decoded: ``json.loads`` gives one).
JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"
# A JSON object: a body, a run's metadata, a snapshot.
JSONObject: TypeAlias = "dict[str, JSON]"


class ForkedFrom(TypedDict):
    """The run a fork was started from, and the last event of it that the fork carries on from."""

    run_id: str
    seq: int


class RunHead(TypedDict):
    """What answering for a run needs, read whatever the run's size (``get_run_head``)."""

    run_id: str
    owner: str
    status: str
    last_seq: int
    first_seq: int
    finished_ts: float | None


class ListedRun(RunHead):
    """A run's row in the ``runs`` table, JSON columns decoded: what ``list_runs`` reads."""

    agent: str
    session: str | None
    metadata: JSONObject | None
    input: JSON
    retry_of: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    output: JSON
    error: JSON
    cancel: JSON
    executor_id: str | None
    lease_expires: float | None
    cancel_request: CancelRequest | None
    input_tokens: int
    output_tokens: int
    attempt: int
    checkpoint: JSON
    resumable: int | None
    conversation_title: str | None
    trace_context: str | None  # the W3C traceparent of its latest attempt's span (``tracing``)
    forked_from: ForkedFrom | None


class RunRow(ListedRun):
    """A run as ``get_run`` reads it: its row and its persisted snapshot (``snapshot_seq`` 0, none yet)."""

    snapshot_seq: int
    # The snapshot's dict (a placeholder text where an answer splices the stored JSON in).
    snapshot: Any


class RunFields(TypedDict, total=False):
    """Columns of a run to insert or set; ``snapshot`` with ``snapshot_seq`` replaces its persisted snapshot.

    The snapshot is a dict or a ``reducer.Snapshot`` builder (written as it is encoded).
    """

    run_id: str
    owner: str
    agent: str
    status: str
    session: str | None
    metadata: JSONObject | None
    input: JSON
    retry_of: str | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    finished_ts: float | None
    last_seq: int
    first_seq: int
    output: JSON
    error: JSON
    cancel: JSON
    executor_id: str | None
    lease_expires: float | None
    cancel_request: CancelRequest | None
    input_tokens: int
    output_tokens: int
    attempt: int
    checkpoint: JSON
    resumable: int | None
    conversation_title: str | None
    trace_context: str | None
    forked_from: ForkedFrom | None
    snapshot_seq: int
    snapshot: Any


class RunObject(TypedDict):
    """The run object the API answers with (``GET runs/{id}``, a page of ``GET runs``, a submit)."""

    run_id: str
    agent: str
    status: str
    session: str | None
    metadata: JSONObject
    input: JSON
    retry_of: str | None
    forked_from: ForkedFrom | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    last_seq: int
    first_seq: int
    attempt: int
    title: str
    snapshot: Any  # the reducer's snapshot (``reducer.empty_snapshot`` and the events after it)
    output: JSON
    error: JSON
    cancel: JSON
    queued_behind: str | None
    last_event_at: str | None


class ListedConversation(TypedDict):
    """A conversation as ``list_conversations`` reads it: an owner's runs of one session and agent."""

    session: str
    agent: str
    runs: int  # how many runs it holds
    last_run_id: str
    updated_at: str  # its newest run's ``created_at``
    first_metadata: JSONObject | None  # of its first run: what its title is made of
    first_input: JSON
    title: str | None  # the newest its agent gave it (None: none), before the first run's


class Conversation(TypedDict):
    """A conversation as the API answers it (``GET conversations``)."""

    session: str
    agent: str
    title: str
    runs: int
    last_run_id: str
    updated_at: str


class ActiveRun(TypedDict):
    """A run not yet ended in a session, as a submit's session policy weighs it."""

    run_id: str
    status: str
    executor_id: str | None
    cancel_request: CancelRequest | None


class KeyRow(TypedDict):
    """An Idempotency-Key the store remembers, and the run it made."""

    owner: str
    key: str
    fingerprint: str
    run_id: str
    created_ts: float
    with_run: int


class Tombstone(TypedDict):
    """What is left of a run retention deleted (a read of it answers 410, not 404)."""

    run_id: str
    owner: str
    deleted_ts: float


class CancelRequest(TypedDict):
    """A cancel recorded for the server executing the run, which takes it at its next lease upkeep."""

    reason: JSON
    requested_at: str


class InputAnswer(TypedDict):
    """A person's answer to a run's question, as recorded for the server executing the run."""

    choice: str | None
    note: str | None
    by: str | None


class EventRecord(TypedDict):
    """An event as the reducer takes it: its type and its decoded data."""

    type: str
    data: Any  # the event's data object (``docs/reference/events.md``)


class LoggedEvent(EventRecord):
    """An event of a run's log, decoded (what a resumed agent's ``run.history()`` reads)."""

    seq: int
    ts: str


# An event's row as the store inserts it: ``(run_id, seq, type, ts, data)``, ``data`` its JSON.
EventRow: TypeAlias = tuple[str, int, str, str, str]
# An event as the store reads it back for one run: ``(seq, type, ts, data)``.
StoredEvent: TypeAlias = tuple[int, str, str, str]
