"""Notebook tools: a real server, a real ipykernel, the MCP SDK's own client, a scripted model.

One server and one notebook kernel for the whole file (starting them is most
of the cost); each test leaves the kernel idle.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from jupyter_agentruns.notebook_tools import availability

from fake_openai import FakeOpenAI, answer, tool_calls
from servers import ServerProcess, wait_status
from test_notebook_api import Kernel

pytestmark = pytest.mark.timeout(120)
NOTEBOOK = "work/analysis.ipynb"


class FakeInThread:
    """The scripted model on a loop of its own: the server is another process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fake = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> FakeOpenAI:
        fake = FakeOpenAI()
        await fake.start()
        return fake

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def model():
    fake = FakeInThread()
    yield fake.fake
    fake.close()


DOCS = Path(__file__).parent.parent / "docs"


def tutorial_agent() -> str:
    """The agent of docs/tutorials/agent-writes-notebook.md, as written."""
    text = (DOCS / "tutorials" / "agent-writes-notebook.md").read_text()
    [code] = re.findall(r"```python\n(# my_writer\.py\n.*?)```", text, re.S)
    return code


@pytest.fixture(scope="module")
def lab(tmp_path_factory, model):
    home = tmp_path_factory.mktemp("nbtools")
    (home / "agents").mkdir()
    (home / "agents" / "my_writer.py").write_text(tutorial_agent())
    server = ServerProcess(
        home / "home",
        home / "agentruns.sqlite3",
        {
            "agents": {
                "nb_mcp": "agents_for_tests:notebook_mcp_client",
                "sum_writer": "my_writer:sum_writer",
            }
        },
        config={"OpenAIAgent": {"base_url": model.url, "notebook_tools": True}},
    )
    server.env["PYTHONPATH"] = os.pathsep.join([str(home / "agents"), server.env["PYTHONPATH"]])
    server.start()
    (server.home / "work").mkdir(exist_ok=True)
    http = server.client()
    kernel = Kernel(server, http, NOTEBOOK)
    try:
        yield server, http, kernel
    finally:
        try:
            kernel.close()
            http.close()
        finally:
            server.kill()


def call_tools(server, calls, token=None):
    """Make ``calls`` (``[(name, arguments)]``) with the SDK's client; returns each result."""

    async def run():
        headers = {"Authorization": token or f"token {server.token}"}
        client = create_mcp_http_client(headers=headers)
        url = server.url + "api/agentruns/mcp"
        async with client, streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                return [await session.call_tool(name, args) for name, args in calls]

    return asyncio.run(run())


def text(result) -> str:
    return result.content[0].text


def approve_next(http, run_id, choice="approve", asked=1):
    """Answer the run's ``asked``-th question (waiting for it); returns its details."""
    deadline = time.monotonic() + 30
    while True:
        run = http.get(f"runs/{run_id}").json()
        inputs = run["snapshot"].get("inputs", [])
        if len(inputs) >= asked and inputs[asked - 1]["status"] == "open":
            question = inputs[asked - 1]
            answered = http.post(
                f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": choice}
            )
            assert answered.status_code == 200, answered.text
            return question
        assert run["status"] not in ("succeeded", "failed", "cancelled"), run
        assert time.monotonic() < deadline, run
        time.sleep(0.05)


def test_get_agents_says_the_notebook_tools_are_here(lab):
    server, http, kernel = lab
    tools = http.get("agents").json()["notebook_tools"]
    assert tools == {
        "available": True,
        "tools": [
            "delete_cell",
            "describe",
            "edit_cell",
            "execute_cell",
            "insert_cell",
            "list_variables",
            "read_notebook",
            "run_code",
        ],  # fmt: skip
        "approval": "ask",
        "edits": "apply",
        "mcp": True,
    }


