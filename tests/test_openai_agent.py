"""The built-in ``openai`` agent, through a real server, against a fake OpenAI-compatible one."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import date
from pathlib import Path
from typing import Annotated

import jsonschema
import pytest
import rawdb
from traitlets import TraitError

from jupyter_agentruns.agents import openai
from jupyter_agentruns.agents.openai.tool_calls import definition
from jupyter_agentruns.agents.tools import InvalidToolArguments, UnknownTool, describe_tool, tool
from jupyter_agentruns.errors import error_object

import tools_for_tests
from conftest import all_events, submit, wait_run, waiting
from fake_openai import (
    MODEL,
    Hang,
    Status,
    Stream,
    answer,
    chunk,
    closed_port_url,
    error_body,
    llama_cpp_validation_error,
    tool_calls,
)
from tools_for_tests import TEST_TOOLS

# The agent's exchanges with its model server are above the store (SQLite alone): the
# stores are tested under every agent by test_store_contract, test_events and test_resume.
pytestmark = pytest.mark.sqlite_only

EXAMPLES = Path(__file__).parent.parent / "examples"
KEY_ENV = "AGENTRUNS_TEST_OPENAI_KEY"
SECRET = "sk-test-5ecret-never-to-be-shown-0123456789"


@pytest.fixture
def openai_config():
    """Per-test ``c.OpenAIAgent`` settings over the ones below; override with ``parametrize``."""
    return {}


@pytest.fixture
def examples_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    sys.modules.pop("weather_agent", None)


@pytest.fixture
def agentruns_config(examples_importable, request):
    if getattr(request, "param", None) == "filesystem":  # parametrized indirectly
        return {
            "agents": {"openai": "jupyter_agentruns.agents.openai:OpenAIAgent"},
            "mcp_servers": {"files": {"command": request.getfixturevalue("files_mcp_server")}},
        }
    if getattr(request, "param", None) == "mcp over http":  # parametrized indirectly
        return {
            "agents": {"openai": "jupyter_agentruns.agents.openai:OpenAIAgent"},
            "mcp_servers": {
                "web": {
                    "url": request.getfixturevalue("http_mcp_server"),
                    "headers": {"X-Key": "k1"},
                }
            },
        }
    if getattr(request, "param", None) == "budget":  # parametrized indirectly
        return {
            "agents": {"openai": "jupyter_agentruns.agents.openai:OpenAIAgent"},
            "max_tokens_per_run": 1000,
        }
    return {
        "agents": {
            "openai": "jupyter_agentruns.agents.openai:OpenAIAgent",
            "weather": "weather_agent:weather",
        }
    }


@pytest.fixture
def jp_server_config(jp_server_config, fake, openai_config, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    tools_for_tests.calls.clear()
    settings = {
        "base_url": fake.url,
        "model": MODEL,
        "api_key_env": KEY_ENV,
        "request_timeout": 5,
        "retry_backoff": 0.01,
        "tools": TEST_TOOLS,
    }
    return {**jp_server_config, "OpenAIAgent": {**settings, **openai_config}}


def error_type(exc_class) -> str:
    """The ``error.type`` of a run failed by this exception class (the executor spells it)."""
    return error_object(exc_class("x"))["type"]


async def run_to_end(api, input, agent="openai"):
    response = await submit(api, agent=agent, input=input)
    assert response.status_code == 201, response.text
    run = await wait_run(api, response.json()["run_id"])
    return run, await all_events(api, run["run_id"])


def of_type(events, type):
    return [event["data"] for event in events if event["type"] == type]


# Tool schemas ---------------------------------------------------------------


def test_a_tool_schema_comes_from_the_signature_and_the_docstring():
    def search(
        query: str,
        limit: int = 10,
        tags: list[str] | None = None,
        order: Annotated[str, "newest or oldest first"] = "newest",
        exact: bool = False,
        **filters,
    ) -> list:
        """Search the notes.

        Only the first paragraph describes the tool.

        Args:
            query: what to look for,
                in plain words
            limit: at most this many hits
        """

    spec = describe_tool("search", search)
    assert definition(spec) == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the notes.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "what to look for, in plain words"},
                    "limit": {
                        "type": "integer",
                        "description": "at most this many hits",
                        "default": 10,
                    },
                    "tags": {
                        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                        "default": None,
                    },
                    "order": {
                        "type": "string",
                        "description": "newest or oldest first",
                        "default": "newest",
                    },
                    "exact": {"type": "boolean", "default": False},
                },
                "required": ["query"],
                "additionalProperties": True,
            },
        },
    }


def test_the_tool_decorator_gives_the_description_and_schema_explicitly():
    schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}

    @tool(description="Plan a trip.", schema=schema)
    def plan(when):
        """Not this text."""

    spec = describe_tool("plan", plan)
    assert (spec.description, spec.parameters) == ("Plan a trip.", schema)
    assert describe_tool("add", tools_for_tests.add).parameters["required"] == ["a", "b"]


def test_a_tool_whose_parameters_have_no_json_schema_is_refused_with_what_to_do():
    def remind(day: date):
        """Remind me."""

    with pytest.raises(ValueError, match=r"'day'.*has no JSON schema.*@tool\(schema=\.\.\.\)"):
        describe_tool("remind", remind)
    with pytest.raises(ValueError, match="not a valid tool name"):
        describe_tool("remind me", tools_for_tests.add)


# Streaming, input, output ---------------------------------------------------


async def test_a_prompt_streams_its_answer_and_returns_the_whole_conversation(api, fake):
    fake.reply(answer("Hel", "lo", " world", usage=(5, 3)))
    run, events = await run_to_end(api, {"prompt": "Say hello"})

    assert run["status"] == "succeeded", run["error"]
    assert run["output"] == {
        "text": "Hello world",
        "messages": [
            {"role": "user", "content": "Say hello"},
            {"role": "assistant", "content": "Hello world"},
        ],
        "model": MODEL,
        "finish_reason": "stop",
        "usage": {"input_tokens": 5, "output_tokens": 3},
    }
    types = [event["type"] for event in events]
    assert types == ["run.started", "message.started"] + ["text.delta"] * 3 + [
        "message.completed", "usage", "run.succeeded"
    ]  # fmt: skip
    assert [delta["delta"] for delta in of_type(events, "text.delta")] == ["Hel", "lo", " world"]
    assert run["snapshot"]["usage"] == {"input_tokens": 5, "output_tokens": 3}

    [request] = fake.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == f"Bearer {SECRET}"
    body = request["body"]
    assert body["model"] == MODEL and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert [t["function"]["name"] for t in body["tools"]] == list(TEST_TOOLS)


async def test_the_input_chooses_model_temperature_system_message_and_tools(api, fake):
    fake.reply(answer("Bonjour", model="other-model"))
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
               {"role": "user", "content": "In French?"}]  # fmt: skip
    input = {
        "messages": history,
        "system": "Be brief.",
        "model": "other-model",
        "temperature": 0.2,
        "max_tokens": 64,
        "tools": ["add"],
        "tool_choice": "none",
    }
    run, _ = await run_to_end(api, input)

    assert run["status"] == "succeeded", run["error"]
    body = fake.requests[0]["body"]
    assert body["model"] == "other-model" and body["temperature"] == 0.2
    assert body["max_tokens"] == 64 and body["tool_choice"] == "none"
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, *history]
    assert [t["function"]["name"] for t in body["tools"]] == ["add"]
    assert run["output"]["model"] == "other-model"
    assert run["output"]["messages"][-1] == {"role": "assistant", "content": "Bonjour"}

    fake.reply(answer("Sure"))
    run, _ = await run_to_end(api, {"prompt": "no tools", "tools": []})
    assert "tools" not in fake.requests[1]["body"]


async def test_submit_rejects_unknown_tools_and_needs_exactly_one_of_prompt_and_messages(api, fake):
    listing = (await api.get("agents")).json()["agents"]
    schema = next(agent for agent in listing if agent["name"] == "openai")["input_schema"]
    assert schema["properties"]["tools"]["items"]["enum"] == sorted(TEST_TOOLS)

    problems = {}
    for label, input in {
        "unknown tool": {"prompt": "hi", "tools": ["add", "rm_rf"]},
        "neither": {"model": "x"},
        "both": {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]},
        "bad role": {"messages": [{"role": "wizard", "content": "hi"}]},
    }.items():
        response = await submit(api, agent="openai", input=input)
        assert response.status_code == 400 and response.json()["error"] == "invalid_input", label
        problems[label] = response.json()["message"]
    assert (
        "input.tools[1]: 'rm_rf' is not one of "
        "['add', 'broken', 'committed_tool_calls', 'get_weather']" in problems["unknown tool"]
    )
    assert "'prompt' is a required property" in problems["neither"]
    assert problems["both"].startswith("input.prompt: ")
    assert "wizard" in problems["bad role"]
    assert fake.requests == []


async def test_a_local_server_without_a_key_gets_a_placeholder_key(api, fake, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    fake.reply(answer("ok"))
    run, _ = await run_to_end(api, {"prompt": "hi"})
    assert run["status"] == "succeeded"
    assert fake.requests[0]["headers"]["authorization"] == f"Bearer {openai.NO_KEY}"


# Approvals -------------------------------------------------------------------------


async def wait_question(api, run_id, asked):
    """The run's newest question, open, once it asked ``asked`` of them."""
    return (await waiting(api, run_id, asked=asked))["snapshot"]["inputs"][-1]


