"""What the engine asks of a store, held to both stores: SQLite and PostgreSQL.

The API suite runs on both stores too (see conftest); these pin down the
store interface itself, where a difference between the two databases would
hide (ordering, size bounds, locks, notifications, lost connections).
"""

from __future__ import annotations

import threading
import time

import pytest

from jupyter_agentruns import reducer
from jupyter_agentruns.domain import (
    ActiveRun,
    KeyRow,
    ListedConversation,
    ListedRun,
    RunHead,
    RunRow,
    Tombstone,
)
from jupyter_agentruns.store import SeqTaken, StoreUnavailable, sql

# These tests use make_store, so run on both stores.
pytestmark = pytest.mark.usefixtures("store_kind")


def run_row(run_id, owner="me", session=None, status="queued", executor_id="exec_a", **fields):
    return {
        "run_id": run_id,
        "owner": owner,
        "agent": "demo",
        "status": status,
        "session": session,
        "metadata": {},
        "input": {"prompt": "p"},
        "created_at": f"2026-01-01T00:00:{len(run_id):02d}Z",
        "last_seq": 0,
        "first_seq": 1,
        "executor_id": executor_id,
        "lease_expires": time.time() + 30,
        **fields,
    }


def add_events(conn, run_id, first, last, size=10):
    with conn.transaction():
        conn.append_events(
            [(run_id, seq, "text.delta", "t", '{"text":"' + "x" * size + '"}')
             for seq in range(first, last + 1)]
        )  # fmt: skip
        conn.set_last_seqs([(last, run_id)])


@pytest.fixture
def store(make_store):
    return make_store()


@pytest.fixture
def conn(store):
    conn = store.connect()
    yield conn
    conn.close()


def test_events_read_back_in_order_and_a_taken_seq_is_refused_whole(conn):
    with conn.transaction():
        conn.insert_run(run_row("run_a"))
    add_events(conn, "run_a", 1, 50)
    assert [row[0] for row in conn.read_events("run_a", 10, 5)] == [11, 12, 13, 14, 15]
    assert [row[0] for row in conn.read_events("run_a", 40, 100, upto=45)] == [41, 42, 43, 44, 45]
    with pytest.raises(SeqTaken), conn.transaction():
        conn.append_events([("run_a", 51, "t", "t", "{}"), ("run_a", 50, "t", "t", "{}")])
    assert conn.get_run_head("run_a")["last_seq"] == 50
    assert conn.read_events("run_a", 50, 10) == []


def test_rows_have_exactly_the_keys_their_types_name(conn):
    with conn.transaction():
        conn.insert_run(run_row("run_a", session="s"))
        conn.insert_run(run_row("run_b"))
        conn.insert_key("me", "k", "f", "run_a", time.time())
        conn.bury("run_b", "me", time.time())
    assert set(conn.get_run("run_a")) == set(RunRow.__annotations__)
    assert set(conn.get_run("run_a", snapshot=False)) == set(RunRow.__annotations__)
    assert set(conn.get_run_head("run_a")) == set(RunHead.__annotations__)
    [listed] = conn.list_runs("me", status=None, session=None, limit=10, before=None)
    assert set(listed) == set(ListedRun.__annotations__)
    assert set(conn.find_key("me", "k", 0)) == set(KeyRow.__annotations__)
    assert set(conn.get_tombstone("run_b")) == set(Tombstone.__annotations__)
    [active] = conn.active_in_session("me", "s")
    assert set(active) == set(ActiveRun.__annotations__)


@pytest.mark.parametrize("count", [1, 127, 128, 129, 255, 4096, 5000])
def test_a_batch_of_any_size_is_stored_whole_and_in_order(conn, count):
    # SQLite writes a batch as a few INSERTs of a power of two of rows each.
    with conn.transaction():
        conn.insert_run(run_row("run_a"))
    add_events(conn, "run_a", 1, count)
    rows = conn.read_events("run_a", 0, count + 10)
    assert [row[0] for row in rows] == list(range(1, count + 1))
    # A seq taken in the last statement of a batch refuses the whole batch.
    with pytest.raises(SeqTaken), conn.transaction():
        conn.append_events(
            [("run_a", seq, "t", "t", "{}") for seq in range(count + 1, 2 * count + 1)]
            + [("run_a", count, "t", "t", "{}")]
        )
    assert len(conn.read_events("run_a", 0, 2 * count + 10)) == count


def test_the_last_seqs_of_many_runs_are_set_at_once(conn):
    run_ids = [f"run_{index:04d}" for index in range(300)]
    with conn.transaction():
        for run_id in [*run_ids, "run_other"]:
            conn.insert_run(run_row(run_id))
    with conn.transaction():
        conn.set_last_seqs([(index + 1, run_id) for index, run_id in enumerate(run_ids)])
    assert [conn.get_run_head(run_id)["last_seq"] for run_id in run_ids] == list(range(1, 301))
    assert conn.get_run_head("run_other")["last_seq"] == 0  # a run not named is left alone
    with conn.transaction():
        conn.set_last_seqs([(7, "run_0003")])
        conn.set_last_seqs([])
    assert conn.get_run_head("run_0003")["last_seq"] == 7


