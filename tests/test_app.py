"""The extension as jupyter_server sees it: name, configuration, auto-enable file."""

import json
from pathlib import Path

from jupyter_agentruns import _jupyter_server_extension_points
from jupyter_agentruns.app import AgentRuns

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
    assert AgentRuns().db_path == str(tmp_path / "agentruns.sqlite3")


def test_the_shipped_config_enables_the_extension():
    config = json.loads((ROOT / "jupyter-config/jupyter_server_config.d/jupyter_agentruns.json").read_text())
    assert config == {"ServerApp": {"jpserver_extensions": {"jupyter_agentruns": True}}}


def test_the_readme_documents_every_setting():
    readme = (ROOT / "README.md").read_text()
    for name in [*DOCUMENTED, "db_path"]:
        assert f"`{name}`" in readme, name
