"""The SQLite store: schema, migrations, WAL, synchronous level."""

import json
import sqlite3

import pytest

from jupyter_agentruns import reducer
from jupyter_agentruns.store import SeqTaken, sql
from jupyter_agentruns.store import sqlite as store
from jupyter_agentruns.store.sqlite import SQLiteStore


def connect(path, synchronous="FULL"):
    return SQLiteStore(path, synchronous).connect()


def test_a_new_store_is_migrated_to_the_latest_schema_in_wal_mode(tmp_path):
    db = connect(tmp_path / "s.sqlite3")
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == len(store.MIGRATIONS)
    assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert set(db.db.table_names()) >= {
        "runs",
        "events",
        "idempotency_keys",
        "snapshots",
        "tombstones",
    }
    sql = db.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
    assert "WITHOUT ROWID" in sql and "PRIMARY KEY (run_id, seq)" in sql


def test_synchronous_normal_can_be_chosen(tmp_path):
    db = connect(tmp_path / "s.sqlite3", synchronous="NORMAL")
    assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 1


def test_opening_twice_migrates_once(tmp_path):
    connect(tmp_path / "s.sqlite3").conn.close()
    db = connect(tmp_path / "s.sqlite3")
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == len(store.MIGRATIONS)


def test_a_database_from_a_newer_version_is_refused_untouched(tmp_path):
    path = tmp_path / "s.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(store.MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        connect(path)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_a_duplicate_seq_is_refused(tmp_path):
    db = connect(tmp_path / "s.sqlite3")
    db.append_events([("run_a", 1, "run.started", "t", "{}")])
    with pytest.raises(SeqTaken):
        db.append_events([("run_a", 1, "run.started", "t", "{}")])


