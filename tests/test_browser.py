"""End to end in a real Chromium against a real JupyterLab.

The widget survives refreshes and restarts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_agentruns.agents.demo import answer_words

from agents_for_tests import TEST_AGENTS
from conftest import picture
from servers import ServerProcess

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parent.parent / "test-artifacts"
MIME_TYPE = "application/vnd.jupyter.agentruns.run+json"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
        reason="Chromium is not installed (apt-get install chromium)",
    ),
]

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
# Every page's context: a person who asked for less motion (the views honour it). A working
# run's bar moving at sixty frames a second costs a tenth of a core in software drawing, for
# as long as the run works, which the other tests' servers and pages need on two cores.
CONTEXT = {"reduced_motion": "reduce"}


# These tests use no in-process server: pytest-jupyter's autouse event loop and
# cleanup would clash with the loop sync Playwright runs in this thread.
@pytest.fixture(autouse=True)
def jp_asyncio_loop():
    yield None


@pytest.fixture(autouse=True)
def jp_server_cleanup():
    yield


def write_notebook(path: Path, sources: list[str]) -> None:
    nb = new_notebook(
        cells=[new_code_cell(source) for source in sources],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    home = tmp_path_factory.mktemp("lab")
    state = tmp_path_factory.mktemp("acp-state")
    # The scripted ACP agent (two modes, two models), for the pickers beside a reply box.
    scripted = {
        "command": [sys.executable, str(Path(__file__).with_name("acp_agent.py"))],
        "env": {"ACP_TEST_STATE": str(state)},
        "initialize_timeout": 30,
    }
    server = ServerProcess(
        home,
        home / "agentruns.sqlite3",
        {
            "heartbeat_interval": 2,
            "max_active_runs_per_user": 20,
            "agents": TEST_AGENTS,
            "acp_agents": {"scripted": scripted},
        },
        app="jupyterlab",
        # The page's JupyterLab as window.jupyterapp: save() waits for its save to end.
        config={"LabApp": {"expose_app_in_browser": True}},
    ).start(timeout=120)
    yield server
    server.kill()


# One browser context for a module's pages, made at its first page: JupyterLab's
# scripts and styles load from its cache after the first test (a new context
# loads them all again, seconds of CPU a page). The extension keeps nothing in
# the browser's storage; each test still has a page of its own, closed after it.
_CONTEXTS: dict[int, Any] = {}


# How often a page's waits (``wait_for_function``) look. Playwright's default looks at
# every frame (requestAnimationFrame): a page waited on then draws sixty frames a second,
# CPU that the other tests' servers and pages need on two cores (three times an idle
# page's, measured), for a wait that a twentieth of a second more does not change.
WAIT_POLL_MS = 50


def poll_waits() -> None:
    """Make ``WAIT_POLL_MS`` the default polling of every page's ``wait_for_function``."""
    from playwright.sync_api import Page

    if getattr(Page.wait_for_function, "polls", False):
        return
    wait = Page.wait_for_function

    def wait_for_function(self, expression, *, arg=None, polling=None, timeout=None):
        polling = WAIT_POLL_MS if polling is None else polling
        return wait(self, expression, arg=arg, polling=polling, timeout=timeout)

    wait_for_function.polls = True
    Page.wait_for_function = wait_for_function


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    poll_waits()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        _CONTEXTS.pop(id(browser), None)
        browser.close()


@pytest.fixture
def page(browser, request):
    context = _CONTEXTS.get(id(browser))
    if context is None:
        context = _CONTEXTS[id(browser)] = browser.new_context(
            viewport={"width": 1280, "height": 900}, **CONTEXT
        )
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    page.close()


def open_notebook(page, lab: ServerProcess, name: str) -> None:
    page.goto(f"{lab.url}lab/tree/{name}?token={lab.token}&reset")
    wait_idle(page)


def wait_idle(page, timeout=90_000) -> None:
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout)
    page.wait_for_function(
        "() => (document.querySelector('#jp-main-statusbar') || {})"
        ".textContent?.includes('| Idle')",
        timeout=timeout,
    )


def run_cell(page, index: int) -> None:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")


def widget(page, index: int = 0):
    return page.locator(".agentruns-run").nth(index)


