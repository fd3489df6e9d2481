"""The store's password never shows: not in a log line, an answer, the command line's output or an error.

The password is as hostile as they come: a '#' and a '?' (which URL parsers
take for a fragment and a query), a space, and a '%' that decoding changes.
It is a real role's, given in every form libpq accepts: in the URL's user
information (percent-encoded, or with its '#' and '?' as written), as
``?password=``, and as key=value pairs (refused: a store_url is a URL); from
the configuration and from the environment. The local PostgreSQL trusts
127.0.0.1, so a connection proves the URL was read right by the user name
and the password libpq sent (``conn.info``), not by being let in.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import httpx
import pytest

from jupyter_agentruns.app import AgentRuns
from jupyter_agentruns.store import StoreUnavailable, UnsafeStore
from jupyter_agentruns.store.postgres import PostgresStore
from jupyter_agentruns.store.sqlite import SQLiteStore

from conftest import demo_input
from servers import ServerProcess, wait_status

pytestmark = pytest.mark.own_store

PASSWORD = "pa#ss?wo rd%40x"
ENCODED = quote(PASSWORD, safe="")  # pa%23ss%3Fwo%20rd%2540x
# The '#' and '?' as written; the space and the '%' must be encoded for libpq.
AS_WRITTEN = "pa#ss?wo%20rd%2540x"
# What a leak would show of it, whole or in part, as written, encoded or decoded.
PIECES = (PASSWORD, ENCODED, AS_WRITTEN, "pa#ss", "ss?wo", "%3Fwo", "wo rd", "wo%20rd",
          "rd%40x", "rd%2540x", "rd@x")  # fmt: skip
TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


def assert_hidden(text: str, where: str) -> None:
    shown = [piece for piece in PIECES if piece in text]
    assert not shown, f"{where} shows {shown} of the password:\n{text[-3000:]}"


@dataclass
class Role:
    name: str
    host: str
    port: int
    database: str

    def url(self, form: str, schema: str) -> str:
        """The store URL of this role, its password given in ``form``."""
        where = f"{self.host}:{self.port}/{self.database}"
        return {
            "user info, percent-encoded": f"postgresql://{self.name}:{ENCODED}@{where}?schema={schema}",
            "user info, '#' and '?' as written": f"postgresql://{self.name}:{AS_WRITTEN}@{where}?schema={schema}",
            "?password=": f"postgresql://{self.name}@{where}?password={ENCODED}&schema={schema}",
            "?password=, '#' and '?' as written": f"postgres://{self.name}@{where}?schema={schema}&password={AS_WRITTEN}",
        }[form]  # fmt: skip

    def unreachable(self) -> str:
        """Its URL, on a port where no database listens."""
        return f"postgresql://{self.name}:{AS_WRITTEN}@127.0.0.1:1/{self.database}"

    def stranger(self) -> str:
        """A URL of the same database as a role that does not exist: PostgreSQL itself says no."""
        where = f"{self.host}:{self.port}/{self.database}"
        return f"postgresql://nobody_{secrets.token_hex(3)}@{where}?password={ENCODED}"

    def described(self, schema: str) -> str:
        return (
            f"PostgreSQL database {self.database} at {self.host} port {self.port} "
            f"as {self.name} (schema {schema})"
        )


FORMS = (
    "user info, percent-encoded",
    "user info, '#' and '?' as written",
    "?password=",
    "?password=, '#' and '?' as written",
)


@pytest.fixture(scope="module")
def role(postgres_database):
    """A role with the hostile password, allowed to make the store's schemas in the test database."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(postgres_database)
    name = f"agentruns_secret_{secrets.token_hex(3)}"
    admin = psycopg.connect(postgres_database, autocommit=True)
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(PASSWORD)
        )
    )
    admin.execute(
        sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(parts.path.lstrip("/")), sql.Identifier(name)
        )
    )
    yield Role(name, parts.hostname, parts.port or 5432, parts.path.lstrip("/"))
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [name]
    )
    admin.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
    admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
    admin.close()


def schema_owner(postgres_database: str, schema: str) -> str | None:
    import psycopg

    with psycopg.connect(postgres_database) as admin:
        row = admin.execute(
            "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = %s", [schema]
        ).fetchone()
    return row and row[0]


def fresh_schema() -> str:
    return f"secret_{secrets.token_hex(4)}"


# The URL, read by libpq's rules -------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_each_form_of_the_password_connects_as_the_role_with_that_password(role, form):
    schema = fresh_schema()
    store = PostgresStore(role.url(form, schema))
    assert store.describe() == role.described(schema)
    conn = store.open()
    try:
        assert conn.info.user == role.name and conn.info.password == PASSWORD
        assert conn.execute("SELECT current_user, current_schema()").fetchone() == (
            role.name,
            schema,
        )
    finally:
        conn.close()


