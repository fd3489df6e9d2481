"""The jupyter_server extension: configuration, handlers, life cycle."""

from __future__ import annotations

import math
import os
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir
from jupyter_server._tz import utcnow
from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from tornado.ioloop import IOLoop
from traitlets import (
    Bool,
    Dict,
    Enum,
    Float,
    Int,
    List,
    TraitError,
    Unicode,
    Union,
    default,
    validate,
)

from .agents import load_agents
from .engine import Engine
from .handlers import default_handlers
from .handlers.base import SHARED_OWNER
from .lifecycle import SESSION_POLICIES
from .store import Store, StoreUnavailable
from .store.filesystems import network_filesystem
from .store.postgres import BadStoreUrl, PostgresStore, StoreUrl
from .store.sqlite import SQLiteStore


class UnsafeStore(Exception):
    """A store that cannot or must not be used as configured: the message says why and what to do."""


class AgentRuns(ExtensionApp):
    """Durable, resumable agent runs owned by the Jupyter server."""

    name = "jupyter_agentruns"
    load_other_extensions = True

    db_path = Unicode(
        help="The SQLite file holding runs and events (on a local disk: WAL needs one)."
    ).tag(config=True)
    store_url = Unicode(
        help=(
            "Where runs are kept, when not in the SQLite file at db_path: "
            "'postgresql://user:password@host:port/database' (optionally '?schema=name', "
            "default agentruns; any other parameter libpq takes, e.g. '?sslmode=require') for a "
            "PostgreSQL database shared by servers on many machines. Percent-encode the user "
            "name and password. Default: the environment variable AGENTRUNS_STORE_URL, else "
            "empty (SQLite)."
        )
    ).tag(config=True)
    owner_mode = Enum(
        ["auto", "shared", "per-user"],
        default_value="auto",
        help=(
            "Who owns a run. 'shared': every authenticated request is the server's one owner; "
            "'per-user': the authenticated username; 'auto': 'shared' with jupyter_server's own "
            "token/password identity providers, 'per-user' with any other."
        ),
    ).tag(config=True)
    served_owners = Union(
        [Unicode(), List(Unicode())],
        default_value="auto",
        help=(
            "Whose runs this server takes over when their server stopped or died, and starts "
            "from a session's queue: a list of owners, '*' for every owner, or 'auto': on a "
            "JupyterHub single-user server its user (JUPYTERHUB_USER), in the 'shared' owner "
            "mode its one owner, else every owner. Other owners' runs wait for a server that "
            "serves them; only a run nobody would resume is ended by any server."
        ),
    ).tag(config=True)
    max_stored_runs_per_user = Int(
        10000,
        help="Runs kept per owner: at the limit a new submit answers 429 storage_quota_exceeded "
        "and stores nothing (deleting a run frees a place; 0: no limit).",
    ).tag(config=True)
    agents = Dict(
        key_trait=Unicode(), value_trait=Unicode(), help="Extra agents: name -> 'module:attr'."
    ).tag(config=True)
    idempotency_ttl_seconds = Float(86400, help="How long Idempotency-Keys are remembered.").tag(
        config=True
    )
    event_retention_seconds = Float(
        86400, help="A finished run's events older than this are compacted into its snapshot."
    ).tag(config=True)
    max_retained_events = Int(
        100000, help="Events kept per run; beyond, the oldest are compacted."
    ).tag(config=True)
    run_retention_seconds = Float(
        2592000, help="Finished runs older than this are deleted (then 410)."
    ).tag(config=True)
    max_active_runs_per_user = Int(
        8, help="Active runs per owner; beyond it submit answers 429."
    ).tag(config=True)
    max_streams_per_user = Int(64, help="Open event streams per owner; beyond it 429.").tag(
        config=True
    )
    heartbeat_interval = Float(15, help="Seconds between ': ping' comments on an idle stream.").tag(
        config=True
    )
    write_timeout_seconds = Float(
        30,
        help="A stream whose client reads nothing for this long is dropped (it resumes from its cursor).",
    ).tag(config=True)
    lease_seconds = Float(30, help="How long a run's executor lease lasts without renewal.").tag(
        config=True
    )
    max_body_bytes = Int(1048576, help="Request body limit (413 beyond).").tag(config=True)
    max_event_bytes = Int(
        262144, help="One event's data limit; an agent exceeding it fails its run."
    ).tag(config=True)
    max_run_seconds = Float(
        86400, help="A run still going after this fails with deadline_exceeded."
    ).tag(config=True)
    max_resume_attempts = Int(
        3,
        help="Takeovers of a resumable agent's run (after its server died or stopped) before "
        "it ends interrupted.",
    ).tag(config=True)
    max_tokens_per_run = Int(
        0,
        help="A run whose usage (input + output tokens) goes over this fails with "
        "token_budget_exceeded (0: no limit).",
    ).tag(config=True)
    tokens_per_user_per_day = Int(
        0,
        help="Tokens an owner's runs may use in any 24 hours: beyond it submit answers 429 "
        "token_budget_exhausted and a running run that crosses it fails (0: no limit).",
    ).tag(config=True)
    default_session_policy = Enum(
        list(SESSION_POLICIES),
        default_value="parallel",
        help="What a submit to a session with an active run does, when it names no "
        "session_policy: parallel, reject (409 session_busy), enqueue or interrupt.",
    ).tag(config=True)
    freeze_gc_at_start = Bool(
        True,
        help="At start, move the objects alive then (the server's modules, classes and "
        "settings) out of the garbage collector's sight (gc.freeze; undone at stop). Its full "
        "collections then walk only what was made since, instead of the whole heap: 50-150 ms "
        "each in a busy server, during which no stream is served. False leaves the collector as "
        "it is, e.g. when something else in the server manages it.",
    ).tag(config=True)
    gil_switch_interval = Float(
        0.001,
        help="Seconds a thread that wants the interpreter (Python's GIL) waits before the one "
        "holding it must let go (sys.setswitchinterval, set at start, undone at stop). Python's "
        "own 5 ms makes the store's writer thread wait up to that long after each statement "
        "while the event loop is busy: about as long as it spends writing. 0 "
        "leaves the interpreter's setting as it is.",
    ).tag(config=True)
    sqlite_synchronous = Enum(
        ["FULL", "NORMAL"],
        default_value="FULL",
        help="FULL keeps every served event across a power loss; NORMAL only across a process crash.",
    ).tag(config=True)

    @validate(
        "idempotency_ttl_seconds", "event_retention_seconds", "run_retention_seconds",
        "heartbeat_interval", "write_timeout_seconds", "lease_seconds", "max_run_seconds",
    )  # fmt: skip
    def _positive_seconds(self, proposal):
        # NaN slips through every comparison; handed to a timer it corrupts the event loop.
        value = proposal["value"]
        if not math.isfinite(value) or value <= 0:
            raise TraitError(
                f"c.AgentRuns.{proposal['trait'].name} must be a positive number of seconds, not {value!r}"
            )
        return value

    @validate(
        "max_retained_events",
        "max_active_runs_per_user",
        "max_streams_per_user",
        "max_body_bytes",
        "max_event_bytes",
    )
    def _positive_count(self, proposal):
        value = proposal["value"]
        if value < 1:
            raise TraitError(
                f"c.AgentRuns.{proposal['trait'].name} must be at least 1, not {value!r}"
            )
        return value

    @validate("gil_switch_interval")
    def _switch_interval(self, proposal):
        value = proposal["value"]
        if not math.isfinite(value) or not 0 <= value <= 1:
            raise TraitError(
                "c.AgentRuns.gil_switch_interval must be 0 (leave Python's) or a number of "
                f"seconds up to 1, not {value!r}"
            )
        return value

    @validate("max_resume_attempts")
    def _attempts(self, proposal):
        value = proposal["value"]
        if value < 0:
            raise TraitError(
                f"c.AgentRuns.max_resume_attempts must be 0 (never take a run over) or more, not {value!r}"
            )
        return value

    @validate("served_owners")
    def _owners(self, proposal):
        value = proposal["value"]
        if isinstance(value, str):
            if value not in ("auto", "*"):
                raise TraitError(
                    "c.AgentRuns.served_owners must be 'auto', '*' (every owner) or a list of "
                    f"owners, not {value!r}"
                )
        elif not value or not all(owner.strip() for owner in value):
            raise TraitError(
                "c.AgentRuns.served_owners must name at least one owner (use 'auto' or '*' "
                f"otherwise), not {value!r}"
            )
        return value

    @validate("max_tokens_per_run", "tokens_per_user_per_day", "max_stored_runs_per_user")
    def _token_limit(self, proposal):
        value = proposal["value"]
        if value < 0:
            raise TraitError(
                f"c.AgentRuns.{proposal['trait'].name} must be 0 (no limit) or more, not {value!r}"
            )
        return value

    @default("db_path")
    def _default_db_path(self) -> str:
        return str(Path(jupyter_data_dir()) / "agentruns.sqlite3")

    # Where store_url came from, for the messages about it.
    _store_url_setting = "the setting c.AgentRuns.store_url"

    @default("store_url")
    def _default_store_url(self) -> str:
        self._store_url_setting = "the environment variable AGENTRUNS_STORE_URL"
        return os.environ.get("AGENTRUNS_STORE_URL", "").strip()

    @validate("store_url")
    def _configured_store_url(self, proposal):
        self._store_url_setting = "the setting c.AgentRuns.store_url"
        return proposal["value"].strip()

    def check_store_url(self) -> None:
        """Raise ``UnsafeStore`` naming the setting (never the URL) when store_url cannot be used.

        Checked when the store is opened, not when the setting is read, and so
        the same way wherever it came from: the environment's value is a
        default, which traitlets never validates, and a server whose store
        cannot be opened still starts and answers 503 saying why.
        """
        if self.store_url:
            try:
                StoreUrl(self.store_url)
            except BadStoreUrl as exc:
                raise UnsafeStore(f"{self._store_url_setting} {exc}") from None

    def open_store(self, migrate: bool = True) -> Store:
        """The store configured: PostgreSQL at ``store_url``, else SQLite at ``db_path``.

        ``migrate`` False: nothing is created or migrated before the first ``connect()``.
        """
        self.check_store_url()
        if self.store_url:
            return PostgresStore(self.store_url)
        if fstype := network_filesystem(self.db_path):
            raise UnsafeStore(
                f"the agentruns SQLite file {self.db_path} is on a network file system "
                f"({fstype}), where SQLite's locking is unsafe and a database can be corrupted: "
                "set c.AgentRuns.db_path to a local disk, or c.AgentRuns.store_url to a "
                "PostgreSQL database"
            )
        return SQLiteStore(self.db_path, self.sqlite_synchronous, migrate=migrate)

    def store_location(self) -> str:
        """Where runs are kept, for logs and messages: never the store URL's password."""
        return StoreUrl(self.store_url).describe() if self.store_url else self.db_path

    def without_secrets(self, text: str) -> str:
        """``text`` with the store URL's password starred out (drivers quote what they were given)."""
        return StoreUrl(self.store_url).scrub(text) if self.store_url else text

    def effective_owner_mode(self) -> str:
        if self.owner_mode != "auto":
            return self.owner_mode
        provider = type(self.serverapp.identity_provider)
        return "shared" if provider in (IdentityProvider, PasswordIdentityProvider) else "per-user"

    def effective_served_owners(self) -> frozenset[str] | None:
        """The owners whose runs this server takes over and starts (None: every owner)."""
        if isinstance(self.served_owners, list):
            return frozenset(self.served_owners)
        if self.served_owners == "*":
            return None
        if self.effective_owner_mode() == "shared":
            return frozenset([SHARED_OWNER])
        hub_user = os.environ.get("JUPYTERHUB_USER")
        return frozenset([hub_user]) if hub_user else None

    def initialize_settings(self) -> None:
        self.engine: Engine | None = None
        self.startup_error: str | None = None
        agents, failures = load_agents(self.agents, self.log, parent=self)
        try:
            store = self.open_store()
            self.engine = Engine(
                parent=self,
                store=store,
                agents=agents,
                agent_failures=failures,
                on_activity=self._record_activity,
                served_owners=self.effective_served_owners(),
            )
        except UnsafeStore as exc:
            self.startup_error = str(exc)
            self.log.error("agentruns: %s", self.startup_error)
        except Exception as exc:
            # The server goes on (and stops cleanly); the API answers 503 saying why.
            self.startup_error = (
                f"the agentruns store at {self.store_location()} cannot be opened: "
                f"{type(exc).__name__}: {self.without_secrets(str(exc))}"
            )
            self.log.error("agentruns: %s", self.startup_error)
        self.settings.update(
            {
                "agentruns_engine": self.engine,
                "agentruns_startup_error": self.startup_error,
                "agentruns_owner_mode": self.effective_owner_mode(),
                "agentruns_api_url": url_path_join(self.serverapp.base_url, "api/agentruns"),
            }
        )
        # The runs panel opens a run's notebook: a kernel knows it by its path
        # on disk, the file browser by its path under the root, which
        # Notebook 7's pages do not carry (JupyterLab's do, as serverRoot).
        page_config = self.serverapp.web_app.settings.setdefault("page_config_data", {})
        page_config["agentrunsServerRoot"] = os.path.abspath(self.serverapp.root_dir).replace(
            os.sep, "/"
        )
        if self.engine is not None:
            # Started as soon as the server's event loop runs (every jupyter_server
            # version; not only those that call _start_jupyter_server_extension):
            # runs a crash left unfinished are swept without waiting for a request.
            IOLoop.current().add_callback(self._start_engine)
            served = self.engine.served_owners
            self.log.info(
                "agentruns: store %s, owner mode %s, agents: %s, takes over the runs of %s",
                self.engine.store.describe(),
                self.settings["agentruns_owner_mode"],
                ", ".join(sorted(agents)) or "none",
                "every owner"
                if served is None
                else "its one owner"
                if served == {SHARED_OWNER}
                else ", ".join(sorted(served)),
            )

    def _record_activity(self) -> None:
        # Any ServerApp setting ending in _last_activity feeds last_activity(),
        # which idle culling reads: a live run keeps the server busy.
        self.serverapp.web_app.settings["agentruns_last_activity"] = utcnow()

    def initialize_handlers(self) -> None:
        self.handlers.extend(default_handlers)

    async def _start_engine(self) -> None:
        try:
            await self.engine.start()
        except StoreUnavailable as exc:
            self.log.warning("agentruns: %s; the next request tries again", exc)
        except Exception:
            # Requests try again (the store may be locked by another process for a while).
            self.log.exception("agentruns: starting failed; the next request tries again")

    def current_activity(self):
        """Live runs, so that shutdown_no_activity_timeout never stops a server mid-run."""
        engine = getattr(self, "engine", None)
        live = sorted(engine.live) if engine is not None else []
        return live or None

    async def stop_extension(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            await engine.stop()
