"""Every Prometheus metric of agentruns, defined once, in one place.

jupyter_server serves ``/metrics`` from prometheus_client's default registry;
these join it. They are made at import, once per process: several servers
in one process (a test session) share them, so a reader compares values
before and after, never absolute counts, for the counters.

Two kinds of figures:

- Counters and histograms, bumped where things happen: per commit, per run,
  per stream, never per event (the writer appends tens of thousands of events
  a second).
- Gauges sampled when ``/metrics`` is scraped (``Sampled``): the scrape runs
  on the event loop and calls collectors synchronously, so a sampled gauge
  only reads figures already in memory (a queue's length, a count the server
  read from its store earlier, off the loop). Each server reports its own
  through ``Sampled.track``; a gauge adds up (or takes the largest of) the
  servers of the process.

Labels take a few fixed values each (a status, an outcome, a kind of stream);
never a run id, an owner or anything else per run or per user.

This module imports nothing of the package: every layer may use it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

# The values each label takes: every series exists from the start, at 0.
OUTCOMES = ("cancelled", "failed", "interrupted", "succeeded")  # the terminal statuses
RESUME_REASONS = ("lease_expired", "server_shutdown")
DELETE_REASONS = ("request", "retention")
STREAM_KINDS = ("page", "poll", "run")

# Runs ------------------------------------------------------------------

RUNS_STARTED = Counter(
    "agentruns_runs_started",
    "Runs this server started executing (their run.started event committed). A run taken "
    "over from another executor counts in agentruns_runs_resumed_total instead.",
)
RUNS_FINISHED = Counter(
    "agentruns_runs_finished",
    "Runs whose terminal event this server committed, by outcome (succeeded, failed, "
    "cancelled, interrupted): the runs it executed, and those it ended for a server that "
    "stopped or in their session's queue.",
    ["outcome"],
)
RUNS_RESUMED = Counter(
    "agentruns_runs_resumed",
    "Runs this server took over from an executor that was gone (run.resumed committed), "
    "by reason: lease_expired (its server died or hung) or server_shutdown (its server "
    "stopped and handed it over).",
    ["reason"],
)
RUNS_HANDED_OVER = Counter(
    "agentruns_runs_handed_over",
    "Resumable runs this server released at its shutdown, for the next server to take over.",
)
LEASES_EXPIRED = Counter(
    "agentruns_leases_expired",
    "Runs of another executor whose lease this server found expired and acted on: taken "
    "over, or ended interrupted.",
)
LEASES_LOST = Counter(
    "agentruns_leases_lost",
    "Runs this server was executing whose events the store refused: its lease had expired "
    "and another server ended or took over the run.",
)
RUNS_DELETED = Counter(
    "agentruns_runs_deleted",
    "Runs this server deleted, by reason: retention (finished longer ago than "
    "run_retention_seconds) or request (DELETE runs/{id}).",
    ["reason"],
)

# The event log and its writer -------------------------------------------

EVENTS_APPENDED = Counter(
    "agentruns_events_appended",
    "Events this server committed to the store: its runs' events, and the events it wrote "
    "for runs it ended or took over.",
)
EVENTS_COMPACTED = Counter(
    "agentruns_events_compacted",
    "Events folded into their run's snapshot and deleted (event_retention_seconds, "
    "max_retained_events).",
)
COMMITS = Counter(
    "agentruns_commits",
    "Transactions the store writer committed (one per batch of whatever was queued).",
)
COMMIT_EVENTS = Histogram(
    "agentruns_commit_events",
    "Events per commit of the store writer: its runs' queued events (0 for a commit of "
    "other writes only, such as a submit or a lease renewal).",
    buckets=(0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
)
COMMIT_SECONDS = Histogram(
    "agentruns_commit_duration_seconds",
    "Seconds the store writer took to write and commit one batch (the attempt that "
    "committed; retries after a busy store are not included).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)

# Streams -------------------------------------------------------------

OPEN_STREAMS = Gauge(
    "agentruns_open_streams",
    "Connections holding one of the owners' max_streams_per_user slots, by kind: run (SSE "
    "of GET runs/{id}/events), page (SSE of GET streams) or poll (a JSON long-poll "
    "waiting for events).",
    ["kind"],
)

for _metric, _values in (
    (RUNS_FINISHED, OUTCOMES),
    (RUNS_RESUMED, RESUME_REASONS),
    (RUNS_DELETED, DELETE_REASONS),
    (OPEN_STREAMS, STREAM_KINDS),
):
    for _value in _values:
        _metric.labels(_value)


class Sampled:
    """A gauge read when scraped, from the objects that report it (``track``).

    Each tracked object is held weakly: a server gone is no longer counted,
    whether or not it said goodbye (``untrack``). ``read(obj)`` returns a
    number, or ``{label value: number}`` for a gauge with one label; the
    gauge is the sum of the objects' figures, or the largest with
    ``combine=max``.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        label: str | None = None,
        combine: Callable[[Iterable[float]], float] = sum,
    ):
        self.name = name
        self.documentation = documentation
        self.label = label
        self._combine = combine
        self._sources: weakref.WeakKeyDictionary[Any, Callable[[Any], Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def track(self, source: Any, read: Callable[[Any], float | Mapping[str, float]]) -> None:
        """Report ``read(source)`` while ``source`` lives (``read`` must not hold it itself)."""
        with self._lock:
            self._sources[source] = read

    def untrack(self, source: Any) -> None:
        with self._lock:
            self._sources.pop(source, None)

    def family(self) -> GaugeMetricFamily:
        with self._lock:
            figures = [read(source) for source, read in list(self._sources.items())]
        if self.label is None:
            family = GaugeMetricFamily(self.name, self.documentation)
            family.add_metric([], self._combine(figures) if figures else 0)
            return family
        family = GaugeMetricFamily(self.name, self.documentation, labels=[self.label])
        values: dict[str, list[float]] = {}
        for figure in figures:
            for value, number in figure.items():
                values.setdefault(value, []).append(number)
        for value, numbers in sorted(values.items()):
            family.add_metric([value], self._combine(numbers))
        return family


class SampledCollector:
    """Sampled gauges as the registry sees them: read at each scrape."""

    def __init__(self, gauges: list[Sampled]):
        self._gauges = gauges

    def collect(self) -> list[GaugeMetricFamily]:
        return [gauge.family() for gauge in self._gauges]


# A scrape that finds the count of the store's runs by status older than
# this asks for a new one (agentruns_runs): it reports the last count.
RUN_COUNT_SECONDS = 2.0

RUNS = Sampled(
    "agentruns_runs",
    f"Runs in the store by status, of the owners this server serves (served_owners: on a "
    "hub user's server, that user's runs), as it last counted them (on a reader thread, "
    f"when a scrape found the last count over {RUN_COUNT_SECONDS:g} s old: a scrape reports "
    "the count the one before it asked for). With store_wide_metrics, every run of the "
    "store: servers sharing one store then report the same runs, so aggregate them with "
    "max, not sum.",
    label="status",
)
EXECUTING_RUNS = Sampled(
    "agentruns_executing_runs",
    "Runs this server is executing now (their agent's task is here).",
)
WRITER_QUEUE_EVENTS = Sampled(
    "agentruns_writer_queue_events",
    "Events queued for the store writer and not yet committed; at the queue's bound "
    "agents wait (backpressure).",
)
WRITER_QUEUE_BYTES = Sampled(
    "agentruns_writer_queue_bytes",
    "Bytes of the events queued for the store writer and not yet committed.",
)
SUBSCRIBERS = Sampled(
    "agentruns_subscribers",
    "Cursors following a run for a client now: one per run of an open SSE stream (a page "
    "stream has one per run it follows) and per JSON request being answered.",
)
SUBSCRIBER_MAX_LAG = Sampled(
    "agentruns_subscriber_max_lag_events",
    "The largest lag among the subscribers of runs this server executes: the events of "
    "the run committed after the subscriber's cursor, not yet handed to its client.",
    combine=max,
)
REGISTRY.register(
    SampledCollector(
        [
            RUNS,
            EXECUTING_RUNS,
            WRITER_QUEUE_EVENTS,
            WRITER_QUEUE_BYTES,
            SUBSCRIBERS,
            SUBSCRIBER_MAX_LAG,
        ]
    )
)