UNUSABLE = {
    "key=value pairs": f"host=127.0.0.1 port=5432 dbname=test user=me password='{PASSWORD}'",
    "a space as written": f"postgresql://me:{PASSWORD}@127.0.0.1:5432/test",
    "a space as written in ?password=": f"postgresql://me@127.0.0.1/test?password={PASSWORD}",
    "an '@' as written": "postgresql://me:pa@ss?wo%20rd%2540x@127.0.0.1:5432/test",
    "a '/' as written": "postgresql://me:pa/ss?wo%20rd%2540x@127.0.0.1:5432/test",
    "a parameter libpq does not know": f"postgresql://me:{ENCODED}@127.0.0.1/test?sslmod=require",
    "a schema that is no SQL name": f"postgresql://me:{ENCODED}@127.0.0.1/test?schema=Runs",
    "another scheme": f"mysql://me:{ENCODED}@127.0.0.1/test",
}


@pytest.mark.parametrize("value", UNUSABLE.values(), ids=UNUSABLE.keys())
def test_an_unusable_store_url_is_refused_naming_its_setting_never_its_password(value, monkeypatch):
    pytest.importorskip("psycopg")
    monkeypatch.delenv("AGENTRUNS_STORE_URL", raising=False)
    with pytest.raises(UnsafeStore) as configured:
        AgentRuns(store_url=value).open_store()
    monkeypatch.setenv("AGENTRUNS_STORE_URL", value)
    with pytest.raises(UnsafeStore) as environment:
        AgentRuns().open_store()
    assert str(configured.value).startswith("the setting c.AgentRuns.store_url ")
    assert str(environment.value).startswith("the environment variable AGENTRUNS_STORE_URL ")
    for refused in (configured, environment):
        assert_hidden(str(refused.value), "the error")
        assert "127.0.0.1" not in str(refused.value)  # nothing of the URL at all


def test_a_database_that_refuses_says_why_without_the_password(role):
    for url, why in (
        (role.unreachable(), "Connection refused"),
        (role.stranger(), "does not exist"),
    ):
        with pytest.raises(StoreUnavailable) as failure:
            PostgresStore(url).connect().get_run_head("run_a")
        assert "cannot be reached" in str(failure.value) and why in str(failure.value)
        assert_hidden(str(failure.value), "the error")


# A server: its log and every answer ---------------------------------------------


def server_on(tmp_path, url: str, where: str) -> ServerProcess:
    """A server (not started) whose store_url is ``url``, from the configuration or the environment."""
    config = {"store_url": url} if where == "configuration" else {}
    server = ServerProcess(tmp_path / "home", tmp_path / "agentruns.sqlite3", config)
    server.env.pop("AGENTRUNS_STORE_URL", None)
    if where == "environment":
        server.env["AGENTRUNS_STORE_URL"] = url
    return server


def every_answer(client: httpx.Client, run_id: str = "run_missing") -> list[httpx.Response]:
    return [
        client.get("agents"),
        client.get("usage"),
        client.get("runs"),
        client.get(f"runs/{run_id}"),
        client.get(f"runs/{run_id}/events"),
        client.get(f"runs/{run_id}/events", headers={"Accept": "text/event-stream"}),
        client.post(f"runs/{run_id}/cancel", json={}),
        client.get("no-such-endpoint"),
    ]


def stopped_log(server: ServerProcess) -> str:
    server.terminate()
    return server.log_path.read_text(errors="replace")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "where, form",
    [("environment", "user info, '#' and '?' as written"), ("configuration", "?password=")],
)
def test_a_server_on_the_role_logs_and_answers_without_the_password(
    role, postgres_database, tmp_path, where, form
):
    schema = fresh_schema()
    server = server_on(tmp_path, role.url(form, schema), where).start()
    try:
        with server.client() as client:
            submitted = client.post("runs", json={"agent": "demo", "input": demo_input()})
            assert submitted.status_code == 201, submitted.text
            run_id = submitted.json()["run_id"]
            assert wait_status(client, run_id, TERMINAL)["status"] == "succeeded"
            answers = [submitted, *every_answer(client, run_id)]
        assert [a.status_code for a in answers][:4] == [201, 200, 200, 200]
        for answer in answers:
            assert_hidden(answer.text, f"{answer.request.method} {answer.request.url.path}")
    finally:
        log = stopped_log(server)
    assert f"agentruns: store {role.described(schema)}" in log
    assert_hidden(log, "the server's log")
    assert schema_owner(postgres_database, schema) == role.name  # it connected as the role


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["environment", "configuration"])
def test_a_server_whose_database_refuses_answers_503_without_the_password(role, tmp_path, where):
    url = role.unreachable() if where == "environment" else role.stranger()
    server = server_on(tmp_path, url, where).start()
    try:
        with server.client() as client:
            submitted = client.post("runs", json={"agent": "demo", "input": demo_input()})
            answers = [submitted, *every_answer(client)]
        assert submitted.status_code == 503
        assert submitted.json()["error"] == "store_unavailable"
        assert "cannot be reached" in submitted.json()["message"]
        for answer in answers:
            assert_hidden(answer.text, f"{answer.request.method} {answer.request.url.path}")
    finally:
        log = stopped_log(server)
    assert "cannot be reached" in log
    assert_hidden(log, "the server's log")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "where, setting",
    [
        ("environment", "The environment variable AGENTRUNS_STORE_URL"),
        ("configuration", "The setting c.AgentRuns.store_url"),
    ],
)
def test_a_server_given_key_value_pairs_answers_503_naming_the_setting(tmp_path, where, setting):
    pytest.importorskip("psycopg")
    server = server_on(tmp_path, UNUSABLE["key=value pairs"], where).start(ready_status=503)
    try:
        with server.client() as client:
            submitted = client.post("runs", json={"agent": "demo", "input": demo_input()})
            answers = [submitted, *every_answer(client)]
        assert submitted.status_code == 503
        assert submitted.json()["error"] == "store_unavailable"
        assert submitted.json()["message"].startswith(f"{setting} must be a postgresql:// URL")
        for answer in answers:
            assert_hidden(answer.text, f"{answer.request.method} {answer.request.url.path}")
    finally:
        log = stopped_log(server)
    assert f"agentruns: {setting[0].lower()}{setting[1:]} must be a postgresql:// URL" in log
    assert_hidden(log, "the server's log")


