"""An event and the run state it implies commit together; nothing is visible half-written."""

import asyncio
import json

import rawdb

from conftest import demo_input, submit, wait_run, wait_seq

TERMINAL_EVENT = {
    "succeeded": "run.succeeded",
    "failed": "run.failed",
    "cancelled": "run.cancelled",
    "interrupted": "run.interrupted",
}


def check_consistency(where, stop, problems, checks):
    db = rawdb.connect(where)
    try:
        while not stop.is_set():
            db.execute("BEGIN")
            runs = db.execute(
                "SELECT run_id, status, last_seq, output, error, cancel FROM runs"
            ).fetchall()
            for run_id, status, last_seq, output, error, cancel in runs:
                count, top = db.execute(
                    "SELECT count(*), coalesce(max(seq), 0) FROM events WHERE run_id = ?", [run_id]
                ).fetchone()
                if not count == top == last_seq:
                    problems.append(f"{run_id}: {count} events, max seq {top}, last_seq {last_seq}")
                last_type = db.execute(
                    "SELECT type FROM events WHERE run_id = ? AND seq = ?", [run_id, last_seq]
                ).fetchone()
                if status in TERMINAL_EVENT:
                    if last_type is None or last_type[0] != TERMINAL_EVENT[status]:
                        problems.append(f"{run_id}: status {status} but last event {last_type}")
                    if status == "succeeded" and output is None:
                        problems.append(f"{run_id}: succeeded without output")
                    if status == "failed" and json.loads(error or "null") is None:
                        problems.append(f"{run_id}: failed without error")
                if status == "cancelling" and cancel is None:
                    problems.append(f"{run_id}: cancelling without its cancel record")
                if status == "running" and last_seq == 0:
                    problems.append(f"{run_id}: running without run.started")
            db.execute("COMMIT")
            checks.append(1)
    finally:
        db.close()


async def test_no_reader_ever_sees_a_status_without_its_event_or_a_terminal_without_output(
    api, engine
):
    import threading

    await engine.start()  # the store is made (and migrated) before the checker reads it
    stop, problems, checks = threading.Event(), [], []
    checker = asyncio.get_running_loop().run_in_executor(
        None, check_consistency, rawdb.target(engine), stop, problems, checks
    )
    try:
        run_ids = []
        for index in range(8):
            # Runs 0 and 4 are cancelled: slow enough that no load lets them end first.
            delay = 0.05 if index % 4 == 0 else 0.001
            response = await submit(
                api, input=demo_input(chunks=150, delay=delay, fail=index % 3 == 1)
            )
            run_ids.append(response.json()["run_id"])
        for run_id in run_ids[::4]:
            await wait_seq(api, run_id, 3)
            await api.post(f"runs/{run_id}/cancel")
        runs = [await wait_run(api, run_id) for run_id in run_ids]
    finally:
        stop.set()
        await checker
    assert {run["status"] for run in runs} == {"succeeded", "failed", "cancelled"}
    assert len(checks) > 10
    assert problems == []


async def test_the_api_never_shows_a_terminal_status_before_its_terminal_event(api):
    run_id = (await submit(api, input=demo_input(chunks=100, delay=0.001))).json()["run_id"]
    while True:
        run = (await api.get(f"runs/{run_id}")).json()
        body = (
            await api.get(f"runs/{run_id}/events", params={"after": max(0, run["last_seq"] - 1)})
        ).json()
        if run["status"] == "succeeded":
            assert body["events"][-1]["type"] == "run.succeeded"
            assert body["events"][-1]["data"]["output"] == run["output"] is not None
            break
        assert body["last_seq"] >= run["last_seq"]
