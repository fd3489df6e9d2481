"""Moving to PostgreSQL: `jupyter agentruns copy` merges SQLite stores into a schema, or refuses and writes nothing."""

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
import rawdb

from jupyter_agentruns.cli import main
from jupyter_agentruns.store.copy import CopyRefused, copy_store
from jupyter_agentruns.store.sqlite import MIGRATIONS, SQLiteStore

from servers import ServerProcess, wait_status

# Every test copies into PostgreSQL: without a server they skip, before building their sources.
pytestmark = pytest.mark.usefixtures("postgres_database")

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}
QUICK = {"prompt": "quick", "chunks": 10, "delay": 0}
SLOW = {"prompt": "slow", "chunks": 1000, "delay": 0.02}
ASKING = {"prompt": "ask", "chunks": 5, "delay": 0, "ask": True}
# A server that records an answer in the SQLite store and is killed before it can close it.
RECORD_ANSWER_AND_DIE = """
import os, signal, sys
from jupyter_agentruns.store.sqlite import SQLiteStore
conn = SQLiteStore(sys.argv[1]).connect()
with conn.transaction():
    conn.record_input_answer(sys.argv[2], sys.argv[3], {"choice": "approve"}, 1.0)
os.kill(os.getpid(), signal.SIGKILL)
"""
# The command, then its peak memory: the high-water mark of its own memory map. A
# child's ru_maxrss counts its parent's memory, taken across fork and exec.
PEAK_MEMORY_OF_THE_COMMAND = """
import re, runpy, sys
try:
    runpy.run_module("jupyter_agentruns.cli", run_name="__main__", alter_sys=True)
finally:
    status = open("/proc/self/status").read()
    print("peak", re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1), "kB", file=sys.stderr)
"""
PER_USER = {"ServerApp": {"identity_provider_class": "identity.HeaderIdentityProvider"}}
ALICE = {"X-Test-User": "alice"}
# Every table, each with the columns that order its rows (PostgreSQL's runs add ``position``).
TABLES = {
    "runs": "run_id",
    "events": "run_id, seq",
    "snapshots": "run_id",
    "snapshot_parts": "run_id, part",
    "idempotency_keys": "owner, key",
    "tombstones": "run_id",
    "input_answers": "run_id, request_id",
    "webhooks": "hook_id",
    "webhook_deliveries": "delivery_id",
    "schedules": "schedule_id",
}


def copy(source, url, *options, env=None):
    """The command, as a person runs it; returns its exit status and text output.

    It runs as the program's ``main`` in this process, with ``env`` on top of the
    environment (a fresh interpreter costs a second of CPU, and the program's
    ``__main__`` is only ``sys.exit(main())``); the test of its memory runs it
    as a process of its own.
    """
    args = ["copy", "--from", str(source), *(["--to", url] if url is not None else []), *options]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(args, out)
            except SystemExit as exit:  # argparse's usage errors
                status = exit.code if isinstance(exit.code, int) else 1
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


