"""The README's examples run as written."""

import re
import sys
from pathlib import Path

import pytest

from conftest import all_events, submit, wait_run

README = (Path(__file__).parent.parent / "README.md").read_text()


def python_block_after(marker: str) -> str:
    start = README.index(marker)
    return re.search(r"```python\n(.*?)```", README[start:], re.S).group(1)


@pytest.fixture
def readme_agents(tmp_path, monkeypatch):
    code = python_block_after("## Write an agent")
    assert code.startswith("# my_agents.py")
    (tmp_path / "my_agents.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_agents", None)


@pytest.fixture
def agentruns_config(readme_agents):
    return {"agents": {"counter": "my_agents:counter"}}


async def test_the_readme_agent_runs_as_documented(api):
    response = await submit(api, agent="counter", input={"to": 3})
    assert response.status_code == 201, response.text
    run = await wait_run(api, response.json()["run_id"])
    assert run["status"] == "succeeded" and run["output"] == {"counted": 3}
    assert run["snapshot"]["tools"][0]["result"] == [1, 2, 3]
    assert run["snapshot"]["messages"][0] == {
        "id": "m1",
        "role": "assistant",
        "text": "1 2 3 ",
        "done": True,
    }
    types = [e["type"] for e in await all_events(api, run["run_id"])]
    assert types[:4] == ["run.started", "tool.started", "tool.completed", "message.started"]
    bad = await submit(api, agent="counter", input={"to": 0})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_input"
