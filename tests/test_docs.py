"""The documentation: its examples run as written, and its reference misses nothing.

The reference pages are generated from the code when the site is built
(docs/_ext/agentruns_reference.py, and agentruns_api.py from the docstrings);
these tests call the generators themselves, without Sphinx (``bash scripts/docs``
builds the site).
"""

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest
from jupyter_server.extension.application import ExtensionApp
from prometheus_client import REGISTRY
from traitlets.config import Configurable

import jupyter_agentruns
from jupyter_agentruns import executor, lifecycle
from jupyter_agentruns.agents.openai.agent import OpenAIAgent
from jupyter_agentruns.agents.tools import describe_tool
from jupyter_agentruns.app import AgentRuns
from jupyter_agentruns.cli import build_parser
from jupyter_agentruns.kernel import widget
from jupyter_agentruns.settings import SettingsTraits

from conftest import all_events, submit, wait_run

# The docs' examples run on the default store: the stores are the other tests'.
pytestmark = pytest.mark.sqlite_only

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
sys.path.insert(0, str(DOCS / "_ext"))
import agentruns_api as api_reference  # noqa: E402
import agentruns_reference as reference  # noqa: E402


def python_block_after(text: str, marker: str) -> str:
    """The first Python block after ``marker``, or the one that ``marker`` begins."""
    start = text.index(marker)
    opening = text.rfind("```python\n", 0, start)
    if opening != -1 and text.rfind("```", 0, start) == opening:  # the marker is in it
        start = opening
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def page(name: str) -> str:
    return (DOCS / name).read_text()


# The README -----------------------------------------------------------------


def test_the_readme_starts_with_the_two_commands_and_fits_on_a_page():
    assert README.startswith(
        "# jupyter_agentruns\n\n```bash\n"
        "bash scripts/lab    # JupyterLab with the extension, "
        "opened on a copy of notebooks/quickstart.ipynb in workspace/\n"
        "bash scripts/test   # installs what the tests need (.venv, Chromium) and runs them\n"
        "```\n"
    )
    assert README.count("\n") <= 200


def test_every_link_of_the_readme_and_the_pages_leads_to_a_file():
    links = [(ROOT, target) for target in re.findall(r"\]\(([^)#\s]+)\)", README)]
    for path in DOCS.rglob("*.md"):
        links += [(path.parent, t) for t in re.findall(r"\]\(([^)#\s:]+)\)", path.read_text())]
    for base, target in links:
        if "://" not in target:
            assert (base / target).exists(), f"{base}: {target}"


def test_every_image_of_the_pages_is_one_the_built_site_copies_and_exists():
    """Sphinx copies the images of Markdown and of {image}, never those of raw HTML:
    an <img> in a page is missing from the built site, and the build does not say so."""
    shown = 0
    for path in DOCS.rglob("*.md"):
        if "_build" in path.parts or "generated" in path.parts:
            continue
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks
        text = re.sub(r"`[^`\n]*`", "", text)  # inline code
        assert not re.search(r"<img\b", text, re.I), f"{path}: a raw HTML <img>"
        for target in re.findall(r"^```\{(?:image|figure)\} (\S+)$", path.read_text(), re.M):
            assert (path.parent / target).is_file(), f"{path}: {target}"
            shown += 1
    assert shown >= 1


def test_the_site_build_finds_an_image_its_pages_show_but_it_does_not_have(tmp_path):
    import agentruns_images

    (tmp_path / "_images").mkdir()
    (tmp_path / "_images" / "panel.png").write_bytes(b"png")
    (tmp_path / "tutorials").mkdir()
    (tmp_path / "tutorials" / "first-run.html").write_text(
        '<p><img alt="kept" src="../_images/panel.png"/>'
        '<img src="https://example.org/a.png"><img src="data:image/png;base64,AA=="></p>'
        '<img alt="raw" src="../panel.png" width="250">'
    )
    assert agentruns_images.missing_images(tmp_path) == ["tutorials/first-run.html: ../panel.png"]


# The reference misses nothing -----------------------------------------------


