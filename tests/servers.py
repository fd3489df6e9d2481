"""Jupyter servers as real subprocesses, for crash, restart and multi-server tests."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from jupyter_core.paths import ENV_CONFIG_PATH, SYSTEM_CONFIG_PATH
from jupyter_server.extension.config import ExtensionConfigManager

# The TLS context of every HTTP client of the tests. They speak plain HTTP on
# loopback, yet httpx loads the CA bundle into a context of its own for each
# client it makes (26 ms of CPU, thousands of times in a test session).
TLS = ssl.create_default_context()

# The other server extensions installed beside this one (JupyterLab, its language
# servers, terminals, the notebook...): off in a plain ``jupyter server``, whose start
# they slowed by a second; ``app="jupyterlab"`` keeps them.
OTHER_EXTENSIONS_OFF = {
    name: False
    for name, enabled in ExtensionConfigManager(
        read_config_path=[*ENV_CONFIG_PATH, *SYSTEM_CONFIG_PATH]
    )
    .get_jpserver_extensions()
    .items()
    if enabled and name != "jupyter_agentruns"
}
# jupyter-collaboration (its server extension and the front end's plugins): off
# unless a test asks for it, so that every other test's pages edit the notebook
# as they do without it.
COLLABORATION_EXTENSIONS = ("jupyter_server_ydoc", "jupyter_server_fileid")
COLLABORATION_PLUGINS = ("@jupyter/collaboration-extension", "@jupyter/docprovider-extension")
EXTENSION_MANAGER = "@jupyterlab/extensionmanager-extension"
LANGUAGE_SERVERS = ("jupyter_lsp",)
# The language servers' plugin, and those that need it.
LANGUAGE_SERVERS_PLUGINS = (
    "@jupyterlab/lsp-extension",
    "@jupyterlab/fileeditor-extension:language-server",
    "@jupyterlab/notebook-extension:language-server",
)


def _is_guard(pid: int) -> bool:
    try:
        return b"guard.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """The processes ``pid`` started, from /proc (none where there is no /proc).

    Kernels run in sessions of their own: killing the server's process group
    leaves them running.
    """
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found.append(int(stat.parent.name))
    return found


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` different ports, free when chosen: each is held until all are chosen
    (one chosen and let go at a time, two in a row may be the same port)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


class PortTaken(RuntimeError):
    """Another process listened on the port chosen for a server before it did."""


def answered_by_agentruns(response: httpx.Response) -> bool:
    """Whether ``response`` to ``GET api/agentruns/agents`` is this extension's."""
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and ("agents" in body or "error" in body and "message" in body)


