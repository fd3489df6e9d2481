"""Runs as OpenTelemetry spans, following the GenAI semantic conventions.

With OpenTelemetry there and configured (an app's tracer provider, or the
standard ``OTEL_*`` variables with ``opentelemetry-sdk`` installed), each
attempt of a run is an ``invoke_agent`` span (``RunTrace``), each of its tool
steps an ``execute_tool`` span under it, and a model call of the ``openai``
agent a ``chat`` span (``chat``). A run taken over by another server goes on
as a new span linked to the one before, whose context the run's row keeps
(``trace_context``). While a run's agent runs, its span is the current one:
``headers()`` and ``environment()`` carry it (W3C ``traceparent``) to the
processes and servers the agent talks to.

Without OpenTelemetry, or unconfigured, ``configure`` gives None and nothing
here does anything: no span, no header, no cost on a run's events.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # OpenTelemetry is optional: no traces
    trace = None  # type: ignore[assignment]

TRACER_NAME = "jupyter_agentruns"
# The SDK's exporters (and any package's) register under this entry-point group.
EXPORTERS_GROUP = "opentelemetry_traces_exporter"

# The tracer provider made here from the OTEL_* variables (flushed at the server's stop).
_provider: Any = None


def configure(log: logging.Logger) -> Any:
    """The tracer runs are recorded with, or None: OpenTelemetry absent, disabled or unconfigured.

    An app's tracer provider, already set (``opentelemetry-instrument``, or
    the app's own code), is used as it is. Else ``OTEL_TRACES_EXPORTER`` (or an
    ``OTEL_EXPORTER_OTLP_*ENDPOINT``) makes one here, with ``opentelemetry-sdk``.
    """
    global _provider
    if trace is None or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    provider = trace.get_tracer_provider()
    if not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return provider.get_tracer(TRACER_NAME)
    if _provider is not None:
        return _provider.get_tracer(TRACER_NAME)
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names and any(
        os.environ.get(name)
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        names = "otlp"
    exporters = [name.strip() for name in names.split(",") if name.strip() not in ("", "none")]
    if not exporters:
        return None
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "agentruns: OTEL_TRACES_EXPORTER is set but opentelemetry-sdk is not installed: "
            "no traces (pip install 'jupyter_agentruns[otel]')"
        )
        return None
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES say otherwise if set.
    made = TracerProvider(resource=Resource.create({SERVICE_NAME: "jupyter-agentruns"}))
    for name in exporters:
        found = importlib.metadata.entry_points(group=EXPORTERS_GROUP, name=name)
        if not found:
            log.warning(
                "agentruns: no OpenTelemetry span exporter named %r (OTEL_TRACES_EXPORTER); "
                "for otlp: pip install opentelemetry-exporter-otlp",
                name,
            )
            continue
        made.add_span_processor(BatchSpanProcessor(next(iter(found)).load()()))
    trace.set_tracer_provider(made)
    _provider = made
    return made.get_tracer(TRACER_NAME)


def flush() -> None:
    """Send the spans the tracer provider made here still holds (it stops itself at exit)."""
    if _provider is not None:
        _provider.force_flush()


class RunTrace:
    """One attempt of one run: its ``invoke_agent`` span, and its tool steps' spans under it."""

    def __init__(self, tracer: Any, row: Mapping[str, Any], resumed: bool):
        links = []
        earlier = row.get("trace_context") if resumed else None
        if earlier:
            context = TraceContextTextMapPropagator().extract({"traceparent": earlier})
            span_context = trace.get_current_span(context).get_span_context()
            if span_context.is_valid:
                links.append(trace.Link(span_context, {"agentruns.link": "taken_over_from"}))
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": row["agent"],
            "agentruns.run.id": row["run_id"],
            "agentruns.run.attempt": row.get("attempt") or 1,
        }
        if row.get("session"):
            attributes["gen_ai.conversation.id"] = row["session"]
        self._tracer = tracer
        self.span = tracer.start_span(
            f"invoke_agent {row['agent']}", attributes=attributes, links=links
        )
        self.context = trace.set_span_in_context(self.span)
        self._tools: dict[str, Any] = {}
        self._ended = False

    @property
    def traceparent(self) -> str:
        """The span's W3C ``traceparent``: what a later attempt links to."""
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=self.context)
        return carrier["traceparent"]

    def event(self, type: str, data: dict[str, Any]) -> None:
        """Follow one of the run's events: a step that starts or ends, the usage, the run's end."""
        if type == "tool.started":
            self._tools[data["call_id"]] = self._tracer.start_span(
                f"execute_tool {data['name']}",
                context=self.context,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": data["name"],
                    "gen_ai.tool.call.id": data["call_id"],
                },
            )
        elif type == "tool.completed":
            span = self._tools.pop(data["call_id"], None)
            if span is not None:
                if not data.get("ok", True):
                    _failed(span, data.get("error"))
                span.end()
        elif type == "usage":
            for kind in ("input_tokens", "output_tokens"):
                if isinstance(data.get(kind), int):
                    self.span.set_attribute(f"gen_ai.usage.{kind}", data[kind])
        elif type.startswith("run.") and type in _ENDS:
            self.span.set_attribute("agentruns.run.status", _ENDS[type])
            if type == "run.failed":
                _failed(self.span, data.get("error"))
            self.end()

    @contextlib.contextmanager
    def step(self, call_id: str) -> Iterator[None]:
        """While a tool step's call is made, its span is the current one: an MCP
        call made then carries the step's context, not the run's."""
        span = self._tools.get(call_id)
        if span is None:
            yield
            return
        with trace.use_span(
            span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        ):
            yield

    def end(self) -> None:
        """End the spans, once (a run handed over, or lost, ends its attempt's span without a status)."""
        if self._ended:
            return
        self._ended = True
        for span in self._tools.values():
            span.end()
        self._tools.clear()
        self.span.end()


