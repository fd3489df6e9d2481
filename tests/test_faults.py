"""Faults lose nothing that was committed: cut connections, killed servers, stalled clients."""

import asyncio
import json
import random
import socket
import time

import httpx
import pytest

from conftest import demo_input, submit, wait_run
from servers import ServerProcess

TERMINAL_TYPES = ("run.succeeded", "run.failed", "run.cancelled", "run.interrupted")


class CuttingProxy:
    """A TCP proxy that closes each connection once ``cut_after`` SSE event frames went through."""

    def __init__(self, target_port: int, cut_after: int):
        self.target_port = target_port
        self.cut_after = cut_after
        self.connections = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, client_reader, client_writer):
        self.connections += 1
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.target_port
        )

        async def forward_request():
            try:
                while data := await client_reader.read(65536):
                    upstream_writer.write(data)
                    await upstream_writer.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass

        request_task = asyncio.ensure_future(forward_request())
        buffer, sent, frames = b"", 0, 0
        try:
            while frames < self.cut_after:
                data = await upstream_reader.read(65536)
                if not data:
                    break
                buffer += data
                # Forward up to the end of the frame that makes cut_after events, then cut.
                while frames < self.cut_after:
                    start = buffer.find(b"\nevent: ", sent)
                    if start < 0:
                        break
                    end = buffer.find(b"\n\n", start)
                    if end < 0:
                        break
                    frames += 1
                    sent = end + 2
                client_writer.write(buffer[:sent] if frames >= self.cut_after else buffer)
                if frames < self.cut_after:
                    sent = len(buffer)
                buffer, sent = buffer[sent:], 0
                await client_writer.drain()
        finally:
            request_task.cancel()
            upstream_writer.close()
            client_writer.close()


async def follow_through(url, token, run_id):
    """Reconnect with Last-Event-ID until the terminal event.

    Returns every seq received, in order.
    """
    received, cursor = [], 0
    async with httpx.AsyncClient(headers={"Authorization": f"token {token}"}, timeout=10) as client:
        for _ in range(500):
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(cursor)}
            try:
                async with client.stream(
                    "GET", f"{url}runs/{run_id}/events", headers=headers
                ) as response:
                    if response.status_code == 204:
                        return received
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            event = json.loads(line[6:])
                            received.append(event["seq"])
                            cursor = event["seq"]
                            if event["type"] in TERMINAL_TYPES:
                                return received
            except httpx.HTTPError:
                pass  # cut: reconnect from the cursor
    raise AssertionError("never reached the terminal event")


async def test_a_connection_cut_after_every_number_of_events_loses_and_repeats_nothing(
    api, token, jp_http_port, jp_base_url
):
    finished = await wait_run(
        api, (await submit(api, input=demo_input(chunks=24))).json()["run_id"]
    )
    assert finished["last_seq"] >= 30
    live = (await submit(api, input=demo_input(chunks=60, delay=0.01))).json()["run_id"]
    for run_id, cuts in ((finished["run_id"], range(1, 31)), (live, (1, 2, 7))):
        for cut_after in cuts:
            proxy = CuttingProxy(jp_http_port, cut_after)
            port = await proxy.start()
            try:
                seqs = await follow_through(
                    f"http://127.0.0.1:{port}{jp_base_url}api/agentruns/", token, run_id
                )
            finally:
                await proxy.stop()
            run = await wait_run(api, run_id)
            assert seqs == list(range(1, run["last_seq"] + 1)), cut_after
            assert proxy.connections >= run["last_seq"] // cut_after


