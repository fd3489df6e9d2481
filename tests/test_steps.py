"""A tool step a person approves: asked once, recorded, made once, across a resume too.

The guide's example agent (docs/how-to/write-an-agent.md) runs in a real
server as written; the resume rules of ``tool_step`` are checked on a run
object that records what it is asked to do.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import pytest

from jupyter_agentruns.agents.steps import Approval, Ended, ask_once, tool_step

from conftest import all_events, submit, wait_run, waiting
from servers import ServerProcess, wait_status

GUIDE = Path(__file__).parent.parent / "docs" / "how-to" / "write-an-agent.md"
AGENTS = {"agents": {"mailer": "approved_agents:mailer"}}
DENIED = "a person denied this mail (they chose 'deny'); it was not run"


def guide_agents() -> str:
    """The guide's ``approved_agents.py``, as written."""
    text = GUIDE.read_text()
    return re.search(r"```python\n(# approved_agents\.py\n.*?)```", text, re.S).group(1)


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """A folder with the guide's module, importable here (and by a server started with it)."""
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "approved_agents.py").write_text(guide_agents())
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop("approved_agents", None)


@pytest.fixture
def agentruns_config(modules):
    return AGENTS


def taken_over(client, run_id, timeout=60):
    """The run once another server took it over and it waits for a person again."""
    deadline = time.monotonic() + timeout
    while True:
        run = client.get(f"runs/{run_id}").json()
        if run["attempt"] >= 2 and run["status"] == "waiting":
            return run
        assert time.monotonic() < deadline, f"{run_id} is {run['status']}, attempt {run['attempt']}"
        time.sleep(0.05)


async def answer(api, run_id, choice):
    run = await waiting(api, run_id)
    [question] = run["snapshot"]["inputs"]
    response = await api.post(
        f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": choice}
    )
    assert response.status_code == 200, response.text
    return question


async def test_the_guides_refused_step_is_recorded_denied_and_never_made(api, tmp_path):
    outbox = tmp_path / "outbox.txt"
    response = await submit(api, agent="mailer", input={"to": "ada", "outbox": str(outbox)})
    run_id = response.json()["run_id"]
    question = await answer(api, run_id, "deny")
    assert question["title"] == "Send a mail to ada?" and question["kind"] == "approval"
    assert question["details"] == {"to": "ada"} and question["choices"] == ["approve", "deny"]
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded"
    assert run["output"] == {"sent": False, "text": f"Error: denied: {DENIED}"}
    assert not outbox.exists()
    [step] = run["snapshot"]["tools"]
    assert step["status"] == "failed" and step["error"] == {"type": "denied", "message": DENIED}
    types = [e["type"] for e in await all_events(api, run_id)]
    assert types == ["run.started", "input.requested", "input.resolved", "tool.started",
                     "tool.completed", "run.succeeded"]  # fmt: skip


async def test_the_guides_approved_step_is_made_once(api, tmp_path):
    outbox = tmp_path / "outbox.txt"
    response = await submit(api, agent="mailer", input={"to": "ada", "outbox": str(outbox)})
    run_id = response.json()["run_id"]
    await answer(api, run_id, "approve")
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded"
    assert run["output"] == {"sent": True, "text": "sent to ada"}
    assert outbox.read_text() == "To: ada\n"
    [step] = run["snapshot"]["tools"]
    assert step["status"] == "completed" and step["result"] == "sent to ada"


@pytest.mark.timeout(120)
def test_across_a_kill_the_guides_question_is_asked_once_and_its_step_made_once(
    tmp_path, store_config, modules
):
    outbox = tmp_path / "outbox.txt"
    started = []

    def server(name):
        made = ServerProcess(
            tmp_path / name, tmp_path / "agentruns.sqlite3",
            {"lease_seconds": 1.5, **store_config, **AGENTS},
        )  # fmt: skip
        made.env["PYTHONPATH"] = os.pathsep.join([str(modules), made.env["PYTHONPATH"]])
        started.append(made)
        return made.start()

    try:
        first = server("a")
        with first.client() as client:
            input = {"to": "ada", "outbox": str(outbox)}
            run = client.post("runs", json={"agent": "mailer", "input": input}).json()
            asked = wait_status(client, run["run_id"], {"waiting"})["snapshot"]["inputs"]
        first.kill()
        with server("b").client() as client:
            resumed = taken_over(client, run["run_id"])
            assert resumed["snapshot"]["inputs"] == asked  # the same question, not a second
            client.post(
                f"runs/{run['run_id']}/inputs/{asked[0]['request_id']}", json={"choice": "approve"}
            ).raise_for_status()
            ended = wait_status(client, run["run_id"], {"succeeded", "failed"})
        assert ended["status"] == "succeeded", ended["error"]
        assert ended["output"] == {"sent": True, "text": "sent to ada"}
        assert outbox.read_text() == "To: ada\n"  # made once
        assert len(ended["snapshot"]["inputs"]) == 1 and len(ended["snapshot"]["tools"]) == 1
    finally:
        for made in started:
            made.kill()


