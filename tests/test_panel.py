"""The runs panel in JupyterLab's left sidebar, in a real Chromium against a real JupyterLab."""

# The browser fixtures come from test_browser, and pytest passes them by name.
# ruff: noqa: F811

from __future__ import annotations

import json
import time

import nbformat

from conftest import picture
from servers import ServerProcess, wait_status
from test_browser import (  # noqa: F401  (fixtures are found by name)
    browser,
    jp_asyncio_loop,
    jp_server_cleanup,
    lab,
    open_notebook,
    page,
    pytestmark,
    run_cell,
    runs_of,
    save,
    set_theme,
    switch_theme,
    write_notebook,
)

PANEL = "#jupyter-agentruns-runs"


def open_panel(page) -> None:
    page.locator('.jp-SideBar [data-id="jupyter-agentruns-runs"]').click()
    page.locator(PANEL).wait_for(state="visible", timeout=30_000)


def menu_item(page, menu: str, item: str):
    """The menu bar's ``menu`` opened, and its ``item``.

    A click on the menu bar while the page is still starting its plugins can be
    lost (the menu never opens): the menu is clicked again until it shows.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout  # browser tests only

    entry = page.locator(".lm-Menu-item", has_text=item)
    for _ in range(10):
        page.locator(".lm-MenuBar-itemLabel", has_text=menu).click()
        try:
            entry.wait_for(state="visible", timeout=3_000)
            return entry
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
    raise AssertionError(f"the {menu} menu never showed {item!r}")


def panel_row(page, run_id: str):
    return page.locator(f"{PANEL} .agentruns-panel-run[data-run-id='{run_id}']")


def wait_row_status(page, run_id: str, status: str, timeout=60_000) -> None:
    page.wait_for_function(
        """([selector, status]) => {
            const row = document.querySelector(selector);
            return !!row && row.dataset.status === status;
        }""",
        arg=[f"{PANEL} .agentruns-panel-run[data-run-id='{run_id}']", status],
        timeout=timeout,
    )


def cell_run_id(page, index: int) -> str:
    view = page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".agentruns-run")
    view.wait_for(timeout=60_000)
    page.wait_for_function(
        """(index) => {
            const cell = document.querySelectorAll('.jp-Notebook .jp-Cell')[index];
            const view = cell && cell.querySelector('.agentruns-run');
            return !!view && (view.getAttribute('data-run-id') || '').startsWith('run_');
        }""",
        arg=index,
        timeout=60_000,
    )
    return view.get_attribute("data-run-id")


def test_a_run_started_in_a_notebook_is_in_the_panel_live_and_its_name_opens_the_notebook(
    lab, page
):
    write_notebook(
        lab.home / "panel_live.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            # Twelve seconds: still running when the panel's next look at the list
            # (every 5 s) finds it, on a loaded machine too.
            'run = submit("demo", {"prompt": "watch the panel", "chunks": 120, "delay": 0.1})'
        ],
    )
    streams = []
    page.on(
        "request",
        lambda request: streams.append(request.url) if "/api/agentruns/" in request.url else None,
    )
    open_notebook(page, lab, "panel_live.ipynb")
    open_panel(page)
    run_cell(page, 0)
    run_id = cell_run_id(page, 0)
    row = panel_row(page, run_id)
    row.wait_for(timeout=30_000)  # found by the panel's next look at the list
    wait_row_status(page, run_id, "running")
    assert row.locator(".agentruns-panel-agent").inner_text() == "demo"
    assert row.locator(".agentruns-panel-run-title").inner_text() == "watch the panel"
    assert row.locator(".agentruns-panel-notebook").inner_text() == "panel_live.ipynb"
    # Live: the row ends with the run, through the page's one stream, not a poll per run.
    wait_row_status(page, run_id, "succeeded")
    assert row.locator(".agentruns-panel-timing").inner_text().startswith("took ")
    assert row.locator(".agentruns-again").is_visible()
    assert not any(f"runs/{run_id}/events" in url for url in streams)
    assert any("/api/agentruns/streams" in url and run_id in url for url in streams)

    # The notebook's name in the panel opens it.
    save(page)
    page.locator(".lm-TabBar-tab.jp-mod-current .lm-TabBar-tabCloseIcon").click()
    page.locator(".jp-Notebook").wait_for(state="detached", timeout=30_000)
    row.locator(".agentruns-panel-notebook").click()
    page.locator(".lm-TabBar-tab.lm-mod-current", has_text="panel_live.ipynb").wait_for(
        timeout=30_000
    )
    page.locator(".jp-Notebook").wait_for(timeout=30_000)


def test_cancel_from_the_panel_stops_the_run_the_notebook_shows(lab, page):
    write_notebook(
        lab.home / "panel_cancel.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            'run = submit("demo", {"prompt": "cancel me", "chunks": 400, "delay": 0.1})'
        ],
    )
    open_notebook(page, lab, "panel_cancel.ipynb")
    open_panel(page)
    run_cell(page, 0)
    run_id = cell_run_id(page, 0)
    row = panel_row(page, run_id)
    wait_row_status(page, run_id, "running")
    row.locator(".agentruns-cancel").click()
    wait_row_status(page, run_id, "cancelled")
    # The cell's own view, on the same page stream, shows it too; so does the server.
    page.wait_for_function(
        "(runId) => !!document.querySelector(`.jp-Notebook .agentruns-run[data-run-id='${runId}']"
        "[data-status='cancelled']`)",
        arg=run_id,
        timeout=30_000,
    )
    with lab.client() as client:
        run = wait_status(client, run_id, {"cancelled"})
    assert run["cancel"]["reason"] == "cancelled from the runs panel"

    # Run again from the panel: a new run, a retry of this one, listed first.
    row.locator(".agentruns-again").click()
    first = page.locator(f"{PANEL} .agentruns-panel-run").first
    page.wait_for_function(
        "([selector, old]) => { const row = document.querySelector(selector);"
        " return !!row && row.dataset.runId !== old; }",
        arg=[f"{PANEL} .agentruns-panel-run", run_id],
        timeout=30_000,
    )
    again = first.get_attribute("data-run-id")
    with lab.client() as client:
        made = client.get(f"runs/{again}").json()
        client.post(f"runs/{again}/cancel")
    assert made["retry_of"] == run_id and made["session"].endswith("panel_cancel.ipynb")


def test_a_question_is_answered_from_the_panel_and_filters_narrow_the_list(lab, page):
    write_notebook(
        lab.home / "panel_ask.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            'run = submit("demo", {"prompt": "may I?", "ask": True, "chunks": 5})'
        ],
    )
    open_notebook(page, lab, "panel_ask.ipynb")
    open_panel(page)
    run_cell(page, 0)
    run_id = cell_run_id(page, 0)
    row = panel_row(page, run_id)
    wait_row_status(page, run_id, "waiting")
    choices = row.locator(".agentruns-choice")
    assert choices.count() >= 2
    page.locator(PANEL).screenshot(path=picture("panel.png"))
    choice = choices.first.get_attribute("data-choice")
    choices.first.click()
    wait_row_status(page, run_id, "succeeded")
    with lab.client() as client:
        run = wait_status(client, run_id, {"succeeded"})
    assert run["snapshot"]["inputs"][0]["choice"] == choice

    # Filters ask the server: only this notebook's runs, then only failed ones (none here).
    page.locator(f"{PANEL} .agentruns-filter-session").select_option("panel_ask.ipynb")
    page.wait_for_function(
        "(selector) => [...document.querySelectorAll(selector)].every("
        "row => row.querySelector('.agentruns-panel-notebook').textContent === 'panel_ask.ipynb')",
        arg=f"{PANEL} .agentruns-panel-run",
        timeout=30_000,
    )
    page.locator(f"{PANEL} .agentruns-filter-status").select_option("failed")
    page.locator(f"{PANEL} .agentruns-panel-empty", has_text="No runs match").wait_for(
        timeout=30_000
    )


def test_notebook_7_shows_the_panel_in_its_left_sidebar_with_links_to_open(lab, page):
    # The module's server serves Notebook 7's pages too (/notebooks/...), as `jupyter
    # notebook` does: the same front end, with the same extension.
    write_notebook(lab.home / "seven.ipynb", ["print(7)"])
    with lab.client() as client:
        made = client.post(
            "runs",
            json={
                "agent": "demo",
                "input": {"prompt": "seven", "chunks": 3},
                # What a kernel of this notebook sends: its path on disk.
                "session": str(lab.home / "seven.ipynb"),
            },
        ).json()
    page.goto(f"{lab.url}notebooks/seven.ipynb?token={lab.token}")
    page.locator(".jp-Notebook").wait_for(timeout=90_000)
    menu_item(page, "View", "Left Sidebar").hover()
    page.locator(".lm-Menu-item", has_text="Show Agent runs").click()
    row = panel_row(page, made["run_id"])
    row.wait_for(timeout=30_000)
    wait_row_status(page, made["run_id"], "succeeded")
    link = row.locator(".agentruns-panel-notebook")
    assert link.inner_text() == "seven.ipynb"
    assert link.get_attribute("title") == "Open seven.ipynb"


def open_run_page(page, run_id: str):
    """Click the run's title in the panel: its page opens in the main area."""
    panel_row(page, run_id).locator(".agentruns-panel-run-title").click()
    run_page = page.locator(f".agentruns-runpage[data-run-id='{run_id}']")
    run_page.wait_for(timeout=30_000)
    return run_page


