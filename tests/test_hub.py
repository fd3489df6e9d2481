"""A real JupyterHub: its proxy, two users' single-user servers, the idle culler, one PostgreSQL store.

The hub runs as it does for people: ``configurable-http-proxy`` (from npm;
``scripts/test`` installs it into a cache outside the clone) in front, the
DummyAuthenticator, and JupyterHub's SimpleLocalProcessSpawner, which starts
``jupyterhub-singleuser`` for Alice and Bob as this process's user, each in a
home of their own. The extension is on there because it is installed, and
its owner mode is ``auto``: ``per-user`` under the hub. Each server reaches
the team's schema as a PostgreSQL role of its user's own, through the
``AGENTRUNS_STORE_URL`` that a callable ``c.Spawner.environment`` builds:
that part of the hub's configuration is read from the docs' JupyterHub guide, as written
there. Every request goes through the proxy with a hub token, as a
script's would, or from Chromium logged in at the hub's page, as a person's.

One hub serves the module's tests; every process it started (the proxy, the
servers) is ended after them, whatever happened. The browser's test runs
again on a hub of its own, of the lowest JupyterHub pyproject.toml allows.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import secrets
import shutil
import signal
import string
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import hubguide
import pytest
import rawdb
from httpx_sse import connect_sse
from packaging.version import Version

from jupyter_agentruns.agents.demo import answer_words

from conftest import picture
from servers import TLS, default_sigint, free_ports
from test_browser import (  # noqa: F401  (fixtures are found by name)
    CHROMIUM,
    browser,
    jp_asyncio_loop,
    jp_server_cleanup,
    page,
    run_cell,
    wait_answer,
    wait_attr,
    wait_idle,
    widget,
    write_notebook,
)
from test_panel import PANEL, open_panel, panel_row, wait_row_status

pytestmark = pytest.mark.hub

TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}
USERS = ("alice", "bob")
# The idle culler's timeout and how often it looks, in seconds (its settings take whole seconds).
CULL_TIMEOUT, CULL_EVERY = 3, 1
# How long a resumable run may wait for an answer and still keep its server from being culled.
WAITING_ACTIVITY_SECONDS = 2

# The hub's configuration, with this test's ports and paths; the store's part is the guide's.
HUB_CONFIG = string.Template("""\
c = get_config()  # noqa: F821

c.JupyterHub.bind_url = $public_url
c.JupyterHub.hub_bind_url = $hub_url
c.ConfigurableHTTPProxy.api_url = $proxy_api_url
c.ConfigurableHTTPProxy.command = [$proxy]
c.JupyterHub.db_url = $hub_db
c.JupyterHub.cookie_secret_file = $cookie_secret

c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {"alice", "bob"}
# No Unix users: each server runs as this process's user, in a home of its own.
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = $homes + "/{username}"
c.Spawner.cmd = [$singleuser]
c.Spawner.ip = "127.0.0.1"
c.Spawner.args = ["--allow-root", *$server_args]
# A server starting while the machine is busy (the suite runs beside it) can take a while.
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120


$store_config

# The hub hears of a server's activity every second (every five minutes by default).
c.Spawner.environment.update({"JUPYTERHUB_ACTIVITY_INTERVAL": "1"})

