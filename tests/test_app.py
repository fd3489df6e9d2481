"""The extension as jupyter_server sees it: name, configuration, auto-enable file."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets import TraitError
from traitlets.config import Config

from jupyter_agentruns import _jupyter_server_extension_points
from jupyter_agentruns.app import AgentRuns
from jupyter_agentruns.store import UnsafeStore

from conftest import submit
from servers import ServerProcess

ROOT = Path(__file__).parent.parent

# The configuration table of the design contract: name -> default.
DOCUMENTED = {
    "owner_mode": "auto",
    "agents": {},
    "idempotency_ttl_seconds": 86400,
    "event_retention_seconds": 86400,
    "max_retained_events": 100000,
    "run_retention_seconds": 2592000,
    "max_active_runs_per_user": 8,
    "max_streams_per_user": 64,
    "heartbeat_interval": 15,
    "write_timeout_seconds": 30,
    "lease_seconds": 30,
    "max_body_bytes": 1048576,
    "max_event_bytes": 262144,
    "max_run_seconds": 86400,
    "sqlite_synchronous": "FULL",
    "freeze_gc_at_start": True,
    "gil_switch_interval": 0.001,
    "store_url": "",
    "max_resume_attempts": 3,
}


def test_the_extension_point_names_the_agentruns_app():
    (point,) = _jupyter_server_extension_points()
    assert point == {"module": "jupyter_agentruns", "app": AgentRuns}
    assert AgentRuns.name == "jupyter_agentruns"


def test_every_documented_setting_is_configurable_with_its_default():
    traits = AgentRuns.class_traits(config=True)
    for name, default in DOCUMENTED.items():
        assert name in traits, name
        assert traits[name].default() == default, name
    assert "db_path" in traits


def test_the_default_database_is_in_the_jupyter_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("AGENTRUNS_STORE_URL", raising=False)
    assert AgentRuns().db_path == str(tmp_path / "agentruns.sqlite3")
    assert AgentRuns().store_url == ""


def test_the_store_url_comes_from_the_environment_and_must_be_postgresql(monkeypatch):
    monkeypatch.setenv("AGENTRUNS_STORE_URL", "postgresql://me@db:5432/runs")
    assert AgentRuns().store_url == "postgresql://me@db:5432/runs"
    with pytest.raises(UnsafeStore) as refused:
        AgentRuns(store_url="mysql://me:s3cret@db/runs").open_store()
    assert "postgresql://" in str(refused.value) and "s3cret" not in str(refused.value)


@pytest.mark.parametrize("value", [-0.001, 2.0, float("nan"), float("inf")])
def test_a_gil_switch_interval_out_of_range_is_refused_with_its_name(value):
    with pytest.raises(TraitError) as refused:
        AgentRuns(gil_switch_interval=value)
    assert "gil_switch_interval" in str(refused.value)


@pytest.mark.own_store
@pytest.mark.parametrize(
    "agentruns_config", [{"store_url": "postgresql://me:s3cret@127.0.0.1:9/runs"}]
)
async def test_a_database_that_cannot_be_reached_at_start_answers_503_without_its_password(
    api, jp_serverapp
):
    response = await submit(api)
    assert response.status_code == 503 and response.json()["error"] == "store_unavailable"
    assert response.headers["Retry-After"] == "5"  # it may come up: the next request tries again
    assert "runs at 127.0.0.1 port 9 as me" in response.json()["message"]
    assert "s3cret" not in response.text
    assert (await api.get("runs")).status_code == 503


@pytest.mark.own_store
@pytest.mark.parametrize("agentruns_config", [{"store_url": "postgresql://me@127.0.0.1/runs"}])
async def test_postgresql_without_its_driver_says_which_extra_to_install(without_psycopg, api):
    response = await submit(api)
    assert response.status_code == 503
    assert "jupyter_agentruns[postgres]" in response.json()["message"]


@pytest.fixture
def without_psycopg(monkeypatch):
    import jupyter_agentruns.store.postgres as postgres

    monkeypatch.setattr(postgres, "psycopg", None)


def test_the_shipped_config_enables_the_extension():
    config = json.loads(
        (ROOT / "jupyter-config/jupyter_server_config.d/jupyter_agentruns.json").read_text()
    )
    assert config == {"ServerApp": {"jpserver_extensions": {"jupyter_agentruns": True}}}


def test_the_settings_reference_has_every_setting():
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    from agentruns_reference import settings_markdown

    reference = settings_markdown()
    for name in [*DOCUMENTED, "db_path"]:
        assert f"`c.AgentRuns.{name}`" in reference, name


@pytest.mark.parametrize(
    "agentruns_config",
    [{"agents": {"broken": "no_such_module:agent", "typo": "agents_for_tests:no_such_attr"}}],
)
async def test_an_agent_that_cannot_be_loaded_costs_only_itself(api):
    agents = [a["name"] for a in (await api.get("agents")).json()["agents"]]
    assert "demo" in agents and "broken" not in agents and "typo" not in agents
    response = await submit(api, agent="broken")
    assert response.status_code == 404 and response.json()["error"] == "unknown_agent"
    assert "No module named 'no_such_module'" in response.json()["message"]
    assert "no_such_attr" in (await submit(api, agent="typo")).json()["message"]
    assert (await submit(api)).status_code == 201  # the others work


@pytest.mark.timeout(90)
def test_the_server_log_has_the_extensions_lines_in_the_servers_format(tmp_path):
    server = ServerProcess(
        tmp_path / "home",
        tmp_path / "agentruns.sqlite3",
        {"agents": {"broken": "no_such_module:agent"}},
    )
    server.start()
    try:
        log = server.log_tail(500)
    finally:
        server.kill()
    assert re.search(
        r"\[I [\d-]+ [\d:.]+ AgentRuns\] agentruns: store SQLite .*agentruns\.sqlite3, "
        r"owner mode shared, agents: demo",
        log,
    )
    assert re.search(
        r"\[E [\d-]+ [\d:.]+ AgentRuns\] agentruns: cannot load the agent 'broken' "
        r"from no_such_module:agent: ModuleNotFoundError",
        log,
    )


@pytest.mark.timeout(90)
def test_a_store_that_cannot_be_opened_answers_503_and_the_server_stops_on_the_first_sigterm(
    tmp_path,
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    server = ServerProcess(tmp_path / "home", blocker / "agentruns.sqlite3").start(ready_status=503)
    try:
        with server.client() as client:
            response = client.post("runs", json={"agent": "demo", "input": {"prompt": "p"}})
            assert response.status_code == 503 and response.json()["error"] == "store_unavailable"
            assert "cannot be opened" in response.json()["message"]
        assert server.terminate(timeout=20) == 0
    finally:
        server.kill()
    assert "cannot be opened" in server.log_tail(200)


async def test_the_startup_heap_is_frozen_while_the_engine_runs_and_thawed_at_its_stop(
    api, jp_serverapp, engine, monkeypatch
):
    import gc

    from jupyter_agentruns.engine import Engine

    await engine.start()
    assert gc.get_freeze_count() > 0  # the server's objects at start: out of full collections
    app = jp_serverapp.extension_manager.extension_points["jupyter_agentruns"].app
    other = Engine(
        parent=app, settings=engine.settings, store=app.open_store(), agents=engine.agents
    )
    await other.start()
    await other.stop()
    assert gc.get_freeze_count() == 0  # a stopped engine gives them back to the collector
    other = Engine(
        parent=app,
        settings=engine.settings.replace(freeze_gc_at_start=False),
        store=app.open_store(),
        agents=engine.agents,
    )
    await other.start()
    assert gc.get_freeze_count() == 0
    await other.stop()


async def test_the_gil_switch_interval_is_set_while_the_engine_runs_and_given_back_at_its_stop(
    api, jp_serverapp, engine, monkeypatch
):
    import sys

    from jupyter_agentruns.engine import Engine

    await engine.start()
    assert sys.getswitchinterval() == pytest.approx(0.001)  # the default while it runs
    app = jp_serverapp.extension_manager.extension_points["jupyter_agentruns"].app
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        other = Engine(
            parent=app,
            settings=engine.settings.replace(gil_switch_interval=0.002),
            store=app.open_store(),
            agents=engine.agents,
        )
        await other.start()
        assert sys.getswitchinterval() == pytest.approx(0.002)
        await other.stop()
        assert sys.getswitchinterval() == pytest.approx(0.004)  # what it was before
        other = Engine(
            parent=app,
            settings=engine.settings.replace(gil_switch_interval=0.0),  # 0: left alone
            store=app.open_store(),
            agents=engine.agents,
        )
        await other.start()
        assert sys.getswitchinterval() == pytest.approx(0.004)
        await other.stop()
    finally:
        sys.setswitchinterval(before)


def test_sigint_stops_the_server_only_where_it_has_pythons_default_handler():
    import signal

    from jupyter_agentruns.tuning import SigintStop

    before = signal.getsignal(signal.SIGINT)
    stopped: list[int] = []
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # no terminal's prompt
        sigint = SigintStop(stopped.append)
        sigint.install()
        signal.raise_signal(signal.SIGINT)
        assert stopped == [signal.SIGINT]  # a stop, not a KeyboardInterrupt
        sigint.restore()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        theirs = signal.SIG_IGN  # e.g. a terminal's own handler
        signal.signal(signal.SIGINT, theirs)
        SigintStop(stopped.append).install()
        assert signal.getsignal(signal.SIGINT) is theirs
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_settings_object_holds_every_configurable_setting():
    """A trait missing from Settings would be configurable and silently ignored."""
    import dataclasses

    from jupyter_agentruns.settings import RESOLVED, Settings, SettingsTraits

    configurable = set(SettingsTraits.class_trait_names(config=True))
    held = {field.name for field in dataclasses.fields(Settings)} - {"store_url_source"}
    assert configurable == held - RESOLVED
    assert configurable <= set(AgentRuns.class_trait_names(config=True))


def resolved(identity="token", environ=None, **configured):
    from jupyter_agentruns.settings import Settings

    return Settings.resolve(AgentRuns(**configured), environ or {}, identity)


def test_auto_is_the_shared_owner_mode_with_a_token_and_per_user_with_users():
    from jupyter_agentruns.settings import SHARED_OWNER

    shared = resolved("token")
    assert (shared.owner_mode, shared.owners_served, shared.hub_user) == (
        "shared",
        {SHARED_OWNER},
        None,
    )
    per_user = resolved("users")
    assert (per_user.owner_mode, per_user.owners_served) == ("per-user", None)  # every owner
    assert resolved("users", owner_mode="shared").owner_mode == "shared"
    assert resolved("token", owner_mode="per-user").owner_mode == "per-user"


def test_a_hub_users_server_serves_its_user_in_the_per_user_mode_only():
    hub = {"JUPYTERHUB_USER": "alice"}
    alices = resolved("users", hub)
    assert (alices.hub_user, alices.owners_served) == ("alice", {"alice"})
    assert resolved("token", hub, owner_mode="per-user").owners_served == {"alice"}
    shared = resolved("token", hub)  # the hub user is known; the runs are the one owner's
    assert shared.hub_user == "alice" and shared.owners_served == {"~shared"}
    unset = resolved("users", {"JUPYTERHUB_USER": ""})
    assert (unset.hub_user, unset.owners_served) == (None, None)


def test_served_owners_configured_win_over_the_environment_and_the_owner_mode():
    hub = {"JUPYTERHUB_USER": "alice"}
    assert resolved("users", hub, served_owners=["bob", "carol"]).owners_served == {"bob", "carol"}
    assert resolved("token", hub, served_owners="*").owners_served is None
    assert resolved("users", hub, served_owners="*").owners_served is None
    assert resolved("token", served_owners=["alice"]).owners_served == {"alice"}


def test_settings_read_without_a_server_leave_the_owners_to_it_and_a_copy_keeps_them():
    from jupyter_agentruns.settings import from_config

    offline = from_config(Config())
    assert (offline.owner_mode, offline.hub_user, offline.owners_served) == ("auto", None, None)
    alices = resolved("users", {"JUPYTERHUB_USER": "alice"}).replace(max_body_bytes=1000)
    assert (alices.max_body_bytes, alices.owners_served) == (1000, {"alice"})
    assert alices.replace(owners_served=None).owners_served is None


def loaded_agents(prelude: str = "") -> dict:
    """The agents a server loads at its start, and which SDKs that imported, in a fresh Python."""
    code = f"""{prelude}
import json, logging, sys
from jupyter_agentruns.agents import load_agents
from jupyter_agentruns.app import AgentRuns
agents, failures = load_agents({{}}, logging.getLogger())
sdks = sorted(m for m in ("openai", "mcp", "mcp_types") if sys.modules.get(m) is not None)
print(json.dumps({{"agents": sorted(agents), "failures": failures, "sdks": sdks}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_server_starts_without_importing_the_model_and_mcp_sdks():
    # Each costs most of a second of CPU at every start: they are imported at first use.
    loaded = loaded_agents()
    assert "openai" in loaded["agents"], loaded["failures"]
    assert loaded["sdks"] == []


def test_without_the_openai_package_its_agent_is_left_out_at_start_saying_so():
    loaded = loaded_agents("import sys; sys.modules['openai'] = None  # not installed")
    assert "openai" not in loaded["agents"] and "demo" in loaded["agents"]
    assert loaded["failures"]["openai"] == "ModuleNotFoundError: No module named 'openai'"
