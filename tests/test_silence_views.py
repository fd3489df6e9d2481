"""A stuck run seen as a person sees it: every view says its agent has said nothing for a while,
and the run's page shows the last lines its ACP agent wrote to stderr. Real Chromium, real JupyterLab."""

# The browser fixtures come from test_browser, and pytest passes them by name.
# ruff: noqa: F811

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import picture
from servers import ServerProcess
from test_browser import (  # noqa: F401  (fixtures are found by name)
    browser,
    jp_asyncio_loop,
    jp_server_cleanup,
    open_notebook,
    page,
    pytestmark,
    run_cell,
    write_notebook,
)
from test_panel import open_panel, open_run_page, panel_row

SCRIPTED = [sys.executable, str(Path(__file__).with_name("acp_agent.py"))]
SECRET = "sk-test-entry-secret-0123456789"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("lab")
    state = home / "acp-state"
    state.mkdir()
    entry = {"command": SCRIPTED, "env": {"ACP_TEST_STATE": str(state), "SECRET": SECRET}}
    server = ServerProcess(
        home,
        home / "agentruns.sqlite3",
        {"heartbeat_interval": 2, "acp_agents": {"scripted": entry}},
        app="jupyterlab",
    ).start(timeout=120)
    yield server
    server.kill()


def test_a_silent_agent_is_named_in_the_widget_the_panel_and_its_page_with_its_stderr(lab, page):
    source = 'from jupyter_agentruns import submit\nrun = submit("scripted", {"prompt": "stuck"})'
    write_notebook(lab.home / "stuck.ipynb", [source])
    # The page's clock is Playwright's (it runs as a real one): the test can move it on.
    page.clock.install()
    open_notebook(page, lab, "stuck.ipynb")
    run_cell(page, 0)
    view = page.locator(".jp-Notebook .agentruns-run[data-status='running']")
    view.wait_for(timeout=60_000)
    run_id = view.get_attribute("data-run-id")
    elapsed = view.locator(".agentruns-elapsed")
    assert "no word" not in elapsed.inner_text()
    # Two and a half minutes later, for the page: the agent has said nothing since it began.
    page.clock.fast_forward("02:30")
    page.wait_for_function(
        "() => (document.querySelector('.jp-Notebook .agentruns-elapsed') || {})"
        ".textContent?.includes('no word from the agent for 2 min')",
        timeout=15_000,
    )
    assert "agentruns-elapsed--silent" in elapsed.get_attribute("class")

    open_panel(page)
    timing = panel_row(page, run_id).locator(".agentruns-panel-timing")
    page.wait_for_function(
        "(el) => el.textContent.includes('no word from the agent for 2 min')",
        arg=timing.element_handle(),
        timeout=15_000,
    )
    run_page = open_run_page(page, run_id)
    stderr = run_page.locator(".agentruns-runpage-stderr")
    stderr.wait_for(state="visible", timeout=30_000)
    said = stderr.inner_text()
    assert said.splitlines()[-1] == (
        "ERROR <b>500</b> Automatic streaming tool choice is not supported (key [hidden])"
    )
    assert SECRET not in said and len(said.splitlines()) == 20
    # What the agent wrote is text: its markup made no element.
    assert stderr.locator("b").count() == 0
    assert "no word from the agent" in run_page.locator(".agentruns-elapsed").inner_text()
    stderr.scroll_into_view_if_needed()
    page.screenshot(path=picture("silent-agent-run-page.png"))

    with lab.client() as client:
        client.post(f"runs/{run_id}/cancel")
    page.wait_for_function(
        "(runId) => !!document.querySelector(`.agentruns-runpage[data-run-id='${runId}']"
        "[data-status='cancelled']`)",
        arg=run_id,
        timeout=30_000,
    )
    assert "no word" not in run_page.locator(".agentruns-elapsed").inner_text()
