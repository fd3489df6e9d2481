"""The Python API reference, generated from the docstrings, so that it cannot drift from them.

Two pages, each made of the public members it lists, named by the path a
user imports them from (wherever the code behind them lives):

- ``notebook_api_markdown``: what a notebook calls, ``jupyter_agentruns.submit``,
  ``runs``, ``attach`` and the ``Run`` they return;
- ``agent_api_markdown``: what an agent is given and may use, the
  ``jupyter_agentruns.agents.Run`` it receives (which
  ``jupyter_agentruns.executor.RunContext`` implements), ``agent`` and the
  errors it may see.

A listed member without a docstring (a trait without ``help``) fails the
build: ``Undocumented`` names every one. So does a member of the run an
agent really gets (``RunContext``) that ``agents.Run`` does not describe.

As a Sphinx extension it writes the pages into ``reference/generated/`` when
the build starts; run as a script it writes them without Sphinx:
``python docs/_ext/agentruns_api.py``. The tests call the functions directly
(tests/test_docs.py).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import textwrap
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
GENERATED = DOCS / "reference" / "generated"
WIDTH = 88

NOTEBOOK_API = ["jupyter_agentruns.submit", "jupyter_agentruns.runs", "jupyter_agentruns.attach"]
NOTEBOOK_RUN = "jupyter_agentruns.Run"
NOTEBOOK_ERRORS = ["jupyter_agentruns.AgentRunsError", "jupyter_agentruns.ServerNotFound"]
# The widget's state that only its view reads: not for a notebook's code.
VIEW_STATE = {"base_url"}

AGENT_API = ["jupyter_agentruns.agent", "jupyter_agentruns.agents.ForkPoint"]
AGENT_RUN = "jupyter_agentruns.agents.Run"
AGENT_RUN_IMPLEMENTATION = "jupyter_agentruns.executor.RunContext"
AGENT_ERRORS = [
    "jupyter_agentruns.agents.RunClosed",
    "jupyter_agentruns.agents.EventTooLarge",
    "jupyter_agentruns.agents.TokenBudgetExceeded",
    "jupyter_agentruns.agents.ForkUnsupported",
    "jupyter_agentruns.agents.error_object",
]
# What ``jupyter_agentruns.agents`` exports for the server (finding and loading
# agents), not for an agent: the how-to says how agents are found.
SERVER_SIDE = {"ENTRY_POINT_GROUP", "AgentSpec", "import_object", "load_agents"}


class Undocumented(ValueError):
    """Public members the reference would show bare (no docstring) or leave out."""


def resolve(path: str) -> Any:
    """The object a public import path names: ``jupyter_agentruns.agents.Run``."""
    module_name, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def docstring(obj: Any) -> str | None:
    """``obj``'s own docstring, dedented (none inherited from a base class)."""
    doc = getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else None


# Signatures -------------------------------------------------------------------


class _Shown(str):
    """An annotation kept as its source text (``str | None``), shown without quotes."""

    def __repr__(self) -> str:
        return str(self)


def _annotation(value: Any) -> Any:
    if value is inspect.Parameter.empty:
        return value
    return _Shown(value if isinstance(value, str) else inspect.formatannotation(value))


def signature(prefix: str, fn: Any, *, method: bool = False) -> str:
    """``prefix(parameters) -> result`` as the code declares it, one parameter a line when long."""
    declared = inspect.signature(fn)
    parameters = list(declared.parameters.values())[1 if method else 0 :]
    shown = declared.replace(
        parameters=[p.replace(annotation=_annotation(p.annotation)) for p in parameters],
        return_annotation=inspect.Signature.empty,
    )
    returns = _annotation(declared.return_annotation)
    result = f" -> {returns}" if returns is not inspect.Signature.empty else ""
    line = f"{prefix}{shown}{result}"
    if len(line) <= WIDTH:
        return line
    parts = "".join(f"    {part.strip()},\n" for part in _split_top_level(str(shown)[1:-1]))
    return f"{prefix}(\n{parts}){result}"


def _split_top_level(text: str) -> list[str]:
    """``text`` split at its commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for index, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    return [*parts, text[start:]]


# Members ----------------------------------------------------------------------


@dataclass
class Member:
    """One documented name: its heading, the line of code that uses it, its docstring."""

    path: str  # what the page calls it: ``run.wait``
    usage: str
    doc: str | None
    source: str  # its public import path: ``jupyter_agentruns.Run.wait``


def _following_docstrings(cls: type) -> dict[str, str]:
    """Attribute docstrings: the string literal after ``name: type`` in a class body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found = {}
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[statement.target.id] = inspect.cleandoc(following.value.value)
    return found


