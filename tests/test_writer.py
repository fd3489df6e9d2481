"""The store writer on its own: group commit, publish after commit, backpressure, retries, refusals."""

import asyncio
import logging
import sqlite3

import pytest

from jupyter_agentruns.events import EVENT, SEQ, append
from jupyter_agentruns.store import sqlite as sqlite_store
from jupyter_agentruns.store.sqlite import SQLiteStore
from jupyter_agentruns.writer import Writer, in_transaction

from conftest import write_lock_held

LOG = logging.getLogger("test-writer")


def event(run_id, seq, text="x"):
    data = f'{{"message_id":"m1","delta":"{text}"}}'
    return append(run_id, seq, "text.delta", "2026-01-01T00:00:00.000Z", data, None, data)


def new_run(run_id):
    return {"run_id": run_id, "owner": "me", "agent": "demo", "status": "running",
            "created_at": "2026-01-01T00:00:00.000Z", "last_seq": 0, "first_seq": 1}  # fmt: skip


class Commits:
    """The writer's on_commit: what each commit reported, and what another connection saw then."""

    def __init__(self, path):
        self.batches = []
        self.refused = set()
        self.unseen = []  # events reported before another connection could read them
        self._path = path

    def __call__(self, appended, refused):
        self.refused |= set(refused)
        if not appended:
            return
        self.batches.append(
            {run_id: [item[EVENT][SEQ] for item in items] for run_id, items in appended.items()}
        )
        db = sqlite3.connect(self._path)
        try:
            for run_id, items in appended.items():
                (stored,) = db.execute(
                    "SELECT count(*) FROM events WHERE run_id = ? AND seq <= ?",
                    [run_id, items[-1][EVENT][SEQ]],
                ).fetchone()
                if stored < items[-1][EVENT][SEQ]:
                    self.unseen.append((run_id, items[-1][EVENT][SEQ]))
        finally:
            db.close()

    @property
    def seqs(self):
        merged = {}
        for batch in self.batches:
            for run_id, seqs in batch.items():
                merged.setdefault(run_id, []).extend(seqs)
        return merged


@pytest.fixture
def store(tmp_path):
    return SQLiteStore(tmp_path / "w.sqlite3", "NORMAL")


async def started_writer(store, commits, **bounds):
    writer = Writer(store, asyncio.get_running_loop(), commits, LOG, **bounds)
    for run_id in ("run_a", "run_b", "run_c"):
        await writer.run(
            in_transaction(lambda conn, run_id=run_id: conn.insert_run(new_run(run_id)))
        )
    return writer


async def drained(writer):
    await writer.run(in_transaction(lambda conn: None))  # behind everything queued before it


async def test_queued_appends_commit_together_and_are_reported_only_once_committed(store, tmp_path):
    commits = Commits(tmp_path / "w.sqlite3")
    writer = await started_writer(store, commits)
    try:
        for seq in range(1, 1001):  # queued with no await in between: one batch or a few
            for run_id in ("run_a", "run_b", "run_c"):
                writer.append(event(run_id, seq))
        await drained(writer)
    finally:
        writer.close()
    assert commits.seqs == {run_id: list(range(1, 1001)) for run_id in ("run_a", "run_b", "run_c")}
    assert len(commits.batches) < 10  # 3,000 events, a handful of transactions
    assert commits.unseen == []  # publish after commit
    head = store.connect().get_run_head("run_b")
    assert head["last_seq"] == 1000


async def test_a_full_queue_makes_producers_wait_until_commits_drain_it(store, tmp_path):
    commits = Commits(tmp_path / "w.sqlite3")
    writer = await started_writer(store, commits, max_pending_events=10)
    try:
        for seq in range(1, 11):
            writer.append(event("run_a", seq))
        assert writer.full
        await asyncio.wait_for(writer.wait_for_space(), 10)
        assert not writer.full and writer.pending_events < 10
    finally:
        writer.close()
    assert commits.seqs["run_a"] == list(range(1, 11))


