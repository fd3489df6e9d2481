"""``jupyter agentruns``: the command line, run as users run it, against real servers and stores.

Each command runs with the environment of a real ``jupyter server``
subprocess: the server's commands find it through
``AGENTRUNS_URL``/``AGENTRUNS_TOKEN``, the store's commands read the server's
own configuration files. A command runs as the program's ``main`` in the test's
process (its exit status, stdout and stderr as a shell sees them), and as a
subprocess (``python -m jupyter_agentruns.cli``) where the test is about the
process: its exit statuses, a ``tail`` followed while its server dies. Every test that starts a server
runs on both stores, but those of tail with its server away (the store is not
asked then).
"""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import rawdb
from tcpproxy import TcpProxy

from jupyter_agentruns.cli import build_parser, exits, main, output
from jupyter_agentruns.kernel.client import Server, find_server, redact_url
from jupyter_agentruns.store.postgres import PostgresStore
from jupyter_agentruns.store.sqlite import SQLiteStore

from servers import ServerProcess, wait_status

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}
SLOW = {"prompt": "follow me", "chunks": 300, "delay": 0.02}
QUICK = {"prompt": "quick", "chunks": 5, "delay": 0}


@pytest.fixture
def servers(tmp_path, store_config):
    started = []

    def start(name="a", **agentruns):
        config = {"lease_seconds": 1.5, **store_config, **agentruns}
        server = ServerProcess(tmp_path / name, tmp_path / "agentruns.sqlite3", config)
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.kill()


def command(server, *args, env=None):
    """The command line with the server's environment (its config dir) and its URL and token."""
    return [sys.executable, "-m", "jupyter_agentruns.cli", *args], {
        **server.env,
        "AGENTRUNS_URL": server.url,
        "AGENTRUNS_TOKEN": server.token,
        **(env or {}),
    }


def cli(server, *args, env=None, timeout=60, process=False) -> subprocess.CompletedProcess:
    """The command, in this process (``process``: as a subprocess); its status and output."""
    argv, environ = command(server, *args, env=env)
    if process:
        return subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=timeout)
    return in_process(argv[3:], environ)


