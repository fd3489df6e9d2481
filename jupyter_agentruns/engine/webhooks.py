"""Webhooks: the users' hooks, and the deliveries of the outbox the store writes with each event.

The store writes a delivery (``webhook_deliveries``) in the transaction of
each event a hook wants (``StoreConnection.append_events``): committed with
its event, so nothing is lost between the two. This part sends them: it
claims due deliveries for ``lease_seconds`` (``claimed_until``: another
server sharing the store leaves them alone while it lasts), each the earliest still pending
of its hook and run (in order per run), posts them signed as Standard
Webhooks says (``webhook-id`` is the delivery's id, the same at every
attempt), and records the outcome: delivered, tried again after a backoff
(``webhooks_retry_seconds``, doubling, at most an hour), or, once
``webhooks_give_up_seconds`` have passed since the event, given up.

Runs on the event loop, but for the functions marked ``in_transaction``
(the writer's thread) and the reads given to the reader.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib.util
import ipaddress
import json
import logging
import os
import secrets
import socket
import time
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from .. import jsonio
from ..errors import ErrorCode, Problem, invalid_request
from ..reader import Reader
from ..settings import WEBHOOK_FORMATS, Settings, webhook_events_problem
from ..store import StoreConnection
from ..timeutil import iso, now_iso
from ..writer import Writer, in_transaction
from .periodic import Passes
from .reads import Reads

# The longest an attempt waits for the receiver's answer (at most half the
# claim on it, ``lease_seconds``: the claim outlasts the attempt).
ATTEMPT_TIMEOUT_SECONDS = 15.0
# How long a stopping server waits for the attempts under way.
STOP_WAIT_SECONDS = 2.0
# How long a look-up of a hook's host waits (at its creation and at each attempt).
RESOLVE_SECONDS = 5.0
# The longest wait between two attempts of one delivery.
MOST_BACKOFF_SECONDS = 3600.0
# How often the outbox is looked at when nothing wakes this server's loop
# (deliveries of other servers' events, retries that came due).
POLL_SECONDS = 1.0
CLAIM_BATCH = 50
DELIVERIES_LIMIT = 100
MAX_URL_CHARS = 2000
SIGNING_MISSING = (
    "Webhooks are sent with the standardwebhooks and httpx packages, which this server lacks: "
    "install it (pip install 'jupyter-agentruns[webhooks]')."
)
# What is kept of a failed attempt's answer, in the delivery's last_error.
ERROR_CHARS = 300


def backoff(attempts: int, first: float) -> float:
    """Seconds before the next attempt, after ``attempts`` failed ones."""
    return min(first * 2 ** (attempts - 1), MOST_BACKOFF_SECONDS)


def server_hook_id(entry: dict[str, Any]) -> str:
    """A server's webhook's id: the same on every server with the same entry."""
    text = json.dumps(
        [entry["url"], sorted(entry["events"]), entry.get("format", "standard")], sort_keys=True
    )
    return "server_" + hashlib.sha256(text.encode()).hexdigest()[:16]


def private_address(address: str) -> bool:
    """Whether an IP address is this machine's or a private network's (not the internet's)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def public_hook(row: dict[str, Any]) -> dict[str, Any]:
    """A hook as the API answers it: never its secret."""
    return {
        "hook_id": row["hook_id"],
        "url": row["url"],
        "events": row["events"],
        "format": row["format"],
        "created_at": row["created_at"],
    }


def public_delivery(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "delivery_id": row["delivery_id"],
        "run_id": row["run_id"],
        "seq": row["seq"],
        "type": row["type"],
        "status": row["status"],
        "attempts": row["attempts"],
        "last_error": row["last_error"],
        "next_attempt": iso(row["next_attempt"]) if row["status"] == "pending" else None,
        "delivered_at": iso(row["delivered_ts"]) if row["delivered_ts"] else None,
    }


def hook_not_found(hook_id: str) -> Problem:
    return Problem(ErrorCode.HOOK_NOT_FOUND, f"No hook {hook_id!r} exists for you.")


class Webhooks:
    """The hooks of users and of the server, and the sending of their deliveries."""

    def __init__(
        self,
        *,
        settings: Settings,
        writer: Writer,
        reader: Reader,
        reads: Reads,
        link_url: str,
        log: logging.Logger,
    ):
        self._settings = settings
        self._writer = writer
        self._reader = reader
        self._reads = reads
        self._link_url = link_url if link_url.endswith("/") else link_url + "/"
        self._log = log
        self._wake = asyncio.Event()
        self._sending: set[asyncio.Task] = set()
        self._client: Any = None  # an httpx.AsyncClient, made at the first attempt

    # What users ask ----------------------------------------------------------

    async def create(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        """A new hook of the owner's, with its secret (answered this once)."""
        url, events, format = body.get("url"), body.get("events"), body.get("format", "standard")
        if not isinstance(url, str) or len(url) > MAX_URL_CHARS:
            raise invalid_request(
                f"The field 'url' is required: an http:// or https:// address of at most "
                f"{MAX_URL_CHARS} characters."
            )
        problem = webhook_events_problem(events)
        if problem is not None or not isinstance(events, list):
            raise invalid_request(f"The field {problem}.")
        if format not in WEBHOOK_FORMATS:
            raise invalid_request(f"The field 'format' is one of: {', '.join(WEBHOOK_FORMATS)}.")
        if any(importlib.util.find_spec(name) is None for name in ("standardwebhooks", "httpx")):
            raise invalid_request(SIGNING_MISSING)
        await self._check_url(url)
        hook = {
            "hook_id": "hook_" + secrets.token_hex(8),
            "owner": owner,
            "url": url,
            "events": sorted(set(events)),
            "format": format,
            "secret": "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode(),
            "created_at": now_iso(),
        }

        @in_transaction
        def insert(conn: StoreConnection) -> None:
            conn.insert_hook(hook)

        await self._writer.run(insert)
        return {**public_hook(hook), "secret": hook["secret"]}

    async def _check_url(self, url: str) -> None:
        not_a_url = invalid_request("The field 'url' is an http:// or https:// address.")
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError:  # a bracketed host that is no IPv6 address, a port out of range
            raise not_a_url from None
        if parts.scheme not in ("http", "https") or not host or any(c.isspace() for c in url):
            raise not_a_url
        if self._settings.webhooks_allow_private:
            return
        try:
            addresses = await _addresses(host, port)
        except (OSError, asyncio.TimeoutError):
            raise invalid_request(f"The hook's host {host!r} cannot be resolved.") from None
        if any(private_address(address) for address in addresses):
            raise invalid_request(
                f"The hook's URL names a private or loopback address ({host}): this server "
                "does not send there. An administrator may allow it with "
                "c.AgentRuns.webhooks_allow_private = True."
            )

    async def list_hooks(self, owner: str) -> list[dict[str, Any]]:
        rows = await self._reader.run(lambda conn: conn.list_hooks(owner))
        return [public_hook(row) for row in rows]

    async def get(self, owner: str, hook_id: str) -> dict[str, Any]:
        if "\x00" in hook_id:  # no hook has one, and PostgreSQL cannot look it up
            raise hook_not_found(hook_id)
        row = await self._reader.run(lambda conn: conn.get_hook(hook_id))
        if row is None or row["owner"] != owner:
            raise hook_not_found(hook_id)
        return public_hook(row)

    async def delete(self, owner: str, hook_id: str) -> None:
        await self.get(owner, hook_id)

        @in_transaction
        def delete(conn: StoreConnection) -> bool:
            return conn.delete_hook(owner, hook_id)

        if not await self._writer.run(delete):
            raise hook_not_found(hook_id)

    async def deliveries(self, owner: str, hook_id: str) -> list[dict[str, Any]]:
        await self.get(owner, hook_id)
        rows = await self._reader.run(lambda conn: conn.list_deliveries(hook_id, DELIVERIES_LIMIT))
        return [public_delivery(row) for row in rows]

    # Sending -------------------------------------------------------------------

    async def install_server_hooks(self) -> None:
        """Make the store's server hooks this server's ``c.AgentRuns.webhooks``."""
        created = now_iso()
        hooks = [
            {
                "hook_id": server_hook_id(entry),
                "url": entry["url"],
                "events": sorted(set(entry["events"])),
                "format": entry.get("format", "standard"),
                "secret_env": entry.get("secret_env"),
                "created_at": created,
            }
            for entry in self._settings.webhooks
        ]

        @in_transaction
        def install(conn: StoreConnection) -> None:
            conn.set_server_hooks(hooks)

        await self._writer.run(install)

    def wake(self) -> None:
        """An event a hook may want was committed here: look at the outbox now."""
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Send due deliveries until the server stops."""
        passes = Passes(self._log, "webhook deliveries")
        while not stopping.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            if stopping.is_set():
                return
            await passes.run(self.send_due)

    async def stop(self) -> None:
        """Let the attempts under way finish, briefly; the others are tried again later.

        An attempt cut short keeps its claim until it runs out, then any
        server sharing the store tries it again: at least once, not exactly.
        """
        if self._sending:
            _, cut = await asyncio.wait(list(self._sending), timeout=STOP_WAIT_SECONDS)
            for task in cut:
                task.cancel()
        if self._client is not None:
            await self._client.aclose()

    async def send_due(self) -> int:
        """Claim the due deliveries and start sending them; returns how many it claimed."""
        now = time.time()
        if not await self._reader.run(lambda conn: conn.due_deliveries(now)):
            return 0

        @in_transaction
        def claim(conn: StoreConnection) -> list[dict[str, Any]]:
            now = time.time()
            return conn.claim_deliveries(now, now + self._settings.lease_seconds, CLAIM_BATCH)

        claimed = await self._writer.run(claim)
        for row in claimed:
            task = asyncio.ensure_future(self._attempt(row))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        return len(claimed)

    async def _attempt(self, row: dict[str, Any]) -> None:
        error: str | None
        try:
            error = await self._send(row)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        now = time.time()
        attempts = row["attempts"] + 1
        next_attempt: float | None = None
        if error is not None:
            retry = now + backoff(attempts, self._settings.webhooks_retry_seconds)
            given_up = row["url"] is None or row["owner"] is None
            if (
                not given_up
                and retry - row["created_ts"] <= self._settings.webhooks_give_up_seconds
            ):
                next_attempt = retry

        @in_transaction
        def finish(conn: StoreConnection) -> None:
            conn.finish_delivery(row["delivery_id"], now, error, next_attempt)

        await self._writer.run(finish)
        if error is None:
            self._wake.set()  # the run's next delivery, if any, waited for this one
        if next_attempt is not None:
            self._log.info(
                "agentruns: webhook delivery %s failed (%s); trying again in %.1f s",
                row["delivery_id"],
                error,
                next_attempt - now,
            )
        elif error is not None:
            self._log.warning(
                "agentruns: webhook delivery %s given up: %s", row["delivery_id"], error
            )

    async def _send(self, row: dict[str, Any]) -> str | None:
        """One attempt: None when the receiver took it (a 2xx), else what went wrong."""
        if row["url"] is None:
            return "the hook was deleted"
        if row["owner"] is None:
            return "the run was deleted"
        run: dict[str, Any] = dict(
            await self._reads.get_run_without_snapshot(row["owner"], row["run_id"])
        )
        run.pop("snapshot", None)
        if row["format"] == "slack":
            link = f"{self._link_url}lab?agentruns-run={quote(row['run_id'])}"
            body = {"text": f"{run['title']} — {run['status']} {link}"}
        else:
            body = {"type": row["type"], "seq": row["seq"], **run}
        payload = jsonio.dumps(body, compact=True).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "jupyter-agentruns"}
        secret = row["secret"]
        if secret is None and row["secret_env"]:
            secret = os.environ.get(row["secret_env"])
            if not secret:
                return f"the environment variable {row['secret_env']} holding the secret is not set"
        if secret:
            try:
                from standardwebhooks.webhooks import Webhook
            except ImportError:
                return SIGNING_MISSING
            stamp = datetime.now(timezone.utc)
            headers["webhook-id"] = row["delivery_id"]
            headers["webhook-timestamp"] = str(int(stamp.timestamp()))
            headers["webhook-signature"] = Webhook(secret).sign(row["delivery_id"], stamp, payload)
        import httpx  # with standardwebhooks, the webhooks extra

        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=min(ATTEMPT_TIMEOUT_SECONDS, self._settings.lease_seconds / 2)
            )
        try:
            # The servers' own hooks (an administrator's) may send anywhere.
            private = self._settings.webhooks_allow_private or row["hook_id"].startswith("server_")
            targets = await self._targets(row["url"], private)
        except AddressRefused as refused:
            return str(refused)[:ERROR_CHARS]
        except (OSError, asyncio.TimeoutError):
            return f"the hook's host {urlsplit(row['url']).hostname!r} cannot be resolved"
        error = "no address"
        for url, pinned, extensions in targets:
            try:
                response = await self._client.post(
                    url, content=payload, headers={**headers, **pinned}, extensions=extensions
                )
            except httpx.ConnectError as exc:  # this address refused: the host's next one
                error = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
                continue
            except Exception as exc:  # timed out, a broken connection
                return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
            if response.is_success:
                return None
            return f"HTTP {response.status_code}: {response.text}"[:ERROR_CHARS]
        return error

    async def _targets(
        self, url: str, private: bool
    ) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
        """Where to send: the hook's URL at each address its host has now, checked now.

        A host's addresses can change after the hook was made (DNS rebinding): the
        attempt goes to an address checked here, never to one a second lookup gives
        the HTTP client, with the host's name in ``Host`` and, over TLS, in SNI and the
        certificate's check. ``private``: private and loopback addresses are allowed.
        """
        parts = urlsplit(url)
        host = parts.hostname or ""
        addresses = await _addresses(host, parts.port)
        refused = [] if private else [a for a in addresses if private_address(a)]
        if refused:
            raise AddressRefused(
                f"the hook's host {host} is at a private or loopback address now "
                f"({refused[0]}): not sent (c.AgentRuns.webhooks_allow_private)"
            )
        if addresses == [host]:  # an address already: nothing to pin
            return [(url, {}, {})]
        userinfo = parts.netloc.rpartition("@")[0]
        named = parts.netloc.rpartition("@")[2]
        targets = []
        for address in dict.fromkeys(addresses):
            netloc = f"[{address}]" if ":" in address else address
            if parts.port is not None:
                netloc = f"{netloc}:{parts.port}"
            if userinfo:
                netloc = f"{userinfo}@{netloc}"
            extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
            targets.append((urlunsplit(parts._replace(netloc=netloc)), {"Host": named}, extensions))
        return targets


class AddressRefused(Exception):
    """The hook's host is at an address this server does not send to."""


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _addresses(host: str, port: int | None) -> list[str]:
    """The host's addresses now: itself when it is one, else looked up (``RESOLVE_SECONDS`` at most)."""
    if _is_ip(host):
        return [host]
    return await asyncio.wait_for(_resolve(host, port), RESOLVE_SECONDS)


async def _resolve(host: str, port: int | None) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]
