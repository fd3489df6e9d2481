"""The scenarios: each measures the engine and its baseline in the same run and adds rows.

A scenario gets the ``Bench`` (sizes, repetitions, servers) and returns
nothing: it calls ``bench.add(Row(...))`` for each figure it prints.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from array import array
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_agentruns.timeutil import now_iso

from . import clients, database
from .agents import delta
from .servers import BareServer, EngineServer, cpu_seconds, proc_status, reset_peak_rss

TERMINAL = ("succeeded", "failed", "cancelled", "interrupted")


@dataclass(frozen=True)
class Sizes:
    sqlite_rows: int
    append_events: int
    append_max_seconds: float
    runs: int
    events_per_run: int
    latency_events: int
    fanout_clients: tuple[int, ...]
    fanout_events: int
    big_events: int
    small_events: int
    resume_samples: int
    idle_connections: int
    per_message: int = 1000
    rate: int = 1000
    memory_events: int = 100_000
    memory_settle_seconds: float = 60
    # PostgreSQL (bench/postgres.py).
    pg_rows: int = 100_000
    pg_resume_events: tuple[int, int] = (1_000_000, 10_000)
    pg_resume_samples: int = 200
    pg_servers: tuple[int, ...] = (1, 2, 3)
    pg_runs_per_server: int = 50
    pg_events_per_run: int = 2_000


FULL = Sizes(
    sqlite_rows=200_000,
    append_events=200_000,
    append_max_seconds=5.0,
    runs=100,
    events_per_run=2_000,
    latency_events=3_000,
    fanout_clients=(100, 1000),
    fanout_events=3_000,
    big_events=1_000_000,
    small_events=1_000,
    resume_samples=11,
    idle_connections=1000,
)
QUICK = Sizes(
    sqlite_rows=20_000,
    append_events=20_000,
    append_max_seconds=1.0,
    runs=100,
    events_per_run=200,
    latency_events=500,
    fanout_clients=(100, 200),
    fanout_events=500,
    big_events=50_000,
    small_events=1_000,
    resume_samples=5,
    idle_connections=200,
    memory_events=20_000,
    memory_settle_seconds=5,
    pg_rows=20_000,
    pg_resume_events=(100_000, 10_000),
    pg_resume_samples=10,
    pg_servers=(1, 2),
    pg_runs_per_server=10,
    pg_events_per_run=500,
)


@dataclass
class Row:
    """One printed figure: the engine's value, its baseline, the target and whether it is met."""

    scenario: str
    label: str
    value: float | None
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    target: str = ""
    ok: bool | None = None
    note: str = ""
    samples: list[float] = field(default_factory=list)
    baseline_samples: list[float] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def median(values) -> float:
    return statistics.median(values)


