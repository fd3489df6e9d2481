"""A run's static record: Markdown that a saved notebook keeps beside the live view.

nbconvert, nbviewer and GitHub render the richest static output they know,
and a notebook reopened where the run cannot be read shows only what was
saved: this record is what they show. It is made from a run object alone,
here for the kernel and the server alike, and bounded whatever the run.

Everything in a run came from an agent or a model, and those renderers pass
HTML through (nbconvert keeps raw HTML and ``javascript:`` links in Markdown):
every value is written so that it shows as text, and the answer, which stays
Markdown, can neither bring markup nor make the reader's browser load a URL.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeGuard

from . import words
from .lifecycle import is_terminal
from .questions import choice_name

ANSWER_LIMIT = 20_000
TOOL_ARGS_LIMIT = 80
TOOLS_SHOWN = 20
MESSAGE_LIMIT = 300
THINKING_LIMIT = 300
PLAN_SHOWN = 20
DIFF_LINES = 80
DIFF_LINE_LIMIT = 300
DIFF_LIMIT = 20_000
INPUT_LIMIT = 2_000
EDITS_SHOWN = 50
# A thread (the follow-ups sent from the reply box under a run) in the first run's record.
FOLLOW_UPS_SHOWN = 20
PROMPT_LIMIT = 2_000
THREAD_ANSWERS_LIMIT = 60_000


def run_markdown(run: Mapping[str, Any], follow_ups: Sequence[Mapping[str, Any]] = ()) -> str:
    """The Markdown record of ``run`` (a run object of the API), with its thread's ``follow_ups``.

    The follow-ups (runs whose ``metadata.follow_up_of`` is this run) follow in
    the order they were sent, each as the person's message and the agent's
    answer, within ``FOLLOW_UPS_SHOWN`` and ``THREAD_ANSWERS_LIMIT``: a
    record made again from the same runs is the same text.
    """
    lines = [_headline(run), ""]
    lines += _input(run.get("input"))
    lines += _work(run, ANSWER_LIMIT)
    lines.append(_footer(run))
    lines += _thread(run, follow_ups)
    return "\n".join(lines) + "\n"


def _work(run: Mapping[str, Any], answer_limit: int) -> list[str]:
    """What the agent did and said: thinking, plan, tool steps, questions, the answer, the outcome."""
    lines: list[str] = []
    snapshot = run["snapshot"]
    reasoning = snapshot.get("reasoning")
    if isinstance(reasoning, str) and reasoning.strip():
        # The answer is what a reader came for: of the thinking, its beginning.
        lines += [f"> *Thinking*: {_text(reasoning, THINKING_LIMIT)}", ""]
    lines += _plan(snapshot.get("plan"))
    tools = snapshot.get("tools") or []
    diff_budget = [DIFF_LIMIT]
    for tool in tools[:TOOLS_SHOWN]:
        lines.append(f"- {_tool_step(tool)} → {_tool_outcome(tool)}")
        lines += _diffs(tool.get("content"), diff_budget)
    if len(tools) > TOOLS_SHOWN:
        lines.append(f"- … and {len(tools) - TOOLS_SHOWN} more tool calls")
    if tools:
        lines.append("")
    inputs = snapshot.get("inputs") or []
    for request in inputs[:TOOLS_SHOWN]:
        lines.append(f"- asked: {_text(request.get('title') or '')} → {_answer(request)}")
    if inputs:
        lines.append("")
    lines += _edits(snapshot.get("edits"))
    answer = "".join(
        m["text"]
        for m in run["snapshot"].get("messages") or []
        if m.get("role", "assistant") == "assistant"
    )
    output = run.get("output") if run["status"] == "succeeded" else None
    if (answer.strip() or output is not None) and answer_limit <= 0:
        # The thread's answers had their share of the record.
        lines += [f"*The answer is in the run {_code(run['run_id'])} on the Jupyter server.*", ""]
    elif answer.strip():
        note = ""
        if len(answer) > answer_limit:
            whole = len(answer)
            cut = answer.rfind("\n", 0, answer_limit)
            answer = answer[: cut if cut > answer_limit // 2 else answer_limit]
            note = (
                f"*… the answer goes on ({len(answer):,} of {whole:,} characters shown); "
                f"the whole run is {_code(run['run_id'])} on the Jupyter server.*"
            )
        lines += [model_markdown(answer.rstrip()), ""]
        if note:
            lines += [note, ""]
    elif output is not None:
        text = json.dumps(output, ensure_ascii=False)
        if len(text) > answer_limit:
            text = text[:answer_limit] + " …"
        lines += [*_fenced([text], "json"), ""]
    outcome = _outcome(run)
    if outcome:
        lines += [outcome, ""]
    return lines


def _thread(run: Mapping[str, Any], follow_ups: Sequence[Mapping[str, Any]]) -> list[str]:
    """The follow-ups under the first run, oldest first: each the person's message, then the agent's."""
    if not follow_ups:
        return []
    ordered = sorted(follow_ups, key=lambda f: (str(f.get("created_at") or ""), f["run_id"]))
    lines = ["", "---", "", f"**Follow-ups** ({len(ordered)})", ""]
    budget = THREAD_ANSWERS_LIMIT
    for number, follow_up in enumerate(ordered[:FOLLOW_UPS_SHOWN], 1):
        lines += [f"**You** · follow-up {number}", ""]
        lines += _prompt(follow_up.get("input"))
        # Its title is the message just quoted.
        lines += [_headline(follow_up, titled=False), ""]
        work = _work(follow_up, min(budget, ANSWER_LIMIT))
        budget -= sum(len(line) + 1 for line in work)
        lines += work
        lines += [_footer(follow_up), ""]
    if len(ordered) > FOLLOW_UPS_SHOWN:
        rest = len(ordered) - FOLLOW_UPS_SHOWN
        lines.append(
            f"*… and {rest} more follow-up{'s' if rest > 1 else ''}: "
            f"the whole conversation follows the run {_code(run['run_id'])} on the Jupyter server.*"
        )
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _prompt(value: Any) -> list[str]:
    """What the person wrote in the reply box, quoted, as Markdown made safe; other input as JSON."""
    prompt = value.get("prompt") if isinstance(value, dict) else None
    if not isinstance(prompt, str):
        return _input(value)
    if len(prompt) > PROMPT_LIMIT:
        prompt = prompt[:PROMPT_LIMIT] + " …"
    quoted = [f"> {line}".rstrip() for line in model_markdown(prompt.strip()).split("\n")]
    return [*quoted, ""]


def _headline(run: Mapping[str, Any], titled: bool = True) -> str:
    title = words.title(run)
    about = f": {_text(title)}" if titled and title != run["agent"] else ""
    parts = [f"**Agent run** {_code(run['agent'])}{about}", f"**{_text(run['status'])}**"]
    seconds = _duration(run)
    if seconds is not None:
        parts.append(_seconds(seconds))
    usage = run["snapshot"].get("usage")
    if isinstance(usage, dict) and usage:
        tokens = (
            f"{_count(usage.get('input_tokens'))} tokens in, "
            f"{_count(usage.get('output_tokens'))} out"
        )
        cost = usage.get("cost")
        if _is_number(cost) and math.isfinite(cost):
            tokens += f", cost {cost:.2f}" if cost >= 0.01 or cost == 0 else f", cost {cost:.2g}"
        parts.append(tokens)
    return " · ".join(parts)


def _input(value: Any) -> list[str]:
    """What the run was asked: its input as JSON, fenced (code keeps all it holds), bounded."""
    if value is None or value == {}:
        return []
    text = json.dumps(value, ensure_ascii=False, indent=1)
    if len(text) > INPUT_LIMIT:
        text = text[:INPUT_LIMIT] + " …"
    return ["**Input**", *_fenced(text.splitlines(), "json")]


def _outcome(run: Mapping[str, Any]) -> str:
    status = run["status"]
    if status == "failed" and run.get("error"):
        error = run["error"] if isinstance(run["error"], dict) else {"message": run["error"]}
        kind, message = _text(error.get("type", "error")), _text(error.get("message", ""))
        return f"> **Failed** ({kind}): {message}"
    if status in ("cancelled", "cancelling") and run.get("cancel"):
        said = words.cancelled(run["cancel"].get("reason"))
        return f"> **Cancelled**{_rest(said, 'cancelled')}"
    if status == "interrupted":
        return "> **Interrupted**: the server that executed it stopped before the run ended."
    if not is_terminal(status):
        return (
            f"> Still {_text(status)} when this was saved ({_count(run['last_seq'])} events); "
            "the live view shows the rest."
        )
    return ""


def _footer(run: Mapping[str, Any]) -> str:
    started = str(run.get("started_at") or "")
    if started:
        when = f", started {_text(started[:16].replace('T', ' '))} UTC"
    else:
        when = ", never started" if is_terminal(run["status"]) else ", not started yet"
    again = f", run again of {_code(run['retry_of'])}" if run.get("retry_of") else ""
    forked = run.get("forked_from")
    if isinstance(forked, Mapping) and isinstance(forked.get("run_id"), str):
        again += (
            f", forked from {_code(forked['run_id'])} after event {_text(str(forked.get('seq')))}"
        )
    attempt = run.get("attempt") or 1
    # A reader of the export should know the answer came through a takeover.
    resumed = (
        f", resumed {attempt - 1} time{'s' if attempt > 2 else ''} after its server stopped"
        if _is_number(attempt) and attempt > 1
        else ""
    )
    return f"*run {_code(run['run_id'])}{when}{again}{resumed}*"


def _plan(plan: Any) -> list[str]:
    """The agent's plan as a checklist; an entry in progress says so.

    Its items are ``*`` items: with the ``-`` of the tool steps after it, they would make one list.
    """
    if not isinstance(plan, list) or not plan:
        return []
    entries = [entry if isinstance(entry, dict) else {} for entry in plan]
    done = sum(entry.get("status") == "completed" for entry in entries)
    lines = [f"**Plan** ({done} of {len(entries)} done)", ""]
    for entry in entries[:PLAN_SHOWN]:
        notes = ["in progress"] if entry.get("status") == "in_progress" else []
        if entry.get("priority"):
            notes.append(f"{entry['priority']} priority")
        note = f" *({_text(', '.join(map(str, notes)))})*" if notes else ""
        box = "x" if entry.get("status") == "completed" else " "
        lines.append(f"* [{box}] {_text(entry.get('content') or '…')}{note}")
    if len(entries) > PLAN_SHOWN:
        lines.append(f"* … and {len(entries) - PLAN_SHOWN} more")
    return [*lines, ""]


# What each operation of a notebook edit did to its cell.
_EDIT_DID = {"insert": "Inserted", "edit": "Edited", "delete": "Deleted", "outputs": "Ran"}


def _edits(edits: Any) -> list[str]:
    """The run's notebook edits: what each did to which cell, and where it stands.

    A reader of the saved notebook learns which cells an agent changed and
    which of its changes were taken back, or never made (a conflict).
    """
    if not isinstance(edits, list):
        return []
    edits = [
        edit for edit in edits if isinstance(edit, dict) and isinstance(edit.get("edit_id"), str)
    ]
    if not edits:
        return []
    undone = sum(edit.get("status") == "undone" for edit in edits)
    count = f"{len(edits)}, {undone} undone" if undone else str(len(edits))
    notebooks = {edit.get("notebook") for edit in edits}
    lines = [f"**Notebook edits** ({count})", ""]
    for edit in edits[:EDITS_SHOWN]:
        did = _EDIT_DID.get(edit.get("op"), "Changed")
        index = edit.get("index")
        known = isinstance(index, int) and not isinstance(index, bool) and index >= 0
        cell = f"cell {index + 1}" if known else "a cell"
        if isinstance(edit.get("cell_id"), str):
            cell += f" ({_code(edit['cell_id'], 64)})"
        # The notebook is named when the run changed more than one.
        where = f" of {_code(edit.get('notebook'))}" if len(notebooks) > 1 else ""
        status = edit.get("status")
        outcome = _text(status, 20)
        if status == "conflict":
            outcome = "conflict: not made, the cell had changed"
        lines.append(f"- {did} {cell}{where} → {outcome}")
    if len(edits) > EDITS_SHOWN:
        lines.append(f"- … and {len(edits) - EDITS_SHOWN} more edits")
    return [*lines, ""]


def _tool_step(tool: dict[str, Any]) -> str:
    """A tool step in words: its kind and title where the agent gave them, else its name and arguments."""
    kind, title = tool.get("kind"), tool.get("title")
    if title:
        return f"{_text(kind, 20)}: {_text(title)}" if kind else _text(title)
    kind = f" ({_text(kind, 20)})" if kind else ""
    return f"tool {_code(tool.get('name'))} {_args(tool.get('args'))}{kind}"


def _diffs(content: Any, budget: list[int]) -> list[str]:
    """The diffs a tool step showed, as fenced ``diff`` blocks, within what is left of ``budget``."""
    blocks: list[str] = []
    for item in content if isinstance(content, list) else []:
        if not (
            isinstance(item, dict)
            and item.get("type") == "diff"
            and isinstance(item.get("path"), str)
            and isinstance(item.get("new_text"), str)
            and (item.get("old_text") is None or isinstance(item.get("old_text"), str))
        ):
            continue
        if budget[0] <= 0:
            blocks.append(f"  *the diff of {_code(item['path'])} is in the run*")
            continue
        path = " ".join(item["path"].splitlines())
        old = item.get("old_text")
        diff = list(
            difflib.unified_diff(
                (old or "").splitlines(),
                item["new_text"].splitlines(),
                "/dev/null" if old is None else path,
                path,
                lineterm="",
            )
        )
        shown = []
        for line in diff[:DIFF_LINES]:
            if budget[0] <= 0:
                break
            line = line if len(line) <= DIFF_LINE_LIMIT else line[: DIFF_LINE_LIMIT - 1] + "…"
            shown.append(line)
            budget[0] -= len(line) + 1
        if len(shown) < len(diff):
            shown.append(f"… {len(diff) - len(shown):,} more lines")
        blocks += _fenced(shown, "diff")
    return blocks


def _tool_outcome(tool: dict[str, Any]) -> str:
    if tool.get("status") == "failed":
        error = tool.get("error") or {}
        message = error.get("message") if isinstance(error, dict) else error
        return f"failed: {_text(message or '', 120)}"
    return _text(tool.get("status", ""))


def _args(args: Any) -> str:
    if not args:
        return ""
    text = json.dumps(args, ensure_ascii=False, separators=(", ", ": "))
    if len(text) > TOOL_ARGS_LIMIT:
        text = text[: TOOL_ARGS_LIMIT - 1] + "…"
    return _code(text)


def _duration(run: Mapping[str, Any]) -> float | None:
    start, end = run.get("started_at"), run.get("finished_at")
    if not start or not end:
        return None
    try:
        return (_parse(end) - _parse(start)).total_seconds()
    except (TypeError, ValueError):
        return None


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def _answer(request: dict[str, Any]) -> str:
    """A question's answer, a permission's by the name of the option chosen."""
    if request.get("status") == "open":
        choices = " / ".join(
            choice_name(request, choice) for choice in request.get("choices") or []
        )
        return f"*waiting for an answer* ({_text(choices)})"
    if request.get("choice") is None:
        return _text(words.answer(request))
    said = words.answer(request)
    done = words.answer({**request, "by": None, "note": None})
    return f"**{_text(done)}**{_rest(said, done)}"


def _rest(said: str, start: str) -> str:
    """What ``said`` goes on with after ``start`` (which is shown apart), as text."""
    rest = said[len(start) :]
    return (" " if rest[:1].isspace() else "") + _text(rest) if rest.strip() else ""


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> str:
    """A number as written, anything else (an agent's usage may be any JSON) as text."""
    if value is None:
        return "?"
    return str(value) if _is_number(value) else _text(json.dumps(value, ensure_ascii=False), 40)


def _short(text: Any, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Text from a run, made safe for the renderers that show a record. They pass
# HTML through and disagree on where code, links and escapes begin and end
# (nbconvert's also reads its math before code, swallows backslashes into
# bare URLs and decodes a link's entities twice). So what could make markup
# is taken out of every character, wherever a renderer starts reading: no raw
# ``<`` (HTML, autolinks), no ``&`` that could become an entity, no ``![`` (an
# image: the reader's browser would fetch a URL a model wrote), no
# ``javascript:`` a link could take, no ``$$``, ``\\[`` or ``\begin{`` (display
# math that could take in a fence). Inline code keeps its text only when none
# of that is in it: a renderer that ends it elsewhere (at a table's ``|``, in
# a link's URL) reads it as text. Only fenced code keeps all it holds.
_NOT_A_SCHEME = "\u200b"  # a zero-width space: no URL scheme holds one
_ENTITIES = {"&": "&amp;", "<": "&lt;", "\\": "&#92;", "!": "&#33;"}
_UNSAFE_IN_CODE = re.compile(
    r"<[A-Za-z/!?]|!\[|&(?:#|[A-Za-z][A-Za-z0-9]*;)|\$\$|\\\\[\[(]|\\begin\{|(?:java|vb)script\\?:",
    re.IGNORECASE,
)
_SPECIAL = (
    r"(?P<scheme>(?:java|vb)script(?=\\?:))"
    r"|(?P<entity>&(?=#|[A-Za-z][A-Za-z0-9]*;))"
)
# An underscore inside a word cannot emphasise: left as it is, names stay readable.
_LITERAL = re.compile(_SPECIAL + r"|(?<![^\W_])_|_(?![^\W_])|[`*\[\]~$&<\\]", re.IGNORECASE)
_MARKDOWN = re.compile(
    _SPECIAL + r"|(?P<code>`+)|(?P<escape>\\[!-/:-@\[-`{-~])|!(?=\[)|[&<$\\]", re.IGNORECASE
)


def _text(value: Any, limit: int = MESSAGE_LIMIT) -> str:
    """``value`` as Markdown that shows exactly its text, on one line."""
    return _literal(_short(value, limit))


def _code(value: Any, limit: int = MESSAGE_LIMIT) -> str:
    """``value`` as inline code, or as text when code could not hold it safely."""
    text = _short(value, limit)
    return _literal(text) if "`" in text or _UNSAFE_IN_CODE.search(text) else f"`{text}`"


def _literal(text: str) -> str:
    return _LITERAL.sub(_literal_piece, text)


def _literal_piece(match: re.Match[str]) -> str:
    piece = match[0]
    if match.lastgroup in ("scheme", "entity"):
        return _ENTITIES.get(piece, piece) + _NOT_A_SCHEME
    return _ENTITIES.get(piece, "\\" + piece)


_FENCE_OPENING = re.compile(r"( {0,3})(`{3,}|~{3,})(.*)")
_INFO = re.compile(r"[A-Za-z0-9_+#.-]{1,40}")
_BACKTICKS = re.compile("`+")


def model_markdown(markdown: str) -> str:
    """A model's Markdown as Markdown that renders it without HTML, images or script links.

    Fenced code is kept as written, fenced again at the margin between blank
    lines, so that nothing the text left open (a list, a quote, a link
    definition) can take it in and no line in it can close it.
    """
    lines = markdown.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        opening = _FENCE_OPENING.fullmatch(lines[index])
        index += 1
        if opening is None or (opening[2][0] == "`" and "`" in opening[3]):
            out.append(_neutral_line(lines[index - 1]))
            continue
        indent, fence = len(opening[1]), opening[2]
        closing = re.compile(rf" {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*")
        body = []
        while index < len(lines) and not closing.fullmatch(lines[index]):
            body.append(_dedent(lines[index], indent))
            index += 1
        index += 1  # the closing fence (or the end: the fence is closed here)
        info = opening[3].split(maxsplit=1)
        out += _fenced(body, info[0] if info else "")
    return "\n".join(out)


def _fenced(body: list[str], info: str) -> list[str]:
    longest = max((len(run) for line in body for run in _BACKTICKS.findall(line)), default=0)
    fence = "`" * max(3, longest + 1)
    # An info string keeps the opening from closing anything; nbconvert hands
    # a "mermaid" block to the page unescaped.
    if not _INFO.fullmatch(info) or info.lower().startswith("mermaid"):
        info = "text"
    return ["", fence + info, *body, fence, ""]


def _dedent(line: str, indent: int) -> str:
    return line[min(indent, len(line) - len(line.lstrip(" "))) :]


def _neutral_line(line: str) -> str:
    """A line of Markdown text with all that could make markup taken out (see above)."""
    out, position = [], 0
    while (match := _MARKDOWN.search(line, position)) is not None:
        out.append(line[position : match.start()])
        position, piece = match.end(), match[0]
        if match.lastgroup == "code":
            close = _closing_run(line, position, len(piece))
            if close is None:
                out.append(_literal(piece))
                continue
            span, position = line[match.start() : close + len(piece)], close + len(piece)
            out.append(_literal(span) if _UNSAFE_IN_CODE.search(span) else span)
        elif match.lastgroup == "escape" and piece[1] in "<&":
            position -= 1  # shown as the character itself, made safe as such
        elif match.lastgroup == "escape":
            out.append(_ENTITIES["\\"] if piece[1] == "\\" else piece)
        elif match.lastgroup in ("scheme", "entity"):
            out.append(_ENTITIES.get(piece, piece) + _NOT_A_SCHEME)
        else:
            out.append(_ENTITIES.get(piece, "\\" + piece))
    out.append(line[position:])
    return "".join(out)


def _closing_run(line: str, start: int, length: int) -> int | None:
    """Where the backtick run that closes a code span opened by ``length`` backticks starts."""
    for match in _BACKTICKS.finditer(line, start):
        if len(match[0]) == length:
            return match.start()
    return None
