"""The jupyter_server extension: configuration, handlers, life cycle."""

from __future__ import annotations

import os

from jupyter_server._tz import utcnow
from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider
from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from tornado.ioloop import IOLoop

from .agents import load_agents
from .agents.acp import acp_agents
from .engine import Engine
from .handlers import default_handlers
from .handlers.base import say_once
from .notebook_tools import Kernels, NotebookAccess, NotebookTools
from .notebook_tools.document import DocumentPlace
from .notebook_tools.mcp import NotebookMCP, sdk_problem
from .notebook_tools.pages import PagePlace
from .sessions import SessionPaths
from .settings import SHARED_OWNER, Identity, Settings, SettingsTraits
from .store import Store, StoreRefused, StoreUnavailable, UnsafeStore, factory
from .tuning import SigintStop

# Run first by the notebooks' kernels (PYTHONSTARTUP): it loads %%agent.
KERNEL_STARTUP = os.path.join(os.path.dirname(__file__), "kernel", "startup.py")


def load_magics_in_kernels(session_manager: object) -> None:
    """Have the kernels started for notebooks run :data:`KERNEL_STARTUP` first.

    Through the session manager's ``get_kernel_env`` (the environment of a
    notebook's kernel): PYTHONSTARTUP names the startup file, which then runs
    the person's own (kept in ``AGENTRUNS_PYTHONSTARTUP``). Terminals and the
    server itself keep their environment.
    """
    kernel_env = getattr(session_manager, "get_kernel_env", None)
    if kernel_env is None:
        return  # a session manager without it: %load_ext jupyter_agentruns still works

    def with_startup(*args: object, **kwargs: object) -> dict[str, str]:
        env = dict(kernel_env(*args, **kwargs))
        own = env.get("PYTHONSTARTUP")
        if own and own != KERNEL_STARTUP:
            env["AGENTRUNS_PYTHONSTARTUP"] = own
        env["PYTHONSTARTUP"] = KERNEL_STARTUP
        return env

    session_manager.get_kernel_env = with_startup  # type: ignore[attr-defined]


