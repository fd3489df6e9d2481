"""Schedules: a run at each time a cron expression names, one per slot however many servers.

Slots a second apart (croniter's sixth field, seconds) and a short
``schedule_tick_seconds`` make a schedule's life take seconds; a slot missed
while no server ran is made by moving the schedule's last handled slot back
while its server is stopped.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from servers import ServerProcess

pytest.importorskip("croniter")

PER_USER = {"ServerApp": {"identity_provider_class": "identity.HeaderIdentityProvider"}}
ALICE = {"X-Test-User": "alice"}
BOB = {"X-Test-User": "bob"}
QUICK = {"prompt": "q", "chunks": 1, "delay": 0, "tools": False}
EVERY_SECOND = "* * * * * *"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("schedules")
    server = ServerProcess(
        home / "home",
        home / "agentruns.sqlite3",
        {"owner_mode": "per-user", "schedule_tick_seconds": 0.1},
        config=PER_USER,
    ).start()
    try:
        yield server
    finally:
        server.kill()


def client(server: ServerProcess, user: dict) -> httpx.Client:
    made = server.client()
    made.headers.update(user)
    return made


def schedule(**fields) -> dict:
    return {"agent": "demo", "input": QUICK, "cron": "0 9 * * 1-5", "timezone": "UTC", **fields}


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def scheduled_runs(client: httpx.Client, schedule_id: str) -> list[dict]:
    """The caller's runs made by the schedule, oldest slot first."""
    runs = client.get("runs", params={"limit": 500}).json()["runs"]
    mine = [run for run in runs if run["metadata"].get("schedule_id") == schedule_id]
    return sorted(mine, key=lambda run: run["metadata"]["scheduled_for"])


def wait_runs(client: httpx.Client, schedule_id: str, count: int, timeout: float = 30) -> list:
    deadline = time.monotonic() + timeout
    while True:
        runs = scheduled_runs(client, schedule_id)
        if len(runs) >= count:
            return runs
        assert time.monotonic() < deadline, f"{len(runs)} scheduled run(s) after {timeout} s"
        time.sleep(0.1)


