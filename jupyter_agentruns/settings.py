"""The ``c.AgentRuns.*`` settings: declared once as traits, read once into a frozen ``Settings``.

The server's extension app (``app.AgentRuns``) has these traits and reads
them once at its start (``Settings.resolve``: with what they leave to the
server, its owner mode, its hub user and the owners it serves, resolved); the
command line reads the same configuration files into the same ``Settings``
without a server (``from_config``). Everything below the app takes a
``Settings``: the engine and its parts, the handlers (through the engine),
the store factory (``store.open``), the compactor, the benchmarks.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from jupyter_core.paths import jupyter_data_dir
from traitlets import (
    Bool,
    Dict,
    Enum,
    Float,
    HasTraits,
    Int,
    List,
    TraitError,
    Unicode,
    Union,
    default,
    validate,
)
from traitlets.config import Config, Configurable

from .lifecycle import SESSION_POLICIES

# The owner of every run of a server in the ``shared`` owner mode.
SHARED_OWNER = "~shared"
# How a server knows who sends a request, for owner_mode 'auto': "token" for
# jupyter_server's own token and password identity providers (whoever has the
# token is the server's one person), "users" for any other (each user by name).
Identity = Literal["token", "users"]
# The Settings fields a server resolves at its start, not configured (see Settings.resolve).
RESOLVED = frozenset({"hub_user", "owners_served"})


class SettingsTraits(HasTraits):
    """The ``c.AgentRuns.*`` traits, with their defaults, help and checks."""

    db_path = Unicode(
        help="The SQLite file holding runs and events. It must be on a local disk (WAL needs "
        "one): on NFS, SMB or FUSE the server refuses it and says so (use store_url there)."
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
    store_wide_metrics = Bool(
        False,
        help="agentruns_runs counts every run of the store, not only those of the owners this "
        "server serves (served_owners): for a scraper of a server that every user's runs may "
        "show to. Off, a user's server on a hub's shared store shows that user's runs only.",
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
    schedule_tick_seconds = Float(
        5,
        help="How often a server looks for schedules whose time came: a scheduled run "
        "starts at most this many seconds after its time.",
    ).tag(config=True)
    lease_seconds = Float(
        30,
        help="How long a run's executor lease lasts without renewal. After a crash, once it "
        "expired, a resumable agent's run is taken over and any other ends interrupted.",
    ).tag(config=True)
    max_body_bytes = Int(1048576, help="Request body limit (413 beyond).").tag(config=True)
    max_event_bytes = Int(
        262144, help="One event's data limit; an agent exceeding it fails its run."
    ).tag(config=True)
    max_run_seconds = Float(
        86400, help="A run still going after this fails with deadline_exceeded."
    ).tag(config=True)
    agent_silence_seconds = Float(
        0,
        help="A running run whose agent has emitted no event for this long (a run waiting for "
        "a person's answer, or for a step of its own to end, is not silent) is stopped and "
        "fails with agent_silent: an agent stuck on a model server that never answers ends "
        "instead of running on. 0: never.",
    ).tag(config=True)
    waiting_activity_seconds = Float(
        3600,
        help="How long a resumable run waiting for a person's answer keeps its server from "
        "being culled as idle. After it, the server may be culled (its waiting runs are "
        "handed over, their questions kept, and the next server takes them over); a run of an "
        "agent that cannot resume keeps its server busy as long as it waits.",
    ).tag(config=True)
    max_resume_attempts = Int(
        3,
        help="Takeovers of a resumable agent's run (after its server died or stopped) before "
        "it ends interrupted; 0: never taken over.",
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
    budget_exceeded = Enum(
        ["fail", "ask"],
        default_value="fail",
        help="What a run does at max_tokens_per_run or tokens_per_user_per_day: 'fail' (with "
        "token_budget_exceeded) or 'ask' (it waits with a question of kind 'budget', 'allow N "
        "more tokens?': approving raises the run's limit by N, enough for another run's budget "
        "beyond what it used, or a tenth of the day's; denying fails it token_budget_exceeded).",
    ).tag(config=True)
    in_doubt = Enum(
        ["tell_model", "ask"],
        default_value="tell_model",
        help="What a run taken over after its server died does with a step with effects that "
        "started and has no result (run_code, execute_cell, a tool not declared idempotent or "
        "read-only): 'tell_model' (it is not made again; it fails 'interrupted' and the agent "
        "reads that) or 'ask' (a question of kind 'in_doubt' before the agent goes on: "
        "'run_again', 'skip' (it fails 'skipped') or 'stop' (the run fails 'stopped_in_doubt')).",
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
    acp_agents = Dict(
        value_trait=Dict(),
        help=(
            "Programs speaking the Agent Client Protocol over stdio (opencode, Claude Code through "
            "claude-code-acp, Codex through codex-acp, Gemini CLI, goose, ...), each an agent of "
            "that name: {'opencode': {'command': ['opencode', 'acp'], 'env': {}, 'description': "
            "'...', 'resumable': True}}. The program gets PATH, HOME and its 'env', nothing else "
            "of the server's environment; 'initialize_timeout' (seconds, default 60) bounds its start."
        ),
    ).tag(config=True)
    acp_idle_seconds = Float(
        600,
        help="How long an ACP agent's process is kept after its conversation's last turn, for "
        "the next run of that conversation.",
    ).tag(config=True)
    max_agent_processes = Int(
        8,
        help="ACP agent processes this server runs at most. Beyond it the least recently used "
        "idle one is closed; when every one is in a turn, a new run waits (its progress says so).",
    ).tag(config=True)
    notebook_tools_approval = Enum(
        ["ask", "never"],
        default_value="ask",
        help="Whether the notebook tools' run_code and execute_cell ask the person before they "
        "run code in the notebook's kernel ('ask': an approval question showing the code) or "
        "run it at once ('never').",
    ).tag(config=True)
    notebook_edits = Enum(
        ["apply", "ask"],
        default_value="apply",
        help="How the notebook tools' insert_cell, edit_cell and delete_cell change a notebook: "
        "'apply' (at once; each edit is recorded in its run and can be undone with POST "
        "runs/{id}/edits/{edit_id}/undo) or 'ask' (each edit is first a question showing its "
        "diff, applied when approved). An edit is made where the notebook is held: in its live "
        "shared document where jupyter-collaboration is enabled and a page has it open (every "
        "open page shows it at once), else by a JupyterLab page that has it open (which saves "
        "it; the other pages holding it read it again), else in its file.",
    ).tag(config=True)
    default_agent = Unicode(
        "",
        help="The agent of a %%agent cell that names none (empty: demo). GET agents answers it.",
    ).tag(config=True)
    kernel_magics = Bool(
        True,
        help="Whether the notebooks' kernels this server starts have %%agent and %agent loaded "
        "(where the kernel's Python has jupyter_agentruns): the server runs a startup file "
        "first in them, then the person's own PYTHONSTARTUP, if set. Else %load_ext "
        "jupyter_agentruns loads them.",
    ).tag(config=True)
    mcp_servers = Dict(
        value_trait=Dict(),
        help=(
            "MCP servers whose tools agents may use: {'name': {'command': ['prog', 'arg'], "
            "'env': {}}} for one started over stdio (it gets the MCP SDK's default environment, "
            "PATH and HOME among it, and its 'env'), or {'name': {'url': 'https://...', "
            "'headers': {}}} for one reached over Streamable HTTP. The openai agent offers their "
            "tools as '<name>__<tool>'; ACP agents receive them in session/new."
        ),
    ).tag(config=True)
    webhooks = List(
        Dict(),
        help=(
            "Webhooks of the server itself, told of every owner's runs: [{'url': 'https://...', "
            "'events': ['run.failed', ...], 'secret_env': 'NAME', 'format': 'standard'}]. "
            "'events': any of run.succeeded, run.failed, run.cancelled, run.interrupted, "
            "input.requested. 'secret_env': the environment variable holding the signing "
            "secret (Standard Webhooks' 'whsec_' form). 'format': 'standard' (default: the run "
            "object, signed) or 'slack' (a text line for a Slack incoming webhook). Servers "
            "sharing a store share this list: a server's start makes it the store's."
        ),
    ).tag(config=True)
    webhooks_allow_private = Bool(
        False,
        help="Whether users may create hooks (POST hooks) whose URL is a private, loopback or "
        "link-local address (this machine, the local network). Off: such a URL is refused "
        "with a 400. The servers' own webhooks may always use one.",
    ).tag(config=True)
    webhooks_retry_seconds = Float(
        5,
        help="Seconds before a failed webhook delivery is tried again; each later retry waits "
        "twice as long as the one before (at most an hour), until webhooks_give_up_seconds.",
    ).tag(config=True)
    webhooks_give_up_seconds = Float(
        86400,
        help="How long a webhook delivery is retried after its event before it is given up "
        "(status failed).",
    ).tag(config=True)
    webhooks_link_url = Unicode(
        "",
        help="The address people open this server at (e.g. 'https://hub.example.org/user/ada/'): "
        "the 'slack' webhook format links to run pages under it. Empty: the server's own URL.",
    ).tag(config=True)
    sqlite_synchronous = Enum(
        ["FULL", "NORMAL"],
        default_value="FULL",
        help="FULL keeps every served event across a power loss; NORMAL only across a process crash.",
    ).tag(config=True)

    @validate(
        "idempotency_ttl_seconds", "event_retention_seconds", "run_retention_seconds",
        "heartbeat_interval", "write_timeout_seconds", "lease_seconds", "max_run_seconds",
        "acp_idle_seconds", "webhooks_retry_seconds", "webhooks_give_up_seconds",
        "schedule_tick_seconds",
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
        "max_agent_processes",
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

    @validate("waiting_activity_seconds", "agent_silence_seconds")
    def _waiting_seconds(self, proposal):
        value = proposal["value"]
        if not math.isfinite(value) or value < 0:
            raise TraitError(
                f"c.AgentRuns.{proposal['trait'].name} must be 0 or a positive number of "
                f"seconds, not {value!r}"
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

    @validate("acp_agents")
    def _acp_agents(self, proposal):
        for name, entry in proposal["value"].items():
            problem = acp_entry_problem(name, entry)
            if problem is not None:
                raise TraitError(f"c.AgentRuns.acp_agents[{name!r}]: {problem}")
        return proposal["value"]

    @validate("mcp_servers")
    def _mcp_servers(self, proposal):
        for name, entry in proposal["value"].items():
            problem = mcp_entry_problem(name, entry)
            if problem is not None:
                raise TraitError(f"c.AgentRuns.mcp_servers[{name!r}]: {problem}")
        return proposal["value"]

    @validate("webhooks")
    def _webhooks(self, proposal):
        for index, entry in enumerate(proposal["value"]):
            problem = webhook_entry_problem(entry)
            if problem is not None:
                raise TraitError(f"c.AgentRuns.webhooks[{index}]: {problem}")
        return proposal["value"]

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

    def read_settings(self) -> Settings:
        """These traits' values, read once."""
        values = {
            field.name: getattr(self, field.name)
            for field in fields(Settings)
            if field.name != "store_url_source" and field.name not in RESOLVED
        }
        values["store_url_source"] = self._store_url_setting
        values["agents"] = dict(values["agents"])
        values["acp_agents"] = {name: dict(entry) for name, entry in values["acp_agents"].items()}
        values["mcp_servers"] = {name: dict(entry) for name, entry in values["mcp_servers"].items()}
        values["webhooks"] = [dict(entry) for entry in values["webhooks"]]
        if isinstance(values["served_owners"], list):
            values["served_owners"] = tuple(values["served_owners"])
        return Settings(**values)


