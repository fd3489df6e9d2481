"""The notebook API in a real kernel started by a real server: re-running a cell re-attaches."""

import hashlib
import re
import sys
import time
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient

from jupyter_agentruns.agents.demo import answer_words

from servers import ServerProcess

pytestmark = pytest.mark.timeout(180)


class Kernel:
    """A kernel started by the server for a notebook, driven over its connection file."""

    def __init__(self, server: ServerProcess, http, path="work/analysis.ipynb"):
        self.server = server
        self.http = http
        session = http.post(
            server.url + "api/sessions",
            json={
                "path": path,
                "type": "notebook",
                "name": path.rsplit("/", 1)[-1],
                "kernel": {"name": "python3"},
            },
        ).json()
        self.kernel_id = session["kernel"]["id"]
        self.connect()

    def connect(self):
        connection = self.server.runtime_dir / f"kernel-{self.kernel_id}.json"
        deadline = time.monotonic() + 60
        while not connection.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        # A kernel still starting does not answer its heartbeat yet, which the
        # client reads as "died": try again until it answers or the time is up.
        while True:
            self.client = BlockingKernelClient()
            self.client.load_connection_file(str(connection))
            self.client.start_channels()
            try:
                self.client.wait_for_ready(timeout=max(1, deadline - time.monotonic()))
                return
            except RuntimeError:
                self.client.stop_channels()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def restart(self):
        self.client.stop_channels()
        response = self.http.post(self.server.url + f"api/kernels/{self.kernel_id}/restart")
        assert response.status_code == 200
        self.connect()

    def run_cell(self, code, cell_id):
        """Execute ``code`` as the notebook cell ``cell_id``.

        Returns (stdout, display outputs, error).
        """
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
        }
        message = self.client.session.msg("execute_request", content, metadata={"cellId": cell_id})
        self.client.shell_channel.send(message)
        stdout, displays, error = "", [], None
        self.updates = []  # update_display_data: (display_id, data)
        while True:
            reply = self.client.get_iopub_msg(timeout=60)
            if reply["parent_header"].get("msg_id") != message["header"]["msg_id"]:
                continue
            kind, body = reply["msg_type"], reply["content"]
            if kind == "stream" and body["name"] == "stdout":
                stdout += body["text"]
            elif kind in ("display_data", "execute_result"):
                displays.append(body["data"])
            elif kind == "update_display_data":
                self.updates.append((body["transient"]["display_id"], body["data"]))
            elif kind == "error":
                error = "\n".join(body["traceback"])
            elif kind == "status" and body["execution_state"] == "idle":
                return stdout, displays, error

    def close(self):
        self.client.stop_channels()
        self.http.delete(self.server.url + f"api/kernels/{self.kernel_id}")


@pytest.fixture
def agentruns_config():
    return {}


@pytest.fixture
def lab(tmp_path, agentruns_config):
    server = ServerProcess(
        tmp_path / "home", tmp_path / "agentruns.sqlite3", agentruns_config
    ).start()
    (server.home / "work").mkdir(exist_ok=True)
    http = server.client()
    kernel = Kernel(server, http)
    try:
        yield server, http, kernel
    finally:  # the server goes whatever closing the kernel or the client raised
        try:
            kernel.close()
            http.close()
        finally:
            server.kill()


CELL = """
from jupyter_agentruns import submit
run = submit("demo", {"prompt": "weather in Shanghai", "chunks": 8, "delay": 0})
run.wait(60)
print(run.run_id, run.status, repr(run.text))
"""


def widget_views(displays):
    return [d for d in displays if "application/vnd.jupyter.widget-view+json" in d]


def test_rerunning_a_cell_and_restarting_the_kernel_reattach_to_the_same_run(lab):
    server, http, kernel = lab
    first, displays, error = kernel.run_cell(CELL, "cell-1")
    assert error is None, error
    run_id, status, text = first.split(" ", 2)
    assert status == "succeeded" and "Demo answer about weather in Shanghai" in text
    assert len(widget_views(displays)) == 1

    again, _, error = kernel.run_cell(CELL, "cell-1")
    assert error is None and again.split(" ")[0] == run_id
    # Edited code with the same input is the same run too.
    edited, _, error = kernel.run_cell(CELL + "# looked at\n", "cell-1")
    assert error is None and edited.split(" ")[0] == run_id

    kernel.restart()
    after_restart, _, error = kernel.run_cell(CELL, "cell-1")
    assert error is None, error
    assert after_restart == first

    runs = http.get("runs").json()["runs"]
    assert [r["run_id"] for r in runs] == [run_id]
    # The notebook's path relative to the server's root, as JupyterLab names it.
    assert runs[0]["session"] == "work/analysis.ipynb"


