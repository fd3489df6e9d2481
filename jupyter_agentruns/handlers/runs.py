"""Runs: submit (idempotent), list, read, cancel, fork, delete."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from jupyter_server.auth.decorator import authorized
from tornado import web
from tornado.http1connection import HTTP1Connection
from tornado.iostream import StreamClosedError

from ..engine import SnapshotReplaced, SubmitRequest
from ..errors import ErrorCode, Problem, invalid_request, refuse_unknown_fields, run_not_found
from ..idempotency import key_problem
from ..lifecycle import ALL_STATUSES, SESSION_POLICIES
from .base import AgentRunsHandler

RUN_ID = r"(?P<run_id>[^/]+)"
FORK_FIELDS = ("at_seq", "input", "metadata")
SUBMIT_FIELDS = {
    "agent": str,
    "input": dict,
    "session": str,
    "metadata": dict,
    "retry_of": str,
    "session_policy": str,
}
# What one turn of the event loop sends of a big answer (a run object can be
# 100 MB): other streams go between two such sends.
SEND_BYTES = 256 * 1024
# Readings of a run for one GET when its snapshot is replaced before any of it went out.
ANSWER_ATTEMPTS = 3
LIST_LIMIT_DEFAULT = 50
LIST_LIMIT_MAX = 500
# A search longer than any title, agent or notebook name finds nothing: refused.
SEARCH_MAX_CHARS = 200


def check_run_id(run_id: str) -> None:
    """404 ``run_not_found`` for a run id holding NUL: no run has one, and PostgreSQL cannot look it up."""
    if "\x00" in run_id:
        raise run_not_found(run_id)


def submit_request(body: dict[str, Any]) -> SubmitRequest:
    """Check a submit body's shape (400 ``invalid_request``) and read it."""
    refuse_unknown_fields(body, SUBMIT_FIELDS)
    for name in ("agent", "input"):
        if name not in body:
            raise invalid_request(f"The field {name!r} is required.")
    for name, kind in SUBMIT_FIELDS.items():
        value = body.get(name)
        optional = name not in ("agent", "input")
        if value is None and optional:
            continue
        if not isinstance(value, kind):
            expected = "a JSON object" if kind is dict else "a string"
            raise invalid_request(f"The field {name!r} must be {expected}.")
    policy = body.get("session_policy")
    if policy is not None and policy not in SESSION_POLICIES:
        raise invalid_request(
            f"Unknown session_policy {policy[:40]!r}; one of: {', '.join(SESSION_POLICIES)}."
        )
    return SubmitRequest(
        agent=body["agent"],
        input=body["input"],
        session=body.get("session"),
        metadata=body.get("metadata"),
        retry_of=body.get("retry_of"),
        session_policy=policy,
    )


def idempotency_key(headers: Any) -> str | None:
    """The request's ``Idempotency-Key`` (None: none), or 400 ``invalid_idempotency_key``."""
    key = headers.get("Idempotency-Key")
    if key is not None:
        problem = key_problem(key)
        if problem:
            raise Problem(ErrorCode.INVALID_IDEMPOTENCY_KEY, f"The Idempotency-Key {problem}.")
    return key


def notebook_session(path: str) -> str:
    """The session ``submit()`` records for the notebook at this API path: the path itself,
    relative to the server's root (runs recorded with the absolute path are found too)."""
    path = path.strip("/")
    if not path or any(part in ("", ".", "..") for part in path.split("/")):
        raise invalid_request(
            f"notebook={path!r} is not the path of a notebook under the server's root."
        )
    return path


class RunsHandler(AgentRunsHandler):
    """``POST runs`` (submit) and ``GET runs`` (list)."""

    @web.authenticated
    @authorized
    async def post(self) -> None:
        request = submit_request(self.json_body())
        key = idempotency_key(self.request.headers)
        lifetime = self.request.headers.get("Idempotency-Key-Lifetime", "ttl")
        if lifetime not in ("ttl", "run"):
            raise Problem(
                ErrorCode.INVALID_IDEMPOTENCY_KEY,
                f"Idempotency-Key-Lifetime is 'ttl' (the default) or 'run', not {lifetime[:40]!r}.",
            )
        run, replayed = await self.engine.submit(
            self.owner, request, key, key_with_run=lifetime == "run"
        )
        if replayed:
            self.set_header("Idempotent-Replayed", "true")
        self.set_header("Location", self.api_url("runs", run["run_id"]))
        self.write_json(run, 200 if replayed else 201)

    @web.authenticated
    @authorized
    async def get(self) -> None:
        status = self.get_argument("status", None) or None
        if status is not None and status not in ALL_STATUSES:
            raise invalid_request(f"Unknown status {status!r}; one of {', '.join(ALL_STATUSES)}.")
        limit = self.int_argument("limit", LIST_LIMIT_DEFAULT, 1, LIST_LIMIT_MAX)
        session = self.get_argument("session", None)
        notebook = self.get_argument("notebook", None)
        search = self.get_argument("q", None) or None
        if search is not None and len(search) > SEARCH_MAX_CHARS:
            raise invalid_request(f"q is at most {SEARCH_MAX_CHARS} characters.")
        if notebook:
            if session is not None:
                raise invalid_request("Give session or notebook, not both.")
            session = notebook_session(notebook)
        page = await self.engine.list_runs(
            self.owner,
            status=status,
            session=session,
            limit=limit,
            before=self.get_argument("before", None) or None,
            retry_of=self.get_argument("retry_of", None) or None,
            forked_from=self.get_argument("forked_from", None) or None,
            search=search,
        )
        self.write_json(page)


