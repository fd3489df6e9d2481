"""HTTP handlers, one module per resource, all under ``{base_url}api/agentruns/``."""

from . import agents, base, edits, events, inputs, mcp, openapi, runs, streams, usage

default_handlers = [
    *agents.default_handlers,
    *usage.default_handlers,
    *runs.default_handlers,
    *inputs.default_handlers,
    *edits.default_handlers,
    *events.default_handlers,
    *streams.default_handlers,
    *mcp.default_handlers,
    *openapi.default_handlers,
    *base.default_handlers,  # the JSON 404 for anything else: last
]