MIME = "application/vnd.jupyter.agentruns.run+json"


def test_the_output_carries_a_run_reference_and_a_record_brought_up_to_date_at_the_end(lab):
    server, http, kernel = lab
    stdout, displays, error = kernel.run_cell(CELL, "cell-1")
    assert error is None, error
    run_id = stdout.split(" ")[0]
    (shown,) = widget_views(displays)
    assert shown[MIME]["run_id"] == run_id and shown[MIME]["agent"] == "demo"
    assert "**Agent run** `demo`" in shown["text/markdown"]
    # run.wait() saw the end: the displayed record is updated in place.
    updates = [data for _, data in kernel.updates if MIME in data]
    assert updates and updates[-1][MIME]["status"] == "succeeded"
    assert "Demo answer about weather in Shanghai" in updates[-1]["text/markdown"]
    assert (
        updates[-1]["text/markdown"]
        == http.get(f"runs/{run_id}", headers={"Accept": "text/markdown"}).text
    )
    # Which cell made the run, its code as the notebook sent it (a refreshed
    # page restores the run only under that code), and its kernel (the
    # notebook tools act on it).
    assert http.get(f"runs/{run_id}").json()["metadata"] == {
        "cell_id": "cell-1",
        "cell_source": CELL,
        "cell_source_sha256": hashlib.sha256(CELL.encode()).hexdigest(),
        "kernel_id": kernel.kernel_id,
    }


@pytest.mark.parametrize("agentruns_config", [{"idempotency_ttl_seconds": 1, "lease_seconds": 1.5}])
def test_a_cell_finds_its_run_after_the_key_ttl_and_follows_its_newest_run_again(lab):
    server, http, kernel = lab
    first, _, error = kernel.run_cell(CELL, "cell-1")
    assert error is None, error
    run_id = first.split(" ")[0]
    time.sleep(2.5)  # past idempotency_ttl_seconds, and the sweeps that purge keys
    again, _, _ = kernel.run_cell(CELL + "print(run.reattached, repr(run.followed))\n", "cell-1")
    assert again.split(" ")[0] == run_id and again.splitlines()[-1] == "True ''"
    # Run again from the view: a new run linked by retry_of, with the same body.
    original = http.get(f"runs/{run_id}").json()
    body = {name: original[name] for name in ("agent", "input", "session", "metadata")}
    retry = http.post("runs", json={**body, "retry_of": run_id}).json()
    kernel.restart()
    after, _, error = kernel.run_cell(
        CELL + "print(run.reattached, repr(run.followed))\n", "cell-1"
    )
    assert error is None, error
    assert after.split(" ")[0] == retry["run_id"]
    assert after.splitlines()[-1] == f"True {run_id!r}"
    assert len(http.get("runs").json()["runs"]) == 2


def test_another_cell_or_new_true_starts_another_run(lab):
    server, http, kernel = lab
    first, _, _ = kernel.run_cell(CELL, "cell-1")
    other, _, _ = kernel.run_cell(CELL, "cell-2")
    forced, _, error = kernel.run_cell(
        CELL.replace('"delay": 0}', '"delay": 0}, new=True'), "cell-1"
    )
    assert error is None, error
    ids = {first.split(" ")[0], other.split(" ")[0], forced.split(" ")[0]}
    assert len(ids) == 3
    assert len(http.get("runs").json()["runs"]) == 3


