"""Notebook tools: agents working on the live data of the notebook that submitted their run.

``kernels`` reaches a kernel (code run with a client of its own) and a saved
notebook; ``edits`` changes a notebook's cells, each change a durable
notebook edit; ``tools`` defines the tools and records each call in its run;
``mcp`` serves them as an MCP server; ``writes`` makes a notebook an agent
writes whole (ACP's ``fs/write_text_file``) cell edits. ``NotebookAccess`` is
what the server wires: whether the tools exist here at all, the per-run
tokens, and the ``run.notebook_tools`` an agent receives.

The tools act on a kernel only where every kernel of the server is the run
owner's: a single-user server (the ``shared`` owner mode) or a JupyterHub
single-user server (for its user's runs). Elsewhere (a server shared by
several people) they are absent, and ``GET agents`` says why.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from .edits import CELL_TOOLS, EDIT_TOOLS, EditConflict, NotebookEdits, source_of
from .kernels import Kernels, KernelUnavailable, NotebookNotFound
from .tools import TOOLS, NotebookTools, Outcome, definitions
from .writes import Written, notebook_text, write

__all__ = [
    "EDIT_TOOLS", "EditConflict", "Kernels", "KernelUnavailable", "NotebookAccess",
    "NotebookEdits", "NotebookNotFound", "NotebookTools", "Outcome", "RunNotebookTools",
    "RunNotebookWrites", "TOOLS",
    "Written", "availability", "definitions",
]  # fmt: skip


def availability(owner_mode: str, hub_user: str | None) -> tuple[bool, str | None]:
    """Whether the server's kernels are all one owner's, and why not."""
    if owner_mode == "shared":
        return True, None
    if hub_user:
        return True, None
    return False, (
        "the notebook tools are off: this server runs in the per-user owner mode and is not a "
        "JupyterHub single-user server, so its kernels may be other people's"
    )


class NotebookAccess:
    """The notebook tools of one server: who may use them, and each run's token."""

    def __init__(
        self,
        tools: NotebookTools,
        *,
        owner_mode: str,
        hub_user: str | None = None,
        mcp_url: Callable[[], str] | None = None,
        mcp_problem: str | None = None,
    ):
        self.tools = tools
        self.available, self.reason = availability(owner_mode, hub_user)
        self._hub_user = hub_user if owner_mode != "shared" else None
        # Where an agent of its own process reaches the MCP endpoint (asked when needed:
        # the server's port is known once it listens).
        self.mcp_url = mcp_url
        # Why the MCP endpoint cannot serve (its SDK is not installed), or None.
        self.mcp_problem = mcp_problem
        self._tokens: dict[str, str] = {}  # token -> run_id
        self._by_run: dict[str, str] = {}  # run_id -> token

    def describe(self) -> dict[str, Any]:
        """What ``GET agents`` says of them."""
        described: dict[str, Any] = {"available": self.available}
        if self.available:
            described["tools"] = sorted(TOOLS)
            described["approval"] = self.tools.approval
            described["edits"] = self.tools.edits.mode
            described["mcp"] = self.mcp_problem is None
            if self.mcp_problem is not None:
                described["reason"] = self.mcp_problem
        else:
            described["reason"] = self.reason
        return described

    def serves(self, owner: str) -> bool:
        """Whether the tools may act for ``owner`` here (the kernels are theirs)."""
        if not self.available:
            return False
        return self._hub_user is None or owner == self._hub_user

    def for_run(self, run: Any) -> RunNotebookTools | None:
        """What an agent's ``run.notebook_tools`` is: None when the run has no kernel of its owner's."""
        kernel_id = (run.metadata or {}).get("kernel_id")
        if not isinstance(kernel_id, str) or not self.serves(run.owner):
            return None
        return RunNotebookTools(self, run, kernel_id)

    def writes_for(self, run: Any) -> RunNotebookWrites | None:
        """What an agent's ``run.notebook_writes`` is: a notebook it writes whole made cell edits,
        with a kernel or without (a run from the runs panel, from REST); None where the tools
        do not serve the run's owner."""
        if not self.serves(run.owner):
            return None
        return RunNotebookWrites(self, run)

    # Per-run tokens ---------------------------------------------------------

    def token_for(self, run_id: str) -> str:
        """The run's token for the MCP endpoint (made once; good while the run lives here)."""
        token = self._by_run.get(run_id)
        if token is None:
            token = "agr_" + secrets.token_urlsafe(32)
            self._by_run[run_id] = token
            self._tokens[token] = run_id
        return token

    def run_of(self, token: str) -> str | None:
        """The run a token was made for (None: not a run's token, or its run ended)."""
        return self._tokens.get(token)

    def forget(self, run_id: str) -> list[dict[str, Any]]:
        """The run ended here: its token is good for nothing more.

        Returns its edits still ``pending`` whose end it could not record
        (``NotebookEdits.forget``), for the server to settle in its record.
        """
        token = self._by_run.pop(run_id, None)
        if token is not None:
            self._tokens.pop(token, None)
        return self.tools.edits.forget(run_id)


