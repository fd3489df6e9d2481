"""The servers the bench measures, each a subprocess on a free port.

``EngineServer`` is ``jupyter server`` with the extension, its own config,
data and runtime dirs, and the bench's agents (``bench.agents``) importable.
``BareServer`` is the baseline: a tiny tornado app serving the same SSE frames
with no store behind it (``bench/bare.py``).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def raise_open_files_limit() -> None:
    """As many open files as the hard limit allows: 1,000 connections need more than 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard)
        )


def proc_status(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory figure (``VmRSS``, ``VmHWM``) in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU time of a process (default: this one), from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid or os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reset_peak_rss(pid: int) -> None:
    """Start ``VmHWM`` again from the current RSS."""
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")


class Subprocess:
    """A server in a subprocess.

    It inherits the bench's open-files limit (``raise_open_files_limit``).
    """

    process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def rss(self) -> int:
        return proc_status(self.pid, "VmRSS")

    def stop(self, timeout: float = 30) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class EngineServer(Subprocess):
    """``jupyter server`` with jupyter_agentruns and the bench agents, on a given database.

    The SQLite file at ``db_path``, unless ``agentruns`` names a ``store_url``.
    """

    def __init__(
        self, home: Path, db_path: Path, agentruns: dict | None = None, app: str = "jupyter_server"
    ):
        self.home = home
        # "jupyterlab" for the front-end scenarios: the same server with JupyterLab's pages.
        self.app = app
        self.db_path = db_path
        # A PostgreSQL store when the config names one; else the SQLite file at db_path.
        self.store_url = (agentruns or {}).get("store_url")
        self.port = free_port()
        self.token = "bench-" + os.urandom(8).hex()
        home.mkdir(parents=True, exist_ok=True)
        config_dir = home / "config"
        config_dir.mkdir(exist_ok=True)
        config = {
            "ServerApp": {"jpserver_extensions": {"jupyter_agentruns": True}},
            "AgentRuns": {
                "db_path": str(db_path),
                "agents": {"flood": "bench.agents:flood", "idle": "bench.agents:idle"},
                "max_active_runs_per_user": 10000,
                "max_streams_per_user": 100000,
                "max_retained_events": 10_000_000,
                **(agentruns or {}),
            },
        }
        (config_dir / "jupyter_server_config.json").write_text(json.dumps(config))
        self.env = {
            **os.environ,
            "HOME": str(home),
            "JUPYTER_CONFIG_DIR": str(config_dir),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "IPYTHONDIR": str(home / "ipython"),
            "PYTHONPATH": os.pathsep.join(
                p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p
            ),
        }
        if app == "jupyterlab":
            # No news or update pop-ups over what is measured.
            settings = home / "lab-settings"
            notification = settings / "@jupyterlab" / "apputils-extension"
            notification.mkdir(parents=True, exist_ok=True)
            (notification / "notification.jupyterlab-settings").write_text(
                json.dumps({"fetchNews": "false", "checkForUpdates": False})
            )
            self.env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
            self.env["JUPYTERLAB_WORKSPACES_DIR"] = str(home / "lab-workspaces")
        self.log_path = home / f"server-{self.port}.log"
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/agentruns/"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.api_url, headers=self.headers, timeout=120)

    def start(self, timeout: float = 60) -> EngineServer:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (the server writes it until stop())
        command = [
            sys.executable, "-m", self.app,
            f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
            "--ServerApp.ip=127.0.0.1", "--ServerApp.open_browser=False",
            "--ServerApp.allow_root=True", f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.home}",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            env=self.env,
            cwd=self.home,  # what a server writes where it runs (a collaboration store) stays there
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()  # one that answers but never gets ready must not outlive the bench
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"server exited with {self.process.returncode}:\n{self.log_tail()}"
                    )
                try:
                    if client.get("agents", timeout=2).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server did not start:\n{self.log_tail()}")
                time.sleep(0.1)

    def stop(self, timeout: float = 30) -> None:
        super().stop(timeout)
        if self._log is not None:
            self._log.close()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class BareServer(Subprocess):
    """The baseline: a bare tornado handler writing the same SSE frames (``bench/bare.py``)."""

    def __init__(self) -> None:
        self.port = free_port()

    def start(self, timeout: float = 30) -> BareServer:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.bare", str(self.port)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the bare tornado server did not start")
            time.sleep(0.05)