@pytest.fixture
def server_factory(tmp_path):
    started = []

    def start(**agentruns):
        server = ServerProcess(
            tmp_path / f"home{len(started)}", tmp_path / "agentruns.sqlite3", agentruns
        ).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def received_before_kill(server, run_id, seconds):
    """Raw event data lines a client received from a live run, ``seconds`` from its first.

    Counted from the first event, not from the request: on a loaded machine
    the run may take longer than ``seconds`` to start.
    """
    lines = []
    deadline = None
    try:
        with (
            server.client() as client,
            client.stream(
                "GET",
                f"runs/{run_id}/events",
                headers={"Accept": "text/event-stream"},
                timeout=30,
            ) as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    deadline = deadline or time.monotonic() + seconds
                if deadline is not None and time.monotonic() > deadline:
                    break
    except httpx.HTTPError:
        pass
    return lines


def stored_lines(server, run_id):
    with (
        server.client() as client,
        client.stream(
            "GET", f"runs/{run_id}/events", headers={"Accept": "text/event-stream"}
        ) as response,
    ):
        return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


@pytest.mark.timeout(240)
def test_a_server_killed_at_random_moments_keeps_everything_any_client_received(server_factory):
    rng = random.Random(7)
    seen: dict[str, list[str]] = {}
    for _ in range(5):
        server = server_factory(lease_seconds=1, max_resume_attempts=0)
        with server.client() as client:
            run_id = client.post(
                "runs",
                json={
                    "agent": "demo",
                    "input": {"prompt": "crash", "chunks": 5000, "delay": 0.002},
                },
            ).json()["run_id"]
        seen[run_id] = received_before_kill(server, run_id, rng.uniform(0.2, 1.5))
        server.kill()

    final = server_factory(lease_seconds=1, max_resume_attempts=0)
    with final.client() as client:
        deadline = time.monotonic() + 60
        while any(
            client.get(f"runs/{run_id}").json()["status"] not in ("interrupted",) for run_id in seen
        ):
            assert time.monotonic() < deadline, "runs left unfinished after the crashes"
            time.sleep(0.2)
        for run_id, received in seen.items():
            assert received, "the client saw nothing before the kill"
            stored = stored_lines(final, run_id)
            assert stored[: len(received)] == received  # byte-identical
            events = [json.loads(line) for line in stored]
            assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
            assert events[-1]["type"] == "run.interrupted"
            assert [e["type"] for e in events].count("run.interrupted") == 1


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])


@pytest.mark.timeout(240)
def test_a_client_that_stops_reading_is_dropped_and_neither_slows_the_run_nor_grows_memory(
    server_factory,
):
    server = server_factory(write_timeout_seconds=2, sqlite_synchronous="NORMAL")
    with server.client() as client:
        warm = client.post(
            "runs", json={"agent": "demo", "input": {"prompt": "w", "chunks": 2000, "delay": 0}}
        ).json()
        while client.get(f"runs/{warm['run_id']}").json()["status"] != "succeeded":
            time.sleep(0.1)
        before = rss_kb(server.process.pid)
        run_id = client.post(
            "runs",
            json={
                "agent": "demo",
                "input": {"prompt": "x" * 200, "chunks": 100000, "delay": 0, "tools": False},
            },
        ).json()["run_id"]

        stalled = socket.create_connection(("127.0.0.1", server.port))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(
            f"GET /api/agentruns/runs/{run_id}/events HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: token {server.token}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        # A normal client reads the whole run meanwhile.
        seqs, cursor, peak = [], 0, before
        while True:
            body = client.get(
                f"runs/{run_id}/events", params={"after": cursor, "limit": 1000, "wait": 5}
            ).json()
            seqs.extend(e["seq"] for e in body["events"])
            if body["events"]:
                cursor = body["events"][-1]["seq"]
            peak = max(peak, rss_kb(server.process.pid))
            if body["done"]:
                break
        run = client.get(f"runs/{run_id}").json()
    assert run["status"] == "succeeded"
    assert seqs == list(range(1, run["last_seq"] + 1))
    # The stalled connection was dropped by the server (bounded write wait).
    stalled.settimeout(30)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    closed = False
    try:
        while True:
            if not stalled.recv(1 << 20):
                closed = True
                break
    except OSError:
        closed = True
    stalled.close()
    assert closed
    growth_mb = (peak - before) / 1024
    print(f"\nserver RSS growth during a 100k-event run with a stalled client: {growth_mb:.1f} MB")
    assert growth_mb < 150
