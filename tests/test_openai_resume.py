"""The openai agent resumed after its Jupyter server was killed: no completed step paid twice.

Real server processes (killed with SIGKILL) on either store, and the fake
OpenAI-compatible server in this process, which records every request it
gets: a completed model call is never asked again, an interrupted one at
most once more, and a tool call that may have taken effect is not repeated
unless it is declared idempotent.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest

from fake_openai import answer, tool_calls
from servers import TLS, ServerProcess

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}
MCP_SERVER = str(Path(__file__).with_name("mcp_server_for_tests.py"))
TOOLS = {name: f"tools_for_tests:{name}" for name in ("add", "slow_note", "lookup")}


@pytest.fixture
def servers(tmp_path, store_config, fake):
    started = []

    async def start(name, notebook_tools=False, agentruns=None, **env):
        config = {"OpenAIAgent": {"base_url": fake.url, "model": "fake-model", "tools": TOOLS,
                                  "max_retries": 0, "notebook_tools": notebook_tools}}  # fmt: skip
        agentruns = {"lease_seconds": 1.5, **store_config, **(agentruns or {})}
        server = ServerProcess(tmp_path / name, tmp_path / "agentruns.sqlite3", agentruns,
                               config=config)  # fmt: skip
        server.env.update(env)
        started.append(server)
        # Started off the event loop: the fake model server in it must go on answering.
        await asyncio.to_thread(server.start)
        return server

    yield start
    for server in started:
        server.kill()


def client(server):
    return httpx.AsyncClient(
        base_url=server.api_url,
        headers={"Authorization": f"token {server.token}"},
        timeout=30,
        verify=TLS,
    )


async def until(api, run_id, predicate, what, timeout=30):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        run = (await api.get(f"runs/{run_id}")).json()
        if predicate(run):
            return run
        assert loop.time() < deadline, f"{run_id}: {what}, but it is {run['status']}"
        await asyncio.sleep(0.05)


async def events_of(api, run_id):
    body = (await api.get(f"runs/{run_id}/events", params={"limit": 1000})).json()
    return body["events"]


def chat_requests(fake):
    return [r["body"] for r in fake.requests if r["path"].endswith("/chat/completions")]


@pytest.mark.timeout(120)
async def test_killed_in_the_middle_of_a_streamed_answer_it_asks_only_that_call_again(
    servers, fake
):
    fake.reply(
        tool_calls(("add", '{"a": 2, "b": 3}')),
        answer("The sum", " is", hold=True),  # the server dies while this one streams
        answer("The sum is 5."),
    )
    first = await servers("a")
    async with client(first) as api:
        run = (await api.post("runs", json={"agent": "openai", "input": {"prompt": "2+3?"}})).json()
        await until(api, run["run_id"], lambda r: len(r["snapshot"]["messages"]) == 1
                    and r["snapshot"]["messages"][0]["text"] == "The sum is", "streams its answer")  # fmt: skip
    first.kill()

    second = await servers("b")
    async with client(second) as api:
        ended = await until(api, run["run_id"], lambda r: r["status"] in TERMINAL, "ends")
        assert ended["status"] == "succeeded", ended["error"]
        assert ended["attempt"] == 2
        assert ended["output"]["text"] == "The sum is 5."
        events = await events_of(api, run["run_id"])
    assert [e["seq"] for e in events] == list(range(1, ended["last_seq"] + 1))
    types = [e["type"] for e in events]
    assert types.count("tool.started") == types.count("tool.completed") == 1  # add ran once
    assert types.count("run.resumed") == 1 and types[-1] == "run.succeeded"
    # The interrupted answer is closed as it was; the new one is a message of its own.
    assert [(m["text"], m["done"]) for m in ended["snapshot"]["messages"]] == [
        ("The sum is", True),
        ("The sum is 5.", True),
    ]
    asked = chat_requests(fake)
    assert len(asked) == 3  # the tool call once, the interrupted answer twice
    assert asked[1]["messages"] == asked[2]["messages"]
    assert asked[2]["messages"][-1]["role"] == "tool" and asked[2]["messages"][-1]["content"] == "5"


@pytest.mark.sqlite_only  # what it tests is above the store
@pytest.mark.timeout(120)
async def test_a_tool_call_its_server_died_in_is_not_repeated_and_the_model_is_told(servers, fake):
    fake.reply(tool_calls(("slow_note", '{"text": "hello"}')), answer("I could not note it."))
    first = await servers("a")
    async with client(first) as api:
        run = (await api.post("runs", json={"agent": "openai", "input": {"prompt": "note"}})).json()
        await until(api, run["run_id"], lambda r: [t["status"] for t in r["snapshot"]["tools"]]
                    == ["running"], "calls the tool")  # fmt: skip
    first.kill()

    second = await servers("b")
    async with client(second) as api:
        ended = await until(api, run["run_id"], lambda r: r["status"] in TERMINAL, "ends")
        assert ended["status"] == "succeeded", ended["error"]
        [call] = ended["snapshot"]["tools"]
        assert call["status"] == "failed" and call["error"]["type"] == "interrupted"
        types = [e["type"] for e in await events_of(api, run["run_id"])]
    assert types.count("tool.started") == 1  # never started again
    asked = chat_requests(fake)
    assert len(asked) == 2
    told = asked[1]["messages"][-1]
    assert told["role"] == "tool" and told["content"].startswith("Error: interrupted:")
    assert "not repeated" in told["content"]


@pytest.mark.sqlite_only  # what it tests is above the store
@pytest.mark.timeout(120)
@pytest.mark.parametrize("choice", ["run_again", "skip", "stop"])
async def test_with_in_doubt_ask_a_person_settles_a_tool_call_its_server_died_in(
    servers, fake, tmp_path, choice
):
    """The question comes before the agent goes on; each answer's effect is what the tool did."""
    fake.reply(tool_calls(("slow_note", '{"text": "hello"}')), answer("Settled."))
    notes = tmp_path / "notes.txt"
    config = {"in_doubt": "ask"}
    first = await servers("a", agentruns=config, AGENTRUNS_TEST_NOTES=str(notes))
    async with client(first) as api:
        run = (await api.post("runs", json={"agent": "openai", "input": {"prompt": "note"}})).json()
        await until(api, run["run_id"], lambda r: [t["status"] for t in r["snapshot"]["tools"]]
                    == ["running"], "calls the tool")  # fmt: skip
    first.kill()

    second = await servers(
        "b", agentruns=config, AGENTRUNS_TEST_NOTES=str(notes), AGENTRUNS_TEST_NOTE_SECONDS="0"
    )
    async with client(second) as api:
        waiting = await until(api, run["run_id"], lambda r: r["status"] == "waiting", "asks")
        [question] = waiting["snapshot"]["inputs"]
        assert question["kind"] == "in_doubt"
        assert question["choices"] == ["run_again", "skip", "stop"]
        assert question["details"] == {"call_id": "c1", "tool": "slow_note",
                                       "args": {"text": "hello"}}  # fmt: skip
        assert "slow_note" in question["title"]
        assert not notes.exists()  # nothing made again before the answer
        assert len(chat_requests(fake)) == 1  # nor the model asked
        answered = await api.post(
            f"runs/{run['run_id']}/inputs/{question['request_id']}", json={"choice": choice}
        )
        assert answered.status_code == 200, answered.text
        ended = await until(api, run["run_id"], lambda r: r["status"] in TERMINAL, "ends")
        [call] = ended["snapshot"]["tools"]
        types = [e["type"] for e in await events_of(api, run["run_id"])]
    assert types.count("tool.started") == 1 and types.count("tool.completed") == 1
    asked = chat_requests(fake)
    if choice == "run_again":
        assert notes.read_text() == "hello\n"  # made once, on the second server
        assert ended["status"] == "succeeded" and call["result"] == "noted: hello"
        assert asked[1]["messages"][-1]["content"] == "noted: hello"
    elif choice == "skip":
        assert not notes.exists()
        assert ended["status"] == "succeeded" and call["error"]["type"] == "skipped"
        assert asked[1]["messages"][-1]["content"].startswith("Error: skipped:")
    else:
        assert not notes.exists() and len(asked) == 1
        assert ended["status"] == "failed" and ended["error"]["type"] == "stopped_in_doubt"
        assert call["error"]["type"] == "stopped"


