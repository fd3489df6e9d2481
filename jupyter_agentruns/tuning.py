"""Interpreter settings the engine changes while it runs, for the whole server process.

Each is a setting (see ``settings.py``), measured by the benchmarks
(``python -m bench``; docs/explanation/performance.md has the figures), and
undone when the engine stops:

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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys

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