def test_leases_and_claims_of_more_runs_than_one_statement_lists_are_all_renewed_and_released(
    conn, store_kind
):
    if store_kind == "sqlite":
        import sqlite3

        conn.conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)  # before SQLite 3.32
    run_ids = [f"run_{index:04d}" for index in range(1200)]
    with conn.transaction():
        for run_id in run_ids:
            conn.insert_run(run_row(run_id, lease_expires=1.0))
    with conn.transaction():
        conn.renew_leases("exec_a", [*run_ids, "run_missing"], 1000.0)
        conn.renew_leases("exec_a", [], 2000.0)
    assert conn.expired_active_runs(999.0) == []
    assert len(conn.expired_active_runs(1001.0)) == 1200
    with conn.transaction():
        conn.release_claims(run_ids, "exec_a")
    assert conn.expired_active_runs(1001.0) == []  # queued in their sessions again, unclaimed
    assert len(conn.startable_queued_runs(None, ["demo"], limit=2000)) == 1200


def test_sqlite_batches_fit_an_old_sqlite_parameter_limit(tmp_path):
    import sqlite3

    from jupyter_agentruns.store.sqlite import SQLiteStore, insert_rows

    store = SQLiteStore(tmp_path / "old.db")
    conn = store.connect()
    try:
        conn.conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)  # before SQLite 3.32
        assert insert_rows(conn.conn) == 128
        with conn.transaction():
            conn.insert_run(run_row("run_a"))
        add_events(conn, "run_a", 1, 1000)
        assert [row[0] for row in conn.read_events("run_a", 0, 2000)] == list(range(1, 1001))
    finally:
        conn.close()


def test_a_read_stops_at_its_byte_bound_but_returns_at_least_one_event(conn):
    with conn.transaction():
        conn.insert_run(run_row("run_a"))
    add_events(conn, "run_a", 1, 20, size=1000)
    rows = conn.read_events("run_a", 0, 100, max_bytes=3500)
    assert [row[0] for row in rows] == [1, 2, 3, 4]  # the fourth reaches the bound
    assert len(conn.read_events("run_a", 0, 100, max_bytes=1)) == 1


def test_the_data_of_an_event_is_stored_byte_for_byte(conn):
    with conn.transaction():
        conn.insert_run(run_row("run_a"))
    data = '{"text":"tab\\t \\u00e9 \\u2028 emoji \\ud83d\\ude00 back\\\\slash \\"q\\""}'
    with conn.transaction():
        conn.append_events([("run_a", 1, "text.delta", "2026-01-01T00:00:00.123Z", data)])
    assert conn.read_events("run_a", 0, 1) == [(1, "text.delta", "2026-01-01T00:00:00.123Z", data)]


def snapshot_json(conn, run_id):
    """The persisted snapshot's text in its stored parts, read as the API reads it (empty: none)."""
    layout = conn.snapshot_layout(run_id)
    if layout is None:
        return []
    seq, count = layout
    return [conn.snapshot_part(run_id, part, seq) for part in range(count)]


def test_a_snapshot_in_parts_reads_back_whole(conn, monkeypatch):
    monkeypatch.setattr(sql, "SNAPSHOT_PART_CHARS", 100)
    builder = reducer.Snapshot(None)
    for index in range(50):
        builder.apply(
            {"type": "text.delta", "data": {"message_id": "m", "delta": f"part {index} "}}
        )
    with conn.transaction():
        conn.insert_run(run_row("run_a"))
        conn.update_run("run_a", {"snapshot": builder, "snapshot_seq": 50, "last_seq": 50})
    assert conn.get_run("run_a")["snapshot"] == builder.to_dict()
    assert len(snapshot_json(conn, "run_a")) > 1
    assert "".join(snapshot_json(conn, "run_a")) == "".join(builder.json_chunks())


def test_runs_list_newest_first_and_page_by_created_at_and_id(conn):
    with conn.transaction():
        for index in range(5):
            conn.insert_run(run_row(f"run_{index}", created_at=f"2026-01-01T00:00:0{index}Z"))
        conn.insert_run(run_row("run_other", owner="you"))
    first = conn.list_runs("me", status=None, session=None, limit=2, before=None)
    assert [r["run_id"] for r in first] == ["run_4", "run_3"]
    after = (first[-1]["created_at"], first[-1]["run_id"])
    rest = conn.list_runs("me", status=None, session=None, limit=10, before=after)
    assert [r["run_id"] for r in rest] == ["run_2", "run_1", "run_0"]
    assert rest[0]["input"] == {"prompt": "p"} and rest[0]["metadata"] == {}


def test_the_forks_of_a_run_are_listed_and_no_other_run(conn):
    with conn.transaction():
        conn.insert_run(run_row("run_1"))
        for run_id, origin, owner in (
            ("run_f1", "run_1", "me"),
            ("run_f22", "run_1", "me"),
            ("run_longer", "run_1x", "me"),  # the id begins with the original's
            ("run_wild", "runX1", "me"),  # LIKE's _ would match the X
            ("run_theirs", "run_1", "you"),
        ):
            conn.insert_run(run_row(run_id, owner=owner, forked_from={"run_id": origin, "seq": 3}))
    listed = conn.list_runs(
        "me", status=None, session=None, limit=10, before=None, forked_from="run_1"
    )
    assert [r["run_id"] for r in listed] == ["run_f22", "run_f1"]
    assert listed[0]["forked_from"] == {"run_id": "run_1", "seq": 3}
    assert (
        conn.list_runs("me", status=None, session=None, limit=10, before=None, forked_from="run_f1")
        == []
    )