def test_a_runs_page_shows_its_timeline_and_answer_goes_to_its_cell_and_deletes_it(lab, page):
    # The run's cell is far down the notebook: Go to cell has to scroll to it.
    filler = ["# filler\n" + "\n".join(f"x_{n} = {n}" for n in range(12))] * 8
    source = (
        "from jupyter_agentruns import submit\n"
        'run = submit("demo", {"prompt": "the page of a run", "chunks": 12, "ask": True})'
    )
    write_notebook(lab.home / "run_page.ipynb", [*filler, source])
    open_notebook(page, lab, "run_page.ipynb")
    run_cell(page, 8)
    run_id = cell_run_id(page, 8)
    choices = page.locator(".jp-Notebook .agentruns-run .agentruns-choice")
    choices.first.wait_for(timeout=60_000)
    choices.first.click()
    page.wait_for_function(
        "(runId) => !!document.querySelector(`.agentruns-run[data-run-id='${runId}']"
        "[data-status='succeeded']`)",
        arg=run_id,
        timeout=60_000,
    )
    save(page)
    page.locator(".lm-TabBar-tab.jp-mod-current .lm-TabBar-tabCloseIcon").click()
    page.locator(".jp-Notebook").wait_for(state="detached", timeout=30_000)

    open_panel(page)
    run_page = open_run_page(page, run_id)
    run_page.locator(".agentruns-runpage-title", has_text="the page of a run").wait_for()
    # Its tab has the runs' icon, as the panel's has.
    page_tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="the page of a run")
    # (drawn by the tab bar's next update, which a loaded machine may not have made yet)
    page_tab.locator(".lm-TabBar-tabIcon svg").wait_for(timeout=10_000)
    assert page_tab.locator(".lm-TabBar-tabIcon svg").count() == 1
    assert (
        '"prompt": "the page of a run"' in run_page.locator(".agentruns-runpage-input").inner_text()
    )
    page.wait_for_function(
        "(runId) => { const el = document.querySelector(`.agentruns-runpage[data-run-id='${runId}']`);"
        " return !!el && el.dataset.status === 'succeeded'"
        " && el.querySelector('.agentruns-runpage-event[data-type=\"run.succeeded\"]'); }",
        arg=run_id,
        timeout=30_000,
    )
    steps = run_page.locator(".agentruns-runpage-event-text").all_inner_texts()
    assert steps[0] == "started" and steps[-1] == "succeeded"
    assert any(step.startswith("asked: ") for step in steps)
    assert any(step.startswith("answered ") for step in steps)
    assert any(step.startswith("wrote ") for step in steps)
    assert any(step.startswith("tool ") for step in steps)
    # The answer as the notebook's view renders it: Markdown, its code block the prompt.
    answer = run_page.locator(".agentruns-message .agentruns-markdown")
    assert answer.locator("h2").inner_text() == "Demo answer about the page of a run"
    assert answer.locator("pre code").inner_text().strip() == "the page of a run"
    assert "tokens" in run_page.locator(".agentruns-usage").inner_text()
    page.screenshot(path=picture("run-page.png"))
    run_page.locator(".agentruns-runpage-timeline").scroll_into_view_if_needed()
    page.screenshot(path=picture("run-page-timeline.png"))

    # Go to cell: the notebook opens with the run's cell selected and in view.
    run_page.locator(".agentruns-runpage-cell").click()
    page.wait_for_function(
        """() => {
            const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')];
            const active = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell.jp-mod-active');
            if (!active || cells.indexOf(active) !== 8) return false;
            const box = active.getBoundingClientRect();
            const view = active.closest('.jp-WindowedPanel-outer, .jp-Notebook').getBoundingClientRect();
            // Its top in view (give or take the notebook's scroll padding).
            return box.top >= view.top - 20 && box.top < view.bottom - 40;
        }""",
        timeout=30_000,
    )
    page.screenshot(path=picture("run-page-go-to-cell.png"))

    # The run id in the cell's view opens the run's page too.
    page.locator(".lm-TabBar-tab", has_text="the page of a run").locator(
        ".lm-TabBar-tabCloseIcon"
    ).click()
    run_page.wait_for(state="detached", timeout=10_000)
    page.locator(f".jp-Notebook .agentruns-run[data-run-id='{run_id}'] .agentruns-run-id").click()
    run_page.wait_for(timeout=30_000)

    # Delete, after a confirmation: the run is gone from the server and the panel.
    run_page.locator(".agentruns-runpage-delete").click()
    assert panel_row(page, run_id).count() == 1  # nothing deleted before the confirmation
    run_page.locator(".agentruns-runpage-delete-yes").click()
    page.wait_for_function(
        "(runId) => document.querySelector(`.agentruns-runpage[data-run-id='${runId}']`)"
        ".dataset.deleted === 'true'",
        arg=run_id,
        timeout=30_000,
    )
    panel_row(page, run_id).wait_for(state="detached", timeout=10_000)
    with lab.client() as client:
        assert client.get(f"runs/{run_id}").status_code == 404
    # The page says so and offers nothing more to do with the run.
    message = run_page.locator(".agentruns-runpage-message")
    assert message.inner_text().startswith("This run was deleted")
    assert run_page.locator("button:visible").all_inner_texts() == []
    page.screenshot(path=picture("run-page-deleted.png"))


