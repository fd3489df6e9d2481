"""Fixtures: a real Jupyter server with the extension, a real store, real HTTP on loopback.

Every test that starts a server runs twice, once on each store: SQLite (a
file of the test's own) and PostgreSQL (a schema of the test's own in a
database of the test session's own, dropped after). Without a PostgreSQL
server the PostgreSQL runs skip with one reason, except in CI, where they fail.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from servers import TLS

pytest_plugins = ["pytest_jupyter.jupyter_server"]

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (browser tests screenshot failures)."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


# Files whose tests share a server, a browser or a model of the file's own (a module-
# or session-scoped fixture of the file): under pytest-xdist their tests stay on one
# worker, which starts it once; every other test goes to the first free worker.
SHARED_FILES = {
    "test_acp_bridge.py",
    "test_acp_realagent.py",
    "test_browser.py",
    "test_browser_provenance.py",
    "test_browser_pages.py",
    "test_browser_conversations.py",
    "test_browser_collaboration.py",
    "test_copy.py",
    "test_hub.py",
    "test_labextension.py",
    "test_mcp_runs.py",
    "test_notebook_edits.py",
    "test_notebook_tools.py",
    "test_open_pages.py",
    "test_openai_realmodel.py",
    "test_outage.py",
    "test_panel.py",
    "test_permissions.py",
    "test_schedules.py",
    "test_secrets.py",
    "test_shared_document.py",
    "test_silence_views.py",
    "test_traces.py",
}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: nothing without it
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedFilesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path.rsplit("/", 1)[-1] in SHARED_FILES else nodeid

    return SharedFilesTogether(config, log)


def _shares_a_fixture_of_its_file(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        definition.scope in ("module", "package", "session")
        and definition.baseid.endswith(".py")  # a file's own (conftest's: one per worker)
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


def pytest_collection_modifyitems(config, items):
    unlisted = {
        item.path.name
        for item in items
        if item.path.name not in SHARED_FILES and _shares_a_fixture_of_its_file(item)
    }
    if unlisted:
        raise pytest.UsageError(f"add {sorted(unlisted)} to SHARED_FILES in tests/conftest.py")
    # The longest first (the workers take the next test as they free up): a two-minute
    # test started last would keep the others waiting for it at the end.
    order = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))


# Files with tests of a minute or more (kills, restarts, a browser), the longest
# first: see --durations. (pytest-xdist hands out the shared files first anyway.)
LONGEST_FIRST = [
    "test_resume.py",
    "test_faults.py",
    "test_browser.py",
    "test_browser_conversations.py",
    "test_browser_provenance.py",
    "test_labextension.py",
    "test_mcp_runs.py",
    "test_served_owners.py",
    "test_notebook_api.py",
    "test_openai_realmodel.py",
    "test_copy.py",
    "test_acp_realagent.py",
    "test_hub.py",
]


@pytest.fixture
def fake(jp_asyncio_loop):
    """A scripted OpenAI-compatible server on loopback (``fake_openai``), for the test's time."""
    from fake_openai import FakeOpenAI

    server = FakeOpenAI()
    jp_asyncio_loop.run_until_complete(server.start())
    yield server
    jp_asyncio_loop.run_until_complete(server.stop())


def picture(name: str) -> str:
    """Where a browser test saves a screenshot: ``AGENTRUNS_SCREENSHOTS`` (``docs`` to
    refresh the pictures of the docs) or ``test-artifacts/``, never a tracked file by default."""
    folder = os.environ.get("AGENTRUNS_SCREENSHOTS") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "test-artifacts"
    )
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, name)


