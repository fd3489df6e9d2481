"""Prometheus metrics in jupyter_server's ``/metrics``: a known workload, counted exactly.

The metrics live once per process and the test servers of a session share
them: each test compares a scrape before its workload with one after.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import httpx
import pytest
import rawdb
from prometheus_client.parser import text_string_to_metric_families

from jupyter_agentruns import lifecycle, metrics
from jupyter_agentruns.metrics import Sampled

from conftest import demo_input, parse_sse, submit, wait_run, wait_seq, waiting
from servers import ServerProcess, wait_status

OUTCOMES = ("succeeded", "failed", "cancelled", "interrupted")
SLOW = demo_input(chunks=300, delay=0.01)


class Scrape:
    """One answer of ``/metrics``: every sample, by name and labels."""

    def __init__(self, text: str):
        self.samples: dict[tuple[str, tuple], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def label_values(self) -> set[str]:
        return {value for _, labels in self.samples for _, value in labels}


@pytest.fixture
def metrics_url(jp_serverapp, http_server, jp_http_port, jp_base_url):
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}metrics"


@pytest.fixture
def scrape(api, metrics_url):
    """GET ``/metrics`` over HTTP with the server's token, parsed."""

    async def get() -> Scrape:
        response = await api.get(metrics_url)
        assert response.status_code == 200, response.text
        return Scrape(response.text)

    return get


