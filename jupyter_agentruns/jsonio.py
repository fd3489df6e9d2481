"""JSON in and out of the API, strictly.

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity`` and writes them
back; none of them is JSON, a browser's ``JSON.parse`` refuses the answer, and
a NaN that reaches ``asyncio.sleep`` corrupts the event loop's timers. Strings
may also hold lone surrogates (``"\\ud800"``), which no UTF-8 store can keep,
or NUL (``"\\u0000"``), which PostgreSQL refuses in text: refused in every
string and key, so that SQLite and PostgreSQL answer a body alike.
Bodies are checked here once, and every answer is written with
``allow_nan=False``. The kernel's client uses the same check before it sends.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# Deeper nesting than any real input, and far from Python's recursion limit.
MAX_DEPTH = 64

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_NUL = (
    "holds a NUL character (\\u0000), which the store cannot keep in text: remove it, "
    "or encode binary data (base64)"
)
_ENCODER = json.JSONEncoder(allow_nan=False)
_COMPACT = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


class UnsafeJson(ValueError):
    """A value that is not JSON every client can read; ``path`` says where (``input.delay``)."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{'The field ' + path if path else 'The body'} {problem}")
        self.path = path
        self.problem = problem

    def _render_traceback_(self) -> list[str]:
        # In a notebook (``submit()`` checks before sending), the one line that says what to
        # fix: the frames are the library's own and say nothing more.
        return [f"{type(self).__name__}: {self}"]


def dumps(value: Any, *, compact: bool = False) -> str:
    """JSON text of ``value``; a non-finite number raises ``ValueError``."""
    return (_COMPACT if compact else _ENCODER).encode(value)


def check(value: Any, path: str = "") -> None:
    """Raise ``UnsafeJson`` naming the first non-finite number, lone surrogate, NUL or too deep nesting."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                name = "NaN" if math.isnan(item) else ("Infinity" if item > 0 else "-Infinity")
                raise UnsafeJson(
                    where, f"is {name}, which is not a JSON number: send a finite number or null"
                )
        elif isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                raise UnsafeJson(where, "holds a lone UTF-16 surrogate, which is not text")
            if "\x00" in item:
                raise UnsafeJson(where, _NUL)
        elif isinstance(item, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise UnsafeJson(where, f"is nested deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key in item:
                    if isinstance(key, str) and _LONE_SURROGATE.search(key):
                        raise UnsafeJson(where, "has a key holding a lone UTF-16 surrogate")
                    if isinstance(key, str) and "\x00" in key:
                        raise UnsafeJson(where, f"has a key that {_NUL}")
                # Reversed onto the stack: the first problem in reading order is the one named.
                for key, child in reversed(item.items()):
                    stack.append((child, f"{where}.{key}" if where else str(key), depth + 1))
            else:
                for index in range(len(item) - 1, -1, -1):
                    stack.append((item[index], f"{where}[{index}]", depth + 1))


def finite(value: Any) -> Any:
    """``value`` with every NaN and infinity replaced by None (for data stored before they were refused)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(child) for key, child in value.items()}
    if isinstance(value, list):
        return [finite(child) for child in value]
    return value


def loads_body(raw: bytes) -> Any:
    """Parse a request body; ``ValueError`` says what is wrong and where."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise UnsafeJson("", f"is nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"The body is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except ValueError as exc:
        raise ValueError(f"The body is not valid JSON: {exc}") from None
    check(value)
    return value
