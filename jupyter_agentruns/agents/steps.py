"""A tool step: one call an agent makes, asked of a person first if it must be, recorded, made once.

Every call a model asks for goes through :func:`tool_step`: the registered
Python tools and the MCP servers' (``agents.tools``), the notebook tools, and
an agent's own. It records ``tool.started`` before the call has any effect
and ``tool.completed`` after, and a resumed run never makes a call twice.
:func:`ask_once` asks a person once however often a run is resumed: the ACP
agents' permission questions use it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import error_object

APPROVE = "approve"
# What a question closed without an answer counts as: not an approval.
UNANSWERED = "unanswered"

# The question about a step cut by a take-over (c.AgentRuns.in_doubt = "ask"), and its choices.
IN_DOUBT = "in_doubt"
RUN_AGAIN, SKIP, STOP = "run_again", "skip", "stop"


class StoppedInDoubt(Exception):
    """A person chose to stop the run at a step its last server was cut off in."""

    error_type = "stopped_in_doubt"


@dataclass(frozen=True)
class Approval:
    """The question a person answers before a step runs: ``approve`` runs it, any other choice not.

    ``refused``: what a refusal says was not run (``"this call of send_mail"``).
    """

    title: str
    details: Any = None
    refused: str = "this call"


@dataclass
class Ended:
    """How a step ended: ``text`` for its caller (a model), ``result`` or ``error`` for the run."""

    ok: bool
    text: str
    result: Any = None
    error: dict[str, Any] | None = None

    def content(self) -> list[dict[str, Any]] | None:
        """What the step shows beside its result (None: its result says it all)."""
        return None


def completed(result: Any) -> Ended:
    """A step that returned ``result``: as JSON data, and as the text a model reads."""
    result = jsonable(result)
    return Ended(True, result_text(result), result)


def failed(error: dict[str, Any]) -> Ended:
    """A step that failed with ``error`` (``{type, message}``)."""
    return Ended(False, error_text(error), error=error)


async def ask_once(
    run: Any,
    title: str,
    *,
    details: Any = None,
    choices: Sequence[str] = (APPROVE, "deny"),
    kind: str = "approval",
    earlier: list[dict[str, Any]] | None = None,
    same: Callable[[dict[str, Any], str], str | None] | None = None,
) -> str | None:
    """A person's choice, asked once however often the run is resumed.

    ``earlier``: questions an earlier attempt of the run asked in this one's
    place (from ``run.snapshot["inputs"]``), taken from the front as they are
    used. One answered gives its choice (``"unanswered"`` if it was closed
    without one); one still open is waited for; one closed unanswered since
    is passed over. Only when none is left is the person asked now.
    ``same(question, choice)``: the choice here that answers as ``choice``
    answered that earlier question (by default ``choice`` itself).
    """
    while earlier:
        question = earlier.pop(0)
        if question.get("status") == "open":
            try:
                choice = await run.answer_to(question["request_id"])
            except (TimeoutError, ValueError):
                continue  # closed unanswered meanwhile: asked again
        else:
            choice = question.get("choice") or UNANSWERED
        return same(question, choice) if same is not None else choice
    return await run.ask(title, details=details, choices=list(choices), kind=kind)


async def tool_step(
    run: Any,
    name: str,
    args: dict[str, Any],
    act: Callable[[], Awaitable[Any]],
    *,
    approval: Approval | None = None,
    asked: dict[str, Any] | None = None,
    earlier: dict[str, Any] | None = None,
    idempotent: bool = False,
    kind: str | None = None,
    title: str | None = None,
) -> Ended:
    """One call of the tool ``name`` as a step of ``run``: approved if it must be, recorded, made once.

    ``act()`` makes the call; it returns the result (JSON data, or an
    :class:`Ended` to say it all), and an exception it raises fails the step
    (the caller reads why). ``args``, ``kind`` and ``title`` are what
    ``tool.started`` shows.

    ``approval``: a person is asked first; a refused step is recorded all the
    same, failed ``denied``, and ``act`` is never called. ``asked``: that
    question, asked by an earlier attempt of the run (answered, or still
    open): it is not asked again. ``earlier``: the step an earlier attempt
    recorded for this call (from ``run.snapshot["tools"]``): one that ended
    is not made again (its caller reads what it read then); one its server
    died in is made again only when ``idempotent``, and else fails
    ``interrupted``.
    """
    if earlier is not None:
        if earlier.get("status") == "completed":
            return Ended(True, step_text(earlier), earlier.get("result"))
        if earlier.get("status") != "running":
            return failed(earlier.get("error") or {})
        call_id = earlier["call_id"]
        if idempotent:
            # Its server died during it, and doing it again is harmless.
            return await _make(run, call_id, act)
        if getattr(run, "in_doubt", None) == "ask":
            return await _settle_in_doubt(run, name, args, call_id, act)
        error = {
            "type": "interrupted",
            "message": f"the call of {name} was interrupted when its server stopped, and "
            "was not repeated (it is not declared idempotent): it may or may not have "
            "taken effect",
        }
        await run.tool_completed(call_id, ok=False, error=error)
        return failed(error)
    refused = None
    if approval is not None:
        choice = await ask_once(
            run,
            approval.title,
            details=approval.details,
            earlier=[asked] if asked is not None else None,
        )
        if choice != APPROVE:
            refused = f"a person denied {approval.refused} (they chose {choice!r}); it was not run"
    call_id = await run.tool_started(name, args, kind=kind, title=title)
    if refused is not None:
        error = {"type": "denied", "message": refused}
        await run.tool_completed(call_id, ok=False, error=error)
        return failed(error)
    await run.durable()  # the log shows the call before it has any effect
    return await _make(run, call_id, act)


async def _settle_in_doubt(
    run: Any,
    name: str,
    args: dict[str, Any],
    call_id: str,
    act: Callable[[], Awaitable[Any]],
) -> Ended:
    """A step with effects cut by a take-over, settled by a person: made again, skipped, or the run stopped.

    Asked once: a question an earlier attempt asked about this step is taken
    (answered, or still open) instead of a new one.
    """
    earlier = [
        request
        for request in (getattr(run, "snapshot", None) or {}).get("inputs", ())
        if request.get("kind") == IN_DOUBT
        and isinstance(request.get("details"), dict)
        and request["details"].get("call_id") == call_id
    ]
    choice = await ask_once(
        run,
        f"The call of {name} was cut off when its server stopped: it may or may not have "
        "taken effect. Run it again?",
        details={"call_id": call_id, "tool": name, "args": args},
        choices=(RUN_AGAIN, SKIP, STOP),
        kind=IN_DOUBT,
        earlier=earlier[-1:],
    )
    if choice == RUN_AGAIN:
        return await _make(run, call_id, act)
    if choice == STOP:
        message = (
            f"a person stopped the run at the call of {name}, which its server was cut off in "
            "(it may or may not have taken effect)"
        )
        error = {"type": "stopped", "message": message}
        await run.tool_completed(call_id, ok=False, error=error)
        raise StoppedInDoubt(message)
    error = {
        "type": "skipped",
        "message": f"the call of {name} was cut off when its server stopped, and a person "
        f"chose not to run it again (they chose {choice!r}): it may or may not have taken effect",
    }
    await run.tool_completed(call_id, ok=False, error=error)
    return failed(error)


async def _make(run: Any, call_id: str, act: Callable[[], Awaitable[Any]]) -> Ended:
    """Make the call of the started step ``call_id`` and record how it ended."""
    # With traces on, the call is made under the step's span (a fake run in a test has none).
    traced = getattr(run, "_traced_step", None)
    try:
        with traced(call_id) if traced is not None else contextlib.nullcontext():
            made = await act()
        ended = made if isinstance(made, Ended) else completed(made)
    except asyncio.CancelledError:
        if not run.cancelled:
            # Its caller went away and the run goes on: the step ends here. One
            # stopped with its run is the run's end's to close (or the next attempt's).
            error = {"type": "cancelled", "message": "the call was stopped before it ended"}
            with contextlib.suppress(Exception):
                await asyncio.shield(run.tool_completed(call_id, ok=False, error=error))
        raise
    except Exception as exc:  # whatever went wrong, the caller reads it and may do better
        ended = failed(error_object(exc))
    if ended.ok:
        await run.tool_completed(call_id, ended.result, content=ended.content())
    else:
        await run.tool_completed(call_id, ok=False, error=ended.error)
    return ended


# What a model reads ---------------------------------------------------------


def jsonable(value: Any) -> Any:
    """``value`` as JSON data (for an event and the model); ``str()`` of what JSON cannot hold."""
    try:
        return json.loads(json.dumps(value, allow_nan=False, default=str))
    except ValueError:
        return str(value)


def result_text(result: Any) -> str:
    """A tool's result as the model reads it: a text as it is, other JSON data as JSON."""
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


def step_text(step: dict[str, Any]) -> str:
    """What the caller of a completed tool step read: its text content, else its result."""
    texts = [
        item["text"]
        for item in step.get("content") or []
        if isinstance(item, dict)
        and item.get("type") == "text"
        and isinstance(item.get("text"), str)
    ]
    return "\n".join(texts) if texts else result_text(step.get("result"))


def error_text(error: dict[str, Any]) -> str:
    """A failed tool call as the model reads it: its error's type and message."""
    return f"Error: {error.get('type')}: {error.get('message')}"