def test_the_panel_fits_the_default_sidebar_searches_sorts_and_opens_as_a_table(lab, page):
    made = {}
    with lab.client() as client:
        for prompt, session in [
            ("zebra crossing", "fit/one.ipynb"),
            ("apple harvest", "fit/two.ipynb"),
            ("mango season", "fit/two.ipynb"),
        ]:
            made[prompt] = client.post(
                "runs",
                json={
                    "agent": "demo",
                    "input": {"prompt": prompt, "chunks": 2},
                    "session": session,
                },
            ).json()["run_id"]
        for run_id in made.values():
            wait_status(client, run_id, {"succeeded"})
    page.goto(f"{lab.url}lab?token={lab.token}&reset")
    page.locator(".jp-LabShell").wait_for(timeout=90_000)
    open_panel(page)
    for run_id in made.values():
        panel_row(page, run_id).wait_for(timeout=30_000)
    # At JupyterLab's default sidebar width nothing is cut: not the buttons, not the filters.
    page.locator(PANEL).screenshot(path=picture("panel-default-width.png"))
    clipped = page.evaluate(
        """(selector) => {
            const panel = document.querySelector(selector);
            const edge = panel.getBoundingClientRect().right;
            const cut = [];
            for (const node of panel.querySelectorAll('button:not([hidden]), select, input')) {
                const box = node.getBoundingClientRect();
                if (box.width === 0) continue;
                if (box.right > edge + 0.5 || node.scrollWidth > node.clientWidth + 1)
                    cut.push(node.className || node.tagName);
                // A select cuts the option it shows without overflowing: measure its text.
                if (node.tagName === 'SELECT') {
                    const style = getComputedStyle(node);
                    const pen = document.createElement('canvas').getContext('2d');
                    pen.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
                    const text = node.options[node.selectedIndex].text;
                    // Its padding and the arrow take about 24 px.
                    if (pen.measureText(text).width + 24 > node.clientWidth) cut.push(node.className);
                }
            }
            return cut;
        }""",
        PANEL,
    )
    assert clipped == []
    again = panel_row(page, made["apple harvest"]).locator(".agentruns-again")
    assert again.inner_text() == "Run again"

    def listed():
        return page.eval_on_selector_all(
            f"{PANEL} .agentruns-panel-run", "rows => rows.map(row => row.dataset.runId)"
        )

    # Sorting by title orders the runs; newest first is the server's order.
    page.locator(f"{PANEL} .agentruns-panel-sort").select_option("title")
    order = [run_id for run_id in listed() if run_id in made.values()]
    assert order == [made["apple harvest"], made["mango season"], made["zebra crossing"]]
    page.locator(f"{PANEL} .agentruns-panel-sort").select_option("newest")
    order = [run_id for run_id in listed() if run_id in made.values()]
    assert order == [made["mango season"], made["apple harvest"], made["zebra crossing"]]

    # The search asks the server: by title, then by notebook.
    page.locator(f"{PANEL} .agentruns-panel-search").fill("ZEBRA")
    page.wait_for_function(
        "([selector, runId]) => { const rows = [...document.querySelectorAll(selector)];"
        " return rows.length === 1 && rows[0].dataset.runId === runId; }",
        arg=[f"{PANEL} .agentruns-panel-run", made["zebra crossing"]],
        timeout=30_000,
    )
    page.locator(f"{PANEL} .agentruns-panel-search").fill("fit/two")
    page.wait_for_function(
        "(selector) => { const rows = [...document.querySelectorAll(selector)];"
        " return rows.length === 2 && rows.every(row =>"
        " row.querySelector('.agentruns-panel-notebook').textContent === 'two.ipynb'); }",
        arg=f"{PANEL} .agentruns-panel-run",
        timeout=30_000,
    )
    page.locator(f"{PANEL} .agentruns-panel-search").fill("")

    # The same list as a table in the main area; a title there opens the run's page.
    page.locator(f"{PANEL} .agentruns-panel-open-table").click()
    table = page.locator("#jupyter-agentruns-runs-table")
    table.locator(f".agentruns-panel-run[data-run-id='{made['apple harvest']}']").wait_for(
        timeout=30_000
    )
    page.screenshot(path=picture("runs-table.png"))
    table.locator(
        f".agentruns-panel-run[data-run-id='{made['apple harvest']}'] .agentruns-panel-run-title"
    ).click()
    page.locator(f".agentruns-runpage[data-run-id='{made['apple harvest']}']").wait_for(
        timeout=30_000
    )

    # The dark theme: the panel and a run's page keep their contrast.
    switch_theme(page, "JupyterLab Dark")
    try:
        run_page = page.locator(f".agentruns-runpage[data-run-id='{made['apple harvest']}']")
        run_page.locator(".agentruns-runpage-event[data-type='run.succeeded']").wait_for(
            timeout=30_000
        )
        page.screenshot(path=picture("run-page-dark.png"))
    finally:
        set_theme(lab, "JupyterLab Light")


