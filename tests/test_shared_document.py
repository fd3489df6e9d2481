"""Agents that edit a notebook open as a live shared document (jupyter-collaboration).

A real server with the collaboration extension, and a real Y client holding
the notebook open over the collaboration websocket, as a page does. The
server does not watch the notebook's file here (``file_poll_interval`` 0):
a change the client sees came through the live document, never through the
file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import pytest

# jupyter-collaboration (the test extra) needs a newer jupyter_server than the lowest this
# package supports: where it is not installed, there is no shared document to test.
pytest.importorskip("jupyter_server_ydoc", reason="jupyter-collaboration is not installed")
pytest.importorskip("httpx_ws", reason="httpx-ws (a Y client of a room) is not installed")

from httpx_ws import aconnect_ws  # noqa: E402
from jupyter_ydoc import YNotebook  # noqa: E402
from pycrdt import ArrayEvent, Provider  # noqa: E402
from pycrdt.websocket.websocket import HttpxWebsocket  # noqa: E402

from jupyter_agentruns.notebook_tools.document import DocumentChanged, DocumentPlace
from jupyter_agentruns.notebook_tools.places import Change

from servers import TLS, ServerProcess

pytestmark = pytest.mark.timeout(120)
AGENTS = {"agents": {"nb_editor": "agents_for_tests:notebook_editor"}}
CELLS = [("c-1", "x = 1"), ("c-2", "print(x)"), ("c-3", "# scratch")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("shareddoc")
    server = ServerProcess(
        home / "home",
        home / "agentruns.sqlite3",
        AGENTS,
        config={"YDocExtension": {"file_poll_interval": 0, "document_save_delay": 0.2}},
        collaboration=True,
    ).start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def http(server, jp_asyncio_loop):
    client = httpx.AsyncClient(
        base_url=server.url,
        headers={"Authorization": f"token {server.token}"},
        timeout=30,
        verify=TLS,
    )
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


def notebook_of(cells) -> dict:
    return {
        "cells": [
            {"cell_type": "code", "id": cell_id, "metadata": {}, "execution_count": None,
             "source": source, "outputs": []}
            for cell_id, source in cells
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }  # fmt: skip


async def save(http, path, cells=CELLS) -> None:
    saved = await http.put(
        f"api/contents/{path}", json={"type": "notebook", "content": notebook_of(cells)}
    )
    assert saved.status_code in (200, 201), saved.text


def on_disk(server, path) -> list[tuple[str, str]] | None:
    """The file's cells; None while it is being written."""
    try:
        cells = json.loads((server.home / path).read_text())["cells"]
    except json.JSONDecodeError:
        return None
    return [(cell["id"], "".join(cell["source"])) for cell in cells]


def in_document(document: YNotebook) -> list[tuple[str, str]]:
    return [(cell["id"], cell["source"]) for cell in document.get()["cells"]]


@contextlib.asynccontextmanager
async def opened(server, http, path):
    """The notebook held open as a page holds it: a Y client of its collaboration room."""
    session = await http.put(
        f"api/collaboration/session/{path}", json={"format": "json", "type": "notebook"}
    )
    assert session.status_code in (200, 201), session.text
    room = f"json:notebook:{session.json()['fileId']}"
    url = f"http://127.0.0.1:{server.port}/api/collaboration/room/{room}"
    document = YNotebook()
    async with (
        aconnect_ws(f"{url}?sessionId={session.json()['sessionId']}", http) as websocket,
        Provider(document.ydoc, HttpxWebsocket(websocket, room)),
    ):
        await until(lambda: document.cell_number > 0, "the document to load")
        yield document