class AgentRuns(ExtensionApp, SettingsTraits):
    """Durable, resumable agent runs owned by the Jupyter server."""

    name = "jupyter_agentruns"
    load_other_extensions = True

    @property
    def agentruns_settings(self) -> Settings:
        """The ``c.AgentRuns.*`` settings, as read now."""
        return self.read_settings()

    def open_store(self, migrate: bool = True) -> Store:
        """The store configured (see ``store.factory.open_store``)."""
        return factory.open_store(self.agentruns_settings, migrate=migrate)

    def _identity(self) -> Identity:
        """How the server knows who sends a request (for owner_mode 'auto')."""
        assert self.serverapp is not None  # an extension is loaded by its server
        provider = type(self.serverapp.identity_provider)
        return "token" if provider in (IdentityProvider, PasswordIdentityProvider) else "users"

    def initialize_settings(self) -> None:
        assert self.serverapp is not None  # an extension is loaded by its server
        self.engine: Engine | None = None
        self.startup_error: str | None = None
        settings = Settings.resolve(self, os.environ, self._identity())
        agents, failures = load_agents(
            settings.agents, self.log, parent=self, mcp_servers=settings.mcp_servers
        )
        # ACP agents get what they need of the server from here: its root,
        # and its contents manager for the files they write (JupyterLab sees them).
        acp, acp_failures, self.agent_processes = acp_agents(
            settings.acp_agents,
            root_dir=self.serverapp.root_dir,
            contents_manager=self.serverapp.contents_manager,
            max_processes=settings.max_agent_processes,
            idle_seconds=settings.acp_idle_seconds,
            log=self.log,
        )
        for name in acp:
            failures.pop(name, None)
        agents.update(acp)
        failures.update(acp_failures)
        notebook, self.notebook_mcp, mcp_problem = self._notebook_tools(settings)
        # Open pages make the edits of the notebooks they hold, where the tools exist.
        pages = PagePlace() if notebook.available else None
        if pages is not None:
            notebook.tools.places.add(pages)
            # A notebook changed in its file (no page held it then): the pages holding it now
            # read it again (one may have loaded it just before, its link not up yet).
            notebook.tools.places.file.saved.append(pages.file_saved)
        try:
            self.engine = Engine(
                parent=self,
                settings=settings,
                store=factory.open_store(settings),
                agents=agents,
                agent_failures=failures,
                on_activity=self._record_activity,
                sessions=SessionPaths(self.serverapp.root_dir),
                notebook=notebook,
                agent_stderr=self.agent_processes.stderr_lines if self.agent_processes else None,
                link_url=self.serverapp.connection_url,
            )
        except UnsafeStore as exc:
            self.startup_error = str(exc)
            self.log.error("agentruns: %s", self.startup_error)
        except Exception as exc:
            # The server goes on (and stops cleanly); the API answers 503 saying why.
            self.startup_error = (
                f"the agentruns store at {factory.location(settings)} cannot be opened: "
                f"{type(exc).__name__}: {factory.without_secrets(settings, str(exc))}"
            )
            self.log.error("agentruns: %s", self.startup_error)
        # Handlers read the settings from the engine; these they need without one
        # (a store that cannot open still answers, and reads bodies to their limit).
        self.settings.update(
            {
                "agentruns_engine": self.engine,
                "agentruns_startup_error": self.startup_error,
                "agentruns_max_body_bytes": settings.max_body_bytes,
                "agentruns_api_url": url_path_join(self.serverapp.base_url, "api/agentruns"),
                "agentruns_mcp": self.notebook_mcp,
                "agentruns_mcp_problem": mcp_problem,
                "agentruns_pages": pages,
                "agentruns_notebook_access": notebook,
            }
        )
        # The runs panel opens a run's notebook: a kernel knows it by its path
        # on disk, the file browser by its path under the root, which
        # Notebook 7's pages do not carry (JupyterLab's do, as serverRoot).
        if settings.kernel_magics:
            load_magics_in_kernels(self.serverapp.session_manager)
        if settings.default_agent and settings.default_agent not in agents:
            self.log.warning(
                "agentruns: default_agent %r is not an agent of this server (%s): %%%%agent "
                "without a name will be refused",
                settings.default_agent,
                ", ".join(sorted(agents)) or "none",
            )
        page_config = self.serverapp.web_app.settings.setdefault("page_config_data", {})
        page_config["agentrunsServerRoot"] = os.path.abspath(self.serverapp.root_dir).replace(
            os.sep, "/"
        )
        serverapp = self.serverapp

        def stop(sig: int) -> None:
            serverapp.log.critical("received signal %s, stopping", sig)
            serverapp.stop(from_signal=True)

        # Set once the server's own handlers are (its event loop runs).
        self._sigint = SigintStop(stop)
        IOLoop.current().add_callback(self._sigint.install)
        if self.engine is not None:
            # Started as soon as the server's event loop runs (every jupyter_server
            # version; not only those that call _start_jupyter_server_extension):
            # runs a crash left unfinished are swept without waiting for a request.
            IOLoop.current().add_callback(self._start_engine)
            served = settings.owners_served
            self.log.info(
                "agentruns: store %s, owner mode %s, agents: %s, takes over the runs of %s",
                self.engine.store.describe(),
                settings.owner_mode,
                ", ".join(sorted(agents)) or "none",
                "every owner"
                if served is None
                else "its one owner"
                if served == {SHARED_OWNER}
                else ", ".join(sorted(served)),
            )

    def _notebook_tools(self, settings: Settings) -> tuple[NotebookAccess, object, str | None]:
        """The notebook tools over this server's kernels, and their MCP server (if its SDK is installed)."""
        serverapp = self.serverapp
        assert serverapp is not None  # set when the server loads the extension, before this
        tools = NotebookTools(
            Kernels(
                serverapp.kernel_manager, serverapp.session_manager, serverapp.contents_manager
            ),
            approval=settings.notebook_tools_approval,
            max_event_bytes=settings.max_event_bytes,
            edits=settings.notebook_edits,
        )
        collaboration = self._collaboration()
        if collaboration is not None:
            # Its documents are first: an edit made there shows in every open page at once.
            tools.places.add(DocumentPlace(collaboration.get_document, self.log))
            self.log.info("agentruns: notebook edits go to the live documents of open notebooks")
        problem = sdk_problem()
        access = NotebookAccess(
            tools,
            owner_mode=settings.owner_mode,
            hub_user=settings.hub_user,
            mcp_url=lambda: url_path_join(serverapp.connection_url, "api/agentruns/mcp"),
            mcp_problem=problem,
        )
        return access, None if problem is not None else NotebookMCP(access), problem

    def _collaboration(self):
        """jupyter-collaboration's server extension (``jupyter_server_ydoc``), when it is enabled.

        Looked up among the server's extensions, never imported: it is linked
        (its configuration read) before any extension loads, and its documents
        are asked for only once the server runs.
        """
        assert self.serverapp is not None  # set when the server loads the extension
        apps = self.serverapp.extension_manager.extension_apps.get("jupyter_server_ydoc") or ()
        for app in apps:
            if not getattr(app, "disable_rtc", False) and hasattr(app, "get_document"):
                return app
        return None

    def _record_activity(self) -> None:
        # Any ServerApp setting ending in _last_activity feeds last_activity(),
        # which idle culling reads: a live run keeps the server busy (but a
        # resumable one waiting past waiting_activity_seconds: see Engine.busy).
        if self.current_activity():
            assert self.serverapp is not None  # an extension is loaded by its server
            self.serverapp.web_app.settings["agentruns_last_activity"] = utcnow()

    def initialize_handlers(self) -> None:
        self.handlers.extend(default_handlers)

    async def _start_engine(self) -> None:
        assert self.engine is not None  # only scheduled with an engine
        try:
            await self.engine.start()
        except StoreRefused as exc:
            say_once(self.log, exc)
        except StoreUnavailable as exc:
            self.log.warning("agentruns: %s; the next request tries again", exc)
        except Exception:
            # Requests try again (the store may be locked by another process for a while).
            self.log.exception("agentruns: starting failed; the next request tries again")

    def current_activity(self):
        """Live runs, so that shutdown_no_activity_timeout never stops a server mid-run."""
        engine = getattr(self, "engine", None)
        busy = engine.busy() if engine is not None else []
        return busy or None

    async def stop_extension(self) -> None:
        sigint = getattr(self, "_sigint", None)
        if sigint is not None:
            sigint.restore()
        engine = getattr(self, "engine", None)
        if engine is not None:
            await engine.stop()
        processes = getattr(self, "agent_processes", None)
        if processes is not None:
            await processes.close()
        notebook_mcp = getattr(self, "notebook_mcp", None)
        if notebook_mcp is not None:
            await notebook_mcp.close()