def test_a_view_saying_a_follow_up_ended_brings_the_kernels_record_of_the_thread_up_to_date(lab):
    server, http, kernel = lab
    stdout, _, error = kernel.run_cell(CELL, "cell-1")
    assert error is None, error
    run_id = stdout.split(" ")[0]
    root = http.get(f"runs/{run_id}").json()
    follow_up = http.post(
        "runs",
        json={
            "agent": "demo",
            "input": {"prompt": "and tomorrow?", "chunks": 4, "delay": 0},
            "session": root["session"],
            "metadata": {"follow_up_of": run_id},
        },
    ).json()
    deadline = time.monotonic() + 60
    while http.get(f"runs/{follow_up['run_id']}").json()["status"] != "succeeded":
        assert time.monotonic() < deadline, "the follow-up did not end"
        time.sleep(0.1)
    # What the view writes into the widget's state (a front end without the extension's renderer).
    _, _, error = kernel.run_cell(f"run.thread = [{follow_up['run_id']!r}]", "cell-2")
    assert error is None, error
    (update,) = [data for _, data in kernel.updates if MIME in data]
    record = http.get(f"runs/{run_id}", headers={"Accept": "text/markdown"}).text
    assert update["text/markdown"] == record
    assert record.index("weather in Shanghai") < record.index("> and tomorrow?")
    # The same list again is no news: the record is not written again.
    _, _, error = kernel.run_cell(f"run.thread = [{follow_up['run_id']!r}]", "cell-3")
    assert error is None and [data for _, data in kernel.updates if MIME in data] == []