STATUS_ITEM = "#jp-main-statusbar .agentruns-status-item"
TAB = '.jp-SideBar [data-id="jupyter-agentruns-runs"]'


def toast(page, text: str):
    return page.locator(".Toastify__toast", has_text=text)


def settled(page, locator) -> None:
    """Wait until a toast has slid in: all of it within the page."""
    locator.wait_for(timeout=30_000)
    page.wait_for_function(
        "(node) => node.getBoundingClientRect().right <= window.innerWidth",
        arg=locator.element_handle(),
        timeout=10_000,
    )


def submit_by_api(lab: ServerProcess, prompt: str, where: dict | None = None, **input) -> str:
    """A demo run; ``where``: its ``session`` and ``metadata`` (a notebook and cell)."""
    with lab.client() as client:
        answer = client.post(
            "runs",
            json={
                "agent": "demo",
                "input": {"prompt": prompt, "delay": 0.02, **input},
                **(where or {}),
            },
            headers={"Idempotency-Key": f"attention-{prompt}-{time.monotonic()}"},
        )
    assert answer.status_code == 201, answer.text
    return answer.json()["run_id"]


def open_lab(page, lab: ServerProcess) -> None:
    page.goto(f"{lab.url}lab?token={lab.token}&reset")
    page.locator(TAB).wait_for(timeout=90_000)


