"""Conversations in a real Chromium against a real JupyterLab: a %%agent cell, the reply box
under its view, the thread kept in the saved record, the agent's pickers."""

# The browser fixtures come from test_browser, and pytest passes them by name.
# ruff: noqa: F811

from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat

from conftest import picture
from test_browser import (  # noqa: F401  (fixtures are found by name)
    ARTIFACTS,
    MIME_TYPE,
    PAINTED,
    browser,
    contrast,
    jp_asyncio_loop,
    jp_server_cleanup,
    lab,
    open_notebook,
    page,
    pytestmark,
    run_cell,
    runs_of,
    save,
    set_theme,
    switch_theme,
    wait_attr,
    wait_idle,
    wait_text,
    widget,
    write_notebook,
)


def test_an_agent_cell_run_refreshed_and_run_again_is_one_run(lab, page):
    write_notebook(
        lab.home / "magic.ipynb", ["%%agent demo\nmagic in the browser", "for x in df: print(x)"]
    )
    before = len(runs_of(lab))
    open_notebook(page, lab, "magic.ipynb")
    # The prompt is shown as Markdown ("in" is no keyword there); other code cells as Python.
    languages = page.wait_for_function(
        """() => {
            const shown = [...document.querySelectorAll('.jp-Notebook .jp-Cell .cm-content')]
                .map((content) => content.dataset.language);
            return shown.length === 2 && shown[0] !== 'python' && shown.every(Boolean) && shown;
        }""",
        timeout=30_000,
    ).json_value()
    assert languages[0] == "markdown" and languages[1] == "python", languages
    run_cell(page, 0)
    run_id = wait_attr(page, 0, "data-run-id", "v && v.startsWith('run_')")
    wait_attr(page, 0, "data-status", "v === 'succeeded'", timeout=90_000)
    save(page)
    page.reload()
    wait_idle(page)
    assert wait_attr(page, 0, "data-run-id", "!!v") == run_id
    run_cell(page, 0)
    wait_text(page, 0, f"re-attached to {run_id}")
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator(".jp-Notebook .jp-Cell").nth(0).screenshot(path=str(ARTIFACTS / "agent-cell.png"))
    mine = [run for run in runs_of(lab) if run["session"] == "magic.ipynb"]
    assert len(runs_of(lab)) == before + 1 and [run["run_id"] for run in mine] == [run_id]
    assert mine[0]["input"] == {"prompt": "magic in the browser"}


def test_a_follow_up_typed_under_a_view_continues_its_conversation_and_survives_a_refresh(
    lab, page
):
    write_notebook(lab.home / "thread.ipynb", ["%%agent demo\nfirst question"])
    open_notebook(page, lab, "thread.ipynb")
    run_cell(page, 0)
    root_id = wait_attr(page, 0, "data-run-id", "v && v.startsWith('run_')")
    wait_attr(page, 0, "data-status", "v === 'succeeded'", timeout=90_000)
    box = page.locator(".jp-Notebook .agentruns-followup-text").first
    box.wait_for()
    # Shift+Enter is a new line in the box, not JupyterLab's "run the cell"; Enter sends.
    box.click()
    page.keyboard.type("and a follow-up")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("on two lines")
    page.keyboard.press("Enter")
    thread = page.locator(".jp-Notebook .agentruns-thread-run .agentruns-run")
    thread.first.wait_for(timeout=30_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-Notebook .agentruns-thread-run .agentruns-run')]"
        ".some((view) => view.dataset.status === 'succeeded')",
        timeout=90_000,
    )
    mine = [run for run in runs_of(lab) if run["session"] == "thread.ipynb"]
    assert len(mine) == 2
    follow_up = mine[0]
    assert follow_up["input"] == {"prompt": "and a follow-up\non two lines"}
    assert follow_up["agent"] == "demo" and follow_up["metadata"]["follow_up_of"] == root_id
    assert "cell_id" not in follow_up["metadata"]
    # The follow-up's own view has no box: the thread has one, at its end.
    assert page.locator(".jp-Notebook .agentruns-followup:visible").count() == 1
    thread_section = page.locator(".jp-Notebook .agentruns-thread").first
    thread_section.scroll_into_view_if_needed()
    thread_section.screenshot(path=picture("thread.png"))

    save(page)
    page.reload()
    wait_idle(page)
    assert wait_attr(page, 0, "data-run-id", "!!v") == root_id
    page.locator(
        f".jp-Notebook .agentruns-thread-run .agentruns-run[data-run-id='{follow_up['run_id']}']"
    ).wait_for(timeout=30_000)
    assert len([run for run in runs_of(lab) if run["session"] == "thread.ipynb"]) == 2


