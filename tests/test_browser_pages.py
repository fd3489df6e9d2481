"""In a real Chromium: an agent's edit of a notebook open in JupyterLab is made by the page.

Without jupyter-collaboration the page's model is the notebook as the person
sees it: the edit shows at once, without "Reload from Disk", the person's
unsaved typing is kept, the page saves, and no "file changed" dialog comes.
"""

from __future__ import annotations

import json
import time

import httpx
import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from agents_for_tests import TEST_AGENTS
from conftest import picture
from servers import ServerProcess
from test_browser import (  # noqa: F401  (the fixtures)
    CONTEXT,
    browser,
    jp_asyncio_loop,
    jp_server_cleanup,
    pytestmark,
    set_theme,
    wait_idle,
)

AGENTS = {**TEST_AGENTS, "nb_editor": "agents_for_tests:notebook_editor"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("pages")
    # A run over 100 tokens asks for more (the tests' other agents report no usage).
    settings = {"agents": AGENTS, "max_tokens_per_run": 100, "budget_exceeded": "ask"}
    server = ServerProcess(home, home / "agentruns.sqlite3", settings, app="jupyterlab").start(
        timeout=120
    )
    yield server
    server.kill()


@pytest.fixture
def pages(browser):  # noqa: F811
    """New pages, each in a browser context of its own (as two windows), and whether a dialog came."""
    contexts, dialogs = [], []

    def new_page():
        context = browser.new_context(viewport={"width": 1280, "height": 900}, **CONTEXT)
        contexts.append(context)
        page = context.new_page()
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
        return page

    new_page.dialogs = dialogs
    yield new_page
    for context in contexts:
        context.close()


def write_notebook(path, cells) -> None:
    notebook = new_notebook(
        cells=[new_code_cell(source, id=cell_id) for cell_id, source in cells],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbformat.write(notebook, path)


def open_notebook(page, lab, name) -> None:
    page.goto(f"{lab.url}lab/tree/{name}?token={lab.token}&reset")
    wait_idle(page)


def start_edits(lab, path, calls) -> str:
    """A run of an agent that edits the notebook ``path`` (its session); its id."""
    submitted = httpx.post(
        f"{lab.api_url}runs",
        json={
            "agent": "nb_editor",
            "input": {"calls": calls},
            "session": path,
            "metadata": {"kernel_id": "no-kernel"},
        },
        headers={"Authorization": f"token {lab.token}"},
    )
    assert submitted.status_code == 201, submitted.text
    return submitted.json()["run_id"]


def submit_edits(lab, path, calls) -> dict:
    """:func:`start_edits`, to the run's end."""
    return wait_run_by_api(lab, start_edits(lab, path, calls))


def shown_sources(page) -> list[str]:
    return page.evaluate(
        """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell .jp-InputArea-editor')]
            .map((editor) => editor.querySelector('.cm-content').innerText)"""
    )


def saved_sources(lab, name) -> list[str]:
    return [cell.source for cell in nbformat.read(lab.home / name, as_version=4).cells]


def test_an_agents_edit_shows_in_the_open_page_at_once_and_keeps_the_persons_unsaved_work(
    lab, pages
):
    name = "open.ipynb"
    write_notebook(lab.home / name, [("c-1", "x = 1"), ("c-2", "y = x + 1")])
    page = pages()
    open_notebook(page, lab, name)
    # The person types into the first cell and does not save.
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".cm-content").click()
    page.keyboard.press("End")
    page.keyboard.type("  # mine")
    page.wait_for_selector(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty")
    assert saved_sources(lab, name) == ["x = 1", "y = x + 1"]

    calls = [
        ["insert_cell", {"source": "answer = 42", "after": "end"}],
        ["edit_cell", {"cell_id": "c-2", "source": "y = x + 2"}],
    ]
    run = submit_edits(lab, name, calls)
    assert run["status"] == "succeeded", run["error"]
    assert all(answer["ok"] for answer in run["output"]["answers"]), run["output"]
    # Shown at once: no reload, no dialog.
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-Notebook .jp-Cell').length === 3", timeout=15_000
    )
    assert shown_sources(page) == ["x = 1  # mine", "y = x + 2", "answer = 42"]
    # The page saved: the file has the agent's cells and the person's typing.
    page.wait_for_function(
        "() => !document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty')",
        timeout=15_000,
    )
    saved = nbformat.read(lab.home / name, as_version=4)
    assert [cell.source for cell in saved.cells] == ["x = 1  # mine", "y = x + 2", "answer = 42"]
    assert saved.cells[2].metadata["agentruns"]["run_id"] == run["run_id"]
    assert page.locator(".jp-Dialog").count() == 0 and pages.dialogs == []
    page.locator(".jp-Notebook .jp-Cell").nth(2).scroll_into_view_if_needed()
    page.screenshot(path=picture("notebook-edit-in-open-page.png"))
    # Saving again from the page: no "file changed on disk" question.
    page.keyboard.press("Control+s")
    page.wait_for_timeout(1000)
    assert page.locator(".jp-Dialog").count() == 0
    with httpx.Client(headers={"Authorization": f"token {lab.token}"}) as http:
        records = [e["data"]["status"] for e in http.get(
            f"{lab.api_url}runs/{run['run_id']}/events", params={"limit": 100}
        ).json()["events"] if e["type"] == "notebook.edit"]  # fmt: skip
    assert records == ["pending", "applied", "pending", "applied"]


def test_two_pages_on_one_notebook_make_the_edit_once(lab, pages):
    name = "twice.ipynb"
    write_notebook(lab.home / name, [("c-1", "x = 1")])
    first, second = pages(), pages()
    open_notebook(first, lab, name)
    open_notebook(second, lab, name)
    run = submit_edits(lab, name, [["insert_cell", {"source": "once = 1", "after": "end"}]])
    assert run["status"] == "succeeded" and run["output"]["answers"][0]["ok"], run
    assert saved_sources(lab, name) == ["x = 1", "once = 1"]
    # One page made it and saved; the other, refused its claim, was told and read the file again:
    # both show it, once.
    for page in (first, second):
        page.wait_for_function(
            "() => document.querySelectorAll('.jp-Notebook .jp-Cell').length === 2", timeout=15_000
        )
        assert shown_sources(page) == ["x = 1", "once = 1"]
    second.screenshot(path=picture("notebook-edit-two-pages.png"))
    assert json.dumps(pages.dialogs) == "[]"


def test_a_refresh_while_an_agent_inserts_ten_cells_leaves_each_once_and_in_order(lab, pages):
    """The page goes away in the middle of a run (with changes claimed or on their way) and comes back."""
    name = "ten.ipynb"
    write_notebook(lab.home / name, [("c-1", "start = 0")])
    page = pages()
    open_notebook(page, lab, name)
    calls = []
    for step in range(10):
        calls += [["insert_cell", {"source": f"step = {step}", "after": "end"}]]
        calls += [["sleep", {"seconds": 0.3}]]
    run_id = start_edits(lab, name, calls)
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-Notebook .jp-Cell').length >= 4", timeout=30_000
    )
    page.reload()
    wait_idle(page)
    run = wait_run_by_api(lab, run_id)
    assert run["status"] == "succeeded", run["error"]
    wanted = ["start = 0", *(f"step = {step}" for step in range(10))]
    edits = run["snapshot"]["edits"]
    assert [edit["status"] for edit in edits] == ["applied"] * 10, edits
    try:
        page.wait_for_function(
            f"() => document.querySelectorAll('.jp-Notebook .jp-Cell').length >= {len(wanted)}",
            timeout=30_000,
        )
    finally:  # (what the page and the file hold, when it fails)
        print("shown", shown_sources(page), "saved", saved_sources(lab, name))
    assert shown_sources(page) == wanted
    page.wait_for_function(
        "() => !document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty')",
        timeout=15_000,
    )
    assert saved_sources(lab, name) == wanted
    # Saved again from the page: the file as the page shows it, no question.
    page.keyboard.press("Control+s")
    page.wait_for_timeout(1000)
    assert page.locator(".jp-Dialog").count() == 0
    assert saved_sources(lab, name) == wanted


