"""Reference pages generated from the code, so that they cannot drift from it.

Each ``*_markdown()`` function returns a MyST Markdown page made from what
the package itself declares:

- ``settings_markdown``: every ``c.AgentRuns.*`` and ``c.OpenAIAgent.*``
  trait with its type, default and help;
- ``cli_markdown``: every ``jupyter agentruns`` command from its argparse parser;
- ``metrics_markdown``: every metric of ``jupyter_agentruns.metrics``;
- ``rest_markdown``: every endpoint and schema of ``jupyter_agentruns/openapi.json``.

As a Sphinx extension it writes them into ``reference/generated/`` when the
build starts (the hand-written reference pages include them). Run as a
script, it writes them there without Sphinx: ``python docs/_ext/agentruns_reference.py``.
The tests call the functions directly (tests/test_docs.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
GENERATED = DOCS / "reference" / "generated"

# Defaults computed when the server starts, which the class cannot show: said in words.
COMPUTED_DEFAULTS = {
    ("AgentRuns", "db_path"): "`<jupyter data dir>/agentruns.sqlite3` (`jupyter --data-dir`)",
    (
        "AgentRuns",
        "store_url",
    ): 'the environment variable `AGENTRUNS_STORE_URL`, else `""` (SQLite)',
}


def escape(text: str) -> str:
    """Plain text (a help string) as Markdown that shows it as written."""
    return re.sub(r"([\\`*_\[\]<>|#{}])", r"\\\1", " ".join(text.split()))


def code(value: str) -> str:
    """``value`` as inline code, whatever backticks it holds."""
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


# Settings -------------------------------------------------------------------


def _default_text(owner: str, name: str, trait: Any, computed: set[str]) -> str:
    if (owner, name) in COMPUTED_DEFAULTS:
        return COMPUTED_DEFAULTS[(owner, name)]
    if name in computed:
        raise ValueError(
            f"c.{owner}.{name} has a default computed at start: say it in COMPUTED_DEFAULTS"
        )
    value = trait.default()  # a container's own default: {} or [], not Undefined
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return code(repr(value))


def _type_text(trait: Any) -> str:
    from traitlets import Enum, Union

    if isinstance(trait, Enum):
        return "one of " + ", ".join(code(repr(v)) for v in trait.values)
    if isinstance(trait, Union):
        return " or ".join(type(t).__name__ for t in trait.trait_types)
    return type(trait).__name__


def own_traits(cls: type, *bases: type) -> dict[str, Any]:
    """The configurable traits of ``cls`` that none of ``bases`` (a framework's classes) has."""
    inherited = {name for base in bases for name in base.class_traits(config=True)}
    return {n: t for n, t in cls.class_traits(config=True).items() if n not in inherited}


def traits_markdown(owner: str, cls: type, intro: str, *bases: type) -> list[str]:
    computed = set(getattr(cls, "_trait_default_generators", {}))
    lines = [f"## `c.{owner}.*`", "", intro, ""]
    for name, trait in sorted(own_traits(cls, *bases).items()):
        lines += [
            f"### `{name}`",
            "",
            f"`c.{owner}.{name}` · {_type_text(trait)} · default: "
            f"{_default_text(owner, name, trait, computed)}",
            "",
            escape(trait.help or "") or "(no help text)",
            "",
        ]
    return lines


def settings_markdown() -> str:
    from jupyter_server.extension.application import ExtensionApp
    from traitlets.config import Configurable

    from jupyter_agentruns.agents.openai.agent import OpenAIAgent
    from jupyter_agentruns.app import AgentRuns

    lines = traits_markdown(
        "AgentRuns",
        AgentRuns,
        "The server extension's settings: `c.AgentRuns.<name> = …` in a "
        "`jupyter_server_config.py`, or `--AgentRuns.<name>=…` on the command line. "
        "(Those every Jupyter extension app has, such as `log_level`, are jupyter_server's.)",
        ExtensionApp,
    )
    lines += traits_markdown(
        "OpenAIAgent",
        OpenAIAgent,
        "The built-in `openai` agent's settings (see {doc}`/tutorials/connect-a-model`): "
        "`c.OpenAIAgent.<name> = …` in the same files.",
        Configurable,
    )
    return "\n".join(lines)


# Command line ---------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> tuple[Any, dict[str, str]]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    return action, helps


def _argument_lines(action: argparse.Action) -> list[str]:
    if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
        return []
    if action.option_strings:
        name = ", ".join(action.option_strings)
        if action.nargs != 0:
            name += " " + (action.metavar or action.dest.upper())
    else:
        name = action.metavar or action.dest
    words = [escape(action.help)] if action.help else []
    if action.choices:
        words.append("one of " + ", ".join(code(str(c)) for c in action.choices))
    if action.required and action.option_strings:
        words.append("required")
    if action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0:
        if not (action.help and "default" in action.help):
            words.append(f"default {code(str(action.default))}")
    return [f"- {code(name)}" + (": " + "; ".join(words) if words else "")]


def cli_markdown() -> str:
    from jupyter_agentruns.cli import STORE_COMMANDS, build_parser

    os.environ["COLUMNS"] = "88"  # argparse wraps usage lines at the terminal's width
    parser = build_parser()
    action, helps = _subcommands(parser)
    lines = [
        "## Commands",
        "",
        "Each command, as its parser declares it (`jupyter agentruns COMMAND --help` "
        "prints the same).",
        "",
    ]
    for name, sub in action.choices.items():
        where = (
            "Reads the store itself; needs no server."
            if name in STORE_COMMANDS
            else "Asks a running server (see {ref}`finding-the-server`)."
        )
        lines += [f"### `jupyter agentruns {name}`", "", escape(helps[name]) + ".", "", where, ""]
        if sub.description:
            lines += [escape(sub.description), ""]
        lines += ["```text", sub.format_usage().strip(), "```", ""]
        arguments = [line for a in sub._actions for line in _argument_lines(a)]
        if arguments:
            lines += arguments + [""]
        if sub.epilog:
            lines += [escape(sub.epilog), ""]
    return "\n".join(lines)


# Metrics --------------------------------------------------------------------


def metric_entries() -> list[dict[str, Any]]:
    """Every metric of ``jupyter_agentruns.metrics``: name as exported, type, labels, help."""
    from prometheus_client.metrics import MetricWrapperBase

    from jupyter_agentruns import metrics

    entries = []
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            name = value._name + ("_total" if value._type == "counter" else "")
            labels = {
                label: sorted({key[i] for key in value._metrics})
                for i, label in enumerate(value._labelnames)
            }
            entries.append(
                {"name": name, "type": value._type, "labels": labels, "help": value._documentation}
            )
        elif isinstance(value, metrics.Sampled):
            labels = {value.label: ["a run status"] if value.label == "status" else []}
            entries.append(
                {
                    "name": value.name,
                    "type": "gauge",
                    "labels": labels if value.label else {},
                    "help": value.documentation,
                }
            )
    return sorted(entries, key=lambda entry: entry["name"])


def metrics_markdown() -> str:
    lines = ["## Every metric", ""]
    for entry in metric_entries():
        lines += [f"### `{entry['name']}`", "", f"{entry['type']}"]
        for label, values in entry["labels"].items():
            shown = ", ".join(code(v) if v != "a run status" else v for v in values)
            lines[-1] += f" · label {code(label)}" + (f": {shown}" if shown else "")
        if entry["type"] == "histogram":
            lines[-1] += f" · series `{entry['name']}_bucket`, `_count`, `_sum`"
        lines += ["", escape(entry["help"]), ""]
    return "\n".join(lines)


# REST API -------------------------------------------------------------------

METHODS = ("get", "post", "put", "patch", "delete")


def openapi() -> dict[str, Any]:
    import jupyter_agentruns

    return json.loads((Path(jupyter_agentruns.__file__).parent / "openapi.json").read_text())


def _resolve(document: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in item:
        node: Any = document
        for part in item["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        item = node
    return item


def _schema_name(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"{{ref}}`{name} <schema-{name.lower()}>`"
    if schema.get("type") == "array" and "items" in schema:
        return f"array of {_schema_name(schema['items'])}"
    if "allOf" in schema:  # an Error narrowed to its codes
        parts = schema["allOf"]
        base = next((_schema_name(p) for p in parts if "$ref" in p), "")
        codes = [c for p in parts for c in p.get("properties", {}).get("error", {}).get("enum", [])]
        return base + (" " + ", ".join(code(c) for c in codes) if codes else "")
    if "oneOf" in schema or "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema.get("oneOf", schema.get("anyOf")))
    return code(str(schema["type"])) if "type" in schema else ""


def _one_paragraph(text: str) -> str:
    return " ".join(text.split())


def endpoints() -> list[tuple[str, str]]:
    """Every (METHOD, path) of the OpenAPI document."""
    return [
        (method.upper(), path)
        for path, item in openapi()["paths"].items()
        for method in METHODS
        if method in item
    ]


def rest_markdown() -> str:
    document = openapi()
    lines = ["## Endpoints", ""]
    for path, item in document["paths"].items():
        shared = item.get("parameters", [])
        for method in METHODS:
            if method not in item:
                continue
            operation = item[method]
            lines += [f"### `{method.upper()} {path.lstrip('/')}`", ""]
            lines += [f"**{_one_paragraph(operation.get('summary', ''))}**", ""]
            if operation.get("description"):
                lines += [operation["description"].strip(), ""]
            parameters = [
                _resolve(document, p) for p in [*shared, *operation.get("parameters", [])]
            ]
            if parameters:
                lines += ["Parameters:", ""]
                for parameter in parameters:
                    required = ", required" if parameter.get("required") else ""
                    text = _one_paragraph(parameter.get("description", ""))
                    lines.append(
                        f"- `{parameter['name']}` ({parameter['in']}{required}): {text}".rstrip(
                            ": "
                        )
                    )
                lines.append("")
            body = operation.get("requestBody")
            if body:
                body = _resolve(document, body)
                for media, content in body.get("content", {}).items():
                    lines += [f"Body ({code(media)}): {_schema_name(content.get('schema'))}", ""]
            lines += ["Answers:", ""]
            for status, response in operation.get("responses", {}).items():
                response = _resolve(document, response)
                media = ", ".join(
                    f"{code(m)} {_schema_name(c.get('schema'))}".strip()
                    for m, c in response.get("content", {}).items()
                )
                text = _one_paragraph(response.get("description", ""))
                lines.append(f"- `{status}`: {text}" + (f" ({media})" if media else ""))
            lines.append("")
    lines += ["## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        lines += [f"({'schema-' + name.lower()})=", f"### `{name}`", ""]
        if schema.get("description"):
            lines += [schema["description"].strip(), ""]
        if "enum" in schema:
            lines += ["One of " + ", ".join(code(json.dumps(v)) for v in schema["enum"]) + ".", ""]
        required = set(schema.get("required", []))
        properties = schema.get("properties", {})
        for prop, spec in properties.items():
            kind = _schema_name(spec) if "$ref" in spec or "type" in spec else ""
            text = _one_paragraph(spec.get("description", ""))
            mark = " (required)" if prop in required else ""
            lines.append(f"- `{prop}`{mark}: " + " ".join(w for w in (kind, text) if w))
        if properties:
            lines.append("")
    return "\n".join(lines)


# Writing them ---------------------------------------------------------------

PAGES = {
    "settings.md": settings_markdown,
    "cli.md": cli_markdown,
    "metrics.md": metrics_markdown,
    "rest-api.md": rest_markdown,
}


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
    app.connect("builder-inited", lambda app: write_pages())
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    for path in write_pages():
        print(path)