def saved_record(path: Path) -> str:
    """The ``text/markdown`` record of the run output of the notebook's first cell, as saved."""
    outputs = nbformat.read(path, as_version=4).cells[0].outputs
    records = [
        output.data["text/markdown"] for output in outputs if MIME_TYPE in output.get("data", {})
    ]
    assert len(records) == 1, outputs
    return records[0]


def save_until(page, path: Path, holds, timeout=60.0) -> str:
    """Save until the saved record ``holds`` (the view writes it into the output a moment after a run ends)."""
    deadline = time.monotonic() + timeout
    while True:
        save(page)
        record = saved_record(path)
        if holds(record) or time.monotonic() > deadline:
            return record
        time.sleep(0.5)


def in_order(text: str, pieces: list[str]) -> bool:
    places = [text.find(piece) for piece in pieces]
    return -1 not in places and places == sorted(places)


def test_a_follow_up_is_kept_in_the_saved_record_and_its_export_once_after_a_refresh(lab, page):
    path = lab.home / "kept.ipynb"
    write_notebook(path, ["%%agent demo\nfirst question"])
    open_notebook(page, lab, "kept.ipynb")
    run_cell(page, 0)
    root_id = wait_attr(page, 0, "data-run-id", "v && v.startsWith('run_')")
    wait_attr(page, 0, "data-status", "v === 'succeeded'", timeout=90_000)
    box = page.locator(".jp-Notebook .agentruns-followup-text").first
    box.click()
    page.keyboard.type("second question")
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-Notebook .agentruns-thread-run .agentruns-run')]"
        ".some((view) => view.dataset.status === 'succeeded')",
        timeout=90_000,
    )
    # The person's message, then the agent's answer, each under the one before.
    conversation = [
        "Demo answer about first question",
        "> second question",
        "Demo answer about second question",
    ]
    record = save_until(page, path, lambda text: in_order(text, conversation))
    assert in_order(record, conversation), record
    assert record.count("**You** · follow-up") == 1 and f"`{root_id}`" in record

    # nbconvert's Markdown export (what `jupyter nbconvert --to markdown` writes), in-process.
    from nbconvert import MarkdownExporter

    markdown, _ = MarkdownExporter().from_filename(str(path))
    assert in_order(markdown, conversation), markdown
    assert markdown.count("> second question") == 1

    # A refresh finds the thread again and the record up to date: the notebook stays clean.
    page.reload()
    wait_idle(page)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-Notebook .agentruns-thread-run .agentruns-run')]"
        ".some((view) => view.dataset.status === 'succeeded')",
        timeout=60_000,
    )
    time.sleep(2)  # time for the view to check the record against the server's
    assert page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").count() == 0
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputArea-editor").click()
    save(page)
    again = saved_record(path)
    assert again == record

    # The runs gone from the server: the view shows the saved record, the thread in it.
    with lab.client() as client:
        for run in runs_of(lab):
            if run["session"] == "kept.ipynb":
                client.delete(f"runs/{run['run_id']}").raise_for_status()
    page.reload()
    wait_idle(page)
    shown = page.locator(".jp-Notebook .agentruns-record").first
    shown.wait_for(timeout=60_000)
    assert in_order(shown.inner_text(), ["Demo answer about first question", "second question",
                                         "Demo answer about second question"])  # fmt: skip
    assert page.locator(".jp-Notebook .agentruns-followup:visible").count() == 0
    # (the cell's screenshot scrolls to it: the record may be drawn again meanwhile)
    page.locator(".jp-Notebook .jp-Cell").nth(0).screenshot(path=picture("thread-record.png"))