# The resume rules, on a run that records what it is asked ---------------------


class RecordingRun:
    """The few ``run`` methods a step uses, recording each call."""

    cancelled = False

    def __init__(self, answers=None):
        self.calls: list[tuple] = []
        self.answers = answers or {}

    async def ask(self, title, details=None, choices=(), kind="approval"):
        self.calls.append(("ask", title))
        return "approve"

    async def answer_to(self, request_id):
        self.calls.append(("answer_to", request_id))
        if request_id not in self.answers:
            raise TimeoutError(f"the question {request_id!r} was closed unanswered")
        return self.answers[request_id]

    async def tool_started(self, name, args, kind=None, title=None):
        self.calls.append(("tool_started", name))
        return "c9"

    async def tool_completed(self, call_id, result=None, *, ok=True, error=None, content=None):
        self.calls.append(("tool_completed", call_id, ok, error if not ok else result))

    async def durable(self):
        self.calls.append(("durable",))


def counting():
    made = []

    async def act():
        made.append(1)
        return {"n": len(made)}

    return made, act


async def test_a_step_an_earlier_attempt_ended_is_not_made_again():
    run, (made, act) = RecordingRun(), counting()
    done = {"call_id": "c1", "status": "completed", "result": {"n": 1}}
    assert await tool_step(run, "count", {}, act, earlier=done) == Ended(True, '{"n": 1}', {"n": 1})
    error = {"type": "denied", "message": "no"}
    failed = {"call_id": "c2", "status": "failed", "error": error}
    ended = await tool_step(run, "count", {}, act, earlier=failed, idempotent=True)
    assert ended == Ended(False, "Error: denied: no", error=error)
    assert made == [] and run.calls == []


async def test_a_step_its_server_died_in_is_made_again_only_when_idempotent():
    run, (made, act) = RecordingRun(), counting()
    running = {"call_id": "c1", "status": "running", "args": {}}
    ended = await tool_step(run, "count", {}, act, earlier=running)
    assert not ended.ok and ended.error["type"] == "interrupted" and made == []
    assert run.calls == [("tool_completed", "c1", False, ended.error)]
    run = RecordingRun()
    ended = await tool_step(run, "count", {}, act, earlier=running, idempotent=True)
    assert ended == Ended(True, '{"n": 1}', {"n": 1}) and made == [1]
    assert run.calls == [("tool_completed", "c1", True, {"n": 1})]  # the same step, ended


async def test_an_approval_asked_by_an_earlier_attempt_is_not_asked_again():
    approval = Approval("Count?", refused="this count")
    run, (made, act) = RecordingRun({"in_1": "deny"}), counting()
    open_question = {"request_id": "in_1", "status": "open"}
    ended = await tool_step(run, "count", {}, act, approval=approval, asked=open_question)
    assert ended.error == {
        "type": "denied",
        "message": "a person denied this count (they chose 'deny'); it was not run",
    }
    assert made == [] and ("ask", "Count?") not in run.calls
    run = RecordingRun()
    closed = {"request_id": "in_2", "status": "resolved", "choice": None}
    ended = await tool_step(run, "count", {}, act, approval=approval, asked=closed)
    assert "they chose 'unanswered'" in ended.text and made == [] and run.calls[0][0] != "ask"


async def test_a_question_closed_unanswered_since_is_passed_over_and_asked_again():
    run = RecordingRun({"in_2": "allow"})
    earlier = [{"request_id": "in_1", "status": "open"}, {"request_id": "in_2", "status": "open"}]
    choice = await ask_once(run, "Go on?", earlier=earlier, same=lambda q, c: f"{c} again")
    assert choice == "allow again" and earlier == []
    assert run.calls == [("answer_to", "in_1"), ("answer_to", "in_2")]
    assert await ask_once(run, "Go on?", earlier=earlier) == "approve"  # none left: asked


async def test_a_step_whose_caller_went_away_ends_cancelled_while_its_run_goes_on():
    run = RecordingRun()

    async def act():
        await asyncio.sleep(10)

    step = asyncio.ensure_future(tool_step(run, "wait", {}, act))
    while ("durable",) not in run.calls:
        await asyncio.sleep(0)
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    cut = {"type": "cancelled", "message": "the call was stopped before it ended"}
    assert run.calls[-1] == ("tool_completed", "c9", False, cut)
