"""NUL characters, which PostgreSQL refuses in text: every store answers them alike, with a 4xx."""

import base64
import json

import pytest

from conftest import parse_sse, submit, waiting

NO_RUN = "run_\x00x"


async def asking(api):
    """A run waiting for a person's answer: its question and its cancel are live."""
    run = (await submit(api, input={"prompt": "q", "ask": True})).json()
    return await waiting(api, run["run_id"])


async def all_runs(api):
    return [run["run_id"] for run in (await api.get("runs")).json()["runs"]]


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("GET", "runs/{}", {}),
        ("GET", "runs/{}", {"Accept": "text/markdown"}),
        ("GET", "runs/{}/events", {}),
        ("GET", "runs/{}/events", {"Accept": "text/event-stream"}),
        ("POST", "runs/{}/cancel", {}),
        ("DELETE", "runs/{}", {}),
        ("POST", "runs/{}/inputs/r1", {}),
    ],
)
async def test_a_run_id_with_nul_is_a_run_that_does_not_exist(api, method, path, headers):
    run = await asking(api)
    body = {"choice": "approve"} if "inputs" in path else None
    response = await api.request(method, path.format("run_%00x"), headers=headers, json=body)
    assert response.status_code == 404, response.text
    assert response.json()["error"] == "run_not_found" and response.json()["message"]
    assert await all_runs(api) == [run["run_id"]]


async def test_a_question_id_with_nul_is_a_question_that_does_not_exist(api):
    run = await asking(api)
    response = await api.post(f"runs/{run['run_id']}/inputs/r%001", json={"choice": "approve"})
    assert response.status_code == 404, response.text
    assert response.json()["error"] == "input_not_found"
    assert (await api.get(f"runs/{run['run_id']}")).json()["status"] == "waiting"


async def test_a_page_stream_answers_a_run_id_with_nul_with_an_error_frame(api):
    run = await asking(api)
    await api.post(f"runs/{run['run_id']}/cancel")
    runs = f"{NO_RUN}:0,{run['run_id']}:{run['last_seq']}"
    async with api.stream("GET", "streams", params={"runs": runs}) as response:
        assert response.status_code == 200
        frames = [frame async for frame in parse_sse(response.aiter_lines())]
    errors = [frame["data"]["error"]["error"] for frame in frames if frame.get("event") == "error"]
    assert errors == ["run_not_found"]
    assert frames[-1]["data"]["type"] == "run.cancelled"


@pytest.mark.parametrize(
    ("params", "listed"),
    [
        # Tornado reads control characters in query arguments as spaces, then strips them.
        ({"session": "\x00"}, False),
        ({"session": "a\x00b"}, False),
        ({"retry_of": "run_\x00x"}, False),
        ({"status": "\x00"}, True),
        ({"before": "\x00"}, True),
    ],
)
async def test_a_list_filter_with_nul_is_read_as_tornado_reads_it(api, params, listed):
    run = await asking(api)
    response = await api.get("runs", params=params)
    assert response.status_code == 200, response.text
    assert [r["run_id"] for r in response.json()["runs"]] == ([run["run_id"]] if listed else [])


@pytest.mark.parametrize(
    "before",
    [
        "a\x00b",
        base64.urlsafe_b64encode(b"2026-01-01T00:00:00Z|run_x\x00").decode(),
        base64.urlsafe_b64encode(b"2026-01-01T00:00:00\x00Z|run_x").decode(),
    ],
)
async def test_a_before_cursor_with_nul_is_a_400(api, before):
    response = await api.get("runs", params={"before": before})
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_request"


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"agent": "de\x00mo"}, "agent"),
        ({"session": "notebooks/a\x00.ipynb"}, "session"),
        ({"retry_of": "run_\x00x"}, "retry_of"),
        ({"input": {"prompt": "weather\x00"}}, "input.prompt"),
        ({"input": {"prompt": "p", "x": ["ok", "\x00"]}}, "input.x[1]"),
        ({"metadata": {"title\x00": "t"}}, "metadata"),
        ({"metadata": {"title": "\x00"}}, "metadata.title"),
    ],
)
async def test_a_submit_with_nul_in_any_string_is_a_400_naming_where(api, body, path):
    run = await asking(api)
    payload = {"agent": "demo", "input": {"prompt": "p", "chunks": 2, "delay": 0}, **body}
    response = await api.post(
        "runs", content=json.dumps(payload), headers={"Idempotency-Key": "nul"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_request"
    assert response.json()["path"] == path and "NUL" in response.json()["message"]
    assert await all_runs(api) == [run["run_id"]]
    # Nothing was stored under the key: it is free for the request without the NUL.
    assert (await submit(api, key="nul")).status_code == 201


@pytest.mark.parametrize(
    ("endpoint", "body", "path"),
    [
        ("cancel", {"reason": "stop\x00"}, "reason"),
        ("inputs/{}", {"choice": "approve\x00"}, "choice"),
        ("inputs/{}", {"choice": "approve", "note": "\x00"}, "note"),
    ],
)
async def test_a_cancel_or_an_answer_with_nul_is_a_400_and_changes_nothing(
    api, endpoint, body, path
):
    run = await asking(api)
    endpoint = endpoint.format(run["snapshot"]["inputs"][0]["request_id"])
    response = await api.post(f"runs/{run['run_id']}/{endpoint}", content=json.dumps(body))
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_request" and response.json()["path"] == path
    after = (await api.get(f"runs/{run['run_id']}")).json()
    assert (after["status"], after["last_seq"]) == ("waiting", run["last_seq"])