def assert_one_run_per_slot(runs: list[dict]) -> None:
    """Each slot a second after the one before, each with one run: none missed, none twice."""
    slots = [parse(run["metadata"]["scheduled_for"]) for run in runs]
    assert slots == sorted(set(slots)), "a slot made two runs"
    assert all(b - a == timedelta(seconds=1) for a, b in zip(slots, slots[1:], strict=False))


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess:
    environ = {**server.env, "AGENTRUNS_URL": server.url, "AGENTRUNS_TOKEN": server.token}
    return subprocess.run(
        [sys.executable, "-m", "jupyter_agentruns.cli", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_bad_schedules_are_refused_and_nothing_is_stored(server):
    with client(server, ALICE) as alice:
        refused = [
            (schedule(agent="nope"), 404, "unknown_agent"),
            (schedule(input={"prompt": 3}), 400, "invalid_input"),
            (schedule(cron="61 * * * *"), 400, "invalid_request"),
            (schedule(cron="* * * *"), 400, "invalid_request"),
            (schedule(cron="@reboot"), 400, "invalid_request"),
            (schedule(cron="x" * 300), 400, "invalid_request"),
            (schedule(timezone="Mars/Olympus"), 400, "invalid_request"),
            (schedule(timezone="../../etc/passwd"), 400, "invalid_request"),
            (schedule(timezone=None), 400, "invalid_request"),
            (schedule(session=3), 400, "invalid_request"),
            (schedule(every="day"), 400, "invalid_request"),
        ]
        for body, status, code in refused:
            response = alice.post("schedules", json=body)
            assert response.status_code == status, (body, response.text)
            assert response.json()["error"] == code, body
            assert response.json()["message"]
        cron = alice.post("schedules", json=schedule(cron="61 * * * *")).json()["message"]
        assert "61 * * * *" in cron
        zone = alice.post("schedules", json=schedule(timezone="Mars/Olympus")).json()["message"]
        assert "IANA" in zone
        assert alice.get("schedules").json() == {"schedules": []}


def test_a_schedule_is_created_listed_paused_and_deleted_by_its_owner_alone(server):
    with client(server, ALICE) as alice, client(server, BOB) as bob:
        made = alice.post("schedules", json=schedule(timezone="Europe/Paris", session="daily"))
        assert made.status_code == 201, made.text
        created = made.json()
        schedule_id = created["schedule_id"]
        assert made.headers["Location"].endswith(f"/api/agentruns/schedules/{schedule_id}")
        assert created["cron"] == "0 9 * * 1-5" and created["timezone"] == "Europe/Paris"
        assert created["session"] == "daily" and created["paused"] is False
        assert created["last_runs"] == [] and created["skipped"] == 0 and created["skips"] == []
        # 9:00 in Paris in December is 8:00 UTC, on a weekday, in the future.
        next_at = parse(created["next_at"])
        assert next_at > datetime.now(timezone.utc)
        assert (next_at.hour, next_at.minute) == (8, 0) and next_at.weekday() < 5

        listed = alice.get("schedules").json()["schedules"]
        assert [s["schedule_id"] for s in listed] == [schedule_id]
        assert listed[0]["next_at"] == created["next_at"]
        assert alice.get(f"schedules/{schedule_id}").json()["next_at"] == created["next_at"]

        # Another person's schedule is not there for them.
        assert bob.get("schedules").json() == {"schedules": []}
        for method, body in (("GET", None), ("PATCH", {"paused": True}), ("DELETE", None)):
            response = bob.request(method, f"schedules/{schedule_id}", json=body)
            assert response.status_code == 404, method
            assert response.json()["error"] == "schedule_not_found"

        for body in ({}, {"paused": "yes"}, {"paused": True, "cron": "* * * * *"}):
            response = alice.patch(f"schedules/{schedule_id}", json=body)
            assert response.status_code == 400, body
        paused = alice.patch(f"schedules/{schedule_id}", json={"paused": True})
        assert paused.status_code == 200
        assert paused.json()["paused"] is True and paused.json()["next_at"] is None
        resumed = alice.patch(f"schedules/{schedule_id}", json={"paused": False}).json()
        assert resumed["paused"] is False and resumed["next_at"] == created["next_at"]

        assert alice.delete(f"schedules/{schedule_id}").status_code == 204
        gone = alice.get(f"schedules/{schedule_id}")
        assert gone.status_code == 404 and gone.json()["error"] == "schedule_not_found"
        assert alice.delete(f"schedules/{schedule_id}").status_code == 404
        assert alice.get("schedules").json() == {"schedules": []}


def test_every_slot_makes_one_run_as_its_owner_and_a_paused_schedule_none(server):
    with client(server, ALICE) as alice, client(server, BOB) as bob:
        created = alice.post("schedules", json=schedule(cron=EVERY_SECOND)).json()
        schedule_id = created["schedule_id"]
        try:
            runs = wait_runs(alice, schedule_id, 3)
        finally:
            paused = alice.patch(f"schedules/{schedule_id}", json={"paused": True})
            paused_at = datetime.now(timezone.utc)
        assert paused.status_code == 200
        assert_one_run_per_slot(runs)
        assert all(run["agent"] == "demo" and run["input"] == QUICK for run in runs)
        assert all(
            parse(run["metadata"]["scheduled_for"]) > parse(created["last_slot"]) for run in runs
        )
        assert bob.get("runs").json()["runs"] == []  # alice's runs, not anyone else's

        # Its newest runs, newest first.
        ran = scheduled_runs(alice, schedule_id)
        listed = alice.get(f"schedules/{schedule_id}").json()["last_runs"]
        assert [run["run_id"] for run in listed] == [run["run_id"] for run in ran[::-1][:5]]

        # Paused: no slot after makes a run (the ticks come ten times a second).
        time.sleep(1.5)
        ran = scheduled_runs(alice, schedule_id)
        assert all(parse(run["metadata"]["scheduled_for"]) <= paused_at for run in ran)
        # Resumed: the slots that came while it was paused are not made up for.
        resumed_at = datetime.now(timezone.utc).replace(microsecond=0)
        alice.patch(f"schedules/{schedule_id}", json={"paused": False})
        later = wait_runs(alice, schedule_id, len(ran) + 1)
        alice.delete(f"schedules/{schedule_id}")
        assert parse(later[len(ran)]["metadata"]["scheduled_for"]) >= resumed_at


@pytest.mark.timeout(120)
def test_two_servers_on_one_store_make_one_run_per_slot(tmp_path, store_config):
    settings = {"schedule_tick_seconds": 0.05, **store_config}
    servers = [
        ServerProcess(tmp_path / name, tmp_path / "agentruns.sqlite3", settings)
        for name in ("one", "two")
    ]
    try:
        for each in servers:
            each.start()
        with servers[0].client() as one, servers[1].client() as two:
            created = one.post("schedules", json=schedule(cron=EVERY_SECOND))
            assert created.status_code == 201, created.text
            schedule_id = created.json()["schedule_id"]
            try:
                runs = wait_runs(two, schedule_id, 3)
            finally:
                one.patch(f"schedules/{schedule_id}", json={"paused": True})
            runs = scheduled_runs(one, schedule_id)
            assert len(runs) >= 3
            assert_one_run_per_slot(runs)
            assert two.get(f"schedules/{schedule_id}").json()["skipped"] == 0
    finally:
        for each in servers:
            each.kill()


@pytest.mark.timeout(120)
def test_a_slot_missed_while_no_server_ran_runs_once_at_start_and_older_ones_are_skipped(
    tmp_path,
):
    # One look at the schedules at start-up, and none after: what runs, runs at start.
    db_path = tmp_path / "agentruns.sqlite3"
    server = ServerProcess(tmp_path / "home", db_path, {"schedule_tick_seconds": 3600}).start()
    try:
        with server.client() as api:
            created = api.post("schedules", json=schedule(cron="* * * * *"))
            assert created.status_code == 201, created.text
            schedule_id = created.json()["schedule_id"]
        server.terminate()
        # Ten minutes of slots came while no server ran.
        minute = datetime.now(timezone.utc).replace(second=0, microsecond=0)
        handled = (minute - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
        db = sqlite3.connect(db_path)
        with db:
            db.execute("UPDATE schedules SET last_slot = ?", [handled])
        db.close()

        server.start()
        with server.client() as api:
            runs = wait_runs(api, schedule_id, 1)
            got = api.get(f"schedules/{schedule_id}").json()
            assert len(scheduled_runs(api, schedule_id)) == 1
        newest = parse(runs[0]["metadata"]["scheduled_for"])
        # The newest slot (the minute of the restart), once; every older one skipped.
        assert newest >= minute and newest <= datetime.now(timezone.utc)
        missed = int((newest - parse(handled)).total_seconds() // 60)
        assert got["skipped"] == missed - 1 >= 9
        [skip] = got["skips"]
        assert skip["count"] == missed - 1
        assert parse(skip["first"]) == parse(handled) + timedelta(minutes=1)
        assert parse(skip["last"]) == newest - timedelta(minutes=1)
        assert got["last_slot"] == runs[0]["metadata"]["scheduled_for"]
        assert [run["run_id"] for run in got["last_runs"]] == [runs[0]["run_id"]]

        # The command line lists it, with its next time and last run.
        listed = cli(server, "schedules", "--json")
        assert listed.returncode == 0, listed.stderr
        [shown] = json.loads(listed.stdout)
        assert shown["schedule_id"] == schedule_id and shown["skipped"] == missed - 1
        header, row = cli(server, "schedules").stdout.splitlines()
        assert header.split() == [
            "SCHEDULE", "AGENT", "CRON", "TIMEZONE", "NEXT", "(UTC)", "LAST", "RUNS", "SKIPPED",
        ]  # fmt: skip
        assert row.startswith(schedule_id) and "* * * * *" in row and "UTC" in row
        assert row.split()[-1] == str(missed - 1)
    finally:
        server.kill()
