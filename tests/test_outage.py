"""PostgreSQL going away under a running server: 503s meanwhile, nothing committed lost.

A proxy between the server and the database cuts every connection and
refuses new ones for a while, as a database restart or a network cut does;
or it holds every byte without closing anything, as a database that hangs does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from tcpproxy import TcpProxy

from jupyter_agentruns.reader import Reader
from jupyter_agentruns.store import StoreUnavailable
from jupyter_agentruns.store.postgres import PostgresStore

from conftest import POSTGRES_URL, all_events, demo_input, parse_sse, submit, wait_run, wait_seq

pytestmark = pytest.mark.own_store
_schemas = itertools.count(1)


@pytest.fixture(scope="session")
def session_proxy(postgres_database):
    # For the session: a server stops after the test's own fixtures are gone,
    # and must still reach its database then.
    target = urlsplit(POSTGRES_URL)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    yield proxy
    proxy.close()


@pytest.fixture
def proxy(session_proxy):
    session_proxy.restore()
    session_proxy.resume()
    yield session_proxy
    session_proxy.restore()
    session_proxy.resume()


@pytest.fixture
def agentruns_config(proxy, postgres_database):
    parts = urlsplit(postgres_database)
    user = f"{parts.username}@" if parts.username else ""
    through = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))
    return {"store_url": f"{through}?schema=outage{next(_schemas)}", "lease_seconds": 5}


async def follow(api, run_id, seen):
    """Stream the run to its end over SSE, resuming from the last id after each break."""
    last = 0
    while True:
        try:
            async with api.stream(
                "GET",
                f"runs/{run_id}/events",
                headers={"Accept": "text/event-stream", "Last-Event-ID": str(last)},
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    await asyncio.sleep(0.2)
                    continue
                async for frame in parse_sse(response.aiter_lines()):
                    if "event" not in frame:
                        continue
                    seen.append(frame["raw"])
                    last = frame["data"]["seq"]
                    if frame["event"] in ("run.succeeded", "run.failed", "run.cancelled",
                                          "run.interrupted"):  # fmt: skip
                        return
        except (httpx.ReadError, httpx.RemoteProtocolError):
            await asyncio.sleep(0.2)


@pytest.mark.timeout(120)
async def test_a_database_outage_mid_run_answers_503_then_the_run_ends_with_nothing_lost(
    api, proxy
):
    run_id = (await submit(api, input=demo_input(chunks=400, delay=0.005))).json()["run_id"]
    seen: list[str] = []
    streaming = asyncio.ensure_future(follow(api, run_id, seen))
    await wait_seq(api, run_id, 20)

    proxy.cut()
    answers = []
    loop = asyncio.get_running_loop()
    until = loop.time() + 2.5
    while loop.time() < until:
        for response in (
            await api.get(f"runs/{run_id}"),
            await submit(api, key="during-the-outage"),
            await api.get("runs"),
        ):
            answers.append((response.status_code, response.headers.get("Retry-After"),
                            response.json().get("error")))  # fmt: skip
        await asyncio.sleep(0.1)
    proxy.restore()

    run = await wait_run(api, run_id, timeout=60)
    await asyncio.wait_for(streaming, 30)
    assert run["status"] == "succeeded"
    unavailable = [a for a in answers if a[0] == 503]
    assert unavailable, "the outage was never noticed"
    assert all(a == (503, "5", "store_unavailable") for a in unavailable), unavailable
    assert not [a for a in answers if a[0] >= 500 and a[0] != 503], answers

    events = await all_events(api, run_id)
    assert [e["seq"] for e in events] == list(range(1, run["last_seq"] + 1))
    assert [e["type"] for e in events].count("run.succeeded") == 1
    assert run["output"]["text"] == run["snapshot"]["messages"][0]["text"]
    # What the stream served before, during and after the outage is what is stored.
    replayed = "".join(
        [(await api.get(f"runs/{run_id}/events", params={"after": after, "limit": 1000})).text
         for after in range(0, run["last_seq"], 1000)]
    )  # fmt: skip
    for raw in seen:
        assert raw in replayed  # the same bytes, not only the same values
    assert [json.loads(raw)["seq"] for raw in seen] == list(range(1, run["last_seq"] + 1))
    # The submit made during the outage, if it got through, made one run.
    again = await submit(api, key="during-the-outage")
    assert again.status_code in (200, 201)


@pytest.mark.timeout(150)
async def test_a_database_that_hangs_answers_503_within_seconds_then_the_run_ends_with_nothing_lost(
    api, proxy
):
    run_id = (await submit(api, input=demo_input(chunks=400, delay=0.01))).json()["run_id"]
    seen: list[str] = []
    streaming = asyncio.ensure_future(follow(api, run_id, seen))
    await wait_seq(api, run_id, 20)

    proxy.pause()
    loop = asyncio.get_running_loop()
    answers = []
    # Three lease periods (lease_seconds is 5): the run's lease cannot be renewed meanwhile.
    until = loop.time() + 15
    while loop.time() < until:
        for request in (
            lambda: api.get(f"runs/{run_id}"),
            lambda: submit(api, key="while-it-hangs"),
        ):
            began = loop.time()
            response = await request()
            answers.append((response.status_code, response.headers.get("Retry-After"),
                            response.json().get("error"), loop.time() - began))  # fmt: skip
    stalled = (await api.get(f"runs/{run_id}")).status_code
    proxy.resume()

    # Its events waited for the database, then committed: the run went on and ended.
    run = await wait_run(api, run_id, timeout=60)
    await asyncio.wait_for(streaming, 30)
    assert run["status"] == "succeeded", run
    assert stalled == 503
    assert {a[:3] for a in answers} == {(503, "5", "store_unavailable")}, answers
    # Each answered within seconds (the statement's bound, or the connect's), not held.
    assert max(a[3] for a in answers) < 8, answers

    events = await all_events(api, run_id)
    assert [e["seq"] for e in events] == list(range(1, run["last_seq"] + 1))
    assert [e["type"] for e in events].count("run.succeeded") == 1
    assert run["output"]["text"] == run["snapshot"]["messages"][0]["text"]
    assert [json.loads(raw)["seq"] for raw in seen] == list(range(1, run["last_seq"] + 1))
    again = await submit(api, key="while-it-hangs")
    assert again.status_code == 201


@pytest.mark.timeout(60)
def test_a_statement_is_bounded_whether_the_database_runs_it_long_or_never_answers(
    proxy, agentruns_config, postgres_database
):
    conn = PostgresStore(agentruns_config["store_url"]).connect()
    # Another server's transaction that hangs while it holds a submit's lock.
    holder = psycopg.connect(postgres_database, autocommit=True)
    try:
        assert conn.get_run("run_none") is None
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended('alice', 0))")
        began = time.monotonic()
        with pytest.raises(StoreUnavailable, match="did not finish a statement within 5 s"):
            with conn.transaction():
                conn.serialize("alice")
        assert time.monotonic() - began < 7
        assert conn.get_run("run_none") is None  # the same connection goes on

        proxy.pause()
        began = time.monotonic()
        with pytest.raises(StoreUnavailable, match="did not answer within 6 s"):
            conn.get_run("run_none")
        assert time.monotonic() - began < 8
        proxy.resume()
        assert conn.get_run("run_none") is None  # connected again
        # The copy command's connections are not bounded so: its statements are large.
        with PostgresStore(agentruns_config["store_url"]).open() as copying:
            assert copying.execute("SHOW statement_timeout").fetchone() == ("0",)
    finally:
        proxy.resume()
        conn.close()
        holder.close()


@pytest.mark.timeout(60)
def test_reads_queued_behind_reads_the_database_holds_are_answered_within_seconds(
    proxy, agentruns_config
):
    reader = Reader(PostgresStore(agentruns_config["store_url"]), threads=2)

    async def read() -> tuple[str, float]:
        began = time.monotonic()
        try:
            await reader.run(lambda conn: conn.get_run("run_none"))
        except StoreUnavailable as exc:
            return str(exc), time.monotonic() - began
        return "answered", time.monotonic() - began

    async def reads() -> list[tuple[str, float]]:
        # Each thread connected (the two reads meet, one on each), then the database hangs.
        both = threading.Barrier(2, timeout=10)

        def meet(conn):
            both.wait()
            return conn.get_run("run_none")

        assert await asyncio.gather(reader.run(meet), reader.run(meet)) == [None, None]
        proxy.pause()
        return await asyncio.gather(read(), read(), read())

    try:
        held, held_too, queued = asyncio.run(reads())
    finally:
        proxy.resume()
        reader.close()
    # Two reads on the two threads wait for the database until their statements'
    # bound; the third waits for a thread no longer than it would for the database.
    assert "did not answer within 6 s" in held[0] and "did not answer within 6 s" in held_too[0]
    assert "no connection to the store was free within 5 s" in queued[0]
    assert max(held[1], held_too[1], queued[1]) < 8