def test_every_function_the_paths_of_how_it_works_name_is_where_they_say():
    """The "Where to look" section names a module, then what is in it: each must be there."""
    page = (DOCS / "explanation" / "how-it-works.md").read_text()
    section = page.split("## Where to look", 1)[1]
    package = ROOT / "jupyter_agentruns"
    named = re.findall(r"`([\w/]+\.py)`\s+`([\w.]+)`", section)
    assert len(named) >= 15, named
    for module, name in named:
        source = (package / module).read_text()
        for part in name.split("."):
            assert re.search(rf"^\s*(async def|def|class) {part}\b", source, re.M), (
                f"how-it-works names {module} {name}: no {part} there"
            )


def test_every_setting_has_its_entry_with_default_and_help():
    text = reference.settings_markdown()
    ours = {
        "AgentRuns": reference.own_traits(AgentRuns, ExtensionApp),
        "OpenAIAgent": reference.own_traits(OpenAIAgent, Configurable),
    }
    assert set(SettingsTraits.class_traits(config=True)) <= set(ours["AgentRuns"])
    assert "base_url" in ours["OpenAIAgent"] and "log_level" not in ours["AgentRuns"]
    for owner, traits in ours.items():
        for name, trait in traits.items():
            entry = text.split(f"`c.{owner}.{name}` ·", 1)
            assert len(entry) == 2, f"c.{owner}.{name}"
            first_line, rest = entry[1].split("\n", 1)
            assert "default:" in first_line, f"c.{owner}.{name}"
            assert trait.help and rest.strip().startswith(reference.escape(trait.help)[:20])


def test_every_command_and_option_has_its_entry():
    text = reference.cli_markdown()
    parser = build_parser()
    [commands] = [a for a in parser._actions if a.dest == "command"]
    for name, sub in commands.choices.items():
        section = text.split(f"### `jupyter agentruns {name}`", 1)
        assert len(section) == 2, name
        section = section[1].split("\n### ", 1)[0]
        for action in sub._actions:
            if action.help in (None,) and not action.option_strings:
                continue
            if action.dest in ("help", "read_timeout"):  # argparse's own; a hidden one
                continue
            shown = action.option_strings[-1] if action.option_strings else action.metavar
            assert f"`{shown}" in section or f", {shown}" in section, (name, shown)


def test_every_endpoint_has_its_entry():
    text = reference.rest_markdown()
    served = reference.endpoints()
    assert ("POST", "/runs") in served and ("GET", "/runs/{run_id}/events") in served
    for method, path in served:
        assert f"### `{method} {path.lstrip('/')}`" in text, (method, path)


def test_every_metric_has_its_entry():
    text = reference.metrics_markdown()
    names = {
        metric.name + ("_total" if metric.type == "counter" else "")
        for metric in REGISTRY.collect()
        if metric.name.startswith("agentruns_")
    }
    assert len(names) >= 18
    for name in names:
        assert f"### `{name}`" in text, name


def test_every_event_type_has_its_entry():
    table = page("reference/events.md")
    source = "\n".join(p.read_text() for p in Path(jupyter_agentruns.__file__).parent.rglob("*.py"))
    types = set(re.findall(r'"((?:run|input)\.[a-z_]+)"', source))
    types |= executor.AGENT_EVENT_TYPES | set(lifecycle.TERMINAL_EVENTS)
    assert {"run.resumed", "plan.updated", "input.resolved"} <= types
    for type in types:
        assert f"| `{type}` |" in table, type


def headings(text: str) -> set[str]:
    return set(re.findall(r"^#+ `([^`]+)`$", text, re.M))


def test_every_name_a_notebook_imports_has_its_entry():
    notebook = headings(api_reference.notebook_api_markdown())
    agent = headings(api_reference.agent_api_markdown())
    for name in set(jupyter_agentruns.__all__) - {"__version__"}:
        assert f"jupyter_agentruns.{name}" in (agent if name == "agent" else notebook), name
    members = {name for name in vars(jupyter_agentruns.Run) if not name.startswith("_")}
    assert {"wait", "cancel", "answer", "done", "status", "record"} <= members
    for name in members - api_reference.VIEW_STATE:
        assert f"run.{name}" in notebook, name
    assert "jupyter_agentruns.submit(\n    agent: str,\n" in api_reference.notebook_api_markdown()


