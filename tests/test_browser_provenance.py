"""In a real Chromium: the cells an agent wrote say so, and lead to the run that wrote them.

A mark on each stamped cell names the agent and opens the run's page at the
edit; there the edits can be undone, and the notebook's file loses them.
"""

# The browser fixtures come from test_browser, and pytest passes them by name.
# ruff: noqa: F811

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from agents_for_tests import TEST_AGENTS
from conftest import picture
from servers import ServerProcess, wait_status
from test_browser import (  # noqa: F401  (fixtures are found by name)
    PAINTED,
    browser,
    contrast,
    jp_asyncio_loop,
    jp_server_cleanup,
    page,
    pytestmark,
    set_theme,
    switch_theme,
    wait_idle,
)
from test_panel import open_panel, panel_row

AGENTS = {**TEST_AGENTS, "nb_editor": "agents_for_tests:notebook_editor"}
MARK = ".jp-Notebook .jp-Cell .agentruns-cell-mark"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("provenance")
    server = ServerProcess(
        home,
        home / "agentruns.sqlite3",
        {"agents": AGENTS},
        app="jupyterlab",
        # The page's JupyterLab as window.jupyterapp: a test changes a cell's metadata there.
        config={"LabApp": {"expose_app_in_browser": True}},
    ).start(timeout=120)
    yield server
    server.kill()


