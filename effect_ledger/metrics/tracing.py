"""OpenTelemetry spans of effects: one span per attempt (the SDK) and per reconciliation answer (the
services), so that effects appear in the traces teams already read.

The ``[otel]`` extra (opentelemetry-api and -sdk). Without it, or while the application has set no
tracer provider, every function here returns at once and records nothing: the check is one import
attempt per process and, per span, a read of OpenTelemetry's global provider and one
``isinstance``. The application configures the provider and its exporters itself
(``opentelemetry.trace.set_tracer_provider``, or ``OTEL_PYTHON_TRACER_PROVIDER`` set before the
first effect); effect-ledger only asks for a tracer named ``effect_ledger``.

A span carries ``effect_ledger.effect_id`` (the idempotency key), ``.target``, ``.operation``,
``.attempt``, ``.run_id``, ``.step`` and, at its end, ``.state`` (the effect's state after the
attempt: CONFIRMED, FAILED, UNCERTAIN, ...). Inside ``tool_call(name, call_id)`` (an agent
framework's tool invocation) it also carries the OpenTelemetry GenAI attributes of a tool call:
``gen_ai.operation.name = "execute_tool"``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, and is
named ``execute_tool NAME`` as those conventions ask.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

TRACER_NAME = "effect_ledger"


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    call_id: str | None = None


_tool: contextvars.ContextVar[ToolCall | None] = contextvars.ContextVar("effect_ledger_tool_call", default=None)
_api: Any = None  # opentelemetry.trace once imported; False when the extra is missing


def _trace() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import trace
        except ImportError:  # the [otel] extra is not installed: spans cost nothing
            _api = False
        else:
            _api = trace
    return _api


@functools.cache
def _provider_named_in_environment() -> bool:
    return "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def tracer() -> Any:
    """effect-ledger's tracer, or None when nothing would record its spans (no extra, or no
    tracer provider set by the application)."""
    trace = _trace()
    if not trace:
        return None
    # OpenTelemetry's get_tracer_provider() looks the environment up on every call until a
    # provider is set (a KeyError raised and caught inside os.environ): 3 % of the event loop's
    # work per effect with 64 concurrent tasks. Its global is read first; the environment is
    # asked once per process, as OTel itself reads OTEL_PYTHON_TRACER_PROVIDER only to create the
    # provider. The global is a private name: should an upgrade rename it, spans stop and
    # tests/unit/metrics/test_tracing.py fails.
    provider = getattr(trace, "_TRACER_PROVIDER", None)
    if provider is None:
        if not _provider_named_in_environment():
            return None
        provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer(TRACER_NAME)


@contextlib.contextmanager
def tool_call(name: str, call_id: str | None = None) -> Iterator[None]:
    """Effects executed inside this block are an agent's tool call ``name`` (``call_id``: the
    model's id of the call): their spans carry the GenAI tool-call attributes."""
    token = _tool.set(ToolCall(name, call_id))
    try:
        yield
    finally:
        _tool.reset(token)


class Span:
    """One live span; ``end_state`` records the state the attempt ended in."""

    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span

    def end_state(self, state: str, error: BaseException | None = None) -> None:
        self.span.set_attribute("effect_ledger.state", state)
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.set_attribute("error.type", type(error).__name__)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:512]))


@contextlib.contextmanager
def effect_span(
    kind: str, effect_id: str, target: str, operation: str, attempt: int, **more: Any
) -> Iterator[Span | None]:
    """A span around one attempt (``kind`` "attempt") or one reconciliation ("reconcile"); None
    when nothing records spans. Exceptions pass through; the span records them."""
    t = tracer()
    if t is None:
        yield None
        return
    tool = _tool.get() if kind == "attempt" else None
    attrs: dict[str, Any] = {
        "effect_ledger.effect_id": effect_id,
        "effect_ledger.target": target,
        "effect_ledger.operation": operation,
        "effect_ledger.attempt": attempt,
    }
    attrs.update({f"effect_ledger.{k}": v for k, v in more.items() if v is not None})
    if tool is not None:
        attrs["gen_ai.operation.name"] = "execute_tool"
        attrs["gen_ai.tool.name"] = tool.name
        if tool.call_id is not None:
            attrs["gen_ai.tool.call.id"] = tool.call_id
        name = f"execute_tool {tool.name}"
    else:
        name = f"effect_ledger.{kind} {target} {operation}"
    # The SDK's spans are the client side of a call to another system; a reconciliation is the
    # service's own work.
    span_kind = _trace().SpanKind.CLIENT if kind == "attempt" else _trace().SpanKind.INTERNAL
    with t.start_as_current_span(name, kind=span_kind, attributes=attrs, record_exception=True) as span:
        yield Span(span)