def wait_attr(page, index: int, name: str, predicate: str, timeout=60_000):
    """Wait until ``predicate`` (JS, over ``v``) holds for the widget's attribute ``name``."""
    page.wait_for_function(
        f"""() => {{
            const el = document.querySelectorAll('.agentruns-run')[{index}];
            if (!el) return false;
            const v = el.getAttribute('{name}');
            return {predicate};
        }}""",
        timeout=timeout,
    )
    return widget(page, index).get_attribute(name)


def wait_text(page, index: int, text: str, timeout=60_000) -> None:
    page.wait_for_function(
        """([index, text]) => {
            const el = document.querySelectorAll('.agentruns-run')[index];
            return !!el && el.innerText.includes(text);
        }""",
        arg=[index, text],
        timeout=timeout,
    )


def wait_answer(page, index: int, prompt: str, chunks: int, timeout=60_000) -> None:
    """The demo's whole answer shows, rendered as Markdown.

    Its heading, list and table, the prompt as given in its code block, and
    the paragraph that follows it when there are more chunks than its words.
    """
    text = "".join(answer_words(prompt, chunks))
    tail = text.rsplit("```\n", 1)[1].strip()
    page.wait_for_function(
        """([index, prompt, tail]) => {
            const run = document.querySelectorAll('.agentruns-run')[index];
            const answer = run && run.querySelector('.agentruns-message .agentruns-markdown');
            if (!answer) return false;
            const heading = answer.querySelector('h2');
            const code = answer.querySelector('pre code');
            return !!heading && heading.innerText === `Demo answer about ${prompt}`
                && answer.querySelectorAll('ul > li').length === 3
                && answer.querySelectorAll('table tr').length === 4
                && !!code && code.innerText.replace(/\\n$/, '') === prompt
                && answer.innerText.includes(tail);
        }""",
        arg=[index, prompt, tail],
        timeout=timeout,
    )


def save(page) -> None:
    """Save the notebook as a person does (Ctrl+S) and wait until the server has written it.

    A notebook that is not dirty shows no mark to wait for, and the contents manager
    writes the file in place: read before its save ends, the file can be half written.
    """
    page.evaluate(
        """() => {
            const context = window.jupyterapp?.shell.currentWidget?.context;
            window.agentrunsSaved = context?.saveState
                ? new Promise((resolve, reject) => {
                      const on = (_, state) => {
                          if (state === 'started') return;
                          context.saveState.disconnect(on);
                          if (state === 'completed') resolve();
                          else reject(new Error('the save failed'));
                      };
                      context.saveState.connect(on);
                      setTimeout(() => reject(new Error('no save within 30 s')), 30_000);
                  })
                : null;
        }"""
    )
    page.keyboard.press("Control+s")
    if page.evaluate(
        "() => window.agentrunsSaved ? window.agentrunsSaved.then(() => true) : false"
    ):
        return  # saved: live views may make it dirty again at once
    # A page that does not expose its JupyterLab (Notebook 7's): its tab's dirty mark.
    page.wait_for_function(
        "() => !document.querySelector("
        "'.jp-mod-current .jp-mod-dirty, .lm-TabBar-tab.jp-mod-current.jp-mod-dirty')",
        timeout=30_000,
    )


def runs_of(lab: ServerProcess) -> list[dict]:
    with lab.client() as client:
        return client.get("runs", params={"limit": 500}).json()["runs"]


def test_refresh_and_kernel_restart_reattach_to_the_one_run(lab, page):
    prompt = "refresh me"
    write_notebook(
        lab.home / "reattach.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            f'run = submit("demo", {{"prompt": "{prompt}", "chunks": 60, "delay": 0.08}})'
        ],
    )
    before = len(runs_of(lab))
    open_notebook(page, lab, "reattach.ipynb")
    started = time.monotonic()
    run_cell(page, 0)
    run_id = wait_attr(page, 0, "data-run-id", "v && v.startsWith('run_')")
    wait_attr(page, 0, "data-last-seq", "Number(v) >= 10")
    assert wait_attr(page, 0, "data-status", "v === 'running'") == "running"
    streaming = time.monotonic() - started

    save(page)
    page.reload()
    wait_idle(page)
    assert wait_attr(page, 0, "data-run-id", "!!v") == run_id
    wait_attr(page, 0, "data-status", "v === 'succeeded'", timeout=90_000)
    wait_answer(page, 0, prompt, 60)
    assert len(runs_of(lab)) == before + 1

    with lab.client() as client:
        kernels = client.get(lab.url + "api/kernels").json()
        for kernel in kernels:
            assert client.post(lab.url + f"api/kernels/{kernel['id']}/restart").status_code == 200
    page.reload()
    wait_idle(page)
    run_cell(page, 0)
    wait_attr(page, 0, "data-status", "v === 'succeeded'")
    assert widget(page).get_attribute("data-run-id") == run_id
    wait_answer(page, 0, prompt, 60)
    wait_text(
        page, 0, f"re-attached to {run_id}"
    )  # the cell says it found its run, not started one
    # ... in its header, where the eye goes, with how to get a new one.
    same = widget(page).locator(".agentruns-header .agentruns-same")
    assert same.inner_text() == "the same run as before: Run again for a new one"
    assert same.is_visible()
    assert len(runs_of(lab)) == before + 1
    print(
        f"\nfirst events visible {streaming:.1f} s after Ctrl+Enter; "
        f"whole test {time.monotonic() - started:.1f} s"
    )


