"""The JupyterLab extension in a real Chromium: run outputs render through its renderer, kernel or not."""

# The browser fixtures come from test_browser, and pytest passes them by name.
# ruff: noqa: F811

from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat
import pytest
from agents_for_tests import TEST_AGENTS
from servers import ServerProcess
from test_browser import (  # noqa: F401  (fixtures are found by name)
    browser,
    jp_asyncio_loop,
    jp_server_cleanup,
    open_notebook,
    page,
    pytestmark,
    run_cell,
    save,
    write_notebook,
)

MIME = "application/vnd.jupyter.agentruns.run+json"
DOCS = Path(__file__).parent.parent / "docs"

# What Run's display will carry once the kernel side writes it: the widget
# view, text/plain, and the run's mime data for the labextension's renderer.
CELL = f"""\
from IPython.display import display
from jupyter_agentruns import submit
run = submit("markdown_writer", {{"delay": 0.05}}, display=False)
data, metadata = run._repr_mimebundle_()
data["{MIME}"] = {{"run_id": run.run_id, "status": run.status, "last_seq": run.last_seq, "agent": "markdown_writer"}}
display(data, metadata=metadata, raw=True)
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("labext")
    server = ServerProcess(home, home / "agentruns.sqlite3", {"agents": TEST_AGENTS}, app="jupyterlab").start(timeout=120)
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
    assert "jupyter-agentruns" in page_config, "the prebuilt extension is not in JupyterLab's page config"


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
    assert link.get_attribute("target") == "_blank" and link.get_attribute("rel") == "noopener noreferrer"
    assert view.locator(".agentruns-run-id").inner_text() == run_id
    assert view.locator(".agentruns-event-type").inner_text() == "x.chart"
    DOCS.mkdir(exist_ok=True)
    output.screenshot(path=str(DOCS / "widget.png"))

    # The finished run's state reaches the output, then the file.
    page.wait_for_timeout(1000)
    save(page)
    saved = nbformat.read(lab.home / "rendered.ipynb", as_version=4).cells[0].outputs
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
    page.locator(".jp-OutputArea-output").first.screenshot(path=str(DOCS / "widget-dark.png"))
    use_theme(lab, "JupyterLab Light")


def finished_run(lab: ServerProcess, agent: str) -> dict:
    with lab.client() as client:
        run = client.post("runs", json={"agent": agent, "input": {"delay": 0}}, headers={"Idempotency-Key": f"{agent}-{time.time()}"}).json()
        for _ in range(100):
            run = client.get(f"runs/{run['run_id']}").json()
            if run["status"] == "succeeded":
                return run
            time.sleep(0.1)
    raise AssertionError(f"{agent} did not finish: {run['status']}")


def write_saved_output(path: Path, run: dict) -> None:
    """A notebook whose one cell kept the output of ``run`` from an earlier session, as saved then."""
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("# ran earlier")],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nb.cells[0].outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={
                MIME: {"run_id": run["run_id"], "status": "running", "last_seq": 2, "agent": run["agent"]},
                "text/markdown": f"**{run['agent']}** running",
                "text/plain": f"Run(run_id='{run['run_id']}', status='running')",
                "application/vnd.jupyter.widget-view+json": {"model_id": "gone", "version_major": 2, "version_minor": 1},
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
    assert answer.locator("img").get_attribute("onerror") is None
    answer.locator("a").click()
    assert page.evaluate("() => window.agentrunsPwned") is None
    assert page.evaluate("() => getComputedStyle(document.body).display") != "none"
    assert view.is_visible()