class RunHandler(AgentRunsHandler):
    """``GET runs/{id}`` (the authoritative state, or its record as Markdown) and ``DELETE runs/{id}``."""

    @web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        # With Accept: text/markdown, the static record a notebook keeps beside the live view.
        check_run_id(run_id)
        markdown = "text/markdown" in self.request.headers.get("Accept", "")
        for attempt in range(1, ANSWER_ATTEMPTS + 1):
            pieces = await self.engine.run_answer(self.owner, run_id, markdown=markdown)
            if await self._send_answer(run_id, pieces, markdown, last=attempt == ANSWER_ATTEMPTS):
                return

    async def _send_answer(
        self, run_id: str, pieces: AsyncIterator[bytes], markdown: bool, last: bool
    ) -> bool:
        """Send one reading of the run; False when it should be read again.

        That is when its snapshot was replaced (a newer one, or the run
        deleted) before any of it went out: the next reading answers the new
        state, or 404.
        """
        kind = "text/markdown; charset=UTF-8" if markdown else "application/json"
        self.set_header("Content-Type", kind)
        # A 100 MB run is read a part (about a megabyte) at a time, each read
        # while the last slice is on its way, and sent SEND_BYTES a turn of the
        # loop: other streams go between two sends even when the socket takes
        # everything at once (awaiting a finished flush gives no turn).
        pending, flushed = b"", None
        try:
            async for piece in pieces:
                # Sent but the last slice, kept for what follows (or for finish).
                pending += piece
                sent = 0
                while len(pending) - sent > SEND_BYTES:
                    if flushed is not None:
                        await asyncio.sleep(0)
                        await flushed
                    self.write(pending[sent : sent + SEND_BYTES])
                    flushed = self.flush()
                    sent += SEND_BYTES
                pending = pending[sent:]
            if flushed is not None:
                await flushed
        except StreamClosedError:
            return True  # the client left
        except Exception as exc:  # noqa: BLE001 (any failure once the answer has begun)
            if flushed is None and isinstance(exc, SnapshotReplaced) and not last:
                return False
            if flushed is None:  # nothing went out yet: answered as any error
                raise
            # The run deleted, or the database gone, while it was sent: cut the
            # answer, so that the client sees an error, not a JSON document that
            # ends early (finishing it would end it cleanly).
            self.log.warning("agentruns: the answer for run %s was cut: %r", run_id, exc)
            stream = cast(HTTP1Connection, self.request.connection).stream
            if stream is not None:
                stream.close()
            return True
        # The last slice; a small answer so goes out whole, with its length.
        self.finish(pending, set_content_type=kind)
        return True

    @web.authenticated
    @authorized
    async def delete(self, run_id: str) -> None:
        self.check_body_size()
        check_run_id(run_id)
        await self.engine.delete(self.owner, run_id)
        self.set_status(204)
        self.finish()


class CancelHandler(AgentRunsHandler):
    """``POST runs/{id}/cancel``: 202 when this request started the cancellation, else 200."""

    @web.authenticated
    @authorized
    async def post(self, run_id: str) -> None:
        body = self.json_body(required=False)
        refuse_unknown_fields(body, ["reason"])
        reason = body.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 1000):
            raise invalid_request("The field 'reason' must be a string of at most 1000 characters.")
        check_run_id(run_id)
        run, started = await self.engine.cancel(self.owner, run_id, reason)
        self.write_json(run, 202 if started else 200)


class ForkHandler(AgentRunsHandler):
    """``POST runs/{id}/fork``: a new run from the state after one of this run's events (201),
    or the one this Idempotency-Key made (200)."""

    @web.authenticated
    @authorized
    async def post(self, run_id: str) -> None:
        body = self.json_body()
        refuse_unknown_fields(body, FORK_FIELDS)
        at_seq = body.get("at_seq")
        if isinstance(at_seq, bool) or not isinstance(at_seq, int) or at_seq < 0:
            raise invalid_request(
                "The field 'at_seq' is required: the seq of the run's last event the fork "
                "keeps (0: none), a whole number of at least 0.",
                path="at_seq",
            )
        for name in ("input", "metadata"):
            if body.get(name) is not None and not isinstance(body[name], dict):
                raise invalid_request(f"The field {name!r} must be a JSON object.", path=name)
        check_run_id(run_id)
        key = idempotency_key(self.request.headers)
        run, replayed = await self.engine.fork(
            self.owner, run_id, at_seq, body.get("input") or {}, body.get("metadata"), key
        )
        if replayed:
            self.set_header("Idempotent-Replayed", "true")
        self.set_header("Location", self.api_url("runs", run["run_id"]))
        self.write_json(run, 200 if replayed else 201)


class StderrHandler(AgentRunsHandler):
    """``GET runs/{id}/stderr``: the last lines an active run's agent process wrote to stderr."""

    @web.authenticated
    @authorized
    async def get(self, run_id: str) -> None:
        check_run_id(run_id)
        self.write_json(await self.engine.agent_stderr(self.owner, run_id))


default_handlers = [
    (r"api/agentruns/runs", RunsHandler),
    (rf"api/agentruns/runs/{RUN_ID}", RunHandler),
    (rf"api/agentruns/runs/{RUN_ID}/cancel", CancelHandler),
    (rf"api/agentruns/runs/{RUN_ID}/fork", ForkHandler),
    (rf"api/agentruns/runs/{RUN_ID}/stderr", StderrHandler),
]
