"""``runs()`` in a notebook: a list of run objects for code, a table for a person."""

from datetime import datetime, timezone

from jupyter_agentruns.kernel.runtable import RunList

NOW = datetime(2026, 1, 1, 0, 10, tzinfo=timezone.utc)


def run(run_id, **fields):
    return {
        "run_id": run_id, "agent": "demo", "status": "succeeded", "session": "work/a.ipynb",
        "created_at": "2026-01-01T00:07:00.000Z", "started_at": "2026-01-01T00:07:01.000Z",
        "finished_at": "2026-01-01T00:07:13.500Z",
        "snapshot": {"messages": [], "tools": [], "progress": None, "usage": None},
        **fields,
    }  # fmt: skip


def test_runs_stay_a_list_of_run_objects_for_code():
    listed = RunList([run("run_b"), run("run_a")], "run_a")
    assert [item["run_id"] for item in listed] == ["run_b", "run_a"]
    assert listed == [run("run_b"), run("run_a")] and listed.next == "run_a"
    assert repr(listed).startswith("[{'run_id': 'run_b'")


def test_the_table_shows_status_agent_notebook_age_duration_and_tokens():
    usage = {"input_tokens": 1200, "output_tokens": 34, "cost": 0.5}
    listed = RunList(
        [
            run("run_b", status="running", finished_at=None, snapshot={"usage": usage}),
            run("run_a", status="failed", session=None),
        ]
    )
    table = listed._repr_html_(now=NOW)
    rows = table.split("<tr>")[2:]
    assert ">running</span>" in rows[0] and "#1976d2" in rows[0]
    assert "<code>run_b</code>" in rows[0] and "work/a.ipynb" in rows[0]
    assert "3 min ago" in rows[0] and "2 min 59 s" in rows[0] and "1,234 · cost 0.50" in rows[0]
    assert ">failed</span>" in rows[1] and "#d32f2f" in rows[1] and "12 s" in rows[1]
    assert "runs(before=" not in table


def test_user_text_in_the_table_is_escaped_and_more_runs_say_how_to_page():
    table = RunList([run("run_x", session="<img src=x onerror=alert(1)>.ipynb")], "run_x")
    html = table._repr_html_(now=NOW)
    assert "<img" not in html and "&lt;img src=x" in html
    assert "runs(before=&#x27;run_x&#x27;)" in html


def test_no_runs_say_so():
    assert "No agent runs" in RunList([])._repr_html_()


def test_usage_that_is_not_counts_and_a_time_without_zone_show_without_an_error():
    for odd in ("lots", -1000, 10**400, float("nan"), True, [1]):
        usage = {"input_tokens": odd, "output_tokens": 5, "cost": -1}
        naive = run("run_x", created_at="2026-01-01T00:07:00", snapshot={"usage": usage})
        table = RunList([naive])._repr_html_(now=NOW)
        assert ">?</td>" in table and "cost" not in table and "3 min ago" in table