class RunNotebookWrites:
    """``run.notebook_writes``: a notebook an agent reads and writes whole (ACP's
    ``fs/read_text_file`` and ``fs/write_text_file``) as the person has it, its
    changes made the run's cell edits; and, after a take-over, the edits an
    earlier attempt left ``pending`` settled by the notebook. No kernel needed.
    """

    kernel_id: str | None = None

    def __init__(self, access: NotebookAccess, run: Any):
        self._access = access
        self._run = run

    async def resume(self, step: dict[str, Any]) -> Outcome:
        """What the caller reads of a call an earlier attempt of the run started (its ``step``).

        An edit that was ``pending`` when the server died is settled by the
        notebook's file: applied once, never twice, never lost.
        """
        return await self._access.tools.resume(self._run, step, self.kernel_id)

    async def settle(self) -> list[Outcome]:
        """After a take-over: every cell-changing step an earlier attempt left running, settled (``resume``)."""
        steps = (self._run.snapshot or {}).get("tools") or []
        return [await self.resume(step) for step in steps if self.settles(step)]

    def settles(self, step: dict[str, Any]) -> bool:
        """Whether ``settle`` settles ``step`` (of the run's snapshot): a cell tool's step left running."""
        return step.get("status") == "running" and step.get("name") in CELL_TOOLS

    async def read_notebook_text(self, path: str) -> str | None:
        """The notebook ``path`` as its file's text, from the first place holding it, recorded as
        read by the run's agent (its edits expect those cells); None when no place holds it."""
        edits = self._access.tools.edits
        try:
            _, notebook = await edits.places.open(path)
        except NotebookNotFound:
            return None
        cells = notebook.get("cells") or []
        edits.saw(self._run.run_id, {c["id"]: source_of(c) for c in cells if c.get("id")})
        return notebook_text(notebook)

    async def write_notebook(self, path: str, text: str) -> Written | None:
        """The notebook ``path`` written whole as ``text``, made as the run's cell edits
        (:mod:`.writes`); None when no place holds it (the caller writes a file)."""
        return await write(self._access.tools.edits, self._run, path, text)


class RunNotebookTools(RunNotebookWrites):
    """``run.notebook_tools``: the notebook tools on the kernel that submitted the run.

    ``definitions``: ``[{name, description, parameters}]``; ``call(name, args)``
    makes one call as a tool step of the run; ``mcp_server()``: where an agent
    of its own process reaches the same tools (``{"url", "headers"}``).
    """

    def __init__(self, access: NotebookAccess, run: Any, kernel_id: str):
        super().__init__(access, run)
        self.kernel_id: str | None = kernel_id
        self.definitions = definitions(with_notebook=False)

    def asks(self, name: str) -> bool:
        """Whether a call of ``name`` asks a person first (an approval question)."""
        return self._access.tools.asks(name)

    async def call(
        self, name: str, args: dict[str, Any], asked: dict[str, Any] | None = None
    ) -> Outcome:
        return await self._access.tools.call(
            name, args, kernel_id=self.kernel_id, run=self._run, asked=asked
        )

    def mcp_server(self) -> dict[str, Any] | None:
        """``{"url", "headers"}`` of the server's MCP endpoint with this run's token, if it serves."""
        if self._access.mcp_url is None or self._access.mcp_problem is not None:
            return None
        token = self._access.token_for(self._run.run_id)
        return {"url": self._access.mcp_url(), "headers": {"Authorization": f"Bearer {token}"}}
