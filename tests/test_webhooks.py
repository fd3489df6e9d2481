"""Webhooks: signed deliveries from the store's outbox, in order, at least once, once per store.

A local receiver (http.server in a thread) takes the deliveries and checks
their signatures with the standardwebhooks package, as a user's would.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import rawdb

from conftest import demo_input, submit, wait_run
from servers import ServerProcess, free_port, wait_status

# The webhooks extra: where it is not installed (the lowest versions' environment), no hooks.
Webhook = pytest.importorskip(
    "standardwebhooks.webhooks", reason="the webhooks extra (standardwebhooks) is not installed"
).Webhook

PER_USER = {"identity_provider_class": "identity.HeaderIdentityProvider"}
ALICE = {"X-Test-User": "alice"}
BOB = {"X-Test-User": "bob"}
ENDS = ["run.succeeded", "run.failed", "run.cancelled", "run.interrupted"]
# Retries within the test's patience, the receivers on this machine.
HOOKS = {"webhooks_allow_private": True, "webhooks_retry_seconds": 0.2}
QUICK = {"prompt": "q", "chunks": 3, "delay": 0, "tools": False}
SECRET_ENV = "AGENTRUNS_TEST_HOOK_SECRET"
SERVER_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Receiver:
    """Takes POSTs on 127.0.0.1 and records them; answers ``status`` (a test changes it)."""

    def __init__(self, port: int = 0):
        self.received: list[dict] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = receiver.status
                receiver.received.append(
                    {
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": body,
                        "status": status,
                    }
                )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def delivered(self, path: str | None = None) -> list[dict]:
        """The requests answered 2xx (to ``path``), in the order they came."""
        return [
            r for r in self.received if r["status"] < 300 and (path is None or r["path"] == path)
        ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    receiver = Receiver()
    yield receiver
    receiver.close()


def verified(request: dict, secret: str) -> dict:
    """The delivery's body, once its Standard Webhooks signature checked out."""
    return Webhook(secret).verify(request["body"], request["headers"])


async def until(condition, timeout: float = 30):
    """Wait until ``condition()`` (a function or a coroutine function) is true; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.05)
    return value


def wait_until(condition, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.05)
    return value


@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize("agentruns_config", [HOOKS])
async def test_a_users_hook_gets_their_runs_ends_signed_and_no_one_elses(api, receiver):
    created = await api.post(
        "hooks", json={"url": receiver.url("/alice"), "events": ENDS}, headers=ALICE
    )
    assert created.status_code == 201, created.text
    hook = created.json()
    assert hook["secret"].startswith("whsec_") and hook["events"] == sorted(ENDS)
    slack = await api.post(
        "hooks",
        json={"url": receiver.url("/slack"), "events": ["run.succeeded"], "format": "slack"},
        headers=ALICE,
    )
    assert slack.status_code == 201 and slack.json()["format"] == "slack"
    bobs = await api.post("hooks", json={"url": receiver.url("/bob"), "events": ENDS}, headers=BOB)
    assert bobs.status_code == 201
    # The secret is answered once; another user's hook is missing to them.
    listed = (await api.get("hooks", headers=ALICE)).json()["hooks"]
    assert {h["hook_id"] for h in listed} == {hook["hook_id"], slack.json()["hook_id"]}
    assert not any("secret" in h for h in listed)
    missing = await api.get(f"hooks/{hook['hook_id']}", headers=BOB)
    assert missing.status_code == 404 and missing.json()["error"] == "hook_not_found"
    assert (await api.get(f"hooks/{hook['hook_id']}/deliveries", headers=BOB)).status_code == 404

    run_id = (await submit(api, input=demo_input(), headers=ALICE)).json()["run_id"]
    await wait_run(api, run_id, headers=ALICE)
    [request] = await until(lambda: receiver.delivered("/alice"))
    body = verified(request, hook["secret"])
    assert body["type"] == "run.succeeded" and body["run_id"] == run_id
    assert body["status"] == "succeeded" and body["output"] and "snapshot" not in body

    async def recorded():
        # The server records the delivery once the receiver's answer is back: just after.
        answer = await api.get(f"hooks/{hook['hook_id']}/deliveries", headers=ALICE)
        deliveries = answer.json()["deliveries"]
        return [d for d in deliveries if d["status"] == "delivered"] and deliveries

    [delivery] = await until(recorded)
    assert delivery["delivery_id"] == request["headers"]["webhook-id"]
    assert delivery["status"] == "delivered" and delivery["attempts"] == 1
    # Slack's line: the title, the status, a link to the run's page.
    [line] = await until(lambda: receiver.delivered("/slack"))
    text = verified(line, slack.json()["secret"])["text"]
    assert text.startswith("weather in Shanghai") and " — succeeded " in text
    assert text.endswith(f"/lab?agentruns-run={run_id}")
    # Bob's hook was never given Alice's run: nothing in its outbox, nothing sent.
    bob_hook = bobs.json()["hook_id"]
    assert (await api.get(f"hooks/{bob_hook}/deliveries", headers=BOB)).json()["deliveries"] == []
    assert {r["path"] for r in receiver.received} == {"/alice", "/slack"}

    assert (await api.delete(f"hooks/{hook['hook_id']}", headers=ALICE)).status_code == 204
    assert (await api.get(f"hooks/{hook['hook_id']}", headers=ALICE)).status_code == 404


@pytest.mark.sqlite_only
async def test_a_private_or_loopback_url_is_refused_unless_the_server_allows_it(api):
    for url in (
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "http://[::1]/",
        "http://10.1.2.3/",
    ):
        response = await api.post("hooks", json={"url": url, "events": ["run.failed"]})
        assert response.status_code == 400, url
        assert response.json()["error"] == "invalid_request"
        assert "webhooks_allow_private" in response.json()["message"]
    bad = await api.post("hooks", json={"url": "https://example.org/", "events": ["run.started"]})
    assert bad.status_code == 400 and "events" in bad.json()["message"]
    assert (await api.get("hooks")).json()["hooks"] == []


@pytest.fixture
def dns(monkeypatch):
    """The addresses the server finds for a host: a name of the test's, a table it changes."""
    from jupyter_agentruns.engine import webhooks

    table: dict[str, list[str]] = {}

    async def resolve(host: str, port: int | None) -> list[str]:
        if host not in table:
            raise OSError(f"no address for {host}")
        return table[host]

    monkeypatch.setattr(webhooks, "_resolve", resolve)
    return table