def test_a_question_elsewhere_toasts_with_answers_that_answer_and_the_counts_show(lab, page):
    open_lab(page, lab)
    long_run = submit_by_api(lab, "keep going", chunks=400, delay=0.1)
    asking = submit_by_api(lab, "toast me", chunks=5, ask=True)

    # The toast says which run asks what, with the run's own answers.
    question = toast(page, "A run asks: Write the answer about toast me? (toast me)")
    question.wait_for(timeout=30_000)
    assert question.get_by_role("button", name="approve").is_visible()
    assert question.get_by_role("button", name="deny").is_visible()
    # The status bar counts the running and the waiting runs; the panel's tab shows the waiting.
    page.wait_for_function(
        "(selector) => { const item = document.querySelector(selector);"
        " return !!item && item.dataset.waiting === '1' && item.dataset.running === '1'; }",
        arg=STATUS_ITEM,
        timeout=30_000,
    )
    assert page.locator(STATUS_ITEM).inner_text() == "Agent runs: 1 running · 1 waiting"
    assert page.locator(TAB).get_attribute("data-agentruns-waiting") == "1"
    settled(page, question)
    page.screenshot(path=picture("attention.png"))
    # With the panel open (its tab the current one) the badge keeps its digit.
    open_panel(page)
    assert "lm-mod-current" in (page.locator(TAB).get_attribute("class") or "")
    badge = "(selector) => getComputedStyle(document.querySelector(selector), '::before').content"
    assert page.evaluate(badge, TAB) == '"1"'
    page.locator(".jp-SideBar.jp-mod-left").screenshot(path=picture("attention-badge-open.png"))

    question.get_by_role("button", name="approve").click()
    with lab.client() as client:
        run = wait_status(client, asking, {"succeeded"})
    assert run["snapshot"]["inputs"][0]["choice"] == "approve"
    question.wait_for(state="detached", timeout=30_000)
    page.wait_for_function(
        "(selector) => !document.querySelector(selector).hasAttribute('data-agentruns-waiting')",
        arg=TAB,
        timeout=30_000,
    )
    assert page.locator(STATUS_ITEM).inner_text() == "Agent runs: 1 running"

    # A click on the counts opens the panel.
    page.locator(STATUS_ITEM).click()
    page.locator(PANEL).wait_for(state="visible", timeout=30_000)

    # A run that fails away from its notebook says so; Show opens the notebook at its cell.
    write_notebook(lab.home / "toasted.ipynb", [f"x = {n}" for n in range(5)])
    cell_id = nbformat.read(lab.home / "toasted.ipynb", as_version=4).cells[3].id
    where = {"session": "toasted.ipynb", "metadata": {"cell_id": cell_id}}
    submit_by_api(lab, "break down", where, chunks=3, fail=True)
    failed = toast(page, "Run failed: break down")
    failed.wait_for(timeout=30_000)
    failed.get_by_role("button", name="Show").click()
    page.wait_for_function(
        """() => {
            const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')];
            const active = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell.jp-mod-active');
            return !!active && cells.indexOf(active) === 3;
        }""",
        timeout=30_000,
    )
    with lab.client() as client:
        client.post(f"runs/{long_run}/cancel")


def test_a_setting_turns_the_question_toast_off(lab, page):
    settings = lab.home / "lab-settings" / "jupyter-agentruns"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "runs-panel.jupyterlab-settings").write_text(
        json.dumps({"notifyQuestions": False, "tabBadge": False})
    )
    try:
        open_lab(page, lab)
        asking = submit_by_api(lab, "no toast", chunks=3, ask=True)
        # Seen and counted, but neither toasted nor on the tab.
        page.wait_for_function(
            "(selector) => { const item = document.querySelector(selector);"
            " return !!item && item.dataset.waiting === '1'; }",
            arg=STATUS_ITEM,
            timeout=30_000,
        )
        page.wait_for_timeout(500)  # a toast would show within the same update
        assert toast(page, "about no toast?").count() == 0
        assert page.locator(TAB).get_attribute("data-agentruns-waiting") is None
        with lab.client() as client:
            request_id = client.get(f"runs/{asking}").json()["snapshot"]["inputs"][0]["request_id"]
            client.post(f"runs/{asking}/inputs/{request_id}", json={"choice": "deny"})
    finally:
        (settings / "runs-panel.jupyterlab-settings").unlink()