async def scrape_until(scrape, holds, what: str, timeout: float = 15) -> Scrape:
    """Scrape until ``holds(scrape)``: for gauges that follow the server a moment later."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        current = await scrape()
        if holds(current):
            return current
        assert asyncio.get_running_loop().time() < deadline, f"/metrics never showed {what}"
        await asyncio.sleep(0.1)


def delta(after: Scrape, before: Scrape, name: str, **labels: str) -> float:
    return after(name, **labels) - before(name, **labels)


@pytest.mark.timeout(30)
async def test_metrics_need_the_servers_token(api, metrics_url):
    async with httpx.AsyncClient() as anonymous:
        assert (await anonymous.get(metrics_url)).status_code == 403
    assert (await api.get(metrics_url)).status_code == 200


@pytest.mark.timeout(90)
async def test_a_workload_is_counted_exactly(api, scrape):
    before = await scrape()
    run_ids = [(await submit(api)).json()["run_id"] for _ in range(3)]
    run_ids.append((await submit(api, input=demo_input(fail=True))).json()["run_id"])
    # A long run, and one queued behind it in its session: cancelling the
    # queued one ends it without an executor (no run.started, one event).
    session = {"session": "metrics", "session_policy": "enqueue"}
    long = (await submit(api, input=demo_input(chunks=400, delay=0.05), **session)).json()
    queued = (await submit(api, input=demo_input(prompt="behind"), **session)).json()
    assert queued["status"] == "queued"
    await wait_seq(api, long["run_id"], 5)
    assert (await api.post(f"runs/{queued['run_id']}/cancel")).status_code == 202
    assert (await api.post(f"runs/{long['run_id']}/cancel")).status_code == 202
    run_ids += [long["run_id"], queued["run_id"]]
    runs = [await wait_run(api, run_id) for run_id in run_ids]
    statuses = [run["status"] for run in runs]
    assert statuses == ["succeeded"] * 3 + ["failed", "cancelled", "cancelled"]
    appended = sum(run["last_seq"] for run in runs)
    assert runs[-1]["last_seq"] == 1  # its run.cancelled, written by the cancel itself

    # Counter and histogram are read one after the other: a lease upkeep may
    # commit in between, so scrape until one scrape has both agree. A run's end
    # is counted once its commit is announced, which may be just after a read
    # of the store saw it: so scrape until the last end is counted too.
    expected_finished = {"succeeded": 3, "failed": 1, "cancelled": 2, "interrupted": 0}

    def finished(scraped):
        return {
            o: delta(scraped, before, "agentruns_runs_finished_total", outcome=o) for o in OUTCOMES
        }

    after = await scrape_until(
        scrape,
        lambda s: (
            s("agentruns_commits_total")
            == s("agentruns_commit_duration_seconds_count")
            == s("agentruns_commit_events_count")
            and sum(finished(s).values()) >= sum(expected_finished.values())
        ),
        "the commit counter and histograms agreeing, every end counted",
    )
    assert delta(after, before, "agentruns_runs_started_total") == 5
    assert finished(after) == expected_finished
    assert delta(after, before, "agentruns_events_appended_total") == appended
    # The writer's batches carry every event but the one the cancel wrote itself.
    assert delta(after, before, "agentruns_commit_events_sum") == appended - 1
    assert delta(after, before, "agentruns_commits_total") >= 1
    assert delta(after, before, "agentruns_commit_duration_seconds_sum") > 0
    assert after("agentruns_commit_events_bucket", le="+Inf") == after("agentruns_commits_total")
    assert delta(after, before, "agentruns_runs_resumed_total", reason="lease_expired") == 0
    assert after("agentruns_writer_queue_events") == 0
    assert after("agentruns_writer_queue_bytes") == 0
    assert after("agentruns_executing_runs") == 0

    # Runs by status: counted from the store off the event loop, every few seconds.
    expected = {"succeeded": 3, "failed": 1, "cancelled": 2, "queued": 0, "running": 0}
    await scrape_until(
        scrape,
        lambda s: all(s("agentruns_runs", status=k) == v for k, v in expected.items()),
        f"runs by status {expected}",
    )


@pytest.mark.timeout(60)
async def test_open_streams_and_subscribers_count_while_clients_follow(api, scrape):
    run = (await submit(api, input=demo_input(ask=True))).json()
    run = await waiting(api, run["run_id"])
    run_id, last = run["run_id"], run["last_seq"]
    before = await scrape()

    async with (
        api.stream(
            "GET", f"runs/{run_id}/events", headers={"Accept": "text/event-stream"}
        ) as stream,
        api.stream("GET", "streams", params={"runs": f"{run_id}:0"}) as page,
    ):
        # Each has sent everything up to the question: both now wait for more.
        # (The frame iterators are kept: dropping one would close its connection.)
        readers = [parse_sse(response.aiter_lines()) for response in (stream, page)]
        for frames in readers:
            while (await anext(frames)).get("event") != "input.requested":
                pass
        poll = asyncio.ensure_future(
            api.get(f"runs/{run_id}/events", params={"after": last, "wait": 20})
        )
        try:
            opened = await scrape_until(
                scrape,
                lambda s: delta(s, before, "agentruns_open_streams", kind="poll") == 1,
                "the long-poll waiting",
            )
        finally:
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)
        for kind in ("run", "page", "poll"):
            assert delta(opened, before, "agentruns_open_streams", kind=kind) == 1, kind
        assert delta(opened, before, "agentruns_subscribers") == 3
        assert opened("agentruns_subscriber_max_lag_events") == 0  # all caught up
        assert opened("agentruns_executing_runs") == 1
        # No label ever names a run (or anything else per run or per user).
        assert not [v for v in opened.label_values() if v.startswith("run_")]

    await scrape_until(
        scrape,
        lambda s: (
            all(
                s("agentruns_open_streams", kind=kind)
                == before("agentruns_open_streams", kind=kind)
                for kind in ("run", "page", "poll")
            )
            and s("agentruns_subscribers") == before("agentruns_subscribers")
        ),
        "the streams closed",
    )
    response = await api.post(f"runs/{run_id}/inputs/{run['snapshot']['inputs'][0]['request_id']}",
                              json={"choice": "approve"})  # fmt: skip
    assert response.status_code == 200
    assert (await wait_run(api, run_id))["status"] == "succeeded"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "agentruns_config", [{"event_retention_seconds": 0.2, "run_retention_seconds": 1.5}]
)
async def test_compaction_and_retention_are_counted(api, scrape):
    before = await scrape()
    run_ids = [(await submit(api, input=demo_input(chunks=n))).json()["run_id"] for n in (5, 30)]
    runs = [await wait_run(api, run_id) for run_id in run_ids]
    deleted = (await submit(api)).json()["run_id"]
    await wait_run(api, deleted)
    assert (await api.delete(f"runs/{deleted}")).status_code == 204

    # Compacted to their terminal event first, then deleted (410).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while any([(await api.get(f"runs/{run_id}")).status_code != 410 for run_id in run_ids]):
        assert loop.time() < deadline, "retention never deleted the runs"
        await asyncio.sleep(0.1)
    after = await scrape()
    compacted = sum(run["last_seq"] - 1 for run in runs)
    assert delta(after, before, "agentruns_events_compacted_total") == compacted
    assert delta(after, before, "agentruns_runs_deleted_total", reason="retention") == 2
    assert delta(after, before, "agentruns_runs_deleted_total", reason="request") == 1


def plant_expired_run(where: str, run_id: str) -> None:
    """A demo run another server started and then died with (its lease long expired)."""
    db = rawdb.connect(where)
    db.execute(
        "INSERT INTO runs (run_id, owner, agent, status, created_at, last_seq, first_seq, "
        "executor_id, lease_expires, metadata, input) VALUES (?, '~shared', 'demo', 'running', "
        "'2026-01-01T00:00:00.000Z', 1, 1, 'exec_gone', ?, '{}', ?)",
        [run_id, time.time() - 100, json.dumps(demo_input(chunks=10))],
    )
    db.execute(
        "INSERT INTO events (run_id, seq, type, ts, data) "
        "VALUES (?, 1, 'run.started', '2026-01-01T00:00:00.000Z', '{}')",
        [run_id],
    )
    db.commit()
    db.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agentruns_config", [{"lease_seconds": 0.6}])
async def test_a_takeover_after_an_expired_lease_is_counted(api, engine, scrape):
    await engine.start()
    before = await scrape()
    run_id = "run_" + secrets.token_urlsafe(16)
    plant_expired_run(rawdb.target(engine), run_id)
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded" and run["attempt"] == 2

    after = await scrape()
    assert delta(after, before, "agentruns_runs_resumed_total", reason="lease_expired") == 1
    assert delta(after, before, "agentruns_runs_resumed_total", reason="server_shutdown") == 0
    assert delta(after, before, "agentruns_leases_expired_total") == 1
    assert delta(after, before, "agentruns_runs_started_total") == 0  # started elsewhere
    assert delta(after, before, "agentruns_runs_finished_total", outcome="succeeded") == 1
    # Every event but the planted run.started: run.resumed, then the rest of the run.
    assert delta(after, before, "agentruns_events_appended_total") == run["last_seq"] - 1


@pytest.mark.timeout(120)
def test_a_run_handed_over_at_a_clean_stop_is_counted_by_the_server_that_takes_it(
    tmp_path, store_config
):
    def server(name: str) -> ServerProcess:
        config = {"lease_seconds": 30, **store_config}
        return ServerProcess(tmp_path / name, tmp_path / "agentruns.sqlite3", config).start()

    first = server("a")
    try:
        with first.client() as client:
            run_id = client.post("runs", json={"agent": "demo", "input": SLOW}).json()["run_id"]
            while client.get(f"runs/{run_id}").json()["last_seq"] < 20:
                time.sleep(0.02)
        assert first.terminate(timeout=30) == 0
    finally:
        first.kill()
    second = server("b")
    try:
        with second.client() as client:
            run = wait_status(client, run_id, set(OUTCOMES), timeout=30)
            assert run["status"] == "succeeded" and run["attempt"] == 2
            events = client.get(f"runs/{run_id}/events", params={"limit": 1000}).json()["events"]
            [resumed] = [event for event in events if event["type"] == "run.resumed"]
            # A new process: its counters start at 0.
            after = Scrape(
                httpx.get(
                    second.url + "metrics", headers={"Authorization": f"token {second.token}"}
                ).text
            )
    finally:
        second.kill()
    assert after("agentruns_runs_resumed_total", reason="server_shutdown") == 1
    assert after("agentruns_runs_resumed_total", reason="lease_expired") == 0
    assert after("agentruns_leases_expired_total") == 0  # handed over, not expired
    assert after("agentruns_runs_started_total") == 0
    assert after("agentruns_runs_finished_total", outcome="succeeded") == 1
    # From run.resumed on, every event is the second server's.
    assert after("agentruns_events_appended_total") == run["last_seq"] - resumed["data"]["from_seq"]


class Source:
    def __init__(self, figure):
        self.figure = figure


@pytest.mark.timeout(10)
def test_a_sampled_gauge_adds_up_its_live_sources_and_forgets_the_gone():
    gauge = Sampled("agentruns_test_sampled", "A gauge of the test's own.")
    one, two = Source(2), Source(3)
    gauge.track(one, lambda source: source.figure)
    gauge.track(two, lambda source: source.figure)
    assert gauge.family().samples[0].value == 5
    two.figure = 7
    assert gauge.family().samples[0].value == 9
    gauge.untrack(one)
    assert gauge.family().samples[0].value == 7
    del two  # a server dropped without a goodbye is no longer counted
    assert gauge.family().samples[0].value == 0


@pytest.mark.timeout(10)
def test_a_labelled_sampled_gauge_combines_per_label_value():
    gauge = Sampled(
        "agentruns_test_labelled", "A gauge of the test's own.", label="status", combine=max
    )
    one, two = Source({"queued": 1, "running": 4}), Source({"running": 2})
    gauge.track(one, lambda source: source.figure)
    gauge.track(two, lambda source: source.figure)
    samples = {s.labels["status"]: s.value for s in gauge.family().samples}
    assert samples == {"queued": 1, "running": 4}


@pytest.mark.timeout(10)
def test_the_outcome_label_takes_exactly_the_terminal_statuses():
    assert metrics.OUTCOMES == lifecycle.TERMINAL_STATUSES


PER_USER = {"identity_provider_class": "identity.HeaderIdentityProvider"}


@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize("agentruns_config", [{"served_owners": ["alice"]}])
async def test_runs_by_status_count_only_the_runs_of_the_owners_the_server_serves(api, scrape):
    """On a hub's shared store, a user's /metrics showed every user's run counts."""
    for user, count in (("alice", 2), ("bob", 3)):
        for _ in range(count):
            run = await submit(api, input=demo_input(chunks=1), headers={"X-Test-User": user})
            await wait_run(api, run.json()["run_id"], headers={"X-Test-User": user})
    await scrape_until(
        scrape, lambda s: s("agentruns_runs", status="succeeded") == 2, "alice's 2 runs alone"
    )


@pytest.mark.parametrize("server_config", [PER_USER])
@pytest.mark.parametrize(
    "agentruns_config", [{"served_owners": ["alice"], "store_wide_metrics": True}]
)
async def test_store_wide_metrics_count_every_run_of_the_store(api, scrape):
    for user in ("alice", "bob"):
        run = await submit(api, input=demo_input(chunks=1), headers={"X-Test-User": user})
        await wait_run(api, run.json()["run_id"], headers={"X-Test-User": user})
    await scrape_until(
        scrape, lambda s: s("agentruns_runs", status="succeeded") == 2, "both users' runs"
    )
