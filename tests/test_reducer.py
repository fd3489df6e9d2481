"""The Python reducer against the shared test vectors (the JS reducer reads the same files)."""

import json
from pathlib import Path

import pytest

from jupyter_agentruns.reducer import Snapshot, apply, describe_step, empty_snapshot, reduce

VECTORS = sorted((Path(__file__).parent / "vectors").glob("*.json"))


def test_vectors_exist():
    assert len(VECTORS) >= 5


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_vector(path):
    vector = json.loads(path.read_text())
    assert reduce(vector["events"]) == vector["snapshot"]


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_reducing_in_two_halves_equals_reducing_at_once(path):
    events = json.loads(path.read_text())["events"]
    half = len(events) // 2
    assert reduce(events[half:], reduce(events[:half])) == reduce(events)


def test_reduce_does_not_mutate_the_snapshot_it_starts_from():
    start = reduce([{"type": "message.started", "data": {"message_id": "m1", "role": "assistant"}}])
    before = json.dumps(start)
    reduce([{"type": "text.delta", "data": {"message_id": "m1", "delta": "x"}}], start)
    assert json.dumps(start) == before


def test_describe_step_names_the_last_tool():
    snapshot = empty_snapshot()
    apply(
        snapshot,
        {"type": "tool.started", "data": {"call_id": "c1", "name": "get_weather", "args": {}}},
    )
    assert describe_step(snapshot, "tool.started") == "tool get_weather running"
    apply(snapshot, {"type": "tool.completed", "data": {"call_id": "c1", "ok": True, "result": 1}})
    assert describe_step(snapshot, "tool.completed") == "tool get_weather completed"


def test_describe_step_for_a_streaming_message_and_a_fresh_run():
    snapshot = reduce(
        [{"type": "message.started", "data": {"message_id": "m1", "role": "assistant"}}]
    )
    assert describe_step(snapshot, "text.delta") == "message m1 streaming"
    assert describe_step(empty_snapshot(), "run.started") == "started"
    assert describe_step(empty_snapshot(), None) == "not started"


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_the_builder_and_single_event_apply_agree(path):
    events = json.loads(path.read_text())["events"]
    one_by_one = empty_snapshot()
    for event in events:
        apply(one_by_one, event)
    assert one_by_one == reduce(events)


def test_the_builder_can_be_read_midway_and_go_on():
    from jupyter_agentruns.reducer import Snapshot

    builder = Snapshot()
    builder.apply({"type": "message.started", "data": {"message_id": "m1", "role": "assistant"}})
    builder.apply({"type": "text.delta", "data": {"message_id": "m1", "delta": "ab"}})
    assert builder.to_dict()["messages"][0]["text"] == "ab"
    builder.apply({"type": "text.delta", "data": {"message_id": "m1", "delta": "cd"}})
    builder.apply({"type": "text.delta", "data": {"message_id": "m2", "delta": "x"}})
    texts = [m["text"] for m in builder.to_dict()["messages"]]
    assert texts == ["abcd", "x"]


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_the_builders_streamed_json_is_the_snapshot_at_every_step(path, monkeypatch):
    # Tiny chunks, so that pieces are joined into chunks again and again.
    monkeypatch.setattr(Snapshot, "CHUNK_CHARS", 7)
    events = json.loads(path.read_text())["events"]
    builder = Snapshot()
    for count, event in enumerate(events, start=1):
        builder.apply(event)
        assert json.loads("".join(builder.json_chunks())) == reduce(events[:count])
    assert builder.to_dict() == reduce(events)


def test_the_lifecycle_statuses_are_the_shared_ones():
    # js/src/status.js is held to the same file.
    from jupyter_agentruns import lifecycle

    shared = json.loads(
        (Path(__file__).parent / "vectors" / "lifecycle" / "statuses.json").read_text()
    )
    assert list(lifecycle.ALL_STATUSES) == shared["statuses"]
    assert sorted(lifecycle.ACTIVE_STATUSES) == shared["active"]
    assert sorted(lifecycle.TERMINAL_STATUSES) == shared["terminal"]
    assert lifecycle.TERMINAL_EVENTS == shared["terminal_events"]


def test_a_run_s_end_closes_its_open_steps_and_questions_as_the_shared_vector_says():
    from jupyter_agentruns import lifecycle

    events = json.loads(
        (Path(__file__).parent / "vectors" / "ended_with_open_steps.json").read_text()
    )["events"]
    before = [e for e in events if e["type"] != "run.cancel_requested"][:5]
    end = events[-1]
    ending = lifecycle.ending(reduce(before), lifecycle.cancelled(**end["data"]))
    assert [(t.type, t.data) for t in ending] == [(e["type"], e["data"]) for e in events[6:]]
    # Ended interrupted, the same step is cut by an interruption, and a step ended is left alone.
    ending = lifecycle.ending(reduce(before), lifecycle.interrupted("lease_expired"))
    [step] = [t.data for t in ending if t.type == "tool.completed"]
    assert step["call_id"] == "c1" and step["error"]["type"] == "interrupted"