def test_the_pages_links_take_none_of_the_browsers_six_connections_per_host(lab, pages):
    """Ten links held open in one page, and its HTTP requests still go through at once."""
    name = "links.ipynb"
    write_notebook(lab.home / name, [("c-1", "x = 1")])
    page = pages()
    open_notebook(page, lab, name)
    answered = page.evaluate(
        """async () => {
            const base = JSON.parse(document.getElementById('jupyter-config-data').textContent).baseUrl;
            const url = new URL(base + 'api/agentruns/pages', location.href);
            url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
            const sockets = Array.from({length: 10}, () => new WebSocket(url));
            const opened = Promise.all(sockets.map((socket) => new Promise((resolve, reject) => {
                socket.onopen = resolve;
                socket.onclose = () => reject(new Error('closed'));
            })));
            const requests = opened.then(() => Promise.all(Array.from({length: 6}, () =>
                fetch(base + 'api/agentruns/agents').then((response) => response.status))));
            const deadline = new Promise((resolve) => setTimeout(() => resolve('timed out'), 15000));
            const statuses = await Promise.race([requests, deadline]);
            sockets.forEach((socket) => socket.close());
            return statuses;
        }"""
    )
    assert answered == [200] * 6


def run_by_api(lab, agent, input) -> dict:
    headers = {"Authorization": f"token {lab.token}"}
    made = httpx.post(f"{lab.api_url}runs", json={"agent": agent, "input": input}, headers=headers)
    assert made.status_code == 201, made.text
    return wait_run_by_api(lab, made.json()["run_id"])


