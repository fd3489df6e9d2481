"""An ACP agent that writes a notebook whole: the server makes it cell edits, never a file overwrite.

The scripted agent (tests/acp_agent.py) reads the notebook with
``fs/read_text_file`` and writes it back changed with ``fs/write_text_file``,
as an editing agent does. Each changed cell is a notebook edit of the run, with
or without notebook tools (the same events, stamps, conflicts and undo as the
notebook tools' own), and the agent's answer says what changed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_acp_agents import entry, run_prompt

from conftest import submit, wait_run, waiting
from servers import ServerProcess, wait_status

pytestmark = [pytest.mark.sqlite_only, pytest.mark.timeout(60)]

NOTEBOOK = "nb.ipynb"
# A run submitted from a notebook's kernel has notebook tools (the kernel need not be running).
WITH_TOOLS = {"metadata": {"kernel_id": "no-kernel"}}
OUTPUT = {"output_type": "stream", "name": "stdout", "text": "1\n"}


@pytest.fixture
def state(tmp_path):
    path = tmp_path / "acp-state"
    path.mkdir()
    return path


@pytest.fixture
def edits_setting():
    """``c.AgentRuns.notebook_edits`` (parametrized where a test asks first)."""
    return "apply"


@pytest.fixture
def agentruns_config(state, edits_setting):
    return {"acp_agents": {"scripted": entry(state)}, "notebook_edits": edits_setting}


@pytest.fixture
def root(jp_serverapp):
    return Path(jp_serverapp.root_dir).resolve()


# Three code cells, the first two run, as the person saved them.
CONTENT = {
    "cells": [
        {"cell_type": "code", "id": "c-1", "metadata": {}, "execution_count": 1,
         "source": "x = 1", "outputs": []},
        {"cell_type": "code", "id": "c-2", "metadata": {"tags": ["keep"]},
         "execution_count": 2, "source": "print(x)", "outputs": [OUTPUT]},
        {"cell_type": "code", "id": "c-3", "metadata": {}, "execution_count": None,
         "source": "# scratch", "outputs": []},
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    "nbformat": 4, "nbformat_minor": 5,
}  # fmt: skip


@pytest.fixture
def notebook(root):
    """``nb.ipynb`` under the server's root."""
    path = root / NOTEBOOK
    path.write_text(json.dumps(CONTENT))
    return path


def cells_of(path) -> dict[str, dict]:
    return {cell["id"]: cell for cell in json.loads(path.read_text())["cells"]}


def source(cell) -> str:
    return "".join(cell["source"])


def outputs(cell) -> list[dict]:
    """A cell's outputs, their texts joined (a file keeps them as lists of lines)."""
    return [{**o, "text": "".join(o["text"])} if "text" in o else o for o in cell["outputs"]]


def rewrite(changes, go="-", path=NOTEBOOK) -> str:
    """The scripted agent's prompt: read ``path``, wait for ``go``, write it back with ``changes``."""
    return f"notebook {path} {go} {json.dumps(changes)}"


def answered(run) -> dict:
    assert run["status"] == "succeeded", run["error"]
    return json.loads(run["output"]["text"])


async def save_as_a_person(api, path, edit) -> None:
    """Change cells' sources through the contents API, as JupyterLab saves."""
    url = str(api.base_url).replace("api/agentruns/", "api/contents/") + path
    model = (await api.get(url, params={"content": "1"})).json()
    for cell in model["content"]["cells"]:
        if cell["id"] in edit:
            cell["source"] = edit[cell["id"]]
    saved = await api.put(url, json={"type": "notebook", "content": model["content"]})
    assert saved.status_code == 200, saved.text