async def until(predicate, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def submit(http, calls, path) -> str:
    response = await http.post(
        "api/agentruns/runs",
        json={
            "agent": "nb_editor",
            "input": {"calls": calls},
            "session": path,
            "metadata": {"kernel_id": "no-kernel"},
        },
    )
    assert response.status_code == 201, response.text
    return response.json()["run_id"]


async def run_of(http, run_id, statuses=("succeeded", "failed")) -> dict:
    deadline = time.monotonic() + 30
    while True:
        run = (await http.get(f"api/agentruns/runs/{run_id}")).json()
        if run["status"] in statuses:
            return run
        assert time.monotonic() < deadline, run
        await asyncio.sleep(0.05)


async def answer_question(http, run_id) -> None:
    run = await run_of(http, run_id, ("waiting",))
    [asked] = [q for q in run["snapshot"]["inputs"] if q["status"] == "open"]
    answered = await http.post(
        f"api/agentruns/runs/{run_id}/inputs/{asked['request_id']}", json={"choice": "approve"}
    )
    assert answered.status_code == 200, answered.text


async def test_an_agents_edits_show_in_the_open_document_at_once_and_reach_the_file(server, http):
    path = "live.ipynb"
    await save(http, path)
    async with opened(server, http, path) as document:
        events = []
        document.ycells.observe_deep(lambda changes: events.extend(changes))
        run_id = await submit(
            http,
            [
                ["insert_cell", {"source": "y = 2", "after": "c-1"}],
                ["edit_cell", {"cell_id": "c-2", "source": "print(x, y)"}],
                ["delete_cell", {"cell_id": "c-3"}],
            ],
            path,
        )
        run = await run_of(http, run_id)
        assert run["status"] == "succeeded", run["error"]
        inserted, edited, deleted = run["output"]["answers"]
        assert inserted["ok"] and edited["ok"] and deleted["ok"], run["output"]
        new_id = inserted["result"]["cell_id"]
        expected = [("c-1", "x = 1"), (new_id, "y = 2"), ("c-2", "print(x, y)")]
        await until(lambda: in_document(document) == expected, "the edits in the document")
        stamped = document.get()["cells"][1]["metadata"]["agentruns"]
        assert stamped == {"run_id": run_id, "edit_id": run["snapshot"]["edits"][0]["edit_id"]}
        # The edited cell was changed in place (its text), not replaced: a
        # person's cursor in it or in another cell stays where it was.
        cells_replaced = [
            event for event in events if isinstance(event, ArrayEvent) and event.path == []
        ]
        assert len(cells_replaced) == 2  # the insert and the delete, nothing more
        # The collaboration extension saves the document to the file by itself.
        await until(lambda: on_disk(server, path) == expected, "the edits in the file")
        assert [e["status"] for e in run["snapshot"]["edits"]] == ["applied"] * 3


async def test_read_notebook_reads_the_open_document_with_a_persons_unsaved_change(server, http):
    path = "read.ipynb"
    await save(http, path)
    async with opened(server, http, path) as document:
        run_id = await submit(http, [["wait", {}], ["read_notebook", {}]], path)
        await run_of(http, run_id, ("waiting",))
        document.set_cell(1, source="print(x)  # a person's line")
        await answer_question(http, run_id)
        run = await run_of(http, run_id)
        [read] = run["output"]["answers"]
        assert read["ok"] and "as open now" in read["text"], read["text"]
        assert "print(x)  # a person's line" in read["text"]


async def test_a_persons_change_in_the_document_makes_the_agents_edit_a_conflict(server, http):
    path = "conflict.ipynb"
    await save(http, path)
    async with opened(server, http, path) as document:
        run_id = await submit(
            http,
            [
                ["read_notebook", {}],
                ["wait", {}],
                ["edit_cell", {"cell_id": "c-2", "source": "print('agent')"}],
            ],
            path,
        )
        await run_of(http, run_id, ("waiting",))
        mine = "print(x)  # mine"
        document.set_cell(1, source=mine)
        await answer_question(http, run_id)
        run = await run_of(http, run_id)
        read, edited = run["output"]["answers"]
        assert not edited["ok"] and "edit_conflict" in edited["text"], edited
        [edit] = run["snapshot"]["edits"]
        assert edit["status"] == "conflict"
        expected = [("c-1", "x = 1"), ("c-2", mine), ("c-3", "# scratch")]
        await until(lambda: on_disk(server, path) == expected, "the person's change in the file")
        assert in_document(document) == expected


async def test_undo_goes_through_the_open_document(server, http):
    path = "undo.ipynb"
    await save(http, path)
    async with opened(server, http, path) as document:
        run_id = await submit(http, [["insert_cell", {"source": "z = 3", "after": "end"}]], path)
        run = await run_of(http, run_id)
        [edit] = run["snapshot"]["edits"]
        await until(lambda: document.cell_number == 4, "the inserted cell")
        undone = await http.post(f"api/agentruns/runs/{run_id}/edits/{edit['edit_id']}/undo")
        assert undone.status_code == 200, undone.text
        assert undone.json()["snapshot"]["edits"][0]["status"] == "undone"
        await until(lambda: in_document(document) == CELLS, "the cell gone from the document")
        await until(lambda: on_disk(server, path) == CELLS, "the cell gone from the file")


async def test_a_notebook_no_page_holds_open_is_edited_in_its_file(server, http):
    path = "closed.ipynb"
    await save(http, path)
    run_id = await submit(
        http, [["insert_cell", {"source": "w = 4", "after": "end"}], ["read_notebook", {}]], path
    )
    run = await run_of(http, run_id)
    inserted, read = run["output"]["answers"]
    assert inserted["ok"] and "as last saved" in read["text"], run["output"]
    assert on_disk(server, path)[-1] == (inserted["result"]["cell_id"], "w = 4")


# The place itself, on a real jupyter_ydoc document (as the collaboration extension holds it).


def live_document(cells=CELLS) -> YNotebook:
    document = YNotebook()
    document.set(notebook_of(cells))
    return document


def place_of(document: YNotebook | None) -> DocumentPlace:
    async def get_document(*, path, content_type, file_format, copy):
        assert (content_type, file_format, copy) == ("notebook", "json", False)
        return document

    return DocumentPlace(get_document)


async def test_a_replace_changes_the_cells_text_metadata_and_outputs_in_place():
    document = live_document()
    place = place_of(document)
    events = []
    document.ycells.observe_deep(lambda changes: events.extend(changes))
    notebook = await place.read("nb.ipynb")
    cell = dict(notebook["cells"][1])
    cell.update(
        source="print(x, 2)",
        metadata={"agentruns": {"run_id": "run_1", "edit_id": "ed_1"}},
        execution_count=3,
        outputs=[{"output_type": "stream", "name": "stdout", "text": ["1 ", "2\n"]}],
    )
    notebook["cells"][1] = cell
    await place.make("nb.ipynb", notebook, Change("replace", 1, cell))
    assert document.get()["cells"][1] == cell | {
        "outputs": [cell["outputs"][0] | {"text": "1 2\n"}]
    }
    assert document.get()["cells"][0]["source"] == "x = 1"
    # No cell was taken out or put in: every change is inside cell 2.
    assert events and all(event.path[:1] == [1] for event in events)
    assert not [e for e in events if isinstance(e, ArrayEvent) and e.path == []]


async def test_a_change_to_a_document_that_changed_since_it_was_read_is_refused():
    document = live_document()
    place = place_of(document)
    notebook = await place.read("nb.ipynb")
    cell = dict(notebook["cells"][1], source="print('agent')")
    notebook["cells"][1] = cell
    document.set_cell(1, source="print(x)  # typed meanwhile")
    with pytest.raises(DocumentChanged):
        await place.make("nb.ipynb", notebook, Change("replace", 1, cell))
    assert in_document(document)[1] == ("c-2", "print(x)  # typed meanwhile")
    # A cell moved: an insert is refused too.
    notebook = await place.read("nb.ipynb")
    document.ycells.pop(0)
    new = {"cell_type": "code", "id": "new", "metadata": {}, "source": "y", "outputs": [],
           "execution_count": None}  # fmt: skip
    with pytest.raises(DocumentChanged):
        await place.make("nb.ipynb", notebook, Change("insert", 1, new))
    assert [cell_id for cell_id, _ in in_document(document)] == ["c-2", "c-3"]


async def test_no_room_or_a_room_still_loading_is_no_live_document():
    assert await place_of(None).read("nb.ipynb") is None
    assert await place_of(YNotebook()).read("nb.ipynb") is None


def test_edits_use_the_live_documents_only_where_collaboration_is_on(server, tmp_path):
    said = "notebook edits go to the live documents of open notebooks"
    assert said in server.log_path.read_text()
    off = ServerProcess(
        tmp_path / "home",
        tmp_path / "agentruns.sqlite3",
        config={"YDocExtension": {"disable_rtc": True}},
        collaboration=True,
    ).start()
    try:
        log = off.log_path.read_text()
        assert "jupyter_server_ydoc | extension was successfully loaded" in log
        assert said not in log
    finally:
        off.kill()