def test_a_person_works_on_a_notebooks_kernel_with_an_mcp_client(lab):
    server, http, kernel = lab
    notebook = {
        "cells": [
            {"cell_type": "code", "id": "c-1", "metadata": {}, "execution_count": 1,
             "source": "print('loaded')", "outputs": [
                 {"output_type": "stream", "name": "stdout", "text": "loaded\n"}]},
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }  # fmt: skip
    saved = http.put(
        server.url + f"api/contents/{NOTEBOOK}", json={"type": "notebook", "content": notebook}
    )
    assert saved.status_code in (200, 201), saved.text
    code = (
        "import pandas as pd\n"
        "sales = pd.DataFrame({'city': ['a', 'b'], 'n': [3, 4]})\n"
        "print('rows', len(sales))\n"
        "int(sales.n.sum())"
    )
    ran, listed, described, read = call_tools(
        server,
        [
            ("run_code", {"notebook": NOTEBOOK, "code": code}),
            ("list_variables", {"notebook": NOTEBOOK}),
            ("describe", {"notebook": NOTEBOOK, "name": "sales"}),
            ("read_notebook", {"notebook": NOTEBOOK}),
        ],
    )
    assert not ran.is_error and "rows 2" in text(ran) and "result:\n7" in text(ran)
    variables = {v["name"]: v for v in json.loads(text(listed))}
    assert variables["sales"] == {"name": "sales", "type": "pandas.DataFrame", "shape": [2, 2]}
    about = json.loads(text(described))
    assert (
        about["dtypes"]["n"] == "int64" and "city" in about["head"] and "mean" in about["summary"]
    )
    assert "print('loaded')" in text(read) and "Output: loaded" in text(read)
    # The variable is the kernel's: the notebook's own cells see it.
    stdout, _, error = kernel.run_cell("print(sales.n.max())", "cell-x")
    assert error is None and stdout.strip() == "4"


def test_a_notebook_without_a_kernel_and_a_wrong_call_are_errors_the_caller_reads(lab):
    server, http, kernel = lab
    missing, unknown = call_tools(
        server,
        [
            ("list_variables", {"notebook": "nowhere.ipynb"}),
            ("describe", {"notebook": NOTEBOOK, "name": "no_such_variable"}),
        ],
    )
    assert missing.is_error and "notebook_not_found" in text(missing)
    assert unknown.is_error and "no variable 'no_such_variable'" in text(unknown)


def test_submit_in_a_cell_records_its_kernel(lab):
    server, http, kernel = lab
    stdout, _, error = kernel.run_cell(
        "from jupyter_agentruns import submit\n"
        "run = submit('demo', {'prompt': 'hi', 'chunks': 2, 'delay': 0}, display=False)\n"
        "print(run.run_id)",
        "cell-submit",
    )
    assert error is None, error
    run = http.get(f"runs/{stdout.strip()}").json()
    assert run["metadata"]["kernel_id"] == kernel.kernel_id
    assert run["metadata"]["cell_id"] == "cell-submit"


def submit(http, agent, input, kernel_id):
    response = http.post(
        "runs", json={"agent": agent, "input": input, "metadata": {"kernel_id": kernel_id}}
    )
    assert response.status_code == 201, response.text
    return response.json()["run_id"]


def test_a_runs_agent_uses_its_token_the_person_approves_then_denies(lab):
    server, http, kernel = lab
    calls = [
        ["list_variables", {}],
        ["run_code", {"code": "approved = 7"}],
        ["run_code", {"code": "denied = 8"}],
    ]
    run_id = submit(http, "nb_mcp", {"calls": calls}, kernel.kernel_id)
    question = approve_next(http, run_id, "approve", asked=1)
    assert question["kind"] == "approval" and question["details"]["code"] == "approved = 7"
    approve_next(http, run_id, "deny", asked=2)
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    output = run["output"]
    assert output["tools"] == [
        "delete_cell", "describe", "edit_cell", "execute_cell", "insert_cell", "list_variables",
        "read_notebook", "run_code",
    ]  # fmt: skip
    assert [a["error"] for a in output["answers"]] == [False, False, True]
    assert "denied" in output["answers"][2]["text"]
    steps = run["snapshot"]["tools"]
    assert [(s["name"], s["status"]) for s in steps] == [
        ("list_variables", "completed"),
        ("run_code", "completed"),
        ("run_code", "failed"),
    ]
    assert steps[1]["args"] == {"code": "approved = 7"}
    stdout, _, _ = kernel.run_cell("print(approved, 'denied' in globals())", "cell-check")
    assert stdout.strip() == "7 False"
    # The run's token was good for the run's life only.
    refused = httpx.post(
        server.url + "api/agentruns/mcp",
        headers={"Authorization": output["token"], "Accept": "application/json, text/event-stream"},
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    )
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"


def test_a_runs_token_cannot_start_or_control_runs(lab):
    server, http, kernel = lab
    calls = [["start_run", {"agent": "demo", "input": {"prompt": "from a run's token"}}]]
    run_id = submit(http, "nb_mcp", {"calls": calls}, kernel.kernel_id)
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    assert not {"start_run", "get_run", "answer_run", "cancel_run"} & set(run["output"]["tools"])
    assert run["output"]["answers"][0]["error"] is True
    assert "no notebook tool 'start_run'" in run["output"]["answers"][0]["text"]
    started = http.get("runs", params={"limit": 500}).json()["runs"]
    mine = [r for r in started if r["agent"] == "demo" and "from a run's token" in json.dumps(r)]
    assert mine == []


def test_run_code_waits_for_the_persons_cell_and_keeps_its_images_with_the_step(lab):
    server, http, kernel = lab
    kernel.client.execute("import time\ntime.sleep(3)")  # the person's cell, still running
    deadline = time.monotonic() + 10
    while (
        http.get(server.url + f"api/kernels/{kernel.kernel_id}").json()["execution_state"] != "busy"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    code = "from IPython.display import display\ndisplay({'image/png': 'iVBORw0KGgo='}, raw=True)"
    run_id = submit(http, "nb_mcp", {"calls": [["run_code", {"code": code}]]}, kernel.kernel_id)
    approve_next(http, run_id)
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    events = http.get(f"runs/{run_id}/events", params={"limit": 1000}).json()["events"]
    said = [e["data"]["message"] for e in events if e["type"] == "progress"]
    assert said == ["waiting for the kernel", "running code in the kernel"]
    [step] = run["snapshot"]["tools"]
    assert step["result"]["images"] == [{"mime": "image/png", "data": "iVBORw0KGgo="}]
    assert "image/png image 1, 8 bytes" in run["output"]["answers"][0]["text"]


def test_cancelling_a_run_interrupts_its_run_code_and_keeps_the_kernel(lab):
    server, http, kernel = lab
    kernel.run_cell("kept = 'still here'", "cell-kept")
    calls = [["run_code", {"code": "import time\nfor _ in range(600): time.sleep(0.1)"}]]
    run_id = submit(http, "nb_mcp", {"calls": calls}, kernel.kernel_id)
    approve_next(http, run_id)
    deadline = time.monotonic() + 30
    while not http.get(f"runs/{run_id}").json()["snapshot"]["tools"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)  # the code runs
    started = time.monotonic()
    assert http.post(f"runs/{run_id}/cancel").status_code == 202
    run = wait_status(http, run_id, ["cancelled"])
    assert time.monotonic() - started < 10
    # Interrupted, not restarted: the kernel is free and keeps its variables.
    (after,) = call_tools(server, [("run_code", {"notebook": NOTEBOOK, "code": "kept"})])
    assert "still here" in text(after), text(after)
    [step] = run["snapshot"]["tools"]
    assert step["name"] == "run_code"
    # The step ended with its call: never left running in the record.
    assert step["status"] == "failed" and step["error"]["type"] == "cancelled", step


def test_a_kernel_restart_fails_the_call_with_kernel_unavailable(lab):
    server, http, kernel = lab
    results = []
    code = "import time\nfor _ in range(600): time.sleep(0.1)"
    caller = threading.Thread(
        target=lambda: results.extend(
            call_tools(server, [("run_code", {"notebook": NOTEBOOK, "code": code})])
        )
    )
    caller.start()
    time.sleep(1.5)
    kernel.restart()
    caller.join(30)
    (result,) = results
    assert result.is_error and "kernel_unavailable" in text(result), text(result)


def test_the_openai_agent_works_on_the_notebook_with_the_tools(lab, model):
    server, http, kernel = lab
    kernel.run_cell("import pandas as pd\nprices = pd.DataFrame({'p': [1.5, 2.5]})", "cell-p")
    model.reply(
        tool_calls(("list_variables", "{}")),
        tool_calls(("describe", json.dumps({"name": "prices"}))),
        tool_calls(("run_code", json.dumps({"code": "total = float(prices.p.sum())\ntotal"}))),
        answer("The total is 4."),
    )
    run_id = submit(http, "openai", {"prompt": "What do prices add up to?"}, kernel.kernel_id)
    question = approve_next(http, run_id)
    assert question["details"]["code"] == "total = float(prices.p.sum())\ntotal"
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    offered = {tool["function"]["name"] for tool in model.requests[-4]["body"]["tools"]}
    assert offered == {
        "run_code", "list_variables", "describe", "read_notebook", "insert_cell", "edit_cell",
        "delete_cell", "execute_cell",
    }  # fmt: skip
    tool_messages = [m for m in model.requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert '"name": "prices"' in tool_messages[0]["content"]
    assert "float64" in tool_messages[1]["content"]
    assert "result:\n4.0" in tool_messages[2]["content"]
    assert [s["name"] for s in run["snapshot"]["tools"]] == [
        "list_variables",
        "describe",
        "run_code",
    ]
    stdout, _, _ = kernel.run_cell("print(total)", "cell-total")
    assert stdout.strip() == "4.0"


def test_the_tutorials_notebook_lines_let_the_agent_work_on_the_data(lab, model):
    """docs/tutorials/notebook-tools.md, its cell run as written in the notebook's kernel."""
    server, http, kernel = lab
    tutorial = (Path(__file__).parent.parent / "docs/tutorials/notebook-tools.md").read_text()
    cell = re.search(r"```python\n(import pandas as pd\n.*?)```", tutorial, re.S).group(1)
    assert "sales = pd.DataFrame(" in cell and "submit(" in cell
    model.reply(
        tool_calls(("list_variables", "{}")),
        tool_calls(("describe", json.dumps({"name": "sales"}))),
        tool_calls(
            ("run_code", json.dumps({"code": "sales.groupby('city').units.sum().idxmax()"}))
        ),
        answer("Lyon sold the most: 340 units."),
    )
    _, displays, error = kernel.run_cell(cell, "cell-tutorial")
    assert error is None, error
    assert any("application/vnd.jupyter.widget-view+json" in d for d in displays), displays
    [run] = http.get("runs", params={"limit": 1}).json()["runs"]
    assert run["agent"] == "openai" and run["metadata"]["kernel_id"] == kernel.kernel_id
    question = approve_next(http, run["run_id"])
    assert question["kind"] == "approval"
    assert question["details"]["code"] == "sales.groupby('city').units.sum().idxmax()"
    run = wait_status(http, run["run_id"], ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    tool_messages = [m for m in model.requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert '"name": "sales"' in tool_messages[0]["content"]  # list_variables saw the DataFrame
    assert "Lyon" in tool_messages[1]["content"]  # describe: its first rows
    assert "result:\n'Lyon'" in tool_messages[2]["content"], tool_messages[2]["content"]
    assert run["output"]["text"] == "Lyon sold the most: 340 units."


def test_the_openai_agent_inserts_a_cell_into_the_notebook_of_the_runs_kernel(lab, model):
    server, http, kernel = lab
    notebook = {
        "cells": [{"cell_type": "code", "id": "c-1", "metadata": {}, "execution_count": None,
                   "source": "prices = [1, 2]", "outputs": []}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }  # fmt: skip
    saved = http.put(
        server.url + f"api/contents/{NOTEBOOK}", json={"type": "notebook", "content": notebook}
    )
    assert saved.status_code in (200, 201), saved.text
    source = "total = sum(prices)"
    model.reply(
        tool_calls(("insert_cell", json.dumps({"source": source, "after": "c-1"}))),
        answer("I added a cell that adds them up."),
    )
    run_id = submit(http, "openai", {"prompt": "Add up the prices in a cell"}, kernel.kernel_id)
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    [edit] = run["snapshot"]["edits"]
    assert (edit["notebook"], edit["op"], edit["status"]) == (NOTEBOOK, "insert", "applied")
    cells = json.loads((server.home / NOTEBOOK).read_text())["cells"]
    assert [(c["id"], "".join(c["source"])) for c in cells] == [
        ("c-1", "prices = [1, 2]"),
        (edit["cell_id"], source),
    ]
    assert cells[1]["metadata"]["agentruns"] == {"run_id": run_id, "edit_id": edit["edit_id"]}
    told = [m for m in model.requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert edit["cell_id"] in told[0]["content"]


def save_cells(server, http, cells) -> None:
    notebook = {
        "cells": [{"cell_type": "code", "id": cell_id, "metadata": {}, "execution_count": None,
                   "source": source, "outputs": []} for cell_id, source in cells],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }  # fmt: skip
    saved = http.put(
        server.url + f"api/contents/{NOTEBOOK}", json={"type": "notebook", "content": notebook}
    )
    assert saved.status_code in (200, 201), saved.text


def test_the_openai_agent_runs_a_cell_and_its_outputs_go_into_the_notebook(lab, model):
    server, http, kernel = lab
    save_cells(server, http, [("c-1", "squares = [n * n for n in range(4)]\nsquares")])
    model.reply(
        tool_calls(("execute_cell", json.dumps({"cell_id": "c-1"}))),
        answer("The squares are 0, 1, 4 and 9."),
    )
    run_id = submit(http, "openai", {"prompt": "Run the first cell"}, kernel.kernel_id)
    question = approve_next(http, run_id)
    assert question["details"]["code"] == "squares = [n * n for n in range(4)]\nsquares"
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    [edit] = run["snapshot"]["edits"]
    assert (edit["op"], edit["cell_id"], edit["status"]) == ("outputs", "c-1", "applied")
    [cell] = json.loads((server.home / NOTEBOOK).read_text())["cells"]
    [result] = cell["outputs"]
    assert "".join(result["data"]["text/plain"]) == "[0, 1, 4, 9]"
    assert cell["execution_count"] == result["execution_count"] == edit["execution_count"]
    told = [m for m in model.requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert "result:\n[0, 1, 4, 9]" in told[0]["content"]
    assert "its outputs are in the notebook" in told[0]["content"]


def test_a_runs_mcp_client_runs_a_cell_after_the_person_approves(lab):
    server, http, kernel = lab
    save_cells(server, http, [("c-1", "print('from mcp')")])
    run_id = submit(http, "nb_mcp", {"calls": [["execute_cell", {"cell_id": "c-1"}]]},
                    kernel.kernel_id)  # fmt: skip
    question = approve_next(http, run_id)
    assert question["details"]["tool"] == "execute_cell"
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    [ran] = run["output"]["answers"]
    assert not ran["error"] and "from mcp" in ran["text"]
    [cell] = json.loads((server.home / NOTEBOOK).read_text())["cells"]
    assert "".join(cell["outputs"][0]["text"]) == "from mcp\n"
    assert [e["op"] for e in run["snapshot"]["edits"]] == ["outputs"]


def test_the_tutorials_agent_adds_a_cell_and_runs_it_once_approved(lab):
    """docs/tutorials/agent-writes-notebook.md: its agent, run as the tutorial runs it."""
    server, http, kernel = lab
    save_cells(server, http, [("c-1", "x = 1")])
    run_id = submit(http, "sum_writer", {"a": 2, "b": 2}, kernel.kernel_id)
    question = approve_next(http, run_id)
    assert question["details"]["tool"] == "execute_cell"
    assert question["details"]["code"] == "print(2 + 2)"
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    first, added = json.loads((server.home / NOTEBOOK).read_text())["cells"]
    assert "".join(first["source"]) == "x = 1"
    assert "".join(added["source"]) == "print(2 + 2)"
    assert "".join(added["outputs"][0]["text"]) == "4\n"
    assert added["metadata"]["agentruns"]["run_id"] == run_id
    assert run["output"] == {"cell_id": added["id"], "ran": True}
    assert [(e["op"], e["status"]) for e in run["snapshot"]["edits"]] == [
        ("insert", "applied"),
        ("outputs", "applied"),
    ]
    assert run["snapshot"]["messages"][-1]["text"].startswith(f"I added cell {added['id']}")


def test_the_openai_agents_tool_choice_may_name_a_notebook_tool(lab, model):
    server, http, kernel = lab
    model.reply(tool_calls(("list_variables", "{}")), answer("Listed."))
    input = {"prompt": "What is there?", "tool_choice": "list_variables"}
    run_id = submit(http, "openai", input, kernel.kernel_id)
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    forced = model.requests[-2]["body"]["tool_choice"]
    assert forced == {"type": "function", "function": {"name": "list_variables"}}
    assert [s["name"] for s in run["snapshot"]["tools"]] == ["list_variables"]


def test_the_tools_exist_only_where_every_kernel_is_the_run_owners():
    assert availability("shared", None) == (True, None)
    assert availability("per-user", "alice") == (True, None)  # a hub's single-user server
    available, reason = availability("per-user", None)  # a server several people share
    assert not available and "other people's" in reason


def test_on_a_hub_users_server_the_tools_act_for_its_user_only(tmp_path):
    server = ServerProcess(
        tmp_path / "home",
        tmp_path / "agentruns.sqlite3",
        {"owner_mode": "per-user"},
        config={
            "ServerApp": {
                "jpserver_extensions": {"jupyter_agentruns": True},
                "identity_provider_class": "identity.HeaderIdentityProvider",
            }
        },
    )
    server.env["JUPYTERHUB_USER"] = "alice"
    server.start()
    try:
        with server.client() as http:
            mcp = {"Accept": "application/json, text/event-stream"}
            ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            alice = http.get("agents", headers={"X-Test-User": "alice"}).json()
            assert alice["notebook_tools"]["available"] is True
            listed = http.post("mcp", headers={**mcp, "X-Test-User": "alice"}, json=ping)
            assert listed.status_code == 200, listed.text
            assert "run_code" in {tool["name"] for tool in listed.json()["result"]["tools"]}
            bob = http.get("agents", headers={"X-Test-User": "bob"}).json()
            assert bob["notebook_tools"]["available"] is False
            # Bob's MCP client gets his runs, and none of alice's kernels.
            bobs = http.post("mcp", headers={**mcp, "X-Test-User": "bob"}, json=ping)
            assert bobs.status_code == 200, bobs.text
            assert {tool["name"] for tool in bobs.json()["result"]["tools"]} == {
                "start_run", "get_run", "answer_run", "cancel_run",
            }  # fmt: skip
            call = {
                "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "run_code", "arguments": {"notebook": "a.ipynb", "code": "1"}},
            }  # fmt: skip
            refused = http.post("mcp", headers={**mcp, "X-Test-User": "bob"}, json=call)
            assert refused.json()["result"]["isError"] is True, refused.text
            anonymous = httpx.post(server.api_url + "mcp", headers=mcp, json=ping)
            assert anonymous.status_code == 403 and anonymous.json()["error"] == "forbidden"
    finally:
        server.kill()


def test_the_tutorials_mcp_client_script_runs_as_written(lab, tmp_path):
    """docs/tutorials/notebook-tools.md's script for the MCP SDK's client, with this server's URL."""
    server, http, kernel = lab
    tutorial = Path(__file__).parent.parent / "docs" / "tutorials" / "notebook-tools.md"
    [script] = re.findall(
        r"^  ```python\n(  # mcp_client\.py.*?)^  ```$", tutorial.read_text(), re.S | re.M
    )
    script = textwrap.dedent(script)
    for pattern, value in (
        (r'^URL = ".*?"', f"URL = {server.url + 'api/agentruns/mcp'!r}"),
        (r'^NOTEBOOK = ".*?"', f"NOTEBOOK = {NOTEBOOK!r}"),
    ):
        script, found = re.subn(pattern, value, script, flags=re.M)
        assert found == 1, pattern
    (tmp_path / "mcp_client.py").write_text(script)
    _, _, error = kernel.run_cell("scores = [3, 1, 2]", "cell-scores")
    assert error is None, error

    done = subprocess.run(
        [sys.executable, str(tmp_path / "mcp_client.py")],
        env={**os.environ, "JUPYTER_TOKEN": server.token},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    names, variables = done.stdout.split("\n", 1)
    assert {"describe", "list_variables", "read_notebook", "run_code"} <= set(
        ast.literal_eval(names)
    )
    assert "scores" in {variable["name"] for variable in json.loads(variables)}


def test_the_mcp_clients_run_script_runs_as_written(lab, tmp_path):
    """docs/how-to/mcp-clients.md's script: a demo run started and followed over MCP."""
    server, http, _ = lab
    page = (Path(__file__).parent.parent / "docs" / "how-to" / "mcp-clients.md").read_text()
    [script] = re.findall(r"^```python\n(# mcp_runs\.py.*?)^```$", page, re.S | re.M)
    script, found = re.subn(
        r'^URL = ".*?"', f"URL = {server.url + 'api/agentruns/mcp'!r}", script, flags=re.M
    )
    assert found == 1
    (tmp_path / "mcp_runs.py").write_text(script)
    runs = []
    for _ in range(2):  # again: its idempotency key gives the same run
        done = subprocess.run(
            [sys.executable, str(tmp_path / "mcp_runs.py")],
            env={**os.environ, "JUPYTER_TOKEN": server.token},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        started, status, text = done.stdout.split("\n", 2)
        runs.append(started.split()[0])
        assert status == "succeeded" and "Shanghai" in text, done.stdout
    assert runs[0] == runs[1]
    assert http.get(f"runs/{runs[0]}").json()["status"] == "succeeded"


# Big outputs: one budget for what a call answers and keeps ------------------

MAX_EVENT_BYTES = 262144  # the server's default
BUDGET = MAX_EVENT_BYTES // 2


def encoded(data) -> int:
    """An event's data size as the store counts it (JSON, ASCII, no spaces)."""
    return len(json.dumps(data, separators=(",", ":")))


def answer_size(result) -> int:
    """What an MCP answer's text and images take, encoded as in an event."""
    return sum(
        encoded(item.text) if item.type == "text" else encoded(item.data) for item in result.content
    )


def tool_completed(http, run_id):
    events = http.get(f"runs/{run_id}/events", params={"limit": 1000}).json()["events"]
    [completed] = [e["data"] for e in events if e["type"] == "tool.completed"]
    return completed


def drain(kernel):
    """Read what the test's own kernel client was sent meanwhile: beyond a thousand unread
    messages, ZeroMQ drops the newest, and the next cell's answer would be lost."""
    deadline = time.monotonic() + 30
    with contextlib.suppress(queue.Empty):
        while time.monotonic() < deadline:
            kernel.client.get_iopub_msg(timeout=1)


def run_code_in_a_run(http, kernel, code):
    run_id = submit(http, "nb_mcp", {"calls": [["run_code", {"code": code}]]}, kernel.kernel_id)
    approve_next(http, run_id)
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    [step] = run["snapshot"]["tools"]
    assert step["status"] == "completed", step
    return run, tool_completed(http, run_id)


def test_ten_big_displays_are_cut_to_the_budget_and_the_step_completes(lab):
    server, http, kernel = lab
    code = "from IPython.display import display\nfor i in range(10): display('x' * 20000)"
    run, completed = run_code_in_a_run(http, kernel, code)
    assert encoded(completed) <= BUDGET + 1024 < MAX_EVENT_BYTES
    [shown] = completed["content"]
    # What the model read is kept once: as the step's text, not again in its result.
    assert completed["result"] == {"images": []}
    assert shown["text"] == run["output"]["answers"][0]["text"]
    assert shown["text"].count("display:\n'xxxx") >= 5
    assert "more displays not shown" in shown["text"], shown["text"][-300:]


def test_thousands_of_displays_and_control_characters_stay_within_the_budget(lab):
    server, http, kernel = lab
    many = "from IPython.display import display\nfor i in range(1800): display(i * 10**200)\n'done'"
    control = (
        "import sys\nfrom IPython.display import display\n"
        "print('\\x01' * 200000)\nsys.stderr.write('\\x02' * 50000)\n"
        "for i in range(10): display('\\x03' * 20000)"
    )
    started = time.monotonic()
    displays, controls = call_tools(
        server,
        [
            ("run_code", {"notebook": NOTEBOOK, "code": many}),
            ("run_code", {"notebook": NOTEBOOK, "code": control}),
        ],
    )
    assert time.monotonic() - started < 60
    assert not displays.is_error and answer_size(displays) <= BUDGET
    assert "display:\n0\n" in text(displays) and "more displays not shown" in text(displays)
    assert "result:\n'done'" in text(displays)
    # A control character takes six bytes once encoded: the budget counts those.
    assert not controls.is_error and answer_size(controls) <= BUDGET
    assert "more characters not shown" in text(controls)
    assert "\x01" in text(controls) and "more displays not shown" in text(controls)
    # Recorded as a run's step, the same output stays under max_event_bytes.
    run, completed = run_code_in_a_run(http, kernel, control)
    assert encoded(completed) <= BUDGET + 1024
    drain(kernel)


def test_an_image_heavy_output_keeps_the_images_that_fit_and_says_how_many_did_not(lab):
    server, http, kernel = lab
    code = (
        "import base64, os\nfrom IPython.display import display\n"
        "for i in range(12):\n"
        "    display({'image/png': base64.b64encode(os.urandom(30000)).decode()}, raw=True)\n"
        "print('plotted')"
    )
    (answered,) = call_tools(server, [("run_code", {"notebook": NOTEBOOK, "code": code})])
    images = [item for item in answered.content if item.type == "image"]
    assert 0 < len(images) < 12 and answer_size(answered) <= BUDGET
    assert f"{12 - len(images)} more images" in text(answered) and "plotted" in text(answered)
    run, completed = run_code_in_a_run(http, kernel, code)
    assert encoded(completed) <= BUDGET + 1024
    kept = completed["result"]["images"]
    assert len(kept) == len(images) and kept[0]["mime"] == "image/png"
    assert f"{12 - len(kept)} more images" in completed["content"][0]["text"]


def resident_bytes(pid) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024


def test_fifty_megabytes_of_displays_never_grow_the_server(lab):
    server, http, kernel = lab
    code = "from IPython.display import display\nfor i in range(2500): display('x' * 20000)"
    call_tools(server, [("run_code", {"notebook": NOTEBOOK, "code": "1"})])  # all imported
    before = resident_bytes(server.process.pid)
    (answered,) = call_tools(server, [("run_code", {"notebook": NOTEBOOK, "code": code})])
    grown = resident_bytes(server.process.pid) - before
    drain(kernel)
    assert not answered.is_error and answer_size(answered) <= BUDGET
    assert "more displays not shown" in text(answered)
    # Cut as it came: not the 50 MB the kernel sent, nor twice that as one answer.
    assert grown < 40 * 2**20, grown


# Looking at variables never calls the person's code ---------------------------


def test_list_variables_calls_no_property_of_the_persons_objects(lab):
    server, http, kernel = lab
    marker = server.home / "touched"
    cell = f"""
import pathlib
MARKER = pathlib.Path({str(marker)!r})
def _touch(what):
    MARKER.write_text(what)
class Sneaky:
    @property
    def __class__(self):
        _touch("__class__")
        return int
    @property
    def shape(self):
        _touch("shape")
        return (1, 2)
    @property
    def dtype(self):
        _touch("dtype")
        return "int64"
    def __len__(self):
        _touch("__len__")
        return 3
    def __getattr__(self, name):
        _touch(name)
        raise AttributeError(name)
Sneaky.__module__ = "numpy.core"
class DataFrame(Sneaky):
    pass
DataFrame.__module__ = "pandas.core.frame"
sneaky, frame = Sneaky(), DataFrame()
"""
    _, _, error = kernel.run_cell(cell, "cell-sneaky")
    assert error is None, error
    listed, described = call_tools(
        server,
        [
            ("list_variables", {"notebook": NOTEBOOK}),
            ("describe", {"notebook": NOTEBOOK, "name": "frame"}),
        ],
    )
    assert not listed.is_error and not described.is_error, (text(listed), text(described))
    variables = {v["name"]: v for v in json.loads(text(listed))}
    assert variables["sneaky"] == {"name": "sneaky", "type": "numpy.core.Sneaky"}
    assert variables["frame"] == {"name": "frame", "type": "pandas.core.frame.DataFrame"}
    assert json.loads(text(described))["type"] == "pandas.core.frame.DataFrame"
    assert not marker.exists(), marker.read_text()


# A hidden helper never keeps the kernel from the person's cells ---------------

SLOW = """
class Slow:
    def __repr__(self):
        import time
        time.sleep(600)
        return "slow"
slow = Slow()
"""


def next_cell_runs_promptly(kernel):
    started = time.monotonic()
    stdout, _, error = kernel.run_cell("print('next cell')", "cell-next")
    assert error is None and stdout.strip() == "next cell"
    return time.monotonic() - started


def test_describe_whose_caller_goes_away_is_interrupted(lab):
    server, http, kernel = lab
    _, _, error = kernel.run_cell(SLOW, "cell-slow")
    assert error is None, error

    async def give_up():
        headers = {"Authorization": f"token {server.token}"}
        client = create_mcp_http_client(headers=headers)
        url = server.url + "api/agentruns/mcp"
        async with client, streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                call = session.call_tool("describe", {"notebook": NOTEBOOK, "name": "slow"})
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(call, 2)

    asyncio.run(give_up())
    assert next_cell_runs_promptly(kernel) < 10


def test_describe_that_takes_too_long_is_interrupted_and_says_so(lab):
    server, http, kernel = lab
    _, _, error = kernel.run_cell(SLOW, "cell-slow")
    assert error is None, error
    started = time.monotonic()
    (described,) = call_tools(server, [("describe", {"notebook": NOTEBOOK, "name": "slow"})])
    assert described.is_error and "kernel_timeout" in text(described), text(described)
    assert time.monotonic() - started < 40
    assert next_cell_runs_promptly(kernel) < 5