def test_a_search_narrows_the_list_in_any_case_of_ascii_letters_and_pages(conn):
    with conn.transaction():
        for index in range(4):
            conn.insert_run(
                run_row(
                    f"run_{index}",
                    created_at=f"2026-01-01T00:00:0{index}Z",
                    input={"prompt": f"Weather {index}" if index % 2 else "other"},
                )
            )
        conn.insert_run(run_row("run_pct", input={"prompt": "50%"}))
        conn.insert_run(run_row("run_under", input={"prompt": "a_b"}))
    listed = conn.list_runs("me", status=None, session=None, limit=1, before=None, search="wEATHER")
    assert [r["run_id"] for r in listed] == ["run_3"]
    after = (listed[0]["created_at"], listed[0]["run_id"])
    rest = conn.list_runs("me", status=None, session=None, limit=9, before=after, search="weather")
    assert [r["run_id"] for r in rest] == ["run_1"]
    # LIKE's wildcards are matched as text.
    ids = [
        r["run_id"]
        for r in conn.list_runs("me", status=None, session=None, limit=9, before=None, search="%")
    ]
    assert ids == ["run_pct"]
    ids = [
        r["run_id"]
        for r in conn.list_runs("me", status=None, session=None, limit=9, before=None, search="a_b")
    ]
    assert ids == ["run_under"]


def test_a_session_queue_is_in_submit_order(conn):
    with conn.transaction():
        conn.insert_run(run_row("run_z", session="s", status="running"))
        conn.insert_run(run_row("run_b", session="s", executor_id=None, lease_expires=None))
        conn.insert_run(run_row("run_a", session="s", executor_id=None, lease_expires=None))
    assert [r["run_id"] for r in conn.active_in_session("me", "s")] == ["run_z", "run_b", "run_a"]
    assert conn.queued_behind("run_a") == "run_z"
    assert conn.startable_queued_runs(None, ["demo"]) == []
    with conn.transaction():
        conn.update_run("run_z", {"status": "succeeded"})
    assert [r["run_id"] for r in conn.startable_queued_runs(None, ["demo"])] == ["run_b"]
    # Only for a server serving the run's owner, with the run's agent.
    assert [r["run_id"] for r in conn.startable_queued_runs(["me"], ["demo"])] == ["run_b"]
    assert conn.startable_queued_runs(["someone else"], ["demo"]) == []
    assert conn.startable_queued_runs(None, ["other"]) == []
    with conn.transaction():
        assert conn.claim_run("run_b", "exec_b", time.time() + 30)
        assert not conn.claim_run("run_b", "exec_c", time.time() + 30)


def test_cancel_requests_and_answers_are_taken_once_by_the_executing_server(conn):
    with conn.transaction():
        conn.insert_run(run_row("run_a", status="running"))
        conn.record_cancel_request("run_a", {"reason": "r"})
        kept = conn.record_input_answer("run_a", "req_1", {"choice": "yes", "by": "A"}, 1.0)
        again = conn.record_input_answer("run_a", "req_1", {"choice": "no", "by": "B"}, 2.0)
    assert kept == again == {"choice": "yes", "note": None, "by": "A"}
    with conn.transaction():
        assert conn.take_cancel_requests("exec_other") == []
        assert conn.take_cancel_requests("exec_a") == [("run_a", {"reason": "r"})]
        assert conn.take_input_answers("exec_a") == [
            ("run_a", "req_1", {"choice": "yes", "note": None, "by": "A"})
        ]
    with conn.transaction():
        assert conn.take_cancel_requests("exec_a") == []
        assert conn.take_input_answers("exec_a") == []


def test_an_idempotency_key_lives_with_its_run_or_for_its_ttl(conn):
    with conn.transaction():
        conn.insert_key("me", "k1", "fp", "run_a", now=100.0)
        conn.insert_key("me", "k2", "fp", "run_b", now=100.0, with_run=True)
        conn.purge_keys(older_than=200.0)
    assert conn.find_key("me", "k1", not_before=0) is None
    assert conn.find_key("me", "k2", not_before=500.0)["run_id"] == "run_b"


def test_keys_past_their_ttl_go_a_bounded_number_a_sweep(conn):
    with conn.transaction():
        for index in range(5):
            conn.insert_key("me", f"k{index}", "fp", f"run_{index}", now=100.0)
        conn.purge_keys(older_than=200.0, limit=3)
    left = [conn.find_key("me", f"k{index}", not_before=0) for index in range(5)]
    assert sum(key is not None for key in left) == 2
    with conn.transaction():
        conn.purge_keys(older_than=200.0, limit=3)
    assert all(conn.find_key("me", f"k{index}", not_before=0) is None for index in range(5))


def test_a_buried_run_leaves_a_tombstone_and_nothing_else(conn):
    with conn.transaction():
        conn.insert_run(run_row("run_a", status="succeeded"))
    add_events(conn, "run_a", 1, 3)
    with conn.transaction():
        assert conn.bury("run_a", "me", 5.0) is True
    assert conn.get_run("run_a") is None and conn.read_events("run_a", 0, 10) == []
    assert conn.get_tombstone("run_a")["owner"] == "me"
    # A second server burying the same run finds it gone: it deleted nothing.
    with conn.transaction():
        assert conn.bury("run_a", "me", 6.0) is False


