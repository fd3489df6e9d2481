"""What every agentruns handler shares: auth resource, owner, JSON errors, bodies."""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from ..engine import Engine
from ..errors import ApiError, invalid_request

AUTH_RESOURCE = "agentruns"
SHARED_OWNER = "~shared"

_GENERIC_CODES = {
    400: "bad_request",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}


class AgentRunsHandler(ExtensionHandlerMixin, APIHandler):
    auth_resource = AUTH_RESOURCE

    def initialize(self, name: str = "jupyter_agentruns", *args: Any, **kwargs: Any) -> None:
        super().initialize(name, *args, **kwargs)

    @property
    def engine(self) -> Engine:
        return self.settings["agentruns_engine"]

    @property
    def owner(self) -> str:
        """Who the caller is, for run ownership (see owner_mode)."""
        if self.settings["agentruns_owner_mode"] == "shared":
            return SHARED_OWNER
        return self.current_user.username

    def api_url(self, *parts: str) -> str:
        return "/".join([self.settings["agentruns_api_url"].rstrip("/"), *parts])

    def write_json(self, body: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(body if isinstance(body, str) else json.dumps(body))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ApiError):
            body = exc.body()
            for name, value in exc.headers.items():
                self.set_header(name, value)
        else:
            message = self._reason
            if isinstance(exc, web.HTTPError) and exc.log_message:
                message = exc.log_message % exc.args if exc.args else exc.log_message
            if status_code >= 500:
                message = "The server failed on this request; its log has the details."
            body = {"error": _GENERIC_CODES.get(status_code, "server_error" if status_code >= 500 else "http_error"),
                    "message": message}
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.allowed_methods()))
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    @classmethod
    def allowed_methods(cls) -> list[str]:
        """The methods this handler implements (for a 405's Allow header)."""
        return [
            method
            for method in cls.SUPPORTED_METHODS
            if getattr(cls, method.lower()) is not getattr(web.RequestHandler, method.lower())
        ]

    def json_body(self, raw: bytes, *, required: bool = True) -> dict[str, Any]:
        """The request body as a JSON object (400 otherwise)."""
        if not raw.strip():
            if required:
                raise invalid_request("The request needs a JSON object body.")
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise invalid_request(f"The body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise invalid_request("The body must be a JSON object.")
        return body

    def int_argument(self, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
        raw = self.get_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise invalid_request(f"{name} must be an integer, not {raw!r}.") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise invalid_request(f"{name} must be {bound}, not {value}.")
        return value


class NotFoundHandler(AgentRunsHandler):
    """Unknown paths under the API answer our JSON 404, not an HTML page."""

    def _not_found(self) -> None:
        raise ApiError(404, "not_found", f"No such endpoint: {self.request.path}")

    @web.authenticated
    @authorized
    def get(self) -> None:
        self._not_found()

    @web.authenticated
    @authorized
    def post(self) -> None:
        self._not_found()

    @web.authenticated
    @authorized
    def put(self) -> None:
        self._not_found()

    @web.authenticated
    @authorized
    def patch(self) -> None:
        self._not_found()

    @web.authenticated
    @authorized
    def delete(self) -> None:
        self._not_found()


default_handlers = [(r"api/agentruns/.*", NotFoundHandler)]