_ENDS = {
    "run.succeeded": "succeeded",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
    "run.interrupted": "interrupted",
}


def _failed(span: Any, error: Any) -> None:
    error = error if isinstance(error, dict) else {}
    span.set_attribute("error.type", str(error.get("type") or "error"))
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(error.get("message") or "")))


@contextlib.contextmanager
def current(run_trace: RunTrace | None) -> Iterator[None]:
    """Make the run's span the current one (what ``headers`` and ``environment`` carry)."""
    if run_trace is None:
        yield
        return
    # How the run ended is its events' to say (a cancelled agent is no error of its span).
    with trace.use_span(
        run_trace.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    ):
        yield


def headers() -> dict[str, str]:
    """The current trace context as HTTP headers (``traceparent``); empty without a trace."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def environment() -> dict[str, str]:
    """The current trace context as environment variables (``TRACEPARENT``) for a process started now."""
    return {name.upper(): value for name, value in headers().items()}


@contextlib.contextmanager
def chat(model: str, server: str | None) -> Iterator[Any]:
    """A ``chat`` span around one model call under the current span; yields it (None without a trace)."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        yield None
        return
    tracer = trace.get_tracer(TRACER_NAME)
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",  # the API it speaks, whoever serves it
        "gen_ai.request.model": model,
    }
    if server:
        attributes["server.address"] = server
    with tracer.start_as_current_span(f"chat {model}", attributes=attributes) as span:
        yield span


def chat_usage(
    span: Any, model: str | None, finish_reason: str | None, usage: dict[str, int] | None
) -> None:
    """What a model call answered: the model that answered, why it stopped, the tokens it counted."""
    if span is None:
        return
    if model:
        span.set_attribute("gen_ai.response.model", model)
    if finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    for kind, count in (usage or {}).items():
        if kind in ("input_tokens", "output_tokens"):
            span.set_attribute(f"gen_ai.usage.{kind}", count)
