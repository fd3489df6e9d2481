"""The openai agent's errors: each ``error_type`` is the run's ``error.type``."""


class UpstreamError(Exception):
    """The model server answered with an error the agent cannot recover from."""

    error_type = "upstream_error"


class UpstreamAuth(UpstreamError):
    """The model server refused the API key (401 or 403)."""

    error_type = "upstream_auth"


class UpstreamRateLimit(UpstreamError):
    """Still rate limited (429) after every retry."""

    error_type = "upstream_rate_limit"


class UpstreamTimeout(UpstreamError):
    """The model server sent nothing for ``request_timeout`` seconds."""

    error_type = "upstream_timeout"


class UpstreamUnreachable(UpstreamError):
    """No connection to the model server, or it broke."""

    error_type = "upstream_unreachable"


class UpstreamProtocol(UpstreamError):
    """The stream is not what an OpenAI-compatible server sends."""

    error_type = "upstream_protocol"


class MaxToolIterationsExceeded(Exception):
    """The model still asked for tools after ``max_tool_iterations`` rounds."""

    error_type = "max_tool_iterations_exceeded"


class InvalidInput(ValueError):
    """The run's input contradicts itself in a way its schema cannot say."""

    error_type = "invalid_input"
