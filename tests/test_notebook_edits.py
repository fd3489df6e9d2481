"""Agents that edit the notebook: a real server changes the notebook's file, each edit recorded.

The runs' agent is a Python agent calling ``run.notebook_tools`` (the same
calls the openai agent and the MCP endpoint make). The edits here are the
server's own, on the file through its contents manager.
"""

from __future__ import annotations

import json
import time

import pytest
from test_notebook_tools import call_tools, text

from jupyter_agentruns.notebook_tools import edits as notebook_edits
from jupyter_agentruns.notebook_tools.kernels import fit_outputs

from servers import ServerProcess, wait_status
from test_notebook_api import Kernel

pytestmark = pytest.mark.timeout(120)
NOTEBOOK = "work/edits.ipynb"
AGENTS = {"agents": {"nb_editor": "agents_for_tests:notebook_editor"}}
CELLS = [("c-1", "x = 1"), ("c-2", "print(x)"), ("c-3", "# scratch")]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("nbedits")
    server = ServerProcess(home / "home", home / "agentruns.sqlite3", AGENTS).start()
    (server.home / "work").mkdir(exist_ok=True)
    http = server.client()
    try:
        yield server, http
    finally:
        http.close()
        server.kill()


def notebook_of(cells) -> dict:
    return {
        "cells": [
            {"cell_type": "code", "id": cell_id, "metadata": {}, "execution_count": None,
             "source": source, "outputs": []}
            for cell_id, source in cells
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }  # fmt: skip


def save(server, http, cells, path=NOTEBOOK) -> None:
    saved = http.put(
        server.url + f"api/contents/{path}",
        json={"type": "notebook", "content": notebook_of(cells)},
    )
    assert saved.status_code in (200, 201), saved.text


def on_disk(server, path=NOTEBOOK) -> dict:
    return json.loads((server.home / path).read_text())


def sources(notebook) -> list[tuple[str, str]]:
    return [(cell["id"], "".join(cell["source"])) for cell in notebook["cells"]]


def submit(http, calls, path=NOTEBOOK, kernel_id="no-kernel") -> str:
    """A run of the editing agent; unless told its kernel, none of this server's: its notebook
    is its session."""
    response = http.post(
        "runs",
        json={
            "agent": "nb_editor",
            "input": {"calls": calls},
            "session": path,
            "metadata": {"kernel_id": kernel_id},
        },
    )
    assert response.status_code == 201, response.text
    return response.json()["run_id"]


def ended(http, run_id) -> dict:
    run = wait_status(http, run_id, ["succeeded", "failed"])
    assert run["status"] == "succeeded", run["error"]
    return run


def events_of(http, run_id, type="notebook.edit") -> list[dict]:
    events = http.get(f"runs/{run_id}/events", params={"limit": 1000}).json()["events"]
    return [e["data"] for e in events if e["type"] == type]


def question(http, run_id) -> dict:
    deadline = time.monotonic() + 30
    while True:
        run = http.get(f"runs/{run_id}").json()
        open_ = [q for q in run["snapshot"].get("inputs", []) if q["status"] == "open"]
        if open_:
            return open_[0]
        assert run["status"] not in ("succeeded", "failed", "cancelled"), run
        assert time.monotonic() < deadline, run
        time.sleep(0.05)


def answer(http, run_id, choice="approve") -> dict:
    asked = question(http, run_id)
    answered = http.post(f"runs/{run_id}/inputs/{asked['request_id']}", json={"choice": choice})
    assert answered.status_code == 200, answered.text
    return asked


def test_insert_edit_and_delete_land_in_the_file_stamped_and_recorded(lab):
    server, http = lab
    save(server, http, CELLS)
    calls = [
        ["read_notebook", {}],
        ["insert_cell", {"source": "y = 2", "after": "c-1"}],
        ["edit_cell", {"cell_id": "c-2", "source": "print(x, y)"}],
        ["delete_cell", {"cell_id": "c-3"}],
        ["insert_cell", {"source": "# Notes", "cell_type": "markdown", "after": "start"}],
        ["read_notebook", {}],
    ]
    run_id = submit(http, calls)
    run = ended(http, run_id)
    read, inserted, edited, deleted, heading, reread = run["output"]["answers"]
    assert read["ok"] and "c-2" in read["text"] and "print(x)" in read["text"]
    assert inserted["ok"] and edited["ok"] and deleted["ok"] and heading["ok"], run["output"]
    new_id = inserted["result"]["cell_id"]
    notebook = on_disk(server)
    assert sources(notebook) == [
        (heading["result"]["cell_id"], "# Notes"), ("c-1", "x = 1"), (new_id, "y = 2"),
        ("c-2", "print(x, y)"),
    ]  # fmt: skip
    assert notebook["cells"][0]["cell_type"] == "markdown"
    edits = run["snapshot"]["edits"]
    assert [(e["op"], e["cell_id"], e["status"]) for e in edits] == [
        ("insert", new_id, "applied"),
        ("edit", "c-2", "applied"),
        ("delete", "c-3", "applied"),
        ("insert", heading["result"]["cell_id"], "applied"),
    ]
    assert (edits[1]["before"], edits[1]["after"]) == ("print(x)", "print(x, y)")
    assert (edits[2]["before"], edits[2]["after"]) == ("# scratch", None)
    assert all(e["notebook"] == NOTEBOOK for e in edits)
    by_id = {cell["id"]: cell for cell in notebook["cells"]}
    assert by_id[new_id]["metadata"]["agentruns"] == {
        "run_id": run_id,
        "edit_id": edits[0]["edit_id"],
    }
    assert by_id["c-2"]["metadata"]["agentruns"] == {
        "run_id": run_id,
        "edit_id": edits[1]["edit_id"],
    }
    assert "agentruns" not in by_id["c-1"]["metadata"]
    # Each edit recorded pending before the file was touched, then applied.
    assert [e["status"] for e in events_of(http, run_id)] == ["pending", "applied"] * 4
    # read_notebook gives each cell's id and says which an agent wrote.
    assert f"cell {new_id} (written by an agent: run {run_id}" in reread["text"]
    assert "cell c-1 (written" not in reread["text"]


def test_an_edit_of_a_cell_the_person_changed_since_is_a_conflict_and_changes_nothing(lab):
    server, http = lab
    save(server, http, CELLS)
    calls = [
        ["read_notebook", {}],
        ["wait", {}],
        ["edit_cell", {"cell_id": "c-1", "source": "x = 100"}],
        ["delete_cell", {"cell_id": "c-2"}],
    ]
    run_id = submit(http, calls)
    question(http, run_id)
    # The person changes both cells after the agent read them.
    changed = [("c-1", "x = 5"), ("c-2", "print(x * 2)"), ("c-3", "# scratch")]
    save(server, http, changed)
    before = (server.home / NOTEBOOK).read_text()
    answer(http, run_id)
    run = ended(http, run_id)
    read, edit, delete = run["output"]["answers"]
    for outcome in (edit, delete):
        assert not outcome["ok"] and "edit_conflict" in outcome["text"]
        assert "read_notebook" in outcome["text"], outcome["text"]
    assert (server.home / NOTEBOOK).read_text() == before
    assert [e["status"] for e in run["snapshot"]["edits"]] == ["conflict", "conflict"]
    assert run["snapshot"]["edits"][0]["before"] == "x = 1"  # what the agent read
    # Read again, the agent's edit goes in.
    run_id = submit(
        http, [["read_notebook", {}], ["edit_cell", {"cell_id": "c-1", "source": "x = 6"}]]
    )
    assert ended(http, run_id)["output"]["answers"][1]["ok"]
    assert sources(on_disk(server))[0] == ("c-1", "x = 6")


def test_bad_calls_get_a_clear_error_and_change_nothing(lab):
    server, http = lab
    save(server, http, CELLS)
    before = (server.home / NOTEBOOK).read_text()
    calls = [
        ["edit_cell", {"cell_id": "nope", "source": "x"}],
        ["insert_cell", {"source": "x", "after": "nope"}],
        ["insert_cell", {"source": "x", "cell_type": "picture"}],
        ["edit_cell", {"cell_id": "c-1"}],
        ["delete_cell", {}],
    ]
    run = ended(http, submit(http, calls))
    unknown, nowhere, picture, no_source, no_id = run["output"]["answers"]
    assert "cell_not_found" in unknown["text"] and "'nope'" in unknown["text"]
    assert "cell_not_found" in nowhere["text"] and "'start' and 'end'" in nowhere["text"]
    assert "invalid_arguments" in picture["text"] and "markdown" in picture["text"]
    assert "invalid_arguments" in no_source["text"] and "'source'" in no_source["text"]
    assert "invalid_arguments" in no_id["text"] and "cell_id" in no_id["text"]
    assert not any(outcome["ok"] for outcome in run["output"]["answers"])
    assert (server.home / NOTEBOOK).read_text() == before
    assert "edits" not in run["snapshot"]
    assert [s["status"] for s in run["snapshot"]["tools"]] == ["failed"] * 5


def undo(http, run_id, edit_id):
    return http.post(f"runs/{run_id}/edits/{edit_id}/undo")


def test_undo_of_an_ended_runs_edits_restores_the_cells_and_a_second_undo_is_409(lab):
    server, http = lab
    save(server, http, CELLS)
    calls = [
        ["insert_cell", {"source": "y = 2", "after": "c-1"}],
        ["edit_cell", {"cell_id": "c-2", "source": "print(x, y)"}],
        ["delete_cell", {"cell_id": "c-3"}],
    ]
    run_id = submit(http, calls)
    run = ended(http, run_id)
    inserted, edited, deleted = run["snapshot"]["edits"]
    last_seq = run["last_seq"]

    undone = undo(http, run_id, inserted["edit_id"])
    assert undone.status_code == 200, undone.text
    assert [c for c, _ in sources(on_disk(server))] == ["c-1", "c-2"]
    assert undone.json()["snapshot"]["edits"][0]["status"] == "undone"
    again = undo(http, run_id, inserted["edit_id"])
    assert again.status_code == 409 and again.json()["error"] == "edit_conflict", again.text

    assert undo(http, run_id, edited["edit_id"]).status_code == 200
    assert undo(http, run_id, deleted["edit_id"]).status_code == 200
    assert sources(on_disk(server)) == CELLS
    assert "agentruns" not in on_disk(server)["cells"][1]["metadata"]
    run = http.get(f"runs/{run_id}").json()
    assert [e["status"] for e in run["snapshot"]["edits"]] == ["undone"] * 3
    # The ended run's log still ends with its terminal event: the undo is in its snapshot.
    assert run["last_seq"] == last_seq and run["status"] == "succeeded"

    missing = undo(http, run_id, "ed_nope")
    assert missing.status_code == 404 and missing.json()["error"] == "edit_not_found"


def test_undo_of_an_edit_whose_cell_the_person_changed_is_409_and_changes_nothing(lab):
    server, http = lab
    save(server, http, CELLS)
    run_id = submit(http, [["edit_cell", {"cell_id": "c-2", "source": "print(x, y)"}]])
    [edit] = ended(http, run_id)["snapshot"]["edits"]
    save(server, http, [("c-1", "x = 1"), ("c-2", "print('mine')"), ("c-3", "# scratch")])
    before = (server.home / NOTEBOOK).read_text()
    refused = undo(http, run_id, edit["edit_id"])
    assert refused.status_code == 409 and refused.json()["error"] == "edit_conflict"
    assert "changed since the edit" in refused.json()["message"]
    assert (server.home / NOTEBOOK).read_text() == before
    assert http.get(f"runs/{run_id}").json()["snapshot"]["edits"][0]["status"] == "applied"


def test_undo_while_the_run_goes_on_is_a_notebook_edit_event(lab):
    server, http = lab
    save(server, http, CELLS)
    run_id = submit(http, [["insert_cell", {"source": "z = 3", "after": "end"}], ["wait", {}]])
    question(http, run_id)
    [edit] = http.get(f"runs/{run_id}").json()["snapshot"]["edits"]
    undone = undo(http, run_id, edit["edit_id"])
    assert undone.status_code == 200, undone.text
    assert sources(on_disk(server)) == CELLS
    answer(http, run_id)
    ended(http, run_id)
    assert [e["status"] for e in events_of(http, run_id)] == ["pending", "applied", "undone"]


def test_a_person_edits_a_notebook_with_an_mcp_client(lab):
    server, http = lab
    save(server, http, CELLS)
    inserted, bad = call_tools(
        server,
        [
            ("insert_cell", {"notebook": NOTEBOOK, "source": "w = 4", "after": "c-3"}),
            ("delete_cell", {"notebook": NOTEBOOK, "cell_id": "nope"}),
        ],
    )
    assert not inserted.is_error, text(inserted)
    new_id = json.loads(text(inserted))["cell_id"]
    assert sources(on_disk(server))[-1] == (new_id, "w = 4")
    assert bad.is_error and "cell_not_found" in text(bad)


def test_plan_keeps_what_the_agent_read_as_the_edits_before():
    notebook = notebook_of(CELLS)
    edit = notebook_edits.plan("edit_cell", {"cell_id": "c-1", "source": "x = 2"}, notebook,
                               NOTEBOOK, seen={"c-1": "x = 0"})  # fmt: skip
    assert edit["status"] == "conflict" and edit["before"] == "x = 0"
    edit = notebook_edits.plan(
        "edit_cell", {"cell_id": "c-1", "source": "x = 2"}, notebook, NOTEBOOK
    )
    assert edit["status"] == "pending" and edit["before"] == "x = 1"
    notebook_edits.apply(notebook, edit, "run_a")
    assert notebook_edits.is_applied(notebook, edit)
    notebook_edits.revert(notebook, edit)
    assert sources(notebook) == CELLS and not notebook_edits.is_applied(notebook, edit)


# A server killed between the file and the record ------------------------------


@pytest.mark.timeout(180)
def test_an_edit_written_when_its_server_was_killed_is_applied_once_after_take_over(tmp_path):
    marker = tmp_path / "kill-after-save"
    server = ServerProcess(
        tmp_path / "home",
        tmp_path / "agentruns.sqlite3",
        {"lease_seconds": 1.5, **AGENTS},
        config={"ServerApp": {"contents_manager_class": "killing_contents.KillAfterSave"}},
    )
    server.env["AGENTRUNS_TEST_KILL_AFTER_SAVE"] = str(marker)
    server.start()
    try:
        (server.home / "work").mkdir()
        with server.client() as http:
            save(server, http, CELLS)
            marker.touch()  # the next save of a notebook is the server's last
            run_id = submit(http, [["insert_cell", {"source": "y = 2", "after": "c-1"}]])
            server.process.wait(30)
        # Killed with the edit in the file, before its run recorded it applied.
        assert [source for _, source in sources(on_disk(server))].count("y = 2") == 1
        marker.unlink()
        server.start()
        with server.client() as http:
            run = wait_status(http, run_id, ["succeeded", "failed"], timeout=60)
            assert run["status"] == "succeeded", run["error"]
            assert run["attempt"] == 2
            notebook = on_disk(server)
            copies = [c for c in notebook["cells"] if "".join(c["source"]) == "y = 2"]
            assert len(copies) == 1  # never applied twice, never lost
            [edit] = run["snapshot"]["edits"]
            assert edit["status"] == "applied" and copies[0]["id"] == edit["cell_id"]
            assert copies[0]["metadata"]["agentruns"]["edit_id"] == edit["edit_id"]
            assert [e["status"] for e in events_of(http, run_id)] == ["pending", "applied"]
            [step] = run["snapshot"]["tools"]
            assert step["status"] == "completed" and step["result"]["cell_id"] == edit["cell_id"]
            [settled] = run["output"]["settled"]
            assert settled["ok"] and edit["cell_id"] in settled["text"]
            # Undone after the restart, as from any page: the cell goes, and the run says so.
            undone = undo(http, run_id, edit["edit_id"])
            assert undone.status_code == 200, undone.text
            assert [source for _, source in sources(on_disk(server))].count("y = 2") == 0
            [kept] = http.get(f"runs/{run_id}").json()["snapshot"]["edits"]
            assert kept["status"] == "undone"
    finally:
        server.kill()


def test_with_notebook_edits_ask_each_edit_is_a_question_showing_its_diff(tmp_path):
    server = ServerProcess(
        tmp_path / "home", tmp_path / "agentruns.sqlite3", {"notebook_edits": "ask", **AGENTS}
    ).start()
    try:
        (server.home / "work").mkdir()
        with server.client() as http:
            save(server, http, CELLS)
            calls = [
                ["edit_cell", {"cell_id": "c-1", "source": "x = 10"}],
                ["delete_cell", {"cell_id": "c-3"}],
            ]
            run_id = submit(http, calls)
            asked = answer(http, run_id, "approve")
            assert (
                asked["kind"] == "approval" and asked["title"] == f"Change this cell in {NOTEBOOK}?"
            )
            details = asked["details"]
            assert (details["op"], details["cell_id"]) == ("edit", "c-1")
            assert (details["before"], details["after"]) == ("x = 1", "x = 10")
            answer(http, run_id, "deny")
            run = ended(http, run_id)
            edited, deleted = run["output"]["answers"]
            assert edited["ok"] and not deleted["ok"] and "denied" in deleted["text"]
            assert [e["status"] for e in run["snapshot"]["edits"]] == ["applied", "rejected"]
            assert sources(on_disk(server)) == [("c-1", "x = 10"), *CELLS[1:]]
    finally:
        server.kill()


# execute_cell: a cell run in the notebook's kernel, its outputs an edit ----------------

# A 1x1 PNG, as IPython displays it (base64).
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


@pytest.fixture(scope="module")
def kernel(lab):
    server, http = lab
    started = Kernel(server, http, NOTEBOOK)
    try:
        yield started
    finally:
        started.client.stop_channels()


def outputs_of(server, cell_id, path=NOTEBOOK) -> tuple[list, int | None]:
    cell = next(c for c in on_disk(server, path)["cells"] if c["id"] == cell_id)
    return cell["outputs"], cell["execution_count"]


def joined(text) -> str:
    return "".join(text) if isinstance(text, list) else text


def test_execute_cell_asks_then_writes_the_outputs_into_the_cell_and_gives_the_model_their_text(
    lab, kernel
):
    server, http = lab
    save(server, http, [("c-1", "x = 41"), ("c-2", "print('hello')\nx + 1"), ("c-3", "1 / 0")])
    calls = [["execute_cell", {"cell_id": cell}] for cell in ("c-1", "c-2", "c-3")]
    run_id = submit(http, calls, kernel_id=kernel.kernel_id)
    asked = [answer(http, run_id) for _ in range(3)]
    assert asked[1]["kind"] == "approval" and asked[1]["title"] == (
        "Run the cell c-2 in the notebook's kernel?"
    )
    details = asked[1]["details"]
    assert (details["tool"], details["code"], details["cell_id"]) == (
        "execute_cell", "print('hello')\nx + 1", "c-2",
    )  # fmt: skip
    run = ended(http, run_id)
    first, second, third = run["output"]["answers"]
    assert all(outcome["ok"] for outcome in (first, second, third)), run["output"]
    assert "its outputs are in the notebook" in second["text"]
    assert "hello" in second["text"] and "result:\n42" in second["text"]
    assert "ZeroDivisionError" in third["text"]

    outputs, count = outputs_of(server, "c-2")
    assert [o["output_type"] for o in outputs] == ["stream", "execute_result"]
    assert joined(outputs[0]["text"]) == "hello\n" and outputs[0]["name"] == "stdout"
    assert joined(outputs[1]["data"]["text/plain"]) == "42"
    # Counted as a cell the person ran: In [n], and its result's Out [n].
    assert isinstance(count, int) and outputs[1]["execution_count"] == count
    assert second["result"]["execution_count"] == count
    assert outputs_of(server, "c-1") == ([], count - 1)
    [error] = outputs_of(server, "c-3")[0]
    assert (error["output_type"], error["ename"]) == ("error", "ZeroDivisionError")
    assert error["traceback"]

    edits = run["snapshot"]["edits"]
    assert [(e["op"], e["cell_id"], e["status"]) for e in edits] == [
        ("outputs", "c-1", "applied"), ("outputs", "c-2", "applied"), ("outputs", "c-3", "applied"),
    ]  # fmt: skip
    assert edits[1]["before"] == [] and notebook_edits.same_outputs(edits[1]["after"], outputs)
    assert edits[1]["execution_count"] == count
    cell = next(c for c in on_disk(server)["cells"] if c["id"] == "c-2")
    assert cell["metadata"]["agentruns"] == {"run_id": run_id, "edit_id": edits[1]["edit_id"]}
    assert "".join(cell["source"]) == "print('hello')\nx + 1"  # the source as it was
    assert [e["status"] for e in events_of(http, run_id)] == ["pending", "applied"] * 3
    assert [s["kind"] for s in run["snapshot"]["tools"]] == ["execute"] * 3


def test_execute_cell_refused_runs_nothing_and_changes_nothing(lab, kernel):
    server, http = lab
    save(server, http, [("c-1", "refused_here = 1")])
    before = (server.home / NOTEBOOK).read_text()
    run_id = submit(http, [["execute_cell", {"cell_id": "c-1"}]], kernel_id=kernel.kernel_id)
    answer(http, run_id, "deny")
    run = ended(http, run_id)
    [refused] = run["output"]["answers"]
    assert not refused["ok"] and "denied" in refused["text"]
    assert (server.home / NOTEBOOK).read_text() == before
    assert "edits" not in run["snapshot"]
    stdout, _, _ = kernel.run_cell("print('refused_here' in globals())", "probe")
    assert stdout.strip() == "False"


def test_execute_cell_whose_source_changes_while_it_runs_writes_no_outputs(lab, kernel):
    server, http = lab
    slow = "import time\ntime.sleep(3)\nprint('slept')"
    save(server, http, [("c-1", slow)])
    run_id = submit(http, [["execute_cell", {"cell_id": "c-1"}]], kernel_id=kernel.kernel_id)
    answer(http, run_id)
    deadline = time.monotonic() + 30
    while not http.get(f"runs/{run_id}").json()["snapshot"].get("tools"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    save(server, http, [("c-1", "print('changed by the person')")])
    run = ended(http, run_id)
    [ran] = run["output"]["answers"]
    assert "NOT written" in ran["text"] and "changed while it ran" in ran["text"]
    assert "slept" in ran["text"]  # it ran: the model still reads its output
    assert ran["result"]["status"] == "conflict"
    assert outputs_of(server, "c-1") == ([], None)
    assert sources(on_disk(server)) == [("c-1", "print('changed by the person')")]
    [edit] = run["snapshot"]["edits"]
    assert (edit["op"], edit["status"]) == ("outputs", "conflict")


def test_undo_of_execute_cell_puts_the_earlier_outputs_back(lab, kernel):
    server, http = lab
    notebook = notebook_of([("c-1", "print('new')")])
    earlier = [{"output_type": "stream", "name": "stdout", "text": "old\n"}]
    notebook["cells"][0].update(outputs=earlier, execution_count=3)
    saved = http.put(
        server.url + f"api/contents/{NOTEBOOK}", json={"type": "notebook", "content": notebook}
    )
    assert saved.status_code in (200, 201), saved.text
    run_id = submit(http, [["execute_cell", {"cell_id": "c-1"}]], kernel_id=kernel.kernel_id)
    answer(http, run_id)
    [edit] = ended(http, run_id)["snapshot"]["edits"]
    assert edit["before"] == earlier
    assert joined(outputs_of(server, "c-1")[0][0]["text"]) == "new\n"

    undone = undo(http, run_id, edit["edit_id"])
    assert undone.status_code == 200, undone.text
    outputs, count = outputs_of(server, "c-1")
    assert notebook_edits.same_outputs(outputs, earlier) and count == 3
    assert "agentruns" not in on_disk(server)["cells"][0]["metadata"]
    assert undone.json()["snapshot"]["edits"][0]["status"] == "undone"


def test_undo_of_execute_cell_after_the_person_ran_the_cell_again_is_409(lab, kernel):
    server, http = lab
    save(server, http, [("c-1", "print('agent')")])
    run_id = submit(http, [["execute_cell", {"cell_id": "c-1"}]], kernel_id=kernel.kernel_id)
    answer(http, run_id)
    [edit] = ended(http, run_id)["snapshot"]["edits"]
    notebook = on_disk(server)
    notebook["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "me\n"}]
    http.put(
        server.url + f"api/contents/{NOTEBOOK}", json={"type": "notebook", "content": notebook}
    )
    before = (server.home / NOTEBOOK).read_text()
    refused = undo(http, run_id, edit["edit_id"])
    assert refused.status_code == 409 and "other outputs" in refused.json()["message"]
    assert (server.home / NOTEBOOK).read_text() == before


def test_execute_cell_keeps_what_is_left_after_clear_output(lab, kernel):
    server, http = lab
    code = (
        "from IPython.display import clear_output\n"
        "for step in range(3):\n"
        "    clear_output(wait=True)\n"
        "    print(f'step {step}')\n"
        "print('done')"
    )
    save(server, http, [("c-1", code)])
    run_id = submit(http, [["execute_cell", {"cell_id": "c-1"}]], kernel_id=kernel.kernel_id)
    answer(http, run_id)
    ended(http, run_id)
    [printed] = outputs_of(server, "c-1")[0]
    assert joined(printed["text"]) == "step 2\ndone\n"


def test_execute_cell_keeps_an_image_as_an_image(lab, kernel):
    server, http = lab
    code = (
        "import base64\nfrom IPython.display import Image, display\n"
        f"display(Image(data=base64.b64decode({PNG!r})))"
    )
    save(server, http, [("c-1", code)])
    run_id = submit(http, [["execute_cell", {"cell_id": "c-1"}]], kernel_id=kernel.kernel_id)
    answer(http, run_id)
    [ran] = ended(http, run_id)["output"]["answers"]
    assert "[image/png image 1" in ran["text"], ran["text"]
    [shown] = outputs_of(server, "c-1")[0]
    assert shown["output_type"] == "display_data"
    assert joined(shown["data"]["image/png"]).strip() == PNG


def test_execute_cell_with_more_output_than_an_edit_keeps_cuts_it_with_a_note(lab, kernel):
    server, http = lab
    save(server, http, [("c-1", "print('y' * 400_000)")])
    run_id = submit(http, [["execute_cell", {"cell_id": "c-1"}]], kernel_id=kernel.kernel_id)
    answer(http, run_id)
    run = ended(http, run_id)
    [ran] = run["output"]["answers"]
    assert ran["ok"] and ran["result"]["status"] == "applied"
    printed, note = outputs_of(server, "c-1")[0]
    assert 1000 < len(joined(printed["text"])) < 400_000
    assert note["name"] == "stderr" and "not kept" in joined(note["text"])
    assert notebook_edits.same_outputs(run["snapshot"]["edits"][0]["after"][1:], [note])


def test_a_person_runs_a_cell_with_an_mcp_client(lab, kernel):
    server, http = lab
    save(server, http, [("c-1", "print(6 * 7)")])
    save(server, http, [("c-1", "print(1)")], path="work/no-kernel.ipynb")
    ran, missing, no_kernel = call_tools(
        server,
        [
            ("execute_cell", {"notebook": NOTEBOOK, "cell_id": "c-1"}),
            ("execute_cell", {"notebook": NOTEBOOK, "cell_id": "nope"}),
            ("execute_cell", {"notebook": "work/no-kernel.ipynb", "cell_id": "c-1"}),
        ],
    )
    assert no_kernel.is_error and "no kernel runs for the notebook" in text(no_kernel)
    assert outputs_of(server, "c-1", "work/no-kernel.ipynb") == ([], None)
    assert not ran.is_error and "42" in text(ran), text(ran)
    [printed] = outputs_of(server, "c-1")[0]
    assert joined(printed["text"]) == "42\n"
    assert missing.is_error and "cell_not_found" in text(missing)


# Gaps: a run cancelled while its edit is made, an undo retried after a crash ----------------


def test_a_retried_undo_whose_notebook_change_was_made_is_recorded_undone(lab):
    server, http = lab
    save(server, http, CELLS)
    run_id = submit(http, [["edit_cell", {"cell_id": "c-2", "source": "print(x, 2)"}]])
    [edit] = ended(http, run_id)["snapshot"]["edits"]
    # The undo's change reached the file, and its server died before recording it.
    save(server, http, CELLS)
    done = undo(http, run_id, edit["edit_id"])
    assert done.status_code == 200, done.text
    assert done.json()["snapshot"]["edits"][0]["status"] == "undone"
    assert sources(on_disk(server)) == CELLS


@pytest.mark.timeout(180)
@pytest.mark.parametrize("save_ends", ["saved", "failed"])
@pytest.mark.parametrize("agent", ["nb_editor", "nb_mcp"])
def test_a_run_cancelled_while_its_edit_is_made_leaves_no_edit_pending(tmp_path, save_ends, agent):
    """The Python agent's call stops with its run; a call over MCP may outlive it (the edit's
    end then goes into the ended run's snapshot)."""
    marker = tmp_path / "hold-save"
    agents = {"agents": {**AGENTS["agents"], "nb_mcp": "agents_for_tests:notebook_mcp_client"}}
    server = ServerProcess(
        tmp_path / "home",
        tmp_path / "agentruns.sqlite3",
        agents,
        config={"ServerApp": {"contents_manager_class": "killing_contents.HoldSave"}},
    )
    server.env["AGENTRUNS_TEST_HOLD_SAVE"] = str(marker)
    server.start()
    try:
        (server.home / "work").mkdir()
        with server.client() as http:
            save(server, http, CELLS)
            marker.write_text("hold")  # the edit's save waits
            calls = [["insert_cell", {"source": "y = 2", "after": "c-1"}]]
            response = http.post(
                "runs",
                json={"agent": agent, "input": {"calls": calls}, "session": NOTEBOOK,
                      "metadata": {"kernel_id": "no-kernel"}},
            )  # fmt: skip
            assert response.status_code == 201, response.text
            run_id = response.json()["run_id"]
            held = tmp_path / "hold-save.held"
            deadline = time.monotonic() + 30
            while not held.exists():  # the edit is recorded pending, and its save waits
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert [e["status"] for e in events_of(http, run_id)] == ["pending"]
            cancelled = http.post(f"runs/{run_id}/cancel", json={"reason": "stop"})
            assert cancelled.status_code == 202, cancelled.text
            time.sleep(0.5)
            if save_ends == "saved":
                marker.unlink()
            else:
                marker.write_text("fail")
            run = wait_status(http, run_id, ["cancelled"])
            deadline = time.monotonic() + 30
            while run["snapshot"]["edits"][0]["status"] == "pending":  # (over MCP: a moment later)
                assert agent == "nb_mcp" and time.monotonic() < deadline
                time.sleep(0.1)
                run = http.get(f"runs/{run_id}").json()
            [edit] = run["snapshot"]["edits"]
            in_file = [source for _, source in sources(on_disk(server))].count("y = 2")
            if save_ends == "saved":
                assert edit["status"] == "applied" and in_file == 1
            else:
                assert edit["status"] == "rejected" and in_file == 0
                assert "stopped before the edit was made" in edit["reason"]
            recorded = [e["status"] for e in events_of(http, run_id)]
            assert recorded in (["pending", edit["status"]], ["pending"]), recorded
    finally:
        marker.unlink(missing_ok=True)
        server.kill()


# execute_cell taken over: its outputs written once, the cell never run twice ----------------


@pytest.mark.timeout(180)
def test_outputs_written_when_the_server_was_killed_are_recorded_once_after_take_over(tmp_path):
    marker = tmp_path / "kill-after-save"
    server = ServerProcess(
        tmp_path / "home",
        tmp_path / "agentruns.sqlite3",
        {"lease_seconds": 1.5, **AGENTS},
        config={"ServerApp": {"contents_manager_class": "killing_contents.KillAfterSave"}},
    )
    server.env["AGENTRUNS_TEST_KILL_AFTER_SAVE"] = str(marker)
    server.start()
    try:
        (server.home / "work").mkdir()
        with server.client() as http:
            save(server, http, [("c-1", "print('once')")])
            kernel = Kernel(server, http, NOTEBOOK)
            kernel.client.stop_channels()
            run_id = submit(
                http, [["execute_cell", {"cell_id": "c-1"}]], kernel_id=kernel.kernel_id
            )
            question(http, run_id)
            marker.touch()  # the next save of a notebook is the server's last
            answer(http, run_id)
            server.process.wait(30)
        [printed] = outputs_of(server, "c-1")[0]
        assert joined(printed["text"]) == "once\n"
        marker.unlink()
        server.start()
        with server.client() as http:
            run = wait_status(http, run_id, ["succeeded", "failed"], timeout=60)
            assert run["status"] == "succeeded", run["error"]
            assert run["attempt"] == 2
            [edit] = run["snapshot"]["edits"]
            assert (edit["op"], edit["status"]) == ("outputs", "applied")
            assert [e["status"] for e in events_of(http, run_id)] == ["pending", "applied"]
            cell = on_disk(server)["cells"][0]
            assert cell["metadata"]["agentruns"]["edit_id"] == edit["edit_id"]
            [settled] = run["output"]["settled"]
            assert settled["ok"] and "once" in settled["text"], settled
    finally:
        server.kill()


@pytest.mark.timeout(180)
def test_execute_cell_whose_server_died_while_it_ran_is_not_run_again(tmp_path):
    server = ServerProcess(
        tmp_path / "home", tmp_path / "agentruns.sqlite3", {"lease_seconds": 1.5, **AGENTS}
    ).start()
    ran = tmp_path / "ran.txt"
    try:
        (server.home / "work").mkdir()
        code = f"open({str(ran)!r}, 'a').write('ran\\n')\nimport time\ntime.sleep(30)"
        with server.client() as http:
            save(server, http, [("c-1", code)])
            kernel = Kernel(server, http, NOTEBOOK)
            kernel.client.stop_channels()
            run_id = submit(
                http, [["execute_cell", {"cell_id": "c-1"}]], kernel_id=kernel.kernel_id
            )
            answer(http, run_id)
            deadline = time.monotonic() + 30
            while not ran.exists():
                assert time.monotonic() < deadline
                time.sleep(0.05)
        server.kill()  # and its kernel: the cell's run is lost with it
        server.start()
        with server.client() as http:
            run = wait_status(http, run_id, ["succeeded", "failed"], timeout=60)
            assert run["status"] == "succeeded", run["error"]
            [settled] = run["output"]["settled"]
            assert not settled["ok"] and "interrupted" in settled["text"]
            assert "not run again" in settled["text"]
            [step] = run["snapshot"]["tools"]
            assert (step["name"], step["status"]) == ("execute_cell", "failed")
            assert "edits" not in run["snapshot"]
        assert ran.read_text() == "ran\n"  # once
        assert outputs_of(server, "c-1") == ([], None)
    finally:
        server.kill()


def test_execute_cell_bad_calls_get_a_clear_error_ask_nothing_and_change_nothing(lab):
    server, http = lab
    notebook = notebook_of(CELLS)
    notebook["cells"][2]["cell_type"] = "markdown"
    for key in ("outputs", "execution_count"):
        del notebook["cells"][2][key]
    saved = http.put(
        server.url + f"api/contents/{NOTEBOOK}", json={"type": "notebook", "content": notebook}
    )
    assert saved.status_code in (200, 201), saved.text
    before = (server.home / NOTEBOOK).read_text()
    calls = [
        ["execute_cell", {}],
        ["execute_cell", {"cell_id": "nope"}],
        ["execute_cell", {"cell_id": "c-3"}],
    ]
    run = ended(http, submit(http, calls))
    no_id, unknown, markdown = run["output"]["answers"]
    assert "invalid_arguments" in no_id["text"] and "cell_id" in no_id["text"]
    assert "cell_not_found" in unknown["text"] and "'nope'" in unknown["text"]
    assert "invalid_arguments" in markdown["text"] and "only a code cell runs" in markdown["text"]
    assert (server.home / NOTEBOOK).read_text() == before
    assert "edits" not in run["snapshot"] and "inputs" not in run["snapshot"]
    assert [s["status"] for s in run["snapshot"]["tools"]] == ["failed"] * 3


def test_an_outputs_edit_is_bounded_applied_reverted_and_known_reverted():
    notebook = notebook_of(CELLS)
    cell = notebook["cells"][1]
    cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "z" * 50_000}]
    after = [
        {"output_type": "stream", "name": "stdout", "text": "1\n"},
        {"output_type": "display_data", "data": {"image/png": "A" * 30_000}, "metadata": {}},
        {"output_type": "execute_result", "data": {"text/plain": "2"}, "metadata": {},
         "execution_count": 5},
    ]  # fmt: skip
    edit = notebook_edits.outputs_edit(NOTEBOOK, cell, 1, "print(x)", after, 5, room=20_000)
    assert edit["status"] == "pending" and edit["op"] == "outputs"
    # Each side within half the room: the long text cut, the image left out, each said.
    for side in ("before", "after"):
        assert len(json.dumps(edit[side])) <= 10_000
        assert "not kept" in edit[side][-1]["text"] and edit[side][-1]["name"] == "stderr"
    assert [o["output_type"] for o in edit["after"]] == ["stream", "execute_result", "stream"]
    assert "1 output not kept" in edit["after"][-1]["text"]
    assert fit_outputs(edit["after"], 10_000) == edit["after"]  # fitted once, never cut again
    notebook_edits.apply(notebook, edit, "run_a")
    assert notebook_edits.is_applied(notebook, edit)
    assert notebook["cells"][1]["execution_count"] == 5
    assert not notebook_edits.is_reverted(notebook, edit)
    notebook_edits.revert(notebook, edit)
    assert notebook_edits.same_outputs(notebook["cells"][1]["outputs"], edit["before"])
    assert notebook["cells"][1]["execution_count"] is None
    assert "agentruns" not in notebook["cells"][1]["metadata"]
    assert notebook_edits.is_reverted(notebook, edit)
    # A source changed since it ran: a conflict, planned or applied, and nothing changes.
    changed = notebook_edits.outputs_edit(NOTEBOOK, cell, 1, "print(y)", after, 5, room=20_000)
    assert changed["status"] == "conflict" and "changed while it ran" in changed["reason"]
    with pytest.raises(notebook_edits.EditConflict):
        notebook_edits.apply(notebook, changed, "run_a")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("choice", ["run_again", "skip"])
def test_an_execute_cell_its_server_died_in_is_a_question_with_in_doubt_ask(tmp_path, choice):
    """The cell may have run, its outputs were never recorded: a person decides, after the
    take-over, whether it runs again (in the notebook's kernel then) or is skipped."""
    settings = {**AGENTS, "lease_seconds": 1.5, "in_doubt": "ask",
                "notebook_tools_approval": "never"}  # fmt: skip
    server = ServerProcess(tmp_path / "home", tmp_path / "agentruns.sqlite3", settings)
    (server.home / "work").mkdir(parents=True)
    mark = tmp_path / "ran-once"
    # The first run of the cell sleeps (its server is killed meanwhile); a run again prints.
    source = (
        f"import os, time\nif not os.path.exists({str(mark)!r}):\n"
        f"    open({str(mark)!r}, 'w').close()\n    time.sleep(60)\nprint('ran')"
    )
    (server.home / NOTEBOOK).write_text(json.dumps(notebook_of([("c-1", source)])))

    def session(http) -> str:
        made = http.post(
            server.url + "api/sessions",
            json={"path": NOTEBOOK, "type": "notebook", "name": "edits.ipynb",
                  "kernel": {"name": "python3"}},
        )  # fmt: skip
        assert made.status_code == 201, made.text
        return made.json()["kernel"]["id"]

    server.start()
    try:
        with server.client() as http:
            run_id = submit(http, [["execute_cell", {"cell_id": "c-1"}]], kernel_id=session(http))
            deadline = time.monotonic() + 60
            while not mark.exists():
                assert time.monotonic() < deadline, "the cell did not start"
                time.sleep(0.05)
        server.kill()
        server.start()
        with server.client() as http:
            if choice == "run_again":
                session(http)  # the notebook's kernel on this server: where it runs again
            asked = question(http, run_id)
            assert asked["kind"] == "in_doubt"
            assert asked["details"]["tool"] == "execute_cell"
            assert asked["details"]["args"] == {"cell_id": "c-1"}
            assert asked["choices"] == ["run_again", "skip", "stop"]
            assert outputs_of(server, "c-1") == ([], None)  # nothing written before the answer
            answered = http.post(
                f"runs/{run_id}/inputs/{asked['request_id']}", json={"choice": choice}
            )
            assert answered.status_code == 200, answered.text
            run = ended(http, run_id)
        [step] = run["snapshot"]["tools"]
        outputs, count = outputs_of(server, "c-1")
        if choice == "run_again":
            assert step["status"] == "completed", step.get("error")
            assert [joined(o["text"]) for o in outputs] == ["ran\n"] and count is not None
            [edit] = run["snapshot"]["edits"]
            assert (edit["op"], edit["status"]) == ("outputs", "applied")
            [settled] = run["output"]["settled"]
            assert settled["ok"] and "Ran the cell c-1" in settled["text"]
        else:
            assert step["status"] == "failed" and step["error"]["type"] == "skipped"
            assert (outputs, count) == ([], None) and not run["snapshot"].get("edits")
    finally:
        server.kill()
