"""An open page makes an agent's edit of the notebook it holds: read from its model, claimed once, saved.

The pages here are real WebSocket clients of a real server (``GET pages``),
answering as JupyterLab's page does: their model is a notebook in memory
(with unsaved changes), a change is claimed, made on it by cell id, and the
model is saved through the contents API.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time

import httpx
import pytest
import websocket
from test_notebook_edits import AGENTS, CELLS, NOTEBOOK, ended, notebook_of, on_disk, save, sources
from test_notebook_edits import submit as submit_run

from jupyter_agentruns.notebook_tools import edits as notebook_edits
from jupyter_agentruns.notebook_tools.pages import PagePlace

from servers import ServerProcess

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("openpages")
    server = ServerProcess(home / "home", home / "agentruns.sqlite3", AGENTS).start()
    (server.home / "work").mkdir(exist_ok=True)
    http = server.client()
    try:
        yield server, http
    finally:
        http.close()
        server.kill()


def pages_url(server) -> str:
    return server.api_url.replace("http://", "ws://") + "pages"


class ScriptedPage:
    """A page holding ``model`` (a notebook) for ``path``, answering the server as JupyterLab's does.

    ``answers``: whether it answers reads; ``claims``: whether it claims
    changes (``"late"``: only after ``late_seconds``); every message it got
    is kept in ``heard``.
    """

    def __init__(self, server, path, model, *, answers=True, claims=True, late_seconds=0.0):
        self.server, self.path, self.model = server, path, copy.deepcopy(model)
        self.answers, self.claims, self.late_seconds = answers, claims, late_seconds
        self.heard: list[dict] = []
        self.saved = 0
        self.socket = websocket.create_connection(
            pages_url(server), header=[f"Authorization: token {server.token}"], timeout=10
        )
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.send({"type": "open", "notebooks": [path]})

    def send(self, message: dict) -> None:
        with self._lock:
            self.socket.send(json.dumps(message))

    def close(self) -> None:
        self.socket.close()
        self._reader.join(5)

    def wait_for(self, kind: str, count: int = 1, seconds: float = 20) -> list[dict]:
        deadline = time.monotonic() + seconds
        while True:
            found = [m for m in self.heard if m["type"] == kind]
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, f"no {kind!r} message: heard {self.heard}"
            time.sleep(0.02)

    def _read(self) -> None:
        while True:
            try:
                message = json.loads(self.socket.recv())
            except (websocket.WebSocketException, OSError, ValueError):
                return
            self.heard.append(message)
            try:
                self._answer(message)
            except (websocket.WebSocketException, OSError):
                return  # the server (or the test) closed the page meanwhile

    def _answer(self, message: dict) -> None:
        if message["type"] == "read" and self.answers:
            self.send({"type": "content", "request": message["request"], "content": self.model})
        elif message["type"] == "make" and self.claims:
            if self.claims == "late":
                time.sleep(self.late_seconds)
            self.send({"type": "claim", "claim": message["claim"]})
            self._pending = message
        elif message["type"] == "claimed":
            ok, reason = self._make(self._pending["change"])
            answer = {"type": "made", "claim": message["claim"], "ok": ok}
            self.send(answer if ok else {**answer, "reason": reason})

    def _make(self, change: dict) -> tuple[bool, str | None]:
        """The change on the model by cell id, checked as the page checks it, then saved."""
        cells = self.model["cells"]
        ids = [cell["id"] for cell in cells]
        if change["kind"] == "insert":
            if change["after"] is not None and change["after"] not in ids:
                return False, "the cell it goes after is gone"
            cells.insert(
                0 if change["after"] is None else ids.index(change["after"]) + 1, change["cell"]
            )
        else:
            cell_id = change["cell"]["id"] if change["kind"] == "replace" else change["cell_id"]
            if (
                cell_id not in ids
                or "".join(cells[ids.index(cell_id)]["source"]) != change["source"]
            ):
                return False, "the cell changed in the page"
            if change["kind"] == "delete":
                del cells[ids.index(cell_id)]
            else:
                cells[ids.index(cell_id)] = change["cell"]
        saved = httpx.put(
            self.server.url + f"api/contents/{self.path}",
            headers={"Authorization": f"token {self.server.token}"},
            json={"type": "notebook", "content": self.model},
        )
        self.saved += 1
        return saved.status_code == 200, None if saved.status_code == 200 else saved.text


def unsaved(cells=CELLS) -> dict:
    """The notebook as the person has it open: c-2 changed and not saved."""
    model = notebook_of(cells)
    model["cells"][1]["source"] = "print(x)  # mine, unsaved"
    return model


def test_an_open_page_gives_its_model_to_read_and_makes_the_edits_on_it(lab):
    server, http = lab
    save(server, http, CELLS)
    page = ScriptedPage(server, NOTEBOOK, unsaved())
    try:
        calls = [
            ["read_notebook", {}],
            ["insert_cell", {"source": "y = 2", "after": "c-1"}],
            ["edit_cell", {"cell_id": "c-3", "source": "# notes"}],
            ["delete_cell", {"cell_id": "c-1"}],
        ]
        run = ended(http, submit_run(http, calls))
        read, inserted, edited, deleted = run["output"]["answers"]
        assert "# mine, unsaved" in read["text"] and "as open now" in read["text"]
        assert inserted["ok"] and edited["ok"] and deleted["ok"], run["output"]
        new_id = inserted["result"]["cell_id"]
        expected = [(new_id, "y = 2"), ("c-2", "print(x)  # mine, unsaved"), ("c-3", "# notes")]
        assert sources(page.model) == expected
        # The page saved its model, the person's unsaved change with the agent's.
        assert sources(on_disk(server)) == expected
        assert page.saved == 3
        assert page.model["cells"][0]["metadata"]["agentruns"]["run_id"] == run["run_id"]
        assert [e["status"] for e in run["snapshot"]["edits"]] == ["applied"] * 3
        assert len(page.wait_for("make", 3)) == 3
    finally:
        page.close()


def test_undo_goes_through_the_page_too(lab):
    server, http = lab
    save(server, http, CELLS)
    page = ScriptedPage(server, NOTEBOOK, unsaved())
    try:
        run = ended(http, submit_run(http, [["insert_cell", {"source": "z = 3", "after": "end"}]]))
        [edit] = run["snapshot"]["edits"]
        undone = http.post(f"runs/{run['run_id']}/edits/{edit['edit_id']}/undo")
        assert undone.status_code == 200, undone.text
        assert sources(page.model) == sources(unsaved())
        assert [m["change"]["kind"] for m in page.wait_for("make", 2)] == ["insert", "delete"]
    finally:
        page.close()


def test_two_pages_holding_the_notebook_make_a_change_once(lab):
    server, http = lab
    save(server, http, CELLS)
    first = ScriptedPage(server, NOTEBOOK, notebook_of(CELLS))
    second = ScriptedPage(server, NOTEBOOK, notebook_of(CELLS))
    try:
        run = ended(http, submit_run(http, [["insert_cell", {"source": "once", "after": "end"}]]))
        assert run["output"]["answers"][0]["ok"], run["output"]
        made = [page for page in (first, second) if page.saved]
        assert len(made) == 1
        other = second if made[0] is first else first
        # Both were offered the change; the one that claimed second was refused.
        other.wait_for("make")
        [refused] = other.wait_for("refused")
        assert refused["error"] == "claim_taken"
        assert [source for _, source in sources(on_disk(server))].count("once") == 1
        assert [source for _, source in sources(other.model)].count("once") == 0
        # Once it was saved, the other page was told to read the notebook again; the maker was not.
        assert other.wait_for("saved") == [{"type": "saved", "notebook": NOTEBOOK}]
        assert not [m for m in made[0].heard if m["type"] == "saved"]
    finally:
        first.close()
        second.close()


def test_a_page_that_does_not_answer_leaves_the_edit_to_the_file(lab):
    server, http = lab
    save(server, http, CELLS)
    page = ScriptedPage(server, NOTEBOOK, unsaved(), answers=False)
    try:
        started = time.monotonic()
        calls = [["read_notebook", {}], ["insert_cell", {"source": "w = 4", "after": "end"}]]
        run = ended(http, submit_run(http, calls))
        read, inserted = run["output"]["answers"]
        assert "as last saved" in read["text"] and "mine, unsaved" not in read["text"]
        assert inserted["ok"]
        assert sources(on_disk(server))[-1] == (inserted["result"]["cell_id"], "w = 4")
        assert time.monotonic() - started >= 3  # each read waited for the page, bounded
        assert page.saved == 0 and not [m for m in page.heard if m["type"] == "make"]
        # Told that the file changed under it, so that it reads it again.
        assert {m["notebook"] for m in page.wait_for("saved")} == {NOTEBOOK}
    finally:
        page.close()


def test_a_page_claiming_after_the_server_gave_up_is_refused_and_changes_nothing(lab):
    server, http = lab
    save(server, http, CELLS)
    before = (server.home / NOTEBOOK).read_text()
    page = ScriptedPage(server, NOTEBOOK, notebook_of(CELLS), claims="late", late_seconds=4)
    try:
        run = ended(http, submit_run(http, [["insert_cell", {"source": "late", "after": "end"}]]))
        [outcome] = run["output"]["answers"]
        assert not outcome["ok"] and "edit_conflict" in outcome["text"]
        assert "page could not be changed" in outcome["text"]
        [refused] = page.wait_for("refused")
        assert refused["error"] == "claim_expired"
        assert page.saved == 0 and sources(page.model) == CELLS
        assert (server.home / NOTEBOOK).read_text() == before
        assert run["snapshot"]["edits"][0]["status"] == "conflict"
    finally:
        page.close()


def test_a_page_that_finds_the_cell_changed_refuses_and_the_edit_is_a_conflict(lab):
    server, http = lab
    save(server, http, CELLS)
    page = ScriptedPage(server, NOTEBOOK, notebook_of(CELLS))
    try:
        # The person types into c-2 between the agent's read and its edit: the page's
        # model no longer holds what the server read (the page refuses, nothing changed).
        original = page._make

        def typed_first(change):
            page.model["cells"][1]["source"] = "print('typed')"
            return original(change)

        page._make = typed_first
        run = ended(http, submit_run(http, [["edit_cell", {"cell_id": "c-2", "source": "agent"}]]))
        [outcome] = run["output"]["answers"]
        assert not outcome["ok"] and "edit_conflict" in outcome["text"]
        assert sources(page.model)[1] == ("c-2", "print('typed')")
        assert page.saved == 0
    finally:
        page.close()


def test_bad_messages_get_a_clear_error_and_change_nothing(lab):
    server, http = lab
    save(server, http, CELLS)
    page = ScriptedPage(server, NOTEBOOK, unsaved())
    try:
        for bad in (
            "not json",
            json.dumps([1, 2]),
            json.dumps({"type": "shout"}),
            json.dumps({"type": "open", "notebooks": "work/edits.ipynb"}),
            json.dumps({"type": "open", "notebooks": [3]}),
            json.dumps({"type": "content", "request": "nope", "content": None}),
            json.dumps({"type": "claim", "claim": "made-up"}),
            json.dumps({"type": "made", "claim": "made-up", "ok": True}),
        ):
            page.socket.send(bad)
        errors = page.wait_for("error", 8)
        assert [e["error"] for e in errors] == [
            "invalid_message", "invalid_message", "invalid_message", "invalid_message",
            "invalid_message", "unknown_request", "claim_expired", "claim_expired",
        ]  # fmt: skip
        assert all(e["message"] for e in errors)
        # Still holding its notebook (the bad 'open' changed nothing): the page is read.
        run = ended(http, submit_run(http, [["read_notebook", {}]]))
        assert "# mine, unsaved" in run["output"]["answers"][0]["text"]
    finally:
        page.close()


def test_a_page_that_closed_counts_no_more(lab):
    server, http = lab
    save(server, http, CELLS)
    page = ScriptedPage(server, NOTEBOOK, unsaved())
    page.close()
    started = time.monotonic()
    run = ended(http, submit_run(http, [["read_notebook", {}]]))
    assert "as last saved" in run["output"]["answers"][0]["text"]
    assert time.monotonic() - started < 3  # not asked at all: no wait for an answer


def test_the_link_needs_an_authenticated_websocket(lab):
    server, http = lab
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(pages_url(server), timeout=10)
    assert refused.value.status_code == 403
    assert json.loads(refused.value.resp_body)["error"] == "forbidden"
    plain = http.get("pages")
    assert plain.status_code == 400 and plain.json()["error"] == "bad_request", plain.text


def test_on_a_hub_users_server_only_that_users_pages_are_linked(tmp_path):
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
        auth = f"Authorization: token {server.token}"
        alice = websocket.create_connection(
            pages_url(server), header=[auth, "X-Test-User: alice"], timeout=10
        )
        bob = websocket.create_connection(
            pages_url(server), header=[auth, "X-Test-User: bob"], timeout=10
        )
        try:
            # Bob's link is closed at once, with the code that tells a page not to come back.
            opcode, frame = bob.recv_data(control_frame=True)
            assert opcode == websocket.ABNF.OPCODE_CLOSE
            assert int.from_bytes(frame[:2], "big") == 4004
            assert b"not available for you" in frame[2:]
            alice.send(json.dumps({"type": "open", "notebooks": ["a.ipynb"]}))
            alice.send(json.dumps({"type": "shout"}))
            assert json.loads(alice.recv())["error"] == "invalid_message"  # linked, listening
        finally:
            alice.close()
            bob.close()
    finally:
        server.kill()


def test_a_page_answering_with_something_not_a_notebook_is_told_and_the_file_is_read(lab):
    server, http = lab
    save(server, http, CELLS)
    broken = unsaved()
    broken["cells"][0]["source"] = 5
    page = ScriptedPage(server, NOTEBOOK, broken)
    try:
        run = ended(http, submit_run(http, [["read_notebook", {}]]))
        assert "as last saved" in run["output"]["answers"][0]["text"]
        [error] = page.wait_for("error")
        assert error["error"] == "invalid_message" and "nbformat" in error["message"]
    finally:
        page.close()


def test_a_claim_that_comes_after_another_page_made_the_change_is_told_it_was_taken():
    """The place on its own: the refusal names why, whenever the second claim comes."""

    async def scenario():
        place = PagePlace(read_seconds=1, claim_seconds=1, make_seconds=1)
        heard = {"first": [], "second": []}
        first = place.connect(heard["first"].append)
        second = place.connect(heard["second"].append)
        for page in (first, second):
            place.receive(page, {"type": "open", "notebooks": ["a.ipynb"]})
        reading = asyncio.ensure_future(place.read("a.ipynb"))
        await asyncio.sleep(0)
        request = heard["first"][0]["request"]
        place.receive(first, {"type": "content", "request": request, "content": notebook_of(CELLS)})
        notebook = await reading
        change = notebook_edits.apply(
            notebook,
            {"edit_id": "ed_1", "op": "insert", "position": "end", "cell_id": "n", "after": "z"},
            "run_1",
        )
        making = asyncio.ensure_future(place.make("a.ipynb", notebook, change))
        await asyncio.sleep(0)
        [offer] = [m for m in heard["first"] if m["type"] == "make"]
        assert offer["change"]["after"] == "c-3" and offer["change"]["cell"]["id"] == "n"
        place.receive(first, {"type": "claim", "claim": offer["claim"]})
        place.receive(first, {"type": "made", "claim": offer["claim"], "ok": True})
        await making
        place.receive(second, {"type": "claim", "claim": offer["claim"]})
        assert heard["second"][-1]["error"] == "claim_taken"
        # The page that made it is the one asked next, alone.
        assert place.holding("a.ipynb") == [first]
        place.disconnect(first)
        assert place.holding("a.ipynb") == [second]

    asyncio.run(scenario())
