"""Runs an agent program so that it never outlives the server that started it.

``python -I guard.py SERVER_PID NAMES COMMAND [ARG ...]``, started by the server
(in a session of its own, so that signals sent to the server's process
group reach it only through the server). Linux ends a process when its
parent dies only if it asked to (``PR_SET_PDEATHSIG``), and only that one
process: an agent's own helpers would be left running. So this guard asks
for SIGTERM at the server's death, becomes the reaper of whatever the agent
leaves behind (``PR_SET_CHILD_SUBREAPER``), runs the agent in a process
group of its own (which also dies with the guard, should the guard itself be
killed), and ends that group and every leftover when the server dies, when
it is told to stop, and when the agent exits.

The agent gets exactly the environment variables named in NAMES (comma
separated): Python itself adds one to the guard's (``LC_CTYPE``, when the
locale is C), which is not the agent's. Standard library only, run isolated
(``-I``): it must start fast and import nothing of the server. Elsewhere than Linux it runs the agent all the same,
without the guarantees.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# How long the agent gets to stop on SIGTERM before its whole group is killed.
STOP_SECONDS = 2.0

_prctl = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        _prctl = None


class Stopped(Exception):
    """The server died, or asked the agent to stop."""


def _stop(signum, frame):
    raise Stopped(signum)


def _die_with_parent(signum: int) -> None:
    # Called in the agent's child process between fork and exec: a ctypes
    # call prepared in advance, nothing that could take a lock.
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signum)


def _children() -> list[int]:
    """This process's children (the agent's orphans are reparented here)."""
    me = os.getpid()
    found: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == me:
            found.append(int(entry))
    return found


def _end(agent: subprocess.Popen) -> None:
    """The agent's group asked to stop, then killed; then every process left to this guard."""
    for signum, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(agent.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            agent.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(agent.pid, signal.SIGKILL)  # its helpers in its group
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = _children()
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        sys.stderr.write("usage: guard.py SERVER_PID NAMES COMMAND [ARG ...]\n")
        return 2
    server, names, command = int(argv[0]), set(argv[1].split(",")), argv[2:]
    env = {name: value for name, value in os.environ.items() if name in names}
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != server:
        return 1  # the server died before the signal was asked for
    me = os.getpid()

    def prepare() -> None:
        _die_with_parent(signal.SIGKILL)
        if os.getppid() != me:
            os._exit(1)

    agent = None
    try:
        try:
            agent = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=prepare)
        except OSError as exc:
            sys.stderr.write(f"cannot start {command[0]!r}: {exc.strerror or exc}\n")
            return 127
        # The agent has the pipes now: when it closes them, the server sees
        # their end at once, whatever this guard still does.
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        code = agent.wait()
        return code if code >= 0 else 128 - code
    except Stopped as stopped:
        return 128 + stopped.args[0]
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        if agent is not None:
            _end(agent)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
