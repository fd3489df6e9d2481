"""Stopping a server while pages follow runs: streams end cleanly, requests get 503, no tracebacks."""

from __future__ import annotations

import re
import signal
import socket
import threading
import time

import httpx
import pytest

from servers import ServerProcess, wait_status

LIVE = {"prompt": "p", "chunks": 5000, "delay": 0.02, "tools": False}


class Stream(threading.Thread):
    """Reads one SSE response to its end; ``ended`` says how it ended."""

    def __init__(self, server: ServerProcess, path: str, params: dict):
        super().__init__(daemon=True)
        self.server, self.path, self.params = server, path, params
        self.status: int | None = None
        self.ended: str | None = None
        self.answered = threading.Event()

    def run(self) -> None:
        try:
            with (
                self.server.client() as client,
                client.stream(
                    "GET", self.path, params=self.params, headers={"Accept": "text/event-stream"}
                ) as response,
            ):
                self.status = response.status_code
                for _ in response.iter_lines():
                    pass
            self.ended = "cleanly"
        except httpx.HTTPError as exc:
            self.ended = repr(exc)


class LongPoll(threading.Thread):
    """One long-poll that waits for a run that emits nothing meanwhile."""

    def __init__(self, server: ServerProcess, run_id: str, after: int):
        super().__init__(daemon=True)
        self.server, self.run_id, self.after = server, run_id, after
        self.response: httpx.Response | None = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            with self.server.client() as client:
                self.response = client.get(
                    f"runs/{self.run_id}/events", params={"after": self.after, "wait": 25}
                )
        except httpx.HTTPError as exc:
            self.error = repr(exc)


class Pipelined(threading.Thread):
    """A long-poll with a second request sent behind it on the same connection.

    The server reads the second request only once it has answered the first,
    which the stop does: so the second one certainly comes during the stop
    (a request on a connection of its own could come before it, or find the
    connection closed as the server stops listening).
    """

    def __init__(self, server: ServerProcess, run_id: str, after: int, second: str):
        super().__init__(daemon=True)
        self.server, self.run_id, self.after, self.second = server, run_id, after, second
        self.raw = b""
        self.error: str | None = None

    def run(self) -> None:
        url = httpx.URL(self.server.api_url)
        head = f"Host: {url.host}:{url.port}\r\nAuthorization: token {self.server.token}\r\n"
        first = f"{url.path}runs/{self.run_id}/events?after={self.after}&wait=25"
        request = (
            f"GET {first} HTTP/1.1\r\n{head}\r\n"
            f"GET {url.path}{self.second} HTTP/1.1\r\n{head}Connection: close\r\n\r\n"
        )
        try:
            with socket.create_connection((url.host, url.port), timeout=60) as sock:
                sock.sendall(request.encode())
                while chunk := sock.recv(65536):
                    self.raw += chunk
        except OSError as exc:
            self.error = repr(exc)

    def statuses(self) -> list[int]:
        return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", self.raw)]


class RequestLoop(threading.Thread):
    """Requests back to back on one keep-alive connection until the server is gone."""

    def __init__(self, server: ServerProcess, paths: list[str]):
        super().__init__(daemon=True)
        self.server, self.paths = server, paths
        self.answers: list[tuple[str, int, dict, str | None]] = []
        self.ended: str | None = None
        self.answered = threading.Event()

    def run(self) -> None:
        with self.server.client() as client:
            while True:
                for path in self.paths:
                    try:
                        response = client.get(path)
                    except httpx.HTTPError as exc:
                        self.ended = repr(exc)
                        return  # refused: the server no longer listens
                    body = response.json() if response.status_code != 200 else {}
                    retry_after = response.headers.get("Retry-After")
                    self.answers.append((path, response.status_code, body, retry_after))
                    self.answered.set()


def wait_text(client: httpx.Client, run_id: str, text: str, timeout: float = 30) -> None:
    """Wait until the run's first message reads ``text`` (its agent wrote it)."""
    deadline = time.monotonic() + timeout
    while True:
        messages = client.get(f"runs/{run_id}").json()["snapshot"].get("messages") or [{}]
        if messages[0].get("text") == text:
            return
        assert time.monotonic() < deadline, f"{run_id} wrote {messages}, not {text!r}"
        time.sleep(0.02)


def wait_open_streams(server: ServerProcess, expected: dict[str, int], timeout: float = 30) -> None:
    """Wait until the server's metrics count ``expected`` open streams of each kind."""
    deadline = time.monotonic() + timeout
    with server.client() as client:
        while True:
            text = client.get(f"{server.url}metrics").text
            counts = {
                kind: float(count)
                for kind, count in re.findall(
                    r'^agentruns_open_streams\{kind="(\w+)"\} (\S+)$', text, re.M
                )
            }
            if all(counts.get(kind) == count for kind, count in expected.items()):
                return
            assert time.monotonic() < deadline, f"open streams {counts}, not {expected}"
            time.sleep(0.05)