@pytest.mark.sqlite_only  # what it tests is above the store
@pytest.mark.timeout(120)
async def test_an_mcp_servers_tool_call_its_server_died_in_is_not_repeated(servers, fake):
    fake.reply(tool_calls(("tests__wait", '{"seconds": 30}')), answer("It did not wait."))
    mcp = {"mcp_servers": {"tests": {"command": [sys.executable, MCP_SERVER]}}}
    first = await servers("a", agentruns=mcp)
    async with client(first) as api:
        run = (await api.post("runs", json={"agent": "openai", "input": {"prompt": "wait"}})).json()
        await until(api, run["run_id"], lambda r: [t["status"] for t in r["snapshot"]["tools"]]
                    == ["running"], "calls the tool")  # fmt: skip
    first.kill()

    second = await servers("b", agentruns=mcp)
    async with client(second) as api:
        ended = await until(api, run["run_id"], lambda r: r["status"] in TERMINAL, "ends")
        assert ended["status"] == "succeeded", ended["error"]
        [call] = ended["snapshot"]["tools"]
        assert call["name"] == "tests__wait"
        assert call["status"] == "failed" and call["error"]["type"] == "interrupted"
    asked = chat_requests(fake)
    assert len(asked) == 2
    # The resumed run listed the server's tools again and offered them.
    assert "tests__wait" in [tool["function"]["name"] for tool in asked[1]["tools"]]
    told = asked[1]["messages"][-1]
    assert told["role"] == "tool" and told["content"].startswith("Error: interrupted:")