def wait_run_by_api(lab, run_id) -> dict:
    headers = {"Authorization": f"token {lab.token}"}
    deadline = time.monotonic() + 60
    while True:
        run = httpx.get(f"{lab.api_url}runs/{run_id}", headers=headers).json()
        if run["status"] in ("succeeded", "failed", "cancelled", "interrupted"):
            return run
        assert time.monotonic() < deadline, f"{run_id} is still {run['status']}"
        time.sleep(0.1)


def open_retry(page, lab, run_id):
    """The run's page, the Retry from here form of its third step open; returns that step."""
    # A workspace of its own (not ?reset, whose redirect drops the run's parameter).
    page.goto(
        f"{lab.url}lab/workspaces/retry-{run_id[-6:]}?agentruns-run={run_id}&token={lab.token}"
    )
    run_page = page.locator(f".agentruns-runpage[data-run-id='{run_id}']")
    run_page.wait_for(timeout=90_000)
    steps = run_page.locator(".agentruns-tool")
    steps.nth(2).wait_for(timeout=30_000)  # (the page is there before its run is read)
    assert steps.count() == 3
    # Once GET agents said the agent forks: a Retry from here on each step.
    steps.nth(2).locator(".agentruns-retry").wait_for(timeout=30_000)
    assert run_page.locator(".agentruns-retry").count() == 3
    steps.nth(2).locator(".agentruns-retry").click()
    return steps.nth(2)


