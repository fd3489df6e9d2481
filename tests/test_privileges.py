"""PostgreSQL with least privileges: a server needs CREATE only to create, and says plainly what it lacks.

A database administrator may make the store's schema in advance, or revoke
CREATE once it exists; a role that can use the schema and its tables runs a
server all the same. A role that lacks one of those is told which, once in
the log and in every 503, never "try again in a few seconds".
"""

from __future__ import annotations

import secrets
from urllib.parse import urlsplit, urlunsplit

import pytest

from jupyter_agentruns.store import StoreRefused
from jupyter_agentruns.store.postgres import PostgresStore

from servers import ServerProcess, wait_status

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


@pytest.fixture
def dba(postgres_database):
    """``(url_as(role, schema), sql)``: a fresh login role (no CREATE anywhere) and admin SQL."""
    import psycopg

    admin = psycopg.connect(postgres_database, autocommit=True)
    role = f"agentruns_user_{secrets.token_hex(3)}"
    admin.execute(f'CREATE ROLE "{role}" LOGIN')
    parts = urlsplit(postgres_database)

    def url_as(user: str, schema: str) -> str:
        netloc = f"{user}@{parts.hostname}:{parts.port or 5432}"
        return urlunsplit(parts._replace(netloc=netloc, query=f"schema={schema}"))

    yield role, url_as, admin.execute
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
    )
    admin.execute(f'DROP OWNED BY "{role}" CASCADE')
    admin.execute(f'DROP ROLE "{role}"')
    admin.close()


def schema_made_by_the_dba(execute, url_as, schema: str) -> None:
    """The schema and its tables, made by the administrator (the server's own migrations, as them)."""
    PostgresStore(url_as("postgres", schema)).open().close()


def grant_what_a_server_needs(execute, role: str, schema: str) -> None:
    execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
    execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
    execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')


def test_a_schema_made_in_advance_is_used_with_usage_and_table_privileges_only(dba):
    role, url_as, execute = dba
    schema = f"made_{secrets.token_hex(3)}"
    schema_made_by_the_dba(execute, url_as, schema)
    grant_what_a_server_needs(execute, role, schema)
    store = PostgresStore(url_as(role, schema))
    conn = store.connect()
    try:
        with conn.transaction():
            conn.insert_run(
                {"run_id": "run_a", "owner": "me", "agent": "demo", "status": "queued",
                 "created_at": "2026-01-01T00:00:00Z", "last_seq": 0, "first_seq": 1}
            )  # fmt: skip
        assert conn.get_run_head("run_a")["status"] == "queued"
    finally:
        conn.close()


def test_a_role_lacking_a_privilege_is_told_which_not_to_try_again(dba):
    role, url_as, execute = dba
    schema = f"made_{secrets.token_hex(3)}"
    schema_made_by_the_dba(execute, url_as, schema)
    grant_what_a_server_needs(execute, role, schema)
    execute(f'REVOKE DELETE ON "{schema}".events FROM "{role}"')
    with pytest.raises(StoreRefused) as refused:
        PostgresStore(url_as(role, schema)).open()
    said = str(refused.value)
    assert f'the role lacks DELETE ON "{schema}".events' in said
    assert "database administrator" in said and "try again" not in said
    with pytest.raises(StoreRefused) as refused:  # a schema it may not even see
        PostgresStore(url_as(role, f"other_{secrets.token_hex(3)}")).open()
    assert "CREATE" in str(refused.value)


@pytest.mark.timeout(120)
def test_a_server_without_a_privilege_answers_503_saying_so_and_logs_it_once(dba, tmp_path):
    role, url_as, execute = dba
    schema = f"made_{secrets.token_hex(3)}"
    schema_made_by_the_dba(execute, url_as, schema)
    grant_what_a_server_needs(execute, role, schema)
    server = ServerProcess(
        tmp_path / "a", tmp_path / "unused.sqlite3", {"store_url": url_as(role, schema)}
    )
    server.start()
    try:
        with server.client() as client:
            run = client.post("runs", json={"agent": "demo", "input": {"prompt": "p", "delay": 0}})
            assert run.status_code == 201, run.text
            assert wait_status(client, run.json()["run_id"], TERMINAL)["status"] == "succeeded"
    finally:
        server.terminate()
    # Revoked after its first start: the next server says what is missing.
    execute(f'REVOKE UPDATE ON "{schema}".runs FROM "{role}"')
    server = ServerProcess(
        tmp_path / "b", tmp_path / "unused.sqlite3", {"store_url": url_as(role, schema)}
    )
    server.start()
    try:
        with server.client() as client:
            for _ in range(3):
                refused = client.post("runs", json={"agent": "demo", "input": {"prompt": "p"}})
                assert refused.status_code == 503
                body = refused.json()
                assert body["error"] == "store_unavailable"
                assert f'UPDATE ON "{schema}".runs' in body["message"]
                assert "try again" not in body["message"].lower()
                assert "Retry-After" not in refused.headers
    finally:
        server.terminate()
    log = server.log_tail(2000)
    assert log.count(f'ON "{schema}".runs') == 1
    assert "Traceback" not in log