def test_a_question_survives_a_refresh_and_a_kernel_restart_and_a_click_answers_it(lab, page):
    prompt = "the quarterly numbers"
    write_notebook(
        lab.home / "ask.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            f'run = submit("demo", {{"prompt": "{prompt}", "chunks": 12, "delay": 0.02, "ask": True}})'
        ],
    )
    open_notebook(page, lab, "ask.ipynb")
    run_cell(page, 0)
    run_id = wait_attr(page, 0, "data-run-id", "v && v.startsWith('run_')")
    wait_attr(page, 0, "data-status", "v === 'waiting'")
    card = widget(page).locator(".agentruns-input--open")
    card.wait_for(timeout=30_000)
    assert (
        card.locator(".agentruns-input-title").inner_text() == f"Write the answer about {prompt}?"
    )
    assert card.get_by_role("button", name="approve").is_visible()
    assert card.get_by_role("button", name="deny").is_visible()

    # A refresh, then a kernel restart and the cell run again: the same question, still open.
    save(page)
    page.reload()
    wait_idle(page)
    assert wait_attr(page, 0, "data-run-id", "!!v") == run_id
    widget(page).locator(".agentruns-input--open").wait_for(timeout=30_000)
    with lab.client() as client:
        for kernel in client.get(lab.url + "api/kernels").json():
            assert client.post(lab.url + f"api/kernels/{kernel['id']}/restart").status_code == 200
    page.reload()
    wait_idle(page)
    run_cell(page, 0)
    wait_text(page, 0, f"re-attached to {run_id}")
    card = widget(page).locator(".agentruns-input--open")
    card.wait_for(timeout=30_000)

    card.get_by_role("button", name="approve").click()
    wait_attr(page, 0, "data-status", "v === 'succeeded'")
    wait_answer(page, 0, prompt, 12)
    answer = widget(page).locator(".agentruns-input--resolved .agentruns-input-answer")
    # Said in the past tense, and by nobody: a token login's anonymous name is not a person.
    assert answer.inner_text() == "approved"
    with lab.client() as client:
        run = client.get(f"runs/{run_id}").json()
    assert run["status"] == "succeeded"
    assert run["snapshot"]["inputs"][0]["choice"] == "approve"
    assert [r["run_id"] for r in runs_of(lab)].count(run_id) == 1


def test_cancel_then_run_again_from_the_widget(lab, page):
    write_notebook(
        lab.home / "cancel.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            'run = submit("demo", {"prompt": "cancel me", "chunks": 400, "delay": 0.1})'
        ],
    )
    open_notebook(page, lab, "cancel.ipynb")
    run_cell(page, 0)
    run_id = wait_attr(page, 0, "data-run-id", "v && v.startsWith('run_')")
    wait_attr(page, 0, "data-last-seq", "Number(v) >= 5")
    widget(page).get_by_role("button", name="Cancel").click()
    wait_attr(page, 0, "data-status", "v === 'cancelled'")
    with lab.client() as client:
        assert client.get(f"runs/{run_id}").json()["status"] == "cancelled"

    widget(page).get_by_role("button", name="Run again").click()
    new_id = wait_attr(page, 0, "data-run-id", f"v && v !== '{run_id}'")
    wait_attr(page, 0, "data-status", "v === 'running'")
    with lab.client() as client:
        new_run = client.get(f"runs/{new_id}").json()
        assert new_run["retry_of"] == run_id
        assert new_run["input"] == {"prompt": "cancel me", "chunks": 400, "delay": 0.1}
        client.post(f"runs/{new_id}/cancel")


