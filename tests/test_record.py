"""The static record a notebook keeps of a run: Markdown, bounded, safe wherever it is shown."""

import pytest

from jupyter_agentruns.record import ANSWER_LIMIT, run_markdown

from conftest import demo_input, submit, wait_run


def run_object(**changes):
    run = {
        "run_id": "run_abc", "agent": "demo", "status": "succeeded", "session": None,
        "metadata": {}, "input": {}, "retry_of": None, "created_at": "2026-11-30T10:00:00.000Z",
        "started_at": "2026-11-30T10:00:00.000Z", "finished_at": "2026-11-30T10:00:12.500Z",
        "last_seq": 9, "first_seq": 1, "output": None, "error": None, "cancel": None,
        "snapshot": {
            "messages": [{"id": "m1", "role": "assistant",
                          "text": "## Weather\n\n| city | °C |\n|---|---|\n| Shanghai | 21 |\n",
                          "done": True}],
            "tools": [{"call_id": "c1", "name": "get_weather", "args": {"city": "Shanghai"},
                       "status": "completed", "result": {"c": 21}}],
            "progress": None, "usage": {"input_tokens": 12, "output_tokens": 40},
        },
    }  # fmt: skip
    run.update(changes)
    return run


def test_a_finished_run_shows_agent_status_tools_answer_usage_and_id():
    record = run_markdown(run_object())
    assert record.startswith("**Agent run** `demo` · **succeeded** · 12.5 s · 12 tokens in, 40 out")
    assert '- tool `get_weather` `{"city": "Shanghai"}` → completed' in record
    assert "| Shanghai | 21 |" in record  # the answer stays Markdown
    assert "run `run_abc`" in record


def test_a_failure_a_cancel_an_interruption_and_a_live_run_say_so():
    failed = run_markdown(
        run_object(status="failed", error={"type": "upstream_timeout", "message": "no answer"})
    )
    assert "> **Failed** (upstream_timeout): no answer" in failed
    cancelled = run_markdown(run_object(status="cancelled", cancel={"reason": "changed my mind"}))
    assert "> **Cancelled**: changed my mind" in cancelled
    assert "**Interrupted**" in run_markdown(run_object(status="interrupted"))
    live = run_markdown(run_object(status="running", finished_at=None))
    assert "Still running when this was saved (9 events)" in live


def test_a_run_taken_over_after_its_server_stopped_says_so():
    assert "resumed" not in run_markdown(run_object(attempt=1))
    assert ", resumed 1 time after its server stopped</sub>" in run_markdown(run_object(attempt=2))
    assert ", resumed 2 times after its server stopped</sub>" in run_markdown(run_object(attempt=3))


def test_a_huge_answer_is_cut_with_a_note_naming_the_run():
    text = "word " * 100_000
    record = run_markdown(
        run_object(
            snapshot={
                "messages": [{"id": "m1", "text": text, "done": True}],
                "tools": [],
                "progress": None,
                "usage": None,
            }
        )
    )
    assert len(record) < ANSWER_LIMIT + 1000
    assert (
        "the answer goes on" in record and "500,000 characters" in record and "`run_abc`" in record
    )


def test_html_in_a_model_answer_stays_text_but_code_keeps_its_brackets():
    answer = (
        'See <img src=x onerror="alert(1)"> and `a<b`\n'
        "```html\n<b>bold</b>\n```\n<script>alert(2)</script>"
    )
    record = run_markdown(
        run_object(
            snapshot={
                "messages": [{"id": "m1", "text": answer, "done": True}],
                "tools": [],
                "progress": None,
                "usage": None,
            }
        )
    )
    assert "<img" not in record and "<script" not in record
    assert "&lt;img" in record and "`a<b`" in record and "<b>bold</b>" in record


def test_an_agent_that_streams_no_text_shows_its_output():
    record = run_markdown(
        run_object(
            output={"answer": 42},
            snapshot={"messages": [], "tools": [], "progress": None, "usage": None},
        )
    )
    assert '{"answer": 42}' in record


async def test_the_server_answers_a_runs_record_as_markdown(api):
    run = await wait_run(api, (await submit(api, input=demo_input(chunks=12))).json()["run_id"])
    response = await api.get(f"runs/{run['run_id']}", headers={"Accept": "text/markdown"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/markdown")
    assert response.text == run_markdown(run)
    assert "Demo answer about weather in Shanghai" in response.text


@pytest.mark.parametrize("accept", ["text/markdown", "application/json"])
async def test_the_record_of_another_users_or_no_run_is_a_json_404(api, accept):
    response = await api.get("runs/run_nope", headers={"Accept": accept})
    assert response.status_code == 404 and response.json()["error"] == "run_not_found"
