"""Webhooks: what 3 hooks cost the append path, and how soon a run's end reaches a receiver.

The receiver is a plain ``http.server`` in this process; each delivery's
latency is its arrival less its run's ``finished_at`` (the terminal event's
commit, to the millisecond).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .scenarios import (
    Bench,
    Row,
    all_exist,
    k,
    median,
    percentile,
    say,
    wait_terminal,
    wait_until,
)

SECRET_ENV = "AGENTRUNS_BENCH_WEBHOOK_SECRET"
HOOKS = 3
LATENCY_RUNS = 30
ENDS = ["run.succeeded", "run.failed", "run.cancelled", "run.interrupted"]


class Receiver:
    """Takes POSTs and records when each arrived and what it said."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, bytes]] = []
        arrivals = self.arrivals

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                arrivals.append((time.time(), body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def finished_ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def webhooks(bench: Bench) -> None:
    """``runs`` concurrent runs on a server with 3 webhooks and on one with none."""
    sizes = bench.sizes
    receiver = Receiver()
    os.environ[SECRET_ENV] = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    hooks = [
        {"url": receiver.url(f"/{index}"), "events": ENDS, "secret_env": SECRET_ENV}
        for index in range(HOOKS)
    ]
    variants = {
        "none": bench.server("webhooks-none", sqlite_synchronous="NORMAL"),
        "hooks": bench.server(
            "webhooks-3", sqlite_synchronous="NORMAL", webhooks=hooks, webhooks_allow_private=True
        ),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    latencies: list[float] = []
    alone: list[float] = []
    try:
        for rep in range(bench.repeat):
            for name, server in variants.items():
                go = bench.path("go")
                runs = [
                    bench.flood(server, sizes.events_per_run, go=str(go)) for _ in range(sizes.runs)
                ]
                before = len(receiver.arrivals)
                go.touch()
                reports = [report for _, report in runs]
                wait_until(functools.partial(all_exist, reports), 600, "the flood reports")
                run_ids = [run_id for run_id, _ in runs]
                wait_terminal(server, run_ids)
                reports = [json.loads(report.read_text()) for report in reports]
                span = max(r["end"] for r in reports) - min(r["start"] for r in reports)
                samples[name].append(sum(r["events"] for r in reports) / span)
                if name == "hooks":
                    expected = before + HOOKS * len(run_ids)
                    arrived_all = functools.partial(
                        lambda count: len(receiver.arrivals) >= count, expected
                    )
                    wait_until(arrived_all, 120, "the deliveries")
                    for arrived, body in receiver.arrivals[before:]:
                        run = json.loads(body)
                        latencies.append(arrived - finished_ts(run["finished_at"]))
            say(
                f"  rep {rep + 1}/{bench.repeat}: none {k(samples['none'][-1])}, "
                f"3 hooks {k(samples['hooks'][-1])} ev/s"
            )
        # One run at a time: how soon a run's end is told, when it is not one of a hundred.
        server = variants["hooks"]
        for _ in range(LATENCY_RUNS):
            before = len(receiver.arrivals)
            run_id, _ = bench.flood(server, 10)
            wait_terminal(server, [run_id])
            arrived_all = functools.partial(
                lambda count: len(receiver.arrivals) >= count, before + HOOKS
            )
            wait_until(arrived_all, 60, "the deliveries")
            for arrived, body in receiver.arrivals[before:]:
                run = json.loads(body)
                alone.append(arrived - finished_ts(run["finished_at"]))
    finally:
        receiver.close()
    none, hooked = median(samples["none"]), median(samples["hooks"])
    bench.add(Row(
        "webhooks", f"append, {sizes.runs} concurrent runs, {HOOKS} webhooks", hooked, "ev/s",
        none, hooked / none, target="≥ 0.9× no hooks", ok=hooked / none >= 0.9,
        note=f"{sizes.runs} × {sizes.events_per_run:,} deltas; baseline: the same with no hooks",
        samples=samples["hooks"], baseline_samples=samples["none"],
    ))  # fmt: skip
    alone.sort()
    latencies.sort()
    bench.add(Row(
        "webhooks", "delivery latency p99, run end → receiver", percentile(alone, 0.99) * 1000,
        "ms", note=f"p50 {percentile(alone, 0.5) * 1000:.0f} ms; {LATENCY_RUNS} runs one at a "
        f"time, {HOOKS} signed deliveries each",
        samples=[value * 1000 for value in alone],
    ))  # fmt: skip
    bench.add(Row(
        "webhooks", f"delivery latency p99, {sizes.runs} runs ending at once",
        percentile(latencies, 0.99) * 1000, "ms",
        note=f"p50 {percentile(latencies, 0.5) * 1000:.0f} ms over {len(latencies)} deliveries "
        "(the outbox drained after a burst)",
        samples=[value * 1000 for value in latencies],
    ))  # fmt: skip


SCENARIOS = {"webhooks": webhooks}