def test_ten_live_widgets_share_one_connection_and_the_notebook_still_saves(lab, page):
    cells = [
        "from jupyter_agentruns import submit\n"
        f'run = submit("demo", {{"prompt": "widget {i}", "chunks": 150, "delay": 0.1}})'
        for i in range(10)
    ]
    write_notebook(lab.home / "ten.ipynb", cells)
    streams, open_streams = [], set()

    def opened(request):
        if "/api/agentruns/streams" in request.url:
            streams.append(request.url)
            open_streams.add(request)

    page.on("request", opened)
    page.on("requestfinished", lambda request: open_streams.discard(request))
    page.on("requestfailed", lambda request: open_streams.discard(request))
    open_notebook(page, lab, "ten.ipynb")
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputArea-editor").click()
    for index in range(10):
        run_cell(page, index)
    for index in range(10):
        wait_attr(page, index, "data-last-seq", "Number(v) >= 3")
    # All ten runs live: the notebook still saves promptly.
    started = time.monotonic()
    save(page)
    save_seconds = time.monotonic() - started
    page.wait_for_timeout(500)
    assert len(open_streams) == 1, [request.url for request in open_streams]
    assert all(url.count("run_") >= 1 for url in streams)
    assert save_seconds < 10
    ids = [widget(page, i).get_attribute("data-run-id") for i in range(10)]
    assert len(set(ids)) == 10
    assert all(any(run_id in url for url in streams) for run_id in ids)
    with lab.client() as client:
        for run_id in ids:
            client.post(f"runs/{run_id}/cancel")
    print(
        f"\nsaved with 10 live widgets in {save_seconds:.2f} s; "
        f"{len(streams)} stream requests in all"
    )


def test_a_killed_server_started_again_lets_the_same_widget_watch_its_run_finish(tmp_path, page):
    """Kill jupyter lab mid-run, start it again: the widget on the page, never reloaded, sees it end."""
    home = tmp_path / "lab"
    home.mkdir()
    config = {"heartbeat_interval": 2, "lease_seconds": 2}
    prompt = "survive a crash"
    write_notebook(
        home / "crash.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            f'run = submit("demo", {{"prompt": "{prompt}", "chunks": 120, "delay": 0.1}})'
        ],
    )
    first = ServerProcess(home, home / "agentruns.sqlite3", config, app="jupyterlab")
    again = ServerProcess(home, home / "agentruns.sqlite3", config, app="jupyterlab")
    again.port, again.token = first.port, first.token  # the same address: the page stays
    try:
        first.start(timeout=120)
        open_notebook(page, first, "crash.ipynb")
        run_cell(page, 0)
        run_id = wait_attr(page, 0, "data-run-id", "v && v.startsWith('run_')")
        wait_attr(page, 0, "data-last-seq", "Number(v) >= 30")
        first.kill()
        again.start(timeout=120)
        # Taken over by the server started again: the view sees the second attempt (its
        # header says so for ten seconds, which a page reconnecting later may not catch).
        wait_attr(page, 0, "data-attempt", "v === '2'", timeout=90_000)
        page.keyboard.press("Escape")  # JupyterLab's own "Server Connection Error" dialog
        ARTIFACTS.mkdir(exist_ok=True)
        widget(page).screenshot(path=str(ARTIFACTS / "resumed-while-running.png"))
        wait_attr(page, 0, "data-status", "v === 'succeeded'", timeout=120_000)
        assert widget(page).get_attribute("data-run-id") == run_id
        wait_answer(page, 0, prompt, 120)
        with again.client() as client:
            run = client.get(f"runs/{run_id}").json()
            assert run["attempt"] == 2 and len(client.get("runs").json()["runs"]) == 1
    finally:
        first.kill()
        again.kill()


