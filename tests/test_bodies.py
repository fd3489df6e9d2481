"""Request bodies: whatever bytes arrive, the answer is a JSON object of real JSON, or a 400."""

import asyncio
import json
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_agentruns import jsonio
from jupyter_agentruns.errors import Problem
from jupyter_agentruns.handlers.base import parse_body
from jupyter_agentruns.handlers.errors import status_of
from jupyter_agentruns.handlers.runs import submit_request

# Text, sometimes with lone surrogates or NUL in it (which JSON's \u escapes can carry).
TEXT = st.text(
    alphabet=st.characters() | st.characters(categories=["Cs"]) | st.just("\x00"), max_size=20
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "agent": TEXT | VALUES,
        "input": VALUES | st.dictionaries(TEXT, VALUES, max_size=4),
        "session": TEXT | VALUES,
        "metadata": VALUES,
        "retry_of": TEXT | VALUES,
    },
)


def depth(value):
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def texts(value):
    """Every string of a JSON value, its keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, child in value.items():
            yield key
            yield from texts(child)
    elif isinstance(value, list):
        for child in value:
            yield from texts(child)


def accepted_or_400(raw: bytes):
    """parse_body and submit_request either accept ``raw`` or raise a 400: nothing else."""
    try:
        request = submit_request(parse_body(raw))
    except Problem as error:
        assert status_of(error) in (400, 413), error
        assert error.code == "invalid_request" and error.message
        return None
    # What was accepted can be stored, in SQLite or PostgreSQL text, and written back
    # as JSON, in UTF-8.
    jsonio.dumps(request.input).encode("utf-8")
    accepted = [request.agent, request.session, request.retry_of, request.input, request.metadata]
    for text in texts(accepted):
        text.encode("utf-8")
        assert "\x00" not in text
    return request


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(FIELDS)
def test_any_json_shaped_body_is_accepted_clean_or_refused_with_400(body):
    raw = json.dumps(body, allow_nan=True).encode()
    request = accepted_or_400(raw)
    if request is not None:
        assert depth(request.input) < jsonio.MAX_DEPTH


@settings(max_examples=400)
@given(
    st.binary(max_size=200)
    | st.text(alphabet='{}[]":,0123456789.eE+-NaInfinityu\\ ').map(str.encode)
)
def test_any_bytes_are_accepted_clean_or_refused_with_400(raw):
    accepted_or_400(raw)


def test_nesting_at_any_depth_is_a_400_not_a_recursion_error():
    for levels in (jsonio.MAX_DEPTH, 1000, 100_000):
        raw = b'{"agent": "demo", "input": {"x": ' + b"[" * levels + b"]" * levels + b"}}"
        assert accepted_or_400(raw) is None


def test_a_nul_in_any_string_or_key_is_a_400_naming_where():
    for raw, path in [
        (b'{"agent": "demo", "input": {"a": ["x", "y\\u0000"]}}', "input.a[1]"),
        (b'{"agent": "demo", "input": {}, "metadata": {"k\\u0000": 1}}', "metadata"),
        (b'{"agent": "demo", "input": {}, "session": "\\u0000"}', "session"),
    ]:
        with pytest.raises(Problem) as refused:
            parse_body(raw)
        assert status_of(refused.value) == 400 and refused.value.body()["path"] == path
        assert "NUL" in refused.value.message


def test_a_problem_in_the_body_itself_names_no_path():
    # A top-level key is in no field: the answer has no `path`, rather than a null one.
    with pytest.raises(Problem) as refused:
        parse_body(b'{"\\u0000agent": "demo"}')
    assert status_of(refused.value) == 400 and "path" not in refused.value.body()


async def exchange(api_url: str, requests: list[tuple[str, str, dict, bytes]]):
    """Send requests one after another on one connection, as raw HTTP/1.1.

    Returns each response's status and headers (lower-cased names), and whether
    the server closed the connection after the last.
    """
    url = urlsplit(api_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    answers = []
    try:
        for method, path, headers, body in requests:
            head = [f"{method} {url.path}{path} HTTP/1.1", f"Host: {url.netloc}"]
            head += [f"{name}: {value}" for name, value in headers.items()]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            status_line, *lines = (
                (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode().split("\r\n")
            )
            fields = dict(line.split(": ", 1) for line in lines if line)
            fields = {name.lower(): value for name, value in fields.items()}
            await reader.readexactly(int(fields.get("content-length", 0)))
            answers.append((int(status_line.split()[1]), fields))
        try:
            closed = await asyncio.wait_for(reader.read(1), 1) == b""
        except asyncio.TimeoutError:
            closed = False
    finally:
        writer.close()
    return answers, closed


@pytest.mark.parametrize("agentruns_config", [{"max_body_bytes": 1000}])
@pytest.mark.parametrize(
    ("method", "path", "credentials", "length", "status"),
    [
        ("POST", "runs", "good", 5000, 413),
        ("DELETE", "runs/run_x", "good", 5000, 413),
        ("POST", "runs", "wrong", 20, 403),
        ("POST", "runs/run_x/cancel", "wrong", 20, 403),
    ],
)
async def test_an_answer_before_the_body_is_read_says_the_connection_closes(
    api_url, token, method, path, credentials, length, status
):
    # The server answers from the headers alone and does not read the body:
    # the connection cannot carry another request, and the answer must say so.
    authorization = f"token {token if credentials == 'good' else 'wrong'}"
    headers = {"Authorization": authorization, "Content-Length": length}
    answers, closed = await exchange(api_url, [(method, path, headers, b"")])
    assert answers[0][0] == status
    assert answers[0][1].get("connection") == "close" and closed
    # A client that heeds it sends its next request on a new connection: an answer, never a reset.
    async with httpx.AsyncClient(
        base_url=api_url, headers={"Authorization": authorization}
    ) as client:
        for _ in range(3):
            response = await client.request(method, path, content=b"x" * length)
            assert response.status_code == status and response.json()["message"]


async def test_an_error_after_the_body_is_read_keeps_the_connection(api_url, token):
    headers = {"Authorization": f"token {token}", "Content-Length": 1}
    answers, closed = await exchange(
        api_url,
        [("POST", "runs", headers, b"{"), ("GET", "agents", headers | {"Content-Length": 0}, b"")],
    )
    assert [status for status, _ in answers] == [400, 200]
    assert "connection" not in answers[0][1] and not closed
