"""``--profile``: sample the server with py-spy while a scenario runs; say where the time goes."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

RATE = 200
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def where(frame: str) -> str:
    """``function (file:line)`` to ``function (short/file.py)``."""
    match = FRAME.match(frame)
    if not match:
        return frame
    file = match["file"]
    repo = str(Path(__file__).resolve().parent.parent) + "/"
    for marker in ("site-packages/", "lib/python3", repo):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{match['function']} ({file})"


PROJECT = ("jupyter_agentruns/", "bench/")


def summarize(path: Path, top: int = 12) -> dict:
    """Self shares per function, and inclusive shares of the project's own functions.

    Both are read from py-spy's collapsed stacks.
    """
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        samples = int(count)
        frames = [where(f) for f in stack.split(";")]
        total += samples
        own[frames[-1]] += samples
        for name in set(frames):
            if any(f"({prefix}" in name for prefix in PROJECT):
                inclusive[name] += samples

    def share(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * n / total, 1)) for name, n in counter.most_common(top)]

    return {"samples": total, "self": share(own), "inclusive": share(inclusive)}


class Profiler:
    def __init__(self, out_dir: Path):
        if shutil.which("py-spy") is None:
            raise SystemExit("--profile needs py-spy: pip install py-spy")
        self.out_dir = out_dir
        self.summaries: dict[str, dict] = {}

    @contextmanager
    def record(self, pid: int, name: str):
        path = self.out_dir / f"profile-{name}.txt"
        command = ["py-spy", "record", "--pid", str(pid), "--rate", str(RATE), "--nonblocking",
                   "--format", "raw", "--output", str(path)]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        start = time.monotonic()
        try:
            yield
        finally:
            seconds = time.monotonic() - start
            process.send_signal(signal.SIGINT)
            process.wait(60)
            if path.exists():
                summary = summarize(path)
                summary["seconds"] = round(seconds, 1)
                # Busy samples over the samples of one fully busy thread: about the cores used.
                summary["cores_busy"] = (
                    round(summary["samples"] / (RATE * seconds), 2) if seconds else None
                )
                self.summaries[name] = summary
                print(format_summary(name, summary), flush=True)


def format_summary(name: str, summary: dict) -> str:
    head = (
        f"  profile of the server during {name}: {summary['samples']} samples "
        f"in {summary['seconds']} s (≈{summary['cores_busy']} threads busy)"
    )
    lines = [head]
    lines.append("    self time:")
    lines += [f"      {share:5.1f}%  {name}" for name, share in summary["self"]]
    lines.append("    inclusive (the project's functions):")
    lines += [f"      {share:5.1f}%  {name}" for name, share in summary["inclusive"]]
    return "\n".join(lines)