@pytest.fixture
def listener():
    """An HTTP server on 127.0.0.1 that counts the requests it gets: where a model would send data."""
    requests: list[str] = []

    class Counting(BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], requests
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_a_models_images_and_html_fetch_nothing_and_show_as_a_link_and_text(lab, page, listener):
    port, requests = listener
    exfil = f"http://127.0.0.1:{port}/exfil?secret=x"
    text = (
        f"Here is the chart: ![the chart]({exfil})\n\n"
        f"<img src=http://127.0.0.1:{port}/x2> and "
        '<img src=x onerror="window.agentrunsPwned = 1"> done.'
    )
    write_notebook(
        lab.home / "exfil.ipynb",
        [f"from jupyter_agentruns import submit\nrun = submit('writer', {{'text': {text!r}}})"],
    )
    open_notebook(page, lab, "exfil.ipynb")
    run_cell(page, 0)
    wait_attr(page, 0, "data-status", "v === 'succeeded'")
    wait_text(page, 0, "done.")
    page.wait_for_timeout(1000)  # time for any fetch the page would make
    assert requests == []
    assert page.evaluate("() => window.agentrunsPwned") is None
    answer = widget(page).locator(".agentruns-markdown")
    assert answer.locator("img").count() == 0
    assert f"<img src=http://127.0.0.1:{port}/x2> and <img src=x onerror=" in answer.inner_text()
    assert answer.locator("a", has_text="the chart").get_attribute("href") == exfil


# The colours of an element as the page paints them, through a canvas that
# takes any CSS colour: its text, and its background laid over its ancestors'.
PAINTED = """(el) => {
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = 1;
    const ctx = canvas.getContext("2d", { willReadFrequently: true });
    const layers = [];
    for (let node = el; node; node = node.parentElement) layers.unshift(getComputedStyle(node).backgroundColor);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, 1, 1);
    for (const color of layers) {
        ctx.fillStyle = color;
        ctx.fillRect(0, 0, 1, 1);
    }
    const background = [...ctx.getImageData(0, 0, 1, 1).data].slice(0, 3);
    ctx.fillStyle = getComputedStyle(el).color;
    ctx.fillRect(0, 0, 1, 1);
    return { background, text: [...ctx.getImageData(0, 0, 1, 1).data].slice(0, 3) };
}"""