def test_submit_as_the_last_expression_shows_one_widget(lab):
    server, http, kernel = lab
    code = (
        "from jupyter_agentruns import submit\n"
        'submit("demo", {"prompt": "p", "chunks": 2, "delay": 0})'
    )
    _, displays, error = kernel.run_cell(code, "cell-9")
    assert error is None, error
    views = widget_views(displays)
    assert len(views) == 1
    model_id = views[0]["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert model_id
    # A run whose widget was closed still brings its displayed record up to date.
    code = (
        'run = submit("demo", {"prompt": "q", "chunks": 20, "delay": 0.05})\n'
        "run.close()\n"
        "print(run.wait(30).status)\n"
    )
    stdout, _, error = kernel.run_cell(code, "cell-10")
    assert error is None, error
    assert stdout == "succeeded\n"
    (update,) = [data for _, data in kernel.updates if MIME in data]
    assert update[MIME]["status"] == "succeeded" and "widget-view" not in str(update)


def test_cancel_wait_and_errors_from_the_kernel(lab):
    server, http, kernel = lab
    code = """
from jupyter_agentruns import submit, runs
from jupyter_agentruns.kernel.client import AgentRunsError
run = submit("demo", {"prompt": "slow", "chunks": 500, "delay": 0.05}, display=False)
try:
    run.wait(timeout=0.3)
except TimeoutError:
    print("timeout")
run.cancel("from the kernel")
run.wait(30)
print(run.status, run.refresh()["cancel"]["reason"], len(runs()))
listed = runs()
print(listed[0]["title"], "<td " in listed._repr_html_() and ">slow</td>" in listed._repr_html_())
try:
    submit("nope", {})
except AgentRunsError as error:
    print(error.status, error.code)
"""
    stdout, _, error = kernel.run_cell(code, "cell-3")
    assert error is None, error
    assert stdout.splitlines() == [
        "timeout", "cancelled from the kernel 1", "slow True", "404 unknown_agent",
    ]  # fmt: skip


def test_session_policies_from_the_kernel(lab):
    server, http, kernel = lab
    code = """
from jupyter_agentruns import submit
from jupyter_agentruns.kernel.client import AgentRunsError
first = submit("demo", {"prompt": "slow", "chunks": 500, "delay": 0.05}, session="chat", display=False)
try:
    submit("demo", {"prompt": "next"}, session="chat", session_policy="reject", display=False)
except AgentRunsError as error:
    print(error.status, error.code, error.body["active_run_id"] == first.run_id)
queued = submit("demo", {"prompt": "later", "chunks": 2, "delay": 0}, session="chat",
                session_policy="enqueue", display=False)
print(queued.status, queued.refresh()["queued_behind"] == first.run_id)
first.cancel("enough")
print(queued.wait(30).status)
"""
    stdout, _, error = kernel.run_cell(code, "cell-4")
    assert error is None, error
    assert stdout.splitlines() == ["409 session_busy True", "queued True", "succeeded"]


def test_an_error_in_a_cell_is_one_line_saying_what_to_do(lab):
    server, http, kernel = lab
    busy = """
from jupyter_agentruns import submit
first = submit("demo", {"prompt": "slow", "chunks": 500, "delay": 0.05}, session="chat", display=False)
try:
    submit("demo", {"prompt": "next"}, session="chat", session_policy="reject", display=False)
finally:
    first.cancel()
"""
    _, _, error = kernel.run_cell(busy, "cell-busy")
    (line,) = error.splitlines()
    assert line.startswith("AgentRunsError: The session 'chat' has an active run, run_")
    assert "submit with session_policy 'enqueue' or 'interrupt'" in line
    assert line.endswith("(409 session_busy)")
    unreachable = "from jupyter_agentruns import runs\nruns(url='http://127.0.0.1:9/', token='t')"
    _, _, error = kernel.run_cell(unreachable, "cell-nowhere")
    (line,) = error.splitlines()
    assert line.startswith("ServerNotFound: Cannot reach the Jupyter server at http://127.0.0.1:9/")
    not_json = "submit('demo', {'prompt': 'p', 'delay': float('nan')})"
    _, _, error = kernel.run_cell(f"from jupyter_agentruns import submit\n{not_json}", "cell-nan")
    assert error == (
        "UnsafeJson: The field input.delay is NaN, which is not a JSON number: "
        "send a finite number or null"
    )


def test_a_question_answered_from_the_kernel(lab):
    server, http, kernel = lab
    code = """
from jupyter_agentruns import submit
run = submit("demo", {"prompt": "p", "chunks": 3, "delay": 0, "ask": True}, display=False)
import time
while not run.questions:
    time.sleep(0.05)
print(run.status, run.questions[0]["title"])
run.answer("approve", note="go")
print(run.wait(30).status, run.run["snapshot"]["inputs"][0]["note"])
"""
    stdout, _, error = kernel.run_cell(code, "cell-5")
    assert error is None, error
    assert stdout.splitlines() == ["waiting Write the answer about p?", "succeeded go"]


def test_outside_a_notebook_an_explicit_url_and_token_work(lab, tmp_path):
    import subprocess
    import sys

    server, http, kernel = lab
    code = (
        "from jupyter_agentruns import submit\n"
        "run = submit('demo', {'prompt': 'p', 'chunks': 4, 'delay': 0}, "
        f"url={server.url!r}, token={server.token!r})\n"
        "print(run.wait(30).status, repr(run.output['text']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=server.env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"succeeded {''.join(answer_words('p', 4))!r}"
    # Plain Python has no cell to derive a key from: each submit is a new run.
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=server.env
    )
    assert len(http.get("runs").json()["runs"]) == 2


@pytest.mark.parametrize(
    "input,metadata,where",
    [
        ({"prompt": "p", "delay": float("nan")}, None, "input.delay"),
        ({"prompt": "p", "weights": [1.0, float("inf")]}, None, "input.weights[1]"),
        ({"prompt": "p"}, {"score": float("-inf")}, "metadata.score"),
    ],
)
def test_submit_refuses_nan_and_infinity_before_sending_naming_where(
    input, metadata, where, monkeypatch
):
    from jupyter_agentruns.kernel import widget

    def no_network(*args, **kwargs):
        raise AssertionError("submit() reached for the server")

    monkeypatch.setattr(widget, "_client", no_network)
    with pytest.raises(ValueError, match=rf"{re.escape(where)} is (NaN|Infinity|-Infinity)"):
        widget.submit("demo", input, metadata=metadata)


def test_an_executed_and_exported_notebook_shows_the_answer_in_markdown_and_html(lab, tmp_path):
    import subprocess
    import sys

    import nbformat

    server, http, kernel = lab
    notebook = nbformat.v4.new_notebook()
    # No print: what the export shows of the run comes from the displayed record.
    code = (
        "from jupyter_agentruns import submit\n"
        'run = submit("demo", {"prompt": "weather in Shanghai", "chunks": 8, "delay": 0})\n'
        "run.wait(60);"
    )
    notebook.cells.append(nbformat.v4.new_code_cell(code))
    path = tmp_path / "exported.ipynb"
    nbformat.write(notebook, path)
    env = {**server.env, "AGENTRUNS_URL": server.url, "AGENTRUNS_TOKEN": server.token}
    nbconvert = [sys.executable, "-m", "jupyter", "nbconvert", "--to"]
    result = subprocess.run(
        [*nbconvert, "notebook", "--execute", "--output", "executed", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    executed = nbformat.read(tmp_path / "executed.ipynb", as_version=4)
    (output,) = executed.cells[0].outputs
    assert "Demo answer about weather in Shanghai" in output["data"]["text/markdown"]
    assert "**succeeded**" in output["data"]["text/markdown"]
    # The widget's saved state carries the record too, for a view that cannot reach the server.
    assert any(
        "Demo answer about" in str(model["state"].get("record", ""))
        for model in executed.metadata.widgets["application/vnd.jupyter.widget-state+json"][
            "state"
        ].values()
    )
    # As JupyterLab saves it (no widget state by default), and as nbconvert executed it.
    plain = nbformat.read(tmp_path / "executed.ipynb", as_version=4)
    del plain.metadata["widgets"]
    nbformat.write(plain, tmp_path / "saved.ipynb")
    for source in ("saved.ipynb", "executed.ipynb"):
        for to, suffix in (("markdown", ".md"), ("html", ".html")):
            result = subprocess.run(
                [*nbconvert, to, str(tmp_path / source)],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            assert result.returncode == 0, result.stderr
            exported = (tmp_path / source).with_suffix(suffix).read_text()
            assert "Demo answer about weather in Shanghai" in exported, (source, to)
            assert "Still running" not in exported
    assert "<strong>succeeded</strong>" in (tmp_path / "saved.html").read_text()


def test_an_exported_notebook_shows_an_error_as_its_one_line(lab, tmp_path):
    import html
    import subprocess

    import nbformat

    server, http, kernel = lab
    notebook = nbformat.v4.new_notebook()
    notebook.cells.append(
        nbformat.v4.new_code_cell('from jupyter_agentruns import submit\nsubmit("nope", {})')
    )
    path = tmp_path / "failing.ipynb"
    nbformat.write(notebook, path)
    env = {**server.env, "AGENTRUNS_URL": server.url, "AGENTRUNS_TOKEN": server.token}
    nbconvert = [sys.executable, "-m", "jupyter", "nbconvert"]
    result = subprocess.run(
        [*nbconvert, "--to", "notebook", "--execute", "--allow-errors", "--output", "executed",
         str(path)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    line = "AgentRunsError: No agent named 'nope'; GET agents lists them. (404 unknown_agent)"
    (output,) = nbformat.read(tmp_path / "executed.ipynb", as_version=4).cells[0].outputs
    assert output["output_type"] == "error" and output["traceback"] == [line]
    for to, suffix in (("markdown", ".md"), ("html", ".html")):
        result = subprocess.run(
            [*nbconvert, "--to", to, str(tmp_path / "executed.ipynb")],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        exported = (tmp_path / "executed").with_suffix(suffix).read_text()
        shown = html.unescape(re.sub(r"<[^>]+>", "", exported)) if to == "html" else exported
        assert line in shown, to
        assert "Traceback" not in exported and "site-packages" not in exported, to


SCRIPTED_ACP = [sys.executable, str(Path(__file__).with_name("acp_agent.py"))]


@pytest.mark.parametrize(
    "agentruns_config", [{"acp_agents": {"scripted": {"command": SCRIPTED_ACP}}}]
)
def test_an_acp_agent_works_in_the_notebooks_directory_and_a_follow_up_continues(lab):
    server, http, kernel = lab
    code = """
import json
from jupyter_agentruns import submit
first = submit("scripted", {"prompt": "cwd"}, display=False).wait(60)
print(json.loads(first.output["text"])["session"])
chat = submit("scripted", {"prompt": "echo plot it"}, session="chat", display=False).wait(60)
follow = submit("scripted", {"prompt": "cwd"}, session="chat", display=False).wait(60)
print(json.loads(follow.output["text"])["session"])
print(json.loads(submit("scripted", {"prompt": "history"}, session="chat",
                        display=False).wait(60).output["text"]))
"""
    stdout, _, error = kernel.run_cell(code, "cell-acp")
    assert error is None, error
    work = str((server.home / "work").resolve())
    assert stdout.splitlines() == [work, work, "['echo plot it', 'cwd', 'history']"]
