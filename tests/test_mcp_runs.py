"""The run tools of the MCP endpoint, called with the MCP SDK's own client over loopback.

One server for the module, where two people work (``X-Test-User``): the
notebook tools are not theirs there (a server several people share), the
run tools are.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager

import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from servers import ServerProcess

ALICE = "alice"
BOB = "bob"
RUN_TOOLS = {"start_run", "get_run", "answer_run", "cancel_run"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("mcpruns")
    server = ServerProcess(
        home / "home",
        home / "agentruns.sqlite3",
        {"owner_mode": "per-user", "agents": {"asker": "agents_for_tests:asker"}},
        config={"ServerApp": {"identity_provider_class": "identity.HeaderIdentityProvider"}},
    ).start()
    try:
        yield server
    finally:
        server.kill()


class Tools:
    """An MCP client session of one person: ``await tools("get_run", run_id=...)``."""

    def __init__(self, session: ClientSession):
        self.session = session

    async def __call__(self, name: str, **arguments):
        """The tool's JSON answer; a tool error is ``{"error", "message"}`` with ``failed``."""
        result = await self.session.call_tool(name, arguments)
        answer = json.loads(result.content[0].text)
        assert result.structured_content == answer
        if result.is_error:
            answer["failed"] = True
        return answer

    async def until(self, run_id: str, done, timeout: float = 30) -> dict:
        """get_run until ``done(run)``; returns that run."""
        deadline = time.monotonic() + timeout
        while True:
            run = await self("get_run", run_id=run_id)
            if done(run):
                return run
            assert time.monotonic() < deadline, run
            await asyncio.sleep(0.05)


@asynccontextmanager
async def person(server, user: str):
    headers = {"Authorization": f"token {server.token}", "X-Test-User": user}
    client = create_mcp_http_client(headers=headers)
    url = server.url + "api/agentruns/mcp"
    async with client, streamable_http_client(url, http_client=client) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            yield Tools(session)


def demo(**overrides):
    return {"prompt": "weather in Shanghai", "chunks": 20, "delay": 0, **overrides}


def test_a_person_starts_a_run_and_follows_it_to_its_text(server):
    async def main():
        async with person(server, ALICE) as tools:
            listed = {tool.name for tool in (await tools.session.list_tools()).tools}
            # The notebook tools are not the people's on a server they share; the run tools are.
            assert listed == RUN_TOOLS
            started = await tools("start_run", agent="demo", input=demo(), session="s-follow")
            assert started["status"] in ("queued", "running") and started["replayed"] is False
            assert started["url"] == f"{server.api_url}runs/{started['run_id']}"
            assert started["page_url"] == f"{server.url}lab?agentruns-run={started['run_id']}"
            run = await tools.until(started["run_id"], lambda run: run["ended"])
            # The text so far, then only what came after a seq, in pages.
            head = await tools("get_run", run_id=started["run_id"], after_seq=0)
            tail = await tools("get_run", run_id=started["run_id"], after_seq=run["last_seq"])
            return started, run, head, tail

    started, run, head, tail = asyncio.run(main())
    with server.client() as http:
        stored = http.get(f"runs/{started['run_id']}", headers={"X-Test-User": ALICE}).json()
    assert run["status"] == "succeeded" and run["error"] is None
    assert run["session"] == "s-follow" and run["questions"] == []
    assert run["text"] == stored["snapshot"]["messages"][0]["text"] and "Shanghai" in run["text"]
    assert run["output"] == stored["output"] and run["last_seq"] == stored["last_seq"]
    assert head["text"] == run["text"] and head["next_after_seq"] == run["last_seq"]
    assert tail["text"] == "" and tail["next_after_seq"] == run["last_seq"]


def test_starting_twice_with_one_key_makes_one_run(server):
    async def main():
        async with person(server, ALICE) as tools:
            first = await tools("start_run", agent="demo", input=demo(), idempotency_key="k-1")
            again = await tools("start_run", agent="demo", input=demo(), idempotency_key="k-1")
            other = await tools(
                "start_run", agent="demo", input=demo(chunks=3), idempotency_key="k-1"
            )
            return first, again, other

    first, again, other = asyncio.run(main())
    assert again["run_id"] == first["run_id"] and again["replayed"] is True
    assert other["failed"] and other["error"] == "idempotency_key_reused", other
    with server.client() as http:
        listed = http.get("runs", params={"limit": 500}, headers={"X-Test-User": ALICE}).json()
    assert [run["run_id"] for run in listed["runs"]].count(first["run_id"]) == 1


