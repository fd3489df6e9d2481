"""The built-in ``openai`` agent: any OpenAI-compatible chat server, streamed, with tools.

OpenAI, Azure OpenAI (its ``/openai/v1/`` endpoint), Ollama, vLLM and llama.cpp
all speak this API. Two lines configure a local server::

    c.OpenAIAgent.base_url = "http://localhost:11434/v1"
    c.OpenAIAgent.model = "llama3.2"

Python functions become tools the model may call with
``c.OpenAIAgent.tools = {"name": "module:attr"}``: their JSON schema comes from
their signature and docstring, or from
:func:`jupyter_agentruns.agents.tools.tool`.
"""

from .agent import OpenAIAgent
from .errors import (
    InvalidInput,
    MaxToolIterationsExceeded,
    UpstreamAuth,
    UpstreamError,
    UpstreamProtocol,
    UpstreamRateLimit,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from .upstream import NO_KEY

__all__ = [
    "NO_KEY", "InvalidInput", "MaxToolIterationsExceeded", "OpenAIAgent", "UpstreamAuth",
    "UpstreamError", "UpstreamProtocol", "UpstreamRateLimit", "UpstreamTimeout",
    "UpstreamUnreachable",
]  # fmt: skip
