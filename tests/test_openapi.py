"""The OpenAPI document: valid, in step with the handlers, and true to a fuzzed server."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis.engine import Status, events

import jupyter_agentruns
from jupyter_agentruns import handlers
from jupyter_agentruns.domain import RunObject
from jupyter_agentruns.errors import ErrorCode
from jupyter_agentruns.handlers.base import NotFoundHandler

PACKAGE = Path(jupyter_agentruns.__file__).parent
DOCUMENT = json.loads((PACKAGE / "openapi.json").read_text())
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
PREFIX = "api/agentruns"

FUZZED_SERVER = {
    # Fuzzed demo runs stay cheap: `delay` up to 10 s and `chunks` up to 100000 are valid input.
    "max_run_seconds": 2,
    "max_active_runs_per_user": 4,
    # Retention within the fuzzing, so that snapshots and 410s are answered too.
    "event_retention_seconds": 1,
    "max_retained_events": 20,
    "run_retention_seconds": 2,
    # Fuzzed hooks' hosts are not looked up (nor refused as private).
    "webhooks_allow_private": True,
}
MAX_EXAMPLES = 30  # per operation and phase: about 360 requests in all, in about 6 s
FUZZ_SECONDS = 40


def route_template(route: str) -> str:
    """A tornado route as an OpenAPI path.

    ``api/agentruns/runs/(?P<run_id>[^/]+)`` becomes ``/runs/{run_id}``.
    """
    assert route.startswith(PREFIX + "/"), route
    template = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", route[len(PREFIX) :]).replace(r"\.", ".")
    assert not set(template) & set("()[]*+?|^$\\"), f"cannot read {route!r} as a path template"
    return template


def implemented_methods(handler: type) -> set[str]:
    """The methods a handler answers itself, not the 405 or the CORS preflight it inherits."""
    ours = [cls for cls in handler.__mro__ if cls.__module__.startswith("jupyter_agentruns.")]
    return {method for method in HTTP_METHODS if any(method in vars(cls) for cls in ours)}


def registered_operations() -> set[tuple[str, str]]:
    return {
        (route_template(route), method)
        for route, handler in handlers.default_handlers
        if handler is not NotFoundHandler
        for method in implemented_methods(handler)
    }


def documented_operations() -> set[tuple[str, str]]:
    return {
        (path, method)
        for path, item in DOCUMENT["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def walk(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from walk(child)


def resolve(ref: str):
    node = DOCUMENT
    for part in ref.removeprefix("#/").split("/"):
        assert part in node, f"{ref} does not resolve"
        node = node[part]
    return node


def documented_error_codes() -> set[str]:
    return {
        code
        for node in walk(DOCUMENT)
        if isinstance(node, dict) and set(node.get("properties", {})) >= {"error"}
        for code in node["properties"]["error"].get("enum", [])
    }


def raised_error_codes() -> set[str]:
    """Every code the package's Problems and error handler can answer with (its ErrorCode)."""
    return {code.value for code in ErrorCode}


def test_the_document_is_valid_openapi():
    schema = schemathesis.openapi.from_dict(DOCUMENT)
    schema.validate()  # against the OpenAPI meta-schema
    broken = [str(result.err()) for result in schema.get_all_operations() if hasattr(result, "err")]
    assert not broken, broken
    for node in walk(DOCUMENT):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            resolve(node["$ref"])


def test_the_document_versions_with_the_package():
    assert DOCUMENT["info"]["version"] == jupyter_agentruns.__version__


def test_the_document_lists_exactly_the_registered_handlers():
    registered, documented = registered_operations(), documented_operations()
    assert not registered - documented, (
        f"handlers missing from openapi.json: {sorted(registered - documented)}"
    )
    assert not documented - registered, (
        f"openapi.json operations with no handler: {sorted(documented - registered)}"
    )


def test_a_route_reads_as_a_path_template():
    assert route_template(r"api/agentruns/runs/(?P<run_id>[^/]+)/events") == "/runs/{run_id}/events"
    assert route_template(r"api/agentruns/openapi\.json") == "/openapi.json"