@pytest.mark.sqlite_only  # what it tests is above the store
@pytest.mark.timeout(120)
async def test_an_idempotent_tool_call_its_server_died_in_is_made_again(servers, fake):
    fake.reply(tool_calls(("lookup", '{"key": "k"}')), answer("k is known."))
    first = await servers("a", AGENTRUNS_TEST_LOOKUP_SECONDS="30")
    async with client(first) as api:
        run = (await api.post("runs", json={"agent": "openai", "input": {"prompt": "k?"}})).json()
        await until(api, run["run_id"], lambda r: [t["status"] for t in r["snapshot"]["tools"]]
                    == ["running"], "calls the tool")  # fmt: skip
    first.kill()

    second = await servers("b")
    async with client(second) as api:
        ended = await until(api, run["run_id"], lambda r: r["status"] in TERMINAL, "ends")
        assert ended["status"] == "succeeded", ended["error"]
        [call] = ended["snapshot"]["tools"]
        assert call["status"] == "completed" and call["result"] == "value of k"
    asked = chat_requests(fake)
    assert len(asked) == 2
    assert asked[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_fake_0",
        "content": "value of k",
    }
    assert json.loads(asked[1]["messages"][-2]["tool_calls"][0]["function"]["arguments"]) == {
        "key": "k"
    }


@pytest.mark.sqlite_only  # what it tests is above the store
@pytest.mark.timeout(120)
async def test_a_run_code_its_server_died_in_is_reported_interrupted_not_run_again(servers, fake):
    code = "import time\nfor _ in range(600): time.sleep(0.1)"
    fake.reply(tool_calls(("run_code", json.dumps({"code": code}))), answer("It was cut short."))
    config = {"notebook_tools_approval": "never"}
    first = await servers("a", notebook_tools=True, agentruns=config)
    async with client(first) as api:
        session = await api.post(
            first.url + "api/sessions",
            json={"path": "a.ipynb", "type": "notebook", "name": "a.ipynb",
                  "kernel": {"name": "python3"}},
        )  # fmt: skip
        kernel_id = session.json()["kernel"]["id"]
        body = {
            "agent": "openai",
            "input": {"prompt": "wait"},
            "metadata": {"kernel_id": kernel_id},
        }
        run = (await api.post("runs", json=body)).json()
        await until(api, run["run_id"], lambda r: [t["status"] for t in r["snapshot"]["tools"]]
                    == ["running"], "runs the code")  # fmt: skip
    first.kill()

    second = await servers("b", notebook_tools=True, agentruns=config)
    async with client(second) as api:
        ended = await until(api, run["run_id"], lambda r: r["status"] in TERMINAL, "ends")
        assert ended["status"] == "succeeded", ended["error"]
        [call] = ended["snapshot"]["tools"]
        assert call["name"] == "run_code" and call["error"]["type"] == "interrupted"
        types = [e["type"] for e in await events_of(api, run["run_id"])]
    assert types.count("tool.started") == 1  # never run again
    asked = chat_requests(fake)
    assert {t["function"]["name"] for t in asked[0]["tools"]} >= {"run_code", "list_variables"}
    told = asked[1]["messages"][-1]
    assert told["role"] == "tool" and told["content"].startswith("Error: interrupted:")
    assert "not repeated" in told["content"]