@pytest.mark.sqlite_only
async def test_a_hook_whose_host_moved_to_a_private_address_is_not_sent_there(api, receiver, dns):
    # The host was on the internet when the hook was made; now it names this machine
    # (DNS rebinding): the attempt is refused, and the receiver here gets nothing.
    dns["hooks.example.test"] = ["93.184.215.14"]
    url = f"http://hooks.example.test:{receiver.port}/moved"
    created = await api.post("hooks", json={"url": url, "events": ENDS})
    assert created.status_code == 201, created.text
    hook = created.json()
    dns["hooks.example.test"] = ["93.184.215.14", "127.0.0.1"]
    run_id = (await submit(api, input=demo_input(**QUICK))).json()["run_id"]
    await wait_run(api, run_id)

    async def tried():
        deliveries = (await api.get(f"hooks/{hook['hook_id']}/deliveries")).json()["deliveries"]
        return [d for d in deliveries if d["attempts"] >= 1]

    [delivery] = await until(tried)
    assert delivery["status"] == "pending" and delivery["next_attempt"]
    assert "private or loopback address now (127.0.0.1)" in delivery["last_error"]
    assert receiver.received == []


@pytest.mark.sqlite_only
@pytest.mark.parametrize("agentruns_config", [HOOKS])
async def test_an_attempt_goes_to_an_address_checked_with_the_hooks_host_named(api, receiver, dns):
    # The host's first address takes no connection: the next one does, asked for by name.
    dns["hooks.example.test"] = ["127.0.0.2", "127.0.0.1"]
    url = f"http://hooks.example.test:{receiver.port}/named"
    hook = (await api.post("hooks", json={"url": url, "events": ENDS})).json()
    run_id = (await submit(api, input=demo_input(**QUICK))).json()["run_id"]
    await wait_run(api, run_id)
    [request] = await until(lambda: receiver.delivered("/named"))
    assert request["headers"]["Host"] == f"hooks.example.test:{receiver.port}"
    assert verified(request, hook["secret"])["run_id"] == run_id


