"""One pass of the engine's background work, and what its log says when a pass fails.

The webhook sender and the schedules' clock each do a pass, wait, and do the
next one. When the store cannot be reached, every pass fails the same way:
the log says so once, and again only after a pass has succeeded since. Any
other failure is logged with its traceback each time, and the next pass comes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from ..store import StoreBusy


class Passes:
    """The passes of one piece of background work, named ``what`` in the log."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what
        self._waiting = False

    async def run(self, one_pass: Callable[[], Awaitable[object]]) -> None:
        """Do ``one_pass``; a failure is logged, never raised."""
        try:
            await one_pass()
        except StoreBusy as exc:
            if not self._waiting:
                self._log.warning("agentruns: %s wait for the store: %s", self._what, exc)
            self._waiting = True
        except Exception:
            self._log.exception("agentruns: %s failed", self._what)
        else:
            self._waiting = False
