"""The run tools of the MCP endpoint: ``start_run``, ``get_run``, ``answer_run``, ``cancel_run``.

What ``POST runs``, ``GET runs/{id}``, ``POST runs/{id}/inputs/{request_id}``
and ``POST runs/{id}/cancel`` do, for an MCP client with a person's own
token: the same checks of what it sends, the same owner (another owner's run
is ``run_not_found``), the same engine calls, and the same errors, which the
MCP server answers as tool errors (``{"error", "message"}``). Nothing here
imports the MCP SDK: the server (``notebook_tools.mcp_server``) lists
``definitions`` and hands each call of one of them to ``call``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .. import reducer
from ..domain import RunObject
from ..engine import Engine
from ..errors import ErrorCode, Problem, invalid_request, refuse_unknown_fields
from ..idempotency import key_problem
from ..lifecycle import is_terminal
from .inputs import MAX_NOTE_CHARS
from .runs import check_run_id, submit_request

# What one get_run gives of a run's text and output: an MCP client hands its
# answers to a model, whose context a 100 MB run would fill many times over.
TEXT_CHARS = 20_000
OUTPUT_CHARS = 20_000
MAX_REASON_CHARS = 1000

RUN_ID = {"type": "string", "description": "The run's id (start_run answers it)."}
DEFINITIONS: list[dict[str, Any]] = [
    {
        "name": "start_run",
        "description": (
            "Start a run of one of the Jupyter server's agents. The run goes on in the "
            "server whatever happens to this client: follow it with get_run. Answers its "
            "run_id, status, url (the run in the server's REST API) and page_url (its page in "
            "JupyterLab, for a person to open). With an idempotency_key, starting again with the same "
            "key and the same arguments answers the same run (replayed: true) instead of "
            "starting another."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "agent": {"type": "string", "description": "The agent's name, e.g. 'demo'."},
                "input": {
                    "type": "object",
                    "description": 'What the agent is given, e.g. {"prompt": "..."}.',
                },
                "session": {
                    "type": "string",
                    "description": "The conversation the run belongs to (runs of one session "
                    "follow each other; an agent may go on from the last one).",
                },
                "idempotency_key": {
                    "type": "string",
                    "description": "Any string of printable ASCII, up to 255 characters, that "
                    "names this start: retrying with it never starts a second run.",
                },
            },
            "required": ["agent", "input"],
            "additionalProperties": False,
        },
        "annotations": {"idempotent_hint": False, "destructive_hint": False},
    },
    {
        "name": "get_run",
        "description": (
            "A run as it is now: its status (queued, running, waiting for a person's "
            "answer, cancelling, succeeded, failed, cancelled, interrupted), the text its "
            f"agent wrote (the last {TEXT_CHARS} characters), the questions waiting for an "
            "answer (answer them with answer_run), and at the end its output or error. "
            "With after_seq (a next_after_seq from an earlier answer), the text is only what "
            f"was written since, up to about {TEXT_CHARS} characters: call again with the "
            "new next_after_seq for the rest."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "run_id": RUN_ID,
                "after_seq": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Give only the text written after this event.",
                },
            },
            "required": ["run_id"],
            "additionalProperties": False,
        },
        "annotations": {"read_only_hint": True},
    },
    {
        "name": "answer_run",
        "description": (
            "Answer a question a run asks (get_run lists them under questions, each with "
            "its request_id and choices). The run goes on with the answer."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "run_id": RUN_ID,
                "request_id": {"type": "string", "description": "The question's request_id."},
                "choice": {"type": "string", "description": "One of the question's choices."},
                "note": {
                    "type": "string",
                    "description": f"Words for the agent with the answer (at most "
                    f"{MAX_NOTE_CHARS} characters).",
                },
            },
            "required": ["run_id", "request_id", "choice"],
            "additionalProperties": False,
        },
        "annotations": {"idempotent_hint": True, "destructive_hint": False},
    },
    {
        "name": "cancel_run",
        "description": "Cancel a run that has not ended: its agent is stopped.",
        "parameters": {
            "type": "object",
            "properties": {
                "run_id": RUN_ID,
                "reason": {
                    "type": "string",
                    "description": f"Why, kept with the run (at most {MAX_REASON_CHARS} "
                    "characters).",
                },
            },
            "required": ["run_id"],
            "additionalProperties": False,
        },
        "annotations": {"idempotent_hint": True, "destructive_hint": True},
    },
]
NAMES = frozenset(tool["name"] for tool in DEFINITIONS)


class PersonRuns:
    """The run tools for one caller: a person (their owner and name) on this server."""

    definitions = DEFINITIONS
    names = NAMES

    def __init__(
        self,
        engine: Engine,
        owner: str,
        by: str | None,
        run_url: Callable[[str], str],
        page_url: Callable[[str], str],
    ) -> None:
        self.engine = engine
        self.owner = owner
        self.by = by  # who answers a question, as the run records it
        self.run_url = run_url  # the run's address in the API
        self.page_url = page_url  # its page in JupyterLab

    async def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Make one call; a ``Problem`` says why it cannot be made (as the REST API would)."""
        if name == "start_run":
            return await self.start_run(args)
        if name == "get_run":
            return await self.get_run(args)
        if name == "answer_run":
            return await self.answer_run(args)
        if name == "cancel_run":
            return await self.cancel_run(args)
        raise invalid_request(f"There is no run tool {name!r}.")

    async def start_run(self, args: dict[str, Any]) -> dict[str, Any]:
        refuse_unknown_fields(args, ["agent", "input", "session", "idempotency_key"])
        key = args.pop("idempotency_key", None)
        if key is not None:
            problem = key_problem(key) if isinstance(key, str) else "must be a string"
            if problem:
                raise Problem(ErrorCode.INVALID_IDEMPOTENCY_KEY, f"The idempotency_key {problem}.")
        run, replayed = await self.engine.submit(self.owner, submit_request(args), key)
        return {
            "run_id": run["run_id"],
            "status": run["status"],
            "agent": run["agent"],
            "session": run["session"],
            "title": run["title"],
            "url": self.run_url(run["run_id"]),
            "page_url": self.page_url(run["run_id"]),
            "replayed": replayed,
        }

    async def get_run(self, args: dict[str, Any]) -> dict[str, Any]:
        refuse_unknown_fields(args, ["run_id", "after_seq"])
        run_id = self._run_id(args)
        after_seq = args.get("after_seq")
        if after_seq is not None and (
            not isinstance(after_seq, int) or isinstance(after_seq, bool) or after_seq < 0
        ):
            raise invalid_request("after_seq must be a non-negative integer (a next_after_seq).")
        run = await self.engine.get_run(self.owner, run_id)
        described = describe(run)
        if after_seq is not None:
            text, reached = await self.engine.text_after(self.owner, run_id, after_seq, TEXT_CHARS)
            # The text of events the run read above may have had since: its answer says up to where.
            described.update(text=text, text_omitted=0, next_after_seq=reached)
        return described

    async def answer_run(self, args: dict[str, Any]) -> dict[str, Any]:
        refuse_unknown_fields(args, ["run_id", "request_id", "choice", "note"])
        run_id = self._run_id(args)
        request_id, choice, note = args.get("request_id"), args.get("choice"), args.get("note")
        if not isinstance(request_id, str) or not request_id:
            raise invalid_request("The field 'request_id' is required: the question's request_id.")
        if not isinstance(choice, str):
            raise invalid_request("The field 'choice' is required: one of the question's choices.")
        if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE_CHARS):
            raise invalid_request(
                f"The field 'note' must be a string of at most {MAX_NOTE_CHARS} characters."
            )
        run = await self.engine.answer(self.owner, self.by, run_id, request_id, choice, note)
        return describe(run)

    async def cancel_run(self, args: dict[str, Any]) -> dict[str, Any]:
        refuse_unknown_fields(args, ["run_id", "reason"])
        run_id = self._run_id(args)
        reason = args.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS):
            raise invalid_request(
                f"The field 'reason' must be a string of at most {MAX_REASON_CHARS} characters."
            )
        run, started = await self.engine.cancel(self.owner, run_id, reason)
        return {**describe(run), "cancelling_started": started}

    @staticmethod
    def _run_id(args: dict[str, Any]) -> str:
        run_id = args.get("run_id")
        if not isinstance(run_id, str) or not run_id:
            raise invalid_request("The field 'run_id' is required: the run's id.")
        check_run_id(run_id)
        return run_id