@pytest.mark.parametrize("openai_config", [{"approve_tools": ["add"]}])
async def test_a_tool_named_in_approve_tools_runs_only_once_approved_and_a_denial_is_told(
    api, fake
):
    fake.reply(
        tool_calls(("add", '{"a": 1, "b": 2}')),
        tool_calls(("add", '{"a": 5, "b": 5}'), ("get_weather", '{"city": "Paris"}')),
        answer("Done."),
    )
    run_id = (await submit(api, agent="openai", input={"prompt": "add"})).json()["run_id"]
    first = await wait_question(api, run_id, 1)
    assert first["title"] == "Run the tool add?"
    assert first["details"] == {"tool": "add", "arguments": {"a": 1, "b": 2}}
    assert tools_for_tests.calls == []  # nothing ran before the answer
    await api.post(f"runs/{run_id}/inputs/{first['request_id']}", json={"choice": "approve"})
    second = await wait_question(api, run_id, 2)
    assert second["details"]["arguments"] == {"a": 5, "b": 5}
    await api.post(f"runs/{run_id}/inputs/{second['request_id']}", json={"choice": "deny"})
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded", run["error"]
    # add(1, 2) ran; add(5, 5) was denied and not run; get_weather needs no approval.
    assert [name for name, _ in tools_for_tests.calls] == ["add", "get_weather"]
    denied = run["snapshot"]["tools"][1]
    assert denied["status"] == "failed" and denied["error"]["type"] == "denied"
    told = [m for m in fake.requests[2]["body"]["messages"] if m["role"] == "tool"]
    assert told[1]["content"].startswith("Error: denied: a person denied this call of add")
    assert len(run["snapshot"]["inputs"]) == 2


@pytest.mark.parametrize("openai_config", [{"approve_tools": ["*"]}])
async def test_approve_tools_star_asks_for_every_tool(api, fake):
    fake.reply(tool_calls(("get_weather", '{"city": "Paris"}')), answer("21 °C."))
    run_id = (await submit(api, agent="openai", input={"prompt": "weather"})).json()["run_id"]
    question = await wait_question(api, run_id, 1)
    assert question["details"]["tool"] == "get_weather"
    await api.post(f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": "approve"})
    assert (await wait_run(api, run_id))["status"] == "succeeded"
    assert [name for name, _ in tools_for_tests.calls] == ["get_weather"]


# Token usage ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "openai_config",
    [{"prices": {"zeta": {"input": 1, "output": 1}, MODEL: {"input": 1, "output": 1}}}],
)
async def test_agents_lists_the_configured_model_first_then_the_priced_ones(api, fake):
    listing = (await api.get("agents")).json()["agents"]
    described = next(agent for agent in listing if agent["name"] == "openai")
    assert described["models"] == [{"id": MODEL, "name": MODEL}, {"id": "zeta", "name": "zeta"}]
    assert described["current"] == {"model": MODEL} and "modes" not in described
    # The list is what the server knows of, not all the model server has: another is taken.
    fake.reply(answer("Hi"))
    run, _ = await run_to_end(api, {"prompt": "hi", "model": "unlisted"})
    assert run["status"] == "succeeded" and fake.requests[0]["body"]["model"] == "unlisted"


@pytest.mark.parametrize(
    "openai_config",
    [{"prices": {MODEL: {"input": 2.5, "output": 10}, "other": {"input": 1, "output": 1}}}],
)
async def test_prices_add_the_cost_of_the_totals_to_each_usage_event(api, fake):
    fake.reply(
        tool_calls(("add", '{"a": 1, "b": 2}'), usage=(1000, 20)), answer("3", usage=(1100, 30))
    )
    run, events = await run_to_end(api, {"prompt": "1 + 2?"})
    assert run["status"] == "succeeded", run["error"]
    # Per million tokens: (1000 * 2.5 + 20 * 10) / 1e6, then the totals of both calls.
    assert of_type(events, "usage") == [
        {"input_tokens": 1000, "output_tokens": 20, "cost": 0.0027},
        {"input_tokens": 2100, "output_tokens": 50, "cost": 0.00575},
    ]
    assert run["snapshot"]["usage"]["cost"] == 0.00575
    record = (await api.get(f"runs/{run['run_id']}", headers={"Accept": "text/markdown"})).text
    assert "2100 tokens in, 50 out, cost 0.0057" in record


@pytest.mark.parametrize(
    "agentruns_config",
    [
        {
            "agents": {"openai": "jupyter_agentruns.agents.openai_chat:OpenAIAgent"},
            "max_tokens_per_run": 1500,
        }
    ],
)
async def test_a_model_call_that_crosses_max_tokens_per_run_fails_the_run_before_its_tools_run(
    api, fake
):
    fake.reply(tool_calls(("add", '{"a": 1, "b": 2}'), usage=(1400, 200)), answer("3"))
    run, events = await run_to_end(api, {"prompt": "1 + 2?"})
    assert run["status"] == "failed" and run["error"]["type"] == "token_budget_exceeded"
    assert [e["type"] for e in events][-2:] == ["usage", "run.failed"]
    assert of_type(events, "tool.started") == [] and len(fake.requests) == 1


def test_the_old_module_name_still_gives_the_agent_and_the_tool_decorator():
    # Configurations and tool modules written for openai_chat keep working.
    from jupyter_agentruns.agents import openai_chat, tools

    assert openai_chat.OpenAIAgent is openai.OpenAIAgent and openai_chat.tool is tools.tool


def test_a_negative_price_is_refused():
    from traitlets import TraitError

    with pytest.raises(TraitError, match=r"prices\[.*\]\['input'\]"):
        openai.OpenAIAgent(prices={MODEL: {"input": -1, "output": 1}})