def test_a_mode_and_a_file_chosen_in_the_reply_box_go_into_the_follow_ups_input(lab, page):
    write_notebook(lab.home / "modes.ipynb", ["%%agent scripted\necho ready"])
    (lab.home / "data.csv").write_text("x,y\n1,2\n")
    try:
        open_notebook(page, lab, "modes.ipynb")
        run_cell(page, 0)
        root_id = wait_attr(page, 0, "data-run-id", "v && v.startsWith('run_')")
        wait_attr(page, 0, "data-status", "v === 'succeeded'", timeout=90_000)
        # The agent said its modes and models in its first session: the box offers them.
        pickers = page.locator(".jp-Notebook .agentruns-followup-pickers").first
        pickers.wait_for(state="visible", timeout=30_000)
        mode = pickers.get_by_label("The agent's mode", exact=True)
        model = pickers.get_by_label("The agent's model", exact=True)
        assert mode.locator("option").all_inner_texts() == ["Ask", "Plan"]
        assert model.locator("option").all_inner_texts() == ["Small", "Large"]
        assert mode.input_value() == "ask" and model.input_value() == "small"

        # "@da" offers the server's files; Enter takes the one chosen, and does not send.
        box = page.locator(".jp-Notebook .agentruns-followup-text").first
        box.click()
        page.keyboard.type("state @da")
        options = page.locator(".jp-Notebook .agentruns-mentions [role=option]")
        options.first.wait_for(timeout=30_000)
        # (the server's root also holds the lab's data folder)
        assert options.all_inner_texts() == ["data/", "data.csv"]
        assert box.get_attribute("aria-activedescendant") == options.first.get_attribute("id")
        page.keyboard.press("ArrowDown")
        assert box.get_attribute("aria-activedescendant") == options.nth(1).get_attribute("id")
        page.locator(".jp-Notebook .agentruns-followup").first.screenshot(
            path=picture("mentions.png")
        )
        page.keyboard.press("Enter")
        assert box.input_value() == "state @data.csv "
        assert options.count() == 0
        # From the reply box, Tab reaches the mode picker; the keyboard chooses Plan.
        page.keyboard.press("Tab")
        assert mode.evaluate("(el) => el === document.activeElement")
        page.keyboard.press("ArrowDown")
        assert mode.input_value() == "plan"
        box.click()
        page.keyboard.press("Enter")
        page.wait_for_function(
            "() => [...document.querySelectorAll('.jp-Notebook .agentruns-thread-run "
            ".agentruns-run')].some((view) => view.dataset.status === 'succeeded')",
            timeout=90_000,
        )
        mine = [run for run in runs_of(lab) if run["session"] == "modes.ipynb"]
        follow_up = mine[0]
        assert follow_up["metadata"]["follow_up_of"] == root_id
        assert follow_up["input"] == {
            "prompt": "state @data.csv",
            "mode": "plan",
            "model": "small",
            "files": ["data.csv"],
        }
        # The agent switched, and the view says what the run used.
        assert json.loads(follow_up["output"]["text"]) == {"mode": "plan", "model": "small"}
        view = page.locator(".jp-Notebook .agentruns-thread-run .agentruns-run").first
        assert (
            view.locator(".agentruns-choices").inner_text()
            == "mode plan · model small · file data.csv"
        )
        # The box now holds what the thread chose last.
        assert mode.input_value() == "plan"

        for theme, name in (
            ("JupyterLab Light", "pickers-light.png"),
            ("JupyterLab Dark", "pickers-dark.png"),
        ):
            if theme != "JupyterLab Light":
                switch_theme(page, theme)
            for element in (mode, pickers.locator(".agentruns-picker-label").first):
                colours = element.evaluate(PAINTED)
                assert contrast(colours) >= 4.5, (theme, colours)
            thread = page.locator(".jp-Notebook .jp-Cell").nth(0)
            thread.scroll_into_view_if_needed()
            thread.screenshot(path=picture(name))
    finally:
        set_theme(lab, "JupyterLab Light")


