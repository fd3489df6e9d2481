"""Fixtures: a real Jupyter server with the extension, a real SQLite file, real HTTP on loopback."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from contextlib import contextmanager

import httpx
import pytest

pytest_plugins = ["pytest_jupyter.jupyter_server"]

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (browser tests screenshot failures)."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


@pytest.fixture
def agentruns_config():
    """Per-test ``c.AgentRuns`` settings; override with ``@pytest.mark.parametrize``."""
    return {}


@pytest.fixture
def server_config():
    """Per-test ``c.ServerApp`` settings."""
    return {}


@pytest.fixture
def jp_server_config(agentruns_config, server_config):
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agentruns": True}, **server_config},
        "AgentRuns": {"heartbeat_interval": 0.5, **agentruns_config},
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
        base_url=api_url, headers={"Authorization": f"token {token}"}, timeout=30
    )
    yield client
    jp_asyncio_loop.run_until_complete(client.aclose())


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
        await asyncio.sleep(0.02)


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
        await asyncio.sleep(0.02)


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
                frame["data"] = json.loads(value)
            else:
                frame[name] = value
    if frame:
        yield frame