class ServerProcess:
    """``jupyter server`` with the extension, its own config and runtime dirs, a given database.

    ``collaboration``: jupyter-collaboration on (its server extension, and the
    front end's plugins for ``app="jupyterlab"``); off by default.
    """

    def __init__(
        self,
        home: Path,
        db_path: Path,
        agentruns: dict | None = None,
        app: str = "jupyter_server",
        config: dict | None = None,
        collaboration: bool = False,
    ):
        self.home = home
        self.db_path = db_path
        self.port = free_port()
        self.token = "test-token-" + os.urandom(6).hex()
        self.app = app
        home.mkdir(parents=True, exist_ok=True)
        # A short path: a kernel's sockets are named after its connection file
        # there, and a Unix socket's path has at most 107 bytes.
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="agentruns-"))
        config_dir = home / "config"
        config_dir.mkdir(exist_ok=True)
        # JupyterLab's language servers: no test edits code with them, and their
        # discovery at the start and the page's queries cost every lab server CPU.
        others = (
            dict.fromkeys(LANGUAGE_SERVERS, False) if app == "jupyterlab" else OTHER_EXTENSIONS_OFF
        )
        others = {
            **others,
            **{name: collaboration for name in COLLABORATION_EXTENSIONS},
            "jupyter_agentruns": True,
        }
        config = dict(config or {})  # other classes' settings, e.g. OpenAIAgent
        if collaboration:
            (home / "data").mkdir(parents=True, exist_ok=True)
            config = {
                # Its stores in the server's data directory, out of the listing of the
                # server's root: there, SQLite's journal beside a store comes and goes,
                # and a listing that found it, then not, answered 404 (JupyterLab then
                # says "Directory not found"). A document is saved soon after a change.
                "SQLiteYStore": {"db_path": str(home / "data" / "ystore.db")},
                "BaseFileIdManager": {"db_path": str(home / "data" / "file_id.db")},
                "YDocExtension": {"document_save_delay": 0.2},
                **config,
            }
        config = {
            **config,
            "ServerApp": {
                **config.get("ServerApp", {}),
                "jpserver_extensions": {
                    **others,
                    **config.get("ServerApp", {}).get("jpserver_extensions", {}),
                },
            },
            "AgentRuns": {"db_path": str(db_path), **(agentruns or {})},
            # Kernels on Unix sockets, not TCP ports: a kernel's five ports are
            # free when chosen but bound only once it has started, and another
            # test's kernel can take one meanwhile (the server then reads that
            # kernel's messages: "Invalid Signature", a notebook never idle).
            "KernelManager": {"transport": "ipc", **config.get("KernelManager", {})},
        }
        (config_dir / "jupyter_server_config.json").write_text(json.dumps(config))
        # No build check and no extension manager: each asks the server, which runs
        # yarn (a Node process) for its registry, at every page load; no language servers.
        disabled = [
            EXTENSION_MANAGER,
            *LANGUAGE_SERVERS_PLUGINS,
            *(() if collaboration else COLLABORATION_PLUGINS),
        ]
        labconfig = config_dir / "labconfig"
        labconfig.mkdir(exist_ok=True)
        (labconfig / "page_config.json").write_text(
            json.dumps(
                {
                    "buildCheck": False,
                    "buildAvailable": False,
                    "disabledExtensions": dict.fromkeys(disabled, True),
                }
            )
        )
        self.env = {
            **os.environ,
            "HOME": str(home),
            "JUPYTER_CONFIG_DIR": str(config_dir),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.runtime_dir),
            "IPYTHONDIR": str(home / "ipython"),
            "PYTHONPATH": os.pathsep.join(
                [
                    str(Path(__file__).parent),
                    str(Path(__file__).parent / "startup"),  # its sitecustomize: a faster start
                    os.environ.get("PYTHONPATH", ""),
                ]
            ),
        }
        if app == "jupyterlab":
            settings = home / "lab-settings"
            notification = settings / "@jupyterlab" / "apputils-extension"
            notification.mkdir(parents=True, exist_ok=True)
            (notification / "notification.jupyterlab-settings").write_text(
                json.dumps({"fetchNews": "false", "checkForUpdates": False})
            )
            self.env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
            self.env["JUPYTERLAB_WORKSPACES_DIR"] = str(home / "lab-workspaces")
        self.process: subprocess.Popen | None = None
        self.started = False
        self.chosen_port = self.port  # another may be set: a restart at a known address
        self.log_path = home / f"server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def api_url(self) -> str:
        return f"{self.url}api/agentruns/"

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.api_url,
            headers={"Authorization": f"token {self.token}"},
            timeout=30,
            verify=TLS,
        )

    def start(self, timeout: float = 60, ready_status: int = 200) -> ServerProcess:
        """Start the server and wait until it answers ``GET agents`` with ``ready_status``.

        Its port was free when it was chosen, but another test's process may
        take it before the server listens (a kernel, a fake model server: they
        bind port 0 too). A first start then picks another port and tries
        again, and an answer is taken only from this server, never from
        whatever else listens there.
        """
        for _ in range(3):
            try:
                return self._start(timeout, ready_status)
            except PortTaken:
                if self.started or self.port != self.chosen_port:
                    raise  # its address is known: a test may hold it
                self.port = self.chosen_port = free_port()
        raise PortTaken(f"three ports in a row were taken: {self.log_tail()}")

    def _start(self, timeout: float, ready_status: int) -> ServerProcess:
        log = open(self.log_path, "ab")
        log_start = log.tell()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                self.app,
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                "--ServerApp.ip=127.0.0.1",
                "--ServerApp.open_browser=False",
                "--ServerApp.allow_root=True",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={self.home}",
            ],  # fmt: skip
            env=self.env,
            stdin=subprocess.DEVNULL,  # as under a hub or a service manager: no terminal
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # A test runner's worker may ignore SIGINT (so that Ctrl-C reaches only
            # its controller), and a child inherits that: a server as a hub starts it.
            preexec_fn=default_sigint,
        )
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while True:
                if self.process.poll() is not None:
                    with open(self.log_path, "rb") as written:
                        written.seek(log_start)
                        if b"already in use" in written.read():
                            raise PortTaken(f"port {self.port} was taken")
                    raise RuntimeError(
                        f"server exited with {self.process.returncode}: {self.log_tail()}"
                    )
                try:
                    response = client.get("agents", timeout=2)
                    if response.status_code == ready_status and answered_by_agentruns(response):
                        self.started = True
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server did not start: {self.log_tail()}")
                time.sleep(0.1)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up."""
        if self.process and self.process.poll() is None:
            # An ACP agent's guard is left to do its work: it ends its agent's
            # whole group when the server dies. Killed, it could not, and the
            # agent's own children would run on.
            kernels = [pid for pid in children(self.process.pid) if not _is_guard(pid)]
            os.killpg(self.process.pid, signal.SIGKILL)
            for pid in kernels:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.wait(10)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)  # made again at a start

    def terminate(self, timeout: float = 30, sig: int = signal.SIGTERM) -> int:
        """SIGTERM (or ``sig``), then wait for the server to shut down cleanly."""
        assert self.process is not None
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        finally:
            self.kill()


def wait_status(client: httpx.Client, run_id: str, statuses, timeout: float = 30) -> dict:
    """Poll a server's run until its status is one of ``statuses``; returns the run."""
    deadline = time.monotonic() + timeout
    while True:
        run = client.get(f"runs/{run_id}").json()
        if run["status"] in statuses:
            return run
        assert time.monotonic() < deadline, f"{run_id} still {run['status']}"
        time.sleep(0.05)