@dataclass(frozen=True)
class Settings:
    """What a server, the command line and the benchmarks run with (see ``SettingsTraits``)."""

    db_path: str
    store_url: str
    # Where store_url came from, for messages about it (never the URL itself).
    store_url_source: str
    owner_mode: str
    served_owners: str | tuple[str, ...]
    store_wide_metrics: bool
    max_stored_runs_per_user: int
    agents: dict[str, str]
    idempotency_ttl_seconds: float
    event_retention_seconds: float
    max_retained_events: int
    run_retention_seconds: float
    max_active_runs_per_user: int
    max_streams_per_user: int
    heartbeat_interval: float
    write_timeout_seconds: float
    lease_seconds: float
    max_body_bytes: int
    max_event_bytes: int
    max_run_seconds: float
    agent_silence_seconds: float
    waiting_activity_seconds: float
    max_resume_attempts: int
    max_tokens_per_run: int
    tokens_per_user_per_day: int
    default_session_policy: str
    freeze_gc_at_start: bool
    gil_switch_interval: float
    sqlite_synchronous: str
    acp_agents: dict[str, dict[str, Any]]
    acp_idle_seconds: float
    max_agent_processes: int
    notebook_tools_approval: str = "ask"
    notebook_edits: str = "apply"
    budget_exceeded: str = "fail"
    in_doubt: str = "tell_model"
    default_agent: str = ""
    kernel_magics: bool = True
    mcp_servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    webhooks: list[dict[str, Any]] = field(default_factory=list)
    webhooks_allow_private: bool = False
    webhooks_retry_seconds: float = 5.0
    webhooks_give_up_seconds: float = 86400.0
    webhooks_link_url: str = ""
    schedule_tick_seconds: float = 5.0
    # Resolved at a server's start (``resolve``, which also resolves an 'auto'
    # owner_mode); settings read from the configuration alone (the command
    # line's) keep these defaults.
    # The user of a JupyterHub single-user server (JUPYTERHUB_USER), or None.
    hub_user: str | None = None
    # served_owners resolved: whose runs this server takes over and starts (None: every owner).
    owners_served: frozenset[str] | None = None

    @classmethod
    def resolve(
        cls, traits: SettingsTraits, environ: Mapping[str, str], identity: Identity
    ) -> Settings:
        """A server's settings: its traits read once, and what they leave to the server resolved.

        ``environ`` is the server's environment (``JUPYTERHUB_USER`` names the
        user of a hub's single-user server); ``identity`` is how it knows who
        sends a request (see ``Identity``).
        """
        settings = traits.read_settings()
        owner_mode = settings.owner_mode
        if owner_mode == "auto":
            owner_mode = "shared" if identity == "token" else "per-user"
        hub_user = environ.get("JUPYTERHUB_USER") or None
        served: frozenset[str] | None
        if isinstance(settings.served_owners, tuple):
            served = frozenset(settings.served_owners)
        elif settings.served_owners == "*":
            served = None
        elif owner_mode == "shared":
            served = frozenset([SHARED_OWNER])
        else:
            served = frozenset([hub_user]) if hub_user else None
        return dataclasses.replace(
            settings, owner_mode=owner_mode, hub_user=hub_user, owners_served=served
        )

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (checked as the traits check them); resolved values kept unless changed."""
        resolved = {name: changes.pop(name, getattr(self, name)) for name in RESOLVED}
        configured = {name: value for name, value in self.__dict__.items() if name not in RESOLVED}
        return dataclasses.replace(from_values({**configured, **changes}), **resolved)


ACP_ENTRY_KEYS = {"command", "env", "description", "resumable", "initialize_timeout"}


def acp_entry_problem(name: str, entry: Any) -> str | None:
    """What is wrong with one ``acp_agents`` entry, or None."""
    if not name.strip():
        return "an agent's name is not empty"
    if not isinstance(entry, dict):
        return f"an entry is an object with a 'command', not {type(entry).__name__}"
    unknown = sorted(set(entry) - ACP_ENTRY_KEYS)
    if unknown:
        return f"unknown keys {unknown}; an entry has {sorted(ACP_ENTRY_KEYS)}"
    command = entry.get("command")
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(part, str) and part for part in command)
    ):
        return "'command' is the program and its arguments, a non-empty list of strings"
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(key, str) and key and "=" not in key and isinstance(value, str)
        for key, value in env.items()
    ):
        return "'env' maps variable names to strings"
    if not isinstance(entry.get("description", ""), str):
        return "'description' is text"
    if not isinstance(entry.get("resumable", False), bool):
        return "'resumable' is true or false"
    timeout = entry.get("initialize_timeout", 60)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        return "'initialize_timeout' is a positive number of seconds"
    return None


# A server's name starts its tools' names (``<name>__<tool>``): no "__" in it.
MCP_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*$")
MCP_SERVER_NAME_LENGTH = 32
# The name under which ACP agents receive this server's own notebook tools.
NOTEBOOK_MCP_NAME = "jupyter-notebook"


def mcp_entry_problem(name: str, entry: Any) -> str | None:
    """What is wrong with one ``mcp_servers`` entry, or None."""
    if not MCP_SERVER_NAME.match(name) or len(name) > MCP_SERVER_NAME_LENGTH:
        return (
            f"a server's name is letters, digits, '-' and single '_' (no '__'), at most "
            f"{MCP_SERVER_NAME_LENGTH} characters: its tools are offered as '<name>__<tool>'"
        )
    if name == NOTEBOOK_MCP_NAME:
        return f"{NOTEBOOK_MCP_NAME!r} is the name of this server's own notebook tools"
    if not isinstance(entry, dict):
        return f"an entry is an object with a 'command' or a 'url', not {type(entry).__name__}"
    if ("command" in entry) == ("url" in entry):
        return "an entry has either a 'command' (stdio) or a 'url' (Streamable HTTP)"
    allowed = {"command", "env"} if "command" in entry else {"url", "headers"}
    unknown = sorted(set(entry) - allowed)
    if unknown:
        return f"unknown keys {unknown}; such an entry has {sorted(allowed)}"
    if "command" in entry:
        command = entry["command"]
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(part, str) and part for part in command)
        ):
            return "'command' is the program and its arguments, a non-empty list of strings"
        env = entry.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(key, str) and key and "=" not in key and isinstance(value, str)
            for key, value in env.items()
        ):
            return "'env' maps variable names to strings"
        return None
    url = entry["url"]
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
        return "'url' is the server's http:// or https:// address"
    headers = entry.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(key, str) and key and isinstance(value, str) for key, value in headers.items()
    ):
        return "'headers' maps header names to strings"
    return None


# The events a webhook may ask for.
WEBHOOK_EVENTS = (
    "run.succeeded",
    "run.failed",
    "run.cancelled",
    "run.interrupted",
    "input.requested",
)
WEBHOOK_FORMATS = ("standard", "slack")


def webhook_events_problem(events: Any) -> str | None:
    """What is wrong with a webhook's ``events``, or None."""
    if (
        not isinstance(events, list)
        or not events
        or not all(isinstance(event, str) and event in WEBHOOK_EVENTS for event in events)
    ):
        return f"'events' is a non-empty list of: {', '.join(WEBHOOK_EVENTS)}"
    return None