def test_a_read_transaction_sees_one_state_while_a_compaction_commits(store):
    """A run's row, its snapshot's parts and its events, read apart, still fit together."""
    writer, reader = store.connect(), store.connect()
    with writer.transaction():
        writer.insert_run(run_row("run_a", status="running"))
    add_events(writer, "run_a", 1, 10)
    with reader.read_transaction():
        row = reader.get_run("run_a")
        # Another server compacts the run now: a snapshot at 8, the events before 9 deleted.
        with writer.transaction():
            writer.update_run(
                "run_a", {"first_seq": 9, "snapshot": reducer.empty_snapshot(), "snapshot_seq": 8}
            )
            writer.delete_events_before("run_a", 9, 100)
        events = reader.read_events("run_a", row["snapshot_seq"], 100, row["last_seq"])
    assert row["snapshot_seq"] == 0 and [seq for seq, *_ in events] == list(range(1, 11))
    # Outside it, the next read sees the compacted run.
    assert reader.get_run("run_a")["snapshot_seq"] == 8
    assert [seq for seq, *_ in reader.read_events("run_a", 0, 100)] == [9, 10]
    writer.close()
    reader.close()


def test_a_serialized_scope_makes_a_second_transaction_wait_for_the_first(store, store_kind):
    first, second = store.connect(), store.connect()
    order = []
    entered = threading.Event()

    def other():
        entered.wait(5)
        with second.transaction():
            second.serialize("submit:me")
            order.append("second")

    thread = threading.Thread(target=other)
    thread.start()
    with first.transaction():
        first.serialize("submit:me")
        entered.set()
        time.sleep(0.3)
        order.append("first")
    thread.join(5)
    assert order == ["first", "second"]
    first.close()
    second.close()


def test_other_connections_commits_are_noticed(store, store_kind, request):
    """SQLite moves its change token; PostgreSQL notifies, naming the runs and their last_seq."""
    writer = store.connect()
    with writer.transaction():
        writer.insert_run(run_row("run_a"))
    if store_kind == "sqlite":
        watch = store.connect()
        before = watch.change_token()
        add_events(writer, "run_a", 1, 3)
        assert watch.change_token() != before
        watch.close()
    else:
        from jupyter_agentruns.store.postgres import PostgresStore

        seen, arrived = [], threading.Event()

        def on_change(runs):
            seen.append(runs)
            if runs:
                arrived.set()

        other = PostgresStore(request.getfixturevalue("postgres_url"))  # another server
        listener = other.listen(on_change)
        assert listener.connected.wait(5)
        add_events(writer, "run_a", 1, 3)
        assert arrived.wait(5)
        assert seen[-1] == {"run_a": 3}
        # Its own commits wake nobody: the server published them already.
        own = other.listen(lambda runs: runs and seen.append(("own", runs)))
        mine = other.connect()
        with mine.transaction():
            mine.append_events([("run_a", 4, "t", "t", "{}")])
        time.sleep(0.5)
        assert not any(isinstance(s, tuple) for s in seen)
        own.close()
        listener.close()
        mine.close()
    writer.close()


def test_a_connection_lost_while_idle_is_replaced_and_one_lost_mid_transaction_is_unavailable(
    store, store_kind
):
    if store_kind != "postgres":
        pytest.skip("a SQLite file has no connection to lose")
    import psycopg

    def cut(conn) -> None:
        with psycopg.connect(**store.url.parameters, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [conn._conn.info.backend_pid])

    conn = store.connect()
    with conn.transaction():
        conn.insert_run(run_row("run_a"))
    cut(conn)
    # Found dead on its next use, outside a transaction (the database restarted
    # meanwhile): the read runs again on a new connection.
    assert conn.get_run_head("run_a")["run_id"] == "run_a"
    cut(conn)
    with pytest.raises(StoreUnavailable), conn.transaction():
        conn.insert_run(run_row("run_b"))
        cut(conn)
        conn.insert_run(run_row("run_c"))
    # The transaction went with its connection; the next use connects again.
    assert conn.get_run_head("run_b") is None
    conn.close()


def test_a_schema_named_like_a_keyword_is_created_and_used(store_kind, request):
    if store_kind != "postgres":
        pytest.skip("PostgreSQL schemas only")
    from jupyter_agentruns.store.postgres import PostgresStore

    store = PostgresStore(request.getfixturevalue("postgres_database") + "?schema=order")
    conn = store.connect()
    with conn.transaction():
        conn.insert_run(run_row("run_a"))
    assert conn.get_run_head("run_a")["run_id"] == "run_a"
    conn.close()


def test_libpq_parameters_in_the_url_reach_the_connection_beside_the_schema(store_kind, request):
    if store_kind != "postgres":
        pytest.skip("PostgreSQL URLs only")
    from jupyter_agentruns.store.postgres import PostgresStore

    database = request.getfixturevalue("postgres_database")
    url = f"{database}?application_name=agentruns%20t&schema=named&connect_timeout=3"
    conn = PostgresStore(url).open()
    try:
        assert conn.info.parameter_status("application_name") == "agentruns t"
        assert conn.execute("SELECT current_schema()").fetchone()[0] == "named"
    finally:
        conn.close()


