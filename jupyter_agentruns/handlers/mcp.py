"""``{base_url}api/agentruns/mcp``: the notebook tools' MCP server (Streamable HTTP).

Two kinds of callers: a person with their own Jupyter token or login (the
run tools of ``mcp_runs``, and the notebook tools where the server's kernels
are theirs, each then taking a ``notebook`` path), and a run's agent with the
run's own token (``Authorization: Bearer agr_…``), good for that run's
notebook tools while the run lives on this server, and for nothing else. The request is handed to the
MCP SDK's transport (an ASGI application) as it came, and its answer written
back as it goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlencode

from jupyter_server.auth.decorator import authorized
from jupyter_server.utils import url_path_join
from tornado import web

from .. import words
from ..errors import ErrorCode, Problem
from .base import AgentRunsHandler
from .mcp_runs import PersonRuns

try:  # jupyter_server 2.13+: a handler that authenticates its callers itself
    from jupyter_server.auth.decorator import allow_unauthenticated
except ImportError:  # older ones let the handler's methods decide
    FuncT = TypeVar("FuncT", bound=Callable[..., Any])

    def allow_unauthenticated(method: FuncT) -> FuncT:
        return method


BEARER = "bearer "


class MCPHandler(AgentRunsHandler):
    """Authenticates the caller, then lets the MCP SDK's transport answer."""

    _run_caller: Any = None
    _answering: asyncio.Future | None = None  # the transport's answer, while it is made
    _gone = False  # the caller went away before its answer

    # Narrower than JupyterHandler.prepare, as AgentRunsHandler.prepare is (see there).
    async def prepare(self) -> None:  # type: ignore[override]
        header = self.request.headers.get("Authorization", "")
        if header[: len(BEARER)].lower() == BEARER and header[len(BEARER) :].startswith("agr_"):
            engine = self.settings["agentruns_engine"]
            found = engine.run_for_token(header[len(BEARER) :].strip()) if engine else None
            if found is None:
                raise Problem(
                    ErrorCode.FORBIDDEN,
                    "This run's token is not good (any more): a run's token works only while "
                    "its run is live.",
                )
            self._run_caller = found
        await super().prepare()

    def on_finish(self) -> None:
        super().on_finish()
        self.waiter.release()  # the transport's wait for a disconnect ends with the answer

    def on_connection_close(self) -> None:
        super().on_connection_close()
        if self._answering is not None:
            # Nobody will read the answer: the call stops (its kernel is interrupted).
            self._gone = True
            self._answering.cancel()

    def check_xsrf_cookie(self) -> None:
        if self._run_caller is not None:
            return None  # a run's token in a header: no browser sends that by itself
        return super().check_xsrf_cookie()

    @allow_unauthenticated
    async def get(self) -> None:
        await self._serve()

    @allow_unauthenticated
    async def post(self) -> None:
        await self._serve()

    @allow_unauthenticated
    async def delete(self) -> None:
        await self._serve()

    async def _serve(self) -> None:
        from ..notebook_tools.mcp import SCOPE_CALLER, Caller

        self.check_body_size()
        notebook_mcp = self.settings.get("agentruns_mcp")
        access = self.engine.notebook
        if self._run_caller is not None:
            stopping, run = self._run_caller
            # No run tools with a run's token: it is handed to an agent (and to whatever
            # its model is told), and is good for the notebook tools of one run; an agent
            # that could start, answer or cancel its owner's runs could also approve its
            # own questions and start runs that outlive it, without the person.
            caller = Caller(run=run, stopping=stopping)
        else:
            # An APIHandler's web.authenticated raises 403 rather than redirect (the
            # None its stubs allow): it always gives _person's coroutine.
            await cast(Awaitable[None], self._person())
            # The run tools are anyone's who may use runs; the notebook tools only where
            # the server's kernels are the caller's.
            notebook_problem = None
            if access is None or not access.serves(self.owner):
                notebook_problem = (
                    access.reason
                    if access is not None and access.reason
                    else "the notebook tools are not available for you on this server"
                )
            caller = Caller(runs=self._runs(), notebook_problem=notebook_problem)
        if notebook_mcp is None:
            raise Problem(
                ErrorCode.NOTEBOOK_TOOLS_UNAVAILABLE,
                self.settings.get("agentruns_mcp_problem") or "The MCP server is not available.",
            )
        self._answering = asyncio.ensure_future(
            notebook_mcp.handle(self._scope(caller, SCOPE_CALLER), self._receive, self._send)
        )
        try:
            await self._answering
        except asyncio.CancelledError:
            if not self._gone:
                raise
            return  # nobody to answer
        finally:
            self._answering = None
        if not self._finished:
            self.finish()

    def _runs(self) -> PersonRuns:
        """The run tools for the person who calls."""
        # Who answers a question, as InputHandler records it.
        user = self.current_user
        by = words.person(getattr(user, "name", None) or user.username)
        origin = f"{self.request.protocol}://{self.request.host}"
        lab = url_path_join(origin + self.base_url, "lab")
        return PersonRuns(
            self.engine,
            self.owner,
            by,
            run_url=lambda run_id: origin + self.api_url("runs", quote(run_id, safe="")),
            # JupyterLab opens the run's page for this parameter (js/src/links.js).
            page_url=lambda run_id: f"{lab}?{urlencode({'agentruns-run': run_id})}",
        )

    @web.authenticated
    @authorized
    async def _person(self) -> None:
        """A person's own token or login (403 otherwise), authorized for agentruns."""

    def _scope(self, caller: Any, key: str) -> dict[str, Any]:
        request = self.request
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": request.version.split("/")[-1],
            "method": request.method,
            "scheme": request.protocol,
            "path": request.path,
            "raw_path": request.path.encode(),
            "root_path": "",
            "query_string": request.query.encode(),
            "headers": [
                (name.lower().encode("latin-1"), value.encode("latin-1"))
                for name, value in request.headers.get_all()
            ],
            "client": (request.remote_ip, 0),
            "server": None,
            "state": {},
            key: caller,
        }

    async def _receive(self) -> dict[str, Any]:
        if not getattr(self, "_body_given", False):
            self._body_given = True
            return {"type": "http.request", "body": bytes(self._body), "more_body": False}
        await self.waiter.wait([], None)  # until the client goes
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.set_status(message["status"])
            self.clear_header("Content-Type")
            for name, value in message.get("headers") or []:
                self.add_header(name.decode("latin-1"), value.decode("latin-1"))
        elif message["type"] == "http.response.body":
            body = message.get("body") or b""
            if body:
                self.write(body)
            if message.get("more_body"):
                await self.flush()
            elif not self._finished:
                self.finish()


default_handlers = [(r"api/agentruns/mcp", MCPHandler)]