async def test_usage_the_server_does_not_report_nor_can_count_is_said_once_and_left_out(api, fake):
    fake.reply(tool_calls(("add", '{"a": 1, "b": 2}'), usage=None), answer("3", usage=None))
    run, events = await run_to_end(api, {"prompt": "Add 1 and 2"})

    assert run["status"] == "succeeded", run["error"]
    server = fake.url[7:-3]
    assert of_type(events, "x.usage_unreported") == [
        {
            "server": server,
            "estimated": False,
            "message": f"usage not reported by the model server at {server}, "
            "which offers no tokenizer to estimate it with: no token counts",
        }
    ]
    assert of_type(events, "usage") == [] and run["output"]["usage"] is None


@pytest.mark.parametrize("reported", [(-1000, 3), (1.5, 3), (5, -1)])
async def test_usage_no_server_could_mean_is_ignored_said_once_and_the_run_goes_on(
    api, fake, reported
):
    # Stored as it came, a count out of the store's range took every run of the
    # writer's batch down with it, and the run was taken over (paid) again and again.
    fake.reply(tool_calls(("add", '{"a": 1, "b": 2}'), usage=reported), answer("3", usage=reported))
    run, events = await run_to_end(api, {"prompt": "Add 1 and 2"})

    assert run["status"] == "succeeded", run["error"]
    assert run["attempt"] == 1 and run["output"]["text"] == "3"
    assert of_type(events, "usage") == [] and run["snapshot"]["usage"] is None
    [said] = of_type(events, "x.usage_unreported")
    assert "cannot be token counts" in said["message"] and "is ignored" in said["message"]
    assert repr(reported[0])[:10] in said["message"]


@pytest.mark.parametrize("reported", [(10**20, 3), (1e20, 3), (5, 2**53 + 1)])
async def test_usage_over_2_53_tokens_is_said_once_and_counted_as_2_53(api, fake, reported):
    # Ignored, it let a run past its token budget; stored, it failed the writer's batch.
    fake.reply(tool_calls(("add", '{"a": 1, "b": 2}'), usage=reported), answer("3", usage=reported))
    run, events = await run_to_end(api, {"prompt": "Add 1 and 2"})

    assert run["status"] == "succeeded", run["error"]
    [said] = of_type(events, "x.usage_over_max")
    assert "over 2**53 tokens" in said["message"] and "counted as 2**53" in said["message"]
    assert repr(max(reported))[:10] in said["message"]
    counted = [min(int(value), 2**53) for value in reported]
    # Two calls: their totals, each at most 2**53.
    totals = {"input_tokens": min(2 * counted[0], 2**53),
              "output_tokens": min(2 * counted[1], 2**53)}  # fmt: skip
    assert of_type(events, "usage")[-1] == totals == run["snapshot"]["usage"]


@pytest.mark.parametrize("agentruns_config", ["budget"], indirect=True)
async def test_usage_over_2_53_tokens_is_over_max_tokens_per_run(api, fake):
    fake.reply(tool_calls(("add", '{"a": 1, "b": 2}'), usage=(10**20, 3)), answer("3"))
    run, events = await run_to_end(api, {"prompt": "Add 1 and 2"})

    assert run["status"] == "failed" and run["error"]["type"] == "token_budget_exceeded", run
    assert [e["type"] for e in events][-3:] == ["x.usage_over_max", "usage", "run.failed"]
    assert of_type(events, "usage") == [{"input_tokens": 2**53, "output_tokens": 3}]


async def test_usage_the_server_does_not_report_is_counted_by_its_tokenizer_as_an_estimate(
    api, fake
):
    fake.tokenizer = lambda text: len(text.split())
    fake.reply(tool_calls(("add", '{"a": 1, "b": 2}'), usage=None), answer("It is 3", usage=None))
    run, events = await run_to_end(api, {"prompt": "Add 1 and 2"})

    assert run["status"] == "succeeded", run["error"]
    [unreported] = of_type(events, "x.usage_unreported")
    assert unreported["estimated"] is True
    assert unreported["message"].endswith("the token counts are estimates by its tokenizer")
    # What each model call sent (contents, tool calls, the tools offered) and received.
    sent = [fake.counted[0], fake.counted[2]]
    assert sent[0].startswith("Add 1 and 2\n{") and '"name": "add"' in sent[0]
    assert fake.counted[1] == 'add {"a": 1, "b": 2}' and fake.counted[3] == "It is 3"
    first_in, second_in = (len(text.split()) for text in sent)
    assert of_type(events, "usage") == [
        {"input_tokens": first_in, "output_tokens": 5, "estimated": True},
        {"input_tokens": first_in + second_in, "output_tokens": 8, "estimated": True},
    ]
    assert run["output"]["usage"] == of_type(events, "usage")[-1]
    types = [event["type"] for event in events]
    assert types.index("x.usage_unreported") == types.index("usage") - 1