def test_a_url_with_a_password_never_shows_it(store_kind):
    if store_kind != "postgres":
        pytest.skip("PostgreSQL URLs only")
    from jupyter_agentruns.store.postgres import PostgresStore

    store = PostgresStore("postgresql://me:s3cret@127.0.0.1:9/runs")  # connects when used
    assert (
        store.describe() == "PostgreSQL database runs at 127.0.0.1 port 9 as me (schema agentruns)"
    )
    with pytest.raises(StoreUnavailable) as failure:
        store.connect().get_run_head("run_a")
    assert "s3cret" not in str(failure.value)


def test_events_written_again_exactly_as_stored_are_a_lost_commit_answer_not_a_conflict(
    conn, store_kind
):
    """PostgreSQL: a connection lost during COMMIT leaves the writer unsure, and it writes again."""
    if store_kind != "postgres":
        pytest.skip("a local file's commit answer cannot be lost")
    with conn.transaction():
        conn.insert_run(run_row("run_a"))
    add_events(conn, "run_a", 1, 3)
    again = [(row_id, seq, "text.delta", "t", '{"text":"xxxxxxxxxx"}')
             for row_id, seq in (("run_a", 2), ("run_a", 3))]  # fmt: skip
    with conn.transaction():
        conn.append_events(again)
    with pytest.raises(SeqTaken), conn.transaction():
        conn.append_events([("run_a", 3, "text.delta", "t", '{"text":"other"}')])
    assert len(conn.read_events("run_a", 0, 10)) == 3


def test_two_servers_starting_at_once_on_a_new_schema_migrate_it_once(postgres_database):
    from jupyter_agentruns.store.postgres import PostgresStore

    url = f"{postgres_database}?schema=racing_starts"
    errors, barrier = [], threading.Barrier(4)

    def start():
        try:
            barrier.wait(5)
            conn = PostgresStore(url).connect()
            conn.get_run_head("run_a")
            conn.close()
        except Exception as exc:  # pragma: no cover - the failure is the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    import psycopg

    with psycopg.connect(postgres_database, options="-c search_path=racing_starts") as db:
        versions = [row[0] for row in db.execute("SELECT version FROM schema_version")]
    assert versions == list(range(1, PostgresStore.schema_versions_known + 1))


def test_the_listener_reconnects_after_its_connection_is_cut_and_says_to_catch_up(
    store, store_kind, make_store
):
    if store_kind != "postgres":
        pytest.skip("SQLite is polled, not listened to")
    import psycopg

    seen, caught_up = [], threading.Event()

    def on_change(runs):
        seen.append(runs)
        if runs is None and len(seen) > 1:
            caught_up.set()

    listener = store.listen(on_change)
    try:
        assert listener.connected.wait(5)
        with psycopg.connect(**store.url.parameters, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN %%' AND datname = current_database()"
            )
        assert caught_up.wait(10)  # connected again: everything may have changed meanwhile
        writer = make_store().connect()  # another server's
        with writer.transaction():
            writer.insert_run(run_row("run_a"))
        add_events(writer, "run_a", 1, 2)
        writer.close()
        deadline = time.monotonic() + 10
        while {"run_a": 2} not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert {"run_a": 2} in seen
    finally:
        listener.close()


def test_run_ids_order_byte_for_byte_on_both_stores(conn):
    """Upper case before lower case, as SQLite compares: a page cursor means the same on both."""
    with conn.transaction():
        for run_id in ("run_a", "run_B", "run_-"):
            conn.insert_run(run_row(run_id, created_at="2026-01-01T00:00:00Z"))
    page = conn.list_runs("me", status=None, session=None, limit=10, before=None)
    assert [r["run_id"] for r in page] == ["run_a", "run_B", "run_-"]
    rest = conn.list_runs(
        "me", status=None, session=None, limit=10, before=("2026-01-01T00:00:00Z", "run_a")
    )
    assert [r["run_id"] for r in rest] == ["run_B", "run_-"]


def test_both_stores_hold_the_same_tables_and_columns(store_kind, tmp_path, request):
    """Two histories, one schema: a change made to one store and not the other shows here."""
    if store_kind != "sqlite":
        pytest.skip("one comparison of both stores")
    from jupyter_agentruns.store.postgres import PostgresStore
    from jupyter_agentruns.store.sqlite import SQLiteStore

    kinds = {"TEXT": "text", "INTEGER": "integer", "REAL": "real", "bigint": "integer",
             "double precision": "real"}  # fmt: skip
    lite = SQLiteStore(tmp_path / "store.sqlite3").connect()
    lite_tables = {
        name: {
            # A key's columns are NOT NULL in PostgreSQL; SQLite says so of integer keys only.
            column: (kinds[kind], bool(notnull or key), default)
            for _, column, kind, notnull, default, key in lite.conn.execute(
                f"PRAGMA table_info({name})"
            )
        }
        for (name,) in lite.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    }
    lite.close()
    postgres = PostgresStore(request.getfixturevalue("postgres_url"))
    conn = postgres.open()
    postgres_tables: dict[str, dict] = {}
    for name, column, kind, nullable, default in conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default "
        "FROM information_schema.columns WHERE table_schema = %s AND table_name <> 'schema_version'"
        "ORDER BY table_name, ordinal_position",
        [postgres.schema],
    ):
        if column != "position":  # PostgreSQL's submit order; SQLite's is the rowid
            postgres_tables.setdefault(name, {})[column] = (
                kinds.get(kind, kind),
                nullable == "NO",
                default,
            )
    conn.close()
    assert set(lite_tables) == set(postgres_tables) == set(sql.TABLES)
    assert lite_tables == postgres_tables