def write_cells(path, cells) -> None:
    nb = new_notebook(
        cells=[new_code_cell(source, id=cell_id) for cell_id, source in cells],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbformat.write(nb, path)


def edit_by_agent(lab: ServerProcess, name: str, calls: list) -> dict:
    """A run of the editing agent on notebook ``name``, ended: the server writes its file."""
    with lab.client() as client:
        response = client.post(
            "runs",
            json={
                "agent": "nb_editor",
                "input": {"calls": calls},
                "session": name,
                "metadata": {"kernel_id": "no-kernel"},
            },
        )
        assert response.status_code == 201, response.text
        run = wait_status(client, response.json()["run_id"], ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    return run


def open_notebook(page, lab: ServerProcess, name: str) -> None:
    page.goto(f"{lab.url}lab/tree/{name}?token={lab.token}&reset")
    wait_idle(page)


def marks_of(page) -> list[dict]:
    """Each cell's mark, in the notebook's order: None for a cell without one."""
    return page.evaluate(
        """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell'), (cell) => {
            const mark = cell.querySelector(':scope > .agentruns-cell-mark');
            return mark && {text: mark.textContent, agent: mark.dataset.agent, run: mark.dataset.runId,
                            edit: mark.dataset.editId, title: mark.title, tag: mark.tagName};
        })"""
    )


def wait_marks(page, count: int) -> None:
    """Until ``count`` cells show a mark, each with its agent's name read from the run."""
    page.wait_for_function(
        """(count) => {
            const marks = document.querySelectorAll('.jp-Notebook .jp-Cell .agentruns-cell-mark');
            return marks.length === count && Array.from(marks).every((mark) => mark.dataset.agent);
        }""",
        arg=count,
        timeout=60_000,
    )


def test_the_cells_an_agent_wrote_are_marked_and_their_mark_opens_the_run_at_the_edit(lab, page):
    path = lab.home / "marked.ipynb"
    write_cells(path, [("c-1", "x = 1"), ("c-2", "print(x)"), ("c-3", "# left alone")])
    run = edit_by_agent(
        lab,
        "marked.ipynb",
        [
            ["insert_cell", {"source": "y = x + 1", "after": "c-1"}],
            ["edit_cell", {"cell_id": "c-2", "source": "print(x, y)"}],
        ],
    )
    run_id = run["run_id"]
    inserted, edited = run["snapshot"]["edits"]
    # The dark theme first: the page is in the light one after it, for what follows.
    try:
        for theme, name in (
            ("JupyterLab Dark", "cell-marks-dark.png"),
            ("JupyterLab Light", "cell-marks-light.png"),
        ):
            if theme == "JupyterLab Dark":
                set_theme(lab, theme)
                open_notebook(page, lab, "marked.ipynb")
            else:
                switch_theme(page, theme)  # as a person does: the marks follow at once
            wait_marks(page, 2)
            first, second, third, fourth = marks_of(page)
            assert first is None and fourth is None
            assert (second["text"], second["agent"], second["run"], second["edit"]) == (
                "✦nb_editor",
                "nb_editor",
                run_id,
                inserted["edit_id"],
            )
            assert second["tag"] == "BUTTON"
            assert second["title"] == (
                f"Written by the agent nb_editor: run {run_id}, edit {inserted['edit_id']}. "
                "Open the run's page."
            )
            assert third["edit"] == edited["edit_id"]
            # Readable in the theme: the name against what it is painted on.
            mark = page.locator(MARK).first
            assert contrast(mark.locator(".agentruns-cell-mark-name").evaluate(PAINTED)) >= 4.5
            # Under the cell's input, not over it, at the editor's left edge.
            cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
            editor = cell.locator(".jp-InputArea-editor").bounding_box()
            box = mark.bounding_box()
            assert box["y"] >= editor["y"] + editor["height"] - 1, (box, editor)
            assert abs(box["x"] - editor["x"]) <= 1, (box, editor)
            cells = page.locator(".jp-Notebook .jp-Cell")
            top, bottom = cells.nth(0).bounding_box(), cells.nth(3).bounding_box()
            page.screenshot(
                path=picture(name),
                clip={
                    "x": top["x"], "y": top["y"], "width": top["width"],
                    "height": bottom["y"] + bottom["height"] - top["y"],
                },
            )  # fmt: skip
    finally:
        set_theme(lab, "JupyterLab Light")

    # Reached with the keyboard: focused, Enter opens the run's page at the cell's edit.
    page.locator(MARK).first.focus()
    page.locator(".jp-Notebook .jp-Cell").nth(1).screenshot(path=picture("cell-mark-focused.png"))
    page.keyboard.press("Enter")
    run_page = page.locator(f".agentruns-runpage[data-run-id='{run_id}']")
    run_page.wait_for(timeout=30_000)
    shown = run_page.locator(".agentruns-edit.agentruns-edit--shown")
    shown.wait_for(timeout=30_000)
    assert shown.get_attribute("data-edit-id") == inserted["edit_id"]
    assert "Inserted cell 2" in shown.locator(".agentruns-edit-words").inner_text()
    page.screenshot(path=picture("cell-mark-opens-the-run-page.png"))


def test_undo_on_the_run_page_takes_the_edits_out_of_the_file_and_the_marks_go(lab, page):
    path = lab.home / "undone.ipynb"
    write_cells(path, [("c-1", "x = 1"), ("c-2", "print(x)")])
    run = edit_by_agent(
        lab,
        "undone.ipynb",
        [
            ["insert_cell", {"source": "y = x + 1", "after": "c-1"}],
            ["edit_cell", {"cell_id": "c-2", "source": "print(x, y)"}],
        ],
    )
    run_id = run["run_id"]
    inserted, edited = run["snapshot"]["edits"]
    open_notebook(page, lab, "undone.ipynb")
    wait_marks(page, 2)
    page.locator(MARK).nth(1).click()
    run_page = page.locator(f".agentruns-runpage[data-run-id='{run_id}']")
    card = run_page.locator(f".agentruns-edit[data-edit-id='{inserted['edit_id']}']")
    card.wait_for(timeout=30_000)

    # Undo one edit: the inserted cell leaves the file; the other edit stays.
    card.get_by_role("button", name="Undo: Inserted cell 2").click()
    run_page.locator(
        f".agentruns-edit[data-edit-id='{inserted['edit_id']}'][data-status='undone']"
    ).wait_for(timeout=30_000)
    on_disk = nbformat.read(path, as_version=4)
    assert [(cell.id, cell.source) for cell in on_disk.cells] == [
        ("c-1", "x = 1"),
        ("c-2", "print(x, y)"),
    ]
    assert on_disk.cells[1].metadata["agentruns"]["edit_id"] == edited["edit_id"]
    page.screenshot(path=picture("run-page-edit-undone.png"))

    # After a refresh the runs panel's count of edits leads to them, and Undo
    # all takes back what is left. (The address is the notebook's again: with
    # the run's page in front, the page's own is /lab, which opens no notebook.)
    open_notebook(page, lab, "undone.ipynb")
    wait_marks(page, 1)
    assert [mark and mark["edit"] for mark in marks_of(page)] == [None, edited["edit_id"]]
    # A short window: the run's page has to scroll to its edits.
    page.set_viewport_size({"width": 1280, "height": 600})
    open_panel(page)
    count = panel_row(page, run_id).locator(".agentruns-panel-edits")
    assert count.inner_text() == "2 edits · 1 undone"
    count.click()
    run_page.locator(".agentruns-edits").wait_for(timeout=30_000)
    # At its edits: the section's head is in sight.
    page.wait_for_function(
        """(runId) => {
            const page = document.querySelector(`.agentruns-runpage[data-run-id='${runId}']`);
            const head = page && page.querySelector('.agentruns-edits-head');
            if (!head) return false;
            const box = head.getBoundingClientRect();
            return box.top >= 0 && box.bottom <= window.innerHeight && box.height > 0;
        }""",
        arg=run_id,
        timeout=30_000,
    )
    run_page.locator(".agentruns-undo-all").click()
    run_page.locator(
        f".agentruns-edit[data-edit-id='{edited['edit_id']}'][data-status='undone']"
    ).wait_for(timeout=30_000)
    assert run_page.locator(".agentruns-edits-count").inner_text() == "2 edits · 2 undone"
    on_disk = nbformat.read(path, as_version=4)
    assert [(cell.id, cell.source) for cell in on_disk.cells] == [
        ("c-1", "x = 1"),
        ("c-2", "print(x)"),
    ]
    assert all("agentruns" not in cell.metadata for cell in on_disk.cells)
    with lab.client() as client:
        statuses = [e["status"] for e in client.get(f"runs/{run_id}").json()["snapshot"]["edits"]]
    assert statuses == ["undone", "undone"]
    open_notebook(page, lab, "undone.ipynb")
    page.locator(".jp-Notebook .jp-Cell").nth(1).wait_for()
    assert marks_of(page) == [None, None]


def test_a_mark_follows_its_cells_stamp_while_the_notebook_is_open(lab, page):
    path = lab.home / "live.ipynb"
    write_cells(path, [("c-1", "x = 1"), ("c-2", "print(x)")])
    run = edit_by_agent(
        lab, "live.ipynb", [["edit_cell", {"cell_id": "c-2", "source": "print(x + 1)"}]]
    )
    [edited] = run["snapshot"]["edits"]
    open_notebook(page, lab, "live.ipynb")
    wait_marks(page, 1)
    # The open page's model changes, as an edit or an undo applied there (or by
    # the live document) changes it: the mark follows the stamp at once.
    stamp = {"run_id": run["run_id"], "edit_id": edited["edit_id"]}
    change = """([index, stamp]) => {
        const cell = window.jupyterapp.shell.currentWidget.content.widgets[index];
        if (stamp === null) cell.model.deleteMetadata("agentruns");
        else cell.model.setMetadata("agentruns", stamp);
    }"""
    page.evaluate(change, [1, None])
    page.wait_for_function(
        "() => !document.querySelector('.jp-Notebook .jp-Cell .agentruns-cell-mark')"
    )
    page.evaluate(change, [0, stamp])
    wait_marks(page, 1)
    assert [mark and mark["edit"] for mark in marks_of(page)] == [edited["edit_id"], None]
    # A new cell that arrives stamped (as an insertion applied in the page) is marked too.
    page.evaluate(
        """(stamp) => {
            const notebook = window.jupyterapp.shell.currentWidget.content.model;
            notebook.sharedModel.insertCell(2, {
                cell_type: "code", source: "z = 3", metadata: {agentruns: stamp},
            });
        }""",
        stamp,
    )
    wait_marks(page, 2)
    assert [mark and mark["agent"] for mark in marks_of(page)] == ["nb_editor", None, "nb_editor"]


def test_a_cell_far_down_a_long_notebook_is_marked_once_it_is_drawn(lab, page):
    cells = [
        (f"c-{n}", f"# cell {n}\n" + "\n".join(f"v_{k} = {k}" for k in range(6))) for n in range(80)
    ]
    write_cells(lab.home / "long.ipynb", cells)
    run = edit_by_agent(
        lab, "long.ipynb", [["edit_cell", {"cell_id": "c-79", "source": "last = 1"}]]
    )
    [edited] = run["snapshot"]["edits"]
    # The notebook draws cells as they come into view, and the others when the page is
    # idle (or after 3 s at the latest): this page is not idle until told, so the last
    # is not drawn yet; then it draws as usual.
    page.add_init_script(
        """window.idleLater = window.requestIdleCallback;
        window.idleHeld = [];
        window.requestIdleCallback = (callback) => window.idleHeld.push(callback);"""
    )
    open_notebook(page, lab, "long.ipynb")
    assert page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.widgets.at(-1).isPlaceholder()"
    )
    page.evaluate(
        """() => {
            window.requestIdleCallback = window.idleLater;
            for (const callback of window.idleHeld) window.requestIdleCallback(callback);
        }"""
    )
    page.evaluate(
        """() => {
            const notebook = window.jupyterapp.shell.currentWidget.content;
            return notebook.scrollToItem(notebook.widgets.length - 1, "start");
        }"""
    )
    wait_marks(page, 1)
    mark = page.locator(MARK)
    assert mark.get_attribute("data-edit-id") == edited["edit_id"]
    last = page.locator(".jp-Notebook .jp-Cell").last
    assert last.locator(".agentruns-cell-mark").count() == 1
    # The editor draws its text a moment after the cell (and its mark) is drawn.
    page.wait_for_function(
        """() => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].at(-1)
            .querySelector('.jp-InputArea-editor')?.innerText.includes('last = 1')""",
        timeout=30_000,
    )