POSTGRES_URL = os.environ.get(
    "AGENTRUNS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
STORES = ("sqlite", "postgres")
_schemas = itertools.count(1)


def pytest_generate_tests(metafunc):
    """Each test of a server runs on both stores (``sqlite_only`` ones on SQLite alone)."""
    if "store_kind" in metafunc.fixturenames:
        marked = metafunc.definition.get_closest_marker
        if marked("own_store") is not None:
            return
        stores = STORES[:1] if marked("sqlite_only") is not None else STORES
        metafunc.parametrize("store_kind", stores, indirect=True)


@pytest.fixture
def store_kind(request):
    return getattr(request, "param", "sqlite")


@pytest.fixture(scope="session")
def postgres_database():
    """The URL of a database of this test session's own, dropped at its end."""
    try:
        import psycopg

        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    except Exception as exc:
        reason = f"no PostgreSQL at {POSTGRES_URL} ({type(exc).__name__}); set AGENTRUNS_TEST_POSTGRES_URL"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI must run the PostgreSQL tests")
        pytest.skip(reason)
    name = f"agentruns_test_{os.getpid()}_{secrets.token_hex(3)}"
    admin.execute(f"CREATE DATABASE {name}")
    yield urlunsplit(urlsplit(POSTGRES_URL)._replace(path="/" + name))
    admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
    admin.close()


@pytest.fixture
def postgres_url(postgres_database):
    """A store URL of the test's own: a fresh schema in the session's database."""
    return f"{postgres_database}?schema=t{next(_schemas)}"


@pytest.fixture
def store_config(store_kind, request):
    """The ``c.AgentRuns`` settings that choose the test's store."""
    if store_kind == "postgres":
        return {"store_url": request.getfixturevalue("postgres_url")}
    return {}


@pytest.fixture
def make_store(store_kind, tmp_path, request):
    """A function making the test's store (the same one each call), SQLite or PostgreSQL."""
    from jupyter_agentruns.store.postgres import PostgresStore
    from jupyter_agentruns.store.sqlite import SQLiteStore

    url = request.getfixturevalue("postgres_url") if store_kind == "postgres" else None

    def make():
        if url is not None:
            return PostgresStore(url)
        return SQLiteStore(tmp_path / "store.sqlite3", "NORMAL")

    return make


@pytest.fixture
def agentruns_config():
    """Per-test ``c.AgentRuns`` settings; override with ``@pytest.mark.parametrize``."""
    return {}


@pytest.fixture
def server_config():
    """Per-test ``c.ServerApp`` settings."""
    return {}


@pytest.fixture
def jp_server_config(agentruns_config, server_config, store_config):
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agentruns": True}, **server_config},
        "AgentRuns": {"heartbeat_interval": 0.5, **store_config, **agentruns_config},
    }


@pytest.fixture
def engine(jp_serverapp):
    return jp_serverapp.web_app.settings["agentruns_engine"]


@pytest.fixture
def api_url(jp_serverapp, http_server, jp_http_port, jp_base_url):
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}api/agentruns/"


@pytest.fixture
def token(jp_serverapp):
    return jp_serverapp.identity_provider.token


@pytest.fixture
def api(api_url, token, jp_asyncio_loop):
    """An httpx client for the API, authenticated with the server's token."""
    client = httpx.AsyncClient(
        base_url=api_url, headers={"Authorization": f"token {token}"}, timeout=30, verify=TLS
    )
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


# The test MCP server (tests/mcp_server_for_tests.py), over stdio or Streamable HTTP.
MCP_SERVER = str(Path(__file__).with_name("mcp_server_for_tests.py"))