async def test_a_written_notebook_becomes_one_edit_per_changed_cell_not_a_file_overwrite(
    api, notebook
):
    changes = {
        "edit": {"c-2": "print(x, y)"},
        "insert": [{"after": "c-1", "id": "new-1", "source": "y = 2"}],
    }
    run = await run_prompt(api, rewrite(changes), **WITH_TOOLS)
    meta = answered(run)["meta"]["agentruns"]
    # In the notebook's order; the new cell at its place, with the id the agent gave it.
    assert [(c["op"], c["cell_id"], c["status"]) for c in meta["changes"]] == [
        ("insert", "new-1", "applied"),
        ("edit", "c-2", "applied"),
    ]
    assert meta["notes"] == [] and "changed one by one" in meta["text"]
    cells = cells_of(notebook)
    assert list(cells) == ["c-1", "new-1", "c-2", "c-3"]
    assert source(cells["new-1"]) == "y = 2" and source(cells["c-2"]) == "print(x, y)"
    # The cells it did not change are as they were; the changed one keeps its outputs.
    assert {**cells["c-1"], "source": source(cells["c-1"])} == {
        "cell_type": "code", "id": "c-1", "metadata": {}, "execution_count": 1,
        "source": "x = 1", "outputs": [],
    }  # fmt: skip
    assert outputs(cells["c-2"]) == [OUTPUT] and cells["c-2"]["execution_count"] == 2
    edits = {e["cell_id"]: e for e in run["snapshot"]["edits"]}
    for cell_id in ("new-1", "c-2"):
        stamp = cells[cell_id]["metadata"]["agentruns"]
        assert stamp == {"run_id": run["run_id"], "edit_id": edits[cell_id]["edit_id"]}
    assert cells["c-2"]["metadata"]["tags"] == ["keep"]
    assert [(e["op"], e["status"]) for e in run["snapshot"]["edits"]] == [
        ("insert", "applied"), ("edit", "applied"),
    ]  # fmt: skip
    assert edits["c-2"]["before"] == "print(x)" and edits["c-2"]["after"] == "print(x, y)"
    # Each edit a step of the run, as the notebook tools make them; no file written whole.
    assert [t["name"] for t in run["snapshot"]["tools"]] == ["insert_cell", "edit_cell"]


async def test_one_edit_of_a_written_notebook_is_undone_alone(api, notebook):
    changes = {
        "edit": {"c-2": "print(x, y)"},
        "insert": [{"after": "c-1", "id": "new-1", "source": "y = 2"}],
    }
    run = await run_prompt(api, rewrite(changes), **WITH_TOOLS)
    edited = next(e for e in run["snapshot"]["edits"] if e["op"] == "edit")
    undone = await api.post(f"runs/{run['run_id']}/edits/{edited['edit_id']}/undo")
    assert undone.status_code == 200, undone.text
    cells = cells_of(notebook)
    assert list(cells) == ["c-1", "new-1", "c-2", "c-3"]
    assert source(cells["c-2"]) == "print(x)" and "agentruns" not in cells["c-2"]["metadata"]
    assert source(cells["new-1"]) == "y = 2"


async def test_a_cell_the_person_changed_since_the_agent_read_it_is_a_conflict(
    api, notebook, state
):
    go = state / "go"
    changes = {
        "edit": {"c-2": "print('agent')"},
        "insert": [{"after": "c-3", "id": "new-1", "source": "z = 3"}],
    }
    response = await submit(api, "scripted", {"prompt": rewrite(changes, go)}, **WITH_TOOLS)
    assert response.status_code == 201, response.text
    run_id = response.json()["run_id"]
    for _ in range(400):
        if (state / "read").exists():
            break
        await asyncio.sleep(0.05)
    read = json.loads((state / "read").read_text())
    assert [cell["id"] for cell in read["cells"]] == ["c-1", "c-2", "c-3"]
    # The person changes the cell the agent is about to change, and one it leaves as it read it.
    await save_as_a_person(api, NOTEBOOK, {"c-2": "print('person')", "c-3": "# mine"})
    go.write_text("")
    run = await wait_run(api, run_id)
    refused = answered(run)["refused"]
    assert "edit cell c-2: edit_conflict" in refused and "insert cell new-1: applied" in refused
    assert "Read the notebook again" in refused
    cells = cells_of(notebook)
    assert source(cells["c-2"]) == "print('person')" and source(cells["c-3"]) == "# mine"
    assert list(cells) == ["c-1", "c-2", "c-3", "new-1"]
    statuses = [(e["op"], e["cell_id"], e["status"]) for e in run["snapshot"]["edits"]]
    assert statuses == [("edit", "c-2", "conflict"), ("insert", "new-1", "applied")]


