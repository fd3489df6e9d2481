"""A run's static record: Markdown that a saved notebook keeps beside the live view.

nbconvert, nbviewer and GitHub render the richest static output they know,
and a notebook reopened where the run cannot be read shows only what was
saved: this record is what they show. It is made from a run object alone,
here for the kernel and the server alike, and bounded whatever the run.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from .lifecycle import is_terminal

ANSWER_LIMIT = 20_000
TOOL_ARGS_LIMIT = 80
TOOLS_SHOWN = 20
MESSAGE_LIMIT = 300


def run_markdown(run: dict[str, Any]) -> str:
    """The Markdown record of ``run`` (a run object of the API)."""
    lines = [_headline(run), ""]
    tools = run["snapshot"].get("tools") or []
    for tool in tools[:TOOLS_SHOWN]:
        lines.append(
            f"- tool `{_code(tool['name'])}` {_args(tool.get('args'))} → {_tool_outcome(tool)}"
        )
    if len(tools) > TOOLS_SHOWN:
        lines.append(f"- … and {len(tools) - TOOLS_SHOWN} more tool calls")
    if tools:
        lines.append("")
    inputs = run["snapshot"].get("inputs") or []
    for request in inputs[:TOOLS_SHOWN]:
        title = _without_html(_short(request.get("title") or ""))
        lines.append(f"- asked: {title} → {_without_html(_answer(request))}")
    if inputs:
        lines.append("")
    answer = "".join(
        m["text"]
        for m in run["snapshot"].get("messages") or []
        if m.get("role", "assistant") == "assistant"
    )
    if answer.strip():
        if len(answer) > ANSWER_LIMIT:
            cut = answer.rfind("\n", 0, ANSWER_LIMIT)
            answer = answer[: cut if cut > ANSWER_LIMIT // 2 else ANSWER_LIMIT]
            answer += (
                f"\n\n*… the answer goes on ({len(answer):,} of "
                f"{sum(len(m['text']) for m in run['snapshot']['messages']):,} characters shown); "
                f"the whole run is `{run['run_id']}` on the Jupyter server.*"
            )
        lines += [_without_html(answer.rstrip()), ""]
    elif run["status"] == "succeeded" and run.get("output") is not None:
        output = json.dumps(run["output"], ensure_ascii=False)
        if len(output) > ANSWER_LIMIT:
            output = output[:ANSWER_LIMIT] + " …"
        lines += ["```json", output, "```", ""]
    outcome = _outcome(run)
    if outcome:
        lines += [outcome, ""]
    lines.append(_footer(run))
    return "\n".join(lines) + "\n"


def _headline(run: dict[str, Any]) -> str:
    parts = [f"**Agent run** `{_code(run['agent'])}`", f"**{run['status']}**"]
    seconds = _duration(run)
    if seconds is not None:
        parts.append(_seconds(seconds))
    usage = run["snapshot"].get("usage")
    if usage:
        tokens = (
            f"{usage.get('input_tokens', '?')} tokens in, {usage.get('output_tokens', '?')} out"
        )
        cost = usage.get("cost")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            tokens += f", cost {cost:.2f}" if cost >= 0.01 or cost == 0 else f", cost {cost:.2g}"
        parts.append(tokens)
    return " · ".join(parts)


def _outcome(run: dict[str, Any]) -> str:
    status = run["status"]
    if status == "failed" and run.get("error"):
        error = run["error"]
        return f"> **Failed** ({_code(error.get('type', 'error'))}): {_short(error.get('message', ''))}"
    if status in ("cancelled", "cancelling") and run.get("cancel"):
        reason = run["cancel"].get("reason")
        return f"> **Cancelled**{': ' + _short(_reason(reason)) if reason else ''}"
    if status == "interrupted":
        return "> **Interrupted**: the server that executed it stopped before the run ended."
    if not is_terminal(status):
        return f"> Still {status} when this was saved ({run['last_seq']} events); the live view shows the rest."
    return ""


def _footer(run: dict[str, Any]) -> str:
    started = run.get("created_at") or ""
    when = f", started {started[:16].replace('T', ' ')} UTC" if started else ""
    again = f", run again of `{run['retry_of']}`" if run.get("retry_of") else ""
    attempt = run.get("attempt") or 1
    # A reader of the export should know the answer came through a takeover.
    resumed = (
        f", resumed {attempt - 1} time{'s' if attempt > 2 else ''} after its server stopped"
        if attempt > 1
        else ""
    )
    return f"<sub>run `{run['run_id']}`{when}{again}{resumed}</sub>"


def _tool_outcome(tool: dict[str, Any]) -> str:
    if tool.get("status") == "failed":
        error = tool.get("error") or {}
        message = error.get("message") if isinstance(error, dict) else error
        return f"failed: {_short(str(message or ''), 120)}"
    return str(tool.get("status", ""))


def _args(args: Any) -> str:
    if not args:
        return ""
    text = json.dumps(args, ensure_ascii=False, separators=(", ", ": "))
    if len(text) > TOOL_ARGS_LIMIT:
        text = text[: TOOL_ARGS_LIMIT - 1] + "…"
    return f"`{_code(text)}`"


def _duration(run: dict[str, Any]) -> float | None:
    start, end = run.get("started_at"), run.get("finished_at")
    if not start or not end:
        return None
    try:
        return (_parse(end) - _parse(start)).total_seconds()
    except ValueError:
        return None


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def _answer(request: dict[str, Any]) -> str:
    if request.get("status") == "open":
        choices = " / ".join(str(choice) for choice in request.get("choices") or [])
        return f"*waiting for an answer* ({_short(choices)})"
    if request.get("choice") is None:
        return "no answer in time" if request.get("reason") == "timeout" else "not answered"
    by = f" by {_short(request['by'])}" if request.get("by") else ""
    return f"**{_short(request['choice'])}**{by}"


def _reason(reason: Any) -> str:
    """A cancel's reason in words: a session's interrupt names the run that interrupted."""
    if isinstance(reason, dict) and isinstance(reason.get("interrupted_by"), str):
        return f"interrupted by {reason['interrupted_by']}"
    return reason if isinstance(reason, str) else json.dumps(reason, ensure_ascii=False)


def _short(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def _without_html(markdown: str) -> str:
    """Model text as Markdown that renders no HTML: ``<`` outside code becomes ``&lt;``.

    A record is shown by renderers that pass HTML through (nbconvert's HTML,
    a notebook's trusted Markdown): an ``<img onerror=…>`` in a model's answer
    must stay text there. Code keeps its ``<`` (code is never read as HTML).
    """
    out, fence = [], None
    for line in markdown.split("\n"):
        opening = _FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
            out.append(line)
            continue
        if opening:
            fence = opening.group(1)
            out.append(line)
            continue
        pieces, last = [], 0
        for span in _CODE_SPAN.finditer(line):
            pieces += [line[last : span.start()].replace("<", "&lt;"), span.group(0)]
            last = span.end()
        pieces.append(line[last:].replace("<", "&lt;"))
        out.append("".join(pieces))
    return "\n".join(out)


def _code(text: str) -> str:
    # Inline code cannot hold a backtick; nothing else in it is interpreted.
    return str(text).replace("`", "ʼ")