def test_a_refresh_restores_a_run_only_under_the_code_that_made_it(lab, page):
    saved = 'from jupyter_agentruns import submit\nrun = submit("demo", {"prompt": "saved code", "chunks": 3})'
    write_notebook(lab.home / "edited.ipynb", [saved])
    open_notebook(page, lab, "edited.ipynb")
    # Edit the saved cell and run it; then run a new cell; then refresh without saving.
    first = page.locator(".jp-Notebook .jp-Cell").nth(0)
    first.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(saved.replace("saved code", "edited code"))
    page.keyboard.press("Control+Enter")
    edited_run = cell_run_id(page, 0)
    page.keyboard.press("Escape")
    page.keyboard.press("b")
    page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-InputArea-editor").click()
    page.keyboard.insert_text(saved.replace("saved code", "a new cell"))
    page.keyboard.press("Control+Enter")
    new_cell_run = cell_run_id(page, 1)
    page.reload()
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)

    # The saved code stays, and its cell says plainly that the run came from other code.
    notice = first.locator(
        ".jp-OutputArea-output", has_text="This run came from code you did not save"
    )
    notice.wait_for(timeout=60_000)
    assert "edited code" in notice.inner_text()
    assert first.locator(".agentruns-run").get_attribute("data-run-id") == edited_run
    assert "saved code" in first.locator(".jp-InputArea-editor").inner_text()
    assert page.locator(".jp-Notebook .jp-Cell").count() == 1

    # The run of the cell the saved notebook lacks: one notice, which shows it in the panel.
    gone = toast(page, "1 run of edited.ipynb came from cells that are not in the saved notebook")
    settled(page, gone)
    page.screenshot(path=picture("restore-unsaved-code.png"))
    gone.get_by_role("button", name="Show in the runs panel").click()
    row = panel_row(page, new_cell_run)
    row.wait_for(timeout=30_000)
    assert "agentruns-panel-run--marked" in row.get_attribute("class")
    assert "Its cell is not in the saved notebook." in row.inner_text()
    assert page.locator(f"{PANEL} .agentruns-filter-session").input_value().endswith("edited.ipynb")


def test_many_long_permission_options_are_a_list_of_cut_buttons_and_no_wall_in_the_toast(lab, page):
    long_name = "allow this one very particular change to plot.py " * 5  # 250 characters
    options = [
        {"optionId": f"o{n}", "name": f"Option {n}: {long_name}", "kind": "reject_once"}
        for n in range(20)
    ]
    open_lab(page, lab)
    with lab.client() as client:
        response = client.post(
            "runs", json={"agent": "permission_asker", "input": {"options": options}}
        )
        assert response.status_code == 201, response.text
        run_id = response.json()["run_id"]
        wait_status(client, run_id, {"waiting"})

    # The toast offers no twenty buttons: it says how many choices there are and shows them.
    question = toast(page, "A run asks: Allow editing plot.py?")
    settled(page, question)
    labelled = [text for text in question.get_by_role("button").all_inner_texts() if text]
    assert labelled == ["Show its 20 choices"]  # and its close button
    assert question.bounding_box()["height"] < 200
    page.screenshot(path=picture("permission-many-toast.png"))

    # The panel lists them, one full-width button a line, each cut with the whole on hover.
    open_panel(page)
    card = panel_row(page, run_id).locator(".agentruns-input")
    card.wait_for(timeout=30_000)
    choices = card.locator(".agentruns-input-choices")
    buttons = card.locator(".agentruns-choice")
    assert buttons.count() == 20
    width = choices.bounding_box()["width"]
    for index in (0, 19):
        box = buttons.nth(index).bounding_box()
        assert abs(box["width"] - width) < 2 and box["height"] < 30, box
        assert (
            buttons.nth(index).get_attribute("title") == f"{options[index]['name']} (reject once)"
        )
        assert buttons.nth(index).inner_text().endswith("…")
    assert choices.bounding_box()["height"] < 20 * 30
    page.screenshot(path=picture("permission-many-panel.png"))

    buttons.nth(3).click()
    with lab.client() as client:
        run = wait_status(client, run_id, {"succeeded"})
    assert run["snapshot"]["inputs"][0]["choice"] == "o3"


def test_a_view_attached_to_a_run_well_under_way_starts_at_its_answers_first_line(lab, page):
    # A run's page opened once much of the answer has streamed: as a refreshed or
    # re-run cell, the view draws text already longer than its box.
    open_lab(page, lab)
    run_id = submit_by_api(lab, "first line", chunks=600, delay=0.05)
    with lab.client() as client:
        deadline = time.monotonic() + 60
        while client.get(f"runs/{run_id}").json()["last_seq"] < 250:
            assert time.monotonic() < deadline, "the run did not stream"
            time.sleep(0.2)
    try:
        open_panel(page)
        run_page = open_run_page(page, run_id)
        box = run_page.locator(".agentruns-messages")
        box.locator("h2").wait_for(timeout=30_000)
        page.wait_for_timeout(300)  # more text has come and been drawn
        shown = box.evaluate(
            "(box) => ({top: box.scrollTop, overflow: box.scrollHeight > box.clientHeight + 50,"
            " heading: box.querySelector('h2').getBoundingClientRect().top"
            " - box.getBoundingClientRect().top})"
        )
        assert shown["overflow"], shown  # more text than the box shows
        assert shown["top"] == 0 and 0 <= shown["heading"] < 40, shown  # its first line in view
        page.screenshot(path=picture("run-page-first-line.png"))
        # A reader who scrolls to the end is followed as the text grows.
        height = box.evaluate(
            "(box) => { box.scrollTop = box.scrollHeight; return box.scrollHeight; }"
        )
        page.wait_for_function(
            "([box, height]) => box.scrollHeight > height"
            " && box.scrollTop + box.clientHeight >= box.scrollHeight - 8",
            arg=[box.element_handle(), height],
            timeout=10_000,
        )
    finally:
        with lab.client() as client:
            client.post(f"runs/{run_id}/cancel")