# The command line ------------------------------------------------------------------


def store_command(tmp_path, *args, url=None, where=None) -> subprocess.CompletedProcess:
    """``jupyter agentruns`` (``copy``, given ``--from``), the store's URL given ``where``.

    Its configuration is its own: ``url`` is the store_url of its configuration
    file, its AGENTRUNS_STORE_URL, or its ``--store-url``.
    """
    config_dir = tmp_path / f"config-{secrets.token_hex(3)}"
    config_dir.mkdir()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config_dir)}
    env.pop("AGENTRUNS_STORE_URL", None)
    if where == "configuration":
        config = {"AgentRuns": {"store_url": url}}
        (config_dir / "jupyter_server_config.json").write_text(json.dumps(config))
    elif where == "environment":
        env["AGENTRUNS_STORE_URL"] = url
    elif where is not None:
        args = (*args, where, url)
    if args[0] == "--from":
        args = ("copy", *args)
    result = subprocess.run(
        [sys.executable, "-m", "jupyter_agentruns.cli", *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in result.stderr, result.stderr
    assert_hidden(result.stdout + result.stderr, f"{args[0]}'s output")
    return result


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "where, form",
    [
        ("--store-url", "user info, percent-encoded"),
        ("environment", "user info, '#' and '?' as written"),
        ("configuration", "?password=, '#' and '?' as written"),
    ],
)
def test_doctor_reads_the_roles_store_and_never_shows_the_password(role, tmp_path, where, form):
    schema = fresh_schema()
    url = role.url(form, schema)
    conn = PostgresStore(url).connect()
    conn.count_runs_by_status()  # the first use creates the schema
    conn.close()
    doctor = store_command(tmp_path, "doctor", url=url, where=where)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert f"store      postgresql {role.described(schema)}\n" in doctor.stdout
    assert "runs       none" in doctor.stdout and doctor.stdout.endswith("ok\n")


@pytest.mark.timeout(120)
def test_doctor_and_gc_on_a_database_that_refuses_never_show_the_password(role, tmp_path):
    doctor = store_command(tmp_path, "doctor", url=role.unreachable(), where="environment")
    assert doctor.returncode == 1 and "cannot be reached" in doctor.stdout
    gc = store_command(tmp_path, "gc", url=role.stranger(), where="--store-url")
    assert gc.returncode == 69 and "does not exist" in gc.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "where, status, setting",
    [
        ("--store-url", 64, "--store-url"),
        ("environment", 78, "the environment variable AGENTRUNS_STORE_URL"),
        ("configuration", 78, "the setting c.AgentRuns.store_url"),
    ],
)
def test_the_command_line_refuses_key_value_pairs_naming_where_they_came_from(
    tmp_path, where, status, setting
):
    pytest.importorskip("psycopg")
    doctor = store_command(tmp_path, "doctor", url=UNUSABLE["key=value pairs"], where=where)
    assert doctor.returncode == status and doctor.stdout == ""
    assert f"{setting} must be a postgresql:// URL" in doctor.stderr


@pytest.mark.timeout(120)
def test_the_copy_to_postgresql_never_shows_the_password(role, postgres_database, tmp_path):
    source = tmp_path / "agentruns.sqlite3"
    SQLiteStore(source).connect().close()
    schema = fresh_schema()
    url = role.url("user info, '#' and '?' as written", schema)
    copied = store_command(tmp_path, "--from", str(source), url=url, where="environment")
    assert copied.returncode == 0, copied.stderr
    assert f"to {role.described(schema)}" in copied.stdout
    assert schema_owner(postgres_database, schema) == role.name

    failed = store_command(tmp_path, "--from", str(source), url=role.unreachable(), where="--to")
    assert failed.returncode == 69 and "cannot be reached" in failed.stderr
    refused = store_command(
        tmp_path, "--from", str(source), url=UNUSABLE["key=value pairs"], where="--to"
    )
    assert refused.returncode == 64 and "must be a postgresql:// URL" in refused.stderr