def test_ask_about_a_cell_from_its_context_menu_sends_its_source_and_output_to_the_chat_beside(
    lab, page
):
    # A cell as a kernel left it (no kernel run needed): printed text and a coloured traceback.
    cell = nbformat.v4.new_code_cell("print('loading')\nprices['total'].sum()", execution_count=7)
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="loading\n"),
        nbformat.v4.new_output(
            "error",
            ename="KeyError",
            evalue="'total'",
            traceback=[
                "\x1b[0;31mKeyError\x1b[0m: 'total' raised in \x1b[0;32mIn[7], line 2\x1b[0m"
            ],
        ),
    ]
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("x = 1"), cell],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    nbformat.write(notebook, lab.home / "ask.ipynb")
    open_notebook(page, lab, "ask.ipynb")

    page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea").click(button="right")
    page.locator(".lm-Menu-item", has_text="Ask an Agent about This Cell").click()
    dialog = page.locator(".jp-Dialog .agentruns-askcell")
    dialog.wait_for()
    assert dialog.locator(".agentruns-askcell-cell").inner_text() == "Cell 2 [7]: print('loading')"
    page.wait_for_function(
        "() => document.querySelectorAll('.agentruns-askcell .agentruns-newrun-agent option').length > 0"
    )
    dialog.locator(".agentruns-newrun-agent").select_option("demo")
    dialog.locator(".agentruns-newrun-prompt").click()
    page.keyboard.type("Why is there no total?")
    page.locator(".jp-Dialog-content").screenshot(path=picture("ask-about-cell-dialog.png"))
    page.keyboard.press("Enter")

    chat = page.locator("#jp-right-stack .agentruns-conversation-view")
    chat.wait_for(timeout=30_000)
    assert page.locator(".jp-Dialog").count() == 0
    asked = [run for run in runs_of(lab) if run["session"] == "ask.ipynb"]
    assert len(asked) == 1
    run = asked[0]
    assert run["agent"] == "demo" and run["metadata"]["notebook"] == "ask.ipynb"
    assert "cell_id" not in run["metadata"]  # not a cell's own run: no output goes back into it
    prompt = run["input"]["prompt"]
    assert prompt.startswith("Why is there no total?\n")
    assert "```python\nprint('loading')\nprices['total'].sum()\n```" in prompt
    assert "loading\n" in prompt and "KeyError: 'total' raised in In[7], line 2" in prompt
    assert "\x1b" not in prompt
    page.locator(
        f"#jp-right-stack .agentruns-conversation-run > .agentruns-run[data-run-id='{run['run_id']}']"
    ).wait_for(timeout=30_000)
    page.screenshot(path=picture("ask-about-cell.png"))

    # With the keyboard: the command palette asks about the active cell.
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputPrompt").click()
    page.keyboard.press("Control+Shift+C")
    page.keyboard.type("Ask an Agent about This Cell")
    page.keyboard.press("Enter")
    dialog.wait_for()
    assert dialog.locator(".agentruns-askcell-cell").inner_text() == "Cell 1: x = 1"
    page.wait_for_function("() => document.activeElement?.matches('.agentruns-askcell textarea')")
    page.wait_for_function(
        "() => document.querySelectorAll('.agentruns-askcell .agentruns-newrun-agent option').length > 0"
    )
    page.keyboard.press("Shift+Tab")
    page.keyboard.type("demo")
    assert dialog.locator(".agentruns-newrun-agent").input_value() == "demo"
    page.keyboard.press("Tab")
    page.keyboard.type("What is x?")
    page.keyboard.press("Enter")
    chat.locator(".agentruns-conversation-run > .agentruns-run").nth(1).wait_for(timeout=30_000)
    newest = [run for run in runs_of(lab) if run["session"] == "ask.ipynb"][0]
    assert newest["input"]["prompt"].startswith("What is x?\n")
    assert "```python\nx = 1\n```\n\nIt has no output." in newest["input"]["prompt"]