# Tools ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name_in_every_fragment", [False, True], ids=["name-once", "name-repeated"]
)
async def test_tool_calls_split_across_chunks_run_a_sync_and_an_async_tool(
    api, fake, name_in_every_fragment
):
    fake.reply(
        tool_calls(
            ("add", '{"a": 1, "b": 2}'),
            ("get_weather", '{"city": "Paris"}'),
            pieces=4,
            usage=(10, 4),
            name_in_every_fragment=name_in_every_fragment,
        ),
        answer("1 + 2 = 3, and Paris is at 21 °C.", usage=(30, 12)),
    )
    run, events = await run_to_end(api, {"prompt": "Add 1 and 2, and the weather in Paris?"})

    assert run["status"] == "succeeded", run["error"]
    tools = run["snapshot"]["tools"]
    assert [(t["name"], t["args"], t["status"], t["result"]) for t in tools] == [
        ("add", {"a": 1, "b": 2}, "completed", 3),
        (
            "get_weather",
            {"city": "Paris"},
            "completed",
            {"city": "Paris", "temperature": 21, "unit": "celsius"},
        ),
    ]
    name, details = tools_for_tests.calls[0]
    assert name == "add" and details["thread"] != "MainThread"  # a sync tool runs in a thread
    types = [event["type"] for event in events]
    assert types == ["run.started", "usage", "tool.started", "tool.completed", "tool.started",
                     "tool.completed", "message.started", "text.delta", "message.completed",
                     "usage", "run.succeeded"]  # fmt: skip
    assert of_type(events, "usage") == [
        {"input_tokens": 10, "output_tokens": 4},
        {"input_tokens": 40, "output_tokens": 16},
    ]

    # The model's second request carries its tool calls, put back together, and their results.
    sent = fake.requests[1]["body"]["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": "",  # never null: some servers refuse it
        "tool_calls": [
            {
                "id": "call_fake_0",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
            },
            {
                "id": "call_fake_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
        ],
    }
    assert sent[2:] == [
        {"role": "tool", "tool_call_id": "call_fake_0", "content": "3"},
        {
            "role": "tool",
            "tool_call_id": "call_fake_1",
            "content": '{"city": "Paris", "temperature": 21, "unit": "celsius"}',
        },
    ]
    assert run["output"]["messages"] == [
        *sent,
        {"role": "assistant", "content": "1 + 2 = 3, and Paris is at 21 °C."},
    ]
    assert run["output"]["usage"] == {"input_tokens": 40, "output_tokens": 16}


async def test_a_failing_or_unknown_tool_completes_not_ok_and_the_model_reads_the_error(api, fake):
    fake.reply(
        tool_calls(
            ("broken", '{"city": "Atlantis"}'),
            ("rm_rf", "{}"),
            ("add", '{"a": "one", "b": 2}'),
            ("add", "{oops"),
        ),
        answer("Sorry, I could not find out."),
    )
    run, events = await run_to_end(api, {"prompt": "Weather in Atlantis?"})

    assert run["status"] == "succeeded", run["error"]
    completed = of_type(events, "tool.completed")
    assert [c["ok"] for c in completed] == [False] * 4
    assert [c["error"]["type"] for c in completed] == [
        "LookupError",
        error_type(UnknownTool),
        error_type(InvalidToolArguments),
        error_type(InvalidToolArguments),
    ]
    assert completed[0]["error"]["message"] == "no weather station in Atlantis"
    assert of_type(events, "tool.started")[3]["args"] == {"arguments": "{oops"}
    replies = [m["content"] for m in fake.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert replies[0] == "Error: LookupError: no weather station in Atlantis"
    assert "there is no tool 'rm_rf' in this run" in replies[1]
    assert "'one' is not of type 'integer'" in replies[2]
    assert "not JSON" in replies[3]
    assert tools_for_tests.calls == []  # add never ran with bad arguments


async def test_a_tool_call_is_durable_before_it_runs_and_its_result_before_the_next_model_call(
    api, fake, engine, monkeypatch
):
    monkeypatch.setenv("AGENTRUNS_TEST_DB", rawdb.target(engine))
    committed_at_second_request = []

    def count_committed(request):
        if len(fake.requests) == 2:
            db = rawdb.connect(rawdb.target(engine))
            try:
                query = "SELECT type, count(*) FROM events WHERE type LIKE 'tool.%' GROUP BY type"
                committed_at_second_request.append(dict(db.execute(query).fetchall()))
            finally:
                db.close()

    fake.on_request = count_committed
    fake.reply(tool_calls(("committed_tool_calls", "{}")), answer("done"))
    run, _ = await run_to_end(api, {"prompt": "check"})

    assert run["status"] == "succeeded", run["error"]
    assert run["snapshot"]["tools"][0]["result"] == 1  # its own tool.started was already committed
    assert committed_at_second_request == [{"tool.started": 1, "tool.completed": 1}]


async def test_a_conversation_with_tool_calls_continues_with_no_null_content(api, fake):
    fake.reply(tool_calls(("add", '{"a": 1, "b": 2}')), answer("3"))
    first, _ = await run_to_end(api, {"prompt": "Add 1 and 2"})
    assert first["status"] == "succeeded", first["error"]

    # The output, as is and as the OpenAI SDK writes such a message (null content), continued.
    sdk_style = [
        {**m, "content": None} if m.get("tool_calls") else m for m in first["output"]["messages"]
    ]
    for history in (first["output"]["messages"], sdk_style):
        fake.reply(answer("6"))
        run, _ = await run_to_end(
            api, {"messages": [*history, {"role": "user", "content": "And doubled?"}]}
        )
        assert run["status"] == "succeeded", run["error"]
        sent = fake.requests[-1]["body"]["messages"]
        assert [m["content"] for m in sent] == ["Add 1 and 2", "", "3", "3", "And doubled?"]


async def test_a_tool_choice_naming_a_tool_forces_the_first_call_only(api, fake):
    fake.reply(tool_calls(("add", '{"a": 2, "b": 2}')), answer("4"))
    run, _ = await run_to_end(api, {"prompt": "2 + 2?", "tool_choice": "add"})

    assert run["status"] == "succeeded", run["error"]
    assert [t["name"] for t in run["snapshot"]["tools"]] == ["add"]
    first, second = (request["body"] for request in fake.requests)
    assert first["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert "tool_choice" not in second  # forced again, the model would call add forever


async def test_a_tool_choice_the_run_does_not_offer_fails_it_before_any_model_call(api, fake):
    run, _ = await run_to_end(
        api, {"prompt": "2 + 2?", "tools": ["get_weather"], "tool_choice": "add"}
    )
    assert run["status"] == "failed"
    assert run["error"] == {
        "type": "invalid_input",
        "message": (
            "tool_choice names 'add', a tool this run does not offer (its tools: get_weather)"
        ),
    }
    response = await submit(api, agent="openai", input={"prompt": "hi", "tool_choice": "rm_rf"})
    assert response.status_code == 400 and "tool_choice" in response.json()["message"]
    assert fake.requests == []


@pytest.mark.parametrize("openai_config", [{"max_tool_iterations": 2}])
async def test_max_tool_iterations_bounds_the_tool_loop(api, fake):
    fake.reply(
        *[tool_calls(("add", '{"a": 1, "b": 1}')) for _ in range(3)], answer("never reached")
    )
    run, _ = await run_to_end(api, {"prompt": "loop forever"})

    assert run["status"] == "failed"
    assert run["error"]["type"] == error_type(openai.MaxToolIterationsExceeded)
    assert (
        "after 2 rounds" in run["error"]["message"]
        and "max_tool_iterations" in run["error"]["message"]
    )
    assert len(fake.requests) == 3 and len(tools_for_tests.calls) == 2


# Cancellation -------------------------------------------------------------------


@pytest.mark.parametrize("openai_config", [{"request_timeout": 60}])
async def test_cancelling_mid_stream_closes_the_upstream_connection_at_once(api, fake):
    fake.reply(
        Stream(
            [chunk({"role": "assistant", "content": ""}), chunk({"content": "Once upon a time"})],
            hold=True,
        )
    )
    response = await submit(api, agent="openai", input={"prompt": "A long story, please"})
    run_id = response.json()["run_id"]
    for _ in range(500):
        run = (await api.get(f"runs/{run_id}")).json()
        if run["snapshot"]["messages"]:
            break
        await asyncio.sleep(0.01)
    assert run["snapshot"]["messages"][0]["text"] == "Once upon a time"
    assert fake.disconnects == 0

    cancel = await api.post(f"runs/{run_id}/cancel", json={"reason": "enough"})
    assert cancel.status_code == 202
    await asyncio.wait_for(fake.disconnected.wait(), timeout=5)  # long before request_timeout
    run = await wait_run(api, run_id)
    assert run["status"] == "cancelled"
    assert run["cancel"]["stage"]["step"] == "message m1 streaming"
    assert fake.disconnects == 1


@pytest.mark.parametrize("openai_config", [{"request_timeout": 60}])
async def test_cancelling_while_the_model_thinks_closes_the_upstream_connection_too(api, fake):
    fake.reply(Hang())  # a model server still working on its first token
    response = await submit(api, agent="openai", input={"prompt": "Think hard"})
    run_id = response.json()["run_id"]
    for _ in range(500):
        if fake.requests:
            break
        await asyncio.sleep(0.01)

    await api.post(f"runs/{run_id}/cancel", json={"reason": "too slow"})
    await asyncio.wait_for(fake.disconnected.wait(), timeout=5)
    assert (await wait_run(api, run_id))["status"] == "cancelled"


# Upstream errors ---------------------------------------------------------------


async def test_a_refused_key_fails_upstream_auth_and_the_key_appears_nowhere(api, fake, caplog):
    fake.reply(
        Status(401, error_body(f"Incorrect API key provided: {SECRET}.", code="invalid_api_key"))
    )
    run, events = await run_to_end(api, {"prompt": "hi"})

    assert run["status"] == "failed"
    assert run["error"]["type"] == error_type(openai.UpstreamAuth)
    message = run["error"]["message"]
    assert "refused the API key (401: Incorrect API key provided: ***.)" in message
    assert KEY_ENV in message and "127.0.0.1" in message
    assert SECRET not in json.dumps(run) and SECRET not in json.dumps(events)
    assert "refused the API key" in caplog.text and SECRET not in caplog.text
    assert len(fake.requests) == 1  # no retry: the key will not get better


@pytest.mark.parametrize(
    "echo",
    [
        SECRET[:-1],  # all but one character
        SECRET[-12:],  # the tail, as some servers print it
        f"sk-…{SECRET[20:30]}",  # a fragment in the middle
        "Authorization: Bearer " + SECRET[::-1],  # a header echoed back, whatever the token
    ],
    ids=["all-but-one", "tail", "fragment", "bearer"],
)
async def test_no_part_of_the_key_or_a_bearer_token_appears_in_an_upstream_error(
    api, fake, caplog, echo
):
    fake.reply(Status(400, error_body(f"Invalid request; your key {echo} is not allowed here")))
    run, events = await run_to_end(api, {"prompt": "hi"})

    assert run["status"] == "failed"
    dumped = json.dumps(run) + json.dumps(events) + caplog.text
    for start in range(len(SECRET) - 8 + 1):
        assert SECRET[start : start + 8] not in dumped
    assert SECRET[::-1][:8] not in dumped
    assert "Invalid request; your key" in run["error"]["message"]


@pytest.mark.parametrize("retry_after", ["nan", "inf", "-inf"])
async def test_a_retry_after_that_is_not_a_number_of_seconds_waits_the_backoff(
    api, fake, retry_after
):
    # A NaN handed to asyncio.sleep corrupts the server's timers: every other run would stall.
    fake.reply(
        Status(503, error_body("busy", type="server_error"), {"Retry-After": retry_after}),
        answer("Made it"),
    )
    run, events = await run_to_end(api, {"prompt": "hi"})
    assert run["status"] == "succeeded"
    retry = next(e for e in events if e["type"] == "x.upstream_retry")
    assert 0 <= retry["data"]["delay"] < 1  # c.OpenAIAgent.retry_backoff, not a minute or NaN


@pytest.mark.parametrize("status", [429, 503])
async def test_a_rate_limit_or_server_error_before_the_first_token_is_retried(api, fake, status):
    busy = error_body("slow down", type="server_error")
    fake.reply(Status(status, busy, {"Retry-After": "0"}), answer("Made it"))
    run, events = await run_to_end(api, {"prompt": "hi"})

    assert run["status"] == "succeeded", run["error"]
    assert run["output"]["text"] == "Made it" and len(fake.requests) == 2
    [retry] = of_type(events, "x.upstream_retry")
    assert retry["retry"] == 1 and retry["max_retries"] == 2 and retry["delay"] == 0
    assert f"{status}" in retry["error"]["message"]


async def test_rate_limiting_that_outlasts_the_retries_fails_upstream_rate_limit(api, fake):
    fake.reply(*[Status(429, error_body("Rate limit reached for requests")) for _ in range(3)])
    run, events = await run_to_end(api, {"prompt": "hi"})

    assert run["status"] == "failed"
    assert run["error"]["type"] == error_type(openai.UpstreamRateLimit)
    assert "429 after 3 attempts" in run["error"]["message"]
    assert "Rate limit reached" in run["error"]["message"]
    assert len(fake.requests) == 3 and len(of_type(events, "x.upstream_retry")) == 2


@pytest.mark.parametrize("openai_config", [{"request_timeout": 0.5}])
async def test_a_silent_server_fails_upstream_timeout_without_a_retry(api, fake):
    fake.reply(Hang(), answer("too late"))
    run, events = await run_to_end(api, {"prompt": "hi"})

    assert run["status"] == "failed"
    assert run["error"]["type"] == error_type(openai.UpstreamTimeout)
    assert "sent nothing for 0.5 s" in run["error"]["message"]
    assert len(fake.requests) == 1 and of_type(events, "x.upstream_retry") == []
    await asyncio.wait_for(fake.disconnected.wait(), timeout=5)


async def test_a_refused_connection_is_retried_then_fails_upstream_unreachable(api, engine):
    engine.agents["openai"].fn.base_url = closed_port_url()
    run, events = await run_to_end(api, {"prompt": "hi"})

    assert run["status"] == "failed"
    assert run["error"]["type"] == error_type(openai.UpstreamUnreachable)
    assert run["error"]["message"].startswith("cannot talk to the model server at 127.0.0.1:")
    assert len(of_type(events, "x.upstream_retry")) == 2


async def test_a_stream_that_breaks_after_the_first_token_is_not_retried(api, fake):
    fake.reply(
        Stream([chunk({"role": "assistant", "content": "Hel"})], cut=True), answer("Hello again")
    )
    run, _ = await run_to_end(api, {"prompt": "hi"})

    assert run["status"] == "failed"
    assert run["error"]["type"] == error_type(openai.UpstreamUnreachable)
    assert run["snapshot"]["messages"][0]["text"] == "Hel"  # shown once, never repeated
    assert len(fake.requests) == 1


def refused_message(index: int, message: dict, meant: str | None, problem: dict | None = None):
    """The errors pydantic gives for a chat message that fits none of the kinds of message.

    Each kind (member of the union) whose ``role`` is not the message's gets a
    literal error; ``meant``, the kind whose role matched, gets ``problem``.
    """
    errors = []
    for kind, role, required in [("System", "system", None), ("User", "user", None),
                                 ("Assistant", "assistant", None), ("Tool", "tool", "tool_call_id"),
                                 ("Function", "function", "name")]:  # fmt: skip
        where = ("body", "messages", index, f"ChatCompletionRequest{kind}Message")
        if kind == meant:
            errors.append({**problem, "loc": (*where, problem["loc"]), "input": None})
            continue
        errors.append({"type": "literal_error", "loc": (*where, "role"),
                       "msg": f"Input should be '{role}'", "input": message["role"],
                       "ctx": {"expected": f"'{role}'"}})  # fmt: skip
        if required:
            errors.append({"type": "missing", "loc": (*where, required),
                           "msg": "Field required", "input": message})  # fmt: skip
    return errors


NULL_CONTENT = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
]}  # fmt: skip


@pytest.mark.parametrize(
    "reply, says",
    [
        (
            Status(404, {"error": 'model "llama3.2" not found, try pulling it first'}),
            'answered 404: model "llama3.2" not found, try pulling it first',
        ),
        (
            Stream([{"error": {"message": "The model is overloaded", "type": "server_error"}}]),
            "reported an error: The model is overloaded",
        ),
        (
            Status(
                422,
                {
                    "detail": [
                        {
                            "type": "missing",
                            "loc": ["body", "messages"],
                            "msg": "Field required",
                            "input": {"model": "x"},
                        }
                    ]
                },
            ),
            "answered 422: invalid request (1 validation error): messages: Field required",
        ),
        (
            Status(
                400,
                llama_cpp_validation_error(
                    *refused_message(
                        1,
                        NULL_CONTENT,
                        "Assistant",
                        {
                            "type": "string_type",
                            "loc": "content",
                            "msg": "Input should be a valid string",
                        },
                    )
                ),
            ),
            (
                "answered 400: invalid request (7 validation errors): "
                "messages.1.ChatCompletionRequestAssistantMessage.content: "
                "Input should be a valid string"
            ),
        ),
    ],
    ids=["unknown-model", "error-mid-stream", "fastapi-detail", "validation-text-past-the-cut"],
)
async def test_other_upstream_errors_fail_upstream_error_with_the_servers_words(
    api, fake, reply, says
):
    fake.reply(reply)
    run, _ = await run_to_end(api, {"prompt": "hi"})

    assert run["status"] == "failed"
    assert run["error"]["type"] == error_type(openai.UpstreamError)
    assert (
        run["error"]["message"]
        == f"the model server at 127.0.0.1:{fake.url.split(':')[2][:-3]} {says}"
    )


@pytest.mark.parametrize(
    "body, says",
    [
        (
            llama_cpp_validation_error(*refused_message(1, NULL_CONTENT, "Assistant", {
                "type": "string_type", "loc": "content", "msg": "Input should be a valid string"})),
            ("invalid request (7 validation errors): "
             "messages.1.ChatCompletionRequestAssistantMessage.content: "
             "Input should be a valid string"),
        ),
        (
            llama_cpp_validation_error(
                *refused_message(0, {"role": "developer", "content": "Be brief."}, None)
            ),
            ("invalid request (7 validation errors): "
             "messages.0.ChatCompletionRequestSystemMessage.role: Input should be 'system'; "
             "messages.0.ChatCompletionRequestUserMessage.role: Input should be 'user'; "),
        ),
        (
            {"detail": [{"type": "missing", "loc": ["body", "model"], "msg": "Field required"}]},
            "invalid request (1 validation error): model: Field required",
        ),
        (
            error_body("messages.1.content: null is not allowed", type="invalid_request_error"),
            "messages.1.content: null is not allowed",
        ),
    ],
    ids=["llama-cpp-null-content", "llama-cpp-developer-role", "fastapi-detail", "invalid-request"],
)  # fmt: skip
async def test_a_500_saying_the_request_is_invalid_is_not_retried_and_says_what_is_wrong(
    api, fake, body, says
):
    fake.reply(Status(500, body), answer("never asked for"))
    run, events = await run_to_end(api, {"prompt": "hi"})

    assert run["status"] == "failed"
    assert run["error"]["type"] == error_type(openai.UpstreamError)
    assert run["error"]["message"].startswith(
        f"the model server at {fake.url[7:-3]} answered 500: {says}"
    )
    assert len(fake.requests) == 1 and of_type(events, "x.upstream_retry") == []


@pytest.mark.parametrize(
    "chunks, says",
    [
        (["{not json"], ("sent a chunk that is not JSON (Expecting property name enclosed in "
                         "double quotes): {not json")),
        (['{"choices": [{"index": 0, "delta": {"content": 42}}]}'],
         ('sent a malformed chunk (can only concatenate str (not "int") to str): '
          '{"choices":[{"delta":{"content":42},"index":0}]}')),
        ([], ("answered 200 with an empty stream (no chunk, no finish_reason); some servers "
              "(llama-cpp-python) answer so to a prompt longer than the model's context size")),
        ([chunk({"role": "assistant", "content": ""}), chunk({"content": "Hi"})],
         ("ended its stream after 2 chunk(s) (2 characters of text) with no finish_reason; "
          "another request to the same server may have interrupted this one")),
    ],
    ids=["not-json", "not-a-chunk", "empty", "no-finish"],
)  # fmt: skip
async def test_a_malformed_stream_fails_upstream_protocol_saying_what_came_and_why(
    api, fake, chunks, says
):
    fake.reply(Stream(chunks))
    run, _ = await run_to_end(api, {"prompt": "hi"})

    assert run["status"] == "failed"
    assert run["error"]["type"] == error_type(openai.UpstreamProtocol)
    assert run["error"]["message"].startswith(f"the model server at {fake.url[7:-3]} {says}")


# The example agent ----------------------------------------------------------------


async def test_the_example_weather_agent_runs_and_alerts_once(api, tmp_path, monkeypatch):
    alerts = tmp_path / "alerts.jsonl"
    monkeypatch.setenv("WEATHER_ALERTS_FILE", str(alerts))
    from weather_agent import get_weather

    cities = ["Shanghai", "Oslo"]
    coldest = min(get_weather(city)["temperature"] for city in cities)
    run, events = await run_to_end(
        api, {"cities": cities, "alert_below": coldest + 1, "delay": 0}, agent="weather"
    )

    assert run["status"] == "succeeded", run["error"]
    tools = run["snapshot"]["tools"]
    assert [t["name"] for t in tools] == ["get_weather", "get_weather", "send_alert"]
    assert all(t["status"] == "completed" for t in tools)
    assert run["snapshot"]["messages"][0]["text"].startswith(
        f"Shanghai: {get_weather('Shanghai')['temperature']} °C"
    )
    assert run["snapshot"]["progress"] == {"fraction": 1.0, "message": "done"}
    assert len(alerts.read_text().splitlines()) == 1
    assert [e["type"] for e in events][-4:] == [
        "tool.started",
        "tool.completed",
        "progress",
        "run.succeeded",
    ]


async def test_cancelling_the_example_weather_agent_sends_no_alert(api, tmp_path, monkeypatch):
    alerts = tmp_path / "alerts.jsonl"
    monkeypatch.setenv("WEATHER_ALERTS_FILE", str(alerts))
    response = await submit(
        api, agent="weather", input={"cities": ["Oslo"], "alert_below": 100, "delay": 5}
    )
    run_id = response.json()["run_id"]
    for _ in range(500):
        if (await api.get(f"runs/{run_id}")).json()["snapshot"]["tools"]:
            break
        await asyncio.sleep(0.01)
    await api.post(f"runs/{run_id}/cancel", json={"reason": "changed my mind"})
    run = await wait_run(api, run_id)

    assert run["status"] == "cancelled"
    assert run["cancel"]["stage"]["step"] == "tool get_weather running"
    assert not alerts.exists()


@pytest.mark.parametrize("openai_config", [{"tools": {"get_weather": "weather_agent:get_weather"}}])
async def test_the_example_get_weather_is_a_tool_for_the_openai_agent(api, fake):
    fake.reply(
        tool_calls(("get_weather", '{"city": "Oslo", "unit": "fahrenheit"}')), answer("Chilly.")
    )
    run, _ = await run_to_end(api, {"prompt": "Weather in Oslo?"})

    assert run["status"] == "succeeded", run["error"]
    from weather_agent import get_weather

    assert run["snapshot"]["tools"][0]["result"] == get_weather("Oslo", "fahrenheit")
    [offered] = fake.requests[0]["body"]["tools"]
    assert offered["function"]["description"] == "The current weather in a city."
    assert offered["function"]["parameters"]["properties"]["unit"] == {
        "enum": ["celsius", "fahrenheit"], "description": "the temperature's unit",
        "default": "celsius",
    }  # fmt: skip


DOCS = Path(__file__).parent.parent / "docs"


def test_the_docs_document_every_setting_and_error_type_of_the_openai_agent():
    sys.path.insert(0, str(DOCS / "_ext"))
    from agentruns_reference import settings_markdown

    reference = settings_markdown()
    section = (DOCS / "tutorials" / "connect-a-model.md").read_text()
    for name in openai.OpenAIAgent.class_traits(config=True):
        assert f"`c.OpenAIAgent.{name}`" in reference, name
    for error in (
        openai.UpstreamAuth,
        openai.UpstreamRateLimit,
        openai.UpstreamTimeout,
        openai.UpstreamUnreachable,
        openai.UpstreamProtocol,
        openai.UpstreamError,
        openai.MaxToolIterationsExceeded,
        UnknownTool,
        InvalidToolArguments,
        openai.InvalidInput,
    ):
        assert f"`{error.error_type}`" in section, error


# Tools of configured MCP servers ------------------------------------------------

MCP_SERVER = str(Path(__file__).parent / "mcp_server_for_tests.py")
WITH_MCP_SERVER = {
    "agents": {"openai": "jupyter_agentruns.agents.openai:OpenAIAgent"},
    "mcp_servers": {
        "tests": {"command": [sys.executable, MCP_SERVER], "env": {"SHOUT_SUFFIX": "!"}}
    },
}


@pytest.mark.parametrize("agentruns_config", [WITH_MCP_SERVER])
@pytest.mark.parametrize("openai_config", [{"approve_tools": ["tests__add"]}])
async def test_a_configured_mcp_servers_tools_are_offered_prefixed_and_each_call_is_a_tool_step(
    api, fake
):
    fake.reply(
        tool_calls(("tests__shout", '{"text": "hello"}'), ("tests__add", '{"a": 2, "b": 3}')),
        tool_calls(("tests__add", '{"a": 1}'), ("tests__fail", '{"reason": "no disk"}')),
        answer("Done."),
    )
    run_id = (await submit(api, agent="openai", input={"prompt": "go"})).json()["run_id"]
    # approve_tools names the tool as it is offered.
    question = await wait_question(api, run_id, 1)
    assert question["details"] == {"tool": "tests__add", "arguments": {"a": 2, "b": 3}}
    await api.post(f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": "approve"})
    question = await wait_question(api, run_id, 2)
    await api.post(f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": "approve"})
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded", run["error"]

    offered = {
        tool["function"]["name"]: tool["function"] for tool in fake.requests[0]["body"]["tools"]
    }
    assert {"tests__add", "tests__shout", "add", "get_weather"} <= set(offered)
    assert offered["tests__add"]["description"] == "Add two numbers."
    assert offered["tests__add"]["parameters"]["required"] == ["a", "b"]
    steps = run["snapshot"]["tools"]
    assert [(step["name"], step["status"]) for step in steps] == [
        ("tests__shout", "completed"),
        ("tests__add", "completed"),
        ("tests__add", "failed"),
        ("tests__fail", "failed"),
    ]
    # The server's env reached it; the results are what the model reads.
    assert steps[0]["result"] == "HELLO!" and steps[1]["result"] == "5"
    assert steps[2]["error"]["type"] == "invalid_arguments"  # checked against its schema
    assert steps[3]["error"]["type"] == "mcp_tool_error"
    assert "no disk" in steps[3]["error"]["message"]
    replies = [m["content"] for m in fake.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert replies == ["HELLO!", "5"]
    assert tools_for_tests.calls == []  # the registered add was not called


@pytest.mark.parametrize("agentruns_config", [WITH_MCP_SERVER])
async def test_an_input_chooses_and_forces_mcp_servers_tools_by_their_offered_names(api, fake):
    fake.reply(tool_calls(("tests__shout", '{"text": "hi"}')), answer("Done."))
    input = {
        "prompt": "go",
        "tools": ["tests__shout", "get_weather"],
        "tool_choice": "tests__shout",
    }
    run = await wait_run(api, (await submit(api, agent="openai", input=input)).json()["run_id"])
    assert run["status"] == "succeeded", run["error"]
    offered = [tool["function"]["name"] for tool in fake.requests[0]["body"]["tools"]]
    assert offered == ["tests__shout", "get_weather"]  # only these, in the input's order
    forced = fake.requests[0]["body"]["tool_choice"]
    assert forced == {"type": "function", "function": {"name": "tests__shout"}}
    assert run["snapshot"]["tools"][0]["result"] == "HI!"

    # A configured server's name with a tool it does not list: the run, which lists
    # them, fails before any model call, naming the tools there are.
    asked = len(fake.requests)
    input = {"prompt": "go", "tools": ["tests__whisper"]}
    run = await wait_run(api, (await submit(api, agent="openai", input=input)).json()["run_id"])
    assert run["status"] == "failed" and run["error"]["type"] == "invalid_input"
    assert "'tests__whisper'" in run["error"]["message"]
    assert "tests__shout" in run["error"]["message"]
    assert len(fake.requests) == asked

    # Another server's name is refused at submit, where no run is made.
    before = (await api.get("runs")).json()["runs"]
    for bad in ({"tools": ["other__shout"]}, {"tool_choice": "other__shout"}):
        refused = await submit(api, agent="openai", input={"prompt": "go", **bad})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == "invalid_input"
    assert (await api.get("runs")).json()["runs"] == before


def test_without_mcp_servers_the_input_names_no_server_tool():
    from jupyter_agentruns.agents.openai.conversation import input_schema

    def valid(schema, input):
        return jsonschema.Draft202012Validator(schema).is_valid({"prompt": "p", **input})

    without = input_schema(["add"], ["run_code"])
    assert valid(without, {"tools": ["add"], "tool_choice": "run_code"})
    assert not valid(without, {"tools": ["tests__shout"]})
    assert not valid(without, {"tool_choice": "tests__shout"})
    with_servers = input_schema(["add"], [], ["tests", "my_files-2"])
    assert valid(with_servers, {"tools": ["add", "my_files-2__read"], "tool_choice": "tests__x"})
    assert not valid(with_servers, {"tools": ["tests__"]})
    assert not valid(with_servers, {"tool_choice": "run_code"})  # no notebook tools here
    assert not valid(with_servers, {"tools": ["tests__" + "x" * 60]})  # over 64 characters


def test_the_loader_gives_the_openai_agent_the_mcp_servers_whose_tools_an_input_may_name():
    import logging

    from jupyter_agentruns.agents import load_agents

    configured = {"openai": "jupyter_agentruns.agents.openai:OpenAIAgent"}
    servers = {"tests": {"command": ["x"]}}
    agents, _ = load_agents(configured, logging.getLogger(), mcp_servers=servers)
    schema = agents["openai"].input_schema
    assert jsonschema.Draft202012Validator(schema).is_valid({"prompt": "p", "tools": ["tests__x"]})
    agents, _ = load_agents(configured, logging.getLogger())  # none configured: none named
    schema = agents["openai"].input_schema
    assert not jsonschema.Draft202012Validator(schema).is_valid(
        {"prompt": "p", "tools": ["tests__x"]}
    )


async def test_an_mcp_tool_is_redone_on_resume_only_where_its_server_says_it_is_harmless():
    from jupyter_agentruns.agents.mcp_client import mcp_tools

    servers = {"tests": {"command": [sys.executable, MCP_SERVER]}}
    async with mcp_tools(servers) as tools:
        # add says it is read-only; the others say nothing.
        assert {name: spec.idempotent for name, spec in tools.items()} == {
            "tests__add": True,
            "tests__shout": False,
            "tests__fail": False,
            "tests__wait": False,
            "tests__header": False,
            "tests__traced": False,
            "tests__variable": False,
        }
        assert await tools["tests__add"].call({"a": 20, "b": 22}) == "42"


@pytest.mark.parametrize(
    "agentruns_config",
    [
        {
            "agents": {"openai": "jupyter_agentruns.agents.openai:OpenAIAgent"},
            "mcp_servers": {
                "tests": {"command": [sys.executable, MCP_SERVER]},
                "gone": {"command": [sys.executable, "-c", "import sys; sys.exit(3)"]},
            },
        }
    ],
)
async def test_an_mcp_server_that_cannot_start_fails_the_run_naming_it_before_any_model_call(
    api, fake
):
    run, _ = await run_to_end(api, {"prompt": "go"})
    assert run["status"] == "failed"
    assert run["error"]["type"] == "mcp_server_failed"
    assert "the MCP server 'gone' (c.AgentRuns.mcp_servers)" in run["error"]["message"]
    assert fake.requests == []


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"command": []}, "'command' is the program"),
        ({"command": ["x"], "url": "http://h/mcp"}, "either a 'command'"),
        ({}, "either a 'command'"),
        ({"url": "ftp://h/mcp"}, "'url' is the server's http"),
        ({"url": "http://h/mcp", "env": {}}, "unknown keys ['env']"),
        ({"command": ["x"], "env": {"A": 1}}, "'env' maps"),
        ({"url": "http://h/mcp", "headers": {"A": 1}}, "'headers' maps"),
    ],
)
def test_a_bad_mcp_servers_entry_is_refused_at_start_saying_what_is_wrong(entry, said):
    from jupyter_agentruns.settings import from_values

    with pytest.raises(TraitError) as refused:
        from_values({"mcp_servers": {"files": entry}})
    assert "c.AgentRuns.mcp_servers['files']" in str(refused.value)
    assert said in str(refused.value)


