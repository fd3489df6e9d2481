"""Exit statuses of ``jupyter agentruns``: what a script can tell apart without reading the output.

A run's outcome has small numbers (``tail`` ends with it); the command
line's own troubles have the ``sysexits.h`` numbers, so neither is mistaken
for the other.
"""

from __future__ import annotations

from ..kernel.client import AgentRunsError

OK = 0
FAILED = 1  # the run failed (tail); doctor found a problem; copy refused or failed
CANCELLED = 2  # the run was cancelled (tail)
INTERRUPTED = 3  # the run was interrupted: its server died and it could not be resumed (tail)
USAGE = 64  # wrong arguments
REFUSED = 65  # the server refused the request (an answer not offered, a question already answered…)
RUN_NOT_FOUND = 66  # no such run of yours (or retention deleted it)
# No server found or reachable, or the URL answers as something else (tail: gave up waiting;
# export: compaction kept overtaking it),
# or the store cannot be opened (or its schema is not this package's).
UNAVAILABLE = 69
SIGNED_OUT = 77  # the server refused the token
CONFIG = 78  # the Jupyter configuration is wrong
STOPPED = 130  # Ctrl-C

OUTCOMES = {"succeeded": OK, "failed": FAILED, "cancelled": CANCELLED, "interrupted": INTERRUPTED}


class CliError(Exception):
    """An expected failure: one line saying what happened and what to do, and an exit status."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def from_api(error: AgentRunsError) -> CliError:
    """The command line's error for an error the API answered."""
    if error.code in ("run_not_found", "run_expired"):
        return CliError(
            f"{error.message} List your runs with: jupyter agentruns list", RUN_NOT_FOUND
        )
    if error.status in (401, 403):
        return CliError(
            f"the server refused the token ({error.status}): pass --token, or set AGENTRUNS_TOKEN "
            "to the server's token",
            SIGNED_OUT,
        )
    if error.status >= 500:
        return CliError(f"the server cannot answer now: {error.message or error.code}", UNAVAILABLE)
    return CliError(f"{error.message or error.code} ({error.status} {error.code})", REFUSED)
