"""What a run says to a person, in one place: its title, its timing, its answers, its end.

The Markdown record, the command line and the notebook's ``runs()`` table
all say these things; the widget and the runs panel say them in the same
words (``js/src/words.js``). Each function returns plain text: the place
that shows it escapes it for where it goes (Markdown, a terminal, HTML).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from .lifecycle import is_terminal
from .questions import choice_name

TITLE_LIMIT = 80

# jupyter_server names the user of a token-only request "Anonymous <a moon
# of Jupiter>", a new one per request: a name that stands for nobody.
_ANONYMOUS = re.compile(r"Anonymous [A-Z][a-z]+")

# An approval's choices are verbs; what was done is said in the past tense.
_DONE = {
    "approve": "approved",
    "deny": "denied",
    "allow": "allowed",
    "reject": "rejected",
    "accept": "accepted",
    "decline": "declined",
    "cancel": "cancelled",
}


def run_title(metadata: Any, input: Any, agent: Any) -> str:
    """What a run is about: ``metadata.title`` if given, else the first line of
    ``input.prompt`` (at most 80 characters), else the agent's name."""
    given = metadata.get("title") if isinstance(metadata, dict) else None
    if isinstance(given, str) and given.strip():
        return given
    prompt = input.get("prompt") if isinstance(input, dict) else None
    if isinstance(prompt, str) and prompt.strip():
        line = prompt.strip().splitlines()[0].strip()
        return line if len(line) <= TITLE_LIMIT else line[: TITLE_LIMIT - 1] + "…"
    return agent if isinstance(agent, str) else ""


def title(run: Mapping[str, Any]) -> str:
    """The run object's ``title``, or one made the same way for a run object without one."""
    given = run.get("title")
    if isinstance(given, str) and given:
        return given
    return run_title(run.get("metadata"), run.get("input"), run.get("agent"))


def duration(seconds: float) -> str:
    """``1.4 s``, ``12 s``, ``3 min 5 s``, ``2 h 4 min``: a duration for a person."""
    if seconds < 10:
        return f"{max(0.0, seconds):.1f} s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def parse_time(value: Any) -> datetime | None:
    """A timestamp of the server (UTC); None when it is none."""
    if not value or not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def ended(status: Any) -> bool:
    """True for a terminal status (and False for anything that is no status)."""
    return isinstance(status, str) and is_terminal(status)


def timing(run: dict[str, Any], now: datetime, span: Callable[[float], str] = duration) -> str:
    """How long the run ran: ``took 3.4 s``, ``running for 4.1 s``,
    ``waiting for an answer``, ``not started yet``, ``never started``."""
    status = run.get("status")
    started = parse_time(run.get("started_at"))
    if started is None:
        return "never started" if ended(status) else "not started yet"
    if status == "waiting":
        return "waiting for an answer"
    finished = parse_time(run.get("finished_at"))
    if ended(status) and finished is not None:
        return f"took {span(max(0.0, (finished - started).total_seconds()))}"
    return f"running for {span(max(0.0, (now - started).total_seconds()))}"


def progress(status: Any, value: Any) -> str:
    """A live run's progress: ``searching 40%``; empty for a run that ended (its
    last progress was the phase it was in then, not where it stopped)."""
    if ended(status) or not isinstance(value, dict):
        return ""
    message = value.get("message")
    fraction: Any = value.get("fraction")
    known = isinstance(fraction, (int, float)) and not isinstance(fraction, bool)
    percent = f"{fraction:.0%}" if known and 0 <= fraction <= 1 else ""
    text = message if isinstance(message, str) else ""
    return f"{text} {percent}".strip() if text else percent


def person(by: Any) -> str | None:
    """Who answered, when that names a person: not a token login's anonymous name."""
    if not isinstance(by, str) or not by.strip() or _ANONYMOUS.fullmatch(by.strip()):
        return None
    return by


def answer(request: dict[str, Any]) -> str:
    """A question's answer: ``approved by ann``, ``denied: not now``, ``no answer in time``."""
    if request.get("status") == "open":
        return "waiting for an answer"
    choice = request.get("choice")
    if choice is None:
        return "no answer in time" if request.get("reason") == "timeout" else "not answered"
    name = choice_name(request, choice)
    text = _DONE.get(name.strip().lower(), name)
    by = person(request.get("by"))
    if by is not None:
        text += f" by {by}"
    note = request.get("note")
    if isinstance(note, str) and note.strip():
        text += f": {note}"
    return text


def cancelled(reason: Any) -> str:
    """A cancelled run's end: ``cancelled``, ``cancelled from the notebook``,
    ``cancelled: interrupted by run_…`` (a reason that starts with the word is not said twice)."""
    if reason is None or reason == "":
        return "cancelled"
    if isinstance(reason, dict) and isinstance(reason.get("interrupted_by"), str):
        return f"cancelled: interrupted by {reason['interrupted_by']}"
    text = reason if isinstance(reason, str) else json.dumps(reason, ensure_ascii=False)
    if re.match(r"cancell?ed\b", text.strip(), re.IGNORECASE):
        return text.strip()
    return f"cancelled: {text}"
