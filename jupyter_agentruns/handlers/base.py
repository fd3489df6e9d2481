"""What every agentruns handler shares: auth resource, owner, JSON errors, bodies."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from jupyter_server.prometheus.log_functions import prometheus_log_method
from tornado import web

from .. import jsonio
from ..engine import Engine, Requests
from ..engine.streams import Waiter
from ..errors import ErrorCode, Problem, invalid_request
from ..settings import SHARED_OWNER
from ..store import StoreRefused, StoreUnavailable
from .errors import generic_code, shutting_down, status_of, store_unavailable

AUTH_RESOURCE = "agentruns"
# The store refusals already in the log (each is said once).
_REFUSALS_SAID: set[str] = set()


@web.stream_request_body
class AgentRunsHandler(ExtensionHandlerMixin, APIHandler):
    """Every endpoint reads its body through here: at most ``max_body_bytes`` is ever held.

    Tornado reads a whole body into memory before the handler runs unless the
    handler streams it; so every handler streams, and stops keeping bytes
    once the body is over the limit (413 then, whatever the endpoint).
    """

    auth_resource = AUTH_RESOURCE

    def initialize(self, name: str = "jupyter_agentruns", *args: Any, **kwargs: Any) -> None:
        super().initialize(name, *args, **kwargs)
        self._body = bytearray()
        self._too_large = False
        self._prepared = False
        self._served: Requests | None = None
        # Released when the client disconnects: a waiting stream or long-poll ends at once.
        self.waiter = Waiter()

    def on_connection_close(self) -> None:
        super().on_connection_close()
        self.waiter.release()
        self._serving_ended()

    def on_finish(self) -> None:
        super().on_finish()
        self._serving_ended()

    # Narrower than JupyterHandler.prepare, as jupyter_server's own APIHandler.prepare is
    # (which ignores the same error): the one this overrides.
    async def prepare(self) -> None:  # type: ignore[override]
        await super().prepare()
        if self.stopping:
            raise shutting_down()
        length = self.request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise self._request_too_large()
        self._prepared = True
        engine = self.settings["agentruns_engine"]
        if engine is not None:
            # Counted until it ends: the server's stop waits for it before closing the store.
            self._served = engine.requests
            self._served.began()

    def _serving_ended(self) -> None:
        if self._served is not None:
            self._served.ended()
            self._served = None

    @property
    def stopping(self) -> bool:
        """The server began to stop (streams end, new requests are answered 503)."""
        engine = self.settings["agentruns_engine"]
        return engine is not None and engine.stopping

    @property
    def max_body_bytes(self) -> int:
        """``max_body_bytes``: a tornado setting, as a body is read also where no engine started."""
        return self.settings["agentruns_max_body_bytes"]

    def data_received(self, chunk: bytes) -> None:
        # Stop buffering once over the limit: a huge body costs no memory.
        if self._too_large:
            return
        if len(self._body) + len(chunk) > self.max_body_bytes:
            self._too_large = True
            self._body = bytearray()
        else:
            self._body.extend(chunk)

    def _request_too_large(self) -> Problem:
        return Problem(
            ErrorCode.REQUEST_TOO_LARGE,
            f"The request body is over max_body_bytes ({self.max_body_bytes} bytes).",
        )

    @property
    def engine(self) -> Engine:
        engine = self.settings["agentruns_engine"]
        if engine is None:
            message = self.settings["agentruns_startup_error"]
            raise Problem(
                ErrorCode.STORE_UNAVAILABLE,
                f"{message[0].upper()}{message[1:]}; the server log says how to fix it.",
            )
        return engine

    @property
    def owner(self) -> str:
        """Who the caller is, for run ownership (see owner_mode)."""
        if self.engine.settings.owner_mode == "shared":
            return SHARED_OWNER
        return self.current_user.username

    def api_url(self, *parts: str) -> str:
        return "/".join([self.settings["agentruns_api_url"].rstrip("/"), *parts])

    def write_json(self, body: Any, status: int = 200) -> None:
        """Answer JSON: a value, or text or bytes already encoded (off the loop, for big answers)."""
        self.set_status(status)
        self.finish(body if isinstance(body, (str, bytes)) else jsonio.dumps(body))

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, Problem):
            return  # an answer for the caller; what made it is logged where it happened
        if isinstance(value, StoreRefused):
            say_once(self.log, value)
            return
        if isinstance(value, StoreUnavailable):
            # A database that went away is news for the log, not a traceback per request.
            self.log.warning("agentruns: %s %s: %s", self.request.method, self.request.path, value)
            return
        if self.stopping and not isinstance(value, web.HTTPError):
            # The store closed under a request that outlived the stop's grace.
            self.log.info(
                "agentruns: %s %s ended by the server's stop",
                self.request.method,
                self.request.path,
            )
            return
        super().log_exception(typ, value, tb)

    def _log(self) -> None:
        # jupyter_server logs every 5xx as an error, with the request's headers:
        # a 503 while the server stops is the answer it should give, worth one line.
        if self.get_status() == 503 and self.stopping:
            self.log.info(
                "agentruns: 503 %s %s: the server is stopping (%.2f ms)",
                self.request.method,
                self.request.path,
                1000 * self.request.request_time(),
            )
            prometheus_log_method(self)  # counted as every other request is
            return
        super()._log()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if self.stopping and not isinstance(exc, (web.HTTPError, Problem, type(None))):
            exc = shutting_down()
        elif isinstance(exc, StoreUnavailable):
            exc = store_unavailable(exc)
        if isinstance(exc, Problem):
            status_code = status_of(exc)
            self.set_status(status_code)
            body = exc.body()
            if exc.retry_after is not None:
                self.set_header("Retry-After", str(exc.retry_after))
        else:
            message = self._reason
            if isinstance(exc, web.HTTPError) and exc.log_message:
                message = exc.log_message % exc.args if exc.args else exc.log_message
            if status_code >= 500:
                message = "The server failed on this request; its log has the details."
            body = {"error": generic_code(status_code), "message": message}
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.allowed_methods()))
        if not self._prepared:
            # Answered before the body was read (a 413 from Content-Length, a 403
            # from the XSRF check): tornado then closes the connection rather
            # than read the body, and a client must not send another request on it.
            self.set_header("Connection", "close")
        self.set_header("Content-Type", "application/json")
        self.finish(jsonio.dumps(body))

    @classmethod
    def allowed_methods(cls) -> list[str]:
        """The methods this handler implements (for a 405's Allow header)."""
        return [
            method
            for method in cls.SUPPORTED_METHODS
            if getattr(cls, method.lower()) is not getattr(web.RequestHandler, method.lower())
        ]

    def check_body_size(self) -> None:
        """413 when the body was over the limit, also where the endpoint reads none."""
        if self._too_large:
            raise self._request_too_large()

    def json_body(self, *, required: bool = True) -> dict[str, Any]:
        """The request body as a JSON object: 413 over the limit, 400 when it is not one."""
        self.check_body_size()
        return parse_body(bytes(self._body), required=required)

    def int_argument(
        self, name: str, default: int | None, low: int, high: int | None = None
    ) -> int | None:
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


def say_once(log: Any, refusal: StoreRefused) -> None:
    """Log a store's refusal: permanent until an administrator acts, so once, not per request."""
    if str(refusal) not in _REFUSALS_SAID:
        _REFUSALS_SAID.add(str(refusal))
        log.error("agentruns: %s", refusal)


def parse_body(raw: bytes, *, required: bool = True) -> dict[str, Any]:
    """A request body as a JSON object of finite numbers and real text (400 ``invalid_request`` otherwise)."""
    if not raw.strip():
        if required:
            raise invalid_request("The request needs a JSON object body.")
        return {}
    try:
        body = jsonio.loads_body(raw)
    except jsonio.UnsafeJson as exc:
        where: dict[str, Any] = {"path": exc.path} if exc.path else {}  # none for the body itself
        raise Problem(ErrorCode.INVALID_REQUEST, f"{exc}.", **where) from None
    except ValueError as exc:
        raise invalid_request(f"{exc}.") from None
    if not isinstance(body, dict):
        raise invalid_request("The body must be a JSON object.")
    return body


class NotFoundHandler(AgentRunsHandler):
    """Unknown paths under the API answer our JSON 404, not an HTML page."""

    def _not_found(self) -> None:
        raise Problem(ErrorCode.NOT_FOUND, f"No such endpoint: {self.request.path}")

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