def test_new_run_from_the_panel_by_keyboard_opens_on_its_page(lab, page):
    write_notebook(lab.home / "new_run.ipynb", ["x = 1"])
    open_notebook(page, lab, "new_run.ipynb")
    open_panel(page)
    before = {run["run_id"] for run in runs_of(lab)}
    page.locator(f"{PANEL} .agentruns-panel-new").click()
    form = page.locator(f"{PANEL} .agentruns-newrun")
    form.wait_for(state="visible")
    agent = form.locator(".agentruns-newrun-agent")
    page.wait_for_function(
        "(selector) => document.querySelector(selector).options.length > 0",
        arg=f"{PANEL} .agentruns-newrun-agent",
    )
    assert agent.input_value() == "demo"  # the server's default_agent: none set, demo
    # Keyboard only: the prompt has the focus; Shift+Enter is a new line, Enter starts.
    page.keyboard.type("a run from the panel")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("second line")
    form.locator(".agentruns-newrun-notebook").fill("new_run.ipynb")
    form.locator(".agentruns-newrun-prompt").press("Enter")
    run_page = page.locator(".agentruns-runpage")
    run_page.wait_for(timeout=30_000)
    (run,) = [run for run in runs_of(lab) if run["run_id"] not in before]
    assert run["input"] == {"prompt": "a run from the panel\nsecond line"}
    assert run["session"] == "new_run.ipynb" and run["metadata"] == {"notebook": "new_run.ipynb"}
    assert run_page.get_attribute("data-run-id") == run["run_id"]
    page.wait_for_function(
        "(runId) => document.querySelector(`.agentruns-runpage[data-run-id='${runId}']`)"
        "?.dataset.status === 'succeeded'",
        arg=run["run_id"],
        timeout=60_000,
    )
    assert form.is_hidden()
    # A bad notebook path is said, and nothing starts.
    page.locator(f"{PANEL} .agentruns-panel-new").click()
    form.locator(".agentruns-newrun-prompt").fill("nope")
    form.locator(".agentruns-newrun-notebook").fill("../outside.ipynb")
    form.locator(".agentruns-newrun-start").click()
    assert "not a notebook's path" in form.locator(".agentruns-newrun-message").inner_text()
    assert len(runs_of(lab)) == len(before) + 1
    page.locator(PANEL).screenshot(path=picture("panel-new-run.png"))
    switch_theme(page, "JupyterLab Dark")
    try:
        page.locator(PANEL).screenshot(path=picture("panel-new-run-dark.png"))
    finally:
        set_theme(lab, "JupyterLab Light")