def test_every_error_code_the_server_raises_is_documented():
    missing = raised_error_codes() - documented_error_codes()
    assert not missing, f"error codes missing from openapi.json: {sorted(missing)}"


def test_the_run_schema_names_the_fields_of_the_run_object_type():
    schema = DOCUMENT["components"]["schemas"]["Run"]
    assert set(schema["required"]) == set(schema["properties"]) == set(RunObject.__annotations__)


def test_every_operation_documents_403_and_json_errors():
    for path, method in documented_operations():
        for status, response in DOCUMENT["paths"][path][method]["responses"].items():
            response = resolve(response["$ref"]) if "$ref" in response else response
            if int(status) >= 400:
                assert list(response["content"]) == ["application/json"], (
                    f"{method.upper()} {path} {status}"
                )
        assert "403" in DOCUMENT["paths"][path][method]["responses"], f"{method.upper()} {path}"


async def test_the_document_is_served_with_this_servers_prefix(api, api_url):
    response = await api.get("openapi.json")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    served = response.json()
    assert served["servers"] == [{"url": urlsplit(api_url).path.rstrip("/")}]
    assert {**served, "servers": DOCUMENT["servers"]} == DOCUMENT


async def test_the_document_needs_credentials_like_the_rest_of_the_api(api_url):
    async with httpx.AsyncClient() as anonymous:
        response = await anonymous.get(api_url + "openapi.json")
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"


def fuzz_config(base_url: str, token: str) -> schemathesis.Config:
    # Without max-time the engine runs each phase once, max-examples per operation;
    # fuzz() adds a deadline.
    return schemathesis.Config.from_dict(
        {
            "base-url": base_url,
            "headers": {"Authorization": f"token {token}"},
            "request-timeout": 40,  # `wait` may be up to 30 s
            # A fixed seed: CI explores the same cases every time (change it to explore more).
            "seed": 20261129,
            "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
            "checks": {
                # It demands 401 when `Authorization` is missing; jupyter_server answers 403,
                # which ignored_auth accepts and checks.
                "missing_required_header": {"enabled": False},
                # Any request about a run retention deleted is 410, as one about no run is 404.
                "positive_data_acceptance": {
                    "expected-statuses": ["2xx", "403", "404", "409", "410", "429"]
                },
                "negative_data_rejection": {
                    "expected-statuses": [
                        "400",
                        "401",
                        "403",
                        "404",
                        "405",
                        "406",
                        "409",
                        "410",
                        "415",
                        "422",
                        "428",
                        "429",
                    ]
                },
            },
            "operations": [
                {
                    # The MCP endpoint speaks the MCP SDK's JSON-RPC transport, with its
                    # own errors: test_notebook_tools.py talks to it with the SDK's client.
                    "include-tag": "notebook tools",
                    "enabled": False,
                },
                {
                    # Whether `input` is valid depends on the agent's own schema (GET agents),
                    # whether a key is free on the submits before it.
                    "include-operation-id": "submitRun",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "400", "403", "404", "422", "429"]
                        }
                    },
                },
                {
                    # Whether a run can be forked is its agent's to say (422 fork_unsupported),
                    # and whether at_seq is within it, or the merged input valid, is the run's (400).
                    "include-operation-id": "forkRun",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "400", "403", "404", "410", "422", "429"]
                        }
                    },
                },
                {
                    # Whether a cron expression, a time zone or an input is valid is
                    # croniter's, zoneinfo's and the agent's to say: 400.
                    "include-operation-id": "createSchedule",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "400", "403", "404", "429"]
                        }
                    },
                },
                {
                    # The JSON long-poll; SSE on this path is test_events.py's.
                    "include-operation-id": "getRunEvents",
                    "headers": {"Accept": "application/json"},
                },
                {
                    # `before` is opaque: only the server's own `next` is a cursor,
                    # a forged one is 400.
                    "include-operation-id": "listRuns",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "403"]}
                    },
                },
                {
                    # The same for the conversations; and a notebook path with `..` is 400.
                    "include-operation-id": "listConversations",
                    "checks": {
                        "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "403"]}
                    },
                },
                {
                    # A run listed twice is 400, which the parameter's pattern cannot say.
                    "include-operation-id": "streamRuns",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "400", "403", "429"]
                        }
                    },
                },
            ],
        }
    )