@pytest.mark.parametrize("name", ["a__b", "", "jupyter-notebook", "x" * 33, "a b"])
def test_an_mcp_server_name_that_cannot_start_a_tool_name_is_refused(name):
    from jupyter_agentruns.settings import from_values

    with pytest.raises(TraitError):
        from_values({"mcp_servers": {name: {"command": ["x"]}}})
    ok = from_values({"mcp_servers": {"my_files-2": {"url": "https://h/mcp", "headers": {}}}})
    assert ok.mcp_servers == {"my_files-2": {"url": "https://h/mcp", "headers": {}}}


@pytest.mark.parametrize("agentruns_config", ["mcp over http"], indirect=True)
async def test_an_mcp_server_reached_by_url_gets_its_headers(api, fake):
    fake.reply(
        tool_calls(("web__header", '{"name": "x-key"}'), ("web__add", '{"a": 2, "b": 2}')),
        answer("Done."),
    )
    run, _ = await run_to_end(api, {"prompt": "go"})
    assert run["status"] == "succeeded", run["error"]
    assert [step["result"] for step in run["snapshot"]["tools"]] == ["k1", "4"]


def mcp_test_servers() -> list[int]:
    """The pids of the test MCP servers this process (its in-process server) runs now."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit():
                continue
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if (
                parent == os.getpid()
                and b"mcp_server_for_tests" in (entry / "cmdline").read_bytes()
            ):
                pids.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            pass
    return pids


@pytest.mark.parametrize("agentruns_config", [WITH_MCP_SERVER])
async def test_cancelling_a_run_in_an_mcp_tool_call_ends_it_and_its_server_at_once(api, fake):
    fake.reply(tool_calls(("tests__wait", '{"seconds": 30}')), answer("Never."))
    run_id = (await submit(api, agent="openai", input={"prompt": "wait"})).json()["run_id"]
    for _ in range(500):
        run = (await api.get(f"runs/{run_id}")).json()
        if run["snapshot"]["tools"]:
            break
        await asyncio.sleep(0.01)
    assert run["snapshot"]["tools"][0]["name"] == "tests__wait"
    assert mcp_test_servers()  # its server runs
    started = asyncio.get_running_loop().time()
    assert (await api.post(f"runs/{run_id}/cancel")).status_code in (200, 202)
    run = await wait_run(api, run_id)
    assert run["status"] == "cancelled"
    assert asyncio.get_running_loop().time() - started < 10
    for _ in range(500):
        if not mcp_test_servers():
            break
        await asyncio.sleep(0.01)
    assert not mcp_test_servers()  # the server started for the run is gone


# A real MCP server of the ecosystem: npm's @modelcontextprotocol/server-filesystem, which
# scripts/test installs into a cache outside the clone and names in
# AGENTRUNS_TEST_MCP_FILESYSTEM; without it these tests skip (in CI they fail).

SALES = "city,units\nParis,3\nLyon,9\n"


def filesystem_server() -> str:
    path = os.environ.get("AGENTRUNS_TEST_MCP_FILESYSTEM", "")
    if not path or not os.access(path, os.X_OK):
        reason = (
            "needs @modelcontextprotocol/server-filesystem: AGENTRUNS_TEST_MCP_FILESYSTEM"
            " names it (scripts/test installs it)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the tests with a real MCP server: {reason}")
        pytest.skip(reason)
    return path


@pytest.fixture
def files_data(tmp_path):
    """The one folder the filesystem server may touch, with a CSV file in it."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "sales.csv").write_text(SALES)
    return data.resolve()