def submit(client, input, **body):
    headers = body.pop("headers", None)
    response = client.post("runs", json={"agent": "demo", "input": input, **body}, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["run_id"]


def rows(where, table, exclude=()):
    db = rawdb.connect(where)
    try:
        cursor = db.execute(f"SELECT * FROM {table} ORDER BY {TABLES[table]}")
        names = [column[0] for column in cursor.description]
        return [
            {n: v for n, v in zip(names, row, strict=True) if n not in exclude}
            for row in cursor.fetchall()
        ]
    finally:
        db.close()


def submit_order(where):
    """Run ids in the order their store keeps submits: SQLite's rowid, PostgreSQL's position."""
    order = "rowid" if not str(where).startswith("postgres") else "position"
    db = rawdb.connect(where)
    try:
        return [row[0] for row in db.execute(f"SELECT run_id FROM runs ORDER BY {order}")]
    finally:
        db.close()


def file_digests(path):
    """The SQLite file and its write-ahead log, hashed: what a read-only copy must leave alone.

    A reader may create an empty log where there was none: the same as none.
    """
    return [
        hashlib.sha256(open(name, "rb").read() if os.path.exists(name) else b"").hexdigest()
        for name in (str(path), f"{path}-wal")
    ]


def duplicate(path, to):
    """A copy of a SQLite store with its write-ahead log (a killed server leaves one)."""
    for suffix in ("", "-wal"):
        if os.path.exists(f"{path}{suffix}"):
            shutil.copyfile(f"{path}{suffix}", f"{to}{suffix}")
    return to


def schema_exists(url):
    schema = dict(p.split("=") for p in urlsplit(url).query.split("&"))["schema"]
    db = rawdb.connect(urlunsplit(urlsplit(url)._replace(query="schema=public")))
    try:
        return bool(db.execute("SELECT 1 FROM pg_namespace WHERE nspname = ?", [schema]).fetchall())
    finally:
        db.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A SQLite store real servers filled, then stopped: every ending, a key, a session, a compacted run, a tombstone.

    Returns what they answered for each run, to hold the copy to.
    """
    home = tmp_path_factory.mktemp("sqlite")
    path = home / "agentruns.sqlite3"
    # Retention deletes a run within a second here, leaving its tombstone.
    server = ServerProcess(home / "retention", path, {"run_retention_seconds": 1}).start()
    try:
        with server.client() as client:
            buried = submit(client, QUICK)
            deadline = time.monotonic() + 30
            while client.get(f"runs/{buried}").status_code != 410:
                assert time.monotonic() < deadline, "retention did not delete the run"
                time.sleep(0.1)
    finally:
        server.terminate()
    # Compaction keeps 40 events of a run: a long one keeps its snapshot and its last ones.
    server = ServerProcess(home / "server", path, {"max_retained_events": 40}).start()
    try:
        with server.client() as client:
            ids = {
                "succeeded": submit(client, QUICK),
                "failed": submit(client, {**QUICK, "fail": True}),
                "keyed": submit(client, QUICK, headers={"Idempotency-Key": "notebook-cell-1"}),
                "compacted": submit(client, {**QUICK, "chunks": 200}),
                "cancelled": submit(client, SLOW),
            }
            wait_status(client, ids["cancelled"], {"running"})
            assert client.post(f"runs/{ids['cancelled']}/cancel").status_code == 202
            session = [
                submit(client, QUICK, session="chat", session_policy="enqueue") for _ in range(3)
            ]
            for run_id in [*ids.values(), *session]:
                wait_status(client, run_id, TERMINAL)
    finally:
        server.terminate()
    # What the runs look like, from a server that changes nothing of them (a live
    # compaction of the one above could still be going on).
    server = ServerProcess(home / "reader", path).start()
    try:
        with server.client() as client:
            runs = {
                run_id: client.get(f"runs/{run_id}").text for run_id in [*ids.values(), *session]
            }
            events = {
                run_id: [
                    client.get(f"runs/{run_id}/events", params={"after": after}).text
                    for after in (0, json.loads(run)["first_seq"] - 1)
                ]
                for run_id, run in runs.items()
            }
            listing = client.get("runs", params={"limit": 500}).text
    finally:
        server.terminate()
    ended = {run_id: json.loads(run) for run_id, run in runs.items()}
    assert {ended[ids[name]]["status"] for name in ("succeeded", "keyed")} == {"succeeded"}
    assert ended[ids["failed"]]["status"] == "failed"
    assert ended[ids["cancelled"]]["status"] == "cancelled"
    assert ended[ids["compacted"]]["first_seq"] > 1, "the run was not compacted"
    return {
        "path": path,
        "ids": ids,
        "buried": buried,
        "runs": runs,
        "events": events,
        "listing": listing,
    }


@pytest.fixture
def servers(tmp_path):
    started = []

    def start(name, path=None, **agentruns):
        path = path or tmp_path / f"{name}.sqlite3"
        server = ServerProcess(tmp_path / name, path, agentruns).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.mark.timeout(120)
def test_a_server_on_the_copy_answers_every_run_and_event_as_the_sqlite_server_did(
    source, postgres_url, servers
):
    before = file_digests(source["path"])
    done = copy(source["path"], postgres_url)
    assert done.returncode == 0, done.stderr
    assert f"runs: {len(source['runs'])} copied" in done.stdout and "copied in" in done.stdout
    assert file_digests(source["path"]) == before, "the copy changed its source"

    # Every table, row for row; runs keep their submit order (a session's queue its order).
    for table in TABLES:
        assert rows(postgres_url, table, exclude={"position"}) == rows(source["path"], table)
    assert submit_order(postgres_url) == submit_order(source["path"])

    with servers("postgres", store_url=postgres_url).client() as client:
        assert client.get("runs", params={"limit": 500}).text == source["listing"]
        for run_id, run in source["runs"].items():
            assert client.get(f"runs/{run_id}").text == run
            for after, body in zip(
                (0, json.loads(run)["first_seq"] - 1), source["events"][run_id], strict=True
            ):
                assert client.get(f"runs/{run_id}/events", params={"after": after}).text == body
        keyed = source["ids"]["keyed"]
        replay = client.post(
            "runs",
            json={"agent": "demo", "input": QUICK},
            headers={"Idempotency-Key": "notebook-cell-1"},
        )
        assert replay.status_code == 200 and replay.json() == json.loads(source["runs"][keyed])
        gone = client.get(f"runs/{source['buried']}")
        assert gone.status_code == 410 and gone.json()["error"] == "run_expired"


def test_a_second_copy_of_the_same_file_changes_nothing_and_counts_its_runs_as_there(
    source, postgres_url
):
    done = copy(source["path"], postgres_url, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["copied"]["runs"] == len(source["runs"])  # progress: stderr
    # A single-user server's runs belong to its one owner, whom a hub's servers do not serve.
    assert f"{len(source['runs'])} runs copied as ~shared's" in done.stderr
    assert "--owner NAME" in done.stderr
    before = {table: rows(postgres_url, table) for table in TABLES}
    again = copy(source["path"], postgres_url, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["copied"] == dict.fromkeys(TABLES, 0)
    assert json.loads(again.stdout)["skipped"] == {
        "runs_already_there": len(source["runs"]),
        "runs_deleted_there": 0,
        "keys_taken": 0,
    }
    assert f"{len(source['runs'])} runs already there (copied before): skipped" in again.stderr
    assert {table: rows(postgres_url, table) for table in TABLES} == before


@pytest.mark.timeout(120)
def test_files_of_several_servers_merge_into_one_schema_each_run_with_its_owner(
    source, postgres_url, tmp_path
):
    """A team moves to its hub: Alice's per-user server's file, then a single-user server's she used."""
    path = tmp_path / "alice.sqlite3"
    alices = ServerProcess(tmp_path / "alice", path, {"owner_mode": "per-user"}, config=PER_USER)
    alices.start()
    try:
        with alices.client() as client:
            client.headers.update(ALICE)
            own = [
                submit(client, QUICK, headers={"Idempotency-Key": "notebook-cell-1"}),
                submit(client, {**QUICK, "prompt": "another"}),
            ]
            for run_id in own:
                wait_status(client, run_id, TERMINAL)
    finally:
        alices.terminate()

    first = copy(path, postgres_url)
    assert first.returncode == 0, first.stderr
    assert "runs: 2 copied" in first.stdout and "~shared" not in first.stdout
    merged = copy(source["path"], postgres_url, "--owner", "alice")
    assert merged.returncode == 0, merged.stderr
    shared = len(source["runs"])
    assert f"runs: {shared} copied" in merged.stdout
    assert f"{shared} runs of ~shared copied as alice's" in merged.stdout
    # Both files have a run of the key: the one copied first keeps it.
    assert "1 Idempotency-Key already used there for another run" in merged.stdout
    owners = {row["run_id"]: row["owner"] for row in rows(postgres_url, "runs")}
    assert owners == dict.fromkeys([*own, *source["runs"]], "alice")
    assert submit_order(postgres_url) == own + submit_order(source["path"])
    gone = rows(postgres_url, "tombstones")
    assert [(t["run_id"], t["owner"]) for t in gone] == [(source["buried"], "alice")]

    server = ServerProcess(
        tmp_path / "postgres",
        tmp_path / "unused.sqlite3",
        {"store_url": postgres_url, "owner_mode": "per-user"},
        config=PER_USER,
    ).start()
    try:
        with server.client() as client:
            listed = client.get("runs", params={"limit": 500}, headers=ALICE).json()["runs"]
            assert {run["run_id"] for run in listed} == set(owners)
            assert client.get("runs", headers={"X-Test-User": "bob"}).json()["runs"] == []
            replay = client.post(
                "runs",
                json={"agent": "demo", "input": QUICK},
                headers={**ALICE, "Idempotency-Key": "notebook-cell-1"},
            )
            assert replay.status_code == 200 and replay.json()["run_id"] == own[0]
            keyed = source["ids"]["keyed"]
            assert client.get(f"runs/{keyed}", headers=ALICE).json()["status"] == "succeeded"
    finally:
        server.kill()


def test_a_file_copied_again_with_another_owner_is_refused_and_nothing_of_it_is_kept(
    source, postgres_url
):
    assert copy(source["path"], postgres_url, "--owner", "alice").returncode == 0
    before = {table: rows(postgres_url, table) for table in TABLES}
    refused = copy(source["path"], postgres_url, "--owner", "bob")
    assert refused.returncode == 1
    assert "holds runs whose ids" in refused.stderr
    assert "owner 'alice' there, 'bob' here" in refused.stderr
    assert "Nothing of the file was copied" in refused.stderr
    assert {table: rows(postgres_url, table) for table in TABLES} == before


def test_a_run_deleted_there_is_not_brought_back_and_tombstones_of_other_stores_merge(
    source, postgres_url, tmp_path
):
    other = tmp_path / "other.sqlite3"
    conn = SQLiteStore(other).connect()
    with conn.transaction():
        conn.bury("run_elsewhere", "someone", 1.0)
    conn.close()
    assert copy(other, postgres_url).returncode == 0
    assert copy(source["path"], postgres_url).returncode == 0
    # Deleted on PostgreSQL, as a server deletes a run: its rows go, a tombstone stays.
    deleted = source["ids"]["failed"]
    db = rawdb.connect(postgres_url)
    try:
        for table in ("events", "snapshots", "snapshot_parts", "idempotency_keys", "runs"):
            db.execute(f"DELETE FROM {table} WHERE run_id = ?", [deleted])
        db.execute("INSERT INTO tombstones VALUES (?, '~shared', 2.0)", [deleted])
    finally:
        db.close()
    again = copy(source["path"], postgres_url)
    assert again.returncode == 0, again.stderr
    assert "1 run deleted there: not brought back" in again.stdout
    assert deleted not in {row["run_id"] for row in rows(postgres_url, "runs")}
    assert {row["run_id"] for row in rows(postgres_url, "tombstones")} == {
        "run_elsewhere",
        source["buried"],
        deleted,
    }


def test_the_shared_owner_the_copy_gives_away_is_the_one_servers_record():
    from jupyter_agentruns.settings import SHARED_OWNER
    from jupyter_agentruns.store import copy as copying

    assert copying.SHARED_OWNER == SHARED_OWNER


@pytest.mark.timeout(120)
def test_a_session_queue_left_by_a_clean_stop_is_copied_and_runs_in_its_order_on_postgres(
    postgres_url, servers, tmp_path
):
    path = tmp_path / "stopped.sqlite3"
    first = servers("sqlite", path)
    with first.client() as client:
        # Six seconds of streaming: still running when its server stops a moment
        # later, and its rest not long to wait for on the next server.
        running = submit(client, {**SLOW, "chunks": 300}, session="chat")
        wait_status(client, running, {"running"})
        queued = [
            submit(client, {**QUICK, "tools": False}, session="chat", session_policy="enqueue")
            for _ in range(3)
        ]
    first.terminate()  # hands the running (resumable) run over; the queue waits for the next server

    done = copy(path, postgres_url)
    assert done.returncode == 0, done.stderr
    assert "3 runs waiting in a session's queue" in done.stdout
    with servers("postgres", store_url=postgres_url).client() as client:
        # Taken over on PostgreSQL where the SQLite server left it, then the queue in order.
        taken = wait_status(client, running, TERMINAL)
        assert taken["status"] == "succeeded" and taken["attempt"] == 2
        ended = [wait_status(client, run_id, TERMINAL) for run_id in queued]
        assert [run["status"] for run in ended] == ["succeeded"] * 3
        assert taken["finished_at"] <= ended[0]["started_at"]
        assert ended[0]["finished_at"] <= ended[1]["started_at"]
        assert ended[1]["finished_at"] <= ended[2]["started_at"]


@pytest.mark.timeout(120)
def test_runs_of_a_killed_server_are_refused_unless_forced_and_then_end_interrupted(
    postgres_url, servers, tmp_path
):
    path = tmp_path / "killed.sqlite3"
    first = servers("sqlite", path, lease_seconds=1.5)
    with first.client() as client:
        running = submit(client, SLOW)
        asking = submit(client, ASKING)
        [question] = wait_status(client, asking, {"waiting"})["snapshot"]["inputs"]
        wait_status(client, running, {"running"})
    first.kill()
    # Another server recorded an answer for the run's own server, then died too: the
    # answer is in the write-ahead log alone, where the copy must find it.
    subprocess.run(
        [sys.executable, "-c", RECORD_ANSWER_AND_DIE, str(path), asking, question["request_id"]],
        check=False,
        timeout=60,
    )
    assert os.path.getsize(f"{path}-wal") > 0
    before = file_digests(path)

    refused = copy(path, postgres_url)
    assert refused.returncode == 1
    assert "2 active runs (1 running, 1 waiting)" in refused.stderr
    assert "--force" in refused.stderr and refused.stdout == ""
    assert not schema_exists(postgres_url), "a refused copy wrote to PostgreSQL"

    forced = copy(path, postgres_url, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "copied 2 active runs (1 running, 1 waiting) with --force" in forced.stdout
    assert file_digests(path) == before, "the copy changed its source"
    assert rows(postgres_url, "input_answers") == rows(path, "input_answers") != []

    # No takeovers: a forced copy's runs end as their lease runs out.
    config = {"store_url": postgres_url, "lease_seconds": 1.5, "max_resume_attempts": 0}
    with servers("postgres", **config).client() as client:
        assert wait_status(client, running, TERMINAL)["status"] == "interrupted"
        assert wait_status(client, asking, TERMINAL)["status"] == "interrupted"


def test_a_password_in_the_url_never_appears_in_what_the_command_prints(source, postgres_url):
    parts = urlsplit(postgres_url)
    host = f"{parts.hostname}:{parts.port}"
    with_password = urlunsplit(parts._replace(netloc=f"postgres:pa%40ss-w0rd@{host}"))
    unreachable = urlunsplit(parts._replace(netloc="postgres:pa%40ss-w0rd@127.0.0.1:1"))
    done = copy(source["path"], with_password)
    # Copied again with another owner: refused, saying where.
    refused = copy(
        source["path"], None, "--owner", "bob", env={"AGENTRUNS_STORE_URL": with_password}
    )
    failed = copy(source["path"], unreachable)
    assert [done.returncode, refused.returncode, failed.returncode] == [0, 1, 69]
    assert f"at {parts.hostname} port {parts.port} as postgres" in done.stdout
    assert f"at {parts.hostname} port {parts.port} as postgres" in refused.stderr
    assert "cannot be reached" in failed.stderr
    for process in (done, refused, failed):
        for secret in ("pa%40ss-w0rd", "pa@ss-w0rd", "w0rd"):
            assert secret not in process.stdout + process.stderr


def test_arguments_that_name_no_store_to_copy_into_are_refused_before_anything_is_read(
    source, postgres_url
):
    before = file_digests(source["path"])
    missing = copy(source["path"], None, env={"AGENTRUNS_STORE_URL": ""})
    assert missing.returncode == 64 and "--to URL is needed" in missing.stderr
    not_postgres = copy(source["path"], "mysql://me:s3cret@db/runs")
    assert not_postgres.returncode == 64
    assert "--to must be a postgresql:// URL" in not_postgres.stderr
    from_environment = copy(source["path"], None, env={"AGENTRUNS_STORE_URL": "host=db"})
    assert from_environment.returncode == 78
    assert "AGENTRUNS_STORE_URL must be a postgresql:// URL" in from_environment.stderr
    not_a_user = copy(source["path"], postgres_url, "--owner", "~shared")
    assert not_a_user.returncode == 64 and "is not a user name" in not_a_user.stderr
    for process in (missing, not_postgres, from_environment, not_a_user):
        assert process.stdout == "" and "s3cret" not in process.stderr
    assert file_digests(source["path"]) == before
    assert not schema_exists(postgres_url)


def test_a_source_of_an_older_schema_is_refused_with_how_to_migrate_it(postgres_url, tmp_path):
    path = tmp_path / "old.sqlite3"
    SQLiteStore(path).connect().close()
    db = rawdb.connect(str(path))
    current = len(MIGRATIONS)
    db.execute(f"PRAGMA user_version = {current - 1}")
    db.close()
    refused = copy(path, postgres_url)
    assert refused.returncode == 1
    assert (
        f"schema version {current - 1}, older than this jupyter_agentruns's ({current})"
        in refused.stderr
    )
    assert "start this version's server on the file once" in refused.stderr
    missing = copy(tmp_path / "nowhere.sqlite3", postgres_url)
    assert missing.returncode == 1 and "is not a file" in missing.stderr
    assert not schema_exists(postgres_url)


def test_a_source_a_server_writes_to_during_the_copy_is_refused_and_nothing_is_kept(
    source, postgres_url, tmp_path
):
    path = duplicate(source["path"], tmp_path / "busy.sqlite3")

    def a_server_commits(line):
        if line.startswith("copying"):
            db = rawdb.connect(str(path))
            db.execute("INSERT INTO tombstones (run_id, owner, deleted_ts) VALUES ('late', 'x', 1)")
            db.close()

    with pytest.raises(CopyRefused, match="changed while it was copied: a server still uses it"):
        copy_store(path, postgres_url, progress=a_server_commits)
    assert all(rows(postgres_url, table) == [] for table in TABLES)
    assert copy(path, postgres_url).returncode == 0, "a copy again after the refusal"


@pytest.mark.timeout(120)
def test_two_hundred_thousand_events_copy_whole_in_bounded_memory(postgres_url, tmp_path):
    path = tmp_path / "large.sqlite3"
    conn = SQLiteStore(path, "NORMAL").connect()
    runs, per_run, size = 20, 10_000, 800  # 160 MB of event data, more than the bound below
    with conn.transaction():
        for number in range(runs):
            run_id = f"run_{number:02d}"
            conn.insert_run(
                {
                    "run_id": run_id,
                    "owner": "me",
                    "agent": "demo",
                    "status": "succeeded",
                    "created_at": f"2026-01-01T00:00:{number:02d}.000000Z",
                    "last_seq": per_run,
                    "finished_ts": 1.0,
                }
            )
            ts = "2026-01-01T00:00:00.000Z"
            conn.append_events(
                (run_id, seq, "text.delta", ts, f'{{"delta":"{seq:0{size}d}"}}')
                for seq in range(1, per_run + 1)
            )
        # A snapshot of 3 MB, kept in parts of a megabyte.
        text = "".join(f"{n:08d}" for n in range(375_000))
        conn.write_snapshot("run_00", per_run, {"messages": [{"id": "m1", "text": text}]})
    conn.close()

    measured = subprocess.run(
        [sys.executable, "-c", PEAK_MEMORY_OF_THE_COMMAND, "copy", "--from", str(path)],
        env={**os.environ, "AGENTRUNS_STORE_URL": postgres_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert measured.returncode == 0, measured.stderr
    assert "events: 100,000 of 200,000" in measured.stdout
    assert "200,000 events" in measured.stdout
    peak_mb = int(re.search(r"peak (\d+) kB", measured.stderr).group(1)) / 1024
    assert peak_mb < 150, f"the copy peaked at {peak_mb:.0f} MB"

    def digests(where):
        db = rawdb.connect(where)
        try:
            found = db.execute(
                "SELECT run_id, seq, type, ts, data FROM events ORDER BY run_id, seq"
            )
            return [hashlib.sha1("\0".join(map(str, row)).encode()).digest() for row in found]
        finally:
            db.close()

    copied = digests(postgres_url)
    assert len(copied) == runs * per_run and copied == digests(str(path))
    for table in ("snapshots", "snapshot_parts"):
        assert rows(postgres_url, table) == rows(str(path), table)
    assert len(rows(postgres_url, "snapshot_parts")) == 2