def said(run_id, session, created_at, agent="demo", owner="me", **fields):
    """A finished run of a conversation: ``session`` and ``agent``, at ``created_at`` (seconds)."""
    return run_row(
        run_id,
        owner=owner,
        session=session,
        agent=agent,
        status="succeeded",
        executor_id=None,
        created_at=f"2026-01-01T00:00:{created_at:02d}.000Z",
        **fields,
    )


def conversations(conn, owner="me", *, agent=None, notebook=None, limit=50, before=None):
    return conn.list_conversations(
        owner, agent=agent, notebook=notebook, limit=limit, before=before
    )


def test_a_conversation_is_an_owners_runs_of_one_session_and_agent_newest_first(conn):
    with conn.transaction():
        conn.insert_run(said("run_a1", "chat", 1, input={"prompt": "Plan the trip\nin June"}))
        conn.insert_run(said("run_a2", "chat", 5, input={"prompt": "and the hotel?"}))
        conn.insert_run(said("run_b1", "chat", 3, agent="other", metadata={"title": "Other's"}))
        conn.insert_run(said("run_c1", "notes.ipynb", 4))
        conn.insert_run(said("run_none", None, 9))  # no session: a run, not a conversation
        conn.insert_run(said("run_you", "chat", 8, owner="you"))
    listed = conversations(conn)
    assert [(c["session"], c["agent"]) for c in listed] == [
        ("chat", "demo"),
        ("notes.ipynb", "demo"),
        ("chat", "other"),
    ]
    chat = listed[0]
    assert set(chat) == set(ListedConversation.__annotations__)
    assert chat["runs"] == 2 and chat["last_run_id"] == "run_a2"
    assert chat["updated_at"] == "2026-01-01T00:00:05.000Z"
    assert chat["first_input"] == {"prompt": "Plan the trip\nin June"}
    assert listed[2]["first_metadata"] == {"title": "Other's"}
    assert [c["last_run_id"] for c in conversations(conn, agent="other")] == ["run_b1"]
    assert [c["last_run_id"] for c in conversations(conn, "you")] == ["run_you"]
    assert conversations(conn, "nobody") == []


def test_conversations_page_by_their_newest_run_even_at_equal_times(conn):
    with conn.transaction():
        for index in range(7):
            conn.insert_run(said(f"run_{index}_old", f"s{index}", 1))
            conn.insert_run(said(f"run_{index}_new", f"s{index}", 2))
    seen, before = [], None
    while True:
        page = conversations(conn, limit=3, before=before)
        seen += [c["session"] for c in page]
        if len(page) < 3:
            break
        before = (page[-1]["updated_at"], page[-1]["last_run_id"])
    # One time for all: the run ids decide, byte for byte, and every conversation comes once.
    assert seen == [f"s{index}" for index in range(6, -1, -1)]
    assert {c["runs"] for c in conversations(conn)} == {2}


def test_a_conversation_longer_than_a_read_of_runs_is_listed_once_and_so_is_the_one_after(conn):
    long = sql.CONVERSATION_SCAN_MAX + 50
    with conn.transaction():
        conn.insert_run(said("run_old_1", "older", 0, agent="other"))
        conn.insert_run(said("run_old_2", "older", 0, agent="other"))
        for index in range(long):
            conn.insert_run(said(f"run_long_{index:05d}", "long", 1))
    listed = conversations(conn, limit=500)
    assert [(c["session"], c["runs"]) for c in listed] == [("long", long), ("older", 2)]
    assert listed[0]["last_run_id"] == f"run_long_{long - 1:05d}"
    page = conversations(conn, limit=1)
    rest = conversations(conn, limit=1, before=(page[0]["updated_at"], page[0]["last_run_id"]))
    assert [c["last_run_id"] for c in page + rest] == [f"run_long_{long - 1:05d}", "run_old_2"]
    assert conversations(conn, agent="other") == rest


def test_a_notebooks_conversations_are_its_sessions_and_those_whose_runs_name_it(conn):
    path = "work/50%_done.ipynb"  # LIKE's wildcards are text
    forms = (path, "/home/me/" + path)
    with conn.transaction():
        conn.insert_run(said("run_session", path, 1))
        conn.insert_run(said("run_absolute", forms[1], 2))
        conn.insert_run(said("run_chat_1", "chat", 3))
        conn.insert_run(said("run_chat_2", "chat", 4, metadata={"notebook": path}))
        conn.insert_run(said("run_case", "case", 5, metadata={"notebook": path.upper()}))
        conn.insert_run(said("run_deep", "deep", 6, metadata={"x": {"notebook": path}}))
        conn.insert_run(said("run_like", "like", 7, metadata={"notebook": "work/50xydone.ipynb"}))
        conn.insert_run(said("run_other", "other.ipynb", 8))
    listed = conversations(conn, notebook=forms)
    assert [c["last_run_id"] for c in listed] == ["run_chat_2", "run_absolute", "run_session"]
    assert listed[0]["runs"] == 2
    # A page of one at a time skips the near misses between two of the notebook's.
    page = conversations(conn, notebook=forms, limit=1)
    assert [c["last_run_id"] for c in page] == ["run_chat_2"]
    rest = conversations(
        conn, notebook=forms, limit=1, before=("2026-01-01T00:00:04.000Z", "run_chat_2")
    )
    assert [c["last_run_id"] for c in rest] == ["run_absolute"]


