"""What the engine's store operations wrote outside the writer's event queue, for the metrics."""

from __future__ import annotations

from .. import lifecycle, metrics
from ..events import EVENT, TYPE, Append


class Tally:
    """Counted once the operation committed (``count``).

    The writer runs an operation again when its batch is retried: it starts with ``clear()``.
    """

    __slots__ = ("events", "finished", "resumed", "leases_expired")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.events = 0
        self.finished: list[str] = []  # the outcomes of the runs it ended
        self.resumed: list[str] = []  # the reasons of the runs it took over
        self.leases_expired = 0

    def ended(self, rows: list, status: str) -> None:
        """A run ended with ``rows`` appended (see ``store.commit_transitions``)."""
        self.events += len(rows)
        self.finished.append(status)

    def count(self) -> None:
        if self.events:
            metrics.EVENTS_APPENDED.inc(self.events)
        for outcome in self.finished:
            metrics.RUNS_FINISHED.labels(outcome).inc()
        for reason in self.resumed:
            metrics.RUNS_RESUMED.labels(reason).inc()
        if self.leases_expired:
            metrics.LEASES_EXPIRED.inc(self.leases_expired)


def count_runs_in_commit(items: list[Append]) -> None:
    """A run's committed events in the metrics: did it start, did it end (two looks a batch)."""
    if items[0][EVENT][TYPE] == "run.started":
        metrics.RUNS_STARTED.inc()
    outcome = lifecycle.TERMINAL_EVENTS.get(items[-1][EVENT][TYPE])
    if outcome is not None:
        metrics.RUNS_FINISHED.labels(outcome).inc()
