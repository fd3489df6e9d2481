"""The JupyterLab extension in a real Chromium.

Run outputs render through its renderer, kernel or not.
"""

# The browser fixtures come from test_browser, and pytest passes them by name.
# ruff: noqa: F811

from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat
import pytest

from agents_for_tests import TEST_AGENTS
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
    runs_of,
    save,
    write_notebook,
)

MIME = "application/vnd.jupyter.agentruns.run+json"

CELL = 'from jupyter_agentruns import submit\nrun = submit("markdown_writer", {"delay": 0.05})'


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("labext")
    server = ServerProcess(
        home, home / "agentruns.sqlite3", {"agents": TEST_AGENTS}, app="jupyterlab"
    ).start(timeout=120)
    yield server
    server.kill()


def rendered_run(page, status: str, timeout=60_000):
    """The run view that the labextension's renderer made, once it shows ``status``."""
    locator = page.locator(f".agentruns-renderer .agentruns-run[data-status='{status}']")
    locator.wait_for(timeout=timeout)
    return locator


def use_theme(lab: ServerProcess, theme: str) -> None:
    themes = Path(lab.env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyterlab" / "apputils-extension"
    themes.mkdir(parents=True, exist_ok=True)
    (themes / "themes.jupyterlab-settings").write_text(json.dumps({"theme": theme}))


def shut_down_kernels(lab: ServerProcess) -> None:
    with lab.client() as client:
        for kernel in client.get(lab.url + "api/kernels").json():
            assert client.delete(lab.url + f"api/kernels/{kernel['id']}").status_code == 204


def test_labextension_is_installed(lab):
    with lab.client() as client:
        page_config = client.get(lab.url + "lab", params={"token": lab.token}).text
    assert "jupyter-agentruns" in page_config, (
        "the prebuilt extension is not in JupyterLab's page config"
    )


def test_run_output_renders_through_the_labextension_with_or_without_its_kernel(lab, page):
    write_notebook(lab.home / "rendered.ipynb", [CELL])
    use_theme(lab, "JupyterLab Light")
    open_notebook(page, lab, "rendered.ipynb")
    run_cell(page, 0)
    view = rendered_run(page, "succeeded")
    run_id = view.get_attribute("data-run-id")
    assert run_id.startswith("run_")
    output = page.locator(".jp-OutputArea-output").first
    # The renderer outranks the widget view: no ipywidgets view of it exists.
    assert output.locator(".jupyter-widgets").count() == 0
    answer = view.locator(".agentruns-markdown")
    assert answer.locator("h2").inner_text() == "Weather in Shanghai"
    assert answer.locator("table td").first.inner_text() == "Mon"
    assert answer.locator("pre code").count() == 1
    link = answer.locator("a")
    assert (
        link.get_attribute("target") == "_blank"
        and link.get_attribute("rel") == "noopener noreferrer"
    )
    assert view.locator(".agentruns-run-id").inner_text() == run_id
    assert view.locator(".agentruns-event-type").inner_text() == "x.chart"
    output.screenshot(path=picture("widget.png"))

    # The finished run's state reaches the output, then the file.
    saved = save_until(
        page,
        lab.home / "rendered.ipynb",
        lambda outputs: (
            bool(outputs) and outputs[-1].get("data", {}).get(MIME, {}).get("status") == "succeeded"
        ),
    )
    assert saved[-1]["data"][MIME]["status"] == "succeeded"
    assert saved[-1]["data"][MIME]["run_id"] == run_id

    # No kernel, no widget model: the output still shows the run, live from the server.
    shut_down_kernels(lab)
    use_theme(lab, "JupyterLab Dark")
    page.reload()
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    view = rendered_run(page, "succeeded")
    assert view.get_attribute("data-run-id") == run_id
    assert "model not found" not in page.locator(".jp-Notebook").inner_text()
    assert view.locator(".agentruns-markdown h2").inner_text() == "Weather in Shanghai"
    page.wait_for_timeout(500)  # the theme's fonts and colours settle
    page.locator(".jp-OutputArea-output").first.screenshot(path=picture("widget-dark.png"))
    use_theme(lab, "JupyterLab Light")


def save_until(page, path: Path, holds, timeout: float = 30.0) -> list:
    """Save until the first cell's saved outputs satisfy ``holds`` (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        save(page)
        outputs = nbformat.read(path, as_version=4).cells[0].outputs
        if holds(outputs) or time.monotonic() > deadline:
            return outputs
        page.wait_for_timeout(200)


def finished_run(lab: ServerProcess, agent: str) -> dict:
    with lab.client() as client:
        run = client.post(
            "runs",
            json={"agent": agent, "input": {"delay": 0}},
            headers={"Idempotency-Key": f"{agent}-{time.time()}"},
        ).json()
        for _ in range(100):
            run = client.get(f"runs/{run['run_id']}").json()
            if run["status"] == "succeeded":
                return run
            time.sleep(0.1)
    raise AssertionError(f"{agent} did not finish: {run['status']}")


def write_saved_output(path: Path, run: dict) -> None:
    """A notebook whose one cell kept ``run``'s output from an earlier session, as saved then."""
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("# ran earlier")],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nb.cells[0].outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={
                MIME: {
                    "run_id": run["run_id"],
                    "status": "running",
                    "last_seq": 2,
                    "agent": run["agent"],
                },
                "text/markdown": f"**{run['agent']}** running",
                "text/plain": f"Run(run_id='{run['run_id']}', status='running')",
                "application/vnd.jupyter.widget-view+json": {
                    "model_id": "gone",
                    "version_major": 2,
                    "version_minor": 1,
                },
            },
        )
    ]
    nbformat.write(nb, path)


