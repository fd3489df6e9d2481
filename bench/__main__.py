"""Benchmarks of jupyter_agentruns against real servers it starts.

Prints each figure with its baseline (measured in the same run) and target,
then a table; writes the figures to bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import jupyter_server
import tornado

from .acp import SCENARIOS as ACP_SCENARIOS
from .frontend import SCENARIOS as FRONTEND_SCENARIOS
from .postgres import SCENARIOS as POSTGRES_SCENARIOS
from .scenarios import FULL, QUICK, Bench, Row, format_value, say
from .scenarios import SCENARIOS as SQLITE_SCENARIOS
from .servers import raise_open_files_limit
from .webhooks import SCENARIOS as WEBHOOK_SCENARIOS

RESULTS = Path(__file__).resolve().parent / "results"
# The PostgreSQL ones last: each skips when no PostgreSQL answers.
SCENARIOS = {
    **SQLITE_SCENARIOS,
    **WEBHOOK_SCENARIOS,
    **ACP_SCENARIOS,
    **FRONTEND_SCENARIOS,
    **POSTGRES_SCENARIOS,
}


def machine() -> dict:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    mem = next(
        line
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        "cpus": os.cpu_count(),
        "cpu": model,
        "ram_gb": round(int(mem.split()[1]) / 2**20, 1),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "tornado": tornado.version,
        "jupyter_server": jupyter_server.__version__,
        "load_before": os.getloadavg(),
    }


def table(rows: list[Row]) -> str:
    header = ["scenario", "result", "baseline", "ratio", "target", ""]
    lines = [header]
    for row in rows:
        lines.append([
            row.label,
            format_value(row.value, row.unit) if row.value is not None else "skipped",
            format_value(row.baseline, row.unit) if row.baseline is not None else "",
            f"{row.ratio:.2f}×" if row.ratio is not None else "",
            row.target,
            {True: "PASS", False: "MISS", None: ""}[row.ok],
        ])  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [
        "| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) + " |"
        for line in lines
    ]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    notes = [f"- {row.label}: {row.note}" for row in rows if row.note]
    return "\n".join(out + [""] + notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke run in well under a minute"
    )
    parser.add_argument(
        "--only", action="append", metavar="NAME",
        help="run only these scenarios (repeat the option or separate by commas): "
             f"{', '.join(SCENARIOS)}",
    )  # fmt: skip
    parser.add_argument(
        "--repeat", type=int, help="repetitions of each measurement (default 3, 1 with --quick)"
    )
    parser.add_argument(
        "--profile", action="store_true",
        help="sample the server with py-spy during each scenario; print its top functions "
             "and write bench/results/profile-<scenario>.txt (collapsed stacks)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    asked = {name for item in args.only or [] for name in item.split(",") if name}
    unknown = asked - set(SCENARIOS)
    if unknown:
        parser.error(
            f"unknown scenario(s) {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}"
        )
    # Always in the listed order: compaction, last, changes the big run the others read.
    names = [name for name in SCENARIOS if not asked or name in asked]
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1")

    raise_open_files_limit()
    RESULTS.mkdir(parents=True, exist_ok=True)
    profiler = None
    if args.profile:
        from .profiler import Profiler

        profiler = Profiler(RESULTS)
    sizes = QUICK if args.quick else FULL
    repeat = args.repeat or (1 if args.quick else 3)
    info = machine()
    say(f"jupyter_agentruns bench ({'quick' if args.quick else 'full'}, {repeat} repetition(s)) on "
        f"{info['cpus']} × {info['cpu']}, {info['ram_gb']} GB; "
        f"load average {info['load_before'][0]:.2f}")  # fmt: skip
    bench = Bench(sizes, repeat, profiler)
    failed: list[str] = []
    started = time.monotonic()
    try:
        for name in names:
            scenario = SCENARIOS[name]
            say(f"[{name}] {scenario.__doc__.splitlines()[0]}")
            began = time.monotonic()
            try:
                scenario(bench)
            except Exception:  # noqa: BLE001 (one failing scenario must not hide the others)
                traceback.print_exc()
                failed.append(name)
                bench.add(
                    Row(name, f"{name}: FAILED", None, "", ok=False, note="see the traceback above")
                )
            say(f"  ({time.monotonic() - began:.0f} s)")
    finally:
        bench.close()
    info["load_after"] = os.getloadavg()
    seconds = time.monotonic() - started
    say("")
    say(table(bench.rows))
    say(f"\n{len(bench.rows)} figures in {seconds:.0f} s; load average before/after "
        f"{info['load_before'][0]:.2f}/{info['load_after'][0]:.2f}")  # fmt: skip
    result = {
        "machine": info,
        "mode": "quick" if args.quick else "full",
        "repeat": repeat,
        "sizes": asdict(sizes),
        "seconds": round(seconds, 1),
        "rows": [asdict(row) for row in bench.rows],
        "profiles": profiler.summaries if profiler else {},
    }
    (RESULTS / "latest.json").write_text(json.dumps(result, indent=2))
    say(f"written to {RESULTS / 'latest.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
