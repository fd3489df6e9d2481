"""``GET pages`` (a WebSocket): an open page's link, so that it makes agents' edits of the notebooks it has open.

A WebSocket, not a stream: a browser opens at most six HTTP/1.1 connections
per host for all its tabs, and every page keeps this link for as long as it
is open; WebSockets do not count against that limit. The messages are
:mod:`..notebook_tools.pages`'s; one that is not valid is answered with an
``error`` message and changes nothing. The link ends with the page: its
notebooks then count no more.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from tornado import web, websocket

from .. import jsonio
from ..errors import ErrorCode, Problem
from ..notebook_tools.pages import BadMessage, Page, PagePlace
from .base import AUTH_RESOURCE
from .errors import generic_code, status_of

try:
    from jupyter_server.auth.decorator import ws_authenticated
except ImportError:  # jupyter_server before 2.13: the same check, a WebSocket's 403 (no login page)

    def ws_authenticated(method: Any) -> Any:  # type: ignore[misc]
        """The caller's user, else 403 before the upgrade."""

        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.current_user is None:
                self.log.warning("Couldn't authenticate WebSocket connection")
                raise web.HTTPError(403)
            return method(self, *args, **kwargs)

        return wrapper


# The close code of a link on a server whose notebook tools are off (or not for this user):
# the page does not come back.
UNAVAILABLE = 4004


class PagesHandler(WebSocketMixin, websocket.WebSocketHandler, JupyterHandler):
    """One page's link: ``open`` its notebooks, answer ``read`` and ``make``."""

    auth_resource = AUTH_RESOURCE

    def initialize(self, *args: Any, **kwargs: Any) -> None:
        self.page: Page | None = None

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        """Upgrade to the link, for a page of a user the server's authorizer lets write."""
        allowed = await ensure_async(
            self.authorizer.is_authorized(self, self.current_user, "write", AUTH_RESOURCE)
        )
        if not allowed:
            raise web.HTTPError(403, "You may not link a page to agent runs on this server.")
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            raise Problem(ErrorCode.BAD_REQUEST, "GET pages is a WebSocket: ask for an upgrade.")
        await super().get(*args, **kwargs)

    @property
    def place(self) -> PagePlace | None:
        """The server's open pages, or None where its notebook tools are off."""
        return self.settings.get("agentruns_pages")

    def open(self, *args: Any, **kwargs: Any) -> None:
        super().open(*args, **kwargs)
        place = self.place
        access = self.settings.get("agentruns_notebook_access")
        # On a JupyterHub user's server, only that user's pages (the kernels and runs are theirs).
        if place is None or access is None or not access.serves(self.current_user.username):
            self.close(UNAVAILABLE, "the notebook tools are not available for you on this server")
            return
        self.page = place.connect(self._send)

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self.write_message(jsonio.dumps(message))
        except websocket.WebSocketClosedError:
            pass  # the page is gone: on_close forgets it

    def on_message(self, message: str | bytes) -> None:
        place, page = self.place, self.page
        if place is None or page is None:
            return
        try:
            if isinstance(message, bytes):
                raise BadMessage("messages are JSON text, not binary")
            try:
                parsed = jsonio.loads_body(message.encode())
            except ValueError as exc:
                raise BadMessage(f"not JSON: {exc}") from None
            place.receive(page, parsed)
        except BadMessage as exc:
            self._send({"type": "error", "error": exc.code, "message": str(exc)})

    def on_close(self) -> None:
        place, page = self.place, self.page
        if place is not None and page is not None:
            place.disconnect(page)
        self.page = None
        super().on_close()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # Refused before the upgrade: the API's JSON error, as every endpoint answers.
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, Problem):
            status_code = status_of(exc)
            body = exc.body()
        else:
            message = self._reason
            if isinstance(exc, web.HTTPError) and exc.log_message:
                message = exc.log_message % exc.args if exc.args else exc.log_message
            body = {"error": generic_code(status_code), "message": message}
        self.set_status(status_code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


default_handlers = [(r"api/agentruns/pages", PagesHandler)]