def contrast(colours: dict) -> float:
    """The WCAG contrast ratio of a text colour on its background."""

    def luminance(rgb):
        linear = [c / 255 / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    high, low = sorted((luminance(colours["text"]), luminance(colours["background"])), reverse=True)
    return (high + 0.05) / (low + 0.05)


def set_theme(lab: ServerProcess, theme: str) -> None:
    """The theme of the pages loaded from now on (JupyterLab's setting, saved on the server)."""
    with lab.client() as client:
        response = client.put(
            lab.url + "lab/api/settings/@jupyterlab/apputils-extension:themes",
            json={"raw": json.dumps({"theme": theme})},
        )
        assert response.status_code == 204, response.text


def switch_theme(page, theme: str) -> None:
    """Switch the open page to ``theme`` as a person does from the Settings menu: at once,
    without a reload (and saved, as ``set_theme`` saves it). The page's JupyterLab must be
    ``window.jupyterapp`` (``expose_app_in_browser``)."""
    page.evaluate(
        "(theme) => window.jupyterapp.commands.execute('apputils:change-theme', {theme})", theme
    )
    page.wait_for_function(
        "(theme) => document.body.dataset.jpThemeName === theme", arg=theme, timeout=30_000
    )
    page.wait_for_timeout(300)  # its fonts and colours settle


def test_a_coding_agents_thinking_plan_diffs_and_permission_read_in_light_and_dark(lab, page):
    write_notebook(
        lab.home / "coding.ipynb",
        [
            "from jupyter_agentruns import submit\nrun = submit('stepper', {})",
            "asked = submit('permission_asker', {})",
        ],
    )
    page.set_viewport_size({"width": 1000, "height": 1400})
    try:
        open_notebook(page, lab, "coding.ipynb")
        run_cell(page, 0)
        run_cell(page, 1)
        run_id = wait_attr(page, 1, "data-run-id", "v && v.startsWith('run_')")
        for theme, name in (
            ("JupyterLab Light", "acp-light.png"),
            ("JupyterLab Dark", "acp-dark.png"),
        ):
            if theme != "JupyterLab Light":
                save(page)
                set_theme(lab, theme)
                page.reload()
                wait_idle(page)
            wait_attr(page, 0, "data-status", "v === 'succeeded'")
            wait_attr(page, 1, "data-status", "v === 'waiting'")
            stepper, asker = widget(page, 0), widget(page, 1)

            # Thinking: folded, and open on a click.
            thinking = stepper.locator(".agentruns-thinking")
            assert thinking.get_attribute("open") is None
            thinking.locator("summary").click()
            wait_text(page, 0, "Look at the file, then change it.")
            assert stepper.locator(".agentruns-plan-entry").inner_text().split() == [
                "✓",
                "Read",
                "a.py",
                "high",
            ]
            assert stepper.locator(".agentruns-tool-kind").all_inner_texts() == ["READ", "EDIT"]
            assert stepper.locator(".agentruns-tool-title").all_inner_texts() == [
                "Read a.py",
                "Edit a.py",
            ]
            assert stepper.locator(".agentruns-tool-text").inner_text() == "x = 1"
            assert stepper.locator(".agentruns-diff-line").all_inner_texts() == [
                "@@ -1 +1 @@",
                "-x = 1",
                "+x = 2",
            ]

            # The permission: the agent's option names, the step it is about with its diff.
            card = asker.locator(".agentruns-input--open")
            assert card.locator(".agentruns-choice").all_inner_texts() == [
                "Allow",
                "Always allow edits",
                "Reject",
            ]
            assert card.locator(".agentruns-input-tool-title").inner_text() == "Edit plot.py"
            assert "data.mean().plot.bar()" in card.locator(".agentruns-diff").inner_text()
            assert asker.locator(".agentruns-plan-count").inner_text() == "1 of 3 done"

            # Readable: text on the added and removed lines, and the plan, against what they are painted on.
            for element in (
                card.locator('.agentruns-diff-line[data-op="added"]').first,
                card.locator('.agentruns-diff-line[data-op="removed"]').first,
                asker.locator(".agentruns-plan-content").first,
                asker.locator(
                    '.agentruns-plan-entry[data-status="in_progress"] .agentruns-plan-content'
                ),
            ):
                colours = element.evaluate(PAINTED)
                assert contrast(colours) >= 4.5, (theme, colours)
            first = page.locator(".jp-Notebook .jp-Cell").nth(0).bounding_box()
            last = page.locator(".jp-Notebook .jp-Cell").nth(1).bounding_box()
            page.screenshot(
                path=picture(name),
                clip={
                    "x": first["x"], "y": first["y"], "width": first["width"],
                    "height": last["y"] + last["height"] - first["y"],
                },
            )  # fmt: skip

        card.get_by_role("button", name="Allow", exact=True).click()
        wait_attr(page, 1, "data-status", "v === 'succeeded'")
        answer = asker.locator(".agentruns-input--resolved .agentruns-input-answer")
        assert answer.inner_text() == "allowed"
        with lab.client() as client:
            run = client.get(f"runs/{run_id}").json()
        assert run["snapshot"]["inputs"][0]["choice"] == "proceed_once"
        assert run["snapshot"]["tools"][0]["status"] == "completed"
    finally:
        set_theme(lab, "JupyterLab Light")


# A control's edge as the page paints it: its border colour, and the background
# around it (its parent's, laid over their ancestors').
EDGE = """(el) => {
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = 1;
    const ctx = canvas.getContext("2d", { willReadFrequently: true });
    const layers = [];
    for (let node = el.parentElement; node; node = node.parentElement) {
        layers.unshift(getComputedStyle(node).backgroundColor);
    }
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, 1, 1);
    for (const color of layers) {
        ctx.fillStyle = color;
        ctx.fillRect(0, 0, 1, 1);
    }
    const background = [...ctx.getImageData(0, 0, 1, 1).data].slice(0, 3);
    ctx.fillStyle = getComputedStyle(el).borderTopColor;
    ctx.fillRect(0, 0, 1, 1);
    return { background, text: [...ctx.getImageData(0, 0, 1, 1).data].slice(0, 3) };
}"""


def test_approve_and_deny_look_like_buttons_in_light_and_dark(lab, page):
    prompt = "the yearly numbers"
    write_notebook(
        lab.home / "buttons.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            f'run = submit("demo", {{"prompt": "{prompt}", "chunks": 12, "delay": 0, "ask": True}})'
        ],
    )
    try:
        open_notebook(page, lab, "buttons.ipynb")
        run_cell(page, 0)
        for theme, name in (
            ("JupyterLab Light", "approval.png"),
            ("JupyterLab Dark", "approval-dark.png"),
        ):
            if theme != "JupyterLab Light":
                switch_theme(page, theme)
            wait_attr(page, 0, "data-status", "v === 'waiting'")
            card = widget(page).locator(".agentruns-input--open")
            card.wait_for(timeout=30_000)
            page.mouse.move(0, 0)  # no button hovered: its edge is the resting one
            buttons = {
                label: widget(page).get_by_role("button", name=label, exact=True)
                for label in ("approve", "deny", "Cancel", "copy")
            }
            for label, button in buttons.items():
                edge = button.evaluate(EDGE)
                # WCAG's 3:1 for the edge of a control against what is around it.
                assert contrast(edge) >= 3, (theme, label, edge)
            widget(page).screenshot(path=picture(name))
        buttons["approve"].click()
        wait_attr(page, 0, "data-status", "v === 'succeeded'")
        wait_answer(page, 0, prompt, 12)
    finally:
        set_theme(lab, "JupyterLab Light")