def test_a_question_waits_for_answer_run(server):
    async def main():
        async with person(server, ALICE) as tools:
            started = await tools("start_run", agent="asker", input={})
            waiting = await tools.until(started["run_id"], lambda run: run["questions"])
            wrong = await tools(
                "answer_run",
                run_id=started["run_id"],
                request_id=waiting["questions"][0]["request_id"],
                choice="maybe",
            )
            answered = await tools(
                "answer_run",
                run_id=started["run_id"],
                request_id=waiting["questions"][0]["request_id"],
                choice="approve",
                note="go ahead",
            )
            done = await tools.until(started["run_id"], lambda run: run["ended"])
            return waiting, wrong, answered, done

    waiting, wrong, answered, done = asyncio.run(main())
    assert waiting["status"] == "waiting"
    assert waiting["questions"] == [
        {
            "request_id": waiting["questions"][0]["request_id"],
            "kind": "approval",
            "title": "Go on?",
            "details": None,
            "choices": ["approve", "deny"],
        }
    ]
    assert wrong["failed"] and wrong["error"] == "invalid_choice", wrong
    assert answered["questions"] == []
    assert done["status"] == "succeeded" and done["output"] == {"answers": ["approve"]}
    assert "Go on? approve" in done["text"]


def test_cancel_run_cancels_a_run_going_on(server):
    async def main():
        async with person(server, ALICE) as tools:
            started = await tools("start_run", agent="demo", input=demo(chunks=600, delay=0.05))
            await tools.until(started["run_id"], lambda run: run["status"] == "running")
            cancelled = await tools("cancel_run", run_id=started["run_id"], reason="enough")
            done = await tools.until(started["run_id"], lambda run: run["ended"])
            again = await tools("cancel_run", run_id=started["run_id"])
            return cancelled, done, again

    cancelled, done, again = asyncio.run(main())
    assert cancelled["cancelling_started"] is True
    assert cancelled["status"] in ("cancelling", "cancelled")
    assert done["status"] == "cancelled"
    assert again["cancelling_started"] is False and again["status"] == "cancelled"


def test_another_persons_run_is_not_found_and_bad_calls_say_why(server):
    async def main():
        async with person(server, ALICE) as alice:
            started = await alice("start_run", agent="asker", input={})
            await alice.until(started["run_id"], lambda run: run["questions"])
            async with person(server, BOB) as bob:
                run_id = started["run_id"]
                seen = [
                    await bob("get_run", run_id=run_id),
                    await bob("answer_run", run_id=run_id, request_id="x", choice="approve"),
                    await bob("cancel_run", run_id=run_id),
                ]
                bad = [
                    await bob("start_run", agent="nobody", input={}),
                    await bob("get_run", run_id=run_id, after_seq=-1),
                    await bob("start_run", agent="demo", input={}, colour="red"),
                    await bob("run_code", notebook="a.ipynb", code="1"),
                ]
            still = await alice("cancel_run", run_id=run_id)
            return seen, bad, still

    seen, bad, still = asyncio.run(main())
    for answer in seen:
        assert answer["failed"] and answer["error"] == "run_not_found", answer
        assert "No run" in answer["message"]
    assert [answer.get("error") for answer in bad[:3]] == [
        "unknown_agent", "invalid_request", "invalid_request",
    ]  # fmt: skip
    assert "colour" in bad[2]["message"]
    assert bad[3]["error"] == "notebook_tools_unavailable", bad[3]
    assert "kernels may be other people's" in bad[3]["message"]
    assert still["cancelling_started"] is True  # bob's calls changed nothing


def test_a_long_text_comes_bounded_and_after_seq_pages_through_it_whole(server):
    async def main():
        async with person(server, ALICE) as tools:
            started = await tools("start_run", agent="demo", input=demo(chunks=6000))
            run = await tools.until(started["run_id"], lambda run: run["ended"])
            pages, after = [], 0
            while after < run["last_seq"]:
                page = await tools("get_run", run_id=started["run_id"], after_seq=after)
                assert page["next_after_seq"] > after
                pages.append(page["text"])
                after = page["next_after_seq"]
            ahead = await tools("get_run", run_id=started["run_id"], after_seq=run["last_seq"] + 1)
            return run, pages, ahead

    run, pages, ahead = asyncio.run(main())
    with server.client() as http:
        stored = http.get(f"runs/{run['run_id']}", headers={"X-Test-User": ALICE}).json()
    whole = stored["snapshot"]["messages"][0]["text"]
    assert len(whole) > 30_000 and run["status"] == "succeeded"
    assert run["text"] == whole[-20_000:] and run["text_omitted"] == len(whole) - 20_000
    assert len(pages) >= 2 and all(len(page) <= 20_000 for page in pages)
    assert "".join(pages) == whole
    assert ahead["error"] == "cursor_ahead", ahead