def in_process(args, environ) -> subprocess.CompletedProcess:
    """``main(args)`` with ``environ`` as its whole environment, as ``python -m`` would run it.

    A fresh process costs a second of CPU; the program's ``__main__`` is only
    ``sys.exit(main())``, which the subprocess tests go through.
    """
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environ)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(args), out)
            except SystemExit as exit:  # argparse's usage errors
                status = exit.code if isinstance(exit.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(list(args), status, out.getvalue(), err.getvalue())


def cli_json(server, *args, env=None):
    result = cli(server, *args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def one_clear_line(result: subprocess.CompletedProcess) -> str:
    """An expected error: one line on stderr, no traceback, nothing on stdout."""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and result.stdout == "", result.stderr
    return lines[0]


def submit(client, input, **body) -> str:
    response = client.post("runs", json={"agent": "demo", "input": input, **body})
    assert response.status_code == 201, response.text
    return response.json()["run_id"]


def stored_events(client, run_id):
    events, after = [], 0
    while True:
        page = client.get(f"runs/{run_id}/events", params={"after": after, "limit": 1000}).json()
        if not page["events"]:
            return events
        events += page["events"]
        after = events[-1]["seq"]


class Tail:
    """``tail`` as a subprocess, its output lines collected as they come."""

    def __init__(self, server, *args, env=None):
        argv, environ = command(server, "tail", *args, env=env)
        self.process = subprocess.Popen(
            argv, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._threads = [
            threading.Thread(target=self._collect, args=(self.process.stdout, self.lines)),
            threading.Thread(target=self._collect, args=(self.process.stderr, self.errors)),
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _collect(stream, into):
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_lines(self, count, timeout=30):
        deadline = time.monotonic() + timeout
        while len(self.lines) < count:
            assert self.process.poll() is None, f"tail ended early: {self.errors}"
            assert time.monotonic() < deadline, f"tail printed {len(self.lines)} lines"
            time.sleep(0.02)

    def wait(self, timeout=60) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self.stop()

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        for thread in self._threads:
            thread.join(10)


@pytest.fixture
def tails():
    started = []

    def start(server, *args, env=None):
        started.append(Tail(server, *args, env=env))
        return started[-1]

    yield start
    for tail in started:
        tail.stop()


# Output for people (pure) ------------------------------------------------------


def test_the_docs_document_every_command_and_every_exit_status():
    docs = Path(__file__).parent.parent / "docs"
    operations = (docs / "how-to" / "operations.md").read_text()
    section = (docs / "reference" / "cli.md").read_text()
    [commands] = [a for a in build_parser()._actions if a.dest == "command"]
    for name in commands.choices:
        assert f"`jupyter agentruns {name}" in operations, name
    statuses = {v for k, v in vars(exits).items() if k.isupper() and isinstance(v, int)}
    for status in statuses:
        assert f"\n| {status} | " in section, status


def test_tail_waits_for_a_ping_longer_than_a_server_with_a_long_heartbeat_sends_one():
    args = build_parser().parse_args(["tail", "run_x"])
    assert args.read_timeout >= 2 * 60  # heartbeat_interval set to a minute still pings in time


def test_ages_and_durations_read_like_a_person_would_say_them():
    now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    iso = lambda delta: (now - delta).isoformat().replace("+00:00", "Z")  # noqa: E731
    assert output.age(iso(timedelta(minutes=3, seconds=5)), now) == "3m ago"
    assert output.age(iso(timedelta(seconds=42)), now) == "42s ago"
    assert output.age(iso(timedelta(days=2, hours=1)), now) == "2d ago"
    assert output.age(None, now) == "-"
    run = {"started_at": iso(timedelta(seconds=90)), "finished_at": iso(timedelta(seconds=88))}
    assert output.duration(run, now) == "2.0s"
    assert output.duration({"started_at": None}, now) == "-"


def test_a_table_aligns_every_column_on_its_widest_cell():
    text = output.table(("RUN", "STATUS"), [("run_a", "succeeded"), ("run_long_id", "failed")])
    header, first, second = text.splitlines()
    assert header.index("STATUS") == first.index("succeeded") == second.index("failed") == 13


# What agents write, as a terminal would receive it: the clipboard written
# (OSC 52), the line above erased, a C1 CSI, text reversed, a DEL, a return.
HOSTILE = (
    "clip\x1b]52;c;cHduZWQ=\x07 up\x1b[1A\x1b[2K csi\x9b2J rtl\u202eevil\u2069 del\x7f cr\rend"
)
# What a terminal acts on; a newline and a tab only where text has lines.
TERMINAL_COMMAND = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
SHOWN = "clip\\x1b]52;c;cHduZWQ=\\x07 up\\x1b[1A\\x1b[2K csi\\x9b2J rtl\\u202eevil\\u2069 del\\x7f cr\\rend"


def assert_text_for_a_terminal(text: str, lines: bool = True) -> None:
    """Nothing in ``text`` that a terminal acts on instead of showing it."""
    found = TERMINAL_COMMAND.search(text if lines else text.replace("\n", ""))
    assert found is None, f"{found.group()!r} at {found.start()} in {text!r}"
    if not lines:
        assert "\t" not in text


def test_control_characters_show_as_escapes_lines_and_tabs_stay_in_text():
    assert output.printable(HOSTILE) == SHOWN
    assert output.printable("a\tb\r\nc\nd") == "a\tb\nc\nd"  # a Windows line end is a line end
    assert output.one_line("a\tb\nc") == "a\\tb⏎c"
    # Another value than a string: its JSON, then escaped.
    assert output.one_line({"k": "\x1b[2J\u202e"}) == '{"k": "\\u001b[2J\\u202e"}'
    text = output.json_text({"text": HOSTILE + " 天气"})
    assert json.loads(text) == {"text": HOSTILE + " 天气"}  # the same value, read back
    assert "天气" in text and "\\u009b" in text and "\\u202e" in text
    assert_text_for_a_terminal(text)


def hostile_run(**fields):
    """A run object of the API whose every text field is what an agent could have written."""
    question = {
        "request_id": "in_1",
        "title": HOSTILE,
        "choices": [HOSTILE, "no"],
        "status": "open",
    }
    return {
        "run_id": "run_x", "status": "waiting", "agent": HOSTILE, "session": HOSTILE,
        "created_at": "2026-01-01T11:59:00Z", "started_at": "2026-01-01T11:59:01Z",
        "finished_at": None, "attempt": 1, "first_seq": 1, "last_seq": 9, "retry_of": HOSTILE,
        "snapshot": {
            "messages": [{"id": "m1", "text": f"{HOSTILE}\nline two\twith a tab", "done": True}],
            "tools": [{"call_id": "c1", "name": HOSTILE, "args": {"q": HOSTILE}, "status": HOSTILE}],
            "progress": {"fraction": 0.5, "message": HOSTILE},
            "usage": {"input_tokens": 3, "output_tokens": 4},
            "inputs": [question],
        },
        "error": {"type": HOSTILE, "message": HOSTILE},
        "cancel": {"reason": HOSTILE},
        **fields,
    }  # fmt: skip


def test_every_field_of_a_run_prints_as_text_not_as_terminal_commands():
    now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    run = hostile_run()
    shown = output.run_details(run, now)
    assert_text_for_a_terminal(shown)
    # agent, session, retry of, tool, progress, text, error, cancel, asks
    assert shown.count("\\x1b]52;c;") >= 9
    assert "    line two\twith a tab" in shown  # the answer keeps its lines and tabs
    table = output.runs_table([run], now)
    assert_text_for_a_terminal(table, lines=False)
    assert len(table.splitlines()) == 2  # one row: no text of the run starts a line of its own
    for kind, data in [
        ("tool.started", {"name": HOSTILE, "args": {"q": HOSTILE}}),
        ("tool.completed", {"ok": False, "error": HOSTILE}),
        ("progress", {"message": HOSTILE}),
        ("input.requested", {"request_id": HOSTILE, "title": HOSTILE, "choices": [HOSTILE]}),
        ("input.resolved", {"request_id": HOSTILE, "choice": HOSTILE}),
        ("run.resumed", {"attempt": HOSTILE, "reason": HOSTILE}),
        ("run.failed", {"error": {"type": HOSTILE, "message": HOSTILE}}),
        ("run.cancelled", {"reason": HOSTILE}),
        ("run.interrupted", {"reason": {"why": HOSTILE}}),
        (HOSTILE, {}),
    ]:
        line = output.event_line({"seq": 3, "type": kind, "data": data})
        assert_text_for_a_terminal(line, lines=False)
        assert "\\x1b" in line or "\\u001b" in line, line


def test_usage_that_is_not_counts_shows_as_unknown_and_odd_fields_as_absent():
    now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
    for odd in ["lots", -1000, 10**400, float("nan"), float("-inf"), 1.5, True, [1], {"a": 1}]:
        usage = {"input_tokens": odd, "output_tokens": 5}
        run = hostile_run(snapshot={"usage": usage})
        assert output.tokens(run) == "?", odd
        assert "  usage     ? input, 5 output tokens\n" in output.run_details(run, now)
        header, row = output.runs_table([run], now).splitlines()
        assert row[header.index("TOKENS") :].startswith("?  ")
        line = output.event_line({"seq": 4, "type": "usage", "data": usage})
        assert line == "[4] usage ? in, 5 out"
    assert output.tokens(hostile_run(snapshot={"usage": {"input_tokens": 7}})) == "7"
    assert output.usage_line({"window_seconds": "day", "runs": -2, "input_tokens": 1.0}) == (
        "last ? h: ? runs, 1 input tokens, 0 output tokens"
    )
    # Fields of another type than the API's: shown as absent, never a traceback.
    odd = {
        "run_id": ["x"], "status": None, "created_at": "yesterday", "started_at": "2026-01-01T11:00",
        "finished_at": 5, "snapshot": {"messages": ["m", {"text": 3}], "tools": "t",
        "progress": {"message": "p", "fraction": float("inf")}, "inputs": [1], "usage": "u"},
        "error": "boom", "cancel": ["why"],
    }  # fmt: skip
    shown = output.run_details(odd, now)
    assert "duration  running for 1h" in shown and "progress  p\n" in shown
    assert "messages  2, 0 characters" in shown
    assert output.runs_table(["not a run", odd], now).count("\n") == 2
    assert output.event_line({"type": None, "data": []}) == "[null] null"


def test_a_url_as_jupyter_prints_it_names_the_server_and_its_token(monkeypatch):
    monkeypatch.delenv("AGENTRUNS_TOKEN", raising=False)
    assert find_server("http://127.0.0.1:8888/lab?token=abc") == Server(
        "http://127.0.0.1:8888/", "abc", "/"
    )
    assert find_server("https://h/user/ann/lab/tree/lab/a.ipynb?token=t#x") == Server(
        "https://h/user/ann/", "t", "/user/ann/"
    )
    assert find_server("http://h:1/base/api/agentruns/runs").url == "http://h:1/base/"
    assert find_server("http://h/user/ann") == Server("http://h/user/ann/", "", "/user/ann/")
    assert find_server("http://h/?token=in-url", "given").token == "given"
    monkeypatch.setenv("AGENTRUNS_TOKEN", "from-env")
    assert find_server("http://h/").token == "from-env"
    assert find_server("http://h/tree?token=in-url").token == "in-url"
    redacted = redact_url("http://me:pw@h/lab?a=1&token=abc&b=2")
    assert redacted == "http://***@h/lab?a=1&token=***&b=2"


# Against a server --------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.sqlite_only  # the command reads the REST API: the stores are the store tests'
def test_list_show_usage_and_export_describe_the_callers_runs(servers, tmp_path):
    server = servers()
    with server.client() as client:
        ok = submit(client, QUICK, session="notebooks/a.ipynb")
        failed = submit(client, {**QUICK, "fail": True})
        for run_id in (ok, failed):
            wait_status(client, run_id, TERMINAL)
        newest = submit(client, QUICK)
        wait_status(client, newest, TERMINAL)
        run = client.get(f"runs/{ok}").json()
        record = client.get(f"runs/{ok}", headers={"Accept": "text/markdown"}).text
        events = stored_events(client, ok)

    listed = cli_json(server, "list")
    assert [r["run_id"] for r in listed] == [newest, failed, ok]  # newest first
    assert [r["run_id"] for r in cli_json(server, "list", "--limit", "2")] == [newest, failed]
    assert [r["run_id"] for r in cli_json(server, "list", "--status", "failed")] == [failed]
    assert [r["run_id"] for r in cli_json(server, "list", "--session", "notebooks/a.ipynb")] == [ok]
    assert [r["run_id"] for r in cli_json(server, "list", "--agent", "demo", "--limit", "5")] == [
        newest, failed, ok,
    ]  # fmt: skip
    assert cli_json(server, "list", "--agent", "nobody") == []

    table = cli(server, "list").stdout.splitlines()
    assert table[0].split() == [
        "RUN", "STATUS", "AGENT", "SESSION", "AGE", "DURATION", "TOKENS", "TITLE",
    ]  # fmt: skip
    assert table[3].split()[:4] == [ok, "succeeded", "demo", "notebooks/a.ipynb"]
    assert " ago " in table[3] or " just now " in table[3]  # an age for a person

    assert cli_json(server, "show", ok) == run
    shown = cli(server, "show", ok).stdout
    assert f"{ok}  succeeded  (demo)" in shown
    assert "tool      search" in shown and "Demo answer about quick" in shown
    assert (
        "error     DemoFailure: the demo agent was asked to fail"
        in cli(server, "show", failed).stdout
    )

    usage = cli_json(server, "usage")
    assert usage["runs"] == 3 and usage["window_seconds"] == 86400
    assert cli(server, "usage").stdout.startswith("last 24 h: 3 runs")

    assert cli(server, "export", ok).stdout == record
    target = tmp_path / "run.json"
    written = cli_json(server, "export", ok, "--format", "json", "-o", str(target))
    assert written["path"] == str(target) and written["bytes"] == target.stat().st_size
    exported = json.loads(target.read_text())
    assert exported == {"run": run, "events": events}
    assert [e["seq"] for e in exported["events"]] == list(range(1, run["last_seq"] + 1))


@pytest.mark.timeout(120)
@pytest.mark.sqlite_only  # the command reads the REST API: the stores are the store tests'
def test_conversations_lists_the_callers_conversations_newest_first(servers):
    server = servers()
    with server.client() as client:
        first = submit(client, {**QUICK, "prompt": "Plan a trip\nto Lisbon"}, session="trip")
        nb = submit(client, QUICK, session="nb/a.ipynb")
        chat = submit(client, QUICK, session="chat", metadata={"notebook": "nb/a.ipynb"})
        last = submit(client, QUICK, session="trip")
        submit(client, QUICK)  # no session: in no conversation
        for run_id in (first, nb, chat, last):
            wait_status(client, run_id, TERMINAL)

    listed = cli_json(server, "conversations")
    assert [(c["session"], c["runs"], c["last_run_id"]) for c in listed] == [
        ("trip", 2, last),
        ("chat", 1, chat),
        ("nb/a.ipynb", 1, nb),
    ]
    assert listed[0]["title"] == "Plan a trip" and listed[0]["agent"] == "demo"
    # The newest --limit of them.
    assert cli_json(server, "conversations", "--limit", "2") == listed[:2]
    notebook = cli_json(server, "conversations", "--notebook", "nb/a.ipynb")
    assert [c["session"] for c in notebook] == ["chat", "nb/a.ipynb"]
    assert cli_json(server, "conversations", "--agent", "nobody") == []
    assert cli(server, "conversations", "--agent", "nobody").stdout == "no conversations match\n"

    table = cli(server, "conversations").stdout.splitlines()
    assert table[0].split() == ["SESSION", "AGENT", "RUNS", "UPDATED", "LAST", "RUN", "TITLE"]
    assert table[1].split()[:3] == ["trip", "demo", "2"] and table[1].endswith("Plan a trip")
    refused = cli(server, "conversations", "--notebook", "../x.ipynb")
    assert refused.returncode == exits.REFUSED
    assert "not the path of a notebook" in one_clear_line(refused)


@pytest.mark.timeout(120)
def test_a_notebook_is_named_by_its_path_under_the_root_and_finds_its_older_absolute_runs(
    servers, store_config
):
    server = servers()
    absolute = str(server.home / "notebooks" / "q.ipynb")  # what a kernel sends (JPY_SESSION_NAME)
    sent = {
        "agent": "demo",
        "input": QUICK,
        "session": absolute,
        "metadata": {"notebook": absolute},
    }
    with server.client() as client:
        new = client.post("runs", json=sent, headers={"Idempotency-Key": "cell"}).json()
        assert new["session"] == "notebooks/q.ipynb"
        assert new["metadata"] == {"notebook": "notebooks/q.ipynb"}
        # The same request again, its absolute path and all, is the same run.
        again = client.post("runs", json=sent, headers={"Idempotency-Key": "cell"})
        assert again.status_code == 200 and again.json()["run_id"] == new["run_id"]
        old = submit(client, QUICK, session="notebooks/q.ipynb")
        elsewhere = submit(client, QUICK, session="/elsewhere/notebooks/q.ipynb")
        other = submit(client, QUICK, session="notebooks/other.ipynb")
        for run_id in (new["run_id"], old, elsewhere, other):
            wait_status(client, run_id, TERMINAL)
    # A run recorded before paths were made relative: its absolute path in the store.
    db = rawdb.connect(store_config.get("store_url") or str(server.db_path))
    try:
        db.execute("UPDATE runs SET session = ? WHERE run_id = ?", (absolute, old))
    finally:
        db.close()

    mine = sorted([new["run_id"], old])
    with server.client() as client:
        for params in ({"notebook": "notebooks/q.ipynb"}, {"session": absolute}):
            listed = client.get("runs", params=params).json()["runs"]
            assert sorted(run["run_id"] for run in listed) == mine, params
            assert {run["session"] for run in listed} == {"notebooks/q.ipynb"}
        assert client.get(f"runs/{old}").json()["session"] == "notebooks/q.ipynb"
        # Not under the root: kept as sent, and not found by the notebook's path.
        assert client.get(f"runs/{elsewhere}").json()["session"] == "/elsewhere/notebooks/q.ipynb"
    listed = cli_json(server, "list", "--session", "notebooks/q.ipynb")
    assert sorted(run["run_id"] for run in listed) == mine
    table = cli(server, "list").stdout
    assert str(server.home) not in table and table.count("notebooks/q.ipynb") == 3


@pytest.mark.sqlite_only  # the command reads the REST API: the stores are the store tests'
def test_what_an_agent_wrote_prints_as_text_and_json_never_as_terminal_commands(servers):
    server = servers(agents={"echo": "agents_for_tests:echo"})
    text = f"{HOSTILE}\nsecond line"
    with server.client() as client:
        asking = submit(client, {"text": text, "ask": True}, agent="echo", session=HOSTILE)
        failed = submit(client, {"text": text}, agent="echo", session=HOSTILE)
        wait_status(client, asking, {"waiting"})
        run = wait_status(client, failed, TERMINAL)
        events = stored_events(client, failed)
    assert run["status"] == "failed" and run["error"]["message"] == text

    table = cli(server, "list")
    assert table.returncode == 0, table.stderr
    assert_text_for_a_terminal(table.stdout)
    assert len(table.stdout.splitlines()) == 3 and f"  {SHOWN[:20]}" in table.stdout
    shown = cli(server, "show", asking).stdout
    assert_text_for_a_terminal(shown)
    for field in ("session", "progress", "tool", "asks"):
        line = next(line for line in shown.splitlines() if line.startswith(f"  {field:<10}"))
        assert "\\x1b]52;c;cHduZWQ=" in line, field
    assert f"    {SHOWN}\n    second line\n" in cli(server, "show", failed).stdout
    tail = cli(server, "tail", failed)
    assert tail.returncode == 1
    assert_text_for_a_terminal(tail.stdout + tail.stderr)
    assert f"{SHOWN}\nsecond line" in tail.stdout  # the text, its lines kept
    assert f"tool.started {SHOWN[:30]}" in tail.stdout
    export = cli(server, "export", failed)
    assert_text_for_a_terminal(export.stdout)
    assert "\\x1b]52;c;cHduZWQ=" in export.stdout

    # JSON escapes what a terminal would act on, and reads back as the same values.
    for argv in (["list"], ["show", failed], ["export", failed, "--format", "json"]):
        result = cli(server, *argv, "--json")
        assert_text_for_a_terminal(result.stdout)
        assert "\\u001b]52;c;" in result.stdout and "\\u202e" in result.stdout
    assert cli_json(server, "show", failed) == run
    tail_json = cli(server, "tail", failed, "--json")
    assert_text_for_a_terminal(tail_json.stdout)
    assert [json.loads(line) for line in tail_json.stdout.splitlines()] == events


def plant_snapshot(server, store_config, run_id, snapshot):
    """Write a run's snapshot into the store of the stopped server, as an older or a foreign writer could have."""
    from jupyter_agentruns.store.postgres import PostgresStore
    from jupyter_agentruns.store.sqlite import SQLiteStore

    url = store_config.get("store_url")
    conn = (PostgresStore(url) if url else SQLiteStore(server.db_path)).connect()
    try:
        seq = conn.get_run(run_id)["snapshot_seq"]
        with conn.transaction():
            conn.write_snapshot(run_id, seq, snapshot)
    finally:
        conn.close()


@pytest.mark.timeout(120)
def test_list_and_show_a_run_whose_usage_is_not_counts(servers, store_config):
    server = servers()
    with server.client() as client:
        odd = wait_status(client, submit(client, QUICK), TERMINAL)
        fine = wait_status(client, submit(client, QUICK), TERMINAL)
    server.kill()
    plant_snapshot(
        server, store_config, odd["run_id"],
        {**odd["snapshot"], "usage": {"input_tokens": "lots", "output_tokens": -1000}},
    )  # fmt: skip
    server.start()

    listed = cli(server, "list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    header, *lines = listed.stdout.splitlines()
    tokens = {line.split()[0]: line[header.index("TOKENS") :].split()[0] for line in lines}
    assert tokens[odd["run_id"]] == "?"
    usage = fine["snapshot"]["usage"]
    assert tokens[fine["run_id"]] == f"{usage['input_tokens'] + usage['output_tokens']:,}"
    shown = cli(server, "show", odd["run_id"])
    assert shown.returncode == 0 and "usage     ? input, ? output tokens" in shown.stdout
    assert cli_json(server, "list")[1]["snapshot"]["usage"]["input_tokens"] == "lots"


@pytest.mark.timeout(180)
def test_export_json_of_a_run_compacted_meanwhile_has_every_kept_event_and_no_hole(servers):
    server = servers(max_retained_events=40)  # a live run is compacted as it goes
    with server.client() as client:
        # 200 events a second, compacted to 40 as it goes: a read of the run
        # and its kept events outruns that even on a busy machine (at 500 a
        # second, under load, ten tries in a row could each lose the race).
        run_id = submit(client, {"prompt": "long", "chunks": 1600, "delay": 0.005})
        exports = []
        while client.get(f"runs/{run_id}").json()["status"] not in TERMINAL:
            result = cli(server, "export", run_id, "--format", "json")
            assert result.returncode == 0, result.stderr
            exports.append(json.loads(result.stdout))
        exports.append(cli_json(server, "export", run_id, "--format", "json"))
    assert len(exports) >= 3 and exports[-1]["run"]["first_seq"] > 1
    for exported in exports:
        run = exported["run"]
        seqs = [event["seq"] for event in exported["events"]]
        assert seqs == list(range(run["first_seq"], run["last_seq"] + 1))


@pytest.mark.timeout(120)
@pytest.mark.sqlite_only  # the command reads the REST API: the stores are the store tests'
def test_expected_errors_are_one_clear_line_and_a_distinct_exit_status(servers):
    server = servers()
    with server.client() as client:
        run_id = submit(client, {**QUICK, "ask": True})
        [question] = wait_status(client, run_id, {"waiting"})["snapshot"]["inputs"]

    # As a shell sees them: the process's exit status (and below, argparse's).
    missing = cli(server, "show", "run_nope", process=True)
    assert missing.returncode == 66 and "jupyter agentruns list" in one_clear_line(missing)
    assert cli(server, "tail", "run_nope").returncode == 66

    unreachable = cli(server, "list", env={"AGENTRUNS_URL": "http://127.0.0.1:9/lab?token=s3cret"})
    assert unreachable.returncode == 69 and "127.0.0.1:9" in one_clear_line(unreachable)
    for url in ("http://127.0.0.1:nine/?token=s3cret", "http://me:s3cret@h:9/", "localhost"):
        wrong = cli(server, "list", "--url", url)
        assert wrong.returncode == 69 and "s3cret" not in one_clear_line(wrong)
    # The URL as Jupyter prints it: its token is used, its page left out.
    printed = cli(
        server,
        "list",
        env={"AGENTRUNS_URL": f"{server.url}lab?token={server.token}", "AGENTRUNS_TOKEN": "wrong"},
    )
    assert printed.returncode == 0 and run_id in printed.stdout, printed.stderr
    elsewhere = cli(server, "list", "--url", f"{server.url}nowhere/")
    assert elsewhere.returncode == 69
    assert "does not answer as a Jupyter server with jupyter_agentruns" in one_clear_line(elsewhere)

    # A RUN that is not one path segment is one (unknown) run id all the same: nothing is cancelled.
    sneaky = cli(server, "answer", f"{run_id}/cancel?", question["request_id"], "approve")
    assert sneaky.returncode == 66 and "jupyter agentruns list" in one_clear_line(sneaky)
    assert cli(server, "tail", f"{run_id}/events?", "--give-up-after", "1").returncode == 66
    with server.client() as client:
        assert client.get(f"runs/{run_id}").json()["status"] == "waiting"

    signed_out = cli(server, "usage", env={"AGENTRUNS_TOKEN": "wrong"})
    assert signed_out.returncode == 77 and "--token" in one_clear_line(signed_out)

    refused = cli(server, "answer", run_id, question["request_id"], "maybe")
    assert refused.returncode == 65 and "invalid_choice" in one_clear_line(refused)

    usage = cli(server, "list", "--limit", "0", process=True)
    assert usage.returncode == 64 and "Traceback" not in usage.stderr
    assert cli(server, "frobnicate", process=True).returncode == 64


class OtherSite(http.server.BaseHTTPRequestHandler):
    """A web server that is not Jupyter: a page, a redirect to a login, a JSON list; it keeps what it was asked."""

    asked: list[tuple[str, str | None]] = []

    def do_GET(self):
        self.asked.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/moved/"):
            self.send_response(302)
            self.send_header("Location", "/login?next=agentruns")
            self.end_headers()
            return
        if self.path.startswith("/gateway/"):  # a proxy in front of a server that is down
            self.send_response(502)
            self.send_header("Retry-After", "7")
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html><body>Bad Gateway</body></html>")
            return
        kind, body = ("application/json", b"[1, 2]") if self.path.startswith("/list/") else (
            "text/html", b"<html><body>\x1b[2J a page</body></html>"
        )  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def other_site():
    OtherSite.asked.clear()
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OtherSite)
    thread = threading.Thread(target=site.serve_forever)
    thread.start()
    yield f"http://127.0.0.1:{site.server_address[1]}"
    site.shutdown()
    site.server_close()
    thread.join(10)


@pytest.mark.timeout(60)
def test_a_proxys_error_page_is_one_line_saying_when_to_try_again(other_site):
    from jupyter_agentruns.kernel.client import AgentRunsError, Client

    client = Client(Server(f"{other_site}/gateway/", "t", "/gateway/"), timeout=10)
    with pytest.raises(AgentRunsError) as raised:
        client.list_runs()
    error = raised.value
    assert (error.status, error.code, error.retry_after) == (502, "http_error", 7)
    assert error._render_traceback_() == [
        f"AgentRunsError: {other_site}/gateway/ answered 502 Bad Gateway: try again in 7 s "
        "(502 http_error)"
    ]


@pytest.mark.timeout(60)
def test_a_url_that_is_not_the_server_is_said_at_once_and_no_redirect_gets_the_token(other_site):
    env = {**os.environ, "AGENTRUNS_TOKEN": "s3cret"}

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "jupyter_agentruns.cli", *args],
            env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip

    for base in ("page", "list", "moved"):
        listed = run("list", "--url", f"{other_site}/{base}/")
        assert listed.returncode == 69, listed.stderr
        line = one_clear_line(listed)
        assert f"{other_site}/{base}/ does not answer as a Jupyter server" in line
        assert "s3cret" not in line and "\x1b" not in line
    started = time.monotonic()
    tail = run("tail", "run_x", "--url", f"{other_site}/page/")
    assert tail.returncode == 69 and "does not answer" in one_clear_line(tail)
    # No reconnecting to a page: it will not turn into the API.
    assert time.monotonic() - started < 20
    assert not [path for path, _ in OtherSite.asked if path.startswith("/login")]  # not followed
    assert {token for _, token in OtherSite.asked} == {"token s3cret"}


@pytest.mark.timeout(120)
@pytest.mark.sqlite_only  # the command reads the REST API: the stores are the store tests'
def test_answer_lets_a_waiting_run_go_on_and_tail_exits_with_its_success(servers):
    server = servers()
    with server.client() as client:
        run_id = submit(client, {**QUICK, "ask": True})
        [question] = wait_status(client, run_id, {"waiting"})["snapshot"]["inputs"]
    request_id = question["request_id"]
    assert f"asks      {request_id}: " in cli(server, "show", run_id).stdout

    answered = cli(server, "answer", run_id, request_id, "approve", "--note", "go")
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout in {  # the run goes on at once: it may be over by the answer
        f"answered {request_id} with 'approve'; {run_id} is {status}\n"
        for status in ("running", "succeeded")
    }
    tail = cli(server, "tail", run_id)
    assert tail.returncode == 0
    assert f"input.resolved {request_id} → approved" in tail.stdout
    assert tail.stdout.rstrip().endswith("run.succeeded")
    # The finished run still lists its question, with its answer.
    [asked] = [line for line in cli(server, "show", run_id).stdout.splitlines() if "asked" in line]
    assert asked.startswith(f"  asked     {request_id}: ") and asked.endswith(": go"), asked
    assert "[approve | deny]" in asked and " → approved" in asked, asked

    again = cli(server, "answer", run_id, request_id, "deny")
    assert again.returncode == 65 and "input_resolved" in one_clear_line(again)


@pytest.mark.timeout(120)
@pytest.mark.sqlite_only  # the command reads the REST API: the stores are the store tests'
def test_cancel_ends_a_run_and_tail_exits_2_with_the_reason(servers, tails):
    server = servers()
    with server.client() as client:
        run_id = submit(client, {**SLOW, "chunks": 3000})  # a minute: time to cancel it
        tail = tails(server, run_id)
        tail.wait_lines(3)
        cancelled = cli_json(server, "cancel", run_id, "--reason", "enough")
        assert cancelled["status"] in ("cancelling", "cancelled")
        assert cancelled["cancel"]["reason"] == "enough"
        assert tail.wait(30) == 2
        assert (
            tail.lines[-1]
            == f"[{wait_status(client, run_id, TERMINAL)['last_seq']}] run.cancelled enough"
        )
        assert tail.errors[-1] == f"{run_id} cancelled"

    again = cli(server, "cancel", run_id)
    assert again.returncode == 0 and again.stdout == f"{run_id} cancelled\n"


@pytest.mark.timeout(120)
@pytest.mark.sqlite_only  # the command reads the REST API: the stores are the store tests'
def test_tail_of_a_failed_run_exits_1_and_prints_the_failure(servers):
    server = servers()
    with server.client() as client:
        run_id = submit(client, {**QUICK, "fail": True})
        run = wait_status(client, run_id, TERMINAL)
    tail = cli(server, "tail", run_id)
    assert tail.returncode == 1
    assert tail.stdout.splitlines()[-1].startswith(f"[{run['last_seq']}] run.failed ")
    assert "Demo answer about quick" in tail.stdout  # the text, as text
    json_tail = cli(server, "tail", run_id, "--json", "--after", "3")
    assert json_tail.returncode == 1
    seqs = [json.loads(line)["seq"] for line in json_tail.stdout.splitlines()]
    assert seqs == list(range(4, run["last_seq"] + 1))


@pytest.mark.timeout(180)
@pytest.mark.sqlite_only  # the command reads the REST API: the stores are the store tests'
def test_tail_follows_a_run_through_a_server_kill_and_restart_printing_each_event_once(
    servers, tails
):
    server = servers()
    with server.client() as client:
        run_id = submit(client, SLOW)
    tail = tails(server, run_id, "--json", "--give-up-after", "60")
    tail.wait_lines(40)
    server.kill()
    time.sleep(1)
    server.start()  # the same port, token and store: the run is taken over once its lease expires

    assert tail.wait(90) == 0, tail.errors
    with server.client() as client:
        run = wait_status(client, run_id, TERMINAL)
        stored = stored_events(client, run_id)
    printed = [json.loads(line) for line in tail.lines]
    assert run["status"] == "succeeded" and run["attempt"] == 2
    assert printed == stored  # every event, once, in order, as stored
    assert [e["seq"] for e in printed] == list(range(1, run["last_seq"] + 1))
    assert "run.resumed" in [e["type"] for e in printed]
    assert any("reconnecting in" in line for line in tail.errors)


@pytest.mark.timeout(120)
@pytest.mark.sqlite_only  # what tail does when its server is away: the store is not asked
def test_tail_gives_up_when_the_server_stays_away(servers, tails):
    server = servers()
    with server.client() as client:
        run_id = submit(client, SLOW)
    tail = tails(server, run_id, "--give-up-after", "2")
    tail.wait_lines(2)
    server.kill()
    assert tail.wait(30) == 69
    assert "gave up following" in tail.errors[-1] and "--after" in tail.errors[-1]


@pytest.fixture
def proxy(servers):
    """A line between the command line and its server that the test can cut and restore."""
    made = []

    def make(server):
        made.append(TcpProxy("127.0.0.1", server.port))
        return made[-1], {"AGENTRUNS_URL": f"http://127.0.0.1:{made[-1].port}/"}

    yield make
    for line in made:
        line.close()


def wait_connected(proxy, tail, timeout=30):
    """Until tail has a connection through the proxy again (it must not have given up)."""
    deadline = time.monotonic() + timeout
    while proxy.connections == 0:
        assert tail.process.poll() is None, f"tail ended: {tail.errors}"
        assert time.monotonic() < deadline, f"tail did not reconnect: {tail.errors}"
        time.sleep(0.05)


@pytest.mark.timeout(120)
@pytest.mark.sqlite_only  # what tail does when its server is away: the store is not asked
def test_tail_back_on_a_stream_of_pings_gives_a_later_short_cut_its_whole_give_up_time(
    servers, tails, proxy
):
    server = servers(heartbeat_interval=0.5)
    line, env = proxy(server)
    with server.client() as client:
        run_id = submit(client, {**QUICK, "ask": True})
        waiting = wait_status(client, run_id, {"waiting"})
        [question] = waiting["snapshot"]["inputs"]
        tail = tails(server, run_id, "--json", "--give-up-after", "8", env=env)
        tail.wait_lines(waiting["last_seq"])

        line.cut()  # most of the give-up time without the server
        time.sleep(5)
        line.restore()
        wait_connected(line, tail)  # back: the run waits, only pings come
        time.sleep(4)  # past the give-up time since the first cut
        line.cut()  # a short cut: not a reason to give up
        time.sleep(1.5)
        line.restore()
        wait_connected(line, tail)

        answered = client.post(
            f"runs/{run_id}/inputs/{question['request_id']}", json={"choice": "approve"}
        )
        assert answered.status_code == 200, answered.text
        assert tail.wait(30) == 0, tail.errors
        run = wait_status(client, run_id, TERMINAL)
    assert [json.loads(text)["seq"] for text in tail.lines] == list(range(1, run["last_seq"] + 1))
    assert sum("reconnecting in" in text for text in tail.errors) >= 2


@pytest.mark.timeout(120)
@pytest.mark.sqlite_only  # what tail does when its server is away: the store is not asked
def test_tail_waits_for_a_server_that_does_not_answer_yet(servers, tails, proxy):
    server = servers()
    line, env = proxy(server)
    line.cut()
    with server.client() as client:
        run = wait_status(client, submit(client, QUICK), TERMINAL)
    tail = tails(server, run["run_id"], "--json", "--give-up-after", "30", env=env)
    time.sleep(2.5)
    assert tail.process.poll() is None, tail.errors
    line.restore()
    assert tail.wait(30) == 0, tail.errors
    assert [json.loads(text)["seq"] for text in tail.lines] == list(range(1, run["last_seq"] + 1))
    assert "reconnecting in" in tail.errors[0]


def test_a_stream_read_a_block_at_a_time_gives_every_frame_whole_however_it_is_cut():
    import io

    from jupyter_agentruns.kernel.client import _sse_frames

    big = "x" * 200_000  # a frame longer than a block
    body = (
        f'id: 1\ndata: {{"delta": "a"}}\n\n: ping\r\n\r\nid: 2\ndata: {{"delta": "{big}"}}\n\n'
    ).encode()

    class Cut(io.BytesIO):
        """What arrives: a few bytes, then a lot, as a network hands it over."""

        sizes = iter([3, 10, 1, 70_000, 5])

        def read1(self, size=-1):
            return super().read1(min(size, next(self.sizes, size)))

    frames = list(_sse_frames(Cut(body)))
    assert [(f["id"], len(f["data"]["delta"])) for f in frames] == [(1, 1), (2, len(big))]


def test_tail_waits_at_least_what_the_streams_retry_says_before_reconnecting():
    from jupyter_agentruns.cli.remote import Backoff
    from jupyter_agentruns.kernel.client import _sse_frames

    floors = []
    body = [b"retry: 4000\n", b"\n", b": ping\n", b"\n", b"id: 1\n", b'data: {"seq": 1}\n', b"\n"]
    assert list(_sse_frames(iter(body), floors.append)) == [{"id": 1, "data": {"seq": 1}}]
    assert floors == [4.0]
    backoff = Backoff()
    backoff.set_floor(floors[0])
    assert all(backoff.next() >= 4.0 for _ in range(3))
    backoff.set_floor(0.2)  # never below the first delay of the backoff itself
    backoff.reset()
    assert backoff.next() >= 1.0


# On the store ------------------------------------------------------------------


def cli_config(tmp_path, server, name, **agentruns):
    """Another Jupyter config dir naming the server's store, with other retention settings."""
    config_dir = tmp_path / name
    config_dir.mkdir()
    server_config = json.loads((server.home / "config" / "jupyter_server_config.json").read_text())
    config = {"AgentRuns": {**server_config["AgentRuns"], **agentruns}}
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(config))
    return {"JUPYTER_CONFIG_DIR": str(config_dir)}


@pytest.mark.timeout(180)
def test_gc_compacts_then_deletes_expired_runs_beside_a_running_server(servers, tmp_path):
    server = servers()  # the server's own retention is a day: only gc acts here
    with server.client() as client:
        finished = [submit(client, QUICK) for _ in range(3)]
        runs = [wait_status(client, run_id, TERMINAL) for run_id in finished]
        live = submit(client, {**SLOW, "chunks": 3000})  # still running when gc is done
        time.sleep(1.2)

        compact = cli_config(tmp_path, server, "compact", event_retention_seconds=1)
        counts = cli_json(server, "gc", env=compact)
        assert counts["runs_deleted"] == 0 and counts["runs_compacted"] == 3
        assert counts["events_compacted"] == sum(run["last_seq"] - 1 for run in runs)
        for run in runs:
            after = client.get(f"runs/{run['run_id']}").json()
            assert after["first_seq"] == after["last_seq"] == run["last_seq"]
            assert after["snapshot"] == run["snapshot"]
        assert cli_json(server, "gc", env=compact)["runs_compacted"] == 0  # nothing left to do

        delete = cli_config(tmp_path, server, "delete", run_retention_seconds=1)
        result = cli(server, "gc", env=delete)
        assert result.returncode == 0
        assert result.stdout == "3 runs deleted, 0 events compacted in 0 runs\n"
        for run_id in finished:
            assert client.get(f"runs/{run_id}").status_code == 410
        assert cli(server, "show", finished[0]).returncode == 66
        # The running run is untouched, and the server goes on with it.
        running = client.get(f"runs/{live}").json()
        assert running["status"] == "running" and running["first_seq"] == 1


@pytest.mark.timeout(120)
def test_doctor_reports_a_healthy_store(servers, store_kind):
    server = servers()
    with server.client() as client:
        wait_status(client, submit(client, QUICK), TERMINAL)
        wait_status(client, submit(client, {**QUICK, "fail": True}), TERMINAL)
    report = cli_json(server, "doctor")
    assert report["problems"] == [] and report["expired_leases"] == []
    assert report["store"]["kind"] == {"sqlite": "sqlite", "postgres": "postgresql"}[store_kind]
    assert report["runs_by_status"] == {"succeeded": 1, "failed": 1}
    assert report["schema_version"] == report["schema_versions_known"] >= 1
    assert {"jupyter_agentruns", "jupyter_server", "python"} <= set(report["versions"])
    assert ("sqlite" if store_kind == "sqlite" else "postgresql") in report["versions"]
    if store_kind == "sqlite":
        assert report["store"]["location"] == str(server.db_path)
        assert report["store"]["network_filesystem"] is None
    text = cli(server, "doctor")
    assert text.returncode == 0 and text.stdout.rstrip().endswith("ok")


@pytest.mark.timeout(120)
def test_doctor_finds_a_run_whose_server_died_and_exits_non_zero(servers):
    server = servers()
    with server.client() as client:
        run_id = submit(client, SLOW)
        wait_status(client, run_id, {"running"})
    server.kill()
    time.sleep(2)  # past the 1.5 s lease

    report = cli(server, "doctor", "--json")
    assert report.returncode == 1
    report = json.loads(report.stdout)
    [lease] = report["expired_leases"]
    assert lease["run_id"] == run_id and lease["status"] == "running"
    assert lease["lease_expired_seconds_ago"] > 0
    assert run_id in report["problems"][0] and "start a server" in report["problems"][0]
    text = cli(server, "doctor")
    assert text.returncode == 1 and f"problem    run {run_id} is running" in text.stdout


@pytest.mark.timeout(60)
@pytest.mark.own_store
def test_store_commands_on_a_store_not_created_yet_change_nothing(tmp_path):
    missing = tmp_path / "nowhere" / "agentruns.sqlite3"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    env.pop("AGENTRUNS_STORE_URL", None)
    base = [sys.executable, "-m", "jupyter_agentruns.cli"]
    gc = subprocess.run(
        [*base, "gc", "--db", str(missing)], env=env, capture_output=True, text=True
    )
    assert gc.returncode == 0 and "nothing to collect" in gc.stdout
    doctor = subprocess.run(
        [*base, "doctor", "--db", str(missing), "--json"], env=env, capture_output=True, text=True
    )
    assert doctor.returncode == 0 and json.loads(doctor.stdout)["store"]["exists"] is False
    assert not missing.exists()


def older_store(store_kind, tmp_path, request):
    """A store one migration behind this package: what a server of the previous version left.

    Returns the command line's option naming it, the version this package
    knows, and a function reading the version the store holds now.
    """
    if store_kind == "sqlite":
        from sqlite_utils import Database

        from jupyter_agentruns.store import sqlite

        path = tmp_path / "older.sqlite3"
        conn = rawdb.connect(str(path))
        db = Database(conn)
        for number, migration in enumerate(sqlite.MIGRATIONS[:-1], start=1):
            migration(db)
            conn.execute(f"PRAGMA user_version = {number}")
        version = lambda: conn.execute("PRAGMA user_version").fetchone()[0]  # noqa: E731
        return ["--db", str(path)], len(sqlite.MIGRATIONS), version, conn
    from jupyter_agentruns.store import postgres

    url = request.getfixturevalue("postgres_url")
    conn = rawdb.connect(url)
    conn.execute(f"CREATE SCHEMA {url.rsplit('schema=', 1)[1]}")
    conn.execute("CREATE TABLE schema_version (version integer NOT NULL)")
    for number, sql in enumerate(postgres._MIGRATIONS[:-1], start=1):
        conn.execute(sql)
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", [number])
    version = lambda: conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]  # noqa: E731
    return ["--store-url", url], len(postgres._MIGRATIONS), version, conn


def store_cli(tmp_path, *args) -> subprocess.CompletedProcess:
    """A store command with no Jupyter configuration: the store is the one its options name."""
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "no-config")}
    env.pop("AGENTRUNS_STORE_URL", None)
    return in_process(args, env)