def test_a_run_code_step_is_approved_from_its_code_and_inserted_as_a_cell(lab, page):
    code = "doubled = sales.n * 2\nprint(doubled.sum())"
    write_notebook(
        lab.home / "tools.ipynb",
        [
            "import pandas as pd\n"
            "sales = pd.DataFrame({'n': [1, 2]})\n"
            "from jupyter_agentruns import submit\n"
            f"run = submit('notebook_mcp_client', {{'calls': [['run_code', {{'code': {code!r}}}]]}})"
        ],
    )
    open_notebook(page, lab, "tools.ipynb")
    run_cell(page, 0)
    card = widget(page).locator(".agentruns-input--open")
    card.wait_for(timeout=60_000)
    # The question shows the code it is about, as code.
    assert card.locator("pre.agentruns-code").inner_text() == code
    card.get_by_role("button", name="approve").click()
    wait_attr(page, 0, "data-status", "v === 'succeeded'")
    step = widget(page).locator(".agentruns-tool")
    assert step.locator("pre.agentruns-code").inner_text() == code
    assert "stdout:\n6" in step.locator(".agentruns-tool-text").inner_text()
    step.get_by_role("button", name="Insert as cell").click()
    cells = page.locator(".jp-Notebook .jp-Cell")
    page.wait_for_function("() => document.querySelectorAll('.jp-Notebook .jp-Cell').length === 2")
    assert cells.nth(1).locator(".jp-InputArea-editor").inner_text().strip() == code


def test_a_run_code_step_cancelled_mid_way_shows_cancelled_not_running(lab, page):
    code = "import time\ntime.sleep(60)"
    write_notebook(
        lab.home / "sleepy_code.ipynb",
        [
            "from jupyter_agentruns import submit\n"
            f"run = submit('notebook_mcp_client', {{'calls': [['run_code', {{'code': {code!r}}}]]}})"
        ],
    )
    open_notebook(page, lab, "sleepy_code.ipynb")
    run_cell(page, 0)
    card = widget(page).locator(".agentruns-input--open")
    card.wait_for(timeout=60_000)
    card.get_by_role("button", name="approve").click()
    step = widget(page).locator(".agentruns-tool")
    step.locator(".agentruns-tool-status", has_text="running").wait_for(timeout=30_000)
    widget(page).get_by_role("button", name="Cancel").click()
    wait_attr(page, 0, "data-status", "v === 'cancelled'")
    # The step ended with its run: the view, the run and the record say so.
    step.locator(".agentruns-tool-status", has_text="failed").wait_for(timeout=10_000)
    said = step.locator(".agentruns-tool-result").inner_text()
    run_id = widget(page).get_attribute("data-run-id")
    with lab.client() as client:
        [tool] = client.get(f"runs/{run_id}").json()["snapshot"]["tools"]
        assert tool["status"] == "failed" and tool["error"]["type"] == "cancelled"
        # Ended by the call itself as its caller went away, or by the run's end: whichever came first.
        message = tool["error"]["message"]
        assert message in (
            "the call was stopped before it ended",
            "the run was cancelled before this step ended",
        )
        assert said == f"cancelled: {message}"
        record = client.get(f"runs/{run_id}", headers={"Accept": "text/markdown"}).text
        assert f"failed: {message}" in record
    step.scroll_into_view_if_needed()
    page.screenshot(path=picture("cancelled-run-code-step.png"))