def webhook_entry_problem(entry: Any) -> str | None:
    """What is wrong with one ``webhooks`` entry, or None."""
    if not isinstance(entry, dict):
        return f"an entry is an object with a 'url', not {type(entry).__name__}"
    unknown = sorted(set(entry) - {"url", "events", "secret_env", "format"})
    if unknown:
        return f"unknown keys {unknown}; an entry has 'url', 'events', 'secret_env', 'format'"
    url = entry.get("url")
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
        return "'url' is an http:// or https:// address"
    problem = webhook_events_problem(entry.get("events"))
    if problem is not None:
        return problem
    if entry.get("format", "standard") not in WEBHOOK_FORMATS:
        return f"'format' is one of: {', '.join(WEBHOOK_FORMATS)}"
    secret_env = entry.get("secret_env")
    if entry.get("format", "standard") == "standard" and (
        not isinstance(secret_env, str) or not secret_env
    ):
        return "'secret_env' names the environment variable holding the signing secret"
    return None


def from_config(config: Config) -> Settings:
    """The settings a server would have with ``config`` (its ``c.AgentRuns`` section)."""

    # Traitlets applies a config section to the classes of that name.
    class AgentRuns(SettingsTraits, Configurable):
        pass

    return AgentRuns(config=config).read_settings()


def from_values(values: dict[str, Any]) -> Settings:
    """Settings from ``name: value`` pairs over the defaults (checked as configuration is)."""
    config = Config()
    for name, value in values.items():
        if name != "store_url_source" and name not in RESOLVED:
            config.AgentRuns[name] = list(value) if isinstance(value, tuple) else value
    return from_config(config)
