"""PostgreSQL with least privileges: a server needs CREATE only to create, and says plainly what it lacks.

A database administrator may make the store's schema in advance, or revoke
CREATE once it exists; a role that can use the schema and its tables runs a
server all the same. A role that lacks one of those is told which, once in
the log and in every 503, never "try again in a few seconds".
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import hubguide
import pytest
from traitlets.config import Config

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


@pytest.mark.timeout(120)
def test_the_hub_guides_owner_group_role_and_hook_give_a_user_a_store_without_create(
    postgres_database, tmp_path
):
    """The guide's statements as written, with names of this test's own: an owner
    migrates, a group role holds the privileges, and the pre_spawn_hook's function
    makes a user's role in it, which then uses the store (and a table a later
    migration adds) without CREATE anywhere."""
    import psycopg

    suffix = secrets.token_hex(3)

    def ours(text: str) -> str:
        return hubguide.our_names(text, suffix)

    schema, owner, group, admin_role = (
        ours(name) for name in ("team", "team_owner", "team_users", "team_admin")
    )
    parts = urlsplit(postgres_database)

    def url_as(role: str, query: str = "") -> str:
        netloc = f"{role}@{parts.hostname}:{parts.port or 5432}"
        return urlunsplit(parts._replace(netloc=netloc, query=query))

    admin = psycopg.connect(postgres_database, autocommit=True)
    prefix = f"agentruns_t{suffix}_"
    roles = [prefix + "alice", admin_role, group, owner]
    try:
        admin.execute(ours(hubguide.block("sql", "CREATE ROLE team_owner")))
        migrate = hubguide.block("bash", "jupyter agentruns migrate --store-url")
        assert "team_owner:PASSWORD@" in migrate and "?schema=team" in migrate
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "no-config")}
        env.pop("AGENTRUNS_STORE_URL", None)
        command = [sys.executable, "-m", "jupyter_agentruns.cli", "migrate"]
        command += ["--store-url", url_as(owner, f"schema={schema}")]
        created, again = (
            subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
            for _ in range(2)
        )
        assert created.returncode == 0, created.stderr
        assert f"as {owner} (schema {schema}): schema version" in created.stdout
        assert created.stdout.startswith("created the store at")
        assert again.returncode == 0 and "is up to date" in again.stdout

        with psycopg.connect(url_as(owner), autocommit=True) as as_owner:
            as_owner.execute(ours(hubguide.block("sql", "-- as team_owner")))

        # The hub's configuration and its hook, with this test's secret, prefix and admin role.
        secret = tmp_path / "agentruns-secret"
        secret.write_bytes(secrets.token_hex(32).encode())
        config = hubguide.block("python", "# jupyterhub_config.py: each user's server reaches")
        config = re.sub(r'open\(".*?", "rb"\)', f"open({str(secret)!r}, 'rb')", config)
        config = re.sub(
            r'^AGENTRUNS_ROLE_PREFIX = ".*"$',
            f"AGENTRUNS_ROLE_PREFIX = {prefix!r}",
            config,
            flags=re.M,
        )
        hook = ours(hubguide.block("python", "# jupyterhub_config.py, below the block above"))
        hook, found = re.subn(
            r'^AGENTRUNS_ADMIN_URL = ".*"$',
            f"AGENTRUNS_ADMIN_URL = {url_as(admin_role)!r}",
            hook,
            flags=re.M,
        )
        assert found == 1 and "c.Spawner.pre_spawn_hook = agentruns_pre_spawn_hook" in hook
        hub = {"c": Config()}
        exec(config + hook, hub)
        hub["agentruns_make_role"]("alice")
        hub["agentruns_make_role"]("alice")  # a later start: the role is there already

        user_url = url_as(prefix + "alice", f"schema={schema}")
        store = PostgresStore(user_url)
        conn = store.connect()
        try:
            with conn.transaction():
                conn.insert_run(
                    {"run_id": "run_a", "owner": "alice", "agent": "demo", "status": "queued",
                     "created_at": "2026-01-01T00:00:00Z", "last_seq": 0, "first_seq": 1}
                )  # fmt: skip
            assert conn.get_run_head("run_a")["status"] == "queued"
        finally:
            conn.close()
        with psycopg.connect(url_as(prefix + "alice"), autocommit=True) as as_user:
            [(may_create,)] = as_user.execute(
                "SELECT has_database_privilege(current_database(), 'CREATE') "
                "OR has_schema_privilege(%s, 'CREATE')",
                [schema],
            ).fetchall()
            assert may_create is False
            # What a later migration adds, made by the owner: the user's role may use it.
            with psycopg.connect(url_as(owner), autocommit=True) as as_owner:
                as_owner.execute(f'CREATE TABLE "{schema}".later (id bigserial, x integer)')
            as_user.execute(f'INSERT INTO "{schema}".later (x) VALUES (1)')
            assert as_user.execute(f'SELECT x FROM "{schema}".later').fetchall() == [(1,)]
    finally:
        hubguide.drop(admin, schema, roles)
        admin.close()
