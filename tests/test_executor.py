"""The executor's parts, without a server: what they keep alive."""

from __future__ import annotations

import gc
import weakref

from jupyter_agentruns.executor import RunContext
from jupyter_agentruns.executor.execution import Execution


def test_an_ended_execution_and_its_parts_are_freed_at_once_not_at_a_collection():
    """No cycle among a run's parts: its events and text go when the executor forgets it.

    The engine freezes the collector's view of the server at its start, so a
    cycle would keep a big run's memory until a rare full collection.
    """
    row = {
        "run_id": "run_1",
        "owner": "o",
        "agent": "demo",
        "input": {},
        "session": None,
        "last_seq": 0,
    }
    gc.disable()
    try:
        execution = Execution(row, writer=None, broadcaster=None, max_event_bytes=1024)  # type: ignore[arg-type]
        run = RunContext(execution)
        gone = weakref.ref(execution)
        questions = weakref.ref(execution.questions)
        del execution, run
        assert gone() is None
        assert questions() is None
    finally:
        gc.enable()
