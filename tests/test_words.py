"""What a run says to a person: one table of words, read the same in the record, the command line and ``runs()``.

The cases in ``vectors/words/cases.json`` hold the JS side (``js/src/words.js``) to the same words.
"""

import json
from datetime import datetime
from pathlib import Path

import pytest
from nbconvert.filters.markdown import markdown2html

from jupyter_agentruns import words
from jupyter_agentruns.cli import output
from jupyter_agentruns.kernel.runtable import RunList
from jupyter_agentruns.record import run_markdown

CASES = json.loads((Path(__file__).parent / "vectors" / "words" / "cases.json").read_text())
NOW = datetime.fromisoformat(CASES["now"].replace("Z", "+00:00"))


def named(kind):
    return pytest.mark.parametrize("case", CASES[kind], ids=[case["name"] for case in CASES[kind]])


@named("title")
def test_a_run_is_titled_by_its_title_else_its_prompt_else_its_agent(case):
    assert words.title(case["run"]) == case["says"]


@named("timing")
def test_how_long_a_run_ran_is_said_for_what_it_did(case):
    assert words.timing(case["run"], NOW) == case["says"]


@named("progress")
def test_progress_is_said_only_while_the_run_goes_on(case):
    assert words.progress(case["status"], case["progress"]) == case["says"]


@named("answer")
def test_an_answer_is_said_in_the_past_tense_by_a_person_or_no_one(case):
    assert words.answer(case["request"]) == case["says"]


@named("cancelled")
def test_a_cancel_says_its_reason_without_saying_cancelled_twice(case):
    assert words.cancelled(case["reason"]) == case["says"]


def run_object(**changes):
    run = {
        "run_id": "run_abc", "agent": "demo", "title": "Summarise the notes", "status": "succeeded",
        "session": None, "metadata": {}, "input": {"prompt": "Summarise the notes", "chunks": 3},
        "retry_of": None, "created_at": "2026-01-01T00:07:00.000Z",
        "started_at": "2026-01-01T00:07:01.000Z", "finished_at": "2026-01-01T00:07:13.500Z",
        "last_seq": 9, "first_seq": 1, "output": None, "error": None, "cancel": None, "attempt": 1,
        "snapshot": {"messages": [], "tools": [], "progress": None, "usage": None},
    }  # fmt: skip
    run.update(changes)
    return run


CANCELLED_WHILE_WRITING = run_object(
    status="cancelled",
    cancel={"requested_at": "2026-01-01T00:07:13.000Z", "reason": "cancelled from the notebook"},
    snapshot={
        "messages": [{"id": "m1", "role": "assistant", "text": "Half an ans", "done": False}],
        "tools": [{"call_id": "c1", "name": "search", "args": {}, "status": "completed"}],
        "progress": {"fraction": 0, "message": "searching"},
        "usage": None,
    },
)
DENIED = run_object(
    status="failed",
    error={"type": "denied", "message": "the request to write the answer was denied"},
    snapshot={
        "messages": [],
        "tools": [],
        "progress": {"fraction": 0, "message": "waiting for approval"},
        "usage": None,
        "inputs": [
            {
                "request_id": "in_1",
                "kind": "approval",
                "title": "Write it?",
                "details": None,
                "choices": ["approve", "deny"],
                "status": "resolved",
                "choice": "deny",
                "by": "Anonymous Praxidike",
            },
        ],  # fmt: skip
    },
)
APPROVED = run_object(
    snapshot={
        **DENIED["snapshot"],
        "inputs": [{**DENIED["snapshot"]["inputs"][0], "choice": "approve"}],
    }
)
NEVER_STARTED = run_object(
    status="cancelled", started_at=None, cancel={"reason": "changed my mind"}, last_seq=1
)
WAITING = run_object(status="waiting", finished_at=None, started_at="2026-01-01T00:09:55.900Z")


def test_the_record_says_what_the_run_was_asked_and_how_it_ended_in_the_same_words():
    record = run_markdown(CANCELLED_WHILE_WRITING)
    assert record.startswith("**Agent run** `demo`: Summarise the notes · **cancelled**")
    assert '"prompt": "Summarise the notes"' in record and '"chunks": 3' in record
    assert "> **Cancelled** from the notebook" in record and "cancelled: cancelled" not in record
    assert "searching" not in record
    denied = run_markdown(DENIED)
    assert "- asked: Write it? → **denied**\n" in denied and "Anonymous" not in denied
    assert "waiting for approval" not in denied and " deny" not in denied
    assert "→ **approved**\n" in run_markdown(APPROVED)
    named = run_markdown(
        run_object(
            snapshot={
                **DENIED["snapshot"],
                "inputs": [{**DENIED["snapshot"]["inputs"][0], "by": "alice"}],
            }
        )
    )
    assert "→ **denied** by alice\n" in named
    never = run_markdown(NEVER_STARTED)
    assert ", never started*" in never and "started 2026" not in never
    assert "> **Cancelled**: changed my mind" in never


def test_a_title_and_an_input_in_the_record_show_as_text_never_as_markup():
    hostile = '<img src=x onerror="alert(1)"> **bold** [link](javascript:alert(2))'
    record = run_markdown(run_object(title=hostile, input={"prompt": hostile + "\n```\n<script>"}))
    html = markdown2html(record)
    assert "<img" not in html and "<script" not in html and "<strong>bold" not in html
    assert "href" not in html  # the link's text is code in the input, and text in the title
    assert "demo</code>: &lt;img src=x onerror=&quot;alert(1)&quot;&gt; **bold** [link]" in html


def test_the_command_line_shows_the_title_the_input_and_the_same_words():
    shown = output.run_details(CANCELLED_WHILE_WRITING, NOW)
    assert shown.splitlines()[1] == "  Summarise the notes"
    assert '  input     {"prompt": "Summarise the notes", "chunks": 3}' in shown
    assert "  cancel    cancelled from the notebook" in shown and "progress" not in shown
    assert "progress" not in output.run_details(DENIED, NOW)
    assert "  duration  never started" in output.run_details(NEVER_STARTED, NOW)
    assert "  duration  waiting for an answer" in output.run_details(WAITING, NOW)
    header, row = output.runs_table([NEVER_STARTED], NOW).splitlines()
    assert row[header.index("DURATION") :].startswith("never started")
    assert row[header.index("TITLE") :] == "Summarise the notes"
    line = output.event_line(
        {"seq": 5, "type": "input.resolved",
         "data": {"request_id": "in_1", "choice": "deny", "by": "Anonymous Io"}}
    )  # fmt: skip
    assert line == "[5] input.resolved in_1 → denied"


def test_a_title_with_terminal_controls_prints_them_as_escapes():
    run = run_object(title="clip\x1b]52;c;eA==\x07 up\x1b[1A", input={"prompt": "\x1b[2J"})
    shown = output.run_details(run, NOW)
    table = output.runs_table([run], NOW)
    for text in (shown, table):
        assert "\x1b" not in text and "\x07" not in text
    assert "clip\\x1b]52;c;eA==\\x07 up\\x1b[1A" in shown and "\\u001b[2J" in shown


def test_runs_in_a_notebook_show_their_title_and_the_same_words():
    table = RunList([NEVER_STARTED, WAITING, run_object(title="<b>x</b>")])._repr_html_(now=NOW)
    rows = table.split("<tr>")[2:]
    assert "Summarise the notes" in rows[0] and "never started" in rows[0]
    assert "waiting for an answer" in rows[1] and "running" not in rows[1]
    assert "&lt;b&gt;x&lt;/b&gt;" in rows[2] and "<b>x" not in rows[2]
