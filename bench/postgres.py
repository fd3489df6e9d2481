"""The PostgreSQL scenarios: the store at ``c.AgentRuns.store_url``, measured as the SQLite one is.

Each runs in a schema of its own in the bench's database (``Bench.postgres``),
against a baseline measured in the same run, and prints "skipped: no
PostgreSQL" when no server answers.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time

from jupyter_agentruns.store.postgres import PostgresStore

from . import clients, database
from .database import Meter
from .scenarios import (
    Bench,
    Row,
    all_exist,
    engine_latencies,
    k,
    median,
    ms_percentiles,
    percentile,
    say,
    wait_terminal,
    wait_until,
)


def available(bench: Bench, scenario: str, labels: list[tuple[str, str]]):
    """The bench's database; or, when there is none, a skipped row per label and None."""
    db = bench.postgres()
    if db.reason is None:
        return db
    say(f"  skipped: no PostgreSQL ({db.reason})")
    for label, unit in labels:
        bench.add(Row(scenario, label, None, unit, note=f"skipped: no PostgreSQL ({db.reason})"))
    return None


def middle(values: list[float], measures: list[dict]) -> dict:
    """The measurement of the median value."""
    ranked = sorted(range(len(values)), key=values.__getitem__)
    return measures[ranked[len(ranked) // 2]]


def busy(measured: dict) -> str:
    """Who was busy, in words: cores used, commits, what the bench database's backends did."""
    seconds = measured["seconds"]
    states = ", ".join(f"{name} {share:.0%}" for name, share in measured["states"])
    return (
        f"cores busy of {measured['cores']}: servers {measured['server_cores']:.2f}, "
        f"PostgreSQL {measured['postgres_cores']:.2f}, whole machine "
        f"{measured['machine_cores']:.2f} (load {measured['load']:.1f}); "
        f"{measured['commits'] / seconds:,.0f} commits/s; backends: {states}"
    )


WAL_WAITS = ("IO:WALSync", "IO:WALWrite", "LWLock:WALWrite")


def limit(measured: dict, servers: int) -> str:
    """What held the figure back, read from the measurement."""
    cores = measured["cores"]
    per_server = measured["server_cores"] / servers
    others = measured["machine_cores"] - measured["server_cores"] - measured["postgres_cores"]
    if per_server >= 0.85:
        return (
            f"limited by each server's Python: {per_server:.2f} cores a process, "
            "one interpreter lock each"
        )
    if measured["machine_cores"] >= 0.9 * cores:
        return (
            f"limited by the machine's {cores} cores, all busy "
            f"({max(0.0, others):.1f} of them other processes, the bench's own included)"
        )
    wal = sum(share for name, share in measured["states"] if name in WAL_WAITS)
    if wal >= 0.3:
        return f"limited by WAL fsync ({wal:.0%} of the backends' samples)"
    if measured["postgres_cores"] > measured["server_cores"]:
        return "limited by PostgreSQL's CPU"
    return (
        f"limited by the servers' Python ({measured['server_cores']:.2f} cores for "
        f"{servers} process(es)), PostgreSQL mostly waiting for them"
    )


def pg_append(bench: Bench) -> None:
    """Durable appends of one run on PostgreSQL, against psycopg's raw COPY and executemany."""
    sizes = bench.sizes
    label = "append, 1 run, PostgreSQL"
    db = available(bench, "pg-append", [(label, "ev/s")])
    if db is None:
        return
    PostgresStore(db.url("raw")).open().close()  # the store's own tables, for the baselines
    raw = db.connect("raw")
    server = bench.new_server("pg-append", store_url=db.url("append"))
    rates, copies, inserts, measures, counts = [], [], [], [], []
    try:
        with bench.profile(server, "pg-append"):
            for rep in range(bench.repeat):
                rows = database.event_rows(sizes.pg_rows)
                for rate, out in (
                    (database.copy_rate, copies),
                    (database.executemany_rate, inserts),
                ):
                    raw.execute("TRUNCATE events")
                    out.append(rate(raw, rows))
                raw.execute("TRUNCATE events")
                go = bench.path("go")
                run_id, report_path = bench.flood(
                    server, sizes.append_events, max_seconds=sizes.append_max_seconds, go=str(go)
                )
                meter = Meter(db, [server.pid])
                meter.start()
                go.touch()
                wait_until(report_path.exists, 600, "the flood agent's report")
                measures.append(meter.stop())
                wait_terminal(server, [run_id])
                report = json.loads(report_path.read_text())
                rates.append(report["events"] / report["seconds"])
                counts.append(report["events"])
                say(
                    f"  rep {rep + 1}/{bench.repeat}: COPY {k(copies[-1])}, executemany "
                    f"{k(inserts[-1])}, engine {k(rates[-1])} ({counts[-1]:,} ev, "
                    f"{counts[-1] / max(1, measures[-1]['commits']):,.0f} a commit); "
                    + busy(measures[-1])
                    + "; "
                    + limit(measures[-1], 1)
                )
    finally:
        raw.close()
        server.http.close()
        server.stop()
    value, copy, insert = median(rates), median(copies), median(inserts)
    last = middle(rates, measures)
    capped = f"up to {sizes.append_events:,} deltas or {sizes.append_max_seconds:g} s"
    bench.add(Row(
        "pg-append", label, value, "ev/s", copy, value / copy,
        target="≥ 0.3× COPY", ok=value / copy >= 0.3,
        note=f"one message, {capped}, through the server's writer; baseline: psycopg COPY of "
             f"{sizes.pg_rows:,} rows into the same events table, 1,000 a commit; "
             f"median {median(counts):,.0f} deltas; {limit(last, 1)}; " + busy(last),
        samples=rates, baseline_samples=copies, details={"meter": measures},
    ))  # fmt: skip
    bench.add(Row(
        "pg-append", f"{label} (vs executemany)", value, "ev/s", insert, value / insert,
        note="baseline: psycopg executemany (pipelined INSERTs), 1,000 a commit",
        samples=rates, baseline_samples=inserts,
    ))  # fmt: skip


def pg_resume(bench: Bench) -> None:
    """Time to the first event of a resume halfway into a big vs a small run on PostgreSQL."""
    sizes = bench.sizes
    big_events, small_events = sizes.pg_resume_events
    labels = [
        f"resume p50 at {big_events // 2:,} of {big_events:,}, PostgreSQL",
        f"resume p99 at {big_events // 2:,} of {big_events:,}, PostgreSQL",
    ]
    db = available(bench, "pg-resume", [(label, "ms") for label in labels])
    if db is None:
        return
    url = db.url("resume")
    PostgresStore(url).open().close()  # its tables
    started = time.perf_counter()
    with db.connect("resume") as conn:
        big = database.insert_finished_run(conn, big_events)
        small = database.insert_finished_run(conn, small_events)
        # As a store in use would be: vacuumed and analysed, not fresh from a bulk load.
        conn.execute("VACUUM (ANALYZE) events")
    say(
        f"  {big_events + small_events:,} events put in by COPY in {time.perf_counter() - started:.1f} s"
    )
    targets = {"big": (big, big_events // 2), "small": (small, small_events // 2)}
    times: dict[str, list[float]] = {"big": [], "small": []}
    server = bench.new_server("pg-resume", store_url=url)

    async def measure(samples: int, keep: bool) -> None:
        for _ in range(samples):
            for name, (run_id, cursor) in targets.items():
                headers = {**server.headers, "Last-Event-ID": str(cursor)}
                elapsed, first = await clients.first_event(
                    server.port, f"/api/agentruns/runs/{run_id}/events", headers
                )
                if first != cursor + 1:
                    raise RuntimeError(f"resume from {cursor} started at {first}")
                if keep:
                    times[name].append(elapsed * 1000)

    try:
        asyncio.run(measure(5, keep=False))  # the reader threads open their connections
        with bench.profile(server, "pg-resume"):
            asyncio.run(measure(sizes.pg_resume_samples, keep=True))
    finally:
        server.http.close()
        server.stop()
    ordered = {name: sorted(values) for name, values in times.items()}
    for label, fraction in zip(labels, (0.5, 0.99), strict=True):
        value = percentile(ordered["big"], fraction)
        base = percentile(ordered["small"], fraction)
        targeted = fraction == 0.5
        bench.add(Row(
            "pg-resume", label, value, "ms", base, value / base,
            target="≤ 5 ms" if targeted else "", ok=value <= 5 if targeted else None,
            note=f"Last-Event-ID {big_events // 2:,}; baseline: {small_events // 2:,} of a "
                 f"{small_events:,}-event run; {sizes.pg_resume_samples} resumes each, "
                 "connect to first event",
            samples=times["big"], baseline_samples=times["small"],
        ))  # fmt: skip


def pg_cross(bench: Bench) -> None:
    """Emit → SSE client latency of a run on server A read through server B, one PostgreSQL schema."""
    sizes = bench.sizes
    labels = ["cross-server latency p50, PostgreSQL", "cross-server latency p99, PostgreSQL"]
    db = available(bench, "pg-cross", [(label, "ms") for label in labels])
    if db is None:
        return
    url = db.url("two_servers")
    a = bench.new_server("pg-cross-a", store_url=url)
    b = bench.new_server("pg-cross-b", store_url=url)
    results: dict[str, list[tuple[float, float, float]]] = {"B": [], "A": []}
    try:
        for via in (a, b):  # not counted: the first stream opens B's reader connections
            asyncio.run(engine_latencies(bench, a, 100, 1, via=via))
        with bench.profile(b, "pg-cross"):
            for rep in range(bench.repeat):
                order = list(results) if rep % 2 == 0 else list(reversed(results))
                for name in order:
                    values, counts = asyncio.run(
                        engine_latencies(
                            bench, a, sizes.latency_events, 1, via=b if name == "B" else a
                        )
                    )
                    if counts != [sizes.latency_events]:
                        raise RuntimeError(
                            f"the client on {name} got {counts} deltas of {sizes.latency_events}"
                        )
                    results[name].append(ms_percentiles(values))
                say(
                    f"  rep {rep + 1}/{bench.repeat}: p50/p99/max via B "
                    + "/".join(f"{v:.2f}" for v in results["B"][-1])
                    + " ms, on A "
                    + "/".join(f"{v:.2f}" for v in results["A"][-1])
                    + " ms"
                )
    finally:
        for server in (a, b):
            server.http.close()
            server.stop()
    worst = max(v[2] for v in results["B"])
    for index, label in enumerate(labels):
        value = median(v[index] for v in results["B"])
        base = median(v[index] for v in results["A"])
        targeted = index == 1
        bench.add(Row(
            "pg-cross", label, value, "ms", base, value / base,
            target="≤ 20 ms" if targeted else "", ok=value <= 20 if targeted else None,
            note=f"{sizes.latency_events:,} deltas at {sizes.rate:,} ev/s by server A, one SSE "
                 f"client on server B (woken by NOTIFY, reads the store); baseline: the client on "
                 f"A; median of {bench.repeat} runs' percentiles; worst {worst:.1f} ms",
            samples=[v[index] for v in results["B"]],
            baseline_samples=[v[index] for v in results["A"]],
        ))  # fmt: skip


def pg_throughput(bench: Bench) -> None:
    """Events committed per second by 1, 2 and 3 servers on one PostgreSQL schema, 50 runs each.

    The servers are started once; each repetition measures 1, then 2, then 3
    of them, so that the load of the machine at the time weighs on the three
    alike (the others stay idle meanwhile).
    """
    sizes = bench.sizes
    per_server = sizes.pg_runs_per_server
    counts = sizes.pg_servers
    labels = {n: f"throughput, {n} server(s) × {per_server} runs, PostgreSQL" for n in counts}
    db = available(bench, "pg-throughput", [(label, "ev/s") for label in labels.values()])
    if db is None:
        return
    url = db.url("throughput")
    servers = []
    rates: dict[int, list[float]] = {n: [] for n in counts}
    measures: dict[int, list[dict]] = {n: [] for n in counts}
    try:
        for index in range(max(counts)):
            servers.append(bench.new_server(f"pg-throughput-{index}", store_url=url))
        with bench.profile(servers[0], "pg-throughput"):
            for rep in range(bench.repeat):
                for count in counts:
                    rate, measured = throughput_sample(bench, db, servers[:count])
                    rates[count].append(rate)
                    measures[count].append(measured)
                    say(
                        f"  {count} server(s), rep {rep + 1}/{bench.repeat}: {k(rate)} ev/s; "
                        f"{busy(measured)}; {limit(measured, count)}"
                    )
    finally:
        for server in servers:
            server.http.close()
            server.stop()
    one = median(rates[counts[0]])
    for count in counts:
        value = median(rates[count])
        first = count == counts[0]
        typical = middle(rates[count], measures[count])
        scaling = ", ".join(
            f"{mine / base:.2f}" for mine, base in zip(rates[count], rates[counts[0]], strict=True)
        )
        bench.add(Row(
            "pg-throughput", labels[count], value, "ev/s",
            None if first else one, None if first else value / one,
            note=f"{count} × {per_server} runs × {sizes.pg_events_per_run:,} deltas, first start "
                 "to last durable"
                 + ("" if first else f"; baseline: 1 server (ratio in each repetition: {scaling})")
                 + f"; {limit(typical, count)}; " + busy(typical),
            samples=rates[count], details={"meter": measures[count]},
        ))  # fmt: skip


def throughput_sample(bench: Bench, db, servers: list) -> tuple[float, dict]:
    """``pg_runs_per_server`` flood runs on each server, started at once: events/s and who was busy."""
    sizes = bench.sizes
    go = bench.path("go")
    runs = {
        server: [
            bench.flood(server, sizes.pg_events_per_run, go=str(go))
            for _ in range(sizes.pg_runs_per_server)
        ]
        for server in servers
    }
    meter = Meter(db, [server.pid for server in servers])
    meter.start()
    go.touch()
    paths = [path for pairs in runs.values() for _, path in pairs]
    wait_until(functools.partial(all_exist, paths), 900, "the flood reports")
    measured = meter.stop()
    for server, pairs in runs.items():
        wait_terminal(server, [run_id for run_id, _ in pairs])
    reports = [json.loads(path.read_text()) for path in paths]
    span = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    return sum(r["events"] for r in reports) / span, measured


SCENARIOS = {
    "pg-append": pg_append,
    "pg-resume": pg_resume,
    "pg-cross": pg_cross,
    "pg-throughput": pg_throughput,
}