@pytest.mark.parametrize("agentruns_config", [HOOKS])
async def test_deliveries_wait_for_a_failing_receiver_then_arrive_in_order(api, receiver):
    hook = (
        await api.post("hooks", json={"url": receiver.url(), "events": ["input.requested", *ENDS]})
    ).json()
    receiver.status = 500
    run_id = (await submit(api, input=demo_input(ask=True, chunks=5))).json()["run_id"]

    async def retried():
        deliveries = (await api.get(f"hooks/{hook['hook_id']}/deliveries")).json()["deliveries"]
        return [d for d in deliveries if d["attempts"] >= 2] and deliveries

    [asked] = await until(retried)
    assert asked["type"] == "input.requested" and asked["status"] == "pending"
    assert asked["last_error"].startswith("HTTP 500") and asked["next_attempt"]
    run = (await api.get(f"runs/{run_id}")).json()
    [question] = [i for i in run["snapshot"]["inputs"] if i["status"] == "open"]
    await api.post(f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": "approve"})
    await wait_run(api, run_id)
    # The run's end is in the outbox, and waits behind its question: never sent while that one fails.
    deliveries = (await api.get(f"hooks/{hook['hook_id']}/deliveries")).json()["deliveries"]
    [ended] = [d for d in deliveries if d["type"] == "run.succeeded"]
    [before] = [d["attempts"] for d in deliveries if d["type"] == "input.requested"]

    async def tried_again():
        deliveries = (await api.get(f"hooks/{hook['hook_id']}/deliveries")).json()["deliveries"]
        return [d for d in deliveries if d["type"] == "input.requested" and d["attempts"] > before]

    await until(tried_again)
    assert ended["status"] == "pending" and ended["attempts"] == 0
    assert {json.loads(r["body"])["type"] for r in receiver.received} == {"input.requested"}

    receiver.status = 200
    await until(lambda: len(receiver.delivered()) == 2)
    requests = receiver.delivered()
    bodies = [verified(r, hook["secret"]) for r in requests]
    assert [b["type"] for b in bodies] == ["input.requested", "run.succeeded"]
    assert [b["seq"] for b in bodies] == sorted(b["seq"] for b in bodies)
    # Every attempt of one delivery carries its id.
    ids = {json.loads(r["body"])["seq"]: set() for r in receiver.received}
    for r in receiver.received:
        ids[json.loads(r["body"])["seq"]].add(r["headers"]["webhook-id"])
    assert all(len(one) == 1 for one in ids.values())

    async def recorded():
        # The server records each delivery once the receiver's answer is back: just after.
        deliveries = (await api.get(f"hooks/{hook['hook_id']}/deliveries")).json()["deliveries"]
        return {d["status"] for d in deliveries} == {"delivered"}

    await until(recorded)


def server_hooks(url: str) -> dict:
    """A server's settings with its own webhook to ``url``, signed with the secret of SECRET_ENV.

    Users' hooks may not name this machine (webhooks_allow_private is off): the
    server's own, its administrator's, may.
    """
    return {
        "webhooks_retry_seconds": HOOKS["webhooks_retry_seconds"],
        "lease_seconds": 2,
        "webhooks": [{"url": url, "events": ENDS, "secret_env": SECRET_ENV}],
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_two_servers_on_one_store_deliver_each_event_once(
    store, tmp_path, receiver, monkeypatch, request
):
    monkeypatch.setenv(SECRET_ENV, SERVER_SECRET)
    config = server_hooks(receiver.url())
    if store == "postgres":
        config["store_url"] = request.getfixturevalue("postgres_url")
    servers = [
        ServerProcess(tmp_path / f"server{index}", tmp_path / "store.sqlite3", config)
        for index in range(2)
    ]
    try:
        for server in servers:
            server.start()
        run_ids = []
        for index in range(6):
            with servers[index % 2].client() as client:
                response = client.post("runs", json={"agent": "demo", "input": QUICK})
                assert response.status_code == 201, response.text
                run_ids.append(response.json()["run_id"])
        with servers[0].client() as client:
            for run_id in run_ids:
                wait_status(client, run_id, {"succeeded"})
        wait_until(lambda: len(receiver.delivered()) >= 6)
        where = config.get("store_url") or str(tmp_path / "store.sqlite3")

        def outbox() -> list[tuple]:
            db = rawdb.connect(where)
            try:
                return db.execute("SELECT status, attempts FROM webhook_deliveries").fetchall()
            finally:
                db.close()

        # Every delivery recorded delivered at its first attempt: none sent twice.
        wait_until(lambda: {row[0] for row in outbox()} == {"delivered"})
        assert sorted(tuple(row) for row in outbox()) == [("delivered", 1)] * 6
        bodies = [verified(r, SERVER_SECRET) for r in receiver.delivered()]
        assert sorted(b["run_id"] for b in bodies) == sorted(run_ids)
        assert len({r["headers"]["webhook-id"] for r in receiver.received}) == len(
            receiver.received
        )
    finally:
        for server in servers:
            server.kill()


@pytest.mark.timeout(120)
def test_a_delivery_committed_before_a_sigkill_is_sent_after_the_restart(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, SERVER_SECRET)
    port = free_port()  # nothing listens there yet: the first attempts are refused
    config = server_hooks(f"http://127.0.0.1:{port}/")
    server = ServerProcess(tmp_path / "server", tmp_path / "store.sqlite3", config)
    receiver = None
    try:
        server.start()
        with server.client() as client:
            run_id = client.post("runs", json={"agent": "demo", "input": QUICK}).json()["run_id"]
            wait_status(client, run_id, {"succeeded"})
        server.kill()
        receiver = Receiver(port)
        server.start()
        [request] = wait_until(lambda: receiver.delivered())
        body = verified(request, SERVER_SECRET)
        assert body["type"] == "run.succeeded" and body["run_id"] == run_id
    finally:
        server.kill()
        if receiver is not None:
            receiver.close()