async def test_a_database_locked_by_another_process_delays_a_batch_but_loses_nothing(
    store, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 50)
    commits = Commits(tmp_path / "w.sqlite3")
    writer = await started_writer(SQLiteStore(tmp_path / "w.sqlite3", "NORMAL"), commits)
    try:
        with write_lock_held(tmp_path / "w.sqlite3"):
            for seq in range(1, 101):
                writer.append(event("run_a", seq))
            await asyncio.sleep(0.3)  # the writer backs off and retries meanwhile
            assert "run_a" not in commits.seqs
        await drained(writer)
    finally:
        writer.close()
    assert commits.seqs["run_a"] == list(range(1, 101))
    assert "retrying" in caplog.text


async def test_an_operation_that_raises_answers_only_its_caller(store, tmp_path):
    commits = Commits(tmp_path / "w.sqlite3")
    writer = await started_writer(store, commits)

    @in_transaction
    def fails(conn):
        conn.insert_run(new_run("run_half"))
        raise ValueError("no")

    try:
        writer.append(event("run_a", 1))
        failing = writer.run(fails)
        succeeding = writer.run(in_transaction(lambda conn: conn.insert_run(new_run("run_d"))))
        with pytest.raises(ValueError):
            await failing
        await succeeding
    finally:
        writer.close()
    conn = store.connect()
    assert conn.get_run_head("run_half") is None  # rolled back with its savepoint
    assert conn.get_run_head("run_d") is not None and commits.seqs["run_a"] == [1]


async def test_a_run_whose_seqs_are_taken_is_refused_and_the_others_in_its_batch_commit(
    store, tmp_path
):
    commits = Commits(tmp_path / "w.sqlite3")
    writer = await started_writer(store, commits)
    other = sqlite3.connect(tmp_path / "w.sqlite3")
    other.execute("INSERT INTO events VALUES ('run_a', 2, 'x.other', 't', '{}')")
    other.commit()
    other.close()
    try:
        for seq in (1, 2, 3):
            writer.append(event("run_a", seq))
            writer.append(event("run_b", seq))
        await drained(writer)
        writer.append(event("run_a", 4))  # later appends of a refused run are refused too
        await drained(writer)
    finally:
        writer.close()
    assert commits.refused == {"run_a"}
    assert commits.seqs == {"run_b": [1, 2, 3]}