def test_an_agents_cell_edit_shows_in_its_view_and_undo_takes_it_out_of_the_notebook(lab, page):
    source = "answer = 41 + 1"
    path = lab.home / "edited.ipynb"
    write_notebook(
        path,
        [
            "from jupyter_agentruns import submit\n"
            "run = submit('notebook_mcp_client', "
            f"{{'calls': [['insert_cell', {{'source': {source!r}, 'after': 'end'}}]]}})"
        ],
    )
    open_notebook(page, lab, "edited.ipynb")
    run_cell(page, 0)
    wait_attr(page, 0, "data-status", "v === 'succeeded'")
    edit = widget(page).locator(".agentruns-edit")
    edit.wait_for(timeout=30_000)
    assert "Inserted" in edit.locator(".agentruns-edit-words").inner_text()
    assert edit.locator(".agentruns-edit-status").inner_text() == "applied"
    # The cell is in the file, marked as the agent's.
    cells = nbformat.read(path, as_version=4).cells
    assert cells[-1].source == source
    run_id = widget(page).get_attribute("data-run-id")
    assert cells[-1]["metadata"]["agentruns"]["run_id"] == run_id
    edit.scroll_into_view_if_needed()
    page.screenshot(path=picture("notebook-edit-applied.png"))
    try:
        switch_theme(page, "JupyterLab Dark")
        page.screenshot(path=picture("notebook-edit-applied-dark.png"))
    finally:
        switch_theme(page, "JupyterLab Light")
    edit.get_by_role("button", name=re.compile("Undo")).click()
    edit.locator(".agentruns-edit-status", has_text="undone").wait_for(timeout=30_000)
    assert [cell.source for cell in nbformat.read(path, as_version=4).cells] == [cells[0].source]
    with lab.client() as client:
        [kept] = client.get(f"runs/{run_id}").json()["snapshot"]["edits"]
        assert kept["status"] == "undone"
    page.screenshot(path=picture("notebook-edit-undone.png"))


def test_an_agents_run_of_a_cell_shows_its_outputs_in_the_view_and_undo_takes_them_out(lab, page):
    # A 1x1 PNG, as IPython displays it.
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    shown = (
        "import base64\nfrom IPython.display import Image, display\n"
        "print('rows: 3')\nprint('cols: 2')\n"
        f"display(Image(data=base64.b64decode({png!r})))\n"
        "6 * 7"
    )
    path = lab.home / "ran.ipynb"
    nb = new_notebook(
        cells=[
            new_code_cell(
                "from jupyter_agentruns import submit\n"
                "run = submit('notebook_mcp_client', "
                "{'calls': [['execute_cell', {'cell_id': 'shown'}]]})"
            ),
            new_code_cell(shown, id="shown"),
        ],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbformat.write(nb, path)
    open_notebook(page, lab, "ran.ipynb")
    run_cell(page, 0)
    card = widget(page).locator(".agentruns-input--open")
    card.wait_for(timeout=60_000)
    assert "6 * 7" in card.inner_text()  # the cell's code, asked first
    card.get_by_role("button", name="approve").click()
    wait_attr(page, 0, "data-status", "v === 'succeeded'")
    edit = widget(page).locator(".agentruns-edit")
    edit.wait_for(timeout=30_000)
    assert edit.locator(".agentruns-edit-words").inner_text() == "Ran cell 2"
    assert edit.locator(".agentruns-edit-outputs-count").inner_text() == (
        "Ran the cell: 3 outputs · 1 image"
    )
    assert edit.locator(".agentruns-edit-outputs-text").inner_text() == "rows: 3\ncols: 2\n42"
    cell = nbformat.read(path, as_version=4).cells[1]
    # The two prints are one stream output, as JupyterLab keeps them.
    assert [o["output_type"] for o in cell.outputs] == ["stream", "display_data", "execute_result"]
    assert cell.outputs[-2]["data"]["image/png"].strip() == png
    edit.scroll_into_view_if_needed()
    page.screenshot(path=picture("notebook-outputs-edit-applied.png"))
    edit.get_by_role("button", name=re.compile("Undo")).click()
    edit.locator(".agentruns-edit-status", has_text="undone").wait_for(timeout=30_000)
    cell = nbformat.read(path, as_version=4).cells[1]
    assert cell.outputs == [] and cell.execution_count is None
    page.screenshot(path=picture("notebook-outputs-edit-undone.png"))