def tornado_argument(value: str) -> str:
    """A query argument as tornado hands it to a handler.

    Control characters are blanked, then the value is stripped.
    """
    return re.sub(r"[\x00-\x08\x0e-\x1f]", " ", value).strip()


# Put into the generated path parameters and bodies: NUL (which PostgreSQL refuses in
# text), other control characters, separators, a byte order mark, a non-character, an
# emoji, a combining accent, and text that looks like escapes.
ODD_CHARACTERS = (
    "\x00", "\x01", "\x1f", "\x7f", "\x85", "\u2028", "\ufeff", "\uffff", "\U0001f600",
    "\u0301", "\r\n", "%00", "\\u0000",
)  # fmt: skip


def texts(value, *, keys: bool):
    """Every string of a JSON value, with or without its keys."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, child in value.items():
            if keys:
                yield key
            yield from texts(child, keys=keys)
    elif isinstance(value, list):
        for child in value:
            yield from texts(child, keys=keys)


def carries_nul(body: bytes | str | None) -> bool:
    """Whether a JSON request body holds a NUL in one of its strings."""
    try:
        value = json.loads(body or "null")
    except ValueError:
        return False
    return any("\x00" in text for text in texts(value, keys=True))


def with_odd_text(value, index: int, odd: str, at: int):
    """A copy of ``value`` with ``odd`` put at ``at`` into its ``index``-th string (not a key).

    Keys stay: a field's name with an odd character in it is an unknown field.
    """
    counter = itertools.count()

    def text(string: str) -> str:
        return string[:at] + odd + string[at:] if next(counter) == index else string

    def copy(item):
        if isinstance(item, str):
            return text(item)
        if isinstance(item, dict):
            return {key: copy(child) for key, child in item.items()}
        if isinstance(item, list):
            return [copy(child) for child in item]
        return item

    return copy(value)


@st.composite
def sometimes_odd(draw, value):
    """``value`` as generated two times in three, else with an odd character in one of its strings."""
    count = sum(1 for _ in texts(value, keys=False))
    if not count or draw(st.integers(0, 2)):
        return value
    index, odd = draw(st.integers(0, count - 1)), draw(st.sampled_from(ODD_CHARACTERS))
    return with_odd_text(value, index, odd, at=draw(st.integers(0, 30)))


def odd_path_parameters(context, parameters: dict | None):
    """Path parameters, sometimes with an odd character in one (their names stay)."""
    if not parameters:
        return st.just(parameters)
    names = list(parameters)
    values = sometimes_odd([parameters[name] for name in names])
    return values.map(lambda values: dict(zip(names, values, strict=True)))


def nul_refused(failure, response) -> bool:
    """A 400 for a NUL in a body the schema allows: refused on purpose, on every store."""
    if failure.code != "ST202" or response is None or response.status_code != 400:
        return False
    answer = json.loads(response.content)
    return (
        carries_nul(response.request.body)
        and answer["error"] == "invalid_request"
        and "NUL" in answer["message"]
    )


def as_designed(failure, response) -> bool:
    """Requests the server rightly answers otherwise than the schema says, for reasons it cannot state."""
    if nul_refused(failure, response):
        return True
    request = response.request if response is not None else None
    invalid = re.search(r"parameter `([\w-]+)` in query", failure.message)
    if failure.code != "ST201" or request is None or invalid is None:
        return False
    name = invalid.group(1)
    # `Last-Event-ID` wins over `after`: an invalid `after` beside it is ignored.
    if name == "after" and request.headers.get("Last-Event-ID"):
        return True
    # Tornado strips arguments, so a blank value is an absent one and " 5" is 5.
    values = parse_qs(urlsplit(request.url).query, keep_blank_values=True).get(name, [])
    return any(tornado_argument(value) != value for value in values)


def fuzz(base_url: str, token: str) -> tuple[list[str], list[str]]:
    """Run every schemathesis phase once against the server; returns (failures, what ran)."""
    schema = schemathesis.openapi.from_dict(DOCUMENT, config=fuzz_config(base_url, token))
    schema.hooks.register_hook_with_name(odd_path_parameters, "flatmap_path_parameters")
    schema.hooks.register_hook_with_name(lambda context, body: sometimes_odd(body), "flatmap_body")
    failures: list[str] = []
    summary: list[str] = []
    requests = 0
    odd = {"paths": 0, "bodies": 0}  # requests that carried a NUL
    deadline = time.monotonic() + FUZZ_SECONDS
    stream = schemathesis.engine.from_schema(schema).execute()
    for event in stream:
        if time.monotonic() > deadline and not stream.stop_event.is_set():
            summary.append(f"stopped at the {FUZZ_SECONDS} s deadline")
            stream.stop()
        if isinstance(event, events.PhaseFinished):
            summary.append(f"{event.phase.name.value}: {event.status.value}")
        elif isinstance(event, events.NonFatalError):
            failures.append(f"{event.label}: schemathesis error: {event.info.format()}")
        elif isinstance(event, events.FatalError):
            failures.append(f"schemathesis failed: {event.exception!r}")
        elif isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            requests += len(recorder.interactions)
            for interaction in recorder.interactions.values():
                odd["paths"] += "%00" in interaction.request.uri.split("?")[0]
                odd["bodies"] += carries_nul(interaction.request.body)
            if event.status != Status.FAILURE:
                continue
            for case_id, checks in recorder.checks.items():
                interaction = recorder.interactions.get(case_id)
                response = interaction.response if interaction else None
                for check in checks:
                    if check.failure_info is None:
                        continue
                    failure = check.failure_info.failure
                    if as_designed(failure, response):
                        continue
                    answer = (
                        f"{response.status_code} {response.content[:600].decode(errors='replace')}"
                        if response is not None
                        else "no response"
                    )
                    failures.append(
                        f"{recorder.label} [{failure.code} {failure.title}] {failure.message}\n"
                        f"  -> {answer}\n  {check.failure_info.code_sample}"
                    )
    summary.append(f"{requests} requests, NUL in {odd['paths']} paths and {odd['bodies']} bodies")
    if not (odd["paths"] and odd["bodies"]):
        failures.append(f"too few requests carried a NUL: {summary[-1]}")
    return failures, summary


@pytest.mark.timeout(110)
@pytest.mark.parametrize("agentruns_config", [FUZZED_SERVER])
async def test_the_server_keeps_to_the_document_under_fuzzing(api_url, token):
    # The server runs on this event loop: the fuzzer's blocking requests go from a thread.
    failures, summary = await asyncio.get_running_loop().run_in_executor(
        None, fuzz, api_url.rstrip("/"), token
    )
    unique = list(dict.fromkeys(failures))
    assert not unique, f"{len(unique)} failure(s) ({'; '.join(summary)}):\n\n" + "\n\n".join(unique)


@pytest.mark.parametrize(
    "before",
    [
        str(2**63),
        "MjAyNi0wMS0wMVQwMDowMDowMC4wMDBafHg",
        "\x81",
        "%%%",
        # A cursor's two parts with a newline after either.
        "MjAyNi0wMS0wMVQwMDowMDowMFoKfHJ1bl94",
        "MjAyNi0wMS0wMVQwMDowMDowMFp8cnVuX3gK",
    ],
)
async def test_a_before_cursor_the_server_did_not_make_is_a_400(api, before):
    response = await api.get("runs", params={"before": before})
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_request"


async def test_405_names_the_allowed_methods(api):
    response = await api.request("TRACE", "runs")
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"
    allowed = set(response.headers.get("Allow", "").replace(" ", "").split(","))
    assert allowed - {"OPTIONS"} == {"GET", "POST"}