def describe(run: RunObject) -> dict[str, Any]:
    """What an MCP client is told of a run: its state, its text and questions, bounded."""
    snapshot = run["snapshot"] or reducer.empty_snapshot()
    text = "\n\n".join(message["text"] for message in snapshot["messages"] if message["text"])
    omitted = max(0, len(text) - TEXT_CHARS)
    described: dict[str, Any] = {
        "run_id": run["run_id"],
        "agent": run["agent"],
        "status": run["status"],
        "title": run["title"],
        "session": run["session"],
        "created_at": run["created_at"],
        "finished_at": run["finished_at"],
        "last_seq": run["last_seq"],
        "text": text[omitted:],
        "text_omitted": omitted,  # characters before those given (read the run whole for them)
        "next_after_seq": run["last_seq"],
        "questions": [
            {
                name: question.get(name)
                for name in ("request_id", "kind", "title", "details", "choices")
            }
            for question in reducer.open_inputs(snapshot)
        ],
        "ended": is_terminal(run["status"]),
        "error": run["error"],
    }
    output = run["output"]
    encoded = json.dumps(output, ensure_ascii=False)
    if len(encoded) > OUTPUT_CHARS:
        described["output"] = None
        described["output_omitted"] = (
            f"the output is {len(encoded)} characters of JSON: GET the run's url for it"
        )
    else:
        described["output"] = output
    return described