@pytest.fixture
def http_mcp_server(tmp_path):
    """The test MCP server over Streamable HTTP, in a process of its own: its URL.

    It is taken to listen once it says so (uvicorn's "running on"): a test's
    process that took the port meanwhile would answer a mere connection, and
    then the server, which could not bind, starts again on another port.
    """
    from servers import free_port

    for attempt in range(3):
        port = free_port()
        log = tmp_path / f"mcp-server-{attempt}.log"
        with open(log, "wb") as output:
            process = subprocess.Popen(
                [sys.executable, MCP_SERVER, str(port)], stdout=output, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 20
        while process.poll() is None and b"Uvicorn running on" not in log.read_bytes():
            assert time.monotonic() < deadline, "it did not start"
            time.sleep(0.02)
        if process.poll() is None:
            break
        assert b"address already in use" in log.read_bytes(), log.read_text()
    else:
        pytest.fail("three ports in a row were taken")
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait(10)


class LoopTurns:
    """Counts the event loop's turns while inside ``async with LoopTurns() as turns``."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Future | None = None

    async def _tick(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> LoopTurns:
        self._task = asyncio.ensure_future(self._tick())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()


def demo_input(**overrides):
    return {"prompt": "weather in Shanghai", "chunks": 20, "delay": 0, **overrides}


async def submit(api, agent="demo", input=None, *, key=None, headers=None, **body):
    """POST runs; returns the response (not raising on errors)."""
    headers = dict(headers or {})
    if key is not None:
        headers["Idempotency-Key"] = key
    payload = {"agent": agent, "input": demo_input() if input is None else input, **body}
    return await api.post("runs", json=payload, headers=headers)


@contextmanager
def write_lock_held(path):
    """Another connection's write transaction on the SQLite file at ``path``, for the block."""
    locked, release = threading.Event(), threading.Event()

    def hold_lock():
        db = sqlite3.connect(path)
        db.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(10)
        db.rollback()
        db.close()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        locked.wait(5)
        yield
    finally:
        release.set()
        holder.join()


async def wait_run(api, run_id, *, timeout=30, headers=None):
    """Wait until the run is terminal; returns the run object."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        response = await api.get(f"runs/{run_id}", headers=headers)
        response.raise_for_status()
        run = response.json()
        if run["status"] in TERMINAL:
            return run
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"run {run_id} still {run['status']} after {timeout}s")
        # Each look is a request the server answers: on two cores, a test's wait
        # should not cost another's CPU.
        await asyncio.sleep(0.05)


async def wait_seq(api, run_id, seq, *, timeout=30, headers=None):
    """Wait until the run has committed event ``seq``; returns its last_seq.

    It long-polls the events endpoint rather than sleeping.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    after = 0
    while True:
        response = await api.get(
            f"runs/{run_id}/events",
            params={"after": after, "limit": 1000, "wait": 1},
            headers=headers,
        )
        response.raise_for_status()
        body = response.json()
        if body["last_seq"] >= seq:
            return body["last_seq"]
        if body["done"] or asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"run {run_id} reached seq {body['last_seq']}, not {seq}")
        if body["events"]:
            after = body["events"][-1]["seq"]


async def waiting(api, run_id, headers=None, count=1, asked=1, timeout=30):
    """The run once it asked ``asked`` questions and waits with ``count`` of them open."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        run = (await api.get(f"runs/{run_id}", headers=headers)).json()
        inputs = run["snapshot"].get("inputs", [])
        opened = sum(i["status"] == "open" for i in inputs)
        if run["status"] == "waiting" and opened == count and len(inputs) == asked:
            return run
        assert run["status"] not in TERMINAL, f"{run_id} ended {run['status']} without asking"
        assert loop.time() < deadline, f"{run_id} is {run['status']}, not waiting"
        await asyncio.sleep(0.05)


async def wait_for(predicate, *, timeout=10, what="a condition"):
    """Wait until ``predicate()`` holds, looking at each turn of the event loop's clock."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def all_events(api, run_id, after=0, headers=None):
    """Every event after ``after`` through the JSON long-poll, until done."""
    events = []
    while True:
        response = await api.get(
            f"runs/{run_id}/events",
            params={"after": after, "limit": 1000, "wait": 5},
            headers=headers,
        )
        response.raise_for_status()
        body = response.json()
        events.extend(body["events"])
        if body["events"]:
            after = body["events"][-1]["seq"]
        if body["done"]:
            return events


async def sse_frames(api, run_id, *, after=None, last_event_id=None, limit=None, headers=None):
    """Read an SSE response to its end (or ``limit`` event frames); returns (status, frames).

    Each frame is a dict with ``id``, ``event``, ``data`` (parsed JSON) and ``comment``.
    """
    request_headers = {"Accept": "text/event-stream", **(headers or {})}
    if last_event_id is not None:
        request_headers["Last-Event-ID"] = str(last_event_id)
    params = {} if after is None else {"after": after}
    frames = []
    async with api.stream(
        "GET", f"runs/{run_id}/events", params=params, headers=request_headers
    ) as response:
        if response.status_code != 200:
            await response.aread()
            return response, frames
        async for frame in parse_sse(response.aiter_lines()):
            frames.append(frame)
            if limit is not None and sum(1 for f in frames if f.get("event")) >= limit:
                break
    return response, frames


async def parse_sse(lines):
    """Frames from an async iterator of SSE lines."""
    frame: dict = {}
    async for line in lines:
        if line == "":
            if frame:
                yield frame
            frame = {}
        elif line.startswith(":"):
            frame["comment"] = line[1:].strip()
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                frame["raw"] = value  # as served, byte for byte
                frame["data"] = json.loads(value)
            else:
                frame[name] = value
    if frame:
        yield frame
