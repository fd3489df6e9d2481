"""``%%agent`` and ``%agent`` in a real kernel started by a real server for a notebook."""

import time

import pytest

from servers import ServerProcess
from test_notebook_api import Kernel, widget_views

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def magic_lab(tmp_path, request):
    options = getattr(request, "param", {})
    server = ServerProcess(
        tmp_path / "home", tmp_path / "agentruns.sqlite3", options.get("agentruns", {})
    )
    if "startup" in options:
        startup = tmp_path / "own_startup.py"
        startup.write_text(options["startup"])
        server.env["PYTHONSTARTUP"] = str(startup)
    server.start()
    (server.home / "work").mkdir(exist_ok=True)
    http = server.client()
    kernel = Kernel(server, http)
    try:
        yield server, http, kernel
    finally:
        try:
            kernel.close()
            http.close()
        finally:
            server.kill()


def runs_of(http):
    return http.get("runs").json()["runs"]


def finished(http, run_id):
    """The run, once the demo agent has ended it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = http.get(f"runs/{run_id}").json()
        if run["status"] not in ("queued", "running"):
            return run
        time.sleep(0.2)
    raise AssertionError(f"the run {run_id} did not end")


CELL = "%%agent demo\nweather in Shanghai\n"


def test_an_agent_cell_is_a_run_whose_view_is_its_output_and_rerunning_it_reattaches(magic_lab):
    server, http, kernel = magic_lab
    # No %load_ext: a kernel the server started for a notebook has the magics already.
    _, displays, error = kernel.run_cell(CELL, "cell-1")
    assert error is None, error
    assert len(widget_views(displays)) == 1
    (run,) = runs_of(http)
    assert run["agent"] == "demo" and run["input"] == {"prompt": "weather in Shanghai"}
    assert run["session"] == "work/analysis.ipynb"
    assert run["metadata"]["cell_id"] == "cell-1"
    assert (
        "Demo answer about weather in Shanghai" in finished(http, run["run_id"])["output"]["text"]
    )

    # The same cell again, and after a kernel restart: the same run, shown again.
    _, displays, error = kernel.run_cell(CELL, "cell-1")
    assert error is None and len(widget_views(displays)) == 1
    kernel.restart()
    _, displays, error = kernel.run_cell(CELL, "cell-1")
    assert error is None and len(widget_views(displays)) == 1
    assert [r["run_id"] for r in runs_of(http)] == [run["run_id"]]

    # Its body changed: a new run; --new: a new run of the same body.
    _, _, error = kernel.run_cell("%%agent demo\nweather in Paris\n", "cell-1")
    assert error is None, error
    _, _, error = kernel.run_cell("%%agent demo --new\nweather in Paris\n", "cell-1")
    assert error is None, error
    listed = runs_of(http)
    assert len(listed) == 3
    assert [r["input"]["prompt"] for r in listed] == [
        "weather in Paris",
        "weather in Paris",
        "weather in Shanghai",
    ]


def test_the_one_line_form_the_default_agent_and_a_session(magic_lab):
    server, http, kernel = magic_lab
    _, displays, error = kernel.run_cell("%agent demo what is in df?", "cell-1")
    assert error is None and len(widget_views(displays)) == 1
    # No agent named: the server's default_agent (none configured: demo).
    assert http.get("agents").json()["default_agent"] == "demo"
    _, _, error = kernel.run_cell("%%agent --session study\nsummarise it\n", "cell-2")
    assert error is None, error
    latest, first = runs_of(http)
    assert first["input"] == {"prompt": "what is in df?"} and first["agent"] == "demo"
    assert latest["agent"] == "demo" and latest["session"] == "study"


@pytest.mark.parametrize("magic_lab", [{"agentruns": {"default_agent": "nosuch"}}], indirect=True)
def test_a_bad_line_is_one_line_saying_what_is_wrong_and_submits_nothing(magic_lab):
    server, http, kernel = magic_lab
    _, _, error = kernel.run_cell("%%agent demo --colour red\nhello\n", "cell-1")
    assert "MagicUsageError" in error and "--colour" in error
    assert len(error.splitlines()) == 1
    _, _, error = kernel.run_cell("%%agent demo\n\n", "cell-1")
    assert "takes the prompt as the cell's body" in error
    _, _, error = kernel.run_cell("%agent demo", "cell-1")
    assert "takes the agent's name and a prompt" in error
    # A mode the agent does not take: the server's one-line answer, nothing started.
    _, _, error = kernel.run_cell("%%agent demo --mode plan\nhello\n", "cell-1")
    assert "'mode' was unexpected" in error and "400 invalid_input" in error
    # The configured default is not an agent here: the server says which agents there are.
    _, _, error = kernel.run_cell("%%agent\nhello\n", "cell-1")
    assert "nosuch" in error
    assert runs_of(http) == []


@pytest.mark.parametrize("magic_lab", [{"startup": "OWN_STARTUP_RAN = 42\n"}], indirect=True)
def test_the_persons_own_startup_file_still_runs_and_leaves_its_names(magic_lab):
    server, http, kernel = magic_lab
    stdout, _, error = kernel.run_cell(
        "print(OWN_STARTUP_RAN, '_agentruns_startup' in dir())", "cell-1"
    )
    assert error is None, error
    assert stdout.split() == ["42", "False"]
    _, _, error = kernel.run_cell(CELL, "cell-2")
    assert error is None, error


@pytest.mark.parametrize("magic_lab", [{"agentruns": {"kernel_magics": False}}], indirect=True)
def test_with_kernel_magics_off_load_ext_brings_them(magic_lab):
    server, http, kernel = magic_lab
    # IPython's "Cell magic `%%agent` not found" (on stderr): no view, no run.
    _, displays, _ = kernel.run_cell(CELL, "cell-1")
    assert widget_views(displays) == [] and runs_of(http) == []
    _, _, error = kernel.run_cell("%load_ext jupyter_agentruns", "cell-2")
    assert error is None, error
    _, displays, error = kernel.run_cell(CELL, "cell-1")
    assert error is None and len(widget_views(displays)) == 1
    assert len(runs_of(http)) == 1