@pytest.mark.timeout(120)
def test_doctor_and_gc_leave_an_older_or_newer_schema_as_it_is(store_kind, tmp_path, request):
    where, known, version, conn = older_store(store_kind, tmp_path, request)
    older = known - 1

    doctor = store_cli(tmp_path, "doctor", *where, "--json")
    assert doctor.returncode == 1, doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["schema_version"] == older and report["schema_versions_known"] == known
    [problem] = report["problems"]
    assert f"schema version {older}, this package knows {known}" in problem
    assert "a server of this version migrates it at its start" in problem
    assert "runs_by_status" not in report and "not read" in report["note"]
    assert version() == older  # not migrated beneath the older servers using it
    text = store_cli(tmp_path, "doctor", *where)
    assert text.returncode == 1
    assert f"schema     version {older} (this package knows up to {known})" in text.stdout
    assert f"problem    the store has schema version {older}" in text.stdout

    gc = store_cli(tmp_path, "gc", *where)
    assert gc.returncode == 69 and "migrates it at its start" in one_clear_line(gc)
    assert version() == older

    # A newer package wrote it: said, and left alone too.
    if store_kind == "sqlite":
        conn.execute(f"PRAGMA user_version = {known + 1}")
    else:
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", [older + 1])
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", [known + 1])
    newer = json.loads(store_cli(tmp_path, "doctor", *where, "--json").stdout)
    assert newer["schema_version"] == known + 1
    assert "newer than this package knows" in newer["problems"][0]
    gc = store_cli(tmp_path, "gc", *where)
    assert gc.returncode == 69 and "upgrade this package" in one_clear_line(gc)
    assert version() == known + 1
    conn.close()


