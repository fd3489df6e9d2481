"""The kernel's side: find the Jupyter server that started this kernel and call its API.

Plain ``urllib``, so it works in any kernel without extra dependencies. The
server is found, in order, from: explicit ``url``/``token``; the environment
variables ``AGENTRUNS_URL``/``AGENTRUNS_TOKEN``; the running server whose
process started this kernel; JupyterHub's environment; the only running server.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .. import jsonio
from ..idempotency import fingerprinted_metadata
from ..lifecycle import TERMINAL_STATUSES


class OneLineError(Exception):
    """An error a person fixes from its message alone: IPython shows that one line, not a traceback.

    Its frames are the library's own and say nothing the message does not,
    so a cell that fails on one shows ``AgentRunsError: …`` and what to do, and
    a notebook exported by nbconvert keeps the same line.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class AgentRunsError(OneLineError):
    """An error answered by the agentruns API (``code`` is its ``error`` field).

    ``body`` is the whole answer: some errors say more (``session_busy`` has ``active_run_id``).
    ``retry_after``: the seconds the server asked to wait before trying again (503, 429), if it said.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ):
        super().__init__(f"{message} ({status} {code})")
        self.status = status
        self.code = code
        self.message = message
        self.body = body if body is not None else {"error": code, "message": message}
        self.retry_after = retry_after


class ServerNotFound(OneLineError, RuntimeError):
    """No Jupyter server to talk to could be found."""


class NotAgentRunsServer(ServerNotFound):
    """The URL answers, but not as a Jupyter server with jupyter_agentruns (a page, a login, another service).

    Unlike a server that does not answer, trying again does not help.
    """


@dataclass(frozen=True)
class Server:
    url: str  # the server's base URL, ending in "/"
    token: str
    base_url: str = "/"


def _running_servers() -> list[dict[str, Any]]:
    from jupyter_server.serverapp import list_running_servers

    return list(list_running_servers())


def _server_from_info(info: dict[str, Any]) -> Server:
    scheme = "https" if info.get("secure") else "http"
    base_url = info.get("base_url") or "/"
    # The kernel runs on the server's machine: loopback reaches it whatever it listens on.
    return Server(
        f"{scheme}://127.0.0.1:{info['port']}{base_url}", info.get("token") or "", base_url
    )


KERNEL_HINT = "Pass url= and token= to submit(), or set AGENTRUNS_URL and AGENTRUNS_TOKEN."

# The first path segment of a page or API under a server's base URL: what
# follows a server's URL as Jupyter prints it (``/lab?token=…``, ``/tree?token=…``)
# or as a browser shows it (``/lab/tree/a.ipynb``, ``/api/agentruns/runs``).
PAGE_SEGMENTS = frozenset(
    {"lab", "tree", "notebooks", "edit", "doc", "consoles", "terminals", "api"}
)


def redact_url(url: str) -> str:
    """``url`` fit to print: a ``token=`` in its query and a user or password before its host hidden."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "(a URL that cannot be read)"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = re.sub(r"(^|&)(token=)[^&]*", r"\1\2***", parts.query, flags=re.IGNORECASE)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def server_from_url(url: str, token: str | None, hint: str) -> Server:
    """The server a URL names: its base URL, and the token of its ``?token=`` when ``token`` is None.

    Jupyter prints a server's URL as ``http://host:8888/lab?token=…``: the
    page's path (see ``PAGE_SEGMENTS``), the query and the fragment are dropped.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        # .port raises ValueError for a port that is not a number.
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:
        valid = False
    if not valid:
        raise ServerNotFound(
            f"{redact_url(url)} is not a Jupyter server's URL (like http://127.0.0.1:8888/). {hint}"
        )
    if "@" in parts.netloc:
        raise ServerNotFound(
            f"{redact_url(url)} has a user or password before its host, which Jupyter does not "
            f"use: give the server's token instead. {hint}"
        )
    segments = parts.path.split("/")
    for index, segment in enumerate(segments):
        if segment in PAGE_SEGMENTS:
            segments = segments[:index]
            break
    base_url = "/".join(segments).rstrip("/") + "/"
    if token is None:
        token = urllib.parse.parse_qs(parts.query).get("token", [None])[-1]
    if token is None:
        token = os.environ.get("AGENTRUNS_TOKEN")
    return Server(
        urllib.parse.urlunsplit((parts.scheme, parts.netloc, base_url, "", "")),
        token or "",
        base_url,
    )


def find_server(
    url: str | None = None, token: str | None = None, hint: str = KERNEL_HINT
) -> Server:
    """The server this kernel should talk to (see the module docstring for the order).

    A token in the URL's query (``?token=``) is used unless ``token`` is given.
    ``hint``: how the caller chooses a server, said when none can be chosen.
    """
    url = url or os.environ.get("AGENTRUNS_URL")
    if url:
        return server_from_url(url, token, hint)
    token = token if token is not None else os.environ.get("AGENTRUNS_TOKEN")
    servers = _running_servers()
    parent = [info for info in servers if info.get("pid") == os.getppid()]
    if parent:
        server = _server_from_info(parent[0])
    elif os.environ.get("JUPYTERHUB_SERVICE_URL") and os.environ.get("JUPYTERHUB_API_TOKEN"):
        hub_url = os.environ["JUPYTERHUB_SERVICE_URL"].rstrip("/") + "/"
        server = Server(
            hub_url, os.environ["JUPYTERHUB_API_TOKEN"], urllib.parse.urlparse(hub_url).path
        )
    elif len(servers) == 1:
        server = _server_from_info(servers[0])
    else:
        found = ", ".join(redact_url(str(info.get("url", "?"))) for info in servers) or "none"
        raise ServerNotFound(
            f"Cannot tell which Jupyter server to use (running servers: {found}). {hint}"
        )
    if token:
        server = Server(server.url, token, server.base_url)
    if not server.token:
        raise ServerNotFound(
            f"The Jupyter server at {redact_url(server.url)} has no token to use (password login?). {hint}"
        )
    return server


class Client:
    """Blocking calls to ``{server}api/agentruns/``."""

    def __init__(self, server: Server, timeout: float = 60):
        self.server = server
        self.api = server.url + "api/agentruns/"
        self.timeout = timeout
        context = (
            ssl._create_unverified_context() if self.api.startswith("https://127.0.0.1") else None
        )
        self._opener = urllib.request.build_opener(
            _NoRedirects, urllib.request.HTTPSHandler(context=context)
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        accept: str = "application/json",
    ) -> tuple[int, dict[str, str], Any]:
        """One API call: ``(status, headers, body)``, the body parsed when it is JSON."""
        url = self.api + path
        if params:
            url += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        data = jsonio.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"token {self.server.token}")
        request.add_header("Accept", accept)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with self._opener.open(request, timeout=timeout or self.timeout) as response:
                raw = response.read()
                status, answered = response.status, dict(response.headers)
        except urllib.error.HTTPError as error:
            raise self._error(error) from None
        except urllib.error.URLError as error:
            raise ServerNotFound(
                f"Cannot reach the Jupyter server at {self._where}: {error.reason}"
            ) from None
        except (OSError, http.client.HTTPException) as error:
            # A server killed between the request and its answer (reset, closed, timed out).
            raise ServerNotFound(
                f"The Jupyter server at {self._where} dropped the connection: {error!r}"
            ) from None
        kind = answered.get("Content-Type", "")
        try:
            if accept != "application/json":
                if not kind.startswith(accept):
                    raise ValueError(kind)
                return status, answered, raw.decode("utf-8")
            body = json.loads(raw) if raw else None
            if raw and not isinstance(body, dict):
                raise ValueError(type(body).__name__)
        except (ValueError, RecursionError):
            raise self._not_the_api(f"{status}, {kind or 'no content type'}") from None
        return status, answered, body

    @property
    def _where(self) -> str:
        return redact_url(self.server.url)

    def _not_the_api(self, answer: str) -> NotAgentRunsServer:
        return NotAgentRunsServer(
            f"{self._where} does not answer as a Jupyter server with jupyter_agentruns "
            f"({answer}): give the server's base URL, as `jupyter server list` shows it, "
            "and check that `jupyter server extension list` shows jupyter_agentruns enabled"
        )

    def _error(self, error: urllib.error.HTTPError) -> AgentRunsError | NotAgentRunsServer:
        """The error an HTTP error answer means.

        Every error of the API is JSON ``{"error", "message"}``; another
        answer came from something else. A proxy's 5xx or 429, or a
        refused login, still says when to try again or to sign in; any
        other (a redirect to a login page, a page that is not there) means
        the URL is not the server's.
        """
        try:
            raw = error.read()
            body = json.loads(raw)
            if not isinstance(body, dict) or not isinstance(body.get("error"), str):
                raise ValueError("not an error of the API")
        except (ValueError, RecursionError, OSError, http.client.HTTPException):
            if error.code >= 500 or error.code in (401, 403, 429):
                retry_after = _retry_after(error.headers)
                if error.code in (401, 403):
                    todo = "check the token, or sign in again"
                else:
                    todo = "try again" + (f" in {retry_after:g} s" if retry_after else " shortly")
                return AgentRunsError(
                    error.code,
                    "http_error",
                    f"{self._where} answered {error.code} {error.reason}: {todo}",
                    None,
                    retry_after,
                )
            return self._not_the_api(f"{error.code} {error.reason}")
        message = body.get("message")
        return AgentRunsError(
            error.code,
            body["error"],
            message if isinstance(message, str) else "",
            body,
            _retry_after(error.headers),
        )

    def submit(
        self, body: dict[str, Any], key: str, *, key_with_run: bool = False
    ) -> tuple[dict[str, Any], bool]:
        """Submit a run; returns ``(run, replayed)``.

        ``key_with_run``: the server remembers the key as long as the run exists.
        """
        headers = {"Idempotency-Key": key}
        if key_with_run:
            headers["Idempotency-Key-Lifetime"] = "run"
        status, _, run = self.request("POST", "runs", body, headers=headers)
        return run, status == 200

    def usage(self) -> dict[str, Any]:
        """The caller's token totals of the last 24 hours."""
        return self.request("GET", "usage")[2]

    def events_page(self, run_id: str, after: int, limit: int = 1000) -> dict[str, Any]:
        """One JSON page of the run's kept events after ``after`` (no waiting)."""
        return self.request(
            "GET", f"runs/{_segment(run_id)}/events", params={"after": after, "limit": limit}
        )[2]

    def stream_events(
        self,
        run_id: str,
        after: int,
        read_timeout: float = 60,
        *,
        on_open: Callable[[], None] | None = None,
        on_retry: Callable[[float], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The run's events after ``after`` over SSE, as they come: ``{"event", "id", "data"}``.

        ``data`` is parsed JSON: an event envelope, or the run object of a
        ``snapshot`` frame (the events up to its ``id`` were compacted). Ends
        when the server ends the stream (after the terminal event, or an
        answer 204: nothing follows the cursor of a finished run). A dropped
        connection, or ``read_timeout`` seconds without a byte (the server
        sends a ping at least every ``heartbeat_interval``), raises
        ``ServerNotFound``: resume from the last ``id`` received.

        ``on_open()`` when the server answered (the server is back, even if
        only pings follow); ``on_retry(seconds)`` with the stream's ``retry:``,
        the least a client should wait before it reconnects.
        """
        url = f"{self.api}runs/{_segment(run_id)}/events"
        request = urllib.request.Request(url)
        request.add_header("Authorization", f"token {self.server.token}")
        request.add_header("Accept", "text/event-stream")
        request.add_header("Last-Event-ID", str(after))
        try:
            response = self._opener.open(request, timeout=read_timeout)
        except urllib.error.HTTPError as error:
            raise self._error(error) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            reason = getattr(error, "reason", error)
            raise ServerNotFound(
                f"Cannot reach the Jupyter server at {self._where}: {reason}"
            ) from None
        with response:
            if response.status == 204:
                if on_open is not None:
                    on_open()
                return
            kind = response.headers.get("Content-Type", "")
            if not kind.startswith("text/event-stream"):
                raise self._not_the_api(f"{response.status}, {kind or 'no content type'}")
            if on_open is not None:
                on_open()
            try:
                yield from _sse_frames(response, on_retry)
            except (OSError, http.client.HTTPException, ValueError) as error:
                raise ServerNotFound(
                    f"The stream from the Jupyter server at {self._where} broke: {error!r}"
                ) from None

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"runs/{_segment(run_id)}")[2]

    def record(self, run_id: str) -> str:
        """The run's static record, as Markdown (bounded, however big the run)."""
        return self.request("GET", f"runs/{_segment(run_id)}", accept="text/markdown")[2]

    def newest_retry(self, run: dict[str, Any]) -> dict[str, Any]:
        """The newest run of ``run``'s chain of Run again (``run`` itself when it was never run again)."""
        seen = {run["run_id"]}
        while True:
            retries = self.request("GET", "runs", params={"retry_of": run["run_id"], "limit": 1})[
                2
            ]["runs"]
            if not retries or retries[0]["run_id"] in seen:
                return run
            run = retries[0]
            seen.add(run["run_id"])

    def list_runs(self, **params: Any) -> dict[str, Any]:
        return self.request("GET", "runs", params=params)[2]

    def conversations(
        self,
        *,
        agent: str | None = None,
        notebook: str | None = None,
        limit: int | None = None,
        before: str | None = None,
    ) -> dict[str, Any]:
        """One page of the caller's conversations, the newest first: ``{"conversations", "next"}``.

        Each ``{"session", "agent", "title", "runs", "last_run_id", "updated_at"}``;
        ``notebook``: the conversations of that notebook (its path under the
        server's root); ``before``: the ``next`` of the page before.
        """
        params = {"agent": agent, "notebook": notebook, "limit": limit, "before": before}
        return self.request("GET", "conversations", params=params)[2]

    def cancel(self, run_id: str, reason: str | None = None) -> dict[str, Any]:
        return self.request("POST", f"runs/{_segment(run_id)}/cancel", {"reason": reason})[2]

    def answer(
        self, run_id: str, request_id: str, choice: str, note: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"choice": choice}
        if note is not None:
            body["note"] = note
        path = f"runs/{_segment(run_id)}/inputs/{_segment(request_id)}"
        return self.request("POST", path, body)[2]

    def wait(self, run_id: str, after: int, timeout: float | None) -> dict[str, Any]:
        """Long-poll the run's events until it is terminal; returns the run."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = (
                25.0 if deadline is None else max(0.0, min(25.0, deadline - time.monotonic()))
            )
            body = self.request(
                "GET",
                f"runs/{_segment(run_id)}/events",
                params={"after": after, "limit": 1000, "wait": round(remaining, 3)},
                timeout=remaining + 30,
            )[2]
            if body["events"]:
                after = body["events"][-1]["seq"]
            if body["done"] or body["status"] in TERMINAL_STATUSES and after >= body["last_seq"]:
                return self.get_run(run_id)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} is still {body['status']} after {timeout} s")


def _segment(value: str) -> str:
    """``value`` as one segment of an API path: ``RUN/cancel?`` stays one (odd) run id."""
    quoted = urllib.parse.quote(value, safe="")
    # "." and ".." would be resolved away by a proxy's URL normalisation: spelled as escapes, they stay ids.
    return {".": "%2E", "..": "%2E%2E"}.get(quoted, quoted)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an HTTP error here: the API never redirects.

    A redirect leads to another page (a login, a hub's spawn page), and
    following it would send the token there too.
    """

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _retry_after(headers: Any) -> float | None:
    """The seconds of a ``Retry-After`` header (a number; an HTTP date is not used here)."""
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


# What a stream is read by: a block, not a line (see _lines).
STREAM_BLOCK = 64 * 1024


def _lines(response: Any) -> Iterator[bytes]:
    """The lines of a streamed body as they come (without their ``\\n``).

    Read a block at a time with ``read1`` (what has arrived, at most
    ``STREAM_BLOCK``): ``http.client`` reads a chunked body line by line in
    Python, which parsed about 10,000 events a second, a few times slower
    than the server sends them. A body without ``read1`` is iterated as is.
    """
    read = getattr(response, "read1", None)
    if read is None:
        yield from response
        return
    pending: list[bytes] = []  # the line being read, across blocks
    while True:
        block = read(STREAM_BLOCK)
        if not block:
            break
        start = 0
        while (end := block.find(b"\n", start)) >= 0:
            if pending:
                pending.append(block[start:end])
                yield b"".join(pending)
                pending.clear()
            else:
                yield block[start:end]
            start = end + 1
        if start < len(block):
            pending.append(block[start:])
    if pending:
        yield b"".join(pending)


def _sse_frames(
    response: Any, on_retry: Callable[[float], None] | None = None
) -> Iterator[dict[str, Any]]:
    """Frames of a ``text/event-stream`` body: ``{"event", "id", "data"}`` (comments skipped).

    A ``retry:`` field (milliseconds) goes to ``on_retry``, in seconds.
    """
    frame: dict[str, Any] = {}
    for raw in _lines(response):
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if "data" in frame:
                yield frame
            frame = {}
        elif line.startswith(":"):
            continue  # a ping
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                frame["data"] = json.loads(value)
            elif name == "id":
                frame["id"] = int(value)
            elif name == "event":
                frame["event"] = value
            elif name == "retry" and value.isdigit() and on_retry is not None:
                on_retry(int(value) / 1000)
    if "data" in frame:
        raise ValueError("the stream ended in the middle of a frame")


def cell_context() -> tuple[str | None, str | None]:
    """``(notebook path, cell id)`` of the executing cell, when there is one."""
    notebook = os.environ.get("JPY_SESSION_NAME")
    cell_id = _parent_request().get("metadata", {}).get("cellId")
    return notebook, cell_id


def _parent_request() -> dict[str, Any]:
    """The kernel message being executed (the cell's execute request), or ``{}``."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        parent = (
            shell.kernel.get_parent() if shell is not None and hasattr(shell, "kernel") else None
        )
        return parent if isinstance(parent, dict) else {}
    except Exception:
        return {}


# Longer code is recorded by its hash only: the run's metadata is not a copy of the notebook.
MAX_CELL_SOURCE_CHARS = 20_000


def cell_source() -> str | None:
    """The executing cell's code, exactly as the front end sent it, when there is one.

    The execute request's ``code``: what the notebook's cell held when it was
    run (``In[-1]`` is the code after IPython's transformations).
    """
    parent = _parent_request()
    if parent.get("header", {}).get("msg_type") != "execute_request":
        return None
    code = parent.get("content", {}).get("code")
    return code if isinstance(code, str) else None


def source_digest(source: str) -> str | None:
    """The SHA-256 (hex) of a cell's code in UTF-8, as the front end computes it."""
    try:
        return hashlib.sha256(source.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:  # a lone surrogate: the browser's encoder would differ
        return None


def kernel_id() -> str | None:
    """The id of the kernel this code runs in (its connection file's name), when it is one."""
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:  # not in a kernel, or not in ipykernel
        return None
    found = re.fullmatch(r"kernel-(.+)\.json", name)
    return found.group(1) if found else None


def default_key(notebook: str | None, cell_id: str | None, body: dict[str, Any]) -> str:
    """The Idempotency-Key of a submit from a notebook cell: re-running the cell finds its run.

    It is made from everything the server fingerprints, so a cell whose input,
    metadata or session changed starts a new run instead of being refused.
    Outside a notebook cell there is nothing stable to derive it from: a random key.
    """
    if not notebook or not cell_id:
        return "py-" + uuid.uuid4().hex
    # What the server leaves out of the fingerprint (the cell's code, the
    # kernel) stays out of the key too.
    kept = {**body, "metadata": fingerprinted_metadata(body.get("metadata"))}
    kept = {name: value for name, value in kept.items() if value is not None}
    canonical = json.dumps(
        {"notebook": notebook, "cell": cell_id, **kept}, sort_keys=True, separators=(",", ":")
    )
    return "nb-" + hashlib.sha256(canonical.encode()).hexdigest()