def test_a_conversations_title_is_the_newest_its_agent_gave_it(conn):
    with conn.transaction():
        conn.insert_run(said("run_1", "chat", 1, input={"prompt": "Plan the trip"}))
        conn.insert_run(said("run_2", "chat", 2, conversation_title="Older"))
        conn.insert_run(said("run_3", "chat", 3, conversation_title="Trip to Lisbon"))
        conn.insert_run(said("run_4", "chat", 4))  # a turn that gave none
        conn.insert_run(said("run_other", "other.ipynb", 5))
        conn.insert_run(said("run_you", "chat", 6, owner="you", conversation_title="Yours"))
        conn.insert_run(said("run_b", "chat", 7, agent="b", conversation_title="B's"))
    titles = {(c["session"], c["agent"]): c["title"] for c in conversations(conn)}
    assert titles == {
        ("chat", "b"): "B's",
        ("other.ipynb", "demo"): None,  # none given: the first run's title is the API's
        ("chat", "demo"): "Trip to Lisbon",
    }
    with conn.transaction():
        conn.update_run("run_4", {"conversation_title": "Lisbon, then Porto"})
    [chat] = conversations(conn, agent="demo", notebook=("chat",))
    assert chat["title"] == "Lisbon, then Porto"
    assert chat["first_input"] == {"prompt": "Plan the trip"}  # the API's title when there is none


