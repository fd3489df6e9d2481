"""Permission questions (an ACP agent's): answered from the kernel and the command line by option id or name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jupyter_agentruns import submit
from jupyter_agentruns.questions import choice_for, choice_name, option_names

from agents_for_tests import PERMISSION_OPTIONS, TEST_AGENTS
from servers import ServerProcess, wait_status

pytestmark = pytest.mark.timeout(120)

QUESTION = {
    "request_id": "in_1",
    "kind": "permission",
    "title": "Allow editing plot.py?",
    "details": {"options": PERMISSION_OPTIONS, "tool": {"title": "Edit plot.py"}},
    "choices": ["proceed_once", "proceed_always", "cancel"],
    "status": "open",
}


def test_an_answer_is_a_choice_or_the_name_of_a_permissions_option():
    assert option_names(QUESTION) == {
        "proceed_once": "Allow",
        "proceed_always": "Always allow edits",
        "cancel": "Reject",
    }
    assert choice_for(QUESTION, "cancel") == "cancel"
    assert choice_for(QUESTION, "Reject") == "cancel"
    assert choice_for(QUESTION, "  always ALLOW   edits") == "proceed_always"
    assert choice_for(QUESTION, "maybe") == "maybe"  # for the server to refuse
    assert choice_name(QUESTION, "proceed_once") == "Allow"
    # Only a permission's options have names.
    approval = {**QUESTION, "kind": "approval", "choices": ["approve", "deny"]}
    assert option_names(approval) == {} and choice_for(approval, "Reject") == "Reject"


def test_a_name_two_options_share_asks_for_the_id():
    twins = [{"optionId": "a", "name": "Allow"}, {"optionId": "b", "name": "allow"}]
    question = {**QUESTION, "details": {"options": twins}, "choices": ["a", "b"]}
    assert choice_for(question, "Allow") == "a"  # the exact name is one option
    with pytest.raises(
        ValueError, match="2 options are named 'ALLOW' \\(a, b\\): answer with an id"
    ):
        choice_for(question, "ALLOW")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("permissions")
    started = ServerProcess(home, home / "agentruns.sqlite3", {"agents": TEST_AGENTS}).start()
    yield started
    started.kill()


def waiting(server, input=None):
    """A permission_asker run waiting for its question: (run id, the question)."""
    with server.client() as client:
        response = client.post("runs", json={"agent": "permission_asker", "input": input or {}})
        run_id = response.json()["run_id"]
        [question] = wait_status(client, run_id, {"waiting"})["snapshot"]["inputs"]
    return run_id, question


def test_the_kernel_answers_a_permission_by_an_options_name_or_its_id(server):
    run = submit("permission_asker", {}, url=server.url, token=server.token, display=False)
    wait_status(server.client(), run.run_id, {"waiting"})
    [question] = run.questions
    assert question["kind"] == "permission"
    assert [option["name"] for option in question["details"]["options"]] == [
        "Allow",
        "Always allow edits",
        "Reject",
    ]
    run.answer("always allow edits")
    assert run.wait(30).status == "succeeded"
    assert run.output == {"choice": "proceed_always"}
    assert run.run["snapshot"]["inputs"][0]["choice"] == "proceed_always"

    again = submit("permission_asker", {}, url=server.url, token=server.token, display=False)
    wait_status(server.client(), again.run_id, {"waiting"})
    again.answer("cancel", request_id=again.questions[0]["request_id"])
    assert again.wait(30).output == {"choice": "cancel"}


def cli(server, *args):
    return subprocess.run(
        [sys.executable, "-m", "jupyter_agentruns.cli", *args],
        env={**server.env, "AGENTRUNS_URL": server.url, "AGENTRUNS_TOKEN": server.token},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_show_lists_a_permissions_options_by_name_and_answer_takes_a_name(server):
    run_id, question = waiting(server)
    request_id = question["request_id"]
    shown = cli(server, "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert (
        f"asks      {request_id}: Allow editing plot.py? "
        "[Allow (proceed_once) | Always allow edits (proceed_always) | Reject (cancel)]"
    ) in shown.stdout

    answered = cli(server, "answer", run_id, request_id, "Reject")
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.startswith(f"answered {request_id} with 'cancel' (Reject); {run_id} is ")
    with server.client() as client:
        run = wait_status(client, run_id, {"succeeded"})
    assert run["snapshot"]["inputs"][0]["choice"] == "cancel"
    assert run["output"] == {"choice": "cancel"}


def test_option_names_print_as_text_and_a_shared_name_is_refused_before_anything_is_sent(server):
    hostile = "Allow\x1b[2J\x1b]52;c;aGk=\x07 \u202eetad"
    options = [
        {"optionId": "a", "name": hostile, "kind": "allow_once"},
        {"optionId": "b", "name": hostile.upper(), "kind": "allow_always"},
    ]
    run_id, question = waiting(server, {"options": options})
    shown = cli(server, "show", run_id).stdout
    assert "\x1b" not in shown and "\u202e" not in shown
    assert "[Allow\\x1b[2J\\x1b]52;c;aGk=\\x07 \\u202eet… (a) | ALLOW" in shown  # shortened

    refused = cli(server, "answer", run_id, question["request_id"], hostile.lower())
    assert refused.returncode == 65
    assert "2 options are named" in refused.stderr and "\x1b" not in refused.stderr
    with server.client() as client:
        assert client.get(f"runs/{run_id}").json()["status"] == "waiting"
        client.post(f"runs/{run_id}/cancel")