@pytest.mark.timeout(120)
def test_migrate_creates_the_store_then_says_it_is_up_to_date(store_kind, tmp_path, request):
    if store_kind == "sqlite":
        path = tmp_path / "new" / "agentruns.sqlite3"
        where = ["--db", str(path)]
        store = SQLiteStore(path, migrate=False)
    else:
        url = request.getfixturevalue("postgres_url")
        where = ["--store-url", url]
        store = PostgresStore(url)
    known = store.schema_versions_known

    created = store_cli(tmp_path, "migrate", *where)
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("created the store at ")
    assert created.stdout.endswith(f": schema version {known}\n")
    assert store.schema_version() == known
    conn = store.connect()
    try:
        assert conn.count_runs_by_status() == {}  # its tables are there, and empty
    finally:
        conn.close()

    again = store_cli(tmp_path, "migrate", *where, "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["schema_version_before"] == report["schema_version"] == known
    text = store_cli(tmp_path, "migrate", *where)
    assert text.returncode == 0 and text.stdout.endswith(f"is up to date: schema version {known}\n")


@pytest.mark.timeout(120)
def test_migrate_brings_an_older_schema_forward_and_leaves_a_newer_one(
    store_kind, tmp_path, request
):
    where, known, version, conn = older_store(store_kind, tmp_path, request)
    migrated = store_cli(tmp_path, "migrate", *where)
    assert migrated.returncode == 0, migrated.stderr
    assert f"from schema version {known - 1} to {known}\n" in migrated.stdout
    assert version() == known
    doctor = store_cli(tmp_path, "doctor", *where, "--json")
    assert doctor.returncode == 0 and json.loads(doctor.stdout)["problems"] == []

    if store_kind == "sqlite":
        conn.execute(f"PRAGMA user_version = {known + 1}")
    else:
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", [known + 1])
    newer = store_cli(tmp_path, "migrate", *where)
    assert newer.returncode == 69 and "upgrade this package" in one_clear_line(newer)
    assert version() == known + 1
    conn.close()


@pytest.mark.timeout(60)
@pytest.mark.own_store
def test_migrate_of_a_store_it_cannot_reach_or_a_wrong_url_is_one_line_and_no_password(
    tmp_path, postgres_url
):
    parts = urlsplit(postgres_url)
    unreachable = urlunsplit(parts._replace(netloc="postgres:s3cret-pw@127.0.0.1:1"))
    failed = store_cli(tmp_path, "migrate", "--store-url", unreachable)
    assert failed.returncode == 69 and "cannot be reached" in one_clear_line(failed)
    wrong = store_cli(tmp_path, "migrate", "--store-url", "mysql://me:s3cret-pw@db/runs")
    assert wrong.returncode == 64 and "must be a postgresql:// URL" in one_clear_line(wrong)
    for process in (failed, wrong):
        assert "s3cret" not in process.stdout + process.stderr
