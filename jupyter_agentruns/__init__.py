"""Durable, resumable AI agent runs owned by the Jupyter server.

In a notebook::

    %%agent demo
    weather in Shanghai

or, from a program, ``submit("demo", {"prompt": "weather in Shanghai"})``.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = [
    "AgentRunsError", "Run", "ServerNotFound", "__version__", "agent", "attach", "runs", "submit",
]  # fmt: skip

# The notebook API needs ipywidgets; the server extension does not load it.
_NOTEBOOK_API = {"Run", "attach", "runs", "submit"}
_ERRORS = {"AgentRunsError", "ServerNotFound"}


def __getattr__(name: str):
    if name in _NOTEBOOK_API:
        from .kernel import widget

        return getattr(widget, name)
    if name in _ERRORS:
        # The kernel's client alone: no ipywidgets needed to catch its errors.
        from .kernel import client

        return getattr(client, name)
    if name == "agent":
        # Loaded when asked for: its input schemas need jsonschema, a second to import,
        # which the command line and the kernel's client do without.
        from .agents import agent

        return agent
    raise AttributeError(f"module 'jupyter_agentruns' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """``%load_ext jupyter_agentruns``: the ``%%agent`` cell magic and ``%agent`` line magic."""
    from .kernel import magics

    magics.load_ipython_extension(ipython)


def _jupyter_server_extension_points():
    from .app import AgentRuns

    return [{"module": "jupyter_agentruns", "app": AgentRuns}]