@pytest.mark.parametrize("edits_setting", ["ask"])
async def test_with_edits_asked_first_each_cell_of_a_written_notebook_is_a_question(api, notebook):
    changes = {
        "edit": {"c-2": "print(x, y)"},
        "insert": [{"after": "c-1", "id": "new-1", "source": "y = 2"}],
    }
    response = await submit(api, "scripted", {"prompt": rewrite(changes)}, **WITH_TOOLS)
    run_id = response.json()["run_id"]
    for asked, (op, choice) in enumerate([("insert", "approve"), ("edit", "deny")], 1):
        question = (await waiting(api, run_id, asked=asked))["snapshot"]["inputs"][-1]
        assert question["details"]["op"] == op, question
        answer = await api.post(f"runs/{run_id}/inputs/{question['request_id']}",
                                json={"choice": choice})  # fmt: skip
        assert answer.status_code == 200, answer.text
    run = await wait_run(api, run_id)
    refused = answered(run)["refused"]
    assert "insert cell new-1: applied" in refused and "edit cell c-2: denied" in refused
    cells = cells_of(notebook)
    assert list(cells) == ["c-1", "new-1", "c-2", "c-3"] and source(cells["c-2"]) == "print(x)"
    statuses = [(e["op"], e["status"]) for e in run["snapshot"]["edits"]]
    assert statuses == [("insert", "applied"), ("edit", "rejected")]


async def test_a_text_that_is_not_a_notebook_is_refused_and_changes_nothing(api, notebook):
    before = notebook.read_bytes()
    for text in ('{"cells": [', '{"cells": [], "nbformat": 4}'):
        run = await run_prompt(api, f"write {NOTEBOOK} {text}", **WITH_TOOLS)
        assert run["status"] == "succeeded", run["error"]
        assert run["output"]["text"].startswith("refused: the text written is not a valid notebook")
        assert "nothing was changed" in run["output"]["text"]
        assert notebook.read_bytes() == before
        [step] = run["snapshot"]["tools"]
        assert step["name"] == "write_text_file" and step["status"] == "failed"
        assert step["error"]["type"] == "invalid_notebook"
        assert not run["snapshot"].get("edits")


async def test_cells_without_ids_are_matched_by_position_only_when_the_counts_agree(api, notebook):
    run = await run_prompt(api, rewrite({"edit": {"c-3": "# notes"}, "no_ids": True}), **WITH_TOOLS)
    meta = answered(run)["meta"]["agentruns"]
    assert [(c["op"], c["cell_id"]) for c in meta["changes"]] == [("edit", "c-3")]
    assert source(cells_of(notebook)["c-3"]) == "# notes"
    before = notebook.read_bytes()
    fewer = rewrite({"delete": ["c-1"], "no_ids": True})
    refused = answered(await run_prompt(api, fewer, **WITH_TOOLS))["refused"]
    assert "matched by position only when the counts agree" in refused
    assert notebook.read_bytes() == before


async def test_a_removed_cell_is_deleted_and_written_outputs_are_not_taken(api, notebook):
    run = await run_prompt(api, rewrite({"delete": ["c-1"], "outputs": True}), **WITH_TOOLS)
    meta = answered(run)["meta"]["agentruns"]
    assert [(c["op"], c["cell_id"], c["status"]) for c in meta["changes"]] == [
        ("delete", "c-1", "applied")
    ]
    assert any("outputs" in note and "not" in note for note in meta["notes"])
    cells = cells_of(notebook)
    assert list(cells) == ["c-2", "c-3"]
    assert outputs(cells["c-2"]) == [OUTPUT] and cells["c-3"]["outputs"] == []


