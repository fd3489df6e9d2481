"""The run executor: each run is an asyncio task owned by the server.

The rest of the server imports this package, never its modules:

- ``tasks.Executor``: starts, resumes, watches, cancels and ends runs; the
  rest of the server names a run by its id;
- ``execution.Execution``: one live run, its events numbered, its snapshot,
  its end (``Stop``: why it is stopped before its agent returned);
- ``asking.Questions``: a run's questions to a person;
- ``context.RunContext``: what an agent receives as ``run`` (the agent API
  of ``agents``), the only way a run's events are written; ``SyncRun`` for
  a plain-function agent;
- ``provisions.RunProvisions``: what a run is given beyond its input.
"""

from .context import AGENT_EVENT_TYPES, RunContext, SyncRun, ToolCall
from .execution import Stop
from .provisions import RunProvisions
from .tasks import Executor, FinishedRun

__all__ = [
    "AGENT_EVENT_TYPES",
    "Executor",
    "FinishedRun",
    "RunContext",
    "RunProvisions",
    "Stop",
    "SyncRun",
    "ToolCall",
]
