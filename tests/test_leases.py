"""Leases: only runs whose server really stopped are interrupted.

A locked database loses nothing.
"""

import asyncio
import time

import pytest
import rawdb

from jupyter_agentruns.store import sqlite as store

from conftest import all_events, demo_input, submit, wait_for, wait_run, wait_seq, write_lock_held


def insert_foreign_run(where, run_id, lease_expires):
    """A running run of another server (executor) sharing the database."""
    db = rawdb.connect(where)
    db.execute(
        "INSERT INTO runs (run_id, owner, agent, status, created_at, last_seq, first_seq, "
        "executor_id, lease_expires, metadata, input) VALUES (?, '~shared', 'demo', 'running', "
        "'2026-01-01T00:00:00.000Z', 1, 1, 'exec_other', ?, '{}', '{}')",
        [run_id, lease_expires],
    )
    db.execute(
        "INSERT INTO events (run_id, seq, type, ts, data) "
        "VALUES (?, 1, 'run.started', '2026-01-01T00:00:00.000Z', '{}')",
        [run_id],
    )
    db.commit()
    db.close()


def set_lease(where, run_id, lease_expires):
    db = rawdb.connect(where)
    db.execute("UPDATE runs SET lease_expires = ? WHERE run_id = ?", [lease_expires, run_id])
    db.commit()
    db.close()


# No takeovers: the demo run it plants would be resumed here, not interrupted.
@pytest.mark.parametrize("agentruns_config", [{"lease_seconds": 0.6, "max_resume_attempts": 0}])
async def test_an_expired_lease_that_is_renewed_in_time_is_never_interrupted(api, engine):
    await engine.start()
    path = rawdb.target(engine)
    insert_foreign_run(path, "run_other", time.time() - 100)  # looks long dead (a clock jump)
    assert await engine.upkeep.sweep() == 0  # first seen: not yet
    set_lease(path, "run_other", time.time() + 60)  # its server wakes up and renews
    await asyncio.sleep(0.8)
    assert await engine.upkeep.sweep() == 0
    assert (await api.get("runs/run_other")).json()["status"] == "running"

    set_lease(path, "run_other", time.time() - 1)  # now it really stops renewing
    assert await engine.upkeep.sweep() == 0
    assert (await api.get("runs/run_other")).json()["status"] == "running"
    run = await wait_run(api, "run_other", timeout=5)  # the periodic sweep ends it
    assert run["status"] == "interrupted" and run["last_seq"] == 2
    events = await all_events(api, "run_other")
    assert events[-1]["type"] == "run.interrupted" and events[-1]["data"] == {
        "reason": "lease_expired"
    }


@pytest.fixture
def agentruns_config(monkeypatch):
    # Shorter than the lock below: the writer must back off and retry, not fail.
    monkeypatch.setattr(store, "BUSY_TIMEOUT_MS", 100)
    return {}


@pytest.mark.sqlite_only
async def test_a_database_locked_by_another_process_delays_but_loses_nothing(api, engine, caplog):
    run_id = (await submit(api, input=demo_input(chunks=200, delay=0.005))).json()["run_id"]
    await wait_seq(api, run_id, 5)
    with write_lock_held(engine.settings.db_path):
        await asyncio.sleep(1.0)
    run = await wait_run(api, run_id)
    assert run["status"] == "succeeded"
    events = await all_events(api, run_id)
    assert [e["seq"] for e in events] == list(range(1, run["last_seq"] + 1))
    assert run["output"]["text"] == run["snapshot"]["messages"][0]["text"]
    assert "retrying" in caplog.text  # the writer did back off


@pytest.mark.parametrize("agentruns_config", [{}])
async def test_a_run_whose_seqs_another_server_took_stops_and_the_others_go_on(api, engine, caplog):
    taken = (await submit(api, input=demo_input(chunks=500, delay=0.01))).json()["run_id"]
    other = (await submit(api, input=demo_input(chunks=100, delay=0.01))).json()["run_id"]
    await wait_seq(api, taken, 10)
    # Another server takes the run's seqs a little ahead of our writer, in one
    # transaction (PostgreSQL's writers do not wait for each other as SQLite's do:
    # the gap keeps the two from racing for the same row while this one writes).
    db = rawdb.connect(rawdb.target(engine))
    try:
        db.execute("BEGIN IMMEDIATE")
        (last,) = db.execute("SELECT last_seq FROM runs WHERE run_id = ?", [taken]).fetchone()
        db.executemany(
            "INSERT INTO events (run_id, seq, type, ts, data) "
            "VALUES (?, ?, 'x.other', '2026-01-01T00:00:00.000Z', '{}')",
            [(taken, seq) for seq in range(last + 30, last + 2030)],
        )
        db.execute("COMMIT")
    finally:
        db.close()
    finished = await wait_run(api, other)
    assert finished["status"] == "succeeded"
    events = await all_events(api, other)
    assert [e["seq"] for e in events] == list(range(1, finished["last_seq"] + 1))
    await wait_for(lambda: not engine.executor.executes(taken), what="the refused run to stop")
    assert "were refused" in caplog.text