@pytest.fixture
def files_mcp_server(files_data):
    """The command that starts the filesystem server on ``files_data``."""
    return [filesystem_server(), str(files_data)]


def path_arguments(path, **more) -> str:
    return json.dumps({"path": str(path), **more})


@pytest.mark.parametrize("agentruns_config", ["filesystem"], indirect=True)
@pytest.mark.parametrize("openai_config", [{"approve_tools": ["files__write_file"]}])
async def test_a_real_filesystem_mcp_server_reads_and_writes_for_the_agent_once_approved(
    api, fake, files_data
):
    best, other = files_data / "best.txt", files_data / "other.txt"
    fake.reply(
        tool_calls(("files__list_directory", path_arguments(files_data))),
        tool_calls(
            ("files__read_text_file", path_arguments(files_data / "sales.csv")),
            ("files__read_text_file", path_arguments("/etc/hostname")),
        ),
        tool_calls(("files__write_file", path_arguments(best, content="Lyon"))),
        tool_calls(("files__write_file", path_arguments(other, content="Paris"))),
        answer("Lyon sold the most."),
    )
    run_id = (await submit(api, agent="openai", input={"prompt": "Who sold most?"})).json()[
        "run_id"
    ]
    question = await wait_question(api, run_id, 1)
    assert question["details"] == {
        "tool": "files__write_file",
        "arguments": {"path": str(best), "content": "Lyon"},
    }
    assert not best.exists()  # nothing is written before the person says so
    await api.post(f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": "approve"})
    question = await wait_question(api, run_id, 2)
    await api.post(f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": "deny"})
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded", run["error"]

    # The server's own tools, as it describes them, offered under its configured name.
    offered = {
        tool["function"]["name"]: tool["function"] for tool in fake.requests[0]["body"]["tools"]
    }
    assert {"files__read_text_file", "files__write_file", "files__list_directory"} <= set(offered)
    assert "file" in offered["files__read_text_file"]["description"].lower()
    assert "path" in offered["files__read_text_file"]["parameters"]["required"]
    steps = run["snapshot"]["tools"]
    assert [(step["name"], step["status"]) for step in steps] == [
        ("files__list_directory", "completed"),
        ("files__read_text_file", "completed"),
        ("files__read_text_file", "failed"),
        ("files__write_file", "completed"),
        ("files__write_file", "failed"),
    ]
    assert "[FILE] sales.csv" in steps[0]["result"]
    assert steps[1]["result"] == SALES
    # Outside its folder the server refuses, and the run says so as the tool's error.
    assert steps[2]["error"]["type"] == "mcp_tool_error"
    assert "access denied" in steps[2]["error"]["message"].lower()
    assert steps[4]["error"]["type"] == "denied"
    assert best.read_text() == "Lyon" and not other.exists()
    replies = [m["content"] for m in fake.requests[2]["body"]["messages"] if m["role"] == "tool"]
    assert replies[1] == SALES and "access denied" in replies[2].lower()


async def test_a_real_mcp_servers_calls_are_redone_on_resume_as_its_annotations_say(files_data):
    from jupyter_agentruns.agents.mcp_client import mcp_tools

    servers = {"files": {"command": [filesystem_server(), str(files_data)]}}
    async with mcp_tools(servers) as tools:
        idempotent = {name: spec.idempotent for name, spec in tools.items()}
        # read-only tools, and a write of a whole file (idempotent, it says), may be redone;
        # an edit or a move may not.
        assert idempotent["files__read_text_file"] is True
        assert idempotent["files__list_directory"] is True
        assert idempotent["files__write_file"] is True
        assert idempotent["files__edit_file"] is False
        assert idempotent["files__move_file"] is False
        read = await tools["files__read_text_file"].call({"path": str(files_data / "sales.csv")})
        assert read == SALES