@pytest.mark.sqlite_only  # what it tests is above the store
@pytest.mark.timeout(150)
@pytest.mark.parametrize("choice", ["run_again", "skip"])
async def test_a_run_code_cut_by_a_kill_is_run_again_in_the_notebooks_kernel_or_skipped_as_asked(
    servers, fake, tmp_path, choice
):
    """With in_doubt = "ask": the kernel the code ran in went with its server; run again, the
    code runs in the kernel the notebook has on the server that took the run over."""
    mark = tmp_path / "ran-once"
    code = (
        f"import os, time\nif not os.path.exists({str(mark)!r}):\n"
        f"    open({str(mark)!r}, 'w').close()\n    time.sleep(60)\nwhere = 'second kernel'\n"
        "print(where)"
    )
    fake.reply(tool_calls(("run_code", json.dumps({"code": code}))), answer("Done."))
    config = {"notebook_tools_approval": "never", "in_doubt": "ask"}

    async def open_notebook(server, api) -> str:
        (server.home / "a.ipynb").write_text(json.dumps(
            {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))  # fmt: skip
        session = await api.post(
            server.url + "api/sessions",
            json={"path": "a.ipynb", "type": "notebook", "name": "a.ipynb",
                  "kernel": {"name": "python3"}},
        )  # fmt: skip
        return session.json()["kernel"]["id"]

    first = await servers("a", notebook_tools=True, agentruns=config)
    async with client(first) as api:
        body = {
            "agent": "openai",
            "input": {"prompt": "run it"},
            "session": "a.ipynb",
            "metadata": {"kernel_id": await open_notebook(first, api)},
        }
        run = (await api.post("runs", json=body)).json()
        await until(api, run["run_id"], lambda r: mark.exists(), "runs the code")
    first.kill()

    second = await servers("b", notebook_tools=True, agentruns=config)
    async with client(second) as api:
        await open_notebook(second, api)
        waiting = await until(api, run["run_id"], lambda r: r["status"] == "waiting", "asks")
        [question] = waiting["snapshot"]["inputs"]
        assert question["kind"] == "in_doubt" and question["details"]["tool"] == "run_code"
        assert question["details"]["args"] == {"code": code}
        answered = await api.post(
            f"runs/{run['run_id']}/inputs/{question['request_id']}", json={"choice": choice}
        )
        assert answered.status_code == 200, answered.text
        ended = await until(api, run["run_id"], lambda r: r["status"] in TERMINAL, "ends")
    assert ended["status"] == "succeeded", ended["error"]
    [call] = ended["snapshot"]["tools"]
    told = chat_requests(fake)[1]["messages"][-1]["content"]
    if choice == "run_again":
        assert call["status"] == "completed", call.get("error")
        assert "second kernel" in told
    else:
        assert call["status"] == "failed" and call["error"]["type"] == "skipped"
        assert told.startswith("Error: skipped:")


@pytest.mark.sqlite_only  # what it tests is above the store
@pytest.mark.timeout(120)
async def test_killed_between_its_notebook_edits_it_goes_on_and_each_cell_is_there_once(
    servers, fake
):
    """The openai agent inserts three cells; its server is SIGKILLed as the model is asked for
    the third (two edits made): the server that takes the run over goes on from there."""
    sources = ["a = 1", "b = 2", "c = 3"]
    inserts = [
        tool_calls(("insert_cell", json.dumps({"source": source, "after": "end"})))
        for source in sources
    ]
    # The third insert twice: the first one goes to the server that dies as it is asked.
    fake.reply(*inserts, inserts[2], answer("Three cells."))
    first = await servers("a", notebook_tools=True)
    notebook = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (first.home / "a.ipynb").write_text(json.dumps(notebook))

    def kill_at_the_third_question(request):
        if request["path"].endswith("/chat/completions") and len(chat_requests(fake)) == 3:
            first.kill()

    fake.on_request = kill_at_the_third_question
    async with client(first) as api:
        body = {"agent": "openai", "input": {"prompt": "three cells"}, "session": "a.ipynb",
                "metadata": {"kernel_id": "no-kernel"}}  # fmt: skip
        run = (await api.post("runs", json=body)).json()
    await asyncio.to_thread(first.process.wait, 30)
    fake.on_request = None
    saved = json.loads((first.home / "a.ipynb").read_text())
    assert ["".join(cell["source"]) for cell in saved["cells"]] == sources[:2]

    second = await servers("a", notebook_tools=True)  # started again, on the same files
    async with client(second) as api:
        ended = await until(api, run["run_id"], lambda r: r["status"] in TERMINAL, "ends", 60)
    assert ended["status"] == "succeeded", ended["error"]
    assert ended["attempt"] == 2
    cells = json.loads((second.home / "a.ipynb").read_text())["cells"]
    assert ["".join(cell["source"]) for cell in cells] == sources  # each once, in order
    edits = ended["snapshot"]["edits"]
    assert [(edit["after"], edit["status"]) for edit in edits] == [(s, "applied") for s in sources]
    assert [cell["id"] for cell in cells] == [edit["cell_id"] for edit in edits]
    assert len(chat_requests(fake)) == 5  # the third question asked again, nothing else