def test_two_agent_cells_are_one_conversation_that_opens_as_a_chat_and_takes_a_reply(lab, page):
    write_notebook(
        lab.home / "chat.ipynb", ["%%agent demo\nfirst question", "%%agent demo\nsecond"]
    )
    open_notebook(page, lab, "chat.ipynb")
    run_cell(page, 0)
    first = cell_run_id(page, 0)
    run_cell(page, 1)
    second = cell_run_id(page, 1)
    for run_id in (first, second):
        page.locator(f".agentruns-run[data-run-id='{run_id}'][data-status='succeeded']").wait_for(
            timeout=90_000
        )
    open_panel(page)
    page.locator(f"{PANEL} .agentruns-panel-conversations-toggle").click()
    row = page.locator(f"{PANEL} .agentruns-conversation[data-session='chat.ipynb']")
    row.wait_for(timeout=30_000)
    # One conversation of this notebook (the module's other tests make others of theirs).
    assert page.locator(f"{PANEL} .agentruns-conversation[data-session='chat.ipynb']").count() == 1
    assert row.locator(".agentruns-conversation-title").inner_text() == "first question"
    assert row.locator(".agentruns-conversation-agent").inner_text() == "demo"
    assert row.locator(".agentruns-conversation-runs").inner_text() == "2 runs"
    assert page.locator(f"{PANEL} .agentruns-panel-list").is_hidden()

    row.click()
    chat = page.locator("#jp-main-dock-panel .agentruns-conversation-view")
    chat.wait_for(timeout=30_000)
    views = chat.locator(".agentruns-conversation-run > .agentruns-run")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#jp-main-dock-panel .agentruns-conversation-run"
        " > .agentruns-run')].map((view) => view.dataset.runId).join(' ') !== ''",
        timeout=30_000,
    )
    assert [views.nth(i).get_attribute("data-run-id") for i in range(views.count())] == [
        first,
        second,
    ]
    box = chat.locator(".agentruns-followup-text")
    page.wait_for_function("(node) => !node.disabled", arg=box.element_handle(), timeout=30_000)
    box.click()
    page.keyboard.type("and a reply from the chat")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => document.querySelectorAll('#jp-main-dock-panel .agentruns-conversation-run"
        " > .agentruns-run').length === 3",
        timeout=30_000,
    )
    reply = views.nth(2)
    page.wait_for_function(
        "(node) => node.dataset.status === 'succeeded'", arg=reply.element_handle(), timeout=90_000
    )
    mine = [run for run in runs_of(lab) if run["session"] == "chat.ipynb"]
    assert len(mine) == 3
    newest = mine[0]
    assert newest["run_id"] == reply.get_attribute("data-run-id")
    assert newest["agent"] == "demo"
    assert newest["input"] == {"prompt": "and a reply from the chat"}
    assert newest["metadata"]["follow_up_of"] == first
    # The tab, the reply at the bottom of the chat and its box under it.
    chat.locator(".agentruns-conversation-reply").scroll_into_view_if_needed()
    page.screenshot(path=picture("conversation.png"))

    # Open beside: the chat docked in the right sidebar, beside the notebook.
    chat.locator(".agentruns-conversation-beside").click()
    docked = page.locator("#jp-right-stack .agentruns-conversation-view")
    docked.wait_for(timeout=30_000)
    page.wait_for_function(
        "() => document.querySelectorAll('#jp-right-stack .agentruns-conversation-run"
        " > .agentruns-run').length === 3",
        timeout=30_000,
    )
    page.screenshot(path=picture("conversation-beside.png"))

    # A refresh opens it again (here in the dark theme, for its picture).
    page.on("dialog", lambda dialog: dialog.accept())
    set_theme(lab, "JupyterLab Dark")
    try:
        page.reload()
        page.locator(".agentruns-conversation-view").first.wait_for(
            state="attached", timeout=90_000
        )
        page.wait_for_function(
            "() => document.querySelectorAll('.agentruns-conversation-run > .agentruns-run')"
            ".length === 3",
            timeout=30_000,
        )
        page.wait_for_function(
            "() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000
        )
        page.screenshot(path=picture("conversation-dark.png"))
    finally:
        set_theme(lab, "JupyterLab Light")


def test_the_page_url_an_mcp_client_is_given_and_a_schedules_runs_open_the_runs_page(lab, page):
    call = {
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "start_run", "arguments": {"agent": "demo", "input": {"prompt": "mcp"}}},
    }  # fmt: skip
    with lab.client() as http:
        answer = http.post(
            "mcp", headers={"Accept": "application/json, text/event-stream"}, json=call
        )
    started = answer.json()["result"]["structuredContent"]
    page.goto(f"{started['page_url']}&token={lab.token}")
    run_page = page.locator(f".agentruns-runpage[data-run-id='{started['run_id']}']")
    run_page.wait_for(timeout=60_000)
    # The link's parameter left the address: a reload opens no second page.
    assert "agentruns-run" not in page.url and page.url.startswith(f"{lab.url}lab")

    # A schedule of every second (the server looks every 5 s): the panel lists it, its
    # next time and its runs as they come; a run's chip opens the run's page.
    with lab.client() as http:
        made = http.post(
            "schedules",
            json={
                "agent": "demo",
                "input": {"prompt": "on a schedule", "chunks": 3, "delay": 0},
                "cron": "* * * * * *",
                "timezone": "Europe/Paris",
            },
        )
    assert made.status_code == 201, made.text
    schedule_id = made.json()["schedule_id"]
    try:
        open_panel(page)
        summary = page.locator(f"{PANEL} .agentruns-schedules-summary")
        summary.wait_for(timeout=30_000)
        assert summary.inner_text() == "Schedules (1)"
        summary.click()  # the section opens
        row = page.locator(f"{PANEL} .agentruns-schedule[data-schedule-id='{schedule_id}']")
        row.wait_for(timeout=10_000)
        assert row.locator(".agentruns-schedule-agent").inner_text() == "demo"
        assert row.locator(".agentruns-schedule-cron").inner_text() == "* * * * * *"
        assert row.locator(".agentruns-schedule-zone").inner_text() == "Europe/Paris"
        # The panel looks again every few seconds: the slot's run comes, then ends.
        chip = row.locator(".agentruns-schedule-run[data-status='succeeded']").first
        chip.wait_for(timeout=60_000)
        assert row.locator(".agentruns-schedule-next").inner_text().startswith("next ")
        page.locator(f"{PANEL} .agentruns-schedules").screenshot(path=picture("schedules.png"))
        scheduled = chip.get_attribute("data-run-id")
        chip.click()
        page.locator(f".agentruns-runpage[data-run-id='{scheduled}']").wait_for(timeout=30_000)
        with lab.client() as http:
            run = http.get(f"runs/{scheduled}").json()
        assert run["metadata"]["schedule_id"] == schedule_id
    finally:
        with lab.client() as http:
            assert http.delete(f"schedules/{schedule_id}").status_code == 204