def test_an_older_database_is_migrated_with_its_data(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite3"
    monkeypatch.setattr(store, "MIGRATIONS", store.MIGRATIONS[:3])
    old = connect(path)
    old.conn.execute(
        "INSERT INTO runs (run_id, owner, agent, status, created_at, last_seq, first_seq, "
        "snapshot, snapshot_seq) "
        "VALUES ('run_old', 'me', 'demo', 'succeeded', 't', 7, 7, ?, 7)",
        ['{"messages": []}'],
    )
    old.conn.close()
    monkeypatch.undo()
    db = connect(path)
    run = db.get_run("run_old")
    assert run["snapshot"] == {"messages": []} and run["snapshot_seq"] == 7
    assert "snapshot" not in db.db["runs"].columns_dict


def test_nan_stored_by_an_older_version_becomes_null(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite3"
    monkeypatch.setattr(store, "MIGRATIONS", store.MIGRATIONS[:4])
    old = connect(path)
    old.conn.execute(
        "INSERT INTO runs (run_id, owner, agent, status, created_at, last_seq, first_seq, "
        "input, metadata) "
        "VALUES ('run_nan', 'me', 'demo', 'failed', 't', 2, 1, ?, ?)",
        [
            '{"prompt": "p", "delay": NaN, "w": [1, Infinity]}',
            '{"score": -Infinity, "note": "NaN is fine as text"}',
        ],
    )
    old.conn.close()
    monkeypatch.undo()
    run = connect(path).get_run("run_nan")
    assert run["input"] == {"prompt": "p", "delay": None, "w": [1, None]}
    assert run["metadata"] == {"score": None, "note": "NaN is fine as text"}


def test_older_runs_keep_their_token_totals_for_the_day_budget(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite3"
    monkeypatch.setattr(store, "MIGRATIONS", store.MIGRATIONS[:6])
    old = connect(path)
    rows = [
        ("run_used", '{"messages": [], "usage": {"input_tokens": 120, "output_tokens": 30}}'),
        ("run_none", '{"messages": [], "usage": null}'),
        ("run_odd", '{"messages": [], "usage": {"input_tokens": "many"}}'),
    ]
    for run_id, snapshot in rows:
        old.conn.execute(
            "INSERT INTO runs (run_id, owner, agent, status, created_at, last_seq, first_seq) "
            "VALUES (?, 'me', 'demo', 'succeeded', '2026-01-01T00:00:00.000Z', 3, 1)",
            [run_id],
        )
        old.conn.execute(
            "INSERT INTO snapshots (run_id, seq, snapshot) VALUES (?, 3, ?)", [run_id, snapshot]
        )
    # A run of megabytes has its snapshot in parts; its usage ends the last one.
    old.conn.execute(
        "INSERT INTO runs (run_id, owner, agent, status, created_at, last_seq, first_seq) "
        "VALUES ('run_big', 'me', 'demo', 'succeeded', '2026-01-01T00:00:00.000Z', 3, 1)"
    )
    old.conn.execute(
        "INSERT INTO snapshots (run_id, seq, snapshot, parts) VALUES ('run_big', 3, ?, 2)",
        ['{"messages": [{"text": "aaaa'],
    )
    old.conn.execute(
        "INSERT INTO snapshot_parts (run_id, part, data) VALUES ('run_big', 1, ?)",
        ['aaaa"}], "tools": [], "progress": null, "usage":{"input_tokens":7,"output_tokens":3}}'],
    )
    old.conn.close()
    monkeypatch.undo()
    db = connect(path)
    totals = dict(
        ((run_id, (i, o)) for run_id, _, i, o in db.usage_since("me", "2020-01-01T00:00:00.000Z"))
    )
    assert totals == {
        "run_used": (120, 30), "run_none": (0, 0), "run_odd": (0, 0), "run_big": (7, 3),
    }  # fmt: skip


def test_a_snapshot_is_stored_in_parts_and_read_back_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(sql, "SNAPSHOT_PART_CHARS", 1000)
    db = connect(tmp_path / "s.sqlite3")
    db.db["runs"].insert(
        {
            "run_id": "run_big",
            "owner": "me",
            "agent": "demo",
            "status": "succeeded",
            "created_at": "t",
            "last_seq": 1,
            "first_seq": 1,
        }
    )
    events = [{"type": "message.started", "data": {"message_id": "m1"}}]
    events += [
        {"type": "text.delta", "data": {"message_id": "m1", "delta": f'naïve 😀 "{i}"\n'}}
        for i in range(500)
    ]
    events += [{"type": "tool.started", "data": {"call_id": "c1", "name": "t", "args": {"q": "ü"}}}]
    builder = reducer.Snapshot()
    for event in events:
        builder.apply(event)
    db.write_snapshot("run_big", 1, builder)  # straight from the builder's pieces
    parts = db.conn.execute(
        "SELECT count(*) FROM snapshot_parts WHERE run_id = 'run_big'"
    ).fetchone()[0]
    assert parts > 5
    assert db.get_run("run_big")["snapshot"] == reducer.reduce(events)
    # The stored text as it is, a part at a time, for answers that splice it in undecoded.
    seq, count = db.snapshot_layout("run_big")
    text = "".join(db.snapshot_part("run_big", part, seq) for part in range(count))
    assert json.loads(text) == reducer.reduce(events)
    assert db.get_run("run_big", snapshot=False)["snapshot"] is None
    # A smaller snapshot written over it leaves no stale parts behind.
    db.write_snapshot("run_big", 2, {"messages": [], "tools": [], "progress": None, "usage": None})
    assert db.conn.execute("SELECT count(*) FROM snapshot_parts").fetchone()[0] == 0
    assert db.get_run("run_big")["snapshot"]["messages"] == []


def schema(conn):
    """Every table's columns and every index of a SQLite store, as SQLite describes them."""
    tables = [
        name
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        )
    ]
    return {
        name: (
            sorted(tuple(row[1:]) for row in conn.execute(f"PRAGMA table_info({name})")),
            sorted(
                (
                    index[1],
                    index[2],
                    index[4],
                    tuple(c[2] for c in conn.execute(f"PRAGMA index_info({index[1]})")),
                )
                for index in conn.execute(f"PRAGMA index_list({name})")
            ),
        )
        for name in tables
    }


def test_a_database_of_every_older_version_migrates_to_the_schema_of_a_new_one(
    tmp_path, monkeypatch
):
    new = connect(tmp_path / "new.sqlite3")
    expected = schema(new.conn)
    for version in range(1, len(store.MIGRATIONS)):
        path = tmp_path / f"version-{version}.sqlite3"
        monkeypatch.setattr(store, "MIGRATIONS", store.MIGRATIONS[:version])
        connect(path).close()
        monkeypatch.undo()
        migrated = connect(path)
        assert migrated.conn.execute("PRAGMA user_version").fetchone()[0] == len(store.MIGRATIONS)
        assert schema(migrated.conn) == expected, f"from version {version}"
        migrated.close()
