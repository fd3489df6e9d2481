"""The SQLite store: schema, migrations, WAL, synchronous level."""

import sqlite3

import pytest

from jupyter_agentruns import store


def test_a_new_store_is_migrated_to_the_latest_schema_in_wal_mode(tmp_path):
    db = store.connect(tmp_path / "s.sqlite3")
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == len(store.MIGRATIONS)
    assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert set(db.table_names()) >= {"runs", "events", "idempotency_keys", "snapshots", "tombstones"}
    sql = db.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
    assert "WITHOUT ROWID" in sql and "PRIMARY KEY (run_id, seq)" in sql


def test_synchronous_normal_can_be_chosen(tmp_path):
    db = store.connect(tmp_path / "s.sqlite3", synchronous="NORMAL")
    assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 1


def test_opening_twice_migrates_once(tmp_path):
    store.connect(tmp_path / "s.sqlite3").conn.close()
    db = store.connect(tmp_path / "s.sqlite3")
    assert db.conn.execute("PRAGMA user_version").fetchone()[0] == len(store.MIGRATIONS)


def test_a_database_from_a_newer_version_is_refused_untouched(tmp_path):
    path = tmp_path / "s.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(store.MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        store.connect(path)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def test_a_duplicate_seq_is_refused(tmp_path):
    db = store.connect(tmp_path / "s.sqlite3")
    store.append_events(db, [("run_a", 1, "run.started", "t", "{}")])
    with pytest.raises(sqlite3.IntegrityError):
        store.append_events(db, [("run_a", 1, "run.started", "t", "{}")])


def test_an_older_database_is_migrated_with_its_data(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite3"
    monkeypatch.setattr(store, "MIGRATIONS", store.MIGRATIONS[:3])
    old = store.connect(path)
    old.conn.execute(
        "INSERT INTO runs (run_id, owner, agent, status, created_at, last_seq, first_seq, snapshot, snapshot_seq) "
        "VALUES ('run_old', 'me', 'demo', 'succeeded', 't', 7, 7, ?, 7)",
        ['{"messages": []}'],
    )
    old.conn.close()
    monkeypatch.undo()
    db = store.connect(path)
    run = store.get_run(db, "run_old")
    assert run["snapshot"] == {"messages": []} and run["snapshot_seq"] == 7
    assert "snapshot" not in db["runs"].columns_dict
