"""Request bodies: whatever bytes arrive, the answer is a JSON object of real JSON, or a 400."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_agentruns import jsonio
from jupyter_agentruns.errors import ApiError
from jupyter_agentruns.handlers.base import parse_body
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
    except ApiError as error:
        assert error.status in (400, 413), error
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
        with pytest.raises(ApiError) as refused:
            parse_body(raw)
        assert refused.value.status == 400 and refused.value.body()["path"] == path
        assert "NUL" in refused.value.message


def test_a_problem_in_the_body_itself_names_no_path():
    # A top-level key is in no field: the answer has no `path`, rather than a null one.
    with pytest.raises(ApiError) as refused:
        parse_body(b'{"\\u0000agent": "demo"}')
    assert refused.value.status == 400 and "path" not in refused.value.body()