def test_a_saved_run_output_renders_in_notebook_7(lab, page):
    run = finished_run(lab, "markdown_writer")
    write_saved_output(lab.home / "seven.ipynb", run)
    page.goto(f"{lab.url}notebooks/seven.ipynb?token={lab.token}")
    view = rendered_run(page, "succeeded", timeout=90_000)
    assert view.get_attribute("data-run-id") == run["run_id"]
    assert "model not found" not in page.locator(".jp-Notebook").inner_text()


def test_model_output_cannot_run_script_or_restyle_the_page(lab, page):
    run = finished_run(lab, "hostile_writer")
    write_saved_output(lab.home / "hostile.ipynb", run)
    open_notebook(page, lab, "hostile.ipynb")
    view = rendered_run(page, "succeeded")
    answer = view.locator(".agentruns-markdown")
    answer.get_by_text("Fine text").wait_for()
    page.wait_for_timeout(500)  # an image that fails to load would have fired onerror by now
    assert page.evaluate("() => window.agentrunsPwned") is None
    assert answer.locator("script, style").count() == 0
    assert answer.locator("img").count() == 0 and "<img src=x onerror=" in answer.inner_text()
    answer.locator("a").click()
    assert page.evaluate("() => window.agentrunsPwned") is None
    assert page.evaluate("() => getComputedStyle(document.body).display") != "none"
    assert view.is_visible()


def test_a_refresh_before_the_first_save_finds_the_run_live_in_its_cell(lab, page):
    write_notebook(
        lab.home / "unsaved.ipynb",
        [
            "x = 1",
            "from jupyter_agentruns import submit\n"
            'run = submit("demo", {"prompt": "unsaved", "chunks": 80, "delay": 0.05})',
        ],
    )
    before = {run["run_id"] for run in runs_of(lab)}
    open_notebook(page, lab, "unsaved.ipynb")
    run_cell(page, 1)
    running = rendered_run(page, "running")
    run_id = running.get_attribute("data-run-id")
    page.reload()  # never saved: the file on disk has no output for the cell
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
    cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
    restored = cell.locator(".agentruns-run")
    restored.wait_for(timeout=60_000)
    assert restored.get_attribute("data-run-id") == run_id
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-Notebook .jp-Cell')[1]"
        ".querySelector('.agentruns-run[data-status=succeeded]')",
        timeout=60_000,
    )
    assert "Demo answer about unsaved" in restored.inner_text()
    assert page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".agentruns-run").count() == 0
    assert {run["run_id"] for run in runs_of(lab)} - before == {run_id}


def test_a_saved_notebook_reopened_after_a_server_restart_shows_its_answer_without_running_anything(
    tmp_path, page
):
    home = tmp_path / "home"
    config = {"agents": TEST_AGENTS}
    server = ServerProcess(home, tmp_path / "agentruns.sqlite3", config, app="jupyterlab").start(
        timeout=120
    )
    try:
        write_notebook(home / "record.ipynb", [CELL])
        open_notebook(page, server, "record.ipynb")
        run_cell(page, 0)
        run_id = rendered_run(page, "succeeded").get_attribute("data-run-id")
        # The record reaches the output (a moment after the view shows the end), then the file.
        save_until(
            page,
            home / "record.ipynb",
            lambda outputs: (
                len(outputs) == 1
                and "**succeeded**" in outputs[0].get("data", {}).get("text/markdown", "")
            ),
        )
        shut_down_kernels(server)
    finally:
        server.kill()
    saved = nbformat.read(home / "record.ipynb", as_version=4).cells[0]
    (output,) = saved.outputs
    assert (
        "Weather in Shanghai" in output["data"]["text/markdown"]
        and "**succeeded**" in output["data"]["text/markdown"]
    )

    # The same home and store, a new server process.
    again = ServerProcess(home, tmp_path / "agentruns.sqlite3", config, app="jupyterlab").start(
        timeout=120
    )
    try:
        for url in (f"{again.url}lab/tree/record.ipynb", f"{again.url}notebooks/record.ipynb"):
            page.goto(f"{url}?token={again.token}")
            view = rendered_run(page, "succeeded", timeout=90_000)
            assert view.get_attribute("data-run-id") == run_id
            assert view.locator(".agentruns-markdown h2").inner_text() == "Weather in Shanghai"
            assert "model not found" not in page.locator(".jp-Notebook").inner_text()
        with again.client() as client:
            assert [run["run_id"] for run in client.get("runs").json()["runs"]] == [run_id]
        assert (
            nbformat.read(home / "record.ipynb", as_version=4).cells[0].execution_count
            == saved.execution_count
        )
    finally:
        again.kill()
