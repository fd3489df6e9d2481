"""HTTP handlers, one module per resource, all under ``{base_url}api/agentruns/``."""

from . import agents, base, events, runs

default_handlers = [*agents.default_handlers, *runs.default_handlers, *events.default_handlers, *base.default_handlers]
