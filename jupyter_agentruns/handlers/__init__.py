"""HTTP handlers, one module per resource, all under ``{base_url}api/agentruns/``."""

from . import (
    agents,
    base,
    conversations,
    edits,
    events,
    hooks,
    inputs,
    mcp,
    openapi,
    pages,
    runs,
    schedules,
    streams,
    usage,
)

default_handlers = [
    *agents.default_handlers,
    *usage.default_handlers,
    *runs.default_handlers,
    *schedules.default_handlers,
    *conversations.default_handlers,
    *inputs.default_handlers,
    *edits.default_handlers,
    *events.default_handlers,
    *streams.default_handlers,
    *hooks.default_handlers,
    *pages.default_handlers,
    *mcp.default_handlers,
    *openapi.default_handlers,
    *base.default_handlers,  # the JSON 404 for anything else: last
]