def _declared_names(cls: type) -> list[str]:
    """The public names ``cls``'s own body declares, in its order (annotations included)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names = []
    for statement in tree.body[0].body:  # type: ignore[attr-defined]
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            names.append(statement.target.id)
        elif isinstance(statement, ast.Assign):
            names += [t.id for t in statement.targets if isinstance(t, ast.Name)]
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(statement.name)
    return [name for name in dict.fromkeys(names) if not name.startswith("_")]


def _trait_type(trait: Any) -> str:
    names = {"Unicode": "str", "Int": "int", "Bool": "bool", "Float": "float"}
    return names.get(type(trait).__name__, type(trait).__name__)


def class_members(path: str, instance: str, *, skip: Collection[str] = ()) -> list[Member]:
    """The public members the class ``path`` declares itself, as used on ``instance`` (``run``)."""
    cls = resolve(path)
    attribute_docs = _following_docstrings(cls)
    annotations = inspect.get_annotations(cls)
    members = []
    for name in _declared_names(cls):
        if name in skip:
            continue
        value = inspect.getattr_static(cls, name, None)
        used, source = f"{instance}.{name}", f"{path}.{name}"
        if isinstance(value, property):
            returns = _annotation(inspect.signature(value.fget).return_annotation)
            shown = f": {returns}" if returns is not inspect.Parameter.empty else ""
            usage, doc = f"{used}{shown}", docstring(value)
        elif inspect.isfunction(value):
            prefix = ("await " if inspect.iscoroutinefunction(value) else "") + used
            usage, doc = signature(prefix, value, method=True), docstring(value)
        elif hasattr(value, "help") and hasattr(value, "default_value"):  # a trait
            usage = f"{used}: {_trait_type(value)}"
            doc = inspect.cleandoc(value.help) if value.help else None
        else:
            shown = f": {annotations[name]}" if name in annotations else ""
            usage, doc = f"{used}{shown}", attribute_docs.get(name)
        members.append(Member(used, usage, doc, source))
    return members


def function_member(path: str) -> Member:
    fn = resolve(path)
    return Member(path, signature(path, fn), docstring(fn), path)


def class_member(path: str) -> Member:
    cls = resolve(path)
    bases = [b.__name__ for b in cls.__bases__ if b is not object]
    return Member(path, f"class {path}({', '.join(bases)})", docstring(cls), path)


def member(path: str) -> Member:
    """The member ``path`` names, a class or a function."""
    return class_member(path) if inspect.isclass(resolve(path)) else function_member(path)


def check_documented(members: list[Member]) -> None:
    missing = [member.source for member in members if not member.doc]
    if missing:
        raise Undocumented(
            "The API reference is made from docstrings; give these one: " + ", ".join(missing)
        )


def section(member: Member, level: str) -> list[str]:
    assert member.doc is not None  # checked before
    return [f"{level} `{member.path}`", "", "```python", member.usage, "```", "", member.doc, ""]


def page(parts: list[tuple[str | None, list[Member]]]) -> str:
    """The page of ``parts``: members under a heading of their own, or at the top."""
    check_documented([member for _, members in parts for member in members])
    lines: list[str] = []
    for heading, members in parts:
        if heading:
            lines += [f"## {heading}", ""]
        level = "###" if heading else "##"
        lines += [line for member in members for line in section(member, level)]
    return "\n".join(lines)


# The pages --------------------------------------------------------------------


def notebook_api_members() -> list[tuple[str | None, list[Member]]]:
    return [
        (None, [member(path) for path in [*NOTEBOOK_API, NOTEBOOK_RUN]]),
        ("What a `Run` offers", class_members(NOTEBOOK_RUN, "run", skip=VIEW_STATE)),
        ("Errors", [member(path) for path in NOTEBOOK_ERRORS]),
    ]


def agent_run_names() -> set[str]:
    """The public names of the run an agent really gets (``RunContext``): what it sets and declares."""
    cls = resolve(AGENT_RUN_IMPLEMENTATION)
    names = set(_declared_names(cls))
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and not node.attr.startswith("_")
        ):
            names.add(node.attr)
    return names


def agent_api_members() -> list[tuple[str | None, list[Member]]]:
    members = class_members(AGENT_RUN, "run")
    undescribed = agent_run_names() - {member.path.removeprefix("run.") for member in members}
    if undescribed:
        raise Undocumented(
            f"{AGENT_RUN_IMPLEMENTATION} offers {', '.join(sorted(undescribed))}, "
            f"which {AGENT_RUN} does not describe"
        )
    return [
        (None, [member(path) for path in [*AGENT_API, AGENT_RUN]]),
        ("What `run` offers", members),
        ("Errors", [member(path) for path in AGENT_ERRORS]),
    ]


def notebook_api_markdown() -> str:
    return page(notebook_api_members())


def agent_api_markdown() -> str:
    return page(agent_api_members())


PAGES = {"notebook-api.md": notebook_api_markdown, "agent-api.md": agent_api_markdown}


def write_pages(directory: Path = GENERATED) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in PAGES.items():
        path = directory / name
        text = make() + "\n"
        if not path.exists() or path.read_text() != text:  # unchanged: no rebuild of its pages
            path.write_text(text)
        written.append(path)
    return written


def setup(app: Any) -> dict[str, Any]:
    from sphinx.util import logging

    log = logging.getLogger(__name__)

    def write(app: Any) -> None:
        try:
            write_pages()
        except Undocumented as exc:  # a warning, so -W fails the build saying why
            log.warning("%s", exc, type="agentruns", subtype="docstring")

    app.connect("builder-inited", write)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    for path in write_pages():
        print(path)