def test_a_runs_trace_context_is_kept_with_it(conn):
    """What links a run's attempt after a takeover to the span of the one before (``tracing``)."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with conn.transaction():
        conn.insert_run(run_row("run_a"))
    assert conn.get_run("run_a")["trace_context"] is None
    with conn.transaction():
        conn.update_run("run_a", {"trace_context": traceparent})
    assert conn.get_run("run_a")["trace_context"] == traceparent


def test_conversations_are_found_through_their_own_index(conn, store_kind):
    """A schema step of both stores: the newest run of each conversation is one probe of it."""
    if store_kind == "sqlite":
        names = {
            name
            for (name,) in conn.conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
    else:
        names = {
            row[0]
            for row in conn._execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'runs' AND schemaname = current_schema()"
            ).fetchall()
        }
    assert {"runs_conversation", "runs_conversation_title"} <= names


def add_hooks(conn):
    with conn.transaction():
        conn.insert_run(run_row("run_me"))
        conn.insert_run(run_row("run_other", owner="other"))
        conn.insert_hook({
            "hook_id": "hook_mine", "owner": "me", "url": "https://example.org/", "format": "standard",
            "events": ["input.requested", "run.succeeded"], "secret": "whsec_x", "created_at": "t",
        })  # fmt: skip
        conn.set_server_hooks([{
            "hook_id": "server_all", "url": "https://example.org/ops", "format": "slack",
            "events": ["run.failed", "run.succeeded"], "secret_env": None, "created_at": "t",
        }])  # fmt: skip


def test_an_event_a_hook_wants_puts_a_delivery_in_the_outbox_in_its_transaction(conn):
    add_hooks(conn)
    with conn.transaction():
        conn.append_events([
            ("run_me", 1, "run.started", "t", "{}"),
            ("run_me", 2, "input.requested", "t", "{}"),
            ("run_me", 3, "run.succeeded", "t", "{}"),
            ("run_other", 1, "run.succeeded", "t", "{}"),
        ])  # fmt: skip
    with pytest.raises(SeqTaken), conn.transaction():
        conn.append_events(
            [("run_other", 2, "run.failed", "t", "{}"), ("run_other", 1, "x", "t", "{}")]
        )
    mine = conn.list_deliveries("hook_mine", 10)
    assert sorted((d["run_id"], d["seq"], d["type"]) for d in mine) == [
        ("run_me", 2, "input.requested"), ("run_me", 3, "run.succeeded"),
    ]  # fmt: skip
    # The server's hook sees every owner's runs; the refused event left nothing.
    server = conn.list_deliveries("server_all", 10)
    assert sorted((d["run_id"], d["seq"]) for d in server) == [("run_me", 3), ("run_other", 1)]
    assert {d["status"] for d in mine + server} == {"pending"}
    assert [h["hook_id"] for h in conn.list_hooks("me")] == ["hook_mine"]
    assert conn.get_hook("server_all")["owner"] is None


def test_a_delivery_is_claimed_once_and_a_runs_later_one_waits_for_its_earlier(store):
    first, second = store.connect(), store.connect()
    try:
        add_hooks(first)
        with first.transaction():
            first.append_events([
                ("run_me", 1, "input.requested", "t", "{}"),
                ("run_me", 2, "run.succeeded", "t", "{}"),
            ])  # fmt: skip
        now = time.time()
        with first.transaction():
            claimed = first.claim_deliveries(now, now + 30, 10)
        # The earliest of each hook and run: the run's end waits behind its question.
        assert sorted((c["hook_id"], c["seq"]) for c in claimed) == [
            ("hook_mine", 1), ("server_all", 2),
        ]  # fmt: skip
        assert claimed[0]["owner"] == "me"
        with second.transaction():
            assert second.claim_deliveries(now, now + 30, 10) == []
        [asked] = [c for c in claimed if c["seq"] == 1]
        with first.transaction():
            first.finish_delivery(asked["delivery_id"], now, "HTTP 500", now)
        with second.transaction():
            [again] = second.claim_deliveries(now + 1, now + 30, 10)
        assert again["delivery_id"] == asked["delivery_id"] and again["attempts"] == 1
        with second.transaction():
            second.finish_delivery(again["delivery_id"], now + 1, None, None)
        with first.transaction():
            [end] = first.claim_deliveries(now + 1, now + 30, 10)
        assert (end["hook_id"], end["seq"]) == ("hook_mine", 2)
        assert not first.due_deliveries(now + 1)
        statuses = {
            d["seq"]: (d["status"], d["attempts"]) for d in first.list_deliveries("hook_mine", 10)
        }
        assert statuses == {1: ("delivered", 2), 2: ("pending", 0)}
        with first.transaction():
            assert first.delete_hook("me", "hook_mine")
            assert not first.delete_hook("me", "server_all")
        assert first.list_deliveries("hook_mine", 10) == []
    finally:
        first.close()
        second.close()


def schedule_row(schedule_id, owner="me", **fields):
    return {
        "schedule_id": schedule_id,
        "owner": owner,
        "agent": "demo",
        "input": {"prompt": "p"},
        "cron": "* * * * *",
        "timezone": "UTC",
        "session": None,
        "created_at": f"2026-01-01T00:00:{len(schedule_id):02d}Z",
        "last_slot": "2026-01-01T00:00:00Z",
        **fields,
    }


def test_a_schedule_slot_is_advanced_once_and_its_runs_found_by_their_keys(conn):
    with conn.transaction():
        conn.insert_schedule(schedule_row("sch_a"))
        conn.insert_schedule(schedule_row("sch_bb", owner="other"))
        conn.insert_schedule(schedule_row("sch_ccc", paused=True))
    assert [s["schedule_id"] for s in conn.list_schedules("me")] == ["sch_a", "sch_ccc"]
    # Every owner's, but not the paused.
    assert [s["schedule_id"] for s in conn.list_schedules(None)] == ["sch_a", "sch_bb"]
    schedule = conn.get_schedule("sch_a")
    assert schedule["input"] == {"prompt": "p"} and schedule["paused"] is False
    assert schedule["skipped"] == 0 and schedule["skips"] == []

    # Two servers handle the same slot: the first one's advance counts, the other's changes nothing.
    skip = {"first": "2026-01-01T00:01:00Z", "last": "2026-01-01T00:02:00Z", "count": 2}
    with conn.transaction():
        assert conn.advance_schedule(
            "sch_a", "2026-01-01T00:00:00Z", "2026-01-01T00:03:00Z", 2, [skip], None
        )
        assert not conn.advance_schedule(
            "sch_a", "2026-01-01T00:00:00Z", "2026-01-01T00:03:00Z", 2, [skip], None
        )
        # A paused schedule is not advanced.
        assert not conn.advance_schedule(
            "sch_ccc", "2026-01-01T00:00:00Z", "2026-01-01T00:03:00Z", 0, None, None
        )
    schedule = conn.get_schedule("sch_a")
    assert schedule["last_slot"] == "2026-01-01T00:03:00Z"
    assert schedule["skipped"] == 2 and schedule["skips"] == [skip]
    with conn.transaction():
        assert conn.advance_schedule(
            "sch_a", "2026-01-01T00:03:00Z", "2026-01-01T00:04:00Z", 0, None, "a limit"
        )
    schedule = conn.get_schedule("sch_a")
    assert schedule["skips"] == [skip] and schedule["last_error"] == "a limit"

    with conn.transaction():
        conn.set_schedule_paused("sch_a", True, None)
    assert conn.get_schedule("sch_a")["paused"] is True
    with conn.transaction():
        conn.set_schedule_paused("sch_a", False, "2026-01-02T00:00:00Z")
    assert conn.get_schedule("sch_a")["last_slot"] == "2026-01-02T00:00:00Z"

    # Its runs, newest slot first, found by the keys' prefix (not another schedule's).
    with conn.transaction():
        for index, key in enumerate(
            [
                "schedule:sch_a:2026-01-01T00:03:00Z",
                "schedule:sch_a:2026-01-01T00:04:00Z",
                "schedule:sch_aa:2026-01-01T00:05:00Z",
                "schedule:sch_a;",
            ]
        ):
            conn.insert_run(run_row(f"run_{index}"))
            conn.insert_key("me", key, "fp", f"run_{index}", time.time(), True)
    assert [row["run_id"] for row in conn.schedule_runs("me", "sch_a", 5)] == ["run_1", "run_0"]
    assert [row["run_id"] for row in conn.schedule_runs("me", "sch_a", 1)] == ["run_1"]
    assert conn.schedule_runs("other", "sch_a", 5) == []

    with conn.transaction():
        assert conn.delete_schedule("sch_a")
        assert not conn.delete_schedule("sch_a")
    assert conn.get_schedule("sch_a") is None
