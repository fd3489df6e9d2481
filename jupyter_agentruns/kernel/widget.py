"""The notebook API: ``submit`` returns a ``Run``, a widget that follows a server-owned run.

The widget's state is only ``run_id`` and ``last_seq`` (plus the last status
seen): the run itself lives on the server. Its view talks to the server
directly from the page, so a kernel restart does not even interrupt it, and
re-running the cell finds the same run through its Idempotency-Key.

What a cell displays carries three things: the widget view, a reference to
the run (``application/vnd.jupyter.agentruns.run+json``, which the
JupyterLab extension renders live with no kernel at all) and the run's
static record as Markdown (what nbconvert, nbviewer and GitHub show). The
record is brought up to date when the kernel learns the run ended, and when
a view says another follow-up sent under it ended (the record holds the thread).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from .. import jsonio
from ..lifecycle import TERMINAL_STATUSES
from ..questions import choice_for
from ..record import run_markdown
from .client import (
    MAX_CELL_SOURCE_CHARS,
    AgentRunsError,
    Client,
    ServerNotFound,
    cell_context,
    cell_source,
    default_key,
    find_server,
    kernel_id,
    source_digest,
)
from .runtable import RunList

MIME_TYPE = "application/vnd.jupyter.agentruns.run+json"

_PACKAGE = Path(__file__).parent.parent


def _asset(name: str) -> Path:
    # Built from js/ by the wheel or editable install (``npm run build`` in js/ by hand).
    path = _PACKAGE / "static" / name
    if not path.exists():
        raise ImportError(
            f"jupyter_agentruns is missing its front end ({path}): "
            "reinstall it, or run `npm ci && npm run build` in js/"
        )
    return path


_clients: dict[tuple[str | None, str | None], Client] = {}


def _client(url: str | None = None, token: str | None = None) -> Client:
    key = (url, token)
    if key not in _clients:
        _clients[key] = Client(find_server(url, token))
    return _clients[key]


class Run(anywidget.AnyWidget):
    """A server-owned agent run, shown as a live widget."""

    _esm = _asset("widget.js")
    _css = _asset("widget.css")

    run_id = traitlets.Unicode("", help="The run's id.").tag(sync=True)
    last_seq = traitlets.Int(0, help="The run's last seq, as last seen.").tag(sync=True)
    status = traitlets.Unicode("", help="The run's status, as last seen.").tag(sync=True)
    base_url = traitlets.Unicode("/").tag(sync=True)
    reattached = traitlets.Bool(
        False, help="This cell found an existing run instead of starting one."
    ).tag(sync=True)
    followed = traitlets.Unicode(
        "", help="The run this cell's key found, when the widget shows a newer Run again of it."
    ).tag(sync=True)
    record = traitlets.Unicode(
        "",
        help="The run's static record (Markdown): what a view shows where it cannot reach the server.",
    ).tag(sync=True)
    thread = traitlets.List(
        traitlets.Unicode(),
        help="The follow-ups sent under the run that have ended, as its view last saw them.",
    ).tag(sync=True)

    def __init__(self, run: dict[str, Any], client: Client, **kwargs: Any):
        self._client = client
        self._run = run
        self._shown_in: int | None = None
        self._display_id = uuid.uuid4().hex
        self._displayed = False
        super().__init__(
            run_id=run["run_id"],
            last_seq=run["last_seq"],
            status=run["status"],
            base_url=client.server.base_url,
            record=run_markdown(run),
            **kwargs,
        )

    def __repr__(self) -> str:
        return f"<Run {self.run_id} {self.status}>"

    @traitlets.observe("status")
    def _status_changed(self, change: dict[str, Any]) -> None:
        if change["new"] in TERMINAL_STATUSES and change["old"] not in TERMINAL_STATUSES:
            self._update_record()

    @traitlets.observe("thread")
    def _thread_changed(self, change: dict[str, Any]) -> None:
        # Another follow-up ended: the server's record of the run holds it now.
        if self.status in TERMINAL_STATUSES:
            self._update_record()

    @traitlets.observe("run_id")
    def _run_changed(self, change: dict[str, Any]) -> None:
        # The view's Run again: the cell now stands for the new run.
        if change["old"] and self._run.get("run_id") != change["new"]:
            self._run = self._client.get_run(change["new"])
            self._update_record()

    def _update_record(self) -> None:
        """Bring the record up to date, in the widget's state and in the display (the saved notebook keeps both)."""
        try:
            self.record = self._client.record(self.run_id)
        except (AgentRunsError, ServerNotFound, OSError):
            return  # the live view still shows the run; the record waits for the next change
        if self._displayed:
            from IPython.display import update_display

            update_display(self._bundle()[0], raw=True, display_id=self._display_id)

    def _bundle(self) -> tuple[dict[str, Any], dict[str, Any]]:
        # None once the widget is closed (ipywidgets sets it so): the record alone then.
        shown = self._repr_mimebundle_() if self._repr_mimebundle_ is not None else None
        data, metadata = shown or ({}, {})
        data = {
            **data,
            MIME_TYPE: {
                "run_id": self.run_id,
                "status": self.status,
                "last_seq": self.last_seq,
                "agent": self._run["agent"],
            },
            "text/markdown": self.record,
            "text/plain": f"Run(run_id={self.run_id!r}, status={self.status!r})",
        }
        return data, metadata

    def refresh(self) -> dict[str, Any]:
        """Reread the run from the server (the authoritative state) and return it."""
        self._update(self._client.get_run(self.run_id))
        return self._run

    def _update(self, run: dict[str, Any]) -> None:
        self._run = run
        if run["last_seq"] > self.last_seq:
            self.last_seq = run["last_seq"]
        self.status = run["status"]  # last: a terminal status updates the displayed record

    @property
    def run(self) -> dict[str, Any]:
        """The run object as last read (see ``refresh``)."""
        return self._run

    @property
    def text(self) -> str:
        """The text of the run's messages so far."""
        return "".join(message["text"] for message in self.refresh()["snapshot"]["messages"])

    @property
    def output(self) -> Any:
        """The output of a succeeded run, else None."""
        return self.refresh()["output"]

    @property
    def error(self) -> dict[str, str] | None:
        """``{type, message}`` of a failed run, else None."""
        return self.refresh()["error"]

    @property
    def done(self) -> bool:
        """Whether the run is terminal (succeeded, failed, cancelled or interrupted)."""
        return self.refresh()["status"] in TERMINAL_STATUSES

    def wait(self, timeout: float | None = None) -> Run:
        """Block until the run is terminal (``TimeoutError`` after ``timeout`` seconds)."""
        self._update(self._client.wait(self.run_id, self.last_seq, timeout))
        return self

    def cancel(self, reason: str | None = None) -> Run:
        """Ask the server to cancel the run (idempotent)."""
        self._update(self._client.cancel(self.run_id, reason))
        return self

    @property
    def questions(self) -> list[dict[str, Any]]:
        """The questions the agent asked that wait for an answer (see ``answer``)."""
        inputs = self.refresh()["snapshot"].get("inputs", [])
        return [request for request in inputs if request["status"] == "open"]

    def answer(self, choice: str, *, request_id: str | None = None, note: str | None = None) -> Run:
        """Answer the run's open question with one of its choices (the only one, or ``request_id``).

        A permission question (``kind == "permission"``, an ACP agent's) offers the agent's
        option ids as its choices; ``choice`` may also be an option's name as the view shows
        it (``"Allow once"``, ignoring case), and that option's id is sent.
        """
        if request_id is None:
            open_ones = self.questions
            if len(open_ones) != 1:
                raise ValueError(
                    f"the run has {len(open_ones)} open questions: name one with request_id="
                )
            request = open_ones[0]
            request_id = request["request_id"]
        else:
            inputs = self.refresh()["snapshot"].get("inputs", [])
            request = next((item for item in inputs if item["request_id"] == request_id), {})
        self._update(
            self._client.answer(self.run_id, request_id, choice_for(request, choice), note)
        )
        return self

    def _ipython_display_(self) -> None:
        # submit() displays the run itself; when it is also the cell's last
        # expression, showing it a second time would duplicate the view.
        from IPython import get_ipython
        from IPython.display import display

        shell = get_ipython()
        count = getattr(shell, "execution_count", None)
        if count is not None and count == self._shown_in:
            return
        self._shown_in = count
        data, metadata = self._bundle()
        display(data, metadata=metadata, raw=True, display_id=self._display_id)
        self._displayed = True


