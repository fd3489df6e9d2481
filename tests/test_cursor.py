"""Cursors as a request gives them: a run's stream, a page stream's runs, a list's pages."""

import pytest

from jupyter_agentruns.cursor import (
    MAX_STREAM_RUNS,
    StreamRun,
    check_cursor,
    page_cursor,
    parse_cursor,
    parse_page_cursor,
    parse_seq,
    parse_stream_runs,
)
from jupyter_agentruns.errors import Problem

INVALID_CURSOR_MESSAGE = (
    "The cursor {!r} is not a non-negative integer (the seq of the last event you have)."
)


def refused(call, *args) -> Problem:
    with pytest.raises(Problem) as caught:
        call(*args)
    return caught.value


# A seq ------------------------------------------------------------------------


@pytest.mark.parametrize("raw, seq", [(None, 0), ("", 0), ("0", 0), ("7", 7), ("007", 7)])
def test_a_seq_is_a_non_negative_integer_and_absent_means_zero(raw, seq):
    assert parse_seq(raw) == seq


@pytest.mark.parametrize("raw", ["-1", "1.5", "x", " 1", "1 ", "٣", "1" * 19, "+1"])
def test_anything_else_is_invalid_cursor_naming_it(raw):
    problem = refused(parse_seq, raw)
    assert problem.body() == {
        "error": "invalid_cursor",
        "message": INVALID_CURSOR_MESSAGE.format(raw),
    }


def test_the_largest_seq_has_eighteen_digits():
    assert parse_seq("9" * 18) == 10**18 - 1


# A run's stream: Last-Event-ID, else ?after, else 0 ---------------------------


def test_no_cursor_starts_at_the_beginning():
    assert parse_cursor(None, None) == 0


def test_last_event_id_wins_over_after():
    assert parse_cursor("5", "3") == 5
    assert parse_cursor("5", "x") == 5  # ?after is not even read


def test_after_is_used_without_a_last_event_id():
    assert parse_cursor(None, "3") == 3


def test_an_empty_last_event_id_names_no_event_and_after_is_used():
    assert parse_cursor("", "3") == 3
    assert parse_cursor("", None) == 0


def test_a_bad_last_event_id_is_refused_even_with_a_good_after():
    assert refused(parse_cursor, "x", "3").code == "invalid_cursor"


def test_a_cursor_beyond_the_last_event_is_cursor_ahead():
    check_cursor(4, 4)
    problem = refused(check_cursor, 5, 4)
    assert problem.code == "cursor_ahead" and problem.extra == {"last_seq": 4}


# A page stream's runs ---------------------------------------------------------


def test_a_run_list_is_parsed_in_order_with_each_cursor():
    runs = parse_stream_runs("run_a:3,run_b:0,run_c:")
    assert runs == [StreamRun("run_a", 3), StreamRun("run_b", 0), StreamRun("run_c", 0)]
    assert runs[0].run_id == "run_a" and runs[0].cursor == 3


def test_a_bad_cursor_is_that_runs_problem_not_the_lists():
    [good, bad] = parse_stream_runs("run_a:1,run_b:x")
    assert good == StreamRun("run_a", 1)
    assert isinstance(bad.cursor, Problem) and bad.run_id == "run_b"
    assert bad.cursor.body() == {
        "error": "invalid_cursor",
        "message": INVALID_CURSOR_MESSAGE.format("x"),
    }


@pytest.mark.parametrize("raw", [None, ""])
def test_an_empty_run_list_says_how_to_list_runs(raw):
    assert refused(parse_stream_runs, raw).body() == {
        "error": "invalid_request",
        "message": "List the runs to follow: ?runs=<run_id>:<cursor>,<run_id>:<cursor>",
    }


@pytest.mark.parametrize(
    "raw, wrong", [("run_a", "run_a"), (":3", ":3"), ("run_a:1,", ""), ("run_a:1,run_b", "run_b")]
)
def test_an_item_without_run_id_and_colon_is_refused_naming_it(raw, wrong):
    problem = refused(parse_stream_runs, raw)
    assert problem.body() == {
        "error": "invalid_request",
        "message": f"{wrong!r} is not of the form <run_id>:<cursor>.",
    }


def test_at_most_max_stream_runs():
    assert MAX_STREAM_RUNS == 50
    listed = ",".join(f"run_{i}:0" for i in range(MAX_STREAM_RUNS))
    assert len(parse_stream_runs(listed)) == MAX_STREAM_RUNS
    problem = refused(parse_stream_runs, listed + ",run_x:0")
    assert problem.body() == {
        "error": "invalid_request",
        "message": f"At most {MAX_STREAM_RUNS} runs per stream, not {MAX_STREAM_RUNS + 1}.",
    }


def test_a_run_listed_twice_is_refused():
    assert refused(parse_stream_runs, "run_a:1,run_a:2").body() == {
        "error": "invalid_request",
        "message": "Each run may be listed once.",
    }


# A list's pages ---------------------------------------------------------------


def test_a_page_cursor_reads_back_as_what_made_it():
    cursor = page_cursor("2026-01-02T03:04:05.123Z", "run_abc")
    assert parse_page_cursor(cursor) == ("2026-01-02T03:04:05.123Z", "run_abc")


@pytest.mark.parametrize("raw", ["x", page_cursor("yesterday", "run_abc"), "é"])
def test_a_page_cursor_no_server_made_is_refused(raw):
    assert refused(parse_page_cursor, raw).body() == {
        "error": "invalid_request",
        "message": f"before={raw!r} is not a cursor: pass the `next` of the previous page.",
    }
