"""With jupyter-collaboration, in a real Chromium against a real JupyterLab: an agent's edit is
made in the live shared document, and every open page shows it at once."""

# The browser fixtures come from test_browser, and pytest passes them by name.
# ruff: noqa: F811

from __future__ import annotations

import time

import nbformat

from agents_for_tests import TEST_AGENTS
from conftest import picture
from servers import ServerProcess
from test_browser import (  # noqa: F401  (fixtures are found by name)
    CONTEXT,
    MIME_TYPE,
    browser,
    jp_asyncio_loop,
    jp_server_cleanup,
    open_notebook,
    pytestmark,
    run_cell,
    runs_of,
    wait_attr,
    wait_text,
    write_notebook,
)


def test_with_collaboration_an_agents_inserted_cell_shows_in_two_open_pages_at_once(
    tmp_path, browser
):
    """jupyter-collaboration on: the notebook open in two pages, an agent inserts a cell, and
    both pages show it without a reload (the server changed the live shared document); a
    follow-up typed in the page that did not run its cell reaches the saved record once."""
    source = "answer = 6 * 7"
    home = tmp_path / "lab"
    server = ServerProcess(
        home,
        tmp_path / "agentruns.sqlite3",
        {"heartbeat_interval": 2, "agents": TEST_AGENTS},
        app="jupyterlab",
        # The server does not watch the file: a cell that shows came through the document.
        config={"YDocExtension": {"file_poll_interval": 0}},
        collaboration=True,
    )
    write_notebook(
        home / "shared.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            "run = submit('notebook_mcp_client', "
            f"{{'calls': [['insert_cell', {{'source': {source!r}, 'after': 'end'}}]]}})",
            "%%agent demo\nfirst question",
        ],
    )
    contexts = [
        browser.new_context(viewport={"width": 1280, "height": 720}, **CONTEXT) for _ in range(2)
    ]
    try:
        server.start(timeout=120)
        pages = [context.new_page() for context in contexts]
        for page in pages:
            open_notebook(page, server, "shared.ipynb")
        run_cell(pages[0], 0)
        wait_attr(pages[0], 0, "data-status", "v === 'succeeded'")
        for page in pages:
            # A cell of its own (the first cell's code quotes the source too).
            page.wait_for_function(
                """(source) => [...document.querySelectorAll('.jp-Notebook .jp-Cell')]
                    .filter((cell) => cell.querySelector('.jp-InputArea-editor')
                        ?.innerText.trim() === source).length === 1""",
                arg=source,
                timeout=30_000,
            )
            # No "File Changed" question: nothing was written under the page.
            assert page.locator(".jp-Dialog").count() == 0
            # The run's view once: no page adds its output to the shared document again
            # (the second page gets the output through the document: wait for it first).
            page.locator(".agentruns-run").first.wait_for(timeout=30_000)
            assert page.locator(".agentruns-run").count() == 1
        for index, page in enumerate(pages):
            page.locator(".jp-Notebook .jp-Cell").last.scroll_into_view_if_needed()
            page.screenshot(path=picture(f"collaboration-page-{index + 1}.png"))
        # The collaboration extension saved the document, the agent's cell in it.
        deadline = time.monotonic() + 30
        while True:
            try:
                cells = nbformat.read(home / "shared.ipynb", as_version=4).cells
            except ValueError:  # read while it is written
                cells = []
            if cells and cells[-1].source == source:
                break
            assert time.monotonic() < deadline, "the inserted cell never reached the file"
            time.sleep(0.2)

        # A follow-up typed under the view of a %%agent cell, in the page that did not run it:
        # the output's record in the shared document takes the thread in once (the kernel
        # updates its display, the page that ran the cell writes it), and each page shows the
        # one output.
        run_cell(pages[0], 1)
        # The record of the first run first: its change draws the output again in each page.
        saved_record(home, "**succeeded**")
        wait_attr(pages[1], 1, "data-status", "v === 'succeeded'", timeout=90_000)
        box = pages[1].locator(".jp-Notebook .agentruns-followup-text").last
        box.wait_for(timeout=30_000)
        box.click()
        pages[1].keyboard.type("second question")
        pages[1].keyboard.press("Enter")
        answered = "Demo answer about second question"
        wait_text(pages[1], 1, answered, timeout=90_000)
        saved_record(home, answered)
        time.sleep(2)  # (a second page writing it too would have by now)
        outputs = nbformat.read(home / "shared.ipynb", as_version=4).cells[1].outputs
        assert len(outputs) == 1, outputs
        record = outputs[0].data["text/markdown"]
        assert record.count("> second question") == 1 and record.count(answered) == 1, record
        for page in pages:
            cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
            assert cell.locator(".jp-OutputArea-child").count() == 1
    finally:
        for context in contexts:
            context.close()
        server.kill()


def saved_record(home, text: str, seconds: float = 60) -> None:
    """Wait until the saved notebook's second cell has a run record holding ``text``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            outputs = nbformat.read(home / "shared.ipynb", as_version=4).cells[1].outputs
        except (ValueError, IndexError):  # read while it is written
            outputs = []
        records = [o.data["text/markdown"] for o in outputs if MIME_TYPE in o.get("data", {})]
        if any(text in record for record in records):
            return
        assert time.monotonic() < deadline, f"{text!r} never reached the saved record: {outputs}"
        time.sleep(0.3)
