"""Why an ACP agent's run failed: each error's ``error_type`` is the run's ``error.type``."""

from __future__ import annotations


class AcpFailure(Exception):
    """An ACP agent's run cannot go on."""

    error_type = "agent_error"


class AgentExited(AcpFailure):
    """The agent's process exited, or never answered ``initialize`` (the message has its stderr's tail)."""

    error_type = "agent_exited"


class AgentAuthRequired(AcpFailure):
    """The agent needs a login first (the message has its own instructions)."""

    error_type = "agent_auth_required"


class AgentError(AcpFailure):
    """The agent refused a request, or broke the protocol."""

    error_type = "agent_error"


class Refusal(AcpFailure):
    """The agent refused to answer (stop reason ``refusal``)."""

    error_type = "refused"


class InvalidInput(AcpFailure):
    """The run's input names a file, a mode or a model that cannot be used."""

    error_type = "invalid_input"


class CannotResume(AcpFailure):
    """The run was taken over, but its agent cannot load the conversation to go on with it."""

    error_type = "agent_cannot_resume"


class CannotFork(AcpFailure):
    """The run is a fork, but the conversation of the run it came from cannot be copied."""

    error_type = "agent_cannot_fork"