def test_everything_an_agent_is_given_has_its_entry():
    text = api_reference.agent_api_markdown()
    shown = headings(text)
    from jupyter_agentruns import agents

    for name in set(agents.__all__) - api_reference.SERVER_SIDE:
        assert {f"jupyter_agentruns.agents.{name}", f"jupyter_agentruns.{name}"} & shown, name
    # What the run an agent really gets offers, methods and attributes alike.
    offered = api_reference.agent_run_names()
    assert {"text", "ask", "cancelled", "run_id", "notebook_tools", "checkpoint"} <= offered
    for name in offered:
        assert f"run.{name}" in shown, name
    assert "await run.ask(\n    title: str," in text


@pytest.fixture
def bare_module(tmp_path, monkeypatch):
    (tmp_path / "bare_api.py").write_text(
        "import traitlets\n\n\n"
        "class Bare(traitlets.HasTraits):\n"
        '    """Documented itself."""\n\n'
        "    size = traitlets.Int(0)\n"
        "    name: str\n\n"
        "    async def go(self) -> None:\n"
        "        pass\n\n"
        "    def stop(self) -> None:\n"
        '        """Documented."""\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "bare_api.Bare"
    sys.modules.pop("bare_api", None)


def test_a_public_member_without_a_docstring_fails_the_reference(bare_module):
    members = [api_reference.member(bare_module), *api_reference.class_members(bare_module, "b")]
    assert [m.path for m in members] == ["bare_api.Bare", "b.size", "b.name", "b.go", "b.stop"]
    with pytest.raises(api_reference.Undocumented) as caught:
        api_reference.page([("Bare", members)])
    assert str(caught.value).endswith(": bare_api.Bare.size, bare_api.Bare.name, bare_api.Bare.go")


def test_a_method_of_the_run_that_its_protocol_does_not_describe_fails_the_reference(
    bare_module, monkeypatch
):
    monkeypatch.setattr(api_reference, "AGENT_RUN_IMPLEMENTATION", bare_module)
    with pytest.raises(api_reference.Undocumented, match="offers go, name, size, stop"):
        api_reference.agent_api_markdown()


# The examples run -----------------------------------------------------------


@pytest.fixture
def docs_agents(tmp_path, monkeypatch):
    code = python_block_after(page("how-to/write-an-agent.md"), "# my_agents.py")
    assert code.startswith("# my_agents.py")
    (tmp_path / "my_agents.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_agents", None)


@pytest.fixture
def agentruns_config(docs_agents):
    return {"agents": {"counter": "my_agents:counter"}}


async def test_the_guides_agent_runs_as_documented(api):
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


@pytest.fixture
def notebook(api_url, token, monkeypatch):
    """Runs a page's notebook code against this test's server; returns what it printed."""
    # Outside a kernel the code finds the server as a script does: AGENTRUNS_URL and _TOKEN.
    monkeypatch.setenv("AGENTRUNS_URL", api_url.removesuffix("api/agentruns/"))
    monkeypatch.setenv("AGENTRUNS_TOKEN", token)
    monkeypatch.setattr(widget, "_clients", {})  # found once a process: this test's server
    printed: list[str] = []
    namespace = {"print": lambda *args: printed.append(" ".join(map(str, args)))}

    async def run(*blocks: str) -> list[str]:
        for code in blocks:  # on a thread: the server answers on this one
            await asyncio.wait_for(asyncio.to_thread(exec, code, namespace), 60)
        return printed

    run.namespace = namespace
    return run


async def test_the_readmes_notebook_lines_run_against_a_server(notebook):
    code = python_block_after(README, "## In a notebook")
    assert code.startswith("from jupyter_agentruns import submit\n")
    printed = await notebook(code)
    assert notebook.namespace["run"].status == "succeeded"
    assert printed and printed[0].startswith("## Demo answer about weather in Shanghai")


async def test_the_tutorials_question_is_asked_and_answered_from_the_kernel(notebook):
    tutorial = page("tutorials/asking-a-person.md")
    ask = python_block_after(tutorial, 'run = submit("demo"')
    answer = python_block_after(tutorial, "## Answer")
    printed = await notebook(ask, answer)
    assert printed == ["Write the answer about deploy?", "succeeded"]
    [question] = notebook.namespace["run"].run["snapshot"]["inputs"]
    assert question["choice"] == "approve" and question["note"] == "go ahead"


async def test_the_refresh_tutorials_slow_run_starts_as_described(notebook):
    code = python_block_after(page("tutorials/refresh-restart-reopen.md"), "## Refresh the page")
    assert '"chunks": 400, "delay": 0.3' in code  # two minutes: long enough to refresh during it
    printed = await notebook(
        code,
        "print(run.refresh()['status'], run.run['input'])",
        "run.cancel(); print(run.wait(timeout=30).status)",
    )
    assert printed[0] in (
        "queued {'prompt': 'weather in Shanghai', 'chunks': 400, 'delay': 0.3}",
        "running {'prompt': 'weather in Shanghai', 'chunks': 400, 'delay': 0.3}",
    )
    assert printed[1] == "cancelled"


async def test_the_rest_walkthrough_runs_with_curl(api, api_url, token):
    """docs/how-to/rest.md's commands, run by bash and curl against this test's server."""
    setup, *steps = re.findall(r"```bash\n(.*?)```", page("how-to/rest.md"), re.S)
    assert "API=http://127.0.0.1:8888/api/agentruns\n" in setup
    assert 'AUTH="Authorization: token $TOKEN"' in setup
    script = "\n".join(
        [
            # The first block's variables, for this test's server.
            f"API={api_url.removesuffix('/')}",
            f'AUTH="Authorization: token {token}"',
            # A stream goes on until Ctrl-C: here until three seconds have passed.
            'curl() { command curl --max-time 3 "$@"; }',
            *(f"{step}\necho '~~~'" for step in steps),
        ]
    )
    shell = await asyncio.create_subprocess_exec(
        "bash", "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(shell.communicate(), 60)
    assert shell.returncode == 0, stderr.decode()
    submitted, stream, resumed, read, cancelled, _ = stdout.decode().split("~~~\n")
    body, status = submitted.strip().rsplit("\n", 1)
    assert status == "201" and json.loads(body)["status"] == "queued"
    run_id = json.loads(body)["run_id"]
    assert stream.startswith("retry: 1000\n\nid: 1\nevent: run.started\ndata: {")
    assert f'"run_id":"{run_id}","seq":1,"type":"run.started"' in stream
    assert resumed.startswith("retry: 1000\n\nid: 8\n"), resumed[:200]
    assert json.loads(read)["run_id"] == run_id and json.loads(read)["status"] == "running"
    answer, status, after = cancelled.strip().split("\n")
    assert status == "202" and json.loads(answer)["status"] in ("cancelling", "cancelled")
    assert json.loads(answer)["cancel"]["reason"] == "enough"
    assert json.loads(after)["status"] in ("cancelling", "cancelled")
    run = await wait_run(api, run_id)
    assert run["status"] == "cancelled" and run["cancel"]["reason"] == "enough"


def test_the_tools_tutorials_function_is_a_tool_as_described(tmp_path):
    code = python_block_after(page("tutorials/tools.md"), "# my_tools.py")
    namespace: dict = {}
    exec(compile(code, str(tmp_path / "my_tools.py"), "exec"), namespace)
    tool = describe_tool("get_weather", namespace["get_weather"])
    assert tool.description == "The current weather in a city."
    assert tool.parameters["required"] == ["city"]
    assert tool.parameters["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
    assert namespace["get_weather"]("Shanghai")["city"] == "Shanghai"


def test_every_configuration_the_pages_show_is_one_the_server_takes(tmp_path, monkeypatch):
    from traitlets.config import Config

    # The tools the pages register, as the tools tutorial writes them.
    (tmp_path / "my_tools.py").write_text(
        python_block_after(page("tutorials/tools.md"), "# my_tools.py")
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_tools", raising=False)

    from jupyter_agentruns.settings import from_config

    pages = [README, *(path.read_text() for path in sorted(DOCS.rglob("*.md")))]
    blocks = [
        block
        for text in pages
        for block in re.findall(r"```python\n(.*?)```", text, re.S)
        if re.search(r"^c\.(AgentRuns|OpenAIAgent)\.", block, re.M)
        and "c.JupyterHub" not in block
        and "c.Spawner" not in block
    ]
    assert len(blocks) >= 8
    try:
        for block in blocks:
            config = Config()
            exec(block, {"c": config})
            for owner, cls, base in (
                ("AgentRuns", AgentRuns, ExtensionApp),
                ("OpenAIAgent", OpenAIAgent, Configurable),
            ):
                unknown = set(config[owner]) - set(reference.own_traits(cls, base))
                assert not unknown, (owner, unknown, block)
            from_config(config)  # each value as the server checks it
            OpenAIAgent(config=config)
    finally:
        sys.modules.pop("my_tools", None)