async def test_without_a_kernel_a_written_notebook_is_still_one_edit_per_changed_cell(
    api, notebook
):
    """A run with no kernel (New run in the runs panel, a REST client) has no notebook tools,
    yet the notebook it writes may be open in a page: it becomes cell edits all the same."""
    run = await run_prompt(api, rewrite({"edit": {"c-2": "print(2)"}}))
    meta = answered(run)["meta"]["agentruns"]
    assert [(c["op"], c["cell_id"], c["status"]) for c in meta["changes"]] == [
        ("edit", "c-2", "applied")
    ]
    cell = cells_of(notebook)["c-2"]
    assert source(cell) == "print(2)" and outputs(cell) == [OUTPUT]
    [edit] = run["snapshot"]["edits"]
    assert cell["metadata"]["agentruns"] == {"run_id": run["run_id"], "edit_id": edit["edit_id"]}
    assert [t["name"] for t in run["snapshot"]["tools"]] == ["edit_cell"]
    # And undone like any edit.
    undone = await api.post(f"runs/{run['run_id']}/edits/{edit['edit_id']}/undo")
    assert undone.status_code == 200, undone.text
    assert source(cells_of(notebook)["c-2"]) == "print(x)"


async def test_a_notebook_that_does_not_exist_yet_is_written_as_a_file(api, root):
    text = json.dumps({**CONTENT, "cells": CONTENT["cells"][:1]}, separators=(",", ":"))
    run = await run_prompt(api, f"write new.ipynb {text}")
    assert run["output"]["text"] == "written"
    assert list(cells_of(root / "new.ipynb")) == ["c-1"]
    [step] = run["snapshot"]["tools"]
    assert step["name"] == "write_text_file" and step["content"][0]["old_text"] is None
    assert not run["snapshot"].get("edits")


@pytest.mark.timeout(180)
def test_a_cell_written_when_its_server_was_killed_is_applied_once_after_take_over(tmp_path, state):
    marker = tmp_path / "kill-after-save"
    server = ServerProcess(
        tmp_path / "home",
        tmp_path / "agentruns.sqlite3",
        {"lease_seconds": 1.5, "acp_agents": {"scripted": entry(state, resumable=True)}},
        config={"ServerApp": {"contents_manager_class": "killing_contents.KillAfterSave"}},
    )
    server.env["AGENTRUNS_TEST_KILL_AFTER_SAVE"] = str(marker)
    path = server.home / NOTEBOOK
    path.write_text(json.dumps(CONTENT))
    server.start()
    try:
        with server.client() as http:
            marker.touch()  # the next save of a notebook is the server's last
            prompt = rewrite({"edit": {"c-2": "print(2)"}})
            response = http.post(
                "runs",
                json={"agent": "scripted", "input": {"prompt": prompt}, "session": "s1",
                      **WITH_TOOLS},
            )  # fmt: skip
            assert response.status_code == 201, response.text
            run_id = response.json()["run_id"]
            server.process.wait(30)
        # Killed with the cell in the file, before its run recorded the edit applied.
        assert source(cells_of(path)["c-2"]) == "print(2)"
        marker.unlink()
        server.start()
        with server.client() as http:
            run = wait_status(http, run_id, ["succeeded", "failed"], timeout=60)
            events = http.get(f"runs/{run_id}/events", params={"limit": 1000}).json()["events"]
        assert run["status"] == "succeeded", run["error"]
        assert run["attempt"] == 2
        [edit] = run["snapshot"]["edits"]
        assert edit["status"] == "applied" and edit["cell_id"] == "c-2"
        edit_events = [e["data"]["status"] for e in events if e["type"] == "notebook.edit"]
        assert edit_events == ["pending", "applied"]
        [step] = run["snapshot"]["tools"]
        assert step["name"] == "edit_cell" and step["status"] == "completed"
        # The agent, asked to go on, wrote the notebook again: nothing was left to change.
        assert answered(run)["meta"]["agentruns"]["changes"] == []
        assert source(cells_of(path)["c-2"]) == "print(2)"
    finally:
        server.kill()