def percentile(sorted_values, fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def k(value: float) -> str:
    return f"{value / 1000:,.1f}k"


# What the coordinator reads without asking the server ------------------------


def run_state(db_path: Path, run_ids: list[str]) -> dict[str, tuple[str, int, int]]:
    """``run_id -> (status, last_seq, first_seq)`` read straight from SQLite.

    Asking the server would cost it work (a finished run's row carries its
    whole snapshot) and disturb what is being measured.
    """
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        marks = ",".join("?" for _ in run_ids)
        rows = conn.execute(
            f"SELECT run_id, status, last_seq, first_seq FROM runs WHERE run_id IN ({marks})",
            run_ids,
        ).fetchall()
    finally:
        conn.close()
    return {row[0]: row[1:] for row in rows}


def wait_until(done, timeout: float, what: str, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval)


def all_exist(paths: list[Path]) -> bool:
    return all(path.exists() for path in paths)


def server_run_state(server: EngineServer, run_ids: list[str]) -> dict[str, tuple[str, int, int]]:
    if server.store_url:
        return database.run_state(server.store_url, run_ids)
    return run_state(server.db_path, run_ids)


def wait_terminal(server: EngineServer, run_ids: list[str], timeout: float = 900) -> None:
    def done() -> bool:
        states = server_run_state(server, run_ids)
        failed = [
            run_id
            for run_id, (status, _, _) in states.items()
            if status in TERMINAL and status != "succeeded"
        ]
        if failed:
            raise RuntimeError(
                f"bench runs ended unsuccessfully: {failed}; server log:\n{server.log_tail()}"
            )
        return len(states) == len(run_ids) and all(s[0] == "succeeded" for s in states.values())

    wait_until(done, timeout, f"{len(run_ids)} run(s) to finish", interval=0.05)


class RssSampler:
    """The server's RSS before a measurement and its peak during it (``VmHWM``, reset at start)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.before = proc_status(pid, "VmRSS")
        self.peak = self.before
        reset_peak_rss(pid)

    def stop(self) -> RssSampler:
        self.peak = proc_status(self.pid, "VmHWM")
        return self

    @property
    def growth(self) -> int:
        return self.peak - self.before


# The bench: servers, sizes, rows --------------------------------------------


class Bench:
    def __init__(self, sizes: Sizes, repeat: int, profiler=None):
        self.sizes = sizes
        self.repeat = repeat
        self.profiler = profiler
        self.rows: list[Row] = []
        self.root = Path(tempfile.mkdtemp(prefix="agentruns-bench-"))
        self._servers: dict[str, EngineServer] = {}
        self._bare: BareServer | None = None
        self._big: dict[str, Any] | None = None
        self._database: database.Database | None = None

    def add(self, row: Row) -> None:
        self.rows.append(row)
        say(format_row(row))

    def path(self, stem: str) -> Path:
        return self.root / f"{stem}-{uuid.uuid4().hex[:8]}"

    def new_server(self, name: str, **config) -> EngineServer:
        home = self.root / f"{name}-{uuid.uuid4().hex[:6]}"
        server = EngineServer(home, home / "agentruns.sqlite3", config)
        server.start()
        server.http = server.client()
        return server

    def server(self, name: str, **config) -> EngineServer:
        """A server shared by the scenarios that name it, started on first use."""
        if name not in self._servers:
            self._servers[name] = self.new_server(name, **config)
        return self._servers[name]

    def bare(self) -> BareServer:
        if self._bare is None:
            self._bare = BareServer().start()
        return self._bare

    def postgres(self) -> database.Database:
        """The bench's own PostgreSQL database, created on first use (its ``reason`` if none)."""
        if self._database is None:
            self._database = database.Database.open()
            if self._database.reason is None:
                say(f"  PostgreSQL {self._database.version}: database {self._database.name}")
        return self._database

    def profile(self, server: EngineServer, scenario: str):
        return self.profiler.record(server.pid, scenario) if self.profiler else nullcontext()

    def close(self) -> None:
        for server in self._servers.values():
            server.http.close()
            server.stop()
        if self._bare is not None:
            self._bare.stop()
        if self._database is not None:
            self._database.drop()
        for path in sorted(self.root.rglob("*"), reverse=True):
            path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
        self.root.rmdir()

    # Runs of the flood agent ------------------------------------------------

    def submit(self, server: EngineServer, agent: str, input: dict) -> str:
        response = server.http.post("runs", json={"agent": agent, "input": input})
        if response.status_code != 201:
            raise RuntimeError(f"submit answered {response.status_code}: {response.text}")
        return response.json()["run_id"]

    def flood(self, server: EngineServer, events: int, **input) -> tuple[str, Path]:
        """Submit a flood run; returns its id and the file its report will be written to."""
        report = self.path("report")
        run_id = self.submit(server, "flood", {"events": events, "report": str(report), **input})
        return run_id, report

    def sqlite_sample(self) -> float:
        """One measurement of the baseline: raw executemany, 1,000 rows a commit, WAL, NORMAL."""
        return sqlite_append_rate(self.path("baseline"), self.sizes.sqlite_rows)

    def big_runs(self) -> dict[str, Any]:
        """A finished run of ``big_events`` text deltas and one of ``small_events``, made once.

        The big run is the first on its server, so the server's RSS growth
        while it is made says what such a run costs in memory.
        """
        if self._big is None:
            sizes = self.sizes
            server = self.server("big", sqlite_synchronous="NORMAL")
            say(
                f"  making the {sizes.big_events:,}-event run "
                f"(text deltas, {sizes.per_message:,} a message)…"
            )
            run_id, report, rss = self.run_with_rss(server, sizes.big_events)
            small_id, _ = self.flood(server, sizes.small_events, per_message=sizes.per_message)
            wait_terminal(server, [small_id])
            self._big = {"server": server, "big": run_id, "small": small_id}
            producer = report["events"] / report["seconds"]
            self.add(Row(
                "big-run", f"making the {sizes.big_events:,}-event text run", producer, "ev/s",
                note=f"text deltas, {sizes.per_message:,} a message, fresh server; server RSS grew "
                     f"{rss.growth / 2**20:.0f} MB (the run's snapshot holds all its text)",
                details={"rss_growth_mb": rss.growth / 2**20, "seconds": report["seconds"]},
            ))  # fmt: skip
        return self._big

    def run_with_rss(
        self, server: EngineServer, events: int, before_go=None, per_message=None, **input
    ):
        """A big flood run, with the server's RSS watched.

        The run starts once ``before_go(run_id)`` has run.
        """
        go = self.path("go")
        run_id, report_path = self.flood(
            server, events, per_message=per_message or self.sizes.per_message, go=str(go), **input
        )
        if before_go is not None:
            before_go(run_id)
        time.sleep(0.2)
        rss = RssSampler(server.pid)
        go.touch()
        wait_until(report_path.exists, 1800, "the flood agent's report", interval=0.05)
        wait_terminal(server, [run_id])
        time.sleep(0.3)  # the terminal snapshot is encoded and written after the report
        rss.stop()
        report = json.loads(report_path.read_text())
        return run_id, report, rss


def say(text: str) -> None:
    print(text, flush=True)


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "ev/s":
        return f"{k(value)} ev/s"
    if unit == "ms":
        return f"{value:.2f} ms" if value < 100 else f"{value:,.0f} ms"
    if unit == "MB":
        return f"{value:,.1f} MB"
    if unit == "KB":
        return f"{value:,.1f} KB"
    return f"{value:,.3g} {unit}"


def format_row(row: Row) -> str:
    verdict = {True: "PASS", False: "MISS", None: ""}[row.ok]
    parts = [f"  {row.label}: {format_value(row.value, row.unit)}"]
    if row.baseline is not None:
        parts.append(f"baseline {format_value(row.baseline, row.unit)}")
    if row.ratio is not None:
        parts.append(f"ratio {row.ratio:.2f}×")
    if row.target:
        parts.append(f"target {row.target}")
    if verdict:
        parts.append(verdict)
    text = ", ".join(parts)
    return text + (f"  ({row.note})" if row.note else "")


# Baseline: raw SQLite ---------------------------------------------------------

EVENTS_SCHEMA = """
CREATE TABLE events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL,
    ts TEXT NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID
"""


def sqlite_append_rate(path: Path, count: int, per_commit: int = 1000) -> float:
    """Rows/s of raw ``executemany`` into the engine's events table: 1,000 a commit, WAL, NORMAL."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(EVENTS_SCHEMA)
    run_id, ts = "run_" + uuid.uuid4().hex[:22], now_iso()
    rows = [
        (
            run_id,
            seq,
            "text.delta",
            ts,
            json.dumps({"message_id": "m1", "delta": delta(100)}, separators=(",", ":")),
        )
        for seq in range(1, count + 1)
    ]
    start = time.perf_counter()
    for first in range(0, count, per_commit):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO events VALUES (?, ?, ?, ?, ?)", rows[first : first + per_commit]
        )
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return count / elapsed


# Scenarios --------------------------------------------------------------------


def append(bench: Bench) -> None:
    """Durable append throughput of one run emitting 100-byte text deltas as fast as it can."""
    sizes = bench.sizes
    normal = bench.server("normal", sqlite_synchronous="NORMAL")
    full = bench.server("full", sqlite_synchronous="FULL")
    variants = [
        ("text", normal, {}),
        ("x.delta", normal, {"custom": True}),
        ("FULL", full, {}),
    ]
    samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    counts: dict[str, list[int]] = {name: [] for name, _, _ in variants}
    baseline: list[float] = []
    with bench.profile(normal, "append"):
        for rep in range(bench.repeat):
            baseline.append(bench.sqlite_sample())
            for name, server, extra in variants:
                run_id, report_path = bench.flood(
                    server, sizes.append_events, max_seconds=sizes.append_max_seconds, **extra
                )
                wait_until(report_path.exists, 600, "the flood agent's report")
                wait_terminal(server, [run_id])
                report = json.loads(report_path.read_text())
                samples[name].append(report["events"] / report["seconds"])
                counts[name].append(report["events"])
            say(
                f"  rep {rep + 1}/{bench.repeat}: sqlite {k(baseline[-1])}, "
                + ", ".join(
                    f"{name} {k(values[-1])} ({counts[name][-1]:,} ev)"
                    for name, values in samples.items()
                )
            )
    base = median(baseline)
    capped = f"up to {sizes.append_events:,} deltas or {sizes.append_max_seconds:g} s"
    labels = {
        "text": ("append, 1 run", True, f"NORMAL, one message, {capped}"),
        "x.delta": (
            "append, 1 run, x.delta events",
            False,
            "NORMAL; the reducer ignores x.* events",
        ),
        "FULL": ("append, 1 run, FULL", False, f"sqlite_synchronous=FULL, {capped}"),
    }
    for name, values in samples.items():
        label, targeted, note = labels[name]
        value = median(values)
        ratio = value / base
        bench.add(Row(
            "append", label, value, "ev/s", base, ratio,
            target="≥ 0.3× baseline" if targeted else "",
            ok=ratio >= 0.3 if targeted else None,
            note=f"{note}; median {median(counts[name]):,.0f} deltas emitted",
            samples=values, baseline_samples=baseline,
        ))  # fmt: skip


def append_runs(bench: Bench) -> None:
    """The same with ``runs`` concurrent runs, each emitting ``events_per_run`` deltas."""
    sizes = bench.sizes
    variants = [
        ("NORMAL", bench.server("normal", sqlite_synchronous="NORMAL")),
        ("FULL", bench.server("full", sqlite_synchronous="FULL")),
    ]
    samples: dict[str, list[float]] = {name: [] for name, _ in variants}
    baseline: list[float] = []
    with bench.profile(variants[0][1], "append-runs"):
        for rep in range(bench.repeat):
            baseline.append(bench.sqlite_sample())
            for name, server in variants:
                go = bench.path("go")
                runs = [
                    bench.flood(server, sizes.events_per_run, go=str(go)) for _ in range(sizes.runs)
                ]
                go.touch()
                reports = [report for _, report in runs]
                wait_until(functools.partial(all_exist, reports), 600, "the flood reports")
                wait_terminal(server, [run_id for run_id, _ in runs])
                reports = [json.loads(report.read_text()) for report in reports]
                span = max(r["end"] for r in reports) - min(r["start"] for r in reports)
                samples[name].append(sum(r["events"] for r in reports) / span)
            say(
                f"  rep {rep + 1}/{bench.repeat}: sqlite {k(baseline[-1])}, "
                + ", ".join(f"{name} {k(values[-1])}" for name, values in samples.items())
            )
    base = median(baseline)
    for name, values in samples.items():
        value = median(values)
        targeted = name == "NORMAL"
        bench.add(Row(
            "append-runs", f"append, {sizes.runs} concurrent runs" + ("" if targeted else ", FULL"),
            value, "ev/s", base, value / base,
            target="≥ 0.3× baseline" if targeted else "",
            ok=value / base >= 0.3 if targeted else None,
            note=f"{sizes.runs} × {sizes.events_per_run:,} deltas, first start to last durable",
            samples=values, baseline_samples=baseline,
        ))  # fmt: skip


async def engine_latencies(
    bench: Bench,
    server: EngineServer,
    events: int,
    clients_count: int,
    cpu: dict | None = None,
    via: EngineServer | None = None,
) -> tuple[array, list[int]]:
    """Latencies (ns) of a run at ``rate`` ev/s to ``clients_count`` SSE clients.

    With them, each client's count of text deltas. ``cpu`` accumulates the CPU
    seconds of the server and of the clients (this process) and the wall time,
    from the first event to the last. The clients stream from ``via`` when
    given (another server on the same store), else from the run's server.
    """
    go = bench.path("go")
    run_id, _ = bench.flood(server, events, rate=bench.sizes.rate, go=str(go))
    path = f"/api/agentruns/runs/{run_id}/events"
    reading = via or server
    streams = await clients.open_streams(reading.port, path, reading.headers, clients_count)
    before = cpu_seconds(server.pid), cpu_seconds(), time.monotonic()
    go.touch()
    # The first client reads each delta's emit time; the others note when their
    # deltas arrived, and their latencies are worked out after the run from the
    # first client's emit times (the same deltas in the same order).
    merged, emitted = array("q"), array("q")
    arrived = [array("q") for _ in streams[1:]]
    counts = await asyncio.gather(
        clients.stamps(streams[0], emitted, merged),
        *(clients.arrivals(s, o) for s, o in zip(streams[1:], arrived, strict=True)),
    )
    if cpu is not None:
        cpu["server"] += cpu_seconds(server.pid) - before[0]
        cpu["clients"] += cpu_seconds() - before[1]
        cpu["wall"] += time.monotonic() - before[2]
    for out in arrived:
        clients.latencies_from(emitted, out, merged)
    wait_terminal(server, [run_id])
    return merged, list(counts)


async def bare_latencies(bare: BareServer, events: int, rate: int) -> array:
    stream = await clients.open_stream(bare.port, f"/live?events={events}&rate={rate}")
    out = array("q")
    await clients.latencies(stream, out)
    return out


def ms_percentiles(values: array) -> tuple[float, float, float]:
    ordered = sorted(values)
    return tuple(percentile(ordered, f) / 1e6 for f in (0.5, 0.99, 1.0))


def latency(bench: Bench) -> None:
    """Emit → SSE client latency at ``rate`` ev/s, one client, against a bare tornado handler."""
    sizes = bench.sizes
    bare = bench.bare()
    variants = [("NORMAL", bench.server("normal", sqlite_synchronous="NORMAL")),
                ("FULL", bench.server("full", sqlite_synchronous="FULL"))]  # fmt: skip
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in variants}
    baseline: list[tuple[float, float, float]] = []
    with bench.profile(variants[0][1], "latency"):
        for rep in range(bench.repeat):
            baseline.append(
                ms_percentiles(asyncio.run(bare_latencies(bare, sizes.latency_events, sizes.rate)))
            )
            for name, server in variants:
                values, counts = asyncio.run(
                    engine_latencies(bench, server, sizes.latency_events, 1)
                )
                if counts != [sizes.latency_events]:
                    raise RuntimeError(
                        f"the latency client got {counts} deltas of {sizes.latency_events}"
                    )
                results[name].append(ms_percentiles(values))
            say(
                f"  rep {rep + 1}/{bench.repeat}: bare p50/p99 "
                f"{baseline[-1][0]:.2f}/{baseline[-1][1]:.2f} ms, "
                + ", ".join(
                    f"{name} {r[-1][0]:.2f}/{r[-1][1]:.2f} ms" for name, r in results.items()
                )
            )
    note = (
        f"{sizes.latency_events:,} deltas at {sizes.rate:,} ev/s; "
        f"median of {bench.repeat} runs' percentiles"
    )
    for name, values in results.items():
        targeted = name == "NORMAL"
        for index, (label, limit) in enumerate((("p50", 2.0), ("p99", 10.0))):
            value = median(v[index] for v in values)
            base = median(b[index] for b in baseline)
            bench.add(Row(
                "latency", f"latency {label}, 1 client" + ("" if targeted else ", FULL"),
                value, "ms", base, value / base,
                target=f"≤ {limit:g} ms" if targeted else "",
                ok=value <= limit if targeted else None,
                note=note + f"; worst {max(v[2] for v in values):.1f} ms",
                samples=[v[index] for v in values], baseline_samples=[b[index] for b in baseline],
            ))  # fmt: skip


def fanout(bench: Bench) -> None:
    """One run at ``rate`` ev/s to many SSE clients (in the bench's process, not the server's)."""
    sizes = bench.sizes
    server = bench.server("normal", sqlite_synchronous="NORMAL")
    limits = {100: 20.0, 1000: 250.0}
    for count in sizes.fanout_clients:
        results = []
        delivered = True
        # Who was busy while events flowed: the server, or the clients competing for the cores.
        cpu = {"server": 0.0, "clients": 0.0, "wall": 0.0}
        with bench.profile(server, f"fanout-{count}"):
            for rep in range(bench.repeat):
                values, counts = asyncio.run(
                    engine_latencies(bench, server, sizes.fanout_events, count, cpu)
                )
                delivered = delivered and all(c == sizes.fanout_events for c in counts)
                results.append(ms_percentiles(values))
                say(f"  {count} clients, rep {rep + 1}/{bench.repeat}: p50/p99/max "
                    f"{results[-1][0]:.1f}/{results[-1][1]:.1f}/{results[-1][2]:.1f} ms, "
                    f"deltas per client {min(counts):,}–{max(counts):,} "
                    f"of {sizes.fanout_events:,}")  # fmt: skip
        limit = limits.get(count)
        p99 = median(r[1] for r in results)
        bench.add(Row(
            "fanout", f"fan-out p99, {count:,} clients", p99, "ms",
            target=f"≤ {limit:g} ms, all delivered" if limit else "",
            ok=(p99 <= limit and delivered) if limit else None,
            note=f"{'all' if delivered else 'NOT all'} delivered; "
                 f"p50 {median(r[0] for r in results):.1f} ms, "
                 f"worst {max(r[2] for r in results):.0f} ms; "
                 f"{sizes.fanout_events:,} deltas at {sizes.rate:,} ev/s; "
                 f"CPU: server {cpu['server'] / cpu['wall']:.2f}, "
                 f"clients {cpu['clients'] / cpu['wall']:.2f} cores",
            samples=[r[1] for r in results], details={"p50": [r[0] for r in results], "cpu": cpu},
        ))  # fmt: skip


def resume(bench: Bench) -> None:
    """Time to the first event replayed after ``Last-Event-ID`` halfway into a big vs small run."""
    sizes = bench.sizes
    big = bench.big_runs()
    server: EngineServer = big["server"]
    targets = {
        "big": (big["big"], sizes.big_events // 2),
        "small": (big["small"], sizes.small_events // 2),
    }
    times: dict[str, list[float]] = {"big": [], "small": []}

    async def measure() -> None:
        for _ in range(sizes.resume_samples):
            for name, (run_id, cursor) in targets.items():
                headers = {**server.headers, "Last-Event-ID": str(cursor)}
                elapsed, first = await clients.first_event(
                    server.port, f"/api/agentruns/runs/{run_id}/events", headers
                )
                if first != cursor + 1:
                    raise RuntimeError(f"resume from {cursor} started at {first}")
                times[name].append(elapsed * 1000)

    with bench.profile(server, "resume"):
        asyncio.run(measure())
    value, base = median(times["big"]), median(times["small"])
    ratio = value / base
    bench.add(Row(
        "resume", f"resume p50, {sizes.big_events:,}-event run", value, "ms", base, ratio,
        target="ratio ≤ 1.5, p50 ≤ 5 ms", ok=ratio <= 1.5 and value <= 5,
        note=f"Last-Event-ID {sizes.big_events // 2:,} vs {sizes.small_events // 2:,} in a "
             f"{sizes.small_events:,}-event run; {sizes.resume_samples} samples each",
        samples=times["big"], baseline_samples=times["small"],
    ))  # fmt: skip
    # Where the time goes: reading the run object, which every request does first.
    get_times: dict[str, list[float]] = {"big": [], "small": []}
    for _ in range(3):
        for name, (run_id, _) in targets.items():
            start = time.perf_counter()
            response = server.http.get(f"runs/{run_id}")
            get_times[name].append((time.perf_counter() - start) * 1000)
            if name == "big":
                snapshot_bytes = len(response.content)
    value, base = median(get_times["big"]), median(get_times["small"])
    bench.add(Row(
        "resume", f"GET runs/{{id}}, {sizes.big_events:,}-event run",
        value, "ms", base, value / base,
        note=f"the run object is {snapshot_bytes / 2**20:.0f} MB (its snapshot holds all the text)",
        samples=get_times["big"], baseline_samples=get_times["small"],
    ))  # fmt: skip


def replay(bench: Bench) -> None:
    """Full replay of the finished big run to one client, against a bare tornado handler."""
    sizes = bench.sizes
    big = bench.big_runs()
    server: EngineServer = big["server"]
    bare = bench.bare()
    rates: list[float] = []
    baseline: list[float] = []

    async def read(port: int, path: str, headers=None) -> float:
        start = time.perf_counter()
        stream = await clients.open_stream(port, path, headers)
        count, _ = await clients.count_deltas(stream)
        elapsed = time.perf_counter() - start
        if count != sizes.big_events:
            raise RuntimeError(
                f"replay of {path} delivered {count:,} deltas of {sizes.big_events:,}"
            )
        return count / elapsed

    with bench.profile(server, "replay"):
        for rep in range(bench.repeat):
            baseline.append(asyncio.run(read(bare.port, f"/replay?events={sizes.big_events}")))
            rates.append(
                asyncio.run(
                    read(server.port, f"/api/agentruns/runs/{big['big']}/events", server.headers)
                )
            )
            say(
                f"  rep {rep + 1}/{bench.repeat}: "
                f"bare {k(baseline[-1])} ev/s, engine {k(rates[-1])} ev/s"
            )
    value, base = median(rates), median(baseline)
    bench.add(Row(
        "replay", f"replay, {sizes.big_events:,}-event run", value, "ev/s", base, value / base,
        target="≥ 0.3× baseline", ok=value / base >= 0.3,
        note="finished run from cursor 0 to its end, one client",
        samples=rates, baseline_samples=baseline,
    ))  # fmt: skip


def stalled(bench: Bench) -> None:
    """A client that stops reading as a run appends ``big_events``: the producer and server memory.

    The run emits ``x.delta`` events (100-byte deltas the reducer ignores), so
    the server's memory is what streaming costs, not the run's own snapshot
    (the big text run's growth is printed where it is made). Each run has a
    fresh server; the order of the pair alternates between repetitions.
    """
    sizes = bench.sizes
    measured: dict[str, list[tuple[float, float]]] = {"no client": [], "stalled client": []}
    for rep in range(bench.repeat):
        order = list(measured) if rep % 2 == 0 else list(reversed(measured))
        for name in order:
            measured[name].append(stalled_run(bench, stalled=name == "stalled client"))
        say(
            f"  rep {rep + 1}/{bench.repeat}: "
            + ", ".join(
                f"{name} {k(m[-1][0])} ev/s, RSS +{m[-1][1]:.0f} MB" for name, m in measured.items()
            )
        )
    producer = median(m[0] for m in measured["stalled client"])
    base_producer = median(m[0] for m in measured["no client"])
    growth = max(m[1] for m in measured["stalled client"])
    base_growth = max(m[1] for m in measured["no client"])
    ratio = producer / base_producer
    bench.add(Row(
        "stalled", "stalled client: producer rate", producer, "ev/s", base_producer, ratio,
        target="≥ 0.9× baseline", ok=ratio >= 0.9,
        note=f"{sizes.big_events:,} x.delta events; baseline: the same run with no client; "
             f"each run on a fresh server",
        samples=[m[0] for m in measured["stalled client"]],
        baseline_samples=[m[0] for m in measured["no client"]],
    ))  # fmt: skip
    bench.add(Row(
        "stalled", "stalled client: server RSS growth", growth, "MB", base_growth,
        target="≤ 50 MB", ok=growth <= 50,
        note="the largest of the runs' peak VmRSS minus VmRSS before the run",
        samples=[m[1] for m in measured["stalled client"]],
        baseline_samples=[m[1] for m in measured["no client"]],
    ))  # fmt: skip


def stalled_run(bench: Bench, stalled: bool) -> tuple[float, float]:
    """One big x.delta run on a fresh server: producer rate (ev/s) and server RSS growth (MB)."""
    server = bench.new_server("stalled", sqlite_synchronous="NORMAL")
    held: list = []
    connect = functools.partial(hold_stalled_client, server, held) if stalled else None
    try:
        with bench.profile(server, "stalled" if stalled else "stalled-baseline"):
            _, report, rss = bench.run_with_rss(
                server, bench.sizes.big_events, before_go=connect, custom=True
            )
    finally:
        for sock in held:
            sock.close()
        server.http.close()
        server.stop()
    return report["events"] / report["seconds"], rss.growth / 2**20


def hold_stalled_client(server: EngineServer, held: list, run_id: str) -> None:
    path = f"/api/agentruns/runs/{run_id}/events"
    held.append(clients.stalled_client(server.port, path, server.headers))


def idle(bench: Bench) -> None:
    """Server memory per idle open SSE connection."""
    sizes = bench.sizes
    server = bench.new_server("idle", sqlite_synchronous="NORMAL")
    path = ""

    async def measure() -> tuple[int, int]:
        warm = await clients.open_streams(server.port, path, server.headers, 20)
        await asyncio.gather(*(clients.read_until(s, b"event: progress") for s in warm))
        for stream in warm:
            stream.close()
        await asyncio.sleep(1)
        before = server.rss()
        streams = await clients.open_streams(
            server.port, path, server.headers, sizes.idle_connections
        )
        await asyncio.gather(*(clients.read_until(s, b"event: progress") for s in streams))
        await asyncio.sleep(1)
        after = server.rss()
        for stream in streams:
            stream.close()
        return before, after

    try:
        run_id = bench.submit(server, "idle", {"seconds": 3600})
        path = f"/api/agentruns/runs/{run_id}/events"
        wait_until(
            lambda: run_state(server.db_path, [run_id])[run_id][1] >= 2,
            30,
            "the idle run's first event",
        )
        before, after = asyncio.run(measure())
        server.http.post(f"runs/{run_id}/cancel", json={})
    finally:
        server.http.close()
        server.stop()
    per = (after - before) / sizes.idle_connections / 1024
    bench.add(Row(
        "idle", "memory per idle SSE connection", per, "KB", target="≤ 50 KB", ok=per <= 50,
        note=f"{sizes.idle_connections:,} open streams on one live run; server VmRSS "
             f"{before / 2**20:.0f} → {after / 2**20:.0f} MB",
    ))  # fmt: skip


def compaction(bench: Bench) -> None:
    """Compaction of the finished big run: time and peak RSS (skipped if the engine has none)."""
    sizes = bench.sizes
    settings = {
        "sqlite_synchronous": "NORMAL",
        "max_retained_events": 100,
        "event_retention_seconds": 1,
    }
    probe = bench.new_server("compaction-probe", **settings)
    try:
        run_id, _ = bench.flood(probe, 2000, per_message=100)
        wait_terminal(probe, [run_id])
        deadline = time.monotonic() + 5
        while run_state(probe.db_path, [run_id])[run_id][2] <= 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        first_seq = run_state(probe.db_path, [run_id])[run_id][2]
    finally:
        probe.http.close()
        probe.stop()
    if first_seq <= 1:
        bench.add(Row(
            "compaction", "compaction of the big run", None, "s",
            note="SKIPPED: the engine does not compact (first_seq stayed 1 for a finished "
                 "2,000-event run with max_retained_events=100, event_retention_seconds=1)",
        ))  # fmt: skip
        return
    big = bench.big_runs()
    run_id = big["big"]
    db_path = big["server"].db_path
    server = EngineServer(bench.root / "compaction", db_path, settings)
    spawned = time.monotonic()
    server.start()
    ready = time.monotonic() - spawned
    server.http = server.client()
    try:
        # The first pass may start before the server answers: its peak RSS counts from the start.
        idle_rss = server.rss() / 2**20
        # The terminal event stays; every event before it goes.
        target = run_state(db_path, [run_id])[run_id][1]
        wait_until(lambda: run_state(db_path, [run_id])[run_id][2] >= target, 1800,
                   "first_seq to advance", interval=0.05)  # fmt: skip
        advanced = time.monotonic() - spawned
        wait_until(
            lambda: oldest_seq(db_path, run_id) >= target,
            1800,
            "the old events to be deleted",
            interval=0.1,
        )
        elapsed = time.monotonic() - spawned
        peak = proc_status(server.pid, "VmHWM") / 2**20
    finally:
        server.http.close()
        server.stop()
    bench.add(Row(
        "compaction", f"compaction of the finished {sizes.big_events:,}-event run",
        elapsed - ready, "s",
        note="server ready to its events deleted "
             f"(first_seq advanced after {advanced - ready:.1f} s; "
             f"the server took {ready:.1f} s to start, the first pass is due 0.25 s after start); "
             f"peak server RSS {peak:.0f} MB (about {idle_rss:.0f} MB once started)",
        details={"peak_rss_mb": peak, "rss_at_start_mb": idle_rss, "startup_s": ready,
                 "first_seq_advanced_s": advanced - ready},
    ))  # fmt: skip


def memory(bench: Bench) -> None:
    """A 100 MB run (text deltas of 1 KB) with no client: the server's RSS at its peak and after.

    Each repetition on a fresh server: RSS before the run, the peak while it
    runs and ends (VmHWM), and RSS once it has been finished for a while.
    """
    sizes = bench.sizes
    events = sizes.memory_events
    settle = sizes.memory_settle_seconds
    peaks, afters, befores = [], [], []
    for rep in range(bench.repeat):
        server = bench.new_server("memory", sqlite_synchronous="NORMAL")
        try:
            run_id, _, rss = bench.run_with_rss(server, events, size=1000, per_message=events)
            time.sleep(settle)
            after = proc_status(server.pid, "VmRSS")
        finally:
            server.http.close()
            server.stop()
        befores.append(rss.before / 2**20)
        peaks.append(rss.growth / 2**20)
        afters.append((after - rss.before) / 2**20)
        say(f"  rep {rep + 1}/{bench.repeat}: before {befores[-1]:.0f} MB, "
            f"peak +{peaks[-1]:.0f} MB, "
            f"{settle:g} s after the end +{afters[-1]:.0f} MB")  # fmt: skip
    text_mb = events * 1000 / 2**20
    bench.add(Row(
        "memory", f"{text_mb:.0f} MB run: server RSS at peak", median(peaks), "MB",
        target="≤ +150 MB", ok=median(peaks) <= 150,
        note=f"{events:,} text deltas of 1 KB in one message, no client; peak VmRSS (VmHWM) minus "
             f"VmRSS before the run (median {median(befores):.0f} MB); fresh server per repetition",
        samples=peaks,
    ))  # fmt: skip
    bench.add(Row(
        "memory", f"{text_mb:.0f} MB run: server RSS {settle:g} s after", median(afters), "MB",
        target="≤ +30 MB", ok=median(afters) <= 30,
        note="VmRSS once the run has been finished that long, minus VmRSS before it",
        samples=afters,
    ))  # fmt: skip


# Reads a big run again and again from another process until told to stop: a
# GET of the run object, then a replay of all its events over SSE.
BIG_READER = """
import os, sys, http.client
port, token, run_id, stop = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
headers = {"Authorization": "token " + token}
reads = 0
while not os.path.exists(stop):
    for accept in ("application/json", "text/event-stream"):
        conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=600)
        path = "/api/agentruns/runs/" + run_id + ("/events" if accept != "application/json" else "")
        conn.request("GET", path, headers={**headers, "Accept": accept})
        response = conn.getresponse()
        while response.read(1 << 20):
            pass
        conn.close()
        reads += 1
print(reads)
"""


def big_read(bench: Bench) -> None:
    """A live stream's latency while another client reads a 100 MB run (GET, then a replay).

    The big run is made first (``memory_events`` text deltas of 1 KB); then,
    in each repetition, a run at ``rate`` ev/s is followed by one SSE client
    alone (the baseline), and again while another process reads the big run
    over and over.
    """
    sizes = bench.sizes
    server = bench.new_server("bigread", sqlite_synchronous="NORMAL")
    try:
        big_id, _, _ = bench.run_with_rss(
            server, sizes.memory_events, size=1000, per_message=sizes.memory_events
        )
        quiet, busy, reads = [], [], []
        for rep in range(bench.repeat):
            values, _ = asyncio.run(engine_latencies(bench, server, sizes.latency_events, 1))
            quiet.append(ms_percentiles(values))
            stop = bench.path("stop")
            reader = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    BIG_READER,
                    str(server.port),
                    server.token,
                    big_id,
                    str(stop),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                time.sleep(0.5)  # the reader is in the middle of a read
                with bench.profile(server, "big-read"):
                    values, counts = asyncio.run(
                        engine_latencies(bench, server, sizes.latency_events, 1)
                    )
            finally:
                stop.touch()
                out, _ = reader.communicate(timeout=600)
            reads.append(int(out.strip() or 0))
            busy.append(ms_percentiles(values))
            say(
                f"  rep {rep + 1}/{bench.repeat}: alone p99 {quiet[-1][1]:.2f} ms, "
                f"beside {reads[-1]} reads of the big run p99 {busy[-1][1]:.2f} ms "
                f"(worst {busy[-1][2]:.0f} ms)"
            )
    finally:
        server.http.close()
        server.stop()
    p99, base = median(b[1] for b in busy), median(q[1] for q in quiet)
    bench.add(Row(
        "big-read", "live stream p99 beside reads of a 100 MB run", p99, "ms", base, p99 / base,
        target="≤ 10 ms", ok=p99 <= 10,
        note=f"{sizes.latency_events:,} deltas at {sizes.rate:,} ev/s to one SSE client while another "
             f"process reads a {sizes.memory_events:,}-delta (1 KB each) run: GET runs/{{id}}, then a "
             f"replay, again and again ({median(reads):.0f} reads per measurement); baseline: "
             f"the same stream alone; worst {max(b[2] for b in busy):.0f} ms",
        samples=[b[1] for b in busy], baseline_samples=[q[1] for q in quiet],
    ))  # fmt: skip


def oldest_seq(db_path: Path, run_id: str) -> int:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        return (
            conn.execute("SELECT min(seq) FROM events WHERE run_id = ?", [run_id]).fetchone()[0]
            or 0
        )
    finally:
        conn.close()


SCENARIOS = {
    "append": append,
    "append-runs": append_runs,
    "latency": latency,
    "fanout": fanout,
    "resume": resume,
    "replay": replay,
    "stalled": stalled,
    "idle": idle,
    "compaction": compaction,
    "memory": memory,
    "big-read": big_read,
}
