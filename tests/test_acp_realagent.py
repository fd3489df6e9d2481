"""A real ACP agent nobody here wrote: opencode (npm ``opencode-ai``) against a small local model.

opencode runs as the docs' "ACP agents" tutorial sets it up for people
without an API key: an ``opencode.json`` in the working directory whose
provider is llama-cpp-python's server with SmolLM2-135M-Instruct (started
with the model file's own chat template), a private ``HOME``, and an agent
of its own with a one-line system prompt and no tools, so that a turn is one
short model call. A model this small says nothing reliable: the test checks
what the server makes of a real agent's session, not what the model says.

``scripts/test`` installs opencode into a cache outside the clone and names
it in ``AGENTRUNS_TEST_OPENCODE``; without it the test skips (in CI it fails).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_openai_realmodel import LlamaServer, model_file

from conftest import all_events, submit, wait_run

# What it tests is above the store: one store is enough.
pytestmark = [pytest.mark.realagent, pytest.mark.sqlite_only, pytest.mark.timeout(420)]

TUTORIAL = (Path(__file__).parent.parent / "docs" / "tutorials" / "acp-agents.md").read_text()


def readme_opencode_json() -> dict:
    """The ``opencode.json`` of the "ACP agents" tutorial."""
    section = TUTORIAL.split("## opencode against a small local model", 1)[1]
    return json.loads(re.search(r"```json\n(.*?)```", section, re.DOTALL).group(1))


def opencode() -> str:
    path = os.environ.get("AGENTRUNS_TEST_OPENCODE", "")
    if not path or not os.access(path, os.X_OK):
        reason = "needs opencode: AGENTRUNS_TEST_OPENCODE names it (scripts/test installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the real-agent test: {reason}")
        pytest.skip(reason)
    return path


class TemplateLlamaServer(LlamaServer):
    """The tutorial's command for opencode: the model file's own chat template, a context of 4,096."""

    def __init__(self, model: str, log: Path):
        with contextlib.closing(socket.socket()) as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = log
        command = [
            sys.executable, "-m", "llama_cpp.server", "--model", model,
            "--model_alias", "smollm2", "--n_ctx", "4096",
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """llama-cpp-python's server with the GGUF's own chat template and room for opencode's prompt."""
    opencode()  # nothing started when the test skips
    server = TemplateLlamaServer(model_file(), tmp_path_factory.mktemp("llama") / "llama.log")
    try:
        server.wait_ready(timeout=120)
        yield server
    finally:
        server.stop()


@pytest.fixture
def agentruns_config(tmp_path, llama):
    home = tmp_path / "opencode-home"
    home.mkdir()
    return {
        "acp_agents": {
            "opencode": {
                "command": [opencode(), "acp"],
                "env": {"HOME": str(home)},
                "initialize_timeout": 120,
            }
        }
    }


@pytest.fixture
def project(jp_serverapp, llama):
    """The server's root as the tutorial sets it up: its opencode.json names the local model."""
    config = readme_opencode_json()
    config["provider"]["llama"]["options"]["baseURL"] = llama.url
    (Path(jp_serverapp.root_dir) / "opencode.json").write_text(json.dumps(config))


async def test_opencode_answers_through_a_local_model_and_a_follow_up_continues(api, project):
    response = await submit(api, "opencode", {"prompt": "Say hello."}, session="chat")
    assert response.status_code == 201, response.text
    run = await wait_run(api, response.json()["run_id"], timeout=300)
    assert run["status"] == "succeeded", run["error"]
    assert run["output"]["stop_reason"] == "end_turn"
    events = await all_events(api, run["run_id"])
    deltas = [e["data"]["delta"] for e in events if e["type"] == "text.delta"]
    assert deltas and "".join(deltas) == run["snapshot"]["messages"][0]["text"]
    assert run["output"]["text"] == "".join(deltas)

    follow = await submit(api, "opencode", {"prompt": "Say goodbye."}, session="chat")
    run = await wait_run(api, follow.json()["run_id"], timeout=300)
    assert run["status"] == "succeeded", run["error"]
    types = [e["type"] for e in await all_events(api, run["run_id"])]
    assert "text.delta" in types and "x.acp_new_conversation" not in types
