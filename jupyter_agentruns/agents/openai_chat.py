"""The old name of :mod:`jupyter_agentruns.agents.openai`: configurations that name it keep working."""

from .openai import OpenAIAgent
from .tools import tool

__all__ = ["OpenAIAgent", "tool"]