def submit(
    agent: str,
    input: dict[str, Any],
    *,
    key: str | None = None,
    new: bool = False,
    session: str | None = None,
    metadata: dict[str, Any] | None = None,
    retry_of: str | None = None,
    session_policy: str | None = None,
    url: str | None = None,
    token: str | None = None,
    display: bool = True,
) -> Run:
    """Start an agent run on the Jupyter server (or find the one this cell started) and show it.

    Re-running the same cell re-attaches to its run, even after a kernel
    restart and for as long as the run exists; when the run was run again
    from its view, the newest run of that chain. ``new=True`` starts a new
    run, ``key=`` sets the Idempotency-Key. A NaN or an infinity anywhere in
    ``input`` or ``metadata`` (a pandas mean of an empty column) is a
    ``ValueError`` naming where it is: JSON has neither.

    The run's ``metadata`` records the cell (``cell_id``) and the kernel
    (``kernel_id``): an agent given the notebook tools works on this kernel's data.

    ``session_policy`` says what happens when ``session`` (by default the
    notebook's path) has an active run: ``"parallel"`` (the server's default
    unless configured otherwise: cells run side by side), ``"reject"`` (an
    ``AgentRunsError`` ``session_busy``), ``"enqueue"`` (the run waits for the
    earlier ones) or ``"interrupt"`` (they are cancelled, then it starts).
    """
    jsonio.check({"input": input, "metadata": metadata})
    client = _client(url, token)
    notebook, cell_id = cell_context()
    metadata = dict(metadata or {})
    kernel = kernel_id()
    if kernel:
        # The kernel the run's notebook tools act on (see the server's notebook tools).
        metadata.setdefault("kernel_id", kernel)
    if cell_id:
        # Which cell started the run, and with what code: a page refreshed
        # before saving finds it there again, under that code only.
        metadata.setdefault("cell_id", cell_id)
        source = cell_source()
        digest = source_digest(source) if source is not None else None
        if source is not None and digest is not None:
            metadata.setdefault("cell_source_sha256", digest)
            if len(source) <= MAX_CELL_SOURCE_CHARS:
                metadata.setdefault("cell_source", source)
    if notebook and session is not None and session != notebook:
        # The session no longer says which notebook this is: an agent working in
        # the notebook's directory (an ACP agent) finds it here.
        metadata.setdefault("notebook", notebook)
    body = {
        "agent": agent,
        "input": input,
        "session": session if session is not None else notebook,
        "metadata": metadata or None,
        "retry_of": retry_of,
    }
    body = {name: value for name, value in body.items() if value is not None}
    if key is None:
        key = default_key(None if new else notebook, None if new else cell_id, body)
    if session_policy is not None:
        # Not part of what the run is: the same cell with another policy finds the same run.
        body["session_policy"] = session_policy
    run, replayed = client.submit(body, key, key_with_run=True)
    followed = ""
    if replayed:
        newest = client.newest_retry(run)
        if newest["run_id"] != run["run_id"]:
            followed, run = run["run_id"], newest
    widget = Run(run, client, reattached=replayed, followed=followed)
    if display:
        _display(widget)
    return widget


def _display(widget: Run) -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    if get_ipython() is not None:
        from IPython.display import display

        display(widget)


def attach(run_id: str, *, url: str | None = None, token: str | None = None) -> Run:
    """A widget following an existing run (from ``runs()`` or a run id)."""
    client = _client(url, token)
    return Run(client.get_run(run_id), client, reattached=True)


def runs(
    *,
    status: str | None = None,
    session: str | None = None,
    limit: int = 50,
    before: str | None = None,
    url: str | None = None,
    token: str | None = None,
) -> RunList:
    """Your runs on the server, newest first: a list of run objects, shown as a table.

    ``before`` pages on: ``runs(before=listed.next)`` after ``listed = runs()``.
    """
    answer = _client(url, token).list_runs(
        status=status, session=session, limit=limit, before=before
    )
    return RunList(answer["runs"], answer.get("next"))
