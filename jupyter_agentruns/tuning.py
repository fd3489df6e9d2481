"""What the server changes in its process: the interpreter's and the process's own settings.

Each of these acts on every thread and extension of the server, not on
agentruns alone; all of them are here (docs/explanation/performance.md says
which are on by default and why). Two are settings (see ``settings.py``),
measured by the benchmarks (``python -m bench``; performance.md has the
figures), applied at the engine's start and undone when it stops:

- ``freeze_gc_at_start``: ``gc.freeze()`` moves every object alive at start
  (the server's modules, classes, settings: nearly all of its heap) out of
  the collector's full collections. A fast run keeps objects alive long
  enough to fill the oldest generation, whose collections otherwise walk the
  whole heap, 50-150 ms each, during which no stream is served. For every
  other extension of the server: objects alive at start are never collected
  while the engine runs (they were not garbage then).
- ``gil_switch_interval``: ``sys.setswitchinterval``. The writer thread lets
  go of the GIL around every SQLite statement; with Python's 5 ms it then
  waited up to that long for a busy event loop to give it back, several times
  per batch. For every other thread of the server: the GIL changes hands up
  to five times as often.

``release_memory`` (glibc's ``malloc_trim``) is not a setting: it runs once
after a run that emitted many megabytes ends, and only gives free pages back.

``SigintStop`` is not a setting either: where SIGINT has Python's default
handler (no terminal), it makes SIGINT stop the server as SIGTERM does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import signal
import sys
from collections.abc import Callable
from typing import Any

from .settings import Settings


class InterpreterTuning:
    """Applies the settings at the engine's start, undoes them at its stop."""

    def __init__(self, settings: Settings):
        self._settings = settings
        self._froze_gc = False
        self._switch_interval_before: float | None = None

    def apply(self) -> None:
        if self._settings.freeze_gc_at_start and not self._froze_gc:
            gc.freeze()
            self._froze_gc = True
        interval = self._settings.gil_switch_interval
        if interval and self._switch_interval_before is None:
            self._switch_interval_before = sys.getswitchinterval()
            sys.setswitchinterval(interval)

    def undo(self) -> None:
        if self._froze_gc:
            gc.unfreeze()  # what became garbage since can be collected again
            self._froze_gc = False
        if self._switch_interval_before is not None:
            sys.setswitchinterval(self._switch_interval_before)
            self._switch_interval_before = None


def release_memory() -> None:
    """Return the C heap's free pages to the system (glibc only; elsewhere nothing to do)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


class SigintStop:
    """Make SIGINT stop the server as SIGTERM does: extensions stopped, resumable runs handed over.

    jupyter_server handles SIGINT only at a terminal (it asks there whether
    to stop). Without one, as under JupyterHub, whose spawners stop a server
    with SIGINT, Python's default ended the process at once: no extension
    stopped, and runs waited a lease and a sweep for another server instead
    of being handed over at once. Installed once the server's own handlers
    are (its event loop runs), restored at the stop.
    """

    def __init__(self, stop: Callable[[int], None]) -> None:
        self._stop = stop  # called with the signal's number
        self._handler: Callable[[int, Any], None] | None = None  # ours, while it is set

    def install(self) -> None:
        """Set the handler, unless SIGINT has one other than Python's default."""
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return  # a terminal's prompt, or someone else's handler: theirs

        def handler(sig: int, frame: Any) -> None:
            self._stop(sig)

        signal.signal(signal.SIGINT, handler)
        self._handler = handler

    def restore(self) -> None:
        """Give SIGINT back to Python's default, unless someone else set it since."""
        if self._handler is not None:
            if signal.getsignal(signal.SIGINT) is self._handler:
                signal.signal(signal.SIGINT, signal.default_int_handler)
            self._handler = None
