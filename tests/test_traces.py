"""Runs as OpenTelemetry spans: an app's tracer provider sees each run, its steps and model calls.

The server runs in the test's process (pytest-jupyter), its tracer provider
the SDK's with an in-memory exporter, as an app that configured OpenTelemetry
itself would have it. The trace context reaches the ACP agents' processes and
the MCP servers, which are real processes. Without OpenTelemetry, nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import rawdb

from conftest import MCP_SERVER, demo_input, submit, wait_run
from fake_openai import answer, tool_calls

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402
from opentelemetry.util._once import Once  # noqa: E402

pytestmark = [pytest.mark.sqlite_only, pytest.mark.timeout(60)]

ROOT = Path(__file__).parent.parent
ACP_AGENT = [sys.executable, str(Path(__file__).with_name("acp_agent.py"))]
KEY_ENV = "AGENTRUNS_TEST_OPENAI_KEY"


@pytest.fixture(scope="module")
def exporter():
    """The process's tracer provider for this file's tests, gone after them as if never set."""
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    yield spans
    provider.shutdown()
    # OpenTelemetry sets its global once per process; its own test utilities reset it so.
    trace._TRACER_PROVIDER = None
    trace._TRACER_PROVIDER_SET_ONCE = Once()


@pytest.fixture
def spans(exporter):
    exporter.clear()
    return exporter


@pytest.fixture
def agentruns_config(tmp_path, request):
    state = tmp_path / "acp-state"
    state.mkdir()
    config = {
        "lease_seconds": 0.6,
        "agents": {"openai": "jupyter_agentruns.agents.openai:OpenAIAgent"},
        "acp_agents": {"scripted": {"command": ACP_AGENT, "env": {"ACP_TEST_STATE": str(state)}}},
    }
    if getattr(request, "param", None) == "mcp":  # parametrized indirectly
        config["mcp_servers"] = {
            "tests": {"command": [sys.executable, MCP_SERVER]},
            "web": {"url": request.getfixturevalue("http_mcp_server")},
        }
    return config


@pytest.fixture
def jp_server_config(jp_server_config, fake, spans, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-test-key")
    settings = {"base_url": fake.url, "model": "fake-model", "api_key_env": KEY_ENV}
    return {**jp_server_config, "OpenAIAgent": {**settings, "retry_backoff": 0.01}}


def named(spans, operation):
    """The finished spans of one GenAI operation (``invoke_agent``, ``execute_tool``, ``chat``)."""
    return [
        span
        for span in spans.get_finished_spans()
        if span.attributes.get("gen_ai.operation.name") == operation
    ]


def traceparent_of(span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


async def test_a_run_is_an_invoke_agent_span_with_its_tool_steps_under_it(api, spans, engine):
    run = await wait_run(api, (await submit(api, session="s1")).json()["run_id"])
    assert run["status"] == "succeeded"
    [agent] = named(spans, "invoke_agent")
    assert agent.name == "invoke_agent demo"
    assert agent.attributes["gen_ai.agent.name"] == "demo"
    assert agent.attributes["gen_ai.conversation.id"] == "s1"
    assert agent.attributes["agentruns.run.id"] == run["run_id"]
    assert agent.attributes["agentruns.run.status"] == "succeeded"
    # The demo counts the prompt's words in, its answer's chunks out.
    assert agent.attributes["gen_ai.usage.input_tokens"] == 3
    assert agent.attributes["gen_ai.usage.output_tokens"] == 20
    assert agent.status.status_code is StatusCode.UNSET
    tools = named(spans, "execute_tool")
    assert [span.name for span in tools] == ["execute_tool search", "execute_tool summarize"]
    assert [span.attributes["gen_ai.tool.call.id"] for span in tools] == ["c1", "c2"]
    for span in tools:
        assert span.parent.span_id == agent.context.span_id
        assert span.context.trace_id == agent.context.trace_id
    # The run keeps its span's context, for the attempt after a takeover to link to.
    db = rawdb.connect(rawdb.target(engine))
    [(kept,)] = db.execute("SELECT trace_context FROM runs WHERE run_id = ?", [run["run_id"]])
    db.close()
    assert kept == traceparent_of(agent)


async def test_a_failed_run_is_a_span_with_an_error_status(api, spans):
    run = await wait_run(api, (await submit(api, input=demo_input(fail=True))).json()["run_id"])
    assert run["status"] == "failed"
    [agent] = named(spans, "invoke_agent")
    assert agent.status.status_code is StatusCode.ERROR
    assert agent.status.description == "the demo agent was asked to fail"
    assert agent.attributes["error.type"] == run["error"]["type"]


async def test_a_run_taken_over_goes_on_as_a_new_span_linked_to_the_one_before(api, spans, engine):
    earlier = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    db = rawdb.connect(rawdb.target(engine))
    # A run of a server that died mid-run (its lease long expired), as it left it.
    db.execute(
        "INSERT INTO runs (run_id, owner, agent, status, created_at, last_seq, first_seq, "
        "executor_id, lease_expires, metadata, input, resumable, trace_context) VALUES "
        "('run_dead', '~shared', 'demo', 'running', '2026-01-01T00:00:00.000Z', 1, 1, "
        "'exec_dead', ?, '{}', ?, 1, ?)",
        [time.time() - 1, json.dumps(demo_input()), earlier],
    )
    db.execute(
        "INSERT INTO events (run_id, seq, type, ts, data) "
        "VALUES ('run_dead', 1, 'run.started', '2026-01-01T00:00:00.000Z', '{}')"
    )
    run = await wait_run(api, "run_dead")
    assert run["status"] == "succeeded"
    [agent] = named(spans, "invoke_agent")
    assert agent.attributes["agentruns.run.attempt"] == 2
    [link] = agent.links
    assert (link.context.trace_id, link.context.span_id) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )
    [(kept,)] = db.execute("SELECT trace_context FROM runs WHERE run_id = 'run_dead'")
    db.close()
    assert kept == traceparent_of(agent)


@pytest.mark.parametrize("agentruns_config", ["mcp"], indirect=True)
async def test_model_calls_are_chat_spans_and_mcp_servers_get_the_trace_context(api, spans, fake):
    fake.reply(
        tool_calls(
            ("tests__variable", '{"name": "TRACEPARENT"}'),
            ("web__header", '{"name": "traceparent"}'),
            ("tests__traced", "{}"),
            ("web__traced", "{}"),
        ),
        answer("Both said it."),
    )
    response = await submit(api, "openai", {"prompt": "Where are we?"})
    run = await wait_run(api, response.json()["run_id"])
    assert run["status"] == "succeeded", run["error"]
    [agent] = named(spans, "invoke_agent")
    chats = named(spans, "chat")
    assert [span.name for span in chats] == ["chat fake-model", "chat fake-model"]
    assert [
        (
            span.attributes["gen_ai.usage.input_tokens"],
            span.attributes["gen_ai.usage.output_tokens"],
        )
        for span in chats
    ] == [(10, 4), (5, 3)]
    assert all(span.parent.span_id == agent.context.span_id for span in chats)
    assert chats[0].attributes["gen_ai.request.model"] == "fake-model"
    tools = named(spans, "execute_tool")
    steps = {span.attributes["gen_ai.tool.call.id"]: span for span in tools}
    assert sorted(span.attributes["gen_ai.tool.name"] for span in tools) == [
        "tests__traced",
        "tests__variable",
        "web__header",
        "web__traced",
    ]
    assert all(span.parent.span_id == agent.context.span_id for span in tools)
    # The stdio server's environment and the HTTP server's connection carry the run's span;
    # each call, in its _meta, the MCP SDK's span of the call, under the step that made it.
    results = {tool["name"]: (tool["call_id"], tool["result"]) for tool in run["snapshot"]["tools"]}
    assert results["tests__variable"][1] == results["web__header"][1] == traceparent_of(agent)
    by_id = {traceparent_of(span): span for span in spans.get_finished_spans()}
    for name in ("tests__traced", "web__traced"):
        call_id, carried = results[name]
        assert by_id[carried].parent.span_id == steps[call_id].context.span_id, name


async def test_an_acp_agent_gets_the_trace_context_in_its_environment_and_prompt(api, spans):
    async def turn(prompt):
        response = await submit(api, "scripted", {"prompt": prompt}, session="chat")
        return json.loads((await wait_run(api, response.json()["run_id"]))["output"]["text"])

    environment, meta = await turn("env"), await turn("meta")
    first, second = sorted(named(spans, "invoke_agent"), key=lambda span: span.start_time)
    # The process has the context of the run that started it; each prompt, its own run's.
    assert environment["TRACEPARENT"] == traceparent_of(first)
    assert meta["traceparent"] == traceparent_of(second)


def test_without_opentelemetry_there_is_no_tracer_and_nothing_to_pass_on():
    script = textwrap.dedent(
        """
        import logging, sys
        sys.modules["opentelemetry"] = None  # as if not installed
        from jupyter_agentruns import tracing
        assert tracing.configure(logging.getLogger()) is None
        assert tracing.headers() == {} and tracing.environment() == {}
        with tracing.current(None), tracing.chat("m", "h") as span:
            assert span is None
        tracing.flush()
        """
    )
    env = {"OTEL_TRACES_EXPORTER": "console", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