async def test_closing_while_the_store_stays_locked_gives_up_after_a_bound(
    store, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 50)
    commits = Commits(tmp_path / "w.sqlite3")
    writer = await started_writer(SQLiteStore(tmp_path / "w.sqlite3", "NORMAL"), commits)
    holder = sqlite3.connect(tmp_path / "w.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process that never lets go
    try:
        writer.append(event("run_a", 1))
        await asyncio.sleep(0.1)
        await asyncio.get_running_loop().run_in_executor(None, writer.close, 0.5)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "stayed busy" in caplog.text and "1 queued event" in caplog.text


async def test_a_lost_connection_refuses_only_the_requests_of_its_batch(postgres_url):
    """A request that found the database gone is answered 503; the next one tries again.

    The connection dies mid-transaction (a database restart): the operation in
    that batch is refused, and with nothing left to retry the writer must not
    keep refusing: an idle server would answer 503 long after the database is back.
    """
    import psycopg

    from jupyter_agentruns.store import StoreUnavailable
    from jupyter_agentruns.store.postgres import PostgresStore

    store = PostgresStore(postgres_url)
    writer = Writer(store, asyncio.get_running_loop(), lambda appended, refused: None, LOG)

    @in_transaction
    def cut_then_read(conn):
        conn.get_run_head("run_a")  # the writer's connection is open, in its transaction
        with psycopg.connect(postgres_url.split("?")[0], autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        conn.get_run_head("run_a")

    try:
        with pytest.raises(StoreUnavailable):
            await writer.run(cut_then_read)
        await writer.run(in_transaction(lambda conn: conn.insert_run(new_run("run_a"))))
    finally:
        writer.close()
    conn = store.connect()
    assert conn.get_run_head("run_a")["run_id"] == "run_a"
    conn.close()


async def test_requests_queued_behind_a_batch_that_finds_the_database_gone_are_answered_503(
    postgres_database,
):
    """Nothing waits for the database's return but events: a request queued behind the batch
    that found it gone is answered 503 (and never runs), not held for the whole outage."""
    import threading
    from urllib.parse import urlsplit, urlunsplit

    from tcpproxy import TcpProxy

    from jupyter_agentruns.store import StoreUnavailable
    from jupyter_agentruns.store.postgres import PostgresStore

    parts = urlsplit(postgres_database)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    user = f"{parts.username}@" if parts.username else ""
    url = urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{proxy.port}")) + "?schema=queued503"
    store = PostgresStore(url)
    loop = asyncio.get_running_loop()
    writer = Writer(store, loop, lambda appended, refused: None, LOG)
    inside, cut = threading.Event(), threading.Event()

    @in_transaction
    def held(conn):
        conn.get_run_head("run_a")
        inside.set()  # the batch is taken and in its transaction
        cut.wait(10)
        conn.get_run_head("run_a")  # the line is cut: fails

    try:
        await writer.run(in_transaction(lambda conn: conn.insert_run(new_run("run_a"))))
        writer.append(event("run_a", 1))
        first = writer.run(held)
        await loop.run_in_executor(None, inside.wait, 10)
        behind = writer.run(
            in_transaction(lambda conn: conn.insert_run(new_run("run_b")))
        )  # queued
        proxy.cut()
        cut.set()
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(first, 10)
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(behind, 10)  # answered while the outage goes on
        assert writer.pending_events == 1  # the event waits for the database
        proxy.restore()
        for _ in range(200):  # the event commits at the writer's next retry (at most 2 s)
            if writer.pending_events == 0:
                break
            await asyncio.sleep(0.05)
        assert writer.pending_events == 0
    finally:
        writer.close()
        proxy.close()
    conn = PostgresStore(f"{postgres_database}?schema=queued503").connect()  # not through the proxy
    try:
        assert conn.get_run_head("run_a")["last_seq"] == 1
        assert conn.get_run_head("run_b") is None  # a request answered 503 changed nothing
    finally:
        conn.close()


async def test_a_value_the_store_cannot_hold_fails_its_own_run_and_the_rest_of_the_batch_commits(
    make_store,
):
    """A poison event (a number out of the store's range) ends its run failed, and only its run."""
    store = make_store()
    reported = []
    writer = await started_writer(
        store, lambda appended, refused: reported.append((appended, refused))
    )
    poison = event("run_a", 3)
    poison = (poison[0], {"input_tokens": 10**20}, *poison[2:])  # as a usage event would set it
    try:
        for seq in (1, 2):
            for run_id in ("run_a", "run_b", "run_c"):
                writer.append(event(run_id, seq))
        await drained(writer)
        lease = writer.run(in_transaction(lambda conn: conn.renew_leases("exec", ["run_b"], 123.0)))
        for seq in (3, 4):
            writer.append(poison if seq == 3 else event("run_a", seq))
            writer.append(event("run_b", seq))
            writer.append(event("run_c", seq))
        await lease  # an operation in the poisoned batch is answered as usual
        await drained(writer)
    finally:
        writer.close()
    conn = store.connect()
    try:
        for run_id in ("run_b", "run_c"):
            assert [row[0] for row in conn.read_events(run_id, 0, 100)] == [1, 2, 3, 4]
            assert conn.get_run_head(run_id)["status"] == "running"
        # run_a's log ends at what was committed, then its one terminal event, seq 3.
        rows = conn.read_events("run_a", 0, 100)
        assert [(row[0], row[1]) for row in rows] == [
            (1, "text.delta"), (2, "text.delta"), (3, "run.failed"),
        ]  # fmt: skip
        assert '"type":"invalid_event"' in rows[-1][3]
        ended = conn.get_run("run_a")
        assert ended["status"] == "failed" and ended["last_seq"] == 3
        assert ended["error"]["type"] == "invalid_event" and ended["input_tokens"] == 0
        assert ended["snapshot"]["messages"][0]["text"] == "xx"
    finally:
        conn.close()
    # Subscribers see run_a's end; its executor learns that it may write no more.
    published = {}
    for appended, _ in reported:
        for run_id, items in appended.items():
            published.setdefault(run_id, []).extend(item[EVENT][SEQ] for item in items)
    assert published["run_a"] == [1, 2, 3] and published["run_b"] == [1, 2, 3, 4]
    assert {run_id: why for _, refused in reported for run_id, why in refused.items()} == {
        "run_a": "invalid"
    }