def test_retry_from_here_on_a_step_forks_the_run_with_the_edited_prompt(lab, pages):
    original = run_by_api(lab, "forking_counter", {"prompt": "count the apples", "to": 3})
    page = pages()
    step = open_retry(page, lab, original["run_id"])
    prompt = step.locator(".agentruns-retry-prompt")
    assert prompt.input_value() == "count the apples"
    prompt.fill("count the pears")
    page.screenshot(path=picture("retry-from-here.png"))
    step.locator(".agentruns-retry-go").click()

    # The fork's own page opens; it went on after the two steps that had ended.
    note = step.locator(".agentruns-retry-note")
    # (attached: the fork's page, opened meanwhile, hides the original's)
    note.filter(has_text="Started run_").wait_for(state="attached", timeout=30_000)
    fork_id = note.inner_text().removeprefix("Started ")
    page.locator(f".agentruns-runpage[data-run-id='{fork_id}']").wait_for(timeout=30_000)
    fork = wait_run_by_api(lab, fork_id)
    assert fork["status"] == "succeeded", fork["error"]
    seqs = [e["seq"] for e in events_by_api(lab, original["run_id"]) if e["type"] == "tool.started"]
    assert fork["forked_from"] == {"run_id": original["run_id"], "seq": seqs[2] - 1}
    assert fork["input"] == {"prompt": "count the pears", "to": 3, "start": 2}
    assert [step["args"] for step in fork["snapshot"]["tools"]] == [{"n": 2}]

    # Compare, from the fork's view: the two side by side, the fork's steps after the original's.
    fork_page = page.locator(f".agentruns-runpage[data-run-id='{fork_id}']")
    fork_page.locator(".agentruns-forked-text", has_text=original["run_id"]).wait_for()
    fork_page.locator(".agentruns-compare-open").click()
    compare = page.locator(
        f".agentruns-compare[data-left='{original['run_id']}'][data-right='{fork_id}']"
    )
    compare.locator(".agentruns-compare-step").nth(2).wait_for(timeout=30_000)
    rows = [
        row.locator("td").all_inner_texts()
        for row in compare.locator(".agentruns-compare-step").all()
    ]
    assert rows == [
        ['count {"n":0} · completed', "(before the fork)"],
        ['count {"n":1} · completed', "(before the fork)"],
        ['count {"n":2} · completed', 'count {"n":2} · completed'],
    ]
    answers = compare.locator(".agentruns-compare-answer").all_inner_texts()
    assert answers == ["counted to 3: count the apples", "counted to 3: count the pears"]
    assert compare.locator(".agentruns-diff-line[data-op='added']").inner_text() == (
        "+counted to 3: count the pears"
    )
    page.screenshot(path=picture("compare.png"))

    # The form in the dark theme.
    set_theme(lab, "JupyterLab Dark")
    try:
        step = open_retry(page, lab, original["run_id"])
        # The original's page shows its family: the fork, where it forked, and Compare.
        relative = page.locator(
            f".agentruns-runpage[data-run-id='{original['run_id']}'] "
            f".agentruns-runpage-relative[data-run-id='{fork_id}']"
        )
        relative.wait_for(timeout=30_000)
        assert f"succeeded · count the pears · forked after event {seqs[2] - 1}" in (
            relative.inner_text()
        )
        page.locator("body[data-jp-theme-light='false']").wait_for(state="attached")
        step.locator(".agentruns-retry-prompt").wait_for()
        page.screenshot(path=picture("retry-from-here-dark.png"))
    finally:
        set_theme(lab, "JupyterLab Light")


def events_by_api(lab, run_id) -> list[dict]:
    headers = {"Authorization": f"token {lab.token}"}
    answer = httpx.get(
        f"{lab.api_url}runs/{run_id}/events", params={"limit": 1000}, headers=headers
    )
    return answer.json()["events"]


def test_a_budget_question_is_answered_on_the_runs_page_after_a_refresh(lab, pages):
    headers = {"Authorization": f"token {lab.token}"}
    made = httpx.post(
        f"{lab.api_url}runs",
        json={"agent": "spender", "input": {"steps": [[60, 70], [10, 10]]}},
        headers=headers,
    )
    assert made.status_code == 201, made.text
    run_id = made.json()["run_id"]
    page = pages()
    # A workspace of its own: what a refresh restores is this test's layout alone.
    page.goto(f"{lab.url}lab/workspaces/budget?agentruns-run={run_id}&token={lab.token}")
    question = page.locator(
        f".agentruns-runpage[data-run-id='{run_id}'] .agentruns-input[data-status='open']"
    )
    question.wait_for(timeout=90_000)
    assert question.locator(".agentruns-input-kind").text_content() == "budget"
    assert question.locator(".agentruns-input-title").inner_text().startswith("Allow ")
    # A refresh loses nothing: the run's page opens again (once JupyterLab saved its
    # layout), with the same question, still open, answered there.
    deadline = time.monotonic() + 30
    while (
        f"agentruns-run-pages:{run_id}"
        not in httpx.get(f"{lab.url}lab/api/workspaces", headers=headers).text
    ):
        assert time.monotonic() < deadline, "the layout with the run's page was not saved"
        time.sleep(0.2)
    page.reload()
    question.wait_for(timeout=90_000)
    question.locator(".agentruns-choice[data-choice='approve']").click()
    run = wait_run_by_api(lab, run_id)
    assert run["status"] == "succeeded", run["error"]
    [asked] = run["snapshot"]["inputs"]
    assert (asked["kind"], asked["choice"]) == ("budget", "approve")
    assert run["snapshot"]["usage"] == {"input_tokens": 10, "output_tokens": 10}
