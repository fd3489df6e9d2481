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

from servers import ServerProcess, wait_status

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


def submit(http, calls, path=NOTEBOOK) -> str:
    """A run of the editing agent; its kernel is none of this server's: its notebook is its session."""
    response = http.post(
        "runs",
        json={
            "agent": "nb_editor",
            "input": {"calls": calls},
            "session": path,
            "metadata": {"kernel_id": "no-kernel"},
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
