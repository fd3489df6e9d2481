"""``GET openapi.json``: the API's OpenAPI document, with this server's prefix in ``servers``."""

from __future__ import annotations

import functools
import json
from importlib.resources import files
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from .base import AgentRunsHandler


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI document shipped in the package (its server is ``/api/agentruns``)."""
    return json.loads(
        files("jupyter_agentruns").joinpath("openapi.json").read_text(encoding="utf-8")
    )


class OpenApiHandler(AgentRunsHandler):
    @web.authenticated
    @authorized
    def get(self) -> None:
        # Behind JupyterHub the API lives under the server's base_url, e.g. /user/alice/.
        document = {**openapi_document(), "servers": [{"url": self.api_url()}]}
        self.write_json(document)


default_handlers = [(r"api/agentruns/openapi\.json", OpenApiHandler)]