@pytest.mark.timeout(120)
def test_a_server_stopping_under_open_streams_ends_them_and_answers_503(tmp_path, store_config):
    released = tmp_path / "released"
    server = ServerProcess(
        tmp_path / "server",
        tmp_path / "agentruns.sqlite3",
        {
            "agents": {"slow_to_stop": "agents_for_tests:slow_to_stop"},
            "max_resume_attempts": 0,
            "heartbeat_interval": 30,
            **store_config,
        },
    ).start()
    try:
        with server.client() as client:
            live = client.post(
                "runs", json={"agent": "demo", "input": LIVE, "session": "s"}
            ).json()["run_id"]
            # Queued behind the live run, it stays queued through the stop: its streams
            # only wait, and a stop must end them.
            queued = client.post(
                "runs",
                json={"agent": "demo", "input": LIVE, "session": "s", "session_policy": "enqueue"},
            ).json()["run_id"]
            asking = client.post(
                "runs", json={"agent": "demo", "input": {"prompt": "q", "ask": True}}
            ).json()["run_id"]
            # Cancelled at the stop, it holds the stop until the test has seen what was
            # answered meanwhile (then ``released`` exists): no request can come too late.
            slow = client.post(
                "runs",
                json={"agent": "slow_to_stop", "input": {"seconds": 30, "until": str(released)}},
            ).json()["run_id"]
            done = client.post(
                "runs", json={"agent": "demo", "input": {"prompt": "d", "chunks": 3, "delay": 0}}
            ).json()["run_id"]
            waiting = wait_status(client, asking, {"waiting"})
            wait_status(client, done, {"succeeded"})
            wait_text(client, slow, "working")  # in its try: its finally will hold the stop
        page = f"{live}:0,{queued}:0,{asking}:{waiting['last_seq']}"
        streams = [
            Stream(server, f"runs/{live}/events", {}),
            Stream(server, f"runs/{queued}/events", {}),
            Stream(server, "streams", {"runs": page}),
        ]
        polls = [LongPoll(server, queued, 0), LongPoll(server, asking, waiting["last_seq"])]
        pipelined = Pipelined(server, queued, 0, "usage")
        requests = [
            RequestLoop(server, [f"runs/{live}", "runs", f"runs/{done}/events"]),
            RequestLoop(server, [f"runs/{done}", f"runs/{live}/events?limit=5", "agents"]),
            RequestLoop(server, [f"runs/{queued}", f"runs/{asking}", "usage"]),
        ]
        for thread in [*streams, *polls, *requests, pipelined]:
            thread.start()
        wait_open_streams(server, {"run": 2, "page": 1, "poll": 3})
        for thread in requests:  # each on a connection of its own, kept alive
            assert thread.answered.wait(30), thread.ended
        server.process.send_signal(signal.SIGTERM)
        # Each loop sends on its connection until the server closes it (its 503 does);
        # meanwhile the stop waits for the slow run, which waits for ``released``.
        for thread in requests:
            thread.join(30)
        released.touch()
        assert server.process.wait(60) == 0
        for thread in [*streams, *polls, *requests, pipelined]:
            thread.join(30)
            assert not thread.is_alive()
    finally:
        released.touch()
        server.kill()

    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "ProgrammingError" not in log, server.log_tail(80)
    # A 503 while the server stops is the answer it should give: one line at INFO
    # each, not an error with the request's headers.
    answered_503 = [line for line in log.splitlines() if re.search(r" 503 [A-Z]+ /", line)]
    assert answered_503, server.log_tail(80)
    assert all(line.startswith("[I ") for line in answered_503), answered_503
    assert '"User-Agent"' not in log, server.log_tail(80)
    # Each stream's response ended as an HTTP response ends: its client resumes from its cursor.
    assert [(stream.status, stream.ended) for stream in streams] == [(200, "cleanly")] * 3
    for poll in polls:
        assert poll.error is None, poll.error
        assert poll.response.status_code == 200, poll.response.text
    answers = [answer for thread in requests for answer in thread.answers]
    for path, status, body, retry_after in answers:
        if status != 200:
            assert (status, body["error"]) == (503, "shutting_down"), (path, status, body)
            assert body["message"] and retry_after
    # A request that certainly came during the stop (read once the stop had
    # answered the long-poll before it) is answered 503, with when to come back.
    assert pipelined.error is None, pipelined.error
    assert pipelined.statuses() == [200, 503], pipelined.raw[-2000:]
    assert (
        b'"error": "shutting_down"' in pipelined.raw or b'"error":"shutting_down"' in pipelined.raw
    )
    assert b"\r\nRetry-After: " in pipelined.raw