c.JupyterHub.services = [
    {"name": "tests", "api_token": $admin_token},
    {"name": "idle-culler", "api_token": $culler_token},
    {"name": "prometheus", "api_token": $scraper_token},
]
c.JupyterHub.load_roles = [
    {"name": "tests", "scopes": ["admin:users", "admin:servers", "tokens"], "services": ["tests"]},
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    },
    {"name": "prometheus", "scopes": ["access:servers"], "services": ["prometheus"]},
]
""")


# The environment of the lowest JupyterHub the test extra allows (scripts/test-lowest
# makes it, and runs the test that needs it).
LOWEST_HUB_PYTHON = Path(__file__).parent.parent / ".venv-hub-lowest" / "bin" / "python"


def proxy_command() -> str | None:
    """configurable-http-proxy: where scripts/test caches it, else on PATH."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cached = (
        cache / "jupyter_agentruns" / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
    )
    return str(cached) if cached.exists() else shutil.which("configurable-http-proxy")


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (its children, theirs, …), from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Hub:
    """JupyterHub as a subprocess, driven through its REST API with a service's token."""

    def __init__(self, home: Path, store_config: str, proxy: str, python: str = sys.executable):
        """``python``: the environment whose JupyterHub runs, for the hub and its servers alike."""
        self.home = home
        self.python = python
        self.port, hub_port, api_port = free_ports(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_token = secrets.token_hex(16)
        self.culler_token = secrets.token_hex(16)
        self.scraper_token = secrets.token_hex(16)
        server_args = [
            f"--AgentRuns.waiting_activity_seconds={WAITING_ACTIVITY_SECONDS}",
            "--AgentRuns.heartbeat_interval=0.5",
            # jupyter-collaboration, where installed, off: pages edit notebooks as without it.
            "--YDocExtension.disable_rtc=True",
        ]
        values = {
            "public_url": self.url,
            "hub_url": f"http://127.0.0.1:{hub_port}",
            "proxy_api_url": f"http://127.0.0.1:{api_port}",
            "proxy": proxy,
            "hub_db": f"sqlite:///{home / 'jupyterhub.sqlite'}",
            "cookie_secret": str(home / "cookie_secret"),
            "homes": str(home / "homes"),
            "singleuser": str(Path(python).parent / "jupyterhub-singleuser"),
            "server_args": server_args,
            "admin_token": self.admin_token,
            "culler_token": self.culler_token,
            "scraper_token": self.scraper_token,
        }
        config = HUB_CONFIG.substitute(
            {name: repr(value) for name, value in values.items()}, store_config=store_config
        )
        (home / "jupyterhub_config.py").write_text(config)
        self.log_path = home / "jupyterhub.log"
        self.process: subprocess.Popen | None = None
        self.api = httpx.Client(
            base_url=f"{self.url}/hub/api/",
            headers={"Authorization": f"token {self.admin_token}"},
            timeout=30,
        )
        self.tokens: dict[str, str] = {}

    def start(self, timeout: float = 60) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [self.python, "-m", "jupyterhub", "-f", str(self.home / "jupyterhub_config.py")],
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=default_sigint,  # its servers inherit it, whatever the test runner's is
            )
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, f"the hub exited: {self.log_tail()}"
            with contextlib.suppress(httpx.TransportError):
                if self.api.get("", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"the hub did not start: {self.log_tail()}"
            time.sleep(0.1)
        for user in USERS:
            response = self.api.post(f"users/{user}/tokens", json={"expires_in": 3600})
            assert response.status_code == 201, response.text
            self.tokens[user] = response.json()["token"]

    def stop(self) -> None:
        """End the hub and every process it started (the proxy, the servers): nothing is kept."""
        self.api.close()
        if self.process is None:
            return
        started = descendants(self.process.pid)
        self.process.kill()  # first, so that it starts nothing more
        self.process.wait(10)
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # A hub that exited by itself (it could not start) is no longer the parent of
        # the proxy it had started: the proxy is found by the pid file the hub wrote.
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.home / "jupyterhub-proxy.pid").read_text())
            if b"\0--port\0%d\0" % self.port in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def server(self, user: str) -> dict | None:
        """The hub's model of the user's server (None: not running)."""
        response = self.api.get(f"users/{user}")
        response.raise_for_status()
        return response.json()["servers"].get("")

    def start_servers(self, *users: str, timeout: float = 120) -> None:
        """Start the users' servers at once, as people logging in do, and wait until the hub says ready."""
        if not users:
            return
        with ThreadPoolExecutor(len(users)) as pool:
            list(pool.map(lambda user: self._start_server(user, timeout), users))

    def _start_server(self, user: str, timeout: float) -> None:
        with httpx.Client(base_url=self.api.base_url, headers=self.api.headers) as api:
            # The hub answers once the server is up, or 202 after its slow_spawn_timeout.
            response = api.post(f"users/{user}/server", timeout=timeout)
            assert response.status_code in (201, 202), response.text
            deadline = time.monotonic() + timeout
            while not (api.get(f"users/{user}").json()["servers"].get("") or {}).get("ready"):
                assert time.monotonic() < deadline, (
                    f"{user}'s server did not start: {self.log_tail()}"
                )
                time.sleep(0.1)

    def stop_server(self, user: str, timeout: float = 30) -> None:
        """What the Stop button, an admin or the culler do: the spawner sends SIGINT."""
        response = self.api.delete(f"users/{user}/server")
        assert response.status_code in (202, 204), response.text
        self.wait_stopped(user, timeout)

    def wait_stopped(self, user: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.server(user) is not None:
            assert time.monotonic() < deadline, f"{user}'s server did not stop: {self.log_tail()}"
            time.sleep(0.1)

    def client(
        self, user: str, token: str | None = None, path: str = "api/agentruns/"
    ) -> httpx.Client:
        """A client of the user's server, through the proxy, with a hub token (by default the user's)."""
        return httpx.Client(
            base_url=f"{self.url}/user/{user}/{path}",
            headers={"Authorization": f"token {token or self.tokens[user]}"},
            timeout=30,
            verify=TLS,
        )

    def culler(self) -> subprocess.Popen:
        """jupyterhub-idle-culler as the hub's idle-culler service, with a short timeout."""
        command = [sys.executable, "-m", "jupyterhub_idle_culler", f"--url={self.url}/hub/api"]
        with open(self.home / "culler.log", "ab") as log:
            return subprocess.Popen(
                [*command, f"--timeout={CULL_TIMEOUT}", f"--cull-every={CULL_EVERY}"],
                env={**os.environ, "JUPYTERHUB_API_TOKEN": self.culler_token},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def our_names(text: str) -> str:
    return hubguide.our_names(text, f"t{os.getpid()}")


def readme_store_config(address: str, role_prefix: str, secret: Path, admin_url: str) -> str:
    """The JupyterHub guide's configuration of the store and its pre_spawn_hook, with this
    test's database, names, secret and role-making role."""
    block = hubguide.block(
        "python", "# jupyterhub_config.py: each user's server reaches the team's schema"
    )
    block += our_names(hubguide.block("python", "# jupyterhub_config.py, below the block above"))
    for pattern, value in (
        (r'^AGENTRUNS_DATABASE = ".*"$', f"AGENTRUNS_DATABASE = {address!r}"),
        (r'^AGENTRUNS_ROLE_PREFIX = ".*"$', f"AGENTRUNS_ROLE_PREFIX = {role_prefix!r}"),
        (r'open\(".*?", "rb"\)', f'open({str(secret)!r}, "rb")'),
        (r'^AGENTRUNS_ADMIN_URL = ".*"$', f"AGENTRUNS_ADMIN_URL = {admin_url!r}"),
    ):
        block, found = re.subn(pattern, lambda _, value=value: value, block, flags=re.M)
        assert found == 1, f"the guide's hub configuration has no {pattern}"
    assert "c.Spawner.pre_spawn_hook = agentruns_pre_spawn_hook" in block
    return block


@pytest.fixture(scope="module")
def store(postgres_database, tmp_path_factory):
    """The team's schema as the guide makes it, with this test's names.

    An administrator makes the schema's owner, the group role and the role
    that makes users' roles; the owner makes the tables with ``jupyter
    agentruns migrate`` and grants the group role what a server uses. Each
    user's role is made by the hub's pre_spawn_hook, at the user's first
    start. Yields the store's URL (as the administrator, to read what
    servers wrote), and the guide's configuration for the hub.
    """
    import psycopg

    parts = urlsplit(postgres_database)
    schema, owner, group, maker = map(our_names, ("team", "team_owner", "team_users", "team_admin"))

    def url_as(role: str, query: str = "") -> str:
        netloc = f"{role}@{parts.hostname}:{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc, query=query))

    url = f"{postgres_database}?schema={schema}"
    secret = tmp_path_factory.mktemp("secret") / "agentruns-secret"
    secret.write_bytes(secrets.token_hex(32).encode() + b"\n")
    role_prefix = f"agentruns_t{os.getpid()}_"
    roles = [role_prefix + user for user in USERS] + [maker, group, owner]
    admin = psycopg.connect(postgres_database, autocommit=True)
    try:
        admin.execute(our_names(hubguide.block("sql", "CREATE ROLE team_owner")))
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path_factory.mktemp("no-config"))}
        migrate = subprocess.run(
            [sys.executable, "-m", "jupyter_agentruns.cli", "migrate"]
            + ["--store-url", url_as(owner, f"schema={schema}")],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert migrate.returncode == 0 and "created the store" in migrate.stdout, migrate.stderr
        with psycopg.connect(url_as(owner), autocommit=True) as as_owner:
            as_owner.execute(our_names(hubguide.block("sql", "-- as team_owner")))
        store_config = readme_store_config(
            f"{parts.hostname}:{parts.port}{parts.path}?schema={schema}",
            role_prefix,
            secret,
            url_as(maker),
        )
        yield url, store_config
    finally:
        hubguide.drop(admin, schema, roles)
        admin.close()


@pytest.fixture(scope="module")
def proxy():
    """configurable-http-proxy's command, once JupyterHub and its culler are known to be installed."""
    command = proxy_command()
    try:
        import jupyterhub  # noqa: F401
        import jupyterhub_idle_culler  # noqa: F401
    except ImportError:
        command = None
    if command is None:
        reason = (
            "no JupyterHub or configurable-http-proxy: bash scripts/test installs both "
            "(jupyterhub from the test extra, the proxy from npm into a cache)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the hub's tests")
        pytest.skip(reason)
    return command


@pytest.fixture(scope="module")
def hub(proxy, store, tmp_path_factory):
    """A running hub with Alice's and Bob's servers started; everything it started ended after."""
    _, store_config = store
    hub = Hub(tmp_path_factory.mktemp("hub"), store_config, proxy)
    try:
        hub.start()
        hub.start_servers(*USERS)
        yield hub
    finally:
        hub.stop()


@pytest.fixture
def lowest_hub(proxy, store, tmp_path_factory):
    """A hub of the lowest JupyterHub pyproject.toml allows, with Bob's server started.

    It runs from the environment ``scripts/test`` makes for it beside ``.venv``
    (``.venv-hub-lowest``): hub and servers alike, since a single-user server's
    login checks come from its own JupyterHub package.
    """
    if not LOWEST_HUB_PYTHON.exists():
        reason = f"no {LOWEST_HUB_PYTHON.parent.parent.name}: bash scripts/test makes it"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the hub's tests")
        pytest.skip(reason)
    _, store_config = store
    hub = Hub(tmp_path_factory.mktemp("hub-lowest"), store_config, proxy, str(LOWEST_HUB_PYTHON))
    try:
        hub.start()
        hub.start_servers("bob")
        yield hub
    finally:
        hub.stop()


def submit(client: httpx.Client, input: dict) -> str:
    response = client.post("runs", json={"agent": "demo", "input": input})
    assert response.status_code == 201, response.text
    return response.json()["run_id"]


def wait_run(client: httpx.Client, run_id: str, done, timeout: float = 30) -> dict:
    """Poll the run until ``done(run)``; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        run = client.get(f"runs/{run_id}").json()
        if done(run):
            return run
        assert time.monotonic() < deadline, f"{run_id} is still {run['status']}"
        time.sleep(0.05)


def events(client: httpx.Client, run_id: str) -> list[dict]:
    body = client.get(f"runs/{run_id}/events", params={"after": 0, "limit": 1000}).json()
    assert body["done"]
    return body["events"]


def asked(client: httpx.Client, run_id: str) -> dict:
    """The run's one question, once it waits for the answer."""
    run = wait_run(client, run_id, lambda run: run["status"] in {"waiting", *TERMINAL})
    assert run["status"] == "waiting", run
    [question] = run["snapshot"]["inputs"]
    return question


def hub_time(stamp: str | None) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0


@pytest.mark.timeout(150)
def test_runs_stream_through_the_proxy_stay_their_owners_and_outlive_a_hub_stop(hub, store):
    url, _ = store
    long = {"prompt": "alice's long question", "chunks": 120, "delay": 0.05, "tools": False}
    asking = {"prompt": "alice's question", "chunks": 5, "delay": 0, "tools": False, "ask": True}
    with hub.client("alice") as alice, hub.client("bob") as bob:
        run_id = submit(alice, long)

        # Streamed through the proxy: the first frames arrive while the run goes on.
        started = time.monotonic()
        with connect_sse(alice, "GET", f"runs/{run_id}/events", params={"after": 0}) as source:
            assert source.response.status_code == 200
            frames = []
            for frame in source.iter_sse():
                if frame.id:  # not the stream's opening retry: line
                    frames.append(frame)
                if sum(f.event == "text.delta" for f in frames) == 3:
                    break
        assert time.monotonic() - started < 3
        assert [int(f.id) for f in frames] == list(range(1, len(frames) + 1))
        assert alice.get(f"runs/{run_id}").json()["status"] == "running"

        # Alice's run is hers: Bob's server answers it as missing, and the hub
        # does not let Bob's token through to Alice's server at all.
        db = rawdb.connect(url)
        try:
            [(owner,)] = db.execute("SELECT owner FROM runs WHERE run_id = ?", [run_id]).fetchall()
        finally:
            db.close()
        assert owner == "alice"
        missing = bob.get(f"runs/{run_id}")
        assert missing.status_code == 404 and missing.json()["error"] == "run_not_found"
        assert bob.get("runs").json()["runs"] == []
        with hub.client("alice", token=hub.tokens["bob"]) as bob_at_alice:
            assert bob_at_alice.get(f"runs/{run_id}").status_code == 403

        # A scraper with a hub token of scope access:servers reads her server's metrics.
        with hub.client("alice", token=hub.scraper_token, path="") as scraper:
            metrics = scraper.get("metrics")
        assert metrics.status_code == 200 and "agentruns_runs_started_total 1.0" in metrics.text

        # The hub stops her server (SIGINT; the culler's stop is the same request)
        # while one run streams and another waits for her answer. Both are
        # handed over, and her next server takes them over as soon as it starts.
        waiting = submit(alice, asking)
        question = asked(alice, waiting)
        assert alice.get(f"runs/{run_id}").json()["status"] == "running"
        hub.stop_server("alice")
        hub.start_servers("alice")
        ready = time.monotonic()
        wait_run(alice, run_id, lambda run: run["attempt"] == 2, timeout=5)
        assert time.monotonic() - ready < 5
        # The question is still hers to answer, and the answer finishes the run.
        assert asked(alice, waiting) == question
        answer = alice.post(
            f"runs/{waiting}/inputs/{question['request_id']}", json={"choice": "approve"}
        )
        assert answer.status_code == 200, answer.text
        for resumed_id, input in ((waiting, asking), (run_id, long)):
            run = wait_run(alice, resumed_id, lambda run: run["status"] in TERMINAL)
            assert run["status"] == "succeeded" and run["attempt"] == 2
            assert run["output"]["text"] == "".join(answer_words(input["prompt"], input["chunks"]))
            resumed = [e for e in events(alice, resumed_id) if e["type"] == "run.resumed"]
            assert [e["data"]["reason"] for e in resumed] == ["server_shutdown"]


@pytest.mark.timeout(120)
def test_the_idle_culler_stops_a_server_only_once_its_runs_are_over_or_have_waited_long_enough(
    hub, store
):
    url, _ = store
    asking = {"prompt": "alice's question", "chunks": 5, "delay": 0, "tools": False, "ask": True}
    # Longer than the culler's timeout, its period and a report of activity together.
    working = {"prompt": "bob's work", "chunks": 70, "delay": 0.1, "tools": False}
    hub.start_servers(*(user for user in USERS if hub.server(user) is None))
    with hub.client("alice") as alice, hub.client("bob") as bob:
        waiting = submit(alice, asking)
        asked(alice, waiting)
        submitted = time.time()
        working_id = submit(bob, working)
    # The hub has heard of Bob's run before the culler first looks.
    deadline = time.monotonic() + 10
    while hub_time(hub.server("bob")["last_activity"]) < submitted:
        assert time.monotonic() < deadline, "the hub has not heard of bob's activity"
        time.sleep(0.1)

    # Nobody talks to the servers now (that would be activity): the store says how the runs are.
    culler = hub.culler()
    db = rawdb.connect(url)
    try:
        culled: dict[str, float] = {}
        finished = None
        deadline = time.monotonic() + 60
        while len(culled) < 2:
            assert time.monotonic() < deadline, f"culled only {sorted(culled)}: {hub.log_tail()}"
            found = db.execute(
                "SELECT run_id, status, attempt FROM runs WHERE run_id IN (?, ?)",
                [waiting, working_id],
            ).fetchall()
            runs = {run_id: (status, attempt) for run_id, status, attempt in found}
            if finished is None and runs[working_id][0] in TERMINAL:
                finished = time.monotonic()
            for user in USERS:
                server = hub.server(user)
                if user not in culled and (server is None or server["pending"] == "stop"):
                    culled[user] = time.monotonic()
            time.sleep(0.1)
    finally:
        db.close()
        culler.send_signal(signal.SIGTERM)
        culler.wait(10)
    # Bob's server lived as long as his run, and was culled once it was over.
    assert runs[working_id] == ("succeeded", 1)
    assert finished is not None and culled["bob"] > finished
    # Alice's was culled while her run waited for her: the run waits on, for her next server.
    assert runs[waiting] == ("waiting", 1)


def lowest_allowed_hub() -> Version:
    """The lowest JupyterHub that pyproject.toml's test extra allows."""
    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    [minimum] = re.findall(r'"jupyterhub>=([0-9.]+)"', pyproject)
    return Version(minimum)


@pytest.mark.browser
@pytest.mark.timeout(240)
@pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason="Chromium is not installed (apt-get install chromium)",
)
@pytest.mark.parametrize("jupyterhub", ["installed", "lowest"])
def test_a_person_logged_in_to_the_hub_sees_runs_in_the_panel_the_widget_and_after_a_refresh(
    jupyterhub,
    request,
    page,  # noqa: F811  (the fixture imported above)
):
    # The hub's single-user servers check the XSRF token on every request of a
    # page, reads too: the panel, the widget, the page's stream and the outputs
    # a refresh restores all answer 403 to a request without it.
    if jupyterhub == "installed":
        hub, user = request.getfixturevalue("hub"), "alice"
        expected = Version(importlib.metadata.version("jupyterhub"))
    else:
        hub, user = request.getfixturevalue("lowest_hub"), "bob"
        expected = lowest_allowed_hub()
    version = Version(hub.api.get("").json()["version"])
    assert version.release[:2] == (expected.release + (0,))[:2], version
    hub.start_servers(*(name for name in [user] if hub.server(name) is None))
    home = hub.home / "homes" / user
    settings = home / ".jupyter" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    (settings / "themes.jupyterlab-settings").write_text(json.dumps({"theme": "JupyterLab Light"}))
    prompt = f"through JupyterHub {version}"
    write_notebook(
        home / "hub.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            f'run = submit("demo", {{"prompt": "{prompt}", "chunks": 40, "delay": 0.1}})'
        ],
    )
    answers: list[tuple[int, str]] = []
    page.on(
        "response",
        lambda response: (
            answers.append((response.status, response.url))
            if "/api/agentruns/" in response.url
            else None
        ),
    )

    # Logged in at the hub's page, as a person is, who is then sent on to the
    # notebook: the server knows them by the cookie the hub's OAuth gave it.
    notebook = f"/user/{user}/lab/tree/hub.ipynb?reset"
    page.goto(f"{hub.url}/hub/login?next={quote(notebook, safe='')}")
    page.locator("#username_input").fill(user)
    page.locator("#login_submit").click()
    wait_idle(page)
    assert page.url.startswith(f"{hub.url}/user/{user}/lab"), page.url
    open_panel(page)
    run_cell(page, 0)
    run_id = wait_attr(page, 0, "data-run-id", "v && v.startsWith('run_')")
    wait_attr(page, 0, "data-status", "v === 'succeeded'")
    wait_answer(page, 0, prompt, 40)
    panel_row(page, run_id).wait_for(timeout=30_000)
    wait_row_status(page, run_id, "succeeded")
    page.locator(PANEL).screenshot(path=picture(f"hub-{jupyterhub}-panel.png"))
    widget(page).screenshot(path=picture(f"hub-{jupyterhub}-widget.png"))

    # Dark, and a refresh without saving: the run's output comes back from the server.
    with hub.client(user, path="") as client:
        response = client.put(
            "lab/api/settings/@jupyterlab/apputils-extension:themes",
            json={"raw": json.dumps({"theme": "JupyterLab Dark"})},
        )
        assert response.status_code == 204, response.text
    page.reload()
    wait_idle(page)
    page.wait_for_function(
        "(runId) => !!document.querySelector("
        "`.jp-Notebook .jp-OutputArea-output .agentruns-run[data-run-id='${runId}'][data-status='succeeded']`)",
        arg=run_id,
        timeout=60_000,
    )
    wait_answer(page, 0, prompt, 40)
    open_panel(page)
    wait_row_status(page, run_id, "succeeded")
    page.locator(PANEL).screenshot(path=picture(f"hub-{jupyterhub}-panel-dark.png"))
    widget(page).screenshot(path=picture(f"hub-{jupyterhub}-widget-dark.png"))

    # Compare, from the panel: a second run and the first, ticked, side by side (its
    # reads are the page's requests too, with the token).
    with hub.client(user) as client:
        other = submit(client, {"prompt": f"{prompt}, again", "chunks": 3})
        wait_run(client, other, lambda run: run["status"] == "succeeded")
    panel_row(page, other).wait_for(timeout=30_000)
    for ticked in (run_id, other):
        panel_row(page, ticked).locator(".agentruns-panel-pick").check()
    page.locator(f"{PANEL} .agentruns-panel-compare").click()
    compare = page.locator(f".agentruns-compare[data-left='{run_id}'][data-right='{other}']")
    compare.locator(".agentruns-compare-answer").nth(1).wait_for(timeout=30_000)
    assert compare.locator(".agentruns-compare-fact").first.inner_text().split() == [
        "Agent", "demo", "demo"
    ]  # fmt: skip
    page.screenshot(path=picture(f"hub-{jupyterhub}-compare-dark.png"))

    shown = page.locator(PANEL).inner_text() + widget(page).inner_text()
    assert "Forbidden" not in shown and "signed out" not in shown
    refused = [(status, url) for status, url in answers if status in (401, 403)]
    assert refused == []
    # The widget followed the run live, on the page's one stream.
    assert any(status == 200 and "/api/agentruns/streams" in url for status, url in answers)
